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
//!
//! This file routes (which broker coordinates a group, which handler takes a request) and runs
//! the thread's loop around one [`GroupManager`]; the handlers are by job:
//! - [`manager`]: the groups this broker coordinates, claimed and stored; producer ids.
//! - [`native`]: Strata's own protocol (join, heartbeat, leave).
//! - [`classic`]: Kafka's classic protocol (JoinGroup/SyncGroup waiting on the rebalance).
//! - [`consumer`]: Kafka's KIP-848 protocol (ConsumerGroupHeartbeat) on Strata's own groups.
//! - [`offsets`]: commits written together, fetches, expiry.
//! - [`admin`]: list, describe, delete.
//! - [`lag`]: consumer lag, measured and rendered as metrics.
//! - [`transactions`]: the transaction coordinator (KIP-98) and transactional offsets.
//! - [`share`]: share groups (KIP-932): membership, and the store of share-partition state.
//! - [`share_admin`]: share groups listed, inspected, and their stored state changed by
//!   operators.

mod admin;
mod classic;
mod consumer;
mod lag;
mod manager;
mod native;
mod offsets;
mod share;
mod share_admin;
mod transactions;
mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_coordinator::{EtcdGroupStore, GroupStore, LocalGroupStore};
use strata_wire::protocol::{
    ErrorCode, FindCoordinatorRequest, FindCoordinatorResponse, Request, Response,
};
use tokio::sync::{mpsc, oneshot, watch};

use super::NodeConfig;
use super::messages::{ClusterView, GroupMessage, KafkaGroupAnswer, ShardMessage};
use crate::group::PartitionCounts;

use self::lag::{LAG_REFRESH, Lag};
use self::manager::{Coordinated, Core, partition_counts};

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
            | Request::DeleteOffsets(_)
            | Request::AddPartitionsToTxn(_)
            | Request::AddOffsetsToTxn(_)
            | Request::EndTxn(_)
            | Request::TxnOffsetCommit(_)
            | Request::DescribeTransactions(_)
            | Request::ListTransactions(_)
            | Request::DescribeShareGroup(_)
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

/// The group thread's connections: its mailbox, a weak sender to it (for its own tasks' reports;
/// weak, so the thread still ends when the shards' senders go), and the shards' mailboxes
/// (for transaction markers).
pub struct GroupThreadMail {
    pub mailbox: mpsc::UnboundedReceiver<GroupMessage>,
    pub own: mpsc::WeakUnboundedSender<GroupMessage>,
    pub shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
}

pub fn start(
    config: Arc<NodeConfig>,
    views: watch::Receiver<ClusterView>,
    mail: GroupThreadMail,
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
                        Ok(store) => serve(config.clone(), store, views, mail).await,
                        Err(error) => tracing::error!("no group coordination: {error}"),
                    },
                    Some(endpoints) => {
                        // etcd may still be starting; the control thread waits for it too.
                        let store = loop {
                            match EtcdGroupStore::connect(endpoints, &config.cluster).await {
                                Ok(store) => break store,
                                Err(error) => {
                                    tracing::warn!("group store not reachable yet: {error}");
                                    config.clock.sleep(Duration::from_millis(500)).await;
                                }
                            }
                        };
                        serve(config.clone(), store, views, mail).await;
                    }
                }
            });
        })
}

/// The groups this broker coordinates, the store that outlives them, and what their handlers
/// share.
struct GroupManager<S> {
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
    lags: Arc<std::sync::Mutex<Vec<Lag>>>,
    /// Kafka members waiting on a join (true) or a sync (false), by (group, member).
    kafka_waiters: HashMap<(String, String), (bool, oneshot::Sender<KafkaGroupAnswer>)>,
    /// The share groups this broker coordinates (their membership is not stored: members
    /// join again at a new coordinator, as they do when a coordinator restarts in Kafka).
    share_groups: HashMap<String, crate::share::group::ShareGroup>,
    /// KIP-848 members subscribed by regular expression, by (group, member).
    consumer_patterns: HashMap<(String, String), consumer::Pattern>,
    /// The transactional ids this broker coordinates.
    txns: transactions::Transactions,
    /// Transactions this broker aborted because they outlived their timeout.
    txn_aborts_by_timeout: u64,
    /// The shards' mailboxes, and this thread's own (weak).
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    own_mailbox: mpsc::WeakUnboundedSender<GroupMessage>,
}

