//! One shard: a thread, its runtime, the partitions it owns, and its listeners.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use strata_coordinator::{BrokerInfo, TopicState};
use strata_wire::protocol::{
    ACKS_ALL, ApiKey, ApiVersionRange, ApiVersionsResponse, BrokerMetadata, EARLIEST_TIMESTAMP,
    Elsewhere, ErrorCode, FetchPartition, FetchPartitionResponse, FetchRequest, FetchResponse,
    FetchTopicResponse, LATEST_TIMESTAMP, ListOffsetsPartition, ListOffsetsPartitionResponse,
    ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopicResponse, MetadataRequest,
    MetadataResponse, PartitionMetadata, ProducePartitionResponse, ProduceRequest, ProduceResponse,
    ProduceTopicResponse, Records, ReplicaFetchRequest, ReplicaFetchResponse, Request, Response,
    TopicMetadata,
};
use tokio::sync::{mpsc, oneshot};

use super::NodeConfig;
use super::connection;
use super::control::ControlMessage;
use super::metrics;
use super::quic::QuicPeer;
use super::replica::{self, Partition, Role};
use super::topic_config::TopicConfig;
use crate::io::{self, AnyStorage, Backend, Storage};
use crate::log::producers::ProducerError;
use crate::log::shared_sync::{self, SharedSync};
use crate::log::tail_cache::TailCaches;
use crate::log::{LogError, PartitionLog, Served, writer};
use crate::replication::{LeaderConfig, RecoveryThrottle};

