//! Metrics: each shard records into its own [`ShardMetrics`] (plain cells, no lock shared with
//! anyone); a scrape asks every shard for a snapshot over its mailbox and merges them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write;

use hdrhistogram::Histogram;

/// Upper bounds (µs) of the Prometheus histogram buckets rendered from the HDR histograms.
const BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

#[derive(Debug, Clone, Default)]
pub struct TopicCounters {
    pub records_in: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub records_out: u64,
    pub produce_errors: u64,
    /// Bytes this node appended as a follower.
    pub bytes_replicated: u64,
    /// ISR shrinks and expansions of partitions this node leads.
    pub isr_changes: u64,
    /// Partitions' produce acknowledgements by how far their records had got: (in-sync
    /// replicas holding them, of those synced) → acknowledgements.
    pub acks_by_durability: BTreeMap<(u16, u16), u64>,
}

/// One shard's metrics; only that shard's thread touches it.
pub struct ShardMetrics {
    inner: RefCell<Snapshot>,
    /// Filled by the shard's log writers (one per partition) as their syncs complete.
    fsync_latency_us: std::rc::Rc<RefCell<Histogram<u64>>>,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            inner: RefCell::default(),
            fsync_latency_us: std::rc::Rc::new(RefCell::new(latency_histogram())),
        }
    }
}

/// A topic's counters; the name is copied only the first time the topic is counted, not on
/// every request.
fn topic_counters<'a>(
    topics: &'a mut BTreeMap<String, TopicCounters>,
    topic: &str,
) -> &'a mut TopicCounters {
    if !topics.contains_key(topic) {
        topics.insert(topic.to_string(), TopicCounters::default());
    }
    topics.get_mut(topic).expect("inserted above")
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds")
}

/// What a shard hands to a scrape.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub topics: BTreeMap<String, TopicCounters>,
    /// Time to append (and, with flush=always, sync) a produce's records, µs.
    pub produce_latency_us: Histogram<u64>,
    pub fetch_latency_us: Histogram<u64>,
    /// Follower side: one replication fetch, from request to appended (µs).
    /// Leader side: from a local append to each follower holding it.
    pub replication_latency_us: Histogram<u64>,
    /// Follower side: one replication fetch, request to append (long-polls included).
    pub replica_fetch_latency_us: Histogram<u64>,
    /// One `fdatasync` of a partition log, or one `syncfs` round of the shard's logs (µs).
    pub fsync_latency_us: Histogram<u64>,
    /// End to end as the broker sees it: how old the newest record of a fetch was when served
    /// (µs, from its producer timestamp).
    pub e2e_latency_us: Histogram<u64>,
    /// Leader side: bytes served to followers.
    pub replica_bytes_out: u64,
    /// Leader side: how long catch-up answers were held to the recovery limit (µs).
    pub recovery_throttled_us: u64,
    pub cross_shard_hops: u64,
    pub partitions: u64,
    /// Replicas (led or followed) this shard holds.
    pub replicas: u64,
    /// io_uring operations in flight on this shard at the scrape, and the most since the last.
    pub io_in_flight: u64,
    pub io_in_flight_max: u64,
    /// Partitions this shard leads whose ISR is smaller than their replica set.
    pub under_replicated: u64,
    /// Appends written past the page cache (`direct.writes`) and reads of their data, with bytes.
    pub direct_io: crate::io::DirectIoTotals,
    /// Reads served from tail caches (logs whose leader appends go direct) and from segment files.
    pub reads: crate::log::tail_cache::ReadTotals,
    /// Bytes the shard's tail caches hold now.
    pub tail_cache_bytes: u64,
    /// Bytes sent to consumers straight from segment files (`sendfile`).
    pub sent_from_files: u64,
    /// `syncfs` rounds, and the logs' interval syncs they served.
    pub sync_rounds: u64,
    pub sync_round_jobs: u64,
    /// Requests this shard took on the Kafka listener, and its Kafka connections open now.
    pub kafka_requests: u64,
    pub kafka_connections: u64,
    pub kafka_requests_with_trailing_bytes: u64,
    /// Native clients' connections open now on this shard, and accepted since the start.
    pub native_connections: u64,
    pub native_connections_accepted: u64,
    /// Kafka requests of an API or version not served, by API key.
    pub kafka_unsupported: BTreeMap<i16, u64>,
    /// SASL exchanges on this shard's listeners (both protocols) that authenticated, and that
    /// failed (a wrong password, an unknown user, a malformed message).
    pub authentications: u64,
    pub authentication_failures: u64,
    /// Each follower of each partition this shard leads: records it is behind the leader's
    /// log end, as of its last fetch (followers not heard from yet are left out).
    pub replica_lags: Vec<ReplicaLag>,
    /// Each partition this shard leads with transactions open.
    pub open_transactions: Vec<PartitionTransactions>,
    /// The log cleaner's work on this shard.
    pub cleaner: CleanerTotals,
    /// Each compacted replica on this shard, as of the cleaner's last look at it.
    pub compaction: BTreeMap<(String, u32), PartitionCompaction>,
    /// Answers that told a client to wait for its quota, by quota and the (user, client id)
    /// it is counted under.
    pub quota_throttles: BTreeMap<QuotaThrottleKey, QuotaThrottled>,
    /// Each share-partition this shard leads and has loaded.
    pub share_partitions: Vec<SharePartitionMetrics>,
}

