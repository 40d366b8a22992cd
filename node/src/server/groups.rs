//! The group thread: consumer-group coordination and producer ids, on their own thread.
//!
//! Group membership is decided by the pure state machine in [`crate::group`]; this adapter feeds
//! it requests, time and topic metadata, and keeps what must outlive it in a
//! [`GroupStore`] (files on a single node, etcd in a cluster).
//!
//! - **Which broker coordinates a group**: [`coordinator_of`] — the group id's hash over the live
//!   brokers' ids, the same answer on every broker that has the same view. A broker that is not
//!   the coordinator answers NOT_COORDINATOR and forgets the group.
//! - **Claiming**: the first request for a group loads it from the store and writes its record at
//!   the next generation, fenced on the revision it read, so two brokers that both believe they
//!   coordinate (views differ for a moment) cannot both run the group: the loser's fenced write
//!   fails and it answers NOT_COORDINATOR. Every later generation is stored the same way.
//! - **Commits** are one store transaction per request, fenced on the group record's revision:
//!   the member's generation is checked against the state machine, and the transaction only
//!   succeeds while that state is the stored one.
//!
//! It runs on its own thread (a current-thread runtime, like the control thread) so group
//! traffic and store round trips never delay produce/fetch on the shards or the control loop.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use std::time::{Duration, Instant};

use strata_coordinator::groups::{
    GroupOffsets, GroupRecord, PRODUCER_ID_BLOCK, Revision, StoredOffset, offsets_expired,
};
use strata_coordinator::{CoordinatorError, EtcdGroupStore, GroupStore, LocalGroupStore};
use strata_wire::protocol::{
    CommittedOffset, DeleteGroupRequest, DeleteGroupResponse, DescribeGroupRequest,
    DescribeGroupResponse, ErrorCode, FindCoordinatorRequest, FindCoordinatorResponse, GroupMember,
    HeartbeatRequest, HeartbeatResponse, InitProducerIdRequest, InitProducerIdResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsResponse,
    ListedGroup, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, Request, Response, TopicPartitions,
};
use tokio::sync::{mpsc, oneshot, watch};

use super::NodeConfig;
use super::messages::{
    ClusterView, GroupMessage, KafkaGroupAnswer, KafkaGroupError, KafkaGroupRequest,
};
use crate::group::classic::{ClassicError, ClassicGroup, ClassicSnapshot, Joined, Reply, Synced};
use crate::group::{
    AssignorKind, Group, GroupError, GroupSnapshot, GroupState, JoinParams, PartitionCounts,
    TopicPartition,
};
use crate::log::writer::system_clock_ms;

/// How often the lag of coordinated groups is measured (high watermarks asked of the leaders).
const LAG_REFRESH: Duration = Duration::from_secs(5);

/// Committed offset and lag of one partition of one group, as last measured.
#[derive(Debug, Clone)]
struct Lag {
    group: String,
    topic: String,
    partition: u32,
    committed: u64,
    /// `None` when the partition's leader could not be asked.
    lag: Option<u64>,
}

/// Whether the group thread answers this request (the shard forwards it here).
pub fn is_group_request(request: &Request) -> bool {
    matches!(
        request,
        Request::InitProducerId(_)
            | Request::FindCoordinator(_)
            | Request::JoinGroup(_)
            | Request::Heartbeat(_)
            | Request::LeaveGroup(_)
            | Request::OffsetCommit(_)
            | Request::OffsetFetch(_)
            | Request::ListGroups(_)
            | Request::DescribeGroup(_)
            | Request::DeleteGroup(_)
    )
}

/// The broker that coordinates `group` among the live `brokers` (ids): the same on every broker
/// with the same view. `None` when there is no broker.
pub fn coordinator_of(group: &str, brokers: &[i32]) -> Option<i32> {
    let mut ids = brokers.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return None;
    }
    Some(ids[strata_wire::crc32c(group.as_bytes()) as usize % ids.len()])
}

/// How often members heartbeat: a sixth of the session timeout, at most 500 ms, so a plan
/// change reaches every member within half a second (a crashed member's partitions move
/// within its session timeout + about 0.5 s). While a group reconciles, 100 ms: each handover
/// step (revoke, report, assign) then costs a heartbeat round trip, not an interval.
fn heartbeat_interval_ms(session_timeout_ms: u32, reconciling: bool) -> u32 {
    if reconciling {
        return 100;
    }
    (session_timeout_ms / 6).clamp(100, 500)
}

/// Session timeouts a member may ask for (Kafka's group.min/max.session.timeout.ms).
const SESSION_TIMEOUT_MS_MIN: u32 = 1000;
const SESSION_TIMEOUT_MS_MAX: u32 = 300_000;

pub fn start(
    config: Arc<NodeConfig>,
    views: watch::Receiver<ClusterView>,
    mailbox: mpsc::UnboundedReceiver<GroupMessage>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("strata-groups".into())
        .spawn(move || {
            let _span = tracing::info_span!("groups", node = config.node_id).entered();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime builds");
            runtime.block_on(async move {
                match &config.etcd {
                    None => match LocalGroupStore::open(config.data_dir.join("__cluster")) {
                        Ok(store) => serve(config.clone(), store, views, mailbox).await,
                        Err(error) => tracing::error!("no group coordination: {error}"),
                    },
                    Some(endpoints) => {
                        // etcd may still be starting; the control thread waits for it too.
                        let store = loop {
                            match EtcdGroupStore::connect(endpoints, &config.cluster).await {
                                Ok(store) => break store,
                                Err(error) => {
                                    tracing::warn!("group store not reachable yet: {error}");
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                }
                            }
                        };
                        serve(config.clone(), store, views, mailbox).await;
                    }
                }
            });
        })
}

/// The state machine running a group: Strata's own protocol, or Kafka's classic one (Kafka
/// clients on the Kafka listener). A group runs one at a time; an empty group takes whichever
/// its next member speaks.
enum Core {
    Strata(Group),
    Kafka(ClassicGroup),
}

impl Core {
    fn generation(&self) -> i32 {
        match self {
            Core::Strata(group) => group.generation(),
            Core::Kafka(group) => group.generation(),
        }
    }

    fn has_no_members(&self) -> bool {
        match self {
            Core::Strata(group) => group.has_no_members(),
            Core::Kafka(group) => group.has_no_members(),
        }
    }

    fn member_count(&self) -> usize {
        match self {
            Core::Strata(group) => group.describe().members.len(),
            Core::Kafka(group) => group.describe().len(),
        }
    }

    /// What the group record stores of the membership. A Kafka group stores one only while
    /// stable: a coordinator taking over mid-rebalance starts it empty, and its members, who
    /// were rejoining anyway, join again.
    fn snapshot(&self) -> Option<StoredMembership> {
        match self {
            Core::Strata(group) => Some(StoredMembership::Strata(group.snapshot())),
            Core::Kafka(group) => group.snapshot().map(StoredMembership::Kafka),
        }
    }

