//! Partition log benchmarks, next to `fio` on the same disk in the same run.
//!
//! `cargo bench -p strata-node --bench log -- [--dir DIR] [--mib N]`
//!
//! Figures go to stdout as a table; `docs/performance.md` records them with the machine. Only the
//! ratios within one run mean much on a shared VM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strata_node::io::Storage;
use strata_node::io::blocking::BlockingStorage;
use strata_node::io::uring::UringStorage;
use strata_node::log::{FlushPolicy, LogConfig, PartitionLog, writer};
use strata_wire::batch::{Batch, BatchBuilder};

const RECORD_BYTES: usize = 1024;
const BATCH_BYTES: usize = 1 << 20;

fn main() {
    if let Ok(filter) = std::env::var("STRATA_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let mut args = std::env::args().skip(1);
    let mut dir = PathBuf::from("/var/tmp/strata-bench");
    let mut mib: usize = 1024;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--mib" => mib = args.next().expect("--mib N").parse().expect("a number"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let batch = one_mib_batch();
    let records_per_batch = Batch::validate(batch.clone()).unwrap().record_count() as usize;
    println!(
        "# {mib} MiB per run, {RECORD_BYTES} B records, {} B batches ({records_per_batch} records), dir {}",
        batch.len(),
        dir.display()
    );

    validate_and_iterate(&batch);

    // A cloud VM's disk can be fast until the host's write cache fills, then slow until it
    // drains: on the VM of docs/performance.md the same command swings by 5x within a minute.
    // Each of our figures is therefore paired with the fio run it is compared with, back to
    // back, the order alternating per round, after a sync and a pause; reported: the medians
    // and the median of the per-pair ratios.
    const ROUNDS: usize = 3;
    let pairs: [(&str, Workload, &str, &[&str]); 6] = [
        (
            "append, flush=never",
            Workload::Never(Backend::Uring),
            "fio buffered 1 MiB writes",
            &[],
        ),
        (
            "append, flush=never, 8 appenders",
            Workload::NeverGrouped(8),
            "fio buffered 1 MiB writes",
            &[],
        ),
        (
            "append, flush=never, blocking backend",
            Workload::Never(Backend::Blocking),
            "fio buffered 1 MiB writes",
            &[],
        ),
        (
            "append, flush=always, 1 appender",
            Workload::Always(1),
            "fio 1 MiB writes + fdatasync",
            &["--fdatasync=1"],
        ),
        (
            "append, flush=always, 8 appenders",
            Workload::Always(8),
            "fio 1 MiB writes + fdatasync",
            &["--fdatasync=1"],
        ),
        (
            "append, flush=always, 8 appenders",
            Workload::Always(8),
            "fio O_DIRECT 1 MiB writes",
            &["--direct=1"],
        ),
    ];
    let mut ours = vec![Vec::new(); pairs.len()];
    let mut theirs = vec![Vec::new(); pairs.len()];
    for round in 0..ROUNDS {
        for (at, (_, workload, _, fio_args)) in pairs.iter().enumerate() {
            let run_dir = dir.join(format!("run-{round}-{at}"));
            std::fs::create_dir_all(&run_dir).unwrap();
            let measure_ours = || {
                settle();
                tokio_uring::start(workload.run(&run_dir.join("p-0"), &batch, mib))
            };
            let measure_fio = || {
                settle();
                fio(&run_dir, mib, fio_args)
            };
            if round % 2 == 0 {
                theirs[at].push(measure_fio());
                ours[at].push(measure_ours());
            } else {
                ours[at].push(measure_ours());
                theirs[at].push(measure_fio());
            }
            let _ = std::fs::remove_dir_all(&run_dir);
        }
    }
    println!(
        "{:44} {:>10}   {:32} {:>10}   {:>14}",
        "strata (median of rounds)", "MB/s", "fio, paired runs", "MB/s", "ratio (median)"
    );
    for (at, (label, _, against, _)) in pairs.iter().enumerate() {
        report_ratio(label, &ours[at], against, &theirs[at]);
    }

    let read_dir = dir.join("read-0");
    settle();
    tokio_uring::start(Workload::Never(Backend::Uring).run(&read_dir, &batch, mib));
    let (warm, cold) = tokio_uring::start(read_back(&read_dir));
    println!("read 1 MiB fetches, warm page cache:          {warm:8.0} MB/s");
    println!("read 1 MiB fetches, cold (fadvise DONTNEED):  {cold:8.0} MB/s");
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Clone, Copy)]
enum Backend {
    Uring,
    Blocking,
}

