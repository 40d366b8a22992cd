use bytes::Bytes;

use super::*;

fn request(member_id: &str, protocols: &[&str]) -> JoinRequest {
    JoinRequest {
        member_id: member_id.to_string(),
        client_id: "client".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|name| {
                let who = if member_id.is_empty() {
                    "new"
                } else {
                    member_id
                };
                (name.to_string(), Bytes::from(format!("{who}:{name}")))
            })
            .collect(),
        require_known_member_id: false,
        instance_id: None,
    }
}

fn join_now(joined: Joined) -> JoinAnswer {
    match joined {
        Joined::Now(answer) => answer,
        Joined::Wait { member_id } => panic!("{member_id} waits"),
    }
}

fn waits(joined: Joined) -> String {
    match joined {
        Joined::Wait { member_id } => member_id,
        Joined::Now(answer) => panic!("answered at once: {answer:?}"),
    }
}

fn join_replies(group: &mut ClassicGroup) -> BTreeMap<String, JoinAnswer> {
    group
        .take_replies()
        .into_iter()
        .map(|(id, reply)| match reply {
            Reply::Join(answer) => (id, answer),
            other => panic!("{id}: {other:?}"),
        })
        .collect()
}

/// A lone member's join completes at once; a second member's join starts a rebalance the first
/// hears of by heartbeat; when both have joined, the leader gets both members' metadata, and
/// its SyncGroup's assignments reach the follower waiting on its own.
#[test]
fn two_members_join_the_leader_assigns_and_the_follower_gets_its_share() {
    let mut group = ClassicGroup::new(1);
    assert_eq!(
        waits(group.join(0, request("", &["range"]), "a".into())),
        "a"
    );
    let answers = join_replies(&mut group);
    let a = &answers["a"];
    assert_eq!(
        (a.generation, a.leader.as_str(), a.protocol.as_str()),
        (2, "a", "range")
    );
    assert_eq!(a.members.len(), 1);
    assert!(
        matches!(group.sync(1, "a", 2, vec![("a".into(), Bytes::from_static(b"all"))]), Ok(Synced::Now(bytes)) if &bytes[..] == b"all")
    );
    assert_eq!(group.state(), ClassicState::Stable);

    assert_eq!(
        waits(group.join(10, request("", &["range"]), "b".into())),
        "b"
    );
    assert_eq!(group.state(), ClassicState::PreparingRebalance);
    assert_eq!(
        group.heartbeat(11, "a", 2),
        Err(ClassicError::RebalanceInProgress)
    );
    // a commits what it processed before it rejoins (an eager consumer giving its partitions up).
    assert_eq!(group.check_commit("a", 2), Ok(()));
    assert!(group.take_replies().is_empty(), "b waits for a");
    waits(group.join(12, request("a", &["range"]), String::new()));
    let answers = join_replies(&mut group);
    assert_eq!(answers.len(), 2);
    assert_eq!(answers["a"].generation, 3);
    assert_eq!(answers["a"].leader, "a", "the leader stays leader");
    let metadata: Vec<&str> = answers["a"]
        .members
        .iter()
        .map(|(_, metadata)| std::str::from_utf8(metadata).unwrap())
        .collect();
    assert_eq!(
        metadata,
        ["a:range", "new:range"],
        "a's rejoin, b's first join"
    );
    assert!(answers["b"].members.is_empty(), "followers get no metadata");

    // Between the join and the assignment, nobody commits.
    assert_eq!(
        group.check_commit("a", 3),
        Err(ClassicError::RebalanceInProgress)
    );
    assert!(matches!(
        group.sync(13, "b", 3, Vec::new()),
        Ok(Synced::Wait)
    ));
    assert_eq!(
        group.sync(13, "b", 2, Vec::new()).err(),
        Some(ClassicError::IllegalGeneration)
    );
    let assignments = vec![
        ("a".to_string(), Bytes::from_static(b"p0")),
        ("b".to_string(), Bytes::from_static(b"p1")),
    ];
    assert!(
        matches!(group.sync(14, "a", 3, assignments), Ok(Synced::Now(bytes)) if &bytes[..] == b"p0")
    );
    assert_eq!(
        group.take_replies(),
        [("b".to_string(), Reply::Sync(Ok(Bytes::from_static(b"p1"))))]
    );
    assert_eq!(group.heartbeat(15, "b", 3), Ok(()));
    assert_eq!(group.check_commit("b", 3), Ok(()));
    assert_eq!(
        group.check_commit("b", 2),
        Err(ClassicError::IllegalGeneration)
    );
    assert_eq!(
        group.check_commit("", -1),
        Err(ClassicError::IllegalGeneration)
    );
}

