//! One share group's view of one partition (KIP-932's share-partition), held by the partition's
//! leader: which records are in flight, each one's state and delivery count, the acquisition
//! locks and when they expire. Sans-IO: the host reads the log, hands over what it read
//! ([`LogRun`]s) and the time, persists [`SharePartition::snapshot`] when
//! [`SharePartition::is_dirty`], and writes [`SharePartition::take_dead_letters`] out.
//!
//! The window: offsets from the share-partition start offset (every record below it is done:
//! acknowledged or archived) to its end (the first offset never read into the window), one
//! slot per offset, dense. Offsets in the window that hold no record (compacted away,
//! transaction markers, aborted records under `read_committed`) are archived as soon as a read
//! shows it, so they never hold the start back.
//!
//! Record states, as Kafka names them:
//! - **available**: may be acquired (once its not-before time has passed: a redelivery backoff
//!   or a record's own delivery delay);
//! - **acquired**: handed to one member under a lock until its deadline;
//! - **acknowledged**: accepted, done;
//! - **archived**: rejected, out of deliveries, or no record: done.
//!
//! Beyond Kafka, each off unless set in [`ShareSettings`]:
//! - **key order**: a keyed record is not acquired while an earlier record with the same key is
//!   acquired or available (waiting to be delivered, again or for the first time);
//! - **redelivery backoff**: a released or expired record becomes acquirable after
//!   `backoff × 2^(deliveries−1)`, capped;
//! - **dead letters**: a rejected record, or one out of deliveries, is queued for the host to
//!   write to the dead-letter topic.
//!
//! Invariants (checked after every input in debug builds, [`SharePartition::assert_invariants`]):
//! the first slot, if any, is not done (the start offset only stops at a record still to
//! deliver); an acquired slot has a lock deadline and at least one delivery; no slot has more
//! deliveries than the limit; the window holds at most `max_in_flight` slots.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// An acknowledgement as Kafka's ShareFetch and ShareAcknowledge spell it (`AcknowledgeTypes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    /// An offset the client saw no record at (a gap in a compacted or transactional log).
    Gap,
    Accept,
    Release,
    Reject,
    /// Keep the lock for another lock duration (KIP-1222).
    Renew,
}

impl AckType {
    pub fn from_wire(code: i8) -> Option<AckType> {
        Some(match code {
            0 => AckType::Gap,
            1 => AckType::Accept,
            2 => AckType::Release,
            3 => AckType::Reject,
            4 => AckType::Renew,
            _ => return None,
        })
    }
}

/// A record's state in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

impl RecordState {
    fn is_done(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// A share group's settings as they apply to one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSettings {
    /// How long an acquired record stays with its member without an acknowledgement.
    pub lock_duration: Duration,
    /// Deliveries after which a released or expired record is archived (Kafka's default 5).
    pub delivery_limit: u16,
    /// The most offsets the window spans (Kafka bounds acquired records by
    /// `group.share.partition.max.record.locks`; this bounds the window, which also holds what
    /// waits behind one slow record).
    pub max_in_flight: usize,
    /// Strata's key-ordered delivery.
    pub key_ordering: bool,
    /// Strata's redelivery backoff: zero for none.
    pub redelivery_backoff: Duration,
    pub redelivery_backoff_max: Duration,
    /// Queue rejected and exhausted records as dead letters.
    pub dead_letters: bool,
}

impl Default for ShareSettings {
    fn default() -> ShareSettings {
        ShareSettings {
            lock_duration: Duration::from_secs(30),
            delivery_limit: 5,
            max_in_flight: 10_000,
            key_ordering: false,
            redelivery_backoff: Duration::ZERO,
            redelivery_backoff_max: Duration::from_secs(60),
            dead_letters: false,
        }
    }
}

/// What the host read from the log: the records at offsets `first..=last`, alike in what
/// acquisition looks at. One record when it looks at each (key order, delayed delivery), else
/// a whole batch, so that the host lists batches, not records. Runs come in offset order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRun {
    pub first: u64,
    pub last: u64,
    /// The key's hash, for key order (`None`: no key, or key order off).
    pub key: Option<u64>,
    /// Not to be acquired before this (a record's own delivery delay).
    pub not_before: Option<Instant>,
    /// Not records to deliver: a transaction marker, or aborted under `read_committed`.
    pub skip: bool,
}

impl LogRun {
    /// A run of one record.
    pub fn record(offset: u64) -> LogRun {
        LogRun {
            first: offset,
            last: offset,
            key: None,
            not_before: None,
            skip: false,
        }
    }

    /// Each offset of the run, with what the run says of it.
    fn offsets(&self) -> impl Iterator<Item = (u64, LogRun)> + '_ {
        (self.first..=self.last).map(|offset| (offset, *self))
    }
}

/// How the record limit of an acquisition applies (Kafka's `ShareAcquireMode`, KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcquireMode {
    /// The limit ends an acquisition at the end of a run (a batch, where runs are batches),
    /// so that no batch is sent twice for its two halves, unless that would take more than
    /// twice the limit.
    #[default]
    BatchOptimized,
    /// At most the limit, a batch split if need be.
    RecordLimit,
}

/// A run of offsets acquired with the same delivery count (Kafka's `AcquiredRecords`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub first: u64,
    pub last: u64,
    pub deliveries: u16,
}

