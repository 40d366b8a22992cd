//! The producer: records are appended to per-partition batches by the caller, sealed by size or
//! linger, and sent by one task per partition with a bounded number of requests in flight.
//!
//! Per record: one copy of key and value into the batch and no allocation (the record's future
//! shares its batch's outcome). Memory is bounded: `send` waits while `buffer_bytes` are queued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::Shared;
use rustc_hash::FxHashMap;
use strata_wire::batch::{BatchBuilder, Codec};
use strata_wire::protocol::{
    ACKS_ALL, ACKS_NONE, AckDurability, Appended, DURABILITY_REPORTED, DURABILITY_SYNCED,
    ErrorCode, NO_EXPECTED_OFFSET, ProducePartition, ProduceRequest, ProduceTopic, Records,
    Request, Response,
};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::transactions::Transaction;
use crate::{Client, ClientError, now_ms};

#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How long a batch waits for more records before it is sent.
    pub linger: Duration,
    /// A batch is sent once it reaches this size.
    pub batch_bytes: usize,
    /// 0, 1 or -1 (all).
    pub acks: i8,
    /// Requests in flight per partition. Above 1, a retried batch can land after a later one
    /// (as in Kafka without idempotence); set 1 to keep order across retries.
    pub max_in_flight: usize,
    /// Retries of a batch after a retriable error.
    pub retries: u32,
    pub retry_backoff: Duration,
    /// Bytes of records queued but not yet acknowledged before `send` waits (backpressure).
    pub buffer_bytes: usize,
    /// Also seal a batch once it holds this many records (benchmarks that mirror fixed-count
    /// batches); `None`: by size and linger only.
    pub batch_records: Option<usize>,
    /// Exactly-once producing: the producer takes an id from the cluster and numbers each
    /// partition's batches, so a retried batch the broker already wrote is answered with its
    /// original offsets instead of being written twice. Implies `acks=all`.
    pub idempotent: bool,
    /// How each batch's body is compressed (Kafka's `compression.type`): fewer bytes on the
    /// wire and on disk for the CPU of compressing here and decompressing in the broker's check
    /// and in consumers.
    pub compression: Codec,
    /// Kafka's `transactional.id`: the producer writes in transactions
    /// ([`Producer::init_transactions`], [`Producer::begin`], [`Producer::commit`]), and a
    /// newer producer with the same id fences this one. Implies `idempotent`.
    pub transactional_id: Option<String>,
    /// How long a transaction may stay open before the coordinator aborts it.
    pub transaction_timeout: Duration,
    /// The leader syncs each batch to disk before acknowledging it, whatever the topic's flush
    /// policy (the sync is shared with the other appends waiting for one). Off: batches are as
    /// durable as the topic's flush policy makes them.
    pub sync_before_ack: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::from_millis(5),
            batch_bytes: 256 * 1024,
            acks: 1,
            max_in_flight: 5,
            batch_records: None,
            idempotent: false,
            retries: 10,
            retry_backoff: Duration::from_millis(100),
            buffer_bytes: 64 << 20,
            compression: Codec::None,
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
            sync_before_ack: false,
        }
    }
}

/// A record to send. `partition: None` lets the partitioner choose (key hash, or for records
/// without a key one partition a batch's worth at a time: [`StickyPartition`]).
#[derive(Debug, Clone)]
pub struct ProducerRecord {
    pub topic: Arc<str>,
    pub partition: Option<u32>,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub timestamp_ms: Option<i64>,
}

impl ProducerRecord {
    pub fn new(topic: impl Into<Arc<str>>, key: Option<Bytes>, value: impl Into<Bytes>) -> Self {
        ProducerRecord {
            topic: topic.into(),
            partition: None,
            key,
            value: value.into(),
            timestamp_ms: None,
        }
    }
}

/// Where an acknowledged record landed. `offset` is -1 with `acks=0` (nothing comes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMetadata {
    pub partition: u32,
    pub offset: i64,
    /// How far the record had got when it was acknowledged: on how many in-sync replicas, and
    /// synced on how many. `None` with `acks=0`, and from a broker that does not report it.
    pub durability: Option<AckDurability>,
}

/// A batch's answer: its base offset (-1 with `acks=0`) and the durability the broker reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Acked {
    base_offset: i64,
    durability: Option<AckDurability>,
}

type BatchResult = Result<Acked, ClientError>;

/// A batch's outcome, shared by the futures of all its records: the base offset, or why not.
type BatchOutcome = Shared<futures_util::future::BoxFuture<'static, BatchResult>>;

/// Resolves when the record's batch is acknowledged.
pub struct RecordFuture {
    outcome: BatchOutcome,
    partition: u32,
    index: u32,
}

impl RecordFuture {
    /// The partition the record was assigned to (known before it is acknowledged).
    pub fn partition(&self) -> u32 {
        self.partition
    }
}

impl Future for RecordFuture {
    type Output = Result<RecordMetadata, ClientError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let (partition, index) = (self.partition, self.index);
        self.outcome.poll_unpin(context).map(|result| {
            result.map(|acked| RecordMetadata {
                partition,
                offset: if acked.base_offset < 0 {
                    -1
                } else {
                    acked.base_offset + i64::from(index)
                },
                durability: acked.durability,
            })
        })
    }
}

/// Records collecting for one partition.
struct Accumulator {
    builder: BatchBuilder,
    opened: Instant,
    outcome: BatchOutcome,
    reply: oneshot::Sender<BatchResult>,
    bytes: usize,
    /// A conditional append's offset ([`Producer::send_if`]): its batch holds its records only.
    expected_offset: Option<u64>,
}

/// A sealed batch on its way.
struct Sealed {
    /// The records, not yet finished: the partition's sender finishes the batch (entries, CRC,
    /// compression) outside the producer's lock, so sends to other partitions do not wait for it.
    builder: BatchBuilder,
    reply: oneshot::Sender<BatchResult>,
    /// Buffer space to give back once answered.
    bytes: usize,
    /// Its sequences (idempotent producers).
    numbered: Option<Numbered>,
    expected_offset: Option<u64>,
}

