//! Client commands: `topic`, `produce`, `consume`, `cluster`.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine;
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use strata_wire::protocol::{EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use tokio::io::AsyncBufReadExt;

use super::Connection;

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

async fn connect(connection: &Connection) -> anyhow::Result<Arc<Client>> {
    Client::connect(ClientConfig::new(&connection.bootstrap))
        .await
        .with_context(|| format!("connecting to {}", connection.bootstrap))
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
        #[arg(long)]
        min_insync: Option<u16>,
        #[arg(long)]
        retention_ms: Option<i64>,
        #[arg(long)]
        retention_bytes: Option<i64>,
        /// KEY=VALUE topic settings (flush=always|interval|never, segment.bytes, ...).
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
        /// Broker ids, comma-separated; the first is the preferred leader.
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<i32>,
        /// Only this partition (default: every partition of the topic).
        #[arg(long)]
        partition: Option<u32>,
    },
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
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
            client
                .create_topic(&name, partitions, replication_factor, &configs)
                .await?;
            println!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List => {
            let metadata = client.refresh_metadata().await?;
            let mut names: Vec<&String> = metadata.topics.keys().collect();
            names.sort();
            for name in names {
                println!("{name}");
            }
        }
        TopicCommand::Describe { name, format } => {
            let metadata = client.metadata_for(&name).await?;
            let Some(topic) = metadata.topics.get(&name) else {
                bail!("unknown topic {name}");
            };
            let mut partitions = Vec::new();
            for partition in &topic.partitions {
                let index = partition.partition;
                // A leader that cannot be reached leaves its offsets unknown (null), not the
                // whole description.
                // An unreachable leader (cut off, dead) costs at most a short wait.
                let offset = |timestamp| {
                    let client = client.clone();
                    let name = name.clone();
                    async move {
                        let lookup = client.list_offset(&name, index, timestamp);
                        tokio::time::timeout(std::time::Duration::from_secs(2), lookup)
                            .await
                            .ok()
                            .and_then(Result::ok)
                            .flatten()
                    }
                };
                let start = offset(EARLIEST_TIMESTAMP).await;
                let end = offset(LATEST_TIMESTAMP).await;
                partitions.push(json!({
                    "partition": index,
                    "leader": partition.leader,
                    "leader_epoch": partition.leader_epoch,
                    "replicas": partition.replicas,
                    "isr": partition.isr,
                    "under_replicated": partition.isr.len() < partition.replicas.len(),
                    "log_start_offset": start,
                    "high_watermark": end,
                    "shard": partition.shard,
                }));
            }
            if format == Format::Json {
                println!("{}", json!({ "name": name, "partitions": partitions }));
            } else {
                println!("topic {name}: {} partitions", partitions.len());
                for p in &partitions {
                    println!(
                        "  partition {} leader {} epoch {} replicas {} isr {}{} offsets {}..{} shard {}",
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
                        p["shard"]
                    );
                }
            }
        }
        TopicCommand::Reassign {
            name,
            replicas,
            partition,
        } => {
            let metadata = client.metadata_for(&name).await?;
            let Some(topic) = metadata.topics.get(&name) else {
                bail!("unknown topic {name}");
            };
            let partitions: Vec<u32> = match partition {
                Some(partition) => vec![partition],
                None => topic.partitions.iter().map(|p| p.partition).collect(),
            };
            for partition in partitions {
                client
                    .reassign_partition(&name, partition, &replicas)
                    .await?;
                println!("reassigning {name}-{partition} to {replicas:?}");
            }
        }
        TopicCommand::Delete { name } => {
            client.delete_topic(&name).await?;
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct ProduceArgs {
    topic: String,
    /// Split each line at the first occurrence of this character into key and value.
    #[arg(long)]
    key_separator: Option<char>,
    #[arg(long)]
    partition: Option<u32>,
    /// 0, 1 or all.
    #[arg(long, default_value = "1")]
    acks: String,
    /// Exactly-once producing arrives with the idempotent producer.
    #[arg(long)]
    idempotent: bool,
    /// Print `PARTITION OFFSET` per acknowledged record, in input order.
    #[arg(long)]
    print_offsets: bool,
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    #[arg(long, default_value_t = 256 * 1024)]
    batch_bytes: usize,
}

pub async fn produce(connection: Connection, args: ProduceArgs) -> anyhow::Result<()> {
    if args.idempotent {
        bail!("--idempotent: the idempotent producer arrives with the consumer-groups milestone");
    }
    let acks = match args.acks.as_str() {
        "0" => 0,
        "1" => 1,
        "all" | "-1" => -1,
        other => bail!("--acks {other}: expected 0, 1 or all"),
    };
    let client = connect(&connection).await?;
    client.metadata_for(&args.topic).await?;
    let producer = Producer::new(
        client,
        ProducerConfig {
            acks,
            linger: std::time::Duration::from_millis(args.linger_ms),
            batch_bytes: args.batch_bytes,
            ..ProducerConfig::default()
        },
    );
    // Acks are awaited in input order by one task, printed as they arrive.
    let (pending, mut ordered) = tokio::sync::mpsc::channel::<strata_client::RecordFuture>(65_536);
    let print_offsets = args.print_offsets;
    let printer = tokio::spawn(async move {
        let mut stdout = std::io::stdout();
        let mut failures = 0u64;
        let mut first_error = None;
        while let Some(ack) = ordered.recv().await {
            match ack.await {
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
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let (key, value) = match args.key_separator {
            Some(separator) => match line.split_once(separator) {
                Some((key, value)) => (Some(Bytes::from(key.to_string())), value.to_string()),
                None => (None, line),
            },
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
    Ok(())
}

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Consumer groups arrive with their milestone.
    #[arg(long)]
    group: Option<String>,
    /// Only this partition (default: all).
    #[arg(long)]
    partition: Option<u32>,
    #[arg(long)]
    from_beginning: bool,
    #[arg(long)]
    offset: Option<u64>,
    /// Stop after this many records (default: run until interrupted).
    #[arg(long)]
    max_messages: Option<u64>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

pub async fn consume(connection: Connection, args: ConsumeArgs) -> anyhow::Result<()> {
    if args.group.is_some() {
        bail!("--group: consumer groups arrive with their milestone; use --partition or no flag");
    }
    let client = connect(&connection).await?;
    let mut consumer = Consumer::new(client, ConsumerConfig::default());
    let start = match (args.offset, args.from_beginning) {
        (Some(offset), _) => SeekTo::Offset(offset),
        (None, true) => SeekTo::Beginning,
        (None, false) => SeekTo::End,
    };
    let partitions: Vec<u32> = args.partition.into_iter().collect();
    consumer.assign(&args.topic, &partitions, start).await?;
    let mut printed = 0u64;
    let limit = args.max_messages.unwrap_or(u64::MAX);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    while printed < limit {
        let batches = tokio::select! {
            batches = consumer.poll() => batches?,
            _ = &mut interrupted => break,
        };
        let mut stdout = std::io::stdout().lock();
        for consumed in &batches {
            for record in consumed.records() {
                if printed == limit {
                    break;
                }
                match args.format {
                    Format::Text => {
                        writeln!(stdout, "{}", String::from_utf8_lossy(record.value))?;
                    }
                    Format::Json => {
                        let mut object = json!({
                            "partition": consumed.partition,
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
                        let value = field(Some(record.value));
                        object["key"] = key;
                        object["value"] = value;
                        if binary {
                            object["encoding"] = json!("base64");
                        }
                        writeln!(stdout, "{object}")?;
                    }
                }
                printed += 1;
            }
        }
        stdout.flush()?;
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Brokers and the controller.
    Info {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

pub async fn cluster(connection: Connection, command: ClusterCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    let ClusterCommand::Info { format } = command;
    let metadata = client.refresh_metadata().await?;
    let mut brokers: Vec<_> = metadata.brokers.values().collect();
    brokers.sort_by_key(|broker| broker.node_id);
    let brokers: Vec<_> = brokers
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
    if format == Format::Json {
        println!(
            "{}",
            json!({ "cluster": metadata.cluster, "controller": metadata.controller, "brokers": brokers })
        );
    } else {
        println!(
            "cluster {} (controller {})",
            metadata.cluster, metadata.controller
        );
        for broker in &brokers {
            println!(
                "  broker {} at {} shard ports {}",
                broker["id"],
                broker["addr"].as_str().unwrap_or_default(),
                broker["shard_ports"]
            );
        }
    }
    Ok(())
}