/// Why a record became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    Rejected,
    DeliveryLimit,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::DeliveryLimit => "delivery-limit",
        }
    }
}

/// A record archived as a dead letter, for the host to write to the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetter {
    pub offset: u64,
    pub deliveries: u16,
    pub reason: DeadLetterReason,
}

/// Why an acknowledgement was refused (nothing of the request is applied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// Kafka's INVALID_RECORD_STATE: an offset not acquired by this member (never, or its lock
    /// expired and someone else has it, or already acknowledged).
    #[error("offset {0} is not acquired by this member")]
    NotAcquired(u64),
    /// Kafka's INVALID_REQUEST: a malformed acknowledgement batch.
    #[error("{0}")]
    Malformed(&'static str),
}

/// One acknowledgement batch: `types` holds one type for the whole range, or one per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckBatch {
    pub first: u64,
    pub last: u64,
    pub types: Vec<AckType>,
}

/// Counts since the share-partition was loaded, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareCounters {
    pub acquired: u64,
    pub redeliveries: u64,
    pub lock_expiries: u64,
    pub accepted: u64,
    pub released: u64,
    pub rejected: u64,
    pub dead_letters: u64,
}

/// What the window holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareSummary {
    pub start_offset: u64,
    pub end_offset: u64,
    /// Records in the window not done yet (available or acquired).
    pub in_flight: u64,
    pub acquired: u64,
}

/// What is stored to survive a leader change or a crash: the start offset and every window
/// slot that is not plainly available at zero deliveries. Acquired records are stored as
/// available with their delivery counted: their locks die with the leader.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareSnapshot {
    pub start_offset: u64,
    pub ranges: Vec<StateRange>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRange {
    pub first: u64,
    pub last: u64,
    pub state: RecordState,
    pub deliveries: u16,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: RecordState,
    deliveries: u16,
    /// The acquiring member's key (its id hashed), while acquired.
    member: u64,
    /// Acquired: the lock's deadline. Available: not before (backoff or delay).
    deadline: Option<Instant>,
    key: Option<u64>,
}

impl Slot {
    fn available(key: Option<u64>, not_before: Option<Instant>) -> Slot {
        Slot {
            state: RecordState::Available,
            deliveries: 0,
            member: 0,
            deadline: not_before,
            key,
        }
    }

    fn done(state: RecordState, deliveries: u16) -> Slot {
        Slot {
            state,
            deliveries,
            member: 0,
            deadline: None,
            key: None,
        }
    }

    fn ready(&self, now: Instant) -> bool {
        self.state == RecordState::Available && self.deadline.is_none_or(|at| at <= now)
    }
}

/// A member id as the window keeps it.
pub fn member_key(member: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    member.hash(&mut hasher);
    hasher.finish()
}

