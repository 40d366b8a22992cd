//! The partition log against the simulated (fault-injecting) storage and against real files
//! through io_uring.

mod common;

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use common::*;
use proptest::prelude::*;
use strata_node::clock::Clock;
use strata_node::io::DIRECT_BLOCK;
use strata_node::io::sim::{FaultOp, SimStorage};
use strata_node::io::uring::UringStorage;
use strata_node::io::{Backend, Storage};
use strata_node::log::shared_sync::SharedSync;
use strata_node::log::tail_cache::TailCaches;
use strata_node::log::writer::AnswerWhen;
use strata_node::log::{
    AppendInfo, AppendSource, DirectWrites, FlushPolicy, LogConfig, LogError,
    PREALLOCATE_AHEAD_MIN_BYTES, PartitionLog, PlacedBatches, REGION_MIN_BYTES, Served, writer,
};
use strata_wire::AlignedVec;

fn sim_dir() -> PathBuf {
    PathBuf::from("/data/orders-0")
}

async fn open<S: Storage>(storage: &S, dir: &Path, config: &LogConfig) -> PartitionLog<S> {
    PartitionLog::open(storage.clone(), dir, config.clone(), 0)
        .await
        .expect("open")
        .0
}

/// Reads every record from `from` to the log end, in small fetches.
async fn read_all<S: Storage>(
    log: &mut PartitionLog<S>,
    from: u64,
    fetch_bytes: usize,
) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let bytes = log.read(next, fetch_bytes, u64::MAX).await.expect("read");
        if bytes.is_empty() {
            return out;
        }
        let records = records_in(bytes);
        assert!(
            records.first().unwrap().offset <= next,
            "read starts at the batch holding the offset"
        );
        for record in records {
            if record.offset >= next {
                assert_eq!(record.offset, next, "offsets are dense");
                next += 1;
                out.push(record);
            }
        }
    }
}

/// Appends `batches` batches of 1..=5 records each and returns the model of what was written.
async fn append_many<S: Storage>(
    log: &mut PartitionLog<S>,
    batches: u64,
    value_len: usize,
    timestamp_ms: i64,
) -> Vec<Rec> {
    let mut written = Vec::new();
    for tag in 0..batches {
        let count = 1 + (tag % 5) as usize;
        let batch = batch_of(tag, count, value_len, timestamp_ms + tag as i64 * 10);
        let info = append_recorded(log, batch, 3, &mut written).await;
        assert_eq!(info.last_offset - info.base_offset + 1, count as u64);
    }
    written
}

/// Appends `batch` in leader epoch `epoch` and adds its records, at the offsets they got, to
/// `written`.
async fn append_recorded<S: Storage>(
    log: &mut PartitionLog<S>,
    batch: BytesMut,
    epoch: u32,
    written: &mut Vec<Rec>,
) -> AppendInfo {
    let expected = records_in(batch.clone().freeze());
    let info = log.append(batch, epoch, 0).await.expect("append");
    written.extend(expected.into_iter().enumerate().map(|(i, mut record)| {
        record.offset = info.base_offset + i as u64;
        record
    }));
    info
}

/// Reopens the log in `sim_dir()`: recovery cuts nothing, and it reads back `written`.
async fn reopens_whole(storage: &SimStorage, config: LogConfig, written: &[Rec]) {
    let (mut log, report) = PartitionLog::open(storage.clone(), sim_dir(), config, 0)
        .await
        .unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(read_all(&mut log, 0, 5000).await, written);
}

#[test]
fn append_read_roll_and_reopen_on_sim() {
    block_on(async {
        let storage = SimStorage::new(1);
        let config = small_config(2048, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 200, 100, 1_000).await;
        assert!(log.segment_count() > 10, "small segments roll");
        assert_eq!(read_all(&mut log, 0, 300).await, written);
        assert_eq!(read_all(&mut log, 123, 10_000).await, written[123..]);
        log.close(0).await.unwrap();
        let (mut log, report) = PartitionLog::open(storage.clone(), sim_dir(), config.clone(), 0)
            .await
            .unwrap();
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(
            report.rebuilt_index_entries, 0,
            "a clean close leaves nothing to rebuild"
        );
        assert_eq!(log.log_end_offset(), written.len() as u64);
        assert_eq!(read_all(&mut log, 0, 1000).await, written);
    });
}

/// A read for sending finds the batches a read returns as a range of the segment file (what
/// the broker hands to `sendfile`) when they are in the page cache and worth it, and returns
/// the read's bytes otherwise.
#[test]
fn reads_for_sending_are_file_ranges_holding_exactly_what_a_read_returns() {
    use std::os::unix::fs::FileExt;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("orders-0");
    tokio_uring::start(async {
        let config = small_config(64 << 20, FlushPolicy::Never);
        let mut log = open(&UringStorage, &dir, &config).await;
        // About 12 KB per batch, 2.4 MB in all: in the page cache, as just written.
        let written = append_many(&mut log, 200, 4000, 1_000).await;
        let mut regions = 0;
        for (offset, max_bytes, max_offset) in [
            (0, 1 << 20, u64::MAX),
            (37, 512 << 10, u64::MAX),
            (101, 300 << 10, u64::MAX),
            (0, 1 << 20, 150),
            (5, 64 << 10, u64::MAX),
        ] {
            // In the page cache, as the region needs: a loaded machine (or a memory-limited
            // cgroup) may have evicted what was written, and then the range is rightly read.
            let segment = dir.join(format!("{:020}.log", 0));
            std::fs::read(&segment).unwrap();
            let expected = log.read(offset, max_bytes, max_offset).await.unwrap();
            match log
                .read_for_sending(offset, max_bytes, max_offset)
                .await
                .unwrap()
            {
                Served::Region(region) => {
                    regions += 1;
                    let file = std::fs::File::from(region.file);
                    let mut sent = vec![0u8; region.len];
                    file.read_exact_at(&mut sent, region.position).unwrap();
                    assert_eq!(sent, expected, "read at {offset} of {max_bytes} B");
                    let records = records_in(expected.clone());
                    assert_eq!(region.records, records.len() as u64);
                    assert!(records.iter().all(|record| record.offset < max_offset));
                }
                Served::Bytes(bytes) => {
                    assert!(
                        max_bytes < REGION_MIN_BYTES,
                        "{offset}/{max_bytes} was read, its file range just read into the page cache"
                    );
                    assert_eq!(bytes, expected);
                }
            }
        }
        assert_eq!(regions, 4);
        assert_eq!(read_all(&mut log, 0, 1 << 20).await, written);

        // A log of small batches (about 300 B each, 600 KB) is read, not sent from the file.
        let small_dir = dir.with_file_name("small-0");
        let mut small = open(&UringStorage, &small_dir, &config).await;
        append_many(&mut small, 2_000, 100, 1_000).await;
        let expected = small.read(0, 1 << 20, u64::MAX).await.unwrap();
        match small.read_for_sending(0, 1 << 20, u64::MAX).await.unwrap() {
            Served::Bytes(bytes) => assert_eq!(bytes, expected),
            Served::Region(region) => panic!("a region of {} small batches", region.records),
        }
    });
}

#[test]
fn append_read_and_reopen_through_io_uring() {
    assert_eq!(
        Backend::detect(),
        Backend::IoUring,
        "this host has io_uring"
    );
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("orders-0");
    tokio_uring::start(async {
        let config = small_config(64 * 1024, FlushPolicy::Always);
        let mut log = open(&UringStorage, &dir, &config).await;
        let written = append_many(&mut log, 300, 500, 1_000).await;
        log.flush(0).await.unwrap();
        assert!(log.segment_count() > 1);
        assert_eq!(read_all(&mut log, 0, 4096).await, written);
        drop(log); // no close: reopen must recover from the files alone
        let mut log = open(&UringStorage, &dir, &config).await;
        assert_eq!(read_all(&mut log, 0, 100_000).await, written);
    });
    // The files are where DESIGN §4 says.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.contains(&"00000000000000000000.log".to_string()));
    assert!(names.contains(&"00000000000000000000.index".to_string()));
    assert!(names.contains(&"00000000000000000000.timeindex".to_string()));
}

/// A log holds descriptors for its segments' log files only: index files, the recovery point
/// and the high watermark are opened for each write, the epoch checkpoint and the producer
/// snapshot too (with thousands of partitions a broker's descriptor limit is what bounds its
/// replicas). All of them are still written.
#[test]
fn a_log_holds_descriptors_only_for_its_segment_logs() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("orders-0");
    let held = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.unwrap().path()).ok())
            .filter(|target| target.starts_with(dir))
            .map(|target| target.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    tokio_uring::start(async {
        let config = small_config(1 << 20, FlushPolicy::Interval { interval_ms: 1 });
        let mut log = open(&UringStorage, &dir, &config).await;
        append_many(&mut log, 20, 100, 1_000).await;
        // A new epoch writes the epoch checkpoint; a roll writes the producer snapshot.
        log.flush(0).await.unwrap();
        log.close(0).await.unwrap();
        let mut log = open(&UringStorage, &dir, &config).await;
        append_many(&mut log, 5, 100, 1_000).await;
        log.flush(1).await.unwrap();
        log.checkpoint_high_watermark(log.log_end_offset()).await;
        let names = held(&dir);
        assert_eq!(
            names,
            [
                // Through the page cache, and with O_DIRECT for large appends.
                "00000000000000000000.log",
                "00000000000000000000.log",
            ],
            "descriptors held by an open log"
        );
        let end = log.log_end_offset();
        drop(log);
        let reopened = open(&UringStorage, &dir, &config).await;
        assert_eq!(reopened.log_end_offset(), end);
        assert_eq!(reopened.high_watermark_checkpoint(), end);
        reopened.close(2).await.unwrap();
    });
    for (name, min_len) in [
        ("00000000000000000000.index", 8),
        ("00000000000000000000.timeindex", 12),
        ("recovery-point", 28),
        ("high-watermark", 12),
    ] {
        let len = std::fs::metadata(dir.join(name)).unwrap().len();
        assert!(len >= min_len, "{name} holds {len} bytes");
    }
    let written: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    for name in ["leader-epoch-checkpoint", "producer-snapshot"] {
        assert!(
            written.iter().any(|n| n == name),
            "{name} was written: {written:?}"
        );
    }
}

/// Pages of the file at `path` in the page cache, and pages in all (`mincore`).
/// Drops a file's clean pages from the page cache.
fn evict_pages(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn resident_pages(path: &Path) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let pages = len.div_ceil(page);
    // SAFETY: a read-only shared mapping of an open file, unmapped below; nothing reads through it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut residency = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes; `residency` has one byte per page.
    let rc = unsafe { libc::mincore(map, len, residency.as_mut_ptr()) };
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(map, len) };
    assert_eq!(rc, 0);
    (
        residency.iter().filter(|page| *page & 1 == 1).count(),
        pages,
    )
}

/// Direct appends through io_uring reach the disk without passing through the page cache:
/// after 8 MB of appends almost none of the segment's pages are cached, against all of them
/// when appends go through the page cache. Both read back and reopen the same.
#[test]
fn direct_appends_through_io_uring_leave_the_page_cache_alone() {
    let temp = tempfile::tempdir().unwrap();
    let probe = temp.path().join("probe");
    std::fs::write(&probe, b"").unwrap();
    if strata_node::io::open_direct_handle(&probe)
        .unwrap()
        .is_none()
    {
        eprintln!("skipped: {} takes no O_DIRECT", temp.path().display());
        return;
    }
    for setting in [DirectWrites::Never, DirectWrites::Always] {
        let dir = temp.path().join(format!("{setting:?}"));
        let config = LogConfig {
            direct_writes: setting,
            ..small_config(64 << 20, FlushPolicy::Never)
        };
        tokio_uring::start(async {
            let mut log = open(&UringStorage, &dir, &config).await;
            let written = append_many(&mut log, 1500, 1800, 0).await;
            let (cached, pages) = resident_pages(&dir.join("00000000000000000000.log"));
            assert!(pages > 1500, "{pages} pages written");
            match setting {
                DirectWrites::Always => assert!(
                    cached <= 2,
                    "{cached} of {pages} pages went through the page cache"
                ),
                _ => assert!(
                    cached > pages * 9 / 10,
                    "only {cached} of {pages} pages cached"
                ),
            }
            assert_eq!(read_all(&mut log, 0, 64 * 1024).await, written);
            drop(log); // no close: recovery meets the padding of the last direct write
            let (mut log, report) = PartitionLog::open(UringStorage, &dir, config.clone(), 0)
                .await
                .unwrap();
            assert_eq!(report.truncated_bytes, 0, "padding is not damage");
            // Fetch-sized reads of what was written direct go past the page cache too, reading
            // the batches they return and no more; smaller ones use the page cache. (Recovery
            // read the file through the page cache: drop it from there first.)
            let segment = dir.join("00000000000000000000.log");
            evict_pages(&segment);
            let before = strata_node::io::direct_io_totals();
            assert_eq!(read_all(&mut log, 0, 512 * 1024).await, written);
            let after = strata_node::io::direct_io_totals();
            let data_len = std::fs::metadata(&segment).unwrap().len();
            let (cached_after_reads, _) = resident_pages(&segment);
            match setting {
                DirectWrites::Always => {
                    let reads = after.reads - before.reads;
                    assert!(reads >= data_len / (512 * 1024), "{reads} direct reads");
                    let read_bytes = after.read_bytes - before.read_bytes;
                    assert!(
                        read_bytes <= data_len + reads * 2 * 4096,
                        "{read_bytes} bytes read for {data_len} of data in {reads} reads"
                    );
                    // Only the end of the log, less than a direct read's worth (128 KiB), came
                    // through the page cache.
                    assert!(
                        cached_after_reads <= 34,
                        "{cached_after_reads} pages cached after direct reads"
                    );
                }
                _ => assert_eq!(after.reads, before.reads),
            }
            assert_eq!(read_all(&mut log, 0, 64 * 1024).await, written);
        });
    }
}

