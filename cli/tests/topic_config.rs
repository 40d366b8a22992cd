//! Altering a live topic's settings (`strata topic alter`), seeing them (`topic describe`), and
//! retention running on its own in a serving node.

mod support;

use std::time::Duration;

use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, ErrorCode, OffsetReset, Producer,
    ProducerConfig, ProducerRecord, SeekTo,
};
use support::{TestNode, describe, runtime, wait_for_at_most};

fn overrides(node: &TestNode, topic: &str) -> Vec<String> {
    describe(node, topic)["overrides"]
        .as_array()
        .expect("overrides listed")
        .iter()
        .map(|key| key.as_str().unwrap().to_string())
        .collect()
}

/// Sends one record of `len` bytes to `partition` and waits for its answer.
async fn send_to(
    producer: &Producer,
    topic: &str,
    partition: u32,
    len: usize,
) -> Result<i64, ErrorCode> {
    let mut record = ProducerRecord::new(topic, None, vec![b'x'; len]);
    record.partition = Some(partition);
    let ack = producer.send(record).await.unwrap();
    producer.flush().await.unwrap();
    ack.await
        .map(|ack| ack.offset)
        .map_err(|error| error.code().unwrap_or_else(|| panic!("untyped: {error}")))
}

async fn send(producer: &Producer, topic: &str, len: usize) -> Result<i64, ErrorCode> {
    send_to(producer, topic, 0, len).await
}

#[test]
fn altered_settings_apply_to_a_live_topic_and_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "live", "--partitions", "2"], None);
    let described = describe(&node, "live");
    assert_eq!(described["config"]["max.message.bytes"], "16777216");
    assert_eq!(described["config"]["flush"], "interval");
    assert_eq!(described["config"]["direct.writes"], "auto");
    assert!(overrides(&node, "live").is_empty());

    runtime().block_on(async {
        let mut config = ClientConfig::new(node.bootstrap());
        config.request_timeout = Duration::from_secs(10);
        let client = Client::connect(config).await.unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        assert_eq!(send(&producer, "live", 4096).await, Ok(0));

        // The limit applies to the running partitions at once...
        node.cli(
            &[
                "topic",
                "alter",
                "live",
                "--config",
                "max.message.bytes=2048",
                "--config",
                "flush=never",
            ],
            None,
        );
        assert_eq!(
            send(&producer, "live", 4096).await,
            Err(ErrorCode::MessageTooLarge)
        );
        assert_eq!(send(&producer, "live", 100).await, Ok(1));

        // ...an invalid change is refused whole (a typed error, a reason naming the key)...
        let refused = node.cli_output(
            &[
                "topic",
                "alter",
                "live",
                "--config",
                "max.message.bytes=4096",
                "--config",
                "flush=sometimes",
            ],
            None,
        );
        assert_eq!(refused.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("flush=sometimes"), "{stderr}");
        assert_eq!(
            send(&producer, "live", 4096).await,
            Err(ErrorCode::MessageTooLarge),
            "nothing of the refused change applied"
        );
        let unknown = node.cli_output(
            &["topic", "alter", "live", "--delete-config", "colour"],
            None,
        );
        assert_eq!(unknown.status.code(), Some(1));
        let missing = node.cli_output(&["topic", "alter", "nope", "--config", "flush=never"], None);
        assert_eq!(missing.status.code(), Some(1));
        let usage = node.cli_output(&["topic", "alter", "live"], None);
        assert_eq!(
            usage.status.code(),
            Some(2),
            "nothing to alter is a usage error"
        );
    });
    let described = describe(&node, "live");
    assert_eq!(described["config"]["max.message.bytes"], "2048");
    assert_eq!(described["config"]["flush"], "never");
    let mut shown = overrides(&node, "live");
    shown.sort();
    assert_eq!(shown, ["flush", "max.message.bytes"]);

    // A restart opens the partitions with the altered settings.
    node.restart();
    assert_eq!(overrides(&node, "live").len(), 2);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut offsets = Vec::new();
        for partition in 0..2 {
            offsets.push(send_to(&producer, "live", partition, 4096).await);
        }
        assert!(
            offsets
                .iter()
                .all(|o| *o == Err(ErrorCode::MessageTooLarge)),
            "{offsets:?}"
        );
    });
    node.cli(
        &[
            "topic",
            "alter",
            "live",
            "--delete-config",
            "max.message.bytes",
        ],
        None,
    );
    assert_eq!(overrides(&node, "live"), ["flush"]);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        assert!(
            send(&producer, "live", 4096).await.is_ok(),
            "back to the default limit"
        );
    });
}

