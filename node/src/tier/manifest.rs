//! A partition's remote manifest: which of its segments the remote tier holds, under which
//! object names, and which are on their way in or out. Pure: the shard stores it (fenced, in
//! the coordinator's store) and carries out what it says.
//!
//! Every change to the bucket is recorded before it is made, so a crash at any step leaves
//! either a record of the objects or no objects:
//! 1. `begin_copy` records a segment as [`SegmentState::CopyStarted`] under a fresh id;
//! 2. its objects are uploaded under names that carry that id;
//! 3. `finish_copy` marks it [`SegmentState::Copied`]: readable, and local retention may now
//!    delete the local copy.
//!
//! Deletion runs the other way: `begin_delete` marks segments [`SegmentState::DeleteStarted`]
//! (unreadable from then on), their objects are deleted, `finish_delete` forgets them. Whoever
//! finds a segment started but not finished (a crashed or deposed leader's) deletes its
//! objects and forgets it ([`RemoteManifest::abandoned`]); objects no entry names at all (an
//! upload that outlived its leader's fence) are found by listing the partition's folder.
//!
//! Invariants, asserted on every change: entries are sorted by base offset and do not overlap;
//! the copied ones tile their offsets (no gap: each starts where the one before it ends).

use serde::{Deserialize, Serialize};

/// Where a segment stands in the remote tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentState {
    /// Recorded before its upload; not readable. Found so by a new leader: abandoned.
    CopyStarted,
    /// Uploaded whole: readable.
    Copied,
    /// Recorded before its objects are deleted; no longer readable.
    DeleteStarted,
}

/// One segment in the remote tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    /// Unique per upload: two uploads of one segment (a deposed leader's, its successor's)
    /// never share object names.
    pub id: String,
    pub base_offset: u64,
    /// The offset after its last batch.
    pub next_offset: u64,
    pub size_bytes: u64,
    /// Its newest record's timestamp (retention by time, lookups by time).
    pub max_timestamp_ms: i64,
    /// The leader epoch of the broker that uploaded it.
    pub uploader_epoch: u32,
    pub state: SegmentState,
}

/// The object name kinds of one uploaded segment.
pub const SEGMENT_OBJECTS: [&str; 5] = ["log", "index", "timeindex", "snapshot", "meta"];

impl RemoteSegment {
    /// The object name stem within the partition's folder: the base offset (so names sort in
    /// offset order) and the upload's id.
    pub fn stem(&self) -> String {
        format!("{:020}-{}", self.base_offset, self.id)
    }

    /// The id an object name of a segment carries, if it is one: `<base>-<id>.<kind>`.
    pub fn id_of_object(name: &str) -> Option<&str> {
        let (stem, kind) = name.rsplit_once('.')?;
        if !SEGMENT_OBJECTS.contains(&kind) {
            return None;
        }
        let (base, id) = stem.split_once('-')?;
        (base.len() == 20 && base.bytes().all(|b| b.is_ascii_digit()) && !id.is_empty())
            .then_some(id)
    }
}

/// Why a change to the manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("the manifest was claimed at leader epoch {stored}, past this leader's {ours}")]
    Fenced { stored: u32, ours: u32 },
    #[error("segment {base_offset} does not follow the remote log's end {end}")]
    NotNext { base_offset: u64, end: u64 },
    #[error("no segment {id} in the state this step needs")]
    UnknownSegment { id: String },
}

/// A partition's remote manifest, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteManifest {
    /// The epoch of the last leader that claimed it: a leader at an older epoch changes
    /// nothing (the store's revision fences the write; this tells it why).
    pub leader_epoch: u32,
    /// Sorted by base offset; the copied ones contiguous.
    pub segments: Vec<RemoteSegment>,
    /// Records below this were deleted on request (DeleteRecords) though their segment may
    /// remain until retention removes it: the remote tier serves nothing below it.
    #[serde(default)]
    pub deleted_before: u64,
}

impl RemoteManifest {
    /// Claims the manifest for a leader at `epoch` (before its first change, so a deposed
    /// leader's next write is fenced).
    pub fn claim(&mut self, epoch: u32) -> Result<bool, ManifestError> {
        self.check_epoch(epoch)?;
        let changed = self.leader_epoch != epoch;
        self.leader_epoch = epoch;
        Ok(changed)
    }

    fn check_epoch(&self, epoch: u32) -> Result<(), ManifestError> {
        if epoch < self.leader_epoch {
            return Err(ManifestError::Fenced {
                stored: self.leader_epoch,
                ours: epoch,
            });
        }
        Ok(())
    }

    /// The readable segments, in offset order.
    pub fn copied(&self) -> impl Iterator<Item = &RemoteSegment> {
        self.segments
            .iter()
            .filter(|segment| segment.state == SegmentState::Copied)
    }

