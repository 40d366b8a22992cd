//! The shard's side of replication: each replica partition's role, `acks=all`, ISR changes and
//! ticks, and the shard as the host of replication's drivers (`crate::replicator`): QUIC for a
//! follower's fetches, the partitions' map for the leader's answers.
//!
//! The decisions are the sans-IO core's (`crate::replication`); the drivers carry them out;
//! this module moves messages: coordinator writes through the control thread, role changes.
//! Everything here runs on the partition's owning shard; a partition's state is borrowed only
//! between awaits.

mod follower;
mod leader;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_coordinator::PartitionState;
use strata_coordinator::placement::NO_LEADER;
use strata_wire::protocol::ErrorCode;
use tokio::sync::{Notify, oneshot};

use super::Shard;
use crate::log::cleaner::OffsetMap;
use crate::log::writer::{CleanerResources, LogHandle};
use crate::replication::{AckError, Leader, LeaderConfig, RecoveryThrottle};
use crate::replicator::{FollowedPartition, follow};
use crate::server::broker_config::CLEANER_IO_RATE;
use crate::server::metrics::PartitionCompaction;

/// Answered when the high watermark passes an `acks=all` produce.
pub(in crate::server) type AckWaiter = oneshot::Sender<Result<(), AckError>>;

/// How long a caught-up follower's fetch waits at the leader for new records: a quarter of the
/// lag time, at least half a second. Each partition's follower fetches on its own, so an idle
/// partition costs a round trip per wait on both brokers: at 500 ms, a three-broker cluster
/// with 1,000 idle partitions (RF 3) spent a fifth of a core on them. A caught-up follower's
/// fetch counts it as caught up when it arrives, so the wait must stay well inside the lag time.
fn replica_fetch_wait_ms(lag_time_max_ms: u64) -> u32 {
    (lag_time_max_ms / 4).clamp(500, u64::from(u32::MAX)) as u32
}
/// How often leaders look for lagging followers and checkpoint high watermarks.
const TICK: Duration = Duration::from_millis(100);
/// How often a changed high watermark is checkpointed.
const HIGH_WATERMARK_CHECKPOINT_MS: u64 = 1_000;

pub(in crate::server) enum Role {
    Leader(Box<Leader<AckWaiter>>),
    Follower {
        task: tokio::task::JoinHandle<()>,
        /// As the leader last said, bounded by this log's end.
        high_watermark: Rc<Cell<u64>>,
    },
    /// No leader (every in-sync replica is down), or this replica is not yet set up.
    Idle,
}

/// One replica of a partition on this shard.
pub(in crate::server) struct Partition {
    pub log: LogHandle,
    /// The partition state this replica acts on (leader, epoch, ISR).
    pub state: PartitionState,
    pub max_message_bytes: usize,
    pub leader_config: LeaderConfig,
    /// `flush=always`: an append counts (for acks and the high watermark) once synced.
    pub flush_always: bool,
    /// The topic settings these came from: its overrides on top of the defaults set live (a
    /// change of either re-applies them).
    pub settings: BTreeMap<String, String>,
    /// The topic's own limit on catch-up replication (`replica.recovery.bytes.per.sec`).
    pub recovery_bytes_per_sec: Option<u64>,
    /// `cleanup.policy` includes `compact`: the shard's cleaner looks after it.
    pub compacted: bool,
    /// `remote.storage.enable`: as leader, this replica uploads closed segments.
    pub remote_storage: bool,
    /// The whole log's retention (`retention.ms`, `retention.bytes`), which a tiered topic's
    /// leader applies to the remote tier.
    pub retention: (Option<i64>, Option<u64>),
    pub role: Role,
    /// Woken whenever the high watermark moves: long-polling consumers wait on it.
    pub committed: Rc<Notify>,
    pub high_watermark_checkpointed: u64,
    pub high_watermark_checkpointed_at: Instant,
}

impl Partition {
    /// The leader's high watermark; `None` unless this replica leads.
    pub fn leader_high_watermark(&self) -> Option<u64> {
        match &self.role {
            Role::Leader(leader) => Some(leader.high_watermark()),
            _ => None,
        }
    }

