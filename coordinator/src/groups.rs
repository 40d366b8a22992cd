//! Where consumer groups keep what must outlive a coordinator: each group's generation, its
//! members and what they hold, and its committed offsets, plus the counter idempotent
//! producers take their ids from.
//!
//! One broker coordinates a group at a time, and it is the only writer of the group's keys.
//! Every write is fenced on the group record's revision: a coordinator claims a group by
//! writing the record (generation + 1) over the revision it read, and commits offsets only
//! while the record is still at the revision it wrote. So once another broker has claimed the
//! group (or a later generation was stored), the old coordinator can write nothing: a zombie
//! member's commit, validated against an old generation, fails in the store too.
//!
//! etcd keys under `/strata/<cluster>/`:
//! ```text
//! groups/<group>             GroupRecord (JSON): generation, membership (members, holdings)
//! offsets/<group>/<topic>    {partition: {offset, metadata}} for the whole topic (JSON)
//! producer-ids               the next free producer id (decimal)
//! txns/<transactional id>    a transactional id's state (JSON, the transaction coordinator's)
//! share-states/<group>%2F<topic>%2F<partition>
//!                            a share group's state of one partition (JSON, its leader's)
//! ```
//! Transactional ids are coordinated like groups (hashed onto the same brokers, by the same
//! thread), and their records are fenced the same way: a write names the revision its writer
//! read, so a coordinator another has taken over from stores nothing.
//! Offsets are kept per (group, topic) rather than per partition so that a commit of hundreds
//! of partitions stays one transaction within etcd's default limit of 128 operations.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::CoordinatorError;
use crate::etcd::{
    LARGE_VALUES_PER_PAGE, connect_client, connect_options, decode, etcd_error, get_prefix,
};
use crate::journal::RecordJournal;
use crate::local::write_atomically;

/// A store revision of a group record; 0 when the group has never been stored.
pub type Revision = i64;

/// What survives of a group between coordinators.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The last generation a coordinator started; the next one starts above it.
    pub generation: i32,
    /// The group's members and what they hold, as the group core snapshots it (opaque here):
    /// a coordinator that takes the group over restores it, so members keep their partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<serde_json::Value>,
    /// Since when the group has had no members (ms since the epoch); `None` while it has
    /// some, and in records stored before this was kept (such a group never expires until a
    /// coordinator stores it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_since_ms: Option<i64>,
    /// Offsets that open transactions commit (Kafka's TxnOffsetCommit), by producer id: the
    /// group's committed offsets once the transaction commits, dropped if it aborts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending_txn_offsets: BTreeMap<i64, GroupOffsets>,
}

