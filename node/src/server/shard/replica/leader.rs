//! The shard as a leader's host: followers' fetches reach the owning shard and are answered by
//! [`crate::replicator::serve_fetch`] over the partition's `Leader`; ISR changes are proposed to
//! the control thread, catch-up traffic is held to its throttles.

use std::rc::Rc;
use std::time::Duration;

use strata_coordinator::PartitionChange;
use strata_wire::protocol::{ErrorCode, ReplicaFetchRequest, ReplicaFetchResponse};
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::replication::{IsrProposal, Leader, RecoveryThrottle};
use crate::replicator::{LeaderHost, PartitionRole, replica_fetch_error, serve_fetch};
use crate::server::broker_config::REPLICA_RECOVERY_RATE;
use crate::server::messages::ControlMessage;
use crate::server::messages::ShardMessage;
use crate::server::shard::{Shard, shard_of};

use super::{AckWaiter, Role};

impl Shard {
    /// A follower's fetch, on any shard: forwarded to the owner.
    pub(in crate::server) async fn replica_fetch(
        self: &Rc<Self>,
        request: ReplicaFetchRequest,
    ) -> ReplicaFetchResponse {
        let owner = shard_of(
            &request.topic,
            request.partition,
            self.context.config.shards,
        );
        if owner == self.context.index {
            return self.replica_fetch_local(request).await;
        }
        let (reply, answer) = oneshot::channel();
        if !self.forward(owner, ShardMessage::ReplicaFetch { request, reply }) {
            return replica_fetch_error(ErrorCode::NotReady, 0, 0);
        }
        answer
            .await
            .unwrap_or_else(|_| replica_fetch_error(ErrorCode::NotReady, 0, 0))
    }

    /// A follower's fetch for a partition this shard owns.
    pub(in crate::server) async fn replica_fetch_local(
        self: &Rc<Self>,
        request: ReplicaFetchRequest,
    ) -> ReplicaFetchResponse {
        serve_fetch(self, request).await
    }

    /// Holds a catch-up answer (to a replica outside the ISR) until the node's limit and the
    /// topic's allow it; `Some(the most it may carry)` when either limit is set.
    pub(super) async fn hold_catch_up(&self, topic: &str, topic_rate: Option<u64>) -> Option<u64> {
        let shards = self.context.config.shards;
        let share = |rate| RecoveryThrottle::shard_share(rate, shards);
        let clock = self.clock();
        {
            let now = clock.now();
            let mut topics = self.topic_recovery_throttles.borrow_mut();
            let mut throttle = topics.remove(topic);
            RecoveryThrottle::retune(&mut throttle, topic_rate.map(share), now);
            if let Some(throttle) = throttle {
                topics.insert(topic.to_string(), throttle);
            }
            let node_rate = self
                .view
                .borrow()
                .dynamic
                .number(REPLICA_RECOVERY_RATE)
                .or(self.context.config.replica_recovery_bytes_per_sec);
            RecoveryThrottle::retune(
                &mut self.recovery_throttle.borrow_mut(),
                node_rate.map(share),
                now,
            );
        }
        if self.recovery_throttle.borrow().is_none() && topic_rate.is_none() {
            return None;
        }
        let held = clock.now();
        loop {
            let now = clock.now();
            let node = self
                .recovery_throttle
                .borrow_mut()
                .as_mut()
                .map_or(Duration::ZERO, |throttle| throttle.delay(now));
            let topic = self
                .topic_recovery_throttles
                .borrow_mut()
                .get_mut(topic)
                .map_or(Duration::ZERO, |throttle| throttle.delay(now));
            let delay = node.max(topic);
            if delay.is_zero() {
                break;
            }
            clock.sleep(delay).await;
        }
        self.metrics
            .recovery_throttled(clock.now().saturating_duration_since(held));
        let node_most = self
            .recovery_throttle
            .borrow()
            .as_ref()
            .map(RecoveryThrottle::capacity);
        let topic_most = self
            .topic_recovery_throttles
            .borrow()
            .get(topic)
            .map(RecoveryThrottle::capacity);
        node_most.into_iter().chain(topic_most).min()
    }

    /// Charges a catch-up answer's bytes to the limits that held it.
    pub(super) fn charge_catch_up(&self, topic: &str, bytes: u64) {
        let now = self.clock().now();
        if let Some(throttle) = self.recovery_throttle.borrow_mut().as_mut() {
            throttle.charge(bytes, now);
        }
        if let Some(throttle) = self.topic_recovery_throttles.borrow_mut().get_mut(topic) {
            throttle.charge(bytes, now);
        }
    }

