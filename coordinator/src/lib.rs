//! `strata-coordinator`: the control plane behind one trait.
//!
//! [`Coordinator`] is what a node asks about the cluster: which brokers exist, which topics, who
//! leads each partition. [`LocalCoordinator`] implements it for a single node with its state in
//! the data directory; [`EtcdCoordinator`] keeps it in etcd (leases, compare-first transactions),
//! behind the same trait, so node code does not know which it has: the control thread's
//! membership (lease, controller election, fenced controller writes, change watches) is part
//! of the trait, and the local store answers it as a cluster of one would.
//!
//! Placement and leader choice are pure functions ([`placement`]) over cluster state.

#![allow(async_fn_in_trait)] // The control plane runs on one thread; futures need not be Send.

pub mod broker_configs;
pub mod conformance;
mod etcd;
mod failover;
pub mod group_configs;
pub mod groups;
mod journal;
mod local;
pub mod placement;
pub mod quotas;
pub mod security;
pub mod testing;

pub use etcd::{DEFAULT_LEASE_TTL, EtcdCoordinator};
pub use groups::{Durability, EtcdGroupStore, GroupStore, LocalGroupStore};
pub use local::LocalCoordinator;

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

/// A broker as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub id: i32,
    pub host: String,
    /// Shared client port.
    pub port: u16,
    /// Shard `i` listens on `shard_ports[i]`.
    pub shard_ports: Vec<u16>,
    /// Shard `i` takes replication (QUIC, UDP) on `replication_ports[i]`.
    #[serde(default)]
    pub replication_ports: Vec<u16>,
    /// Where followers reach those ports when not at `host` (`--replication` bound to another
    /// address, e.g. a separate replication network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_host: Option<String>,
    /// Failure domain (`--rack`): replicas of a partition go to different racks first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// The first Kafka-protocol listener's port (`--kafka-listen`), at `host`; `None`: no
    /// listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_port: Option<u16>,
    /// Every Kafka-protocol listener, by name: a client is sent to the listener of the name it
    /// connected through, on every broker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka_listeners: Vec<AdvertisedListener>,
    /// The native listeners after the first (whose ports are `port` and `shard_ports`), by
    /// name: a native client is sent to the ports of the listener it connected through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native_listeners: Vec<AdvertisedNativeListener>,
}

/// A further native listener a broker advertises: its shared port and its shards' ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvertisedNativeListener {
    /// The security protocol's name: `PLAINTEXT`, `SASL_SSL`, ...
    pub name: String,
    pub port: u16,
    pub shard_ports: Vec<u16>,
}

/// A named listener a broker advertises (Kafka's `advertised.listeners`), at the broker's host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvertisedListener {
    /// The security protocol's name: `PLAINTEXT`, `SASL_SSL`, ...
    pub name: String,
    pub port: u16,
}

/// One partition's replication state (DESIGN §6: `partitions/<topic>/<p>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    pub partition: u32,
    pub replicas: Vec<i32>,
    pub leader: i32,
    pub leader_epoch: u32,
    pub isr: Vec<i32>,
    pub partition_epoch: u64,
    /// A reassignment in progress: the replica set to end with. Until every one of them is in
    /// the ISR, `replicas` holds the old and the new together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_replicas: Option<Vec<i32>>,
    /// While a reassignment runs: the replicas before it (before the first of several in a
    /// row), which a cancel goes back to and from which Kafka's ListPartitionReassignments
    /// tells the replicas being added from those being removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reassigning_from: Option<Vec<i32>>,
}

impl PartitionState {
    /// A new partition's state: the first replica leads at epoch 0, every replica in sync.
    pub fn initial(partition: u32, replicas: Vec<i32>) -> PartitionState {
        assert!(!replicas.is_empty(), "a partition has at least one replica");
        PartitionState {
            partition,
            leader: replicas[0],
            leader_epoch: 0,
            isr: replicas.clone(),
            replicas,
            partition_epoch: 0,
            target_replicas: None,
            reassigning_from: None,
        }
    }
}

