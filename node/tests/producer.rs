//! The producer shares requests between partitions (and topics) bound for one leader shard:
//! every record's acknowledged (partition, offset) must still be exactly where it landed.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use support::{TestNode, runtime};

#[test]
fn shared_requests_acknowledge_every_record_where_it_landed() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    for topic in ["left", "right"] {
        node.cli(&["topic", "create", topic, "--partitions", "8"], None);
    }
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        // Tiny batches (1 ms linger) over 16 partitions: many wait for the same shard at once.
        let producer = Producer::new(
            client.clone(),
            ProducerConfig {
                linger: Duration::from_millis(1),
                batch_bytes: 512,
                ..ProducerConfig::default()
            },
        );
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
