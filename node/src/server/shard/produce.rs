//! Produce: a request's partitions appended where they live (this shard or, forwarded, its
//! owner), each answered once its acks level is met.

use std::rc::Rc;

use bytes::BytesMut;
use strata_wire::batch::BatchError;
use strata_wire::protocol::{
    ACKS_ALL, AckDurability, Appended, DURABILITY_REPORTED, DURABILITY_SYNCED,
    DURABILITY_UNREPORTED, ErrorCode, ProducePartitionResponse, ProduceRequest, ProduceResponse,
    ProduceTopicResponse, RecordErrors,
};
use tokio::sync::oneshot;

use super::replica::Role;
use crate::log::writer::AnswerWhen;
use crate::log::{AppendSource, LogError};
use crate::server::messages::{AckTerms, PartitionProduced, ShardMessage};

use super::replica;
use super::{Shard, log_error_code};

impl Shard {
    pub(super) async fn produce(self: &Rc<Self>, request: ProduceRequest) -> ProduceResponse {
        let reported = request.durability.0;
        let answer = match reported {
            DURABILITY_UNREPORTED | DURABILITY_REPORTED => AnswerWhen::FlushPolicy,
            DURABILITY_SYNCED => AnswerWhen::Synced,
            _ => return refuse_produce(request, ErrorCode::InvalidRequest),
        };
        let terms = AckTerms {
            acks: request.acks,
            timeout_ms: request.timeout_ms,
            answer,
        };
        let mut topics = Vec::with_capacity(request.topics.len());
        let mut record_errors = Vec::new();
        let mut durability = Vec::new();
        let mut log_append_times = Vec::new();
        // Conditional appends: one expected offset per partition, in request order.
        let mut expected = request.expected_offsets.0.into_iter();
        for topic in request.topics {
            let name = topic.name;
            let work = topic.partitions.into_iter().map(|partition| {
                let source = match expected.next().map(u64::try_from) {
                    Some(Ok(offset)) => AppendSource::ProducerAt(offset),
                    _ => AppendSource::Producer,
                };
                let shard = self.clone();
                let name = name.clone();
                async move {
                    let index = partition.partition;
                    let records = partition.records.into_mut();
                    match shard.route(&name, index) {
                        Err(error) => ProducePartitionResponse {
                            leader_hint: shard.leader_hint(&name, index, error),
                            ..produce_error(index, error)
                        }
                        .into(),
                        Ok(owner) if owner == shard.context.index => {
                            shard
                                .produce_local(&name, index, records, terms, source)
                                .await
                        }
                        Ok(owner) => {
                            let (reply, answer) = oneshot::channel();
                            let message = ShardMessage::Produce {
                                topic: name,
                                partition: index,
                                records,
                                terms,
                                source,
                                reply,
                            };
                            if !shard.forward(owner, message) {
                                return produce_error(index, ErrorCode::NotReady).into();
                            }
                            answer.await.unwrap_or_else(|_| {
                                produce_error(index, ErrorCode::NotReady).into()
                            })
                        }
                    }
                }
            });
            let mut partitions = Vec::new();
            for produced in futures_util::future::join_all(work).await {
                partitions.push(produced.response);
                record_errors.extend(produced.record_errors);
                if reported != DURABILITY_UNREPORTED {
                    durability.push(produced.durability);
                }
                log_append_times.push(produced.log_append_time_ms);
            }
            topics.push(ProduceTopicResponse { name, partitions });
        }
        if log_append_times.iter().all(|time| *time < 0) {
            log_append_times.clear();
        }
        ProduceResponse {
            topics,
            record_errors: Appended(record_errors),
            durability: Appended(durability),
            log_append_times: Appended(log_append_times),
        }
    }

