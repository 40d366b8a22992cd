//! `strata tune` as a process: the live host's report is valid JSON with the stable fields,
//! a dry run changes nothing, and a captured host (the strata-tuning fixtures, through the
//! hidden --root) gives the exact findings and commands.

use std::path::PathBuf;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("run strata");
    assert!(
        output.status.success(),
        "strata {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn nvme_fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tuning/tests/fixtures/nvme-host")
        .display()
        .to_string()
}

fn findings(stdout: &[u8]) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let json: serde_json::Value = serde_json::from_slice(stdout).expect("stdout is JSON");
    let array = json.as_array().expect("a JSON array");
    array
        .iter()
        .map(|finding| finding.as_object().expect("an object").clone())
        .collect()
}

#[test]
fn check_json_on_this_host() {
    let data = tempfile::tempdir().expect("temp dir");
    let data_dir = data.path().to_str().expect("utf-8 path");
    let output = strata(&["tune", "check", "--json", "--data-dir", data_dir]);
    let findings = findings(&output.stdout);
    assert!(findings.len() > 20, "{findings:#?}");
    for finding in &findings {
        for field in ["setting", "current", "recommended", "why", "status"] {
            assert!(
                finding.get(field).is_some_and(|value| value.is_string()),
                "{field} missing: {finding:?}"
            );
        }
        assert!(
            matches!(finding["status"].as_str(), Some("OK" | "WARN" | "UNKNOWN")),
            "{finding:?}"
        );
    }
    let settings: Vec<&str> = findings
        .iter()
        .filter_map(|finding| finding["setting"].as_str())
        .collect();
    for setting in [
        "kernel",
        "io_uring.probe",
        "vm.swappiness",
        "block.device",
        "fs.type",
    ] {
        assert!(
            settings.contains(&setting),
            "{setting} missing: {settings:?}"
        );
    }
}

#[test]
fn check_prints_a_table() {
    let output = strata(&["tune", "check"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("SETTING"), "{stdout}");
    assert!(stdout.contains("vm.swappiness"), "{stdout}");
    assert!(stdout.contains(" OK, "), "{stdout}");
}

#[test]
fn apply_dry_run_changes_nothing() {
    let swappiness = || std::fs::read_to_string("/proc/sys/vm/swappiness").ok();
    let before = swappiness();
    let data = tempfile::tempdir().expect("temp dir");
    let data_dir = data.path().to_str().expect("utf-8 path");
    let output = strata(&["tune", "apply", "--dry-run", "--data-dir", data_dir]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("These writes last until reboot"),
        "{stdout}"
    );
    // Every line is a command or a comment, so the output can be reviewed and run as a script.
    for line in stdout.lines() {
        assert!(
            line.starts_with('#') || line.starts_with("sysctl -w ") || line.starts_with("echo "),
            "{line}"
        );
    }
    assert_eq!(swappiness(), before);
}

#[test]
fn a_captured_host_gives_its_findings_and_commands() {
    let root = nvme_fixture();
    let target = [
        "--root",
        root.as_str(),
        "--data-device",
        "259:3",
        "--data-dir",
        "/var/lib/strata",
    ];
    let output = strata(&[&["tune", "check", "--json"][..], &target].concat());
    let findings = findings(&output.stdout);
    let governor = findings
        .iter()
        .find(|finding| finding["setting"] == "cpu.governor")
        .expect("a governor finding");
    assert_eq!(governor["current"], "powersave");
    assert_eq!(governor["status"], "WARN");
    // The live io_uring probe is about this process, not the captured host.
    assert!(!findings.iter().any(|f| f["setting"] == "io_uring.probe"));

    let output = strata(&[&["tune", "apply", "--dry-run"][..], &target].concat());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("\nsysctl -w vm.swappiness=1\n"), "{stdout}");
    assert!(
        stdout.contains("\necho madvise > /sys/kernel/mm/transparent_hugepage/enabled\n"),
        "{stdout}"
    );
}

#[test]
fn templates_are_printed() {
    let output = strata(&["tune", "template", "systemd"]);
    let unit = String::from_utf8_lossy(&output.stdout);
    assert!(unit.contains("LimitNOFILE=1048576"), "{unit}");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/strata serve --config /etc/strata/strata.toml")
    );
    let output = strata(&["tune", "template", "sysctl"]);
    assert!(String::from_utf8_lossy(&output.stdout).contains("net.core.rmem_max = 4194304"));
}

/// `strata tune check` asks about the congestion control the connections really use.
#[test]
fn the_check_looks_for_the_congestion_control_connections_ask_for() {
    assert_eq!(
        strata_tuning::STRATA_TCP_CONGESTION,
        strata_client::DEFAULT_TCP_CONGESTION
    );
}
