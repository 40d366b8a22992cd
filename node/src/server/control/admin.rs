//! The admin operations the control thread carries out for clients: topics created, deleted,
//! grown, reconfigured and reassigned, leaderships moved back, and a leader's own partition
//! change. Each returns the answer; the caller announces the new state before sending it.

use crate::clock::Clock;
use std::collections::BTreeMap;
use std::time::Duration;

use strata_coordinator::placement::ElectionRefused;
use strata_coordinator::{
    ConfigChange, Coordinator, CoordinatorError, PartitionChange, PartitionState, TopicSpec,
    placement,
};
use strata_wire::protocol::{
    AlterTopicConfigRequest, AlterTopicConfigResponse, Appended, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest,
    DeleteTopicResponse, ElectLeadersRequest, ElectLeadersResponse, ElectionResult, ErrorCode,
    ReassignPartitionRequest, ReassignPartitionResponse,
};

use crate::server::broker_config::check_topic_settings;
use crate::server::messages::{SettingsChange, SettingsChanged};
use crate::server::topic_config;

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
        // The runtime's clock, the one every timer of the broker runs on.
        Clock::SYSTEM.sleep(Duration::from_millis(250)).await;
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

/// A topic may enable remote storage only on a broker that has a remote tier.
fn check_remote_tier(remote_tier: bool, config: &BTreeMap<String, String>) -> Result<(), String> {
    if !remote_tier
        && config
            .get("remote.storage.enable")
            .is_some_and(|v| v == "true")
    {
        return Err(
            "remote.storage.enable=true needs brokers started with --remote-storage".to_string(),
        );
    }
    Ok(())
}

