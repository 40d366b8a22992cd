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
        S3Server::start_on(root, bucket, free_base_port(0))
    }

    /// On `port` (a restart after an outage keeps its address).
    fn start_on(root: &Path, bucket: &str, port: u16) -> S3Server {
        std::fs::create_dir_all(root.join(bucket)).unwrap();
        let binary = std::env::var_os("STRATA_S3S_FS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/strata-tools/bin/s3s-fs"));
        assert!(
            binary.exists(),
            "{} is missing: scripts/test.sh installs s3s-fs (cargo install s3s-fs@0.14.1 --features binary)",
            binary.display()
        );
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

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// A node on `s3`'s bucket under `prefix`, checking retention every 200 ms, with `extra` flags.
fn s3_node(data: &Path, s3: &S3Server, prefix: &str, extra: &[&str]) -> TestNode {
    let env = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let url = format!("s3://strata-tier/{prefix}");
    let mut args = vec![
        "--remote-storage",
        &url,
        "--retention-check-interval-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    TestNode::start_with_env(data, 1, &args, &env)
}

/// A node on a `file://` tier in `store`, checking retention every 200 ms, with `extra` flags.
fn file_node(data: &Path, store: &Path, extra: &[&str]) -> TestNode {
    let url = format!("file://{}", store.display());
    let mut args = vec![
        "--remote-storage",
        &url,
        "--retention-check-interval-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    TestNode::start_with(data, 1, &args)
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
    produce_from(node, topic, 0, records);
}

/// Produces the records at offsets `from..to` (the topic holds `from` records already), each
/// acknowledged by every in-sync replica.
fn produce_from(node: &TestNode, topic: &str, from: u64, to: u64) {
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
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
        for offset in from..to {
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
    read_natively(node, topic, 0, records);
}

/// Reads the records at offsets `from..to` with Strata's consumer, checking each value.
fn read_natively(node: &TestNode, topic: &str, from: u64, to: u64) {
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
            .assign(topic, &[0], SeekTo::Offset(from))
            .await
            .unwrap();
        let mut next = from;
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while next < to {
            assert!(
                std::time::Instant::now() < deadline,
                "read {next} of {from}..{to}"
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
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = s3_node(data.path(), &s3, "cluster-a", &["--kafka-listen", &kafka]);
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
        .args(["-f", "%o %T %s\n", "-X", "fetch.message.max.bytes=1048576"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut expected = 0u64;
    let mut timestamps = Vec::new();
    for line in output
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let text = std::str::from_utf8(line).unwrap();
        let mut fields = text.splitn(3, ' ');
        let offset: u64 = fields.next().unwrap().parse().unwrap();
        timestamps.push(fields.next().unwrap().parse::<i64>().unwrap());
        assert_eq!(offset, expected);
        assert_eq!(fields.next().unwrap().as_bytes(), &value_of(expected)[..]);
        expected += 1;
    }
    assert_eq!(expected, records, "kcat read every record");

    // A lookup by time lands in the remote tier: the first record at or after a remote
    // record's timestamp (ListOffsets through the remote time index).
    let probe = (records / 10) as usize;
    let output = support::kcat_command()
        .args(["-C", "-b", &kafka, "-t", "history", "-p", "0", "-c", "1"])
        .args(["-o", &format!("s@{}", timestamps[probe]), "-f", "%o %T\n"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let (offset, timestamp) = text.trim().split_once(' ').expect("one record");
    let first_at_that_time = timestamps
        .iter()
        .position(|t| *t >= timestamps[probe])
        .unwrap();
    assert_eq!(
        offset.parse::<usize>().unwrap(),
        first_at_that_time,
        "{text}"
    );
    assert_eq!(
        timestamp.parse::<i64>().unwrap(),
        timestamps[first_at_that_time]
    );

    // A current Kafka client: confluent-kafka (librdkafka 2.16), from the beginning.
    let script = r#"
import sys
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic, records, value_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tiered-reader", "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, 0)])
expected = 0
idle = 0
while expected < records and idle < 60:
    batch = c.consume(num_messages=10000, timeout=1.0)
    if not batch:
        idle += 1
        continue
    idle = 0
    for m in batch:
        if m.error():
            raise SystemExit(f"error: {m.error()}")
        want = f"{expected:012}:".encode().ljust(value_bytes, b"v")
        if m.offset() != expected or m.value() != want:
            raise SystemExit(f"at {expected}: offset {m.offset()}, value {m.value()[:20]!r}")
        expected += 1
c.close()
print(expected)
"#;
    let output = Command::new("python3")
        .args(["-c", script, &kafka, "history"])
        .arg(records.to_string())
        .arg(VALUE_BYTES.to_string())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        records.to_string(),
        "confluent-kafka read every record"
    );
}

fn metric(admin: u16, name: &str) -> f64 {
    support::metric_total(admin, name)
}

/// The object store goes away for a while (`STRATA_TIERED_OUTAGE_SECS`, default 30): produce
/// goes on, the local log keeps what could not be uploaded, the metrics report the failures
/// and the lag; once the store is back, uploads resume, local retention catches up, and
/// everything reads back from offset 0.
#[test]
fn produce_goes_on_while_the_store_is_down_and_uploads_resume_after() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut s3 = S3Server::start(store.path(), "strata-tier");
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let node = s3_node(data.path(), &s3, "outage", &["--admin", &admin_address]);
    create_tiered_topic(&node, "steady");
    produce(&node, "steady", 10_000);
    wait_for_at_most("the first uploads", Duration::from_secs(120), || {
        metric(admin, "strata_remote_uploaded_segments_total") >= 5.0
    });
    s3.stop();
    let outage = Duration::from_secs(
        std::env::var("STRATA_TIERED_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    let down_at = std::time::Instant::now();
    // Every acknowledged: `produce` fails the test on any error.
    produce_from(&node, "steady", 10_000, 30_000);
    wait_for_at_most("failed uploads to show", Duration::from_secs(120), || {
        metric(admin, "strata_remote_upload_errors_total") >= 1.0
            && metric(admin, "strata_remote_upload_lag_bytes") > 0.0
    });
    assert!(
        local_log_bytes(data.path(), "steady") > 8 << 20,
        "the local disk holds what the store could not take"
    );
    if let Some(left) = outage.checked_sub(down_at.elapsed()) {
        std::thread::sleep(left);
    }
    let _s3 = S3Server::start_on(store.path(), "strata-tier", s3.port);
    wait_for_at_most(
        "uploads to resume and the lag to clear",
        Duration::from_secs(180),
        || {
            metric(admin, "strata_remote_upload_lag_bytes") == 0.0
                && local_log_bytes(data.path(), "steady") <= 6 << 20
        },
    );
    // What the remote tier holds: about the 30 MB produced, but what the local disk keeps.
    let held = metric(admin, "strata_remote_size_bytes");
    assert!((20e6..=32e6).contains(&held), "{held} bytes held remotely");
    assert!(metric(admin, "strata_remote_segments") >= 20.0);
    read_all_natively(&node, "steady", 30_000);
}

/// The files of the group store's remote manifests on a single node.
fn manifests(data: &Path) -> Vec<serde_json::Value> {
    walk(&data.join("__cluster").join("remote-manifests"))
        .iter()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .map(|file| file["record"].clone())
        .collect()
}

/// A kill -9 while retention deletes remote segments: after the restart, every remote object
/// is named by the manifest (none orphaned, none half deleted), the manifest holds only
/// readable segments, and everything from the log start on reads back.
#[test]
fn a_kill_during_remote_deletes_leaves_no_orphans() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut node = file_node(data.path(), store.path(), &[]);
    create_tiered_topic(&node, "trimmed");
    let records = 30_000;
    produce(&node, "trimmed", records);
    let remote_logs = || {
        walk(store.path())
            .iter()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .count()
    };
    wait_for_at_most("segments to be uploaded", Duration::from_secs(120), || {
        remote_logs() >= 20
    });
    let before = remote_logs();
    // The whole log kept to 8 MB: most remote segments go.
    node.cli(
        &[
            "topic",
            "alter",
            "trimmed",
            "--config",
            "retention.bytes=8388608",
        ],
        None,
    );
    wait_for_at_most("remote deletes to start", Duration::from_secs(60), || {
        remote_logs() < before
    });
    node.kill();
    node.restart();
    wait_for_at_most(
        "the manifest to settle with every object named",
        Duration::from_secs(120),
        || {
            let manifests = manifests(data.path());
            let Some(manifest) = manifests.first() else {
                return false;
            };
            let segments = manifest["segments"].as_array().cloned().unwrap_or_default();
            let settled = !segments.is_empty() && segments.iter().all(|s| s["state"] == "copied");
            let ids: Vec<String> = segments
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_string())
                .collect();
            let named = walk(store.path()).iter().all(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                ids.iter().any(|id| name.contains(&format!("-{id}.")))
            });
            settled && named
        },
    );
    let start = log_start(&node, "trimmed");
    assert!(start > 0, "retention moved the log start");
    read_natively(&node, "trimmed", start, records);
}

/// A `file://` tier: the same tiering, then a kill -9 and a restart; every acknowledged
/// record is still readable from offset 0, and the tier holds no object its manifest does
/// not name once the new leader claimed it.
#[test]
fn a_file_tier_survives_a_kill_and_keeps_no_orphans() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut node = file_node(data.path(), store.path(), &[]);
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

/// Three brokers sharing one bucket, RF 3, the leader killed while it uploads, three times:
/// every record reads back from offset 0 (the remote tier has no gap), and no segment's records
/// sit in the bucket twice under two upload ids once the leaders have settled.
#[test]
fn leader_kills_during_uploads_leave_no_gap_and_no_duplicate() {
    let etcd = strata_coordinator::testing::EtcdServer::start();
    let store = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(store.path(), "strata-tier");
    let env = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut brokers: Vec<TestNode> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let mut args = support::etcd_args(&etcd, &id);
            args.extend_from_slice(&[
                "--remote-storage",
                "s3://strata-tier/cluster",
                "--retention-check-interval-ms",
                "200",
            ]);
            TestNode::start_with_env(dir.path(), 1, &args, &env)
        })
        .collect();
    brokers[0].cli(
        &[
            "topic",
            "create",
            "replicated",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--config",
            "segment.bytes=1048576",
            "--config",
            "remote.storage.enable=true",
            "--config",
            "local.retention.bytes=4194304",
        ],
        None,
    );
    let remote_logs = || {
        walk(store.path())
            .iter()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .count()
    };
    let per_round = 8_000u64;
    let mut produced = 0u64;
    for round in 0..3 {
        let alive = brokers.iter().find(|b| b.is_running()).unwrap();
        produce_from(alive, "replicated", produced, produced + per_round);
        produced += per_round;
        let uploaded = remote_logs();
        wait_for_at_most("uploads under way", Duration::from_secs(120), || {
            remote_logs() > uploaded
        });
        let leader = support::leaders(alive, "replicated")[0];
        brokers[(leader - 1) as usize].kill();
        let survivor = brokers.iter().position(|b| b.is_running()).unwrap();
        wait_for_at_most("a new leader", Duration::from_secs(60), || {
            let now = support::leaders(&brokers[survivor], "replicated")[0];
            now != leader && now > 0
        });
        brokers[(leader - 1) as usize].restart();
        eprintln!("round {round}: killed leader {leader}");
    }
    let alive = &brokers[0];
    wait_for_at_most(
        "the bucket to settle: every segment once",
        Duration::from_secs(180),
        || {
            let mut bases: Vec<String> = walk(store.path())
                .iter()
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .map(|e| e.file_name().to_string_lossy()[..20].to_string())
                .collect();
            let count = bases.len();
            bases.sort();
            bases.dedup();
            count >= 10 && bases.len() == count
        },
    );
    read_all_natively(alive, "replicated", produced);
}

