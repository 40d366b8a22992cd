//! Log compaction on the simulated storage: what a clean keeps, and that a crash at any step of
//! one leaves the log as before it or as after it.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::BytesMut;
use common::{append_marker, block_on};
use strata_node::io::Storage;
use strata_node::io::sim::SimStorage;
use strata_node::log::cleaner::{OffsetMap, clean};
use strata_node::log::{
    CleanupPolicy, CompactionConfig, FlushPolicy, LogConfig, PartitionLog, SwapReport,
};
use strata_wire::batch::{BatchBuilder, kafka, split_batches};

const DIR: &str = "/data/topic-0";
const DELETE_RETENTION_MS: i64 = 1_000;

fn config() -> LogConfig {
    LogConfig {
        cleanup: CleanupPolicy::COMPACT,
        compaction: CompactionConfig {
            min_cleanable_dirty_ratio: 0.0,
            delete_retention_ms: DELETE_RETENTION_MS,
            ..CompactionConfig::default()
        },
        ..common::small_config(2 << 10, FlushPolicy::Never)
    }
}

/// A keyed record as read back: offset, key, value (`None`: a tombstone).
type Read = (u64, Vec<u8>, Option<Vec<u8>>);

/// One batch of keyed records (a `None` value is a tombstone). About half the batches (by
/// their content, so a test writes the same log every time) are Kafka batches as a Kafka
/// producer sends them, zstd-compressed: the cleaner meets both formats, and must leave each a
/// valid batch of its own format.
fn keyed_batch(records: &[(&str, Option<&str>)], timestamp_ms: i64) -> BytesMut {
    let content: usize = records
        .iter()
        .map(|(key, value)| key.bytes().map(usize::from).sum::<usize>() + value.map_or(1, str::len))
        .sum();
    if content % 2 == 1 {
        return kafka_keyed_batch(records, timestamp_ms);
    }
    let mut builder = BatchBuilder::default();
    for (key, value) in records {
        builder.push_nullable(
            timestamp_ms,
            Some(key.as_bytes()),
            value.map(str::as_bytes),
            std::iter::empty(),
        );
    }
    BytesMut::from(&builder.finish()[..])
}

fn kafka_keyed_batch(records: &[(&str, Option<&str>)], timestamp_ms: i64) -> BytesMut {
    common::kafka_batch(
        records
            .iter()
            .map(|(key, value)| (Some(key.as_bytes()), value.map(str::as_bytes), timestamp_ms)),
        kafka::KafkaCodec::Zstd,
    )
}

/// Every record from the log start, checking that batches tile the offsets and that records'
/// offsets only grow.
async fn read_all<S: Storage>(log: &mut PartitionLog<S>) -> Vec<Read> {
    let mut out: Vec<Read> = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let bytes = log.read(offset, 1 << 20, u64::MAX).await.unwrap();
        assert!(
            !bytes.is_empty(),
            "a read below the log end returns a batch"
        );
        for batch in split_batches(bytes) {
            let batch = batch.unwrap();
            if batch.last_offset() < offset {
                continue;
            }
            assert_eq!(batch.base_offset(), offset, "batches tile the offsets");
            for record in batch.records() {
                assert!(out.last().is_none_or(|last| last.0 < record.offset));
                out.push((
                    record.offset,
                    record.key.unwrap().to_vec(),
                    record.nullable_value().map(<[u8]>::to_vec),
                ));
            }
            offset = batch.last_offset() + 1;
        }
    }
    out
}

/// Each key's last write: (offset, value).
fn last_writes(records: &[Read]) -> BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)> {
    records
        .iter()
        .map(|(offset, key, value)| (key.clone(), (*offset, value.clone())))
        .collect()
}

/// Runs one clean (if the log plans one) and swaps it in.
async fn clean_once<S: Storage>(
    log: &mut PartitionLog<S>,
    now_ms: i64,
    map_bytes: usize,
) -> Option<SwapReport> {
    let plan = log.plan_clean(now_ms, log.log_end_offset())?;
    let (_, outcome) = clean(plan, OffsetMap::with_memory(map_bytes), &mut None).await;
    Some(log.finish_clean(outcome.ok()?, now_ms).await.unwrap())
}

