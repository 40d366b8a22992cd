//! The partition log: one folder of segments, owned by exactly one shard.
//!
//! Invariants:
//! - Single owner: every method takes `&mut self`; there are no locks, and no other task touches
//!   the files. Concurrency (group commit) is layered on top by [`writer`].
//! - Batches tile the offsets: segment `k + 1` starts where segment `k` ends, and every batch's
//!   base offset is the previous batch's next offset. Asserted on every append. Compaction keeps
//!   this: a cleaned batch keeps its offsets however few records it keeps (see [`cleaner`]).
//! - The `.log` files are the truth; index files are a cache, rebuilt on open where they disagree.
//! - Time is an argument (`now_ms`), never read from a clock here, so tests control it.
//! - Fail-stop: once a write or sync fails, the log refuses appends and flushes until reopened,
//!   because after a failed `fdatasync` the kernel may have dropped data that reads still return.
//!
//! [`PartitionLog`] is defined here with its accessors; its work is in one file per job:
//! `config` (what a log is set to), `error`, `append` (producers' and followers' batches,
//! segment rolls), `flush` (syncs and the durable offset), `group_commit` (which appends wait
//! for which sync, sans-IO), `read` (reads, `sendfile` regions, timestamps), `housekeeping`
//! (retention, truncation, restarts), `recovery` (opening), `checkpoints` (the files beside the
//! segments). [`writer`] is the task that owns a log: it dispatches commands and runs the syncs
//! that `group_commit` asks for.

mod append;
pub mod append_path;
mod checkpoints;
pub mod clean_plan;
pub mod cleaner;
pub mod compaction;
mod config;
mod error;
mod flush;
pub mod group_commit;
mod housekeeping;
pub mod index;
pub mod producers;
mod read;
mod recovery;
pub mod recovery_point;
mod segment;
pub mod shared_sync;
pub mod tail_cache;
mod tiering;
pub mod transactions;
pub mod writer;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use strata_wire::batch::BatchHeader;

use crate::io::Storage;
use crate::replication::EpochCache;
use append_path::LargeAppends;
use index::SegmentIndex;
use producers::ProducerStates;
use recovery_point::RecoveryPoint;
use segment::{Segment, file_name};
use tail_cache::{TailCache, TailCaches};

use self::append::Buffers;
pub use self::append::{AppendInfo, AppendSource, PlacedBatches};
pub use self::checkpoints::{
    EPOCH_FILE_NAME, HIGH_WATERMARK_FILE_NAME, PRODUCER_SNAPSHOT_FILE_NAME,
};
pub use self::clean_plan::CleanPlan;
pub use self::compaction::{CLEANER_CHECKPOINT_FILE_NAME, CompactionStatus, SwapReport};
pub use self::config::{
    CleanupPolicy, CompactionConfig, DIRECT_WRITE_MIN_BYTES, DirectWrites, FlushPolicy, LogConfig,
    PREALLOCATE_AHEAD_MIN_BYTES, PREALLOCATE_STEP_BYTES, SEGMENT_BYTES_MAX,
};
pub use self::error::LogError;
pub use self::flush::{FlushJob, FlushOutcome};
pub use self::housekeeping::{RetentionReport, StateBelow};
pub use self::read::{
    FileRead, FileRegion, PlannedRead, PlannedSend, REGION_MIN_BYTES, RegionBatch, Served,
};
pub use self::segment::SCAN_CHUNK_BYTES;
pub use self::tiering::{SegmentUpload, UploadBacklog};

/// What opening found and repaired.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Bytes cut from torn or corrupt tails.
    pub truncated_bytes: u64,
    /// Segments deleted because they followed a damaged one.
    pub dropped_segments: usize,
    pub rebuilt_index_entries: usize,
}

