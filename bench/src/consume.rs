//! The consumer side of a run: native consumers (assigned or in a group) counting records and
//! end-to-end latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;
use strata_client::{
    Client, Consumer, GroupConfig, GroupConsumer, OffsetReset, SeekTo, ShareConfig, ShareConsumer,
};

use crate::{
    config::{BenchConfig, Workload},
    kafka, kafka_share,
    measure::{IntervalRecorder, IntervalRecorders, histogram, now_us},
    run::client_for,
};

/// What a consumer task counts: end-to-end latency from the send time at the head of each value
/// (records measured only from `measure_from`), bytes, and the run's shared record count.
pub(crate) struct RecordCounter {
    pub(crate) measure_from: Instant,
    pub(crate) e2e: Histogram<u64>,
    pub(crate) interval: IntervalRecorder,
    pub(crate) bytes: u64,
    pub(crate) consumed: Arc<AtomicU64>,
    /// When this consumer received its first record (warmup or not).
    pub(crate) first_record: Option<Instant>,
}

impl RecordCounter {
    /// Values read together (a batch, or one message).
    pub(crate) fn count<'a>(&mut self, values: impl Iterator<Item = &'a [u8]>) {
        let seen = now_us();
        let mut values = values.peekable();
        if self.first_record.is_none() && values.peek().is_some() {
            self.first_record = Some(Instant::now());
        }
        if Instant::now() < self.measure_from {
            return;
        }
        let mut interval = self.interval.lock().expect("interval recorder");
        for value in values {
            if let Some(sent) = value.get(..8) {
                let sent = u64::from_le_bytes(sent.try_into().expect("8 bytes"));
                let latency = seen.saturating_sub(sent).max(1);
                let _ = self.e2e.record(latency);
                let _ = interval.record(latency);
            }
            self.bytes += value.len() as u64;
            self.consumed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub(crate) type ConsumerTask = tokio::task::JoinHandle<anyhow::Result<RecordCounter>>;

/// Waits for the (stopped) consumers: their latencies go into `e2e`; returns the bytes they
/// read, and when the last of them had its first record (`None` when one had none, or there
/// were none; never before `started`).
pub(crate) async fn finish_consumers(
    tasks: Vec<ConsumerTask>,
    e2e: &mut Histogram<u64>,
    started: Instant,
) -> anyhow::Result<(u64, Option<Instant>)> {
    let mut bytes = 0u64;
    let mut all_reading = (!tasks.is_empty()).then_some(started);
    for task in tasks {
        let counter = task.await??;
        e2e.add(&counter.e2e)?;
        bytes += counter.bytes;
        all_reading = all_reading
            .zip(counter.first_record)
            .map(|(last, first)| last.max(first));
    }
    Ok((bytes, all_reading))
}

/// The run's consumers, reading until `stop`: in the bench's group, or splitting the topic's
/// `partitions` among themselves, from the beginning (consume) or the end (e2e). `client`: the
/// native client, `None` over Kafka's protocol.
pub(crate) async fn start_consumers(
    config: &BenchConfig,
    (client, partitions): (Option<&Arc<Client>>, u32),
    measure_from: Instant,
    (intervals, consumed, stop): (&IntervalRecorders, &Arc<AtomicU64>, &Arc<AtomicBool>),
) -> anyhow::Result<Vec<ConsumerTask>> {
    let mut tasks = Vec::new();
    if config.workload == Workload::Produce {
        return Ok(tasks);
    }
    let from_beginning = config.workload == Workload::Consume;
    let consumers = config.consumers.max(1);
    for index in 0..consumers {
        let counter = RecordCounter {
            measure_from,
            e2e: histogram(),
            interval: intervals.recorder(),
            bytes: 0,
            consumed: consumed.clone(),
            first_record: None,
        };
        let stop = stop.clone();
        let mine: Vec<u32> = (0..partitions)
            .filter(|p| *p as usize % consumers == index)
            .collect();
        if mine.is_empty() && config.group.is_none() && config.share_group.is_none() {
            continue;
        }
        let Some(client) = client else {
            let config = config.clone();
            if config.share_group.is_some() {
                tasks.push(tokio::spawn(async move {
                    kafka_share::consume(&config, index, stop, counter).await
                }));
                continue;
            }
            let start = if from_beginning {
                rdkafka::Offset::Beginning
            } else {
                rdkafka::Offset::End
            };
            tasks.push(tokio::spawn(async move {
                kafka::consume(&config, mine, start, stop, counter).await
            }));
            continue;
        };
        tasks.push(
            native_consumer(config, client, (index, mine), from_beginning, stop, counter).await?,
        );
    }
    Ok(tasks)
}

/// One native consumer task: a member of the bench's group, or a reader of `partitions`.
/// Members join inside their tasks, all at once, as a fleet of consumers starting together
/// would (joined one after another, each join would rebalance those before it).
pub(crate) async fn native_consumer(
    config: &BenchConfig,
    client: &Arc<Client>,
    (index, partitions): (usize, Vec<u32>),
    from_beginning: bool,
    stop: Arc<AtomicBool>,
    mut counter: RecordCounter,
) -> anyhow::Result<ConsumerTask> {
    let consumer_config = config.consumer_config();
    let client = client_for(config, client).await?;
    let process = config.process_per_record;
    if let Some(group) = &config.share_group {
        let mut share_config = ShareConfig::new(group.clone());
        share_config.client_id = format!("strata-bench-{index}");
        share_config.max_records = config.max_poll_records;
        let topics = vec![config.topic.clone()];
        return Ok(tokio::spawn(async move {
            let mut member = ShareConsumer::subscribe(client, topics, share_config).await?;
            while !stop.load(Ordering::Relaxed) {
                let records = member.poll().await?;
                if process.is_zero() {
                    counter.count(records.iter().map(share_value));
                    continue;
                }
                for record in &records {
                    work(process).await;
                    counter.count(std::iter::once(share_value(record)));
                }
            }
            member.close().await?;
            Ok(counter)
        }));
    }
    if let Some(group) = &config.group {
        let mut group_config = GroupConfig::new(group.clone());
        group_config.client_id = format!("strata-bench-{index}");
        group_config.consumer = consumer_config;
        group_config.auto_offset_reset = if from_beginning {
            OffsetReset::Earliest
        } else {
            OffsetReset::Latest
        };
        let topics = vec![config.topic.clone()];
        return Ok(tokio::spawn(async move {
            let mut member = GroupConsumer::subscribe(client, topics, group_config).await?;
            while !stop.load(Ordering::Relaxed) {
                for batch in member.poll().await? {
                    for record in batch.records() {
                        work(process).await;
                        counter.count(std::iter::once(record.value));
                    }
                }
            }
            member.close().await?;
            Ok(counter)
        }));
    }
    let start = if from_beginning {
        SeekTo::Beginning
    } else {
        SeekTo::End
    };
    let mut consumer = Consumer::new(client, consumer_config);
    consumer.assign(&config.topic, &partitions, start).await?;
    Ok(tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            for batch in consumer.poll().await? {
                if process.is_zero() {
                    counter.count(batch.records().map(|record| record.value));
                    continue;
                }
                for record in batch.records() {
                    work(process).await;
                    counter.count(std::iter::once(record.value));
                }
            }
        }
        Ok(counter)
    }))
}

/// A share record's value (empty for a null one).
fn share_value(record: &strata_client::ShareRecord) -> &[u8] {
    record.value.as_deref().unwrap_or_default()
}

/// An application's work on one record: nothing, or `process` of waiting.
pub(crate) async fn work(process: std::time::Duration) {
    if !process.is_zero() {
        tokio::time::sleep(process).await;
    }
}
