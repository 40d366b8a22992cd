//! Record batches: the unit a producer sends, the broker stores and a consumer fetches, byte for byte.
//!
//! A batch is a fixed 64-byte header ([`layout`]) followed by an rkyv archive ([`body`]) and zero
//! padding up to a multiple of [`BATCH_ALIGN`]. The leader stamps `base_offset` and `leader_epoch`
//! in place; everything else is covered by a CRC32C, so stamping never invalidates a batch.
//!
//! Invariants:
//! - [`Batch::validate`] is the only way to get a [`Batch`]; after it, iteration cannot fail and
//!   never copies: records borrow from the batch's `Bytes`.
//! - Decoding any byte string returns an error or a batch. It never panics and never reads out of
//!   bounds (the fuzz target in `wire/fuzz` and the mutation test hold this).
//! - A batch is only ever accessed at an address that is a multiple of [`BATCH_ALIGN`]; input at
//!   another address is copied once into aligned memory (our own IO paths never need that).

mod body;
mod builder;
mod compression;
pub mod kafka;
mod layout;

pub use body::{ArchivedBody, HeaderEntry, NULL_LEN, RecordEntry};
pub use builder::{BatchBuilder, marker, read_marker};
pub use layout::{
    BATCH_ALIGN, BATCH_LEN_MAX, BATCH_LEN_MIN, BatchFormat, BatchHeader, Codec, FORMAT_VERSION,
    HEADER_LEN, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, OFFSET_MAX, attributes, padded_len,
    stamp,
};

use bytes::Bytes;
use rkyv::util::AlignedVec;

/// Why bytes are not a valid batch. Every variant is a property of the input, never of the reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Fewer bytes than the header or the header's `batch_len` needs.
    #[error("batch truncated: need {needed} bytes, have {available}")]
    TooShort { needed: usize, available: usize },
    /// A format version this build does not know.
    #[error("unknown batch format version {0}")]
    UnknownVersion(u8),
    /// Reserved header bytes or unknown attribute bits are set.
    #[error("reserved header bits are set")]
    ReservedBitsSet,
    /// `batch_len` does not equal the padded header + body length, or exceeds the format limit.
    #[error("inconsistent lengths: batch_len {batch_len}, body_len {body_len}")]
    BadLength { batch_len: u32, body_len: u32 },
    /// The stamped base offset leaves no room for the batch's records.
    #[error("base offset {0} overflows the offset range")]
    OffsetOverflow(u64),
    /// A batch must span at least one offset.
    #[error("batch has no records")]
    NoRecords,
    /// Only the log cleaner writes compacted batches; a producer's batch holds every offset it
    /// spans.
    #[error("a compacted batch is written by the log cleaner, never produced")]
    Compacted,
    /// Only brokers write transaction markers (control batches).
    #[error("a control batch is written by the broker, never produced")]
    ControlBatch,
    /// A transactional batch names the producer whose transaction it belongs to.
    #[error("a transactional batch needs a producer id, epoch and sequence")]
    TransactionalWithoutProducer,
    /// A compacted topic keys every record: compaction keeps each key's last one. Every
    /// keyless record is named (a Kafka client fails those and not the rest, KIP-467).
    #[error("records {indices:?} have no key, and a compacted topic keeps records by key")]
    MissingKeys { indices: Vec<u32> },
    /// The checksum does not match: the bytes were damaged after the producer wrote them.
    #[error("CRC mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    CrcMismatch { expected: u32, actual: u32 },
    /// The body is compressed with a codec this build cannot read.
    #[error("unsupported compression codec {0}")]
    UnsupportedCodec(u8),
    /// A compressed body does not decompress to the archive its prefix declares.
    #[error("compressed body: {0}")]
    BadCompression(&'static str),
    /// A Kafka batch's records inflate past what the broker decompresses to check them.
    #[error("the records inflate past {limit} bytes")]
    Inflates { limit: usize },
    /// rkyv's structural check failed. Carries no detail: rkyv's messages quote memory
    /// addresses, which must not reach clients and would make errors unrepeatable.
    #[error("malformed body: the archive's structure check failed")]
    MalformedBody,
    /// The record array disagrees with the header (count, offsets, timestamps).
    #[error("record {index} is inconsistent with the header: {what}")]
    InconsistentRecord { index: u32, what: &'static str },
    /// A record points outside the payload or the header array.
    #[error("record {index} points outside the body")]
    OutOfBounds { index: u32 },
}

/// A validated batch. Cheap to clone (it shares its `Bytes`).
#[derive(Clone)]
pub struct Batch {
    bytes: Bytes,
    header: BatchHeader,
    /// A compressed batch's archive, decompressed once by `validate` (aligned for rkyv); its
    /// records borrow from here instead of from `bytes`. A Kafka batch's records (a slice of
    /// `bytes` when uncompressed).
    archive: Option<Bytes>,
    /// A Kafka batch's records count.
    kafka_count: u32,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("header", &self.header)
            .finish()
    }
}

