//! `strata log dump|stress`: operator tools for partition folders.

use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use bytes::BytesMut;
use strata_node::clock::Clock;
use strata_node::io::AnyStorage;
use strata_node::log::{LogConfig, PartitionLog, writer};
use strata_wire::batch::{BatchBuilder, BatchFormat, split_batches};

pub async fn dump(storage: AnyStorage, dir: PathBuf, print_records: bool) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a partition folder", dir.display());
    }
    let now = Clock::SYSTEM.wall_ms();
    let (mut log, report) = PartitionLog::open(storage, &dir, LogConfig::default(), now)
        .await
        .with_context(|| format!("opening {}", dir.display()))?;
    outln!(
        "log_start={} log_end={} segments={} bytes={} recovery={report:?}",
        log.log_start_offset(),
        log.log_end_offset(),
        log.segment_count(),
        log.size_bytes()
    );
    let mut offset = log.log_start_offset();
    let mut stdout = std::io::stdout().lock();
    while offset < log.log_end_offset() {
        let bytes = log.read(offset, 1 << 20, u64::MAX).await?;
        for batch in split_batches(bytes) {
            let batch = batch?;
            let header = batch.header();
            writeln!(
                stdout,
                "batch base={} last={} offsets={} records={} bytes={} epoch={} max_ts={} producer={} format={} codec={}",
                header.base_offset,
                header.last_offset(),
                header.offset_count,
                batch.record_count(),
                header.batch_len,
                header.leader_epoch,
                header.max_timestamp_ms,
                header.producer_id,
                match header.format {
                    BatchFormat::Strata => "strata",
                    BatchFormat::Kafka => "kafka",
                },
                header.codec_name()
            )?;
            if print_records {
                for record in batch.records() {
                    writeln!(
                        stdout,
                        "  offset={} ts={} key={:?} value={:?}",
                        record.offset,
                        record.timestamp_ms,
                        record.key.map(String::from_utf8_lossy),
                        // A tombstone (null value) prints as None.
                        record.nullable_value().map(String::from_utf8_lossy)
                    )?;
                }
            }
            offset = header.next_offset();
        }
    }
    Ok(())
}

pub async fn stress(
    storage: AnyStorage,
    dir: PathBuf,
    config: LogConfig,
    producers: u32,
    records_per_batch: usize,
    value_bytes: usize,
    appends: u64,
) -> anyhow::Result<()> {
    let now = Clock::SYSTEM.wall_ms();
    let (log, _) = PartitionLog::open(storage, &dir, config, now).await?;
    let handle = writer::spawn(log, Clock::SYSTEM);
    let started = Rc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for producer in 0..producers {
        let handle = handle.clone();
        let started = started.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut builder = BatchBuilder::with_capacity(records_per_batch * (value_bytes + 64));
            loop {
                let sequence = started.fetch_add(1, Ordering::Relaxed);
                if appends != 0 && sequence >= appends {
                    return Ok::<(), anyhow::Error>(());
                }
                for i in 0..records_per_batch {
                    // Each value names its producer, append and index, so a checker can tell a
                    // record that was written from one that was made up or torn.
                    let mut value = format!("p{producer}:a{sequence}:r{i}:").into_bytes();
                    value.resize(value_bytes.max(value.len()), b'.');
                    builder.push(Clock::SYSTEM.wall_ms(), Some(b"stress"), &value);
                }
                let batch = BytesMut::from(&builder.finish()[..]);
                let info = handle.append(batch, 0).await?;
                let mut stdout = std::io::stdout().lock();
                writeln!(stdout, "ACK {} {}", info.base_offset, info.last_offset)?;
                stdout.flush()?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    handle.close().await?;
    Ok(())
}
