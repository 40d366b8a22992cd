//! `strata bench --protocol kafka`: the same workloads, pacing and measurements through a real
//! Kafka client, librdkafka (the `rdkafka` crate, which builds and links it statically),
//! against any Kafka-compatible broker: Strata's Kafka listener, Tansu, Kafka, Redpanda.
//!
//! The bench chooses every record's partition itself, as the native path does (keyed records
//! by the same hash as Strata's client, others a batch's worth at a time per partition), so
//! acknowledgements of one partition come in order and each record is charged only its own
//! wait (see `AcksInFlight`), and both protocols spread the same records the same way.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::FutureExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use strata_client::{Codec, RecordMetadata};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::BenchConfig;
use crate::consume::RecordCounter;
use crate::produce::PartitionChooser;

/// The client the report names.
pub fn client_name() -> String {
    let (_, version) = rdkafka::util::get_rdkafka_version();
    format!("librdkafka {version} (rdkafka crate)")
}

/// What the Kafka path cannot do, refused before anything runs.
pub fn check(config: &BenchConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.security.tls.is_none() && config.security.sasl.is_none(),
        "--protocol kafka connects in plaintext only"
    );
    anyhow::ensure!(
        config.transactions.is_none(),
        "--protocol kafka does not write transactions"
    );
    anyhow::ensure!(
        !config.sync_before_ack,
        "--durability synced is Strata's own: Kafka's protocol cannot ask for it"
    );
    Ok(())
}

/// `bootstrap.servers` from the bench's bootstrap list (`plaintext://` and the like dropped).
pub(crate) fn bootstrap_servers(bootstrap: &str) -> String {
    bootstrap
        .split(',')
        .map(|address| address.rsplit_once("://").map_or(address, |(_, rest)| rest))
        .collect::<Vec<_>>()
        .join(",")
}

fn base_config(config: &BenchConfig) -> rdkafka::ClientConfig {
    let mut kafka = rdkafka::ClientConfig::new();
    kafka
        .set("bootstrap.servers", bootstrap_servers(&config.bootstrap))
        .set("client.id", format!("strata-bench-{}", std::process::id()));
    kafka
}

/// The topic's partition count, creating the topic first if it does not exist (refused for a
/// consume run, which reads what a produce run stored).
pub async fn ensure_topic(config: &BenchConfig) -> anyhow::Result<u32> {
    let admin: AdminClient<DefaultClientContext> = base_config(config)
        .create()
        .context("starting the Kafka admin client")?;
    if let Some(partitions) = partition_count(&admin, &config.topic)? {
        return Ok(partitions);
    }
    anyhow::ensure!(
        config.workload != crate::Workload::Consume,
        "topic {} does not exist: a consume run reads what a produce run stored",
        config.topic
    );
    let mut settings: Vec<(String, String)> = config.topic_config.clone();
    if let Some(min) = config.min_insync {
        settings.push(("min.insync.replicas".to_string(), min.to_string()));
    }
    let replication = TopicReplication::Fixed(i32::from(config.replication_factor));
    let mut topic = NewTopic::new(&config.topic, config.partitions as i32, replication);
    for (key, value) in &settings {
        topic = topic.set(key, value);
    }
    let results = admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .with_context(|| format!("creating topic {}", config.topic))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("creating topic {name}: {code}"),
        }
    }
    // Brokers learn of a new topic a moment after it is made.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(partitions) = partition_count(&admin, &config.topic)? {
            return Ok(partitions);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "topic {} created but not in the metadata after 30 s",
            config.topic
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The topic's partitions as the metadata says, `None` while it is unknown.
fn partition_count(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> anyhow::Result<Option<u32>> {
    // librdkafka's metadata call blocks the thread: only while the run is set up, before any
    // load.
    let metadata = admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("reading the topic's metadata")?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.partitions().len() as u32))
}

/// One bench producer over Kafka's protocol.
pub struct KafkaProducer {
    producer: FutureProducer,
    /// Bytes handed to librdkafka and not yet acknowledged, bounded as the native producer
    /// bounds them (`buffer_bytes`): a send waits for room, so an unpaced producer cannot
    /// queue far ahead of the broker, and the tasks collecting acknowledgements get to run.
    buffer: Arc<Semaphore>,
    buffer_bytes: usize,
    /// Where records without a partition go.
    chooser: Mutex<PartitionChooser>,
    /// Sends refused for a full local queue, each retried after a pause.
    queue_full: AtomicU64,
}

