//! What a run reports: the JSON report (its field names are a contract), latency percentiles,
//! the host's state, the timeline, and the text summary.

use hdrhistogram::Histogram;
use serde::Serialize;
use strata_client::AckDurability;

use crate::{config::Workload, measure::histogram};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub p9999: u64,
    pub max: u64,
    pub count: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            p9999: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
            count: histogram.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: Workload,
    pub topic: String,
    /// The producers' codec (`none`, `lz4`, `zstd`); `bytes` and `mb_per_s` count record
    /// bytes before compression.
    pub compression: &'static str,
    /// The client that produced and consumed, and its protocol: Strata's own client, or
    /// librdkafka (`--protocol kafka`) with its version.
    pub client: String,
    /// Bytes of the batches producers sent (warmup included), as they went on the wire and to
    /// disk: after compression, with batch headers and record entries. 0 without producers.
    pub sent_batch_bytes: u64,
    /// Record bytes sent per batch byte sent (warmup included): what the codec saved, net of
    /// the batch format's own bytes. Absent without producers.
    pub compression_ratio: Option<f64>,
    /// Records measured (acknowledged for produce, received for consume and e2e).
    pub records: u64,
    pub bytes: u64,
    pub duration_s: f64,
    pub records_per_s: f64,
    /// MB = 10^6 bytes.
    pub mb_per_s: f64,
    pub target_rate: Option<f64>,
    /// CPU the bench process itself used over the run, in % of one core (user + system), so a
    /// reader can tell whether the tool or the broker was the limit.
    pub bench_cpu_percent: f64,
    /// CPU seconds the brokers (`--broker-admin`) used over the measured run, and per GB of
    /// record bytes measured: what a broker costs, steadier than throughput on a noisy host.
    /// Absent without `--broker-admin`, or when a broker could not be read.
    pub broker_cpu_seconds: Option<f64>,
    pub broker_cpu_s_per_gb: Option<f64>,
    /// Time during the run in which some task on the host stalled waiting for memory (the
    /// kernel's pressure stall information, `/proc/pressure/memory`), in ms; `None` where the
    /// kernel keeps none. Page-cache reclaim under a broker shows here: a produce run that grew
    /// the page cache into full memory stalled 215 ms where the same run with free memory
    /// stalled none (docs/performance.md).
    pub memory_stall_ms: Option<f64>,
    /// Consume and e2e runs: from the run's start until every consumer had its first record
    /// (a group's members joined, were assigned partitions and fetched). Absent when one never
    /// got a record (more group members than partitions), and without consumers.
    pub consumers_ready_s: Option<f64>,
    pub ack_latency_us: Option<Percentiles>,
    /// The measured records by how durable their acknowledgements said they were (empty with
    /// `acks=0` and without producers).
    pub ack_durability: Vec<DurabilityShare>,
    /// Per batch (pinned presets): from the batch's first record's send time to its last ack,
    /// as iggy-bench reports it.
    pub batch_latency_us: Option<Percentiles>,
    /// Transactional producers: each commit, from the `EndTxn` request (the transaction's
    /// records all acknowledged) to its answer. `count` is the transactions committed.
    pub commit_latency_us: Option<Percentiles>,
    pub e2e_latency_us: Option<Percentiles>,
    /// Records measured in each second of the run (produced and consumed).
    pub timeline: Vec<TimelinePoint>,
    /// The machine as the run started: on a VM whose free memory is slow to touch, the page
    /// cache and free memory move a run's figures more than most code changes do.
    pub host: HostState,
}

/// What `/proc/meminfo` and the CPU count said when a run started.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct HostState {
    pub cpus: usize,
    pub mem_total_mb: u64,
    pub mem_free_mb: u64,
    /// Page cache (`Cached`), in MB.
    pub page_cache_mb: u64,
    pub dirty_mb: u64,
    /// How long an idle vCPU of a KVM guest polls before it halts (the `haltpoll` cpuidle
    /// driver's `guest_halt_poll_ns`); `None` under another driver (bare metal) or unreadable.
    /// 0 puts every wake-up through the hypervisor, which moved small-message figures threefold
    /// on a 2-vCPU guest (docs/performance.md).
    pub guest_halt_poll_ns: Option<u64>,
}

