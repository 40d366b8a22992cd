//! Client commands: `topic`, `produce`, `consume`, `group`, `cluster`.

use std::io::Write;
use std::sync::Arc;

use anyhow::bail;
use base64::Engine;
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use strata_client::{
    Client, Consumer, ConsumerConfig, Delivery, GroupConfig, GroupConsumer, OffsetReset, Producer,
    ProducerConfig, ProducerRecord, SeekTo,
};
use strata_wire::protocol::{
    CLEAN_OFFSET_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, ErrorCode,
    LATEST_TIMESTAMP,
};
use tokio::io::AsyncBufReadExt;

use super::Connection;

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub(crate) async fn connect(connection: &Connection) -> anyhow::Result<Arc<Client>> {
    let config = connection.client_config()?;
    let plaintext = config.security.tls.is_none();
    Client::connect(config).await.map_err(|error| {
        // A TLS listener hangs up on a client that does not speak TLS.
        let hint = match &error {
            strata_client::ClientError::Disconnected(_) if plaintext => {
                " (if the listener is TLS, name it: --bootstrap ssl://... or sasl_ssl://...)"
            }
            _ => "",
        };
        anyhow::anyhow!("connecting to {}: {error}{hint}", connection.bootstrap)
    })
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[arg(long, default_value_t = 1)]
        replication_factor: u16,
        /// Each partition's brokers, placed by hand as Kafka's kafka-topics places them:
        /// partitions separated by commas, a partition's brokers by colons, the first its
        /// preferred leader (`1:2,2:3,3:1`: three partitions of two replicas). Gives the
        /// partition count and replication factor. Without it, Strata places the replicas
        /// (spread over brokers and racks).
        #[arg(long, value_parser = parse_replica_assignment, conflicts_with_all = ["partitions", "replication_factor"])]
        replica_assignment: Option<ReplicaAssignment>,
        /// The topic's min.insync.replicas: acks=all needs this many in-sync replicas
        /// (default 1).
        #[arg(long)]
        min_insync: Option<u16>,
        /// The topic's retention.ms: closed segments older than this are deleted (default
        /// 604800000, 7 days; -1 no limit).
        #[arg(long)]
        retention_ms: Option<i64>,
        /// The topic's retention.bytes: closed segments past this size per partition are
        /// deleted (default -1, no limit).
        #[arg(long)]
        retention_bytes: Option<i64>,
        /// KEY=VALUE topic settings (flush=always|interval|never, segment.bytes, ...); repeat
        /// for several. A key not given takes its default (`topic describe` shows them).
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
    },
    /// List topic names.
    List,
    /// Show a topic's partitions, leaders and offsets.
    Describe {
        name: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Delete a topic and its data.
    Delete { name: String },
    /// Move partitions to a new replica set: a longer list raises the replication factor, a
    /// different one moves replicas. New replicas catch up before they join the ISR; then the
    /// old ones are dropped (leadership moves first if the leader is dropped).
    Reassign {
        name: String,
        /// Broker ids, comma-separated; the first is the preferred leader. Required unless
        /// --cancel.
        #[arg(long, value_delimiter = ',', required_unless_present = "cancel")]
        replicas: Vec<i32>,
        /// Cancel the reassignment of --partition under way instead: back to the replicas it
        /// started from (Kafka's kafka-reassign-partitions --cancel).
        #[arg(long, conflicts_with_all = ["replicas", "throttle"], requires = "partition")]
        cancel: bool,
        /// Only this partition (default: every partition of the topic).
        #[arg(long)]
        partition: Option<u32>,
        /// Bytes per second each leader broker may send the new replicas while they catch up
        /// (sets the topic's replica.recovery.bytes.per.sec first, as Kafka's
        /// `kafka-reassign-partitions --throttle` sets its throttles; it stays until
        /// `topic alter --delete-config replica.recovery.bytes.per.sec`). Without it, the
        /// topic's throttle stays as it is.
        #[arg(long)]
        throttle: Option<u64>,
    },
    /// Change a topic's settings: `--config KEY=VALUE` sets one, `--delete-config KEY` goes
    /// back to the default. All or nothing; the partitions follow the new settings at once
    /// (rolls, retention, flush, direct writes, max.message.bytes, min.insync.replicas).
    Alter {
        name: String,
        /// KEY=VALUE: set a setting; repeat for several. Settings not named stay as they are
        /// (by default).
        #[arg(long = "config", value_parser = parse_key_value, required_unless_present = "delete")]
        configs: Vec<(String, String)>,
        /// KEY: remove the topic's own value, so the setting takes its default again.
        #[arg(long = "delete-config")]
        delete: Vec<String>,
    },
    /// Grow a topic to N partitions (keys hash onto the new count from then on; consumer
    /// groups subscribed to it rebalance to take the new partitions).
    AddPartitions {
        name: String,
        /// The new total.
        #[arg(long)]
        partitions: u32,
    },
    /// Delete the records of a partition below an offset (Kafka's kafka-delete-records): its
    /// log start moves there on every replica, and consumers from the beginning start there.
    DeleteRecords {
        name: String,
        #[arg(long)]
        partition: u32,
        /// The first offset to keep; default: the high watermark (everything goes).
        #[arg(long)]
        before: Option<u64>,
    },
    /// Move leaderships back to each partition's preferred replica (the first of its replicas)
    /// where that replica is live and in sync, now: what the controller does every
    /// --leader-rebalance-interval-ms (Kafka's kafka-leader-election --election-type
    /// preferred). Every topic without NAME.
    ElectLeaders {
        name: Option<String>,
        /// Only these partitions of NAME, comma-separated; each gets its result. Default:
        /// every partition.
        #[arg(long, value_delimiter = ',', requires = "name")]
        partitions: Vec<u32>,
        /// An unclean election instead: a partition whose in-sync replicas are all down gets
        /// a live replica outside the ISR as its leader, and the records only the old leader
        /// had are lost (Kafka's --election-type unclean).
        #[arg(long)]
        unclean: bool,
    },
}

