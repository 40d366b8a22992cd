//! The leader's answer to a follower's fetch: the [`Leader`] plans it, the log reads it (a
//! long poll until there is data), the host holds the leader state and carries out the effects.

use std::time::Duration;

use strata_wire::protocol::{
    DivergingEpoch, ErrorCode, Records, ReplicaFetchRequest, ReplicaFetchResponse,
};

use crate::clock::Clock;
use crate::log::LogError;
use crate::log::writer::LogHandle;
use crate::replication::{
    CheckedFetch, Divergence, FollowerFetch, IsrProposal, Leader, PlannedFetch, ReplicaFetchError,
    Serve,
};

/// What a broker is for a partition, as a follower's fetch finds it.
pub enum PartitionRole {
    /// Not a replica here.
    Unknown,
    /// A replica that does not lead, knowing the partition at `leader_epoch`.
    NotLeading { leader_epoch: u32 },
    Leading {
        log: LogHandle,
        /// The topic's own limit on catch-up replication, if set.
        recovery_bytes_per_sec: Option<u64>,
    },
}

/// Where the leader's state lives and what answering a fetch does beyond the partition's log:
/// the broker's shard in production, a simulated broker in tests.
pub trait LeaderHost {
    /// What answers an `acks=all` produce waiting in the [`Leader`].
    type Waiter;

    fn clock(&self) -> Clock;

    fn role(&self, topic: &str, partition: u32) -> PartitionRole;

    /// Runs `change` on the partition's leader state if this broker leads it, then hands out
    /// what it answered (`acks=all` produces) and wakes readers if the high watermark moved.
    /// `None` when it does not lead.
    fn with_leader<T>(
        &self,
        topic: &str,
        partition: u32,
        change: impl FnOnce(&mut Leader<Self::Waiter>) -> T,
    ) -> Option<T>;

    /// [`LeaderHost::with_leader`] if this broker leads the partition at `epoch`.
    fn with_leader_at<T>(
        &self,
        topic: &str,
        partition: u32,
        epoch: u32,
        change: impl FnOnce(&mut Leader<Self::Waiter>) -> T,
    ) -> Option<T> {
        self.with_leader(topic, partition, |leader| {
            (leader.epoch() == epoch).then(|| change(leader))
        })
        .flatten()
    }

    /// Writes an ISR expansion (`replica` joins) through the coordinator, then tells the leader
    /// the outcome (`handle_isr_committed` or `handle_isr_refused`).
    fn propose_isr(&self, topic: &str, partition: u32, proposal: IsrProposal, replica: i32);

    /// Holds an answer to a replica outside the ISR until the catch-up throttles allow it;
    /// `Some(the most it may carry)` when a limit is set.
    async fn hold_catch_up(&self, _topic: &str, _topic_rate: Option<u64>) -> Option<u64> {
        None
    }

    /// Charges a held catch-up answer's bytes to the limits that held it.
    fn charge_catch_up(&self, _topic: &str, _bytes: u64) {}

    /// A follower newly holds records appended here `latency_us` ago.
    fn replication_reached(&self, _latency_us: u64) {}

    fn fetch_served(&self, _bytes: u64) {}
}

/// Answers a follower's fetch for a partition this broker holds.
pub async fn serve_fetch<H: LeaderHost>(
    host: &H,
    request: ReplicaFetchRequest,
) -> ReplicaFetchResponse {
    let (topic, partition, epoch) = (&request.topic, request.partition, request.leader_epoch);
    let (log, topic_recovery_rate) = match host.role(topic, partition) {
        PartitionRole::Unknown => return replica_fetch_error(ErrorCode::UnknownPartition, 0, 0),
        PartitionRole::NotLeading { leader_epoch } => {
            let code = if epoch > leader_epoch {
                ErrorCode::UnknownLeaderEpoch
            } else {
                ErrorCode::NotLeader
            };
            return replica_fetch_error(code, 0, 0);
        }
        PartitionRole::Leading {
            log,
            recovery_bytes_per_sec,
        } => (log, recovery_bytes_per_sec),
    };
    let fetch = FollowerFetch {
        replica: request.replica_id,
        leader_epoch: epoch,
        fetch_offset: request.fetch_offset,
        last_fetched_epoch: u32::try_from(request.last_fetched_epoch).ok(),
        log_end: request.log_end,
        synced: request.synced_offset.0,
        log_start: request.log_start.0,
    };
    let serve = match decide(host, (topic, partition), &log, &fetch).await {
        Ok(serve) => serve,
        Err(refusal) => return refusal,
    };
    if let Some(latency_us) = serve.latency_us {
        host.replication_reached(latency_us);
    }
    if let Some(proposal) = serve.propose_isr {
        host.propose_isr(topic, partition, proposal, fetch.replica);
    }
    let mut max_bytes = request.max_bytes as usize;
    let mut throttled = false;
    if serve.catching_up
        && let Some(most) = host.hold_catch_up(topic, topic_recovery_rate).await
    {
        max_bytes = max_bytes.min(usize::try_from(most).unwrap_or(usize::MAX));
        throttled = true;
    }
    let wait = Duration::from_millis(u64::from(request.max_wait_ms));
    let (records, offsets) =
        match read(&host.clock(), &log, fetch.fetch_offset, max_bytes, wait).await {
            Ok(read) => read,
            Err(LogError::OffsetOutOfRange { log_start, .. }) => {
                return replica_fetch_error(ErrorCode::OffsetOutOfRange, 0, log_start);
            }
            Err(_) => return replica_fetch_error(ErrorCode::StorageError, 0, 0),
        };
    // Read after the wait: the leadership may have ended meanwhile.
    let Some(high_watermark) = host.with_leader_at(topic, partition, epoch, |l| l.high_watermark())
    else {
        return replica_fetch_error(ErrorCode::NotLeader, 0, 0);
    };
    if throttled {
        host.charge_catch_up(topic, records.len() as u64);
    }
    host.fetch_served(records.len() as u64);
    ReplicaFetchResponse {
        error: ErrorCode::None,
        high_watermark,
        log_start_offset: offsets.log_start,
        log_end_offset: offsets.log_end,
        diverging: None,
        records: Records::Shared(records),
    }
}

