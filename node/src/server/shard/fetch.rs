//! Fetch: reads up to the high watermark (`read_committed`: the last stable offset) from this
//! shard's partitions (others' forwarded), long polls until there is data or the wait is over,
//! and the answer cut to the request's byte limit. The shard counts the records it serves.

use std::rc::Rc;
use std::time::Instant;

use strata_wire::protocol::{
    AbortedTransaction, Appended, Elsewhere, ErrorCode, FetchPartition, FetchPartitionResponse,
    FetchRequest, FetchResponse, FetchTopicResponse, PartitionStability, Records,
};
use tokio::sync::oneshot;

use crate::log::{Served, writer};
use crate::server::messages::{Delivery, Fetched, ServedRecords, ShardMessage};

use super::{Shard, log_error_code};

impl Shard {
    /// A fetch of many partitions, here and on other shards, with its records as `delivery` asks.
    pub(in crate::server) async fn fetch(
        self: &Rc<Self>,
        request: FetchRequest,
        delivery: Delivery,
    ) -> FetchResponse {
        let deadline =
            self.clock().now() + std::time::Duration::from_millis(u64::from(request.max_wait_ms));
        let min_bytes = request.min_bytes as usize;
        // One pass that does not wait; if it found less than min_bytes, wait on every empty
        // partition until the first one has data or the deadline passes.
        let first = self.fetch_all(&request, None, delivery).await;
        let found: usize = first
            .iter()
            .flat_map(|(_, partitions)| partitions.iter().map(|p| p.response.records.len()))
            .sum();
        if found >= min_bytes.max(1) || request.max_wait_ms == 0 {
            return self.answer_within(first, request.max_bytes);
        }
        let waited = self.fetch_all(&request, Some(deadline), delivery).await;
        self.answer_within(waited, request.max_bytes)
    }

    /// The answer to a fetch, held to its `max_bytes` as Kafka holds one to `fetch.max.bytes`,
    /// with the served records counted in the metrics. The partitions were read at once, each
    /// up to its own limit (on this shard and others); here they are taken in request order,
    /// each whole while the total stays within `max_bytes`. The first partition with records is
    /// always taken, so a batch larger than the limit still makes progress. Those that no
    /// longer fit answer without records and come with a later fetch from the same offset (a
    /// file range left out is never read). Without this, a consumer of hundreds of partitions
    /// with a backlog got hundreds of times the partition limit in one answer, past what
    /// clients take in one frame (librdkafka's `receive.message.max.bytes`: 100 MB).
    pub(super) fn answer_within(
        &self,
        slots: Vec<(String, Vec<Fetched>)>,
        max_bytes: u32,
    ) -> FetchResponse {
        let mut left = max_bytes as usize;
        let mut first = true;
        let mut topics = Vec::with_capacity(slots.len());
        let mut stability = Vec::new();
        for (name, fetched) in slots {
            let mut partitions = Vec::with_capacity(fetched.len());
            for Fetched {
                mut response,
                served,
                stability: stable,
            } in fetched
            {
                if let Some((last_stable_offset, aborted)) = stable {
                    stability.push(PartitionStability {
                        topic: name.clone(),
                        partition: response.partition,
                        last_stable_offset,
                        aborted,
                    });
                }
                let len = response.records.len();
                if len > 0 && !first && len > left {
                    response.records = Records::empty();
                } else if len > 0 {
                    first = false;
                    left = left.saturating_sub(len);
                    if let Some(served) = served {
                        self.count_served(&name, len, &served);
                    }
                }
                partitions.push(response);
            }
            topics.push(FetchTopicResponse { name, partitions });
        }
        FetchResponse {
            topics,
            stability: Appended(stability),
        }
    }

    pub(super) fn count_served(&self, topic: &str, bytes: usize, served: &ServedRecords) {
        self.metrics.fetched(
            topic,
            served.records,
            bytes as u64,
            served.started.elapsed().as_micros() as u64,
        );
        if let Some(newest_ms) = served.newest_ms {
            let age_ms = self.clock().wall_ms().saturating_sub(newest_ms).max(0);
            self.metrics.served_age(age_ms as u64 * 1000);
        }
    }

