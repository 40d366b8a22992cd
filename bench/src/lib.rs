//! `strata bench`: load against a running cluster, measured honestly.
//!
//! - Open loop with coordinated-omission correction: with `--rate`, every record has an
//!   intended send time and its latency runs from that time, so a stalled broker shows up in the
//!   tail instead of slowing the generator down and hiding.
//! - HDR histograms (`hdrhistogram`), one per producer or consumer task, merged at the end.
//! - End-to-end latency comes from the intended send time (µs since the epoch) that producers
//!   write into the first 8 bytes of every value; consumers subtract it from the time they see
//!   the record. Producer and consumer share this host's clock.
//!
//! The report's JSON field names are a contract (DESIGN §9): `workload`, `records`, `bytes`,
//! `duration_s`, `records_per_s`, `mb_per_s` (MB = 10^6 bytes), `ack_latency_us` and
//! `e2e_latency_us` with `p50`, `p90`, `p99`, `p999`, `p9999`, `max`; added since:
//! `compression`, `sent_batch_bytes`, `compression_ratio`, `host`.

mod kafka;
pub mod pacing;
pub mod scale;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use strata_client::{
    AckDurability, Client, ClientConfig, Codec, Consumer, ConsumerConfig, GroupConfig,
    GroupConsumer, IsolationLevel, OffsetReset, Producer, ProducerConfig, ProducerRecord,
    RecordMetadata, SeekTo,
};

use pacing::{PreciseTimer, Schedule, on_own_runtime, on_pacing_thread};

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
    fn producer_config(&self, index: usize) -> ProducerConfig {
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
    fn consumer_config(&self) -> ConsumerConfig {
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
    fn client_config(&self) -> ClientConfig {
        ClientConfig {
            tcp_congestion: self.tcp_congestion.clone(),
            security: self.security.clone(),
            ..ClientConfig::new(&self.bootstrap)
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub p9999: u64,
    pub max: u64,
    pub count: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            p9999: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
            count: histogram.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: Workload,
    pub topic: String,
    /// The producers' codec (`none`, `lz4`, `zstd`); `bytes` and `mb_per_s` count record
    /// bytes before compression.
    pub compression: &'static str,
    /// The client that produced and consumed, and its protocol: Strata's own client, or
    /// librdkafka (`--protocol kafka`) with its version.
    pub client: String,
    /// Bytes of the batches producers sent (warmup included), as they went on the wire and to
    /// disk: after compression, with batch headers and record entries. 0 without producers.
    pub sent_batch_bytes: u64,
    /// Record bytes sent per batch byte sent (warmup included): what the codec saved, net of
    /// the batch format's own bytes. Absent without producers.
    pub compression_ratio: Option<f64>,
    /// Records measured (acknowledged for produce, received for consume and e2e).
    pub records: u64,
    pub bytes: u64,
    pub duration_s: f64,
    pub records_per_s: f64,
    /// MB = 10^6 bytes.
    pub mb_per_s: f64,
    pub target_rate: Option<f64>,
    /// CPU the bench process itself used over the run, in % of one core (user + system), so a
    /// reader can tell whether the tool or the broker was the limit.
    pub bench_cpu_percent: f64,
    /// CPU seconds the brokers (`--broker-admin`) used over the measured run, and per GB of
    /// record bytes measured: what a broker costs, steadier than throughput on a noisy host.
    /// Absent without `--broker-admin`, or when a broker could not be read.
    pub broker_cpu_seconds: Option<f64>,
    pub broker_cpu_s_per_gb: Option<f64>,
    /// Time during the run in which some task on the host stalled waiting for memory (the
    /// kernel's pressure stall information, `/proc/pressure/memory`), in ms; `None` where the
    /// kernel keeps none. Page-cache reclaim under a broker shows here: a produce run that grew
    /// the page cache into full memory stalled 215 ms where the same run with free memory
    /// stalled none (docs/performance.md).
    pub memory_stall_ms: Option<f64>,
    /// Consume and e2e runs: from the run's start until every consumer had its first record
    /// (a group's members joined, were assigned partitions and fetched). Absent when one never
    /// got a record (more group members than partitions), and without consumers.
    pub consumers_ready_s: Option<f64>,
    pub ack_latency_us: Option<Percentiles>,
    /// The measured records by how durable their acknowledgements said they were (empty with
    /// `acks=0` and without producers).
    pub ack_durability: Vec<DurabilityShare>,
    /// Per batch (pinned presets): from the batch's first record's send time to its last ack,
    /// as iggy-bench reports it.
    pub batch_latency_us: Option<Percentiles>,
    /// Transactional producers: each commit, from the `EndTxn` request (the transaction's
    /// records all acknowledged) to its answer. `count` is the transactions committed.
    pub commit_latency_us: Option<Percentiles>,
    pub e2e_latency_us: Option<Percentiles>,
    /// Records measured in each second of the run (produced and consumed).
    pub timeline: Vec<TimelinePoint>,
    /// The machine as the run started: on a VM whose free memory is slow to touch, the page
    /// cache and free memory move a run's figures more than most code changes do.
    pub host: HostState,
}

/// What `/proc/meminfo` and the CPU count said when a run started.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct HostState {
    pub cpus: usize,
    pub mem_total_mb: u64,
    pub mem_free_mb: u64,
    /// Page cache (`Cached`), in MB.
    pub page_cache_mb: u64,
    pub dirty_mb: u64,
    /// How long an idle vCPU of a KVM guest polls before it halts (the `haltpoll` cpuidle
    /// driver's `guest_halt_poll_ns`); `None` under another driver (bare metal) or unreadable.
    /// 0 puts every wake-up through the hypervisor, which moved small-message figures threefold
    /// on a 2-vCPU guest (docs/performance.md).
    pub guest_halt_poll_ns: Option<u64>,
}

impl HostState {
    /// The machine now; fields it cannot read stay 0 (or `None`).
    pub fn now() -> HostState {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostState {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
            guest_halt_poll_ns: match strata_tuning::guest_halt_poll_ns(&strata_tuning::Host::live())
            {
                Ok(strata_tuning::HaltPolling::Polls(ns)) => Some(ns),
                _ => None,
            },
            ..HostState::from_meminfo(&meminfo)
        }
    }

    fn from_meminfo(meminfo: &str) -> HostState {
        let mb = |key: &str| {
            meminfo
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kb| kb / 1024)
        };
        HostState {
            cpus: 0,
            mem_total_mb: mb("MemTotal"),
            mem_free_mb: mb("MemFree"),
            page_cache_mb: mb("Cached"),
            dirty_mb: mb("Dirty"),
            guest_halt_poll_ns: None,
        }
    }
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cpus, {:.1} GB free, {:.1} GB page cache, {} MB dirty",
            self.cpus,
            self.mem_free_mb as f64 / 1024.0,
            self.page_cache_mb as f64 / 1024.0,
            self.dirty_mb
        )?;
        if let Some(poll_ns) = self.guest_halt_poll_ns {
            write!(f, ", guest halt polling {poll_ns} ns")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    pub second: u64,
    pub produced_records: u64,
    pub consumed_records: u64,
    /// Ack latency p99 of the records acknowledged in this second (µs); absent without acks.
    pub ack_p99_us: Option<u64>,
    /// End-to-end latency p99 of the records consumed in this second (µs).
    pub e2e_p99_us: Option<u64>,
}

/// One second's latencies (for the HDR interval log).
pub struct IntervalHistograms {
    /// Seconds since the start of the run at the end of this interval.
    pub second: u64,
    pub ack: Histogram<u64>,
    pub e2e: Histogram<u64>,
}

/// The measured histograms, for HDR interval logs and merging.
pub struct Histograms {
    pub ack: Histogram<u64>,
    pub batch: Histogram<u64>,
    pub commit: Histogram<u64>,
    pub e2e: Histogram<u64>,
    /// Per second of the run, as the progress ticker cut them.
    pub intervals: Vec<IntervalHistograms>,
}

impl Histograms {
    fn empty() -> Histograms {
        Histograms {
            ack: histogram(),
            batch: histogram(),
            commit: histogram(),
            e2e: histogram(),
            intervals: Vec::new(),
        }
    }
}

/// What one producer measured: per record, per batch (pinned presets), per commit
/// (transactional producers), and the bytes acknowledged.
struct ProducerMeasures {
    records: Histogram<u64>,
    batches: Histogram<u64>,
    commits: Histogram<u64>,
    bytes: u64,
    durability: DurabilityTally,
}

impl ProducerMeasures {
    fn new() -> ProducerMeasures {
        ProducerMeasures {
            records: histogram(),
            batches: histogram(),
            commits: histogram(),
            bytes: 0,
            durability: DurabilityTally::default(),
        }
    }

    fn add(&mut self, other: &ProducerMeasures) -> anyhow::Result<()> {
        self.records.add(&other.records)?;
        self.batches.add(&other.batches)?;
        self.commits.add(&other.commits)?;
        self.bytes += other.bytes;
        self.durability.add(&other.durability);
        Ok(())
    }
}

/// Measured records by the durability their acknowledgement reported: (in-sync replicas
/// holding them, of those synced) → records. A handful of entries: a linear scan beats a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DurabilityTally(Vec<((u16, u16), u64)>);

impl DurabilityTally {
    fn count(&mut self, durability: Option<AckDurability>, records: u64) {
        let Some(durability) = durability else {
            return;
        };
        let level = (durability.replicas, durability.synced_replicas);
        match self.0.iter_mut().find(|(at, _)| *at == level) {
            Some((_, count)) => *count += records,
            None => self.0.push((level, records)),
        }
    }

    fn add(&mut self, other: &DurabilityTally) {
        for &((replicas, synced_replicas), records) in &other.0 {
            let durability = AckDurability {
                replicas,
                synced_replicas,
                ..AckDurability::default()
            };
            self.count(Some(durability), records);
        }
    }

    /// The report's view: each level's records and share, most replicas and syncs first.
    fn shares(&self) -> Vec<DurabilityShare> {
        let total: u64 = self.0.iter().map(|(_, records)| records).sum();
        let mut shares: Vec<DurabilityShare> = self
            .0
            .iter()
            .map(|&((replicas, synced_replicas), records)| DurabilityShare {
                replicas,
                synced_replicas,
                records,
                share: records as f64 / total.max(1) as f64,
            })
            .collect();
        shares.sort_by_key(|s| std::cmp::Reverse((s.replicas, s.synced_replicas)));
        shares
    }
}

/// How many of the measured records were acknowledged at one durability.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DurabilityShare {
    /// In-sync replicas holding the records when acknowledged, the leader included.
    pub replicas: u16,
    /// Of those, how many had synced them to disk.
    pub synced_replicas: u16,
    pub records: u64,
    /// Of the records measured, 0 to 1.
    pub share: f64,
}

