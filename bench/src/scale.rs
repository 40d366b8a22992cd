//! The scale workloads: what many partitions cost a broker at rest (`idle`), and how soon a
//! restarted broker serves again (`ready`). Both measure the broker from outside, as an
//! operator would: through its protocol and its `/metrics`.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde::Serialize;
use strata_client::{Client, ClientError};

use crate::BenchConfig;

/// `strata bench idle`: a topic of many partitions created, then left alone.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub topic: String,
    pub partitions: u32,
    /// Whether this run created the topic (the memory per partition is measured only then).
    pub created: bool,
    /// From the create request to every partition having a leader that answers for it.
    pub create_s: Option<f64>,
    /// How long the brokers were watched at rest, after `--warmup` let them settle.
    pub idle_s: f64,
    /// CPU the brokers used at rest, in % of one core (summed over the brokers).
    pub broker_cpu_percent: f64,
    /// The brokers' resident memory (summed) before the topic was created and after the rest.
    pub broker_resident_bytes_before: Option<u64>,
    pub broker_resident_bytes_after: u64,
    /// What each partition added to the brokers' resident memory (replicas counted once per
    /// partition: with replication, the sum over its brokers).
    pub resident_bytes_per_partition: Option<f64>,
    /// File descriptors the brokers hold (summed), after the rest.
    pub broker_open_fds: Option<u64>,
}

/// `strata bench ready`: how soon a (re)starting cluster answers.
#[derive(Debug, Clone, Serialize)]
pub struct ReadyReport {
    pub topic: String,
    pub partitions: u32,
    /// From the probe's start to the first metadata answer naming the topic.
    pub serving_s: f64,
    /// From the probe's start to every partition of the topic answering a ListOffsets from its
    /// leader (its log opened and recovered, its leader in place).
    pub recovered_s: f64,
    /// Metadata and ListOffsets requests the probe sent.
    pub probes: u64,
}

/// How often the probes ask while the answers are not there yet.
const PROBE_PAUSE: Duration = Duration::from_millis(20);

/// ListOffsets requests in flight at once while probing partitions.
const PROBES_IN_FLIGHT: usize = 64;

/// A broker's gauges and counters that the scale workloads read from its `/metrics`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: Option<u64>,
    pub open_fds: Option<u64>,
}

impl ProcessFigures {
    fn add(self, other: ProcessFigures) -> ProcessFigures {
        let sum = |a: Option<u64>, b: Option<u64>| Some(a? + b?);
        ProcessFigures {
            cpu_seconds: self.cpu_seconds + other.cpu_seconds,
            resident_bytes: sum(self.resident_bytes, other.resident_bytes),
            open_fds: sum(self.open_fds, other.open_fds),
        }
    }

    /// The figures in a Prometheus text exposition (`None` without a CPU counter).
    pub(crate) fn parse(metrics: &str) -> Option<ProcessFigures> {
        let value = |name: &str| {
            metrics
                .lines()
                .filter(|line| {
                    line.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ']))
                })
                .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
                .reduce(|a, b| a + b)
        };
        Some(ProcessFigures {
            cpu_seconds: value("process_cpu_seconds_total")?,
            resident_bytes: value("process_resident_memory_bytes").map(|v| v as u64),
            open_fds: value("process_open_fds").map(|v| v as u64),
        })
    }
}

/// The summed figures of the brokers at `admins`; an error names the one that did not answer.
pub(crate) async fn brokers_figures(admins: &[String]) -> anyhow::Result<ProcessFigures> {
    let mut total: Option<ProcessFigures> = None;
    for admin in admins {
        let metrics = crate::measure::scrape_metrics(admin)
            .await
            .with_context(|| format!("reading the metrics of the broker at {admin}"))?;
        let figures = ProcessFigures::parse(&metrics).with_context(|| {
            format!("the broker at {admin} exports no process_cpu_seconds_total")
        })?;
        total = Some(total.map_or(figures, |total| total.add(figures)));
    }
    total.context("no broker to read")
}

