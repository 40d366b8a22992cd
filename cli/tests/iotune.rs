//! `strata iotune` measures a directory and writes io-properties; `strata serve` uses them.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use strata_node::iotune::{IO_PROPERTIES_FILE, IoProperties};
use support::{TestNode, free_base_port, strata};

#[test]
fn iotune_writes_io_properties_that_serve_uses() {
    let data = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = strata()
        .args(["iotune", "--data-dir"])
        .arg(data.path())
        .args(["--duration", "1s"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "--duration bounds the run"
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("fdatasync µs: p50"), "{printed}");
    let path = data.path().join(IO_PROPERTIES_FILE);
    let properties = IoProperties::load(&path)
        .unwrap()
        .expect("the file was written");
    let measured = &properties.measured;
    assert_eq!(measured.write_mb_per_s_by_size.len(), 6, "{measured:?}");
    assert_eq!(
        measured.write_mb_per_s_by_queue_depth.len(),
        5,
        "{measured:?}"
    );
    assert!(
        measured.write_mb_per_s_by_size.values().all(|mb| *mb > 0.0),
        "{measured:?}"
    );
    assert!(measured.fdatasync_count >= 10 && measured.fdatasync_us_p50 > 0);
    assert!(measured.read_mb_per_s > 0.0);
    assert_eq!(properties.chosen, IoProperties::choose(measured));
    // Only the io-properties file remains: the scratch files are gone.
    let left: Vec<_> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from(IO_PROPERTIES_FILE)]);

    // serve reads it from its data dir and says what it chose.
    let port = free_base_port(1);
    let mut serve = strata()
        .args([
            "serve",
            "--shards",
            "1",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--admin", &format!("127.0.0.1:{}", free_base_port(0))])
        .arg("--data-dir")
        .arg(data.path())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(serve.stderr.take().unwrap());
    let expected = format!(
        "write {} B, {} writes in flight, group-commit window {} us",
        properties.chosen.write_bytes,
        properties.chosen.writes_in_flight,
        properties.chosen.group_commit_window_us
    );
    let mut found = false;
    for line in stderr.lines().map_while(Result::ok) {
        if line.contains("io properties from") {
            assert!(line.contains(&expected), "{line}");
            found = true;
            break;
        }
    }
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(found, "serve never said it loaded the io properties");

    // The broker runs on the tuned writers: a flush=always round trip.
    let node = TestNode::start(data.path(), 2);
    node.cli(
        &[
            "topic",
            "create",
            "tuned",
            "--partitions",
            "2",
            "--config",
            "flush=always",
        ],
        None,
    );
    let input: String = (0..200).map(|i| format!("v{i}\n")).collect();
    node.cli(
        &["produce", "tuned", "--acks", "all"],
        Some(input.as_bytes()),
    );
    let consumed = node.cli(
        &[
            "consume",
            "tuned",
            "--from-beginning",
            "--max-messages",
            "200",
        ],
        None,
    );
    assert_eq!(consumed.lines().count(), 200);
}

#[test]
fn a_broken_io_properties_file_is_a_clear_error() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join(IO_PROPERTIES_FILE), "not = [toml").unwrap();
    let output = strata()
        .args([
            "serve",
            "--shards",
            "1",
            "--listen",
            &format!("127.0.0.1:{}", free_base_port(1)),
        ])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("io-properties"), "{stderr}");
}