impl GroupRecord {
    /// A record of `generation` and no membership.
    pub fn at(generation: i32) -> GroupRecord {
        GroupRecord {
            generation,
            membership: None,
            empty_since_ms: None,
            pending_txn_offsets: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOffset {
    /// The next offset the group consumes.
    pub offset: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub metadata: String,
    /// When it was committed (ms since the epoch); `None` in offsets stored before this was
    /// kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_ms: Option<i64>,
}

/// Whether a stored group's offsets have expired at `now_ms` (Kafka's
/// `offsets.retention.minutes`, counted as KIP-211 does): the group has had no members, and
/// no offset was committed, for `retention_ms`. A group whose times are unknown (stored
/// before they were kept) never expires: deleting what an older version stored would be a
/// guess.
pub fn offsets_expired(loaded: &LoadedGroup, now_ms: i64, retention_ms: i64) -> bool {
    let Some(empty_since) = loaded.record.as_ref().and_then(|r| r.empty_since_ms) else {
        return false;
    };
    let mut last_activity = empty_since;
    for offset in loaded
        .offsets
        .values()
        .flat_map(|partitions| partitions.values())
    {
        match offset.committed_ms {
            Some(committed) => last_activity = last_activity.max(committed),
            None => return false,
        }
    }
    now_ms.saturating_sub(last_activity) >= retention_ms
}

/// topic → partition → committed offset.
pub type GroupOffsets = BTreeMap<String, BTreeMap<u32, StoredOffset>>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedGroup {
    pub record: Option<GroupRecord>,
    pub revision: Revision,
    pub offsets: GroupOffsets,
}

/// The longest a group id may be once escaped by [`group_key`]: it names a file.
pub const GROUP_KEY_LEN_MAX: usize = 249;

/// A group id is any non-empty string, as in Kafka, whose escaped form ([`group_key`]) fits
/// [`GROUP_KEY_LEN_MAX`].
pub fn validate_group_id(group: &str) -> Result<(), CoordinatorError> {
    if group.is_empty() {
        return Err(CoordinatorError::Invalid(
            "a group id must not be empty".into(),
        ));
    }
    let len = escaped_len(group);
    if len > GROUP_KEY_LEN_MAX {
        return Err(CoordinatorError::Invalid(format!(
            "group id {group:?} is {len} bytes escaped, over {GROUP_KEY_LEN_MAX}"
        )));
    }
    Ok(())
}

/// Whether a group id's byte stands for itself in [`group_key`]: the topic-name alphabet.
fn kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'_' || byte == b'-'
}

fn escaped_len(group: &str) -> usize {
    group.bytes().map(|b| if kept(b) { 1 } else { 3 }).sum()
}

/// A group id as a file name and etcd key segment: bytes outside `[A-Za-z0-9._-]` (so `/`,
/// `%` and every non-ASCII byte) become `%XX`. Ids of that alphabet, the only ones accepted
/// before any other was, map to themselves, so stored groups keep their keys; `.` and `..` are
/// never a whole key, since a file name gets `.json` after it and an etcd key a prefix.
pub fn group_key(group: &str) -> std::borrow::Cow<'_, str> {
    if group.bytes().all(kept) {
        return group.into();
    }
    let mut key = String::with_capacity(escaped_len(group));
    for byte in group.bytes() {
        if kept(byte) {
            key.push(byte as char);
        } else {
            key.push_str(&format!("%{byte:02X}"));
        }
    }
    key.into()
}

/// The group id a [`group_key`] stands for; `None` for a string no group id escapes to.
pub fn group_from_key(key: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(key.len());
    let mut rest = key.as_bytes();
    while let [first, tail @ ..] = rest {
        match (*first, tail) {
            (b'%', [high, low, tail @ ..]) => {
                let hex = std::str::from_utf8(&[*high, *low]).ok()?.to_owned();
                let byte = u8::from_str_radix(&hex, 16).ok()?;
                if kept(byte) || hex != format!("{byte:02X}") {
                    return None;
                }
                bytes.push(byte);
                rest = tail;
            }
            (byte, tail) if kept(byte) => {
                bytes.push(byte);
                rest = tail;
            }
            _ => return None,
        }
    }
    String::from_utf8(bytes).ok()
}

/// How many producer ids a broker takes from the shared counter at once.
pub const PRODUCER_ID_BLOCK: i64 = 1000;

/// The group store behind one trait: files on a single node, etcd in a cluster.
pub trait GroupStore {
    async fn load_group(&self, group: &str) -> Result<LoadedGroup, CoordinatorError>;
    /// Writes `record` if the stored one is still at `expected`; `None` when fenced.
    async fn store_group(
        &self,
        group: &str,
        expected: Revision,
        record: &GroupRecord,
    ) -> Result<Option<Revision>, CoordinatorError>;
    /// Replaces the offsets of the topics in `topics` (each with every partition the group
    /// has committed for it), in one transaction, if the group record is still at `fence`.
    /// `false` when fenced.
    async fn commit_offsets(
        &self,
        group: &str,
        fence: Revision,
        topics: &GroupOffsets,
    ) -> Result<bool, CoordinatorError>;
    /// Every stored group with its last generation.
    async fn list_groups(&self) -> Result<Vec<(String, i32)>, CoordinatorError>;
    /// Removes the group record and every offset it committed, in one step, if the record is
    /// still at `fence`. `false` when fenced.
    async fn delete_group(&self, group: &str, fence: Revision) -> Result<bool, CoordinatorError>;
    /// Takes `count` producer ids for this broker; returns the first.
    async fn allocate_producer_ids(&self, count: i64) -> Result<i64, CoordinatorError>;
    /// A record of `kind` (opaque here: its owner's) and its revision (0: never stored).
    async fn load_record(
        &self,
        kind: RecordKind,
        id: &str,
    ) -> Result<(Option<serde_json::Value>, Revision), CoordinatorError>;
    /// Writes a record of `kind` if the stored one is still at `expected`; `None` when fenced.
    /// Durable as `durability` says when it returns.
    async fn store_record(
        &self,
        kind: RecordKind,
        id: &str,
        expected: Revision,
        record: &serde_json::Value,
        durability: Durability,
    ) -> Result<Option<Revision>, CoordinatorError>;
    /// Every stored id of `kind`, sorted.
    async fn list_records(&self, kind: RecordKind) -> Result<Vec<String>, CoordinatorError>;
    /// Removes a record of `kind`, whatever its revision (its owner is done with it).
    async fn delete_record(&self, kind: RecordKind, id: &str) -> Result<(), CoordinatorError>;
    /// Syncs to disk what was stored [`Durability::Written`] since the last call. The group
    /// thread calls it on every tick; a store whose writes are always synced does nothing.
    async fn sync_written(&self) -> Result<(), CoordinatorError> {
        Ok(())
    }
}

/// How durable a stored record is once `store_record` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk: it survives the loss of the machine's power.
    Synced,
    /// In the store: it survives the broker's crash (a kill -9); on disk by the next
    /// [`GroupStore::sync_written`]. etcd answers only once synced, so there both are `Synced`.
    Written,
}

