//! The rkyv body of a batch.
//!
//! Records are fixed-size entries that point into one shared payload blob:
//!
//! ```text
//! payload: [u8]            key and value bytes, header keys and values, in append order
//! records: [RecordEntry]   one per record, in offset order
//! headers: [HeaderEntry]   record i owns headers[headers_start .. headers_start + headers_count]
//! root:    ArchivedBody    three relative pointers + lengths, at the END of the archive (rkyv's rule)
//! ```
//!
//! Why this shape and not `Vec<Record { key: Vec<u8>, .. }>`: the builder can write payload bytes
//! straight into the output buffer as records arrive (rkyv writes dependencies before the things
//! that point at them, and a fixed-size entry array needs no per-record resolver), so building a
//! batch copies each value once and allocates nothing per record. bytecheck validates the three
//! arrays structurally; the ranges inside the entries are checked once by [`super::Batch::validate`].

use rkyv::{
    Archive, Place, Portable, Serialize,
    bytecheck::CheckBytes,
    munge::munge,
    rancor::Fallible,
    ser::{Allocator, Writer},
    vec::{ArchivedVec, VecResolver},
};

/// Marks an absent key or value (distinct from an empty one): a null value is Kafka's
/// tombstone.
pub const NULL_LEN: u32 = u32::MAX;

/// One record. Offsets into `payload`, lengths in bytes.
#[derive(Archive, Serialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct RecordEntry {
    pub timestamp_delta_ms: i64,
    pub offset_delta: u32,
    pub key_start: u32,
    /// [`NULL_LEN`] for a null key.
    pub key_len: u32,
    pub value_start: u32,
    /// [`NULL_LEN`] for a null value.
    pub value_len: u32,
    pub headers_start: u32,
    pub headers_count: u32,
}

/// One record header (key and value bytes live in `payload`).
#[derive(Archive, Serialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct HeaderEntry {
    pub key_start: u32,
    pub key_len: u32,
    pub value_start: u32,
    /// [`NULL_LEN`] for a null value (Kafka's headers may have one; keys may not).
    pub value_len: u32,
}

/// The archived root of a body. Defined by hand (not derived from an owned type) because no owned
/// `Body` ever exists: the builder assembles it from parts already written.
#[derive(Portable, CheckBytes, Debug)]
#[bytecheck(crate = rkyv::bytecheck)]
#[rkyv(crate = rkyv)]
#[repr(C)]
pub struct ArchivedBody {
    pub payload: ArchivedVec<u8>,
    pub records: ArchivedVec<ArchivedRecordEntry>,
    pub headers: ArchivedVec<ArchivedHeaderEntry>,
}

/// What the builder hands rkyv at `finish`: the payload is already in the writer at
/// `payload_pos` (writer coordinates), the entry arrays still have to be written.
pub(crate) struct BodyParts<'a> {
    pub payload_pos: usize,
    pub payload_len: usize,
    pub records: &'a [RecordEntry],
    pub headers: &'a [HeaderEntry],
}

impl Archive for BodyParts<'_> {
    type Archived = ArchivedBody;
    type Resolver = [VecResolver; 3];

    fn resolve(&self, resolver: Self::Resolver, out: Place<ArchivedBody>) {
        let [payload_resolver, records_resolver, headers_resolver] = resolver;
        munge!(let ArchivedBody { payload, records, headers } = out);
        ArchivedVec::<u8>::resolve_from_len(self.payload_len, payload_resolver, payload);
        ArchivedVec::resolve_from_slice(self.records, records_resolver, records);
        ArchivedVec::resolve_from_slice(self.headers, headers_resolver, headers);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for BodyParts<'_> {
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        let payload = VecResolver::from_pos(self.payload_pos);
        let records = ArchivedVec::serialize_from_slice(self.records, serializer)?;
        let headers = ArchivedVec::serialize_from_slice(self.headers, serializer)?;
        Ok([payload, records, headers])
    }
}