/// JoinGroup v4+: the first join gets an id to join with, and only that id is let in.
#[test]
fn a_first_join_of_a_new_client_is_answered_with_the_id_to_use() {
    let mut group = ClassicGroup::new(0);
    let mut first = request("", &["range"]);
    first.require_known_member_id = true;
    let answer = join_now(group.join(0, first, "m-1".into()));
    assert_eq!(answer.error, Some(ClassicError::MemberIdRequired));
    assert_eq!(answer.member_id, "m-1");
    assert_eq!(group.state(), ClassicState::Empty);
    let stranger = join_now(group.join(1, request("m-9", &["range"]), String::new()));
    assert_eq!(stranger.error, Some(ClassicError::UnknownMember));
    waits(group.join(2, request("m-1", &["range"]), String::new()));
    assert_eq!(join_replies(&mut group)["m-1"].generation, 1);
}

/// A member that does not rejoin within the rebalance timeout is dropped and the others go on;
/// its commits are refused after.
#[test]
fn a_member_that_does_not_rejoin_in_time_is_dropped() {
    let mut group = ClassicGroup::new(0);
    waits(group.join(0, request("", &["range"]), "a".into()));
    group.take_replies();
    group.sync(0, "a", 1, Vec::new()).unwrap();
    waits(group.join(100, request("", &["range"]), "b".into()));
    // a's session (10 s) ran out without a heartbeat: it is expired, and b's join completes
    // without it.
    assert_eq!(group.tick(20_000), ["a".to_string()]);
    let answers = join_replies(&mut group);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers["b"].leader, "b");
    assert_eq!(group.check_commit("a", 1), Err(ClassicError::UnknownMember));
}

#[test]
fn a_rebalance_ends_at_its_deadline_without_the_members_that_stayed_away() {
    let mut group = ClassicGroup::new(0);
    waits(group.join(0, request("", &["range"]), "a".into()));
    group.take_replies();
    group.sync(0, "a", 1, Vec::new()).unwrap();
    waits(group.join(1_000, request("", &["range"]), "b".into()));
    // a keeps heartbeating (so its session holds) but never rejoins.
    for now in (2_000..30_000).step_by(2_000) {
        assert_eq!(
            group.heartbeat(now, "a", 1),
            Err(ClassicError::RebalanceInProgress)
        );
        assert!(group.tick(now).is_empty());
    }
    assert_eq!(group.tick(31_000), ["a".to_string()]);
    let answers = join_replies(&mut group);
    assert_eq!(answers["b"].generation, 2);
    assert_eq!(
        group.heartbeat(31_001, "a", 1),
        Err(ClassicError::UnknownMember)
    );
}

#[test]
fn leaving_and_expiring_rebalance_the_rest_and_an_emptied_group_takes_simple_commits() {
    let mut group = ClassicGroup::new(0);
    waits(group.join(0, request("", &["range"]), "a".into()));
    group.take_replies();
    waits(group.join(0, request("", &["range"]), "b".into()));
    waits(group.join(0, request("a", &["range"]), String::new()));
    group.take_replies();
    group.sync(1, "b", 2, Vec::new()).unwrap();
    group.sync(1, "a", 2, Vec::new()).unwrap();
    group.take_replies();
    assert_eq!(group.leave(2, "a"), Ok(()));
    assert_eq!(group.state(), ClassicState::PreparingRebalance);
    assert_eq!(
        group.heartbeat(3, "b", 2),
        Err(ClassicError::RebalanceInProgress)
    );
    waits(group.join(4, request("b", &["range"]), String::new()));
    assert_eq!(join_replies(&mut group)["b"].leader, "b");
    // b falls silent past its session: the group empties.
    assert_eq!(group.tick(20_000), ["b".to_string()]);
    assert_eq!(group.state(), ClassicState::Empty);
    assert_eq!(group.check_commit("", -1), Ok(()));
    assert_eq!(group.leave(20_001, "b"), Err(ClassicError::UnknownMember));
}

