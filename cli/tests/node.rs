//! End to end against real `strata serve` processes: CLI and client crate, restarts, shards,
//! long-poll.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use support::{TestNode, runtime};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Consumed {
    partition: u32,
    offset: u64,
    key: Option<String>,
    value: String,
}

async fn consume_all(client: Arc<Client>, topic: &str, expected: usize) -> Vec<Consumed> {
    let mut consumer = Consumer::new(
        client,
        ConsumerConfig {
            max_wait: Duration::from_millis(200),
            ..ConsumerConfig::default()
        },
    );
    consumer
        .assign(topic, &[], SeekTo::Beginning)
        .await
        .unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < expected && Instant::now() < deadline {
        for batch in consumer.poll().await.unwrap() {
            for record in batch.records() {
                out.push(Consumed {
                    partition: batch.partition,
                    offset: record.offset,
                    key: record.key.map(|k| String::from_utf8(k.to_vec()).unwrap()),
                    value: String::from_utf8(record.value.to_vec()).unwrap(),
                });
            }
        }
    }
    out
}

/// Produces `count` records valued `value-{i}` and returns where each was acknowledged. Keyless,
/// in 16 KiB batches (Kafka's default size): the sticky partitioner moves to the next
/// partition after each, so a few thousand records reach every partition.
async fn produce_numbered(bootstrap: &str, topic: &str, count: usize) -> Vec<(u32, u64, String)> {
    let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
    let producer = Producer::new(
        client,
        ProducerConfig {
            batch_bytes: 16 << 10,
            ..ProducerConfig::default()
        },
    );
    let mut acks = Vec::new();
    for i in 0..count {
        let record = ProducerRecord::new(topic, None, format!("value-{i}"));
        acks.push(producer.send(record).await.unwrap());
    }
    let mut acked = Vec::new();
    for (i, ack) in acks.into_iter().enumerate() {
        let metadata = ack.await.unwrap();
        acked.push((
            metadata.partition,
            metadata.offset as u64,
            format!("value-{i}"),
        ));
    }
    acked
}

/// 100,000 keyed records into 8 partitions, half through the CLI and half through the client
/// crate; everything comes back with dense offsets, per-key order and the acknowledged offsets.
#[test]
fn hundred_thousand_keyed_records_through_cli_and_client_round_trip() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    node.cli(&["topic", "create", "orders", "--partitions", "8"], None);
    const PER_SOURCE: usize = 50_000;

    // CLI: "key:value" lines, offsets printed in input order.
    let input: String = (0..PER_SOURCE)
        .map(|i| format!("key-{}:cli-{i}\n", i % 100))
        .collect();
    let printed = node.cli(
        &[
            "produce",
            "orders",
            "--key-separator",
            ":",
            "--print-offsets",
        ],
        Some(input.as_bytes()),
    );
    let cli_acks: Vec<(u32, u64)> = printed
        .lines()
        .map(|line| {
            let (partition, offset) = line.split_once(' ').unwrap();
            (partition.parse().unwrap(), offset.parse().unwrap())
        })
        .collect();
    assert_eq!(cli_acks.len(), PER_SOURCE);

    let runtime = runtime();
    let (client_acks, consumed) = runtime.block_on(async {
        let client = node.client().await;
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut acks = Vec::new();
        for i in 0..PER_SOURCE {
            let key = Bytes::from(format!("key-{}", i % 100));
            let record = ProducerRecord::new("orders", Some(key), format!("client-{i}"));
            acks.push(producer.send(record).await.unwrap());
        }
        let mut client_acks = Vec::new();
        for ack in acks {
            let metadata = ack.await.unwrap();
            client_acks.push((metadata.partition, metadata.offset as u64));
        }
        let consumed = consume_all(client, "orders", 2 * PER_SOURCE).await;
        (client_acks, consumed)
    });
    assert_eq!(consumed.len(), 2 * PER_SOURCE);

    let by_position: HashMap<(u32, u64), &Consumed> = consumed
        .iter()
        .map(|c| ((c.partition, c.offset), c))
        .collect();
    assert_eq!(by_position.len(), consumed.len(), "no record twice");
    for (source, acks) in [("cli", &cli_acks), ("client", &client_acks)] {
        for (i, position) in acks.iter().enumerate() {
            let record = by_position[position];
            assert_eq!(
                record.value,
                format!("{source}-{i}"),
                "acked offset holds the record"
            );
            assert_eq!(
                record.key.as_deref(),
                Some(format!("key-{}", i % 100).as_str())
            );
        }
    }
    // Dense offsets per partition; all 8 partitions used; each key on one partition, in order.
    let mut per_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut per_key: HashMap<String, Vec<&Consumed>> = HashMap::new();
    let mut sorted = consumed.clone();
    sorted.sort();
    for record in &sorted {
        per_partition
            .entry(record.partition)
            .or_default()
            .push(record.offset);
        per_key
            .entry(record.key.clone().unwrap())
            .or_default()
            .push(record);
    }
    assert_eq!(per_partition.len(), 8);
    for offsets in per_partition.values() {
        assert!(
            offsets.iter().copied().eq(0..offsets.len() as u64),
            "dense offsets"
        );
    }
    for (key, records) in per_key {
        assert!(
            records.iter().all(|r| r.partition == records[0].partition),
            "{key} on one partition"
        );
        for source in ["cli-", "client-"] {
            let sequence: Vec<usize> = records
                .iter()
                .filter_map(|r| r.value.strip_prefix(source))
                .map(|n| n.parse().unwrap())
                .collect();
            assert!(
                sequence.windows(2).all(|w| w[0] < w[1]),
                "{key}: per-key order kept"
            );
        }
    }

    // The CLI consumer prints the same records as JSON.
    let lines = node.cli(
        &[
            "consume",
            "orders",
            "--partition",
            "3",
            "--from-beginning",
            "--max-messages",
            "5",
            "--format",
            "json",
        ],
        None,
    );
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first["partition"], 3);
    assert_eq!(first["offset"], 0);
    assert_eq!(first["value"], by_position[&(3, 0)].value.as_str());
    assert_eq!(lines.lines().count(), 5);
}

