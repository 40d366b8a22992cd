//! Kafka record batches (magic 2) to Strata batches and back.
//!
//! The two formats carry the same things (DESIGN §3 kept Strata's close to Kafka's): records
//! with a timestamp, an optional key, a value and headers; a producer id, epoch and base
//! sequence; a leader epoch; the transactional and control bits. A produced Kafka batch becomes
//! one Strata batch (its codec kept where Strata has it: LZ4 and zstd; snappy is stored as
//! LZ4 and gzip as zstd); a stored Strata batch goes out as one uncompressed Kafka batch with
//! the same offsets. Both directions copy the record bytes once: this is the edge where a
//! foreign format is translated, the native path stays zero-copy.

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::Decompressor;
use kafka_protocol::records::Compression;
use strata_wire::batch::kafka::{self, KafkaCodec};
use strata_wire::batch::{BatchFormat, Codec, attributes, split_batches};
use strata_wire::{Batch, BatchBuilder, BatchError};

/// Record batch format version Kafka calls magic 2, the only one Produce v3+ carries.
const MAGIC: i8 = 2;

/// What a record adds to a Strata batch beyond its key and value bytes (entry, alignment),
/// rounded up: only used to size the builder and to refuse oversized batches early.
const RECORD_OVERHEAD: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("the Kafka record batch does not decode: {0}")]
    Malformed(String),
    #[error("the produced records hold no batch")]
    Empty,
    #[error("control batches are written by brokers, not producers")]
    ControlBatch,
    #[error("record {index} has offset delta {found}: a produced batch's deltas run 0, 1, 2, …")]
    OffsetGap { index: usize, found: i64 },
    #[error("the batch inflates to {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    #[error("a stored batch does not validate: {0}")]
    Stored(#[from] BatchError),
}

/// Translates the records of one partition of a Kafka produce request into Strata batches,
/// back to back, as a native produce request carries them. Checks each Kafka batch's CRC;
/// refuses batches that would inflate past `limit` bytes, before they do. Records are read
/// straight into the Strata batch (no per-record structs; repeated header keys, which Kafka
/// allows, kept). Each batch gets `codec`, or, with `None`, the codec nearest its own (the
/// topic's `compression.type`: `None` is `producer`).
pub fn to_strata(
    kafka: Bytes,
    limit: usize,
    codec: Option<Codec>,
) -> Result<BytesMut, RecordsError> {
    to_strata_conditional(kafka, limit, codec).map(|(batches, _)| batches)
}

/// The record header a Kafka producer sets on the first record of a partition's records to
/// make them a conditional append: its value is the offset (decimal ASCII) that record must
/// get, else nothing is written (the header stays on the record).
pub const EXPECTED_OFFSET_HEADER: &str = "strata.expected.offset";

/// [`to_strata`], and the offset the first record's [`EXPECTED_OFFSET_HEADER`] names, if any
/// (read as the record is translated: no second pass over the batch).
pub fn to_strata_conditional(
    mut kafka: Bytes,
    limit: usize,
    codec: Option<Codec>,
) -> Result<(BytesMut, Option<u64>), RecordsError> {
    if kafka.is_empty() {
        return Err(RecordsError::Empty);
    }
    let mut expected = None;
    let mut batches = vec![strata_batch(&mut kafka, limit, codec, Some(&mut expected))?];
    while !kafka.is_empty() {
        batches.push(strata_batch(&mut kafka, limit, codec, None)?);
    }
    if let [batch] = &mut batches[..] {
        // The builder's buffer is the batch's only owner: taken back without a copy.
        let batch = std::mem::take(batch)
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        return Ok((batch, expected));
    }
    let mut out = BytesMut::with_capacity(batches.iter().map(Bytes::len).sum());
    for batch in &batches {
        out.extend_from_slice(batch);
    }
    Ok((out, expected))
}

/// Reads big-endian fields and Kafka's zigzag varints off a slice; running out is malformed.
struct Fields<'a> {
    bytes: &'a [u8],
}

