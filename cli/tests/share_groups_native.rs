//! Share groups (KIP-932) on Strata's own protocol: `strata consume --share-group`, the
//! Rust `ShareConsumer`, and `strata group describe` of a share group. The group's configs
//! (where it starts, its lock) are set through the Kafka listener's AlterConfigs, the one way
//! to set group configs.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use strata_client::{AckMode, AckType, ShareConfig, ShareConsumer, ShareRecord};
use support::{TestNode, free_base_port, wait_for_at_most};

/// The acquisition lock of these tests' groups: a record left unacknowledged comes back
/// after it.
const LOCK_MS: u64 = 3_000;

/// A node with a Kafka listener on a free port: (node, "127.0.0.1:port").
fn node_with_kafka(dir: &std::path::Path) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(dir, 2, &["--kafka-listen", &kafka]);
    (node, kafka)
}

/// Sets `group`'s configs (all of them: Kafka's AlterConfigs replaces what was set): it
/// starts at the earliest record, its locks last [`LOCK_MS`], members heartbeat every second.
fn configure(kafka: &str, group: &str) {
    use strata_kafka::kafka_protocol::messages::alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use strata_kafka::kafka_protocol::messages::{
        AlterConfigsRequest, AlterConfigsResponse, ApiKey,
    };
    let lock = LOCK_MS.to_string();
    let configs = [
        ("share.auto.offset.reset", "earliest"),
        ("share.record.lock.duration.ms", lock.as_str()),
        ("share.heartbeat.interval.ms", "1000"),
    ];
    let request = AlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(strata_kafka::admin::RESOURCE_GROUP)
            .with_resource_name(strata_kafka::text(group))
            .with_configs(
                configs
                    .iter()
                    .map(|(name, value)| {
                        AlterableConfig::default()
                            .with_name(strata_kafka::text(name))
                            .with_value(Some(strata_kafka::text(value)))
                    })
                    .collect(),
            ),
    ]);
    let response: AlterConfigsResponse =
        support::raw_request(kafka, ApiKey::AlterConfigs, 1, &request);
    assert_eq!(response.responses[0].error_code, 0, "group configs set");
}

/// `count` records `key-i:value-i` produced to `topic` (keys spread them over its
/// partitions).
fn produce(node: &TestNode, topic: &str, count: usize) {
    produce_from(node, topic, 0, count);
}

/// As [`produce`], numbering the records from `first`.
fn produce_from(node: &TestNode, topic: &str, first: usize, count: usize) {
    let lines: String = (first..first + count)
        .map(|i| format!("key-{i}:value-{i}\n"))
        .collect();
    node.cli(
        &["produce", topic, "--key-separator", ":", "--acks", "all"],
        Some(lines.as_bytes()),
    );
}

/// A `strata consume --share-group` process and the lines it printed so far.
struct Consuming {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Consuming {
    fn start(node: &TestNode, topic: &str, group: &str) -> Consuming {
        let mut child = support::strata()
            .args(["consume", topic, "--share-group", group, "--format", "json"])
            .env("STRATA_BOOTSTRAP", node.bootstrap())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn strata consume");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                collected.lock().unwrap().push(line);
            }
        });
        Consuming {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// SIGTERM, then its exit: it acknowledges, gives back what it holds and leaves.
    fn stop(mut self) -> Vec<String> {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "strata consume exited with {status}");
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.lines()
    }
}

impl Drop for Consuming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Values of printed JSON records.
fn values(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("a JSON record");
            record["value"].as_str().expect("a value").to_string()
        })
        .collect()
}

fn describe(node: &TestNode, group: &str) -> Value {
    serde_json::from_str(&node.cli(&["group", "describe", group, "--format", "json"], None))
        .expect("describe's JSON")
}