    /// Appends to a partition this shard leads and answers per `acks`: with 1 (or 0) once the
    /// append is as durable as the flush policy says (or synced, when the terms ask), with
    /// `all` once the high watermark passes it (every in-sync replica has it) and the ISR is at
    /// least `min.insync.replicas`. The answer says how far the records had got.
    /// `source`: a producer's records, or a transaction marker this broker built.
    pub(super) async fn produce_local(
        &self,
        topic: &str,
        partition: u32,
        records: BytesMut,
        terms: AckTerms,
        source: AppendSource,
    ) -> PartitionProduced {
        let AckTerms {
            acks, timeout_ms, ..
        } = terms;
        let key = (topic.to_string(), partition);
        let Some((log, leader_epoch, max_message_bytes)) = self.leader_log(topic, partition) else {
            let error = self.not_serving(topic, partition);
            return ProducePartitionResponse {
                leader_hint: self.leader_hint(topic, partition, error),
                ..produce_error(partition, error)
            }
            .into();
        };
        if records.len() > max_message_bytes {
            self.metrics.produce_failed(topic);
            return produce_error(partition, ErrorCode::MessageTooLarge).into();
        }
        if acks == ACKS_ALL {
            let partitions = self.partitions.borrow();
            if let Some(Role::Leader(leader)) = partitions.get(&key).map(|p| &p.role)
                && let Err(error) = leader.check_acks_all()
            {
                drop(partitions);
                self.metrics.produce_failed(topic);
                return produce_error(partition, replica::ack_error_code(error)).into();
            }
        }
        let started = self.clock().now();
        let appended = log
            .append_from(records, leader_epoch, source, terms.answer)
            .await;
        let info = match appended {
            Ok(info) => info,
            Err(error) => {
                self.metrics.produce_failed(topic);
                if !matches!(
                    error,
                    LogError::CorruptBatch { .. }
                        | LogError::StaleEpoch { .. }
                        | LogError::InvalidProducerBatch(_)
                        | LogError::Producer(_)
                        | LogError::LogEndMismatch { .. }
                ) {
                    tracing::warn!(%topic, partition, "produce failed: {error}");
                } else {
                    // The client's doing, and answered with a typed code: not worth a warning.
                    tracing::debug!(%topic, partition, "produce refused: {error}");
                }
                let record_errors = match &error {
                    LogError::CorruptBatch {
                        source: BatchError::MissingKeys { indices },
                        ..
                    } => Some(RecordErrors {
                        topic: topic.to_string(),
                        partition,
                        indices: indices.clone(),
                        message: error.to_string(),
                    }),
                    _ => None,
                };
                let mut response = produce_error(partition, log_error_code(&error));
                if let LogError::LogEndMismatch { log_end, .. } = error {
                    // Where the records would have gone: the writer that lost learns it here.
                    response.base_offset = log_end;
                }
                return PartitionProduced {
                    response,
                    record_errors,
                    durability: AckDurability::default(),
                    log_append_time_ms: -1,
                };
            }
        };
        // The leader's own progress (the high watermark counts it), and the commit to wait for.
        let committed = {
            let mut partitions = self.partitions.borrow_mut();
            match partitions.get_mut(&key) {
                Some(partition_state) if partition_state.is_leader_at(leader_epoch) => {
                    let Role::Leader(leader) = &mut partition_state.role else {
                        unreachable!("checked: leads at this epoch")
                    };
                    let before = leader.high_watermark();
                    leader.handle_appended(leader.log_end().max(info.last_offset + 1));
                    leader.record_append_time(info.last_offset + 1, self.clock().monotonic_us());
                    let waiter = (acks == ACKS_ALL).then(|| {
                        let (waiter, answer) = oneshot::channel();
                        leader.wait_for_commit(info.last_offset, waiter);
                        answer
                    });
                    partition_state.settle(before);
                    waiter
                }
                // Leadership moved while the append ran: acks=all cannot be promised.
                _ if acks == ACKS_ALL => {
                    return produce_error(partition, ErrorCode::NotLeader).into();
                }
                _ => None,
            }
        };
        if let Some(answer) = committed {
            let timeout = std::time::Duration::from_millis(u64::from(timeout_ms.max(1)));
            let outcome = match self.clock().timeout(timeout, answer).await {
                Some(Ok(outcome)) => outcome.map_err(replica::ack_error_code),
                Some(Err(_)) => Err(ErrorCode::NotLeader),
                None => Err(ErrorCode::RequestTimedOut),
            };
            if let Err(error) = outcome {
                self.metrics.produce_failed(topic);
                return produce_error(partition, error).into();
            }
        }
        self.metrics.produced(
            topic,
            info.last_offset - info.base_offset + 1,
            info.bytes,
            started.elapsed().as_micros() as u64,
        );
        let durability = self.durability_of(&key, info.last_offset + 1, log.synced_offset());
        if source != AppendSource::Markers {
            // Producers' acknowledgements only: a coordinator's markers are not one.
            self.metrics.acknowledged(topic, &durability);
        }
        PartitionProduced {
            response: ProducePartitionResponse {
                partition,
                error: ErrorCode::None,
                base_offset: info.base_offset,
                log_start_offset: 0,
                leader_hint: -1,
            },
            record_errors: None,
            durability,
            log_append_time_ms: info.log_append_time_ms.unwrap_or(-1),
        }
    }

