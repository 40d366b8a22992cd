//! Share groups on the partition leader: the shard that owns a partition holds each share
//! group's [`SharePartition`] of it, loaded from the group store on first use and claimed
//! there under the leader's epoch, and stores it before an acknowledgement is answered.
//!
//! One share-partition's operations take turns (a mutex of this shard's, never held across a
//! long poll): an acquisition reads the log from where the window says and acquires from what
//! it read in one step, so two members never take the same record.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_coordinator::groups::Durability;
use strata_wire::batch::{Batch, BatchBuilder, BatchHeader};
use strata_wire::protocol::{
    ACKS_ALL, Elsewhere, ErrorCode, FetchPartition, ProducePartition, ProduceRequest, ProduceTopic,
    Records, Request, Response, SharePartitionDescription,
};
use tokio::sync::oneshot;

use crate::log::FileRegion;
use crate::server::messages::{Delivery, GroupMessage, ShareGroupRequest};
use crate::server::shard::replica::Role;
use crate::share::config::{AutoOffsetReset, ShareGroupConfig};
use crate::share::partition::{
    AckBatch, AckError, AcquireMode, Acquired, DeadLetter, LogRun, ShareCounters, SharePartition,
    ShareSnapshot, ShareSummary, record_key,
};

use super::Shard;

/// The header a producer sets to hold a record back until a time (Unix milliseconds, as
/// decimal text).
pub const DELIVER_AFTER_HEADER: &str = "strata.deliver.after.ms";

/// A member's share session on the shard its connection landed on: the partitions it
/// fetches, and the epoch its next request must carry.
#[derive(Debug, Default)]
pub(crate) struct ShareSession {
    pub next_epoch: i32,
    pub partitions: std::collections::BTreeSet<(String, u32)>,
}

/// A share-partition: (group, topic, partition).
pub(crate) type ShareKey = (String, String, u32);

/// This shard's share-partitions, each behind its own turn-taking lock.
#[derive(Default)]
pub(crate) struct SharePartitions {
    slots: RefCell<HashMap<ShareKey, Rc<tokio::sync::Mutex<Option<Held>>>>>,
    /// Each loaded share-partition's window and counters as of its last operation, for
    /// metrics (read without waiting for its turn).
    seen: RefCell<HashMap<ShareKey, (ShareSummary, ShareCounters)>>,
}

/// A share-partition as its leader holds it.
struct Held {
    core: SharePartition,
    /// The store revision this leader last wrote (its claim, or an acknowledgement since).
    revision: i64,
    leader_epoch: u32,
    /// The topic's id: a topic deleted and created again under its name starts afresh.
    topic_id: Option<String>,
    /// The partition's stored bytes per record, as reads found them (0: none read yet): an
    /// acquisition reads about what it may take rather than the client's byte limit.
    bytes_per_record: u64,
}

/// The share-partition record in the group store.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredShareState {
    /// The epoch of the leader that claimed it: a leader of an older epoch may not.
    pub(crate) leader_epoch: u32,
    pub(crate) state: ShareSnapshot,
    /// The id of the topic it is of (Kafka's topic id): state stored for a topic since deleted
    /// is not that of a new topic of the same name.
    #[serde(default)]
    pub(crate) topic_id: Option<String>,
}

/// Why a share operation on a partition failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShareFailure {
    Code(ErrorCode),
    /// Kafka's INVALID_RECORD_STATE.
    InvalidRecordState(String),
    /// Kafka's INVALID_REQUEST.
    InvalidRequest(String),
}

impl From<ErrorCode> for ShareFailure {
    fn from(code: ErrorCode) -> ShareFailure {
        ShareFailure::Code(code)
    }
}

/// What an acquisition hands the member.
#[derive(Debug)]
pub(crate) struct ShareAcquired {
    /// Whole stored batches holding the acquired records (either format): bytes, or a range
    /// of a segment file (`Records::Elsewhere`, a [`FileRegion`]) where the fetch allowed it.
    pub records: Records,
    pub acquired: Vec<Acquired>,
    pub leader_epoch: u32,
}

impl ShareAcquired {
    fn none(leader_epoch: u32) -> ShareAcquired {
        ShareAcquired {
            records: Records::empty(),
            acquired: Vec::new(),
            leader_epoch,
        }
    }
}