/// `--acks` as Kafka spells it: 0, 1, or all (-1).
pub fn parse_acks(text: &str) -> Result<i8, String> {
    match text {
        "0" => Ok(0),
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        other => Err(format!("{other:?}: expected 0, 1 or all")),
    }
}

/// Each partition's brokers, in partition order (`topic create --replica-assignment`).
#[derive(Debug, Clone)]
pub struct ReplicaAssignment(Vec<Vec<i32>>);

/// Kafka's `--replica-assignment` syntax: `1:2,2:3` is partition 0 on brokers 1 and 2,
/// partition 1 on 2 and 3. Every partition must have the same number of brokers.
pub fn parse_replica_assignment(text: &str) -> Result<ReplicaAssignment, String> {
    let assignment = text
        .split(',')
        .map(|partition| {
            partition
                .split(':')
                .map(|id| {
                    id.trim()
                        .parse::<i32>()
                        .map_err(|_| format!("{id:?} in {text:?} is not a broker id"))
                })
                .collect::<Result<Vec<i32>, String>>()
        })
        .collect::<Result<Vec<Vec<i32>>, String>>()?;
    if assignment
        .iter()
        .any(|replicas| replicas.len() != assignment[0].len())
    {
        return Err(format!(
            "{text:?}: every partition needs the same number of brokers"
        ));
    }
    Ok(ReplicaAssignment(assignment))
}

pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected KEY=VALUE"))?;
    Ok((key.to_string(), value.to_string()))
}

pub async fn topic(connection: Connection, command: TopicCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            replica_assignment,
            min_insync,
            retention_ms,
            retention_bytes,
            mut configs,
        } => {
            if let Some(value) = min_insync {
                configs.push(("min.insync.replicas".into(), value.to_string()));
            }
            if let Some(value) = retention_ms {
                configs.push(("retention.ms".into(), value.to_string()));
            }
            if let Some(value) = retention_bytes {
                configs.push(("retention.bytes".into(), value.to_string()));
            }
            let partitions = match replica_assignment {
                Some(ReplicaAssignment(assignment)) => {
                    let partitions = assignment.len();
                    client
                        .create_topic_assigned(&name, assignment, &configs)
                        .await?;
                    partitions as u32
                }
                None => {
                    client
                        .create_topic(&name, partitions, replication_factor, &configs)
                        .await?;
                    partitions
                }
            };
            outln!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List => {
            let metadata = client.refresh_metadata().await?;
            let mut names: Vec<&String> = metadata.topics.keys().collect();
            names.sort();
            for name in names {
                outln!("{name}");
            }
        }
        TopicCommand::Alter {
            name,
            configs,
            delete,
        } => {
            client.alter_topic_config(&name, &configs, &delete).await?;
            outln!("altered topic {name}");
        }
        TopicCommand::Describe { name, format } => describe_topic(&client, name, format).await?,
        TopicCommand::AddPartitions { name, partitions } => {
            client.add_partitions(&name, partitions).await?;
            outln!("topic {name} now has {partitions} partitions");
        }
        TopicCommand::ElectLeaders {
            name,
            partitions,
            unclean,
        } => {
            let topic = name.unwrap_or_default();
            let elected = client
                .elect_partition_leaders(&topic, &partitions, unclean)
                .await?;
            let kind = if unclean { "unclean" } else { "preferred" };
            for result in &elected.results.0 {
                match result.error {
                    ErrorCode::None => {
                        outln!("{}-{}: elected ({kind})", result.topic, result.partition)
                    }
                    error => outln!(
                        "{}-{}: not elected: {error} ({})",
                        result.topic,
                        result.partition,
                        result.message
                    ),
                }
            }
            outln!("moved {} leaderships", elected.moved);
        }
        TopicCommand::Reassign {
            name,
            replicas,
            cancel,
            partition,
            throttle,
        } => {
            let metadata = client.metadata_for(&name).await?;
            let Some(topic) = metadata.topics.get(&name) else {
                bail!("unknown topic {name}");
            };
            if let Some(rate) = throttle {
                let setting = (
                    "replica.recovery.bytes.per.sec".to_string(),
                    rate.to_string(),
                );
                client.alter_topic_config(&name, &[setting], &[]).await?;
                outln!("{name}: catch-up limited to {rate} bytes/s per leader broker");
            }
            let partitions: Vec<u32> = match partition {
                Some(partition) => vec![partition],
                None => topic.partitions.iter().map(|p| p.partition).collect(),
            };
            for partition in partitions {
                if cancel {
                    client.reassign_partition(&name, partition, &[]).await?;
                    outln!("cancelled the reassignment of {name}-{partition}");
                    continue;
                }
                client
                    .reassign_partition(&name, partition, &replicas)
                    .await?;
                outln!("reassigning {name}-{partition} to {replicas:?}");
            }
        }
        TopicCommand::DeleteRecords {
            name,
            partition,
            before,
        } => {
            let before = before.map_or(-1, |offset| offset as i64);
            let start = client.delete_records(&name, partition, before).await?;
            outln!("{name}-{partition} now starts at {start}");
        }
        TopicCommand::Delete { name } => {
            client.delete_topic(&name).await?;
            outln!("deleted topic {name}");
        }
    }
    Ok(())
}

