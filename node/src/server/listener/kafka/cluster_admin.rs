//! Kafka's cluster administration APIs on the Kafka listener: the cluster and its partitions
//! described (DescribeCluster, DescribeTopicPartitions), reassignments listed, started and
//! cancelled (List/AlterPartitionReassignments, onto `topic reassign`), leaders elected
//! (ElectLeaders, preferred or unclean). What is read comes from the shard's view of the
//! cluster; what changes runs as the native request `strata` sends.
//!
//! | API | needs |
//! |---|---|
//! | DescribeCluster | nothing (as Kafka's) |
//! | DescribeTopicPartitions | Describe on the topic |
//! | ListPartitionReassignments | Describe on the cluster |
//! | AlterPartitionReassignments, ElectLeaders | Alter on the cluster |

use std::rc::Rc;

use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use strata_kafka::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use strata_kafka::kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use strata_kafka::kafka_protocol::messages::elect_leaders_response::{
    PartitionResult, ReplicaElectionResult,
};
use strata_kafka::kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use strata_kafka::kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    DescribeClusterRequest, DescribeClusterResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, ElectLeadersRequest, ElectLeadersResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use strata_kafka::text;
use strata_wire::protocol::{self as native, Appended, ErrorCode, Request, Response};

use super::encoded;
use super::{authorize, kafka_brokers, native};
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::shard::Shard;
use strata_kafka::frame::{Header, KafkaRequest};

/// Kafka's "authorized operations not asked for".
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

/// The brokers with a Kafka listener of the client's kind, the controller (-1 when it has
/// none) and the cluster id.
fn describe_cluster(
    shard: &Shard,
    client: &Client,
    request: DescribeClusterRequest,
) -> DescribeClusterResponse {
    // Endpoint type 2 asks for controllers, which Strata does not run apart from brokers.
    if request.endpoint_type != 1 {
        return DescribeClusterResponse::default()
            .with_error_code(errors::UNSUPPORTED_ENDPOINT_TYPE)
            .with_endpoint_type(request.endpoint_type);
    }
    let brokers = kafka_brokers(shard, client);
    let controller = shard.view.borrow().controller;
    let controller = if brokers.iter().any(|broker| broker.node_id == controller) {
        controller
    } else {
        -1
    };
    DescribeClusterResponse::default()
        .with_endpoint_type(request.endpoint_type)
        .with_cluster_id(text(&shard.context.config.cluster))
        .with_controller_id(BrokerId(controller))
        .with_cluster_authorized_operations(OPERATIONS_NOT_ASKED)
        .with_brokers(
            brokers
                .into_iter()
                .map(|broker| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(broker.node_id))
                        .with_host(text(&broker.host))
                        .with_port(i32::from(broker.port))
                        .with_rack(broker.rack.map(Into::into))
                })
                .collect(),
        )
}

/// Topics' partitions (all topics the client may Describe when none are named), in name and
/// partition order, at most `response_partition_limit` of them from the request's cursor on;
/// a cursor to the next one when some are left.
fn describe_topic_partitions(
    shard: &Shard,
    client: &Client,
    request: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let view = shard.view.borrow();
    let live: std::collections::BTreeSet<i32> =
        view.brokers.iter().map(|broker| broker.id).collect();
    let mut names: Vec<String> = if request.topics.is_empty() {
        view.topics
            .iter()
            .map(|topic| topic.name.clone())
            .filter(|name| authorize::topic(shard, client, Operation::Describe, name))
            .collect()
    } else {
        request
            .topics
            .iter()
            .map(|topic| topic.name.0.to_string())
            .collect()
    };
    names.sort();
    names.dedup();
    let (first_topic, first_partition) = match &request.cursor {
        Some(cursor) => (cursor.topic_name.0.to_string(), cursor.partition_index),
        None => (String::new(), 0),
    };
    let mut budget = usize::try_from(request.response_partition_limit.max(1)).unwrap_or(1);
    let mut topics = Vec::new();
    let mut next_cursor = None;
    for name in names.into_iter().filter(|name| *name >= first_topic) {
        let topic_name = TopicName(text(&name));
        let refused = |error| {
            DescribeTopicPartitionsResponseTopic::default()
                .with_error_code(error)
                .with_name(Some(topic_name.clone()))
                .with_topic_authorized_operations(OPERATIONS_NOT_ASKED)
        };
        if !authorize::topic(shard, client, Operation::Describe, &name) {
            topics.push(refused(errors::TOPIC_AUTHORIZATION_FAILED));
            continue;
        }
        let Some(topic) = view.topics.iter().find(|topic| topic.name == name) else {
            topics.push(refused(errors::UNKNOWN_TOPIC_OR_PARTITION));
            continue;
        };
        let skip = if name == first_topic {
            usize::try_from(first_partition).unwrap_or(0)
        } else {
            0
        };
        let mut partitions = Vec::new();
        for partition in topic.partitions.iter().skip(skip) {
            if budget == 0 {
                next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(topic_name.clone())
                        .with_partition_index(partition.partition as i32),
                );
                break;
            }
            budget -= 1;
            let brokers = |ids: &[i32]| ids.iter().copied().map(BrokerId).collect();
            let offline: Vec<i32> = partition
                .replicas
                .iter()
                .copied()
                .filter(|id| !live.contains(id))
                .collect();
            partitions.push(
                DescribeTopicPartitionsResponsePartition::default()
                    .with_error_code(if partition.leader < 0 {
                        errors::LEADER_NOT_AVAILABLE
                    } else {
                        errors::NONE
                    })
                    .with_partition_index(partition.partition as i32)
                    .with_leader_id(BrokerId(partition.leader))
                    .with_leader_epoch(partition.leader_epoch as i32)
                    .with_replica_nodes(brokers(&partition.replicas))
                    .with_isr_nodes(brokers(&partition.isr))
                    // Strata has no eligible leader replicas (KIP-966) beyond the ISR; the
                    // Java client reads both lists and fails on a null one.
                    .with_eligible_leader_replicas(Some(Vec::new()))
                    .with_last_known_elr(Some(Vec::new()))
                    .with_offline_replicas(brokers(&offline)),
            );
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(topic_name))
                .with_topic_id(super::kafka_topic_id(topic))
                .with_partitions(partitions)
                .with_topic_authorized_operations(OPERATIONS_NOT_ASKED),
        );
        if next_cursor.is_some() {
            break;
        }
    }
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor)
}

