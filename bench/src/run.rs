//! A run from start to end: set up the topic, start consumers and producers, wait for the end
//! (a duration or a record count), gather what they measured into the report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::FutureExt;
use strata_client::{Client, Producer};

use crate::pacing::{on_own_runtime, on_pacing_thread};

use crate::{
    config::{BenchConfig, Protocol, Workload},
    consume::{finish_consumers, start_consumers},
    kafka,
    measure::{
        BrokerCpu, IntervalRecorders, ProducerMeasures, SentBytes, Tally, client_name, cpu_seconds,
        histogram, memory_stalls_us, now_us, p99, stalled_since,
    },
    produce::{
        BenchProducer, Connect, KeyChooser, PACED_RECORDS_PER_THREAD, PacedProducer,
        ProducerOutcome, ProducerTask, produce, produce_paced_on_this_thread, put_text, ratio,
    },
    report::{
        DurabilityTally, Histograms, HostState, IntervalHistograms, Percentiles, Report,
        TimelinePoint, progress_bar,
    },
};

/// Runs the workload against the cluster at `config.bootstrap`.
pub async fn run(config: &BenchConfig) -> anyhow::Result<(Report, Histograms)> {
    anyhow::ensure!(
        config.record_size >= 8,
        "--record-size must be at least 8 bytes"
    );
    anyhow::ensure!(
        config.duration.is_some() || config.records.is_some(),
        "give --duration or --records"
    );
    anyhow::ensure!(
        config.transactions.is_none() || !config.pinned,
        "the pinned presets do not write transactions"
    );
    if config.null_sink {
        return null_sink(config).await;
    }
    let (client, partitions) = match config.protocol {
        Protocol::Native => {
            let (client, partitions) = native_topic(config).await?;
            (Some(client), partitions)
        }
        Protocol::Kafka => {
            kafka::check(config)?;
            (None, kafka::ensure_topic(config).await?)
        }
    };
    if let Some(spread) = config.spread {
        anyhow::ensure!(
            (1..=partitions).contains(&spread),
            "--spread {spread}: the topic has {partitions} partitions"
        );
    }
    run_measured(config, (client, partitions)).await
}

/// A native client, and the topic's partition count once it exists (created if a produce run
/// needs it).
pub(crate) async fn native_topic(config: &BenchConfig) -> anyhow::Result<(Arc<Client>, u32)> {
    let client = Client::connect(config.client_config())
        .await
        .with_context(|| format!("connecting to {}", config.bootstrap))?;
    match client.metadata_for(&config.topic).await {
        Ok(_) => {}
        Err(strata_client::ClientError::UnknownTopic(_)) => {
            // A consume run reads what is there: on a topic it would create it would wait forever.
            anyhow::ensure!(
                config.workload != Workload::Consume,
                "topic {} does not exist: a consume run reads what a produce run stored (run `strata bench produce` with the same --topic, or --preset pinned-producer, first)",
                config.topic
            );
            let mut configs = config.topic_config.clone();
            if let Some(min) = config.min_insync {
                configs.push(("min.insync.replicas".to_string(), min.to_string()));
            }
            client
                .create_topic(
                    &config.topic,
                    config.partitions,
                    config.replication_factor,
                    &configs,
                )
                .await
                .with_context(|| format!("creating topic {}", config.topic))?;
        }
        Err(error) => {
            return Err(error).with_context(|| format!("looking up topic {}", config.topic));
        }
    }
    let partitions = client
        .metadata_for(&config.topic)
        .await?
        .partition_count(&config.topic)?;
    Ok((client, partitions))
}

/// What a run's tasks share: the stop signals, the counts, the per-second recorders.
#[derive(Clone, Default)]
struct Shared {
    /// Producers stop at the deadline; consumers only once they have caught up.
    stop: Arc<AtomicBool>,
    stop_consumers: Arc<AtomicBool>,
    ack_intervals: IntervalRecorders,
    e2e_intervals: IntervalRecorders,
    intervals: Arc<std::sync::Mutex<Vec<IntervalHistograms>>>,
    timeline: Arc<std::sync::Mutex<Vec<TimelinePoint>>>,
    produced: Arc<AtomicU64>,
    sent_bytes: Arc<SentBytes>,
    consumed: Arc<AtomicU64>,
    /// Ends the ticker with a last point for the part of a second since its last tick, so the
    /// timeline and the HDR log cover the whole run however its end falls between ticks.
    run_over: Arc<tokio::sync::Notify>,
}