/// The sequences a batch was numbered with: `records` of them from `base`, under `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Numbered {
    epoch: i16,
    base: i32,
    records: i32,
}

/// A partition's next sequence and the epoch it counts in (idempotent producers), packed in
/// one word: batches are numbered under the producer's lock as they are sealed, and the
/// partition's sender may give a refused batch's sequences back
/// ([`SequenceCursor::give_back`]) without it.
#[derive(Debug, Clone, Default)]
struct SequenceCursor(Arc<AtomicU64>);

impl SequenceCursor {
    fn pack(epoch: i16, next: i32) -> u64 {
        (u64::from(epoch as u16) << 32) | u64::from(next as u32)
    }

    fn unpack(word: u64) -> (i16, i32) {
        ((word >> 32) as u16 as i16, word as u32 as i32)
    }

    /// Sequences wrap to 0 after `i32::MAX`, as Kafka's do.
    fn after(base: i32, records: i32) -> i32 {
        ((i64::from(base) + i64::from(records)) % (i64::from(i32::MAX) + 1)) as i32
    }

    /// Numbers a batch of `records` under `epoch` (a new epoch starts the partition at 0).
    fn number(&self, epoch: i16, records: i32) -> Numbered {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let (at_epoch, next) = Self::unpack(current);
            let base = if at_epoch == epoch { next } else { 0 };
            let numbered = Self::pack(epoch, Self::after(base, records));
            match self
                .0
                .compare_exchange(current, numbered, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Numbered {
                        epoch,
                        base,
                        records,
                    };
                }
                Err(now) => current = now,
            }
        }
    }

    /// Gives back the sequences of a batch the broker refused without writing anything, if no
    /// batch was numbered after it: the partition's next batch takes them, and the sequence
    /// has no hole. Whether it did.
    fn give_back(&self, batch: Numbered) -> bool {
        let numbered_last = Self::pack(batch.epoch, Self::after(batch.base, batch.records));
        let before = Self::pack(batch.epoch, batch.base);
        self.0
            .compare_exchange(numbered_last, before, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// An idempotent producer's identity, shared by its sealing and its partition senders.
#[derive(Default)]
struct Idempotence {
    /// (producer id, epoch) once the producer has one.
    identity: Mutex<Option<(i64, i16)>>,
    /// Held while asking the cluster for an id or the next epoch, so that happens once.
    asking: tokio::sync::Mutex<()>,
}

impl Idempotence {
    fn current(&self) -> Option<(i64, i16)> {
        *self.identity.lock().expect("producer identity")
    }

    /// Takes an id from the cluster if the producer has none yet.
    async fn ensure(&self, client: &Client) -> Result<(), ClientError> {
        if self.current().is_some() {
            return Ok(());
        }
        let _asking = self.asking.lock().await;
        if self.current().is_none() {
            let identity = client.init_producer_id(None).await?;
            *self.identity.lock().expect("producer identity") = Some(identity);
        }
        Ok(())
    }

    /// A batch numbered under `failed_epoch` failed for good: its partition's sequence has a
    /// hole no later batch can cross. The producer moves to its next epoch, under which every
    /// partition starts again at sequence 0 (Kafka's KIP-360). Once per epoch, however many
    /// batches fail with it.
    async fn next_epoch(&self, client: &Client, failed_epoch: i16) {
        let _asking = self.asking.lock().await;
        let Some((producer_id, epoch)) = self.current() else {
            return;
        };
        if epoch != failed_epoch {
            return;
        }
        match client.init_producer_id(Some((producer_id, epoch))).await {
            Ok(identity) => {
                tracing::warn!(
                    producer_id,
                    epoch = identity.1,
                    "a batch failed for good: the idempotent producer moves to its next epoch"
                );
                *self.identity.lock().expect("producer identity") = Some(identity);
            }
            Err(error) => {
                tracing::warn!("idempotent producer: taking the next epoch failed: {error}")
            }
        }
    }
}

#[derive(Default)]
struct PartitionState {
    /// The sequence number of the next batch's first record (idempotent producers), and the
    /// epoch it counts in: a new epoch starts every partition at 0.
    sequence: SequenceCursor,
    open: Option<Accumulator>,
    sender: Option<mpsc::UnboundedSender<Sealed>>,
    /// Sealed batches the sender task has not taken yet (it has `max_in_flight` requests out).
    /// While one waits, an expired linger does not seal the open batch: it keeps filling until
    /// the sender can take it, as Kafka's accumulator appends to the batch at the tail of its
    /// queue. Otherwise a short linger under load queues a train of tiny batches behind the
    /// requests in flight (at `linger 0`, RF 3 acks=all delivered 22,600-32,200 of the 50,000
    /// records/s asked).
    waiting: Arc<AtomicUsize>,
    /// The most recently sealed batch: `flush` waits for it (batches complete in order).
    last_sealed: Option<BatchOutcome>,
}

struct Inner {
    client: Arc<Client>,
    config: ProducerConfig,
    /// Looked up on every `send`: FxHash, which hashes a short topic name in a few
    /// instructions, where the default SipHash showed in profiles of the bench's send path.
    partitions: Mutex<FxHashMap<(Arc<str>, u32), PartitionState>>,
    /// Per topic, where records with neither key nor partition go now ([`StickyPartition`]).
    sticky: Mutex<FxHashMap<Arc<str>, StickyPartition>>,
    buffer: Arc<Semaphore>,
    /// Where a topic's sticky partition starts: producers and topics start apart.
    round_robin: AtomicU32,
    /// Wakes the linger task when a new batch opens.
    opened: Arc<Notify>,
    /// Wakes the linger task when a sender takes a partition's last waiting batch (that
    /// partition's open batch may be past its linger already).
    taken: Arc<Notify>,
    idempotence: Arc<Idempotence>,
    requests: Arc<RequestBatchers>,
    /// Bytes of the batches finished so far, as sent (after compression).
    batch_bytes: Arc<AtomicU64>,
    /// A transactional producer's transaction.
    transaction: Option<Arc<Transaction>>,
}

/// What a partition's sender task needs: not the producer itself, so dropping every producer
/// handle closes the queues and ends the tasks once they drain.
#[derive(Clone)]
struct SenderContext {
    client: Arc<Client>,
    config: ProducerConfig,
    buffer: Arc<Semaphore>,
    requests: Arc<RequestBatchers>,
    idempotence: Arc<Idempotence>,
    /// The partition's [`PartitionState::waiting`].
    waiting: Arc<AtomicUsize>,
    /// The partition's [`PartitionState::sequence`].
    sequence: SequenceCursor,
    /// Wakes the linger task (the sender took the last waiting batch).
    linger_wake: Arc<Notify>,
    /// The producer's [`Inner::batch_bytes`].
    batch_bytes: Arc<AtomicU64>,
    transaction: Option<Arc<Transaction>>,
}

/// One partition batch waiting for a produce request to its leader.
struct Outgoing {
    topic: Arc<str>,
    partition: u32,
    batch: Bytes,
    expected_offset: Option<u64>,
    reply: oneshot::Sender<BatchResult>,
}

/// Per destination (a leader's shard port), a task that puts every partition batch waiting for
/// it into one produce request, as Kafka's sender does: many small batches (many partitions at
/// a modest rate) cost one request, not one each. Entries go out in the order they came, so a
/// partition's batches keep their order on the connection.
#[derive(Default)]
struct RequestBatchers {
    by_address: Mutex<HashMap<String, mpsc::UnboundedSender<Outgoing>>>,
}

/// The most bytes of batches one coalesced request carries (a single larger batch still goes,
/// alone): well under brokers' frame limit, so sharing a request never makes one too large.
const REQUEST_BYTES_MAX: usize = 4 << 20;

impl RequestBatchers {
    fn send(&self, context: &SenderContext, address: &str, outgoing: Outgoing) {
        let mut by_address = self.by_address.lock().expect("request batchers");
        let sender = by_address.entry(address.to_string()).or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let durability = if context.config.sync_before_ack {
                DURABILITY_SYNCED
            } else {
                DURABILITY_REPORTED
            };
            tokio::spawn(coalesce(
                context.client.clone(),
                (context.config.acks, durability),
                address.to_string(),
                receiver,
            ));
            sender
        });
        if let Err(mpsc::error::SendError(outgoing)) = sender.send(outgoing) {
            let _ = outgoing.reply.send(Err(ClientError::Disconnected(
                "the request task stopped".into(),
            )));
        }
    }
}

