//! Deterministic simulation of one partition replicated on three brokers.
//!
//! The replication core (`strata_node::replication`: leader state, divergence, epochs) and the
//! controller's pure failover (`strata_coordinator::placement::failover`) run unchanged on
//! virtual time. Around them the simulator models what the real adapters do: logs that lose
//! unsynced records on a crash, a network that drops, delays and reorders messages, a linearizable
//! store with fenced ISR writes (etcd), a controller that fails leadership over when a broker's
//! lease lapses, and network partitions that cut a broker off from everyone (so a stale leader
//! keeps believing it leads).
//!
//! After every step it checks:
//! - records below any replica's high watermark form one history (the "committed" map never
//!   disagrees with itself), so no consumer ever sees a record that later vanishes;
//! - the leader the store names, once it acts as leader, holds every committed record, so no
//!   acknowledged record is lost;
//! - a leader's high watermark never goes backwards, and once settled (at its epoch's start)
//!   it is past every record ever committed, so ends told to readers never go back across
//!   leaders;
//! - a follower never truncates below its high watermark.
//!
//! At the end it heals everything and checks that the replicas converge: all in the ISR, logs
//! identical, every acknowledged record present everywhere.
//!
//! `STRATA_SIM_SEEDS=N` runs N seeds (default 2000); `STRATA_SIM_SEED=S` runs one, printing
//! its trace with `STRATA_SIM_TRACE=1`. A failure prints the seed.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_coordinator::PartitionState;
use strata_coordinator::placement::{self, NO_LEADER};
use strata_node::replication::{
    self, AckError, Divergence, EpochCache, IsrProposal, Leader, LeaderConfig, ReplicaFetchError,
};

const IDS: [i32; 3] = [1, 2, 3];
const STEPS_MS: i64 = 3_000;
const CONFIG: LeaderConfig = LeaderConfig {
    lag_time_max_ms: 300,
    min_insync_replicas: 2,
};
const FETCH_MAX_ENTRIES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    epoch: u32,
    value: u64,
}

#[derive(Debug, Clone)]
enum Message {
    Fetch {
        from: i32,
        epoch: u32,
        fetch_offset: u64,
        last_epoch: Option<u32>,
        /// What the follower has synced: its progress (at or below `fetch_offset`).
        log_end: u64,
        sequence: u64,
    },
    FetchAnswer {
        epoch: u32,
        sequence: u64,
        answer: Answer,
    },
}

#[derive(Debug, Clone)]
enum Answer {
    Records {
        first_offset: u64,
        entries: Vec<Entry>,
        high_watermark: u64,
        leader_log_end: u64,
    },
    Diverging(Divergence),
    Refused,
}

#[derive(Debug)]
enum Event {
    Deliver {
        to: i32,
        from: i32,
        message: Message,
    },
    FlushDone {
        replica: i32,
        life: u64,
        upto: usize,
    },
    FetchTimeout {
        replica: i32,
        life: u64,
        sequence: u64,
    },
    IsrWritten {
        replica: i32,
        life: u64,
        epoch: u32,
        proposal: IsrProposal,
    },
    Restart {
        replica: i32,
    },
    /// A restarted broker that the store still names as leader asks for a new epoch.
    Reelect {
        replica: i32,
        partition_epoch: u64,
    },
    Heal {
        replica: i32,
    },
    LeaseLapsed {
        replica: i32,
        life: u64,
        cut: u64,
    },
    Controller,
}

struct Scheduled {
    at: i64,
    sequence: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // A min-heap on (time, sequence); the sequence is random, so ties reorder.
        (other.at, other.sequence).cmp(&(self.at, self.sequence))
    }
}

enum Role {
    Down,
    Idle,
    Leader(Box<Leader<u64>>),
    Follower { leader: i32, waiting: Option<u64> },
}

struct Replica {
    id: i32,
    /// Bumped by every crash: events of an earlier life are ignored.
    life: u64,
    /// Bumped by every network cut: lease lapses of an earlier cut are ignored.
    cut: u64,
    cut_off: bool,
    log: Vec<Entry>,
    durable: usize,
    flushing: bool,
    epochs: EpochCache,
    high_watermark: u64,
    high_watermark_checkpoint: u64,
    /// Started and not yet told about a leadership of this life.
    fresh: bool,
    /// Entries below this were checked against the committed history.
    checked: usize,
    /// The partition state this replica last learned (its epoch fences stale updates).
    known: Option<PartitionState>,
    role: Role,
}

