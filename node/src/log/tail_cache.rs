//! The newest appends of a shard's logs, kept in memory for readers at their ends.
//!
//! A log whose appends bypass the page cache (`direct.writes`) would otherwise send every tailing
//! consumer's and follower's fetch to the disk for bytes it wrote a moment ago: the page cache
//! is what served them before. This keeps the appended buffers themselves (shared `Bytes`, no
//! copy), as Redpanda's batch cache does. Reads below what a log's cache holds go to the file.
//!
//! The memory is one budget per shard ([`TailCaches`]), not one per log: the oldest chunk on the
//! shard leaves first, whichever log holds it, so the caches cover the same last stretch of time
//! on every partition (a partition's share follows its write rate), and a shard's memory stays
//! bounded however many partitions it holds. A fixed share per log either wastes memory on idle
//! partitions or, at a few hundred MB/s, covers a reader only milliseconds behind (a fixed 16
//! MiB each did).
//!
//! Invariants: a log's chunks are contiguous in offsets (each starts where the one before ends)
//! and each holds whole batches, back to back, exactly as written. An append that does not
//! continue the log's last chunk (after a truncation, or one this log did not cache) empties
//! that log's cache first. The shard's byte count is the sum of its logs' and never exceeds the
//! budget after a push.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use bytes::Bytes;
use strata_wire::AlignedVec;
use strata_wire::batch::BatchHeader;

/// A shard's budget unless configured (`strata serve --tail-cache-bytes`), and a log's opened
/// on its own (tools, tests). At 1 GB/s on one shard it covers readers up to about 64 ms behind:
/// followers in the ISR and consumers at the tail. A larger budget serves consumers further
/// behind from memory (2 GB of pinned consumers after the pinned producer: 1.3–1.4 GB/s with
/// 16 MiB per shard, from the disk; 3.7–4.2 GB/s with 768 MiB), but memory held by the cache is
/// memory the allocator cannot hand out again, so each appended buffer until the cache is full
/// is fresh memory to fault in: the pinned producer on a fresh node ran at 1,335 / 1,660 MB/s
/// with 16 MiB per shard, 995 / 1,294 with 192 MiB and 872 / 1,230 with 768 MiB
/// (`docs/performance.md`, the tail cache's size).
pub const TAIL_CACHE_BYTES: usize = 64 << 20;

/// Reads (fetches of consumers and followers) a shard has served, by where the bytes came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadTotals {
    pub from_cache: u64,
    pub from_files: u64,
}

/// One shard's tail caches under one byte budget. Cloning shares them.
#[derive(Debug, Clone)]
pub struct TailCaches {
    shared: Rc<RefCell<Shared>>,
}

/// One log's cache, a slot of its shard's [`TailCaches`]. Dropping it frees what it holds.
#[derive(Debug)]
pub struct TailCache {
    shared: Rc<RefCell<Shared>>,
    slot: usize,
}

#[derive(Debug)]
struct Shared {
    logs: Vec<LogChunks>,
    free_slots: Vec<usize>,
    /// Every chunk pushed, oldest first, as (slot, sequence); entries whose chunk already left
    /// (a clear, retention, a freed slot) are skipped when met and swept out once they outnumber
    /// the live ones.
    order: VecDeque<(usize, u64)>,
    chunks_held: usize,
    bytes: usize,
    budget: usize,
    next_sequence: u64,
    /// Reads of the logs sharing these caches, by where they were served from.
    reads: ReadTotals,
}

#[derive(Debug, Default)]
struct LogChunks {
    chunks: VecDeque<Chunk>,
    bytes: usize,
}

#[derive(Debug)]
struct Chunk {
    /// Shard-wide push order: a log's chunks have increasing sequences, and a slot's next
    /// owner's chunks have larger ones than its last owner's.
    sequence: u64,
    base_offset: u64,
    next_offset: u64,
    bytes: Bytes,
}

impl TailCaches {
    pub fn new(budget: usize) -> TailCaches {
        TailCaches {
            shared: Rc::new(RefCell::new(Shared {
                logs: Vec::new(),
                free_slots: Vec::new(),
                order: VecDeque::new(),
                chunks_held: 0,
                bytes: 0,
                budget,
                next_sequence: 0,
                reads: ReadTotals::default(),
            })),
        }
    }

    /// A cache for one more log.
    pub fn cache(&self) -> TailCache {
        let mut shared = self.shared.borrow_mut();
        let slot = match shared.free_slots.pop() {
            Some(slot) => slot,
            None => {
                shared.logs.push(LogChunks::default());
                shared.logs.len() - 1
            }
        };
        TailCache {
            shared: Rc::clone(&self.shared),
            slot,
        }
    }