/// A producer's measures, once it is done.
type ProducerRun = futures_util::future::BoxFuture<'static, anyhow::Result<ProducerOutcome>>;

/// The run, measured: see [`run`].
pub(crate) async fn run_measured(
    config: &BenchConfig,
    (client, partitions): (Option<Arc<Client>>, u32),
) -> anyhow::Result<(Report, Histograms)> {
    let host = HostState::now();
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    let memory_stalls_started = memory_stalls_us();
    let measure_from = started + config.warmup;
    let broker_cpu = BrokerCpu::start(&config.broker_admins, measure_from);
    let shared = Shared::default();
    let mut histograms = Histograms::empty();
    let ticker = spawn_ticker(config, &shared);
    let consumer_tasks = start_consumers(
        config,
        (client.as_ref(), partitions),
        measure_from,
        (
            &shared.e2e_intervals,
            &shared.consumed,
            &shared.stop_consumers,
        ),
    )
    .await?;
    let producer_tasks =
        start_producers(config, (client, partitions), &shared, measure_from).await?;
    let deadline = config.duration.map(|duration| measure_from + duration);
    let produced = wait_for_end(config, producer_tasks, &shared, deadline, &mut histograms).await?;
    let measured = Instant::now().saturating_duration_since(measure_from);
    let broker_cpu_seconds = broker_cpu.finish().await;
    shared.stop.store(true, Ordering::Relaxed);
    shared.stop_consumers.store(true, Ordering::Relaxed);
    let (consumed_bytes, all_reading) =
        finish_consumers(consumer_tasks, &mut histograms.e2e, started).await?;
    shared.run_over.notify_one();
    ticker.await?;
    histograms.intervals = std::mem::take(&mut *shared.intervals.lock().expect("intervals"));
    let (records, bytes) = match config.workload {
        Workload::Produce => (shared.produced.load(Ordering::Relaxed), produced.bytes),
        Workload::Consume | Workload::E2e => {
            (shared.consumed.load(Ordering::Relaxed), consumed_bytes)
        }
    };
    let seconds = measured.as_secs_f64().max(1e-9);
    let sent = (
        shared.sent_bytes.records.load(Ordering::Relaxed),
        shared.sent_bytes.batches.load(Ordering::Relaxed),
    );
    let report = Report {
        workload: config.workload,
        topic: config.topic.clone(),
        compression: config.compression.name(),
        client: client_name(config.protocol),
        sent_batch_bytes: sent.1,
        compression_ratio: ratio(sent.0, sent.1),
        records,
        bytes,
        duration_s: seconds,
        records_per_s: records as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        target_rate: config.rate,
        bench_cpu_percent: 100.0 * (cpu_seconds() - cpu_started)
            / started.elapsed().as_secs_f64().max(1e-9),
        broker_cpu_seconds,
        broker_cpu_s_per_gb: broker_cpu_seconds
            .filter(|_| bytes > 0)
            .map(|cpu| cpu / (bytes as f64 / 1e9)),
        memory_stall_ms: stalled_since(memory_stalls_started),
        consumers_ready_s: all_reading.map(|at| at.duration_since(started).as_secs_f64()),
        batch_latency_us: (config.pinned && config.workload == Workload::Produce)
            .then(|| Percentiles::of(&histograms.batch)),
        commit_latency_us: (config.transactions.is_some() && config.workload != Workload::Consume)
            .then(|| Percentiles::of(&histograms.commit)),
        ack_latency_us: (config.workload != Workload::Consume)
            .then(|| Percentiles::of(&histograms.ack)),
        ack_durability: produced.durability.shares(),
        e2e_latency_us: (config.workload != Workload::Produce)
            .then(|| Percentiles::of(&histograms.e2e)),
        timeline: shared.timeline.lock().expect("timeline").clone(),
        host,
    };
    Ok((report, histograms))
}