impl Batch {
    /// Validates the batch at the start of `bytes` and keeps exactly `batch_len` bytes of it.
    ///
    /// Checks, in order: header fields, length, CRC32C, rkyv structure, and every record's ranges,
    /// offset deltas and timestamps against the header. Costs one pass over the bytes (the CRC)
    /// plus one over the record entries.
    ///
    /// A compressed batch is decompressed here, once, into memory of its own; iteration then
    /// borrows from that.
    pub fn validate(bytes: Bytes) -> Result<Batch, BatchError> {
        if kafka::is_kafka(&bytes) {
            return validate_kafka(bytes);
        }
        let bytes = aligned(bytes);
        let (header, archive) = check_keeping_archive(&bytes, false)?;
        let bytes = bytes.slice(..header.batch_len as usize);
        Ok(Batch {
            bytes,
            header,
            archive: archive.map(Bytes::from_owner),
            kafka_count: 0,
        })
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The stored bytes of the whole batch, padding included: what goes to disk and on the wire.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    pub fn base_offset(&self) -> u64 {
        self.header.base_offset
    }

    pub fn last_offset(&self) -> u64 {
        self.header.last_offset()
    }

    /// The records the batch holds: [`BatchHeader::offset_count`] unless compaction removed
    /// some.
    pub fn record_count(&self) -> u32 {
        match self.header.format {
            BatchFormat::Strata => self.body().records.len() as u32,
            BatchFormat::Kafka => self.kafka_count,
        }
    }

    /// Which format the batch is in.
    pub fn format(&self) -> BatchFormat {
        self.header.format
    }

    /// The codec a Strata batch's body is stored with (validated: never an unknown one).
    ///
    /// Panics for a Kafka batch, whose codec is [`BatchHeader::kafka_codec`].
    pub fn codec(&self) -> Codec {
        self.header
            .codec()
            .expect("validate refused unknown codecs")
    }

    /// The records, in offset order, borrowed from the batch.
    pub fn records(&self) -> Records<'_> {
        if self.header.format == BatchFormat::Kafka {
            return Records {
                inner: RecordsInner::Kafka {
                    rest: self.archive.as_deref().unwrap_or_default(),
                    header: &self.header,
                    left: self.kafka_count,
                },
            };
        }
        let body = self.body();
        Records {
            inner: RecordsInner::Strata {
                body,
                payload: body.payload.as_slice(),
                header: &self.header,
                next: 0,
            },
        }
    }

    /// A zero-copy `Bytes` for a key, value or header slice obtained from this batch's records.
    ///
    /// Panics if `part` does not point into this batch (a programmer error).
    pub fn slice_ref(&self, part: &[u8]) -> Bytes {
        if part.is_empty() {
            return Bytes::new();
        }
        match &self.archive {
            Some(archive) => archive.slice_ref(part),
            None => self.bytes.slice_ref(part),
        }
    }

    fn body(&self) -> &ArchivedBody {
        let archive = match &self.archive {
            Some(archive) => &archive[..],
            None => &self.bytes[HEADER_LEN..HEADER_LEN + self.header.body_len as usize],
        };
        // SAFETY: `validate` checked these exact bytes with bytecheck and they are immutable
        // (a `Bytes` never changes; `aligned`, or the decompressor's `AlignedVec`, gave them an
        // address rkyv can read in place).
        unsafe { rkyv::api::access_unchecked::<ArchivedBody>(archive) }
    }
}