    fn check_commit(&self, member_id: &str, generation: i32) -> Result<(), ErrorCode> {
        match self {
            Core::Strata(group) => group
                .check_commit(member_id, generation)
                .map_err(group_error),
            Core::Kafka(group) => group
                .check_commit(member_id, generation)
                .map_err(classic_error),
        }
    }
}

/// A group this broker coordinates.
struct Coordinated {
    core: Core,
    /// The store revision of the group record this broker wrote last.
    fence: Revision,
    /// The generation that record holds.
    stored_generation: i32,
    /// The membership that record holds.
    stored_membership: Option<StoredMembership>,
    /// Since when the group has had no members, as that record holds (wall clock, ms).
    empty_since_ms: Option<i64>,
    offsets: GroupOffsets,
}

impl Coordinated {
    /// The group's Strata-protocol state machine; an empty group running Kafka's protocol
    /// switches (its generation goes on). A group with Kafka members refuses Strata members.
    fn strata(&mut self, group: &str) -> Result<&mut Group, ErrorCode> {
        if let Core::Kafka(classic) = &self.core {
            if !classic.has_no_members() {
                return Err(ErrorCode::InconsistentAssignor);
            }
            self.core = Core::Strata(Group::new(group.to_string(), classic.generation()));
        }
        match &mut self.core {
            Core::Strata(core) => Ok(core),
            Core::Kafka(_) => unreachable!("switched above"),
        }
    }

    /// The group's Kafka-protocol state machine, the same way round; a new one waits
    /// `initial_delay_ms` out of Empty (Kafka's `group.initial.rebalance.delay.ms`).
    fn kafka(&mut self, initial_delay_ms: u64) -> Result<&mut ClassicGroup, ErrorCode> {
        if let Core::Strata(native) = &self.core {
            if !native.has_no_members() {
                return Err(ErrorCode::InconsistentAssignor);
            }
            self.core = Core::Kafka(
                ClassicGroup::new(native.generation())
                    .with_initial_rebalance_delay(initial_delay_ms),
            );
        }
        match &mut self.core {
            Core::Kafka(core) => Ok(core),
            Core::Strata(_) => unreachable!("switched above"),
        }
    }
}

/// A commit checked against its group, waiting to be written with the others that arrived
/// together.
struct PendingCommit {
    group: String,
    topics: Vec<strata_wire::protocol::OffsetCommitTopic>,
    reply: oneshot::Sender<Response>,
}

struct Coordinator<S> {
    config: Arc<NodeConfig>,
    store: S,
    view: ClusterView,
    partitions: PartitionCounts,
    groups: HashMap<String, Coordinated>,
    started: Instant,
    members_named: u64,
    /// Producer ids this broker took from the shared counter and has not handed out.
    producer_ids: std::ops::Range<i64>,
    /// A client of this cluster, to ask leaders for high watermarks (lag); made on first use.
    lag_client: Option<Arc<strata_client::Client>>,
    lags: Arc<std::sync::Mutex<Vec<Lag>>>,
    /// Kafka members waiting on a join (true) or a sync (false), by (group, member).
    kafka_waiters: HashMap<(String, String), (bool, oneshot::Sender<KafkaGroupAnswer>)>,
}

async fn serve<S: GroupStore>(
    config: Arc<NodeConfig>,
    store: S,
    mut views: watch::Receiver<ClusterView>,
    mut mailbox: mpsc::UnboundedReceiver<GroupMessage>,
) {
    let view = views.borrow_and_update().clone();
    let mut coordinator = Coordinator {
        config,
        store,
        partitions: partition_counts(&view),
        view,
        groups: HashMap::new(),
        started: Instant::now(),
        members_named: 0,
        producer_ids: 0..0,
        lag_client: None,
        lags: Arc::default(),
        kafka_waiters: HashMap::new(),
    };
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lag_ticks = tokio::time::interval(LAG_REFRESH);
    lag_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lag_refresh: Option<tokio::task::JoinHandle<()>> = None;
    // Expired offsets are looked for a few times per retention, at most every minute.
    let expiry_period = coordinator
        .config
        .offsets_retention
        .map_or(Duration::from_secs(3600), |retention| {
            (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
        });
    let mut expiry_ticks = tokio::time::interval(expiry_period);
    expiry_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = mailbox.recv() => {
                let Some(first) = message else { return };
                // Take what else is waiting: commits among them share store transactions.
                let mut messages = vec![first];
                while messages.len() < 1024 {
                    match mailbox.try_recv() {
                        Ok(message) => messages.push(message),
                        Err(_) => break,
                    }
                }
                let mut pending = Vec::new();
                for message in messages {
                    match message {
                        GroupMessage::Request { request: Request::OffsetCommit(request), reply } => {
                            coordinator.validate_commit(request, reply, &mut pending).await;
                        }
                        GroupMessage::Request { request, reply } => {
                            coordinator.flush_commits(&mut pending).await;
                            let response = coordinator.handle(request).await;
                            let _ = reply.send(response);
                        }
                        GroupMessage::Metrics { reply } => {
                            let _ = reply.send(coordinator.render_metrics());
                        }
                        GroupMessage::Kafka { request, reply } => {
                            coordinator.flush_commits(&mut pending).await;
                            coordinator.handle_kafka(request, reply).await;
                        }
                    }
                }
                coordinator.flush_commits(&mut pending).await;
            }
            _ = lag_ticks.tick() => {
                if lag_refresh.as_ref().is_none_or(|task| task.is_finished()) {
                    lag_refresh = coordinator.refresh_lag().await;
                }
            }
            changed = views.changed() => {
                if changed.is_err() {
                    return;
                }
                let view = views.borrow_and_update().clone();
                coordinator.view_changed(view).await;
            }
            _ = ticks.tick() => coordinator.tick().await,
            _ = expiry_ticks.tick() => coordinator.expire_offsets().await,
        }
    }
}

/// The most a group's membership may take in its record: etcd refuses requests over 1.5 MiB
/// by default, and a refused write would refuse the group's heartbeats with it.
const MEMBERSHIP_RECORD_MAX_BYTES: usize = 1 << 20;

/// A group's membership as its record keeps it, for a coordinator taking the group over.
#[derive(Debug, Clone, PartialEq)]
enum StoredMembership {
    /// Stored bare, as before Kafka groups stored theirs.
    Strata(GroupSnapshot),
    /// Stored under a `"kafka"` key.
    Kafka(ClassicSnapshot),
}

impl StoredMembership {
    fn parse(record: serde_json::Value) -> Result<StoredMembership, serde_json::Error> {
        match record.get("kafka") {
            Some(kafka) => serde_json::from_value(kafka.clone()).map(StoredMembership::Kafka),
            None => serde_json::from_value(record).map(StoredMembership::Strata),
        }
    }

