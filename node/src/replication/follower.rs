//! A follower's replication decisions for one partition under one leadership (leader, epoch):
//! what to fetch, when to fetch ahead, where to truncate, when to start over, when to back off,
//! and which high watermark and log start to take from the leader.
//!
//! Call order: [`Follower::new`], then drain [`Follower::poll_action`] and carry out each
//! action, feeding its outcome back through the matching `handle_*` call; when no action is
//! left, wait for an answer to a fetch in flight or for [`Follower::poll_timeout`], then call
//! [`Follower::handle_timeout`]. Time is an argument; nothing here does IO.
//!
//! A pass starts from what the log says it holds ([`FollowerAction::ReadLog`]): at the start and
//! after anything other than a clean append (a failed or refused fetch, a divergence, a restart
//! past the leader's log start, an append that no longer fits). Answers to fetches sent before a
//! pass started are ignored. While the follower is behind (an answer ends below the leader's log
//! end and is large), the next fetch goes out before the answer is appended, so the link moves
//! bytes while the disk takes them; that fetch reports the log end as it was, so the leader counts
//! only what is written. A caught-up follower fetches after each append, which reports it at once.

use std::collections::VecDeque;

use strata_wire::protocol::ErrorCode;

use super::Divergence;

/// A follower's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerConfig {
    /// Fetch ahead only after answers at least this large: the follower is catching up a
    /// backlog. Below it, the next fetch follows the append, so the leader learns of the append
    /// at once (the `acks=all` path).
    pub fetch_ahead_bytes_min: u64,
    /// The first retry waits this long after a failed or refused fetch; each further failure
    /// adds as much, up to [`FollowerConfig::backoff_steps_max`] times.
    pub backoff_step_ms: i64,
    pub backoff_steps_max: u32,
}

/// What the follower's log holds, as the log task reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPosition {
    pub log_start: u64,
    pub log_end: u64,
    /// The leader epoch of its last batch (`None` for an empty log).
    pub latest_epoch: Option<u32>,
}

/// Names a fetch so its answer is matched to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FetchId(u64);

/// A fetch to send to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPlan {
    pub id: FetchId,
    pub fetch_offset: u64,
    pub last_fetched_epoch: Option<u32>,
    /// What the log holds (its progress, reported to the leader); at or below `fetch_offset`.
    pub log_end: u64,
    /// Sent before an answer of this many bytes is appended (0 for a fetch after the append):
    /// its records will follow those in the log.
    pub after_bytes: u64,
}

/// The leader's answer to a fetch, as far as the follower's decisions need it; `R` carries
/// the records to append.
#[derive(Debug)]
pub struct FetchAnswer<R> {
    pub error: ErrorCode,
    pub high_watermark: u64,
    pub log_start: u64,
    pub log_end: u64,
    pub diverging: Option<Divergence>,
    pub records: R,
    /// The records' length in bytes.
    pub bytes: u64,
    /// The last whole batch's next offset and leader epoch, when the records parse.
    pub last_batch: Option<(u64, u32)>,
}

/// Why a follower stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The log could not say what it holds.
    LogUnreadable,
    AppendFailed,
    TruncationFailed,
    RestartFailed,
    LogStartMoveFailed,
}

/// What the driver does next.
#[derive(Debug)]
pub enum FollowerAction<R> {
    /// Ask the log what it holds; answer with [`Follower::handle_log_read`].
    ReadLog,
    /// Drop every fetch in flight: their answers would be ignored.
    AbandonFetches,
    /// Send a fetch; answer with [`Follower::handle_fetch_answer`] or
    /// [`Follower::handle_fetch_failed`].
    Fetch(FetchPlan),
    /// Append the records verbatim; answer with [`Follower::handle_appended`].
    Append { records: R, bytes: u64 },
    /// Cut the log where the leader says it diverges; answer with [`Follower::handle_truncated`].
    Truncate(Divergence),
    /// The leader no longer holds the log's end: empty the log and start it at this offset;
    /// answer with [`Follower::handle_restarted`].
    RestartAt(u64),
    /// Remove records below this offset (the leader's log start moved); answer with
    /// [`Follower::handle_log_start_moved`].
    MoveLogStart(u64),
    /// The follower is done: log why and end the loop.
    Stop(StopReason),
}