/// The request task of one destination: takes everything waiting, sends it as one request,
/// and hands each partition its own answer.
/// `durability`: what every request asks of it ([`ProduceRequest::durability`]).
async fn coalesce(
    client: Arc<Client>,
    (acks, durability): (i8, u8),
    address: String,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
) {
    // An entry that did not fit the previous request opens the next one.
    let mut carried: Option<Outgoing> = None;
    loop {
        let first = match carried.take() {
            Some(entry) => entry,
            None => match queue.recv().await {
                Some(entry) => entry,
                None => return,
            },
        };
        let mut bytes = first.batch.len();
        let mut entries = vec![first];
        while entries.len() < 1024 {
            match queue.try_recv() {
                Ok(entry) if bytes + entry.batch.len() > REQUEST_BYTES_MAX => {
                    carried = Some(entry);
                    break;
                }
                Ok(entry) => {
                    bytes += entry.batch.len();
                    entries.push(entry);
                }
                Err(_) => break,
            }
        }
        let timeout_ms = client.config().request_timeout.as_millis() as u32;
        let (request, slots) = produce_request(&entries, (acks, durability), timeout_ms);
        let fail = |entries: Vec<Outgoing>, error: ClientError| {
            for entry in entries {
                let _ = entry.reply.send(Err(error.clone()));
            }
        };
        let connection = match client.connection(&address).await {
            Ok(connection) => connection,
            Err(error) => {
                fail(entries, error);
                continue;
            }
        };
        if acks == ACKS_NONE {
            match connection.send_without_response(request).await {
                Ok(()) => entries.into_iter().for_each(|entry| {
                    let _ = entry.reply.send(Ok(Acked {
                        base_offset: -1,
                        durability: None,
                    }));
                }),
                Err(error) => fail(entries, error),
            }
            continue;
        }
        let answer = match connection.send_request(request).await {
            Ok(answer) => answer,
            Err(error) => {
                fail(entries, error);
                continue;
            }
        };
        // Written: the next request may go while this one's answer is awaited.
        let timeout = client.config().request_timeout;
        tokio::spawn(async move {
            let response = match tokio::time::timeout(timeout, answer).await {
                Err(_) => return fail(entries, ClientError::Timeout(timeout)),
                Ok(Err(_)) => {
                    return fail(
                        entries,
                        ClientError::Disconnected("connection closed".into()),
                    );
                }
                Ok(Ok(Err(error))) => return fail(entries, error),
                Ok(Ok(Ok(response))) => response,
            };
            let Response::Produce(response) = response else {
                return fail(
                    entries,
                    ClientError::Protocol("produce answered with another api".into()),
                );
            };
            let mut answers = response.topics.into_iter().flat_map(|topic| {
                let name = topic.name;
                topic.partitions.into_iter().map(move |p| (name.clone(), p))
            });
            // One per partition answered, in the same order (none from a broker that does not
            // report durability).
            let mut durabilities = response.durability.0.into_iter();
            let mut replies: Vec<Option<Outgoing>> = entries.into_iter().map(Some).collect();
            for index in slots.into_iter().flatten() {
                let entry = replies[index].take().expect("each entry once");
                let durability = durabilities.next();
                let result = match answers.next() {
                    Some((name, answer))
                        if *name == *entry.topic && answer.partition == entry.partition =>
                    {
                        if answer.error == ErrorCode::None {
                            Ok(Acked {
                                base_offset: answer.base_offset as i64,
                                durability,
                            })
                        } else if answer.error == ErrorCode::LogEndMismatch {
                            Err(ClientError::LogEndMismatch {
                                topic: entry.topic.to_string(),
                                partition: entry.partition,
                                log_end: answer.base_offset,
                            })
                        } else {
                            Err(ClientError::Partition {
                                topic: entry.topic.to_string(),
                                partition: entry.partition,
                                code: answer.error,
                            })
                        }
                    }
                    _ => Err(ClientError::Protocol(
                        "the produce answer does not match the request".into(),
                    )),
                };
                let _ = entry.reply.send(result);
            }
        });
    }
}

