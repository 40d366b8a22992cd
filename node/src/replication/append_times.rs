//! When a leader's recent appends reached its log, so that a follower reporting its progress
//! tells how long the records took to reach it: replication latency as a dashboard wants it.
//!
//! A follower's own fetch round trip is not that figure: a caught-up follower's fetch waits at
//! the leader for new records (a long-poll of up to seconds), so idle and sticky-partitioned
//! partitions put their idle time into it. Timed from the append, an idle partition adds no
//! sample at all, and a busy one adds the time its records took to reach each follower, which
//! bounds what `acks=all` producers wait.

use std::collections::VecDeque;

/// Appends remembered at most: a follower further behind than this many appends (one catching
/// up) adds no sample until a fetch brings it past the oldest remembered one, and is then timed
/// from that append, later than its own records: its latency is understated, and its lag shows
/// in `strata_replica_lag_records` instead.
pub const APPEND_TIMES_MAX: usize = 256;

#[derive(Debug, Default)]
pub struct AppendTimes {
    /// `(log end after an append, when it completed in µs)`, oldest first; both increase.
    recent: VecDeque<(u64, u64)>,
}

impl AppendTimes {
    /// An append made the log end at `log_end` at `at_us` (a monotonic clock). Appends that do
    /// not move the log end past the last one remembered are ignored.
    pub fn record(&mut self, log_end: u64, at_us: u64) {
        if let Some(&(last_end, last_at)) = self.recent.back() {
            if log_end <= last_end {
                return;
            }
            debug_assert!(at_us >= last_at, "the clock is monotonic");
        }
        if self.recent.len() == APPEND_TIMES_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((log_end, at_us));
    }

    /// A follower that held everything below `before` now holds everything below `after`: how
    /// long ago the oldest append it newly holds reached the leader's log (the longest any of
    /// its new records took), if that append is remembered.
    pub fn reached(&self, before: u64, after: u64, now_us: u64) -> Option<u64> {
        let first_new = self.recent.partition_point(|&(end, _)| end <= before);
        let &(end, at_us) = self.recent.get(first_new)?;
        (end <= after).then(|| now_us.saturating_sub(at_us))
    }

    /// Every follower holds everything below `log_end`: appends ending there or before are of
    /// no more use.
    pub fn forget_through(&mut self, log_end: u64) {
        while self.recent.front().is_some_and(|&(end, _)| end <= log_end) {
            self.recent.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.recent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_is_timed_from_the_oldest_append_it_newly_holds() {
        let mut times = AppendTimes::default();
        times.record(10, 1_000);
        times.record(20, 2_000);
        times.record(30, 3_500);
        // Nothing new: no sample (a long-poll that returned empty).
        assert_eq!(times.reached(30, 30, 9_000), None);
        assert_eq!(times.reached(0, 0, 9_000), None);
        // Part of the first append is not the whole of it.
        assert_eq!(times.reached(0, 9, 9_000), None);
        // The first two appends, newly held: timed from the older one.
        assert_eq!(times.reached(0, 25, 4_000), Some(3_000));
        assert_eq!(times.reached(10, 20, 4_000), Some(2_000));
        assert_eq!(times.reached(20, 30, 4_000), Some(500));
        // Beyond what the leader remembers appending (a follower ahead of the leader's durable
        // end): still timed by what is remembered.
        assert_eq!(times.reached(20, 40, 4_000), Some(500));
    }

    #[test]
    fn what_every_follower_holds_is_forgotten_and_memory_is_bounded() {
        let mut times = AppendTimes::default();
        for i in 1..=10 {
            times.record(i * 10, i * 100);
        }
        times.record(100, 5_000); // no progress: ignored
        times.forget_through(55);
        assert_eq!(times.len(), 5);
        assert_eq!(times.reached(50, 60, 700), Some(100));
        // Forgotten appends are not timed.
        assert_eq!(times.reached(40, 50, 700), None);
        times.forget_through(100);
        assert!(times.is_empty());
        for i in 0..(APPEND_TIMES_MAX as u64 + 10) {
            times.record(1_000 + i, i);
        }
        assert_eq!(times.len(), APPEND_TIMES_MAX);
        // The oldest were dropped: a follower that far behind gets no sample.
        assert_eq!(times.reached(1_000, 1_001, 9_999), None);
        assert_eq!(times.reached(1_009, 1_011, 9_999), Some(9_999 - 10));
    }
}