/// 20 keys written 10 times each, one record per batch, then tombstones for keys 0-2, then
/// enough of another key to close the segment holding them.
async fn fill<S: Storage>(log: &mut PartitionLog<S>, now_ms: i64) -> Vec<Read> {
    for round in 0..10 {
        for key in 0..20 {
            let value = format!("v{round}-{key}");
            let batch = keyed_batch(&[(&format!("key{key}"), Some(&value))], now_ms);
            log.append(batch, 0, now_ms).await.unwrap();
        }
    }
    for key in 0..3 {
        let batch = keyed_batch(&[(&format!("key{key}"), None)], now_ms);
        log.append(batch, 0, now_ms).await.unwrap();
    }
    for round in 0..40 {
        let value = format!("filler-{round}");
        let batch = keyed_batch(
            &[("filler", Some(&value)), ("filler", Some(&value))],
            now_ms,
        );
        log.append(batch, 0, now_ms).await.unwrap();
    }
    read_all(log).await
}

#[test]
fn a_clean_keeps_each_keys_last_record_at_its_offset_and_tombstones_until_their_horizon() {
    block_on(async {
        let storage = SimStorage::new(1);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let now = 1_000_000;
        let written = fill(&mut log, now).await;
        let expected = last_writes(&written);
        let segments_before = log.segment_count();
        let log_end = log.log_end_offset();
        let report = clean_once(&mut log, now, 1 << 20)
            .await
            .expect("a clean is due");
        assert!(
            report.swapped > 0 && report.bytes_after < report.bytes_before,
            "{report:?}"
        );
        assert!(log.segment_count() <= segments_before);
        assert_eq!(log.log_end_offset(), log_end);
        let cleaned = read_all(&mut log).await;
        assert_eq!(
            last_writes(&cleaned),
            expected,
            "every key keeps its last write"
        );
        let clean_offset = log.clean_offset();
        assert!(clean_offset > 0);
        // Below the clean offset each key appears once; above it nothing was touched.
        let below: Vec<&Read> = cleaned.iter().filter(|r| r.0 < clean_offset).collect();
        let keys: std::collections::BTreeSet<&Vec<u8>> = below.iter().map(|r| &r.1).collect();
        assert_eq!(
            keys.len(),
            below.len(),
            "one record per key below the clean offset"
        );
        let above = |records: &[Read]| -> Vec<Read> {
            records
                .iter()
                .filter(|r| r.0 >= clean_offset)
                .cloned()
                .collect()
        };
        assert_eq!(above(&cleaned), above(&written));
        let tombstones = |records: &[Read]| records.iter().filter(|r| r.2.is_none()).count();
        assert_eq!(
            tombstones(&cleaned),
            3,
            "tombstones stay until their horizon"
        );

        // Reopened, the log reads the same.
        log.close(now).await.unwrap();
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), now)
            .await
            .unwrap();
        assert_eq!(read_all(&mut log).await, cleaned);
        assert_eq!(log.clean_offset(), clean_offset);

        // Past the delete horizon, the next clean removes the tombstones (and their keys).
        let later = now + DELETE_RETENTION_MS + 1;
        // Enough of another key to close three more segments, whatever the batches' formats.
        let segments = log.segment_count();
        for round in 0.. {
            if log.segment_count() >= segments + 3 {
                break;
            }
            let value = format!("more-{round}");
            let batch = keyed_batch(&[("other", Some(&value)), ("other", Some(&value))], later);
            log.append(batch, 0, later).await.unwrap();
        }
        let before_second = read_all(&mut log).await;
        let cleaned_segments = log.segment_count();
        let report = clean_once(&mut log, later, 1 << 20)
            .await
            .expect("a clean is due");
        assert!(
            report.replaced > report.swapped,
            "small cleaned segments merge: {report:?}"
        );
        assert!(log.segment_count() < cleaned_segments);
        let second = read_all(&mut log).await;
        assert_eq!(tombstones(&second), 0, "{second:?}");
        let mut expected = last_writes(&before_second);
        expected.retain(|_, (_, value)| value.is_some());
        let mut got = last_writes(&second);
        got.retain(|key, _| expected.contains_key(key));
        assert_eq!(got, expected);
    });
}

#[test]
fn a_map_too_small_for_the_dirty_keys_cleans_in_several_passes() {
    block_on(async {
        let storage = SimStorage::new(2);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let now = 5_000;
        let written = fill(&mut log, now).await;
        // Room for 7 keys: 21 keys in the dirty part need several cleans.
        let map_bytes = 10 * strata_node::log::cleaner::ENTRY_BYTES;
        let mut passes = 0;
        while let Some(report) = clean_once(&mut log, now, map_bytes).await {
            passes += 1;
            assert!(!report.discarded);
            assert!(passes < 50, "each pass moves the clean offset on");
        }
        assert!(passes >= 3, "{passes} passes");
        let cleaned = read_all(&mut log).await;
        assert_eq!(last_writes(&cleaned), last_writes(&written));
        let clean_offset = log.clean_offset();
        let below: Vec<&Read> = cleaned.iter().filter(|r| r.0 < clean_offset).collect();
        let keys: std::collections::BTreeSet<&Vec<u8>> = below.iter().map(|r| &r.1).collect();
        assert_eq!(keys.len(), below.len());
    });
}

