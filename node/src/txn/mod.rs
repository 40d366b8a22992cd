//! Transactions' coordinator: a sans-IO state machine per `transactional.id`, in the style of
//! Kafka's transaction coordinator (KIP-98), which the listener's InitProducerId,
//! AddPartitionsToTxn, AddOffsetsToTxn and EndTxn drive and a timer polls.
//!
//! Architecture invariant: this module knows nothing of sockets, files, runtimes or the
//! coordinator store. Time is an argument (`now_ms`, wall-clock milliseconds: a record moves
//! between brokers with its times); the adapter stores what the machine asks it to and reports
//! back, and writes the markers it is told to write.
//!
//! The protocol:
//! - A transactional id's state is a [`TxnRecord`]: producer id and epoch, state, the partitions
//!   and groups the open transaction touched, its timeout and start. Every change is stored
//!   (fenced: a coordinator that lost its claim cannot store) **before** it takes effect: a
//!   change is staged as *pending*, handed to the adapter as [`Step::Store`], and becomes the
//!   state only by [`TxnCoordinator::handle_stored`]. While a change is pending, requests for
//!   the id are answered CONCURRENT_TRANSACTIONS (the client retries).
//! - InitProducerId gives the id a new epoch (a new producer id the first time, or when the epoch
//!   would overflow), fencing every earlier producer of it. If a transaction is open, it is
//!   aborted first at the new epoch, and the caller hears CONCURRENT_TRANSACTIONS until the
//!   abort is complete.
//! - AddPartitionsToTxn and AddOffsetsToTxn open a transaction (Empty or Complete → Ongoing) and
//!   add to it. EndTxn decides: Ongoing → PrepareCommit or PrepareAbort; once stored, the
//!   decision is final and answered, and [`Step::WriteMarkers`] tells the adapter to write the
//!   markers to every partition (and settle the groups' offsets); when they are written
//!   ([`TxnCoordinator::handle_markers_written`]) the state becomes CompleteCommit or
//!   CompleteAbort and the transaction's partitions are forgotten.
//! - A transaction open longer than its timeout is aborted at a bumped epoch (its producer is
//!   fenced, as Kafka fences it) by [`TxnCoordinator::poll_timeouts`].
//! - A coordinator that takes over ([`TxnCoordinator::load`]) finishes what its predecessor
//!   decided: the markers of every stored PrepareCommit or PrepareAbort are written again.
//!
//! Invariants, checked after every input ([`TxnCoordinator::assert_invariants`]):
//! - a pending change never lowers the stored producer epoch (of the same producer id);
//! - Empty, CompleteCommit and CompleteAbort hold no partitions or groups; Ongoing,
//!   PrepareCommit and PrepareAbort hold at least one;
//! - only the transitions of [`TxnState::may_become`] are staged.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::group::TopicPartition;

#[cfg(test)]
mod tests;

/// Where a transactional id's transaction stands (Kafka's TransactionState).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    /// No transaction open (the id has a producer id and epoch).
    Empty,
    /// A transaction is open: partitions or groups were added to it.
    Ongoing,
    /// Decided: commit. The markers are being written.
    PrepareCommit,
    /// Decided: abort. The markers are being written.
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// The transitions a transactional id's state may take.
    pub fn may_become(self, next: TxnState) -> bool {
        use TxnState::*;
        match next {
            // InitProducerId: a new epoch, with nothing open.
            Empty => matches!(self, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(self, Empty | Ongoing | CompleteCommit | CompleteAbort),
            PrepareCommit => self == Ongoing,
            // An abort asked for, fenced by a new producer, or timed out.
            PrepareAbort => self == Ongoing,
            CompleteCommit => self == PrepareCommit,
            CompleteAbort => self == PrepareAbort,
        }
    }

    /// Whether a transaction is open (partitions or groups are part of it).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }
}

/// What the coordinator store keeps of one transactional id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRecord {
    pub transactional_id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub state: TxnState,
    /// The producer's `transaction.timeout.ms`.
    pub timeout_ms: u32,
    /// The partitions the open transaction wrote to.
    pub partitions: BTreeSet<TopicPartition>,
    /// The groups whose offsets the open transaction commits.
    pub groups: BTreeSet<String>,
    /// When the open transaction began (wall-clock ms; 0 with none open).
    pub started_ms: u64,
    /// When the record last changed (wall-clock ms).
    pub updated_ms: u64,
    /// Raised by each coordinator that takes the id over ([`TxnRecord::taken_over`]); its
    /// markers carry it, and a partition refuses a marker older than one it has for the
    /// producer (Kafka's coordinator epoch). Records stored before it existed read as 0.
    #[serde(default)]
    pub coordinator_epoch: i32,
}