    /// The first offset the remote tier serves; `None` when it holds nothing readable.
    pub fn start_offset(&self) -> Option<u64> {
        self.copied()
            .find(|segment| segment.next_offset > self.deleted_before)
            .map(|segment| segment.base_offset.max(self.deleted_before))
    }

    /// DeleteRecords below `offset`: the remote tier stops serving those records at once;
    /// retention deletes the segments wholly below it.
    pub fn delete_records_before(&mut self, epoch: u32, offset: u64) -> Result<(), ManifestError> {
        self.check_epoch(epoch)?;
        self.deleted_before = self.deleted_before.max(offset);
        Ok(())
    }

    /// The offset after the last segment the remote tier holds or is receiving: where the next
    /// upload starts (0 when empty).
    pub fn end_offset(&self) -> u64 {
        self.segments
            .iter()
            .filter(|segment| segment.state != SegmentState::DeleteStarted)
            .map(|segment| segment.next_offset)
            .max()
            .unwrap_or(0)
    }

    /// The offset after the last copied segment: below it, local copies may go.
    pub fn copied_end(&self) -> Option<u64> {
        self.copied().last().map(|segment| segment.next_offset)
    }

    /// Bytes the readable segments hold.
    pub fn copied_bytes(&self) -> u64 {
        self.copied().map(|segment| segment.size_bytes).sum()
    }

    /// The readable segment holding `offset`.
    pub fn find(&self, offset: u64) -> Option<&RemoteSegment> {
        if offset < self.deleted_before {
            return None;
        }
        self.copied()
            .find(|segment| segment.base_offset <= offset && offset < segment.next_offset)
    }

    /// The first readable segment with a record at or after `timestamp_ms`.
    pub fn find_by_timestamp(&self, timestamp_ms: i64) -> Option<&RemoteSegment> {
        self.copied().find(|segment| {
            segment.next_offset > self.deleted_before && segment.max_timestamp_ms >= timestamp_ms
        })
    }

    /// Records `segment` (fresh, [`SegmentState::CopyStarted`]) before its upload. It must
    /// start at or past the remote end: a later start means the records between were deleted
    /// (DeleteRecords), and the earlier remote segments go through retention as usual.
    pub fn begin_copy(&mut self, epoch: u32, segment: RemoteSegment) -> Result<(), ManifestError> {
        self.check_epoch(epoch)?;
        let end = self.end_offset();
        if segment.base_offset < end || segment.next_offset <= segment.base_offset {
            return Err(ManifestError::NotNext {
                base_offset: segment.base_offset,
                end,
            });
        }
        assert_eq!(segment.state, SegmentState::CopyStarted);
        self.leader_epoch = epoch;
        self.segments.push(segment);
        self.check();
        Ok(())
    }

    /// Marks an upload finished: its segment becomes readable, with the base offset and size
    /// of what was uploaded (an upload starting past the log's start may begin at the batch
    /// holding it, below the base recorded when it began).
    pub fn finish_copy(
        &mut self,
        epoch: u32,
        id: &str,
        uploaded: Option<(u64, u64)>,
    ) -> Result<(), ManifestError> {
        self.check_epoch(epoch)?;
        let at = self
            .segments
            .iter()
            .position(|segment| segment.id == id && segment.state == SegmentState::CopyStarted)
            .ok_or_else(|| ManifestError::UnknownSegment { id: id.to_string() })?;
        let floor = self.segments[..at]
            .iter()
            .map(|segment| segment.next_offset)
            .max()
            .unwrap_or(0);
        let segment = &mut self.segments[at];
        if let Some((base_offset, size_bytes)) = uploaded {
            if base_offset < floor || base_offset >= segment.next_offset {
                return Err(ManifestError::NotNext {
                    base_offset,
                    end: floor,
                });
            }
            segment.base_offset = base_offset;
            segment.size_bytes = size_bytes;
        }
        segment.state = SegmentState::Copied;
        let base = segment.base_offset;
        // Nothing unfinished below a finished upload: local retention trusts `copied_end`.
        assert!(
            !self
                .segments
                .iter()
                .any(|s| s.state == SegmentState::CopyStarted && s.base_offset < base),
            "an upload finished above one that did not"
        );
        self.check();
        Ok(())
    }