/// A topic: its partitions and its configuration overrides (`flush`, `retention.ms`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    pub name: String,
    pub replication_factor: u16,
    pub config: BTreeMap<String, String>,
    pub partitions: Vec<PartitionState>,
    /// Kafka's topic id (KIP-516), chosen at random when the topic is created; see
    /// [`TopicState::topic_id`] for topics stored before topics had one.
    #[serde(default, skip_serializing_if = "TopicId::is_unset")]
    pub id: TopicId,
}

impl TopicState {
    /// The topic's id: the stored one, or for a topic created before topics had ids, one
    /// derived from its name (the same on every broker; a topic of that name deleted and
    /// created again gets a random one).
    pub fn topic_id(&self) -> TopicId {
        if !self.id.is_unset() {
            return self.id;
        }
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            format!("strata topic {}", self.name).as_bytes(),
        );
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest.as_ref()[..16]);
        TopicId(id)
    }
}

/// A topic id: 16 bytes, all zero while unset (Kafka's `Uuid.ZERO_UUID` means "none"), stored
/// as hex.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    /// A new random id (never zero, never Kafka's reserved metadata topic id 1).
    pub fn random() -> TopicId {
        loop {
            let mut bytes = [0u8; 16];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
                .expect("the system's random source works");
            if u128::from_be_bytes(bytes) > 1 {
                return TopicId(bytes);
            }
        }
    }

    pub fn is_unset(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl Serialize for TopicId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|byte| format!("{byte:02x}")).collect();
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for TopicId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        let invalid =
            || serde::de::Error::custom(format!("a topic id is 32 hex digits, not {hex:?}"));
        if hex.len() != 32 {
            return Err(invalid());
        }
        let mut id = [0u8; 16];
        for (at, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * at..2 * at + 2], 16).map_err(|_| invalid())?;
        }
        Ok(TopicId(id))
    }
}

