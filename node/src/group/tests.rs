use super::*;

use rand::{Rng, SeedableRng, rngs::StdRng};

const SESSION_TIMEOUT_MS: u32 = 1_000;
const REBALANCE_TIMEOUT_MS: u32 = 1_500;

fn counts(topics: &[(&str, u32)]) -> PartitionCounts {
    topics.iter().map(|(t, n)| (t.to_string(), *n)).collect()
}

fn tps(list: &[(&str, u32)]) -> Vec<TopicPartition> {
    let mut tps: Vec<TopicPartition> = list
        .iter()
        .map(|(t, p)| TopicPartition::new(t, *p))
        .collect();
    tps.sort();
    tps
}

fn all(topic: &str, count: u32) -> Vec<TopicPartition> {
    (0..count).map(|p| TopicPartition::new(topic, p)).collect()
}

fn params(topics: &[&str]) -> JoinParams {
    JoinParams {
        member_id: None,
        instance_id: None,
        client_id: "client".into(),
        topics: topics.iter().map(|t| t.to_string()).collect(),
        session_timeout_ms: SESSION_TIMEOUT_MS,
        rebalance_timeout_ms: REBALANCE_TIMEOUT_MS,
        assignor: AssignorKind::Sticky,
    }
}

fn member<'a>(description: &'a GroupDescription, id: &str) -> &'a MemberDescription {
    description
        .members
        .iter()
        .find(|m| m.member_id == id)
        .unwrap_or_else(|| panic!("no member {id}"))
}

/// No partition is in two members' `assigned`, and each `assigned` is within its target.
fn check_exclusive(group: &Group) {
    let description = group.describe();
    let mut seen = BTreeSet::new();
    for m in &description.members {
        for tp in &m.assigned {
            assert!(seen.insert(tp.clone()), "{tp:?} assigned twice");
            assert!(
                m.target.contains(tp),
                "{tp:?} outside {}'s target",
                m.member_id
            );
        }
    }
}

#[test]
fn assignor_names() {
    let cases = [
        ("range", Some(AssignorKind::Range)),
        ("roundrobin", Some(AssignorKind::RoundRobin)),
        ("round-robin", Some(AssignorKind::RoundRobin)),
        ("sticky", Some(AssignorKind::Sticky)),
        ("cooperative-sticky", Some(AssignorKind::Sticky)),
        ("uniform", None),
        ("", None),
    ];
    for (name, expect) in cases {
        assert_eq!(AssignorKind::parse(name), expect, "{name}");
    }
    for kind in [
        AssignorKind::Range,
        AssignorKind::RoundRobin,
        AssignorKind::Sticky,
    ] {
        assert_eq!(AssignorKind::parse(kind.name()), Some(kind));
    }
    assert_eq!(AssignorKind::default(), AssignorKind::Sticky);
}

