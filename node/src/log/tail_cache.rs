//! The newest appends of a log, kept in memory for readers at its end.
//!
//! A log whose appends bypass the page cache (`direct.writes=always`) would otherwise send every
//! tailing consumer's and follower's fetch to the disk for bytes it wrote a moment ago: the page
//! cache is what served them before. This keeps the appended buffers themselves (shared `Bytes`,
//! no copy) up to a byte budget, newest first out of the budget's reach last, as Redpanda's batch
//! cache does. Reads below what it holds go to the file as before.
//!
//! Invariant: the chunks are contiguous in offsets (each starts where the one before ends) and
//! each holds whole batches, back to back, exactly as written. An append that does not continue
//! the last chunk (after a truncation, or one this log did not cache) empties the cache first.

use std::collections::VecDeque;

use bytes::Bytes;
use strata_wire::AlignedVec;
use strata_wire::batch::BatchHeader;

/// What one partition keeps: at hundreds of MB/s a reader that keeps up is a few milliseconds
/// behind, well inside it; the memory stays bounded per partition.
pub const TAIL_CACHE_BYTES: usize = 16 << 20;

thread_local! {
    /// Reads this thread (a shard) served from tail caches, and from segment files.
    static READS: std::cell::Cell<ReadTotals> = const { std::cell::Cell::new(ReadTotals { from_cache: 0, from_files: 0 }) };
}

/// Reads (fetches of consumers and followers) a shard has served, by where the bytes came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadTotals {
    pub from_cache: u64,
    pub from_files: u64,
}

/// Counts one read on this thread.
pub(crate) fn count_read(from_cache: bool) {
    READS.with(|reads| {
        let mut totals = reads.get();
        if from_cache {
            totals.from_cache += 1;
        } else {
            totals.from_files += 1;
        }
        reads.set(totals);
    });
}

/// This thread's reads so far (for `/metrics`).
pub fn read_totals() -> ReadTotals {
    READS.with(std::cell::Cell::get)
}

#[derive(Debug)]
pub struct TailCache {
    chunks: VecDeque<Chunk>,
    bytes: usize,
    budget: usize,
}

#[derive(Debug)]
struct Chunk {
    base_offset: u64,
    next_offset: u64,
    bytes: Bytes,
}

