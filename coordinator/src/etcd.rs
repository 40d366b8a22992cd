//! The etcd coordinator: cluster state in etcd under `/strata/<cluster>/` (DESIGN §6).
//!
//! ```text
//! brokers/<id>             BrokerInfo (JSON), on this node's lease: gone when the node dies
//! controller               etcd election; its leader value is the controller's node id
//! topics/<topic>           TopicRecord (JSON): replication factor, config, initial assignment
//! partitions/<topic>/<p>   PartitionState (JSON)
//! ```
//!
//! Every write that must not clobber newer state is a transaction that compares first: a broker
//! id is taken only if its key does not exist, a topic is created only if absent, and deleted
//! only if still present. etcd caps a transaction at 128 operations (`--max-txn-ops`), fewer
//! than a topic may have partitions, so the topic record, written in one step, is what creates
//! a topic: it holds every partition's initial replicas. The partition keys follow in chunks,
//! each only where absent; until a partition's key exists, readers see its initial state, and
//! the controller writes any key a creator did not get to.
//!
//! The etcd client is bound to the runtime it was created on; this type lives on the node's
//! control thread. Calls are made on clones of the client (cheap handles to one connection).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};

use crate::broker_configs::{BrokerConfigAlteration, BrokerConfigRecord, BrokerScope};
use crate::failover::Etcd;
use crate::group_configs::{GroupConfigAlteration, GroupConfigRecord};
use crate::quotas::{QuotaAlteration, QuotaEntity, QuotaRecord};
use crate::security::{UserRecord, check_acls, check_credential, split_by_filters};
use crate::{
    BrokerInfo, ConfigChange, ConfigCheck, ControllerKey, Coordinator, CoordinatorError,
    PartitionChange, PartitionState, StoredPartition, TopicSpec, TopicState, placement,
    validate_topic_name,
};
use strata_auth::acl::{AclBinding, AclFilter};
use strata_auth::scram::{ScramCredential, ScramMechanism};

/// Broker liveness lease, unless configured otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// Partition keys created per transaction: each takes a compare and a put, and the chunk one
/// compare more, within etcd's default cap of 128 operations per transaction.
const PARTITION_KEYS_PER_TXN: usize = 60;
/// Operations per transaction of independent writes (etcd allows 128 by default).
const TXN_OPS: usize = 100;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TopicRecord {
    name: String,
    replication_factor: u16,
    config: BTreeMap<String, String>,
    /// Each partition's replicas as created (index = partition): the state of a partition whose
    /// key is not written yet. Empty in records from before topics were created in chunks
    /// (their partition keys were all written with the record).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    assignment: Vec<Vec<i32>>,
    #[serde(default, skip_serializing_if = "crate::TopicId::is_unset")]
    id: crate::TopicId,
}

impl TopicRecord {
    /// The topic as readers see it: each partition's stored state, or its initial one where its
    /// key is not written yet.
    fn state(self, stored: Vec<PartitionState>) -> TopicState {
        let written: std::collections::BTreeSet<u32> =
            stored.iter().map(|partition| partition.partition).collect();
        let mut partitions = stored;
        for (partition, replicas) in self.assignment.iter().enumerate() {
            let partition = partition as u32;
            if !written.contains(&partition) {
                partitions.push(PartitionState::initial(partition, replicas.clone()));
            }
        }
        partitions.sort_by_key(|partition| partition.partition);
        TopicState {
            name: self.name,
            replication_factor: self.replication_factor,
            config: self.config,
            partitions,
            id: self.id,
        }
    }
}

pub struct EtcdCoordinator {
    client: Etcd,
    cluster: String,
    node_id: i32,
    prefix: String,
    /// This node's current lease (a new one after [`EtcdCoordinator::renew_lease`]).
    lease_id: std::cell::Cell<i64>,
    lease_ttl: Duration,
    keep_alive: std::cell::RefCell<tokio::task::JoinHandle<()>>,
    /// The controller as last read (`controller()` is synchronous).
    controller: std::cell::Cell<i32>,
    /// When the lease may expire, as of the last keep-alive answer.
    lease_deadline: Arc<Mutex<Instant>>,
}

