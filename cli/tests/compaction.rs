//! Compaction in a real `strata serve`: SIGKILL in the middle of cleans of a large partition
//! loses nothing compaction had to keep, and leaves no half-done swap behind.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{TestNode, wait_for_at_most};

const KEYS: usize = 2_000;
const RECORDS: usize = 40_000;

/// `strata log dump --records` of a partition folder: offset → "key=... value=...".
fn dumped(dir: &Path) -> BTreeMap<u64, String> {
    support::dumped_records(dir).into_iter().collect()
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".cleaned") || name.starts_with("cleaner-swap"))
        .collect()
}

#[test]
fn sigkill_during_cleans_of_a_large_partition_loses_nothing_compaction_must_keep() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = TestNode::start_with(
        dir.path(),
        1,
        &[
            "--cleaner-backoff-ms",
            "100",
            // Slow enough that a clean lasts long enough to be killed in the middle.
            "--cleaner-io-bytes-per-sec",
            "8MB",
        ],
    );
    node.cli(
        &[
            "topic",
            "create",
            "big",
            "--partitions",
            "1",
            "--config",
            "cleanup.policy=compact",
            "--config",
            "segment.bytes=1048576",
            "--config",
            "segment.ms=500",
            "--config",
            "min.cleanable.dirty.ratio=0.01",
        ],
        None,
    );
    let padding = "p".repeat(480);
    let input: String = (0..RECORDS)
        .map(|i| format!("key{}=v{i}-{padding}\n", i % KEYS))
        .collect();
    node.cli(
        &["produce", "big", "--key-separator", "=", "--acks", "all"],
        Some(input.as_bytes()),
    );
    // Each key's last value, at its offset (one partition: offsets are input order).
    let expected: BTreeMap<String, (u64, String)> = (0..RECORDS)
        .map(|i| {
            (
                format!("key{}", i % KEYS),
                (i as u64, format!("v{i}-{padding}")),
            )
        })
        .collect();
    let partition = dir.path().join("big-0");
    for (round, delay_ms) in [0u64, 150, 400].into_iter().enumerate() {
        wait_for_at_most("a clean under way", Duration::from_secs(30), || {
            std::fs::read_dir(&partition).unwrap().any(|entry| {
                entry
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".cleaned")
            })
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        node.kill();
        node.restart();
        let started = Instant::now();
        // Opening finished or discarded what the kill interrupted.
        wait_for_at_most("the node serves again", Duration::from_secs(30), || {
            node.cli_output(&["topic", "describe", "big"], None)
                .status
                .success()
        });
        assert!(started.elapsed() < Duration::from_secs(30), "round {round}");
    }
    // Let the last clean finish, then read every replica file offline.
    wait_for_at_most("a clean to the end", Duration::from_secs(60), || {
        let described = support::describe(&node, "big");
        described["partitions"][0]["clean_offset"].as_u64() >= Some(RECORDS as u64)
    });
    // The native consumer reads the cleaned log from the start, over its gaps.
    let consumed = node.cli(
        &[
            "consume",
            "big",
            "--from-beginning",
            "--max-messages",
            &KEYS.to_string(),
            "--format",
            "json",
        ],
        None,
    );
    let consumed: Vec<serde_json::Value> = support::json_lines(&consumed);
    assert_eq!(consumed.len(), KEYS);
    for record in &consumed {
        let key = record["key"].as_str().unwrap();
        let (offset, value) = &expected[key];
        assert_eq!(record["offset"].as_u64(), Some(*offset), "{key}");
        assert_eq!(record["value"].as_str(), Some(value.as_str()), "{key}");
    }
    node.stop();
    assert_eq!(leftovers(&partition), Vec::<String>::new());
    let records = dumped(&partition);
    for (key, (offset, value)) in &expected {
        assert_eq!(
            records.get(offset),
            Some(&format!("key=Some({key:?}) value=Some({value:?})")),
            "the last record of {key}"
        );
    }
    assert_eq!(
        records.len(),
        KEYS,
        "each key once, once cleaned to the end"
    );
}
