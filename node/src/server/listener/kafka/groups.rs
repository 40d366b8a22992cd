//! Kafka's consumer-group APIs on the Kafka listener.
//!
//! JoinGroup, SyncGroup, Heartbeat and LeaveGroup go to the group thread as
//! [`KafkaGroupRequest`]s, where Kafka's classic protocol runs (`group/classic.rs`); the
//! coordinator is found, and offsets committed and fetched, through the native requests, so a
//! Kafka group's offsets are in the same store, fenced the same way, and `strata group
//! describe` shows them.

use std::rc::Rc;

use strata_kafka::errors::{self, kafka_error};
use strata_kafka::frame::Header;
use strata_kafka::kafka_protocol::messages::find_coordinator_response::Coordinator;
use strata_kafka::kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use strata_kafka::kafka_protocol::messages::leave_group_response::MemberResponse;
use strata_kafka::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use strata_kafka::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use strata_kafka::kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse, TopicName,
};
use strata_kafka::text;
use strata_wire::protocol::{self as native, ErrorCode, Request, Response};
use tokio::sync::oneshot;

use super::encoded;
use super::{authorize, native, share_admin};
use crate::group::classic::{ClassicError, JoinRequest};
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::messages::{GroupMessage, KafkaGroupAnswer, KafkaGroupError, KafkaGroupRequest};
use crate::server::shard::Shard;
use strata_auth::acl::Operation;
use strata_kafka::frame::KafkaRequest;

/// FindCoordinator's key types: a consumer or share group's, a transactional id's, a
/// share-partition's (KIP-932: the broker keeping its state).
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
const KEY_TYPE_SHARE: i8 = 2;

fn classic_kafka_error(error: ClassicError) -> i16 {
    match error {
        ClassicError::UnknownMember => errors::UNKNOWN_MEMBER_ID,
        ClassicError::IllegalGeneration => errors::ILLEGAL_GENERATION,
        ClassicError::RebalanceInProgress => errors::REBALANCE_IN_PROGRESS,
        ClassicError::InconsistentProtocol => errors::INCONSISTENT_GROUP_PROTOCOL,
        ClassicError::MemberIdRequired => errors::MEMBER_ID_REQUIRED,
        ClassicError::FencedInstanceId => errors::FENCED_INSTANCE_ID,
    }
}

fn group_error(error: KafkaGroupError) -> i16 {
    match error {
        KafkaGroupError::Classic(error) => classic_kafka_error(error),
        KafkaGroupError::Coordinator(code) => kafka_error(code),
    }
}

/// Hands a request to the group thread and waits for its answer (a join or sync waits for the
/// rebalance).
pub(super) async fn ask(shard: &Shard, request: KafkaGroupRequest) -> Option<KafkaGroupAnswer> {
    let (reply, answer) = oneshot::channel();
    shard
        .context
        .groups
        .send(GroupMessage::Kafka { request, reply })
        .ok()?;
    answer.await.ok()
}

/// Where broker `node_id` takes Kafka clients like `client`: (id, host, port).
fn kafka_endpoint(shard: &Shard, client: &Client, node_id: i32) -> Result<(i32, String, u16), i16> {
    let view = shard.view.borrow();
    view.brokers
        .iter()
        .find(|broker| broker.id == node_id)
        .and_then(|broker| {
            Some((
                broker.id,
                broker.host.clone(),
                super::kafka_port(broker, client)?,
            ))
        })
        .ok_or(errors::COORDINATOR_NOT_AVAILABLE)
}

