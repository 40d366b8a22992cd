//! Kafka records for tests, as Kafka producers send them.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// A record without a producer id at `offset` (the sequence is what Kafka's decoder gives such
/// a record: the batch's -1 plus its offset delta, with batches starting at offset 0).
pub fn record(offset: i64, key: Option<&'static [u8]>, value: &'static [u8]) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: offset as i32 - 1,
        timestamp: 1_700_000_000_000 + offset,
        key: key.map(Bytes::from_static),
        value: Some(Bytes::from_static(value)),
        headers: Default::default(),
    }
}

/// `records` as one Kafka record batch (magic 2).
pub fn batch(records: &[Record], compression: Compression) -> Bytes {
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
    out.freeze()
}