    /// Fetches every partition of the request. With a deadline, returns as soon as any
    /// partition has data (the others answer empty).
    pub(super) async fn fetch_all(
        self: &Rc<Self>,
        request: &FetchRequest,
        deadline: Option<Instant>,
        delivery: Delivery,
    ) -> Vec<(String, Vec<Fetched>)> {
        let mut slots: Vec<(String, Vec<Fetched>)> = Vec::new();
        let mut work = Vec::new();
        let read_committed = request.read_committed.0;
        for topic in &request.topics {
            let mut partitions = Vec::new();
            for partition in &topic.partitions {
                partitions.push(fetch_error(partition.partition, ErrorCode::None, 0, 0).into());
                let at = (slots.len(), partitions.len() - 1);
                let shard = self.clone();
                let name = topic.name.clone();
                let partition = FetchPartition {
                    partition: partition.partition,
                    fetch_offset: partition.fetch_offset,
                    max_bytes: partition.max_bytes.min(request.max_bytes),
                };
                work.push(Box::pin(async move {
                    (
                        at,
                        shard
                            .fetch_partition(name, partition, deadline, delivery, read_committed)
                            .await,
                    )
                }));
            }
            slots.push((topic.name.clone(), partitions));
        }
        if deadline.is_none() {
            for ((topic, partition), response) in futures_util::future::join_all(work).await {
                slots[topic].1[partition] = response;
            }
            return slots;
        }
        while !work.is_empty() {
            let (((topic, partition), response), _, rest) =
                futures_util::future::select_all(work).await;
            let has_data =
                !response.response.records.is_empty() || response.response.error != ErrorCode::None;
            slots[topic].1[partition] = response;
            if has_data {
                break;
            }
            work = rest;
        }
        slots
    }

    pub(super) async fn fetch_partition(
        self: &Rc<Self>,
        topic: String,
        partition: FetchPartition,
        deadline: Option<Instant>,
        delivery: Delivery,
        read_committed: bool,
    ) -> Fetched {
        let index = partition.partition;
        match self.route(&topic, index) {
            Err(error) => FetchPartitionResponse {
                leader_hint: self.leader_hint(&topic, index, error),
                ..fetch_error(index, error, 0, 0)
            }
            .into(),
            Ok(owner) if owner == self.context.index => {
                self.fetch_local(&topic, partition, deadline, delivery, read_committed)
                    .await
            }
            Ok(owner) => {
                let (reply, answer) = oneshot::channel();
                let message = ShardMessage::Fetch {
                    topic,
                    partition,
                    deadline,
                    delivery,
                    read_committed,
                    reply,
                };
                if !self.forward(owner, message) {
                    return fetch_error(index, ErrorCode::NotReady, 0, 0).into();
                }
                answer
                    .await
                    .unwrap_or_else(|_| fetch_error(index, ErrorCode::NotReady, 0, 0).into())
            }
        }
    }

    /// The committed state of a partition this shard leads: its log, high watermark and the
    /// notifier that wakes on each advance.
    pub(super) fn leader_view(
        &self,
        topic: &str,
        partition: u32,
    ) -> Option<(writer::LogHandle, u64, Rc<tokio::sync::Notify>)> {
        let partitions = self.partitions.borrow();
        let partition = partitions.get(&(topic.to_string(), partition))?;
        let high_watermark = partition.leader_high_watermark()?;
        Some((
            partition.log.clone(),
            high_watermark,
            partition.committed.clone(),
        ))
    }

