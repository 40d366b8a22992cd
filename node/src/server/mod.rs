//! The broker runtime: thread-per-core shards serving the native protocol.
//!
//! ```text
//!            ┌──────── control thread: the Coordinator (topics, brokers) ───────┐
//!            │  CreateTopic/DeleteTopic → persist → TopicsChanged to every shard │
//!            └───────────────────────────────────────────────────────────────────┘
//!  shard 0 (core 0)                      shard 1 (core 1)              ...
//!  listens on the client port            listens on the client port (SO_REUSEPORT)
//!  and on port + 10 + 0                  and on port + 10 + 1
//!  owns partitions p with                owns partitions p with
//!  shard_of(topic, p) == 0               shard_of(topic, p) == 1
//!  one log task per owned partition      ...
//! ```
//!
//! Invariants: only the owning shard touches a partition's files and state; shards share no
//! locks, they exchange [`messages::ShardMessage`]s over channels (counted as cross-shard hops).
//! Requests for another shard's partition are forwarded and answered there.

pub(crate) mod broker_config;
mod control;
pub(crate) mod group_config;
mod groups;
mod listener;
mod messages;
mod metrics;
pub mod quic;
pub mod security;
mod shard;
mod share_fetch;
pub mod tier;
pub mod topic_config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use strata_coordinator::BrokerInfo;
use tokio::sync::{mpsc, oneshot};

use crate::io::Backend;
pub use messages::{ClusterView, SecurityView, ShardStats};
pub use shard::shard_of;

/// Everything `strata serve` needs (after config file, env and flags are merged).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    pub node_id: i32,
    pub cluster: String,
    /// The shared client port; shard `i` also listens on port + 10 + i.
    pub listen: SocketAddr,
    /// The security protocol of the native listener (`--listen ssl://...`).
    pub listen_protocol: security::SecurityProtocol,
    /// Further native listeners, at most one per security protocol (each with its own shard
    /// ports, `PORT + 10 + i`), e.g. a plaintext one on loopback beside a `sasl_ssl` one.
    pub more_listeners: Vec<security::ListenerSpec>,
    /// The host clients are told to connect to.
    pub advertised_host: String,
    pub shards: usize,
    /// Larger request frames get MESSAGE_TOO_LARGE and the connection is closed.
    pub max_frame_bytes: usize,
    /// Pin shard threads to cores.
    pub pin_cores: bool,
    /// TCP congestion control of client connections; `None`: the host's default.
    pub tcp_congestion: Option<String>,
    /// etcd endpoints; `None` runs on the embedded coordinator.
    pub etcd: Option<Vec<String>>,
    /// How long a broker's registration outlives its last keep-alive (etcd only).
    pub lease_ttl: std::time::Duration,
    /// This broker's rack, for rack-aware replica placement.
    pub rack: Option<String>,
    /// The admin HTTP endpoint (`/metrics`, `/health`, `/v1/cluster`); `None`: off.
    pub admin: Option<SocketAddr>,
    /// The Kafka-protocol listeners, at most one per security protocol (every shard accepts
    /// on each); empty: off.
    pub kafka: Vec<security::ListenerSpec>,
    /// TLS client certificates, SASL mechanisms, authorization.
    pub security: security::SecurityConfig,
    /// Kafka's `auto.create.topics.enable`: a topic a Kafka client asks for that does not exist
    /// is created, with [`NodeConfig::kafka_topic_defaults`].
    pub kafka_auto_create_topics: bool,
    /// Partitions and replication factor of topics Kafka clients create without naming them
    /// (Kafka's `num.partitions`, `default.replication.factor`).
    pub kafka_topic_defaults: strata_kafka::admin::TopicDefaults,
    /// Replication (QUIC over UDP): shard `i` binds this port + i.
    pub replication: SocketAddr,
    /// A follower not caught up for this long leaves the ISR (`replica.lag.time.max.ms`).
    pub replica_lag_time_max_ms: u64,
    /// The most this node's leaders send per second to replicas outside the ISR, split evenly
    /// over its shards (Kafka's `leader.replication.throttled.rate`); `None`: no limit.
    pub replica_recovery_bytes_per_sec: Option<u64>,
    /// The memory this node's leaders keep their newest direct-written appends in for readers
    /// at the tail, split evenly over its shards (see `log::tail_cache`; the binary's default is
    /// `TAIL_CACHE_BYTES` per shard).
    pub tail_cache_bytes: u64,
    /// How often the controller moves leaderships back to preferred replicas (Kafka's
    /// `auto.leader.rebalance.enable` with `leader.imbalance.check.interval.seconds`); `None`:
    /// never.
    pub leader_rebalance_interval: Option<std::time::Duration>,
    /// A consumer group without members and without commits for this long is deleted with
    /// its offsets (Kafka's `offsets.retention.minutes`); `None`: never.
    pub offsets_retention: Option<std::time::Duration>,
    /// How long a Kafka consumer group out of Empty waits for more members before its first
    /// generation, and again each time one more joins in that wait (Kafka's
    /// `group.initial.rebalance.delay.ms`); 0: at once.
    pub group_initial_rebalance_delay_ms: u64,
    /// How long a KIP-848 consumer group member may be silent before it is expired (Kafka's
    /// `group.consumer.session.timeout.ms`: such members do not choose their own).
    pub group_consumer_session_timeout_ms: u32,
    /// How often shards enforce their partitions' retention.
    pub retention_check_interval: std::time::Duration,
    /// Each shard's log cleaner (compacted topics).
    pub cleaner: CleanerConfig,
    /// The sampled windows client quotas are measured over.
    pub quota_window: crate::quota::QuotaWindow,
    /// Certificates for replication's TLS; `None`: a self-signed certificate per node.
    pub tls: Option<quic::TlsFiles>,
    /// What `strata iotune` measured and chose; `None`: default IO settings.
    pub io_properties: Option<crate::iotune::IoProperties>,
    /// Where every thread of the node reads the time.
    pub clock: crate::clock::Clock,
    /// The remote tier (`--remote-storage`); `None`: topics cannot enable remote storage.
    pub remote_storage: Option<tier::TierConfig>,
}

