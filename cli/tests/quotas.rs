//! Client quotas held under load, with real clients: confluent-kafka (librdkafka 2.16) on the
//! Kafka listener (`quotas/rates.py`), `strata produce` on the native one. Each quota is set
//! with `strata quota set`; each rate is measured by the client over whole seconds.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{TestNode, free_base_port, http_get};

/// A node with a Kafka listener and an admin port: (node, Kafka address, admin port).
fn kafka_node(dir: &std::path::Path) -> (TestNode, String, u16) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let admin = free_base_port(0);
    let node = TestNode::start_with(
        dir,
        2,
        &[
            "--kafka-listen",
            &kafka,
            "--admin",
            &format!("127.0.0.1:{admin}"),
        ],
    );
    (node, kafka, admin)
}

/// `quotas/rates.py` with `args`, started now.
fn rates(bootstrap: &str, args: &[&str]) -> std::process::Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/quotas/rates.py");
    Command::new("python3")
        .arg(script)
        .arg(bootstrap)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with confluent-kafka (scripts/test.sh installs it)")
}

/// A `rates.py` run's answer: bytes by second, and the longest throttle it was told.
fn finish(child: std::process::Child) -> (Vec<f64>, i64) {
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "rates.py failed");
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    let per_second = answer["per_second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bytes| bytes.as_f64().unwrap())
        .collect();
    (per_second, answer["max_throttle_ms"].as_i64().unwrap())
}

/// The mean rate over seconds `from..to`.
fn mean(per_second: &[f64], from: usize, to: usize) -> f64 {
    per_second[from..to].iter().sum::<f64>() / (to - from) as f64
}

/// The `strata_quota_throttle_seconds_total` series of `quota` for `client_id`.
fn throttled_seconds(admin: u16, quota: &str, client_id: &str) -> f64 {
    let (_, metrics) = http_get(admin, "/metrics");
    let series = format!("quota=\"{quota}\",user=\"\",client_id=\"{client_id}\"");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("strata_quota_throttle_seconds_total") && line.contains(&series)
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

const QUOTA: f64 = 2.0 * 1024.0 * 1024.0;

#[test]
fn a_produce_quota_holds_a_flat_out_producer_and_spares_another_client() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, admin) = kafka_node(dir.path());
    node.cli(&["topic", "create", "rated", "--partitions", "2"], None);
    node.cli(
        &[
            "quota",
            "set",
            "--entity-client-id",
            "throttled",
            "--producer-byte-rate",
            "2MiB",
        ],
        None,
    );
    // Three producers of one client id, flat out with 10 kB records (the batch framing the
    // quota also counts is under 1% of them). Their connections land on the node's two shards
    // as SO_REUSEPORT spreads them (on one of them only one time in four), and share one quota.
    let throttled: Vec<_> = (0..3)
        .map(|_| rates(&kafka, &["produce", "throttled", "rated", "25", "10000"]))
        .collect();
    // Another client at five times the quota, paced: it must get all of it.
    let pace = (5.0 * QUOTA).to_string();
    let free = rates(&kafka, &["produce", "free", "rated", "25", "10000", &pace]);
    let mut throttled_wait = 0;
    let mut throttled_rates = vec![0.0; 26];
    for child in throttled {
        let (per_second, wait) = finish(child);
        throttled_wait = throttled_wait.max(wait);
        for (total, second) in throttled_rates.iter_mut().zip(per_second) {
            *total += second;
        }
    }
    let throttled = throttled_rates;
    let (free, free_wait) = finish(free);
    // The 20 s after the clients' start.
    let held = mean(&throttled, 3, 23);
    eprintln!("throttled producer: {held:.0} B/s of {QUOTA}; the other: {free:?}");
    assert!(
        (held - QUOTA).abs() < 0.1 * QUOTA,
        "held to {held:.0} B/s against {QUOTA} ({throttled:?})"
    );
    assert!(throttled_wait > 0, "the client was told to wait");
    assert!(throttled_seconds(admin, "producer_byte_rate", "throttled") > 1.0);
    let spared = mean(&free, 3, 23);
    assert!(
        spared > 0.9 * 5.0 * QUOTA,
        "the other client got {spared:.0} B/s of its {pace} ({free:?})"
    );
    assert_eq!(free_wait, 0, "the other client was never told to wait");
    assert_eq!(throttled_seconds(admin, "producer_byte_rate", "free"), 0.0);
}

#[test]
fn a_fetch_quota_holds_a_consumer_and_a_request_quota_throttles() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, admin) = kafka_node(dir.path());
    node.cli(&["topic", "create", "stored", "--partitions", "2"], None);
    // 40 MB to read, written by a client without quotas.
    let (written, _) = finish(rates(
        &kafka,
        &[
            "produce",
            "writer",
            "stored",
            "6",
            "10000",
            &(8.0 * QUOTA).to_string(),
        ],
    ));
    assert!(written.iter().sum::<f64>() > 30e6, "{written:?}");
    node.cli(
        &[
            "quota",
            "set",
            "--entity-client-id",
            "reader",
            "--consumer-byte-rate",
            "2MiB",
        ],
        None,
    );
    let (read, wait) = finish(rates(&kafka, &["consume", "reader", "stored", "12"]));
    // Group join takes the first seconds.
    let held = mean(&read, 4, 12);
    eprintln!("throttled consumer: {held:.0} B/s of {QUOTA} ({read:?})");
    assert!(
        (held - QUOTA).abs() < 0.15 * QUOTA,
        "read at {held:.0} B/s against {QUOTA} ({read:?})"
    );
    assert!(wait > 0, "the consumer was told to wait");
    assert!(throttled_seconds(admin, "consumer_byte_rate", "reader") > 1.0);

    // A client allowed a hundredth of a percent of a thread is over it at once.
    node.cli(
        &[
            "quota",
            "set",
            "--entity-client-id",
            "busy",
            "--request-percentage",
            "0.01",
        ],
        None,
    );
    let (_, wait) = finish(rates(&kafka, &["produce", "busy", "stored", "4", "100"]));
    assert!(wait > 0, "the busy client was told to wait");
    assert!(throttled_seconds(admin, "request_percentage", "busy") > 0.0);
}

#[test]
fn a_user_quota_holds_native_producers_too() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 2);
    node.cli(&["topic", "create", "native", "--partitions", "1"], None);
    // Native clients send no client id: a user quota governs them (here the user every
    // unauthenticated connection is).
    node.cli(
        &[
            "quota",
            "set",
            "--entity-user",
            "ANONYMOUS",
            "--producer-byte-rate",
            "1MiB",
        ],
        None,
    );
    let lines = 8 * 1024;
    let line = "y".repeat(1023);
    let mut input = String::with_capacity(lines * 1024);
    for _ in 0..lines {
        input.push_str(&line);
        input.push('\n');
    }
    let started = Instant::now();
    let mut produce = support::strata()
        .args(["produce", "native", "--bootstrap", &node.bootstrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    produce
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(produce.wait().unwrap().success());
    let took = started.elapsed();
    eprintln!("8 MiB under a 1 MiB/s quota took {took:?}");
    // 8 MiB at 1 MiB/s: about 8 s.
    assert!(
        took > Duration::from_secs(6) && took < Duration::from_secs(12),
        "8 MiB took {took:?} under a 1 MiB/s quota"
    );
    assert_eq!(support::stored_records(&node, "native"), lines as u64);
}
