//! The remote tier's adapter: the object store (`object_store`: S3 or a folder), on a runtime
//! of its own, so uploads, downloads and their HTTP and TLS work never run on a shard. Shards
//! call [`Tier`]'s methods and await the answers; nothing here decides what to upload or
//! delete (the shard's `tiering.rs` does, on the manifest).
//!
//! Remote reads go through a chunk cache ([`CHUNK_BYTES`] per entry, bounded by
//! `--remote-cache-bytes`): a read asks for every chunk it needs at once, and for as many
//! again (at least [`READ_AHEAD_CHUNKS`]) ahead of the reader, into the next remote segment.
//! Per-GET latency, not bandwidth, bounds a remote reader, so what lies ahead must already be
//! on its way: with read-ahead stopping at each segment's end, s3s-fs on loopback served 117
//! MB/s; running on into the next segment, 288 MB/s.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use strata_wire::batch::BatchHeader;

use crate::log::SegmentUpload;
use crate::log::index::{IndexCadence, SegmentIndex};
use crate::tier::RemoteLocation;
use crate::tier::read::{CHUNK_BYTES, Walk, chunk_of, walk_batches};

/// Bytes read from a segment file and sent as one part of an upload.
const UPLOAD_PART_BYTES: usize = 8 << 20;
/// Chunks fetched ahead of a remote reader, at least.
const READ_AHEAD_CHUNKS: u64 = 8;
/// Remote segments whose offset index stays in memory.
const INDEXES_CACHED: usize = 1024;

/// Why a remote operation failed, by the kind operators alert on.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TierError {
    #[error("remote storage: {0}")]
    Config(String),
    #[error("remote store unreachable or failing: {0}")]
    Store(Arc<object_store::Error>),
    #[error("remote object {0} not found")]
    NotFound(String),
    #[error("reading a local segment for upload: {0}")]
    Local(Arc<std::io::Error>),
    #[error("remote segment {object} is damaged at byte {at}")]
    Corrupt { object: String, at: u64 },
    #[error("the remote tier stopped")]
    Stopped,
}

impl From<object_store::Error> for TierError {
    fn from(error: object_store::Error) -> TierError {
        match error {
            object_store::Error::NotFound { path, .. } => TierError::NotFound(path),
            other => TierError::Store(Arc::new(other)),
        }
    }
}

/// What goes beside an uploaded segment: what serving it and recovering from it needs that
/// the log and index objects do not hold.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SegmentMeta {
    pub base_offset: u64,
    pub next_offset: u64,
    /// `(epoch, start offset)`: the epoch in force at the base and each that starts inside.
    pub epochs: Vec<(u32, u64)>,
    /// `(producer id, first offset, last offset)` of each aborted transaction with records in it.
    pub aborted: Vec<(i64, u64, u64)>,
    /// Whether the producer snapshot at `next_offset` went up beside it (`.snapshot`).
    #[serde(default)]
    pub producer_snapshot: bool,
}

/// What an upload put in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploaded {
    pub base_offset: u64,
    pub next_offset: u64,
    pub size_bytes: u64,
}

/// Counters of the remote tier, for `/metrics`.
#[derive(Debug, Default)]
pub struct TierMetrics {
    /// Per shard: closed segments, and their bytes, waiting for upload (each shard writes its
    /// own slot).
    backlog: Vec<(AtomicU64, AtomicU64)>,
    /// Per shard: the segments, and their bytes, the remote tier holds for the partitions the
    /// shard leads (readable ones, as their manifests say).
    held: Vec<(AtomicU64, AtomicU64)>,
    /// Since when (wall ms) every upload has failed; 0 while they succeed.
    failing_since_ms: AtomicU64,
    /// When the failing uploads were last logged as an error.
    alarmed_at_ms: AtomicU64,
    /// Remote reads waiting on the store now (fetches below the local log start).
    pub reads_in_flight: AtomicU64,
    pub uploaded_bytes: AtomicU64,
    pub uploaded_segments: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub deleted_objects: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub upload_errors: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub delete_errors: AtomicU64,
    pub list_errors: AtomicU64,
    /// How long remote chunk fetches took: a count per bucket of
    /// [`FETCH_LATENCY_BUCKETS_US`] (at or below its bound, not cumulative; the last counts
    /// those above every bound), and their sum.
    pub fetch_latency: [AtomicU64; FETCH_LATENCY_BUCKETS_US.len() + 1],
    pub fetch_micros: AtomicU64,
}

/// The sums of per-shard (segments, bytes) slots.
fn sum_slots(slots: &[(AtomicU64, AtomicU64)]) -> (u64, u64) {
    slots.iter().fold((0, 0), |(segments, bytes), (s, b)| {
        (
            segments + s.load(Ordering::Relaxed),
            bytes + b.load(Ordering::Relaxed),
        )
    })
}

/// The upper bounds of the remote fetch latency histogram's buckets, in microseconds: from a
/// cache on the same host to a store across a region.
pub const FETCH_LATENCY_BUCKETS_US: [u64; 13] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

impl TierMetrics {
    fn new(shards: usize) -> TierMetrics {
        TierMetrics {
            backlog: (0..shards).map(|_| Default::default()).collect(),
            held: (0..shards).map(|_| Default::default()).collect(),
            ..TierMetrics::default()
        }
    }

