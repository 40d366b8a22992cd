//! The producer: per-partition batching, one request in flight per partition, retries.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use strata_wire::batch::BatchBuilder;
use strata_wire::protocol::{
    ACKS_NONE, ErrorCode, ProducePartition, ProduceRequest, ProduceTopic, Records, Request,
    Response,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::{Client, ClientError, now_ms};

#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How long a batch waits for more records before it is sent.
    pub linger: Duration,
    /// A batch is sent once it reaches this size.
    pub batch_bytes: usize,
    /// 0, 1 or -1 (all).
    pub acks: i8,
    /// Retries of a batch after a retriable error.
    pub retries: u32,
    pub retry_backoff: Duration,
    /// Batches queued per partition before `send` waits (backpressure).
    pub max_queued_batches: usize,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::from_millis(5),
            batch_bytes: 256 * 1024,
            acks: 1,
            retries: 10,
            retry_backoff: Duration::from_millis(100),
            max_queued_batches: 8,
        }
    }
}

/// A record to send. `partition: None` lets the partitioner choose (key hash, or round robin
/// for records without a key).
#[derive(Debug, Clone)]
pub struct ProducerRecord {
    pub topic: String,
    pub partition: Option<u32>,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub timestamp_ms: Option<i64>,
}

impl ProducerRecord {
    pub fn new(topic: impl Into<String>, key: Option<Bytes>, value: impl Into<Bytes>) -> Self {
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
}

type RecordReply = oneshot::Sender<Result<RecordMetadata, ClientError>>;

enum Command {
    Send {
        record: ProducerRecord,
        reply: RecordReply,
    },
    Flush {
        reply: oneshot::Sender<()>,
    },
}

/// Cheap to clone; every clone feeds the same batches.
#[derive(Clone)]
pub struct Producer {
    commands: mpsc::UnboundedSender<Command>,
}

impl Producer {
    pub fn new(client: Arc<Client>, config: ProducerConfig) -> Producer {
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(client, config, receiver));
        Producer { commands }
    }

    /// Queues a record. The returned future resolves when the broker acknowledged it (per
    /// `acks`) or it failed for good.
    pub fn send(
        &self,
        record: ProducerRecord,
    ) -> impl Future<Output = Result<RecordMetadata, ClientError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.commands.send(Command::Send { record, reply });
        async move {
            sent.map_err(|_| ClientError::Closed)?;
            answer.await.map_err(|_| ClientError::Closed)?
        }
    }

    /// Sends every batch now and waits until all records sent before have been answered.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Flush { reply })
            .map_err(|_| ClientError::Closed)?;
        answer.await.map_err(|_| ClientError::Closed)
    }
}

/// Records collecting for one partition.
struct Accumulator {
    builder: BatchBuilder,
    replies: Vec<RecordReply>,
    opened: Instant,
}

/// A sealed batch on its way.
struct Sealed {
    batch: Bytes,
    replies: Vec<RecordReply>,
    /// Answered (with nothing) once this batch is done: how `flush` waits.
    done: Option<oneshot::Sender<()>>,
}