/// What each shard's log cleaner may use, and how often it looks for work.
#[derive(Debug, Clone)]
pub struct CleanerConfig {
    /// The key map's memory, per shard (`--cleaner-memory-bytes`); allocated at the shard's
    /// first clean.
    pub memory_bytes: usize,
    /// The node's cleaner reads and writes per second, shared evenly by its shards; `None`:
    /// no limit.
    pub io_bytes_per_sec: Option<u64>,
    /// How often each shard looks for a compacted partition due for a clean (Kafka's
    /// `log.cleaner.backoff.ms`).
    pub check_interval: std::time::Duration,
}

/// The least `--cleaner-memory-bytes` takes: room for about 44,000 keys a pass.
pub const CLEANER_MEMORY_MIN_BYTES: usize = 1 << 20;

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            memory_bytes: 64 << 20,
            io_bytes_per_sec: None,
            check_interval: std::time::Duration::from_secs(15),
        }
    }
}

impl NodeConfig {
    /// A node of one shard, `node_id`, keeping its data in `data_dir`, on loopback ports the
    /// test never binds: for tests of one thread's logic.
    #[cfg(test)]
    pub(crate) fn for_tests(data_dir: PathBuf, node_id: i32) -> NodeConfig {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        NodeConfig {
            data_dir,
            node_id,
            cluster: "test".into(),
            listen: loopback(1),
            listen_protocol: security::SecurityProtocol::Plaintext,
            more_listeners: Vec::new(),
            advertised_host: "127.0.0.1".into(),
            shards: 1,
            max_frame_bytes: 64 << 20,
            pin_cores: false,
            tcp_congestion: None,
            etcd: None,
            lease_ttl: std::time::Duration::from_secs(5),
            rack: None,
            admin: None,
            kafka: Vec::new(),
            security: Default::default(),
            kafka_auto_create_topics: false,
            kafka_topic_defaults: Default::default(),
            group_initial_rebalance_delay_ms: 0,
            group_consumer_session_timeout_ms: 45_000,
            replication: loopback(2),
            replica_lag_time_max_ms: 10_000,
            replica_recovery_bytes_per_sec: None,
            tail_cache_bytes: 64 << 20,
            leader_rebalance_interval: None,
            offsets_retention: None,
            retention_check_interval: std::time::Duration::from_secs(300),
            cleaner: Default::default(),
            quota_window: Default::default(),
            tls: None,
            io_properties: None,
            clock: crate::clock::Clock::SYSTEM,
            remote_storage: None,
        }
    }

