//! What the broker's threads say to each other: shards, the control thread and the group
//! thread exchange these over channels and share nothing else. A leaf: it names the other
//! server modules' data, never their code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use strata_auth::acl::{
    AclBinding, AclFilter, Authorizer, AuthorizerConfig, Operation, ResourceType,
};
use strata_auth::scram::{ScramCredential, ScramMechanism};
use strata_coordinator::security::UserRecord;
use strata_coordinator::{BrokerInfo, PartitionChange, PartitionState, TopicState};
use strata_wire::protocol::{
    AbortedTransaction, AckDurability, AlterTopicConfigRequest, AlterTopicConfigResponse,
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicRequest, CreateTopicResponse,
    DeleteTopicRequest, DeleteTopicResponse, ElectLeadersRequest, ElectLeadersResponse, ErrorCode,
    FetchPartition, FetchPartitionResponse, ProducePartitionResponse, ReassignPartitionRequest,
    ReassignPartitionResponse, ReplicaFetchRequest, ReplicaFetchResponse, Request, Response,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use tokio::sync::oneshot;

use super::metrics;
use crate::group::classic::{ClassicError, JoinAnswer, JoinRequest};

/// What shards ask each other. Everything in it is `Send`; nothing is shared.
pub enum ShardMessage {
    Produce {
        topic: String,
        partition: u32,
        records: BytesMut,
        terms: AckTerms,
        /// A producer's records, conditional or not (never markers).
        source: crate::log::AppendSource,
        reply: oneshot::Sender<PartitionProduced>,
    },
    ReplicaFetch {
        request: ReplicaFetchRequest,
        reply: oneshot::Sender<ReplicaFetchResponse>,
    },
    Fetch {
        topic: String,
        partition: FetchPartition,
        deadline: Option<Instant>,
        delivery: Delivery,
        read_committed: bool,
        reply: oneshot::Sender<Fetched>,
    },
    /// A transaction coordinator's decided markers (and group offsets to settle), from this
    /// broker's group thread: written here and sent on to the brokers that lead the others.
    WriteTxnMarkers {
        request: WriteTxnMarkersRequest,
        reply: oneshot::Sender<WriteTxnMarkersResponse>,
    },
    /// The cluster changed: open and close partitions to match, then reply.
    ClusterChanged {
        view: ClusterView,
        reply: oneshot::Sender<()>,
    },
    /// Apply the view this shard holds again, for replicas it could not open (the shard's own
    /// timer sends it: applied in mailbox order, it can never undo a newer view).
    RetryUnopened,
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// What this shard owns and how often it forwarded, for tests and metrics.
    Stats {
        reply: oneshot::Sender<ShardStats>,
    },
    /// A copy of this shard's metrics, for a scrape.
    Metrics {
        reply: oneshot::Sender<metrics::Snapshot>,
    },
    /// The cluster as this shard sees it.
    View {
        reply: oneshot::Sender<ClusterView>,
    },
    /// Where a group stands on a partition (its end, and the time of the record at the group's
    /// committed offset), for the group thread's lag metrics.
    GroupPosition(PositionAsked),
    /// Work another shard hands over, run on this shard's thread with this shard (the admin
    /// APIs' per-partition and per-shard reads, `shard::admin`); it answers over a channel of
    /// its own. The shard comes as `Any` so that this leaf names no shard code.
    Run(Box<dyn FnOnce(std::rc::Rc<dyn std::any::Any>) + Send>),
}

/// A group's committed offset on a partition, and where to answer where it stands.
pub struct PositionAsked {
    pub topic: String,
    pub partition: u32,
    pub committed: u64,
    pub reply: oneshot::Sender<GroupPosition>,
}

/// A partition's end and the timestamp of the oldest record a group has not consumed (`Some(None)`
/// when it has consumed everything), as the partition's leader said; `None` where unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPosition {
    pub end: Option<u64>,
    pub oldest_unconsumed_ms: Option<Option<i64>>,
}

/// How a fetch wants its records: as ranges of segment files where they are large and cached
/// (the native listener sends those with `sendfile`, untouched), or always as bytes in memory
/// (the Kafka listener re-encodes every batch, so it needs the bytes: read through the log's IO
/// seam, never behind it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    FileRanges,
    Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStats {
    pub shard: usize,
    /// (topic, partition) this shard has open, sorted.
    pub partitions: Vec<(String, u32)>,
    /// Requests this shard forwarded to the owning shard.
    pub cross_shard_hops: u64,
}