/// Grants a lease of `ttl` and keeps it alive in the background, moving `deadline` with every
/// answer (measured from before the request, so it never overestimates).
async fn grant_lease(
    client: &mut Client,
    lease_ttl: Duration,
    deadline: Arc<Mutex<Instant>>,
) -> Result<(i64, tokio::task::JoinHandle<()>), CoordinatorError> {
    let ttl = lease_ttl.as_secs().max(1) as i64;
    let asked = Instant::now();
    let lease = client.lease_grant(ttl, None).await.map_err(etcd_error)?;
    let lease_id = lease.id();
    *deadline.lock().expect("lease deadline") = asked + lease_ttl;
    let (mut keeper, mut responses) = client
        .lease_keep_alive(lease_id)
        .await
        .map_err(etcd_error)?;
    let period = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
    let mut client = client.clone();
    let keep_alive = tokio::spawn(async move {
        let mut interrupted = 0u32;
        loop {
            let asked = Instant::now();
            let answer = match keeper.keep_alive().await {
                Ok(()) => responses.message().await.map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match answer {
                Ok(Some(response)) if response.ttl() > 0 => {
                    *deadline.lock().expect("lease deadline") =
                        asked + Duration::from_secs(response.ttl() as u64);
                    interrupted = 0;
                    tokio::time::sleep(period).await;
                }
                Ok(_) => {
                    tracing::error!(
                        "etcd lease {lease_id} expired: this node lost its registration"
                    );
                    return;
                }
                Err(error) => {
                    // The member it ran on went away: keep the same lease alive through
                    // another (the client moves on after a failed request), until it answers
                    // or the lease is gone.
                    if interrupted == 0 {
                        tracing::warn!("etcd lease keep-alive interrupted: {error}");
                    }
                    interrupted += 1;
                    // Quickly at first (another member is likely up), then every second.
                    let wait = Duration::from_millis(100 * u64::from(interrupted.min(10)));
                    tokio::time::sleep(wait).await;
                    match client.lease_keep_alive(lease_id).await {
                        Ok((new_keeper, new_responses)) => {
                            (keeper, responses) = (new_keeper, new_responses);
                        }
                        Err(error) => tracing::debug!("etcd lease keep-alive: {error}"),
                    }
                }
            }
        }
    });
    Ok((lease_id, keep_alive))
}

/// Connection settings for a node's etcd clients. A member that has sent nothing for 6 s gets
/// an HTTP/2 ping, and is left if 3 s pass without the answer: a paused member was left after
/// 8.8 s (measured). A working member sends something every few seconds (the lease keep-alive
/// stream), so then no ping goes out. Pings only with a stream open and no more often: gRPC
/// servers close clients that ping too often (etcd documents a 5 s minimum,
/// `--grpc-keepalive-min-time`); a sixth of a 2 s lease with as short a wait cut healthy
/// connections on a busy test machine ("keep-alive timed out").
pub(crate) fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
        .with_keep_alive_while_idle(false)
}

/// A client for `endpoints` that talks to one member at a time and moves on when it fails
/// (see [`crate::failover`]).
pub(crate) async fn connect_client(
    endpoints: &[String],
    options: ConnectOptions,
) -> Result<Etcd, CoordinatorError> {
    Etcd::connect(endpoints, options).await.map_err(etcd_error)
}

pub(crate) fn etcd_error(error: etcd_client::Error) -> CoordinatorError {
    CoordinatorError::Unavailable(error.to_string())
}

/// Keys per page of a prefix read: partition states are ~150 bytes, topic records up to
/// ~1 MB with a huge assignment, so a page stays well inside gRPC's 4 MiB per answer only when
/// it is sized for what it reads.
pub(crate) const SMALL_VALUES_PER_PAGE: i64 = 5_000;
/// For values that may each be close to etcd's 1.5 MiB request limit (topic records, group
/// records).
pub(crate) const LARGE_VALUES_PER_PAGE: i64 = 2;

/// Every key under `prefix`, in pages of `page` keys, all at one revision: `at_revision`, or
/// the first page's when 0. Returns the keys and that revision. One unpaged answer may carry
/// at most 4 MiB (gRPC's limit): a cluster of some 30,000 partitions read in one answer failed
/// every read of the cluster state.
pub(crate) async fn get_prefix(
    client: &Etcd,
    prefix: &str,
    page: i64,
    at_revision: i64,
) -> Result<(Vec<etcd_client::KeyValue>, i64), CoordinatorError> {
    let end = prefix_end(prefix.as_bytes());
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = at_revision;
    let mut keys = Vec::new();
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let mut response = client
            .get(from.clone(), Some(options))
            .await
            .map_err(etcd_error)?;
        if revision == 0 {
            revision = response.header().map_or(0, |header| header.revision());
        }
        let more = response.more();
        let kvs = response.take_kvs();
        match kvs.last() {
            Some(last) if more => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => {
                keys.extend(kvs);
                return Ok((keys, revision));
            }
        }
        keys.extend(kvs);
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the key space.
    vec![0]
}

