//! A consumer group's membership and assignment: a sans-IO state machine for server-side,
//! cooperative rebalancing driven by heartbeats, in the style of Kafka's KIP-848 ("the next
//! generation of the consumer rebalance protocol").
//!
//! Architecture invariant: this module knows nothing of sockets, files, runtimes or the
//! coordinator store. Time is an argument (`now_ms`); the adapter persists what it must (the
//! group generation, committed offsets) and carries heartbeats over the wire.
//!
//! Call order: [`Group::join`] gives a member its id and generation; the member then calls
//! [`Group::heartbeat`] every few seconds reporting what it owns, and adopts the [`Assignment`]
//! in the answer; [`Group::leave`] when it stops. The adapter calls [`Group::tick`] periodically
//! (it expires silent members), [`Group::set_partitions`] when topic metadata changes, and
//! [`Group::check_commit`] before storing an offset commit.
//!
//! The protocol:
//! - The **group generation** (group epoch) grows by exactly one on each change that needs a new
//!   plan: a member joins, leaves, is expired or changes its subscription, the assignor changes, or
//!   the partition count of a subscribed topic changes (a topic appearing or disappearing
//!   included). Each plan is a **target**: member → partitions, computed by the group's
//!   [`AssignorKind`] over the partitions of subscribed topics that exist.
//! - Each member has a **member generation** (the group generation whose target it has caught up
//!   with), `assigned` (what the last answer let it own), and `revoking` (partitions it was given
//!   before, that left its target, and that it still reports owning). A heartbeat first drops from
//!   `revoking` what the member no longer reports, among what an earlier answer already left out
//!   (a report made before the member heard of a revocation proves nothing: it may not have
//!   started a partition it was given); once nothing is left to revoke, the member's
//!   generation becomes the group generation; then it is given each target partition that no other
//!   member holds. Partitions that stay with a member are never taken away in between
//!   (cooperative), and moved ones travel only after their previous holder let them go.
//! - A member whose answer was lost asks again at its previous generation; that is accepted when
//!   all it reports is still held for it, so a timeout does not cost it its partitions (and the
//!   application a re-read of what it had not committed). Commits stay exact: a member commits at
//!   its current generation only.
//!
//! Invariants, checked after every input in debug builds ([`Group::assert_invariants`]):
//! - a partition is *held* (assigned or revoking) by at most one member: each record goes to one
//!   consumer, even mid-rebalance;
//! - `assigned ⊆ target` and `revoking ∩ target = ∅`: an answer never holds a partition outside
//!   the member's target;
//! - targets are disjoint and only hold partitions of topics their member subscribes to;
//! - member generations never exceed the group generation.

pub mod assignor;
pub mod classic;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Topic → partition count, for the topics that exist.
pub type PartitionCounts = BTreeMap<String, u32>;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: u32,
}

impl TopicPartition {
    pub fn new(topic: &str, partition: u32) -> TopicPartition {
        TopicPartition {
            topic: topic.to_string(),
            partition,
        }
    }
}

/// How a group spreads partitions over its members (see [`assignor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AssignorKind {
    /// Contiguous ranges per topic (Kafka's `range`).
    Range,
    /// All partitions dealt in turn (Kafka's `roundrobin`).
    RoundRobin,
    /// Balanced with minimal movement (Kafka's `cooperative-sticky` / KIP-848 `uniform`).
    #[default]
    Sticky,
}

impl AssignorKind {
    /// The assignor a client names, as Kafka clients spell them.
    pub fn parse(name: &str) -> Option<AssignorKind> {
        match name {
            "range" => Some(AssignorKind::Range),
            "roundrobin" | "round-robin" => Some(AssignorKind::RoundRobin),
            "sticky" | "cooperative-sticky" => Some(AssignorKind::Sticky),
            _ => None,
        }
    }