/// A share group's window on one partition, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct SharePartitionMetrics {
    pub group: String,
    pub topic: String,
    pub partition: u32,
    pub summary: crate::share::partition::ShareSummary,
    pub counters: crate::share::partition::ShareCounters,
    /// Records from the share-partition start offset to the high watermark.
    pub lag: u64,
}

/// A quota (its Kafka name) and the names its usage is counted under.
pub type QuotaThrottleKey = (&'static str, String, String);

/// How often and for how long a quota held its clients back.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuotaThrottled {
    pub answers: u64,
    pub seconds: f64,
}

/// What a shard's log cleaner did since the node started.
#[derive(Debug, Clone, Copy, Default)]
pub struct CleanerTotals {
    pub cleans: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_removed: u64,
    pub busy_us: u64,
}

/// A compacted replica's state for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionCompaction {
    pub dirty_ratio: f64,
    pub clean_offset: u64,
    /// Why the cleaner cannot clean it (its last error, or a failed log); `None` when it can.
    pub uncleanable: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLag {
    pub topic: String,
    pub partition: u32,
    pub replica: i32,
    pub records: u64,
}

/// A partition's open transactions: how many, and how long the oldest has been open (its
/// first record's timestamp against the scrape's clock): the last stable offset waits for it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionTransactions {
    pub topic: String,
    pub partition: u32,
    pub open: usize,
    pub oldest_age_seconds: f64,
}

impl Default for Snapshot {
    fn default() -> Self {
        let histogram = latency_histogram;
        Snapshot {
            topics: BTreeMap::new(),
            produce_latency_us: histogram(),
            fetch_latency_us: histogram(),
            replication_latency_us: histogram(),
            replica_fetch_latency_us: histogram(),
            fsync_latency_us: histogram(),
            e2e_latency_us: histogram(),
            replica_bytes_out: 0,
            recovery_throttled_us: 0,
            cross_shard_hops: 0,
            partitions: 0,
            replicas: 0,
            io_in_flight: 0,
            io_in_flight_max: 0,
            under_replicated: 0,
            direct_io: Default::default(),
            reads: Default::default(),
            tail_cache_bytes: 0,
            sent_from_files: 0,
            sync_rounds: 0,
            sync_round_jobs: 0,
            kafka_requests: 0,
            kafka_connections: 0,
            kafka_requests_with_trailing_bytes: 0,
            native_connections: 0,
            native_connections_accepted: 0,
            kafka_unsupported: BTreeMap::new(),
            authentications: 0,
            authentication_failures: 0,
            replica_lags: Vec::new(),
            open_transactions: Vec::new(),
            cleaner: CleanerTotals::default(),
            compaction: BTreeMap::new(),
            quota_throttles: BTreeMap::new(),
            share_partitions: Vec::new(),
        }
    }
}

impl ShardMetrics {
    pub fn produced(&self, topic: &str, records: u64, bytes: u64, latency_us: u64) {
        let mut inner = self.inner.borrow_mut();
        let counters = topic_counters(&mut inner.topics, topic);
        counters.records_in += records;
        counters.bytes_in += bytes;
        let _ = inner.produce_latency_us.record(latency_us.max(1));
    }

    /// A partition's records were acknowledged, as durable as `durability` says.
    pub fn acknowledged(&self, topic: &str, durability: &strata_wire::protocol::AckDurability) {
        let mut inner = self.inner.borrow_mut();
        let counters = topic_counters(&mut inner.topics, topic);
        let level = (durability.replicas, durability.synced_replicas);
        *counters.acks_by_durability.entry(level).or_default() += 1;
    }

    pub fn produce_failed(&self, topic: &str) {
        let mut inner = self.inner.borrow_mut();
        topic_counters(&mut inner.topics, topic).produce_errors += 1;
    }

    /// A fetch served records whose newest was produced `age_us` ago.
    pub fn served_age(&self, age_us: u64) {
        let _ = self.inner.borrow_mut().e2e_latency_us.record(age_us.max(1));
    }

    /// The histogram the shard's log writers record their syncs in.
    pub fn fsync_histogram(&self) -> std::rc::Rc<RefCell<Histogram<u64>>> {
        self.fsync_latency_us.clone()
    }

