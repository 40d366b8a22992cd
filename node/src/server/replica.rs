//! The shard's side of replication: each replica partition's role, the follower's fetch loop
//! over QUIC, the leader's answer to follower fetches, `acks=all`, ISR changes and ticks.
//!
//! The decisions are the sans-IO core's (`crate::replication`); this module moves bytes and
//! messages: QUIC streams, log commands, coordinator writes through the control thread.
//! Everything here runs on the partition's owning shard; a partition's state is borrowed only
//! between awaits.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_coordinator::placement::NO_LEADER;
use strata_coordinator::{PartitionChange, PartitionState};
use strata_wire::batch::BatchHeader;
use strata_wire::protocol::{
    DivergingEpoch, ErrorCode, Records, ReplicaFetchRequest, ReplicaFetchResponse, Request,
    Response,
};
use tokio::sync::{Notify, oneshot};

use super::control::ControlMessage;
use super::quic::{self, QuicError, ReplicaFetchAnswer};
use super::shard::{Shard, ShardMessage, shard_of};
use crate::io::DIRECT_BLOCK;
use crate::log::LogError;
use crate::log::writer::{self, LogHandle, ReplicatedBatches};
use crate::replication::{
    AckError, Divergence, IsrProposal, Leader, LeaderConfig, RecoveryThrottle, ReplicaFetchError,
};

/// Answered when the high watermark passes an `acks=all` produce.
pub(super) type AckWaiter = oneshot::Sender<Result<(), AckError>>;

/// The most a follower asks for in one fetch.
const REPLICA_FETCH_BYTES_MAX: u32 = 8 << 20;
/// A follower fetches ahead only after answers this large: it is catching up a backlog. Below
/// it, the next fetch follows the write, so the leader learns of the write at once (the
/// `acks=all` path).
const FETCH_AHEAD_BYTES_MIN: u64 = REPLICA_FETCH_BYTES_MAX as u64 / 2;
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