impl Replica {
    fn log_end(&self) -> u64 {
        self.log.len() as u64
    }

    fn append(&mut self, first_offset: u64, entries: &[Entry]) {
        assert_eq!(
            first_offset,
            self.log_end(),
            "replica {} appends out of place",
            self.id
        );
        for entry in entries {
            self.epochs.assign(entry.epoch, self.log_end());
            self.log.push(*entry);
        }
    }

    fn truncate(&mut self, offset: u64) {
        assert!(
            offset >= self.high_watermark,
            "replica {} truncates to {offset}, below its high watermark {}",
            self.id,
            self.high_watermark
        );
        self.log.truncate(offset as usize);
        self.durable = self.durable.min(self.log.len());
        self.epochs.truncate_from(offset);
    }
}

struct Sim {
    rng: StdRng,
    now: i64,
    events: BinaryHeap<Scheduled>,
    replicas: Vec<Replica>,
    /// The store (etcd): linearizable, fenced writes.
    state: PartitionState,
    live: BTreeSet<i32>,
    /// Every record ever below some high watermark, by offset.
    committed: Vec<Entry>,
    /// How far the current leadership term's log was checked against `committed`.
    leader_verified: Option<((i32, u64, u32), usize)>,
    acknowledged: BTreeMap<u64, u64>,
    acks_to_check: Vec<(u64, u64)>,
    /// Each leadership term's last high watermark: (replica, life, epoch) → offset.
    leader_high_watermarks: BTreeMap<(i32, u64, u32), u64>,
    next_value: u64,
    next_sequence: u64,
    faults: bool,
    trace: bool,
    counts: Counts,
}

#[derive(Debug, Default)]
struct Counts {
    produced: u64,
    acknowledged: u64,
    refused: u64,
    crashes: u64,
    cuts: u64,
    elections: u64,
    truncations: u64,
}