    pub fn fetched(&self, topic: &str, records: u64, bytes: u64, latency_us: u64) {
        let mut inner = self.inner.borrow_mut();
        let counters = topic_counters(&mut inner.topics, topic);
        counters.bytes_out += bytes;
        counters.records_out += records;
        let _ = inner.fetch_latency_us.record(latency_us.max(1));
    }

    /// A follower appended `bytes` of `topic` it fetched `latency_us` after asking.
    pub fn replicated(&self, topic: &str, bytes: u64, latency_us: u64) {
        let mut inner = self.inner.borrow_mut();
        topic_counters(&mut inner.topics, topic).bytes_replicated += bytes;
        let _ = inner.replica_fetch_latency_us.record(latency_us.max(1));
    }

    /// A follower reported holding records `latency_us` after this leader appended them.
    pub fn replication_reached(&self, latency_us: u64) {
        let _ = self
            .inner
            .borrow_mut()
            .replication_latency_us
            .record(latency_us.max(1));
    }

    pub fn replica_fetch_served(&self, bytes: u64) {
        self.inner.borrow_mut().replica_bytes_out += bytes;
    }

    pub fn recovery_throttled(&self, held: std::time::Duration) {
        self.inner.borrow_mut().recovery_throttled_us += held.as_micros() as u64;
    }

    /// Bytes sent to a consumer straight from a segment file (`sendfile`).
    pub fn sent_from_files(&self, bytes: u64) {
        self.inner.borrow_mut().sent_from_files += bytes;
    }

    /// A request taken on the Kafka listener.
    pub fn kafka_request(&self) {
        self.inner.borrow_mut().kafka_requests += 1;
    }

    /// A Kafka request had bytes after its last field (ignored, as Kafka's brokers do).
    pub fn kafka_request_with_trailing_bytes(&self) {
        self.inner.borrow_mut().kafka_requests_with_trailing_bytes += 1;
    }

    /// A Kafka request of an API or version not served.
    pub fn kafka_unsupported_request(&self, api_key: i16) {
        *self
            .inner
            .borrow_mut()
            .kafka_unsupported
            .entry(api_key)
            .or_default() += 1;
    }

    /// An answer told a client counted as (`user`, `client_id`) to wait `throttle` for
    /// `quota`.
    pub fn quota_throttled(
        &self,
        quota: &'static str,
        user: &str,
        client_id: &str,
        throttle: std::time::Duration,
    ) {
        let mut inner = self.inner.borrow_mut();
        let key = (quota, user.to_string(), client_id.to_string());
        let throttled = inner.quota_throttles.entry(key).or_default();
        throttled.answers += 1;
        throttled.seconds += throttle.as_secs_f64();
    }

    /// A SASL exchange ended: authenticated, or refused.
    pub fn authentication(&self, authenticated: bool) {
        let mut inner = self.inner.borrow_mut();
        if authenticated {
            inner.authentications += 1;
        } else {
            inner.authentication_failures += 1;
        }
    }

    /// A Kafka connection opened (`+1`) or closed (`-1`).
    pub fn kafka_connections(&self, delta: i64) {
        let mut inner = self.inner.borrow_mut();
        inner.kafka_connections = inner.kafka_connections.saturating_add_signed(delta);
    }

    /// A native connection opened (`+1`) or closed (`-1`).
    pub fn native_connections(&self, delta: i64) {
        let mut inner = self.inner.borrow_mut();
        inner.native_connections = inner.native_connections.saturating_add_signed(delta);
        if delta > 0 {
            inner.native_connections_accepted += delta as u64;
        }
    }

    /// One clean swapped in (or discarded), and how long it took.
    pub fn cleaned(&self, stats: &crate::log::cleaner::CleanStats, took: std::time::Duration) {
        let cleaner = &mut self.inner.borrow_mut().cleaner;
        cleaner.cleans += 1;
        cleaner.bytes_read += stats.bytes_read;
        cleaner.bytes_written += stats.bytes_written;
        cleaner.records_removed += stats.records_removed;
        cleaner.busy_us += took.as_micros() as u64;
    }

    /// A compacted replica's state as the cleaner last saw it.
    pub fn compaction(&self, topic: &str, partition: u32, state: PartitionCompaction) {
        self.inner
            .borrow_mut()
            .compaction
            .insert((topic.to_string(), partition), state);
    }

    /// Forgets the compaction state of replicas this shard no longer holds compacted.
    pub fn retain_compaction(&self, keep: impl Fn(&(String, u32)) -> bool) {
        self.inner
            .borrow_mut()
            .compaction
            .retain(|key, _| keep(key));
    }

    pub fn isr_changed(&self, topic: &str) {
        topic_counters(&mut self.inner.borrow_mut().topics, topic).isr_changes += 1;
    }