    /// The name KIP-848's server-side assignors go by: Kafka's `uniform` balances and keeps
    /// partitions where they are, as the sticky assignor does.
    pub fn server_assignor_name(self) -> &'static str {
        match self {
            AssignorKind::Range => "range",
            AssignorKind::Sticky | AssignorKind::RoundRobin => "uniform",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AssignorKind::Range => "range",
            AssignorKind::RoundRobin => "roundrobin",
            AssignorKind::Sticky => "sticky",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinParams {
    /// None: a new member; the group gives it `new_member_id`. Some(known id): the member rejoins
    /// (to change its subscription, or to learn its generation again after a lost answer).
    pub member_id: Option<String>,
    /// Static membership (`group.instance.id`): a new process with the same instance id takes
    /// over the previous one's place without a rebalance.
    pub instance_id: Option<String>,
    pub client_id: String,
    /// The subscription.
    pub topics: Vec<String>,
    /// A member silent for longer than this is expired.
    pub session_timeout_ms: u32,
    /// The max poll interval: how long a member may take to revoke a partition once asked.
    pub rebalance_timeout_ms: u32,
    pub assignor: AssignorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub member_id: String,
    /// The member generation to heartbeat (and commit) with.
    pub generation: i32,
}

/// A heartbeat's answer: the member may own exactly `partitions` now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The member generation, to send in the next heartbeat and in commits.
    pub generation: i32,
    /// Sorted.
    pub partitions: Vec<TopicPartition>,
}

/// Why a member's request is refused. The first three end the member's current identity: it
/// drops its partitions and joins again (as a new member, or with its instance id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// The member id is not in the group (never was, left, or was expired).
    #[error("unknown member id")]
    UnknownMember,
    /// The generation is not the member's: a zombie from an older generation, or a member that
    /// missed an answer.
    #[error("illegal generation")]
    IllegalGeneration,
    /// Another process took over this member's static instance id.
    #[error("fenced by a newer member with the same instance id")]
    FencedInstanceId,
    /// The member asks for another assignor than the one the group's other members use.
    #[error("inconsistent partition assignor")]
    InconsistentAssignor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Every member is at the group generation and holds exactly its target.
    Stable,
    /// Some member is not yet at the group generation, or some partition not yet handed over.
    Reconciling,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub generation: i32,
    /// Sorted.
    pub topics: Vec<String>,
    /// What the member may own now. Sorted.
    pub assigned: Vec<TopicPartition>,
    /// What it will own once reconciled. Sorted.
    pub target: Vec<TopicPartition>,
    pub session_timeout_ms: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub generation: i32,
    pub state: GroupState,
    pub assignor: AssignorKind,
    /// Sorted by member id.
    pub members: Vec<MemberDescription>,
}

#[derive(Debug, Clone)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    topics: BTreeSet<String>,
    session_timeout_ms: u32,
    rebalance_timeout_ms: u32,
    generation: i32,
    /// The generation before the last heartbeat moved it, if one did: a member whose answer was
    /// lost still speaks at it (see [`Group::heartbeat`]).
    previous_generation: Option<i32>,
    target: BTreeSet<TopicPartition>,
    /// What the last answer let the member own; always within `target`.
    assigned: BTreeSet<TopicPartition>,
    /// Partitions the member was given, that left its target, and that it has not yet reported
    /// gone. Nobody else gets them meanwhile.
    revoking: BTreeSet<TopicPartition>,
    /// The part of `revoking` an answer has already left out. Only those can be released: a
    /// report made before the member heard of a revocation says nothing about it (the member
    /// may not even have started a partition it was given; it would start it after).
    told: BTreeSet<TopicPartition>,
    last_heartbeat_ms: u64,
    /// When an answer first asked the member to revoke what is in `revoking`.
    revoke_asked_ms: Option<u64>,
}

impl Member {
    fn holds(&self) -> impl Iterator<Item = &TopicPartition> {
        self.assigned.iter().chain(&self.revoking)
    }