impl TxnRecord {
    /// The record as a coordinator that has just loaded it coordinates it: at the next
    /// coordinator epoch, so a late marker of the coordinator before is refused where this
    /// one's has landed. The raised epoch must be stored before a marker carries it: at once
    /// for a decided transaction (whose markers the new coordinator writes as it loads it),
    /// else with the record's next change (markers only ever follow a stored decision).
    pub fn taken_over(self) -> TxnRecord {
        TxnRecord {
            coordinator_epoch: self.coordinator_epoch.saturating_add(1),
            ..self
        }
    }

    /// A commit or abort is decided and its markers not all written.
    pub fn is_decided(&self) -> bool {
        matches!(self.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// Why a request is refused (each is Kafka's error of the same name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// A change of the id is being stored, or its markers written: retry.
    #[error("another change of this transactional id is in progress")]
    ConcurrentTransactions,
    /// The producer's epoch is older than the id's: a newer producer took the id over.
    #[error("a newer producer with this transactional id fenced this one")]
    ProducerFenced,
    /// The producer id is not the id's.
    #[error("the producer id is not this transactional id's")]
    InvalidProducerIdMapping,
    /// The request does not fit the transaction's state (EndTxn with nothing open, a commit
    /// asked after an abort was decided, ...).
    #[error("the request does not fit the transaction's state")]
    InvalidTxnState,
    /// `transaction.timeout.ms` above the broker's `transaction.max.timeout.ms`, or zero.
    #[error("the transaction timeout is zero or above the broker's maximum")]
    InvalidTransactionTimeout,
}

/// What the adapter does next for a request (or a timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Answered without a change.
    Done(T),
    /// Store this record (fenced); the answer comes from [`TxnCoordinator::handle_stored`].
    Store(TxnRecord),
}

/// Markers to write for a decided transaction: a commit or abort control batch to each of its
/// partitions (by the partition's leader), and its groups' pending offsets made visible
/// (commit) or dropped (abort).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteMarkers {
    pub transactional_id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub partitions: BTreeSet<TopicPartition>,
    pub groups: BTreeSet<String>,
    /// The deciding coordinator's epoch ([`TxnRecord::coordinator_epoch`]).
    pub coordinator_epoch: i32,
}

/// What a stored change means for the request that asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// InitProducerId's answer.
    ProducerId { producer_id: i64, epoch: i16 },
    /// AddPartitionsToTxn, AddOffsetsToTxn and EndTxn: done.
    Done,
    /// InitProducerId that had to abort an open transaction first: the caller retries.
    RetryLater,
    /// A timeout's or a takeover's abort, or a completion: nobody waits.
    Nobody,
}

/// A producer's identity as a request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Producer {
    pub producer_id: i64,
    pub epoch: i16,
}

#[derive(Debug, Clone)]
struct Txn {
    /// `None` until the id's first record is stored.
    stored: Option<TxnRecord>,
    /// A change handed to the adapter to store, and what it means for its asker.
    pending: Option<(TxnRecord, Stored)>,
    /// A decided transaction whose markers the adapter is writing.
    writing: bool,
}

/// Every transactional id this broker coordinates.
#[derive(Debug)]
pub struct TxnCoordinator {
    txns: BTreeMap<String, Txn>,
    max_timeout_ms: u32,
    /// Markers to write, taken by [`TxnCoordinator::take_markers`].
    markers: Vec<WriteMarkers>,
}

impl TxnCoordinator {
    /// `max_timeout_ms`: the broker's `transaction.max.timeout.ms`.
    pub fn new(max_timeout_ms: u32) -> TxnCoordinator {
        TxnCoordinator {
            txns: BTreeMap::new(),
            max_timeout_ms,
            markers: Vec::new(),
        }
    }

    /// Takes over the ids whose records the store holds (a coordinator that moved here, or
    /// restarted): every decided transaction's markers are written again.
    pub fn load(&mut self, records: impl IntoIterator<Item = TxnRecord>) {
        for record in records {
            let decided = record.is_decided();
            let id = record.transactional_id.clone();
            if decided {
                self.markers.push(markers_of(&record));
            }
            self.txns.insert(
                id,
                Txn {
                    stored: Some(record),
                    pending: None,
                    writing: decided,
                },
            );
        }
        self.assert_invariants();
    }

