//! Share groups' administration on the Kafka listener (KIP-932): their offsets described
//! (DescribeShareGroupOffsets, with each share-partition's lag from v1), altered
//! (AlterShareGroupOffsets) and deleted (DeleteShareGroupOffsets); and what ListGroups,
//! DescribeGroups, DeleteGroups (`admin`) and FindCoordinator's share key type (`groups`) need
//! of share groups.
//!
//! A share group's offsets are its share-partitions' start offsets, in the records their
//! partitions' leaders store (`shard::share`). They are read through the group thread (any
//! broker reads the store) and changed by the group's coordinator (`groups::share_admin`),
//! only while the group has no members. A change to a partition this broker leads runs on the
//! shard that owns it, in the share-partition's turn, and that shard forgets what it held; a
//! leader elsewhere finds its next write fenced, and checks the record when the partition joins
//! a member's share session there, so a new member starts where the operator set.
//!
//! ACLs as Kafka's `KafkaApis` checks them:
//! - DescribeShareGroupOffsets: Describe on the group; Describe on each topic (a topic named
//!   and refused is TOPIC_AUTHORIZATION_FAILED per partition; with every topic asked for,
//!   those refused are left out);
//! - AlterShareGroupOffsets: Read on the group, Read on each topic;
//! - DeleteShareGroupOffsets: Delete on the group, Read on each topic;
//! - FindCoordinator of a share-partition key: ClusterAction on the cluster (what Kafka's
//!   brokers send it with).

use std::collections::BTreeMap;
use std::rc::Rc;

use base64::Engine;
use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::frame::{Header, KafkaRequest};
use strata_kafka::kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use strata_kafka::kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use strata_kafka::kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use strata_kafka::kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use strata_kafka::kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse, TopicName,
};
use strata_kafka::text;
use strata_wire::protocol::ErrorCode;
use tokio::sync::oneshot;

use super::{authorize, encoded, kafka_topic_id};
use crate::server::groups::coordinator_of;
use crate::server::listener::{Client, Outcome};
use crate::server::messages::{
    GroupMessage, GroupTypes, ShareAdminRequest, ShareGroupRequest, ShareGroupStored,
    ShareStateChange,
};
use crate::server::shard::Shard;
use crate::server::shard::share::{ShareKey, StoredShareState, share_state_id};
use crate::share::config::ShareGroupConfig;
use crate::share::partition::{RecordState, ShareSnapshot};

/// Kafka's start offset of a share-partition with no state (`PartitionFactory`), and the
/// leader epoch and lag answered with it.
const UNINITIALIZED: i64 = -1;

pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::DescribeShareGroupOffsets(request) => {
            encoded(&header, describe_offsets(shard, client, request).await)
        }
        KafkaRequest::AlterShareGroupOffsets(request) => {
            encoded(&header, alter_offsets(shard, client, request).await)
        }
        KafkaRequest::DeleteShareGroupOffsets(request) => {
            encoded(&header, delete_offsets(shard, client, request).await)
        }
        _ => unreachable!("dispatched here only for share group offsets"),
    }
}

/// Asks this broker's group thread.
async fn ask<T>(
    shard: &Shard,
    make: impl FnOnce(oneshot::Sender<Result<T, ErrorCode>>) -> ShareAdminRequest,
) -> Result<T, ErrorCode> {
    let (reply, answer) = oneshot::channel();
    if shard
        .context
        .groups
        .send(GroupMessage::ShareAdmin(make(reply)))
        .is_err()
    {
        return Err(ErrorCode::CoordinatorNotAvailable);
    }
    answer
        .await
        .unwrap_or(Err(ErrorCode::CoordinatorNotAvailable))
}

/// The share groups this broker coordinates and its classic groups (ListGroups' types).
pub(super) async fn group_types(shard: &Shard) -> Result<GroupTypes, ErrorCode> {
    ask(shard, |reply| ShareAdminRequest::List { reply }).await
}

/// `group` as its coordinator (this broker, or NOT_COORDINATOR) knows it as a share group.
pub(super) async fn inspect(shard: &Shard, group: &str) -> Result<ShareGroupStored, ErrorCode> {
    let group = group.to_string();
    ask(shard, |reply| ShareAdminRequest::Inspect { group, reply }).await
}

