//! This node's membership of the cluster, as a state machine without IO: when to read the
//! cluster state, what a read (or a failed one) means for the view the shards act on, when to
//! register again or take a new lease, and when a leaving node may stop.
//!
//! The control thread feeds it what happened (`handle_*`, with the time as an argument) and
//! carries out the [`Step`]s it asks for (`poll_step`), each of which is one call on the
//! coordinator or the shards. Its rules:
//! - A node whose lease may have lapsed stops leading and following at once (fail safe, not
//!   split brain), then takes a new lease and registers again; a node that left never does.
//! - A node that finds itself unregistered on a valid lease registers again.
//! - The state is read on every reported change, while no watch runs, after a failed read,
//!   while leaving, and every [`STATE_REREAD`] as a safety net; otherwise not (a read is every
//!   partition key).
//! - A leaving node is answered once nothing it leads can move, or after [`LEAVE_PATIENCE`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::server::messages::ClusterView;

use super::view;

/// How long a leaving node waits for its leaderships to move before it stops anyway (no other
/// replica in sync, etcd unreachable).
pub(super) const LEAVE_PATIENCE: Duration = Duration::from_secs(5);

/// How often the cluster state is read while its watch runs and saw no change: a safety net,
/// not the way changes arrive.
pub(super) const STATE_REREAD: Duration = Duration::from_secs(10);

/// What the membership asks the control thread to do.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Give this view to the shards (and wait until each applied it) and the group thread.
    Announce(ClusterView),
    /// Watch the cluster's state for changes after this revision.
    Watch(i64),
    /// Register this broker again on its current lease.
    RegisterAgain,
    /// Take a new lease, then register again.
    Rejoin,
    /// Find out whether anything this node leads could still move; the answer goes to
    /// [`Membership::handle_hand_off`].
    CheckHandOff,
    /// Answer the request to leave: this node may stop.
    AnswerLeave,
}

/// What the control thread knows when it wakes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wake {
    /// The watch reported a change.
    pub changed: bool,
    /// A watch is running.
    pub watching: bool,
    /// The coordinator says this node's lease may still be valid.
    pub lease_valid: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaving {
    /// A member of the cluster.
    No,
    /// Left; waiting until its leaderships moved, at most until `deadline`.
    HandingOff { deadline: Instant },
    /// Left and answered.
    Left,
}

pub(super) struct Membership {
    node_id: i32,
    /// The view last given to the shards.
    last: ClusterView,
    /// The last read failed: read again at the next wake.
    stale: bool,
    read_at: Instant,
    leaving: Leaving,
    steps: VecDeque<Step>,
}

impl Membership {
    /// A member that has just read and announced `view` at `now`.
    pub(super) fn new(node_id: i32, view: ClusterView, now: Instant) -> Membership {
        Membership {
            node_id,
            last: view,
            stale: false,
            read_at: now,
            leaving: Leaving::No,
            steps: VecDeque::new(),
        }
    }

    /// Whether this node takes part in the controller election (it has not left).
    pub(super) fn campaigns(&self) -> bool {
        self.leaving == Leaving::No
    }

    /// Whether this node has left the cluster (asked to, answered or not).
    pub(super) fn left(&self) -> bool {
        self.leaving != Leaving::No
    }

    /// The view the shards act on.
    #[cfg(test)]
    pub(super) fn view(&self) -> &ClusterView {
        &self.last
    }

    /// Whether to read the cluster state at this wake.
    pub(super) fn poll_read(&self, now: Instant, wake: Wake) -> bool {
        wake.changed
            || self.stale
            || !wake.watching
            || !wake.lease_valid
            || matches!(self.leaving, Leaving::HandingOff { .. })
            || now.duration_since(self.read_at) >= STATE_REREAD
    }

    /// A controller pass failed: whatever it acted on may be out of date.
    pub(super) fn handle_controller_failed(&mut self) {
        self.stale = true;
    }

    /// This node announced `view` itself (after a change it made).
    pub(super) fn handle_announced(&mut self, view: ClusterView) {
        self.last = view;
    }

    /// The node was asked to leave the cluster (and has given up its registration).
    pub(super) fn handle_leave(&mut self, now: Instant) {
        if self.leaving == Leaving::No {
            self.leaving = Leaving::HandingOff {
                deadline: now + LEAVE_PATIENCE,
            };
        }
        self.steps.push_back(Step::CheckHandOff);
    }