/// What a client asks for when it creates a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub config: BTreeMap<String, String>,
    /// Each partition's replicas, chosen by the client (first the preferred leader); empty:
    /// [`placement::place`] chooses. When set, `partitions` and `replication_factor` must agree
    /// with it.
    pub assignment: Vec<Vec<i32>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("invalid topic name {name:?}: {why}")]
    InvalidTopicName { name: String, why: &'static str },
    #[error("invalid topic: {0}")]
    Invalid(String),
    /// A user, credential or ACL the store refuses as given.
    #[error("{0}")]
    InvalidArgument(String),
    /// A replica assignment the cluster cannot take: unknown brokers, a broker twice in one
    /// partition, partitions of different sizes.
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    /// Another live process holds this broker id.
    #[error("broker id {0} is already registered by a live process")]
    BrokerIdTaken(i32),
    /// The coordinator (etcd) could not be reached or refused the call.
    #[error("coordinator unavailable: {0}")]
    Unavailable(String),
    /// A cancel of a reassignment when none runs.
    #[error("no reassignment in progress: {0}")]
    NoReassignmentInProgress(String),
    #[error("cluster state {path}: {source}")]
    Storage {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cluster state {path} is unreadable: {reason}")]
    Corrupt {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// Proof of being the controller: this node's key in the election. Fenced writes require it to
/// still exist, so a controller whose lease expired (paused, partitioned) can write nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerKey(pub(crate) Vec<u8>);

/// A stored partition state as a controller pass reads it: the topic, the state, and the store's
/// revision of that state (a fenced write of its successor compares against it).
pub type StoredPartition = (String, PartitionState, i64);

/// The control plane as a node sees it.
pub trait Coordinator {
    fn cluster_name(&self) -> &str;
    /// The broker this coordinator registers and campaigns for.
    fn node_id(&self) -> i32;
    /// The broker currently acting as controller.
    fn controller(&self) -> i32;
    async fn brokers(&self) -> Result<Vec<BrokerInfo>, CoordinatorError>;
    /// Announces this broker (addresses may change across restarts).
    async fn register_broker(&self, broker: BrokerInfo) -> Result<(), CoordinatorError>;
    async fn topics(&self) -> Result<Vec<TopicState>, CoordinatorError>;
    /// Creates a topic, placing its replicas; durable when this returns.
    async fn create_topic(&self, spec: TopicSpec) -> Result<TopicState, CoordinatorError>;
    async fn delete_topic(&self, name: &str) -> Result<TopicState, CoordinatorError>;
    /// A partition leader's own change (DESIGN §6: "leaders change their own ISR through the
    /// same fenced transaction"): applied only if the partition is still exactly `expected`
    /// (same leader, leader epoch and partition epoch) and this broker is still registered.
    /// `change` gets the current state and returns the new one; `partition_epoch` is bumped
    /// here. Returns the stored state, or `None` when the fence refused it.
    async fn update_partition(
        &self,
        topic: &str,
        expected: &PartitionState,
        change: PartitionChange,
    ) -> Result<Option<PartitionState>, CoordinatorError>;
    /// Grows `topic` to `partitions` partitions, placing the new ones like a new topic's
    /// (continuing the leader rotation), or on `assignment`'s brokers (one entry per new
    /// partition) when it is not empty. Partitions only grow: keys hash onto the new count.
    async fn add_partitions(
        &self,
        topic: &str,
        partitions: u32,
        assignment: &[Vec<i32>],
    ) -> Result<TopicState, CoordinatorError>;
    /// Applies `change` to `topic`'s config overrides if `validate` accepts the result, atomically
    /// against any other change of the topic. Returns the topic as stored.
    async fn alter_topic_config(
        &self,
        topic: &str,
        change: &ConfigChange,
        validate: &ConfigCheck<'_>,
    ) -> Result<TopicState, CoordinatorError>;
    /// Starts moving `partition` of `topic` to `replicas` (see [`placement::start_reassignment`]).
    async fn reassign(
        &self,
        topic: &str,
        partition: u32,
        replicas: Vec<i32>,
    ) -> Result<PartitionState, CoordinatorError>;

    // Membership: what the control thread needs to be one broker among several.

    /// Whether this node's lease may still be valid. Once it may not, another broker can have
    /// taken over what this node led: stop acting on it (fail safe, not split brain).
    fn lease_valid(&self) -> bool;
    /// After the lease lapsed: drops what is left of it and takes a new one, so the node can
    /// register again. Whatever the old lease held (registration, candidacy) is gone for good.
    async fn renew_lease(&self) -> Result<(), CoordinatorError>;
    /// Leaves the cluster but keeps reading it: the registration and the controller key (if
    /// held) go now, so the controller moves this broker's leaderships at once.
    async fn leave(&self) -> Result<(), CoordinatorError>;
    /// Every topic, read at one revision, and that revision: a watch from it sees every change
    /// the read did not.
    async fn topics_at(&self) -> Result<(Vec<TopicState>, i64), CoordinatorError>;
    /// Sends `()` on `changed` after each batch of changes to the cluster's state made after
    /// revision `read_at`; runs until the watch fails (the caller then reads and watches anew).
    /// A store no other broker writes never reports a change: this node's control thread
    /// makes them all and announces them itself.
    fn watch_changes(
        &self,
        read_at: i64,
        changed: tokio::sync::mpsc::UnboundedSender<()>,
    ) -> impl Future<Output = Result<(), CoordinatorError>> + Send + 'static;
    /// Campaigns to become the controller; resolves once elected (possibly never). Runs in a
    /// task of its own.
    fn campaign(
        &self,
    ) -> impl Future<Output = Result<ControllerKey, CoordinatorError>> + Send + 'static;
    /// Reads who the controller is now (-1: none) and remembers it for `controller()`.
    async fn refresh_controller(&self) -> Result<i32, CoordinatorError>;
    /// Every topic, and every stored partition with its revision, all read at one revision:
    /// what a controller pass acts on.
    async fn topics_with_revisions(
        &self,
    ) -> Result<(Vec<TopicState>, Vec<StoredPartition>), CoordinatorError>;
    /// Writes each partition's new state `(topic, state, read revision)` only if it is unchanged
    /// since that revision and `proof` is still the controller's key: a stale controller or a
    /// lost race writes nothing. Returns whether each change was stored.
    async fn write_partitions_fenced(
        &self,
        changes: &[StoredPartition],
        proof: &ControllerKey,
    ) -> Result<Vec<bool>, CoordinatorError>;
    // Users and ACLs: read by every broker's authenticator and authorizer (see [`security`]).

    /// Every user with stored SCRAM credentials, in name order.
    async fn users(&self) -> Result<Vec<security::UserRecord>, CoordinatorError>;
    /// Sets `user`'s credential for its mechanism (creating the user, replacing an older
    /// credential of that mechanism).
    async fn upsert_scram_credential(
        &self,
        user: &str,
        credential: strata_auth::scram::ScramCredential,
    ) -> Result<(), CoordinatorError>;
    /// Removes `user`'s credential of `mechanism` (every one for `None`; a user left with none
    /// is gone). Returns whether there was one to remove.
    async fn delete_scram_credential(
        &self,
        user: &str,
        mechanism: Option<strata_auth::scram::ScramMechanism>,
    ) -> Result<bool, CoordinatorError>;
    /// Every ACL binding, each once, in a stable order.
    async fn acls(&self) -> Result<Vec<strata_auth::acl::AclBinding>, CoordinatorError>;
    /// Stores `bindings` (each validated; one already stored stays once).
    async fn create_acls(
        &self,
        bindings: &[strata_auth::acl::AclBinding],
    ) -> Result<(), CoordinatorError>;
    /// Removes every binding any filter matches; returns each filter's matches.
    async fn delete_acls(
        &self,
        filters: &[strata_auth::acl::AclFilter],
    ) -> Result<Vec<Vec<strata_auth::acl::AclBinding>>, CoordinatorError>;

    // Client quotas: read by every broker, which enforces them on its own traffic (see [`quotas`]).

    /// Every entity's quotas, in entity order.
    async fn client_quotas(&self) -> Result<Vec<quotas::QuotaRecord>, CoordinatorError>;
    /// Applies `alterations` (each validated first; nothing is applied when one is invalid).
    async fn alter_client_quotas(
        &self,
        alterations: &[quotas::QuotaAlteration],
    ) -> Result<(), CoordinatorError>;

    // Dynamic broker settings: read by every broker, applied to itself (see [`broker_configs`]).

    /// Every scope's dynamic settings, in scope order.
    async fn broker_configs(
        &self,
    ) -> Result<Vec<broker_configs::BrokerConfigRecord>, CoordinatorError>;
    /// Applies `alteration` to its scope's settings, checked first.
    async fn alter_broker_configs(
        &self,
        alteration: &broker_configs::BrokerConfigAlteration,
    ) -> Result<(), CoordinatorError>;

    // Group configs: read by every broker, applied by the one coordinating the group (see
    // [`group_configs`]).

    /// Every group's configs, in group order.
    async fn group_configs(
        &self,
    ) -> Result<Vec<group_configs::GroupConfigRecord>, CoordinatorError>;
    /// Applies `alteration` to its group's configs, checked first; a group left with none is
    /// removed.
    async fn alter_group_configs(
        &self,
        alteration: &group_configs::GroupConfigAlteration,
    ) -> Result<(), CoordinatorError>;

    /// Stores the partitions `topic` was created with that the store does not hold yet (a
    /// creator that stopped half way); returns how many.
    async fn create_missing_partitions(&self, topic: &str) -> Result<usize, CoordinatorError>;
    /// After a restart or a lapsed lease: every partition still naming this node leader takes
    /// the next leader epoch, so nothing it appends shares an epoch with records its earlier life
    /// may have lost while followers kept them. Returns how many partitions moved on.
    async fn take_next_epochs(&self) -> usize {
        let Ok(topics) = self.topics().await else {
            return 0;
        };
        let mut taken = 0;
        for topic in topics {
            for partition in topic
                .partitions
                .iter()
                .filter(|p| p.leader == self.node_id())
            {
                match self
                    .update_partition(&topic.name, partition, PartitionChange::NextLeaderEpoch)
                    .await
                {
                    Ok(Some(next)) => {
                        taken += 1;
                        tracing::info!(
                            topic = %topic.name,
                            partition = partition.partition,
                            epoch = next.leader_epoch,
                            "restarted as leader: took the next leader epoch"
                        );
                    }
                    Ok(None) => {}
                    Err(error) => tracing::warn!(
                        topic = %topic.name,
                        partition = partition.partition,
                        "taking the next leader epoch: {error}"
                    ),
                }
            }
        }
        taken
    }
}

/// Judges a topic's config overrides as they would be after a change: `Err` says why not.
pub type ConfigCheck<'a> = dyn Fn(&BTreeMap<String, String>) -> Result<(), String> + 'a;

/// A change to a topic's config overrides: keys set (added or replaced) and keys deleted (back
/// to their defaults), as Kafka's incremental config alter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigChange {
    pub set: BTreeMap<String, String>,
    pub delete: Vec<String>,
}

impl ConfigChange {
    /// The overrides after the change. A key both set and deleted is deleted.
    pub fn apply(&self, current: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut next = current.clone();
        next.extend(self.set.iter().map(|(k, v)| (k.clone(), v.clone())));
        for key in &self.delete {
            next.remove(key);
        }
        next
    }
}

/// What a leader may change about its own partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionChange {
    /// The leader's ISR shrank or grew.
    Isr(Vec<i32>),
    /// A restarted broker that is still named leader takes the next leader epoch, so that
    /// nothing it appends shares an epoch with records its earlier life may have lost.
    NextLeaderEpoch,
    /// Leadership goes to the preferred replica (the first of `replicas`, in the ISR) at the
    /// next leader epoch; see `placement::prefer_leader`.
    PreferredLeader,
    /// An unclean election on request (`placement::elect`): the replica leads at the next
    /// leader epoch, and its log defines the ISR from now on when it was not in sync.
    UncleanLeader(i32),
}

impl PartitionChange {
    /// The state after the change (partition epoch + 1).
    pub fn apply(&self, current: &PartitionState) -> PartitionState {
        let mut next = current.clone();
        match self {
            PartitionChange::Isr(isr) => {
                assert!(isr.contains(&current.leader), "an ISR without its leader");
                next.isr = isr.clone();
            }
            PartitionChange::NextLeaderEpoch => next.leader_epoch += 1,
            PartitionChange::PreferredLeader => {
                let preferred = current.replicas[0];
                assert!(
                    current.isr.contains(&preferred),
                    "the preferred replica {preferred} is not in the ISR {:?}",
                    current.isr
                );
                next.leader = preferred;
                next.leader_epoch += 1;
            }
            PartitionChange::UncleanLeader(leader) => {
                assert!(current.replicas.contains(leader), "{leader} is no replica");
                next.leader = *leader;
                next.leader_epoch += 1;
                if !current.isr.contains(leader) {
                    next.isr = vec![*leader];
                }
            }
        }
        next.partition_epoch += 1;
        next
    }
}

/// Kafka's rule: 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), CoordinatorError> {
    let invalid = |why| {
        Err(CoordinatorError::InvalidTopicName {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() || name.len() > 249 {
        return invalid("must be 1 to 249 characters");
    }
    if name == "." || name == ".." {
        return invalid("must not be . or ..");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return invalid("may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        for good in ["orders", "a.b_c-d", "X1", &"t".repeat(249)] {
            assert!(validate_topic_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "ü", &"t".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }
}
