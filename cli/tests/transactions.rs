//! Kafka's transactions (KIP-98) through real clients: confluent-kafka (librdkafka) against
//! one node, each step checked for what consumers of both isolation levels read.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{TestNode, free_base_port, wait_for_at_most};

/// `transactions/confluent_txn.py MODE BOOTSTRAP TOPIC ARGS`: its JSON.
fn confluent(mode: &str, bootstrap: &str, topic: &str, args: &[&str]) -> Value {
    let path = format!(
        "{}/tests/transactions/confluent_txn.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = Command::new("python3")
        .arg(path)
        .args([mode, bootstrap, topic])
        .args(args)
        .output()
        .expect("python3 with confluent-kafka (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "{mode}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{mode} printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn node_with_kafka(dir: &std::path::Path) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(dir, 2, &["--kafka-listen", &kafka]);
    (node, kafka)
}

/// An aborted transaction over two partitions, a committed one, and one left open: a
/// read_committed consumer sees only the committed records and stops below the open one (its
/// end, the LSO, is below the high watermark), a read_uncommitted one sees all of them; once
/// the third commits, read_committed sees it too. Markers are never handed to applications.
#[test]
fn read_committed_consumers_see_committed_transactions_only() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "txn", "--partitions", "2"], None);
    let seen = confluent("basic", &kafka, "txn", &[]);
    let committed = |p: usize| -> Vec<String> {
        (0..6)
            .filter(|i| i % 2 == p)
            .map(|i| format!("committed-{i}"))
            .collect()
    };
    let open = |p: usize| -> Vec<String> {
        (0..4)
            .filter(|i| i % 2 == p)
            .map(|i| format!("open-{i}"))
            .collect()
    };
    let aborted = |p: usize| -> Vec<String> {
        (0..5)
            .filter(|i| i % 2 == p)
            .map(|i| format!("aborted-{i}"))
            .collect()
    };
    for p in 0..2 {
        let key = p.to_string();
        assert_eq!(
            seen["while_open_committed"][&key],
            json!(committed(p)),
            "{seen}"
        );
        let everything = [aborted(p), committed(p), open(p)].concat();
        assert_eq!(seen["while_open_uncommitted"][&key], json!(everything));
        assert_eq!(seen["after_uncommitted"][&key], json!(everything));
        assert_eq!(
            seen["after_committed"][&key],
            json!([committed(p), open(p)].concat())
        );
        // Records and one marker per transaction: the open one's first record is the LSO.
        let aborted_n = aborted(p).len() as i64;
        let committed_n = committed(p).len() as i64;
        let lso = aborted_n + 1 + committed_n + 1;
        assert_eq!(
            seen["while_open_ends"]["committed"][&key],
            json!(lso),
            "{seen}"
        );
        assert_eq!(
            seen["while_open_ends"]["uncommitted"][&key],
            json!(lso + open(p).len() as i64)
        );
    }
}

/// Two producers with one transactional id: the newer one's InitProducerId fences the older
/// (its open transaction aborted), whose next write fails fenced, and nothing of the older's
/// is ever read committed.
#[test]
fn a_newer_producer_fences_the_older_and_aborts_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "fenced", "--partitions", "2"], None);
    let seen = confluent("fence", &kafka, "fenced", &[]);
    assert_eq!(seen["old"], "_FENCED", "{seen}");
    assert_eq!(seen["old_fatal"], true);
    assert_eq!(seen["committed"], json!({"0": ["new-1"], "1": []}));
}

/// A producer that opens a transaction and goes away: the LSO stays at its first record
/// (read_committed consumers wait there) until the transaction's timeout, when the
/// coordinator aborts it and the LSO moves to the high watermark; its records are never read
/// committed. The same holds across a restart of the node in the middle.
#[test]
fn a_transaction_left_open_is_aborted_at_its_timeout_and_the_lso_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "stuck", "--partitions", "2"], None);
    confluent("open", &kafka, "stuck", &["6", "txn-stuck", "4000"]);
    let ends = confluent("ends", &kafka, "stuck", &[]);
    assert_eq!(ends["committed"], json!({"0": 0, "1": 0}), "{ends}");
    assert_eq!(ends["uncommitted"], json!({"0": 3, "1": 3}), "{ends}");
    // The coordinator's record and the partitions' open transactions survive a restart.
    node.restart();
    let ends = confluent("ends", &kafka, "stuck", &[]);
    assert_eq!(
        ends["committed"],
        json!({"0": 0, "1": 0}),
        "after a restart: {ends}"
    );
    wait_for_at_most(
        "the timeout to abort the transaction",
        Duration::from_secs(30),
        || {
            let ends = confluent("ends", &kafka, "stuck", &[]);
            // Three records and the abort marker on each partition.
            ends["committed"] == json!({"0": 4, "1": 4})
        },
    );
    let read = confluent("consume", &kafka, "stuck", &["committed"]);
    assert_eq!(read, json!({"0": [], "1": []}));
}
