//! Kafka's transaction APIs on the Kafka listener (KIP-98): AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn and TxnOffsetCommit, and the operators' DescribeTransactions and
//! ListTransactions (KIP-664), each checked against the client's ACLs as
//! Kafka checks it and run as the native request of the same name by the group thread, where
//! the transaction coordinator is (`server/groups/transactions.rs`).

use std::rc::Rc;

use strata_auth::acl::Operation;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use strata_kafka::kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use strata_kafka::kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    TopicName, TransactionalId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use strata_kafka::text;
use strata_wire::protocol::{self as native, Request, Response};

use super::encoded;
use super::{authorize, native};
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::shard::Shard;
use strata_kafka::frame::{Header, KafkaRequest};
use strata_kafka::translate;

/// Kafka's OPERATION_NOT_ATTEMPTED: the partitions of a request refused for others' sake.
const OPERATION_NOT_ATTEMPTED: i16 = 55;

fn txn_producer(
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
) -> native::TxnProducer {
    native::TxnProducer {
        transactional_id: transactional_id.to_string(),
        producer_id,
        producer_epoch,
    }
}

/// The error of a transaction request run by the group thread.
async fn run(shard: &Rc<Shard>, request: Request) -> i16 {
    match native(shard, request).await {
        Ok(
            Response::AddPartitionsToTxn(answer)
            | Response::AddOffsetsToTxn(answer)
            | Response::EndTxn(answer)
            | Response::TxnOffsetCommit(answer),
        ) => kafka_error(answer.error),
        Ok(other) => {
            tracing::warn!(api = ?other.api_key(), "a transaction request got another answer");
            errors::UNKNOWN_SERVER_ERROR
        }
        Err(code) => kafka_error(code),
    }
}