/// One request for `entries`: a ProducePartition per entry, grouped by topic in order of first
/// appearance, and for each topic the entries whose answers come in that order.
fn produce_request(
    entries: &[Outgoing],
    (acks, durability): (i8, u8),
    timeout_ms: u32,
) -> (Request, Vec<Vec<usize>>) {
    // One ProducePartition per entry, grouped by topic in order of first appearance; the
    // answer lists them in the same order, so `slots` says whose answer comes when.
    let mut topics: Vec<ProduceTopic> = Vec::new();
    let mut slots: Vec<Vec<usize>> = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let partition = ProducePartition {
            partition: entry.partition,
            records: Records::Shared(entry.batch.clone()),
        };
        match topics.iter().position(|t| *t.name == *entry.topic) {
            Some(at) => {
                topics[at].partitions.push(partition);
                slots[at].push(index);
            }
            None => {
                topics.push(ProduceTopic {
                    name: entry.topic.to_string(),
                    partitions: vec![partition],
                });
                slots.push(vec![index]);
            }
        }
    }
    // Conditional appends' offsets, in the order the partitions go (topic by topic).
    let conditional = entries.iter().any(|entry| entry.expected_offset.is_some());
    let expected_offsets = if conditional {
        slots
            .iter()
            .flatten()
            .map(|&index| {
                entries[index]
                    .expected_offset
                    .map_or(NO_EXPECTED_OFFSET, |offset| offset as i64)
            })
            .collect()
    } else {
        Vec::new()
    };
    let request = Request::Produce(ProduceRequest {
        acks,
        timeout_ms,
        topics,
        expected_offsets: Appended(expected_offsets),
        durability: Appended(durability),
    });
    (request, slots)
}

/// Cheap to clone; every clone feeds the same batches.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

impl Producer {
    pub fn new(client: Arc<Client>, mut config: ProducerConfig) -> Producer {
        let transaction = config
            .transactional_id
            .clone()
            .map(|id| Arc::new(Transaction::new(id, config.transaction_timeout)));
        config.idempotent |= transaction.is_some();
        if config.idempotent {
            // Only what every in-sync replica has can be deduplicated after a failover.
            config.acks = ACKS_ALL;
        }
        let buffer = Arc::new(Semaphore::new(config.buffer_bytes));
        let inner = Arc::new(Inner {
            client,
            config,
            partitions: Mutex::default(),
            sticky: Mutex::default(),
            buffer,
            round_robin: AtomicU32::new(0),
            opened: Arc::new(Notify::new()),
            taken: Arc::new(Notify::new()),
            idempotence: Arc::default(),
            requests: Arc::default(),
            batch_bytes: Arc::default(),
            transaction,
        });
        tokio::spawn(linger(
            Arc::downgrade(&inner),
            inner.opened.clone(),
            inner.taken.clone(),
        ));
        Producer { inner }
    }

    /// Appends a record to its partition's batch. Waits only for metadata of a new topic or for
    /// buffer space; the returned future resolves when the broker acknowledged the record (per
    /// `acks`) or it failed for good. Records sent one after another keep their order within
    /// a partition.
    pub async fn send(&self, record: ProducerRecord) -> Result<RecordFuture, ClientError> {
        let inner = &self.inner;
        if let Some(transaction) = &inner.transaction {
            transaction.check_open()?;
        } else if inner.config.idempotent {
            inner.idempotence.ensure(&inner.client).await?;
        }
        let count = match inner.client.cached_partition_count(&record.topic) {
            Some(count) => count,
            None => {
                let metadata = inner.client.metadata_for(&record.topic).await?;
                metadata.partition_count(&record.topic)?
            }
        };
        let size = record_bytes(record.key.as_deref(), &record.value);
        let partition = match (record.partition, &record.key) {
            (Some(partition), _) if partition < count => partition,
            (Some(partition), _) => {
                return Err(ClientError::UnknownPartition {
                    topic: record.topic.to_string(),
                    partition,
                });
            }
            (None, Some(key)) => partition_for_key(key, count),
            (None, None) => {
                let mut sticky = inner.sticky.lock().expect("sticky partitions");
                let state = match sticky.get_mut(&*record.topic) {
                    Some(state) => state,
                    None => sticky
                        .entry(record.topic.clone())
                        .or_insert(StickyPartition {
                            partition: inner.round_robin.fetch_add(1, Ordering::Relaxed),
                            bytes: 0,
                        }),
                };
                state.next(count, size, inner.config.batch_bytes)
            }
        };
        let permits = size.min(inner.config.buffer_bytes);
        self.reserve(permits).await?;
        let mut partitions = inner.partitions.lock().expect("producer state");
        let state = partitions
            .entry((record.topic.clone(), partition))
            .or_default();
        let accumulator = open_accumulator(inner, state);
        let index = accumulator.builder.record_count() as u32;
        accumulator.builder.push(
            record.timestamp_ms.unwrap_or_else(now_ms),
            record.key.as_deref(),
            &record.value,
        );
        accumulator.bytes += permits;
        let future = RecordFuture {
            outcome: accumulator.outcome.clone(),
            partition,
            index,
        };
        if is_full(inner, accumulator) {
            seal(inner, &record.topic, partition, state);
        }
        Ok(future)
    }