/// The cluster as the control thread last read it: shared, immutable snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub topics: Arc<Vec<TopicState>>,
    pub brokers: Arc<Vec<BrokerInfo>>,
    pub controller: i32,
    /// Users and ACLs: what the listeners authenticate and authorize against.
    pub security: Arc<SecurityView>,
    /// Client quotas: what the listeners hold clients to.
    pub quotas: Arc<crate::quota::QuotaBook>,
    /// The broker settings set live that apply to this broker.
    pub dynamic: Arc<crate::server::broker_config::DynamicSettings>,
    /// Each group's configs that are set (group -> name -> value), every one checked by
    /// `server::group_config`; a group or a name absent has the defaults.
    pub group_configs: Arc<BTreeMap<String, BTreeMap<String, String>>>,
}

/// The users and ACLs as the control thread last read them, and the ACLs compiled for checks.
#[derive(Debug, Clone, Default)]
pub struct SecurityView {
    /// In name order.
    pub users: Vec<UserRecord>,
    pub acls: Vec<AclBinding>,
    /// `None` when the node does not authorize (`--authorizer` unset): every authenticated
    /// client may do everything.
    pub authorizer: Option<Authorizer>,
}

impl PartialEq for SecurityView {
    /// The authorizer is compiled from the ACLs and the node's settings: equal when they are.
    fn eq(&self, other: &Self) -> bool {
        self.users == other.users
            && self.acls == other.acls
            && self.authorizer.is_some() == other.authorizer.is_some()
    }
}

impl Eq for SecurityView {}

impl SecurityView {
    pub fn new(
        users: Vec<UserRecord>,
        acls: Vec<AclBinding>,
        authorizer: Option<&AuthorizerConfig>,
    ) -> SecurityView {
        let authorizer = authorizer.map(|config| Authorizer::new(config.clone(), &acls));
        SecurityView {
            users,
            acls,
            authorizer,
        }
    }

    /// Whether `principal` from `host` may do `operation` on `kind`/`name`.
    pub fn authorize(
        &self,
        principal: &strata_auth::Principal,
        host: Option<std::net::IpAddr>,
        operation: Operation,
        kind: ResourceType,
        name: &str,
    ) -> bool {
        self.authorizer
            .as_ref()
            .is_none_or(|authorizer| authorizer.authorize(principal, host, operation, kind, name))
    }

    /// `user`'s stored credential for `mechanism`.
    pub fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        let at = self
            .users
            .binary_search_by(|known| known.name.as_str().cmp(user))
            .ok()?;
        self.users[at].credential(mechanism)
    }

    /// `user`'s strongest stored credential (SASL/PLAIN checks a password against it).
    pub fn any_credential(&self, user: &str) -> Option<&ScramCredential> {
        self.credential(user, ScramMechanism::Sha512)
            .or_else(|| self.credential(user, ScramMechanism::Sha256))
    }
}

/// One partition's produce answer, and the records its batch was refused for (KIP-467).
/// When a partition's produce is answered: the request's acks level and timeout, and whether
/// its records are synced first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckTerms {
    pub acks: i8,
    pub timeout_ms: u32,
    pub answer: crate::log::writer::AnswerWhen,
}

pub struct PartitionProduced {
    pub response: ProducePartitionResponse,
    pub record_errors: Option<strata_wire::protocol::RecordErrors>,
    /// How far the records had got when answered (all zeros when refused).
    pub durability: AckDurability,
    /// The broker's time stamped into the records (LogAppendTime), -1 if none was.
    pub log_append_time_ms: i64,
}

impl From<ProducePartitionResponse> for PartitionProduced {
    fn from(response: ProducePartitionResponse) -> PartitionProduced {
        PartitionProduced {
            response,
            record_errors: None,
            durability: AckDurability::default(),
            log_append_time_ms: -1,
        }
    }
}

/// One partition's part of a fetch answer, and what its records count for the metrics: the
/// shard assembling the whole answer counts them if they are sent (see `answer_within`).
pub struct Fetched {
    pub(super) response: FetchPartitionResponse,
    pub(super) served: Option<ServedRecords>,
    /// A `read_committed` read: the last stable offset and the aborted transactions among
    /// the records answered.
    pub(super) stability: Option<(u64, Vec<AbortedTransaction>)>,
}

/// Records a partition's fetch read: how many, the newest one's timestamp, and when the read
/// began.
pub(super) struct ServedRecords {
    pub(super) records: u64,
    pub(super) newest_ms: Option<i64>,
    pub(super) started: Instant,
}

