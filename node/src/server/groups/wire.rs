//! What the group handlers share between the group cores and the wire: error codes, partition
//! lists, committed offsets, a Kafka consumer's assignment, and the session timeouts a member
//! may ask for. A leaf: it names no other module of the group thread.

use std::collections::BTreeMap;

use bytes::Bytes;
use strata_coordinator::CoordinatorError;
use strata_coordinator::groups::GroupOffsets;
use strata_wire::protocol::{CommittedOffset, ErrorCode, TopicPartitions};

use crate::group::classic::ClassicError;
use crate::group::{GroupError, TopicPartition};

pub(super) fn group_error(error: GroupError) -> ErrorCode {
    match error {
        GroupError::UnknownMember => ErrorCode::UnknownMemberId,
        GroupError::IllegalGeneration => ErrorCode::IllegalGeneration,
        GroupError::FencedInstanceId => ErrorCode::FencedInstanceId,
        GroupError::InconsistentAssignor => ErrorCode::InconsistentAssignor,
    }
}

pub(super) fn store_error(error: &CoordinatorError) -> ErrorCode {
    match error {
        CoordinatorError::Invalid(_) | CoordinatorError::InvalidTopicName { .. } => {
            ErrorCode::InvalidGroupId
        }
        _ => ErrorCode::CoordinatorNotAvailable,
    }
}

pub(super) fn classic_error(error: ClassicError) -> ErrorCode {
    match error {
        ClassicError::UnknownMember | ClassicError::MemberIdRequired => ErrorCode::UnknownMemberId,
        ClassicError::IllegalGeneration => ErrorCode::IllegalGeneration,
        ClassicError::RebalanceInProgress => ErrorCode::RebalanceInProgress,
        ClassicError::InconsistentProtocol => ErrorCode::InconsistentAssignor,
        ClassicError::FencedInstanceId => ErrorCode::FencedInstanceId,
    }
}

/// The partitions in a Kafka consumer's assignment (ConsumerProtocolAssignment, whose first
/// two bytes are its version), for `group describe`; nothing if it does not decode.
pub(super) fn consumer_assignment(mut assignment: Bytes) -> Vec<TopicPartitions> {
    use strata_kafka::kafka_protocol::messages::ConsumerProtocolAssignment;
    use strata_kafka::kafka_protocol::protocol::Decodable;
    if assignment.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([assignment[0], assignment[1]]);
    let _ = bytes::Buf::get_i16(&mut assignment);
    let Ok(decoded) = ConsumerProtocolAssignment::decode(&mut assignment, version) else {
        return Vec::new();
    };
    decoded
        .assigned_partitions
        .into_iter()
        .map(|assigned| TopicPartitions {
            topic: assigned.topic.0.to_string(),
            partitions: assigned
                .partitions
                .into_iter()
                .filter_map(|partition| u32::try_from(partition).ok())
                .collect(),
        })
        .collect()
}

/// The topics a Kafka consumer subscribes to (its ConsumerProtocolSubscription, whose first
/// two bytes are its version); `None` if it does not decode.
pub(super) fn consumer_subscription(mut metadata: Bytes) -> Option<Vec<String>> {
    use strata_kafka::kafka_protocol::messages::ConsumerProtocolSubscription;
    use strata_kafka::kafka_protocol::protocol::Decodable;
    if metadata.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([metadata[0], metadata[1]]);
    let _ = bytes::Buf::get_i16(&mut metadata);
    let decoded = ConsumerProtocolSubscription::decode(&mut metadata, version).ok()?;
    Some(
        decoded
            .topics
            .into_iter()
            .map(|topic| topic.to_string())
            .collect(),
    )
}

pub(super) fn to_wire(partitions: &[TopicPartition]) -> Vec<TopicPartitions> {
    let mut grouped: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for tp in partitions {
        grouped.entry(&tp.topic).or_default().push(tp.partition);
    }
    grouped
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            TopicPartitions {
                topic: topic.to_string(),
                partitions,
            }
        })
        .collect()
}

pub(super) fn from_wire(partitions: Vec<TopicPartitions>) -> Vec<TopicPartition> {
    partitions
        .into_iter()
        .flat_map(|tp| {
            let topic = tp.topic;
            tp.partitions
                .into_iter()
                .map(move |partition| TopicPartition {
                    topic: topic.clone(),
                    partition,
                })
        })
        .collect()
}

/// Session timeouts a member may ask for (Kafka's group.min/max.session.timeout.ms).
pub(super) const SESSION_TIMEOUT_MS_MIN: u32 = 1000;

pub(super) const SESSION_TIMEOUT_MS_MAX: u32 = 300_000;

pub(super) fn committed(offsets: &GroupOffsets) -> Vec<CommittedOffset> {
    offsets
        .iter()
        .flat_map(|(topic, partitions)| {
            partitions
                .iter()
                .map(move |(partition, stored)| CommittedOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: stored.offset as i64,
                    metadata: stored.metadata.clone(),
                })
        })
        .collect()
}
