//! `strata serve`: flags, `STRATA_*` environment variables and a TOML config file, flags
//! winning over the environment, the environment over the file, the file over defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use strata_node::log::tail_cache::TAIL_CACHE_BYTES;
use strata_node::server::security::{ListenerSpec, SecurityConfig, parse_listeners};
use strata_node::server::{Node, NodeConfig};

#[derive(Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (snake_case keys, e.g. `data_dir`); flags
    /// and STRATA_* variables win over it. Without one, flags and defaults alone.
    #[arg(long, env = "STRATA_CONFIG")]
    config: Option<PathBuf>,
    /// Where partitions, group offsets and the embedded coordinator's state live (default
    /// ./strata-data).
    #[arg(long, env = "STRATA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// This broker's id in its cluster, unique among live brokers (default 1).
    #[arg(long, env = "STRATA_NODE_ID")]
    node_id: Option<i32>,
    /// Client listeners, `[SCHEME://]HOST:PORT[,SCHEME://HOST:PORT]` with SCHEME one of
    /// plaintext (the default), ssl, sasl_plaintext, sasl_ssl, at most one per scheme; shard i
    /// also listens on PORT + 10 + i of each, with its security. The first names the broker
    /// (default plaintext://127.0.0.1:7300).
    #[arg(long, env = "STRATA_LISTEN")]
    listen: Option<String>,
    /// Replication (QUIC over UDP) address; shard i binds this port + i. Default: the client
    /// port + 1 on the listen address (7301).
    #[arg(long, env = "STRATA_REPLICATION")]
    replication: Option<SocketAddr>,
    /// A follower not caught up for this long leaves the ISR (Kafka's replica.lag.time.max.ms;
    /// default 10000).
    #[arg(long, env = "STRATA_REPLICA_LAG_TIME_MAX_MS")]
    replica_lag_time_max_ms: Option<u64>,
    /// The most this node's leaders send per second to replicas catching up outside the ISR
    /// (a reassignment's new replicas, a restarted broker), split evenly over its shards, so a
    /// catch-up cannot take the disk and CPU producers need (Kafka's
    /// leader.replication.throttled.rate; bytes, or with a unit: 100MB). In-sync followers are
    /// never held. Default 0: no limit.
    #[arg(long, env = "STRATA_REPLICA_RECOVERY_BYTES_PER_SEC", value_parser = crate::units::parse_bytes)]
    replica_recovery_bytes_per_sec: Option<u64>,
    /// Memory for the newest appends that leaders wrote past the page cache (direct.writes), kept
    /// for consumers and followers reading at the tail, split evenly over the shards; the oldest
    /// on a shard leaves first (bytes, or with a unit: 256MiB). Default: 64 MiB per shard.
    #[arg(long, env = "STRATA_TAIL_CACHE_BYTES", value_parser = crate::units::parse_bytes)]
    tail_cache_bytes: Option<u64>,
    /// How often the controller moves leaderships back to each partition's preferred replica
    /// (the first of its replicas) where that replica is live and in sync: after a broker
    /// returns, it leads its share again (Kafka's auto.leader.rebalance; default 300000, 0
    /// never).
    #[arg(long, env = "STRATA_LEADER_REBALANCE_INTERVAL_MS")]
    leader_rebalance_interval_ms: Option<u64>,
    /// A consumer group that has had no members and no commit for this long is deleted with
    /// its offsets (Kafka's offsets.retention.minutes; default 604800000, 7 days; 0 never).
    #[arg(long, env = "STRATA_OFFSETS_RETENTION_MS")]
    offsets_retention_ms: Option<u64>,
    /// How long a Kafka consumer group that had no members waits for more before its first
    /// generation, and again each time one more joins in that wait, so members starting
    /// together share one rebalance (Kafka's group.initial.rebalance.delay.ms; default 3000, 0
    /// at once; capped by the members' rebalance timeout).
    #[arg(long, env = "STRATA_GROUP_INITIAL_REBALANCE_DELAY_MS")]
    group_initial_rebalance_delay_ms: Option<u64>,
    /// How long a member of a KIP-848 consumer group (Kafka clients with
    /// group.protocol=consumer) may be silent before it is expired and its partitions move
    /// (Kafka's group.consumer.session.timeout.ms; 1000 to 300000, default 45000).
    #[arg(long, env = "STRATA_GROUP_CONSUMER_SESSION_TIMEOUT_MS")]
    group_consumer_session_timeout_ms: Option<u32>,
    /// PEM certificate this node presents on replication links (with --tls-key and --tls-ca;
    /// without them each node makes a self-signed one and links are encrypted, not verified).
    #[arg(long, env = "STRATA_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (default: none, as --tls-cert).
    #[arg(long, env = "STRATA_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// PEM CA that peers' certificates must chain to (checked against their advertised host;
    /// default: none, as --tls-cert).
    #[arg(long, env = "STRATA_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// Admin HTTP address: /metrics (Prometheus), /health, /v1/cluster. Default 127.0.0.1:7380.
    #[arg(long, env = "STRATA_ADMIN")]
    admin: Option<SocketAddr>,
    /// Also serve Kafka's protocol, for existing Kafka clients (kcat, librdkafka, franz-go, the
    /// Java client), on these listeners: `SCHEME://HOST:PORT[,SCHEME://HOST:PORT]` (as Kafka's
    /// `listeners`; SCHEME one of plaintext, ssl, sasl_plaintext, sasl_ssl; a bare HOST:PORT is
    /// plaintext), at most one per scheme. Off by default.
    #[arg(long, env = "STRATA_KAFKA_LISTEN")]
    kafka_listen: Option<String>,
    /// Whether ssl listeners ask clients for a certificate that chains to --tls-ca: none,
    /// requested, required (Kafka's ssl.client.auth; default none; sasl_ssl listeners never
    /// ask: SASL says who the client is). A verified certificate's subject is the connection's
    /// principal (User:CN=...,O=...).
    #[arg(long, env = "STRATA_TLS_CLIENT_AUTH")]
    tls_client_auth: Option<String>,
    /// SASL mechanisms the sasl_* listeners offer, comma-separated, from SCRAM-SHA-256,
    /// SCRAM-SHA-512 and PLAIN (default SCRAM-SHA-512,SCRAM-SHA-256; PLAIN sends the password
    /// itself: offer it on sasl_ssl only).
    #[arg(long, env = "STRATA_SASL_MECHANISMS")]
    sasl_mechanisms: Option<String>,
    /// A SASL session lasts this long; the client must authenticate again on the same
    /// connection before it ends or be disconnected (Kafka's connections.max.reauth.ms, KIP-368;
    /// e.g. 1h; default 0: sessions never end).
    #[arg(long, env = "STRATA_CONNECTIONS_MAX_REAUTH", value_parser = crate::units::parse_duration)]
    connections_max_reauth: Option<std::time::Duration>,
    /// `acl`: every request is checked against the ACLs (`strata acl`, `kafka-acls`), as
    /// Kafka's authorizer checks it; unset (the default): every client may do everything.
    #[arg(long, env = "STRATA_AUTHORIZER")]
    authorizer: Option<String>,
    /// Principals allowed everything whatever the ACLs say, separated by `;` or `,`
    /// (Kafka's super.users, e.g. `User:admin;User:CN=ops,O=acme`; default none).
    #[arg(long, env = "STRATA_SUPER_USERS")]
    super_users: Option<String>,
    /// With --authorizer acl, a resource no ACL names is open to every client (Kafka's
    /// allow.everyone.if.no.acl.found; default off: closed).
    #[arg(long, env = "STRATA_ALLOW_EVERYONE_IF_NO_ACL_FOUND")]
    allow_everyone_if_no_acl_found: bool,
    /// A failed authentication is answered this late, so guessing passwords is slow (Kafka's
    /// connection.failed.authentication.delay.ms; default 100ms).
    #[arg(long, env = "STRATA_FAILED_AUTHENTICATION_DELAY", value_parser = crate::units::parse_duration)]
    failed_authentication_delay: Option<std::time::Duration>,
    /// Create a topic a Kafka client asks for that does not exist, with --num-partitions and
    /// --default-replication-factor (Kafka's auto.create.topics.enable; off by default).
    #[arg(long, env = "STRATA_KAFKA_AUTO_CREATE_TOPICS")]
    kafka_auto_create_topics: bool,
    /// Partitions of a topic a Kafka client creates without naming a count: on first use, or
    /// CreateTopics with -1 (Kafka's num.partitions; default 1).
    #[arg(long, env = "STRATA_NUM_PARTITIONS", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    num_partitions: Option<u32>,
    /// Replication factor of a topic a Kafka client creates without naming one (Kafka's
    /// default.replication.factor; default 1).
    #[arg(long, env = "STRATA_DEFAULT_REPLICATION_FACTOR", value_parser = clap::value_parser!(u16).range(1..))]
    default_replication_factor: Option<u16>,
    /// etcd endpoints (comma-separated) for a cluster; without it the node runs on its
    /// embedded coordinator.
    #[arg(long, env = "STRATA_ETCD")]
    etcd: Option<String>,
    /// How long this broker's registration outlives it in etcd: a dead broker's partitions
    /// move after at most this long (default 5000).
    #[arg(long, env = "STRATA_LEASE_TTL_MS")]
    lease_ttl_ms: Option<u64>,
    /// The cluster's name: brokers of one name on one etcd form one cluster (default strata).
    #[arg(long, env = "STRATA_CLUSTER")]
    cluster: Option<String>,
    /// This broker's rack (failure domain): replicas spread over racks first (default: no
    /// rack).
    #[arg(long, env = "STRATA_RACK")]
    rack: Option<String>,
    /// Shards (threads, each pinned to a core). Default: the number of cores.
    #[arg(long, env = "STRATA_SHARDS")]
    shards: Option<usize>,
    /// The node shares its cores with other busy processes (clients or load generators on the
    /// same host, a small VM): shard threads are not pinned, so the kernel may run a shard on
    /// whichever core is free instead of queueing it behind another process on its own
    /// (Redpanda's `--overprovisioned`). Leave off on a dedicated host.
    #[arg(long, env = "STRATA_OVERPROVISIONED")]
    overprovisioned: bool,
    /// TCP congestion control of client connections (default cubic; `system`: the host's
    /// default). BBR without the fq qdisc paces each burst with a timer, which halved a
    /// consumer's throughput over loopback (docs/performance.md).
    #[arg(long, env = "STRATA_TCP_CONGESTION")]
    tcp_congestion: Option<String>,
    /// Host to advertise to clients (default: the listen address, or 127.0.0.1 for 0.0.0.0).
    #[arg(long, env = "STRATA_ADVERTISED_HOST")]
    advertised_host: Option<String>,
    /// The io-properties file `strata iotune` wrote (default: DATA_DIR/io-properties.toml
    /// when present; without one, default IO settings).
    #[arg(long, env = "STRATA_IO_PROPERTIES")]
    io_properties: Option<PathBuf>,
    /// Largest request frame accepted (bytes, or with a unit: 64MiB; default 64 MiB); a larger
    /// one is refused with MESSAGE_TOO_LARGE before anything is allocated for it.
    #[arg(long, env = "STRATA_MAX_FRAME_BYTES", value_parser = crate::units::parse_bytes_usize)]
    max_frame_bytes: Option<usize>,
    /// How often each partition's retention (retention.ms, retention.bytes) is enforced
    /// (Kafka's log.retention.check.interval.ms; default 300000).
    #[arg(long, env = "STRATA_RETENTION_CHECK_INTERVAL_MS")]
    retention_check_interval_ms: Option<u64>,
    /// The remote tier for topics with remote.storage.enable=true: s3://bucket/prefix (with
    /// the usual AWS_* environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL, AWS_ALLOW_HTTP=true for a plain-HTTP endpoint) or file:///path (a
    /// folder, such as a NAS mount). Default: none.
    #[arg(long, env = "STRATA_REMOTE_STORAGE")]
    remote_storage: Option<String>,
    /// Memory for chunks read from the remote tier (4 MiB each), shared by the node's shards
    /// (default 256MiB; a reader catching up from the remote tier holds about 32 MiB ahead).
    #[arg(long, env = "STRATA_REMOTE_CACHE_BYTES", value_parser = crate::units::parse_bytes)]
    remote_cache_bytes: Option<u64>,
    /// The most the node uploads to the remote tier per second (default: no limit).
    #[arg(long, env = "STRATA_REMOTE_UPLOAD_BYTES_PER_SEC", value_parser = crate::units::parse_bytes)]
    remote_upload_bytes_per_sec: Option<u64>,
    /// The most the node reads from the remote tier per second (default: no limit).
    #[arg(long, env = "STRATA_REMOTE_FETCH_BYTES_PER_SEC", value_parser = crate::units::parse_bytes)]
    remote_fetch_bytes_per_sec: Option<u64>,
    /// Memory for each shard's log cleaner key map (24 bytes a key; at least 1MiB; default
    /// 64MiB). A compacted partition whose dirty part holds more keys is cleaned in passes.
    #[arg(long, env = "STRATA_CLEANER_MEMORY_BYTES", value_parser = crate::units::parse_bytes_usize)]
    cleaner_memory_bytes: Option<usize>,
    /// The node's log cleaner reads and writes per second, shared by its shards (default: no
    /// limit).
    #[arg(long, env = "STRATA_CLEANER_IO_BYTES_PER_SEC", value_parser = crate::units::parse_bytes)]
    cleaner_io_bytes_per_sec: Option<u64>,
    /// How often each shard looks for a compacted partition due for cleaning (Kafka's
    /// log.cleaner.backoff.ms; default 15000).
    #[arg(long, env = "STRATA_CLEANER_BACKOFF_MS")]
    cleaner_backoff_ms: Option<u64>,
    /// How many sampled windows client quotas are measured over (Kafka's quota.window.num;
    /// 2 to 100, default 11).
    #[arg(long, env = "STRATA_QUOTA_WINDOW_NUM")]
    quota_window_num: Option<u32>,
    /// Each quota window's length in seconds (Kafka's quota.window.size.seconds; 1 to 3600,
    /// default 1).
    #[arg(long, env = "STRATA_QUOTA_WINDOW_SIZE_SECONDS")]
    quota_window_size_seconds: Option<u64>,
}

