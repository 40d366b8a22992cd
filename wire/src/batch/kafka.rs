//! Kafka record batches (magic 2), stored as Kafka producers send them and served to Kafka
//! consumers byte for byte.
//!
//! Every field is big-endian. Byte layout (Kafka's `DefaultRecordBatch`):
//!
//! | at | size | field                  | notes                                               |
//! |----|------|------------------------|-----------------------------------------------------|
//! |  0 |  8   | base_offset            | stamped by the leader; not covered by the CRC       |
//! |  8 |  4   | batch_length           | bytes after this field: the batch is 12 + this long |
//! | 12 |  4   | partition_leader_epoch | stamped by the leader; not covered by the CRC       |
//! | 16 |  1   | magic                  | 2                                                   |
//! | 17 |  4   | crc                    | CRC32C of bytes `[21, end)`                         |
//! | 21 |  2   | attributes             | 0-2 codec (none, gzip, snappy, lz4, zstd), 3 log append time, 4 transactional, 5 control, 6 delete horizon |
//! | 23 |  4   | last_offset_delta      |                                                     |
//! | 27 |  8   | base_timestamp         | the delete horizon when bit 6 is set                |
//! | 35 |  8   | max_timestamp          |                                                     |
//! | 43 |  8   | producer_id            | -1 unless idempotent                                |
//! | 51 |  2   | producer_epoch         |                                                     |
//! | 53 |  4   | base_sequence          |                                                     |
//! | 57 |  4   | records_count          |                                                     |
//! | 61 |  ..  | records                | compressed as a whole when the codec is not none    |
//!
//! Each record: a varint length, then an attributes byte (unused), a varlong timestamp delta,
//! a varint offset delta, a key and a value (varint length, -1 for null, then the bytes), a
//! varint header count, and each header's key (never null) and value.
//!
//! **Telling the formats apart.** Byte 16 is the magic here; in a Strata batch it is the low
//! byte of `batch_len`, a multiple of 8, so never 2 ([`is_kafka`]). Every reader of stored
//! bytes decides per batch, so a partition may hold both formats, back to back; a Strata batch
//! after a Kafka one may start at any address, and is copied into aligned memory where its body
//! is read in place.
//!
//! [`parse`] reads a header into the same [`BatchHeader`] Strata batches give, with Strata's
//! attribute bits (the codec bits keep Kafka's numbering, read by [`BatchHeader::kafka_codec`]),
//! so the log, its indexes, replication and producer state read both formats alike.

use bytes::Bytes;

use super::BatchError;
use super::layout::{BATCH_LEN_MAX, BatchFormat, BatchHeader, OFFSET_MAX, attributes};

/// Kafka's record batch format version: the only one Kafka 4 reads and writes.
pub const MAGIC: u8 = 2;
/// Bytes before the records: base offset through records count.
pub const HEADER_LEN: usize = 61;
/// The most a compressed Kafka batch's records may inflate to: the broker decompresses a
/// produced batch to check it, and a small zstd or gzip batch can claim gigabytes.
pub const INFLATED_LEN_MAX: usize = 128 << 20;

pub(crate) const AT_BASE_OFFSET: usize = 0;
pub(crate) const AT_LENGTH: usize = 8;
/// Where `batch_length` starts counting.
const LENGTH_END: usize = 12;
pub(crate) const AT_LEADER_EPOCH: usize = 12;
pub(crate) const AT_MAGIC: usize = 16;
pub const AT_CRC: usize = 17;
/// The CRC covers everything from the attributes to the end of the batch.
pub const CRC_START: usize = 21;
pub(crate) const AT_ATTRIBUTES: usize = 21;
const AT_LAST_OFFSET_DELTA: usize = 23;
const AT_BASE_TIMESTAMP: usize = 27;
pub(crate) const AT_MAX_TIMESTAMP: usize = 35;
const AT_PRODUCER_ID: usize = 43;
const AT_PRODUCER_EPOCH: usize = 51;
const AT_BASE_SEQUENCE: usize = 53;
const AT_RECORDS_COUNT: usize = 57;

