//! What translating Kafka record batches costs, beside what validating a Strata batch (the
//! native path's one pass over the bytes) costs, on the same bytes in the same run.
//!
//! `cargo bench -p strata-kafka --bench translate`
//!
//! 1 KiB records, 1,000 per batch (about 1 MB): a Kafka producer's batch into a Strata batch
//! (decode, CRC check, rebuild), and a stored Strata batch out as a Kafka batch (validate,
//! encode, CRC), uncompressed and with LZ4 and zstd on the way in. MB = 10^6 bytes of record
//! values and keys.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strata_kafka::records::{to_strata, translate_to_kafka};
use strata_wire::Batch;

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
    let stored = to_strata(kafka_batch(Compression::None), usize::MAX, None).expect("translates");
    let mut stamped = stored.clone();
    strata_wire::batch::stamp(&mut stamped, 0, 0);
    let stored = stamped.freeze();
    let native = rate(record_bytes, || {
        let batch = Batch::validate(stored.clone()).expect("valid");
        assert_eq!(batch.record_count() as usize, RECORDS);
    });
    println!("native: validate a Strata batch (the leader's check)   {native:>8.0} MB/s");
    for compression in [Compression::None, Compression::Lz4, Compression::Zstd] {
        let kafka = kafka_batch(compression);
        let produced = rate(record_bytes, || {
            let batch = to_strata(kafka.clone(), usize::MAX, None).expect("translates");
            assert!(!batch.is_empty());
        });
        println!(
            "produce: Kafka batch ({compression:?}, {} B) → Strata batch {produced:>8.0} MB/s",
            kafka.len()
        );
    }
    let fetched = rate(record_bytes, || {
        let mut out = BytesMut::with_capacity(stored.len() + 4096);
        translate_to_kafka(stored.clone(), &mut out).expect("translates");
        assert!(!out.is_empty());
    });
    println!("fetch: Strata batch → Kafka batch                        {fetched:>8.0} MB/s");
}
