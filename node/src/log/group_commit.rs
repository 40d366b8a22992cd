//! Group commit as a sans-IO state machine: which written appends wait for which sync, and when
//! the next sync starts. The log task (the `writer` module) drives it and runs the syncs.
//!
//! Contract:
//! - At most one sync is in flight. The appends written while it runs form the next group, which
//!   the next sync covers: an append is answered only by a sync that started after its write.
//! - With a group-commit window, written appends wait up to the window (counted from the oldest
//!   of them) for more to join before their sync starts; a sync in flight holds the next group
//!   anyway, so the window only delays a sync on an idle disk.
//! - A sync nothing waits on (the interval policy's) may start whenever none is in flight; it
//!   is marked so, since only such a sync may join the shard's shared round.
//! - Time is an argument (`now`); nothing here reads a clock or does IO.

use std::time::{Duration, Instant};

/// What a sync that [`GroupCommit::poll_sync`] starts is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStart {
    /// Written appends wait for it.
    ForWaiters,
    /// Nothing waits on it (an interval sync): it may join the shard's shared round.
    Unwaited,
}

/// The group-commit policy of one log; `W` is whatever answers a written append.
#[derive(Debug)]
pub struct GroupCommit<W> {
    window: Duration,
    /// Written appends no sync in flight covers, oldest first.
    unsynced: Vec<W>,
    /// When the oldest of `unsynced` was written (the window counts from it).
    unsynced_since: Option<Instant>,
    /// The waiters of the sync in flight, if one is.
    syncing: Option<Vec<W>>,
}

impl<W> GroupCommit<W> {
    pub fn new(window: Duration) -> Self {
        GroupCommit {
            window,
            unsynced: Vec::with_capacity(64),
            unsynced_since: None,
            syncing: None,
        }
    }

    /// An append was written and waits for a sync that starts from now on.
    pub fn on_appended(&mut self, waiter: W, now: Instant) {
        if self.unsynced.is_empty() {
            self.unsynced_since = Some(now);
        }
        self.unsynced.push(waiter);
    }

    pub fn sync_in_flight(&self) -> bool {
        self.syncing.is_some()
    }

    /// Written appends wait for a sync (in flight or still to start).
    pub fn has_waiters(&self) -> bool {
        !self.unsynced.is_empty() || self.syncing.as_ref().is_some_and(|w| !w.is_empty())
    }

    /// Whether a sync starts now; `interval_due` says the flush policy wants one anyway. When
    /// it answers `Some`, the unsynced appends become the new sync's waiters: the caller starts
    /// it, and hands its end (or its failure to start) to [`GroupCommit::on_synced`].
    pub fn poll_sync(&mut self, now: Instant, interval_due: bool) -> Option<SyncStart> {
        if self.syncing.is_some() {
            return None;
        }
        let waiting = !self.unsynced.is_empty() && !self.window_open(now);
        if !waiting && !interval_due {
            return None;
        }
        let start = if self.unsynced.is_empty() {
            SyncStart::Unwaited
        } else {
            SyncStart::ForWaiters
        };
        self.unsynced_since = None;
        self.syncing = Some(std::mem::take(&mut self.unsynced));
        Some(start)
    }

    /// The sync in flight ended (or could not start): its waiters, to answer with its outcome.
    pub fn on_synced(&mut self) -> Vec<W> {
        self.syncing
            .take()
            .expect("on_synced without a sync in flight")
    }

    /// Every written append not yet covered by a sync, taken out (to sync them at once, or to
    /// fail them); the window starts over.
    pub fn take_unsynced(&mut self) -> Vec<W> {
        self.unsynced_since = None;
        std::mem::take(&mut self.unsynced)
    }