/// The opaque records the group store keeps besides groups and offsets, each fenced on its
/// own revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A transactional id's state: the transaction coordinator's.
    Transaction,
    /// A share group's state of one partition (`<group>/<topic>/<partition>`): the partition
    /// leader's.
    ShareState,
    /// A partition's remote manifest (`<topic>/<partition>`): which of its segments the
    /// remote tier holds; the partition leader's.
    RemoteManifest,
}

impl RecordKind {
    /// The folder (single node) or key prefix (etcd) of the kind's records.
    fn folder(self) -> &'static str {
        match self {
            RecordKind::Transaction => "txns",
            RecordKind::ShareState => "share-states",
            RecordKind::RemoteManifest => "remote-manifests",
        }
    }
}

/// A record of a [`RecordKind`] as the single-node store keeps it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LocalRecordFile<R = serde_json::Value> {
    record: Option<R>,
    revision: Revision,
}

/// Single node: `<dir>/groups/<group>.json`, `<dir>/producer-ids` and a file per transaction,
/// written atomically; share-partition states, written at every acknowledgement, appended to
/// one journal (`<dir>/share-states.journal`).
pub struct LocalGroupStore {
    dir: PathBuf,
    share_states: Mutex<RecordJournal>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LocalGroupFile {
    record: Option<GroupRecord>,
    revision: Revision,
    offsets: GroupOffsets,
}

impl LocalGroupStore {
    pub fn open(dir: impl Into<PathBuf>) -> Result<LocalGroupStore, CoordinatorError> {
        let dir = dir.into();
        for folder in ["groups", "txns", RecordKind::RemoteManifest.folder()] {
            std::fs::create_dir_all(dir.join(folder)).map_err(|source| {
                CoordinatorError::Storage {
                    path: dir.clone(),
                    source,
                }
            })?;
        }
        let share_states = RecordJournal::open(&dir, "share-states.journal")?;
        Ok(LocalGroupStore {
            dir,
            share_states: Mutex::new(share_states),
        })
    }

    fn read_json<T: Default + for<'de> Deserialize<'de>>(
        &self,
        path: PathBuf,
    ) -> Result<T, CoordinatorError> {
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|error| CoordinatorError::Corrupt {
                    path,
                    reason: error.to_string(),
                })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
            Err(source) => Err(CoordinatorError::Storage { path, source }),
        }
    }

    fn group_file(&self, group: &str) -> Result<LocalGroupFile, CoordinatorError> {
        validate_group_id(group)?;
        self.read_json(self.group_path(group))
    }

    fn group_path(&self, group: &str) -> PathBuf {
        self.dir
            .join("groups")
            .join(format!("{}.json", group_key(group)))
    }

    fn write_group_file(&self, group: &str, file: &LocalGroupFile) -> Result<(), CoordinatorError> {
        let bytes = serde_json::to_vec(file).expect("group state serializes");
        let name = format!("{}.json", group_key(group));
        write_atomically(&self.dir.join("groups"), &name, &bytes)
    }
}

