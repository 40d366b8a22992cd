use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const MAX_TIMEOUT_MS: u32 = 900_000;

fn tp(topic: &str, partition: u32) -> TopicPartition {
    TopicPartition::new(topic, partition)
}

/// Stores whatever is staged (the store always answers yes) and returns what it meant.
fn stored(coordinator: &mut TxnCoordinator, id: &str, step: Step<Stored>) -> Stored {
    match step {
        Step::Done(answer) => answer,
        Step::Store(record) => {
            assert_eq!(record.transactional_id, id);
            coordinator.handle_stored(id, true).expect("stored")
        }
    }
}

fn init(coordinator: &mut TxnCoordinator, id: &str, next_id: &mut i64) -> Producer {
    let mut allocate = || {
        *next_id += 1;
        *next_id
    };
    let step = coordinator
        .handle_init(id, 60_000, None, 0, &mut allocate)
        .unwrap();
    match stored(coordinator, id, step) {
        Stored::ProducerId { producer_id, epoch } => Producer { producer_id, epoch },
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_transaction_commits_in_stored_steps_and_its_markers_complete_it() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    let mut ids = 0;
    let producer = init(&mut coordinator, "app", &mut ids);
    assert_eq!(
        producer,
        Producer {
            producer_id: 1,
            epoch: 0
        }
    );
    let add = coordinator
        .handle_add("app", producer, &[tp("out", 0), tp("out", 1)], None, 10)
        .unwrap();
    let Step::Store(record) = &add else {
        panic!("{add:?}")
    };
    assert_eq!(record.state, TxnState::Ongoing);
    assert_eq!(record.started_ms, 10);
    // Until it is stored, the id's other requests wait.
    assert_eq!(
        coordinator.handle_end("app", producer, true, 11),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(stored(&mut coordinator, "app", add), Stored::Done);
    // Already part of it: nothing to store.
    assert_eq!(
        coordinator.handle_add("app", producer, &[tp("out", 0)], None, 12),
        Ok(Step::Done(Stored::Done))
    );
    let offsets = coordinator
        .handle_add("app", producer, &[], Some("readers"), 13)
        .unwrap();
    assert_eq!(stored(&mut coordinator, "app", offsets), Stored::Done);
    assert!(coordinator.take_markers().is_empty(), "nothing decided yet");

    let end = coordinator.handle_end("app", producer, true, 20).unwrap();
    assert_eq!(stored(&mut coordinator, "app", end), Stored::Done);
    let markers = coordinator.take_markers();
    assert_eq!(
        markers,
        [WriteMarkers {
            transactional_id: "app".into(),
            producer_id: 1,
            epoch: 0,
            commit: true,
            partitions: [tp("out", 0), tp("out", 1)].into(),
            groups: ["readers".to_string()].into(),
            coordinator_epoch: 0,
        }]
    );
    // While the markers are written, a retry of the decision waits, and nothing else goes in.
    assert_eq!(
        coordinator.handle_end("app", producer, true, 21),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(
        coordinator.handle_add("app", producer, &[tp("out", 2)], None, 21),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(
        coordinator.handle_markers_written("app", 1, 7, 22),
        None,
        "another epoch's markers"
    );
    let complete = coordinator
        .handle_markers_written("app", 1, 0, 22)
        .expect("completes");
    assert_eq!(complete.state, TxnState::CompleteCommit);
    assert!(complete.partitions.is_empty() && complete.groups.is_empty());
    assert_eq!(coordinator.handle_stored("app", true), Some(Stored::Nobody));
    // A lost answer's retry is answered as done; the opposite decision is refused.
    assert_eq!(
        coordinator.handle_end("app", producer, true, 23),
        Ok(Step::Done(Stored::Done))
    );
    assert_eq!(
        coordinator.handle_end("app", producer, false, 23),
        Err(TxnError::InvalidTxnState)
    );
    // The next transaction opens at the same epoch.
    let next = coordinator
        .handle_add("app", producer, &[tp("out", 2)], None, 30)
        .unwrap();
    let Step::Store(record) = next else { panic!() };
    assert_eq!((record.state, record.started_ms), (TxnState::Ongoing, 30));
}

#[test]
fn a_new_producer_fences_the_old_one_and_aborts_its_open_transaction() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    let mut ids = 0;
    let old = init(&mut coordinator, "app", &mut ids);
    let add = coordinator
        .handle_add("app", old, &[tp("out", 0)], None, 1)
        .unwrap();
    stored(&mut coordinator, "app", add);

    let mut allocate = || unreachable!("the id keeps its producer id");
    let fence = coordinator
        .handle_init("app", 60_000, None, 2, &mut allocate)
        .unwrap();
    let Step::Store(record) = &fence else {
        panic!()
    };
    assert_eq!(
        (record.state, record.epoch),
        (TxnState::PrepareAbort, 1),
        "aborted at the new epoch"
    );
    assert_eq!(stored(&mut coordinator, "app", fence), Stored::RetryLater);
    let markers = coordinator.take_markers();
    assert_eq!(markers.len(), 1);
    assert!(!markers[0].commit);
    assert_eq!(markers[0].epoch, 1);
    // The old producer is fenced from here on, while the abort is written and after.
    assert_eq!(
        coordinator.handle_add("app", old, &[tp("out", 1)], None, 3),
        Err(TxnError::ProducerFenced),
    );
    let complete = coordinator.handle_markers_written("app", 1, 1, 4).unwrap();
    assert_eq!(complete.state, TxnState::CompleteAbort);
    coordinator.handle_stored("app", true);
    assert_eq!(
        coordinator.handle_add("app", old, &[tp("out", 1)], None, 5),
        Err(TxnError::ProducerFenced)
    );
    assert_eq!(
        coordinator.handle_end("app", old, true, 5),
        Err(TxnError::ProducerFenced)
    );
    // The new producer's retry gets the next epoch.
    let new = init(&mut coordinator, "app", &mut ids);
    assert_eq!(
        new,
        Producer {
            producer_id: 1,
            epoch: 2
        }
    );
    assert_eq!(
        coordinator.handle_add(
            "app",
            Producer {
                producer_id: 99,
                epoch: 2
            },
            &[tp("out", 0)],
            None,
            6
        ),
        Err(TxnError::InvalidProducerIdMapping)
    );
}

#[test]
fn an_open_transaction_past_its_timeout_is_aborted_at_a_bumped_epoch() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    let mut ids = 0;
    let producer = init(&mut coordinator, "slow", &mut ids);
    let add = coordinator
        .handle_add("slow", producer, &[tp("t", 0)], None, 1_000)
        .unwrap();
    stored(&mut coordinator, "slow", add);
    assert!(coordinator.poll_timeouts(60_999).is_empty());
    let timed_out = coordinator.poll_timeouts(61_000);
    assert_eq!(timed_out.len(), 1);
    assert_eq!(
        (timed_out[0].state, timed_out[0].epoch),
        (TxnState::PrepareAbort, 1)
    );
    assert_eq!(
        coordinator.handle_stored("slow", true),
        Some(Stored::Nobody)
    );
    assert!(
        coordinator.poll_timeouts(70_000).is_empty(),
        "decided: not again"
    );
    assert_eq!(
        coordinator.handle_end("slow", producer, true, 61_001),
        Err(TxnError::ProducerFenced)
    );
    let markers = coordinator.take_markers();
    assert!(!markers[0].commit);
}

#[test]
fn a_coordinator_that_takes_over_writes_the_markers_its_predecessor_decided() {
    let record = |id: &str, state| TxnRecord {
        transactional_id: id.into(),
        producer_id: 7,
        epoch: 3,
        state,
        timeout_ms: 60_000,
        partitions: if state.is_open() {
            [tp("t", 0)].into()
        } else {
            Default::default()
        },
        groups: Default::default(),
        started_ms: 5,
        updated_ms: 6,
        coordinator_epoch: 2,
    };
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    coordinator.load(
        [
            record("committing", TxnState::PrepareCommit),
            record("aborting", TxnState::PrepareAbort),
            record("open", TxnState::Ongoing),
            record("done", TxnState::CompleteCommit),
        ]
        .map(TxnRecord::taken_over),
    );
    let markers: BTreeMap<String, (bool, i32)> = coordinator
        .take_markers()
        .into_iter()
        .map(|markers| {
            (
                markers.transactional_id,
                (markers.commit, markers.coordinator_epoch),
            )
        })
        .collect();
    assert_eq!(
        markers,
        [
            ("aborting".to_string(), (false, 3)),
            ("committing".to_string(), (true, 3))
        ]
        .into(),
        "the markers carry the coordinator epoch of the one that took over"
    );
    // A failed write is written again.
    coordinator.handle_markers_failed("committing");
    assert_eq!(coordinator.take_markers().len(), 1);
    coordinator.handle_markers_failed("open");
    assert!(coordinator.take_markers().is_empty(), "nothing decided");
}

#[test]
fn a_change_the_store_refused_takes_no_effect() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    let mut allocate = || 5;
    let step = coordinator
        .handle_init("app", 1_000, None, 0, &mut allocate)
        .unwrap();
    assert!(matches!(step, Step::Store(_)));
    assert_eq!(coordinator.handle_stored("app", false), None);
    assert!(coordinator.record("app").is_none(), "never stored: unknown");

    let mut ids = 0;
    let producer = init(&mut coordinator, "app", &mut ids);
    let end = coordinator
        .handle_add("app", producer, &[tp("t", 0)], None, 1)
        .unwrap();
    assert!(matches!(end, Step::Store(_)));
    assert_eq!(coordinator.handle_stored("app", false), None);
    assert_eq!(coordinator.record("app").unwrap().state, TxnState::Empty);
}

#[test]
fn requests_that_do_not_fit_are_refused() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    let mut allocate = || 1;
    assert_eq!(
        coordinator.handle_init("app", MAX_TIMEOUT_MS + 1, None, 0, &mut allocate),
        Err(TxnError::InvalidTransactionTimeout)
    );
    assert_eq!(
        coordinator.handle_init("app", 0, None, 0, &mut allocate),
        Err(TxnError::InvalidTransactionTimeout)
    );
    let mut ids = 0;
    let producer = init(&mut coordinator, "app", &mut ids);
    assert_eq!(
        coordinator.handle_end("app", producer, true, 1),
        Err(TxnError::InvalidTxnState),
        "nothing open to commit"
    );
    assert_eq!(
        coordinator.handle_end("app", producer, false, 1),
        Ok(Step::Done(Stored::Done)),
        "an abort with nothing open is a no-op"
    );
    let newer = Producer {
        epoch: producer.epoch + 1,
        ..producer
    };
    assert_eq!(
        coordinator.handle_add("app", newer, &[tp("t", 0)], None, 1),
        Err(TxnError::ProducerFenced),
        "an epoch never given out"
    );
    assert_eq!(
        coordinator.handle_add("nobody", producer, &[tp("t", 0)], None, 1),
        Err(TxnError::InvalidProducerIdMapping)
    );
    // KIP-360: a recovering producer names the epoch it had.
    let mut allocate = || unreachable!();
    let stale = Producer {
        epoch: producer.epoch + 5,
        ..producer
    };
    assert_eq!(
        coordinator.handle_init("app", 1_000, Some(stale), 2, &mut allocate),
        Err(TxnError::ProducerFenced)
    );
    assert!(matches!(
        coordinator.handle_init("app", 1_000, Some(producer), 2, &mut allocate),
        Ok(Step::Store(_))
    ));
}

