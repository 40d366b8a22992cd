//! `strata-wire`: everything Strata puts on a socket or on disk, as bytes.
//!
//! Architecture invariant: this crate does no IO, spawns nothing and knows no runtime. Decoders
//! take byte slices or `Bytes` and return values or typed errors; they never panic on any input.

pub mod batch;
mod checksum;
pub mod protocol;

pub use batch::{Batch, BatchBuilder, BatchError, BatchHeader, Record};
pub use checksum::crc32c;

/// 16-byte aligned growable buffer: batches built or read into it can be accessed in place.
pub use rkyv::util::AlignedVec;
