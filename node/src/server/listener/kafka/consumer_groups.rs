//! KIP-848's consumer group protocol: ConsumerGroupHeartbeat and ConsumerGroupDescribe,
//! translated onto Strata's own groups by the group thread (`server/groups/consumer.rs`).
//! Kafka names a member's topics by id here: the listener turns them into names and back
//! with the cluster view. A heartbeat needs Read on the group and Describe on each topic the
//! member subscribes to by name, a describe Describe on the group, as in Kafka.

use std::collections::BTreeMap;

use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member,
    TopicPartitions as DescribedTopicPartitions,
};
use strata_kafka::kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment, TopicPartitions,
};
use strata_kafka::kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, TopicName,
};
use strata_kafka::text;

use super::authorize;
use super::encoded;
use super::groups::ask;
use crate::group::{GroupState, TopicPartition};
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::messages::{
    ConsumerHeartbeat, ConsumerRefusal, KafkaGroupAnswer, KafkaGroupRequest,
};
use crate::server::shard::Shard;
use std::rc::Rc;
use strata_kafka::frame::{Header, KafkaRequest};

/// Kafka's ConsumerGroupDescribe member type of a member speaking KIP-848's protocol.
const CONSUMER_MEMBER: i8 = 1;

/// Authorized operations not asked for (Kafka's `-2147483648`).
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

async fn consumer_group_heartbeat(
    shard: &Shard,
    client: &Client,
    client_id: &str,
    request: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let refused = |code: i16, message: String| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
            .with_member_epoch(-1)
    };
    let group = request.group_id.0.to_string();
    if group.is_empty() {
        return refused(errors::INVALID_REQUEST, "the group id is empty".into());
    }
    if !authorize::group(shard, client, Operation::Read, &group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            format!("Read on group {group} is needed"),
        );
    }
    let topics: Option<Vec<String>> = request
        .subscribed_topic_names
        .as_ref()
        .map(|names| names.iter().map(|name| name.0.to_string()).collect());
    if let Some(refused_topic) = topics
        .iter()
        .flatten()
        .find(|topic| !authorize::topic(shard, client, Operation::Describe, topic))
    {
        return refused(
            errors::TOPIC_AUTHORIZATION_FAILED,
            format!("Describe on topic {refused_topic} is needed"),
        );
    }
    let owned = request
        .topic_partitions
        .as_ref()
        .map(|owned| named_partitions(shard, owned));
    let heartbeat = ConsumerHeartbeat {
        group,
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.as_ref().map(|id| id.to_string()),
        client_id: client_id.to_string(),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        topics,
        regex: request
            .subscribed_topic_regex
            .as_ref()
            .map(|regex| regex.to_string()),
        assignor: request
            .server_assignor
            .as_ref()
            .map(|name| name.to_string()),
        owned,
    };
    let answer = match ask(shard, KafkaGroupRequest::ConsumerHeartbeat(heartbeat)).await {
        Some(KafkaGroupAnswer::ConsumerHeartbeat(answer)) => answer,
        _ => {
            return refused(
                errors::COORDINATOR_NOT_AVAILABLE,
                "the group thread is stopping".into(),
            );
        }
    };
    match answer {
        Ok(assignment) => {
            let mut response = ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(text(&assignment.member_id)))
                .with_member_epoch(assignment.member_epoch)
                .with_heartbeat_interval_ms(assignment.heartbeat_interval_ms);
            if let Some(partitions) = assignment.partitions {
                let topic_partitions = by_topic(&partitions)
                    .into_iter()
                    .filter_map(|(topic, partitions)| {
                        Some(
                            TopicPartitions::default()
                                .with_topic_id(topic_id(shard, topic)?)
                                .with_partitions(partitions),
                        )
                    })
                    .collect();
                response = response.with_assignment(Some(
                    Assignment::default().with_topic_partitions(topic_partitions),
                ));
            }
            response
        }
        Err(ConsumerRefusal::FencedEpoch) => refused(
            errors::FENCED_MEMBER_EPOCH,
            "the member epoch is not the group's: join again".into(),
        ),
        Err(ConsumerRefusal::UnsupportedAssignor(why)) => {
            refused(errors::UNSUPPORTED_ASSIGNOR, why)
        }
        Err(ConsumerRefusal::InvalidRegex(why)) => refused(errors::INVALID_REGULAR_EXPRESSION, why),
        Err(ConsumerRefusal::Group(code)) => refused(kafka_error(code), format!("{code}")),
    }
}