    /// How far the records below `end` of a partition this shard leads have got, now: the
    /// leader's `synced_offset`, and the in-sync replicas holding and syncing them.
    fn durability_of(&self, key: &(String, u32), end: u64, synced_offset: u64) -> AckDurability {
        let leader_synced = synced_offset >= end;
        let partitions = self.partitions.borrow();
        let (replicas, synced_replicas) = match partitions.get(key).map(|p| &p.role) {
            Some(Role::Leader(leader)) => leader.durability(end, leader_synced),
            // Leadership moved after an acks=1 append: only this copy is known.
            _ => (1, u16::from(leader_synced)),
        };
        AckDurability {
            replicas,
            synced_replicas,
            leader_synced,
            leader_synced_offset: synced_offset,
        }
    }
}

/// Test hook for lost acknowledgements, off unless `STRATA_FAULT_PRODUCE_RESPONSE` is set:
/// `drop:N` drops the Nth produce response this process would send (counted from 1: the write
/// happened, its answer never comes), `exit:N` aborts the process instead of sending it,
/// `panic:N` panics in the request's handler instead. Idempotence tests use it to make
/// producers retry writes the broker already has; the panic shows how a handler's bug is
/// answered.
pub(super) fn produce_response_lost() -> bool {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static FAULT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static RESPONSES: AtomicU64 = AtomicU64::new(0);
    let fault = FAULT.get_or_init(|| {
        let spec = std::env::var("STRATA_FAULT_PRODUCE_RESPONSE").ok()?;
        let (kind, count) = spec.split_once(':')?;
        let count = count.parse().ok()?;
        tracing::warn!(%spec, "fault injection: a produce response will be lost");
        Some((kind.to_string(), count))
    });
    let Some((kind, nth)) = fault else {
        return false;
    };
    if RESPONSES.fetch_add(1, Ordering::Relaxed) + 1 != *nth {
        return false;
    }
    match kind.as_str() {
        "exit" => {
            tracing::error!("fault injection: aborting instead of answering produce #{nth}");
            std::process::abort();
        }
        "panic" => panic!("fault injection: panicking instead of answering produce #{nth}"),
        _ => {
            tracing::warn!("fault injection: dropping the answer to produce #{nth}");
            true
        }
    }
}

/// Every partition of `request` refused with `error`, nothing written.
fn refuse_produce(request: ProduceRequest, error: ErrorCode) -> ProduceResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|topic| ProduceTopicResponse {
            partitions: topic
                .partitions
                .iter()
                .map(|p| produce_error(p.partition, error))
                .collect(),
            name: topic.name,
        })
        .collect();
    ProduceResponse {
        topics,
        record_errors: Appended(Vec::new()),
        durability: Appended(Vec::new()),
        log_append_times: Appended(Vec::new()),
    }
}

pub(super) fn produce_error(partition: u32, error: ErrorCode) -> ProducePartitionResponse {
    ProducePartitionResponse {
        partition,
        error,
        base_offset: 0,
        log_start_offset: 0,
        leader_hint: -1,
    }
}