/// Reads of a log written direct, from any offset, go past the page cache once they are
/// fetch-sized (whole blocks around unaligned batches) and return exactly what reads through the
/// page cache would: the batch holding the offset on, whole batches within the budget.
#[test]
fn direct_reads_from_any_offset_return_whole_batches_within_the_budget() {
    block_on(async {
        let storage = SimStorage::new(21);
        let config = LogConfig {
            direct_writes: DirectWrites::Always,
            ..small_config(4 << 20, FlushPolicy::Never)
        };
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 300, 2900, 0).await;
        drop(log); // the reopened log has an empty tail cache: every read goes to the file
        let mut log = open(&storage, &sim_dir(), &config).await;
        let budget = 200 << 10;
        for offset in (0..written.len() as u64).step_by(37) {
            let (reads_before, read_bytes_before) = storage.direct_reads();
            let bytes = log.read(offset, budget, u64::MAX).await.unwrap();
            let (reads, read_bytes) = storage.direct_reads();
            // Near the end of the log less than a direct read's worth is left.
            if written.len() as u64 - offset > 80 {
                assert_eq!(reads, reads_before + 1, "offset {offset}: one direct read");
                // What it returns and the blocks around, no more (every batch here is indexed,
                // being over the 256-byte interval): bytes past the last batch returned would
                // be read again by the next fetch.
                let over = (read_bytes - read_bytes_before) as usize - bytes.len();
                assert!(over < 2 * 4096, "offset {offset}: {over} bytes over");
            }
            let records = records_in(bytes.clone());
            let first = records.first().unwrap().offset;
            assert!(
                first <= offset && offset - first < 5,
                "offset {offset}: from {first}"
            );
            let expected = &written[first as usize..first as usize + records.len()];
            assert_eq!(records, expected, "offset {offset}");
            assert!(
                bytes.len() <= budget,
                "{} bytes over the budget",
                bytes.len()
            );
            let next = first as usize + records.len();
            assert!(
                next == written.len() || bytes.len() + 5 * 2950 > budget - 256,
                "offset {offset}: {} bytes is short of the budget",
                bytes.len()
            );
        }
        // Below the direct-read size, reads go through the page cache.
        let before = storage.direct_reads();
        assert_eq!(read_all(&mut log, 0, 16 << 10).await, written);
        assert_eq!(storage.direct_reads(), before);
    });
}