/// `strata group delete-offsets`: each partition's result; an error if any was not deleted.
async fn delete_offsets(
    client: &Arc<Client>,
    group: &str,
    topic: &str,
    partitions: Vec<u32>,
) -> anyhow::Result<()> {
    let partitions = if partitions.is_empty() {
        let metadata = client.metadata_for(topic).await?;
        let Some(known) = metadata.topics.get(topic) else {
            bail!("unknown topic {topic}");
        };
        known.partitions.iter().map(|p| p.partition).collect()
    } else {
        partitions
    };
    let asked = vec![strata_wire::protocol::TopicPartitions {
        topic: topic.to_string(),
        partitions,
    }];
    let deleted = match client.delete_offsets(group, asked).await {
        Ok(deleted) => deleted,
        Err(error) if error.code() == Some(ErrorCode::GroupIdNotFound) => {
            bail!("no group {group}")
        }
        Err(error) if error.code() == Some(ErrorCode::NonEmptyGroup) => {
            bail!("group {group} has members whose subscriptions are unknown")
        }
        Err(error) => return Err(error.into()),
    };
    let mut refused = 0;
    for partition in deleted.iter().flat_map(|t| &t.partitions) {
        match partition.error {
            ErrorCode::None => outln!(
                "{group}: deleted the offset of {topic}-{}",
                partition.partition
            ),
            ErrorCode::GroupSubscribedToTopic => {
                refused += 1;
                outln!(
                    "{group}: {topic}-{}: a member of the group reads {topic}",
                    partition.partition
                );
            }
            error => {
                refused += 1;
                outln!("{group}: {topic}-{}: {error}", partition.partition);
            }
        }
    }
    if refused > 0 {
        bail!("{refused} offsets of {group} not deleted");
    }
    Ok(())
}