/// The same settings as a config file.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    node_id: Option<i32>,
    listen: Option<String>,
    replication: Option<SocketAddr>,
    replica_lag_time_max_ms: Option<u64>,
    replica_recovery_bytes_per_sec: Option<u64>,
    tail_cache_bytes: Option<u64>,
    leader_rebalance_interval_ms: Option<u64>,
    offsets_retention_ms: Option<u64>,
    group_initial_rebalance_delay_ms: Option<u64>,
    group_consumer_session_timeout_ms: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    admin: Option<SocketAddr>,
    kafka_listen: Option<String>,
    tls_client_auth: Option<String>,
    sasl_mechanisms: Option<String>,
    authorizer: Option<String>,
    super_users: Option<String>,
    allow_everyone_if_no_acl_found: Option<bool>,
    #[serde(
        default,
        deserialize_with = "crate::units::serde_duration_option::deserialize"
    )]
    connections_max_reauth: Option<std::time::Duration>,
    #[serde(
        default,
        deserialize_with = "crate::units::serde_duration_option::deserialize"
    )]
    failed_authentication_delay: Option<std::time::Duration>,
    kafka_auto_create_topics: Option<bool>,
    num_partitions: Option<u32>,
    default_replication_factor: Option<u16>,
    etcd: Option<String>,
    lease_ttl_ms: Option<u64>,
    cluster: Option<String>,
    rack: Option<String>,
    shards: Option<usize>,
    overprovisioned: Option<bool>,
    tcp_congestion: Option<String>,
    advertised_host: Option<String>,
    io_properties: Option<PathBuf>,
    max_frame_bytes: Option<usize>,
    retention_check_interval_ms: Option<u64>,
    remote_storage: Option<String>,
    remote_cache_bytes: Option<u64>,
    remote_upload_bytes_per_sec: Option<u64>,
    remote_fetch_bytes_per_sec: Option<u64>,
    cleaner_memory_bytes: Option<usize>,
    cleaner_io_bytes_per_sec: Option<u64>,
    cleaner_backoff_ms: Option<u64>,
    quota_window_num: Option<u32>,
    quota_window_size_seconds: Option<u64>,
}