    /// How long the log task may wait for commands before polling again: until the window
    /// closes on written appends, or `interval_wait` when the flush policy has one running.
    pub fn poll_timeout(&self, now: Instant, interval_wait: Option<Duration>) -> Option<Duration> {
        let window_left = match self.unsynced_since {
            Some(since) if self.syncing.is_none() && self.window_open(now) => Some(
                self.window
                    .saturating_sub(now.saturating_duration_since(since)),
            ),
            _ => None,
        };
        match (window_left, interval_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn window_open(&self, now: Instant) -> bool {
        self.unsynced_since
            .is_some_and(|since| now.saturating_duration_since(since) < self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn appends_written_during_a_sync_wait_for_the_next_one() {
        let t0 = Instant::now();
        let mut commit = GroupCommit::new(Duration::ZERO);
        commit.on_appended(1, t0);
        commit.on_appended(2, t0);
        assert_eq!(commit.poll_sync(t0, false), Some(SyncStart::ForWaiters));
        // Written while the sync runs: not covered by it.
        commit.on_appended(3, t0 + MS);
        assert_eq!(commit.poll_sync(t0 + MS, false), None, "one sync at a time");
        assert_eq!(commit.on_synced(), vec![1, 2]);
        assert_eq!(
            commit.poll_sync(t0 + 2 * MS, false),
            Some(SyncStart::ForWaiters)
        );
        assert_eq!(commit.on_synced(), vec![3]);
        assert!(!commit.has_waiters());
        assert_eq!(
            commit.poll_sync(t0 + 3 * MS, false),
            None,
            "nothing to sync"
        );
    }

    #[test]
    fn the_window_holds_a_sync_back_from_the_oldest_write() {
        let t0 = Instant::now();
        let mut commit = GroupCommit::new(10 * MS);
        commit.on_appended('a', t0);
        assert_eq!(commit.poll_sync(t0 + 4 * MS, false), None);
        assert_eq!(commit.poll_timeout(t0 + 4 * MS, None), Some(6 * MS));
        // A later append does not move the window.
        commit.on_appended('b', t0 + 6 * MS);
        assert_eq!(commit.poll_timeout(t0 + 6 * MS, None), Some(4 * MS));
        assert_eq!(commit.poll_sync(t0 + 9 * MS, false), None);
        assert_eq!(
            commit.poll_sync(t0 + 10 * MS, false),
            Some(SyncStart::ForWaiters)
        );
        assert_eq!(
            commit.poll_timeout(t0 + 10 * MS, None),
            None,
            "sync in flight"
        );
        assert_eq!(commit.on_synced(), vec!['a', 'b']);
        // The next group's window counts from its own first write.
        commit.on_appended('c', t0 + 30 * MS);
        assert_eq!(commit.poll_sync(t0 + 35 * MS, false), None);
        assert_eq!(
            commit.poll_sync(t0 + 40 * MS, false),
            Some(SyncStart::ForWaiters)
        );
    }

    #[test]
    fn an_interval_sync_has_no_waiters_and_may_join_a_shared_round() {
        let t0 = Instant::now();
        let mut commit: GroupCommit<u8> = GroupCommit::new(Duration::ZERO);
        assert_eq!(commit.poll_sync(t0, false), None);
        assert_eq!(commit.poll_timeout(t0, Some(50 * MS)), Some(50 * MS));
        assert_eq!(commit.poll_sync(t0, true), Some(SyncStart::Unwaited));
        assert!(commit.sync_in_flight());
        assert_eq!(commit.poll_sync(t0, true), None, "one sync at a time");
        assert!(commit.on_synced().is_empty());
    }

    #[test]
    fn the_nearer_of_window_and_interval_bounds_the_wait() {
        let t0 = Instant::now();
        let mut commit = GroupCommit::new(10 * MS);
        commit.on_appended(0, t0);
        assert_eq!(commit.poll_timeout(t0 + 2 * MS, Some(3 * MS)), Some(3 * MS));
        assert_eq!(
            commit.poll_timeout(t0 + 2 * MS, Some(30 * MS)),
            Some(8 * MS)
        );
    }

    #[test]
    fn unsynced_appends_taken_out_restart_the_window() {
        let t0 = Instant::now();
        let mut commit = GroupCommit::new(10 * MS);
        commit.on_appended(1, t0);
        assert_eq!(commit.take_unsynced(), vec![1]);
        assert!(!commit.has_waiters());
        commit.on_appended(2, t0 + 20 * MS);
        assert_eq!(commit.poll_sync(t0 + 25 * MS, false), None);
        assert_eq!(
            commit.poll_sync(t0 + 30 * MS, false),
            Some(SyncStart::ForWaiters)
        );
    }
}
