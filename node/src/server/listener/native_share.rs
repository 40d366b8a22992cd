//! Share groups (KIP-932) on the native protocol: the heartbeat goes to the group thread (as
//! Kafka's ShareGroupHeartbeat does, with the connection's host), a fetch, an acknowledgement
//! and a partition's description run on the partitions' owning shards through the part both
//! listeners share (`server/share_fetch.rs`). DescribeShareGroup is a group request
//! (`groups::is_group_request`).
//!
//! No share sessions: each fetch names its partitions (see `strata_wire::protocol`'s share
//! messages for why). ACLs are checked before (`native_security::refusal`): Read on the
//! group and on every topic fetched or acknowledged, Describe on the topics a heartbeat
//! subscribes to, as Kafka checks them.

use std::collections::BTreeMap;
use std::rc::Rc;

use strata_wire::protocol::{
    AckType as WireAckType, AcknowledgementBatch, AcquiredRecords, DescribeSharePartitionsRequest,
    DescribeSharePartitionsResponse, ErrorCode, PartitionError, Records, Request, Response,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareAcknowledgeTopicResponse,
    ShareFetchPartitionResponse, ShareFetchRequest, ShareFetchResponse, ShareFetchTopicResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, SharePartitionDescription,
    TopicPartitions,
};
use tokio::sync::oneshot;

use super::Client;
use crate::server::messages::{GroupMessage, ShareGroupRequest, ShareRefusal};
use crate::server::shard::Shard;
use crate::server::shard::share::{ShareFailure, ShareKey};
use crate::server::share_fetch::{self, Fetcher, Limits, group_config};
use crate::share::partition::{AckBatch, AckType};

/// Whether the share listener answers `request` (the others go to [`Shard::handle`]).
pub(super) fn is_share_request(request: &Request) -> bool {
    matches!(
        request,
        Request::ShareGroupHeartbeat(_)
            | Request::ShareFetch(_)
            | Request::ShareAcknowledge(_)
            | Request::DescribeSharePartitions(_)
    )
}

/// Answers a share request ([`is_share_request`]).
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    request: Request,
) -> Option<Result<Response, ErrorCode>> {
    Some(match request {
        Request::ShareGroupHeartbeat(request) => Ok(Response::ShareGroupHeartbeat(
            heartbeat(shard, client, request).await,
        )),
        Request::ShareFetch(request) => fetch(shard, client, request)
            .await
            .map(Response::ShareFetch),
        Request::ShareAcknowledge(request) => acknowledge(shard, request)
            .await
            .map(Response::ShareAcknowledge),
        Request::DescribeSharePartitions(request) => Ok(Response::DescribeSharePartitions(
            describe_partitions(shard, request).await,
        )),
        other => return shard.handle(other).await,
    })
}

fn failure_code(failure: &ShareFailure) -> ErrorCode {
    match failure {
        ShareFailure::Code(code) => *code,
        ShareFailure::InvalidRecordState(_) => ErrorCode::InvalidRecordState,
        ShareFailure::InvalidRequest(_) => ErrorCode::InvalidRequest,
    }
}