    /// Bytes held by all of this shard's logs.
    /// Reads the logs sharing these caches served so far (for `/metrics`).
    pub fn read_totals(&self) -> ReadTotals {
        self.shared.borrow().reads
    }

    pub fn len(&self) -> usize {
        self.shared.borrow().bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shared {
    fn clear(&mut self, slot: usize) {
        let log = &mut self.logs[slot];
        let (bytes, chunks) = (log.bytes, log.chunks.len());
        log.chunks.clear();
        log.bytes = 0;
        self.chunks_held -= chunks;
        self.bytes -= bytes;
    }

    fn pop_oldest(&mut self, slot: usize) {
        let log = &mut self.logs[slot];
        let oldest = log.chunks.pop_front().expect("a chunk to drop");
        log.bytes -= oldest.bytes.len();
        self.chunks_held -= 1;
        self.bytes -= oldest.bytes.len();
    }

    /// Whether the chunk `order` knows as (slot, sequence) is still held.
    fn holds_chunk(&self, slot: usize, sequence: u64) -> bool {
        holds_chunk(&self.logs, slot, sequence)
    }

    fn push(&mut self, slot: usize, batches: Bytes) {
        let Some((base_offset, next_offset)) = offsets(&batches) else {
            return;
        };
        if self.logs[slot]
            .chunks
            .back()
            .is_some_and(|last| last.next_offset != base_offset)
        {
            self.clear(slot);
        }
        if batches.len() > self.budget {
            // One append larger than the whole budget: keeping it would break the bound, and
            // what the log held before no longer reaches its end.
            self.clear(slot);
            return;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let len = batches.len();
        let log = &mut self.logs[slot];
        log.bytes += len;
        log.chunks.push_back(Chunk {
            sequence,
            base_offset,
            next_offset,
            bytes: batches,
        });
        self.chunks_held += 1;
        self.bytes += len;
        self.order.push_back((slot, sequence));
        while self.bytes > self.budget {
            let (oldest_slot, oldest_sequence) = self
                .order
                .pop_front()
                .expect("held chunks are in the order");
            if self.holds_chunk(oldest_slot, oldest_sequence) {
                debug_assert_eq!(
                    self.logs[oldest_slot].chunks.front().map(|c| c.sequence),
                    Some(oldest_sequence),
                    "a log's chunks leave oldest first"
                );
                self.pop_oldest(oldest_slot);
            }
        }
        if self.order.len() > 2 * self.chunks_held + 1024 {
            let logs = &self.logs;
            self.order
                .retain(|&(slot, sequence)| holds_chunk(logs, slot, sequence));
        }
        debug_assert!(self.bytes <= self.budget);
    }
}

/// Whether `logs[slot]` still holds the chunk pushed as `sequence`: a log's chunks leave oldest
/// first, and a slot's later owners push larger sequences.
fn holds_chunk(logs: &[LogChunks], slot: usize, sequence: u64) -> bool {
    logs[slot]
        .chunks
        .front()
        .is_some_and(|oldest| oldest.sequence <= sequence)
}

impl Drop for TailCache {
    fn drop(&mut self) {
        let mut shared = self.shared.borrow_mut();
        shared.clear(self.slot);
        shared.free_slots.push(self.slot);
    }
}

impl TailCache {
    /// Counts one read of this log, served from the cache or from its segment files, in the
    /// totals of the caches it shares.
    pub fn count_read(&self, from_cache: bool) {
        let reads = &mut self.shared.borrow_mut().reads;
        if from_cache {
            reads.from_cache += 1;
        } else {
            reads.from_files += 1;
        }
    }

    /// A cache of its own with `budget` bytes (a log not on a broker's shard).
    pub fn new(budget: usize) -> TailCache {
        TailCaches::new(budget).cache()
    }

    pub fn clear(&mut self) {
        self.shared.borrow_mut().clear(self.slot);
    }

    /// Bytes this log holds.
    pub fn len(&self) -> usize {
        self.shared.borrow().logs[self.slot].bytes
    }

    pub fn is_empty(&self) -> bool {
        self.shared.borrow().logs[self.slot].chunks.is_empty()
    }

    /// Keeps `batches` (whole stamped batches, back to back, as appended), the shard's oldest
    /// chunks leaving once its budget is exceeded. Batches that do not continue this log's
    /// newest chunk start its cache over.
    pub fn push(&mut self, batches: Bytes) {
        self.shared.borrow_mut().push(self.slot, batches);
    }

    /// Forgets chunks wholly below `log_start` (retention deleted their segments).
    pub fn drop_below(&mut self, log_start: u64) {
        let mut shared = self.shared.borrow_mut();
        while shared.logs[self.slot]
            .chunks
            .front()
            .is_some_and(|oldest| oldest.next_offset <= log_start)
        {
            shared.pop_oldest(self.slot);
        }
    }

    /// Whether the batch holding `offset` is here (a read from it would be served from memory).
    pub fn holds(&self, offset: u64) -> bool {
        let shared = self.shared.borrow();
        let chunks = &shared.logs[self.slot].chunks;
        match (chunks.front(), chunks.back()) {
            (Some(first), Some(last)) => first.base_offset <= offset && offset < last.next_offset,
            _ => false,
        }
    }

    /// Whole batches from the one holding `offset` on, ending before any batch that reaches past
    /// `max_offset`, within `max_bytes` (but at least one batch): what a read of the file would
    /// return. `None` when `offset` is not held. Zero-copy within one chunk; batches from several
    /// chunks are copied into one aligned buffer.
    pub fn read(&self, offset: u64, max_bytes: usize, max_offset: u64) -> Option<Bytes> {
        let shared = self.shared.borrow();
        let chunks = &shared.logs[self.slot].chunks;
        let first = chunks.front()?;
        let last = chunks.back()?;
        if offset < first.base_offset || offset >= last.next_offset {
            return None;
        }
        let mut at = chunks.partition_point(|chunk| chunk.next_offset <= offset);
        // (chunk index, start, end) of the bytes to return, in order.
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        let mut taken = 0usize;
        'chunks: while let Some(chunk) = chunks.get(at) {
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
            [(at, start, end)] => chunks[*at].bytes.slice(*start..*end),
            _ => {
                let mut joined = AlignedVec::<16>::with_capacity(taken);
                for (at, start, end) in spans {
                    joined.extend_from_slice(&chunks[at].bytes[start..end]);
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

    #[test]
    fn a_shards_logs_share_one_budget_and_its_oldest_chunk_leaves_first() {
        let chunk_len = appended(0, 4, 1000).len();
        let caches = TailCaches::new(3 * chunk_len);
        let mut a = caches.cache();
        let mut b = caches.cache();
        a.push(appended(0, 4, 1000));
        b.push(appended(100, 4, 1000));
        a.push(appended(4, 4, 1000));
        assert_eq!(caches.len(), 3 * chunk_len);
        // Over the budget: the shard's oldest chunk goes, though another log made the push.
        b.push(appended(104, 4, 1000));
        assert!(!a.holds(0) && a.holds(4));
        assert!(b.holds(100) && b.holds(104));
        a.push(appended(8, 4, 1000));
        assert!(
            !b.holds(100) && b.holds(104),
            "b's first chunk was the oldest"
        );
        assert_eq!((a.len(), b.len()), (2 * chunk_len, chunk_len));
        // A log's own busy writes take the whole budget from an idle one in time.
        a.push(appended(12, 4, 1000));
        a.push(appended(16, 4, 1000));
        assert!(b.is_empty());
        assert_eq!(offsets_in(&a.read(8, 1 << 20, 100).unwrap()).len(), 12);
        // Cleared and dropped logs give their bytes back; their entries are skipped later.
        a.clear();
        assert!(caches.is_empty());
        b.push(appended(200, 4, 1000));
        drop(b);
        assert!(caches.is_empty());
        // A reused slot starts empty and is not mistaken for its last owner.
        let mut c = caches.cache();
        assert!(!c.holds(200));
        for i in 0..4 {
            c.push(appended(300 + 4 * i, 4, 1000));
        }
        assert_eq!(c.len(), 3 * chunk_len);
        assert!(!c.holds(300) && c.holds(304));
    }

    #[test]
    fn entries_of_chunks_gone_are_swept_out() {
        let chunk_len = appended(0, 1, 10).len();
        let caches = TailCaches::new(100 * chunk_len);
        let mut cache = caches.cache();
        for i in 0..10_000 {
            cache.push(appended(i, 1, 10));
            if i % 2 == 1 {
                cache.clear();
            }
        }
        let order = caches.shared.borrow().order.len();
        assert!(
            order <= 1024 + 2,
            "{order} entries for at most one live chunk"
        );
    }
}
