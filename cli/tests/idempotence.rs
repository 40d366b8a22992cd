//! The idempotent producer against real brokers: retried batches are written once (through
//! restarts and a leader change), gaps and old epochs are refused, and lost acknowledgements
//! (a broker test hook) cost no duplicates.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use strata_coordinator::testing::EtcdServer;
use strata_wire::batch::BatchBuilder;
use strata_wire::protocol::{
    ErrorCode, LATEST_TIMESTAMP, ProducePartition, ProduceRequest, ProduceTopic, Records, Request,
    Response,
};
use support::{TestNode, etcd_nodes, leaders, runtime, wait_for_at_most};

/// An idempotent batch of `count` records starting at `sequence`.
fn batch(producer: (i64, i16), sequence: i32, count: usize) -> Bytes {
    let mut builder = BatchBuilder::with_capacity(4096);
    for i in 0..count {
        // Producer state expires a day after a producer's last batch: stamp them now.
        builder.push(
            strata_client::now_ms(),
            None,
            format!("seq-{}", sequence as usize + i).as_bytes(),
        );
    }
    builder.set_producer(producer.0, producer.1, sequence);
    builder.finish()
}

/// Sends `records` to the partition's leader with acks=all; the partition's error and base
/// offset.
async fn produce(client: &Client, topic: &str, partition: u32, records: Bytes) -> (ErrorCode, u64) {
    let metadata = client.refresh_metadata().await.unwrap();
    let address = metadata.leader_address(topic, partition, true).unwrap();
    let request = Request::Produce(ProduceRequest {
        acks: -1,
        timeout_ms: 10_000,
        topics: vec![ProduceTopic {
            name: topic.into(),
            partitions: vec![ProducePartition {
                partition,
                records: Records::Shared(records),
            }],
        }],
        expected_offsets: Default::default(),
        durability: Default::default(),
    });
    let Response::Produce(response) = client.request(&address, request).await.unwrap() else {
        panic!("not a produce response");
    };
    let answer = &response.topics[0].partitions[0];
    (answer.error, answer.base_offset)
}

async fn log_end(client: &Client, topic: &str, partition: u32) -> u64 {
    client
        .list_offset_retrying(topic, partition, LATEST_TIMESTAMP)
        .await
        .unwrap()
        .unwrap()
}

async fn connect(node: &TestNode) -> Arc<Client> {
    let mut config = ClientConfig::new(node.bootstrap());
    config.request_timeout = Duration::from_secs(10);
    Client::connect(config).await.unwrap()
}

#[test]
fn a_retried_batch_is_written_once_and_gaps_and_old_epochs_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let mut node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "pay", "--partitions", "1"], None);
    let (producer, bumped) = runtime().block_on(async {
        let client = connect(&node).await;
        let producer = client.init_producer_id(None).await.unwrap();
        assert_eq!(producer.1, 0);
        let other = client.init_producer_id(None).await.unwrap();
        assert_ne!(producer.0, other.0, "every producer gets its own id");

        let first = batch(producer, 0, 5);
        assert_eq!(
            produce(&client, "pay", 0, first.clone()).await,
            (ErrorCode::None, 0)
        );
        // The retry of a batch the broker has: its original offset, nothing written.
        assert_eq!(
            produce(&client, "pay", 0, first.clone()).await,
            (ErrorCode::None, 0)
        );
        assert_eq!(log_end(&client, "pay", 0).await, 5);
        // A gap: a batch before this one was lost.
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 10, 1)).await.0,
            ErrorCode::OutOfOrderSequence
        );
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 5, 5)).await,
            (ErrorCode::None, 5)
        );
        // The producer's next epoch fences the old one.
        let bumped = client.init_producer_id(Some(producer)).await.unwrap();
        assert_eq!(bumped, (producer.0, 1));
        assert_eq!(
            produce(&client, "pay", 0, batch(bumped, 0, 3)).await,
            (ErrorCode::None, 10)
        );
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 10, 1)).await.0,
            ErrorCode::InvalidProducerEpoch
        );
        // An idempotent batch travels alone.
        let mut two = BytesMut::from(&batch(bumped, 3, 1)[..]);
        two.extend_from_slice(&batch(bumped, 4, 1));
        assert_eq!(
            produce(&client, "pay", 0, two.freeze()).await.0,
            ErrorCode::InvalidProducerBatch
        );
        assert_eq!(log_end(&client, "pay", 0).await, 13);
        (producer, bumped)
    });
    let _ = producer;
    // Killed: the producer state is rebuilt from the log.
    node.kill();
    node.respawn();
    runtime().block_on(async {
        let client = connect(&node).await;
        assert_eq!(
            produce(&client, "pay", 0, batch(bumped, 0, 3)).await,
            (ErrorCode::None, 10)
        );
        assert_eq!(
            produce(&client, "pay", 0, batch(bumped, 3, 2)).await,
            (ErrorCode::None, 13)
        );
        assert_eq!(log_end(&client, "pay", 0).await, 15);
    });
    // Stopped cleanly: from the snapshot.
    node.stop();
    node.respawn();
    runtime().block_on(async {
        let client = connect(&node).await;
        assert_eq!(
            produce(&client, "pay", 0, batch(bumped, 3, 2)).await,
            (ErrorCode::None, 13)
        );
        assert_eq!(
            produce(&client, "pay", 0, batch(bumped, 7, 1)).await.0,
            ErrorCode::OutOfOrderSequence
        );
        assert_eq!(log_end(&client, "pay", 0).await, 15);
    });
}

