//! Building batches: records go straight into the output buffer as they arrive.

use bytes::Bytes;
use rkyv::util::AlignedVec;

use super::Record;
use super::body::{BodyParts, HeaderEntry, NULL_LEN, RecordEntry};
use super::compression;
use super::layout::{
    self, BATCH_LEN_MAX, BatchHeader, Codec, FORMAT_VERSION, HEADER_LEN, attributes, padded_len,
};

/// Size of one archived record entry and header entry, for size estimates.
const RECORD_ENTRY_LEN: usize = 40;
const HEADER_ENTRY_LEN: usize = 16;
/// The archived root: three (relative pointer, length) pairs.
const ROOT_LEN: usize = 24;

/// Appends records into one growing buffer and seals them into a batch.
///
/// After warm-up (once the entry vectors have grown to the usual batch size) appending a record
/// allocates nothing: its bytes are copied once into the output buffer and a fixed-size entry is
/// pushed. [`BatchBuilder::finish`] writes the entry arrays and the rkyv root after the payload,
/// fills in the header and hands the buffer out as `Bytes` without copying it.
pub struct BatchBuilder {
    /// Header placeholder followed by the payload written so far.
    buf: AlignedVec<16>,
    records: Vec<RecordEntry>,
    headers: Vec<HeaderEntry>,
    first_timestamp_ms: i64,
    max_timestamp_ms: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: u16,
    /// How `finish` stores the body; kept across batches (a producer's setting).
    codec: Codec,
    capacity_bytes: usize,
    /// Set between [`BatchBuilder::start_compacted`] and [`BatchBuilder::finish_compacted`]:
    /// the batch being rewritten, whose offsets, timestamps and producer fields the new one keeps.
    compacting: Option<BatchHeader>,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder::with_capacity(16 * 1024)
    }
}

impl BatchBuilder {
    /// A builder whose buffers start with room for `capacity_bytes` of batch.
    pub fn with_capacity(capacity_bytes: usize) -> BatchBuilder {
        let mut builder = BatchBuilder {
            buf: AlignedVec::new(),
            records: Vec::new(),
            headers: Vec::new(),
            first_timestamp_ms: 0,
            max_timestamp_ms: i64::MIN,
            producer_id: layout::NO_PRODUCER_ID,
            producer_epoch: layout::NO_PRODUCER_EPOCH,
            base_sequence: layout::NO_SEQUENCE,
            attributes: 0,
            codec: Codec::None,
            capacity_bytes: capacity_bytes.max(HEADER_LEN),
            compacting: None,
        };
        builder.reset_buffer();
        builder
    }

    /// Marks the batch as coming from an idempotent producer.
    pub fn set_producer(&mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
    }

    /// Attribute bits other than the codec (see [`BatchBuilder::set_codec`]) for the next batch.
    pub fn set_attributes(&mut self, attributes: u16) {
        assert_eq!(
            attributes & !layout::attributes::KNOWN,
            0,
            "unknown attribute bits"
        );
        assert_eq!(
            attributes & layout::attributes::CODEC_MASK,
            0,
            "the codec is set with set_codec"
        );
        self.attributes = attributes;
    }

    /// Compresses the body of every batch sealed from now on with `codec`. The size estimate
    /// (`estimated_len`, what `batch.size` limits) stays the uncompressed size.
    pub fn set_codec(&mut self, codec: Codec) {
        self.codec = codec;
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    /// The size the batch would have if sealed now (what `batch.size` limits are compared to).
    pub fn estimated_len(&self) -> usize {
        padded_len(
            self.buf.len()
                + 8
                + self.records.len() * RECORD_ENTRY_LEN
                + 8
                + self.headers.len() * HEADER_ENTRY_LEN
                + ROOT_LEN,
        )
    }

    /// Appends a record with no headers.
    pub fn push(&mut self, timestamp_ms: i64, key: Option<&[u8]>, value: &[u8]) {
        self.push_with_headers(timestamp_ms, key, value, std::iter::empty());
    }

    /// Appends a record. Panics if the batch would exceed [`BATCH_LEN_MAX`]: callers seal batches
    /// at their configured size long before that.
    pub fn push_with_headers<'h>(
        &mut self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: &[u8],
        headers: impl IntoIterator<Item = (&'h [u8], &'h [u8])>,
    ) {
        let headers = headers.into_iter().map(|(key, value)| (key, Some(value)));
        self.push_nullable(timestamp_ms, key, Some(value), headers);
    }

