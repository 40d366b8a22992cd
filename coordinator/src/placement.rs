//! Replica placement and leader choice: pure functions over cluster state, no IO.

use std::collections::BTreeSet;

use crate::{BrokerInfo, CoordinatorError, PartitionState};

/// The leader value of a partition that has none (every in-sync replica is down).
pub const NO_LEADER: i32 = -1;

/// Leader and ISR changes after brokers die or return. For each partition whose leader is not
/// live, the first live in-sync replica takes over (leader epoch + 1). With none live, the
/// partition has no leader (it is unavailable rather than silently moved), unless `unclean`
/// allows a live replica outside the ISR. A leaderless partition gets a leader back as soon as an
/// in-sync replica is live again. Dead brokers leave the ISR (as Kafka's controller does), so a
/// live leader's high watermark stops waiting for them; a leaderless partition keeps its last
/// ISR, so that only one of those replicas can lead it again. Returns only the partitions that
/// change, each with `partition_epoch` + 1.
pub fn failover(
    partitions: &[PartitionState],
    live: &BTreeSet<i32>,
    unclean: bool,
) -> Vec<PartitionState> {
    let mut changes = Vec::new();
    for partition in partitions {
        let live_isr: Vec<i32> = partition
            .isr
            .iter()
            .copied()
            .filter(|r| live.contains(r))
            .collect();
        if live.contains(&partition.leader) {
            if live_isr.len() != partition.isr.len() {
                let mut next = partition.clone();
                next.isr = live_isr;
                next.partition_epoch += 1;
                changes.push(next);
            }
            continue;
        }
        let any = partition
            .replicas
            .iter()
            .copied()
            .find(|r| live.contains(r));
        let leader = match (live_isr.first(), any) {
            (Some(&leader), _) => leader,
            (None, Some(leader)) if unclean => leader,
            _ => NO_LEADER,
        };
        if leader == partition.leader {
            continue;
        }
        let mut next = partition.clone();
        next.leader = leader;
        next.leader_epoch += 1;
        next.partition_epoch += 1;
        if leader == NO_LEADER {
            // Keep the last ISR: one of them must come back to lead.
        } else if live_isr.is_empty() {
            // An unclean election: the new leader's log defines the ISR from now on.
            next.isr = vec![leader];
        } else {
            next.isr = live_isr;
        }
        changes.push(next);
    }
    changes
}

/// The first step of a reassignment: validates `target` against the live brokers and returns
/// the partition with the new replicas added to the old (`target_replicas` remembers the goal,
/// `reassigning_from` the replicas the first of a run of reassignments started from). New
/// replicas catch up as followers and join the ISR like any lagging follower. An empty
/// `target` cancels the reassignment under way: the goal becomes the replicas it started from,
/// all still replicas and so soon complete (Kafka's cancel).
pub fn start_reassignment(
    current: &PartitionState,
    target: &[i32],
    brokers: &BTreeSet<i32>,
) -> Result<PartitionState, CoordinatorError> {
    let invalid = |why: String| Err(CoordinatorError::InvalidReplicaAssignment(why));
    let target = if target.is_empty() {
        match (&current.target_replicas, &current.reassigning_from) {
            (Some(_), Some(from)) => from.clone(),
            _ => {
                return Err(CoordinatorError::NoReassignmentInProgress(format!(
                    "partition {} is not being reassigned",
                    current.partition
                )));
            }
        }
    } else {
        target.to_vec()
    };
    let distinct: BTreeSet<i32> = target.iter().copied().collect();
    if distinct.len() != target.len() {
        return invalid(format!("replicas {target:?} repeat a broker"));
    }
    if let Some(unknown) = target
        .iter()
        .find(|id| !brokers.contains(id) && !current.replicas.contains(id))
    {
        return invalid(format!("broker {unknown} is not registered"));
    }
    let mut next = current.clone();
    for id in &target {
        if !next.replicas.contains(id) {
            next.replicas.push(*id);
        }
    }
    if next.reassigning_from.is_none() {
        next.reassigning_from = Some(current.replicas.clone());
    }
    next.target_replicas = Some(target);
    next.partition_epoch += 1;
    Ok(next)
}