    /// Writes an ISR change through the control thread, then tells the leader the outcome.
    pub(in crate::server) fn propose_isr(
        self: &Rc<Self>,
        key: &(String, u32),
        proposal: IsrProposal,
    ) {
        let expected = {
            let partitions = self.partitions.borrow();
            let Some(partition) = partitions.get(key) else {
                return;
            };
            partition.state.clone()
        };
        let shard = self.clone();
        let key = key.clone();
        tokio::task::spawn_local(async move {
            let stale = expected.partition_epoch != proposal.partition_epoch;
            let stored = if stale {
                None
            } else {
                shard
                    .ask_control(|reply| ControlMessage::UpdatePartition {
                        topic: key.0.clone(),
                        expected: expected.clone(),
                        change: PartitionChange::Isr(proposal.isr.clone()),
                        reply,
                    })
                    .await
                    .flatten()
            };
            let mut partitions = shard.partitions.borrow_mut();
            let Some(partition) = partitions.get_mut(&key) else {
                return;
            };
            let Role::Leader(leader) = &mut partition.role else {
                return;
            };
            if leader.epoch() != expected.leader_epoch {
                return;
            }
            let before = leader.high_watermark();
            match stored {
                Some(state) => {
                    let shrank = state.isr.len() < expected.isr.len();
                    tracing::info!(topic = %key.0, partition = key.1, from = ?expected.isr, to = ?state.isr,
                        "{}", if shrank { "ISR shrank" } else { "ISR expanded" });
                    leader.handle_isr_committed(&proposal, state.partition_epoch);
                    // Unless the cluster view brought this change first (and counted it).
                    if state.partition_epoch > partition.state.partition_epoch {
                        partition.state = state;
                        shard.metrics.isr_changed(&key.0);
                    }
                }
                None => leader.handle_isr_refused(&proposal),
            }
            partition.settle(before);
        });
    }
}

impl Shard {
    /// A follower's fetch would have it join the ISR: proposed if it is a registered broker
    /// (a node whose lease lapsed is out of the cluster, and the controller would remove it
    /// again, and again), else withdrawn.
    fn propose_expansion(
        self: &Rc<Self>,
        key: &(String, u32),
        proposal: IsrProposal,
        replica: i32,
    ) {
        let live = self
            .view
            .borrow()
            .brokers
            .iter()
            .any(|broker| broker.id == replica);
        if live {
            self.propose_isr(key, proposal);
        } else {
            let mut partitions = self.partitions.borrow_mut();
            if let Some(Role::Leader(leader)) = partitions.get_mut(key).map(|p| &mut p.role) {
                leader.handle_isr_refused(&proposal);
            }
        }
    }
}

impl LeaderHost for Rc<Shard> {
    type Waiter = AckWaiter;

    fn clock(&self) -> Clock {
        Shard::clock(self)
    }

    fn role(&self, topic: &str, partition: u32) -> PartitionRole {
        let partitions = self.partitions.borrow();
        let Some(held) = partitions.get(&(topic.to_string(), partition)) else {
            return PartitionRole::Unknown;
        };
        match &held.role {
            Role::Leader(_) => PartitionRole::Leading {
                log: held.log.clone(),
                recovery_bytes_per_sec: held.recovery_bytes_per_sec,
            },
            _ => PartitionRole::NotLeading {
                leader_epoch: held.state.leader_epoch,
            },
        }
    }

    fn with_leader<T>(
        &self,
        topic: &str,
        partition: u32,
        change: impl FnOnce(&mut Leader<AckWaiter>) -> T,
    ) -> Option<T> {
        let mut partitions = self.partitions.borrow_mut();
        let held = partitions.get_mut(&(topic.to_string(), partition))?;
        let Role::Leader(leader) = &mut held.role else {
            return None;
        };
        let before = leader.high_watermark();
        let outcome = change(leader);
        held.settle(before);
        Some(outcome)
    }

    fn propose_isr(&self, topic: &str, partition: u32, proposal: IsrProposal, replica: i32) {
        self.propose_expansion(&(topic.to_string(), partition), proposal, replica);
    }

    async fn hold_catch_up(&self, topic: &str, topic_rate: Option<u64>) -> Option<u64> {
        Shard::hold_catch_up(self, topic, topic_rate).await
    }

    fn charge_catch_up(&self, topic: &str, bytes: u64) {
        Shard::charge_catch_up(self, topic, bytes);
    }

    fn replication_reached(&self, latency_us: u64) {
        self.metrics.replication_reached(latency_us);
    }

    fn fetch_served(&self, bytes: u64) {
        self.metrics.replica_fetch_served(bytes);
    }
}