pub struct PartitionLog<S: Storage> {
    storage: S,
    /// Shared with reads in flight ([`FileRead`]), for their errors.
    dir: Rc<Path>,
    config: LogConfig,
    /// Sorted by base offset, contiguous; the last is the active segment. Never empty.
    segments: Vec<Segment<S::File>>,
    /// Every offset below this has been synced.
    durable_offset: u64,
    last_flush_ms: i64,
    failed: Option<String>,
    /// Reused per append so validating a request allocates nothing after warm-up.
    headers: Vec<BatchHeader>,
    index_cache: IndexCache,
    recovery_point: Option<RecoveryPoint>,
    /// Where each leader epoch begins; persisted in [`EPOCH_FILE_NAME`] before any batch of a
    /// new epoch is written, so every batch on disk has its epoch in the file.
    epochs: EpochCache,
    high_watermark_checkpoint: u64,
    /// Records below this were deleted on request (Kafka's DeleteRecords) though their segment
    /// may remain: the log starts at the larger of this and the first segment's base.
    /// Persisted in [`LOG_START_FILE_NAME`] before the delete is acknowledged.
    deleted_before: u64,
    /// The remote tier holds every record below this (0: nothing, or the log is not tiered, or
    /// this replica does not lead): with `remote_storage`, local retention stops here.
    remote_copied_before: u64,
    /// Idempotent producers' state after every batch stamped so far (applied at stamp time, so
    /// a later request of the same group sees an earlier one).
    producers: ProducerStates,
    /// The highest offset the snapshot in [`PRODUCER_SNAPSHOT_FILE_NAME`] may claim (0: none).
    /// A truncation below it must discard the file first: the snapshot would describe batches
    /// the log no longer holds.
    producer_snapshot_offset_max: u64,
    /// This log's newest appends, for readers at its end, while its own appends may bypass the
    /// page cache (`direct_writes: always`, or `auto` while they go direct); empty otherwise.
    tail_cache: TailCache,
    /// The path of this log's own appends under `direct_writes: auto`.
    own_appends: LargeAppends,
    /// The path of the batches it copies from a leader, under `direct_writes: auto` (kept apart:
    /// a leader's own appends and a follower's copies come in sizes of their own).
    replicated_appends: LargeAppends,
    /// Everything below this has been cleaned (compacted logs; see [`compaction`]). Persisted in
    /// [`CLEANER_CHECKPOINT_FILE_NAME`]; read through [`PartitionLog::clean_offset`], which
    /// keeps it within the log.
    clean_offset: u64,
    /// When the earliest tombstone or emptied transaction's marker the last clean kept may go
    /// (known after a clean of this process; see `compaction::deletes_due`).
    delete_horizon_ms: Option<i64>,
}

/// How many closed segments' indexes stay loaded.
pub const INDEX_CACHE_SEGMENTS: usize = 4;

/// Closed segments' indexes, most recently used last.
#[derive(Default)]
struct IndexCache {
    loaded: Vec<(u64, Rc<SegmentIndex>)>,
}

impl IndexCache {
    fn get(&mut self, base_offset: u64) -> Option<Rc<SegmentIndex>> {
        let at = self
            .loaded
            .iter()
            .position(|(base, _)| *base == base_offset)?;
        let hit = self.loaded.remove(at);
        self.loaded.push(hit.clone());
        Some(hit.1)
    }

    fn insert(&mut self, base_offset: u64, index: Rc<SegmentIndex>) {
        if self.loaded.len() == INDEX_CACHE_SEGMENTS {
            self.loaded.remove(0);
        }
        self.loaded.push((base_offset, index));
    }

    fn remove(&mut self, base_offset: u64) {
        self.loaded.retain(|(base, _)| *base != base_offset);
    }

    fn entries(&self) -> usize {
        self.loaded
            .iter()
            .map(|(_, index)| index.entries().len())
            .sum()
    }
}

impl<S: Storage> PartitionLog<S> {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where each leader epoch begins in this log.
    pub fn epochs(&self) -> &EpochCache {
        &self.epochs
    }

    /// The idempotent producers' state after every batch in the log.
    pub fn producers(&self) -> &ProducerStates {
        &self.producers
    }