/// What an acknowledgement says of durability, where it says anything.
trait AckReport {
    fn durability(&self) -> Option<AckDurability>;
}

impl AckReport for RecordMetadata {
    fn durability(&self) -> Option<AckDurability> {
        self.durability
    }
}

impl AckReport for () {
    fn durability(&self) -> Option<AckDurability> {
        None
    }
}

/// Latency since the last progress tick, one histogram per producer or consumer task (its own
/// lock, uncontended but for the tick that empties it once a second).
type IntervalRecorder = Arc<std::sync::Mutex<Histogram<u64>>>;

#[derive(Clone, Default)]
struct IntervalRecorders {
    recorders: Arc<std::sync::Mutex<Vec<IntervalRecorder>>>,
}

/// Where a producer counts what was acknowledged: the run's total and this second's latency;
/// and, once it is done, what it sent.
struct Tally {
    produced: Arc<AtomicU64>,
    interval: IntervalRecorder,
    sent: Arc<SentBytes>,
}

/// What all producers sent, warmup included: record bytes, and the batches that carried them
/// as they went on the wire (after compression).
#[derive(Default)]
struct SentBytes {
    records: AtomicU64,
    batches: AtomicU64,
}

impl SentBytes {
    fn add(&self, records: u64, batch_bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.batches.fetch_add(batch_bytes, Ordering::Relaxed);
    }
}

impl IntervalRecorders {
    /// A recorder for one more task.
    fn recorder(&self) -> IntervalRecorder {
        let recorder = Arc::new(std::sync::Mutex::new(histogram()));
        self.recorders
            .lock()
            .expect("recorders")
            .push(recorder.clone());
        recorder
    }

    /// Everything recorded since the last call, merged; the recorders start afresh.
    fn take(&self) -> Histogram<u64> {
        let mut merged = histogram();
        for recorder in self.recorders.lock().expect("recorders").iter() {
            let mut recorder = recorder.lock().expect("recorder");
            let _ = merged.add(&*recorder);
            recorder.reset();
        }
        merged
    }
}