const _: () = assert!(AT_RECORDS_COUNT + 4 == HEADER_LEN);
const _: () = assert!(HEADER_LEN <= super::HEADER_LEN);

/// Kafka's attribute bits.
pub mod kafka_attributes {
    pub const CODEC_MASK: u16 = 0b111;
    /// The broker set the timestamp (`message.timestamp.type=LogAppendTime`): every record's
    /// timestamp is the batch's max timestamp.
    pub const LOG_APPEND_TIME: u16 = 1 << 3;
    pub const TRANSACTIONAL: u16 = 1 << 4;
    pub const CONTROL: u16 = 1 << 5;
    /// KIP-534: `base_timestamp` holds the delete horizon of the batch's tombstones.
    pub const DELETE_HORIZON: u16 = 1 << 6;
    pub const KNOWN: u16 = CODEC_MASK | LOG_APPEND_TIME | TRANSACTIONAL | CONTROL | DELETE_HORIZON;
}

/// A Kafka batch's compression codec (attribute bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaCodec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl KafkaCodec {
    pub fn from_bits(bits: u16) -> Result<KafkaCodec, BatchError> {
        Ok(match bits & kafka_attributes::CODEC_MASK {
            0 => KafkaCodec::None,
            1 => KafkaCodec::Gzip,
            2 => KafkaCodec::Snappy,
            3 => KafkaCodec::Lz4,
            4 => KafkaCodec::Zstd,
            other => return Err(BatchError::UnsupportedCodec(other as u8)),
        })
    }

    /// The name Kafka's `compression.type` uses for it.
    pub fn name(self) -> &'static str {
        match self {
            KafkaCodec::None => "none",
            KafkaCodec::Gzip => "gzip",
            KafkaCodec::Snappy => "snappy",
            KafkaCodec::Lz4 => "lz4",
            KafkaCodec::Zstd => "zstd",
        }
    }
}

/// Whether the batch at the start of `bytes` is a Kafka batch (see the module docs).
pub fn is_kafka(bytes: &[u8]) -> bool {
    bytes.get(AT_MAGIC) == Some(&MAGIC)
}

fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(raw)
}

/// Parses the Kafka header at the start of `bytes`; checks what decides how many bytes the
/// batch spans and which offsets it holds, not the CRC nor that `bytes` holds the whole batch.
pub(crate) fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    if bytes.len() < HEADER_LEN {
        return Err(BatchError::TooShort {
            needed: HEADER_LEN,
            available: bytes.len(),
        });
    }
    debug_assert!(is_kafka(bytes));
    let length = be_u32(bytes, AT_LENGTH) as usize;
    let batch_len = length.saturating_add(LENGTH_END);
    if !(HEADER_LEN..=BATCH_LEN_MAX).contains(&batch_len) {
        return Err(BatchError::BadLength {
            batch_len: batch_len.min(u32::MAX as usize) as u32,
            body_len: 0,
        });
    }
    let kafka_bits = be_u16(bytes, AT_ATTRIBUTES);
    if kafka_bits & !kafka_attributes::KNOWN != 0 {
        return Err(BatchError::ReservedBitsSet);
    }
    KafkaCodec::from_bits(kafka_bits)?;
    // Markers are written by Strata in its own format (and served to Kafka consumers as
    // Kafka's control batches): a stored Kafka control batch is not this build's.
    if kafka_bits & kafka_attributes::CONTROL != 0 {
        return Err(BatchError::ControlBatch);
    }
    let mut normalized =
        kafka_bits & (kafka_attributes::CODEC_MASK | attributes::KAFKA_LOG_APPEND_TIME);
    if kafka_bits & kafka_attributes::TRANSACTIONAL != 0 {
        normalized |= attributes::TRANSACTIONAL;
    }
    if kafka_bits & kafka_attributes::DELETE_HORIZON != 0 {
        normalized |= attributes::DELETE_HORIZON;
    }
    let base_offset = be_u64(bytes, AT_BASE_OFFSET);
    let last_offset_delta = be_u32(bytes, AT_LAST_OFFSET_DELTA) as i32;
    if last_offset_delta < 0 {
        return Err(BatchError::NoRecords);
    }
    let offset_count = last_offset_delta as u32 + 1;
    // Kafka has no attribute for it: a batch holding fewer records than the offsets it spans
    // is one a cleaner rewrote (a producer's is dense), and reads as Strata's compacted ones.
    if u32::try_from(records_count(bytes)).is_ok_and(|count| count < offset_count) {
        normalized |= attributes::COMPACTED;
    }
    if base_offset > OFFSET_MAX - u64::from(offset_count) {
        return Err(BatchError::OffsetOverflow(base_offset));
    }
    Ok(BatchHeader {
        format: BatchFormat::Kafka,
        base_offset,
        leader_epoch: be_u32(bytes, AT_LEADER_EPOCH),
        crc: be_u32(bytes, AT_CRC),
        batch_len: batch_len as u32,
        body_len: (batch_len - HEADER_LEN) as u32,
        version: MAGIC,
        attributes: normalized,
        offset_count,
        first_timestamp_ms: be_u64(bytes, AT_BASE_TIMESTAMP) as i64,
        max_timestamp_ms: be_u64(bytes, AT_MAX_TIMESTAMP) as i64,
        producer_id: be_u64(bytes, AT_PRODUCER_ID) as i64,
        base_sequence: be_u32(bytes, AT_BASE_SEQUENCE) as i32,
        producer_epoch: be_u16(bytes, AT_PRODUCER_EPOCH) as i16,
    })
}