impl HostState {
    /// The machine now; fields it cannot read stay 0 (or `None`).
    pub fn now() -> HostState {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostState {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
            guest_halt_poll_ns: match strata_tuning::guest_halt_poll_ns(&strata_tuning::Host::live())
            {
                Ok(strata_tuning::HaltPolling::Polls(ns)) => Some(ns),
                _ => None,
            },
            ..HostState::from_meminfo(&meminfo)
        }
    }

    fn from_meminfo(meminfo: &str) -> HostState {
        let mb = |key: &str| {
            meminfo
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kb| kb / 1024)
        };
        HostState {
            cpus: 0,
            mem_total_mb: mb("MemTotal"),
            mem_free_mb: mb("MemFree"),
            page_cache_mb: mb("Cached"),
            dirty_mb: mb("Dirty"),
            guest_halt_poll_ns: None,
        }
    }
}

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cpus, {:.1} GB free, {:.1} GB page cache, {} MB dirty",
            self.cpus,
            self.mem_free_mb as f64 / 1024.0,
            self.page_cache_mb as f64 / 1024.0,
            self.dirty_mb
        )?;
        if let Some(poll_ns) = self.guest_halt_poll_ns {
            write!(f, ", guest halt polling {poll_ns} ns")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelinePoint {
    pub second: u64,
    pub produced_records: u64,
    pub consumed_records: u64,
    /// Ack latency p99 of the records acknowledged in this second (µs); absent without acks.
    pub ack_p99_us: Option<u64>,
    /// End-to-end latency p99 of the records consumed in this second (µs).
    pub e2e_p99_us: Option<u64>,
}

/// One second's latencies (for the HDR interval log).
pub struct IntervalHistograms {
    /// Seconds since the start of the run at the end of this interval.
    pub second: u64,
    pub ack: Histogram<u64>,
    pub e2e: Histogram<u64>,
}

/// The measured histograms, for HDR interval logs and merging.
pub struct Histograms {
    pub ack: Histogram<u64>,
    pub batch: Histogram<u64>,
    pub commit: Histogram<u64>,
    pub e2e: Histogram<u64>,
    /// Per second of the run, as the progress ticker cut them.
    pub intervals: Vec<IntervalHistograms>,
}

impl Histograms {
    pub(crate) fn empty() -> Histograms {
        Histograms {
            ack: histogram(),
            batch: histogram(),
            commit: histogram(),
            e2e: histogram(),
            intervals: Vec::new(),
        }
    }
}

/// Measured records by the durability their acknowledgement reported: (in-sync replicas
/// holding them, of those synced) → records. A handful of entries: a linear scan beats a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DurabilityTally(Vec<((u16, u16), u64)>);

impl DurabilityTally {
    pub(crate) fn count(&mut self, durability: Option<AckDurability>, records: u64) {
        let Some(durability) = durability else {
            return;
        };
        let level = (durability.replicas, durability.synced_replicas);
        match self.0.iter_mut().find(|(at, _)| *at == level) {
            Some((_, count)) => *count += records,
            None => self.0.push((level, records)),
        }
    }

    pub(crate) fn add(&mut self, other: &DurabilityTally) {
        for &((replicas, synced_replicas), records) in &other.0 {
            let durability = AckDurability {
                replicas,
                synced_replicas,
                ..AckDurability::default()
            };
            self.count(Some(durability), records);
        }
    }

    /// The report's view: each level's records and share, most replicas and syncs first.
    pub(crate) fn shares(&self) -> Vec<DurabilityShare> {
        let total: u64 = self.0.iter().map(|(_, records)| records).sum();
        let mut shares: Vec<DurabilityShare> = self
            .0
            .iter()
            .map(|&((replicas, synced_replicas), records)| DurabilityShare {
                replicas,
                synced_replicas,
                records,
                share: records as f64 / total.max(1) as f64,
            })
            .collect();
        shares.sort_by_key(|s| std::cmp::Reverse((s.replicas, s.synced_replicas)));
        shares
    }
}

/// How many of the measured records were acknowledged at one durability.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DurabilityShare {
    /// In-sync replicas holding the records when acknowledged, the leader included.
    pub replicas: u16,
    /// Of those, how many had synced them to disk.
    pub synced_replicas: u16,
    pub records: u64,
    /// Of the records measured, 0 to 1.
    pub share: f64,
}