fn p99(histogram: &Histogram<u64>) -> Option<u64> {
    (!histogram.is_empty()).then(|| histogram.value_at_quantile(0.99))
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// Where a record goes when the bench picks partitions itself (over Kafka's protocol, or with
/// `spread`): its key's partition by Strata's hash, else one partition a batch's worth of bytes
/// at a time, as the native client's sticky partitioner does.
pub(crate) struct PartitionChooser {
    partitions: u32,
    batch_bytes: usize,
    sticky: u32,
    filled: usize,
}

impl PartitionChooser {
    /// Over partitions `0..partitions`; producer `index` starts at its own partition.
    pub(crate) fn new(partitions: u32, batch_bytes: usize, index: usize) -> PartitionChooser {
        let partitions = partitions.max(1);
        PartitionChooser {
            partitions,
            batch_bytes: batch_bytes.max(1),
            sticky: (index % partitions as usize) as u32,
            filled: 0,
        }
    }

    /// The partition of a record of `bytes` with `key`.
    pub(crate) fn next(&mut self, key: Option<&[u8]>, bytes: usize) -> u32 {
        if let Some(key) = key {
            return strata_client::partition_for_key(key, self.partitions);
        }
        let chosen = self.sticky;
        self.filled += bytes;
        if self.filled >= self.batch_bytes {
            (self.sticky, self.filled) = ((chosen + 1) % self.partitions, 0);
        }
        chosen
    }
}

/// Runs the workload against the cluster at `config.bootstrap`.
pub async fn run(config: &BenchConfig) -> anyhow::Result<(Report, Histograms)> {
    anyhow::ensure!(
        config.record_size >= 8,
        "--record-size must be at least 8 bytes"
    );
    anyhow::ensure!(
        config.duration.is_some() || config.records.is_some(),
        "give --duration or --records"
    );
    anyhow::ensure!(
        config.transactions.is_none() || !config.pinned,
        "the pinned presets do not write transactions"
    );
    if config.null_sink {
        return null_sink(config).await;
    }
    let (client, partitions) = match config.protocol {
        Protocol::Native => {
            let (client, partitions) = native_topic(config).await?;
            (Some(client), partitions)
        }
        Protocol::Kafka => {
            kafka::check(config)?;
            (None, kafka::ensure_topic(config).await?)
        }
    };
    if let Some(spread) = config.spread {
        anyhow::ensure!(
            (1..=partitions).contains(&spread),
            "--spread {spread}: the topic has {partitions} partitions"
        );
    }
    run_measured(config, (client, partitions)).await
}

/// A native client, and the topic's partition count once it exists (created if a produce run
/// needs it).
async fn native_topic(config: &BenchConfig) -> anyhow::Result<(Arc<Client>, u32)> {
    let client = Client::connect(config.client_config())
        .await
        .with_context(|| format!("connecting to {}", config.bootstrap))?;
    match client.metadata_for(&config.topic).await {
        Ok(_) => {}
        Err(strata_client::ClientError::UnknownTopic(_)) => {
            // A consume run reads what is there: on a topic it would create it would wait forever.
            anyhow::ensure!(
                config.workload != Workload::Consume,
                "topic {} does not exist: a consume run reads what a produce run stored (run `strata bench produce` with the same --topic, or --preset pinned-producer, first)",
                config.topic
            );
            let mut configs = config.topic_config.clone();
            if let Some(min) = config.min_insync {
                configs.push(("min.insync.replicas".to_string(), min.to_string()));
            }
            client
                .create_topic(
                    &config.topic,
                    config.partitions,
                    config.replication_factor,
                    &configs,
                )
                .await
                .with_context(|| format!("creating topic {}", config.topic))?;
        }
        Err(error) => {
            return Err(error).with_context(|| format!("looking up topic {}", config.topic));
        }
    }
    let partitions = client
        .metadata_for(&config.topic)
        .await?
        .partition_count(&config.topic)?;
    Ok((client, partitions))
}

/// The run, measured: see [`run`].
async fn run_measured(
    config: &BenchConfig,
    (client, partitions): (Option<Arc<Client>>, u32),
) -> anyhow::Result<(Report, Histograms)> {
    let host = HostState::now();
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    let memory_stalls_started = memory_stalls_us();
    let measure_from = started + config.warmup;
    let broker_cpu = BrokerCpu::start(&config.broker_admins, measure_from);
    // Producers stop at the deadline; consumers only once they have caught up.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let mut histograms = Histograms::empty();
    let (ack_intervals, e2e_intervals) =
        (IntervalRecorders::default(), IntervalRecorders::default());
    let intervals: Arc<std::sync::Mutex<Vec<IntervalHistograms>>> = Arc::default();
    let target_records = config.records;
    let produced = Arc::new(AtomicU64::new(0));
    let sent_bytes = Arc::new(SentBytes::default());
    let consumed = Arc::new(AtomicU64::new(0));
    // Every second: a timeline point (always), a progress line (on a terminal).
    let timeline: Arc<std::sync::Mutex<Vec<TimelinePoint>>> = Arc::default();
    let show_progress = config.progress;
    // Ends the ticker with a last point for the part of a second since its last tick, so the
    // timeline and the HDR log cover the whole run however its end falls between ticks.
    let run_over = Arc::new(tokio::sync::Notify::new());
    let progress = Some({
        let run_over = run_over.clone();
        let (produced, consumed) = (produced.clone(), consumed.clone());
        let record_size = config.record_size as f64;
        let timeline = timeline.clone();
        let (ack_intervals, e2e_intervals) = (ack_intervals.clone(), e2e_intervals.clone());
        let intervals = intervals.clone();
        let workload = config.workload;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            ticker.tick().await;
            let (mut last_produced, mut last_consumed) = (0u64, 0u64);
            loop {
                let last = tokio::select! {
                    _ = ticker.tick() => false,
                    _ = run_over.notified() => true,
                };
                let (p, c) = (
                    produced.load(Ordering::Relaxed),
                    consumed.load(Ordering::Relaxed),
                );
                let (ack, e2e) = (ack_intervals.take(), e2e_intervals.take());
                if last && p == last_produced && c == last_consumed && ack.is_empty() {
                    return;
                }
                let (ack_p99_us, e2e_p99_us) = (p99(&ack), p99(&e2e));
                let mut points = timeline.lock().expect("timeline");
                let second = points.len() as u64 + 1;
                points.push(TimelinePoint {
                    second,
                    produced_records: p - last_produced,
                    consumed_records: c - last_consumed,
                    ack_p99_us,
                    e2e_p99_us,
                });
                drop(points);
                intervals
                    .lock()
                    .expect("intervals")
                    .push(IntervalHistograms { second, ack, e2e });
                if last {
                    return;
                }
                if !show_progress {
                    (last_produced, last_consumed) = (p, c);
                    continue;
                }
                let ms = |us: Option<u64>| {
                    us.map_or("-".to_string(), |us| format!("{:.1}", us as f64 / 1e3))
                };
                // A bar for runs of a fixed size, as far as the counted side has got.
                let bar = target_records.map_or(String::new(), |target| {
                    let done = if workload == Workload::Consume { c } else { p };
                    progress_bar(done as f64 / target.max(1) as f64, 20) + " "
                });
                eprintln!(
                    "  {bar}produced {:>9.0} records/s {:>8.1} MB/s ack p99 {:>7} ms   consumed {:>9.0} records/s {:>8.1} MB/s e2e p99 {:>7} ms",
                    (p - last_produced) as f64,
                    (p - last_produced) as f64 * record_size / 1e6,
                    ms(ack_p99_us),
                    (c - last_consumed) as f64,
                    (c - last_consumed) as f64 * record_size / 1e6,
                    ms(e2e_p99_us),
                );
                (last_produced, last_consumed) = (p, c);
            }
        })
    });

    let consumer_tasks = start_consumers(
        config,
        (client.as_ref(), partitions),
        measure_from,
        (&e2e_intervals, &consumed, &stop_consumers),
    )
    .await?;

    let mut producer_tasks = Vec::new();
    if config.workload != Workload::Consume {
        let producers = config.producers.max(1);
        // Paced producers run on threads of their own, each with its own runtime and client:
        // one per PACED_RECORDS_PER_THREAD of the rate, at most one per producer and per core.
        let paced_threads = config
            .rate
            .map_or(1, |rate| (rate / PACED_RECORDS_PER_THREAD).ceil() as usize)
            .clamp(
                1,
                producers.min(
                    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                ),
            );
        let mut paced: Vec<Vec<PacedProducer>> = (0..paced_threads).map(|_| Vec::new()).collect();
        let run_config = config;
        for index in 0..producers {
            let producer_config = config.producer_config(index);
            let config = config.clone();
            let (stop, produced, sent) = (stop.clone(), produced.clone(), sent_bytes.clone());
            let interval = ack_intervals.recorder();
            let quota = config.records.map(|total| {
                total / producers as u64 + u64::from((index as u64) < total % producers as u64)
            });
            let (rate, pinned) = (config.rate, config.pinned);
            let make_task = move |producer: BenchProducer| ProducerTask {
                producer,
                config,
                index: index as u64,
                quota,
                stop,
                tally: Tally {
                    produced,
                    interval,
                    sent,
                },
                measure_from,
            };
            if rate.is_some() && !pinned {
                paced[index % paced_threads].push(PacedProducer {
                    index,
                    producer_config,
                    make_task: Box::new(make_task),
                });
                continue;
            }
            let producer = match &client {
                Some(client) => BenchProducer::Native(Producer::new(
                    client_for(run_config, client).await?,
                    producer_config,
                )),
                None => {
                    BenchProducer::Kafka(kafka::KafkaProducer::new(run_config, index, partitions)?)
                }
            };
            let task = make_task(producer);
            if rate.is_some() {
                // A pinned producer waits once per batch: a pacing thread of its own is cheap.
                producer_tasks.push(
                    on_pacing_thread(&format!("bench-producer-{index}"), || produce(task)).boxed(),
                );
            } else {
                // Unpaced producers stay on the runtime: on a thread of their own they would
                // pay a cross-thread wake-up per acknowledgement they wait for (the pinned
                // preset ran at 400-635 k records/s that way, 836-974 k on the runtime).
                let task = tokio::spawn(produce(task));
                producer_tasks.push(async move { Ok(task.await?) }.boxed());
            }
        }
        for (thread, group) in paced.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let connect = match config.protocol {
                Protocol::Native => Connect::Native(config.client_config(), config.own_connections),
                Protocol::Kafka => Connect::Kafka(Box::new(config.clone()), partitions),
            };
            let outcomes = on_own_runtime(&format!("bench-producers-{thread}"), move || {
                produce_paced_on_this_thread(connect, group)
            });
            producer_tasks.push(
                async move {
                    let mut merged = ProducerMeasures::new();
                    for outcome in outcomes.await? {
                        merged.add(&outcome?)?;
                    }
                    Ok(Ok(merged))
                }
                .boxed(),
            );
        }
    }

    // Wait for the end: the duration, or every producer's quota (then the consumers catch up).
    let deadline = config
        .duration
        .map(|duration| started + config.warmup + duration);
    let mut ack = histogram();
    let mut produced_bytes = 0u64;
    let mut durability = DurabilityTally::default();
    if producer_tasks.is_empty() {
        let target = config.records.unwrap_or(u64::MAX);
        while consumed.load(Ordering::Relaxed) < target
            && deadline.is_none_or(|deadline| Instant::now() < deadline)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    } else {
        if let Some(deadline) = deadline {
            tokio::time::sleep_until(deadline.into()).await;
            stop.store(true, Ordering::Relaxed);
        }
        for task in producer_tasks {
            let measures = task.await??;
            ack.add(&measures.records)?;
            histograms.batch.add(&measures.batches)?;
            histograms.commit.add(&measures.commits)?;
            durability.add(&measures.durability);
            produced_bytes += measures.bytes;
        }
        if config.workload == Workload::E2e {
            // Let consumers see what was produced (bounded wait).
            let target = produced.load(Ordering::Relaxed);
            let grace = Instant::now() + Duration::from_secs(10);
            while consumed.load(Ordering::Relaxed) < target && Instant::now() < grace {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let measured = Instant::now().saturating_duration_since(measure_from);
    let broker_cpu_seconds = broker_cpu.finish().await;
    stop.store(true, Ordering::Relaxed);
    stop_consumers.store(true, Ordering::Relaxed);
    let (consumed_bytes, all_reading) =
        finish_consumers(consumer_tasks, &mut histograms.e2e, started).await?;
    histograms.ack = ack;
    if let Some(progress) = progress {
        run_over.notify_one();
        progress.await?;
    }
    histograms.intervals = std::mem::take(&mut *intervals.lock().expect("intervals"));
    let (records, bytes) = match config.workload {
        Workload::Produce => (produced.load(Ordering::Relaxed), produced_bytes),
        Workload::Consume | Workload::E2e => (consumed.load(Ordering::Relaxed), consumed_bytes),
    };
    let seconds = measured.as_secs_f64().max(1e-9);
    let report = Report {
        workload: config.workload,
        topic: config.topic.clone(),
        compression: config.compression.name(),
        client: client_name(config.protocol),
        sent_batch_bytes: sent_bytes.batches.load(Ordering::Relaxed),
        compression_ratio: ratio(
            sent_bytes.records.load(Ordering::Relaxed),
            sent_bytes.batches.load(Ordering::Relaxed),
        ),
        records,
        bytes,
        duration_s: seconds,
        records_per_s: records as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        target_rate: config.rate,
        bench_cpu_percent: 100.0 * (cpu_seconds() - cpu_started)
            / started.elapsed().as_secs_f64().max(1e-9),
        broker_cpu_seconds,
        broker_cpu_s_per_gb: broker_cpu_seconds
            .filter(|_| bytes > 0)
            .map(|cpu| cpu / (bytes as f64 / 1e9)),
        memory_stall_ms: stalled_since(memory_stalls_started),
        consumers_ready_s: all_reading.map(|at| at.duration_since(started).as_secs_f64()),
        batch_latency_us: (config.pinned && config.workload == Workload::Produce)
            .then(|| Percentiles::of(&histograms.batch)),
        commit_latency_us: (config.transactions.is_some() && config.workload != Workload::Consume)
            .then(|| Percentiles::of(&histograms.commit)),
        ack_latency_us: (config.workload != Workload::Consume)
            .then(|| Percentiles::of(&histograms.ack)),
        ack_durability: durability.shares(),
        e2e_latency_us: (config.workload != Workload::Produce)
            .then(|| Percentiles::of(&histograms.e2e)),
        timeline: timeline.lock().expect("timeline").clone(),
        host,
    };
    Ok((report, histograms))
}

/// What a consumer task counts: end-to-end latency from the send time at the head of each value
/// (records measured only from `measure_from`), bytes, and the run's shared record count.
pub(crate) struct RecordCounter {
    measure_from: Instant,
    e2e: Histogram<u64>,
    interval: IntervalRecorder,
    bytes: u64,
    consumed: Arc<AtomicU64>,
    /// When this consumer received its first record (warmup or not).
    first_record: Option<Instant>,
}

impl RecordCounter {
    /// Values read together (a batch, or one message).
    pub(crate) fn count<'a>(&mut self, values: impl Iterator<Item = &'a [u8]>) {
        let seen = now_us();
        let mut values = values.peekable();
        if self.first_record.is_none() && values.peek().is_some() {
            self.first_record = Some(Instant::now());
        }
        if Instant::now() < self.measure_from {
            return;
        }
        let mut interval = self.interval.lock().expect("interval recorder");
        for value in values {
            if let Some(sent) = value.get(..8) {
                let sent = u64::from_le_bytes(sent.try_into().expect("8 bytes"));
                let latency = seen.saturating_sub(sent).max(1);
                let _ = self.e2e.record(latency);
                let _ = interval.record(latency);
            }
            self.bytes += value.len() as u64;
            self.consumed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

type ConsumerTask = tokio::task::JoinHandle<anyhow::Result<RecordCounter>>;

/// Waits for the (stopped) consumers: their latencies go into `e2e`; returns the bytes they
/// read, and when the last of them had its first record (`None` when one had none, or there
/// were none; never before `started`).
async fn finish_consumers(
    tasks: Vec<ConsumerTask>,
    e2e: &mut Histogram<u64>,
    started: Instant,
) -> anyhow::Result<(u64, Option<Instant>)> {
    let mut bytes = 0u64;
    let mut all_reading = (!tasks.is_empty()).then_some(started);
    for task in tasks {
        let counter = task.await??;
        e2e.add(&counter.e2e)?;
        bytes += counter.bytes;
        all_reading = all_reading
            .zip(counter.first_record)
            .map(|(last, first)| last.max(first));
    }
    Ok((bytes, all_reading))
}

/// The run's consumers, reading until `stop`: in the bench's group, or splitting the topic's
/// `partitions` among themselves, from the beginning (consume) or the end (e2e). `client`: the
/// native client, `None` over Kafka's protocol.
async fn start_consumers(
    config: &BenchConfig,
    (client, partitions): (Option<&Arc<Client>>, u32),
    measure_from: Instant,
    (intervals, consumed, stop): (&IntervalRecorders, &Arc<AtomicU64>, &Arc<AtomicBool>),
) -> anyhow::Result<Vec<ConsumerTask>> {
    let mut tasks = Vec::new();
    if config.workload == Workload::Produce {
        return Ok(tasks);
    }
    let from_beginning = config.workload == Workload::Consume;
    let consumers = config.consumers.max(1);
    for index in 0..consumers {
        let counter = RecordCounter {
            measure_from,
            e2e: histogram(),
            interval: intervals.recorder(),
            bytes: 0,
            consumed: consumed.clone(),
            first_record: None,
        };
        let stop = stop.clone();
        let mine: Vec<u32> = (0..partitions)
            .filter(|p| *p as usize % consumers == index)
            .collect();
        if mine.is_empty() && config.group.is_none() {
            continue;
        }
        let Some(client) = client else {
            let config = config.clone();
            let start = if from_beginning {
                rdkafka::Offset::Beginning
            } else {
                rdkafka::Offset::End
            };
            tasks.push(tokio::spawn(async move {
                kafka::consume(&config, mine, start, stop, counter).await
            }));
            continue;
        };
        tasks.push(
            native_consumer(config, client, (index, mine), from_beginning, stop, counter).await?,
        );
    }
    Ok(tasks)
}

/// The client a native producer or consumer uses: the run's `shared` one, or with
/// `own_connections` a client of its own.
async fn client_for(config: &BenchConfig, shared: &Arc<Client>) -> anyhow::Result<Arc<Client>> {
    Ok(if config.own_connections {
        Client::connect(config.client_config()).await?
    } else {
        shared.clone()
    })
}

/// One native consumer task: a member of the bench's group, or a reader of `partitions`.
/// Members join inside their tasks, all at once, as a fleet of consumers starting together
/// would (joined one after another, each join would rebalance those before it).
async fn native_consumer(
    config: &BenchConfig,
    client: &Arc<Client>,
    (index, partitions): (usize, Vec<u32>),
    from_beginning: bool,
    stop: Arc<AtomicBool>,
    mut counter: RecordCounter,
) -> anyhow::Result<ConsumerTask> {
    let consumer_config = config.consumer_config();
    let client = client_for(config, client).await?;
    if let Some(group) = &config.group {
        let mut group_config = GroupConfig::new(group.clone());
        group_config.client_id = format!("strata-bench-{index}");
        group_config.consumer = consumer_config;
        group_config.auto_offset_reset = if from_beginning {
            OffsetReset::Earliest
        } else {
            OffsetReset::Latest
        };
        let topics = vec![config.topic.clone()];
        return Ok(tokio::spawn(async move {
            let mut member = GroupConsumer::subscribe(client, topics, group_config).await?;
            while !stop.load(Ordering::Relaxed) {
                for batch in member.poll().await? {
                    counter.count(batch.records().map(|record| record.value));
                }
            }
            member.close().await?;
            Ok(counter)
        }));
    }
    let start = if from_beginning {
        SeekTo::Beginning
    } else {
        SeekTo::End
    };
    let mut consumer = Consumer::new(client, consumer_config);
    consumer.assign(&config.topic, &partitions, start).await?;
    Ok(tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            for batch in consumer.poll().await? {
                counter.count(batch.records().map(|record| record.value));
            }
        }
        Ok(counter)
    }))
}

/// What one producer task works with.
struct ProducerTask {
    producer: BenchProducer,
    config: BenchConfig,
    /// This producer's number (its partition in the pinned presets, its key seed).
    index: u64,
    /// Records to send, when the run is bounded by a count.
    quota: Option<u64>,
    stop: Arc<AtomicBool>,
    tally: Tally,
    /// Records intended before this are warmup: sent, not measured.
    measure_from: Instant,
}

/// What one producer's loop returns.
type ProducerOutcome = anyhow::Result<ProducerMeasures>;

/// One producer, as fast as acknowledgements allow (no rate), until stopped or its quota is
/// sent. Paced producers run in [`produce_paced`] instead.
async fn produce(task: ProducerTask) -> ProducerOutcome {
    if let Some(per_batch) = task.config.batch_records.filter(|_| task.config.pinned) {
        return produce_pinned(task, per_batch.max(1)).await;
    }
    let mut sender = RecordSender::new(task);
    while !sender.done() {
        sender.send(Instant::now()).await;
    }
    sender.finish().await
}

/// The paced rate one producer thread takes before the next thread starts. On a 2-core VM,
/// one thread at 200,000 records/s used 63% of a core where the earlier
/// design (a pacing thread feeding the shared runtime) used 104%, with the same latency and
/// the same broker CPU; a second thread (a second client) lowered p50 by a fifth to a third but
/// cost the broker a quarter more CPU (twice the requests), worth it only where one thread
/// falls behind: at 320,000 records/s one thread delivered 318,700 with p50 1.4-2.5 ms, two
/// held the rate with p50 0.9-1.0 ms.
const PACED_RECORDS_PER_THREAD: f64 = 200_000.0;

/// A paced producer before it starts: its client and producer are made on the thread that
/// will run it.
struct PacedProducer {
    index: usize,
    producer_config: ProducerConfig,
    make_task: Box<dyn FnOnce(BenchProducer) -> ProducerTask + Send>,
}

/// How a thread of paced producers makes them: native ones share a client of the thread's
/// own (or each has its own with `own_connections`, the flag); over Kafka each is a librdkafka
/// producer (on a topic of this many partitions).
enum Connect {
    Native(ClientConfig, bool),
    Kafka(Box<BenchConfig>, u32),
}

/// Makes `group`'s producers on this thread and runs them paced (see [`on_own_runtime`]).
async fn produce_paced_on_this_thread(
    connect: Connect,
    group: Vec<PacedProducer>,
) -> Vec<ProducerOutcome> {
    let mut tasks = Vec::with_capacity(group.len());
    match connect {
        Connect::Native(client_config, own_connections) => {
            let mut shared = None;
            for paced in group {
                let client = match &shared {
                    Some(client) if !own_connections => Arc::clone(client),
                    _ => match Client::connect(client_config.clone()).await {
                        Ok(client) => shared.insert(client).clone(),
                        Err(error) => {
                            return vec![Err(anyhow::Error::from(error).context("connecting"))];
                        }
                    },
                };
                let producer = Producer::new(client, paced.producer_config);
                tasks.push((paced.make_task)(BenchProducer::Native(producer)));
            }
        }
        Connect::Kafka(config, partitions) => {
            for paced in group {
                match kafka::KafkaProducer::new(&config, paced.index, partitions) {
                    Ok(producer) => tasks.push((paced.make_task)(BenchProducer::Kafka(producer))),
                    Err(error) => return vec![Err(error)],
                }
            }
        }
    }
    produce_paced(tasks).await
}

/// A bench producer: Strata's client, or librdkafka over Kafka's protocol.
enum BenchProducer {
    Native(Producer),
    Kafka(kafka::KafkaProducer),
}

/// A record's acknowledgement, from either producer.
enum BenchAck {
    Native(strata_client::RecordFuture),
    Kafka(kafka::KafkaAck),
}

impl Future for BenchAck {
    type Output = anyhow::Result<RecordMetadata>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            BenchAck::Native(ack) => ack.poll_unpin(context).map_err(Into::into),
            BenchAck::Kafka(ack) => ack.poll_unpin(context),
        }
    }
}

