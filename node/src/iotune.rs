//! `strata iotune`: measures the disk under a data directory through io_uring, the way the
//! broker writes it, and writes the `io-properties` file (TOML) that `strata serve` reads.
//!
//! Phases, each a share of `--duration`:
//! 1. sequential write bandwidth by write size (4 KiB – 4 MiB) at queue depth 1, O_DIRECT
//!    and buffered (plus an fdatasync at the end); buffered only where O_DIRECT is refused
//!    (e.g. tmpfs);
//! 2. the same at the chosen write size by queue depth (1 – 16 writes in flight);
//! 3. synced writes as the broker makes them: 1 – 16 files at once, each appending
//!    write-size chunks through the page cache and `fdatasync`ing after each;
//! 4. the fdatasync latency distribution (4 KiB written, then synced, repeatedly);
//! 5. sequential read bandwidth of what was written.
//!
//! From them ([`IoProperties::choose`]): the smallest write size that reaches 90 % of the best
//! bandwidth, the fewest concurrent synced writers that reach 90 % of the best synced bandwidth
//! (appends land in the page cache; syncs are what reach the device, so that is what the
//! broker bounds), and a group-commit window that is 0 where syncs are cheap (a drive with
//! power-loss protection) and a tenth of the median sync where they are not. Its files live
//! in `DIR/iotune-<pid>/` and are removed whatever happens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_uring::buf::BoundedBuf;

use crate::log::writer::WriterTuning;

/// The default file name inside a data directory.
pub const IO_PROPERTIES_FILE: &str = "io-properties.toml";

const WRITE_SIZES: [usize; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const QUEUE_DEPTHS: [usize; 5] = [1, 2, 4, 8, 16];
/// Each phase's file wraps around at this size, so a long run does not fill the disk.
const FILE_BYTES_MAX: u64 = 1 << 30;
/// O_DIRECT needs buffers and offsets aligned to the logical block size; 4 KiB covers both 512 B
/// and 4 KiB devices.
const DIRECT_ALIGN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Whether the write phases used O_DIRECT (false: buffered writes plus a final sync).
    pub direct_io: bool,
    /// MB/s (10^6 bytes) by write size in bytes, queue depth 1.
    pub write_mb_per_s_by_size: BTreeMap<String, f64>,
    /// MB/s by queue depth, at the chosen write size.
    pub write_mb_per_s_by_queue_depth: BTreeMap<String, f64>,
    /// With `direct_io`: the by-size sweep again through the page cache (synced at the end).
    #[serde(default)]
    pub buffered_write_mb_per_s_by_size: BTreeMap<String, f64>,
    /// MB/s of write + fdatasync loops by the number of files doing it at once.
    #[serde(default)]
    pub synced_mb_per_s_by_files: BTreeMap<String, f64>,
    pub fdatasync_us_p50: u64,
    pub fdatasync_us_p99: u64,
    pub fdatasync_us_max: u64,
    pub fdatasync_count: u64,
    pub read_mb_per_s: f64,
}

/// What `strata serve` uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chosen {
    /// The write size that reaches 90 % of the best bandwidth.
    pub write_bytes: usize,
    /// Concurrent synced writers (the whole device) that reach 90 % of the best synced
    /// bandwidth: the broker's bound on syncs in flight, shared out over its shards.
    pub writes_in_flight: usize,
    /// How long written appends wait for more before their sync starts (`flush=always`).
    pub group_commit_window_us: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoProperties {
    /// Where and when it was measured, for people.
    pub measured_on: String,
    pub measured: Measured,
    pub chosen: Chosen,
}