#[test]
fn an_exhausted_epoch_takes_a_new_producer_id() {
    let mut coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
    coordinator.load([TxnRecord {
        transactional_id: "old".into(),
        producer_id: 3,
        epoch: i16::MAX - 1,
        state: TxnState::CompleteCommit,
        timeout_ms: 1_000,
        partitions: Default::default(),
        groups: Default::default(),
        started_ms: 0,
        updated_ms: 0,
        coordinator_epoch: 0,
    }]);
    let mut allocate = || 4;
    let step = coordinator
        .handle_init("old", 1_000, None, 1, &mut allocate)
        .unwrap();
    assert_eq!(
        stored(&mut coordinator, "old", step),
        Stored::ProducerId {
            producer_id: 4,
            epoch: 0
        }
    );
}

/// What the simulated cluster saw: every marker written, per partition.
#[derive(Default)]
struct Written {
    /// Partition → markers in the order written: (producer id, epoch, commit).
    markers: BTreeMap<TopicPartition, Vec<(i64, i16, bool)>>,
    /// (Partition, producer id) → the coordinator epoch of its newest marker there, and the
    /// generation of the coordinator that wrote it.
    coordinator_epochs: BTreeMap<(TopicPartition, i64), (i32, u64)>,
}

/// Producers, a coordinator that restarts from its store, a store that sometimes refuses,
/// markers that are written late or fail, and time that passes timeouts, on seeded
/// randomness. After every step the machine's invariants hold, no transaction is ever stored
/// decided both ways, a fenced producer is never told yes, and an id's stored epochs never go
/// down; at the end (everything drained) nothing is left decided but incomplete, and every
/// transaction a producer was told is committing has its commit marker on each partition.
#[test]
fn transactions_survive_restarts_refused_writes_and_timeouts() {
    for seed in 0..200 {
        simulate(seed);
    }
}