/// `strata topic describe`: partitions with their leaders, ISRs and offsets, and the settings.
async fn describe_topic(client: &Arc<Client>, name: String, format: Format) -> anyhow::Result<()> {
    let metadata = client.metadata_for(&name).await?;
    let Some(topic) = metadata.topics.get(&name) else {
        bail!("unknown topic {name}");
    };
    let mut partitions = Vec::new();
    for partition in &topic.partitions {
        let index = partition.partition;
        // An unreachable leader (cut off, dead) costs a short wait and leaves its
        // offsets unknown (null), not the whole description; a new leader answers once
        // its high watermark settled (retried meanwhile).
        let offset = |timestamp| {
            let client = client.clone();
            let name = name.clone();
            async move {
                let lookup = client.list_offset_retrying(&name, index, timestamp);
                tokio::time::timeout(std::time::Duration::from_secs(2), lookup)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
            }
        };
        let start = offset(EARLIEST_TIMESTAMP).await;
        let local_start = offset(EARLIEST_LOCAL_TIMESTAMP).await;
        let end = offset(LATEST_TIMESTAMP).await;
        let clean = offset(CLEAN_OFFSET_TIMESTAMP).await;
        partitions.push(json!({
            "partition": index,
            "leader": partition.leader,
            "leader_epoch": partition.leader_epoch,
            "replicas": partition.replicas,
            "isr": partition.isr,
            "under_replicated": partition.isr.len() < partition.replicas.len(),
            "log_start_offset": start,
            // Tiered topics: below this, records are read from the remote tier.
            "local_log_start_offset": local_start,
            "high_watermark": end,
            // Compacted topics: below this, each key's last record (see docs).
            "clean_offset": clean,
            "shard": partition.shard,
        }));
    }
    let settings = client.describe_topic_config(&name).await?;
    if format == Format::Json {
        let config: serde_json::Map<String, serde_json::Value> = settings
            .iter()
            .map(|entry| (entry.key.clone(), json!(entry.value)))
            .collect();
        let overrides: Vec<&String> = settings
            .iter()
            .filter(|entry| entry.is_override)
            .map(|entry| &entry.key)
            .collect();
        outln!(
            "{}",
            json!({ "name": name, "partitions": partitions, "config": config, "overrides": overrides })
        );
    } else {
        let shown: Vec<String> = settings
            .iter()
            .map(|entry| {
                let mark = if entry.is_override { "" } else { " (default)" };
                format!("{}={}{mark}", entry.key, entry.value)
            })
            .collect();
        let compacted = settings
            .iter()
            .any(|entry| entry.key == "cleanup.policy" && entry.value.contains("compact"));
        outln!("topic {name}: {} partitions", partitions.len());
        outln!("  config: {}", shown.join(", "));
        for p in &partitions {
            outln!(
                "  partition {} leader {} epoch {} replicas {} isr {}{} offsets {}..{}{}{} shard {}",
                p["partition"],
                p["leader"],
                p["leader_epoch"],
                p["replicas"],
                p["isr"],
                if p["under_replicated"] == true {
                    " (under-replicated)"
                } else {
                    ""
                },
                p["log_start_offset"],
                p["high_watermark"],
                // A tiered partition: where its local log starts.
                if p["local_log_start_offset"] != p["log_start_offset"]
                    && !p["local_log_start_offset"].is_null()
                {
                    format!(" local from {}", p["local_log_start_offset"])
                } else {
                    String::new()
                },
                if compacted {
                    format!(" cleaned to {}", p["clean_offset"])
                } else {
                    String::new()
                },
                p["shard"]
            );
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct ProduceArgs {
    topic: String,
    /// Split each line at the first occurrence of this character into key and value
    /// (default: no key, the whole line is the value).
    #[arg(long)]
    key_separator: Option<char>,
    /// Write every record to this partition (default: by key hash; records without a key
    /// fill one partition a batch at a time, then the next).
    #[arg(long)]
    partition: Option<u32>,
    /// 0, 1 or all.
    #[arg(long, default_value = "1", value_parser = parse_acks)]
    acks: i8,
    /// Exactly-once producing: retried batches are never written twice (implies --acks all).
    #[arg(long)]
    idempotent: bool,
    /// Print `PARTITION OFFSET` per acknowledged record, in input order; with `--format json`,
    /// one object per record that also says how durable it was when acknowledged.
    #[arg(long)]
    print_offsets: bool,
    /// How --print-offsets prints.
    #[arg(long, value_enum, default_value_t = Format::Text, requires = "print_offsets")]
    format: Format,
    /// What the leader makes of the records before acknowledging them: `policy`, as durable as
    /// the topic's flush policy makes them; `synced`, synced to its disk first (sharing the
    /// sync with other appends), whatever the flush policy.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Policy)]
    durability: DurabilityArg,
    /// A conditional append: every line read goes to --partition as one batch, written only if
    /// the partition's log ends at this offset; otherwise nothing is written and the command
    /// fails, naming where the log ends (default: unconditional).
    #[arg(long, value_name = "OFFSET", requires = "partition")]
    expect_offset: Option<u64>,
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    #[arg(long, default_value_t = 256 * 1024)]
    batch_bytes: usize,
    /// Compress batch bodies: none, lz4 or zstd (Kafka's compression.type).
    #[arg(long, default_value = "none", value_parser = parse_codec)]
    compression: strata_client::Codec,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DurabilityArg {
    Policy,
    Synced,
}

/// A produced record as `produce --print-offsets --format json` prints it.
fn acknowledged_json(metadata: &strata_client::RecordMetadata) -> serde_json::Value {
    let durability = metadata.durability.map(|d| {
        serde_json::json!({
            "replicas": d.replicas,
            "synced_replicas": d.synced_replicas,
            "leader_synced": d.leader_synced,
            "leader_synced_offset": d.leader_synced_offset,
        })
    });
    serde_json::json!({
        "partition": metadata.partition,
        "offset": metadata.offset,
        "durability": durability,
    })
}

/// A codec by its `compression.type` name.
pub fn parse_codec(name: &str) -> Result<strata_client::Codec, String> {
    strata_client::Codec::from_name(name)
        .ok_or_else(|| format!("{name:?} is not a codec: expected none, lz4 or zstd"))
}

pub async fn produce(connection: Connection, args: ProduceArgs) -> anyhow::Result<()> {
    let acks = args.acks;
    if args.idempotent && acks == 0 {
        bail!("--idempotent needs acknowledgements: it implies --acks all");
    }
    let client = connect(&connection).await?;
    client.metadata_for(&args.topic).await?;
    let producer = Producer::new(
        client,
        ProducerConfig {
            acks,
            linger: std::time::Duration::from_millis(args.linger_ms),
            batch_bytes: args.batch_bytes,
            idempotent: args.idempotent,
            compression: args.compression,
            sync_before_ack: args.durability == DurabilityArg::Synced,
            ..ProducerConfig::default()
        },
    );
    // Acks are awaited in input order by one task, printed as they arrive.
    let (pending, mut ordered) = tokio::sync::mpsc::channel::<strata_client::RecordFuture>(65_536);
    if let (Some(expected), Some(partition)) = (args.expect_offset, args.partition) {
        return produce_if(&producer, &args, partition, expected).await;
    }
    let (print_offsets, format) = (args.print_offsets, args.format);
    let printer = tokio::spawn(async move {
        let mut stdout = std::io::stdout();
        let mut failures = 0u64;
        let mut first_error = None;
        while let Some(ack) = ordered.recv().await {
            match ack.await {
                Ok(metadata) if print_offsets && format == Format::Json => {
                    writeln!(stdout, "{}", acknowledged_json(&metadata))?;
                }
                Ok(metadata) => {
                    if print_offsets {
                        writeln!(stdout, "{} {}", metadata.partition, metadata.offset)?;
                    }
                }
                Err(error) => {
                    failures += 1;
                    first_error.get_or_insert(error);
                }
            }
        }
        stdout.flush()?;
        match first_error {
            Some(error) => bail!("{failures} records failed; first: {error}"),
            None => Ok(()),
        }
    });
    let topic: Arc<str> = args.topic.as_str().into();
    // Lines are bytes: a record need not be UTF-8.
    let mut input = tokio::io::BufReader::new(tokio::io::stdin());
    let mut separator = [0u8; 4];
    let separator: Option<&[u8]> = args
        .key_separator
        .map(|c| c.encode_utf8(&mut separator).as_bytes());
    let mut read_error = None;
    loop {
        let mut line = Vec::new();
        let read = match input.read_until(b'\n', &mut line).await {
            Ok(read) => read,
            Err(error) => {
                // What was read so far still goes out, acknowledged, before the error is told.
                read_error = Some(error);
                break;
            }
        };
        if read == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let line = Bytes::from(line);
        let (key, value) = match separator.and_then(|sep| {
            line.windows(sep.len())
                .position(|w| w == sep)
                .map(|at| (at, sep.len()))
        }) {
            Some((at, len)) => (Some(line.slice(..at)), line.slice(at + len..)),
            None => (None, line),
        };
        let mut record = ProducerRecord::new(topic.clone(), key, value);
        record.partition = args.partition;
        let ack = producer.send(record).await?;
        if pending.send(ack).await.is_err() {
            break;
        }
    }
    producer.flush().await?;
    drop(pending);
    printer.await??;
    match read_error {
        Some(error) => bail!("reading stdin: {error}"),
        None => Ok(()),
    }
}

/// `produce --expect-offset`: stdin's lines as one conditional append.
async fn produce_if(
    producer: &Producer,
    args: &ProduceArgs,
    partition: u32,
    expected: u64,
) -> anyhow::Result<()> {
    let mut input = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut input)
        .await
        .map_err(|error| anyhow::anyhow!("reading stdin: {error}"))?;
    let mut separator = [0u8; 4];
    let separator: Option<&[u8]> = args
        .key_separator
        .map(|c| c.encode_utf8(&mut separator).as_bytes());
    let lines = input.strip_suffix(b"\n").unwrap_or(&input);
    if lines.is_empty() {
        bail!("no records on stdin: a conditional append needs at least one");
    }
    let records: Vec<(Option<&[u8]>, &[u8])> = lines
        .split(|byte| *byte == b'\n')
        .map(|line| {
            match separator.and_then(|sep| line.windows(sep.len()).position(|w| w == sep)) {
                Some(at) => (
                    Some(&line[..at]),
                    &line[at + separator.map_or(0, <[u8]>::len)..],
                ),
                None => (None, line),
            }
        })
        .collect();
    match producer
        .send_if(&args.topic, partition, expected, &records)
        .await
    {
        Ok(first) => {
            if args.print_offsets {
                for at in 0..records.len() as i64 {
                    let landed = strata_client::RecordMetadata {
                        offset: first.offset + at,
                        ..first
                    };
                    match args.format {
                        Format::Json => outln!("{}", acknowledged_json(&landed)),
                        Format::Text => outln!("{partition} {}", landed.offset),
                    }
                }
            }
            Ok(())
        }
        Err(strata_client::ClientError::LogEndMismatch { log_end, .. }) => bail!(
            "{}-{partition} ends at {log_end}, not at {expected}: nothing written",
            args.topic
        ),
        Err(error) => Err(error.into()),
    }
}

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Consume as a member of this group: partitions are shared with the group's other
    /// members and positions are committed (at-least-once unless --at-most-once).
    #[arg(long, conflicts_with_all = ["partition", "offset"])]
    group: Option<String>,
    /// Consume as a member of this share group (a queue): each record goes to one member at a
    /// time and is acknowledged (accepted) once printed; one left unacknowledged (the process
    /// died) goes to another member when its lock runs out. Where the group starts on a
    /// partition is its `share.auto.offset.reset` config (default: the end).
    #[arg(long, conflicts_with_all = [
        "group", "partition", "offset", "from_beginning", "at_most_once", "instance_id",
    ])]
    share_group: Option<String>,
    /// Only this partition (default: all).
    #[arg(long)]
    partition: Option<u32>,
    /// Without --group: start at the beginning. With --group: where the group has no
    /// committed offset, start at the beginning (else at the end).
    #[arg(long, conflicts_with = "offset")]
    from_beginning: bool,
    /// Without --group: start at this offset (default: at the end, or the beginning with
    /// --from-beginning).
    #[arg(long)]
    offset: Option<u64>,
    /// Stop after this many records (default: run until interrupted).
    #[arg(long)]
    max_messages: Option<u64>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// With --group: commit before printing (a crash may skip records, never repeat them).
    #[arg(long, requires = "group")]
    at_most_once: bool,
    /// With --group: static membership (`group.instance.id`): a restart within the session
    /// timeout keeps the member's partitions (default: a dynamic member).
    #[arg(long, requires = "group")]
    instance_id: Option<String>,
    /// With --group: how long the group waits for a silent member.
    #[arg(long, requires = "group", default_value_t = 10_000)]
    session_timeout_ms: u64,
    /// With --group: commit what was printed this often.
    #[arg(long, requires = "group", default_value_t = 5_000)]
    auto_commit_interval_ms: u64,
    /// With --group: `sticky` (default), `range` or `roundrobin`.
    #[arg(long, requires = "group", default_value = "sticky", value_parser = [
        "sticky", "cooperative-sticky", "range", "roundrobin", "round-robin",
    ])]
    assignor: String,
}