/// Where a group's coordinator takes Kafka clients: its broker's Kafka listener.
async fn find_coordinator(
    shard: &Rc<Shard>,
    client: &Client,
    header: &Header,
    request: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys: Vec<String> = if header.api_version >= 4 {
        request
            .coordinator_keys
            .iter()
            .map(ToString::to_string)
            .collect()
    } else {
        vec![request.key.to_string()]
    };
    let mut coordinators = Vec::with_capacity(keys.len());
    for key in keys {
        let transaction = request.key_type == KEY_TYPE_TRANSACTION;
        let found = if request.key_type == KEY_TYPE_SHARE {
            share_admin::share_coordinator(shard, client, header.api_version, &key)
                .and_then(|leader| kafka_endpoint(shard, client, leader))
        } else if request.key_type != KEY_TYPE_GROUP && !transaction {
            Err(errors::INVALID_REQUEST)
        } else if transaction
            && !authorize::transactional_id(shard, client, Operation::Describe, &key)
        {
            Err(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        } else if !transaction && !authorize::group(shard, client, Operation::Describe, &key) {
            Err(errors::GROUP_AUTHORIZATION_FAILED)
        } else {
            let find = native::FindCoordinatorRequest {
                group: key.clone(),
                transaction: native::Appended(transaction),
            };
            match native(shard, Request::FindCoordinator(find)).await {
                Ok(Response::FindCoordinator(found)) if found.error == ErrorCode::None => {
                    kafka_endpoint(shard, client, found.node_id)
                }
                Ok(Response::FindCoordinator(found)) => Err(kafka_error(found.error)),
                Ok(_) => Err(errors::UNKNOWN_SERVER_ERROR),
                Err(code) => Err(kafka_error(code)),
            }
        };
        coordinators.push(match found {
            Ok((node_id, host, port)) => Coordinator::default()
                .with_key(text(&key))
                .with_node_id(BrokerId(node_id))
                .with_host(text(&host))
                .with_port(i32::from(port)),
            Err(error) => Coordinator::default()
                .with_key(text(&key))
                .with_error_code(error)
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        });
    }
    if header.api_version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let only = coordinators.pop().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(only.error_code)
        .with_error_message(only.error_message)
        .with_node_id(only.node_id)
        .with_host(only.host)
        .with_port(only.port)
}

async fn join(shard: &Rc<Shard>, header: &Header, request: JoinGroupRequest) -> JoinGroupResponse {
    let group = request.group_id.0.to_string();
    // Version 8 says why the member (re)joins (KIP-800): the operator's, in the log.
    if let Some(reason) = request.reason.as_ref().filter(|reason| !reason.is_empty()) {
        tracing::info!(%group, member = %request.member_id, %reason, "a member joins");
    }
    let session_timeout_ms = request.session_timeout_ms.max(0) as u32;
    let join = JoinRequest {
        member_id: request.member_id.to_string(),
        client_id: header.client_id.clone(),
        session_timeout_ms,
        // Version 0 has no rebalance timeout: Kafka takes the session timeout.
        rebalance_timeout_ms: if header.api_version == 0 {
            session_timeout_ms
        } else {
            request.rebalance_timeout_ms.max(0) as u32
        },
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|protocol| (protocol.name.to_string(), protocol.metadata))
            .collect(),
        require_known_member_id: header.api_version >= 4,
        instance_id: request.group_instance_id.as_ref().map(ToString::to_string),
    };
    let refused = |error: i16| {
        JoinGroupResponse::default()
            .with_error_code(error)
            .with_generation_id(-1)
            .with_member_id(request.member_id.clone())
    };
    match ask(
        shard,
        KafkaGroupRequest::Join {
            group,
            request: join,
        },
    )
    .await
    {
        Some(KafkaGroupAnswer::Join(Ok(answer))) => JoinGroupResponse::default()
            .with_error_code(answer.error.map_or(errors::NONE, classic_kafka_error))
            .with_generation_id(answer.generation)
            .with_protocol_type(Some(text(&answer.protocol_type)))
            .with_protocol_name(Some(text(&answer.protocol)))
            .with_leader(text(&answer.leader))
            .with_member_id(text(&answer.member_id))
            .with_members(
                answer
                    .members
                    .into_iter()
                    .map(|(member_id, metadata)| {
                        JoinGroupResponseMember::default()
                            .with_member_id(text(&member_id))
                            .with_metadata(metadata)
                    })
                    .collect(),
            ),
        Some(KafkaGroupAnswer::Join(Err(code))) => refused(kafka_error(code)),
        _ => refused(errors::COORDINATOR_NOT_AVAILABLE),
    }
}

