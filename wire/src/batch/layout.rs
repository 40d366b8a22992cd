//! The fixed batch header: byte positions, constants, and a parsed copy.
//!
//! Every field is little-endian. Byte layout (see `docs/format.md` for the full story):
//!
//! | at | size | field                 | notes                                                        |
//! |----|------|-----------------------|--------------------------------------------------------------|
//! |  0 |  8   | base_offset           | stamped by the leader; not covered by the CRC                 |
//! |  8 |  4   | leader_epoch          | stamped by the leader; not covered by the CRC                 |
//! | 12 |  4   | crc32c                | CRC32C of bytes `[16, 64 + body_len)`                         |
//! | 16 |  4   | batch_len             | whole batch incl. header and zero padding; multiple of 8      |
//! | 20 |  4   | body_len              | exact length of the rkyv archive (its root sits at the end)   |
//! | 24 |  1   | version               | [`FORMAT_VERSION`]                                            |
//! | 25 |  1   | reserved              | zero                                                          |
//! | 26 |  2   | attributes            | 0-2 codec, 4 transactional, 5 control, 6 compacted, 7 horizon, 8 commit |
//! | 28 |  4   | offset_count          | offsets spanned: last offset - base offset + 1                |
//! | 32 |  8   | first_timestamp_ms    | timestamp of the first record written; records store deltas   |
//! | 40 |  8   | max_timestamp_ms      | largest record timestamp written (time index, retention)      |
//! | 48 |  8   | producer_id           | -1 when not idempotent                                        |
//! | 56 |  4   | base_sequence         | -1 when not idempotent                                        |
//! | 60 |  2   | producer_epoch        | -1 when not idempotent                                        |
//! | 62 |  2   | reserved              | zero                                                          |
//! | 64 |  ..  | body                  | rkyv archive of [`super::body::ArchivedBody`]                 |
//!
//! A batch as a producer writes it holds `offset_count` records with the dense offset deltas
//! `0..offset_count`, the first at delta 0 of `first_timestamp_ms`. Only the log cleaner writes a
//! *compacted* batch (attribute bit 6): the records compaction kept, at their original deltas
//! (strictly increasing, below `offset_count`), none at all when every one went; the header keeps
//! the original batch's offsets, timestamps and producer fields, so offsets, the time index and
//! idempotent producers' sequences read as before the clean. Once it kept a tombstone (a null
//! value) in a batch, the cleaner sets bit 7 and `first_timestamp_ms` becomes the time from which
//! that batch's tombstones may go (the record deltas then count from it).

use super::BatchError;

/// Length of the fixed header that precedes every body.
pub const HEADER_LEN: usize = 64;
/// The fewest bytes a batch of either format can take (a Kafka header with no records): a
/// reader that holds fewer has no whole batch.
pub const BATCH_LEN_MIN: usize = super::kafka::HEADER_LEN;
/// Every batch starts (in memory and in a segment file) at a multiple of this, so the rkyv body,
/// whose widest field is an `i64`, can be accessed in place.
pub const BATCH_ALIGN: usize = 8;
/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u8 = 1;
/// The largest batch this format can describe; brokers and clients configure far smaller limits.
pub const BATCH_LEN_MAX: usize = 1 << 30;

/// Offsets are below this (Kafka's offsets are non-negative `i64`s).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_PRODUCER_EPOCH: i16 = -1;
pub const NO_SEQUENCE: i32 = -1;