/// A text progress bar `width` cells wide with the percentage after it, e.g.
/// `[#####---------------]  25%`. `fraction` is clamped to 0..=1.
pub fn progress_bar(fraction: f64, width: usize) -> String {
    let fraction = fraction.clamp(0.0, 1.0);
    let filled = ((fraction * width as f64) as usize).min(width);
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(filled),
        "-".repeat(width - filled),
        fraction * 100.0
    )
}

/// The human summary.
pub fn summary(report: &Report) -> String {
    let mut text = format!(
        "{:?} on {}: {} records, {:.0} records/s, {:.1} MB/s over {:.2} s (bench CPU {:.0}% of a core)",
        report.workload,
        report.topic,
        report.records,
        report.records_per_s,
        report.mb_per_s,
        report.duration_s,
        report.bench_cpu_percent
    );
    for (name, percentiles) in [
        ("ack latency", &report.ack_latency_us),
        ("batch latency", &report.batch_latency_us),
        ("commit latency", &report.commit_latency_us),
        ("end-to-end latency", &report.e2e_latency_us),
    ] {
        if let Some(p) = percentiles {
            text.push_str(&format!(
                "\n  {name} (µs): p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {}",
                p.p50, p.p90, p.p99, p.p999, p.p9999, p.max
            ));
        }
    }
    if !report.ack_durability.is_empty() {
        let levels: Vec<String> = report
            .ack_durability
            .iter()
            .map(|level| {
                format!(
                    "{:.1}% on {} replica(s), {} synced",
                    level.share * 100.0,
                    level.replicas,
                    level.synced_replicas
                )
            })
            .collect();
        text.push_str(&format!("\n  acknowledged: {}", levels.join("; ")));
    }
    if let (Some(cpu), Some(per_gb)) = (report.broker_cpu_seconds, report.broker_cpu_s_per_gb) {
        text.push_str(&format!(
            "\n  brokers' CPU: {cpu:.2} s = {per_gb:.3} CPU s per GB"
        ));
    }
    if let Some(ready) = report.consumers_ready_s {
        text.push_str(&format!(
            "\n  every consumer had its first record {ready:.2} s after the start"
        ));
    }
    text.push_str(&format!("\n  host at the start: {}", report.host));
    if let Some(stalled) = report.memory_stall_ms {
        text.push_str(&format!("; memory stalls during the run: {stalled:.0} ms"));
    }
    if report.compression != "none"
        && let Some(ratio) = report.compression_ratio
    {
        text.push_str(&format!(
            "\n  {}: {:.1} MB of batches sent, {ratio:.2}x smaller than their records",
            report.compression,
            report.sent_batch_bytes as f64 / 1e6
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::histogram;

    #[test]
    fn host_state_reads_meminfo() {
        let meminfo = "MemTotal:       24607744 kB\nMemFree:        11534336 kB\nMemAvailable:   23000000 kB\nBuffers:           12828 kB\nCached:         11010048 kB\nSwapCached:            0 kB\nDirty:              2048 kB\n";
        let host = HostState::from_meminfo(meminfo);
        assert_eq!(
            (
                host.mem_total_mb,
                host.mem_free_mb,
                host.page_cache_mb,
                host.dirty_mb
            ),
            (24031, 11264, 10752, 2)
        );
        assert_eq!(HostState::from_meminfo(""), HostState::default());
    }

    #[test]
    fn host_state_shows_guest_halt_polling_only_where_known() {
        let host = HostState {
            cpus: 2,
            mem_free_mb: 1536,
            dirty_mb: 7,
            ..HostState::default()
        };
        assert_eq!(
            host.to_string(),
            "2 cpus, 1.5 GB free, 0.0 GB page cache, 7 MB dirty"
        );
        let polling = HostState {
            guest_halt_poll_ns: Some(0),
            ..host
        };
        assert!(polling.to_string().ends_with(", guest halt polling 0 ns"));
    }

    #[test]
    fn progress_bars_fill_and_clamp() {
        assert_eq!(progress_bar(0.25, 8), "[##------]  25%");
        assert_eq!(progress_bar(1.7, 4), "[####] 100%");
        assert_eq!(progress_bar(-1.0, 4), "[----]   0%");
    }

    #[test]
    fn percentiles_are_monotonic() {
        let mut histogram = histogram();
        for value in 1..10_000u64 {
            histogram.record(value * value % 7919 + 1).unwrap();
        }
        let p = Percentiles::of(&histogram);
        assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999);
        assert!(p.p999 <= p.p9999 && p.p9999 <= p.max);
    }
}