/// The records count Kafka's header states (records compaction removed are not counted).
pub(crate) fn records_count(bytes: &[u8]) -> i32 {
    be_u32(bytes, AT_RECORDS_COUNT) as i32
}

/// The CRC Kafka's header should carry for `batch` (a whole batch).
pub(crate) fn crc_of(batch: &[u8]) -> u32 {
    crate::crc32c(&batch[CRC_START..])
}

/// Writes the fields the leader owns: base offset and leader epoch, outside the CRC.
pub(crate) fn stamp(batch: &mut [u8], base_offset: u64, leader_epoch: u32) {
    assert!(batch.len() >= HEADER_LEN, "stamp needs a whole header");
    batch[AT_BASE_OFFSET..AT_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
    batch[AT_LEADER_EPOCH..AT_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_be_bytes());
}

/// Sets a whole batch's max timestamp, and with `log_append_time` the timestamp type too, and
/// recomputes its CRC, as Kafka's broker does for `LogAppendTime` and for a producer's max
/// timestamp that disagrees with its records. Costs one pass over the batch, only when a field
/// changes.
pub(crate) fn set_max_timestamp(batch: &mut [u8], max_timestamp_ms: i64, log_append_time: bool) {
    assert!(batch.len() >= HEADER_LEN && is_kafka(batch));
    let mut bits = be_u16(batch, AT_ATTRIBUTES);
    if log_append_time {
        bits |= kafka_attributes::LOG_APPEND_TIME;
    }
    let unchanged = bits == be_u16(batch, AT_ATTRIBUTES)
        && be_u64(batch, AT_MAX_TIMESTAMP) as i64 == max_timestamp_ms;
    if unchanged {
        return;
    }
    batch[AT_ATTRIBUTES..AT_ATTRIBUTES + 2].copy_from_slice(&bits.to_be_bytes());
    batch[AT_MAX_TIMESTAMP..AT_MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp_ms.to_be_bytes());
    let crc = crc_of(batch);
    batch[AT_CRC..AT_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// What walking a Kafka batch's records found.
#[derive(Debug, Default)]
pub(crate) struct Walked {
    /// The largest record timestamp.
    pub max_timestamp_ms: i64,
    /// Records without a key, by index (a compacted topic refuses them).
    pub keyless: Vec<u32>,
    /// The first record's `strata.expected.offset` header (see [`EXPECTED_OFFSET_HEADER`]).
    pub expected_offset: Option<u64>,
}

/// The record header a Kafka producer sets on the first record of a partition's records to
/// make them a conditional append: its value is the offset (decimal ASCII) that record must
/// get, else nothing is written (the header stays on the record).
pub const EXPECTED_OFFSET_HEADER: &str = "strata.expected.offset";

/// Checks a produced Kafka batch whole, as Kafka's broker does: the CRC, then its records
/// (decompressed into memory of its own, at most [`INFLATED_LEN_MAX`]): their framing, dense
/// offset deltas matching the header's count, no bytes past the last. Returns the header and
/// what the walk found.
pub(crate) fn check_produced(
    bytes: &[u8],
    header: &BatchHeader,
    require_keys: bool,
) -> Result<Walked, BatchError> {
    let batch = &bytes[..header.batch_len as usize];
    let count = records_count(batch);
    if count <= 0 || count as u32 != header.offset_count {
        return Err(BatchError::InconsistentRecord {
            index: 0,
            what: "record count differs from the last offset delta",
        });
    }
    let inflated;
    let records = match header.kafka_codec()? {
        KafkaCodec::None => &batch[HEADER_LEN..],
        codec => {
            inflated = decompress(codec, &batch[HEADER_LEN..], INFLATED_LEN_MAX)?;
            &inflated[..]
        }
    };
    // Every record takes at least one byte: a count past that is a lie.
    if count as usize > records.len() {
        return Err(BatchError::InconsistentRecord {
            index: 0,
            what: "record count past the bytes sent",
        });
    }
    let mut walked = Walked {
        max_timestamp_ms: i64::MIN,
        ..Walked::default()
    };
    let mut rest = records;
    for index in 0..count as u32 {
        let record = next_record(&mut rest, header, index)?;
        if record.offset_delta != index {
            return Err(BatchError::InconsistentRecord {
                index,
                what: "offset deltas are not dense",
            });
        }
        if require_keys && record.key.is_none() {
            walked.keyless.push(index);
        }
        walked.max_timestamp_ms = walked.max_timestamp_ms.max(record.timestamp_ms);
        if index == 0 {
            walked.expected_offset = record
                .headers
                .clone()
                .find(|(key, _)| *key == EXPECTED_OFFSET_HEADER.as_bytes())
                .and_then(|(_, value)| std::str::from_utf8(value?).ok()?.parse().ok());
        }
    }
    if !rest.is_empty() {
        return Err(BatchError::InconsistentRecord {
            index: count as u32,
            what: "bytes past the last record",
        });
    }
    if !walked.keyless.is_empty() {
        return Err(BatchError::MissingKeys {
            indices: std::mem::take(&mut walked.keyless),
        });
    }
    Ok(walked)
}

/// One Kafka record, borrowed from its (decompressed) records.
#[derive(Debug, Clone)]
pub(crate) struct KafkaRecord<'a> {
    pub offset_delta: u32,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: KafkaHeaders<'a>,
}

/// A record's headers, read as they are iterated.
#[derive(Debug, Clone, Copy)]
pub struct KafkaHeaders<'a> {
    bytes: &'a [u8],
    left: u32,
}

impl<'a> Iterator for KafkaHeaders<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let mut fields = Fields { bytes: self.bytes };
        // Checked when the batch was: cannot fail (an error ends the iteration).
        let key = fields.nullable().ok()??;
        let value = fields.nullable().ok()?;
        self.bytes = fields.bytes;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for KafkaHeaders<'_> {}

/// Reads one record off the front of `rest`, checking its framing whole (its headers too).
pub(crate) fn next_record<'a>(
    rest: &mut &'a [u8],
    header: &BatchHeader,
    index: u32,
) -> Result<KafkaRecord<'a>, BatchError> {
    let malformed = |what| BatchError::InconsistentRecord { index, what };
    let mut fields = Fields { bytes: rest };
    let len = fields.varint().map_err(malformed)?;
    let len = usize::try_from(len).map_err(|_| malformed("a negative record length"))?;
    let body = fields.take(len).map_err(malformed)?;
    *rest = fields.bytes;
    let mut record = Fields { bytes: body };
    record.take(1).map_err(malformed)?; // record attributes: unused
    let timestamp_delta = record.varlong().map_err(malformed)?;
    let offset_delta = record.varint().map_err(malformed)?;
    let offset_delta = u32::try_from(offset_delta)
        .ok()
        .filter(|delta| *delta < header.offset_count)
        .ok_or_else(|| malformed("an offset delta outside the batch"))?;
    let key = record.nullable().map_err(malformed)?;
    let value = record.nullable().map_err(malformed)?;
    let count = record.varint().map_err(malformed)?;
    let count = u32::try_from(count).map_err(|_| malformed("a negative header count"))?;
    let headers_start = record.bytes;
    for _ in 0..count {
        record
            .nullable()
            .map_err(malformed)?
            .ok_or_else(|| malformed("a null header key"))?;
        record.nullable().map_err(malformed)?;
    }
    if !record.bytes.is_empty() {
        return Err(malformed("a record's length does not match its fields"));
    }
    // With a delete horizon (KIP-534) the base timestamp is the horizon and the deltas count
    // from it, as Kafka's cleaner writes them.
    let timestamp_ms = if header.attributes & attributes::KAFKA_LOG_APPEND_TIME != 0 {
        header.max_timestamp_ms
    } else {
        header.first_timestamp_ms.wrapping_add(timestamp_delta)
    };
    Ok(KafkaRecord {
        offset_delta,
        timestamp_ms,
        key,
        value,
        headers: KafkaHeaders {
            bytes: headers_start,
            left: count,
        },
    })
}

