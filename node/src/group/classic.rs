//! Kafka's classic group protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup), for Kafka
//! clients on the Kafka listener: a sans-IO state machine beside the native [`super::Group`].
//!
//! Unlike Strata's own protocol, assignment is the clients' business: the coordinator gathers
//! every member's join (a long poll), names a leader and a protocol all members support, hands
//! the leader everyone's metadata, and relays the assignment the leader sends in its SyncGroup
//! to each member (another long poll). The bytes are opaque here. Rebalances are eager: every
//! member rejoins, and a member that does not within the rebalance timeout is dropped.
//!
//! Requests that must wait (a join until the rebalance completes, a follower's sync until the
//! leader's) return `Wait`; answers for waiting members come out of [`ClassicGroup::take_replies`]
//! after any call, keyed by member id. Time is an argument.
//!
//! Invariants (checked after every call in debug builds):
//! - the leader, when there is one, is a member, and the group is empty exactly when it has no
//!   members;
//! - in `CompletingRebalance` and `Stable` the chosen protocol is one every member supports;
//! - only members wait for a reply.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassicState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl ClassicState {
    /// Kafka's names for the states (DescribeGroups, `strata group describe`).
    pub fn name(self) -> &'static str {
        match self {
            ClassicState::Empty => "Empty",
            ClassicState::PreparingRebalance => "PreparingRebalance",
            ClassicState::CompletingRebalance => "CompletingRebalance",
            ClassicState::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClassicError {
    #[error("unknown member")]
    UnknownMember,
    #[error("illegal generation")]
    IllegalGeneration,
    #[error("a rebalance is in progress: rejoin")]
    RebalanceInProgress,
    #[error("no protocol in common with the group's members, or another protocol type")]
    InconsistentProtocol,
    /// A first join without a member id (JoinGroup v4+): the answer carries the id to join with.
    #[error("member id required")]
    MemberIdRequired,
    /// A static member's instance id now belongs to a newer member id: this one is a zombie.
    #[error("the instance id belongs to a newer member")]
    FencedInstanceId,
}

/// A JoinGroup, as the coordinator sees it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    /// Empty on a member's first join.
    pub member_id: String,
    pub client_id: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub protocol_type: String,
    /// (name, metadata), most preferred first.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a first join is answered MEMBER_ID_REQUIRED with the id to use.
    pub require_known_member_id: bool,
    /// `group.instance.id` (static membership, KIP-345): a restarted instance takes its
    /// membership back under a new member id, without a rebalance when nothing changed.
    pub instance_id: Option<String>,
}

/// What a join is answered with.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinAnswer {
    pub error: Option<ClassicError>,
    pub member_id: String,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    /// Every member's metadata for the chosen protocol: for the leader only.
    pub members: Vec<(String, Bytes)>,
}

impl JoinAnswer {
    fn refused(error: ClassicError, member_id: String) -> JoinAnswer {
        JoinAnswer {
            error: Some(error),
            member_id,
            generation: -1,
            protocol_type: String::new(),
            protocol: String::new(),
            leader: String::new(),
            members: Vec::new(),
        }
    }
}

pub enum Joined {
    Now(JoinAnswer),
    /// The answer comes from [`ClassicGroup::take_replies`] once the rebalance completes.
    Wait {
        member_id: String,
    },
}

pub enum Synced {
    Now(Bytes),
    Wait,
}

/// An answer for a member waiting on a join or a sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Join(JoinAnswer),
    Sync(Result<Bytes, ClassicError>),
}

#[derive(Debug, Clone)]
struct Member {
    client_id: String,
    session_timeout_ms: u32,
    rebalance_timeout_ms: u32,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    heard_ms: u64,
    /// Has joined the rebalance in progress.
    joined: bool,
    /// What the leader's last SyncGroup gave it.
    assignment: Bytes,
    instance_id: Option<String>,
}

impl Member {
    /// A member that just joined with `request`, holding `assignment` until the next sync.
    fn joined(now_ms: u64, request: JoinRequest, assignment: Bytes) -> Member {
        Member {
            client_id: request.client_id,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            protocol_type: request.protocol_type,
            protocols: request.protocols,
            heard_ms: now_ms,
            joined: true,
            assignment,
            instance_id: request.instance_id,
        }
    }
}

