//! Kafka's per-partition admin reads on the Kafka listener, answered from the partition's log
//! on the shard that holds it (`shard::admin`): OffsetForLeaderEpoch (how a consumer tells
//! its position was truncated away after a leader change), DescribeLogDirs (each replica's
//! size on this broker) and DescribeProducers (a partition's idempotent producers); and
//! DeleteRecords, which moves partitions' log starts.
//!
//! | API | needs |
//! |---|---|
//! | OffsetForLeaderEpoch | Describe on the topic |
//! | DescribeLogDirs | Describe on the cluster |
//! | DescribeProducers | Read on the topic |
//! | DeleteRecords | Delete on the topic |

use std::collections::BTreeMap;
use std::rc::Rc;

use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use strata_kafka::kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use strata_kafka::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use strata_kafka::kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, DescribeLogDirsRequest, DescribeLogDirsResponse,
    DescribeProducersRequest, DescribeProducersResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse, ProducerId, TopicName,
};
use strata_kafka::text;
use strata_wire::protocol::ErrorCode;

use super::authorize;
use super::encoded;
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::shard::Shard;
use strata_kafka::frame::{Header, KafkaRequest};

/// For each partition: the largest leader epoch not above the one asked for and the offset
/// where it ends (the log end for the latest), as the partition's leader knows them. A
/// consumer whose position is past that end after an unclean election was truncated, and
/// says so instead of silently resetting. The caller's `current_leader_epoch` is checked
/// first, as a fetch's is (FENCED_LEADER_EPOCH when older, UNKNOWN_LEADER_EPOCH when newer).
async fn offset_for_leader_epoch(
    shard: &Rc<Shard>,
    client: &Client,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::new();
    for topic in request.topics {
        let name = topic.topic.0.to_string();
        let allowed = authorize::topic(shard, client, Operation::Describe, &name);
        let mut partitions = Vec::new();
        for asked in topic.partitions {
            let answer = |error: i16, epoch: i32, end: i64| {
                EpochEndOffset::default()
                    .with_partition(asked.partition)
                    .with_error_code(error)
                    .with_leader_epoch(epoch)
                    .with_end_offset(end)
            };
            let Ok(index) = u32::try_from(asked.partition) else {
                partitions.push(answer(errors::UNKNOWN_TOPIC_OR_PARTITION, -1, -1));
                continue;
            };
            if !allowed {
                partitions.push(answer(errors::TOPIC_AUTHORIZATION_FAILED, -1, -1));
                continue;
            }
            let (summary, leader_epoch) = match shard.leader_summary(&name, index).await {
                Ok(found) => found,
                Err(code) => {
                    partitions.push(answer(kafka_error(code), -1, -1));
                    continue;
                }
            };
            let current = asked.current_leader_epoch;
            if current >= 0 && (current as u32) < leader_epoch {
                partitions.push(answer(errors::FENCED_LEADER_EPOCH, -1, -1));
                continue;
            }
            if current >= 0 && (current as u32) > leader_epoch {
                partitions.push(answer(errors::UNKNOWN_LEADER_EPOCH, -1, -1));
                continue;
            }
            let found = u32::try_from(asked.leader_epoch).ok().and_then(|epoch| {
                summary
                    .epochs
                    .end_offset_for(epoch, summary.offsets.log_end)
            });
            partitions.push(match found {
                Some((epoch, end)) => answer(errors::NONE, epoch as i32, end as i64),
                // Older than every epoch this log has: Kafka's UNDEFINED (-1, -1).
                None => answer(errors::NONE, -1, -1),
            });
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(topic.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

/// This broker's one log directory (the data dir) with every replica it holds there (or the
/// ones asked for), each with its log's size in bytes (its segments, as Kafka counts it) and
/// how far it is behind its leader; the file system's total and usable bytes.
async fn describe_log_dirs(
    shard: &Rc<Shard>,
    client: &Client,
    request: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    if !authorize::cluster(shard, client, Operation::Describe) {
        return DescribeLogDirsResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED);
    }
    let asked = |topic: &str, partition: u32| match &request.topics {
        None => true,
        Some(topics) => topics.iter().any(|asked| {
            asked.topic.0.as_str() == topic && asked.partitions.contains(&(partition as i32))
        }),
    };
    let mut by_topic: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for replica in shard.replica_sizes().await {
        if !asked(&replica.topic, replica.partition) {
            continue;
        }
        by_topic.entry(replica.topic).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(replica.partition as i32)
                .with_partition_size(replica.size_bytes as i64)
                .with_offset_lag(replica.offset_lag as i64),
        );
    }
    let data_dir = &shard.context.config.data_dir;
    let (total_bytes, usable_bytes) = file_system_bytes(data_dir).unwrap_or((-1, -1));
    let topics = by_topic
        .into_iter()
        .map(|(name, mut partitions)| {
            partitions.sort_by_key(|partition| partition.partition_index);
            DescribeLogDirsTopic::default()
                .with_name(TopicName(text(&name)))
                .with_partitions(partitions)
        })
        .collect();
    let directory = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.clone());
    DescribeLogDirsResponse::default().with_results(vec![
        DescribeLogDirsResult::default()
            .with_log_dir(text(&directory.display().to_string()))
            .with_topics(topics)
            .with_total_bytes(total_bytes)
            .with_usable_bytes(usable_bytes),
    ])
}

/// The size and free space (for unprivileged users) of the file system holding `path`.
fn file_system_bytes(path: &std::path::Path) -> Option<(i64, i64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value for the kernel to overwrite.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stats` a valid statvfs to write into.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return None;
    }
    let block = stats.f_frsize as i64;
    Some((stats.f_blocks as i64 * block, stats.f_bavail as i64 * block))
}

/// Each partition's idempotent producers as its leader's log keeps them: id, epoch, last
/// sequence, last timestamp and the first offset of its open transaction (no coordinator
/// epoch: markers carry none that partitions check).
async fn describe_producers(
    shard: &Rc<Shard>,
    client: &Client,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut topics = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let allowed = authorize::topic(shard, client, Operation::Read, &name);
        let mut partitions = Vec::new();
        for index in topic.partition_indexes {
            let refused = |error: i16| {
                PartitionResponse::default()
                    .with_partition_index(index)
                    .with_error_code(error)
            };
            if !allowed {
                partitions.push(refused(errors::TOPIC_AUTHORIZATION_FAILED));
                continue;
            }
            let Ok(partition) = u32::try_from(index) else {
                partitions.push(refused(errors::UNKNOWN_TOPIC_OR_PARTITION));
                continue;
            };
            let summary = match shard.leader_summary(&name, partition).await {
                Ok((summary, _)) => summary,
                Err(code) => {
                    let code = match code {
                        ErrorCode::UnknownPartition => ErrorCode::UnknownTopic,
                        code => code,
                    };
                    partitions.push(refused(kafka_error(code)));
                    continue;
                }
            };
            let producers = summary
                .producers
                .iter()
                .map(|producer| {
                    ProducerState::default()
                        .with_producer_id(ProducerId(producer.producer_id))
                        .with_producer_epoch(i32::from(producer.epoch))
                        .with_last_sequence(producer.last_sequence)
                        .with_last_timestamp(producer.last_timestamp_ms)
                        .with_coordinator_epoch(-1)
                        .with_current_txn_start_offset(
                            summary
                                .open_transactions
                                .get(&producer.producer_id)
                                .map_or(-1, |open| open.first_offset as i64),
                        )
                })
                .collect();
            partitions.push(refused(errors::NONE).with_active_producers(producers));
        }
        topics.push(
            TopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}

/// Each partition's log start moved up to the offset asked (-1: the high watermark), by its
/// leader on this broker; the answer's low watermark is the new log start.
async fn delete_records(
    shard: &Rc<Shard>,
    client: &Client,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    use strata_kafka::kafka_protocol::messages::delete_records_response::{
        DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
    };
    use strata_wire::protocol as native;
    let mut topics = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let result = |index: i32, error: i16, low_watermark: i64| {
            DeleteRecordsPartitionResult::default()
                .with_partition_index(index)
                .with_error_code(error)
                .with_low_watermark(low_watermark)
        };
        let mut partitions = Vec::new();
        let mut asked = Vec::new();
        for partition in topic.partitions {
            let index = partition.partition_index;
            match u32::try_from(index) {
                _ if !authorize::topic(shard, client, Operation::Delete, &name) => {
                    partitions.push(result(index, errors::TOPIC_AUTHORIZATION_FAILED, -1));
                }
                Err(_) => partitions.push(result(index, errors::UNKNOWN_TOPIC_OR_PARTITION, -1)),
                Ok(partition_index) => asked.push(native::DeleteRecordsPartition {
                    partition: partition_index,
                    offset: partition.offset,
                }),
            }
        }
        if !asked.is_empty() {
            let request = native::DeleteRecordsRequest {
                topics: vec![native::DeleteRecordsTopic {
                    name: name.clone(),
                    partitions: asked,
                }],
            };
            let deleted = shard.delete_records(request).await;
            for partition in deleted.topics.into_iter().flat_map(|t| t.partitions) {
                partitions.push(result(
                    partition.partition as i32,
                    kafka_error(partition.error),
                    partition.log_start_offset,
                ));
            }
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Answers a partition administration request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::OffsetForLeaderEpoch(request) => encoded(
            &header,
            offset_for_leader_epoch(shard, client, request).await,
        ),
        KafkaRequest::DescribeLogDirs(request) => {
            encoded(&header, describe_log_dirs(shard, client, request).await)
        }
        KafkaRequest::DescribeProducers(request) => {
            encoded(&header, describe_producers(shard, client, request).await)
        }
        KafkaRequest::DeleteRecords(request) => {
            encoded(&header, delete_records(shard, client, request).await)
        }
        _ => unreachable!("only the partition administration APIs come here"),
    }
}