/// Validates the batch at the start of `bytes` without taking ownership: the broker checks batches
/// in the request buffer it is about to stamp and write. Same checks as [`Batch::validate`].
///
/// If `bytes` does not start at a [`BATCH_ALIGN`] boundary, the body is copied once into aligned
/// scratch memory for the structural check (our own buffers are always aligned). A compressed
/// body is decompressed to be checked (as Kafka's broker does), so no consumer is ever handed a
/// batch it cannot read. A compacted batch is refused: only the log cleaner writes those.
pub fn check(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    check_produced_batch(bytes, false).map(|produced| produced.header)
}

/// [`check`] for a compacted topic's produce: every record must have a key.
pub fn check_keyed(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    check_produced_batch(bytes, true).map(|produced| produced.header)
}

/// What checking a produced batch found beyond its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// The header; a Kafka batch's `max_timestamp_ms` is its records' (Kafka's broker sets
    /// that in place when a producer's header disagrees: [`set_kafka_timestamps`]).
    pub header: BatchHeader,
    /// A Kafka batch's first record's [`kafka::EXPECTED_OFFSET_HEADER`], read as the records
    /// are checked: the conditional append Kafka producers ask for.
    pub expected_offset: Option<u64>,
}

/// [`check`] (with `require_keys`, [`check_keyed`]), for either format, with what the check of a
/// Kafka batch's records found. A Kafka batch gets the checks Kafka's broker makes: the CRC,
/// then every record's framing (decompressed once into memory of its own), dense offset
/// deltas, the records count. Either format: no compacted, control or transactional batch
/// without a producer (the cleaner and the broker write those, and the log needs the
/// producer).
pub fn check_produced_batch(bytes: &[u8], require_keys: bool) -> Result<Produced, BatchError> {
    let produced = if kafka::is_kafka(bytes) {
        let mut header = check_integrity(bytes)?;
        if header.delete_horizon_ms().is_some() || header.is_log_append_time() {
            // Only the broker sets these.
            return Err(BatchError::ReservedBitsSet);
        }
        let walked = kafka::check_produced(bytes, &header, require_keys)?;
        header.max_timestamp_ms = walked.max_timestamp_ms;
        Produced {
            header,
            expected_offset: walked.expected_offset,
        }
    } else {
        Produced {
            header: check_keeping_archive(bytes, require_keys)?.0,
            expected_offset: None,
        }
    };
    let header = &produced.header;
    if header.is_compacted() {
        return Err(BatchError::Compacted);
    }
    if header.is_control() {
        return Err(BatchError::ControlBatch);
    }
    if header.is_transactional() && !header.is_idempotent() {
        return Err(BatchError::TransactionalWithoutProducer);
    }
    Ok(produced)
}

/// Sets a Kafka batch's max timestamp, with `log_append_time` its timestamp type too, and
/// recomputes its CRC if either changes (Kafka's `LogAppendTime`, and a producer's max
/// timestamp that disagreed with its records). A whole batch, checked.
pub fn set_kafka_timestamps(batch: &mut [u8], max_timestamp_ms: i64, log_append_time: bool) {
    kafka::set_max_timestamp(batch, max_timestamp_ms, log_append_time);
}

/// The checks for a batch that a leader already checked whole (a follower's append): header
/// fields, lengths, a known codec and the CRC, so damage on the way is caught, but the body is
/// neither decompressed nor walked. Kafka's followers check the same (the CRC).
pub fn check_integrity(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(bytes)?;
    let batch_len = header.batch_len as usize;
    if bytes.len() < batch_len {
        return Err(BatchError::TooShort {
            needed: batch_len,
            available: bytes.len(),
        });
    }
    if header.format == BatchFormat::Kafka {
        let actual = kafka::crc_of(&bytes[..batch_len]);
        if actual != header.crc {
            return Err(BatchError::CrcMismatch {
                expected: header.crc,
                actual,
            });
        }
        return Ok(header);
    }
    let body_end = HEADER_LEN + header.body_len as usize;
    let actual = crate::crc32c(&bytes[layout::CRC_START..body_end]);
    if actual != header.crc {
        return Err(BatchError::CrcMismatch {
            expected: header.crc,
            actual,
        });
    }
    header.codec()?;
    Ok(header)
}