async fn serve<S: GroupStore>(
    config: Arc<NodeConfig>,
    store: S,
    mut views: watch::Receiver<ClusterView>,
    mail: GroupThreadMail,
) {
    let GroupThreadMail {
        mut mailbox,
        own,
        shards,
    } = mail;
    let view = views.borrow_and_update().clone();
    let mut manager = GroupManager::new(config, store, view, shards, own);
    // What a former coordinator of this broker's transactional ids decided is finished here.
    manager.take_over_txns().await;
    let clock = manager.config.clock;
    let mut ticks = clock.ticks(Duration::from_millis(100));
    let mut lag_ticks = clock.ticks(LAG_REFRESH);
    let mut lag_refresh: Option<tokio::task::JoinHandle<()>> = None;
    // Expired offsets are looked for a few times per retention, at most every minute.
    let expiry_period = manager
        .config
        .offsets_retention
        .map_or(Duration::from_secs(3600), |retention| {
            (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
        });
    let mut expiry_ticks = clock.ticks(expiry_period);
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
                            manager.validate_commit(request, reply, &mut pending).await;
                        }
                        GroupMessage::Request { request, reply } => {
                            manager.flush_commits(&mut pending).await;
                            let response = manager.handle(request).await;
                            let _ = reply.send(response);
                        }
                        GroupMessage::Metrics { reply } => {
                            let _ = reply.send(manager.render_metrics());
                        }
                        GroupMessage::Kafka { request, reply } => {
                            manager.flush_commits(&mut pending).await;
                            manager.handle_kafka(request, reply).await;
                        }
                        GroupMessage::SettleTxnOffsets { group, producer_id, commit, reply } => {
                            manager.flush_commits(&mut pending).await;
                            let _ = reply.send(manager.settle_txn_offsets(&group, producer_id, commit).await);
                        }
                        GroupMessage::Share(request) => {
                            manager.flush_commits(&mut pending).await;
                            manager.handle_share(request).await;
                        }
                        GroupMessage::ShareAdmin(request) => {
                            manager.flush_commits(&mut pending).await;
                            manager.handle_share_admin(request).await;
                        }
                        GroupMessage::Manifest(request) => manager.handle_manifest(request).await,
                        GroupMessage::MarkersWritten { transactional_id, producer_id, epoch, written } => {
                            manager.markers_written(transactional_id, producer_id, epoch, written).await;
                        }
                    }
                }
                manager.flush_commits(&mut pending).await;
            }
            _ = lag_ticks.tick() => {
                if lag_refresh.as_ref().is_none_or(|task| task.is_finished()) {
                    lag_refresh = manager.refresh_lag().await;
                }
            }
            changed = views.changed() => {
                if changed.is_err() {
                    return;
                }
                let view = views.borrow_and_update().clone();
                manager.view_changed(view).await;
                manager.take_over_txns().await;
            }
            _ = ticks.tick() => {
                manager.tick().await;
                manager.txn_timeouts().await;
                manager.sync_written().await;
            }
            _ = expiry_ticks.tick() => manager.expire_offsets().await,
        }
    }
}