    pub fn high_watermark(&self) -> u64 {
        match &self.role {
            Role::Leader(leader) => leader.high_watermark(),
            Role::Follower { high_watermark, .. } => high_watermark.get(),
            Role::Idle => self.high_watermark_checkpointed,
        }
    }

    pub fn is_leader_at(&self, epoch: u32) -> bool {
        matches!(&self.role, Role::Leader(leader) if leader.epoch() == epoch)
    }

    /// Hands out answered `acks=all` produces and wakes consumers if the high watermark moved.
    pub fn settle(&mut self, high_watermark_before: u64) {
        if let Role::Leader(leader) = &mut self.role {
            for (waiter, result) in leader.poll_acks() {
                let _ = waiter.send(result);
            }
            if leader.high_watermark() != high_watermark_before {
                self.committed.notify_waiters();
            }
        }
    }

    /// Ends whatever role this replica had: waiting produces fail with NOT_LEADER, the
    /// follower loop stops.
    pub fn stop_role(&mut self) {
        match std::mem::replace(&mut self.role, Role::Idle) {
            Role::Leader(mut leader) => {
                self.high_watermark_checkpointed = leader.high_watermark();
                leader.resign();
                for (waiter, result) in leader.poll_acks() {
                    let _ = waiter.send(result);
                }
            }
            Role::Follower {
                task,
                high_watermark,
                ..
            } => {
                task.abort();
                self.high_watermark_checkpointed = high_watermark.get();
            }
            Role::Idle => {}
        }
        self.committed.notify_waiters();
    }
}

pub(in crate::server) fn ack_error_code(error: AckError) -> ErrorCode {
    match error {
        AckError::NotEnoughReplicas { .. } => ErrorCode::NotEnoughReplicas,
        AckError::NotEnoughReplicasAfterAppend { .. } => ErrorCode::NotEnoughReplicasAfterAppend,
        AckError::NotLeader => ErrorCode::NotLeader,
    }
}