    /// The answer to [`Step::CheckHandOff`]: whether nothing this node leads could still move.
    pub(super) fn handle_hand_off(&mut self, now: Instant, nothing_left: bool) {
        if let Leaving::HandingOff { deadline } = self.leaving
            && (nothing_left || now >= deadline)
        {
            self.leaving = Leaving::Left;
            self.steps.push_back(Step::AnswerLeave);
        }
    }

    /// A read of the cluster state: the view and its revision, or that it failed. `wake` as
    /// of after the read (the lease may have lapsed meanwhile).
    pub(super) fn handle_read(
        &mut self,
        now: Instant,
        read: Option<(ClusterView, i64)>,
        wake: Wake,
    ) {
        self.read_at = now;
        self.stale = read.is_none();
        if matches!(self.leaving, Leaving::HandingOff { .. }) {
            self.steps.push_back(Step::CheckHandOff);
        }
        let Some((view, revision)) = read else {
            if !wake.lease_valid {
                if let Some(out) = view::out_of_the_cluster(&self.last, self.node_id) {
                    tracing::error!(
                        node = self.node_id,
                        "etcd lease may have expired: no longer leading or following any partition here"
                    );
                    self.announce(out);
                }
                if self.leaving == Leaving::No {
                    self.steps.push_back(Step::Rejoin);
                }
            }
            return;
        };
        if !wake.watching {
            self.steps.push_back(Step::Watch(revision));
        }
        if self.leaving == Leaving::No
            && wake.lease_valid
            && !view.brokers.iter().any(|broker| broker.id == self.node_id)
        {
            // On a valid lease but not registered: the registration after a lapse found the
            // key still held by this node's previous lease (an etcd leader change extends every
            // lease by its TTL), or the key went. Register once it is free, whatever the cause.
            self.steps.push_back(Step::RegisterAgain);
        }
        if view != self.last {
            tracing::info!(
                topics = view.topics.len(),
                brokers = view.brokers.len(),
                "cluster state changed"
            );
            self.announce(view);
        }
    }

    fn announce(&mut self, view: ClusterView) {
        self.last = view.clone();
        self.steps.push_back(Step::Announce(view));
    }