impl<S: GroupStore> GroupManager<S> {
    /// A manager coordinating nothing yet.
    fn new(
        config: Arc<NodeConfig>,
        store: S,
        view: ClusterView,
        shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
        own_mailbox: mpsc::WeakUnboundedSender<GroupMessage>,
    ) -> Self {
        GroupManager {
            store,
            partitions: partition_counts(&view),
            view,
            groups: HashMap::new(),
            started: config.clock.now(),
            members_named: 0,
            producer_ids: 0..0,
            lags: Arc::default(),
            kafka_waiters: HashMap::new(),
            consumer_patterns: HashMap::new(),
            share_groups: HashMap::new(),
            txns: Default::default(),
            txn_aborts_by_timeout: 0,
            shards,
            own_mailbox,
            config,
        }
    }

    /// A manager of node `node_id` over `store`, seeing the brokers `brokers` alive, with no
    /// shards: for tests of the coordinator's logic.
    #[cfg(test)]
    fn for_tests(node_id: i32, data_dir: &std::path::Path, store: S, brokers: &[i32]) -> Self {
        let config = NodeConfig::for_tests(data_dir.to_path_buf(), node_id);
        let brokers = brokers
            .iter()
            .map(|&id| strata_coordinator::BrokerInfo {
                id,
                ..config.broker_info()
            })
            .collect();
        let view = ClusterView {
            brokers: Arc::new(brokers),
            ..ClusterView::default()
        };
        let (own, _) = mpsc::unbounded_channel();
        GroupManager::new(
            Arc::new(config),
            store,
            view,
            Arc::default(),
            own.downgrade(),
        )
    }

    fn now_ms(&self) -> u64 {
        let now = self.config.clock.now();
        now.saturating_duration_since(self.started).as_millis() as u64
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
            Request::InitProducerId(request) => match request.transactional.0 {
                Some(init) => Response::InitProducerId(
                    self.init_transactional((request.producer_id, request.producer_epoch), init)
                        .await,
                ),
                None => Response::InitProducerId(self.init_producer_id(request).await),
            },
            Request::AddPartitionsToTxn(request) => {
                Response::AddPartitionsToTxn(self.add_partitions_to_txn(request).await)
            }
            Request::AddOffsetsToTxn(request) => {
                Response::AddOffsetsToTxn(self.add_offsets_to_txn(request).await)
            }
            Request::EndTxn(request) => Response::EndTxn(self.end_txn(request).await),
            Request::TxnOffsetCommit(request) => {
                Response::TxnOffsetCommit(self.txn_offset_commit(request).await)
            }
            Request::DescribeTransactions(request) => {
                Response::DescribeTransactions(self.describe_transactions(request).await)
            }
            Request::ListTransactions(request) => {
                Response::ListTransactions(self.list_transactions(&request))
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
            Request::DeleteOffsets(request) => {
                Response::DeleteOffsets(self.delete_offsets(request).await)
            }
            Request::DescribeShareGroup(request) => {
                Response::DescribeShareGroup(self.describe_share_group(request).await)
            }
            other => unreachable!(
                "shards forward only group requests, not {:?}",
                other.api_key()
            ),
        }
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

    /// Syncs the records stored as written only (share-partition states: see
    /// `docs/internals/share-groups.md`). A failure is logged and retried on the next tick
    /// with what is written by then.
    async fn sync_written(&mut self) {
        if let Err(error) = self.store.sync_written().await {
            tracing::error!("group store: syncing written records failed: {error}");
        }
    }

    async fn tick(&mut self) {
        self.expire_share_members();
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
                self.consumer_patterns
                    .remove(&(name.clone(), member.clone()));
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
        let mut handed_over = Vec::new();
        self.groups.retain(|group, _| {
            let ours = coordinator_of(group, &brokers) == Some(node_id);
            if !ours {
                tracing::info!(group, "no longer coordinating the group (brokers changed)");
                handed_over.push(group.clone());
            }
            ours
        });
        // Members waiting on a join or sync here would wait for good: they hear the group moved
        // and find its coordinator again.
        for group in handed_over {
            self.fail_kafka_waiters(&group, ErrorCode::NotCoordinator);
            self.consumer_patterns.retain(|(name, _), _| *name != group);
        }
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