    pub fn snapshot(
        &self,
        cross_shard_hops: u64,
        partitions: u64,
        replicas: u64,
        under_replicated: u64,
        sync_rounds: Option<&crate::log::shared_sync::SharedSync>,
    ) -> Snapshot {
        let mut snapshot = self.inner.borrow().clone();
        snapshot.fsync_latency_us = self.fsync_latency_us.borrow().clone();
        snapshot.cross_shard_hops = cross_shard_hops;
        snapshot.partitions = partitions;
        snapshot.replicas = replicas;
        (snapshot.io_in_flight, snapshot.io_in_flight_max) = crate::io::uring::take_in_flight();
        snapshot.under_replicated = under_replicated;
        snapshot.direct_io = crate::io::direct_io_totals();
        if let Some(rounds) = sync_rounds {
            (snapshot.sync_rounds, snapshot.sync_round_jobs) = (rounds.rounds(), rounds.jobs());
        }
        snapshot
    }
}

/// A per-shard series: name, type, help, and how a shard's snapshot gives its value.
type ShardSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Snapshot) -> f64,
);

/// Clients' connections, per shard like [`per_shard_series`].
fn connection_series() -> [ShardSeries; 3] {
    [
        (
            "strata_native_connections",
            "gauge",
            "Native clients' connections open now (a shard-aware client holds one per shard it uses, besides its bootstrap one).",
            |s| s.native_connections as f64,
        ),
        (
            "strata_native_connections_accepted_total",
            "counter",
            "Native clients' connections accepted since the node started.",
            |s| s.native_connections_accepted as f64,
        ),
        (
            "strata_kafka_connections",
            "gauge",
            "Kafka clients' connections open now.",
            |s| s.kafka_connections as f64,
        ),
    ]
}

/// The log cleaner's series, per shard like [`per_shard_series`].
fn cleaner_series() -> [ShardSeries; 5] {
    [
        (
            "strata_log_cleaner_cleans_total",
            "counter",
            "Cleans of compacted partitions the shard's log cleaner finished.",
            |s| s.cleaner.cleans as f64,
        ),
        (
            "strata_log_cleaner_read_bytes_total",
            "counter",
            "Bytes of segments the log cleaner read (key maps and rewrites).",
            |s| s.cleaner.bytes_read as f64,
        ),
        (
            "strata_log_cleaner_written_bytes_total",
            "counter",
            "Bytes of cleaned segments the log cleaner wrote.",
            |s| s.cleaner.bytes_written as f64,
        ),
        (
            "strata_log_cleaner_removed_records_total",
            "counter",
            "Records the log cleaner removed (superseded, expired tombstones, keyless).",
            |s| s.cleaner.records_removed as f64,
        ),
        (
            "strata_log_cleaner_busy_seconds_total",
            "counter",
            "Time the shard's log cleaner spent cleaning.",
            |s| s.cleaner.busy_us as f64 / 1e6,
        ),
    ]
}

