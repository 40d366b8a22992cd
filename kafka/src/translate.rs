//! Each served Kafka API's request as its native request, and the native answer as Kafka's.
//!
//! Partitions the listener can refuse on sight (a negative index, records that do not decode,
//! an offset below zero) never reach the broker: they are answered from a [`Refused`] list
//! merged into the response, next to what the broker answered for the rest.

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest,
    MetadataResponse, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use strata_wire::protocol as native;

use crate::errors::{self, kafka_error};
use crate::frame::SUPPORTED;
use crate::records::{self, RecordsError};
use strata_wire::batch::kafka::KafkaCodec;

/// Kafka's INVALID_REQUIRED_ACKS: acks other than 0, 1 and -1.
const INVALID_REQUIRED_ACKS: i16 = 21;
/// Kafka's FETCH_SESSION_ID_NOT_FOUND: this listener creates no fetch sessions (KIP-227), so a
/// request naming one refers to a session it never made.
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

/// A partition answered by the listener itself, with a Kafka error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub topic: String,
    pub partition: i32,
    pub error: i16,
}

/// A broker's Kafka listener, as Metadata advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaBroker {
    pub node_id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
}

fn topic_name(name: &str) -> TopicName {
    TopicName(crate::text(name))
}

/// Groups entries by topic, keeping the order topics first appear in.
fn by_topic<T>(entries: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut topics: Vec<(String, Vec<T>)> = Vec::new();
    for (topic, entry) in entries {
        match topics.iter_mut().find(|(name, _)| *name == topic) {
            Some((_, entries)) => entries.push(entry),
            None => topics.push((topic, vec![entry])),
        }
    }
    topics
}

/// The features a Strata broker supports and has finalized (KIP-584), by Kafka's names and
/// levels: `group.version` 1 is KIP-848's consumer groups, `share.version` 1 KIP-932's share
/// groups. `transaction.version` stays at 0 (KIP-890's transactions v2 are not served), so a
/// client keeps to the first transaction protocol. Every finalized level is at its maximum:
/// a cluster of one build has nothing to upgrade.
pub const FEATURES: [(&str, i16, i16); 3] = [
    ("group.version", 0, 1),
    ("share.version", 0, 1),
    ("transaction.version", 0, 0),
];

/// The epoch of the finalized features: they never change within a build.
const FINALIZED_FEATURES_EPOCH: i64 = 1;