/// The sum of a described share group's lag over its partitions.
fn total_lag(described: &Value) -> u64 {
    described["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["lag"].as_u64().expect("a known lag"))
        .sum()
}

/// Two `strata consume --share-group` processes share a queue after a first one took ten
/// records: every record is printed once, none again after its lock would have run out, and
/// `strata group describe` shows the members, each partition's start offset and lag.
#[test]
fn two_share_consumers_print_each_record_exactly_once_and_describe_shows_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "queue", "--partitions", "4"], None);
    configure(&kafka, "workers");
    produce(&node, "queue", 200);

    // A first member takes ten records and leaves: the group now holds state on every
    // partition, with the rest to do.
    let first = node.cli(
        &[
            "consume",
            "queue",
            "--share-group",
            "workers",
            "--max-messages",
            "10",
            "--format",
            "json",
        ],
        None,
    );
    let first: Vec<String> = first.lines().map(str::to_string).collect();
    assert_eq!(first.len(), 10, "{first:?}");
    let described = describe(&node, "workers");
    assert_eq!(described["type"], "share", "{described}");
    assert_eq!(described["state"], "Empty", "{described}");
    assert_eq!(
        described["partitions"].as_array().unwrap().len(),
        4,
        "{described}"
    );
    assert_eq!(total_lag(&described), 190, "{described}");
    for partition in described["partitions"].as_array().unwrap() {
        let lag = partition["lag"].as_u64().unwrap();
        let seconds = partition["lag_seconds"].as_f64().expect("lag in seconds");
        assert!(seconds >= 0.0 && (lag > 0 || seconds == 0.0), "{partition}");
        assert!(
            partition["start_offset"].as_u64().unwrap()
                <= partition["high_watermark"].as_u64().unwrap()
        );
    }

    // Two members share the rest, each record printed by one of them once.
    let one = Consuming::start(&node, "queue", "workers");
    let two = Consuming::start(&node, "queue", "workers");
    wait_for_at_most(
        "the two members print the rest",
        Duration::from_secs(60),
        || one.lines().len() + two.lines().len() >= 190,
    );
    wait_for_at_most(
        "both members in the group, every record done",
        Duration::from_secs(30),
        || {
            let described = describe(&node, "workers");
            described["members"].as_array().unwrap().len() == 2 && total_lag(&described) == 0
        },
    );
    // Once each member heard its half of the partitions, more records go to both.
    std::thread::sleep(Duration::from_secs(2));
    produce_from(&node, "queue", 200, 200);
    wait_for_at_most(
        "the two members print the new records",
        Duration::from_secs(60),
        || one.lines().len() + two.lines().len() >= 390,
    );
    wait_for_at_most("every record done", Duration::from_secs(30), || {
        total_lag(&describe(&node, "workers")) == 0
    });
    let described = describe(&node, "workers");
    for member in described["members"].as_array().unwrap() {
        assert_eq!(member["client_id"], "strata-consume", "{described}");
        assert!(
            !member["partitions"].as_array().unwrap().is_empty(),
            "{described}"
        );
    }
    for partition in described["partitions"].as_array().unwrap() {
        assert_eq!(
            partition["start_offset"], partition["high_watermark"],
            "{partition}"
        );
        assert_eq!(partition["in_flight"], 0, "{partition}");
        assert_eq!(partition["lag_seconds"], 0.0, "{partition}");
    }
    let text = node.cli(&["group", "describe", "workers"], None);
    assert!(text.starts_with("share group workers epoch "), "{text}");
    assert_eq!(text.matches("  member ").count(), 2, "{text}");
    assert_eq!(
        text.matches(" in-flight 0 (acquired 0) lag 0 (0.0 s)")
            .count(),
        4,
        "{text}"
    );
    // Nothing comes again once the locks would have run out.
    std::thread::sleep(Duration::from_millis(2 * LOCK_MS + 500));
    let (one, two) = (one.stop(), two.stop());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for value in values(&first)
        .into_iter()
        .chain(values(&one))
        .chain(values(&two))
    {
        *seen.entry(value).or_default() += 1;
    }
    assert_eq!(seen.len(), 400, "every record printed");
    let repeated: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
    assert!(repeated.is_empty(), "printed more than once: {repeated:?}");
    assert!(
        !one.is_empty() && !two.is_empty(),
        "both members got records"
    );

    // A member joining later finds nothing left.
    let late = Consuming::start(&node, "queue", "workers");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(late.stop(), Vec::<String>::new());
    let described = describe(&node, "workers");
    assert_eq!(
        described["members"].as_array().unwrap().len(),
        0,
        "{described}"
    );
    assert_eq!(total_lag(&described), 0, "{described}");
}

