//! Deterministic simulation of one partition replicated on three brokers, running the broker's
//! own replication code on virtual time.
//!
//! Each simulated broker runs what a broker runs for a partition:
//! - the real log task (`log::writer`) over [`SimStorage`], with `flush=always`: a crash keeps
//!   what was synced and a random prefix of the rest, its last write torn, and the broker
//!   restarts through the log's real recovery (torn tails truncated, the epoch cache and the
//!   high-watermark checkpoint read back);
//! - the real [`Leader`] and [`replication::Follower`] state machines, driven by the real drivers:
//!   [`replicator::follow`] for a follower and [`replicator::serve_fetch`] for a leader answering
//!   one (the broker is their [`LeaderHost`], as the shard is in production);
//! - role changes, produces, ticks and high-watermark checkpoints as the shard does them.
//!
//! The simulator keeps the rest of the world: an in-memory network that delays, drops and
//! reorders messages and cuts a broker off (so a stale leader keeps believing it leads); a
//! linearizable store with fenced ISR writes (etcd); a controller that fails leadership over when
//! a broker's lease lapses (`placement::failover`, the controller's own choice). Time is tokio's
//! paused clock: it moves only when every task waits, so a run is a function of its seed.
//!
//! Checked while it runs, by reading every replica's log as a consumer would (up to its high
//! watermark):
//! - no offset holds two values: what any replica shows below its high watermark never differs
//!   from what any other showed there, so no reader sees a record that later changes;
//! - no acknowledged `acks=all` record is lost: it is what every replica shows at its offset;
//! - a replica's high watermark never goes back while it lives (a follower never truncates
//!   below it), and the leader the store names, once settled, is past every committed record
//!   and holds each of them.
//!
//! At the end it heals everything and checks that the replicas converge: all in the ISR, logs
//! identical, every acknowledged record present.
//!
//! `STRATA_SIM_SEEDS=N` runs N seeds (default 300); `STRATA_SIM_SEED=S` runs one, printing its
//! trace with `STRATA_SIM_TRACE=1`. A failure prints the seed and the command that replays it.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_coordinator::PartitionState;
use strata_coordinator::placement::{self, NO_LEADER};
use strata_node::clock::Clock;
use strata_node::io::sim::SimStorage;
use strata_node::log::writer::{self, LogHandle};
use strata_node::log::{DirectWrites, FlushPolicy, LogConfig, PartitionLog};
use strata_node::replication::{AckError, IsrProposal, Leader, LeaderConfig};
use strata_node::replicator::{
    self, FollowedPartition, LeaderHost, PartitionRole, ReplicaFetchAnswer, ReplicaNetwork,
};
use strata_wire::batch::{BatchBuilder, split_batches};
use strata_wire::protocol::{ReplicaFetchRequest, ReplicaFetchResponse};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::{JoinHandle, LocalSet};

const IDS: [i32; 3] = [1, 2, 3];
const TOPIC: &str = "sim";
const RUN_MS: u64 = 3_000;
const SETTLE_MS: u64 = 4_000;
const CONFIG: LeaderConfig = LeaderConfig {
    lag_time_max_ms: 300,
    min_insync_replicas: 2,
};
/// How long a caught-up follower's fetch waits at the leader.
const FETCH_WAIT_MS: u32 = 40;
/// A fetch whose request or answer the network lost fails after this long (QUIC's idle
/// timeout, scaled to the simulation).
const FETCH_TIMEOUT: Duration = Duration::from_millis(120);
const TICK: Duration = Duration::from_millis(10);
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        segment_ms: None,
        index_interval_bytes: 256,
        flush: FlushPolicy::Always,
        preallocate: false,
        direct_writes: DirectWrites::Replicated,
        direct_write_min_bytes: 0,
        ..LogConfig::default()
    }
}

