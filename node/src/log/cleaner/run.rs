//! One clean's IO: read the plan's segments, build the key map, write the cleaned segments.

use crate::clock::Clock;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use strata_wire::batch::{Batch, BatchError, BatchHeader};

use super::offset_map::OffsetMap;
use super::rewrite::{CleanStats, CleanedSegment, Rules, SegmentWriter};
use super::transactions::{AbortedRanges, EmptiedAbort, OngoingTxns};
use crate::io::{ReadBuf, Storage, StorageFile};
use crate::log::LogError;
use crate::log::clean_plan::{CleanPlan, SourceSegment, SourceSummary, cleaned_path};
use crate::replication::RecoveryThrottle;

/// How much of a segment one read takes.
const CHUNK_BYTES: usize = 1 << 20;

/// What a clean wrote, for [`crate::log::PartitionLog::finish_clean`] to swap in.
pub struct CleanOutcome {
    pub segments: Vec<CleanedFiles>,
    /// The first offset the next clean treats as dirty.
    pub clean_offset: u64,
    pub stats: CleanStats,
    /// When the earliest tombstone or emptied transaction's marker the cleaned part keeps may
    /// go (`None`: it keeps none), so the log asks for a clean then even if nothing new is
    /// dirty.
    pub delete_horizon_ms: Option<i64>,
    /// Aborted transactions the partition lists that hold nothing any more: it forgets them
    /// once the clean is swapped in.
    pub emptied_aborts: Vec<EmptiedAbort>,
}

/// One cleaned segment's files (`<base>.*.cleaned`, synced) and the segments it replaces.
pub struct CleanedFiles {
    pub segment: CleanedSegment,
    pub sources: Vec<SourceSummary>,
}

fn corrupt(dir: &std::path::Path, base: u64, error: impl std::fmt::Display) -> LogError {
    LogError::Io {
        what: "clean",
        path: dir.join(format!("{base:020}.log")),
        source: Arc::new(io::Error::new(
            io::ErrorKind::InvalidData,
            error.to_string(),
        )),
    }
}

/// Runs the clean `plan` describes, with `map` (emptied first; handed back for the next clean)
/// and the shard's IO limit. Writes the cleaned segments' files and syncs them; swapping them in
/// is the log's ([`crate::log::PartitionLog::finish_clean`]).
pub async fn clean<S: Storage>(
    plan: CleanPlan<S>,
    mut map: OffsetMap,
    throttle: &mut Option<RecoveryThrottle>,
) -> (OffsetMap, Result<CleanOutcome, LogError>) {
    map.clear();
    let mut stats = CleanStats::default();
    let aborted = Arc::new(AbortedRanges::new(&plan.aborted));
    let (map, map_end) = build_map(&plan, map, &aborted, throttle, &mut stats).await;
    let map_end = match map_end {
        Ok(end) => end,
        Err(error) => return (map, Err(error)),
    };
    // Read-only from here: each chunk's rewrite on the blocking pool shares it.
    let rules = Arc::new(Rules {
        map,
        map_end,
        now_ms: plan.now_ms,
        delete_retention_ms: plan.delete_retention_ms,
        producer_last_offsets: plan.producer_last_offsets.clone(),
        aborted,
    });
    let mut delete_horizon_ms = None;
    let result = rewrite_all(&plan, &rules, throttle, &mut stats, &mut delete_horizon_ms).await;
    let outcome = result.map(|(segments, txns)| CleanOutcome {
        segments,
        clean_offset: map_end,
        stats,
        delete_horizon_ms,
        emptied_aborts: txns.into_emptied_aborts(),
    });
    let rules = Arc::into_inner(rules).expect("no chunk's work outlives the clean");
    (rules.map, outcome)
}

/// Runs a chunk's CPU work (checking batches, hashing keys, rebuilding batches) on the blocking
/// pool, so the shard's thread, which serves the partitions' requests, only issues the IO.
async fn off_the_shard<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// The batches of a chunk, each checked whole (CRC, structure) before the cleaner uses it.
fn batches_of(chunk: Bytes) -> impl Iterator<Item = Result<Batch, strata_wire::batch::BatchError>> {
    strata_wire::batch::split_batches(chunk)
}

