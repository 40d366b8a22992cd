//! The cluster as this node reads it: the view its shards act on, and the facts about the
//! stored state that membership decisions need.

use std::sync::Arc;

use strata_coordinator::{Coordinator, CoordinatorError, TopicState, placement};

use crate::server::broker_config::DynamicSettings;
use crate::server::messages::{ClusterView, SecurityView};
use crate::server::security::SecurityConfig;

/// The cluster view and the revision it was read at. A node whose lease may have lapsed reads
/// nothing: what it would see is not its to act on.
pub(super) async fn read_view(
    coordinator: &impl Coordinator,
    security: &SecurityConfig,
) -> Result<(ClusterView, i64), CoordinatorError> {
    if !coordinator.lease_valid() {
        return Err(CoordinatorError::Unavailable(
            "this node's etcd lease may have expired".into(),
        ));
    }
    let (mut topics, revision) = coordinator.topics_at().await?;
    let brokers = coordinator.brokers().await?;
    let node_id = coordinator.node_id();
    // Leadership of a node that is not registered (its lease expired while it was paused
    // or cut off) is not ours to act on, whatever the partition state still says.
    if !brokers.iter().any(|broker| broker.id == node_id) {
        demote(&mut topics, node_id);
    }
    let security = SecurityView::new(
        coordinator.users().await?,
        coordinator.acls().await?,
        security.authorizer.as_ref(),
    );
    let view = ClusterView {
        topics: Arc::new(topics),
        brokers: Arc::new(brokers),
        controller: coordinator.controller(),
        security: Arc::new(security),
        quotas: Arc::new(crate::quota::QuotaBook::new(
            coordinator.client_quotas().await?,
        )),
        dynamic: Arc::new(DynamicSettings::new(
            coordinator.broker_configs().await?,
            node_id,
        )),
        group_configs: Arc::new(
            coordinator
                .group_configs()
                .await?
                .into_iter()
                .map(|record| (record.group, record.values))
                .collect(),
        ),
    };
    Ok((view, revision))
}

/// Marks every partition `node_id` holds a replica of as leaderless (in this node's view only):
/// a node out of the cluster neither leads nor follows.
pub(super) fn demote(topics: &mut [TopicState], node_id: i32) {
    for topic in topics {
        for partition in &mut topic.partitions {
            if partition.replicas.contains(&node_id) {
                partition.leader = placement::NO_LEADER;
            }
        }
    }
}

/// `view` as a node out of the cluster must see it: no partition led, and itself not among
/// the registered brokers (its `/health` and `cluster info` say so). `None` when `view` already
/// has nothing for it to lead or follow.
pub(super) fn out_of_the_cluster(view: &ClusterView, node_id: i32) -> Option<ClusterView> {
    let acts = view.topics.iter().any(|topic| {
        topic
            .partitions
            .iter()
            .any(|p| p.replicas.contains(&node_id) && p.leader != placement::NO_LEADER)
    });
    if !acts {
        return None;
    }
    let mut topics = view.topics.as_ref().clone();
    demote(&mut topics, node_id);
    let brokers = view
        .brokers
        .iter()
        .filter(|broker| broker.id != node_id)
        .cloned()
        .collect();
    Some(ClusterView {
        topics: Arc::new(topics),
        brokers: Arc::new(brokers),
        controller: view.controller,
        security: view.security.clone(),
        quotas: view.quotas.clone(),
        dynamic: view.dynamic.clone(),
        group_configs: view.group_configs.clone(),
    })
}

/// Whether a leaving node has no leadership left that another broker could take: none names
/// it leader, or no other live broker is a replica the controller may elect (in the ISR, or
/// anywhere with unclean election). The last broker of a cluster then stops at once instead of
/// waiting out its patience. Reads the stored state itself: the view demotes an unregistered
/// node, so it would say "led nothing" before anything moved.
pub(super) async fn nothing_to_hand_off(coordinator: &impl Coordinator) -> bool {
    let (Ok(topics), Ok(brokers)) = (coordinator.topics().await, coordinator.brokers().await)
    else {
        return false;
    };
    let node_id = coordinator.node_id();
    let Ok(dynamic) = dynamic_settings(coordinator).await else {
        return false;
    };
    let successor = |candidate: &i32| {
        *candidate != node_id && brokers.iter().any(|broker| broker.id == *candidate)
    };
    !topics.iter().any(|topic| {
        let unclean = dynamic.unclean_election(topic);
        topic.partitions.iter().any(|p| {
            p.leader == node_id
                && if unclean {
                    p.replicas.iter().any(successor)
                } else {
                    p.isr.iter().any(successor)
                }
        })
    })
}

/// The broker settings set live that apply to this node, read now.
pub(super) async fn dynamic_settings(
    coordinator: &impl Coordinator,
) -> Result<DynamicSettings, CoordinatorError> {
    Ok(DynamicSettings::new(
        coordinator.broker_configs().await?,
        coordinator.node_id(),
    ))
}