/// Every value the topic holds, with how often.
async fn values_in(client: &Arc<Client>, topic: &str, partitions: u32) -> BTreeMap<String, u32> {
    let mut consumer = Consumer::new(client.clone(), ConsumerConfig::default());
    let mut end = 0;
    for partition in 0..partitions {
        consumer
            .seek(topic, partition, SeekTo::Beginning)
            .await
            .unwrap();
        end += log_end(client, topic, partition).await;
    }
    let mut counts = BTreeMap::new();
    let mut read = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while read < end {
        assert!(Instant::now() < deadline, "read {read} of {end}");
        for batch in consumer.poll().await.unwrap() {
            for record in batch.records() {
                *counts
                    .entry(String::from_utf8_lossy(record.value).into_owned())
                    .or_default() += 1;
                read += 1;
            }
        }
    }
    counts
}

/// Sends `records` values in several acks=all requests (one flush each), through a producer
/// whose retries outlast a broker restart.
async fn produce_in_rounds(client: &Arc<Client>, topic: &str, idempotent: bool, rounds: u64) {
    let producer = Producer::new(
        client.clone(),
        ProducerConfig {
            acks: -1,
            idempotent,
            retries: 60,
            retry_backoff: Duration::from_millis(100),
            ..ProducerConfig::default()
        },
    );
    for round in 0..rounds {
        let mut acks = Vec::new();
        for i in 0..50 {
            let value = format!("r{round}-{i}");
            acks.push(
                producer
                    .send(ProducerRecord::new(topic, None, value))
                    .await
                    .unwrap(),
            );
        }
        producer.flush().await.unwrap();
        for ack in acks {
            ack.await.unwrap();
        }
    }
}

#[test]
fn lost_acknowledgements_are_retried_without_duplicates_only_when_idempotent() {
    for idempotent in [true, false] {
        let data = tempfile::tempdir().unwrap();
        let mut node = TestNode::start_with_env(
            data.path(),
            1,
            &[],
            &[("STRATA_FAULT_PRODUCE_RESPONSE", "drop:3")],
        );
        node.cli(&["topic", "create", "t", "--partitions", "1"], None);
        let counts = runtime().block_on(async {
            let mut config = ClientConfig::new(node.bootstrap());
            // The dropped answer is noticed by the request timeout, then retried.
            config.request_timeout = Duration::from_secs(2);
            let client = Client::connect(config).await.unwrap();
            produce_in_rounds(&client, "t", idempotent, 6).await;
            values_in(&client, "t", 1).await
        });
        assert_eq!(counts.len(), 300, "every record is there");
        let duplicates = counts.values().filter(|n| **n > 1).count();
        eprintln!("idempotent={idempotent}: {duplicates} duplicated records");
        if idempotent {
            assert_eq!(duplicates, 0, "the retried batch was written twice");
        } else {
            // Without idempotence the retry writes the batch again: the hook works.
            assert!(
                duplicates > 0,
                "the fault hook did not lose an acknowledgement"
            );
        }
        node.kill();
    }
}