/// Every second, a timeline point and the interval histograms (and, on a terminal, a progress
/// line), until the run is over.
fn spawn_ticker(config: &BenchConfig, shared: &Shared) -> tokio::task::JoinHandle<()> {
    let shared = shared.clone();
    let (record_size, target_records) = (config.record_size as f64, config.records);
    let (workload, show_progress) = (config.workload, config.progress);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.tick().await;
        let (mut last_produced, mut last_consumed) = (0u64, 0u64);
        loop {
            let last = tokio::select! {
                _ = ticker.tick() => false,
                _ = shared.run_over.notified() => true,
            };
            let (p, c) = (
                shared.produced.load(Ordering::Relaxed),
                shared.consumed.load(Ordering::Relaxed),
            );
            let (ack, e2e) = (shared.ack_intervals.take(), shared.e2e_intervals.take());
            if last && p == last_produced && c == last_consumed && ack.is_empty() {
                return;
            }
            let (ack_p99_us, e2e_p99_us) = (p99(&ack), p99(&e2e));
            let mut points = shared.timeline.lock().expect("timeline");
            let second = points.len() as u64 + 1;
            points.push(TimelinePoint {
                second,
                produced_records: p - last_produced,
                consumed_records: c - last_consumed,
                ack_p99_us,
                e2e_p99_us,
            });
            drop(points);
            let interval = IntervalHistograms { second, ack, e2e };
            shared.intervals.lock().expect("intervals").push(interval);
            if last {
                return;
            }
            if show_progress {
                let ms = |us: Option<u64>| {
                    us.map_or("-".to_string(), |us| format!("{:.1}", us as f64 / 1e3))
                };
                // A bar for runs of a fixed size, as far as the counted side has got.
                let bar = target_records.map_or(String::new(), |target| {
                    let done = if workload == Workload::Consume { c } else { p };
                    progress_bar(done as f64 / target.max(1) as f64, 20) + " "
                });
                eprintln!(
                    "  {bar}produced {:>9.0} records/s {:>8.1} MB/s ack p99 {:>7} ms   consumed {:>9.0} records/s {:>8.1} MB/s e2e p99 {:>7} ms",
                    (p - last_produced) as f64,
                    (p - last_produced) as f64 * record_size / 1e6,
                    ms(ack_p99_us),
                    (c - last_consumed) as f64,
                    (c - last_consumed) as f64 * record_size / 1e6,
                    ms(e2e_p99_us),
                );
            }
            (last_produced, last_consumed) = (p, c);
        }
    })
}

