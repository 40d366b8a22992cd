//! The producer shares requests between partitions (and topics) bound for one leader shard:
//! every record's acknowledged (partition, offset) must still be exactly where it landed.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use strata_client::{
    Client, ClientConfig, Codec, Consumer, ConsumerConfig, Producer, ProducerConfig,
    ProducerRecord, SeekTo,
};
use support::{TestNode, runtime};

async fn connect(node: &TestNode, config: ProducerConfig) -> (std::sync::Arc<Client>, Producer) {
    let client = Client::connect(ClientConfig::new(node.bootstrap()))
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), config);
    (client, producer)
}

/// Reads `topic` from the beginning until at least `expected` records came: how many records,
/// in how many batches.
async fn records_and_batches(
    client: &std::sync::Arc<Client>,
    topic: &str,
    expected: usize,
) -> (usize, usize) {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default());
    consumer
        .assign(topic, &[], SeekTo::Beginning)
        .await
        .unwrap();
    let (mut records, mut batches) = (0, 0);
    while records < expected {
        for batch in consumer.poll().await.unwrap() {
            batches += 1;
            records += batch.records().count();
        }
    }
    (records, batches)
}

/// Reads `partition` of `topic` from the beginning until at least `expected` records came.
async fn read_all(
    client: &std::sync::Arc<Client>,
    (topic, partition): (&str, u32),
    expected: usize,
) -> Vec<Read> {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default());
    consumer
        .assign(topic, &[partition], SeekTo::Beginning)
        .await
        .unwrap();
    let mut read: Vec<Read> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while read.len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read {}",
            read.len()
        );
        for batch in consumer.poll().await.unwrap() {
            for record in batch.records() {
                read.push(Read {
                    offset: record.offset,
                    key: record.key.map(<[u8]>::to_vec),
                    value: record.value.to_vec(),
                    timestamp_ms: record.timestamp_ms,
                });
            }
        }
    }
    read
}

/// A record as read back, owned.
struct Read {
    offset: u64,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp_ms: i64,
}

#[test]
fn shared_requests_acknowledge_every_record_where_it_landed() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    for topic in ["left", "right"] {
        node.cli(&["topic", "create", topic, "--partitions", "8"], None);
    }
    runtime().block_on(async {
        // Tiny batches (1 ms linger) over 16 partitions: many wait for the same shard at once.
        let (client, producer) = connect(
            &node,
            ProducerConfig {
                linger: Duration::from_millis(1),
                batch_bytes: 512,
                ..ProducerConfig::default()
            },
        )
        .await;
        let mut acks = Vec::new();
        for i in 0..4000u32 {
            let topic = if i % 2 == 0 { "left" } else { "right" };
            let value = format!("{topic}-{i}");
            let record =
                ProducerRecord::new(topic, Some(Bytes::from(i.to_string())), value.clone());
            acks.push((topic, value, producer.send(record).await.unwrap()));
        }
        producer.flush().await.unwrap();
        let mut expected: HashMap<(String, u32, u64), String> = HashMap::new();
        for (topic, value, ack) in acks {
            let landed = ack.await.unwrap();
            let key = (topic.to_string(), landed.partition, landed.offset as u64);
            assert!(
                expected.insert(key, value).is_none(),
                "two records acknowledged at one offset"
            );
        }
        let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default());
        for topic in ["left", "right"] {
            consumer
                .assign(topic, &[], SeekTo::Beginning)
                .await
                .unwrap();
        }
        let mut found = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while found < expected.len() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "read {found} of {}",
                expected.len()
            );
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    let key = (batch.topic.clone(), batch.partition, record.offset);
                    let value = String::from_utf8_lossy(record.value);
                    assert_eq!(
                        expected.get(&key).map(String::as_str),
                        Some(&*value),
                        "the acknowledgement for {value} named another place"
                    );
                    found += 1;
                }
            }
        }
    });
}