/// flush=always, kill -9, restart: every acknowledged record is readable at its offset.
#[test]
fn acknowledged_records_survive_kill_9_and_restart() {
    let temp = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(temp.path(), 2);
    node.cli(
        &[
            "topic",
            "create",
            "durable",
            "--partitions",
            "3",
            "--config",
            "flush=always",
        ],
        None,
    );
    let runtime = runtime();
    let acked = runtime.block_on(produce_numbered(&node.bootstrap(), "durable", 5_000));
    let partitions: std::collections::BTreeSet<u32> = acked.iter().map(|(p, _, _)| *p).collect();
    assert_eq!(partitions.len(), 3, "every partition took records");
    node.kill();
    node.restart();
    let consumed = runtime.block_on(async {
        let client = node.client().await;
        consume_all(client, "durable", acked.len()).await
    });
    let by_position: HashMap<(u32, u64), &Consumed> = consumed
        .iter()
        .map(|c| ((c.partition, c.offset), c))
        .collect();
    for (partition, offset, value) in &acked {
        assert_eq!(&by_position[&(*partition, *offset)].value, value);
    }
    // The topic survived too.
    assert_eq!(node.cli(&["topic", "list"], None).trim(), "durable");
}

/// Starts a poll of `consumer` (at the end of its partitions, so it waits), sends `record`
/// 300 ms later, and returns how long after the record's ack the poll returned, and what.
async fn poll_while_sending(
    mut consumer: Consumer,
    producer: &Producer,
    record: ProducerRecord,
) -> (Duration, Vec<strata_client::ConsumedBatch>) {
    let waiting = tokio::spawn(async move {
        let batches = consumer.poll().await.unwrap();
        (Instant::now(), batches)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    producer.send(record).await.unwrap().await.unwrap();
    let acked = Instant::now();
    let (seen, batches) = waiting.await.unwrap();
    (seen.saturating_duration_since(acked), batches)
}

/// A producer that sends each record at once (no linger): records awaited one by one land in
/// a batch each.
fn eager_producer(client: &Arc<Client>) -> Producer {
    Producer::new(
        client.clone(),
        ProducerConfig {
            linger: Duration::ZERO,
            ..ProducerConfig::default()
        },
    )
}

/// Sends `value` to `partition` of `topic` and waits for its ack.
async fn send_to(producer: &Producer, topic: &str, partition: u32, value: impl Into<Bytes>) {
    producer
        .send(ProducerRecord {
            partition: Some(partition),
            ..ProducerRecord::new(topic, None, value)
        })
        .await
        .unwrap()
        .await
        .unwrap();
}

/// A consumer long-polling an empty partition sees a new record within 50 ms of its ack.
#[test]
fn long_poll_returns_as_soon_as_data_arrives() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    node.cli(&["topic", "create", "poll", "--partitions", "1"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = eager_producer(&client);
        let mut best = Duration::MAX;
        for round in 0..5 {
            let mut consumer = Consumer::new(
                client.clone(),
                ConsumerConfig {
                    max_wait: Duration::from_secs(10),
                    ..ConsumerConfig::default()
                },
            );
            consumer.assign("poll", &[0], SeekTo::End).await.unwrap();
            let record = ProducerRecord::new("poll", None, format!("r{round}"));
            let (waited, batches) = poll_while_sending(consumer, &producer, record).await;
            assert_eq!(batches.len(), 1, "the long poll returned the new record");
            best = best.min(waited);
        }
        assert!(
            best < Duration::from_millis(50),
            "long poll took {best:?} (max wait 10 s)"
        );
    });
}

/// After `poll` returns, the consumer's next fetch is already on its way (it prefetches, as
/// Kafka's does, so the broker works while the caller processes), and a seek before the next
/// `poll` discards what that fetch brings.
#[test]
fn the_consumer_fetches_ahead_and_a_seek_discards_what_was_fetched_ahead() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 2);
    node.cli(&["topic", "create", "ahead", "--partitions", "1"], None);
    let fetches_served = || support::metric_total(admin, "strata_fetch_latency_seconds_count");
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = eager_producer(&client);
        // One batch per record, so each poll below (1 byte budget: one whole batch) takes one.
        for record in 0..3 {
            producer
                .send(ProducerRecord::new("ahead", None, format!("r{record}")))
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_bytes: 1,
                partition_max_bytes: 1,
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("ahead", &[0], SeekTo::Beginning)
            .await
            .unwrap();
        let first_offsets = |batches: Vec<strata_client::ConsumedBatch>| -> Vec<u64> {
            batches
                .iter()
                .flat_map(|batch| batch.records().map(|record| record.offset))
                .collect()
        };
        assert_eq!(first_offsets(consumer.poll().await.unwrap()), [0]);
        support::wait_for(
            "the fetch of offset 1 sent ahead, without another poll",
            || fetches_served() >= 2.0,
        );

        // The fetch sent ahead asked for offset 1; after the seek, poll starts over at 0.
        consumer.seek("ahead", 0, SeekTo::Offset(0)).await.unwrap();
        assert_eq!(first_offsets(consumer.poll().await.unwrap()), [0]);
        assert_eq!(first_offsets(consumer.poll().await.unwrap()), [1]);
        assert_eq!(first_offsets(consumer.poll().await.unwrap()), [2]);
    });
}

