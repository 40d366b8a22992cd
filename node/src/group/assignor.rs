//! Partition assignors: pure functions from (members and their subscriptions, partition
//! counts, the previous target) to a new target assignment.
//!
//! Invariants of every plan: each member of the input has an entry (possibly empty); a partition
//! goes only to a member subscribed to its topic; every partition of a subscribed topic that
//! exists goes to exactly one member; the same input gives the same plan (no hashing, no
//! randomness: all iteration is over sorted maps).

use std::collections::{BTreeMap, BTreeSet};

use super::{AssignorKind, PartitionCounts, TopicPartition};

/// Member id → the topics it subscribes to (sorted, deduplicated). A `BTreeMap`, so members come
/// sorted by id, which is what makes Range and RoundRobin layouts well defined.
pub type Subscriptions = BTreeMap<String, BTreeSet<String>>;

/// Member id → the partitions it should own.
pub type Plan = BTreeMap<String, BTreeSet<TopicPartition>>;

/// Computes the target assignment with `kind`. `previous` is the last target (only Sticky reads
/// it); members in it that are gone, and partitions in it that no longer exist, are ignored.
pub fn assign(
    kind: AssignorKind,
    members: &Subscriptions,
    partitions: &PartitionCounts,
    previous: &Plan,
) -> Plan {
    let plan = match kind {
        AssignorKind::Range => range(members, partitions),
        AssignorKind::RoundRobin => round_robin(members, partitions),
        AssignorKind::Sticky => sticky(members, partitions, previous),
    };
    debug_assert!(is_complete(&plan, members, partitions));
    plan
}

fn empty_plan(members: &Subscriptions) -> Plan {
    members
        .keys()
        .map(|member_id| (member_id.clone(), BTreeSet::new()))
        .collect()
}