/// Reads big-endian fields and Kafka's zigzag varints off a slice; running out is malformed.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], &'static str> {
        if len > self.bytes.len() {
            return Err("a record runs past its batch");
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn varlong(&mut self) -> Result<i64, &'static str> {
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
        Err("a varint runs past ten bytes")
    }

    fn varint(&mut self) -> Result<i32, &'static str> {
        i32::try_from(self.varlong()?).map_err(|_| "a varint past 32 bits")
    }

    /// A length that may be -1 (null), then that many bytes.
    fn nullable(&mut self) -> Result<Option<&'a [u8]>, &'static str> {
        match self.varint()? {
            -1 => Ok(None),
            len if len >= 0 => Ok(Some(self.take(len as usize)?)),
            _ => Err("a negative length"),
        }
    }
}

/// Kafka's zigzag varint (as protobuf's), for 32- and 64-bit values alike.
pub(crate) fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// Inflates a Kafka batch's records, refusing a stream that would inflate past `limit` bytes
/// before it does.
pub fn decompress(codec: KafkaCodec, input: &[u8], limit: usize) -> Result<Bytes, BatchError> {
    use std::io::Read;
    let corrupt = |_: std::io::Error| BatchError::BadCompression("the records do not inflate");
    let mut inflated = Vec::new();
    let mut capped = |reader: &mut dyn Read| {
        reader
            .take((limit as u64).saturating_add(1))
            .read_to_end(&mut inflated)
            .map_err(corrupt)
    };
    match codec {
        KafkaCodec::None => return Ok(Bytes::copy_from_slice(input)),
        KafkaCodec::Gzip => capped(&mut flate2::read::GzDecoder::new(input))?,
        KafkaCodec::Zstd => match super::compression::zstd_one_shot(input, limit) {
            Some(inflated) => return inflated.map(Bytes::from),
            None => capped(&mut zstd::stream::read::Decoder::new(input).map_err(corrupt)?)?,
        },
        KafkaCodec::Lz4 => capped(&mut lz4_flex::frame::FrameDecoder::new(input))?,
        KafkaCodec::Snappy => {
            inflated = snappy_decompress(input, limit)?;
            0
        }
    };
    if inflated.len() > limit {
        return Err(BatchError::Inflates { limit });
    }
    Ok(Bytes::from(inflated))
}

