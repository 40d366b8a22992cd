//! Share groups (KIP-932, queues for Kafka) on the Kafka listener.
//!
//! - ShareGroupHeartbeat and ShareGroupDescribe go to the group thread of the group's
//!   coordinator (`server/groups/share.rs`).
//! - ShareFetch and ShareAcknowledge run on the partitions' leaders: each partition's owning
//!   shard acquires records from its share-partition (`server/shard/share.rs`) and stores
//!   acknowledgements before they are answered. The share session (which partitions a
//!   member fetches, and its epoch) is kept by the shard the member's connection landed on.
//!
//! ACLs as Kafka checks them: Read on the group for a heartbeat, a fetch and an
//! acknowledgement, with Read on each topic fetched or acknowledged (Describe on each topic a
//! heartbeat subscribes to); Describe on the group to describe it.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use bytes::Bytes;

use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::frame::{self, Header, KafkaRequest};
use strata_kafka::kafka_protocol::messages::share_acknowledge_response::{
    LeaderIdAndEpoch as AckLeader, PartitionData as AckPartition, ShareAcknowledgeTopicResponse,
};
use strata_kafka::kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, NodeEndpoint, PartitionData, ShareFetchableTopicResponse,
};
use strata_kafka::kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member,
    TopicPartitions as DescribedTopicPartitions,
};
use strata_kafka::kafka_protocol::messages::share_group_heartbeat_response::{
    Assignment, TopicPartitions,
};
use strata_kafka::kafka_protocol::messages::{
    BrokerId, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest,
    ShareFetchResponse, ShareGroupDescribeRequest, ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName,
};
use strata_kafka::text;
use strata_wire::protocol::{Elsewhere, ErrorCode, Records};
use tokio::sync::oneshot;

use super::{authorize, encoded, kafka_topic_id};
use crate::server::listener::{Client, Outcome};
use crate::server::messages::{GroupMessage, ShareGroupRequest, ShareRefusal};
use crate::server::shard::Shard;
use crate::server::shard::share::{ShareAcquired, ShareFailure, ShareSession};
use crate::server::share_fetch::{self, Fetcher, Limits, group_config};
use crate::share::config::ShareGroupConfig;
use crate::share::partition::{AckBatch, AckType, AcquireMode};

pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::ShareGroupHeartbeat(request) => encoded(
            &header,
            heartbeat(shard, client, &header.client_id, request).await,
        ),
        KafkaRequest::ShareGroupDescribe(request) => {
            encoded(&header, describe(shard, client, request).await)
        }
        KafkaRequest::ShareFetch(request) => {
            let version = header.api_version;
            let (mut response, elsewhere) = fetch(shard, client, request, version).await;
            response.throttle_time_ms = header.throttle_ms;
            match frame::encode_share_fetch_parts(&header, &response, elsewhere) {
                Ok(parts) => Outcome::Answer(parts),
                Err(error) => Outcome::Close(error),
            }
        }
        KafkaRequest::ShareAcknowledge(request) => {
            let version = header.api_version;
            encoded(&header, acknowledge(shard, client, request, version).await)
        }
        _ => unreachable!("dispatched here only for share group requests"),
    }
}

async fn ask_groups(shard: &Shard, request: ShareGroupRequest) -> bool {
    shard
        .context
        .groups
        .send(GroupMessage::Share(request))
        .is_ok()
}

