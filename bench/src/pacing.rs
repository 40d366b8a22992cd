//! Open-loop pacing precise to tens of microseconds.
//!
//! tokio's timer wheel ticks once a millisecond and rounds every deadline up to the next tick,
//! so a record due between ticks leaves up to 1 ms late. The bench counts latency from the
//! intended send time (as it must, or a stalled broker would hide behind a waiting generator),
//! so that lateness showed up as broker latency: a 1 ms floor under every percentile (p50
//! 976 µs at 1,000 records/s with one record per request). Paced producers
//! therefore run on OS threads of their own, each with its own single-threaded runtime and
//! client ([`on_own_runtime`]), and wait on a `timerfd` ([`PreciseTimer`]) that wakes within
//! tens of microseconds; nothing they do crosses threads. (A pinned producer's per-batch loop
//! uses [`on_pacing_thread`]: a plain sleep with 1 µs timer slack, driving its async work
//! through the shared runtime's handle.) Wake-ups are not free either, so a paced thread
//! sleeps at least [`QUANTUM`] and sends everything that fell due meanwhile.

use std::future::Future;
use std::time::{Duration, Instant};

pub use strata_client::PreciseTimer;

/// Runs the future `make` returns on a new OS thread of its own, driven by the current tokio
/// runtime's IO and timer drivers (`Handle::block_on`), and resolves to its output. Only there
/// may [`Schedule::wait_until_due`] block. Must be called inside a runtime.
pub fn on_pacing_thread<F, Fut>(
    name: &str,
    make: F,
) -> impl Future<Output = anyhow::Result<Fut::Output>> + use<F, Fut>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    on_thread(name, "a pacing thread panicked", move || {
        runtime.block_on(make())
    })
}

/// Runs `run` on a new OS thread with 1 µs timer slack; resolves to what it returns.
fn on_thread<T, R>(
    name: &str,
    panicked: &'static str,
    run: R,
) -> impl Future<Output = anyhow::Result<T>> + use<T, R>
where
    T: Send + 'static,
    R: FnOnce() -> T + Send + 'static,
{
    let (done, output) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            set_fine_timer_slack();
            let _ = done.send(run());
        });
    async move {
        spawned?;
        output.await.map_err(|_| anyhow::anyhow!(panicked))
    }
}

/// Asks the kernel to wake this thread's sleeps within 1 µs of their deadline instead of the
/// default 50 µs slack.
fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer (nanoseconds) and touches only this thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
    if rc != 0 {
        tracing::debug!(
            "PR_SET_TIMERSLACK failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// An open-loop schedule: item `n` is due `n / rate` seconds after the start, whatever happened
/// to the items before it.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    start: Instant,
    /// Items per second; `None`: everything is due at once (closed loop, as fast as it goes).
    rate: Option<f64>,
}

impl Schedule {
    pub fn new(start: Instant, rate: Option<f64>) -> Schedule {
        assert!(
            rate.is_none_or(|rate| rate > 0.0),
            "a rate must be positive"
        );
        Schedule { start, rate }
    }

    /// When item `n` is due (now, without a rate).
    pub fn due_at(&self, n: u64) -> Instant {
        match self.rate {
            Some(rate) => self.start + Duration::from_secs_f64(n as f64 / rate),
            None => Instant::now(),
        }
    }

    /// How many items are due by `now`.
    pub fn due_by(&self, now: Instant) -> u64 {
        match self.rate {
            Some(rate) => {
                (now.saturating_duration_since(self.start).as_secs_f64() * rate) as u64 + 1
            }
            None => u64::MAX,
        }
    }

    /// Blocks this thread until item `n` is due and returns its due time, which stays the
    /// intended time even when the caller is late. Call only on a pacing thread.
    pub fn wait_until_due(&self, n: u64) -> Instant {
        let due = self.due_at(n);
        sleep_until(due);
        due
    }
}

/// The shortest sleep a pacing thread takes: items due sooner wait for the next wake-up and
/// leave together, at most this late. A wake-up costs ~28 µs of CPU on the 2-core cloud VM of
/// docs/performance.md (timer, thread switch), so sleeping until every item's exact time costs
/// a core at ~35,000 items/s.
pub const QUANTUM: Duration = Duration::from_micros(100);

/// Blocks this thread until `next_due`, but for at least [`QUANTUM`] when it is in the
/// future. Call only on a pacing thread.
pub fn wait_for(next_due: Instant) {
    let now = Instant::now();
    if next_due > now {
        std::thread::sleep((next_due - now).max(QUANTUM));
    }
}

/// Blocks this thread until `deadline`. Call only on a pacing thread.
pub fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// Runs the future `make` returns on a new OS thread with a single-threaded runtime of its own,
/// and resolves to its output. Everything the future spawns (a client's connection and producer
/// tasks) runs on that thread, so handing a record to the producer and its acknowledgement back
/// wakes no other thread: on the VM of docs/performance.md such cross-thread wake-ups were 22%
/// of the bench's samples at 200,000 records/s. Waits use [`PreciseTimer`], so pacing keeps
/// its precision without a sleeping thread.
pub fn on_own_runtime<F, Fut>(
    name: &str,
    make: F,
) -> impl Future<Output = anyhow::Result<Fut::Output>> + use<F, Fut>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    on_thread(name, "a producer thread panicked", move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds")
            .block_on(make())
    })
}