#[test]
fn a_retry_after_the_leader_restarted_is_still_not_a_duplicate() {
    let data = tempfile::tempdir().unwrap();
    // The broker aborts instead of answering the 3rd produce: written, never acknowledged.
    let mut node = TestNode::start_with_env(
        data.path(),
        1,
        &[],
        &[("STRATA_FAULT_PRODUCE_RESPONSE", "exit:3")],
    );
    node.cli(&["topic", "create", "t", "--partitions", "1"], None);
    let bootstrap = node.bootstrap();
    let producing = std::thread::spawn(move || {
        runtime().block_on(async {
            let mut config = ClientConfig::new(bootstrap);
            config.request_timeout = Duration::from_secs(2);
            let client = Client::connect(config).await.unwrap();
            produce_in_rounds(&client, "t", true, 5).await;
        })
    });
    wait_for_at_most("the broker to abort", Duration::from_secs(20), || {
        !node.process_alive()
    });
    node.reap();
    node.env.clear();
    node.respawn();
    producing
        .join()
        .expect("the producer finished after the restart");
    let counts = runtime().block_on(async {
        let client = connect(&node).await;
        values_in(&client, "t", 1).await
    });
    assert_eq!(counts.len(), 250);
    assert!(
        counts.values().all(|n| *n == 1),
        "a record was written twice: {:?}",
        counts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
}

#[test]
fn a_new_leader_recognises_a_retry_of_what_the_old_one_wrote() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = etcd_nodes(&etcd, &dirs, &[]);
    nodes[0].cli(
        &[
            "topic",
            "create",
            "pay",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
        None,
    );
    let leader = leaders(&nodes[0], "pay")[0];
    let producer = runtime().block_on(async {
        let client = connect(&nodes[0]).await;
        let producer = client.init_producer_id(None).await.unwrap();
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 0, 4)).await,
            (ErrorCode::None, 0)
        );
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 4, 4)).await,
            (ErrorCode::None, 4)
        );
        producer
    });
    // The leader dies; a follower (which appended the batches verbatim) takes over.
    nodes[(leader - 1) as usize].kill();
    let survivor = if leader == 1 { 1 } else { 0 };
    wait_for_at_most("a new leader", Duration::from_secs(20), || {
        let now = leaders(&nodes[survivor], "pay")[0];
        now != leader && now > 0
    });
    runtime().block_on(async {
        let client = connect(&nodes[survivor]).await;
        // The retry of the last batch is recognised by the new leader.
        let deadline = Instant::now() + Duration::from_secs(20);
        let answer = loop {
            let answer = produce(&client, "pay", 0, batch(producer, 4, 4)).await;
            if !answer.0.is_retriable() || Instant::now() > deadline {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(answer, (ErrorCode::None, 4));
        assert_eq!(
            produce(&client, "pay", 0, batch(producer, 8, 1)).await,
            (ErrorCode::None, 8)
        );
        assert_eq!(log_end(&client, "pay", 0).await, 9);
    });
}

#[test]
fn a_batch_that_fails_for_good_moves_the_producer_to_its_next_epoch_and_later_ones_land() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(
        &[
            "topic",
            "create",
            "strict",
            "--partitions",
            "1",
            "--config",
            "max.message.bytes=2048",
        ],
        None,
    );
    runtime().block_on(async {
        let client = connect(&node).await;
        let producer = Producer::new(
            client.clone(),
            ProducerConfig {
                idempotent: true,
                retries: 3,
                retry_backoff: Duration::from_millis(20),
                ..ProducerConfig::default()
            },
        );
        let send = |value: Vec<u8>| {
            let producer = producer.clone();
            async move {
                let ack = producer
                    .send(ProducerRecord::new("strict", None, value))
                    .await
                    .unwrap();
                producer.flush().await.unwrap();
                ack.await
            }
        };
        assert_eq!(send(b"first".to_vec()).await.unwrap().offset, 0);
        // Too large for the topic: refused for good, and its sequence range is a hole.
        let refused = send(vec![b'x'; 4096]).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(ErrorCode::MessageTooLarge),
            "{refused}"
        );
        // The next batch cannot continue that sequence; under the next epoch it lands.
        assert_eq!(send(b"second".to_vec()).await.unwrap().offset, 1);
        assert_eq!(send(b"third".to_vec()).await.unwrap().offset, 2);
        assert_eq!(log_end(&client, "strict", 0).await, 3);
    });
}
