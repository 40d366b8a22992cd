//! The controller: this node's part in the election, and the controller's job once elected:
//! moving leadership off dead brokers with fenced writes, completing reassignments, and moving
//! leaderships back to preferred replicas.

use std::time::{Duration, Instant};

use strata_coordinator::{
    ControllerKey, Coordinator, CoordinatorError, StoredPartition, placement,
};
use tokio::sync::mpsc;

use super::view::dynamic_settings;

/// This node's part in the controller election, and the controller's job once elected:
/// moving leadership off dead brokers with fenced writes, and back to preferred replicas.
pub(super) struct Controller {
    campaign: Option<tokio::task::JoinHandle<Result<ControllerKey, CoordinatorError>>>,
    key: Option<ControllerKey>,
    /// How often leaderships go back to preferred replicas (`None`: never).
    rebalance_interval: Option<Duration>,
    rebalanced_at: Instant,
}

impl Controller {
    /// A node not (yet) elected; leaderships go back to preferred replicas every
    /// `rebalance_interval` once it is.
    pub(super) fn new(rebalance_interval: Option<Duration>, now: Instant) -> Controller {
        Controller {
            campaign: None,
            key: None,
            rebalance_interval,
            rebalanced_at: now,
        }
    }
}

impl Controller {
    /// `wake` gets a message when a campaign ends, so the new controller's first pass runs at
    /// once rather than at the next tick (a controller that left took a second to replace).
    /// Returns false when a failover pass failed (it should run again at the next tick).
    /// The pass runs when `state_changed` (or at once on election), since brokers leave and
    /// join through keys the watch reports, and every rebalance interval, when it also moves
    /// leaderships back to preferred replicas.
    pub(super) async fn tick(
        &mut self,
        coordinator: &impl Coordinator,
        wake: &mpsc::UnboundedSender<()>,
        state_changed: bool,
        now: Instant,
    ) -> bool {
        let node_id = coordinator.node_id();
        let mut elected = false;
        if self.key.is_none() {
            match &self.campaign {
                None => {
                    let (campaign, wake) = (coordinator.campaign(), wake.clone());
                    self.campaign = Some(tokio::spawn(async move {
                        let elected = campaign.await;
                        let _ = wake.send(());
                        elected
                    }));
                }
                Some(task) if task.is_finished() => {
                    let task = self.campaign.take().expect("checked above");
                    match task.await {
                        Ok(Ok(key)) => {
                            tracing::info!(node = node_id, "elected controller");
                            self.key = Some(key);
                            elected = true;
                        }
                        Ok(Err(error)) => tracing::warn!("controller campaign failed: {error}"),
                        Err(error) => tracing::warn!("controller campaign task failed: {error}"),
                    }
                }
                Some(_) => {}
            }
        }
        // Unknown (etcd unreachable now) is not "someone else": only a controller read back
        // as another node, or as none, ends this node's role.
        let current = match coordinator.refresh_controller().await {
            Ok(current) => current,
            Err(_) => return self.key.is_none(),
        };
        if self.key.is_some() && current != node_id {
            tracing::warn!(node = node_id, current, "no longer the controller");
            self.key = None;
        }
        let rebalance = self
            .rebalance_interval
            .is_some_and(|interval| now.duration_since(self.rebalanced_at) >= interval);
        let Some(key) = self.key.clone() else {
            return true;
        };
        if !(state_changed || elected || rebalance) {
            return true;
        }
        if let Err(error) = self.fail_over(coordinator, &key, rebalance).await {
            tracing::warn!("controller failover pass failed: {error}");
            return false;
        }
        if rebalance {
            self.rebalanced_at = now;
        }
        true
    }

    /// Moves leadership of partitions whose leader is not a live broker (DESIGN §6), completes
    /// reassignments, and with `rebalance` moves leaderships back to preferred replicas.
    async fn fail_over(
        &mut self,
        coordinator: &impl Coordinator,
        key: &ControllerKey,
        rebalance: bool,
    ) -> Result<(), CoordinatorError> {
        let live: std::collections::BTreeSet<i32> = coordinator
            .brokers()
            .await?
            .iter()
            .map(|broker| broker.id)
            .collect();
        let (topics, stored) = coordinator.topics_with_revisions().await?;
        // A topic without its own `unclean.leader.election` takes the default set live.
        let dynamic = dynamic_settings(coordinator).await?;
        // A creator that stopped between a topic's record and its last partition key leaves
        // partitions without keys (readers see their initial state): write them.
        let mut keys: std::collections::BTreeMap<&str, usize> = Default::default();
        for (topic, ..) in &stored {
            *keys.entry(topic.as_str()).or_default() += 1;
        }
        for topic in &topics {
            if keys.get(topic.name.as_str()).copied().unwrap_or(0) < topic.partitions.len() {
                let written = coordinator.create_missing_partitions(&topic.name).await?;
                tracing::info!(topic = %topic.name, written, "controller wrote partition keys a creator had not");
            }
        }
        // Every change of this pass, written together (in transactions of many partitions).
        let mut planned = Vec::new();
        for (topic, state, revision) in stored {
            let unclean = topics
                .iter()
                .find(|t| t.name == topic)
                .is_some_and(|topic| dynamic.unclean_election(topic));
            let failover = placement::failover(std::slice::from_ref(&state), &live, unclean).pop();
            let preferred = || {
                rebalance
                    .then(|| placement::prefer_leader(&state, &live))
                    .flatten()
            };
            if let Some(change) = failover
                .or_else(|| placement::complete_reassignment(&state))
                .or_else(preferred)
            {
                planned.push((topic, state, change, revision, unclean));
            }
        }
        let writes: Vec<StoredPartition> = planned
            .iter()
            .map(|(topic, _, change, revision, _)| (topic.clone(), change.clone(), *revision))
            .collect();
        let outcomes = coordinator.write_partitions_fenced(&writes, key).await?;
        let mut refused = false;
        for ((topic, state, change, _, unclean), stored) in planned.into_iter().zip(outcomes) {
            if !stored {
                refused = true;
                continue;
            }
            if unclean && !state.isr.contains(&change.leader) {
                tracing::error!(%topic, partition = state.partition, leader = change.leader,
                    "UNCLEAN leader election: records the old leader had may be lost");
            }
            if state.target_replicas.is_some() && change.target_replicas.is_none() {
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    replicas = ?change.replicas,
                    leader = change.leader,
                    "reassignment complete"
                );
            } else if change.leader == state.leader {
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    isr = ?change.isr,
                    "controller removed dead brokers from the ISR"
                );
            } else {
                // A live leader gives way only to its preferred replica.
                let why = if live.contains(&state.leader) {
                    "back to the preferred replica"
                } else {
                    "off a dead broker"
                };
                tracing::info!(
                    %topic,
                    partition = state.partition,
                    from = state.leader,
                    to = change.leader,
                    epoch = change.leader_epoch,
                    isr = ?change.isr,
                    "controller moved partition leadership {why}"
                );
            }
        }
        if refused
            && coordinator
                .refresh_controller()
                .await
                .is_ok_and(|current| current != coordinator.node_id())
        {
            // The fence held: someone else controls the cluster now.
            self.key = None;
        }
        Ok(())
    }
}