#[derive(Debug, thiserror::Error)]
pub enum IoPropertiesError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an io-properties file: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl IoProperties {
    /// Reads an io-properties file; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<IoProperties>, IoPropertiesError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(IoPropertiesError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let properties: IoProperties =
            toml::from_str(&text).map_err(|error| IoPropertiesError::Invalid {
                path: path.to_path_buf(),
                reason: error.to_string(),
            })?;
        if properties.chosen.write_bytes == 0 || properties.chosen.writes_in_flight == 0 {
            return Err(IoPropertiesError::Invalid {
                path: path.to_path_buf(),
                reason: "write_bytes and writes_in_flight must be positive".into(),
            });
        }
        Ok(Some(properties))
    }

    /// Picks the settings from the measurements (pure: tested from tables).
    pub fn choose(measured: &Measured) -> Chosen {
        let knee = |by: &BTreeMap<String, f64>| -> Option<usize> {
            let mut points: Vec<(usize, f64)> = by
                .iter()
                .filter_map(|(key, mb)| Some((key.parse().ok()?, *mb)))
                .collect();
            points.sort_unstable_by_key(|(key, _)| *key);
            let best = points.iter().map(|(_, mb)| *mb).fold(0.0, f64::max);
            points
                .iter()
                .find(|(_, mb)| *mb >= 0.9 * best)
                .map(|(key, _)| *key)
        };
        let write_bytes = knee(&measured.write_mb_per_s_by_size).unwrap_or(1 << 20);
        let writes_in_flight = knee(&measured.synced_mb_per_s_by_files)
            .or_else(|| knee(&measured.write_mb_per_s_by_queue_depth))
            .unwrap_or(4);
        // Under load one sync is always running and the appends meanwhile wait for the next
        // anyway; the window matters at light load, where it trades a little latency for fewer
        // syncs. Worth it only where a sync is slow.
        let group_commit_window_us = if measured.fdatasync_us_p50 <= 200 {
            0
        } else {
            (measured.fdatasync_us_p50 / 10).min(1000)
        };
        Chosen {
            write_bytes,
            writes_in_flight,
            group_commit_window_us,
        }
    }

    /// The log writers' tuning for one of `shards` shards: the device's writes in flight shared
    /// out (they bound the shard's concurrent syncs, the writes that reach the device), and
    /// groups up to the data the device needs in flight to reach its bandwidth.
    pub fn writer_tuning(&self, shards: usize) -> WriterTuning {
        let chosen = &self.chosen;
        let per_shard = chosen.writes_in_flight.div_ceil(shards.max(1)).max(1);
        WriterTuning {
            group_bytes_max: (chosen.write_bytes * chosen.writes_in_flight)
                .clamp(256 << 10, 64 << 20),
            group_commit_window: Duration::from_micros(chosen.group_commit_window_us),
            sync_latency_us: None,
            device_writes: Some(std::sync::Arc::new(tokio::sync::Semaphore::new(per_shard))),
            shared_sync: None,
        }
    }
}

/// Told the fraction of the run done (0 to 1) and the phase starting; `(1.0, None)` at the end.
pub type OnProgress<'a> = &'a dyn Fn(f64, Option<&str>);

/// Reports each phase to the caller's [`OnProgress`].
struct Progress<'a> {
    started: Instant,
    duration: Duration,
    report: OnProgress<'a>,
}

impl Progress<'_> {
    fn phase(&self, name: &str) {
        let done = self.started.elapsed().as_secs_f64() / self.duration.as_secs_f64();
        (self.report)(done.min(1.0), Some(name));
    }

    fn done(&self) {
        (self.report)(1.0, None);
    }
}

/// A buffer of `len` bytes whose start is aligned for O_DIRECT: a slice of a larger `Vec`.
fn aligned(len: usize) -> tokio_uring::buf::Slice<Vec<u8>> {
    let mut vec = vec![0x5Au8; len + DIRECT_ALIGN];
    let offset = vec.as_ptr().align_offset(DIRECT_ALIGN);
    vec.truncate(offset + len);
    vec.slice(offset..offset + len)
}

fn open(path: &Path, direct: bool) -> std::io::Result<tokio_uring::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    Ok(tokio_uring::fs::File::from_std(options.open(path)?))
}