/// Creates `config.topic` with `config.partitions` partitions (unless it exists), waits until
/// each answers from its leader, lets the brokers settle for `config.warmup`, then watches them
/// at rest for `config.duration`.
pub async fn idle(config: &BenchConfig) -> anyhow::Result<IdleReport> {
    anyhow::ensure!(
        config.protocol == crate::Protocol::Native,
        "the scale workloads speak Strata's protocol only"
    );
    anyhow::ensure!(
        !config.broker_admins.is_empty(),
        "the idle workload measures the brokers: give every broker's --broker-admin"
    );
    let client = Client::connect(config.client_config())
        .await
        .with_context(|| format!("connecting to {}", config.bootstrap))?;
    let before = brokers_figures(&config.broker_admins).await?;
    let exists = match client.metadata_for(&config.topic).await {
        Ok(_) => true,
        Err(ClientError::UnknownTopic(_)) => false,
        Err(error) => return Err(error).context("looking up the topic"),
    };
    let mut create_s = None;
    if !exists {
        let asked = Instant::now();
        client
            .create_topic(
                &config.topic,
                config.partitions,
                config.replication_factor,
                &config.topic_config,
            )
            .await
            .with_context(|| format!("creating topic {}", config.topic))?;
        let deadline = asked + Duration::from_secs(600);
        all_partitions_answer(&client, &config.topic, deadline, &mut 0).await?;
        create_s = Some(asked.elapsed().as_secs_f64());
    }
    let partitions = client
        .metadata_for(&config.topic)
        .await?
        .partition_count(&config.topic)?;
    tokio::time::sleep(config.warmup).await;
    let rest = config.duration.unwrap_or(Duration::from_secs(10));
    let (rest_started, at_rest) = (
        Instant::now(),
        brokers_figures(&config.broker_admins).await?,
    );
    tokio::time::sleep(rest).await;
    let after = brokers_figures(&config.broker_admins).await?;
    let idle_s = rest_started.elapsed().as_secs_f64();
    let resident_before = (!exists).then_some(before.resident_bytes).flatten();
    let resident_after = after
        .resident_bytes
        .context("the brokers export no process_resident_memory_bytes")?;
    Ok(IdleReport {
        topic: config.topic.clone(),
        partitions,
        created: !exists,
        create_s,
        idle_s,
        broker_cpu_percent: 100.0 * (after.cpu_seconds - at_rest.cpu_seconds).max(0.0) / idle_s,
        broker_resident_bytes_before: resident_before,
        broker_resident_bytes_after: resident_after,
        resident_bytes_per_partition: resident_before
            .map(|before| (resident_after as f64 - before as f64) / f64::from(partitions.max(1))),
        broker_open_fds: after.open_fds,
    })
}

/// Probes the cluster at `config.bootstrap` from now until it names `config.topic`, then until
/// every partition of the topic answers from its leader; gives up after `config.duration`
/// (default 10 minutes). Start it as the broker starts.
pub async fn ready(config: &BenchConfig) -> anyhow::Result<ReadyReport> {
    anyhow::ensure!(
        config.protocol == crate::Protocol::Native,
        "the scale workloads speak Strata's protocol only"
    );
    let started = Instant::now();
    let deadline = started + config.duration.unwrap_or(Duration::from_secs(600));
    let mut probes = 0u64;
    let client = loop {
        probes += 1;
        let named = async {
            let client = Client::connect(config.client_config()).await?;
            client.metadata_for(&config.topic).await?;
            Ok::<_, ClientError>(client)
        };
        match named.await {
            Ok(client) => break client,
            Err(error) if Instant::now() >= deadline => {
                return Err(error).context(format!(
                    "no broker at {} named topic {} in time",
                    config.bootstrap, config.topic
                ));
            }
            Err(_) => tokio::time::sleep(PROBE_PAUSE).await,
        }
    };
    let serving_s = started.elapsed().as_secs_f64();
    let partitions = all_partitions_answer(&client, &config.topic, deadline, &mut probes).await?;
    Ok(ReadyReport {
        topic: config.topic.clone(),
        partitions,
        serving_s,
        recovered_s: started.elapsed().as_secs_f64(),
        probes,
    })
}

