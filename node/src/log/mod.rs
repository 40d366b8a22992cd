//! The partition log: one folder of segments, owned by exactly one shard.
//!
//! Invariants:
//! - Single owner: every method takes `&mut self`; there are no locks, and no other task touches
//!   the files. Concurrency (group commit) is layered on top by [`writer`].
//! - Offsets are dense and contiguous: segment `k + 1` starts where segment `k` ends, and every
//!   batch's base offset is the previous batch's next offset. Asserted on every append.
//! - The `.log` files are the truth; index files are a cache, rebuilt on open where they disagree.
//! - Time is an argument (`now_ms`), never read from a clock here, so tests control it.
//! - Fail-stop: once a write or sync fails, the log refuses appends and flushes until reopened,
//!   because after a failed `fdatasync` the kernel may have dropped data that reads still return.

pub mod append_path;
pub mod checkpoint;
pub mod index;
pub mod producers;
mod segment;
pub mod shared_sync;
pub mod tail_cache;
pub mod writer;

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use strata_wire::batch::{self, Batch, BatchError, BatchHeader};

use crate::io::{DIRECT_BLOCK, Storage, StorageFile};
use crate::replication::EpochCache;
use append_path::LargeAppends;
use checkpoint::{RecoveryPoint, Trust};
use index::SegmentIndex;
use producers::{ProducerError, ProducerStates, SequenceCheck};
use segment::{SCAN_CHUNK_BYTES, Segment, file_name, parse_base_offset, read_whole};
use strata_wire::AlignedVec;
use tail_cache::{TAIL_CACHE_BYTES, TailCache, TailCaches};

/// When appended data is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// `fdatasync` before acknowledging; concurrent appends share one sync (group commit).
    Always,
    /// `fdatasync` at most every `interval_ms`.
    Interval { interval_ms: u64 },
    /// Never sync explicitly; rely on replication and the kernel's writeback.
    Never,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Roll to a new segment before one would grow past this (a single larger batch still fits).
    pub segment_bytes: u64,
    /// Roll a non-empty segment this long after it was opened.
    pub segment_ms: Option<i64>,
    /// One index entry per this many bytes of batches.
    pub index_interval_bytes: u32,
    /// Delete closed segments whose newest record is older than this.
    pub retention_ms: Option<i64>,
    /// Delete the oldest closed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    pub flush: FlushPolicy,
    /// Reserve a new segment's blocks up front (fewer extent allocations, less fragmentation).
    pub preallocate: bool,
    /// Reserve the active segment's blocks this many bytes at a time ahead of its appends (0:
    /// not at all; see [`PREALLOCATE_STEP_BYTES`]). Unused with `preallocate`, which reserves
    /// the whole segment at once.
    pub preallocate_step_bytes: u64,
    /// Which appends bypass the page cache (see [`DirectWrites`]).
    pub direct_writes: DirectWrites,
    /// Appends smaller than this go through the page cache even where `direct_writes` would
    /// send them direct (see [`DIRECT_WRITE_MIN_BYTES`]); under `auto`, the average append size
    /// below which appends go back to the page cache (see [`append_path`]).
    pub direct_write_min_bytes: u64,
}

/// The default [`LogConfig::direct_write_min_bytes`]. A direct write waits for the disk: on
/// a 2-core cloud VM (docs/performance.md) a follower's 40 KB append took 0.7 ms (p50; 2.7 ms
/// p99) against tens of microseconds into the page cache, which put that much on every
/// `acks=all` round trip at moderate load. Large appends are where the page-cache copy costs
/// more than the disk's latency (about 3.5 µs per KiB into never-used memory there), so only
/// they go direct: a follower catching up, or keeping up with a high rate, writes direct; one
/// keeping up with a moderate rate writes small answers through the page cache.
pub const DIRECT_WRITE_MIN_BYTES: u64 = 256 << 10;

/// The default [`LogConfig::preallocate_step_bytes`] (Redpanda's `segment_fallocation_step`).
/// An append into blocks not yet allocated leaves ext4 to allocate them when it writes the
/// pages back (delayed allocation). While the kernel's flusher does that for a file, it holds
/// the file's block-map lock, which the next buffered append to the file takes too: that
/// append, and with it the shard thread and every partition and connection on it, slept behind
/// writeback, 3 to 18 times in 4 s for up to 34 ms each (`perf` `sched_switch`, one node at
/// 300,000 records/s of 1 KiB). Into reserved blocks an append allocates nothing: no such
/// sleep in six runs of the same load. (An append that lengthens the file into reserved
/// blocks still takes that lock briefly, to move the on-disk size; with writeback hinted every
/// MiB those waits were 2-4 per run of 0.4-1 ms.)
pub const PREALLOCATE_STEP_BYTES: u64 = 32 << 20;

/// The least a segment reserves ahead of its appends. The reservation grows with the segment
/// (as far ahead as the segment already holds, rounded up to a power of two, up to the step),
/// so a partition that holds little reserves little. At a whole step from the first append,
/// one node with a topic of 1,000 partitions and 20,000 keyed records filled 42 GB of free
/// disk with reserved blocks. At this floor each such partition reserves at most twice the
/// floor (512 KiB); a busy partition reaches the whole step after a few MiB, in a handful of
/// `fallocate` calls.
pub const PREALLOCATE_AHEAD_MIN_BYTES: u64 = 256 << 10;

/// Which appends are written past the page cache (`O_DIRECT`), from a block-aligned copy of
/// the batches straight to the disk.
///
/// A write through the page cache copies every byte into kernel pages, and when those pages are
/// new to the process that copy is the write path's main cost: on a 2-core cloud VM, 2 GB
/// written with `dd` took 7 s of CPU through the page cache and 0.3–0.4 s with `O_DIRECT`
/// (1.9 s wall), and a follower's catch-up spent 47% of the machine in that copy. The cost of
/// going direct is that the data is not in the page cache afterwards, so a read of it goes to
/// the disk: right for a follower (nobody reads a follower's log until it leads), a choice for
/// a leader whose consumers read from the tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectWrites {
    /// Every append goes through the page cache.
    Never,
    /// Batches a follower copies from its leader go direct; the leader's own appends do not.
    Replicated,
    /// A leader's appends go direct while its producers' appends are large (see
    /// [`append_path`]), all of them then, whatever each one's size; a follower's while the
    /// batches it copies arrive in large appends, chosen the same way on their own.
    Auto,
    /// Every append goes direct.
    Always,
    // With `Replicated` and `Always`: only appends of at least
    // `LogConfig::direct_write_min_bytes`.
}

impl DirectWrites {
    pub fn name(self) -> &'static str {
        match self {
            DirectWrites::Never => "never",
            DirectWrites::Replicated => "replicated",
            DirectWrites::Auto => "auto",
            DirectWrites::Always => "always",
        }
    }

    pub fn parse(value: &str) -> Option<DirectWrites> {
        match value {
            "never" => Some(DirectWrites::Never),
            "replicated" => Some(DirectWrites::Replicated),
            "auto" => Some(DirectWrites::Auto),
            "always" => Some(DirectWrites::Always),
            _ => None,
        }
    }
}

/// The largest segment a `u32` file position can address.
pub const SEGMENT_BYTES_MAX: u64 = u32::MAX as u64;

/// See `PartitionLog::hint_writeback`.
const WRITEBACK_CHUNK_BYTES: u64 = 1 << 20;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: Some(7 * 24 * 3600 * 1000),
            index_interval_bytes: 4096,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            retention_bytes: None,
            flush: FlushPolicy::Interval { interval_ms: 1000 },
            preallocate: false,
            preallocate_step_bytes: PREALLOCATE_STEP_BYTES,
            direct_writes: DirectWrites::Auto,
            direct_write_min_bytes: DIRECT_WRITE_MIN_BYTES,
        }
    }
}

/// Smallest read sent from the file (`sendfile`) instead of memory: below it, the header
/// reads and the descriptor cost more than the copy they save.
pub const REGION_MIN_BYTES: usize = 256 << 10;
/// Batch headers a file region is looked for through; logs of smaller batches are read.
const REGION_HEADERS_MAX: usize = 128;
/// Headers read before judging whether the batches are large enough for a region.
const REGION_HEADERS_PROBE: usize = 8;

/// What a read for sending found: bytes in memory, or a range of a segment file.
#[derive(Debug)]
pub enum Served {
    Bytes(Bytes),
    Region(FileRegion),
}

/// Whole batches as a range of a segment file, with a descriptor of the file of its own (so the
/// range can be sent from another task or shard, and a segment deleted meanwhile stays
/// readable). A truncation of the file before the range is sent shortens what `sendfile`
/// finds; the sender must then drop the connection, as the frame cannot be completed.
#[derive(Debug)]
pub struct FileRegion {
    pub file: std::os::fd::OwnedFd,
    pub position: u64,
    pub len: usize,
    /// Records in the range, and the newest timestamp among them.
    pub records: u64,
    pub newest_ms: Option<i64>,
}

