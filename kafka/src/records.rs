//! Kafka record batches (magic 2) where they meet the log: a produce's batches as the log stores
//! them (as sent, recompressed only under a topic's own `compression.type`), and stored batches
//! as a Kafka consumer reads them (Kafka batches as stored; Strata batches, a native producer's
//! or a transaction's markers, translated into uncompressed Kafka batches with the same
//! offsets). The log checks a Kafka batch whole (`strata_wire::batch::check_produced_batch`);
//! Strata's own client reads Kafka batches itself, so nothing here translates the other way.

use bytes::{Bytes, BytesMut};
use strata_wire::batch::kafka::{self, KafkaCodec};
use strata_wire::batch::{BatchFormat, attributes};
use strata_wire::{Batch, BatchError};

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("the Kafka record batch does not decode: {0}")]
    Malformed(String),
    #[error("the produced records hold no batch")]
    Empty,
    #[error("control batches are written by brokers, not producers")]
    ControlBatch,
    #[error("a stored batch does not validate: {0}")]
    Stored(#[from] BatchError),
}

/// The record header a Kafka producer sets on the first record of a partition's records to
/// make them a conditional append (read by the log as it checks the records).
pub use strata_wire::batch::kafka::EXPECTED_OFFSET_HEADER;

fn malformed(what: &str) -> RecordsError {
    RecordsError::Malformed(what.to_string())
}

/// Stored batches (a fetch's answer, whole batches back to back) as a Kafka consumer reads
/// them: Kafka batches byte for byte, compression kept; Strata batches (a native producer's,
/// a transaction's markers) translated, each into one Kafka batch. When every batch is a Kafka
/// one, the answer is `stored` itself: no copy, no decode.
pub fn to_kafka(stored: Bytes) -> Result<Bytes, RecordsError> {
    let mut at = 0;
    let mut all_kafka = true;
    while at < stored.len() {
        let header = strata_wire::BatchHeader::parse(&stored[at..])?;
        all_kafka &= header.format == BatchFormat::Kafka;
        at += header.batch_len as usize;
    }
    if all_kafka {
        return Ok(stored);
    }
    let mut out = BytesMut::with_capacity(stored.len());
    let mut rest = stored;
    while !rest.is_empty() {
        let header = strata_wire::BatchHeader::parse(&rest)?;
        let batch = rest.split_to((header.batch_len as usize).min(rest.len()));
        match header.format {
            BatchFormat::Kafka => out.extend_from_slice(&batch),
            BatchFormat::Strata => encode_kafka_batch(&Batch::validate(batch)?, &mut out),
        }
    }
    Ok(out.freeze())
}

/// A partition's produced Kafka batches as the log stores them: as sent (the same buffer, no
/// copy), or, where the topic's `compression.type` names another codec (`codec`), recompressed
/// with it, as Kafka's broker does. Refuses what is not Kafka batches of magic 2; the log
/// checks each batch whole.
pub fn to_store(kafka: BytesMut, codec: Option<KafkaCodec>) -> Result<BytesMut, RecordsError> {
    if kafka.is_empty() {
        return Err(RecordsError::Empty);
    }
    let mut at = 0;
    let mut recompress = false;
    while at < kafka.len() {
        let rest = &kafka[at..];
        if rest.len() < kafka::HEADER_LEN {
            return Err(malformed("a batch is cut short"));
        }
        if !kafka::is_kafka(rest) {
            return Err(RecordsError::Malformed(format!(
                "message sets v{} are unsupported",
                rest[16] as i8
            )));
        }
        let header = strata_wire::BatchHeader::parse(rest).map_err(|error| match error {
            BatchError::ControlBatch => RecordsError::ControlBatch,
            error => RecordsError::Malformed(error.to_string()),
        })?;
        if header.batch_len as usize > rest.len() {
            return Err(malformed("a batch length past the records sent"));
        }
        recompress |= codec.is_some_and(|codec| Ok(codec) != header.kafka_codec());
        at += header.batch_len as usize;
    }
    let Some(codec) = codec.filter(|_| recompress) else {
        return Ok(kafka);
    };
    let mut out = BytesMut::with_capacity(kafka.len());
    let mut rest = kafka.freeze();
    while !rest.is_empty() {
        let header = strata_wire::BatchHeader::parse(&rest)?;
        let sent = rest.split_to(header.batch_len as usize);
        if header.kafka_codec() == Ok(codec) {
            out.extend_from_slice(&sent);
            continue;
        }
        let batch =
            Batch::validate(sent).map_err(|error| RecordsError::Malformed(error.to_string()))?;
        out.extend_from_slice(&kafka::rewritten(&header, codec, None, batch.records()));
    }
    Ok(out)
}