/// Open files each partition replica keeps: its active segment's log, twice (buffered, and
/// `O_DIRECT` unless `direct.writes=never`), and as many for each closed segment. Index files
/// and checkpoints are opened for each use.
const FILES_PER_PARTITION: u64 = 2;

/// Raises this process's soft limit on open files to its hard limit, as the JVM does for Kafka:
/// Debian's default soft limit of 1,024 left a broker fewer than 130 partitions, and a topic
/// created past that answered NOT_LEADER on partitions whose files it could not open.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                from = limit.rlim_cur,
                to = limit.rlim_max,
                "raised the open-file limit"
            );
            limit = raised;
        }
    }
    let partitions = limit.rlim_cur / FILES_PER_PARTITION;
    if partitions < 1_000 {
        tracing::warn!(
            open_files = limit.rlim_cur,
            "this process may open {} files: about {partitions} partition replicas; raise the hard limit (LimitNOFILE=1048576, see `strata tune check`)",
            limit.rlim_cur
        );
    }
}

/// The settings of `--config`'s file; none without one.
fn read_config_file(path: Option<&std::path::Path>) -> anyhow::Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    raise_open_file_limit();
    let file = read_config_file(args.config.as_deref())?;
    let remote_storage = remote_storage(&args, &file);
    let kafka_topic_defaults = topic_defaults(&args, &file)?;
    let security = security_config(&args, &file)?;
    let checked = checked_settings(&args, &file)?;
    let (native_listeners, kafka_listeners) = listeners(&args, &file)?;
    let native_listener = native_listeners[0];
    let etcd = args
        .etcd
        .or(file.etcd)
        .map(|endpoints| etcd_endpoints(&endpoints));
    let lease_ttl_ms = args.lease_ttl_ms.or(file.lease_ttl_ms).unwrap_or(5_000);
    let admin = args
        .admin
        .or(file.admin)
        .unwrap_or_else(|| "127.0.0.1:7380".parse().expect("a valid address"));
    let listen = native_listener.address;
    let advertised_host = args
        .advertised_host
        .or(file.advertised_host)
        .unwrap_or_else(|| {
            if listen.ip().is_unspecified() {
                "127.0.0.1".to_string()
            } else {
                listen.ip().to_string()
            }
        });
    let replication = args
        .replication
        .or(file.replication)
        .unwrap_or_else(|| SocketAddr::new(listen.ip(), listen.port() + 1));
    let tls = tls_files(
        args.tls_cert.or(file.tls_cert),
        args.tls_key.or(file.tls_key),
        args.tls_ca.or(file.tls_ca),
    )?;
    let shards = args
        .shards
        .or(file.shards)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let data_dir = args
        .data_dir
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from("./strata-data"));
    let io_properties_path = args
        .io_properties
        .or(file.io_properties)
        .unwrap_or_else(|| data_dir.join(strata_node::iotune::IO_PROPERTIES_FILE));
    let io_properties = load_io_properties(&io_properties_path)?;
    let config = NodeConfig {
        data_dir,
        node_id: args.node_id.or(file.node_id).unwrap_or(1),
        cluster: args
            .cluster
            .or(file.cluster)
            .unwrap_or_else(|| "strata".to_string()),
        listen,
        listen_protocol: native_listener.protocol,
        more_listeners: native_listeners[1..].to_vec(),
        advertised_host,
        shards,
        max_frame_bytes: args
            .max_frame_bytes
            .or(file.max_frame_bytes)
            .unwrap_or(64 << 20),
        pin_cores: !(args.overprovisioned || file.overprovisioned.unwrap_or(false)),
        tcp_congestion: strata_client::parse_tcp_congestion(
            args.tcp_congestion
                .as_deref()
                .or(file.tcp_congestion.as_deref())
                .unwrap_or(strata_client::DEFAULT_TCP_CONGESTION),
        ),
        etcd,
        lease_ttl: std::time::Duration::from_millis(lease_ttl_ms),
        rack: args.rack.or(file.rack),
        admin: Some(admin),
        kafka: kafka_listeners,
        security,
        kafka_auto_create_topics: args.kafka_auto_create_topics
            || file.kafka_auto_create_topics.unwrap_or(false),
        kafka_topic_defaults,
        replication,
        replica_lag_time_max_ms: args
            .replica_lag_time_max_ms
            .or(file.replica_lag_time_max_ms)
            .unwrap_or(10_000),
        replica_recovery_bytes_per_sec: args
            .replica_recovery_bytes_per_sec
            .or(file.replica_recovery_bytes_per_sec)
            .filter(|&rate| rate > 0),
        tail_cache_bytes: args
            .tail_cache_bytes
            .or(file.tail_cache_bytes)
            .unwrap_or((TAIL_CACHE_BYTES * shards) as u64),
        leader_rebalance_interval: never_if_zero(
            args.leader_rebalance_interval_ms
                .or(file.leader_rebalance_interval_ms)
                .unwrap_or(300_000),
        ),
        group_initial_rebalance_delay_ms: args
            .group_initial_rebalance_delay_ms
            .or(file.group_initial_rebalance_delay_ms)
            .unwrap_or(3000),
        offsets_retention: never_if_zero(
            args.offsets_retention_ms
                .or(file.offsets_retention_ms)
                .unwrap_or(7 * 24 * 3600 * 1000),
        ),
        retention_check_interval: std::time::Duration::from_millis(
            args.retention_check_interval_ms
                .or(file.retention_check_interval_ms)
                .unwrap_or(300_000)
                .max(1),
        ),
        cleaner: checked.cleaner,
        quota_window: checked.quota_window,
        group_consumer_session_timeout_ms: checked.consumer_session_timeout_ms,
        tls,
        io_properties,
        clock: strata_node::clock::Clock::SYSTEM,
        remote_storage,
    };
    let mut tls_listeners = config.kafka.iter().chain(&native_listeners);
    anyhow::ensure!(
        config.tls.is_some() || !tls_listeners.any(|listener| listener.protocol.uses_tls()),
        "ssl and sasl_ssl listeners need --tls-cert, --tls-key and --tls-ca"
    );
    let node = Node::start(config.clone())?;
    eprintln!(
        "strata: node {} serving on {} (shards {}, ports {}..{}), data in {}",
        config.node_id,
        config.listen,
        config.shards,
        config.shard_port(0),
        config.shard_port(config.shards - 1),
        config.data_dir.display()
    );
    for kafka in &config.kafka {
        eprintln!("strata: Kafka protocol on {kafka}");
    }
    wait_for_signal()?;
    eprintln!("strata: shutting down");
    node.shutdown();
    Ok(())
}