/// Step 1: each key's last offset in the dirty part, until the map is full. Returns the map
/// and where it stops (the cleanable end when everything fit).
async fn build_map<S: Storage>(
    plan: &CleanPlan<S>,
    mut map: OffsetMap,
    aborted: &Arc<AbortedRanges>,
    throttle: &mut Option<RecoveryThrottle>,
    stats: &mut CleanStats,
) -> (OffsetMap, Result<u64, LogError>) {
    let (first_dirty, cleanable_end) = (plan.first_dirty, plan.cleanable_end);
    for source in plan
        .sources
        .iter()
        .filter(|source| source.next_offset > first_dirty)
    {
        let mut reader = SegmentReader::new(source);
        loop {
            let chunk = match reader.next_chunk(&plan.dir, throttle).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(error) => return (map, Err(error)),
            };
            stats.bytes_read += chunk.len() as u64;
            let aborted = aborted.clone();
            let (returned, filled) = off_the_shard(move || {
                let filled = map_chunk(&mut map, chunk, &aborted, first_dirty, cleanable_end);
                (map, filled)
            })
            .await;
            map = returned;
            match filled {
                Ok(Some(end)) => return (map, Ok(end)),
                Ok(None) => {}
                Err(error) => return (map, Err(corrupt(&plan.dir, source.base_offset, error))),
            }
        }
    }
    (map, Ok(cleanable_end))
}

/// Puts a chunk's keys in `[first_dirty, cleanable_end)` into the map, but for markers' (a
/// marker's key is its type, not a key of the topic's) and aborted transactions' (their records
/// go whatever comes after them); `Some(offset)`: the record at `offset` did not fit, and the
/// map stops there.
fn map_chunk(
    map: &mut OffsetMap,
    chunk: Bytes,
    aborted: &AbortedRanges,
    first_dirty: u64,
    cleanable_end: u64,
) -> Result<Option<u64>, strata_wire::batch::BatchError> {
    for batch in batches_of(chunk) {
        let batch = batch?;
        let header = batch.header();
        let skipped = header.is_control()
            || (header.is_transactional()
                && aborted.contains(header.producer_id, header.base_offset));
        if batch.last_offset() < first_dirty || skipped {
            continue;
        }
        for record in batch.records() {
            if record.offset < first_dirty || record.offset >= cleanable_end {
                continue;
            }
            if let Some(key) = record.key
                && !map.put(key, record.offset)
            {
                return Ok(Some(record.offset));
            }
        }
    }
    Ok(None)
}

/// Step 2: the segments up to `rules.map_end`, rewritten in groups of at most `segment.bytes`.
async fn rewrite_all<S: Storage>(
    plan: &CleanPlan<S>,
    rules: &Arc<Rules>,
    throttle: &mut Option<RecoveryThrottle>,
    stats: &mut CleanStats,
    delete_horizon_ms: &mut Option<i64>,
) -> Result<(Vec<CleanedFiles>, OngoingTxns), LogError> {
    let sources: Vec<&SourceSegment<S::File>> = plan
        .sources
        .iter()
        .filter(|source| source.base_offset < rules.map_end)
        .collect();
    let mut written = Vec::new();
    let mut ongoing = OngoingTxns::default();
    for group in groups(&sources, plan.segment_bytes) {
        let rewritten = rewrite_group(
            plan,
            group,
            rules,
            throttle,
            stats,
            (delete_horizon_ms, &mut ongoing),
        )
        .await;
        match rewritten {
            Ok(Some(files)) => written.push(files),
            Ok(None) => {}
            Err(error) => {
                // Leave nothing behind: what was written is discarded with the clean.
                for files in &written {
                    remove_cleaned(plan, files.segment.base_offset).await;
                }
                remove_cleaned(plan, group[0].base_offset).await;
                return Err(error);
            }
        }
    }
    Ok((written, ongoing))
}