impl BenchProducer {
    /// Strata's own producer, for what only it does (transactions).
    fn native(&self) -> anyhow::Result<&Producer> {
        match self {
            BenchProducer::Native(producer) => Ok(producer),
            BenchProducer::Kafka(_) => {
                anyhow::bail!("only the native producer writes transactions")
            }
        }
    }

    /// Hands `record` to the client: its partition, and its acknowledgement to come.
    async fn send(&self, record: ProducerRecord) -> anyhow::Result<(u32, BenchAck)> {
        match self {
            BenchProducer::Native(producer) => {
                let ack = producer.send(record).await?;
                Ok((ack.partition(), BenchAck::Native(ack)))
            }
            BenchProducer::Kafka(producer) => {
                let timestamp_ms = record
                    .timestamp_ms
                    .unwrap_or_else(|| (now_us() / 1000) as i64);
                let (partition, ack) = producer
                    .send(
                        &record.topic,
                        (record.partition, record.key.as_deref()),
                        &record.value,
                        timestamp_ms,
                    )
                    .await?;
                Ok((partition, BenchAck::Kafka(ack)))
            }
        }
    }

    /// Many records to one partition (the pinned presets); the acknowledgements that, all
    /// resolved, say every record was acknowledged.
    async fn send_batch(
        &self,
        topic: &Arc<str>,
        partition: u32,
        records: &[(Option<&[u8]>, &[u8])],
    ) -> anyhow::Result<Vec<BenchAck>> {
        match self {
            BenchProducer::Native(producer) => Ok(producer
                .send_batch(topic, partition, None, records)
                .await?
                .into_iter()
                .map(BenchAck::Native)
                .collect()),
            BenchProducer::Kafka(producer) => {
                let timestamp_ms = (now_us() / 1000) as i64;
                let mut acks = Vec::with_capacity(records.len());
                for (key, value) in records {
                    let (_, ack) = producer
                        .send(topic, (Some(partition), *key), value, timestamp_ms)
                        .await?;
                    acks.push(BenchAck::Kafka(ack));
                }
                Ok(acks)
            }
        }
    }