    /// Shard `shard`'s upload lag, and what the remote tier holds for its partitions, in
    /// segments and bytes.
    pub fn set_shard(&self, shard: usize, backlog: (u64, u64), held: (u64, u64)) {
        for (slots, (segments, bytes)) in [(&self.backlog, backlog), (&self.held, held)] {
            if let Some((s, b)) = slots.get(shard) {
                s.store(segments, Ordering::Relaxed);
                b.store(bytes, Ordering::Relaxed);
            }
        }
    }

    /// Closed segments and bytes waiting for upload on the node.
    pub fn backlog(&self) -> (u64, u64) {
        sum_slots(&self.backlog)
    }

    fn upload_succeeded(&self) {
        self.failing_since_ms.store(0, Ordering::Relaxed);
    }

    fn upload_failed(&self, now_ms: i64) {
        let _ = self.failing_since_ms.compare_exchange(
            0,
            now_ms.max(1) as u64,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// How long every upload has failed, if they do.
    pub fn uploads_failing_for(&self, now_ms: i64) -> Option<Duration> {
        let since = self.failing_since_ms.load(Ordering::Relaxed);
        (since > 0).then(|| Duration::from_millis((now_ms.max(0) as u64).saturating_sub(since)))
    }

    /// Whether the failing uploads are due to be logged again (at most every 30 s).
    pub fn alarm_due(&self, now_ms: i64) -> bool {
        let now = now_ms.max(0) as u64;
        let last = self.alarmed_at_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) >= 30_000
            && self
                .alarmed_at_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Counts one remote fetch of `micros`.
    fn fetched_in(&self, micros: u64) {
        let bucket = FETCH_LATENCY_BUCKETS_US.partition_point(|&bound| bound < micros);
        self.fetch_latency[bucket].fetch_add(1, Ordering::Relaxed);
        self.fetch_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The fetch latency histogram in Prometheus' text format.
    fn render_fetch_latency(&self, out: &mut String) {
        use std::fmt::Write;
        let name = "strata_remote_fetch_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Remote chunk fetches, from the request to the store to its whole answer\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (bound, count) in FETCH_LATENCY_BUCKETS_US.iter().zip(&self.fetch_latency) {
            cumulative += count.load(Ordering::Relaxed);
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let above = self.fetch_latency[FETCH_LATENCY_BUCKETS_US.len()].load(Ordering::Relaxed);
        let count = cumulative + above;
        let sum = self.fetch_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }

    /// Prometheus text for the admin endpoint.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        self.render_fetch_latency(out);
        let (segments, bytes) = self.backlog();
        let failing = self.failing_since_ms.load(Ordering::Relaxed);
        let failing_seconds = if failing == 0 {
            0
        } else {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |now| {
                    (now.as_millis() as u64).saturating_sub(failing) / 1000
                })
        };
        let (held_segments, held_bytes) = sum_slots(&self.held);
        let gauges: [(&str, &str, u64); 6] = [
            (
                "strata_remote_segments",
                "Segments the remote tier holds for the partitions this node leads",
                held_segments,
            ),
            (
                "strata_remote_size_bytes",
                "Bytes the remote tier holds for the partitions this node leads",
                held_bytes,
            ),
            (
                "strata_remote_reads_in_flight",
                "Fetches below the local log start waiting on the remote tier now",
                self.reads_in_flight.load(Ordering::Relaxed),
            ),
            (
                "strata_remote_upload_lag_segments",
                "Closed segments of tiered partitions waiting for upload",
                segments,
            ),
            (
                "strata_remote_upload_lag_bytes",
                "Bytes of closed segments waiting for upload (held on the local disk)",
                bytes,
            ),
            (
                "strata_remote_upload_failing_seconds",
                "How long every upload has failed (0: uploads succeed)",
                failing_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        let counters: [(&str, &str, &AtomicU64); 10] = [
            (
                "strata_remote_uploaded_bytes_total",
                "Bytes uploaded to the remote tier",
                &self.uploaded_bytes,
            ),
            (
                "strata_remote_uploaded_segments_total",
                "Segments uploaded to the remote tier",
                &self.uploaded_segments,
            ),
            (
                "strata_remote_fetched_bytes_total",
                "Bytes read from the remote tier",
                &self.fetched_bytes,
            ),
            (
                "strata_remote_deleted_objects_total",
                "Objects deleted from the remote tier",
                &self.deleted_objects,
            ),
            (
                "strata_remote_cache_hits_total",
                "Remote reads served from the chunk cache",
                &self.cache_hits,
            ),
            (
                "strata_remote_cache_misses_total",
                "Remote reads that fetched a chunk",
                &self.cache_misses,
            ),
            (
                "strata_remote_upload_errors_total",
                "Failed uploads",
                &self.upload_errors,
            ),
            (
                "strata_remote_fetch_errors_total",
                "Failed remote reads",
                &self.fetch_errors,
            ),
            (
                "strata_remote_delete_errors_total",
                "Failed remote deletes",
                &self.delete_errors,
            ),
            (
                "strata_remote_list_errors_total",
                "Failed remote listings",
                &self.list_errors,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
    }
}

/// A byte-rate limit shared by the tier's transfers of one direction.
struct Pacer {
    bytes_per_sec: Option<u64>,
    next_free: Mutex<Instant>,
}

impl Pacer {
    fn new(bytes_per_sec: Option<u64>) -> Pacer {
        Pacer {
            bytes_per_sec,
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// Waits until `bytes` more fit under the rate.
    async fn take(&self, bytes: usize) {
        let Some(rate) = self.bytes_per_sec.filter(|rate| *rate > 0) else {
            return;
        };
        let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
        let start = {
            let mut next_free = self.next_free.lock().expect("pacer lock");
            let start = (*next_free).max(Instant::now());
            *next_free = start + cost;
            start
        };
        tokio::time::sleep_until(start.into()).await;
    }
}

type ChunkKey = (String, u64);
type ChunkFetch = Shared<BoxFuture<'static, Result<Bytes, TierError>>>;

/// Remote chunks, least recently used out first, within a byte budget; and the fetches in
/// flight, so a reader and the read-ahead before it share one GET.
struct ChunkCache {
    budget: u64,
    bytes: u64,
    tick: u64,
    chunks: HashMap<ChunkKey, (Bytes, u64)>,
    by_use: BTreeMap<u64, ChunkKey>,
    in_flight: HashMap<ChunkKey, ChunkFetch>,
    indexes: HashMap<String, (Arc<RemoteIndex>, u64)>,
}

/// What serving a remote segment needs besides its log: its offset and time index, and its
/// meta object (the aborted transactions `read_committed` skips).
struct RemoteIndex {
    index: SegmentIndex,
    meta: SegmentMeta,
}

/// Whole batches read from the remote tier, with the aborted transactions (producer id,
/// first offset) that have records among them.
#[derive(Debug, Clone, Default)]
pub struct RemoteBatches {
    pub bytes: Bytes,
    pub aborted: Vec<(i64, u64)>,
}

impl ChunkCache {
    fn get(&mut self, key: &ChunkKey) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let (bytes, used) = self.chunks.get_mut(key)?;
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, key.clone());
        Some(bytes.clone())
    }

    fn put(&mut self, key: ChunkKey, bytes: Bytes) {
        if bytes.len() as u64 > self.budget || self.chunks.contains_key(&key) {
            return;
        }
        self.tick += 1;
        self.bytes += bytes.len() as u64;
        self.by_use.insert(self.tick, key.clone());
        self.chunks.insert(key, (bytes, self.tick));
        while self.bytes > self.budget {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((bytes, _)) = self.chunks.remove(&oldest) {
                self.bytes -= bytes.len() as u64;
            }
        }
    }
}

/// The remote tier: cheap to clone, callable from any runtime.
#[derive(Clone)]
pub struct Tier {
    runtime: tokio::runtime::Handle,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    cache: Arc<Mutex<ChunkCache>>,
    upload_pacer: Arc<Pacer>,
    fetch_pacer: Arc<Pacer>,
    pub metrics: Arc<TierMetrics>,
}

/// How the remote tier is set up (`strata serve --remote-*`).
#[derive(Debug, Clone)]
pub struct TierConfig {
    pub url: String,
    pub cache_bytes: u64,
    pub upload_bytes_per_sec: Option<u64>,
    pub fetch_bytes_per_sec: Option<u64>,
}

impl Tier {
    /// Builds the store `config.url` names and starts the tier's runtime. A bad URL, missing
    /// credentials, or a store that refuses them is an error here, at start-up; a store that
    /// cannot be reached is only a warning (produce goes on, uploads wait for it).
    pub fn start(config: &TierConfig, shards: usize) -> Result<Tier, TierError> {
        let location = RemoteLocation::parse(&config.url).map_err(TierError::Config)?;
        let store = build_store(&location)?;
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("strata-tier".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("strata-tier")
                    .on_thread_start(yield_to_shards)
                    .enable_all()
                    .build()
                    .expect("the tier's runtime starts");
                let _ = handle_tx.send(runtime.handle().clone());
                // The runtime lives as long as the process: its tasks are the tier's.
                runtime.block_on(std::future::pending::<()>());
            })
            .map_err(|error| TierError::Local(Arc::new(error)))?;
        let runtime = handle_rx.recv().map_err(|_| TierError::Stopped)?;
        let tier = Tier {
            runtime,
            store,
            prefix: location.prefix().to_string(),
            cache: Arc::new(Mutex::new(ChunkCache {
                budget: config.cache_bytes,
                bytes: 0,
                tick: 0,
                chunks: HashMap::new(),
                by_use: BTreeMap::new(),
                in_flight: HashMap::new(),
                indexes: HashMap::new(),
            })),
            upload_pacer: Arc::new(Pacer::new(config.upload_bytes_per_sec)),
            fetch_pacer: Arc::new(Pacer::new(config.fetch_bytes_per_sec)),
            metrics: Arc::new(TierMetrics::new(shards)),
        };
        tier.probe()?;
        Ok(tier)
    }

    /// Lists the prefix once: refused credentials stop the start, an unreachable store warns.
    fn probe(&self) -> Result<(), TierError> {
        let store = self.store.clone();
        let prefix = ObjectPath::from(self.prefix.as_str());
        let listed = wait_on(&self.runtime, async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                store.list_with_delimiter(Some(&prefix)),
            )
            .await
        });
        match listed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(
                error @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            )) => Err(TierError::Config(format!(
                "the remote store refused this broker's credentials: {error}"
            ))),
            Ok(Err(error)) => {
                tracing::warn!(
                    "remote storage is not answering yet (uploads wait for it): {error}"
                );
                Ok(())
            }
            Err(_) => {
                tracing::warn!("remote storage did not answer within 10 s (uploads wait for it)");
                Ok(())
            }
        }
    }

