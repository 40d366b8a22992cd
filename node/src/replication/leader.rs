//! A partition leader's replication state: ISR, follower progress, high watermark, waiting acks.
//!
//! Call order: [`Leader::new`] when this replica becomes leader at an epoch; then, in any order,
//! [`Leader::handle_appended`] after each local append is as durable as the flush policy says,
//! [`Leader::handle_fetch`] for each follower fetch, [`Leader::handle_tick`] periodically, and
//! the ISR outcome calls after a proposed change was written (or refused) by the coordinator.
//! After each, [`Leader::poll_acks`] yields the `acks=all` requests that are now answered.

use std::collections::VecDeque;

use super::append_times::AppendTimes;

/// Knobs of one partition's replication (topic config and broker settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderConfig {
    /// A follower not caught up for longer than this leaves the ISR (`replica.lag.time.max.ms`).
    pub lag_time_max_ms: i64,
    /// `acks=all` needs at least this many in-sync replicas (`min.insync.replicas`).
    pub min_insync_replicas: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Progress {
    replica: i32,
    /// The follower's log end offset (its last fetch offset); unknown until it fetches.
    log_end: Option<u64>,
    /// Everything below it is synced on the follower's disk, as of its last fetch.
    synced: u64,
    /// The follower's log start, as of its last fetch.
    log_start: u64,
    last_fetch_ms: i64,
    /// The leader's log end at the follower's previous fetch.
    leader_end_at_last_fetch: u64,
    last_caught_up_ms: i64,
}

/// Why a follower's fetch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaFetchError {
    #[error("replica {0} is not assigned to this partition")]
    NotAReplica(i32),
    /// The follower follows an older leader epoch: it must learn the new state first.
    #[error("the follower's leader epoch {follower} is older than {leader}")]
    FencedLeaderEpoch { follower: u32, leader: u32 },
    /// The follower knows a newer epoch than this leader: this leader is stale.
    #[error("the follower's leader epoch {follower} is newer than {leader}")]
    UnknownLeaderEpoch { follower: u32, leader: u32 },
    /// The fetch reports progress it cannot have: a log end past what it fetches, or a synced
    /// offset or log start past its log end.
    #[error("the follower reports progress past what it fetched")]
    ImpossibleProgress,
}

/// A follower's fetch, as the leader's decisions need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerFetch {
    pub replica: i32,
    pub leader_epoch: u32,
    pub fetch_offset: u64,
    pub last_fetched_epoch: Option<u32>,
    /// The follower's log holds everything below it (its progress).
    pub log_end: u64,
    /// What the follower has synced, and where its log starts.
    pub synced: u64,
    pub log_start: u64,
}

impl FollowerFetch {
    /// A follower cannot hold what it has not fetched, nor sync what it does not hold.
    fn reports_what_it_can(&self) -> bool {
        self.log_end <= self.fetch_offset
            && self.synced <= self.log_end
            && self.log_start <= self.log_end
    }
}

/// How a follower's fetch is answered, before the log is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedFetch {
    /// The follower's log may have left this one: ask the log ([`crate::replication::diverging`]
    /// over its epoch cache), then call [`Leader::handle_divergence_checked`].
    CheckDivergence,
    Serve(Serve),
}

/// How a follower's fetch is answered once the log was checked for a divergence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckedFetch {
    /// Answer with where the logs part; the follower truncates there.
    Diverging(super::Divergence),
    /// The fetch offset is outside the leader's log.
    OutOfRange,
    Serve(Serve),
}

/// A fetch to serve from the log: the follower's progress is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serve {
    pub high_watermark: u64,
    /// An ISR expansion to write through the coordinator (then call `handle_isr_committed`).
    pub propose_isr: Option<IsrProposal>,
    /// The follower is outside the ISR: its answer is held to the catch-up throttles.
    pub catching_up: bool,
    /// How long the records it newly holds took to reach it (see
    /// [`Leader::time_follower_progress`]).
    pub latency_us: Option<u64>,
}

/// Why an `acks=all` produce is refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// Before the append: the ISR is below `min.insync.replicas`, nothing was written.
    #[error("{isr} in-sync replicas, {min} required")]
    NotEnoughReplicas { isr: usize, min: usize },
    /// The records were written and committed, but the ISR shrank below the minimum meanwhile.
    #[error("written, but only {isr} in-sync replicas remain ({min} required)")]
    NotEnoughReplicasAfterAppend { isr: usize, min: usize },
    /// Leadership moved before the high watermark reached the records.
    #[error("no longer the leader")]
    NotLeader,
}