    /// Marks the oldest readable segments for deletion, up to and including those whose
    /// records all lie below `below_offset` (retention, DeleteRecords) — every segment with
    /// `None` (topic deletion). Returns the segments marked.
    pub fn begin_delete(
        &mut self,
        epoch: u32,
        below_offset: Option<u64>,
    ) -> Result<Vec<RemoteSegment>, ManifestError> {
        self.check_epoch(epoch)?;
        let mut marked = Vec::new();
        for segment in &mut self.segments {
            let doomed = match below_offset {
                None => segment.state != SegmentState::DeleteStarted,
                Some(below) => {
                    segment.state == SegmentState::Copied && segment.next_offset <= below
                }
            };
            if doomed {
                segment.state = SegmentState::DeleteStarted;
                marked.push(segment.clone());
            }
        }
        self.check();
        Ok(marked)
    }

    /// Forgets segments whose objects are deleted.
    pub fn finish_delete(&mut self, epoch: u32, ids: &[String]) -> Result<(), ManifestError> {
        self.check_epoch(epoch)?;
        self.segments.retain(|segment| {
            !(segment.state == SegmentState::DeleteStarted && ids.contains(&segment.id))
        });
        Ok(())
    }

    /// What a leader at `epoch` finds unfinished by others: uploads an earlier leader started
    /// (their objects may be partial), and deletes anyone started. Both are to be deleted
    /// and forgotten. A leader's own uploads in flight are not abandoned.
    pub fn abandoned(&self, epoch: u32) -> Vec<RemoteSegment> {
        self.segments
            .iter()
            .filter(|segment| match segment.state {
                SegmentState::CopyStarted => segment.uploader_epoch < epoch,
                SegmentState::DeleteStarted => true,
                SegmentState::Copied => false,
            })
            .cloned()
            .collect()
    }

    /// Forgets abandoned uploads after their objects were deleted (deletes already marked
    /// are forgotten by `finish_delete`).
    pub fn forget(&mut self, epoch: u32, ids: &[String]) -> Result<(), ManifestError> {
        self.check_epoch(epoch)?;
        self.segments
            .retain(|segment| segment.state == SegmentState::Copied || !ids.contains(&segment.id));
        Ok(())
    }

    /// The segments retention removes from the remote tier: the oldest readable ones, while
    /// their newest record is older than `retention_ms` or the whole log (remote bytes plus
    /// `local_bytes`, what the local tier holds past the remote end) exceeds
    /// `retention_bytes` without them. Returns the offset below which all go.
    pub fn retention_cut(
        &self,
        now_ms: i64,
        retention_ms: Option<i64>,
        retention_bytes: Option<u64>,
        local_bytes: u64,
    ) -> Option<u64> {
        let mut total = self.copied_bytes() + local_bytes;
        let mut cut = None;
        for segment in self.copied() {
            let expired =
                retention_ms.is_some_and(|ms| segment.max_timestamp_ms < now_ms.saturating_sub(ms));
            let over = retention_bytes.is_some_and(|bytes| total - segment.size_bytes >= bytes);
            let deleted = segment.next_offset <= self.deleted_before;
            if !(expired || over || deleted) {
                break;
            }
            total -= segment.size_bytes;
            cut = Some(segment.next_offset);
        }
        cut
    }

    /// Whether an object name of the partition's folder belongs to a segment this manifest
    /// names (in any state): what does not is an orphan.
    pub fn names_object(&self, object: &str) -> bool {
        RemoteSegment::id_of_object(object)
            .is_some_and(|id| self.segments.iter().any(|segment| segment.id == id))
    }