/// SIGINT or SIGTERM, whichever comes first.
pub(crate) async fn interrupted() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// What `consume` prints of a record.
pub(crate) struct Printed<'a> {
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    /// `None` for a null value.
    pub value: Option<&'a [u8]>,
}

pub(crate) fn print_record(
    stdout: &mut impl Write,
    format: Format,
    record: Printed<'_>,
) -> std::io::Result<()> {
    let partition = record.partition;
    match format {
        Format::Text => writeln!(
            stdout,
            "{}",
            String::from_utf8_lossy(record.value.unwrap_or_default())
        ),
        Format::Json => {
            let mut object = json!({
                "partition": partition,
                "offset": record.offset,
                "timestamp": record.timestamp_ms,
            });
            let mut binary = false;
            let mut field = |bytes: Option<&[u8]>| match bytes {
                None => serde_json::Value::Null,
                Some(bytes) => match std::str::from_utf8(bytes) {
                    Ok(text) => json!(text),
                    Err(_) => {
                        binary = true;
                        json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                },
            };
            let key = field(record.key);
            let value = field(record.value);
            object["key"] = key;
            object["value"] = value;
            if binary {
                object["encoding"] = json!("base64");
            }
            writeln!(stdout, "{object}")
        }
    }
}

/// Prints the records of `batches` until `printed` reaches `limit`. Returns, for each
/// partition where the limit cut in, its first unprinted offset.
fn print_batches(
    batches: &[strata_client::ConsumedBatch],
    format: Format,
    printed: &mut u64,
    limit: u64,
) -> std::io::Result<Vec<(String, u32, u64)>> {
    let mut stdout = std::io::stdout().lock();
    let mut cut: Vec<(String, u32, u64)> = Vec::new();
    for consumed in batches {
        for record in consumed.records() {
            if *printed == limit {
                if !cut
                    .iter()
                    .any(|(t, p, _)| *t == consumed.topic && *p == consumed.partition)
                {
                    cut.push((consumed.topic.clone(), consumed.partition, record.offset));
                }
                break;
            }
            let printed_record = Printed {
                partition: consumed.partition,
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
                key: record.key,
                value: record.nullable_value(),
            };
            print_record(&mut stdout, format, printed_record)?;
            *printed += 1;
        }
    }
    stdout.flush()?;
    Ok(cut)
}

pub async fn consume(connection: Connection, args: ConsumeArgs) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    if let Some(group) = args.share_group.clone() {
        let limit = args.max_messages.unwrap_or(u64::MAX);
        return super::share_cmd::consume(client, group, args.topic, limit, args.format).await;
    }
    if let Some(group) = args.group.clone() {
        return consume_in_group(client, group, args).await;
    }
    // A position the log no longer holds (retention deleted it) moves to the oldest record
    // still there when the user asked for old records, else to the end.
    let reset = if args.from_beginning || args.offset.is_some() {
        OffsetReset::Earliest
    } else {
        OffsetReset::Latest
    };
    let mut consumer = Consumer::new(
        client,
        ConsumerConfig {
            auto_offset_reset: Some(reset),
            ..ConsumerConfig::default()
        },
    );
    let start = match (args.offset, args.from_beginning) {
        (Some(offset), _) => SeekTo::Offset(offset),
        (None, true) => SeekTo::Beginning,
        (None, false) => SeekTo::End,
    };
    let partitions: Vec<u32> = args.partition.into_iter().collect();
    consumer.assign(&args.topic, &partitions, start).await?;
    let mut printed = 0u64;
    let limit = args.max_messages.unwrap_or(u64::MAX);
    let stop = interrupted();
    tokio::pin!(stop);
    while printed < limit {
        let batches = tokio::select! {
            batches = consumer.poll() => batches?,
            _ = &mut stop => break,
        };
        print_batches(&batches, args.format, &mut printed, limit)?;
    }
    Ok(())
}

