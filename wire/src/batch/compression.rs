//! Compressed bodies (attribute bits 0-2, DESIGN §3): the whole rkyv archive, compressed once.
//!
//! A compressed body is a little-endian `u32` holding the archive's length, then the codec's
//! output: an LZ4 block (the block format, no frame) or a zstd frame. The length comes first so
//! a reader refuses a body that claims more than [`BATCH_LEN_MAX`] before it inflates anything,
//! allocates exactly once, and can tell a truncated stream from a complete one: the output must
//! fill the declared length exactly.
//!
//! The CRC covers the compressed bytes (what is stored and sent); the archive is checked after
//! decompression, with the same structural and record checks as an uncompressed body.

use std::cell::RefCell;

use rkyv::util::AlignedVec;

use super::BatchError;
use super::layout::{BATCH_LEN_MAX, Codec};

/// The archive-length prefix of a compressed body.
pub(crate) const LEN_PREFIX: usize = 4;

/// zstd's level: Kafka's default (`compression.zstd.level` = 3), a good ratio at about the speed
/// of LZ4's decompression side.
const ZSTD_LEVEL: i32 = 3;

thread_local! {
    /// zstd contexts hold megabytes of tables: one per thread, reused for every batch.
    static ZSTD_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Appends the compressed form of `archive` (prefix and codec output) to `out`.
///
/// Panics for [`Codec::None`] (nothing to compress: a caller bug) and if the codec fails on
/// input that fits a batch, which neither codec does for in-memory buffers.
pub(crate) fn compress(codec: Codec, archive: &[u8], out: &mut AlignedVec<16>) {
    assert!(
        archive.len() <= BATCH_LEN_MAX,
        "archive larger than a batch"
    );
    out.extend_from_slice(&(archive.len() as u32).to_le_bytes());
    let start = out.len();
    let written = match codec {
        Codec::None => panic!("compress called without a codec"),
        Codec::Lz4 => {
            out.resize(
                start + lz4_flex::block::get_maximum_output_size(archive.len()),
                0,
            );
            lz4_flex::block::compress_into(archive, &mut out[start..])
                .expect("the output buffer has the codec's maximum size")
        }
        Codec::Zstd => {
            out.reserve(zstd::zstd_safe::compress_bound(archive.len()));
            ZSTD_COMPRESSOR.with_borrow_mut(|compressor| {
                let compressor = match compressor {
                    Some(compressor) => compressor,
                    None => compressor
                        .insert(zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd context")),
                };
                compressor
                    .compress_to_buffer(archive, &mut SpareCapacity::after(out, start))
                    .expect("the output buffer has zstd's bound")
            })
        }
    };
    if out.len() != start + written {
        // LZ4 wrote into zeroed room up to its bound; zstd's sink already set the length.
        out.resize(start + written, 0);
    }
}

/// The capacity of an `AlignedVec` past `start`, as zstd's output buffer: zstd writes into
/// memory nobody zeroed first, and the vector's length moves to cover exactly what it wrote.
struct SpareCapacity<'a> {
    vec: &'a mut AlignedVec<16>,
    start: usize,
}

impl<'a> SpareCapacity<'a> {
    fn after(vec: &'a mut AlignedVec<16>, start: usize) -> SpareCapacity<'a> {
        assert_eq!(vec.len(), start, "the output starts at the vector's end");
        SpareCapacity { vec, start }
    }
}

// SAFETY: `as_slice` covers only initialized bytes (those past `start` that zstd reported
// written); `capacity` and `as_mut_ptr` describe the allocation past `start`, which the vector
// owns; `filled_until` is called by zstd only with a count it has written from `as_mut_ptr`.
unsafe impl zstd::zstd_safe::WriteBuf for SpareCapacity<'_> {
    fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..]
    }

    fn capacity(&self) -> usize {
        self.vec.capacity() - self.start
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `start` <= len <= capacity, so the pointer stays within the allocation.
        unsafe { self.vec.as_mut_ptr().add(self.start) }
    }

    unsafe fn filled_until(&mut self, n: usize) {
        debug_assert!(self.start + n <= self.vec.capacity());
        // SAFETY: the caller (zstd) initialized `n` bytes from `as_mut_ptr`, i.e. up to
        // `start + n`; the bytes before `start` were initialized already.
        unsafe { self.vec.set_len(self.start + n) }
    }
}

/// LZ4's format cannot inflate a block by more than about 255x (a match length grows by at most
/// 255 per input byte); a larger claim is a lie, refused before the output is allocated.
const LZ4_RATIO_MAX: usize = 255;