fn dir(id: i32) -> std::path::PathBuf {
    Path::new("/broker").join(id.to_string()).join("sim-0")
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counts {
    produced: u64,
    acknowledged: u64,
    refused: u64,
    crashes: u64,
    cuts: u64,
    elections: u64,
    truncations: u64,
    recovered_bytes_truncated: u64,
}

/// What the checks have learned so far.
#[derive(Default)]
struct History {
    /// Every record ever shown below some replica's high watermark, by offset (its value).
    committed: Vec<u64>,
    /// Acknowledged `acks=all` records: offset → value.
    acknowledged: BTreeMap<u64, u64>,
    /// The highest high watermark each (broker, life) showed.
    high_watermarks: BTreeMap<(i32, u64), u64>,
    /// How far each (broker, life) was read and checked.
    read: BTreeMap<(i32, u64), u64>,
    /// How far the current leadership term's log was checked against `committed`.
    leader_verified: Option<((i32, u64, u32), u64)>,
}

/// One broker id's lasting state across its lives: its disk and its network.
struct Slot {
    storage: SimStorage,
    life: u64,
    cut_off: bool,
    cut: u64,
    /// A life is starting (recovering its log).
    starting: bool,
    /// The running life, if any; its task holds every task of that life.
    running: Option<(Rc<Broker>, JoinHandle<()>)>,
}

struct World {
    rng: RefCell<StdRng>,
    trace: bool,
    clock: Clock,
    /// The store (etcd): linearizable, fenced writes.
    state: RefCell<PartitionState>,
    /// Brokers whose lease holds.
    live: RefCell<BTreeSet<i32>>,
    slots: RefCell<BTreeMap<i32, Slot>>,
    faults: Cell<bool>,
    history: RefCell<History>,
    counts: RefCell<Counts>,
    controller: Notify,
    next_value: Cell<u64>,
}

impl World {
    fn trace(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!(
                "{:>6} {}",
                self.clock.monotonic_ms() - START.with(Cell::get),
                what()
            );
        }
    }

    fn random_ms(&self, range: std::ops::RangeInclusive<u64>) -> Duration {
        Duration::from_millis(self.rng.borrow_mut().random_range(range))
    }

    fn chance(&self, probability: f64) -> bool {
        self.rng.borrow_mut().random_bool(probability)
    }

    fn reachable(&self, id: i32) -> bool {
        self.slots
            .borrow()
            .get(&id)
            .is_some_and(|slot| !slot.cut_off && slot.running.is_some())
    }

    fn broker(&self, id: i32) -> Option<Rc<Broker>> {
        let slots = self.slots.borrow();
        let slot = slots.get(&id)?;
        slot.running.as_ref().map(|(broker, _)| broker.clone())
    }

    /// A message from `from` to `to` crosses the network: `false` when it is lost.
    async fn transmit(&self, from: i32, to: i32) -> bool {
        let faults = self.faults.get();
        if !self.reachable(from) || !self.reachable(to) || faults && self.chance(0.05) {
            return false;
        }
        let delay = self.random_ms(1..=if faults { 12 } else { 3 });
        self.clock.sleep(delay).await;
        self.reachable(from) && self.reachable(to)
    }

    /// The watch: every broker that can reach the store learns its state.
    fn publish(&self) {
        let state = self.state.borrow().clone();
        for id in IDS {
            if self.reachable(id)
                && let Some(broker) = self.broker(id)
            {
                broker.learn(state.clone());
            }
        }
    }
}

thread_local! {
    /// The virtual time a run started at, for traces.
    static START: Cell<i64> = const { Cell::new(0) };
}

/// The network as a follower sees it.
struct SimNetwork {
    world: Rc<World>,
    from: i32,
}

#[derive(Debug)]
struct Lost;

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the network lost the fetch")
    }
}

impl ReplicaNetwork for SimNetwork {
    type Error = Lost;

    async fn replica_fetch(
        &self,
        leader: i32,
        request: ReplicaFetchRequest,
        _records_phase: Option<usize>,
    ) -> Result<ReplicaFetchAnswer, Lost> {
        let world = &self.world;
        let lost = async {
            world.clock.sleep(FETCH_TIMEOUT).await;
            Err(Lost)
        };
        if !world.transmit(self.from, leader).await {
            return lost.await;
        }
        let Some(broker) = world.broker(leader) else {
            return lost.await;
        };
        let (reply, answer) = oneshot::channel();
        if broker
            .inbox
            .send(Inbound::Fetch { request, reply })
            .is_err()
        {
            return lost.await;
        }
        let wait = FETCH_TIMEOUT + Duration::from_millis(u64::from(FETCH_WAIT_MS));
        let Some(Ok(response)) = world.clock.timeout(wait, answer).await else {
            // The leader died with the request, or took too long.
            return Err(Lost);
        };
        if !world.transmit(leader, self.from).await {
            return lost.await;
        }
        if response.diverging.is_some() {
            world.counts.borrow_mut().truncations += 1;
        }
        Ok(ReplicaFetchAnswer {
            response,
            placed: None,
        })
    }
}

enum Inbound {
    Fetch {
        request: ReplicaFetchRequest,
        reply: oneshot::Sender<ReplicaFetchResponse>,
    },
    Learn(PartitionState),
    Produce(u64),
}

enum Role {
    Idle,
    Leader(Box<Leader<(u64, u64)>>),
    Follower {
        task: JoinHandle<()>,
        high_watermark: Rc<Cell<u64>>,
    },
}

/// One life of a broker: what it holds in memory between a start and a crash.
struct Broker {
    /// Itself, for the tasks it starts.
    this: std::rc::Weak<Broker>,
    id: i32,
    life: u64,
    world: Rc<World>,
    log: LogHandle,
    inbox: mpsc::UnboundedSender<Inbound>,
    known: RefCell<Option<PartitionState>>,
    role: RefCell<Role>,
    /// Started, and not yet told about a leadership of this life.
    fresh: Cell<bool>,
    high_watermark_checkpointed: Cell<u64>,
}

impl Broker {
    fn high_watermark(&self) -> u64 {
        match &*self.role.borrow() {
            Role::Leader(leader) => leader.high_watermark(),
            Role::Follower { high_watermark, .. } => high_watermark.get(),
            Role::Idle => self.high_watermark_checkpointed.get(),
        }
    }

