//! One shard: a thread, its runtime, the partitions it owns, and its listeners.

pub(crate) mod admin;
mod fetch;
pub(crate) use fetch::read_cached_region;
mod lag;
mod metadata;
mod offsets;
mod produce;
mod replica;
pub(crate) mod share;
mod tiering;
mod transactions;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use strata_wire::protocol::{
    ApiKey, ApiVersionRange, ApiVersionsResponse, ErrorCode, Request, Response,
};
use tokio::sync::{mpsc, oneshot};

use super::NodeConfig;
use super::messages::ControlMessage;
use super::messages::{ClusterView, Delivery, GroupMessage, ShardMessage, ShardStats};
use super::metrics;
use super::quic::QuicPeer;
use super::topic_config::TopicConfig;
use crate::io::{self, AnyStorage, Backend, Storage};
use crate::log::producers::ProducerError;
use crate::log::shared_sync::{self, SharedSync};
use crate::log::tail_cache::TailCaches;
use crate::log::{LogError, PartitionLog, writer};
use crate::replication::{LeaderConfig, RecoveryThrottle};
use replica::{Partition, Role};

/// How often a shard tries again to open replicas it could not.
const UNOPENED_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub struct ShardContext {
    pub index: usize,
    pub config: Arc<NodeConfig>,
    pub peers: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    pub control: mpsc::UnboundedSender<ControlMessage>,
    /// The group thread: consumer groups and producer ids.
    pub groups: mpsc::UnboundedSender<GroupMessage>,
    pub backend: Backend,
    /// The remote tier, when the node has one.
    pub tier: Option<crate::server::tier::Tier>,
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
    /// The share-partitions of the partitions this shard leads, by (group, topic, partition).
    pub(crate) shares: share::SharePartitions,
    /// Share sessions of Kafka clients connected to this shard, by (group, member): a client
    /// reconnecting elsewhere hears SHARE_SESSION_NOT_FOUND and opens a new one.
    pub(crate) share_sessions: RefCell<HashMap<(String, String), share::ShareSession>>,
    /// Requests forwarded to another shard (a metric: shard-aware clients keep it near zero).
    pub cross_shard_hops: Cell<u64>,
    pub(super) metrics: metrics::ShardMetrics,
    /// This shard's replication endpoint.
    pub(super) quic: Option<QuicPeer>,
    /// This shard's share of the node's limit on catch-up replication (as set live, else at
    /// start); `None`: no limit.
    pub(super) recovery_throttle: RefCell<Option<RecoveryThrottle>>,
    /// The memory budget every log on this shard keeps its newest appends within.
    tail_caches: TailCaches,
    /// This shard's share of each topic's own catch-up limit (`replica.recovery.bytes.per.sec`),
    /// by topic: made on the first catch-up fetch, made anew when the setting changes.
    pub(super) topic_recovery_throttles: RefCell<HashMap<String, RecoveryThrottle>>,
    /// How this shard's log tasks group their IO (from `strata iotune`, or the defaults); its
    /// write limit is shared by this shard's logs only.
    writer_tuning: writer::WriterTuning,
    /// What this shard's clients and, as reported, the other shards' used of their quotas.
    pub(super) quota_usage: RefCell<crate::quota::QuotaUsage>,
    /// The remote manifests of the tiered partitions this shard leads, once claimed.
    pub(super) remote: RefCell<HashMap<(String, u32), tiering::RemotePartition>>,
}

/// Starts a shard's listeners once its partitions are open (given by the server, which knows
/// the listeners: the shard knows only that it is served).
/// How often a shard reports its clients' quota usage to the other shards: well within a
/// quota window, so a client spread over shards overshoots by at most this much of its usage.
const QUOTA_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

pub type Listen = fn(&Rc<Shard>) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>>;

/// A shard's view before the first one arrives: no controller known.
fn no_view_yet() -> RefCell<ClusterView> {
    RefCell::new(ClusterView {
        controller: -1,
        ..ClusterView::default()
    })
}