    /// Consumers see only committed records: below the high watermark (`read_committed`: below
    /// the last stable offset too). A fetch at that end long-polls until it moves.
    pub(super) async fn fetch_local(
        &self,
        topic: &str,
        partition: FetchPartition,
        deadline: Option<Instant>,
        delivery: Delivery,
        read_committed: bool,
    ) -> Fetched {
        let index = partition.partition;
        let started = self.clock().now();
        let offset = partition.fetch_offset;
        let (log, readable) = loop {
            let Some((log, high_watermark, committed)) = self.leader_view(topic, index) else {
                let error = self.not_serving(topic, index);
                return FetchPartitionResponse {
                    leader_hint: self.leader_hint(topic, index, error),
                    ..fetch_error(index, error, 0, 0)
                }
                .into();
            };
            // Registered before the log is asked: an advance while it answers still wakes us.
            let advanced = committed.notified();
            tokio::pin!(advanced);
            advanced.as_mut().enable();
            let Ok(offsets) = log.offsets().await else {
                return fetch_error(index, ErrorCode::StorageError, 0, 0).into();
            };
            let high_watermark = self
                .leader_view(topic, index)
                .map_or(high_watermark, |(_, now, _)| now);
            // A tiered partition starts where its remote tier does.
            let remote_start = match self.remote_start(topic, index) {
                Ok(start) => start,
                Err(error) if offset < offsets.log_start => {
                    return fetch_error(index, error, high_watermark, offsets.log_start).into();
                }
                Err(_) => None,
            };
            let readable = Readable {
                high_watermark,
                end: if read_committed {
                    offsets.last_stable(high_watermark)
                } else {
                    high_watermark
                },
                log_start: remote_start.map_or(offsets.log_start, |r| r.min(offsets.log_start)),
            };
            if offset < readable.log_start || offset > offsets.log_end {
                return fetch_error(
                    index,
                    ErrorCode::OffsetOutOfRange,
                    high_watermark,
                    readable.log_start,
                )
                .into();
            }
            if offset < offsets.log_start {
                let remote = RemoteFetch {
                    offset,
                    max_bytes: partition.max_bytes,
                    read_committed,
                    started,
                };
                return self.fetch_remote(topic, index, &readable, remote).await;
            }
            match deadline {
                Some(deadline) if offset >= readable.end => {
                    if self.clock().timeout_at(deadline, advanced).await.is_none() {
                        break (log, readable);
                    }
                }
                _ => break (log, readable),
            }
        };
        let stability =
            |readable: &Readable, aborted| read_committed.then_some((readable.end, aborted));
        if offset >= readable.end {
            return Fetched {
                stability: stability(&readable, Vec::new()),
                ..fetch_error(
                    index,
                    ErrorCode::None,
                    readable.high_watermark,
                    readable.log_start,
                )
                .into()
            };
        }
        let max_bytes = partition.max_bytes as usize;
        let read = match delivery {
            Delivery::FileRanges => log.read_for_sending(offset, max_bytes, readable.end).await,
            Delivery::Bytes => log
                .read(offset, max_bytes, readable.end)
                .await
                .map(Served::Bytes),
        };
        let failed = |error: crate::log::LogError| -> Fetched {
            let code = log_error_code(&error);
            fetch_error(index, code, readable.high_watermark, readable.log_start).into()
        };
        let served = match read {
            Ok(served) => served,
            Err(error) => return failed(error),
        };
        let aborted = if read_committed {
            match log.aborted_transactions(offset, readable.end).await {
                Ok(aborted) => aborted
                    .into_iter()
                    .map(|txn| AbortedTransaction {
                        producer_id: txn.producer_id,
                        first_offset: txn.first_offset,
                    })
                    .collect(),
                Err(error) => return failed(error),
            }
        } else {
            Vec::new()
        };
        let (records, newest_ms, bytes) = match served {
            Served::Bytes(bytes) => {
                let (records, newest_ms) = records_in(&bytes);
                (records, newest_ms, Records::Shared(bytes))
            }
            Served::Region(region) => (
                region.records,
                region.newest_ms,
                Records::Elsewhere(Elsewhere {
                    len: u32::try_from(region.len).expect("fetches below 4 GiB"),
                    source: std::sync::Arc::new(region),
                }),
            ),
        };
        readable.answer(
            index,
            bytes,
            ServedRecords {
                records,
                newest_ms,
                started,
            },
            stability(&readable, aborted),
        )
    }
}