pub(crate) const AT_BASE_OFFSET: usize = 0;
pub(crate) const AT_LEADER_EPOCH: usize = 8;
pub(crate) const AT_CRC: usize = 12;
pub(crate) const AT_BATCH_LEN: usize = 16;
pub(crate) const AT_BODY_LEN: usize = 20;
pub(crate) const AT_VERSION: usize = 24;
pub(crate) const AT_RESERVED_A: usize = 25;
pub(crate) const AT_ATTRIBUTES: usize = 26;
pub(crate) const AT_OFFSET_COUNT: usize = 28;
pub(crate) const AT_FIRST_TIMESTAMP: usize = 32;
pub(crate) const AT_MAX_TIMESTAMP: usize = 40;
pub(crate) const AT_PRODUCER_ID: usize = 48;
pub(crate) const AT_BASE_SEQUENCE: usize = 56;
pub(crate) const AT_PRODUCER_EPOCH: usize = 60;
pub(crate) const AT_RESERVED_B: usize = 62;
/// The CRC covers everything from here to the end of the body: all but the stamped fields and itself.
pub(crate) const CRC_START: usize = 16;

const _: () = assert!(AT_RESERVED_B + 2 == HEADER_LEN);
const _: () = assert!(HEADER_LEN.is_multiple_of(BATCH_ALIGN));
const _: () =
    assert!(BATCH_LEN_MAX.is_multiple_of(BATCH_ALIGN) && BATCH_LEN_MAX <= u32::MAX as usize);

/// Compression codec of the body (attribute bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    #[default]
    None = 0,
    Lz4 = 1,
    Zstd = 2,
}