/// Topics that someone subscribes to and that exist, with their partition counts.
fn subscribed_topics<'a>(
    members: &'a Subscriptions,
    partitions: &'a PartitionCounts,
) -> impl Iterator<Item = (&'a String, u32)> + 'a {
    partitions
        .iter()
        .filter(|(topic, _)| members.values().any(|topics| topics.contains(*topic)))
        .map(|(topic, count)| (topic, *count))
}

/// Kafka's RangeAssignor: per topic, the subscribed members sorted by id get contiguous ranges;
/// the first `count % n` of them get one partition more.
pub fn range(members: &Subscriptions, partitions: &PartitionCounts) -> Plan {
    let mut plan = empty_plan(members);
    for (topic, count) in subscribed_topics(members, partitions) {
        let subscribers: Vec<&String> = members
            .iter()
            .filter(|(_, topics)| topics.contains(topic))
            .map(|(member_id, _)| member_id)
            .collect();
        let n = u32::try_from(subscribers.len()).expect("fewer than 2^32 members");
        debug_assert!(n > 0, "subscribed_topics yields only subscribed topics");
        let (per_member, extra) = (count / n, count % n);
        let mut start = 0;
        for (index, member_id) in (0..n).zip(subscribers) {
            let len = per_member + u32::from(index < extra);
            let owned = plan.get_mut(member_id).expect("every member has an entry");
            owned.extend(
                (start..start + len).map(|partition| TopicPartition::new(topic, partition)),
            );
            start += len;
        }
        assert_eq!(start, count, "the ranges cover the topic");
    }
    plan
}

/// Kafka's RoundRobinAssignor: all subscribed partitions sorted by (topic, partition), dealt to
/// the members sorted by id in turn; the turn skips members not subscribed to the topic and
/// carries on from where it stopped, across topics.
pub fn round_robin(members: &Subscriptions, partitions: &PartitionCounts) -> Plan {
    let mut plan = empty_plan(members);
    let order: Vec<(&String, &BTreeSet<String>)> = members.iter().collect();
    let mut turn = 0;
    for (topic, count) in subscribed_topics(members, partitions) {
        for partition in 0..count {
            // Someone subscribes to the topic, so this finds a member within one lap.
            while !order[turn % order.len()].1.contains(topic) {
                turn += 1;
            }
            let member_id = order[turn % order.len()].0;
            turn += 1;
            let owned = plan.get_mut(member_id).expect("every member has an entry");
            owned.insert(TopicPartition::new(topic, partition));
        }
    }
    plan
}

/// Sticky (cooperative) assignment with minimal movement:
/// 1. each partition stays with its previous target owner if that member is still here and still
///    subscribed to the topic;
/// 2. the partitions left over go one by one to the least-loaded subscribed member;
/// 3. while some member holds at least two more than another member that could take one of its
///    partitions, the most-loaded gives one to the least-loaded. A member above its fair share
///    thus gives up exactly its surplus and nothing else moves.
///
/// Step 3 terminates because each move lowers the sum of squared loads. With homogeneous
/// subscriptions the result has loads differing by at most one; adding a member to N members
/// moves about P/(N+1) partitions (all to the new member) and removing one moves only its own.
pub fn sticky(members: &Subscriptions, partitions: &PartitionCounts, previous: &Plan) -> Plan {
    let mut plan = empty_plan(members);
    let exists = |tp: &TopicPartition| partitions.get(&tp.topic).is_some_and(|&n| tp.partition < n);
    let mut placed: BTreeSet<TopicPartition> = BTreeSet::new();
    for (member_id, topics) in members {
        let Some(before) = previous.get(member_id) else {
            continue;
        };
        let owned = plan.get_mut(member_id).expect("every member has an entry");
        for tp in before {
            // A well-formed previous plan is disjoint; `placed` keeps a malformed one harmless.
            if topics.contains(&tp.topic) && exists(tp) && placed.insert(tp.clone()) {
                owned.insert(tp.clone());
            }
        }
    }

    for (topic, count) in subscribed_topics(members, partitions) {
        for partition in 0..count {
            let tp = TopicPartition::new(topic, partition);
            if placed.contains(&tp) {
                continue;
            }
            // Least loaded, ties to the smallest member id (min_by_key keeps the first).
            let member_id = members
                .iter()
                .filter(|(_, topics)| topics.contains(topic))
                .map(|(member_id, _)| member_id)
                .min_by_key(|member_id| plan[*member_id].len())
                .expect("subscribed_topics yields only subscribed topics")
                .clone();
            plan.get_mut(&member_id)
                .expect("a member")
                .insert(tp.clone());
            placed.insert(tp);
        }
    }

    while let Some((from, to, tp)) = next_balancing_move(members, &plan) {
        let moved = plan.get_mut(&from).expect("a member").remove(&tp);
        debug_assert!(moved);
        plan.get_mut(&to).expect("a member").insert(tp);
    }
    plan
}

/// The move that most reduces imbalance: from the most-loaded member that has a partition the
/// least-loaded eligible member may take. Deterministic: loads, then member ids, order the search;
/// the partition moved is the greatest one the receiver subscribes to.
fn next_balancing_move(
    members: &Subscriptions,
    plan: &Plan,
) -> Option<(String, String, TopicPartition)> {
    let mut by_load: Vec<(&String, usize)> = plan.iter().map(|(id, tps)| (id, tps.len())).collect();
    by_load.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    for &(from, from_load) in &by_load {
        for &(to, to_load) in by_load.iter().rev() {
            if from_load < to_load + 2 {
                // Receivers are scanned from the least loaded up: no later one qualifies.
                break;
            }
            let topics = &members[to];
            if let Some(tp) = plan[from]
                .iter()
                .rev()
                .find(|tp| topics.contains(&tp.topic))
            {
                return Some((from.clone(), to.clone(), tp.clone()));
            }
        }
    }
    None
}

/// The plan covers each subscribed, existing partition exactly once, only with subscribers.
fn is_complete(plan: &Plan, members: &Subscriptions, partitions: &PartitionCounts) -> bool {
    if plan.keys().ne(members.keys()) {
        return false;
    }
    let mut seen = BTreeSet::new();
    for (member_id, tps) in plan {
        for tp in tps {
            if !members[member_id].contains(&tp.topic) || !seen.insert(tp) {
                return false;
            }
        }
    }
    let expected: usize = subscribed_topics(members, partitions)
        .map(|(_, count)| count as usize)
        .sum();
    seen.len() == expected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscriptions(members: &[(&str, &[&str])]) -> Subscriptions {
        members
            .iter()
            .map(|(id, topics)| {
                let topics = topics.iter().map(|t| t.to_string()).collect();
                (id.to_string(), topics)
            })
            .collect()
    }

    /// (members and their topics, topics and their partition counts, the rendered plan).
    type Case = (
        &'static [(&'static str, &'static [&'static str])],
        &'static [(&'static str, u32)],
        &'static str,
    );

    fn counts(topics: &[(&str, u32)]) -> PartitionCounts {
        topics.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    /// One line per member: `id: t0 t1 u2`, the layout in a glance.
    fn render(plan: &Plan) -> String {
        plan.iter()
            .map(|(id, tps)| {
                let tps: Vec<String> = tps
                    .iter()
                    .map(|tp| format!("{}{}", tp.topic, tp.partition))
                    .collect();
                format!("{id}: {}\n", tps.join(" "))
            })
            .collect()
    }

    fn loads(plan: &Plan) -> Vec<usize> {
        plan.values().map(BTreeSet::len).collect()
    }

    fn moved(before: &Plan, after: &Plan) -> usize {
        after
            .iter()
            .map(|(id, tps)| {
                let kept = before
                    .get(id)
                    .map_or(0, |old| tps.intersection(old).count());
                tps.len() - kept
            })
            .sum()
    }

    #[test]
    fn range_layout() {
        let cases: &[Case] = &[
            (
                &[("a", &["t"]), ("b", &["t"]), ("c", &["t"])],
                &[("t", 7)],
                "a: t0 t1 t2\nb: t3 t4\nc: t5 t6\n",
            ),
            // Per topic: the extras land on the same (first) members of every topic.
            (
                &[("a", &["t", "u"]), ("b", &["t", "u"])],
                &[("t", 3), ("u", 3)],
                "a: t0 t1 u0 u1\nb: t2 u2\n",
            ),
            // Only subscribers count; a topic that does not exist gives nothing.
            (
                &[("a", &["t"]), ("b", &["u", "x"]), ("c", &["t", "u"])],
                &[("t", 4), ("u", 2)],
                "a: t0 t1\nb: u0\nc: t2 t3 u1\n",
            ),
            (&[("a", &["t"]), ("b", &["t"])], &[("t", 1)], "a: t0\nb: \n"),
        ];
        for (members, topics, expect) in cases {
            let plan = assign(
                AssignorKind::Range,
                &subscriptions(members),
                &counts(topics),
                &Plan::new(),
            );
            assert_eq!(render(&plan), *expect, "{members:?} {topics:?}");
        }
    }

    #[test]
    fn round_robin_layout() {
        let cases: &[Case] = &[
            (
                &[("a", &["t", "u"]), ("b", &["t", "u"])],
                &[("t", 3), ("u", 3)],
                "a: t0 t2 u1\nb: t1 u0 u2\n",
            ),
            // The turn skips non-subscribers and carries on across topics.
            (
                &[("a", &["t"]), ("b", &["t", "u"]), ("c", &["u"])],
                &[("t", 3), ("u", 3)],
                "a: t0 t2\nb: t1 u0 u2\nc: u1\n",
            ),
        ];
        for (members, topics, expect) in cases {
            let plan = assign(
                AssignorKind::RoundRobin,
                &subscriptions(members),
                &counts(topics),
                &Plan::new(),
            );
            assert_eq!(render(&plan), *expect, "{members:?} {topics:?}");
        }
    }

    #[test]
    fn every_assignor_balances_homogeneous_subscriptions() {
        for kind in [
            AssignorKind::Range,
            AssignorKind::RoundRobin,
            AssignorKind::Sticky,
        ] {
            for member_count in 1..=7 {
                let ids: Vec<String> = (0..member_count).map(|i| format!("m{i}")).collect();
                let members: Subscriptions = ids
                    .iter()
                    .map(|id| (id.clone(), BTreeSet::from(["t".to_string()])))
                    .collect();
                let plan = assign(kind, &members, &counts(&[("t", 20)]), &Plan::new());
                let (min, max) = (
                    loads(&plan).into_iter().min(),
                    loads(&plan).into_iter().max(),
                );
                assert!(max.unwrap() - min.unwrap() <= 1, "{kind:?} {member_count}");
            }
        }
    }

    #[test]
    fn sticky_adding_a_member_moves_only_its_share() {
        let topics = counts(&[("t", 10), ("u", 14)]);
        let mut members =
            subscriptions(&[("a", &["t", "u"]), ("b", &["t", "u"]), ("c", &["t", "u"])]);
        let before = sticky(&members, &topics, &Plan::new());
        assert_eq!(loads(&before), [8, 8, 8]);
        members.insert("d".into(), BTreeSet::from(["t".into(), "u".into()]));
        let after = sticky(&members, &topics, &before);
        assert_eq!(loads(&after), [6, 6, 6, 6]);
        assert_eq!(
            moved(&before, &after),
            6,
            "24 / 4 partitions move, all to d"
        );
        assert_eq!(after["d"].len(), 6);
    }

    #[test]
    fn sticky_removing_a_member_moves_only_its_partitions() {
        let topics = counts(&[("t", 13)]);
        let mut members =
            subscriptions(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"]), ("d", &["t"])]);
        let before = sticky(&members, &topics, &Plan::new());
        members.remove("b");
        let after = sticky(&members, &topics, &before);
        for (id, tps) in &after {
            assert!(before[id].is_subset(tps), "{id} kept all it had");
        }
        assert_eq!(moved(&before, &after), before["b"].len());
        let loads = loads(&after);
        assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1);
    }

    #[test]
    fn sticky_drops_unsubscribed_and_vanished_partitions_and_is_deterministic() {
        let members = subscriptions(&[("a", &["t"]), ("b", &["t", "u"])]);
        let previous: Plan = [
            ("a".to_string(), [("u", 0), ("t", 5), ("t", 0)]),
            ("b".to_string(), [("t", 1), ("u", 1), ("gone", 0)]),
        ]
        .into_iter()
        .map(|(id, tps)| {
            (
                id,
                tps.iter()
                    .map(|(t, p)| TopicPartition::new(t, *p))
                    .collect(),
            )
        })
        .collect();
        let topics = counts(&[("t", 4), ("u", 2)]);
        let plan = sticky(&members, &topics, &previous);
        assert_eq!(render(&plan), "a: t0 t2 t3\nb: t1 u0 u1\n");
        assert_eq!(plan, sticky(&members, &topics, &previous));
    }

    #[test]
    fn sticky_balances_across_heterogeneous_subscriptions_where_it_can() {
        // c may take only u; a and b share t. Start from a lopsided previous plan.
        let members = subscriptions(&[("a", &["t", "u"]), ("b", &["t"]), ("c", &["u"])]);
        let topics = counts(&[("t", 4), ("u", 4)]);
        let previous: Plan = [("a".to_string(), (0..4).flat_map(|p| [("t", p), ("u", p)]))]
            .into_iter()
            .map(|(id, tps)| (id, tps.map(|(t, p)| TopicPartition::new(t, p)).collect()))
            .collect();
        let plan = sticky(&members, &topics, &previous);
        assert_eq!(loads(&plan), [3, 2, 3]);
        assert!(plan["b"].iter().all(|tp| tp.topic == "t"));
        assert!(plan["c"].iter().all(|tp| tp.topic == "u"));
    }
}