    /// Whether a group whose record holds `self` may keep that record now that its
    /// membership is `now` (see [`GroupSnapshot::only_releases_since`]).
    fn still_holds(&self, now: &StoredMembership) -> bool {
        match (self, now) {
            (StoredMembership::Strata(stored), StoredMembership::Strata(now)) => {
                stored.only_releases_since(now)
            }
            (stored, now) => stored == now,
        }
    }
}

/// The membership as the group record stores it; `None` (a new coordinator then starts the
/// group empty, as before memberships were stored) for a group too large for one record.
fn membership_record(group: &str, membership: &StoredMembership) -> Option<serde_json::Value> {
    let bytes = match membership {
        StoredMembership::Strata(snapshot) => serde_json::to_vec(snapshot),
        StoredMembership::Kafka(snapshot) => {
            serde_json::to_vec(&serde_json::json!({ "kafka": snapshot }))
        }
    }
    .expect("a snapshot serializes");
    if bytes.len() > MEMBERSHIP_RECORD_MAX_BYTES {
        tracing::warn!(
            group,
            bytes = bytes.len(),
            "membership too large to store; a coordinator taking over starts the group afresh"
        );
        return None;
    }
    Some(serde_json::from_slice(&bytes).expect("just serialized"))
}

fn partition_counts(view: &ClusterView) -> PartitionCounts {
    view.topics
        .iter()
        .map(|topic| (topic.name.clone(), topic.partitions.len() as u32))
        .collect()
}

fn group_error(error: GroupError) -> ErrorCode {
    match error {
        GroupError::UnknownMember => ErrorCode::UnknownMemberId,
        GroupError::IllegalGeneration => ErrorCode::IllegalGeneration,
        GroupError::FencedInstanceId => ErrorCode::FencedInstanceId,
        GroupError::InconsistentAssignor => ErrorCode::InconsistentAssignor,
    }
}

/// The answer to a Kafka join or sync that a newer one of the same member replaced.
fn superseded(join: bool) -> KafkaGroupAnswer {
    if join {
        KafkaGroupAnswer::Join(Err(ErrorCode::RebalanceInProgress))
    } else {
        KafkaGroupAnswer::Sync(Err(KafkaGroupError::Classic(
            ClassicError::RebalanceInProgress,
        )))
    }
}

/// The partitions in a Kafka consumer's assignment (ConsumerProtocolAssignment, whose first
/// two bytes are its version), for `group describe`; nothing if it does not decode.
fn consumer_assignment(mut assignment: Bytes) -> Vec<TopicPartitions> {
    use strata_kafka::kafka_protocol::messages::ConsumerProtocolAssignment;
    use strata_kafka::kafka_protocol::protocol::Decodable;
    if assignment.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([assignment[0], assignment[1]]);
    let _ = bytes::Buf::get_i16(&mut assignment);
    let Ok(decoded) = ConsumerProtocolAssignment::decode(&mut assignment, version) else {
        return Vec::new();
    };
    decoded
        .assigned_partitions
        .into_iter()
        .map(|assigned| TopicPartitions {
            topic: assigned.topic.0.to_string(),
            partitions: assigned
                .partitions
                .into_iter()
                .filter_map(|partition| u32::try_from(partition).ok())
                .collect(),
        })
        .collect()
}

fn classic_error(error: ClassicError) -> ErrorCode {
    match error {
        ClassicError::UnknownMember | ClassicError::MemberIdRequired => ErrorCode::UnknownMemberId,
        ClassicError::IllegalGeneration => ErrorCode::IllegalGeneration,
        ClassicError::RebalanceInProgress => ErrorCode::RebalanceInProgress,
        ClassicError::InconsistentProtocol => ErrorCode::InconsistentAssignor,
        ClassicError::FencedInstanceId => ErrorCode::FencedInstanceId,
    }
}

fn store_error(error: &CoordinatorError) -> ErrorCode {
    match error {
        CoordinatorError::Invalid(_) | CoordinatorError::InvalidTopicName { .. } => {
            ErrorCode::InvalidGroupId
        }
        _ => ErrorCode::CoordinatorNotAvailable,
    }
}

fn to_wire(partitions: &[TopicPartition]) -> Vec<TopicPartitions> {
    let mut grouped: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for tp in partitions {
        grouped.entry(&tp.topic).or_default().push(tp.partition);
    }
    grouped
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            TopicPartitions {
                topic: topic.to_string(),
                partitions,
            }
        })
        .collect()
}

fn from_wire(partitions: Vec<TopicPartitions>) -> Vec<TopicPartition> {
    partitions
        .into_iter()
        .flat_map(|tp| {
            let topic = tp.topic;
            tp.partitions
                .into_iter()
                .map(move |partition| TopicPartition {
                    topic: topic.clone(),
                    partition,
                })
        })
        .collect()
}

fn committed(offsets: &GroupOffsets) -> Vec<CommittedOffset> {
    offsets
        .iter()
        .flat_map(|(topic, partitions)| {
            partitions
                .iter()
                .map(move |(partition, stored)| CommittedOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: stored.offset as i64,
                    metadata: stored.metadata.clone(),
                })
        })
        .collect()
}

fn state_name(state: GroupState) -> &'static str {
    match state {
        GroupState::Empty => "Empty",
        GroupState::Stable => "Stable",
        GroupState::Reconciling => "Reconciling",
    }
}