/// Xerial's snappy framing (a 16-byte header, then blocks each prefixed with its big-endian
/// length), which Kafka's clients write, or one raw snappy block.
fn snappy_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
    const XERIAL_HEADER_LEN: usize = 16;
    let bad = |_| BatchError::BadCompression("a snappy block does not inflate");
    let mut out = Vec::new();
    let inflate_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let len = snap::raw::decompress_len(block).map_err(bad)?;
        if out.len().saturating_add(len) > limit {
            return Err(BatchError::Inflates { limit });
        }
        let start = out.len();
        out.resize(start + len, 0);
        let written = snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(bad)?;
        out.truncate(start + written);
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        inflate_block(input, &mut out)?;
        return Ok(out);
    }
    let mut rest = input.get(XERIAL_HEADER_LEN..).unwrap_or_default();
    while !rest.is_empty() {
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or(BatchError::BadCompression(
                "a snappy block length is cut short",
            ))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = after
            .get(..len)
            .ok_or(BatchError::BadCompression("a snappy block is cut short"))?;
        inflate_block(block, &mut out)?;
        rest = &after[len..];
    }
    Ok(out)
}

/// Compresses a Kafka batch's records with `codec`, as Kafka's clients write them.
pub fn compress(codec: KafkaCodec, records: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match codec {
        KafkaCodec::None => records.to_vec(),
        KafkaCodec::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(records).expect("writes to memory");
            encoder.finish().expect("writes to memory")
        }
        KafkaCodec::Snappy => {
            // Xerial's framing, as the Java client writes it: one block per 32 KiB.
            const BLOCK: usize = 32 << 10;
            let mut out = b"\x82SNAPPY\x00".to_vec();
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&1u32.to_be_bytes());
            let mut encoder = snap::raw::Encoder::new();
            for block in records.chunks(BLOCK) {
                let compressed = encoder.compress_vec(block).expect("snappy compresses");
                out.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
                out.extend_from_slice(&compressed);
            }
            out
        }
        KafkaCodec::Lz4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder.write_all(records).expect("writes to memory");
            encoder.finish().expect("writes to memory")
        }
        KafkaCodec::Zstd => zstd::bulk::compress(records, 3).expect("zstd compresses"),
    }
}