    /// Appends a record whose value, and header values, may be null (a null value is a
    /// tombstone: Kafka's delete marker for its key, which Kafka's clients tell from an empty
    /// value).
    pub fn push_nullable<'h>(
        &mut self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
    ) {
        assert!(
            self.compacting.is_none(),
            "a compacted batch takes push_kept"
        );
        if self.records.is_empty() {
            self.first_timestamp_ms = timestamp_ms;
        }
        let offset_delta = u32::try_from(self.records.len()).expect("record count fits u32");
        self.push_entry(offset_delta, timestamp_ms, key, value, headers);
    }

    /// Starts the compacted batch that replaces `original` (the log cleaner's): it keeps
    /// `original`'s offsets, epoch, timestamps, producer fields, transaction bits and codec, and
    /// holds the records then given to [`BatchBuilder::push_kept`], none at all if none is.
    /// `delete_horizon_ms` sets the time its tombstones may go from
    /// ([`BatchHeader::delete_horizon_ms`]) where `original` has none yet; one already set stays.
    pub fn start_compacted(&mut self, original: &BatchHeader, delete_horizon_ms: Option<i64>) {
        assert!(
            self.records.is_empty() && self.compacting.is_none(),
            "start_compacted on an empty builder"
        );
        let mut original = *original;
        if let Some(horizon) = delete_horizon_ms
            && original.delete_horizon_ms().is_none()
        {
            original.attributes |= attributes::DELETE_HORIZON;
            original.first_timestamp_ms = horizon;
        }
        self.compacting = Some(original);
        self.first_timestamp_ms = original.first_timestamp_ms;
    }

    /// Adds one of the compacted batch's original records, at its original offset and timestamp.
    /// Panics if `record` is not within the batch [`BatchBuilder::start_compacted`] named, or
    /// not after the record kept before it.
    pub fn push_kept(&mut self, record: &Record<'_>) {
        let original = self.compacting.expect("push_kept follows start_compacted");
        assert!(
            record.offset >= original.base_offset && record.offset <= original.last_offset(),
            "a kept record lies within its batch"
        );
        let offset_delta = (record.offset - original.base_offset) as u32;
        assert!(
            self.records
                .last()
                .is_none_or(|last| last.offset_delta < offset_delta),
            "kept records stay in offset order"
        );
        self.push_entry(
            offset_delta,
            record.timestamp_ms,
            record.key,
            record.nullable_value(),
            record.nullable_headers(),
        );
    }

    /// Seals the compacted batch started by [`BatchBuilder::start_compacted`], stamped with the
    /// original's base offset and epoch, and leaves the builder empty.
    pub fn finish_compacted(&mut self) -> Bytes {
        let original = self
            .compacting
            .expect("finish_compacted follows start_compacted");
        let codec = self.codec;
        self.codec = original.codec().expect("the original batch was validated");
        let mut batch = self.seal();
        self.codec = codec;
        let batch_mut = &mut batch[..];
        layout::stamp(batch_mut, original.base_offset, original.leader_epoch);
        let batch = Bytes::from_owner(batch);
        self.compacting = None;
        self.records.clear();
        self.headers.clear();
        self.max_timestamp_ms = i64::MIN;
        self.reset_buffer();
        batch
    }

    fn push_entry<'h>(
        &mut self,
        offset_delta: u32,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
    ) {
        let (key_start, key_len) = match key {
            Some(key) => (self.append_payload(key), key.len() as u32),
            None => (self.payload_len(), NULL_LEN),
        };
        let (value_start, value_len) = match value {
            Some(value) => (self.append_payload(value), value.len() as u32),
            None => (self.payload_len(), NULL_LEN),
        };
        let headers_start = self.headers.len() as u32;
        for (header_key, header_value) in headers {
            let key_start = self.append_payload(header_key);
            let (value_start, value_len) = match header_value {
                Some(value) => (self.append_payload(value), value.len() as u32),
                None => (self.payload_len(), NULL_LEN),
            };
            let entry = HeaderEntry {
                key_start,
                key_len: header_key.len() as u32,
                value_start,
                value_len,
            };
            self.headers.push(entry);
        }
        let timestamp_delta_ms = timestamp_ms
            .checked_sub(self.first_timestamp_ms)
            .filter(|delta| self.first_timestamp_ms.checked_add(*delta).is_some())
            .expect("timestamps in one batch must differ by less than the i64 range");
        self.records.push(RecordEntry {
            timestamp_delta_ms,
            offset_delta,
            key_start,
            key_len,
            value_start,
            value_len,
            headers_start,
            headers_count: self.headers.len() as u32 - headers_start,
        });
        self.max_timestamp_ms = self.max_timestamp_ms.max(timestamp_ms);
        assert!(
            self.estimated_len() <= BATCH_LEN_MAX,
            "batch exceeds the format limit of {BATCH_LEN_MAX} bytes"
        );
    }

    /// Seals the records pushed so far into a batch (base offset 0, epoch 0: the leader stamps
    /// both) and leaves the builder empty for the next batch. Panics if no record was pushed.
    pub fn finish(&mut self) -> Bytes {
        let batch = Bytes::from_owner(self.seal());
        self.records.clear();
        self.headers.clear();
        self.max_timestamp_ms = i64::MIN;
        self.producer_id = layout::NO_PRODUCER_ID;
        self.producer_epoch = layout::NO_PRODUCER_EPOCH;
        self.base_sequence = layout::NO_SEQUENCE;
        self.attributes = 0;
        self.reset_buffer();
        batch
    }

    /// [`BatchBuilder::finish`] for a builder's last batch: nothing is prepared for a next one
    /// (no fresh buffer is allocated). Panics if no record was pushed.
    pub fn into_batch(mut self) -> Bytes {
        Bytes::from_owner(self.seal())
    }

    /// Writes the entry arrays, the root, the header and the CRC (compressing the body first
    /// when a codec is set) and takes the buffer out.
    fn seal(&mut self) -> AlignedVec<16> {
        assert!(
            !self.records.is_empty() || self.compacting.is_some(),
            "finish needs at least one record"
        );
        let payload_len = self.buf.len() - HEADER_LEN;
        let parts = BodyParts {
            payload_pos: HEADER_LEN,
            payload_len,
            records: &self.records,
            headers: &self.headers,
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf = rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(&parts, buf)
            .expect("serializing into memory cannot fail");
        if self.codec != Codec::None {
            let archive = &buf[HEADER_LEN..];
            let mut compressed = AlignedVec::<16>::with_capacity(HEADER_LEN + archive.len() / 2);
            compressed.resize(HEADER_LEN, 0);
            compression::compress(self.codec, archive, &mut compressed);
            buf = compressed;
        }
        let body_len = buf.len() - HEADER_LEN;
        let (mut attributes, mut offset_count, mut max_timestamp_ms) = (
            self.attributes,
            self.records.len() as u32,
            self.max_timestamp_ms,
        );
        let (mut producer_id, mut producer_epoch, mut base_sequence) =
            (self.producer_id, self.producer_epoch, self.base_sequence);
        if let Some(original) = &self.compacting {
            attributes = original.attributes & !attributes::CODEC_MASK | attributes::COMPACTED;
            offset_count = original.offset_count;
            max_timestamp_ms = original.max_timestamp_ms;
            (producer_id, producer_epoch, base_sequence) = (
                original.producer_id,
                original.producer_epoch,
                original.base_sequence,
            );
        }
        let attributes = attributes | self.codec as u16;
        let batch_len = padded_len(buf.len());
        buf.resize(batch_len, 0);

        let header = &mut buf[..HEADER_LEN];
        header[layout::AT_BATCH_LEN..][..4].copy_from_slice(&(batch_len as u32).to_le_bytes());
        header[layout::AT_BODY_LEN..][..4].copy_from_slice(&(body_len as u32).to_le_bytes());
        header[layout::AT_VERSION] = FORMAT_VERSION;
        header[layout::AT_ATTRIBUTES..][..2].copy_from_slice(&attributes.to_le_bytes());
        header[layout::AT_OFFSET_COUNT..][..4].copy_from_slice(&offset_count.to_le_bytes());
        header[layout::AT_FIRST_TIMESTAMP..][..8]
            .copy_from_slice(&self.first_timestamp_ms.to_le_bytes());
        header[layout::AT_MAX_TIMESTAMP..][..8].copy_from_slice(&max_timestamp_ms.to_le_bytes());
        header[layout::AT_PRODUCER_ID..][..8].copy_from_slice(&producer_id.to_le_bytes());
        header[layout::AT_BASE_SEQUENCE..][..4].copy_from_slice(&base_sequence.to_le_bytes());
        header[layout::AT_PRODUCER_EPOCH..][..2].copy_from_slice(&producer_epoch.to_le_bytes());
        let crc = crate::crc32c(&buf[layout::CRC_START..HEADER_LEN + body_len]);
        buf[layout::AT_CRC..][..4].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    fn reset_buffer(&mut self) {
        self.buf = AlignedVec::with_capacity(self.capacity_bytes);
        self.buf.resize(HEADER_LEN, 0);
    }

    fn payload_len(&self) -> u32 {
        (self.buf.len() - HEADER_LEN) as u32
    }

    fn append_payload(&mut self, bytes: &[u8]) -> u32 {
        let start = self.payload_len();
        self.buf.extend_from_slice(bytes);
        start
    }
}

/// A transaction marker: the control batch a partition leader writes when the coordinator has
/// decided a transaction, for `producer_id` at `producer_epoch`. Its one record is Kafka's
/// control record, so a Kafka consumer reads it as one: the key is the control type (version 0,
/// then 0 for an abort or 1 for a commit, big-endian `int16`s) and the value is the end-marker
/// (version 0, then the coordinator's epoch as an `int32`). The header's
/// [`layout::attributes::COMMIT`] and its base sequence field
/// ([`layout::BatchHeader::marker_coordinator_epoch`]) say the same for readers of headers
/// alone.
pub fn marker(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp_ms: i64,
) -> Bytes {
    let mut builder = BatchBuilder::with_capacity(256);
    builder.set_producer(producer_id, producer_epoch, coordinator_epoch);
    let mut bits = attributes::TRANSACTIONAL | attributes::CONTROL;
    if commit {
        bits |= attributes::COMMIT;
    }
    builder.set_attributes(bits);
    let mut key = [0u8; 4];
    key[2..].copy_from_slice(&i16::from(commit).to_be_bytes());
    let mut value = [0u8; 6];
    value[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    builder.push(timestamp_ms, Some(&key), &value);
    builder.into_batch()
}

/// What a marker's control record says, read back from its key and value (`None`: not a
/// control record of a version this build knows).
pub fn read_marker(key: &[u8], value: &[u8]) -> Option<(bool, i32)> {
    let ([0, 0, 0, kind], [0, 0, epoch @ ..]) = (key, value) else {
        return None;
    };
    let commit = match kind {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some((commit, i32::from_be_bytes(epoch.try_into().ok()?)))
}