    fn is_expired(&self, now_ms: u64) -> bool {
        let silent_ms = now_ms.saturating_sub(self.last_heartbeat_ms);
        let session_over = silent_ms > u64::from(self.session_timeout_ms);
        let revocation_over = !self.revoking.is_empty()
            && self.revoke_asked_ms.is_some_and(|asked_ms| {
                now_ms.saturating_sub(asked_ms) > u64::from(self.rebalance_timeout_ms)
            });
        session_over || revocation_over
    }
}

/// What of a group must outlive its coordinator: everything but the clocks. A new coordinator
/// restores it ([`Group::restore`]) and members go on at their generations, keeping their
/// partitions; without it they would drop them and join again, re-reading what they had not
/// committed. The adapter stores it before it answers whenever it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub assignor: String,
    pub planned_counts: PartitionCounts,
    pub members: BTreeMap<String, MemberSnapshot>,
    pub fenced: BTreeMap<String, String>,
}

impl GroupSnapshot {
    /// Whether `now` differs from this stored snapshot only by partitions released (left
    /// `revoking`) and revocations told: then the stored one may stay. Restored, it holds
    /// those partitions a little longer (their holders report them gone again), which is safe;
    /// every other change (a partition handed over, a generation moved, a member come or
    /// gone) must be stored before the answer that reports it.
    pub fn only_releases_since(&self, now: &GroupSnapshot) -> bool {
        self.assignor == now.assignor
            && self.planned_counts == now.planned_counts
            && self.fenced == now.fenced
            && self.members.len() == now.members.len()
            && self
                .members
                .iter()
                .zip(&now.members)
                .all(|((id, stored), (now_id, now))| {
                    // Destructured whole: a field added later must be placed on one side or
                    // the other of this rule.
                    let MemberSnapshot {
                        instance_id,
                        client_id,
                        topics,
                        session_timeout_ms,
                        rebalance_timeout_ms,
                        generation,
                        previous_generation,
                        target,
                        assigned,
                        revoking,
                        told: _,
                    } = stored;
                    id == now_id
                        && now.revoking.is_subset(revoking)
                        && *instance_id == now.instance_id
                        && *client_id == now.client_id
                        && *topics == now.topics
                        && *session_timeout_ms == now.session_timeout_ms
                        && *rebalance_timeout_ms == now.rebalance_timeout_ms
                        && *generation == now.generation
                        && *previous_generation == now.previous_generation
                        && *target == now.target
                        && *assigned == now.assigned
                })
    }
}

/// A member as stored: its subscription, generations and holdings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSnapshot {
    pub instance_id: Option<String>,
    pub client_id: String,
    pub topics: BTreeSet<String>,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub generation: i32,
    pub previous_generation: Option<i32>,
    pub target: BTreeSet<TopicPartition>,
    pub assigned: BTreeSet<TopicPartition>,
    pub revoking: BTreeSet<TopicPartition>,
    pub told: BTreeSet<TopicPartition>,
}

pub struct Group {
    group_id: String,
    generation: i32,
    assignor: AssignorKind,
    members: BTreeMap<String, Member>,
    /// Partition → the member that holds it (in `assigned` or `revoking`). The handover rule
    /// reads it on every heartbeat; `assert_invariants` checks it against the members.
    holders: BTreeMap<TopicPartition, String>,
    /// Partition counts of the subscribed topics as of the last plan: a metadata change re-plans
    /// only when it differs.
    planned_counts: PartitionCounts,
    /// Member ids replaced by a static takeover → their instance id. Cleared when the group
    /// empties, which bounds it by the instance ids of one busy period.
    fenced: BTreeMap<String, String>,
}

impl Group {
    /// `generation`: the group epoch to start from (a new coordinator loads the stored one and
    /// starts above it). The first member's join makes `generation + 1`.
    pub fn new(group_id: String, generation: i32) -> Group {
        // -1 is the "no generation" of simple (assign-mode) commits; no group may have it.
        assert!(generation >= 0, "group generation {generation} < 0");
        Group {
            group_id,
            generation,
            assignor: AssignorKind::default(),
            members: BTreeMap::new(),
            holders: BTreeMap::new(),
            planned_counts: PartitionCounts::new(),
            fenced: BTreeMap::new(),
        }
    }

