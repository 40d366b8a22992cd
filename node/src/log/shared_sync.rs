//! One `syncfs` for the interval flushes of all the logs of a shard.
//!
//! With `flush=interval` each log used to `fdatasync` its own files once per interval. On a
//! broker with thousands of partitions that is thousands of syncs a second, each writing its
//! inode and flushing the device's write cache: 2,000 files took 180–290 ms of `fdatasync`s
//! here, one `syncfs` over the same writes 12–25 ms. Logs now join rounds instead: a round
//! starts [`DEFAULT_GATHER`] after its first job joined (and after the round before it ended),
//! makes one `syncfs` of the filesystem holding the data directory, and answers every job that
//! joined before it started. A round of fewer than [`DEFAULT_MIN_LOGS`] jobs makes none: its
//! logs sync their own files.
//!
//! Why that is as durable as the jobs' own syncs: `syncfs` writes back every dirty page and
//! inode of the filesystem that exists when it is called, waits for them, and flushes the
//! device's cache (ext4 and XFS), so every write completed before a job joined is covered.
//! Why a failure is still attributed to its file: since Linux 5.8 `syncfs` reports writeback
//! errors, and the same error stays recorded against the file's own mapping; when a round
//! fails, each of its jobs runs its own `fdatasync`s, which say which file failed (and the log
//! then fails stop as before).
//!
//! `flush=always` keeps per-log syncs: an acknowledgement must not wait for the writeback of
//! everything else on the filesystem.

use std::cell::{Cell, RefCell};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Shared;
use tokio::sync::oneshot;

use crate::clock::Clock;

/// How long a round waits for more jobs after its first: rounds of a 1 s interval then serve
/// the partitions that came due within this window together, for a bound on data at risk that
/// grows by as much.
pub const DEFAULT_GATHER: Duration = Duration::from_millis(20);

/// A round of fewer logs than this syncs no filesystem: its logs sync their own files, as
/// before rounds existed. A few `fdatasync`s cost little, and a broker with few partitions
/// (a laptop's quickstart on the root filesystem, say) then never makes `syncfs` wait for
/// everything else written there.
pub const DEFAULT_MIN_LOGS: usize = 8;

/// A round's outcome, shared by its jobs: whether it synced the filesystem for them (`false`:
/// too few to bother), or `errno` (`io::Error` is not `Clone`).
type Round = Shared<oneshot::Receiver<Result<bool, i32>>>;
/// Where a round's outcome is sent, and the round its jobs wait on.
type NextRound = (oneshot::Sender<Result<bool, i32>>, Round);

/// The shard's sync rounds. Shard-local (`Rc`); every method runs on the shard's thread.
pub struct SharedSync {
    /// The data directory, opened to name its filesystem to `syncfs`.
    filesystem: Arc<std::fs::File>,
    /// The filesystem's device: a log elsewhere (a symlinked folder) syncs on its own.
    device: u64,
    gather: Duration,
    min_logs: usize,
    /// The round jobs join now; taken when it starts.
    next: RefCell<Option<NextRound>>,
    /// Jobs that joined the round in `next`.
    next_jobs: Cell<usize>,
    /// The round that started last, until it ends: the next one waits for it.
    running: RefCell<Option<Round>>,
    /// Device writes in flight on this shard (as the log task's `WriterTuning::device_writes`).
    device_writes: Option<Arc<tokio::sync::Semaphore>>,
    /// Where each `syncfs` takes its duration (µs): the shard's fsync histogram.
    latency_us: Option<Rc<RefCell<hdrhistogram::Histogram<u64>>>>,
    rounds: Cell<u64>,
    jobs: Cell<u64>,
    /// Fault injection: rounds fail with this errno instead of calling `syncfs`.
    fault: Cell<Option<i32>>,
}

impl std::fmt::Debug for SharedSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSync")
            .field("device", &self.device)
            .field("gather", &self.gather)
            .field("rounds", &self.rounds.get())
            .field("jobs", &self.jobs.get())
            .finish_non_exhaustive()
    }
}