async fn heartbeat(
    shard: &Shard,
    client: &Client,
    client_id: &str,
    request: ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse {
    let refused = |code: i16, message: String| {
        ShareGroupHeartbeatResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
    };
    let group = request.group_id.0.to_string();
    if group.is_empty() || request.member_id.is_empty() {
        return refused(
            errors::INVALID_REQUEST,
            "the group and member ids are needed".into(),
        );
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
    if let Some(topic) = topics
        .iter()
        .flatten()
        .find(|topic| !authorize::topic(shard, client, Operation::Describe, topic))
    {
        return refused(
            errors::TOPIC_AUTHORIZATION_FAILED,
            format!("Describe on topic {topic} is needed"),
        );
    }
    let (reply, answer) = oneshot::channel();
    let asked = ShareGroupRequest::Heartbeat {
        group: group.clone(),
        member: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        topics,
        rack: request.rack_id.as_ref().map(|rack| rack.to_string()),
        client_id: client_id.to_string(),
        client_host: client.peer.ip().to_string(),
        reply,
    };
    if !ask_groups(shard, asked).await {
        return refused(errors::COORDINATOR_NOT_AVAILABLE, "shutting down".into());
    }
    let answered = match answer.await {
        Ok(answered) => answered,
        Err(_) => return refused(errors::COORDINATOR_NOT_AVAILABLE, "shutting down".into()),
    };
    match answered {
        Ok(beat) => {
            let assignment = beat.answer.assignment.map(|topics| {
                Assignment::default().with_topic_partitions(
                    topics
                        .iter()
                        .filter_map(|(topic, partitions)| {
                            Some(
                                TopicPartitions::default()
                                    .with_topic_id(topic_id(shard, topic)?)
                                    .with_partitions(
                                        partitions.iter().map(|&p| p as i32).collect(),
                                    ),
                            )
                        })
                        .collect(),
                )
            });
            ShareGroupHeartbeatResponse::default()
                .with_member_id(Some(request.member_id.clone()))
                .with_member_epoch(beat.answer.member_epoch)
                .with_heartbeat_interval_ms(beat.heartbeat_interval_ms)
                .with_assignment(assignment)
        }
        Err(refusal) => {
            let (code, message) = match refusal {
                ShareRefusal::NotCoordinator => (
                    errors::NOT_COORDINATOR,
                    format!("this broker does not coordinate group {group}"),
                ),
                ShareRefusal::UnknownMember => (
                    errors::UNKNOWN_MEMBER_ID,
                    "the member is not in the group".into(),
                ),
                ShareRefusal::FencedMemberEpoch => (
                    errors::FENCED_MEMBER_EPOCH,
                    "the member epoch is not the member's".into(),
                ),
                ShareRefusal::InconsistentProtocol => (
                    errors::INCONSISTENT_GROUP_PROTOCOL,
                    format!("group {group} is a consumer group"),
                ),
                ShareRefusal::Invalid(why) => (errors::INVALID_REQUEST, why),
            };
            refused(code, message)
        }
    }
}

async fn describe(
    shard: &Shard,
    client: &Client,
    request: ShareGroupDescribeRequest,
) -> ShareGroupDescribeResponse {
    let mut groups = Vec::with_capacity(request.group_ids.len());
    for group in &request.group_ids {
        let name = group.0.to_string();
        let described = DescribedGroup::default()
            .with_group_id(group.clone())
            .with_authorized_operations(i32::MIN);
        if !authorize::group(shard, client, Operation::Describe, &name) {
            groups.push(described.with_error_code(errors::GROUP_AUTHORIZATION_FAILED));
            continue;
        }
        let (reply, answer) = oneshot::channel();
        let asked = ShareGroupRequest::Describe {
            group: name.clone(),
            reply,
        };
        let answered = if ask_groups(shard, asked).await {
            answer.await.unwrap_or(Err(ErrorCode::NotReady))
        } else {
            Err(ErrorCode::NotReady)
        };
        let share = match answered {
            Ok(Some(share)) => share,
            // No members, but share-partition state stored: Empty, as ListGroups lists it.
            Ok(None)
                if super::share_admin::inspect(shard, &name)
                    .await
                    .is_ok_and(|stored| stored.exists()) =>
            {
                groups.push(
                    described
                        .with_group_state(text("Empty"))
                        .with_assignor_name(text("simple")),
                );
                continue;
            }
            Ok(None) => {
                groups.push(
                    described
                        .with_error_code(errors::GROUP_ID_NOT_FOUND)
                        .with_error_message(Some(text(&format!(
                            "no share group {name} runs here"
                        )))),
                );
                continue;
            }
            Err(code) => {
                groups.push(described.with_error_code(kafka_error(code)));
                continue;
            }
        };
        let members = share
            .members()
            .iter()
            .map(|(id, member)| {
                let partitions = member
                    .assignment
                    .iter()
                    .filter_map(|(topic, partitions)| {
                        Some(
                            DescribedTopicPartitions::default()
                                .with_topic_id(topic_id(shard, topic)?)
                                .with_topic_name(TopicName(text(topic)))
                                .with_partitions(partitions.iter().map(|&p| p as i32).collect()),
                        )
                    })
                    .collect();
                Member::default()
                    .with_member_id(text(id))
                    .with_rack_id(member.rack.as_deref().map(text))
                    .with_member_epoch(member.epoch)
                    .with_client_id(text(&member.client_id))
                    .with_client_host(text(&member.client_host))
                    .with_subscribed_topic_names(
                        member.topics.iter().map(|t| TopicName(text(t))).collect(),
                    )
                    .with_assignment(
                        DescribedAssignment::default().with_topic_partitions(partitions),
                    )
            })
            .collect();
        groups.push(
            described
                .with_group_state(text(if share.is_empty() { "Empty" } else { "Stable" }))
                .with_group_epoch(share.epoch())
                .with_assignment_epoch(share.epoch())
                .with_assignor_name(text("simple"))
                .with_members(members),
        );
    }
    ShareGroupDescribeResponse::default().with_groups(groups)
}

/// Kafka's topic id of `topic`.
fn topic_id(shard: &Shard, topic: &str) -> Option<uuid::Uuid> {
    let view = shard.view.borrow();
    let known = view.topics.iter().find(|known| known.name == topic)?;
    Some(kafka_topic_id(known))
}

/// The topic a Kafka topic id names.
fn topic_named(shard: &Shard, id: uuid::Uuid) -> Option<String> {
    let view = shard.view.borrow();
    view.topics
        .iter()
        .find(|known| kafka_topic_id(known) == id)
        .map(|known| known.name.clone())
}

/// A partition's leader and its epoch, as this broker's view has them.
fn leader_of(shard: &Shard, topic: &str, partition: u32) -> (i32, i32) {
    let view = shard.view.borrow();
    view.topics
        .iter()
        .find(|known| known.name == topic)
        .and_then(|known| known.partitions.get(partition as usize))
        .map_or((-1, -1), |state| (state.leader, state.leader_epoch as i32))
}

/// How a share session check went: the request may go on, or is refused with a code.
fn check_session(
    shard: &Shard,
    group: &str,
    member: &str,
    epoch: i32,
    opening_allowed: bool,
) -> Result<(), i16> {
    let mut sessions = shard.share_sessions.borrow_mut();
    let key = (group.to_string(), member.to_string());
    match epoch {
        0 if opening_allowed => {
            sessions.insert(
                key,
                ShareSession {
                    next_epoch: 1,
                    partitions: BTreeSet::new(),
                },
            );
            Ok(())
        }
        0 => Err(errors::INVALID_SHARE_SESSION_EPOCH),
        -1 => sessions
            .contains_key(&key)
            .then_some(())
            .ok_or(errors::SHARE_SESSION_NOT_FOUND),
        epoch => {
            let session = sessions
                .get_mut(&key)
                .ok_or(errors::SHARE_SESSION_NOT_FOUND)?;
            if session.next_epoch != epoch {
                return Err(errors::INVALID_SHARE_SESSION_EPOCH);
            }
            session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
            Ok(())
        }
    }
}

fn share_failure_code(failure: &ShareFailure) -> (i16, Option<String>) {
    match failure {
        ShareFailure::Code(code) => (kafka_error(*code), None),
        ShareFailure::InvalidRecordState(why) => (errors::INVALID_RECORD_STATE, Some(why.clone())),
        ShareFailure::InvalidRequest(why) => (errors::INVALID_REQUEST, Some(why.clone())),
    }
}

/// Acknowledgement batches as the core takes them; `None` for an unknown type.
fn ack_batches<'a>(
    batches: impl Iterator<Item = (i64, i64, &'a [i8])>,
    renewing: Renewing,
) -> Result<Vec<AckBatch>, (i16, String)> {
    let malformed = || {
        (
            errors::INVALID_REQUEST,
            "an acknowledge type is not one Kafka defines".to_string(),
        )
    };
    let parsed: Vec<AckBatch> = batches
        .map(|(first, last, types)| {
            Some(AckBatch {
                first: u64::try_from(first).ok()?,
                last: u64::try_from(last).ok()?,
                types: types
                    .iter()
                    .map(|&code| AckType::from_wire(code))
                    .collect::<Option<Vec<_>>>()?,
            })
        })
        .collect::<Option<_>>()
        .ok_or_else(malformed)?;
    let renews = parsed
        .iter()
        .any(|batch| batch.types.contains(&AckType::Renew));
    match renewing {
        _ if !renews => Ok(parsed),
        Renewing::Allowed => Ok(parsed),
        Renewing::NotAsked => Err((
            errors::INVALID_REQUEST,
            "a RENEW acknowledgement needs version 2 and IsRenewAck".to_string(),
        )),
        Renewing::Disabled => Err((
            errors::INVALID_RECORD_STATE,
            "renewing acquisition locks is not enabled for the group \
             (share.renew.acknowledge.enable)"
                .to_string(),
        )),
    }
}

/// The lock duration a ShareFetch or ShareAcknowledge answer tells (the one a RENEW restarts).
fn lock_timeout_ms(config: &ShareGroupConfig) -> i32 {
    i32::try_from(config.partition.lock_duration.as_millis()).unwrap_or(i32::MAX)
}

/// Whether a request's acknowledgements may RENEW locks (KIP-1222): at version 2, flagged
/// `IsRenewAck`, in a group that allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewing {
    Allowed,
    NotAsked,
    Disabled,
}

impl Renewing {
    fn of(version: i16, is_renew_ack: bool, config: &ShareGroupConfig) -> Renewing {
        if version < 2 || !is_renew_ack {
            Renewing::NotAsked
        } else if !config.renew_enabled {
            Renewing::Disabled
        } else {
            Renewing::Allowed
        }
    }
}

/// Applies one partition's acknowledgements on its leader: Kafka's error code and message.
async fn acknowledge_partition(
    shard: &Rc<Shard>,
    client: &Client,
    group: &str,
    member: &str,
    topic: &str,
    partition: u32,
    batches: Result<Vec<AckBatch>, (i16, String)>,
) -> (i16, Option<String>) {
    let batches = match batches {
        Ok(batches) => batches,
        Err((code, message)) => return (code, Some(message)),
    };
    if !authorize::topic(shard, client, Operation::Read, topic) {
        return (errors::TOPIC_AUTHORIZATION_FAILED, None);
    }
    match share_fetch::acknowledge(shard, group, member, topic, partition, batches).await {
        Ok(()) => (errors::NONE, None),
        Err(failure) => share_failure_code(&failure),
    }
}

/// Releases what `member` holds on the partitions of its closed session.
async fn release_session(
    shard: &Rc<Shard>,
    group: &str,
    member: &str,
    partitions: &[(String, u32)],
) {
    share_fetch::release(shard, group, member, partitions).await;
}

/// What one partition's part of a ShareFetch answer holds.
#[derive(Default)]
struct PartitionAnswer {
    error: i16,
    error_message: Option<String>,
    acknowledge_error: i16,
    acknowledge_message: Option<String>,
    acquired: Option<ShareAcquired>,
    answered: bool,
}

/// A ShareFetch's or ShareAcknowledge's group and member ids, both given and not empty.
fn group_and_member(
    group: &Option<strata_kafka::kafka_protocol::messages::GroupId>,
    member: &Option<strata_kafka::kafka_protocol::protocol::StrBytes>,
) -> Option<(String, String)> {
    let (group, member) = (group.as_ref()?.0.to_string(), member.as_ref()?.to_string());
    (!group.is_empty() && !member.is_empty()).then_some((group, member))
}

/// Whether a ShareFetch (`opens`: it may open a session) or ShareAcknowledge may go on: its
/// group and member ids given, Read on the group, its session at `epoch`. The ids, or why
/// not (a code and its message).
fn admit(
    shard: &Shard,
    client: &Client,
    (group, member): (
        &Option<strata_kafka::kafka_protocol::messages::GroupId>,
        &Option<strata_kafka::kafka_protocol::protocol::StrBytes>,
    ),
    epoch: i32,
    opens: bool,
) -> Result<(String, String), (i16, &'static str)> {
    let Some((group, member)) = group_and_member(group, member) else {
        return Err((
            errors::INVALID_REQUEST,
            "the group and member ids are needed",
        ));
    };
    if !authorize::group(shard, client, Operation::Read, &group) {
        return Err((
            errors::GROUP_AUTHORIZATION_FAILED,
            "Read on the group is needed",
        ));
    }
    if let Err(code) = check_session(shard, &group, &member, epoch, opens) {
        return Err((code, "the share session is not at that epoch"));
    }
    Ok((group, member))
}

/// A ShareFetch's partitions join the member's share session (but at the epoch that closes
/// it), and their acknowledgements are applied: the answers so far, and the partitions of
/// topics this broker does not know.
async fn join_and_acknowledge(
    shard: &Rc<Shard>,
    client: &Client,
    (group, member, epoch): (&String, &String, i32),
    topics: &[strata_kafka::kafka_protocol::messages::share_fetch_request::FetchTopic],
    renewing: Renewing,
) -> (
    BTreeMap<(String, u32), PartitionAnswer>,
    Vec<(uuid::Uuid, i32)>,
) {
    let mut answers: BTreeMap<(String, u32), PartitionAnswer> = BTreeMap::new();
    let mut unknown: Vec<(uuid::Uuid, i32)> = Vec::new();
    for asked in topics {
        let Some(topic) = topic_named(shard, asked.topic_id) else {
            unknown.extend(
                asked
                    .partitions
                    .iter()
                    .map(|p| (asked.topic_id, p.partition_index)),
            );
            continue;
        };
        for partition in &asked.partitions {
            let index = partition.partition_index as u32;
            let mut joined = false;
            if let Some(session) = shard
                .share_sessions
                .borrow_mut()
                .get_mut(&(group.clone(), member.clone()))
                && epoch != -1
            {
                joined = session.partitions.insert((topic.clone(), index));
            }
            if joined {
                // What the leader holds may predate an operator's change (`share_admin`).
                super::share_admin::check_stored(shard, group, &topic, index).await;
            }
            if partition.acknowledgement_batches.is_empty() {
                continue;
            }
            let batches = ack_batches(
                partition.acknowledgement_batches.iter().map(|batch| {
                    (
                        batch.first_offset,
                        batch.last_offset,
                        batch.acknowledge_types.as_slice(),
                    )
                }),
                renewing,
            );
            let (code, message) =
                acknowledge_partition(shard, client, group, member, &topic, index, batches).await;
            let answer = answers.entry((topic.clone(), index)).or_default();
            answer.acknowledge_error = code;
            answer.acknowledge_message = message;
            answer.answered = true;
        }
    }
    (answers, unknown)
}

/// A ShareFetch's answer, and the records it carries from segment files (sent with
/// `sendfile`).
type FetchAnswer = (ShareFetchResponse, frame::ShareRecordsElsewhere);

async fn fetch(
    shard: &Rc<Shard>,
    client: &Client,
    request: ShareFetchRequest,
    version: i16,
) -> FetchAnswer {
    let refused = |code: i16, message: &str| {
        let response = ShareFetchResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(message)));
        (response, Vec::new())
    };
    let epoch = request.share_session_epoch;
    let ids = (&request.group_id, &request.member_id);
    let (group, member) = match admit(shard, client, ids, epoch, true) {
        Ok(admitted) => admitted,
        Err((code, why)) => return refused(code, why),
    };
    // KIP-1222: a fetch that renews locks fetches nothing (what it would fetch could take
    // longer than the locks it renewed), and says so with zero limits.
    let renews = version >= 2 && request.is_renew_ack;
    if renews
        && (request.max_bytes != 0
            || request.min_bytes != 0
            || request.max_records != 0
            || request.max_wait_ms != 0)
    {
        return refused(
            errors::INVALID_REQUEST,
            "maxBytes, minBytes, maxRecords and maxWaitMs must be 0 when isRenewAck is set",
        );
    }
    // KIP-1206: whether the record limit may be passed to end at a batch's end.
    let mode = match (version, request.share_acquire_mode) {
        (..=1, _) | (_, 0) => AcquireMode::BatchOptimized,
        (_, 1) => AcquireMode::RecordLimit,
        _ => return refused(errors::INVALID_REQUEST, "unknown share acquire mode"),
    };
    let config = group_config(shard, &group);
    let renewing = Renewing::of(version, request.is_renew_ack, &config);
    let (mut answers, unknown) = join_and_acknowledge(
        shard,
        client,
        (&group, &member, epoch),
        &request.topics,
        renewing,
    )
    .await;
    let session_key = (group.clone(), member.clone());
    for forgotten in &request.forgotten_topics_data {
        let Some(topic) = topic_named(shard, forgotten.topic_id) else {
            continue;
        };
        let dropped: Vec<(String, u32)> = forgotten
            .partitions
            .iter()
            .map(|&p| (topic.clone(), p as u32))
            .filter(|key| {
                shard
                    .share_sessions
                    .borrow_mut()
                    .get_mut(&session_key)
                    .is_some_and(|session| session.partitions.remove(key))
            })
            .collect();
        release_session(shard, &group, &member, &dropped).await;
    }
    if epoch == -1 {
        let closed = shard.share_sessions.borrow_mut().remove(&session_key);
        let partitions: Vec<_> = closed.into_iter().flat_map(|s| s.partitions).collect();
        release_session(shard, &group, &member, &partitions).await;
        return fetch_response(shard, client, &config, answers, unknown);
    }
    let partitions: Vec<(String, u32)> = shard
        .share_sessions
        .borrow()
        .get(&session_key)
        .map(|session| session.partitions.iter().cloned().collect())
        .unwrap_or_default();
    if renews {
        return fetch_response(shard, client, &config, answers, unknown);
    }
    let limits = Limits::new(
        shard,
        i64::from(request.max_records),
        i64::from(request.max_bytes),
        i64::from(request.max_wait_ms),
    )
    .with_mode(mode)
    .with_delivery(client.delivery());
    let member = Fetcher {
        group: &group,
        id: &member,
        config: &config,
    };
    if request.max_bytes == 0 {
        // A fetch that takes no bytes acquires nothing (it may still acknowledge): it waits
        // out its time, as one finding no records would.
        shard
            .context
            .config
            .clock
            .sleep_until(limits.deadline())
            .await;
    } else {
        acquire(shard, client, &member, &partitions, limits, &mut answers).await;
    }
    fetch_response(shard, client, &config, answers, unknown)
}