/// `send_batch` hands many records to one partition at once: they keep their order, split into
/// producer batches where `batch_bytes` says, and the returned futures (one per producer batch)
/// name the offset of each batch's last record of them.
#[test]
fn a_batch_handed_over_at_once_lands_in_order_across_producer_batches() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "many", "--partitions", "3"], None);
    runtime().block_on(async {
        let (client, producer) = connect(
            &node,
            ProducerConfig {
                batch_bytes: 4096,
                ..ProducerConfig::default()
            },
        )
        .await;
        let topic: std::sync::Arc<str> = "many".into();
        // Something sent the usual way first: the batch continues after it.
        producer
            .send(ProducerRecord {
                partition: Some(1),
                ..ProducerRecord::new(topic.clone(), None, "first")
            })
            .await
            .unwrap();
        let values: Vec<String> = (0..500)
            .map(|i| format!("value-{i:03}-{}", "x".repeat(100)))
            .collect();
        let records: Vec<(Option<&[u8]>, &[u8])> = values
            .iter()
            .enumerate()
            .map(|(i, value)| ((i % 2 == 0).then_some(b"k".as_slice()), value.as_bytes()))
            .collect();
        let acks = producer
            .send_batch(&topic, 1, Some(1_000), &records)
            .await
            .unwrap();
        assert!(
            acks.len() > 5,
            "500 records of ~110 B span many 4 KiB batches"
        );
        let mut last = -1;
        for ack in acks {
            let landed = ack.await.unwrap();
            assert_eq!(landed.partition, 1);
            assert!(landed.offset > last, "batches are acknowledged in order");
            last = landed.offset;
        }
        assert_eq!(last, 500, "the last record follows the first one sent");
        // Out of range: a typed error, nothing queued.
        assert!(
            producer
                .send_batch(&topic, 3, None, &records)
                .await
                .is_err()
        );

        let read = read_all(&client, ("many", 1), 501).await;
        assert_eq!(read[0].value, b"first");
        for (i, record) in read[1..].iter().enumerate() {
            assert_eq!(record.offset, i as u64 + 1);
            assert_eq!(record.value, values[i].as_bytes());
            assert_eq!(
                record.key.as_deref(),
                (i % 2 == 0).then_some(b"k".as_slice())
            );
            assert_eq!(record.timestamp_ms, 1_000);
        }
    });
}

/// While a partition's requests are all in flight, records sent with no linger keep filling the
/// open batch instead of queueing one tiny batch each behind them (as Kafka's accumulator
/// appends to the batch at the tail of its queue): with the broker paused, 1,000 records sent
/// behind one request in flight arrive in a handful of batches, not hundreds.
#[test]
fn batches_fill_while_requests_are_in_flight_instead_of_queueing_tiny_ones() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "fill", "--partitions", "1"], None);
    runtime().block_on(async {
        let (client, producer) = connect(
            &node,
            ProducerConfig {
                linger: Duration::ZERO,
                max_in_flight: 1,
                ..ProducerConfig::default()
            },
        )
        .await;
        let record = |i: u32| ProducerRecord::new("fill", None, format!("record {i}"));
        producer.send(record(0)).await.unwrap().await.unwrap();
        node.signal(libc::SIGSTOP);
        // Stopped before the next request reaches it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut acks = Vec::new();
        for i in 1..=1000u32 {
            acks.push(producer.send(record(i)).await.unwrap());
            if i % 50 == 0 {
                // Room for the linger task to run between sends, as between a real
                // application's records.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        node.signal(libc::SIGCONT);
        for ack in acks {
            ack.await.unwrap();
        }
        let (records, batches) = records_and_batches(&client, "fill", 1001).await;
        assert_eq!(records, 1001);
        // The first record alone, the batch sealed as the broker stopped, then the rest.
        assert!(batches <= 4, "1,001 records came in {batches} batches");
    });
}

/// Records with neither key nor partition go to one partition a batch's worth at a time (Kafka's
/// uniform sticky partitioner): acknowledged in runs of one partition, each run about
/// `batch_bytes`, every partition taking its turn, and each partition's records stored in few
/// batches rather than one record each.
#[test]
fn keyless_records_fill_one_partition_a_batch_at_a_time() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "sticky", "--partitions", "4"], None);
    runtime().block_on(async {
        let batch_bytes = 8 << 10;
        let (client, producer) = connect(
            &node,
            ProducerConfig {
                linger: Duration::ZERO,
                batch_bytes,
                ..ProducerConfig::default()
            },
        )
        .await;
        let value = "v".repeat(100);
        let mut acks = Vec::new();
        for _ in 0..2000 {
            let record = ProducerRecord::new("sticky", None, value.clone());
            acks.push(producer.send(record).await.unwrap());
        }
        let mut partitions = Vec::new();
        for ack in acks {
            partitions.push(ack.await.unwrap().partition);
        }
        // Runs of one partition, in turn.
        let mut runs: Vec<(u32, usize)> = Vec::new();
        for partition in partitions {
            match runs.last_mut() {
                Some((last, length)) if *last == partition => *length += 1,
                _ => runs.push((partition, 1)),
            }
        }
        // 100-byte values take 148 bytes of the buffer each: 56 per 8 KiB batch.
        let per_run = batch_bytes.div_ceil(148);
        assert!(runs.len() >= 4, "{runs:?}");
        for pair in runs.windows(2) {
            assert_eq!(
                (pair[0].0 + 1) % 4,
                pair[1].0,
                "partitions take turns: {runs:?}"
            );
        }
        for (_, length) in &runs[..runs.len() - 1] {
            assert_eq!(*length, per_run, "{runs:?}");
        }
        // Stored in batches, not a record each.
        let (records, batches) = records_and_batches(&client, "sticky", 2000).await;
        assert_eq!(records, 2000);
        assert!(batches < 200, "2,000 records came in {batches} batches");
    });
}