    fn learn(&self, state: PartitionState) {
        let _ = self.inbox.send(Inbound::Learn(state));
    }

    /// Hands out what the leader answered: acknowledged produces go to the history.
    fn settle(&self, leader: &mut Leader<(u64, u64)>) {
        let mut history = self.world.history.borrow_mut();
        let mut counts = self.world.counts.borrow_mut();
        for ((offset, value), result) in leader.poll_acks() {
            match result {
                Ok(()) => {
                    let before = history.acknowledged.insert(offset, value);
                    assert!(
                        before.is_none_or(|before| before == value),
                        "offset {offset} acknowledged for {before:?} and for {value}"
                    );
                    counts.acknowledged += 1;
                }
                Err(AckError::NotLeader | AckError::NotEnoughReplicasAfterAppend { .. }) => {
                    counts.refused += 1;
                }
                Err(AckError::NotEnoughReplicas { .. }) => unreachable!("checked before append"),
            }
        }
    }

    /// Ends this broker's role: waiting produces fail, the follower loop stops.
    fn stop_role(&self) {
        match std::mem::replace(&mut *self.role.borrow_mut(), Role::Idle) {
            Role::Leader(mut leader) => {
                self.high_watermark_checkpointed
                    .set(leader.high_watermark());
                leader.resign();
                self.settle(&mut leader);
            }
            Role::Follower {
                task,
                high_watermark,
            } => {
                task.abort();
                self.high_watermark_checkpointed.set(high_watermark.get());
            }
            Role::Idle => {}
        }
    }
}

/// The broker's main loop: its inbox, as a shard's.
async fn run_broker(broker: Rc<Broker>, mut inbox: mpsc::UnboundedReceiver<Inbound>) {
    tokio::task::spawn_local(ticks(broker.clone()));
    while let Some(message) = inbox.recv().await {
        match message {
            Inbound::Fetch { request, reply } => {
                let broker = broker.clone();
                tokio::task::spawn_local(async move {
                    let _ = reply.send(replicator::serve_fetch(&*broker, request).await);
                });
            }
            Inbound::Learn(state) => assume_role(&broker, state),
            Inbound::Produce(value) => {
                tokio::task::spawn_local(produce(broker.clone(), value));
            }
        }
    }
}

/// What `Shard::assume_role` does for one partition.
fn assume_role(broker: &Rc<Broker>, state: PartitionState) {
    let world = &broker.world;
    let id = broker.id;
    let known = broker.known.borrow().clone();
    if known
        .as_ref()
        .is_some_and(|known| known.partition_epoch >= state.partition_epoch)
    {
        return;
    }
    if broker.fresh.get() && state.leader == id {
        // Just started, and named leader at an epoch of an earlier life: its log may have
        // lost unsynced records that followers hold under that same epoch. It must not lead
        // at that epoch; it asks for the next one (as the broker does at startup).
        let world = world.clone();
        tokio::task::spawn_local(async move {
            world.clock.sleep(Duration::from_millis(2)).await;
            let mut store = world.state.borrow_mut();
            if world.reachable(id)
                && store.leader == id
                && store.partition_epoch == state.partition_epoch
            {
                store.leader_epoch += 1;
                store.partition_epoch += 1;
                let epoch = store.leader_epoch;
                drop(store);
                world.trace(|| format!("{id} takes epoch {epoch}"));
                world.publish();
            }
        });
        broker.fresh.set(false);
        return;
    }
    broker.fresh.set(false);
    let same_leadership = known.as_ref().is_some_and(|known| {
        known.leader == state.leader && known.leader_epoch == state.leader_epoch
    });
    *broker.known.borrow_mut() = Some(state.clone());
    {
        let mut role = broker.role.borrow_mut();
        match &mut *role {
            Role::Leader(leader) if same_leadership && state.leader == id => {
                leader.handle_state(
                    state.replicas.clone(),
                    state.isr.clone(),
                    state.partition_epoch,
                    world.clock.monotonic_ms(),
                );
                broker.settle(leader);
                return;
            }
            Role::Follower { .. } if same_leadership => return,
            Role::Idle if same_leadership && state.leader == NO_LEADER => return,
            _ => {}
        }
    }
    broker.stop_role();
    if state.leader == NO_LEADER {
        return;
    }
    let broker = broker.clone();
    tokio::task::spawn_local(async move {
        let Ok(info) = broker.log.replica_info().await else {
            return;
        };
        let world = broker.world.clone();
        if broker.known.borrow().as_ref() != Some(&state)
            || !matches!(*broker.role.borrow(), Role::Idle)
        {
            // A newer state arrived while the log answered; it set the role.
            return;
        }
        let high_watermark = broker
            .high_watermark_checkpointed
            .get()
            .max(info.high_watermark_checkpoint)
            .min(info.offsets.log_end);
        if state.leader == broker.id {
            // flush=always: what the log holds durably; the rest is synced just below.
            let log_end = info.offsets.durable;
            if log_end < info.offsets.log_end {
                let broker = broker.clone();
                let epoch = state.leader_epoch;
                tokio::task::spawn_local(async move {
                    let Ok(durable) = broker.log.sync().await else {
                        return;
                    };
                    broker.with_leader_at(TOPIC, 0, epoch, |leader| {
                        leader.handle_appended(leader.log_end().max(durable));
                    });
                });
            }
            let leader = Leader::new(
                broker.id,
                state.leader_epoch,
                state.partition_epoch,
                state.replicas.clone(),
                state.isr.clone(),
                log_end,
                high_watermark,
                CONFIG,
                world.clock.monotonic_ms(),
            );
            world.counts.borrow_mut().elections += 1;
            world.trace(|| {
                format!(
                    "{} leads epoch {} from {log_end} (high watermark {})",
                    broker.id,
                    state.leader_epoch,
                    leader.high_watermark()
                )
            });
            *broker.role.borrow_mut() = Role::Leader(Box::new(leader));
        } else {
            let high_watermark = Rc::new(Cell::new(high_watermark));
            let network = Rc::new(SimNetwork {
                world: world.clone(),
                from: broker.id,
            });
            let followed = FollowedPartition {
                topic: TOPIC.to_string(),
                partition: 0,
                replica_id: broker.id,
                leader: state.leader,
                leader_epoch: state.leader_epoch,
                max_wait_ms: FETCH_WAIT_MS,
            };
            let task = tokio::task::spawn_local(replicator::follow(
                network,
                followed,
                broker.log.clone(),
                high_watermark.clone(),
                world.clock,
            ));
            world.trace(|| {
                format!(
                    "{} follows {} at epoch {} from {}",
                    broker.id, state.leader, state.leader_epoch, info.offsets.log_end
                )
            });
            *broker.role.borrow_mut() = Role::Follower {
                task,
                high_watermark,
            };
        }
    });
}