/// `consume --group`: on SIGINT/SIGTERM (or after --max-messages) it commits exactly what it
/// printed and leaves the group, so a graceful stop re-delivers nothing.
async fn consume_in_group(
    client: Arc<Client>,
    group: String,
    args: ConsumeArgs,
) -> anyhow::Result<()> {
    let mut config = GroupConfig::new(group);
    config.client_id = "strata-consume".into();
    config.instance_id = args.instance_id.clone();
    config.session_timeout = std::time::Duration::from_millis(args.session_timeout_ms);
    config.auto_commit_interval = Some(std::time::Duration::from_millis(
        args.auto_commit_interval_ms,
    ));
    config.assignor = args.assignor.clone();
    config.auto_offset_reset = if args.from_beginning {
        OffsetReset::Earliest
    } else {
        OffsetReset::Latest
    };
    if args.at_most_once {
        config.delivery = Delivery::AtMostOnce;
    }
    let mut consumer = GroupConsumer::subscribe(client, vec![args.topic.clone()], config).await?;
    let mut printed = 0u64;
    let limit = args.max_messages.unwrap_or(u64::MAX);
    let stop = interrupted();
    tokio::pin!(stop);
    while printed < limit {
        let batches = tokio::select! {
            batches = consumer.poll() => batches?,
            _ = &mut stop => break,
        };
        // Stopped inside a batch: commit only what was printed.
        for (topic, partition, next_offset) in
            print_batches(&batches, args.format, &mut printed, limit)?
        {
            consumer.consumed_up_to(&topic, partition, next_offset);
        }
    }
    consumer.close().await?;
    Ok(())
}

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Every group the cluster stores.
    List {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Members, assignment, committed offsets and lag (of a share group too).
    ///
    /// For a share group: its members (id, client, assignment), and per partition the start
    /// offset, the records in flight and the lag in records and in seconds (the age of the
    /// record at the start offset).
    Describe {
        group: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// A group's configs (share.auto.offset.reset, share.record.lock.duration.ms, ...): each
    /// with its value, set on the group or the default; --set and --delete change them, all or
    /// nothing. A group need not exist to have configs.
    Config(crate::group_config_cmd::GroupConfigArgs),
    /// Move a stopped group's committed offsets (to the earliest or latest offset, an offset,
    /// a time, or by N), as kafka-consumer-groups --reset-offsets: prints the plan, and
    /// commits it with --execute. Refused while the group has members.
    ResetOffsets(super::group_reset::ResetOffsetsArgs),
    /// Delete a group without members, and every offset it committed (it disappears from
    /// `group list` and from lag metrics; a consumer joining it later starts afresh).
    Delete { group: String },
    /// Forget a group's committed offsets of a topic (its partitions named, or all), as
    /// Kafka's kafka-consumer-groups --delete-offsets: refused while a member of the group
    /// reads the topic.
    DeleteOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        /// Comma-separated; default: every partition of the topic.
        #[arg(long, value_delimiter = ',')]
        partitions: Vec<u32>,
    },
}

