//! Several `strata serve` processes sharing one real etcd.

mod support;

use std::time::{Duration, Instant};

use strata_client::{Client, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use strata_coordinator::testing::EtcdServer;
use support::{TestNode, runtime, strata};

fn etcd_args<'a>(etcd: &'a EtcdServer, node_id: &'a str) -> Vec<&'a str> {
    vec![
        "--etcd",
        &etcd.endpoint,
        "--cluster",
        "itest",
        "--node-id",
        node_id,
        "--lease-ttl-ms",
        "2000",
    ]
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_nodes_on_etcd_share_topics_and_route_to_leaders() {
    let etcd = EtcdServer::start();
    let (one_dir, two_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let one = TestNode::start_with(one_dir.path(), 1, &etcd_args(&etcd, "1"));
    let mut two = TestNode::start_with(two_dir.path(), 2, &etcd_args(&etcd, "2"));

    // Both brokers are registered; either node can tell.
    wait_for("two brokers", || {
        let info: serde_json::Value =
            serde_json::from_str(&two.cli(&["cluster", "info", "--format", "json"], None)).unwrap();
        info["brokers"].as_array().unwrap().len() == 2
    });

    // A topic created through node 1 is placed over both and seen by node 2.
    one.cli(&["topic", "create", "spread", "--partitions", "4"], None);
    wait_for("node 2 to see the topic", || {
        two.cli(&["topic", "list"], None).trim() == "spread"
    });
    let described: serde_json::Value =
        serde_json::from_str(&two.cli(&["topic", "describe", "spread", "--format", "json"], None))
            .unwrap();
    let leaders: Vec<i64> = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["leader"].as_i64().unwrap())
        .collect();
    assert_eq!(
        leaders.iter().filter(|l| **l == 1).count(),
        2,
        "{leaders:?}"
    );
    assert_eq!(
        leaders.iter().filter(|l| **l == 2).count(),
        2,
        "{leaders:?}"
    );

    // Produce through node 2, consume through node 1: the client routes to each leader.
    let runtime = runtime();
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(two.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client, ProducerConfig::default());
        let mut acks = Vec::new();
        for i in 0..1000 {
            acks.push(
                producer
                    .send(ProducerRecord::new("spread", None, format!("r{i}")))
                    .await
                    .unwrap(),
            );
        }
        for ack in acks {
            ack.await.unwrap();
        }
    });
    let consumed = one.cli(
        &[
            "consume",
            "spread",
            "--from-beginning",
            "--max-messages",
            "1000",
        ],
        None,
    );
    assert_eq!(consumed.lines().count(), 1000);

    // A second process with a taken node id is refused with a clear error.
    let output = strata()
        .args(["serve", "--data-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .args([
            "--listen",
            &format!("127.0.0.1:{}", support::free_base_port(1)),
        ])
        .args(["--shards", "1"])
        .args(etcd_args(&etcd, "1"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already registered"), "{stderr}");

    // A killed broker's registration expires with its lease.
    two.kill();
    wait_for("node 2's lease to expire", || {
        let info: serde_json::Value =
            serde_json::from_str(&one.cli(&["cluster", "info", "--format", "json"], None)).unwrap();
        info["brokers"].as_array().unwrap().len() == 1
    });
}
