//! Measuring while a run goes: per-second interval histograms, counts shared by the tasks,
//! acknowledgement durability, the bench's and the brokers' CPU, memory stalls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hdrhistogram::Histogram;
use strata_client::{AckDurability, RecordMetadata};

use crate::{config::Protocol, kafka, report::DurabilityTally, scale};

/// What one producer measured: per record, per batch (pinned presets), per commit
/// (transactional producers), and the bytes acknowledged.
pub(crate) struct ProducerMeasures {
    pub(crate) records: Histogram<u64>,
    pub(crate) batches: Histogram<u64>,
    pub(crate) commits: Histogram<u64>,
    pub(crate) bytes: u64,
    pub(crate) durability: DurabilityTally,
}

impl ProducerMeasures {
    pub(crate) fn new() -> ProducerMeasures {
        ProducerMeasures {
            records: histogram(),
            batches: histogram(),
            commits: histogram(),
            bytes: 0,
            durability: DurabilityTally::default(),
        }
    }

    pub(crate) fn add(&mut self, other: &ProducerMeasures) -> anyhow::Result<()> {
        self.records.add(&other.records)?;
        self.batches.add(&other.batches)?;
        self.commits.add(&other.commits)?;
        self.bytes += other.bytes;
        self.durability.add(&other.durability);
        Ok(())
    }
}

/// What an acknowledgement says of durability, where it says anything.
pub(crate) trait AckReport {
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
pub(crate) type IntervalRecorder = Arc<std::sync::Mutex<Histogram<u64>>>;

#[derive(Clone, Default)]
pub(crate) struct IntervalRecorders {
    pub(crate) recorders: Arc<std::sync::Mutex<Vec<IntervalRecorder>>>,
}

/// Where a producer counts what was acknowledged: the run's total and this second's latency;
/// and, once it is done, what it sent.
pub(crate) struct Tally {
    pub(crate) produced: Arc<AtomicU64>,
    pub(crate) interval: IntervalRecorder,
    pub(crate) sent: Arc<SentBytes>,
}

/// What all producers sent, warmup included: record bytes, and the batches that carried them
/// as they went on the wire (after compression).
#[derive(Default)]
pub(crate) struct SentBytes {
    pub(crate) records: AtomicU64,
    pub(crate) batches: AtomicU64,
}

impl SentBytes {
    pub(crate) fn add(&self, records: u64, batch_bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.batches.fetch_add(batch_bytes, Ordering::Relaxed);
    }
}

impl IntervalRecorders {
    /// A recorder for one more task.
    pub(crate) fn recorder(&self) -> IntervalRecorder {
        let recorder = Arc::new(std::sync::Mutex::new(histogram()));
        self.recorders
            .lock()
            .expect("recorders")
            .push(recorder.clone());
        recorder
    }

    /// Everything recorded since the last call, merged; the recorders start afresh.
    pub(crate) fn take(&self) -> Histogram<u64> {
        let mut merged = histogram();
        for recorder in self.recorders.lock().expect("recorders").iter() {
            let mut recorder = recorder.lock().expect("recorder");
            let _ = merged.add(&*recorder);
            recorder.reset();
        }
        merged
    }
}

pub(crate) fn p99(histogram: &Histogram<u64>) -> Option<u64> {
    (!histogram.is_empty()).then(|| histogram.value_at_quantile(0.99))
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// See [`strata_tuning::memory_stalls_us`].
pub(crate) fn memory_stalls_us() -> Option<u64> {
    strata_tuning::memory_stalls_us(&strata_tuning::Host::live())
}

/// Memory stalls (ms) since a reading taken at the run's start.
pub(crate) fn stalled_since(started_us: Option<u64>) -> Option<f64> {
    let (started, now) = (started_us?, memory_stalls_us()?);
    Some(now.saturating_sub(started) as f64 / 1000.0)
}

/// The brokers' CPU over the measured run: read from their `/metrics` as it starts (a task
/// that waits for the warmup to end) and as it ends.
pub(crate) struct BrokerCpu {
    pub(crate) admins: Vec<String>,
    pub(crate) started: Option<tokio::task::JoinHandle<Option<f64>>>,
}

impl BrokerCpu {
    pub(crate) fn start(admins: &[String], at: Instant) -> BrokerCpu {
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
    pub(crate) async fn finish(self) -> Option<f64> {
        let started = self.started?.await.ok()??;
        let ended = brokers_cpu_seconds(&self.admins).await?;
        Some((ended - started).max(0.0))
    }
}

/// The `process_cpu_seconds_total` of the brokers at `admins`, summed; `None` when one cannot
/// be read.
pub(crate) async fn brokers_cpu_seconds(admins: &[String]) -> Option<f64> {
    let mut total = 0.0;
    for admin in admins {
        total += broker_cpu_seconds(admin).await?;
    }
    Some(total)
}

pub(crate) async fn broker_cpu_seconds(admin: &str) -> Option<f64> {
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
pub(crate) fn cpu_seconds() -> f64 {
    strata_tuning::process_cpu_seconds()
}

/// The client a run's report names.
pub(crate) fn client_name(protocol: Protocol) -> String {
    match protocol {
        Protocol::Native => format!("strata-client {} (native)", env!("CARGO_PKG_VERSION")),
        Protocol::Kafka => kafka::client_name(),
    }
}
