//! Real crashes: a child `strata log stress` process appends with `flush=always` from several
//! producers and prints every acknowledged append; the test SIGKILLs it at a random moment, then
//! recovers the log and checks that every acknowledged batch is there, whole, and nothing else
//! is torn. Repeated on the same log, so each round also recovers on top of earlier recoveries;
//! every other round appends past the page cache (`O_DIRECT`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_node::io::uring::UringStorage;
use strata_node::log::{LogConfig, PartitionLog};
use strata_wire::batch::split_batches;

const ROUNDS: u64 = 24;

#[test]
fn sigkill_during_flush_always_appends_loses_no_acknowledged_batch() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("crash-0");
    let seed = std::env::var("STRATA_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed {seed} (rerun with STRATA_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    // Every batch ever acknowledged, as (base offset, last offset).
    let mut acknowledged: Vec<(u64, u64)> = Vec::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["log", "stress"])
            .arg(&dir)
            .args([
                "--flush",
                "always",
                "--producers",
                "4",
                "--segment-bytes",
                "200000",
            ])
            .args([
                "--records-per-batch",
                &rng.random_range(1..40u32).to_string(),
            ])
            .args(["--value-bytes", &rng.random_range(10..2000u32).to_string()])
            // Every other round writes past the page cache, every append however small: each
            // recovery then meets block padding and tails rewritten in place, on a real disk.
            .args(if round % 2 == 1 {
                &["--direct", "--direct-min-bytes", "0"][..]
            } else {
                &[][..]
            })
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn strata");
        let acks = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let reader = {
            let acks = acks.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let mut words = line.split_whitespace();
                    if words.next() == Some("ACK") {
                        let base: u64 = words.next().unwrap().parse().unwrap();
                        let last: u64 = words.next().unwrap().parse().unwrap();
                        acks.lock().unwrap().push((base, last));
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        reader.join().unwrap();
        let round_acks = acks.lock().unwrap().clone();
        acknowledged.extend(&round_acks);

        let (log_end, batches) = tokio_uring::start(check_log(&dir));
        let acked_end = acknowledged
            .iter()
            .map(|&(_, last)| last + 1)
            .max()
            .unwrap_or(0);
        assert!(
            log_end >= acked_end,
            "seed {seed} round {round}: log ends at {log_end}, acknowledged up to {acked_end}"
        );
        for &(base, last) in &acknowledged {
            assert!(
                batches.binary_search(&(base, last)).is_ok(),
                "seed {seed} round {round}: acknowledged batch {base}..={last} is missing"
            );
        }
        println!(
            "round {round}: {} acks this round, log end {log_end}, {} acknowledged batches intact",
            round_acks.len(),
            acknowledged.len()
        );
    }
    assert!(
        !acknowledged.is_empty(),
        "the child never acknowledged anything: nothing was tested"
    );
}

/// Recovers the log and checks every batch: valid CRC and structure (split_batches), dense
/// offsets, and values that are exactly what the stress tool writes. Returns the log end and
/// every batch as (base, last).
async fn check_log(dir: &std::path::Path) -> (u64, Vec<(u64, u64)>) {
    let (mut log, _report) = PartitionLog::open(UringStorage, dir, LogConfig::default(), 0)
        .await
        .expect("recovery");
    let mut batches = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let bytes = log.read(offset, 1 << 20, u64::MAX).await.expect("read");
        for batch in split_batches(bytes) {
            let batch = batch.expect("recovered batches are whole and valid");
            assert_eq!(batch.base_offset(), offset, "offsets are dense");
            let mut first_prefix = None;
            for (index, record) in batch.records().enumerate() {
                let value = std::str::from_utf8(record.value).expect("utf8 value");
                let mut parts = value.split(':');
                let prefix = (parts.next().unwrap(), parts.next().unwrap());
                assert_eq!(
                    parts.next().unwrap(),
                    format!("r{index}"),
                    "record order within a batch"
                );
                assert!(
                    prefix.0.starts_with('p') && prefix.1.starts_with('a'),
                    "{value}"
                );
                assert_eq!(
                    *first_prefix.get_or_insert(prefix),
                    prefix,
                    "one append per batch"
                );
            }
            batches.push((batch.base_offset(), batch.last_offset()));
            offset = batch.last_offset() + 1;
        }
    }
    (log.log_end_offset(), batches)
}