/// One record to write into a Kafka batch.
#[derive(Debug, Clone, Copy)]
pub struct RecordToWrite<'a> {
    pub offset_delta: u32,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// The fields of a Kafka batch's header that a writer chooses.
#[derive(Debug, Clone, Copy)]
pub struct KafkaBatchFields {
    pub base_offset: u64,
    pub leader_epoch: u32,
    pub codec: KafkaCodec,
    pub transactional: bool,
    /// Kafka's `lastOffsetDelta`: the batch spans `base_offset..=base_offset + this`.
    pub last_offset_delta: u32,
    pub base_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    /// KIP-534: `base_timestamp_ms` is the delete horizon.
    pub delete_horizon: bool,
}

/// Writes a Kafka record batch of `records` (with their headers from `headers_of`), compressed
/// with the fields' codec and its CRC computed: what Kafka's own clients and cleaner write.
pub fn write_batch<'a, H>(
    fields: &KafkaBatchFields,
    records: impl IntoIterator<Item = (RecordToWrite<'a>, H)>,
) -> Vec<u8>
where
    H: IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
{
    let mut body = Vec::new();
    let mut record_bytes = Vec::new();
    let mut count = 0i32;
    for (record, headers) in records {
        count += 1;
        record_bytes.clear();
        record_bytes.push(0); // attributes
        put_varint(
            &mut record_bytes,
            record.timestamp_ms.wrapping_sub(fields.base_timestamp_ms),
        );
        put_varint(&mut record_bytes, record.offset_delta.into());
        put_bytes(&mut record_bytes, record.key);
        put_bytes(&mut record_bytes, record.value);
        let mut headers_bytes = Vec::new();
        let mut header_count = 0i64;
        for (key, value) in headers {
            header_count += 1;
            put_bytes(&mut headers_bytes, Some(key));
            put_bytes(&mut headers_bytes, value);
        }
        put_varint(&mut record_bytes, header_count);
        record_bytes.extend_from_slice(&headers_bytes);
        put_varint(&mut body, record_bytes.len() as i64);
        body.extend_from_slice(&record_bytes);
    }
    // An empty batch is a bare header, uncompressed, as Kafka's cleaner writes one.
    let codec = if count == 0 {
        KafkaCodec::None
    } else {
        fields.codec
    };
    let records = compress(codec, &body);
    let mut out = Vec::with_capacity(HEADER_LEN + records.len());
    out.extend_from_slice(&fields.base_offset.to_be_bytes());
    out.extend_from_slice(&((HEADER_LEN - LENGTH_END + records.len()) as u32).to_be_bytes());
    out.extend_from_slice(&fields.leader_epoch.to_be_bytes());
    out.push(MAGIC);
    out.extend_from_slice(&[0; 4]); // the CRC, below
    let mut bits = codec as u16;
    if fields.transactional {
        bits |= kafka_attributes::TRANSACTIONAL;
    }
    if fields.delete_horizon {
        bits |= kafka_attributes::DELETE_HORIZON;
    }
    out.extend_from_slice(&bits.to_be_bytes());
    out.extend_from_slice(&fields.last_offset_delta.to_be_bytes());
    out.extend_from_slice(&fields.base_timestamp_ms.to_be_bytes());
    out.extend_from_slice(&fields.max_timestamp_ms.to_be_bytes());
    out.extend_from_slice(&fields.producer_id.to_be_bytes());
    out.extend_from_slice(&fields.producer_epoch.to_be_bytes());
    out.extend_from_slice(&fields.base_sequence.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&records);
    let crc = crc_of(&out);
    out[AT_CRC..AT_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(bytes) => {
            put_varint(out, bytes.len() as i64);
            out.extend_from_slice(bytes);
        }
    }
}