/// The series every shard reports, summed or per shard by `render`.
fn per_shard_series() -> [ShardSeries; 22] {
    [
        (
            "strata_cross_shard_hops_total",
            "counter",
            "Requests forwarded to the owning shard.",
            |s| s.cross_shard_hops as f64,
        ),
        (
            "strata_kafka_requests_total",
            "counter",
            "Requests taken on the Kafka listener (--kafka-listen).",
            |s| s.kafka_requests as f64,
        ),
        (
            "strata_kafka_requests_with_trailing_bytes_total",
            "counter",
            "Kafka requests with bytes after their last field, ignored as Kafka's brokers do.",
            |s| s.kafka_requests_with_trailing_bytes as f64,
        ),
        (
            "strata_authentications_total",
            "counter",
            "SASL exchanges that authenticated (re-authentications included).",
            |s| s.authentications as f64,
        ),
        (
            "strata_authentication_failures_total",
            "counter",
            "SASL exchanges refused: wrong password, unknown user, malformed message.",
            |s| s.authentication_failures as f64,
        ),
        (
            "strata_partitions",
            "gauge",
            "Partitions this shard leads.",
            |s| s.partitions as f64,
        ),
        (
            "strata_replica_partitions",
            "gauge",
            "Replicas (led or followed) this shard holds.",
            |s| s.replicas as f64,
        ),
        (
            "strata_io_uring_in_flight",
            "gauge",
            "io_uring operations (writes, reads, syncs) submitted by this shard and not yet complete.",
            |s| s.io_in_flight as f64,
        ),
        (
            "strata_io_uring_in_flight_max",
            "gauge",
            "The most io_uring operations in flight on this shard at once over the last 10-20 s.",
            |s| s.io_in_flight_max as f64,
        ),
        (
            "strata_under_replicated_partitions",
            "gauge",
            "Led partitions whose ISR is smaller than their replica set.",
            |s| s.under_replicated as f64,
        ),
        (
            "strata_replica_bytes_out_total",
            "counter",
            "Bytes served to followers.",
            |s| s.replica_bytes_out as f64,
        ),
        (
            "strata_replica_recovery_throttled_seconds_total",
            "counter",
            "Time answers to replicas outside the ISR were held to the recovery limit (--replica-recovery-bytes-per-sec, replica.recovery.bytes.per.sec).",
            |s| s.recovery_throttled_us as f64 / 1e6,
        ),
        (
            "strata_direct_writes_total",
            "counter",
            "Appends written past the page cache (O_DIRECT, see the topic setting direct.writes).",
            |s| s.direct_io.writes as f64,
        ),
        (
            "strata_direct_write_bytes_total",
            "counter",
            "Bytes of those writes, block padding included.",
            |s| s.direct_io.write_bytes as f64,
        ),
        (
            "strata_direct_reads_total",
            "counter",
            "Reads of segment data not in the page cache, done past it (O_DIRECT) from files written direct: the disk straight into the answer.",
            |s| s.direct_io.reads as f64,
        ),
        (
            "strata_direct_read_bytes_total",
            "counter",
            "Bytes of those reads, whole blocks.",
            |s| s.direct_io.read_bytes as f64,
        ),
        (
            "strata_tail_cache_reads_total",
            "counter",
            "Reads (consumer and follower fetches) served from the newest appends kept in memory (logs whose appends go direct).",
            |s| s.reads.from_cache as f64,
        ),
        (
            "strata_tail_cache_bytes",
            "gauge",
            "Bytes of the newest direct-written appends the shard keeps in memory for readers at the tail (within its share of --tail-cache-bytes).",
            |s| s.tail_cache_bytes as f64,
        ),
        (
            "strata_sync_rounds_total",
            "counter",
            "syncfs calls that made the shard's flush=interval logs durable together.",
            |s| s.sync_rounds as f64,
        ),
        (
            "strata_sync_round_logs_total",
            "counter",
            "Interval syncs of logs those rounds served (each would have been fdatasyncs of its own).",
            |s| s.sync_round_jobs as f64,
        ),
        (
            "strata_log_file_reads_total",
            "counter",
            "Reads served from segment files (the page cache, or the disk).",
            |s| s.reads.from_files as f64,
        ),
        (
            "strata_fetch_sendfile_bytes_total",
            "counter",
            "Bytes sent to consumers straight from the page cache (sendfile), never copied by the broker.",
            |s| s.sent_from_files as f64,
        ),
    ]
}

/// `strata_produce_acks_total`: each topic's acknowledgements by durability.
fn render_acks_by_durability(
    out: &mut String,
    node_id: i32,
    topics: &BTreeMap<&str, TopicCounters>,
) {
    let name = "strata_produce_acks_total";
    let _ = writeln!(
        out,
        "# HELP {name} Partitions' produce acknowledgements (both protocols), by how far their records had got when answered: on how many in-sync replicas, the leader included, and synced to disk on how many.\n# TYPE {name} counter"
    );
    for (topic, counters) in topics {
        for ((replicas, synced), acks) in &counters.acks_by_durability {
            let _ = writeln!(
                out,
                "{name}{{node=\"{node_id}\",topic=\"{topic}\",replicas=\"{replicas}\",synced_replicas=\"{synced}\"}} {acks}"
            );
        }
    }
}