    /// Appends many records to one partition in one step: one metadata lookup, one lock, one
    /// buffer reservation and one timestamp for all of them, where `send` pays each per
    /// record. For callers that hold a batch's worth of values at once (the bench's pinned
    /// presets, as iggy-bench's producers send 1000 messages per call). Records keep their
    /// order. Returns one future per producer batch the records went into (more than one when
    /// they overflow `batch_bytes` or `batch_records`), each for the last of these records in
    /// it: all of them resolving means every record was acknowledged.
    pub async fn send_batch(
        &self,
        topic: &Arc<str>,
        partition: u32,
        timestamp_ms: Option<i64>,
        records: &[(Option<&[u8]>, &[u8])],
    ) -> Result<Vec<RecordFuture>, ClientError> {
        let inner = &self.inner;
        self.ready_for(topic, partition).await?;
        let total: usize = records
            .iter()
            .map(|(key, value)| record_bytes(*key, value))
            .sum();
        // Bounded by the whole buffer, as `send` bounds one record; handed to the batches the
        // records land in, in order, until it is used up.
        let mut reserved = total.min(inner.config.buffer_bytes);
        self.reserve(reserved).await?;
        let timestamp_ms = timestamp_ms.unwrap_or_else(now_ms);
        let mut futures = Vec::new();
        let mut partitions = inner.partitions.lock().expect("producer state");
        let state = partitions.entry((topic.clone(), partition)).or_default();
        for (key, value) in records {
            let accumulator = open_accumulator(inner, state);
            let index = accumulator.builder.record_count() as u32;
            accumulator.builder.push(timestamp_ms, *key, value);
            let share = record_bytes(*key, value).min(reserved);
            reserved -= share;
            accumulator.bytes += share;
            if is_full(inner, accumulator) {
                futures.push(RecordFuture {
                    outcome: accumulator.outcome.clone(),
                    partition,
                    index,
                });
                seal(inner, topic, partition, state);
            }
        }
        if !records.is_empty()
            && let Some(accumulator) = &state.open
        {
            futures.push(RecordFuture {
                outcome: accumulator.outcome.clone(),
                partition,
                index: accumulator.builder.record_count() as u32 - 1,
            });
        }
        Ok(futures)
    }

    /// Ready to send to `partition` of `topic`: a transaction open (or the idempotent
    /// producer's id known), and the partition one the topic has.
    async fn ready_for(&self, topic: &str, partition: u32) -> Result<(), ClientError> {
        let inner = &self.inner;
        if let Some(transaction) = &inner.transaction {
            transaction.check_open()?;
        } else if inner.config.idempotent {
            inner.idempotence.ensure(&inner.client).await?;
        }
        let metadata = inner.client.metadata_for(topic).await?;
        if partition >= metadata.partition_count(topic)? {
            return Err(ClientError::UnknownPartition {
                topic: topic.to_string(),
                partition,
            });
        }
        Ok(())
    }

    /// A conditional append: `records` go to `partition` of `topic` only if its log ends at
    /// `expected_offset` when they arrive (optimistic concurrency: several writers can share
    /// a partition as one log, each appending only where it read up to). Resolves to where the
    /// first record landed (and how durable it was), or [`ClientError::LogEndMismatch`] with
    /// the log end when another writer
    /// got there first (nothing written). The records travel as one batch of their own, after
    /// the records sent to the partition before them; an idempotent producer's retry of an
    /// append that was written is answered with its offsets, not as a mismatch.
    pub async fn send_if(
        &self,
        topic: &str,
        partition: u32,
        expected_offset: u64,
        records: &[(Option<&[u8]>, &[u8])],
    ) -> Result<RecordMetadata, ClientError> {
        if records.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a conditional append needs at least one record".into(),
            ));
        }
        let inner = &self.inner;
        if inner.config.acks == ACKS_NONE {
            return Err(ClientError::InvalidArgument(
                "a conditional append needs acknowledgements (acks 1 or all)".into(),
            ));
        }
        self.ready_for(topic, partition).await?;
        let reserved: usize = records
            .iter()
            .map(|(key, value)| record_bytes(*key, value))
            .sum::<usize>()
            .min(inner.config.buffer_bytes);
        self.reserve(reserved).await?;
        let timestamp_ms = now_ms();
        let topic: Arc<str> = topic.into();
        let outcome = {
            let mut partitions = inner.partitions.lock().expect("producer state");
            let state = partitions.entry((topic.clone(), partition)).or_default();
            // The records before these go first, in a batch of their own.
            seal(inner, &topic, partition, state);
            let accumulator = open_accumulator(inner, state);
            for (key, value) in records {
                accumulator.builder.push(timestamp_ms, *key, value);
            }
            accumulator.bytes = reserved;
            accumulator.expected_offset = Some(expected_offset);
            let outcome = accumulator.outcome.clone();
            seal(inner, &topic, partition, state);
            outcome
        };
        outcome.await.map(|acked| RecordMetadata {
            partition,
            offset: acked.base_offset,
            durability: acked.durability,
        })
    }

    /// Waits for `bytes` of buffer space (backpressure); they come back when their batch is
    /// answered.
    async fn reserve(&self, bytes: usize) -> Result<(), ClientError> {
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.inner
            .buffer
            .acquire_many(permits)
            .await
            .map_err(|_| ClientError::Closed)?
            .forget();
        Ok(())
    }

    /// Bytes of the batches this producer has finished so far, as they go on the wire and to
    /// disk: after compression, with batch headers and entries (retries count once).
    pub fn batch_bytes(&self) -> u64 {
        self.inner.batch_bytes.load(Ordering::Relaxed)
    }

    /// A transactional producer's id and epoch from its transactional id's coordinator, every
    /// earlier producer of the id fenced (and its open transaction aborted). Call once, before
    /// the first transaction.
    pub async fn init_transactions(&self) -> Result<(), ClientError> {
        let transaction = self.transaction()?;
        let identity = transaction.init(&self.inner.client).await?;
        *self
            .inner
            .idempotence
            .identity
            .lock()
            .expect("producer identity") = Some(identity);
        Ok(())
    }

    /// Opens a transaction: records sent until [`Producer::commit`] or [`Producer::abort`]
    /// belong to it.
    pub fn begin(&self) -> Result<(), ClientError> {
        self.transaction()?.begin()
    }

    /// Makes `offsets` (topic, partition, next offset to consume) `group`'s committed offsets
    /// when the open transaction commits: a consume-transform-produce loop's exactly-once step.
    pub async fn send_offsets(
        &self,
        group: &str,
        offsets: &[(String, u32, u64)],
    ) -> Result<(), ClientError> {
        self.transaction()?
            .send_offsets(&self.inner.client, group, offsets)
            .await
    }

    /// Waits for every record of the open transaction, then commits it: consumers reading
    /// committed records see them all, and its offsets become the group's.
    pub async fn commit(&self) -> Result<(), ClientError> {
        let transaction = self.transaction()?;
        self.flush().await?;
        transaction.end(&self.inner.client, true).await
    }

    /// Aborts the open transaction: its records are never read committed.
    pub async fn abort(&self) -> Result<(), ClientError> {
        let transaction = self.transaction()?;
        self.flush().await?;
        transaction.end(&self.inner.client, false).await
    }

    fn transaction(&self) -> Result<Arc<Transaction>, ClientError> {
        self.inner.transaction.clone().ok_or_else(|| {
            ClientError::InvalidArgument(
                "not a transactional producer (no transactional_id)".into(),
            )
        })
    }

    /// Sends every open batch now and waits until everything sent before is answered.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let waits: Vec<BatchOutcome> = {
            let mut partitions = self.inner.partitions.lock().expect("producer state");
            partitions
                .iter_mut()
                .filter_map(|((topic, partition), state)| {
                    seal(&self.inner, topic, *partition, state);
                    state.last_sealed.clone()
                })
                .collect()
        };
        for wait in waits {
            let _ = wait.await;
        }
        Ok(())
    }
}