impl LeaderHost for Broker {
    type Waiter = (u64, u64);

    fn clock(&self) -> Clock {
        self.world.clock
    }

    fn role(&self, _topic: &str, _partition: u32) -> PartitionRole {
        match &*self.role.borrow() {
            Role::Leader(_) => PartitionRole::Leading {
                log: self.log.clone(),
                recovery_bytes_per_sec: None,
            },
            _ => PartitionRole::NotLeading {
                leader_epoch: self
                    .known
                    .borrow()
                    .as_ref()
                    .map_or(0, |known| known.leader_epoch),
            },
        }
    }

    fn with_leader<T>(
        &self,
        _topic: &str,
        _partition: u32,
        change: impl FnOnce(&mut Leader<(u64, u64)>) -> T,
    ) -> Option<T> {
        let mut role = self.role.borrow_mut();
        let Role::Leader(leader) = &mut *role else {
            return None;
        };
        let outcome = change(leader);
        self.settle(leader);
        Some(outcome)
    }

    fn propose_isr(&self, _topic: &str, _partition: u32, proposal: IsrProposal, _replica: i32) {
        if let Some(broker) = self.this.upgrade() {
            propose_isr(broker, proposal);
        }
    }
}

/// Writes an ISR change through the store (fenced by the partition epoch), then tells the
/// leader the outcome, as `Shard::propose_isr` does.
fn propose_isr(broker: Rc<Broker>, proposal: IsrProposal) {
    tokio::task::spawn_local(async move {
        let world = broker.world.clone();
        let Some(epoch) = (match &*broker.role.borrow() {
            Role::Leader(leader) => Some(leader.epoch()),
            _ => None,
        }) else {
            return;
        };
        world.clock.sleep(world.random_ms(1..=20)).await;
        let stored = {
            let mut store = world.state.borrow_mut();
            let stored = world.reachable(broker.id)
                && store.leader == broker.id
                && store.leader_epoch == epoch
                && store.partition_epoch == proposal.partition_epoch;
            if stored {
                store.isr = proposal.isr.clone();
                store.partition_epoch += 1;
            }
            stored.then(|| store.clone())
        };
        if let Some(state) = &stored {
            world.trace(|| format!("{} stored ISR {:?}", broker.id, state.isr));
        }
        broker.with_leader_at(TOPIC, 0, epoch, |leader| match &stored {
            Some(state) => leader.handle_isr_committed(&proposal, state.partition_epoch),
            None => leader.handle_isr_refused(&proposal),
        });
        if let Some(state) = stored {
            let mut known = broker.known.borrow_mut();
            if known
                .as_ref()
                .is_some_and(|known| known.partition_epoch < state.partition_epoch)
            {
                *known = Some(state);
            }
            drop(known);
            world.publish();
        }
    });
}