    /// The next thing to do, in the order it arose.
    pub(super) fn poll_step(&mut self) -> Option<Step> {
        self.steps.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use strata_coordinator::{BrokerInfo, PartitionState, TopicState, placement};

    use super::*;

    const ME: i32 = 1;

    fn broker(id: i32) -> BrokerInfo {
        strata_coordinator::conformance::broker(id)
    }

    /// One topic of one partition led by `leader`, replicas 1 and 2, and the brokers `brokers`.
    fn view(leader: i32, brokers: &[i32]) -> ClusterView {
        let mut partition = PartitionState::initial(0, vec![1, 2]);
        partition.leader = leader;
        ClusterView {
            topics: Arc::new(vec![TopicState {
                name: "t".into(),
                replication_factor: 2,
                config: Default::default(),
                partitions: vec![partition],
                id: Default::default(),
            }]),
            brokers: Arc::new(brokers.iter().copied().map(broker).collect()),
            controller: 2,
            security: Default::default(),
            quotas: Default::default(),
            dynamic: Default::default(),
            group_configs: Default::default(),
        }
    }

    fn wake(changed: bool, watching: bool, lease_valid: bool) -> Wake {
        Wake {
            changed,
            watching,
            lease_valid,
        }
    }

    fn steps(membership: &mut Membership) -> Vec<Step> {
        std::iter::from_fn(|| membership.poll_step()).collect()
    }

    #[test]
    fn reads_on_change_without_a_watch_after_a_failure_and_as_a_safety_net() {
        let start = Instant::now();
        let mut membership = Membership::new(ME, view(ME, &[1, 2]), start);
        let quiet = wake(false, true, true);
        assert!(!membership.poll_read(start + Duration::from_secs(1), quiet));
        assert!(membership.poll_read(start, wake(true, true, true)));
        assert!(membership.poll_read(start, wake(false, false, true)));
        assert!(membership.poll_read(start, wake(false, true, false)));
        assert!(membership.poll_read(start + STATE_REREAD, quiet));
        // A failed read is read again; a good one resets the clock.
        let later = start + Duration::from_secs(3);
        membership.handle_read(later, None, quiet);
        assert!(membership.poll_read(later, quiet));
        membership.handle_read(later, Some((view(ME, &[1, 2]), 9)), quiet);
        assert!(!membership.poll_read(later + STATE_REREAD - Duration::from_millis(1), quiet));
        // As does a failed controller pass.
        membership.handle_controller_failed();
        assert!(membership.poll_read(later, quiet));
        assert_eq!(steps(&mut membership), []);
    }

    #[test]
    fn a_changed_view_is_announced_once_and_a_read_without_a_watch_starts_one() {
        let now = Instant::now();
        let mut membership = Membership::new(ME, view(ME, &[1, 2]), now);
        membership.handle_read(now, Some((view(ME, &[1, 2]), 5)), wake(true, true, true));
        assert_eq!(steps(&mut membership), [], "the same view again");
        let moved = view(2, &[1, 2]);
        membership.handle_read(now, Some((moved.clone(), 6)), wake(true, false, true));
        assert_eq!(
            steps(&mut membership),
            [Step::Watch(6), Step::Announce(moved.clone())]
        );
        assert_eq!(membership.view(), &moved);
    }

    #[test]
    fn a_lapsed_lease_stops_leading_and_following_at_once_then_rejoins() {
        let now = Instant::now();
        let mut membership = Membership::new(ME, view(ME, &[1, 2]), now);
        membership.handle_read(now, None, wake(false, true, false));
        let [Step::Announce(out), Step::Rejoin] = &steps(&mut membership)[..] else {
            panic!("expected the node out of the cluster, then a rejoin");
        };
        assert!(
            out.topics[0]
                .partitions
                .iter()
                .all(|p| p.leader == placement::NO_LEADER)
        );
        assert_eq!(out.brokers.iter().map(|b| b.id).collect::<Vec<_>>(), [2]);
        // Still out: nothing more to announce, but it keeps trying to rejoin.
        membership.handle_read(now, None, wake(false, true, false));
        assert_eq!(steps(&mut membership), [Step::Rejoin]);
        // A failed read on a valid lease (etcd slow) changes nothing.
        membership.handle_read(now, None, wake(false, true, true));
        assert_eq!(steps(&mut membership), []);
    }

    #[test]
    fn unregistered_on_a_valid_lease_registers_again() {
        let now = Instant::now();
        let mut membership = Membership::new(ME, view(ME, &[1, 2]), now);
        let dropped = view(placement::NO_LEADER, &[2]);
        membership.handle_read(now, Some((dropped.clone(), 7)), wake(true, true, true));
        assert_eq!(
            steps(&mut membership),
            [Step::RegisterAgain, Step::Announce(dropped)]
        );
    }

    #[test]
    fn a_leaving_node_is_answered_once_handed_off_or_out_of_patience_and_never_rejoins() {
        let now = Instant::now();
        let mut membership = Membership::new(ME, view(ME, &[1, 2]), now);
        membership.handle_leave(now);
        assert!(!membership.campaigns() && membership.left());
        assert_eq!(steps(&mut membership), [Step::CheckHandOff]);
        membership.handle_hand_off(now, false);
        assert_eq!(steps(&mut membership), []);
        // While handing off it reads at every wake, checks again, and neither rejoins nor
        // registers again.
        assert!(membership.poll_read(now, wake(false, true, true)));
        membership.handle_read(now, None, wake(false, true, false));
        let unregistered = view(ME, &[2]);
        membership.handle_read(now, Some((unregistered.clone(), 3)), wake(true, true, true));
        let after = steps(&mut membership);
        assert!(!after.contains(&Step::Rejoin) && !after.contains(&Step::RegisterAgain));
        assert_eq!(
            after.iter().filter(|s| **s == Step::CheckHandOff).count(),
            2
        );
        // Out of patience: answered although a leadership could still move.
        membership.handle_hand_off(now + LEAVE_PATIENCE, false);
        assert_eq!(steps(&mut membership), [Step::AnswerLeave]);
        membership.handle_hand_off(now + LEAVE_PATIENCE, true);
        assert_eq!(steps(&mut membership), [], "answered once");
        assert!(!membership.poll_read(now + Duration::from_secs(1), wake(false, true, true)));

        let mut last_broker = Membership::new(ME, view(ME, &[1]), now);
        last_broker.handle_leave(now);
        assert_eq!(steps(&mut last_broker), [Step::CheckHandOff]);
        last_broker.handle_hand_off(now, true);
        assert_eq!(steps(&mut last_broker), [Step::AnswerLeave]);
    }
}