/// A consumer keeps two fetches on their way to a shard, each for its own half of the
/// partitions there, so the shard reads and sends one while the other's answer travels and is
/// checked; the halves together read every record once.
#[test]
fn the_consumer_keeps_two_fetches_on_their_way_to_a_shard() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "halves", "--partitions", "3"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = eager_producer(&client);
        // One batch per record, so each fetch below (1 byte budget: one whole batch) takes one.
        let mut sent = Vec::new();
        for record in 0..3 {
            for partition in 0..3 {
                send_to(&producer, "halves", partition, format!("r{record}")).await;
                sent.push((partition, record));
            }
        }
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_bytes: 1,
                partition_max_bytes: 1,
                max_wait: Duration::from_millis(100),
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("halves", &[], SeekTo::Beginning)
            .await
            .unwrap();
        let mut read: Vec<(u32, u64)> = Vec::new();
        while read.len() < sent.len() {
            for batch in consumer.poll().await.unwrap() {
                read.extend(
                    batch
                        .records()
                        .map(|record| (batch.partition, record.offset)),
                );
            }
            assert_eq!(consumer.fetches_on_the_way(), 2);
        }
        read.sort();
        sent.sort();
        assert_eq!(read, sent);
    });
}

/// A fetch answer is held to the request's `max_bytes` (Kafka's `fetch.max.bytes`): partitions
/// in request order, each whole while the total fits, the first with records always (so a
/// batch larger than the limit still makes progress); the rest answer without records and come
/// with the next fetch. Asked through the shared port of a two-shard node, so partitions of
/// both shards (forwarded and local) are held to one budget, and the bytes-out metric counts
/// only what was sent.
#[test]
fn a_fetch_answer_is_held_to_its_max_bytes() {
    use strata_wire::protocol::{FetchPartition, FetchRequest, FetchTopic, Request, Response};
    const PARTITIONS: u32 = 4;
    const BATCHES: u64 = 4;
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 2);
    node.cli(
        &[
            "topic",
            "create",
            "budget",
            "--partitions",
            &PARTITIONS.to_string(),
        ],
        None,
    );
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = eager_producer(&client);
        // A batch of one 10 KiB record each time: every partition holds ~41 KiB.
        for partition in 0..PARTITIONS {
            for _ in 0..BATCHES {
                send_to(&producer, "budget", partition, vec![b'x'; 10 << 10]).await;
            }
        }
        let address = node.bootstrap();
        let fetch = |offsets: &[u64], max_bytes: u32| {
            Request::Fetch(FetchRequest {
                max_wait_ms: 0,
                min_bytes: 1,
                max_bytes,
                topics: vec![FetchTopic {
                    name: "budget".into(),
                    partitions: (0..PARTITIONS)
                        .map(|partition| FetchPartition {
                            partition,
                            fetch_offset: offsets[partition as usize],
                            max_bytes: 1 << 20,
                        })
                        .collect(),
                }],
                read_committed: Default::default(),
            })
        };
        // Per partition: bytes of records answered, and the high watermark.
        let ask = |request| {
            let client = client.clone();
            let address = address.clone();
            async move {
                let Response::Fetch(response) = client.request(&address, request).await.unwrap()
                else {
                    panic!("not a fetch answer");
                };
                response.topics[0]
                    .partitions
                    .iter()
                    .map(|p| {
                        assert_eq!(p.error, strata_wire::protocol::ErrorCode::None);
                        (p.records.len(), p.high_watermark)
                    })
                    .collect::<Vec<_>>()
            }
        };

        // One byte: one whole batch of the first partition, nothing of the others.
        let answered = ask(fetch(&[0; 4], 1)).await;
        let one_batch = answered[0].0;
        assert!(one_batch > 10 << 10 && one_batch < 11 << 10, "{answered:?}");
        assert!(
            answered[1..].iter().all(|&(bytes, _)| bytes == 0),
            "{answered:?}"
        );
        assert!(
            answered.iter().all(|&(_, hw)| hw == BATCHES),
            "{answered:?}"
        );

        // 50 KiB: the first partition whole (~41 KiB); the second would pass the limit.
        let answered = ask(fetch(&[0; 4], 50 << 10)).await;
        assert!(answered[0].0 > 40 << 10, "{answered:?}");
        assert!(
            answered[1..].iter().all(|&(bytes, _)| bytes == 0),
            "{answered:?}"
        );

        // Fetching on from where each answer ended reads every partition, one per answer.
        let mut offsets = [0u64; 4];
        let mut sent = one_batch + answered[0].0;
        offsets[0] = BATCHES;
        for next in 1..PARTITIONS as usize {
            let answered = ask(fetch(&offsets, 50 << 10)).await;
            let with_records: Vec<usize> = (0..PARTITIONS as usize)
                .filter(|&p| answered[p].0 > 0)
                .collect();
            assert_eq!(with_records, [next], "{answered:?}");
            sent += answered[next].0;
            offsets[next] = BATCHES;
        }
        // The metric counts what was sent, not what was read and left out.
        support::wait_for("bytes out to match what was answered", || {
            support::metric_total(admin, "strata_bytes_out_total") == sent as f64
        });
    });
}