pub(super) enum Role {
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
pub(super) struct Partition {
    pub log: LogHandle,
    /// The partition state this replica acts on (leader, epoch, ISR).
    pub state: PartitionState,
    pub max_message_bytes: usize,
    pub leader_config: LeaderConfig,
    /// `flush=always`: an append counts (for acks and the high watermark) once synced.
    pub flush_always: bool,
    /// The topic's config overrides these settings came from (a change re-applies them).
    pub overrides: BTreeMap<String, String>,
    /// The topic's own limit on catch-up replication (`replica.recovery.bytes.per.sec`).
    pub recovery_bytes_per_sec: Option<u64>,
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

pub(super) fn ack_error_code(error: AckError) -> ErrorCode {
    match error {
        AckError::NotEnoughReplicas { .. } => ErrorCode::NotEnoughReplicas,
        AckError::NotEnoughReplicasAfterAppend { .. } => ErrorCode::NotEnoughReplicasAfterAppend,
        AckError::NotLeader => ErrorCode::NotLeader,
    }
}

fn fetch_error_code(error: ReplicaFetchError) -> ErrorCode {
    match error {
        ReplicaFetchError::NotAReplica(_) => ErrorCode::NotReplica,
        ReplicaFetchError::FencedLeaderEpoch { .. } => ErrorCode::FencedLeaderEpoch,
        ReplicaFetchError::UnknownLeaderEpoch { .. } => ErrorCode::UnknownLeaderEpoch,
    }
}

fn replica_fetch_error(
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

impl Shard {
    /// Puts the replica of `key` into the role `state` asks for. The log is open.
    pub(super) async fn assume_role(self: &Rc<Self>, key: &(String, u32), state: &PartitionState) {
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
                        writer::system_clock_ms(),
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
        let now = writer::system_clock_ms();
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
            let task = tokio::task::spawn_local(self.clone().follow(
                key.clone(),
                state.leader,
                state.leader_epoch,
                log.clone(),
                high_watermark.clone(),
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

    /// Where the leader's owning shard takes replication fetches for this partition.
    fn replication_target(
        &self,
        leader: i32,
        topic: &str,
        partition: u32,
    ) -> Option<(SocketAddr, String)> {
        let view = self.view.borrow();
        let broker = view.brokers.iter().find(|broker| broker.id == leader)?;
        let shard = shard_of(topic, partition, broker.replication_ports.len().max(1));
        let port = *broker.replication_ports.get(shard)?;
        // The broker's identity (TLS server name) is its advertised host wherever it replicates.
        let host = broker.replication_host.as_deref().unwrap_or(&broker.host);
        let addr = format!("{host}:{port}").parse().ok().or_else(|| {
            use std::net::ToSocketAddrs;
            (host, port).to_socket_addrs().ok()?.next()
        })?;
        Some((addr, broker.host.clone()))
    }

    /// The follower's loop: fetch from the leader, truncate where the leader says the logs
    /// diverge, append what it sends verbatim, repeat. Runs until its role ends (aborted).
    ///
    /// While the follower is behind (the answer ends below the leader's log end), the next
    /// fetch goes out before the answer is written, so the link moves bytes while the disk
    /// takes them. That fetch reports the log end as it was, so the leader counts only what is
    /// written; a caught-up follower fetches after each write, which reports it at once.
    async fn follow(
        self: Rc<Self>,
        key: (String, u32),
        leader: i32,
        epoch: u32,
        log: LogHandle,
        high_watermark: Rc<Cell<u64>>,
    ) {
        let (topic, partition) = key.clone();
        let mut failures = 0u32;
        let backoff = |failures: &mut u32| {
            *failures += 1;
            Duration::from_millis(50 * u64::from((*failures).min(10)))
        };
        // Each pass starts from what the log says it holds: at the start, and after anything
        // other than a clean append.
        'resync: loop {
            let Some((addr, host)) = self.replication_target(leader, &topic, partition) else {
                tokio::time::sleep(backoff(&mut failures)).await;
                continue;
            };
            let info = match log.replica_info().await {
                Ok(info) => info,
                Err(error) => {
                    tracing::error!(%topic, partition, "follower stops: {error}");
                    return;
                }
            };
            let mut log_end = info.offsets.log_end;
            let mut last_epoch = info.latest_epoch;
            let mut ahead: Option<FetchAhead> = None;
            loop {
                let (started, result) = match ahead.take() {
                    Some(mut ahead) => (ahead.started, ahead.answer().await),
                    None => {
                        let request =
                            self.follower_fetch(&key, epoch, log_end, last_epoch, log_end);
                        let started = Instant::now();
                        let Some(quic) = self.quic.as_ref() else {
                            return;
                        };
                        let phase = log.direct_phase();
                        (
                            started,
                            quic.replica_fetch(addr, &host, request, phase).await,
                        )
                    }
                };
                let (mut response, placed) = match result {
                    Ok(answer) => (answer.response, answer.placed),
                    Err(error) => {
                        if failures.is_multiple_of(20) {
                            tracing::warn!(%topic, partition, leader, "replication fetch failed: {error}");
                        }
                        if let QuicError::Malformed { .. } = error {
                            tracing::error!(%topic, partition, "{error}");
                        }
                        tokio::time::sleep(backoff(&mut failures)).await;
                        continue 'resync;
                    }
                };
                match response.error {
                    ErrorCode::None => {}
                    ErrorCode::OffsetOutOfRange if response.log_start_offset > log_end => {
                        // The leader's retention removed what we would fetch next.
                        tracing::warn!(%topic, partition, from = log_end, to = response.log_start_offset,
                            "the leader no longer holds our log end: starting over at its log start");
                        if let Err(error) = log.restart_at(response.log_start_offset).await {
                            tracing::error!(%topic, partition, "follower stops: {error}");
                            return;
                        }
                        continue 'resync;
                    }
                    error => {
                        // Not (yet) the leader, or a different epoch: the state will change.
                        if failures.is_multiple_of(20) {
                            tracing::info!(%topic, partition, leader, epoch, "leader refused the fetch: {error}");
                        }
                        tokio::time::sleep(backoff(&mut failures)).await;
                        continue 'resync;
                    }
                }
                failures = 0;
                if let Some(diverging) = response.diverging {
                    let divergence = Divergence {
                        epoch: u32::try_from(diverging.epoch).ok(),
                        end_offset: diverging.end_offset,
                    };
                    match log.truncate_diverged(divergence).await {
                        Ok(end) => {
                            tracing::warn!(%topic, partition, from = log_end, to = end, ?divergence,
                                "log diverged from the leader's: truncated");
                            high_watermark.set(high_watermark.get().min(end));
                        }
                        Err(error) => {
                            tracing::error!(%topic, partition, "follower stops: truncation failed: {error}");
                            return;
                        }
                    }
                    continue 'resync;
                }
                let records = match placed {
                    Some(placed) => ReplicatedBatches::Placed(placed),
                    None => ReplicatedBatches::Bytes(
                        std::mem::replace(&mut response.records, Records::empty()).freeze(),
                    ),
                };
                if !records.as_slice().is_empty() {
                    let bytes = records.as_slice().len() as u64;
                    let answered_us = started.elapsed().as_micros();
                    let last = last_batch_header(records.as_slice());
                    if let Some(last) = &last
                        && last.next_offset() < response.log_end_offset
                        && bytes >= FETCH_AHEAD_BYTES_MIN
                    {
                        let request = self.follower_fetch(
                            &key,
                            epoch,
                            last.next_offset(),
                            Some(last.leader_epoch),
                            log_end,
                        );
                        // Where these records will leave the log's last block (a roll in
                        // between only costs that answer's placement: it is copied instead).
                        let phase = log
                            .direct_phase()
                            .map(|phase| (phase + bytes as usize) % DIRECT_BLOCK);
                        ahead = Some(FetchAhead::send(&self, addr, host.clone(), request, phase));
                    }
                    match log.append_replicated(records).await {
                        Ok(appended) => {
                            tracing::trace!(%topic, partition, bytes, answered_us, appended_us = started.elapsed().as_micros(), "replicated");
                            log_end = appended.last_offset + 1;
                            last_epoch = last.map(|header| header.leader_epoch).or(last_epoch);
                            self.metrics.replicated(
                                &topic,
                                bytes,
                                started.elapsed().as_micros() as u64,
                            );
                        }
                        Err(LogError::NotContiguous { .. }) => continue 'resync,
                        Err(error) => {
                            tracing::error!(%topic, partition, "follower stops: append failed: {error}");
                            return;
                        }
                    }
                }
                let known = response.high_watermark.min(log_end);
                if known > high_watermark.get() {
                    high_watermark.set(known);
                }
            }
        }
    }

    fn follower_fetch(
        &self,
        (topic, partition): &(String, u32),
        epoch: u32,
        fetch_offset: u64,
        last_fetched_epoch: Option<u32>,
        log_end: u64,
    ) -> ReplicaFetchRequest {
        debug_assert!(log_end <= fetch_offset);
        ReplicaFetchRequest {
            replica_id: self.context.config.node_id,
            topic: topic.clone(),
            partition: *partition,
            leader_epoch: epoch,
            fetch_offset,
            last_fetched_epoch: last_fetched_epoch.map_or(-1, i64::from),
            log_end,
            max_bytes: REPLICA_FETCH_BYTES_MAX,
            max_wait_ms: replica_fetch_wait_ms(self.context.config.replica_lag_time_max_ms),
        }
    }

    /// A follower's fetch, on any shard: forwarded to the owner.
    pub(super) async fn replica_fetch(
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

    pub(super) async fn replica_fetch_local(
        self: &Rc<Self>,
        request: ReplicaFetchRequest,
    ) -> ReplicaFetchResponse {
        let key = (request.topic.clone(), request.partition);
        let started = Instant::now();
        if request.log_end > request.fetch_offset {
            // A follower cannot hold what it has not fetched.
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
            let now = writer::system_clock_ms();
            if let Some(latency_us) = leader.time_follower_progress(
                request.replica_id,
                request.log_end,
                super::metrics::monotonic_us(),
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
            partition.settle(before);
            proposal
        };
        // Outside the borrow: proposing reads the partition too.
        if let Some(proposal) = proposal {
            // Only registered brokers join the ISR: a node whose lease lapsed is out of the
            // cluster (the controller would remove it again, and again).
            let live = self
                .view
                .borrow()
                .brokers
                .iter()
                .any(|broker| broker.id == request.replica_id);
            if live {
                self.propose_isr(&key, proposal);
            } else {
                let mut partitions = self.partitions.borrow_mut();
                if let Some(Role::Leader(leader)) = partitions.get_mut(&key).map(|p| &mut p.role) {
                    leader.handle_isr_refused(&proposal);
                }
            }
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
    async fn hold_catch_up(&self, topic: &str, topic_rate: Option<u64>) -> Option<u64> {
        {
            let mut topics = self.topic_recovery_throttles.borrow_mut();
            match topic_rate {
                Some(rate) => {
                    let share = RecoveryThrottle::shard_share(rate, self.context.config.shards);
                    if topics
                        .get(topic)
                        .is_none_or(|throttle| throttle.bytes_per_sec() != share)
                    {
                        topics.insert(
                            topic.to_string(),
                            RecoveryThrottle::new(share, Instant::now()),
                        );
                    }
                }
                None => {
                    topics.remove(topic);
                }
            }
        }
        if self.recovery_throttle.is_none() && topic_rate.is_none() {
            return None;
        }
        let held = Instant::now();
        loop {
            let now = Instant::now();
            let node = self
                .recovery_throttle
                .as_ref()
                .map_or(Duration::ZERO, |throttle| throttle.borrow_mut().delay(now));
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
            .as_ref()
            .map(|throttle| throttle.borrow().capacity());
        let topic_most = self
            .topic_recovery_throttles
            .borrow()
            .get(topic)
            .map(RecoveryThrottle::capacity);
        node_most.into_iter().chain(topic_most).min()
    }

    /// Charges a catch-up answer's bytes to the limits that held it.
    fn charge_catch_up(&self, topic: &str, bytes: u64) {
        let now = Instant::now();
        if let Some(throttle) = &self.recovery_throttle {
            throttle.borrow_mut().charge(bytes, now);
        }
        if let Some(throttle) = self.topic_recovery_throttles.borrow_mut().get_mut(topic) {
            throttle.charge(bytes, now);
        }
    }

    fn leader_high_watermark(&self, key: &(String, u32), epoch: u32) -> Option<u64> {
        let partitions = self.partitions.borrow();
        let partition = partitions.get(key)?;
        if !partition.is_leader_at(epoch) {
            return None;
        }
        partition.leader_high_watermark()
    }

    /// Writes an ISR change through the control thread, then tells the leader the outcome.
    pub(super) fn propose_isr(self: &Rc<Self>, key: &(String, u32), proposal: IsrProposal) {
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

    /// Enforces retention (`retention.ms`, `retention.bytes`) on every replica this shard holds,
    /// once per `retention_check_interval`: each replica below its own high watermark, so a
    /// leader never deletes what a follower in the ISR may still fetch, nor what consumers
    /// have not been allowed to see.
    pub(super) async fn retention_ticks(self: Rc<Self>) {
        let mut interval = tokio::time::interval(self.context.config.retention_check_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; a node just started has nothing new to expire.
        interval.tick().await;
        loop {
            interval.tick().await;
            let replicas: Vec<((String, u32), LogHandle, u64)> = self
                .partitions
                .borrow()
                .iter()
                .map(|(key, partition)| {
                    (
                        key.clone(),
                        partition.log.clone(),
                        partition.high_watermark(),
                    )
                })
                .collect();
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

    /// Every shard's replication clock: lagging followers leave the ISR, high watermarks are
    /// checkpointed.
    pub(super) async fn replication_ticks(self: Rc<Self>) {
        let mut interval = tokio::time::interval(TICK);
        loop {
            interval.tick().await;
            let now = writer::system_clock_ms();
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
                        partition.high_watermark_checkpointed_at = Instant::now();
                    }
                }
            }
            for (key, proposal) in proposals {
                self.propose_isr(&key, proposal);
            }
        }
    }

    /// Accepts peers' QUIC connections and answers each stream's request.
    pub(super) async fn serve_replication(self: Rc<Self>) {
        let Some(quic) = self.quic.as_ref() else {
            return;
        };
        let endpoint = quic.endpoint().clone();
        while let Some(incoming) = endpoint.accept().await {
            let shard = self.clone();
            tokio::task::spawn_local(async move {
                let connection = match incoming.await {
                    Ok(connection) => connection,
                    Err(error) => {
                        tracing::debug!("replication handshake failed: {error}");
                        return;
                    }
                };
                let peer = connection.remote_address();
                while let Ok((mut send, mut receive)) = connection.accept_bi().await {
                    let shard = shard.clone();
                    tokio::task::spawn_local(async move {
                        let max = shard.context.config.max_frame_bytes;
                        let (correlation_id, request) =
                            match quic::read_request(&mut receive, max).await {
                                Ok(request) => request,
                                Err(reason) => {
                                    tracing::warn!(%peer, "closing replication stream: {reason}");
                                    let _ = send.reset(1u32.into());
                                    return;
                                }
                            };
                        let response = match request {
                            Request::ReplicaFetch(request) => {
                                Response::ReplicaFetch(shard.replica_fetch(request).await)
                            }
                            other => {
                                tracing::warn!(%peer, api = ?other.api_key(), "closing replication stream: not a replication request");
                                let _ = send.reset(1u32.into());
                                return;
                            }
                        };
                        quic::write_response(&mut send, response.encode(correlation_id)).await;
                    });
                }
            });
        }
    }
}

/// A follower's fetch sent before the previous answer is written. Dropping it (a resync, the
/// role ending) abandons the request.
struct FetchAhead {
    started: Instant,
    task: tokio::task::JoinHandle<Result<ReplicaFetchAnswer, QuicError>>,
    addr: SocketAddr,
}

impl FetchAhead {
    fn send(
        shard: &Rc<Shard>,
        addr: SocketAddr,
        host: String,
        request: ReplicaFetchRequest,
        records_phase: Option<usize>,
    ) -> Self {
        let shard = shard.clone();
        let task = tokio::task::spawn_local(async move {
            match shard.quic.as_ref() {
                Some(quic) => {
                    quic.replica_fetch(addr, &host, request, records_phase)
                        .await
                }
                None => Err(QuicError::Stream {
                    addr,
                    reason: "no replication endpoint".into(),
                }),
            }
        });
        FetchAhead {
            started: Instant::now(),
            task,
            addr,
        }
    }

    async fn answer(&mut self) -> Result<ReplicaFetchAnswer, QuicError> {
        (&mut self.task).await.unwrap_or_else(|error| {
            Err(QuicError::Stream {
                addr: self.addr,
                reason: error.to_string(),
            })
        })
    }
}

impl Drop for FetchAhead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The header of the last whole batch in a fetch answer; `None` when a header does not parse
/// (the append that follows reports why).
fn last_batch_header(records: &[u8]) -> Option<BatchHeader> {
    let mut at = 0;
    let mut last = None;
    while at < records.len() {
        let header = BatchHeader::parse(&records[at..]).ok()?;
        at += header.batch_len as usize;
        if at > records.len() {
            return None;
        }
        last = Some(header);
    }
    last
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