/// What of a stable group must outlive its coordinator, as Kafka keeps it in
/// `__consumer_offsets`: generation, protocol, leader and each member with its assignment. A
/// new coordinator restores it ([`ClassicGroup::restore`]) and the members heartbeat and commit
/// on at the same generation, with no rebalance; without it they would all rejoin. Only a
/// `Stable` group has one: mid-rebalance every member rejoins anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassicSnapshot {
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub members: BTreeMap<String, StoredMember>,
}

/// A member as [`ClassicSnapshot`] stores it (its clock is not stored: a restored member is
/// heard from at the restore).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMember {
    pub client_id: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub protocol_type: String,
    /// (protocol name, the member's metadata for it).
    pub protocols: Vec<(String, Vec<u8>)>,
    pub assignment: Vec<u8>,
    pub instance_id: Option<String>,
}

/// One member as `describe` shows it.
#[derive(Debug, Clone)]
pub struct ClassicMemberDescription {
    pub member_id: String,
    pub client_id: String,
    pub assignment: Bytes,
    /// Its metadata for the group's chosen protocol (a consumer's subscription); empty before
    /// one is chosen.
    pub metadata: Bytes,
}

pub struct ClassicGroup {
    generation: i32,
    state: ClassicState,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED and not joined yet, with when (ms).
    pending: BTreeMap<String, (u64, u32)>,
    /// When the rebalance in progress gives up on members that have not rejoined.
    rebalance_deadline_ms: Option<u64>,
    /// Kafka's `group.initial.rebalance.delay.ms`: a rebalance out of `Empty` waits this long
    /// for more members (0: complete as soon as everyone known has joined).
    initial_delay_ms: u64,
    /// A rebalance out of `Empty` in its initial delay: (the current delay, the time left
    /// after it), Kafka's `delayMs` and `remainingMs`; `None` otherwise.
    initial_join: Option<(u64, u64)>,
    /// A new member joined during the initial delay: the delay is extended once more.
    new_member_added: bool,
    /// Members waiting for an answer: true for a join, false for a sync.
    waiting: BTreeMap<String, bool>,
    /// Static members: instance id → the member id it holds now.
    instances: BTreeMap<String, String>,
    replies: Vec<(String, Reply)>,
}

impl ClassicGroup {
    /// A group with no members at `generation` (the one its coordinator claimed).
    pub fn new(generation: i32) -> ClassicGroup {
        ClassicGroup {
            generation,
            state: ClassicState::Empty,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            rebalance_deadline_ms: None,
            initial_delay_ms: 0,
            initial_join: None,
            new_member_added: false,
            waiting: BTreeMap::new(),
            instances: BTreeMap::new(),
            replies: Vec::new(),
        }
    }

    /// Kafka's `group.initial.rebalance.delay.ms` for this group.
    pub fn with_initial_rebalance_delay(mut self, delay_ms: u64) -> ClassicGroup {
        self.initial_delay_ms = delay_ms;
        self
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn state(&self) -> ClassicState {
        self.state
    }

    pub fn has_no_members(&self) -> bool {
        self.members.is_empty()
    }

    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.members
            .values()
            .next()
            .map(|member| member.protocol_type.as_str())
    }

    pub fn describe(&self) -> Vec<ClassicMemberDescription> {
        self.members
            .iter()
            .map(|(member_id, member)| ClassicMemberDescription {
                member_id: member_id.clone(),
                client_id: member.client_id.clone(),
                assignment: member.assignment.clone(),
                metadata: self.chosen_metadata(member),
            })
            .collect()
    }