/// `--etcd`'s comma-separated endpoints, `http://` where no scheme is named.
fn etcd_endpoints(endpoints: &str) -> Vec<String> {
    endpoints
        .split(',')
        .map(|endpoint| {
            let endpoint = endpoint.trim();
            if endpoint.contains("://") {
                endpoint.to_string()
            } else {
                format!("http://{endpoint}")
            }
        })
        .collect()
}

/// `--tls-cert`, `--tls-key` and `--tls-ca`: all three, or none.
fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> anyhow::Result<Option<strata_node::server::quic::TlsFiles>> {
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => {
            Ok(Some(strata_node::server::quic::TlsFiles { cert, key, ca }))
        }
        (None, None, None) => Ok(None),
        _ => anyhow::bail!("--tls-cert, --tls-key and --tls-ca go together"),
    }
}

/// The native listeners (`--listen`, the first one's address names the broker) and the Kafka
/// listeners (`--kafka-listen`).
fn listeners(
    args: &ServeArgs,
    file: &FileConfig,
) -> anyhow::Result<(Vec<ListenerSpec>, Vec<ListenerSpec>)> {
    let native = match args.listen.as_ref().or(file.listen.as_ref()) {
        Some(text) => parse_listeners(text).map_err(|why| anyhow::anyhow!("--listen: {why}"))?,
        None => vec![ListenerSpec::plaintext(
            "127.0.0.1:7300".parse().expect("a valid address"),
        )],
    };
    let kafka = match args.kafka_listen.as_ref().or(file.kafka_listen.as_ref()) {
        Some(text) => {
            parse_listeners(text).map_err(|why| anyhow::anyhow!("--kafka-listen: {why}"))?
        }
        None => Vec::new(),
    };
    Ok((native, kafka))
}