/// Consecutive sources whose sizes add up to at most `segment_bytes` (at least one each), and
/// whose offsets a segment's index can address.
fn groups<'a, F>(
    sources: &'a [&'a SourceSegment<F>],
    segment_bytes: u64,
) -> Vec<&'a [&'a SourceSegment<F>]> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < sources.len() {
        let mut end = start + 1;
        let mut bytes = sources[start].size;
        while end < sources.len()
            && bytes + sources[end].size <= segment_bytes
            && sources[end].next_offset - sources[start].base_offset <= u64::from(u32::MAX)
        {
            bytes += sources[end].size;
            end += 1;
        }
        groups.push(&sources[start..end]);
        start = end;
    }
    groups
}

async fn remove_cleaned<S: Storage>(plan: &CleanPlan<S>, base: u64) {
    for extension in ["log", "index", "timeindex"] {
        let _ = plan
            .storage
            .remove_file(&cleaned_path(&plan.dir, base, extension))
            .await;
    }
}

/// Writes one group's cleaned segment; `None` when it would be one source unchanged. `carried`:
/// the earliest delete horizon kept so far, and the transactions read but not yet ended, both
/// carried from group to group.
async fn rewrite_group<S: Storage>(
    plan: &CleanPlan<S>,
    group: &[&SourceSegment<S::File>],
    rules: &Arc<Rules>,
    throttle: &mut Option<RecoveryThrottle>,
    stats: &mut CleanStats,
    carried: (&mut Option<i64>, &mut OngoingTxns),
) -> Result<Option<CleanedFiles>, LogError> {
    let (delete_horizon_ms, ongoing) = carried;
    let base = group[0].base_offset;
    let open = |extension: &'static str| {
        let path = cleaned_path(&plan.dir, base, extension);
        let storage = plan.storage.clone();
        async move {
            let file = storage.open(&path, true).await?;
            file.truncate(0).await?;
            Ok::<_, io::Error>(file)
        }
    };
    let io_error = |what: &'static str| {
        let path = cleaned_path(&plan.dir, base, "log");
        move |source| LogError::Io {
            what,
            path,
            source: Arc::new(source),
        }
    };
    let log = open("log").await.map_err(io_error("create"))?;
    let mut writer = SegmentWriter::new(base, plan.index_interval_bytes, std::mem::take(ongoing));
    let mut position = 0u64;
    for source in group {
        let mut reader = SegmentReader::new(source);
        while let Some(chunk) = reader.next_chunk(&plan.dir, throttle).await? {
            let rules = rules.clone();
            let (returned, chunk_stats, pending) = off_the_shard(move || {
                let mut chunk_stats = CleanStats::default();
                let pushed = batches_of(chunk).try_for_each(|batch| {
                    writer.push(&batch?, &rules, &mut chunk_stats);
                    Ok::<(), strata_wire::batch::BatchError>(())
                });
                let pending = pushed.map(|()| writer.take_pending());
                (writer, chunk_stats, pending)
            })
            .await;
            writer = returned;
            stats.add(&chunk_stats);
            let pending = pending.map_err(|error| corrupt(&plan.dir, source.base_offset, error))?;
            position = write(&log, pending, position, throttle)
                .await
                .map_err(io_error("write"))?;
        }
    }
    let (last, mut segment, still_ongoing) = writer.finish();
    *ongoing = still_ongoing;
    let size = write(&log, last, position, throttle)
        .await
        .map_err(io_error("write"))?;
    debug_assert_eq!(size, segment.size);
    stats.bytes_written += size;
    if let Some(horizon) = segment.delete_horizon_ms {
        *delete_horizon_ms =
            Some(delete_horizon_ms.map_or(horizon, |earliest| earliest.min(horizon)));
    }
    if !segment.changed && group.len() == 1 {
        drop(log);
        remove_cleaned(plan, base).await;
        return Ok(None);
    }
    let (mut offsets, mut times) = (Vec::new(), Vec::new());
    segment.index.take_unpersisted(&mut offsets, &mut times);
    let offset_index = open("index").await.map_err(io_error("create"))?;
    let time_index = open("timeindex").await.map_err(io_error("create"))?;
    for (file, bytes) in [(&offset_index, offsets), (&time_index, times)] {
        if !bytes.is_empty() {
            file.write_all_at(Bytes::from(bytes), 0)
                .await
                .map_err(io_error("write"))?;
        }
    }
    for file in [&log, &offset_index, &time_index] {
        file.sync_data().await.map_err(io_error("sync"))?;
    }
    Ok(Some(CleanedFiles {
        segment,
        sources: group
            .iter()
            .map(|source| SourceSummary {
                base_offset: source.base_offset,
                next_offset: source.next_offset,
                size: source.size,
            })
            .collect(),
    }))
}