impl GroupStore for LocalGroupStore {
    async fn load_group(&self, group: &str) -> Result<LoadedGroup, CoordinatorError> {
        let file = self.group_file(group)?;
        Ok(LoadedGroup {
            record: file.record,
            revision: file.revision,
            offsets: file.offsets,
        })
    }

    async fn store_group(
        &self,
        group: &str,
        expected: Revision,
        record: &GroupRecord,
    ) -> Result<Option<Revision>, CoordinatorError> {
        let mut file = self.group_file(group)?;
        if file.revision != expected {
            return Ok(None);
        }
        file.record = Some(record.clone());
        file.revision += 1;
        self.write_group_file(group, &file)?;
        Ok(Some(file.revision))
    }

    async fn commit_offsets(
        &self,
        group: &str,
        fence: Revision,
        topics: &GroupOffsets,
    ) -> Result<bool, CoordinatorError> {
        let mut file = self.group_file(group)?;
        if file.revision != fence {
            return Ok(false);
        }
        for (topic, partitions) in topics {
            file.offsets.insert(topic.clone(), partitions.clone());
        }
        self.write_group_file(group, &file)?;
        Ok(true)
    }

    async fn delete_group(&self, group: &str, fence: Revision) -> Result<bool, CoordinatorError> {
        let file = self.group_file(group)?;
        if file.revision != fence {
            return Ok(false);
        }
        let path = self.group_path(group);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(CoordinatorError::Storage { path, source }),
        }
        let dir = self.dir.join("groups");
        std::fs::File::open(&dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| CoordinatorError::Storage { path: dir, source })?;
        Ok(true)
    }

    async fn list_groups(&self) -> Result<Vec<(String, i32)>, CoordinatorError> {
        let dir = self.dir.join("groups");
        let entries = std::fs::read_dir(&dir).map_err(|source| CoordinatorError::Storage {
            path: dir.clone(),
            source,
        })?;
        let mut groups = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Anything else in the folder (a temporary file of an atomic write) is not a group.
            let Some(group) = name.strip_suffix(".json").and_then(group_from_key) else {
                continue;
            };
            let file = self.group_file(&group)?;
            groups.push((group, file.record.map_or(0, |record| record.generation)));
        }
        groups.sort();
        Ok(groups)
    }

    async fn allocate_producer_ids(&self, count: i64) -> Result<i64, CoordinatorError> {
        assert!(count > 0, "allocate at least one id");
        let next: i64 = self.read_json(self.dir.join("producer-ids"))?;
        let bytes = serde_json::to_vec(&(next + count)).expect("an integer serializes");
        write_atomically(&self.dir, "producer-ids", &bytes)?;
        Ok(next)
    }

    async fn load_record(
        &self,
        kind: RecordKind,
        id: &str,
    ) -> Result<(Option<serde_json::Value>, Revision), CoordinatorError> {
        validate_group_id(id)?;
        if kind == RecordKind::ShareState {
            return Ok(self.journal().load(id));
        }
        let file: LocalRecordFile = self.read_json(self.record_path(kind, id))?;
        Ok((file.record, file.revision))
    }

    async fn store_record(
        &self,
        kind: RecordKind,
        id: &str,
        expected: Revision,
        record: &serde_json::Value,
        durability: Durability,
    ) -> Result<Option<Revision>, CoordinatorError> {
        validate_group_id(id)?;
        if kind == RecordKind::ShareState {
            let sync = durability == Durability::Synced;
            return self.journal().store(id, expected, record, sync);
        }
        // Records kept in files are synced whatever the durability asked.
        let file: LocalRecordFile = self.read_json(self.record_path(kind, id))?;
        if file.revision != expected {
            return Ok(None);
        }
        let file = LocalRecordFile {
            record: Some(record),
            revision: file.revision + 1,
        };
        let bytes = serde_json::to_vec(&file).expect("a record serializes");
        let name = format!("{}.json", group_key(id));
        write_atomically(&self.dir.join(kind.folder()), &name, &bytes)?;
        Ok(Some(file.revision))
    }

    async fn list_records(&self, kind: RecordKind) -> Result<Vec<String>, CoordinatorError> {
        if kind == RecordKind::ShareState {
            return Ok(self.journal().ids());
        }
        let dir = self.dir.join(kind.folder());
        let entries = std::fs::read_dir(&dir).map_err(|source| CoordinatorError::Storage {
            path: dir.clone(),
            source,
        })?;
        let mut ids: Vec<String> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".json").and_then(group_from_key)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn delete_record(&self, kind: RecordKind, id: &str) -> Result<(), CoordinatorError> {
        validate_group_id(id)?;
        if kind == RecordKind::ShareState {
            return self.journal().delete(id);
        }
        let path = self.record_path(kind, id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CoordinatorError::Storage { path, source }),
        }
    }

    async fn sync_written(&self) -> Result<(), CoordinatorError> {
        self.journal().sync()
    }
}

