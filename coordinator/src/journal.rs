//! The single-node store of records written often (share-partition states, one write per
//! acknowledgement): one append-only file, a frame appended per write, instead of a file
//! written and renamed per write. A rename over a file costs a write-back of the new one on
//! ext4 (which orders it before the rename), and a file per write costs its inode; an append
//! costs a `write`. A write survives the broker's crash once `store` returns; it is on disk
//! once synced (at once when asked, else by [`RecordJournal::sync`]).
//!
//! A frame is `[payload length: u32 LE][CRC-32C of the payload: u32 LE][payload]`, the payload
//! the JSON of `{id, revision, record}` (`record` null: deleted). Opening replays the frames,
//! the last one of an id winning; a torn or corrupt tail (a crash mid-append) is cut off. When
//! the file holds four times what is live (and more than a floor), it is rewritten with only
//! the live records, atomically.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::CoordinatorError;
use crate::groups::Revision;
use crate::local::write_atomically;

const FRAME_HEADER: usize = 8;
/// The file is never compacted below this size: rewriting a small file saves nothing.
const COMPACT_FLOOR: u64 = 4 << 20;
/// A frame longer than this is corrupt, not a record (a share state is at most a few MB).
const MAX_FRAME: usize = 256 << 20;

#[derive(Serialize, Deserialize)]
struct Frame<R> {
    id: String,
    revision: Revision,
    record: Option<R>,
}

/// A record as the journal holds it, with the length of the frame that stored it.
struct Live {
    revision: Revision,
    record: serde_json::Value,
    frame_len: u64,
}

pub(crate) struct RecordJournal {
    dir: PathBuf,
    name: String,
    file: File,
    len: u64,
    records: BTreeMap<String, Live>,
    /// The frames of the live records: what a compaction would keep.
    live_bytes: u64,
    /// Revisions of deleted ids, so that a record deleted and stored again does not reuse
    /// one (the fence would then accept a writer that read the record before the delete).
    deleted: BTreeMap<String, Revision>,
    unsynced: bool,
}

fn storage(path: &Path) -> impl FnOnce(std::io::Error) -> CoordinatorError + '_ {
    move |source| CoordinatorError::Storage {
        path: path.to_path_buf(),
        source,
    }
}

