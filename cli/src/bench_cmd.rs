//! `strata bench produce|consume|e2e|idle|ready`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use strata_bench::{BenchConfig, KeyDistribution, Workload};

use super::Connection;

#[derive(Clone, Copy, ValueEnum)]
pub enum WorkloadArg {
    Produce,
    Consume,
    E2e,
    /// Create a topic of --partitions (unless it exists), let the brokers settle for
    /// --warmup, then watch them at rest for --duration: their CPU, their resident memory per
    /// partition, their open files (needs --broker-admin).
    Idle,
    /// Probe a starting cluster from now until it names --topic and until every partition of
    /// the topic answers from its leader (gives up after --duration, default 10 minutes).
    Ready,
}

/// What `strata bench` runs: a load, or one of the scale probes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Job {
    Load(Workload),
    Idle,
    Ready,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Keys {
    None,
    Uniform,
    Zipf,
}

#[derive(Args)]
pub struct BenchArgs {
    /// produce, consume or e2e (or `workload` in the --workload file).
    #[arg(value_enum)]
    workload: Option<WorkloadArg>,
    /// A TOML workload file with any of the settings below (snake_case); flags win over it.
    /// Without one, flags and defaults alone.
    #[arg(long = "workload", value_name = "FILE")]
    workload_file: Option<PathBuf>,
    /// Print two JSON reports side by side with ratios (B / A) and exit (without it, run a
    /// benchmark).
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    compare: Option<Vec<PathBuf>>,
    /// The topic to load, created when missing (default strata-bench).
    #[arg(long)]
    topic: Option<String>,
    /// Partitions of the topic when the bench creates it. Default 4.
    #[arg(long)]
    partitions: Option<u32>,
    /// Replication factor of the topic when the bench creates it. Default 1.
    #[arg(long)]
    replication_factor: Option<u16>,
    /// min.insync.replicas of the topic when the bench creates it (default: the topic
    /// default, 1).
    #[arg(long)]
    min_insync: Option<u16>,
    /// A topic setting (as `topic create --config`) when the bench creates the topic; repeat
    /// for several, e.g. `--topic-config flush=always --topic-config direct.writes=always`.
    /// Settings not given take the topic defaults.
    #[arg(long = "topic-config", value_name = "KEY=VALUE", value_parser = super::client_cmd::parse_key_value)]
    topic_config: Vec<(String, String)>,
    /// Producers write to the topic's first N partitions only, as the sticky partitioner (or
    /// their keys' hash) spreads them over those (default: all partitions).
    #[arg(long, value_name = "N")]
    spread: Option<u32>,
    /// Default 2.
    #[arg(long)]
    producers: Option<usize>,
    /// Default 1.
    #[arg(long)]
    consumers: Option<usize>,
    /// Each producer and consumer connects on its own, as separate processes would (default:
    /// native producers and consumers share one connection per broker; over Kafka's protocol
    /// each always has its own).
    #[arg(long)]
    own_connections: bool,
    /// Default 1024.
    #[arg(long)]
    record_size: Option<usize>,
    /// Producer batch size (bytes, or with a unit: 1MiB). Default 1 MiB.
    #[arg(long, value_parser = crate::units::parse_bytes_usize)]
    batch_size: Option<usize>,
    /// Default 2.
    #[arg(long)]
    linger_ms: Option<u64>,
    /// Produce requests in flight per partition. Default 5 (Kafka's
    /// max.in.flight.requests.per.connection); fewer makes batches grow with the load.
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Bytes one fetch may bring per partition (Kafka's max.partition.fetch.bytes; a unit may
    /// follow: 4MiB). Default 4 MiB.
    #[arg(long, value_parser = crate::units::parse_bytes_u32)]
    fetch_bytes: Option<u32>,
    /// 0, 1 or all. Default 1.
    #[arg(long, value_parser = crate::client_cmd::parse_acks)]
    acks: Option<i8>,
    /// Records per second over all producers (open loop); default: as fast as acks allow.
    #[arg(long)]
    rate: Option<f64>,
    /// How long to run after the warmup (10s, 500ms, 2m; a bare number is seconds). Default
    /// 10 s unless --records is given.
    #[arg(long, value_parser = crate::units::parse_duration)]
    duration: Option<Duration>,
    /// Records to send (produce, e2e) or to read (consume); without it, the run lasts
    /// --duration.
    #[arg(long)]
    records: Option<u64>,
    /// How long not to measure at the start (as --duration). Default 0.
    #[arg(long, value_parser = crate::units::parse_duration)]
    warmup: Option<Duration>,
    /// Record keys: none (the default; the producer's sticky partitioner fills one partition a
    /// batch at a time), uniform or zipf over --keys keys (each key to its hash's partition).
    #[arg(long, value_enum)]
    key_distribution: Option<Keys>,
    /// Default 1000.
    #[arg(long)]
    keys: Option<u64>,
    /// Write the report as JSON (field names are stable; docs/performance.md). Without it,
    /// the report is printed only.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the latency histograms as an HdrHistogram interval log (default: none).
    #[arg(long)]
    hdr_log: Option<PathBuf>,
    /// Build batches as producers would and drop them: what the tool alone sustains.
    #[arg(long)]
    null_sink: bool,
    /// Draw the latency percentile distribution and throughput over time as an SVG (default:
    /// none).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Mirror iggy-bench: `pinned-producer` (producer i writes partition i, 1024 B records,
    /// 1000 per batch, per-batch latency too) or `pinned-consumer` (consumer i reads partition i).
    /// Without one, the workload as the other settings give it.
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// The run's bytes instead of --records: records = bytes / record size (a unit may
    /// follow: 2GB). With a preset, default 1 GB.
    #[arg(long, value_parser = crate::units::parse_bytes, conflicts_with = "records")]
    total_bytes: Option<u64>,
    /// Idempotent producers (producer ids and sequences; implies acks=all).
    #[arg(long)]
    idempotent: bool,
    /// `synced`: producers ask the leader to sync each batch before acknowledging it,
    /// whatever the topic's flush policy; `policy`: as the flush policy says (default, or the
    /// workload file's `durability`).
    #[arg(long, value_enum)]
    durability: Option<crate::client_cmd::DurabilityArg>,
    /// Transactional producers (implies --idempotent): each writes in transactions committed
    /// every --txn-interval or --txn-records records, whichever comes first; the report adds
    /// the commit latency.
    #[arg(long)]
    transactional: bool,
    /// With --transactional: records per transaction at most (default: no limit).
    #[arg(long, requires = "transactional")]
    txn_records: Option<u64>,
    /// With --transactional: how long a transaction stays open at most (as --duration).
    /// Default 100ms.
    #[arg(long, value_parser = crate::units::parse_duration, requires = "transactional")]
    txn_interval: Option<Duration>,
    /// A broker's admin endpoint (HOST:PORT, as its --admin); repeat, or separate with commas,
    /// for every broker of the cluster. Their CPU over the measured run goes into the report,
    /// per GB moved (default: none, and no broker CPU in the report).
    #[arg(long = "broker-admin", value_name = "HOST:PORT", value_delimiter = ',')]
    broker_admin: Vec<String>,
    /// What consumers read: read_uncommitted (the default: up to the high watermark) or
    /// read_committed (up to the last stable offset, without aborted transactions' records).
    #[arg(long, value_parser = parse_isolation)]
    isolation: Option<bool>,
    /// Compress batch bodies: none, lz4 or zstd. Record values are word text about as
    /// compressible as logs or JSON. Default none.
    #[arg(long, value_parser = crate::client_cmd::parse_codec)]
    compression: Option<strata_client::Codec>,
    /// Consumers join this consumer group (subscribe mode, auto-commit) instead of splitting
    /// the partitions among themselves (default: no group).
    #[arg(long)]
    group: Option<String>,
    /// Consumers join this share group (KIP-932: they share the partitions record by record,
    /// each record accepted after it is counted) instead of splitting the partitions or
    /// joining a consumer group. With `--protocol kafka`, through Kafka's share-group
    /// protocol (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge), as Kafka's Java
    /// `KafkaShareConsumer` speaks it. Default: none.
    #[arg(long, conflicts_with = "group")]
    share_group: Option<String>,
    /// The most records a share consumer asks for in one fetch (Kafka's `max.poll.records`);
    /// the broker rounds up to a batch end. Default 500, as Kafka's.
    #[arg(long, requires = "share_group", value_parser = clap::value_parser!(u32).range(1..))]
    max_poll_records: Option<u32>,
    /// Each consumer spends this long on each record it receives before taking the next
    /// (an application's processing), in milliseconds; default 0.
    #[arg(long)]
    process_ms: Option<f64>,
    /// What the bench's clients speak: `native`, Strata's protocol through its own client; or
    /// `kafka`, Kafka's protocol through librdkafka, against any Kafka-compatible broker
    /// (--bootstrap is then a Kafka listener). Default native.
    #[arg(long, value_enum)]
    protocol: Option<ProtocolArg>,
}

/// A duration given in (fractional) milliseconds; none or a negative one is zero.
fn millis(ms: Option<f64>) -> Duration {
    Duration::from_secs_f64(ms.unwrap_or(0.0).max(0.0) / 1000.0)
}

/// The protocol from the flag, else the workload file, else native.
fn protocol_of(
    flag: Option<ProtocolArg>,
    file: Option<&str>,
) -> anyhow::Result<strata_bench::Protocol> {
    Ok(match (flag, file) {
        (Some(ProtocolArg::Kafka), _) | (None, Some("kafka")) => strata_bench::Protocol::Kafka,
        (Some(ProtocolArg::Native), _) | (None, None | Some("native")) => {
            strata_bench::Protocol::Native
        }
        (None, Some(other)) => anyhow::bail!("protocol {other:?}: expected native or kafka"),
    })
}

/// Whether producers ask for a sync before each ack: the flag, else the workload file.
fn synced_of(
    flag: Option<crate::client_cmd::DurabilityArg>,
    file: Option<&str>,
) -> anyhow::Result<bool> {
    Ok(match (flag, file) {
        (Some(durability), _) => durability == crate::client_cmd::DurabilityArg::Synced,
        (None, None | Some("policy")) => false,
        (None, Some("synced")) => true,
        (None, Some(other)) => anyhow::bail!("durability {other:?}: expected policy or synced"),
    })
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ProtocolArg {
    Native,
    Kafka,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Preset {
    PinnedProducer,
    PinnedConsumer,
}

/// A workload file: the same settings as the flags.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WorkloadFile {
    workload: Option<String>,
    topic: Option<String>,
    partitions: Option<u32>,
    spread: Option<u32>,
    replication_factor: Option<u16>,
    min_insync: Option<u16>,
    #[serde(default)]
    topic_config: std::collections::BTreeMap<String, String>,
    producers: Option<usize>,
    consumers: Option<usize>,
    own_connections: Option<bool>,
    record_size: Option<usize>,
    batch_size: Option<usize>,
    linger_ms: Option<u64>,
    max_in_flight: Option<usize>,
    fetch_bytes: Option<u32>,
    tcp_congestion: Option<String>,
    acks: Option<String>,
    rate: Option<f64>,
    duration: Option<f64>,
    records: Option<u64>,
    idempotent: Option<bool>,
    /// `policy` or `synced`.
    durability: Option<String>,
    transactional: Option<bool>,
    txn_records: Option<u64>,
    /// Seconds.
    txn_interval: Option<f64>,
    isolation: Option<String>,
    #[serde(default)]
    broker_admin: Vec<String>,
    compression: Option<String>,
    group: Option<String>,
    share_group: Option<String>,
    max_poll_records: Option<u32>,
    process_ms: Option<f64>,
    /// `native` or `kafka`.
    protocol: Option<String>,
    warmup: Option<f64>,
    key_distribution: Option<String>,
    keys: Option<u64>,
}

/// What a preset fills in of a workload that does not say it (flags still win).
fn preset_defaults(file: &mut WorkloadFile, preset: Preset, args: &BenchArgs) {
    let streams = match preset {
        Preset::PinnedProducer => args.producers.unwrap_or(2),
        Preset::PinnedConsumer => args.consumers.unwrap_or(2),
    };
    let record_size = args.record_size.unwrap_or(1024);
    let budget = args.total_bytes.unwrap_or(1_000_000_000);
    file.workload.get_or_insert_with(|| match preset {
        Preset::PinnedProducer => "produce".into(),
        Preset::PinnedConsumer => "consume".into(),
    });
    file.topic.get_or_insert_with(|| "pinned".into());
    file.partitions.get_or_insert(streams as u32);
    file.producers.get_or_insert(streams);
    file.consumers.get_or_insert(streams);
    file.record_size.get_or_insert(record_size);
    file.batch_size.get_or_insert(4 << 20);
    file.linger_ms.get_or_insert(1);
    file.records.get_or_insert(budget / record_size as u64);
}

pub async fn bench(connection: Connection, args: BenchArgs) -> anyhow::Result<()> {
    if let Some(paths) = &args.compare {
        return compare(&paths[0], &paths[1]);
    }
    let mut file: WorkloadFile = match &args.workload_file {
        Some(path) => toml::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))?,
        None => WorkloadFile::default(),
    };
    if let Some(preset) = args.preset {
        preset_defaults(&mut file, preset, &args);
    }
    let job = job_of(&args, &file)?;
    // The scale probes read no workload from the config: any will do there.
    let workload = match job {
        Job::Load(workload) => workload,
        Job::Idle | Job::Ready => Workload::Produce,
    };
    let defaults = BenchConfig::default();
    let record_size = args
        .record_size
        .or(file.record_size)
        .unwrap_or(defaults.record_size);
    let records = args.records.or(file.records).or_else(|| {
        args.total_bytes
            .map(|bytes| bytes / record_size.max(1) as u64)
    });
    let client = connection.client_config()?;
    let (transactions, read_committed) = (
        transactions_of(&args, &file),
        read_committed_of(&args, &file)?,
    );
    let config = BenchConfig {
        workload,
        bootstrap: client.bootstrap.join(","),
        security: client.security,
        topic: args.topic.or(file.topic).unwrap_or(defaults.topic),
        partitions: args
            .partitions
            .or(file.partitions)
            .unwrap_or(defaults.partitions),
        spread: args.spread.or(file.spread),
        replication_factor: args
            .replication_factor
            .or(file.replication_factor)
            .unwrap_or(defaults.replication_factor),
        min_insync: args.min_insync.or(file.min_insync),
        // The file's settings, then the flags', which win where both name a key.
        topic_config: file
            .topic_config
            .into_iter()
            .chain(args.topic_config)
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        producers: args
            .producers
            .or(file.producers)
            .unwrap_or(defaults.producers),
        consumers: args
            .consumers
            .or(file.consumers)
            .unwrap_or(defaults.consumers),
        own_connections: args.own_connections || file.own_connections.unwrap_or(false),
        record_size,
        batch_bytes: args
            .batch_size
            .or(file.batch_size)
            .unwrap_or(defaults.batch_bytes),
        linger: args
            .linger_ms
            .or(file.linger_ms)
            .map_or(defaults.linger, Duration::from_millis),
        max_in_flight: args
            .max_in_flight
            .or(file.max_in_flight)
            .unwrap_or(defaults.max_in_flight)
            .max(1),
        tcp_congestion: connection.tcp_congestion(file.tcp_congestion.as_deref()),
        partition_fetch_bytes: args
            .fetch_bytes
            .or(file.fetch_bytes)
            .unwrap_or(defaults.partition_fetch_bytes)
            .max(1),
        acks: acks_of(args.acks, file.acks.as_deref())?,
        rate: args.rate.or(file.rate),
        duration: args
            .duration
            .or(file.duration.map(Duration::from_secs_f64))
            .or(if records.is_none() && job != Job::Ready {
                defaults.duration
            } else {
                None
            }),
        records,
        warmup: (args.warmup).unwrap_or(Duration::from_secs_f64(file.warmup.unwrap_or(0.0))),
        key_distribution: key_distribution_of(
            args.key_distribution,
            file.key_distribution.as_deref(),
        )?,
        keys: args.keys.or(file.keys).unwrap_or(defaults.keys),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        null_sink: args.null_sink,
        pinned: args.preset == Some(Preset::PinnedProducer),
        batch_records: (args.preset == Some(Preset::PinnedProducer)).then_some(1000),
        idempotent: args.idempotent || file.idempotent.unwrap_or(false),
        sync_before_ack: synced_of(args.durability, file.durability.as_deref())?,
        transactions,
        read_committed,
        broker_admins: if args.broker_admin.is_empty() {
            file.broker_admin
        } else {
            args.broker_admin
        },
        compression: compression_of(args.compression, file.compression.as_deref())?,
        group: args.group.or(file.group),
        share_group: args.share_group.or(file.share_group),
        max_poll_records: args
            .max_poll_records
            .or(file.max_poll_records)
            .unwrap_or(strata_client::ShareConfig::DEFAULT_MAX_RECORDS),
        process_per_record: millis(args.process_ms.or(file.process_ms)),
        protocol: protocol_of(args.protocol, file.protocol.as_deref())?,
    };
    if !matches!(job, Job::Load(_)) {
        return scale(job, &config, args.json.as_deref()).await;
    }
    let (report, histograms) = strata_bench::run(&config).await?;
    // The files first: a reader that closed stdout early must not cost the report.
    write_json(args.json.as_deref(), &report)?;
    if let Some(path) = &args.plot {
        std::fs::write(path, strata_bench::plot_svg(&report, &histograms))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.hdr_log {
        write_hdr_log(path, &report, &histograms)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    outln!("{}", strata_bench::summary(&report));
    Ok(())
}

/// The acks level: the flag's, else the workload file's, else 1.
fn acks_of(flag: Option<i8>, file: Option<&str>) -> anyhow::Result<i8> {
    Ok(match (flag, file) {
        (Some(acks), _) => acks,
        (None, Some(text)) => crate::client_cmd::parse_acks(text)
            .map_err(|why| anyhow::anyhow!("acks in the workload file: {why}"))?,
        (None, None) => 1,
    })
}

/// How keys are chosen: the flag's, else the workload file's, else none.
fn key_distribution_of(flag: Option<Keys>, file: Option<&str>) -> anyhow::Result<KeyDistribution> {
    Ok(match (flag, file) {
        (Some(Keys::None), _) | (None, None | Some("none")) => KeyDistribution::None,
        (Some(Keys::Uniform), _) | (None, Some("uniform")) => KeyDistribution::Uniform,
        (Some(Keys::Zipf), _) | (None, Some("zipf")) => KeyDistribution::Zipf,
        (None, Some(other)) => {
            anyhow::bail!("key_distribution {other:?}: expected none, uniform or zipf")
        }
    })
}

/// The producers' codec: the flag's, else the workload file's, else none.
fn compression_of(
    flag: Option<strata_client::Codec>,
    file: Option<&str>,
) -> anyhow::Result<strata_client::Codec> {
    Ok(match (flag, file) {
        (Some(codec), _) => codec,
        (None, Some(name)) => crate::client_cmd::parse_codec(name)
            .map_err(|why| anyhow::anyhow!("compression in the workload file: {why}"))?,
        (None, None) => strata_client::Codec::None,
    })
}

/// Runs one of the scale probes and prints (and writes) its report.
async fn scale(
    job: Job,
    config: &BenchConfig,
    json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if job == Job::Idle {
        let report = strata_bench::scale::idle(config).await?;
        write_json(json, &report)?;
        outln!("{}", strata_bench::scale::idle_summary(&report));
    } else {
        let report = strata_bench::scale::ready(config).await?;
        write_json(json, &report)?;
        outln!("{}", strata_bench::scale::ready_summary(&report));
    }
    Ok(())
}

/// A report as JSON at `path`, when one is asked for.
fn write_json(
    path: Option<&std::path::Path>,
    report: &impl serde::Serialize,
) -> anyhow::Result<()> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What to run: the positional argument, else the workload file's.
fn job_of(args: &BenchArgs, file: &WorkloadFile) -> anyhow::Result<Job> {
    Ok(match (args.workload, file.workload.as_deref()) {
        (Some(WorkloadArg::Produce), _) | (None, Some("produce")) => Job::Load(Workload::Produce),
        (Some(WorkloadArg::Consume), _) | (None, Some("consume")) => Job::Load(Workload::Consume),
        (Some(WorkloadArg::E2e), _) | (None, Some("e2e")) => Job::Load(Workload::E2e),
        (Some(WorkloadArg::Idle), _) | (None, Some("idle")) => Job::Idle,
        (Some(WorkloadArg::Ready), _) | (None, Some("ready")) => Job::Ready,
        (None, Some(other)) => {
            anyhow::bail!("workload {other:?}: expected produce, consume, e2e, idle or ready")
        }
        // A usage error, as clap reports its own: usage on stderr, exit status 2.
        (None, None) => {
            let mut strata = <crate::Cli as clap::CommandFactory>::command();
            strata.build();
            strata
                .find_subcommand_mut("bench")
                .expect("the bench subcommand")
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "name a workload (produce, consume, e2e, idle, ready) or give --workload FILE",
                )
                .exit()
        }
    })
}

/// The transactional producers' span, from the flags or the workload file.
fn transactions_of(args: &BenchArgs, file: &WorkloadFile) -> Option<strata_bench::TxnSpan> {
    (args.transactional || file.transactional.unwrap_or(false)).then(|| strata_bench::TxnSpan {
        records: args.txn_records.or(file.txn_records),
        age: args
            .txn_interval
            .or(file.txn_interval.map(Duration::from_secs_f64))
            .unwrap_or(strata_bench::TxnSpan::default().age),
    })
}

/// Whether consumers read committed records only, from the flag or the workload file.
fn read_committed_of(args: &BenchArgs, file: &WorkloadFile) -> anyhow::Result<bool> {
    Ok(match (args.isolation, file.isolation.as_deref()) {
        (Some(committed), _) => committed,
        (None, Some(text)) => parse_isolation(text)
            .map_err(|why| anyhow::anyhow!("isolation in the workload file: {why}"))?,
        (None, None) => false,
    })
}

/// `read_committed` (true) or `read_uncommitted` (false), as Kafka's `isolation.level`.
fn parse_isolation(text: &str) -> Result<bool, String> {
    match text.replace('-', "_").as_str() {
        "read_committed" => Ok(true),
        "read_uncommitted" => Ok(false),
        _ => Err(format!(
            "{text:?}: expected read_committed or read_uncommitted"
        )),
    }
}

/// Two reports side by side: each number of A, of B, and B / A.
fn compare(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<()> {
    let read = |path: &std::path::Path| -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))
    };
    let (left, right) = (read(a)?, read(b)?);
    outln!(
        "{:28} {:>16} {:>16} {:>8}",
        "",
        a.display(),
        b.display(),
        "B / A"
    );
    let mut rows: Vec<(String, Option<f64>, Option<f64>)> = Vec::new();
    for key in [
        "records",
        "bytes",
        "duration_s",
        "records_per_s",
        "mb_per_s",
        "sent_batch_bytes",
        "compression_ratio",
        "bench_cpu_percent",
        "broker_cpu_seconds",
        "broker_cpu_s_per_gb",
    ] {
        rows.push((key.into(), left[key].as_f64(), right[key].as_f64()));
    }
    // Whether the two runs met the machine in the same state.
    for key in [
        "mem_free_mb",
        "page_cache_mb",
        "dirty_mb",
        "guest_halt_poll_ns",
    ] {
        rows.push((
            format!("host.{key}"),
            left["host"][key].as_f64(),
            right["host"][key].as_f64(),
        ));
    }
    for histogram in [
        "ack_latency_us",
        "batch_latency_us",
        "commit_latency_us",
        "e2e_latency_us",
    ] {
        for percentile in ["p50", "p90", "p99", "p999", "p9999", "max"] {
            rows.push((
                format!("{histogram}.{percentile}"),
                left[histogram][percentile].as_f64(),
                right[histogram][percentile].as_f64(),
            ));
        }
    }
    for (name, x, y) in rows {
        if x.is_none() && y.is_none() {
            continue;
        }
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.2}", y / x),
            _ => "-".into(),
        };
        outln!("{name:28} {:>16} {:>16} {ratio:>8}", show(x), show(y));
    }
    Ok(())
}

