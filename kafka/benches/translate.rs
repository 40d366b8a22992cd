//! What the leader's check of a Kafka producer's batch costs (it is stored as sent), beside
//! the check of a Strata batch (the native path's one pass over the bytes), and what
//! translating a stored Strata batch for a Kafka consumer costs (only where formats cross), on
//! the same records in the same run.
//!
//! `cargo bench -p strata-kafka --bench translate`
//!
//! 1 KiB records, 1,000 per batch (about 1 MB): a Kafka batch checked whole (CRC, records
//! decompressed and walked), uncompressed and with LZ4 and zstd; a stored Strata batch out as
//! a Kafka batch (validate, encode, CRC). MB = 10^6 bytes of record values and keys.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strata_kafka::records::to_kafka;
use strata_wire::{Batch, BatchBuilder};

const RECORDS: usize = 1_000;
const VALUE_BYTES: usize = 1_024;

fn kafka_batch(compression: Compression) -> Bytes {
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| {
            let value: Vec<u8> = (0..VALUE_BYTES)
                .map(|j| ((i * 7 + j) % 251) as u8)
                .collect();
            Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32 - 1,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(Bytes::from(format!("key-{}", i % 100))),
                value: Some(Bytes::from(value)),
                headers: IndexMap::new(),
            }
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("encodes");
    out.freeze()
}

/// Runs `work` for about a second; returns MB/s of record bytes.
fn rate(record_bytes: usize, mut work: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut rounds = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        work();
        rounds += 1;
    }
    (rounds as f64 * record_bytes as f64) / started.elapsed().as_secs_f64() / 1e6
}

fn main() {
    // The broker's allocator settings (`strata_node::memory`): batch-sized buffers come from
    // the heap and are reused, instead of a fresh mmap (and its page faults) per buffer.
    // SAFETY: mallopt only changes allocator parameters, both in their valid ranges.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
    let record_bytes = RECORDS * (VALUE_BYTES + "key-00".len());
    println!("# {RECORDS} records of {VALUE_BYTES} B per batch; MB/s of record bytes, one thread");
    let mut builder = BatchBuilder::default();
    for record in Batch::validate(kafka_batch(Compression::None))
        .expect("valid")
        .records()
    {
        builder.push_nullable(
            record.timestamp_ms,
            record.key,
            record.nullable_value(),
            record.nullable_headers(),
        );
    }
    let stored = builder.into_batch();
    let native = rate(record_bytes, || {
        let batch = Batch::validate(stored.clone()).expect("valid");
        assert_eq!(batch.record_count() as usize, RECORDS);
    });
    println!("native: validate a Strata batch (the leader's check)   {native:>8.0} MB/s");
    for compression in [Compression::None, Compression::Lz4, Compression::Zstd] {
        let kafka = kafka_batch(compression);
        let produced = rate(record_bytes, || {
            let checked = strata_wire::batch::check_produced_batch(&kafka, false).expect("valid");
            assert_eq!(checked.header.offset_count as usize, RECORDS);
        });
        println!(
            "produce: check a Kafka batch ({compression:?}, {} B)   {produced:>8.0} MB/s",
            kafka.len()
        );
    }
    let fetched = rate(record_bytes, || {
        let out = to_kafka(stored.clone()).expect("translates");
        assert!(!out.is_empty());
    });
    println!("fetch: Strata batch → Kafka batch                        {fetched:>8.0} MB/s");
}