struct Client {
    id: String,
    producer: Option<Producer>,
    /// Partitions added to the open transaction, as the client was told.
    added: BTreeSet<TopicPartition>,
}

/// The simulated cluster around one coordinator.
struct Sim {
    seed: u64,
    rng: StdRng,
    coordinator: TxnCoordinator,
    store: BTreeMap<String, TxnRecord>,
    written: Written,
    next_producer_id: i64,
    now_ms: u64,
    /// Two clients per id: the second takes the id over from the first now and then.
    clients: Vec<Client>,
    /// (producer id, epoch, partitions) of each commit a client was told was decided.
    told_committed: Vec<(i64, i16, BTreeSet<TopicPartition>)>,
    /// Markers handed out and not yet landed, with the generation of the coordinator that
    /// handed them out: a coordinator that moved away may still land its own late.
    markers_in_flight: Vec<(u64, WriteMarkers)>,
    /// How many coordinators have taken over.
    generation: u64,
    stored_epochs: BTreeMap<String, (i64, i16)>,
    /// Each transaction's decision as stored: (id, producer id, epoch, start) → commit.
    decisions: BTreeMap<(String, i64, i16, u64), bool>,
}

fn simulate(seed: u64) {
    let mut sim = Sim {
        seed,
        rng: StdRng::seed_from_u64(seed),
        coordinator: TxnCoordinator::new(MAX_TIMEOUT_MS),
        store: BTreeMap::new(),
        written: Written::default(),
        next_producer_id: 0,
        now_ms: 0,
        clients: (0..6)
            .map(|i| Client {
                id: format!("app-{}", i / 2),
                producer: None,
                added: BTreeSet::new(),
            })
            .collect(),
        told_committed: Vec::new(),
        markers_in_flight: Vec::new(),
        generation: 0,
        stored_epochs: BTreeMap::new(),
        decisions: BTreeMap::new(),
    };
    for _ in 0..300 {
        // Strictly on: a transaction is known by its id, producer, epoch and start.
        sim.now_ms += sim.rng.random_range(1..2_000);
        match sim.rng.random_range(0..100) {
            0..=69 => sim.client_acts(),
            70..=84 => sim.markers_land(),
            85..=94 => {
                for record in sim.coordinator.poll_timeouts(sim.now_ms) {
                    sim.store_step(record);
                }
            }
            // The coordinator moves: a new one loads the store, as the broker does (a decided
            // transaction's raised coordinator epoch stored first); the old one's markers in
            // flight may still land.
            _ => sim.take_over(),
        }
        sim.check_stored();
    }
    sim.drain_and_check();
}

