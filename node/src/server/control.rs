//! The control thread: owns the coordinator, applies topic changes, and tells every shard.
//!
//! It runs on its own thread and runtime, and builds the coordinator there (an etcd client is
//! bound to the runtime it was created on), so a slow control-plane call never stalls a shard.
//! With etcd it watches the cluster's keys from the revision of its last read and reads the
//! state again when they change: a topic created through another broker, or a broker joining
//! or leaving, reaches this node's shards the same way as a local change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_coordinator::{
    ConfigChange, ControllerKey, Coordinator, CoordinatorError, EtcdCoordinator, LocalCoordinator,
    PartitionChange, PartitionState, TopicSpec, TopicState, placement,
};
use strata_wire::protocol::{
    AlterTopicConfigRequest, AlterTopicConfigResponse, CreatePartitionsResponse,
    CreateTopicRequest, CreateTopicResponse, DeleteTopicResponse, ElectLeadersRequest,
    ElectLeadersResponse, ErrorCode, ReassignPartitionResponse,
};
use tokio::sync::{mpsc, oneshot, watch};

use super::NodeConfig;
use super::messages::{ClusterView, ControlMessage, ShardMessage};
use super::topic_config::TopicConfig;

/// How long a leaving node waits for its leaderships to move before it stops anyway (no other
/// replica in sync, etcd unreachable).
const LEAVE_PATIENCE: Duration = Duration::from_secs(5);

/// How often the control thread reads the whole cluster state while its watch runs and saw no
/// change: a safety net, not the way changes arrive.
const STATE_REREAD: Duration = Duration::from_secs(10);

/// Which coordinator the node runs on.
enum AnyCoordinator {
    Local(LocalCoordinator),
    Etcd(Box<EtcdCoordinator>),
}

macro_rules! each {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            AnyCoordinator::Local($name) => $body,
            AnyCoordinator::Etcd($name) => $body,
        }
    };
}

impl AnyCoordinator {
    async fn open(config: &NodeConfig) -> Result<AnyCoordinator, CoordinatorError> {
        Ok(match &config.etcd {
            None => AnyCoordinator::Local(LocalCoordinator::open(
                config.data_dir.join("__cluster"),
                config.cluster.clone(),
                config.node_id,
            )?),
            Some(endpoints) => AnyCoordinator::Etcd(Box::new(
                EtcdCoordinator::connect(
                    endpoints,
                    &config.cluster,
                    config.node_id,
                    config.lease_ttl,
                )
                .await?,
            )),
        })
    }

    async fn view(&self, node_id: i32) -> Result<ClusterView, CoordinatorError> {
        Ok(self.view_at(node_id).await?.0)
    }

    /// The cluster view and the etcd revision it was read at (0 on the local coordinator).
    async fn view_at(&self, node_id: i32) -> Result<(ClusterView, i64), CoordinatorError> {
        if let AnyCoordinator::Etcd(etcd) = self
            && !etcd.lease_valid()
        {
            return Err(CoordinatorError::Unavailable(
                "this node's etcd lease may have expired".into(),
            ));
        }
        let ((mut topics, revision), brokers) = match self {
            AnyCoordinator::Local(local) => ((local.topics().await?, 0), local.brokers().await?),
            AnyCoordinator::Etcd(etcd) => (etcd.topics_at().await?, etcd.brokers().await?),
        };
        // Leadership of a node that is not registered (its lease expired while it was paused
        // or cut off) is not ours to act on, whatever the partition state still says.
        if !brokers.iter().any(|broker| broker.id == node_id) {
            demote(&mut topics, node_id);
        }
        let view = ClusterView {
            topics: Arc::new(topics),
            brokers: Arc::new(brokers),
            controller: each!(self, c => c.controller()),
        };
        Ok((view, revision))
    }
}

