//! The log cleaner's rate on one core against the rate at which the same thread appends.
//!
//! `cargo bench -p strata-node --bench cleaner -- [--dir DIR] [--mib N] [--rounds N] [--map-mib N]
//! [--record-bytes N] [--overwritten SHARE]`
//!
//! For each share of overwritten keys (10% and 90% of 1 KiB records overwrite an earlier key),
//! alternately in each round: append N MiB to a fresh compacted log (the append rate), then clean
//! all of it with room in the key map for every key (the clean rate, MB of dirty log a second,
//! and the CPU it took). Medians and spread over the rounds; the process's peak RSS growth during
//! a clean against the key map's size. `docs/performance.md` records the figures.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use strata_node::io::uring::UringStorage;
use strata_node::log::cleaner::{OffsetMap, clean};
use strata_node::log::{CleanupPolicy, CompactionConfig, FlushPolicy, LogConfig, PartitionLog};
use strata_wire::batch::BatchBuilder;

const RECORDS_PER_BATCH: usize = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = PathBuf::from("/var/tmp/strata-bench-cleaner");
    let mut mib: usize = 256;
    let mut rounds = 3;
    let mut map_mib: usize = 64;
    let mut record_bytes: usize = 1024;
    let mut shares = vec![0.1f64, 0.9];
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--mib" => mib = args.next().expect("--mib N").parse().expect("a number"),
            "--rounds" => rounds = args.next().expect("--rounds N").parse().expect("a number"),
            "--map-mib" => map_mib = args.next().expect("--map-mib N").parse().expect("a number"),
            "--overwritten" => {
                shares = vec![
                    args.next()
                        .expect("--overwritten SHARE")
                        .parse()
                        .expect("a number"),
                ];
            }
            "--record-bytes" => {
                record_bytes = args
                    .next()
                    .expect("--record-bytes N")
                    .parse()
                    .expect("a number");
                assert!(record_bytes > 16, "a record holds its 16-byte key");
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    println!(
        "log cleaner vs appends: {mib} MiB of {record_bytes}-byte records, {RECORDS_PER_BATCH} a batch, key map {map_mib} MiB, {rounds} rounds"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>10} {:>16} {:>14}",
        "overwritten", "append MB/s", "clean MB/s", "clean/app", "clean CPU s/GB", "RSS growth MiB"
    );
    for overwritten in shares {
        let (mut appends, mut cleans, mut cpu, mut rss) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let path = dir.join(format!("{}-{round}", (overwritten * 100.0) as u32));
            let _ = std::fs::remove_dir_all(&path);
            let (append, clean_rate, cpu_per_gb, rss_growth) =
                tokio_uring::start(one_round(&path, mib, record_bytes, overwritten, map_mib));
            appends.push(append);
            cleans.push(clean_rate);
            cpu.push(cpu_per_gb);
            rss.push(rss_growth);
            let _ = std::fs::remove_dir_all(&path);
        }
        let ratios: Vec<f64> = cleans.iter().zip(&appends).map(|(c, a)| c / a).collect();
        println!(
            "{:<12} {:>14} {:>14} {:>10} {:>16} {:>14}",
            format!("{}%", (overwritten * 100.0) as u32),
            spread(&mut appends, 0),
            spread(&mut cleans, 0),
            spread(&mut ratios.clone(), 2),
            spread(&mut cpu, 2),
            spread(&mut rss, 0),
        );
    }
}

/// "median (min-max)".
fn spread(values: &mut [f64], decimals: usize) -> String {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    format!(
        "{median:.decimals$} ({:.decimals$}-{:.decimals$})",
        values[0],
        values[values.len() - 1]
    )
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 20,
        segment_ms: Some(1_000),
        retention_ms: None,
        flush: FlushPolicy::Never,
        cleanup: CleanupPolicy::COMPACT,
        compaction: CompactionConfig {
            min_cleanable_dirty_ratio: 0.0,
            ..CompactionConfig::default()
        },
        ..LogConfig::default()
    }
}

/// (append MB/s, clean MB/s, clean CPU seconds per GB, peak RSS growth during the clean in MiB).
/// The clean takes as many passes as the key map needs (one when every key fits).
async fn one_round(
    dir: &Path,
    mib: usize,
    record_bytes: usize,
    overwritten: f64,
    map_mib: usize,
) -> (f64, f64, f64, f64) {
    let records = mib * (1 << 20) / record_bytes;
    let distinct = ((records as f64) * (1.0 - overwritten)).max(1.0) as usize;
    let value = vec![b'v'; record_bytes - 16];
    let (mut log, _) = PartitionLog::open(UringStorage, dir, config(), 0)
        .await
        .unwrap();
    // Batches built before the clock starts: the producer's work, not the log's.
    let mut batches = Vec::with_capacity(records / RECORDS_PER_BATCH);
    let mut builder = BatchBuilder::with_capacity(RECORDS_PER_BATCH * record_bytes + 4096);
    for i in 0..records {
        // Every key appears once in the first `distinct` records; the rest overwrite them.
        let key = format!("key-{:012}", (i % distinct));
        builder.push(1, Some(key.as_bytes()), &value);
        if builder.record_count() == RECORDS_PER_BATCH {
            batches.push(BytesMut::from(&builder.finish()[..]));
        }
    }
    let bytes: usize = batches.iter().map(|b| b.len()).sum();
    let started = Instant::now();
    for batch in batches {
        log.append(batch, 0, 1).await.unwrap();
    }
    let append = mb_per_s(bytes, started.elapsed());
    log.flush(1).await.unwrap();
    // Everything in closed segments, the active one holding one small batch.
    let mut builder = BatchBuilder::default();
    builder.push(1, Some(b"last"), b"x");
    log.roll_for_compaction(5_000).await.unwrap();
    log.append(BytesMut::from(&builder.finish()[..]), 0, 5_000)
        .await
        .unwrap();
    let dirty: u64 = log.size_bytes();
    // Resets the high-water mark to the current RSS (Linux 4.0 and later).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = peak_rss_kib();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    // As many passes as the key map needs to reach the end.
    let mut map = OffsetMap::with_memory(map_mib << 20);
    let end = log.log_end_offset();
    while let Some(plan) = log.plan_clean(5_000, end) {
        let (returned, outcome) = clean(plan, map, &mut None).await;
        map = returned;
        log.finish_clean(outcome.unwrap(), 5_000).await.unwrap();
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds() - cpu_before;
    let rss_growth = (peak_rss_kib() - rss_before) as f64 / 1024.0;
    assert!(
        log.clean_offset() >= end - 1,
        "cleaned to the end: {} of {end}, {} segments",
        log.clean_offset(),
        log.segment_count()
    );
    (
        append,
        mb_per_s(dirty as usize, elapsed),
        cpu / (dirty as f64 / 1e9),
        rss_growth,
    )
}

fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

/// User + system CPU of this process, seconds.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The process's resident set high-water mark (VmHWM), KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .unwrap_or(0)
}