/// A remote read waiting on a store that stopped answering (SIGSTOP) holds up no other
/// partition of its shard: a produce and a fetch of another topic answer meanwhile, and the
/// remote read completes once the store wakes.
#[test]
fn a_stalled_store_stalls_no_other_partition() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(store.path(), "strata-tier");
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let node = s3_node(data.path(), &s3, "stalled", &["--admin", &admin_address]);
    create_tiered_topic(&node, "cold");
    node.cli(&["topic", "create", "hot", "--partitions", "1"], None);
    let records = 12_000;
    produce(&node, "cold", records);
    wait_for_at_most(
        "cold's history to leave the local disk",
        Duration::from_secs(120),
        || local_log_bytes(data.path(), "cold") <= 6 << 20,
    );
    // SAFETY: kill(2) on the child this test started and still owns.
    unsafe { libc::kill(s3.child.id() as i32, libc::SIGSTOP) };
    let bootstrap = node.bootstrap();
    let cold = std::thread::spawn(move || {
        runtime().block_on(async {
            let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
            let mut consumer = Consumer::new(
                client,
                ConsumerConfig {
                    max_wait: Duration::from_millis(100),
                    ..ConsumerConfig::default()
                },
            );
            consumer
                .assign("cold", &[0], SeekTo::Offset(0))
                .await
                .unwrap();
            let mut next = 0u64;
            while next < records {
                for batch in consumer.poll().await.unwrap_or_default() {
                    for record in batch.records() {
                        assert_eq!(record.offset, next);
                        next += 1;
                    }
                }
            }
        })
    });
    // Once the cold reader waits on the store, the hot topic answers anyway.
    wait_for_at_most(
        "the remote read to wait on the store",
        Duration::from_secs(30),
        || metric(admin, "strata_remote_reads_in_flight") >= 1.0,
    );
    let (done, answered) = std::sync::mpsc::channel();
    let hot_bootstrap = node.bootstrap();
    std::thread::spawn(move || {
        runtime().block_on(async {
            let client = Client::connect(ClientConfig::new(hot_bootstrap))
                .await
                .unwrap();
            let producer = Producer::new(client.clone(), ProducerConfig::default());
            for i in 0..100u64 {
                producer
                    .send(ProducerRecord::new("hot", None, value_of(i)))
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            let mut consumer = Consumer::new(client, ConsumerConfig::default());
            consumer
                .assign("hot", &[0], SeekTo::Offset(0))
                .await
                .unwrap();
            let mut read = 0;
            while read < 100 {
                read += consumer
                    .poll()
                    .await
                    .unwrap()
                    .iter()
                    .map(|batch| batch.records().count())
                    .sum::<usize>();
            }
        });
        let _ = done.send(());
    });
    // A shard that waited on the store would wait for its request timeout (30 s) and retries.
    let hot = answered.recv_timeout(Duration::from_secs(20));
    // SAFETY: as above.
    unsafe { libc::kill(s3.child.id() as i32, libc::SIGCONT) };
    assert!(
        hot.is_ok(),
        "another topic's produce and fetch waited on the stalled store"
    );
    cold.join().unwrap();
}