/// The stored state of `group`'s share-partition of `topic`-`partition` (`None`: none).
async fn load_state(
    shard: &Shard,
    group: &str,
    topic: &str,
    partition: u32,
) -> Result<Option<StoredShareState>, ErrorCode> {
    let (reply, answer) = oneshot::channel();
    let id = share_state_id(group, topic, partition);
    let asked = GroupMessage::Share(ShareGroupRequest::LoadState { id, reply });
    if shard.context.groups.send(asked).is_err() {
        return Err(ErrorCode::CoordinatorNotAvailable);
    }
    let (stored, _) = answer
        .await
        .unwrap_or(Err(ErrorCode::CoordinatorNotAvailable))?;
    stored
        .map(|value| serde_json::from_value(value).map_err(|_| ErrorCode::Internal))
        .transpose()
}

/// Makes `change` to `group`'s stored state of `topic`-`partition` through the group's
/// coordinator (this broker's group thread): where this broker leads the partition, on its
/// owning shard in the share-partition's turn, which then forgets what it held.
async fn change_state(
    shard: &Rc<Shard>,
    group: &str,
    topic: &str,
    partition: u32,
    change: ShareStateChange,
) -> Result<(), ErrorCode> {
    let key: ShareKey = (group.to_string(), topic.to_string(), partition);
    let asking = |shard: Rc<Shard>, key: ShareKey| async move {
        let (group, topic, partition) = key;
        ask(&shard, |reply| ShareAdminRequest::Change {
            group,
            topic,
            partition,
            change,
            reply,
        })
        .await
    };
    match shard.route(topic, partition) {
        Ok(owner) => shard
            .run_on(owner, move |owner| async move {
                let asked = asking(owner.clone(), key.clone());
                owner.share_replace(&key, asked).await
            })
            .await
            .unwrap_or(Err(ErrorCode::NotReady)),
        Err(_) => asking(shard.clone(), key).await,
    }
}

/// `topic`-`partition` joins a member's share session: where this broker leads it, its owning
/// shard checks that what it holds of the share-partition is still what is stored (an operator
/// may have changed it through the group's coordinator on another broker).
pub(super) async fn check_stored(shard: &Rc<Shard>, group: &str, topic: &str, partition: u32) {
    let Ok(owner) = shard.route(topic, partition) else {
        return;
    };
    let key: ShareKey = (group.to_string(), topic.to_string(), partition);
    shard
        .run_on(owner, move |owner| async move {
            owner.share_check_stored(&key).await
        })
        .await;
}

/// The change that sets a share-partition's start offset: nothing in flight, every record
/// from `start` on to deliver; the stored leader epoch kept (a leader claims it again).
fn set_start(start: u64) -> ShareStateChange {
    Box::new(move |stored: Option<serde_json::Value>| {
        let stored =
            stored.and_then(|value| serde_json::from_value::<StoredShareState>(value).ok());
        let state = StoredShareState {
            leader_epoch: stored.as_ref().map_or(0, |stored| stored.leader_epoch),
            state: ShareSnapshot {
                start_offset: start,
                ranges: Vec::new(),
            },
            topic_id: stored.and_then(|stored| stored.topic_id),
        };
        Some(serde_json::to_value(state).expect("a share state serializes"))
    })
}

/// The change that deletes a share-partition's state: its next member starts where the
/// group's `share.auto.offset.reset` says.
fn delete() -> ShareStateChange {
    Box::new(|_| None)
}

/// Whether this broker coordinates `group` (as the group thread decides it).
fn coordinates(shard: &Shard, group: &str) -> bool {
    let brokers: Vec<i32> = shard.view.borrow().brokers.iter().map(|b| b.id).collect();
    coordinator_of(group, &brokers) == Some(shard.context.config.node_id)
}

/// `topic`'s Kafka id and partition count, as this broker's view has them.
fn topic_of(shard: &Shard, topic: &str) -> Option<(uuid::Uuid, u32)> {
    let view = shard.view.borrow();
    let known = view.topics.iter().find(|known| known.name == topic)?;
    Some((kafka_topic_id(known), known.partitions.len() as u32))
}

/// How far `state` is behind the partition's `end`: the records from its start offset to
/// `end` not yet acknowledged or archived (those in flight count: they are not consumed yet).
/// This is Kafka's share-partition lag: the end is the high watermark, or the last stable
/// offset for a `read_committed` group, as the partition's leader answers it.
fn lag(state: &ShareSnapshot, end: u64) -> u64 {
    let start = state.start_offset;
    let done: u64 = state
        .ranges
        .iter()
        .filter(|range| {
            matches!(
                range.state,
                RecordState::Acknowledged | RecordState::Archived
            )
        })
        .map(|range| {
            let (first, last) = (
                range.first.max(start),
                range.last.min(end.saturating_sub(1)),
            );
            (last + 1).saturating_sub(first)
        })
        .sum();
    end.saturating_sub(start).saturating_sub(done)
}