/// How often a shard tries again to open replicas it could not.
const UNOPENED_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// What shards ask each other. Everything in it is `Send`; nothing is shared.
pub enum ShardMessage {
    Produce {
        topic: String,
        partition: u32,
        records: BytesMut,
        acks: i8,
        timeout_ms: u32,
        reply: oneshot::Sender<ProducePartitionResponse>,
    },
    ReplicaFetch {
        request: ReplicaFetchRequest,
        reply: oneshot::Sender<ReplicaFetchResponse>,
    },
    Fetch {
        topic: String,
        partition: FetchPartition,
        deadline: Option<Instant>,
        reply: oneshot::Sender<Fetched>,
    },
    ListOffset {
        topic: String,
        partition: ListOffsetsPartition,
        reply: oneshot::Sender<ListOffsetsPartitionResponse>,
    },
    /// The cluster changed: open and close partitions to match, then reply.
    ClusterChanged {
        view: ClusterView,
        reply: oneshot::Sender<()>,
    },
    /// Apply the view this shard holds again, for replicas it could not open (the shard's own
    /// timer sends it: applied in mailbox order, it can never undo a newer view).
    RetryUnopened,
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// What this shard owns and how often it forwarded, for tests and metrics.
    Stats {
        reply: oneshot::Sender<ShardStats>,
    },
    /// A copy of this shard's metrics, for a scrape.
    Metrics {
        reply: oneshot::Sender<metrics::Snapshot>,
    },
    /// The cluster as this shard sees it.
    View {
        reply: oneshot::Sender<ClusterView>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStats {
    pub shard: usize,
    /// (topic, partition) this shard has open, sorted.
    pub partitions: Vec<(String, u32)>,
    /// Requests this shard forwarded to the owning shard.
    pub cross_shard_hops: u64,
}

/// The cluster as the control thread last read it: shared, immutable snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub topics: Arc<Vec<TopicState>>,
    pub brokers: Arc<Vec<BrokerInfo>>,
    pub controller: i32,
}

pub struct ShardContext {
    pub index: usize,
    pub config: Arc<NodeConfig>,
    pub peers: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    pub control: mpsc::UnboundedSender<ControlMessage>,
    /// The group thread: consumer groups and producer ids.
    pub groups: mpsc::UnboundedSender<super::groups::GroupMessage>,
    pub backend: Backend,
}

/// The shard that owns `partition` of `topic`: partitions of one topic spread round-robin over
/// the shards from a per-topic starting point.
pub fn shard_of(topic: &str, partition: u32, shards: usize) -> usize {
    ((u64::from(strata_wire::crc32c(topic.as_bytes())) + u64::from(partition)) % shards as u64)
        as usize
}

pub(super) struct Shard {
    pub context: ShardContext,
    storage: AnyStorage,
    pub(super) view: RefCell<ClusterView>,
    /// Every replica (leader or follower) of a partition this shard owns.
    pub(super) partitions: RefCell<HashMap<(String, u32), Partition>>,
    /// Replicas this shard should hold but could not open (why): clients get STORAGE_ERROR
    /// for them rather than NOT_LEADER, and the next view applied tries them again.
    unopened: RefCell<HashMap<(String, u32), String>>,
    /// Requests forwarded to another shard (a metric: shard-aware clients keep it near zero).
    pub cross_shard_hops: Cell<u64>,
    pub(super) metrics: metrics::ShardMetrics,
    /// This shard's replication endpoint.
    pub(super) quic: Option<QuicPeer>,
    /// This shard's share of the node's limit on catch-up replication; `None`: no limit.
    pub(super) recovery_throttle: Option<RefCell<RecoveryThrottle>>,
    /// The memory budget every log on this shard keeps its newest appends within.
    tail_caches: TailCaches,
    /// This shard's share of each topic's own catch-up limit (`replica.recovery.bytes.per.sec`),
    /// by topic: made on the first catch-up fetch, made anew when the setting changes.
    pub(super) topic_recovery_throttles: RefCell<HashMap<String, RecoveryThrottle>>,
    /// How this shard's log tasks group their IO (from `strata iotune`, or the defaults); its
    /// write limit is shared by this shard's logs only.
    writer_tuning: writer::WriterTuning,
}

pub fn run(
    context: ShardContext,
    view: ClusterView,
    mut mailbox: mpsc::UnboundedReceiver<ShardMessage>,
    ready: oneshot::Sender<Result<(), String>>,
) {
    // Everything this thread logs names its node and shard (several nodes share a terminal in
    // tests and on one host).
    let _span = tracing::info_span!(
        "shard",
        node = context.config.node_id,
        shard = context.index
    )
    .entered();
    if context.config.pin_cores {
        pin_to_core(context.index);
    }
    let backend = context.backend.clone();
    io::run_on(&backend, move |storage| async move {
        let replication_addr = context.config.replication_addr(context.index);
        let quic = match QuicPeer::bind(replication_addr, context.config.tls.as_ref()) {
            Ok(quic) => quic,
            Err(error) => {
                let _ = ready.send(Err(format!(
                    "binding replication (QUIC) on {replication_addr}: {error}"
                )));
                return;
            }
        };
        let (context_io, shards) = (context.config.io_properties.clone(), context.config.shards);
        let metrics = metrics::ShardMetrics::default();
        let fsync_histogram = metrics.fsync_histogram();
        let mut writer_tuning = writer::WriterTuning {
            sync_latency_us: Some(fsync_histogram.clone()),
            ..match &context_io {
                Some(properties) => properties.writer_tuning(shards),
                None => writer::WriterTuning::default(),
            }
        };
        writer_tuning.shared_sync = match SharedSync::open(
            &context.config.data_dir,
            shared_sync::DEFAULT_GATHER,
            shared_sync::DEFAULT_MIN_LOGS,
            writer_tuning.device_writes.clone(),
            Some(fsync_histogram),
        ) {
            Ok(shared) => Some(shared),
            Err(error) => {
                tracing::warn!(
                    "each log syncs on its own: opening the data directory failed: {error}"
                );
                None
            }
        };
        let recovery_throttle = context.config.replica_recovery_bytes_per_sec.map(|rate| {
            let share = RecoveryThrottle::shard_share(rate, shards);
            RefCell::new(RecoveryThrottle::new(share, std::time::Instant::now()))
        });
        let tail_caches = TailCaches::new(
            usize::try_from(context.config.tail_cache_bytes / shards as u64).unwrap_or(usize::MAX),
        );
        let shard = Rc::new(Shard {
            quic: Some(quic),
            tail_caches,
            recovery_throttle,
            topic_recovery_throttles: RefCell::new(HashMap::new()),
            context,
            storage,
            view: RefCell::new(ClusterView {
                topics: Arc::new(Vec::new()),
                brokers: Arc::new(Vec::new()),
                controller: -1,
            }),
            partitions: RefCell::new(HashMap::new()),
            unopened: RefCell::new(HashMap::new()),
            cross_shard_hops: Cell::new(0),
            metrics,
            writer_tuning,
        });
        if let Err(error) = shard.apply_view(view).await {
            let _ = ready.send(Err(error));
            return;
        }
        let listeners = match connection::listen(&shard).and_then(|mut listeners| {
            listeners.extend(super::kafka::listen(&shard)?);
            Ok(listeners)
        }) {
            Ok(listeners) => listeners,
            Err(error) => {
                let _ = ready.send(Err(error.to_string()));
                return;
            }
        };
        let replication = [
            tokio::task::spawn_local(shard.clone().serve_replication()),
            tokio::task::spawn_local(shard.clone().replication_ticks()),
            tokio::task::spawn_local(shard.clone().retention_ticks()),
            tokio::task::spawn_local(shard.clone().retry_unopened_ticks()),
        ];
        let _ = ready.send(Ok(()));
        while let Some(message) = mailbox.recv().await {
            match message {
                ShardMessage::Produce {
                    topic,
                    partition,
                    records,
                    acks,
                    timeout_ms,
                    reply,
                } => {
                    let shard = shard.clone();
                    tokio::task::spawn_local(async move {
                        let response = shard
                            .produce_local(&topic, partition, records, acks, timeout_ms)
                            .await;
                        let _ = reply.send(response);
                    });
                }
                ShardMessage::ReplicaFetch { request, reply } => {
                    let shard = shard.clone();
                    tokio::task::spawn_local(async move {
                        let _ = reply.send(shard.replica_fetch_local(request).await);
                    });
                }
                ShardMessage::Fetch {
                    topic,
                    partition,
                    deadline,
                    reply,
                } => {
                    let shard = shard.clone();
                    tokio::task::spawn_local(async move {
                        let response = shard.fetch_local(&topic, partition, deadline).await;
                        let _ = reply.send(response);
                    });
                }
                ShardMessage::ListOffset {
                    topic,
                    partition,
                    reply,
                } => {
                    let shard = shard.clone();
                    tokio::task::spawn_local(async move {
                        let _ = reply.send(shard.list_offset_local(&topic, partition).await);
                    });
                }
                ShardMessage::ClusterChanged { view, reply } => {
                    if let Err(error) = shard.apply_view(view).await {
                        tracing::error!(shard = shard.context.index, "applying topics: {error}");
                    }
                    let _ = reply.send(());
                }
                ShardMessage::RetryUnopened => {
                    let view = shard.view.borrow().clone();
                    if let Err(error) = shard.apply_view(view).await {
                        tracing::warn!(
                            shard = shard.context.index,
                            "replicas still not open: {error}"
                        );
                    }
                }
                ShardMessage::Stats { reply } => {
                    let mut partitions: Vec<_> =
                        shard.partitions.borrow().keys().cloned().collect();
                    partitions.sort();
                    let _ = reply.send(ShardStats {
                        shard: shard.context.index,
                        partitions,
                        cross_shard_hops: shard.cross_shard_hops.get(),
                    });
                }
                ShardMessage::Metrics { reply } => {
                    let (led, under_replicated) = shard.leadership_counts();
                    let replicas = shard.partitions.borrow().len() as u64;
                    let mut snapshot = shard.metrics.snapshot(
                        shard.cross_shard_hops.get(),
                        led,
                        replicas,
                        under_replicated,
                        shard.writer_tuning.shared_sync.as_deref(),
                    );
                    snapshot.replica_lags = shard.replica_lags();
                    snapshot.tail_cache_bytes = shard.tail_caches.len() as u64;
                    let _ = reply.send(snapshot);
                }
                ShardMessage::View { reply } => {
                    let _ = reply.send(shard.view.borrow().clone());
                }
                ShardMessage::Shutdown { reply } => {
                    for listener in &listeners {
                        listener.abort();
                    }
                    for task in &replication {
                        task.abort();
                    }
                    shard.close_all().await;
                    if let Some(quic) = &shard.quic {
                        quic.close();
                    }
                    let _ = reply.send(());
                    break;
                }
            }
        }
    });
}

/// Pins the calling shard thread to one CPU of those the process may use (its affinity as
/// inherited, which `taskset`, a cpuset or `docker --cpus` narrows), so shard `i` takes the
/// i-th allowed CPU, not CPU `i`: a narrowed process keeps to its CPUs.
fn pin_to_core(index: usize) {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it, CPU_ISSET and CPU_SET read
    // and write inside it; both calls concern this thread only.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            tracing::warn!(
                "reading the CPUs shard {index} may use failed: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &allowed))
            .collect();
        let Some(&cpu) = cpus.get(index % cpus.len().max(1)) else {
            return;
        };
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size, &set) != 0 {
            tracing::warn!(
                "pinning shard {index} to CPU {cpu} failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Test hook for lost acknowledgements, off unless `STRATA_FAULT_PRODUCE_RESPONSE` is set:
/// `drop:N` drops the Nth produce response this process would send (counted from 1: the write
/// happened, its answer never comes), `exit:N` aborts the process instead of sending it,
/// `panic:N` panics in the request's handler instead. Idempotence tests use it to make
/// producers retry writes the broker already has; the panic shows how a handler's bug is
/// answered.
fn produce_response_lost() -> bool {
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

/// One partition's part of a fetch answer, and what its records count for the metrics: the
/// shard assembling the whole answer counts them if they are sent (see `answer_within`).
pub struct Fetched {
    response: FetchPartitionResponse,
    served: Option<ServedRecords>,
}

/// Records a partition's fetch read: how many, the newest one's timestamp, and when the read
/// began.
struct ServedRecords {
    records: u64,
    newest_ms: Option<i64>,
    started: Instant,
}

impl From<FetchPartitionResponse> for Fetched {
    fn from(response: FetchPartitionResponse) -> Fetched {
        Fetched {
            response,
            served: None,
        }
    }
}

/// Records in whole stored batches and the newest record's timestamp, from their headers (for
/// metrics: no body is read).
fn records_in(batches: &[u8]) -> (u64, Option<i64>) {
    let (mut records, mut newest_ms) = (0u64, None);
    let mut at = 0;
    while let Some(rest) = batches.get(at..).filter(|rest| !rest.is_empty()) {
        let Ok(header) = strata_wire::batch::BatchHeader::parse(rest) else {
            break;
        };
        records += u64::from(header.record_count);
        newest_ms = newest_ms.max(Some(header.max_timestamp_ms));
        at += header.batch_len as usize;
    }
    (records, newest_ms)
}

fn log_error_code(error: &LogError) -> ErrorCode {
    match error {
        LogError::CorruptBatch { .. } => ErrorCode::CorruptBatch,
        LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        LogError::Failed { .. } | LogError::Io { .. } => ErrorCode::StorageError,
        LogError::Config(_) => ErrorCode::InvalidConfig,
        LogError::NotContiguous { .. } => ErrorCode::Internal,
        LogError::StaleEpoch { .. } => ErrorCode::NotLeader,
        LogError::InvalidProducerBatch(_) => ErrorCode::InvalidProducerBatch,
        LogError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
            ErrorCode::OutOfOrderSequence
        }
        LogError::Producer(ProducerError::ProducerFenced { .. }) => ErrorCode::InvalidProducerEpoch,
    }
}

impl Shard {
    fn owns(&self, topic: &str, partition: u32) -> bool {
        shard_of(topic, partition, self.context.config.shards) == self.context.index
    }

    /// Leaders and followers, per the partitions this shard owns (for metrics).
    fn leadership_counts(&self) -> (u64, u64) {
        let partitions = self.partitions.borrow();
        let mut led = 0;
        let mut under_replicated = 0;
        for partition in partitions.values() {
            if let Role::Leader(leader) = &partition.role {
                led += 1;
                under_replicated += u64::from(leader.under_replicated());
            }
        }
        (led, under_replicated)
    }

    /// How far each follower of each partition this shard leads is behind (for metrics).
    fn replica_lags(&self) -> Vec<metrics::ReplicaLag> {
        let partitions = self.partitions.borrow();
        let mut lags = Vec::new();
        for ((topic, partition), replica) in partitions.iter() {
            let Role::Leader(leader) = &replica.role else {
                continue;
            };
            for (follower, log_end) in leader.follower_log_ends() {
                if let Some(log_end) = log_end {
                    lags.push(metrics::ReplicaLag {
                        topic: topic.clone(),
                        partition: *partition,
                        replica: follower,
                        records: leader.log_end().saturating_sub(log_end),
                    });
                }
            }
        }
        lags.sort_by(|a, b| {
            (&a.topic, a.partition, a.replica).cmp(&(&b.topic, b.partition, b.replica))
        });
        lags
    }

    /// Opens a replica of every partition this node holds that this shard owns (leader or
    /// follower), puts each into the role the cluster state says, and closes the rest.
    async fn apply_view(self: &Rc<Self>, view: ClusterView) -> Result<(), String> {
        let topics = view.topics.clone();
        let config = &self.context.config;
        // The view first: followers look up their leader's address in it.
        *self.view.borrow_mut() = view;
        let mut wanted = HashMap::new();
        for topic in topics.iter() {
            for partition in &topic.partitions {
                if partition.replicas.contains(&config.node_id)
                    && self.owns(&topic.name, partition.partition)
                {
                    wanted.insert(
                        (topic.name.clone(), partition.partition),
                        (topic, partition),
                    );
                }
            }
        }
        let gone: Vec<(String, u32)> = self
            .partitions
            .borrow()
            .keys()
            .filter(|key| !wanted.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            let partition = self.partitions.borrow_mut().remove(&key);
            if let Some(mut partition) = partition {
                partition.stop_role();
                let _ = partition.log.close().await;
            }
            // Not a replica here any more (reassigned away, or the topic was deleted): the
            // data goes. Leadership moving elsewhere does not come here: followers stay open.
            let still_exists = topics.iter().any(|topic| {
                topic.name == key.0 && topic.partitions.iter().any(|p| p.partition == key.1)
            });
            if still_exists {
                tracing::info!(topic = %key.0, partition = key.1, "no longer a replica here: removing its data");
            }
            let dir = config.data_dir.join(format!("{}-{}", key.0, key.1));
            if let Err(error) = self.storage.remove_dir_all(&dir).await {
                tracing::warn!("removing {}: {error}", dir.display());
            }
        }
        self.unopened
            .borrow_mut()
            .retain(|key, _| wanted.contains_key(key));
        // One replica that cannot open (a damaged folder, a full disk, no file descriptors
        // left) must not keep the others from opening or from taking their roles.
        let mut failures = Vec::new();
        for (key, (topic, state)) in wanted {
            if !self.partitions.borrow().contains_key(&key) {
                let opened = async {
                    let topic_config = TopicConfig::parse(&topic.config)
                        .map_err(|error| format!("topic {}: {error}", topic.name))?;
                    let dir = config.data_dir.join(format!("{}-{}", key.0, key.1));
                    let now = writer::system_clock_ms();
                    PartitionLog::open(self.storage, &dir, topic_config.log.clone(), now)
                        .await
                        .map(|(mut log, _report)| {
                            log.share_tail_cache(&self.tail_caches);
                            (log, topic_config)
                        })
                        .map_err(|error| error.to_string())
                };
                let (log, topic_config) = match opened.await {
                    Ok(opened) => opened,
                    Err(error) => {
                        failures.push(format!("{}-{}: {error}", key.0, key.1));
                        self.unopened.borrow_mut().insert(key, error);
                        continue;
                    }
                };
                self.unopened.borrow_mut().remove(&key);
                let flush_always = topic_config.log.flush == crate::log::FlushPolicy::Always;
                let high_watermark = log.high_watermark_checkpoint();
                let handle =
                    writer::spawn_tuned(log, writer::system_clock_ms, self.writer_tuning.clone());
                // `assume_role` sees a change from this placeholder state.
                let mut placeholder = state.clone();
                placeholder.leader_epoch = u32::MAX;
                self.partitions.borrow_mut().insert(
                    key.clone(),
                    Partition {
                        log: handle,
                        state: placeholder,
                        max_message_bytes: topic_config.max_message_bytes,
                        leader_config: LeaderConfig {
                            lag_time_max_ms: config.replica_lag_time_max_ms as i64,
                            min_insync_replicas: usize::from(topic_config.min_insync_replicas),
                        },
                        flush_always,
                        overrides: topic.config.clone(),
                        recovery_bytes_per_sec: topic_config.recovery_bytes_per_sec,
                        role: Role::Idle,
                        committed: Rc::new(tokio::sync::Notify::new()),
                        high_watermark_checkpointed: high_watermark,
                        high_watermark_checkpointed_at: Instant::now(),
                    },
                );
            }
            if let Err(error) = self.reconfigure(&key, &topic.config) {
                failures.push(error);
            }
            self.assume_role(&key, state).await;
        }
        match failures.len() {
            0 => Ok(()),
            1..=3 => Err(failures.join("; ")),
            count => Err(format!(
                "{}; and {} more",
                failures[..3].join("; "),
                count - 3
            )),
        }
    }

    /// Asks this shard's mailbox to open what it could not, every few seconds while there is
    /// any (cluster views come only with changes).
    pub(super) async fn retry_unopened_ticks(self: Rc<Self>) {
        let mut interval = tokio::time::interval(UNOPENED_RETRY);
        interval.tick().await;
        loop {
            interval.tick().await;
            if !self.unopened.borrow().is_empty() {
                let _ = self.context.peers[self.context.index].send(ShardMessage::RetryUnopened);
            }
        }
    }

    /// Why this shard does not serve `partition` of `topic` as its leader: STORAGE_ERROR for a
    /// replica it could not open, NOT_LEADER otherwise.
    fn not_serving(&self, topic: &str, partition: u32) -> ErrorCode {
        if self
            .unopened
            .borrow()
            .contains_key(&(topic.to_string(), partition))
        {
            ErrorCode::StorageError
        } else {
            ErrorCode::NotLeader
        }
    }

    /// Applies a topic's altered config to this shard's replica of one of its partitions: the
    /// log (rolls, retention, flush, direct writes), the produce limit, the leader's
    /// `min.insync.replicas`, and the topic's catch-up limit.
    fn reconfigure(
        &self,
        key: &(String, u32),
        overrides: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), String> {
        let mut partitions = self.partitions.borrow_mut();
        let Some(partition) = partitions.get_mut(key) else {
            return Ok(());
        };
        if partition.overrides == *overrides {
            return Ok(());
        }
        let topic_config =
            TopicConfig::parse(overrides).map_err(|error| format!("topic {}: {error}", key.0))?;
        tracing::info!(topic = %key.0, partition = key.1, ?overrides, "applying altered topic config");
        partition.flush_always = topic_config.log.flush == crate::log::FlushPolicy::Always;
        partition.log.reconfigure(topic_config.log);
        partition.max_message_bytes = topic_config.max_message_bytes;
        partition.leader_config.min_insync_replicas = usize::from(topic_config.min_insync_replicas);
        partition.recovery_bytes_per_sec = topic_config.recovery_bytes_per_sec;
        if let Role::Leader(leader) = &mut partition.role {
            leader.set_config(partition.leader_config);
        }
        partition.overrides = overrides.clone();
        Ok(())
    }

    async fn close_all(&self) {
        let partitions: Vec<_> = self.partitions.borrow_mut().drain().collect();
        for ((topic, partition), mut state) in partitions {
            state.stop_role();
            if let Err(error) = state.log.close().await {
                tracing::error!(%topic, partition, "closing log: {error}");
            }
        }
    }

    /// Which shard serves `partition` of `topic`, or why none does.
    fn route(&self, topic: &str, partition: u32) -> Result<usize, ErrorCode> {
        let view = self.view.borrow();
        let Some(state) = view.topics.iter().find(|t| t.name == topic) else {
            return Err(ErrorCode::UnknownTopic);
        };
        let Some(partition_state) = state.partitions.get(partition as usize) else {
            return Err(ErrorCode::UnknownPartition);
        };
        if partition_state.leader != self.context.config.node_id {
            return Err(ErrorCode::NotLeader);
        }
        Ok(shard_of(topic, partition, self.context.config.shards))
    }

    /// With NOT_LEADER, who leads the partition as far as this broker knows.
    fn leader_hint(&self, topic: &str, partition: u32, error: ErrorCode) -> i32 {
        if error != ErrorCode::NotLeader {
            return -1;
        }
        let view = self.view.borrow();
        view.topics
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.get(partition as usize))
            .map_or(-1, |p| p.leader)
    }

    pub(super) fn forward(&self, owner: usize, message: ShardMessage) -> bool {
        self.cross_shard_hops.set(self.cross_shard_hops.get() + 1);
        self.context.peers[owner].send(message).is_ok()
    }

    /// The log of a partition this shard leads, with its epoch and size limit.
    fn leader_log(&self, topic: &str, partition: u32) -> Option<(writer::LogHandle, u32, usize)> {
        let partitions = self.partitions.borrow();
        let partition = partitions.get(&(topic.to_string(), partition))?;
        let Role::Leader(leader) = &partition.role else {
            return None;
        };
        Some((
            partition.log.clone(),
            leader.epoch(),
            partition.max_message_bytes,
        ))
    }

    /// The answer to one request: none for `acks=0` produces, a response-level error code when
    /// the request could not be taken at all.
    pub async fn handle(self: &Rc<Self>, request: Request) -> Option<Result<Response, ErrorCode>> {
        if super::groups::is_group_request(&request) {
            let api = request.api_key();
            let (reply, answer) = oneshot::channel();
            let _ = self
                .context
                .groups
                .send(super::groups::GroupMessage::Request { request, reply });
            return Some(answer.await.map_err(|_| {
                tracing::warn!(?api, "the group thread is not running");
                ErrorCode::CoordinatorNotAvailable
            }));
        }
        Some(Ok(match request {
            Request::ApiVersions(_) => Response::ApiVersions(ApiVersionsResponse {
                apis: ApiKey::ALL
                    .into_iter()
                    .map(|api| {
                        let (min_version, max_version) = api.versions();
                        ApiVersionRange {
                            api_key: api as u16,
                            min_version,
                            max_version,
                        }
                    })
                    .collect(),
            }),
            Request::Metadata(request) => Response::Metadata(self.metadata(request)),
            Request::CreateTopic(request) => Response::CreateTopic(
                self.ask_control(|reply| ControlMessage::CreateTopic { request, reply })
                    .await
                    .unwrap_or_else(|| strata_wire::protocol::CreateTopicResponse {
                        error: ErrorCode::NotReady,
                        message: "the control thread is stopping".into(),
                    }),
            ),
            Request::DeleteTopic(request) => Response::DeleteTopic(
                self.ask_control(|reply| ControlMessage::DeleteTopic { request, reply })
                    .await
                    .unwrap_or(strata_wire::protocol::DeleteTopicResponse {
                        error: ErrorCode::NotReady,
                    }),
            ),
            Request::Produce(request) => {
                let acks = request.acks;
                let response = self.produce(request).await;
                if acks == strata_wire::protocol::ACKS_NONE || produce_response_lost() {
                    return None;
                }
                Response::Produce(response)
            }
            Request::Fetch(request) => Response::Fetch(self.fetch(request).await),
            Request::ListOffsets(request) => {
                Response::ListOffsets(self.list_offsets(request).await)
            }
            Request::ReassignPartition(request) => Response::ReassignPartition(
                self.ask_control(|reply| ControlMessage::Reassign { request, reply })
                    .await
                    .unwrap_or_else(|| strata_wire::protocol::ReassignPartitionResponse {
                        error: ErrorCode::NotReady,
                        message: "the node is shutting down".into(),
                    }),
            ),
            Request::CreatePartitions(request) => Response::CreatePartitions(
                self.ask_control(|reply| ControlMessage::AddPartitions { request, reply })
                    .await
                    .unwrap_or_else(|| strata_wire::protocol::CreatePartitionsResponse {
                        error: ErrorCode::NotReady,
                        message: "the node is shutting down".into(),
                    }),
            ),
            Request::ElectLeaders(request) => Response::ElectLeaders(
                self.ask_control(|reply| ControlMessage::ElectLeaders { request, reply })
                    .await
                    .unwrap_or_else(|| strata_wire::protocol::ElectLeadersResponse {
                        error: ErrorCode::NotReady,
                        message: "the node is shutting down".into(),
                        moved: 0,
                    }),
            ),
            Request::AlterTopicConfig(request) => Response::AlterTopicConfig(
                self.ask_control(|reply| ControlMessage::AlterTopicConfig { request, reply })
                    .await
                    .unwrap_or_else(|| strata_wire::protocol::AlterTopicConfigResponse {
                        error: ErrorCode::NotReady,
                        message: "the node is shutting down".into(),
                    }),
            ),
            Request::DescribeTopicConfig(request) => {
                Response::DescribeTopicConfig(self.describe_topic_config(&request.topic))
            }
            // Followers use QUIC; served here too so a TCP peer gets an answer, not a hang.
            Request::ReplicaFetch(request) => {
                Response::ReplicaFetch(self.replica_fetch(request).await)
            }
            group_request => unreachable!(
                "{:?} went to the group thread above",
                group_request.api_key()
            ),
        }))
    }

    /// A topic's effective settings from the cluster view (the coordinator's state as this node
    /// last read it).
    fn describe_topic_config(
        &self,
        topic: &str,
    ) -> strata_wire::protocol::DescribeTopicConfigResponse {
        use strata_wire::protocol::{DescribeTopicConfigResponse, TopicConfigEntry};
        let view = self.view.borrow();
        let Some(state) = view.topics.iter().find(|t| t.name == topic) else {
            return DescribeTopicConfigResponse {
                error: ErrorCode::UnknownTopic,
                configs: Vec::new(),
            };
        };
        let Ok(parsed) = TopicConfig::parse(&state.config) else {
            // Stored configs were validated before they were stored.
            return DescribeTopicConfigResponse {
                error: ErrorCode::Internal,
                configs: Vec::new(),
            };
        };
        DescribeTopicConfigResponse {
            error: ErrorCode::None,
            configs: parsed
                .entries()
                .into_iter()
                .map(|(key, value)| TopicConfigEntry {
                    key: key.to_string(),
                    is_override: state.config.contains_key(key),
                    value,
                })
                .collect(),
        }
    }

    /// Sends the control thread a request that carries its reply channel and waits for the
    /// answer; `None` when the control thread is stopping.
    pub(super) async fn ask_control<T>(
        &self,
        message: impl FnOnce(oneshot::Sender<T>) -> ControlMessage,
    ) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        let _ = self.context.control.send(message(reply));
        answer.await.ok()
    }

    fn metadata(&self, request: MetadataRequest) -> MetadataResponse {
        let config = &self.context.config;
        let view = self.view.borrow();
        let topics = &view.topics;
        let describe = |topic: &TopicState| TopicMetadata {
            name: topic.name.clone(),
            error: ErrorCode::None,
            partitions: topic
                .partitions
                .iter()
                .map(|partition| PartitionMetadata {
                    partition: partition.partition,
                    error: ErrorCode::None,
                    leader: partition.leader,
                    leader_epoch: partition.leader_epoch,
                    // The owning shard on the leader, which may run a different shard count.
                    shard: shard_of(
                        &topic.name,
                        partition.partition,
                        view.brokers
                            .iter()
                            .find(|broker| broker.id == partition.leader)
                            .map_or(config.shards, |broker| broker.shard_ports.len().max(1)),
                    ) as u16,
                    replicas: partition.replicas.clone(),
                    isr: partition.isr.clone(),
                })
                .collect(),
        };
        let topics = match request.topics {
            None => topics.iter().map(describe).collect(),
            Some(names) => names
                .into_iter()
                .map(|name| match topics.iter().find(|t| t.name == name) {
                    Some(topic) => describe(topic),
                    None => TopicMetadata {
                        name,
                        error: ErrorCode::UnknownTopic,
                        partitions: Vec::new(),
                    },
                })
                .collect(),
        };
        MetadataResponse {
            cluster: config.cluster.clone(),
            controller: view.controller,
            brokers: view
                .brokers
                .iter()
                .map(|broker| BrokerMetadata {
                    node_id: broker.id,
                    host: broker.host.clone(),
                    port: broker.port,
                    shard_ports: broker.shard_ports.clone(),
                })
                .collect(),
            topics,
        }
    }

    async fn produce(self: &Rc<Self>, request: ProduceRequest) -> ProduceResponse {
        let acks = request.acks;
        let timeout_ms = request.timeout_ms;
        let mut topics = Vec::with_capacity(request.topics.len());
        for topic in request.topics {
            let name = topic.name;
            let work = topic.partitions.into_iter().map(|partition| {
                let shard = self.clone();
                let name = name.clone();
                async move {
                    let index = partition.partition;
                    let records = partition.records.into_mut();
                    match shard.route(&name, index) {
                        Err(error) => ProducePartitionResponse {
                            leader_hint: shard.leader_hint(&name, index, error),
                            ..produce_error(index, error)
                        },
                        Ok(owner) if owner == shard.context.index => {
                            shard
                                .produce_local(&name, index, records, acks, timeout_ms)
                                .await
                        }
                        Ok(owner) => {
                            let (reply, answer) = oneshot::channel();
                            let message = ShardMessage::Produce {
                                topic: name,
                                partition: index,
                                records,
                                acks,
                                timeout_ms,
                                reply,
                            };
                            if !shard.forward(owner, message) {
                                return produce_error(index, ErrorCode::NotReady);
                            }
                            answer
                                .await
                                .unwrap_or_else(|_| produce_error(index, ErrorCode::NotReady))
                        }
                    }
                }
            });
            let partitions = futures_util::future::join_all(work).await;
            topics.push(ProduceTopicResponse { name, partitions });
        }
        ProduceResponse { topics }
    }

    /// Appends to a partition this shard leads and answers per `acks`: with 1 (or 0) once the
    /// append is as durable as the flush policy says, with `all` once the high watermark
    /// passes it (every in-sync replica has it) and the ISR is at least `min.insync.replicas`.
    async fn produce_local(
        &self,
        topic: &str,
        partition: u32,
        records: BytesMut,
        acks: i8,
        timeout_ms: u32,
    ) -> ProducePartitionResponse {
        let key = (topic.to_string(), partition);
        let Some((log, leader_epoch, max_message_bytes)) = self.leader_log(topic, partition) else {
            let error = self.not_serving(topic, partition);
            return ProducePartitionResponse {
                leader_hint: self.leader_hint(topic, partition, error),
                ..produce_error(partition, error)
            };
        };
        if records.len() > max_message_bytes {
            self.metrics.produce_failed(topic);
            return produce_error(partition, ErrorCode::MessageTooLarge);
        }
        if acks == ACKS_ALL {
            let partitions = self.partitions.borrow();
            if let Some(Role::Leader(leader)) = partitions.get(&key).map(|p| &p.role)
                && let Err(error) = leader.check_acks_all()
            {
                drop(partitions);
                self.metrics.produce_failed(topic);
                return produce_error(partition, replica::ack_error_code(error));
            }
        }
        let started = Instant::now();
        let info = match log.append(records, leader_epoch).await {
            Ok(info) => info,
            Err(error) => {
                self.metrics.produce_failed(topic);
                if !matches!(
                    error,
                    LogError::CorruptBatch { .. }
                        | LogError::StaleEpoch { .. }
                        | LogError::InvalidProducerBatch(_)
                        | LogError::Producer(_)
                ) {
                    tracing::warn!(%topic, partition, "produce failed: {error}");
                } else {
                    // The client's doing, and answered with a typed code: not worth a warning.
                    tracing::debug!(%topic, partition, "produce refused: {error}");
                }
                return produce_error(partition, log_error_code(&error));
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
                    leader.record_append_time(info.last_offset + 1, metrics::monotonic_us());
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
                    return produce_error(partition, ErrorCode::NotLeader);
                }
                _ => None,
            }
        };
        if let Some(answer) = committed {
            let timeout = std::time::Duration::from_millis(u64::from(timeout_ms.max(1)));
            let outcome = match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(outcome)) => outcome.map_err(replica::ack_error_code),
                Ok(Err(_)) => Err(ErrorCode::NotLeader),
                Err(_) => Err(ErrorCode::RequestTimedOut),
            };
            if let Err(error) = outcome {
                self.metrics.produce_failed(topic);
                return produce_error(partition, error);
            }
        }
        self.metrics.produced(
            topic,
            info.last_offset - info.base_offset + 1,
            info.bytes,
            started.elapsed().as_micros() as u64,
        );
        ProducePartitionResponse {
            partition,
            error: ErrorCode::None,
            base_offset: info.base_offset,
            log_start_offset: 0,
            leader_hint: -1,
        }
    }

    async fn fetch(self: &Rc<Self>, request: FetchRequest) -> FetchResponse {
        let deadline =
            Instant::now() + std::time::Duration::from_millis(u64::from(request.max_wait_ms));
        let min_bytes = request.min_bytes as usize;
        // One pass that does not wait; if it found less than min_bytes, wait on every empty
        // partition until the first one has data or the deadline passes.
        let first = self.fetch_all(&request, None).await;
        let found: usize = first
            .iter()
            .flat_map(|(_, partitions)| partitions.iter().map(|p| p.response.records.len()))
            .sum();
        if found >= min_bytes.max(1) || request.max_wait_ms == 0 {
            return self.answer_within(first, request.max_bytes);
        }
        let waited = self.fetch_all(&request, Some(deadline)).await;
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
    fn answer_within(&self, slots: Vec<(String, Vec<Fetched>)>, max_bytes: u32) -> FetchResponse {
        let mut left = max_bytes as usize;
        let mut first = true;
        let mut topics = Vec::with_capacity(slots.len());
        for (name, fetched) in slots {
            let mut partitions = Vec::with_capacity(fetched.len());
            for Fetched {
                mut response,
                served,
            } in fetched
            {
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
        FetchResponse { topics }
    }

    fn count_served(&self, topic: &str, bytes: usize, served: &ServedRecords) {
        self.metrics.fetched(
            topic,
            served.records,
            bytes as u64,
            served.started.elapsed().as_micros() as u64,
        );
        if let Some(newest_ms) = served.newest_ms {
            let age_ms = writer::system_clock_ms().saturating_sub(newest_ms).max(0);
            self.metrics.served_age(age_ms as u64 * 1000);
        }
    }

    /// Fetches every partition of the request. With a deadline, returns as soon as any
    /// partition has data (the others answer empty).
    async fn fetch_all(
        self: &Rc<Self>,
        request: &FetchRequest,
        deadline: Option<Instant>,
    ) -> Vec<(String, Vec<Fetched>)> {
        let mut slots: Vec<(String, Vec<Fetched>)> = Vec::new();
        let mut work = Vec::new();
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
                    (at, shard.fetch_partition(name, partition, deadline).await)
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

    async fn fetch_partition(
        self: &Rc<Self>,
        topic: String,
        partition: FetchPartition,
        deadline: Option<Instant>,
    ) -> Fetched {
        let index = partition.partition;
        match self.route(&topic, index) {
            Err(error) => FetchPartitionResponse {
                leader_hint: self.leader_hint(&topic, index, error),
                ..fetch_error(index, error, 0, 0)
            }
            .into(),
            Ok(owner) if owner == self.context.index => {
                self.fetch_local(&topic, partition, deadline).await
            }
            Ok(owner) => {
                let (reply, answer) = oneshot::channel();
                let message = ShardMessage::Fetch {
                    topic,
                    partition,
                    deadline,
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
    fn leader_view(
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

    /// Whether this replica leads `topic`-`partition` with a high watermark no earlier
    /// leader's is ahead of ([`crate::replication::Leader::high_watermark_settled`]).
    fn high_watermark_settled(&self, topic: &str, partition: u32) -> bool {
        let partitions = self.partitions.borrow();
        matches!(
            partitions.get(&(topic.to_string(), partition)).map(|p| &p.role),
            Some(Role::Leader(leader)) if leader.high_watermark_settled()
        )
    }

    /// Consumers see only committed records: below the high watermark. A fetch at the high
    /// watermark long-polls until it moves.
    async fn fetch_local(
        &self,
        topic: &str,
        partition: FetchPartition,
        deadline: Option<Instant>,
    ) -> Fetched {
        let index = partition.partition;
        let started = Instant::now();
        let Some((log, mut high_watermark, committed)) = self.leader_view(topic, index) else {
            let error = self.not_serving(topic, index);
            return FetchPartitionResponse {
                leader_hint: self.leader_hint(topic, index, error),
                ..fetch_error(index, error, 0, 0)
            }
            .into();
        };
        let Ok(offsets) = log.offsets().await else {
            return fetch_error(index, ErrorCode::StorageError, 0, 0).into();
        };
        let offset = partition.fetch_offset;
        if offset < offsets.log_start || offset > offsets.log_end {
            return fetch_error(
                index,
                ErrorCode::OffsetOutOfRange,
                high_watermark,
                offsets.log_start,
            )
            .into();
        }
        if let Some(deadline) = deadline {
            // Single-threaded: nothing can advance the high watermark between the check and
            // the wait's registration, so no wake-up is missed.
            while offset >= high_watermark {
                let wait = tokio::time::timeout_at(deadline.into(), committed.notified());
                if wait.await.is_err() {
                    break;
                }
                match self.leader_view(topic, index) {
                    Some((_, now, _)) => high_watermark = now,
                    None => {
                        return fetch_error(index, ErrorCode::NotLeader, 0, 0).into();
                    }
                }
            }
        }
        if offset >= high_watermark {
            return fetch_error(index, ErrorCode::None, high_watermark, offsets.log_start).into();
        }
        match log
            .read_for_sending(offset, partition.max_bytes as usize, high_watermark)
            .await
        {
            Ok(served) => {
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
                Fetched {
                    response: FetchPartitionResponse {
                        partition: index,
                        error: ErrorCode::None,
                        high_watermark,
                        log_start_offset: offsets.log_start,
                        leader_hint: -1,
                        records: bytes,
                    },
                    served: Some(ServedRecords {
                        records,
                        newest_ms,
                        started,
                    }),
                }
            }
            Err(error) => fetch_error(
                index,
                log_error_code(&error),
                high_watermark,
                offsets.log_start,
            )
            .into(),
        }
    }

    async fn list_offsets(self: &Rc<Self>, request: ListOffsetsRequest) -> ListOffsetsResponse {
        let mut topics = Vec::new();
        for topic in request.topics {
            let mut partitions = Vec::new();
            for partition in topic.partitions {
                let index = partition.partition;
                let response = match self.route(&topic.name, index) {
                    Err(error) => list_error(index, error),
                    Ok(owner) if owner == self.context.index => {
                        self.list_offset_local(&topic.name, partition).await
                    }
                    Ok(owner) => {
                        let (reply, answer) = oneshot::channel();
                        let message = ShardMessage::ListOffset {
                            topic: topic.name.clone(),
                            partition,
                            reply,
                        };
                        if self.forward(owner, message) {
                            answer
                                .await
                                .unwrap_or_else(|_| list_error(index, ErrorCode::NotReady))
                        } else {
                            list_error(index, ErrorCode::NotReady)
                        }
                    }
                };
                partitions.push(response);
            }
            topics.push(ListOffsetsTopicResponse {
                name: topic.name,
                partitions,
            });
        }
        ListOffsetsResponse { topics }
    }

    async fn list_offset_local(
        &self,
        topic: &str,
        partition: ListOffsetsPartition,
    ) -> ListOffsetsPartitionResponse {
        let index = partition.partition;
        let Some((log, high_watermark, _)) = self.leader_view(topic, index) else {
            return list_error(index, ErrorCode::NotLeader);
        };
        // Offsets a reader is told never go backwards: a new leader answers only once its
        // high watermark is at least every earlier leader's (as Kafka's brokers do).
        if !self.high_watermark_settled(topic, index) {
            return list_error(index, ErrorCode::OffsetNotAvailable);
        }
        let found = match partition.timestamp {
            EARLIEST_TIMESTAMP => log
                .offsets()
                .await
                .map(|offsets| Some((offsets.log_start, -1))),
            // The end a consumer can read to: the high watermark (Kafka's read_uncommitted).
            LATEST_TIMESTAMP => Ok(Some((high_watermark, -1))),
            // Only committed records are found: one past the high watermark may yet be
            // truncated away.
            timestamp => log
                .offset_for_timestamp(timestamp)
                .await
                .map(|found| found.filter(|(offset, _)| *offset < high_watermark)),
        };
        match found {
            Ok(Some((offset, timestamp))) => ListOffsetsPartitionResponse {
                partition: index,
                error: ErrorCode::None,
                offset: offset as i64,
                timestamp,
            },
            Ok(None) => ListOffsetsPartitionResponse {
                partition: index,
                error: ErrorCode::None,
                offset: -1,
                timestamp: -1,
            },
            Err(error) => list_error(index, log_error_code(&error)),
        }
    }
}

fn produce_error(partition: u32, error: ErrorCode) -> ProducePartitionResponse {
    ProducePartitionResponse {
        partition,
        error,
        base_offset: 0,
        log_start_offset: 0,
        leader_hint: -1,
    }
}

fn fetch_error(
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

fn list_error(partition: u32, error: ErrorCode) -> ListOffsetsPartitionResponse {
    ListOffsetsPartitionResponse {
        partition,
        error,
        offset: -1,
        timestamp: -1,
    }
}