/// A consumer asks first for the partitions that brought records longest ago, so one
/// partition's backlog filling every answer (`max_bytes` of one byte: one batch an answer)
/// does not starve the partitions asked for after it.
#[test]
fn a_partitions_backlog_does_not_starve_the_others_of_its_fetch() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "fair", "--partitions", "4"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = eager_producer(&client);
        // Partition 0: 40 batches; the others one record each.
        for (partition, batches) in [(0, 40), (1, 1), (2, 1), (3, 1)] {
            for _ in 0..batches {
                send_to(&producer, "fair", partition, "r").await;
            }
        }
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_bytes: 1,
                max_wait: Duration::from_millis(100),
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("fair", &[], SeekTo::Beginning)
            .await
            .unwrap();
        let mut read = [0usize; 4];
        while read[1..].contains(&0) {
            for batch in consumer.poll().await.unwrap() {
                read[batch.partition as usize] += batch.records().count();
            }
            assert!(read[0] <= 4, "partition 0 took every answer: {read:?}");
        }
    });
}

/// A consumer of partitions on two shards gets the records of one as soon as they arrive,
/// while the other shard's fetch still waits at the end of its log (max wait 10 s).
#[test]
fn records_of_one_shard_are_not_held_back_by_another_shards_long_poll() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    node.cli(&["topic", "create", "split", "--partitions", "2"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let metadata = client.metadata_for("split").await.unwrap();
        let shards: Vec<_> = (0..2)
            .map(|partition| metadata.leader_address("split", partition, true).unwrap())
            .collect();
        assert_ne!(
            shards[0], shards[1],
            "the partitions live on different shards"
        );
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_wait: Duration::from_secs(10),
                ..ConsumerConfig::default()
            },
        );
        consumer.assign("split", &[], SeekTo::End).await.unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut record = ProducerRecord::new("split", None, "only partition 0");
        record.partition = Some(0);
        let (waited, batches) = poll_while_sending(consumer, &producer, record).await;
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].partition, 0);
        assert!(
            waited < Duration::from_secs(2),
            "the record waited {waited:?} for the other shard's long poll"
        );
    });
}

/// Consumers of data in the page cache are sent it straight from the segment files
/// (`sendfile`), in frames they read exactly as frames of bytes from memory: every record comes
/// back once, in order, whole.
#[test]
fn cached_segments_go_to_consumers_straight_from_the_page_cache() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 2);
    // The leader's appends through the page cache: with the default (`auto`) appends the writer
    // gathers past 384 KiB may go past it, and their readers to the tail cache or the disk.
    node.cli(
        &[
            "topic",
            "create",
            "bulk",
            "--partitions",
            "2",
            "--config",
            "direct.writes=replicated",
        ],
        None,
    );
    let sent_from_files = || support::metric_total(admin, "strata_fetch_sendfile_bytes_total");
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let producer = Producer::new(
            client.clone(),
            ProducerConfig {
                batch_bytes: 128 << 10,
                linger: Duration::from_millis(20),
                ..ProducerConfig::default()
            },
        );
        // 3,000 records of 2 KB over both partitions (6 MB): batches of 128 KiB.
        let mut acks = Vec::new();
        for index in 0..3000u32 {
            let mut value = format!("{index:08}").into_bytes();
            value.resize(2000, b'a' + (index % 26) as u8);
            let mut record = ProducerRecord::new("bulk", None, value);
            record.partition = Some(index % 2);
            acks.push(producer.send(record).await.unwrap());
        }
        for ack in acks {
            ack.await.unwrap();
        }
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                partition_max_bytes: 1 << 20,
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("bulk", &[], SeekTo::Beginning)
            .await
            .unwrap();
        let mut next = [0u64; 2];
        let mut seen = 0;
        while seen < 3000 {
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    let partition = batch.partition as usize;
                    assert_eq!(record.offset, next[partition], "in order, each once");
                    next[partition] += 1;
                    let index = 2 * record.offset as u32 + batch.partition;
                    let mut expected = format!("{index:08}").into_bytes();
                    expected.resize(2000, b'a' + (index % 26) as u8);
                    assert_eq!(record.value, &expected[..]);
                    seen += 1;
                }
            }
        }
    });
    let sent = sent_from_files();
    assert!(
        sent >= 3e6,
        "{sent} bytes of 6 MB in the page cache were sent from the files"
    );
}