    /// Bytes of the batches sent so far, after compression; 0 where the client does not say.
    fn batch_bytes(&self) -> u64 {
        match self {
            BenchProducer::Native(producer) => producer.batch_bytes(),
            BenchProducer::Kafka(_) => 0,
        }
    }
}

/// This thread's paced producers, each open loop at its share of the rate. The thread wakes
/// for all of them, at most once per [`pacing::QUANTUM`]: a wake-up is the expensive part of
/// pacing on a VM (three producers on threads of their own, waking for every record at 35,000
/// records/s, took 97% of a core, 70% of it switching threads).
async fn produce_paced(tasks: Vec<ProducerTask>) -> Vec<ProducerOutcome> {
    let timer = PreciseTimer::new();
    let start = Instant::now();
    let mut senders: Vec<(RecordSender, Schedule)> = tasks
        .into_iter()
        .map(|task| {
            let rate = task
                .config
                .rate
                .map(|rate| rate / task.config.producers.max(1) as f64);
            (RecordSender::new(task), Schedule::new(start, rate))
        })
        .collect();
    loop {
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        for (sender, schedule) in &mut senders {
            let due = schedule.due_by(now);
            while !sender.done() && sender.sent < due {
                sender.send(schedule.due_at(sender.sent)).await;
            }
            if !sender.done() {
                let due = schedule.due_at(sender.sent);
                next_due = Some(next_due.map_or(due, |next| next.min(due)));
            }
        }
        match next_due {
            Some(next_due) => pacing::wait_precisely_for(&timer, next_due).await,
            None => break,
        }
    }
    let mut outcomes = Vec::new();
    for (sender, _) in senders {
        outcomes.push(sender.finish().await);
    }
    outcomes
}

/// One producer's record loop: builds each record (with its intended send time leading the
/// value), hands it to the client, and passes the ack to a collector task that records latency.
struct RecordSender {
    producer: BenchProducer,
    config: BenchConfig,
    index: u64,
    quota: Option<u64>,
    stop: Arc<AtomicBool>,
    topic: Arc<str>,
    keys: KeyChooser,
    /// With `spread`: where records go, the bench choosing among the first partitions.
    spread: Option<PartitionChooser>,
    value: BytesMut,
    sent: u64,
    /// Why this producer stopped early: a send failed, or the collector stopped because an
    /// ack did (then `finish` returns the collector's error instead).
    failure: Option<anyhow::Error>,
    pending: tokio::sync::mpsc::UnboundedSender<PendingAck<BenchAck>>,
    collector: tokio::task::JoinHandle<ProducerOutcome>,
    /// One reading of both clocks, to turn an intended `Instant` into wall-clock time by
    /// arithmetic: reading the clocks per record took about 6% of the bench's samples.
    epoch: (Instant, u64),
    /// Where `finish` adds what this producer sent.
    sent_bytes: Arc<SentBytes>,
    /// A transactional producer's open transaction.
    transaction: Option<TxnProgress>,
}

/// A transactional producer's progress through its current transaction, and its commits'
/// latency.
struct TxnProgress {
    span: TxnSpan,
    initialized: bool,
    /// When the open transaction began; `None` between transactions.
    opened: Option<Instant>,
    records: u64,
    commits: Histogram<u64>,
    measure_from: Instant,
}

impl TxnProgress {
    /// Opens a transaction if none is (initializing the producer's transactional id first).
    async fn open(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        let producer = producer.native()?;
        if self.opened.is_some() {
            return Ok(());
        }
        if !self.initialized {
            producer
                .init_transactions()
                .await
                .context("initializing the transactional producer")?;
            self.initialized = true;
        }
        producer.begin()?;
        self.opened = Some(Instant::now());
        self.records = 0;
        Ok(())
    }

    /// One more record sent in the open transaction; commits it if it is full or old enough.
    async fn sent(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        self.records += 1;
        let opened = self
            .opened
            .expect("records are sent in an open transaction");
        let full = self.span.records.is_some_and(|limit| self.records >= limit);
        if full || opened.elapsed() >= self.span.age {
            self.commit(producer).await?;
        }
        Ok(())
    }

    /// Commits the open transaction, if one is: waits for its records' acknowledgements, then
    /// times the commit alone.
    async fn commit(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        let producer = producer.native()?;
        if self.opened.take().is_none() {
            return Ok(());
        }
        producer.flush().await?;
        let asked = Instant::now();
        producer.commit().await.context("committing")?;
        if asked >= self.measure_from {
            let _ = self
                .commits
                .record(asked.elapsed().as_micros().max(1) as u64);
        }
        Ok(())
    }
}