/// Each change that needs a new plan moves the generation by exactly one; others leave it.
#[test]
fn generation_moves_by_one_per_change() {
    enum Step {
        Join(&'static str, &'static [&'static str]),
        Resubscribe(&'static str, &'static [&'static str]),
        Leave(&'static str),
        Heartbeat(&'static str),
        Metadata(&'static [(&'static str, u32)]),
        /// Advance the clock by this much, then tick.
        Tick(u64),
    }
    use Step::*;
    let script: &[(Step, i32)] = &[
        (Metadata(&[("t", 4)]), 7), // an empty group plans nothing
        (Join("a", &["t"]), 8),
        (Heartbeat("a"), 8), // heartbeats never re-plan
        (Join("b", &["t"]), 9),
        (Resubscribe("b", &["t"]), 9), // the same subscription: nothing to do
        (Resubscribe("b", &["t", "u"]), 10), // u does not exist yet
        (Metadata(&[("t", 4), ("x", 3)]), 10), // nobody subscribes to x
        (Metadata(&[("t", 4), ("u", 2), ("x", 3)]), 11), // u appears
        (Metadata(&[("t", 6), ("u", 2), ("x", 9)]), 12), // t grows
        (Metadata(&[("t", 6)]), 13),   // u disappears
        (Heartbeat("a"), 13),
        (Tick(500), 13), // b is silent but not yet expired
        (Heartbeat("a"), 13),
        (Tick(600), 14),  // b expired
        (Leave("a"), 15), // the group empties: still a change
        (Metadata(&[("t", 8)]), 15),
    ];
    let mut group = Group::new("g".into(), 7);
    let mut partitions = PartitionCounts::new();
    let mut generations: BTreeMap<String, i32> = BTreeMap::new();
    let mut now_ms = 0;
    for (index, (step, expect)) in script.iter().enumerate() {
        match step {
            Join(id, topics) => {
                let joined = group.join(now_ms, params(topics), &partitions, id.to_string());
                generations.insert(id.to_string(), joined.unwrap().generation);
            }
            Resubscribe(id, topics) => {
                let rejoin = JoinParams {
                    member_id: Some(id.to_string()),
                    ..params(topics)
                };
                let joined = group.join(now_ms, rejoin, &partitions, "unused".into());
                generations.insert(id.to_string(), joined.unwrap().generation);
            }
            Leave(id) => group.leave(now_ms, id, &partitions).unwrap(),
            Heartbeat(id) => {
                let owned = group
                    .describe()
                    .members
                    .iter()
                    .find(|m| m.member_id == *id)
                    .unwrap()
                    .assigned
                    .clone();
                let answer = group.heartbeat(now_ms, id, generations[*id], &owned, &partitions);
                generations.insert(id.to_string(), answer.unwrap().generation);
            }
            Metadata(topics) => {
                partitions = counts(topics);
                group.set_partitions(&partitions);
            }
            Tick(ms) => {
                now_ms += ms;
                group.tick(now_ms, &partitions);
            }
        }
        assert_eq!(group.generation(), *expect, "step {index}");
        check_exclusive(&group);
    }
    assert!(group.is_empty());
    assert_eq!(group.describe().state, GroupState::Empty);
}

/// The cooperative handover: a partition moves only after its holder reported it gone, the
/// partitions that stay keep being consumed, and the revoking member catches up with the
/// generation only once it let go.
#[test]
fn partitions_move_only_after_release() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    let a = group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    assert_eq!(a.generation, 1);
    let answer = group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 1,
            partitions: all("t", 4)
        }
    );
    assert_eq!(group.describe().state, GroupState::Stable);

    let b = group
        .join(20, params(&["t"]), &partitions, "b".into())
        .unwrap();
    assert_eq!(b.generation, 2);
    let description = group.describe();
    assert_eq!(description.state, GroupState::Reconciling);
    assert_eq!(member(&description, "a").target, tps(&[("t", 0), ("t", 1)]));
    assert_eq!(member(&description, "b").target, tps(&[("t", 2), ("t", 3)]));

    // b's partitions are still a's: b gets nothing yet, but is at the new generation.
    let answer = group.heartbeat(30, "b", 2, &[], &partitions).unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 2,
            partitions: vec![]
        }
    );

    // a still owns all four: it is told to keep only its target, and stays at generation 1.
    let answer = group
        .heartbeat(40, "a", 1, &all("t", 4), &partitions)
        .unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 1,
            partitions: all("t", 2)
        }
    );
    let answer = group.heartbeat(50, "b", 2, &[], &partitions).unwrap();
    assert!(answer.partitions.is_empty(), "a has not let go yet");

    // a released t-3 only: b gets t-3, t-2 waits.
    let owned = tps(&[("t", 0), ("t", 1), ("t", 2)]);
    let answer = group.heartbeat(60, "a", 1, &owned, &partitions).unwrap();
    assert_eq!(answer.generation, 1);
    let answer = group.heartbeat(70, "b", 2, &[], &partitions).unwrap();
    assert_eq!(answer.partitions, tps(&[("t", 3)]));
    check_exclusive(&group);

    let answer = group
        .heartbeat(80, "a", 1, &all("t", 2), &partitions)
        .unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 2,
            partitions: all("t", 2)
        }
    );
    assert_eq!(group.check_commit("a", 2), Ok(()));
    assert_eq!(
        group.check_commit("a", 1),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        group.describe().state,
        GroupState::Reconciling,
        "t-2 not handed over"
    );
    let answer = group
        .heartbeat(90, "b", 2, &tps(&[("t", 3)]), &partitions)
        .unwrap();
    assert_eq!(answer.partitions, tps(&[("t", 2), ("t", 3)]));
    assert_eq!(group.describe().state, GroupState::Stable);
}