/// Writes the same log on a fresh simulated disk, synced.
async fn prepared(seed: u64) -> (SimStorage, PartitionLog<SimStorage>, Vec<Read>) {
    let storage = SimStorage::new(seed);
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
        .await
        .unwrap();
    let written = fill(&mut log, 1_000).await;
    log.flush(1_000).await.unwrap();
    (storage, log, written)
}

#[test]
fn a_crash_at_any_step_of_a_clean_leaves_the_log_as_before_or_after_it() {
    block_on(async {
        let (_, mut log, before) = prepared(3).await;
        clean_once(&mut log, 1_000, 1 << 20).await.unwrap();
        let after = read_all(&mut log).await;
        assert_ne!(before, after);
        let (mut saw_before, mut saw_after) = (false, false);
        for step in 0.. {
            for seed in [3, 4] {
                let (storage, mut log, written) = prepared(seed).await;
                assert_eq!(written, before);
                storage.stop_after(step);
                let plan = log.plan_clean(1_000, log.log_end_offset()).unwrap();
                let (_, outcome) = clean(plan, OffsetMap::with_memory(1 << 20), &mut None).await;
                if let Ok(outcome) = outcome {
                    let _ = log.finish_clean(outcome, 1_000).await;
                }
                let stopped = storage.stopped();
                drop(log);
                storage.crash();
                let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 2_000)
                    .await
                    .unwrap_or_else(|error| panic!("step {step}: reopening failed: {error}"));
                let read = read_all(&mut log).await;
                assert!(
                    read == before || read == after,
                    "step {step}, seed {seed}: the log is neither as before nor as after the clean"
                );
                saw_before |= read == before;
                saw_after |= read == after;
                for name in storage.list_dir(Path::new(DIR)).await.unwrap() {
                    let name = name.to_str().unwrap().to_string();
                    assert!(
                        !name.ends_with(".cleaned") && !name.ends_with(".swap"),
                        "step {step}: {name} left behind"
                    );
                }
                if !stopped && seed == 4 {
                    assert!(saw_before && saw_after);
                    return;
                }
            }
        }
    });
}

#[test]
fn an_idempotent_producers_last_batch_survives_a_clean_emptied() {
    block_on(async {
        let storage = SimStorage::new(5);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let now = 1_000;
        // The producer writes key "a" twice; later writes of "a" by others supersede both.
        for sequence in 0..2 {
            let mut builder = BatchBuilder::default();
            builder.set_producer(77, 0, sequence);
            builder.push(now, Some(b"a"), b"from the producer");
            log.append(BytesMut::from(&builder.finish()[..]), 0, now)
                .await
                .unwrap();
        }
        let last_of_producer = log.log_end_offset() - 1;
        fill(&mut log, now).await;
        for round in 0..30 {
            let value = format!("a-{round}");
            log.append(
                keyed_batch(&[("a", Some(&value)), ("b", Some("b"))], now),
                0,
                now,
            )
            .await
            .unwrap();
        }
        clean_once(&mut log, now, 1 << 20).await.unwrap();
        let bytes = log.read(0, 1 << 20, u64::MAX).await.unwrap();
        let kept: Vec<_> = split_batches(bytes)
            .map(|batch| batch.unwrap())
            .filter(|batch| batch.header().producer_id == 77)
            .map(|batch| (batch.last_offset(), batch.record_count()))
            .collect();
        assert_eq!(kept, vec![(last_of_producer, 0)], "its last batch, emptied");
        // A retry of that batch is still recognised after a restart rebuilt the state.
        log.close(now).await.unwrap();
        // Without the snapshot, the state is rebuilt from the batches the clean left.
        storage
            .remove_file(&Path::new(DIR).join(strata_node::log::PRODUCER_SNAPSHOT_FILE_NAME))
            .await
            .unwrap();
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), now)
            .await
            .unwrap();
        let mut builder = BatchBuilder::default();
        builder.set_producer(77, 0, 1);
        builder.push(now, Some(b"a"), b"from the producer");
        let retry = log
            .append(BytesMut::from(&builder.finish()[..]), 0, now)
            .await
            .unwrap();
        assert!(
            retry.duplicate,
            "the retry is answered as the duplicate it is"
        );
        assert_eq!(retry.last_offset, last_of_producer);
    });
}