    fn check(&self) {
        for pair in self.segments.windows(2) {
            assert!(
                pair[0].next_offset <= pair[1].base_offset,
                "remote segments overlap: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(id: &str, base: u64, next: u64, epoch: u32) -> RemoteSegment {
        RemoteSegment {
            id: id.to_string(),
            base_offset: base,
            next_offset: next,
            size_bytes: next - base,
            max_timestamp_ms: base as i64,
            uploader_epoch: epoch,
            state: SegmentState::CopyStarted,
        }
    }

    #[test]
    fn a_segment_is_readable_only_once_its_copy_finished_and_until_its_delete_started() {
        let mut manifest = RemoteManifest::default();
        manifest.claim(3).unwrap();
        manifest.begin_copy(3, segment("a", 0, 100, 3)).unwrap();
        assert_eq!(manifest.start_offset(), None);
        assert_eq!(manifest.end_offset(), 100);
        assert!(manifest.find(5).is_none());
        manifest.finish_copy(3, "a", None).unwrap();
        assert_eq!(manifest.find(99).map(|s| s.id.as_str()), Some("a"));
        manifest.begin_copy(3, segment("b", 100, 200, 3)).unwrap();
        manifest.finish_copy(3, "b", None).unwrap();
        assert_eq!(manifest.copied_end(), Some(200));
        let marked = manifest.begin_delete(3, Some(150)).unwrap();
        assert_eq!(marked.len(), 1, "only segments wholly below the cut");
        assert_eq!(manifest.start_offset(), Some(100));
        assert!(manifest.find(50).is_none());
        manifest.finish_delete(3, &["a".to_string()]).unwrap();
        assert_eq!(manifest.segments.len(), 1);
    }

    #[test]
    fn a_deposed_leader_changes_nothing_and_its_unfinished_work_is_abandoned() {
        let mut manifest = RemoteManifest::default();
        manifest.claim(1).unwrap();
        manifest.begin_copy(1, segment("old", 0, 10, 1)).unwrap();
        manifest.claim(2).unwrap();
        assert!(matches!(
            manifest.finish_copy(1, "old", None),
            Err(ManifestError::Fenced { stored: 2, ours: 1 })
        ));
        assert!(manifest.claim(1).is_err());
        let abandoned = manifest.abandoned(2);
        assert_eq!(abandoned.len(), 1);
        // The new leader uploads the same records again, under a new id, once it forgot the old.
        assert!(manifest.begin_copy(2, segment("new", 0, 10, 2)).is_err());
        manifest.forget(2, &["old".to_string()]).unwrap();
        manifest.begin_copy(2, segment("new", 0, 10, 2)).unwrap();
        assert!(
            manifest.abandoned(2).is_empty(),
            "its own upload is in flight"
        );
        assert!(manifest.names_object("00000000000000000000-new.log"));
        assert!(!manifest.names_object("00000000000000000000-old.log"));
    }

    #[test]
    fn uploads_never_go_backwards_or_overlap() {
        let mut manifest = RemoteManifest::default();
        manifest.begin_copy(0, segment("a", 10, 20, 0)).unwrap();
        assert!(manifest.begin_copy(0, segment("b", 15, 30, 0)).is_err());
        assert!(manifest.begin_copy(0, segment("b", 20, 20, 0)).is_err());
        manifest.begin_copy(0, segment("b", 20, 30, 0)).unwrap();
        // What was uploaded may start below the base recorded, never below the one before.
        manifest.finish_copy(0, "a", None).unwrap();
        assert!(manifest.finish_copy(0, "b", Some((19, 5))).is_err());
        manifest.finish_copy(0, "b", Some((20, 5))).unwrap();
        assert_eq!(manifest.segments[1].size_bytes, 5);
    }

    #[test]
    fn retention_cuts_by_age_and_by_the_whole_logs_size() {
        let mut manifest = RemoteManifest::default();
        for (id, base) in [("a", 0), ("b", 100), ("c", 200)] {
            manifest
                .begin_copy(0, segment(id, base, base + 100, 0))
                .unwrap();
            manifest.finish_copy(0, id, None).unwrap();
        }
        // Timestamps are the base offsets: at 250 with 100 ms, "a" (0) and "b" (100) expired.
        assert_eq!(manifest.retention_cut(250, Some(100), None, 0), Some(200));
        assert_eq!(manifest.retention_cut(50, Some(100), None, 0), None);
        // 300 remote bytes and 50 local, kept to 200: one segment goes (a second would leave
        // less than the limit, as local retention counts it).
        assert_eq!(manifest.retention_cut(0, None, Some(200), 50), Some(100));
        assert_eq!(manifest.retention_cut(0, None, Some(100), 0), Some(200));
        assert_eq!(manifest.retention_cut(0, None, Some(1000), 50), None);
    }

    #[test]
    fn deleted_records_are_no_longer_served_and_their_segments_go() {
        let mut manifest = RemoteManifest::default();
        for (id, base) in [("a", 0), ("b", 100)] {
            manifest
                .begin_copy(0, segment(id, base, base + 100, 0))
                .unwrap();
            manifest.finish_copy(0, id, None).unwrap();
        }
        manifest.delete_records_before(0, 120).unwrap();
        assert_eq!(manifest.start_offset(), Some(120));
        assert!(manifest.find(119).is_none());
        assert!(manifest.find(120).is_some());
        assert_eq!(manifest.retention_cut(0, None, None, 0), Some(100));
        manifest.delete_records_before(0, 50).unwrap();
        assert_eq!(manifest.start_offset(), Some(120), "never goes back");
    }

    #[test]
    fn object_names_carry_their_upload_id() {
        let s = segment("0f3a", 42, 50, 0);
        assert_eq!(s.stem(), "00000000000000000042-0f3a");
        assert_eq!(
            RemoteSegment::id_of_object("00000000000000000042-0f3a.timeindex"),
            Some("0f3a")
        );
        assert_eq!(RemoteSegment::id_of_object("42-0f3a.log"), None);
        assert_eq!(
            RemoteSegment::id_of_object("00000000000000000042-0f3a.tmp"),
            None
        );
    }
}
