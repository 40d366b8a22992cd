//! The transaction coordinator on the group thread: the sans-IO [`TxnCoordinator`] fed the
//! transaction APIs, its records stored fenced, its markers written by the shards.
//!
//! - **Which broker coordinates a transactional id**: as for groups ([`super::coordinator_of`]).
//!   A broker loads an id's record the first time it needs it, and takes over every id that
//!   hashes to it when the broker set changes (and when it starts), so that what a former
//!   coordinator decided is finished: the markers of a PrepareCommit or PrepareAbort are
//!   written again, and open transactions time out here.
//! - **Fencing**: each record is written on the revision this broker read or wrote last; a
//!   fenced write means another broker coordinates the id now, and this one forgets it.
//! - **Markers**: a decision's markers go to a shard (`ShardMessage::WriteTxnMarkers`), which
//!   writes those of partitions this broker leads and sends the others to their leaders; a
//!   task per decision waits for the answer and reports it back (`MarkersWritten`). What
//!   failed is written again after [`MARKER_RETRY`].
//! - **Offsets**: TxnOffsetCommit keeps a transaction's offsets in the group's record, pending;
//!   a marker for the group commits or drops them ([`GroupManager::settle_txn_offsets`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use strata_coordinator::GroupStore;
use strata_coordinator::groups::{Durability, RecordKind, Revision, StoredOffset};
use strata_wire::protocol::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, DescribeTransactionsRequest,
    DescribeTransactionsResponse, EndTxnRequest, ErrorCode, InitProducerIdResponse,
    ListTransactionsRequest, ListTransactionsResponse, ListedTransaction, TopicPartitions,
    TransactionDescription, TransactionalInit, TxnOffsetCommitRequest, TxnProducer, TxnResponse,
    WriteTxnMarkersRequest,
};
use tokio::sync::oneshot;

use super::GroupManager;
use super::wire::{from_wire, store_error, to_wire};
use crate::group::TopicPartition;
use crate::server::messages::{GroupMessage, ShardMessage};
use crate::txn::{Producer, Step, Stored, TxnCoordinator, TxnError, TxnRecord, WriteMarkers};

/// The longest `transaction.timeout.ms` a producer may ask for (Kafka's
/// `transaction.max.timeout.ms` default, 15 minutes).
pub(super) const TRANSACTION_MAX_TIMEOUT_MS: u32 = 900_000;
/// How long after a failed marker write it is tried again.
const MARKER_RETRY: Duration = Duration::from_millis(200);

/// The coordinator's state on this broker.
pub(super) struct Transactions {
    pub(super) core: TxnCoordinator,
    /// The store revision of each loaded id's record, as this broker read or wrote it last.
    revisions: HashMap<String, Revision>,
    /// When the last take-over could not load every id it coordinates (the store did not
    /// answer): it is tried again from then on, so a decision's markers never wait for a
    /// client or a change of brokers.
    take_over_failed_at_ms: Option<u64>,
}

/// How long after a take-over that could not load every id it is tried again.
const TAKE_OVER_RETRY_MS: u64 = 1_000;

impl Default for Transactions {
    fn default() -> Transactions {
        Transactions {
            core: TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS),
            revisions: HashMap::new(),
            take_over_failed_at_ms: None,
        }
    }
}

fn txn_error(error: TxnError) -> ErrorCode {
    match error {
        TxnError::ConcurrentTransactions => ErrorCode::ConcurrentTransactions,
        TxnError::ProducerFenced => ErrorCode::ProducerFenced,
        TxnError::InvalidProducerIdMapping => ErrorCode::InvalidProducerIdMapping,
        TxnError::InvalidTxnState => ErrorCode::InvalidTxnState,
        TxnError::InvalidTransactionTimeout => ErrorCode::InvalidTransactionTimeout,
    }
}

fn producer_of(producer: &TxnProducer) -> Producer {
    Producer {
        producer_id: producer.producer_id,
        epoch: producer.producer_epoch,
    }
}

impl<S: GroupStore> GroupManager<S> {
    fn txn_now_ms(&self) -> u64 {
        self.config.clock.wall_ms().max(0) as u64
    }