/// AddPartitionsToTxn (versions 0-3, one transaction): Write on the transactional id and on
/// each topic; every partition gets the request's one outcome.
async fn add_partitions_to_txn(
    shard: &Rc<Shard>,
    client: &Client,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let id = request.v3_and_below_transactional_id.0.to_string();
    let denied_topic = |name: &str| !authorize::topic(shard, client, Operation::Write, name);
    let topic_errors: Vec<Option<i16>> =
        if !authorize::transactional_id(shard, client, Operation::Write, &id) {
            vec![
                Some(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
                request.v3_and_below_topics.len()
            ]
        } else if request
            .v3_and_below_topics
            .iter()
            .any(|topic| denied_topic(&topic.name.0))
        {
            request
                .v3_and_below_topics
                .iter()
                .map(|topic| {
                    Some(if denied_topic(&topic.name.0) {
                        errors::TOPIC_AUTHORIZATION_FAILED
                    } else {
                        OPERATION_NOT_ATTEMPTED
                    })
                })
                .collect()
        } else {
            vec![None; request.v3_and_below_topics.len()]
        };
    let error = if topic_errors.iter().all(Option::is_none) {
        let add = native::AddPartitionsToTxnRequest {
            producer: txn_producer(
                &id,
                request.v3_and_below_producer_id.0,
                request.v3_and_below_producer_epoch,
            ),
            topics: request
                .v3_and_below_topics
                .iter()
                .map(|topic| native::TopicPartitions {
                    topic: topic.name.0.to_string(),
                    partitions: topic
                        .partitions
                        .iter()
                        .filter_map(|&partition| u32::try_from(partition).ok())
                        .collect(),
                })
                .collect(),
        };
        run(shard, Request::AddPartitionsToTxn(add)).await
    } else {
        errors::NONE
    };
    let results = request
        .v3_and_below_topics
        .iter()
        .zip(topic_errors)
        .map(|(topic, refused)| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(topic.name.clone())
                .with_results_by_partition(
                    topic
                        .partitions
                        .iter()
                        .map(|&partition| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(partition)
                                .with_partition_error_code(refused.unwrap_or(error))
                        })
                        .collect(),
                )
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// AddOffsetsToTxn: Write on the transactional id, Read on the group.
async fn add_offsets_to_txn(
    shard: &Rc<Shard>,
    client: &Client,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let id = request.transactional_id.0.to_string();
    let error = if !authorize::transactional_id(shard, client, Operation::Write, &id) {
        errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else if !authorize::group(shard, client, Operation::Read, &request.group_id.0) {
        errors::GROUP_AUTHORIZATION_FAILED
    } else {
        let add = native::AddOffsetsToTxnRequest {
            producer: txn_producer(&id, request.producer_id.0, request.producer_epoch),
            group: request.group_id.0.to_string(),
        };
        run(shard, Request::AddOffsetsToTxn(add)).await
    };
    AddOffsetsToTxnResponse::default().with_error_code(error)
}

/// EndTxn: Write on the transactional id.
async fn end_txn(shard: &Rc<Shard>, client: &Client, request: EndTxnRequest) -> EndTxnResponse {
    let id = request.transactional_id.0.to_string();
    let error = if !authorize::transactional_id(shard, client, Operation::Write, &id) {
        errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else {
        let end = native::EndTxnRequest {
            producer: txn_producer(&id, request.producer_id.0, request.producer_epoch),
            commit: request.committed,
        };
        run(shard, Request::EndTxn(end)).await
    };
    EndTxnResponse::default().with_error_code(error)
}

/// TxnOffsetCommit: Write on the transactional id, then Read on the group and on each topic, as
/// an offset commit (Kafka's order); every partition gets the request's one outcome.
async fn txn_offset_commit(
    shard: &Rc<Shard>,
    client: &Client,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.0.to_string();
    let denied_topic = |name: &str| !authorize::topic(shard, client, Operation::Read, name);
    let id = &request.transactional_id.0;
    let refused = if !authorize::transactional_id(shard, client, Operation::Write, id) {
        Some(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    } else if !authorize::group(shard, client, Operation::Read, &group) {
        Some(errors::GROUP_AUTHORIZATION_FAILED)
    } else if request
        .topics
        .iter()
        .any(|topic| denied_topic(&topic.name.0))
    {
        Some(errors::TOPIC_AUTHORIZATION_FAILED)
    } else {
        None
    };
    let error = match refused {
        Some(error) => error,
        None => {
            let commit = native::TxnOffsetCommitRequest {
                producer: txn_producer(
                    &request.transactional_id.0,
                    request.producer_id.0,
                    request.producer_epoch,
                ),
                group,
                member_id: request.member_id.to_string(),
                generation: request.generation_id,
                topics: request
                    .topics
                    .iter()
                    .map(|topic| native::OffsetCommitTopic {
                        name: topic.name.0.to_string(),
                        partitions: topic
                            .partitions
                            .iter()
                            .filter_map(|partition| {
                                Some(native::OffsetCommitPartition {
                                    partition: u32::try_from(partition.partition_index).ok()?,
                                    offset: u64::try_from(partition.committed_offset).ok()?,
                                    metadata: partition
                                        .committed_metadata
                                        .as_ref()
                                        .map(ToString::to_string)
                                        .unwrap_or_default(),
                                })
                            })
                            .collect(),
                    })
                    .collect(),
            };
            run(shard, Request::TxnOffsetCommit(commit)).await
        }
    };
    TxnOffsetCommitResponse::default().with_topics(
        request
            .topics
            .iter()
            .map(|topic| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(topic.name.clone())
                    .with_partitions(
                        topic
                            .partitions
                            .iter()
                            .map(|partition| {
                                TxnOffsetCommitResponsePartition::default()
                                    .with_partition_index(partition.partition_index)
                                    .with_error_code(error)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// The states Kafka's ListTransactions filters by.
const STATES: [&str; 6] = [
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
];

/// DescribeTransactions, sent to each id's coordinator: the ids the client may Describe.
async fn describe_transactions(
    shard: &Rc<Shard>,
    client: &Client,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    use strata_kafka::kafka_protocol::messages::describe_transactions_response::{
        TopicData, TransactionState,
    };
    let ids: Vec<String> = request
        .transactional_ids
        .iter()
        .map(|id| id.0.to_string())
        .collect();
    let allowed: Vec<String> = ids
        .iter()
        .filter(|id| authorize::transactional_id(shard, client, Operation::Describe, id))
        .cloned()
        .collect();
    let described = match native(
        shard,
        Request::DescribeTransactions(native::DescribeTransactionsRequest {
            transactional_ids: allowed,
        }),
    )
    .await
    {
        Ok(Response::DescribeTransactions(described)) => Ok(described.transactions),
        Ok(_) => Err(errors::UNKNOWN_SERVER_ERROR),
        Err(code) => Err(kafka_error(code)),
    };
    let states = ids
        .into_iter()
        .map(|id| {
            let refused = |error: i16| {
                TransactionState::default()
                    .with_transactional_id(TransactionalId(text(&id)))
                    .with_error_code(error)
                    .with_transaction_state(text(""))
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1)
            };
            if !authorize::transactional_id(shard, client, Operation::Describe, &id) {
                return refused(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
            }
            let found = match &described {
                Err(error) => return refused(*error),
                Ok(described) => described.iter().find(|t| t.transactional_id == id),
            };
            let Some(found) = found.filter(|t| t.error == native::ErrorCode::None) else {
                return refused(
                    found.map_or(errors::UNKNOWN_SERVER_ERROR, |t| kafka_error(t.error)),
                );
            };
            refused(errors::NONE)
                .with_transaction_state(text(&found.state))
                .with_transaction_timeout_ms(i32::try_from(found.timeout_ms).unwrap_or(i32::MAX))
                .with_transaction_start_time_ms(found.started_ms)
                .with_producer_id(ProducerId(found.producer_id))
                .with_producer_epoch(found.producer_epoch)
                .with_topics(
                    found
                        .partitions
                        .iter()
                        .map(|topic| {
                            TopicData::default()
                                .with_topic(TopicName(text(&topic.topic)))
                                .with_partitions(
                                    topic.partitions.iter().map(|&p| p as i32).collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions, sent to every broker: the ids this one coordinates that the client may
/// Describe, by state and producer id.
async fn list_transactions(
    shard: &Rc<Shard>,
    client: &Client,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    use strata_kafka::kafka_protocol::messages::list_transactions_response::TransactionState;
    let asked: Vec<String> = request
        .state_filters
        .iter()
        .map(ToString::to_string)
        .collect();
    let unknown: Vec<_> = asked
        .iter()
        .filter(|state| !STATES.contains(&state.as_str()))
        .map(|state| text(state))
        .collect();
    // v2's pattern is RE2 syntax, as the coordinator reads it; a bad one is the client's.
    let id_pattern = request
        .transactional_id_pattern
        .as_ref()
        .map(|pattern| pattern.to_string())
        .filter(|pattern| !pattern.is_empty());
    if let Some(pattern) = &id_pattern
        && regex_automata::meta::Regex::new(&format!("^(?:{pattern})$")).is_err()
    {
        return ListTransactionsResponse::default()
            .with_error_code(errors::INVALID_REGULAR_EXPRESSION);
    }
    let list = native::ListTransactionsRequest {
        states: asked,
        producer_ids: request.producer_id_filters.iter().map(|id| id.0).collect(),
        // v1: below 0, every transaction.
        running_longer_than_ms: native::Appended(u64::try_from(request.duration_filter).ok()),
        id_pattern: native::Appended(id_pattern),
    };
    let (error, listed) = match native(shard, Request::ListTransactions(list)).await {
        Ok(Response::ListTransactions(listed)) => (kafka_error(listed.error), listed.transactions),
        Ok(_) => (errors::UNKNOWN_SERVER_ERROR, Vec::new()),
        Err(code) => (kafka_error(code), Vec::new()),
    };
    let states = listed
        .into_iter()
        .filter(|t| {
            authorize::transactional_id(shard, client, Operation::Describe, &t.transactional_id)
        })
        .map(|t| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(text(&t.transactional_id)))
                .with_producer_id(ProducerId(t.producer_id))
                .with_transaction_state(text(&t.state))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_error_code(error)
        .with_unknown_state_filters(unknown)
        .with_transaction_states(states)
}

/// Answers a transaction API request (InitProducerId included: it starts one).
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::InitProducerId(request) => {
            init_producer_id(shard, client, header, request).await
        }
        KafkaRequest::AddPartitionsToTxn(request) => {
            encoded(&header, add_partitions_to_txn(shard, client, request).await)
        }
        KafkaRequest::AddOffsetsToTxn(request) => {
            encoded(&header, add_offsets_to_txn(shard, client, request).await)
        }
        KafkaRequest::EndTxn(request) => encoded(&header, end_txn(shard, client, request).await),
        KafkaRequest::TxnOffsetCommit(request) => {
            encoded(&header, txn_offset_commit(shard, client, request).await)
        }
        KafkaRequest::DescribeTransactions(request) => {
            encoded(&header, describe_transactions(shard, client, request).await)
        }
        KafkaRequest::ListTransactions(request) => {
            encoded(&header, list_transactions(shard, client, request).await)
        }
        _ => unreachable!("only the transaction APIs come here"),
    }
}

/// InitProducerId: an idempotent producer's id, for a client allowed to write idempotently.
async fn init_producer_id(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: strata_kafka::kafka_protocol::messages::InitProducerIdRequest,
) -> Outcome {
    let answered = match translate::init_producer_id_request(&request) {
        Err(error) => Err(error),
        Ok(request)
            if request.transactional.0.as_ref().is_some_and(|txn| {
                !authorize::transactional_id(shard, client, Operation::Write, &txn.transactional_id)
            }) =>
        {
            Err(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        }
        Ok(request)
            if request.transactional.0.is_none() && !client.may_write_idempotently(shard) =>
        {
            Err(errors::CLUSTER_AUTHORIZATION_FAILED)
        }
        Ok(request) => match native(shard, Request::InitProducerId(request)).await {
            Ok(Response::InitProducerId(native)) => Ok(native),
            Err(code) => Err(errors::kafka_error(code)),
            Ok(other) => {
                tracing::warn!(?other, "init-producer-id got another answer");
                Err(errors::UNKNOWN_SERVER_ERROR)
            }
        },
    };
    encoded(&header, translate::init_producer_id_response(answered))
}
