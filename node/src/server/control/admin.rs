//! The admin operations the control thread carries out for clients: topics created, deleted,
//! grown, reconfigured and reassigned, leaderships moved back, and a leader's own partition
//! change. Each returns the answer; the caller announces the new state before sending it.

use std::collections::BTreeMap;
use std::time::Duration;

use strata_coordinator::{
    ConfigChange, Coordinator, CoordinatorError, PartitionChange, PartitionState, TopicSpec,
    placement,
};
use strata_wire::protocol::{
    AlterTopicConfigRequest, AlterTopicConfigResponse, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest,
    DeleteTopicResponse, ElectLeadersRequest, ElectLeadersResponse, ErrorCode,
    ReassignPartitionRequest, ReassignPartitionResponse,
};

use crate::server::messages::{SecurityChange, SecurityChanged};
use crate::server::topic_config::{self, TopicConfig};

pub(super) async fn delete_topic(
    coordinator: &impl Coordinator,
    request: DeleteTopicRequest,
) -> DeleteTopicResponse {
    let error = match coordinator.delete_topic(&request.name).await {
        Ok(_) => {
            tracing::info!(topic = %request.name, "topic deleted");
            ErrorCode::None
        }
        Err(error) => error_code(&error),
    };
    DeleteTopicResponse { error }
}

pub(super) async fn reassign(
    coordinator: &impl Coordinator,
    request: ReassignPartitionRequest,
) -> ReassignPartitionResponse {
    let started = coordinator
        .reassign(&request.topic, request.partition, request.replicas.clone())
        .await;
    match started {
        Ok(state) => {
            tracing::info!(topic = %request.topic, partition = request.partition,
                replicas = ?state.replicas, target = ?request.replicas, "reassignment started");
            ReassignPartitionResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => ReassignPartitionResponse {
            error: error_code(&error),
            message: error.to_string(),
        },
    }
}

pub(super) async fn add_partitions(
    coordinator: &impl Coordinator,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let added = coordinator
        .add_partitions(
            &request.topic,
            request.partitions,
            &request.replica_assignment.0,
        )
        .await;
    match added {
        Ok(state) => {
            tracing::info!(topic = %request.topic, partitions = state.partitions.len(), "partitions added");
            CreatePartitionsResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => CreatePartitionsResponse {
            error: error_code(&error),
            message: error.to_string(),
        },
    }
}

/// Writes a leader's own partition change. When the answer is lost (etcd unreachable), reads
/// the partition back until it can tell whether the change was stored: a leader must never
/// believe an ISR expansion failed when it was in fact stored (the new member could then be
/// elected without everything below the high watermark).
pub(super) async fn update_partition(
    coordinator: &impl Coordinator,
    topic: &str,
    expected: &PartitionState,
    change: &PartitionChange,
) -> Option<PartitionState> {
    let first = coordinator
        .update_partition(topic, expected, change.clone())
        .await;
    let error = match first {
        Ok(stored) => return stored,
        Err(error) => error,
    };
    tracing::warn!(%topic, partition = expected.partition, "partition change unanswered: {error}");
    let wanted = change.apply(expected);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let topics = match coordinator.topics().await {
            Ok(topics) => topics,
            Err(_) => continue,
        };
        let current = topics
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.get(expected.partition as usize));
        return (current == Some(&wanted)).then_some(wanted);
    }
    None
}

/// A new topic's partition count: 1 to 100,000.
pub(crate) fn check_partition_count(partitions: u32) -> Result<(), String> {
    if partitions == 0 || partitions > 100_000 {
        return Err(format!("partitions={partitions}: expected 1 to 100000"));
    }
    Ok(())
}