/// Polls until `want` records came (or the patience ran out).
async fn poll_for(consumer: &mut ShareConsumer, want: usize) -> Vec<ShareRecord> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut records = Vec::new();
    while records.len() < want && Instant::now() < deadline {
        records.extend(consumer.poll().await.expect("poll"));
    }
    records
}

/// The Rust `ShareConsumer` in explicit mode: accept, release and reject; the released
/// record alone comes again, its delivery counted. Then implicit mode: a poll accepts what
/// the one before returned.
#[test]
fn a_released_record_comes_again_with_its_delivery_counted_and_a_rejected_one_never() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "jobs", "--partitions", "1"], None);
    configure(&kafka, "solo");
    produce(&node, "jobs", 3);
    support::runtime().block_on(async {
        let client = node.client().await;
        let mut config = ShareConfig::new("solo");
        config.acknowledgement = AckMode::Explicit;
        let mut consumer = ShareConsumer::subscribe(client.clone(), vec!["jobs".into()], config)
            .await
            .expect("joined");
        let records = poll_for(&mut consumer, 3).await;
        let got: Vec<(u64, u16)> = records
            .iter()
            .map(|r| (r.offset, r.delivery_count))
            .collect();
        assert_eq!(got, vec![(0, 1), (1, 1), (2, 1)]);
        assert_eq!(records[1].key.as_deref(), Some(&b"key-1"[..]));
        assert_eq!(records[1].value.as_deref(), Some(&b"value-1"[..]));
        consumer.acknowledge(&records[0], AckType::Accept).unwrap();
        consumer.acknowledge(&records[1], AckType::Release).unwrap();
        consumer.acknowledge(&records[2], AckType::Reject).unwrap();
        assert!(
            consumer.acknowledge(&records[0], AckType::Accept).is_err(),
            "a record is acknowledged once"
        );
        consumer.commit().await.expect("acknowledgements stored");

        let again = poll_for(&mut consumer, 1).await;
        let got: Vec<(u64, u16)> = again.iter().map(|r| (r.offset, r.delivery_count)).collect();
        assert_eq!(
            got,
            vec![(1, 2)],
            "only the released record, delivered a second time"
        );
        assert_eq!(again[0].value.as_deref(), Some(&b"value-1"[..]));
        consumer.acknowledge(&again[0], AckType::Accept).unwrap();
        consumer.close().await.expect("closed");

        // Every record is done: a new member gets none. In implicit mode, what it gets next
        // is accepted by its next poll.
        let mut config = ShareConfig::new("solo");
        config.max_wait = Duration::from_millis(200);
        let mut later = ShareConsumer::subscribe(client.clone(), vec!["jobs".into()], config)
            .await
            .expect("joined");
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            assert_eq!(later.poll().await.expect("poll"), Vec::new());
        }
        produce_from(&node, "jobs", 3, 2);
        let next = poll_for(&mut later, 2).await;
        let got: Vec<(u64, u16)> = next.iter().map(|r| (r.offset, r.delivery_count)).collect();
        assert_eq!(got, vec![(3, 1), (4, 1)]);
        assert_eq!(later.poll().await.expect("poll"), Vec::new());
        let partitions = client
            .describe_share_partitions("solo", &[("jobs".to_string(), 0)])
            .await
            .expect("described partitions");
        assert_eq!(
            partitions[0].start_offset, 5,
            "accepted by the poll: {partitions:?}"
        );
        assert_eq!(partitions[0].lag, 0, "{partitions:?}");
        let described = client
            .describe_share_group("solo")
            .await
            .expect("described");
        assert_eq!(described.members.len(), 1, "{described:?}");
        assert_eq!(described.members[0].member_id, later.member_id());
        later.close().await.expect("closed");
        let described = client
            .describe_share_group("solo")
            .await
            .expect("described");
        assert!(described.members.is_empty(), "{described:?}");
    });
}