async fn sync(shard: &Rc<Shard>, request: SyncGroupRequest) -> SyncGroupResponse {
    let sync = KafkaGroupRequest::Sync {
        group: request.group_id.0.to_string(),
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.as_ref().map(ToString::to_string),
        generation: request.generation_id,
        assignments: request
            .assignments
            .into_iter()
            .map(|assignment| (assignment.member_id.to_string(), assignment.assignment))
            .collect(),
    };
    match ask(shard, sync).await {
        Some(KafkaGroupAnswer::Sync(Ok(assignment))) => SyncGroupResponse::default()
            .with_protocol_type(request.protocol_type)
            .with_protocol_name(request.protocol_name)
            .with_assignment(assignment),
        Some(KafkaGroupAnswer::Sync(Err(error))) => {
            SyncGroupResponse::default().with_error_code(group_error(error))
        }
        _ => SyncGroupResponse::default().with_error_code(errors::COORDINATOR_NOT_AVAILABLE),
    }
}

async fn heartbeat(shard: &Rc<Shard>, request: HeartbeatRequest) -> HeartbeatResponse {
    let beat = KafkaGroupRequest::Heartbeat {
        group: request.group_id.0.to_string(),
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.as_ref().map(ToString::to_string),
        generation: request.generation_id,
    };
    let error = match ask(shard, beat).await {
        Some(KafkaGroupAnswer::Heartbeat(Ok(()))) => errors::NONE,
        Some(KafkaGroupAnswer::Heartbeat(Err(error))) => group_error(error),
        _ => errors::COORDINATOR_NOT_AVAILABLE,
    };
    HeartbeatResponse::default().with_error_code(error)
}

