//! The follower's loop: carries out a [`Follower`]'s actions until it stops or its role ends
//! (the task is aborted).

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_wire::batch::BatchHeader;
use strata_wire::protocol::{Appended as AppendedOffset, Records, ReplicaFetchRequest};

use super::{ReplicaFetchAnswer, ReplicaNetwork};
use crate::clock::Clock;
use crate::io::DIRECT_BLOCK;
use crate::log::LogError;
use crate::log::writer::{LogHandle, ReplicatedBatches};
use crate::replication::{
    Appended, Divergence, FetchAnswer, FetchId, FetchPlan, Follower, FollowerAction,
    FollowerConfig, LogPosition,
};

/// The most a follower asks for in one fetch.
const FETCH_BYTES_MAX: u32 = 8 << 20;

const CONFIG: FollowerConfig = FollowerConfig {
    // A follower fetches ahead only after answers this large: it is catching up a backlog.
    fetch_ahead_bytes_min: FETCH_BYTES_MAX as u64 / 2,
    backoff_step_ms: 50,
    backoff_steps_max: 10,
};

/// Which partition a follower follows, from whom, and how it asks.
#[derive(Debug, Clone)]
pub struct FollowedPartition {
    pub topic: String,
    pub partition: u32,
    /// This broker.
    pub replica_id: i32,
    pub leader: i32,
    pub leader_epoch: u32,
    /// How long a caught-up fetch waits at the leader for new records.
    pub max_wait_ms: u32,
}

/// A fetch the follower planned: sent when the loop waits for it (the next fetch after an
/// append), or at once from a task of its own (a fetch ahead of an append).
enum InFlight<E> {
    Deferred(ReplicaFetchRequest, Option<usize>),
    Sent(tokio::task::JoinHandle<Result<ReplicaFetchAnswer, E>>),
}

/// Follows `partition`'s leader into `log`: fetch, truncate where the leader says the logs
/// diverge, append what it sends verbatim, repeat. `high_watermark` is kept at what this
/// replica's readers may see. Runs until the follower stops on a log error; a role change
/// aborts the task.
pub async fn follow<N: ReplicaNetwork>(
    network: Rc<N>,
    partition: FollowedPartition,
    log: LogHandle,
    high_watermark: Rc<Cell<u64>>,
    clock: Clock,
) {
    let mut driver = Driver {
        follower: Follower::new(CONFIG, high_watermark.get()),
        in_flight: VecDeque::new(),
        appending_since: clock.now(),
        network,
        partition,
        log,
        clock,
    };
    loop {
        while let Some(action) = driver.follower.poll_action() {
            let stopped = driver.carry_out(action).await;
            high_watermark.set(driver.follower.high_watermark());
            if stopped {
                return;
            }
        }
        driver.wait().await;
    }
}

/// What the follower's loop holds between its actions.
struct Driver<N: ReplicaNetwork> {
    follower: Follower<ReplicatedBatches>,
    /// Fetches sent or to send, oldest first, with when each was planned.
    in_flight: VecDeque<(FetchId, Instant, InFlight<N::Error>)>,
    /// When the answer being appended was asked for.
    appending_since: Instant,
    network: Rc<N>,
    partition: FollowedPartition,
    log: LogHandle,
    clock: Clock,
}

/// A fetch sent ahead is abandoned with the loop (a role change aborts it): its answer would
/// have nowhere to go.
impl<N: ReplicaNetwork> Drop for Driver<N> {
    fn drop(&mut self) {
        self.abandon_fetches();
    }
}

impl<N: ReplicaNetwork> Driver<N> {
    fn now_ms(&self) -> i64 {
        self.clock.monotonic_ms()
    }