/// TLS client authentication, SASL and the bootstrap user, from the flags, the file and the
/// environment.
fn security_config(args: &ServeArgs, file: &FileConfig) -> anyhow::Result<SecurityConfig> {
    let mut security = SecurityConfig::default();
    if let Some(client_auth) = args
        .tls_client_auth
        .as_ref()
        .or(file.tls_client_auth.as_ref())
    {
        security.client_auth = client_auth
            .parse()
            .map_err(|why: String| anyhow::anyhow!("--tls-client-auth: {why}"))?;
    }
    if let Some(mechanisms) = args
        .sasl_mechanisms
        .as_ref()
        .or(file.sasl_mechanisms.as_ref())
    {
        security.sasl_mechanisms = mechanisms
            .split(',')
            .filter(|name| !name.trim().is_empty())
            .map(str::parse)
            .collect::<Result<_, String>>()
            .map_err(|why| anyhow::anyhow!("--sasl-mechanisms: {why}"))?;
        anyhow::ensure!(
            !security.sasl_mechanisms.is_empty(),
            "--sasl-mechanisms names no mechanism"
        );
    }
    match args.authorizer.as_deref().or(file.authorizer.as_deref()) {
        None | Some("") | Some("none") => {}
        Some("acl") => {
            let super_users = args
                .super_users
                .as_deref()
                .or(file.super_users.as_deref())
                .unwrap_or("")
                .split([';', ','])
                .filter(|text| !text.trim().is_empty())
                .map(|text| strata_auth::Principal::parse(text.trim()))
                .collect::<Result<_, _>>()
                .map_err(|error| anyhow::anyhow!("--super-users: {error}"))?;
            security.authorizer = Some(strata_auth::acl::AuthorizerConfig {
                super_users,
                allow_everyone_if_no_acl_found: args.allow_everyone_if_no_acl_found
                    || file.allow_everyone_if_no_acl_found.unwrap_or(false),
            });
        }
        Some(other) => anyhow::bail!("--authorizer: {other:?} is not one (acl)"),
    }
    security.connections_max_reauth = args
        .connections_max_reauth
        .or(file.connections_max_reauth)
        .filter(|lifetime| !lifetime.is_zero());
    if let Some(delay) = args
        .failed_authentication_delay
        .or(file.failed_authentication_delay)
    {
        security.failed_authentication_delay = delay;
    }
    // Only from the environment: a password does not belong in a command line or a file
    // that is kept.
    if let Ok(user) = std::env::var("STRATA_BOOTSTRAP_USER") {
        let (name, password) = user
            .split_once(':')
            .filter(|(name, password)| !name.is_empty() && !password.is_empty())
            .ok_or_else(|| anyhow::anyhow!("STRATA_BOOTSTRAP_USER is NAME:PASSWORD"))?;
        security.bootstrap_user = Some((name.to_string(), password.to_string()));
    }
    Ok(security)
}