/// One share-partition's start offset, the leader epoch that stored it, and its lag.
async fn describe_partition(
    shard: &Rc<Shard>,
    group: &str,
    topic: &str,
    partition: i32,
    read_committed: bool,
) -> DescribeShareGroupOffsetsResponsePartition {
    let answer = DescribeShareGroupOffsetsResponsePartition::default()
        .with_partition_index(partition)
        .with_start_offset(UNINITIALIZED)
        .with_leader_epoch(UNINITIALIZED as i32)
        .with_lag(UNINITIALIZED);
    let Ok(index) = u32::try_from(partition) else {
        return answer;
    };
    let stored = match load_state(shard, group, topic, index).await {
        Ok(Some(stored)) => stored,
        // No state: Kafka answers the uninitialized offset, not an error.
        Ok(None) => return answer,
        Err(code) => return answer.with_error_code(kafka_error(code)),
    };
    let end = shard.partition_end(topic, index, read_committed).await;
    answer
        .with_start_offset(stored.state.start_offset as i64)
        .with_leader_epoch(stored.leader_epoch as i32)
        .with_lag(end.map_or(UNINITIALIZED, |end| lag(&stored.state, end) as i64))
}

async fn describe_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    request: DescribeShareGroupOffsetsRequest,
) -> DescribeShareGroupOffsetsResponse {
    let mut groups = Vec::with_capacity(request.groups.len());
    for asked in request.groups {
        groups.push(describe_group_offsets(shard, client, asked).await);
    }
    DescribeShareGroupOffsetsResponse::default().with_groups(groups)
}

async fn describe_group_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    asked: DescribeShareGroupOffsetsRequestGroup,
) -> DescribeShareGroupOffsetsResponseGroup {
    let group = asked.group_id.to_string();
    let answer = DescribeShareGroupOffsetsResponseGroup::default().with_group_id(asked.group_id);
    let refused = |code: i16, message: String| {
        answer
            .clone()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
    };
    if !authorize::group(shard, client, Operation::Describe, &group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            format!("Describe on group {group} is needed"),
        );
    }
    if !coordinates(shard, &group) {
        return refused(
            errors::NOT_COORDINATOR,
            format!("this broker does not coordinate group {group}"),
        );
    }
    let asked: Vec<(String, Vec<i32>)> = match asked.topics {
        Some(topics) => topics
            .into_iter()
            .map(|topic| (topic.topic_name.to_string(), topic.partitions))
            .collect(),
        // Every share-partition with state, of the topics the client may describe.
        None => match inspect(shard, &group).await {
            Ok(stored) => {
                let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for (topic, partition) in stored.partitions {
                    topics.entry(topic).or_default().push(partition as i32);
                }
                topics
                    .into_iter()
                    .filter(|(topic, _)| {
                        authorize::topic(shard, client, Operation::Describe, topic)
                    })
                    .collect()
            }
            Err(code) => return answer.with_error_code(kafka_error(code)),
        },
    };
    let read_committed =
        ShareGroupConfig::from_configs(shard.view.borrow().group_configs.get(&group))
            .read_committed;
    let mut topics = Vec::with_capacity(asked.len());
    for (topic, indexes) in asked {
        let mut partitions = Vec::with_capacity(indexes.len());
        let topic_id = match topic_of(shard, &topic) {
            _ if !authorize::topic(shard, client, Operation::Describe, &topic) => {
                partitions.extend(indexes.iter().map(|&index| {
                    DescribeShareGroupOffsetsResponsePartition::default()
                        .with_partition_index(index)
                        .with_start_offset(UNINITIALIZED)
                        .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                }));
                uuid::Uuid::nil()
            }
            Some((id, _)) => {
                for index in indexes {
                    partitions.push(
                        describe_partition(shard, &group, &topic, index, read_committed).await,
                    );
                }
                id
            }
            // A topic that does not exist has no state: the uninitialized offset, no error.
            None => {
                partitions.extend(indexes.iter().map(|&index| {
                    DescribeShareGroupOffsetsResponsePartition::default()
                        .with_partition_index(index)
                        .with_start_offset(UNINITIALIZED)
                        .with_leader_epoch(UNINITIALIZED as i32)
                }));
                uuid::Uuid::nil()
            }
        };
        topics.push(
            DescribeShareGroupOffsetsResponseTopic::default()
                .with_topic_name(TopicName(text(&topic)))
                .with_topic_id(topic_id)
                .with_partitions(partitions),
        );
    }
    answer.with_topics(topics)
}