#[test]
fn a_compacted_log_refuses_records_without_a_key_and_writes_nothing() {
    block_on(async {
        let storage = SimStorage::new(6);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let mut builder = BatchBuilder::default();
        builder.push(1, Some(b"keyed"), b"a");
        builder.push(1, None, b"no key");
        builder.push(1, Some(b"keyed"), b"b");
        builder.push(1, None, b"no key either");
        let refused = log
            .append(BytesMut::from(&builder.finish()[..]), 0, 1)
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                strata_node::log::LogError::CorruptBatch {
                    source: strata_wire::batch::BatchError::MissingKeys { ref indices },
                    ..
                } if indices == &[1, 3]
            ),
            "{refused:?}"
        );
        assert_eq!(log.log_end_offset(), 0);
        // The same batch is fine where the topic deletes by retention.
        let (mut plain, _) = PartitionLog::open(
            storage.clone(),
            "/data/plain-0",
            common::small_config(2 << 10, FlushPolicy::Never),
            0,
        )
        .await
        .unwrap();
        let mut builder = BatchBuilder::default();
        builder.push(1, None, b"no key");
        plain
            .append(BytesMut::from(&builder.finish()[..]), 0, 1)
            .await
            .unwrap();
    });
}

/// Batches stored from `from` up to (not including) `below`, as a follower would fetch them.
async fn stored_range<S: Storage>(
    log: &mut PartitionLog<S>,
    from: u64,
    below: u64,
) -> bytes::Bytes {
    let mut out = BytesMut::new();
    let mut offset = from;
    while offset < below {
        let bytes = log.read(offset, 1 << 20, u64::MAX).await.unwrap();
        for batch in split_batches(bytes) {
            let batch = batch.unwrap();
            if batch.base_offset() < offset {
                continue;
            }
            if batch.base_offset() >= below {
                return out.freeze();
            }
            out.extend_from_slice(batch.as_bytes());
            offset = batch.last_offset() + 1;
        }
    }
    out.freeze()
}

#[test]
fn a_follower_behind_its_leaders_cleaner_takes_the_cleaned_batches_over_its_own() {
    block_on(async {
        let storage = SimStorage::new(7);
        let (mut leader, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let written = fill(&mut leader, 1_000).await;
        let log_end = leader.log_end_offset();
        let as_written = stored_range(&mut leader, 0, log_end).await;
        clean_once(&mut leader, 1_000, 1 << 20).await.unwrap();
        // A batch the cleaner emptied, standing for several batches as written.
        let cleaned = stored_range(&mut leader, 0, log_end).await;
        let emptied = split_batches(cleaned)
            .map(|batch| batch.unwrap())
            .find(|batch| batch.record_count() == 0 && batch.header().offset_count > 1)
            .expect("a run of emptied batches");
        // The follower had copied up to the middle of that run before the leader cleaned.
        let middle = emptied.base_offset() + 1;
        let (mut follower, _) =
            PartitionLog::open(storage.clone(), "/data/follower-0", config(), 0)
                .await
                .unwrap();
        let mut early = BytesMut::new();
        for batch in split_batches(as_written).map(|batch| batch.unwrap()) {
            if batch.base_offset() < middle {
                early.extend_from_slice(batch.as_bytes());
            }
        }
        follower
            .append_replicated(early.freeze(), 1_000)
            .await
            .unwrap();
        assert_eq!(follower.log_end_offset(), middle);
        // Its next fetch, from there, starts inside the emptied batch.
        let end = leader.log_end_offset();
        let rest = stored_range(&mut leader, emptied.base_offset(), end).await;
        follower.append_replicated(rest, 1_000).await.unwrap();
        assert_eq!(follower.log_end_offset(), end);
        assert_eq!(read_all(&mut follower).await, read_all(&mut leader).await);
        assert_eq!(
            last_writes(&read_all(&mut follower).await),
            last_writes(&written)
        );
    });
}

/// A leader whose appends go past the page cache keeps its newest batches in memory for
/// tailing readers; a clean must not leave them there to be served over the cleaned segments.
#[test]
fn reads_after_a_clean_see_the_cleaned_log_not_the_tail_cache() {
    block_on(async {
        let storage = SimStorage::new(8);
        let config = LogConfig {
            direct_writes: strata_node::log::DirectWrites::Always,
            ..config()
        };
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config, 0)
            .await
            .unwrap();
        let written = fill(&mut log, 1_000).await;
        clean_once(&mut log, 1_000, 1 << 20).await.unwrap();
        let cleaned = read_all(&mut log).await;
        assert!(cleaned.len() < written.len());
        let clean_offset = log.clean_offset();
        let below: Vec<&Read> = cleaned.iter().filter(|r| r.0 < clean_offset).collect();
        let keys: std::collections::BTreeSet<&Vec<u8>> = below.iter().map(|r| &r.1).collect();
        assert_eq!(keys.len(), below.len(), "nothing superseded is served");
    });
}