/// The buffer space a record holds while queued: its bytes plus per-record framing.
fn record_bytes(key: Option<&[u8]>, value: &[u8]) -> usize {
    value.len() + key.map_or(0, <[u8]>::len) + 48
}

/// The partition's open batch, opened (and the linger task told) if there is none.
fn open_accumulator<'a>(inner: &Inner, state: &'a mut PartitionState) -> &'a mut Accumulator {
    state.open.get_or_insert_with(|| {
        let (reply, receiver) = oneshot::channel();
        let outcome = receiver
            .map(|answer| answer.unwrap_or(Err(ClientError::Closed)))
            .boxed()
            .shared();
        inner.opened.notify_one();
        let mut builder = BatchBuilder::with_capacity(batch_capacity(&inner.config));
        builder.set_codec(inner.config.compression);
        Accumulator {
            builder,
            opened: Instant::now(),
            outcome,
            reply,
            bytes: 0,
            expected_offset: None,
        }
    })
}

/// Room to reserve for a new batch: its size limit, plus the record that crosses it and the
/// record table `finish` appends, so a full batch is never copied into a larger buffer at the
/// end (a 1 MiB cap here cost a 1 MB copy and a fresh 2 MiB buffer per batch of 1000 1 KiB
/// records). Reserved, not touched: untouched pages cost no memory.
fn batch_capacity(config: &ProducerConfig) -> usize {
    config.batch_bytes.saturating_add(BATCH_SLACK_BYTES)
}

/// See [`batch_capacity`].
const BATCH_SLACK_BYTES: usize = 64 << 10;

/// Whether a batch has reached its size or record count and is to be sealed.
fn is_full(inner: &Inner, accumulator: &Accumulator) -> bool {
    inner
        .config
        .batch_records
        .is_some_and(|records| accumulator.builder.record_count() >= records)
        || accumulator.builder.estimated_len() >= inner.config.batch_bytes
}

/// Seals the open batch of `state` (if any) and queues it on the partition's sender task.
fn seal(inner: &Arc<Inner>, topic: &Arc<str>, partition: u32, state: &mut PartitionState) {
    let Some(mut accumulator) = state.open.take() else {
        return;
    };
    let numbered = inner
        .idempotence
        .current()
        .map(|(producer_id, producer_epoch)| {
            let records = accumulator.builder.record_count() as i32;
            let numbered = state.sequence.number(producer_epoch, records);
            accumulator
                .builder
                .set_producer(producer_id, producer_epoch, numbered.base);
            if inner.transaction.is_some() {
                accumulator
                    .builder
                    .set_attributes(strata_wire::batch::attributes::TRANSACTIONAL);
            }
            numbered
        });
    let sealed = Sealed {
        builder: accumulator.builder,
        reply: accumulator.reply,
        bytes: accumulator.bytes,
        numbered,
        expected_offset: accumulator.expected_offset,
    };
    state.last_sealed = Some(accumulator.outcome);
    state.waiting.fetch_add(1, Ordering::AcqRel);
    let sender = state.sender.get_or_insert_with(|| {
        let (sender, receiver) = mpsc::unbounded_channel();
        let context = SenderContext {
            client: inner.client.clone(),
            config: inner.config.clone(),
            buffer: inner.buffer.clone(),
            requests: inner.requests.clone(),
            idempotence: inner.idempotence.clone(),
            waiting: state.waiting.clone(),
            sequence: state.sequence.clone(),
            linger_wake: inner.taken.clone(),
            batch_bytes: inner.batch_bytes.clone(),
            transaction: inner.transaction.clone(),
        };
        tokio::spawn(send_partition(context, topic.clone(), partition, receiver));
        sender
    });
    let _ = sender.send(sealed);
}