/// With the default `direct.writes=auto`, a producer's 1 MB appends go past the page cache,
/// and the newest of them stay in memory within the shard's share of `--tail-cache-bytes`
/// (the node's 8 MiB over 2 shards): a consumer reads the oldest from the disk, past the page
/// cache, and the newest from that memory, every record whole and in order.
#[test]
fn large_appends_go_past_the_page_cache_and_the_newest_stay_in_the_shards_budget() {
    let temp = tempfile::tempdir().unwrap();
    let admin = support::free_base_port(0);
    let node = TestNode::start_with(
        temp.path(),
        2,
        &[
            "--admin",
            &format!("127.0.0.1:{admin}"),
            "--tail-cache-bytes",
            &(8u64 << 20).to_string(),
        ],
    );
    let metric = |name| support::metric_total(admin, name);
    // 8,000 records of 1 KiB generated at once: batches of about 1 MB (which the node's writer
    // may gather into appends of a few), one partition.
    node.cli(
        &[
            "bench",
            "produce",
            "--topic",
            "large",
            "--partitions",
            "1",
            "--records",
            "8000",
            "--record-size",
            "1024",
            "--linger-ms",
            "500",
        ],
        None,
    );
    let direct = metric("strata_direct_write_bytes_total");
    assert!(direct >= 7e6, "{direct} bytes written direct");
    let held = metric("strata_tail_cache_bytes");
    assert!(
        held > 0.0 && held <= f64::from(4u32 << 20),
        "{held} bytes held against a shard's 4 MiB"
    );
    runtime().block_on(async {
        let mut consumer = Consumer::new(
            node.client().await,
            ConsumerConfig {
                partition_max_bytes: 1 << 20,
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("large", &[], SeekTo::Beginning)
            .await
            .unwrap();
        let mut next = 0u64;
        while next < 8000 {
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    assert_eq!(record.offset, next, "in order, each once");
                    assert_eq!(record.value.len(), 1024);
                    next += 1;
                }
            }
        }
    });
    assert!(
        metric("strata_direct_reads_total") >= 1.0,
        "the oldest from the disk"
    );
    assert!(
        metric("strata_tail_cache_reads_total") >= 1.0,
        "the newest from memory"
    );
}

/// A consumer whose broker is gone backs off between failed fetches instead of retrying as
/// fast as it is polled.
#[test]
fn a_consumer_backs_off_while_its_broker_is_down() {
    let temp = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "gone", "--partitions", "1"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_wait: Duration::from_millis(50),
                retry_backoff: Duration::from_millis(100),
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("gone", &[0], SeekTo::Beginning)
            .await
            .unwrap();
        assert!(consumer.poll().await.unwrap().is_empty());
        node.kill();
        let started = Instant::now();
        let mut polls = 0;
        while started.elapsed() < Duration::from_secs(1) {
            assert!(consumer.poll().await.unwrap().is_empty());
            polls += 1;
        }
        // Each poll after a failure waits out the backoff: about ten a second, not thousands.
        assert!((3..=20).contains(&polls), "{polls} polls in a second");
    });
}