fn checksum(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

fn frame<R: Serialize>(id: &str, revision: Revision, record: Option<R>) -> Vec<u8> {
    let payload = serde_json::to_vec(&Frame {
        id: id.to_string(),
        revision,
        record,
    })
    .expect("a journal frame serializes");
    let mut bytes = Vec::with_capacity(FRAME_HEADER + payload.len());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&checksum(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    bytes
}

impl RecordJournal {
    /// Opens (or creates) `dir/name`, replaying it; a torn tail is cut off.
    pub(crate) fn open(dir: &Path, name: &str) -> Result<RecordJournal, CoordinatorError> {
        let path = dir.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(CoordinatorError::Storage { path, source }),
        };
        let mut journal = RecordJournal {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            file: File::options()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(storage(&path))?,
            len: 0,
            records: BTreeMap::new(),
            live_bytes: 0,
            deleted: BTreeMap::new(),
            unsynced: false,
        };
        let mut position = 0usize;
        while let Some((frame, frame_len)) = read_frame(&bytes[position..]) {
            journal.apply(frame, frame_len as u64);
            position += frame_len;
        }
        if position < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                kept = position,
                cut = bytes.len() - position,
                "record journal: a torn or corrupt tail cut off"
            );
            journal
                .file
                .set_len(position as u64)
                .map_err(storage(&path))?;
            journal.file.sync_all().map_err(storage(&path))?;
        }
        journal.len = position as u64;
        Ok(journal)
    }

    fn apply(&mut self, frame: Frame<serde_json::Value>, frame_len: u64) {
        if let Some(old) = self.records.remove(&frame.id) {
            self.live_bytes -= old.frame_len;
        }
        match frame.record {
            Some(record) => {
                self.deleted.remove(&frame.id);
                self.live_bytes += frame_len;
                self.records.insert(
                    frame.id,
                    Live {
                        revision: frame.revision,
                        record,
                        frame_len,
                    },
                );
            }
            None => {
                self.deleted.insert(frame.id, frame.revision);
            }
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The record of `id` and its revision (0: never stored).
    pub(crate) fn load(&self, id: &str) -> (Option<serde_json::Value>, Revision) {
        match self.records.get(id) {
            Some(live) => (Some(live.record.clone()), live.revision),
            None => (None, 0),
        }
    }

    fn revision(&self, id: &str) -> Revision {
        match self.records.get(id) {
            Some(live) => live.revision,
            None => 0,
        }
    }

    /// Every stored id, sorted.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.records.keys().cloned().collect()
    }

    /// Stores `record` as `id` if its revision is still `expected`: the new revision, or
    /// `None` when fenced. Synced before it returns when `sync`.
    pub(crate) fn store(
        &mut self,
        id: &str,
        expected: Revision,
        record: &serde_json::Value,
        sync: bool,
    ) -> Result<Option<Revision>, CoordinatorError> {
        if self.revision(id) != expected {
            return Ok(None);
        }
        // Revisions keep growing across deletes: a writer fenced before a delete stays fenced.
        let revision = expected.max(self.deleted.get(id).copied().unwrap_or(0)) + 1;
        let bytes = frame(id, revision, Some(record));
        self.append(&bytes, sync)?;
        self.apply(
            Frame {
                id: id.to_string(),
                revision,
                record: Some(record.clone()),
            },
            bytes.len() as u64,
        );
        self.compact_if_sparse()?;
        Ok(Some(revision))
    }

    /// Removes `id`, whatever its revision.
    pub(crate) fn delete(&mut self, id: &str) -> Result<(), CoordinatorError> {
        let Some(live) = self.records.get(id) else {
            return Ok(());
        };
        let revision = live.revision;
        let bytes = frame::<serde_json::Value>(id, revision, None);
        self.append(&bytes, false)?;
        self.apply(
            Frame {
                id: id.to_string(),
                revision,
                record: None,
            },
            bytes.len() as u64,
        );
        self.compact_if_sparse()
    }

    fn append(&mut self, bytes: &[u8], sync: bool) -> Result<(), CoordinatorError> {
        let path = self.path();
        if let Err(source) = self.file.write_all(bytes) {
            // A partial append would leave a torn frame before the next one: cut it off.
            let _ = self.file.set_len(self.len);
            return Err(CoordinatorError::Storage { path, source });
        }
        self.len += bytes.len() as u64;
        if sync {
            self.file.sync_data().map_err(storage(&path))?;
            self.unsynced = false;
        } else {
            self.unsynced = true;
        }
        Ok(())
    }

    /// Syncs what was appended since the last sync.
    pub(crate) fn sync(&mut self) -> Result<(), CoordinatorError> {
        if self.unsynced {
            let path = self.path();
            self.file.sync_data().map_err(storage(&path))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Rewrites the file with only the live records once it holds four times as much.
    fn compact_if_sparse(&mut self) -> Result<(), CoordinatorError> {
        if self.len < COMPACT_FLOOR || self.len < self.live_bytes.saturating_mul(4) {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(self.live_bytes as usize);
        for (id, live) in &self.records {
            bytes.extend_from_slice(&frame(id, live.revision, Some(&live.record)));
        }
        // Deleted ids' last revisions are kept as tombstones, so that they stay fenced.
        for (id, revision) in &self.deleted {
            bytes.extend_from_slice(&frame::<serde_json::Value>(id, *revision, None));
        }
        write_atomically(&self.dir, &self.name, &bytes)?;
        let path = self.path();
        self.file = File::options()
            .append(true)
            .open(&path)
            .map_err(storage(&path))?;
        self.len = bytes.len() as u64;
        self.unsynced = false;
        Ok(())
    }
}

/// The frame at the start of `bytes` and its length, if whole and intact.
fn read_frame(bytes: &[u8]) -> Option<(Frame<serde_json::Value>, usize)> {
    let header = bytes.get(..FRAME_HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len > MAX_FRAME {
        return None;
    }
    let payload = bytes.get(FRAME_HEADER..FRAME_HEADER + len)?;
    if checksum(payload) != crc {
        return None;
    }
    let frame = serde_json::from_slice(payload).ok()?;
    Some((frame, FRAME_HEADER + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::FileExt;

    #[test]
    fn records_outlive_reopening_and_stay_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        let first = journal.store("a", 0, &json!(1), false).unwrap().unwrap();
        let second = journal.store("a", first, &json!(2), true).unwrap().unwrap();
        assert_eq!(journal.store("a", first, &json!(3), false).unwrap(), None);
        journal.store("b", 0, &json!("b"), false).unwrap().unwrap();
        journal.delete("b").unwrap();
        drop(journal);
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        assert_eq!(journal.load("a"), (Some(json!(2)), second));
        assert_eq!(journal.load("b"), (None, 0));
        assert_eq!(journal.ids(), vec!["a".to_string()]);
        // Stored again after its delete: a revision never used before.
        let again = journal.store("b", 0, &json!("b2"), false).unwrap().unwrap();
        assert!(again > 1, "{again}");
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_what_came_before_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        journal.store("a", 0, &json!({"start": 1}), false).unwrap();
        let kept = std::fs::metadata(dir.path().join("j")).unwrap().len();
        journal.store("a", 1, &json!({"start": 2}), false).unwrap();
        drop(journal);
        // A crash mid-append: the last frame lost its last bytes.
        let path = dir.path().join("j");
        let full = std::fs::metadata(&path).unwrap().len();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(full - 3)
            .unwrap();
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        assert_eq!(journal.load("a"), (Some(json!({"start": 1})), 1));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), kept);
        // And appends go on from the cut.
        journal.store("a", 1, &json!({"start": 3}), false).unwrap();
        drop(journal);
        let journal = RecordJournal::open(dir.path(), "j").unwrap();
        assert_eq!(journal.load("a"), (Some(json!({"start": 3})), 2));
    }

    #[test]
    fn a_corrupt_frame_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        journal.store("a", 0, &json!(1), false).unwrap();
        journal.store("a", 1, &json!(2), false).unwrap();
        drop(journal);
        let path = dir.path().join("j");
        let file = File::options().write(true).open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        file.write_all_at(b"X", len - 2).unwrap();
        let journal = RecordJournal::open(dir.path(), "j").unwrap();
        assert_eq!(journal.load("a"), (Some(json!(1)), 1));
    }

    #[test]
    fn a_sparse_file_is_compacted_to_its_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = RecordJournal::open(dir.path(), "j").unwrap();
        let big = json!("x".repeat(64 << 10));
        let mut revision = 0;
        for _ in 0..200 {
            revision = journal.store("a", revision, &big, false).unwrap().unwrap();
        }
        journal.store("b", 0, &json!(1), false).unwrap();
        journal.delete("b").unwrap();
        let len = std::fs::metadata(dir.path().join("j")).unwrap().len();
        assert!(len < 4 * (70 << 10) + COMPACT_FLOOR, "{len}");
        drop(journal);
        let journal = RecordJournal::open(dir.path(), "j").unwrap();
        assert_eq!(journal.load("a"), (Some(big), revision));
        assert_eq!(journal.load("b"), (None, 0));
        assert_eq!(journal.revision("b"), 0);
        assert!(journal.deleted.contains_key("b"), "its tombstone kept");
    }
}