impl SharedSync {
    /// Rounds for the logs under `data_dir`.
    pub fn open(
        data_dir: &Path,
        gather: Duration,
        min_logs: usize,
        device_writes: Option<Arc<tokio::sync::Semaphore>>,
        latency_us: Option<Rc<RefCell<hdrhistogram::Histogram<u64>>>>,
    ) -> std::io::Result<Rc<SharedSync>> {
        if !syncfs_reports_errors() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "syncfs reports writeback errors from Linux 5.8 on",
            ));
        }
        let filesystem = std::fs::File::open(data_dir)?;
        let device = device_of(&filesystem)?;
        Ok(Rc::new(SharedSync {
            filesystem: Arc::new(filesystem),
            device,
            gather,
            min_logs,
            next: RefCell::new(None),
            next_jobs: Cell::new(0),
            running: RefCell::new(None),
            device_writes,
            latency_us,
            rounds: Cell::new(0),
            jobs: Cell::new(0),
            fault: Cell::new(None),
        }))
    }

    /// True when `dir` is on the filesystem the rounds sync.
    pub fn covers(&self, dir: &Path) -> bool {
        std::fs::File::open(dir)
            .and_then(|dir| device_of(&dir))
            .is_ok_and(|device| device == self.device)
    }

    /// Waits for a round that starts after this call. `true`: every write completed before
    /// the call is durable. `false` (a round of too few logs), or an error: the caller syncs
    /// its own files (which, after an error, finds the file that failed).
    pub async fn sync(self: &Rc<Self>) -> std::io::Result<bool> {
        self.next_jobs.set(self.next_jobs.get() + 1);
        let round = {
            let mut next = self.next.borrow_mut();
            match &*next {
                Some((_, round)) => round.clone(),
                None => {
                    let (done, round) = oneshot::channel();
                    let round = round.shared();
                    *next = Some((done, round.clone()));
                    tokio::task::spawn_local(self.clone().run_round());
                    round
                }
            }
        };
        match round.await {
            Ok(Ok(synced)) => Ok(synced),
            Ok(Err(errno)) => Err(std::io::Error::from_raw_os_error(errno)),
            Err(_) => Err(std::io::Error::other("the sync round was dropped")),
        }
    }

    async fn run_round(self: Rc<Self>) {
        // The runtime's clock, the one every timer of the broker runs on.
        Clock::SYSTEM.sleep(self.gather).await;
        let previous = self.running.borrow().clone();
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        let (done, round) = self
            .next
            .borrow_mut()
            .take()
            .expect("one task per round, and only it takes the round");
        *self.running.borrow_mut() = Some(round);
        // Joins from here on go to the next round: this one may miss their writes.
        let joined = self.next_jobs.replace(0);
        if joined < self.min_logs {
            let _ = done.send(Ok(false));
            return;
        }
        let _permit = match &self.device_writes {
            Some(limit) => limit.clone().acquire_owned().await.ok(),
            None => None,
        };
        let started = std::time::Instant::now();
        let filesystem = self.filesystem.clone();
        let fault = self.fault.get();
        let result = tokio::task::spawn_blocking(move || {
            if let Some(errno) = fault {
                return Err(errno);
            }
            // SAFETY: plain syscall on a descriptor `filesystem` keeps open for the call.
            let rc = unsafe { libc::syncfs(filesystem.as_raw_fd()) };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO))
            }
        })
        .await
        .unwrap_or(Err(libc::EIO));
        if let Some(histogram) = &self.latency_us {
            let _ = histogram
                .borrow_mut()
                .record((started.elapsed().as_micros() as u64).max(1));
        }
        self.rounds.set(self.rounds.get() + 1);
        self.jobs.set(self.jobs.get() + joined as u64);
        if let Err(errno) = result {
            tracing::warn!(
                "syncfs of the data directory's filesystem failed ({}): each log syncs its own files",
                std::io::Error::from_raw_os_error(errno)
            );
        }
        let _ = done.send(result.map(|()| true));
    }

    /// `syncfs` calls made so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.get()
    }

    /// Logs' interval syncs those calls served.
    pub fn jobs(&self) -> u64 {
        self.jobs.get()
    }

    /// Fault injection for tests: every later round fails with `errno` without syncing.
    #[doc(hidden)]
    pub fn fail_rounds_with(&self, errno: i32) {
        self.fault.set(Some(errno));
    }
}

/// Linux 5.8 and later: before, `syncfs` returned 0 whatever writeback failed.
fn syncfs_reports_errors() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (5, 8)
}

fn device_of(file: &std::fs::File) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn open(dir: &Path, gather_ms: u64, min_logs: usize) -> Rc<SharedSync> {
        SharedSync::open(dir, Duration::from_millis(gather_ms), min_logs, None, None).unwrap()
    }

    #[test]
    fn jobs_that_join_together_share_one_syncfs() {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(tokio::task::LocalSet::new().run_until(async {
            let shared = open(dir.path(), 20, 8);
            let jobs: Vec<_> = (0..50).map(|_| shared.sync()).collect();
            for result in futures_util::future::join_all(jobs).await {
                assert!(result.unwrap(), "synced by the round");
            }
            assert_eq!((shared.rounds(), shared.jobs()), (1, 50));
            // Jobs after a round ended get a round of their own.
            let jobs: Vec<_> = (0..8).map(|_| shared.sync()).collect();
            futures_util::future::join_all(jobs).await;
            assert_eq!((shared.rounds(), shared.jobs()), (2, 58));
        }));
    }

    #[test]
    fn a_round_of_few_logs_leaves_them_to_sync_their_own_files() {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(tokio::task::LocalSet::new().run_until(async {
            let shared = open(dir.path(), 5, 8);
            let jobs: Vec<_> = (0..7).map(|_| shared.sync()).collect();
            for result in futures_util::future::join_all(jobs).await {
                assert!(!result.unwrap(), "not synced: too few");
            }
            assert_eq!((shared.rounds(), shared.jobs()), (0, 0));
        }));
    }

    #[test]
    fn a_job_that_joins_while_a_round_runs_waits_for_the_next_round() {
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(tokio::task::LocalSet::new().run_until(async {
            let shared = open(dir.path(), 5, 1);
            let first = tokio::task::spawn_local({
                let shared = shared.clone();
                async move { shared.sync().await }
            });
            // Past the first round's gathering: it has started (or ended), so this job cannot
            // count on it.
            tokio::time::sleep(Duration::from_millis(15)).await;
            assert!(
                shared.next.borrow().is_none(),
                "the first round has started"
            );
            assert!(shared.sync().await.unwrap());
            assert!(first.await.unwrap().unwrap());
            assert_eq!(shared.rounds(), 2);
        }));
    }

    #[test]
    fn covers_only_its_own_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let shared = open(dir.path(), 20, 8);
        assert!(shared.covers(dir.path()));
        // /proc is never the data directory's filesystem.
        assert!(!shared.covers(Path::new("/proc/self")));
        assert!(!shared.covers(&dir.path().join("missing")));
    }
}