/// Topics from their records and their stored partition states (a partition whose key is not
/// written yet reads as its initial state), in name order.
fn assemble_topics(
    records: Vec<TopicRecord>,
    partitions: impl Iterator<Item = (String, PartitionState)>,
) -> Vec<TopicState> {
    let mut stored: BTreeMap<String, Vec<PartitionState>> = BTreeMap::new();
    for (topic, state) in partitions {
        stored.entry(topic).or_default().push(state);
    }
    let mut topics: Vec<TopicState> = records
        .into_iter()
        .map(|record| {
            let partitions = stored.remove(&record.name).unwrap_or_default();
            record.state(partitions)
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    topics
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    key: &[u8],
    value: &[u8],
) -> Result<T, CoordinatorError> {
    serde_json::from_slice(value).map_err(|error| CoordinatorError::Corrupt {
        path: String::from_utf8_lossy(key).into_owned().into(),
        reason: error.to_string(),
    })
}

impl EtcdCoordinator {
    /// Connects to etcd and takes a lease for this node (kept alive in the background).
    pub async fn connect(
        endpoints: &[String],
        cluster: &str,
        node_id: i32,
        lease_ttl: Duration,
    ) -> Result<EtcdCoordinator, CoordinatorError> {
        // No request timeout on the options: it would also cut a blocking election campaign.
        let options = connect_options();
        let client = connect_client(endpoints, options).await?;
        let lease_deadline = Arc::new(Mutex::new(Instant::now() + lease_ttl));
        let (lease_id, keep_alive) =
            grant_lease(&mut client.raw(), lease_ttl, lease_deadline.clone()).await?;
        Ok(EtcdCoordinator {
            client,
            cluster: cluster.to_string(),
            node_id,
            prefix: format!("/strata/{cluster}/"),
            lease_id: std::cell::Cell::new(lease_id),
            lease_ttl,
            keep_alive: std::cell::RefCell::new(keep_alive),
            controller: std::cell::Cell::new(-1),
            lease_deadline,
        })
    }

    fn election(&self) -> String {
        self.key("controller")
    }

    /// The topic records and every stored partition key (topic, state, mod revision), at one
    /// revision, and that revision.
    async fn read_state(
        &self,
    ) -> Result<(Vec<TopicRecord>, Vec<(String, PartitionState, i64)>, i64), CoordinatorError> {
        let (records, revision) =
            get_prefix(&self.client, &self.key("topics/"), LARGE_VALUES_PER_PAGE, 0).await?;
        let prefix = self.key("partitions/");
        let (keys, _) = get_prefix(&self.client, &prefix, SMALL_VALUES_PER_PAGE, revision).await?;
        let records = records
            .iter()
            .map(|kv| decode(kv.key(), kv.value()))
            .collect::<Result<_, _>>()?;
        let mut partitions = Vec::with_capacity(keys.len());
        for kv in &keys {
            let state: PartitionState = decode(kv.key(), kv.value())?;
            let rest = String::from_utf8_lossy(&kv.key()[prefix.len()..]);
            let topic = rest.rsplit_once('/').map_or(&*rest, |(topic, _)| topic);
            partitions.push((topic.to_string(), state, kv.mod_revision()));
        }
        Ok((records, partitions, revision))
    }

    /// Writes a partition's new state only if it is unchanged since `read_revision` and `proof`
    /// is still the controller's key: a stale controller or a lost race writes nothing.
    /// Returns whether the write happened.
    pub async fn write_partition_fenced(
        &self,
        topic: &str,
        state: &PartitionState,
        read_revision: i64,
        proof: &ControllerKey,
    ) -> Result<bool, CoordinatorError> {
        let key = self.key(&format!("partitions/{topic}/{}", state.partition));
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.clone(), CompareOp::Equal, read_revision),
                Compare::create_revision(proof.0.clone(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(
                key,
                serde_json::to_vec(state).expect("partition serializes"),
                None,
            )]);
        let client = &self.client;
        let response = client.txn(txn).await.map_err(etcd_error)?;
        Ok(response.succeeded())
    }

    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// `acls/<sha-256 of the binding's JSON>`: the same binding always has the same key.
    fn acl_key(&self, binding: &AclBinding) -> String {
        self.hashed_key("acls", binding)
    }

    /// `<dir>/<sha-256 of value's JSON>`: one key per value, whatever characters it holds.
    fn hashed_key(&self, dir: &str, value: &impl serde::Serialize) -> String {
        let json = serde_json::to_vec(value).expect("a stored value serializes");
        let digest = ring::digest::digest(&ring::digest::SHA256, &json);
        let hex: String = digest
            .as_ref()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        self.key(&format!("{dir}/{hex}"))
    }

    /// `quotas/<sha-256 of the entity's JSON>`.
    fn quota_key(&self, entity: &QuotaEntity) -> String {
        self.hashed_key("quotas", entity)
    }

    /// Applies `change` to `user`'s record (a new, empty one when absent); a record left
    /// without credentials is deleted. Returns what `change` returned.
    async fn change_user(
        &self,
        user: &str,
        mut change: impl FnMut(&mut UserRecord) -> bool,
    ) -> Result<bool, CoordinatorError> {
        let key = self.key(&format!("users/{user}"));
        self.change_record(&key, |stored: Option<UserRecord>| {
            let mut record = stored.unwrap_or_else(|| UserRecord {
                name: user.to_string(),
                credentials: Vec::new(),
            });
            if !change(&mut record) {
                return None;
            }
            Some((!record.credentials.is_empty()).then_some(record))
        })
        .await
    }

    /// Reads `key`'s record, lets `change` decide what becomes of it (`None`: nothing changes;
    /// `Some(None)`: deleted; `Some(Some(record))`: stored) and writes that only if the key is
    /// unchanged since it was read, reading again after a race with another broker's write.
    /// Returns whether anything was written.
    async fn change_record<T: serde::Serialize + for<'de> Deserialize<'de>>(
        &self,
        key: &str,
        mut change: impl FnMut(Option<T>) -> Option<Option<T>>,
    ) -> Result<bool, CoordinatorError> {
        loop {
            let response = self.client.get(key, None).await.map_err(etcd_error)?;
            let (stored, revision) = match response.kvs().first() {
                Some(kv) => (Some(decode::<T>(kv.key(), kv.value())?), kv.mod_revision()),
                None => (None, 0),
            };
            let Some(next) = change(stored) else {
                return Ok(false);
            };
            let write = match next {
                None => TxnOp::delete(key, None),
                Some(record) => TxnOp::put(
                    key,
                    serde_json::to_vec(&record).expect("a stored record serializes"),
                    None,
                ),
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
                .and_then([write]);
            if self.client.txn(txn).await.map_err(etcd_error)?.succeeded() {
                return Ok(true);
            }
        }
    }

    /// Every record stored under `dir/`, in key order.
    async fn records_under<T: for<'de> Deserialize<'de>>(
        &self,
        dir: &str,
    ) -> Result<Vec<T>, CoordinatorError> {
        let (keys, _) = get_prefix(&self.client, &self.key(dir), SMALL_VALUES_PER_PAGE, 0).await?;
        keys.iter().map(|kv| decode(kv.key(), kv.value())).collect()
    }

    /// Stops keeping the lease alive and revokes it: this node's registration disappears now
    /// instead of after the TTL (a clean shutdown).
    pub async fn resign(self) -> Result<(), CoordinatorError> {
        self.leave().await
    }

    /// Stops the keep-alive without revoking, as a crashed node would: the registration lasts
    /// until the lease TTL runs out. For tests of failure detection.
    pub fn abandon(self) {
        self.keep_alive.borrow().abort();
    }

    /// The topic's record and the revision etcd created it at; `None` if there is no topic.
    async fn topic_record(
        &self,
        topic: &str,
    ) -> Result<Option<(TopicRecord, i64, i64)>, CoordinatorError> {
        let key = self.key(&format!("topics/{topic}"));
        let response = self
            .client
            .clone()
            .get(key, None)
            .await
            .map_err(etcd_error)?;
        let Some(kv) = response.kvs().first() else {
            return Ok(None);
        };
        let record: TopicRecord = decode(kv.key(), kv.value())?;
        Ok(Some((record, kv.create_revision(), kv.mod_revision())))
    }

    /// The partition keys etcd holds for `topic` (without the initial states of unwritten ones).
    async fn partitions_of(&self, topic: &str) -> Result<Vec<PartitionState>, CoordinatorError> {
        let prefix = self.key(&format!("partitions/{topic}/"));
        let (keys, _) = get_prefix(&self.client, &prefix, SMALL_VALUES_PER_PAGE, 0).await?;
        let mut partitions: Vec<PartitionState> = keys
            .iter()
            .map(|kv| decode(kv.key(), kv.value()))
            .collect::<Result<_, _>>()?;
        partitions.sort_by_key(|partition| partition.partition);
        Ok(partitions)
    }
}

impl Coordinator for EtcdCoordinator {
    fn cluster_name(&self) -> &str {
        &self.cluster
    }

    /// Whether this node's lease may still be valid. Once it may not, another broker can have
    /// taken over what this node led: stop acting on it (fail safe, not split brain).
    fn lease_valid(&self) -> bool {
        Instant::now() < *self.lease_deadline.lock().expect("lease deadline")
    }

    /// Campaigns to become the controller; resolves once elected (possibly never). Run it in
    /// its own task, on a client clone.
    fn campaign(
        &self,
    ) -> impl Future<Output = Result<ControllerKey, CoordinatorError>> + Send + 'static {
        let mut client = self.client.raw();
        let (name, value, lease) = (
            self.election(),
            self.node_id.to_string(),
            self.lease_id.get(),
        );
        async move {
            let response = client
                .campaign(name, value, lease)
                .await
                .map_err(etcd_error)?;
            let key = response.leader().ok_or_else(|| {
                CoordinatorError::Unavailable("campaign returned no leader key".into())
            })?;
            Ok(ControllerKey(key.key().to_vec()))
        }
    }

    /// Reads who the controller is now (-1: none) and remembers it for `controller()`.
    async fn refresh_controller(&self) -> Result<i32, CoordinatorError> {
        let mut client = self.client.raw();
        let controller = match client.leader(self.election()).await {
            Ok(response) => response
                .kv()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
                .unwrap_or(-1),
            // Not knowing is not "nobody": the caller keeps what it had.
            Err(error) if crate::failover::unavailable(&error) => return Err(etcd_error(error)),
            // No leader yet is an error in etcd's election API.
            Err(_) => -1,
        };
        self.controller.set(controller);
        Ok(controller)
    }

    /// Watches every key of the cluster from the revision after `read_at` (that of a read of
    /// the state, see [`EtcdCoordinator::topics_at`]) and sends `()` on `changed` after each
    /// batch of events: the control thread re-reads the state then, instead of polling. From
    /// that revision no change made after the read can slip between the read and the watch's
    /// start. Runs until the watch fails (a compacted revision, a lost member); the caller then
    /// reads again and watches anew.
    fn watch_changes(
        &self,
        read_at: i64,
        changed: tokio::sync::mpsc::UnboundedSender<()>,
    ) -> impl Future<Output = Result<(), CoordinatorError>> + Send + 'static {
        let mut client = self.client.raw();
        let prefix = self.prefix.clone();
        async move {
            let mut stream = client
                .watch(
                    prefix.clone(),
                    Some(
                        etcd_client::WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(read_at + 1),
                    ),
                )
                .await
                .map_err(etcd_error)?;
            while let Some(response) = stream.message().await.map_err(etcd_error)? {
                if response.canceled() {
                    return Err(CoordinatorError::Unavailable(
                        "the etcd watch was cancelled".into(),
                    ));
                }
                // Group, transaction and producer-id keys (groups.rs) share the prefix but are
                // not cluster state: offset commits must not make every broker re-read it.
                // Group configs (`group-configs/`) are: every broker's view carries them.
                let cluster_changed = response.events().iter().any(|event| {
                    event.kv().is_some_and(|kv| {
                        let key = kv.key().strip_prefix(prefix.as_bytes()).unwrap_or(kv.key());
                        !(key.starts_with(b"groups/")
                            || key.starts_with(b"offsets/")
                            || key.starts_with(b"txns/")
                            || key == b"producer-ids")
                    })
                });
                if cluster_changed && changed.send(()).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        }
    }

    /// Every topic, read at one etcd revision (records and partition keys agree), and that
    /// revision: a watch from the next one sees every change the read did not.
    async fn topics_at(&self) -> Result<(Vec<TopicState>, i64), CoordinatorError> {
        let (records, partitions, revision) = self.read_state().await?;
        let states = partitions
            .into_iter()
            .map(|(topic, state, _)| (topic, state));
        Ok((assemble_topics(records, states), revision))
    }

    /// Every topic, and every stored partition key with the mod revision its state was read
    /// at, all read at one etcd revision: what a controller pass acts on.
    async fn topics_with_revisions(
        &self,
    ) -> Result<(Vec<TopicState>, Vec<StoredPartition>), CoordinatorError> {
        let (records, partitions, _) = self.read_state().await?;
        let states = partitions
            .iter()
            .map(|(topic, state, _)| (topic.clone(), state.clone()));
        Ok((assemble_topics(records, states), partitions))
    }

    /// [`EtcdCoordinator::write_partition_fenced`] for many partitions `(topic, state, read
    /// revision)`, in transactions of up to [`PARTITION_KEYS_PER_TXN`]: a controller moving
    /// the leaderships of a dead broker's thousands of partitions wrote them one round trip
    /// each. A transaction whose compares fail (one of its partitions changed since it was
    /// read, or the controller lost its key) is written again one partition at a time, so one
    /// busy partition holds back no other. Returns whether each change was stored.
    async fn write_partitions_fenced(
        &self,
        changes: &[StoredPartition],
        proof: &ControllerKey,
    ) -> Result<Vec<bool>, CoordinatorError> {
        let mut stored = Vec::with_capacity(changes.len());
        for chunk in changes.chunks(PARTITION_KEYS_PER_TXN) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|(topic, state, _)| {
                    self.key(&format!("partitions/{topic}/{}", state.partition))
                })
                .collect();
            let compares = keys
                .iter()
                .zip(chunk)
                .map(|(key, (_, _, revision))| {
                    Compare::mod_revision(key.clone(), CompareOp::Equal, *revision)
                })
                .chain([Compare::create_revision(
                    proof.0.clone(),
                    CompareOp::Greater,
                    0,
                )]);
            let puts = keys.iter().zip(chunk).map(|(key, (_, state, _))| {
                TxnOp::put(
                    key.clone(),
                    serde_json::to_vec(state).expect("partition serializes"),
                    None,
                )
            });
            // Refused, the answer says whether the election key still exists.
            let txn = Txn::new()
                .when(compares.collect::<Vec<_>>())
                .and_then(puts.collect::<Vec<_>>())
                .or_else([TxnOp::get(proof.0.clone(), None)]);
            let response = self.client.txn(txn).await.map_err(etcd_error)?;
            if response.succeeded() {
                stored.extend(std::iter::repeat_n(true, chunk.len()));
                continue;
            }
            let fenced = response.op_responses().iter().any(
                |op| matches!(op, etcd_client::TxnOpResponse::Get(get) if get.kvs().is_empty()),
            );
            if fenced {
                // No longer the controller: nothing more of this pass can be written.
                stored.resize(changes.len(), false);
                return Ok(stored);
            }
            for (topic, state, revision) in chunk {
                stored.push(
                    self.write_partition_fenced(topic, state, *revision, proof)
                        .await?,
                );
            }
        }
        Ok(stored)
    }

    fn node_id(&self) -> i32 {
        self.node_id
    }

    async fn users(&self) -> Result<Vec<UserRecord>, CoordinatorError> {
        let mut users: Vec<UserRecord> = self.records_under("users/").await?;
        users.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(users)
    }

    async fn upsert_scram_credential(
        &self,
        user: &str,
        credential: ScramCredential,
    ) -> Result<(), CoordinatorError> {
        check_credential(user, &credential)?;
        self.change_user(user, |record| {
            record.set(credential.clone());
            true
        })
        .await
        .map(drop)
    }

    async fn delete_scram_credential(
        &self,
        user: &str,
        mechanism: Option<ScramMechanism>,
    ) -> Result<bool, CoordinatorError> {
        self.change_user(user, |record| record.remove(mechanism))
            .await
    }

    async fn client_quotas(&self) -> Result<Vec<QuotaRecord>, CoordinatorError> {
        let mut quotas: Vec<QuotaRecord> = self.records_under("quotas/").await?;
        quotas.sort_by(|a, b| a.entity.cmp(&b.entity));
        Ok(quotas)
    }

    /// One key per entity, each changed where it is unchanged since read.
    async fn alter_client_quotas(
        &self,
        alterations: &[QuotaAlteration],
    ) -> Result<(), CoordinatorError> {
        crate::quotas::check_alterations(alterations)?;
        for alteration in alterations {
            let key = self.quota_key(&alteration.entity);
            self.change_record(&key, |stored: Option<QuotaRecord>| {
                let current = stored.map(|record| record.values).unwrap_or_default();
                let values = alteration.apply(&current);
                Some((!values.is_empty()).then(|| QuotaRecord {
                    entity: alteration.entity.clone(),
                    values,
                }))
            })
            .await?;
        }
        Ok(())
    }

    async fn broker_configs(&self) -> Result<Vec<BrokerConfigRecord>, CoordinatorError> {
        let mut records: Vec<BrokerConfigRecord> = self.records_under("broker-configs/").await?;
        records.sort_by_key(|record| record.scope);
        Ok(records)
    }

    /// One key per scope, changed where it is unchanged since read.
    async fn alter_broker_configs(
        &self,
        alteration: &BrokerConfigAlteration,
    ) -> Result<(), CoordinatorError> {
        alteration.check()?;
        let key = self.key(&format!(
            "broker-configs/{}",
            match alteration.scope {
                BrokerScope::Default => "default".to_string(),
                BrokerScope::Broker(id) => id.to_string(),
            }
        ));
        self.change_record(&key, |stored: Option<BrokerConfigRecord>| {
            let current = stored.map(|record| record.values).unwrap_or_default();
            let values = alteration.apply(&current);
            Some((!values.is_empty()).then_some(BrokerConfigRecord {
                scope: alteration.scope,
                values,
            }))
        })
        .await
        .map(drop)
    }

    async fn group_configs(&self) -> Result<Vec<GroupConfigRecord>, CoordinatorError> {
        let mut records: Vec<GroupConfigRecord> = self.records_under("group-configs/").await?;
        // Keys are escaped group ids (`group_key`), whose order is not the ids'.
        records.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(records)
    }

    /// One key per group (its id escaped as its group record's key is), changed where it is
    /// unchanged since read.
    async fn alter_group_configs(
        &self,
        alteration: &GroupConfigAlteration,
    ) -> Result<(), CoordinatorError> {
        alteration.check()?;
        let key = self.key(&format!(
            "group-configs/{}",
            crate::groups::group_key(&alteration.group)
        ));
        self.change_record(&key, |stored: Option<GroupConfigRecord>| {
            let current = stored.map(|record| record.values).unwrap_or_default();
            let values = alteration.apply(&current);
            Some((!values.is_empty()).then(|| GroupConfigRecord {
                group: alteration.group.clone(),
                values,
            }))
        })
        .await
        .map(drop)
    }

    async fn acls(&self) -> Result<Vec<AclBinding>, CoordinatorError> {
        let mut acls: Vec<AclBinding> = self.records_under("acls/").await?;
        acls.sort();
        Ok(acls)
    }

    /// One key per binding, named by the hash of its content: creating it twice writes the
    /// same key.
    async fn create_acls(&self, bindings: &[AclBinding]) -> Result<(), CoordinatorError> {
        check_acls(bindings)?;
        for chunk in bindings.chunks(TXN_OPS) {
            let puts: Vec<TxnOp> = chunk
                .iter()
                .map(|binding| {
                    TxnOp::put(
                        self.acl_key(binding),
                        serde_json::to_vec(binding).expect("an ACL serializes"),
                        None,
                    )
                })
                .collect();
            self.client
                .txn(Txn::new().and_then(puts))
                .await
                .map_err(etcd_error)?;
        }
        Ok(())
    }

    async fn delete_acls(
        &self,
        filters: &[AclFilter],
    ) -> Result<Vec<Vec<AclBinding>>, CoordinatorError> {
        let (deleted, _) = split_by_filters(self.acls().await?, filters);
        let mut keys: Vec<String> = deleted.iter().flatten().map(|b| self.acl_key(b)).collect();
        keys.sort();
        keys.dedup();
        for chunk in keys.chunks(TXN_OPS) {
            let deletes: Vec<TxnOp> = chunk
                .iter()
                .map(|key| TxnOp::delete(key.clone(), None))
                .collect();
            self.client
                .txn(Txn::new().and_then(deletes))
                .await
                .map_err(etcd_error)?;
        }
        Ok(deleted)
    }

    /// Leaves the cluster but keeps reading it: stops the keep-alive and revokes the lease, so
    /// the registration and the controller key (if held) go now and the controller moves this
    /// broker's leaderships at once (a clean shutdown hands them off before it stops).
    async fn leave(&self) -> Result<(), CoordinatorError> {
        self.keep_alive.borrow().abort();
        let mut client = self.client.raw();
        client
            .lease_revoke(self.lease_id.get())
            .await
            .map(drop)
            .map_err(etcd_error)
    }

    /// After the lease lapsed (this node was paused or cut off from etcd for longer than the
    /// TTL): revokes what is left of it and takes a new one, so the node can register again.
    /// Whatever the old lease held (registration, controller candidacy) is gone for good.
    async fn renew_lease(&self) -> Result<(), CoordinatorError> {
        let mut client = self.client.raw();
        let _ = client.lease_revoke(self.lease_id.get()).await;
        let (lease_id, keep_alive) =
            grant_lease(&mut client, self.lease_ttl, self.lease_deadline.clone()).await?;
        self.keep_alive.replace(keep_alive).abort();
        self.lease_id.set(lease_id);
        tracing::warn!(
            node = self.node_id,
            lease = lease_id,
            "took a new etcd lease"
        );
        Ok(())
    }

    /// Writes the partition keys of `topic` that its record assigns but etcd does not hold yet,
    /// each only where absent, in chunks that fit a transaction, and only while the topic is
    /// the one that assigned them (not deleted, nor deleted and created again). Returns how
    /// many it wrote. Safe to run from several brokers at once: the creator after writing the
    /// record, the controller for a creator that stopped half way.
    async fn create_missing_partitions(&self, topic: &str) -> Result<usize, CoordinatorError> {
        let topic_key = self.key(&format!("topics/{topic}"));
        let mut written = 0;
        // A lost race (another writer created some of the keys) reads again and goes on.
        for _ in 0..10 {
            let Some((record, created, _)) = self.topic_record(topic).await? else {
                return Ok(written);
            };
            let stored: std::collections::BTreeSet<u32> = self
                .partitions_of(topic)
                .await?
                .iter()
                .map(|partition| partition.partition)
                .collect();
            let missing: Vec<PartitionState> = record
                .assignment
                .iter()
                .enumerate()
                .filter(|(partition, _)| !stored.contains(&(*partition as u32)))
                .map(|(partition, replicas)| {
                    PartitionState::initial(partition as u32, replicas.clone())
                })
                .collect();
            if missing.is_empty() {
                return Ok(written);
            }
            let mut raced = false;
            for chunk in missing.chunks(PARTITION_KEYS_PER_TXN) {
                let mut compares = vec![Compare::create_revision(
                    topic_key.clone(),
                    CompareOp::Equal,
                    created,
                )];
                let mut puts = Vec::with_capacity(chunk.len());
                for partition in chunk {
                    let key = self.key(&format!("partitions/{topic}/{}", partition.partition));
                    compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                    puts.push(TxnOp::put(
                        key,
                        serde_json::to_vec(partition).expect("partition serializes"),
                        None,
                    ));
                }
                let txn = Txn::new().when(compares).and_then(puts);
                if self
                    .client
                    .clone()
                    .txn(txn)
                    .await
                    .map_err(etcd_error)?
                    .succeeded()
                {
                    written += chunk.len();
                } else {
                    raced = true;
                    break;
                }
            }
            if !raced {
                return Ok(written);
            }
        }
        Err(CoordinatorError::Unavailable(format!(
            "the partitions of topic {topic} kept changing while being created; try again"
        )))
    }

    fn controller(&self) -> i32 {
        self.controller.get()
    }

    async fn brokers(&self) -> Result<Vec<BrokerInfo>, CoordinatorError> {
        let (keys, _) = get_prefix(
            &self.client,
            &self.key("brokers/"),
            SMALL_VALUES_PER_PAGE,
            0,
        )
        .await?;
        let mut brokers: Vec<BrokerInfo> = keys
            .iter()
            .map(|kv| decode(kv.key(), kv.value()))
            .collect::<Result<_, _>>()?;
        brokers.sort_by_key(|broker| broker.id);
        Ok(brokers)
    }

    /// Takes `brokers/<id>` on this node's lease, unless a live process already holds it.
    async fn register_broker(&self, broker: BrokerInfo) -> Result<(), CoordinatorError> {
        let key = self.key(&format!("brokers/{}", broker.id));
        let value = serde_json::to_vec(&broker).expect("broker info serializes");
        let client = &self.client;
        let ours = PutOptions::new().with_lease(self.lease_id.get());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value.clone(), Some(ours.clone()))]);
        let response = client.txn(txn).await.map_err(etcd_error)?;
        if response.succeeded() {
            return Ok(());
        }
        // Taken: by us (re-registration with new addresses) or by another live process.
        let existing = client.get(key.clone(), None).await.map_err(etcd_error)?;
        match existing.kvs().first() {
            Some(kv) if kv.lease() == self.lease_id.get() => client
                .put(key, value, Some(ours))
                .await
                .map(drop)
                .map_err(etcd_error),
            Some(_) => Err(CoordinatorError::BrokerIdTaken(broker.id)),
            // It expired between the two calls: try once more.
            None => Box::pin(self.register_broker(broker)).await,
        }
    }

    /// Every topic, read at one etcd revision: records and partition keys agree.
    async fn topics(&self) -> Result<Vec<TopicState>, CoordinatorError> {
        Ok(self.topics_at().await?.0)
    }

    /// Creates the topic with one write of its record (only if absent: two racing creators
    /// cannot both succeed), which fixes every partition's replicas; then writes the partition
    /// keys in chunks (see the module comment).
    async fn create_topic(&self, spec: TopicSpec) -> Result<TopicState, CoordinatorError> {
        validate_topic_name(&spec.name)?;
        let brokers = self.brokers().await?;
        let existing = self.topics().await?.len();
        let partitions = placement::for_new_topic(&brokers, &spec, existing)?;
        let topic_key = self.key(&format!("topics/{}", spec.name));
        let record = TopicRecord {
            name: spec.name.clone(),
            replication_factor: spec.replication_factor,
            config: spec.config.clone(),
            assignment: partitions.iter().map(|p| p.replicas.clone()).collect(),
            id: crate::TopicId::random(),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                topic_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                topic_key,
                serde_json::to_vec(&record).expect("topic serializes"),
                None,
            )]);
        let client = &self.client;
        let response = client.txn(txn).await.map_err(etcd_error)?;
        if !response.succeeded() {
            return Err(CoordinatorError::TopicExists(spec.name));
        }
        // The topic exists now; a failure from here on leaves keys for the controller to write.
        if let Err(error) = self.create_missing_partitions(&spec.name).await {
            tracing::warn!(topic = %spec.name, "writing the partition keys: {error} (the controller completes them)");
        }
        Ok(record.state(Vec::new()))
    }

    /// Extends the topic record's assignment (only if the record is unchanged since read: of two
    /// racing calls one fails), then writes the new partitions' keys in chunks.
    async fn add_partitions(
        &self,
        topic: &str,
        partitions: u32,
        assignment: &[Vec<i32>],
    ) -> Result<TopicState, CoordinatorError> {
        let brokers = self.brokers().await?;
        let Some((mut record, _, revision)) = self.topic_record(topic).await? else {
            return Err(CoordinatorError::UnknownTopic(topic.to_string()));
        };
        let existing = record.clone().state(self.partitions_of(topic).await?);
        let added = placement::grow_as_asked(&brokers, &existing, partitions, assignment)?;
        // A record from before assignments were kept: its partitions' keys all exist, so their
        // replicas now stand in for the initial ones.
        if record.assignment.len() < existing.partitions.len() {
            record.assignment = existing
                .partitions
                .iter()
                .map(|p| p.replicas.clone())
                .collect();
        }
        record
            .assignment
            .extend(added.iter().map(|partition| partition.replicas.clone()));
        let topic_key = self.key(&format!("topics/{topic}"));
        let txn = Txn::new()
            .when([Compare::mod_revision(
                topic_key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(
                topic_key,
                serde_json::to_vec(&record).expect("topic serializes"),
                None,
            )]);
        let response = self.client.txn(txn).await.map_err(etcd_error)?;
        if !response.succeeded() {
            return Err(CoordinatorError::Invalid(format!(
                "topic {topic} changed while its partitions were being added; try again"
            )));
        }
        if let Err(error) = self.create_missing_partitions(topic).await {
            tracing::warn!(
                topic,
                "writing the partition keys: {error} (the controller completes them)"
            );
        }
        let mut grown = existing;
        grown.partitions.extend(added);
        Ok(grown)
    }

    /// Reads the topic record and writes it back changed, only if nobody wrote it in between
    /// (compare on its mod revision); a lost race is an error to retry, never a lost update.
    async fn alter_topic_config(
        &self,
        topic: &str,
        change: &ConfigChange,
        validate: &ConfigCheck<'_>,
    ) -> Result<TopicState, CoordinatorError> {
        let topic_key = self.key(&format!("topics/{topic}"));
        let client = &self.client;
        let response = client
            .get(topic_key.clone(), None)
            .await
            .map_err(etcd_error)?;
        let Some(kv) = response.kvs().first() else {
            return Err(CoordinatorError::UnknownTopic(topic.to_string()));
        };
        let mut record: TopicRecord = decode(kv.key(), kv.value())?;
        record.config = change.apply(&record.config);
        validate(&record.config).map_err(CoordinatorError::Invalid)?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                topic_key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(
                topic_key,
                serde_json::to_vec(&record).expect("topic serializes"),
                None,
            )]);
        let response = client.txn(txn).await.map_err(etcd_error)?;
        if !response.succeeded() {
            return Err(CoordinatorError::Invalid(format!(
                "topic {topic} changed while its config was being altered; try again"
            )));
        }
        let stored = self.partitions_of(topic).await?;
        Ok(record.state(stored))
    }

    async fn delete_topic(&self, name: &str) -> Result<TopicState, CoordinatorError> {
        let state = self
            .topics()
            .await?
            .into_iter()
            .find(|topic| topic.name == name)
            .ok_or_else(|| CoordinatorError::UnknownTopic(name.to_string()))?;
        let topic_key = self.key(&format!("topics/{name}"));
        let txn = Txn::new()
            .when([Compare::create_revision(
                topic_key.clone(),
                CompareOp::Greater,
                0,
            )])
            .and_then([
                TxnOp::delete(topic_key, None),
                TxnOp::delete(
                    self.key(&format!("partitions/{name}/")),
                    Some(DeleteOptions::new().with_prefix()),
                ),
            ]);
        let client = &self.client;
        let response = client.txn(txn).await.map_err(etcd_error)?;
        if !response.succeeded() {
            return Err(CoordinatorError::UnknownTopic(name.to_string()));
        }
        Ok(state)
    }

    async fn reassign(
        &self,
        topic: &str,
        partition: u32,
        replicas: Vec<i32>,
    ) -> Result<PartitionState, CoordinatorError> {
        let key = self.key(&format!("partitions/{topic}/{partition}"));
        let brokers = self.brokers().await?.iter().map(|b| b.id).collect();
        let client = &self.client;
        let response = client.get(key.clone(), None).await.map_err(etcd_error)?;
        let Some(kv) = response.kvs().first() else {
            return Err(CoordinatorError::UnknownTopic(format!(
                "{topic}-{partition}"
            )));
        };
        let current: PartitionState = decode(kv.key(), kv.value())?;
        let next = placement::start_reassignment(&current, &replicas, &brokers)?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(
                key,
                serde_json::to_vec(&next).expect("partition serializes"),
                None,
            )]);
        if !client.txn(txn).await.map_err(etcd_error)?.succeeded() {
            return Err(CoordinatorError::Unavailable(
                "the partition changed meanwhile; try again".into(),
            ));
        }
        Ok(next)
    }

    async fn update_partition(
        &self,
        topic: &str,
        expected: &PartitionState,
        change: PartitionChange,
    ) -> Result<Option<PartitionState>, CoordinatorError> {
        let key = self.key(&format!("partitions/{topic}/{}", expected.partition));
        let broker_key = self.key(&format!("brokers/{}", self.node_id));
        let client = &self.client;
        let response = client.get(key.clone(), None).await.map_err(etcd_error)?;
        let Some(kv) = response.kvs().first() else {
            return Ok(None);
        };
        let current: PartitionState = decode(kv.key(), kv.value())?;
        if &current != expected {
            return Ok(None);
        }
        let next = change.apply(&current);
        // Unchanged since read, and this broker's lease (its registration) still alive: a
        // leader cut off from etcd past its lease can change nothing.
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
                Compare::create_revision(broker_key, CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(
                key,
                serde_json::to_vec(&next).expect("partition serializes"),
                None,
            )]);
        let stored = client.txn(txn).await.map_err(etcd_error)?.succeeded();
        Ok(stored.then_some(next))
    }
}