    /// Forgets `transactional_id` (its coordination moved to another broker, or its store
    /// write was fenced): its markers are not written here any more.
    pub fn forget(&mut self, transactional_id: &str) {
        self.txns.remove(transactional_id);
        self.markers
            .retain(|markers| markers.transactional_id != transactional_id);
    }

    /// Whether `transactional_id` is loaded here.
    pub fn knows(&self, transactional_id: &str) -> bool {
        self.txns.contains_key(transactional_id)
    }

    /// The stored record of `transactional_id`.
    pub fn record(&self, transactional_id: &str) -> Option<&TxnRecord> {
        self.txns.get(transactional_id)?.stored.as_ref()
    }

    /// Every id's stored record, in id order (ListTransactions, DescribeTransactions).
    pub fn records(&self) -> impl Iterator<Item = &TxnRecord> {
        self.txns.values().filter_map(|txn| txn.stored.as_ref())
    }

    /// Markers the adapter must write now.
    pub fn take_markers(&mut self) -> Vec<WriteMarkers> {
        std::mem::take(&mut self.markers)
    }

    /// InitProducerId with a transactional id. `allocate` gives a new producer id (the first
    /// time, or when the epoch is exhausted). `expected`: the producer the client had (KIP-360),
    /// which must be the id's current one if given.
    pub fn handle_init(
        &mut self,
        transactional_id: &str,
        timeout_ms: u32,
        expected: Option<Producer>,
        now_ms: u64,
        allocate: &mut dyn FnMut() -> i64,
    ) -> Result<Step<Stored>, TxnError> {
        if timeout_ms == 0 || timeout_ms > self.max_timeout_ms {
            return Err(TxnError::InvalidTransactionTimeout);
        }
        let Some(txn) = self.txns.get_mut(transactional_id) else {
            let record = TxnRecord {
                transactional_id: transactional_id.to_string(),
                producer_id: allocate(),
                epoch: 0,
                state: TxnState::Empty,
                timeout_ms,
                partitions: BTreeSet::new(),
                groups: BTreeSet::new(),
                started_ms: 0,
                updated_ms: now_ms,
                coordinator_epoch: 0,
            };
            let answer = Stored::ProducerId {
                producer_id: record.producer_id,
                epoch: record.epoch,
            };
            // Nothing stored yet: the id exists once its first record is.
            self.txns.insert(
                transactional_id.to_string(),
                Txn {
                    stored: None,
                    pending: Some((record.clone(), answer)),
                    writing: false,
                },
            );
            self.assert_invariants();
            return Ok(Step::Store(record));
        };
        if txn.pending.is_some() || txn.writing {
            return Err(TxnError::ConcurrentTransactions);
        }
        let current = txn
            .stored
            .clone()
            .expect("an id without a change pending is stored");
        if let Some(expected) = expected
            && (expected.producer_id != current.producer_id || expected.epoch != current.epoch)
        {
            // KIP-360: a producer recovering from an error may bump only its own epoch.
            return Err(TxnError::ProducerFenced);
        }
        let current = &current;
        let (producer_id, epoch) = if current.epoch >= i16::MAX - 1 {
            (allocate(), 0)
        } else {
            (current.producer_id, current.epoch + 1)
        };
        let (next, answer) = if current.state == TxnState::Ongoing {
            // Fence the open transaction's producer and abort it at the new epoch; the caller
            // comes back once the abort is complete.
            let next = TxnRecord {
                producer_id,
                epoch,
                state: TxnState::PrepareAbort,
                updated_ms: now_ms,
                ..current.clone()
            };
            (next, Stored::RetryLater)
        } else if current.state.is_open() {
            return Err(TxnError::ConcurrentTransactions);
        } else {
            let next = TxnRecord {
                producer_id,
                epoch,
                state: TxnState::Empty,
                timeout_ms,
                partitions: BTreeSet::new(),
                groups: BTreeSet::new(),
                started_ms: 0,
                updated_ms: now_ms,
                transactional_id: current.transactional_id.clone(),
                coordinator_epoch: current.coordinator_epoch,
            };
            let answer = Stored::ProducerId { producer_id, epoch };
            (next, answer)
        };
        Ok(self.stage(transactional_id, next, answer))
    }