/// The last step of a reassignment, once every target replica is in the ISR: the replica set
/// becomes the target; replicas outside it leave the ISR; if the leader is one of them,
/// leadership moves to an in-sync target replica (epoch + 1). `None` while replicas are still
/// catching up (or no reassignment runs).
pub fn complete_reassignment(current: &PartitionState) -> Option<PartitionState> {
    let target = current.target_replicas.as_ref()?;
    if !target.iter().all(|id| current.isr.contains(id)) {
        return None;
    }
    let mut next = current.clone();
    next.replicas = target.clone();
    next.isr.retain(|id| target.contains(id));
    next.target_replicas = None;
    next.reassigning_from = None;
    next.partition_epoch += 1;
    if !target.contains(&current.leader) {
        next.leader = target[0];
        next.leader_epoch += 1;
    }
    Some(next)
}

/// Kafka's preferred leader election: leadership goes back to the partition's preferred replica
/// (the first of `replicas`, where placement spreads leaders evenly) when that replica is live,
/// in sync and not leading. After a broker fails and returns, its leaderships stay with the
/// brokers that took them over until this moves them back, and one broker carries the produce
/// traffic of several. As safe as a failover: the new leader is in the ISR, so it holds every
/// committed record. `None` when nothing moves: the preferred replica leads, is down or behind,
/// the partition has no leader (failover's case) or a reassignment is under way (its target
/// decides the replicas). Leader epoch + 1, partition epoch + 1; the ISR stays.
pub fn prefer_leader(current: &PartitionState, live: &BTreeSet<i32>) -> Option<PartitionState> {
    let preferred = *current.replicas.first()?;
    if preferred == current.leader
        || current.leader == NO_LEADER
        || current.target_replicas.is_some()
        || !live.contains(&preferred)
        || !current.isr.contains(&preferred)
    {
        return None;
    }
    Some(crate::PartitionChange::PreferredLeader.apply(current))
}

/// Broker ids ordered so that consecutive ids are on different racks where possible (Kafka's
/// rack-aware order): racks in name order, each rack's brokers by id, taken round robin. Any
/// window of consecutive ids then spans as many racks as it can, so the placement below, which
/// takes `replication_factor` consecutive ids, spreads each partition over racks.
fn rack_alternating(brokers: &[BrokerInfo]) -> Vec<i32> {
    let mut racks: std::collections::BTreeMap<Option<&str>, Vec<i32>> = Default::default();
    for broker in brokers {
        racks
            .entry(broker.rack.as_deref())
            .or_default()
            .push(broker.id);
    }
    for ids in racks.values_mut() {
        ids.sort_unstable();
    }
    let mut ordered = Vec::with_capacity(brokers.len());
    for round in 0.. {
        let before = ordered.len();
        for ids in racks.values() {
            if let Some(id) = ids.get(round) {
                ordered.push(*id);
            }
        }
        if ordered.len() == before {
            break;
        }
    }
    ordered
}

/// Places `partitions` partitions with `replication_factor` replicas each over `brokers`:
/// replicas of one partition on distinct brokers, and the preferred leader (first replica)
/// rotating so leadership spreads evenly. `start` offsets the rotation (e.g. by topic count) so
/// many small topics do not all lead on the same broker.
pub fn place(
    brokers: &[BrokerInfo],
    partitions: u32,
    replication_factor: u16,
    start: usize,
) -> Result<Vec<PartitionState>, String> {
    if brokers.is_empty() {
        return Err("no live brokers".into());
    }
    if partitions == 0 {
        return Err("a topic needs at least one partition".into());
    }
    let replication_factor = usize::from(replication_factor);
    if replication_factor == 0 || replication_factor > brokers.len() {
        return Err(format!(
            "replication factor {replication_factor} needs 1 to {} live brokers",
            brokers.len()
        ));
    }
    let ids = rack_alternating(brokers);
    Ok((0..partitions)
        .map(|partition| {
            let first = (start + partition as usize) % ids.len();
            let replicas: Vec<i32> = (0..replication_factor)
                .map(|k| ids[(first + k) % ids.len()])
                .collect();
            PartitionState::initial(partition, replicas)
        })
        .collect())
}