/// The topic settings through Kafka's admin API (confluent-kafka's AdminClient): CreateTopics
/// and IncrementalAlterConfigs take them under Kafka's names, DescribeConfigs shows them, a
/// compacted topic is refused remote storage, and a broker without a remote tier refuses it.
#[test]
fn kafka_admin_sets_the_tiering_settings_by_kafkas_names() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let _node = TestNode::start_with(
        data.path(),
        1,
        &["--remote-storage", &url, "--kafka-listen", &kafka],
    );
    let script = r#"
import sys
from confluent_kafka.admin import AdminClient, NewTopic, ConfigResource, ConfigEntry, AlterConfigOpType
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
def wait(futures):
    out = {}
    for key, future in futures.items():
        try:
            out[key] = ("ok", future.result())
        except Exception as e:
            out[key] = ("error", str(e))
    return out
print(wait(admin.create_topics([
    NewTopic("tiered", 1, 1, config={"remote.storage.enable": "true", "local.retention.ms": "60000", "retention.ms": "3600000"}),
    NewTopic("compacted", 1, 1, config={"remote.storage.enable": "true", "cleanup.policy": "compact"}),
    NewTopic("too-local", 1, 1, config={"remote.storage.enable": "true", "local.retention.ms": "7200000", "retention.ms": "3600000"}),
])))
resource = ConfigResource("topic", "tiered", incremental_configs=[
    ConfigEntry("local.retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)])
print(wait(admin.incremental_alter_configs([resource])))
described = wait(admin.describe_configs([ConfigResource("topic", "tiered")]))
configs = list(described.values())[0][1]
for key in ["remote.storage.enable", "local.retention.ms", "local.retention.bytes", "retention.ms"]:
    print(key, configs[key].value)
off = ConfigResource("topic", "tiered", incremental_configs=[
    ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET)])
print(wait(admin.incremental_alter_configs([off])))
"#;
    let output = Command::new("python3")
        .args(["-c", script, &kafka])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("'tiered': ('ok'"), "{text}");
    assert!(lines[0].contains("'compacted': ('error'"), "{text}");
    assert!(lines[0].contains("'too-local': ('error'"), "{text}");
    assert!(lines[1].contains("('ok'"), "{text}");
    assert_eq!(
        &lines[2..6],
        [
            "remote.storage.enable true",
            "local.retention.ms 60000",
            "local.retention.bytes 1048576",
            "retention.ms 3600000"
        ],
        "{text}"
    );
    assert!(
        lines[6].contains("('error'"),
        "once tiered, always tiered: {text}"
    );

    // A broker without a remote tier refuses the setting.
    let plain_data = tempfile::tempdir().unwrap();
    let plain = TestNode::start(plain_data.path(), 1);
    let refused = plain.cli_output(
        &[
            "topic",
            "create",
            "nowhere",
            "--config",
            "remote.storage.enable=true",
        ],
        None,
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--remote-storage"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `--remote-upload-bytes-per-sec` and `--remote-fetch-bytes-per-sec` hold the tier's
/// transfers to their rates: 8 MB up at 2 MiB/s take at least 3 s, 8 MB down at 4 MiB/s at
/// least 1.5 s (lower bounds: a loaded machine only makes them longer).
#[test]
fn the_remote_throttles_hold_transfers_to_their_rates() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let node = file_node(
        data.path(),
        store.path(),
        &[
            "--remote-upload-bytes-per-sec",
            "2MiB",
            "--remote-fetch-bytes-per-sec",
            "4MiB",
            "--admin",
            &admin_address,
        ],
    );
    create_tiered_topic(&node, "paced");
    let records = 14_000;
    produce(&node, "paced", records);
    let started = std::time::Instant::now();
    wait_for_at_most("8 MB uploaded", Duration::from_secs(120), || {
        metric(admin, "strata_remote_uploaded_bytes_total") >= 8e6
    });
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(3), "8 MB uploaded in {took:?}");
    wait_for_at_most("local retention", Duration::from_secs(120), || {
        local_log_bytes(data.path(), "paced") <= 6 << 20
    });
    let started = std::time::Instant::now();
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let mut consumer = Consumer::new(client, ConsumerConfig::default());
        consumer
            .assign("paced", &[0], SeekTo::Offset(0))
            .await
            .unwrap();
        let mut next = 0u64;
        while next < 8_000 {
            for batch in consumer.poll().await.unwrap() {
                next += batch.records().count() as u64;
            }
        }
    });
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500), "8 MB read in {took:?}");
    // Two 4 MiB chunks at least, each timed from its request to its whole answer.
    let fetches = metric(admin, "strata_remote_fetch_latency_seconds_count");
    assert!(fetches >= 2.0, "{fetches} remote fetches timed");
    assert_eq!(
        metric(
            admin,
            "strata_remote_fetch_latency_seconds_bucket{le=\"+Inf\"}"
        ),
        fetches
    );
}

