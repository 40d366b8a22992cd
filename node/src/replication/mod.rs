//! Replication's logic as plain state machines: no sockets, no disks, no runtime, no clock.
//!
//! A partition's leader keeps a [`Leader`]: the in-sync replicas (ISR), each follower's log end
//! offset and last caught-up time, the high watermark, and the produce requests waiting for it
//! (`acks=all`). Followers ask the leader for batches with (fetch offset, last fetched epoch);
//! [`diverging`] decides whether a follower's log went a different way (a leader that appended
//! and lost its leadership before those records were committed) and where it must cut it;
//! [`truncation_offset`] is the follower's side of that answer. [`EpochCache`] maps leader epochs
//! to the offset where each began, which both sides need for that decision. [`RecoveryThrottle`]
//! is a leader shard's limit on what replicas outside the ISR copy (catch-up after a
//! reassignment or a restart). [`AppendTimes`] times how long a leader's appends take to reach
//! each follower.
//!
//! Everything takes time as an argument (`now_ms`) and returns what to do; the shard runtime
//! (`server::replica`) executes it over QUIC, the partition log and the coordinator, and a seeded
//! simulator (`node/tests/replication_sim.rs`) drives the same code on virtual time with lost,
//! delayed and reordered messages and crashes.
//!
//! Fault model: replicas fail by stopping (crash, pause, network cut) and may lose what they had
//! not synced; the coordinator's fenced transactions are linearizable. Under that model:
//! - a record below a leader's high watermark is on every ISR member's log, so any leader the
//!   controller picks from the ISR has it;
//! - a leader's high watermark never goes backwards while it leads;
//! - an ISR change takes effect only after the coordinator stored it (callers write first, then
//!   call [`Leader::handle_isr_committed`]).

mod append_times;
mod epochs;
mod follower;
mod leader;
mod throttle;

pub use append_times::{APPEND_TIMES_MAX, AppendTimes};
pub use epochs::{EpochCache, EpochEntry};
pub use follower::{
    Appended, FetchAnswer, FetchId, FetchPlan, Follower, FollowerAction, FollowerConfig,
    LogPosition, StopReason,
};
pub use leader::{
    AckError, CheckedFetch, FetchProgress, FollowerFetch, IsrProposal, Leader, LeaderConfig,
    PlannedFetch, ReplicaFetchError, Serve,
};
pub use throttle::RecoveryThrottle;

/// Where a follower's log leaves the leader's, if it does.
///
/// The follower last fetched (or appended) at `last_fetched_epoch` and would fetch next at
/// `fetch_offset`. If the leader's log has no epoch at or below `last_fetched_epoch` ending at
/// or after `fetch_offset`, the follower holds records the leader does not: the answer is the
/// leader's latest epoch not above `last_fetched_epoch` (if any) and the offset where that epoch
/// ends in the leader's log. The follower truncates (see [`truncation_offset`]) and asks again.
pub fn diverging(
    leader_epochs: &EpochCache,
    leader_log_end: u64,
    fetch_offset: u64,
    last_fetched_epoch: Option<u32>,
) -> Option<Divergence> {
    let Some(requested) = last_fetched_epoch else {
        // An empty follower log cannot diverge; a non-empty one always knows its last epoch.
        return None;
    };
    match leader_epochs.end_offset_for(requested, leader_log_end) {
        Some((epoch, end_offset)) if epoch == requested && end_offset >= fetch_offset => None,
        Some((epoch, end_offset)) => Some(Divergence {
            epoch: Some(epoch),
            end_offset,
        }),
        None => Some(Divergence {
            epoch: None,
            end_offset: leader_epochs.first_start().unwrap_or(leader_log_end),
        }),
    }
}

/// The leader's answer to a follower whose log diverged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// The leader's largest epoch not above the follower's last fetched epoch; `None` when the
    /// leader has no such epoch (all its records are from later epochs).
    pub epoch: Option<u32>,
    /// Where `epoch` ends in the leader's log (or where its first epoch begins).
    pub end_offset: u64,
}

/// Where a follower cuts its log after the leader reported a divergence: never above what the
/// leader has for that epoch, nor above where the follower's own copy of that epoch ends.
pub fn truncation_offset(own: &EpochCache, own_log_end: u64, divergence: Divergence) -> u64 {
    let own_end = match divergence.epoch {
        Some(epoch) => own
            .end_offset_for(epoch, own_log_end)
            .map_or(own.first_start().unwrap_or(own_log_end), |(_, end)| end),
        None => own_log_end,
    };
    own_end.min(divergence.end_offset).min(own_log_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(u32, u64)]) -> EpochCache {
        let mut cache = EpochCache::default();
        for &(epoch, start) in entries {
            cache.assign(epoch, start);
        }
        cache
    }

    /// (leader epochs, leader end, fetch offset, last epoch) → divergence. Data-driven, as the
    /// raft quorum tables.
    #[test]
    fn divergence_table() {
        type Case = (
            &'static [(u32, u64)],
            u64,
            u64,
            Option<u32>,
            Option<(Option<u32>, u64)>,
        );
        let cases: &[Case] = &[
            // Empty follower: nothing to compare.
            (&[(1, 0)], 10, 0, None, None),
            // Same epoch, behind or level: fine.
            (&[(1, 0)], 10, 5, Some(1), None),
            (&[(1, 0)], 10, 10, Some(1), None),
            // Same epoch, ahead of the leader: cut at the leader's end.
            (&[(1, 0)], 10, 12, Some(1), Some((Some(1), 10))),
            // The follower's epoch 1 went past where the leader's epoch 1 ended (epoch 2 at 8).
            (&[(1, 0), (2, 8)], 20, 10, Some(1), Some((Some(1), 8))),
            // Older epoch ending exactly where the follower is: fine.
            (&[(1, 0), (2, 8)], 20, 8, Some(1), None),
            // The follower saw epoch 2, which the leader never had (it has 1 then 3).
            (&[(1, 0), (3, 8)], 20, 9, Some(2), Some((Some(1), 8))),
            // The follower's epoch is older than everything on the leader.
            (&[(3, 5)], 20, 4, Some(1), Some((None, 5))),
        ];
        for (at, &(entries, leader_end, fetch_offset, last_epoch, expected)) in
            cases.iter().enumerate()
        {
            let got = diverging(&cache(entries), leader_end, fetch_offset, last_epoch)
                .map(|d| (d.epoch, d.end_offset));
            assert_eq!(got, expected, "case {at}");
        }
    }

    #[test]
    fn truncation_table() {
        // (follower epochs, follower end, divergence) → cut.
        type Case = (&'static [(u32, u64)], u64, Option<u32>, u64, u64);
        let cases: &[Case] = &[
            // The leader's epoch 1 ended at 8; ours too went on to 10: cut at 8.
            (&[(1, 0)], 10, Some(1), 8, 8),
            // Ours ended earlier (epoch 2 from 6): cut at 6, then ask again.
            (&[(1, 0), (2, 6)], 10, Some(1), 8, 6),
            // The leader has nothing at or below our epochs: cut at its first offset.
            (&[(1, 0)], 10, None, 5, 5),
            // Never above our own end.
            (&[(1, 0)], 4, Some(1), 8, 4),
        ];
        for (at, &(entries, own_end, epoch, end_offset, expected)) in cases.iter().enumerate() {
            let divergence = Divergence { epoch, end_offset };
            assert_eq!(
                truncation_offset(&cache(entries), own_end, divergence),
                expected,
                "case {at}"
            );
        }
    }
}