    /// The membership to store (see [`GroupSnapshot`]).
    pub fn snapshot(&self) -> GroupSnapshot {
        GroupSnapshot {
            assignor: self.assignor.name().to_string(),
            planned_counts: self.planned_counts.clone(),
            members: self
                .members
                .iter()
                .map(|(id, member)| {
                    let snapshot = MemberSnapshot {
                        instance_id: member.instance_id.clone(),
                        client_id: member.client_id.clone(),
                        topics: member.topics.clone(),
                        session_timeout_ms: member.session_timeout_ms,
                        rebalance_timeout_ms: member.rebalance_timeout_ms,
                        generation: member.generation,
                        previous_generation: member.previous_generation,
                        target: member.target.clone(),
                        assigned: member.assigned.clone(),
                        revoking: member.revoking.clone(),
                        told: member.told.clone(),
                    };
                    (id.clone(), snapshot)
                })
                .collect(),
            fenced: self.fenced.clone(),
        }
    }

    /// A group as a previous coordinator stored it, now at `generation` (the claim's, above every
    /// stored one). Each member gets a whole session and rebalance timeout from `now_ms`, as if
    /// it had just heartbeated. A snapshot that breaks an invariant (two holders of a
    /// partition, ...) is refused: the caller then starts the group empty, as before snapshots.
    pub fn restore(
        group_id: String,
        generation: i32,
        snapshot: GroupSnapshot,
        now_ms: u64,
    ) -> Result<Group, String> {
        let mut group = Group::new(group_id, generation);
        group.assignor = AssignorKind::parse(&snapshot.assignor)
            .ok_or_else(|| format!("unknown assignor {:?}", snapshot.assignor))?;
        group.planned_counts = snapshot.planned_counts;
        group.fenced = snapshot.fenced;
        for (id, stored) in snapshot.members {
            if stored.generation > generation {
                return Err(format!(
                    "member {id} at {} ahead of {generation}",
                    stored.generation
                ));
            }
            if !stored.assigned.is_subset(&stored.target)
                || !stored.revoking.is_disjoint(&stored.target)
                || !stored.told.is_subset(&stored.revoking)
            {
                return Err(format!("member {id}'s holdings are inconsistent"));
            }
            let member = Member {
                instance_id: stored.instance_id,
                client_id: stored.client_id,
                topics: stored.topics,
                session_timeout_ms: stored.session_timeout_ms,
                rebalance_timeout_ms: stored.rebalance_timeout_ms,
                generation: stored.generation,
                previous_generation: stored.previous_generation,
                target: stored.target,
                assigned: stored.assigned,
                revoking: stored.revoking,
                told: stored.told,
                last_heartbeat_ms: now_ms,
                revoke_asked_ms: None,
            };
            for tp in member.holds() {
                if let Some(other) = group.holders.insert(tp.clone(), id.clone()) {
                    return Err(format!("{tp:?} held by {other} and {id}"));
                }
            }
            let mut member = member;
            if !member.revoking.is_empty() {
                member.revoke_asked_ms = Some(now_ms);
            }
            group.members.insert(id, member);
        }
        let mut targeted = BTreeSet::new();
        for member in group.members.values() {
            if !member.target.iter().all(|tp| targeted.insert(tp.clone())) {
                return Err("two members target one partition".into());
            }
        }
        group.assert_invariants();
        Ok(group)
    }

