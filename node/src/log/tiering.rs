//! The log's side of tiered storage: which closed segment the remote tier takes next, and
//! how far uploads have got (local retention deletes only what the remote tier holds).

use std::path::PathBuf;

use super::PartitionLog;
use super::checkpoints::PRODUCER_SNAPSHOT_EXTENSION;
use super::transactions::AbortedTxn;
use crate::io::Storage;
use crate::replication::EpochEntry;

/// A closed segment to upload, from its first batch at or past `skip_below` to its end.
#[derive(Debug, Clone)]
pub struct SegmentUpload {
    pub path: PathBuf,
    /// The local segment's base offset (its file name).
    pub segment_base: u64,
    /// The offset after its last batch.
    pub next_offset: u64,
    pub file_len: u64,
    /// Batches wholly below this are already in the remote tier (a predecessor's segments
    /// ended inside this one): the upload starts after them.
    pub skip_below: u64,
    pub max_timestamp_ms: i64,
    pub index_interval_bytes: u32,
    /// The leader epochs of its batches: the one in force at its base, and every one that
    /// starts inside it.
    pub epochs: Vec<EpochEntry>,
    /// The aborted transactions with records in it (`read_committed` fetches from the remote
    /// tier skip them).
    pub aborted: Vec<AbortedTxn>,
    /// The producer snapshot at its end (`<next_offset>.snapshot`), written when it closed;
    /// absent for a segment closed before the topic was tiered.
    pub producer_snapshot: PathBuf,
}

/// The closed segments holding records at or past the remote end: what waits on the local
/// disk for upload (the upload lag).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadBacklog {
    pub segments: u64,
    pub bytes: u64,
}

impl<S: Storage> PartitionLog<S> {
    /// What waits for upload past `from_offset` (the remote end).
    pub fn upload_backlog(&self, from_offset: u64) -> UploadBacklog {
        let closed = &self.segments[..self.segments.len() - 1];
        closed
            .iter()
            .filter(|segment| segment.next_offset > from_offset && !segment.is_empty())
            .fold(UploadBacklog::default(), |backlog, segment| UploadBacklog {
                segments: backlog.segments + 1,
                bytes: backlog.bytes + segment.size,
            })
    }

    /// The first closed segment holding records at or past `from_offset`, if it lies wholly
    /// below `below_offset` (the high watermark: only committed records go up).
    pub fn next_upload(&self, from_offset: u64, below_offset: u64) -> Option<SegmentUpload> {
        let closed = &self.segments[..self.segments.len() - 1];
        let segment = closed
            .iter()
            .find(|segment| segment.next_offset > from_offset && !segment.is_empty())?;
        if segment.next_offset > below_offset {
            return None;
        }
        let (base, next) = (segment.base_offset, segment.next_offset);
        let entries = self.epochs.entries();
        let in_force = entries.partition_point(|entry| entry.start_offset <= base);
        let epochs = entries[in_force.saturating_sub(1)..]
            .iter()
            .take_while(|entry| entry.start_offset < next)
            .copied()
            .collect();
        Some(SegmentUpload {
            path: self.segment_path(base, "log"),
            segment_base: base,
            next_offset: next,
            file_len: segment.size,
            skip_below: from_offset.max(self.log_start_offset()),
            max_timestamp_ms: segment.max_timestamp_ms,
            index_interval_bytes: self.config.index_interval_bytes,
            epochs,
            aborted: self
                .producers
                .transactions()
                .aborted_between(base, next)
                .copied()
                .collect(),
            producer_snapshot: self.segment_path(next, PRODUCER_SNAPSHOT_EXTENSION),
        })
    }

    /// The remote tier holds every record below `offset`: local retention may delete segments
    /// wholly below it (as far as the local limits allow).
    pub fn set_remote_copied(&mut self, offset: u64) {
        self.remote_copied_before = offset;
    }
}