/// What the model-checking test does to a log.
#[derive(Debug, Clone)]
enum Op {
    /// Appends one record (`None`: a tombstone) of a key among a few.
    Put(u8, Option<u16>),
    /// Lets time pass.
    Wait(i64),
    /// Runs a clean with a key map of room for `keys` keys (several passes when they do not fit).
    Clean(usize),
    /// Power loss and a restart (every append was synced: `flush=always`).
    Crash,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0u8..6, proptest::option::weighted(0.8, any::<u16>())).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0i64..1_500).prop_map(Op::Wait),
        2 => (2usize..8).prop_map(Op::Clean),
        1 => Just(Op::Crash),
    ]
}

/// Checks the log against the model of every record appended (offset, key, value, time):
/// offsets only grow; every record read is the one appended at its offset; at and past the
/// clean offset nothing is gone; each key's last record is there, unless it is a tombstone past
/// `delete.retention.ms`, and then no older record of the key is there either.
fn check_against(
    model: &[(u64, u8, Option<u16>, i64)],
    read: &[Read],
    clean_offset: u64,
    now: i64,
) {
    let key = |k: u8| format!("key{k}").into_bytes();
    let value = |v: Option<u16>| v.map(|v| format!("value{v}").into_bytes());
    for (offset, k, v) in read {
        let (_, mk, mv, _) = model
            .iter()
            .find(|(o, ..)| o == offset)
            .unwrap_or_else(|| panic!("offset {offset} was never written"));
        assert_eq!((&key(*mk), &value(*mv)), (k, v), "offset {offset}");
    }
    for (offset, k, v, _) in model.iter().filter(|(o, ..)| *o >= clean_offset) {
        assert!(
            read.contains(&(*offset, key(*k), value(*v))),
            "offset {offset} at or past the clean offset {clean_offset} is gone"
        );
    }
    let mut last: BTreeMap<u8, &(u64, u8, Option<u16>, i64)> = BTreeMap::new();
    for record in model {
        last.insert(record.1, record);
    }
    for (k, (offset, _, v, written_ms)) in last {
        let present = read.iter().any(|r| r.0 == *offset);
        if present {
            continue;
        }
        assert!(
            v.is_none() && now - written_ms >= DELETE_RETENTION_MS,
            "the last record of key{k} (offset {offset}) is gone"
        );
        assert!(
            !read.iter().any(|r| r.1 == key(k)),
            "key{k} came back after its tombstone went"
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    #[test]
    fn any_history_of_appends_cleans_and_crashes_keeps_what_compaction_must(
        ops in proptest::collection::vec(op(), 1..80),
        seed in 0u64..1_000,
    ) {
        block_on(async {
            let config = LogConfig {
                segment_bytes: 600,
                flush: FlushPolicy::Always,
                ..config()
            };
            let storage = SimStorage::new(seed);
            let mut now = 1_000i64;
            let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config.clone(), now)
                .await
                .unwrap();
            let mut model: Vec<(u64, u8, Option<u16>, i64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        let value = v.map(|v| format!("value{v}"));
                        let batch = keyed_batch(&[(&format!("key{k}"), value.as_deref())], now);
                        let info = log.append(batch, 0, now).await.unwrap();
                        // Acknowledged once synced (what the writer does under flush=always).
                        log.flush(now).await.unwrap();
                        model.push((info.base_offset, k, v, now));
                    }
                    Op::Wait(ms) => now += ms,
                    Op::Clean(keys) => {
                        let map_bytes = (keys * 4 / 3 + 1) * strata_node::log::cleaner::ENTRY_BYTES;
                        clean_once(&mut log, now, map_bytes).await;
                    }
                    Op::Crash => {
                        drop(log);
                        storage.crash();
                        log = PartitionLog::open(storage.clone(), DIR, config.clone(), now)
                            .await
                            .unwrap()
                            .0;
                    }
                }
                let read = read_all(&mut log).await;
                check_against(&model, &read, log.clean_offset(), now);
            }
        });
    }
}