    /// The group epoch.
    /// No member belongs to the group (it may be deleted, its offsets reset from outside).
    pub fn has_no_members(&self) -> bool {
        self.members.is_empty()
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A member joins, rejoins with a new subscription, or (static membership) takes over the
    /// place of the member with its instance id. `new_member_id` must be unique (a UUID); it is
    /// used only when the join creates or takes over a member.
    pub fn join(
        &mut self,
        now_ms: u64,
        params: JoinParams,
        partitions: &PartitionCounts,
        new_member_id: String,
    ) -> Result<Joined, GroupError> {
        // Validate everything before changing anything.
        let continued: Option<String> = match &params.member_id {
            Some(id) if self.fenced.contains_key(id) => return Err(GroupError::FencedInstanceId),
            Some(id) if self.members.contains_key(id) => Some(id.clone()),
            Some(_) if params.instance_id.is_none() => return Err(GroupError::UnknownMember),
            // An unknown id with an instance id: a static member restarting after it was
            // expired; its instance id decides whether it takes over a place or is new.
            _ => params
                .instance_id
                .as_ref()
                .and_then(|instance_id| self.member_of_instance(instance_id)),
        };
        let has_others = self.members.keys().any(|id| Some(id) != continued.as_ref());
        if has_others && params.assignor != self.assignor {
            return Err(GroupError::InconsistentAssignor);
        }

        let topics: BTreeSet<String> = params.topics.into_iter().collect();
        // A sole member may switch the assignor; that needs a new plan.
        let mut replan = params.assignor != self.assignor;
        self.assignor = params.assignor;
        let rejoining = continued.is_some();
        let member_id = match continued {
            Some(old_id) => {
                let mut member = self.members.remove(&old_id).expect("validated");
                let member_id = if params.member_id.as_ref() == Some(&old_id) {
                    old_id
                } else {
                    // Static takeover: the new process inherits the place; the old one is fenced.
                    self.assert_fresh(&new_member_id);
                    let instance_id = member.instance_id.clone().expect("found by instance id");
                    for tp in member.holds() {
                        let holder = self.holders.insert(tp.clone(), new_member_id.clone());
                        debug_assert_eq!(holder.as_ref(), Some(&old_id));
                    }
                    self.fenced.insert(old_id, instance_id);
                    new_member_id
                };
                replan |= member.topics != topics;
                member.topics = topics;
                member.client_id = params.client_id;
                member.session_timeout_ms = params.session_timeout_ms;
                member.rebalance_timeout_ms = params.rebalance_timeout_ms;
                member.last_heartbeat_ms = now_ms;
                self.members.insert(member_id.clone(), member);
                member_id
            }
            None => {
                self.assert_fresh(&new_member_id);
                replan = true;
                let member = Member {
                    instance_id: params.instance_id,
                    client_id: params.client_id,
                    topics,
                    session_timeout_ms: params.session_timeout_ms,
                    rebalance_timeout_ms: params.rebalance_timeout_ms,
                    // Set below, once the join's plan has its generation.
                    generation: self.generation,
                    previous_generation: None,
                    target: BTreeSet::new(),
                    assigned: BTreeSet::new(),
                    revoking: BTreeSet::new(),
                    told: BTreeSet::new(),
                    last_heartbeat_ms: now_ms,
                    revoke_asked_ms: None,
                };
                self.members.insert(new_member_id.clone(), member);
                new_member_id
            }
        };
        if replan || self.subscribed_counts(partitions) != self.planned_counts {
            self.replan(partitions);
        }
        let group_generation = self.generation;
        let member = self.members.get_mut(&member_id).expect("just inserted");
        if member.assigned.is_empty() && member.revoking.is_empty() {
            // A member that holds nothing has nothing to reconcile: it starts at the generation
            // at which it joined.
            if member.generation != group_generation {
                // A new member never spoke at its placeholder generation.
                member.previous_generation = rejoining.then_some(member.generation);
                member.generation = group_generation;
            }
        }
        let generation = member.generation;
        self.assert_invariants();
        Ok(Joined {
            member_id,
            generation,
        })
    }

    /// The member reports what it owns; the answer says what it may own now. See the module
    /// doc for the reconciliation rules.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        member_id: &str,
        generation: i32,
        owned: &[TopicPartition],
        partitions: &PartitionCounts,
    ) -> Result<Assignment, GroupError> {
        self.set_partitions(partitions);
        self.check_heartbeat(member_id, generation, owned)?;
        let group_generation = self.generation;
        let member = self.members.get_mut(member_id).expect("checked");
        member.last_heartbeat_ms = now_ms;

        // Revocation first: what the member stopped reporting is free for others. Partitions it
        // reports but never held (a confused client) change nothing.
        let owned: BTreeSet<&TopicPartition> = owned.iter().collect();
        let released: Vec<TopicPartition> = member
            .told
            .iter()
            .filter(|tp| !owned.contains(tp))
            .cloned()
            .collect();
        for tp in released {
            member.revoking.remove(&tp);
            member.told.remove(&tp);
            let holder = self.holders.remove(&tp);
            assert_eq!(holder.as_deref(), Some(member_id), "{tp:?} held by another");
        }
        if member.revoking.is_empty() {
            // Nothing left to give up: the member has caught up with the current target.
            if member.generation != group_generation {
                member.previous_generation = Some(member.generation);
                member.generation = group_generation;
            }
            member.revoke_asked_ms = None;
        } else {
            // This answer (again) leaves out what it must revoke; the rebalance timeout runs
            // from the first such answer.
            member.revoke_asked_ms.get_or_insert(now_ms);
        }

        // Then hand over each target partition that nobody holds any more.
        for tp in &member.target {
            if member.assigned.contains(tp) {
                continue;
            }
            match self.holders.get(tp) {
                Some(holder) => debug_assert_ne!(holder, member_id, "revoking ∩ target = ∅"),
                None => {
                    self.holders.insert(tp.clone(), member_id.to_string());
                    member.assigned.insert(tp.clone());
                }
            }
        }
        // This answer leaves out everything still being revoked: from now on the member knows.
        member.told.clone_from(&member.revoking);
        let assignment = Assignment {
            generation: member.generation,
            partitions: member.assigned.iter().cloned().collect(),
        };
        self.assert_invariants();
        Ok(assignment)
    }