/// An ISR change the leader wants stored: `isr` replacing the state at `partition_epoch`. The
/// coordinator stores it only if the partition is still at that epoch (fencing), and the answer
/// names the proposal so that a late answer to an older one is told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrProposal {
    pub isr: Vec<i32>,
    pub partition_epoch: u64,
}

/// What a follower's fetch changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchProgress {
    /// The high watermark to tell the follower.
    pub high_watermark: u64,
    /// An ISR expansion to write through the coordinator (then call `handle_isr_committed`).
    pub propose_isr: Option<IsrProposal>,
}

pub struct Leader<W> {
    id: i32,
    epoch: u32,
    partition_epoch: u64,
    config: LeaderConfig,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    followers: Vec<Progress>,
    /// The leader's own log end offset, as far as it is durable per the flush policy.
    log_end: u64,
    /// The log end when this epoch began: a follower must reach it to join the ISR, so that no
    /// ISR member lacks records of the previous epochs that this leader kept.
    epoch_start_offset: u64,
    high_watermark: u64,
    isr_change_in_flight: Option<IsrProposal>,
    /// `acks=all` produces by the last offset they wrote, in offset order.
    waiting: VecDeque<(u64, W)>,
    answered: Vec<(W, Result<(), AckError>)>,
    /// When recent local appends completed, to time followers' progress.
    append_times: AppendTimes,
}