impl KafkaProducer {
    /// Producer `index` with the bench's settings, on a topic of `partitions`.
    pub fn new(config: &BenchConfig, index: usize, partitions: u32) -> anyhow::Result<Self> {
        let producer_config = config.producer_config(index);
        let mut kafka = base_config(config);
        kafka
            .set("acks", producer_config.acks.to_string())
            .set(
                "linger.ms",
                format!("{}", config.linger.as_secs_f64() * 1e3),
            )
            .set("batch.size", config.batch_bytes.to_string())
            .set(
                "max.in.flight.requests.per.connection",
                config.max_in_flight.max(1).to_string(),
            )
            .set("enable.idempotence", producer_config.idempotent.to_string())
            .set(
                "queue.buffering.max.kbytes",
                (producer_config.buffer_bytes / 1024).to_string(),
            )
            .set("queue.buffering.max.messages", "10000000")
            .set(
                "compression.type",
                match config.compression {
                    Codec::None => "none",
                    Codec::Lz4 => "lz4",
                    Codec::Zstd => "zstd",
                },
            );
        let producer = kafka.create().context("starting the Kafka producer")?;
        Ok(KafkaProducer {
            producer,
            buffer: Arc::new(Semaphore::new(producer_config.buffer_bytes)),
            buffer_bytes: producer_config.buffer_bytes,
            chooser: Mutex::new(PartitionChooser::new(partitions, config.batch_bytes, index)),
            queue_full: AtomicU64::new(0),
        })
    }

    /// Where a record goes: its partition, else its key's, else the sticky one.
    fn partition_for(&self, partition: Option<u32>, key: Option<&[u8]>, bytes: usize) -> u32 {
        if let Some(partition) = partition {
            return partition;
        }
        self.chooser
            .lock()
            .expect("partition chooser")
            .next(key, bytes)
    }

    /// Hands a record to librdkafka; the ack resolves when the broker answered it. Waits only
    /// while librdkafka's queue is full.
    pub async fn send(
        &self,
        topic: &str,
        (partition, key): (Option<u32>, Option<&[u8]>),
        value: &[u8],
        timestamp_ms: i64,
    ) -> anyhow::Result<(u32, KafkaAck)> {
        let partition = self.partition_for(partition, key, value.len());
        let room = value.len().clamp(1, self.buffer_bytes) as u32;
        let room = self
            .buffer
            .clone()
            .acquire_many_owned(room)
            .await
            .context("the producer's buffer closed")?;
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .partition(partition as i32)
            .timestamp(timestamp_ms);
        if let Some(key) = key {
            record = record.key(key);
        }
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok((partition, KafkaAck(delivery, Some(room)))),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    self.queue_full.fetch_add(1, Ordering::Relaxed);
                    record = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, _)) => return Err(error).context("producing"),
            }
        }
    }
}

/// A record's acknowledgement from librdkafka's delivery report, holding the record's room in
/// its producer's buffer until then.
pub struct KafkaAck(DeliveryFuture, Option<OwnedSemaphorePermit>);

impl Future for KafkaAck {
    type Output = anyhow::Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let delivered = std::task::ready!(self.0.poll_unpin(context));
        self.1 = None;
        Poll::Ready(match delivered {
            Ok(Ok(delivery)) => Ok(RecordMetadata {
                partition: delivery.partition as u32,
                offset: delivery.offset,
                // Kafka's answer does not say.
                durability: None,
            }),
            Ok(Err((error, _))) => Err(anyhow::Error::from(error).context("a record failed")),
            Err(_) => Err(anyhow::anyhow!(
                "the producer closed before the record's answer"
            )),
        })
    }
}

/// A consumer of `partitions` (from `start`), or of the bench's group when it has one, until
/// `stop`; counts what it reads into `counter`.
pub async fn consume(
    config: &BenchConfig,
    partitions: Vec<u32>,
    start: Offset,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut counter: RecordCounter,
) -> anyhow::Result<RecordCounter> {
    let mut kafka = base_config(config);
    kafka
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set(
            "max.partition.fetch.bytes",
            config.partition_fetch_bytes.to_string(),
        )
        .set("fetch.wait.max.ms", "100")
        .set(
            "isolation.level",
            if config.read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        );
    let consumer: StreamConsumer = match &config.group {
        Some(group) => {
            kafka
                .set("group.id", group)
                .set("enable.auto.commit", "true")
                .set(
                    "auto.offset.reset",
                    if start == Offset::Beginning {
                        "earliest"
                    } else {
                        "latest"
                    },
                );
            let consumer: StreamConsumer = kafka.create().context("starting a Kafka consumer")?;
            consumer.subscribe(&[config.topic.as_str()])?;
            consumer
        }
        None => {
            // librdkafka wants a group id even to read assigned partitions; nothing is
            // committed under it.
            kafka.set("group.id", format!("strata-bench-{}", std::process::id()));
            let consumer: StreamConsumer = kafka.create().context("starting a Kafka consumer")?;
            let mut assignment = TopicPartitionList::new();
            for partition in partitions {
                assignment.add_partition_offset(&config.topic, partition as i32, start)?;
            }
            consumer.assign(&assignment)?;
            consumer
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let message = tokio::select! {
            message = consumer.recv() => message,
            _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
        };
        let message = message.context("consuming")?;
        counter.count(std::iter::once(message.payload().unwrap_or_default()));
    }
    Ok(counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_servers_drop_the_scheme() {
        assert_eq!(
            bootstrap_servers("plaintext://127.0.0.1:9092,h:9093"),
            "127.0.0.1:9092,h:9093"
        );
    }
}