/// The group-level checks of an offsets change: the group exists here as a share group and
/// has no members. Kafka's code and message otherwise.
async fn changeable(shard: &Shard, group: &str) -> Result<ShareGroupStored, (i16, String)> {
    let stored = inspect(shard, group)
        .await
        .map_err(|code| (kafka_error(code), format!("group {group}: {code}")))?;
    if stored.members > 0 {
        return Err((
            errors::NON_EMPTY_GROUP,
            format!(
                "share group {group} has {} members: its offsets change only while it has none",
                stored.members
            ),
        ));
    }
    if !stored.exists() {
        return Err((
            errors::GROUP_ID_NOT_FOUND,
            format!("no share group {group}"),
        ));
    }
    Ok(stored)
}

/// Sets one share-partition's start offset: Kafka's code and message.
async fn alter_partition(
    shard: &Rc<Shard>,
    group: &str,
    topic: &str,
    partition: u32,
    start: i64,
) -> (i16, Option<String>) {
    let Ok(start) = u64::try_from(start) else {
        return (
            errors::INVALID_REQUEST,
            Some("a start offset is not negative".to_string()),
        );
    };
    match change_state(shard, group, topic, partition, set_start(start)).await {
        Ok(()) => (errors::NONE, None),
        Err(code) => (kafka_error(code), Some(code.to_string())),
    }
}

async fn alter_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    request: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let group = request.group_id.to_string();
    let refused = |code: i16, message: String| {
        AlterShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
    };
    if !authorize::group(shard, client, Operation::Read, &group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            format!("Read on group {group} is needed"),
        );
    }
    if let Err((code, message)) = changeable(shard, &group).await {
        return refused(code, message);
    }
    let mut responses = Vec::with_capacity(request.topics.len());
    for asked in request.topics {
        let topic = asked.topic_name.to_string();
        let known = topic_of(shard, &topic);
        let may = authorize::topic(shard, client, Operation::Read, &topic);
        let mut partitions = Vec::with_capacity(asked.partitions.len());
        for partition in asked.partitions {
            let index = partition.partition_index;
            let (code, message) = match (may, known) {
                (false, _) => (errors::TOPIC_AUTHORIZATION_FAILED, None),
                (true, Some((_, count))) if u32::try_from(index).is_ok_and(|i| i < count) => {
                    let start = partition.start_offset;
                    alter_partition(shard, &group, &topic, index as u32, start).await
                }
                (true, _) => (errors::UNKNOWN_TOPIC_OR_PARTITION, None),
            };
            partitions.push(
                AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(index)
                    .with_error_code(code)
                    .with_error_message(message.as_deref().map(text)),
            );
        }
        responses.push(
            AlterShareGroupOffsetsResponseTopic::default()
                .with_topic_name(asked.topic_name)
                .with_topic_id(known.map_or(uuid::Uuid::nil(), |(id, _)| id))
                .with_partitions(partitions),
        );
    }
    AlterShareGroupOffsetsResponse::default().with_responses(responses)
}

async fn delete_offsets(
    shard: &Rc<Shard>,
    client: &Client,
    request: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let group = request.group_id.to_string();
    let refused = |code: i16, message: String| {
        DeleteShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
    };
    if !authorize::group(shard, client, Operation::Delete, &group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            format!("Delete on group {group} is needed"),
        );
    }
    let stored = match changeable(shard, &group).await {
        Ok(stored) => stored,
        Err((code, message)) => return refused(code, message),
    };
    let mut responses = Vec::with_capacity(request.topics.len());
    for asked in request.topics {
        let topic = asked.topic_name.to_string();
        let known = topic_of(shard, &topic);
        let held: Vec<u32> = stored
            .partitions
            .iter()
            .filter(|(stored_topic, _)| *stored_topic == topic)
            .map(|(_, partition)| *partition)
            .collect();
        let (code, message) = if !authorize::topic(shard, client, Operation::Read, &topic) {
            (errors::TOPIC_AUTHORIZATION_FAILED, None)
        } else if known.is_none() {
            (errors::UNKNOWN_TOPIC_OR_PARTITION, None)
        } else if held.is_empty() {
            (
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                Some("There is no offset information to delete.".to_string()),
            )
        } else {
            let mut outcome = (errors::NONE, None);
            for partition in held {
                if let Err(code) = change_state(shard, &group, &topic, partition, delete()).await {
                    outcome = (kafka_error(code), Some(code.to_string()));
                }
            }
            outcome
        };
        responses.push(
            DeleteShareGroupOffsetsResponseTopic::default()
                .with_topic_name(asked.topic_name)
                .with_topic_id(known.map_or(uuid::Uuid::nil(), |(id, _)| id))
                .with_error_code(code)
                .with_error_message(message.as_deref().map(text)),
        );
    }
    DeleteShareGroupOffsetsResponse::default().with_responses(responses)
}