    /// AddPartitionsToTxn (`partitions`) or AddOffsetsToTxn (`group`): opens the transaction if
    /// none is, and adds to it. Already part of it: done at once.
    pub fn handle_add(
        &mut self,
        transactional_id: &str,
        producer: Producer,
        partitions: &[TopicPartition],
        group: Option<&str>,
        now_ms: u64,
    ) -> Result<Step<Stored>, TxnError> {
        let current = self.current(transactional_id, producer)?.clone();
        if matches!(
            current.state,
            TxnState::PrepareCommit | TxnState::PrepareAbort
        ) {
            return Err(TxnError::ConcurrentTransactions);
        }
        let new_partitions = partitions
            .iter()
            .any(|partition| !current.partitions.contains(partition));
        let new_group = group.is_some_and(|group| !current.groups.contains(group));
        if current.state == TxnState::Ongoing && !new_partitions && !new_group {
            return Ok(Step::Done(Stored::Done));
        }
        if !new_partitions && !new_group {
            // Nothing to add to a transaction that is not open: nothing opens.
            return Ok(Step::Done(Stored::Done));
        }
        let mut next = current.clone();
        if next.state != TxnState::Ongoing {
            next.started_ms = now_ms;
        }
        next.state = TxnState::Ongoing;
        next.partitions.extend(partitions.iter().cloned());
        next.groups.extend(group.map(str::to_string));
        next.updated_ms = now_ms;
        Ok(self.stage(transactional_id, next, Stored::Done))
    }

    /// EndTxn: commit or abort the open transaction. A retry of a decision already made (or
    /// complete) is answered done; the opposite decision is INVALID_TXN_STATE.
    pub fn handle_end(
        &mut self,
        transactional_id: &str,
        producer: Producer,
        commit: bool,
        now_ms: u64,
    ) -> Result<Step<Stored>, TxnError> {
        let current = self.current(transactional_id, producer)?.clone();
        let (prepared, complete) = if commit {
            (TxnState::PrepareCommit, TxnState::CompleteCommit)
        } else {
            (TxnState::PrepareAbort, TxnState::CompleteAbort)
        };
        match current.state {
            TxnState::Ongoing => {}
            state if state == prepared => return Err(TxnError::ConcurrentTransactions),
            state if state == complete => return Ok(Step::Done(Stored::Done)),
            // Kafka 2.x clients may abort with nothing added: nothing to do.
            TxnState::Empty if !commit => return Ok(Step::Done(Stored::Done)),
            _ => return Err(TxnError::InvalidTxnState),
        }
        let next = TxnRecord {
            state: prepared,
            updated_ms: now_ms,
            ..current.clone()
        };
        Ok(self.stage(transactional_id, next, Stored::Done))
    }

    /// Open transactions past their timeout, aborted at a bumped epoch (their producers are
    /// fenced): the records to store, each answered by [`TxnCoordinator::handle_stored`].
    pub fn poll_timeouts(&mut self, now_ms: u64) -> Vec<TxnRecord> {
        let expired: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, txn)| {
                txn.pending.is_none()
                    && txn.stored.as_ref().is_some_and(|stored| {
                        stored.state == TxnState::Ongoing
                            && now_ms >= stored.started_ms + u64::from(stored.timeout_ms)
                    })
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut staged = Vec::new();
        for id in expired {
            let current = self.record(&id).expect("filtered: stored").clone();
            // An exhausted epoch stays: the abort still fences by its markers.
            let epoch = if current.epoch < i16::MAX - 1 {
                current.epoch + 1
            } else {
                current.epoch
            };
            let next = TxnRecord {
                epoch,
                state: TxnState::PrepareAbort,
                updated_ms: now_ms,
                ..current.clone()
            };
            if let Step::Store(record) = self.stage(&id, next, Stored::Nobody) {
                staged.push(record);
            }
        }
        staged
    }