pub(super) async fn create_topic(
    coordinator: &impl Coordinator,
    request: CreateTopicRequest,
) -> CreateTopicResponse {
    let failed = |error: ErrorCode, message: String| CreateTopicResponse { error, message };
    let overrides: BTreeMap<String, String> = request
        .configs
        .into_iter()
        .map(|entry| (entry.key, entry.value))
        .collect();
    if let Err(message) = TopicConfig::parse(&overrides) {
        return failed(ErrorCode::InvalidConfig, message);
    }
    if let Err(message) = check_partition_count(request.partitions) {
        return failed(ErrorCode::InvalidConfig, message);
    }
    let spec = TopicSpec {
        name: request.name.clone(),
        partitions: request.partitions,
        replication_factor: request.replication_factor.max(1),
        config: overrides,
        assignment: request.replica_assignment.0,
    };
    match coordinator.create_topic(spec).await {
        Ok(topic) => {
            tracing::info!(
                node = coordinator.node_id(),
                topic = %topic.name,
                partitions = topic.partitions.len(),
                "topic created"
            );
            CreateTopicResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => failed(error_code(&error), error.to_string()),
    }
}

/// Moves leadership to the preferred replica of every partition of `request.topic` (all topics
/// when empty) where `placement::prefer_leader` allows it, each with a compare-first write (a
/// partition that changed meanwhile is left alone). Any broker may do it: the write is as safe
/// as the controller's, since the new leader is in the ISR of the state it replaces.
pub(super) async fn elect_leaders(
    coordinator: &impl Coordinator,
    request: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let failed = |error: &CoordinatorError| ElectLeadersResponse {
        error: error_code(error),
        message: error.to_string(),
        moved: 0,
    };
    let (topics, brokers) = match (coordinator.topics().await, coordinator.brokers().await) {
        (Ok(topics), Ok(brokers)) => (topics, brokers),
        (Err(error), _) | (_, Err(error)) => return failed(&error),
    };
    if !request.topic.is_empty() && !topics.iter().any(|topic| topic.name == request.topic) {
        return failed(&CoordinatorError::UnknownTopic(request.topic));
    }
    let live: std::collections::BTreeSet<i32> = brokers.iter().map(|broker| broker.id).collect();
    let mut moved = 0;
    for topic in topics
        .iter()
        .filter(|topic| request.topic.is_empty() || topic.name == request.topic)
    {
        for partition in &topic.partitions {
            if placement::prefer_leader(partition, &live).is_none() {
                continue;
            }
            let change = PartitionChange::PreferredLeader;
            match coordinator
                .update_partition(&topic.name, partition, change)
                .await
            {
                Ok(Some(next)) => {
                    moved += 1;
                    tracing::info!(topic = %topic.name, partition = partition.partition,
                        from = partition.leader, to = next.leader, epoch = next.leader_epoch,
                        "moved leadership back to the preferred replica (on request)");
                }
                Ok(None) => {}
                Err(error) => {
                    return ElectLeadersResponse {
                        moved,
                        ..failed(&error)
                    };
                }
            }
        }
    }
    ElectLeadersResponse {
        error: ErrorCode::None,
        message: String::new(),
        moved,
    }
}

/// Changes a topic's overrides if the result parses as a whole; every broker's shards apply the
/// new settings to their open partitions when the change reaches them.
pub(super) async fn alter_topic_config(
    coordinator: &impl Coordinator,
    request: AlterTopicConfigRequest,
) -> AlterTopicConfigResponse {
    let change = ConfigChange {
        set: request
            .set
            .into_iter()
            .map(|entry| (entry.key, entry.value))
            .collect(),
        delete: request.delete,
    };
    let unknown: Vec<&String> = change
        .delete
        .iter()
        .filter(|key| !topic_config::KEYS.contains(&key.as_str()))
        .collect();
    if !unknown.is_empty() {
        return AlterTopicConfigResponse {
            error: ErrorCode::InvalidConfig,
            message: format!("unknown topic config {unknown:?}"),
        };
    }
    let validate = |config: &BTreeMap<String, String>| TopicConfig::parse(config).map(drop);
    match coordinator
        .alter_topic_config(&request.topic, &change, &validate)
        .await
    {
        Ok(topic) => {
            tracing::info!(topic = %topic.name, config = ?topic.config, "topic config altered");
            AlterTopicConfigResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => AlterTopicConfigResponse {
            error: error_code(&error),
            message: error.to_string(),
        },
    }
}

fn error_code(error: &CoordinatorError) -> ErrorCode {
    match error {
        CoordinatorError::TopicExists(_) => ErrorCode::TopicAlreadyExists,
        CoordinatorError::UnknownTopic(_) => ErrorCode::UnknownTopic,
        CoordinatorError::InvalidTopicName { .. } => ErrorCode::InvalidTopicName,
        CoordinatorError::Invalid(_) => ErrorCode::InvalidConfig,
        CoordinatorError::InvalidArgument(_) => ErrorCode::InvalidRequest,
        CoordinatorError::InvalidReplicaAssignment(_) => ErrorCode::InvalidReplicaAssignment,
        CoordinatorError::Unavailable(_) => ErrorCode::NotReady,
        CoordinatorError::BrokerIdTaken(_)
        | CoordinatorError::Storage { .. }
        | CoordinatorError::Corrupt { .. } => ErrorCode::Internal,
    }
}

/// Makes a change to the users or the ACLs in the coordinator.
pub(super) async fn change_security(
    coordinator: &impl Coordinator,
    change: SecurityChange,
) -> SecurityChanged {
    match change {
        SecurityChange::Credentials(changes) => {
            let mut answers = Vec::with_capacity(changes.len());
            for change in changes {
                let answer = match change.credential {
                    Some(credential) => coordinator
                        .upsert_scram_credential(&change.user, credential)
                        .await
                        .map(|()| true),
                    None => {
                        coordinator
                            .delete_scram_credential(&change.user, Some(change.mechanism))
                            .await
                    }
                };
                answers.push(answer.map_err(|error| error.to_string()));
            }
            SecurityChanged::Credentials(answers)
        }
        SecurityChange::CreateAcls(bindings) => SecurityChanged::CreateAcls(
            coordinator
                .create_acls(&bindings)
                .await
                .map_err(|error| error.to_string()),
        ),
        SecurityChange::DeleteAcls(filters) => SecurityChanged::DeleteAcls(
            coordinator
                .delete_acls(&filters)
                .await
                .map_err(|error| error.to_string()),
        ),
    }
}