impl Sim {
    fn new(seed: u64, trace: bool) -> Sim {
        let replicas = IDS
            .iter()
            .map(|&id| Replica {
                id,
                life: 0,
                cut: 0,
                cut_off: false,
                log: Vec::new(),
                durable: 0,
                flushing: false,
                epochs: EpochCache::default(),
                high_watermark: 0,
                high_watermark_checkpoint: 0,
                checked: 0,
                fresh: true,
                known: None,
                role: Role::Idle,
            })
            .collect();
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            events: BinaryHeap::new(),
            replicas,
            state: PartitionState {
                partition: 0,
                replicas: IDS.to_vec(),
                leader: 1,
                leader_epoch: 1,
                isr: IDS.to_vec(),
                partition_epoch: 1,
                target_replicas: None,
                reassigning_from: None,
            },
            live: IDS.iter().copied().collect(),
            committed: Vec::new(),
            leader_verified: None,
            acknowledged: BTreeMap::new(),
            acks_to_check: Vec::new(),
            leader_high_watermarks: BTreeMap::new(),
            next_value: 1,
            next_sequence: 0,
            faults: true,
            trace,
            counts: Counts::default(),
        };
        for id in IDS {
            sim.publish_to(id);
        }
        sim
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("{:>5} {}", self.now, what());
        }
    }

    fn replica(&mut self, id: i32) -> &mut Replica {
        &mut self.replicas[(id - 1) as usize]
    }

    fn schedule(&mut self, delay_ms: i64, event: Event) {
        let sequence = self.rng.random();
        self.events.push(Scheduled {
            at: self.now + delay_ms,
            sequence,
            event,
        });
    }

    /// A network send: dropped when either end is cut off or by chance, else delayed.
    fn send(&mut self, from: i32, to: i32, message: Message) {
        if self.replica(from).cut_off || self.replica(to).cut_off {
            return;
        }
        if self.faults && self.rng.random_bool(0.05) {
            return;
        }
        let delay = self.rng.random_range(1..=if self.faults { 12 } else { 3 });
        self.schedule(delay, Event::Deliver { to, from, message });
    }

    /// The watch: a replica that can reach the store learns its state.
    fn publish_to(&mut self, id: i32) {
        if self.replica(id).cut_off || matches!(self.replica(id).role, Role::Down) {
            return;
        }
        let state = self.state.clone();
        self.learn(id, state);
    }

    fn publish(&mut self) {
        for id in IDS {
            self.publish_to(id);
        }
    }

    fn learn(&mut self, id: i32, state: PartitionState) {
        let now = self.now;
        let replica = self.replica(id);
        if let Some(known) = &replica.known
            && known.partition_epoch >= state.partition_epoch
        {
            return;
        }
        if replica.fresh && state.leader == id {
            // Just started, and named leader at an epoch of an earlier life: its log may have
            // lost unsynced records that followers hold under that same epoch. It must not lead
            // at that epoch; it asks for the next one (as the real broker does at startup).
            let partition_epoch = state.partition_epoch;
            self.schedule(
                2,
                Event::Reelect {
                    replica: id,
                    partition_epoch,
                },
            );
            return;
        }
        replica.fresh = false;
        let same_leadership = replica
            .known
            .as_ref()
            .is_some_and(|k| k.leader_epoch == state.leader_epoch && k.leader == state.leader);
        replica.known = Some(state.clone());
        if same_leadership {
            if let Role::Leader(leader) = &mut replica.role {
                leader.handle_state(
                    state.replicas.clone(),
                    state.isr.clone(),
                    state.partition_epoch,
                    now,
                );
            }
            self.collect_acks(id);
            return;
        }
        if let Role::Leader(leader) = &mut replica.role {
            leader.resign();
        }
        self.collect_acks(id);
        let replica = self.replica(id);
        if state.leader == id {
            let leader = Leader::new(
                id,
                state.leader_epoch,
                state.partition_epoch,
                state.replicas.clone(),
                state.isr.clone(),
                replica.durable as u64,
                replica.high_watermark,
                CONFIG,
                now,
            );
            replica.high_watermark = leader.high_watermark();
            replica.role = Role::Leader(Box::new(leader));
            self.counts.elections += 1;
            self.log(|| format!("{id} leads epoch {}", state.leader_epoch));
            self.collect_acks(id);
        } else if state.leader == NO_LEADER {
            replica.role = Role::Idle;
        } else {
            replica.role = Role::Follower {
                leader: state.leader,
                waiting: None,
            };
            self.fetch(id);
        }
    }

    fn fetch(&mut self, id: i32) {
        self.next_sequence += 1;
        let sequence = self.next_sequence;
        let replica = self.replica(id);
        let Role::Follower { leader, waiting } = &mut replica.role else {
            return;
        };
        let leader = *leader;
        *waiting = Some(sequence);
        let message = Message::Fetch {
            from: id,
            epoch: replica
                .known
                .as_ref()
                .expect("a follower knows")
                .leader_epoch,
            fetch_offset: replica.log_end(),
            last_epoch: replica.epochs.latest_epoch(),
            log_end: replica.durable as u64,
            sequence,
        };
        let life = replica.life;
        self.send(id, leader, message);
        self.schedule(
            60,
            Event::FetchTimeout {
                replica: id,
                life,
                sequence,
            },
        );
    }

    /// Starts a sync of everything written, if none runs.
    fn flush(&mut self, id: i32) {
        let delay = self.rng.random_range(1..=8);
        let replica = self.replica(id);
        if replica.flushing || replica.durable == replica.log.len() {
            return;
        }
        replica.flushing = true;
        let event = Event::FlushDone {
            replica: id,
            life: replica.life,
            upto: replica.log.len(),
        };
        self.schedule(delay, event);
    }

    fn collect_acks(&mut self, id: i32) {
        let Role::Leader(leader) = &mut self.replica(id).role else {
            return;
        };
        let answered: Vec<_> = leader.poll_acks().collect();
        for (value, result) in answered {
            match result {
                Ok(()) => {
                    let offset = self
                        .replica(id)
                        .log
                        .iter()
                        .position(|e| e.value == value)
                        .expect("an acknowledged record is in its leader's log")
                        as u64;
                    self.acknowledged.insert(offset, value);
                    self.acks_to_check.push((offset, value));
                    self.counts.acknowledged += 1;
                }
                Err(AckError::NotLeader | AckError::NotEnoughReplicasAfterAppend { .. }) => {
                    self.counts.refused += 1;
                }
                Err(AckError::NotEnoughReplicas { .. }) => unreachable!("checked before append"),
            }
        }
    }

    fn produce(&mut self) {
        // The client sends to whoever it believes leads: sometimes a stale leader.
        let target = if self.rng.random_bool(0.8) {
            self.state.leader
        } else {
            IDS[self.rng.random_range(0..IDS.len())]
        };
        if target == NO_LEADER {
            return;
        }
        let value = self.next_value;
        let replica = self.replica(target);
        let Role::Leader(leader) = &mut replica.role else {
            return;
        };
        if leader.check_acks_all().is_err() {
            self.counts.refused += 1;
            return;
        }
        let epoch = leader.epoch();
        let offset = replica.log_end();
        replica.append(offset, &[Entry { epoch, value }]);
        let Role::Leader(leader) = &mut replica.role else {
            unreachable!()
        };
        leader.wait_for_commit(offset, value);
        self.next_value += 1;
        self.counts.produced += 1;
        self.flush(target);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { to, from, message } => {
                if self.replica(to).cut_off || matches!(self.replica(to).role, Role::Down) {
                    return;
                }
                self.deliver(to, from, message);
            }
            Event::FlushDone {
                replica: id,
                life,
                upto,
            } => {
                let replica = self.replica(id);
                if replica.life != life {
                    return;
                }
                replica.flushing = false;
                // A truncation may have cut below what this sync covered.
                replica.durable = replica.durable.max(upto.min(replica.log.len()));
                let durable = replica.durable as u64;
                match &mut replica.role {
                    Role::Leader(leader) => {
                        if durable > leader.log_end() {
                            leader.handle_appended(durable);
                        }
                        replica.high_watermark = leader.high_watermark();
                        self.collect_acks(id);
                    }
                    Role::Follower { waiting: None, .. } => self.fetch(id),
                    _ => {}
                }
                self.flush(id);
            }
            Event::FetchTimeout {
                replica: id,
                life,
                sequence,
            } => {
                let replica = self.replica(id);
                if replica.life == life
                    && let Role::Follower { waiting, .. } = &replica.role
                    && *waiting == Some(sequence)
                {
                    self.fetch(id);
                }
            }
            Event::IsrWritten {
                replica: id,
                life,
                epoch,
                proposal,
            } => {
                let stored = !self.replica(id).cut_off
                    && self.state.leader == id
                    && self.state.leader_epoch == epoch
                    && self.state.partition_epoch == proposal.partition_epoch;
                if stored {
                    self.state.isr = proposal.isr.clone();
                    self.state.partition_epoch += 1;
                    self.log(|| format!("{id} stored ISR {:?}", proposal.isr));
                }
                let partition_epoch = self.state.partition_epoch;
                let state_now = self.state.clone();
                let replica = self.replica(id);
                if replica.life == life
                    && let Role::Leader(leader) = &mut replica.role
                    && leader.epoch() == epoch
                {
                    if stored {
                        leader.handle_isr_committed(&proposal, partition_epoch);
                        replica.known = Some(state_now.clone());
                    } else {
                        leader.handle_isr_refused(&proposal);
                    }
                    let replica = self.replica(id);
                    if let Role::Leader(leader) = &replica.role {
                        replica.high_watermark = leader.high_watermark();
                    }
                    self.collect_acks(id);
                }
                if stored {
                    self.publish();
                }
            }
            Event::Restart { replica: id } => {
                if self.live.contains(&id) {
                    // As the real broker does, wait for the old registration to lapse.
                    self.schedule(20, Event::Restart { replica: id });
                    return;
                }
                let replica = self.replica(id);
                if !matches!(replica.role, Role::Down) {
                    return;
                }
                replica.role = Role::Idle;
                replica.known = None;
                replica.fresh = true;
                self.live.insert(id);
                self.log(|| format!("{id} restarts"));
                self.schedule(5, Event::Controller);
                self.publish_to(id);
            }
            Event::Reelect {
                replica: id,
                partition_epoch,
            } => {
                self.replica(id).fresh = false;
                if !self.replica(id).cut_off
                    && self.state.leader == id
                    && self.state.partition_epoch == partition_epoch
                {
                    self.state.leader_epoch += 1;
                    self.state.partition_epoch += 1;
                    self.log(|| format!("{id} takes epoch {}", self.state.leader_epoch));
                }
                self.publish_to(id);
            }
            Event::Heal { replica: id } => {
                let replica = self.replica(id);
                replica.cut_off = false;
                if !matches!(replica.role, Role::Down) {
                    self.live.insert(id);
                }
                self.log(|| format!("{id} reconnects"));
                self.schedule(5, Event::Controller);
                self.publish_to(id);
                if let Role::Follower { waiting: None, .. } = self.replica(id).role {
                    self.fetch(id);
                }
            }
            Event::LeaseLapsed {
                replica: id,
                life,
                cut,
            } => {
                let replica = self.replica(id);
                let lapsed = replica.cut_off && replica.cut == cut
                    || matches!(replica.role, Role::Down) && replica.life == life;
                if lapsed {
                    self.live.remove(&id);
                    self.log(|| format!("{id}'s lease lapsed"));
                    self.schedule(1, Event::Controller);
                }
            }
            Event::Controller => {
                if let Some(change) =
                    placement::failover(std::slice::from_ref(&self.state), &self.live, false).pop()
                {
                    self.log(|| format!("controller: {change:?}"));
                    self.state = change;
                    self.publish();
                }
            }
        }
    }

    fn deliver(&mut self, to: i32, from: i32, message: Message) {
        match message {
            Message::Fetch {
                from: follower,
                epoch,
                fetch_offset,
                last_epoch,
                log_end,
                sequence,
            } => {
                assert!(log_end <= fetch_offset, "progress past the fetch position");
                let now = self.now;
                let replica = self.replica(to);
                let Role::Leader(leader) = &mut replica.role else {
                    let answer = Message::FetchAnswer {
                        epoch,
                        sequence,
                        answer: Answer::Refused,
                    };
                    self.send(to, from, answer);
                    return;
                };
                let answer = match leader.validate_fetch(follower, epoch) {
                    Err(
                        ReplicaFetchError::FencedLeaderEpoch { .. }
                        | ReplicaFetchError::UnknownLeaderEpoch { .. },
                    ) => Answer::Refused,
                    Err(ReplicaFetchError::NotAReplica(_)) => unreachable!("three fixed replicas"),
                    // As the broker does: the steady state skips the check.
                    Ok(()) => match (!leader.cannot_diverge(fetch_offset, last_epoch))
                        .then(|| {
                            replication::diverging(
                                &replica.epochs,
                                replica.log.len() as u64,
                                fetch_offset,
                                last_epoch,
                            )
                        })
                        .flatten()
                    {
                        Some(divergence) => Answer::Diverging(divergence),
                        None => {
                            let progress = leader
                                .handle_fetch(now, follower, epoch, log_end)
                                .expect("validated");
                            replica.high_watermark = progress.high_watermark;
                            let start = fetch_offset as usize;
                            let end = (start + FETCH_MAX_ENTRIES).min(replica.log.len());
                            let entries = replica.log[start.min(end)..end].to_vec();
                            let leader_log_end = replica.log.len() as u64;
                            if let Some(proposal) = progress.propose_isr {
                                self.propose_isr(to, proposal);
                            }
                            self.collect_acks(to);
                            Answer::Records {
                                first_offset: fetch_offset,
                                entries,
                                high_watermark: progress.high_watermark,
                                leader_log_end,
                            }
                        }
                    },
                };
                let message = Message::FetchAnswer {
                    epoch,
                    sequence,
                    answer,
                };
                self.send(to, from, message);
            }
            Message::FetchAnswer {
                epoch,
                sequence,
                answer,
            } => {
                let replica = self.replica(to);
                let Role::Follower { leader, waiting } = &mut replica.role else {
                    return;
                };
                let current_epoch = replica.known.as_ref().map(|k| k.leader_epoch);
                if *leader != from || *waiting != Some(sequence) || current_epoch != Some(epoch) {
                    return;
                }
                *waiting = None;
                match answer {
                    Answer::Refused => {
                        // Learn the state from the store (as the real node's watch would), retry.
                        let life = replica.life;
                        self.publish_to(to);
                        self.next_sequence += 1;
                        let sequence = self.next_sequence;
                        if let Role::Follower { waiting, .. } = &mut self.replica(to).role {
                            *waiting = Some(sequence);
                        }
                        self.schedule(
                            10,
                            Event::FetchTimeout {
                                replica: to,
                                life,
                                sequence,
                            },
                        );
                    }
                    Answer::Diverging(divergence) => {
                        let cut = replication::truncation_offset(
                            &replica.epochs,
                            replica.log_end(),
                            divergence,
                        );
                        let truncated = cut < replica.log_end();
                        replica.truncate(cut);
                        self.counts.truncations += u64::from(truncated);
                        self.log(|| format!("{to} truncates to {cut} ({divergence:?})"));
                        self.fetch(to);
                    }
                    Answer::Records {
                        first_offset,
                        entries,
                        high_watermark,
                        leader_log_end,
                    } => {
                        if first_offset != replica.log_end() {
                            // An answer to a fetch from before a truncation.
                            self.fetch(to);
                            return;
                        }
                        replica.append(first_offset, &entries);
                        let visible = high_watermark.min(replica.durable as u64);
                        replica.high_watermark = replica.high_watermark.max(visible);
                        if entries.is_empty() || replica.durable == replica.log.len() {
                            let life = replica.life;
                            let sequence = self.next_sequence + 1;
                            self.next_sequence = sequence;
                            if let Role::Follower { waiting, .. } = &mut self.replica(to).role {
                                *waiting = Some(sequence);
                            }
                            // Long-poll: ask again shortly.
                            self.schedule(
                                5,
                                Event::FetchTimeout {
                                    replica: to,
                                    life,
                                    sequence,
                                },
                            );
                        } else {
                            // The next fetch goes out once these are synced (FlushDone), or
                            // at once when the leader has more (as the broker fetches ahead
                            // while it writes): it reports only what is synced.
                            let ahead = leader_log_end > replica.log_end();
                            self.flush(to);
                            if ahead && self.rng.random_bool(0.5) {
                                self.fetch(to);
                            }
                        }
                    }
                }
            }
        }
    }

    fn propose_isr(&mut self, id: i32, proposal: IsrProposal) {
        let delay = self.rng.random_range(1..=20);
        let replica = self.replica(id);
        let Role::Leader(leader) = &replica.role else {
            return;
        };
        let event = Event::IsrWritten {
            replica: id,
            life: replica.life,
            epoch: leader.epoch(),
            proposal,
        };
        self.schedule(delay, event);
    }

    fn tick_leaders(&mut self) {
        for id in IDS {
            let now = self.now;
            if let Role::Leader(leader) = &mut self.replica(id).role
                && let Some(proposal) = leader.handle_tick(now)
            {
                self.propose_isr(id, proposal);
            }
        }
    }

    fn crash(&mut self, id: i32) {
        let keep_unsynced = self.rng.random_range(0..=3);
        let heal_delay = self.rng.random_range(50..=400);
        let replica = self.replica(id);
        if matches!(replica.role, Role::Down) {
            return;
        }
        if let Role::Leader(leader) = &mut replica.role {
            leader.resign();
            let _ = leader.poll_acks().count();
        }
        replica.life += 1;
        replica.role = Role::Down;
        replica.flushing = false;
        // Unsynced records are lost, except perhaps a few that reached the disk anyway.
        let survive = (replica.durable + keep_unsynced).min(replica.log.len());
        replica.log.truncate(survive);
        replica.durable = survive;
        // Recovery rebuilds the epoch cache from what survived.
        replica.epochs = EpochCache::default();
        for (offset, entry) in replica.log.iter().enumerate() {
            replica.epochs.assign(entry.epoch, offset as u64);
        }
        replica.high_watermark = replica.high_watermark_checkpoint.min(replica.log_end());
        let life = replica.life;
        let cut = replica.cut;
        self.counts.crashes += 1;
        self.log(|| format!("{id} crashes, keeps {survive} records"));
        let lapse = self.rng.random_range(20..=80);
        self.schedule(
            lapse,
            Event::LeaseLapsed {
                replica: id,
                life,
                cut,
            },
        );
        self.schedule(heal_delay, Event::Restart { replica: id });
    }

    fn cut_off(&mut self, id: i32) {
        let heal_delay = self.rng.random_range(100..=600);
        let lapse = self.rng.random_range(20..=80);
        let replica = self.replica(id);
        if replica.cut_off || matches!(replica.role, Role::Down) {
            return;
        }
        replica.cut_off = true;
        replica.cut += 1;
        let cut = replica.cut;
        let life = replica.life;
        self.counts.cuts += 1;
        self.log(|| format!("{id} is cut off"));
        self.schedule(
            lapse,
            Event::LeaseLapsed {
                replica: id,
                life,
                cut,
            },
        );
        self.schedule(heal_delay, Event::Heal { replica: id });
    }

    /// One millisecond: faults (while `self.faults`), a produce now and then (while `produce`),
    /// ticks, the periodic re-read, and every event due.
    fn step(&mut self, produce: bool) {
        if self.faults {
            if self.rng.random_bool(0.0015) {
                let id = IDS[self.rng.random_range(0..IDS.len())];
                self.crash(id);
            }
            if self.rng.random_bool(0.0007) {
                let id = IDS[self.rng.random_range(0..IDS.len())];
                self.cut_off(id);
            }
        }
        if produce && self.rng.random_bool(0.3) {
            self.produce();
        }
        if self.now % 10 == 0 {
            self.tick_leaders();
            for replica in &mut self.replicas {
                replica.high_watermark_checkpoint = replica.high_watermark;
            }
        }
        if self.now % 100 == 0 {
            // The periodic re-read that backs up the watch.
            self.publish();
            self.schedule(0, Event::Controller);
            if !produce {
                // Settling: restart fetch loops whose last answer was lost for good.
                for id in IDS {
                    if let Role::Follower { waiting: None, .. } = self.replica(id).role {
                        self.fetch(id);
                    }
                }
            }
        }
        while let Some(next) = self.events.peek() {
            if next.at > self.now {
                break;
            }
            let next = self.events.pop().expect("peeked");
            self.handle(next.event);
            self.check();
        }
        self.check();
        self.now += 1;
    }

    fn check(&mut self) {
        for replica in &mut self.replicas {
            if let Role::Leader(leader) = &replica.role {
                replica.high_watermark = leader.high_watermark();
                let term = (replica.id, replica.life, leader.epoch());
                let seen = self.leader_high_watermarks.entry(term).or_insert(0);
                assert!(
                    leader.high_watermark() >= *seen,
                    "leader {} went back from {seen} to {}",
                    replica.id,
                    leader.high_watermark()
                );
                *seen = leader.high_watermark();
            }
        }
        for replica in &mut self.replicas {
            let visible = replica.high_watermark.min(replica.log_end()) as usize;
            // Entries below a replica's high watermark never change (truncation stays above it,
            // a crash only shortens the log), so each is checked once.
            replica.checked = replica.checked.min(replica.log.len());
            for offset in replica.checked..visible {
                let entry = replica.log[offset];
                match self.committed.get(offset) {
                    Some(seen) => assert_eq!(
                        *seen, entry,
                        "replica {} holds a different committed record at {offset}",
                        replica.id
                    ),
                    None => {
                        assert_eq!(offset, self.committed.len(), "committed has no holes");
                        self.committed.push(entry);
                    }
                }
            }
            replica.checked = replica.checked.max(visible);
        }
        for (offset, value) in self.acks_to_check.drain(..) {
            assert_eq!(
                self.committed.get(offset as usize).map(|e| e.value),
                Some(value),
                "acknowledged record {value} at {offset} is not committed"
            );
        }
        // The leader the store names holds every committed record once it leads: no
        // acknowledged record (and none a consumer saw) is lost.
        let leader = self.state.leader;
        if leader != NO_LEADER {
            let replica = &self.replicas[(leader - 1) as usize];
            if let Role::Leader(state) = &replica.role
                && state.epoch() == self.state.leader_epoch
            {
                let term = (leader, replica.life, state.epoch());
                let from = match self.leader_verified {
                    Some((verified_term, upto)) if verified_term == term => upto,
                    _ => 0,
                };
                for offset in from..self.committed.len() {
                    assert_eq!(
                        replica.log.get(offset),
                        Some(&self.committed[offset]),
                        "leader {leader} (epoch {}) lost committed record at {offset}",
                        state.epoch()
                    );
                }
                self.leader_verified = Some((term, self.committed.len()));
                // Once settled, the end it tells readers is past every record any replica ever
                // counted committed: offsets a reader is told never go backwards across leaders.
                if state.high_watermark_settled() {
                    assert!(
                        state.high_watermark() >= self.committed.len() as u64,
                        "leader {leader} (epoch {}) settled at {}, behind {} committed",
                        state.epoch(),
                        state.high_watermark(),
                        self.committed.len()
                    );
                }
            }
        }
    }

    /// Ends all faults and runs until the cluster settles.
    fn heal_and_settle(&mut self) {
        self.faults = false;
        for id in IDS {
            let replica = self.replica(id);
            if replica.cut_off {
                replica.cut_off = false;
                self.live.insert(id);
            }
            if matches!(self.replica(id).role, Role::Down) {
                self.replica(id).role = Role::Idle;
                self.replica(id).known = None;
                self.replica(id).fresh = true;
                self.live.insert(id);
            }
        }
        self.schedule(0, Event::Controller);
        for _ in 0..2_000 {
            self.step(false);
        }
    }

    fn check_settled(&self) {
        assert_eq!(self.state.isr, IDS.to_vec(), "the ISR is whole again");
        let leader = &self.replicas[(self.state.leader - 1) as usize];
        let Role::Leader(state) = &leader.role else {
            panic!("the leader {} does not lead", leader.id);
        };
        assert_eq!(
            state.high_watermark(),
            leader.log_end(),
            "everything is committed"
        );
        for replica in &self.replicas {
            assert_eq!(replica.log, leader.log, "replica {} converged", replica.id);
        }
        for (offset, value) in &self.acknowledged {
            assert_eq!(leader.log[*offset as usize].value, *value);
        }
    }
}