fn malformed(what: &str) -> RecordsError {
    RecordsError::Malformed(what.to_string())
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], RecordsError> {
        if len > self.bytes.len() {
            return Err(malformed("a record runs past its batch"));
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn varlong(&mut self) -> Result<i64, RecordsError> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let [byte] = self.take(1)? else {
                unreachable!("took one byte")
            };
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(malformed("a varint runs past ten bytes"))
    }

    fn varint(&mut self) -> Result<i32, RecordsError> {
        i32::try_from(self.varlong()?).map_err(|_| malformed("a varint past 32 bits"))
    }

    /// A length that may be -1 (null).
    fn nullable(&mut self) -> Result<Option<&'a [u8]>, RecordsError> {
        match self.varint()? {
            -1 => Ok(None),
            len if len >= 0 => Ok(Some(self.take(len as usize)?)),
            _ => Err(malformed("a negative length")),
        }
    }
}

fn be_i16(bytes: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(bytes[at..at + 2].try_into().expect("two bytes"))
}

fn be_i32(bytes: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn be_i64(bytes: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// Takes one Kafka record batch (v2) off the front of `kafka` and builds its Strata batch.
/// `expected`: for the request's first batch, where the first record's
/// [`EXPECTED_OFFSET_HEADER`] goes (a conditional append), if it has one.
fn strata_batch(
    kafka: &mut Bytes,
    limit: usize,
    codec: Option<Codec>,
    mut expected: Option<&mut Option<u64>>,
) -> Result<Bytes, RecordsError> {
    const LENGTH_END: usize = 12;
    if kafka.len() < KAFKA_BATCH_HEADER_LEN {
        return Err(malformed("a batch is cut short"));
    }
    let batch_len = be_i32(kafka, 8);
    let end = usize::try_from(batch_len)
        .ok()
        .map(|len| len + LENGTH_END)
        .filter(|&end| (KAFKA_BATCH_HEADER_LEN..=kafka.len()).contains(&end))
        .ok_or_else(|| malformed("a batch length past the records sent"))?;
    let batch = kafka.split_to(end);
    let magic = batch[16] as i8;
    if magic != MAGIC {
        return Err(RecordsError::Malformed(format!(
            "message sets v{magic} are unsupported"
        )));
    }
    let stated_crc = u32::from_be_bytes(batch[KAFKA_AT_CRC..KAFKA_CRC_START].try_into().unwrap());
    let actual_crc = strata_wire::crc32c(&batch[KAFKA_CRC_START..]);
    if stated_crc != actual_crc {
        return Err(RecordsError::Malformed(format!(
            "Cyclic redundancy check failed ({stated_crc} != {actual_crc})"
        )));
    }
    let attributes = be_i16(&batch, 21);
    if attributes & (1 << 5) != 0 {
        return Err(RecordsError::ControlBatch);
    }
    let compression = match attributes & 0b111 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        other => return Err(RecordsError::Malformed(format!("compression {other}"))),
    };
    let base_timestamp = be_i64(&batch, 27);
    let (producer_id, producer_epoch, base_sequence) =
        (be_i64(&batch, 43), be_i16(&batch, 51), be_i32(&batch, 53));
    let record_count = match be_i32(&batch, 57) {
        0 => return Err(RecordsError::Empty),
        count if count < 0 => return Err(malformed("a negative record count")),
        count => count as usize,
    };
    let records = decompress_bounded(batch.slice(KAFKA_BATCH_HEADER_LEN..), compression, limit)?;
    // Every record takes at least one byte: a count past that is a lie, refused before the
    // builder sizes anything by it.
    if record_count > records.len() {
        return Err(malformed("a record count past the records sent"));
    }
    let bytes = records.len() + record_count * RECORD_OVERHEAD;
    if bytes > limit.min(strata_wire::batch::BATCH_LEN_MAX / 2) {
        return Err(RecordsError::TooLarge { bytes, limit });
    }
    let mut builder = BatchBuilder::with_capacity(bytes + strata_wire::batch::HEADER_LEN);
    builder.set_codec(codec.unwrap_or(match compression {
        Compression::None => Codec::None,
        Compression::Lz4 | Compression::Snappy => Codec::Lz4,
        Compression::Zstd | Compression::Gzip => Codec::Zstd,
    }));
    if producer_id >= 0 {
        builder.set_producer(producer_id, producer_epoch, base_sequence);
    }
    if attributes & (1 << 4) != 0 {
        // The log checks a transactional batch names its producer.
        builder.set_attributes(attributes::TRANSACTIONAL);
    }
    let mut fields = Fields { bytes: &records };
    let mut headers: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
    for index in 0..record_count {
        let len = usize::try_from(fields.varint()?).map_err(|_| malformed("a negative length"))?;
        let mut record = Fields {
            bytes: fields.take(len)?,
        };
        record.take(1)?; // record attributes: unused
        let timestamp = base_timestamp.wrapping_add(record.varlong()?);
        let delta = record.varint()?;
        if delta as usize != index {
            return Err(RecordsError::OffsetGap {
                index,
                found: delta.into(),
            });
        }
        let key = record.nullable()?;
        let value = record.nullable()?;
        let count = record.varint()?;
        headers.clear();
        for _ in 0..count.max(0) {
            let key = record
                .nullable()?
                .ok_or_else(|| malformed("a null header key"))?;
            headers.push((key, record.nullable()?));
        }
        if count < 0 || !record.bytes.is_empty() {
            return Err(malformed("a record's length does not match its fields"));
        }
        if index == 0
            && let Some(slot) = expected.take()
        {
            *slot = headers
                .iter()
                .find(|(key, _)| *key == EXPECTED_OFFSET_HEADER.as_bytes())
                .and_then(|(_, value)| std::str::from_utf8((*value)?).ok()?.parse().ok());
        }
        builder.push_nullable(timestamp, key, value, headers.iter().copied());
    }
    if !fields.bytes.is_empty() {
        return Err(malformed("bytes past the batch's last record"));
    }
    Ok(builder.into_batch())
}

/// Inflates a compressed batch's records, refusing at once a stream that would inflate past
/// `limit` bytes (a small gzip or zstd batch can expand to gigabytes: it must not reach the
/// broker's memory). Snappy states its block sizes up front; the streaming codecs are read
/// through a cap.
fn decompress_bounded(
    input: Bytes,
    compression: Compression,
    limit: usize,
) -> Result<Bytes, RecordsError> {
    use std::io::Read;
    let corrupt = |error: &dyn std::fmt::Display| {
        RecordsError::Malformed(format!("{compression:?} records do not inflate: {error}"))
    };
    let mut inflated = Vec::new();
    let capped = |reader: &mut dyn Read, inflated: &mut Vec<u8>| {
        reader
            .take((limit as u64).saturating_add(1))
            .read_to_end(inflated)
            .map_err(|error| corrupt(&error))
    };
    match compression {
        Compression::None => return Ok(input),
        Compression::Gzip => capped(&mut flate2::read::GzDecoder::new(&input[..]), &mut inflated)?,
        Compression::Zstd => capped(
            &mut zstd::stream::read::Decoder::new(&input[..]).map_err(|error| corrupt(&error))?,
            &mut inflated,
        )?,
        Compression::Lz4 => capped(
            &mut lz4::Decoder::new(&input[..]).map_err(|error| corrupt(&error))?,
            &mut inflated,
        )?,
        Compression::Snappy => {
            let stated = snappy_inflated_len(&input)?;
            if stated > limit {
                return Err(RecordsError::TooLarge {
                    bytes: stated,
                    limit,
                });
            }
            let mut compressed = input;
            return kafka_protocol::compression::Snappy::decompress(&mut compressed, |inflated| {
                Ok(std::mem::take(inflated))
            })
            .map_err(|error| corrupt(&error));
        }
    };
    if inflated.len() > limit {
        return Err(RecordsError::TooLarge {
            bytes: inflated.len(),
            limit,
        });
    }
    Ok(Bytes::from(inflated))
}

/// The size a Kafka snappy stream states it inflates to: xerial's framing (a 16-byte header,
/// then blocks each prefixed with its length) or one raw snappy block.
fn snappy_inflated_len(input: &[u8]) -> Result<usize, RecordsError> {
    let stated = |block: &[u8]| {
        snap::raw::decompress_len(block)
            .map_err(|error| RecordsError::Malformed(format!("a snappy block: {error}")))
    };
    const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
    const XERIAL_HEADER_LEN: usize = 16;
    if !input.starts_with(XERIAL_MAGIC) {
        return stated(input);
    }
    let mut rest = input.get(XERIAL_HEADER_LEN..).unwrap_or_default();
    let mut total = 0usize;
    while !rest.is_empty() {
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| malformed("a snappy block length is cut short"))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = after
            .get(..len)
            .ok_or_else(|| malformed("a snappy block is cut short"))?;
        total = total.saturating_add(stated(block)?);
        rest = &after[len..];
    }
    Ok(total)
}