/// Acquires records of the session's `partitions` for `member` (the loop both listeners
/// share, `server/share_fetch.rs`); a partition the client may not Read is answered
/// TOPIC_AUTHORIZATION_FAILED, and then the fetch does not wait.
async fn acquire(
    shard: &Rc<Shard>,
    client: &Client,
    member: &Fetcher<'_>,
    partitions: &[(String, u32)],
    limits: Limits,
    answers: &mut BTreeMap<(String, u32), PartitionAnswer>,
) {
    let (readable, refused): (Vec<_>, Vec<_>) = partitions
        .iter()
        .cloned()
        .partition(|(topic, _)| authorize::topic(shard, client, Operation::Read, topic));
    for key in &refused {
        let answer = answers.entry(key.clone()).or_default();
        answer.error = errors::TOPIC_AUTHORIZATION_FAILED;
        answer.answered = true;
    }
    let acquired =
        share_fetch::acquire(shard, member, &readable, limits, !refused.is_empty()).await;
    for (key, acquisition) in acquired {
        let answer = answers.entry(key).or_default();
        match acquisition {
            Ok(acquired) => answer.acquired = Some(acquired),
            Err(failure) => {
                let (code, message) = share_failure_code(&failure);
                answer.error = code;
                answer.error_message = message;
            }
        }
        answer.answered = true;
    }
}

