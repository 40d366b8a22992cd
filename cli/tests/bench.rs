//! `strata bench` against a real node.

mod support;

use support::TestNode;

fn report(node: &TestNode, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut all: Vec<&str> = args.to_vec();
    let path_text = path.display().to_string();
    all.extend(["--json", &path_text]);
    node.cli(&all, None);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn assert_monotonic(percentiles: &serde_json::Value) {
    let keys = ["p50", "p90", "p99", "p999", "p9999", "max"];
    let values: Vec<u64> = keys
        .iter()
        .map(|k| percentiles[k].as_u64().unwrap())
        .collect();
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{percentiles}");
    assert!(values[0] > 0);
}

#[test]
fn bench_counts_match_the_broker_and_rates_are_kept() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);

    // A fixed number of records: the JSON count is what the broker stored.
    let produced = report(
        &node,
        &["bench", "produce", "--topic", "b1", "--records", "20000"],
    );
    assert_eq!(produced["workload"], "produce");
    assert_eq!(produced["records"], 20000);
    assert!(produced["host"]["cpus"].as_u64().unwrap() >= 1);
    assert!(produced["host"]["mem_total_mb"].as_u64().unwrap() > 0);
    assert_eq!(produced["bytes"], 20000 * 1024);
    assert_monotonic(&produced["ack_latency_us"]);
    let cpu = produced["bench_cpu_percent"].as_f64().unwrap();
    assert!(
        cpu > 0.0 && cpu < 400.0,
        "the bench reports its own CPU use: {cpu}"
    );
    assert_eq!(support::stored_records(&node, "b1"), 20000);
    // A byte budget instead of a count: as many records of the size as fit.
    let budget = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "b-bytes",
            "--total-bytes",
            "2MB",
            "--record-size",
            "1000",
        ],
    );
    assert_eq!(budget["records"], 2000, "{budget}");
    assert_eq!(support::stored_records(&node, "b-bytes"), 2000);
    // Every measured record's acknowledgement said how durable it was: on this one replica.
    let levels = produced["ack_durability"].as_array().unwrap();
    let acknowledged: u64 = levels.iter().map(|l| l["records"].as_u64().unwrap()).sum();
    assert_eq!(acknowledged, 20000, "{levels:?}");
    assert!(levels.iter().all(|l| l["replicas"] == 1), "{levels:?}");

    // Compressed: the same count stored, in less than half the bytes (the values are word
    // text, not one repeated byte that any codec shrinks a hundredfold).
    let compressed = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "bz",
            "--records",
            "20000",
            "--compression",
            "zstd",
        ],
    );
    assert_eq!(compressed["compression"], "zstd");
    assert_eq!(compressed["records"], 20000);
    assert_eq!(compressed["bytes"], 20000 * 1024);
    assert_eq!(support::stored_records(&node, "bz"), 20000);
    let stored_bytes = support::topic_log_bytes(temp.path(), "bz");
    assert!(
        stored_bytes > 20000 * 1024 / 8 && stored_bytes < 20000 * 1024 / 2,
        "zstd stored {stored_bytes} bytes of 20000 1 KiB records"
    );
    // The report's batch bytes are exactly what the broker stored, and its ratio follows.
    assert_eq!(compressed["sent_batch_bytes"].as_u64(), Some(stored_bytes));
    let ratio = compressed["compression_ratio"].as_f64().unwrap();
    assert!(
        (ratio - (20000.0 * 1024.0) / stored_bytes as f64).abs() < 1e-6,
        "{ratio}"
    );
    // Uncompressed batches are a little larger than their records (headers, record entries).
    let plain_ratio = produced["compression_ratio"].as_f64().unwrap();
    assert!((0.9..1.0).contains(&plain_ratio), "{plain_ratio}");

    // A rate-limited run hits its rate within 5%.
    let hdr_log = temp.path().join("limited.hlog");
    let hdr_log_text = hdr_log.display().to_string();
    let limited = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "b2",
            "--rate",
            "4000",
            "--duration",
            "2",
            "--hdr-log",
            &hdr_log_text,
        ],
    );
    // The open-loop schedule fixes the count; records/s also counts the wait for the last
    // acknowledgements, which a loaded host stretches.
    let records = limited["records"].as_f64().unwrap();
    assert!(
        (records - 8000.0).abs() / 8000.0 < 0.05,
        "4000/s for 2 s: {records} records"
    );
    let rate = limited["records_per_s"].as_f64().unwrap();
    assert!(rate > 3000.0 && rate < 4200.0, "rate {rate}");
    // Per-second latency: in the timeline and as intervals of the HDR log.
    let seconds_with_p99 = limited["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|point| point["ack_p99_us"].as_u64().is_some_and(|p99| p99 > 0))
        .count();
    assert!(seconds_with_p99 >= 2, "{}", limited["timeline"]);
    // The timeline covers the whole run, the part of a second after the last tick included.
    let in_timeline: f64 = limited["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|point| point["produced_records"].as_f64().unwrap())
        .sum();
    assert_eq!(in_timeline, records, "{}", limited["timeline"]);
    let hdr_log = std::fs::read_to_string(&hdr_log).unwrap();
    let ack_intervals = hdr_log
        .lines()
        .filter(|line| line.starts_with("Tag=ack,"))
        .count();
    assert!(ack_intervals >= 2, "one interval per second: {hdr_log}");

    // End to end: every record produced is consumed and timed; --plot draws it.
    let plot = temp.path().join("e2e.svg");
    let plot_text = plot.display().to_string();
    let e2e = report(
        &node,
        &[
            "bench",
            "e2e",
            "--topic",
            "b3",
            "--records",
            "3000",
            "--rate",
            "3000",
            "--plot",
            &plot_text,
        ],
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("e2e latency") && svg.matches("<polyline").count() >= 3,
        "{svg}"
    );
    assert!(e2e["timeline"].as_array().is_some_and(|t| !t.is_empty()));
    assert_eq!(e2e["records"], 3000);
    assert_eq!(e2e["e2e_latency_us"]["count"], 3000);
    assert_monotonic(&e2e["e2e_latency_us"]);

    // Consume on a topic nobody produced to fails at once, saying why, instead of waiting.
    let mut missing = support::strata()
        .args([
            "bench",
            "consume",
            "--topic",
            "never-produced",
            "--records",
            "10",
        ])
        .env("STRATA_BOOTSTRAP", node.bootstrap())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while missing.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            missing.kill().unwrap();
            panic!("a consume run on a topic nobody produced to still waits after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let missing = missing.wait_with_output().unwrap();
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");

    // Consume reads back what the first run stored.
    let consumed = report(
        &node,
        &["bench", "consume", "--topic", "b1", "--records", "20000"],
    );
    assert_eq!(consumed["records"], 20000);

    // Consumers as members of a group share the partitions and read everything once.
    let grouped = report(
        &node,
        &[
            "bench",
            "consume",
            "--topic",
            "b1",
            "--records",
            "20000",
            "--consumers",
            "2",
            "--group",
            "benchers",
        ],
    );
    assert_eq!(grouped["records"], 20000);
}

/// Coordinated omission: a broker paused for 1 s during a fixed-rate run shows the pause in the
/// tail (latency counts from the intended send time, so the stall cannot hide).
#[test]
fn a_paused_broker_shows_in_the_tail() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    node.cli(&["topic", "create", "co", "--partitions", "1"], None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut bench = support::strata()
        .args([
            "bench",
            "produce",
            "--topic",
            "co",
            "--rate",
            "2000",
            "--duration",
            "4",
        ])
        .arg("--json")
        .arg(&path)
        .env("STRATA_BOOTSTRAP", node.bootstrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    node.signal(libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    node.signal(libc::SIGCONT);
    assert!(bench.wait().unwrap().success());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let tail = report["ack_latency_us"]["p999"].as_u64().unwrap();
    let median = report["ack_latency_us"]["p50"].as_u64().unwrap();
    assert!(tail >= 800_000, "the 1 s pause is in p99.9: {tail} µs");
    assert!(
        median < 800_000,
        "most records were not delayed: p50 {median} µs"
    );
}

/// Workload files drive runs (flags win over them); --compare puts two reports side by side.
#[test]
fn workload_files_and_compare() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 1);
    let smoke = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/workloads/smoke.toml");
    let first = report(&node, &["bench", "--workload", smoke, "--duration", "1"]);
    assert_eq!(first["workload"], "e2e");
    assert_eq!(first["topic"], "smoke");
    // The schedule decides the record count (open loop); records/s also counts the time the
    // consumers take to drain, which a loaded CI host stretches, so the count is what is checked.
    assert_eq!(first["target_rate"], 2000.0, "the file's rate applies");
    let records = first["records"].as_f64().unwrap();
    assert!(
        (records - 2000.0).abs() / 2000.0 < 0.1,
        "the file's rate is kept: {records} records in 1 s"
    );
    let second = report(
        &node,
        &[
            "bench",
            "--workload",
            smoke,
            "--duration",
            "1",
            "--rate",
            "1000",
        ],
    );
    assert_eq!(second["target_rate"], 1000.0, "the flag wins");
    let records = second["records"].as_f64().unwrap();
    assert!(
        (records - 1000.0).abs() / 1000.0 < 0.1,
        "the flag's rate is kept: {records} records in 1 s"
    );

    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&a, first.to_string()).unwrap();
    std::fs::write(&b, second.to_string()).unwrap();
    let table = node.cli(
        &[
            "bench",
            "--compare",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
        None,
    );
    let line = table.lines().find(|l| l.starts_with("records ")).unwrap();
    let ratio: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
    assert!((ratio - 0.5).abs() < 0.1, "{line}");
    // And the machine's state at each start, so a reader sees whether both met the same one.
    assert!(
        table.lines().any(|l| l.starts_with("host.mem_free_mb ")),
        "{table}"
    );

    // A workload file's [topic_config] table applies when the bench creates the topic.
    let file = dir.path().join("small-segments.toml");
    std::fs::write(
        &file,
        "workload = \"produce\"\ntopic = \"small\"\npartitions = 1\nrecords = 600\n\
         batch_size = 16384\n[topic_config]\n\"segment.bytes\" = \"65536\"\n",
    )
    .unwrap();
    let produced = report(&node, &["bench", "--workload", file.to_str().unwrap()]);
    assert_eq!(produced["records"], 600);
    let segments = std::fs::read_dir(temp.path().join("small-0"))
        .unwrap()
        .filter(|entry| {
            let path = entry.as_ref().unwrap().path();
            path.extension().is_some_and(|ext| ext == "log")
        })
        .count();
    assert!(segments >= 5, "600 KiB in 64 KiB segments: {segments}");
}

/// The iggy-mirroring presets: producer i writes only partition i in batches of 1000 records,
/// with per-batch latency beside per-record; the consumer preset reads the budget back. The
/// topic is created with the `--topic-config` settings: 1 MiB segments (counted on disk) and
/// leader appends past the page cache, read back whole by the consumers.
#[test]
fn pinned_presets_mirror_iggy_bench() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    let produced = report(
        &node,
        &[
            "bench",
            "--preset",
            "pinned-producer",
            "--producers",
            "2",
            "--total-bytes",
            "4096000",
            "--topic-config",
            "segment.bytes=1048576",
            "--topic-config",
            "direct.writes=always",
            "--durability",
            "synced",
        ],
    );
    // Asked synced, every batch was synced on the leader before its ack.
    assert_eq!(
        produced["ack_durability"],
        serde_json::json!([{"replicas": 1, "synced_replicas": 1, "records": 4000, "share": 1.0}])
    );
    for partition in 0..2 {
        let segments = support::log_segments(&temp.path().join(format!("pinned-{partition}")));
        assert!(segments >= 2, "segment.bytes applied: {segments} segments");
    }
    assert_eq!(produced["records"], 4000);
    assert_eq!(
        produced["batch_latency_us"]["count"], 4,
        "2 producers x 2 batches of 1000"
    );
    assert_monotonic(&produced["batch_latency_us"]);
    let described: serde_json::Value =
        serde_json::from_str(&node.cli(&["topic", "describe", "pinned", "--format", "json"], None))
            .unwrap();
    for partition in described["partitions"].as_array().unwrap() {
        assert_eq!(
            partition["high_watermark"], 2000,
            "one producer per partition"
        );
    }
    let consumed = report(
        &node,
        &[
            "bench",
            "--preset",
            "pinned-consumer",
            "--consumers",
            "2",
            "--total-bytes",
            "4096000",
        ],
    );
    assert_eq!(consumed["records"], 4000);
}

/// `--transactional`: each producer commits every `--txn-records` records and once more at
/// its end; the report counts and times the commits; a `read_committed` consume run reads
/// every record (the markers moved the LSO past them), and the coordinator lists each
/// producer's transactional id as committed.
#[test]
fn transactional_runs_commit_their_records_and_time_each_commit() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    let produced = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "txn",
            "--partitions",
            "2",
            "--producers",
            "2",
            "--records",
            "5000",
            "--transactional",
            "--txn-records",
            "1000",
            "--txn-interval",
            "1h",
        ],
    );
    assert_eq!(produced["records"], 5000);
    assert_eq!(
        produced["commit_latency_us"]["count"], 6,
        "2 producers x (1000, 1000, 500)"
    );
    assert_monotonic(&produced["commit_latency_us"]);
    let listed: serde_json::Value =
        serde_json::from_str(&node.cli(&["txn", "list", "--format", "json"], None)).unwrap();
    let states: Vec<&str> = listed["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|txn| {
            txn["transactional_id"]
                .as_str()
                .unwrap()
                .starts_with("strata-bench-")
        })
        .map(|txn| txn["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["CompleteCommit", "CompleteCommit"], "{listed}");
    let consumed = report(
        &node,
        &[
            "bench",
            "consume",
            "--topic",
            "txn",
            "--records",
            "5000",
            "--isolation",
            "read_committed",
        ],
    );
    assert_eq!(consumed["records"], 5000);
    assert!(consumed["commit_latency_us"].is_null());
}

/// `--broker-admin`: the broker's CPU over the measured run, read from its
/// `process_cpu_seconds_total`, and per GB of records; absent without the flag.
#[test]
fn the_report_has_the_brokers_cpu_per_gb_when_it_can_read_their_metrics() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    let admin = format!("127.0.0.1:{admin}");
    let produced = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "cpu",
            "--records",
            "50000",
            "--broker-admin",
            &admin,
        ],
    );
    let cpu = produced["broker_cpu_seconds"].as_f64().unwrap();
    let per_gb = produced["broker_cpu_s_per_gb"].as_f64().unwrap();
    assert!(cpu > 0.0, "the broker worked: {produced}");
    let gb = produced["bytes"].as_f64().unwrap() / 1e9;
    assert!((per_gb - cpu / gb).abs() < 1e-6, "{produced}");
    let consumed = report(
        &node,
        &[
            "bench",
            "consume",
            "--topic",
            "cpu",
            "--records",
            "50000",
            "--broker-admin",
            &admin,
        ],
    );
    assert!(consumed["broker_cpu_s_per_gb"].as_f64().unwrap() > 0.0);
    let without = report(
        &node,
        &["bench", "produce", "--topic", "cpu", "--records", "100"],
    );
    assert!(without["broker_cpu_seconds"].is_null(), "{without}");
}