    /// `member`'s metadata for the chosen protocol (empty before one is chosen).
    fn chosen_metadata(&self, member: &Member) -> Bytes {
        let protocol = self.protocol.as_deref().unwrap_or_default();
        member
            .protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, metadata)| metadata.clone())
            .unwrap_or_default()
    }

    /// The group as its record stores it; `None` unless it is `Stable`.
    pub fn snapshot(&self) -> Option<ClassicSnapshot> {
        if self.state != ClassicState::Stable {
            return None;
        }
        Some(ClassicSnapshot {
            generation: self.generation,
            protocol: self.protocol.clone()?,
            leader: self.leader.clone()?,
            members: self
                .members
                .iter()
                .map(|(id, member)| {
                    let stored = StoredMember {
                        client_id: member.client_id.clone(),
                        session_timeout_ms: member.session_timeout_ms,
                        rebalance_timeout_ms: member.rebalance_timeout_ms,
                        protocol_type: member.protocol_type.clone(),
                        protocols: member
                            .protocols
                            .iter()
                            .map(|(name, metadata)| (name.clone(), metadata.to_vec()))
                            .collect(),
                        assignment: member.assignment.to_vec(),
                        instance_id: member.instance_id.clone(),
                    };
                    (id.clone(), stored)
                })
                .collect(),
        })
    }

    /// The stable group a previous coordinator stored, its members heard from at `now_ms`.
    /// Refuses a snapshot that breaks the group's invariants (then the caller starts empty).
    pub fn restore(snapshot: ClassicSnapshot, now_ms: u64) -> Result<ClassicGroup, String> {
        if !snapshot.members.contains_key(&snapshot.leader) {
            return Err(format!("the leader {} is not a member", snapshot.leader));
        }
        let mut group = ClassicGroup::new(snapshot.generation);
        for (id, stored) in snapshot.members {
            if !stored
                .protocols
                .iter()
                .any(|(name, _)| *name == snapshot.protocol)
            {
                return Err(format!("member {id} lacks protocol {}", snapshot.protocol));
            }
            if let Some(instance) = &stored.instance_id
                && group
                    .instances
                    .insert(instance.clone(), id.clone())
                    .is_some()
            {
                return Err(format!("instance {instance} held twice"));
            }
            let member = Member {
                client_id: stored.client_id,
                session_timeout_ms: stored.session_timeout_ms,
                rebalance_timeout_ms: stored.rebalance_timeout_ms,
                protocol_type: stored.protocol_type,
                protocols: stored
                    .protocols
                    .into_iter()
                    .map(|(name, metadata)| (name, Bytes::from(metadata)))
                    .collect(),
                heard_ms: now_ms,
                joined: true,
                assignment: Bytes::from(stored.assignment),
                instance_id: stored.instance_id,
            };
            group.members.insert(id, member);
        }
        group.protocol = Some(snapshot.protocol);
        group.leader = Some(snapshot.leader);
        group.state = ClassicState::Stable;
        group.assert_invariants();
        Ok(group)
    }

    /// Answers for waiting members that the last calls produced.
    pub fn take_replies(&mut self) -> Vec<(String, Reply)> {
        std::mem::take(&mut self.replies)
    }

    /// A JoinGroup. `new_member_id` is used when the request carries none.
    pub fn join(&mut self, now_ms: u64, request: JoinRequest, new_member_id: String) -> Joined {
        let joined = self.join_inner(now_ms, request, new_member_id);
        self.assert_invariants();
        joined
    }

    fn join_inner(&mut self, now_ms: u64, request: JoinRequest, new_member_id: String) -> Joined {
        let compatible = self.members.iter().all(|(id, member)| {
            *id == request.member_id || member.protocol_type == request.protocol_type
        }) && self.common_protocol(Some(&request)).is_some();
        if !compatible {
            return Joined::Now(JoinAnswer::refused(
                ClassicError::InconsistentProtocol,
                request.member_id,
            ));
        }
        if let Some(instance) = &request.instance_id
            && let Some(current) = self.instances.get(instance).cloned()
        {
            if request.member_id.is_empty() {
                return self.replace_static_member(now_ms, current, request, new_member_id);
            }
            if current != request.member_id {
                return Joined::Now(JoinAnswer::refused(
                    ClassicError::FencedInstanceId,
                    request.member_id,
                ));
            }
        }
        let member_id = if request.member_id.is_empty() {
            // Static members are let in at once (KIP-394 spares them the round trip).
            if request.require_known_member_id && request.instance_id.is_none() {
                self.pending
                    .insert(new_member_id.clone(), (now_ms, request.session_timeout_ms));
                return Joined::Now(JoinAnswer::refused(
                    ClassicError::MemberIdRequired,
                    new_member_id,
                ));
            }
            new_member_id
        } else if self.members.contains_key(&request.member_id)
            || self.pending.remove(&request.member_id).is_some()
        {
            request.member_id.clone()
        } else {
            return Joined::Now(JoinAnswer::refused(
                ClassicError::UnknownMember,
                request.member_id,
            ));
        };
        // A follower rejoining a stable group with nothing changed keeps the generation (as
        // Kafka's coordinator does): no rebalance for a member that only lost its answer.
        if self.state == ClassicState::Stable
            && self.leader.as_deref() != Some(&member_id)
            && self
                .members
                .get(&member_id)
                .is_some_and(|member| member.protocols == request.protocols)
        {
            let member = self.members.get_mut(&member_id).expect("checked");
            member.heard_ms = now_ms;
            return Joined::Now(self.join_answer(&member_id));
        }
        if let Some(instance) = &request.instance_id {
            self.instances.insert(instance.clone(), member_id.clone());
        }
        if !self.members.contains_key(&member_id) && self.initial_join.is_some() {
            self.new_member_added = true;
        }
        let assignment = self
            .members
            .get(&member_id)
            .map(|member| member.assignment.clone())
            .unwrap_or_default();
        self.members.insert(
            member_id.clone(),
            Member::joined(now_ms, request, assignment),
        );
        // A join of this member still waiting is answered by this one's answer (the adapter
        // keeps one waiter per member).
        self.waiting.insert(member_id.clone(), true);
        if self.state != ClassicState::PreparingRebalance {
            self.prepare_rebalance(now_ms, Some(&member_id));
        }
        self.complete_join_if_all_joined();
        Joined::Wait { member_id }
    }

    /// A static member's instance rejoins without a member id (it restarted): it takes the
    /// membership over under `new_member_id`, and the old id is fenced. In a stable group,
    /// with the same protocols, it gets the current generation and its assignment back at
    /// once: no rebalance, which is what static membership is for. A restarted leader hears
    /// everyone's metadata as leaders do; its sync in the stable group gets the current
    /// assignment, as Kafka's coordinator answers.
    fn replace_static_member(
        &mut self,
        now_ms: u64,
        old_member_id: String,
        request: JoinRequest,
        new_member_id: String,
    ) -> Joined {
        let old = self
            .members
            .remove(&old_member_id)
            .expect("an instance maps to a member");
        if let Some(is_join) = self.waiting.remove(&old_member_id) {
            let fenced = ClassicError::FencedInstanceId;
            let reply = if is_join {
                Reply::Join(JoinAnswer::refused(fenced, old_member_id.clone()))
            } else {
                Reply::Sync(Err(fenced))
            };
            self.replies.push((old_member_id.clone(), reply));
        }
        let unchanged = old.protocols == request.protocols;
        let was_leader = self.leader.as_deref() == Some(old_member_id.as_str());
        if was_leader {
            self.leader = Some(new_member_id.clone());
        }
        let instance = request.instance_id.clone().expect("a static member");
        self.instances.insert(instance, new_member_id.clone());
        self.members.insert(
            new_member_id.clone(),
            Member::joined(now_ms, request, old.assignment),
        );
        if self.state == ClassicState::Stable && unchanged {
            return Joined::Now(self.join_answer(&new_member_id));
        }
        self.waiting.insert(new_member_id.clone(), true);
        if self.state != ClassicState::PreparingRebalance {
            self.prepare_rebalance(now_ms, Some(&new_member_id));
        }
        self.complete_join_if_all_joined();
        Joined::Wait {
            member_id: new_member_id,
        }
    }

    /// Every member must rejoin; those waiting on a sync hear REBALANCE_IN_PROGRESS.
    fn prepare_rebalance(&mut self, now_ms: u64, joined: Option<&str>) {
        for (id, member) in &mut self.members {
            member.joined = Some(id.as_str()) == joined;
        }
        for id in self.take_syncing() {
            self.replies
                .push((id, Reply::Sync(Err(ClassicError::RebalanceInProgress))));
        }
        let timeout = self
            .members
            .values()
            .map(|member| member.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        if self.state == ClassicState::Empty && self.initial_delay_ms > 0 {
            // As Kafka's coordinator: a group out of Empty waits the initial delay for more
            // members before the first generation, even once everyone known has joined.
            let delay = self.initial_delay_ms;
            self.initial_join = Some((delay, u64::from(timeout).saturating_sub(delay)));
            self.new_member_added = false;
            self.rebalance_deadline_ms = Some(now_ms + delay);
        } else {
            self.initial_join = None;
            self.rebalance_deadline_ms = Some(now_ms + u64::from(timeout));
        }
        self.state = ClassicState::PreparingRebalance;
    }

    /// The members waiting on a sync, who stop waiting: the caller answers them.
    fn take_syncing(&mut self) -> Vec<String> {
        let syncing: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, is_join)| !**is_join)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &syncing {
            self.waiting.remove(id);
        }
        syncing
    }

    fn complete_join_if_all_joined(&mut self) {
        // The initial delay waits for members to come, and so does an id handed out with
        // MEMBER_ID_REQUIRED (its client is on its way back, as Kafka's coordinator counts
        // it); once no member is left there is nothing to wait for, and the group is Empty.
        if self.state == ClassicState::PreparingRebalance
            && ((self.initial_join.is_none() && self.pending.is_empty()) || self.members.is_empty())
            && self.members.values().all(|member| member.joined)
        {
            self.complete_join();
        }
    }

    /// Ends the join phase: members that did not rejoin are dropped, the generation moves on,
    /// and every member that joined hears of it (the leader with everyone's metadata).
    /// Returns the members dropped.
    fn complete_join(&mut self) -> Vec<String> {
        let dropped: Vec<String> = self
            .members
            .iter()
            .filter(|(_, member)| !member.joined)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &dropped {
            self.remove_member(id);
        }
        self.generation += 1;
        self.rebalance_deadline_ms = None;
        self.initial_join = None;
        self.new_member_added = false;
        if self.members.is_empty() {
            self.state = ClassicState::Empty;
            self.protocol = None;
            self.leader = None;
            return dropped;
        }
        self.protocol = self.common_protocol(None);
        if self
            .leader
            .as_ref()
            .is_none_or(|leader| !self.members.contains_key(leader))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = ClassicState::CompletingRebalance;
        let joined: Vec<String> = self.members.keys().cloned().collect();
        for id in joined {
            if self.waiting.get(&id) == Some(&true) {
                self.waiting.remove(&id);
                let answer = self.join_answer(&id);
                self.replies.push((id, Reply::Join(answer)));
            }
        }
        dropped
    }

    fn join_answer(&self, member_id: &str) -> JoinAnswer {
        let protocol = self.protocol.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            self.members
                .iter()
                .map(|(id, member)| (id.clone(), self.chosen_metadata(member)))
                .collect()
        } else {
            Vec::new()
        };
        JoinAnswer {
            error: None,
            member_id: member_id.to_string(),
            generation: self.generation,
            protocol_type: self.protocol_type().unwrap_or_default().to_string(),
            protocol,
            leader,
            members,
        }
    }

    /// The protocol every member (and `joining`, counted as a member) supports, in the order
    /// of preference of the first of them (the leader's, once there is one).
    fn common_protocol(&self, joining: Option<&JoinRequest>) -> Option<String> {
        let others = self
            .members
            .iter()
            .filter(|(id, _)| joining.is_none_or(|request| **id != request.member_id))
            .map(|(_, member)| &member.protocols);
        let all: Vec<&Vec<(String, Bytes)>> = joining
            .map(|request| &request.protocols)
            .into_iter()
            .chain(others)
            .collect();
        let preference = self
            .leader
            .as_ref()
            .and_then(|leader| self.members.get(leader))
            .map(|leader| &leader.protocols)
            .or_else(|| all.first().copied())?;
        preference
            .iter()
            .map(|(name, _)| name)
            .find(|name| {
                all.iter()
                    .all(|protocols| protocols.iter().any(|(other, _)| other == *name))
            })
            .cloned()
    }

    /// A SyncGroup: the leader's carries the assignments and completes the rebalance.
    pub fn sync(
        &mut self,
        now_ms: u64,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<Synced, ClassicError> {
        let synced = self.sync_inner(now_ms, member_id, generation, assignments);
        self.assert_invariants();
        synced
    }

    fn sync_inner(
        &mut self,
        now_ms: u64,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<Synced, ClassicError> {
        self.check_member(member_id, generation)?;
        self.members.get_mut(member_id).expect("checked").heard_ms = now_ms;
        match self.state {
            ClassicState::Empty => Err(ClassicError::UnknownMember),
            ClassicState::PreparingRebalance => Err(ClassicError::RebalanceInProgress),
            ClassicState::Stable => Ok(Synced::Now(self.members[member_id].assignment.clone())),
            ClassicState::CompletingRebalance => {
                if self.leader.as_deref() != Some(member_id) {
                    self.waiting.insert(member_id.to_string(), false);
                    return Ok(Synced::Wait);
                }
                let mut assignments: BTreeMap<String, Bytes> = assignments.into_iter().collect();
                for (id, member) in &mut self.members {
                    member.assignment = assignments.remove(id).unwrap_or_default();
                }
                self.state = ClassicState::Stable;
                for id in self.take_syncing() {
                    let assignment = self.members[&id].assignment.clone();
                    self.replies.push((id, Reply::Sync(Ok(assignment))));
                }
                Ok(Synced::Now(self.members[member_id].assignment.clone()))
            }
        }
    }

    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        member_id: &str,
        generation: i32,
    ) -> Result<(), ClassicError> {
        if self.state == ClassicState::Empty {
            return Err(ClassicError::UnknownMember);
        }
        let known = self
            .members
            .get_mut(member_id)
            .ok_or(ClassicError::UnknownMember);
        known?.heard_ms = now_ms;
        if self.state == ClassicState::PreparingRebalance {
            return Err(ClassicError::RebalanceInProgress);
        }
        if generation != self.generation {
            return Err(ClassicError::IllegalGeneration);
        }
        Ok(())
    }

    /// A member leaves: the others rebalance without it.
    pub fn leave(&mut self, now_ms: u64, member_id: &str) -> Result<(), ClassicError> {
        if !self.members.contains_key(member_id) {
            // An id handed out with MEMBER_ID_REQUIRED that never joined leaves quietly.
            return match self.pending.remove(member_id) {
                Some(_) => Ok(()),
                None => Err(ClassicError::UnknownMember),
            };
        }
        self.remove_member(member_id);
        self.rebalance_without_removed(now_ms);
        self.assert_invariants();
        Ok(())
    }

    fn remove_member(&mut self, member_id: &str) {
        if let Some(instance) = self
            .members
            .remove(member_id)
            .and_then(|member| member.instance_id)
        {
            self.instances.remove(&instance);
        }
        if let Some(is_join) = self.waiting.remove(member_id) {
            let reply = if is_join {
                Reply::Join(JoinAnswer::refused(
                    ClassicError::UnknownMember,
                    member_id.to_string(),
                ))
            } else {
                Reply::Sync(Err(ClassicError::UnknownMember))
            };
            self.replies.push((member_id.to_string(), reply));
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = None;
        }
    }

    /// After members were removed: a group with members rebalances (or finishes the rebalance
    /// in progress if everyone left has rejoined); an empty one is Empty at the next generation.
    fn rebalance_without_removed(&mut self, now_ms: u64) {
        match self.state {
            ClassicState::PreparingRebalance => self.complete_join_if_all_joined(),
            ClassicState::Empty => {}
            ClassicState::CompletingRebalance | ClassicState::Stable => {
                if self.members.is_empty() {
                    self.complete_join();
                } else {
                    self.prepare_rebalance(now_ms, None);
                }
            }
        }
    }

    /// Drops members not heard from within their session timeout (members waiting on a join
    /// wait out the rebalance instead), and ends a rebalance whose deadline passed. Returns
    /// the ids of the members dropped.
    pub fn tick(&mut self, now_ms: u64) -> Vec<String> {
        let pending = self.pending.len();
        self.pending
            .retain(|_, (since, timeout)| now_ms <= *since + u64::from(*timeout));
        if self.pending.len() < pending {
            // A join held for a pending id that never came back goes on without it.
            self.complete_join_if_all_joined();
        }
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(id, member)| {
                self.waiting.get(*id) != Some(&true)
                    && now_ms > member.heard_ms + u64::from(member.session_timeout_ms)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.remove_member(id);
        }
        if !expired.is_empty() {
            self.rebalance_without_removed(now_ms);
        }
        if self.state == ClassicState::PreparingRebalance
            && self
                .rebalance_deadline_ms
                .is_some_and(|deadline| now_ms >= deadline)
        {
            // Kafka's tryCompleteInitialRebalanceElseSchedule: a member came during the
            // initial delay and time is left: wait once more.
            if let Some((delay, remaining)) = self.initial_join
                && self.new_member_added
                && remaining > 0
            {
                let next = self.initial_delay_ms.min(remaining);
                self.new_member_added = false;
                self.initial_join = Some((next, remaining.saturating_sub(delay)));
                self.rebalance_deadline_ms = Some(now_ms + next);
                self.assert_invariants();
                return expired;
            }
            let stragglers = self.complete_join();
            self.assert_invariants();
            return expired.into_iter().chain(stragglers).collect();
        }
        self.assert_invariants();
        expired
    }

    /// May this member commit at this generation? Member "" at generation -1 is a consumer
    /// without a group membership (assign mode): only while the group has no members. A member
    /// of the current generation may commit while the group prepares a rebalance.
    pub fn check_commit(&self, member_id: &str, generation: i32) -> Result<(), ClassicError> {
        if member_id.is_empty() && generation < 0 {
            return if self.members.is_empty() {
                Ok(())
            } else {
                Err(ClassicError::IllegalGeneration)
            };
        }
        self.check_member(member_id, generation)?;
        // As Kafka's coordinator: members commit what they processed before rejoining (an
        // eager consumer commits as it gives its partitions up), but not between the join and
        // the assignment of a new generation.
        if self.state == ClassicState::CompletingRebalance {
            return Err(ClassicError::RebalanceInProgress);
        }
        Ok(())
    }

    /// The member id an instance holds now (a LeaveGroup may name only the instance).
    pub fn member_of_instance(&self, instance_id: &str) -> Option<&str> {
        self.instances.get(instance_id).map(String::as_str)
    }

    /// A request naming an instance id must come from the member holding it now.
    pub fn check_instance(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ClassicError> {
        match instance_id {
            Some(instance)
                if self.instances.get(instance).map(String::as_str) != Some(member_id) =>
            {
                Err(ClassicError::FencedInstanceId)
            }
            _ => Ok(()),
        }
    }

    fn check_member(&self, member_id: &str, generation: i32) -> Result<(), ClassicError> {
        if !self.members.contains_key(member_id) {
            return Err(ClassicError::UnknownMember);
        }
        if generation != self.generation {
            return Err(ClassicError::IllegalGeneration);
        }
        Ok(())
    }

    fn assert_invariants(&self) {
        if cfg!(debug_assertions) {
            if let Some(leader) = &self.leader {
                assert!(self.members.contains_key(leader), "the leader is a member");
            }
            assert_eq!(
                self.members.is_empty(),
                self.state == ClassicState::Empty,
                "empty exactly without members"
            );
            if matches!(
                self.state,
                ClassicState::CompletingRebalance | ClassicState::Stable
            ) {
                let protocol = self.protocol.as_ref().expect("a protocol was chosen");
                assert!(
                    self.members
                        .values()
                        .all(|member| member.protocols.iter().any(|(name, _)| name == protocol)),
                    "every member supports the chosen protocol"
                );
            }
            let members: BTreeSet<&String> = self.members.keys().collect();
            assert!(
                self.waiting.keys().all(|id| members.contains(id)),
                "only members wait"
            );
        }
    }
}

#[cfg(test)]
mod tests;