    /// InitProducerId with a transactional id.
    pub(super) async fn init_transactional(
        &mut self,
        expected: (i64, i16),
        init: TransactionalInit,
    ) -> InitProducerIdResponse {
        let refused = |error| InitProducerIdResponse {
            error,
            producer_id: -1,
            producer_epoch: -1,
        };
        let id = init.transactional_id;
        if let Err(error) = self.load_txn(&id).await {
            return refused(error);
        }
        if self.producer_ids.is_empty()
            && let Err(error) = self.refill_producer_ids().await
        {
            return refused(error);
        }
        let expected = (expected.0 >= 0).then_some(Producer {
            producer_id: expected.0,
            epoch: expected.1,
        });
        let now_ms = self.txn_now_ms();
        let mut ids = std::mem::take(&mut self.producer_ids);
        let mut allocate = || ids.next().unwrap_or(-1);
        let step =
            self.txns
                .core
                .handle_init(&id, init.timeout_ms, expected, now_ms, &mut allocate);
        self.producer_ids = ids;
        match self.run_txn_step(&id, step).await {
            Ok(Stored::ProducerId { producer_id, epoch }) if producer_id >= 0 => {
                InitProducerIdResponse {
                    error: ErrorCode::None,
                    producer_id,
                    producer_epoch: epoch,
                }
            }
            Ok(Stored::ProducerId { .. }) => refused(ErrorCode::CoordinatorNotAvailable),
            // An open transaction is being aborted first: the client asks again.
            Ok(_) => refused(ErrorCode::ConcurrentTransactions),
            Err(error) => refused(error),
        }
    }

    pub(super) async fn add_partitions_to_txn(
        &mut self,
        request: AddPartitionsToTxnRequest,
    ) -> TxnResponse {
        let partitions = from_wire(request.topics);
        if let Some(unknown) = partitions.iter().find(|tp| !self.partition_exists(tp)) {
            tracing::debug!(topic = %unknown.topic, partition = unknown.partition, "adding an unknown partition to a transaction");
            return TxnResponse {
                error: ErrorCode::UnknownPartition,
            };
        }
        self.add_to_txn(&request.producer, &partitions, None).await
    }

    pub(super) async fn add_offsets_to_txn(
        &mut self,
        request: AddOffsetsToTxnRequest,
    ) -> TxnResponse {
        self.add_to_txn(&request.producer, &[], Some(&request.group))
            .await
    }

    async fn add_to_txn(
        &mut self,
        producer: &TxnProducer,
        partitions: &[TopicPartition],
        group: Option<&str>,
    ) -> TxnResponse {
        let asker = producer_of(producer);
        self.txn_request(&producer.transactional_id, |core, id, now_ms| {
            core.handle_add(id, asker, partitions, group, now_ms)
        })
        .await
    }

    pub(super) async fn end_txn(&mut self, request: EndTxnRequest) -> TxnResponse {
        let asker = producer_of(&request.producer);
        self.txn_request(&request.producer.transactional_id, |core, id, now_ms| {
            core.handle_end(id, asker, request.commit, now_ms)
        })
        .await
    }

    /// A request of an id's current producer: the id loaded, `step` taken, its change stored.
    async fn txn_request(
        &mut self,
        id: &str,
        step: impl FnOnce(&mut TxnCoordinator, &str, u64) -> Result<Step<Stored>, TxnError>,
    ) -> TxnResponse {
        let error = match self.load_txn(id).await {
            Err(error) => error,
            Ok(()) => {
                let now_ms = self.txn_now_ms();
                let step = step(&mut self.txns.core, id, now_ms);
                self.run_txn_step(id, step)
                    .await
                    .err()
                    .unwrap_or(ErrorCode::None)
            }
        };
        TxnResponse { error }
    }

    fn partition_exists(&self, partition: &TopicPartition) -> bool {
        self.partitions
            .get(&partition.topic)
            .is_some_and(|count| partition.partition < *count)
    }

    /// Loads `id`'s record if this broker coordinates it and has not yet (a decided
    /// transaction's markers are then written again); forgets it if another broker does.
    async fn load_txn(&mut self, id: &str) -> Result<(), ErrorCode> {
        if !self.is_coordinator(id) {
            self.forget_txn(id);
            return Err(ErrorCode::NotCoordinator);
        }
        if self.txns.revisions.contains_key(id) {
            return Ok(());
        }
        let (value, mut revision) = self
            .store
            .load_record(RecordKind::Transaction, id)
            .await
            .map_err(|error| store_error(&error))?;
        if let Some(value) = value {
            let stored: TxnRecord = serde_json::from_value(value).map_err(|error| {
                tracing::error!(
                    transactional_id = id,
                    "stored transaction unreadable: {error}"
                );
                ErrorCode::Internal
            })?;
            let record = stored.taken_over();
            if record.is_decided() {
                // Its markers go out at once, with the raised coordinator epoch: stored first.
                let value = serde_json::to_value(&record).expect("a transaction record serializes");
                revision = match self
                    .store
                    .store_record(
                        RecordKind::Transaction,
                        id,
                        revision,
                        &value,
                        Durability::Synced,
                    )
                    .await
                {
                    Ok(Some(revision)) => revision,
                    Ok(None) => return Err(ErrorCode::NotCoordinator),
                    Err(error) => return Err(store_error(&error)),
                };
            }
            tracing::info!(
                transactional_id = id,
                state = record.state.name(),
                coordinator_epoch = record.coordinator_epoch,
                "coordinating the transactional id"
            );
            self.txns.core.load([record]);
        }
        self.txns.revisions.insert(id.to_string(), revision);
        self.dispatch_markers();
        Ok(())
    }