/// The outcome of an [`FollowerAction::Append`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Appended; the log now ends here.
    Ends(u64),
    /// The records do not follow the log's end (a truncation or restart came between).
    NotContiguous,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the log's position (a pass starts).
    ReadingLog,
    /// Waiting for the oldest fetch in flight.
    Fetching,
    /// Waiting for an append, a truncation, a restart or a log start move.
    Writing,
    /// Waiting until the time given, then a new pass.
    BackingOff(i64),
    Stopped,
}

/// Marks the leader sent with records being appended, taken once they are.
#[derive(Debug, Clone, Copy)]
struct PendingMarks {
    high_watermark: u64,
    leader_log_start: u64,
    last_epoch: Option<u32>,
}

pub struct Follower<R> {
    config: FollowerConfig,
    phase: Phase,
    actions: VecDeque<FollowerAction<R>>,
    /// Fetches sent and not answered, oldest first.
    in_flight: VecDeque<FetchId>,
    next_fetch: u64,
    log_start: u64,
    log_end: u64,
    last_epoch: Option<u32>,
    /// As the leader last said, bounded by this log's end.
    high_watermark: u64,
    failures: u32,
    marks: Option<PendingMarks>,
}

impl<R> Follower<R> {
    /// A follower whose log's readers were last told `high_watermark`.
    pub fn new(config: FollowerConfig, high_watermark: u64) -> Follower<R> {
        let mut follower = Follower {
            config,
            phase: Phase::ReadingLog,
            actions: VecDeque::new(),
            in_flight: VecDeque::new(),
            next_fetch: 0,
            log_start: 0,
            log_end: 0,
            last_epoch: None,
            high_watermark,
            failures: 0,
            marks: None,
        };
        follower.actions.push_back(FollowerAction::ReadLog);
        follower
    }

    /// The high watermark this replica's readers may see.
    pub fn high_watermark(&self) -> u64 {
        self.high_watermark
    }

