//! What a bench run is asked to do: the workload, its size and pace, its records and keys, the
//! client and protocol, transactions.

use std::time::Duration;

use serde::Serialize;
use strata_client::{ClientConfig, Codec, ConsumerConfig, IsolationLevel, ProducerConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Produce,
    Consume,
    E2e,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDistribution {
    /// No keys: the producer's sticky partitioner fills one partition a batch at a time.
    None,
    Uniform,
    /// Zipf (s = 1) over the key space: a few hot keys, a long tail.
    Zipf,
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub workload: Workload,
    pub bootstrap: String,
    /// TCP congestion control of the bench's connections; `None`: the host's default.
    pub tcp_congestion: Option<String>,
    /// TLS and SASL of the bench's connections.
    pub security: strata_client::Security,
    pub topic: String,
    pub partitions: u32,
    /// Producers write to the topic's first this many partitions only (default: all of them):
    /// a load across some partitions of a topic of many.
    pub spread: Option<u32>,
    pub replication_factor: u16,
    pub min_insync: Option<u16>,
    /// Topic settings (Kafka-style keys) when the bench creates the topic.
    pub topic_config: Vec<(String, String)>,
    pub producers: usize,
    pub consumers: usize,
    /// Each producer and consumer connects on its own, as separate processes would (default:
    /// the bench's native producers and consumers share one connection per broker).
    pub own_connections: bool,
    pub record_size: usize,
    pub batch_bytes: usize,
    pub linger: Duration,
    /// Produce requests in flight per partition (the producer's `max_in_flight`).
    pub max_in_flight: usize,
    /// Bytes one fetch may bring per partition (the consumer's `partition_max_bytes`).
    pub partition_fetch_bytes: u32,
    pub acks: i8,
    /// Records per second over all producers; `None` sends as fast as acks allow.
    pub rate: Option<f64>,
    pub duration: Option<Duration>,
    pub records: Option<u64>,
    /// Records acknowledged before this much time has passed are not measured.
    pub warmup: Duration,
    pub key_distribution: KeyDistribution,
    pub keys: u64,
    /// Print records/s and MB/s every second on stderr (the CLI turns it on for a terminal).
    pub progress: bool,
    /// Generate and batch records exactly as producers would, then drop them: measures what
    /// the tool itself can sustain, with no broker (produce workload only).
    pub null_sink: bool,
    /// Mirror `iggy-bench pinned-producer`: producer `i` writes only partition `i`, batches hold
    /// exactly `batch_records` records, and per-batch latency is reported beside per-record.
    pub pinned: bool,
    pub batch_records: Option<usize>,
    /// Producers are idempotent (producer id + sequences; implies acks=all).
    pub idempotent: bool,
    /// Producers ask the leader to sync each batch before acknowledging it, whatever the
    /// topic's flush policy.
    pub sync_before_ack: bool,
    /// Producers write in transactions (implies idempotent), each committed once it holds
    /// this many records or is this old.
    pub transactions: Option<TxnSpan>,
    /// Consumers read committed records only: up to the last stable offset, without aborted
    /// transactions' records (Kafka's `isolation.level=read_committed`).
    pub read_committed: bool,
    /// The brokers' admin endpoints (`HOST:PORT`): their `process_cpu_seconds_total` is read
    /// as the measured run starts and ends, for the brokers' CPU per GB moved.
    pub broker_admins: Vec<String>,
    /// How producers compress batch bodies.
    pub compression: Codec,
    /// Consumers join this consumer group (subscribe mode, auto-commit) instead of splitting
    /// the partitions among themselves.
    pub group: Option<String>,
    /// Consumers join this share group (KIP-932) instead: records are shared one by one, each
    /// accepted once counted.
    pub share_group: Option<String>,
    /// The most records a share consumer asks for in one fetch.
    pub max_poll_records: u32,
    /// How long a consumer spends on each record before the next (an application's work).
    pub process_per_record: Duration,
    /// What the bench's clients speak: Strata's protocol (its own client) or Kafka's
    /// (librdkafka), against any Kafka-compatible broker.
    pub protocol: Protocol,
}

/// A bench's clients' protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Native,
    Kafka,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            workload: Workload::Produce,
            bootstrap: "127.0.0.1:7300".into(),
            tcp_congestion: Some(strata_client::DEFAULT_TCP_CONGESTION.to_string()),
            security: strata_client::Security::default(),
            topic: "strata-bench".into(),
            partitions: 4,
            spread: None,
            replication_factor: 1,
            min_insync: None,
            topic_config: Vec::new(),
            producers: 2,
            consumers: 1,
            own_connections: false,
            record_size: 1024,
            batch_bytes: 1 << 20,
            linger: Duration::from_millis(2),
            max_in_flight: ProducerConfig::default().max_in_flight,
            partition_fetch_bytes: 4 << 20,
            acks: 1,
            rate: None,
            duration: Some(Duration::from_secs(10)),
            records: None,
            warmup: Duration::ZERO,
            key_distribution: KeyDistribution::None,
            keys: 1000,
            progress: false,
            null_sink: false,
            pinned: false,
            batch_records: None,
            idempotent: false,
            sync_before_ack: false,
            transactions: None,
            read_committed: false,
            broker_admins: Vec::new(),
            compression: Codec::None,
            group: None,
            share_group: None,
            max_poll_records: strata_client::ShareConfig::DEFAULT_MAX_RECORDS,
            process_per_record: Duration::ZERO,
            protocol: Protocol::Native,
        }
    }
}

/// When a transactional producer commits: after `records` records or `age`, whichever first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TxnSpan {
    pub records: Option<u64>,
    pub age: Duration,
}

impl Default for TxnSpan {
    /// 100 ms transactions, as a stream processor's commit interval.
    fn default() -> Self {
        TxnSpan {
            records: None,
            age: Duration::from_millis(100),
        }
    }
}

impl BenchConfig {
    /// Producer `index`'s settings.
    pub(crate) fn producer_config(&self, index: usize) -> ProducerConfig {
        ProducerConfig {
            acks: self.acks,
            batch_bytes: self.batch_bytes,
            linger: self.linger,
            max_in_flight: self.max_in_flight,
            batch_records: self.batch_records,
            idempotent: self.idempotent || self.transactions.is_some(),
            transactional_id: self
                .transactions
                .map(|_| format!("strata-bench-{}-{index}", std::process::id())),
            compression: self.compression,
            sync_before_ack: self.sync_before_ack,
            ..ProducerConfig::default()
        }
    }

    /// Each consumer's settings.
    pub(crate) fn consumer_config(&self) -> ConsumerConfig {
        ConsumerConfig {
            max_wait: Duration::from_millis(100),
            partition_max_bytes: self.partition_fetch_bytes,
            isolation: if self.read_committed {
                IsolationLevel::ReadCommitted
            } else {
                IsolationLevel::ReadUncommitted
            },
            ..ConsumerConfig::default()
        }
    }

    /// How the bench's clients connect.
    pub(crate) fn client_config(&self) -> ClientConfig {
        ClientConfig {
            tcp_congestion: self.tcp_congestion.clone(),
            security: self.security.clone(),
            ..ClientConfig::new(&self.bootstrap)
        }
    }
}