/// A consumer keeps reading its other partitions when an assigned topic is deleted (it has no
/// leader to fetch from any more), as Kafka's does.
#[test]
fn a_deleted_topic_does_not_stop_a_consumer_of_other_topics() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    node.cli(&["topic", "create", "stays", "--partitions", "2"], None);
    node.cli(&["topic", "create", "goes", "--partitions", "2"], None);
    let runtime = runtime();
    runtime.block_on(async {
        let client = node.client().await;
        let mut consumer = Consumer::new(
            client.clone(),
            ConsumerConfig {
                max_wait: Duration::from_millis(50),
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign("stays", &[], SeekTo::Beginning)
            .await
            .unwrap();
        consumer
            .assign("goes", &[], SeekTo::Beginning)
            .await
            .unwrap();
        assert!(consumer.poll().await.unwrap().is_empty());
        node.cli(&["topic", "delete", "goes"], None);
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        for partition in 0..2 {
            let mut record = ProducerRecord::new("stays", None, format!("after-{partition}"));
            record.partition = Some(partition);
            producer.send(record).await.unwrap().await.unwrap();
        }
        let mut values = Vec::new();
        let started = Instant::now();
        while values.len() < 2 && started.elapsed() < Duration::from_secs(10) {
            for batch in consumer.poll().await.unwrap() {
                values.extend(batch.records().map(|record| record.value.to_vec()));
            }
        }
        values.sort();
        assert_eq!(values, [b"after-0".to_vec(), b"after-1".to_vec()]);
    });
}

/// A `poll` dropped or failing after it took records (a caller's `select!` firing while it
/// refreshes metadata, an assigned topic deleted) loses none: the next `poll` returns them.
/// Topics `real`, holding one record (`value`), and `ghost` on `node`, and a consumer of
/// partition 0 of both; `ghost` is then deleted. One fetch asks for both; its answer holds the
/// record and, for the deleted topic, a retriable error, so the poll that takes the record then
/// refreshes metadata (an await, where a dropped poll stops).
async fn consumer_of_a_record_and_a_deleted_topic(
    node: &TestNode,
    (real, ghost): (&str, &str),
    value: &'static str,
) -> (Producer, Consumer) {
    node.cli(&["topic", "create", real, "--partitions", "1"], None);
    node.cli(&["topic", "create", ghost, "--partitions", "1"], None);
    let client = node.client().await;
    let producer = Producer::new(client.clone(), ProducerConfig::default());
    producer
        .send(ProducerRecord::new(real, None, value))
        .await
        .unwrap()
        .await
        .unwrap();
    let mut consumer = Consumer::new(
        client,
        ConsumerConfig {
            max_wait: Duration::from_millis(20),
            ..ConsumerConfig::default()
        },
    );
    for topic in [real, ghost] {
        consumer
            .assign(topic, &[0], SeekTo::Beginning)
            .await
            .unwrap();
    }
    node.cli(&["topic", "delete", ghost], None);
    (producer, consumer)
}

#[test]
fn records_taken_by_a_dropped_poll_come_with_the_next() {
    use futures_util::FutureExt;
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    runtime().block_on(async {
        let (_producer, mut consumer) =
            consumer_of_a_record_and_a_deleted_topic(&node, ("real", "ghost"), "kept").await;
        let mut values = Vec::new();
        for _ in 0..50 {
            // Polled once and dropped, as a select! would.
            // (Polls fail meanwhile: the assigned topic "ghost" is gone.)
            if let Some(Ok(batches)) = consumer.poll().now_or_never() {
                for batch in batches {
                    values.extend(batch.records().map(|record| record.value.to_vec()));
                }
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        for _ in 0..5 {
            for batch in consumer.poll().await.unwrap_or_default() {
                values.extend(batch.records().map(|record| record.value.to_vec()));
            }
        }
        assert_eq!(values, [b"kept".to_vec()]);
    });
}

/// SIGTERM: in-flight appends finish and are flushed, the process exits 0, and a restart finds
/// every acknowledged record with nothing to repair.
#[test]
fn sigterm_shuts_down_cleanly_and_loses_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(temp.path(), 2);
    node.cli(
        &[
            "topic",
            "create",
            "calm",
            "--partitions",
            "2",
            "--config",
            "flush=never",
        ],
        None,
    );
    let runtime = runtime();
    let acked = runtime
        .block_on(produce_numbered(&node.bootstrap(), "calm", 20_000))
        .len();
    node.stop();
    for partition in 0..2 {
        let dir = temp.path().join(format!("calm-{partition}"));
        let output = support::strata()
            .args(["log", "dump"])
            .arg(&dir)
            .output()
            .unwrap();
        let summary = String::from_utf8_lossy(&output.stdout);
        let first = summary.lines().next().unwrap();
        assert!(first.contains("truncated_bytes: 0"), "{first}");
        assert!(
            first.contains("rebuilt_index_entries: 0"),
            "clean close: {first}"
        );
    }
    node.restart();
    let consumed = runtime.block_on(async {
        let client = node.client().await;
        consume_all(client, "calm", acked).await
    });
    assert_eq!(consumed.len(), acked);
}

/// `produce` reads bytes, not text: a line that is not UTF-8 is a record like any other (it
/// used to stop the command before the records read so far were flushed), and comes back
/// base64-encoded from `consume --format json`. Usage errors exit 2.
#[test]
fn binary_lines_are_records_and_usage_errors_exit_2() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "bytes", "--partitions", "1"], None);
    let mut input = b"plain:text\n".to_vec();
    input.extend_from_slice(&[0xff, 0xfe, b':', 0x00, 0x80, b'\n']);
    input.extend_from_slice(b"last line without newline");
    let printed = node.cli(
        &[
            "produce",
            "bytes",
            "--key-separator",
            ":",
            "--print-offsets",
        ],
        Some(&input),
    );
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["0 0", "0 1", "0 2"]);
    let consumed = node.cli(
        &[
            "consume",
            "bytes",
            "--from-beginning",
            "--max-messages",
            "3",
            "--format",
            "json",
        ],
        None,
    );
    let records = support::json_lines(&consumed);
    assert_eq!(
        (records[0]["key"].as_str(), records[0]["value"].as_str()),
        (Some("plain"), Some("text"))
    );
    assert_eq!(records[1]["encoding"], "base64");
    assert_eq!(records[1]["key"], "//4="); // ff fe
    assert_eq!(records[1]["value"], "AIA="); // 00 80
    assert_eq!(records[2]["value"], "last line without newline");

    for usage in [
        &["produce", "bytes", "--acks", "2"][..],
        &[
            "bench",
            "produce",
            "--topic",
            "bytes",
            "--acks",
            "two",
            "--records",
            "1",
        ][..],
        &["consume", "bytes", "--from-beginning", "--offset", "3"][..],
        &["topic", "alter", "bytes"][..],
    ] {
        let output = node.cli_output(usage, None);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{usage:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The congestion control of each established connection on `port`, local (`sport`) or
/// remote (`dport`), as `ss` reports it.
fn congestion_controls(side: &str, port: u16) -> Vec<String> {
    let output = std::process::Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            &format!("( {side} = :{port} )"),
        ])
        .output()
        .expect("ss (iproute2) runs");
    // Each socket is a line of addresses, then an indented line of TCP info that starts
    // with the algorithm's name.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.starts_with(char::is_whitespace))
        .filter_map(|info| info.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Both ends of a client connection use the congestion control they are set to: cubic by
/// default, whatever the host's default is (BBR without the fq qdisc paces every burst with
/// a timer: half a consumer's throughput over loopback, measured), and what `--tcp-congestion` and
/// `ClientConfig::tcp_congestion` name otherwise.
#[test]
fn connections_use_the_tcp_congestion_control_they_are_set_to() {
    let host_default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_string();
    for (serve_args, client_setting, expected) in [
        (vec![], Some(strata_client::DEFAULT_TCP_CONGESTION), "cubic"),
        (vec!["--tcp-congestion", "reno"], Some("reno"), "reno"),
        (
            vec!["--tcp-congestion", "system"],
            None,
            host_default.as_str(),
        ),
    ] {
        let temp = tempfile::tempdir().unwrap();
        let node = TestNode::start_with(temp.path(), 1, &serve_args);
        runtime().block_on(async {
            let client = Client::connect(ClientConfig {
                tcp_congestion: client_setting.map(str::to_string),
                ..ClientConfig::new(node.bootstrap())
            })
            .await
            .unwrap();
            client.refresh_metadata().await.unwrap();
            let broker_ends = congestion_controls("sport", node.port);
            let client_ends = congestion_controls("dport", node.port);
            assert!(
                !broker_ends.is_empty() && broker_ends.iter().all(|name| name == expected),
                "broker ends {broker_ends:?}, want {expected} ({serve_args:?})"
            );
            assert!(
                !client_ends.is_empty() && client_ends.iter().all(|name| name == expected),
                "client ends {client_ends:?}, want {expected}"
            );
        });
    }
    // The CLI's client commands take the flag too: a consumer waiting for records stays
    // connected long enough to be looked at.
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "waiting", "--partitions", "1"], None);
    let mut consumer = support::strata()
        .args(["consume", "waiting", "--bootstrap", &node.bootstrap()])
        .args(["--tcp-congestion", "reno"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client_ends = Vec::new();
    while client_ends.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        client_ends = congestion_controls("dport", node.port);
        client_ends.extend(congestion_controls("dport", node.shard_port(0)));
    }
    let _ = consumer.kill();
    let _ = consumer.wait();
    assert!(
        !client_ends.is_empty() && client_ends.iter().all(|name| name == "reno"),
        "the CLI consumer's connections: {client_ends:?}"
    );
}

/// Values of `topic`'s records in these batches.
fn values_of(batches: &[strata_client::ConsumedBatch], topic: &str) -> Vec<Vec<u8>> {
    batches
        .iter()
        .filter(|batch| batch.topic == topic)
        .flat_map(|batch| batch.records().map(|record| record.value.to_vec()))
        .collect()
}

/// A poll that fails after it took one partition's batches (another partition's position is
/// out of range, with no `auto_offset_reset`) keeps them for the next poll: nothing is lost
/// and nothing comes twice. Which partition the answer lists first varies from consumer to
/// consumer, so several consumers run the case.
#[test]
fn a_failing_poll_keeps_what_it_took_for_the_next() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "real", "--partitions", "1"], None);
    node.cli(&["topic", "create", "far", "--partitions", "1"], None);
    runtime().block_on(async {
        let client = node.client().await;
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        for value in ["r0", "r1"] {
            producer
                .send(ProducerRecord::new("real", None, value))
                .await
                .unwrap();
        }
        producer.flush().await.unwrap();
        let mut failures = 0;
        for _ in 0..8 {
            let mut consumer = Consumer::new(
                client.clone(),
                ConsumerConfig {
                    max_wait: Duration::from_millis(20),
                    auto_offset_reset: None,
                    ..ConsumerConfig::default()
                },
            );
            consumer
                .assign("real", &[0], SeekTo::Beginning)
                .await
                .unwrap();
            consumer
                .assign("far", &[0], SeekTo::Offset(1_000))
                .await
                .unwrap();
            let mut values = Vec::new();
            let error = loop {
                match consumer.poll().await {
                    Ok(batches) => values.extend(values_of(&batches, "real")),
                    Err(error) => break error,
                }
            };
            assert_eq!(
                error.code(),
                Some(strata_client::ErrorCode::OffsetOutOfRange),
                "{error}"
            );
            failures += 1;
            consumer.seek("far", 0, SeekTo::Beginning).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while values.len() < 2 && Instant::now() < deadline {
                values.extend(values_of(&consumer.poll().await.unwrap(), "real"));
            }
            // A little longer: a duplicate would come now.
            for _ in 0..3 {
                values.extend(values_of(&consumer.poll().await.unwrap(), "real"));
            }
            assert_eq!(values, [b"r0".to_vec(), b"r1".to_vec()]);
        }
        assert_eq!(failures, 8);
    });
}

