//! The leader side of replication: followers' fetches answered from the log (long polls
//! until there is data), their positions fed to the partition's `Leader` state machine, ISR
//! changes proposed to the control thread, catch-up traffic held to its throttles.

use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_coordinator::PartitionChange;
use strata_wire::protocol::{
    DivergingEpoch, ErrorCode, Records, ReplicaFetchRequest, ReplicaFetchResponse,
};
use tokio::sync::oneshot;

use crate::log::LogError;

use crate::replication::{IsrProposal, RecoveryThrottle, ReplicaFetchError};
use crate::server::broker_config::REPLICA_RECOVERY_RATE;
use crate::server::messages::ControlMessage;
use crate::server::messages::ShardMessage;
use crate::server::shard::{Shard, shard_of};

use super::Role;

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

    pub(in crate::server) async fn replica_fetch_local(
        self: &Rc<Self>,
        request: ReplicaFetchRequest,
    ) -> ReplicaFetchResponse {
        let key = (request.topic.clone(), request.partition);
        let started = Instant::now();
        if !reports_what_it_can(&request) {
            return replica_fetch_error(ErrorCode::InvalidRequest, 0, 0);
        }
        let last_fetched_epoch = u32::try_from(request.last_fetched_epoch).ok();
        let (log, cannot_diverge, catching_up, topic_recovery_rate) = {
            let partitions = self.partitions.borrow();
            let Some(partition) = partitions.get(&key) else {
                return replica_fetch_error(ErrorCode::UnknownPartition, 0, 0);
            };
            let Role::Leader(leader) = &partition.role else {
                let code = if request.leader_epoch > partition.state.leader_epoch {
                    ErrorCode::UnknownLeaderEpoch
                } else {
                    ErrorCode::NotLeader
                };
                return replica_fetch_error(code, 0, 0);
            };
            if let Err(error) = leader.validate_fetch(request.replica_id, request.leader_epoch) {
                return replica_fetch_error(fetch_error_code(error), leader.high_watermark(), 0);
            }
            // In the steady state the divergence check (a trip through the busy log task) is
            // skipped and the follower's progress counted at once: that answers acks=all.
            let cannot_diverge = leader.cannot_diverge(request.fetch_offset, last_fetched_epoch);
            let catching_up = !leader.isr().contains(&request.replica_id);
            (
                partition.log.clone(),
                cannot_diverge,
                catching_up,
                partition.recovery_bytes_per_sec,
            )
        };
        if !cannot_diverge {
            let Ok((divergence, offsets)) = log
                .diverging(request.fetch_offset, last_fetched_epoch)
                .await
            else {
                return replica_fetch_error(ErrorCode::StorageError, 0, 0);
            };
            if let Some(divergence) = divergence {
                let high_watermark = self
                    .leader_high_watermark(&key, request.leader_epoch)
                    .unwrap_or(0);
                return ReplicaFetchResponse {
                    diverging: Some(DivergingEpoch {
                        epoch: divergence.epoch.map_or(-1, i64::from),
                        end_offset: divergence.end_offset,
                    }),
                    ..replica_fetch_error(ErrorCode::None, high_watermark, offsets.log_start)
                };
            }
            if request.fetch_offset < offsets.log_start || request.fetch_offset > offsets.log_end {
                let high_watermark = self
                    .leader_high_watermark(&key, request.leader_epoch)
                    .unwrap_or(0);
                return replica_fetch_error(
                    ErrorCode::OffsetOutOfRange,
                    high_watermark,
                    offsets.log_start,
                );
            }
        }
        // The follower's log holds everything below its log end: record its progress.
        let proposal = {
            let mut partitions = self.partitions.borrow_mut();
            let Some(partition) = partitions.get_mut(&key) else {
                return replica_fetch_error(ErrorCode::NotLeader, 0, 0);
            };
            let Role::Leader(leader) = &mut partition.role else {
                return replica_fetch_error(ErrorCode::NotLeader, 0, 0);
            };
            let before = leader.high_watermark();
            let now = self.clock().monotonic_ms();
            if let Some(latency_us) = leader.time_follower_progress(
                request.replica_id,
                request.log_end,
                self.clock().monotonic_us(),
            ) {
                self.metrics.replication_reached(latency_us);
            }
            let proposal = match leader.handle_fetch(
                now,
                request.replica_id,
                request.leader_epoch,
                request.log_end,
            ) {
                Ok(progress) => progress.propose_isr,
                Err(error) => return replica_fetch_error(fetch_error_code(error), before, 0),
            };
            leader.handle_reported(
                request.replica_id,
                request.synced_offset.0,
                request.log_start.0,
            );
            partition.settle(before);
            proposal
        };
        // Outside the borrow: proposing reads the partition too.
        if let Some(proposal) = proposal {
            self.propose_expansion(&key, proposal, request.replica_id);
        }
        let checked_us = started.elapsed().as_micros();
        let (offset, mut max_bytes) = (request.fetch_offset, request.max_bytes as usize);
        let mut throttled = false;
        if catching_up && let Some(most) = self.hold_catch_up(&key.0, topic_recovery_rate).await {
            max_bytes = max_bytes.min(usize::try_from(most).unwrap_or(usize::MAX));
            throttled = true;
        }
        // One trip to the log task: it reads as soon as records exist past the fetch offset
        // (at once if they do), or, once the wait is over, reads what is there (nothing).
        let read = if request.max_wait_ms > 0 {
            let wait = Duration::from_millis(u64::from(request.max_wait_ms));
            match tokio::time::timeout(wait, log.read_for_follower(offset, max_bytes, true)).await {
                Ok(read) => read,
                Err(_) => log.read_for_follower(offset, max_bytes, false).await,
            }
        } else {
            log.read_for_follower(offset, max_bytes, false).await
        };
        let (records, offsets) = match read {
            Ok(read) => read,
            Err(LogError::OffsetOutOfRange { log_start, .. }) => {
                return replica_fetch_error(ErrorCode::OffsetOutOfRange, 0, log_start);
            }
            Err(_) => return replica_fetch_error(ErrorCode::StorageError, 0, 0),
        };
        let (log_start, log_end) = (offsets.log_start, offsets.log_end);
        let Some(high_watermark) = self.leader_high_watermark(&key, request.leader_epoch) else {
            return replica_fetch_error(ErrorCode::NotLeader, 0, 0);
        };
        if throttled {
            self.charge_catch_up(&key.0, records.len() as u64);
        }
        tracing::trace!(topic = %key.0, partition = key.1, checked_us, read_us = started.elapsed().as_micros(), bytes = records.len(), "served a follower");
        self.metrics.replica_fetch_served(records.len() as u64);
        ReplicaFetchResponse {
            error: ErrorCode::None,
            high_watermark,
            log_start_offset: log_start,
            log_end_offset: log_end,
            diverging: None,
            records: Records::Shared(records),
        }
    }

    /// Holds a catch-up answer (to a replica outside the ISR) until the node's limit and the
    /// topic's allow it; `Some(the most it may carry)` when either limit is set.
    pub(super) async fn hold_catch_up(&self, topic: &str, topic_rate: Option<u64>) -> Option<u64> {
        let shards = self.context.config.shards;
        let share = |rate| RecoveryThrottle::shard_share(rate, shards);
        {
            let now = Instant::now();
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
        let held = Instant::now();
        loop {
            let now = Instant::now();
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
            tokio::time::sleep(delay).await;
        }
        self.metrics.recovery_throttled(held.elapsed());
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
        let now = Instant::now();
        if let Some(throttle) = self.recovery_throttle.borrow_mut().as_mut() {
            throttle.charge(bytes, now);
        }
        if let Some(throttle) = self.topic_recovery_throttles.borrow_mut().get_mut(topic) {
            throttle.charge(bytes, now);
        }
    }

    /// The high watermark of the partition this replica leads at `epoch`.
    fn leader_high_watermark(&self, key: &(String, u32), epoch: u32) -> Option<u64> {
        let partitions = self.partitions.borrow();
        let partition = partitions.get(key)?;
        if !partition.is_leader_at(epoch) {
            return None;
        }
        partition.leader_high_watermark()
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

pub(super) fn fetch_error_code(error: ReplicaFetchError) -> ErrorCode {
    match error {
        ReplicaFetchError::NotAReplica(_) => ErrorCode::NotReplica,
        ReplicaFetchError::FencedLeaderEpoch { .. } => ErrorCode::FencedLeaderEpoch,
        ReplicaFetchError::UnknownLeaderEpoch { .. } => ErrorCode::UnknownLeaderEpoch,
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

/// A follower cannot hold what it has not fetched, nor sync what it does not hold.
fn reports_what_it_can(request: &ReplicaFetchRequest) -> bool {
    request.log_end <= request.fetch_offset
        && request.synced_offset.0 <= request.log_end
        && request.log_start.0 <= request.log_end
}

pub(super) fn replica_fetch_error(
    error: ErrorCode,
    high_watermark: u64,
    log_start: u64,
) -> ReplicaFetchResponse {
    ReplicaFetchResponse {
        error,
        high_watermark,
        log_start_offset: log_start,
        log_end_offset: 0,
        diverging: None,
        records: Records::empty(),
    }
}