/// Waits until every partition of `topic` answers a ListOffsets (latest) from its leader;
/// returns the partition count. Partitions that answered are not asked again.
async fn all_partitions_answer(
    client: &Client,
    topic: &str,
    deadline: Instant,
    probes: &mut u64,
) -> anyhow::Result<u32> {
    let mut waiting: Option<Vec<u32>> = None;
    loop {
        let metadata = match client.refresh_metadata().await {
            Ok(metadata) => metadata,
            Err(error) if error.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(PROBE_PAUSE).await;
                continue;
            }
            Err(error) => return Err(error).context("reading metadata"),
        };
        *probes += 1;
        let count = match metadata.partition_count(topic) {
            Ok(count) => count,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(PROBE_PAUSE).await;
                continue;
            }
            Err(error) => return Err(error).context("the topic is not in the metadata"),
        };
        let asked = waiting.take().unwrap_or_else(|| (0..count).collect());
        *probes += asked.len() as u64;
        let mut answers = futures_util::stream::iter(asked)
            .map(|partition| async move {
                let answer = client.list_offset(topic, partition, -1).await;
                (partition, answer)
            })
            .buffer_unordered(PROBES_IN_FLIGHT);
        let mut still = Vec::new();
        let mut last_error = None;
        while let Some((partition, answer)) = answers.next().await {
            match answer {
                Ok(_) => {}
                Err(error) if not_yet(&error) => {
                    still.push(partition);
                    last_error = Some(error);
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("probing {topic}-{partition}"));
                }
            }
        }
        if still.is_empty() {
            return Ok(count);
        }
        if Instant::now() >= deadline {
            let error = last_error.expect("a partition still waits because of an error");
            return Err(error).context(format!(
                "{} of {count} partitions of {topic} still did not answer",
                still.len()
            ));
        }
        waiting = Some(still);
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// Whether an answer means "not yet" to a probe of a starting cluster.
fn not_yet(error: &ClientError) -> bool {
    error.is_retriable()
        || matches!(
            error,
            ClientError::UnknownTopic(_) | ClientError::UnknownPartition { .. }
        )
}

/// One line on a terminal.
pub fn idle_summary(report: &IdleReport) -> String {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let mut text = format!(
        "idle: {} partitions of {} at rest for {:.0} s: brokers' CPU {:.2}% of a core, resident {:.0} MiB",
        report.partitions,
        report.topic,
        report.idle_s,
        report.broker_cpu_percent,
        mib(report.broker_resident_bytes_after),
    );
    if let Some(per) = report.resident_bytes_per_partition {
        text += &format!(" ({:.1} KiB per partition)", per / 1024.0);
    }
    if let Some(fds) = report.broker_open_fds {
        text += &format!(", {fds} open files");
    }
    if let Some(create) = report.create_s {
        text += &format!("; created in {create:.2} s");
    }
    text
}

/// One line on a terminal.
pub fn ready_summary(report: &ReadyReport) -> String {
    format!(
        "ready: serving after {:.2} s, all {} partitions of {} answering after {:.2} s ({} probes)",
        report.serving_s, report.partitions, report.topic, report.recovered_s, report.probes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_figures_are_read_from_a_metrics_page() {
        let page = "# HELP process_cpu_seconds_total CPU\n\
            process_cpu_seconds_total{node=\"1\"} 12.5\n\
            process_cpu_seconds_total_other{node=\"1\"} 99\n\
            process_resident_memory_bytes{node=\"1\"} 1048576\n\
            process_open_fds{node=\"1\"} 42\n";
        let figures = ProcessFigures::parse(page).unwrap();
        assert_eq!(figures.cpu_seconds, 12.5);
        assert_eq!(figures.resident_bytes, Some(1 << 20));
        assert_eq!(figures.open_fds, Some(42));
        let summed = figures.add(figures);
        assert_eq!(summed.resident_bytes, Some(2 << 20));
        let older = ProcessFigures::parse("process_cpu_seconds_total 3\n").unwrap();
        assert_eq!(older.resident_bytes, None);
        assert_eq!(figures.add(older).resident_bytes, None);
        assert!(ProcessFigures::parse("strata_uptime_seconds 1\n").is_none());
    }
}
