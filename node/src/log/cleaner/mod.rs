//! The log cleaner: compaction of `cleanup.policy=compact` logs, keeping each key's last record.
//!
//! A clean of one partition, as Kafka's cleaner does it:
//! 1. **map**: read the dirty part (from the clean offset to the cleanable end) and record each
//!    key's last offset in an [`OffsetMap`] of bounded memory. When the dirty part has more keys
//!    than fit, the map stops where it filled, and this clean covers the log up to there; the
//!    next clean goes on from there (several passes).
//! 2. **rewrite**: read every closed segment from the log start up to where the map stops, in
//!    groups whose sizes add up to at most `segment.bytes` (so small cleaned segments merge),
//!    and write each group as one cleaned segment keeping, of each key, the record the map
//!    names, and tombstones until their delete horizon ([`rewrite`]); aborted transactions'
//!    records go, and markers once their transaction holds nothing ([`transactions`]).
//! 3. **swap**: the log swaps the cleaned segments in (its `compaction` module).
//!
//! The map and the rewrite read segment files through handles the plan holds and write new
//! files of their own; the log's task is busy only for the plan and the swap, never for the
//! reading and writing in between. The shard's thread only issues that IO: checking each chunk's
//! batches, hashing keys and rebuilding batches run on the blocking pool, a chunk (1 MiB) at a
//! time, so the partitions' requests never wait behind them.

mod offset_map;
mod rewrite;
mod run;
mod transactions;

pub use offset_map::{ENTRY_BYTES, OffsetMap};
pub use rewrite::{CleanStats, CleanedSegment, Rules, SegmentWriter};
pub use run::{CleanOutcome, CleanedFiles, clean};
pub use transactions::{AbortedRanges, EmptiedAbort, OngoingTxns};