impl From<FetchPartitionResponse> for Fetched {
    fn from(response: FetchPartitionResponse) -> Fetched {
        Fetched {
            response,
            served: None,
            stability: None,
        }
    }
}

/// A change to what the coordinator keeps for the whole cluster besides topics (users, ACLs,
/// client quotas, broker settings, group configs), made by the control thread.
pub enum SettingsChange {
    /// Set (`Some`) or delete (`None`: every mechanism's, or the one given) credentials, one
    /// answer per entry.
    Credentials(Vec<CredentialChange>),
    CreateAcls(Vec<AclBinding>),
    /// The bindings each filter removed.
    DeleteAcls(Vec<AclFilter>),
    /// Client quotas travel the same path: set or removed, all or none.
    AlterQuotas(Vec<strata_coordinator::quotas::QuotaAlteration>),
    /// Broker settings set live, checked against the cluster view before they come here.
    AlterBrokerConfigs(strata_coordinator::broker_configs::BrokerConfigAlteration),
    /// A group's configs, checked against the cluster view before they come here.
    AlterGroupConfigs(strata_coordinator::group_configs::GroupConfigAlteration),
}

/// One user's credential set or deleted.
pub struct CredentialChange {
    pub user: String,
    pub mechanism: ScramMechanism,
    /// `None`: delete the user's credential of `mechanism`.
    pub credential: Option<ScramCredential>,
}

/// What a [`SettingsChange`] did.
pub enum SettingsChanged {
    /// Per credential change: `Ok(false)` when a deletion found nothing.
    Credentials(Vec<Result<bool, String>>),
    CreateAcls(Result<(), String>),
    DeleteAcls(Result<Vec<Vec<AclBinding>>, String>),
    AlterQuotas(Result<(), String>),
    AlterBrokerConfigs(Result<(), String>),
    AlterGroupConfigs(Result<(), String>),
}

pub enum ControlMessage {
    /// Users, ACLs, client quotas, broker settings and group configs.
    Settings {
        change: SettingsChange,
        reply: oneshot::Sender<SettingsChanged>,
    },
    CreateTopic {
        request: CreateTopicRequest,
        reply: oneshot::Sender<CreateTopicResponse>,
    },
    DeleteTopic {
        request: DeleteTopicRequest,
        reply: oneshot::Sender<DeleteTopicResponse>,
    },
    Reassign {
        request: ReassignPartitionRequest,
        reply: oneshot::Sender<ReassignPartitionResponse>,
    },
    AddPartitions {
        request: CreatePartitionsRequest,
        reply: oneshot::Sender<CreatePartitionsResponse>,
    },
    AlterTopicConfig {
        request: AlterTopicConfigRequest,
        reply: oneshot::Sender<AlterTopicConfigResponse>,
    },
    /// A partition leader's own change (ISR), fenced on the state it read (DESIGN §6).
    UpdatePartition {
        topic: String,
        expected: PartitionState,
        change: PartitionChange,
        reply: oneshot::Sender<Option<PartitionState>>,
    },
    /// Leave the cluster (revoke the broker lease) and answer once the partitions this node
    /// led have moved to other replicas, as far as it can tell within `LEAVE_PATIENCE`: the
    /// first step of a clean shutdown, while the shards still serve (Kafka's controlled
    /// shutdown).
    Leave { reply: oneshot::Sender<()> },
    /// Move leaderships back to preferred replicas now (`strata topic elect-leaders`).
    ElectLeaders {
        request: ElectLeadersRequest,
        reply: oneshot::Sender<ElectLeadersResponse>,
    },
    /// Resign from the cluster (revoke the broker lease, unless it left already) and stop.
    Shutdown { reply: oneshot::Sender<()> },
}