async fn consumer_group_describe(
    shard: &Shard,
    client: &Client,
    request: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut groups = Vec::with_capacity(request.group_ids.len());
    for group_id in request.group_ids {
        let group = group_id.0.to_string();
        let described = DescribedGroup::default()
            .with_group_id(group_id)
            .with_authorized_operations(OPERATIONS_NOT_ASKED);
        if !authorize::group(shard, client, Operation::Describe, &group) {
            groups.push(described.with_error_code(errors::GROUP_AUTHORIZATION_FAILED));
            continue;
        }
        let answer = ask(
            shard,
            KafkaGroupRequest::ConsumerDescribe {
                group: group.clone(),
            },
        )
        .await;
        let found = match answer {
            Some(KafkaGroupAnswer::ConsumerDescribed(Ok(found))) => found,
            Some(KafkaGroupAnswer::ConsumerDescribed(Err(code))) => {
                groups.push(described.with_error_code(kafka_error(code)));
                continue;
            }
            _ => {
                groups.push(described.with_error_code(errors::COORDINATOR_NOT_AVAILABLE));
                continue;
            }
        };
        // A classic group, or none: the Java AdminClient then asks DescribeGroups.
        let Some(found) = found else {
            groups.push(
                described
                    .with_error_code(errors::GROUP_ID_NOT_FOUND)
                    .with_error_message(Some(text(&format!(
                        "group {group} is not a consumer (KIP-848) group"
                    )))),
            );
            continue;
        };
        let description = found.description;
        let assignment = |partitions: &[TopicPartition]| {
            DescribedAssignment::default().with_topic_partitions(
                by_topic(partitions)
                    .into_iter()
                    .filter_map(|(topic, partitions)| {
                        Some(
                            DescribedTopicPartitions::default()
                                .with_topic_id(topic_id(shard, topic)?)
                                .with_topic_name(TopicName(text(topic)))
                                .with_partitions(partitions),
                        )
                    })
                    .collect(),
            )
        };
        let members = description
            .members
            .iter()
            .map(|member| {
                let regex = found.regexes.get(&member.member_id);
                Member::default()
                    .with_member_id(text(&member.member_id))
                    .with_instance_id(member.instance_id.as_deref().map(text))
                    .with_member_epoch(member.generation)
                    .with_client_id(text(&member.client_id))
                    .with_client_host(text(""))
                    .with_subscribed_topic_names(
                        member
                            .topics
                            .iter()
                            .map(|topic| TopicName(text(topic)))
                            .collect(),
                    )
                    .with_subscribed_topic_regex(regex.map(|regex| text(regex)))
                    .with_assignment(assignment(&member.assigned))
                    .with_target_assignment(assignment(&member.target))
                    .with_member_type(CONSUMER_MEMBER)
            })
            .collect();
        let state = match description.state {
            GroupState::Empty => "Empty",
            GroupState::Stable => "Stable",
            GroupState::Reconciling => "Reconciling",
        };
        groups.push(
            described
                .with_group_state(text(state))
                .with_group_epoch(description.generation)
                .with_assignment_epoch(description.generation)
                .with_assignor_name(text(description.assignor.server_assignor_name()))
                .with_members(members),
        );
    }
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}

/// Partitions by topic, in topic order.
fn by_topic(partitions: &[TopicPartition]) -> BTreeMap<&str, Vec<i32>> {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for partition in partitions {
        topics
            .entry(partition.topic.as_str())
            .or_default()
            .push(partition.partition as i32);
    }
    topics
}

/// The id Kafka's clients know `topic` by; `None` for a topic the view does not have.
fn topic_id(shard: &Shard, topic: &str) -> Option<uuid::Uuid> {
    let view = shard.view.borrow();
    let known = view.topics.iter().find(|known| known.name == topic)?;
    Some(super::kafka_topic_id(known))
}

/// The partitions a member reports owning, named; topics the view does not know are left out
/// (deleted meanwhile: nobody may own them).
fn named_partitions(
    shard: &Shard,
    owned: &[strata_kafka::kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions],
) -> Vec<TopicPartition> {
    let view = shard.view.borrow();
    let mut named = Vec::new();
    for topic in owned {
        let Some(known) = view
            .topics
            .iter()
            .find(|known| super::kafka_topic_id(known) == topic.topic_id)
        else {
            continue;
        };
        for &partition in &topic.partitions {
            if let Ok(partition) = u32::try_from(partition) {
                named.push(TopicPartition::new(&known.name, partition));
            }
        }
    }
    named
}

/// Answers a KIP-848 consumer group API request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::ConsumerGroupHeartbeat(request) => {
            let client_id = header.client_id.clone();
            let answer = consumer_group_heartbeat(shard, client, &client_id, request).await;
            encoded(&header, answer)
        }
        KafkaRequest::ConsumerGroupDescribe(request) => encoded(
            &header,
            consumer_group_describe(shard, client, request).await,
        ),
        _ => unreachable!("only the consumer group APIs come here"),
    }
}