impl Codec {
    /// The name Kafka's `compression.type` uses for it.
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    pub fn from_name(name: &str) -> Option<Codec> {
        match name {
            "none" => Some(Codec::None),
            "lz4" => Some(Codec::Lz4),
            "zstd" => Some(Codec::Zstd),
            _ => None,
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Attribute bits.
pub mod attributes {
    pub const CODEC_MASK: u16 = 0b111;
    pub const TRANSACTIONAL: u16 = 1 << 4;
    pub const CONTROL: u16 = 1 << 5;
    /// Written by the log cleaner: the records left may be fewer than the offsets spanned.
    pub const COMPACTED: u16 = 1 << 6;
    /// On a compacted batch only: `first_timestamp_ms` holds the time from which the cleaner
    /// may remove the batch's tombstones (Kafka's delete horizon, KIP-534), and the records'
    /// timestamp deltas are relative to it.
    pub const DELETE_HORIZON: u16 = 1 << 7;
    /// On a control batch only: the transaction marker commits (clear: it aborts). Kafka keeps
    /// the marker's type in its control record's key; a copy in the header lets followers and
    /// recovery, which read headers only, track transactions without reading bodies.
    pub const COMMIT: u16 = 1 << 8;
    /// On a Kafka batch only: Kafka's `LogAppendTime` timestamp type (its attribute bit 3);
    /// never valid on a Strata batch.
    pub const KAFKA_LOG_APPEND_TIME: u16 = 1 << 3;
    /// Bits this version knows; any other bit set is an error, so a newer writer cannot be misread.
    pub const KNOWN: u16 =
        CODEC_MASK | TRANSACTIONAL | CONTROL | COMPACTED | DELETE_HORIZON | COMMIT;
}

/// Rounds `len` up to the next multiple of [`BATCH_ALIGN`].
pub const fn padded_len(len: usize) -> usize {
    (len + BATCH_ALIGN - 1) & !(BATCH_ALIGN - 1)
}

/// Which format a stored batch is in: Strata's own, or Kafka's record batch v2 as a Kafka
/// producer sent it ([`super::kafka`]). Told apart by byte 16 ([`super::kafka::is_kafka`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchFormat {
    #[default]
    Strata,
    Kafka,
}

/// A parsed copy of a batch header, of either format. Parsing checks the fields that decide how
/// many bytes the batch spans, so a caller can skip to the next batch without trusting garbage.
///
/// A Kafka batch's fields are read into the same meanings: `batch_len` is its whole length,
/// `body_len` its records' (compressed) length, `version` its magic, `offset_count` its last
/// offset delta + 1, `first_timestamp_ms` its base timestamp, and `attributes` Strata's bits
/// (the codec bits keep Kafka's numbering: [`BatchHeader::kafka_codec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub format: BatchFormat,
    pub base_offset: u64,
    pub leader_epoch: u32,
    pub crc: u32,
    pub batch_len: u32,
    pub body_len: u32,
    pub version: u8,
    pub attributes: u16,
    /// Offsets the batch spans (`last_offset - base_offset + 1`): its record count, unless it is
    /// compacted.
    pub offset_count: u32,
    pub first_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
    pub producer_id: i64,
    pub base_sequence: i32,
    pub producer_epoch: i16,
}

impl BatchHeader {
    /// Parses the header at the start of `bytes`, of either format. Checks version, reserved
    /// bits and that the lengths agree with each other; does not check the CRC or that `bytes`
    /// holds the whole batch.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        if super::kafka::is_kafka(bytes) {
            return super::kafka::parse(bytes);
        }
        if bytes.len() < HEADER_LEN {
            return Err(BatchError::TooShort {
                needed: HEADER_LEN,
                available: bytes.len(),
            });
        }
        let header = BatchHeader {
            format: BatchFormat::Strata,
            base_offset: read_u64(bytes, AT_BASE_OFFSET),
            leader_epoch: read_u32(bytes, AT_LEADER_EPOCH),
            crc: read_u32(bytes, AT_CRC),
            batch_len: read_u32(bytes, AT_BATCH_LEN),
            body_len: read_u32(bytes, AT_BODY_LEN),
            version: bytes[AT_VERSION],
            attributes: u16::from_le_bytes([bytes[AT_ATTRIBUTES], bytes[AT_ATTRIBUTES + 1]]),
            offset_count: read_u32(bytes, AT_OFFSET_COUNT),
            first_timestamp_ms: read_u64(bytes, AT_FIRST_TIMESTAMP) as i64,
            max_timestamp_ms: read_u64(bytes, AT_MAX_TIMESTAMP) as i64,
            producer_id: read_u64(bytes, AT_PRODUCER_ID) as i64,
            base_sequence: read_u32(bytes, AT_BASE_SEQUENCE) as i32,
            producer_epoch: u16::from_le_bytes([
                bytes[AT_PRODUCER_EPOCH],
                bytes[AT_PRODUCER_EPOCH + 1],
            ]) as i16,
        };
        if header.version != FORMAT_VERSION {
            return Err(BatchError::UnknownVersion(header.version));
        }
        if bytes[AT_RESERVED_A] != 0 || bytes[AT_RESERVED_B] != 0 || bytes[AT_RESERVED_B + 1] != 0 {
            return Err(BatchError::ReservedBitsSet);
        }
        if header.attributes & !attributes::KNOWN != 0
            || (header.attributes & attributes::DELETE_HORIZON != 0 && !header.is_compacted())
            || (header.attributes & attributes::COMMIT != 0 && !header.is_control())
            || (header.is_control() && !header.is_transactional())
        {
            return Err(BatchError::ReservedBitsSet);
        }
        let batch_len = header.batch_len as usize;
        let expected = padded_len(HEADER_LEN + header.body_len as usize);
        if batch_len > BATCH_LEN_MAX || batch_len != expected {
            return Err(BatchError::BadLength {
                batch_len: header.batch_len,
                body_len: header.body_len,
            });
        }
        if header.offset_count == 0 {
            return Err(BatchError::NoRecords);
        }
        // Offsets stay within i64 (as Kafka's do), so `last_offset` and record offsets never wrap.
        if header.base_offset > OFFSET_MAX - u64::from(header.offset_count) {
            return Err(BatchError::OffsetOverflow(header.base_offset));
        }
        Ok(header)
    }

    /// The last offset the batch spans: its last record's, or, compacted, the last its
    /// producer wrote (Kafka's `lastOffsetDelta`, kept when that record is gone).
    pub fn last_offset(&self) -> u64 {
        self.base_offset + u64::from(self.offset_count) - 1
    }

    /// The offset after this batch: batches tile the offsets, compacted ones too.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.offset_count)
    }

    /// Written by the log cleaner ([`attributes::COMPACTED`]).
    pub fn is_compacted(&self) -> bool {
        self.attributes & attributes::COMPACTED != 0
    }

    /// When the cleaner may remove this batch's tombstones, once it has set that
    /// ([`attributes::DELETE_HORIZON`]).
    pub fn delete_horizon_ms(&self) -> Option<i64> {
        (self.attributes & attributes::DELETE_HORIZON != 0).then_some(self.first_timestamp_ms)
    }

    /// A Strata batch's codec; a Kafka batch has Kafka's ([`Self::kafka_codec`]).
    pub fn codec(&self) -> Result<Codec, BatchError> {
        if self.format == BatchFormat::Kafka {
            return Err(BatchError::UnsupportedCodec(
                (self.attributes & attributes::CODEC_MASK) as u8,
            ));
        }
        match self.attributes & attributes::CODEC_MASK {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Lz4),
            2 => Ok(Codec::Zstd),
            other => Err(BatchError::UnsupportedCodec(other as u8)),
        }
    }

    /// A Kafka batch's codec; a Strata batch has Strata's ([`Self::codec`]).
    pub fn kafka_codec(&self) -> Result<super::kafka::KafkaCodec, BatchError> {
        if self.format != BatchFormat::Kafka {
            return Err(BatchError::UnsupportedCodec(
                (self.attributes & attributes::CODEC_MASK) as u8,
            ));
        }
        super::kafka::KafkaCodec::from_bits(self.attributes)
    }

    /// The codec's name, as Kafka's `compression.type` names it, whatever the format.
    pub fn codec_name(&self) -> &'static str {
        match self.format {
            BatchFormat::Strata => self.codec().map_or("unknown", Codec::name),
            BatchFormat::Kafka => self
                .kafka_codec()
                .map_or("unknown", super::kafka::KafkaCodec::name),
        }
    }

    /// A Kafka batch whose timestamps the broker set (`LogAppendTime`).
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & attributes::KAFKA_LOG_APPEND_TIME != 0
    }

    pub fn is_idempotent(&self) -> bool {
        self.producer_id != NO_PRODUCER_ID
    }

    /// Part of a transaction: records, or (with [`Self::is_control`]) its marker.
    pub fn is_transactional(&self) -> bool {
        self.attributes & attributes::TRANSACTIONAL != 0
    }

    /// A transaction marker, written by the broker (one control record: Kafka's commit or
    /// abort), never handed to applications.
    pub fn is_control(&self) -> bool {
        self.attributes & attributes::CONTROL != 0
    }

    /// A marker's ([`Self::is_control`]) coordinator epoch: a marker has no sequence, and its
    /// header carries the epoch where other batches carry their base sequence, so a replay of
    /// headers alone knows it (its control record's value holds it too, for Kafka clients).
    pub fn marker_coordinator_epoch(&self) -> i32 {
        debug_assert!(self.is_control());
        self.base_sequence
    }

    /// Whether a marker ([`Self::is_control`]) commits its transaction; `false` for an abort.
    pub fn marker_commits(&self) -> bool {
        self.attributes & attributes::COMMIT != 0
    }
}

/// Writes the fields the leader owns, in the batch's own format. They sit outside the CRC (in
/// both formats), so a stamped batch stays valid.
///
/// Panics if `batch` is shorter than a header: callers stamp batches they have validated.
pub fn stamp(batch: &mut [u8], base_offset: u64, leader_epoch: u32) {
    if super::kafka::is_kafka(batch) {
        return super::kafka::stamp(batch, base_offset, leader_epoch);
    }
    assert!(batch.len() >= HEADER_LEN, "stamp needs a whole header");
    batch[AT_BASE_OFFSET..AT_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_le_bytes());
    batch[AT_LEADER_EPOCH..AT_LEADER_EPOCH + 4].copy_from_slice(&leader_epoch.to_le_bytes());
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}