pub enum GroupMessage {
    /// A group request a shard hands to the group thread.
    Request {
        request: Request,
        reply: oneshot::Sender<Response>,
    },
    /// The group metrics (Prometheus text) for the admin endpoint.
    Metrics { reply: oneshot::Sender<String> },
    /// A request of Kafka's classic group protocol, from the Kafka listener. Joins and
    /// follower syncs are answered when the rebalance gets there.
    Kafka {
        request: KafkaGroupRequest,
        reply: oneshot::Sender<KafkaGroupAnswer>,
    },
    /// A decided transaction's offsets for `group` (which this broker coordinates): made the
    /// group's committed offsets (`commit`) or dropped.
    SettleTxnOffsets {
        group: String,
        producer_id: i64,
        commit: bool,
        reply: oneshot::Sender<ErrorCode>,
    },
    /// Share groups: membership (on the coordinator), and the store of share-partition state
    /// (for partition leaders).
    Share(ShareGroupRequest),
    /// Share groups as operators see them (listed, their offsets altered, deleted).
    ShareAdmin(ShareAdminRequest),
    /// A partition leader's remote manifest (tiered storage), in the group store.
    Manifest(ManifestRequest),
    /// What became of a transaction's marker writes (the group thread's own tasks report).
    MarkersWritten {
        transactional_id: String,
        producer_id: i64,
        epoch: i16,
        written: bool,
    },
}

/// What the group thread does for share groups (KIP-932).
pub enum ShareGroupRequest {
    /// ShareGroupHeartbeat, on the group's coordinator.
    Heartbeat {
        group: String,
        member: String,
        /// 0 to join, -1 to leave, else the member's epoch.
        member_epoch: i32,
        /// The subscription, when the member sent it.
        topics: Option<Vec<String>>,
        rack: Option<String>,
        client_id: String,
        client_host: String,
        reply: oneshot::Sender<Result<ShareHeartbeat, ShareRefusal>>,
    },
    /// ShareGroupDescribe and DescribeGroups of one share group; `None`: no share group of
    /// that name runs here.
    Describe {
        group: String,
        reply: oneshot::Sender<Result<Option<crate::share::group::ShareGroup>, ErrorCode>>,
    },
    /// The stored state of a share-partition (`<group>/<topic>/<partition>`) and its revision.
    LoadState {
        id: String,
        reply: oneshot::Sender<Result<(Option<serde_json::Value>, i64), ErrorCode>>,
    },
    /// Stores a share-partition's state if still at `expected`: `Ok(None)` when fenced.
    StoreState {
        id: String,
        expected: i64,
        record: serde_json::Value,
        durability: strata_coordinator::groups::Durability,
        reply: oneshot::Sender<Result<Option<i64>, ErrorCode>>,
    },
}

/// A remote manifest's record (`<topic>/<partition>`) in the group store: loaded, stored fenced
/// on the revision read, or deleted with its topic.
pub enum ManifestRequest {
    Load {
        id: String,
        reply: oneshot::Sender<Result<(Option<serde_json::Value>, i64), ErrorCode>>,
    },
    /// `Ok(None)` when fenced (another leader stored it since).
    Store {
        id: String,
        expected: i64,
        record: serde_json::Value,
        reply: oneshot::Sender<Result<Option<i64>, ErrorCode>>,
    },
    Delete {
        id: String,
        reply: oneshot::Sender<Result<(), ErrorCode>>,
    },
}

/// What the Kafka listener's administration of share groups asks their coordinator (the
/// group thread of the broker coordinating the group).
pub enum ShareAdminRequest {
    /// ListGroups: the share groups this broker coordinates, and the groups it runs with
    /// Kafka's classic protocol (their type).
    List {
        reply: oneshot::Sender<Result<GroupTypes, ErrorCode>>,
    },
    /// A share group as its coordinator knows it. NOT_COORDINATOR elsewhere.
    Inspect {
        group: String,
        reply: oneshot::Sender<Result<ShareGroupStored, ErrorCode>>,
    },
    /// An operator's change to one share-partition's stored state (AlterShareGroupOffsets,
    /// DeleteShareGroupOffsets, DeleteGroups), made only while the group has no members
    /// (NON_EMPTY_GROUP otherwise, decided in the same turn as heartbeats): `change` maps the
    /// stored record (`None`: none stored) to the one to store in its place, fenced on the
    /// revision read (`None`: delete it). The record's format is its leader's: the change
    /// comes from the caller, who knows it.
    Change {
        group: String,
        topic: String,
        partition: u32,
        change: ShareStateChange,
        reply: oneshot::Sender<Result<(), ErrorCode>>,
    },
}

/// A change to a stored share-partition record: the record in its place, or `None` to delete
/// it (made again on what a leader stored meanwhile, when its write fenced the first).
pub type ShareStateChange =
    Box<dyn Fn(Option<serde_json::Value>) -> Option<serde_json::Value> + Send>;

/// The group types a coordinator knows beyond the store's: its share groups (with their
/// member counts) and the groups it runs with Kafka's classic protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupTypes {
    /// Share groups running here or with state stored, by name: their member counts.
    pub share: BTreeMap<String, usize>,
    pub classic: std::collections::BTreeSet<String>,
}