async fn run(
    client: Arc<Client>,
    config: ProducerConfig,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut accumulators: HashMap<(String, u32), Accumulator> = HashMap::new();
    let mut senders: HashMap<(String, u32), mpsc::Sender<Sealed>> = HashMap::new();
    let round_robin = AtomicU32::new(0);
    loop {
        let next_deadline = accumulators
            .values()
            .map(|accumulator| accumulator.opened + config.linger)
            .min();
        let command = tokio::select! {
            command = commands.recv() => command,
            _ = sleep_until(next_deadline) => {
                let now = Instant::now();
                let expired: Vec<_> = accumulators
                    .iter()
                    .filter(|(_, accumulator)| accumulator.opened + config.linger <= now)
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in expired {
                    let accumulator = accumulators.remove(&key).expect("listed above");
                    dispatch(&client, &config, &mut senders, key, accumulator, None).await;
                }
                continue;
            }
        };
        match command {
            None => {
                // Every handle is gone: send what is left, then stop.
                for (key, accumulator) in accumulators.drain() {
                    dispatch(&client, &config, &mut senders, key, accumulator, None).await;
                }
                return;
            }
            Some(Command::Flush { reply }) => {
                let mut waits = Vec::new();
                for (key, accumulator) in accumulators.drain() {
                    let (done, wait) = oneshot::channel();
                    dispatch(&client, &config, &mut senders, key, accumulator, Some(done)).await;
                    waits.push(wait);
                }
                // Also wait for batches already in flight: queue a marker behind them.
                for sender in senders.values() {
                    let (done, wait) = oneshot::channel();
                    let marker = Sealed {
                        batch: Bytes::new(),
                        replies: Vec::new(),
                        done: Some(done),
                    };
                    if sender.send(marker).await.is_ok() {
                        waits.push(wait);
                    }
                }
                tokio::spawn(async move {
                    for wait in waits {
                        let _ = wait.await;
                    }
                    let _ = reply.send(());
                });
            }
            Some(Command::Send { record, reply }) => {
                let partition = match choose_partition(&client, &record, &round_robin).await {
                    Ok(partition) => partition,
                    Err(error) => {
                        let _ = reply.send(Err(error));
                        continue;
                    }
                };
                let key = (record.topic.clone(), partition);
                let accumulator = accumulators
                    .entry(key.clone())
                    .or_insert_with(|| Accumulator {
                        builder: BatchBuilder::with_capacity(config.batch_bytes.min(1 << 20)),
                        replies: Vec::new(),
                        opened: Instant::now(),
                    });
                accumulator.builder.push(
                    record.timestamp_ms.unwrap_or_else(now_ms),
                    record.key.as_deref(),
                    &record.value,
                );
                accumulator.replies.push(reply);
                if accumulator.builder.estimated_len() >= config.batch_bytes {
                    let accumulator = accumulators.remove(&key).expect("just used");
                    dispatch(&client, &config, &mut senders, key, accumulator, None).await;
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn choose_partition(
    client: &Client,
    record: &ProducerRecord,
    round_robin: &AtomicU32,
) -> Result<u32, ClientError> {
    let metadata = client.metadata_for(&record.topic).await?;
    let count = metadata.partition_count(&record.topic)?;
    match (record.partition, &record.key) {
        (Some(partition), _) if partition < count => Ok(partition),
        (Some(partition), _) => Err(ClientError::UnknownPartition {
            topic: record.topic.clone(),
            partition,
        }),
        (None, Some(key)) => Ok(partition_for_key(key, count)),
        (None, None) => Ok(round_robin.fetch_add(1, Ordering::Relaxed) % count),
    }
}

/// The key-hash partitioner: the same key always lands on the same partition.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    crc32c::crc32c(key) % partitions
}

/// Seals an accumulator and queues it on its partition's sender task.
async fn dispatch(
    client: &Arc<Client>,
    config: &ProducerConfig,
    senders: &mut HashMap<(String, u32), mpsc::Sender<Sealed>>,
    key: (String, u32),
    mut accumulator: Accumulator,
    done: Option<oneshot::Sender<()>>,
) {
    let sealed = Sealed {
        batch: accumulator.builder.finish(),
        replies: accumulator.replies,
        done,
    };
    let sender = senders.entry(key.clone()).or_insert_with(|| {
        let (sender, receiver) = mpsc::channel(config.max_queued_batches);
        tokio::spawn(send_partition(
            client.clone(),
            config.clone(),
            key,
            receiver,
        ));
        sender
    });
    // Waiting here is the backpressure: a slow partition slows `send`.
    let _ = sender.send(sealed).await;
}

/// Sends one partition's batches in order, one request at a time, retrying retriable errors.
async fn send_partition(
    client: Arc<Client>,
    config: ProducerConfig,
    (topic, partition): (String, u32),
    mut batches: mpsc::Receiver<Sealed>,
) {
    while let Some(sealed) = batches.recv().await {
        if sealed.batch.is_empty() {
            if let Some(done) = sealed.done {
                let _ = done.send(());
            }
            continue;
        }
        let result = send_with_retries(&client, &config, &topic, partition, sealed.batch).await;
        for (index, reply) in sealed.replies.into_iter().enumerate() {
            let _ = reply.send(result.clone().map(|base_offset| RecordMetadata {
                partition,
                offset: if base_offset < 0 {
                    -1
                } else {
                    base_offset + index as i64
                },
            }));
        }
        if let Some(done) = sealed.done {
            let _ = done.send(());
        }
    }
}

async fn send_with_retries(
    client: &Client,
    config: &ProducerConfig,
    topic: &str,
    partition: u32,
    batch: Bytes,
) -> Result<i64, ClientError> {
    let mut attempt = 0;
    loop {
        let result = send_once(client, config, topic, partition, batch.clone()).await;
        match result {
            Err(error) if error.is_retriable() && attempt < config.retries => {
                attempt += 1;
                tracing::debug!(%topic, partition, attempt, "retrying produce: {error}");
                tokio::time::sleep(config.retry_backoff * attempt.min(10)).await;
                let _ = client.refresh_metadata().await;
            }
            result => return result,
        }
    }
}

async fn send_once(
    client: &Client,
    config: &ProducerConfig,
    topic: &str,
    partition: u32,
    batch: Bytes,
) -> Result<i64, ClientError> {
    let metadata = client.metadata_for(topic).await?;
    let address = metadata.leader_address(topic, partition, client.config().shard_aware)?;
    let request = Request::Produce(ProduceRequest {
        acks: config.acks,
        timeout_ms: client.config().request_timeout.as_millis() as u32,
        topics: vec![ProduceTopic {
            name: topic.to_string(),
            partitions: vec![ProducePartition {
                partition,
                records: Records::Shared(batch),
            }],
        }],
    });
    if config.acks == ACKS_NONE {
        client
            .connection(&address)
            .await?
            .send_without_response(request)
            .await?;
        return Ok(-1);
    }
    let Response::Produce(response) = client.request(&address, request).await? else {
        return Err(ClientError::Protocol(
            "produce answered with another api".into(),
        ));
    };
    let answer = response
        .topics
        .first()
        .and_then(|topic| topic.partitions.first())
        .ok_or_else(|| ClientError::Protocol("empty produce response".into()))?;
    if answer.error != ErrorCode::None {
        return Err(ClientError::Partition {
            topic: topic.to_string(),
            partition,
            code: answer.error,
        });
    }
    Ok(answer.base_offset as i64)
}
