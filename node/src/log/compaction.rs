//! The log's side of compaction: which part of it a clean may rewrite, the swap of cleaned
//! segments for the ones they replace, and finishing or discarding a swap a crash interrupted.
//!
//! A clean runs beside the log (see [`super::cleaner`]): [`PartitionLog::plan_clean`] hands it
//! the closed segments' files, the cleaner writes each cleaned segment as
//! `<base>.{log,index,timeindex}.cleaned` and syncs them, and [`PartitionLog::finish_clean`]
//! swaps them in. Appends go on into the active segment meanwhile, and reads see the old
//! segments (whose files stay open while a read holds them) or the new ones, never a mix.
//!
//! The swap, each step durable before the next:
//! 1. the list of cleaned segments (base and end offsets) is written to
//!    [`CLEANER_SWAP_FILE_NAME`] (written whole under another name, synced, then renamed): from
//!    here the clean is decided, for all its segments at once;
//! 2. for each cleaned segment, the segments it replaces lose their files and the cleaned
//!    files take their names, the log file last;
//! 3. the swap file is removed.
//!
//! On open, [`finish_interrupted_swaps`] completes a decided clean (each cleaned segment whose
//! `.cleaned` log file is still there) and removes every other `.cleaned` file (a clean not
//! decided): the partition is as before the clean or as after it, never a mix.

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::PartitionLog;
use super::RecoveryReport;
use super::clean_plan::{CLEANED_SUFFIX, CleanPlan, SourceSegment, cleaned_path};
use super::cleaner::{CleanOutcome, CleanStats};
use super::error::LogError;
use super::index::SegmentIndex;
use super::recovery_point::Trust;
use super::segment::{Segment, file_name, parse_base_offset, read_whole};
use crate::io::Storage;

/// The cleaner's checkpoint inside the partition folder: the first offset not yet cleaned.
pub const CLEANER_CHECKPOINT_FILE_NAME: &str = "cleaner-checkpoint";

/// The decided clean being swapped in (see the module's documentation).
pub const CLEANER_SWAP_FILE_NAME: &str = "cleaner-swap";
/// Where [`CLEANER_SWAP_FILE_NAME`] is written before it is renamed into place.
const CLEANER_SWAP_TEMP_NAME: &str = "cleaner-swap.tmp";

/// A compacted log's state as the cleaner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionStatus {
    /// The first offset not yet cleaned.
    pub clean_offset: u64,
    /// Bytes not yet cleaned over the bytes a clean may rewrite (0 when there is nothing).
    pub dirty_ratio: f64,
    /// Why the log cannot be cleaned at all, when it cannot.
    pub uncleanable: Option<&'static str>,
}

/// What a finished clean changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SwapReport {
    /// Cleaned segments swapped in.
    pub swapped: usize,
    /// Source segments they replaced.
    pub replaced: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub stats: CleanStats,
    /// Set when the log changed under the clean (retention, truncation) and it was discarded.
    pub discarded: bool,
}

pub(super) fn encode_clean_offset(offset: u64) -> [u8; 12] {
    super::checkpoints::encode_high_watermark(offset)
}

pub(super) fn decode_clean_offset(bytes: &[u8]) -> Option<u64> {
    super::checkpoints::decode_high_watermark(bytes)
}