/// Compression (`ProducerConfig::compression`, `produce --compression`): the broker stores the
/// compressed batches as sent, smaller, and consumers read every record back exactly.
#[test]
fn compressed_batches_are_stored_smaller_and_read_back_exactly() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    let codecs = [Codec::None, Codec::Lz4, Codec::Zstd];
    for codec in codecs {
        node.cli(
            &[
                "topic",
                "create",
                &format!("c-{codec}"),
                "--partitions",
                "1",
            ],
            None,
        );
    }
    let records: Vec<(Bytes, String)> = (0..3000u32)
        .map(|i| {
            (
                Bytes::from(format!("customer-{}", i % 40)),
                format!(
                    "{{\"order\": {i}, \"status\": \"{}\", \"region\": \"eu-west-1\", \"items\": {}}}",
                    ["shipped", "pending", "returned"][i as usize % 3],
                    i % 9
                ),
            )
        })
        .collect();
    runtime().block_on(async {
        for codec in codecs {
            let topic = format!("c-{codec}");
            let (client, producer) = connect(
                &node,
                ProducerConfig {
                    compression: codec,
                    batch_bytes: 64 * 1024,
                    ..ProducerConfig::default()
                },
            )
            .await;
            let mut acks = Vec::new();
            for (key, value) in &records {
                let record = ProducerRecord::new(topic.as_str(), Some(key.clone()), value.clone());
                acks.push(producer.send(record).await.unwrap());
            }
            producer.flush().await.unwrap();
            for (index, ack) in acks.into_iter().enumerate() {
                assert_eq!(ack.await.unwrap().offset, index as i64);
            }
            let mut consumer = Consumer::new(client, ConsumerConfig::default());
            consumer
                .assign(&topic, &[0], SeekTo::Beginning)
                .await
                .unwrap();
            let mut read = Vec::new();
            while read.len() < records.len() {
                for batch in consumer.poll().await.unwrap() {
                    for record in batch.records() {
                        read.push((
                            record.offset,
                            Bytes::copy_from_slice(record.key.unwrap()),
                            String::from_utf8(record.value.to_vec()).unwrap(),
                        ));
                    }
                }
            }
            for (index, ((offset, key, value), (sent_key, sent_value))) in
                read.iter().zip(&records).enumerate()
            {
                assert_eq!(
                    (*offset, key, value),
                    (index as u64, sent_key, sent_value),
                    "{codec}"
                );
            }
        }
    });
    let plain = support::topic_log_bytes(data.path(), "c-none");
    let lz4 = support::topic_log_bytes(data.path(), "c-lz4");
    let zstd = support::topic_log_bytes(data.path(), "c-zstd");
    assert!(
        lz4 * 2 < plain && zstd * 3 < plain && zstd < lz4,
        "stored bytes: none {plain}, lz4 {lz4}, zstd {zstd}"
    );

    // The CLI producer takes the same setting; an unknown codec is a usage error.
    node.cli(&["topic", "create", "cli-zstd", "--partitions", "1"], None);
    node.cli(
        &["produce", "cli-zstd", "--compression", "zstd"],
        Some(b"alpha\nbeta\ngamma\n"),
    );
    let consumed = node.cli(
        &[
            "consume",
            "cli-zstd",
            "--from-beginning",
            "--max-messages",
            "3",
        ],
        None,
    );
    assert_eq!(
        consumed.lines().collect::<Vec<_>>(),
        ["alpha", "beta", "gamma"]
    );
    let refused = node.cli_output(
        &["produce", "cli-zstd", "--compression", "snappy"],
        Some(b"x\n"),
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not a codec"));
}