fn fetch_response(
    shard: &Shard,
    client: &Client,
    config: &ShareGroupConfig,
    answers: BTreeMap<(String, u32), PartitionAnswer>,
    unknown: Vec<(uuid::Uuid, i32)>,
) -> FetchAnswer {
    let mut topics: BTreeMap<uuid::Uuid, Vec<PartitionData>> = BTreeMap::new();
    let mut elsewhere = Vec::new();
    let mut leaders = BTreeSet::new();
    for ((topic, partition), answer) in answers {
        if !answer.answered {
            continue;
        }
        let Some(id) = topic_id(shard, &topic) else {
            continue;
        };
        let (leader, mut leader_epoch) = leader_of(shard, &topic, partition);
        if let Some(acquired) = &answer.acquired {
            // The epoch of the leader that acquired them, which the view may not have yet.
            leader_epoch = acquired.leader_epoch as i32;
        }
        leaders.insert(leader);
        let mut error = answer.error;
        let mut error_message = answer.error_message;
        // Empty records, never null: librdkafka refuses a null record set in a ShareFetch
        // answer (Java's client takes either).
        let (records, acquired) = match answer.acquired {
            Some(acquired) => match records_to_kafka(acquired.records) {
                Ok(KafkaRecords::Bytes(records)) => (records, acquired.acquired),
                Ok(KafkaRecords::Elsewhere(source)) => {
                    elsewhere.push((*id.as_bytes(), partition as i32, source));
                    (Bytes::new(), acquired.acquired)
                }
                Err(failed) => {
                    error = errors::KAFKA_STORAGE_ERROR;
                    error_message = Some(format!("records did not translate: {failed}"));
                    (Bytes::new(), Vec::new())
                }
            },
            None => (Bytes::new(), Vec::new()),
        };
        topics.entry(id).or_default().push(
            PartitionData::default()
                .with_partition_index(partition as i32)
                .with_error_code(error)
                .with_error_message(error_message.as_deref().map(text))
                .with_acknowledge_error_code(answer.acknowledge_error)
                .with_acknowledge_error_message(answer.acknowledge_message.as_deref().map(text))
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(leader)
                        .with_leader_epoch(leader_epoch),
                )
                .with_records(Some(records))
                .with_acquired_records(
                    acquired
                        .iter()
                        .map(|run| {
                            AcquiredRecords::default()
                                .with_first_offset(run.first as i64)
                                .with_last_offset(run.last as i64)
                                .with_delivery_count(run.deliveries as i16)
                        })
                        .collect(),
                ),
        );
    }
    for (id, partition) in unknown {
        topics.entry(id).or_default().push(
            PartitionData::default()
                .with_partition_index(partition)
                .with_error_code(errors::UNKNOWN_TOPIC_ID)
                .with_records(Some(Bytes::new())),
        );
    }
    let response = ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(lock_timeout_ms(config))
        .with_responses(
            topics
                .into_iter()
                .map(|(id, partitions)| {
                    ShareFetchableTopicResponse::default()
                        .with_topic_id(id)
                        .with_partitions(partitions)
                })
                .collect(),
        )
        .with_node_endpoints(endpoints(shard, client, &leaders));
    (response, elsewhere)
}

