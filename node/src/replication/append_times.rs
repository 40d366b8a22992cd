//! When a leader's recent appends reached its log, so that a follower reporting its progress
//! tells how long the records took to reach it: replication latency as a dashboard wants it.
//!
//! A follower's own fetch round trip is not that figure: a caught-up follower's fetch waits at
//! the leader for new records (a long-poll of up to seconds), so idle and sticky-partitioned
//! partitions put their idle time into it. Timed from the append, an idle partition adds no
//! sample at all, and a busy one adds the time its records took to reach each follower, which
//! bounds what `acks=all` producers wait.

use std::collections::VecDeque;

/// Entries remembered at most. Once full, the next append first folds pairs of neighbouring
/// entries, each into one that keeps the older time: the pairs whose joint time span is the
/// smallest share of its age. An entry then stands for several appends and carries the first
/// one's time, and old entries span more than new ones, in proportion to their age. A follower
/// further behind than single appends are remembered (one catching up) is timed from the first
/// append of the entry its oldest new record is in: never less than that record took, and more
/// by a few percent of its age (3–6% in the unit test's runs of 10 to 160 times this many
/// appends). Dropping the oldest entry instead, as before, timed such a follower from a later
/// append than its own records: it understated.
pub const APPEND_TIMES_MAX: usize = 256;

/// Pairs folded in one pass once the entries are full (a quarter of them): 67 ns per append
/// in all, with the pass, while a follower is that far behind (a release build's unit test
/// timing); folding 16 pairs a pass took 199 ns, one pair 628 ns, for about 0.5
/// points less error.
const FOLDS_AT_ONCE: usize = APPEND_TIMES_MAX / 4;

#[derive(Debug, Default)]
pub struct AppendTimes {
    /// `(log end after an append, when the first append since the entry before completed, in
    /// µs)`, oldest first; both increase.
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
            self.fold_some(at_us);
        }
        self.recent.push_back((log_end, at_us));
    }

    /// Folds pairs of neighbouring entries, [`FOLDS_AT_ONCE`] of them, each into one: the pairs
    /// `k`, `k + 1` whose joint span (from entry `k`'s time to entry `k + 2`'s, which bounds
    /// when its last append completed) is the smallest share of its age at `now_us`, no two
    /// overlapping. Only while a follower is more than [`APPEND_TIMES_MAX`] appends behind; one
    /// pass for that many appends.
    fn fold_some(&mut self, now_us: u64) {
        let candidates = self.recent.len() - 2;
        // (span, age, k), span / age the share; compared by cross-multiplying.
        let mut shares = [(0u128, 0u128, 0usize); APPEND_TIMES_MAX];
        for (k, share) in shares[..candidates].iter_mut().enumerate() {
            let (first, after) = (self.recent[k].1, self.recent[k + 2].1);
            *share = (
                u128::from(after - first),
                u128::from(now_us.saturating_sub(after).max(1)),
                k,
            );
        }
        let shares = &mut shares[..candidates];
        let by_share =
            |a: &(u128, u128, usize), b: &(u128, u128, usize)| (a.0 * b.1).cmp(&(b.0 * a.1));
        let chosen = FOLDS_AT_ONCE.min(candidates);
        shares.select_nth_unstable_by(chosen - 1, by_share);
        let mut fold = [false; APPEND_TIMES_MAX];
        for &(_, _, k) in &shares[..chosen] {
            // Entry `k` into `k + 1` only if neither is already part of a pair.
            if !(fold[k] || fold[k + 1] || (k > 0 && fold[k - 1])) {
                fold[k] = true;
            }
        }
        let mut kept = 0;
        let mut k = 0;
        while k < self.recent.len() {
            let entry = if fold[k] {
                let (_, older_at) = self.recent[k];
                let (newer_end, _) = self.recent[k + 1];
                k += 2;
                (newer_end, older_at)
            } else {
                k += 1;
                self.recent[k - 1]
            };
            self.recent[kept] = entry;
            kept += 1;
        }
        self.recent.truncate(kept);
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
        assert!(times.len() <= APPEND_TIMES_MAX);
        // The newest are timed one by one as before.
        assert_eq!(times.reached(1_264, 1_265, 9_999), Some(9_999 - 265));
        assert_eq!(times.reached(1_263, 1_264, 9_999), Some(9_999 - 264));
    }

    /// A follower far behind is timed from no later than its records' appends, and by little more
    /// than they took.
    #[test]
    fn a_follower_far_behind_is_timed_within_a_few_percent_and_never_under() {
        for rounds in [10, 40, 160] {
            let mut times = AppendTimes::default();
            // One append every 10 µs.
            let appends = rounds * APPEND_TIMES_MAX as u64;
            for i in 1..=appends {
                times.record(i, 10 * i);
            }
            assert!(times.len() <= APPEND_TIMES_MAX);
            let now = 10 * appends + 1_000;
            let mut worst = 0.0f64;
            for before in 0..appends {
                // Its oldest new record is `before`, appended by append `before + 1`.
                let truth = now - 10 * (before + 1);
                let timed = times.reached(before, appends, now).expect("timed");
                assert!(
                    timed >= truth,
                    "{rounds}: before {before}: {timed} < {truth}"
                );
                worst = worst.max((timed - truth) as f64 / truth as f64);
            }
            assert!(
                worst < 0.07,
                "{rounds}: timed up to {:.1}% over",
                worst * 100.0
            );
        }
    }
}