#[test]
fn reads_respect_max_offset_max_bytes_and_range() {
    block_on(async {
        let storage = SimStorage::new(2);
        let mut log = open(
            &storage,
            &sim_dir(),
            &small_config(1 << 20, FlushPolicy::Never),
        )
        .await;
        let written = append_many(&mut log, 20, 50, 0).await;
        // A bound in the middle of the log: nothing at or past it comes back.
        let bound = 17;
        let got = records_in(log.read(0, 1 << 20, bound).await.unwrap());
        assert!(got.iter().all(|record| record.offset < bound));
        assert!(
            got.len() as u64 >= bound - 5,
            "all whole batches below the bound"
        );
        // max_bytes smaller than one batch still returns that one batch.
        let one = records_in(log.read(0, 1, u64::MAX).await.unwrap());
        assert_eq!(one, written[..1]);
        // Reading at the end is empty; past it or before the start is an error.
        let end = log.log_end_offset();
        assert!(log.read(end, 100, u64::MAX).await.unwrap().is_empty());
        assert!(matches!(
            log.read(end + 1, 100, u64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
    });
}

#[test]
fn a_corrupt_batch_rejects_the_whole_append() {
    block_on(async {
        let storage = SimStorage::new(3);
        let mut log = open(
            &storage,
            &sim_dir(),
            &small_config(1 << 20, FlushPolicy::Never),
        )
        .await;
        let mut two = batch_of(1, 3, 10, 0);
        let mut damaged = batch_of(2, 3, 10, 0);
        let last = damaged.len() - 30;
        damaged[last] ^= 0x40;
        two.extend_from_slice(&damaged);
        let error = log.append(two, 0, 0).await.unwrap_err();
        assert!(
            matches!(error, LogError::CorruptBatch { index: 1, .. }),
            "{error}"
        );
        assert_eq!(log.log_end_offset(), 0);
        assert_eq!(log.size_bytes(), 0);
        assert!(matches!(
            log.append(BytesMut::new(), 0, 0).await,
            Err(LogError::CorruptBatch { .. })
        ));
    });
}

#[test]
fn replicated_batches_must_continue_the_log() {
    block_on(async {
        let storage = SimStorage::new(4);
        let mut leader = open(
            &storage,
            Path::new("/leader/t-0"),
            &small_config(4096, FlushPolicy::Never),
        )
        .await;
        let mut follower = open(
            &storage,
            Path::new("/follower/t-0"),
            &small_config(4096, FlushPolicy::Never),
        )
        .await;
        let written = append_many(&mut leader, 30, 40, 0).await;
        let mut next = 0;
        while next < leader.log_end_offset() {
            let bytes = leader.read(next, 500, u64::MAX).await.unwrap();
            follower.append_replicated(bytes, 0).await.unwrap();
            next = follower.log_end_offset();
        }
        assert_eq!(read_all(&mut follower, 0, 700).await, written);
        let again = leader.read(0, 500, u64::MAX).await.unwrap();
        assert!(matches!(
            follower.append_replicated(again, 0).await,
            Err(LogError::NotContiguous { .. })
        ));
    });
}

/// The `.log` files of `dir` in name (offset) order, with their contents.
async fn segment_files(storage: &SimStorage, dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut names: Vec<PathBuf> = storage
        .list_dir(dir)
        .await
        .unwrap()
        .into_iter()
        .filter(|name| name.extension().is_some_and(|ext| ext == "log"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let contents = storage.contents(&dir.join(&name)).unwrap();
            (name, contents)
        })
        .collect()
}

/// A follower's appends go past the page cache (by default) in whole aligned blocks, mixed with
/// appends through the page cache (the same log leading again), across rolls and a reopen; the
/// result is byte for byte the leader's log, and the padding of direct writes is never damage.
#[test]
fn direct_and_page_cache_appends_mix_and_match_the_leader_byte_for_byte() {
    for seed in 0..20u64 {
        block_on(async {
            let leader_storage = SimStorage::new(seed);
            let storage = SimStorage::new(seed);
            let leader_dir = Path::new("/leader/t-0");
            let dir = Path::new("/mixed/t-0");
            let config = small_config(3000 + seed * 500, FlushPolicy::Never);
            let mut leader = open(&leader_storage, leader_dir, &config).await;
            let mut mixed = open(&storage, dir, &config).await;
            let (mut replicated, mut led, mut in_place_count) = (0, 0, 0);
            for tag in 0..120u64 {
                let batch = batch_of(tag, 1 + (tag % 4) as usize, (tag * 37 % 300) as usize, 0);
                let info = leader.append(batch.clone(), 5, 0).await.unwrap();
                if (tag * 7 + seed) % 3 == 0 {
                    led += 1;
                    let mine = mixed.append(batch, 5, 0).await.unwrap();
                    assert_eq!(mine, info);
                } else {
                    replicated += 1;
                    let bytes = leader.read(info.base_offset, 1, u64::MAX).await.unwrap();
                    let phase = mixed.direct_phase().expect("a follower writes direct");
                    let mine = match (tag + seed) % 3 {
                        0 => mixed.append_replicated(bytes, 0).await.unwrap(),
                        placement => {
                            // Received into place, at the right phase or (a roll the follower
                            // did not foresee) a wrong one, which is copied instead.
                            let right = placement == 1;
                            let at = DIRECT_BLOCK
                                + if right {
                                    phase
                                } else {
                                    (phase + 8) % DIRECT_BLOCK
                                };
                            let mut buf = AlignedVec::<DIRECT_BLOCK>::with_capacity(
                                at + bytes.len() + DIRECT_BLOCK,
                            );
                            buf.resize(at, 0xEE);
                            buf.extend_from_slice(&bytes);
                            let placed = PlacedBatches::new(buf, at..at + bytes.len());
                            let source_start = placed.batches().as_ptr() as usize;
                            let source_end = source_start + bytes.len();
                            let segments = mixed.segment_count();
                            let mine = mixed.append_replicated_placed(placed, 0).await.unwrap();
                            // A roll starts the batches at the new segment's first block.
                            let phase_written = if mixed.segment_count() > segments {
                                0
                            } else {
                                phase
                            };
                            let in_place = at % DIRECT_BLOCK == phase_written;
                            in_place_count += usize::from(in_place);
                            let (address, len) = *storage.direct_write_sources().last().unwrap();
                            let batches_at = address + phase_written;
                            let written_from_placed = (source_start..source_end)
                                .contains(&batches_at)
                                && batches_at + bytes.len() <= address + len;
                            assert_eq!(
                                written_from_placed && batches_at == source_start,
                                in_place,
                                "seed {seed} tag {tag}: written from where the batches were received"
                            );
                            mine
                        }
                    };
                    assert_eq!(mine.last_offset, info.last_offset);
                }
                if tag == 60 {
                    drop(mixed); // no close: recovery meets the padding of the last direct write
                    let (reopened, report) =
                        PartitionLog::open(storage.clone(), dir, config.clone(), 0)
                            .await
                            .unwrap();
                    assert_eq!(
                        report.truncated_bytes, 0,
                        "seed {seed}: padding is not damage"
                    );
                    mixed = reopened;
                }
            }
            assert!(led > 0 && replicated > 0 && in_place_count > 0);
            assert_eq!(
                storage.direct_writes().len(),
                replicated,
                "seed {seed}: every replicated append, and only those, went direct"
            );
            assert!(leader_storage.direct_writes().is_empty());
            for (pos, len) in storage.direct_writes() {
                assert!(pos % 4096 == 0 && len % 4096 == 0 && len > 0);
            }
            assert_eq!(
                read_all(&mut mixed, 0, 700).await,
                read_all(&mut leader, 0, 700).await
            );
            leader.close(0).await.unwrap();
            mixed.close(0).await.unwrap();
            let (leader_files, files) = (
                segment_files(&leader_storage, leader_dir).await,
                segment_files(&storage, dir).await,
            );
            assert!(files.len() > 2, "seed {seed}: rolled");
            assert_eq!(files, leader_files, "seed {seed}");
        });
    }
}

/// Appends below `direct_write_min_bytes` go through the page cache even where the setting
/// sends appends direct (a direct write waits for the disk); larger ones go direct; both mix
/// in one segment and read back whole.
#[test]
fn small_appends_stay_in_the_page_cache_and_large_ones_go_direct() {
    block_on(async {
        let storage = SimStorage::new(3);
        let config = LogConfig {
            direct_writes: DirectWrites::Always,
            direct_write_min_bytes: 8192,
            ..small_config(1 << 20, FlushPolicy::Never)
        };
        let mut log = open(&storage, &sim_dir(), &config).await;
        let mut written = Vec::new();
        for tag in 0..40u64 {
            let large = tag % 10 == 9;
            let batch = batch_of(tag, 4, if large { 3000 } else { 100 }, 0);
            let len = batch.len() as u64;
            let before = storage.direct_writes().len();
            append_recorded(&mut log, batch, 1, &mut written).await;
            let went_direct = storage.direct_writes().len() > before;
            assert_eq!(went_direct, len >= 8192, "tag {tag}: {len} bytes");
        }
        assert_eq!(storage.direct_writes().len(), 4);
        assert_eq!(read_all(&mut log, 0, 5000).await, written);
        drop(log);
        reopens_whole(&storage, config, &written).await;
    });
}

/// `direct.writes=never` keeps every append in the page cache; `always` sends the leader's own
/// appends direct too; a file system without `O_DIRECT` falls back to the page cache.
#[test]
fn direct_writes_follow_the_setting_and_fall_back_without_o_direct() {
    block_on(async {
        for (setting, refuse, expect_direct) in [
            (DirectWrites::Never, false, false),
            (DirectWrites::Always, false, true),
            (DirectWrites::Always, true, false),
        ] {
            let storage = SimStorage::new(9);
            if refuse {
                storage.refuse_direct();
            }
            let config = LogConfig {
                direct_writes: setting,
                ..small_config(8192, FlushPolicy::Never)
            };
            let mut log = open(&storage, &sim_dir(), &config).await;
            let written = append_many(&mut log, 50, 200, 0).await;
            assert_eq!(
                !storage.direct_writes().is_empty(),
                expect_direct,
                "{setting:?}"
            );
            assert_eq!(read_all(&mut log, 0, 1000).await, written);
            log.close(0).await.unwrap();
            let (mut log, report) = PartitionLog::open(storage.clone(), sim_dir(), config, 0)
                .await
                .unwrap();
            assert_eq!(report.truncated_bytes, 0);
            assert_eq!(read_all(&mut log, 0, 1000).await, written);
        }
    });
}

/// `auto` (the default) sends a leader's appends direct, and keeps them in the tail cache,
/// while they are large on average; small ones, and sizes in between after small ones, go
/// through the page cache and are not cached. Everything reads back whole, also after a reopen.
/// A follower given the same batches takes the same paths (without caching them).
#[test]
fn auto_sends_a_leaders_appends_direct_while_they_are_large() {
    block_on(async {
        let storage = SimStorage::new(11);
        let config = LogConfig {
            direct_writes: DirectWrites::Auto,
            direct_write_min_bytes: 8192,
            ..small_config(1 << 20, FlushPolicy::Never)
        };
        assert_eq!(LogConfig::default().direct_writes, DirectWrites::Auto);
        let mut log = open(&storage, &sim_dir(), &config).await;
        // Its shard's caches, which count where its reads were served from.
        let caches = TailCaches::new(1 << 30);
        log.share_tail_cache(&caches);
        let mut follower = open(&storage, Path::new("/data/orders-1"), &config).await;
        let mut written = Vec::new();
        // (appends, value bytes of each of 4 records): small, in between, large, in between,
        // small.
        let phases = [(10, 100), (10, 2500), (10, 4000), (10, 2500), (10, 100)];
        let mut paths = Vec::new();
        for (phase, &(appends, value_len)) in phases.iter().enumerate() {
            let mut phase_paths = Vec::new();
            for i in 0..appends {
                let batch = batch_of((phase * 100 + i) as u64, 4, value_len, 0);
                let before = storage.direct_writes().len();
                let info = append_recorded(&mut log, batch, 1, &mut written).await;
                let went_direct = storage.direct_writes().len() > before;
                // Read the append back at once, as a consumer at the tail does.
                let reads_before = caches.read_totals();
                let appended = log.read(info.base_offset, 1 << 20, u64::MAX).await.unwrap();
                let from_cache = caches.read_totals().from_cache > reads_before.from_cache;
                assert_eq!(from_cache, went_direct, "phase {phase}, append {i}");
                let before = storage.direct_writes().len();
                follower.append_replicated(appended, 0).await.unwrap();
                let follower_direct = storage.direct_writes().len() > before;
                assert_eq!(follower_direct, went_direct, "phase {phase}, append {i}");
                phase_paths.push(went_direct);
            }
            paths.push(phase_paths);
        }
        assert!(
            paths[0].iter().all(|&direct| !direct),
            "small: {:?}",
            paths[0]
        );
        // 10 KB, between the floor and one and a half times it: the path the log was on.
        assert!(
            paths[1].iter().all(|&direct| !direct),
            "in between: {:?}",
            paths[1]
        );
        // 16 KB appends: direct once the average is past 12 KiB, and then on.
        let first = paths[2]
            .iter()
            .position(|&direct| direct)
            .expect("large appends go direct");
        assert!(first <= 3, "{:?}", paths[2]);
        assert!(
            paths[2][first..].iter().all(|&direct| direct),
            "{:?}",
            paths[2]
        );
        assert!(
            paths[3].iter().all(|&direct| direct),
            "in between: {:?}",
            paths[3]
        );
        let back = paths[4]
            .iter()
            .position(|&direct| !direct)
            .expect("small appends go back");
        assert!(back <= 3, "{:?}", paths[4]);
        assert!(
            paths[4][back..].iter().all(|&direct| !direct),
            "{:?}",
            paths[4]
        );
        assert_eq!(read_all(&mut log, 0, 5000).await, written);
        drop(log);
        reopens_whole(&storage, config, &written).await;
    });
}

#[test]
fn truncation_cuts_at_batch_boundaries() {
    block_on(async {
        let storage = SimStorage::new(5);
        let config = small_config(1024, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 60, 60, 0).await;
        let segments_before = log.segment_count();
        // Offsets of batch starts, to cut at boundaries and inside batches.
        let starts: Vec<u64> = {
            let mut starts = vec![0];
            for tag in 0..60u64 {
                starts.push(starts.last().unwrap() + 1 + tag % 5);
            }
            starts
        };
        let boundary = starts[40];
        assert_eq!(log.truncate_to(boundary, 0).await.unwrap(), boundary);
        assert!(log.segment_count() < segments_before);
        assert_eq!(
            read_all(&mut log, 0, 500).await,
            written[..boundary as usize]
        );
        // Inside a batch: the whole batch goes.
        assert_eq!(starts[35] - starts[34], 5, "batch 34 holds five records");
        let inside = starts[34] + 2;
        assert_eq!(log.truncate_to(inside, 0).await.unwrap(), starts[34]);
        // Appending after truncation continues at the new end, and survives a reopen.
        let more = append_many(&mut log, 5, 60, 0).await;
        assert_eq!(more[0].offset, starts[34]);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let got = read_all(&mut log, 0, 500).await;
        assert_eq!(got[..starts[34] as usize], written[..starts[34] as usize]);
        assert_eq!(got[starts[34] as usize..], more[..]);
        // Truncating to the log start empties the log.
        assert_eq!(log.truncate_to(0, 0).await.unwrap(), 0);
        assert_eq!(log.log_end_offset(), 0);
        assert_eq!(log.segment_count(), 1);
    });
}

/// DeleteRecords: the log start moves inside a segment (reads below it are out of range, a
/// read at it gets the records from it), survives a crash once answered, deletes the segments
/// wholly below it, never goes back or past the end, and everything going rolls the segment.
#[test]
fn deleting_records_moves_the_log_start_durably() {
    block_on(async {
        let storage = SimStorage::new(11);
        let config = small_config(2048, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 200, 100, 1_000).await;
        log.flush(0).await.unwrap();
        let segments = log.segment_count();
        let cut = 301;
        assert_eq!(log.delete_records_before(cut, 0).await.unwrap(), cut);
        assert_eq!(log.log_start_offset(), cut);
        assert!(
            log.segment_count() < segments,
            "segments wholly below the cut went"
        );
        assert!(matches!(
            log.read(cut - 1, 1000, u64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(read_all(&mut log, cut, 1000).await, written[cut as usize..]);
        // Never back, never past the end.
        assert_eq!(log.delete_records_before(10, 0).await.unwrap(), cut);
        storage.crash();
        let (mut log, _) = PartitionLog::open(storage.clone(), sim_dir(), config.clone(), 0)
            .await
            .unwrap();
        assert_eq!(
            log.log_start_offset(),
            cut,
            "the new start survives a crash"
        );
        assert_eq!(read_all(&mut log, cut, 1000).await, written[cut as usize..]);
        let end = log.log_end_offset();
        assert_eq!(log.delete_records_before(end + 50, 0).await.unwrap(), end);
        assert_eq!(
            log.segment_count(),
            1,
            "everything went: rolled and deleted"
        );
        assert_eq!(log.log_end_offset(), end, "offsets never go back");
        let more = append_many(&mut log, 3, 10, 5_000).await;
        assert_eq!(read_all(&mut log, end, 1000).await.len(), more.len());
    });
}

#[test]
fn retention_by_size_and_time() {
    block_on(async {
        let storage = SimStorage::new(6);
        let mut config = small_config(2048, FlushPolicy::Never);
        config.retention_bytes = Some(8 * 1024);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 200, 100, 1_000).await;
        let before = log.size_bytes();
        // Nothing at or past the bound (a leader's high watermark) goes, whatever the limits say.
        let report = log.enforce_retention(10_000, 0).await.unwrap();
        assert_eq!(report.deleted_segments, 0);
        let bound = 60;
        log.enforce_retention(10_000, bound).await.unwrap();
        let start = log.log_start_offset();
        assert!(start > 0 && start <= bound, "start {start}");
        let report = log.enforce_retention(10_000, u64::MAX).await.unwrap();
        assert!(report.deleted_segments > 0);
        assert!(log.size_bytes() < before);
        // Kafka's rule: delete while what remains without the oldest segment still meets the limit.
        assert!(log.size_bytes() >= 8 * 1024);
        assert!(log.size_bytes() - 2048 < 8 * 1024);
        let start = log.log_start_offset();
        assert!(start > 0);
        assert_eq!(
            read_all(&mut log, start, 1000).await,
            written[start as usize..]
        );
        assert!(matches!(
            log.read(0, 10, u64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));

        // Time: every record has a timestamp below 1_000 + 2000 + 5; a clock far ahead expires all.
        let mut config = small_config(2048, FlushPolicy::Never);
        config.retention_ms = Some(60_000);
        let mut log = open(&storage, Path::new("/data/time-0"), &config).await;
        let _ = append_many(&mut log, 100, 100, 1_000).await;
        let report = log.enforce_retention(30_000, u64::MAX).await.unwrap();
        assert_eq!(report.deleted_segments, 0, "nothing is old enough yet");
        let end = log.log_end_offset();
        let report = log.enforce_retention(1_000_000, u64::MAX).await.unwrap();
        assert!(report.deleted_segments > 0);
        assert_eq!(
            log.log_start_offset(),
            end,
            "everything expired, the active segment too"
        );
        assert_eq!(log.log_end_offset(), end, "offsets never go back");
    });
}

#[test]
fn segments_roll_by_age() {
    block_on(async {
        let storage = SimStorage::new(7);
        let mut config = small_config(1 << 20, FlushPolicy::Never);
        config.segment_ms = Some(1000);
        let mut log = PartitionLog::open(storage, sim_dir(), config, 0)
            .await
            .unwrap()
            .0;
        log.append(batch_of(0, 2, 10, 0), 0, 100).await.unwrap();
        log.append(batch_of(1, 2, 10, 0), 0, 900).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        log.append(batch_of(2, 2, 10, 0), 0, 1_000).await.unwrap();
        assert_eq!(log.segment_bases(), vec![0, 4]);
    });
}

#[test]
fn a_failed_fsync_stops_the_log() {
    block_on(async {
        let storage = SimStorage::new(8);
        let mut log = open(
            &storage,
            &sim_dir(),
            &small_config(1 << 20, FlushPolicy::Always),
        )
        .await;
        log.append(batch_of(0, 2, 10, 0), 0, 0).await.unwrap();
        log.flush(0).await.unwrap();
        log.append(batch_of(1, 2, 10, 0), 0, 0).await.unwrap();
        storage.fail(FaultOp::Sync, 0);
        assert!(matches!(log.flush(0).await, Err(LogError::Failed { .. })));
        assert!(log.is_failed());
        // No more acks from this log, even though the next sync would work.
        assert!(matches!(
            log.append(batch_of(2, 1, 10, 0), 0, 0).await,
            Err(LogError::Failed { .. })
        ));
        assert!(matches!(log.flush(0).await, Err(LogError::Failed { .. })));
        assert_eq!(log.durable_offset(), 2);
    });
}

#[test]
fn a_failed_write_stops_the_log_and_recovery_cuts_the_partial_batch() {
    block_on(async {
        let storage = SimStorage::new(9);
        let config = small_config(1 << 20, FlushPolicy::Always);
        let mut log = open(&storage, &sim_dir(), &config).await;
        log.append(batch_of(0, 2, 100, 0), 0, 0).await.unwrap();
        log.flush(0).await.unwrap();
        storage.fail(FaultOp::Write, 0);
        assert!(matches!(
            log.append(batch_of(1, 2, 100, 0), 0, 0).await,
            Err(LogError::Failed { .. })
        ));
        drop(log);
        let (mut log, _report) = PartitionLog::open(storage.clone(), sim_dir(), config, 0)
            .await
            .unwrap();
        assert_eq!(log.log_end_offset(), 2);
        assert_eq!(read_all(&mut log, 0, 1000).await.len(), 2);
    });
}

/// Garbles or cuts the tail of the active segment in many ways; recovery keeps exactly the
/// batches before the damage and the log keeps working.
#[test]
fn torn_and_corrupt_tails_are_cut_on_recovery() {
    for (case, damage) in [
        "cut mid-batch",
        "cut mid-header",
        "flip a payload byte",
        "zero tail",
        "garbage appended",
        "index lost",
    ]
    .into_iter()
    .enumerate()
    {
        block_on(async {
            let storage = SimStorage::new(10 + case as u64);
            let config = small_config(1 << 20, FlushPolicy::Always);
            let mut log = open(&storage, &sim_dir(), &config).await;
            let written = append_many(&mut log, 40, 80, 0).await;
            log.flush(0).await.unwrap();
            let last_batch_start = log
                .read(written.last().unwrap().offset, 1, u64::MAX)
                .await
                .unwrap();
            let last_len = last_batch_start.len();
            let last_count = records_in(last_batch_start).len();
            drop(log);
            let segment = sim_dir().join("00000000000000000000.log");
            let mut bytes = storage.contents(&segment).unwrap();
            let full = bytes.len();
            let mut keep = written.len() - last_count;
            match damage {
                "cut mid-batch" => bytes.truncate(full - last_len / 2),
                "cut mid-header" => bytes.truncate(full - last_len + 10),
                "flip a payload byte" => bytes[full - 20] ^= 1,
                "zero tail" => bytes[full - last_len..].fill(0),
                "garbage appended" => {
                    bytes.extend_from_slice(&[0xAB; 100]);
                    keep = written.len();
                }
                "index lost" => {
                    storage.set_contents(&sim_dir().join("00000000000000000000.index"), Vec::new());
                    keep = written.len();
                }
                _ => unreachable!(),
            }
            storage.set_contents(&segment, bytes);
            let (mut log, report) =
                PartitionLog::open(storage.clone(), sim_dir(), config.clone(), 0)
                    .await
                    .unwrap();
            assert_eq!(log.log_end_offset(), keep as u64, "{damage}");
            assert_eq!(
                read_all(&mut log, 0, 700).await,
                written[..keep],
                "{damage}"
            );
            if damage == "index lost" {
                assert!(report.rebuilt_index_entries > 0);
                assert!(log.index_entries() > 1);
            } else {
                assert!(report.truncated_bytes > 0, "{damage}");
            }
            // And it appends and recovers cleanly afterwards.
            log.append(batch_of(99, 2, 10, 0), 3, 0).await.unwrap();
            log.flush(0).await.unwrap();
            drop(log);
            let (log, report) = PartitionLog::open(storage.clone(), sim_dir(), config, 0)
                .await
                .unwrap();
            assert_eq!(log.log_end_offset(), keep as u64 + 2);
            assert_eq!(report.truncated_bytes, 0);
        });
    }
}

/// A Kafka batch (zstd, as a Kafka producer sends it) torn at any length is cut on recovery,
/// and the batches of both formats before it read back whole; a flipped byte under its CRC
/// cuts it too.
#[test]
fn a_kafka_batch_torn_anywhere_is_cut_and_what_came_before_reads_back() {
    block_on(async {
        let storage = SimStorage::new(21);
        let config = small_config(1 << 20, FlushPolicy::Always);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 9, 60, 0).await;
        let mut all = written.clone();
        let last = kafka_batch_of(100, 4, 60, 0, strata_wire::batch::kafka::KafkaCodec::Zstd);
        let last_len = last.len();
        append_recorded(&mut log, last, 3, &mut all).await;
        log.flush(0).await.unwrap();
        drop(log);
        let segment = sim_dir().join("00000000000000000000.log");
        let full = storage.contents(&segment).unwrap();
        let mut damaged: Vec<(String, Vec<u8>)> = (1..last_len)
            .map(|cut| (format!("cut {cut}"), full[..full.len() - cut].to_vec()))
            .collect();
        let mut flipped = full.clone();
        let at = full.len() - last_len / 2;
        flipped[at] ^= 0x10;
        damaged.push(("flipped".into(), flipped));
        for (what, bytes) in damaged {
            storage.set_contents(&segment, bytes);
            let (mut log, report) =
                PartitionLog::open(storage.clone(), sim_dir(), config.clone(), 0)
                    .await
                    .unwrap();
            assert_eq!(log.log_end_offset(), written.len() as u64, "{what}");
            assert!(report.truncated_bytes > 0, "{what}");
            assert_eq!(read_all(&mut log, 0, 700).await, written, "{what}");
        }
        storage.set_contents(&segment, full);
        reopens_whole(&storage, config, &all).await;
    });
}

/// A direct write's padding that recovery's scan meets at the end of one of its read chunks (the chunk holds the data's end but not the file's) is padding, not damage: the scan
/// reads on to the end of the last block. Batches of one size are laid out so that a chunk,
/// stepping from batch start to batch start, ends inside the last block's zeros; the index is
/// lost, so the scan runs from the segment's start.
#[test]
fn padding_split_by_a_scan_chunk_is_not_taken_for_damage() {
    const CHUNK: u64 = strata_node::log::SCAN_CHUNK_BYTES as u64;
    block_on(async {
        let storage = SimStorage::new(5);
        let config = LogConfig {
            direct_writes: DirectWrites::Always,
            ..small_config(64 << 20, FlushPolicy::Never)
        };
        let batch = |value_len: usize| {
            let mut builder = strata_wire::BatchBuilder::default();
            builder.push(0, None, &vec![b'v'; value_len]);
            BytesMut::from(&builder.finish()[..])
        };
        let block = DIRECT_BLOCK as u64;
        // A batch size and count whose end leaves a chunk ending inside the padding: the scan
        // steps by as many whole batches as a chunk holds.
        let splits = |len: u64, count: u64| {
            let per_chunk = CHUNK / len * len;
            let data_end = count * len;
            let file_end = data_end.next_multiple_of(block);
            let last_chunk_start = (data_end - 1) / per_chunk * per_chunk;
            !data_end.is_multiple_of(block)
                && last_chunk_start + CHUNK > data_end
                && last_chunk_start + CHUNK < file_end
        };
        let (value_len, count) = (100..4000)
            .find_map(|value_len| {
                let len = batch(value_len).len() as u64;
                (1..4000u64)
                    .find(|count| splits(len, *count))
                    .map(|count| (value_len, count))
            })
            .expect("a layout that splits the padding");
        let mut log = open(&storage, &sim_dir(), &config).await;
        let mut written = Vec::new();
        for _ in 0..count {
            append_recorded(&mut log, batch(value_len), 1, &mut written).await;
        }
        drop(log); // no close: the padding of the last direct write stays
        storage.set_contents(&sim_dir().join("00000000000000000000.index"), Vec::new());
        let (mut log, report) = PartitionLog::open(storage.clone(), sim_dir(), config, 0)
            .await
            .unwrap();
        assert_eq!(report.truncated_bytes, 0, "padding is not damage");
        assert_eq!(log.log_end_offset(), count);
        assert_eq!(read_all(&mut log, 0, 1 << 20).await, written);
    });
}

/// The crash model: power loss keeps synced data and a random prefix (or, for a disk that
/// reorders writes, a random subset) of what followed, torn.
/// Every batch acknowledged after a sync must survive; nothing torn may be readable.
#[test]
fn simulated_crashes_keep_every_synced_batch() {
    for seed in 0..600u64 {
        block_on(async {
            let storage = SimStorage::new(seed);
            let config = LogConfig {
                // Half the seeds write past the page cache: padded blocks, rewritten tails.
                direct_writes: if (seed / 2) % 2 == 0 {
                    DirectWrites::Always
                } else {
                    DirectWrites::Never
                },
                ..small_config(4096, FlushPolicy::Always)
            };
            let mut log = open(&storage, &sim_dir(), &config).await;
            let mut acknowledged = Vec::new();
            let batches = 5 + seed % 40;
            for tag in 0..batches {
                let batch = batch_of(tag, 1 + (tag % 3) as usize, 50 + (seed as usize % 200), 0);
                let info = log.append(batch, 0, 0).await.unwrap();
                // Some appends are synced (acknowledged), the last few are not.
                if tag + 3 < batches || seed % 3 == 0 {
                    log.flush(0).await.unwrap();
                    acknowledged.push(info);
                }
            }
            // Unsynced appends at the end, so the crash has something to lose; for some seeds
            // enough to roll segments, whose index entries reach the disk while data may not.
            let unsynced = if seed % 5 == 0 { 40 } else { seed % 4 };
            for tag in 0..unsynced {
                log.append(batch_of(1000 + tag, 2, 100, 0), 0, 0)
                    .await
                    .unwrap();
            }
            drop(log);
            if seed % 2 == 0 {
                storage.crash();
            } else {
                storage.crash_reordered();
            }
            let mut log = open(&storage, &sim_dir(), &config).await;
            let acked_end = acknowledged.last().map_or(0, |info| info.last_offset + 1);
            assert!(
                log.log_end_offset() >= acked_end,
                "seed {seed}: lost acknowledged data"
            );
            let records = read_all(&mut log, 0, 1000).await;
            assert_eq!(records.len() as u64, log.log_end_offset(), "seed {seed}");
            for (offset, record) in records.iter().enumerate() {
                assert_eq!(record.offset, offset as u64);
            }
        });
    }
}

#[test]
fn group_commit_shares_one_sync_among_concurrent_appenders() {
    block_on(async {
        let storage = SimStorage::new(11);
        let log = open(
            &storage,
            &sim_dir(),
            &small_config(1 << 20, FlushPolicy::Always),
        )
        .await;
        let handle = writer::spawn(log, Clock::with_wall_ms(|| 0));
        let syncs_before = storage.sync_count();
        let mut tasks = Vec::new();
        for producer in 0..8u64 {
            let handle = handle.clone();
            tasks.push(tokio::task::spawn_local(async move {
                let mut offsets = Vec::new();
                for round in 0..10 {
                    let info = handle
                        .append(batch_of(producer * 100 + round, 4, 100, 0), 1)
                        .await
                        .unwrap();
                    offsets.push(info.base_offset);
                }
                offsets
            }));
        }
        // A corrupt request among them fails alone.
        let mut damaged = batch_of(999, 2, 100, 0);
        let at = damaged.len() - 20;
        damaged[at] ^= 1;
        assert!(matches!(
            handle.append(damaged, 1).await,
            Err(LogError::CorruptBatch { .. })
        ));
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0..80).map(|i| i * 4).collect::<Vec<_>>());
        let syncs = storage.sync_count() - syncs_before;
        assert!(
            syncs <= 20,
            "80 appends by 8 producers took {syncs} syncs: no group commit"
        );
        let offsets = handle.offsets().await.unwrap();
        assert_eq!(offsets.durable, 320, "acknowledged means synced");
        handle.close().await.unwrap();
    });
}

#[test]
fn interval_and_never_policies() {
    block_on(async {
        let storage = SimStorage::new(12);
        let config = small_config(1 << 20, FlushPolicy::Interval { interval_ms: 20 });
        let now = Clock::SYSTEM.wall_ms();
        let log = PartitionLog::open(storage.clone(), sim_dir(), config, now)
            .await
            .unwrap()
            .0;
        let handle = writer::spawn(log, Clock::SYSTEM);
        handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();
        assert_eq!(
            handle.offsets().await.unwrap().durable,
            0,
            "acked before the interval sync"
        );
        tokio::time::sleep(std::time::Duration::from_millis(80)).await;
        assert_eq!(
            handle.offsets().await.unwrap().durable,
            3,
            "the interval sync ran"
        );

        let config = small_config(1 << 20, FlushPolicy::Never);
        let handle = writer::spawn(
            open(&storage, Path::new("/data/never-0"), &config).await,
            Clock::with_wall_ms(|| 0),
        );
        // The first batch of an epoch writes the leader-epoch checkpoint durably (once per
        // epoch, whatever the policy); the records themselves are never synced.
        handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();
        let syncs = storage.sync_count();
        for round in 1..5 {
            handle.append(batch_of(round, 3, 10, 0), 0).await.unwrap();
        }
        assert_eq!(storage.sync_count(), syncs, "never means never");
        let bytes = handle.read(0, 1 << 20, u64::MAX).await.unwrap();
        assert_eq!(records_in(bytes).len(), 15);
    });
}

/// An append asked to be synced is answered only once a sync covers it, whatever the flush
/// policy: its answer finds the log's synced offset past it, and power loss right after keeps
/// it (and what was written before it). One answered by the policy is not synced.
#[test]
fn an_append_asked_synced_is_answered_after_a_sync_and_survives_power_loss() {
    let policies = [
        FlushPolicy::Never,
        FlushPolicy::Interval {
            interval_ms: 3_600_000,
        },
    ];
    for seed in 0..40u64 {
        block_on(async {
            let storage = SimStorage::new(seed);
            let config = small_config(1 << 20, policies[seed as usize % 2]);
            let handle = writer::spawn(
                open(&storage, &sim_dir(), &config).await,
                Clock::with_wall_ms(|| 0),
            );
            let plain = handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();
            assert!(
                handle.synced_offset() <= plain.last_offset,
                "seed {seed}: the flush policy synced"
            );
            let syncs = storage.sync_count();
            let synced = handle
                .append_from(
                    batch_of(1, 2, 10, 0),
                    0,
                    AppendSource::Producer,
                    AnswerWhen::Synced,
                )
                .await
                .unwrap();
            assert!(storage.sync_count() > syncs, "seed {seed}: no sync ran");
            assert_eq!(
                handle.synced_offset(),
                synced.last_offset + 1,
                "seed {seed}: answered before its sync"
            );
            // Written after, not synced: the crash may take it.
            handle.append(batch_of(2, 4, 10, 0), 0).await.unwrap();
            storage.crash();
            // The old task is left as it is (a crash closes nothing).
            let log = open(&storage, &sim_dir(), &config).await;
            assert!(
                log.log_end_offset() > synced.last_offset,
                "seed {seed}: lost a synced append"
            );
            drop(handle);
        });
    }
}

/// A read that waits for the disk does not hold up the partition's appends: they are answered
/// while it is still reading, and it then answers with the log as it was when it was asked.
#[test]
fn appends_go_on_while_a_read_waits_for_the_disk() {
    block_on(async {
        let storage = SimStorage::new(31);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let handle = writer::spawn(
            open(&storage, Path::new("/data/slow-0"), &config).await,
            Clock::with_wall_ms(|| 0),
        );
        handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();
        storage.hold_reads();
        let read = tokio::task::spawn_local({
            let handle = handle.clone();
            async move { handle.read(0, 1 << 20, u64::MAX).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await; // the read reaches the file and waits there
        }
        for tag in 1..4 {
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                handle.append(batch_of(tag, 3, 10, 0), 0),
            )
            .await
            .expect("an append waited for the read")
            .unwrap();
        }
        assert!(!read.is_finished(), "the read did wait for the disk");
        storage.release_reads();
        let bytes = read.await.unwrap().unwrap();
        assert_eq!(
            records_in(bytes).len(),
            3,
            "the log as it was when the read was asked"
        );
        let all = handle.read(0, 1 << 20, u64::MAX).await.unwrap();
        assert_eq!(records_in(all).len(), 12);
    });
}

/// A follower's read at the log end parks in the log task and is answered, with the log's
/// offsets, by the append that brings records; one withdrawn meanwhile is forgotten; without
/// waiting it answers at once (nothing at the end); a read below the log start is refused.
#[test]
fn follower_reads_park_until_an_append_and_carry_the_offsets() {
    block_on(async {
        let storage = SimStorage::new(15);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let handle = writer::spawn(
            open(&storage, &sim_dir(), &config).await,
            Clock::with_wall_ms(|| 0),
        );
        handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();

        let (records, offsets) = handle.read_for_follower(0, 1 << 20, true).await.unwrap();
        assert_eq!(
            records_in(records).len(),
            3,
            "records past the offset: at once"
        );
        assert_eq!((offsets.log_start, offsets.log_end), (0, 3));

        let (records, offsets) = handle.read_for_follower(3, 1 << 20, false).await.unwrap();
        assert!(
            records.is_empty() && offsets.log_end == 3,
            "no wait: nothing, at once"
        );

        // Withdrawn: dropped before any append.
        let withdrawn = handle.read_for_follower(3, 1 << 20, true);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), withdrawn)
                .await
                .is_err(),
            "a read at the log end waits"
        );
        let parked = {
            let handle = handle.clone();
            tokio::task::spawn_local(
                async move { handle.read_for_follower(3, 1 << 20, true).await },
            )
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!parked.is_finished(), "parked until records come");
        handle.append(batch_of(1, 2, 10, 0), 0).await.unwrap();
        let answered = tokio::time::timeout(std::time::Duration::from_secs(5), parked).await;
        let (records, offsets) = answered.expect("the append answers it").unwrap().unwrap();
        assert_eq!(records_in(records).len(), 2, "the append's records");
        assert_eq!(offsets.log_end, 5);

        assert!(matches!(
            handle.read_for_follower(9, 1 << 20, false).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
    });
}

/// `flush=interval` logs of one shard sync together: one `syncfs` round covers many logs'
/// interval flushes, none of them syncs its own files, and all become durable. When a round
/// fails, each log syncs its own files, and they become durable all the same.
#[test]
fn interval_syncs_of_many_logs_share_syncfs_rounds() {
    const LOGS: usize = 24;
    let root = tempfile::tempdir().unwrap();
    block_on(async {
        for failing_rounds in [false, true] {
            let storage = SimStorage::new(14);
            let shared = SharedSync::open(
                root.path(),
                std::time::Duration::from_millis(30),
                // Every round syncs, however few joined (small rounds: a unit test).
                1,
                None,
                None,
            )
            .unwrap();
            if failing_rounds {
                shared.fail_rounds_with(libc::EIO);
            }
            let tuning = writer::WriterTuning {
                shared_sync: Some(shared.clone()),
                ..Default::default()
            };
            let config = small_config(1 << 20, FlushPolicy::Interval { interval_ms: 10 });
            let mut handles = Vec::new();
            for index in 0..LOGS {
                // The rounds sync the filesystem a log's folder is on: the folder must exist.
                let dir = root.path().join(format!("{failing_rounds}-{index}"));
                std::fs::create_dir(&dir).unwrap();
                let log = open(&storage, &dir, &config).await;
                handles.push(writer::spawn_tuned(log, Clock::SYSTEM, tuning.clone()));
            }
            for handle in &handles {
                handle.append(batch_of(0, 3, 10, 0), 0).await.unwrap();
            }
            // The first batch of an epoch synced the epoch checkpoint; the records are not.
            let syncs_after_appends = storage.sync_count();
            // A `syncfs` waits for everything dirty on the filesystem (a build's output, say).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            for handle in &handles {
                while handle.offsets().await.unwrap().durable < 3 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the interval sync never ran"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            let own_syncs = storage.sync_count() - syncs_after_appends;
            assert!(
                shared.jobs() >= LOGS as u64,
                "{} of {LOGS} logs' interval syncs joined a round",
                shared.jobs()
            );
            assert!(
                (1..=LOGS as u64 / 4).contains(&shared.rounds()),
                "{} rounds for {LOGS} logs",
                shared.rounds()
            );
            if failing_rounds {
                assert!(
                    own_syncs >= LOGS as u64,
                    "a failed round falls back: {own_syncs} syncs"
                );
            } else {
                assert_eq!(own_syncs, 0, "the round synced for every log");
            }
        }
    });
}

#[test]
fn writeback_is_started_in_chunks_not_per_write_whatever_the_flush_policy() {
    block_on(async {
        let storage = SimStorage::new(13);
        let config = small_config(
            64 << 20,
            FlushPolicy::Interval {
                interval_ms: 60_000,
            },
        );
        let mut log = open(&storage, &sim_dir(), &config).await;
        // 3,000 single-record batches of ~1 KiB: ~3.2 MB in small writes.
        for tag in 0..3_000 {
            log.append(batch_of(tag, 1, 1_000, 0), 0, 0).await.unwrap();
        }
        let end = log.size_bytes();
        let hints = storage.writeback_hints();
        assert!(
            (2..=4).contains(&hints.len()),
            "{} hints for 3,000 writes of {end} bytes: {hints:?}",
            hints.len()
        );
        let mut next = 0;
        for (pos, len) in hints {
            assert_eq!(pos, next, "the hinted ranges follow one another");
            assert!(len >= 1 << 20, "a hint covers at least a chunk");
            next = pos + len;
        }
        assert!(end - next < 1 << 20, "at most one chunk is left unhinted");

        // Without syncs too: dirty pages do not pile up for the kernel's flusher.
        let config = small_config(64 << 20, FlushPolicy::Never);
        let mut log = open(&storage, Path::new("/data/never-0"), &config).await;
        let before = storage.writeback_hints().len();
        for tag in 0..3_000 {
            log.append(batch_of(tag, 1, 1_000, 0), 0, 0).await.unwrap();
        }
        let hints = storage.writeback_hints().len() - before;
        assert!((2..=4).contains(&hints), "{hints} hints with flush=never");
    });
}

/// The `.log` files among `paths`, oldest segment first.
fn segment_logs(paths: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = paths
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    logs.sort();
    logs
}

/// Appends find their blocks reserved a step ahead (ext4 would otherwise allocate them in
/// writeback, under a lock the next append waits for), with one `fallocate` per step, never
/// past the segment's limit; a closed segment, and the active one at a clean close, keep no
/// reserved blocks past their data. Without steps, every append lengthens the file unreserved.
#[test]
fn appends_land_in_blocks_reserved_ahead_and_closed_segments_keep_none() {
    block_on(async {
        const STEP: u64 = 256 << 10;
        const SEGMENT: u64 = 2 << 20;
        for step in [STEP, 0] {
            let storage = SimStorage::new(21);
            let dir = PathBuf::from(format!("/data/reserve-{step}"));
            let config = LogConfig {
                preallocate_step_bytes: step,
                ..small_config(SEGMENT, FlushPolicy::Never)
            };
            let mut log = open(&storage, &dir, &config).await;
            // ~4.6 MB in batches of 1 to 5 records of ~1 KiB: two closed segments and an
            // active one.
            let written = append_many(&mut log, 1_500, 1_000, 0).await;
            let names = storage.list_dir(&dir).await.unwrap();
            let logs = segment_logs(names.into_iter().map(|name| dir.join(name)));
            assert_eq!(logs.len(), 3, "{logs:?}");
            let (closed, active) = logs.split_at(2);
            let active = storage.reservation(&active[0]).unwrap();
            let active_len = storage.contents(&logs[2]).unwrap().len() as u64;
            if step == 0 {
                assert_eq!(active.calls, 0);
                assert!(active.unreserved_appends > 100, "{active:?}");
            } else {
                assert_eq!(active.unreserved_appends, 0, "{active:?}");
                assert!(active.past_end >= step / 2, "{active:?}");
                assert!(active_len + active.past_end <= SEGMENT, "{active:?}");
                assert!(
                    active.calls <= active_len / (step / 2) + 1,
                    "one call per step at most: {active:?} for {active_len} bytes"
                );
            }
            for path in closed {
                let reservation = storage.reservation(path).unwrap();
                assert_eq!(reservation.past_end, 0, "{path:?}: {reservation:?}");
                if step != 0 {
                    assert_eq!(
                        reservation.unreserved_appends, 0,
                        "{path:?}: {reservation:?}"
                    );
                }
            }
            assert_eq!(read_all(&mut log, 0, 64 * 1024).await, written);
            log.close(0).await.unwrap();
            assert_eq!(storage.reservation(&logs[2]).unwrap().past_end, 0);
            let mut log = open(&storage, &dir, &config).await;
            assert_eq!(read_all(&mut log, 0, 64 * 1024).await, written);
        }
    });
}

/// A partition that holds little reserves little: the reservation ahead grows with the
/// segment from `PREALLOCATE_AHEAD_MIN_BYTES` to the whole step, in a few calls. At a whole
/// step from the first append, a broker of 1,000 partitions of a few records each filled this
/// project's 42 GB of free disk with reserved blocks.
#[test]
fn the_reservation_grows_with_the_segment() {
    block_on(async {
        const STEP: u64 = 4 << 20;
        let storage = SimStorage::new(22);
        let dir = PathBuf::from("/data/grow-0");
        let config = LogConfig {
            preallocate_step_bytes: STEP,
            ..small_config(64 << 20, FlushPolicy::Never)
        };
        let mut log = open(&storage, &dir, &config).await;
        let path = dir.join("00000000000000000000.log");
        append_many(&mut log, 1, 1_000, 0).await;
        let small = storage.reservation(&path).unwrap();
        assert!(
            small.past_end <= 2 * PREALLOCATE_AHEAD_MIN_BYTES,
            "one record, {small:?}"
        );

        append_many(&mut log, 4_000, 1_000, 0).await;
        let len = storage.contents(&path).unwrap().len() as u64;
        assert!(len > 2 * STEP, "{len} bytes");
        let grown = storage.reservation(&path).unwrap();
        assert_eq!(grown.unreserved_appends, 0, "{grown:?}");
        assert!(
            grown.past_end >= STEP / 2 && grown.past_end <= 2 * STEP,
            "a whole step ahead once the segment is large: {grown:?}"
        );
        let doublings = (STEP / PREALLOCATE_AHEAD_MIN_BYTES).ilog2() as u64;
        assert!(
            grown.calls <= doublings + len / (STEP / 2) + 2,
            "{grown:?} for {len} bytes"
        );
    });
}

/// The same against ext4 (or whatever holds the temp dir) through io_uring: the active
/// segment's file has blocks allocated past its length while appends go on, and none once it
/// is closed; what was written reads back after a reopen.
#[test]
fn reserved_blocks_are_real_and_released_at_close() {
    use std::os::unix::fs::MetadataExt;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("reserve-0");
    let config = LogConfig {
        preallocate_step_bytes: 1 << 20,
        ..small_config(64 << 20, FlushPolicy::Never)
    };
    let log_file = dir.join("00000000000000000000.log");
    let allocated = |path: &Path| {
        let metadata = std::fs::metadata(path).unwrap();
        (metadata.len(), metadata.blocks() * 512)
    };
    tokio_uring::start(async {
        let mut log = open(&UringStorage, &dir, &config).await;
        let written = append_many(&mut log, 1_500, 1_000, 0).await;
        let (len, blocks) = allocated(&log_file);
        assert!(len > 2 << 20, "{len} bytes written");
        assert!(
            blocks >= len + (512 << 10),
            "{blocks} bytes of blocks for {len} bytes: nothing reserved ahead"
        );
        log.close(0).await.unwrap();
        let (len_after, blocks) = allocated(&log_file);
        assert_eq!(len_after, len);
        assert!(
            blocks < len + (64 << 10),
            "{blocks} bytes of blocks for {len} bytes after close"
        );
        let mut log = open(&UringStorage, &dir, &config).await;
        assert_eq!(read_all(&mut log, 0, 64 * 1024).await, written);
    });
}

fn arb_ops() -> impl Strategy<Value = Vec<(u8, u16, i64)>> {
    // (records in the batch, value length, timestamp jitter)
    proptest::collection::vec((1u8..8, 0u16..400, -50i64..50), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random appends, then reads at random offsets with random budgets, across rolls and a
    /// reopen, return exactly the records appended.
    #[test]
    fn random_appends_read_back_exactly(
        ops in arb_ops(),
        segment_bytes in 512u64..8192,
        reads in proptest::collection::vec((any::<prop::sample::Index>(), 1usize..5000), 1..30),
    ) {
        block_on(async {
            let storage = SimStorage::new(segment_bytes);
            let config = LogConfig {
                direct_writes: if segment_bytes % 2 == 0 { DirectWrites::Always } else { DirectWrites::Never },
                ..small_config(segment_bytes, FlushPolicy::Never)
            };
            let mut log = open(&storage, &sim_dir(), &config).await;
            let mut written = Vec::new();
            let mut clock = 10_000i64;
            for (at, (count, value_len, jitter)) in ops.iter().enumerate() {
                clock += 5;
                let records: Vec<Rec> = (0..*count)
                    .map(|i| Rec {
                        offset: 0,
                        timestamp_ms: clock + jitter + i64::from(i),
                        key: (i % 2 == 0).then(|| vec![i; 3]),
                        value: vec![at as u8; *value_len as usize],
                    })
                    .collect();
                let info = log.append(batch_from(&records), 0, 0).await.unwrap();
                for (i, mut record) in records.into_iter().enumerate() {
                    record.offset = info.base_offset + i as u64;
                    written.push(record);
                }
                if at == ops.len() / 2 {
                    log.close(0).await.unwrap();
                    log = open(&storage, &sim_dir(), &config).await;
                }
            }
            for (index, budget) in &reads {
                let offset = index.index(written.len());
                let bytes = log.read(offset as u64, *budget, u64::MAX).await.unwrap();
                let got = records_in(bytes);
                let first = got.iter().position(|r| r.offset == offset as u64).expect("holds the offset");
                let tail = &got[first..];
                assert_eq!(tail, &written[offset..offset + tail.len()]);
            }
            assert_eq!(read_all(&mut log, 0, 1024).await, written);
        });
    }

    /// A log that keeps its tail in memory (`always`) answers every read exactly as a log that
    /// reads its file (`never`) given the same appends: same bytes, same batch boundaries, same
    /// limits, across request groups, truncations, rolls and retention. One cached log has a
    /// budget of its own that holds every append until it is cut; another shares a small one
    /// with a neighbour that appends as much, so its oldest chunks leave to the neighbour's.
    #[test]
    fn reads_from_the_tail_cache_equal_reads_from_the_file(
        ops in proptest::collection::vec((0u8..10, 1u8..6, 0u16..300), 1..80),
        segment_bytes in 1024u64..8192,
        reads in proptest::collection::vec((any::<prop::sample::Index>(), 1usize..4000, any::<prop::sample::Index>()), 1..40),
    ) {
        block_on(async {
            let storage = SimStorage::new(segment_bytes);
            let open_with = |setting, dir: &'static str| {
                let storage = storage.clone();
                async move {
                    let config = LogConfig {
                        direct_writes: setting,
                        retention_bytes: Some(segment_bytes * 3),
                        ..small_config(segment_bytes, FlushPolicy::Never)
                    };
                    open(&storage, Path::new(dir), &config).await
                }
            };
            let mut cached = open_with(DirectWrites::Always, "/data/cached-0").await;
            let mut plain = open_with(DirectWrites::Never, "/data/plain-0").await;
            let shard_caches = TailCaches::new(3000);
            let mut squeezed = open_with(DirectWrites::Always, "/data/squeezed-0").await;
            squeezed.share_tail_cache(&shard_caches);
            let mut neighbour = open_with(DirectWrites::Always, "/data/neighbour-0").await;
            neighbour.share_tail_cache(&shard_caches);
            let batch = |tag: usize, count: u8, value_len: u16| {
                let records: Vec<Rec> = (0..count)
                    .map(|i| Rec {
                        offset: 0,
                        timestamp_ms: 1_000 + tag as i64,
                        key: None,
                        value: vec![tag as u8; value_len as usize + usize::from(i)],
                    })
                    .collect();
                batch_from(&records)
            };
            for (tag, (op, count, value_len)) in ops.iter().enumerate() {
                match op {
                    // A group of two requests, written with one IO.
                    0 | 1 => {
                        let group = || vec![(batch(tag, *count, *value_len), 0), (batch(tag + 1, 1, *value_len), 0)];
                        let a = cached.append_group(group(), 0).await;
                        let b = plain.append_group(group(), 0).await;
                        assert_eq!(a.len(), b.len());
                        squeezed.append_group(group(), 0).await;
                    }
                    // Cut the newest batches.
                    2 if cached.log_end_offset() > 2 => {
                        let to = cached.log_end_offset() - u64::from(*count).min(2);
                        assert_eq!(cached.truncate_to(to, 0).await.unwrap(), plain.truncate_to(to, 0).await.unwrap());
                        squeezed.truncate_to(to, 0).await.unwrap();
                    }
                    3 => {
                        let a = cached.enforce_retention(0, cached.log_end_offset()).await.unwrap();
                        let b = plain.enforce_retention(0, plain.log_end_offset()).await.unwrap();
                        assert_eq!(a.deleted_segments, b.deleted_segments);
                        squeezed.enforce_retention(0, squeezed.log_end_offset()).await.unwrap();
                    }
                    _ => {
                        let a = cached.append(batch(tag, *count, *value_len), 0, 0).await.unwrap();
                        let b = plain.append(batch(tag, *count, *value_len), 0, 0).await.unwrap();
                        assert_eq!(a.base_offset, b.base_offset);
                        squeezed.append(batch(tag, *count, *value_len), 0, 0).await.unwrap();
                    }
                }
                neighbour.append(batch(tag, *count, *value_len), 0, 0).await.unwrap();
                for log in [&cached, &squeezed] {
                    assert_eq!(log.log_end_offset(), plain.log_end_offset());
                    assert_eq!(log.log_start_offset(), plain.log_start_offset());
                }
                assert!(shard_caches.len() <= 3000);
            }
            let (start, end) = (cached.log_start_offset(), cached.log_end_offset());
            if end == start {
                return;
            }
            for (offset, budget, limit) in &reads {
                let offset = start + offset.index((end - start) as usize) as u64;
                let max_offset = offset + 1 + limit.index((end - offset) as usize) as u64;
                for a in [
                    cached.read(offset, *budget, max_offset).await.unwrap(),
                    squeezed.read(offset, *budget, max_offset).await.unwrap(),
                ] {
                let b = plain.read(offset, *budget, max_offset).await.unwrap();
                // A file read ends at its segment's end; the cache may go on into the next
                // segment's batches, within the same limits.
                assert!(a.starts_with(&b), "read({offset}, {budget}, {max_offset})");
                if a.len() > b.len() {
                    let mut continued = b.to_vec();
                    let mut next = records_in(b.clone()).last().map_or(offset, |r| r.offset + 1);
                    while continued.len() < a.len() {
                        let more = plain.read(next, *budget, max_offset).await.unwrap();
                        assert!(!more.is_empty());
                        next = records_in(more.clone()).last().unwrap().offset + 1;
                        continued.extend_from_slice(&more);
                    }
                    assert_eq!(&a[..], &continued[..a.len()], "read({offset}, {budget}, {max_offset})");
                    assert!(a.len() <= *budget, "several batches only within the budget");
                }
                let last = records_in(a.clone()).last().map(|r| r.offset);
                assert!(last.is_none_or(|last| last < max_offset));
                }
            }
        });
    }

    /// Timestamp lookups agree with a linear scan, including out-of-order timestamps.
    #[test]
    fn timestamp_lookup_agrees_with_linear_scan(
        ops in arb_ops(),
        targets in proptest::collection::vec(9_000i64..12_000, 1..20),
    ) {
        block_on(async {
            let storage = SimStorage::new(77);
            let mut log = open(&storage, &sim_dir(), &small_config(1024, FlushPolicy::Never)).await;
            let mut written = Vec::new();
            let mut clock = 10_000i64;
            for (count, value_len, jitter) in &ops {
                clock += 3;
                let records: Vec<Rec> = (0..*count)
                    .map(|i| Rec { offset: 0, timestamp_ms: clock + jitter * i64::from(i % 3), key: None, value: vec![1; *value_len as usize / 4] })
                    .collect();
                let info = log.append(batch_from(&records), 0, 0).await.unwrap();
                for (i, mut record) in records.into_iter().enumerate() {
                    record.offset = info.base_offset + i as u64;
                    written.push(record);
                }
            }
            for target in targets {
                let expected = written
                    .iter()
                    .find(|record| record.timestamp_ms >= target)
                    .map(|record| (record.offset, record.timestamp_ms));
                assert_eq!(log.offset_for_timestamp(target).await.unwrap(), expected, "target {target}");
            }
        });
    }
}

/// Index memory does not grow with the log: closed segments' indexes are loaded on demand into
/// a small cache, whatever the number of segments.
#[test]
fn index_memory_is_bounded_by_segment_size_not_log_size() {
    block_on(async {
        let storage = SimStorage::new(21);
        let config = small_config(2048, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let written = append_many(&mut log, 600, 100, 0).await;
        assert!(log.segment_count() > 100);
        // Read everything, touching every segment's index, and look up timestamps.
        assert_eq!(read_all(&mut log, 0, 300).await, written);
        for record in written.iter().step_by(97) {
            let found = log.offset_for_timestamp(record.timestamp_ms).await.unwrap();
            assert!(found.unwrap().1 >= record.timestamp_ms);
        }
        let per_segment = (2048 / 256) + 2;
        let bound = (1 + strata_node::log::INDEX_CACHE_SEGMENTS) * per_segment;
        assert!(
            log.index_entries() <= bound,
            "{} index entries in memory for {} segments (bound {bound})",
            log.index_entries(),
            log.segment_count()
        );
    });
}

/// A group of requests goes to disk in one vectored write; a bad request fails alone.
#[test]
fn append_group_writes_good_requests_and_rejects_bad_ones_alone() {
    block_on(async {
        let storage = SimStorage::new(22);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let mut damaged = batch_of(1, 2, 50, 0);
        let at = damaged.len() - 20;
        damaged[at] ^= 1;
        let requests = vec![
            (batch_of(0, 3, 50, 0), 7),
            (damaged, 7),
            (batch_of(2, 4, 50, 0), 7),
        ];
        let results = log.append_group(requests, 0).await;
        assert_eq!(results[0].as_ref().unwrap().base_offset, 0);
        assert_eq!(results[0].as_ref().unwrap().last_offset, 2);
        assert!(matches!(results[1], Err(LogError::CorruptBatch { .. })));
        assert_eq!(results[2].as_ref().unwrap().base_offset, 3);
        assert_eq!(results[2].as_ref().unwrap().last_offset, 6);
        let records = read_all(&mut log, 0, 1 << 20).await;
        assert_eq!(records.len(), 7);
        assert!(
            records[3].value.starts_with(b"2:0:"),
            "request 2 follows request 0 directly"
        );
        drop(log);
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(read_all(&mut log, 0, 1 << 20).await, records);
    });
}

/// The leader-epoch cache lives with the log: written before the first batch of each epoch,
/// cut with truncation, rebuilt from the batches when its file is lost, and stale epochs are
/// refused.
#[test]
fn leader_epochs_are_recorded_truncated_and_rebuilt() {
    block_on(async {
        let storage = SimStorage::new(77);
        let config = small_config(4096, FlushPolicy::Always);
        let mut log = open(&storage, &sim_dir(), &config).await;
        for (tag, epoch) in [(0, 1), (1, 1), (2, 3), (3, 3), (4, 7)] {
            log.append(batch_of(tag, 2, 300, 0), epoch, 0)
                .await
                .unwrap();
        }
        log.flush(0).await.unwrap();
        let expected = |log: &PartitionLog<SimStorage>| {
            log.epochs()
                .entries()
                .iter()
                .map(|e| (e.epoch, e.start_offset))
                .collect::<Vec<_>>()
        };
        assert_eq!(expected(&log), vec![(1, 0), (3, 4), (7, 8)]);
        assert!(matches!(
            log.append(batch_of(9, 1, 10, 0), 5, 0).await,
            Err(LogError::StaleEpoch {
                epoch: 5,
                latest: 7
            })
        ));
        drop(log);
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(expected(&log), vec![(1, 0), (3, 4), (7, 8)], "reopened");
        log.truncate_to(6, 0).await.unwrap();
        assert_eq!(expected(&log), vec![(1, 0), (3, 4)], "cut with the log");
        drop(log);
        storage.set_contents(&sim_dir().join("leader-epoch-checkpoint"), vec![1, 2, 3]);
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(
            expected(&log),
            vec![(1, 0), (3, 4)],
            "rebuilt from the batches"
        );
        log.restart_at(100, StateBelow::default(), 0).await.unwrap();
        assert_eq!(log.log_start_offset(), 100);
        assert_eq!(log.log_end_offset(), 100);
        assert!(log.epochs().entries().is_empty());
        let info = log.append(batch_of(10, 1, 10, 0), 8, 0).await.unwrap();
        assert_eq!(info.base_offset, 100);
        assert_eq!(expected(&log), vec![(8, 100)]);
    });
}

// ---- Idempotent producers -------------------------------------------------------------------

use strata_node::log::producers::{PRODUCER_EXPIRATION_MS, ProducerError, ProducerStates};
use strata_node::log::{PRODUCER_SNAPSHOT_FILE_NAME, StateBelow};
use strata_wire::batch::BatchBuilder;

/// One idempotent batch of `count` records: producer `producer_id` at `epoch`, sequences from
/// `sequence`, timestamps at `timestamp_ms`.
fn producer_batch(
    producer_id: i64,
    epoch: i16,
    sequence: i32,
    count: usize,
    timestamp_ms: i64,
) -> BytesMut {
    let mut builder = BatchBuilder::with_capacity(count * 64 + 256);
    builder.set_producer(producer_id, epoch, sequence);
    for i in 0..count {
        let value = format!("p{producer_id}:e{epoch}:s{}", sequence as usize + i);
        builder.push(timestamp_ms, None, value.as_bytes());
    }
    BytesMut::from(&builder.finish()[..])
}

fn duplicate_of(base_offset: u64, last_offset: u64) -> impl Fn(&AppendInfo) -> bool {
    move |info| {
        info.duplicate
            && info.base_offset == base_offset
            && info.last_offset == last_offset
            && info.bytes == 0
    }
}

/// The leader's rules, end to end through `append`: a retry is answered with the original
/// offsets and writes nothing; gaps, fenced epochs, a new epoch not starting at 0 and
/// multi-batch idempotent requests are refused, also writing nothing.
#[test]
fn idempotent_appends_detect_retries_gaps_and_fenced_epochs() {
    block_on(async {
        let storage = SimStorage::new(101);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let first = log
            .append(producer_batch(7, 0, 0, 3, 0), 1, 0)
            .await
            .unwrap();
        assert_eq!(
            (first.base_offset, first.last_offset, first.duplicate),
            (0, 2, false)
        );
        log.append(batch_of(1, 2, 10, 0), 1, 0).await.unwrap();
        let (end, size) = (log.log_end_offset(), log.size_bytes());
        let retry = log
            .append(producer_batch(7, 0, 0, 3, 0), 1, 0)
            .await
            .unwrap();
        assert!(duplicate_of(0, 2)(&retry), "{retry:?}");
        assert_eq!(
            (log.log_end_offset(), log.size_bytes()),
            (end, size),
            "nothing written"
        );

        let refused = [
            (
                producer_batch(7, 0, 4, 1, 0),
                "gap",
                LogError::Producer(ProducerError::OutOfOrderSequence {
                    producer_id: 7,
                    expected: 3,
                    got: 4,
                }),
            ),
            (
                producer_batch(7, 1, 3, 1, 0),
                "a new epoch starts at 0",
                LogError::Producer(ProducerError::OutOfOrderSequence {
                    producer_id: 7,
                    expected: 0,
                    got: 3,
                }),
            ),
        ];
        for (batch, why, expected) in refused {
            let error = log.append(batch, 1, 0).await.unwrap_err();
            assert_eq!(error.to_string(), expected.to_string(), "{why}");
        }
        assert_eq!(log.log_end_offset(), end);

        let next = log
            .append(producer_batch(7, 0, 3, 2, 0), 1, 0)
            .await
            .unwrap();
        assert_eq!((next.base_offset, next.last_offset), (5, 6));
        let bumped = log
            .append(producer_batch(7, 1, 0, 1, 0), 1, 0)
            .await
            .unwrap();
        assert_eq!(bumped.base_offset, 7);
        assert!(matches!(
            log.append(producer_batch(7, 0, 5, 1, 0), 1, 0).await,
            Err(LogError::Producer(ProducerError::ProducerFenced {
                producer_id: 7,
                epoch: 0,
                current_epoch: 1
            }))
        ));

        // Exactly one batch per idempotent request, whatever its neighbours are.
        for batches in [
            [producer_batch(8, 0, 0, 1, 0), producer_batch(8, 0, 1, 1, 0)],
            [batch_of(2, 1, 10, 0), producer_batch(8, 0, 0, 1, 0)],
            [producer_batch(8, 0, 0, 1, 0), batch_of(3, 1, 10, 0)],
        ] {
            let mut request = BytesMut::new();
            for batch in batches {
                request.extend_from_slice(&batch);
            }
            assert!(matches!(
                log.append(request, 1, 0).await,
                Err(LogError::InvalidProducerBatch(_))
            ));
        }
        assert!(matches!(
            log.append(producer_batch(9, -2, 0, 1, 0), 1, 0).await,
            Err(LogError::InvalidProducerBatch(_))
        ));
        assert_eq!(log.log_end_offset(), 8);
        assert!(
            log.producers().get(8).is_none(),
            "refused requests leave no state"
        );
        assert_eq!(read_all(&mut log, 0, 1 << 20).await.len(), 8);
    });
}

/// A group commit stamps its requests in order: a producer's second batch in the same group
/// continues its first, and a retry of a batch of the group is a duplicate of it.
#[test]
fn append_group_sees_the_producer_state_of_earlier_requests() {
    block_on(async {
        let storage = SimStorage::new(102);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let requests = vec![
            (producer_batch(7, 0, 0, 2, 0), 1),
            (batch_of(1, 1, 10, 0), 1),
            (producer_batch(7, 0, 2, 3, 0), 1),
            (producer_batch(7, 0, 0, 2, 0), 1),
            (producer_batch(7, 0, 9, 1, 0), 1),
            (producer_batch(7, 0, 2, 3, 0), 1),
        ];
        let results = log.append_group(requests, 0).await;
        let info = |at: usize| *results[at].as_ref().unwrap();
        assert_eq!((info(0).base_offset, info(0).last_offset), (0, 1));
        assert_eq!((info(2).base_offset, info(2).last_offset), (3, 5));
        assert!(!info(2).duplicate);
        assert!(duplicate_of(0, 1)(&info(3)));
        assert!(matches!(
            results[4],
            Err(LogError::Producer(ProducerError::OutOfOrderSequence {
                expected: 5,
                got: 9,
                ..
            }))
        ));
        assert!(duplicate_of(3, 5)(&info(5)));
        assert_eq!(log.log_end_offset(), 6);
        assert_eq!(read_all(&mut log, 0, 1 << 20).await.len(), 6);
    });
}

/// Appends idempotent batches of three producers across many small segments and returns the
/// offsets of each batch.
async fn append_producers<S: Storage>(
    log: &mut PartitionLog<S>,
    rounds: i32,
    timestamp_ms: i64,
) -> Vec<(i64, i32, AppendInfo)> {
    let mut appended = Vec::new();
    for round in 0..rounds {
        for producer_id in [1i64, 2, 3] {
            let count = 1 + (round as usize + producer_id as usize) % 3;
            let sequence = log
                .producers()
                .get(producer_id)
                .map_or(0, |entry| entry.last().unwrap().last_seq + 1);
            let batch = producer_batch(producer_id, 0, sequence, count, timestamp_ms);
            let info = log.append(batch, 1, 0).await.unwrap();
            assert!(!info.duplicate);
            appended.push((producer_id, sequence, info));
        }
        log.append(batch_of(round as u64, 2, 200, 0), 1, 0)
            .await
            .unwrap();
    }
    appended
}

/// Every retained batch of `appended` is a duplicate in `log`.
async fn assert_retries_are_duplicates<S: Storage>(
    log: &mut PartitionLog<S>,
    appended: &[(i64, i32, AppendInfo)],
    why: &str,
) {
    let end = log.log_end_offset();
    for &(producer_id, sequence, info) in appended.iter().rev().take(3 * 5) {
        let count = (info.last_offset - info.base_offset + 1) as usize;
        let retry = producer_batch(producer_id, 0, sequence, count, 0);
        let answer = log.append(retry, 1, 0).await.unwrap();
        assert!(
            duplicate_of(info.base_offset, info.last_offset)(&answer),
            "{why}: producer {producer_id} seq {sequence}: {answer:?}"
        );
    }
    assert_eq!(log.log_end_offset(), end, "{why}: retries wrote nothing");
}

/// The state survives a clean close (from the snapshot alone), a crash with a snapshot older
/// than the log end (snapshot plus a scan of the tail), a lost or damaged snapshot (a scan of
/// the whole log) and a snapshot past the log end (discarded, whole scan).
#[test]
fn producer_state_survives_close_crashes_and_bad_snapshots() {
    block_on(async {
        let storage = SimStorage::new(103);
        let config = small_config(4096, FlushPolicy::Always);
        let snapshot_path = sim_dir().join(PRODUCER_SNAPSHOT_FILE_NAME);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let appended = append_producers(&mut log, 30, 0).await;
        assert!(log.segment_count() > 3, "segments rolled");
        let expected: ProducerStates = log.producers().clone();
        assert_eq!(expected.len(), 3);
        let end = log.log_end_offset();
        log.close(0).await.unwrap();
        let snapshot = storage.contents(&snapshot_path).unwrap();
        assert_eq!(ProducerStates::decode(&snapshot).unwrap().offset, end);

        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.producers(), &expected, "from the snapshot");
        assert_retries_are_duplicates(&mut log, &appended, "after close").await;

        // More batches, synced, then a crash without close: the snapshot on disk is the last
        // roll's, and the tail after it is scanned.
        let more = append_producers(&mut log, 10, 0).await;
        log.flush(0).await.unwrap();
        let expected = log.producers().clone();
        let end = log.log_end_offset();
        drop(log);
        storage.crash();
        let stale = ProducerStates::decode(&storage.contents(&snapshot_path).unwrap()).unwrap();
        assert!(stale.offset < end, "the snapshot predates the tail");
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.producers(), &expected, "snapshot plus scan");
        assert_retries_are_duplicates(&mut log, &more, "after a crash").await;
        drop(log);

        // Damaged, or missing: the whole log is scanned.
        for damage in [vec![0xAB; 40], Vec::new()] {
            storage.set_contents(&snapshot_path, damage);
            let mut log = open(&storage, &sim_dir(), &config).await;
            assert_eq!(log.producers(), &expected, "whole scan");
            assert_retries_are_duplicates(&mut log, &more, "after a whole scan").await;
        }

        // A snapshot from the future (its batches were cut) is discarded, durably.
        let log = open(&storage, &sim_dir(), &config).await;
        log.close(0).await.unwrap();
        let future = storage.contents(&snapshot_path).unwrap();
        let mut log = open(&storage, &sim_dir(), &config).await;
        let cut = more[20].2.base_offset;
        log.truncate_to(cut, 0).await.unwrap();
        let after_cut = log.producers().clone();
        drop(log);
        storage.set_contents(&snapshot_path, future);
        let log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(
            log.producers(),
            &after_cut,
            "the future snapshot was ignored"
        );
        assert!(
            storage.contents(&snapshot_path).unwrap().is_empty(),
            "and discarded"
        );
    });
}

/// Truncation forgets the producer state of the cut batches: a retry of a cut batch is written
/// again, a retry of a kept one is still a duplicate. Restarting empty forgets everything.
#[test]
fn truncation_forgets_the_cut_batches() {
    block_on(async {
        let storage = SimStorage::new(104);
        let config = small_config(512, FlushPolicy::Never);
        let snapshot_path = sim_dir().join(PRODUCER_SNAPSHOT_FILE_NAME);
        let mut log = open(&storage, &sim_dir(), &config).await;
        for sequence in 0..12 {
            log.append(producer_batch(5, 0, sequence, 1, 0), 1, 0)
                .await
                .unwrap();
        }
        let snapshot = ProducerStates::decode(&storage.contents(&snapshot_path).unwrap()).unwrap();
        // A cut above the last roll's snapshot keeps it (state = snapshot + scan up to the cut).
        let cut = snapshot.offset + 1;
        assert!(
            (3..12).contains(&cut),
            "a roll took a snapshot at {}",
            snapshot.offset
        );
        log.truncate_to(cut, 0).await.unwrap();
        assert!(!storage.contents(&snapshot_path).unwrap().is_empty());
        let sequence = cut as i32;
        assert_eq!(
            log.producers().get(5).unwrap().last().unwrap().last_seq,
            sequence - 1
        );
        let retried = log
            .append(producer_batch(5, 0, sequence, 1, 0), 1, 0)
            .await
            .unwrap();
        assert_eq!((retried.base_offset, retried.duplicate), (cut, false));
        let kept = log
            .append(producer_batch(5, 0, sequence - 1, 1, 0), 1, 0)
            .await
            .unwrap();
        assert!(duplicate_of(cut - 1, cut - 1)(&kept));
        // Cut below the last roll's snapshot: it goes, and a reopen agrees.
        log.truncate_to(2, 0).await.unwrap();
        assert!(storage.contents(&snapshot_path).unwrap().is_empty());
        assert_eq!(log.producers().get(5).unwrap().last().unwrap().last_seq, 1);
        let expected = log.producers().clone();
        drop(log);
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.producers(), &expected);
        log.restart_at(50, StateBelow::default(), 0).await.unwrap();
        assert!(log.producers().is_empty());
        drop(log);
        let log = open(&storage, &sim_dir(), &config).await;
        assert!(
            log.producers().is_empty(),
            "nothing comes back after a restart"
        );
    });
}

/// A follower applies the leader's batches verbatim and ends with the leader's state, so it
/// detects retries once it leads.
#[test]
fn a_follower_builds_the_leaders_producer_state() {
    block_on(async {
        let storage = SimStorage::new(105);
        let config = small_config(4096, FlushPolicy::Never);
        let mut leader = open(&storage, &PathBuf::from("/data/leader"), &config).await;
        let appended = append_producers(&mut leader, 20, 0).await;
        let mut follower = open(&storage, &PathBuf::from("/data/follower"), &config).await;
        let mut next = 0;
        while next < leader.log_end_offset() {
            let bytes = leader.read(next, 2048, u64::MAX).await.unwrap();
            let info = follower.append_replicated(bytes, 0).await.unwrap();
            next = info.last_offset + 1;
        }
        assert_eq!(follower.producers(), leader.producers());
        assert_retries_are_duplicates(&mut follower, &appended, "on the new leader").await;
    });
}

/// Producers idle for longer than the expiration are forgotten when a snapshot is taken, and a
/// forgotten producer may start at any sequence.
#[test]
fn idle_producers_expire() {
    block_on(async {
        let storage = SimStorage::new(106);
        let config = small_config(1 << 20, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        log.append(producer_batch(1, 0, 0, 1, 1_000), 1, 0)
            .await
            .unwrap();
        log.append(producer_batch(2, 0, 0, 1, 5_000), 1, 0)
            .await
            .unwrap();
        log.close(1_000 + PRODUCER_EXPIRATION_MS).await.unwrap();
        let mut log = PartitionLog::open(storage.clone(), sim_dir(), config, 2_000)
            .await
            .unwrap()
            .0;
        assert!(log.producers().get(1).is_none(), "expired");
        assert!(log.producers().get(2).is_some());
        // An expired producer cannot resume mid-sequence (its first batch back could have
        // overtaken an earlier one); it comes back at a new epoch, from sequence 0.
        assert!(matches!(
            log.append(producer_batch(1, 0, 77, 1, 3_000), 1, 0).await,
            Err(LogError::Producer(ProducerError::OutOfOrderSequence {
                expected: 0,
                got: 77,
                ..
            }))
        ));
        let info = log
            .append(producer_batch(1, 1, 0, 1, 3_000), 1, 0)
            .await
            .unwrap();
        assert!(!info.duplicate);
    });
}

/// With `flush=always`, a retry is answered no earlier than its original is durable: a retry
/// in the original's group fails with the original when their sync fails, and a group made
/// only of retries still gets answered.
#[test]
fn duplicates_wait_for_the_original_to_be_durable() {
    block_on(async {
        let storage = SimStorage::new(107);
        let config = small_config(1 << 20, FlushPolicy::Always);
        let log = open(&storage, &sim_dir(), &config).await;
        let handle = writer::spawn(log, Clock::with_wall_ms(|| 0));
        // Original and retry queued together: one group, one sync, which fails.
        storage.fail(FaultOp::Sync, 0);
        let original = handle.append(producer_batch(3, 0, 0, 2, 0), 1);
        let retry = handle.append(producer_batch(3, 0, 0, 2, 0), 1);
        let (original, retry) = futures_util::future::join(original, retry).await;
        assert!(
            matches!(original, Err(LogError::Failed { .. })),
            "{original:?}"
        );
        assert!(
            matches!(retry, Err(LogError::Failed { .. })),
            "the retry was not answered before the sync: {retry:?}"
        );
        drop(handle);

        let log = open(&storage, &sim_dir(), &config).await;
        assert!(
            log.producers().is_empty(),
            "the failed group never reached the disk"
        );
        let handle = writer::spawn(log, Clock::with_wall_ms(|| 0));
        let (original, retry) = futures_util::future::join(
            handle.append(producer_batch(3, 0, 0, 2, 0), 1),
            handle.append(producer_batch(3, 0, 0, 2, 0), 1),
        )
        .await;
        let (original, retry) = (original.unwrap(), retry.unwrap());
        assert!(!original.duplicate);
        assert!(duplicate_of(original.base_offset, original.last_offset)(
            &retry
        ));
        // A later group of retries only: answered at once, the original being durable.
        for _ in 0..3 {
            let retry = handle
                .append(producer_batch(3, 0, 0, 2, 0), 1)
                .await
                .unwrap();
            assert!(retry.duplicate);
        }
        assert_eq!(handle.offsets().await.unwrap().durable, 2);
        handle.close().await.unwrap();
    });
}

/// The producer state of whatever a log holds, computed from its batches alone.
async fn producer_model<S: Storage>(log: &mut PartitionLog<S>) -> ProducerStates {
    let mut states = ProducerStates::default();
    let mut next = log.log_start_offset();
    while next < log.log_end_offset() {
        let bytes = log.read(next, 1 << 16, u64::MAX).await.unwrap();
        for batch in strata_wire::batch::split_batches(bytes) {
            let batch = batch.unwrap();
            if batch.header().is_idempotent() {
                states.apply(batch.header());
            }
            next = batch.last_offset() + 1;
        }
    }
    states
}

/// Crashes at random points (lost, reordered and torn unsynced writes, snapshots taken on
/// rolls in between): after recovery the producer state is exactly what the surviving batches
/// say, and every acknowledged (synced) batch's retry is a duplicate.
#[test]
fn simulated_crashes_rebuild_the_producer_state_of_the_surviving_batches() {
    for seed in 0..300u64 {
        block_on(async {
            let storage = SimStorage::new(seed);
            let config = small_config(1024 + 64 * (seed % 16), FlushPolicy::Always);
            let mut log = open(&storage, &sim_dir(), &config).await;
            let mut acknowledged = Vec::new();
            let mut unsynced = Vec::new();
            let mut sequences = [0i32; 3];
            for step in 0..(10 + seed % 50) {
                let producer = (step * 7 + seed) % 3;
                let count = 1 + ((step + seed) % 4) as usize;
                let sequence = sequences[producer as usize];
                let batch = producer_batch(producer as i64, 0, sequence, count, 0);
                let info = log.append(batch, 1, 0).await.unwrap();
                sequences[producer as usize] += count as i32;
                unsynced.push((producer as i64, sequence, info));
                if (step + seed) % 4 == 0 {
                    log.flush(0).await.unwrap();
                    acknowledged.append(&mut unsynced);
                }
            }
            drop(log);
            if seed % 2 == 0 {
                storage.crash();
            } else {
                storage.crash_reordered();
            }
            let mut log = open(&storage, &sim_dir(), &config).await;
            let model = producer_model(&mut log).await;
            assert_eq!(log.producers(), &model, "seed {seed}");
            // The last five per producer are retained; retry the acknowledged ones among them.
            let end = log.log_end_offset();
            for &(producer_id, sequence, info) in &acknowledged {
                let entry = model
                    .get(producer_id)
                    .expect("acknowledged producers survive");
                if !entry.batches().iter().any(|b| b.first_seq == sequence) {
                    continue;
                }
                let count = (info.last_offset - info.base_offset + 1) as usize;
                let retry = producer_batch(producer_id, 0, sequence, count, 0);
                let answer = log.append(retry, 1, 0).await.unwrap();
                assert!(
                    duplicate_of(info.base_offset, info.last_offset)(&answer),
                    "seed {seed}: {answer:?} for {info:?}"
                );
            }
            assert_eq!(log.log_end_offset(), end, "seed {seed}");
        });
    }
}

/// One transactional batch of `count` records (see [`producer_batch`]).
fn txn_batch(producer_id: i64, epoch: i16, sequence: i32, count: usize) -> BytesMut {
    let mut builder = BatchBuilder::with_capacity(count * 64 + 256);
    builder.set_producer(producer_id, epoch, sequence);
    builder.set_attributes(strata_wire::batch::attributes::TRANSACTIONAL);
    for i in 0..count {
        builder.push(
            0,
            None,
            format!("t{producer_id}:{}", sequence as usize + i).as_bytes(),
        );
    }
    BytesMut::from(&builder.finish()[..])
}

/// The partition's transactions as its log records them: the LSO waits below the first open
/// one; markers close them (an abort is kept for `read_committed` fetches); a marker at a newer
/// epoch fences the older producer, and one at an older epoch is refused; producers may not
/// send markers. The state is the same after a close, a crash, a lost snapshot, on a follower
/// that copied the log, and a truncation below a marker reopens its transaction.
#[test]
fn transactions_follow_the_log_through_restarts_followers_and_truncation() {
    use strata_node::log::transactions::AbortedTxn;
    use strata_wire::batch::BatchError;
    block_on(async {
        let storage = SimStorage::new(107);
        let config = small_config(512, FlushPolicy::Always);
        let snapshot_path = sim_dir().join(PRODUCER_SNAPSHOT_FILE_NAME);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let lso = |log: &PartitionLog<SimStorage>| {
            log.producers()
                .transactions()
                .last_stable_offset(log.log_end_offset())
        };
        log.append(producer_batch(9, 0, 0, 2, 0), 1, 0)
            .await
            .unwrap(); // 0..=1
        assert_eq!(lso(&log), 2, "no transaction: the log end");
        let first = log.append(txn_batch(1, 0, 0, 3), 1, 0).await.unwrap(); // 2..=4
        log.append(txn_batch(3, 0, 0, 2), 1, 0).await.unwrap(); // 5..=6
        log.append(producer_batch(9, 0, 2, 1, 0), 1, 0)
            .await
            .unwrap(); // 7
        assert_eq!((first.base_offset, lso(&log)), (2, 2));
        log.append(txn_batch(1, 0, 3, 1), 1, 0).await.unwrap(); // 8
        let refused = log
            .append(
                BytesMut::from(&strata_wire::batch::marker(1, 0, true, 0, 0)[..]),
                1,
                0,
            )
            .await;
        assert!(
            matches!(
                refused,
                Err(LogError::CorruptBatch {
                    source: BatchError::ControlBatch,
                    ..
                })
            ),
            "a producer's marker: {refused:?}"
        );
        let abort = append_marker(&mut log, 1, 0, false).await.unwrap(); // 9
        assert_eq!((abort, lso(&log)), (9, 5), "producer 3's is next");
        append_marker(&mut log, 3, 0, true).await.unwrap(); // 10
        assert_eq!(lso(&log), 11);
        let aborted = AbortedTxn {
            producer_id: 1,
            first_offset: 2,
            last_offset: 9,
        };
        assert_eq!(log.producers().transactions().aborted(), [aborted]);
        // Producer 1 goes on at its epoch after the abort, its sequences continuing.
        log.append(txn_batch(1, 0, 4, 1), 1, 0).await.unwrap(); // 11
        // The coordinator fences it (a timeout): the abort comes at epoch 1.
        append_marker(&mut log, 1, 1, false).await.unwrap(); // 12
        let fenced = log.append(txn_batch(1, 0, 5, 1), 1, 0).await;
        assert!(
            matches!(
                fenced,
                Err(LogError::Producer(ProducerError::ProducerFenced { .. }))
            ),
            "{fenced:?}"
        );
        let stale = append_marker(&mut log, 1, 0, true).await;
        assert!(
            matches!(
                stale,
                Err(LogError::Producer(ProducerError::ProducerFenced { .. }))
            ),
            "{stale:?}"
        );
        // The new epoch's sequences start at 0.
        log.append(txn_batch(1, 1, 0, 2), 1, 0).await.unwrap(); // 13..=14
        assert_eq!(lso(&log), 13);
        // Producer 3's next transaction ends with a marker of a coordinator that took its id
        // over (coordinator epoch 5): a late marker of the coordinator before is refused.
        log.append(txn_batch(3, 0, 2, 1), 1, 0).await.unwrap(); // 15
        append_marker_from(&mut log, (3, 0), true, 5).await.unwrap(); // 16
        let stale = append_marker_from(&mut log, (3, 0), false, 4).await;
        assert!(
            matches!(
                stale,
                Err(LogError::Producer(ProducerError::CoordinatorFenced {
                    producer_id: 3,
                    coordinator_epoch: 4,
                    current: 5
                }))
            ),
            "{stale:?}"
        );
        // The same coordinator again is taken (with nothing open it changes nothing).
        append_marker_from(&mut log, (3, 0), false, 5)
            .await
            .unwrap(); // 17
        assert!(log.segment_count() > 2, "segments rolled");
        let expected = log.producers().clone();
        assert_eq!(expected.transactions().aborted().len(), 2);

        // A follower copying the log ends with the same state.
        let mut follower = open(&storage, &PathBuf::from("/data/follower"), &config).await;
        let mut next = 0;
        while next < log.log_end_offset() {
            let bytes = log.read(next, 256, u64::MAX).await.unwrap();
            next = follower
                .append_replicated(bytes, 0)
                .await
                .unwrap()
                .last_offset
                + 1;
        }
        assert_eq!(follower.producers(), &expected, "on a follower");

        // Close (snapshot), crash (snapshot and scan), no snapshot (whole scan).
        log.close(0).await.unwrap();
        let log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.producers(), &expected, "from the snapshot");
        drop(log);
        storage.crash();
        let log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.producers(), &expected, "after a crash");
        drop(log);
        storage.set_contents(&snapshot_path, Vec::new());
        let mut log = open(&storage, &sim_dir(), &config).await;
        assert_eq!(log.producers(), &expected, "from the log alone");

        // A cut below producer 3's commit reopens its transaction.
        log.truncate_to(10, 0).await.unwrap();
        assert_eq!(lso(&log), 5);
        assert!(log.producers().transactions().open().contains_key(&3));
        // Records deleted below the abort's marker: it is forgotten.
        log.delete_records_before(10, 0).await.unwrap();
        assert_eq!(log.producers().transactions().aborted(), []);
    });
}