    /// Carries out one action and hands its outcome back; `true` once the follower stopped.
    async fn carry_out(&mut self, action: FollowerAction<ReplicatedBatches>) -> bool {
        let (log, topic, index) = (&self.log, &self.partition.topic, self.partition.partition);
        match action {
            FollowerAction::ReadLog => {
                let position = match log.replica_info().await {
                    Ok(info) => Some(LogPosition {
                        log_start: info.offsets.log_start,
                        log_end: info.offsets.log_end,
                        latest_epoch: info.latest_epoch,
                    }),
                    Err(error) => {
                        tracing::error!(%topic, partition = index, "reading the log: {error}");
                        None
                    }
                };
                self.follower.handle_log_read(self.now_ms(), position);
            }
            FollowerAction::AbandonFetches => self.abandon_fetches(),
            FollowerAction::Fetch(plan) => self.send(plan),
            FollowerAction::Append { records, bytes } => {
                let outcome = match log.append_replicated(records).await {
                    Ok(appended) => {
                        let elapsed = self.clock.now().duration_since(self.appending_since);
                        let elapsed_us = elapsed.as_micros() as u64;
                        self.network.replicated(topic, bytes, elapsed_us);
                        Appended::Ends(appended.last_offset + 1)
                    }
                    Err(LogError::NotContiguous { .. }) => Appended::NotContiguous,
                    Err(error) => {
                        tracing::error!(%topic, partition = index, "append failed: {error}");
                        Appended::Failed
                    }
                };
                self.follower.handle_appended(self.now_ms(), outcome);
            }
            FollowerAction::Truncate(divergence) => {
                let end = truncate(log, &self.partition, self.follower.log_end(), divergence).await;
                self.follower.handle_truncated(self.now_ms(), end);
            }
            FollowerAction::RestartAt(offset) => {
                tracing::warn!(%topic, partition = index, from = self.follower.log_end(), to = offset,
                    "the leader no longer holds our log end: starting over at its log start");
                let below = self
                    .network
                    .state_below(topic, index, offset)
                    .await
                    .unwrap_or_default();
                let done = log
                    .restart_at(offset, below)
                    .await
                    .inspect_err(|error| {
                        tracing::error!(%topic, partition = index, "starting over: {error}");
                    })
                    .is_ok();
                self.follower.handle_restarted(self.now_ms(), done);
            }
            FollowerAction::MoveLogStart(offset) => {
                let start = log
                    .delete_records_before(offset)
                    .await
                    .inspect_err(|error| {
                        tracing::error!(%topic, partition = index, "moving the log start: {error}");
                    })
                    .ok();
                self.follower.handle_log_start_moved(self.now_ms(), start);
            }
            FollowerAction::Stop(reason) => {
                tracing::error!(%topic, partition = index, ?reason, "follower stops");
                return true;
            }
        }
        false
    }

    /// Drops every fetch in flight; those sent ahead are aborted.
    fn abandon_fetches(&mut self) {
        for (_, _, fetch) in self.in_flight.drain(..) {
            if let InFlight::Sent(task) = fetch {
                task.abort();
            }
        }
    }

    /// Plans a fetch: the next fetch after an append is sent when the loop waits for it; a
    /// fetch ahead of an append goes out at once, from a task of its own.
    fn send(&mut self, plan: FetchPlan) {
        let request = fetch_request(&self.partition, &plan, &self.log);
        // Where these records will leave the log's last block (a roll in between only costs
        // that answer's placement: it is copied instead).
        let phase = self
            .log
            .direct_phase()
            .map(|phase| (phase + plan.after_bytes as usize) % DIRECT_BLOCK);
        let fetch = if plan.after_bytes == 0 {
            InFlight::Deferred(request, phase)
        } else {
            let (network, leader) = (self.network.clone(), self.partition.leader);
            InFlight::Sent(tokio::task::spawn_local(async move {
                network.replica_fetch(leader, request, phase).await
            }))
        };
        self.in_flight.push_back((plan.id, self.clock.now(), fetch));
    }