/// A period in milliseconds where 0 means never.
fn never_if_zero(ms: u64) -> Option<std::time::Duration> {
    (ms > 0).then(|| std::time::Duration::from_millis(ms))
}

/// The settings whose values are checked beyond their type.
struct CheckedSettings {
    cleaner: strata_node::server::CleanerConfig,
    quota_window: strata_node::quota::QuotaWindow,
    consumer_session_timeout_ms: u32,
}

fn checked_settings(args: &ServeArgs, file: &FileConfig) -> anyhow::Result<CheckedSettings> {
    let consumer_session_timeout_ms = args
        .group_consumer_session_timeout_ms
        .or(file.group_consumer_session_timeout_ms)
        .unwrap_or(45_000);
    anyhow::ensure!(
        (1_000..=300_000).contains(&consumer_session_timeout_ms),
        "--group-consumer-session-timeout-ms must be 1000 to 300000 (got {consumer_session_timeout_ms})"
    );
    Ok(CheckedSettings {
        cleaner: cleaner_config(args, file)?,
        quota_window: quota_window(args, file)?,
        consumer_session_timeout_ms,
    })
}

/// The windows client quotas are measured over, checked.
fn quota_window(
    args: &ServeArgs,
    file: &FileConfig,
) -> anyhow::Result<strata_node::quota::QuotaWindow> {
    let defaults = strata_node::quota::QuotaWindow::default();
    let samples = args
        .quota_window_num
        .or(file.quota_window_num)
        .unwrap_or(defaults.samples);
    anyhow::ensure!(
        (2..=100).contains(&samples),
        "--quota-window-num must be 2 to 100 (got {samples})"
    );
    let seconds = args
        .quota_window_size_seconds
        .or(file.quota_window_size_seconds)
        .unwrap_or(defaults.window.as_secs());
    anyhow::ensure!(
        (1..=3600).contains(&seconds),
        "--quota-window-size-seconds must be 1 to 3600 (got {seconds})"
    );
    Ok(strata_node::quota::QuotaWindow {
        samples,
        window: std::time::Duration::from_secs(seconds),
    })
}