/// An `acks=all` produce of one record, as the shard's produce path does it.
async fn produce(broker: Rc<Broker>, value: u64) {
    let world = broker.world.clone();
    let epoch = match &*broker.role.borrow() {
        Role::Leader(leader) => {
            if leader.check_acks_all().is_err() {
                world.counts.borrow_mut().refused += 1;
                return;
            }
            leader.epoch()
        }
        _ => return,
    };
    world.counts.borrow_mut().produced += 1;
    let mut builder = BatchBuilder::default();
    builder.push(world.clock.wall_ms(), None, &value.to_be_bytes());
    let batch = BytesMut::from(&builder.finish()[..]);
    let Ok(info) = broker.log.append(batch, epoch).await else {
        return;
    };
    let at_us = world.clock.monotonic_us();
    let waiting = broker.with_leader_at(TOPIC, 0, epoch, |leader| {
        leader.handle_appended(leader.log_end().max(info.last_offset + 1));
        leader.record_append_time(info.last_offset + 1, at_us);
        leader.wait_for_commit(info.last_offset, (info.last_offset, value));
    });
    if waiting.is_none() {
        world.counts.borrow_mut().refused += 1;
    }
}

/// The shard's replication clock: lagging followers leave the ISR, high watermarks are
/// checkpointed.
async fn ticks(broker: Rc<Broker>) {
    let world = broker.world.clone();
    let mut checkpointed_at = world.clock.now();
    loop {
        world.clock.sleep(TICK).await;
        let proposal = match &mut *broker.role.borrow_mut() {
            Role::Leader(leader) => leader.handle_tick(world.clock.monotonic_ms()),
            _ => None,
        };
        if let Some(proposal) = proposal {
            propose_isr(broker.clone(), proposal);
        }
        let high_watermark = broker.high_watermark();
        if high_watermark != broker.high_watermark_checkpointed.get()
            && world.clock.now().duration_since(checkpointed_at) >= CHECKPOINT_EVERY
        {
            broker.log.checkpoint_high_watermark(high_watermark);
            broker.high_watermark_checkpointed.set(high_watermark);
            checkpointed_at = world.clock.now();
        }
    }
}

/// Starts a life of broker `id`: its log recovered from its disk, its tasks in a set of their
/// own that a crash drops whole.
async fn start(world: &Rc<World>, id: i32) {
    let (storage, life) = {
        let mut slots = world.slots.borrow_mut();
        let slot = slots.get_mut(&id).expect("a slot per broker");
        if slot.running.is_some() || slot.starting {
            return;
        }
        slot.starting = true;
        slot.life += 1;
        (slot.storage.clone(), slot.life)
    };
    let (log, report) = PartitionLog::open(storage, dir(id), log_config(), world.clock.wall_ms())
        .await
        .unwrap_or_else(|error| panic!("broker {id} cannot recover its log: {error}"));
    world.counts.borrow_mut().recovered_bytes_truncated += report.truncated_bytes;
    let tasks = LocalSet::new();
    let (inbox, receiver) = mpsc::unbounded_channel();
    let log = tasks
        .run_until(async { writer::spawn(log, world.clock) })
        .await;
    let broker = Rc::new_cyclic(|this| Broker {
        this: this.clone(),
        id,
        life,
        world: world.clone(),
        log,
        inbox,
        known: RefCell::new(None),
        role: RefCell::new(Role::Idle),
        fresh: Cell::new(true),
        high_watermark_checkpointed: Cell::new(0),
    });
    tasks.spawn_local(run_broker(broker.clone(), receiver));
    let task = tokio::task::spawn_local(tasks);
    if let Some(slot) = world.slots.borrow_mut().get_mut(&id) {
        slot.starting = false;
        slot.running = Some((broker.clone(), task));
    }
    world.live.borrow_mut().insert(id);
    world.trace(|| format!("{id} starts (life {life})"));
    if world.reachable(id) {
        broker.learn(world.state.borrow().clone());
    }
}

/// Power loss: every task of the broker's life stops where it is, the disk keeps what it
/// synced and a torn part of the rest. Its lease lapses a little later.
fn crash(world: &Rc<World>, id: i32) {
    let running = {
        let mut slots = world.slots.borrow_mut();
        let slot = slots.get_mut(&id).expect("a slot");
        let running = slot.running.take();
        if running.is_some() {
            slot.storage.crash();
        }
        running
    };
    let Some((broker, task)) = running else {
        return;
    };
    task.abort();
    broker.stop_role();
    world.counts.borrow_mut().crashes += 1;
    world.trace(|| format!("{id} crashes"));
    let life = broker.life;
    drop(broker);
    let world = world.clone();
    tokio::task::spawn_local(async move {
        world.clock.sleep(world.random_ms(20..=80)).await;
        let same_life = world.slots.borrow()[&id].life == life;
        if same_life && world.slots.borrow()[&id].running.is_none() {
            world.live.borrow_mut().remove(&id);
            world.trace(|| format!("{id}'s lease lapsed"));
            world.controller.notify_one();
        }
        world.clock.sleep(world.random_ms(50..=400)).await;
        // As the broker does, it registers again only once its old registration lapsed.
        while world.live.borrow().contains(&id) {
            world.clock.sleep(Duration::from_millis(20)).await;
        }
        if world.slots.borrow()[&id].running.is_none() {
            start(&world, id).await;
            world.controller.notify_one();
        }
    });
}