    pub fn shard_port(&self, shard: usize) -> u16 {
        listener_shard_port(self.listen.port(), shard)
    }

    /// Every native listener: `listen` first.
    pub fn native_listeners(&self) -> Vec<security::ListenerSpec> {
        let first = security::ListenerSpec {
            protocol: self.listen_protocol,
            address: self.listen,
        };
        std::iter::once(first)
            .chain(self.more_listeners.iter().copied())
            .collect()
    }

    pub fn replication_addr(&self, shard: usize) -> SocketAddr {
        SocketAddr::new(
            self.replication.ip(),
            self.replication.port() + shard as u16,
        )
    }

    pub fn broker_info(&self) -> BrokerInfo {
        BrokerInfo {
            id: self.node_id,
            host: self.advertised_host.clone(),
            port: self.listen.port(),
            shard_ports: (0..self.shards).map(|i| self.shard_port(i)).collect(),
            replication_ports: (0..self.shards)
                .map(|i| self.replication_addr(i).port())
                .collect(),
            // Bound to its own address (not a wildcard, not the client one): followers must
            // dial that address, not the client host.
            replication_host: (!self.replication.ip().is_unspecified()
                && self.replication.ip() != self.listen.ip())
            .then(|| self.replication.ip().to_string()),
            rack: self.rack.clone(),
            kafka_port: self.kafka.first().map(|kafka| kafka.address.port()),
            kafka_listeners: self
                .kafka
                .iter()
                .map(|listener| strata_coordinator::AdvertisedListener {
                    name: listener.protocol.name().to_string(),
                    port: listener.address.port(),
                })
                .collect(),
            native_listeners: self
                .more_listeners
                .iter()
                .map(|listener| strata_coordinator::AdvertisedNativeListener {
                    name: listener.protocol.name().to_string(),
                    port: listener.address.port(),
                    shard_ports: (0..self.shards)
                        .map(|shard| listener_shard_port(listener.address.port(), shard))
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Shard `shard`'s own port of a native listener on `port`.
pub fn listener_shard_port(port: u16, shard: usize) -> u16 {
    port + 10 + shard as u16
}

/// A running node; `shutdown` stops it cleanly (in-flight appends finish and are flushed).
pub struct Node {
    shards: Vec<std::thread::JoinHandle<()>>,
    control: std::thread::JoinHandle<()>,
    mailboxes: Arc<Vec<mpsc::UnboundedSender<messages::ShardMessage>>>,
    control_mailbox: mpsc::UnboundedSender<messages::ControlMessage>,
    groups: std::thread::JoinHandle<()>,
}

impl Node {
    /// Opens the data directory, starts the control thread and the shards, and returns once
    /// every shard has opened its partitions and is listening.
    pub fn start(config: NodeConfig) -> anyhow::Result<Node> {
        anyhow::ensure!(config.shards >= 1, "--shards must be at least 1");
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
        let backend = Backend::detect();
        let config = Arc::new(config);

        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..config.shards {
            let (sender, receiver) = mpsc::unbounded_channel();
            senders.push(sender);
            receivers.push(receiver);
        }
        let mailboxes = Arc::new(senders);
        // Before anything else starts: a bad URL or refused credentials stop the broker here.
        let tier = match &config.remote_storage {
            Some(remote) => Some(tier::Tier::start(remote, config.shards)?),
            None => None,
        };
        let (control_mailbox, control_receiver) = mpsc::unbounded_channel();
        // The control thread opens the coordinator (on its own runtime) and registers this
        // broker; the shards start from the cluster state it read. The group thread follows
        // the same views.
        let (views, view_receiver) = tokio::sync::watch::channel(ClusterView::default());
        let (control, view) =
            control::start(config.clone(), mailboxes.clone(), views, control_receiver)?;
        let (groups_mailbox, groups_receiver) = mpsc::unbounded_channel();
        let groups = groups::start(
            config.clone(),
            view_receiver,
            groups::GroupThreadMail {
                mailbox: groups_receiver,
                own: groups_mailbox.downgrade(),
                shards: mailboxes.clone(),
            },
        )?;

        let mut shards = Vec::new();
        let mut ready = Vec::new();
        for (index, receiver) in receivers.into_iter().enumerate() {
            let (ready_sender, ready_receiver) = oneshot::channel();
            ready.push(ready_receiver);
            let context = shard::ShardContext {
                index,
                config: config.clone(),
                peers: mailboxes.clone(),
                control: control_mailbox.clone(),
                groups: groups_mailbox.clone(),
                backend: backend.clone(),
                tier: tier.clone(),
            };
            let view = view.clone();
            shards.push(
                std::thread::Builder::new()
                    .name(format!("strata-shard-{index}"))
                    .spawn(move || {
                        shard::run(context, view, receiver, ready_sender, listener::listen)
                    })?,
            );
        }
        for (index, ready) in ready.into_iter().enumerate() {
            match ready.blocking_recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => anyhow::bail!("shard {index} failed to start: {error}"),
                Err(_) => anyhow::bail!("shard {index} stopped while starting"),
            }
        }
        if let Some(address) = config.admin {
            // A taken admin port must not stop the broker: say so and serve without it.
            match listener::admin::start(
                config.clone(),
                mailboxes.clone(),
                groups_mailbox.clone(),
                tier.as_ref().map(|tier| tier.metrics.clone()),
                address,
            ) {
                Ok(bound) => tracing::info!("admin endpoint on http://{bound}"),
                Err(error) => tracing::warn!("no admin endpoint: {error}"),
            }
        }
        tracing::info!(
            node = config.node_id,
            listen = %config.listen,
            shards = config.shards,
            data_dir = %config.data_dir.display(),
            "strata node ready"
        );
        Ok(Node {
            shards,
            control,
            mailboxes,
            control_mailbox,
            groups,
        })
    }

    /// Each shard's partitions and forwarding count.
    pub fn stats(&self) -> Vec<ShardStats> {
        let mut answers = Vec::new();
        for mailbox in self.mailboxes.iter() {
            let (reply, answer) = oneshot::channel();
            if mailbox
                .send(messages::ShardMessage::Stats { reply })
                .is_ok()
            {
                answers.push(answer);
            }
        }
        answers
            .into_iter()
            .filter_map(|answer| answer.blocking_recv().ok())
            .collect()
    }

    /// Sends the control thread `message` and waits for its answer (or its end).
    fn ask_control(&self, message: impl FnOnce(oneshot::Sender<()>) -> messages::ControlMessage) {
        let (reply, answered) = oneshot::channel();
        if self.control_mailbox.send(message(reply)).is_ok() {
            let _ = answered.blocking_recv();
        }
    }

    /// Leaves the cluster first, so the controller moves this node's leaderships while it still
    /// serves (Kafka's controlled shutdown: clients move to the new leaders at once instead of
    /// waiting out the shutdown); then stops accepting, lets in-flight appends finish, flushes
    /// and closes every log.
    pub fn shutdown(self) {
        self.ask_control(|reply| messages::ControlMessage::Leave { reply });
        let mut acks = Vec::new();
        for mailbox in self.mailboxes.iter() {
            let (reply, ack) = oneshot::channel();
            if mailbox
                .send(messages::ShardMessage::Shutdown { reply })
                .is_ok()
            {
                acks.push(ack);
            }
        }
        for ack in acks {
            let _ = ack.blocking_recv();
        }
        self.ask_control(|reply| messages::ControlMessage::Shutdown { reply });
        drop(self.control_mailbox);
        drop(self.mailboxes);
        for shard in self.shards {
            let _ = shard.join();
        }
        let _ = self.control.join();
        // Its mailbox closed with the shards and its views with the control thread.
        let _ = self.groups.join();
        tracing::info!("strata node stopped");
    }
}