/// Operating errors of the log. Programmer errors are assertions instead.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Batch `index` of an append failed validation; nothing of that append was written.
    #[error("batch {index} of the append is invalid: {source}")]
    CorruptBatch { index: usize, source: BatchError },
    /// A replicated batch does not continue the log.
    #[error("replicated batch starts at offset {got}, the log ends at {expected}")]
    NotContiguous { expected: u64, got: u64 },
    #[error("offset {requested} is outside the log [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: u64,
        log_start: u64,
        log_end: u64,
    },
    /// A write or sync failed earlier; the log accepts no more writes until it is reopened.
    #[error("log {dir} stopped after an IO failure: {reason}")]
    Failed { dir: PathBuf, reason: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("invalid log configuration: {0}")]
    Config(String),
    /// An append carries an older leader epoch than the log already holds: it comes from a
    /// leader that has been replaced.
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleEpoch { epoch: u32, latest: u32 },
    /// An idempotent request breaks the producer rules before sequences are even compared: it
    /// holds more than one batch (Kafka allows exactly one per partition), or a negative
    /// producer id, epoch or sequence. Nothing of it was written.
    #[error("invalid idempotent produce: {0}")]
    InvalidProducerBatch(String),
    /// An idempotent batch breaks its producer's sequence or comes from a fenced epoch
    /// (see [`ProducerError`]). Nothing was written.
    #[error(transparent)]
    Producer(#[from] ProducerError),
}

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: u64,
    pub last_offset: u64,
    pub max_timestamp_ms: i64,
    pub bytes: u64,
    /// The request was a retry of an idempotent batch the log already holds: nothing was
    /// written, and the offsets are the original batch's (`bytes` is 0).
    pub duplicate: bool,
}

/// How [`PartitionLog::stamp_request`] left a request.
enum Stamped {
    /// Stamped and to be written; the log end after it.
    Next(u64),
    /// A retried idempotent batch: not to be written, answered with the original's offsets.
    Duplicate(AppendInfo),
}

/// A sync in progress: the files written since the last one, and the offset they make durable.
pub struct FlushJob<F> {
    target_offset: u64,
    point: RecoveryPoint,
    files: Vec<(u64, Rc<F>)>,
}

/// How a [`FlushJob`] ended; hand it back to [`PartitionLog::complete_flush`].
pub struct FlushOutcome {
    target_offset: u64,
    point: RecoveryPoint,
    /// The segment whose sync failed, and why.
    failure: Option<(u64, io::Error)>,
}

impl<F: StorageFile> FlushJob<F> {
    pub fn target_offset(&self) -> u64 {
        self.target_offset
    }

    /// Whether running the job syncs any file (a log with nothing unsynced has none).
    pub fn syncs_files(&self) -> bool {
        !self.files.is_empty()
    }

    pub async fn run(self) -> FlushOutcome {
        for (base, file) in &self.files {
            if let Err(error) = file.sync_data().await {
                return FlushOutcome {
                    target_offset: self.target_offset,
                    point: self.point,
                    failure: Some((*base, error)),
                };
            }
        }
        FlushOutcome {
            target_offset: self.target_offset,
            point: self.point,
            failure: None,
        }
    }
}

impl AppendInfo {
    /// Summarises the stamped headers of one request.
    fn of(headers: &[BatchHeader]) -> AppendInfo {
        let first = headers.first().expect("a request has a batch");
        let last = headers.last().expect("a request has a batch");
        AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset(),
            max_timestamp_ms: headers
                .iter()
                .map(|h| h.max_timestamp_ms)
                .max()
                .unwrap_or(i64::MIN),
            bytes: headers.iter().map(|h| u64::from(h.batch_len)).sum(),
            duplicate: false,
        }
    }
}

/// What one write puts on disk: one request's bytes, a group's, or replicated batches received
/// where a direct write wants them.
enum Buffers {
    One(Bytes),
    Many(Vec<Bytes>),
    Placed(PlacedBatches),
}

impl Buffers {
    fn len(&self) -> u64 {
        self.slices().map(|b| b.len() as u64).sum()
    }

    fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let (one, many): (Option<&[u8]>, &[Bytes]) = match self {
            Buffers::One(bytes) => (Some(bytes), &[]),
            Buffers::Many(buffers) => (None, buffers),
            Buffers::Placed(placed) => (Some(placed.batches()), &[]),
        };
        one.into_iter().chain(many.iter().map(|bytes| &bytes[..]))
    }
}

/// Replicated batches read straight into a block-aligned buffer, at `batches.start`, with room
/// before them for the segment's partial last block and after them for the padding: when
/// `batches.start % DIRECT_BLOCK` is where the segment's data ends within its last block (the
/// follower predicts it, [`PartitionLog::direct_phase`]), a direct write of them needs no copy
/// of the batches. Otherwise they are written as any other bytes.
pub struct PlacedBatches {
    buf: AlignedVec<DIRECT_BLOCK>,
    batches: std::ops::Range<usize>,
}

impl PlacedBatches {
    /// `buf[batches]` holds the batches; nothing follows them. The buffer should have a block
    /// of spare capacity for the padding: without it, it grows here (a copy).
    pub fn new(
        mut buf: AlignedVec<DIRECT_BLOCK>,
        batches: std::ops::Range<usize>,
    ) -> PlacedBatches {
        assert_eq!(batches.end, buf.len(), "the batches end the buffer");
        buf.reserve(DIRECT_BLOCK);
        PlacedBatches { buf, batches }
    }

    pub fn batches(&self) -> &[u8] {
        &self.buf[self.batches.clone()]
    }

    /// The batches as `Bytes`, without a copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self.buf).slice(self.batches)
    }
}

impl LogError {
    /// A copy for each of several waiters (io::Error is not Clone; its kind and text are kept).
    pub fn duplicate(&self) -> LogError {
        match self {
            LogError::CorruptBatch { index, source } => LogError::CorruptBatch {
                index: *index,
                source: source.clone(),
            },
            LogError::StaleEpoch { epoch, latest } => LogError::StaleEpoch {
                epoch: *epoch,
                latest: *latest,
            },
            LogError::NotContiguous { expected, got } => LogError::NotContiguous {
                expected: *expected,
                got: *got,
            },
            LogError::OffsetOutOfRange {
                requested,
                log_start,
                log_end,
            } => LogError::OffsetOutOfRange {
                requested: *requested,
                log_start: *log_start,
                log_end: *log_end,
            },
            LogError::Failed { dir, reason } => LogError::Failed {
                dir: dir.clone(),
                reason: reason.clone(),
            },
            LogError::Io { what, path, source } => LogError::Io {
                what,
                path: path.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            LogError::Config(text) => LogError::Config(text.clone()),
            LogError::InvalidProducerBatch(text) => LogError::InvalidProducerBatch(text.clone()),
            LogError::Producer(error) => LogError::Producer(*error),
        }
    }
}

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

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
}

/// A read planned by [`PartitionLog::plan_read`].
pub enum PlannedRead<F> {
    /// Answered without IO (from the tail cache, or nothing to read).
    Ready(Bytes),
    /// Answered from a segment file: run it.
    File(FileRead<F>),
}

/// The file IO of a read, with what it needs of the log taken along: the segment's file (shared:
/// a segment deleted meanwhile stays readable, as with `sendfile`), its data size when planned
/// (bytes below it do not change while the log appends), and where to start.
pub struct FileRead<F> {
    log: Rc<F>,
    size: u64,
    base_offset: u64,
    dir: Rc<Path>,
    /// A batch start at or before the batch holding `offset`.
    start: u64,
    /// How much to read first.
    window: usize,
    offset: u64,
    max_bytes: usize,
    max_offset: u64,
}

impl<F: StorageFile> FileRead<F> {
    /// Reads and returns whole batches as [`PartitionLog::read`] describes.
    pub async fn run(self) -> Result<Bytes, LogError> {
        let FileRead {
            log,
            size,
            base_offset,
            dir,
            start,
            window,
            offset,
            max_bytes,
            max_offset,
        } = self;
        // The path is made only for an error: a read is on every fetch's path.
        let read_at = |position: u64, len: usize| {
            let (log, dir) = (&log, &dir);
            async move {
                segment::read_file(log.as_ref(), size, position, len)
                    .await
                    .map_err(|source| LogError::Io {
                        what: "read",
                        path: dir.join(file_name(base_offset, "log")),
                        source,
                    })
            }
        };
        // Walk batch headers from the index entry: skip batches below `offset` (their bytes need
        // not be in the chunk), then take whole batches while the budget allows.
        let mut chunk = read_at(start, window).await?;
        let mut chunk_position = start;
        let mut position = start;
        let mut first: Option<usize> = None;
        while position < size {
            let at = (position - chunk_position) as usize;
            let rest = chunk.get(at..).unwrap_or_default();
            if rest.is_empty() && first.is_some() {
                break; // the window ended at a batch start (the index's)
            }
            let header = match BatchHeader::parse(rest) {
                Ok(header) => header,
                Err(_) if first.is_none() && rest.len() < batch::HEADER_LEN => {
                    chunk = read_at(position, window).await?;
                    chunk_position = position;
                    continue;
                }
                Err(error) => {
                    // Batches were validated before they were written; a bad header here means
                    // the file changed underneath us (a truncation since the read was planned).
                    tracing::error!(dir = %dir.display(), "unreadable batch header at position {position}: {error}");
                    break;
                }
            };
            let batch_len = header.batch_len as usize;
            if header.next_offset() > max_offset {
                break;
            }
            if header.next_offset() <= offset {
                position += batch_len as u64;
                continue;
            }
            if let Some(first) = first
                && at - first + batch_len > max_bytes
            {
                break;
            }
            if batch_len > rest.len() {
                if first.is_some() {
                    break;
                }
                // The first wanted batch does not fit the window: read exactly it and the budget.
                chunk = read_at(position, batch_len.max(max_bytes)).await?;
                chunk_position = position;
                continue;
            }
            first.get_or_insert(at);
            position += batch_len as u64;
        }
        Ok(match first {
            Some(first) => chunk.slice(first..(position - chunk_position) as usize),
            None => Bytes::new(),
        })
    }
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
    recovery_file: S::File,
    recovery_point: Option<RecoveryPoint>,
    /// Where each leader epoch begins; persisted in [`EPOCH_FILE_NAME`] before any batch of a
    /// new epoch is written, so every batch on disk has its epoch in the file.
    epochs: EpochCache,
    high_watermark_file: S::File,
    high_watermark_checkpoint: u64,
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
}