/// A network partition around one broker: it neither reaches nor is reached, the store
/// included. Its lease lapses; it heals later.
fn cut_off(world: &Rc<World>, id: i32) {
    let cut = {
        let mut slots = world.slots.borrow_mut();
        let slot = slots.get_mut(&id).expect("a slot");
        if slot.cut_off || slot.running.is_none() {
            return;
        }
        slot.cut_off = true;
        slot.cut += 1;
        slot.cut
    };
    world.counts.borrow_mut().cuts += 1;
    world.trace(|| format!("{id} is cut off"));
    let world = world.clone();
    tokio::task::spawn_local(async move {
        world.clock.sleep(world.random_ms(20..=80)).await;
        if world.slots.borrow()[&id].cut == cut && world.slots.borrow()[&id].cut_off {
            world.live.borrow_mut().remove(&id);
            world.trace(|| format!("{id}'s lease lapsed"));
            world.controller.notify_one();
        }
        world.clock.sleep(world.random_ms(100..=600)).await;
        heal(&world, id, cut);
    });
}

fn heal(world: &Rc<World>, id: i32, cut: u64) {
    let running = {
        let mut slots = world.slots.borrow_mut();
        let slot = slots.get_mut(&id).expect("a slot");
        if slot.cut != cut || !slot.cut_off {
            return;
        }
        slot.cut_off = false;
        slot.running.is_some()
    };
    if running {
        world.live.borrow_mut().insert(id);
    }
    world.trace(|| format!("{id} reconnects"));
    world.controller.notify_one();
    if let Some(broker) = world.broker(id) {
        broker.learn(world.state.borrow().clone());
    }
}

/// The controller: fails leadership over when a broker's lease lapses (woken by changes,
/// and re-reading periodically as the real one's watch is backed up).
async fn controller(world: Rc<World>) {
    loop {
        let _ = world
            .clock
            .timeout(Duration::from_millis(100), world.controller.notified())
            .await;
        let change = {
            let state = world.state.borrow();
            placement::failover(std::slice::from_ref(&*state), &world.live.borrow(), false).pop()
        };
        if let Some(change) = change {
            world.trace(|| format!("controller: {change:?}"));
            *world.state.borrow_mut() = change;
        }
        world.publish();
    }
}

/// Faults while they are on, and produces: an `acks=all` client sending to whoever it
/// believes leads (sometimes a stale leader).
async fn chaos_and_clients(world: Rc<World>, until_ms: i64) {
    while world.clock.monotonic_ms() < until_ms {
        world.clock.sleep(Duration::from_millis(1)).await;
        if world.faults.get() {
            if world.chance(0.0015) {
                let id = IDS[world.rng.borrow_mut().random_range(0..IDS.len())];
                crash(&world, id);
            }
            if world.chance(0.0007) {
                let id = IDS[world.rng.borrow_mut().random_range(0..IDS.len())];
                cut_off(&world, id);
            }
        }
        if world.chance(0.3) {
            let target = if world.chance(0.8) {
                world.state.borrow().leader
            } else {
                IDS[world.rng.borrow_mut().random_range(0..IDS.len())]
            };
            if target != NO_LEADER
                && world.reachable(target)
                && let Some(broker) = world.broker(target)
            {
                let value = world.next_value.get();
                world.next_value.set(value + 1);
                let _ = broker.inbox.send(Inbound::Produce(value));
            }
        }
    }
}

/// The values of the records of `bytes` (whole batches), from offset `from`.
fn values(bytes: Bytes, from: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for batch in split_batches(bytes) {
        let batch = batch.expect("the log serves whole, valid batches");
        for record in batch.records() {
            if record.offset >= from {
                let value = u64::from_be_bytes(record.value.try_into().expect("8-byte values"));
                out.push((record.offset, value));
            }
        }
    }
    out
}

/// Reads `log` in `[from, to)` as a consumer would; `None` if the broker died meanwhile.
async fn read_range(log: &LogHandle, from: u64, to: u64) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let bytes = log.read(at, 64 << 10, to).await.ok()?;
        let read = values(bytes, at);
        let Some(&(last, _)) = read.last() else {
            break;
        };
        out.extend(read.into_iter().filter(|(offset, _)| *offset < to));
        at = last + 1;
    }
    Some(out)
}