    /// The outcome of a [`Step::Store`]: stored (the change takes effect; a decision's markers
    /// are to be written) or not (the change is dropped; the asker hears the coordinator moved).
    /// Returns what the change means for whoever asked, `None` if it was not stored.
    pub fn handle_stored(&mut self, transactional_id: &str, stored: bool) -> Option<Stored> {
        let txn = self.txns.get_mut(transactional_id)?;
        let (record, answer) = txn.pending.take()?;
        if !stored {
            match &txn.stored {
                // A first record never stored: the id does not exist.
                None => {
                    self.txns.remove(transactional_id);
                }
                // A completion not stored: the decision stands, its markers go again (they
                // are idempotent) and complete it then.
                Some(decided) if txn.writing => self.markers.push(markers_of(decided)),
                Some(_) => {}
            }
            self.assert_invariants();
            return None;
        }
        match record.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                self.markers.push(markers_of(&record));
                txn.writing = true;
            }
            TxnState::CompleteCommit | TxnState::CompleteAbort => txn.writing = false,
            _ => {}
        }
        txn.stored = Some(record);
        self.assert_invariants();
        Some(answer)
    }

    /// The markers of `producer_id`'s decided transaction at `epoch` are written: the
    /// transaction completes (the record to store, answered by
    /// [`TxnCoordinator::handle_stored`]). Markers of another transaction are ignored.
    pub fn handle_markers_written(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        now_ms: u64,
    ) -> Option<TxnRecord> {
        let txn = self.txns.get_mut(transactional_id)?;
        let current = txn.stored.clone()?;
        let complete = match current.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return None,
        };
        if !txn.writing
            || txn.pending.is_some()
            || current.producer_id != producer_id
            || current.epoch != epoch
        {
            return None;
        }
        let next = TxnRecord {
            state: complete,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            started_ms: 0,
            updated_ms: now_ms,
            ..current
        };
        match self.stage(transactional_id, next, Stored::Nobody) {
            Step::Store(record) => Some(record),
            Step::Done(_) => None,
        }
    }

    /// The markers of a decided transaction could not all be written (a leader moved, a
    /// broker is down): they are to be written again.
    pub fn handle_markers_failed(&mut self, transactional_id: &str) {
        if let Some(txn) = self.txns.get(transactional_id)
            && txn.writing
            && let Some(stored) = &txn.stored
        {
            self.markers.push(markers_of(stored));
        }
    }

    /// The id's record if `producer` is its current producer, checked as Kafka checks it.
    fn current(&self, transactional_id: &str, producer: Producer) -> Result<&TxnRecord, TxnError> {
        let txn = self
            .txns
            .get(transactional_id)
            .ok_or(TxnError::InvalidProducerIdMapping)?;
        if txn.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        let current = txn
            .stored
            .as_ref()
            .ok_or(TxnError::InvalidProducerIdMapping)?;
        if current.producer_id != producer.producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if producer.epoch < current.epoch {
            return Err(TxnError::ProducerFenced);
        }
        if producer.epoch > current.epoch {
            // An epoch the coordinator never gave out.
            return Err(TxnError::ProducerFenced);
        }
        Ok(current)
    }

    fn stage(&mut self, transactional_id: &str, next: TxnRecord, answer: Stored) -> Step<Stored> {
        let txn = self
            .txns
            .get_mut(transactional_id)
            .expect("staged for a known id");
        if let Some(stored) = &txn.stored {
            assert!(
                stored.state.may_become(next.state),
                "{} may not become {}",
                stored.state.name(),
                next.state.name()
            );
        }
        txn.pending = Some((next.clone(), answer));
        self.assert_invariants();
        Step::Store(next)
    }

    /// The invariants of the module documentation.
    pub fn assert_invariants(&self) {
        for (id, txn) in &self.txns {
            assert!(
                txn.stored.is_some() || txn.pending.is_some(),
                "{id}: neither stored nor pending"
            );
            for record in txn
                .stored
                .iter()
                .chain(txn.pending.as_ref().map(|(r, _)| r))
            {
                assert_eq!(&record.transactional_id, id);
                let holds = !record.partitions.is_empty() || !record.groups.is_empty();
                assert_eq!(
                    holds,
                    record.state.is_open(),
                    "{id}: {} holding {:?} {:?}",
                    record.state.name(),
                    record.partitions,
                    record.groups
                );
            }
            if let (Some(stored), Some((pending, _))) = (&txn.stored, &txn.pending)
                && pending.producer_id == stored.producer_id
            {
                assert!(
                    pending.epoch >= stored.epoch,
                    "{id}: epoch {} after {}",
                    pending.epoch,
                    stored.epoch
                );
            }
            assert!(
                !txn.writing
                    || txn.stored.as_ref().is_some_and(|stored| matches!(
                        stored.state,
                        TxnState::PrepareCommit | TxnState::PrepareAbort
                    )),
                "{id}: writing markers outside a decided transaction"
            );
        }
    }
}

fn markers_of(record: &TxnRecord) -> WriteMarkers {
    WriteMarkers {
        transactional_id: record.transactional_id.clone(),
        producer_id: record.producer_id,
        epoch: record.epoch,
        commit: record.state == TxnState::PrepareCommit,
        partitions: record.partitions.clone(),
        groups: record.groups.clone(),
        coordinator_epoch: record.coordinator_epoch,
    }
}