/// The leader's decision on a fetch, with the log's divergence check where it needs one:
/// serve it (its progress counted), or the answer that refuses it.
async fn decide<H: LeaderHost>(
    host: &H,
    (topic, partition): (&str, u32),
    log: &LogHandle,
    fetch: &FollowerFetch,
) -> Result<Serve, ReplicaFetchResponse> {
    let clock = host.clock();
    let high_watermark = || {
        host.with_leader(topic, partition, |l| l.high_watermark())
            .unwrap_or(0)
    };
    let refused = |error| {
        Err(replica_fetch_error(
            fetch_error_code(error),
            high_watermark(),
            0,
        ))
    };
    // Any epoch: the leader's own check tells a fenced follower from a stale leader.
    let plan = host.with_leader(topic, partition, |leader| {
        leader.plan_fetch(clock.monotonic_ms(), clock.monotonic_us(), fetch)
    });
    match plan {
        None => return Err(replica_fetch_error(ErrorCode::NotLeader, 0, 0)),
        Some(Err(error)) => return refused(error),
        Some(Ok(PlannedFetch::Serve(serve))) => return Ok(serve),
        Some(Ok(PlannedFetch::CheckDivergence)) => {}
    }
    let Ok((divergence, offsets)) = log
        .diverging(fetch.fetch_offset, fetch.last_fetched_epoch)
        .await
    else {
        return Err(replica_fetch_error(ErrorCode::StorageError, 0, 0));
    };
    let checked = host.with_leader(topic, partition, |leader| {
        let bounds = (offsets.log_start, offsets.log_end);
        let (now_ms, now_us) = (clock.monotonic_ms(), clock.monotonic_us());
        leader.handle_divergence_checked(now_ms, now_us, fetch, divergence, bounds)
    });
    match checked {
        None => Err(replica_fetch_error(ErrorCode::NotLeader, 0, 0)),
        Some(Err(error)) => refused(error),
        Some(Ok(CheckedFetch::Serve(serve))) => Ok(serve),
        Some(Ok(CheckedFetch::Diverging(Divergence { epoch, end_offset }))) => {
            Err(ReplicaFetchResponse {
                diverging: Some(DivergingEpoch {
                    epoch: epoch.map_or(-1, i64::from),
                    end_offset,
                }),
                ..replica_fetch_error(ErrorCode::None, high_watermark(), offsets.log_start)
            })
        }
        Some(Ok(CheckedFetch::OutOfRange)) => Err(replica_fetch_error(
            ErrorCode::OffsetOutOfRange,
            high_watermark(),
            offsets.log_start,
        )),
    }
}

/// One trip to the log task: it reads as soon as records exist past `offset` (at once if they
/// do), or, once `wait` is over, reads what is there (nothing).
async fn read(
    clock: &Clock,
    log: &LogHandle,
    offset: u64,
    max_bytes: usize,
    wait: Duration,
) -> Result<(bytes::Bytes, crate::log::writer::LogOffsets), LogError> {
    if wait.is_zero() {
        return log.read_for_follower(offset, max_bytes, false).await;
    }
    match clock
        .timeout(wait, log.read_for_follower(offset, max_bytes, true))
        .await
    {
        Some(read) => read,
        None => log.read_for_follower(offset, max_bytes, false).await,
    }
}

fn fetch_error_code(error: ReplicaFetchError) -> ErrorCode {
    match error {
        ReplicaFetchError::NotAReplica(_) => ErrorCode::NotReplica,
        ReplicaFetchError::FencedLeaderEpoch { .. } => ErrorCode::FencedLeaderEpoch,
        ReplicaFetchError::UnknownLeaderEpoch { .. } => ErrorCode::UnknownLeaderEpoch,
        ReplicaFetchError::ImpossibleProgress => ErrorCode::InvalidRequest,
    }
}

pub fn replica_fetch_error(
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