/// `--protocol kafka`: the same workloads through librdkafka against the Kafka listener. Every
/// record produced is stored (the listener's own count), a consume run reads them all, the
/// pinned presets keep their shape, and the report names the client.
#[test]
fn the_kafka_protocol_bench_runs_the_same_workloads_through_librdkafka() {
    let temp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", support::free_base_port(0));
    let node = TestNode::start_with(temp.path(), 2, &["--kafka-listen", &kafka]);
    // `strata bench ARGS` over Kafka's protocol, to the listener.
    let over_kafka = |args: &[&'static str]| -> Vec<String> {
        let mut all: Vec<String> = ["bench", "--protocol", "kafka", "--bootstrap", &kafka]
            .iter()
            .map(ToString::to_string)
            .collect();
        all.extend(args.iter().map(ToString::to_string));
        all
    };
    let run = |args: &[&'static str]| {
        let all = over_kafka(args);
        report(&node, &all.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let produced = run(&[
        "produce",
        "--topic",
        "kb",
        "--partitions",
        "3",
        "--producers",
        "2",
        "--records",
        "30000",
    ]);
    let client = produced["client"].as_str().unwrap();
    assert!(client.starts_with("librdkafka 2."), "{client}");
    assert_eq!(produced["records"], 30000);
    assert_monotonic(&produced["ack_latency_us"]);
    assert_eq!(support::stored_records(&node, "kb"), 30000);
    // Records without keys spread over the partitions a batch's worth at a time.
    let described = support::describe(&node, "kb");
    for partition in described["partitions"].as_array().unwrap() {
        assert!(
            partition["high_watermark"].as_u64().unwrap() > 0,
            "{described}"
        );
    }
    let consumed = run(&[
        "consume",
        "--topic",
        "kb",
        "--consumers",
        "2",
        "--records",
        "30000",
    ]);
    assert_eq!(consumed["records"], 30000);
    assert_eq!(consumed["bytes"], 30000 * 1024);
    assert_monotonic(&consumed["e2e_latency_us"]);
    // The pinned preset: producer i writes partition i, batch by batch.
    let pinned = run(&[
        "--preset",
        "pinned-producer",
        "--producers",
        "2",
        "--total-bytes",
        "4096000",
    ]);
    assert_eq!(pinned["records"], 4000);
    assert_eq!(pinned["batch_latency_us"]["count"], 4);
    let described = support::describe(&node, "pinned");
    for partition in described["partitions"].as_array().unwrap() {
        assert_eq!(partition["high_watermark"], 2000, "{described}");
    }
    // What Kafka's protocol cannot carry is refused up front.
    let refused = over_kafka(&[
        "produce",
        "--topic",
        "kb",
        "--records",
        "10",
        "--durability",
        "synced",
    ]);
    let refused = node.cli_output(
        &refused.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--durability synced"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `--spread N`: producers write to the topic's first N partitions only (larger than the topic
/// is refused); `--own-connections`: each producer connects on its own, as separate processes
/// would, where by default they share the bench's connections.
#[test]
fn spread_and_own_connections_shape_the_load() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 2);
    let produced = report(
        &node,
        &[
            "bench",
            "produce",
            "--topic",
            "wide",
            "--partitions",
            "8",
            "--spread",
            "3",
            "--key-distribution",
            "uniform",
            "--records",
            "3000",
        ],
    );
    assert_eq!(produced["records"], 3000);
    let partitions = support::describe(&node, "wide")["partitions"].clone();
    let stored: Vec<(u64, u64)> = partitions
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition"].as_u64().unwrap(),
                p["high_watermark"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(stored.len(), 8);
    assert_eq!(stored.iter().map(|(_, n)| n).sum::<u64>(), 3000);
    for (partition, records) in &stored {
        assert_eq!(*partition < 3, *records > 0, "{stored:?}");
    }
    let refused = node.cli_output(
        &[
            "bench",
            "produce",
            "--topic",
            "wide",
            "--spread",
            "9",
            "--records",
            "10",
        ],
        None,
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--spread 9"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let accepted = || support::metric_total(admin, "strata_native_connections_accepted_total");
    let producers = ["--topic", "wide", "--producers", "6", "--records", "600"];
    let before = accepted();
    report(&node, &[&["bench", "produce"][..], &producers].concat());
    let shared = accepted() - before;
    let before = accepted();
    report(
        &node,
        &[&["bench", "produce", "--own-connections"][..], &producers].concat(),
    );
    let own = accepted() - before;
    assert!(
        own >= shared + 6.0,
        "six producers on their own connections: {own} accepted, {shared} when shared"
    );
    assert_eq!(support::stored_records(&node, "wide"), 3000 + 1200);
}

/// 20 consumers of one group joining at once, each on its own connection, while records keep
/// coming to every partition: every member gets a partition and reads from it, and the report
/// says when the last one had its first record.
#[test]
fn a_group_joining_at_once_reports_when_every_member_reads() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start(temp.path(), 2);
    let fleet = |group: &str, consumers: &str| {
        report(
            &node,
            &[
                "bench",
                "e2e",
                "--topic",
                "members",
                "--partitions",
                "20",
                "--key-distribution",
                "uniform",
                "--rate",
                "2000",
                "--duration",
                "6s",
                "--group",
                group,
                "--consumers",
                consumers,
                "--own-connections",
            ],
        )
    };
    let joined = fleet("fleet", "20");
    assert!(joined["records"].as_u64().unwrap() > 5000, "{joined}");
    let ready = joined["consumers_ready_s"].as_f64().unwrap();
    assert!(ready > 0.0 && ready < 6.0, "{joined}");
    // More members than partitions: some never read, and the report says nothing then.
    let crowded = fleet("crowd", "24");
    assert!(crowded["consumers_ready_s"].is_null(), "{crowded}");
}

/// `bench idle`: a topic's partitions created and watched at rest, the broker's CPU, memory and
/// open files read from its metrics. `bench ready`: started before the node, it waits for it,
/// then for every partition to answer.
#[test]
fn scale_workloads_watch_a_node_at_rest_and_while_it_starts() {
    let temp = tempfile::tempdir().unwrap();
    let (mut node, admin) = TestNode::start_with_admin(temp.path(), 2);
    let admin = format!("127.0.0.1:{admin}");
    let idle = [
        "bench",
        "idle",
        "--topic",
        "many",
        "--partitions",
        "60",
        "--duration",
        "2s",
        "--broker-admin",
        &admin,
    ];
    let created = report(&node, &idle);
    assert_eq!(created["partitions"], 60);
    assert_eq!(created["created"], true);
    assert!(created["create_s"].as_f64().unwrap() > 0.0, "{created}");
    let cpu = created["broker_cpu_percent"].as_f64().unwrap();
    assert!((0.0..200.0).contains(&cpu), "{created}");
    assert!(created["idle_s"].as_f64().unwrap() >= 2.0, "{created}");
    assert!(
        created["resident_bytes_per_partition"].is_number(),
        "{created}"
    );
    // Each partition holds its active segment's log open (twice where the file system takes
    // O_DIRECT), and nothing else: index files and checkpoints are opened when written.
    let open_files = created["broker_open_fds"].as_u64().unwrap();
    assert!(
        (60..=60 * 2 + 100).contains(&open_files),
        "60 partitions: {created}"
    );
    // On a topic that exists: nothing created, nothing to divide the memory by.
    let again = report(&node, &idle);
    assert_eq!(again["created"], false);
    assert!(again["create_s"].is_null() && again["resident_bytes_per_partition"].is_null());
    let refused = node.cli_output(&["bench", "idle", "--topic", "x"], None);
    assert!(!refused.status.success(), "idle needs --broker-admin");

    node.stop();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("ready.json");
    let mut probe = support::strata()
        .args([
            "bench",
            "ready",
            "--bootstrap",
            &node.bootstrap(),
            "--topic",
            "many",
        ])
        .args(["--duration", "60s", "--json", json.to_str().unwrap()])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    node.respawn();
    assert!(probe.wait().unwrap().success());
    let ready: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(ready["partitions"], 60);
    let (serving, recovered) = (
        ready["serving_s"].as_f64().unwrap(),
        ready["recovered_s"].as_f64().unwrap(),
    );
    assert!(serving >= 0.7, "the probe waited for the node: {ready}");
    assert!(recovered >= serving, "{ready}");
    assert!(ready["probes"].as_u64().unwrap() > 60, "{ready}");
    // Nobody there: the probe gives up after its --duration, with an error.
    node.stop();
    let lonely = node.cli_output(
        &["bench", "ready", "--topic", "many", "--duration", "500ms"],
        None,
    );
    assert!(!lonely.status.success());
}