    /// Nothing to do but wait: for the answer the follower awaits, or for its timeout.
    async fn wait(&mut self) {
        let awaited =
            matches!(self.in_flight.front(), Some((id, _, _)) if self.follower.awaits(*id));
        if !awaited {
            let Some(deadline) = self.follower.poll_timeout() else {
                unreachable!("a follower that is not stopped waits for a fetch or a time")
            };
            let wait = deadline.saturating_sub(self.now_ms()).max(0) as u64;
            self.clock.sleep(Duration::from_millis(wait)).await;
            self.follower.handle_timeout(self.now_ms());
            return;
        }
        let (id, sent, fetch) = self.in_flight.pop_front().expect("looked at");
        let leader = self.partition.leader;
        let result = match fetch {
            InFlight::Deferred(request, phase) => {
                self.network.replica_fetch(leader, request, phase).await
            }
            InFlight::Sent(task) => match task.await {
                Ok(result) => result,
                // The fetch's task panicked (abandoned fetches left the queue).
                Err(_) => return self.follower.handle_fetch_failed(self.now_ms(), id),
            },
        };
        match result {
            Ok(answer) => {
                self.appending_since = sent;
                let answer = fetch_answer(answer);
                self.follower.handle_fetch_answer(self.now_ms(), id, answer);
            }
            Err(error) => {
                if self.follower.failures().is_multiple_of(20) {
                    let (topic, index) = (&self.partition.topic, self.partition.partition);
                    tracing::warn!(%topic, partition = index, leader, "replication fetch failed: {error}");
                }
                self.follower.handle_fetch_failed(self.now_ms(), id);
            }
        }
    }
}

/// The request for `plan`: the log's synced offset and start as of its last command, never
/// above what the plan reports held (a truncation may have moved the log end below them).
fn fetch_request(
    partition: &FollowedPartition,
    plan: &FetchPlan,
    log: &LogHandle,
) -> ReplicaFetchRequest {
    ReplicaFetchRequest {
        replica_id: partition.replica_id,
        topic: partition.topic.clone(),
        partition: partition.partition,
        leader_epoch: partition.leader_epoch,
        fetch_offset: plan.fetch_offset,
        last_fetched_epoch: plan.last_fetched_epoch.map_or(-1, i64::from),
        log_end: plan.log_end,
        max_bytes: FETCH_BYTES_MAX,
        max_wait_ms: partition.max_wait_ms,
        synced_offset: AppendedOffset(log.synced_offset().min(plan.log_end)),
        log_start: AppendedOffset(log.log_start_offset().min(plan.log_end)),
    }
}

/// What the follower's decisions need of an answer; the records travel along.
fn fetch_answer(answer: ReplicaFetchAnswer) -> FetchAnswer<ReplicatedBatches> {
    let ReplicaFetchAnswer {
        mut response,
        placed,
    } = answer;
    let records = match placed {
        Some(placed) => ReplicatedBatches::Placed(placed),
        None => ReplicatedBatches::Bytes(
            std::mem::replace(&mut response.records, Records::empty()).freeze(),
        ),
    };
    let last_batch =
        last_batch_header(records.as_slice()).map(|last| (last.next_offset(), last.leader_epoch));
    FetchAnswer {
        error: response.error,
        high_watermark: response.high_watermark,
        log_start: response.log_start_offset,
        log_end: response.log_end_offset,
        diverging: response.diverging.map(|diverging| Divergence {
            epoch: u32::try_from(diverging.epoch).ok(),
            end_offset: diverging.end_offset,
        }),
        bytes: records.as_slice().len() as u64,
        records,
        last_batch,
    }
}

/// Cuts the log where the leader said it diverges; the new log end, or `None` (logged).
async fn truncate(
    log: &LogHandle,
    partition: &FollowedPartition,
    log_end: u64,
    divergence: Divergence,
) -> Option<u64> {
    let (topic, index) = (&partition.topic, partition.partition);
    match log.truncate_diverged(divergence).await {
        Ok(end) => {
            tracing::warn!(%topic, partition = index, from = log_end, to = end, ?divergence,
                "log diverged from the leader's: truncated");
            Some(end)
        }
        Err(error) => {
            tracing::error!(%topic, partition = index, "truncation failed: {error}");
            None
        }
    }
}

/// The header of the last whole batch in a fetch answer; `None` when a header does not parse
/// (the append that follows reports why).
pub fn last_batch_header(records: &[u8]) -> Option<BatchHeader> {
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