    fn forget_txn(&mut self, id: &str) {
        if self.txns.revisions.remove(id).is_some() {
            tracing::info!(
                transactional_id = id,
                "no longer coordinating the transactional id"
            );
        }
        self.txns.core.forget(id);
    }

    /// Carries out a step of the coordinator: a change is stored (fenced) before it is
    /// answered. Returns what the step means for its asker.
    async fn run_txn_step(
        &mut self,
        id: &str,
        step: Result<Step<Stored>, TxnError>,
    ) -> Result<Stored, ErrorCode> {
        let record = match step.map_err(txn_error)? {
            Step::Done(stored) => return Ok(stored),
            Step::Store(record) => record,
        };
        let stored = self.store_txn_record(id, &record).await;
        let answer = self.txns.core.handle_stored(id, stored.is_ok());
        if let Err(ErrorCode::NotCoordinator) = stored {
            self.forget_txn(id);
        }
        self.dispatch_markers();
        stored?;
        answer.ok_or(ErrorCode::NotCoordinator)
    }

    async fn store_txn_record(&mut self, id: &str, record: &TxnRecord) -> Result<(), ErrorCode> {
        let expected = self.txns.revisions.get(id).copied().unwrap_or_default();
        let value = serde_json::to_value(record).expect("a transaction record serializes");
        match self
            .store
            .store_record(
                RecordKind::Transaction,
                id,
                expected,
                &value,
                Durability::Synced,
            )
            .await
        {
            Ok(Some(revision)) => {
                self.txns.revisions.insert(id.to_string(), revision);
                Ok(())
            }
            Ok(None) => {
                tracing::warn!(
                    transactional_id = id,
                    "another broker took the transactional id over"
                );
                Err(ErrorCode::NotCoordinator)
            }
            Err(error) => {
                tracing::warn!(transactional_id = id, "storing the transaction: {error}");
                Err(store_error(&error))
            }
        }
    }

    /// Hands every decision whose markers are due to a shard, with a task that reports back.
    fn dispatch_markers(&mut self) {
        for markers in self.txns.core.take_markers() {
            let Some(shard) = self.shards.first().cloned() else {
                return;
            };
            let clock = self.config.clock;
            tokio::spawn(write_markers(
                markers,
                shard,
                self.own_mailbox.clone(),
                clock,
            ));
        }
    }

    /// A task's report on a decision's markers: complete the transaction, or write them again.
    pub(super) async fn markers_written(
        &mut self,
        id: String,
        producer_id: i64,
        epoch: i16,
        written: bool,
    ) {
        if !self.txns.core.knows(&id) {
            return;
        }
        if !written {
            self.txns.core.handle_markers_failed(&id);
            self.dispatch_markers();
            return;
        }
        let now_ms = self.txn_now_ms();
        if let Some(record) = self
            .txns
            .core
            .handle_markers_written(&id, producer_id, epoch, now_ms)
        {
            let _ = self.run_txn_step(&id, Ok(Step::Store(record))).await;
        }
    }

    /// Aborts the open transactions past their timeout, and tries again a take-over that could
    /// not load every id.
    pub(super) async fn txn_timeouts(&mut self) {
        let now_ms = self.txn_now_ms();
        if self
            .txns
            .take_over_failed_at_ms
            .is_some_and(|failed_at| now_ms.saturating_sub(failed_at) >= TAKE_OVER_RETRY_MS)
        {
            self.take_over_txns().await;
        }
        for record in self.txns.core.poll_timeouts(now_ms) {
            let id = record.transactional_id.clone();
            tracing::info!(transactional_id = %id, producer_id = record.producer_id, "transaction timed out: aborting it");
            self.txn_aborts_by_timeout += 1;
            let _ = self.run_txn_step(&id, Ok(Step::Store(record))).await;
        }
    }