pub async fn group(connection: Connection, command: GroupCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    match command {
        GroupCommand::List { format } => {
            let groups = client.list_groups().await?;
            if format == Format::Json {
                let groups: Vec<_> = groups
                    .iter()
                    .map(|g| json!({ "group": g.group, "generation": g.generation }))
                    .collect();
                outln!("{}", json!({ "groups": groups }));
            } else {
                for group in groups {
                    outln!("{} (generation {})", group.group, group.generation);
                }
            }
        }
        GroupCommand::Delete { group } => match client.delete_group(&group).await {
            Ok(()) => outln!("deleted group {group}"),
            Err(error) => match error.code() {
                Some(ErrorCode::NonEmptyGroup) => {
                    bail!("group {group} has members: stop its consumers first")
                }
                Some(ErrorCode::GroupIdNotFound) => bail!("no group {group}"),
                _ => return Err(anyhow::Error::new(error).context(format!("deleting {group}"))),
            },
        },
        GroupCommand::DeleteOffsets {
            group,
            topic,
            partitions,
        } => delete_offsets(&client, &group, &topic, partitions).await?,
        GroupCommand::ResetOffsets(args) => {
            super::group_reset::reset_offsets(&client, args).await?
        }
        GroupCommand::Config(args) => crate::group_config_cmd::group_config(&client, args).await?,
        GroupCommand::Describe { group, format } => {
            // A share group answers for itself; any other name is a consumer group's.
            if let Ok(share) = client.describe_share_group(&group).await {
                return super::share_cmd::describe(&client, share, format).await;
            }
            let described = client.describe_group(&group).await?;
            let mut offsets = Vec::new();
            for committed in &described.offsets {
                // Lag against the high watermark; unknown when the leader cannot be asked.
                let end = client
                    .list_offset(&committed.topic, committed.partition, LATEST_TIMESTAMP)
                    .await
                    .ok()
                    .flatten();
                let lag = end.map(|end| (end as i64 - committed.offset).max(0));
                let lag_seconds = lag_seconds(&client, committed, lag).await;
                offsets.push(json!({
                    "topic": committed.topic,
                    "partition": committed.partition,
                    "committed": committed.offset,
                    "lag": lag,
                    "lag_seconds": lag_seconds,
                }));
            }
            let members: Vec<_> = described
                .members
                .iter()
                .map(|member| {
                    let partitions: Vec<_> = member
                        .assignment
                        .iter()
                        .flat_map(|tp| {
                            tp.partitions
                                .iter()
                                .map(move |p| json!({ "topic": tp.topic, "partition": p }))
                        })
                        .collect();
                    json!({
                        "id": member.member_id,
                        "instance_id": member.instance_id,
                        "client_id": member.client_id,
                        "generation": member.generation,
                        "partitions": partitions,
                    })
                })
                .collect();
            if format == Format::Json {
                outln!(
                    "{}",
                    json!({
                        "group": described.group,
                        "generation": described.generation,
                        "state": described.state,
                        "assignor": described.assignor,
                        "members": members,
                        "offsets": offsets,
                    })
                );
            } else {
                outln!(
                    "group {} generation {} state {} assignor {}",
                    described.group,
                    described.generation,
                    described.state,
                    described.assignor
                );
                for member in &members {
                    outln!(
                        "  member {} [{}]",
                        member["id"].as_str().unwrap_or_default(),
                        member_partitions(member)
                    );
                }
                for offset in &offsets {
                    outln!(
                        "  {}-{} committed {} lag {} ({} s)",
                        offset["topic"].as_str().unwrap_or_default(),
                        offset["partition"],
                        offset["committed"],
                        offset["lag"],
                        offset["lag_seconds"]
                    );
                }
            }
        }
    }
    Ok(())
}