/// A share group as its coordinator knows it: members, and the share-partitions whose state
/// is stored. A share group exists while it has either.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareGroupStored {
    pub members: usize,
    /// (topic, partition), sorted.
    pub partitions: Vec<(String, u32)>,
}

impl ShareGroupStored {
    pub fn exists(&self) -> bool {
        self.members > 0 || !self.partitions.is_empty()
    }
}

/// A share group heartbeat's answer.
#[derive(Debug, Clone)]
pub struct ShareHeartbeat {
    pub answer: crate::share::group::ShareHeartbeatAnswer,
    pub heartbeat_interval_ms: i32,
}

/// Why a share group heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareRefusal {
    NotCoordinator,
    UnknownMember,
    FencedMemberEpoch,
    /// The group id is a consumer group's.
    InconsistentProtocol,
    Invalid(String),
}

/// Kafka's JoinGroup, SyncGroup, Heartbeat and LeaveGroup, as the group thread takes them.
pub enum KafkaGroupRequest {
    Join {
        group: String,
        request: JoinRequest,
    },
    Sync {
        group: String,
        member_id: String,
        instance_id: Option<String>,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    },
    Heartbeat {
        group: String,
        member_id: String,
        instance_id: Option<String>,
        generation: i32,
    },
    /// Members by id, or (static members) by instance id with the member id empty.
    Leave {
        group: String,
        members: Vec<(String, Option<String>)>,
    },
    /// KIP-848's ConsumerGroupHeartbeat: the group is one of Strata's own (server-side,
    /// cooperative), the member speaking Kafka's protocol.
    ConsumerHeartbeat(ConsumerHeartbeat),
    /// KIP-848's ConsumerGroupDescribe of one group.
    ConsumerDescribe {
        group: String,
    },
}

/// A KIP-848 member's heartbeat, its topics named (ids resolved by the listener).
#[derive(Debug, Clone)]
pub struct ConsumerHeartbeat {
    pub group: String,
    /// Chosen by the member (KIP-1082); empty from older clients: the group names it.
    pub member_id: String,
    /// 0 to join, -1 to leave, -2 for a static member leaving for now; else its epoch.
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub rebalance_timeout_ms: i32,
    /// The subscription, when the member sent it (it sends it when it changes).
    pub topics: Option<Vec<String>>,
    pub regex: Option<String>,
    /// `uniform` or `range`, when the member names one.
    pub assignor: Option<String>,
    /// What the member owns, when it sent it.
    pub owned: Option<Vec<crate::group::TopicPartition>>,
}

/// What a KIP-848 heartbeat answers.
#[derive(Debug, Clone)]
pub struct ConsumerAssignment {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// What the member may own now; `None` when it left.
    pub partitions: Option<Vec<crate::group::TopicPartition>>,
}

/// Why a KIP-848 heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerRefusal {
    /// This broker cannot run the group, or the group's rules refuse (an unknown member, a
    /// fenced instance id, a group on the classic protocol).
    Group(ErrorCode),
    /// The epoch is not the member's: it drops its partitions and joins again at epoch 0.
    FencedEpoch,
    UnsupportedAssignor(String),
    InvalidRegex(String),
}

/// A KIP-848 group as ConsumerGroupDescribe shows it, with each member's regular expression.
#[derive(Debug, Clone)]
pub struct ConsumerGroupDescription {
    pub description: crate::group::GroupDescription,
    pub regexes: std::collections::HashMap<String, String>,
}

/// Why a Kafka group request failed: the group's protocol said no, or this broker cannot run
/// the group (not its coordinator, the store unreachable, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaGroupError {
    Classic(ClassicError),
    Coordinator(ErrorCode),
}

#[derive(Debug)]
pub enum KafkaGroupAnswer {
    /// The protocol's refusals are in the answer (MEMBER_ID_REQUIRED carries the id to use).
    Join(Result<JoinAnswer, ErrorCode>),
    Sync(Result<Bytes, KafkaGroupError>),
    Heartbeat(Result<(), KafkaGroupError>),
    Leave(Vec<(String, Result<(), KafkaGroupError>)>),
    ConsumerHeartbeat(Result<ConsumerAssignment, ConsumerRefusal>),
    /// `Ok(None)`: no KIP-848 group of that name runs here (unknown, or a classic group).
    ConsumerDescribed(Result<Option<ConsumerGroupDescription>, ErrorCode>),
}