/// One pass of the checks over every running broker.
async fn check(world: &Rc<World>) {
    for id in IDS {
        let Some(broker) = world.broker(id) else {
            continue;
        };
        let key = (id, broker.life);
        let high_watermark = broker.high_watermark();
        {
            let mut history = world.history.borrow_mut();
            let seen = history.high_watermarks.entry(key).or_insert(0);
            assert!(
                high_watermark >= *seen,
                "broker {id} (life {}) went back from high watermark {seen} to {high_watermark}",
                broker.life
            );
            *seen = high_watermark;
        }
        let from = world.history.borrow().read.get(&key).copied().unwrap_or(0);
        if from >= high_watermark {
            continue;
        }
        let Some(read) = read_range(&broker.log, from, high_watermark).await else {
            continue;
        };
        let mut history = world.history.borrow_mut();
        let mut expected = from;
        for (offset, value) in read {
            assert_eq!(
                offset, expected,
                "broker {id} shows a gap below {high_watermark}"
            );
            expected += 1;
            match history.committed.get(offset as usize) {
                Some(&seen) => assert_eq!(
                    seen, value,
                    "broker {id} shows {value} at {offset}, where {seen} was shown before"
                ),
                None => {
                    assert_eq!(offset as usize, history.committed.len());
                    history.committed.push(value);
                }
            }
            if let Some(&acknowledged) = history.acknowledged.get(&offset) {
                assert_eq!(
                    acknowledged, value,
                    "broker {id} shows {value} at {offset}, acknowledged as {acknowledged}"
                );
            }
        }
        history.read.insert(key, expected);
    }
    // The leader the store names holds every committed record once it leads and has settled.
    let state = world.state.borrow().clone();
    if state.leader == NO_LEADER {
        return;
    }
    let Some(broker) = world.broker(state.leader) else {
        return;
    };
    let (epoch, settled, high_watermark) = match &*broker.role.borrow() {
        Role::Leader(leader) if leader.epoch() == state.leader_epoch => (
            leader.epoch(),
            leader.high_watermark_settled(),
            leader.high_watermark(),
        ),
        _ => return,
    };
    let committed = world.history.borrow().committed.len() as u64;
    if settled {
        assert!(
            high_watermark >= committed,
            "leader {} (epoch {epoch}) settled at {high_watermark}, behind {committed} committed",
            broker.id
        );
    }
    let term = (broker.id, broker.life, epoch);
    let from = match world.history.borrow().leader_verified {
        Some((verified, upto)) if verified == term => upto,
        _ => 0,
    };
    if from >= committed {
        return;
    }
    let Some(held) = read_range(&broker.log, from, committed).await else {
        return;
    };
    let history = world.history.borrow();
    for offset in from..committed {
        let value = held
            .iter()
            .find(|(at, _)| *at == offset)
            .map(|(_, value)| *value);
        assert_eq!(
            value,
            Some(history.committed[offset as usize]),
            "leader {} (epoch {epoch}) lost committed record at {offset}",
            broker.id
        );
    }
    drop(history);
    world.history.borrow_mut().leader_verified = Some((term, committed));
}

/// Whether the cluster converged: one leader at the store's epoch with every replica in the
/// ISR, everything committed, every log the same.
async fn converged(world: &Rc<World>) -> Option<Vec<(u64, u64)>> {
    let state = world.state.borrow().clone();
    if state.isr != IDS.to_vec() || state.leader == NO_LEADER {
        return None;
    }
    let leader = world.broker(state.leader)?;
    let (high_watermark, log_end) = match &*leader.role.borrow() {
        Role::Leader(l) if l.epoch() == state.leader_epoch => (l.high_watermark(), l.log_end()),
        _ => return None,
    };
    if high_watermark != log_end {
        return None;
    }
    let expected = read_range(&leader.log, 0, u64::MAX).await?;
    if expected.len() as u64 != log_end {
        return None;
    }
    for id in IDS {
        let broker = world.broker(id)?;
        if broker.high_watermark() != log_end
            || read_range(&broker.log, 0, u64::MAX).await? != expected
        {
            return None;
        }
    }
    Some(expected)
}

async fn simulate(world: Rc<World>) {
    // A paused runtime's timers fire on a grid of whole milliseconds from when it was built;
    // its clock starts a little off it. The first sleep lands on the grid, so every later time
    // is a whole number of milliseconds from the start, the same on every run.
    world.clock.sleep(Duration::from_millis(1)).await;
    START.with(|start| start.set(world.clock.monotonic_ms()));
    for id in IDS {
        start(&world, id).await;
    }
    tokio::task::spawn_local(controller(world.clone()));
    let until = world.clock.monotonic_ms() + RUN_MS as i64;
    let chaos = tokio::task::spawn_local(chaos_and_clients(world.clone(), until));
    while !chaos.is_finished() {
        world.clock.sleep(Duration::from_millis(20)).await;
        check(&world).await;
    }
    // Heal everything and let the cluster settle.
    world.faults.set(false);
    for id in IDS {
        let cut = world.slots.borrow()[&id].cut;
        heal(&world, id, cut);
        if world.slots.borrow()[&id].running.is_none() {
            while world.live.borrow().contains(&id) {
                world.clock.sleep(Duration::from_millis(20)).await;
            }
            if world.slots.borrow()[&id].running.is_none() {
                start(&world, id).await;
            }
        }
    }
    world.controller.notify_one();
    let deadline = world.clock.monotonic_ms() + SETTLE_MS as i64;
    let settled = loop {
        world.clock.sleep(Duration::from_millis(50)).await;
        check(&world).await;
        if let Some(log) = converged(&world).await {
            break log;
        }
        assert!(
            world.clock.monotonic_ms() < deadline,
            "the cluster did not converge within {SETTLE_MS} ms of healing: store {:?}",
            world.state.borrow()
        );
    };
    check(&world).await;
    let history = world.history.borrow();
    for (&offset, &value) in &history.acknowledged {
        assert_eq!(
            settled.get(offset as usize),
            Some(&(offset, value)),
            "acknowledged record {value} at {offset} is not in the converged log"
        );
    }
}