    /// The folder of one partition's objects.
    pub fn partition_folder(&self, topic: &str, topic_id: &str, partition: u32) -> String {
        crate::tier::location::partition_folder(&self.prefix, topic, topic_id, partition)
    }

    /// Runs `work` on the tier's runtime and waits for it from the caller's.
    async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, TierError>> + Send + 'static,
    ) -> Result<T, TierError> {
        self.runtime
            .spawn(work)
            .await
            .unwrap_or(Err(TierError::Stopped))
    }

    /// Uploads `upload` as the segment `stem` of `folder`: its log (streamed in parts), the
    /// offset and time indexes built from its batches as they stream, and its [`SegmentMeta`].
    /// The log object goes last but one and the meta last, so whatever is found of an upload
    /// cut short is named by its manifest entry (`CopyStarted`) or is an orphan.
    /// `now_ms`: the wall time, for how long uploads have failed.
    pub async fn upload(
        &self,
        folder: String,
        stem: String,
        upload: SegmentUpload,
        now_ms: i64,
    ) -> Result<Uploaded, TierError> {
        let tier = self.clone();
        let result = self
            .run(async move { tier.upload_on_runtime(&folder, &stem, upload).await })
            .await;
        match &result {
            Ok(uploaded) => {
                self.metrics.upload_succeeded();
                self.metrics
                    .uploaded_bytes
                    .fetch_add(uploaded.size_bytes, Ordering::Relaxed);
                self.metrics
                    .uploaded_segments
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.metrics.upload_errors.fetch_add(1, Ordering::Relaxed);
                self.metrics.upload_failed(now_ms);
            }
        }
        result
    }

    async fn upload_on_runtime(
        &self,
        folder: &str,
        stem: &str,
        upload: SegmentUpload,
    ) -> Result<Uploaded, TierError> {
        let file = Arc::new(
            std::fs::File::open(&upload.path).map_err(|error| TierError::Local(Arc::new(error)))?,
        );
        let log_path = ObjectPath::from(format!("{folder}{stem}.log"));
        let mut writer: Option<WriteMultipart> = None;
        let mut walker = UploadWalker::new(&upload);
        let mut position = 0u64;
        while position < upload.file_len {
            let len = (upload.file_len - position).min(UPLOAD_PART_BYTES as u64) as usize;
            let part = read_at(file.clone(), position, len).await?;
            let keep = walker.walk(&file, position, &part)?;
            if !keep.is_empty() {
                self.upload_pacer.take(keep.len()).await;
                if writer.is_none() {
                    writer = Some(WriteMultipart::new_with_chunk_size(
                        self.store.put_multipart(&log_path).await?,
                        UPLOAD_PART_BYTES,
                    ));
                }
                let writer = writer.as_mut().expect("set above");
                writer.wait_for_capacity(2).await?;
                writer.write(&part[keep]);
            }
            position += len as u64;
        }
        let Some(writer) = writer else {
            return Err(TierError::Corrupt {
                object: upload.path.display().to_string(),
                at: 0,
            });
        };
        writer.finish().await?;
        let (offsets, times) = walker.index.encode();
        self.store
            .put(
                &ObjectPath::from(format!("{folder}{stem}.index")),
                PutPayload::from(offsets),
            )
            .await?;
        self.store
            .put(
                &ObjectPath::from(format!("{folder}{stem}.timeindex")),
                PutPayload::from(times),
            )
            .await?;
        let producer_snapshot = match std::fs::read(&upload.producer_snapshot) {
            Ok(bytes) => Some(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(TierError::Local(Arc::new(error))),
        };
        let has_producer_snapshot = producer_snapshot.is_some();
        if let Some(bytes) = producer_snapshot {
            self.store
                .put(
                    &ObjectPath::from(format!("{folder}{stem}.snapshot")),
                    PutPayload::from(bytes),
                )
                .await?;
        }
        let base_offset = walker.base_offset.expect("a batch was kept");
        let meta = SegmentMeta {
            producer_snapshot: has_producer_snapshot,
            base_offset,
            next_offset: upload.next_offset,
            epochs: upload
                .epochs
                .iter()
                .map(|entry| (entry.epoch, entry.start_offset))
                .collect(),
            aborted: upload
                .aborted
                .iter()
                .map(|txn| (txn.producer_id, txn.first_offset, txn.last_offset))
                .collect(),
        };
        let meta = serde_json::to_vec(&meta).expect("the meta serializes");
        self.store
            .put(
                &ObjectPath::from(format!("{folder}{stem}.meta")),
                PutPayload::from(meta),
            )
            .await?;
        Ok(Uploaded {
            base_offset,
            next_offset: upload.next_offset,
            size_bytes: walker.kept_bytes,
        })
    }

    /// Whole batches of the remote `segment` from the one holding
    /// `offset`, below `end_offset`, within `max_bytes` (the first batch whatever its size).
    pub async fn read(
        &self,
        folder: String,
        segment: crate::tier::RemoteSegment,
        next: Vec<crate::tier::RemoteSegment>,
        offset: u64,
        end_offset: u64,
        max_bytes: usize,
    ) -> Result<RemoteBatches, TierError> {
        let tier = self.clone();
        let (size_bytes, base_offset) = (segment.size_bytes, segment.base_offset);
        self.metrics.reads_in_flight.fetch_add(1, Ordering::Relaxed);
        let result = self
            .run(async move {
                let object = format!("{folder}{}", segment.stem());
                let remote = tier.index(&object, size_bytes).await?;
                let relative = offset.saturating_sub(base_offset).min(u64::from(u32::MAX)) as u32;
                let from = remote
                    .index
                    .floor_by_offset(relative)
                    .map_or(0, |entry| u64::from(entry.position));
                let ahead: Vec<(String, u64)> = next
                    .iter()
                    .map(|next| (format!("{folder}{}", next.stem()), next.size_bytes))
                    .collect();
                tier.read_ahead_past(&object, size_bytes, from, max_bytes, ahead);
                let bytes = tier
                    .read_batches(&object, size_bytes, from, offset, end_offset, max_bytes)
                    .await?;
                let last = last_offset_in(&bytes);
                let aborted = remote
                    .meta
                    .aborted
                    .iter()
                    .filter(|(_, first, end)| {
                        *end >= offset && last.is_some_and(|last| *first <= last)
                    })
                    .map(|(producer_id, first, _)| (*producer_id, *first))
                    .collect();
                Ok(RemoteBatches { bytes, aborted })
            })
            .await;
        self.metrics.reads_in_flight.fetch_sub(1, Ordering::Relaxed);
        if result.is_err() {
            self.metrics.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// The offset of the first record at or after `timestamp_ms` in the remote segment, and its
    /// timestamp: from the time index's floor, a walk of the batches.
    pub async fn offset_for_timestamp(
        &self,
        folder: String,
        stem: String,
        size_bytes: u64,
        timestamp_ms: i64,
    ) -> Result<Option<(u64, i64)>, TierError> {
        let tier = self.clone();
        self.run(async move {
            let object = format!("{folder}{stem}");
            let remote = tier.index(&object, size_bytes).await?;
            let mut position = remote
                .index
                .floor_by_timestamp(timestamp_ms)
                .map_or(0, |entry| u64::from(entry.position));
            while position < size_bytes {
                let chunk = tier.chunk(&object, size_bytes, chunk_of(position)).await?;
                let within = (position - chunk_of(position) * CHUNK_BYTES) as usize;
                let header_bytes = if chunk.len() - within >= strata_wire::batch::HEADER_LEN {
                    chunk.slice(within..)
                } else {
                    tier.range(&object, position..(position + 64).min(size_bytes))
                        .await?
                };
                let header = BatchHeader::parse(&header_bytes).map_err(|_| TierError::Corrupt {
                    object: format!("{object}.log"),
                    at: position,
                })?;
                if header.max_timestamp_ms >= timestamp_ms {
                    // The record itself, as a local lookup finds it (Kafka's answer).
                    let bytes = tier
                        .read_batches(
                            &object,
                            size_bytes,
                            position,
                            header.base_offset,
                            u64::MAX,
                            1,
                        )
                        .await?;
                    let batch = strata_wire::batch::Batch::validate(bytes).map_err(|_| {
                        TierError::Corrupt {
                            object: format!("{object}.log"),
                            at: position,
                        }
                    })?;
                    if let Some(record) = batch
                        .records()
                        .find(|record| record.timestamp_ms >= timestamp_ms)
                    {
                        return Ok(Some((record.offset, record.timestamp_ms)));
                    }
                }
                position += u64::from(header.batch_len);
            }
            Ok(None)
        })
        .await
    }

    /// Deletes every object of the segments `stems` in `folder` (missing ones are no error).
    pub async fn delete_segments(
        &self,
        folder: String,
        stems: Vec<String>,
    ) -> Result<(), TierError> {
        let tier = self.clone();
        let result = self
            .run(async move {
                for stem in stems {
                    for kind in crate::tier::manifest::SEGMENT_OBJECTS {
                        tier.delete_object(&format!("{folder}{stem}.{kind}"))
                            .await?;
                    }
                    tier.forget_cached(&format!("{folder}{stem}"));
                }
                Ok(())
            })
            .await;
        if result.is_err() {
            self.metrics.delete_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Deletes objects by their names within `folder`.
    pub async fn delete_objects(
        &self,
        folder: String,
        names: Vec<String>,
    ) -> Result<(), TierError> {
        let tier = self.clone();
        self.run(async move {
            for name in names {
                tier.delete_object(&format!("{folder}{name}")).await?;
            }
            Ok(())
        })
        .await
    }

    async fn delete_object(&self, name: &str) -> Result<(), TierError> {
        match self.store.delete(&ObjectPath::from(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.metrics.deleted_objects.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The names of the objects in `folder` (relative to it).
    pub async fn list(&self, folder: String) -> Result<Vec<String>, TierError> {
        let tier = self.clone();
        let result = self
            .run(async move {
                use futures_util::StreamExt;
                let prefix = ObjectPath::from(folder.as_str());
                let mut listing = tier.store.list(Some(&prefix));
                let mut names = Vec::new();
                while let Some(meta) = listing.next().await {
                    let meta = meta?;
                    if let Some(name) = meta.location.filename() {
                        names.push(name.to_string());
                    }
                }
                Ok(names)
            })
            .await;
        if result.is_err() {
            self.metrics.list_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// The indexes and meta of a remote segment, cached.
    async fn index(&self, object: &str, size_bytes: u64) -> Result<Arc<RemoteIndex>, TierError> {
        if let Some((index, _)) = self.cache.lock().expect("cache lock").indexes.get(object) {
            return Ok(index.clone());
        }
        let offsets = self.whole(&format!("{object}.index")).await?;
        let times = self.whole(&format!("{object}.timeindex")).await?;
        let meta = self.whole(&format!("{object}.meta")).await?;
        let meta = serde_json::from_slice(&meta).map_err(|_| TierError::Corrupt {
            object: format!("{object}.meta"),
            at: 0,
        })?;
        let index = Arc::new(RemoteIndex {
            index: SegmentIndex::decode(&offsets, &times, size_bytes),
            meta,
        });
        let mut cache = self.cache.lock().expect("cache lock");
        cache.tick += 1;
        let tick = cache.tick;
        cache
            .indexes
            .insert(object.to_string(), (index.clone(), tick));
        if cache.indexes.len() > INDEXES_CACHED {
            let oldest = cache
                .indexes
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                cache.indexes.remove(&oldest);
            }
        }
        Ok(index)
    }

    fn forget_cached(&self, object: &str) {
        let mut cache = self.cache.lock().expect("cache lock");
        cache.indexes.remove(object);
        let log = format!("{object}.log");
        let keys: Vec<ChunkKey> = cache
            .chunks
            .keys()
            .filter(|(name, _)| *name == log)
            .cloned()
            .collect();
        for key in keys {
            if let Some((bytes, used)) = cache.chunks.remove(&key) {
                cache.bytes -= bytes.len() as u64;
                cache.by_use.remove(&used);
            }
        }
    }

    /// What the remote `segment` of `folder` holds for a log that starts at its end: the
    /// leader epochs of its records, and the producer snapshot at its end when one went up.
    pub async fn state_after(
        &self,
        folder: String,
        segment: crate::tier::RemoteSegment,
    ) -> Result<crate::log::StateBelow, TierError> {
        let tier = self.clone();
        self.run(async move {
            let object = format!("{folder}{}", segment.stem());
            let meta = tier.index(&object, segment.size_bytes).await?.meta.clone();
            let producer_snapshot = if meta.producer_snapshot {
                Some(tier.whole(&format!("{object}.snapshot")).await?)
            } else {
                None
            };
            let epochs = meta
                .epochs
                .iter()
                .map(|&(epoch, start_offset)| crate::replication::EpochEntry {
                    epoch,
                    start_offset,
                })
                .collect();
            Ok(crate::log::StateBelow {
                producer_snapshot,
                epochs,
            })
        })
        .await
    }

    async fn whole(&self, name: &str) -> Result<Bytes, TierError> {
        let bytes = self
            .store
            .get(&ObjectPath::from(name))
            .await?
            .bytes()
            .await?;
        Ok(bytes)
    }

    async fn range(&self, object: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let len = (range.end - range.start) as usize;
        self.fetch_pacer.take(len).await;
        let started = Instant::now();
        let bytes = self
            .store
            .get_range(&ObjectPath::from(format!("{object}.log")), range)
            .await?;
        self.metrics
            .fetched_in(started.elapsed().as_micros() as u64);
        self.metrics
            .fetched_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Chunk `index` of `object`'s log: cached, joined to a fetch in flight, or fetched.
    async fn chunk(&self, object: &str, size_bytes: u64, index: u64) -> Result<Bytes, TierError> {
        let key = (format!("{object}.log"), index);
        let fetch = {
            let mut cache = self.cache.lock().expect("cache lock");
            if let Some(bytes) = cache.get(&key) {
                self.metrics.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(bytes);
            }
            self.metrics.cache_misses.fetch_add(1, Ordering::Relaxed);
            cache
                .in_flight
                .entry(key.clone())
                .or_insert_with(|| {
                    let tier = self.clone();
                    let object = object.to_string();
                    let key = key.clone();
                    async move {
                        let start = index * CHUNK_BYTES;
                        let end = (start + CHUNK_BYTES).min(size_bytes);
                        let fetched = tier.range(&object, start..end).await;
                        let mut cache = tier.cache.lock().expect("cache lock");
                        cache.in_flight.remove(&key);
                        if let Ok(bytes) = &fetched {
                            cache.put(key, bytes.clone());
                        }
                        fetched
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        fetch.await
    }

    /// After a read of `max_bytes` from `from`: fetches as many bytes again (at least
    /// [`READ_AHEAD_CHUNKS`] chunks) past it, running on into the remote segments that follow
    /// (`next`: their objects and sizes; their indexes and meta too), so a reader crossing
    /// segments finds them waiting.
    fn read_ahead_past(
        &self,
        object: &str,
        size_bytes: u64,
        from: u64,
        max_bytes: usize,
        next: Vec<(String, u64)>,
    ) {
        let first = chunk_of(from);
        let last = chunk_of((from + max_bytes as u64).min(size_bytes.max(1) - 1)).max(first);
        let mut wanted = (last - first + 1).max(READ_AHEAD_CHUNKS);
        let here = size_bytes.div_ceil(CHUNK_BYTES);
        for chunk in last + 1..here.min(last + 1 + wanted) {
            self.read_ahead(object, size_bytes, chunk);
            wanted -= 1;
        }
        for (next_object, next_size) in next {
            if wanted == 0 {
                break;
            }
            let tier = self.clone();
            let (index_object, index_size) = (next_object.clone(), next_size);
            self.runtime.spawn(async move {
                let _ = tier.index(&index_object, index_size).await;
            });
            let chunks = next_size.div_ceil(CHUNK_BYTES).min(wanted);
            for chunk in 0..chunks {
                self.read_ahead(&next_object, next_size, chunk);
            }
            wanted -= chunks;
        }
    }

    /// Starts fetching chunk `index` unless it is cached or on its way.
    fn read_ahead(&self, object: &str, size_bytes: u64, index: u64) {
        if index * CHUNK_BYTES >= size_bytes {
            return;
        }
        let key = (format!("{object}.log"), index);
        {
            let cache = self.cache.lock().expect("cache lock");
            if cache.chunks.contains_key(&key) || cache.in_flight.contains_key(&key) {
                return;
            }
        }
        let tier = self.clone();
        let object = object.to_string();
        self.runtime.spawn(async move {
            let _ = tier.chunk(&object, size_bytes, index).await;
        });
    }

    async fn read_batches(
        &self,
        object: &str,
        size_bytes: u64,
        from: u64,
        offset: u64,
        end_offset: u64,
        max_bytes: usize,
    ) -> Result<Bytes, TierError> {
        // Every chunk the read may need is asked for at once (they arrive side by side), and
        // as many again ahead of the reader, whose next fetch starts where this one ends.
        let first_chunk = chunk_of(from);
        let want_end = (from + max_bytes as u64).min(size_bytes.max(1) - 1);
        let last_chunk = chunk_of(want_end).max(first_chunk);
        let window = last_chunk - first_chunk + 1;
        for chunk in first_chunk + 1..=last_chunk {
            self.read_ahead(object, size_bytes, chunk);
        }
        let mut chunks = Vec::with_capacity(window as usize);
        for chunk in first_chunk..=last_chunk {
            chunks.push(self.chunk(object, size_bytes, chunk).await?);
        }
        let mut buffer = join(&chunks);
        let mut next_chunk = last_chunk + 1;
        let buffer_start = first_chunk * CHUNK_BYTES;
        loop {
            let at_end = buffer_start + buffer.len() as u64 >= size_bytes;
            let walk = walk_batches(
                &buffer,
                (from - buffer_start) as usize,
                offset,
                end_offset,
                max_bytes,
                at_end,
            );
            match walk {
                Walk::Done { start, len } => return Ok(buffer.slice(start..start + len)),
                Walk::Corrupt { at } => {
                    return Err(TierError::Corrupt {
                        object: format!("{object}.log"),
                        at: buffer_start + at as u64,
                    });
                }
                Walk::NeedMore => {
                    // A batch runs past the window: one chunk more.
                    let more = self.chunk(object, size_bytes, next_chunk).await?;
                    next_chunk += 1;
                    buffer = join(&[buffer, more]);
                }
            }
        }
    }
}

/// Chunks side by side as one buffer: the chunk itself when there is one (no copy).
fn join(chunks: &[Bytes]) -> Bytes {
    if let [one] = chunks {
        return one.clone();
    }
    let mut joined = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for chunk in chunks {
        joined.extend_from_slice(chunk);
    }
    joined.into()
}

/// The last offset of the last whole batch in `bytes`.
fn last_offset_in(bytes: &[u8]) -> Option<u64> {
    let mut at = 0;
    let mut last = None;
    while let Some(rest) = bytes.get(at..).filter(|rest| !rest.is_empty()) {
        let header = BatchHeader::parse(rest).ok()?;
        last = Some(header.base_offset + u64::from(header.offset_count).max(1) - 1);
        at += header.batch_len as usize;
    }
    last
}

/// Waits, on a thread outside `runtime`, for `work` run on it.
fn wait_on<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = tx.send(work.await);
    });
    rx.recv().expect("the tier's runtime runs")
}

/// Lowers the calling thread's scheduling priority (nice 10): uploads and remote reads are
/// background work, and on a host with few cores they must yield to the shards, whose produce
/// latency they otherwise add to (measured in docs/performance.md).
fn yield_to_shards() {
    // SAFETY: setpriority(2) with `who` 0 changes only the calling thread's nice value on
    // Linux (threads have their own); it touches no memory.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    if result != 0 {
        tracing::debug!(
            "the tier's threads keep their priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Reads `len` bytes at `position` off the runtime's workers.
async fn read_at(
    file: Arc<std::fs::File>,
    position: u64,
    len: usize,
) -> Result<Vec<u8>, TierError> {
    tokio::task::spawn_blocking(move || {
        let mut buffer = vec![0; len];
        file.read_exact_at(&mut buffer, position).map(|()| buffer)
    })
    .await
    .map_err(|_| TierError::Stopped)?
    .map_err(|error| TierError::Local(Arc::new(error)))
}

/// Walks an upload's batches part by part: where the uploaded bytes start (past the batches
/// the remote tier already holds), and the index of what is uploaded.
struct UploadWalker {
    skip_below: u64,
    next_batch_at: u64,
    /// The file position of the first uploaded batch.
    start: Option<u64>,
    base_offset: Option<u64>,
    kept_bytes: u64,
    cadence: IndexCadence,
    index: SegmentIndex,
    file_len: u64,
}

impl UploadWalker {
    fn new(upload: &SegmentUpload) -> UploadWalker {
        UploadWalker {
            skip_below: upload.skip_below,
            next_batch_at: 0,
            start: None,
            base_offset: None,
            kept_bytes: 0,
            cadence: IndexCadence::new(upload.index_interval_bytes),
            index: SegmentIndex::default(),
            file_len: upload.file_len,
        }
    }

    /// Walks the batch headers that start in `part` (read at `position`); returns the range of
    /// `part` to upload.
    fn walk(
        &mut self,
        file: &std::fs::File,
        position: u64,
        part: &[u8],
    ) -> Result<Range<usize>, TierError> {
        let part_end = position + part.len() as u64;
        while self.next_batch_at < part_end {
            let at = self.next_batch_at;
            let within = (at - position) as usize;
            let header_len = strata_wire::batch::HEADER_LEN.min((self.file_len - at) as usize);
            let spill;
            let header_bytes = if within + header_len <= part.len() {
                &part[within..]
            } else {
                let mut bytes = vec![0; header_len];
                file.read_exact_at(&mut bytes, at)
                    .map_err(|error| TierError::Local(Arc::new(error)))?;
                spill = bytes;
                &spill[..]
            };
            let header = BatchHeader::parse(header_bytes).map_err(|_| TierError::Corrupt {
                object: "a local segment".into(),
                at,
            })?;
            let next_offset = header.base_offset + u64::from(header.offset_count);
            if next_offset > self.skip_below {
                let start = *self.start.get_or_insert(at);
                let base = *self.base_offset.get_or_insert(header.base_offset);
                let relative = u32::try_from(header.base_offset - base).unwrap_or(u32::MAX);
                if let Some(entry) = self.cadence.on_batch(
                    relative,
                    (at - start) as u32,
                    header.batch_len,
                    header.max_timestamp_ms,
                ) {
                    self.index.push(entry);
                }
            }
            self.next_batch_at += u64::from(header.batch_len);
        }
        let Some(start) = self.start else {
            return Ok(0..0);
        };
        let from = start.max(position);
        if from >= part_end {
            return Ok(0..0);
        }
        self.kept_bytes += part_end - from;
        Ok((from - position) as usize..part.len())
    }
}

fn build_store(location: &RemoteLocation) -> Result<Arc<dyn ObjectStore>, TierError> {
    match location {
        RemoteLocation::File { root, .. } => {
            std::fs::create_dir_all(root).map_err(|error| {
                TierError::Config(format!("creating {}: {error}", root.display()))
            })?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(root)
                .map_err(|error| TierError::Config(error.to_string()))?;
            Ok(Arc::new(store))
        }
        RemoteLocation::S3 { bucket, .. } => {
            let has = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
            let keys = has("AWS_ACCESS_KEY_ID") && has("AWS_SECRET_ACCESS_KEY");
            let other_source = has("AWS_WEB_IDENTITY_TOKEN_FILE")
                || has("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                || has("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                || std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v == "false");
            if !keys && !other_source {
                return Err(TierError::Config(format!(
                    "s3://{bucket}: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                     (or AWS_WEB_IDENTITY_TOKEN_FILE, or AWS_EC2_METADATA_DISABLED=false for instance credentials)"
                )));
            }
            // Fail within seconds, not minutes: the next pass retries, and an outage must show
            // on the metrics while it lasts.
            let mut builder = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(object_store::RetryConfig {
                    backoff: Default::default(),
                    max_retries: 3,
                    retry_timeout: Duration::from_secs(15),
                });
            if !has("AWS_REGION") && !has("AWS_DEFAULT_REGION") {
                builder = builder.with_region("us-east-1");
            }
            let store = builder
                .build()
                .map_err(|error| TierError::Config(format!("s3://{bucket}: {error}")))?;
            Ok(Arc::new(store))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_latencies_render_as_a_cumulative_histogram() {
        let metrics = TierMetrics::new(1);
        for micros in [900, 1_000, 1_001, 40_000, 20_000_000] {
            metrics.fetched_in(micros);
        }
        let mut out = String::new();
        metrics.render(&mut out);
        let value = |line: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {line} in {out}"))
                .to_string()
        };
        let bucket = |le: &str| {
            value(&format!(
                "strata_remote_fetch_latency_seconds_bucket{{le=\"{le}\"}}"
            ))
        };
        assert_eq!(bucket("0.001"), "2", "at or below the bound");
        assert_eq!(bucket("0.0025"), "3");
        assert_eq!(bucket("0.05"), "4");
        assert_eq!(bucket("10"), "4");
        assert_eq!(bucket("+Inf"), "5");
        assert_eq!(value("strata_remote_fetch_latency_seconds_count"), "5");
        assert_eq!(
            value("strata_remote_fetch_latency_seconds_sum"),
            "20.042901"
        );
    }
}