/// Timestamp lookups (ListOffsets, `offsetsForTimes`) over a cleaned log agree with a scan of
/// the records left, though cleaned batches keep the max timestamps of records they lost.
#[test]
fn timestamp_lookups_find_the_first_record_left_at_or_after_the_time() {
    block_on(async {
        let storage = SimStorage::new(9);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        for i in 0..300i64 {
            let value = format!("v{i}");
            let batch = keyed_batch(&[(&format!("key{}", i % 7), Some(&value))], 10_000 + i * 10);
            log.append(batch, 0, 20_000).await.unwrap();
        }
        clean_once(&mut log, 20_000, 1 << 20).await.unwrap();
        let mut left: Vec<(u64, i64)> = Vec::new();
        let mut offset = 0;
        while offset < log.log_end_offset() {
            let bytes = log.read(offset, 1 << 20, u64::MAX).await.unwrap();
            for batch in split_batches(bytes) {
                let batch = batch.unwrap();
                if batch.last_offset() >= offset {
                    left.extend(batch.records().map(|r| (r.offset, r.timestamp_ms)));
                    offset = batch.last_offset() + 1;
                }
            }
        }
        assert!(left.len() < 300);
        for timestamp in (9_990..13_100).step_by(7) {
            let scan = left.iter().copied().find(|(_, ts)| *ts >= timestamp);
            assert_eq!(
                log.offset_for_timestamp(timestamp).await.unwrap(),
                scan,
                "at {timestamp}"
            );
        }
    });
}

/// `compact,delete`: retention by time still deletes old segments of a compacted log, and
/// `compact` alone never does.
#[test]
fn compact_delete_still_expires_old_segments_and_compact_alone_does_not() {
    block_on(async {
        for (policy, expires) in [
            (
                CleanupPolicy {
                    delete: true,
                    compact: true,
                },
                true,
            ),
            (CleanupPolicy::COMPACT, false),
        ] {
            let storage = SimStorage::new(10);
            let config = LogConfig {
                cleanup: policy,
                retention_ms: Some(60_000),
                ..config()
            };
            let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config, 0)
                .await
                .unwrap();
            fill(&mut log, 1_000).await;
            clean_once(&mut log, 1_000, 1 << 20).await.unwrap();
            let segments = log.segment_count();
            assert!(segments > 1);
            let report = log
                .enforce_retention(1_000 + 61_000, log.log_end_offset())
                .await
                .unwrap();
            assert_eq!(report.deleted_segments > 0, expires, "{policy:?}");
            assert_eq!(log.log_start_offset() > 0, expires, "{policy:?}");
        }
    });
}

/// A batch of one transaction: `records` (key, value) of `producer_id` at `sequence`.
fn txn_batch(producer_id: i64, sequence: i32, records: &[(&[u8], &str)], now_ms: i64) -> BytesMut {
    let mut builder = BatchBuilder::default();
    builder.set_producer(producer_id, 0, sequence);
    builder.set_attributes(strata_wire::batch::attributes::TRANSACTIONAL);
    for (key, value) in records {
        builder.push(now_ms, Some(key), value.as_bytes());
    }
    BytesMut::from(&builder.finish()[..])
}

/// A batch as a reader sees it after a clean: its producer, whether a marker, its records.
#[derive(Debug, Clone, PartialEq)]
struct SeenBatch {
    producer_id: i64,
    marker: bool,
    records: Vec<(u64, Vec<u8>, Vec<u8>)>,
}

async fn batches<S: Storage>(log: &mut PartitionLog<S>) -> Vec<SeenBatch> {
    let mut seen = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let bytes = log.read(offset, 1 << 20, u64::MAX).await.unwrap();
        for batch in split_batches(bytes) {
            let batch = batch.unwrap();
            if batch.last_offset() < offset {
                continue;
            }
            offset = batch.last_offset() + 1;
            seen.push(SeenBatch {
                producer_id: batch.header().producer_id,
                marker: batch.header().is_control(),
                records: batch
                    .records()
                    .map(|record| {
                        (
                            record.offset,
                            record.key.unwrap().to_vec(),
                            record.value.to_vec(),
                        )
                    })
                    .collect(),
            });
        }
    }
    seen
}

fn markers_of(seen: &[SeenBatch], producer_id: i64) -> usize {
    seen.iter()
        .filter(|batch| batch.marker && batch.producer_id == producer_id)
        .count()
}

/// Enough plain records to close the segments before them.
async fn roll<S: Storage>(log: &mut PartitionLog<S>, now_ms: i64) {
    for round in 0..40 {
        let value = format!("filler-{round}");
        let batch = keyed_batch(
            &[("filler", Some(&value)), ("filler", Some(&value))],
            now_ms,
        );
        log.append(batch, 1, now_ms).await.unwrap();
    }
}