/// Members must share a protocol type and at least one protocol; the one chosen is the first
/// of the leader's that all support.
#[test]
fn protocols_are_agreed_or_the_join_is_refused() {
    let mut group = ClassicGroup::new(0);
    waits(group.join(0, request("", &["cooperative-sticky", "range"]), "a".into()));
    group.take_replies();
    let refused = join_now(group.join(1, request("", &["roundrobin"]), "b".into()));
    assert_eq!(refused.error, Some(ClassicError::InconsistentProtocol));
    let mut other_type = request("", &["range"]);
    other_type.protocol_type = "connect".into();
    let refused = join_now(group.join(1, other_type, "c".into()));
    assert_eq!(refused.error, Some(ClassicError::InconsistentProtocol));
    waits(group.join(2, request("", &["range", "cooperative-sticky"]), "d".into()));
    waits(group.join(
        3,
        request("a", &["cooperative-sticky", "range"]),
        String::new(),
    ));
    let answers = join_replies(&mut group);
    assert_eq!(
        answers["d"].protocol, "cooperative-sticky",
        "the leader's preference"
    );
}

fn static_request(member_id: &str, instance: &str) -> JoinRequest {
    JoinRequest {
        instance_id: Some(instance.to_string()),
        require_known_member_id: true,
        ..request(member_id, &["range"])
    }
}

/// KIP-345: a static member that restarts (a new member id, the same instance id) gets its
/// assignment back at the same generation with no rebalance; its old id is fenced, and its
/// partner never notices.
#[test]
fn a_restarted_static_member_takes_its_membership_back_without_a_rebalance() {
    let mut group = ClassicGroup::new(0);
    // Static members skip MEMBER_ID_REQUIRED.
    assert_eq!(
        waits(group.join(0, static_request("", "pod-a"), "a1".into())),
        "a1"
    );
    group.take_replies();
    group.sync(0, "a1", 1, Vec::new()).unwrap();
    waits(group.join(1, static_request("", "pod-b"), "b1".into()));
    waits(group.join(2, static_request("a1", "pod-a"), String::new()));
    group.take_replies();
    group.sync(3, "b1", 2, Vec::new()).unwrap();
    let assignments = vec![
        ("a1".to_string(), Bytes::from_static(b"p0")),
        ("b1".to_string(), Bytes::from_static(b"p1")),
    ];
    group.sync(3, "a1", 2, assignments).unwrap();
    group.take_replies();
    assert_eq!(group.state(), ClassicState::Stable);

    // b restarts: a new id for instance pod-b.
    let back = join_now(group.join(10, static_request("", "pod-b"), "b2".into()));
    assert_eq!(
        (back.error, back.generation, back.member_id.as_str()),
        (None, 2, "b2")
    );
    assert!(
        matches!(group.sync(11, "b2", 2, Vec::new()), Ok(Synced::Now(bytes)) if &bytes[..] == b"p1")
    );
    assert_eq!(group.state(), ClassicState::Stable, "no rebalance");
    assert_eq!(
        group.heartbeat(12, "a1", 2),
        Ok(()),
        "the partner carries on"
    );
    assert_eq!(
        group.heartbeat(12, "b1", 2),
        Err(ClassicError::UnknownMember)
    );
    assert_eq!(
        group.check_instance("b1", Some("pod-b")),
        Err(ClassicError::FencedInstanceId)
    );
    assert_eq!(group.check_instance("b2", Some("pod-b")), Ok(()));
    let zombie = join_now(group.join(13, static_request("b1", "pod-b"), String::new()));
    assert_eq!(zombie.error, Some(ClassicError::FencedInstanceId));

    // The leader restarting takes the lead with it, with no rebalance either (as Kafka's
    // coordinator): it hears everyone's metadata, and its sync in the stable group gets the
    // current assignment back (what it computes anew is not applied).
    // (The same metadata as a1's last join: the same protocols.)
    let restarted = JoinRequest {
        member_id: String::new(),
        ..static_request("a1", "pod-a")
    };
    let leader = join_now(group.join(20, restarted, "a2".into()));
    assert_eq!((leader.leader.as_str(), leader.generation), ("a2", 2));
    assert_eq!(leader.members.len(), 2);
    assert_eq!(group.state(), ClassicState::Stable);
    let reshuffled = vec![("a2".to_string(), Bytes::from_static(b"p1"))];
    assert!(
        matches!(group.sync(21, "a2", 2, reshuffled), Ok(Synced::Now(bytes)) if &bytes[..] == b"p0")
    );
    assert_eq!(group.heartbeat(21, "b2", 2), Ok(()));
    // Its protocols changed: now the group rebalances.
    let mut changed = static_request("", "pod-a");
    changed.protocols.push(("roundrobin".into(), Bytes::new()));
    waits(group.join(22, changed, "a3".into()));
    assert_eq!(group.state(), ClassicState::PreparingRebalance);
    waits(group.join(23, static_request("b2", "pod-b"), String::new()));
    let answers = join_replies(&mut group);
    assert_eq!(
        (answers["a3"].leader.as_str(), answers["a3"].generation),
        ("a3", 3)
    );
    // Leaving by instance id.
    assert_eq!(group.member_of_instance("pod-a"), Some("a3"));
    assert_eq!(group.leave(24, "a3"), Ok(()));
    assert_eq!(group.member_of_instance("pod-a"), None);
}

