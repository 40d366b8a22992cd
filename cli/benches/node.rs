//! One node over loopback, next to a plain TCP socket pair measured in the same run.
//!
//! `cargo bench -p strata-cli --bench node -- [--seconds N] [--shards N] [--linger-ms N]
//! [--latency-linger-ms N] [--load F] [--direct-writes never|replicated|always] [--overprovisioned]
//! [--partition-fetch-bytes B]`
//!
//! Starts the release `strata serve` (`--shards 2`), a topic of 4 partitions with `flush=never`,
//! then: max produce throughput of 1 KiB records with acks=1, consume throughput of what was
//! produced, max produce throughput with the client's batch API (the broker's own ceiling),
//! the max rate of the latency phase's producers (`strata bench`, linger 0 by
//! default), and produce-ack latency at half that rate (`strata bench`'s open loop: latency
//! counts from the intended send time, so a stalled broker cannot hide behind a waiting client).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};

#[path = "../tests/support/mod.rs"]
mod support;

const RECORD_BYTES: usize = 1024;
const PARTITIONS: u32 = 4;
const TOPIC: &str = "bench";

fn main() {
    // The same allocator settings as the `strata` binary (and so `strata bench`): without them
    // glibc maps every 4 MiB fetch answer afresh, and on a VM whose host backs memory on demand
    // fresh pages are slow to touch (on the 2-core VM of docs/performance.md the consume phase
    // ran at 530 MB/s instead of 1.2-1.5 GB/s once free memory was cold).
    strata_node::memory::keep_freed_buffers();
    let mut args = std::env::args().skip(1);
    let mut seconds = 5u64;
    let mut shards = 2usize;
    let mut batch_bytes = 1usize << 20;
    let mut linger_ms = 2u64;
    // The latency phase's producer: sends as soon as the previous request is answered, as a
    // latency-minded Kafka producer would (linger.ms=0); 2 ms of linger alone would put the
    // p50 above the 1 ms p99 target.
    let mut latency_linger_ms = 0u64;
    let mut load = 0.5f64;
    // The topic's `direct.writes` (never | replicated | always).
    let mut direct_writes = "replicated".to_string();
    // `strata serve --overprovisioned`: shards not pinned, as where clients share the cores.
    let mut overprovisioned = false;
    // The consumer's `partition_max_bytes`: how much one fetch may bring per partition.
    let mut partition_fetch_bytes = 4u32 << 20;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().unwrap().parse().unwrap(),
            "--shards" => shards = args.next().unwrap().parse().unwrap(),
            "--batch-bytes" => batch_bytes = args.next().unwrap().parse().unwrap(),
            "--linger-ms" => linger_ms = args.next().unwrap().parse().unwrap(),
            "--latency-linger-ms" => latency_linger_ms = args.next().unwrap().parse().unwrap(),
            "--load" => load = args.next().unwrap().parse().unwrap(),
            "--direct-writes" => direct_writes = args.next().unwrap(),
            "--overprovisioned" => overprovisioned = true,
            "--partition-fetch-bytes" => {
                partition_fetch_bytes = args.next().unwrap().parse().unwrap()
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let duration = Duration::from_secs(seconds);
    println!(
        "# 1 node, --shards {shards}{}, {PARTITIONS} partitions, flush=never, direct.writes={direct_writes}, acks=1, {RECORD_BYTES} B records, {seconds} s per phase, producer batch {batch_bytes} B, linger {linger_ms} ms ({latency_linger_ms} ms in the latency phase)",
        if overprovisioned {
            " --overprovisioned"
        } else {
            ""
        }
    );

    // On a VM the host's memory state moves the figures more than most code changes
    // (docs/performance.md).
    println!("host: {}", strata_bench::HostState::now());
    // Measured with the host's default congestion control and with the one Strata's
    // connections use; ratios are taken against the higher of the two.
    let host_default = tcp_loopback(duration, None);
    let congestion = strata_client::DEFAULT_TCP_CONGESTION;
    let ours = tcp_loopback(duration, Some(congestion));
    println!(
        "plain TCP socket pair over loopback: {host_default:8.0} MB/s (host default), {ours:.0} MB/s ({congestion})"
    );
    let loopback = host_default.max(ours);

    // One fixed folder, emptied at the start: the run writes up to ~17 GB, and a run killed
    // before its end cannot remove its own (a few left behind fill a small cloud VM's disk).
    let data = BenchDir::fresh(std::env::temp_dir().join("strata-node-bench"));
    let node = if overprovisioned {
        support::TestNode::start_with(data.path(), shards, &["--overprovisioned"])
    } else {
        support::TestNode::start(data.path(), shards)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bootstrap = node.bootstrap();
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(&bootstrap)).await.unwrap();
        client
            .create_topic(
                TOPIC,
                PARTITIONS,
                1,
                &[
                    ("flush".into(), "never".into()),
                    ("direct.writes".into(), direct_writes.clone()),
                ],
            )
            .await
            .unwrap();
        let producer_lingering = |linger_ms| {
            Producer::new(
                client.clone(),
                ProducerConfig {
                    batch_bytes,
                    linger: Duration::from_millis(linger_ms),
                    ..ProducerConfig::default()
                },
            )
        };
        let producer = producer_lingering(linger_ms);

        let (records, elapsed) = produce_max(&producer, duration).await;
        let produce_mb = records as f64 * RECORD_BYTES as f64 / elapsed.as_secs_f64() / 1e6;
        let produce_rate = records as f64 / elapsed.as_secs_f64();
        println!(
            "produce, max:                       {produce_mb:8.0} MB/s  {:8.0} records/s   = {:3.0}% of loopback",
            produce_rate,
            100.0 * produce_mb / loopback
        );

        let (consumed, elapsed) = consume_all(client.clone(), records, partition_fetch_bytes).await;
        let consume_mb = consumed as f64 * RECORD_BYTES as f64 / elapsed.as_secs_f64() / 1e6;
        println!(
            "consume (from the start):           {consume_mb:8.0} MB/s  {:8.0} records/s   = {:3.0}% of loopback",
            consumed as f64 / elapsed.as_secs_f64(),
            100.0 * consume_mb / loopback
        );

        drain_writeback().await;
        // The broker's own ceiling, apart from the client's per-record path: producers that hand
        // the client 1000 records per call (`send_batch`, as iggy-bench's pinned producers and
        // `strata bench --preset pinned-producer` do), one per partition. The per-record
        // producer above takes about one of the bench machine's two cores at its max (`perf`;
        // the machine is described in docs/performance.md).
        let (batched, _) = strata_bench::run(&strata_bench::BenchConfig {
            bootstrap: bootstrap.clone(),
            topic: TOPIC.into(),
            partitions: PARTITIONS,
            producers: PARTITIONS as usize,
            record_size: RECORD_BYTES,
            batch_bytes,
            linger: Duration::from_millis(linger_ms),
            acks: 1,
            pinned: true,
            batch_records: Some(1000),
            duration: Some(duration + Duration::from_secs(1)),
            warmup: Duration::from_secs(1),
            ..strata_bench::BenchConfig::default()
        })
        .await
        .unwrap();
        println!(
            "produce, max with 1000 records per call (strata bench, {PARTITIONS} pinned producers): {:8.0} MB/s  {:8.0} records/s   = {:3.0}% of loopback",
            batched.mb_per_s,
            batched.records_per_s,
            100.0 * batched.mb_per_s / loopback
        );
        drain_writeback().await;
        // The latency phase's load is a share of the max that its own producer configuration
        // (linger, producers, open loop) sustains, measured here with the same tool, as
        // OpenMessaging Benchmark does. Half of the max above (linger 2 ms) was at or past what
        // linger 0 sustains, so that phase measured a saturated broker's queue.
        let latency_config = strata_bench::BenchConfig {
            bootstrap: bootstrap.clone(),
            topic: TOPIC.into(),
            partitions: PARTITIONS,
            producers: 2,
            record_size: RECORD_BYTES,
            batch_bytes,
            linger: Duration::from_millis(latency_linger_ms),
            acks: 1,
            duration: Some(duration + Duration::from_secs(1)),
            warmup: Duration::from_secs(1),
            ..strata_bench::BenchConfig::default()
        };
        let (latency_max, _) = strata_bench::run(&latency_config).await.unwrap();
        println!(
            "produce, max at linger {latency_linger_ms} ms (strata bench, 2 producers): {:8.0} MB/s  {:8.0} records/s",
            latency_max.mb_per_s, latency_max.records_per_s
        );
        drain_writeback().await;
        let half = latency_max.records_per_s * load;
        // The latency phase is `strata bench`'s open loop (paced producers on threads of their
        // own, latency from each record's intended send time): the same tool and numbers an
        // operator gets from `strata bench produce --rate`.
        let (report, _) = strata_bench::run(&strata_bench::BenchConfig {
            rate: Some(half),
            ..latency_config
        })
        .await
        .unwrap();
        let latency = report.ack_latency_us.expect("a produce run measures acks");
        println!(
            "produce-ack latency at {:.0} records/s ({:.0}% of that max; {:.0} records/s delivered): p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
            half,
            load * 100.0,
            report.records_per_s,
            latency.p50 as f64 / 1000.0,
            latency.p99 as f64 / 1000.0,
            latency.p999 as f64 / 1000.0,
            latency.max as f64 / 1000.0,
        );
    });
    drop(node);
}