/// Transactions through the cleaner, as Kafka's cleaner treats them: an aborted transaction's
/// records go; committed ones are compacted like any; a marker stays while a batch of its
/// transaction does, then `delete.retention.ms` more, then goes; markers never take part in
/// the key map (a record whose key is a marker's bytes removes nothing); and nothing at or past
/// an open transaction is cleaned. After it all, the log replayed without its producer snapshot
/// has no transaction open.
#[test]
fn a_clean_drops_aborted_transactions_and_then_markers_with_nothing_left() {
    block_on(async {
        let storage = SimStorage::new(8);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let now = 10_000;
        // A commit marker's key: version 0, type 1.
        let marker_key: &[u8] = &[0, 0, 0, 1];
        // Producer 1: a transaction aborted, then one committed.
        log.append(txn_batch(1, 0, &[(b"a", "aborted-a")], now), 1, now)
            .await
            .unwrap();
        log.append(txn_batch(1, 1, &[(b"b", "aborted-b")], now), 1, now)
            .await
            .unwrap();
        append_marker(&mut log, 1, 0, false).await.unwrap();
        log.append(txn_batch(1, 2, &[(b"z", "committed-z")], now), 1, now)
            .await
            .unwrap();
        append_marker(&mut log, 1, 0, true).await.unwrap();
        // Producer 2: committed, its record the last of its key.
        log.append(txn_batch(2, 0, &[(b"c", "committed-c")], now), 1, now)
            .await
            .unwrap();
        append_marker(&mut log, 2, 0, true).await.unwrap();
        // A plain record keyed like a commit marker, before the markers below.
        let mut builder = BatchBuilder::default();
        builder.push(now, Some(marker_key), b"looks like a marker");
        log.append(BytesMut::from(&builder.finish()[..]), 1, now)
            .await
            .unwrap();
        // Producer 3: committed, then superseded by a plain write; then one more committed.
        log.append(txn_batch(3, 0, &[(b"d", "committed-d")], now), 1, now)
            .await
            .unwrap();
        append_marker(&mut log, 3, 0, true).await.unwrap();
        log.append(txn_batch(3, 1, &[(b"f", "committed-f")], now), 1, now)
            .await
            .unwrap();
        append_marker(&mut log, 3, 0, true).await.unwrap();
        let plain = keyed_batch(&[("d", Some("plain-d")), ("a", Some("plain-a"))], now);
        log.append(plain, 1, now).await.unwrap();
        roll(&mut log, now).await;
        assert_eq!(log.producers().transactions().aborted().len(), 1);
        let snapshot_path = Path::new(DIR).join(strata_node::log::PRODUCER_SNAPSHOT_FILE_NAME);
        let snapshot_before = storage
            .contents(&snapshot_path)
            .expect("written at the rolls");

        let report = clean_once(&mut log, now, 1 << 20).await.unwrap();
        assert_eq!(report.stats.aborted_removed, 2, "{report:?}");
        assert_eq!(
            log.producers().transactions().aborted(),
            [],
            "an aborted transaction with nothing left is no longer listed for fetches"
        );
        let seen = batches(&mut log).await;
        let values: Vec<&[u8]> = seen
            .iter()
            .filter(|batch| !batch.marker)
            .flat_map(|batch| batch.records.iter().map(|(_, _, value)| &value[..]))
            .collect();
        for gone in [&b"aborted-a"[..], b"aborted-b", b"committed-d"] {
            assert!(
                !values.contains(&gone),
                "{:?} stayed",
                String::from_utf8_lossy(gone)
            );
        }
        for kept in [
            &b"committed-z"[..],
            b"committed-c",
            b"committed-f",
            b"plain-d",
        ] {
            assert!(
                values.contains(&kept),
                "{:?} went",
                String::from_utf8_lossy(kept)
            );
        }
        assert!(values.contains(&&b"looks like a marker"[..]));
        // Every marker stays this time: those whose transaction still holds a record, and those
        // of emptied transactions until their delete horizon.
        assert_eq!(
            (
                markers_of(&seen, 1),
                markers_of(&seen, 2),
                markers_of(&seen, 3)
            ),
            (2, 1, 2),
            "{seen:?}"
        );

        // A crash that brought back the snapshot written before the clean lists the aborted
        // transaction again: its marker stays through the next clean, which forgets it again.
        let later = now + DELETE_RETENTION_MS + 1;
        log.close(now).await.unwrap();
        storage.set_contents(&snapshot_path, snapshot_before);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), now)
            .await
            .unwrap();
        assert_eq!(log.producers().transactions().aborted().len(), 1);
        roll(&mut log, later).await;
        let report = clean_once(&mut log, later, 1 << 20).await.unwrap();
        assert_eq!(report.stats.markers_removed, 1, "{report:?}");
        assert_eq!(markers_of(&batches(&mut log).await, 1), 2);
        assert_eq!(log.producers().transactions().aborted(), []);

        // Past the horizon, the markers of the emptied transactions go: producer 1's abort
        // (its records are gone) and producer 3's first commit (its record was superseded).
        roll(&mut log, later).await;
        let report = clean_once(&mut log, later, 1 << 20).await.unwrap();
        assert_eq!(report.stats.markers_removed, 1, "{report:?}");
        let seen = batches(&mut log).await;
        assert_eq!(
            (
                markers_of(&seen, 1),
                markers_of(&seen, 2),
                markers_of(&seen, 3)
            ),
            (1, 1, 1),
            "{seen:?}"
        );

        // Producer 4 opens a transaction and leaves it open; its key is written again after.
        let open_at = log.log_end_offset();
        log.append(txn_batch(4, 0, &[(b"e", "open-e")], later), 1, later)
            .await
            .unwrap();
        roll(&mut log, later).await;
        log.append(keyed_batch(&[("e", Some("plain-e"))], later), 1, later)
            .await
            .unwrap();
        roll(&mut log, later).await;
        clean_once(&mut log, later, 1 << 20).await;
        assert!(
            log.clean_offset() <= open_at,
            "nothing past the LSO is cleaned"
        );
        let open_values = |seen: &[SeenBatch]| {
            seen.iter()
                .filter(|batch| {
                    batch.producer_id == 4 && !batch.marker && !batch.records.is_empty()
                })
                .count()
        };
        assert_eq!(open_values(&batches(&mut log).await), 1);
        // Committed, it is compacted like any.
        append_marker(&mut log, 4, 0, true).await.unwrap();
        roll(&mut log, later).await;
        clean_once(&mut log, later, 1 << 20).await.unwrap();
        assert!(log.clean_offset() > open_at);
        assert_eq!(open_values(&batches(&mut log).await), 0);

        // The log alone (no producer snapshot) replays to no open transaction.
        let end = log.log_end_offset();
        log.close(later).await.unwrap();
        storage
            .remove_file(&Path::new(DIR).join(strata_node::log::PRODUCER_SNAPSHOT_FILE_NAME))
            .await
            .unwrap();
        let (log, _) = PartitionLog::open(storage.clone(), DIR, config(), later)
            .await
            .unwrap();
        let transactions = log.producers().transactions();
        assert!(transactions.open().is_empty(), "{:?}", transactions.open());
        assert_eq!(transactions.last_stable_offset(end), end);
    });
}

