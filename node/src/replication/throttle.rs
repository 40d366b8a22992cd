//! The leader's limit on catch-up replication (Kafka's `leader.replication.throttled.rate`,
//! Redpanda's `raft_learner_recovery_rate`): a replica outside the ISR (new from a
//! reassignment, or back from a restart) would otherwise copy its backlog as fast as the link
//! goes, and take the leader's disk, CPU and network from the producers of every partition the
//! shard leads. In-sync followers are never held: their fetches are what `acks=all` waits on.
//!
//! A token bucket, pure: the caller passes the time, so tests drive it without a clock. The
//! balance may go negative (an answer is read before its size is known); the next catch-up
//! answer waits until it is paid back.

use std::time::{Duration, Instant};

/// The least a catch-up answer may carry however low the rate, so a small rate still moves
/// whole batches in few round trips.
const ANSWER_BYTES_MIN: u64 = 64 << 10;
/// The bucket holds this much time's worth of the rate: the largest burst, and the most one
/// catch-up answer carries. Short, because an answer is read and sealed on the leader's shard
/// thread at once: during a catch-up at 200 MB/s, a producer to the same shard saw a p99 of
/// about 3.3 ms with 8 MiB answers and about 2.1 ms with 2 MB ones (10 ms of the rate; 0.4 ms
/// with no catch-up; docs/performance.md).
const BURST: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub struct RecoveryThrottle {
    bytes_per_sec: u64,
    /// Bytes that may go now; negative after answers larger than what was there.
    balance: f64,
    updated: Instant,
}

impl RecoveryThrottle {
    pub fn new(bytes_per_sec: u64, now: Instant) -> Self {
        assert!(
            bytes_per_sec > 0,
            "a throttle of no bytes would never let a follower catch up"
        );
        let mut throttle = RecoveryThrottle {
            bytes_per_sec,
            balance: 0.0,
            updated: now,
        };
        throttle.balance = throttle.capacity() as f64;
        throttle
    }

    /// One shard's even share of a limit of `bytes_per_sec` for a node of `shards` shards.
    pub fn shard_share(bytes_per_sec: u64, shards: usize) -> u64 {
        (bytes_per_sec / shards.max(1) as u64).max(1)
    }

    /// Keeps `throttle` (and what it holds back) while its rate is `bytes_per_sec`; makes it
    /// anew at a changed rate; drops it without one.
    pub fn retune(
        throttle: &mut Option<RecoveryThrottle>,
        bytes_per_sec: Option<u64>,
        now: Instant,
    ) {
        match bytes_per_sec {
            None => *throttle = None,
            Some(rate)
                if throttle
                    .as_ref()
                    .is_some_and(|kept| kept.bytes_per_sec == rate) => {}
            Some(rate) => *throttle = Some(RecoveryThrottle::new(rate, now)),
        }
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// The most one catch-up answer carries (and the bucket holds).
    pub fn capacity(&self) -> u64 {
        let burst = self.bytes_per_sec as u128 * BURST.as_nanos() / 1_000_000_000;
        (burst as u64).max(ANSWER_BYTES_MIN)
    }

    /// How long a catch-up answer waits before it is read: zero while the balance is positive.
    pub fn delay(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.balance > 0.0 {
            Duration::ZERO
        } else {
            // Until the balance is a little above zero (a wait of exactly the debt would find
            // it at zero and wait again).
            Duration::from_secs_f64((1.0 - self.balance) / self.bytes_per_sec as f64)
        }
    }

    /// Takes the bytes a catch-up answer carried.
    pub fn charge(&mut self, bytes: u64, now: Instant) {
        self.refill(now);
        self.balance -= bytes as f64;
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated);
        self.updated = self.updated.max(now);
        self.balance = (self.balance + elapsed.as_secs_f64() * self.bytes_per_sec as f64)
            .min(self.capacity() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catch-up answers as a follower would fetch them, each read as soon as the throttle lets
    /// it, for `run` of virtual time: the bytes that went.
    fn bytes_through(throttle: &mut RecoveryThrottle, start: Instant, run: Duration) -> u64 {
        let (mut now, mut moved) = (start, 0);
        loop {
            now += throttle.delay(now);
            if now >= start + run {
                return moved;
            }
            let answer = throttle.capacity();
            throttle.charge(answer, now);
            moved += answer;
            // The round trip to the follower and back.
            now += Duration::from_micros(200);
        }
    }

    #[test]
    fn catch_up_answers_keep_to_the_rate() {
        let start = Instant::now();
        for rate in [100_000u64, 2_000_000, 100 << 20] {
            let mut throttle = RecoveryThrottle::new(rate, start);
            let moved = bytes_through(&mut throttle, start, Duration::from_secs(10));
            // The rate for ten seconds, plus at most the starting bucket and the answer read
            // on the last wait.
            let most = rate * 10 + 2 * throttle.capacity();
            assert!(
                moved <= most && moved >= rate * 10 - throttle.capacity(),
                "{moved} bytes at {rate} B/s"
            );
        }
    }

    #[test]
    fn a_full_bucket_does_not_hold_an_answer() {
        let start = Instant::now();
        let mut throttle = RecoveryThrottle::new(100 << 20, start);
        assert_eq!(throttle.delay(start), Duration::ZERO);
        assert_eq!(throttle.capacity(), 1 << 20, "10 ms of the rate");
        // An answer larger than the bucket: the next waits until it is paid back.
        throttle.charge(3 << 20, start);
        let delay = throttle.delay(start);
        assert!(
            (Duration::from_micros(19_900)..=Duration::from_micros(20_100)).contains(&delay),
            "{delay:?}"
        );
        assert_eq!(throttle.delay(start + delay), Duration::ZERO);
        // Idle time refills the bucket only up to its capacity.
        let later = start + Duration::from_secs(60);
        throttle.charge(throttle.capacity(), later);
        assert!(throttle.delay(later) > Duration::ZERO);
    }

    /// A rate set live: the same rate keeps the throttle and what it holds back, a new one
    /// makes it anew, none drops it.
    #[test]
    fn a_throttle_is_retuned_only_when_its_rate_changes() {
        let start = Instant::now();
        let mut throttle = None;
        RecoveryThrottle::retune(&mut throttle, Some(1_000_000), start);
        let held = throttle.as_mut().unwrap();
        held.charge(held.capacity() * 2, start);
        let owed = held.delay(start);
        assert!(owed > Duration::ZERO);
        RecoveryThrottle::retune(&mut throttle, Some(1_000_000), start);
        assert_eq!(
            throttle.as_mut().unwrap().delay(start),
            owed,
            "kept, debt and all"
        );
        RecoveryThrottle::retune(&mut throttle, Some(2_000_000), start);
        let retuned = throttle.as_mut().unwrap();
        assert_eq!(retuned.bytes_per_sec(), 2_000_000);
        assert_eq!(retuned.delay(start), Duration::ZERO, "a new bucket");
        RecoveryThrottle::retune(&mut throttle, None, start);
        assert!(throttle.is_none());
    }

    #[test]
    fn a_low_rate_still_moves_whole_batches() {
        let throttle = RecoveryThrottle::new(1_000, Instant::now());
        assert_eq!(throttle.capacity(), ANSWER_BYTES_MIN);
    }
}
