//! A share group's membership (KIP-932's ShareGroupHeartbeat), held by the group's coordinator.
//!
//! Unlike a consumer group, a partition may go to several members at once (the share-partition
//! on its leader hands each record to one of them), so nothing is revoked before it is moved:
//! a new assignment takes effect at once. Every change that moves partitions (a member joins,
//! leaves, expires or changes its subscription; a subscribed topic's partition count changes)
//! bumps the group epoch; each member hears its new assignment on its next heartbeat, which
//! brings its member epoch to the group's.
//!
//! The assignment (Kafka's simple assignor in spirit): each topic's partitions are dealt over
//! the members subscribing to it in member-id order; with more members than partitions, each
//! member gets one partition and the partitions are shared round-robin.

use std::collections::{BTreeMap, BTreeSet};

/// Why a heartbeat was refused, as Kafka's error codes name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("member {0} is not in the group")]
    UnknownMember(String),
    #[error("member epoch {sent} is not the member's ({current})")]
    FencedMemberEpoch { sent: i32, current: i32 },
    #[error("{0}")]
    Invalid(&'static str),
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareHeartbeatAnswer {
    pub member_epoch: i32,
    /// The member's partitions by topic, when they changed since the member last heard
    /// (`None`: unchanged).
    pub assignment: Option<BTreeMap<String, Vec<u32>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMember {
    pub epoch: i32,
    pub topics: BTreeSet<String>,
    pub rack: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub last_seen_ms: i64,
    pub assignment: BTreeMap<String, Vec<u32>>,
    /// The member heard its assignment as of this group epoch.
    heard_epoch: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareGroup {
    epoch: i32,
    members: BTreeMap<String, ShareMember>,
    /// Partition counts of the topics members subscribe to (absent: unknown or deleted).
    partitions: BTreeMap<String, u32>,
}

/// Who is heartbeating: what Kafka's ShareGroupHeartbeat carries besides epochs.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat<'a> {
    pub member: &'a str,
    pub member_epoch: i32,
    /// `None`: unchanged since the last heartbeat.
    pub topics: Option<Vec<String>>,
    pub rack: Option<String>,
    pub client_id: &'a str,
    pub client_host: &'a str,
}

impl ShareGroup {
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    pub fn members(&self) -> &BTreeMap<String, ShareMember> {
        &self.members
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The topics any member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|member| member.topics.iter().cloned())
            .collect()
    }

    /// A member's heartbeat at `now_ms`: epoch 0 joins, -1 leaves, any other must be the
    /// member's own.
    pub fn heartbeat(
        &mut self,
        beat: Heartbeat<'_>,
        now_ms: i64,
    ) -> Result<ShareHeartbeatAnswer, HeartbeatError> {
        if beat.member.is_empty() {
            return Err(HeartbeatError::Invalid("the member id is empty"));
        }
        match beat.member_epoch {
            -1 => {
                if self.members.remove(beat.member).is_some() {
                    self.reassign();
                }
                return Ok(ShareHeartbeatAnswer {
                    member_epoch: -1,
                    assignment: None,
                });
            }
            0 => {
                let Some(topics) = beat.topics.clone() else {
                    return Err(HeartbeatError::Invalid(
                        "a joining member names the topics it subscribes to",
                    ));
                };
                // A member joining again (it restarted, or lost its answer) starts afresh.
                self.members.insert(
                    beat.member.to_string(),
                    ShareMember {
                        epoch: 0,
                        topics: topics.into_iter().collect(),
                        rack: beat.rack.clone(),
                        client_id: beat.client_id.to_string(),
                        client_host: beat.client_host.to_string(),
                        last_seen_ms: now_ms,
                        assignment: BTreeMap::new(),
                        heard_epoch: -1,
                    },
                );
                self.reassign();
            }
            sent => {
                let Some(member) = self.members.get_mut(beat.member) else {
                    return Err(HeartbeatError::UnknownMember(beat.member.to_string()));
                };
                if sent != member.epoch {
                    return Err(HeartbeatError::FencedMemberEpoch {
                        sent,
                        current: member.epoch,
                    });
                }
                member.last_seen_ms = now_ms;
                if let Some(topics) = beat.topics.clone() {
                    let topics: BTreeSet<String> = topics.into_iter().collect();
                    if topics != member.topics {
                        member.topics = topics;
                        self.reassign();
                    }
                }
            }
        }
        let epoch = self.epoch;
        let member = self
            .members
            .get_mut(beat.member)
            .expect("the member is in the group");
        member.epoch = epoch;
        let assignment = (member.heard_epoch != epoch).then(|| member.assignment.clone());
        member.heard_epoch = epoch;
        Ok(ShareHeartbeatAnswer {
            member_epoch: epoch,
            assignment,
        })
    }

    /// Members silent for longer than `session_timeout_ms` leave; the ids of those that did.
    pub fn expire(&mut self, now_ms: i64, session_timeout_ms: i64) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, member)| now_ms - member.last_seen_ms > session_timeout_ms)
            .map(|(id, _)| id.clone())
            .collect();
        if !expired.is_empty() {
            for id in &expired {
                self.members.remove(id);
            }
            self.reassign();
        }
        expired
    }

    /// The subscribed topics' partition counts (a topic missing: none). A change reassigns.
    pub fn set_partitions(&mut self, counts: BTreeMap<String, u32>) {
        if counts != self.partitions {
            self.partitions = counts;
            self.reassign();
        }
    }

    fn reassign(&mut self) {
        self.epoch += 1;
        let mut assignments: BTreeMap<&str, BTreeMap<String, Vec<u32>>> = BTreeMap::new();
        for (topic, &count) in &self.partitions {
            let subscribers: Vec<&str> = self
                .members
                .iter()
                .filter(|(_, member)| member.topics.contains(topic))
                .map(|(id, _)| id.as_str())
                .collect();
            if subscribers.is_empty() || count == 0 {
                continue;
            }
            let spread = subscribers.len().max(count as usize);
            for slot in 0..spread {
                let member = subscribers[slot % subscribers.len()];
                let partition = (slot % count as usize) as u32;
                let partitions = assignments
                    .entry(member)
                    .or_default()
                    .entry(topic.clone())
                    .or_default();
                if !partitions.contains(&partition) {
                    partitions.push(partition);
                }
            }
        }
        let mut next: BTreeMap<String, BTreeMap<String, Vec<u32>>> = assignments
            .into_iter()
            .map(|(member, topics)| (member.to_string(), topics))
            .collect();
        for (id, member) in &mut self.members {
            member.assignment = next.remove(id).unwrap_or_default();
            for partitions in member.assignment.values_mut() {
                partitions.sort_unstable();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join<'a>(member: &'a str, topics: &[&str]) -> Heartbeat<'a> {
        Heartbeat {
            member,
            member_epoch: 0,
            topics: Some(topics.iter().map(|t| t.to_string()).collect()),
            ..Heartbeat::default()
        }
    }

    fn beat(member: &str, epoch: i32) -> Heartbeat<'_> {
        Heartbeat {
            member,
            member_epoch: epoch,
            ..Heartbeat::default()
        }
    }

    fn counts(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn more_members_than_partitions_share_them() {
        let mut group = ShareGroup::default();
        let mut epochs = BTreeMap::new();
        for member in ["a", "b", "c"] {
            let answer = group.heartbeat(join(member, &["t"]), 0).unwrap();
            epochs.insert(member, answer.member_epoch);
        }
        group.set_partitions(counts(&[("t", 1)]));
        for member in ["a", "b", "c"] {
            let answer = group.heartbeat(beat(member, epochs[member]), 0).unwrap();
            assert_eq!(answer.member_epoch, group.epoch());
            assert_eq!(answer.assignment.unwrap()["t"], vec![0]);
        }
        // Heard: no assignment again until it changes.
        let epoch = group.epoch();
        assert_eq!(
            group.heartbeat(beat("a", epoch), 0).unwrap().assignment,
            None
        );
    }

    #[test]
    fn partitions_are_dealt_over_fewer_members() {
        let mut group = ShareGroup::default();
        group.heartbeat(join("a", &["t"]), 0).unwrap();
        group.heartbeat(join("b", &["t", "u"]), 0).unwrap();
        group.set_partitions(counts(&[("t", 5), ("u", 2)]));
        let a = &group.members()["a"].assignment;
        let b = &group.members()["b"].assignment;
        assert_eq!(a["t"], vec![0, 2, 4]);
        assert_eq!(b["t"], vec![1, 3]);
        assert_eq!(b["u"], vec![0, 1]);
        assert!(!a.contains_key("u"));
    }

    #[test]
    fn stale_epochs_and_strangers_are_refused_and_leaving_reassigns() {
        let mut group = ShareGroup::default();
        let a = group.heartbeat(join("a", &["t"]), 0).unwrap();
        group.set_partitions(counts(&[("t", 2)]));
        let a = group.heartbeat(beat("a", a.member_epoch), 0).unwrap();
        assert_eq!(a.assignment.unwrap()["t"], vec![0, 1]);
        let b = group.heartbeat(join("b", &["t"]), 0).unwrap();
        assert_eq!(b.assignment.unwrap()["t"], vec![1]);
        assert!(matches!(
            group.heartbeat(beat("a", a.member_epoch - 1), 0),
            Err(HeartbeatError::FencedMemberEpoch { .. })
        ));
        assert!(matches!(
            group.heartbeat(beat("z", 5), 0),
            Err(HeartbeatError::UnknownMember(_))
        ));
        let a = group.heartbeat(beat("a", a.member_epoch), 0).unwrap();
        assert_eq!(a.assignment.unwrap()["t"], vec![0]);
        group.heartbeat(beat("b", -1), 0).unwrap();
        let a = group.heartbeat(beat("a", a.member_epoch), 0).unwrap();
        assert_eq!(a.assignment.unwrap()["t"], vec![0, 1]);
    }

    #[test]
    fn silent_members_expire() {
        let mut group = ShareGroup::default();
        group.heartbeat(join("a", &["t"]), 0).unwrap();
        group.heartbeat(join("b", &["t"]), 1_000).unwrap();
        assert_eq!(group.expire(45_500, 45_000), vec!["a".to_string()]);
        assert_eq!(group.members().len(), 1);
    }
}