fn run(seed: u64, trace: bool) -> Counts {
    let mut sim = Sim::new(seed, trace);
    while sim.now < STEPS_MS {
        sim.step(true);
    }
    sim.heal_and_settle();
    sim.check_settled();
    sim.counts
}

#[test]
fn replication_survives_crashes_partitions_and_a_lossy_network() {
    if let Ok(seed) = std::env::var("STRATA_SIM_SEED") {
        let seed: u64 = seed.parse().expect("STRATA_SIM_SEED is a number");
        let counts = run(seed, std::env::var_os("STRATA_SIM_TRACE").is_some());
        eprintln!("seed {seed}: {counts:?}");
        return;
    }
    let seeds: u64 = std::env::var("STRATA_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let base: u64 = rand::rng().random();
    let mut total = Counts::default();
    for index in 0..seeds {
        let seed = base.wrapping_add(index);
        let outcome = std::panic::catch_unwind(|| run(seed, false));
        let counts = match outcome {
            Ok(counts) => counts,
            Err(panic) => {
                eprintln!(
                    "replication simulation failed with seed {seed}; reproduce with \
                     STRATA_SIM_SEED={seed} STRATA_SIM_TRACE=1 cargo nextest run -p strata-node \
                     --test replication_sim"
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
    }
    eprintln!("{seeds} seeds from {base}: {total:?}");
    assert!(
        total.acknowledged > seeds * 200,
        "the simulation makes progress: {total:?}"
    );
    assert!(total.truncations > 0, "divergence is exercised: {total:?}");
    assert!(total.crashes > seeds, "crashes are exercised: {total:?}");
}