/// A new topic's partitions as `spec` asks: placed by [`place`], or as its `assignment` says.
pub fn for_new_topic(
    brokers: &[BrokerInfo],
    spec: &crate::TopicSpec,
    start: usize,
) -> Result<Vec<PartitionState>, crate::CoordinatorError> {
    if spec.assignment.is_empty() {
        return place(brokers, spec.partitions, spec.replication_factor, start)
            .map_err(crate::CoordinatorError::Invalid);
    }
    let partitions = assigned(brokers, &spec.assignment)
        .map_err(crate::CoordinatorError::InvalidReplicaAssignment)?;
    if partitions.len() != spec.partitions as usize
        || partitions[0].replicas.len() != usize::from(spec.replication_factor)
    {
        return Err(crate::CoordinatorError::InvalidReplicaAssignment(format!(
            "{} partitions of {} replicas assigned, for a topic of {} partitions of {}",
            partitions.len(),
            partitions[0].replicas.len(),
            spec.partitions,
            spec.replication_factor
        )));
    }
    Ok(partitions)
}

/// Partitions placed by hand (Kafka's replica assignment): partition `i` on `assignment[i]`,
/// its first replica leading. Every partition needs the same number of replicas, each a
/// registered broker and none twice.
pub fn assigned(
    brokers: &[BrokerInfo],
    assignment: &[Vec<i32>],
) -> Result<Vec<PartitionState>, String> {
    let Some(first) = assignment.first() else {
        return Err("no partitions assigned".into());
    };
    let replication_factor = first.len();
    assignment
        .iter()
        .enumerate()
        .map(|(partition, replicas)| {
            if replicas.is_empty() || replicas.len() != replication_factor {
                return Err(format!(
                    "partition {partition} has {} replicas where partition 0 has {replication_factor}",
                    replicas.len()
                ));
            }
            for (at, id) in replicas.iter().enumerate() {
                if replicas[..at].contains(id) {
                    return Err(format!("partition {partition} names broker {id} twice"));
                }
                if !brokers.iter().any(|broker| broker.id == *id) {
                    return Err(format!(
                        "partition {partition} names broker {id}, which is not registered"
                    ));
                }
            }
            Ok(PartitionState::initial(partition as u32, replicas.clone()))
        })
        .collect()
}

/// The partitions that grow `topic` to `partitions` in total: placed by [`grow`], or, when
/// `assignment` is not empty, on its brokers (one entry per new partition, each of the
/// topic's replication factor).
pub fn grow_as_asked(
    brokers: &[BrokerInfo],
    topic: &crate::TopicState,
    partitions: u32,
    assignment: &[Vec<i32>],
) -> Result<Vec<PartitionState>, crate::CoordinatorError> {
    if assignment.is_empty() {
        return grow(brokers, topic, partitions).map_err(crate::CoordinatorError::Invalid);
    }
    let current = topic.partitions.len() as u32;
    let invalid = crate::CoordinatorError::InvalidReplicaAssignment;
    if partitions <= current || (partitions - current) as usize != assignment.len() {
        return Err(invalid(format!(
            "topic {} grows from {current} to {partitions} partitions: {} assigned",
            topic.name,
            assignment.len()
        )));
    }
    if assignment[0].len() != usize::from(topic.replication_factor) {
        return Err(invalid(format!(
            "topic {} has {} replicas per partition; {} assigned",
            topic.name,
            topic.replication_factor,
            assignment[0].len()
        )));
    }
    let mut added = assigned(brokers, assignment).map_err(invalid)?;
    for partition in &mut added {
        partition.partition += current;
    }
    Ok(added)
}

