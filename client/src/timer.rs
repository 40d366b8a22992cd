//! A sleep precise to microseconds, for the producer's linger and the bench's pacing.
//!
//! tokio's timer wheel ticks once a millisecond and rounds every deadline up to its next tick,
//! so a 1 ms linger lasted 1-2 ms and a 2 ms one 2-3 ms (p50 1.65 ms at `linger 1` and 50,000
//! records/s, docs/performance.md). A `timerfd` watched by the runtime's IO driver wakes within
//! tens of microseconds.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use tokio::io::unix::AsyncFd;

/// An async sleep precise to microseconds: a `timerfd` the runtime's IO driver watches, where
/// tokio's own timer rounds up to its next millisecond tick.
pub struct PreciseTimer {
    fd: Option<AsyncFd<OwnedFd>>,
}

impl PreciseTimer {
    /// Falls back to tokio's timer (millisecond ticks) where `timerfd` is unavailable.
    pub fn new() -> PreciseTimer {
        // SAFETY: timerfd_create takes two flags and returns a new descriptor or -1.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        let fd = (raw >= 0)
            // SAFETY: `raw` is a descriptor just created and owned by nobody else.
            .then(|| unsafe { OwnedFd::from_raw_fd(raw) })
            // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and the same
            // for the AsyncFd's whole life.
            .and_then(|fd| unsafe { AsyncFd::register(fd) }.ok());
        if fd.is_none() {
            tracing::debug!("no timerfd: waits use tokio's millisecond timer");
        }
        PreciseTimer { fd }
    }

    /// Whether waits use the `timerfd` (false: tokio's millisecond timer).
    pub fn is_precise(&self) -> bool {
        self.fd.is_some()
    }

    /// Waits until `deadline` (returns at once if it has passed).
    pub async fn sleep_until(&self, deadline: Instant) {
        let now = Instant::now();
        if deadline <= now {
            return;
        }
        let Some(fd) = &self.fd else {
            tokio::time::sleep_until(deadline.into()).await;
            return;
        };
        let wait = deadline - now;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the descriptor is a timerfd we own; `spec` is a valid itimerspec; a relative
        // one-shot timer (flags 0), old value not wanted.
        let set = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if set != 0 {
            tokio::time::sleep_until(deadline.into()).await;
            return;
        }
        loop {
            let Ok(mut ready) = fd.readable().await else {
                tokio::time::sleep_until(deadline.into()).await;
                return;
            };
            let mut expirations = [0u8; 8];
            // SAFETY: reading 8 bytes (the expiration count) into an 8-byte buffer.
            let read = unsafe {
                libc::read(
                    fd.as_raw_fd(),
                    expirations.as_mut_ptr().cast(),
                    expirations.len(),
                )
            };
            if read == 8 {
                return;
            }
            ready.clear_ready();
        }
    }
}

impl Default for PreciseTimer {
    fn default() -> Self {
        PreciseTimer::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::PreciseTimer;

    #[tokio::test(flavor = "current_thread")]
    async fn a_timer_wakes_at_its_deadline_not_at_the_next_millisecond_tick() {
        let timer = PreciseTimer::new();
        assert!(timer.is_precise(), "timerfd works on Linux");
        let mut lateness = Vec::new();
        for _ in 0..50 {
            let deadline = Instant::now() + Duration::from_micros(300);
            timer.sleep_until(deadline).await;
            let now = Instant::now();
            assert!(now >= deadline, "never early");
            lateness.push(now - deadline);
        }
        lateness.sort();
        // tokio's timer would wake 0.7-1 ms late: its next tick is 1 ms after the last.
        let median = lateness[lateness.len() / 2];
        assert!(
            median < Duration::from_micros(500),
            "median lateness {median:?}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_given_up_leaves_the_next_one_exact() {
        let timer = PreciseTimer::new();
        // A wait dropped before its deadline (a select! that took another branch) leaves the
        // timer armed; the next wait must not return at that old deadline.
        let first = Instant::now() + Duration::from_millis(5);
        let _ = tokio::time::timeout(Duration::from_micros(100), timer.sleep_until(first)).await;
        std::thread::sleep(Duration::from_millis(10));
        let second = Instant::now() + Duration::from_millis(20);
        timer.sleep_until(second).await;
        assert!(Instant::now() >= second, "woke at the old deadline");
    }
}