/// Conditional appends: a request is written only where the log ends as it expects, judged in
/// turn within a group (two writers expecting the same end: the first wins, the second learns
/// the new end, nothing of it written); an idempotent retry of one that was written is
/// answered as the duplicate it is, though the log has moved on.
#[test]
fn a_conditional_append_is_written_only_where_the_log_ends_as_expected() {
    use strata_node::log::AppendSource;
    block_on(async {
        let storage = SimStorage::new(211);
        let config = small_config(4096, FlushPolicy::Never);
        let mut log = open(&storage, &sim_dir(), &config).await;
        let at = |expected: u64, batch: BytesMut| (batch, 0, AppendSource::ProducerAt(expected));
        let results = log
            .append_group_from(
                vec![
                    at(0, batch_of(1, 2, 10, 0)),
                    at(0, batch_of(2, 1, 10, 0)),
                    at(2, batch_of(3, 1, 10, 0)),
                ],
                0,
            )
            .await;
        assert_eq!(results[0].as_ref().unwrap().base_offset, 0);
        assert!(
            matches!(
                results[1],
                Err(LogError::LogEndMismatch {
                    expected: 0,
                    log_end: 2
                })
            ),
            "{:?}",
            results[1]
        );
        assert_eq!(results[2].as_ref().unwrap().base_offset, 2);
        assert_eq!(log.log_end_offset(), 3, "the refused request wrote nothing");
        let values: Vec<Vec<u8>> = records_in(log.read(0, 1 << 20, u64::MAX).await.unwrap())
            .into_iter()
            .map(|record| record.value)
            .collect();
        assert_eq!(
            values,
            [&b"1:0:xxxxxx"[..], b"1:1:xxxxxx", b"3:0:xxxxxx"].map(<[u8]>::to_vec)
        );

        // An idempotent producer's conditional append, then its retry after the log moved on.
        let won = log
            .append_group_from(vec![at(3, producer_batch(9, 0, 0, 2, 0))], 0)
            .await;
        assert_eq!(won[0].as_ref().unwrap().base_offset, 3);
        log.append(batch_of(4, 1, 10, 0), 0, 0).await.unwrap();
        let retried = log
            .append_group_from(vec![at(3, producer_batch(9, 0, 0, 2, 0))], 0)
            .await;
        let retried = retried[0].as_ref().unwrap();
        assert!(retried.duplicate, "{retried:?}");
        assert_eq!((retried.base_offset, retried.last_offset), (3, 4));
        // Its next batch, expecting a stale end, is refused and leaves the producer's sequence
        // where it was.
        let stale = log
            .append_group_from(vec![at(3, producer_batch(9, 0, 2, 1, 0))], 0)
            .await;
        assert!(matches!(
            stale[0],
            Err(LogError::LogEndMismatch { log_end: 6, .. })
        ));
        let next = log
            .append_group_from(vec![at(6, producer_batch(9, 0, 2, 1, 0))], 0)
            .await;
        assert_eq!(next[0].as_ref().unwrap().base_offset, 6);
    });
}

