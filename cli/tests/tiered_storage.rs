//! Tiered storage end to end: a topic with `remote.storage.enable` against a real S3-protocol
//! server (`s3s-fs`, over HTTP on loopback) and against a `file://` tier, its local log held
//! to `local.retention.bytes` while the remote tier keeps the rest, read back from offset 0
//! by Strata's consumer and by a Kafka consumer (kcat), and across a kill -9.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use support::{TestNode, free_base_port, runtime, wait_for_at_most};

const VALUE_BYTES: usize = 1000;

/// An `s3s-fs` server on a free loopback port, storing under `root`; killed when dropped.
struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    fn start(root: &Path, bucket: &str) -> S3Server {
        std::fs::create_dir_all(root.join(bucket)).unwrap();
        let binary = std::env::var_os("STRATA_S3S_FS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/strata-tools/bin/s3s-fs"));
        assert!(
            binary.exists(),
            "{} is missing: scripts/test.sh installs s3s-fs (cargo install s3s-fs@0.14.1 --features binary)",
            binary.display()
        );
        let port = free_base_port(0);
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "strata-test",
                "--secret-key",
                "strata-secret",
            ])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_at_most("s3s-fs to listen", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        S3Server { child, port }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "strata-test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "strata-secret".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn value_of(offset: u64) -> Vec<u8> {
    let mut value = format!("{offset:012}:").into_bytes();
    value.resize(VALUE_BYTES, b'v');
    value
}

fn create_tiered_topic(node: &TestNode, topic: &str) {
    node.cli(
        &[
            "topic",
            "create",
            topic,
            "--partitions",
            "1",
            "--config",
            "segment.bytes=1048576",
            "--config",
            "remote.storage.enable=true",
            "--config",
            "local.retention.bytes=4194304",
        ],
        None,
    );
}

fn produce(node: &TestNode, topic: &str, records: u64) {
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client, ProducerConfig::default());
        let mut acks = Vec::new();
        for offset in 0..records {
            acks.push(
                producer
                    .send(ProducerRecord::new(topic, None, value_of(offset)))
                    .await
                    .unwrap(),
            );
            if acks.len() >= 10_000 {
                for ack in acks.drain(..) {
                    ack.await.unwrap();
                }
            }
        }
        producer.flush().await.unwrap();
        for ack in acks {
            ack.await.unwrap();
        }
    });
}

/// Reads every record from offset 0 with Strata's consumer, checking each value.
fn read_all_natively(node: &TestNode, topic: &str, records: u64) {
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let mut consumer = Consumer::new(
            client,
            ConsumerConfig {
                max_wait: Duration::from_millis(100),
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign(topic, &[0], SeekTo::Offset(0))
            .await
            .unwrap();
        let mut next = 0u64;
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while next < records {
            assert!(
                std::time::Instant::now() < deadline,
                "read {next} of {records}"
            );
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    assert_eq!(record.offset, next, "offsets in order, none missing");
                    assert_eq!(record.value, &value_of(next)[..], "the value at {next}");
                    next += 1;
                }
            }
        }
    });
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in walk(dir) {
        total += entry.metadata().map_or(0, |m| m.len());
    }
    total
}

fn walk(dir: &Path) -> Vec<std::fs::DirEntry> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry);
        }
    }
    out
}

fn local_log_bytes(data: &Path, topic: &str) -> u64 {
    walk(&data.join(format!("{topic}-0")))
        .iter()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

fn log_start(node: &TestNode, topic: &str) -> u64 {
    support::describe(node, topic)["partitions"][0]["log_start_offset"]
        .as_u64()
        .unwrap()
}

/// `STRATA_TIERED_MB` (default 300): how much the tiering test produces.
fn produced_records() -> u64 {
    let megabytes: u64 = std::env::var("STRATA_TIERED_MB")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(300);
    megabytes * 1_000_000 / VALUE_BYTES as u64
}

/// 300 MB into a topic with 1 MB segments and 4 MB of local retention: the local log stays
/// within bounds, the bucket holds the rest, and Strata's consumer and kcat read every record
/// from offset 0 with its value.
#[test]
fn a_tiered_topic_keeps_its_history_in_s3_and_serves_it_from_offset_zero() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(store.path(), "strata-tier");
    let env = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with_env(
        data.path(),
        1,
        &[
            "--remote-storage",
            "s3://strata-tier/cluster-a",
            "--retention-check-interval-ms",
            "200",
            "--kafka-listen",
            &kafka,
        ],
        &env,
    );
    create_tiered_topic(&node, "history");
    let records = produced_records();
    produce(&node, "history", records);
    let produced_bytes = records * VALUE_BYTES as u64;
    wait_for_at_most(
        "uploads and local retention to leave at most 4 MB and the active segment locally",
        Duration::from_secs(240),
        || local_log_bytes(data.path(), "history") <= 6 << 20,
    );
    // The bucket holds everything the local log no longer does (and index and meta objects).
    let remote = dir_bytes(&store.path().join("strata-tier"));
    let local = local_log_bytes(data.path(), "history");
    assert!(
        remote + local >= produced_bytes && remote >= produced_bytes - (6 << 20),
        "the bucket holds the history: {remote} bytes remote, {local} local, of {produced_bytes}"
    );
    assert_eq!(log_start(&node, "history"), 0, "the log still starts at 0");

    read_all_natively(&node, "history", records);

    // A Kafka consumer: librdkafka through the Kafka listener, from the beginning.
    let output = support::kcat_command()
        .args([
            "-C",
            "-b",
            &kafka,
            "-t",
            "history",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
        ])
        .args(["-f", "%o %s\n", "-X", "fetch.message.max.bytes=1048576"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut expected = 0u64;
    for line in output
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let text = std::str::from_utf8(line).unwrap();
        let (offset, value) = text.split_once(' ').unwrap();
        assert_eq!(offset.parse::<u64>().unwrap(), expected);
        assert_eq!(value.as_bytes(), &value_of(expected)[..]);
        expected += 1;
    }
    assert_eq!(expected, records, "kcat read every record");
}

/// A `file://` tier: the same tiering, then a kill -9 and a restart; every acknowledged
/// record is still readable from offset 0, and the tier holds no object its manifest does
/// not name once the new leader claimed it.
#[test]
fn a_file_tier_survives_a_kill_and_keeps_no_orphans() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let mut node = TestNode::start_with(
        data.path(),
        1,
        &[
            "--remote-storage",
            &url,
            "--retention-check-interval-ms",
            "200",
        ],
    );
    create_tiered_topic(&node, "kept");
    let records = 20_000;
    produce(&node, "kept", records);
    wait_for_at_most(
        "local retention to delete uploaded segments",
        Duration::from_secs(120),
        || local_log_bytes(data.path(), "kept") <= 6 << 20,
    );
    // An object no manifest names (an upload cut short by a fence) is swept on take-over.
    let folder = walk(store.path())
        .into_iter()
        .find(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.path().parent().unwrap().to_path_buf())
        .expect("uploaded segments");
    let orphan = folder.join("00000000000000999999-0rphan.log");
    std::fs::write(&orphan, b"left behind").unwrap();
    node.kill();
    node.restart();
    wait_for_at_most("the orphan to be swept", Duration::from_secs(60), || {
        !orphan.exists()
    });
    read_all_natively(&node, "kept", records);
}