pub(crate) fn share_state_id(group: &str, topic: &str, partition: u32) -> String {
    format!("{group}/{topic}/{partition}")
}

impl Shard {
    fn share_slot(&self, key: &ShareKey) -> Rc<tokio::sync::Mutex<Option<Held>>> {
        self.shares
            .slots
            .borrow_mut()
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Notes what `key`'s share-partition holds now, for metrics (or that it is gone).
    fn note_share(&self, key: &ShareKey, held: &Option<Held>) {
        let mut seen = self.shares.seen.borrow_mut();
        match held {
            Some(current) => {
                seen.insert(
                    key.clone(),
                    (current.core.summary(), current.core.counters()),
                );
            }
            None => {
                seen.remove(key);
            }
        }
    }

    /// Every loaded share-partition this shard leads, for `/metrics`.
    pub(super) fn share_metrics(&self) -> Vec<crate::server::metrics::SharePartitionMetrics> {
        let seen = self.shares.seen.borrow();
        seen.iter()
            .filter_map(|((group, topic, partition), (summary, counters))| {
                let (_, high_watermark, _) = self.leader_view(topic, *partition)?;
                Some(crate::server::metrics::SharePartitionMetrics {
                    group: group.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    summary: *summary,
                    counters: *counters,
                    lag: high_watermark.saturating_sub(summary.start_offset),
                })
            })
            .collect()
    }

    /// `topic`'s id as this shard's view has it.
    fn topic_id_of(&self, topic: &str) -> Option<String> {
        let view = self.view.borrow();
        let known = view.topics.iter().find(|known| known.name == topic)?;
        Some(uuid::Uuid::from_bytes(known.topic_id().0).to_string())
    }

    /// This shard's leadership of `topic`-`partition`: its epoch.
    fn leading(&self, topic: &str, partition: u32) -> Result<u32, ErrorCode> {
        let partitions = self.partitions.borrow();
        match partitions
            .get(&(topic.to_string(), partition))
            .map(|p| &p.role)
        {
            Some(Role::Leader(leader)) => Ok(leader.epoch()),
            _ => Err(ErrorCode::NotLeader),
        }
    }

    /// How durable an acknowledgement of `key` is once answered: as the partition's records are
    /// once acknowledged to their producer. Synced first under `flush=always`; otherwise
    /// written (it survives a crash of the broker) and synced within the group thread's next
    /// tick, sooner than the records under the default `flush=interval`.
    fn share_durability(&self, key: &ShareKey) -> Durability {
        let partitions = self.partitions.borrow();
        match partitions.get(&(key.1.clone(), key.2)) {
            Some(partition) if !partition.flush_always => Durability::Written,
            _ => Durability::Synced,
        }
    }

    async fn share_store(&self, request: ShareGroupRequest) -> bool {
        self.context
            .groups
            .send(GroupMessage::Share(request))
            .is_ok()
    }

    /// Makes sure `held` is this leader's current share-partition: loaded from the store and
    /// claimed at this leader's epoch (once per leadership).
    async fn share_ready(
        &self,
        held: &mut Option<Held>,
        key: &ShareKey,
        config: &ShareGroupConfig,
    ) -> Result<(), ShareFailure> {
        let (group, topic, partition) = key;
        let epoch = self.leading(topic, *partition)?;
        let topic_id = self.topic_id_of(topic);
        if let Some(current) = held.as_mut()
            && current.leader_epoch == epoch
            && current.topic_id == topic_id
        {
            current.core.set_settings(config.partition.clone());
            return Ok(());
        }
        *held = None;
        let id = share_state_id(group, topic, *partition);
        let (reply, answer) = oneshot::channel();
        let asked = ShareGroupRequest::LoadState {
            id: id.clone(),
            reply,
        };
        if !self.share_store(asked).await {
            return Err(ErrorCode::NotReady.into());
        }
        let (stored, revision) = answer.await.map_err(|_| ErrorCode::NotReady)??;
        let (log, _, _) = self
            .leader_view(topic, *partition)
            .ok_or(ErrorCode::NotLeader)?;
        let offsets = log.offsets().await.map_err(|_| ErrorCode::StorageError)?;
        let core = match stored {
            Some(value) => {
                let stored: StoredShareState = serde_json::from_value(value).map_err(|error| {
                    tracing::error!(%id, "a stored share-partition does not read: {error}");
                    ErrorCode::Internal
                })?;
                if stored.topic_id.is_some() && stored.topic_id != topic_id {
                    // Of a topic since deleted: this one starts afresh.
                    None
                } else if stored.leader_epoch > epoch {
                    return Err(ErrorCode::NotLeader.into());
                } else {
                    Some(SharePartition::restore(
                        &stored.state,
                        config.partition.clone(),
                    ))
                }
            }
            None => None,
        };
        let mut core = match core {
            Some(core) => core,
            None => {
                let high_watermark = self
                    .leader_view(topic, *partition)
                    .map_or(offsets.log_start, |(_, high_watermark, _)| high_watermark);
                let start = match config.auto_offset_reset {
                    AutoOffsetReset::Earliest => offsets.log_start,
                    AutoOffsetReset::Latest => high_watermark,
                    AutoOffsetReset::ByDuration(age) => {
                        let since = self.clock().wall_ms() - age.as_millis() as i64;
                        log.offset_for_timestamp(since)
                            .await
                            .ok()
                            .flatten()
                            .map_or(high_watermark, |(offset, _)| offset)
                    }
                };
                SharePartition::new(start, config.partition.clone())
            }
        };
        core.move_start_to(offsets.log_start);
        let claim = StoredShareState {
            leader_epoch: epoch,
            state: core.snapshot(),
            topic_id: topic_id.clone(),
        };
        let revision = self
            .store_share(key, revision, &claim)
            .await?
            .ok_or(ErrorCode::NotLeader)?;
        core.mark_persisted();
        *held = Some(Held {
            core,
            revision,
            leader_epoch: epoch,
            topic_id,
            bytes_per_record: 0,
        });
        Ok(())
    }

    async fn store_share(
        &self,
        key: &ShareKey,
        expected: i64,
        state: &StoredShareState,
    ) -> Result<Option<i64>, ShareFailure> {
        let (reply, answer) = oneshot::channel();
        let record = serde_json::to_value(state).expect("a share state serializes");
        let asked = ShareGroupRequest::StoreState {
            id: share_state_id(&key.0, &key.1, key.2),
            expected,
            record,
            durability: self.share_durability(key),
            reply,
        };
        if !self.share_store(asked).await {
            return Err(ErrorCode::NotReady.into());
        }
        Ok(answer.await.map_err(|_| ErrorCode::NotReady)??)
    }

    /// Stores `held` if it changed. A fenced write means another leader claimed it: this one
    /// forgets it and answers NOT_LEADER; a failed one forgets it too (what was applied in
    /// memory and not stored is not answered as done, and the next use reloads the store).
    async fn persist_share(
        self: &Rc<Self>,
        held: &mut Option<Held>,
        key: &ShareKey,
        config: &ShareGroupConfig,
    ) -> Result<(), ShareFailure> {
        let Some(current) = held.as_mut() else {
            return Err(ErrorCode::NotLeader.into());
        };
        if !current.core.is_dirty() {
            return Ok(());
        }
        // A dead letter is written before its archive is stored: a failure here leaves the
        // record as the store has it, to be delivered (and dead-lettered) again.
        let letters = current.core.take_dead_letters();
        if let Err(failure) = self.write_dead_letters(key, config, &letters).await {
            *held = None;
            return Err(failure);
        }
        let Some(current) = held.as_mut() else {
            return Err(ErrorCode::NotLeader.into());
        };
        let state = StoredShareState {
            leader_epoch: current.leader_epoch,
            state: current.core.snapshot(),
            topic_id: current.topic_id.clone(),
        };
        match self.store_share(key, current.revision, &state).await {
            Ok(Some(revision)) => {
                current.revision = revision;
                current.core.mark_persisted();
                Ok(())
            }
            Ok(None) => {
                *held = None;
                Err(ErrorCode::NotLeader.into())
            }
            Err(failure) => {
                *held = None;
                Err(failure)
            }
        }
    }

    /// Acquires records of `key`'s partition for `member` (on the shard that owns it).
    pub(crate) async fn share_acquire(
        self: &Rc<Self>,
        key: ShareKey,
        member: String,
        config: ShareGroupConfig,
        limit: (usize, AcquireMode),
        (max_bytes, delivery): (u32, Delivery),
    ) -> Result<ShareAcquired, ShareFailure> {
        let slot = self.share_slot(&key);
        let mut held = slot.lock().await;
        let result = self
            .acquire_held(
                &mut held,
                &key,
                member,
                config,
                limit,
                (max_bytes, delivery),
            )
            .await;
        self.note_share(&key, &held);
        result
    }

    async fn acquire_held(
        self: &Rc<Self>,
        held: &mut Option<Held>,
        key: &ShareKey,
        member: String,
        config: ShareGroupConfig,
        (max_records, mode): (usize, AcquireMode),
        (max_bytes, delivery): (u32, Delivery),
    ) -> Result<ShareAcquired, ShareFailure> {
        self.share_ready(held, key, &config).await?;
        let (_, topic, partition) = key;
        let (log, _, _) = self
            .leader_view(topic, *partition)
            .ok_or(ErrorCode::NotLeader)?;
        let log_start = log
            .offsets()
            .await
            .map_err(|_| ErrorCode::StorageError)?
            .log_start;
        let current = held.as_mut().expect("share_ready holds it");
        current.core.move_start_to(log_start);
        let now = self.clock().now();
        let Some(from) = current.core.read_from(now) else {
            return Ok(ShareAcquired::none(current.leader_epoch));
        };
        // The records this acquisition may look at: those waiting in the window past `from`,
        // and as many new ones as it may take.
        let wanted = max_records as u64 + current.core.end_offset().saturating_sub(from);
        let read_bytes = read_size(wanted, current.bytes_per_record, max_bytes);
        // Acquisition that looks at each record reads them into memory; otherwise the batch
        // headers decide, and the batches go out as the fetch allows (from the file with
        // `sendfile`, as a consumer group's fetch).
        let per_record = config.partition.key_ordering || config.delayed_delivery;
        let delivery = if per_record {
            Delivery::Bytes
        } else {
            delivery
        };
        let fetched = self
            .fetch_local(
                topic,
                FetchPartition {
                    partition: *partition,
                    fetch_offset: from,
                    max_bytes: read_bytes,
                },
                None,
                delivery,
                config.read_committed,
            )
            .await;
        let current = held.as_mut().ok_or(ErrorCode::NotLeader)?;
        if fetched.response.error != ErrorCode::None {
            return Err(fetched.response.error.into());
        }
        let served = Served::of(fetched.response.records)?;
        let aborted = fetched
            .stability
            .map(|(_, aborted)| aborted)
            .unwrap_or_default();
        let wall_ms = self.clock().wall_ms();
        let read = log_records(&served, &aborted, &config, now, wall_ms);
        if let Some(per_record) = (served.len() as u64).checked_div(read.offsets()) {
            current.bytes_per_record = match current.bytes_per_record {
                0 => per_record,
                known => (known * 3 + per_record) / 4,
            };
        }
        let acquired = current
            .core
            .acquire_with(&member, now, &read.records, max_records, mode);
        let records = read.holding(served, &acquired);
        let leader_epoch = current.leader_epoch;
        if current.core.has_dead_letters() {
            // Locks that ran out took records past their last delivery.
            self.persist_share(held, key, &config).await?;
        }
        Ok(ShareAcquired {
            records,
            acquired,
            leader_epoch,
        })
    }

    /// Applies `member`'s acknowledgements to `key` and stores them before answering.
    pub(crate) async fn share_acknowledge(
        self: &Rc<Self>,
        key: ShareKey,
        member: String,
        config: ShareGroupConfig,
        batches: Vec<AckBatch>,
    ) -> Result<(), ShareFailure> {
        let slot = self.share_slot(&key);
        let mut held = slot.lock().await;
        let result = self
            .acknowledge_held(&mut held, &key, member, config, batches)
            .await;
        self.note_share(&key, &held);
        result
    }

    async fn acknowledge_held(
        self: &Rc<Self>,
        held: &mut Option<Held>,
        key: &ShareKey,
        member: String,
        config: ShareGroupConfig,
        batches: Vec<AckBatch>,
    ) -> Result<(), ShareFailure> {
        self.share_ready(held, key, &config).await?;
        let now = self.clock().now();
        let current = held.as_mut().expect("share_ready holds it");
        current
            .core
            .acknowledge(&member, now, &batches)
            .map_err(|error| match error {
                AckError::NotAcquired(_) => ShareFailure::InvalidRecordState(error.to_string()),
                AckError::Malformed(_) => ShareFailure::InvalidRequest(error.to_string()),
            })?;
        self.persist_share(held, key, &config).await
    }

    /// Gives back what `member` holds of `key` (it left, or closed its share session).
    pub(crate) async fn share_release(
        self: &Rc<Self>,
        key: ShareKey,
        member: String,
        config: ShareGroupConfig,
    ) -> Result<(), ShareFailure> {
        let slot = self.share_slot(&key);
        let mut held = slot.lock().await;
        let result = self.release_held(&mut held, &key, member, config).await;
        self.note_share(&key, &held);
        result
    }

    async fn release_held(
        self: &Rc<Self>,
        held: &mut Option<Held>,
        key: &ShareKey,
        member: String,
        config: ShareGroupConfig,
    ) -> Result<(), ShareFailure> {
        self.share_ready(held, key, &config).await?;
        let now = self.clock().now();
        held.as_mut()
            .expect("share_ready holds it")
            .core
            .release_member(&member, now);
        self.persist_share(held, key, &config).await
    }

    /// Writes `letters` (records of `key`'s partition) to the group's dead-letter topic, each
    /// with its key, value and headers, and headers naming where it came from and why.
    async fn write_dead_letters(
        self: &Rc<Self>,
        key: &ShareKey,
        config: &ShareGroupConfig,
        letters: &[DeadLetter],
    ) -> Result<(), ShareFailure> {
        let (Some(topic), false) = (config.dead_letter_topic.as_ref(), letters.is_empty()) else {
            return Ok(());
        };
        let (group, source, partition) = key;
        let partitions = {
            let view = self.view.borrow();
            view.topics
                .iter()
                .find(|known| &known.name == topic)
                .map(|known| known.partitions.len() as u32)
        };
        let Some(partitions) = partitions.filter(|&count| count > 0) else {
            tracing::warn!(
                %group,
                %topic,
                "the dead-letter topic does not exist: {} records archived without a dead letter",
                letters.len()
            );
            return Ok(());
        };
        let mut batch = BatchBuilder::with_capacity(64 << 10);
        let mut next = 0;
        while next < letters.len() {
            let fetched = self
                .fetch_local(
                    source,
                    FetchPartition {
                        partition: *partition,
                        fetch_offset: letters[next].offset,
                        max_bytes: 1 << 20,
                    },
                    None,
                    Delivery::Bytes,
                    false,
                )
                .await;
            if fetched.response.error != ErrorCode::None {
                return Err(fetched.response.error.into());
            }
            let Records::Shared(bytes) = fetched.response.records else {
                return Err(ErrorCode::Internal.into());
            };
            let before = next;
            for stored in strata_wire::batch::split_batches(bytes) {
                let Ok(stored) = stored else { break };
                for record in stored.records() {
                    let Some(letter) = letters.get(next) else {
                        break;
                    };
                    if record.offset != letter.offset {
                        continue;
                    }
                    let (offset, deliveries) =
                        (letter.offset.to_string(), letter.deliveries.to_string());
                    let partition_text = partition.to_string();
                    let provenance: [(&[u8], &[u8]); 6] = [
                        (b"strata.dlq.group", group.as_bytes()),
                        (b"strata.dlq.topic", source.as_bytes()),
                        (b"strata.dlq.partition", partition_text.as_bytes()),
                        (b"strata.dlq.offset", offset.as_bytes()),
                        (b"strata.dlq.delivery.count", deliveries.as_bytes()),
                        (b"strata.dlq.reason", letter.reason.as_str().as_bytes()),
                    ];
                    batch.push_with_headers(
                        record.timestamp_ms,
                        record.key,
                        record.value,
                        record.headers().chain(provenance),
                    );
                    next += 1;
                }
            }
            if next == before {
                // Gone from the log (retention): nothing left to copy.
                next += 1;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let produce = ProduceRequest {
            acks: ACKS_ALL,
            timeout_ms: 30_000,
            topics: vec![ProduceTopic {
                name: topic.clone(),
                partitions: vec![ProducePartition {
                    partition: partition % partitions,
                    records: Records::Shared(batch.finish()),
                }],
            }],
            expected_offsets: Default::default(),
            durability: Default::default(),
        };
        let error = match self.handle(Request::Produce(produce)).await {
            Some(Ok(Response::Produce(answer))) => answer
                .topics
                .iter()
                .flat_map(|topic| &topic.partitions)
                .map(|partition| partition.error)
                .find(|error| *error != ErrorCode::None),
            Some(Ok(_)) | None => Some(ErrorCode::Internal),
            Some(Err(error)) => Some(error),
        };
        match error {
            None => Ok(()),
            Some(error) => {
                tracing::warn!(%group, %topic, "writing dead letters failed: {error}");
                Err(error.into())
            }
        }
    }

    /// Where `key`'s share group stands on the partition (on the shard that owns it), without
    /// claiming it: the window as this leader holds it, else as stored; `GroupIdNotFound`
    /// when the group holds no state there. Lag in seconds is measured as for consumer groups
    /// ([`Shard::group_position`]), from the record at the start offset.
    pub(crate) async fn share_describe(
        self: &Rc<Self>,
        key: ShareKey,
        config: ShareGroupConfig,
    ) -> Result<SharePartitionDescription, ShareFailure> {
        let (group, topic, partition) = &key;
        let epoch = self.leading(topic, *partition)?;
        let slot = self.shares.slots.borrow().get(&key).cloned();
        let mut summary = None;
        if let Some(slot) = slot {
            let held = slot.lock().await;
            summary = held
                .as_ref()
                .filter(|current| current.leader_epoch == epoch)
                .map(|current| current.core.summary());
        }
        if summary.is_none() {
            let (reply, answer) = oneshot::channel();
            let id = share_state_id(group, topic, *partition);
            if !self
                .share_store(ShareGroupRequest::LoadState { id, reply })
                .await
            {
                return Err(ErrorCode::NotReady.into());
            }
            let (stored, _) = answer.await.map_err(|_| ErrorCode::NotReady)??;
            let stored: StoredShareState =
                serde_json::from_value(stored.ok_or(ErrorCode::GroupIdNotFound)?)
                    .map_err(|_| ErrorCode::Internal)?;
            let (log, _, _) = self
                .leader_view(topic, *partition)
                .ok_or(ErrorCode::NotLeader)?;
            let log_start = log
                .offsets()
                .await
                .map_err(|_| ErrorCode::StorageError)?
                .log_start;
            let mut core = SharePartition::restore(&stored.state, config.partition);
            core.move_start_to(log_start);
            summary = Some(core.summary());
        }
        let summary = summary.expect("held or stored");
        let position = self
            .group_position(topic.clone(), *partition, summary.start_offset)
            .await;
        let high_watermark = position.end.unwrap_or(summary.end_offset);
        Ok(SharePartitionDescription {
            topic: topic.clone(),
            partition: *partition,
            error: ErrorCode::None,
            start_offset: summary.start_offset,
            end_offset: summary.end_offset,
            in_flight: summary.in_flight,
            acquired: summary.acquired,
            high_watermark,
            lag: summary.in_flight + high_watermark.saturating_sub(summary.end_offset),
            oldest_timestamp_ms: position.oldest_unconsumed_ms.flatten(),
        })
    }

    /// Runs `change` (an operator's change to `key`'s stored state: its offsets altered or
    /// deleted) in the share-partition's turn, and forgets what this leader holds of it: its
    /// next use loads what the change left.
    pub(crate) async fn share_replace<T>(
        &self,
        key: &ShareKey,
        change: impl Future<Output = T>,
    ) -> T {
        let slot = self.share_slot(key);
        let mut held = slot.lock().await;
        let changed = change.await;
        *held = None;
        self.note_share(key, &held);
        changed
    }

    /// Forgets what this leader holds of `key` if the store's record is no longer the one it
    /// last wrote (an operator altered or deleted it through another broker): checked when the
    /// partition joins a member's share session, so a new member starts where the operator set.
    pub(crate) async fn share_check_stored(&self, key: &ShareKey) {
        let slot = self.share_slot(key);
        let mut held = slot.lock().await;
        let Some(revision) = held.as_ref().map(|current| current.revision) else {
            return;
        };
        let (reply, answer) = oneshot::channel();
        let id = share_state_id(&key.0, &key.1, key.2);
        if !self
            .share_store(ShareGroupRequest::LoadState { id, reply })
            .await
        {
            return;
        }
        if let Ok(Ok((_, stored))) = answer.await
            && stored != revision
        {
            *held = None;
            self.note_share(key, &held);
        }
    }

    /// Waits, up to `deadline`, until `key` may have records to acquire: the partition's
    /// committed records grew past the window, or a lock or backoff ran out.
    pub(crate) async fn share_wait(&self, key: ShareKey, deadline: Instant) {
        let (_, topic, partition) = &key;
        let Some((_, high_watermark, committed)) = self.leader_view(topic, *partition) else {
            return;
        };
        let advanced = committed.notified();
        tokio::pin!(advanced);
        advanced.as_mut().enable();
        let (end, next_change) = {
            let slot = self.share_slot(&key);
            let held = slot.lock().await;
            match held.as_ref() {
                Some(current) => (current.core.end_offset(), current.core.poll_timeout()),
                None => return,
            }
        };
        if high_watermark > end {
            return;
        }
        let until = next_change.map_or(deadline, |at| at.min(deadline));
        let _ = self.clock().timeout_at(until, advanced).await;
    }
}

/// How much to read for an acquisition that may look at `wanted` records: a quarter more than
/// they take at `bytes_per_record` (unknown: 256 KiB), within 16 KiB and the client's limit. A
/// read returns at least the first whole batch whatever its size.
fn read_size(wanted: u64, bytes_per_record: u64, max_bytes: u32) -> u32 {
    const FLOOR: u64 = 16 << 10;
    let guess = match bytes_per_record {
        0 => 256 << 10,
        known => wanted.saturating_mul(known).saturating_mul(5) / 4 + FLOOR,
    };
    u32::try_from(guess.max(FLOOR))
        .unwrap_or(u32::MAX)
        .min(max_bytes)
}

/// What an acquisition's read of the log found: bytes, or a range of a segment file whose
/// batches' headers were read (never one holding a compacted batch: those are listed record by
/// record, so they are read).
enum Served {
    Bytes(Bytes),
    Region(FileRegion),
}

impl Served {
    fn of(records: Records) -> Result<Served, ShareFailure> {
        match records {
            Records::Shared(bytes) => Ok(Served::Bytes(bytes)),
            Records::Mutable(bytes) => Ok(Served::Bytes(bytes.freeze())),
            Records::Elsewhere(elsewhere) => {
                let region = std::sync::Arc::downcast::<FileRegion>(elsewhere.source)
                    .ok()
                    .and_then(|region| std::sync::Arc::try_unwrap(region).ok())
                    .ok_or(ErrorCode::Internal)?;
                if region
                    .batches
                    .iter()
                    .any(|batch| batch.header.is_compacted())
                {
                    let bytes = super::fetch::read_cached_region(&region).map_err(|error| {
                        tracing::warn!("reading a share acquisition's range failed: {error}");
                        ErrorCode::StorageError
                    })?;
                    return Ok(Served::Bytes(bytes));
                }
                Ok(Served::Region(region))
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Served::Bytes(bytes) => bytes.len(),
            Served::Region(region) => region.len,
        }
    }

    /// Each whole batch read: its header and where it lies in what was read. A read of bytes
    /// ends with whole batches, or cut inside its last one, which is left out.
    fn batches(&self) -> Vec<(BatchHeader, std::ops::Range<usize>)> {
        match self {
            Served::Bytes(bytes) => {
                let mut batches = Vec::new();
                let mut position = 0usize;
                while position < bytes.len() {
                    let Ok(header) = BatchHeader::parse(&bytes[position..]) else {
                        break;
                    };
                    let Some(end) = position
                        .checked_add(header.batch_len as usize)
                        .filter(|&end| end <= bytes.len())
                    else {
                        break;
                    };
                    batches.push((header, position..end));
                    position = end;
                }
                batches
            }
            Served::Region(region) => region
                .batches
                .iter()
                .map(|batch| {
                    let at = batch.at as usize;
                    (batch.header, at..at + batch.header.batch_len as usize)
                })
                .collect(),
        }
    }
}

/// What a log read holds, as the share-partition acquires from it.
struct ReadRecords {
    records: Vec<LogRun>,
    /// Each batch's (first offset, last offset, where it lies in the read), in the order of
    /// the read's batches.
    batches: Vec<(u64, u64, std::ops::Range<usize>)>,
}

impl ReadRecords {
    /// The offsets the read's whole batches span.
    fn offsets(&self) -> u64 {
        match (self.batches.first(), self.batches.last()) {
            (Some((first, _, _)), Some((_, last, _))) => last - first + 1,
            _ => 0,
        }
    }

    /// The part of the read from the first batch holding an acquired record to the last.
    fn holding(&self, served: Served, acquired: &[Acquired]) -> Records {
        let holds = |first: u64, last: u64| {
            acquired
                .iter()
                .any(|run| run.first <= last && first <= run.last)
        };
        let mut kept = self
            .batches
            .iter()
            .enumerate()
            .filter(|(_, (first, last, _))| holds(*first, *last))
            .map(|(at, _)| at);
        let Some(first) = kept.next() else {
            return Records::empty();
        };
        let last = kept.next_back().unwrap_or(first);
        match served {
            Served::Bytes(bytes) => {
                Records::Shared(bytes.slice(self.batches[first].2.start..self.batches[last].2.end))
            }
            Served::Region(mut region) => {
                region.narrow(first, last);
                Records::Elsewhere(Elsewhere {
                    len: u32::try_from(region.len).expect("reads below 4 GiB"),
                    source: std::sync::Arc::new(region),
                })
            }
        }
    }
}

/// The records of a read, for acquisition, in [`LogRun`]s: a whole batch per run, from its
/// header alone, unless acquisition looks at each record (key order, delayed delivery: its key,
/// its `strata.deliver.after.ms` header) or the batch was compacted (offsets without a record
/// are archived, so each record is listed). Markers, and aborted records under
/// `read_committed`, are runs to skip. Batches are not checked here: a fetch serves them as
/// stored, and their consumer checks them.
fn log_records(
    served: &Served,
    aborted: &[strata_wire::protocol::AbortedTransaction],
    config: &ShareGroupConfig,
    now: Instant,
    wall_ms: i64,
) -> ReadRecords {
    let per_record = config.partition.key_ordering || config.delayed_delivery;
    let mut records = Vec::new();
    let mut batches = Vec::new();
    let mut aborted: Vec<_> = aborted.iter().collect();
    aborted.sort_by_key(|txn| std::cmp::Reverse(txn.first_offset));
    let mut aborting: HashSet<i64> = HashSet::new();
    for (header, range) in served.batches() {
        let whole = LogRun {
            last: header.last_offset(),
            ..LogRun::record(header.base_offset)
        };
        while aborted
            .last()
            .is_some_and(|txn| txn.first_offset <= header.base_offset)
        {
            aborting.insert(aborted.pop().expect("just seen").producer_id);
        }
        let skip = if header.is_control() {
            aborting.remove(&header.producer_id);
            true
        } else {
            header.is_transactional() && aborting.contains(&header.producer_id)
        };
        // A region holds no compacted batch, and is never read for key order or delays
        // (`Served::of`, `Shard::acquire_held`): its batches are whole runs.
        let bytes = match served {
            Served::Bytes(bytes) if !skip && (per_record || header.is_compacted()) => bytes,
            _ => {
                records.push(LogRun { skip, ..whole });
                batches.push((whole.first, whole.last, range));
                continue;
            }
        };
        let Ok(batch) = Batch::validate(bytes.slice(range.clone())) else {
            break;
        };
        for record in batch.records() {
            let key = if config.partition.key_ordering {
                record.key.map(record_key)
            } else {
                None
            };
            let not_before = if config.delayed_delivery {
                deliver_after(&record, now, wall_ms)
            } else {
                None
            };
            records.push(LogRun {
                key,
                not_before,
                ..LogRun::record(record.offset)
            });
        }
        batches.push((whole.first, whole.last, range));
    }
    ReadRecords { records, batches }
}

/// When `record` may be delivered, from its `strata.deliver.after.ms` header (Unix ms), if
/// that is still to come.
fn deliver_after(
    record: &strata_wire::batch::Record<'_>,
    now: Instant,
    wall_ms: i64,
) -> Option<Instant> {
    record
        .headers()
        .find(|(name, _)| *name == DELIVER_AFTER_HEADER.as_bytes())
        .and_then(|(_, value)| std::str::from_utf8(value).ok()?.trim().parse::<i64>().ok())
        .filter(|&at| at > wall_ms)
        .map(|at| now + Duration::from_millis((at - wall_ms) as u64))
}