/// [`check`], returning a compressed batch's decompressed archive too.
fn check_keeping_archive(
    bytes: &[u8],
    require_keys: bool,
) -> Result<(BatchHeader, Option<AlignedVec<16>>), BatchError> {
    let header = check_integrity(bytes)?;
    let body_end = HEADER_LEN + header.body_len as usize;
    let check_body = |body: &[u8]| -> Result<(), BatchError> {
        let body = rkyv::api::low::access::<ArchivedBody, rkyv::rancor::Error>(body)
            .map_err(|_| BatchError::MalformedBody)?;
        check_records(&header, body, require_keys)
    };
    let codec = header.codec()?;
    if codec != Codec::None {
        let archive = compression::decompress(codec, &bytes[HEADER_LEN..body_end])?;
        check_body(&archive)?;
        return Ok((header, Some(archive)));
    }
    if (bytes.as_ptr() as usize).is_multiple_of(BATCH_ALIGN) {
        check_body(&bytes[HEADER_LEN..body_end])?;
    } else {
        let mut copy = AlignedVec::<16>::with_capacity(body_end - HEADER_LEN);
        copy.extend_from_slice(&bytes[HEADER_LEN..body_end]);
        check_body(&copy)?;
    }
    Ok((header, None))
}

/// [`Batch::validate`] for a Kafka batch: its CRC, then its records (decompressed once): their
/// framing, offset deltas increasing within the batch (dense unless a cleaner removed some),
/// and their count.
fn validate_kafka(bytes: Bytes) -> Result<Batch, BatchError> {
    let header = check_integrity(&bytes)?;
    let bytes = bytes.slice(..header.batch_len as usize);
    let records = match header.kafka_codec()? {
        kafka::KafkaCodec::None => bytes.slice(kafka::HEADER_LEN..),
        codec => kafka::decompress(codec, &bytes[kafka::HEADER_LEN..], kafka::INFLATED_LEN_MAX)?,
    };
    let count = u32::try_from(kafka::records_count(&bytes))
        .ok()
        .filter(|count| *count <= header.offset_count && *count as usize <= records.len())
        .ok_or(BatchError::InconsistentRecord {
            index: 0,
            what: "records count disagrees with the header",
        })?;
    let mut rest = &records[..];
    let mut next_delta = 0u32;
    for index in 0..count {
        let record = kafka::next_record(&mut rest, &header, index)?;
        if record.offset_delta < next_delta {
            return Err(BatchError::InconsistentRecord {
                index,
                what: "offset deltas go back",
            });
        }
        next_delta = record.offset_delta + 1;
    }
    if !rest.is_empty() {
        return Err(BatchError::InconsistentRecord {
            index: count,
            what: "bytes past the last record",
        });
    }
    Ok(Batch {
        bytes,
        header,
        archive: Some(records),
        kafka_count: count,
    })
}

/// Copies `bytes` into aligned memory if it does not start at a [`BATCH_ALIGN`] boundary.
fn aligned(bytes: Bytes) -> Bytes {
    if (bytes.as_ptr() as usize).is_multiple_of(BATCH_ALIGN) {
        return bytes;
    }
    let mut copy = AlignedVec::<16>::with_capacity(bytes.len());
    copy.extend_from_slice(&bytes);
    Bytes::from_owner(copy)
}