/// Waits on `timer` until `next_due`, but at least [`QUANTUM`] when it is in the future.
pub async fn wait_precisely_for(timer: &PreciseTimer, next_due: Instant) {
    let now = Instant::now();
    if next_due > now {
        timer.sleep_until(now + (next_due - now).max(QUANTUM)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_fall_due_at_the_rate_from_the_start() {
        let start = Instant::now();
        let schedule = Schedule::new(start, Some(1_000.0));
        assert_eq!(schedule.due_at(0), start);
        assert_eq!(schedule.due_at(250), start + Duration::from_millis(250));
        assert_eq!(schedule.due_by(start), 1);
        assert_eq!(schedule.due_by(start + Duration::from_micros(2_500)), 3);
    }

    /// Median lateness of 100 deadlines 500 µs apart, waited for by `wait`.
    async fn median_lateness(mut wait: impl AsyncFnMut(Instant)) -> Duration {
        let schedule = Schedule::new(Instant::now(), Some(2_000.0));
        let mut lateness = Vec::new();
        for n in 1..=100 {
            let due = schedule.due_at(n);
            wait(due).await;
            lateness.push(Instant::now().saturating_duration_since(due));
        }
        lateness.sort();
        lateness[lateness.len() / 2]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_pacing_thread_wakes_closer_to_deadlines_than_tokio_timers() {
        let tokio_timer = median_lateness(async |due| {
            tokio::time::sleep_until(due.into()).await;
        })
        .await;
        let pacing_thread = on_pacing_thread("pacing-test", || {
            median_lateness(async |due| {
                sleep_until(due);
                // An await in between, as the producers do, must still work on this thread.
                tokio::task::yield_now().await;
            })
        })
        .await
        .unwrap();
        // tokio rounds deadlines up to its next 1 ms tick (a median near 500 µs late); the
        // pacing thread wakes within tens of µs on an idle host.
        assert!(
            pacing_thread * 2 < tokio_timer,
            "pacing thread {pacing_thread:?}, tokio timer {tokio_timer:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_precise_timer_on_its_own_runtime_wakes_closer_than_tokio_timers() {
        let tokio_timer = median_lateness(async |due| {
            tokio::time::sleep_until(due.into()).await;
        })
        .await;
        let precise = on_own_runtime("precise-test", || async {
            let timer = PreciseTimer::new();
            assert!(timer.is_precise(), "timerfd works on Linux");
            median_lateness(async |due| timer.sleep_until(due).await).await
        })
        .await
        .unwrap();
        assert!(
            precise * 2 < tokio_timer,
            "timerfd {precise:?}, tokio timer {tokio_timer:?}"
        );
    }
}