impl LocalGroupStore {
    fn journal(&self) -> std::sync::MutexGuard<'_, RecordJournal> {
        self.share_states.lock().expect("share-state journal lock")
    }

    fn record_path(&self, kind: RecordKind, id: &str) -> PathBuf {
        self.dir
            .join(kind.folder())
            .join(format!("{}.json", group_key(id)))
    }
}

/// A cluster: the keys in the module doc, on its own etcd connection (the group thread's).
pub struct EtcdGroupStore {
    client: crate::failover::Etcd,
    prefix: String,
}

impl EtcdGroupStore {
    pub async fn connect(
        endpoints: &[String],
        cluster: &str,
    ) -> Result<EtcdGroupStore, CoordinatorError> {
        let options = connect_options().with_timeout(Duration::from_secs(5));
        let client = connect_client(endpoints, options).await?;
        Ok(EtcdGroupStore {
            client,
            prefix: format!("/strata/{cluster}/"),
        })
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// Puts `value` at `key` if the key's revision is still `expected` (0: absent); its new
    /// revision, or `None` when fenced.
    async fn fenced_put(
        &self,
        key: String,
        expected: Revision,
        value: Vec<u8>,
    ) -> Result<Option<Revision>, CoordinatorError> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                expected,
            )])
            .and_then([TxnOp::put(key, value, None)]);
        let response = self.client.txn(txn).await.map_err(etcd_error)?;
        if !response.succeeded() {
            return Ok(None);
        }
        // The put's revision is the transaction's: the key's new mod revision.
        Ok(Some(
            response.header().map_or(0, |header| header.revision()),
        ))
    }
}

impl GroupStore for EtcdGroupStore {
    async fn load_group(&self, group: &str) -> Result<LoadedGroup, CoordinatorError> {
        validate_group_id(group)?;
        let client = &self.client;
        let record_key = self.key(&format!("groups/{}", group_key(group)));
        let record = client.get(record_key, None).await.map_err(etcd_error)?;
        let (record, revision) = match record.kvs().first() {
            Some(kv) => (Some(decode(kv.key(), kv.value())?), kv.mod_revision()),
            None => (None, 0),
        };
        let offsets_prefix = self.key(&format!("offsets/{}/", group_key(group)));
        // One key per topic, each a map of its partitions' offsets: large for a topic of many
        // partitions.
        let (stored, _) =
            get_prefix(&self.client, &offsets_prefix, LARGE_VALUES_PER_PAGE, 0).await?;
        let mut offsets = GroupOffsets::new();
        for kv in &stored {
            let topic = String::from_utf8_lossy(&kv.key()[offsets_prefix.len()..]).into_owned();
            offsets.insert(topic, decode(kv.key(), kv.value())?);
        }
        Ok(LoadedGroup {
            record,
            revision,
            offsets,
        })
    }