/// A tiered partition keeps the producer state at each segment's end, taken as it rolls and
/// before the batches that made it roll count (`<offset>.snapshot`), and removes it with the
/// segment it starts. A log started over at that offset with it and the epochs below knows
/// the producers: a retry of their last batch is a duplicate and their next sequence goes on.
#[test]
fn a_tiered_log_keeps_the_producer_state_at_each_segment_end_for_a_restart_there() {
    block_on(async {
        let storage = SimStorage::new(107);
        let mut config = small_config(4096, FlushPolicy::Always);
        config.remote_storage = true;
        let mut log = open(&storage, &sim_dir(), &config).await;
        let appended = append_producers(&mut log, 12, 0).await;
        let bases = log.segment_bases();
        assert!(bases.len() >= 3, "rolled: {bases:?}");
        let snapshot_at = |base: u64| sim_dir().join(format!("{base:020}.snapshot"));
        for &base in &bases[1..] {
            let bytes = storage
                .contents(&snapshot_at(base))
                .expect("a snapshot per roll");
            let snapshot = ProducerStates::decode(&bytes).unwrap();
            assert_eq!(snapshot.offset, base, "the state at the segment's base");
            for (producer_id, entry) in snapshot.states.iter() {
                let last = entry.last().unwrap();
                assert!(
                    last.last_offset < base,
                    "producer {producer_id} counts a batch at or past {base}"
                );
            }
        }
        // Restarted at the second segment's base with what lay below it.
        let base = bases[1];
        let below = StateBelow {
            producer_snapshot: storage.contents(&snapshot_at(base)).map(Bytes::from),
            epochs: log.epochs().entries().to_vec(),
        };
        let expected = ProducerStates::decode(below.producer_snapshot.as_deref().unwrap())
            .unwrap()
            .states;
        let other = sim_dir().join("other");
        let mut restarted = open(&storage, &other, &config).await;
        restarted.restart_at(base, below, 0).await.unwrap();
        assert_eq!(restarted.producers(), &expected);
        assert_eq!(
            restarted
                .epochs()
                .entries()
                .iter()
                .map(|e| e.epoch)
                .collect::<Vec<_>>(),
            vec![1]
        );
        let (producer_id, sequence, info) = appended
            .iter()
            .rev()
            .find(|(_, _, info)| info.last_offset < base)
            .copied()
            .unwrap();
        let count = (info.last_offset - info.base_offset + 1) as usize;
        let retry = restarted
            .append(producer_batch(producer_id, 0, sequence, count, 0), 1, 0)
            .await
            .unwrap();
        assert!(
            duplicate_of(info.base_offset, info.last_offset)(&retry),
            "{retry:?}"
        );
        let next = producer_batch(producer_id, 0, sequence + count as i32, 1, 0);
        let info = restarted.append(next, 1, 0).await.unwrap();
        assert_eq!(
            info.base_offset, base,
            "the producer's next sequence goes on"
        );

        // A snapshot for another offset is not taken.
        let mut restarted = open(&storage, &sim_dir().join("third"), &config).await;
        let wrong = StateBelow {
            producer_snapshot: storage.contents(&snapshot_at(bases[2])).map(Bytes::from),
            epochs: Vec::new(),
        };
        restarted.restart_at(base, wrong, 0).await.unwrap();
        assert!(restarted.producers().is_empty());

        // Retention removes a segment's start snapshot with it.
        log.delete_records_before(bases[2], 0).await.unwrap();
        assert!(storage.contents(&snapshot_at(bases[1])).is_none());
        assert!(storage.contents(&snapshot_at(bases[2])).is_some());
    });
}