/// A record key as key order compares it.
pub fn record_key(key: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

#[derive(Debug)]
pub struct SharePartition {
    start: u64,
    slots: VecDeque<Slot>,
    settings: ShareSettings,
    dead_letters: Vec<DeadLetter>,
    counters: ShareCounters,
    /// Changed since the last [`SharePartition::mark_persisted`].
    dirty: bool,
}

impl SharePartition {
    /// A share-partition never stored: its start where the group's `share.auto.offset.reset`
    /// says (the host resolved it to an offset).
    pub fn new(start_offset: u64, settings: ShareSettings) -> SharePartition {
        SharePartition {
            start: start_offset,
            slots: VecDeque::new(),
            settings,
            dead_letters: Vec::new(),
            counters: ShareCounters::default(),
            dirty: true,
        }
    }

    /// The share-partition as stored. Offsets between stored ranges are available (the next
    /// read of them archives those that hold no record).
    pub fn restore(snapshot: &ShareSnapshot, settings: ShareSettings) -> SharePartition {
        let mut partition = SharePartition {
            start: snapshot.start_offset,
            slots: VecDeque::new(),
            settings,
            dead_letters: Vec::new(),
            counters: ShareCounters::default(),
            dirty: false,
        };
        for range in &snapshot.ranges {
            if range.last < range.first || range.last < partition.start {
                continue;
            }
            let first = range.first.max(partition.start);
            while partition.end_offset() < first {
                partition.slots.push_back(Slot::available(None, None));
            }
            for offset in first..=range.last {
                let state = match range.state {
                    RecordState::Acquired => RecordState::Available,
                    state => state,
                };
                let slot = Slot::done(state, range.deliveries.min(partition.limit()));
                match partition.slot_mut(offset) {
                    Some(existing) => *existing = slot,
                    None => partition.slots.push_back(slot),
                }
            }
        }
        partition.advance_start();
        partition.assert_invariants();
        partition
    }

    pub fn settings(&self) -> &ShareSettings {
        &self.settings
    }

    /// New settings (the group's configs changed): they apply to what happens next.
    pub fn set_settings(&mut self, settings: ShareSettings) {
        self.settings = settings;
    }

    pub fn start_offset(&self) -> u64 {
        self.start
    }

    /// The first offset never read into the window.
    pub fn end_offset(&self) -> u64 {
        self.start + self.slots.len() as u64
    }

    pub fn counters(&self) -> ShareCounters {
        self.counters
    }

    pub fn summary(&self) -> ShareSummary {
        let in_flight = self.slots.iter().filter(|s| !s.state.is_done()).count() as u64;
        let acquired = self
            .slots
            .iter()
            .filter(|s| s.state == RecordState::Acquired)
            .count() as u64;
        ShareSummary {
            start_offset: self.start,
            end_offset: self.end_offset(),
            in_flight,
            acquired,
        }
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn mark_persisted(&mut self) {
        self.dirty = false;
    }

    /// Where the host should read the log from to acquire records: the first slot that could
    /// be acquired now, else the window's end (when it has room); `None` when nothing can be.
    pub fn read_from(&mut self, now: Instant) -> Option<u64> {
        self.handle_timeout(now);
        let mut pending = self.settings.key_ordering.then(HashSet::new);
        for (index, slot) in self.slots.iter().enumerate() {
            if slot.ready(now) && !blocked(&pending, slot.key) {
                return Some(self.start + index as u64);
            }
            hold_key(&mut pending, slot);
        }
        (self.slots.len() < self.settings.max_in_flight).then(|| self.end_offset())
    }

    /// Acquires for `member` about `max_records` records among `read` (what the log holds from
    /// the offset [`SharePartition::read_from`] gave, in offset order): available slots first
    /// met in offset order, new records past the window's end taken into it. Offsets of the
    /// read that hold no record are archived. As Kafka's, the limit ends an acquisition at a
    /// run's end (a batch's, where runs are batches), so that no batch is sent twice for its
    /// two halves; unlike Kafka's, never past twice the limit ([`AcquireMode::BatchOptimized`]).
    pub fn acquire(
        &mut self,
        member: &str,
        now: Instant,
        read: &[LogRun],
        max_records: usize,
    ) -> Vec<Acquired> {
        self.acquire_with(member, now, read, max_records, AcquireMode::BatchOptimized)
    }

    /// [`SharePartition::acquire`], the limit applied as `mode` says.
    pub fn acquire_with(
        &mut self,
        member: &str,
        now: Instant,
        read: &[LogRun],
        max_records: usize,
        mode: AcquireMode,
    ) -> Vec<Acquired> {
        self.handle_timeout(now);
        let member = member_key(member);
        let mut taken: Vec<Acquired> = Vec::new();
        let Some(first_read) = read.first().map(|run| run.first) else {
            return taken;
        };
        // Keys held by slots before the read, for key order.
        let mut pending = self.settings.key_ordering.then(HashSet::new);
        let before_read = first_read
            .saturating_sub(self.start)
            .min(self.slots.len() as u64);
        for slot in self.slots.iter().take(before_read as usize) {
            hold_key(&mut pending, slot);
        }
        let mut next = first_read.max(self.start);
        let mut count = 0usize;
        let window_start = self.start;
        let offsets = read
            .iter()
            .flat_map(LogRun::offsets)
            .filter(|(offset, _)| *offset >= window_start);
        for (offset, record) in offsets {
            // A batch is finished past the limit, up to twice the limit: one large batch
            // (a producer's whole linger) is still shared among members.
            let run_start = offset == record.first.max(window_start);
            if count >= max_records
                && (run_start
                    || mode == AcquireMode::RecordLimit
                    || count >= max_records.saturating_mul(2))
            {
                break;
            }
            // Offsets between records hold none: archive them.
            while next < offset {
                if next >= self.end_offset() {
                    if !self.has_room() {
                        break;
                    }
                    self.slots.push_back(Slot::done(RecordState::Archived, 0));
                } else if let Some(slot) = self.slot_mut(next)
                    && slot.state == RecordState::Available
                {
                    *slot = Slot::done(RecordState::Archived, slot.deliveries);
                }
                next += 1;
            }
            if next < offset {
                break; // the window is full
            }
            next = offset + 1;
            if offset >= self.end_offset() {
                if !self.has_room() {
                    break;
                }
                let key = if self.settings.key_ordering {
                    record.key
                } else {
                    None
                };
                self.slots.push_back(if record.skip {
                    Slot::done(RecordState::Archived, 0)
                } else {
                    Slot::available(key, record.not_before)
                });
                self.dirty |= record.skip;
            }
            let start = self.start;
            let key_ordering = self.settings.key_ordering;
            let lock = self.settings.lock_duration;
            let slot = &mut self.slots[(offset - start) as usize];
            if record.skip && slot.state == RecordState::Available {
                *slot = Slot::done(RecordState::Archived, slot.deliveries);
                self.dirty = true;
                continue;
            }
            if key_ordering && slot.key.is_none() {
                slot.key = record.key;
            }
            if slot.ready(now) && !blocked(&pending, slot.key) {
                slot.state = RecordState::Acquired;
                slot.deliveries += 1;
                slot.member = member;
                slot.deadline = Some(now + lock);
                count += 1;
                self.counters.acquired += 1;
                if slot.deliveries > 1 {
                    self.counters.redeliveries += 1;
                }
                let deliveries = slot.deliveries;
                match taken.last_mut() {
                    Some(run) if run.last + 1 == offset && run.deliveries == deliveries => {
                        run.last = offset;
                    }
                    _ => taken.push(Acquired {
                        first: offset,
                        last: offset,
                        deliveries,
                    }),
                }
            }
            let slot = self.slots[(offset - start) as usize];
            hold_key(&mut pending, &slot);
        }
        self.dirty |= !taken.is_empty();
        self.advance_start();
        self.assert_invariants();
        taken
    }

    /// Applies `member`'s acknowledgements, all or none: every offset named must be acquired by
    /// it (a gap may also name an offset already archived).
    pub fn acknowledge(
        &mut self,
        member: &str,
        now: Instant,
        batches: &[AckBatch],
    ) -> Result<(), AckError> {
        self.handle_timeout(now);
        let member = member_key(member);
        for batch in batches {
            if batch.last < batch.first {
                return Err(AckError::Malformed(
                    "an acknowledgement batch ends before it starts",
                ));
            }
            let span = batch.last - batch.first + 1;
            if batch.types.len() != 1 && batch.types.len() as u64 != span {
                return Err(AckError::Malformed(
                    "acknowledge types name neither the whole batch nor each offset",
                ));
            }
            for offset in batch.first..=batch.last {
                let kind = ack_type(batch, offset);
                let acquired = self.slot(offset).is_some_and(|slot| {
                    slot.state == RecordState::Acquired && slot.member == member
                });
                let gap_done = kind == AckType::Gap
                    && (offset < self.start
                        || self
                            .slot(offset)
                            .is_some_and(|slot| slot.state == RecordState::Archived));
                if !acquired && !gap_done {
                    return Err(AckError::NotAcquired(offset));
                }
            }
        }
        for batch in batches {
            for offset in batch.first..=batch.last {
                let kind = ack_type(batch, offset);
                let Some(slot) = self.slot(offset).copied() else {
                    continue;
                };
                if slot.state != RecordState::Acquired {
                    continue;
                }
                match kind {
                    AckType::Accept => {
                        self.counters.accepted += 1;
                        self.set(
                            offset,
                            Slot::done(RecordState::Acknowledged, slot.deliveries),
                        );
                    }
                    AckType::Gap => {
                        self.set(offset, Slot::done(RecordState::Archived, slot.deliveries));
                    }
                    AckType::Reject => {
                        self.counters.rejected += 1;
                        self.archive_dead(offset, slot.deliveries, DeadLetterReason::Rejected);
                    }
                    AckType::Release => {
                        self.counters.released += 1;
                        self.release(offset, now);
                    }
                    AckType::Renew => {
                        let deadline = now + self.settings.lock_duration;
                        if let Some(slot) = self.slot_mut(offset) {
                            slot.deadline = Some(deadline);
                        }
                    }
                }
            }
        }
        // A renewed lock is not stored, as in Kafka: locks do not outlive their leader.
        self.dirty |= batches
            .iter()
            .any(|batch| batch.types.iter().any(|kind| *kind != AckType::Renew));
        self.advance_start();
        self.assert_invariants();
        Ok(())
    }

    /// Releases what `member` holds: it left the group or closed its share session.
    pub fn release_member(&mut self, member: &str, now: Instant) {
        let member = member_key(member);
        for index in 0..self.slots.len() {
            let slot = self.slots[index];
            if slot.state == RecordState::Acquired && slot.member == member {
                self.release(self.start + index as u64, now);
                self.dirty = true;
            }
        }
        self.advance_start();
        self.assert_invariants();
    }

    /// Expires the locks due by `now`: their records are released (and count the delivery).
    pub fn handle_timeout(&mut self, now: Instant) {
        for index in 0..self.slots.len() {
            let slot = self.slots[index];
            if slot.state == RecordState::Acquired && slot.deadline.is_some_and(|at| at <= now) {
                self.counters.lock_expiries += 1;
                self.release(self.start + index as u64, now);
                self.dirty = true;
            }
        }
        self.advance_start();
    }

    /// When something next changes by itself: a lock expires, or a record waiting out its
    /// backoff or delay becomes available.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.slots
            .iter()
            .filter(|slot| matches!(slot.state, RecordState::Acquired | RecordState::Available))
            .filter_map(|slot| slot.deadline)
            .min()
    }

    /// The log no longer holds records below `offset` (retention, DeleteRecords), or an
    /// operator moved the group there: the window starts there.
    pub fn move_start_to(&mut self, offset: u64) {
        if offset <= self.start {
            return;
        }
        let drop = (offset - self.start).min(self.slots.len() as u64) as usize;
        self.slots.drain(..drop);
        self.start = offset;
        self.dirty = true;
        self.advance_start();
        self.assert_invariants();
    }

    pub fn has_dead_letters(&self) -> bool {
        !self.dead_letters.is_empty()
    }

    /// The dead letters queued since the last call, in the order they were archived.
    pub fn take_dead_letters(&mut self) -> Vec<DeadLetter> {
        std::mem::take(&mut self.dead_letters)
    }

    /// What to store (see [`ShareSnapshot`]).
    pub fn snapshot(&self) -> ShareSnapshot {
        let mut ranges: Vec<StateRange> = Vec::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let offset = self.start + index as u64;
            let state = match slot.state {
                RecordState::Acquired => RecordState::Available,
                state => state,
            };
            if state == RecordState::Available && slot.deliveries == 0 {
                continue;
            }
            match ranges.last_mut() {
                Some(range)
                    if range.last + 1 == offset
                        && range.state == state
                        && range.deliveries == slot.deliveries =>
                {
                    range.last = offset;
                }
                _ => ranges.push(StateRange {
                    first: offset,
                    last: offset,
                    state,
                    deliveries: slot.deliveries,
                }),
            }
        }
        ShareSnapshot {
            start_offset: self.start,
            ranges,
        }
    }

    /// The state and delivery count at `offset` (`None` outside the window).
    pub fn state_of(&self, offset: u64) -> Option<(RecordState, u16)> {
        self.slot(offset).map(|slot| (slot.state, slot.deliveries))
    }

    fn limit(&self) -> u16 {
        self.settings.delivery_limit.max(1)
    }

    fn has_room(&self) -> bool {
        self.slots.len() < self.settings.max_in_flight
    }

    fn slot(&self, offset: u64) -> Option<&Slot> {
        let index = offset.checked_sub(self.start)?;
        self.slots.get(usize::try_from(index).ok()?)
    }

    fn slot_mut(&mut self, offset: u64) -> Option<&mut Slot> {
        let index = offset.checked_sub(self.start)?;
        self.slots.get_mut(usize::try_from(index).ok()?)
    }

    fn set(&mut self, offset: u64, slot: Slot) {
        if let Some(existing) = self.slot_mut(offset) {
            *existing = slot;
        }
    }

    /// An acquired record given back: available again (after its backoff), or archived once
    /// it used up its deliveries.
    fn release(&mut self, offset: u64, now: Instant) {
        let Some(slot) = self.slot(offset).copied() else {
            return;
        };
        if slot.deliveries >= self.limit() {
            self.archive_dead(offset, slot.deliveries, DeadLetterReason::DeliveryLimit);
            return;
        }
        let not_before = self.backoff(slot.deliveries).map(|wait| now + wait);
        self.set(
            offset,
            Slot {
                state: RecordState::Available,
                member: 0,
                deadline: not_before,
                ..slot
            },
        );
    }

    fn archive_dead(&mut self, offset: u64, deliveries: u16, reason: DeadLetterReason) {
        self.set(offset, Slot::done(RecordState::Archived, deliveries));
        if self.settings.dead_letters {
            self.counters.dead_letters += 1;
            self.dead_letters.push(DeadLetter {
                offset,
                deliveries,
                reason,
            });
        }
    }

    /// The wait before a record delivered `deliveries` times is offered again.
    fn backoff(&self, deliveries: u16) -> Option<Duration> {
        let base = self.settings.redelivery_backoff;
        if base.is_zero() {
            return None;
        }
        let doublings = u32::from(deliveries.saturating_sub(1)).min(20);
        Some(
            base.saturating_mul(1 << doublings)
                .min(self.settings.redelivery_backoff_max.max(base)),
        )
    }

    /// Moves the start past every done record at the front.
    fn advance_start(&mut self) {
        while self.slots.front().is_some_and(|slot| slot.state.is_done()) {
            self.slots.pop_front();
            self.start += 1;
        }
    }

    pub fn assert_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.slots.front().is_none_or(|slot| !slot.state.is_done()),
            "the start offset stops only at a record still to deliver"
        );
        assert!(self.slots.len() <= self.settings.max_in_flight.max(1));
        for slot in &self.slots {
            if slot.state == RecordState::Acquired {
                assert!(slot.deadline.is_some() && slot.deliveries >= 1);
            }
            assert!(slot.deliveries <= self.limit(), "deliveries past the limit");
        }
    }
}