/// Share fetches of records in the page cache go out straight from the segment files
/// (`sendfile`), as a consumer group's fetches do, on both listeners. Natively, the Rust
/// `ShareConsumer` gets every record of 6 MB in 128 KiB batches once and whole. Through Kafka's
/// protocol, Kafka batches (produced by librdkafka) go out as stored to `strata bench`'s
/// KIP-932 share consumer, which checks each batch whole (its CRC) and counts every record.
#[test]
fn share_fetches_of_cached_segments_go_straight_from_the_page_cache() {
    use strata_client::{Producer, ProducerConfig, ProducerRecord};
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let admin = free_base_port(0);
    let node = TestNode::start_with(
        dir.path(),
        2,
        &[
            "--kafka-listen",
            &kafka,
            "--admin",
            &format!("127.0.0.1:{admin}"),
        ],
    );
    // The leader's appends through the page cache (see node.rs's consumer-group twin).
    for topic in ["bulk", "kafka-bulk"] {
        node.cli(
            &[
                "topic",
                "create",
                topic,
                "--partitions",
                "1",
                "--config",
                "direct.writes=replicated",
            ],
            None,
        );
    }
    configure(&kafka, "bulk-share");
    configure(&kafka, "kafka-bulk-share");
    let sent_from_files = || support::metric_total(admin, "strata_fetch_sendfile_bytes_total");
    let value_of = |offset: u64| {
        let mut value = format!("{offset:08}").into_bytes();
        value.resize(2000, b'a' + (offset % 26) as u8);
        value
    };
    support::runtime().block_on(async {
        let client = node.client().await;
        let producer = Producer::new(
            client.clone(),
            ProducerConfig {
                batch_bytes: 128 << 10,
                linger: Duration::from_millis(20),
                ..ProducerConfig::default()
            },
        );
        let mut acks = Vec::new();
        for offset in 0..3000u64 {
            let record = ProducerRecord::new("bulk", None, value_of(offset));
            acks.push(producer.send(record).await.unwrap());
        }
        for ack in acks {
            ack.await.unwrap();
        }
        let mut consumer = ShareConsumer::subscribe(
            client.clone(),
            vec!["bulk".into()],
            ShareConfig::new("bulk-share"),
        )
        .await
        .expect("joined");
        let mut seen = vec![false; 3000];
        let mut left = 3000;
        let deadline = Instant::now() + Duration::from_secs(60);
        while left > 0 {
            assert!(Instant::now() < deadline, "{left} records never came");
            for record in consumer.poll().await.expect("poll") {
                let offset = record.offset;
                assert!(!seen[offset as usize], "offset {offset} delivered twice");
                assert_eq!(record.delivery_count, 1);
                assert_eq!(
                    record.value.as_deref(),
                    Some(&value_of(offset)[..]),
                    "{offset}"
                );
                seen[offset as usize] = true;
                left -= 1;
            }
        }
        consumer.close().await.expect("closed");
    });
    let native = sent_from_files();
    assert!(
        native >= 3e6,
        "{native} bytes of 6 MB in the page cache were sent from the files"
    );

    // Kafka batches through the Kafka listener.
    let bench = |args: &[&str]| {
        let report = dir.path().join("report.json");
        let mut all = vec!["bench"];
        all.extend(args);
        all.extend(["--protocol", "kafka", "--bootstrap", &kafka]);
        let report_text = report.display().to_string();
        all.extend(["--json", &report_text]);
        node.cli(&all, None);
        serde_json::from_str::<Value>(&std::fs::read_to_string(&report).unwrap()).unwrap()
    };
    let produced = bench(&[
        "produce",
        "--topic",
        "kafka-bulk",
        "--records",
        "3000",
        "--record-size",
        "2000",
        "--batch-size",
        "128KiB",
        "--linger-ms",
        "20",
    ]);
    assert_eq!(produced["records"], 3000, "{produced}");
    let consumed = bench(&[
        "consume",
        "--topic",
        "kafka-bulk",
        "--records",
        "3000",
        "--share-group",
        "kafka-bulk-share",
        "--consumers",
        "1",
    ]);
    assert!(
        consumed["records"].as_u64() >= Some(3000),
        "every record read: {consumed}"
    );
    let through_kafka = sent_from_files() - native;
    assert!(
        through_kafka >= 3e6,
        "{through_kafka} bytes of 6 MB of Kafka batches in the page cache were sent from the files"
    );
}