fn check_records(
    header: &BatchHeader,
    body: &ArchivedBody,
    require_keys: bool,
) -> Result<(), BatchError> {
    let records = body.records.as_slice();
    let headers = body.headers.as_slice();
    let payload_len = body.payload.len() as u64;
    let compacted = header.is_compacted();
    let count_agrees = if compacted {
        records.len() <= header.offset_count as usize
    } else {
        records.len() == header.offset_count as usize
    };
    if !count_agrees {
        return Err(BatchError::InconsistentRecord {
            index: 0,
            what: "record count differs from the header",
        });
    }
    let in_payload = |start: u32, len: u32| u64::from(start) + u64::from(len) <= payload_len;
    let mut keyless = Vec::new();
    let mut max_timestamp_ms = i64::MIN;
    let mut next_delta = 0u32;
    for (index, entry) in records.iter().enumerate() {
        let index = index as u32;
        let offset_delta = entry.offset_delta.to_native();
        // A producer's batch holds every offset it spans; a compacted one a subset, in order.
        let delta_fits = if compacted {
            offset_delta >= next_delta && offset_delta < header.offset_count
        } else {
            offset_delta == index
        };
        if !delta_fits {
            return Err(BatchError::InconsistentRecord {
                index,
                what: "offset deltas are not dense",
            });
        }
        next_delta = offset_delta + 1;
        let key_len = entry.key_len.to_native();
        if key_len != NULL_LEN && !in_payload(entry.key_start.to_native(), key_len) {
            return Err(BatchError::OutOfBounds { index });
        }
        if require_keys && key_len == NULL_LEN {
            keyless.push(index);
        }
        let value_len = entry.value_len.to_native();
        if value_len != NULL_LEN && !in_payload(entry.value_start.to_native(), value_len) {
            return Err(BatchError::OutOfBounds { index });
        }
        let headers_start = entry.headers_start.to_native() as usize;
        let headers_end = headers_start + entry.headers_count.to_native() as usize;
        let Some(own_headers) = headers.get(headers_start..headers_end) else {
            return Err(BatchError::OutOfBounds { index });
        };
        for record_header in own_headers {
            let value_len = record_header.value_len.to_native();
            if !in_payload(
                record_header.key_start.to_native(),
                record_header.key_len.to_native(),
            ) || (value_len != NULL_LEN
                && !in_payload(record_header.value_start.to_native(), value_len))
            {
                return Err(BatchError::OutOfBounds { index });
            }
        }
        let Some(timestamp_ms) = header
            .first_timestamp_ms
            .checked_add(entry.timestamp_delta_ms.to_native())
        else {
            return Err(BatchError::InconsistentRecord {
                index,
                what: "timestamp overflows",
            });
        };
        if !compacted && index == 0 && timestamp_ms != header.first_timestamp_ms {
            return Err(BatchError::InconsistentRecord {
                index,
                what: "first record's timestamp delta is not zero",
            });
        }
        max_timestamp_ms = max_timestamp_ms.max(timestamp_ms);
    }
    // A compacted batch keeps the max timestamp of the records its producer wrote, so the time
    // index and retention see the segment as before the clean.
    let max_agrees = if compacted {
        max_timestamp_ms <= header.max_timestamp_ms
    } else {
        max_timestamp_ms == header.max_timestamp_ms
    };
    if !max_agrees {
        return Err(BatchError::InconsistentRecord {
            index: 0,
            what: "max timestamp differs from the header",
        });
    }
    if !keyless.is_empty() {
        return Err(BatchError::MissingKeys { indices: keyless });
    }
    Ok(())
}

/// One record, borrowed from its batch.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    /// Empty for a null value too; [`Record::nullable_value`] tells them apart.
    pub value: &'a [u8],
    value_is_null: bool,
    headers: RecordHeaders<'a>,
}

use body::ArchivedHeaderEntry;

/// Where a record's headers are: entries into a Strata batch's payload, or a Kafka record's
/// header bytes.
#[derive(Debug, Clone, Copy)]
enum RecordHeaders<'a> {
    Strata {
        entries: &'a [ArchivedHeaderEntry],
        payload: &'a [u8],
    },
    Kafka(kafka::KafkaHeaders<'a>),
}

/// A record's headers as (key, value) byte slices, `None` for a null value.
pub struct Headers<'a> {
    inner: RecordHeaders<'a>,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            RecordHeaders::Strata { entries, payload } => {
                let (entry, rest) = entries.split_first()?;
                *entries = rest;
                let value_len = entry.value_len.to_native();
                Some((
                    slice(
                        payload,
                        entry.key_start.to_native(),
                        entry.key_len.to_native(),
                    ),
                    (value_len != NULL_LEN)
                        .then(|| slice(payload, entry.value_start.to_native(), value_len)),
                ))
            }
            RecordHeaders::Kafka(headers) => headers.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.inner {
            RecordHeaders::Strata { entries, .. } => (entries.len(), Some(entries.len())),
            RecordHeaders::Kafka(headers) => headers.size_hint(),
        }
    }
}

impl ExactSizeIterator for Headers<'_> {}

impl<'a> Record<'a> {
    /// The value, `None` for a null one (Kafka's tombstone).
    pub fn nullable_value(&self) -> Option<&'a [u8]> {
        (!self.value_is_null).then_some(self.value)
    }

    /// The record's headers as (key, value) byte slices; a null value reads as empty
    /// ([`Record::nullable_headers`] tells them apart).
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.nullable_headers()
            .map(|(key, value)| (key, value.unwrap_or_default()))
    }

    /// The record's headers as (key, value) byte slices, `None` for a null value.
    pub fn nullable_headers(&self) -> Headers<'a> {
        Headers {
            inner: self.headers,
        }
    }
}