async fn heartbeat(
    shard: &Shard,
    client: &Client,
    request: ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse {
    let refused = |error| ShareGroupHeartbeatResponse {
        error,
        member_epoch: request.member_epoch,
        heartbeat_interval_ms: 0,
        assignment: None,
    };
    if request.group.is_empty() {
        return refused(ErrorCode::InvalidGroupId);
    }
    if request.member_id.is_empty() {
        return refused(ErrorCode::InvalidRequest);
    }
    let (reply, answer) = oneshot::channel();
    let asked = ShareGroupRequest::Heartbeat {
        group: request.group.clone(),
        member: request.member_id.clone(),
        member_epoch: request.member_epoch,
        topics: request.topics.clone(),
        rack: None,
        client_id: request.client_id.clone(),
        client_host: client.peer.ip().to_string(),
        reply,
    };
    if shard
        .context
        .groups
        .send(GroupMessage::Share(asked))
        .is_err()
    {
        return refused(ErrorCode::CoordinatorNotAvailable);
    }
    match answer.await {
        Err(_) => refused(ErrorCode::CoordinatorNotAvailable),
        Ok(Ok(beat)) => ShareGroupHeartbeatResponse {
            error: ErrorCode::None,
            member_epoch: beat.answer.member_epoch,
            heartbeat_interval_ms: u32::try_from(beat.heartbeat_interval_ms).unwrap_or(0),
            assignment: beat.answer.assignment.map(|topics| {
                topics
                    .into_iter()
                    .map(|(topic, partitions)| TopicPartitions { topic, partitions })
                    .collect()
            }),
        },
        Ok(Err(refusal)) => refused(match refusal {
            ShareRefusal::NotCoordinator => ErrorCode::NotCoordinator,
            ShareRefusal::UnknownMember => ErrorCode::UnknownMemberId,
            ShareRefusal::FencedMemberEpoch => ErrorCode::FencedMemberEpoch,
            ShareRefusal::InconsistentProtocol => ErrorCode::InconsistentGroupProtocol,
            ShareRefusal::Invalid(_) => ErrorCode::InvalidRequest,
        }),
    }
}

/// Acknowledgement batches as the share-partition takes them.
fn ack_batches(batches: Vec<AcknowledgementBatch>) -> Vec<AckBatch> {
    batches
        .into_iter()
        .map(|batch| AckBatch {
            first: batch.first_offset,
            last: batch.last_offset,
            types: batch
                .types
                .into_iter()
                .map(|kind| match kind {
                    WireAckType::Gap => AckType::Gap,
                    WireAckType::Accept => AckType::Accept,
                    WireAckType::Release => AckType::Release,
                    WireAckType::Reject => AckType::Reject,
                    WireAckType::Renew => AckType::Renew,
                })
                .collect(),
        })
        .collect()
}

/// Applies one partition's acknowledgements: the code to answer.
async fn acknowledge_partition(
    shard: &Rc<Shard>,
    group: &str,
    member: &str,
    topic: &str,
    partition: u32,
    batches: Vec<AcknowledgementBatch>,
) -> ErrorCode {
    if batches.is_empty() {
        return ErrorCode::None;
    }
    let batches = ack_batches(batches);
    match share_fetch::acknowledge(shard, group, member, topic, partition, batches).await {
        Ok(()) => ErrorCode::None,
        Err(failure) => failure_code(&failure),
    }
}

/// One partition of a fetch, as named: its acknowledgements' outcome, whether to acquire.
struct Named {
    partition: u32,
    acknowledge_error: ErrorCode,
}

async fn fetch(
    shard: &Rc<Shard>,
    client: &Client,
    request: ShareFetchRequest,
) -> Result<ShareFetchResponse, ErrorCode> {
    if request.group.is_empty() || request.member_id.is_empty() {
        return Err(ErrorCode::InvalidRequest);
    }
    let (group, member) = (request.group, request.member_id);
    let config = group_config(shard, &group);
    // Acknowledgements first: what they give back may be acquired again in this fetch.
    let mut named: Vec<(String, Vec<Named>)> = Vec::with_capacity(request.topics.len());
    let mut to_acquire = Vec::new();
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for asked in topic.partitions {
            let acknowledge_error = acknowledge_partition(
                shard,
                &group,
                &member,
                &topic.name,
                asked.partition,
                asked.acknowledgements,
            )
            .await;
            if asked.acquire {
                to_acquire.push((topic.name.clone(), asked.partition));
            }
            partitions.push(Named {
                partition: asked.partition,
                acknowledge_error,
            });
        }
        named.push((topic.name, partitions));
    }
    let limits = Limits::new(
        shard,
        i64::from(request.max_records),
        i64::from(request.max_bytes),
        i64::from(request.max_wait_ms),
    )
    .with_delivery(client.delivery());
    let fetcher = Fetcher {
        group: &group,
        id: &member,
        config: &config,
    };
    let mut acquired = share_fetch::acquire(shard, &fetcher, &to_acquire, limits, false).await;
    let topics = named
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|named| {
                    let outcome = acquired.remove(&(name.clone(), named.partition));
                    partition_answer(named, outcome)
                })
                .collect();
            ShareFetchTopicResponse { name, partitions }
        })
        .collect();
    Ok(ShareFetchResponse {
        acquisition_lock_timeout_ms: u32::try_from(config.partition.lock_duration.as_millis())
            .unwrap_or(u32::MAX),
        topics,
    })
}

fn partition_answer(
    named: Named,
    outcome: Option<share_fetch::Acquisition>,
) -> ShareFetchPartitionResponse {
    let mut answer = ShareFetchPartitionResponse {
        partition: named.partition,
        error: ErrorCode::None,
        acknowledge_error: named.acknowledge_error,
        acquired: Vec::new(),
        records: Records::empty(),
    };
    match outcome {
        None => {}
        Some(Ok(acquired)) => {
            answer.acquired = acquired
                .acquired
                .iter()
                .map(|run| AcquiredRecords {
                    first_offset: run.first,
                    last_offset: run.last,
                    delivery_count: run.deliveries,
                })
                .collect();
            answer.records = acquired.records;
        }
        Some(Err(failure)) => answer.error = failure_code(&failure),
    }
    answer
}

async fn acknowledge(
    shard: &Rc<Shard>,
    request: ShareAcknowledgeRequest,
) -> Result<ShareAcknowledgeResponse, ErrorCode> {
    if request.group.is_empty() || request.member_id.is_empty() {
        return Err(ErrorCode::InvalidRequest);
    }
    let (group, member) = (request.group, request.member_id);
    let mut topics = Vec::with_capacity(request.topics.len());
    let mut named = Vec::new();
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for asked in topic.partitions {
            let error = acknowledge_partition(
                shard,
                &group,
                &member,
                &topic.name,
                asked.partition,
                asked.acknowledgements,
            )
            .await;
            named.push((topic.name.clone(), asked.partition));
            partitions.push(PartitionError {
                partition: asked.partition,
                error,
            });
        }
        topics.push(ShareAcknowledgeTopicResponse {
            name: topic.name,
            partitions,
        });
    }
    if request.release_remaining {
        share_fetch::release(shard, &group, &member, &named).await;
    }
    Ok(ShareAcknowledgeResponse { topics })
}

async fn describe_partitions(
    shard: &Rc<Shard>,
    request: DescribeSharePartitionsRequest,
) -> DescribeSharePartitionsResponse {
    let config = group_config(shard, &request.group);
    let mut described: BTreeMap<(String, u32), SharePartitionDescription> = BTreeMap::new();
    for asked in request.topics {
        for partition in asked.partitions {
            let key: ShareKey = (request.group.clone(), asked.topic.clone(), partition);
            let config = config.clone();
            let answer =
                share_fetch::on_owner(shard, &asked.topic, partition, move |owner| async move {
                    owner.share_describe(key, config).await
                })
                .await
                .unwrap_or_else(|failure| SharePartitionDescription {
                    topic: asked.topic.clone(),
                    partition,
                    error: failure_code(&failure),
                    start_offset: 0,
                    end_offset: 0,
                    in_flight: 0,
                    acquired: 0,
                    high_watermark: 0,
                    lag: 0,
                    oldest_timestamp_ms: None,
                });
            described.insert((asked.topic.clone(), partition), answer);
        }
    }
    DescribeSharePartitionsResponse {
        partitions: described.into_values().collect(),
    }
}