/// Starts the producers: unpaced ones on the runtime, pinned paced ones on pacing threads of
/// their own, the other paced ones grouped on threads of their own.
async fn start_producers(
    config: &BenchConfig,
    (client, partitions): (Option<Arc<Client>>, u32),
    shared: &Shared,
    measure_from: Instant,
) -> anyhow::Result<Vec<ProducerRun>> {
    let mut producer_tasks: Vec<ProducerRun> = Vec::new();
    if config.workload == Workload::Consume {
        return Ok(producer_tasks);
    }
    let producers = config.producers.max(1);
    // Paced producers run on threads of their own, each with its own runtime and client: one
    // per PACED_RECORDS_PER_THREAD of the rate, at most one per producer and per core.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let paced_threads = config
        .rate
        .map_or(1, |rate| (rate / PACED_RECORDS_PER_THREAD).ceil() as usize)
        .clamp(1, producers.min(cores));
    let mut paced: Vec<Vec<PacedProducer>> = (0..paced_threads).map(|_| Vec::new()).collect();
    for index in 0..producers {
        let producer_config = config.producer_config(index);
        let task_config = config.clone();
        let shared = shared.clone();
        let interval = shared.ack_intervals.recorder();
        let quota = config.records.map(|total| {
            total / producers as u64 + u64::from((index as u64) < total % producers as u64)
        });
        let make_task = move |producer: BenchProducer| ProducerTask {
            producer,
            config: task_config,
            index: index as u64,
            quota,
            stop: shared.stop,
            tally: Tally {
                produced: shared.produced,
                interval,
                sent: shared.sent_bytes,
            },
            measure_from,
        };
        if config.rate.is_some() && !config.pinned {
            paced[index % paced_threads].push(PacedProducer {
                index,
                producer_config,
                make_task: Box::new(make_task),
            });
            continue;
        }
        let producer = match &client {
            Some(client) => BenchProducer::Native(Producer::new(
                client_for(config, client).await?,
                producer_config,
            )),
            None => BenchProducer::Kafka(kafka::KafkaProducer::new(config, index, partitions)?),
        };
        let task = make_task(producer);
        if config.rate.is_some() {
            // A pinned producer waits once per batch: a pacing thread of its own is cheap.
            let name = format!("bench-producer-{index}");
            producer_tasks.push(on_pacing_thread(&name, || produce(task)).boxed());
        } else {
            // Unpaced producers stay on the runtime: on a thread of their own they would pay a
            // cross-thread wake-up per acknowledgement they wait for (the pinned preset ran at
            // 400-635 k records/s that way, 836-974 k on the runtime).
            let task = tokio::spawn(produce(task));
            producer_tasks.push(async move { Ok(task.await?) }.boxed());
        }
    }
    for (thread, group) in paced.into_iter().enumerate() {
        if group.is_empty() {
            continue;
        }
        let connect = match config.protocol {
            Protocol::Native => Connect::Native(config.client_config(), config.own_connections),
            Protocol::Kafka => Connect::Kafka(Box::new(config.clone()), partitions),
        };
        let outcomes = on_own_runtime(&format!("bench-producers-{thread}"), move || {
            produce_paced_on_this_thread(connect, group)
        });
        producer_tasks.push(
            async move {
                let mut merged = ProducerMeasures::new();
                for outcome in outcomes.await? {
                    merged.add(&outcome?)?;
                }
                Ok(Ok(merged))
            }
            .boxed(),
        );
    }
    Ok(producer_tasks)
}

/// What the producers measured together.
#[derive(Default)]
struct Produced {
    bytes: u64,
    durability: DurabilityTally,
}