/// Seals batches whose linger has expired.
async fn linger(
    inner: std::sync::Weak<Inner>,
    opened_signal: Arc<Notify>,
    taken_signal: Arc<Notify>,
) {
    // Deadlines to the microsecond: tokio's timer would add up to a millisecond to every
    // linger.
    let timer = crate::PreciseTimer::new();
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let linger = strong.config.linger;
        let next = {
            let mut partitions = strong.partitions.lock().expect("producer state");
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            for ((topic, partition), state) in partitions.iter_mut() {
                let Some(opened) = state.open.as_ref().map(|a| a.opened) else {
                    continue;
                };
                if opened + linger <= now {
                    // With a sealed batch still waiting for the sender, this one keeps filling;
                    // the sender wakes this task when it takes that one.
                    if state.waiting.load(Ordering::Acquire) == 0 {
                        seal(&strong, topic, *partition, state);
                    }
                } else {
                    next = Some(next.map_or(opened + linger, |n| n.min(opened + linger)));
                }
            }
            next
        };
        drop(strong);
        // Wake at the next deadline (a batch opened meanwhile has a later one), or when a
        // sender takes its waiting batch; with nothing open, when a batch opens, or now and
        // then to notice the producer is gone.
        let (opened, taken) = (opened_signal.notified(), taken_signal.notified());
        match next {
            Some(deadline) => tokio::select! {
                _ = timer.sleep_until(deadline.into_std()) => {}
                _ = taken => {}
            },
            None => tokio::select! {
                _ = opened => {}
                _ = taken => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            },
        }
    }
}

/// Kafka's uniform sticky partitioner (KIP-794) for records with neither key nor partition: they
/// all go to one partition until a batch's worth of bytes (`batch_bytes`) has gone there, then
/// to the next. One partition's batch fills where round robin would trickle a record into every
/// partition's: fewer, larger batches and requests at the same rate (Kafka's KIP-480 measured
/// about half the latency at moderate load), and over time every partition gets the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StickyPartition {
    partition: u32,
    /// Bytes sent to `partition` since it was chosen.
    bytes: usize,
}

impl StickyPartition {
    /// The partition for a record of `record_bytes` in a topic of `count` partitions.
    fn next(&mut self, count: u32, record_bytes: usize, batch_bytes: usize) -> u32 {
        debug_assert!(count > 0, "a topic has partitions");
        if self.partition >= count {
            // First use (a start anywhere), or the topic's partitions changed.
            self.partition %= count;
            self.bytes = 0;
        }
        let chosen = self.partition;
        self.bytes += record_bytes;
        if self.bytes >= batch_bytes {
            self.partition = (self.partition + 1) % count;
            self.bytes = 0;
        }
        chosen
    }
}

/// The key-hash partitioner: the same key always lands on the same partition.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    strata_wire::crc32c(key) % partitions
}

/// Sends one partition's batches with up to `max_in_flight` requests outstanding (pipelined
/// on one connection, which the broker applies in order), answering them in order.
///
/// Each batch's first attempt is *written* here, in batch order, before the next batch is
/// taken; only the wait for its answer runs concurrently. A batch that had to wait for a
/// connection or metadata can therefore never be overtaken by the next one (an idempotent
/// producer's sequences would then arrive out of order).
async fn send_partition(
    inner: SenderContext,
    topic: Arc<str>,
    partition: u32,
    mut batches: mpsc::UnboundedReceiver<Sealed>,
) {
    use futures_util::StreamExt;
    let mut in_flight = futures_util::stream::FuturesOrdered::new();
    let mut closed = false;
    loop {
        let room = in_flight.len() < inner.config.max_in_flight.max(1);
        tokio::select! {
            batch = batches.recv(), if room && !closed => match batch {
                Some(sealed) => {
                    if inner.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
                        // The partition's open batch may be past its linger: seal it now.
                        inner.linger_wake.notify_one();
                    }
                    let Sealed {
                        builder,
                        reply,
                        bytes,
                        numbered,
                        expected_offset,
                    } = sealed;
                    let batch = builder.into_batch();
                    inner.batch_bytes.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let added = match &inner.transaction {
                        Some(transaction) => {
                            transaction.ensure_added(&inner.client, &topic, partition).await
                        }
                        None => Ok(()),
                    };
                    let written = match added {
                        Ok(()) => {
                            let batch = (batch.clone(), expected_offset);
                            dispatch(&inner, &topic, partition, batch).await
                        }
                        Err(error) => Err(error),
                    };
                    let context = inner.clone();
                    let topic = topic.clone();
                    in_flight.push_back(async move {
                        let first = match written {
                            Ok(answer) => answer.outcome().await,
                            Err(error) => Err(error),
                        };
                        let result = match first {
                            Err(error) if retriable(&context, &error) => {
                                let batch = (batch, expected_offset);
                                send_with_retries(&context, &topic, partition, batch, error).await
                            }
                            result => result,
                        };
                        // A batch that failed for good leaves a hole in its partition's
                        // sequence: move to the next epoch. Unless a newer instance fenced
                        // this one: that stays an error. A conditional append refused for
                        // its offset wrote nothing: where no batch was numbered after it, its
                        // sequences are given back and the epoch stays (writers that lose
                        // often would otherwise take a new epoch per loss).
                        if let (Err(error), Some(transaction)) = (&result, &context.transaction) {
                            // Only the coordinator gives a transactional producer an epoch.
                            transaction.batch_failed(error);
                        } else if let (Err(error), Some(numbered)) = (&result, numbered)
                            && error.code() != Some(ErrorCode::InvalidProducerEpoch)
                            && !(matches!(error, ClientError::LogEndMismatch { .. })
                                && context.sequence.give_back(numbered))
                        {
                            context
                                .idempotence
                                .next_epoch(&context.client, numbered.epoch)
                                .await;
                        }
                        (result, reply, bytes)
                    });
                }
                None => closed = true,
            },
            Some((result, reply, bytes)) = in_flight.next(), if !in_flight.is_empty() => {
                let _ = reply.send(result);
                inner.buffer.add_permits(bytes);
            }
            else => return,
        }
    }
}