/// A seek drops what a dropped poll had taken for that partition: the records at the old
/// position never come after the seek.
#[test]
fn a_seek_drops_what_a_dropped_poll_took_for_that_partition() {
    use futures_util::FutureExt;
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    runtime().block_on(async {
        // Polls are started and dropped (as a select! would) until one has taken the record
        // and stopped at its metadata refresh: the position moved, nothing was returned. A
        // loaded machine may let a poll run to the end instead (the record returned): then
        // the case starts over with new topics.
        for attempt in 0..5 {
            let (real, ghost) = (format!("real{attempt}"), format!("ghost{attempt}"));
            let (producer, mut consumer) =
                consumer_of_a_record_and_a_deleted_topic(&node, (&real, &ghost), "old").await;
            let mut returned = false;
            for _ in 0..50 {
                if let Some(Ok(batches)) = consumer.poll().now_or_never() {
                    returned |= !values_of(&batches, &real).is_empty();
                }
                if returned || consumer.position(&real, 0) == Some(1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            if returned {
                continue;
            }
            assert_eq!(consumer.position(&real, 0), Some(1), "the record was taken");
            consumer.unassign(&ghost, 0);
            consumer.seek(&real, 0, SeekTo::End).await.unwrap();
            producer
                .send(ProducerRecord::new(real.as_str(), None, "new"))
                .await
                .unwrap()
                .await
                .unwrap();
            let mut values = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while values.is_empty() && Instant::now() < deadline {
                values.extend(values_of(&consumer.poll().await.unwrap(), &real));
            }
            assert_eq!(values, [b"new".to_vec()]);
            return;
        }
        panic!("no attempt left a taken record behind a dropped poll");
    });
}

/// Started with Debian's default soft limit of 1,024 open files (hard limit higher), a node
/// raises it, as the JVM does for Kafka: a topic of 200 partitions (8 files each) opens and
/// takes records on every partition.
#[test]
fn a_low_soft_open_file_limit_does_not_cap_partitions() {
    let mut hard = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) },
        0
    );
    assert!(
        hard.rlim_max >= 4096,
        "this test needs a hard open-file limit of at least 4096, not {}",
        hard.rlim_max
    );
    let dir = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(dir.path(), 2);
    node.kill();
    node.soft_open_files = Some(1024);
    node.respawn();
    node.cli(&["topic", "create", "many", "--partitions", "200"], None);
    runtime().block_on(async {
        let client = node.client().await;
        let producer = Producer::new(client, ProducerConfig::default());
        let mut acks = Vec::new();
        for partition in 0..200 {
            let mut record = ProducerRecord::new("many", None, format!("{partition}"));
            record.partition = Some(partition);
            acks.push(producer.send(record).await.unwrap());
        }
        for ack in acks {
            let ack = ack.await.expect("every partition takes records");
            assert_eq!(ack.offset, 0);
        }
    });
}

