//! Housekeeping: retention by time and size, truncation (a follower's divergent tail), and
//! restarting the log at an offset (a follower far behind a leader's log start).

use super::IndexCache;
use super::PartitionLog;
use super::error::LogError;
use std::io;
use std::sync::Arc;

use super::checkpoints::PRODUCER_SNAPSHOT_EXTENSION;
use super::producers::ProducerStates;
use super::recovery_point::RecoveryPoint;
use super::segment::Segment;
use crate::io::{Storage, StorageFile};
use crate::replication::{EpochCache, EpochEntry};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
}

/// What a log started over at an offset takes from below it, when it can be had (from the
/// remote tier of a tiered partition): the producer state there, as a snapshot's bytes, and
/// the leader epochs of the records just below.
#[derive(Debug, Clone, Default)]
pub struct StateBelow {
    pub producer_snapshot: Option<bytes::Bytes>,
    pub epochs: Vec<EpochEntry>,
}

impl<S: Storage> PartitionLog<S> {
    /// Removes every batch and starts over, empty, at `offset` (a follower whose leader no
    /// longer holds the follower's log end: retention removed it, or it lies in the remote
    /// tier). The producer state and the epochs start from `below`: those of a snapshot for
    /// another offset, or damaged, are not taken. Returns `offset`.
    pub async fn restart_at(
        &mut self,
        offset: u64,
        below: StateBelow,
        now_ms: i64,
    ) -> Result<u64, LogError> {
        self.check_writable()?;
        self.tail_cache.clear();
        self.discard_producer_snapshot().await?;
        self.producers = ProducerStates::default();
        let restored = below
            .producer_snapshot
            .as_deref()
            .map(ProducerStates::decode)
            .and_then(|decoded| {
                decoded
                    .inspect_err(|error| {
                        tracing::warn!(dir = %self.dir.display(), "the producer snapshot from below the log start is not taken: {error}");
                    })
                    .ok()
            });
        match restored {
            Some(snapshot) if snapshot.offset == offset => self.producers = snapshot.states,
            Some(snapshot) => {
                tracing::warn!(dir = %self.dir.display(), snapshot = snapshot.offset, offset, "the producer snapshot from below the log start is for another offset: not taken");
            }
            None => {}
        }
        let log_start = offset;
        if self.deleted_before > log_start {
            self.deleted_before = log_start;
            self.persist_deleted_before().await?;
        }
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
        let epochs = epochs_below(&below.epochs, log_start);
        if self.epochs != epochs {
            self.epochs = epochs;
            self.persist_epochs().await?;
        }
        if self.producers != ProducerStates::default() {
            self.snapshot_producers(now_ms).await;
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
            return self
                .restart_at(log_start, StateBelow::default(), now_ms)
                .await;
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
        let (storage, dir) = (self.storage.clone(), self.dir.clone());
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
                source: Arc::new(source),
            })?;
        assert!(
            end.damage.is_none(),
            "written batches walk cleanly: {:?}",
            end.damage
        );
        let results = [
            active.log.truncate(end.valid_len).await,
            active.truncate_index(&storage, &dir).await,
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

    /// Moves the log start up to `offset` (at most the log end): Kafka's DeleteRecords, and a
    /// follower following its leader's start. Readers lose the records below it at once
    /// (durably: the new start is synced before this returns); closed segments wholly below
    /// it are deleted, the rest of their bytes stay until retention or a roll removes them.
    /// Returns the log start.
    pub async fn delete_records_before(
        &mut self,
        offset: u64,
        now_ms: i64,
    ) -> Result<u64, LogError> {
        self.check_writable()?;
        let offset = offset.min(self.log_end_offset());
        if offset <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        if offset == self.log_end_offset() && !self.active().is_empty() {
            // Everything goes: roll, so the segment holding it can go too.
            self.roll(now_ms).await?;
            self.snapshot_producers(now_ms).await;
        }
        self.deleted_before = offset;
        self.persist_deleted_before().await?;
        while self.segments.len() > 1 && self.segments[1].base_offset <= offset {
            let segment = self.segments.remove(0);
            let base = segment.base_offset;
            drop(segment);
            self.index_cache.remove(base);
            self.remove_segment_files(base).await?;
        }
        self.tail_cache.drop_below(offset);
        self.producers.forget_transactions_below(offset);
        if self.epochs.trim_before(offset) {
            self.persist_epochs().await?;
        }
        tracing::info!(dir = %self.dir.display(), log_start = offset, "records deleted below the new log start");
        Ok(offset)
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
        if !self.config.cleanup.delete {
            // A compacted topic without `delete` keeps every key's last record however old.
            return Ok(report);
        }
        let expired = |segment: &Segment<S::File>, retention_ms: Option<i64>| {
            retention_ms.is_some_and(|retention_ms| {
                !segment.is_empty() && segment.max_timestamp_ms < now_ms - retention_ms
            })
        };
        // A tiered log keeps locally what its local limits say, and nothing the remote tier
        // does not hold yet: the whole log's limits apply to the remote tier.
        let (retention_ms, retention_bytes, below_offset) = if self.config.remote_storage {
            (
                self.config.local_retention_ms,
                self.config.local_retention_bytes,
                below_offset.min(self.remote_copied_before),
            )
        } else {
            (
                self.config.retention_ms,
                self.config.retention_bytes,
                below_offset,
            )
        };
        if expired(self.active(), retention_ms) {
            self.check_writable()?;
            self.roll(now_ms).await?;
            self.snapshot_producers(now_ms).await;
        }
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let over_size = retention_bytes
                .is_some_and(|retention_bytes| self.size_bytes() - oldest.size >= retention_bytes);
            if !(expired(oldest, retention_ms) || over_size)
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
        self.producers
            .forget_transactions_below(self.log_start_offset());
        Ok(report)
    }

    pub(super) async fn remove_segment_files(&mut self, base_offset: u64) -> Result<(), LogError> {
        // A segment's files, and the producer snapshot at its base (the end of the segment
        // before it, which is gone or going).
        let extensions = ["log", "index", "timeindex", PRODUCER_SNAPSHOT_EXTENSION];
        for extension in extensions {
            let path = self.segment_path(base_offset, extension);
            match self.storage.remove_file(&path).await {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(LogError::Io {
                        what: "remove",
                        path,
                        source: Arc::new(source),
                    });
                }
            }
        }
        self.sync_dir().await?;
        Ok(())
    }
}

/// The epoch cache of a log starting at `log_start` from `entries` (those of the records just
/// below it): the one in force there and none after. Entries out of order are not taken.
fn epochs_below(entries: &[EpochEntry], log_start: u64) -> EpochCache {
    let ordered = entries
        .windows(2)
        .all(|pair| pair[0].epoch < pair[1].epoch && pair[0].start_offset <= pair[1].start_offset);
    let mut epochs = EpochCache::default();
    if ordered {
        for entry in entries
            .iter()
            .filter(|entry| entry.start_offset < log_start)
        {
            epochs.assign(entry.epoch, entry.start_offset);
        }
        epochs.trim_before(log_start);
    }
    epochs
}