/// The Kafka batch that replaces `original` after a clean, as Kafka's cleaner writes it: the
/// same offsets (`lastOffsetDelta` kept), epoch, producer fields, transaction bit and codec, the
/// `kept` records at their original offsets and timestamps (none at all for a run of emptied
/// batches), its CRC computed. `delete_horizon_ms` sets when its tombstones may go (KIP-534:
/// the base timestamp becomes the horizon) where `original` has none yet.
pub fn compacted<'a>(
    original: &BatchHeader,
    delete_horizon_ms: Option<i64>,
    kept: impl IntoIterator<Item = super::Record<'a>>,
) -> Bytes {
    let codec = original.kafka_codec().unwrap_or(KafkaCodec::None);
    rewritten(original, codec, delete_horizon_ms, kept)
}

/// The Kafka batch that replaces `original` holding `records` (of `original`, at their own
/// offsets and timestamps) compressed with `codec`: `original`'s offsets, epoch, producer
/// fields and transaction bit kept, its CRC computed. What a clean ([`compacted`]) and a
/// topic's own `compression.type` (Kafka's recompression) write.
pub fn rewritten<'a>(
    original: &BatchHeader,
    codec: KafkaCodec,
    delete_horizon_ms: Option<i64>,
    records: impl IntoIterator<Item = super::Record<'a>>,
) -> Bytes {
    let horizon = original.delete_horizon_ms().or(delete_horizon_ms);
    let fields = KafkaBatchFields {
        base_offset: original.base_offset,
        leader_epoch: original.leader_epoch,
        codec,
        transactional: original.is_transactional(),
        last_offset_delta: original.offset_count - 1,
        base_timestamp_ms: horizon.unwrap_or(original.first_timestamp_ms),
        max_timestamp_ms: original.max_timestamp_ms,
        producer_id: original.producer_id,
        producer_epoch: original.producer_epoch,
        base_sequence: original.base_sequence,
        delete_horizon: horizon.is_some(),
    };
    let records = records.into_iter().map(|record| {
        debug_assert!((original.base_offset..=original.last_offset()).contains(&record.offset));
        (
            RecordToWrite {
                offset_delta: (record.offset - original.base_offset) as u32,
                timestamp_ms: record.timestamp_ms,
                key: record.key,
                value: record.nullable_value(),
            },
            record.nullable_headers(),
        )
    });
    Bytes::from(write_batch(&fields, records))
}