/// Retention used to be a setting nothing enforced in a running broker: old segments stayed
/// forever. Shrinking retention on a live topic now deletes its old segments within a check
/// interval, and consumers see the new log start.
#[test]
fn retention_deletes_old_segments_of_a_live_topic() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(data.path(), 1, &["--retention-check-interval-ms", "100"]);
    node.cli(
        &[
            "topic",
            "create",
            "aging",
            "--partitions",
            "1",
            "--config",
            "segment.bytes=16384",
        ],
        None,
    );
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        // Batches of 10 records (about 2 KiB): several to a 16 KiB segment.
        let producer = Producer::new(
            client,
            ProducerConfig {
                batch_records: Some(10),
                ..ProducerConfig::default()
            },
        );
        let mut acks = Vec::new();
        for i in 0..400 {
            let value = format!("record-{i:04}-{}", "y".repeat(200));
            acks.push(
                producer
                    .send(ProducerRecord::new("aging", None, value))
                    .await
                    .unwrap(),
            );
        }
        producer.flush().await.unwrap();
        for ack in acks {
            ack.await.unwrap();
        }
    });
    let segments = || support::log_segments(&data.path().join("aging-0"));
    let before = segments();
    assert!(before >= 4, "{before} segments");
    let log_start = || {
        describe(&node, "aging")["partitions"][0]["log_start_offset"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(log_start(), 0, "no retention configured: nothing goes");

    // Consumers positioned at the start before retention runs: one resets to the earliest
    // record still there, one (Kafka's `none`) gets the typed error.
    let (mut resetting, mut strict) = runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let consumer = |reset| {
            Consumer::new(
                client.clone(),
                ConsumerConfig {
                    max_wait: Duration::from_millis(100),
                    auto_offset_reset: reset,
                    ..ConsumerConfig::default()
                },
            )
        };
        let (mut resetting, mut strict) = (consumer(Some(OffsetReset::Earliest)), consumer(None));
        for consumer in [&mut resetting, &mut strict] {
            consumer
                .assign("aging", &[0], SeekTo::Offset(0))
                .await
                .unwrap();
        }
        (resetting, strict)
    });

    node.cli(
        &[
            "topic",
            "alter",
            "aging",
            "--config",
            "retention.bytes=32768",
        ],
        None,
    );
    wait_for_at_most(
        "retention to delete old segments",
        Duration::from_secs(10),
        || log_start() > 0,
    );
    let after = segments();
    assert!(after < before, "{before} → {after} segments");
    let start = log_start();
    runtime().block_on(async {
        let refused = strict.poll().await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(ErrorCode::OffsetOutOfRange),
            "{refused}"
        );
        let mut first = None;
        while first.is_none() {
            let batches = resetting.poll().await.unwrap();
            first = batches
                .first()
                .and_then(|batch| batch.records().next().map(|r| r.offset));
        }
        assert_eq!(
            first,
            Some(start),
            "reset to the earliest record still held"
        );
    });
    // What remains reads back from the new start, the newest record last.
    let remaining = (400 - start).to_string();
    let consumed = node.cli(
        &[
            "consume",
            "aging",
            "--partition",
            "0",
            "--from-beginning",
            "--max-messages",
            &remaining,
            "--format",
            "json",
        ],
        None,
    );
    let records = support::json_lines(&consumed);
    assert_eq!(records.first().unwrap()["offset"].as_u64(), Some(start));
    assert_eq!(records.len() as u64, 400 - start);
    assert!(
        records.last().unwrap()["value"]
            .as_str()
            .unwrap()
            .starts_with("record-0399")
    );
}

/// A serving node reserves a segment's blocks ahead of its appends as the topic's
/// `preallocate.step.bytes` says (created through the CLI, shown by `topic describe`), keeps
/// none with 0, and trims the reservation at a clean shutdown.
#[test]
fn a_live_node_reserves_segment_blocks_as_the_topic_says() {
    use std::os::unix::fs::MetadataExt;
    let data = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(data.path(), 1);
    for (topic, step) in [("stepped", "1048576"), ("unreserved", "0")] {
        node.cli(
            &[
                "topic",
                "create",
                topic,
                "--partitions",
                "1",
                "--config",
                "flush=never",
                "--config",
                &format!("preallocate.step.bytes={step}"),
            ],
            None,
        );
        assert_eq!(
            describe(&node, topic)["config"]["preallocate.step.bytes"],
            step
        );
    }
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client, ProducerConfig::default());
        for topic in ["stepped", "unreserved"] {
            // About 2.5 MB.
            for _ in 0..40 {
                send(&producer, topic, 64 << 10).await.unwrap();
            }
        }
    });
    let log_file = |topic: &str| {
        data.path()
            .join(format!("{topic}-0/00000000000000000000.log"))
    };
    let allocated = |topic: &str| {
        let metadata = std::fs::metadata(log_file(topic)).unwrap();
        (metadata.len(), metadata.blocks() * 512)
    };
    let (len, blocks) = allocated("stepped");
    assert!(len > 2 << 20, "{len} bytes written");
    assert!(
        blocks >= len + (512 << 10),
        "stepped: {blocks} bytes of blocks for {len} bytes of data"
    );
    let (len, blocks) = allocated("unreserved");
    assert!(
        blocks < len + (512 << 10),
        "unreserved: {blocks} bytes of blocks for {len} bytes of data"
    );
    node.stop();
    let (len, blocks) = allocated("stepped");
    assert!(
        blocks < len + (64 << 10),
        "after a clean shutdown: {blocks} bytes of blocks for {len} bytes of data"
    );
}