/// The partitions that grow `topic` to `partitions` in total, numbered after the existing
/// ones and placed as [`place`] places a new topic's (the rotation continues where it was).
pub fn grow(
    brokers: &[BrokerInfo],
    topic: &crate::TopicState,
    partitions: u32,
) -> Result<Vec<PartitionState>, String> {
    let current = topic.partitions.len() as u32;
    if partitions <= current {
        return Err(format!(
            "topic {} has {current} partitions; partitions can only be added (asked for {partitions})",
            topic.name
        ));
    }
    let mut added = place(
        brokers,
        partitions - current,
        topic.replication_factor,
        current as usize,
    )?;
    for partition in &mut added {
        partition.partition += current;
    }
    Ok(added)
}

/// Why an election on request moves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionRefused {
    /// The replica the election wants already leads.
    NotNeeded,
    /// A preferred election's preferred replica is down or out of sync, or the partition is
    /// being reassigned (the reassignment decides its replicas).
    PreferredNotAvailable,
    /// An unclean election found no live replica.
    NoEligibleLeader,
}

/// Kafka's ElectLeaders for one partition. Preferred: leadership goes to the first replica
/// when it is live and in sync, also when the partition has no leader. Unclean: only for a
/// partition whose leader is down; its first live in-sync replica if any (a clean election),
/// else its first live replica, records the old leader had beyond it lost.
pub fn elect(
    current: &PartitionState,
    live: &BTreeSet<i32>,
    unclean: bool,
) -> Result<crate::PartitionChange, ElectionRefused> {
    if unclean {
        if live.contains(&current.leader) {
            return Err(ElectionRefused::NotNeeded);
        }
        let in_sync = current.isr.iter().find(|id| live.contains(id));
        let any = current.replicas.iter().find(|id| live.contains(id));
        return match (in_sync, any) {
            (Some(&leader), _) | (None, Some(&leader)) => {
                Ok(crate::PartitionChange::UncleanLeader(leader))
            }
            (None, None) => Err(ElectionRefused::NoEligibleLeader),
        };
    }
    let preferred = current.replicas[0];
    if preferred == current.leader {
        return Err(ElectionRefused::NotNeeded);
    }
    if current.target_replicas.is_some()
        || !live.contains(&preferred)
        || !current.isr.contains(&preferred)
    {
        return Err(ElectionRefused::PreferredNotAvailable);
    }
    Ok(crate::PartitionChange::PreferredLeader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(count: i32) -> Vec<BrokerInfo> {
        (0..count)
            .map(|id| BrokerInfo {
                id,
                host: "127.0.0.1".into(),
                port: 7300,
                shard_ports: vec![],
                replication_ports: vec![],
                replication_host: None,
                rack: None,
                kafka_port: None,
                kafka_listeners: Vec::new(),
                native_listeners: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn assigned_partitions_take_their_replicas_and_bad_assignments_are_refused() {
        let brokers = brokers(3);
        let placed = assigned(&brokers, &[vec![2, 0], vec![1, 2]]).unwrap();
        assert_eq!(placed[0], PartitionState::initial(0, vec![2, 0]));
        assert_eq!(placed[1].leader, 1);
        assert_eq!(placed[1].isr, [1, 2]);
        for (assignment, why) in [
            (vec![], "no partitions"),
            (vec![vec![0], vec![0, 1]], "replicas"),
            (vec![vec![]], "replicas"),
            (vec![vec![1, 1]], "twice"),
            (vec![vec![3]], "not registered"),
        ] {
            let error = assigned(&brokers, &assignment).unwrap_err();
            assert!(error.contains(why), "{assignment:?}: {error}");
        }
        // New partitions by hand: one entry each, of the topic's replication factor.
        let topic = crate::TopicState {
            name: "t".into(),
            replication_factor: 2,
            config: Default::default(),
            partitions: placed.clone(),
            id: Default::default(),
        };
        let grown = grow_as_asked(&brokers, &topic, 3, &[vec![0, 1]]).unwrap();
        assert_eq!(grown, [PartitionState::initial(2, vec![0, 1])]);
        for (partitions, assignment) in [
            (4, vec![vec![0, 1]]),
            (3, vec![vec![0]]),
            (3, vec![vec![0, 5]]),
            (2, vec![vec![0, 1]]),
        ] {
            assert!(matches!(
                grow_as_asked(&brokers, &topic, partitions, &assignment),
                Err(crate::CoordinatorError::InvalidReplicaAssignment(_))
            ));
        }
        assert_eq!(grow_as_asked(&brokers, &topic, 4, &[]).unwrap().len(), 2);
        // A spec's counts must agree with its assignment.
        let spec = |partitions, replication_factor| crate::TopicSpec {
            name: "t".into(),
            partitions,
            replication_factor,
            config: Default::default(),
            assignment: vec![vec![0, 1], vec![1, 2]],
        };
        assert_eq!(for_new_topic(&brokers, &spec(2, 2), 0).unwrap().len(), 2);
        for (partitions, replication_factor) in [(3, 2), (2, 1)] {
            assert!(matches!(
                for_new_topic(&brokers, &spec(partitions, replication_factor), 0),
                Err(crate::CoordinatorError::InvalidReplicaAssignment(_))
            ));
        }
    }

    #[test]
    fn replicas_distinct_and_leaders_balanced() {
        for broker_count in 1..6 {
            for rf in 1..=broker_count as u16 {
                for partitions in 1..20 {
                    let placed = place(&brokers(broker_count), partitions, rf, 3).unwrap();
                    let mut leaders = vec![0; broker_count as usize];
                    for state in &placed {
                        let mut replicas = state.replicas.clone();
                        replicas.sort_unstable();
                        replicas.dedup();
                        assert_eq!(replicas.len(), usize::from(rf), "distinct replicas");
                        assert!(state.isr.contains(&state.leader));
                        leaders[state.leader as usize] += 1;
                    }
                    let (min, max) = (leaders.iter().min().unwrap(), leaders.iter().max().unwrap());
                    assert!(max - min <= 1, "leaders balanced within one: {leaders:?}");
                }
            }
        }
    }

    /// Randomised: after failover every leader is live and in sync (or there is none because
    /// no in-sync replica is live), epochs only grow, and live leaders are left alone.
    #[test]
    fn failover_invariants() {
        let mut seed = 0x5eed_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let broker_count = 1 + (next() % 5) as i32;
            let brokers = brokers(broker_count);
            let rf = 1 + (next() % broker_count as u64) as u16;
            let partitions =
                place(&brokers, 1 + (next() % 12) as u32, rf, next() as usize).unwrap();
            let live: BTreeSet<i32> = (0..broker_count).filter(|_| next() % 3 != 0).collect();
            let unclean = next() % 4 == 0;
            let changes = failover(&partitions, &live, unclean);
            for change in &changes {
                let before = &partitions[change.partition as usize];
                assert_eq!(change.partition_epoch, before.partition_epoch + 1);
                if change.leader != NO_LEADER {
                    assert!(
                        change.isr.iter().all(|r| live.contains(r)),
                        "dead in the ISR"
                    );
                }
                if live.contains(&before.leader) {
                    assert_eq!(change.leader, before.leader, "live leaders stay");
                    assert_eq!(change.leader_epoch, before.leader_epoch);
                    assert!(change.isr.len() < before.isr.len());
                    continue;
                }
                assert_eq!(change.leader_epoch, before.leader_epoch + 1);
                if change.leader == NO_LEADER {
                    assert!(before.isr.iter().all(|r| !live.contains(r)));
                } else {
                    assert!(live.contains(&change.leader));
                    assert!(change.isr.contains(&change.leader));
                    assert!(unclean || before.isr.contains(&change.leader));
                }
            }
            // Applying the changes and failing over again changes nothing.
            let mut after = partitions.clone();
            for change in changes {
                let at = change.partition as usize;
                after[at] = change;
            }
            assert!(failover(&after, &live, unclean).is_empty());
        }
    }

    /// A broker that failed and came back gets its leaderships back once it is in sync, and
    /// only then; nothing else moves.
    #[test]
    fn leadership_returns_to_the_preferred_replica_once_it_is_in_sync() {
        let placed = place(&brokers(3), 6, 3, 0).unwrap();
        let everyone = BTreeSet::from([0, 1, 2]);
        assert!(
            placed.iter().all(|p| prefer_leader(p, &everyone).is_none()),
            "placement leads from the preferred replica"
        );
        let without_1 = BTreeSet::from([0, 2]);
        let failed: Vec<PartitionState> = failover(&placed, &without_1, false);
        let mut after = placed.clone();
        for change in failed {
            let at = change.partition as usize;
            after[at] = change;
        }
        let moved: Vec<u32> = placed
            .iter()
            .filter(|p| p.leader == 1)
            .map(|p| p.partition)
            .collect();
        assert!(!moved.is_empty());
        // Back, but not yet in sync: nothing moves.
        assert!(after.iter().all(|p| prefer_leader(p, &everyone).is_none()));
        for partition in &mut after {
            partition.isr = vec![0, 1, 2];
        }
        // Down again: nothing moves either.
        assert!(after.iter().all(|p| prefer_leader(p, &without_1).is_none()));
        for partition in &after {
            match prefer_leader(partition, &everyone) {
                Some(next) => {
                    assert!(moved.contains(&partition.partition));
                    assert_eq!(next.leader, 1);
                    assert_eq!(next.leader_epoch, partition.leader_epoch + 1);
                    assert_eq!(next.partition_epoch, partition.partition_epoch + 1);
                    assert_eq!(next.isr, partition.isr);
                    assert_eq!(next.replicas, partition.replicas);
                }
                None => assert!(!moved.contains(&partition.partition)),
            }
        }
        let mut leaderless = after[0].clone();
        leaderless.leader = NO_LEADER;
        assert!(
            prefer_leader(&leaderless, &everyone).is_none(),
            "failover's case"
        );
        let mut reassigning = after[moved[0] as usize].clone();
        reassigning.target_replicas = Some(vec![2, 0]);
        assert!(
            prefer_leader(&reassigning, &everyone).is_none(),
            "the reassignment decides"
        );
    }

    #[test]
    fn a_leaderless_partition_recovers_when_a_replica_returns() {
        let partitions = place(&brokers(3), 1, 2, 0).unwrap();
        let leader = partitions[0].leader;
        let other = partitions[0].replicas[1];
        let none = failover(&partitions, &BTreeSet::from([99]), false);
        assert_eq!(none[0].leader, NO_LEADER);
        let back = failover(&none, &BTreeSet::from([other]), false);
        assert_eq!(back[0].leader, other);
        assert_eq!(back[0].leader_epoch, 2);
        assert_ne!(leader, other);
    }

    #[test]
    fn replicas_spread_over_racks() {
        let mut brokers = brokers(6);
        for broker in &mut brokers {
            broker.rack = Some(["a", "b", "c"][broker.id as usize % 3].to_string());
        }
        for rf in 1..=3u16 {
            for partition in place(&brokers, 12, rf, 0).unwrap() {
                let racks: std::collections::BTreeSet<_> = partition
                    .replicas
                    .iter()
                    .map(|id| brokers[*id as usize].rack.clone())
                    .collect();
                assert_eq!(racks.len(), usize::from(rf), "{partition:?}");
            }
        }
        // Uneven racks: as many racks as possible per partition, leaders still balanced.
        let mut uneven = brokers.clone();
        for broker in &mut uneven {
            broker.rack = Some(if broker.id < 4 { "big" } else { "small" }.to_string());
        }
        let placed = place(&uneven, 6, 2, 0).unwrap();
        let mixed = placed
            .iter()
            .filter(|p| {
                let racks: std::collections::BTreeSet<_> = p
                    .replicas
                    .iter()
                    .map(|id| uneven[*id as usize].rack.clone())
                    .collect();
                racks.len() == 2
            })
            .count();
        assert!(mixed >= 4, "{placed:?}");
    }

    #[test]
    fn impossible_requests_are_errors() {
        assert!(place(&brokers(1), 3, 2, 0).is_err());
        assert!(place(&brokers(1), 0, 1, 0).is_err());
        assert!(place(&[], 1, 1, 0).is_err());
    }

    #[test]
    fn elections_on_request_move_only_what_they_may() {
        let live: BTreeSet<i32> = [1, 2, 3].into();
        let mut state = PartitionState::initial(0, vec![1, 2, 3]);
        assert_eq!(elect(&state, &live, false), Err(ElectionRefused::NotNeeded));
        state.leader = 2;
        assert_eq!(
            elect(&state, &live, false),
            Ok(crate::PartitionChange::PreferredLeader)
        );
        // Leading, so an unclean election is not needed.
        assert_eq!(elect(&state, &live, true), Err(ElectionRefused::NotNeeded));
        state.isr = vec![2, 3];
        assert_eq!(
            elect(&state, &live, false),
            Err(ElectionRefused::PreferredNotAvailable)
        );
        // Leader and ISR down: an unclean election takes the first live replica, whose log
        // becomes the ISR.
        state.leader = NO_LEADER;
        state.isr = vec![3];
        let only_one: BTreeSet<i32> = [1].into();
        let change = elect(&state, &only_one, true).unwrap();
        assert_eq!(change, crate::PartitionChange::UncleanLeader(1));
        let next = change.apply(&state);
        assert_eq!((next.leader, next.isr.clone()), (1, vec![1]));
        assert_eq!(next.leader_epoch, state.leader_epoch + 1);
        // ... but an in-sync replica first, keeping the ISR.
        let next = elect(&state, &live, true).unwrap().apply(&state);
        assert_eq!((next.leader, next.isr), (3, vec![3]));
        assert_eq!(
            elect(&state, &BTreeSet::new(), true),
            Err(ElectionRefused::NoEligibleLeader)
        );
    }

    #[test]
    fn a_cancelled_reassignment_goes_back_to_where_it_started() {
        let brokers: BTreeSet<i32> = [1, 2, 3, 4].into();
        let state = PartitionState::initial(0, vec![1, 2]);
        assert!(matches!(
            start_reassignment(&state, &[], &brokers),
            Err(CoordinatorError::NoReassignmentInProgress(_))
        ));
        let moving = start_reassignment(&state, &[2, 3], &brokers).unwrap();
        assert_eq!(moving.replicas, vec![1, 2, 3]);
        assert_eq!(moving.reassigning_from, Some(vec![1, 2]));
        // A second target on top of the first still started from [1, 2].
        let again = start_reassignment(&moving, &[3, 4], &brokers).unwrap();
        assert_eq!(again.replicas, vec![1, 2, 3, 4]);
        assert_eq!(again.reassigning_from, Some(vec![1, 2]));
        let cancelled = start_reassignment(&again, &[], &brokers).unwrap();
        assert_eq!(cancelled.target_replicas, Some(vec![1, 2]));
        let done = complete_reassignment(&cancelled).expect("1 and 2 are in sync");
        assert_eq!(done.replicas, vec![1, 2]);
        assert_eq!((done.target_replicas, done.reassigning_from), (None, None));
        assert!(matches!(
            start_reassignment(&state, &[1, 1], &brokers),
            Err(CoordinatorError::InvalidReplicaAssignment(_))
        ));
    }
}