impl Sim {
    fn take_over(&mut self) {
        self.generation += 1;
        self.coordinator = TxnCoordinator::new(MAX_TIMEOUT_MS);
        let taken: Vec<TxnRecord> = self
            .store
            .values()
            .cloned()
            .map(TxnRecord::taken_over)
            .collect();
        for record in taken.iter().filter(|record| record.is_decided()) {
            self.store
                .insert(record.transactional_id.clone(), record.clone());
        }
        self.coordinator.load(taken);
    }

    /// Stores a staged record, or refuses it as a lost claim would, and answers.
    fn store_step(&mut self, record: TxnRecord) -> Option<Stored> {
        let id = record.transactional_id.clone();
        let accepted = self.rng.random_bool(0.9);
        if accepted {
            self.store.insert(id.clone(), record);
        }
        self.coordinator.handle_stored(&id, accepted)
    }

    fn client_acts(&mut self) {
        let at = self.rng.random_range(0..self.clients.len());
        let id = self.clients[at].id.clone();
        let Some(producer) = self.clients[at].producer else {
            let next = &mut self.next_producer_id;
            let mut allocate = || {
                *next += 1;
                *next
            };
            let timeout = self.rng.random_range(5_000..30_000);
            if let Ok(Step::Store(record)) =
                self.coordinator
                    .handle_init(&id, timeout, None, self.now_ms, &mut allocate)
                && let Some(Stored::ProducerId { producer_id, epoch }) = self.store_step(record)
            {
                self.clients[at].producer = Some(Producer { producer_id, epoch });
                self.clients[at].added.clear();
            }
            return;
        };
        let step = if self.rng.random_bool(0.6) {
            let partition = tp("out", self.rng.random_range(0..4));
            self.coordinator
                .handle_add(
                    &id,
                    producer,
                    std::slice::from_ref(&partition),
                    None,
                    self.now_ms,
                )
                .map(|step| (step, Some(partition), None))
        } else {
            let commit = self.rng.random_bool(0.7);
            self.coordinator
                .handle_end(&id, producer, commit, self.now_ms)
                .map(|step| (step, None, Some(commit)))
        };
        let (step, partition, end) = match step {
            Err(TxnError::ProducerFenced) => {
                self.clients[at].producer = None;
                return;
            }
            Err(_) => return,
            Ok(step) => step,
        };
        let answer = match step {
            Step::Done(answer) => Some(answer),
            Step::Store(record) => self.store_step(record),
        };
        if answer != Some(Stored::Done) {
            return;
        }
        // The producer was told yes: it must be the id's current one.
        let current = self.store.get(&id).expect("told yes: stored");
        assert_eq!(
            (current.producer_id, current.epoch),
            (producer.producer_id, producer.epoch),
            "seed {}: a fenced producer was told yes",
            self.seed
        );
        let client = &mut self.clients[at];
        client.added.extend(partition);
        if end == Some(true) && !client.added.is_empty() {
            let added = std::mem::take(&mut client.added);
            self.told_committed
                .push((producer.producer_id, producer.epoch, added));
        } else if end.is_some() {
            client.added.clear();
        }
    }