/// Waits for the end: the deadline, or every producer's quota (then the consumers catch up, a
/// bounded while); with no producers, until the consumers have read what is asked.
async fn wait_for_end(
    config: &BenchConfig,
    producer_tasks: Vec<ProducerRun>,
    shared: &Shared,
    deadline: Option<Instant>,
    histograms: &mut Histograms,
) -> anyhow::Result<Produced> {
    let mut produced = Produced::default();
    let consumed = |shared: &Shared| shared.consumed.load(Ordering::Relaxed);
    if producer_tasks.is_empty() {
        let target = config.records.unwrap_or(u64::MAX);
        while consumed(shared) < target && deadline.is_none_or(|deadline| Instant::now() < deadline)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        return Ok(produced);
    }
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline.into()).await;
        shared.stop.store(true, Ordering::Relaxed);
    }
    let mut ack = histogram();
    for task in producer_tasks {
        let measures = task.await??;
        ack.add(&measures.records)?;
        histograms.batch.add(&measures.batches)?;
        histograms.commit.add(&measures.commits)?;
        produced.durability.add(&measures.durability);
        produced.bytes += measures.bytes;
    }
    histograms.ack = ack;
    if config.workload == Workload::E2e {
        // Let consumers see what was produced (bounded wait).
        let target = shared.produced.load(Ordering::Relaxed);
        let grace = Instant::now() + Duration::from_secs(10);
        while consumed(shared) < target && Instant::now() < grace {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(produced)
}

/// The generator alone: each producer task builds batches as the producer does (value with a
/// send timestamp, key, batch sealed at `batch_bytes`) and drops them.
pub(crate) async fn null_sink(config: &BenchConfig) -> anyhow::Result<(Report, Histograms)> {
    anyhow::ensure!(
        config.workload == Workload::Produce,
        "--null-sink measures the produce side only"
    );
    let host = HostState::now();
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    let memory_stalls_started = memory_stalls_us();
    let producers = config.producers.max(1);
    let mut tasks = Vec::new();
    for index in 0..producers {
        let config = config.clone();
        let quota = config.records.map(|total| {
            total / producers as u64 + u64::from((index as u64) < total % producers as u64)
        });
        let deadline = config.duration.map(|duration| started + duration);
        tasks.push(tokio::task::spawn_blocking(move || {
            let mut keys = KeyChooser::new(config.key_distribution, config.keys, index as u64);
            let mut builder = strata_wire::batch::BatchBuilder::with_capacity(config.batch_bytes);
            builder.set_codec(config.compression);
            let mut value = Vec::with_capacity(config.record_size);
            let (mut generated, mut batch_bytes) = (0u64, 0u64);
            // The clock is read for the deadline about once per MiB generated (at most every
            // 1024 records): often enough for large records, rarely enough for small ones.
            let check_every = ((1usize << 20) / config.record_size.max(1)).clamp(1, 1024) as u64;
            while quota.is_none_or(|quota| generated < quota)
                && deadline.is_none_or(|deadline| {
                    !generated.is_multiple_of(check_every) || Instant::now() < deadline
                })
            {
                // As a producing record sender builds its values: a send time, then text.
                let stamp = now_us().to_le_bytes();
                let stamped = stamp.len().min(config.record_size);
                value.clear();
                value.extend_from_slice(&stamp[..stamped]);
                put_text(&mut value, generated, config.record_size - stamped);
                let key = keys.next();
                builder.push(0, key.as_deref(), &value);
                generated += 1;
                if builder.estimated_len() >= config.batch_bytes {
                    batch_bytes += std::hint::black_box(builder.finish()).len() as u64;
                }
            }
            if !builder.is_empty() {
                batch_bytes += std::hint::black_box(builder.finish()).len() as u64;
            }
            (generated, batch_bytes)
        }));
    }
    let (mut records, mut batch_bytes) = (0u64, 0u64);
    for task in tasks {
        let (generated, batches) = task.await?;
        records += generated;
        batch_bytes += batches;
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let bytes = records * config.record_size as u64;
    let report = Report {
        workload: Workload::Produce,
        topic: "(null sink)".into(),
        compression: config.compression.name(),
        client: client_name(config.protocol),
        sent_batch_bytes: batch_bytes,
        compression_ratio: ratio(bytes, batch_bytes),
        records,
        bytes,
        duration_s: seconds,
        records_per_s: records as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        target_rate: None,
        bench_cpu_percent: 100.0 * (cpu_seconds() - cpu_started) / seconds,
        broker_cpu_seconds: None,
        broker_cpu_s_per_gb: None,
        memory_stall_ms: stalled_since(memory_stalls_started),
        consumers_ready_s: None,
        ack_latency_us: None,
        ack_durability: Vec::new(),
        batch_latency_us: None,
        commit_latency_us: None,
        e2e_latency_us: None,
        timeline: Vec::new(),
        host,
    };
    Ok((report, Histograms::empty()))
}

/// The client a native producer or consumer uses: the run's `shared` one, or with
/// `own_connections` a client of its own.
pub(crate) async fn client_for(
    config: &BenchConfig,
    shared: &Arc<Client>,
) -> anyhow::Result<Arc<Client>> {
    Ok(if config.own_connections {
        Client::connect(config.client_config()).await?
    } else {
        shared.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyDistribution;

    #[test]
    fn the_null_sink_generates_what_it_is_asked_for() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = BenchConfig {
            null_sink: true,
            records: Some(100_000),
            duration: None,
            key_distribution: KeyDistribution::Zipf,
            ..BenchConfig::default()
        };
        let (report, _) = runtime.block_on(run(&config)).unwrap();
        assert_eq!(report.records, 100_000);
        assert_eq!(report.bytes, 100_000 * 1024);
        assert!(report.records_per_s > 0.0);
        assert!(report.bench_cpu_percent > 0.0);
        // Read where the kernel keeps pressure stall information (`/proc/pressure`, with PSI).
        assert_eq!(
            report.memory_stall_ms.is_some(),
            std::path::Path::new("/proc/pressure/memory").exists()
        );
    }
}