/// Acquired batches as a Kafka consumer takes them.
enum KafkaRecords {
    Bytes(Bytes),
    /// Kafka batches only, in a segment file's range: sent as they are, with `sendfile`.
    Elsewhere(Elsewhere),
}

/// Acquired batches as a Kafka consumer reads them: Kafka batches as stored, Strata batches (a
/// native producer's, transaction markers) translated, so read into memory first when they
/// are in a file's range.
fn records_to_kafka(records: Records) -> Result<KafkaRecords, String> {
    let bytes = match records {
        Records::Shared(bytes) => bytes,
        Records::Mutable(bytes) => bytes.freeze(),
        Records::Elsewhere(elsewhere) => {
            let region = elsewhere
                .source
                .downcast_ref::<crate::log::FileRegion>()
                .ok_or("records elsewhere that are not a file region")?;
            if region.kafka_only {
                return Ok(KafkaRecords::Elsewhere(elsewhere));
            }
            crate::server::shard::read_cached_region(region).map_err(|error| error.to_string())?
        }
    };
    strata_kafka::records::to_kafka(bytes)
        .map(KafkaRecords::Bytes)
        .map_err(|error| error.to_string())
}

fn endpoints(shard: &Shard, client: &Client, leaders: &BTreeSet<i32>) -> Vec<NodeEndpoint> {
    let view = shard.view.borrow();
    view.brokers
        .iter()
        .filter(|broker| leaders.contains(&broker.id))
        .filter_map(|broker| {
            Some(
                NodeEndpoint::default()
                    .with_node_id(BrokerId(broker.id))
                    .with_host(text(&broker.host))
                    .with_port(i32::from(super::kafka_port(broker, client)?))
                    .with_rack(broker.rack.as_deref().map(text)),
            )
        })
        .collect()
}