#[test]
fn heartbeat_errors() {
    let partitions = counts(&[("t", 2)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    group
        .join(0, params(&["t"]), &partitions, "b".into())
        .unwrap();
    assert_eq!(group.generation(), 2);
    // In order: each answer moves the member's generation.
    let cases = [
        ("a", 2, Err(GroupError::IllegalGeneration)), // a joined at 1 and has not caught up
        ("a", 1, Ok(2)),                              // it holds nothing: caught up at once
        ("a", 1, Ok(2)), // that answer was lost: a asks again at its previous generation
        ("b", 2, Ok(2)),
        ("b", 3, Err(GroupError::IllegalGeneration)),
        ("nobody", 1, Err(GroupError::IllegalGeneration)), // a zombie of generation 1
        ("nobody", 2, Err(GroupError::UnknownMember)),
        ("nobody", 5, Err(GroupError::UnknownMember)),
    ];
    for (id, generation, expect) in cases {
        let answer = group.heartbeat(10, id, generation, &[], &partitions);
        assert_eq!(answer.map(|a| a.generation), expect, "{id} at {generation}");
    }
}

/// A member whose answer was lost asks again at its previous generation and hears the same
/// answer, as long as it reports only partitions still held for it; commits stay exact, and
/// two generations back is a zombie.
#[test]
fn a_lost_heartbeat_answer_is_asked_again_at_the_previous_generation() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    let answer = group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    assert_eq!((answer.generation, answer.partitions.len()), (1, 4));
    group
        .join(20, params(&["t"]), &partitions, "b".into())
        .unwrap();
    let asked = group
        .heartbeat(30, "a", 1, &all("t", 4), &partitions)
        .unwrap();
    assert_eq!(asked.generation, 1, "still revoking");
    let kept = asked.partitions.clone();
    assert_eq!(kept.len(), 2);
    let moved = group.heartbeat(40, "a", 1, &kept, &partitions).unwrap();
    assert_eq!(moved.generation, 2);
    // That answer never arrived: a asks again, at 1, owning what it kept.
    let again = group.heartbeat(50, "a", 1, &kept, &partitions).unwrap();
    assert_eq!(again, moved);
    assert_eq!(
        group.heartbeat(60, "a", 1, &all("t", 4), &partitions),
        Err(GroupError::IllegalGeneration),
        "at its previous generation it may not report what it gave up"
    );
    assert_eq!(
        group.check_commit("a", 1),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(group.check_commit("a", 2), Ok(()));
    check_exclusive(&group);

    // b leaves; a is given everything and moves to 3; generation 1 is now two moves back.
    group.leave(70, "b", &partitions).unwrap();
    let all_of_it = group.heartbeat(80, "a", 2, &kept, &partitions).unwrap();
    assert_eq!((all_of_it.generation, all_of_it.partitions.len()), (3, 4));
    assert_eq!(
        group.heartbeat(90, "a", 1, &kept, &partitions),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        group.heartbeat(90, "a", 2, &kept, &partitions).unwrap(),
        all_of_it
    );
}

/// A new coordinator restores the members mid-rebalance: they go on at their generations with
/// what they hold, nobody holds a partition twice, and the rebalance completes.
#[test]
fn a_restored_group_goes_on_where_the_last_coordinator_stopped() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    let a = group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    assert_eq!(a.partitions.len(), 4);
    group
        .join(20, params(&["t"]), &partitions, "b".into())
        .unwrap();
    // a is told to give up two; b waits for them.
    let a = group
        .heartbeat(30, "a", 1, &all("t", 4), &partitions)
        .unwrap();
    let b = group.heartbeat(30, "b", 2, &[], &partitions).unwrap();
    assert!(b.partitions.is_empty());

    let snapshot = group.snapshot();
    let stored: GroupSnapshot =
        serde_json::from_value(serde_json::to_value(&snapshot).unwrap()).unwrap();
    assert_eq!(stored, snapshot, "the snapshot survives the store's JSON");
    let mut restored = Group::restore("g".into(), group.generation() + 1, stored, 5_000).unwrap();
    let (before, after) = (group.describe(), restored.describe());
    assert_eq!(after.generation, before.generation + 1);
    for (old, new) in before.members.iter().zip(&after.members) {
        assert_eq!(
            (&old.member_id, &old.assigned, &old.target),
            (&new.member_id, &new.assigned, &new.target)
        );
        assert_eq!(old.generation, new.generation);
    }
    // The members' clocks start over: nobody expires for the time the move took.
    assert!(restored.tick(5_500, &partitions).is_empty());
    // a releases what it was told to; b gets it; both settle at the new generation.
    restored
        .heartbeat(5_600, "a", 1, &a.partitions, &partitions)
        .unwrap();
    let b = restored.heartbeat(5_700, "b", 2, &[], &partitions).unwrap();
    assert_eq!(b.partitions.len(), 2);
    let a = restored
        .heartbeat(5_800, "a", 3, &a.partitions, &partitions)
        .unwrap();
    restored
        .heartbeat(5_900, "b", 3, &b.partitions, &partitions)
        .unwrap();
    assert_eq!(a.generation, 3);
    assert_eq!(restored.describe().state, GroupState::Stable);
    check_exclusive(&restored);

    // What must be stored before an answer: a release that leaves something to revoke, and a
    // revocation told, may wait (restored, the member holds those partitions a little longer and
    // reports them gone again); a handover may not.
    restored
        .join(6_000, params(&["t"]), &partitions, "c".into())
        .unwrap();
    let generation = restored.generation();
    let a_owns: Vec<TopicPartition> = a.partitions.clone();
    let stored = restored.snapshot();
    // a hears that one partition goes (the answer leaves it out): only `told` changed.
    let told = restored
        .heartbeat(6_100, "a", 3, &a_owns, &partitions)
        .unwrap();
    let leaving: Vec<TopicPartition> = a_owns
        .iter()
        .filter(|tp| !told.partitions.contains(tp))
        .cloned()
        .collect();
    assert_eq!(leaving.len(), 1, "c takes one of a's two");
    assert_ne!(stored, restored.snapshot());
    assert!(stored.only_releases_since(&restored.snapshot()));
    // c heartbeats: nothing is free for it yet.
    let c = restored
        .heartbeat(6_300, "c", generation, &[], &partitions)
        .unwrap();
    assert!(c.partitions.is_empty());
    let stored = restored.snapshot();
    // a lets it go: a's generation moves, so this is stored; then c gets it: stored too.
    restored
        .heartbeat(6_400, "a", 3, &told.partitions, &partitions)
        .unwrap();
    assert!(!stored.only_releases_since(&restored.snapshot()));
    let stored = restored.snapshot();
    let c = restored
        .heartbeat(6_500, "c", generation, &[], &partitions)
        .unwrap();
    assert_eq!(c.partitions, leaving);
    assert!(!stored.only_releases_since(&restored.snapshot()));

    // A snapshot that breaks the rules is refused, not half-applied.
    let mut broken = restored.snapshot();
    let b_holds = broken.members["b"].assigned.clone();
    broken
        .members
        .get_mut("a")
        .unwrap()
        .assigned
        .extend(b_holds.clone());
    broken.members.get_mut("a").unwrap().target.extend(b_holds);
    assert!(Group::restore("g".into(), 9, broken, 0).is_err());
}

#[test]
fn zombie_and_simple_commits() {
    let partitions = counts(&[("t", 2)]);
    let mut group = Group::new("g".into(), 0);
    assert_eq!(
        group.check_commit("", -1),
        Ok(()),
        "a simple commit to an empty group"
    );
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    group
        .join(0, params(&["t"]), &partitions, "b".into())
        .unwrap();
    group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    let b = group.heartbeat(10, "b", 2, &[], &partitions).unwrap();
    assert_eq!(
        group.check_commit("", -1),
        Err(GroupError::IllegalGeneration)
    );
    // a stops heartbeating and is expired; its late commit at its old generation is refused.
    group
        .heartbeat(900, "b", 2, &b.partitions, &partitions)
        .unwrap();
    assert_eq!(group.tick(1_200, &partitions), vec!["a".to_string()]);
    assert_eq!(group.generation(), 3);
    let cases = [
        ("a", 2, Err(GroupError::IllegalGeneration)),
        ("b", 2, Ok(())),
        ("b", 3, Err(GroupError::IllegalGeneration)),
        ("c", 3, Err(GroupError::UnknownMember)),
        ("", -1, Err(GroupError::IllegalGeneration)),
        ("b", -1, Err(GroupError::IllegalGeneration)),
    ];
    for (id, generation, expect) in cases {
        assert_eq!(
            group.check_commit(id, generation),
            expect,
            "{id} at {generation}"
        );
    }
    group.leave(1_300, "b", &partitions).unwrap();
    assert_eq!(group.check_commit("", -1), Ok(()));
    assert_eq!(
        group.check_commit("assigning-client", -1),
        Ok(()),
        "a KIP-848 client that only assigns names its own member id"
    );
    assert_eq!(
        group.leave(1_300, "b", &partitions),
        Err(GroupError::UnknownMember)
    );
}

#[test]
fn a_leaving_member_frees_its_partitions_at_once() {
    let partitions = counts(&[("t", 6)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    let a = group.heartbeat(0, "a", 1, &[], &partitions).unwrap();
    group
        .join(10, params(&["t"]), &partitions, "b".into())
        .unwrap();
    let a = group
        .heartbeat(10, "a", 1, &a.partitions, &partitions)
        .unwrap();
    let a = group
        .heartbeat(20, "a", a.generation, &a.partitions, &partitions)
        .unwrap();
    assert_eq!(a.generation, 2);
    let b = group.heartbeat(20, "b", 2, &[], &partitions).unwrap();
    assert_eq!(b.partitions.len(), 3);
    assert_eq!(group.describe().state, GroupState::Stable);

    group.leave(30, "a", &partitions).unwrap();
    assert_eq!(group.generation(), 3);
    let answer = group
        .heartbeat(40, "b", 2, &b.partitions, &partitions)
        .unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 3,
            partitions: all("t", 6)
        }
    );
    assert_eq!(group.describe().state, GroupState::Stable);
}

#[test]
fn static_member_takes_over_without_a_rebalance() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    let static_params = |member_id: Option<&str>, topics: &[&str]| JoinParams {
        member_id: member_id.map(str::to_string),
        instance_id: Some("consumer-1".into()),
        ..params(topics)
    };
    group
        .join(0, static_params(None, &["t"]), &partitions, "a".into())
        .unwrap();
    group
        .join(0, params(&["t"]), &partitions, "b".into())
        .unwrap();
    let a = group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    group
        .heartbeat(10, "a", a.generation, &a.partitions, &partitions)
        .unwrap();
    group.heartbeat(10, "b", 2, &[], &partitions).unwrap();
    let before = group.describe();
    let a_before = member(&before, "a").clone();

    // The process restarts: same instance id, no member id.
    let joined = group
        .join(20, static_params(None, &["t"]), &partitions, "a2".into())
        .unwrap();
    assert_eq!(
        joined,
        Joined {
            member_id: "a2".into(),
            generation: a_before.generation
        }
    );
    assert_eq!(group.generation(), before.generation, "no rebalance");
    let after = group.describe();
    let a2 = member(&after, "a2");
    assert_eq!(
        (&a2.assigned, &a2.target),
        (&a_before.assigned, &a_before.target)
    );
    assert_eq!(a2.instance_id.as_deref(), Some("consumer-1"));
    assert!(after.members.iter().all(|m| m.member_id != "a"));

    // The old process is fenced everywhere.
    let answer = group.heartbeat(
        30,
        "a",
        a_before.generation,
        &a_before.assigned,
        &partitions,
    );
    assert_eq!(answer, Err(GroupError::FencedInstanceId));
    assert_eq!(
        group.check_commit("a", a_before.generation),
        Err(GroupError::FencedInstanceId)
    );
    assert_eq!(
        group.leave(30, "a", &partitions),
        Err(GroupError::FencedInstanceId)
    );
    let rejoin = group.join(
        30,
        static_params(Some("a"), &["t"]),
        &partitions,
        "x".into(),
    );
    assert_eq!(rejoin, Err(GroupError::FencedInstanceId));

    let answer = group
        .heartbeat(40, "a2", joined.generation, &[], &partitions)
        .unwrap();
    assert_eq!(answer.partitions, a_before.assigned);

    // A takeover that changes the subscription is a change.
    let generation = group.generation();
    group
        .join(
            50,
            static_params(None, &["t", "u"]),
            &partitions,
            "a3".into(),
        )
        .unwrap();
    assert_eq!(group.generation(), generation + 1);

    // A static member that goes silent is expired like any other.
    group.heartbeat(900, "b", 2, &[], &partitions).unwrap();
    assert_eq!(group.tick(1_100, &partitions), vec!["a3".to_string()]);
    assert_eq!(
        group.check_commit("a2", joined.generation),
        Err(GroupError::FencedInstanceId)
    );
}

