//! The broker's one seam for time. Components that need the time are given a [`Clock`] and ask
//! it, so a test can run them on a wall clock of its choosing; the sans-IO cores take time as
//! an argument and never see a clock at all.
//!
//! Two kinds of time, never mixed:
//! - wall time, milliseconds since the Unix epoch (`i64`, as Kafka's timestamps): record and
//!   commit timestamps, retention, ages shown to users;
//! - monotonic time ([`Instant`], or µs since a process-wide origin for samples kept in
//!   integers): deadlines, timeouts, windows and latencies.

use std::sync::LazyLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where the broker reads the time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall_ms: fn() -> i64,
    now: fn() -> Instant,
}

impl Clock {
    /// The system's clocks.
    pub const SYSTEM: Clock = Clock {
        wall_ms: system_wall_ms,
        now: Instant::now,
    };

    /// The system's monotonic clock with a wall clock of the caller's (tests: a fixed time).
    pub const fn with_wall_ms(wall_ms: fn() -> i64) -> Clock {
        Clock {
            wall_ms,
            now: Instant::now,
        }
    }

    /// Wall time: milliseconds since the Unix epoch.
    pub fn wall_ms(&self) -> i64 {
        (self.wall_ms)()
    }

    /// Monotonic time.
    pub fn now(&self) -> Instant {
        (self.now)()
    }

    /// Monotonic time as microseconds since one origin shared by the whole process, for
    /// samples kept in integers (comparable across shards, never going back).
    pub fn monotonic_us(&self) -> u64 {
        static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);
        self.now().saturating_duration_since(*ORIGIN).as_micros() as u64
    }
}

impl Clock {
    /// [`Clock::monotonic_us`] in milliseconds, for the sans-IO cores that keep time in `i64`
    /// ms (a follower's lag against `replica.lag.time.max.ms`): a step of the wall clock must
    /// not push followers out of the ISR.
    pub fn monotonic_ms(&self) -> i64 {
        (self.monotonic_us() / 1000) as i64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::SYSTEM
    }
}

fn system_wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_of_the_callers_leaves_monotonic_time_running() {
        let clock = Clock::with_wall_ms(|| 42);
        assert_eq!(clock.wall_ms(), 42);
        let first = clock.monotonic_us();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(clock.monotonic_us() >= first + 2_000);
        assert!(Clock::SYSTEM.wall_ms() > 1_700_000_000_000);
    }
}