/// The bench's data folder: emptied when made and removed when dropped.
struct BenchDir(std::path::PathBuf);

impl BenchDir {
    fn fresh(path: std::path::PathBuf) -> BenchDir {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        BenchDir(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits for the page cache's dirty data of the phase before to reach the disk. Without it the
/// next phase measures the kernel's writeback throttling of that debt, not the load it offers
/// (without it this bench measured a p50 of 271–1,283 ms at "half load").
async fn drain_writeback() {
    let drained = Instant::now();
    tokio::task::spawn_blocking(|| {
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() }
    })
    .await
    .unwrap();
    println!(
        "(writeback of the phase before drained in {:.1} s)",
        drained.elapsed().as_secs_f64()
    );
}

fn value() -> Bytes {
    Bytes::from(vec![b'x'; RECORD_BYTES])
}

/// Sends as fast as the client allows, with a bounded window of unacknowledged records.
async fn produce_max(producer: &Producer, duration: Duration) -> (u64, Duration) {
    let value = value();
    let topic: Arc<str> = TOPIC.into();
    let start = Instant::now();
    let mut window = std::collections::VecDeque::new();
    let mut sent = 0u64;
    while start.elapsed() < duration {
        for _ in 0..1000 {
            let mut record = ProducerRecord::new(topic.clone(), None, value.clone());
            record.partition = Some((sent % u64::from(PARTITIONS)) as u32);
            window.push_back(producer.send(record).await.unwrap());
            sent += 1;
        }
        while window.len() > 200_000 {
            window.pop_front().unwrap().await.unwrap();
        }
    }
    for ack in window {
        ack.await.unwrap();
    }
    (sent, start.elapsed())
}

async fn consume_all(
    client: Arc<Client>,
    records: u64,
    partition_fetch_bytes: u32,
) -> (u64, Duration) {
    let mut consumer = Consumer::new(
        client,
        ConsumerConfig {
            partition_max_bytes: partition_fetch_bytes,
            ..ConsumerConfig::default()
        },
    );
    consumer
        .assign(TOPIC, &[], SeekTo::Beginning)
        .await
        .unwrap();
    let start = Instant::now();
    let mut consumed = 0u64;
    while consumed < records {
        for batch in consumer.poll().await.unwrap() {
            consumed += batch.records().count() as u64;
        }
    }
    (consumed, start.elapsed())
}

/// One writer, one reader thread, 1 MiB writes: what loopback TCP moves on the host running the
/// bench, at the time of the run.
fn tcp_loopback(duration: Duration, congestion: Option<&'static str>) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        if let Some(congestion) = congestion {
            socket2::SockRef::from(&stream)
                .set_tcp_congestion(congestion.as_bytes())
                .unwrap();
        }
        let mut buffer = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => return total,
                Ok(read) => total += read as u64,
            }
        }
    });
    let mut stream = TcpStream::connect(address).unwrap();
    if let Some(congestion) = congestion {
        socket2::SockRef::from(&stream)
            .set_tcp_congestion(congestion.as_bytes())
            .unwrap();
    }
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    while start.elapsed() < duration {
        stream.write_all(&chunk).unwrap();
    }
    drop(stream);
    let total = reader.join().unwrap();
    total as f64 / start.elapsed().as_secs_f64() / 1e6
}