    /// Takes over every stored transactional id that hashes to this broker and forgets those
    /// that no longer do (the broker set changed, or this broker started).
    pub(super) async fn take_over_txns(&mut self) {
        let failed_at = Some(self.txn_now_ms());
        let ids = match self.store.list_records(RecordKind::Transaction).await {
            Ok(ids) => ids,
            Err(error) => {
                tracing::warn!("listing transactional ids: {error}");
                self.txns.take_over_failed_at_ms = failed_at;
                return;
            }
        };
        self.txns.take_over_failed_at_ms = None;
        let loaded: Vec<String> = self.txns.revisions.keys().cloned().collect();
        for id in loaded {
            if !self.is_coordinator(&id) {
                self.forget_txn(&id);
            }
        }
        for id in ids {
            if self.is_coordinator(&id) {
                match self.load_txn(&id).await {
                    Ok(()) | Err(ErrorCode::NotCoordinator) => {}
                    Err(_) => self.txns.take_over_failed_at_ms = failed_at,
                }
            }
        }
    }

    /// The ids asked for, as this broker coordinates them.
    pub(super) async fn describe_transactions(
        &mut self,
        request: DescribeTransactionsRequest,
    ) -> DescribeTransactionsResponse {
        let mut transactions = Vec::with_capacity(request.transactional_ids.len());
        for id in request.transactional_ids {
            let found = match self.load_txn(&id).await {
                Err(error) => Err(error),
                Ok(()) => self
                    .txns
                    .core
                    .record(&id)
                    .cloned()
                    .ok_or(ErrorCode::TransactionalIdNotFound),
            };
            transactions.push(match found {
                Ok(record) => describe(record),
                Err(error) => TransactionDescription::refused(id, error),
            });
        }
        DescribeTransactionsResponse { transactions }
    }

    /// The ids this broker coordinates, filtered by state and producer id (empty: all).
    pub(super) fn list_transactions(
        &self,
        request: &ListTransactionsRequest,
    ) -> ListTransactionsResponse {
        // As Kafka's `Pattern.matches`: the whole id.
        let pattern = match &request.id_pattern.0 {
            Some(pattern) if !pattern.is_empty() => {
                match regex_automata::meta::Regex::new(&format!("^(?:{pattern})$")) {
                    Ok(regex) => Some(regex),
                    Err(_) => {
                        return ListTransactionsResponse {
                            error: ErrorCode::InvalidRequest,
                            transactions: Vec::new(),
                        };
                    }
                }
            }
            _ => None,
        };
        let now_ms = self.txn_now_ms();
        let transactions = self
            .txns
            .core
            .records()
            .filter(|record| {
                (request.states.is_empty()
                    || request
                        .states
                        .iter()
                        .any(|state| state == record.state.name()))
                    && (request.producer_ids.is_empty()
                        || request.producer_ids.contains(&record.producer_id))
                    && request
                        .running_longer_than_ms
                        .0
                        .is_none_or(|longer| now_ms.saturating_sub(record.started_ms) > longer)
                    && pattern
                        .as_ref()
                        .is_none_or(|regex| regex.is_match(record.transactional_id.as_str()))
            })
            .map(|record| ListedTransaction {
                transactional_id: record.transactional_id.clone(),
                producer_id: record.producer_id,
                state: record.state.name().to_string(),
            })
            .collect();
        ListTransactionsResponse {
            error: ErrorCode::None,
            transactions,
        }
    }