    /// The current coordinator's markers due, in flight from now on.
    fn hand_out_markers(&mut self) {
        let generation = self.generation;
        self.markers_in_flight.extend(
            self.coordinator
                .take_markers()
                .into_iter()
                .map(|markers| (generation, markers)),
        );
    }

    /// One decided transaction's markers are written (or fail), in any order; those of a
    /// coordinator that moved away land too, and tell nobody.
    fn markers_land(&mut self) {
        self.hand_out_markers();
        if self.markers_in_flight.is_empty() {
            return;
        }
        let at = self.rng.random_range(0..self.markers_in_flight.len());
        let (from, markers) = self.markers_in_flight.swap_remove(at);
        if self.rng.random_bool(0.2) {
            if from == self.generation {
                self.coordinator
                    .handle_markers_failed(&markers.transactional_id);
            }
            return;
        }
        if let Some(record) = self.write(from, &markers) {
            self.store_step(record);
        }
    }

    /// Writes `markers` of the coordinator of generation `from` to their partitions, each
    /// refusing a marker older than its newest for the producer (as `check_marker` does), and
    /// tells the coordinator if it is still the current one: the completion to store. A
    /// refused marker of the current coordinator, or a late one of an earlier coordinator
    /// landing after its successor's, fails the run.
    fn write(&mut self, from: u64, markers: &WriteMarkers) -> Option<TxnRecord> {
        let seed = self.seed;
        let current = from == self.generation;
        for partition in &markers.partitions {
            let newest = self
                .written
                .coordinator_epochs
                .entry((partition.clone(), markers.producer_id))
                .or_insert((i32::MIN, 0));
            if markers.coordinator_epoch < newest.0 {
                assert!(
                    !current,
                    "seed {seed}: the current coordinator's marker was refused"
                );
                continue;
            }
            assert!(
                from >= newest.1,
                "seed {seed}: a marker of coordinator {from} landed on {partition:?} after one of coordinator {}",
                newest.1
            );
            *newest = (markers.coordinator_epoch, from);
            self.written
                .markers
                .entry(partition.clone())
                .or_default()
                .push((markers.producer_id, markers.epoch, markers.commit));
        }
        if !current {
            return None;
        }
        self.coordinator.handle_markers_written(
            &markers.transactional_id,
            markers.producer_id,
            markers.epoch,
            self.now_ms,
        )
    }