    async fn store_group(
        &self,
        group: &str,
        expected: Revision,
        record: &GroupRecord,
    ) -> Result<Option<Revision>, CoordinatorError> {
        validate_group_id(group)?;
        let key = self.key(&format!("groups/{}", group_key(group)));
        let value = serde_json::to_vec(record).expect("a group record serializes");
        self.fenced_put(key, expected, value).await
    }

    async fn commit_offsets(
        &self,
        group: &str,
        fence: Revision,
        topics: &GroupOffsets,
    ) -> Result<bool, CoordinatorError> {
        validate_group_id(group)?;
        let group = group_key(group);
        let record_key = self.key(&format!("groups/{group}"));
        let puts: Vec<TxnOp> = topics
            .iter()
            .map(|(topic, partitions)| {
                TxnOp::put(
                    self.key(&format!("offsets/{group}/{topic}")),
                    serde_json::to_vec(partitions).expect("offsets serialize"),
                    None,
                )
            })
            .collect();
        let txn = Txn::new()
            .when([Compare::mod_revision(record_key, CompareOp::Equal, fence)])
            .and_then(puts);
        let response = self.client.txn(txn).await.map_err(etcd_error)?;
        Ok(response.succeeded())
    }

    async fn delete_group(&self, group: &str, fence: Revision) -> Result<bool, CoordinatorError> {
        validate_group_id(group)?;
        let group = group_key(group);
        let record_key = self.key(&format!("groups/{group}"));
        let txn = Txn::new()
            .when([Compare::mod_revision(
                record_key.clone(),
                CompareOp::Equal,
                fence,
            )])
            .and_then([
                TxnOp::delete(record_key, None),
                TxnOp::delete(
                    self.key(&format!("offsets/{group}/")),
                    Some(DeleteOptions::new().with_prefix()),
                ),
            ]);
        let response = self.client.txn(txn).await.map_err(etcd_error)?;
        Ok(response.succeeded())
    }

    async fn list_groups(&self) -> Result<Vec<(String, i32)>, CoordinatorError> {
        let prefix = self.key("groups/");
        let (records, _) = get_prefix(&self.client, &prefix, LARGE_VALUES_PER_PAGE, 0).await?;
        let mut groups = Vec::new();
        for kv in &records {
            let record: GroupRecord = decode(kv.key(), kv.value())?;
            let key = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            let Some(group) = group_from_key(&key) else {
                tracing::warn!(key, "a group record under a key no group id escapes to");
                continue;
            };
            groups.push((group, record.generation));
        }
        groups.sort();
        Ok(groups)
    }

