//! The small files beside a partition's segments, each rewritten whole and atomically: the
//! high watermark, the leader-epoch cache, the producer snapshot and the recovery point.

use super::PartitionLog;
use super::error::LogError;
use std::io;
use std::path::Path;

use bytes::Bytes;

use super::recovery_point::RecoveryPoint;
use crate::io::{Storage, StorageFile};

/// The leader-epoch checkpoint inside the partition folder.
pub const EPOCH_FILE_NAME: &str = "leader-epoch-checkpoint";

/// The high watermark checkpoint inside the partition folder.
pub const HIGH_WATERMARK_FILE_NAME: &str = "high-watermark";

/// The log start a DeleteRecords set (inside a segment, or past it), inside the partition
/// folder: Kafka's `log-start-offset-checkpoint`, one per partition.
pub const LOG_START_FILE_NAME: &str = "log-start-offset";

/// The idempotent-producer snapshot inside the partition folder (see [`producers`]).
pub const PRODUCER_SNAPSHOT_FILE_NAME: &str = "producer-snapshot";
/// The extension of a tiered partition's producer snapshot at a segment's end, named by that
/// offset (the next segment's base): `<offset>.snapshot`.
pub const PRODUCER_SNAPSHOT_EXTENSION: &str = "snapshot";

pub(super) fn encode_high_watermark(high_watermark: u64) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&high_watermark.to_le_bytes());
    let crc = strata_wire::crc32c(&bytes[..8]);
    bytes[8..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

pub(super) fn decode_high_watermark(bytes: &[u8]) -> Option<u64> {
    let bytes: &[u8; 12] = bytes.get(..12)?.try_into().ok()?;
    let crc = u32::from_le_bytes(bytes[8..].try_into().ok()?);
    (strata_wire::crc32c(&bytes[..8]) == crc)
        .then(|| u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")))
}

impl<S: Storage> PartitionLog<S> {
    /// Records the high watermark so a restarted replica does not start from zero. Not synced:
    /// a lost checkpoint only makes the new high watermark start lower.
    pub async fn checkpoint_high_watermark(&mut self, high_watermark: u64) {
        let high_watermark = high_watermark.min(self.log_end_offset());
        if high_watermark == self.high_watermark_checkpoint {
            return;
        }
        self.high_watermark_checkpoint = high_watermark;
        let bytes = Bytes::copy_from_slice(&encode_high_watermark(high_watermark));
        let path = self.dir.join(HIGH_WATERMARK_FILE_NAME);
        if let Err(error) = self.write_small_file(&path, bytes).await {
            tracing::warn!(dir = %self.dir.display(), "writing the high watermark failed: {error}");
        }
    }

    /// Writes `bytes` over the start of a fixed-size checkpoint of the partition's folder (the
    /// recovery point, the high watermark), not synced. Opened for the write only: a partition
    /// holds no descriptor for its checkpoints (see [`super::segment::open_index_files`]); the
    /// open costs little beside the sync that precedes a recovery point's write.
    async fn write_small_file(&self, path: &Path, bytes: Bytes) -> io::Result<()> {
        self.storage
            .open(path, true)
            .await?
            .write_all_at(bytes, 0)
            .await
    }

    /// Replaces the contents of a small file of the partition's folder (the epoch checkpoint,
    /// the producer snapshot) in place and syncs it; a file created here is made durable by a
    /// sync of the folder too. Opened for the call only: these are written rarely, and a
    /// broker's file descriptors are better spent on segments.
    pub(super) async fn rewrite_checkpoint(&self, path: &Path, bytes: Bytes) -> io::Result<()> {
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

    /// Reads the log start a DeleteRecords set (0 when there is none).
    pub(super) async fn read_deleted_before(storage: &S, dir: &Path) -> u64 {
        let path = dir.join(LOG_START_FILE_NAME);
        let Ok(file) = storage.open(&path, false).await else {
            return 0;
        };
        super::segment::read_whole(&file)
            .await
            .ok()
            .and_then(|bytes| decode_high_watermark(bytes.as_slice()))
            .unwrap_or(0)
    }

    /// Writes the log start a DeleteRecords set, durably.
    pub(super) async fn persist_deleted_before(&mut self) -> Result<(), LogError> {
        let path = self.dir.join(LOG_START_FILE_NAME);
        let bytes = Bytes::copy_from_slice(&encode_high_watermark(self.deleted_before));
        let written = self.rewrite_checkpoint(&path, bytes).await;
        written.map_err(|error| self.fail(format!("writing {} failed: {error}", path.display())))
    }

    /// Writes the epoch cache durably (rare: once per leader epoch, and after truncations).
    pub(super) async fn persist_epochs(&mut self) -> Result<(), LogError> {
        let bytes = self.epochs.encode();
        let path = self.dir.join(EPOCH_FILE_NAME);
        let written = self.rewrite_checkpoint(&path, Bytes::from(bytes)).await;
        written.map_err(|error| self.fail(format!("writing {} failed: {error}", path.display())))
    }

    /// Writes the producer state, expired producers dropped, as the snapshot for the log end
    /// (on roll and close, so opening scans at most about a segment). In place and synced, as
    /// the epoch checkpoint: a torn snapshot fails its CRC and costs a longer scan on open, never
    /// a wrong answer. A failure is logged, not fatal: the log is the truth.
    pub(super) async fn snapshot_producers(&mut self, now_ms: i64) {
        self.producers.expire(now_ms);
        let offset = self.log_end_offset();
        let bytes = Bytes::from(self.producers.encode(offset));
        // Whatever happens below, the file may now claim `offset`.
        self.producer_snapshot_offset_max = self.producer_snapshot_offset_max.max(offset);
        let path = self.dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        let written = self.rewrite_checkpoint(&path, bytes.clone()).await;
        match written {
            Ok(()) => self.producer_snapshot_offset_max = offset,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), "writing the producer snapshot failed: {error}");
            }
        }
        // A segment just closed: a tiered partition keeps the producer state at its end, to
        // go up to the remote tier with it (a replica that starts at a later local log start
        // takes its producer state from there). Not synced, to keep a sync off the append
        // path at every roll: one lost to a power failure goes up as none, one torn fails its
        // CRC where it is read, and the replica starts without that state as it would
        // without a remote tier.
        let rolled = self.segments.len() > 1
            && self.active().is_empty()
            && self.active().base_offset == offset;
        if self.config.remote_storage && rolled {
            let path = self.segment_path(offset, PRODUCER_SNAPSHOT_EXTENSION);
            if let Err(error) = self.write_small_file(&path, bytes).await {
                tracing::warn!(path = %path.display(), "writing a segment's producer snapshot failed: {error}");
            }
        }
    }

    /// Empties the producer snapshot durably (before a truncation below it).
    pub(super) async fn discard_producer_snapshot(&mut self) -> Result<(), LogError> {
        let path = self.dir.join(PRODUCER_SNAPSHOT_FILE_NAME);
        let discarded = self.rewrite_checkpoint(&path, Bytes::new()).await;
        discarded
            .map_err(|error| self.fail(format!("discarding {} failed: {error}", path.display())))?;
        self.producer_snapshot_offset_max = 0;
        Ok(())
    }

    /// Records how far the log is durable. Not synced: see [`checkpoint`].
    pub(super) async fn write_recovery_point(&mut self, point: RecoveryPoint) {
        self.recovery_point = Some(point);
        let bytes = Bytes::copy_from_slice(&point.encode());
        let path = self.dir.join(super::recovery_point::FILE_NAME);
        if let Err(error) = self.write_small_file(&path, bytes).await {
            tracing::warn!(dir = %self.dir.display(), "writing the recovery point failed: {error}");
        }
    }
}