/// The log cleaner's settings, checked: a key map too small to clean anything is refused.
fn cleaner_config(
    args: &ServeArgs,
    file: &FileConfig,
) -> anyhow::Result<strata_node::server::CleanerConfig> {
    let defaults = strata_node::server::CleanerConfig::default();
    let memory_bytes = args
        .cleaner_memory_bytes
        .or(file.cleaner_memory_bytes)
        .unwrap_or(defaults.memory_bytes);
    anyhow::ensure!(
        memory_bytes >= strata_node::server::CLEANER_MEMORY_MIN_BYTES,
        "--cleaner-memory-bytes must be at least 1MiB (got {memory_bytes})"
    );
    let io_bytes_per_sec = args
        .cleaner_io_bytes_per_sec
        .or(file.cleaner_io_bytes_per_sec);
    anyhow::ensure!(
        io_bytes_per_sec != Some(0),
        "--cleaner-io-bytes-per-sec must be positive (leave it unset for no limit)"
    );
    Ok(strata_node::server::CleanerConfig {
        memory_bytes,
        io_bytes_per_sec,
        check_interval: args
            .cleaner_backoff_ms
            .or(file.cleaner_backoff_ms)
            .map_or(defaults.check_interval, |ms| {
                std::time::Duration::from_millis(ms.max(1))
            }),
    })
}