/// Deleting a tiered topic deletes its remote segments and its manifest.
#[test]
fn deleting_a_tiered_topic_deletes_its_remote_segments() {
    let data = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let node = file_node(data.path(), store.path(), &[]);
    create_tiered_topic(&node, "doomed");
    produce(&node, "doomed", 8_000);
    let remote_files = || walk(store.path()).len();
    wait_for_at_most("segments to be uploaded", Duration::from_secs(60), || {
        remote_files() >= 8
    });
    node.cli(&["topic", "delete", "doomed"], None);
    wait_for_at_most("the remote segments to go", Duration::from_secs(60), || {
        remote_files() == 0 && manifests(data.path()).is_empty()
    });
}

/// A follower rebuilt from an empty disk starts at its leader's local log start and takes
/// the producer state there from the remote tier (the producer snapshot uploaded with the
/// segment ending there): an idempotent producer whose every batch lies in the remote tier
/// goes on producing, with its next sequence, once that follower leads. Without that state
/// the new leader would not know the producer and refuse its sequence.
#[test]
fn a_rebuilt_follower_takes_the_producer_state_below_its_start_from_the_remote_tier() {
    let etcd = strata_coordinator::testing::EtcdServer::start();
    let store = tempfile::tempdir().unwrap();
    let (dirs, mut brokers) = file_tier_cluster(&etcd, store.path(), 2);
    let topic = "idempotent-history";
    create_replicated_tiered_topic(&brokers[0], topic, 2);
    let bootstrap = format!("{},{}", brokers[0].bootstrap(), brokers[1].bootstrap());
    let runtime = runtime();
    let idempotent = runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(&bootstrap))
            .await
            .unwrap();
        Producer::new(
            client,
            ProducerConfig {
                idempotent: true,
                ..ProducerConfig::default()
            },
        )
    });
    let send_idempotent = |from: u64, to: u64| {
        runtime.block_on(async {
            let mut acks = Vec::new();
            for offset in from..to {
                let record = ProducerRecord::new(topic, None, value_of(offset));
                acks.push(idempotent.send(record).await.unwrap());
            }
            idempotent.flush().await.unwrap();
            for (offset, ack) in (from..).zip(acks) {
                let written = ack.await.unwrap_or_else(|error| {
                    panic!("the idempotent producer's record {offset}: {error}")
                });
                assert_eq!(written.offset, offset as i64);
            }
        })
    };
    // The idempotent producer's batches, then others' until its are all in the remote tier.
    send_idempotent(0, 2_000);
    produce_from(&brokers[0], topic, 2_000, 10_000);
    let leader = support::leaders(&brokers[0], topic)[0];
    let (leader, follower) = ((leader - 1) as usize, (2 - leader) as usize);
    let local_start = || {
        support::describe(&brokers[leader], topic)["partitions"][0]["local_log_start_offset"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_for_at_most(
        "the idempotent producer's batches to leave the leader's disk",
        Duration::from_secs(120),
        || local_start() > 2_000,
    );

    // The follower loses its disk and comes back empty: it starts at the leader's local
    // log start.
    brokers[follower].kill();
    std::fs::remove_dir_all(dirs[follower].path()).unwrap();
    std::fs::create_dir(dirs[follower].path()).unwrap();
    brokers[follower].respawn();
    let in_sync = || {
        support::describe(&brokers[leader], topic)["partitions"][0]["isr"]
            .as_array()
            .is_some_and(|isr| isr.len() == 2)
    };
    wait_for_at_most(
        "the rebuilt follower in sync",
        Duration::from_secs(120),
        in_sync,
    );
    assert!(
        topic_snapshots(dirs[follower].path(), topic) >= 1,
        "the rebuilt follower keeps the producer state it took"
    );

    // It leads, and the producer goes on where it was.
    brokers[leader].kill();
    wait_for_at_most(
        "the rebuilt follower leads",
        Duration::from_secs(60),
        || support::leaders(&brokers[follower], topic)[0] == follower as i64 + 1,
    );
    send_idempotent(10_000, 10_100);
    read_all_natively(&brokers[follower], topic, 10_100);
}

/// Producer snapshot files in a topic's partition-0 folder under `data`.
fn topic_snapshots(data: &Path, topic: &str) -> usize {
    walk(&data.join(format!("{topic}-0")))
        .iter()
        .filter(|entry| {
            entry.file_name() == "producer-snapshot" && entry.metadata().is_ok_and(|m| m.len() > 0)
        })
        .count()
}

/// DeleteRecords below the local log start, on three brokers: the log start moves into the
/// remote tier at once, the remote segments wholly below it are deleted, and a new leader
/// (the old one killed) starts the log there too and serves every record from it.
#[test]
fn delete_records_below_the_local_start_moves_the_remote_start_on_three_brokers() {
    let etcd = strata_coordinator::testing::EtcdServer::start();
    let store = tempfile::tempdir().unwrap();
    let (_dirs, mut brokers) = file_tier_cluster(&etcd, store.path(), 3);
    let topic = "trimmed";
    create_replicated_tiered_topic(&brokers[0], topic, 3);
    let records = 10_000;
    produce(&brokers[0], topic, records);
    let partition = |node: &TestNode| support::describe(node, topic)["partitions"][0].clone();
    wait_for_at_most(
        "the leader's local log to start past 6000",
        Duration::from_secs(120),
        || partition(&brokers[0])["local_log_start_offset"].as_u64() > Some(6_000),
    );
    assert_eq!(partition(&brokers[0])["log_start_offset"], 0);
    brokers[0].cli(
        &[
            "topic",
            "delete-records",
            topic,
            "--partition",
            "0",
            "--before",
            "3000",
        ],
        None,
    );
    assert_eq!(partition(&brokers[0])["log_start_offset"], 3_000);
    let remote_segment_ends = || -> Vec<u64> {
        walk(store.path())
            .iter()
            .filter(|entry| entry.path().extension().is_some_and(|x| x == "meta"))
            .map(|entry| {
                let meta: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
                meta["next_offset"].as_u64().unwrap()
            })
            .collect()
    };
    wait_for_at_most(
        "the remote segments below 3000 deleted",
        Duration::from_secs(60),
        || remote_segment_ends().iter().all(|&end| end > 3_000),
    );
    assert!(
        remote_segment_ends().iter().any(|&end| end <= 6_000),
        "the remote tier still holds what lies between"
    );

    // Every earliest offset any leader tells, from before the kill until the new leader's
    // manifest is claimed: always the remote start, never the new leader's local one.
    let leader = support::leaders(&brokers[0], topic)[0] as usize - 1;
    let survivor = (leader + 1) % 3;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (stop, bootstrap) = (stop.clone(), brokers[survivor].bootstrap());
        std::thread::spawn(move || earliest_offsets_told(&bootstrap, topic, &stop))
    };
    brokers[leader].kill();
    wait_for_at_most("a new leader", Duration::from_secs(60), || {
        let now = support::leaders(&brokers[survivor], topic)[0];
        now > 0 && now as usize - 1 != leader
    });
    // At once: until the new leader has claimed the manifest, it does not yet know where the
    // log starts, and says so (retriable) rather than answer from its local log alone.
    read_natively(&brokers[survivor], topic, 3_000, records);
    assert_eq!(partition(&brokers[survivor])["log_start_offset"], 3_000);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let told = probe.join().unwrap();
    assert!(!told.is_empty());
    assert!(
        told.iter().all(|&start| start == 3_000),
        "earliest offsets told across the failover: {told:?}"
    );
}