    /// TxnOffsetCommit: the offsets wait in the group's record until the transaction ends.
    pub(super) async fn txn_offset_commit(
        &mut self,
        request: TxnOffsetCommitRequest,
    ) -> TxnResponse {
        let committed_ms = self.config.clock.wall_ms();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return TxnResponse { error },
        };
        // Clients before KIP-447 send no member: only the producer's epoch fences them.
        if request.generation >= 0
            && let Err(error) = coordinated
                .core
                .check_commit(&request.member_id, request.generation)
        {
            return TxnResponse { error };
        }
        let pending = coordinated
            .pending_txn_offsets
            .entry(request.producer.producer_id)
            .or_default();
        for topic in request.topics {
            let partitions = pending.entry(topic.name).or_default();
            for partition in topic.partitions {
                partitions.insert(
                    partition.partition,
                    StoredOffset {
                        offset: partition.offset,
                        metadata: partition.metadata,
                        committed_ms: Some(committed_ms),
                    },
                );
            }
        }
        let error = self
            .write_group_record(&request.group)
            .await
            .err()
            .unwrap_or(ErrorCode::None);
        TxnResponse { error }
    }

    /// A decided transaction's offsets of `group`: committed (in one fenced write with the
    /// group's other offsets of those topics) or dropped, then gone from the record.
    pub(super) async fn settle_txn_offsets(
        &mut self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> ErrorCode {
        let coordinated = match self.claim(group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return error,
        };
        let Some(pending) = coordinated.pending_txn_offsets.get(&producer_id).cloned() else {
            // Settled already (markers are written again after a takeover).
            return ErrorCode::None;
        };
        if commit {
            let mut touched = strata_coordinator::groups::GroupOffsets::new();
            for (topic, partitions) in pending {
                let mut merged = coordinated.offsets.get(&topic).cloned().unwrap_or_default();
                merged.extend(partitions);
                touched.insert(topic, merged);
            }
            let fence = coordinated.fence;
            match self.store.commit_offsets(group, fence, &touched).await {
                Ok(true) => {
                    let coordinated = self.groups.get_mut(group).expect("claimed above");
                    coordinated.offsets.extend(touched);
                }
                Ok(false) => {
                    self.groups.remove(group);
                    return ErrorCode::NotCoordinator;
                }
                Err(error) => return store_error(&error),
            }
        }
        let coordinated = self.groups.get_mut(group).expect("claimed above");
        coordinated.pending_txn_offsets.remove(&producer_id);
        self.write_group_record(group)
            .await
            .err()
            .unwrap_or(ErrorCode::None)
    }
}

/// A stored record as DescribeTransactions answers it.
fn describe(record: TxnRecord) -> TransactionDescription {
    let partitions: Vec<TopicPartition> = record.partitions.into_iter().collect();
    TransactionDescription {
        transactional_id: record.transactional_id,
        error: ErrorCode::None,
        state: record.state.name().to_string(),
        producer_id: record.producer_id,
        producer_epoch: record.epoch,
        timeout_ms: record.timeout_ms,
        started_ms: if record.state.is_open() {
            record.started_ms as i64
        } else {
            -1
        },
        partitions: to_wire(&partitions),
        groups: record.groups.into_iter().collect(),
    }
}

/// Writes one decision's markers through a shard and reports the outcome to the group
/// thread; a failure is reported after a pause, so that the retry is not immediate. Holds the
/// group thread's mailbox weakly, and reports nothing once the shards are gone: a stopping
/// broker leaves the markers to the next coordinator instead of retrying them for ever.
async fn write_markers(
    markers: WriteMarkers,
    shard: tokio::sync::mpsc::UnboundedSender<ShardMessage>,
    groups: tokio::sync::mpsc::WeakUnboundedSender<GroupMessage>,
    clock: crate::clock::Clock,
) {
    let mut by_topic: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for partition in &markers.partitions {
        by_topic
            .entry(partition.topic.clone())
            .or_default()
            .push(partition.partition);
    }
    let request = WriteTxnMarkersRequest {
        producer_id: markers.producer_id,
        producer_epoch: markers.epoch,
        commit: markers.commit,
        coordinator_epoch: markers.coordinator_epoch,
        topics: by_topic
            .into_iter()
            .map(|(topic, partitions)| TopicPartitions { topic, partitions })
            .collect(),
        groups: markers.groups.iter().cloned().collect(),
    };
    let (reply, answer) = oneshot::channel();
    if shard
        .send(ShardMessage::WriteTxnMarkers { request, reply })
        .is_err()
    {
        return;
    }
    let written = match answer.await {
        Ok(response) => {
            let failed: BTreeSet<String> = response
                .partitions
                .iter()
                .filter(|written| written.error != ErrorCode::None)
                .map(|written| {
                    format!("{}-{}: {}", written.topic, written.partition, written.error)
                })
                .chain(
                    response
                        .groups
                        .iter()
                        .filter(|settled| settled.error != ErrorCode::None)
                        .map(|settled| format!("group {}: {}", settled.group, settled.error)),
                )
                .collect();
            if !failed.is_empty() {
                tracing::debug!(transactional_id = %markers.transactional_id, ?failed, "transaction markers to write again");
            }
            failed.is_empty()
        }
        Err(_) => false,
    };
    if !written {
        clock.sleep(MARKER_RETRY).await;
    }
    let Some(groups) = groups.upgrade() else {
        return;
    };
    let _ = groups.send(GroupMessage::MarkersWritten {
        transactional_id: markers.transactional_id,
        producer_id: markers.producer_id,
        epoch: markers.epoch,
        written,
    });
}