/// The age in seconds of the oldest record a group has not consumed (the one at its committed
/// offset): 0 when caught up, `None` when the leader cannot be asked.
async fn lag_seconds(
    client: &strata_client::Client,
    committed: &strata_wire::protocol::CommittedOffset,
    lag: Option<i64>,
) -> Option<f64> {
    match lag? {
        0 => Some(0.0),
        _ => {
            let offset = u64::try_from(committed.offset).ok()?;
            let timestamp_ms = client
                .record_timestamp_at(&committed.topic, committed.partition, offset)
                .await
                .ok()??;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_millis() as i64;
            Some((now_ms - timestamp_ms).max(0) as f64 / 1000.0)
        }
    }
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Brokers and the controller.
    Info {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Broker settings: list them, or set and remove those that change live (for every
    /// broker, or for one).
    Config {
        #[command(subcommand)]
        command: crate::cluster_config_cmd::ClusterConfigCommand,
    },
}

pub async fn cluster(connection: Connection, command: ClusterCommand) -> anyhow::Result<()> {
    let format = match command {
        ClusterCommand::Info { format } => format,
        ClusterCommand::Config { command } => {
            return crate::cluster_config_cmd::cluster_config(&connection, command).await;
        }
    };
    let client = connect(&connection).await?;
    let metadata = client.refresh_metadata().await?;
    let mut brokers: Vec<_> = metadata.brokers.values().collect();
    brokers.sort_by_key(|broker| broker.node_id);
    let mut listed: Vec<serde_json::Value> = brokers
        .into_iter()
        .map(|broker| {
            json!({
                "id": broker.node_id,
                "addr": format!("{}:{}", broker.host, broker.port),
                "alive": true,
                "shard_ports": broker.shard_ports,
            })
        })
        .collect();
    // A broker that holds replicas but is not registered (dead, or cut off past its lease) is
    // listed too, not alive, with no address to give.
    let dead: std::collections::BTreeSet<i32> = metadata
        .topics
        .values()
        .flat_map(|topic| topic.partitions.iter())
        .flat_map(|partition| partition.replicas.iter().copied())
        .filter(|id| !metadata.brokers.contains_key(id))
        .collect();
    listed.extend(
        dead.into_iter()
            .map(|id| json!({ "id": id, "addr": null, "alive": false, "shard_ports": [] })),
    );
    let brokers = listed;
    if format == Format::Json {
        outln!(
            "{}",
            json!({ "cluster": metadata.cluster, "controller": metadata.controller, "brokers": brokers })
        );
    } else {
        outln!(
            "cluster {} (controller {})",
            metadata.cluster,
            metadata.controller
        );
        for broker in &brokers {
            match broker["addr"].as_str() {
                Some(addr) => outln!(
                    "  broker {} at {} shard ports {}",
                    broker["id"],
                    addr,
                    broker["shard_ports"]
                ),
                None => outln!("  broker {} not alive (holds replicas)", broker["id"]),
            }
        }
    }
    Ok(())
}

/// A described member's partitions (`"partitions": [{"topic", "partition"}]`) as
/// `topic-partition` words.
pub(crate) fn member_partitions(member: &serde_json::Value) -> String {
    let partitions: Vec<String> = member["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}-{}",
                p["topic"].as_str().unwrap_or_default(),
                p["partition"]
            )
        })
        .collect();
    partitions.join(" ")
}