/// Asks for `topic`-0's earliest offset without retrying, over and over until `stop`: the
/// offsets told (errors, a leader moving, are skipped).
fn earliest_offsets_told(
    bootstrap: &str,
    topic: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<u64> {
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
        let mut told = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match client.list_offset(topic, 0, -2).await {
                Ok(Some(start)) => told.push(start),
                Ok(None) => {}
                Err(_) => {
                    let _ = client.refresh_metadata().await;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        told
    })
}

/// Brokers 1 to `count` on `etcd`, sharing a `file://` tier in `store`, checking retention
/// every 200 ms; and their data dirs.
fn file_tier_cluster(
    etcd: &strata_coordinator::testing::EtcdServer,
    store: &Path,
    count: usize,
) -> (Vec<tempfile::TempDir>, Vec<TestNode>) {
    let tier = format!("file://{}", store.display());
    let dirs: Vec<_> = (0..count).map(|_| tempfile::tempdir().unwrap()).collect();
    let brokers = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let mut args = support::etcd_args(etcd, &id);
            args.extend_from_slice(&["--remote-storage", &tier]);
            args.extend_from_slice(&["--retention-check-interval-ms", "200"]);
            TestNode::start_with(dir.path(), 1, &args)
        })
        .collect();
    (dirs, brokers)
}

/// A one-partition tiered topic of `replicas` replicas: 1 MiB segments, 2 MiB kept locally.
fn create_replicated_tiered_topic(node: &TestNode, topic: &str, replicas: u32) {
    let replicas = replicas.to_string();
    node.cli(
        &[
            "topic",
            "create",
            topic,
            "--partitions",
            "1",
            "--replication-factor",
            &replicas,
            "--config",
            "segment.bytes=1048576",
            "--config",
            "remote.storage.enable=true",
            "--config",
            "local.retention.bytes=2097152",
        ],
        None,
    );
}