impl TailCache {
    pub fn new(budget: usize) -> TailCache {
        TailCache {
            chunks: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.bytes = 0;
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Keeps `batches` (whole stamped batches, back to back, as appended), the oldest chunks
    /// leaving once the budget is exceeded. Batches that do not continue the newest chunk start
    /// the cache over.
    pub fn push(&mut self, batches: Bytes) {
        let Some((base_offset, next_offset)) = offsets(&batches) else {
            return;
        };
        if self
            .chunks
            .back()
            .is_some_and(|last| last.next_offset != base_offset)
        {
            self.clear();
        }
        self.bytes += batches.len();
        self.chunks.push_back(Chunk {
            base_offset,
            next_offset,
            bytes: batches,
        });
        while self.bytes > self.budget && self.chunks.len() > 1 {
            let oldest = self.chunks.pop_front().expect("more than one chunk");
            self.bytes -= oldest.bytes.len();
        }
        if self.bytes > self.budget {
            // One append larger than the whole budget: keeping it would break the bound.
            self.clear();
        }
    }

    /// Forgets chunks wholly below `log_start` (retention deleted their segments).
    pub fn drop_below(&mut self, log_start: u64) {
        while let Some(oldest) = self.chunks.front()
            && oldest.next_offset <= log_start
        {
            self.bytes -= oldest.bytes.len();
            self.chunks.pop_front();
        }
    }

    /// Whole batches from the one holding `offset` on, ending before any batch that reaches past
    /// `max_offset`, within `max_bytes` (but at least one batch): what a read of the file would
    /// return. `None` when `offset` is not held. Zero-copy within one chunk; batches from several
    /// chunks are copied into one aligned buffer.
    /// Whether the batch holding `offset` is here (a read from it would be served from memory).
    pub fn holds(&self, offset: u64) -> bool {
        match (self.chunks.front(), self.chunks.back()) {
            (Some(first), Some(last)) => first.base_offset <= offset && offset < last.next_offset,
            _ => false,
        }
    }

    pub fn read(&self, offset: u64, max_bytes: usize, max_offset: u64) -> Option<Bytes> {
        let first = self.chunks.front()?;
        let last = self.chunks.back()?;
        if offset < first.base_offset || offset >= last.next_offset {
            return None;
        }
        let mut at = self
            .chunks
            .partition_point(|chunk| chunk.next_offset <= offset);
        // (chunk index, start, end) of the bytes to return, in order.
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        let mut taken = 0usize;
        'chunks: while let Some(chunk) = self.chunks.get(at) {
            let bytes = &chunk.bytes;
            let mut position = 0usize;
            let mut start = None;
            while position < bytes.len() {
                let header = BatchHeader::parse(&bytes[position..])
                    .expect("the cache holds batches validated before they were written");
                let batch_len = header.batch_len as usize;
                if header.next_offset() <= offset {
                    position += batch_len;
                    continue;
                }
                if header.next_offset() > max_offset || (taken > 0 && taken + batch_len > max_bytes)
                {
                    if let Some(start) = start {
                        spans.push((at, start, position));
                    }
                    break 'chunks;
                }
                start.get_or_insert(position);
                taken += batch_len;
                position += batch_len;
            }
            if let Some(start) = start {
                spans.push((at, start, position));
            }
            at += 1;
        }
        Some(match spans.as_slice() {
            [] => Bytes::new(),
            [(at, start, end)] => self.chunks[*at].bytes.slice(*start..*end),
            _ => {
                let mut joined = AlignedVec::<16>::with_capacity(taken);
                for (at, start, end) in spans {
                    joined.extend_from_slice(&self.chunks[at].bytes[start..end]);
                }
                Bytes::from_owner(joined)
            }
        })
    }
}

/// The first offset and the offset after the last of back-to-back stamped batches; `None` for
/// no bytes.
fn offsets(batches: &[u8]) -> Option<(u64, u64)> {
    let mut position = 0usize;
    let mut range: Option<(u64, u64)> = None;
    while position < batches.len() {
        let header = BatchHeader::parse(&batches[position..])
            .expect("appended batches were validated and stamped");
        let base = range.map_or(header.base_offset, |(base, _)| base);
        range = Some((base, header.next_offset()));
        position += header.batch_len as usize;
    }
    range
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::batch::{BatchBuilder, stamp};

    /// `records` batches of one record each, stamped from `base`, back to back.
    fn appended(base: u64, records: u64, value_len: usize) -> Bytes {
        let mut all = Vec::new();
        for i in 0..records {
            let mut builder = BatchBuilder::default();
            builder.push(i as i64, None, &vec![b'v'; value_len]);
            let mut batch = builder.finish().to_vec();
            stamp(&mut batch, base + i, 1);
            all.extend_from_slice(&batch);
        }
        let mut aligned = AlignedVec::<16>::new();
        aligned.extend_from_slice(&all);
        Bytes::from_owner(aligned)
    }

    fn offsets_in(bytes: &Bytes) -> Vec<u64> {
        strata_wire::batch::split_batches(bytes.clone())
            .map(|batch| batch.unwrap().base_offset())
            .collect()
    }

    #[test]
    fn reads_whole_batches_across_chunks_within_the_limits() {
        let mut cache = TailCache::new(1 << 20);
        cache.push(appended(10, 3, 100));
        cache.push(appended(13, 2, 100));
        assert_eq!(cache.read(9, 1 << 20, 100), None, "below what is held");
        assert_eq!(cache.read(15, 1 << 20, 100), None, "at the end");
        let all = cache.read(10, 1 << 20, 100).unwrap();
        assert_eq!(offsets_in(&all), [10, 11, 12, 13, 14]);
        assert_eq!(
            offsets_in(&cache.read(12, 1 << 20, 100).unwrap()),
            [12, 13, 14]
        );
        // Not past the high watermark, and not a batch that reaches past it.
        assert_eq!(offsets_in(&cache.read(11, 1 << 20, 13).unwrap()), [11, 12]);
        assert!(cache.read(11, 1 << 20, 11).unwrap().is_empty());
        // Within max_bytes, but always one batch.
        let one = cache.read(11, 1, 100).unwrap();
        assert_eq!(offsets_in(&one), [11]);
        let batch_len = one.len();
        assert_eq!(
            offsets_in(&cache.read(11, 2 * batch_len, 100).unwrap()),
            [11, 12]
        );
        assert_eq!(
            offsets_in(&cache.read(12, 2 * batch_len, 100).unwrap()),
            [12, 13],
            "across the chunk boundary"
        );
    }

    #[test]
    fn the_budget_drops_the_oldest_chunks_and_a_gap_starts_over() {
        let chunk_len = appended(0, 4, 1000).len();
        let mut cache = TailCache::new(2 * chunk_len);
        cache.push(appended(0, 4, 1000));
        cache.push(appended(4, 4, 1000));
        cache.push(appended(8, 4, 1000));
        assert_eq!(cache.len(), 2 * chunk_len);
        assert_eq!(cache.read(3, 1 << 20, 100), None);
        assert_eq!(offsets_in(&cache.read(4, 1 << 20, 100).unwrap()).len(), 8);
        cache.drop_below(8);
        assert_eq!(cache.read(7, 1 << 20, 100), None);
        assert_eq!(cache.len(), chunk_len);
        // Not contiguous with offset 12 (a truncation happened): only the new chunk is held.
        cache.push(appended(10, 1, 10));
        assert_eq!(cache.read(8, 1 << 20, 100), None);
        assert_eq!(offsets_in(&cache.read(10, 1 << 20, 100).unwrap()), [10]);
        // One append over the whole budget is not kept.
        cache.push(appended(11, 12, 1000));
        assert!(cache.is_empty());
        assert_eq!(cache.len(), 0);
    }
}