/// The reassignments under way (of the named partitions, or all): each partition's replicas,
/// and which of them are being added and removed.
fn list_partition_reassignments(
    shard: &Shard,
    client: &Client,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    if !authorize::cluster(shard, client, Operation::Describe) {
        return ListPartitionReassignmentsResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED);
    }
    let view = shard.view.borrow();
    let asked = |topic: &str, partition: u32| match &request.topics {
        None => true,
        Some(topics) => topics.iter().any(|asked| {
            asked.name.0.as_str() == topic && asked.partition_indexes.contains(&(partition as i32))
        }),
    };
    let mut topics = Vec::new();
    for topic in view.topics.iter() {
        let partitions: Vec<OngoingPartitionReassignment> = topic
            .partitions
            .iter()
            .filter(|partition| asked(&topic.name, partition.partition))
            .filter_map(|partition| {
                let target = partition.target_replicas.as_ref()?;
                let from = partition
                    .reassigning_from
                    .as_ref()
                    .unwrap_or(&partition.replicas);
                let brokers = |ids: Vec<i32>| ids.into_iter().map(BrokerId).collect();
                let adding = target.iter().copied().filter(|id| !from.contains(id));
                let removing = from.iter().copied().filter(|id| !target.contains(id));
                Some(
                    OngoingPartitionReassignment::default()
                        .with_partition_index(partition.partition as i32)
                        .with_replicas(brokers(partition.replicas.clone()))
                        .with_adding_replicas(brokers(adding.collect()))
                        .with_removing_replicas(brokers(removing.collect())),
                )
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(text(&topic.name)))
                    .with_partitions(partitions),
            );
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}

/// Starts (or, with no replicas, cancels) each partition's reassignment, as `strata topic
/// reassign` does. Before version 1 and when the client does not allow it, a target of
/// another size than the partition's replica set is refused, as Kafka refuses it.
async fn alter_partition_reassignments(
    shard: &Rc<Shard>,
    client: &Client,
    request: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let allowed = authorize::cluster(shard, client, Operation::Alter);
    if !allowed {
        return AlterPartitionReassignmentsResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED);
    }
    let allow_replication_factor_change = request.allow_replication_factor_change;
    let mut responses = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let mut partitions = Vec::new();
        for partition in topic.partitions {
            let replicas: Vec<i32> = partition
                .replicas
                .unwrap_or_default()
                .into_iter()
                .map(|id| id.0)
                .collect();
            let (error, message) = reassign_one(
                shard,
                &name,
                partition.partition_index,
                replicas,
                allow_replication_factor_change,
            )
            .await;
            partitions.push(
                ReassignablePartitionResponse::default()
                    .with_partition_index(partition.partition_index)
                    .with_error_code(error)
                    .with_error_message((!message.is_empty()).then(|| text(&message))),
            );
        }
        responses.push(
            ReassignableTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(allow_replication_factor_change)
        .with_responses(responses)
}