#[test]
fn a_member_that_does_not_revoke_in_time_is_expired() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    let a = group.heartbeat(0, "a", 1, &[], &partitions).unwrap();
    group
        .join(100, params(&["t"]), &partitions, "b".into())
        .unwrap();
    // a is asked to revoke at 200, then keeps heartbeating without letting go.
    for now_ms in (200..=1_700).step_by(300) {
        let answer = group
            .heartbeat(now_ms, "a", 1, &a.partitions, &partitions)
            .unwrap();
        assert_eq!(answer.partitions.len(), 2);
        group.heartbeat(now_ms, "b", 2, &[], &partitions).unwrap();
        assert!(group.tick(now_ms, &partitions).is_empty(), "at {now_ms}");
    }
    assert_eq!(group.tick(1_700, &partitions), Vec::<String>::new());
    assert_eq!(group.tick(1_701, &partitions), vec!["a".to_string()]);
    let answer = group.heartbeat(1_710, "b", 2, &[], &partitions).unwrap();
    assert_eq!(
        answer,
        Assignment {
            generation: 3,
            partitions: all("t", 4)
        }
    );
}

#[test]
fn a_member_that_revokes_is_not_expired_by_the_rebalance_timeout() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    group.heartbeat(0, "a", 1, &[], &partitions).unwrap();
    group
        .join(100, params(&["t"]), &partitions, "b".into())
        .unwrap();
    let a = group
        .heartbeat(200, "a", 1, &all("t", 4), &partitions)
        .unwrap();
    group
        .heartbeat(900, "a", a.generation, &a.partitions, &partitions)
        .unwrap();
    group.heartbeat(900, "b", 2, &[], &partitions).unwrap();
    assert!(group.tick(1_800, &partitions).is_empty());
}