/// DeleteGroups of a share group: NON_EMPTY_GROUP while it has members; otherwise its stored
/// state is deleted, every share-partition of it. `None` when `group` is no share group here
/// (the caller deletes it as a consumer group).
pub(super) async fn delete_share_group(shard: &Rc<Shard>, group: &str) -> Option<i16> {
    let stored = match inspect(shard, group).await {
        Ok(stored) if !stored.exists() => return None,
        Ok(stored) => stored,
        Err(code) => return Some(kafka_error(code)),
    };
    if stored.members > 0 {
        return Some(errors::NON_EMPTY_GROUP);
    }
    let mut error = errors::NONE;
    for (topic, partition) in &stored.partitions {
        if let Err(code) = change_state(shard, group, topic, *partition, delete()).await {
            error = kafka_error(code);
        }
    }
    if error == errors::NONE {
        tracing::info!(%group, "share group deleted");
    }
    Some(error)
}

/// FindCoordinator of a share-partition key (key type 2, `groupId:topicId:partition`, version
/// 6 on): the partition's leader, which keeps the share-partition's state (Kafka's share
/// coordinator keeps it in `__share_group_state` instead). Kafka's brokers send it, so it
/// needs ClusterAction on the cluster. The leader's id, or Kafka's error.
pub(super) fn share_coordinator(
    shard: &Shard,
    client: &Client,
    version: i16,
    key: &str,
) -> Result<i32, i16> {
    if version < 6 {
        return Err(errors::INVALID_REQUEST);
    }
    if !authorize::cluster(shard, client, Operation::ClusterAction) {
        return Err(errors::CLUSTER_AUTHORIZATION_FAILED);
    }
    let (topic_id, partition) = parse_share_key(key).ok_or(errors::INVALID_REQUEST)?;
    let view = shard.view.borrow();
    let leader = view
        .topics
        .iter()
        .find(|known| kafka_topic_id(known) == topic_id)
        .and_then(|known| known.partitions.get(partition as usize))
        .ok_or(errors::INVALID_REQUEST)?
        .leader;
    if leader < 0 {
        return Err(errors::COORDINATOR_NOT_AVAILABLE);
    }
    Ok(leader)
}

/// A share-partition key's topic id and partition: `groupId:topicId:partition`, the topic id
/// as Kafka writes a `Uuid` (URL-safe base64, unpadded).
fn parse_share_key(key: &str) -> Option<(uuid::Uuid, u32)> {
    let tokens: Vec<&str> = key.split(':').collect();
    let [group, topic_id, partition] = tokens[..] else {
        return None;
    };
    if group.trim().is_empty() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(topic_id)
        .ok()?;
    let topic_id = uuid::Uuid::from_slice(&bytes).ok()?;
    Some((topic_id, partition.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::partition::StateRange;

    fn range(first: u64, last: u64, state: RecordState) -> StateRange {
        StateRange {
            first,
            last,
            state,
            deliveries: 1,
        }
    }

    #[test]
    fn lag_counts_what_is_left_to_consume_past_the_start() {
        let fresh = ShareSnapshot {
            start_offset: 10,
            ranges: Vec::new(),
        };
        assert_eq!(lag(&fresh, 25), 15);
        assert_eq!(lag(&fresh, 10), 0);
        assert_eq!(lag(&fresh, 5), 0, "an end below the start is no lag");
        let window = ShareSnapshot {
            start_offset: 10,
            ranges: vec![
                range(12, 14, RecordState::Acknowledged),
                range(15, 15, RecordState::Available),
                range(16, 17, RecordState::Archived),
                range(30, 40, RecordState::Acknowledged),
            ],
        };
        // 10..25 is 15 records; 12-14 and 16-17 are done; 30-40 lie past the end.
        assert_eq!(lag(&window, 25), 10);
        assert_eq!(lag(&window, 35), 25 - 3 - 2 - 5);
    }

    #[test]
    fn a_share_key_names_a_topic_id_in_kafkas_base64_and_a_partition() {
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes());
        assert_eq!(parse_share_key(&format!("g:{encoded}:3")), Some((id, 3)));
        assert_eq!(parse_share_key(&format!(" :{encoded}:3")), None);
        assert_eq!(parse_share_key(&format!("g:{encoded}")), None);
        assert_eq!(parse_share_key(&format!("g:x:{encoded}:3")), None);
        assert_eq!(parse_share_key("g:not-an-id:3"), None);
        assert_eq!(parse_share_key(&format!("g:{encoded}:-1")), None);
    }
}