/// Kafka's num.partitions and default.replication.factor, from the flags or the file; zero is
/// refused wherever it comes from.
fn topic_defaults(
    args: &ServeArgs,
    file: &FileConfig,
) -> anyhow::Result<strata_kafka::admin::TopicDefaults> {
    let defaults = strata_kafka::admin::TopicDefaults::default();
    let partitions = args
        .num_partitions
        .or(file.num_partitions)
        .unwrap_or(defaults.partitions);
    let replication_factor = args
        .default_replication_factor
        .or(file.default_replication_factor)
        .unwrap_or(defaults.replication_factor);
    anyhow::ensure!(partitions > 0, "num_partitions must be at least 1");
    anyhow::ensure!(
        replication_factor > 0,
        "default_replication_factor must be at least 1"
    );
    Ok(strata_kafka::admin::TopicDefaults {
        partitions,
        replication_factor,
    })
}

fn wait_for_signal() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        Ok::<(), std::io::Error>(())
    })?;
    Ok(())
}

/// The io-properties `strata iotune` wrote, if the file exists; says which settings apply.
fn load_io_properties(
    path: &std::path::Path,
) -> anyhow::Result<Option<strata_node::iotune::IoProperties>> {
    let io_properties = strata_node::iotune::IoProperties::load(path)?;
    match &io_properties {
        Some(properties) => {
            let chosen = &properties.chosen;
            tracing::info!(
                file = %path.display(),
                write_bytes = chosen.write_bytes,
                writes_in_flight = chosen.writes_in_flight,
                group_commit_window_us = chosen.group_commit_window_us,
                "io properties loaded: group writes up to write_bytes x writes_in_flight, writes_in_flight shared over the shards"
            );
            eprintln!(
                "strata: io properties from {}: write {} B, {} writes in flight, group-commit window {} us",
                path.display(),
                chosen.write_bytes,
                chosen.writes_in_flight,
                chosen.group_commit_window_us
            );
        }
        None => tracing::info!(
            file = %path.display(),
            "no io-properties file: default IO settings (`strata iotune` measures the disk)"
        ),
    }
    Ok(io_properties)
}

/// The remote tier's settings, flags over the file's; `None` without `--remote-storage`.
fn remote_storage(
    args: &ServeArgs,
    file: &FileConfig,
) -> Option<strata_node::server::tier::TierConfig> {
    let url = args
        .remote_storage
        .clone()
        .or(file.remote_storage.clone())?;
    Some(strata_node::server::tier::TierConfig {
        url,
        cache_bytes: args
            .remote_cache_bytes
            .or(file.remote_cache_bytes)
            .unwrap_or(256 << 20),
        upload_bytes_per_sec: args
            .remote_upload_bytes_per_sec
            .or(file.remote_upload_bytes_per_sec),
        fetch_bytes_per_sec: args
            .remote_fetch_bytes_per_sec
            .or(file.remote_fetch_bytes_per_sec),
    })
}