    /// Failed or refused fetches in a row (the driver rate-limits its reports by it).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    pub fn poll_action(&mut self) -> Option<FollowerAction<R>> {
        self.actions.pop_front()
    }

    /// When [`Follower::handle_timeout`] is due, if anything waits for a time.
    pub fn poll_timeout(&self) -> Option<i64> {
        match self.phase {
            Phase::BackingOff(until) => Some(until),
            _ => None,
        }
    }

    /// Whether `id` is the fetch whose answer the follower waits for now.
    pub fn awaits(&self, id: FetchId) -> bool {
        self.phase == Phase::Fetching && self.in_flight.front() == Some(&id)
    }

    pub fn handle_timeout(&mut self, now_ms: i64) {
        if let Phase::BackingOff(until) = self.phase
            && now_ms >= until
        {
            self.start_pass();
        }
    }

    pub fn handle_log_read(&mut self, _now_ms: i64, position: Option<LogPosition>) {
        if self.phase != Phase::ReadingLog {
            return;
        }
        let Some(position) = position else {
            return self.stop(StopReason::LogUnreadable);
        };
        self.log_start = position.log_start;
        self.log_end = position.log_end;
        self.last_epoch = position.latest_epoch;
        self.fetch_next(0);
    }

    /// The fetch `id` got no answer (the link failed, or the answer did not decode).
    pub fn handle_fetch_failed(&mut self, now_ms: i64, id: FetchId) {
        if !self.take_answer(id) {
            return;
        }
        self.back_off(now_ms);
    }

    pub fn handle_fetch_answer(&mut self, now_ms: i64, id: FetchId, answer: FetchAnswer<R>) {
        if !self.take_answer(id) {
            return;
        }
        match answer.error {
            ErrorCode::None => {}
            ErrorCode::OffsetOutOfRange if answer.log_start > self.log_end => {
                // The leader's retention removed what this log would fetch next.
                self.abandon_fetches();
                self.phase = Phase::Writing;
                self.actions
                    .push_back(FollowerAction::RestartAt(answer.log_start));
                return;
            }
            // Not (yet) the leader, or a different epoch: the state will change.
            _ => return self.back_off(now_ms),
        }
        self.failures = 0;
        if let Some(divergence) = answer.diverging {
            self.abandon_fetches();
            self.phase = Phase::Writing;
            self.actions.push_back(FollowerAction::Truncate(divergence));
            return;
        }
        let marks = PendingMarks {
            high_watermark: answer.high_watermark,
            leader_log_start: answer.log_start,
            last_epoch: answer
                .last_batch
                .map(|(_, epoch)| epoch)
                .or(self.last_epoch),
        };
        if answer.bytes == 0 {
            self.marks = Some(marks);
            return self.follow_marks();
        }
        if let Some((next_offset, epoch)) = answer.last_batch
            && next_offset < answer.log_end
            && answer.bytes >= self.config.fetch_ahead_bytes_min
            && self.in_flight.is_empty()
        {
            self.send_fetch(next_offset, Some(epoch), answer.bytes);
        }
        self.marks = Some(marks);
        self.phase = Phase::Writing;
        self.actions.push_back(FollowerAction::Append {
            records: answer.records,
            bytes: answer.bytes,
        });
    }

    pub fn handle_appended(&mut self, _now_ms: i64, outcome: Appended) {
        if self.phase != Phase::Writing {
            return;
        }
        match outcome {
            Appended::Ends(log_end) => {
                assert!(
                    log_end >= self.log_end,
                    "an append moved the log end back from {} to {log_end}",
                    self.log_end
                );
                self.log_end = log_end;
                if let Some(marks) = &self.marks {
                    self.last_epoch = marks.last_epoch;
                }
                self.follow_marks();
            }
            Appended::NotContiguous => self.start_pass(),
            Appended::Failed => self.stop(StopReason::AppendFailed),
        }
    }

    /// The log was cut at the leader's divergence and now ends at `log_end` (`None`: failed).
    pub fn handle_truncated(&mut self, _now_ms: i64, log_end: Option<u64>) {
        if self.phase != Phase::Writing {
            return;
        }
        let Some(log_end) = log_end else {
            return self.stop(StopReason::TruncationFailed);
        };
        self.high_watermark = self.high_watermark.min(log_end);
        self.start_pass();
    }

    pub fn handle_restarted(&mut self, _now_ms: i64, done: bool) {
        if self.phase != Phase::Writing {
            return;
        }
        if !done {
            return self.stop(StopReason::RestartFailed);
        }
        self.start_pass();
    }

    /// The log start moved up to `log_start` (`None`: failed).
    pub fn handle_log_start_moved(&mut self, _now_ms: i64, log_start: Option<u64>) {
        if self.phase != Phase::Writing {
            return;
        }
        let Some(log_start) = log_start else {
            return self.stop(StopReason::LogStartMoveFailed);
        };
        self.log_start = self.log_start.max(log_start);
        self.fetch_or_wait();
    }

    /// Takes the leader's high watermark and log start as far as this log holds them: the high
    /// watermark for its readers, and the log start moved up when the leader's moved
    /// (DeleteRecords, retention), as Kafka's followers do. Then the next fetch.
    fn follow_marks(&mut self) {
        let Some(marks) = self.marks.take() else {
            return self.fetch_or_wait();
        };
        let known = marks.high_watermark.min(self.log_end);
        self.high_watermark = self.high_watermark.max(known);
        let leader_start = marks.leader_log_start.min(known);
        if leader_start > self.log_start {
            self.phase = Phase::Writing;
            self.actions
                .push_back(FollowerAction::MoveLogStart(leader_start));
            return;
        }
        self.fetch_or_wait();
    }

    /// The next fetch, unless one sent ahead is still out.
    fn fetch_or_wait(&mut self) {
        if self.in_flight.is_empty() {
            self.fetch_next(0);
        } else {
            self.phase = Phase::Fetching;
        }
    }

    fn fetch_next(&mut self, after_bytes: u64) {
        self.send_fetch(self.log_end, self.last_epoch, after_bytes);
        self.phase = Phase::Fetching;
    }

    fn send_fetch(&mut self, fetch_offset: u64, last_fetched_epoch: Option<u32>, after_bytes: u64) {
        debug_assert!(self.log_end <= fetch_offset);
        let id = FetchId(self.next_fetch);
        self.next_fetch += 1;
        self.in_flight.push_back(id);
        self.actions.push_back(FollowerAction::Fetch(FetchPlan {
            id,
            fetch_offset,
            last_fetched_epoch,
            log_end: self.log_end,
            after_bytes,
        }));
    }

    /// Whether `id` is the fetch awaited; taken off the fetches in flight if it is.
    fn take_answer(&mut self, id: FetchId) -> bool {
        if !self.awaits(id) {
            return false;
        }
        self.in_flight.pop_front();
        true
    }

    fn back_off(&mut self, now_ms: i64) {
        self.abandon_fetches();
        self.failures = self.failures.saturating_add(1);
        let steps = i64::from(self.failures.min(self.config.backoff_steps_max));
        self.phase = Phase::BackingOff(now_ms + self.config.backoff_step_ms * steps);
    }

    fn start_pass(&mut self) {
        self.abandon_fetches();
        self.marks = None;
        self.phase = Phase::ReadingLog;
        self.actions.push_back(FollowerAction::ReadLog);
    }

    fn abandon_fetches(&mut self) {
        if !self.in_flight.is_empty() {
            self.in_flight.clear();
            self.actions.push_back(FollowerAction::AbandonFetches);
        }
    }

    fn stop(&mut self, reason: StopReason) {
        self.abandon_fetches();
        self.phase = Phase::Stopped;
        self.actions.push_back(FollowerAction::Stop(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: FollowerConfig = FollowerConfig {
        fetch_ahead_bytes_min: 50,
        backoff_step_ms: 50,
        backoff_steps_max: 10,
    };

    fn answer(records: &'static str, last_batch: Option<(u64, u32)>) -> FetchAnswer<&'static str> {
        FetchAnswer {
            error: ErrorCode::None,
            high_watermark: 0,
            log_start: 0,
            log_end: last_batch.map_or(0, |(next, _)| next),
            diverging: None,
            records,
            bytes: records.len() as u64,
            last_batch,
        }
    }

    fn started(log_end: u64, high_watermark: u64) -> (Follower<&'static str>, FetchPlan) {
        let mut follower = Follower::new(CONFIG, high_watermark);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::ReadLog)
        ));
        let position = LogPosition {
            log_start: 0,
            log_end,
            latest_epoch: Some(1),
        };
        follower.handle_log_read(0, Some(position));
        let Some(FollowerAction::Fetch(plan)) = follower.poll_action() else {
            panic!("a pass starts with a fetch from the log end");
        };
        assert_eq!((plan.fetch_offset, plan.log_end), (log_end, log_end));
        (follower, plan)
    }

    #[test]
    fn appends_then_fetches_from_the_new_end_and_takes_the_high_watermark_it_holds() {
        let (mut follower, plan) = started(10, 3);
        let mut answered = answer("abc", Some((12, 1)));
        answered.high_watermark = 20;
        follower.handle_fetch_answer(1, plan.id, answered);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::Append {
                records: "abc",
                bytes: 3
            })
        ));
        assert!(
            follower.poll_action().is_none(),
            "no fetch before a small append"
        );
        follower.handle_appended(2, Appended::Ends(12));
        assert_eq!(
            follower.high_watermark(),
            12,
            "never above what the log holds"
        );
        let Some(FollowerAction::Fetch(next)) = follower.poll_action() else {
            panic!("the next fetch follows the append");
        };
        assert_eq!(
            (next.fetch_offset, next.log_end, next.after_bytes),
            (12, 12, 0)
        );
    }

    #[test]
    fn a_large_answer_behind_the_leader_sends_the_next_fetch_before_its_append() {
        let (mut follower, plan) = started(0, 0);
        let records = "an answer larger than the fifty bytes that make a fetch ahead worth it";
        let mut answered = answer(records, Some((50, 2)));
        answered.log_end = 80;
        follower.handle_fetch_answer(1, plan.id, answered);
        let Some(FollowerAction::Fetch(ahead)) = follower.poll_action() else {
            panic!("fetch ahead first");
        };
        assert_eq!(ahead.fetch_offset, 50);
        assert_eq!(ahead.last_fetched_epoch, Some(2));
        assert_eq!(ahead.log_end, 0, "reports only what is written");
        assert_eq!(ahead.after_bytes, records.len() as u64);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::Append { .. })
        ));
        assert!(!follower.awaits(ahead.id), "the append comes first");
        follower.handle_appended(2, Appended::Ends(50));
        assert!(
            follower.poll_action().is_none(),
            "the fetch ahead is still out"
        );
        assert!(follower.awaits(ahead.id));
    }

    #[test]
    fn a_divergence_truncates_and_lowers_the_high_watermark_then_starts_over() {
        let (mut follower, plan) = started(10, 8);
        let mut answered = answer("", None);
        let divergence = Divergence {
            epoch: Some(1),
            end_offset: 6,
        };
        answered.diverging = Some(divergence);
        follower.handle_fetch_answer(1, plan.id, answered);
        assert!(
            matches!(follower.poll_action(), Some(FollowerAction::Truncate(d)) if d == divergence)
        );
        follower.handle_truncated(2, Some(6));
        assert_eq!(follower.high_watermark(), 6);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::ReadLog)
        ));
    }

    #[test]
    fn a_refused_fetch_backs_off_longer_each_time_and_ignores_late_answers() {
        let (mut follower, plan) = started(0, 0);
        let mut refused = answer("", None);
        refused.error = ErrorCode::NotLeader;
        follower.handle_fetch_answer(100, plan.id, refused);
        assert_eq!(follower.poll_timeout(), Some(150));
        follower.handle_timeout(149);
        assert!(follower.poll_action().is_none(), "not before its time");
        follower.handle_timeout(150);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::ReadLog)
        ));
        follower.handle_log_read(
            150,
            Some(LogPosition {
                log_start: 0,
                log_end: 0,
                latest_epoch: None,
            }),
        );
        let Some(FollowerAction::Fetch(second)) = follower.poll_action() else {
            panic!("fetch again");
        };
        // A late answer to the first fetch changes nothing.
        follower.handle_fetch_answer(151, plan.id, answer("late", Some((1, 1))));
        assert!(follower.poll_action().is_none());
        follower.handle_fetch_failed(160, second.id);
        assert_eq!(
            follower.poll_timeout(),
            Some(260),
            "two steps after two failures"
        );
    }

    #[test]
    fn out_of_range_below_the_leaders_start_restarts_the_log_there() {
        let (mut follower, plan) = started(5, 0);
        let mut answered = answer("", None);
        answered.error = ErrorCode::OffsetOutOfRange;
        answered.log_start = 40;
        follower.handle_fetch_answer(1, plan.id, answered);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::RestartAt(40))
        ));
        follower.handle_restarted(2, true);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::ReadLog)
        ));
    }

    #[test]
    fn the_leaders_log_start_moves_this_one_up_as_far_as_it_is_committed() {
        let (mut follower, plan) = started(10, 10);
        let mut answered = answer("", None);
        answered.high_watermark = 10;
        answered.log_start = 7;
        follower.handle_fetch_answer(1, plan.id, answered);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::MoveLogStart(7))
        ));
        follower.handle_log_start_moved(2, Some(7));
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::Fetch(_))
        ));
    }

    #[test]
    fn a_log_failure_stops_the_follower() {
        let (mut follower, plan) = started(0, 0);
        follower.handle_fetch_answer(1, plan.id, answer("x", Some((1, 1))));
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::Append { .. })
        ));
        follower.handle_appended(2, Appended::Failed);
        assert!(matches!(
            follower.poll_action(),
            Some(FollowerAction::Stop(StopReason::AppendFailed))
        ));
        assert!(follower.is_stopped());
    }
}
