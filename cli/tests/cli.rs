//! The `strata` binary's log tools, including the fallback IO backend.

use std::process::Command;

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

#[test]
fn the_blocking_fallback_writes_a_log_that_io_uring_reads_back() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("fallback-0");
    let output = strata()
        .args(["log", "stress"])
        .arg(&dir)
        .args([
            "--appends",
            "50",
            "--records-per-batch",
            "4",
            "--producers",
            "3",
        ])
        .env("STRATA_IO_BACKEND", "blocking")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("using the blocking pread/pwrite backend"),
        "the fallback says so in one line: {stderr}"
    );
    let acks = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("ACK"))
        .count();
    assert_eq!(acks, 50);

    let output = strata().args(["log", "dump"]).arg(&dir).output().unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("log_start=0 log_end=200 "), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("batch ")).count(),
        50
    );
}

#[test]
fn errors_exit_1_with_one_line_and_usage_errors_exit_2() {
    let output = strata()
        .args(["log", "dump", "/nonexistent/strata"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("strata: "), "{stderr}");

    let output = strata().args(["log", "frobnicate"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));

    // A bench without a workload is a usage error too, not a failed run.
    let output = strata().args(["bench"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("name a workload"));
}

/// A reader that closes stdout early (`strata log dump DIR | head -1`) ends the command
/// quietly, exit 0, instead of a panic about a failed print.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("piped-0");
    let made = strata()
        .args(["log", "stress"])
        .arg(&dir)
        .args([
            "--appends",
            "20",
            "--records-per-batch",
            "2",
            "--value-bytes",
            "16",
        ])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let mut child = strata()
        .args(["log", "dump"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the command has opened the log, so its first line fails.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}

/// Durations and sizes take units on every command (`--duration 300ms`, `--batch-size
/// 64KiB`), bare numbers keep the flag's own unit, and an unknown unit is a usage error that
/// names the units known.
#[test]
fn durations_and_sizes_take_units() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let output = strata()
        .args(["bench", "produce", "--null-sink", "--duration", "300ms"])
        .args(["--batch-size", "64KiB", "--json"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    // 300 ms, not 300 s nor the 10 s default.
    let ran = report["duration_s"].as_f64().unwrap();
    assert!((0.3..5.0).contains(&ran), "ran {ran} s");
    for (flag, value) in [("--duration", "10x"), ("--batch-size", "1XB")] {
        let output = strata()
            .args(["bench", "produce", "--null-sink", flag, value])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("unknown unit"));
    }
    let output = strata()
        .args(["serve", "--tail-cache-bytes", "lots"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}