#[test]
fn the_assignor_is_the_groups() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    let range = |member_id: Option<&str>| JoinParams {
        member_id: member_id.map(str::to_string),
        assignor: AssignorKind::Range,
        ..params(&["t"])
    };
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    let generation = group.generation();
    assert_eq!(
        group.join(0, range(None), &partitions, "b".into()),
        Err(GroupError::InconsistentAssignor)
    );
    assert_eq!(
        group.generation(),
        generation,
        "a refused join changes nothing"
    );
    assert_eq!(group.describe().members.len(), 1);
    // The only member may switch: a new plan.
    group
        .join(0, range(Some("a")), &partitions, "unused".into())
        .unwrap();
    assert_eq!(group.generation(), generation + 1);
    assert_eq!(group.describe().assignor, AssignorKind::Range);
    group.join(0, range(None), &partitions, "b".into()).unwrap();
    let description = group.describe();
    assert_eq!(member(&description, "a").target, all("t", 2));
    // An unknown member id without an instance id cannot join under it.
    assert_eq!(
        group.join(0, range(Some("zz")), &partitions, "c".into()),
        Err(GroupError::UnknownMember)
    );
}

#[test]
fn partitions_of_deleted_topics_are_revoked_and_new_ones_handed_out() {
    let mut partitions = counts(&[("t", 2), ("u", 2)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t", "u"]), &partitions, "a".into())
        .unwrap();
    let a = group.heartbeat(0, "a", 1, &[], &partitions).unwrap();
    assert_eq!(a.partitions.len(), 4);
    partitions.remove("u");
    partitions.insert("t".into(), 3);
    let answer = group
        .heartbeat(10, "a", 1, &a.partitions, &partitions)
        .unwrap();
    assert_eq!(group.generation(), 2, "one plan for both changes");
    assert_eq!(
        answer,
        Assignment {
            generation: 1,
            partitions: all("t", 3)
        }
    );
    let answer = group
        .heartbeat(20, "a", 1, &answer.partitions, &partitions)
        .unwrap();
    assert_eq!(answer.generation, 2);
    assert_eq!(group.describe().state, GroupState::Stable);
}

/// Adding a member to a sticky group moves only its share; the others keep what they had.
#[test]
fn sticky_group_moves_only_the_new_members_share() {
    let partitions = counts(&[("t", 12)]);
    let mut group = Group::new("g".into(), 0);
    for id in ["a", "b", "c"] {
        group
            .join(0, params(&["t"]), &partitions, id.into())
            .unwrap();
    }
    let before = group.describe();
    group
        .join(0, params(&["t"]), &partitions, "d".into())
        .unwrap();
    let after = group.describe();
    for id in ["a", "b", "c"] {
        let (old, new) = (&member(&before, id).target, &member(&after, id).target);
        assert_eq!(new.len(), 3);
        assert!(
            new.iter().all(|tp| old.contains(tp)),
            "{id} only gave up partitions"
        );
    }
    assert_eq!(member(&after, "d").target.len(), 3);
}

/// A client in the simulation: what it believes it owns, and how it follows the protocol.
struct Client {
    member_id: Option<String>,
    instance_id: Option<String>,
    generation: i32,
    owned: BTreeSet<TopicPartition>,
    topics: Vec<String>,
    /// Heartbeats to wait before dropping partitions the answer left out (a slow poll loop).
    revoke_lag: u32,
    /// The client neither heartbeats nor leaves until then (a GC pause, a network partition).
    silent_until_ms: u64,
    /// The last heartbeat's answer never arrived (a timeout): the client still speaks at the
    /// generation before it.
    answer_lost: bool,
}

struct Sim {
    rng: StdRng,
    group: Group,
    /// What the adapter's store holds: (generation, membership), updated by its rule after
    /// every input (`GroupSnapshot::only_releases_since` lets some changes wait).
    stored: (i32, GroupSnapshot),
    partitions: PartitionCounts,
    clients: Vec<Client>,
    now_ms: u64,
    next_member: u32,
    assignor: AssignorKind,
    homogeneous: bool,
}

impl Sim {
    fn fresh_id(&mut self) -> String {
        self.next_member += 1;
        format!("m{:03}", self.next_member)
    }

    fn subscription(&mut self) -> Vec<String> {
        if self.homogeneous {
            return vec!["a".into(), "b".into()];
        }
        loop {
            let topics: Vec<String> = ["a", "b", "c"]
                .into_iter()
                .filter(|_| self.rng.random_bool(0.5))
                .map(str::to_string)
                .collect();
            if !topics.is_empty() {
                return topics;
            }
        }
    }

    fn join_params(&self, client: &Client) -> JoinParams {
        JoinParams {
            member_id: client.member_id.clone(),
            instance_id: client.instance_id.clone(),
            client_id: "sim".into(),
            topics: client.topics.clone(),
            session_timeout_ms: SESSION_TIMEOUT_MS,
            rebalance_timeout_ms: REBALANCE_TIMEOUT_MS,
            assignor: self.assignor,
        }
    }

    /// The client (re)joins as a new member, owning nothing.
    fn join(&mut self, index: usize) {
        let new_id = self.fresh_id();
        let client = &mut self.clients[index];
        client.member_id = None;
        client.owned.clear();
        client.answer_lost = false;
        let params = self.join_params(&self.clients[index]);
        let joined = self
            .group
            .join(self.now_ms, params, &self.partitions, new_id)
            .unwrap();
        let client = &mut self.clients[index];
        client.member_id = Some(joined.member_id);
        client.generation = joined.generation;
    }

    fn heartbeat(&mut self, index: usize, may_lag: bool) {
        let client = &self.clients[index];
        let Some(member_id) = client.member_id.clone() else {
            return;
        };
        let owned: Vec<TopicPartition> = client.owned.iter().cloned().collect();
        let generation = client.generation;
        let asking_again = std::mem::take(&mut self.clients[index].answer_lost)
            && self.group.session_timeout_ms(&member_id).is_some();
        let answer = self.group.heartbeat(
            self.now_ms,
            &member_id,
            generation,
            &owned,
            &self.partitions,
        );
        match answer {
            // Lost on the way back (never two in a row: after two, joining again is the way).
            Ok(_) if may_lag && !asking_again && self.rng.random_bool(0.1) => {
                self.clients[index].answer_lost = true;
            }
            Ok(assignment) => {
                let lag = if may_lag && self.rng.random_bool(0.3) {
                    self.rng.random_range(1..=3)
                } else {
                    0
                };
                let client = &mut self.clients[index];
                client.generation = assignment.generation;
                let given: BTreeSet<TopicPartition> = assignment.partitions.into_iter().collect();
                // New partitions are taken at once; left-out ones are dropped, maybe late.
                client.owned.extend(given.iter().cloned());
                if client.owned != given {
                    if client.revoke_lag == 0 {
                        client.owned = given;
                        client.revoke_lag = lag;
                    } else {
                        client.revoke_lag -= 1;
                    }
                }
            }
            Err(GroupError::IllegalGeneration) if asking_again => {
                panic!("{member_id} asking again after one lost answer was refused")
            }
            // Expired, replaced or out of step: drop everything and join again.
            Err(
                GroupError::UnknownMember
                | GroupError::IllegalGeneration
                | GroupError::FencedInstanceId,
            ) => self.join(index),
            Err(error) => panic!("heartbeat: {error}"),
        }
    }

    /// The adapter's rule: store unless only releases and told revocations changed.
    fn store(&mut self) {
        let now = self.group.snapshot();
        if self.group.generation() != self.stored.0 || !self.stored.1.only_releases_since(&now) {
            self.stored = (self.group.generation(), now);
        }
    }

    fn step(&mut self) {
        self.now_ms += self.rng.random_range(0..60);
        let live: Vec<usize> = (0..self.clients.len())
            .filter(|&i| self.clients[i].silent_until_ms <= self.now_ms)
            .collect();
        let pick =
            |rng: &mut StdRng| (!live.is_empty()).then(|| live[rng.random_range(0..live.len())]);
        match self.rng.random_range(0..100) {
            0..5 if self.clients.len() < 10 => {
                let topics = self.subscription();
                let instance_id = self
                    .rng
                    .random_bool(0.3)
                    .then(|| format!("instance-{}", self.next_member));
                self.clients.push(Client {
                    member_id: None,
                    instance_id,
                    generation: 0,
                    owned: BTreeSet::new(),
                    topics,
                    revoke_lag: 0,
                    silent_until_ms: 0,
                    answer_lost: false,
                });
                self.join(self.clients.len() - 1);
            }
            5..8 => {
                if let Some(index) = pick(&mut self.rng) {
                    let client = self.clients.remove(index);
                    let member_id = client.member_id.expect("clients are always joined");
                    // It may have been expired meanwhile without knowing.
                    let _ = self.group.leave(self.now_ms, &member_id, &self.partitions);
                }
            }
            8..11 => {
                // A static member's process restarts; the old one must be fenced.
                let statics: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|&i| self.clients[i].instance_id.is_some())
                    .collect();
                if !statics.is_empty() {
                    let index = statics[self.rng.random_range(0..statics.len())];
                    let old_id = self.clients[index].member_id.clone().expect("joined");
                    let old_generation = self.clients[index].generation;
                    let was_member = self.group.check_commit(&old_id, old_generation).is_ok();
                    let generation = self.group.generation();
                    self.join(index);
                    let answer = self.group.check_commit(&old_id, old_generation);
                    if was_member {
                        // Same subscription, same metadata: a takeover without a rebalance.
                        assert_eq!(answer, Err(GroupError::FencedInstanceId));
                        assert_eq!(self.group.generation(), generation);
                    } else {
                        assert!(answer.is_err(), "an expired member may still commit");
                    }
                }
            }
            11..15 => {
                let topic = ["a", "b", "c"][self.rng.random_range(0..3)];
                match self.partitions.get(topic).copied() {
                    Some(_) if self.rng.random_bool(0.2) => {
                        self.partitions.remove(topic);
                    }
                    Some(count) => {
                        self.partitions
                            .insert(topic.into(), count + self.rng.random_range(1..=3));
                    }
                    None => {
                        self.partitions
                            .insert(topic.into(), self.rng.random_range(1..=6));
                    }
                }
                self.group.set_partitions(&self.partitions);
            }
            15..18 if !self.homogeneous => {
                if let Some(index) = pick(&mut self.rng) {
                    let topics = self.subscription();
                    self.clients[index].topics = topics;
                    let params = self.join_params(&self.clients[index]);
                    let new_id = self.fresh_id();
                    match self
                        .group
                        .join(self.now_ms, params, &self.partitions, new_id)
                    {
                        Ok(joined) => {
                            let client = &mut self.clients[index];
                            if client.member_id.as_ref() != Some(&joined.member_id) {
                                // Expired meanwhile: the instance id made it a new member.
                                client.owned.clear();
                                client.member_id = Some(joined.member_id);
                            }
                            client.generation = joined.generation;
                            client.answer_lost = false;
                        }
                        Err(_) => self.join(index),
                    }
                }
            }
            20..22 => {
                // The coordinator moves: the next one restores what the last one stored, which
                // may miss releases and revocations told since (the store's rule lets them wait).
                let snapshot = self.stored.1.clone();
                let generation = self.group.generation() + 1;
                self.group = Group::restore("g".into(), generation, snapshot, self.now_ms)
                    .expect("a stored snapshot restores");
            }
            18..20 => {
                if let Some(index) = pick(&mut self.rng) {
                    let silence_ms = self.rng.random_range(500..2_500);
                    self.clients[index].silent_until_ms = self.now_ms + silence_ms;
                }
            }
            _ => {
                if let Some(index) = pick(&mut self.rng) {
                    self.heartbeat(index, true);
                }
            }
        }
        self.group.tick(self.now_ms, &self.partitions);
    }

    /// Invariants that hold at every instant.
    fn check(&self) {
        self.group.assert_invariants();
        check_exclusive(&self.group);
        // Clients still in the group never consume the same partition.
        let description = self.group.describe();
        let mut consumed: BTreeMap<&TopicPartition, &str> = BTreeMap::new();
        for client in &self.clients {
            let Some(member_id) = client.member_id.as_deref() else {
                continue;
            };
            if !description.members.iter().any(|m| m.member_id == member_id) {
                continue;
            }
            for tp in &client.owned {
                let other = consumed.insert(tp, member_id);
                assert!(
                    other.is_none(),
                    "{tp:?} consumed by {other:?} and {member_id}"
                );
            }
        }
    }

    /// After the churn: everyone heartbeats for a few rounds, then the group must be settled.
    fn settle(&mut self) {
        for client in &mut self.clients {
            client.silent_until_ms = 0;
        }
        for _ in 0..12 {
            for index in 0..self.clients.len() {
                self.now_ms += 10;
                self.heartbeat(index, false);
                self.check();
            }
            self.group.tick(self.now_ms, &self.partitions);
            self.check();
        }
        let description = self.group.describe();
        assert_eq!(description.members.len(), self.clients.len());
        if self.clients.is_empty() {
            assert_eq!(description.state, GroupState::Empty);
            return;
        }
        assert_eq!(description.state, GroupState::Stable, "{description:#?}");
        let mut owner: BTreeMap<TopicPartition, &str> = BTreeMap::new();
        for m in &description.members {
            assert_eq!(m.generation, description.generation);
            for tp in &m.assigned {
                assert!(owner.insert(tp.clone(), &m.member_id).is_none());
            }
        }
        for (topic, &count) in &self.partitions {
            let subscribed = description.members.iter().any(|m| m.topics.contains(topic));
            for partition in 0..count {
                let tp = TopicPartition::new(topic, partition);
                assert_eq!(owner.contains_key(&tp), subscribed, "{tp:?}");
            }
        }
        for client in &self.clients {
            let member_id = client.member_id.as_deref().expect("joined");
            let m = member(&description, member_id);
            assert_eq!(
                client.owned.iter().cloned().collect::<Vec<_>>(),
                m.assigned,
                "{member_id}"
            );
        }
        if self.homogeneous && self.assignor != AssignorKind::Range {
            let loads: Vec<usize> = description
                .members
                .iter()
                .map(|m| m.assigned.len())
                .collect();
            let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            assert!(max - min <= 1, "unbalanced: {loads:?}");
        }
    }
}

/// Prints the seed when the simulation panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "group simulation failed with seed {} (STRATA_GROUP_SEED={0})",
                self.0
            );
        }
    }
}