pub fn run(
    context: ShardContext,
    view: ClusterView,
    mut mailbox: mpsc::UnboundedReceiver<ShardMessage>,
    ready: oneshot::Sender<Result<(), String>>,
    listen: Listen,
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
        let context_quota_window = context.config.quota_window;
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
        let recovery_throttle =
            RefCell::new(context.config.replica_recovery_bytes_per_sec.map(|rate| {
                let share = RecoveryThrottle::shard_share(rate, shards);
                RecoveryThrottle::new(share, context.config.clock.now())
            }));
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
            view: no_view_yet(),
            partitions: RefCell::new(HashMap::new()),
            unopened: RefCell::new(HashMap::new()),
            cross_shard_hops: Cell::new(0),
            shares: share::SharePartitions::default(),
            share_sessions: RefCell::new(HashMap::new()),
            metrics,
            writer_tuning,
            quota_usage: RefCell::new(crate::quota::QuotaUsage::new(context_quota_window)),
            remote: RefCell::new(HashMap::new()),
        });
        if let Err(error) = shard.apply_view(view).await {
            let _ = ready.send(Err(error));
            return;
        }
        let listeners = match listen(&shard) {
            Ok(listeners) => listeners,
            Err(error) => {
                let _ = ready.send(Err(error.to_string()));
                return;
            }
        };
        let replication = shard.start_ticks();
        let _ = ready.send(Ok(()));
        while let Some(message) = mailbox.recv().await {
            let Some(message) = serve_peer_request(&shard, message) else {
                continue;
            };
            match message {
                ShardMessage::Produce { .. }
                | ShardMessage::ReplicaFetch { .. }
                | ShardMessage::Fetch { .. }
                | ShardMessage::WriteTxnMarkers { .. } => unreachable!("served above"),
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
                    let _ = reply.send(shard.stats());
                }
                ShardMessage::Metrics { reply } => {
                    let _ = reply.send(shard.metrics_snapshot());
                }
                ShardMessage::View { reply } => {
                    let _ = reply.send(shard.view.borrow().clone());
                }
                ShardMessage::GroupPosition(asked) => shard.answer_position(asked),
                ShardMessage::Run(work) => work(shard.clone() as Rc<dyn std::any::Any>),
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

fn log_error_code(error: &LogError) -> ErrorCode {
    match error {
        LogError::CorruptBatch {
            source: strata_wire::batch::BatchError::MissingKeys { .. },
            ..
        } => ErrorCode::InvalidRecord,
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
        LogError::Producer(ProducerError::CoordinatorFenced { .. }) => {
            ErrorCode::TransactionCoordinatorFenced
        }
        LogError::LogEndMismatch { .. } => ErrorCode::LogEndMismatch,
    }
}

impl Shard {
    /// This shard's metrics as `/metrics` renders them.
    fn metrics_snapshot(&self) -> metrics::Snapshot {
        let (led, under_replicated) = self.leadership_counts();
        let replicas = self.partitions.borrow().len() as u64;
        let mut snapshot = self.metrics.snapshot(
            self.cross_shard_hops.get(),
            led,
            replicas,
            under_replicated,
            self.writer_tuning.shared_sync.as_deref(),
        );
        snapshot.replica_lags = self.replica_lags();
        snapshot.open_transactions = self.open_transactions();
        snapshot.tail_cache_bytes = self.tail_caches.len() as u64;
        snapshot.reads = self.tail_caches.read_totals();
        snapshot.share_partitions = self.share_metrics();
        snapshot
    }

    /// Where this shard reads the time (the node's one clock).
    pub(super) fn clock(&self) -> crate::clock::Clock {
        self.context.config.clock
    }

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

    /// The open transactions of each partition this shard leads (for metrics).
    fn open_transactions(&self) -> Vec<metrics::PartitionTransactions> {
        let now_ms = self.clock().wall_ms();
        let partitions = self.partitions.borrow();
        let mut open: Vec<_> = partitions
            .iter()
            .filter(|(_, replica)| matches!(replica.role, Role::Leader(_)))
            .filter_map(|((topic, partition), replica)| {
                let txns = replica.log.open_transactions();
                let oldest = txns.oldest_started_ms?;
                Some(metrics::PartitionTransactions {
                    topic: topic.clone(),
                    partition: *partition,
                    open: txns.count,
                    oldest_age_seconds: now_ms.saturating_sub(oldest).max(0) as f64 / 1000.0,
                })
            })
            .collect();
        open.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        open
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
        // Each topic's overrides on top of the topic defaults set live.
        let dynamic = view.dynamic.clone();
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
            } else {
                self.delete_remote_partition(&key);
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
            let settings = dynamic.topic_config(&topic.config);
            if !self.partitions.borrow().contains_key(&key) {
                let opened = async {
                    let topic_config = TopicConfig::parse(&settings)
                        .map_err(|error| format!("topic {}: {error}", topic.name))?;
                    let dir = config.data_dir.join(format!("{}-{}", key.0, key.1));
                    let now = self.clock().wall_ms();
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
                let handle = writer::spawn_tuned(log, self.clock(), self.writer_tuning.clone());
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
                        settings: settings.clone(),
                        recovery_bytes_per_sec: topic_config.recovery_bytes_per_sec,
                        compacted: topic_config.log.cleanup.compact,
                        remote_storage: topic_config.log.remote_storage,
                        retention: (
                            topic_config.log.retention_ms,
                            topic_config.log.retention_bytes,
                        ),
                        role: Role::Idle,
                        committed: Rc::new(tokio::sync::Notify::new()),
                        high_watermark_checkpointed: high_watermark,
                        high_watermark_checkpointed_at: self.clock().now(),
                    },
                );
            }
            if let Err(error) = self.reconfigure(&key, &settings) {
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
        let mut interval = self.clock().ticks(UNOPENED_RETRY);
        interval.tick().await;
        loop {
            interval.tick().await;
            if !self.unopened.borrow().is_empty() {
                let _ = self.context.peers[self.context.index].send(ShardMessage::RetryUnopened);
            }
        }
    }

    /// Starts the shard's periodic work: replication, retention, the cleaner, retries of
    /// replicas not opened, quota reports.
    fn start_ticks(self: &Rc<Self>) -> [tokio::task::JoinHandle<()>; 6] {
        [
            tokio::task::spawn_local(self.clone().tiering_ticks()),
            tokio::task::spawn_local(self.clone().replication_ticks()),
            tokio::task::spawn_local(self.clone().retention_ticks()),
            tokio::task::spawn_local(self.clone().cleaner_ticks()),
            tokio::task::spawn_local(self.clone().retry_unopened_ticks()),
            tokio::task::spawn_local(self.clone().quota_ticks()),
        ]
    }

    /// Tells the other shards what this shard's clients used of their quotas, a few times a
    /// second while they use any, so each shard holds a client to its quota for the whole
    /// broker (see [`crate::quota`]).
    pub(super) async fn quota_ticks(self: Rc<Self>) {
        let mut interval = self.clock().ticks(QUOTA_REPORT_INTERVAL);
        loop {
            interval.tick().await;
            let reports = self
                .quota_usage
                .borrow_mut()
                .take_reports(self.context.config.clock.now());
            if reports.is_empty() {
                continue;
            }
            let reports = std::sync::Arc::new(reports);
            for owner in (0..self.context.config.shards).filter(|&i| i != self.context.index) {
                let reports = reports.clone();
                let message = ShardMessage::Run(Box::new(move |shard: Rc<dyn std::any::Any>| {
                    let shard = shard
                        .downcast::<Shard>()
                        .expect("a shard runs its mailbox's work");
                    let now = shard.context.config.clock.now();
                    let mut usage = shard.quota_usage.borrow_mut();
                    for report in reports.iter() {
                        usage.record_remote(report, now);
                    }
                }));
                let _ = self.context.peers[owner].send(message);
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
        settings: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), String> {
        let mut partitions = self.partitions.borrow_mut();
        let Some(partition) = partitions.get_mut(key) else {
            return Ok(());
        };
        if partition.settings == *settings {
            return Ok(());
        }
        let topic_config =
            TopicConfig::parse(settings).map_err(|error| format!("topic {}: {error}", key.0))?;
        tracing::info!(topic = %key.0, partition = key.1, ?settings, "applying altered topic config");
        partition.flush_always = topic_config.log.flush == crate::log::FlushPolicy::Always;
        partition.compacted = topic_config.log.cleanup.compact;
        partition.remote_storage = topic_config.log.remote_storage;
        partition.retention = (
            topic_config.log.retention_ms,
            topic_config.log.retention_bytes,
        );
        partition.log.reconfigure(topic_config.log);
        partition.max_message_bytes = topic_config.max_message_bytes;
        partition.leader_config.min_insync_replicas = usize::from(topic_config.min_insync_replicas);
        partition.recovery_bytes_per_sec = topic_config.recovery_bytes_per_sec;
        if let Role::Leader(leader) = &mut partition.role {
            leader.set_config(partition.leader_config);
        }
        partition.settings = settings.clone();
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

    /// What this shard owns and how often it forwarded.
    fn stats(&self) -> ShardStats {
        let mut partitions: Vec<_> = self.partitions.borrow().keys().cloned().collect();
        partitions.sort();
        ShardStats {
            shard: self.context.index,
            partitions,
            cross_shard_hops: self.cross_shard_hops.get(),
        }
    }

    /// Which shard serves `partition` of `topic`, or why none does.
    pub(in crate::server) fn route(&self, topic: &str, partition: u32) -> Result<usize, ErrorCode> {
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
                .send(GroupMessage::Request { request, reply });
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
                if acks == strata_wire::protocol::ACKS_NONE || produce::produce_response_lost() {
                    return None;
                }
                Response::Produce(response)
            }
            Request::Fetch(request) => {
                Response::Fetch(self.fetch(request, Delivery::FileRanges).await)
            }
            Request::DeleteRecords(request) => {
                Response::DeleteRecords(self.delete_records(request).await)
            }
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
                        results: Default::default(),
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
            // Answered by the listener, which knows who asks.
            Request::Authenticate(_)
            | Request::DescribeUsers(_)
            | Request::AlterUser(_)
            | Request::DescribeAcls(_)
            | Request::CreateAcls(_)
            | Request::DeleteAcls(_)
            | Request::DescribeQuotas(_)
            | Request::AlterQuotas(_)
            | Request::DescribeBrokerConfigs(_)
            | Request::AlterBrokerConfigs(_)
            | Request::DescribeGroupConfigs(_)
            | Request::AlterGroupConfigs(_)
            | Request::ShareGroupHeartbeat(_)
            | Request::ShareFetch(_)
            | Request::ShareAcknowledge(_)
            | Request::DescribeSharePartitions(_) => return Some(Err(ErrorCode::InvalidRequest)),
            Request::ReplicaFetch(request) => {
                Response::ReplicaFetch(self.replica_fetch(request).await)
            }
            Request::WriteTxnMarkers(request) => {
                Response::WriteTxnMarkers(self.write_txn_markers(request, false).await)
            }
            group_request => unreachable!(
                "{:?} went to the group thread above",
                group_request.api_key()
            ),
        }))
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
}

/// Serves another shard's (or the group thread's) request on a task of its own; any other
/// message comes back for the mailbox loop.
fn serve_peer_request(shard: &Rc<Shard>, message: ShardMessage) -> Option<ShardMessage> {
    match message {
        ShardMessage::Produce {
            topic,
            partition,
            records,
            terms,
            source,
            reply,
        } => {
            let shard = shard.clone();
            tokio::task::spawn_local(async move {
                let response = shard
                    .produce_local(&topic, partition, records, terms, source)
                    .await;
                let _ = reply.send(response);
            });
        }
        ShardMessage::WriteTxnMarkers { request, reply } => {
            let shard = shard.clone();
            tokio::task::spawn_local(async move {
                let _ = reply.send(shard.write_txn_markers(request, true).await);
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
            delivery,
            read_committed,
            reply,
        } => {
            let shard = shard.clone();
            tokio::task::spawn_local(async move {
                let response = shard
                    .fetch_local(&topic, partition, deadline, delivery, read_committed)
                    .await;
                let _ = reply.send(response);
            });
        }
        other => return Some(other),
    }
    None
}