/// The archive a compressed `body` holds, in memory aligned for rkyv. Fails on a body whose
/// prefix is missing or too large, whose stream is corrupt, or whose output is not exactly the
/// declared length.
pub(crate) fn decompress(codec: Codec, body: &[u8]) -> Result<AlignedVec<16>, BatchError> {
    let Some((prefix, stream)) = body.split_first_chunk::<LEN_PREFIX>() else {
        return Err(BatchError::BadCompression("the length prefix is missing"));
    };
    let archive_len = u32::from_le_bytes(*prefix) as usize;
    if archive_len > BATCH_LEN_MAX {
        return Err(BatchError::BadCompression(
            "the declared length exceeds the batch limit",
        ));
    }
    // Allocated only once the stream's own header agrees with the prefix.
    let mut archive = AlignedVec::<16>::new();
    let produced = match codec {
        Codec::None => return Err(BatchError::BadCompression("no codec")),
        Codec::Lz4 => {
            if archive_len > stream.len().saturating_mul(LZ4_RATIO_MAX) + 16 {
                return Err(BatchError::BadCompression(
                    "the declared length is more than LZ4 can expand to",
                ));
            }
            archive = AlignedVec::with_capacity(archive_len);
            archive.resize(archive_len, 0);
            lz4_flex::block::decompress_into(stream, &mut archive)
                .map_err(|_| BatchError::BadCompression("the LZ4 block is corrupt"))?
        }
        // Into unzeroed capacity: a lying prefix costs an untouched reservation, not a memset.
        Codec::Zstd => ZSTD_DECOMPRESSOR.with_borrow_mut(|decompressor| {
            // Our frames state their content size (one-shot compression always does): one that
            // disagrees with the prefix is refused before the output is reserved.
            let declared = zstd::zstd_safe::get_frame_content_size(stream)
                .ok()
                .flatten();
            if declared != Some(archive_len as u64) {
                return Err(BatchError::BadCompression(
                    "the zstd frame does not declare the archive's length",
                ));
            }
            archive = AlignedVec::with_capacity(archive_len);
            let decompressor = match decompressor {
                Some(decompressor) => decompressor,
                None => decompressor.insert(
                    zstd::bulk::Decompressor::new()
                        .map_err(|_| BatchError::BadCompression("no zstd context"))?,
                ),
            };
            decompressor
                .decompress_to_buffer(stream, &mut SpareCapacity::after(&mut archive, 0))
                .map_err(|_| BatchError::BadCompression("the zstd frame is corrupt"))
        })?,
    };
    if produced != archive_len || archive.len() != archive_len {
        return Err(BatchError::BadCompression(
            "the stream is shorter than the declared length",
        ));
    }
    Ok(archive)
}

/// A zstd stream of at most `limit` bytes inflated in one call, through this thread's reused
/// context, into memory reserved (not zeroed) for its declared size, or where it declares none
/// (a streaming compressor's: librdkafka's, the Java client's) for the bound its blocks allow.
/// `None` where a stream it cannot inflate so (its bound past `limit`, or a corrupt one) is for
/// the caller to stream, which caps the output and tells damage apart.
pub(crate) fn zstd_one_shot(input: &[u8], limit: usize) -> Option<Result<Vec<u8>, BatchError>> {
    let declared = zstd::zstd_safe::get_frame_content_size(input)
        .ok()
        .flatten();
    if declared.is_some_and(|declared| declared > limit as u64) {
        return Some(Err(BatchError::Inflates { limit }));
    }
    let capacity = match declared {
        Some(declared) => declared,
        None => zstd::zstd_safe::decompress_bound(input)
            .ok()
            .filter(|bound| *bound <= limit as u64)?,
    };
    ZSTD_DECOMPRESSOR.with_borrow_mut(|decompressor| {
        let decompressor = match decompressor {
            Some(decompressor) => decompressor,
            None => decompressor.insert(zstd::bulk::Decompressor::new().ok()?),
        };
        let mut out = Vec::with_capacity(capacity as usize);
        match decompressor.decompress_to_buffer(input, &mut out) {
            Ok(written) if declared.is_none_or(|declared| written as u64 == declared) => {
                Some(Ok(out))
            }
            // More frames than the first declares, or a corrupt stream: streamed instead.
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..50_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn both_codecs_round_trip_and_shrink_repetitive_input() {
        for codec in [Codec::Lz4, Codec::Zstd] {
            let archive = sample();
            let mut out = AlignedVec::<16>::new();
            compress(codec, &archive, &mut out);
            assert!(
                out.len() < archive.len() / 4,
                "{codec:?}: {} bytes",
                out.len()
            );
            assert_eq!(
                decompress(codec, &out).unwrap().as_slice(),
                archive.as_slice()
            );
        }
    }

    #[test]
    fn truncated_lying_or_foreign_streams_are_refused() {
        for codec in [Codec::Lz4, Codec::Zstd] {
            let archive = sample();
            let mut out = AlignedVec::<16>::new();
            compress(codec, &archive, &mut out);
            let cut = &out[..out.len() - 10];
            assert!(matches!(
                decompress(codec, cut),
                Err(BatchError::BadCompression(_))
            ));
            // A prefix that claims one byte more than the stream holds.
            let mut longer = out.to_vec();
            longer[..4].copy_from_slice(&(archive.len() as u32 + 1).to_le_bytes());
            assert!(decompress(codec, &longer).is_err());
            // A prefix past the batch limit is refused before anything is allocated.
            let mut huge = out.to_vec();
            huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
            assert!(decompress(codec, &huge).is_err());
            assert!(decompress(codec, &[1, 0]).is_err());
        }
        // A claim of 100 MB is checked against the stream before anything is reserved: a zstd
        // frame declares its size, and an LZ4 block cannot expand that far.
        for (codec, why) in [
            (Codec::Zstd, "does not declare"),
            (Codec::Lz4, "more than LZ4 can expand"),
        ] {
            let mut out = AlignedVec::<16>::new();
            compress(codec, &sample(), &mut out);
            let mut claims = out.to_vec();
            claims[..4].copy_from_slice(&100_000_000u32.to_le_bytes());
            assert!(matches!(
                decompress(codec, &claims),
                Err(BatchError::BadCompression(reason)) if reason.contains(why)
            ));
        }
        let mut lz4 = AlignedVec::<16>::new();
        compress(Codec::Lz4, &sample(), &mut lz4);
        // One codec's output under the other codec's attribute.
        assert!(decompress(Codec::Zstd, &lz4).is_err());
    }
}