/// A broker that starts and finds itself named leader must not lead at that epoch: its log may
/// have lost unsynced records that followers hold under the same epoch, and new appends would
/// then mix with them undetected. It takes the next epoch first (the replication simulator
/// found this). A partition that moves meanwhile is the controller's to place.
async fn take_next_epochs(etcd: &EtcdCoordinator, node_id: i32) {
    let Ok(topics) = etcd.topics().await else {
        return;
    };
    for topic in topics {
        for partition in topic.partitions.iter().filter(|p| p.leader == node_id) {
            match etcd
                .update_partition(&topic.name, partition, PartitionChange::NextLeaderEpoch)
                .await
            {
                Ok(Some(next)) => tracing::info!(
                    topic = %topic.name,
                    partition = partition.partition,
                    epoch = next.leader_epoch,
                    "restarted as leader: took the next leader epoch"
                ),
                Ok(None) => {}
                Err(error) => tracing::warn!(
                    topic = %topic.name,
                    partition = partition.partition,
                    "taking the next leader epoch: {error}"
                ),
            }
        }
    }
}

/// Back into the cluster after the lease lapsed (paused, cut off, or etcd was down past the
/// TTL): a new lease, the registration again, and, as after a restart, the next epoch for any
/// partition still naming this node leader (it led nothing meanwhile, but the rule that no
/// leadership spans a lapse keeps the reasoning the same as for a restart).
async fn rejoin(etcd: &EtcdCoordinator, config: &NodeConfig) -> Result<(), CoordinatorError> {
    etcd.renew_lease().await?;
    register_again(etcd, config).await
}

/// The registration on the current lease, and the next epoch for any partition still naming
/// this node leader (no leadership spans a time out of the cluster).
async fn register_again(
    etcd: &EtcdCoordinator,
    config: &NodeConfig,
) -> Result<(), CoordinatorError> {
    etcd.register_broker(config.broker_info()).await?;
    take_next_epochs(etcd, config.node_id).await;
    Ok(())
}

/// Writes a leader's own partition change. When the answer is lost (etcd unreachable), reads
/// the partition back until it can tell whether the change was stored: a leader must never
/// believe an ISR expansion failed when it was in fact stored (the new member could then be
/// elected without everything below the high watermark).
async fn update_partition(
    coordinator: &AnyCoordinator,
    topic: &str,
    expected: &PartitionState,
    change: &PartitionChange,
) -> Option<PartitionState> {
    let first = each!(coordinator, c => c.update_partition(topic, expected, change.clone()).await);
    let error = match first {
        Ok(stored) => return stored,
        Err(error) => error,
    };
    tracing::warn!(%topic, partition = expected.partition, "partition change unanswered: {error}");
    let wanted = change.apply(expected);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let topics = match each!(coordinator, c => c.topics().await) {
            Ok(topics) => topics,
            Err(_) => continue,
        };
        let current = topics
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.get(expected.partition as usize));
        return (current == Some(&wanted)).then_some(wanted);
    }
    None
}

/// Marks every partition `node_id` holds a replica of as leaderless (in this node's view only):
/// a node out of the cluster neither leads nor follows.
fn demote(topics: &mut [TopicState], node_id: i32) {
    for topic in topics {
        for partition in &mut topic.partitions {
            if partition.replicas.contains(&node_id) {
                partition.leader = placement::NO_LEADER;
            }
        }
    }
}

/// Starts the control thread; returns once the coordinator is open and this broker registered,
/// with the cluster as it is now.
pub fn start(
    config: Arc<NodeConfig>,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    views: watch::Sender<ClusterView>,
    mailbox: mpsc::UnboundedReceiver<ControlMessage>,
) -> anyhow::Result<(std::thread::JoinHandle<()>, ClusterView)> {
    let (ready, started) = oneshot::channel();
    let audience = Audience { shards, views };
    let thread = std::thread::Builder::new()
        .name("strata-control".into())
        .spawn(move || run(config, audience, mailbox, ready))?;
    match started.blocking_recv() {
        Ok(Ok(view)) => Ok((thread, view)),
        Ok(Err(error)) => {
            let _ = thread.join();
            Err(anyhow::anyhow!("{error}"))
        }
        Err(_) => anyhow::bail!("the control thread stopped while starting"),
    }
}

/// Who hears of every new cluster view: the shards (and the control thread waits until each
/// has applied it) and the group thread.
struct Audience {
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    views: watch::Sender<ClusterView>,
}