pub fn api_versions_response(error_code: i16) -> ApiVersionsResponse {
    use kafka_protocol::messages::api_versions_response::{
        FinalizedFeatureKey, SupportedFeatureKey,
    };
    let supported = FEATURES.iter().map(|&(name, min, max)| {
        SupportedFeatureKey::default()
            .with_name(crate::text(name))
            .with_min_version(min)
            .with_max_version(max)
    });
    // As Kafka's brokers: a feature at level 0 is not listed as finalized.
    let finalized = FEATURES
        .iter()
        .filter(|&&(_, _, max)| max > 0)
        .map(|&(name, _, max)| {
            FinalizedFeatureKey::default()
                .with_name(crate::text(name))
                .with_min_version_level(max)
                .with_max_version_level(max)
        });
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_supported_features(supported.collect())
        .with_finalized_features_epoch(FINALIZED_FEATURES_EPOCH)
        .with_finalized_features(finalized.collect())
        .with_api_keys(
            SUPPORTED
                .iter()
                .map(|&(api, min, max)| {
                    // Produce's oldest versions are advertised and refused (see `refusal`).
                    let min = match api {
                        kafka_protocol::messages::ApiKey::Produce => {
                            *crate::refusal::PRODUCE_REFUSED_VERSIONS.start()
                        }
                        _ => min,
                    };
                    ApiVersion::default()
                        .with_api_key(api as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        )
}

/// Topics asked for by name (`None`: all). Entries naming a topic only by id (Metadata v10+)
/// are left out: Strata topics have no ids.
/// A Metadata request of `version` as the native one: `None` asks for every topic, which
/// version 0 spells as an empty list (it has no null) and later versions as null.
pub fn metadata_request(request: &MetadataRequest, version: i16) -> native::MetadataRequest {
    if version == 0 && request.topics.as_ref().is_some_and(Vec::is_empty) {
        return native::MetadataRequest { topics: None };
    }
    native::MetadataRequest {
        topics: request.topics.as_ref().map(|topics| {
            topics
                .iter()
                .filter_map(|topic| topic.name.as_ref().map(|name| name.0.to_string()))
                .collect()
        }),
    }
}

/// The native metadata with brokers at their Kafka listeners. A partition whose leader has
/// no Kafka listener (or is unknown) is LEADER_NOT_AVAILABLE, which clients retry.
pub fn metadata_response(
    native: native::MetadataResponse,
    brokers: &[KafkaBroker],
) -> MetadataResponse {
    let listening = |id: i32| brokers.iter().any(|broker| broker.node_id == id);
    let topics = native
        .topics
        .into_iter()
        .map(|topic| {
            let partitions = topic
                .partitions
                .into_iter()
                .map(|partition| {
                    let leader_known = listening(partition.leader);
                    let error = match partition.error {
                        native::ErrorCode::None if !leader_known => errors::LEADER_NOT_AVAILABLE,
                        code => kafka_error(code),
                    };
                    let offline = partition
                        .replicas
                        .iter()
                        .copied()
                        .filter(|&replica| !listening(replica))
                        .map(BrokerId)
                        .collect();
                    MetadataResponsePartition::default()
                        .with_error_code(error)
                        .with_partition_index(partition.partition as i32)
                        .with_leader_id(BrokerId(if leader_known { partition.leader } else { -1 }))
                        .with_leader_epoch(partition.leader_epoch as i32)
                        .with_replica_nodes(partition.replicas.into_iter().map(BrokerId).collect())
                        .with_isr_nodes(partition.isr.into_iter().map(BrokerId).collect())
                        .with_offline_replicas(offline)
                })
                .collect();
            MetadataResponseTopic::default()
                .with_error_code(kafka_error(topic.error))
                .with_name(Some(topic_name(&topic.name)))
                .with_partitions(partitions)
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(
            brokers
                .iter()
                .map(|broker| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(broker.node_id))
                        .with_host(crate::text(&broker.host))
                        .with_port(i32::from(broker.port))
                        .with_rack(broker.rack.clone().map(StrBytes::from_string))
                })
                .collect(),
        )
        .with_cluster_id(Some(StrBytes::from_string(native.cluster)))
        .with_controller_id(BrokerId(if listening(native.controller) {
            native.controller
        } else {
            -1
        }))
        .with_topics(topics)
}

/// A produce request for the broker, and the partitions refused on sight.
#[derive(Debug)]
pub struct Produce {
    pub native: native::ProduceRequest,
    pub refused: Vec<Refused>,
}

/// Translates a produce request: each partition's Kafka batches go to the log as sent (it
/// checks them whole), recompressed only where `codec_of` gives the topic a codec of its own
/// (its `compression.type`; `None`: each batch's own). A Kafka producer's conditional append
/// (its first record's `strata.expected.offset` header) is read by the log as it checks the
/// records.
pub fn produce_request(
    produced: crate::frame::Produced,
    codec_of: impl Fn(&str) -> Option<KafkaCodec>,
) -> Produce {
    let crate::frame::Produced { request, records } = produced;
    let mut records = records.into_iter();
    let acks = match request.acks {
        0 => Some(native::ACKS_NONE),
        1 => Some(native::ACKS_LEADER),
        -1 => Some(native::ACKS_ALL),
        _ => None,
    };
    let mut refused = Vec::new();
    let mut topics = Vec::new();
    for topic in request.topic_data {
        let name = topic.name.0.to_string();
        let codec = codec_of(&name);
        let mut partitions = Vec::new();
        for partition in topic.partition_data {
            let sent = records.next().flatten();
            let error = match (u32::try_from(partition.index), acks, sent) {
                (Err(_), _, _) => errors::UNKNOWN_TOPIC_OR_PARTITION,
                (_, None, _) => INVALID_REQUIRED_ACKS,
                (_, _, None) => errors::CORRUPT_MESSAGE,
                (Ok(index), Some(_), Some(records)) => match records::to_store(records, codec) {
                    Ok(batches) => {
                        partitions.push(native::ProducePartition {
                            partition: index,
                            records: native::Records::Mutable(batches),
                        });
                        continue;
                    }
                    Err(error) => records_error(&error),
                },
            };
            refused.push(Refused {
                topic: name.clone(),
                partition: partition.index,
                error,
            });
        }
        if !partitions.is_empty() {
            topics.push(native::ProduceTopic { name, partitions });
        }
    }
    Produce {
        native: native::ProduceRequest {
            acks: acks.unwrap_or(native::ACKS_LEADER),
            timeout_ms: request.timeout_ms.max(0) as u32,
            topics,
            expected_offsets: native::Appended(Vec::new()),
            // Kafka's answer has no place for it; the broker counts it in its metrics.
            durability: native::Appended(native::DURABILITY_UNREPORTED),
        },
        refused,
    }
}

/// The Kafka error for a produced batch that could not be translated.
pub fn records_error(error: &RecordsError) -> i16 {
    match error {
        RecordsError::ControlBatch => errors::INVALID_RECORD,
        RecordsError::Stored(_) => errors::KAFKA_STORAGE_ERROR,
        RecordsError::Malformed(_) | RecordsError::Empty => errors::CORRUPT_MESSAGE,
    }
}

/// The native answer in Kafka's shape: a partition refused for some of its records names them
/// (`record_errors`, KIP-467) and why (`error_message`), so the client fails those records and
/// not the rest.
pub fn produce_response(native: native::ProduceResponse, refused: Vec<Refused>) -> ProduceResponse {
    let record_errors = native.record_errors.0;
    // One per partition answered, in answer order, or none at all.
    let log_append_times = &std::cell::RefCell::new(native.log_append_times.0.into_iter());
    let answered = native.topics.into_iter().flat_map(|topic| {
        let name = topic.name;
        let record_errors = &record_errors;
        topic.partitions.into_iter().map(move |partition| {
            let failed = partition.error != native::ErrorCode::None;
            let why = record_errors
                .iter()
                .find(|errors| errors.topic == name && errors.partition == partition.partition);
            (
                name.clone(),
                PartitionProduceResponse::default()
                    .with_index(partition.partition as i32)
                    .with_error_code(kafka_error(partition.error))
                    .with_base_offset(if failed {
                        -1
                    } else {
                        partition.base_offset as i64
                    })
                    .with_log_append_time_ms(log_append_times.borrow_mut().next().unwrap_or(-1))
                    .with_log_start_offset(if failed {
                        -1
                    } else {
                        partition.log_start_offset as i64
                    })
                    .with_record_errors(why.map_or_else(Vec::new, batch_index_errors))
                    .with_error_message(match (why, partition.error) {
                        (Some(why), _) => Some(crate::text(&why.message)),
                        // A conditional append refused: where the log ends, for the writer
                        // to read.
                        (None, native::ErrorCode::LogEndMismatch) => Some(crate::text(&format!(
                            "log end {}: not the {} expected",
                            partition.base_offset,
                            records::EXPECTED_OFFSET_HEADER
                        ))),
                        (None, _) => None,
                    }),
            )
        })
    });
    let refused = refused.into_iter().map(|refused| {
        (
            refused.topic,
            PartitionProduceResponse::default()
                .with_index(refused.partition)
                .with_error_code(refused.error)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1),
        )
    });
    ProduceResponse::default().with_responses(
        by_topic(answered.chain(refused))
            .into_iter()
            .map(|(name, partitions)| {
                TopicProduceResponse::default()
                    .with_name(topic_name(&name))
                    .with_partition_responses(partitions)
            })
            .collect(),
    )
}

/// Each record a partition's batch was refused for, by index, with why.
fn batch_index_errors(why: &native::RecordErrors) -> Vec<BatchIndexAndErrorMessage> {
    why.indices
        .iter()
        .map(|&index| {
            BatchIndexAndErrorMessage::default()
                .with_batch_index(index as i32)
                .with_batch_index_error_message(Some(crate::text(&why.message)))
        })
        .collect()
}

/// A fetch request for the broker, and the partitions refused on sight.
#[derive(Debug)]
pub struct Fetch {
    pub native: native::FetchRequest,
    pub refused: Vec<Refused>,
    /// Partitions asked by a topic id no topic has (Fetch 13 and later), answered
    /// UNKNOWN_TOPIC_ID.
    pub unknown_ids: Vec<(uuid::Uuid, Vec<i32>)>,
}

/// Translates a fetch request, or refuses it whole with a top-level Kafka error (a request
/// naming a fetch session: this listener makes none, so every fetch is a full one). From
/// version 13 topics are asked by id: `topic_named` gives the name of the topic of an id.
pub fn fetch_request(
    request: &FetchRequest,
    topic_named: impl Fn(uuid::Uuid) -> Option<String>,
) -> Result<Fetch, i16> {
    if request.session_id != 0 {
        return Err(FETCH_SESSION_ID_NOT_FOUND);
    }
    let mut refused = Vec::new();
    let mut unknown_ids = Vec::new();
    let mut topics = Vec::new();
    for topic in &request.topics {
        let name = if topic.topic_id.is_nil() {
            topic.topic.0.to_string()
        } else {
            match topic_named(topic.topic_id) {
                Some(name) => name,
                None => {
                    let partitions = topic.partitions.iter().map(|p| p.partition).collect();
                    unknown_ids.push((topic.topic_id, partitions));
                    continue;
                }
            }
        };
        let mut partitions = Vec::new();
        for partition in &topic.partitions {
            match (
                u32::try_from(partition.partition),
                u64::try_from(partition.fetch_offset),
            ) {
                (Ok(index), Ok(offset)) => partitions.push(native::FetchPartition {
                    partition: index,
                    fetch_offset: offset,
                    max_bytes: partition.partition_max_bytes.max(0) as u32,
                }),
                (index, _) => refused.push(Refused {
                    topic: name.clone(),
                    partition: partition.partition,
                    error: if index.is_err() {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    } else {
                        errors::OFFSET_OUT_OF_RANGE
                    },
                }),
            }
        }
        if !partitions.is_empty() {
            topics.push(native::FetchTopic { name, partitions });
        }
    }
    Ok(Fetch {
        native: native::FetchRequest {
            max_wait_ms: request.max_wait_ms.max(0) as u32,
            min_bytes: request.min_bytes.max(0) as u32,
            max_bytes: request.max_bytes.max(0) as u32,
            topics,
            read_committed: native::Appended(request.isolation_level == 1),
        },
        refused,
        unknown_ids,
    })
}

/// The native answer with each partition's batches as Kafka record batches. The records must
/// be in memory (`Records::Shared` or `Mutable`): the listener reads file ranges first.
/// A `read_committed` fetch's partitions get their last stable offset and the aborted
/// transactions the client drops records of.
///
/// Records elsewhere (a file range of Kafka batches only, sent with `sendfile`) stay there:
/// they come back beside the response, to be written where their partition's records go
/// ([`crate::frame::encode_fetch_parts`]).
/// Each topic is named and identified (`topic_id_of`): the version encoded takes one.
pub fn fetch_response(
    mut native: native::FetchResponse,
    refused: Vec<Refused>,
    unknown_ids: Vec<(uuid::Uuid, Vec<i32>)>,
    topic_id_of: impl Fn(&str) -> uuid::Uuid,
) -> (FetchResponse, crate::frame::RecordsElsewhere) {
    let mut elsewhere = Vec::new();
    for topic in &mut native.topics {
        for partition in &mut topic.partitions {
            if let native::Records::Elsewhere(source) = &partition.records {
                elsewhere.push((
                    topic.name.clone(),
                    partition.partition as i32,
                    source.clone(),
                ));
                partition.records = native::Records::empty();
            }
        }
    }
    let mut stability: std::collections::HashMap<(String, u32), native::PartitionStability> =
        native
            .stability
            .0
            .into_iter()
            .map(|stable| ((stable.topic.clone(), stable.partition), stable))
            .collect();
    let answered = native.topics.into_iter().flat_map(|topic| {
        let name = topic.name;
        let stability = topic
            .partitions
            .iter()
            .map(|partition| stability.remove(&(name.clone(), partition.partition)))
            .collect::<Vec<_>>();
        topic
            .partitions
            .into_iter()
            .zip(stability)
            .map(move |(partition, stable)| {
                let mut error = kafka_error(partition.error);
                let mut records = Bytes::new();
                if error == errors::NONE {
                    match records::to_kafka(partition.records.freeze()) {
                        Ok(kafka) => records = kafka,
                        Err(failed) => error = records_error(&failed),
                    }
                }
                let mut answer = fetched(partition.partition as i32, error, records)
                    .with_high_watermark(partition.high_watermark as i64)
                    .with_last_stable_offset(partition.high_watermark as i64)
                    .with_log_start_offset(partition.log_start_offset as i64);
                if let Some(stable) = stable {
                    answer.last_stable_offset = stable.last_stable_offset as i64;
                    answer.aborted_transactions = Some(
                        stable
                            .aborted
                            .into_iter()
                            .map(|txn| {
                                AbortedTransaction::default()
                                    .with_producer_id(ProducerId(txn.producer_id))
                                    .with_first_offset(txn.first_offset as i64)
                            })
                            .collect(),
                    );
                }
                (name.clone(), answer)
            })
    });
    let refused = refused.into_iter().map(|refused| {
        (
            refused.topic,
            fetched(refused.partition, refused.error, Bytes::new()),
        )
    });
    let unknown = unknown_ids.into_iter().map(|(id, partitions)| {
        FetchableTopicResponse::default()
            .with_topic_id(id)
            .with_partitions(
                partitions
                    .into_iter()
                    .map(|partition| fetched(partition, errors::UNKNOWN_TOPIC_ID, Bytes::new()))
                    .collect(),
            )
    });
    let response = FetchResponse::default().with_responses(
        by_topic(answered.chain(refused))
            .into_iter()
            .map(|(name, partitions)| {
                FetchableTopicResponse::default()
                    .with_topic_id(topic_id_of(&name))
                    .with_topic(topic_name(&name))
                    .with_partitions(partitions)
            })
            .chain(unknown)
            .collect(),
    );
    (response, elsewhere)
}

/// Whether a partition's error sends the client to another leader (KIP-951 answers it with
/// that leader).
fn leader_moved(error: i16) -> bool {
    error == errors::NOT_LEADER_OR_FOLLOWER || error == errors::FENCED_LEADER_EPOCH
}

/// The endpoints among `brokers` of the leaders `ids`, as KIP-951 answers them.
fn leader_endpoints(
    brokers: &[KafkaBroker],
    ids: &[i32],
) -> Vec<(i32, String, i32, Option<String>)> {
    brokers
        .iter()
        .filter(|broker| ids.contains(&broker.node_id))
        .map(|broker| {
            let port = i32::from(broker.port);
            (
                broker.node_id,
                broker.host.clone(),
                port,
                broker.rack.clone(),
            )
        })
        .collect()
}

/// One leader-hints function per answer: kafka-protocol's Fetch and Produce answers have
/// distinct types of the same shape.
macro_rules! leader_hints {
    ($(#[$doc:meta])* $name:ident, $response:ty, $module:ident, $partitions:ident, $topic:ident, $index:ident) => {
        $(#[$doc])*
        pub fn $name(
            response: &mut $response,
            leader_of: impl Fn(&str, i32) -> Option<(i32, i32)>,
            brokers: &[KafkaBroker],
        ) {
            use kafka_protocol::messages::$module::{LeaderIdAndEpoch, NodeEndpoint};
            let mut leaders = Vec::new();
            for topic in &mut response.responses {
                for partition in &mut topic.$partitions {
                    if !leader_moved(partition.error_code) {
                        continue;
                    }
                    if let Some((leader, epoch)) = leader_of(topic.$topic.as_str(), partition.$index) {
                        partition.current_leader = LeaderIdAndEpoch::default()
                            .with_leader_id(BrokerId(leader))
                            .with_leader_epoch(epoch);
                        leaders.push(leader);
                    }
                }
            }
            response.node_endpoints = leader_endpoints(brokers, &leaders)
                .into_iter()
                .map(|(id, host, port, rack)| {
                    NodeEndpoint::default()
                        .with_node_id(BrokerId(id))
                        .with_host(crate::text(&host))
                        .with_port(port)
                        .with_rack(rack.map(|rack| crate::text(&rack)))
                })
                .collect();
        }
    };
}

leader_hints!(
    /// KIP-951 (Fetch 16 and later): each partition answered NOT_LEADER_OR_FOLLOWER or
    /// FENCED_LEADER_EPOCH carries its current leader and epoch (`leader_of`, by topic name and
    /// partition), and the answer the endpoints of those leaders among `brokers`, so the client
    /// goes there without asking for metadata first.
    fetch_leader_hints, FetchResponse, fetch_response, partitions, topic, partition_index
);
leader_hints!(
    /// [`fetch_leader_hints`] for Produce 10 and later.
    produce_leader_hints, ProduceResponse, produce_response, partition_responses, name, index
);

fn fetched(partition: i32, error: i16, records: Bytes) -> PartitionData {
    PartitionData::default()
        .with_partition_index(partition)
        .with_error_code(error)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(records))
}

/// A list-offsets request for the broker, and the partitions refused on sight.
#[derive(Debug)]
pub struct ListOffsets {
    pub native: native::ListOffsetsRequest,
    pub refused: Vec<Refused>,
}

/// Earliest (-2), latest (-1), by time, the record with the largest timestamp (-3), earliest
/// local (-4) and latest tiered (-5); other negative timestamps are INVALID_REQUEST.
pub fn list_offsets_request(request: &ListOffsetsRequest) -> ListOffsets {
    let mut refused = Vec::new();
    let mut topics = Vec::new();
    for topic in &request.topics {
        let name = topic.name.0.to_string();
        let mut partitions = Vec::new();
        for partition in &topic.partitions {
            let timestamp = partition.timestamp;
            match u32::try_from(partition.partition_index) {
                Ok(index) if timestamp >= native::LATEST_TIERED_TIMESTAMP => {
                    partitions.push(native::ListOffsetsPartition {
                        partition: index,
                        timestamp,
                    })
                }
                index => refused.push(Refused {
                    topic: name.clone(),
                    partition: partition.partition_index,
                    error: if index.is_err() {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    } else {
                        errors::INVALID_REQUEST
                    },
                }),
            }
        }
        if !partitions.is_empty() {
            topics.push(native::ListOffsetsTopic { name, partitions });
        }
    }
    ListOffsets {
        native: native::ListOffsetsRequest {
            topics,
            read_committed: native::Appended(request.isolation_level == 1),
        },
        refused,
    }
}

/// `leader_epoch` gives the leader epoch of the record at an answered offset (-1 unknown).
pub fn list_offsets_response(
    native: native::ListOffsetsResponse,
    refused: Vec<Refused>,
    leader_epoch: impl Fn(&str, u32, i64) -> i32,
) -> ListOffsetsResponse {
    let answered = native.topics.into_iter().flat_map(|topic| {
        let name = topic.name;
        topic
            .partitions
            .into_iter()
            .map(|partition| {
                let epoch = match partition.offset {
                    offset if offset >= 0 => leader_epoch(&name, partition.partition, offset),
                    _ => -1,
                };
                (
                    name.clone(),
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(partition.partition as i32)
                        .with_error_code(kafka_error(partition.error))
                        .with_timestamp(partition.timestamp)
                        .with_offset(partition.offset)
                        .with_leader_epoch(epoch),
                )
            })
            .collect::<Vec<_>>()
    });
    let refused = refused.into_iter().map(|refused| {
        (
            refused.topic,
            ListOffsetsPartitionResponse::default()
                .with_partition_index(refused.partition)
                .with_error_code(refused.error)
                .with_timestamp(-1)
                .with_offset(-1)
                .with_leader_epoch(-1),
        )
    });
    ListOffsetsResponse::default().with_topics(
        by_topic(answered.chain(refused))
            .into_iter()
            .map(|(name, partitions)| {
                ListOffsetsTopicResponse::default()
                    .with_name(topic_name(&name))
                    .with_partitions(partitions)
            })
            .collect(),
    )
}

/// An idempotent producer's id (Kafka's `enable.idempotence`), or a transactional one's (its
/// `transactional.id` and `transaction.timeout.ms`), answered by the id's coordinator.
pub fn init_producer_id_request(
    request: &InitProducerIdRequest,
) -> Result<native::InitProducerIdRequest, i16> {
    let transactional = request
        .transactional_id
        .as_ref()
        .filter(|id| !id.0.is_empty())
        .map(|id| native::TransactionalInit {
            transactional_id: id.0.to_string(),
            timeout_ms: request.transaction_timeout_ms.max(0) as u32,
        });
    Ok(native::InitProducerIdRequest {
        producer_id: request.producer_id.0,
        producer_epoch: request.producer_epoch,
        transactional: native::Appended(transactional),
    })
}

pub fn init_producer_id_response(
    native: Result<native::InitProducerIdResponse, i16>,
) -> InitProducerIdResponse {
    match native {
        Ok(native) => InitProducerIdResponse::default()
            .with_error_code(kafka_error(native.error))
            .with_producer_id(ProducerId(native.producer_id))
            .with_producer_epoch(native.producer_epoch),
        Err(error) => InitProducerIdResponse::default()
            .with_error_code(error)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

#[cfg(test)]
mod tests;