    /// The high watermark last checkpointed (never above the log end).
    pub fn high_watermark_checkpoint(&self) -> u64 {
        self.high_watermark_checkpoint
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// New settings from the next append on: rolls, retention and flushes follow them; a
    /// segment already open keeps its handles (direct writes start or stop with the next
    /// segment if the active one has no direct handle) and its index cadence.
    pub fn reconfigure(&mut self, config: LogConfig) {
        self.config = config;
        if !self.caches_tail() {
            self.tail_cache.clear();
        }
    }

    /// Whether this log keeps its newest appends in memory: only while a leader's appends may
    /// go past the page cache, which then no longer holds what tailing readers ask for.
    fn caches_tail(&self) -> bool {
        match self.config.direct_writes {
            DirectWrites::Never | DirectWrites::Replicated => false,
            DirectWrites::Auto => self.own_appends.is_direct(),
            DirectWrites::Always => true,
        }
    }

    /// Keeps this log's newest appends within `caches`' budget (its shard's), from now on,
    /// instead of a budget of its own.
    pub fn share_tail_cache(&mut self, caches: &TailCaches) {
        self.tail_cache = caches.cache();
    }

    pub fn log_start_offset(&self) -> u64 {
        self.segments[0].base_offset.max(self.deleted_before)
    }

    /// The offset the next appended record gets.
    pub fn log_end_offset(&self) -> u64 {
        self.active().next_offset
    }

    /// Every offset below this has been made durable by a sync.
    pub fn durable_offset(&self) -> u64 {
        self.durable_offset
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|segment| segment.size).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_bases(&self) -> Vec<u64> {
        self.segments
            .iter()
            .map(|segment| segment.base_offset)
            .collect()
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Index entries held in memory: the active segment's plus the cached closed segments'.
    /// Bounded by `(1 + INDEX_CACHE_SEGMENTS) * segment_bytes / index_interval_bytes`, whatever
    /// the size of the log.
    pub fn index_entries(&self) -> usize {
        self.active().index.entries().len() + self.index_cache.entries()
    }

    /// Flushes (whatever the policy), persists indexes and the producer snapshot: a clean
    /// shutdown, after which opening scans no batch for producer state.
    pub async fn close(mut self, now_ms: i64) -> Result<(), LogError> {
        if self.failed.is_none() {
            self.flush(now_ms).await?;
            self.snapshot_producers(now_ms).await;
            // A clean close leaves files exactly as long as their data.
            if let Err(error) = self.active_mut().trim().await {
                tracing::warn!("trimming a segment to its data failed: {error}");
            }
        }
        Ok(())
    }

    /// Makes creations and removals in the partition folder durable.
    async fn sync_dir(&self) -> Result<(), LogError> {
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|source| LogError::Io {
                what: "sync",
                path: self.dir.to_path_buf(),
                source: Arc::new(source),
            })
    }

    fn segment_holding(&self, offset: u64) -> usize {
        let after = self
            .segments
            .partition_point(|segment| segment.base_offset <= offset);
        let mut at = after - 1;
        // An offset equal to a segment's end lives in the next one (if any).
        while at + 1 < self.segments.len() && self.segments[at].next_offset <= offset {
            at += 1;
        }
        at
    }

    fn segment_path(&self, base_offset: u64, extension: &str) -> PathBuf {
        self.dir.join(file_name(base_offset, extension))
    }

    fn active(&self) -> &Segment<S::File> {
        self.segments.last().expect("a log always has a segment")
    }

    fn active_mut(&mut self) -> &mut Segment<S::File> {
        self.segments
            .last_mut()
            .expect("a log always has a segment")
    }

    fn check_writable(&self) -> Result<(), LogError> {
        match &self.failed {
            Some(reason) => Err(LogError::Failed {
                dir: self.dir.to_path_buf(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Enters fail-stop and returns the error to report.
    fn fail(&mut self, reason: String) -> LogError {
        tracing::error!(dir = %self.dir.display(), "partition log stops accepting writes: {reason}");
        self.failed = Some(reason.clone());
        LogError::Failed {
            dir: self.dir.to_path_buf(),
            reason,
        }
    }
}