async fn leave(
    shard: &Rc<Shard>,
    header: &Header,
    request: LeaveGroupRequest,
) -> LeaveGroupResponse {
    // Version 3 leaves several members at once, static ones by instance id; before, the one
    // named.
    let members: Vec<(String, Option<String>)> = if header.api_version >= 3 {
        request
            .members
            .iter()
            .inspect(|member| {
                // Version 5 says why (KIP-800): the operator's, in the log.
                if let Some(reason) = member.reason.as_ref().filter(|reason| !reason.is_empty()) {
                    tracing::info!(group = %request.group_id.0, member = %member.member_id, %reason, "a member leaves");
                }
            })
            .map(|member| {
                (
                    member.member_id.to_string(),
                    member.group_instance_id.as_ref().map(ToString::to_string),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let member_ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
    let leave = KafkaGroupRequest::Leave {
        group: request.group_id.0.to_string(),
        members,
    };
    let left = match ask(shard, leave).await {
        Some(KafkaGroupAnswer::Leave(left)) => left
            .into_iter()
            .map(|(member, left)| (member, left.err().map_or(errors::NONE, group_error)))
            .collect(),
        _ => member_ids
            .into_iter()
            .map(|member| (member, errors::COORDINATOR_NOT_AVAILABLE))
            .collect::<Vec<_>>(),
    };
    if header.api_version >= 3 {
        return LeaveGroupResponse::default().with_members(
            left.into_iter()
                .map(|(member, error)| {
                    MemberResponse::default()
                        .with_member_id(text(&member))
                        .with_error_code(error)
                })
                .collect(),
        );
    }
    LeaveGroupResponse::default().with_error_code(left.first().map_or(errors::NONE, |(_, e)| *e))
}

/// Offsets go to the store through the native commit (fenced on the group's generation).
/// A partition of a topic this broker does not know, or past the topic's last, is answered
/// UNKNOWN_TOPIC_OR_PARTITION and not committed, as Kafka's brokers answer it (retriable: a
/// topic just created may not have reached this broker's view yet); the rest share the
/// commit's outcome.
async fn commit(
    shard: &Rc<Shard>,
    client: &Client,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group_allowed =
        authorize::group(shard, client, Operation::Read, request.group_id.0.as_str());
    let mut invalid = false;
    let mut errors_by_partition: Vec<Vec<Option<i16>>> = Vec::with_capacity(request.topics.len());
    let mut topics: Vec<native::OffsetCommitTopic> = Vec::with_capacity(request.topics.len());
    {
        let view = shard.view.borrow();
        for topic in &request.topics {
            let name = topic.name.0.as_str();
            let refusal = if !group_allowed {
                Some(errors::GROUP_AUTHORIZATION_FAILED)
            } else if !authorize::topic(shard, client, Operation::Read, name) {
                Some(errors::TOPIC_AUTHORIZATION_FAILED)
            } else {
                None
            };
            let partition_count = view
                .topics
                .iter()
                .find(|known| known.name == name)
                .map(|known| known.partitions.len());
            let mut committed = Vec::with_capacity(topic.partitions.len());
            let mut errors = Vec::with_capacity(topic.partitions.len());
            for partition in &topic.partitions {
                let (Ok(index), Ok(offset)) = (
                    u32::try_from(partition.partition_index),
                    u64::try_from(partition.committed_offset),
                ) else {
                    invalid = true;
                    errors.push(None);
                    continue;
                };
                if refusal.is_some() {
                    errors.push(refusal);
                    continue;
                }
                if partition_count.is_none_or(|count| index as usize >= count) {
                    errors.push(Some(errors::UNKNOWN_TOPIC_OR_PARTITION));
                    continue;
                }
                errors.push(None);
                committed.push(native::OffsetCommitPartition {
                    partition: index,
                    offset,
                    metadata: partition
                        .committed_metadata
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                });
            }
            errors_by_partition.push(errors);
            if !committed.is_empty() {
                topics.push(native::OffsetCommitTopic {
                    name: name.to_string(),
                    partitions: committed,
                });
            }
        }
    }
    let error = if invalid {
        errors::INVALID_REQUEST
    } else if topics.is_empty() && !request.topics.is_empty() {
        // Nothing left to commit: every partition was answered on sight.
        errors::NONE
    } else {
        let commit = native::OffsetCommitRequest {
            group: request.group_id.0.to_string(),
            member_id: request.member_id.to_string(),
            generation: request.generation_id_or_member_epoch,
            topics,
        };
        match native(shard, Request::OffsetCommit(commit)).await {
            Ok(Response::OffsetCommit(committed)) => kafka_error(committed.error),
            Ok(_) => errors::UNKNOWN_SERVER_ERROR,
            Err(code) => kafka_error(code),
        }
    };
    OffsetCommitResponse::default().with_topics(
        request
            .topics
            .into_iter()
            .zip(errors_by_partition)
            .map(|(topic, partition_errors)| {
                OffsetCommitResponseTopic::default()
                    .with_name(topic.name)
                    .with_partitions(
                        topic
                            .partitions
                            .iter()
                            .zip(partition_errors)
                            .map(|(partition, refused)| {
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(partition.partition_index)
                                    .with_error_code(if invalid {
                                        error
                                    } else {
                                        refused.unwrap_or(error)
                                    })
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

async fn fetch_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    if !authorize::group(
        shard,
        client,
        Operation::Describe,
        request.group_id.0.as_str(),
    ) {
        return OffsetFetchResponse::default().with_error_code(errors::GROUP_AUTHORIZATION_FAILED);
    }
    let fetch = native::OffsetFetchRequest {
        group: request.group_id.0.to_string(),
        topics: request.topics.as_ref().map(|topics| {
            topics
                .iter()
                .map(|topic| native::TopicPartitions {
                    topic: topic.name.0.to_string(),
                    partitions: topic
                        .partition_indexes
                        .iter()
                        .filter_map(|&partition| u32::try_from(partition).ok())
                        .collect(),
                })
                .collect()
        }),
        require_stable: native::Appended(request.require_stable),
    };
    let (error, offsets) = match native(shard, Request::OffsetFetch(fetch)).await {
        Ok(Response::OffsetFetch(fetched)) => (kafka_error(fetched.error), fetched.offsets),
        Ok(_) => (errors::UNKNOWN_SERVER_ERROR, Vec::new()),
        Err(code) => (kafka_error(code), Vec::new()),
    };
    if error == errors::UNSTABLE_OFFSET_COMMIT
        && let Some(asked) = &request.topics
    {
        // Kafka's clients retry this per partition, not as the whole answer's error.
        return OffsetFetchResponse::default().with_topics(
            asked
                .iter()
                .map(|topic| {
                    OffsetFetchResponseTopic::default()
                        .with_name(topic.name.clone())
                        .with_partitions(
                            topic
                                .partition_indexes
                                .iter()
                                .map(|&partition| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(partition)
                                        .with_committed_offset(-1)
                                        .with_committed_leader_epoch(-1)
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    }
    let mut topics: Vec<OffsetFetchResponseTopic> = Vec::new();
    for committed in offsets {
        // A topic the client may not Describe is not shown, its offsets included.
        if !authorize::topic(shard, client, Operation::Describe, &committed.topic) {
            continue;
        }
        let partition = OffsetFetchResponsePartition::default()
            .with_partition_index(committed.partition as i32)
            .with_committed_offset(committed.offset)
            .with_committed_leader_epoch(-1)
            .with_metadata(Some(text(&committed.metadata)));
        match topics
            .iter_mut()
            .find(|topic| *topic.name.0 == *committed.topic)
        {
            Some(topic) => topic.partitions.push(partition),
            None => topics.push(
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(text(&committed.topic)))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    OffsetFetchResponse::default()
        .with_error_code(error)
        .with_topics(topics)
}

/// Answers a classic group API request (and FindCoordinator, which finds any coordinator).
/// A member's requests need Read on its group.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    let may_read = |group: &str| authorize::group(shard, client, Operation::Read, group);
    let refused = errors::GROUP_AUTHORIZATION_FAILED;
    match request {
        KafkaRequest::FindCoordinator(request) => encoded(
            &header,
            find_coordinator(shard, client, &header, request).await,
        ),
        KafkaRequest::JoinGroup(request) => {
            if !may_read(&request.group_id) {
                let response = JoinGroupResponse::default().with_generation_id(-1);
                return encoded(&header, response.with_error_code(refused));
            }
            encoded(&header, join(shard, &header, request).await)
        }
        KafkaRequest::SyncGroup(request) => {
            if !may_read(&request.group_id) {
                return encoded(
                    &header,
                    SyncGroupResponse::default().with_error_code(refused),
                );
            }
            encoded(&header, sync(shard, request).await)
        }
        KafkaRequest::Heartbeat(request) => {
            if !may_read(&request.group_id) {
                return encoded(
                    &header,
                    HeartbeatResponse::default().with_error_code(refused),
                );
            }
            encoded(&header, heartbeat(shard, request).await)
        }
        KafkaRequest::LeaveGroup(request) => {
            if !may_read(&request.group_id) {
                return encoded(
                    &header,
                    LeaveGroupResponse::default().with_error_code(refused),
                );
            }
            encoded(&header, leave(shard, &header, request).await)
        }
        KafkaRequest::OffsetCommit(request) => {
            encoded(&header, commit(shard, client, request).await)
        }
        KafkaRequest::OffsetFetch(request) => {
            encoded(&header, fetch_offsets(shard, client, request).await)
        }
        _ => unreachable!("only the classic group APIs come here"),
    }
}