/// One interval per histogram (ack, e2e) covering the measured run, tagged.
fn write_hdr_log(
    path: &std::path::Path,
    report: &strata_bench::Report,
    histograms: &strata_bench::Histograms,
) -> anyhow::Result<()> {
    use hdrhistogram::serialization::V2Serializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut serializer = V2Serializer::new();
    let mut writer = IntervalLogWriterBuilder::new()
        .with_base_time(std::time::SystemTime::now())
        .begin_log_with(&mut file, &mut serializer)?;
    // One interval per second of the run, tagged ack and e2e, as HdrHistogram tools expect;
    // a run shorter than a second gets its whole histograms as one interval.
    if histograms.intervals.is_empty() {
        let length = Duration::from_secs_f64(report.duration_s);
        for (name, histogram) in [("ack", &histograms.ack), ("e2e", &histograms.e2e)] {
            if !histogram.is_empty() {
                writer.write_histogram(histogram, Duration::ZERO, length, Tag::new(name))?;
            }
        }
    }
    for interval in &histograms.intervals {
        let start = Duration::from_secs(interval.second - 1);
        for (name, histogram) in [("ack", &interval.ack), ("e2e", &interval.e2e)] {
            if !histogram.is_empty() {
                writer.write_histogram(histogram, start, Duration::from_secs(1), Tag::new(name))?;
            }
        }
    }
    Ok(())
}