/// A stable group's snapshot, restored by a new coordinator, goes on as it was: the same
/// generation and assignments, members heartbeating and committing with no rebalance, a static
/// member's instance still fenced by id; a member that then stays silent expires from the
/// restore's clock. Mid-rebalance there is no snapshot, and one whose leader is no member is
/// refused.
#[test]
fn a_stable_group_restored_from_its_snapshot_goes_on_without_a_rebalance() {
    let mut group = ClassicGroup::new(0);
    waits(group.join(0, static_request("", "pod-a"), "a".into()));
    group.take_replies();
    group.sync(0, "a", 1, Vec::new()).unwrap();
    waits(group.join(1, request("", &["range"]), "b".into()));
    waits(group.join(2, static_request("a", "pod-a"), String::new()));
    assert_eq!(group.snapshot(), None, "mid-rebalance: nothing to keep");
    group.take_replies();
    group.sync(3, "b", 2, Vec::new()).unwrap();
    let assignments = vec![
        ("a".to_string(), Bytes::from_static(b"p0")),
        ("b".to_string(), Bytes::from_static(b"p1")),
    ];
    group.sync(3, "a", 2, assignments).unwrap();
    group.take_replies();
    let snapshot = group.snapshot().expect("a stable group has a snapshot");
    assert_eq!((snapshot.generation, snapshot.leader.as_str()), (2, "a"));

    // Through the record's JSON, as a new coordinator reads it.
    let stored = serde_json::to_string(&snapshot).unwrap();
    let mut restored =
        ClassicGroup::restore(serde_json::from_str(&stored).unwrap(), 1_000).unwrap();
    assert_eq!(restored.state(), ClassicState::Stable);
    assert_eq!(restored.generation(), 2);
    assert_eq!(restored.snapshot(), Some(snapshot.clone()));
    assert_eq!(restored.heartbeat(1_001, "a", 2), Ok(()));
    assert_eq!(restored.heartbeat(1_001, "b", 2), Ok(()));
    assert_eq!(restored.check_commit("b", 2), Ok(()));
    assert_eq!(
        restored.check_instance("b", Some("pod-a")),
        Err(ClassicError::FencedInstanceId)
    );
    // b's sync at the same generation (as after a lost answer) gets its assignment back.
    assert!(
        matches!(restored.sync(1_002, "b", 2, Vec::new()), Ok(Synced::Now(bytes)) if &bytes[..] == b"p1")
    );
    // a keeps heartbeating, b falls silent: b expires 10 s (its session) after the restore.
    assert_eq!(restored.heartbeat(10_500, "a", 2), Ok(()));
    assert!(restored.tick(10_900).is_empty());
    assert_eq!(restored.tick(11_100), ["b".to_string()]);

    let mut leaderless = snapshot;
    leaderless.leader = "z".into();
    assert!(ClassicGroup::restore(leaderless, 0).is_err());
}