fn simulate(seed: u64) {
    let _guard = SeedGuard(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let assignor = [
        AssignorKind::Sticky,
        AssignorKind::RoundRobin,
        AssignorKind::Range,
    ][rng.random_range(0..3)];
    let homogeneous = rng.random_bool(0.5);
    let partitions = counts(&[
        ("a", rng.random_range(1..=8)),
        ("b", rng.random_range(1..=8)),
    ]);
    let start_generation = rng.random_range(0..5);
    let group = Group::new("g".into(), start_generation);
    let mut sim = Sim {
        rng,
        stored: (group.generation(), group.snapshot()),
        group,
        partitions,
        clients: Vec::new(),
        now_ms: 0,
        next_member: 0,
        assignor,
        homogeneous,
    };
    let mut generation = sim.group.generation();
    for _ in 0..400 {
        sim.step();
        sim.store();
        sim.check();
        assert!(
            sim.group.generation() >= generation,
            "the generation went back"
        );
        generation = sim.group.generation();
    }
    sim.settle();
}

#[test]
fn randomized_churn_keeps_invariants_and_settles() {
    if let Ok(seed) = std::env::var("STRATA_GROUP_SEED") {
        simulate(seed.parse().expect("STRATA_GROUP_SEED is a number"));
        return;
    }
    for seed in 0..200 {
        simulate(seed);
    }
}

/// A member that was given partitions but has not started them yet reports without them. Such a
/// report, made before any answer told the member of a revocation, must not release anything:
/// the member would start the partitions after it, while another member got them too.
#[test]
fn a_report_made_before_the_member_heard_of_a_revocation_releases_nothing() {
    let partitions = counts(&[("t", 4)]);
    let mut group = Group::new("g".into(), 0);
    group
        .join(0, params(&["t"]), &partitions, "a".into())
        .unwrap();
    // a is given all four, and is still starting them (it reports nothing yet).
    let answer = group.heartbeat(10, "a", 1, &[], &partitions).unwrap();
    assert_eq!(answer.partitions, all("t", 4));
    group
        .join(20, params(&["t"]), &partitions, "b".into())
        .unwrap();
    // a's report without 2 and 3 predates the answer that revokes them: still a's.
    let answer = group.heartbeat(30, "a", 1, &[], &partitions).unwrap();
    assert_eq!(answer.partitions, tps(&[("t", 0), ("t", 1)]));
    let answer = group.heartbeat(40, "b", 2, &[], &partitions).unwrap();
    assert!(
        answer.partitions.is_empty(),
        "b got {:?} while a may start them",
        answer.partitions
    );
    check_exclusive(&group);
    // Told, a reports without them: now they move.
    group
        .heartbeat(50, "a", 1, &tps(&[("t", 0), ("t", 1)]), &partitions)
        .unwrap();
    let answer = group.heartbeat(60, "b", 2, &[], &partitions).unwrap();
    assert_eq!(answer.partitions, tps(&[("t", 2), ("t", 3)]));
    check_exclusive(&group);
}