impl RecordSender {
    fn new(task: ProducerTask) -> RecordSender {
        let ProducerTask {
            producer,
            config,
            index,
            quota,
            stop,
            tally,
            measure_from,
        } = task;
        let Tally {
            produced,
            interval,
            sent: sent_bytes,
        } = tally;
        let (pending, acks) = tokio::sync::mpsc::unbounded_channel();
        let collector = tokio::spawn(async move {
            let mut measures = ProducerMeasures::new();
            let mut acks = AcksInFlight::new(acks);
            while let Some((intended, size, durability)) = acks.next().await? {
                if intended >= measure_from {
                    let latency = intended.elapsed().as_micros().max(1) as u64;
                    let _ = measures.records.record(latency);
                    measures.durability.count(durability, 1);
                    let _ = interval.lock().expect("interval recorder").record(latency);
                    measures.bytes += size as u64;
                    produced.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, anyhow::Error>(measures)
        });
        let transaction = config.transactions.map(|span| TxnProgress {
            span,
            initialized: false,
            opened: None,
            records: 0,
            commits: histogram(),
            measure_from,
        });
        RecordSender {
            topic: config.topic.as_str().into(),
            keys: KeyChooser::new(config.key_distribution, config.keys, index),
            spread: config
                .spread
                .filter(|_| !config.pinned)
                .map(|spread| PartitionChooser::new(spread, config.batch_bytes, index as usize)),
            value: BytesMut::with_capacity(config.record_size),
            producer,
            config,
            index,
            quota,
            stop,
            sent: 0,
            failure: None,
            pending,
            collector,
            epoch: (Instant::now(), now_us()),
            sent_bytes,
            transaction,
        }
    }

    fn done(&self) -> bool {
        self.failure.is_some()
            || self.stop.load(Ordering::Relaxed)
            || self.quota.is_some_and(|quota| self.sent >= quota)
    }

    /// Sends the next record, intended for `intended`. A failure ends this producer
    /// ([`RecordSender::done`]) and is reported by `finish`.
    async fn send(&mut self, intended: Instant) {
        if let Some(transaction) = &mut self.transaction
            && let Err(error) = transaction.open(&self.producer).await
        {
            self.failure = Some(error);
            return;
        }
        // The intended time in wall-clock µs leads the value (consumers measure end-to-end
        // latency from it) and is the record's timestamp.
        let (epoch, epoch_wall_us) = self.epoch;
        let intended_us = match intended.checked_duration_since(epoch) {
            Some(after) => epoch_wall_us + after.as_micros() as u64,
            None => epoch_wall_us.saturating_sub(epoch.duration_since(intended).as_micros() as u64),
        };
        let value = &mut self.value;
        value.clear();
        value.put_u64_le(intended_us);
        let rest = self.config.record_size.saturating_sub(value.len());
        put_text(value, self.sent, rest);
        let mut record =
            ProducerRecord::new(self.topic.clone(), self.keys.next(), value.split().freeze());
        record.timestamp_ms = Some((intended_us / 1000) as i64);
        if self.config.pinned {
            record.partition = Some(self.index as u32);
        } else if let Some(spread) = &mut self.spread {
            record.partition = Some(spread.next(record.key.as_deref(), record.value.len()));
        }
        let (partition, ack) = match self.producer.send(record).await {
            Ok(sent) => sent,
            Err(error) => {
                self.failure = Some(error);
                return;
            }
        };
        if self
            .pending
            .send(PendingAck {
                intended,
                size: self.config.record_size,
                partition,
                ack,
            })
            .is_err()
        {
            self.failure = Some(anyhow::anyhow!("the ack collector stopped"));
            return;
        }
        self.sent += 1;
        if let Some(transaction) = &mut self.transaction
            && let Err(error) = transaction.sent(&self.producer).await
        {
            self.failure = Some(error);
        }
    }

    /// Commits an open transaction, waits for every ack sent and returns the measurements, or
    /// why the producer failed.
    async fn finish(mut self) -> ProducerOutcome {
        if let Some(transaction) = &mut self.transaction
            && self.failure.is_none()
            && let Err(error) = transaction.commit(&self.producer).await
        {
            self.failure = Some(error);
        }
        drop(self.pending);
        let mut measured = self.collector.await?;
        if let (Ok(measures), Some(transaction)) = (&mut measured, &self.transaction) {
            measures.commits.add(&transaction.commits)?;
        }
        self.sent_bytes.add(
            self.sent * self.config.record_size as u64,
            self.producer.batch_bytes(),
        );
        match self.failure {
            // The collector's own error says which ack failed; prefer it.
            Some(failure) => Err(measured.err().unwrap_or(failure)),
            None => measured,
        }
    }
}

/// A record handed to the client: when it was meant to leave, its size, its partition and
/// its acknowledgement.
struct PendingAck<A> {
    intended: Instant,
    size: usize,
    partition: u32,
    ack: A,
}

/// The records of one producer awaiting acknowledgement, yielded as each is acknowledged.
/// Acks of one partition come in order, those of different partitions do not: awaiting them
/// all in send order would charge a record acknowledged early with the wait for an earlier
/// record of a slower partition (at 200,000 records/s over 4 partitions that put the p50 at
/// the slowest partition's round trip). So only the oldest record of each partition is
/// awaited (woken alone when its batch is acknowledged); the records behind it, mostly of the
/// same batch, are taken as soon as they are found done.
struct AcksInFlight<A> {
    incoming: tokio::sync::mpsc::UnboundedReceiver<PendingAck<A>>,
    incoming_open: bool,
    /// Per partition, in send order, the records behind the one awaited.
    queued: Vec<std::collections::VecDeque<PendingAck<A>>>,
    /// Per partition, whether its oldest record is in `oldest`.
    awaited: Vec<bool>,
    oldest: futures_util::stream::FuturesUnordered<OldestAck<A>>,
    /// Acknowledged, not yet yielded.
    done: std::collections::VecDeque<anyhow::Result<Acknowledged>>,
}

/// A record acknowledged: when it was meant to be sent, its size, and how durable its
/// acknowledgement said it was.
type Acknowledged = (Instant, usize, Option<AckDurability>);

/// A partition's oldest unacknowledged record; resolves to the record and its ack's outcome.
struct OldestAck<A> {
    pending: Option<PendingAck<A>>,
}

impl<A, T, E> Future for OldestAck<A>
where
    A: Future<Output = Result<T, E>> + Unpin,
{
    type Output = (PendingAck<()>, Result<T, E>);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let pending = self.pending.as_mut().expect("polled after completion");
        let result = std::task::ready!(pending.ack.poll_unpin(context));
        let pending = self.pending.take().expect("checked above");
        std::task::Poll::Ready((pending.without_ack(), result))
    }
}

impl<A> PendingAck<A> {
    fn without_ack(self) -> PendingAck<()> {
        PendingAck {
            intended: self.intended,
            size: self.size,
            partition: self.partition,
            ack: (),
        }
    }
}

impl<A, T, E> AcksInFlight<A>
where
    A: Future<Output = Result<T, E>> + Unpin,
    T: AckReport,
    E: Into<anyhow::Error>,
{
    fn new(incoming: tokio::sync::mpsc::UnboundedReceiver<PendingAck<A>>) -> AcksInFlight<A> {
        AcksInFlight {
            incoming,
            incoming_open: true,
            queued: Vec::new(),
            awaited: Vec::new(),
            oldest: futures_util::stream::FuturesUnordered::new(),
            done: std::collections::VecDeque::new(),
        }
    }

    /// The next acknowledged record; `None` once the sender is gone and every record is
    /// acknowledged; a failed ack's error.
    async fn next(&mut self) -> anyhow::Result<Option<Acknowledged>> {
        std::future::poll_fn(|context| self.poll_next(context)).await
    }

    fn poll_next(
        &mut self,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<anyhow::Result<Option<Acknowledged>>> {
        use futures_util::StreamExt;
        use std::task::Poll;
        while self.incoming_open {
            match self.incoming.poll_recv(context) {
                Poll::Ready(Some(pending)) => self.add(pending),
                Poll::Ready(None) => self.incoming_open = false,
                Poll::Pending => break,
            }
        }
        while self.done.is_empty() {
            match self.oldest.poll_next_unpin(context) {
                Poll::Ready(Some((acked, result))) => {
                    self.done.push_back(
                        result
                            .map(|ack| (acked.intended, acked.size, ack.durability()))
                            .map_err(Into::into),
                    );
                    self.take_done_behind(acked.partition as usize);
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        match self.done.pop_front() {
            Some(acked) => Poll::Ready(acked.map(Some)),
            None if self.incoming_open || !self.oldest.is_empty() => Poll::Pending,
            None => Poll::Ready(Ok(None)),
        }
    }

    fn add(&mut self, pending: PendingAck<A>) {
        let partition = pending.partition as usize;
        if self.queued.len() <= partition {
            self.queued.resize_with(partition + 1, Default::default);
            self.awaited.resize(partition + 1, false);
        }
        if self.awaited[partition] {
            self.queued[partition].push_back(pending);
        } else {
            self.awaited[partition] = true;
            self.oldest.push(OldestAck {
                pending: Some(pending),
            });
        }
    }

    /// After `partition`'s oldest record was acknowledged: takes the records behind it that
    /// are acknowledged too and awaits the first that is not.
    fn take_done_behind(&mut self, partition: usize) {
        let mut glance = std::task::Context::from_waker(std::task::Waker::noop());
        while let Some(mut pending) = self.queued[partition].pop_front() {
            match pending.ack.poll_unpin(&mut glance) {
                std::task::Poll::Ready(result) => self.done.push_back(
                    result
                        .map(|ack| (pending.intended, pending.size, ack.durability()))
                        .map_err(Into::into),
                ),
                std::task::Poll::Pending => {
                    self.oldest.push(OldestAck {
                        pending: Some(pending),
                    });
                    return;
                }
            }
        }
        self.awaited[partition] = false;
    }
}

/// The pinned presets' loop, as iggy-bench's pinned producers run: producer `index` writes
/// partition `index` in batches of `per_batch` records, each handed to the client in one call
/// once the previous batch is acknowledged (closed loop). A batch's latency runs from its
/// intended send time to its acknowledgement, and every record in it counts that latency.
/// The values live in one buffer filled once; each batch rewrites only their timestamps.
async fn produce_pinned(task: ProducerTask, per_batch: usize) -> ProducerOutcome {
    let (config, quota, measure_from) = (&task.config, task.quota, task.measure_from);
    let Tally {
        produced,
        interval,
        sent: sent_bytes,
    } = &task.tally;
    let topic: Arc<str> = config.topic.as_str().into();
    let partition = task.index as u32;
    let rate = config
        .rate
        .map(|rate| rate / config.producers.max(1) as f64);
    let mut keys = KeyChooser::new(config.key_distribution, config.keys, task.index);
    let ProducerMeasures {
        mut records,
        mut batches,
        mut bytes,
        commits,
        durability: mut measured_durability,
    } = ProducerMeasures::new();
    let record_size = config.record_size.max(1);
    let mut values: Vec<u8> = Vec::with_capacity(per_batch * record_size);
    for record in 0..per_batch as u64 {
        put_text(&mut values, record, record_size);
    }
    let mut batch_keys: Vec<Option<Bytes>> = Vec::with_capacity(per_batch);
    let schedule = Schedule::new(Instant::now(), rate);
    let mut sent = 0u64;
    while !task.stop.load(Ordering::Relaxed) && quota.is_none_or(|quota| sent < quota) {
        let count = quota.map_or(per_batch, |quota| {
            (quota - sent).min(per_batch as u64) as usize
        });
        let intended = schedule.wait_until_due(sent);
        let lateness = Instant::now().saturating_duration_since(intended);
        let stamp = now_us()
            .saturating_sub(lateness.as_micros() as u64)
            .to_le_bytes();
        for value in values.chunks_mut(record_size).take(count) {
            let len = stamp.len().min(value.len());
            value[..len].copy_from_slice(&stamp[..len]);
        }
        batch_keys.clear();
        batch_keys.extend((0..count).map(|_| keys.next()));
        let batch: Vec<(Option<&[u8]>, &[u8])> = batch_keys
            .iter()
            .map(Option::as_deref)
            .zip(values.chunks(record_size))
            .collect();
        let acks = task.producer.send_batch(&topic, partition, &batch).await?;
        let mut durability = None;
        for ack in acks {
            // The batch's last part was acknowledged last: its durability stands for all.
            durability = ack.await?.durability;
        }
        sent += count as u64;
        if intended >= measure_from {
            measured_durability.count(durability, count as u64);
            let latency = intended.elapsed().as_micros().max(1) as u64;
            let _ = batches.record(latency);
            let _ = records.record_n(latency, count as u64);
            let _ = interval
                .lock()
                .expect("interval recorder")
                .record_n(latency, count as u64);
            bytes += (count * config.record_size) as u64;
            produced.fetch_add(count as u64, Ordering::Relaxed);
        }
    }
    sent_bytes.add(sent * record_size as u64, task.producer.batch_bytes());
    Ok(ProducerMeasures {
        records,
        batches,
        commits,
        bytes,
        durability: measured_durability,
    })
}

/// The words record values are made of: text with the redundancy of logs or JSON, so that a
/// compressed run (`--compression`) shrinks its batches about as much as real data would (zstd
/// 3-4x, LZ4 about 2x; the same bytes of 'x' shrink 100x and would flatter every codec).
const PAYLOAD_WORDS: [&str; 32] = [
    "order",
    "status",
    "shipped",
    "pending",
    "user",
    "session",
    "region",
    "eu-west",
    "us-east",
    "latency",
    "request",
    "response",
    "GET",
    "POST",
    "/api/v1/items",
    "200",
    "404",
    "true",
    "false",
    "null",
    "amount",
    "currency",
    "EUR",
    "USD",
    "timestamp",
    "trace",
    "span",
    "service",
    "checkout",
    "inventory",
    "payment",
    "retry",
];

/// Appends `len` bytes of value text for record `record`: a window into one pool (so nothing is
/// generated per record), wrapping around it for values longer than the pool.
fn put_text(out: &mut impl BufMut, record: u64, len: usize) {
    static POOL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        // A fixed linear congruential sequence: every run sends the same bytes.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut pool = Vec::with_capacity((1 << 20) + 64);
        while pool.len() < 1 << 20 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let word = PAYLOAD_WORDS[(state >> 59) as usize];
            pool.extend_from_slice(word.as_bytes());
            pool.push(if state & 0x100 == 0 { b' ' } else { b'"' });
        }
        pool
    });
    let mut start = (record.wrapping_mul(7_919) % (POOL.len() / 2) as u64) as usize;
    let mut left = len;
    while left > 0 {
        let take = left.min(POOL.len() - start);
        out.put_slice(&POOL[start..start + take]);
        left -= take;
        start = 0;
    }
}

/// Record bytes per batch byte; `None` when no batch was sent.
fn ratio(record_bytes: u64, batch_bytes: u64) -> Option<f64> {
    (batch_bytes > 0).then(|| record_bytes as f64 / batch_bytes as f64)
}

/// Picks record keys.
struct KeyChooser {
    distribution: KeyDistribution,
    keys: u64,
    rng: StdRng,
    /// Cumulative Zipf weights over the key space.
    zipf: Vec<f64>,
}

impl KeyChooser {
    fn new(distribution: KeyDistribution, keys: u64, seed: u64) -> KeyChooser {
        let keys = keys.max(1);
        let zipf = if distribution == KeyDistribution::Zipf {
            let mut total = 0.0;
            let mut cumulative: Vec<f64> = (1..=keys)
                .map(|rank| {
                    total += 1.0 / rank as f64;
                    total
                })
                .collect();
            for weight in &mut cumulative {
                *weight /= total;
            }
            cumulative
        } else {
            Vec::new()
        };
        KeyChooser {
            distribution,
            keys,
            rng: StdRng::seed_from_u64(seed),
            zipf,
        }
    }

    fn next(&mut self) -> Option<Bytes> {
        let key = match self.distribution {
            KeyDistribution::None => return None,
            KeyDistribution::Uniform => self.rng.random_range(0..self.keys),
            KeyDistribution::Zipf => {
                let draw: f64 = self.rng.random();
                self.zipf.partition_point(|weight| *weight < draw) as u64
            }
        };
        Some(Bytes::from(format!("key-{key}")))
    }
}

/// The generator alone: each producer task builds batches as the producer does (value with a
/// send timestamp, key, batch sealed at `batch_bytes`) and drops them.
async fn null_sink(config: &BenchConfig) -> anyhow::Result<(Report, Histograms)> {
    anyhow::ensure!(
        config.workload == Workload::Produce,
        "--null-sink measures the produce side only"
    );
    let host = HostState::now();
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    let memory_stalls_started = memory_stalls_us();
    let producers = config.producers.max(1);
    let mut tasks = Vec::new();
    for index in 0..producers {
        let config = config.clone();
        let quota = config.records.map(|total| {
            total / producers as u64 + u64::from((index as u64) < total % producers as u64)
        });
        let deadline = config.duration.map(|duration| started + duration);
        tasks.push(tokio::task::spawn_blocking(move || {
            let mut keys = KeyChooser::new(config.key_distribution, config.keys, index as u64);
            let mut builder = strata_wire::batch::BatchBuilder::with_capacity(config.batch_bytes);
            builder.set_codec(config.compression);
            let mut value = Vec::with_capacity(config.record_size);
            let (mut generated, mut batch_bytes) = (0u64, 0u64);
            // The clock is read for the deadline about once per MiB generated (at most every
            // 1024 records): often enough for large records, rarely enough for small ones.
            let check_every = ((1usize << 20) / config.record_size.max(1)).clamp(1, 1024) as u64;
            while quota.is_none_or(|quota| generated < quota)
                && deadline.is_none_or(|deadline| {
                    !generated.is_multiple_of(check_every) || Instant::now() < deadline
                })
            {
                // As a producing record sender builds its values: a send time, then text.
                let stamp = now_us().to_le_bytes();
                let stamped = stamp.len().min(config.record_size);
                value.clear();
                value.extend_from_slice(&stamp[..stamped]);
                put_text(&mut value, generated, config.record_size - stamped);
                let key = keys.next();
                builder.push(0, key.as_deref(), &value);
                generated += 1;
                if builder.estimated_len() >= config.batch_bytes {
                    batch_bytes += std::hint::black_box(builder.finish()).len() as u64;
                }
            }
            if !builder.is_empty() {
                batch_bytes += std::hint::black_box(builder.finish()).len() as u64;
            }
            (generated, batch_bytes)
        }));
    }
    let (mut records, mut batch_bytes) = (0u64, 0u64);
    for task in tasks {
        let (generated, batches) = task.await?;
        records += generated;
        batch_bytes += batches;
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let bytes = records * config.record_size as u64;
    let report = Report {
        workload: Workload::Produce,
        topic: "(null sink)".into(),
        compression: config.compression.name(),
        client: client_name(config.protocol),
        sent_batch_bytes: batch_bytes,
        compression_ratio: ratio(bytes, batch_bytes),
        records,
        bytes,
        duration_s: seconds,
        records_per_s: records as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        target_rate: None,
        bench_cpu_percent: 100.0 * (cpu_seconds() - cpu_started) / seconds,
        broker_cpu_seconds: None,
        broker_cpu_s_per_gb: None,
        memory_stall_ms: stalled_since(memory_stalls_started),
        consumers_ready_s: None,
        ack_latency_us: None,
        ack_durability: Vec::new(),
        batch_latency_us: None,
        commit_latency_us: None,
        e2e_latency_us: None,
        timeline: Vec::new(),
        host,
    };
    Ok((report, Histograms::empty()))
}

/// An SVG a person can look at: the latency percentile distribution (ack, per batch, end to
/// end; log latency over a "nines" axis) beside throughput over time.
pub fn plot_svg(report: &Report, histograms: &Histograms) -> String {
    const W: f64 = 900.0;
    const H: f64 = 360.0;
    const PANEL: f64 = 400.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"16\" font-size=\"13\">{:?} on {}: {:.0} records/s, {:.1} MB/s</text>\n",
        report.workload, report.topic, report.records_per_s, report.mb_per_s
    );
    // Left: percentiles on a nines axis (0, 90, 99, 99.9, 99.99, 99.999) against log latency.
    let (left, top, height) = (50.0, 40.0, 280.0);
    let nines = |q: f64| (-(1.0 - q).log10()).min(5.0) / 5.0 * PANEL;
    let series: Vec<(&str, &str, &Histogram<u64>)> = [
        ("ack", "#1f77b4", &histograms.ack),
        ("batch", "#2ca02c", &histograms.batch),
        ("e2e", "#d62728", &histograms.e2e),
    ]
    .into_iter()
    .filter(|(_, _, h)| !h.is_empty())
    .collect();
    let max = series
        .iter()
        .map(|(_, _, h)| h.max())
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let y = |us: f64| top + height - (us.max(1.0).log10() / max.log10()) * height;
    for (label, q) in [
        ("p0", 0.0),
        ("p90", 0.9),
        ("p99", 0.99),
        ("p99.9", 0.999),
        ("p99.99", 0.9999),
        ("p99.999", 0.99999),
    ] {
        let x = left + nines(q);
        svg += &format!(
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>\n",
            top + height,
            top + height + 14.0
        );
    }
    for decade in 0..=(max.log10().ceil() as u32) {
        let us = 10f64.powi(decade as i32);
        let label = if us >= 1e6 {
            format!("{}s", us / 1e6)
        } else if us >= 1e3 {
            format!("{}ms", us / 1e3)
        } else {
            format!("{us}µs")
        };
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
            left - 4.0,
            y(us) + 4.0
        );
    }
    for (index, (name, color, histogram)) in series.iter().enumerate() {
        let points: Vec<String> = (0..=100)
            .map(|i| {
                let q = 1.0 - 10f64.powf(-(i as f64) / 20.0);
                let q = if i == 0 { 0.0 } else { q };
                format!(
                    "{:.1},{:.1}",
                    left + nines(q),
                    y(histogram.value_at_quantile(q) as f64)
                )
            })
            .collect();
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{name} latency</text>\n",
            points.join(" "),
            left + 8.0,
            top + 12.0 + 14.0 * index as f64
        );
    }
    // Right: records per second over time.
    let (left, width) = (480.0, PANEL);
    let peak = report
        .timeline
        .iter()
        .map(|p| p.produced_records.max(p.consumed_records))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let seconds = report.timeline.len().max(2) as f64;
    svg += &format!(
        "<text x=\"{left}\" y=\"{:.1}\">records/s (peak {peak:.0}) over {} s</text>\n",
        top - 6.0,
        report.timeline.len()
    );
    svg += &format!(
        "<rect x=\"{left}\" y=\"{top}\" width=\"{width}\" height=\"{height}\" fill=\"none\" stroke=\"#ccc\"/>\n"
    );
    for (name, color, pick) in [
        (
            "produced",
            "#1f77b4",
            (|p: &TimelinePoint| p.produced_records) as fn(&TimelinePoint) -> u64,
        ),
        ("consumed", "#ff7f0e", |p: &TimelinePoint| {
            p.consumed_records
        }),
    ] {
        let points: Vec<String> = report
            .timeline
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{:.1},{:.1}",
                    left + i as f64 / (seconds - 1.0) * width,
                    top + height - pick(p) as f64 / peak * height
                )
            })
            .collect();
        if points.iter().any(|_| true) {
            svg += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"><title>{name}</title></polyline>\n",
                points.join(" ")
            );
        }
    }
    svg += "</svg>\n";
    svg
}

