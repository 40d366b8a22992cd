//! `strata bench produce|consume|e2e`.

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
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Keys {
    None,
    Uniform,
    Zipf,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    workload: WorkloadArg,
    #[arg(long, default_value = "strata-bench")]
    topic: String,
    /// Partitions of the topic when the bench creates it.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    #[arg(long, default_value_t = 2)]
    producers: usize,
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Producer batch size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    batch_size: usize,
    #[arg(long, default_value_t = 2)]
    linger_ms: u64,
    /// 0, 1 or all.
    #[arg(long, default_value = "1")]
    acks: String,
    /// Records per second over all producers (open loop); default: as fast as acks allow.
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds to run (after the warmup).
    #[arg(long)]
    duration: Option<f64>,
    /// Records to send (produce, e2e) or to read (consume).
    #[arg(long)]
    records: Option<u64>,
    /// Seconds not measured at the start.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    #[arg(long, value_enum, default_value_t = Keys::None)]
    key_distribution: Keys,
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Write the report as JSON (field names are stable; see docs/benchmarks.md).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the latency histograms as an HdrHistogram interval log.
    #[arg(long)]
    hdr_log: Option<PathBuf>,
}

pub async fn bench(connection: Connection, args: BenchArgs) -> anyhow::Result<()> {
    let config = BenchConfig {
        workload: match args.workload {
            WorkloadArg::Produce => Workload::Produce,
            WorkloadArg::Consume => Workload::Consume,
            WorkloadArg::E2e => Workload::E2e,
        },
        bootstrap: connection.bootstrap.clone(),
        topic: args.topic,
        partitions: args.partitions,
        producers: args.producers,
        consumers: args.consumers,
        record_size: args.record_size,
        batch_bytes: args.batch_size,
        linger: Duration::from_millis(args.linger_ms),
        acks: match args.acks.as_str() {
            "0" => 0,
            "1" => 1,
            "all" | "-1" => -1,
            other => anyhow::bail!("--acks {other}: expected 0, 1 or all"),
        },
        rate: args.rate,
        duration: args
            .duration
            .map(Duration::from_secs_f64)
            .or(if args.records.is_none() {
                Some(Duration::from_secs(10))
            } else {
                None
            }),
        records: args.records,
        warmup: Duration::from_secs_f64(args.warmup),
        key_distribution: match args.key_distribution {
            Keys::None => KeyDistribution::None,
            Keys::Uniform => KeyDistribution::Uniform,
            Keys::Zipf => KeyDistribution::Zipf,
        },
        keys: args.keys,
    };
    let (report, histograms) = strata_bench::run(&config).await?;
    println!("{}", strata_bench::summary(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.hdr_log {
        write_hdr_log(path, &report, &histograms)
            .with_context(|| format!("writing {}", path.display()))?;
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
    let length = Duration::from_secs_f64(report.duration_s);
    for (name, histogram) in [("ack", &histograms.ack), ("e2e", &histograms.e2e)] {
        if histogram.is_empty() {
            continue;
        }
        writer.write_histogram(histogram, Duration::ZERO, length, Tag::new(name))?;
    }
    Ok(())
}