/// Prometheus text exposition of every shard's snapshot (per-shard series carry `shard`).
/// Each compacted replica's dirty ratio and clean offset, and the ones the cleaner cannot clean
/// (with why, as a label).
fn render_compaction(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    let replicas: Vec<(&(String, u32), &PartitionCompaction)> = snapshots
        .iter()
        .flat_map(|snapshot| &snapshot.compaction)
        .collect();
    let _ = writeln!(
        out,
        "# HELP strata_log_cleaner_dirty_ratio Share of a compacted replica's cleanable log not yet cleaned (a clean starts at the topic's min.cleanable.dirty.ratio).\n# TYPE strata_log_cleaner_dirty_ratio gauge"
    );
    for ((topic, partition), state) in &replicas {
        let _ = writeln!(
            out,
            "strata_log_cleaner_dirty_ratio{{node=\"{node_id}\",topic=\"{topic}\",partition=\"{partition}\"}} {}",
            state.dirty_ratio
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_log_cleaner_clean_offset The first offset of a compacted replica the cleaner has not cleaned.\n# TYPE strata_log_cleaner_clean_offset gauge"
    );
    for ((topic, partition), state) in &replicas {
        let _ = writeln!(
            out,
            "strata_log_cleaner_clean_offset{{node=\"{node_id}\",topic=\"{topic}\",partition=\"{partition}\"}} {}",
            state.clean_offset
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_log_cleaner_uncleanable Compacted replicas the cleaner cannot clean, with why (its last error).\n# TYPE strata_log_cleaner_uncleanable gauge"
    );
    for ((topic, partition), state) in &replicas {
        if let Some(reason) = &state.uncleanable {
            let reason = reason.replace(['"', '\\', '\n'], " ");
            let _ = writeln!(
                out,
                "strata_log_cleaner_uncleanable{{node=\"{node_id}\",topic=\"{topic}\",partition=\"{partition}\",reason=\"{reason}\"}} 1"
            );
        }
    }
}

/// The series labelled by more than topic: compacted replicas, unserved Kafka APIs.
fn render_labelled(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    render_compaction(out, node_id, snapshots);
    render_share_partitions(out, node_id, snapshots);
    render_kafka_unsupported(out, node_id, snapshots);
    render_quota_throttles(out, node_id, snapshots);
}

/// Share groups' windows, by group and partition (on the partition's leader).
fn render_share_partitions(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    type Value = fn(&SharePartitionMetrics) -> u64;
    let series: [(&str, &str, &str, Value); 8] = [
        (
            "strata_share_in_flight",
            "gauge",
            "Records of a share-partition's window still to deliver (available or acquired).",
            |m| m.summary.in_flight,
        ),
        (
            "strata_share_acquired",
            "gauge",
            "Records a share group's members hold under a lock now.",
            |m| m.summary.acquired,
        ),
        (
            "strata_share_lag",
            "gauge",
            "Records from a share-partition's start offset to the partition's high watermark.",
            |m| m.lag,
        ),
        (
            "strata_share_start_offset",
            "gauge",
            "A share-partition's start offset: every record below it is acknowledged or archived.",
            |m| m.summary.start_offset,
        ),
        (
            "strata_share_acquisitions_total",
            "counter",
            "Records acquired (each delivery counted) since the leader loaded the share-partition.",
            |m| m.counters.acquired,
        ),
        (
            "strata_share_redeliveries_total",
            "counter",
            "Deliveries past a record's first since the leader loaded the share-partition.",
            |m| m.counters.redeliveries,
        ),
        (
            "strata_share_lock_expiries_total",
            "counter",
            "Acquisition locks that ran out since the leader loaded the share-partition.",
            |m| m.counters.lock_expiries,
        ),
        (
            "strata_share_dead_letters_total",
            "counter",
            "Records rejected or out of deliveries, copied to the group's dead-letter topic, since the leader loaded the share-partition.",
            |m| m.counters.dead_letters,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for metrics in snapshots.iter().flat_map(|s| &s.share_partitions) {
            let _ = writeln!(
                out,
                "{name}{{node=\"{node_id}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                metrics.group.replace(['"', '\\', '\n'], "_"),
                metrics.topic,
                metrics.partition,
                value(metrics)
            );
        }
    }
}

/// How long each quota held its clients back, by the (user, client id) counted.
fn render_quota_throttles(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    let mut merged: BTreeMap<&QuotaThrottleKey, QuotaThrottled> = BTreeMap::new();
    for (key, throttled) in snapshots.iter().flat_map(|s| &s.quota_throttles) {
        let total = merged.entry(key).or_default();
        total.answers += throttled.answers;
        total.seconds += throttled.seconds;
    }
    let _ = writeln!(
        out,
        "# HELP strata_quota_throttle_seconds_total Time clients were told to wait (throttle_time_ms) for a quota, by quota and the user and client id its usage is counted under (empty where the quota's entity has no such part).\n# TYPE strata_quota_throttle_seconds_total counter"
    );
    let label = |value: &str| value.replace(['"', '\\', '\n'], " ");
    for ((quota, user, client_id), throttled) in &merged {
        let _ = writeln!(
            out,
            "strata_quota_throttle_seconds_total{{node=\"{node_id}\",quota=\"{quota}\",user=\"{}\",client_id=\"{}\"}} {}",
            label(user),
            label(client_id),
            throttled.seconds
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_quota_throttled_answers_total Answers that told a client to wait for a quota.\n# TYPE strata_quota_throttled_answers_total counter"
    );
    for ((quota, user, client_id), throttled) in &merged {
        let _ = writeln!(
            out,
            "strata_quota_throttled_answers_total{{node=\"{node_id}\",quota=\"{quota}\",user=\"{}\",client_id=\"{}\"}} {}",
            label(user),
            label(client_id),
            throttled.answers
        );
    }
}

/// Kafka requests of APIs or versions the listener does not serve, by API key: what operators'
/// tools ask for that Strata does not do.
fn render_kafka_unsupported(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    let mut refused: BTreeMap<i16, u64> = BTreeMap::new();
    for (api_key, count) in snapshots.iter().flat_map(|s| &s.kafka_unsupported) {
        *refused.entry(*api_key).or_default() += count;
    }
    let _ = writeln!(
        out,
        "# HELP strata_kafka_unsupported_requests_total Kafka requests of an API or version the listener does not serve (answered UNSUPPORTED_VERSION where the API's answer has a place for it), by API key.\n# TYPE strata_kafka_unsupported_requests_total counter"
    );
    for (api_key, count) in refused {
        let api = strata_kafka::kafka_protocol::messages::ApiKey::try_from(api_key)
            .map_or_else(|_| "unknown".to_string(), |api| format!("{api:?}"));
        let _ = writeln!(
            out,
            "strata_kafka_unsupported_requests_total{{node=\"{node_id}\",api_key=\"{api_key}\",api=\"{api}\"}} {count}"
        );
    }
}

/// The broker process's own series: CPU, memory, descriptors, and the host's memory stalls.
fn render_process(out: &mut String, node_id: i32) {
    let _ = writeln!(
        out,
        "# HELP process_cpu_seconds_total CPU (user and system) the broker process has used: per GB moved, what a broker costs.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total{{node=\"{node_id}\"}} {}",
        strata_tuning::process_cpu_seconds()
    );
    if let Some(bytes) = strata_tuning::process_resident_bytes() {
        let _ = writeln!(
            out,
            "# HELP process_resident_memory_bytes Memory of the broker process resident in RAM (the page cache it fills is not counted).\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes{{node=\"{node_id}\"}} {bytes}"
        );
    }
    if let Some(fds) = strata_tuning::process_open_fds() {
        let _ = writeln!(
            out,
            "# HELP process_open_fds File descriptors the broker process holds: segment files, sockets, its io_uring.\n# TYPE process_open_fds gauge\nprocess_open_fds{{node=\"{node_id}\"}} {fds}"
        );
    }
    // Read on the admin thread at scrape time, never on a shard.
    if let Some(stalled_us) = strata_tuning::memory_stalls_us(&strata_tuning::Host::live()) {
        let _ = writeln!(
            out,
            "# HELP strata_host_memory_stall_seconds_total Time some task on this host stalled waiting for memory (the kernel's pressure stall information, /proc/pressure/memory): page-cache reclaim under the broker shows here.\n# TYPE strata_host_memory_stall_seconds_total counter\nstrata_host_memory_stall_seconds_total{{node=\"{node_id}\"}} {}",
            stalled_us as f64 / 1e6
        );
    }
}

pub fn render(node_id: i32, uptime: std::time::Duration, snapshots: &[Snapshot]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP strata_uptime_seconds Time since the node started.\n# TYPE strata_uptime_seconds gauge\nstrata_uptime_seconds{{node=\"{node_id}\"}} {}",
        uptime.as_secs_f64()
    );
    render_process(&mut out, node_id);
    let mut topics: BTreeMap<&str, TopicCounters> = BTreeMap::new();
    for snapshot in snapshots {
        for (topic, counters) in &snapshot.topics {
            let total = topics.entry(topic).or_default();
            total.records_in += counters.records_in;
            total.bytes_in += counters.bytes_in;
            total.bytes_out += counters.bytes_out;
            total.records_out += counters.records_out;
            total.produce_errors += counters.produce_errors;
            total.bytes_replicated += counters.bytes_replicated;
            total.isr_changes += counters.isr_changes;
            for (level, acks) in &counters.acks_by_durability {
                *total.acks_by_durability.entry(*level).or_default() += acks;
            }
        }
    }
    let counter =
        |out: &mut String, name: &str, help: &str, value: &dyn Fn(&TopicCounters) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (topic, counters) in &topics {
                let _ = writeln!(
                    out,
                    "{name}{{node=\"{node_id}\",topic=\"{topic}\"}} {}",
                    value(counters)
                );
            }
        };
    counter(
        &mut out,
        "strata_records_in_total",
        "Records appended.",
        &|c| c.records_in,
    );
    counter(
        &mut out,
        "strata_bytes_in_total",
        "Bytes of record batches appended.",
        &|c| c.bytes_in,
    );
    counter(
        &mut out,
        "strata_bytes_out_total",
        "Bytes of record batches fetched.",
        &|c| c.bytes_out,
    );
    counter(
        &mut out,
        "strata_records_out_total",
        "Records fetched by consumers (whole batches served).",
        &|c| c.records_out,
    );
    counter(
        &mut out,
        "strata_produce_errors_total",
        "Produce requests that failed.",
        &|c| c.produce_errors,
    );
    counter(
        &mut out,
        "strata_bytes_replicated_total",
        "Bytes of record batches this node appended as a follower.",
        &|c| c.bytes_replicated,
    );
    counter(
        &mut out,
        "strata_isr_changes_total",
        "ISR shrinks and expansions of partitions this node leads.",
        &|c| c.isr_changes,
    );
    render_acks_by_durability(&mut out, node_id, &topics);

    // Per-shard numbers: (name, type, help, value).
    // As f64: a duration in seconds sits among the counts (which print as integers).
    let series = per_shard_series()
        .into_iter()
        .chain(connection_series())
        .chain(cleaner_series());
    for (name, kind, help, pick) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (shard, snapshot) in snapshots.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{node=\"{node_id}\",shard=\"{shard}\"}} {}",
                pick(snapshot)
            );
        }
    }
    render_partition_gauges(&mut out, node_id, snapshots);
    render_labelled(&mut out, node_id, snapshots);
    for (name, help, pick) in [
        (
            "strata_produce_latency_seconds",
            "Time to append a produce's records (with flush=always, including the sync).",
            (|s: &Snapshot| &s.produce_latency_us) as fn(&Snapshot) -> &Histogram<u64>,
        ),
        (
            "strata_fetch_latency_seconds",
            "Time to serve a fetch from the partition (including any long-poll wait).",
            |s: &Snapshot| &s.fetch_latency_us,
        ),
        (
            "strata_replication_latency_seconds",
            "Leader side: from a local append to a follower reporting it holds the records (for each follower fetch that reports new records, the oldest of them). acks=all waits for the slowest in-sync follower's.",
            |s: &Snapshot| &s.replication_latency_us,
        ),
        (
            "strata_replica_fetch_latency_seconds",
            "Follower side: one replication fetch, from request to the records appended, including the leader's long-poll wait for new records.",
            |s: &Snapshot| &s.replica_fetch_latency_us,
        ),
        (
            "strata_e2e_latency_seconds",
            "Age of the newest record of each fetch when served (producer timestamp to fetch answer).",
            |s: &Snapshot| &s.e2e_latency_us,
        ),
        (
            "strata_fsync_latency_seconds",
            "One sync of partition logs: an fdatasync of a log (flush=always syncs, closes), or a syncfs round that made the shard's flush=interval logs durable together.",
            |s: &Snapshot| &s.fsync_latency_us,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut merged = Snapshot::default().produce_latency_us;
        for snapshot in snapshots {
            let _ = merged.add(pick(snapshot));
        }
        for bound in BUCKETS_US {
            let count = merged.count_between(0, bound);
            let _ = writeln!(
                out,
                "{name}_bucket{{node=\"{node_id}\",le=\"{}\"}} {count}",
                bound as f64 / 1e6
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{node=\"{node_id}\",le=\"+Inf\"}} {}",
            merged.len()
        );
        let sum_us: f64 = merged
            .iter_recorded()
            .map(|value| value.value_iterated_to() as f64 * value.count_at_value() as f64)
            // Not `sum()`: the float sum of nothing is -0.0, which renders as "-0".
            .fold(0.0, |sum, value| sum + value);
        let _ = writeln!(out, "{name}_sum{{node=\"{node_id}\"}} {}", sum_us / 1e6);
        let _ = writeln!(out, "{name}_count{{node=\"{node_id}\"}} {}", merged.len());
    }
    out
}

/// Per partition this node leads: each follower's lag, the open transactions and the oldest
/// one's age.
fn render_partition_gauges(out: &mut String, node_id: i32, snapshots: &[Snapshot]) {
    let _ = writeln!(
        out,
        "# HELP strata_replica_lag_records Records a follower is behind the leader's log end, per follower of each partition this node leads (as of its last fetch).\n# TYPE strata_replica_lag_records gauge"
    );
    for lag in snapshots.iter().flat_map(|snapshot| &snapshot.replica_lags) {
        let _ = writeln!(
            out,
            "strata_replica_lag_records{{node=\"{node_id}\",topic=\"{}\",partition=\"{}\",replica=\"{}\"}} {}",
            lag.topic, lag.partition, lag.replica, lag.records
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_open_transactions Transactions open on each partition this node leads (partitions with none are left out).\n# TYPE strata_open_transactions gauge"
    );
    let open = snapshots
        .iter()
        .flat_map(|snapshot| &snapshot.open_transactions);
    for txns in open.clone() {
        let _ = writeln!(
            out,
            "strata_open_transactions{{node=\"{node_id}\",topic=\"{}\",partition=\"{}\"}} {}",
            txns.topic, txns.partition, txns.open
        );
    }
    let _ = writeln!(
        out,
        "# HELP strata_oldest_open_transaction_seconds How long the oldest open transaction of each partition this node leads has been open: read_committed consumers wait at its first record.\n# TYPE strata_oldest_open_transaction_seconds gauge"
    );
    for txns in open {
        let _ = writeln!(
            out,
            "strata_oldest_open_transaction_seconds{{node=\"{node_id}\",topic=\"{}\",partition=\"{}\"}} {:.3}",
            txns.topic, txns.partition, txns.oldest_age_seconds
        );
    }
}
