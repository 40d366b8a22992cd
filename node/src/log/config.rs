//! How a partition log is configured: when it syncs, how large its segments grow, how long
//! it keeps them, and how it writes (direct or through the page cache, preallocated).

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
    /// Kafka's `remote.storage.enable`: closed segments are uploaded to the remote tier, and
    /// the local log keeps only what `local` retention allows of what was uploaded.
    pub remote_storage: bool,
    /// With `remote_storage`, the local log's own limits (`local.retention.ms`,
    /// `local.retention.bytes`; Kafka's -2, "as the whole log", resolved to `retention_*`).
    /// Local segments go past them only once uploaded.
    pub local_retention_ms: Option<i64>,
    pub local_retention_bytes: Option<u64>,
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
    /// What happens to old data: deleted by retention, compacted, or both.
    pub cleanup: CleanupPolicy,
    /// When and how a compacted log is cleaned.
    pub compaction: CompactionConfig,
    /// Kafka's `message.timestamp.type=LogAppendTime`: a Kafka batch's timestamps become the
    /// broker's time as it is appended (its max timestamp and attribute set, its CRC
    /// recomputed). Strata's own batches, which have no such attribute, keep their producer's.
    pub log_append_time: bool,
}

/// Kafka's `cleanup.policy`: `delete`, `compact` or `compact,delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// Retention by time and size deletes old segments.
    pub delete: bool,
    /// The cleaner keeps each key's last record.
    pub compact: bool,
}

impl CleanupPolicy {
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };
    pub const COMPACT: CleanupPolicy = CleanupPolicy {
        delete: false,
        compact: true,
    };

    /// Kafka's spelling: a comma-separated list of `delete` and `compact`, at least one.
    pub fn parse(value: &str) -> Option<CleanupPolicy> {
        let mut policy = CleanupPolicy {
            delete: false,
            compact: false,
        };
        for part in value.split(',').map(str::trim) {
            match part {
                "delete" => policy.delete = true,
                "compact" => policy.compact = true,
                _ => return None,
            }
        }
        (policy.delete || policy.compact).then_some(policy)
    }

    pub fn name(self) -> &'static str {
        match (self.compact, self.delete) {
            (true, true) => "compact,delete",
            (true, false) => "compact",
            _ => "delete",
        }
    }
}

/// Kafka's compaction settings of a topic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionConfig {
    /// Clean once the part not yet cleaned is at least this share of the cleanable log.
    pub min_cleanable_dirty_ratio: f64,
    /// A record stays uncompacted at least this long (its segment's newest record's age).
    pub min_lag_ms: i64,
    /// A record is compacted within about this long whatever the dirty ratio.
    pub max_lag_ms: i64,
    /// A tombstone stays this long after the clean that first kept it.
    pub delete_retention_ms: i64,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            min_cleanable_dirty_ratio: 0.5,
            min_lag_ms: 0,
            max_lag_ms: i64::MAX,
            delete_retention_ms: 24 * 3600 * 1000,
        }
    }
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
pub(super) const WRITEBACK_CHUNK_BYTES: u64 = 1 << 20;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: Some(7 * 24 * 3600 * 1000),
            index_interval_bytes: 4096,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            retention_bytes: None,
            remote_storage: false,
            local_retention_ms: Some(7 * 24 * 3600 * 1000),
            local_retention_bytes: None,
            flush: FlushPolicy::Interval { interval_ms: 1000 },
            preallocate: false,
            preallocate_step_bytes: PREALLOCATE_STEP_BYTES,
            direct_writes: DirectWrites::Auto,
            direct_write_min_bytes: DIRECT_WRITE_MIN_BYTES,
            cleanup: CleanupPolicy::DELETE,
            compaction: CompactionConfig::default(),
            log_append_time: false,
        }
    }
}