/// Writes `pieces` back to back at `position`; returns the position after them.
async fn write<F: StorageFile>(
    file: &F,
    pieces: Vec<Bytes>,
    position: u64,
    throttle: &mut Option<RecoveryThrottle>,
) -> io::Result<u64> {
    let len: u64 = pieces.iter().map(|piece| piece.len() as u64).sum();
    if len == 0 {
        return Ok(position);
    }
    pace(throttle, len).await;
    file.write_all_in_order_at(pieces, position).await?;
    Ok(position + len)
}

/// Waits until the shard's cleaner IO limit lets `bytes` more go.
async fn pace(throttle: &mut Option<RecoveryThrottle>, bytes: u64) {
    if let Some(throttle) = throttle {
        // The runtime's clock, the one its timers run on (virtual in a paused runtime).
        let clock = Clock::SYSTEM;
        let delay = throttle.delay(clock.now());
        if !delay.is_zero() {
            clock.sleep(delay).await;
        }
        throttle.charge(bytes, clock.now());
    }
}

/// Reads a closed segment's batches a chunk at a time, each batch whole and validated.
struct SegmentReader<'a, F> {
    source: &'a SourceSegment<F>,
    position: u64,
}

impl<'a, F: StorageFile> SegmentReader<'a, F> {
    fn new(source: &'a SourceSegment<F>) -> Self {
        SegmentReader {
            source,
            position: 0,
        }
    }

    /// The next whole batches, as read (their headers parsed, nothing else checked yet), or
    /// `None` at the segment's end.
    async fn next_chunk(
        &mut self,
        dir: &std::path::Path,
        throttle: &mut Option<RecoveryThrottle>,
    ) -> Result<Option<Bytes>, LogError> {
        let source = self.source;
        let left = source.size - self.position;
        if left == 0 {
            return Ok(None);
        }
        let mut want = (CHUNK_BYTES as u64).min(left) as usize;
        loop {
            pace(throttle, want as u64).await;
            let (result, buf) = source
                .log
                .read_at(ReadBuf::with_capacity(want), self.position)
                .await;
            result.map_err(|error| corrupt(dir, source.base_offset, error))?;
            let bytes = buf.into_bytes();
            if bytes.len() < want {
                return Err(corrupt(
                    dir,
                    source.base_offset,
                    "the segment is shorter than its data",
                ));
            }
            let mut at = 0;
            while at < bytes.len() {
                // A header cut by the chunk's end (either format's: a Kafka batch may be
                // shorter than Strata's header) is read whole with the next chunk.
                let header = match BatchHeader::parse(&bytes[at..]) {
                    Ok(header) => header,
                    Err(BatchError::TooShort { .. }) => break,
                    Err(error) => return Err(corrupt(dir, source.base_offset, error)),
                };
                let len = header.batch_len as usize;
                if len > bytes.len() - at {
                    break;
                }
                at += len;
            }
            if at == 0 {
                // One batch larger than a chunk: read it whole.
                let header = BatchHeader::parse(&bytes)
                    .map_err(|error| corrupt(dir, source.base_offset, error))?;
                want = (header.batch_len as usize).max(want + 1);
                if want as u64 > left {
                    return Err(corrupt(
                        dir,
                        source.base_offset,
                        "a batch runs past the data",
                    ));
                }
                continue;
            }
            self.position += at as u64;
            return Ok(Some(bytes.slice(..at)));
        }
    }
}