impl Shard {
    /// A fetch below the local log start, from the remote tier.
    async fn fetch_remote(
        &self,
        topic: &str,
        index: u32,
        readable: &Readable,
        remote: RemoteFetch,
    ) -> Fetched {
        let RemoteFetch {
            offset,
            max_bytes,
            read_committed,
            started,
        } = remote;
        let read = self
            .remote_read(topic, index, offset, readable.end, max_bytes as usize)
            .await;
        let batches = match read {
            Some(Ok(batches)) => batches,
            Some(Err(error)) => {
                tracing::warn!(%topic, partition = index, offset, "remote read failed: {error}");
                return fetch_error(
                    index,
                    ErrorCode::StorageError,
                    readable.high_watermark,
                    readable.log_start,
                )
                .into();
            }
            // Deleted from the remote tier since the fetch looked.
            None => {
                return fetch_error(
                    index,
                    ErrorCode::OffsetOutOfRange,
                    readable.high_watermark,
                    readable.log_start,
                )
                .into();
            }
        };
        let bytes = batches.bytes;
        let (records, newest_ms) = records_in(&bytes);
        // The segment's own aborted transactions, uploaded beside it.
        let stability = read_committed.then(|| {
            let aborted = batches
                .aborted
                .iter()
                .map(|&(producer_id, first_offset)| AbortedTransaction {
                    producer_id,
                    first_offset,
                })
                .collect();
            (readable.end, aborted)
        });
        readable.answer(
            index,
            Records::Shared(bytes),
            ServedRecords {
                records,
                newest_ms,
                started,
            },
            stability,
        )
    }
}

/// A fetch below the local log start.
struct RemoteFetch {
    offset: u64,
    max_bytes: u32,
    read_committed: bool,
    started: Instant,
}

/// How far a fetch may read a partition, as it stood when the fetch looked.
struct Readable {
    high_watermark: u64,
    /// The high watermark, or for `read_committed` the last stable offset.
    end: u64,
    log_start: u64,
}

impl Readable {
    /// A partition's answer with records.
    fn answer(
        &self,
        partition: u32,
        records: Records,
        served: ServedRecords,
        stability: Option<(u64, Vec<AbortedTransaction>)>,
    ) -> Fetched {
        Fetched {
            response: FetchPartitionResponse {
                partition,
                error: ErrorCode::None,
                high_watermark: self.high_watermark,
                log_start_offset: self.log_start,
                leader_hint: -1,
                records,
            },
            served: Some(served),
            stability,
        }
    }
}

/// Records in whole stored batches and the newest record's timestamp, from their headers (for
/// metrics: no body is read).
pub(super) fn records_in(batches: &[u8]) -> (u64, Option<i64>) {
    let (mut records, mut newest_ms) = (0u64, None);
    let mut at = 0;
    while let Some(rest) = batches.get(at..).filter(|rest| !rest.is_empty()) {
        let Ok(header) = strata_wire::batch::BatchHeader::parse(rest) else {
            break;
        };
        records += u64::from(header.offset_count);
        newest_ms = newest_ms.max(Some(header.max_timestamp_ms));
        at += header.batch_len as usize;
    }
    (records, newest_ms)
}

pub(super) fn fetch_error(
    partition: u32,
    error: ErrorCode,
    high_watermark: u64,
    log_start_offset: u64,
) -> FetchPartitionResponse {
    FetchPartitionResponse {
        partition,
        error,
        high_watermark,
        log_start_offset,
        leader_hint: -1,
        records: Records::empty(),
    }
}

/// A file region's bytes, read from the page cache (where `read_for_sending` found every page
/// of it): a copy, not a wait on the disk. For records a region cannot carry as it lies (Strata
/// batches for a Kafka consumer, a compacted batch a share acquisition lists record by record).
pub(crate) fn read_cached_region(region: &crate::log::FileRegion) -> std::io::Result<bytes::Bytes> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::from(region.file.try_clone()?);
    let mut bytes = vec![0; region.len];
    file.read_exact_at(&mut bytes, region.position)?;
    Ok(bytes.into())
}