/// Writes `size`-byte blocks with `depth` writers in flight until `until`; MB/s.
async fn write_bandwidth(
    path: &Path,
    direct: bool,
    size: usize,
    depth: usize,
    until: Instant,
) -> std::io::Result<f64> {
    let file = Rc::new(open(path, direct)?);
    let started = Instant::now();
    let region = (FILE_BYTES_MAX / depth as u64) / size as u64 * size as u64;
    let writers = (0..depth).map(|writer| {
        let file = file.clone();
        async move {
            let base = writer as u64 * region;
            let mut buffer = aligned(size);
            let (mut at, mut written) = (0u64, 0u64);
            while Instant::now() < until {
                let (result, returned) = file.write_all_at(buffer, base + at).await;
                buffer = returned;
                result?;
                written += size as u64;
                at = (at + size as u64) % region.max(size as u64);
            }
            Ok::<u64, std::io::Error>(written)
        }
    });
    let mut total = 0;
    for written in futures_util::future::join_all(writers).await {
        total += written?;
    }
    // Buffered writes count only once they are on the disk.
    file.sync_data().await?;
    Ok(total as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// `files` files at once, each appending `size`-byte chunks (page cache) and syncing after
/// each, until `until`: MB/s over all of them.
async fn synced_bandwidth(
    work: &Path,
    files: usize,
    size: usize,
    until: Instant,
) -> std::io::Result<f64> {
    let started = Instant::now();
    let writers = (0..files).map(|index| async move {
        let file = open(&work.join(format!("synced-{index}")), false)?;
        let mut buffer = vec![0x3Cu8; size];
        let (mut at, mut written) = (0u64, 0u64);
        while Instant::now() < until {
            let (result, returned) = file.write_all_at(buffer, at).await;
            buffer = returned;
            result?;
            file.sync_data().await?;
            written += size as u64;
            at = (at + size as u64) % (256 << 20);
        }
        Ok::<u64, std::io::Error>(written)
    });
    let mut total = 0;
    for written in futures_util::future::join_all(writers).await {
        total += written?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64() / 1e6)
}

async fn fdatasync_latency(
    path: &Path,
    until: Instant,
) -> std::io::Result<hdrhistogram::Histogram<u64>> {
    let file = open(path, false)?;
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).expect("3 significant figures");
    let mut buffer = vec![0xA5u8; 4096];
    let mut at = 0u64;
    while Instant::now() < until || histogram.len() < 10 {
        let (result, returned) = file.write_all_at(buffer, at).await;
        buffer = returned;
        result?;
        let started = Instant::now();
        file.sync_data().await?;
        let _ = histogram.record((started.elapsed().as_micros() as u64).max(1));
        at = (at + 4096) % (64 << 20);
    }
    Ok(histogram)
}

async fn read_bandwidth(path: &Path, until: Instant) -> std::io::Result<f64> {
    let file = open(path, false)?;
    let len = std::fs::metadata(path)?.len().max(1);
    let started = Instant::now();
    let mut buffer = Vec::with_capacity(1 << 20);
    let (mut at, mut read) = (0u64, 0u64);
    while Instant::now() < until {
        let (result, returned) = file.read_at(buffer, at).await;
        buffer = returned;
        let got = result? as u64;
        read += got;
        at = if got == 0 { 0 } else { (at + got) % len };
        buffer.clear();
    }
    Ok(read as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Runs every phase in `data_dir` (on a tokio-uring runtime) for about `duration`, telling
/// `on_progress` as each starts.
pub fn measure(
    data_dir: &Path,
    duration: Duration,
    on_progress: OnProgress<'_>,
) -> std::io::Result<IoProperties> {
    std::fs::create_dir_all(data_dir)?;
    let work = data_dir.join(format!("iotune-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = tokio_uring::start(run(&work, duration, on_progress));
    // The scratch files go whatever happened.
    let _ = std::fs::remove_dir_all(&work);
    let measured = result?;
    let chosen = IoProperties::choose(&measured);
    Ok(IoProperties {
        measured_on: format!("{} (data dir {})", humanize_now(), data_dir.display()),
        measured,
        chosen,
    })
}

fn humanize_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    format!("unix time {seconds}")
}

async fn run(
    work: &Path,
    duration: Duration,
    on_progress: OnProgress<'_>,
) -> std::io::Result<Measured> {
    let progress = Progress {
        started: Instant::now(),
        duration,
        report: on_progress,
    };
    let share = |fraction: f64| duration.mul_f64(fraction);
    let data = work.join("data");
    // O_DIRECT where the filesystem takes it.
    let direct = open(&data, true).is_ok();
    let mut by_size = BTreeMap::new();
    let size_share = share(0.15) / WRITE_SIZES.len() as u32;
    for size in WRITE_SIZES {
        progress.phase(&format!("write {} KiB, 1 in flight", size >> 10));
        let mb = write_bandwidth(&data, direct, size, 1, Instant::now() + size_share).await?;
        by_size.insert(size.to_string(), mb);
    }
    // The same through the page cache (what the broker's appends do), synced at the end.
    let mut buffered_by_size = BTreeMap::new();
    if direct {
        let buffered_share = share(0.1) / WRITE_SIZES.len() as u32;
        for size in WRITE_SIZES {
            progress.phase(&format!("buffered write {} KiB", size >> 10));
            let until = Instant::now() + buffered_share;
            let mb = write_bandwidth(&work.join("buffered"), false, size, 1, until).await?;
            buffered_by_size.insert(size.to_string(), mb);
        }
    }
    let write_bytes = IoProperties::choose(&Measured {
        direct_io: direct,
        write_mb_per_s_by_size: by_size.clone(),
        write_mb_per_s_by_queue_depth: BTreeMap::new(),
        buffered_write_mb_per_s_by_size: BTreeMap::new(),
        synced_mb_per_s_by_files: BTreeMap::new(),
        fdatasync_us_p50: 0,
        fdatasync_us_p99: 0,
        fdatasync_us_max: 0,
        fdatasync_count: 0,
        read_mb_per_s: 0.0,
    })
    .write_bytes;
    let mut by_depth = BTreeMap::new();
    let depth_share = share(0.2) / QUEUE_DEPTHS.len() as u32;
    for depth in QUEUE_DEPTHS {
        progress.phase(&format!(
            "write {} KiB, {depth} in flight",
            write_bytes >> 10
        ));
        let mb = write_bandwidth(
            &data,
            direct,
            write_bytes,
            depth,
            Instant::now() + depth_share,
        )
        .await?;
        by_depth.insert(depth.to_string(), mb);
    }
    let mut by_files = BTreeMap::new();
    let files_share = share(0.25) / QUEUE_DEPTHS.len() as u32;
    for files in QUEUE_DEPTHS {
        progress.phase(&format!("synced writes, {files} files at once"));
        let until = Instant::now() + files_share;
        let mb = synced_bandwidth(work, files, write_bytes.min(1 << 20), until).await?;
        by_files.insert(files.to_string(), mb);
    }
    progress.phase("fdatasync latency");
    let syncs = fdatasync_latency(&work.join("sync"), Instant::now() + share(0.15)).await?;
    progress.phase("read");
    let read_mb_per_s = read_bandwidth(&data, Instant::now() + share(0.1)).await?;
    progress.done();
    Ok(Measured {
        direct_io: direct,
        write_mb_per_s_by_size: by_size,
        write_mb_per_s_by_queue_depth: by_depth,
        buffered_write_mb_per_s_by_size: buffered_by_size,
        synced_mb_per_s_by_files: by_files,
        fdatasync_us_p50: syncs.value_at_quantile(0.5),
        fdatasync_us_p99: syncs.value_at_quantile(0.99),
        fdatasync_us_max: syncs.max(),
        fdatasync_count: syncs.len(),
        read_mb_per_s,
    })
}

/// Writes `properties` to `path` as TOML with a comment header.
pub fn write(properties: &IoProperties, path: &Path) -> std::io::Result<()> {
    let body = toml::to_string_pretty(properties).map_err(std::io::Error::other)?;
    let text = format!(
        "# Written by `strata iotune`; read by `strata serve` (from its data dir, or --io-properties).\n\
         # [chosen] is what the broker uses: group writes up to write_bytes * writes_in_flight,\n\
         # writes_in_flight shared out over the shards, and the group-commit window.\n{body}"
    );
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(
        by_size: &[(usize, f64)],
        by_files: &[(usize, f64)],
        fsync_p50_us: u64,
    ) -> Measured {
        Measured {
            direct_io: true,
            write_mb_per_s_by_size: by_size.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            write_mb_per_s_by_queue_depth: BTreeMap::new(),
            buffered_write_mb_per_s_by_size: BTreeMap::new(),
            synced_mb_per_s_by_files: by_files.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            fdatasync_us_p50: fsync_p50_us,
            fdatasync_us_p99: fsync_p50_us * 3,
            fdatasync_us_max: fsync_p50_us * 10,
            fdatasync_count: 100,
            read_mb_per_s: 2000.0,
        }
    }

    #[test]
    fn choices_from_measurements() {
        type Curve = &'static [(usize, f64)];
        /// (bandwidth by size, synced bandwidth by files at once, fsync p50 µs, expected
        /// (write bytes, writes in flight, window µs))
        type Case = (Curve, Curve, u64, (usize, usize, u64));
        let cases: &[Case] = &[
            // An NVMe drive with power-loss protection: saturates at 256 KiB and 4 deep, cheap syncs.
            (
                &[
                    (4096, 300.0),
                    (65536, 1500.0),
                    (262144, 2800.0),
                    (1 << 20, 3000.0),
                    (4 << 20, 3050.0),
                ],
                &[
                    (1, 1800.0),
                    (2, 2600.0),
                    (4, 3000.0),
                    (8, 3100.0),
                    (16, 3100.0),
                ],
                40,
                (262144, 4, 0),
            ),
            // A consumer SSD: 1 MiB writes, depth 1 is enough, 2 ms syncs → a 200 µs window.
            (
                &[
                    (4096, 80.0),
                    (65536, 400.0),
                    (262144, 700.0),
                    (1 << 20, 900.0),
                    (4 << 20, 950.0),
                ],
                &[(1, 950.0), (2, 960.0)],
                2000,
                (1 << 20, 1, 200),
            ),
            // Very slow syncs cap the window at 1 ms.
            (&[(4096, 100.0)], &[(1, 100.0)], 50_000, (4096, 1, 1000)),
            // Nothing measured: safe defaults.
            (&[], &[], 0, (1 << 20, 4, 0)),
        ];
        for (by_size, by_files, fsync, (bytes, depth, window)) in cases {
            let chosen = IoProperties::choose(&measured(by_size, by_files, *fsync));
            assert_eq!(
                (
                    chosen.write_bytes,
                    chosen.writes_in_flight,
                    chosen.group_commit_window_us
                ),
                (*bytes, *depth, *window),
                "{by_size:?} {by_files:?} {fsync}"
            );
        }
    }

    #[test]
    fn the_file_round_trips_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IO_PROPERTIES_FILE);
        assert!(IoProperties::load(&path).unwrap().is_none());
        let measured = measured(&[(262144, 2800.0)], &[(4, 3000.0)], 40);
        let properties = IoProperties {
            measured_on: "test".into(),
            chosen: IoProperties::choose(&measured),
            measured,
        };
        write(&properties, &path).unwrap();
        assert_eq!(IoProperties::load(&path).unwrap(), Some(properties.clone()));
        let tuning = properties.writer_tuning(2);
        assert_eq!(tuning.group_bytes_max, 1 << 20);
        assert_eq!(tuning.device_writes.unwrap().available_permits(), 2);
        std::fs::write(&path, "[chosen]\nwrite_bytes = \"lots\"\n").unwrap();
        assert!(IoProperties::load(&path).is_err());
    }
}
