#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use strata_node::log::{DirectWrites, FlushPolicy, LogConfig};
use strata_wire::batch::kafka::{self, KafkaCodec};
use strata_wire::batch::{BatchBuilder, split_batches};

/// A record as the tests model it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// One batch of `count` records whose values name `tag` and their index. Every third batch
/// (`tag % 3 == 1`) is an (uncompressed) Kafka batch as a Kafka producer sends it: the log
/// holds both formats back to back, and a Strata batch after a Kafka one may start anywhere
/// in a segment.
pub fn batch_of(tag: u64, count: usize, value_len: usize, timestamp_ms: i64) -> BytesMut {
    if tag % 3 == 1 {
        return kafka_batch_of(tag, count, value_len, timestamp_ms, KafkaCodec::None);
    }
    let mut builder = BatchBuilder::with_capacity(count * (value_len + 64) + 256);
    for i in 0..count {
        let mut value = format!("{tag}:{i}:").into_bytes();
        value.resize(value_len.max(value.len()), b'x');
        let key = format!("k{}", i % 7);
        builder.push(timestamp_ms + i as i64, Some(key.as_bytes()), &value);
    }
    BytesMut::from(&builder.finish()[..])
}

/// [`batch_of`]'s records as one Kafka batch (magic 2) compressed with `codec`, as a Kafka
/// producer sends it.
pub fn kafka_batch_of(
    tag: u64,
    count: usize,
    value_len: usize,
    timestamp_ms: i64,
    codec: KafkaCodec,
) -> BytesMut {
    let records: Vec<(Vec<u8>, Vec<u8>, i64)> = (0..count)
        .map(|i| {
            let mut value = format!("{tag}:{i}:").into_bytes();
            value.resize(value_len.max(value.len()), b'x');
            (
                format!("k{}", i % 7).into_bytes(),
                value,
                timestamp_ms + i as i64,
            )
        })
        .collect();
    kafka_batch(
        records
            .iter()
            .map(|(key, value, timestamp)| (Some(&key[..]), Some(&value[..]), *timestamp)),
        codec,
    )
}

/// One Kafka batch (magic 2) of (key, value, timestamp) records compressed with `codec`, as a
/// Kafka producer sends it (base offset 0, leader epoch -1, no producer).
pub fn kafka_batch<'a>(
    records: impl ExactSizeIterator<Item = (Option<&'a [u8]>, Option<&'a [u8]>, i64)> + Clone,
    codec: KafkaCodec,
) -> BytesMut {
    let timestamps = records.clone().map(|(_, _, timestamp)| timestamp);
    let fields = kafka::KafkaBatchFields {
        base_offset: 0,
        leader_epoch: u32::MAX,
        codec,
        transactional: false,
        last_offset_delta: records.len() as u32 - 1,
        base_timestamp_ms: records
            .clone()
            .next()
            .map_or(0, |(_, _, timestamp)| timestamp),
        max_timestamp_ms: timestamps.max().unwrap_or(0),
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        delete_horizon: false,
    };
    let batch = kafka::write_batch(
        &fields,
        records.enumerate().map(|(i, (key, value, timestamp_ms))| {
            (
                kafka::RecordToWrite {
                    offset_delta: i as u32,
                    timestamp_ms,
                    key,
                    value,
                },
                std::iter::empty(),
            )
        }),
    );
    BytesMut::from(&batch[..])
}

/// Builds a batch from explicit records (offsets ignored: the log assigns them).
pub fn batch_from(records: &[Rec]) -> BytesMut {
    let mut builder = BatchBuilder::default();
    for record in records {
        builder.push(record.timestamp_ms, record.key.as_deref(), &record.value);
    }
    BytesMut::from(&builder.finish()[..])
}

/// Decodes every record in `bytes` (whole batches back to back).
pub fn records_in(bytes: Bytes) -> Vec<Rec> {
    let mut out = Vec::new();
    for batch in split_batches(bytes) {
        let batch = batch.expect("the log returns valid batches");
        for record in batch.records() {
            out.push(Rec {
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
                key: record.key.map(<[u8]>::to_vec),
                value: record.value.to_vec(),
            });
        }
    }
    out
}

pub fn small_config(segment_bytes: u64, flush: FlushPolicy) -> LogConfig {
    LogConfig {
        segment_bytes,
        segment_ms: None,
        index_interval_bytes: 256,
        retention_ms: None,
        retention_bytes: None,
        flush,
        preallocate: false,
        preallocate_step_bytes: strata_node::log::PREALLOCATE_STEP_BYTES,
        direct_writes: DirectWrites::Replicated,
        // Every direct-eligible append goes direct, however small, so tests exercise the path.
        direct_write_min_bytes: 0,
        ..LogConfig::default()
    }
}

/// Runs a future on a current-thread runtime with a LocalSet (what a shard provides).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&runtime, future)
}

/// Appends a marker as the leader does; returns its offset.
pub async fn append_marker<S: strata_node::io::Storage>(
    log: &mut strata_node::log::PartitionLog<S>,
    producer_id: i64,
    epoch: i16,
    commit: bool,
) -> Result<u64, strata_node::log::LogError> {
    append_marker_from(log, (producer_id, epoch), commit, 0).await
}

/// [`append_marker`] from a coordinator at `coordinator_epoch`.
pub async fn append_marker_from<S: strata_node::io::Storage>(
    log: &mut strata_node::log::PartitionLog<S>,
    (producer_id, epoch): (i64, i16),
    commit: bool,
    coordinator_epoch: i32,
) -> Result<u64, strata_node::log::LogError> {
    let marker = strata_wire::batch::marker(producer_id, epoch, commit, coordinator_epoch, 0);
    let request = (
        BytesMut::from(&marker[..]),
        1,
        strata_node::log::AppendSource::Markers,
    );
    let [result] = &log.append_group_from(vec![request], 0).await[..] else {
        unreachable!("one request, one result")
    };
    result.clone().map(|info| info.base_offset)
}
