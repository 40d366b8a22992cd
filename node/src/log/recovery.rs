//! Opening a log: segments found and validated from the recovery point on, torn or corrupt
//! tails cut, indexes rebuilt where they disagree, leader epochs and producer states rebuilt
//! from the batches when their checkpoints are missing or behind.

use super::IndexCache;
use super::PartitionLog;
use super::checkpoints::EPOCH_FILE_NAME;
use super::checkpoints::HIGH_WATERMARK_FILE_NAME;
use super::checkpoints::PRODUCER_SNAPSHOT_FILE_NAME;
use super::checkpoints::decode_high_watermark;
use super::config::DirectWrites;
use super::config::LogConfig;
use super::config::SEGMENT_BYTES_MAX;
use super::error::LogError;
use super::index;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use strata_wire::batch::BatchHeader;

use super::RecoveryReport;
use super::append_path::LargeAppends;
use super::index::SegmentIndex;
use super::producers::ProducerStates;
use super::recovery_point::{self, RecoveryPoint, Trust};
use super::segment::{Segment, parse_base_offset, read_whole};
use super::tail_cache::{TAIL_CACHE_BYTES, TailCache};
use crate::io::{Storage, StorageFile};
use crate::replication::EpochCache;

fn check_config(config: &LogConfig) -> Result<(), LogError> {
    if config.segment_bytes == 0 || config.segment_bytes > SEGMENT_BYTES_MAX {
        return Err(LogError::Config(format!(
            "segment_bytes must be in 1..={SEGMENT_BYTES_MAX}"
        )));
    }
    if config.index_interval_bytes == 0 {
        return Err(LogError::Config("index_interval_bytes must be > 0".into()));
    }
    Ok(())
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
        check_config(&config)?;
        let io_error = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| LogError::Io {
                what,
                path,
                source: Arc::new(source),
            }
        };
        storage
            .create_dir_all(&dir)
            .await
            .map_err(io_error("create", &dir))?;
        super::compaction::finish_interrupted_swaps(&storage, &dir).await?;
        let clean_offset = PartitionLog::read_clean_offset(&storage, &dir).await;
        let deleted_before = PartitionLog::read_deleted_before(&storage, &dir).await;
        let mut bases: Vec<u64> = storage
            .list_dir(&dir)
            .await
            .map_err(io_error("list", &dir))?
            .iter()
            .filter_map(|name| parse_base_offset(name, "log"))
            .collect();
        bases.sort_unstable();

        // The checkpoints are read here and written when they move, each write opening its file:
        // a partition holds no descriptor for them. Created here, before the folder's sync that
        // a new partition's first segment makes, so that their writes need no folder sync.
        let recovery_path = dir.join(recovery_point::FILE_NAME);
        let recovery_file = storage
            .open(&recovery_path, true)
            .await
            .map_err(io_error("open", &recovery_path))?;
        let recovery_point = read_whole(&recovery_file)
            .await
            .ok()
            .and_then(|bytes| RecoveryPoint::decode(bytes.as_slice()));
        drop(recovery_file);
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
        drop(high_watermark_file);
        let epochs_trusted = epochs.is_some();
        let mut log = PartitionLog {
            producers: ProducerStates::default(),
            producer_snapshot_offset_max: 0,
            epochs: epochs.unwrap_or_default(),
            high_watermark_checkpoint,
            deleted_before: 0,
            remote_copied_before: 0,
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
            clean_offset,
            delete_horizon_ms: None,
        };
        let mut report = RecoveryReport::default();
        let mut validated_any = log.recover_segments(&bases, now_ms, &mut report).await?;
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
        // A delete whose records a crash then lost leaves the log starting at its end.
        log.deleted_before = deleted_before.min(log.log_end_offset());
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

    /// Recovers the segments found, oldest first: each is validated past the recovery point
    /// and cut where torn; one that does not continue the log, or that follows a damaged
    /// closed segment, goes with every later one. Returns whether any segment was validated
    /// (and so may hold bytes only the page cache has).
    async fn recover_segments(
        &mut self,
        bases: &[u64],
        now_ms: i64,
        report: &mut RecoveryReport,
    ) -> Result<bool, LogError> {
        let count = bases.len();
        let mut validated_any = false;
        for (at, &base) in bases.iter().enumerate() {
            let active = at + 1 == count;
            let trust = recovery_point::trust(base, self.recovery_point);
            validated_any |= trust != Trust::Whole;
            if let Some(previous) = self.segments.last()
                && previous.next_offset != base
            {
                tracing::error!(
                    dir = %self.dir.display(),
                    "segment {base} does not continue the log (previous ends at {}); dropping it and every later segment",
                    previous.next_offset
                );
                for &drop_base in &bases[at..] {
                    self.remove_segment_files(drop_base).await?;
                    report.dropped_segments += 1;
                }
                break;
            }
            let (segment, damaged) = self.recover_segment(base, trust, now_ms, report).await?;
            self.segments.push(segment);
            if damaged && !active {
                // Later segments would follow a hole: they go.
                for &drop_base in &bases[at + 1..] {
                    self.remove_segment_files(drop_base).await?;
                    report.dropped_segments += 1;
                }
                break;
            }
        }
        Ok(validated_any)
    }

    /// Opens (creating where missing) a segment's log, offset index and time index files: the
    /// log to keep, the index files for the caller's use (see [`super::segment::open_index_files`]).
    pub(super) async fn open_segment_files(
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
                    source: Arc::new(source),
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

    pub(super) async fn create_segment(
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
                source: Arc::new(source),
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
            log,
        );
        segment.reserved_to = reserved_to;
        Ok(segment)
    }

    /// Opens one segment found on disk, checks its index against its log, and (for the active
    /// segment, or any that looks damaged) validates every batch after the last index entry and
    /// cuts a torn or corrupt tail. Returns the segment and whether it was damaged.
    pub(super) async fn recover_segment(
        &mut self,
        base_offset: u64,
        trust: Trust,
        now_ms: i64,
        report: &mut RecoveryReport,
    ) -> Result<(Segment<S::File>, bool), LogError> {
        let path = self.segment_path(base_offset, "log");
        let io_error = |what| {
            let path = path.clone();
            move |source| LogError::Io {
                what,
                path,
                source: Arc::new(source),
            }
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
        let mut segment = Segment::new(base_offset, now_ms, index, interval_bytes, log);
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
        offset_index
            .truncate(persisted * index::OFFSET_ENTRY_LEN as u64)
            .await
            .map_err(io_error("truncate index"))?;
        time_index
            .truncate(persisted * index::TIME_ENTRY_LEN as u64)
            .await
            .map_err(io_error("truncate index"))?;
        segment
            .persist_index_to(&(offset_index, time_index))
            .await
            .map_err(io_error("write index"))?;
        Ok((segment, damaged))
    }

    /// Reads segment `at`'s index back from its files.
    pub(super) async fn load_index_of(&self, at: usize) -> Result<SegmentIndex, LogError> {
        let segment = &self.segments[at];
        let loaded = segment.load_index(&self.storage, &self.dir).await;
        loaded.map_err(|source| LogError::Io {
            what: "read index",
            path: self.segment_path(segment.base_offset, "index"),
            source: Arc::new(source),
        })
    }

    /// Calls `visit` with the header of every batch from `from_offset` (a batch boundary) to the
    /// log end, in order: the scan behind every rebuild of state derived from the batches. Reads
    /// in chunks from the index entry at or below `from_offset`; walks headers only.
    pub(super) async fn scan_headers(
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
                source: Arc::new(source),
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

    /// Rebuilds the epoch cache from the batch headers (its file was missing or damaged).
    pub(super) async fn rebuild_epochs(&mut self) -> Result<(), LogError> {
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

    /// Sets the producer state to what the log holds: the snapshot, if it is intact and not
    /// beyond the log end, plus every batch after it; otherwise every batch of the log. A
    /// snapshot beyond the log end (the batches it counts were lost or cut) is discarded.
    pub(super) async fn rebuild_producers(&mut self, now_ms: i64) -> Result<(), LogError> {
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
        self.scan_headers(from, |header| producers.apply(header))
            .await?;
        producers.forget_transactions_below(log_start);
        producers.expire(now_ms);
        self.producers = producers;
        Ok(())
    }
}