/// A text progress bar `width` cells wide with the percentage after it, e.g.
/// `[#####---------------]  25%`. `fraction` is clamped to 0..=1.
pub fn progress_bar(fraction: f64, width: usize) -> String {
    let fraction = fraction.clamp(0.0, 1.0);
    let filled = ((fraction * width as f64) as usize).min(width);
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(filled),
        "-".repeat(width - filled),
        fraction * 100.0
    )
}

/// See [`strata_tuning::memory_stalls_us`].
fn memory_stalls_us() -> Option<u64> {
    strata_tuning::memory_stalls_us(&strata_tuning::Host::live())
}

/// Memory stalls (ms) since a reading taken at the run's start.
fn stalled_since(started_us: Option<u64>) -> Option<f64> {
    let (started, now) = (started_us?, memory_stalls_us()?);
    Some(now.saturating_sub(started) as f64 / 1000.0)
}

/// The brokers' CPU over the measured run: read from their `/metrics` as it starts (a task
/// that waits for the warmup to end) and as it ends.
struct BrokerCpu {
    admins: Vec<String>,
    started: Option<tokio::task::JoinHandle<Option<f64>>>,
}

impl BrokerCpu {
    fn start(admins: &[String], at: Instant) -> BrokerCpu {
        let started = (!admins.is_empty()).then(|| {
            let admins = admins.to_vec();
            tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                brokers_cpu_seconds(&admins).await
            })
        });
        BrokerCpu {
            admins: admins.to_vec(),
            started,
        }
    }

    /// CPU seconds since the start; `None` without brokers to ask or when one did not answer.
    async fn finish(self) -> Option<f64> {
        let started = self.started?.await.ok()??;
        let ended = brokers_cpu_seconds(&self.admins).await?;
        Some((ended - started).max(0.0))
    }
}