    /// No transaction is ever stored decided both ways; an id's epochs never go down.
    fn check_stored(&mut self) {
        let seed = self.seed;
        for (id, record) in &self.store {
            let decided = match record.state {
                TxnState::PrepareCommit => Some(true),
                TxnState::PrepareAbort => Some(false),
                _ => None,
            };
            if let Some(commit) = decided {
                let transaction = (
                    id.clone(),
                    record.producer_id,
                    record.epoch,
                    record.started_ms,
                );
                let first = *self.decisions.entry(transaction.clone()).or_insert(commit);
                assert_eq!(
                    first, commit,
                    "seed {seed}: {transaction:?} decided both ways"
                );
            }
            let epoch = (record.producer_id, record.epoch);
            if let Some(before) = self.stored_epochs.insert(id.clone(), epoch) {
                assert!(
                    epoch.0 != before.0 || epoch.1 >= before.1,
                    "seed {seed}: {id}'s epoch went from {before:?} to {epoch:?}"
                );
            }
        }
    }

    /// Every decided transaction's markers written, with no more faults; then nothing is left
    /// decided but incomplete, and every commit a client was told of is on its partitions.
    fn drain_and_check(mut self) {
        let seed = self.seed;
        for _ in 0..100 {
            self.hand_out_markers();
            let Some((from, markers)) = self.markers_in_flight.pop() else {
                break;
            };
            if let Some(record) = self.write(from, &markers) {
                let id = record.transactional_id.clone();
                self.store.insert(id.clone(), record);
                self.coordinator.handle_stored(&id, true);
            }
        }
        for record in self.store.values() {
            assert!(
                !matches!(
                    record.state,
                    TxnState::PrepareCommit | TxnState::PrepareAbort
                ),
                "seed {seed}: {} left decided but incomplete",
                record.transactional_id
            );
        }
        for (producer_id, epoch, partitions) in &self.told_committed {
            for partition in partitions {
                let markers = self
                    .written
                    .markers
                    .get(partition)
                    .cloned()
                    .unwrap_or_default();
                assert!(
                    markers.contains(&(*producer_id, *epoch, true)),
                    "seed {seed}: committed ({producer_id}, {epoch}) has no commit marker on {partition:?}: {markers:?}"
                );
            }
        }
        assert!(
            !self.decisions.is_empty() || !seed.is_multiple_of(50),
            "seed {seed}: the run decided nothing"
        );
    }
}
