//! Durability: when a flush is due, and a flush in two halves (the sync runs without the log,
//! so appends go on meanwhile; its completion moves the durable offset and the checkpoints).

use super::PartitionLog;
use super::config::FlushPolicy;
use super::error::LogError;
use std::io;
use std::rc::Rc;

use super::recovery_point::RecoveryPoint;
use crate::io::{Storage, StorageFile};

/// A sync in progress: the files written since the last one, and the offset they make durable.
pub struct FlushJob<F> {
    pub(super) target_offset: u64,
    pub(super) point: RecoveryPoint,
    pub(super) files: Vec<(u64, Rc<F>)>,
}

/// How a [`FlushJob`] ended; hand it back to [`PartitionLog::complete_flush`].
pub struct FlushOutcome {
    pub(super) target_offset: u64,
    pub(super) point: RecoveryPoint,
    /// The segment whose sync failed, and why.
    pub(super) failure: Option<(u64, io::Error)>,
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

impl<S: Storage> PartitionLog<S> {
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
            if let Err(error) = segment.persist_index(&self.storage, &self.dir).await {
                // The index is a cache: losing it costs a rebuild on the next open, not data.
                tracing::warn!(dir = %self.dir.display(), "writing index of segment {} failed: {error}", segment.base_offset);
            }
        }
        Ok(self.durable_offset)
    }
}