/// `remote_tier`: this broker has `--remote-storage` (a tiered topic needs it, as Kafka's
/// `remote.log.storage.system.enable`).
pub(super) async fn create_topic(
    coordinator: &impl Coordinator,
    request: CreateTopicRequest,
    remote_tier: bool,
) -> CreateTopicResponse {
    let failed = |error: ErrorCode, message: String| CreateTopicResponse { error, message };
    let overrides: BTreeMap<String, String> = request
        .configs
        .into_iter()
        .map(|entry| (entry.key, entry.value))
        .collect();
    let live_defaults = match coordinator.broker_configs().await {
        Ok(records) => records,
        Err(error) => return failed(error_code(&error), error.to_string()),
    };
    if let Err(message) = check_topic_settings(&live_defaults, &overrides)
        .and_then(|()| check_remote_tier(remote_tier, &overrides))
    {
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

/// Kafka's ElectLeaders: for each partition of `request.topic` (every topic when empty; the
/// named partitions when some are), `placement::elect` decides, and the change is written
/// compare-first (a partition that changed meanwhile is left alone). Any broker may do it: a
/// preferred election is as safe as the controller's, since the new leader is in the ISR of
/// the state it replaces; an unclean one is the operator's decision, as in Kafka.
pub(super) async fn elect_leaders(
    coordinator: &impl Coordinator,
    request: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let failed = |error: &CoordinatorError| ElectLeadersResponse {
        error: error_code(error),
        message: error.to_string(),
        moved: 0,
        results: Default::default(),
    };
    let (topics, brokers) = match (coordinator.topics().await, coordinator.brokers().await) {
        (Ok(topics), Ok(brokers)) => (topics, brokers),
        (Err(error), _) | (_, Err(error)) => return failed(&error),
    };
    if !request.topic.is_empty() && !topics.iter().any(|topic| topic.name == request.topic) {
        return failed(&CoordinatorError::UnknownTopic(request.topic));
    }
    let named = &request.partitions.0;
    let unclean = request.unclean.0;
    let live: std::collections::BTreeSet<i32> = brokers.iter().map(|broker| broker.id).collect();
    let mut moved = 0;
    let mut results = Vec::new();
    let result = |topic: &str, partition: u32, error: ErrorCode, message: String| ElectionResult {
        topic: topic.to_string(),
        partition,
        error,
        message,
    };
    for topic in topics
        .iter()
        .filter(|topic| request.topic.is_empty() || topic.name == request.topic)
    {
        for &missing in named
            .iter()
            .filter(|p| **p as usize >= topic.partitions.len())
        {
            let why = format!("{} has no partition {missing}", topic.name);
            results.push(result(
                &topic.name,
                missing,
                ErrorCode::UnknownPartition,
                why,
            ));
        }
        for partition in &topic.partitions {
            let index = partition.partition;
            if !named.is_empty() && !named.contains(&index) {
                continue;
            }
            let change = match placement::elect(partition, &live, unclean) {
                Ok(change) => change,
                Err(refused) => {
                    // Over whole topics only the partitions that moved or should have are
                    // reported, not every one already led by the replica wanted.
                    if !named.is_empty() || refused != ElectionRefused::NotNeeded {
                        let (error, why) = election_refused(refused);
                        results.push(result(&topic.name, index, error, why.into()));
                    }
                    continue;
                }
            };
            match coordinator
                .update_partition(&topic.name, partition, change)
                .await
            {
                Ok(Some(next)) => {
                    moved += 1;
                    results.push(result(&topic.name, index, ErrorCode::None, String::new()));
                    if unclean && !partition.isr.contains(&next.leader) {
                        tracing::warn!(topic = %topic.name, partition = index, leader = next.leader,
                            epoch = next.leader_epoch,
                            "UNCLEAN leader election on request: records the old leader had may be lost");
                    } else {
                        tracing::info!(topic = %topic.name, partition = index,
                            from = partition.leader, to = next.leader, epoch = next.leader_epoch,
                            "leadership moved on request");
                    }
                }
                Ok(None) => {
                    let why = "the partition changed meanwhile; try again".to_string();
                    results.push(result(&topic.name, index, ErrorCode::NotReady, why));
                }
                Err(error) => {
                    results.push(result(
                        &topic.name,
                        index,
                        error_code(&error),
                        error.to_string(),
                    ));
                }
            }
        }
    }
    ElectLeadersResponse {
        error: ErrorCode::None,
        message: String::new(),
        moved,
        results: Appended(results),
    }
}

fn election_refused(refused: ElectionRefused) -> (ErrorCode, &'static str) {
    match refused {
        ElectionRefused::NotNeeded => (
            ErrorCode::ElectionNotNeeded,
            "the replica the election wants already leads",
        ),
        ElectionRefused::PreferredNotAvailable => (
            ErrorCode::PreferredLeaderNotAvailable,
            "the preferred replica is down, out of sync, or the partition is being reassigned",
        ),
        ElectionRefused::NoEligibleLeader => (
            ErrorCode::EligibleLeadersNotAvailable,
            "no replica of the partition is live",
        ),
    }
}

/// Changes a topic's overrides if the result parses as a whole; every broker's shards apply the
/// new settings to their open partitions when the change reaches them.
pub(super) async fn alter_topic_config(
    coordinator: &impl Coordinator,
    request: AlterTopicConfigRequest,
    remote_tier: bool,
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
    let live_defaults = match coordinator.broker_configs().await {
        Ok(records) => records,
        Err(error) => {
            return AlterTopicConfigResponse {
                error: error_code(&error),
                message: error.to_string(),
            };
        }
    };
    // Once tiered, a topic stays tiered (as on Kafka before 3.9): turning it off would strand
    // its remote history, unreadable and never deleted.
    let tiered = matches!(
        coordinator.topics().await.ok().and_then(|topics| topics
            .into_iter()
            .find(|topic| topic.name == request.topic)),
        Some(topic) if topic.config.get("remote.storage.enable").is_some_and(|v| v == "true")
    );
    let validate = |config: &BTreeMap<String, String>| {
        check_topic_settings(&live_defaults, config)
            .and_then(|()| check_remote_tier(remote_tier, config))?;
        if tiered
            && config
                .get("remote.storage.enable")
                .is_none_or(|v| v != "true")
        {
            return Err(
                "remote.storage.enable cannot be turned off once on: the remote tier holds the topic's history"
                    .to_string(),
            );
        }
        Ok(())
    };
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
        CoordinatorError::NoReassignmentInProgress(_) => ErrorCode::NoReassignmentInProgress,
        CoordinatorError::BrokerIdTaken(_)
        | CoordinatorError::Storage { .. }
        | CoordinatorError::Corrupt { .. } => ErrorCode::Internal,
    }
}

/// Makes a change to the cluster's settings (users, ACLs, quotas, broker settings, group
/// configs) in the coordinator.
pub(super) async fn change_settings(
    coordinator: &impl Coordinator,
    change: SettingsChange,
) -> SettingsChanged {
    match change {
        SettingsChange::Credentials(changes) => {
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
            SettingsChanged::Credentials(answers)
        }
        SettingsChange::CreateAcls(bindings) => SettingsChanged::CreateAcls(
            coordinator
                .create_acls(&bindings)
                .await
                .map_err(|error| error.to_string()),
        ),
        SettingsChange::DeleteAcls(filters) => SettingsChanged::DeleteAcls(
            coordinator
                .delete_acls(&filters)
                .await
                .map_err(|error| error.to_string()),
        ),
        SettingsChange::AlterQuotas(alterations) => SettingsChanged::AlterQuotas(
            coordinator
                .alter_client_quotas(&alterations)
                .await
                .map_err(|error| error.to_string()),
        ),
        SettingsChange::AlterBrokerConfigs(alteration) => SettingsChanged::AlterBrokerConfigs(
            coordinator
                .alter_broker_configs(&alteration)
                .await
                .map_err(|error| error.to_string()),
        ),
        SettingsChange::AlterGroupConfigs(alteration) => SettingsChanged::AlterGroupConfigs(
            coordinator
                .alter_group_configs(&alteration)
                .await
                .map_err(|error| error.to_string()),
        ),
    }
}