struct Outcome {
    counts: Counts,
    /// Every replica's final log, the same on each.
    log: Vec<u64>,
}

fn run(seed: u64, trace: bool) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let world = Rc::new(World {
        rng: RefCell::new(StdRng::seed_from_u64(seed)),
        trace,
        clock: Clock::VIRTUAL,
        state: RefCell::new(PartitionState {
            partition: 0,
            replicas: IDS.to_vec(),
            leader: 1,
            leader_epoch: 1,
            isr: IDS.to_vec(),
            partition_epoch: 1,
            target_replicas: None,
            reassigning_from: None,
        }),
        live: RefCell::new(BTreeSet::new()),
        slots: RefCell::new(
            IDS.iter()
                .map(|&id| {
                    let storage = SimStorage::new(seed.wrapping_mul(31).wrapping_add(id as u64));
                    // A sync takes a few milliseconds: a crash finds writes unsynced.
                    storage.set_sync_latency(200..=4_000);
                    let slot = Slot {
                        storage,
                        life: 0,
                        cut_off: false,
                        cut: 0,
                        starting: false,
                        running: None,
                    };
                    (id, slot)
                })
                .collect(),
        ),
        faults: Cell::new(true),
        history: RefCell::new(History::default()),
        counts: RefCell::new(Counts::default()),
        controller: Notify::new(),
        next_value: Cell::new(1),
    });
    let tasks = LocalSet::new();
    tasks.block_on(&runtime, simulate(world.clone()));
    let log = world.history.borrow().committed.clone();
    let counts = world.counts.borrow().clone();
    // The brokers hold the world: drop them (their tasks first) so nothing outlives the run.
    for slot in world.slots.borrow_mut().values_mut() {
        if let Some((_, task)) = slot.running.take() {
            task.abort();
        }
    }
    drop(tasks);
    drop(runtime);
    Outcome { counts, log }
}

/// Runs a seed on a thread of its own: a panic, or a run that stops moving (virtual time
/// moves only when every task waits, so a task that never waits holds the run at one
/// instant), is that seed's failure.
fn run_watched(seed: u64) -> Result<Outcome, Box<dyn std::any::Any + Send>> {
    const REAL_TIME_MAX: Duration = Duration::from_secs(120);
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(|| run(seed, false));
        let _ = done.send(outcome.map(|outcome| (outcome.counts, outcome.log)));
    });
    match outcome.recv_timeout(REAL_TIME_MAX) {
        Ok(outcome) => outcome.map(|(counts, log)| Outcome { counts, log }),
        Err(_) => Err(Box::new(format!(
            "seed {seed} did not finish within {REAL_TIME_MAX:?}: a task never waits"
        ))),
    }
}

fn seed_from_env() -> Option<u64> {
    let seed = std::env::var("STRATA_SIM_SEED").ok()?;
    Some(seed.parse().expect("STRATA_SIM_SEED is a number"))
}

#[test]
fn replication_survives_crashes_partitions_and_a_lossy_network() {
    if let Some(seed) = seed_from_env() {
        let outcome = run(seed, std::env::var_os("STRATA_SIM_TRACE").is_some());
        eprintln!("seed {seed}: {:?}", outcome.counts);
        return;
    }
    let seeds: u64 = std::env::var("STRATA_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let base: u64 = rand::rng().random();
    let mut total = Counts::default();
    for index in 0..seeds {
        let seed = base.wrapping_add(index);
        let counts = match run_watched(seed) {
            Ok(outcome) => outcome.counts,
            Err(panic) => {
                eprintln!(
                    "replication simulation failed with seed {seed}; replay it with \
                     STRATA_SIM_SEED={seed} STRATA_SIM_TRACE=1 cargo nextest run -p strata-node \
                     --test replication_sim --no-capture"
                );
                std::panic::resume_unwind(panic);
            }
        };
        total.produced += counts.produced;
        total.acknowledged += counts.acknowledged;
        total.refused += counts.refused;
        total.crashes += counts.crashes;
        total.cuts += counts.cuts;
        total.elections += counts.elections;
        total.truncations += counts.truncations;
        total.recovered_bytes_truncated += counts.recovered_bytes_truncated;
    }
    eprintln!("{seeds} seeds from {base}: {total:?}");
    assert!(
        total.acknowledged > seeds * 200,
        "the simulation makes progress: {total:?}"
    );
    assert!(total.crashes > seeds, "crashes are exercised: {total:?}");
    assert!(
        total.recovered_bytes_truncated > 0,
        "recovery meets torn tails: {total:?}"
    );
}

/// A seed is a replay: the same seed gives the same run, event for event (the same counts and
/// the same log), so a failing seed reproduces.
#[test]
fn a_seed_replays_exactly() {
    let seed = seed_from_env().unwrap_or(7);
    let trace = std::env::var_os("STRATA_SIM_TRACE").is_some();
    let first = run(seed, trace);
    if trace {
        eprintln!("---- again");
    }
    let second = run(seed, trace);
    assert_eq!(first.counts, second.counts);
    assert_eq!(first.log, second.log);
}