fn ack_type(batch: &AckBatch, offset: u64) -> AckType {
    if batch.types.len() == 1 {
        batch.types[0]
    } else {
        batch.types[(offset - batch.first) as usize]
    }
}

/// Key order: is `key` held by an earlier record still to deliver?
fn blocked(pending: &Option<HashSet<u64>>, key: Option<u64>) -> bool {
    match (pending, key) {
        (Some(pending), Some(key)) => pending.contains(&key),
        _ => false,
    }
}

/// Key order: a record still to deliver holds its key against later ones.
fn hold_key(pending: &mut Option<HashSet<u64>>, slot: &Slot) {
    if let (Some(pending), Some(key)) = (pending, slot.key)
        && !slot.state.is_done()
    {
        pending.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(offsets: std::ops::Range<u64>) -> Vec<LogRun> {
        offsets.map(LogRun::record).collect()
    }

    fn keyed(pairs: &[(u64, u64)]) -> Vec<LogRun> {
        pairs
            .iter()
            .map(|&(offset, key)| LogRun {
                key: Some(key),
                ..LogRun::record(offset)
            })
            .collect()
    }

    fn settings() -> ShareSettings {
        ShareSettings {
            lock_duration: Duration::from_secs(30),
            ..ShareSettings::default()
        }
    }

    fn ack(first: u64, last: u64, kind: AckType) -> AckBatch {
        AckBatch {
            first,
            last,
            types: vec![kind],
        }
    }

    fn offsets(taken: &[Acquired]) -> Vec<u64> {
        taken.iter().flat_map(|run| run.first..=run.last).collect()
    }

    /// Runs of whole batches: `(first, last)` each.
    fn batches(ranges: &[(u64, u64)]) -> Vec<LogRun> {
        ranges
            .iter()
            .map(|&(first, last)| LogRun {
                last,
                ..LogRun::record(first)
            })
            .collect()
    }

    #[test]
    fn the_limit_ends_an_acquisition_at_a_batch_end() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        let read = batches(&[(0, 9), (10, 19), (20, 29)]);
        // 15 records asked: the second batch is taken whole, the third left.
        let first = partition.acquire("a", now, &read, 15);
        assert_eq!(offsets(&first), (0..20).collect::<Vec<_>>());
        // A read from inside a batch (its start acquired before) takes from the window's end.
        partition
            .acknowledge("a", now, &[ack(0, 4, AckType::Release)])
            .unwrap();
        assert_eq!(partition.read_from(now), Some(0));
        let again = partition.acquire("b", now, &read, 3);
        assert_eq!(
            offsets(&again),
            (0..5).collect::<Vec<_>>(),
            "the released part, whole"
        );
        let rest = partition.acquire("b", now, &read[2..], 5);
        assert_eq!(offsets(&rest), (20..30).collect::<Vec<_>>());
        assert_eq!(partition.summary().acquired, 30);
        // Under a record limit, a batch is split.
        let mut exact = SharePartition::new(0, settings());
        let taken = exact.acquire_with("a", now, &read, 15, AcquireMode::RecordLimit);
        assert_eq!(offsets(&taken), (0..15).collect::<Vec<_>>());
        // A batch far larger than the limit is cut at twice the limit, for others to share.
        let mut shared = SharePartition::new(0, settings());
        let one_batch = batches(&[(0, 999)]);
        assert_eq!(
            offsets(&shared.acquire("a", now, &one_batch, 100)),
            (0..200).collect::<Vec<_>>()
        );
        assert_eq!(
            offsets(&shared.acquire("b", now, &one_batch, 100)),
            (200..400).collect::<Vec<_>>()
        );
    }

    #[test]
    fn records_are_acquired_a_batch_at_a_time_and_each_by_one_member() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        assert_eq!(partition.read_from(now), Some(0));
        let read = records(0..10);
        let first = partition.acquire("a", now, &read, 4);
        assert_eq!(
            first,
            vec![Acquired {
                first: 0,
                last: 3,
                deliveries: 1
            }]
        );
        // The next member reads from the first record it could take.
        assert_eq!(partition.read_from(now), Some(4));
        let second = partition.acquire("b", now, &read[4..], 100);
        assert_eq!(offsets(&second), (4..10).collect::<Vec<_>>());
        assert_eq!(partition.read_from(now), Some(10));
        // A read overlapping what is acquired takes none of it again.
        assert!(partition.acquire("c", now, &read, 100).is_empty());
        assert_eq!(partition.summary().acquired, 10);
    }

    #[test]
    fn accepted_records_move_the_start_and_are_never_delivered_again() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..5), 100);
        partition
            .acknowledge("a", now, &[ack(0, 2, AckType::Accept)])
            .unwrap();
        assert_eq!(partition.start_offset(), 3);
        // Past every lock: 3 and 4 come back, 0..=2 never.
        let later = now + Duration::from_secs(31);
        assert_eq!(partition.read_from(later), Some(3));
        let again = partition.acquire("b", later, &records(0..5), 100);
        assert_eq!(
            again,
            vec![Acquired {
                first: 3,
                last: 4,
                deliveries: 2
            }]
        );
    }

    #[test]
    fn only_the_holder_acknowledges_and_a_refused_request_changes_nothing() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..4), 2);
        partition.acquire("b", now, &records(2..4), 2);
        let mixed = [ack(0, 1, AckType::Accept), ack(2, 2, AckType::Accept)];
        assert_eq!(
            partition.acknowledge("a", now, &mixed),
            Err(AckError::NotAcquired(2))
        );
        assert_eq!(partition.state_of(0), Some((RecordState::Acquired, 1)));
        assert_eq!(
            partition.acknowledge("a", now, &[ack(7, 7, AckType::Accept)]),
            Err(AckError::NotAcquired(7))
        );
        let malformed = AckBatch {
            first: 0,
            last: 1,
            types: vec![AckType::Accept; 3],
        };
        assert!(matches!(
            partition.acknowledge("a", now, &[malformed]),
            Err(AckError::Malformed(_))
        ));
        // One type per offset.
        let each = AckBatch {
            first: 0,
            last: 1,
            types: vec![AckType::Accept, AckType::Release],
        };
        partition.acknowledge("a", now, &[each]).unwrap();
        assert_eq!(partition.state_of(1), Some((RecordState::Available, 1)));
        assert_eq!(partition.start_offset(), 1);
    }

    #[test]
    fn release_redelivers_reject_never_does() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..2), 100);
        partition
            .acknowledge(
                "a",
                now,
                &[ack(0, 0, AckType::Release), ack(1, 1, AckType::Reject)],
            )
            .unwrap();
        assert_eq!(partition.read_from(now), Some(0));
        let again = partition.acquire("b", now, &records(0..2), 100);
        assert_eq!(
            again,
            vec![Acquired {
                first: 0,
                last: 0,
                deliveries: 2
            }]
        );
        assert_eq!(partition.state_of(1), Some((RecordState::Archived, 1)));
    }

    #[test]
    fn an_expired_lock_gives_the_record_to_the_next_member() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..3), 100);
        assert_eq!(
            partition.poll_timeout(),
            Some(now + Duration::from_secs(30))
        );
        let before = now + Duration::from_secs(29);
        assert!(
            partition
                .acquire("b", before, &records(0..3), 100)
                .is_empty()
        );
        let after = now + Duration::from_secs(30);
        assert_eq!(
            offsets(&partition.acquire("b", after, &records(0..3), 100)),
            [0, 1, 2]
        );
        assert_eq!(partition.counters().lock_expiries, 3);
        // The first holder's late acknowledgement is refused: the records are b's now.
        assert_eq!(
            partition.acknowledge("a", after, &[ack(0, 0, AckType::Accept)]),
            Err(AckError::NotAcquired(0))
        );
    }

    #[test]
    fn renew_extends_the_lock() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..1), 100);
        partition.mark_persisted();
        let later = now + Duration::from_secs(20);
        partition
            .acknowledge("a", later, &[ack(0, 0, AckType::Renew)])
            .unwrap();
        assert!(!partition.is_dirty(), "a renewal is not stored");
        assert_eq!(
            partition.poll_timeout(),
            Some(later + Duration::from_secs(30))
        );
        let past_first_lock = now + Duration::from_secs(40);
        assert!(
            partition
                .acquire("b", past_first_lock, &records(0..1), 100)
                .is_empty()
        );
        partition
            .acknowledge("a", past_first_lock, &[ack(0, 0, AckType::Accept)])
            .unwrap();
        assert_eq!(partition.start_offset(), 1);
    }

    #[test]
    fn the_delivery_limit_archives_a_record_and_names_it_a_dead_letter() {
        let now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                delivery_limit: 3,
                dead_letters: true,
                ..settings()
            },
        );
        for delivery in 1..=3 {
            let taken = partition.acquire("a", now, &records(0..2), 1);
            assert_eq!(
                taken,
                vec![Acquired {
                    first: 0,
                    last: 0,
                    deliveries: delivery
                }]
            );
            partition
                .acknowledge("a", now, &[ack(0, 0, AckType::Release)])
                .unwrap();
        }
        assert_eq!(
            partition.state_of(0),
            None,
            "archived, and the start moved past"
        );
        assert_eq!(partition.start_offset(), 1);
        assert_eq!(
            partition.take_dead_letters(),
            vec![DeadLetter {
                offset: 0,
                deliveries: 3,
                reason: DeadLetterReason::DeliveryLimit
            }]
        );
        partition.acquire("a", now, &records(1..2), 1);
        partition
            .acknowledge("a", now, &[ack(1, 1, AckType::Reject)])
            .unwrap();
        assert_eq!(
            partition.take_dead_letters()[0].reason,
            DeadLetterReason::Rejected
        );
        assert!(partition.take_dead_letters().is_empty());
    }

    #[test]
    fn expiry_counts_toward_the_delivery_limit() {
        let mut now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                delivery_limit: 2,
                ..settings()
            },
        );
        partition.acquire("a", now, &records(0..1), 1);
        now += Duration::from_secs(30);
        partition.acquire("a", now, &records(0..1), 1);
        now += Duration::from_secs(30);
        partition.handle_timeout(now);
        assert_eq!(partition.start_offset(), 1, "archived after two deliveries");
    }

    #[test]
    fn key_order_holds_a_key_until_its_earlier_record_is_done() {
        let now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                key_ordering: true,
                ..settings()
            },
        );
        // Keys: 0→A 1→B 2→A 3→C 4→B
        let read = keyed(&[(0, 1), (1, 2), (2, 1), (3, 3), (4, 2)]);
        let first = partition.acquire("m1", now, &read, 100);
        assert_eq!(offsets(&first), [0, 1, 3], "one record per key at a time");
        let second = partition.acquire("m2", now, &read, 100);
        assert!(second.is_empty(), "2 and 4 wait for 0 and 1");
        partition
            .acknowledge("m1", now, &[ack(0, 0, AckType::Accept)])
            .unwrap();
        assert_eq!(partition.read_from(now), Some(2));
        let third = partition.acquire("m2", now, &read[2..], 100);
        assert_eq!(offsets(&third), [2]);
        // A released record keeps its key's place: what follows it waits for its redelivery.
        partition
            .acknowledge("m1", now, &[ack(1, 1, AckType::Release)])
            .unwrap();
        let fourth = partition.acquire("m3", now, &read[1..], 100);
        assert_eq!(offsets(&fourth), [1], "1 again, not 4");
    }

    #[test]
    fn key_order_does_not_hold_unkeyed_records() {
        let now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                key_ordering: true,
                ..settings()
            },
        );
        let taken = partition.acquire("a", now, &records(0..5), 100);
        assert_eq!(offsets(&taken), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn redelivery_backs_off_exponentially_up_to_its_cap() {
        let mut now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                delivery_limit: 10,
                redelivery_backoff: Duration::from_millis(100),
                redelivery_backoff_max: Duration::from_millis(300),
                ..settings()
            },
        );
        for (delivery, wait_ms) in [(1u16, 100u64), (2, 200), (3, 300), (4, 300)] {
            let taken = partition.acquire("a", now, &records(0..1), 1);
            assert_eq!(taken[0].deliveries, delivery);
            partition
                .acknowledge("a", now, &[ack(0, 0, AckType::Release)])
                .unwrap();
            assert_eq!(
                partition.poll_timeout(),
                Some(now + Duration::from_millis(wait_ms))
            );
            assert_eq!(partition.read_from(now), Some(1), "0 waits out its backoff");
            assert!(partition.acquire("a", now, &records(0..1), 1).is_empty());
            now += Duration::from_millis(wait_ms);
            assert_eq!(partition.read_from(now), Some(0));
        }
    }

    #[test]
    fn a_delayed_record_is_not_acquired_before_its_time_and_does_not_hold_others() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        let mut read = records(0..3);
        read[1].not_before = Some(now + Duration::from_secs(5));
        assert_eq!(offsets(&partition.acquire("a", now, &read, 100)), [0, 2]);
        assert_eq!(partition.start_offset(), 0);
        assert_eq!(partition.poll_timeout(), Some(now + Duration::from_secs(5)));
        let later = now + Duration::from_secs(5);
        assert_eq!(partition.read_from(later), Some(1));
        assert_eq!(
            offsets(&partition.acquire("b", later, &read[1..], 100)),
            [1]
        );
    }

    #[test]
    fn markers_aborted_records_and_gaps_are_archived_not_delivered() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        // 0 and 1 aborted, 2 their marker, 3 a record, 4 compacted away, 5 a record.
        let mut read = records(0..4);
        for record in &mut read[..3] {
            record.skip = true;
        }
        read.extend(records(5..6));
        let taken = partition.acquire("a", now, &read, 100);
        assert_eq!(offsets(&taken), [3, 5]);
        assert_eq!(partition.start_offset(), 3);
        assert_eq!(partition.state_of(4), Some((RecordState::Archived, 0)));
        // The client acknowledges the gap it saw with the rest.
        partition
            .acknowledge(
                "a",
                now,
                &[AckBatch {
                    first: 3,
                    last: 5,
                    types: vec![AckType::Accept, AckType::Gap, AckType::Accept],
                }],
            )
            .unwrap();
        assert_eq!(partition.start_offset(), 6);
    }

    #[test]
    fn the_window_is_bounded() {
        let now = Instant::now();
        let mut partition = SharePartition::new(
            0,
            ShareSettings {
                max_in_flight: 4,
                ..settings()
            },
        );
        assert_eq!(
            offsets(&partition.acquire("a", now, &records(0..10), 100)),
            [0, 1, 2, 3]
        );
        assert_eq!(partition.read_from(now), None);
        partition
            .acknowledge("a", now, &[ack(0, 0, AckType::Accept)])
            .unwrap();
        assert_eq!(partition.read_from(now), Some(4));
    }

    #[test]
    fn a_member_leaving_releases_what_it_holds() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..2), 1);
        partition.acquire("b", now, &records(1..2), 1);
        partition.release_member("a", now);
        assert_eq!(partition.state_of(0), Some((RecordState::Available, 1)));
        assert_eq!(partition.state_of(1), Some((RecordState::Acquired, 1)));
    }

    #[test]
    fn a_snapshot_restores_every_acknowledgement_and_delivery_count() {
        let now = Instant::now();
        let mut partition = SharePartition::new(
            10,
            ShareSettings {
                dead_letters: true,
                ..settings()
            },
        );
        partition.acquire("a", now, &records(10..20), 100);
        partition
            .acknowledge(
                "a",
                now,
                &[
                    ack(10, 11, AckType::Accept),
                    ack(12, 12, AckType::Release),
                    ack(13, 13, AckType::Accept),
                    ack(14, 14, AckType::Reject),
                ],
            )
            .unwrap();
        let snapshot = partition.snapshot();
        let stored = serde_json::to_string(&snapshot).unwrap();
        let restored = SharePartition::restore(&serde_json::from_str(&stored).unwrap(), settings());
        assert_eq!(restored.start_offset(), 12);
        assert_eq!(restored.state_of(12), Some((RecordState::Available, 1)));
        assert_eq!(restored.state_of(13), Some((RecordState::Acknowledged, 1)));
        assert_eq!(restored.state_of(14), Some((RecordState::Archived, 1)));
        // Acquired when stored: available again, its delivery counted.
        assert_eq!(restored.state_of(15), Some((RecordState::Available, 1)));
        assert_eq!(restored.snapshot(), snapshot);
        // Nothing acknowledged is acquired again.
        let mut restored = restored;
        let taken = restored.acquire("b", now, &records(10..20), 100);
        assert_eq!(offsets(&taken), [12, 15, 16, 17, 18, 19]);
    }

    #[test]
    fn the_log_start_moving_past_the_window_moves_it() {
        let now = Instant::now();
        let mut partition = SharePartition::new(0, settings());
        partition.acquire("a", now, &records(0..5), 100);
        partition.move_start_to(3);
        assert_eq!(partition.start_offset(), 3);
        assert_eq!(partition.state_of(3), Some((RecordState::Acquired, 1)));
        partition.move_start_to(100);
        assert_eq!(partition.start_offset(), 100);
        assert_eq!(partition.end_offset(), 100);
        assert_eq!(partition.read_from(now), Some(100));
    }
}
