//! The broker's one seam for time. Components that need the time are given a [`Clock`] and ask
//! it, so a test can run them on a wall clock of its choosing; the sans-IO cores take time as
//! an argument and never see a clock at all.
//!
//! Monotonic time and timers are the async runtime's ([`tokio::time`]): in production that is
//! the system's monotonic clock; in a runtime started paused (a simulation) it is virtual time,
//! which moves only when every task waits, straight to the next timer. So the drivers, their
//! timeouts and their sleeps run unchanged on virtual time, and [`Clock::VIRTUAL`]'s wall
//! clock moves with it.
//!
//! Two kinds of time, never mixed:
//! - wall time, milliseconds since the Unix epoch (`i64`, as Kafka's timestamps): record and
//!   commit timestamps, retention, ages shown to users;
//! - monotonic time ([`Instant`], or µs since a process-wide origin for samples kept in
//!   integers): deadlines, timeouts, windows and latencies.

use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
        now: runtime_now,
    };

    /// The runtime's monotonic clock, and a wall clock that moves with it from a fixed start
    /// (2026-01-01): in a paused runtime both are virtual, and a run replays exactly.
    pub const VIRTUAL: Clock = Clock {
        wall_ms: virtual_wall_ms,
        now: runtime_now,
    };

    /// The runtime's monotonic clock with a wall clock of the caller's (tests: a fixed time).
    pub const fn with_wall_ms(wall_ms: fn() -> i64) -> Clock {
        Clock {
            wall_ms,
            now: runtime_now,
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
        self.now().saturating_duration_since(*ORIGIN).as_micros() as u64
    }

    /// Waits `duration` on the runtime's clock.
    pub async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    /// Waits until `deadline` on the runtime's clock.
    pub async fn sleep_until(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline.into()).await;
    }

    /// `future`'s output, or `None` once `duration` passed first.
    pub async fn timeout<F: Future>(&self, duration: Duration, future: F) -> Option<F::Output> {
        tokio::time::timeout(duration, future).await.ok()
    }

    /// `future`'s output, or `None` once `deadline` passed first.
    pub async fn timeout_at<F: Future>(&self, deadline: Instant, future: F) -> Option<F::Output> {
        tokio::time::timeout_at(deadline.into(), future).await.ok()
    }

    /// Ticks every `period` on the runtime's clock, the first at once. A tick that comes late
    /// (the thread was busy) moves the next ones back rather than firing the missed ones in a
    /// burst.
    pub fn ticks(&self, period: Duration) -> tokio::time::Interval {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    }
}

/// Where [`Clock::monotonic_us`] counts from: the system's monotonic clock at first use (a
/// paused runtime starts its virtual clock at the system's time when it is built, and never
/// moves it back, so this stays at or below every reading).
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

fn runtime_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn virtual_wall_ms() -> i64 {
    const START_MS: i64 = 1_767_225_600_000;
    START_MS + (Clock::VIRTUAL.monotonic_us() / 1000) as i64
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