/// Kafka's `group.initial.rebalance.delay.ms`: a group out of Empty holds its first
/// generation for the delay even once everyone it knows has joined, and for one more delay
/// each time another member joins meanwhile, never past the members' rebalance timeout; so
/// consumers that start together share one generation instead of a second rebalance.
#[test]
fn a_group_out_of_empty_waits_the_initial_delay_for_more_members() {
    let mut group = ClassicGroup::new(1).with_initial_rebalance_delay(3_000);
    assert_eq!(
        waits(group.join(0, request("", &["range"]), "a".into())),
        "a"
    );
    assert!(group.tick(2_999).is_empty());
    assert!(join_replies(&mut group).is_empty(), "held for the delay");
    // A second member within the delay: the wait runs one more delay from when it ends.
    assert_eq!(
        waits(group.join(1_000, request("", &["range"]), "b".into())),
        "b"
    );
    group.tick(3_000);
    assert!(
        join_replies(&mut group).is_empty(),
        "extended for the newcomer"
    );
    group.tick(5_999);
    assert!(join_replies(&mut group).is_empty());
    group.tick(6_000);
    let answers = join_replies(&mut group);
    assert_eq!(answers.len(), 2);
    assert!(answers.values().all(|answer| answer.generation == 2));
    assert_eq!(answers["a"].members.len(), 2, "the leader sees both");

    // A rebalance of a group with members is not delayed: it completes once all rejoin.
    group.sync(6_001, "a", 2, Vec::new()).unwrap();
    group.sync(6_001, "b", 2, Vec::new()).unwrap();
    group.take_replies();
    assert_eq!(
        waits(group.join(7_000, request("", &["range"]), "c".into())),
        "c"
    );
    waits(group.join(7_001, request("a", &["range"]), String::new()));
    waits(group.join(7_002, request("b", &["range"]), String::new()));
    assert_eq!(
        join_replies(&mut group).len(),
        3,
        "answered without a delay"
    );

    // The waits never run past the rebalance timeout (here 5 s): newcomers every second.
    let mut group = ClassicGroup::new(1).with_initial_rebalance_delay(3_000);
    let mut timed = request("", &["range"]);
    timed.rebalance_timeout_ms = 5_000;
    waits(group.join(0, timed.clone(), "m0".into()));
    for second in 1..8u64 {
        let now = second * 1_000;
        group.join(now, timed.clone(), format!("m{second}"));
        group.tick(now);
        if !join_replies(&mut group).is_empty() {
            assert!(now <= 5_000, "completed at {now} ms, past the 5 s timeout");
            return;
        }
    }
    panic!("the initial delay never ended");
}

/// The only member leaving during the initial delay leaves the group Empty, not waiting.
#[test]
fn the_last_member_leaving_in_the_initial_delay_empties_the_group() {
    let mut group = ClassicGroup::new(1).with_initial_rebalance_delay(3_000);
    waits(group.join(0, request("", &["range"]), "a".into()));
    group.leave(10, "a").unwrap();
    assert_eq!(group.state(), ClassicState::Empty);
}

/// A rebalance waits for the ids it handed out with MEMBER_ID_REQUIRED, as Kafka's coordinator
/// does: a client that started while the others rejoined lands in the same generation, not a
/// second rebalance after it; an id whose client never comes back is given up after its
/// session timeout.
#[test]
fn a_rebalance_waits_for_members_told_to_come_back_with_their_ids() {
    let mut group = ClassicGroup::new(1);
    waits(group.join(0, request("", &["range"]), "a".into()));
    join_replies(&mut group);
    group.sync(1, "a", 2, Vec::new()).unwrap();
    group.take_replies();
    // b starts a rebalance; c's first join is told its id (pending) meanwhile.
    waits(group.join(10, request("", &["range"]), "b".into()));
    let mut first = request("", &["range"]);
    first.require_known_member_id = true;
    let told = join_now(group.join(11, first, "c".into()));
    assert_eq!(told.member_id, "c");
    waits(group.join(12, request("a", &["range"]), String::new()));
    assert!(join_replies(&mut group).is_empty(), "waits for c");
    waits(group.join(13, request("c", &["range"]), String::new()));
    let answers = join_replies(&mut group);
    assert_eq!(answers.len(), 3);
    assert_eq!(
        answers["a"].members.len(),
        3,
        "one generation for all three"
    );

    // An id never used again stops holding the rebalance once its session timeout passes.
    let generation = answers["a"].generation;
    for member in ["a", "b", "c"] {
        group.sync(20, member, generation, Vec::new()).unwrap();
    }
    group.take_replies();
    let mut first = request("", &["range"]);
    first.require_known_member_id = true;
    join_now(group.join(30, first, "d".into()));
    group.leave(31, "c").unwrap();
    waits(group.join(32, request("a", &["range"]), String::new()));
    waits(group.join(33, request("b", &["range"]), String::new()));
    assert!(join_replies(&mut group).is_empty(), "waits for d");
    group.tick(30 + 10_001);
    let answers = join_replies(&mut group);
    assert_eq!(answers.len(), 2);
    assert_eq!(answers["a"].members.len(), 2);
}