impl<S: GroupStore> Coordinator<S> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn coordinator_of(&self, group: &str) -> Option<i32> {
        let ids: Vec<i32> = self.view.brokers.iter().map(|broker| broker.id).collect();
        coordinator_of(group, &ids)
    }

    fn is_coordinator(&self, group: &str) -> bool {
        self.coordinator_of(group) == Some(self.config.node_id)
    }

    async fn handle(&mut self, request: Request) -> Response {
        match request {
            Request::InitProducerId(request) => {
                Response::InitProducerId(self.init_producer_id(request).await)
            }
            Request::FindCoordinator(request) => {
                Response::FindCoordinator(self.find_coordinator(request))
            }
            Request::JoinGroup(request) => Response::JoinGroup(self.join(request).await),
            Request::Heartbeat(request) => Response::Heartbeat(self.heartbeat(request).await),
            Request::LeaveGroup(request) => Response::LeaveGroup(self.leave(request).await),
            Request::OffsetCommit(_) => unreachable!("commits are validated and batched apart"),
            Request::OffsetFetch(request) => {
                Response::OffsetFetch(self.fetch_offsets(request).await)
            }
            Request::ListGroups(_) => Response::ListGroups(self.list().await),
            Request::DescribeGroup(request) => {
                Response::DescribeGroup(self.describe(request).await)
            }
            Request::DeleteGroup(request) => {
                Response::DeleteGroup(self.delete_group(request).await)
            }
            other => unreachable!(
                "shards forward only group requests, not {:?}",
                other.api_key()
            ),
        }
    }

    async fn init_producer_id(&mut self, request: InitProducerIdRequest) -> InitProducerIdResponse {
        let answer = |error, producer_id, producer_epoch| InitProducerIdResponse {
            error,
            producer_id,
            producer_epoch,
        };
        // A known producer moves to its next epoch, which fences its older instance on every
        // partition it writes to next.
        if request.producer_id >= 0
            && request.producer_epoch >= 0
            && request.producer_epoch < i16::MAX
        {
            return answer(
                ErrorCode::None,
                request.producer_id,
                request.producer_epoch + 1,
            );
        }
        if self.producer_ids.is_empty() {
            match self.store.allocate_producer_ids(PRODUCER_ID_BLOCK).await {
                Ok(first) => self.producer_ids = first..first + PRODUCER_ID_BLOCK,
                Err(error) => {
                    tracing::warn!("allocating producer ids: {error}");
                    return answer(ErrorCode::CoordinatorNotAvailable, -1, -1);
                }
            }
        }
        let id = self.producer_ids.next().expect("a non-empty block");
        answer(ErrorCode::None, id, 0)
    }

    fn find_coordinator(&self, request: FindCoordinatorRequest) -> FindCoordinatorResponse {
        let broker = self
            .coordinator_of(&request.group)
            .and_then(|id| self.view.brokers.iter().find(|broker| broker.id == id));
        match broker {
            Some(broker) => FindCoordinatorResponse {
                error: ErrorCode::None,
                node_id: broker.id,
                host: broker.host.clone(),
                port: broker.port,
            },
            None => FindCoordinatorResponse {
                error: ErrorCode::CoordinatorNotAvailable,
                node_id: -1,
                host: String::new(),
                port: 0,
            },
        }
    }

    /// The group, loaded and claimed if this broker does not run it yet.
    async fn claim(&mut self, group: &str) -> Result<&mut Coordinated, ErrorCode> {
        if !self.is_coordinator(group) {
            self.groups.remove(group);
            return Err(ErrorCode::NotCoordinator);
        }
        if !self.groups.contains_key(group) {
            let loaded = self
                .store
                .load_group(group)
                .await
                .map_err(|e| store_error(&e))?;
            let generation = loaded.record.as_ref().map_or(0, |record| record.generation) + 1;
            // The members a previous coordinator stored go on where they were.
            let stored: Option<StoredMembership> = loaded
                .record
                .as_ref()
                .and_then(|record| record.membership.clone())
                .and_then(|membership| match StoredMembership::parse(membership) {
                    Ok(snapshot) => Some(snapshot),
                    Err(error) => {
                        tracing::warn!(
                            group,
                            "stored membership unreadable ({error}); starting empty"
                        );
                        None
                    }
                });
            let now_ms = self.now_ms();
            let restored = stored.clone().map(|membership| match membership {
                StoredMembership::Strata(snapshot) => {
                    Group::restore(group.to_string(), generation, snapshot, now_ms)
                        .map(|core| (Core::Strata(core), generation))
                }
                // Kafka members know only their generation: it goes on unchanged.
                StoredMembership::Kafka(snapshot) => {
                    let at = snapshot.generation;
                    let delay = self.config.group_initial_rebalance_delay_ms;
                    ClassicGroup::restore(snapshot, now_ms)
                        .map(|core| (Core::Kafka(core.with_initial_rebalance_delay(delay)), at))
                }
            });
            let (core, stored_membership, generation) = match restored {
                Some(Ok((core, at))) => {
                    tracing::info!(
                        group,
                        members = core.member_count(),
                        generation = at,
                        "restored the group's members"
                    );
                    (core, stored, at)
                }
                Some(Err(why)) => {
                    tracing::warn!(group, "stored membership refused ({why}); starting empty");
                    (
                        Core::Strata(Group::new(group.to_string(), generation)),
                        None,
                        generation,
                    )
                }
                None => (
                    Core::Strata(Group::new(group.to_string(), generation)),
                    None,
                    generation,
                ),
            };
            // Claiming is no activity of the group's own: an empty group stays empty since
            // when it became so.
            let empty_since_ms = core.has_no_members().then(|| {
                loaded
                    .record
                    .as_ref()
                    .and_then(|record| record.empty_since_ms)
                    .unwrap_or_else(system_clock_ms)
            });
            let record = GroupRecord {
                generation,
                membership: stored_membership
                    .as_ref()
                    .and_then(|snapshot| membership_record(group, snapshot)),
                empty_since_ms,
            };
            let fence = match self
                .store
                .store_group(group, loaded.revision, &record)
                .await
            {
                Ok(Some(fence)) => fence,
                Ok(None) => return Err(ErrorCode::NotCoordinator),
                Err(error) => return Err(store_error(&error)),
            };
            tracing::info!(group, generation, "coordinating the group");
            self.groups.insert(
                group.to_string(),
                Coordinated {
                    core,
                    fence,
                    stored_generation: generation,
                    stored_membership,
                    empty_since_ms,
                    offsets: loaded.offsets,
                },
            );
        }
        Ok(self.groups.get_mut(group).expect("loaded above"))
    }

    /// Stores the group's generation and membership if either changed since they were last
    /// stored; callers answer only after this, so a member is never told of holdings the store
    /// does not have (a coordinator taking over restores no less than any member was told). A
    /// fenced write means another broker runs the group now: forget it.
    async fn persist_group(&mut self, group: &str) -> Result<(), ErrorCode> {
        let Some(coordinated) = self.groups.get_mut(group) else {
            return Err(ErrorCode::NotCoordinator);
        };
        let generation = coordinated.core.generation();
        let membership = coordinated.core.snapshot();
        let membership_unchanged = match (&coordinated.stored_membership, &membership) {
            (Some(stored), Some(now)) => stored.still_holds(now),
            (None, None) => true,
            _ => false,
        };
        if generation == coordinated.stored_generation && membership_unchanged {
            return Ok(());
        }
        let empty_since_ms = coordinated
            .core
            .has_no_members()
            .then(|| coordinated.empty_since_ms.unwrap_or_else(system_clock_ms));
        let record = GroupRecord {
            generation,
            membership: membership
                .as_ref()
                .and_then(|membership| membership_record(group, membership)),
            empty_since_ms,
        };
        match self
            .store
            .store_group(group, coordinated.fence, &record)
            .await
        {
            Ok(Some(fence)) => {
                coordinated.fence = fence;
                coordinated.stored_generation = generation;
                coordinated.stored_membership = membership;
                coordinated.empty_since_ms = empty_since_ms;
                Ok(())
            }
            Ok(None) => {
                tracing::warn!(group, "another broker took the group over");
                self.groups.remove(group);
                Err(ErrorCode::NotCoordinator)
            }
            Err(error) => {
                tracing::warn!(group, "storing the group: {error}");
                Err(store_error(&error))
            }
        }
    }

    async fn join(&mut self, request: JoinGroupRequest) -> JoinGroupResponse {
        let refuse = |error| JoinGroupResponse {
            error,
            member_id: String::new(),
            generation: -1,
            heartbeat_interval_ms: 0,
        };
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&request.session_timeout_ms)
        {
            return refuse(ErrorCode::InvalidConfig);
        }
        let assignor = if request.assignor.is_empty() {
            AssignorKind::default()
        } else {
            match AssignorKind::parse(&request.assignor) {
                Some(assignor) => assignor,
                None => return refuse(ErrorCode::InconsistentAssignor),
            }
        };
        let new_member_id = self.new_member_id(&request.client_id);
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(error),
        };
        let params = JoinParams {
            member_id: (!request.member_id.is_empty()).then_some(request.member_id),
            instance_id: request.instance_id,
            client_id: request.client_id,
            topics: request.topics,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            assignor,
        };
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return refuse(error),
        };
        let joined = match core.join(now_ms, params, &partitions, new_member_id) {
            Ok(joined) => joined,
            Err(error) => return refuse(group_error(error)),
        };
        if let Err(error) = self.persist_group(&request.group).await {
            return refuse(error);
        }
        tracing::info!(group = %request.group, member = %joined.member_id, generation = joined.generation, "member joined");
        JoinGroupResponse {
            error: ErrorCode::None,
            member_id: joined.member_id,
            generation: joined.generation,
            // The group reconciles after a join: the member's first answers come quickly.
            heartbeat_interval_ms: heartbeat_interval_ms(request.session_timeout_ms, true),
        }
    }

    /// A member id no other member had: unique across restarts of this broker too (the start
    /// time is in it).
    fn new_member_id(&mut self, client_id: &str) -> String {
        self.members_named += 1;
        let client = if client_id.is_empty() {
            "member"
        } else {
            client_id
        };
        format!(
            "{client}-{}-{}-{}",
            self.config.node_id,
            system_clock_ms(),
            self.members_named
        )
    }

    /// The group's Kafka-protocol state machine, claimed (and switched to) if needed.
    async fn kafka_group(&mut self, group: &str) -> Result<&mut ClassicGroup, ErrorCode> {
        let delay = self.config.group_initial_rebalance_delay_ms;
        self.claim(group).await?.kafka(delay)
    }

    async fn handle_kafka(
        &mut self,
        request: KafkaGroupRequest,
        reply: oneshot::Sender<KafkaGroupAnswer>,
    ) {
        let now_ms = self.now_ms();
        let group = match request {
            KafkaGroupRequest::Join { group, request } => {
                if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX)
                    .contains(&request.session_timeout_ms)
                {
                    let _ = reply.send(KafkaGroupAnswer::Join(Err(ErrorCode::InvalidConfig)));
                    return;
                }
                let new_member_id = self.new_member_id(&request.client_id);
                let classic = match self.kafka_group(&group).await {
                    Ok(classic) => classic,
                    Err(error) => {
                        let _ = reply.send(KafkaGroupAnswer::Join(Err(error)));
                        return;
                    }
                };
                match classic.join(now_ms, request, new_member_id) {
                    Joined::Now(answer) => {
                        let _ = reply.send(KafkaGroupAnswer::Join(Ok(answer)));
                    }
                    Joined::Wait { member_id } => {
                        tracing::info!(%group, member = %member_id, "kafka member joining");
                        self.wait_kafka(&group, member_id, true, reply);
                    }
                }
                group
            }
            KafkaGroupRequest::Sync {
                group,
                member_id,
                instance_id,
                generation,
                assignments,
            } => {
                let synced = match self.kafka_group(&group).await {
                    Ok(classic) => classic
                        .check_instance(&member_id, instance_id.as_deref())
                        .and_then(|()| classic.sync(now_ms, &member_id, generation, assignments))
                        .map_err(KafkaGroupError::Classic),
                    Err(error) => Err(KafkaGroupError::Coordinator(error)),
                };
                match synced {
                    Ok(Synced::Now(assignment)) => {
                        let _ = reply.send(KafkaGroupAnswer::Sync(Ok(assignment)));
                    }
                    Ok(Synced::Wait) => self.wait_kafka(&group, member_id, false, reply),
                    Err(error) => {
                        let _ = reply.send(KafkaGroupAnswer::Sync(Err(error)));
                    }
                }
                group
            }
            KafkaGroupRequest::Heartbeat {
                group,
                member_id,
                instance_id,
                generation,
            } => {
                let beat = match self.kafka_group(&group).await {
                    Ok(classic) => classic
                        .check_instance(&member_id, instance_id.as_deref())
                        .and_then(|()| classic.heartbeat(now_ms, &member_id, generation))
                        .map_err(KafkaGroupError::Classic),
                    Err(error) => Err(KafkaGroupError::Coordinator(error)),
                };
                let _ = reply.send(KafkaGroupAnswer::Heartbeat(beat));
                // A heartbeat changes only when its member was last heard from, which is not
                // stored: nothing to store (no snapshot of the group to build) or deliver.
                return;
            }
            KafkaGroupRequest::Leave { group, members } => {
                let left = match self.kafka_group(&group).await {
                    Ok(classic) => members
                        .into_iter()
                        .map(|(member, instance)| {
                            let member = match (&instance, member.is_empty()) {
                                (Some(instance), true) => classic
                                    .member_of_instance(instance)
                                    .unwrap_or_default()
                                    .to_string(),
                                _ => member,
                            };
                            let left = classic
                                .check_instance(&member, instance.as_deref())
                                .and_then(|()| classic.leave(now_ms, &member))
                                .map_err(KafkaGroupError::Classic);
                            (member, left)
                        })
                        .collect(),
                    Err(error) => members
                        .into_iter()
                        .map(|(member, _)| (member, Err(KafkaGroupError::Coordinator(error))))
                        .collect(),
                };
                let _ = reply.send(KafkaGroupAnswer::Leave(left));
                group
            }
        };
        self.deliver_kafka(&group).await;
    }

    fn wait_kafka(
        &mut self,
        group: &str,
        member_id: String,
        join: bool,
        reply: oneshot::Sender<KafkaGroupAnswer>,
    ) {
        // A member asking again replaces its earlier request, which hears it was superseded.
        if let Some((was_join, earlier)) = self
            .kafka_waiters
            .insert((group.to_string(), member_id), (join, reply))
        {
            let _ = earlier.send(superseded(was_join));
        }
    }

    /// Answers the Kafka members the group's last steps answered, once a new generation is in
    /// the store (a member is never told of a generation a coordinator taking over could
    /// repeat). If the store refuses, every waiting member of the group hears why.
    async fn deliver_kafka(&mut self, group: &str) {
        let Some(Core::Kafka(classic)) = self.groups.get_mut(group).map(|c| &mut c.core) else {
            self.fail_kafka_waiters(group, ErrorCode::NotCoordinator);
            return;
        };
        let replies = classic.take_replies();
        if let Err(error) = self.persist_group(group).await {
            self.fail_kafka_waiters(group, error);
            return;
        }
        for (member, reply) in replies {
            let Some((_, waiter)) = self.kafka_waiters.remove(&(group.to_string(), member)) else {
                continue;
            };
            let answer = match reply {
                Reply::Join(answer) => KafkaGroupAnswer::Join(Ok(answer)),
                Reply::Sync(synced) => {
                    KafkaGroupAnswer::Sync(synced.map_err(KafkaGroupError::Classic))
                }
            };
            let _ = waiter.send(answer);
        }
    }

    fn fail_kafka_waiters(&mut self, group: &str, error: ErrorCode) {
        let waiting: Vec<(String, String)> = self
            .kafka_waiters
            .keys()
            .filter(|(name, _)| name == group)
            .cloned()
            .collect();
        for key in waiting {
            let (join, waiter) = self.kafka_waiters.remove(&key).expect("listed");
            let _ = waiter.send(if join {
                KafkaGroupAnswer::Join(Err(error))
            } else {
                KafkaGroupAnswer::Sync(Err(KafkaGroupError::Coordinator(error)))
            });
        }
    }

    async fn heartbeat(&mut self, request: HeartbeatRequest) -> HeartbeatResponse {
        let refuse = |error| HeartbeatResponse {
            error,
            generation: -1,
            assignment: Vec::new(),
            heartbeat_interval_ms: 0,
        };
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(error),
        };
        let owned = from_wire(request.owned);
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return refuse(error),
        };
        let assignment = match core.heartbeat(
            now_ms,
            &request.member_id,
            request.generation,
            &owned,
            &partitions,
        ) {
            Ok(assignment) => assignment,
            Err(error) => return refuse(group_error(error)),
        };
        let interval_ms = heartbeat_interval_ms(
            core.session_timeout_ms(&request.member_id)
                .unwrap_or(10_000),
            core.state() == GroupState::Reconciling,
        );
        if let Err(error) = self.persist_group(&request.group).await {
            return refuse(error);
        }
        HeartbeatResponse {
            error: ErrorCode::None,
            generation: assignment.generation,
            assignment: to_wire(&assignment.partitions),
            heartbeat_interval_ms: interval_ms,
        }
    }

    async fn leave(&mut self, request: LeaveGroupRequest) -> LeaveGroupResponse {
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return LeaveGroupResponse { error },
        };
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return LeaveGroupResponse { error },
        };
        if let Err(error) = core.leave(now_ms, &request.member_id, &partitions) {
            return LeaveGroupResponse {
                error: group_error(error),
            };
        }
        tracing::info!(group = %request.group, member = %request.member_id, "member left");
        let error = self
            .persist_group(&request.group)
            .await
            .err()
            .unwrap_or(ErrorCode::None);
        LeaveGroupResponse { error }
    }

    /// Checks a commit against the group (claiming it if needed); the write waits in `pending`
    /// for [`Self::flush_commits`], so commits that arrive together share transactions.
    async fn validate_commit(
        &mut self,
        request: OffsetCommitRequest,
        reply: oneshot::Sender<Response>,
        pending: &mut Vec<PendingCommit>,
    ) {
        let refuse = |reply: oneshot::Sender<Response>, error| {
            let _ = reply.send(Response::OffsetCommit(OffsetCommitResponse { error }));
        };
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(reply, error),
        };
        if let Err(error) = coordinated
            .core
            .check_commit(&request.member_id, request.generation)
        {
            return refuse(reply, error);
        }
        pending.push(PendingCommit {
            group: request.group,
            topics: request.topics,
            reply,
        });
    }

    /// Writes the validated commits: one transaction per group (its commits merged in arrival
    /// order), the groups' transactions concurrently. Called before anything that could change
    /// a group's stored generation, so every commit is written under the generation it was
    /// checked against.
    async fn flush_commits(&mut self, pending: &mut Vec<PendingCommit>) {
        if pending.is_empty() {
            return;
        }
        let mut by_group: BTreeMap<String, (GroupOffsets, Vec<oneshot::Sender<Response>>)> =
            BTreeMap::new();
        let committed_ms = system_clock_ms();
        for commit in pending.drain(..) {
            let Some(coordinated) = self.groups.get(&commit.group) else {
                let _ = commit
                    .reply
                    .send(Response::OffsetCommit(OffsetCommitResponse {
                        error: ErrorCode::NotCoordinator,
                    }));
                continue;
            };
            let (touched, replies) = by_group.entry(commit.group).or_default();
            // Every partition of each touched topic goes into the write (one key per topic).
            for topic in commit.topics {
                let entry = touched.entry(topic.name.clone()).or_insert_with(|| {
                    coordinated
                        .offsets
                        .get(&topic.name)
                        .cloned()
                        .unwrap_or_default()
                });
                for partition in topic.partitions {
                    entry.insert(
                        partition.partition,
                        StoredOffset {
                            offset: partition.offset,
                            metadata: partition.metadata,
                            committed_ms: Some(committed_ms),
                        },
                    );
                }
            }
            replies.push(commit.reply);
        }
        let store = &self.store;
        let groups = &self.groups;
        let writes = by_group.iter().map(|(group, (touched, _))| async move {
            let fence = groups[group].fence;
            store.commit_offsets(group, fence, touched).await
        });
        let outcomes = futures_util::future::join_all(writes).await;
        for ((group, (touched, replies)), outcome) in by_group.into_iter().zip(outcomes) {
            let error = match outcome {
                Ok(true) => {
                    let coordinated = self.groups.get_mut(&group).expect("checked above");
                    coordinated.offsets.extend(touched);
                    ErrorCode::None
                }
                Ok(false) => {
                    tracing::warn!(%group, "offset commit fenced: another broker runs the group");
                    self.groups.remove(&group);
                    ErrorCode::NotCoordinator
                }
                Err(error) => {
                    tracing::warn!(%group, "committing offsets: {error}");
                    store_error(&error)
                }
            };
            for reply in replies {
                let _ = reply.send(Response::OffsetCommit(OffsetCommitResponse { error }));
            }
        }
    }

    /// The group's offsets: from memory when this broker runs it, else from the store.
    async fn offsets_of(
        &self,
        group: &str,
    ) -> Result<(GroupOffsets, Option<&Coordinated>), ErrorCode> {
        if !self.is_coordinator(group) {
            return Err(ErrorCode::NotCoordinator);
        }
        match self.groups.get(group) {
            Some(coordinated) => Ok((coordinated.offsets.clone(), Some(coordinated))),
            None => {
                let loaded = self
                    .store
                    .load_group(group)
                    .await
                    .map_err(|e| store_error(&e))?;
                Ok((loaded.offsets, None))
            }
        }
    }

    async fn fetch_offsets(&mut self, request: OffsetFetchRequest) -> OffsetFetchResponse {
        let offsets = match self.offsets_of(&request.group).await {
            Ok((offsets, _)) => offsets,
            Err(error) => {
                return OffsetFetchResponse {
                    error,
                    offsets: Vec::new(),
                };
            }
        };
        let offsets = match request.topics {
            None => committed(&offsets),
            Some(topics) => from_wire(topics)
                .into_iter()
                .map(|tp| {
                    let stored = offsets.get(&tp.topic).and_then(|p| p.get(&tp.partition));
                    CommittedOffset {
                        offset: stored.map_or(-1, |s| s.offset as i64),
                        metadata: stored.map(|s| s.metadata.clone()).unwrap_or_default(),
                        topic: tp.topic,
                        partition: tp.partition,
                    }
                })
                .collect(),
        };
        OffsetFetchResponse {
            error: ErrorCode::None,
            offsets,
        }
    }

    async fn list(&self) -> ListGroupsResponse {
        match self.store.list_groups().await {
            Ok(groups) => ListGroupsResponse {
                error: ErrorCode::None,
                groups: groups
                    .into_iter()
                    .map(|(group, generation)| ListedGroup { group, generation })
                    .collect(),
            },
            Err(error) => ListGroupsResponse {
                error: store_error(&error),
                groups: Vec::new(),
            },
        }
    }

    /// Removes a group without members, with its committed offsets (Kafka's DeleteGroups):
    /// claimed first like any write, so the delete is fenced on this broker's record.
    async fn delete_group(&mut self, request: DeleteGroupRequest) -> DeleteGroupResponse {
        DeleteGroupResponse {
            error: self.delete_empty_group(&request.group).await,
        }
    }

    /// Deletes `group` if it has no members: by request, or when its offsets expire.
    async fn delete_empty_group(&mut self, group: &str) -> ErrorCode {
        if strata_coordinator::groups::validate_group_id(group).is_err() {
            return ErrorCode::InvalidGroupId;
        }
        if !self.is_coordinator(group) {
            return ErrorCode::NotCoordinator;
        }
        if !self.groups.contains_key(group) {
            // Claiming would store a record: an unknown group must stay unknown.
            match self.store.load_group(group).await {
                Ok(loaded) if loaded.record.is_none() && loaded.offsets.is_empty() => {
                    return ErrorCode::GroupIdNotFound;
                }
                Ok(_) => {}
                Err(error) => return store_error(&error),
            }
        }
        let fence = match self.claim(group).await {
            Ok(coordinated) if !coordinated.core.has_no_members() => {
                return ErrorCode::NonEmptyGroup;
            }
            Ok(coordinated) => coordinated.fence,
            Err(error) => return error,
        };
        let deleted = self.store.delete_group(group, fence).await;
        match deleted {
            Ok(true) => {
                self.groups.remove(group);
                tracing::info!(%group, "group deleted");
                ErrorCode::None
            }
            Ok(false) => {
                // Another broker claimed the group since: it is no longer this one's.
                self.groups.remove(group);
                ErrorCode::NotCoordinator
            }
            Err(error) => store_error(&error),
        }
    }

    /// Deletes the groups this broker coordinates whose offsets expired (no members and no
    /// commit for the retention, `--offsets-retention-ms`).
    async fn expire_offsets(&mut self) {
        let Some(retention) = self.config.offsets_retention else {
            return;
        };
        let groups = match self.store.list_groups().await {
            Ok(groups) => groups,
            Err(error) => {
                tracing::debug!("listing groups for offset expiry: {error}");
                return;
            }
        };
        for (group, _) in groups {
            let busy = self
                .groups
                .get(&group)
                .is_some_and(|running| !running.core.has_no_members());
            if busy || !self.is_coordinator(&group) {
                continue;
            }
            let Ok(loaded) = self.store.load_group(&group).await else {
                continue;
            };
            if !offsets_expired(&loaded, system_clock_ms(), retention.as_millis() as i64) {
                continue;
            }
            match self.delete_empty_group(&group).await {
                ErrorCode::None => tracing::info!(
                    %group,
                    "offsets expired ({} ms without members or commits): group deleted",
                    retention.as_millis()
                ),
                error => tracing::debug!(%group, "offsets expired, not deleted: {error}"),
            }
        }
    }

    async fn describe(&self, request: DescribeGroupRequest) -> DescribeGroupResponse {
        let mut response = DescribeGroupResponse {
            error: ErrorCode::None,
            group: request.group.clone(),
            generation: 0,
            state: state_name(GroupState::Empty).to_string(),
            assignor: AssignorKind::default().name().to_string(),
            members: Vec::new(),
            offsets: Vec::new(),
        };
        let (offsets, running) = match self.offsets_of(&request.group).await {
            Ok(found) => found,
            Err(error) => {
                response.error = error;
                return response;
            }
        };
        response.offsets = committed(&offsets);
        match running.map(|coordinated| &coordinated.core) {
            Some(Core::Kafka(classic)) => {
                response.generation = classic.generation();
                response.state = classic.state().name().to_string();
                response.assignor = classic.protocol().unwrap_or_default().to_string();
                let consumer = classic.protocol_type() == Some("consumer");
                response.members = classic
                    .describe()
                    .into_iter()
                    .map(|member| GroupMember {
                        member_id: member.member_id,
                        instance_id: None,
                        client_id: member.client_id,
                        generation: classic.generation(),
                        assignment: if consumer {
                            consumer_assignment(member.assignment)
                        } else {
                            Vec::new()
                        },
                    })
                    .collect();
            }
            Some(Core::Strata(core)) => {
                let description = core.describe();
                response.generation = description.generation;
                response.state = state_name(description.state).to_string();
                response.assignor = description.assignor.name().to_string();
                response.members = description
                    .members
                    .into_iter()
                    .map(|member| GroupMember {
                        member_id: member.member_id,
                        instance_id: member.instance_id,
                        client_id: member.client_id,
                        generation: member.generation,
                        assignment: to_wire(&member.assigned),
                    })
                    .collect();
            }
            None => {
                if let Ok(loaded) = self.store.load_group(&request.group).await {
                    response.generation = loaded.record.map_or(0, |record| record.generation);
                }
            }
        }
        response
    }

    /// Starts measuring every coordinated group's lag in the background (high watermarks from
    /// the leaders, through this node's own client port).
    async fn refresh_lag(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let committed: Vec<(String, String, u32, u64)> = self
            .groups
            .iter()
            .flat_map(|(group, coordinated)| {
                coordinated
                    .offsets
                    .iter()
                    .flat_map(move |(topic, partitions)| {
                        partitions.iter().map(move |(partition, stored)| {
                            (group.clone(), topic.clone(), *partition, stored.offset)
                        })
                    })
            })
            .collect();
        if committed.is_empty() {
            self.lags.lock().expect("lags").clear();
            return None;
        }
        if self.lag_client.is_none() {
            // This node's own client port: on its listen address, or loopback for 0.0.0.0.
            let listen = self.config.listen;
            let host = if listen.ip().is_unspecified() {
                std::net::IpAddr::from([127, 0, 0, 1])
            } else {
                listen.ip()
            };
            let address = std::net::SocketAddr::new(host, listen.port()).to_string();
            let mut config = strata_client::ClientConfig::new(address);
            config.request_timeout = Duration::from_secs(2);
            config.tcp_congestion = self.config.tcp_congestion.clone();
            self.lag_client = strata_client::Client::connect(config).await.ok();
        }
        let client = self.lag_client.clone()?;
        let lags = self.lags.clone();
        Some(tokio::spawn(async move {
            let mut measured = Vec::with_capacity(committed.len());
            let _ = client.refresh_metadata().await;
            for (group, topic, partition, committed) in committed {
                let end = client
                    .list_offset(&topic, partition, strata_wire::protocol::LATEST_TIMESTAMP)
                    .await
                    .ok()
                    .flatten();
                measured.push(Lag {
                    group,
                    topic,
                    partition,
                    committed,
                    lag: end.map(|end| end.saturating_sub(committed)),
                });
            }
            *lags.lock().expect("lags") = measured;
        }))
    }

    /// Group gauges for `/metrics`: members and generation of each group this broker
    /// coordinates, and each partition's committed offset and lag (as of the last refresh).
    fn render_metrics(&self) -> String {
        use std::fmt::Write;
        let node = self.config.node_id;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP strata_group_members Members of each group this broker coordinates.\n# TYPE strata_group_members gauge"
        );
        let mut names: Vec<&String> = self.groups.keys().collect();
        names.sort();
        for name in &names {
            let _ = writeln!(
                out,
                "strata_group_members{{node=\"{node}\",group=\"{name}\"}} {}",
                self.groups[*name].core.member_count()
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_group_generation Generation of each group this broker coordinates.\n# TYPE strata_group_generation gauge"
        );
        for name in &names {
            let _ = writeln!(
                out,
                "strata_group_generation{{node=\"{node}\",group=\"{name}\"}} {}",
                self.groups[*name].core.generation()
            );
        }
        let lags = self.lags.lock().expect("lags");
        let _ = writeln!(
            out,
            "# HELP strata_group_committed_offset The next offset a group consumes, per partition.\n# TYPE strata_group_committed_offset gauge"
        );
        for lag in lags.iter() {
            let _ = writeln!(
                out,
                "strata_group_committed_offset{{node=\"{node}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                lag.group, lag.topic, lag.partition, lag.committed
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_consumer_lag Records between a group's committed offset and the high watermark.\n# TYPE strata_consumer_lag gauge"
        );
        for lag in lags.iter() {
            if let Some(value) = lag.lag {
                let _ = writeln!(
                    out,
                    "strata_consumer_lag{{node=\"{node}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {value}",
                    lag.group, lag.topic, lag.partition
                );
            }
        }
        out
    }

    async fn tick(&mut self) {
        let now_ms = self.now_ms();
        let mut changed = Vec::new();
        let mut kafka = Vec::new();
        for (name, coordinated) in &mut self.groups {
            let expired = match &mut coordinated.core {
                Core::Strata(core) => core.tick(now_ms, &self.partitions),
                Core::Kafka(classic) => {
                    kafka.push(name.clone());
                    classic.tick(now_ms)
                }
            };
            for member in &expired {
                tracing::info!(group = %name, %member, "member expired (session or rebalance timeout)");
            }
            if coordinated.core.generation() != coordinated.stored_generation {
                changed.push(name.clone());
            }
        }
        for group in changed {
            if !kafka.contains(&group) {
                let _ = self.persist_group(&group).await;
            }
        }
        for group in kafka {
            self.deliver_kafka(&group).await;
        }
    }

    async fn view_changed(&mut self, view: ClusterView) {
        self.view = view;
        self.partitions = partition_counts(&self.view);
        let node_id = self.config.node_id;
        let brokers: Vec<i32> = self.view.brokers.iter().map(|broker| broker.id).collect();
        self.groups.retain(|group, _| {
            let ours = coordinator_of(group, &brokers) == Some(node_id);
            if !ours {
                tracing::info!(group, "no longer coordinating the group (brokers changed)");
            }
            ours
        });
        let mut changed = Vec::new();
        for (name, coordinated) in &mut self.groups {
            if let Core::Strata(core) = &mut coordinated.core {
                core.set_partitions(&self.partitions);
            }
            if coordinated.core.generation() != coordinated.stored_generation {
                changed.push(name.clone());
            }
        }
        for group in changed {
            let _ = self.persist_group(&group).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_membership_too_large_for_one_record_is_not_stored() {
        let partitions = PartitionCounts::from([("t".to_string(), 100)]);
        let mut group = Group::new("g".into(), 0);
        let params = JoinParams {
            member_id: None,
            instance_id: None,
            client_id: "c".into(),
            topics: vec!["t".into()],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            assignor: AssignorKind::Sticky,
        };
        group.join(0, params, &partitions, "a".into()).unwrap();
        group.heartbeat(1, "a", 1, &[], &partitions).unwrap();
        let small = group.snapshot();
        let stored = membership_record("g", &StoredMembership::Strata(small.clone()))
            .expect("a small group is stored");
        assert_eq!(
            StoredMembership::parse(stored).unwrap(),
            StoredMembership::Strata(small.clone())
        );

        let mut huge = small.clone();
        let member = huge.members.get_mut("a").unwrap();
        for partition in 0..60_000 {
            member
                .target
                .insert(TopicPartition::new("a-rather-long-topic-name", partition));
            member
                .assigned
                .insert(TopicPartition::new("a-rather-long-topic-name", partition));
        }
        assert_eq!(
            membership_record("g", &StoredMembership::Strata(huge)),
            None
        );
    }

    #[test]
    fn the_coordinator_is_the_same_for_any_order_of_brokers_and_spreads_groups() {
        assert_eq!(coordinator_of("g", &[]), None);
        assert_eq!(
            coordinator_of("g", &[3, 1, 2]),
            coordinator_of("g", &[1, 2, 3])
        );
        let mut counts = HashMap::new();
        for i in 0..300 {
            *counts
                .entry(coordinator_of(&format!("group-{i}"), &[1, 2, 3]).unwrap())
                .or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|&n| n > 50), "{counts:?}");
    }
}
