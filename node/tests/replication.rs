//! Replication between real `strata serve` processes over QUIC on loopback, with a real etcd.

mod support;

use std::path::Path;
use std::time::Duration;

use strata_client::{Client, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use strata_coordinator::testing::EtcdServer;
use support::{TestNode, describe, etcd_args, runtime, wait_for, wait_for_at_most};

fn three_nodes(etcd: &EtcdServer, dirs: &[tempfile::TempDir], extra: &[&str]) -> Vec<TestNode> {
    (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(etcd, &id);
            args.extend_from_slice(extra);
            TestNode::start_with(dirs[i].path(), 1, &args)
        })
        .collect()
}

fn isr(node: &TestNode, topic: &str, partition: usize) -> Vec<i64> {
    describe(node, topic)["partitions"][partition]["isr"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_i64().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn segment(dir: &Path, topic: &str, partition: u32) -> Vec<u8> {
    std::fs::read(dir.join(format!("{topic}-{partition}/00000000000000000000.log"))).unwrap()
}

/// RF 3, acks=all: every record reaches all three logs, byte for byte, and consumers read it
/// from the leader.
#[test]
fn three_replicas_hold_identical_logs() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = three_nodes(&etcd, &dirs, &[]);
    wait_for("three brokers", || {
        support::cluster_info(&nodes[0])["brokers"]
            .as_array()
            .unwrap()
            .len()
            == 3
    });
    nodes[0].cli(
        &[
            "topic",
            "create",
            "copies",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
        None,
    );
    wait_for("every node to see the topic", || {
        nodes
            .iter()
            .all(|node| node.cli(&["topic", "list"], None).trim() == "copies")
    });
    let runtime = runtime();
    let records = 3_000;
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(nodes[1].bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(
            client,
            ProducerConfig {
                acks: -1,
                ..ProducerConfig::default()
            },
        );
        let mut acks = Vec::new();
        for i in 0..records {
            acks.push(
                producer
                    .send(ProducerRecord::new(
                        "copies",
                        Some(format!("k{i}").into()),
                        format!("v{i}"),
                    ))
                    .await
                    .unwrap(),
            );
        }
        for ack in acks {
            ack.await.unwrap();
        }
    });
    let consumed = nodes[2].cli(
        &[
            "consume",
            "copies",
            "--from-beginning",
            "--max-messages",
            &records.to_string(),
        ],
        None,
    );
    assert_eq!(consumed.lines().count(), records);
    for partition in 0..3 {
        assert_eq!(isr(&nodes[0], "copies", partition), vec![1, 2, 3]);
    }
    let described = describe(&nodes[0], "copies");
    let high_watermarks: u64 = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap())
        .sum();
    assert_eq!(high_watermarks, records as u64);
    // A clean stop flushes; then the three copies of each partition are the same bytes.
    for node in &mut nodes {
        node.stop();
    }
    for partition in 0..3 {
        let logs: Vec<Vec<u8>> = dirs
            .iter()
            .map(|dir| segment(dir.path(), "copies", partition))
            .collect();
        assert!(!logs[0].is_empty());
        assert!(
            logs.iter().all(|log| *log == logs[0]),
            "partition {partition} differs across replicas"
        );
    }
}

/// A follower paused past the lag time leaves the ISR; acks=all goes on with two of three;
/// after SIGCONT it catches up and rejoins. Under-replication shows in describe and metrics.
#[test]
fn a_paused_follower_leaves_the_isr_and_rejoins() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // A long lease: the follower must leave the ISR by lag, not by lease expiry.
    let admin_port = support::free_base_port(0);
    let admin = format!("127.0.0.1:{admin_port}");
    let nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let mut args = vec![
                "--etcd",
                &etcd.endpoint,
                "--cluster",
                "itest",
                "--node-id",
                &id,
                "--lease-ttl-ms",
                "30000",
                "--replica-lag-time-max-ms",
                "1500",
            ];
            if i == 0 {
                args.extend_from_slice(&["--admin", &admin]);
            }
            TestNode::start_with(dirs[i].path(), 1, &args)
        })
        .collect();
    wait_for("three brokers", || {
        support::cluster_info(&nodes[0])["brokers"]
            .as_array()
            .unwrap()
            .len()
            == 3
    });
    // One partition led by node 1 (the first broker in placement order for topic index 0).
    nodes[0].cli(
        &[
            "topic",
            "create",
            "lag",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
        None,
    );
    wait_for("the topic everywhere", || {
        nodes
            .iter()
            .all(|node| node.cli(&["topic", "list"], None).trim() == "lag")
    });
    let leader = describe(&nodes[0], "lag")["partitions"][0]["leader"]
        .as_i64()
        .unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let produce = |line: &str| {
        nodes[0].cli(
            &["produce", "lag", "--acks", "all"],
            Some(format!("{line}\n").as_bytes()),
        );
    };
    produce("before");
    wait_for("a full ISR", || isr(&nodes[0], "lag", 0).len() == 3);

    nodes[follower as usize - 1].signal(libc::SIGSTOP);
    let paused_at = std::time::Instant::now();
    wait_for("the paused follower to leave the ISR", || {
        !isr(&nodes[0], "lag", 0).contains(&follower)
    });
    println!(
        "ISR shrank {:?} after the pause (lag time 1.5 s)",
        paused_at.elapsed()
    );
    assert_eq!(
        describe(&nodes[0], "lag")["partitions"][0]["under_replicated"],
        true
    );
    if leader == 1 {
        let metrics = reqwest_lite(&admin);
        assert!(
            metrics.contains("strata_under_replicated_partitions{node=\"1\",shard=\"0\"} 1"),
            "{metrics}"
        );
    }
    for i in 0..20 {
        produce(&format!("during-{i}"));
    }
    nodes[follower as usize - 1].signal(libc::SIGCONT);
    wait_for_at_most("the follower to rejoin", Duration::from_secs(20), || {
        isr(&nodes[0], "lag", 0).len() == 3
    });
    assert_eq!(
        describe(&nodes[0], "lag")["partitions"][0]["under_replicated"],
        false
    );
    let consumed = nodes[0].cli(
        &["consume", "lag", "--from-beginning", "--max-messages", "21"],
        None,
    );
    assert_eq!(consumed.lines().count(), 21);
}

/// A plain HTTP GET of /metrics (no client library needed for one request).
fn reqwest_lite(admin: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(admin).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}