/// Errors worth another attempt. With several batches in flight, a later one can reach the
/// broker while an earlier one is being retried: its sequence is then ahead, and it goes again
/// after the earlier one landed.
fn retriable(inner: &SenderContext, error: &ClientError) -> bool {
    error.is_retriable()
        || (inner.config.idempotent && error.code() == Some(ErrorCode::OutOfOrderSequence))
}

/// Retries a batch whose first attempt failed with `error`, with backoff and metadata
/// refreshes.
async fn send_with_retries(
    inner: &SenderContext,
    topic: &str,
    partition: u32,
    batch: (Bytes, Option<u64>),
    mut error: ClientError,
) -> BatchResult {
    let mut attempt = 0;
    loop {
        if !retriable(inner, &error) {
            return Err(error);
        }
        if attempt >= inner.config.retries {
            // Out of retries, but the next batch should find the new leader.
            let _ = inner.client.refresh_metadata().await;
            return Err(error);
        }
        attempt += 1;
        tracing::debug!(%topic, partition, attempt, "retrying produce: {error}");
        tokio::time::sleep(inner.config.retry_backoff * attempt.min(10)).await;
        let _ = inner.client.refresh_metadata().await;
        let outcome = match dispatch(inner, topic, partition, batch.clone()).await {
            Ok(answer) => answer.outcome().await,
            Err(failed) => Err(failed),
        };
        match outcome {
            Err(failed) => error = failed,
            result => return result,
        }
    }
}

/// A batch handed to its destination's request task; its answer still to come.
struct Dispatched(oneshot::Receiver<BatchResult>);

impl Dispatched {
    /// The batch's answer, or why not.
    async fn outcome(self) -> BatchResult {
        // The request task answers every entry (with a timeout error at worst).
        self.0
            .await
            .unwrap_or_else(|_| Err(ClientError::Disconnected("the request task stopped".into())))
    }
}

/// Queues one partition batch for a produce request to the partition's leader.
/// `batch`: the batch and, for a conditional append, its expected offset.
async fn dispatch(
    inner: &SenderContext,
    topic: &str,
    partition: u32,
    (batch, expected_offset): (Bytes, Option<u64>),
) -> Result<Dispatched, ClientError> {
    let client = &inner.client;
    let metadata = client.metadata_for(topic).await?;
    let address = metadata.leader_address(topic, partition, client.config().shard_aware)?;
    let (reply, answer) = oneshot::channel();
    inner.requests.send(
        inner,
        &address,
        Outgoing {
            topic: topic.into(),
            partition,
            batch,
            expected_offset,
            reply,
        },
    );
    Ok(Dispatched(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_count_per_epoch_wrap_and_are_given_back_only_by_the_last_batch() {
        let cursor = SequenceCursor::default();
        let first = cursor.number(0, 10);
        let second = cursor.number(0, 5);
        assert_eq!((first.base, second.base), (0, 10));
        assert!(!cursor.give_back(first), "a batch was numbered after it");
        assert!(cursor.give_back(second));
        assert_eq!(
            cursor.number(0, 1).base,
            10,
            "the given-back sequences are reused"
        );
        // A new epoch starts at 0; a batch of the old epoch gives nothing back.
        let renumbered = cursor.number(1, 3);
        assert_eq!(renumbered.base, 0);
        assert!(!cursor.give_back(second));
        assert_eq!(cursor.number(1, 1).base, 3);
        // Sequences wrap after i32::MAX, and give back across the wrap.
        let cursor = SequenceCursor::default();
        cursor.number(7, i32::MAX - 1);
        let wrapping = cursor.number(7, 4);
        assert_eq!(wrapping.base, i32::MAX - 1);
        assert_eq!(cursor.number(7, 1).base, 2);
        let cursor = SequenceCursor::default();
        cursor.number(-1, i32::MAX - 1);
        let wrapping = cursor.number(-1, 4);
        assert!(cursor.give_back(wrapping));
        assert_eq!(cursor.number(-1, 1).base, i32::MAX - 1);
    }

    #[test]
    fn keyless_records_stick_to_a_partition_for_a_batch_then_move_on() {
        let mut sticky = StickyPartition {
            partition: 7,
            bytes: 0,
        };
        // 100-byte records, 1000-byte batches, 3 partitions: runs of 10, in turn from 7 % 3.
        let chosen: Vec<u32> = (0..60).map(|_| sticky.next(3, 100, 1000)).collect();
        let expected: Vec<u32> = (0..60).map(|i| (1 + i / 10) % 3).collect();
        assert_eq!(chosen, expected);
    }

    #[test]
    fn every_partition_gets_the_same_bytes_over_time() {
        let mut sticky = StickyPartition {
            partition: 0,
            bytes: 0,
        };
        let mut bytes = [0usize; 5];
        for i in 0..100_000usize {
            let size = 50 + (i * 7919) % 2000;
            bytes[sticky.next(5, size, 16 << 10) as usize] += size;
        }
        let (min, max) = (bytes.iter().min().unwrap(), bytes.iter().max().unwrap());
        // Each turn gives a partition a batch's worth plus part of a record: even to within
        // what those overshoots add up to (under 1% for these sizes).
        let mean = bytes.iter().sum::<usize>() / bytes.len();
        assert!(max - min <= mean / 100, "{bytes:?}");
    }

    #[test]
    fn a_record_larger_than_a_batch_moves_the_next_one_on() {
        let mut sticky = StickyPartition {
            partition: 0,
            bytes: 0,
        };
        assert_eq!(sticky.next(2, 5000, 1000), 0);
        assert_eq!(sticky.next(2, 10, 1000), 1);
        // A partition count that shrank under it (or a start past it) wraps.
        let mut sticky = StickyPartition {
            partition: 9,
            bytes: 500,
        };
        assert_eq!(sticky.next(4, 10, 1000), 1);
        assert_eq!(sticky.bytes, 10);
    }
}