/// The swap file's contents: each cleaned segment's (base, end) offsets, and a CRC.
fn encode_swap(segments: &[(u64, u64)]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(4 + segments.len() * 16 + 4);
    bytes.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    for (base, end) in segments {
        bytes.extend_from_slice(&base.to_le_bytes());
        bytes.extend_from_slice(&end.to_le_bytes());
    }
    let crc = strata_wire::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

fn decode_swap(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    let (body, crc) = bytes.split_last_chunk::<4>()?;
    if strata_wire::crc32c(body) != u32::from_le_bytes(*crc) {
        return None;
    }
    let (count, pairs) = body.split_first_chunk::<4>()?;
    let count = u32::from_le_bytes(*count) as usize;
    if pairs.len() != count.checked_mul(16)? {
        return None;
    }
    Some(
        pairs
            .chunks_exact(16)
            .map(|pair| {
                let base = u64::from_le_bytes(pair[..8].try_into().expect("8 bytes"));
                let end = u64::from_le_bytes(pair[8..].try_into().expect("8 bytes"));
                (base, end)
            })
            .collect(),
    )
}

/// Step 2 for one cleaned segment `[base, end)`, given the bases of the segments the folder
/// holds: the replaced segments' files go, the cleaned files take their names (the log last).
/// Nothing to do once the cleaned log file has its name, so running it again is harmless.
async fn swap_segment<S: Storage>(
    storage: &S,
    dir: &Path,
    (base, end): (u64, u64),
    bases: &[u64],
) -> Result<(), LogError> {
    let cleaned_log = cleaned_path(dir, base, "log");
    if storage.open(&cleaned_log, false).await.is_err() {
        return Ok(());
    }
    for &replaced in bases.iter().filter(|b| **b >= base && **b < end) {
        for extension in ["log", "index", "timeindex"] {
            remove_if_present(storage, &dir.join(file_name(replaced, extension))).await?;
        }
    }
    for extension in ["index", "timeindex", "log"] {
        let from = cleaned_path(dir, base, extension);
        match storage
            .rename(&from, &dir.join(file_name(base, extension)))
            .await
        {
            // An index the cleaner did not get to write is rebuilt on open.
            Err(error) if error.kind() == io::ErrorKind::NotFound && extension != "log" => {}
            result => result.map_err(io_error("rename", &from))?,
        }
    }
    Ok(())
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LogError {
    let path = path.to_path_buf();
    move |source| LogError::Io {
        what,
        path,
        source: Arc::new(source),
    }
}

async fn remove_if_present<S: Storage>(storage: &S, path: &Path) -> Result<(), LogError> {
    match storage.remove_file(path).await {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(io_error("remove", path)(error))
        }
        _ => Ok(()),
    }
}

/// Run on open, before the segments are read: completes a decided clean and removes the files
/// of one that was not.
pub(super) async fn finish_interrupted_swaps<S: Storage>(
    storage: &S,
    dir: &Path,
) -> Result<(), LogError> {
    let names = storage.list_dir(dir).await.map_err(io_error("list", dir))?;
    let swap_path = dir.join(CLEANER_SWAP_FILE_NAME);
    if names
        .iter()
        .any(|name| name == Path::new(CLEANER_SWAP_FILE_NAME))
    {
        let file = storage
            .open(&swap_path, false)
            .await
            .map_err(io_error("open", &swap_path))?;
        let bytes = read_whole(&file)
            .await
            .map_err(io_error("read", &swap_path))?;
        drop(file);
        // Written whole and synced before it took its name: damage is not a torn write, and
        // guessing which segments to keep could lose records.
        let segments = decode_swap(bytes.as_slice()).ok_or_else(|| LogError::Io {
            what: "recover a clean",
            path: swap_path.clone(),
            source: Arc::new(io::Error::new(
                io::ErrorKind::InvalidData,
                "damaged swap file",
            )),
        })?;
        let bases: Vec<u64> = names
            .iter()
            .filter_map(|name| parse_base_offset(name, "log"))
            .collect();
        for segment in &segments {
            swap_segment(storage, dir, *segment, &bases).await?;
        }
        storage.sync_dir(dir).await.map_err(io_error("sync", dir))?;
        remove_if_present(storage, &swap_path).await?;
        tracing::warn!(
            dir = %dir.display(),
            segments = segments.len(),
            "completed the swap of a clean a crash interrupted"
        );
    }
    let mut removed = false;
    for name in &names {
        let leftover = name == Path::new(CLEANER_SWAP_TEMP_NAME)
            || name
                .extension()
                .is_some_and(|extension| extension == CLEANED_SUFFIX);
        if leftover {
            remove_if_present(storage, &dir.join(name)).await?;
            removed = true;
        }
    }
    if removed {
        storage.sync_dir(dir).await.map_err(io_error("sync", dir))?;
    }
    Ok(())
}

impl<S: Storage> PartitionLog<S> {
    /// The first offset not yet cleaned.
    pub fn clean_offset(&self) -> u64 {
        self.clean_offset
            .clamp(self.log_start_offset(), self.log_end_offset())
    }

    /// Where a clean would end: the first offset of the active segment, of the first segment
    /// with a record younger than `min.compaction.lag.ms`, or of the first segment not wholly
    /// below `below_offset` (the high watermark) and the last stable offset, whichever comes
    /// first; and the index of the first segment past it. Below the LSO every transaction is
    /// decided, so the cleaner knows which records are aborted.
    fn cleanable_end(&self, now_ms: i64, below_offset: u64) -> (u64, usize) {
        let below_offset = self
            .producers
            .transactions()
            .last_stable_offset(below_offset);
        let lag_ms = self.config.compaction.min_lag_ms;
        let closed = self.segments.len() - 1;
        let end = self.segments[..closed]
            .iter()
            .position(|segment| {
                segment.next_offset > below_offset
                    || segment.max_timestamp_ms > now_ms.saturating_sub(lag_ms)
            })
            .unwrap_or(closed);
        (self.segments[end].base_offset, end)
    }

    /// Whether a tombstone or marker kept by an earlier clean of this process may go now (a
    /// clean is then due even with nothing new to clean, as under Kafka's KIP-534).
    fn deletes_due(&self, now_ms: i64) -> bool {
        self.delete_horizon_ms
            .is_some_and(|horizon| horizon <= now_ms)
    }

    /// For a compacted log: rolls an active segment older than `segment.ms` though nothing is
    /// appended (a roll otherwise waits for the next append), so its records become cleanable.
    pub async fn roll_for_compaction(&mut self, now_ms: i64) -> Result<(), LogError> {
        let due = self.config.cleanup.compact
            && !self.active().is_empty()
            && self
                .config
                .segment_ms
                .is_some_and(|segment_ms| now_ms - self.active().opened_at_ms >= segment_ms);
        if due {
            self.check_writable()?;
            self.roll(now_ms).await?;
        }
        Ok(())
    }

    /// The dirty ratio and whether a clean could run now.
    pub fn compaction_status(&self, now_ms: i64, below_offset: u64) -> CompactionStatus {
        let clean_offset = self.clean_offset();
        let (_, end) = self.cleanable_end(now_ms, below_offset);
        let (mut clean, mut dirty) = (0u64, 0u64);
        for segment in &self.segments[..end] {
            if segment.next_offset <= clean_offset {
                clean += segment.size;
            } else {
                dirty += segment.size;
            }
        }
        let total = clean + dirty;
        let uncleanable = if !self.config.cleanup.compact {
            Some("the topic is not compacted")
        } else if self.failed.is_some() {
            Some("the log has failed")
        } else {
            None
        };
        CompactionStatus {
            clean_offset,
            dirty_ratio: if total == 0 {
                0.0
            } else {
                dirty as f64 / total as f64
            },
            uncleanable,
        }
    }

    /// A clean to run now, if the log is compacted and due: its dirty ratio reached
    /// `min.cleanable.dirty.ratio`, or a record not yet cleaned is older than
    /// `max.compaction.lag.ms`.
    pub fn plan_clean(&self, now_ms: i64, below_offset: u64) -> Option<CleanPlan<S>> {
        let status = self.compaction_status(now_ms, below_offset);
        let (cleanable_end, end) = self.cleanable_end(now_ms, below_offset);
        let nothing_new = cleanable_end <= status.clean_offset && !self.deletes_due(now_ms);
        if status.uncleanable.is_some() || end == 0 || nothing_new {
            return None;
        }
        let compaction = self.config.compaction;
        // Kafka compares the first dirty batch's time; a segment's newest record is what the
        // log keeps, so a record may wait up to a segment's span past the lag.
        let overdue = self.segments[..end].iter().any(|segment| {
            segment.next_offset > status.clean_offset
                && segment.max_timestamp_ms < now_ms.saturating_sub(compaction.max_lag_ms)
        }) || self.deletes_due(now_ms);
        if status.dirty_ratio < compaction.min_cleanable_dirty_ratio && !overdue {
            return None;
        }
        Some(CleanPlan {
            storage: self.storage.clone(),
            dir: self.dir.clone(),
            sources: self.segments[..end]
                .iter()
                .map(|segment| SourceSegment {
                    base_offset: segment.base_offset,
                    next_offset: segment.next_offset,
                    size: segment.size,
                    log: segment.log.clone(),
                })
                .collect(),
            first_dirty: status.clean_offset,
            cleanable_end,
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            delete_retention_ms: compaction.delete_retention_ms,
            producer_last_offsets: self.producers.last_offsets(),
            aborted: self.producers.transactions().aborted().to_vec(),
            now_ms,
        })
    }

    /// Swaps in what a clean wrote, if the segments it read are still the log's (retention,
    /// a truncation or a restart may have changed them meanwhile: then the clean is discarded).
    pub async fn finish_clean(
        &mut self,
        outcome: CleanOutcome,
        now_ms: i64,
    ) -> Result<SwapReport, LogError> {
        self.check_writable()?;
        let mut report = SwapReport {
            stats: outcome.stats,
            ..SwapReport::default()
        };
        let closed = self.segments.len() - 1;
        let unchanged = outcome.segments.iter().all(|cleaned| {
            cleaned.sources.iter().all(|source| {
                self.segments[..closed].iter().any(|segment| {
                    segment.base_offset == source.base_offset
                        && segment.next_offset == source.next_offset
                        && segment.size == source.size
                })
            })
        });
        if !unchanged {
            for cleaned in &outcome.segments {
                for extension in ["log", "index", "timeindex"] {
                    remove_if_present(
                        &self.storage,
                        &cleaned_path(&self.dir, cleaned.segment.base_offset, extension),
                    )
                    .await?;
                }
            }
            report.discarded = true;
            return Ok(report);
        }
        let decided: Vec<(u64, u64)> = outcome
            .segments
            .iter()
            .map(|cleaned| (cleaned.segment.base_offset, cleaned.segment.next_offset))
            .collect();
        if !decided.is_empty() {
            // Before the swap: the tail cache may still hold batches of the segments replaced,
            // and a read must never be served records the log no longer holds.
            self.tail_cache.clear();
            if let Err(error) = self.swap_all(&decided).await {
                return Err(self.fail(format!("swapping in a clean: {error}")));
            }
        }
        for cleaned in outcome.segments {
            let base = cleaned.segment.base_offset;
            let first = self
                .segments
                .iter()
                .position(|segment| segment.base_offset == base)
                .expect("checked above");
            let count = cleaned.sources.len();
            assert_eq!(
                self.segments[first + count - 1].next_offset,
                cleaned.segment.next_offset,
                "a cleaned segment covers exactly its sources"
            );
            report.bytes_before += cleaned.sources.iter().map(|s| s.size).sum::<u64>();
            report.bytes_after += cleaned.segment.size;
            for source in &cleaned.sources {
                self.index_cache.remove(source.base_offset);
            }
            let mut segment = self.reopen_cleaned(base, now_ms).await?;
            segment.index = SegmentIndex::default();
            self.segments.splice(first..first + count, [segment]);
            report.swapped += 1;
            report.replaced += count;
        }
        self.clean_offset = outcome.clean_offset;
        self.delete_horizon_ms = outcome.delete_horizon_ms;
        self.checkpoint_clean_offset().await;
        if !outcome.emptied_aborts.is_empty() {
            // Their markers may go once no snapshot lists them (see `cleaner::transactions`).
            self.producers.forget_emptied_aborts(
                outcome
                    .emptied_aborts
                    .iter()
                    .map(|emptied| (emptied.producer_id, emptied.marker_offset)),
            );
            self.snapshot_producers(now_ms).await;
        }
        Ok(report)
    }

    /// Steps 1-3 of the swap (see the module's documentation).
    async fn swap_all(&self, segments: &[(u64, u64)]) -> Result<(), LogError> {
        let storage = &self.storage;
        let dir = &*self.dir;
        let temp = dir.join(CLEANER_SWAP_TEMP_NAME);
        let decided = dir.join(CLEANER_SWAP_FILE_NAME);
        self.rewrite_checkpoint(&temp, Bytes::from(encode_swap(segments)))
            .await
            .map_err(io_error("write", &temp))?;
        storage
            .rename(&temp, &decided)
            .await
            .map_err(io_error("rename", &temp))?;
        storage.sync_dir(dir).await.map_err(io_error("sync", dir))?;
        let bases = self.segment_bases();
        for segment in segments {
            swap_segment(storage, dir, *segment, &bases).await?;
        }
        storage.sync_dir(dir).await.map_err(io_error("sync", dir))?;
        storage
            .remove_file(&decided)
            .await
            .map_err(io_error("remove", &decided))?;
        storage.sync_dir(dir).await.map_err(io_error("sync", dir))
    }

    async fn reopen_cleaned(
        &mut self,
        base: u64,
        now_ms: i64,
    ) -> Result<Segment<S::File>, LogError> {
        let mut report = RecoveryReport::default();
        let (segment, damaged) = self
            .recover_segment(base, Trust::Whole, now_ms, &mut report)
            .await?;
        if damaged {
            return Err(self.fail(format!("the cleaned segment {base} reads back damaged")));
        }
        Ok(segment)
    }

    /// Records the clean offset. A failure is only logged: a lost checkpoint makes the next
    /// clean treat more of the log as dirty, nothing worse.
    async fn checkpoint_clean_offset(&self) {
        let path = self
            .dir
            .join(super::compaction::CLEANER_CHECKPOINT_FILE_NAME);
        let bytes = Bytes::copy_from_slice(&encode_clean_offset(self.clean_offset));
        if let Err(error) = self.rewrite_checkpoint(&path, bytes).await {
            tracing::warn!(dir = %self.dir.display(), "writing the cleaner checkpoint failed: {error}");
        }
    }

    /// Reads the clean offset written by an earlier clean (0 when there is none).
    pub(super) async fn read_clean_offset(storage: &S, dir: &Path) -> u64 {
        let path = dir.join(CLEANER_CHECKPOINT_FILE_NAME);
        let Ok(file) = storage.open(&path, false).await else {
            return 0;
        };
        read_whole(&file)
            .await
            .ok()
            .and_then(|bytes| decode_clean_offset(bytes.as_slice()))
            .unwrap_or(0)
    }
}