impl<W> Leader<W> {
    /// Takes over at `epoch` with the ISR the coordinator holds and the log as it is.
    /// `high_watermark` is the checkpointed one (clamped to the log); it advances once the ISR's
    /// followers report their progress.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: i32,
        epoch: u32,
        partition_epoch: u64,
        replicas: Vec<i32>,
        isr: Vec<i32>,
        log_end: u64,
        high_watermark: u64,
        config: LeaderConfig,
        now_ms: i64,
    ) -> Leader<W> {
        assert!(
            replicas.contains(&id),
            "leader {id} is not a replica of {replicas:?}"
        );
        assert!(isr.contains(&id), "leader {id} is not in the ISR {isr:?}");
        assert!(isr.iter().all(|member| replicas.contains(member)));
        let followers = replicas
            .iter()
            .filter(|&&replica| replica != id)
            .map(|&replica| Progress {
                replica,
                log_end: None,
                synced: 0,
                log_start: 0,
                last_fetch_ms: now_ms,
                leader_end_at_last_fetch: log_end,
                // A new leader gives every follower a full lag period to show up.
                last_caught_up_ms: now_ms,
            })
            .collect();
        let mut leader = Leader {
            id,
            epoch,
            partition_epoch,
            config,
            replicas,
            isr,
            followers,
            log_end,
            epoch_start_offset: log_end,
            high_watermark: high_watermark.min(log_end),
            isr_change_in_flight: None,
            waiting: VecDeque::new(),
            answered: Vec::new(),
            append_times: AppendTimes::default(),
        };
        leader.advance_high_watermark();
        leader
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn partition_epoch(&self) -> u64 {
        self.partition_epoch
    }

    pub fn isr(&self) -> &[i32] {
        &self.isr
    }

    pub fn replicas(&self) -> &[i32] {
        &self.replicas
    }

    pub fn high_watermark(&self) -> u64 {
        self.high_watermark
    }

    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    /// Whether the high watermark has reached the log end this epoch began at. Until then it
    /// may be behind one an earlier leader answered with (a follower learns the high watermark
    /// a fetch late), so offsets named from it would go backwards for a reader; from then on
    /// it is at least every earlier leader's, since every ISR member then holds all this
    /// leader's records from earlier epochs, and those hold every record committed before.
    pub fn high_watermark_settled(&self) -> bool {
        self.high_watermark >= self.epoch_start_offset
    }

    /// Replicas assigned but out of the ISR.
    pub fn under_replicated(&self) -> bool {
        self.isr.len() < self.replicas.len()
    }

    /// Each follower's last reported log end (None before its first fetch).
    pub fn follower_log_ends(&self) -> impl Iterator<Item = (i32, Option<u64>)> + '_ {
        self.followers.iter().map(|p| (p.replica, p.log_end))
    }

    /// New settings (the topic's config was altered). They judge the next produce and the next
    /// acks answered; acknowledgements waiting for the high watermark keep waiting for it.
    pub fn set_config(&mut self, config: LeaderConfig) {
        self.config = config;
    }

    /// Whether an `acks=all` produce may be appended now.
    pub fn check_acks_all(&self) -> Result<(), AckError> {
        if self.isr.len() < self.config.min_insync_replicas {
            return Err(AckError::NotEnoughReplicas {
                isr: self.isr.len(),
                min: self.config.min_insync_replicas,
            });
        }
        Ok(())
    }

    /// A local append is durable up to `log_end` (exclusive).
    pub fn handle_appended(&mut self, log_end: u64) {
        assert!(
            log_end >= self.log_end,
            "leader log end went back: {} → {log_end}",
            self.log_end
        );
        self.log_end = log_end;
        self.advance_high_watermark();
    }

    /// Waits for the high watermark to pass `last_offset` (an `acks=all` produce). Call after
    /// the append. Appends complete in log order, but the tasks that then register their waits
    /// may run in any order (two requests, or two batches of one partition in one request), so
    /// the queue is kept sorted here: an assertion that they came in order turned such requests
    /// into panics, never answered (clients timed out after 30 s and sent them again).
    pub fn wait_for_commit(&mut self, last_offset: u64, waiter: W) {
        let at = self
            .waiting
            .partition_point(|(offset, _)| *offset <= last_offset);
        self.waiting.insert(at, (last_offset, waiter));
        self.answer_committed();
    }

    /// Whether `replica`, following `follower_epoch`, may fetch from this leader. Check it
    /// before looking for a divergence.
    pub fn validate_fetch(
        &self,
        replica: i32,
        follower_epoch: u32,
    ) -> Result<(), ReplicaFetchError> {
        if follower_epoch < self.epoch {
            return Err(ReplicaFetchError::FencedLeaderEpoch {
                follower: follower_epoch,
                leader: self.epoch,
            });
        }
        if follower_epoch > self.epoch {
            return Err(ReplicaFetchError::UnknownLeaderEpoch {
                follower: follower_epoch,
                leader: self.epoch,
            });
        }
        if !self.followers.iter().any(|p| p.replica == replica) {
            return Err(ReplicaFetchError::NotAReplica(replica));
        }
        Ok(())
    }

    /// A local append completed at `at_us` (a monotonic clock, µs) and the log now ends at
    /// `log_end`: followers' progress past it is timed from then
    /// ([`Leader::time_follower_progress`]).
    pub fn record_append_time(&mut self, log_end: u64, at_us: u64) {
        self.append_times.record(log_end, at_us);
    }

    /// A follower's fetch reports that its log ends at `follower_log_end`: the time since the
    /// oldest append among the records it newly holds completed here, in µs at `now_us`, where
    /// there are such records and that append is remembered (replication latency, as a
    /// dashboard charts it: an idle partition's long-polls add nothing). Call before
    /// [`Leader::handle_fetch`] counts the same progress.
    pub fn time_follower_progress(
        &mut self,
        replica: i32,
        follower_log_end: u64,
        now_us: u64,
    ) -> Option<u64> {
        let before = self
            .followers
            .iter()
            .find(|p| p.replica == replica)?
            .log_end?;
        let latency = self.append_times.reached(before, follower_log_end, now_us);
        let held_by_all = self
            .followers
            .iter()
            .map(|p| {
                if p.replica == replica {
                    follower_log_end
                } else {
                    p.log_end.unwrap_or(0)
                }
            })
            .min()
            .unwrap_or(follower_log_end);
        self.append_times.forget_through(held_by_all);
        latency
    }

    /// The steady state: the follower's last batch is of this leader's epoch and it holds no
    /// more than this leader has counted, so its log is a prefix of this one and the
    /// divergence check ([`crate::replication::diverging`], which needs the epoch cache) can
    /// be skipped. Only records this leader wrote carry its epoch.
    pub fn cannot_diverge(&self, fetch_offset: u64, last_fetched_epoch: Option<u32>) -> bool {
        last_fetched_epoch == Some(self.epoch) && fetch_offset <= self.log_end
    }

    /// A follower following `follower_epoch` fetches, and its log holds everything below
    /// `follower_log_end`. That is its progress, not where it reads from: a follower may fetch
    /// ahead of its log end while it writes the previous answer, and what it has only received
    /// is not counted. Call after [`crate::replication::diverging`] found no divergence.
    pub fn handle_fetch(
        &mut self,
        now_ms: i64,
        replica: i32,
        follower_epoch: u32,
        follower_log_end: u64,
    ) -> Result<FetchProgress, ReplicaFetchError> {
        self.validate_fetch(replica, follower_epoch)?;
        let log_end = self.log_end;
        let progress = self
            .followers
            .iter_mut()
            .find(|p| p.replica == replica)
            .expect("validated");
        // A follower may be ahead of this leader's durable end (it read written, unsynced
        // bytes); it has everything the leader has either way.
        if follower_log_end >= log_end {
            progress.last_caught_up_ms = now_ms;
        } else if follower_log_end >= progress.leader_end_at_last_fetch {
            // It now has what the leader had at its previous fetch: caught up as of then.
            progress.last_caught_up_ms = progress.last_caught_up_ms.max(progress.last_fetch_ms);
        }
        progress.log_end = Some(follower_log_end);
        progress.last_fetch_ms = now_ms;
        progress.leader_end_at_last_fetch = log_end;
        self.advance_high_watermark();
        let joins = !self.isr.contains(&replica)
            && follower_log_end >= self.high_watermark.max(self.epoch_start_offset);
        let propose_isr = (joins && self.isr_change_in_flight.is_none()).then(|| {
            let mut isr = self.isr.clone();
            isr.push(replica);
            isr.sort_unstable();
            let proposal = IsrProposal {
                isr,
                partition_epoch: self.partition_epoch,
            };
            self.isr_change_in_flight = Some(proposal.clone());
            proposal
        });
        Ok(FetchProgress {
            high_watermark: self.high_watermark,
            propose_isr,
        })
    }

    /// A follower's fetch arrives at `now_ms` (`now_us` on the clock appends are timed by):
    /// refused, served at once (the steady state, which skips the divergence check: a trip
    /// through the busy log task, and counts the follower's progress at once, which answers
    /// `acks=all`), or checked against the log first.
    pub fn plan_fetch(
        &mut self,
        now_ms: i64,
        now_us: u64,
        fetch: &FollowerFetch,
    ) -> Result<PlannedFetch, ReplicaFetchError> {
        if !fetch.reports_what_it_can() {
            return Err(ReplicaFetchError::ImpossibleProgress);
        }
        self.validate_fetch(fetch.replica, fetch.leader_epoch)?;
        if !self.cannot_diverge(fetch.fetch_offset, fetch.last_fetched_epoch) {
            return Ok(PlannedFetch::CheckDivergence);
        }
        self.count_fetch(now_ms, now_us, fetch)
            .map(PlannedFetch::Serve)
    }

    /// The log answered [`PlannedFetch::CheckDivergence`]: where the follower's log leaves this
    /// one (`divergence`), and the log's start and end as of the check. The leadership may have
    /// moved on meanwhile, so the fetch is validated again.
    pub fn handle_divergence_checked(
        &mut self,
        now_ms: i64,
        now_us: u64,
        fetch: &FollowerFetch,
        divergence: Option<super::Divergence>,
        (log_start, log_end): (u64, u64),
    ) -> Result<CheckedFetch, ReplicaFetchError> {
        self.validate_fetch(fetch.replica, fetch.leader_epoch)?;
        if let Some(divergence) = divergence {
            return Ok(CheckedFetch::Diverging(divergence));
        }
        if fetch.fetch_offset < log_start || fetch.fetch_offset > log_end {
            return Ok(CheckedFetch::OutOfRange);
        }
        self.count_fetch(now_ms, now_us, fetch)
            .map(CheckedFetch::Serve)
    }

    /// The follower's log holds everything below its log end: its progress is counted.
    fn count_fetch(
        &mut self,
        now_ms: i64,
        now_us: u64,
        fetch: &FollowerFetch,
    ) -> Result<Serve, ReplicaFetchError> {
        let latency_us = self.time_follower_progress(fetch.replica, fetch.log_end, now_us);
        let progress =
            self.handle_fetch(now_ms, fetch.replica, fetch.leader_epoch, fetch.log_end)?;
        self.handle_reported(fetch.replica, fetch.synced, fetch.log_start);
        Ok(Serve {
            high_watermark: progress.high_watermark,
            catching_up: !self.isr.contains(&fetch.replica),
            propose_isr: progress.propose_isr,
            latency_us,
        })
    }

    /// A follower's fetch also said what it has synced to disk and where its log starts
    /// (after [`Leader::handle_fetch`] accepted the fetch): counted in [`Leader::durability`]
    /// and [`Leader::in_sync_log_start`].
    pub fn handle_reported(&mut self, replica: i32, synced_offset: u64, log_start: u64) {
        if let Some(progress) = self.followers.iter_mut().find(|p| p.replica == replica) {
            // Never more than it holds: a report is only as good as the fetch it came with.
            progress.synced = synced_offset.min(progress.log_end.unwrap_or(0));
            progress.log_start = log_start;
        }
    }

    /// The lowest log start among the in-sync replicas, the leader's being `leader_start`
    /// (Kafka's low watermark): DeleteRecords is done once it reaches the offset asked.
    pub fn in_sync_log_start(&self, leader_start: u64) -> u64 {
        self.followers
            .iter()
            .filter(|p| self.isr.contains(&p.replica))
            .map(|p| p.log_start)
            .fold(leader_start, u64::min)
    }

    /// How far the records below `end` have got: the in-sync replicas holding them (the
    /// leader included) and how many of those have synced them (the leader when
    /// `leader_synced`). Followers count as of their last fetch.
    pub fn durability(&self, end: u64, leader_synced: bool) -> (u16, u16) {
        let mut replicas = 1;
        let mut synced = u16::from(leader_synced);
        for follower in &self.followers {
            if !self.isr.contains(&follower.replica) {
                continue;
            }
            if follower.log_end.is_some_and(|log_end| log_end >= end) {
                replicas += 1;
                if follower.synced >= end {
                    synced += 1;
                }
            }
        }
        (replicas, synced)
    }

    /// Time passes: proposes removing followers that have not caught up within the lag time.
    pub fn handle_tick(&mut self, now_ms: i64) -> Option<IsrProposal> {
        if self.isr_change_in_flight.is_some() {
            return None;
        }
        let lagging: Vec<i32> = self
            .followers
            .iter()
            .filter(|p| self.isr.contains(&p.replica))
            .filter(|p| now_ms - p.last_caught_up_ms > self.config.lag_time_max_ms)
            .map(|p| p.replica)
            .collect();
        if lagging.is_empty() {
            return None;
        }
        let isr: Vec<i32> = self
            .isr
            .iter()
            .copied()
            .filter(|member| !lagging.contains(member))
            .collect();
        debug_assert!(isr.contains(&self.id));
        let proposal = IsrProposal {
            isr,
            partition_epoch: self.partition_epoch,
        };
        self.isr_change_in_flight = Some(proposal.clone());
        Some(proposal)
    }

    /// The coordinator stored `proposal`; the partition is now at `partition_epoch`.
    pub fn handle_isr_committed(&mut self, proposal: &IsrProposal, partition_epoch: u64) {
        if partition_epoch <= self.partition_epoch {
            // The watch delivered the stored state first (`handle_state`).
            return;
        }
        // Only the proposal in flight can be stored: any other was based on an older
        // partition epoch, which the coordinator's compare refuses.
        assert_eq!(
            self.isr_change_in_flight.as_ref(),
            Some(proposal),
            "committed an ISR that was not proposed"
        );
        assert!(partition_epoch > proposal.partition_epoch);
        self.isr_change_in_flight = None;
        self.apply_isr(proposal.isr.clone(), partition_epoch);
    }

    /// The coordinator refused `proposal` (the partition changed meanwhile); the new state
    /// arrives through [`Leader::handle_state`] or a new leadership.
    pub fn handle_isr_refused(&mut self, proposal: &IsrProposal) {
        if self.isr_change_in_flight.as_ref() == Some(proposal) {
            self.isr_change_in_flight = None;
        }
    }

    /// The coordinator's state for this partition changed at the same leader epoch: the
    /// controller removed a dead broker from the ISR, or a reassignment added or removed
    /// replicas (a new one starts out of the ISR, with a full lag period to show up).
    pub fn handle_state(
        &mut self,
        replicas: Vec<i32>,
        isr: Vec<i32>,
        partition_epoch: u64,
        now_ms: i64,
    ) {
        if partition_epoch <= self.partition_epoch {
            return;
        }
        assert!(
            replicas.contains(&self.id),
            "the leader {} left the replicas",
            self.id
        );
        self.followers.retain(|p| replicas.contains(&p.replica));
        for replica in &replicas {
            if *replica != self.id && !self.followers.iter().any(|p| p.replica == *replica) {
                self.followers.push(Progress {
                    replica: *replica,
                    log_end: None,
                    synced: 0,
                    log_start: 0,
                    last_fetch_ms: now_ms,
                    leader_end_at_last_fetch: self.log_end,
                    last_caught_up_ms: now_ms,
                });
            }
        }
        self.replicas = replicas;
        // Whatever was proposed lost the race (or won it and this is its echo).
        self.isr_change_in_flight = None;
        self.apply_isr(isr, partition_epoch);
    }

    fn apply_isr(&mut self, isr: Vec<i32>, partition_epoch: u64) {
        assert!(
            isr.contains(&self.id),
            "the ISR {isr:?} lost its leader {}",
            self.id
        );
        assert!(partition_epoch >= self.partition_epoch);
        self.partition_epoch = partition_epoch;
        self.isr = isr;
        self.advance_high_watermark();
    }

    /// Leadership ended: every waiting produce fails with NOT_LEADER.
    pub fn resign(&mut self) {
        while let Some((_, waiter)) = self.waiting.pop_front() {
            self.answered.push((waiter, Err(AckError::NotLeader)));
        }
    }

    /// The `acks=all` produces answered since the last call.
    pub fn poll_acks(&mut self) -> std::vec::Drain<'_, (W, Result<(), AckError>)> {
        self.answered.drain(..)
    }

    fn advance_high_watermark(&mut self) {
        let mut candidate = self.log_end;
        // While a change is being written, the high watermark waits for every replica in
        // either the current or the proposed ISR (the "maximal ISR", as in Kafka's KIP-497):
        // if an expansion is stored but its answer is lost, the new member may be elected, so
        // it must already hold everything below the high watermark.
        let proposed = self
            .isr_change_in_flight
            .as_ref()
            .map_or(&[][..], |proposal| &proposal.isr[..]);
        for member in self.isr.iter().chain(proposed) {
            if *member == self.id {
                continue;
            }
            let progress = self.followers.iter().find(|p| p.replica == *member);
            match progress.and_then(|p| p.log_end) {
                Some(end) => candidate = candidate.min(end),
                // An ISR member that has not fetched since this leader took over holds the
                // high watermark where it is.
                None => candidate = candidate.min(self.high_watermark),
            }
        }
        // The ISR only ever holds replicas that had reached the high watermark, so the minimum
        // cannot fall below it; max() keeps a new leader's checkpointed value.
        self.high_watermark = self.high_watermark.max(candidate);
        debug_assert!(self.high_watermark <= self.log_end.max(self.high_watermark));
        self.answer_committed();
    }

    fn answer_committed(&mut self) {
        while let Some((last_offset, _)) = self.waiting.front() {
            if *last_offset >= self.high_watermark {
                break;
            }
            let (_, waiter) = self.waiting.pop_front().expect("front exists");
            let result = if self.isr.len() >= self.config.min_insync_replicas {
                Ok(())
            } else {
                Err(AckError::NotEnoughReplicasAfterAppend {
                    isr: self.isr.len(),
                    min: self.config.min_insync_replicas,
                })
            };
            self.answered.push((waiter, result));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: LeaderConfig = LeaderConfig {
        lag_time_max_ms: 100,
        min_insync_replicas: 2,
    };

    fn leader() -> Leader<u32> {
        Leader::new(1, 3, 10, vec![1, 2, 3], vec![1, 2, 3], 0, 0, CONFIG, 0)
    }

    #[test]
    fn high_watermark_is_the_isr_minimum_and_acks_wait_for_it() {
        let mut leader = leader();
        leader.handle_appended(10);
        leader.wait_for_commit(9, 7);
        assert_eq!(leader.high_watermark(), 0);
        leader.handle_fetch(1, 2, 3, 10).unwrap();
        assert_eq!(leader.high_watermark(), 0, "replica 3 has not fetched");
        assert_eq!(leader.poll_acks().count(), 0);
        let progress = leader.handle_fetch(2, 3, 3, 6).unwrap();
        assert_eq!(progress.high_watermark, 6);
        assert_eq!(leader.poll_acks().count(), 0);
        leader.handle_fetch(3, 3, 3, 10).unwrap();
        assert_eq!(leader.high_watermark(), 10);
        assert_eq!(leader.poll_acks().collect::<Vec<_>>(), vec![(7, Ok(()))]);
    }

    /// Durability counts the in-sync replicas holding the records and those that synced them,
    /// never a follower's sync beyond what it holds, and never a replica out of the ISR.
    #[test]
    fn durability_counts_in_sync_holders_and_their_syncs() {
        let mut leader = leader();
        leader.handle_appended(10);
        assert_eq!(
            leader.durability(10, false),
            (1, 0),
            "only the leader's page cache"
        );
        assert_eq!(leader.durability(10, true), (1, 1));
        leader.handle_fetch(1, 2, 3, 10).unwrap();
        leader.handle_reported(2, 4, 0);
        leader.handle_fetch(1, 3, 3, 8).unwrap();
        // A report of more synced than held counts only what is held.
        leader.handle_reported(3, 9, 0);
        assert_eq!(
            leader.durability(10, true),
            (2, 1),
            "replica 2 holds 10 but synced 4"
        );
        assert_eq!(
            leader.durability(8, true),
            (3, 2),
            "replica 3 synced what it holds, 8"
        );
        leader.handle_reported(2, 10, 0);
        assert_eq!(leader.durability(10, false), (2, 1));
        // A replica out of the ISR holds the records, but does not count.
        let shrink = IsrProposal {
            isr: vec![1, 2],
            partition_epoch: 10,
        };
        leader.isr_change_in_flight = Some(shrink.clone());
        leader.handle_isr_committed(&shrink, 11);
        assert_eq!(leader.durability(8, true), (2, 2));
    }

    /// The low watermark is the lowest log start among the in-sync replicas: a follower out of
    /// the ISR does not hold DeleteRecords back.
    #[test]
    fn the_in_sync_log_start_is_the_lowest_among_the_isr() {
        let mut leader = leader();
        leader.handle_appended(200);
        assert_eq!(leader.in_sync_log_start(150), 0, "followers not heard from");
        leader.handle_fetch(1, 2, 3, 200).unwrap();
        leader.handle_reported(2, 0, 150);
        leader.handle_fetch(1, 3, 3, 200).unwrap();
        leader.handle_reported(3, 0, 100);
        assert_eq!(leader.in_sync_log_start(150), 100);
        leader.handle_reported(3, 0, 160);
        assert_eq!(
            leader.in_sync_log_start(150),
            150,
            "the leader's own counts"
        );
        leader.handle_reported(3, 0, 20);
        let shrink = IsrProposal {
            isr: vec![1, 2],
            partition_epoch: 10,
        };
        leader.isr_change_in_flight = Some(shrink.clone());
        leader.handle_isr_committed(&shrink, 11);
        assert_eq!(leader.in_sync_log_start(150), 150);
    }

    /// A new leader knows the high watermark a fetch late: the previous leader may have
    /// answered up to its log end. Until every ISR member reports reaching the log end this
    /// epoch began at, the high watermark is not settled, however far it moves.
    #[test]
    fn a_new_leaders_high_watermark_settles_at_its_epoch_start() {
        // Log end 20, but only 12 was known committed when it was a follower.
        let mut leader: Leader<u32> =
            Leader::new(1, 4, 10, vec![1, 2, 3], vec![1, 2, 3], 20, 12, CONFIG, 0);
        assert_eq!(leader.high_watermark(), 12);
        assert!(!leader.high_watermark_settled());
        leader.handle_fetch(1, 2, 4, 20).unwrap();
        leader.handle_fetch(1, 3, 4, 16).unwrap();
        assert_eq!(leader.high_watermark(), 16);
        assert!(!leader.high_watermark_settled(), "replica 3 lacks 16..20");
        leader.handle_appended(25);
        leader.handle_fetch(2, 3, 4, 20).unwrap();
        assert_eq!(leader.high_watermark(), 20);
        assert!(leader.high_watermark_settled());
        // Alone in its ISR, a leader is settled at once.
        let alone: Leader<u32> = Leader::new(1, 4, 10, vec![1, 2], vec![1], 20, 12, CONFIG, 0);
        assert_eq!(alone.high_watermark(), 20);
        assert!(alone.high_watermark_settled());
    }

    /// Each follower's progress is timed from the append of the oldest records it newly holds,
    /// and an append is forgotten once every follower holds it.
    #[test]
    fn followers_progress_is_timed_from_the_leaders_appends() {
        let mut leader = leader();
        // Before a follower's first fetch its progress has no start to time from.
        assert_eq!(leader.time_follower_progress(2, 0, 50), None);
        leader.handle_fetch(1, 2, 3, 0).unwrap();
        leader.handle_fetch(1, 3, 3, 0).unwrap();
        leader.handle_appended(10);
        leader.record_append_time(10, 1_000);
        leader.handle_appended(20);
        leader.record_append_time(20, 1_400);
        // A long-poll answered empty: nothing new, no sample.
        assert_eq!(leader.time_follower_progress(2, 0, 9_000), None);
        assert_eq!(leader.time_follower_progress(2, 20, 2_000), Some(1_000));
        leader.handle_fetch(2, 2, 3, 20).unwrap();
        assert_eq!(leader.time_follower_progress(3, 10, 2_500), Some(1_500));
        leader.handle_fetch(2, 3, 3, 10).unwrap();
        // Replica 3 still lacks the second append: it is remembered for it.
        assert_eq!(leader.time_follower_progress(3, 20, 3_000), Some(1_600));
        leader.handle_fetch(3, 3, 3, 20).unwrap();
        assert!(leader.append_times.is_empty(), "every follower holds both");
    }

    /// Waits registered in any order are answered as the high watermark passes each one.
    #[test]
    fn acks_registered_out_of_order_are_answered_in_offset_order() {
        let mut leader = leader();
        leader.handle_appended(30);
        for (last_offset, waiter) in [(19, 2), (9, 1), (29, 3), (9, 4)] {
            leader.wait_for_commit(last_offset, waiter);
        }
        leader.handle_fetch(1, 2, 3, 15).unwrap();
        leader.handle_fetch(1, 3, 3, 15).unwrap();
        assert_eq!(leader.high_watermark(), 15);
        let mut answered: Vec<u32> = leader.poll_acks().map(|(waiter, _)| waiter).collect();
        answered.sort_unstable();
        assert_eq!(answered, vec![1, 4]);
        leader.handle_fetch(1, 2, 3, 30).unwrap();
        leader.handle_fetch(1, 3, 3, 20).unwrap();
        let answered: Vec<u32> = leader.poll_acks().map(|(waiter, _)| waiter).collect();
        assert_eq!(answered, vec![2]);
        leader.handle_fetch(1, 3, 3, 30).unwrap();
        let answered: Vec<u32> = leader.poll_acks().map(|(waiter, _)| waiter).collect();
        assert_eq!(answered, vec![3]);
    }

    #[test]
    fn a_lagging_follower_leaves_the_isr_and_rejoins_when_caught_up() {
        let mut leader = leader();
        leader.handle_appended(10);
        leader.handle_fetch(50, 2, 3, 10).unwrap();
        leader.handle_fetch(50, 3, 3, 4).unwrap();
        assert_eq!(leader.handle_tick(100), None);
        leader.handle_fetch(120, 2, 3, 10).unwrap();
        let shrink = leader.handle_tick(150).expect("replica 3 lags");
        assert_eq!(shrink.isr, vec![1, 2]);
        assert_eq!(leader.handle_tick(160), None, "one change at a time");
        leader.handle_isr_committed(&shrink, 11);
        assert_eq!(leader.high_watermark(), 10);
        assert_eq!(leader.check_acks_all(), Ok(()));
        let progress = leader.handle_fetch(170, 3, 3, 10).unwrap();
        let expand = progress.propose_isr.expect("caught up");
        assert_eq!(expand.isr, vec![1, 2, 3]);
        leader.handle_isr_committed(&expand, 12);
        assert_eq!(leader.isr(), &[1, 2, 3]);
    }

    #[test]
    fn too_small_an_isr_refuses_and_fails_acks() {
        let mut leader = leader();
        leader.handle_appended(5);
        leader.wait_for_commit(4, 1);
        leader.handle_fetch(10, 2, 3, 5).unwrap();
        let shrink = leader.handle_tick(500).unwrap();
        assert_eq!(shrink.isr, vec![1]);
        leader.handle_isr_committed(&shrink, 11);
        assert_eq!(
            leader.poll_acks().collect::<Vec<_>>(),
            vec![(
                1,
                Err(AckError::NotEnoughReplicasAfterAppend { isr: 1, min: 2 })
            )]
        );
        assert_eq!(
            leader.check_acks_all(),
            Err(AckError::NotEnoughReplicas { isr: 1, min: 2 })
        );
    }

    #[test]
    fn epochs_fence_fetches_and_resigning_fails_waiters() {
        let mut leader = leader();
        assert!(matches!(
            leader.handle_fetch(0, 2, 2, 0),
            Err(ReplicaFetchError::FencedLeaderEpoch { .. })
        ));
        assert!(matches!(
            leader.handle_fetch(0, 2, 4, 0),
            Err(ReplicaFetchError::UnknownLeaderEpoch { .. })
        ));
        assert!(matches!(
            leader.handle_fetch(0, 9, 3, 0),
            Err(ReplicaFetchError::NotAReplica(9))
        ));
        leader.handle_appended(3);
        leader.wait_for_commit(2, 5);
        leader.resign();
        assert_eq!(
            leader.poll_acks().collect::<Vec<_>>(),
            vec![(5, Err(AckError::NotLeader))]
        );
    }
}