/// The `process_cpu_seconds_total` of the brokers at `admins`, summed; `None` when one cannot
/// be read.
async fn brokers_cpu_seconds(admins: &[String]) -> Option<f64> {
    let mut total = 0.0;
    for admin in admins {
        total += broker_cpu_seconds(admin).await?;
    }
    Some(total)
}

async fn broker_cpu_seconds(admin: &str) -> Option<f64> {
    let metrics = scrape_metrics(admin).await.ok()?;
    Some(scale::ProcessFigures::parse(&metrics)?.cpu_seconds)
}

/// The `/metrics` page of the broker whose admin endpoint is `admin`.
pub(crate) async fn scrape_metrics(admin: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limit = Duration::from_secs(5);
    let connect = tokio::net::TcpStream::connect(admin);
    let mut stream = tokio::time::timeout(limit, connect)
        .await
        .context("connecting timed out")??;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    tokio::time::timeout(limit, stream.read_to_string(&mut answer))
        .await
        .context("reading timed out")??;
    Ok(answer)
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    strata_tuning::process_cpu_seconds()
}

/// The client a run's report names.
fn client_name(protocol: Protocol) -> String {
    match protocol {
        Protocol::Native => format!("strata-client {} (native)", env!("CARGO_PKG_VERSION")),
        Protocol::Kafka => kafka::client_name(),
    }
}

/// The human summary.
pub fn summary(report: &Report) -> String {
    let mut text = format!(
        "{:?} on {}: {} records, {:.0} records/s, {:.1} MB/s over {:.2} s (bench CPU {:.0}% of a core)",
        report.workload,
        report.topic,
        report.records,
        report.records_per_s,
        report.mb_per_s,
        report.duration_s,
        report.bench_cpu_percent
    );
    for (name, percentiles) in [
        ("ack latency", &report.ack_latency_us),
        ("batch latency", &report.batch_latency_us),
        ("commit latency", &report.commit_latency_us),
        ("end-to-end latency", &report.e2e_latency_us),
    ] {
        if let Some(p) = percentiles {
            text.push_str(&format!(
                "\n  {name} (µs): p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {}",
                p.p50, p.p90, p.p99, p.p999, p.p9999, p.max
            ));
        }
    }
    if !report.ack_durability.is_empty() {
        let levels: Vec<String> = report
            .ack_durability
            .iter()
            .map(|level| {
                format!(
                    "{:.1}% on {} replica(s), {} synced",
                    level.share * 100.0,
                    level.replicas,
                    level.synced_replicas
                )
            })
            .collect();
        text.push_str(&format!("\n  acknowledged: {}", levels.join("; ")));
    }
    if let (Some(cpu), Some(per_gb)) = (report.broker_cpu_seconds, report.broker_cpu_s_per_gb) {
        text.push_str(&format!(
            "\n  brokers' CPU: {cpu:.2} s = {per_gb:.3} CPU s per GB"
        ));
    }
    if let Some(ready) = report.consumers_ready_s {
        text.push_str(&format!(
            "\n  every consumer had its first record {ready:.2} s after the start"
        ));
    }
    text.push_str(&format!("\n  host at the start: {}", report.host));
    if let Some(stalled) = report.memory_stall_ms {
        text.push_str(&format!("; memory stalls during the run: {stalled:.0} ms"));
    }
    if report.compression != "none"
        && let Some(ratio) = report.compression_ratio
    {
        text.push_str(&format!(
            "\n  {}: {:.1} MB of batches sent, {ratio:.2}x smaller than their records",
            report.compression,
            report.sent_batch_bytes as f64 / 1e6
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_text_has_the_asked_length_at_any_size() {
        for len in [0, 8, 1024, 600_000, 3 << 20] {
            let mut out = Vec::new();
            put_text(&mut out, 12_345, len);
            assert_eq!(out.len(), len);
            assert!(out.iter().all(|b| b.is_ascii_graphic() || *b == b' '));
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        put_text(&mut a, 1, 64);
        put_text(&mut b, 2, 64);
        assert_ne!(a, b, "records differ");
    }

    #[test]
    fn host_state_reads_meminfo() {
        let meminfo = "MemTotal:       24607744 kB\nMemFree:        11534336 kB\nMemAvailable:   23000000 kB\nBuffers:           12828 kB\nCached:         11010048 kB\nSwapCached:            0 kB\nDirty:              2048 kB\n";
        let host = HostState::from_meminfo(meminfo);
        assert_eq!(
            (
                host.mem_total_mb,
                host.mem_free_mb,
                host.page_cache_mb,
                host.dirty_mb
            ),
            (24031, 11264, 10752, 2)
        );
        assert_eq!(HostState::from_meminfo(""), HostState::default());
    }

    #[test]
    fn host_state_shows_guest_halt_polling_only_where_known() {
        let host = HostState {
            cpus: 2,
            mem_free_mb: 1536,
            dirty_mb: 7,
            ..HostState::default()
        };
        assert_eq!(
            host.to_string(),
            "2 cpus, 1.5 GB free, 0.0 GB page cache, 7 MB dirty"
        );
        let polling = HostState {
            guest_halt_poll_ns: Some(0),
            ..host
        };
        assert!(polling.to_string().ends_with(", guest halt polling 0 ns"));
    }

    #[test]
    fn progress_bars_fill_and_clamp() {
        assert_eq!(progress_bar(0.25, 8), "[##------]  25%");
        assert_eq!(progress_bar(1.7, 4), "[####] 100%");
        assert_eq!(progress_bar(-1.0, 4), "[----]   0%");
    }

    #[test]
    fn zipf_keys_are_skewed_and_uniform_keys_are_not() {
        let mut zipf = KeyChooser::new(KeyDistribution::Zipf, 100, 1);
        let mut uniform = KeyChooser::new(KeyDistribution::Uniform, 100, 1);
        let count = |chooser: &mut KeyChooser| {
            (0..10_000)
                .filter(|_| chooser.next().unwrap() == "key-0")
                .count()
        };
        let hot = count(&mut zipf);
        let flat = count(&mut uniform);
        assert!(hot > 1000, "the top zipf key takes ~19%: {hot}");
        assert!(flat < 200, "a uniform key takes ~1%: {flat}");
        assert!(
            KeyChooser::new(KeyDistribution::None, 10, 1)
                .next()
                .is_none()
        );
    }

    #[test]
    fn the_null_sink_generates_what_it_is_asked_for() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = BenchConfig {
            null_sink: true,
            records: Some(100_000),
            duration: None,
            key_distribution: KeyDistribution::Zipf,
            ..BenchConfig::default()
        };
        let (report, _) = runtime.block_on(run(&config)).unwrap();
        assert_eq!(report.records, 100_000);
        assert_eq!(report.bytes, 100_000 * 1024);
        assert!(report.records_per_s > 0.0);
        assert!(report.bench_cpu_percent > 0.0);
        // Read where the kernel keeps pressure stall information (`/proc/pressure`, with PSI).
        assert_eq!(
            report.memory_stall_ms.is_some(),
            std::path::Path::new("/proc/pressure/memory").exists()
        );
    }

    #[tokio::test]
    async fn acks_are_yielded_as_they_come_in_partition_order() {
        let (sender, incoming) = tokio::sync::mpsc::unbounded_channel();
        let mut acks = AcksInFlight::new(incoming);
        let start = Instant::now();
        let mut replies = Vec::new();
        // Records 0 and 2 on partition 0, record 1 on partition 3.
        for (record, partition) in [(0u64, 0u32), (1, 3), (2, 0)] {
            let (reply, ack) = tokio::sync::oneshot::channel::<()>();
            replies.push(Some(reply));
            sender
                .send(PendingAck {
                    intended: start + Duration::from_micros(record),
                    size: record as usize,
                    partition,
                    ack,
                })
                .unwrap();
        }
        assert!(
            acks.next().now_or_never().is_none(),
            "nothing acknowledged yet"
        );

        // Partition 3's record is acknowledged first and comes first, though sent later.
        replies[1].take().unwrap().send(()).unwrap();
        let (_, size, _) = acks.next().await.unwrap().unwrap();
        assert_eq!(size, 1);
        // Record 2 is done before record 0 of its partition: it waits for record 0.
        replies[2].take().unwrap().send(()).unwrap();
        assert!(acks.next().now_or_never().is_none());
        replies[0].take().unwrap().send(()).unwrap();
        assert_eq!(acks.next().await.unwrap().unwrap().1, 0);
        assert_eq!(acks.next().await.unwrap().unwrap().1, 2);

        // Open while the sender may still send; then done.
        assert!(acks.next().now_or_never().is_none());
        drop(sender);
        assert!(acks.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_failed_ack_is_an_error() {
        let (sender, incoming) = tokio::sync::mpsc::unbounded_channel();
        let mut acks = AcksInFlight::new(incoming);
        let (reply, ack) = tokio::sync::oneshot::channel::<()>();
        sender
            .send(PendingAck {
                intended: Instant::now(),
                size: 1,
                partition: 2,
                ack,
            })
            .unwrap();
        drop(reply);
        assert!(acks.next().await.is_err());
    }

    #[test]
    fn percentiles_are_monotonic() {
        let mut histogram = histogram();
        for value in 1..10_000u64 {
            histogram.record(value * value % 7919 + 1).unwrap();
        }
        let p = Percentiles::of(&histogram);
        assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999);
        assert!(p.p999 <= p.p9999 && p.p9999 <= p.max);
    }
}