fn run(
    config: Arc<NodeConfig>,
    shards: Audience,
    mut mailbox: mpsc::UnboundedReceiver<ControlMessage>,
    ready: oneshot::Sender<Result<ClusterView, String>>,
) {
    let _span = tracing::info_span!("control", node = config.node_id).entered();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async move {
        // etcd may be starting too: keep trying for a while, saying so.
        let opened = std::time::Instant::now();
        let coordinator = loop {
            match AnyCoordinator::open(&config).await {
                Ok(coordinator) => break coordinator,
                Err(CoordinatorError::Unavailable(error))
                    if opened.elapsed() < Duration::from_secs(30) =>
                {
                    tracing::warn!("the coordinator is not reachable yet ({error}); retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => {
                    let _ = ready.send(Err(format!("opening the coordinator: {error}")));
                    return;
                }
            }
        };
        // A crashed predecessor's registration lives until its lease runs out: wait that long
        // before deciding the id belongs to another live process.
        let patience = config.lease_ttl + Duration::from_secs(2);
        let started = std::time::Instant::now();
        let registered = loop {
            match each!(&coordinator, c => c.register_broker(config.broker_info()).await) {
                Err(CoordinatorError::BrokerIdTaken(id)) if started.elapsed() < patience => {
                    tracing::info!(
                        "broker id {id} is still registered (a previous run's lease?); waiting for it to expire"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                result => break result,
            }
        };
        if let Err(error) = registered {
            let _ = ready.send(Err(format!("registering broker {}: {error}", config.node_id)));
            return;
        }
        if let AnyCoordinator::Etcd(etcd) = &coordinator {
            take_next_epochs(etcd, config.node_id).await;
        }
        let mut last = match coordinator.view(config.node_id).await {
            Ok(view) => {
                shards.views.send_replace(view.clone());
                let _ = ready.send(Ok(view.clone()));
                Some(view)
            }
            Err(error) => {
                let _ = ready.send(Err(format!("reading cluster state: {error}")));
                return;
            }
        };
        // With etcd, other brokers change the cluster too: a watch on the cluster's keys wakes
        // this loop on every change, and the state is read again then. A tick each second
        // checks the lease and the election; it reads the whole state only while the watch is
        // not running, after a failed read or failover pass, and every `STATE_REREAD` (a
        // safety net): each read is every partition key, 5 MB at 36,000 partitions.
        let mut changes = tokio::time::interval(Duration::from_millis(match &coordinator {
            AnyCoordinator::Etcd(_) => 1000,
            AnyCoordinator::Local(_) => 3_600_000,
        }));
        let mut stale = false;
        let mut read_at = Instant::now();
        let (watch_sender, mut watched) = mpsc::unbounded_channel::<()>();
        let mut watch: Option<tokio::task::JoinHandle<Result<(), CoordinatorError>>> = None;
        let mut controller = Controller {
            campaign: None,
            key: None,
            rebalance_interval: config.leader_rebalance_interval,
            rebalanced_at: Instant::now(),
        };
        // Set once this node leaves the cluster (a clean shutdown): it neither campaigns nor
        // registers again, and answers `leave_reply` once it leads nothing.
        let mut leaving = false;
        let mut leave_reply: Option<(oneshot::Sender<()>, Instant)> = None;
        loop {
            tokio::select! {
                message = mailbox.recv() => {
                    let Some(message) = message else { break };
                    match message {
                        ControlMessage::CreateTopic { request, reply } => {
                            let response = create_topic(&config, &coordinator, request).await;
                            last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            let _ = reply.send(response);
                        }
                        ControlMessage::DeleteTopic { request, reply } => {
                            let result = each!(&coordinator, c => c.delete_topic(&request.name).await);
                            let error = match result {
                                Ok(_) => {
                                    tracing::info!(topic = %request.name, "topic deleted");
                                    ErrorCode::None
                                }
                                Err(error) => error_code(&error),
                            };
                            last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            let _ = reply.send(DeleteTopicResponse { error });
                        }
                        ControlMessage::Reassign { request, reply } => {
                            let result = each!(&coordinator, c => c.reassign(&request.topic, request.partition, request.replicas.clone()).await);
                            let response = match result {
                                Ok(state) => {
                                    tracing::info!(topic = %request.topic, partition = request.partition,
                                        replicas = ?state.replicas, target = ?request.replicas, "reassignment started");
                                    ReassignPartitionResponse { error: ErrorCode::None, message: String::new() }
                                }
                                Err(error) => ReassignPartitionResponse { error: error_code(&error), message: error.to_string() },
                            };
                            last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            let _ = reply.send(response);
                        }
                        ControlMessage::AddPartitions { request, reply } => {
                            let result = each!(&coordinator, c => c.add_partitions(&request.topic, request.partitions, &request.replica_assignment.0).await);
                            let response = match result {
                                Ok(state) => {
                                    tracing::info!(topic = %request.topic, partitions = state.partitions.len(), "partitions added");
                                    CreatePartitionsResponse { error: ErrorCode::None, message: String::new() }
                                }
                                Err(error) => CreatePartitionsResponse { error: error_code(&error), message: error.to_string() },
                            };
                            last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            let _ = reply.send(response);
                        }
                        ControlMessage::AlterTopicConfig { request, reply } => {
                            let response = alter_topic_config(&coordinator, request).await;
                            last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            let _ = reply.send(response);
                        }
                        ControlMessage::ElectLeaders { request, reply } => {
                            let response = elect_leaders(&coordinator, request).await;
                            if response.moved > 0 {
                                last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            }
                            let _ = reply.send(response);
                        }
                        ControlMessage::UpdatePartition { topic, expected, change, reply } => {
                            let stored = update_partition(&coordinator, &topic, &expected, &change).await;
                            if stored.is_some() {
                                last = announce(&coordinator, &shards, config.node_id).await.or(last);
                            }
                            let _ = reply.send(stored);
                        }
                        ControlMessage::Leave { reply } => {
                            let AnyCoordinator::Etcd(etcd) = &coordinator else {
                                let _ = reply.send(());
                                continue;
                            };
                            if let Err(error) = etcd.leave().await {
                                tracing::warn!("leaving the cluster: {error}");
                            }
                            tracing::info!(node = config.node_id, "left the cluster: waiting for leaderships to move");
                            leaving = true;
                            leave_reply = Some((reply, Instant::now() + LEAVE_PATIENCE));
                        }
                        ControlMessage::Shutdown { reply } => {
                            if let AnyCoordinator::Etcd(etcd) = coordinator
                                && !leaving
                                && let Err(error) = etcd.resign().await
                            {
                                tracing::warn!("resigning from etcd: {error}");
                            }
                            let _ = reply.send(());
                            return;
                        }
                    }
                }
                changed = async {
                    tokio::select! {
                        _ = changes.tick() => false,
                        Some(()) = watched.recv() => {
                            // Coalesce a burst of events into one re-read.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            while watched.try_recv().is_ok() {}
                            true
                        }
                    }
                } => {
                    let watching = watch.as_ref().is_some_and(|task| !task.is_finished());
                    let lease_valid = match &coordinator {
                        AnyCoordinator::Etcd(etcd) => etcd.lease_valid(),
                        AnyCoordinator::Local(_) => true,
                    };
                    let read_now = changed
                        || stale
                        || !watching
                        || !lease_valid
                        || leave_reply.is_some()
                        || read_at.elapsed() >= STATE_REREAD;
                    if let AnyCoordinator::Etcd(etcd) = &coordinator
                        && !leaving
                        && !controller.tick(etcd, config.node_id, &watch_sender, read_now).await
                    {
                        stale = true;
                    }
                    if !read_now {
                        continue;
                    }
                    let read = coordinator.view_at(config.node_id).await;
                    read_at = Instant::now();
                    stale = read.is_err();
                    if let (Ok((_, revision)), AnyCoordinator::Etcd(etcd)) = (&read, &coordinator)
                        && !watching
                    {
                        watch = Some(tokio::spawn(etcd.watch_changes(*revision, watch_sender.clone())));
                    }
                    let read = read.map(|(view, _)| view);
                    if let (Some((_, deadline)), AnyCoordinator::Etcd(etcd)) =
                        (&leave_reply, &coordinator)
                    {
                        let handed_off = nothing_to_hand_off(etcd, config.node_id).await;
                        if (handed_off || Instant::now() >= *deadline)
                            && let Some((reply, _)) = leave_reply.take()
                        {
                            let _ = reply.send(());
                        }
                    }
                    if let (Ok(view), AnyCoordinator::Etcd(etcd)) = (&read, &coordinator)
                        && !leaving
                        && etcd.lease_valid()
                        && !view.brokers.iter().any(|broker| broker.id == config.node_id)
                    {
                        // On a valid lease but not registered: the registration after a lapse
                        // found the key still held by this node's previous lease (an etcd
                        // leader change extends every lease by its TTL), or the key went.
                        // Register once it is free, whatever the cause.
                        match register_again(etcd, &config).await {
                            Ok(()) => tracing::warn!(
                                node = config.node_id,
                                "registered again: this broker had dropped out of the cluster"
                            ),
                            Err(error) => tracing::debug!("registering again: {error}"),
                        }
                    }
                    match read {
                        Ok(view) if Some(&view) != last.as_ref() => {
                            tracing::info!(
                                topics = view.topics.len(),
                                brokers = view.brokers.len(),
                                "cluster state changed"
                            );
                            send_view(&shards, view.clone()).await;
                            last = Some(view);
                        }
                        Ok(_) => {}
                        Err(error) => {
                            // A node that left gave up its lease on purpose: no alarm.
                            if leaving {
                                tracing::debug!("reading cluster state: {error}");
                            } else {
                                tracing::warn!("reading cluster state: {error}");
                            }
                            // Cannot confirm leadership: stop writing (fail safe, not split
                            // brain) until the cluster can be read again.
                            if let Some(view) = last.as_mut()
                                && let AnyCoordinator::Etcd(etcd) = &coordinator
                                && !etcd.lease_valid()
                                && view.topics.iter().any(|t| {
                                    t.partitions.iter().any(|p| {
                                        p.replicas.contains(&config.node_id)
                                            && p.leader != placement::NO_LEADER
                                    })
                                })
                            {
                                tracing::error!(
                                    node = config.node_id,
                                    "etcd lease may have expired: no longer leading or following any partition here"
                                );
                                let mut topics = view.topics.as_ref().clone();
                                demote(&mut topics, config.node_id);
                                view.topics = Arc::new(topics);
                                // Nor is it a registered broker as far as it can tell: its
                                // `/health` and `cluster info` say so.
                                let brokers: Vec<_> = view
                                    .brokers
                                    .iter()
                                    .filter(|broker| broker.id != config.node_id)
                                    .cloned()
                                    .collect();
                                view.brokers = Arc::new(brokers);
                                send_view(&shards, view.clone()).await;
                            }
                            if let AnyCoordinator::Etcd(etcd) = &coordinator
                                && !leaving
                                && !etcd.lease_valid()
                            {
                                match rejoin(etcd, &config).await {
                                    Ok(()) => tracing::warn!(
                                        node = config.node_id,
                                        "rejoined the cluster on a new etcd lease"
                                    ),
                                    Err(error) => tracing::warn!("rejoining the cluster: {error}"),
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Whether a leaving node has no leadership left that another broker could take: none names
/// it leader, or no other live broker is a replica the controller may elect (in the ISR, or
/// anywhere with unclean election). The last broker of a cluster then stops at once instead of
/// waiting out [`LEAVE_PATIENCE`]. Reads the stored state itself: the view demotes an
/// unregistered node, so it would say "led nothing" before anything moved.
async fn nothing_to_hand_off(etcd: &EtcdCoordinator, node_id: i32) -> bool {
    let (Ok(topics), Ok(brokers)) = (etcd.topics().await, etcd.brokers().await) else {
        return false;
    };
    let successor = |candidate: &i32| {
        *candidate != node_id && brokers.iter().any(|broker| broker.id == *candidate)
    };
    !topics.iter().any(|topic| {
        let unclean = unclean_election(topic);
        topic.partitions.iter().any(|p| {
            p.leader == node_id
                && if unclean {
                    p.replicas.iter().any(successor)
                } else {
                    p.isr.iter().any(successor)
                }
        })
    })
}

/// The topic lets the controller elect a leader from outside the ISR.
fn unclean_election(topic: &TopicState) -> bool {
    topic
        .config
        .get("unclean.leader.election")
        .is_some_and(|value| value == "true")
}

/// This node's part in the controller election, and the controller's job once elected:
/// moving leadership off dead brokers with fenced writes, and back to preferred replicas.
struct Controller {
    campaign: Option<tokio::task::JoinHandle<Result<ControllerKey, CoordinatorError>>>,
    key: Option<ControllerKey>,
    /// How often leaderships go back to preferred replicas (`None`: never).
    rebalance_interval: Option<Duration>,
    rebalanced_at: Instant,
}

impl Controller {
    /// `wake` gets a message when a campaign ends, so the new controller's first pass runs at
    /// once rather than at the next tick (a controller that left took a second to replace).
    /// Returns false when a failover pass failed (it should run again at the next tick).
    /// The pass runs when `state_changed` (or at once on election), since brokers leave and
    /// join through keys the watch reports, and every rebalance interval, when it also moves
    /// leaderships back to preferred replicas.
    async fn tick(
        &mut self,
        etcd: &EtcdCoordinator,
        node_id: i32,
        wake: &mpsc::UnboundedSender<()>,
        state_changed: bool,
    ) -> bool {
        let mut elected = false;
        if self.key.is_none() {
            match &self.campaign {
                None => {
                    let (campaign, wake) = (etcd.campaign(), wake.clone());
                    self.campaign = Some(tokio::spawn(async move {
                        let elected = campaign.await;
                        let _ = wake.send(());
                        elected
                    }));
                }
                Some(task) if task.is_finished() => {
                    let task = self.campaign.take().expect("checked above");
                    match task.await {
                        Ok(Ok(key)) => {
                            tracing::info!(node = node_id, "elected controller");
                            self.key = Some(key);
                            elected = true;
                        }
                        Ok(Err(error)) => tracing::warn!("controller campaign failed: {error}"),
                        Err(error) => tracing::warn!("controller campaign task failed: {error}"),
                    }
                }
                Some(_) => {}
            }
        }
        // Unknown (etcd unreachable now) is not "someone else": only a controller read back
        // as another node, or as none, ends this node's role.
        let current = match etcd.refresh_controller().await {
            Ok(current) => current,
            Err(_) => return self.key.is_none(),
        };
        if self.key.is_some() && current != node_id {
            tracing::warn!(node = node_id, current, "no longer the controller");
            self.key = None;
        }
        let rebalance = self
            .rebalance_interval
            .is_some_and(|interval| self.rebalanced_at.elapsed() >= interval);
        let Some(key) = self.key.clone() else {
            return true;
        };
        if !(state_changed || elected || rebalance) {
            return true;
        }
        if let Err(error) = self.fail_over(etcd, &key, rebalance).await {
            tracing::warn!("controller failover pass failed: {error}");
            return false;
        }
        if rebalance {
            self.rebalanced_at = Instant::now();
        }
        true
    }

    /// Moves leadership of partitions whose leader is not a live broker (DESIGN §6), completes
    /// reassignments, and with `rebalance` moves leaderships back to preferred replicas.
    async fn fail_over(
        &mut self,
        etcd: &EtcdCoordinator,
        key: &ControllerKey,
        rebalance: bool,
    ) -> Result<(), CoordinatorError> {
        let live: std::collections::BTreeSet<i32> = etcd
            .brokers()
            .await?
            .iter()
            .map(|broker| broker.id)
            .collect();
        let (topics, stored) = etcd.topics_with_revisions().await?;
        // A creator that stopped between a topic's record and its last partition key leaves
        // partitions without keys (readers see their initial state): write them.
        let mut keys: std::collections::BTreeMap<&str, usize> = Default::default();
        for (topic, ..) in &stored {
            *keys.entry(topic.as_str()).or_default() += 1;
        }
        for topic in &topics {
            if keys.get(topic.name.as_str()).copied().unwrap_or(0) < topic.partitions.len() {
                let written = etcd.create_missing_partitions(&topic.name).await?;
                tracing::info!(topic = %topic.name, written, "controller wrote partition keys a creator had not");
            }
        }
        // Every change of this pass, written together (in transactions of many partitions).
        let mut planned = Vec::new();
        for (topic, state, revision) in stored {
            let unclean = topics
                .iter()
                .find(|t| t.name == topic)
                .is_some_and(unclean_election);
            let failover = placement::failover(std::slice::from_ref(&state), &live, unclean).pop();
            let preferred = || {
                rebalance
                    .then(|| placement::prefer_leader(&state, &live))
                    .flatten()
            };
            if let Some(change) = failover
                .or_else(|| placement::complete_reassignment(&state))
                .or_else(preferred)
            {
                planned.push((topic, state, change, revision, unclean));
            }
        }
        let writes: Vec<(String, PartitionState, i64)> = planned
            .iter()
            .map(|(topic, _, change, revision, _)| (topic.clone(), change.clone(), *revision))
            .collect();
        let outcomes = etcd.write_partitions_fenced(&writes, key).await?;
        let mut refused = false;
        for ((topic, state, change, _, unclean), stored) in planned.into_iter().zip(outcomes) {
            if !stored {
                refused = true;
                continue;
            }
            if unclean && !state.isr.contains(&change.leader) {
                tracing::error!(%topic, partition = state.partition, leader = change.leader,
                    "UNCLEAN leader election: records the old leader had may be lost");
            }
            if state.target_replicas.is_some() && change.target_replicas.is_none() {
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    replicas = ?change.replicas,
                    leader = change.leader,
                    "reassignment complete"
                );
            } else if change.leader == state.leader {
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    isr = ?change.isr,
                    "controller removed dead brokers from the ISR"
                );
            } else {
                // A live leader gives way only to its preferred replica.
                let why = if live.contains(&state.leader) {
                    "back to the preferred replica"
                } else {
                    "off a dead broker"
                };
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    from = state.leader,
                    to = change.leader,
                    epoch = change.leader_epoch,
                    isr = ?change.isr,
                    "controller moved partition leadership {why}"
                );
            }
        }
        if refused
            && etcd
                .refresh_controller()
                .await
                .is_ok_and(|current| current != etcd.node_id())
        {
            // The fence held: someone else controls the cluster now.
            self.key = None;
        }
        Ok(())
    }
}

/// A new topic's partition count: 1 to 100,000.
pub(super) fn check_partition_count(partitions: u32) -> Result<(), String> {
    if partitions == 0 || partitions > 100_000 {
        return Err(format!("partitions={partitions}: expected 1 to 100000"));
    }
    Ok(())
}

async fn create_topic(
    config: &NodeConfig,
    coordinator: &AnyCoordinator,
    request: CreateTopicRequest,
) -> CreateTopicResponse {
    let failed = |error: ErrorCode, message: String| CreateTopicResponse { error, message };
    let overrides: BTreeMap<String, String> = request
        .configs
        .into_iter()
        .map(|entry| (entry.key, entry.value))
        .collect();
    if let Err(message) = TopicConfig::parse(&overrides) {
        return failed(ErrorCode::InvalidConfig, message);
    }
    if let Err(message) = check_partition_count(request.partitions) {
        return failed(ErrorCode::InvalidConfig, message);
    }
    let spec = TopicSpec {
        name: request.name.clone(),
        partitions: request.partitions,
        replication_factor: request.replication_factor.max(1),
        config: overrides,
        assignment: request.replica_assignment.0,
    };
    match each!(coordinator, c => c.create_topic(spec).await) {
        Ok(topic) => {
            tracing::info!(
                node = config.node_id,
                topic = %topic.name,
                partitions = topic.partitions.len(),
                "topic created"
            );
            CreateTopicResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => failed(error_code(&error), error.to_string()),
    }
}

/// Moves leadership to the preferred replica of every partition of `request.topic` (all topics
/// when empty) where `placement::prefer_leader` allows it, each with a compare-first write (a
/// partition that changed meanwhile is left alone). Any broker may do it: the write is as safe
/// as the controller's, since the new leader is in the ISR of the state it replaces.
async fn elect_leaders(
    coordinator: &AnyCoordinator,
    request: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let failed = |error: &CoordinatorError| ElectLeadersResponse {
        error: error_code(error),
        message: error.to_string(),
        moved: 0,
    };
    let (topics, brokers) = match each!(coordinator, c => (c.topics().await, c.brokers().await)) {
        (Ok(topics), Ok(brokers)) => (topics, brokers),
        (Err(error), _) | (_, Err(error)) => return failed(&error),
    };
    if !request.topic.is_empty() && !topics.iter().any(|topic| topic.name == request.topic) {
        return failed(&CoordinatorError::UnknownTopic(request.topic));
    }
    let live: std::collections::BTreeSet<i32> = brokers.iter().map(|broker| broker.id).collect();
    let mut moved = 0;
    for topic in topics
        .iter()
        .filter(|topic| request.topic.is_empty() || topic.name == request.topic)
    {
        for partition in &topic.partitions {
            if placement::prefer_leader(partition, &live).is_none() {
                continue;
            }
            let change = PartitionChange::PreferredLeader;
            match each!(coordinator, c => c.update_partition(&topic.name, partition, change).await)
            {
                Ok(Some(next)) => {
                    moved += 1;
                    tracing::info!(topic = %topic.name, partition = partition.partition,
                        from = partition.leader, to = next.leader, epoch = next.leader_epoch,
                        "moved leadership back to the preferred replica (on request)");
                }
                Ok(None) => {}
                Err(error) => {
                    return ElectLeadersResponse {
                        moved,
                        ..failed(&error)
                    };
                }
            }
        }
    }
    ElectLeadersResponse {
        error: ErrorCode::None,
        message: String::new(),
        moved,
    }
}

/// Changes a topic's overrides if the result parses as a whole; every broker's shards apply the
/// new settings to their open partitions when the change reaches them.
async fn alter_topic_config(
    coordinator: &AnyCoordinator,
    request: AlterTopicConfigRequest,
) -> AlterTopicConfigResponse {
    let change = ConfigChange {
        set: request
            .set
            .into_iter()
            .map(|entry| (entry.key, entry.value))
            .collect(),
        delete: request.delete,
    };
    let unknown: Vec<&String> = change
        .delete
        .iter()
        .filter(|key| !super::topic_config::KEYS.contains(&key.as_str()))
        .collect();
    if !unknown.is_empty() {
        return AlterTopicConfigResponse {
            error: ErrorCode::InvalidConfig,
            message: format!("unknown topic config {unknown:?}"),
        };
    }
    let validate = |config: &BTreeMap<String, String>| TopicConfig::parse(config).map(drop);
    match each!(coordinator, c => c.alter_topic_config(&request.topic, &change, &validate).await) {
        Ok(topic) => {
            tracing::info!(topic = %topic.name, config = ?topic.config, "topic config altered");
            AlterTopicConfigResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => AlterTopicConfigResponse {
            error: error_code(&error),
            message: error.to_string(),
        },
    }
}

/// Sends the current cluster state to every shard and waits until each has opened or closed its
/// partitions to match, so a client that saw CreateTopic succeed can produce at once.
async fn announce(
    coordinator: &AnyCoordinator,
    shards: &Audience,
    node_id: i32,
) -> Option<ClusterView> {
    match coordinator.view(node_id).await {
        Ok(view) => {
            send_view(shards, view.clone()).await;
            Some(view)
        }
        Err(error) => {
            tracing::error!("reading cluster state failed: {error}");
            None
        }
    }
}

async fn send_view(audience: &Audience, view: ClusterView) {
    audience.views.send_replace(view.clone());
    let mut acks = Vec::new();
    for shard in audience.shards.iter() {
        let (reply, ack) = oneshot::channel();
        if shard
            .send(ShardMessage::ClusterChanged {
                view: view.clone(),
                reply,
            })
            .is_ok()
        {
            acks.push(ack);
        }
    }
    for ack in acks {
        let _ = ack.await;
    }
}

fn error_code(error: &CoordinatorError) -> ErrorCode {
    match error {
        CoordinatorError::TopicExists(_) => ErrorCode::TopicAlreadyExists,
        CoordinatorError::UnknownTopic(_) => ErrorCode::UnknownTopic,
        CoordinatorError::InvalidTopicName { .. } => ErrorCode::InvalidTopicName,
        CoordinatorError::Invalid(_) => ErrorCode::InvalidConfig,
        CoordinatorError::InvalidReplicaAssignment(_) => ErrorCode::InvalidReplicaAssignment,
        CoordinatorError::Unavailable(_) => ErrorCode::NotReady,
        CoordinatorError::BrokerIdTaken(_)
        | CoordinatorError::Storage { .. }
        | CoordinatorError::Corrupt { .. } => ErrorCode::Internal,
    }
}