/// Writes one Strata batch as a Kafka record batch (magic 2, uncompressed), straight from the
/// batch's records: no per-record allocation. Byte for byte what `kafka-protocol`'s encoder
/// writes for the same records (a test holds it to that).
fn encode_kafka_batch(batch: &Batch, out: &mut BytesMut) {
    use bytes::BufMut;
    let header = batch.header();
    let (mut base_timestamp, mut max_timestamp) = (i64::MAX, i64::MIN);
    for record in batch.records() {
        base_timestamp = base_timestamp.min(record.timestamp_ms);
        max_timestamp = max_timestamp.max(record.timestamp_ms);
    }
    if batch.record_count() == 0 {
        // Compaction removed every record; the batch stays for its offsets and producer fields
        // (a Kafka client skips to its last offset + 1, as after Kafka's own cleaner).
        (base_timestamp, max_timestamp) = (header.first_timestamp_ms, header.max_timestamp_ms);
    }
    let start = out.len();
    let mut attributes = 0i16; // uncompressed, create time
    if header.attributes & attributes::TRANSACTIONAL != 0 {
        attributes |= 1 << 4;
    }
    if header.attributes & attributes::CONTROL != 0 {
        attributes |= 1 << 5;
    }
    out.put_i64(header.base_offset as i64);
    out.put_i32(0); // the batch length, filled in below
    out.put_i32(header.leader_epoch as i32);
    out.put_u8(kafka::MAGIC);
    out.put_u32(0); // the CRC, filled in below
    out.put_i16(attributes);
    // Kafka's lastOffsetDelta, kept by compaction as Kafka keeps it.
    out.put_i32(header.offset_count as i32 - 1);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(header.producer_id);
    out.put_i16(header.producer_epoch);
    // A marker's header keeps its coordinator epoch there; Kafka's control batches have none.
    out.put_i32(if header.is_control() {
        strata_wire::batch::NO_SEQUENCE
    } else {
        header.base_sequence
    });
    out.put_i32(batch.record_count() as i32);
    debug_assert_eq!(out.len() - start, kafka::HEADER_LEN);
    let mut lossy_key = String::new();
    for record in batch.records() {
        let timestamp_delta = record.timestamp_ms - base_timestamp;
        let offset_delta = (record.offset - header.base_offset) as i32;
        let key_len = record.key.map_or(-1, |key| key.len() as i32);
        let value = record.nullable_value();
        let value_len = value.map_or(-1, |value| value.len() as i32);
        let headers_len: usize = record
            .nullable_headers()
            .map(|(key, value)| {
                let key = header_key_bytes(key, &mut lossy_key).len();
                let value_len = value.map_or(-1, |value| value.len() as i64);
                varint_len(key as i64) + key + varint_len(value_len) + value.map_or(0, <[u8]>::len)
            })
            .sum();
        let body_len = 1
            + varint_len(timestamp_delta)
            + varint_len(offset_delta.into())
            + varint_len(key_len.into())
            + record.key.map_or(0, <[u8]>::len)
            + varint_len(value_len.into())
            + value.map_or(0, <[u8]>::len)
            + varint_len(record.headers().len() as i64)
            + headers_len;
        put_varint(out, body_len as i64);
        out.put_i8(0); // record attributes
        put_varint(out, timestamp_delta);
        put_varint(out, offset_delta.into());
        put_varint(out, key_len.into());
        if let Some(key) = record.key {
            out.put_slice(key);
        }
        put_varint(out, value_len.into());
        if let Some(value) = value {
            out.put_slice(value);
        }
        put_varint(out, record.headers().len() as i64);
        for (key, value) in record.nullable_headers() {
            let key = header_key_bytes(key, &mut lossy_key);
            put_varint(out, key.len() as i64);
            out.put_slice(key);
            put_varint(out, value.map_or(-1, |value| value.len() as i64));
            if let Some(value) = value {
                out.put_slice(value);
            }
        }
    }
    let batch_len = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&batch_len.to_be_bytes());
    let crc = strata_wire::crc32c(&out[start + kafka::CRC_START..]);
    out[start + kafka::AT_CRC..start + kafka::CRC_START].copy_from_slice(&crc.to_be_bytes());
}

/// A header key as the UTF-8 Kafka's clients read it; a native producer may have written any
/// bytes, which then go out with their invalid sequences replaced (into `lossy`, reused).
fn header_key_bytes<'a>(key: &'a [u8], lossy: &'a mut String) -> &'a [u8] {
    if std::str::from_utf8(key).is_ok() {
        return key;
    }
    *lossy = String::from_utf8_lossy(key).into_owned();
    lossy.as_bytes()
}

/// Kafka's zigzag varint (as protobuf's), for 32- and 64-bit values alike.
fn put_varint(out: &mut BytesMut, value: i64) {
    use bytes::BufMut;
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.put_u8((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.put_u8(zigzag as u8);
}

fn varint_len(value: i64) -> usize {
    let zigzag = ((value << 1) ^ (value >> 63)) as u64;
    (64 - zigzag.max(1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests;