#[derive(Clone, Copy)]
enum Workload {
    /// One appender calling the log directly.
    Never(Backend),
    /// Concurrent appenders through the log task, which validates a group and writes it back
    /// to back.
    NeverGrouped(usize),
    Always(usize),
}

impl Workload {
    async fn run(self, dir: &Path, batch: &Bytes, mib: usize) -> f64 {
        match self {
            Workload::Never(Backend::Uring) => append_never(UringStorage, dir, batch, mib).await,
            Workload::Never(Backend::Blocking) => {
                append_never(BlockingStorage, dir, batch, mib).await
            }
            Workload::NeverGrouped(appenders) => {
                through_writer(FlushPolicy::Never, dir, batch, mib, appenders).await
            }
            Workload::Always(appenders) => {
                through_writer(FlushPolicy::Always, dir, batch, mib, appenders).await
            }
        }
    }
}

/// Writes back every dirty page and gives the host a moment, so one measurement does not pay
/// for the previous one.
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_secs(2));
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn one_mib_batch() -> Bytes {
    let mut builder = BatchBuilder::with_capacity(BATCH_BYTES + 4096);
    let value = vec![b'v'; RECORD_BYTES];
    let mut i = 0u64;
    while builder.estimated_len() + RECORD_BYTES + 64 <= BATCH_BYTES {
        let key = i.to_le_bytes();
        builder.push(1_700_000_000_000 + i as i64, Some(&key), &value);
        i += 1;
    }
    builder.finish()
}

fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

fn report_ratio(what: &str, ours: &[f64], against: &str, theirs: &[Option<f64>]) {
    let ours_median = median(&mut ours.to_vec());
    let theirs: Vec<f64> = theirs.iter().flatten().copied().collect();
    if theirs.len() != ours.len() {
        println!("{what:44} {ours_median:10.0}   ({against}: fio not installed)");
        return;
    }
    let mut ratios: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(o, t)| 100.0 * o / t)
        .collect();
    let (low, high) = (
        ratios.iter().copied().fold(f64::MAX, f64::min),
        ratios.iter().copied().fold(f64::MIN, f64::max),
    );
    println!(
        "{what:44} {ours_median:10.0}   {against:32} {:10.0}   {:6.0}% ({low:.0}-{high:.0}%)",
        median(&mut theirs.clone()),
        median(&mut ratios)
    );
}

/// Validation (CRC + rkyv check + range checks) and iteration over every record, one core.
fn validate_and_iterate(batch: &Bytes) {
    let crc_start = Instant::now();
    let mut rounds = 0usize;
    while crc_start.elapsed() < Duration::from_secs(1) {
        std::hint::black_box(strata_wire::crc32c(batch));
        rounds += 1;
    }
    let crc_rate = mb_per_s(rounds * batch.len(), crc_start.elapsed());

    let start = Instant::now();
    let mut rounds = 0usize;
    let mut records = 0usize;
    let mut value_bytes = 0usize;
    while start.elapsed() < Duration::from_secs(2) {
        let validated = Batch::validate(batch.clone()).unwrap();
        for record in validated.records() {
            value_bytes += record.value.len();
            records += 1;
        }
        rounds += 1;
    }
    let elapsed = start.elapsed();
    std::hint::black_box(value_bytes);
    println!(
        "validate + iterate 1 MiB batches, 1 core:   {:8.0} MB/s   {:6.1} M records/s   (crc32c alone {crc_rate:.0} MB/s)",
        mb_per_s(rounds * batch.len(), elapsed),
        records as f64 / elapsed.as_secs_f64() / 1e6
    );
}

