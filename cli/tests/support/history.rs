//! Recorded histories of sequence-numbered records and their checks, for fault tests: each
//! record's value is `<partition>-<sequence>`, sequences counting up per partition.

use std::collections::BTreeMap;

use strata_client::{Client, ClientConfig, ConsumedBatch, Consumer, SeekTo};

/// The value of record `sequence` sent to `partition`.
pub fn value(partition: u32, sequence: u64) -> String {
    format!("{partition}-{sequence:08}")
}

/// (topic, partition, offset, value) of every record in `batches`, as a consumer saw them.
pub fn seen(batches: &[ConsumedBatch]) -> impl Iterator<Item = (&str, u32, u64, String)> {
    batches.iter().flat_map(|batch| {
        batch.records().map(move |record| {
            let value = String::from_utf8(record.value.to_vec()).unwrap();
            (batch.topic.as_str(), batch.partition, record.offset, value)
        })
    })
}

/// Every record of `topic` (partitions `0..partitions`) up to each partition's end as
/// `ListOffsets(latest)` gives it, read through a fresh consumer: (offset, value) per partition.
pub async fn read_to_end(bootstrap: &str, topic: &str, partitions: u32) -> Vec<Vec<(u64, String)>> {
    let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
    let mut consumer = Consumer::new(client.clone(), Default::default());
    let all: Vec<u32> = (0..partitions).collect();
    consumer
        .assign(topic, &all, SeekTo::Beginning)
        .await
        .unwrap();
    let mut ends = Vec::new();
    for partition in 0..partitions {
        let end = client
            .list_offset_retrying(topic, partition, strata_wire::protocol::LATEST_TIMESTAMP)
            .await
            .unwrap()
            .unwrap();
        ends.push(end);
    }
    let mut logs = vec![Vec::new(); partitions as usize];
    while (0..partitions).any(|p| consumer.position(topic, p).unwrap() < ends[p as usize]) {
        for batch in consumer.poll().await.unwrap() {
            for record in batch.records() {
                logs[batch.partition as usize].push((
                    record.offset,
                    String::from_utf8(record.value.to_vec()).unwrap(),
                ));
            }
        }
    }
    logs
}

/// Checks one partition's final log against what clients saw, and returns how many records it
/// holds: every record belongs here, sequences strictly increase (nothing twice, nothing out
/// of order), every acknowledged `(sequence, offset)` is there, and every `(offset, value)` a
/// consumer saw is still there.
pub fn check_partition<'a>(
    topic: &str,
    partition: u32,
    log: &[(u64, String)],
    acked: impl Iterator<Item = (u64, u64)>,
    consumed: impl Iterator<Item = (u64, &'a String)>,
) -> usize {
    let mut last_sequence = None;
    for (offset, value) in log {
        let (p, sequence) = value.split_once('-').unwrap();
        assert_eq!(
            p,
            partition.to_string(),
            "{topic}: a record in the wrong partition"
        );
        let sequence: u64 = sequence.parse().unwrap();
        assert!(
            last_sequence.is_none_or(|last| sequence > last),
            "{topic}-{partition}: {value} at offset {offset} after sequence {last_sequence:?}"
        );
        last_sequence = Some(sequence);
    }
    let by_offset: BTreeMap<u64, &String> =
        log.iter().map(|(offset, value)| (*offset, value)).collect();
    // Where the log read ends tells a lost record (a hole, or a log that ends before it)
    // from a read that ended early.
    let extent = match (log.first(), log.last()) {
        (Some((first, _)), Some((last, _))) => {
            format!("{} records read, offsets {first}..={last}", log.len())
        }
        _ => "nothing read".to_string(),
    };
    for (sequence, offset) in acked {
        let expected = value(partition, sequence);
        assert_eq!(
            by_offset.get(&offset).map(|v| v.as_str()),
            Some(expected.as_str()),
            "{topic}: acknowledged record {expected} at offset {offset} is missing ({extent})"
        );
    }
    for (offset, seen) in consumed {
        assert_eq!(
            by_offset.get(&offset).copied(),
            Some(seen),
            "{topic}-{partition}: consumed {seen} at offset {offset}, which later vanished"
        );
    }
    log.len()
}