    async fn allocate_producer_ids(&self, count: i64) -> Result<i64, CoordinatorError> {
        assert!(count > 0, "allocate at least one id");
        let key = self.key("producer-ids");
        let client = &self.client;
        // Compare-and-swap on the counter; a lost race reads again.
        for _ in 0..100 {
            let current = client.get(key.clone(), None).await.map_err(etcd_error)?;
            let (next, revision) = match current.kvs().first() {
                Some(kv) => (
                    String::from_utf8_lossy(kv.value())
                        .parse::<i64>()
                        .map_err(|error| CoordinatorError::Corrupt {
                            path: key.clone().into(),
                            reason: error.to_string(),
                        })?,
                    kv.mod_revision(),
                ),
                None => (0, 0),
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(key.clone(), (next + count).to_string(), None)]);
            if client.txn(txn).await.map_err(etcd_error)?.succeeded() {
                return Ok(next);
            }
        }
        Err(CoordinatorError::Unavailable(
            "the producer id counter is contended; try again".into(),
        ))
    }

    async fn load_record(
        &self,
        kind: RecordKind,
        id: &str,
    ) -> Result<(Option<serde_json::Value>, Revision), CoordinatorError> {
        validate_group_id(id)?;
        let key = self.key(&format!("{}/{}", kind.folder(), group_key(id)));
        let response = self.client.get(key, None).await.map_err(etcd_error)?;
        Ok(match response.kvs().first() {
            Some(kv) => (Some(decode(kv.key(), kv.value())?), kv.mod_revision()),
            None => (None, 0),
        })
    }

    async fn store_record(
        &self,
        kind: RecordKind,
        id: &str,
        expected: Revision,
        record: &serde_json::Value,
        _: Durability,
    ) -> Result<Option<Revision>, CoordinatorError> {
        validate_group_id(id)?;
        let key = self.key(&format!("{}/{}", kind.folder(), group_key(id)));
        let value = serde_json::to_vec(record).expect("a record serializes");
        self.fenced_put(key, expected, value).await
    }

    async fn list_records(&self, kind: RecordKind) -> Result<Vec<String>, CoordinatorError> {
        let prefix = self.key(&format!("{}/", kind.folder()));
        let (records, _) = get_prefix(&self.client, &prefix, LARGE_VALUES_PER_PAGE, 0).await?;
        let mut ids: Vec<String> = records
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                key.strip_prefix(&prefix).and_then(group_from_key)
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn delete_record(&self, kind: RecordKind, id: &str) -> Result<(), CoordinatorError> {
        validate_group_id(id)?;
        let key = self.key(&format!("{}/{}", kind.folder(), group_key(id)));
        let txn = Txn::new().and_then([TxnOp::delete(key, None)]);
        self.client.txn(txn).await.map_err(etcd_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    }

    use crate::conformance::offsets;

    #[test]
    fn offsets_expire_only_after_the_retention_without_members_or_commits() {
        let at = |empty_since_ms, committed_ms| LoadedGroup {
            record: Some(GroupRecord {
                empty_since_ms,
                ..GroupRecord::at(3)
            }),
            revision: 7,
            offsets: GroupOffsets::from([(
                "t".to_string(),
                BTreeMap::from([(
                    0,
                    StoredOffset {
                        offset: 5,
                        metadata: String::new(),
                        committed_ms,
                    },
                )]),
            )]),
        };
        // Empty since 1,000, last commit at 1,500: expires at 1,500 + retention.
        assert!(!offsets_expired(
            &at(Some(1_000), Some(1_500)),
            2_499,
            1_000
        ));
        assert!(offsets_expired(&at(Some(1_000), Some(1_500)), 2_500, 1_000));
        // A group with members (no `empty_since`) never expires.
        assert!(!offsets_expired(&at(None, Some(0)), i64::MAX, 1_000));
        // Times an older version did not store: kept.
        assert!(!offsets_expired(&at(Some(0), None), i64::MAX, 1_000));
        // A record without offsets expires from when it became empty.
        let bare = LoadedGroup {
            offsets: GroupOffsets::new(),
            ..at(Some(1_000), None)
        };
        assert!(offsets_expired(&bare, 2_000, 1_000));
        assert!(!offsets_expired(&LoadedGroup::default(), i64::MAX, 1));
    }

    #[test]
    fn group_keys_escape_what_names_no_file_and_read_back_as_their_ids() {
        // The topic-name alphabet stands for itself: groups stored before keep their keys.
        assert_eq!(group_key("billing-v2.eu_1"), "billing-v2.eu_1");
        assert_eq!(group_key("a/b"), "a%2Fb");
        assert_eq!(group_key("a%2Fb"), "a%252Fb");
        assert_eq!(group_key("roundrobin,range"), "roundrobin%2Crange");
        for id in ["a/b", "a%2Fb", "ü", " ", "..", "x\0y", "%"] {
            assert_eq!(group_from_key(&group_key(id)).as_deref(), Some(id));
            assert_eq!(group_key(id).len(), escaped_len(id));
        }
        // Only the canonical escape of a byte outside the alphabet decodes.
        for key in ["a%2fb", "a%41", "a%2", "a/b", "%zz", "a,b"] {
            assert_eq!(group_from_key(key), None, "{key}");
        }
    }

    #[test]
    fn the_local_store_conforms() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalGroupStore::open(dir.path()).unwrap();
        block_on(crate::conformance::check_group_store(&store));
    }

    #[test]
    fn written_records_outlive_the_process_and_fence_a_store_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let id = "g/t/0";
        let stored = block_on(async {
            let store = LocalGroupStore::open(dir.path()).unwrap();
            let mut revision = 0;
            for start in 0..3 {
                let state = serde_json::json!({ "start": start });
                revision = store
                    .store_record(
                        RecordKind::ShareState,
                        id,
                        revision,
                        &state,
                        Durability::Written,
                    )
                    .await
                    .unwrap()
                    .expect("not fenced: this store wrote the revision it checks");
            }
            // A crash here (no sync) keeps what was written: it is in the journal's file.
            store.sync_written().await.unwrap();
            revision
        });
        block_on(async {
            let store = LocalGroupStore::open(dir.path()).unwrap();
            // A store that never read the record fences on the file's revision.
            let stale = serde_json::json!({ "start": 0 });
            let fenced = store
                .store_record(
                    RecordKind::ShareState,
                    id,
                    stored - 1,
                    &stale,
                    Durability::Written,
                )
                .await
                .unwrap();
            assert_eq!(fenced, None);
            assert_eq!(
                store.load_record(RecordKind::ShareState, id).await.unwrap(),
                (Some(serde_json::json!({ "start": 2 })), stored)
            );
            // Deleted after it was written and before the sync: the sync has nothing to keep.
            let next = store
                .store_record(
                    RecordKind::ShareState,
                    id,
                    stored,
                    &stale,
                    Durability::Written,
                )
                .await
                .unwrap();
            assert!(next.is_some());
            store
                .delete_record(RecordKind::ShareState, id)
                .await
                .unwrap();
            store.sync_written().await.unwrap();
            assert_eq!(
                store.load_record(RecordKind::ShareState, id).await.unwrap(),
                (None, 0)
            );
        });
    }

    #[test]
    fn local_store_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            // Fencing is the conformance suite's (above); here, what must outlive the process.
            let store = LocalGroupStore::open(dir.path()).unwrap();
            let record = |generation| GroupRecord::at(generation);
            let first = store
                .store_group("g", 0, &record(1))
                .await
                .unwrap()
                .unwrap();
            let t = offsets("t", &[(0, 5), (1, 7)]);
            assert!(store.commit_offsets("g", first, &t).await.unwrap());
            let second = store
                .store_group("g", first, &record(2))
                .await
                .unwrap()
                .unwrap();
            let u = offsets("u", &[(0, 1)]);
            assert!(store.commit_offsets("g", second, &u).await.unwrap());
            for block in 0..2 {
                let ids = store
                    .allocate_producer_ids(PRODUCER_ID_BLOCK)
                    .await
                    .unwrap();
                assert_eq!(ids, block * PRODUCER_ID_BLOCK);
            }
        });
        block_on(async {
            let store = LocalGroupStore::open(dir.path()).unwrap();
            let loaded = store.load_group("g").await.unwrap();
            assert_eq!(loaded.record, Some(GroupRecord::at(2)));
            assert_eq!(loaded.offsets["t"][&0].offset, 5);
            assert_eq!(loaded.offsets["t"][&1].offset, 7);
            assert_eq!(loaded.offsets["u"][&0].offset, 1);
            assert_eq!(
                store.list_groups().await.unwrap(),
                vec![("g".to_string(), 2)]
            );
            assert_eq!(
                store.allocate_producer_ids(1).await.unwrap(),
                2 * PRODUCER_ID_BLOCK
            );
            // An id that looks like a path names a file inside the store's folder.
            assert!(
                store
                    .store_group("../escape", 0, &GroupRecord::at(1))
                    .await
                    .unwrap()
                    .is_some()
            );
            assert!(dir.path().join("groups/..%2Fescape.json").is_file());
            assert!(!dir.path().join("escape.json").exists());
            let revision = store.load_group("../escape").await.unwrap().revision;
            assert!(store.delete_group("../escape", revision).await.unwrap());
            // Deleting the group takes its record and offsets, fenced like a commit.
            let revision = store.load_group("g").await.unwrap().revision;
            assert!(!store.delete_group("g", revision - 1).await.unwrap());
            assert!(store.delete_group("g", revision).await.unwrap());
            assert_eq!(store.load_group("g").await.unwrap(), LoadedGroup::default());
            assert!(store.list_groups().await.unwrap().is_empty());
        });
    }
}