/// Appends Strata batches (a fetch's answer, whole batches back to back) to `out` as Kafka
/// record batches, one per Strata batch, offsets, epochs and producer fields unchanged.
/// Every batch is translated, whatever its format: [`to_kafka`] serves Kafka ones as stored.
pub fn translate_to_kafka(stored: Bytes, out: &mut BytesMut) -> Result<(), RecordsError> {
    for batch in split_batches(stored) {
        encode_kafka_batch(&batch?, out);
    }
    Ok(())
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

/// A partition's produced Kafka batches as the log stores them: as sent, or, where the topic's
/// `compression.type` names another codec (`codec`), recompressed with it, as Kafka's broker
/// does. Refuses what is not Kafka batches of magic 2; the log checks each batch whole.
pub fn to_store(kafka: Bytes, codec: Option<KafkaCodec>) -> Result<BytesMut, RecordsError> {
    if kafka.is_empty() {
        return Err(RecordsError::Empty);
    }
    let mut at = 0;
    let mut recompress = false;
    while at < kafka.len() {
        let rest = &kafka[at..];
        if rest.len() < KAFKA_BATCH_HEADER_LEN {
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
        return Ok(BytesMut::from(&kafka[..]));
    };
    let mut out = BytesMut::with_capacity(kafka.len());
    let mut rest = kafka;
    while !rest.is_empty() {
        let header = strata_wire::BatchHeader::parse(&rest)?;
        let sent = rest.split_to(header.batch_len as usize);
        if header.kafka_codec() == Ok(codec) {
            out.extend_from_slice(&sent);
            continue;
        }
        let batch =
            Batch::validate(sent).map_err(|error| RecordsError::Malformed(error.to_string()))?;
        out.extend_from_slice(&kafka::write_batch(
            &kafka::KafkaBatchFields {
                base_offset: header.base_offset,
                leader_epoch: header.leader_epoch,
                codec,
                transactional: header.is_transactional(),
                last_offset_delta: header.offset_count - 1,
                base_timestamp_ms: header.first_timestamp_ms,
                max_timestamp_ms: header.max_timestamp_ms,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                base_sequence: header.base_sequence,
                delete_horizon: false,
            },
            batch.records().map(|record| {
                (
                    kafka::RecordToWrite {
                        offset_delta: (record.offset - header.base_offset) as u32,
                        timestamp_ms: record.timestamp_ms,
                        key: record.key,
                        value: record.nullable_value(),
                    },
                    record.nullable_headers(),
                )
            }),
        ));
    }
    Ok(out)
}

/// Bytes of a record batch v2 header before its records (base offset through record count).
const KAFKA_BATCH_HEADER_LEN: usize = 61;
/// Where the CRC-covered part starts (the attributes), and where the CRC itself sits.
const KAFKA_CRC_START: usize = 21;
const KAFKA_AT_CRC: usize = 17;

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
    out.put_i8(MAGIC);
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
    debug_assert_eq!(out.len() - start, KAFKA_BATCH_HEADER_LEN);
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
    let crc = strata_wire::crc32c(&out[start + KAFKA_CRC_START..]);
    out[start + KAFKA_AT_CRC..start + KAFKA_CRC_START].copy_from_slice(&crc.to_be_bytes());
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