impl Shard {
    /// Puts the replica of `key` into the role `state` asks for. The log is open.
    pub(in crate::server) async fn assume_role(
        self: &Rc<Self>,
        key: &(String, u32),
        state: &PartitionState,
    ) {
        let node_id = self.context.config.node_id;
        let log = {
            let mut partitions = self.partitions.borrow_mut();
            let Some(partition) = partitions.get_mut(key) else {
                return;
            };
            let previous = std::mem::replace(&mut partition.state, state.clone());
            let same_leadership =
                previous.leader == state.leader && previous.leader_epoch == state.leader_epoch;
            match &mut partition.role {
                Role::Leader(leader) if same_leadership && state.leader == node_id => {
                    // The ISR changed at the same epoch (our own change echoed, or the
                    // controller removed a dead broker).
                    let before = leader.high_watermark();
                    leader.handle_state(
                        state.replicas.clone(),
                        state.isr.clone(),
                        state.partition_epoch,
                        self.clock().monotonic_ms(),
                    );
                    // Counted once: a view that only repeats what this leader already applied
                    // (its own change, written back below in `propose_isr`) changes nothing.
                    if previous.isr != state.isr {
                        self.metrics.isr_changed(&key.0);
                    }
                    partition.settle(before);
                    return;
                }
                Role::Follower { .. } if same_leadership => return,
                Role::Idle if same_leadership && state.leader == NO_LEADER => return,
                _ => {}
            }
            partition.stop_role();
            partition.log.clone()
        };
        if state.leader == NO_LEADER {
            tracing::warn!(topic = %key.0, partition = key.1, "partition has no leader (no in-sync replica is live)");
            return;
        }
        let Ok(info) = log.replica_info().await else {
            return;
        };
        let now = self.clock().monotonic_ms();
        let mut partitions = self.partitions.borrow_mut();
        let Some(partition) = partitions.get_mut(key) else {
            return;
        };
        if partition.state != *state || !matches!(partition.role, Role::Idle) {
            // A newer state arrived while the log answered; it set the role.
            return;
        }
        let high_watermark = partition
            .high_watermark_checkpointed
            .max(info.high_watermark_checkpoint)
            .min(info.offsets.log_end);
        if state.leader == node_id {
            // What this replica's own log holds as durably as the flush policy promises: with
            // `always`, what is synced (the rest is synced just below); otherwise all of it.
            let log_end = if partition.flush_always {
                info.offsets.durable
            } else {
                info.offsets.log_end
            };
            if log_end < info.offsets.log_end {
                let shard = self.clone();
                let key = key.clone();
                let epoch = state.leader_epoch;
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    let Ok(durable) = log.sync().await else {
                        return;
                    };
                    let mut partitions = shard.partitions.borrow_mut();
                    if let Some(partition) = partitions.get_mut(&key)
                        && let Role::Leader(leader) = &mut partition.role
                        && leader.epoch() == epoch
                    {
                        let before = leader.high_watermark();
                        leader.handle_appended(leader.log_end().max(durable));
                        partition.settle(before);
                    }
                });
            }
            let leader = Leader::new(
                node_id,
                state.leader_epoch,
                state.partition_epoch,
                state.replicas.clone(),
                state.isr.clone(),
                log_end,
                high_watermark.min(log_end),
                partition.leader_config,
                now,
            );
            tracing::info!(
                topic = %key.0,
                partition = key.1,
                epoch = state.leader_epoch,
                log_end = info.offsets.log_end,
                high_watermark = leader.high_watermark(),
                isr = ?state.isr,
                "leading"
            );
            partition.role = Role::Leader(Box::new(leader));
            partition.committed.notify_waiters();
        } else {
            let high_watermark = Rc::new(Cell::new(high_watermark));
            let followed = FollowedPartition {
                topic: key.0.clone(),
                partition: key.1,
                replica_id: node_id,
                leader: state.leader,
                leader_epoch: state.leader_epoch,
                max_wait_ms: replica_fetch_wait_ms(self.context.config.replica_lag_time_max_ms),
            };
            let task = tokio::task::spawn_local(follow(
                self.clone(),
                followed,
                log.clone(),
                high_watermark.clone(),
                self.clock(),
            ));
            tracing::info!(
                topic = %key.0,
                partition = key.1,
                leader = state.leader,
                epoch = state.leader_epoch,
                log_end = info.offsets.log_end,
                "following"
            );
            partition.role = Role::Follower {
                task,
                high_watermark,
            };
        }
    }

    /// The replicas this shard holds that `keep` picks: key, log and high watermark, taken out
    /// of the partitions' map so the housekeeping that follows holds no borrow of it.
    fn replicas_where(
        &self,
        keep: impl Fn(&Partition) -> bool,
    ) -> Vec<((String, u32), LogHandle, u64)> {
        self.partitions
            .borrow()
            .iter()
            .filter(|(_, partition)| keep(partition))
            .map(|(key, partition)| {
                (
                    key.clone(),
                    partition.log.clone(),
                    partition.high_watermark(),
                )
            })
            .collect()
    }

    /// Enforces retention (`retention.ms`, `retention.bytes`) on every replica this shard holds,
    /// once per `retention_check_interval`: each replica below its own high watermark, so a
    /// leader never deletes what a follower in the ISR may still fetch, nor what consumers
    /// have not been allowed to see.
    pub(in crate::server) async fn retention_ticks(self: Rc<Self>) {
        let mut interval = self
            .clock()
            .ticks(self.context.config.retention_check_interval);
        // The first tick is immediate; a node just started has nothing new to expire.
        interval.tick().await;
        loop {
            interval.tick().await;
            let replicas = self.replicas_where(|_| true);
            for ((topic, partition), log, high_watermark) in replicas {
                match log.enforce_retention(high_watermark).await {
                    Ok(report) if report.deleted_segments > 0 => tracing::info!(
                        %topic,
                        partition,
                        segments = report.deleted_segments,
                        bytes = report.deleted_bytes,
                        "retention deleted old segments"
                    ),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%topic, partition, "enforcing retention: {error}")
                    }
                }
            }
        }
    }

    /// Cleans this shard's compacted partitions, one at a time, each below its own high
    /// watermark (a leader and each follower compact their own logs, as Kafka's replicas do).
    /// One key map serves every clean of the shard: its memory is the shard's whole budget.
    pub(in crate::server) async fn cleaner_ticks(self: Rc<Self>) {
        let config = self.context.config.cleaner.clone();
        let mut interval = self.clock().ticks(config.check_interval);
        let shards = self.context.config.shards.max(1);
        let mut resources: Option<CleanerResources> = None;
        loop {
            interval.tick().await;
            let replicas = self.replicas_where(|partition| partition.compacted);
            self.metrics
                .retain_compaction(|key| replicas.iter().any(|(held, _, _)| held == key));
            for ((topic, partition), log, high_watermark) in replicas {
                let mut lent = resources.take().unwrap_or_else(|| CleanerResources {
                    map: OffsetMap::with_memory(config.memory_bytes),
                    throttle: None,
                });
                // The rate as set live, else as the broker started: this shard's share.
                let rate = self
                    .view
                    .borrow()
                    .dynamic
                    .number(CLEANER_IO_RATE)
                    .or(config.io_bytes_per_sec);
                RecoveryThrottle::retune(
                    &mut lent.throttle,
                    rate.map(|rate| RecoveryThrottle::shard_share(rate, shards)),
                    self.clock().now(),
                );
                let started = self.clock().now();
                let answer = match log.clean(high_watermark, lent).await {
                    Ok(answer) => answer,
                    // The log task stopped (the replica was closed): its resources went with it.
                    Err(_) => continue,
                };
                resources = Some(answer.resources);
                let mut uncleanable = answer.status.uncleanable.map(str::to_string);
                match answer.report {
                    None => {}
                    Some(Ok(report)) => {
                        self.metrics.cleaned(&report.stats, started.elapsed());
                        tracing::info!(
                            %topic,
                            partition,
                            swapped = report.swapped,
                            replaced = report.replaced,
                            bytes_before = report.bytes_before,
                            bytes_after = report.bytes_after,
                            records_removed = report.stats.records_removed,
                            discarded = report.discarded,
                            took_ms = started.elapsed().as_millis() as u64,
                            "cleaned"
                        );
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%topic, partition, "cleaning: {error}");
                        uncleanable = Some(error.to_string());
                    }
                }
                self.metrics.compaction(
                    &topic,
                    partition,
                    PartitionCompaction {
                        dirty_ratio: answer.status.dirty_ratio,
                        clean_offset: answer.status.clean_offset,
                        uncleanable,
                    },
                );
            }
        }
    }

    /// Every shard's replication clock: lagging followers leave the ISR, high watermarks are
    /// checkpointed.
    pub(in crate::server) async fn replication_ticks(self: Rc<Self>) {
        let mut interval = self.clock().ticks(TICK);
        loop {
            interval.tick().await;
            let now = self.clock().monotonic_ms();
            let mut proposals = Vec::new();
            {
                let mut partitions = self.partitions.borrow_mut();
                for (key, partition) in partitions.iter_mut() {
                    if let Role::Leader(leader) = &mut partition.role
                        && let Some(proposal) = leader.handle_tick(now)
                    {
                        proposals.push((key.clone(), proposal));
                    }
                    let high_watermark = partition.high_watermark();
                    if high_watermark != partition.high_watermark_checkpointed
                        && partition.high_watermark_checkpointed_at.elapsed()
                            >= Duration::from_millis(HIGH_WATERMARK_CHECKPOINT_MS)
                    {
                        partition.log.checkpoint_high_watermark(high_watermark);
                        partition.high_watermark_checkpointed = high_watermark;
                        partition.high_watermark_checkpointed_at = self.clock().now();
                    }
                }
            }
            for (key, proposal) in proposals {
                self.propose_isr(&key, proposal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::replica_fetch_wait_ms;

    #[test]
    fn a_caught_up_follower_long_polls_well_inside_the_lag_time() {
        assert_eq!(
            replica_fetch_wait_ms(10_000),
            2_500,
            "Kafka's default lag time"
        );
        assert_eq!(replica_fetch_wait_ms(2_000), 500);
        assert_eq!(replica_fetch_wait_ms(100), 500, "never a busy loop");
        for lag in [2_000, 3_000, 10_000, 30_000, 600_000] {
            assert!(u64::from(replica_fetch_wait_ms(lag)) * 4 <= lag);
        }
    }
}