/// Two writers share a partition as one log with conditional appends (`Producer::send_if`):
/// each round both append at the end they know, exactly one wins, the other learns the new
/// end and nothing of it is written; over a thousand rounds the log holds exactly the winners,
/// in order, without gaps or doubles. Idempotent writers and acks=all, as event sourcing
/// would run them.
#[test]
fn racing_conditional_appends_let_exactly_one_writer_win_each_round() {
    const ROUNDS: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 2);
    node.cli(&["topic", "create", "ledger", "--partitions", "1"], None);
    runtime().block_on(async {
        let config = ProducerConfig {
            idempotent: true,
            acks: strata_wire::protocol::ACKS_ALL,
            linger: Duration::ZERO,
            ..ProducerConfig::default()
        };
        let (client, first) = connect(&node, config.clone()).await;
        let (_, second) = connect(&node, config).await;
        let mut winners = Vec::new();
        for round in 0..ROUNDS {
            // Each round's winner appends at the end the last round left.
            let end = round;
            let values = [format!("a-{round}"), format!("b-{round}")];
            let records = values.each_ref().map(|value| [(None, value.as_bytes())]);
            let (a, b) = tokio::join!(
                first.send_if("ledger", 0, end, &records[0]),
                second.send_if("ledger", 0, end, &records[1]),
            );
            let (won, lost) = match (a, b) {
                (Ok(landed), Err(lost)) => ((landed.offset as u64, &values[0]), lost),
                (Err(lost), Ok(landed)) => ((landed.offset as u64, &values[1]), lost),
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            };
            assert_eq!(
                won.0, end,
                "round {round}: the winner appended at the expected end"
            );
            match lost {
                strata_client::ClientError::LogEndMismatch { log_end, .. } => {
                    assert_eq!(
                        log_end,
                        end + 1,
                        "round {round}: the loser learns the new end"
                    )
                }
                other => panic!("round {round}: the loser got {other}"),
            }
            winners.push(won.1.clone());
        }
        let read = read_all(&client, ("ledger", 0), ROUNDS as usize).await;
        let offsets: Vec<u64> = read.iter().map(|record| record.offset).collect();
        assert_eq!(
            offsets,
            (0..ROUNDS).collect::<Vec<_>>(),
            "no gaps, no doubles"
        );
        let values: Vec<String> = read
            .iter()
            .map(|record| String::from_utf8(record.value.clone()).unwrap())
            .collect();
        assert_eq!(values, winners);
        // A lost append wrote nothing and its sequences were given back: neither writer ever
        // needed a new epoch, however often it lost.
        let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default());
        consumer
            .assign("ledger", &[0], SeekTo::Beginning)
            .await
            .unwrap();
        let mut epochs = std::collections::BTreeSet::new();
        let mut seen = 0;
        while seen < ROUNDS {
            for batch in consumer.poll().await.unwrap() {
                epochs.insert(batch.batch.header().producer_epoch);
                seen += batch.records().count() as u64;
            }
        }
        assert_eq!(
            epochs,
            [0].into(),
            "producer epochs of the winners' batches"
        );
    });
}

/// `strata produce --expect-offset`: stdin's lines are one conditional append to
/// `--partition`; where the log does not end there, nothing is written and the command fails
/// naming the log end.
#[test]
fn the_cli_appends_only_where_the_log_ends_as_expected() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 1);
    node.cli(&["topic", "create", "cas", "--partitions", "2"], None);
    let append = |expected: &str, input: &[u8]| {
        node.cli_output(
            &[
                "produce",
                "cas",
                "--partition",
                "1",
                "--expect-offset",
                expected,
                "--print-offsets",
            ],
            Some(input),
        )
    };
    let written = append("0", b"a\nb\n");
    assert!(written.status.success());
    assert_eq!(String::from_utf8_lossy(&written.stdout), "1 0\n1 1\n");
    let refused = append("1", b"c\n");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("cas-1 ends at 2, not at 1: nothing written"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&append("2", b"c\n").stdout),
        "1 2\n"
    );
    let read = node.cli(
        &[
            "consume",
            "cas",
            "--partition",
            "1",
            "--from-beginning",
            "--max-messages",
            "3",
        ],
        None,
    );
    assert_eq!(read, "a\nb\nc\n");
}