/// A clean rewrites a Kafka batch as Kafka's cleaner does: still a Kafka batch, its codec
/// kept (zstd here), its CRC valid, fewer records over the same offsets; an emptied run is an
/// empty Kafka batch. Strata's batches stay Strata's.
#[test]
fn cleaned_kafka_batches_stay_kafka_batches_with_their_codec() {
    use strata_wire::batch::BatchFormat;
    use strata_wire::batch::kafka::KafkaCodec;
    block_on(async {
        let storage = SimStorage::new(7);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(), 0)
            .await
            .unwrap();
        let now = 1_000_000;
        let written = fill(&mut log, now).await;
        clean_once(&mut log, now, 1 << 20)
            .await
            .expect("a clean is due");
        assert_eq!(
            last_writes(&read_all(&mut log).await),
            last_writes(&written)
        );
        let (mut kafka_compacted, mut strata) = (0, 0);
        let mut offset = log.log_start_offset();
        while offset < log.log_end_offset() {
            let bytes = log.read(offset, 1 << 20, u64::MAX).await.unwrap();
            for batch in split_batches(bytes) {
                let batch = batch.unwrap();
                let header = *batch.header();
                strata_wire::batch::check_integrity(batch.as_bytes()).unwrap();
                match header.format {
                    BatchFormat::Kafka => {
                        let codec = header.kafka_codec().unwrap();
                        if batch.record_count() == 0 {
                            assert_eq!(codec, KafkaCodec::None, "an empty batch is bare");
                        } else {
                            assert_eq!(codec, KafkaCodec::Zstd);
                        }
                        kafka_compacted += usize::from(header.is_compacted());
                    }
                    BatchFormat::Strata => strata += 1,
                }
                offset = batch.last_offset() + 1;
            }
        }
        assert!(
            kafka_compacted > 0 && strata > 0,
            "{kafka_compacted} {strata}"
        );
    });
}