    /// The member leaves: removed at once, its partitions free for the others at the next plan.
    /// `_now_ms` keeps the input shape of every handler; leaving needs no clock.
    pub fn leave(
        &mut self,
        _now_ms: u64,
        member_id: &str,
        partitions: &PartitionCounts,
    ) -> Result<(), GroupError> {
        if self.fenced.contains_key(member_id) {
            return Err(GroupError::FencedInstanceId);
        }
        if !self.members.contains_key(member_id) {
            return Err(GroupError::UnknownMember);
        }
        self.remove_members(&[member_id.to_string()], partitions);
        Ok(())
    }

    /// Removes members whose session expired (silent for longer than their session timeout) or
    /// that still hold a partition longer than their rebalance timeout after they were first
    /// asked to revoke it; returns their ids. Several expiries in one tick make one new plan.
    pub fn tick(&mut self, now_ms: u64, partitions: &PartitionCounts) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, member)| member.is_expired(now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        if expired.is_empty() {
            self.set_partitions(partitions);
        } else {
            self.remove_members(&expired, partitions);
        }
        expired
    }

    /// Topic metadata changed: re-plans if a subscribed topic's partition count changed
    /// (including a subscribed topic appearing or disappearing).
    pub fn set_partitions(&mut self, partitions: &PartitionCounts) {
        if self.subscribed_counts(partitions) != self.planned_counts {
            self.replan(partitions);
            self.assert_invariants();
        }
    }

    /// May this member commit offsets at this generation? A negative generation is a simple
    /// (assign-mode) commit, whatever member id it names (a KIP-848 client names its own even
    /// when it only assigns): allowed only while the group has no members, so that it cannot
    /// overwrite the progress of members consuming the same partitions, as Kafka rules.
    pub fn check_commit(&self, member_id: &str, generation: i32) -> Result<(), GroupError> {
        if generation < 0 {
            return if self.members.is_empty() {
                Ok(())
            } else {
                Err(GroupError::IllegalGeneration)
            };
        }
        self.check_member(member_id, generation)
    }

    /// The topics member `member_id` subscribes to; `None` for a member not in the group.
    pub fn member_topics(&self, member_id: &str) -> Option<&BTreeSet<String>> {
        self.members.get(member_id).map(|member| &member.topics)
    }

    /// Whether `member_id` was a static member whose instance id another process took over.
    pub fn was_fenced(&self, member_id: &str) -> bool {
        self.fenced.contains_key(member_id)
    }

    /// The assignor the group's members use.
    pub fn assignor(&self) -> AssignorKind {
        self.assignor
    }

    pub fn describe(&self) -> GroupDescription {
        let members = self
            .members
            .iter()
            .map(|(member_id, member)| MemberDescription {
                member_id: member_id.clone(),
                instance_id: member.instance_id.clone(),
                client_id: member.client_id.clone(),
                generation: member.generation,
                topics: member.topics.iter().cloned().collect(),
                assigned: member.assigned.iter().cloned().collect(),
                target: member.target.iter().cloned().collect(),
                session_timeout_ms: member.session_timeout_ms,
            })
            .collect();
        GroupDescription {
            group_id: self.group_id.clone(),
            generation: self.generation,
            state: self.state(),
            assignor: self.assignor,
            members,
        }
    }

    /// The session timeout a member joined with, if it is a member.
    pub fn session_timeout_ms(&self, member_id: &str) -> Option<u32> {
        self.members
            .get(member_id)
            .map(|member| member.session_timeout_ms)
    }

    pub fn state(&self) -> GroupState {
        if self.members.is_empty() {
            return GroupState::Empty;
        }
        let reconciled = self.members.values().all(|member| {
            member.generation == self.generation
                && member.revoking.is_empty()
                && member.assigned == member.target
        });
        if reconciled {
            GroupState::Stable
        } else {
            GroupState::Reconciling
        }
    }

    /// The member exists and speaks at its generation. An unknown id with a generation older
    /// than the group's is a zombie (expired or left at that generation), told apart so that
    /// its commits are refused as stale rather than unknown.
    fn check_member(&self, member_id: &str, generation: i32) -> Result<(), GroupError> {
        if self.fenced.contains_key(member_id) {
            return Err(GroupError::FencedInstanceId);
        }
        match self.members.get(member_id) {
            Some(member) if member.generation == generation => Ok(()),
            Some(_) => Err(GroupError::IllegalGeneration),
            None if generation < self.generation => Err(GroupError::IllegalGeneration),
            None => Err(GroupError::UnknownMember),
        }
    }

    /// A heartbeat is also accepted at the member's previous generation when everything it
    /// reports owning is still held for it: the answer that moved it was lost (a timeout, or a
    /// consumer closing while a heartbeat was in flight), and it asks again what that answer
    /// said (KIP-848 does the same). Refusing it would make the member drop its partitions
    /// and join again, and whatever it had not committed would be read twice.
    fn check_heartbeat(
        &self,
        member_id: &str,
        generation: i32,
        owned: &[TopicPartition],
    ) -> Result<(), GroupError> {
        if let Some(member) = self.members.get(member_id)
            && !self.fenced.contains_key(member_id)
            && member.previous_generation == Some(generation)
        {
            let held: BTreeSet<&TopicPartition> = member.holds().collect();
            return if owned.iter().all(|tp| held.contains(tp)) {
                Ok(())
            } else {
                Err(GroupError::IllegalGeneration)
            };
        }
        self.check_member(member_id, generation)
    }

    fn member_of_instance(&self, instance_id: &str) -> Option<String> {
        self.members
            .iter()
            .find(|(_, member)| member.instance_id.as_deref() == Some(instance_id))
            .map(|(id, _)| id.clone())
    }

    fn assert_fresh(&self, new_member_id: &str) {
        assert!(!new_member_id.is_empty(), "empty member id");
        assert!(
            !self.members.contains_key(new_member_id) && !self.fenced.contains_key(new_member_id),
            "member id {new_member_id} reused"
        );
    }

    fn remove_members(&mut self, member_ids: &[String], partitions: &PartitionCounts) {
        for member_id in member_ids {
            let member = self.members.remove(member_id).expect("a member");
            for tp in member.holds() {
                let holder = self.holders.remove(tp);
                assert_eq!(holder.as_ref(), Some(member_id));
            }
        }
        if self.members.is_empty() {
            self.fenced.clear();
        }
        self.replan(partitions);
        self.assert_invariants();
    }

    /// The counts of the topics some member subscribes to, among those that exist.
    fn subscribed_counts(&self, partitions: &PartitionCounts) -> PartitionCounts {
        partitions
            .iter()
            .filter(|(topic, _)| self.members.values().any(|m| m.topics.contains(*topic)))
            .map(|(topic, count)| (topic.clone(), *count))
            .collect()
    }

    /// A new generation and a new target for every member. Holdings do not change here: what
    /// leaves a member's target moves to its `revoking` (still held until it reports it gone),
    /// and a revoking partition that comes back into its target is simply assigned again.
    fn replan(&mut self, partitions: &PartitionCounts) {
        self.generation = self
            .generation
            .checked_add(1)
            .expect("group generation overflow");
        self.planned_counts = self.subscribed_counts(partitions);
        let subscriptions: assignor::Subscriptions = self
            .members
            .iter()
            .map(|(id, member)| (id.clone(), member.topics.clone()))
            .collect();
        let previous: assignor::Plan = self
            .members
            .iter()
            .map(|(id, member)| (id.clone(), member.target.clone()))
            .collect();
        let mut plan = assignor::assign(
            self.assignor,
            &subscriptions,
            &self.planned_counts,
            &previous,
        );
        for (member_id, member) in &mut self.members {
            let target = plan.remove(member_id).expect("a plan entry per member");
            let leaving: Vec<TopicPartition> =
                member.assigned.difference(&target).cloned().collect();
            let returning: Vec<TopicPartition> =
                member.revoking.intersection(&target).cloned().collect();
            for tp in leaving {
                member.assigned.remove(&tp);
                member.revoking.insert(tp);
            }
            for tp in returning {
                member.revoking.remove(&tp);
                member.told.remove(&tp);
                member.assigned.insert(tp);
            }
            if member.revoking.is_empty() {
                member.revoke_asked_ms = None;
            }
            member.target = target;
        }
        debug_assert!(plan.is_empty());
    }

    /// Checks every invariant of the module doc (debug builds only: it walks all holdings).
    pub fn assert_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let mut held: BTreeMap<&TopicPartition, &String> = BTreeMap::new();
        let mut targeted: BTreeSet<&TopicPartition> = BTreeSet::new();
        for (member_id, member) in &self.members {
            assert!(member.generation <= self.generation, "{member_id} ahead");
            assert!(
                member.assigned.is_subset(&member.target),
                "{member_id} assigned outside its target"
            );
            assert!(
                member.revoking.is_disjoint(&member.target),
                "{member_id} revoking a target partition"
            );
            assert!(
                member.told.is_subset(&member.revoking),
                "{member_id} told of a revocation it is not making"
            );
            assert!(
                !member.revoking.is_empty() || member.revoke_asked_ms.is_none(),
                "{member_id} has a revocation clock with nothing to revoke"
            );
            for tp in &member.target {
                assert!(member.topics.contains(&tp.topic), "{tp:?} not subscribed");
                assert!(targeted.insert(tp), "{tp:?} in two targets");
            }
            for tp in member.holds() {
                let other = held.insert(tp, member_id);
                assert!(other.is_none(), "{tp:?} held by {other:?} and {member_id}");
            }
            assert!(!self.fenced.contains_key(member_id));
        }
        assert!(
            held.iter()
                .map(|(tp, id)| (*tp, *id))
                .eq(self.holders.iter()),
            "the holder index is out of date"
        );
    }
}

#[cfg(test)]
mod tests;