/// The leader-epoch checkpoint inside the partition folder.
pub const EPOCH_FILE_NAME: &str = "leader-epoch-checkpoint";
/// The high watermark checkpoint inside the partition folder.
pub const HIGH_WATERMARK_FILE_NAME: &str = "high-watermark";
/// The idempotent-producer snapshot inside the partition folder (see [`producers`]).
pub const PRODUCER_SNAPSHOT_FILE_NAME: &str = "producer-snapshot";

fn encode_high_watermark(high_watermark: u64) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&high_watermark.to_le_bytes());
    let crc = strata_wire::crc32c(&bytes[..8]);
    bytes[8..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn decode_high_watermark(bytes: &[u8]) -> Option<u64> {
    let bytes: &[u8; 12] = bytes.get(..12)?.try_into().ok()?;
    let crc = u32::from_le_bytes(bytes[8..].try_into().ok()?);
    (strata_wire::crc32c(&bytes[..8]) == crc)
        .then(|| u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
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
    /// Opens (creating if needed) the log in `dir` and repairs what a crash left behind.
    pub async fn open(
        storage: S,
        dir: impl Into<PathBuf>,
        config: LogConfig,
        now_ms: i64,
    ) -> Result<(PartitionLog<S>, RecoveryReport), LogError> {
        let dir = dir.into();
        if config.segment_bytes == 0 || config.segment_bytes > SEGMENT_BYTES_MAX {
            return Err(LogError::Config(format!(
                "segment_bytes must be in 1..={SEGMENT_BYTES_MAX}"
            )));
        }
        if config.index_interval_bytes == 0 {
            return Err(LogError::Config("index_interval_bytes must be > 0".into()));
        }
        let io_error = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| LogError::Io { what, path, source }
        };
        storage
            .create_dir_all(&dir)
            .await
            .map_err(io_error("create", &dir))?;
        let mut bases: Vec<u64> = storage
            .list_dir(&dir)
            .await
            .map_err(io_error("list", &dir))?
            .iter()
            .filter_map(|name| parse_base_offset(name, "log"))
            .collect();
        bases.sort_unstable();

        let recovery_path = dir.join(checkpoint::FILE_NAME);
        let recovery_file = storage
            .open(&recovery_path, true)
            .await
            .map_err(io_error("open", &recovery_path))?;
        let recovery_point = read_whole(&recovery_file)
            .await
            .ok()
            .and_then(|bytes| RecoveryPoint::decode(bytes.as_slice()));
        // The epoch checkpoint and the producer snapshot are written rarely (a new epoch, a
        // roll): they are opened when used, not held (a broker's descriptors go to segments).
        // Both are created here, before the folder's sync that a new partition's first segment
        // makes, so that their first write later needs no folder sync of its own.
        let epoch_path = dir.join(EPOCH_FILE_NAME);
        let epoch_file = storage
            .open(&epoch_path, true)
            .await
            .map_err(io_error("open", &epoch_path))?;
        let epochs = read_whole(&epoch_file)
            .await
            .ok()
            .and_then(|bytes| EpochCache::decode(bytes.as_slice()));
        drop(epoch_file);
        let producer_path = dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        drop(
            storage
                .open(&producer_path, true)
                .await
                .map_err(io_error("open", &producer_path))?,
        );
        let high_watermark_path = dir.join(HIGH_WATERMARK_FILE_NAME);
        let high_watermark_file = storage
            .open(&high_watermark_path, true)
            .await
            .map_err(io_error("open", &high_watermark_path))?;
        let high_watermark_checkpoint = read_whole(&high_watermark_file)
            .await
            .ok()
            .and_then(|bytes| decode_high_watermark(bytes.as_slice()))
            .unwrap_or(0);
        let epochs_trusted = epochs.is_some();
        let mut log = PartitionLog {
            producers: ProducerStates::default(),
            producer_snapshot_offset_max: 0,
            epochs: epochs.unwrap_or_default(),
            high_watermark_file,
            high_watermark_checkpoint,
            recovery_file,
            recovery_point,
            storage,
            dir: Rc::from(dir),
            config,
            segments: Vec::new(),
            durable_offset: 0,
            last_flush_ms: now_ms,
            failed: None,
            headers: Vec::new(),
            index_cache: IndexCache::default(),
            tail_cache: TailCache::new(TAIL_CACHE_BYTES),
            own_appends: LargeAppends::default(),
            replicated_appends: LargeAppends::default(),
        };
        let mut report = RecoveryReport::default();
        let count = bases.len();
        let mut validated_any = false;
        for (at, &base) in bases.iter().enumerate() {
            let active = at + 1 == count;
            let trust = checkpoint::trust(base, recovery_point);
            validated_any |= trust != Trust::Whole;
            if let Some(previous) = log.segments.last()
                && previous.next_offset != base
            {
                tracing::error!(
                    dir = %log.dir.display(),
                    "segment {base} does not continue the log (previous ends at {}); dropping it and every later segment",
                    previous.next_offset
                );
                for &drop_base in &bases[at..] {
                    log.remove_segment_files(drop_base).await?;
                    report.dropped_segments += 1;
                }
                break;
            }
            let (segment, damaged) = log
                .recover_segment(base, trust, now_ms, &mut report)
                .await?;
            log.segments.push(segment);
            if damaged && !active {
                // Later segments would follow a hole: they go.
                for &drop_base in &bases[at + 1..] {
                    log.remove_segment_files(drop_base).await?;
                    report.dropped_segments += 1;
                }
                break;
            }
        }
        if log.segments.is_empty() {
            let segment = log.create_segment(0, now_ms).await?;
            log.segments.push(segment);
            validated_any = true;
        }
        // Closed segments keep no index in memory (see `index_entry`).
        let closed = log.segments.len() - 1;
        for segment in &mut log.segments[..closed] {
            segment.index = SegmentIndex::default();
        }
        report.segments = log.segments.len();
        if validated_any {
            // What recovery validated may still sit in the page cache only (the process, not the
            // machine, crashed): sync it, then move the recovery point past it.
            for segment in &mut log.segments {
                segment.dirty = true;
            }
            log.flush(now_ms).await?;
        }
        log.durable_offset = log.log_end_offset();
        if !epochs_trusted && log.log_end_offset() > log.log_start_offset() {
            log.rebuild_epochs().await?;
        }
        // Epochs whose batches did not survive the crash.
        if log.epochs.truncate_from(log.log_end_offset()) {
            log.persist_epochs().await?;
        }
        log.high_watermark_checkpoint = log.high_watermark_checkpoint.min(log.log_end_offset());
        log.rebuild_producers(now_ms).await?;
        tracing::info!(
            dir = %log.dir.display(),
            segments = report.segments,
            log_start = log.log_start_offset(),
            log_end = log.log_end_offset(),
            truncated_bytes = report.truncated_bytes,
            "partition log opened"
        );
        Ok((log, report))
    }

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

    /// Records the high watermark so a restarted replica does not start from zero. Not synced:
    /// a lost checkpoint only makes the new high watermark start lower.
    pub async fn checkpoint_high_watermark(&mut self, high_watermark: u64) {
        let high_watermark = high_watermark.min(self.log_end_offset());
        if high_watermark == self.high_watermark_checkpoint {
            return;
        }
        self.high_watermark_checkpoint = high_watermark;
        let bytes = Bytes::copy_from_slice(&encode_high_watermark(high_watermark));
        if let Err(error) = self.high_watermark_file.write_all_at(bytes, 0).await {
            tracing::warn!(dir = %self.dir.display(), "writing the high watermark failed: {error}");
        }
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
        self.segments[0].base_offset
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

    /// Looks something up in segment `at`'s index: the active segment's lives in memory; a closed
    /// segment's is read from its index files into a small cache, so memory does not grow with
    /// the number of segments.
    async fn index_entry<T>(
        &mut self,
        at: usize,
        find: impl Fn(&SegmentIndex) -> T,
    ) -> Result<T, LogError> {
        if at + 1 == self.segments.len() {
            return Ok(find(&self.segments[at].index));
        }
        let base = self.segments[at].base_offset;
        if let Some(index) = self.index_cache.get(base) {
            return Ok(find(&index));
        }
        let index = self.load_index_of(at).await?;
        let found = find(&index);
        self.index_cache.insert(base, Rc::new(index));
        Ok(found)
    }

    /// Validates `batches` (one or more whole batches, back to back, as a producer sent them),
    /// stamps consecutive base offsets and `leader_epoch` into them in place, and writes them
    /// with one IO. Nothing is written if any batch is invalid. Does not sync: see [`Self::flush`].
    pub async fn append(
        &mut self,
        mut batches: BytesMut,
        leader_epoch: u32,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.check_writable()?;
        self.headers.clear();
        let stamped = self.stamp_request(&mut batches, leader_epoch, self.log_end_offset())?;
        if let Stamped::Duplicate(info) = stamped {
            return Ok(info);
        }
        self.write_batches(Buffers::One(batches.freeze()), false, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// Appends several producers' requests back to back: all are validated and stamped first,
    /// then written in order (see `StorageFile::write_all_in_order_at`). Each request is
    /// validated on its own: a bad one fails alone and the others are written. Results come
    /// back in request order. A retried idempotent batch is answered with its original offsets
    /// and not written; if the original is in this same group, it shares the group's fate.
    pub async fn append_group(
        &mut self,
        requests: Vec<(BytesMut, u32)>,
        now_ms: i64,
    ) -> Vec<Result<AppendInfo, LogError>> {
        let mut results: Vec<Option<Result<AppendInfo, LogError>>> =
            (0..requests.len()).map(|_| None).collect();
        if let Err(error) = self.check_writable() {
            return results.iter().map(|_| Err(error.duplicate())).collect();
        }
        self.headers.clear();
        let mut buffers = Vec::with_capacity(requests.len());
        let mut spans = Vec::with_capacity(requests.len());
        let group_start = self.log_end_offset();
        let mut next_offset = group_start;
        // Retries of batches written by this very group: answered only if the write succeeds.
        let mut duplicates_in_group = Vec::new();
        for (at, (mut batches, leader_epoch)) in requests.into_iter().enumerate() {
            let first_header = self.headers.len();
            match self.stamp_request(&mut batches, leader_epoch, next_offset) {
                Ok(Stamped::Next(next)) => {
                    next_offset = next;
                    buffers.push(batches.freeze());
                    spans.push((at, first_header..self.headers.len()));
                }
                Ok(Stamped::Duplicate(info)) if info.last_offset >= group_start => {
                    duplicates_in_group.push((at, info));
                }
                Ok(Stamped::Duplicate(info)) => results[at] = Some(Ok(info)),
                Err(error) => {
                    self.headers.truncate(first_header);
                    results[at] = Some(Err(error));
                }
            }
        }
        assert!(duplicates_in_group.is_empty() || !buffers.is_empty());
        if !buffers.is_empty() {
            match self
                .write_batches(Buffers::Many(buffers), false, now_ms)
                .await
            {
                Ok(()) => {
                    for (at, headers) in spans {
                        results[at] = Some(Ok(AppendInfo::of(&self.headers[headers])));
                    }
                    for (at, info) in duplicates_in_group {
                        results[at] = Some(Ok(info));
                    }
                }
                Err(error) => {
                    for (at, _) in spans {
                        results[at] = Some(Err(error.duplicate()));
                    }
                    for (at, _) in duplicates_in_group {
                        results[at] = Some(Err(error.duplicate()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every request has a result"))
            .collect()
    }

    /// Validates every batch of one request, stamps consecutive offsets from `next_offset` and
    /// the epoch in place, and appends the headers to `self.headers`. Returns the next offset,
    /// or, for a retried idempotent batch, the original's offsets (its header is not kept).
    /// An idempotent batch that passes its producer check is applied to the producer state here.
    fn stamp_request(
        &mut self,
        batches: &mut BytesMut,
        leader_epoch: u32,
        mut next_offset: u64,
    ) -> Result<Stamped, LogError> {
        if let Some(latest) = self.epochs.latest_epoch()
            && leader_epoch < latest
        {
            return Err(LogError::StaleEpoch {
                epoch: leader_epoch,
                latest,
            });
        }
        let first_header = self.headers.len();
        let mut idempotent = false;
        let mut at = 0;
        while at < batches.len() {
            let index = self.headers.len() - first_header;
            let mut header = batch::check(&batches[at..])
                .map_err(|source| LogError::CorruptBatch { index, source })?;
            let batch_len = header.batch_len as usize;
            batch::stamp(&mut batches[at..at + batch_len], next_offset, leader_epoch);
            header.base_offset = next_offset;
            header.leader_epoch = leader_epoch;
            next_offset = header.next_offset();
            idempotent |= header.is_idempotent();
            self.headers.push(header);
            at += batch_len;
        }
        if self.headers.len() == first_header {
            return Err(LogError::CorruptBatch {
                index: 0,
                source: BatchError::TooShort {
                    needed: batch::HEADER_LEN,
                    available: 0,
                },
            });
        }
        if idempotent {
            return self.check_producer(first_header, next_offset);
        }
        Ok(Stamped::Next(next_offset))
    }

    /// The producer rules for a stamped idempotent request (`self.headers[first_header..]`):
    /// refuse it, answer it as a duplicate (dropping its header), or apply it and let it be
    /// written. Applied before the write: a failed write stops the log, and reopening rebuilds
    /// the state from what reached the disk.
    fn check_producer(
        &mut self,
        first_header: usize,
        next_offset: u64,
    ) -> Result<Stamped, LogError> {
        let headers = &self.headers[first_header..];
        if headers.len() != 1 {
            return Err(LogError::InvalidProducerBatch(format!(
                "an idempotent batch must be alone in its request; this one holds {} batches",
                headers.len()
            )));
        }
        let header = headers[0];
        if header.producer_id < 0 || header.producer_epoch < 0 || header.base_sequence < 0 {
            return Err(LogError::InvalidProducerBatch(format!(
                "producer id {}, epoch {}, base sequence {}: none may be negative",
                header.producer_id, header.producer_epoch, header.base_sequence
            )));
        }
        match self.producers.check(&header)? {
            SequenceCheck::Append => {
                self.producers.apply(&header);
                Ok(Stamped::Next(next_offset))
            }
            SequenceCheck::Duplicate {
                base_offset,
                last_offset,
            } => {
                self.headers.truncate(first_header);
                Ok(Stamped::Duplicate(AppendInfo {
                    base_offset,
                    last_offset,
                    max_timestamp_ms: header.max_timestamp_ms,
                    bytes: 0,
                    duplicate: true,
                }))
            }
        }
    }

    /// Appends batches a leader already stamped (the follower path), verbatim.
    pub async fn append_replicated(
        &mut self,
        batches: Bytes,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.check_replicated(&batches)?;
        self.write_batches(Buffers::One(batches), true, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// [`Self::append_replicated`] for batches received into place for a direct write.
    pub async fn append_replicated_placed(
        &mut self,
        placed: PlacedBatches,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.check_replicated(placed.batches())?;
        self.write_batches(Buffers::Placed(placed), true, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// Where the next replicated batches should start within a block for a direct write of them
    /// to need no copy (see [`PlacedBatches`]); `None` when this log never writes them direct.
    /// (Batches that go through the page cache are written wherever they lie.)
    pub fn direct_phase(&self) -> Option<usize> {
        let active = self.active();
        (self.config.direct_writes != DirectWrites::Never && active.log.writes_direct())
            .then(|| (active.size % DIRECT_BLOCK as u64) as usize)
    }

    /// Validates replicated batches into `self.headers`: whole and undamaged (the CRC: the leader
    /// checked their bodies, so a follower does not decompress or walk them again), contiguous
    /// with the log, no older epoch than the log's; applies idempotent ones to the producer state.
    fn check_replicated(&mut self, batches: &[u8]) -> Result<(), LogError> {
        self.check_writable()?;
        self.headers.clear();
        let mut expected = self.log_end_offset();
        let mut at = 0;
        while at < batches.len() {
            let index = self.headers.len();
            let header = batch::check_integrity(&batches[at..])
                .map_err(|source| LogError::CorruptBatch { index, source })?;
            if header.base_offset != expected {
                return Err(LogError::NotContiguous {
                    expected,
                    got: header.base_offset,
                });
            }
            let latest = self
                .headers
                .last()
                .map(|h| h.leader_epoch)
                .or(self.epochs.latest_epoch());
            if let Some(latest) = latest
                && header.leader_epoch < latest
            {
                return Err(LogError::StaleEpoch {
                    epoch: header.leader_epoch,
                    latest,
                });
            }
            expected = header.next_offset();
            at += header.batch_len as usize;
            self.headers.push(header);
        }
        if self.headers.is_empty() {
            return Err(LogError::CorruptBatch {
                index: 0,
                source: BatchError::TooShort {
                    needed: batch::HEADER_LEN,
                    available: 0,
                },
            });
        }
        // The leader checked them; a follower records them as they are, so that it holds the
        // leader's producer state if it becomes leader.
        for header in &self.headers {
            if header.is_idempotent() {
                self.producers.apply(header);
            }
        }
        Ok(())
    }

    /// Writes validated, stamped batches (`self.headers` describes them) at the end of the log:
    /// past the page cache where `direct_writes` sends this kind of append (`replicated`: a
    /// follower's), it is large enough, and the file system allows it.
    async fn write_batches(
        &mut self,
        buffers: Buffers,
        replicated: bool,
        now_ms: i64,
    ) -> Result<(), LogError> {
        let last = *self.headers.last().expect("at least one batch");
        let mut new_epoch = false;
        for header in &self.headers {
            if self
                .epochs
                .latest_epoch()
                .is_none_or(|latest| header.leader_epoch > latest)
            {
                new_epoch |= self.epochs.assign(header.leader_epoch, header.base_offset);
            }
        }
        if new_epoch {
            // Before the batches: a batch on disk whose epoch the file lacks would give wrong
            // answers to followers asking where an epoch ends.
            self.persist_epochs().await?;
        }
        let total = buffers.len();
        debug_assert_eq!(
            total,
            self.headers
                .iter()
                .map(|h| u64::from(h.batch_len))
                .sum::<u64>()
        );
        let roll = self.should_roll(total, last.last_offset(), now_ms);
        if roll && let Err(error) = self.roll(now_ms).await {
            if self.headers.iter().any(BatchHeader::is_idempotent) {
                // The producer state already counts these batches: it must not outlive them.
                return Err(self.fail(format!("rolling a segment failed: {error}")));
            }
            return Err(error);
        }
        let position = self.active().size;
        self.reserve_ahead(position + total).await;
        let min_bytes = self.config.direct_write_min_bytes;
        let direct = match self.config.direct_writes {
            DirectWrites::Never => false,
            DirectWrites::Replicated => replicated && total >= min_bytes,
            DirectWrites::Auto if replicated => self.replicated_appends.choose(total, min_bytes),
            DirectWrites::Auto => self.own_appends.choose(total, min_bytes),
            DirectWrites::Always => total >= min_bytes,
        } && self.active().log.writes_direct();
        // Shared, not copied: the cache keeps the request buffers themselves.
        let cached: Vec<Bytes> = match &buffers {
            Buffers::One(bytes) if !replicated && self.caches_tail() => vec![bytes.clone()],
            Buffers::Many(many) if !replicated && self.caches_tail() => many.clone(),
            _ => Vec::new(),
        };
        let written = if direct {
            self.active_mut().write_direct(buffers).await
        } else {
            let active = self.active_mut();
            // The page cache now holds the tail block; the copy kept for direct writes is stale.
            active.direct_tail = None;
            match buffers {
                Buffers::One(bytes) => active.log.write_all_at(bytes, position).await,
                Buffers::Many(buffers) => active.log.write_all_in_order_at(buffers, position).await,
                Buffers::Placed(placed) => {
                    active.log.write_all_at(placed.into_bytes(), position).await
                }
            }
        };
        if let Err(error) = written {
            let path = self.segment_path(self.active().base_offset, "log");
            return Err(self.fail(format!("write to {} failed: {error}", path.display())));
        }
        if direct {
            // On its way to the disk already: nothing for writeback to start.
            self.active_mut().writeback_from = position + total;
        } else {
            self.hint_writeback(position + total).await;
        }
        if cached.is_empty() {
            // Not kept (a follower's append, or a log that does not cache): what the cache
            // holds no longer reaches the log end.
            self.tail_cache.clear();
        }
        for bytes in cached {
            self.tail_cache.push(bytes);
        }
        let mut batch_position = position;
        let headers = std::mem::take(&mut self.headers);
        let active = self.active_mut();
        for header in &headers {
            active.on_batch(header, batch_position);
            batch_position += u64::from(header.batch_len);
        }
        active.size += total;
        active.dirty = true;
        self.headers = headers;
        if roll {
            // Here, not in `roll`: only now does the producer state match the log end.
            self.snapshot_producers(now_ms).await;
        }
        Ok(())
    }

    /// Hands written bytes to the kernel's writeback in chunks of [`WRITEBACK_CHUNK_BYTES`]
    /// (`sync_file_range(WRITE)`, which does not wait), so a later `fdatasync` finds most of
    /// them on their way to the disk instead of all at once, and, whatever the flush policy,
    /// dirty pages never pile up for the kernel's flusher to write back in bursts: each burst
    /// took a core for a while and a shard waited behind it (`flush=never` at 300,000
    /// records/s: ack p99 1.8–9.0 ms without these hints, 0.8–1.5 ms with them).
    /// Not per write: the call runs on the shard thread and submits block IO there, and on
    /// small appends it cost a third of a shard's time (one disk request and one virtio
    /// notification per 1 KiB record at 20,000 records/s, measured with `perf`).
    async fn hint_writeback(&mut self, written_to: u64) {
        let active = self.active_mut();
        let from = active.writeback_from;
        if written_to < from + WRITEBACK_CHUNK_BYTES {
            return;
        }
        active.writeback_from = written_to;
        if let Err(error) = active.log.start_writeback(from, written_to - from).await {
            tracing::debug!("sync_file_range hint failed: {error}");
        }
    }

    /// Reserves the active segment's blocks ahead of an append that ends at `end` (see
    /// [`PREALLOCATE_STEP_BYTES`]): once appends come within half of `ahead` of the
    /// reservation, one `fallocate` (on the ring, so the shard serves others meanwhile)
    /// reserves up to the `ahead` boundary past `end`, never past the segment's size limit.
    /// `ahead` grows with the segment up to the step ([`PREALLOCATE_AHEAD_MIN_BYTES`]). Not
    /// fatal when it fails: the append then allocates as it writes, as it would without
    /// reservation.
    async fn reserve_ahead(&mut self, end: u64) {
        let step = self.config.preallocate_step_bytes;
        if step == 0 || self.config.preallocate {
            return;
        }
        let limit = self.config.segment_bytes.max(end);
        let ahead = step.min(end.max(PREALLOCATE_AHEAD_MIN_BYTES).next_power_of_two());
        let active = self.active_mut();
        if end + ahead / 2 <= active.reserved_to {
            return;
        }
        let from = active.reserved_to.max(active.size);
        let to = (end + ahead).next_multiple_of(ahead).min(limit);
        if to <= from {
            return;
        }
        // Not retried within this step when it fails: a file system without `fallocate`
        // would otherwise pay a failed call per append.
        active.reserved_to = to;
        if let Err(error) = active.log.allocate(from, to - from).await {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "reserving segment blocks ahead of appends failed (appends allocate as they write; further failures are not logged): {error}"
                );
            });
        }
    }

    fn should_roll(&self, incoming_bytes: u64, incoming_last_offset: u64, now_ms: i64) -> bool {
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        let too_big = active.size + incoming_bytes > self.config.segment_bytes;
        let too_old = self
            .config
            .segment_ms
            .is_some_and(|segment_ms| now_ms - active.opened_at_ms >= segment_ms);
        let offsets_overflow = incoming_last_offset - active.base_offset > u64::from(u32::MAX);
        too_big || too_old || offsets_overflow
    }

    /// True when the interval policy says a sync is due.
    pub fn flush_due(&self, now_ms: i64) -> bool {
        match self.config.flush {
            FlushPolicy::Always => self.durable_offset < self.log_end_offset(),
            FlushPolicy::Interval { interval_ms } => {
                self.durable_offset < self.log_end_offset()
                    && now_ms - self.last_flush_ms >= interval_ms as i64
            }
            FlushPolicy::Never => false,
        }
    }

    /// Syncs every segment written since the last sync and persists pending index entries.
    /// Returns the new durable offset. One call covers every append before it (group commit).
    pub async fn flush(&mut self, now_ms: i64) -> Result<u64, LogError> {
        let job = self.begin_flush()?;
        let outcome = job.run().await;
        self.complete_flush(outcome, now_ms).await
    }

    /// Starts a sync of everything written so far, without borrowing the log while it runs: the
    /// writer keeps appending the next group while the disk syncs this one. Every write completed
    /// before this call is covered; later writes wait for the next job.
    pub fn begin_flush(&mut self) -> Result<FlushJob<S::File>, LogError> {
        self.check_writable()?;
        let files = self
            .segments
            .iter_mut()
            .filter(|segment| segment.dirty)
            .map(|segment| {
                segment.dirty = false;
                (segment.base_offset, segment.log.clone())
            })
            .collect();
        let active = self.active();
        Ok(FlushJob {
            target_offset: self.log_end_offset(),
            point: RecoveryPoint {
                offset: active.next_offset,
                segment_base: active.base_offset,
                position: active.size,
            },
            files,
        })
    }

    /// Applies the outcome of a [`FlushJob`]: advances the durable offset, or enters fail-stop.
    pub async fn complete_flush(
        &mut self,
        outcome: FlushOutcome,
        now_ms: i64,
    ) -> Result<u64, LogError> {
        if let Some((base, error)) = outcome.failure {
            let path = self.segment_path(base, "log");
            return Err(self.fail(format!("fdatasync of {} failed: {error}", path.display())));
        }
        self.check_writable()?;
        assert!(outcome.target_offset >= self.durable_offset.min(outcome.target_offset));
        self.durable_offset = self.durable_offset.max(outcome.target_offset);
        self.last_flush_ms = now_ms;
        if self
            .recovery_point
            .is_none_or(|point| point < outcome.point)
        {
            self.write_recovery_point(outcome.point).await;
        }
        for segment in &mut self.segments {
            if let Err(error) = segment.persist_index().await {
                // The index is a cache: losing it costs a rebuild on the next open, not data.
                tracing::warn!(dir = %self.dir.display(), "writing index of segment {} failed: {error}", segment.base_offset);
            }
        }
        Ok(self.durable_offset)
    }

    /// The batches [`PartitionLog::read`] would return, as a range of their segment file where
    /// that is the cheaper way to send them: at least [`REGION_MIN_BYTES`], every page in the
    /// page cache now (so `sendfile` never waits for the disk on a shard thread), not held by the
    /// tail cache, on a backend with file descriptors. Otherwise read into memory.
    pub async fn read_for_sending(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Served, LogError> {
        match self
            .plan_read_for_sending(offset, max_bytes, max_offset)
            .await?
        {
            Ok(served) => Ok(served),
            Err(read) => read.run().await.map(Served::Bytes),
        }
    }

    /// [`PartitionLog::read_for_sending`] up to its file IO, as [`PartitionLog::plan_read`]:
    /// `Err` is the read still to run.
    pub async fn plan_read_for_sending(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Result<Served, FileRead<S::File>>, LogError> {
        if let Some(region) = self.file_region(offset, max_bytes, max_offset).await? {
            return Ok(Ok(Served::Region(region)));
        }
        Ok(match self.plan_read(offset, max_bytes, max_offset).await? {
            PlannedRead::Ready(bytes) => Ok(Served::Bytes(bytes)),
            PlannedRead::File(read) => Err(read),
        })
    }

    /// See [`PartitionLog::read_for_sending`]. Finds the batches by their headers alone (a
    /// small read each, at most [`REGION_HEADERS_MAX`]); `None` wherever `read` should decide.
    async fn file_region(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Option<FileRegion>, LogError> {
        let max_offset = max_offset.min(self.log_end_offset());
        if max_bytes < REGION_MIN_BYTES
            || offset < self.log_start_offset()
            || offset >= max_offset
            || self.tail_cache.holds(offset)
        {
            return Ok(None);
        }
        let at = self.segment_holding(offset);
        let relative = (offset - self.segments[at].base_offset) as u32;
        let mut position = self
            .index_entry(at, |index| index.floor_by_offset(relative).copied())
            .await?
            .map_or(0, |entry| u64::from(entry.position));
        let segment = &self.segments[at];
        // A consumer near the log end (the usual case) is answered from memory at no cost.
        let left = segment.size.saturating_sub(position);
        if left < REGION_MIN_BYTES as u64 {
            return Ok(None);
        }
        // Not cached (written direct, or evicted): walking its headers would read them from the
        // disk one by one, only to find the range cannot be sent from the page cache.
        if !segment.log.is_cached(position, left.min(max_bytes as u64)) {
            return Ok(None);
        }
        let (mut first, mut records, mut newest_ms) = (None::<u64>, 0u64, None::<i64>);
        for walked in 0..REGION_HEADERS_MAX {
            if position >= segment.size {
                break;
            }
            // Batches too small for the headers allowed to reach REGION_MIN_BYTES: a log of
            // small batches is read, after a few header reads rather than all of them.
            if walked == REGION_HEADERS_PROBE
                && let Some(first) = first
                && (position - first) * (REGION_HEADERS_MAX as u64)
                    < REGION_MIN_BYTES as u64 * (walked as u64)
            {
                return Ok(None);
            }
            let head = segment
                .read(position, batch::HEADER_LEN)
                .await
                .map_err(|source| LogError::Io {
                    what: "read",
                    path: self.segment_path(segment.base_offset, "log"),
                    source,
                })?;
            let Ok(header) = BatchHeader::parse(&head) else {
                return Ok(None);
            };
            let batch_len = u64::from(header.batch_len);
            if header.next_offset() > max_offset {
                break;
            }
            if header.next_offset() <= offset {
                position += batch_len;
                continue;
            }
            if let Some(first) = first
                && position + batch_len - first > max_bytes as u64
            {
                break;
            }
            first.get_or_insert(position);
            records += u64::from(header.record_count);
            newest_ms = newest_ms.max(Some(header.max_timestamp_ms));
            position += batch_len;
        }
        let Some(first) = first else {
            return Ok(None);
        };
        let len = position - first;
        if len < REGION_MIN_BYTES as u64 || !segment.log.is_cached(first, len) {
            return Ok(None);
        }
        let Some(file) = segment.log.share_descriptor() else {
            return Ok(None);
        };
        Ok(Some(FileRegion {
            file,
            position: first,
            len: len as usize,
            records,
            newest_ms,
        }))
    }

    /// Reads whole stored batches starting with the one holding `offset`, up to `max_bytes`
    /// (at least one batch, so a consumer always progresses), only batches that end at or
    /// before `max_offset` (exclusive; the high watermark or durable offset), from one segment.
    /// Returns empty bytes at the end of the log.
    pub async fn read(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Bytes, LogError> {
        match self.plan_read(offset, max_bytes, max_offset).await? {
            PlannedRead::Ready(bytes) => Ok(bytes),
            PlannedRead::File(read) => read.run().await,
        }
    }

    /// [`PartitionLog::read`] up to its file IO: answered here when the tail cache holds the
    /// batches or there are none, else a [`FileRead`] to run, which needs the log no longer.
    /// The log task runs it beside appends, so a read from the disk does not hold up the
    /// partition's producers, and several reads of one partition are at the disk at once.
    pub async fn plan_read(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<PlannedRead<S::File>, LogError> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        if offset < log_start || offset > log_end {
            return Err(LogError::OffsetOutOfRange {
                requested: offset,
                log_start,
                log_end,
            });
        }
        let max_offset = max_offset.min(log_end);
        if offset >= max_offset {
            return Ok(PlannedRead::Ready(Bytes::new()));
        }
        if let Some(cached) = self.tail_cache.read(offset, max_bytes, max_offset) {
            tail_cache::count_read(true);
            return Ok(PlannedRead::Ready(cached));
        }
        tail_cache::count_read(false);
        let at = self.segment_holding(offset);
        let relative = (offset - self.segments[at].base_offset) as u32;
        let budget = max_bytes.max(batch::HEADER_LEN);
        let (start, indexed_end) = self
            .index_entry(at, |index| {
                let start = index
                    .floor_by_offset(relative)
                    .map_or(0, |entry| entry.position);
                (start, index.batches_end_within(start, budget as u64))
            })
            .await?;
        let start = u64::from(start);
        let segment = &self.segments[at];
        // Whole batches up to an indexed batch start when the index knows one: bytes read past
        // the last batch the answer takes are read again by the next fetch, which from a file
        // written direct means from the disk again (a quarter of every read, with 1 MB batches
        // and 4 MiB fetches). Else the budget and an index interval, enough to find where
        // batches end.
        let window = match indexed_end {
            Some(end) => (u64::from(end) - start) as usize,
            None => budget + self.config.index_interval_bytes as usize,
        };
        Ok(PlannedRead::File(FileRead {
            log: segment.log.clone(),
            size: segment.size,
            base_offset: segment.base_offset,
            dir: self.dir.clone(),
            start,
            window,
            offset,
            max_bytes,
            max_offset,
        }))
    }

    /// The first record whose timestamp is at or after `timestamp_ms`, as (offset, timestamp).
    /// Agrees with a linear scan of the log, even with out-of-order timestamps.
    pub async fn offset_for_timestamp(
        &mut self,
        timestamp_ms: i64,
    ) -> Result<Option<(u64, i64)>, LogError> {
        // Every record in a segment before the first whose max reaches the target is older.
        let Some(at) = self
            .segments
            .iter()
            .position(|segment| segment.max_timestamp_ms >= timestamp_ms)
        else {
            return Ok(None);
        };
        let start = self
            .index_entry(at, |index| index.floor_by_timestamp(timestamp_ms).copied())
            .await?
            .map_or(0, |entry| u64::from(entry.position));
        let segment = &self.segments[at];
        let io_error = |source| LogError::Io {
            what: "read",
            path: self.segment_path(segment.base_offset, "log"),
            source,
        };
        // Walk batch headers from the index entry; decode only the first batch that reaches
        // the target (the segment's max timestamp guarantees there is one).
        let mut position = start;
        let mut want = SCAN_CHUNK_BYTES;
        while position < segment.size {
            let chunk = segment.read(position, want).await.map_err(io_error)?;
            let mut at_byte = 0usize;
            want = SCAN_CHUNK_BYTES;
            while at_byte < chunk.len() {
                let rest = &chunk[at_byte..];
                let header = match BatchHeader::parse(rest) {
                    Ok(header) => header,
                    // A header cut by the chunk's end: read on from it.
                    Err(_) if rest.len() < batch::HEADER_LEN && at_byte > 0 => break,
                    Err(source) => return Err(LogError::CorruptBatch { index: 0, source }),
                };
                let batch_len = header.batch_len as usize;
                if batch_len > rest.len() {
                    // Read this batch whole next time round.
                    want = want.max(batch_len);
                    break;
                }
                if header.max_timestamp_ms >= timestamp_ms {
                    let batch = Batch::validate(chunk.slice(at_byte..at_byte + batch_len))
                        .map_err(|source| LogError::CorruptBatch { index: 0, source })?;
                    let found = batch
                        .records()
                        .find(|record| record.timestamp_ms >= timestamp_ms)
                        .expect("a batch whose max reaches the target has such a record");
                    return Ok(Some((found.offset, found.timestamp_ms)));
                }
                at_byte += batch_len;
            }
            position += at_byte as u64;
        }
        unreachable!(
            "segment {} claims max timestamp {} but no batch reaches {timestamp_ms}",
            segment.base_offset, segment.max_timestamp_ms
        )
    }

    /// Removes every batch and starts over, empty, at `offset` (a follower whose leader no
    /// longer holds the follower's log end: retention removed it). Returns `offset`.
    pub async fn restart_at(&mut self, offset: u64, now_ms: i64) -> Result<u64, LogError> {
        self.check_writable()?;
        self.tail_cache.clear();
        self.discard_producer_snapshot().await?;
        self.producers = ProducerStates::default();
        let log_start = offset;
        let bases = self.segment_bases();
        self.segments.clear();
        self.index_cache = IndexCache::default();
        for base in bases {
            self.remove_segment_files(base).await?;
        }
        let segment = self.create_segment(log_start, now_ms).await?;
        self.segments.push(segment);
        self.durable_offset = log_start;
        self.write_recovery_point(RecoveryPoint {
            offset: log_start,
            segment_base: log_start,
            position: 0,
        })
        .await;
        if !self.epochs.entries().is_empty() {
            self.epochs = EpochCache::default();
            self.persist_epochs().await?;
        }
        self.high_watermark_checkpoint = self.high_watermark_checkpoint.min(log_start);
        Ok(log_start)
    }

    /// Removes every batch with an offset at or above `offset`. Truncation happens at batch
    /// boundaries: if `offset` falls inside a batch, that whole batch goes. Returns the new log end.
    pub async fn truncate_to(&mut self, offset: u64, now_ms: i64) -> Result<u64, LogError> {
        self.check_writable()?;
        // Before anything is cut: a read must never be served bytes the log no longer holds.
        self.tail_cache.clear();
        let log_start = self.log_start_offset();
        if offset >= self.log_end_offset() {
            return Ok(self.log_end_offset());
        }
        if offset <= log_start {
            return self.restart_at(log_start, now_ms).await;
        }
        if self.producer_snapshot_offset_max > offset {
            // Before the data: a crash after the cut must not find a snapshot of cut batches.
            self.discard_producer_snapshot().await?;
        }
        let active_before = self.active().base_offset;
        while self.active().base_offset >= offset {
            let segment = self.segments.pop().expect("the cut is above log start");
            let base = segment.base_offset;
            drop(segment);
            self.index_cache.remove(base);
            self.remove_segment_files(base).await?;
        }
        if self.active().base_offset != active_before {
            // A closed segment becomes active again: its index lives in memory from now on.
            let base = self.active().base_offset;
            self.index_cache.remove(base);
            let index = self.load_index_of(self.segments.len() - 1).await?;
            self.active_mut().index = index;
        }
        let interval_bytes = self.config.index_interval_bytes;
        let path = self.segment_path(self.active().base_offset, "log");
        let active = self.active_mut();
        let from = active
            .index
            .floor_by_offset((offset - active.base_offset) as u32)
            .copied();
        let size = active.size;
        let end = active
            .replay(from, size, false, offset, interval_bytes)
            .await
            .map_err(|source| LogError::Io {
                what: "scan",
                path: path.clone(),
                source,
            })?;
        assert!(
            end.damage.is_none(),
            "written batches walk cleanly: {:?}",
            end.damage
        );
        let persisted = active.index.persisted() as u64;
        let results = [
            active.log.truncate(end.valid_len).await,
            active
                .offset_index
                .truncate(persisted * index::OFFSET_ENTRY_LEN as u64)
                .await,
            active
                .time_index
                .truncate(persisted * index::TIME_ENTRY_LEN as u64)
                .await,
            active.log.sync_data().await,
        ];
        for result in results {
            if let Err(error) = result {
                return Err(self.fail(format!("truncating {} failed: {error}", path.display())));
            }
        }
        // Truncation freed the blocks past the cut, reserved ones included.
        self.active_mut().reserved_to = end.valid_len;
        self.durable_offset = self.durable_offset.min(end.next_offset);
        // Sync what older segments still hold unsynced; with the active segment synced above,
        // everything up to the cut is durable. The recovery point moves to the cut, down from
        // wherever it was: it must not vouch for positions that new appends will overwrite.
        self.flush(now_ms).await?;
        let point = RecoveryPoint {
            offset: end.next_offset,
            segment_base: self.active().base_offset,
            position: end.valid_len,
        };
        self.write_recovery_point(point).await;
        // After the data: an epoch entry beyond the log end is harmless (dropped on open), a
        // batch without its entry is not.
        if self.epochs.truncate_from(end.next_offset) {
            self.persist_epochs().await?;
        }
        self.high_watermark_checkpoint = self.high_watermark_checkpoint.min(end.next_offset);
        // The state counts the cut batches: start again from the snapshot (if it is below the
        // cut) or from the log start. Truncations are rare; correctness beats speed here.
        self.rebuild_producers(now_ms).await?;
        Ok(end.next_offset)
    }

    /// Deletes closed segments past the time and size limits, only those wholly below
    /// `below_offset` (a leader passes its high watermark: what followers may still need, and
    /// what consumers have not been allowed to see, stays). The active segment is rolled first
    /// when it alone is past the time limit, so an idle topic's data still expires.
    pub async fn enforce_retention(
        &mut self,
        now_ms: i64,
        below_offset: u64,
    ) -> Result<RetentionReport, LogError> {
        let mut report = RetentionReport::default();
        let expired = |segment: &Segment<S::File>, retention_ms: Option<i64>| {
            retention_ms.is_some_and(|retention_ms| {
                !segment.is_empty() && segment.max_timestamp_ms < now_ms - retention_ms
            })
        };
        if expired(self.active(), self.config.retention_ms) {
            self.check_writable()?;
            self.roll(now_ms).await?;
            self.snapshot_producers(now_ms).await;
        }
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let over_size = self
                .config
                .retention_bytes
                .is_some_and(|retention_bytes| self.size_bytes() - oldest.size >= retention_bytes);
            if !(expired(oldest, self.config.retention_ms) || over_size)
                || self.segments[1].base_offset > below_offset
            {
                break;
            }
            let segment = self.segments.remove(0);
            report.deleted_segments += 1;
            report.deleted_bytes += segment.size;
            let base = segment.base_offset;
            drop(segment);
            self.index_cache.remove(base);
            self.remove_segment_files(base).await?;
            tracing::info!(dir = %self.dir.display(), "retention deleted segment {base}");
        }
        self.tail_cache.drop_below(self.log_start_offset());
        Ok(report)
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

    /// Starts a new active segment at the log end.
    async fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let base = self.log_end_offset();
        let previous = self.active_mut();
        if let Err(error) = previous.persist_index().await {
            tracing::warn!(
                "writing index of segment {} failed: {error}",
                previous.base_offset
            );
        }
        // Closed segments keep no index in memory (see `index_entry`).
        previous.index = SegmentIndex::default();
        if let Err(error) = previous.trim().await {
            tracing::warn!(
                "trimming segment {} to its data failed: {error}",
                previous.base_offset
            );
        }
        let segment = self.create_segment(base, now_ms).await?;
        self.segments.push(segment);
        tracing::debug!(dir = %self.dir.display(), "rolled to segment {base}");
        Ok(())
    }

    /// Opens (creating where missing) a segment's log, offset index and time index files.
    async fn open_segment_files(
        &self,
        base_offset: u64,
    ) -> Result<(Rc<S::File>, S::File, S::File), LogError> {
        let open = |extension, direct| {
            let path = self.segment_path(base_offset, extension);
            let storage = self.storage.clone();
            async move {
                let file = if direct {
                    storage.open_direct(&path, true).await
                } else {
                    storage.open(&path, true).await
                };
                file.map_err(|source| LogError::Io {
                    what: "open",
                    path,
                    source,
                })
            }
        };
        let direct = self.config.direct_writes != DirectWrites::Never;
        Ok((
            Rc::new(open("log", direct).await?),
            open("index", false).await?,
            open("timeindex", false).await?,
        ))
    }

    async fn create_segment(
        &mut self,
        base_offset: u64,
        now_ms: i64,
    ) -> Result<Segment<S::File>, LogError> {
        let (log, offset_index, time_index) = self.open_segment_files(base_offset).await?;
        // A segment left over from a crash at the same base would confuse recovery: start clean.
        for file in [&log, &offset_index, &time_index] {
            file.truncate(0).await.map_err(|source| LogError::Io {
                what: "truncate",
                path: self.segment_path(base_offset, "log"),
                source,
            })?;
        }
        let mut reserved_to = 0;
        if self.config.preallocate {
            match log.allocate(0, self.config.segment_bytes).await {
                Ok(()) => reserved_to = self.config.segment_bytes,
                Err(error) => {
                    tracing::warn!("preallocating segment {base_offset} failed: {error}");
                }
            }
        }
        self.sync_dir().await?;
        let mut segment = Segment::new(
            base_offset,
            now_ms,
            SegmentIndex::default(),
            self.config.index_interval_bytes,
            (log, offset_index, time_index),
        );
        segment.reserved_to = reserved_to;
        Ok(segment)
    }

    /// Opens one segment found on disk, checks its index against its log, and (for the active
    /// segment, or any that looks damaged) validates every batch after the last index entry and
    /// cuts a torn or corrupt tail. Returns the segment and whether it was damaged.
    async fn recover_segment(
        &mut self,
        base_offset: u64,
        trust: Trust,
        now_ms: i64,
        report: &mut RecoveryReport,
    ) -> Result<(Segment<S::File>, bool), LogError> {
        let path = self.segment_path(base_offset, "log");
        let io_error = |what| {
            let path = path.clone();
            move |source| LogError::Io { what, path, source }
        };
        let (log, offset_index, time_index) = self.open_segment_files(base_offset).await?;
        let file_len = log.file_len().await.map_err(io_error("stat"))?;
        let offsets = read_whole(&offset_index)
            .await
            .map_err(io_error("read index"))?;
        let times = read_whole(&time_index)
            .await
            .map_err(io_error("read index"))?;
        let mut index = SegmentIndex::decode(offsets.as_slice(), times.as_slice(), file_len);
        // Index entries past the recovery point may have outlived the data before them.
        match trust {
            Trust::Whole => {}
            Trust::UpTo(position) => {
                index.truncate_to_position(
                    position.saturating_add(1).min(u64::from(u32::MAX)) as u32
                );
            }
            Trust::Nothing => {
                index.truncate_to_position(0);
            }
        }
        let loaded_entries = index.entries().len();
        let from = index.last().copied();
        let interval_bytes = self.config.index_interval_bytes;
        let mut segment = Segment::new(
            base_offset,
            now_ms,
            index,
            interval_bytes,
            (log, offset_index, time_index),
        );
        // A segment wholly before the recovery point was durable: walking the headers after its
        // last index entry is enough. Anything after the point, or a segment that does not walk
        // cleanly, is validated batch by batch.
        let verify = trust != Trust::Whole;
        let mut end = segment
            .replay(from, file_len, verify, u64::MAX, interval_bytes)
            .await
            .map_err(io_error("scan"))?;
        if end.damage.is_some() && !verify {
            end = segment
                .replay(from, file_len, true, u64::MAX, interval_bytes)
                .await
                .map_err(io_error("scan"))?;
        }
        report.rebuilt_index_entries +=
            segment.index.entries().len().saturating_sub(loaded_entries);
        let damaged = end.damage.is_some();
        if let Some(damage) = &end.damage {
            let cut = file_len - end.valid_len;
            report.truncated_bytes += cut;
            tracing::warn!(
                path = %path.display(),
                "recovery cut {cut} bytes at offset {} (position {}): {damage}",
                end.next_offset,
                end.valid_len
            );
        }
        if end.valid_len < file_len {
            segment
                .log
                .truncate(end.valid_len)
                .await
                .map_err(io_error("truncate"))?;
            segment.log.sync_data().await.map_err(io_error("sync"))?;
        }
        // Index files: cut to the entries that were kept, then append the rebuilt ones.
        let persisted = segment.index.persisted() as u64;
        segment
            .offset_index
            .truncate(persisted * index::OFFSET_ENTRY_LEN as u64)
            .await
            .map_err(io_error("truncate index"))?;
        segment
            .time_index
            .truncate(persisted * index::TIME_ENTRY_LEN as u64)
            .await
            .map_err(io_error("truncate index"))?;
        segment
            .persist_index()
            .await
            .map_err(io_error("write index"))?;
        Ok((segment, damaged))
    }

    /// Reads segment `at`'s index back from its files.
    async fn load_index_of(&self, at: usize) -> Result<SegmentIndex, LogError> {
        let segment = &self.segments[at];
        segment.load_index().await.map_err(|source| LogError::Io {
            what: "read index",
            path: self.segment_path(segment.base_offset, "index"),
            source,
        })
    }

    /// Makes creations and removals in the partition folder durable.
    async fn sync_dir(&self) -> Result<(), LogError> {
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|source| LogError::Io {
                what: "sync",
                path: self.dir.to_path_buf(),
                source,
            })
    }

    /// Replaces the contents of a small file of the partition's folder (the epoch checkpoint,
    /// the producer snapshot) in place and syncs it; a file created here is made durable by a
    /// sync of the folder too. Opened for the call only: these are written rarely, and a
    /// broker's file descriptors are better spent on segments.
    async fn rewrite_checkpoint(&self, path: &Path, bytes: Bytes) -> io::Result<()> {
        let (file, created) = match self.storage.open(path, false).await {
            Ok(file) => (file, false),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                (self.storage.open(path, true).await?, true)
            }
            Err(error) => return Err(error),
        };
        let len = bytes.len() as u64;
        if len > 0 {
            file.write_all_at(bytes, 0).await?;
        }
        file.truncate(len).await?;
        file.sync_data().await?;
        if created {
            self.storage.sync_dir(&self.dir).await?;
        }
        Ok(())
    }

    /// Writes the epoch cache durably (rare: once per leader epoch, and after truncations).
    async fn persist_epochs(&mut self) -> Result<(), LogError> {
        let bytes = self.epochs.encode();
        let path = self.dir.join(EPOCH_FILE_NAME);
        let written = self.rewrite_checkpoint(&path, Bytes::from(bytes)).await;
        written.map_err(|error| self.fail(format!("writing {} failed: {error}", path.display())))
    }

    /// Rebuilds the epoch cache from the batch headers (its file was missing or damaged).
    async fn rebuild_epochs(&mut self) -> Result<(), LogError> {
        let mut epochs = EpochCache::default();
        self.scan_headers(self.log_start_offset(), |header| {
            if epochs
                .latest_epoch()
                .is_none_or(|latest| header.leader_epoch > latest)
            {
                epochs.assign(header.leader_epoch, header.base_offset);
            }
        })
        .await?;
        tracing::info!(dir = %self.dir.display(), epochs = epochs.entries().len(), "rebuilt the leader-epoch checkpoint from the log");
        self.epochs = epochs;
        self.persist_epochs().await
    }

    /// Calls `visit` with the header of every batch from `from_offset` (a batch boundary) to the
    /// log end, in order: the scan behind every rebuild of state derived from the batches. Reads
    /// in chunks from the index entry at or below `from_offset`; walks headers only.
    async fn scan_headers(
        &mut self,
        from_offset: u64,
        mut visit: impl FnMut(&BatchHeader),
    ) -> Result<(), LogError> {
        let from_offset = from_offset.max(self.log_start_offset());
        if from_offset >= self.log_end_offset() {
            return Ok(());
        }
        let first = self.segment_holding(from_offset);
        for at in first..self.segments.len() {
            let base = self.segments[at].base_offset;
            let (position, offset) = if at == first && from_offset > base {
                let relative = (from_offset - base) as u32;
                self.index_entry(at, |index| index.floor_by_offset(relative).copied())
                    .await?
                    .map_or((0, base), |entry| {
                        (
                            u64::from(entry.position),
                            base + u64::from(entry.relative_offset),
                        )
                    })
            } else {
                (0, base)
            };
            let segment = &self.segments[at];
            let io_error = |source| LogError::Io {
                what: "scan",
                path: self.segment_path(base, "log"),
                source,
            };
            let end = Segment::scan(
                &*segment.log,
                segment.size,
                position,
                offset,
                false,
                |header, _| {
                    if header.base_offset >= from_offset {
                        visit(header);
                    }
                    true
                },
            )
            .await
            .map_err(io_error)?;
            if let Some(damage) = end.damage {
                // Recovery left whole batches only; damage here means the file changed under us.
                return Err(io_error(io::Error::new(io::ErrorKind::InvalidData, damage)));
            }
            assert_eq!(
                end.next_offset, segment.next_offset,
                "the scan reaches the end"
            );
        }
        Ok(())
    }

    /// Sets the producer state to what the log holds: the snapshot, if it is intact and not
    /// beyond the log end, plus every batch after it; otherwise every batch of the log. A
    /// snapshot beyond the log end (the batches it counts were lost or cut) is discarded.
    async fn rebuild_producers(&mut self, now_ms: i64) -> Result<(), LogError> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        let path = self.dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        let bytes = match self.storage.open(&path, false).await {
            Ok(file) => read_whole(&file).await.ok(),
            Err(_) => None,
        };
        let snapshot = match bytes.as_ref().map(|bytes| bytes.as_slice()) {
            None | Some([]) => None,
            Some(bytes) => ProducerStates::decode(bytes)
                .inspect_err(|error| {
                    tracing::warn!(dir = %self.dir.display(), "ignoring the producer snapshot: {error}");
                })
                .ok(),
        };
        let (mut producers, from) = match snapshot {
            Some(snapshot) if snapshot.offset <= log_end => {
                self.producer_snapshot_offset_max = snapshot.offset;
                (snapshot.states, snapshot.offset.max(log_start))
            }
            Some(snapshot) => {
                tracing::info!(dir = %self.dir.display(), snapshot = snapshot.offset, log_end, "the producer snapshot is past the log end; discarding it");
                self.producer_snapshot_offset_max = snapshot.offset;
                self.discard_producer_snapshot().await?;
                (ProducerStates::default(), log_start)
            }
            None => {
                self.producer_snapshot_offset_max = 0;
                (ProducerStates::default(), log_start)
            }
        };
        self.scan_headers(from, |header| {
            if header.is_idempotent() {
                producers.apply(header);
            }
        })
        .await?;
        producers.expire(now_ms);
        self.producers = producers;
        Ok(())
    }

    /// Writes the producer state, expired producers dropped, as the snapshot for the log end
    /// (on roll and close, so opening scans at most about a segment). In place and synced, as
    /// the epoch checkpoint: a torn snapshot fails its CRC and costs a longer scan on open, never
    /// a wrong answer. A failure is logged, not fatal: the log is the truth.
    async fn snapshot_producers(&mut self, now_ms: i64) {
        self.producers.expire(now_ms);
        let offset = self.log_end_offset();
        let bytes = self.producers.encode(offset);
        // Whatever happens below, the file may now claim `offset`.
        self.producer_snapshot_offset_max = self.producer_snapshot_offset_max.max(offset);
        let path = self.dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        let written = self.rewrite_checkpoint(&path, Bytes::from(bytes)).await;
        match written {
            Ok(()) => self.producer_snapshot_offset_max = offset,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), "writing the producer snapshot failed: {error}");
            }
        }
    }

    /// Empties the producer snapshot durably (before a truncation below it).
    async fn discard_producer_snapshot(&mut self) -> Result<(), LogError> {
        let path = self.dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        let discarded = self.rewrite_checkpoint(&path, Bytes::new()).await;
        discarded
            .map_err(|error| self.fail(format!("discarding {} failed: {error}", path.display())))?;
        self.producer_snapshot_offset_max = 0;
        Ok(())
    }

    /// Records how far the log is durable. Not synced: see [`checkpoint`].
    async fn write_recovery_point(&mut self, point: RecoveryPoint) {
        self.recovery_point = Some(point);
        let bytes = Bytes::copy_from_slice(&point.encode());
        if let Err(error) = self.recovery_file.write_all_at(bytes, 0).await {
            tracing::warn!(dir = %self.dir.display(), "writing the recovery point failed: {error}");
        }
    }

    async fn remove_segment_files(&mut self, base_offset: u64) -> Result<(), LogError> {
        for extension in ["log", "index", "timeindex"] {
            let path = self.segment_path(base_offset, extension);
            match self.storage.remove_file(&path).await {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(LogError::Io {
                        what: "remove",
                        path,
                        source,
                    });
                }
            }
        }
        self.sync_dir().await?;
        Ok(())
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