/// Iterator over a validated batch's records.
pub struct Records<'a> {
    inner: RecordsInner<'a>,
}

enum RecordsInner<'a> {
    Strata {
        body: &'a ArchivedBody,
        payload: &'a [u8],
        header: &'a BatchHeader,
        next: usize,
    },
    Kafka {
        rest: &'a [u8],
        header: &'a BatchHeader,
        left: u32,
    },
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        match &mut self.inner {
            RecordsInner::Strata {
                body,
                payload,
                header,
                next,
            } => strata_record(body, payload, header, next),
            RecordsInner::Kafka { rest, header, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // Checked whole by `validate`: an error cannot happen, and would end the
                // iteration rather than panic.
                let record = kafka::next_record(rest, header, 0).ok()?;
                Some(Record {
                    offset: header.base_offset + u64::from(record.offset_delta),
                    timestamp_ms: record.timestamp_ms,
                    key: record.key,
                    value: record.value.unwrap_or_default(),
                    value_is_null: record.value.is_none(),
                    headers: RecordHeaders::Kafka(record.headers),
                })
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match &self.inner {
            RecordsInner::Strata { body, next, .. } => body.records.len() - next,
            RecordsInner::Kafka { left, .. } => *left as usize,
        };
        (left, Some(left))
    }
}

impl ExactSizeIterator for Records<'_> {}

fn strata_record<'a>(
    body: &'a ArchivedBody,
    payload: &'a [u8],
    header: &BatchHeader,
    next: &mut usize,
) -> Option<Record<'a>> {
    {
        let entry = body.records.as_slice().get(*next)?;
        *next += 1;
        let key_len = entry.key_len.to_native();
        let key =
            (key_len != NULL_LEN).then(|| slice(payload, entry.key_start.to_native(), key_len));
        let value_len = entry.value_len.to_native();
        let value_is_null = value_len == NULL_LEN;
        let headers_start = entry.headers_start.to_native() as usize;
        let headers_end = headers_start + entry.headers_count.to_native() as usize;
        Some(Record {
            offset: header.base_offset + u64::from(entry.offset_delta.to_native()),
            timestamp_ms: header.first_timestamp_ms + entry.timestamp_delta_ms.to_native(),
            key,
            value: if value_is_null {
                &[]
            } else {
                slice(payload, entry.value_start.to_native(), value_len)
            },
            value_is_null,
            headers: RecordHeaders::Strata {
                entries: &body.headers.as_slice()[headers_start..headers_end],
                payload,
            },
        })
    }
}

/// Ranges were checked by `validate`, so slicing cannot go out of bounds here.
fn slice(payload: &[u8], start: u32, len: u32) -> &[u8] {
    let start = start as usize;
    &payload[start..start + len as usize]
}

/// Splits a buffer of back-to-back batches (a produce request, a fetch response, a segment read)
/// into validated batches. Stops at the first invalid batch and reports it.
pub fn split_batches(bytes: Bytes) -> SplitBatches {
    SplitBatches { rest: bytes }
}

/// The timestamp of the first data record at or past `offset` in `bytes` (whole batches back to
/// back, as a fetch answers), stepping over control batches; `None` when there is none.
pub fn first_record_timestamp(bytes: Bytes, offset: u64) -> Result<Option<i64>, BatchError> {
    for batch in split_batches(bytes) {
        let batch = batch?;
        if batch.header().is_control() {
            continue;
        }
        if let Some(record) = batch.records().find(|record| record.offset >= offset) {
            return Ok(Some(record.timestamp_ms));
        }
    }
    Ok(None)
}

pub struct SplitBatches {
    rest: Bytes,
}

impl Iterator for SplitBatches {
    type Item = Result<Batch, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match Batch::validate(self.rest.clone()) {
            Ok(batch) => {
                let _ = self.rest.split_to(batch.header.batch_len as usize);
                Some(Ok(batch))
            }
            Err(error) => {
                self.rest.clear();
                Some(Err(error))
            }
        }
    }
}