async fn acknowledge(
    shard: &Rc<Shard>,
    client: &Client,
    request: ShareAcknowledgeRequest,
    version: i16,
) -> ShareAcknowledgeResponse {
    let refused = |code: i16, message: &str| {
        ShareAcknowledgeResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(message)))
    };
    let epoch = request.share_session_epoch;
    let ids = (&request.group_id, &request.member_id);
    let (group, member) = match admit(shard, client, ids, epoch, false) {
        Ok(admitted) => admitted,
        Err((code, why)) => return refused(code, why),
    };
    let config = group_config(shard, &group);
    let renewing = Renewing::of(version, request.is_renew_ack, &config);
    let mut topics = Vec::with_capacity(request.topics.len());
    let mut leaders = BTreeSet::new();
    for asked in &request.topics {
        let topic = topic_named(shard, asked.topic_id);
        let mut partitions = Vec::with_capacity(asked.partitions.len());
        for partition in &asked.partitions {
            let index = partition.partition_index as u32;
            let (code, message, leader) = match &topic {
                None => (errors::UNKNOWN_TOPIC_ID, None, (-1, -1)),
                Some(topic) => {
                    let batches = ack_batches(
                        partition.acknowledgement_batches.iter().map(|batch| {
                            (
                                batch.first_offset,
                                batch.last_offset,
                                batch.acknowledge_types.as_slice(),
                            )
                        }),
                        renewing,
                    );
                    let (code, message) = acknowledge_partition(
                        shard, client, &group, &member, topic, index, batches,
                    )
                    .await;
                    (code, message, leader_of(shard, topic, index))
                }
            };
            leaders.insert(leader.0);
            partitions.push(
                AckPartition::default()
                    .with_partition_index(partition.partition_index)
                    .with_error_code(code)
                    .with_error_message(message.as_deref().map(text))
                    .with_current_leader(
                        AckLeader::default()
                            .with_leader_id(leader.0)
                            .with_leader_epoch(leader.1),
                    ),
            );
        }
        topics.push(
            ShareAcknowledgeTopicResponse::default()
                .with_topic_id(asked.topic_id)
                .with_partitions(partitions),
        );
    }
    if epoch == -1 {
        let closed = shard
            .share_sessions
            .borrow_mut()
            .remove(&(group.clone(), member.clone()));
        let partitions: Vec<_> = closed.into_iter().flat_map(|s| s.partitions).collect();
        release_session(shard, &group, &member, &partitions).await;
    }
    let endpoints = endpoints(shard, client, &leaders)
        .into_iter()
        .map(|endpoint| {
            strata_kafka::kafka_protocol::messages::share_acknowledge_response::NodeEndpoint::default()
                .with_node_id(endpoint.node_id)
                .with_host(endpoint.host)
                .with_port(endpoint.port)
                .with_rack(endpoint.rack)
        })
        .collect();
    ShareAcknowledgeResponse::default()
        .with_acquisition_lock_timeout_ms(lock_timeout_ms(&config))
        .with_responses(topics)
        .with_node_endpoints(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(types: &[i8], renewing: Renewing) -> Result<Vec<AckBatch>, (i16, String)> {
        ack_batches(
            std::iter::once((0, types.len() as i64 - 1, types)),
            renewing,
        )
    }

    #[test]
    fn renew_acknowledgements_need_version_2_the_flag_and_the_group_allowing_them() {
        let config = ShareGroupConfig::default();
        assert_eq!(Renewing::of(1, true, &config), Renewing::NotAsked);
        assert_eq!(Renewing::of(2, false, &config), Renewing::NotAsked);
        assert_eq!(Renewing::of(2, true, &config), Renewing::Allowed);
        let disabled = ShareGroupConfig::from_configs(Some(&BTreeMap::from([(
            "share.renew.acknowledge.enable".to_string(),
            "false".to_string(),
        )])));
        assert_eq!(Renewing::of(2, true, &disabled), Renewing::Disabled);

        let renew_and_accept = [4, 1];
        assert_eq!(
            parse(&renew_and_accept, Renewing::Allowed).unwrap()[0].types,
            vec![AckType::Renew, AckType::Accept]
        );
        assert_eq!(
            parse(&renew_and_accept, Renewing::NotAsked).unwrap_err().0,
            errors::INVALID_REQUEST
        );
        assert_eq!(
            parse(&renew_and_accept, Renewing::Disabled).unwrap_err().0,
            errors::INVALID_RECORD_STATE
        );
        // Without a renewal, the flag's absence changes nothing; an unknown type is refused.
        assert!(parse(&[1, 2, 3, 0], Renewing::NotAsked).is_ok());
        assert_eq!(
            parse(&[5], Renewing::Allowed).unwrap_err().0,
            errors::INVALID_REQUEST
        );
    }
}