fn config(flush: FlushPolicy) -> LogConfig {
    LogConfig {
        segment_bytes: 256 << 20,
        flush,
        ..LogConfig::default()
    }
}

/// Batches cost a copy to make mutable (the log stamps them); make them before the clock starts.
fn copies(batch: &Bytes, count: usize) -> Vec<BytesMut> {
    (0..count).map(|_| BytesMut::from(&batch[..])).collect()
}

async fn append_never<S: Storage>(storage: S, dir: &Path, batch: &Bytes, mib: usize) -> f64 {
    let batches = copies(batch, mib);
    let (mut log, _) = PartitionLog::open(storage, dir, config(FlushPolicy::Never), 0)
        .await
        .unwrap();
    let start = Instant::now();
    for batch in batches {
        log.append(batch, 0, 0).await.unwrap();
    }
    let elapsed = start.elapsed();
    let rate = mb_per_s(log.size_bytes() as usize, elapsed);
    log.close(0).await.unwrap();
    rate
}

async fn through_writer(
    flush: FlushPolicy,
    dir: &Path,
    batch: &Bytes,
    mib: usize,
    appenders: usize,
) -> f64 {
    let (log, _) = PartitionLog::open(UringStorage, dir, config(flush), 0)
        .await
        .unwrap();
    let handle = writer::spawn(log, strata_node::clock::Clock::with_wall_ms(|| 0));
    let per_appender = mib / appenders;
    let work: Vec<Vec<BytesMut>> = (0..appenders)
        .map(|_| copies(batch, per_appender))
        .collect();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for batches in work {
        let handle = handle.clone();
        tasks.push(tokio_uring::spawn(async move {
            for batch in batches {
                handle.append(batch, 0).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    handle.close().await.unwrap();
    mb_per_s(per_appender * appenders * batch.len(), elapsed)
}

async fn read_back(dir: &Path) -> (f64, f64) {
    let (mut log, _) = PartitionLog::open(UringStorage, dir, config(FlushPolicy::Never), 0)
        .await
        .unwrap();
    let mut rates = Vec::new();
    for cold in [false, true] {
        if cold {
            drop_page_cache(dir);
        }
        let start = Instant::now();
        let mut offset = log.log_start_offset();
        let mut bytes = 0;
        while offset < log.log_end_offset() {
            let chunk = log.read(offset, BATCH_BYTES, u64::MAX).await.unwrap();
            let batch = Batch::validate(chunk.clone()).unwrap();
            offset = batch.last_offset() + 1;
            bytes += chunk.len();
        }
        rates.push(mb_per_s(bytes, start.elapsed()));
    }
    (rates[0], rates[1])
}

fn drop_page_cache(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = std::fs::File::open(entry.unwrap().path()).unwrap();
        file.sync_all().unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: plain advisory syscall on an fd we own.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// Sequential 1 MiB writes of `mib` MiB with fio's psync engine; returns MB/s or None.
fn fio(dir: &Path, mib: usize, extra: &[&str]) -> Option<f64> {
    let file = dir.join("fio.data");
    let output = Command::new("fio")
        .args([
            "--name=seq",
            "--rw=write",
            "--bs=1M",
            "--ioengine=psync",
            "--output-format=json",
        ])
        .arg(format!("--size={mib}M"))
        .arg(format!("--filename={}", file.display()))
        .args(extra)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&output.stdout);
    // The first "bw_bytes" in fio's JSON is the job's write bandwidth in bytes/s.
    let at = text.find("\"write\" : {")?;
    let rest = &text[at..];
    let at = rest.find("\"bw_bytes\"")?;
    let number: String = rest[at + 10..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some(number.parse::<f64>().ok()? / 1e6)
}