async fn reassign_one(
    shard: &Rc<Shard>,
    topic: &str,
    partition: i32,
    replicas: Vec<i32>,
    allow_replication_factor_change: bool,
) -> (i16, String) {
    let Ok(partition) = u32::try_from(partition) else {
        return (
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "a negative partition".into(),
        );
    };
    let current = shard.view.borrow().topics.iter().find_map(|known| {
        (known.name == topic)
            .then(|| known.partitions.get(partition as usize).cloned())
            .flatten()
    });
    let Some(current) = current else {
        return (
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no partition {topic}-{partition}"),
        );
    };
    let from = current.reassigning_from.unwrap_or(current.replicas);
    if !replicas.is_empty() && !allow_replication_factor_change && replicas.len() != from.len() {
        return (
            errors::INVALID_REPLICATION_FACTOR,
            format!(
                "{} replicas for a partition of {}, and the client does not allow the replication factor to change",
                replicas.len(),
                from.len()
            ),
        );
    }
    let reassign = native::ReassignPartitionRequest {
        topic: topic.to_string(),
        partition,
        replicas,
    };
    match native(shard, Request::ReassignPartition(reassign)).await {
        Ok(Response::ReassignPartition(answer)) => (kafka_error(answer.error), answer.message),
        Ok(_) | Err(_) => (errors::UNKNOWN_SERVER_ERROR, "no answer".into()),
    }
}

/// Preferred (type 0) or unclean (type 1) elections of the named partitions, or of every
/// partition when none are named (then only those that moved or could not are reported).
async fn elect_leaders(
    shard: &Rc<Shard>,
    client: &Client,
    version: i16,
    request: ElectLeadersRequest,
) -> ElectLeadersResponse {
    if !authorize::cluster(shard, client, Operation::Alter) {
        return ElectLeadersResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED);
    }
    let unclean = match request.election_type {
        0 => false,
        1 if version >= 1 => true,
        _ => {
            return ElectLeadersResponse::default().with_error_code(errors::INVALID_REQUEST);
        }
    };
    // (topic, partitions): an empty topic elects over every topic.
    let elections: Vec<(String, Vec<u32>)> = match request.topic_partitions {
        None => vec![(String::new(), Vec::new())],
        Some(topics) => topics
            .into_iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .into_iter()
                    .filter_map(|p| u32::try_from(p).ok())
                    .collect();
                (topic.topic.0.to_string(), partitions)
            })
            .collect(),
    };
    let mut by_topic: std::collections::BTreeMap<String, Vec<PartitionResult>> = Default::default();
    for (topic, partitions) in elections {
        let request = native::ElectLeadersRequest {
            topic: topic.clone(),
            partitions: Appended(partitions.clone()),
            unclean: Appended(unclean),
        };
        let results = match native(shard, Request::ElectLeaders(request)).await {
            Ok(Response::ElectLeaders(answer)) if answer.error == ErrorCode::None => {
                answer.results.0
            }
            answer => {
                // The whole topic failed (unknown, say): each partition asked gets why.
                let (error, message) = match answer {
                    Ok(Response::ElectLeaders(answer)) => (answer.error, answer.message),
                    _ => (ErrorCode::Internal, "no answer".to_string()),
                };
                partitions
                    .iter()
                    .map(|&partition| native::ElectionResult {
                        topic: topic.clone(),
                        partition,
                        error,
                        message: message.clone(),
                    })
                    .collect()
            }
        };
        for result in results {
            by_topic.entry(result.topic).or_default().push(
                PartitionResult::default()
                    .with_partition_id(result.partition as i32)
                    .with_error_code(kafka_error(result.error))
                    .with_error_message(
                        (!result.message.is_empty()).then(|| text(&result.message)),
                    ),
            );
        }
    }
    ElectLeadersResponse::default().with_replica_election_results(
        by_topic
            .into_iter()
            .map(|(topic, partitions)| {
                ReplicaElectionResult::default()
                    .with_topic(TopicName(text(&topic)))
                    .with_partition_result(partitions)
            })
            .collect(),
    )
}

/// Answers a cluster administration request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::DescribeCluster(request) => {
            encoded(&header, describe_cluster(shard, client, request))
        }
        KafkaRequest::DescribeTopicPartitions(request) => {
            encoded(&header, describe_topic_partitions(shard, client, request))
        }
        KafkaRequest::ListPartitionReassignments(request) => encoded(
            &header,
            list_partition_reassignments(shard, client, request),
        ),
        KafkaRequest::AlterPartitionReassignments(request) => encoded(
            &header,
            alter_partition_reassignments(shard, client, request).await,
        ),
        KafkaRequest::ElectLeaders(request) => {
            let version = header.api_version;
            encoded(
                &header,
                elect_leaders(shard, client, version, request).await,
            )
        }
        _ => unreachable!("only the cluster administration APIs come here"),
    }
}