/// A partition whose folder cannot be made (a file is in its place) does not keep the topic's
/// other partitions from opening and leading; it answers STORAGE_ERROR, not NOT_LEADER, and
/// opens by itself once the obstacle is gone.
#[test]
fn a_replica_that_cannot_open_does_not_hold_back_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 1);
    let obstacle = dir.path().join("blocked-3");
    std::fs::write(&obstacle, b"not a partition folder").unwrap();
    node.cli(&["topic", "create", "blocked", "--partitions", "8"], None);
    runtime().block_on(async {
        let client = node.client().await;
        let producer = Producer::new(
            client,
            ProducerConfig {
                retries: 0,
                ..ProducerConfig::default()
            },
        );
        let send = |partition: u32| {
            let producer = producer.clone();
            async move {
                let mut record = ProducerRecord::new("blocked", None, format!("{partition}"));
                record.partition = Some(partition);
                producer.send(record).await.unwrap().await
            }
        };
        for partition in (0..8).filter(|p| *p != 3) {
            assert_eq!(send(partition).await.expect("the others lead").offset, 0);
        }
        let error = send(3).await.expect_err("partition 3 could not open");
        assert!(error.to_string().contains("StorageError"), "{error}");
        std::fs::remove_file(&obstacle).unwrap();
        let started = Instant::now();
        loop {
            match send(3).await {
                Ok(ack) => {
                    assert_eq!(ack.offset, 0);
                    break;
                }
                Err(error) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(15),
                        "partition 3 did not open: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
}
