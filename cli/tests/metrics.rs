//! The admin endpoint: Prometheus text that parses and counts what was sent.

mod support;

use support::{TestNode, http_get};

/// Parses Prometheus text exposition: `# HELP`/`# TYPE` comments and `name{labels} value`
/// samples; panics on anything else.
fn parse(text: &str) -> Vec<(String, String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        // Every series is a count, a gauge of things, or a duration (no "-0" either).
        assert!(!value.is_sign_negative(), "negative value: {line}");
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                assert!(labels.ends_with('}'), "unclosed labels: {line}");
                (name, labels.trim_end_matches('}'))
            }
            None => (series, ""),
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        for label in labels.split(',').filter(|l| !l.is_empty()) {
            let (key, quoted) = label
                .split_once('=')
                .unwrap_or_else(|| panic!("bad label: {line}"));
            assert!(
                !key.is_empty() && quoted.starts_with('"') && quoted.ends_with('"'),
                "{line}"
            );
        }
        samples.push((name.to_string(), labels.to_string(), value));
    }
    samples
}

fn sample(samples: &[(String, String, f64)], name: &str, label: &str) -> f64 {
    samples
        .iter()
        .find(|(n, labels, _)| n == name && labels.contains(label))
        .unwrap_or_else(|| panic!("no {name} with {label}"))
        .2
}

/// The sum of a metric over all its series (shards).
fn total(samples: &[(String, String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, value)| value)
        .sum()
}

#[test]
fn metrics_parse_and_count_the_traffic() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 2);
    node.cli(
        &[
            "topic",
            "create",
            "m",
            "--partitions",
            "2",
            "--config",
            "flush=always",
        ],
        None,
    );
    let input: String = (0..500).map(|i| format!("value-{i:04}\n")).collect();
    node.cli(&["produce", "m"], Some(input.as_bytes()));
    node.cli(
        &["consume", "m", "--from-beginning", "--max-messages", "500"],
        None,
    );

    let (status, body) = http_get(admin, "/metrics");
    assert!(status.contains("200"), "{status}");
    let samples = parse(&body);
    assert_eq!(
        sample(&samples, "strata_records_in_total", "topic=\"m\""),
        500.0
    );
    assert!(sample(&samples, "strata_bytes_in_total", "topic=\"m\"") >= 500.0 * 10.0);
    assert!(sample(&samples, "strata_bytes_out_total", "topic=\"m\"") >= 500.0 * 10.0);
    // Whole batches are served: at least the 500 consumed, at most what is stored.
    let records_out = sample(&samples, "strata_records_out_total", "topic=\"m\"");
    assert!((500.0..=1000.0).contains(&records_out), "{records_out}");
    // flush=always: every produce waited for a sync, each one timed.
    let syncs = sample(&samples, "strata_fsync_latency_seconds_count", "node=\"1\"");
    assert!(syncs >= 1.0, "{syncs}");
    // Every fetch that served records timed their age (end to end as the broker sees it).
    let served = sample(&samples, "strata_e2e_latency_seconds_count", "node=\"1\"");
    assert!(served >= 1.0, "{served}");
    let replicas = total(&samples, "strata_replica_partitions");
    assert_eq!(replicas, 2.0);
    // The consumer's reads came from the segment files: this topic keeps no tail cache.
    assert!(total(&samples, "strata_log_file_reads_total") >= 1.0);
    assert_eq!(total(&samples, "strata_tail_cache_reads_total"), 0.0);
    // The shards' io_uring operations were counted (writes and syncs happened).
    let io_max = total(&samples, "strata_io_uring_in_flight_max");
    if strata_node::io::Backend::detect() == strata_node::io::Backend::IoUring {
        assert!(io_max >= 1.0, "{io_max}");
    }
    let produce_count = sample(
        &samples,
        "strata_produce_latency_seconds_count",
        "node=\"1\"",
    );
    assert!(produce_count >= 1.0);
    let infinite = sample(
        &samples,
        "strata_produce_latency_seconds_bucket",
        "le=\"+Inf\"",
    );
    assert_eq!(infinite, produce_count, "buckets end at the count");
    let partitions = total(&samples, "strata_partitions");
    assert_eq!(partitions, 2.0);
    // The host's memory stalls, where the kernel keeps them (`/proc/pressure/memory`, with PSI).
    let stalls = samples
        .iter()
        .filter(|(name, _, _)| name == "strata_host_memory_stall_seconds_total")
        .count();
    let kept = std::path::Path::new("/proc/pressure/memory").exists();
    assert_eq!(stalls, usize::from(kept));

    // Appends of 256 KiB and more to a topic with direct.writes=always go past the page
    // cache, and are counted; the small ones above were not.
    let direct = total(&samples, "strata_direct_writes_total");
    assert_eq!(direct, 0.0);
    // 1,000 records of 1 KiB generated at once, in one batch (sealed when full or after 0.5 s):
    // an append of about 1 MB.
    node.cli(
        &[
            "bench",
            "produce",
            "--topic",
            "d",
            "--partitions",
            "1",
            "--records",
            "1000",
            "--linger-ms",
            "500",
            "--topic-config",
            "direct.writes=always",
        ],
        None,
    );
    let samples = parse(&http_get(admin, "/metrics").1);
    assert!(total(&samples, "strata_direct_writes_total") >= 1.0);
    assert!(total(&samples, "strata_direct_write_bytes_total") >= 256.0 * 1024.0);

    // Records to many partitions at once, keyed: their interval syncs (1 s by default) come
    // due together, and each shard's round of them is one syncfs.
    node.cli(
        &[
            "bench",
            "produce",
            "--topic",
            "wide",
            "--partitions",
            "64",
            "--records",
            "256",
            "--key-distribution",
            "uniform",
            "--linger-ms",
            "100",
        ],
        None,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let samples = parse(&http_get(admin, "/metrics").1);
        let (rounds, logs) = (
            total(&samples, "strata_sync_rounds_total"),
            total(&samples, "strata_sync_round_logs_total"),
        );
        if rounds >= 1.0 && logs >= rounds {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no interval sync went through a round: {rounds} rounds, {logs} logs"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let (status, body) = http_get(admin, "/health");
    assert!(status.contains("200") && body.trim() == "ok");
    let (status, body) = http_get(admin, "/v1/cluster");
    assert!(status.contains("200"));
    let cluster: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(cluster["brokers"].as_array().unwrap().len(), 1);
    assert_eq!(cluster["topics"][0]["name"], "m");
    let (status, _) = http_get(admin, "/nope");
    assert!(status.contains("404"));
}

/// The default durability (`flush=interval`) on a broker of a few partitions: each log syncs its
/// own files (a shard's shared `syncfs` round needs 8), and those syncs are timed too. Before,
/// only `flush=always` syncs and shared rounds were, so the fsync histogram of a small broker
/// with default settings stayed empty.
#[test]
fn interval_syncs_of_a_few_partitions_are_timed() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    node.cli(
        &[
            "topic",
            "create",
            "few",
            "--partitions",
            "2",
            "--config",
            "flush.interval.ms=50",
        ],
        None,
    );
    let input: String = (0..100).map(|i| format!("value-{i:04}\n")).collect();
    node.cli(&["produce", "few"], Some(input.as_bytes()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let samples = parse(&http_get(admin, "/metrics").1);
        let syncs = sample(&samples, "strata_fsync_latency_seconds_count", "node=\"1\"");
        if syncs >= 1.0 {
            assert_eq!(
                total(&samples, "strata_sync_rounds_total"),
                0.0,
                "two logs make no shared round"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no interval sync was timed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The live dashboard loads in headless Chromium against a running node and draws its charts
/// from real scrapes (each chart records how many points it drew).
#[test]
fn the_dashboard_draws_charts_in_headless_chromium() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    // Traffic while the page watches.
    let mut bench = support::strata()
        .args([
            "bench",
            "e2e",
            "--topic",
            "dash",
            "--rate",
            "2000",
            "--duration",
            "8",
        ])
        .env("STRATA_BOOTSTRAP", node.bootstrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Open the page once traffic flows.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, body) = http_get(admin, "/metrics");
        let flowing = parse(&body)
            .iter()
            .any(|(name, _, value)| name == "strata_records_in_total" && *value > 0.0);
        if flowing {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no traffic reached the node"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let profile = tempfile::tempdir().unwrap();
    let output = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=6000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://127.0.0.1:{admin}/dashboard"))
        .output()
        .expect("chromium (Debian package chromium)");
    let _ = bench.wait();
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(dom.contains("updated "), "the page scraped /metrics: {dom}");
    for chart in ["produce", "e2e", "fetch", "throughput", "records"] {
        let marker = format!("id=\"{chart}\"");
        let tag = dom
            .split("<canvas")
            .find(|tag| tag.contains(&marker))
            .unwrap_or_else(|| panic!("no {chart} chart"));
        let points: usize = tag
            .split("data-points=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(points >= 2, "{chart} drew {points} points");
        let max: f64 = tag
            .split("data-max=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        assert!(max > 0.0, "{chart} shows data (max {max})");
    }
}

/// The shipped Grafana dashboard only queries metrics the node exports.
#[test]
fn the_grafana_dashboard_queries_exported_metrics() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    node.cli(&["topic", "create", "g", "--partitions", "1"], None);
    node.cli(&["produce", "g"], Some(b"one\n"));
    let (_, body) = http_get(admin, "/metrics");
    // Families are declared (`# TYPE`) even before they have samples (lag needs a group).
    let exported: std::collections::BTreeSet<String> = parse(&body)
        .into_iter()
        .map(|(name, _, _)| name)
        .chain(body.lines().filter_map(|line| {
            let family = line.strip_prefix("# TYPE ")?.split_whitespace().next()?;
            Some(family.to_string())
        }))
        .flat_map(|name| {
            // A histogram family's samples are name_bucket, name_sum and name_count.
            ["", "_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}"))
        })
        .collect();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tuning/dashboards/grafana.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("strata_") {
                    assert!(
                        exported.contains(word),
                        "{word} is not exported (panel {})",
                        panel["title"]
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 8);
}

#[test]
fn consumer_lag_per_group_and_partition_is_exported() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    node.cli(&["topic", "create", "lagging", "--partitions", "2"], None);
    // 50 records in each partition (keyless records would all go to one: the sticky
    // partitioner fills a batch's worth at a time).
    for partition in ["0", "1"] {
        let input: String = (0..50).map(|i| format!("value-{i:03}\n")).collect();
        node.cli(
            &[
                "produce",
                "lagging",
                "--acks",
                "all",
                "--partition",
                partition,
            ],
            Some(input.as_bytes()),
        );
    }
    // The group reads 60 of the 100 records and commits exactly those.
    node.cli(
        &[
            "consume",
            "lagging",
            "--group",
            "slow",
            "--from-beginning",
            "--max-messages",
            "60",
        ],
        None,
    );
    let sum = |samples: &[(String, String, f64)], name: &str| -> f64 {
        samples
            .iter()
            .filter(|(n, labels, _)| n == name && labels.contains("group=\"slow\""))
            .map(|(_, _, value)| value)
            .sum()
    };
    // Lag is measured every 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let samples = parse(&http_get(admin, "/metrics").1);
        if sum(&samples, "strata_consumer_lag") == 40.0 {
            assert_eq!(sum(&samples, "strata_group_committed_offset"), 60.0);
            let partitions = samples
                .iter()
                .filter(|(n, labels, _)| {
                    n == "strata_consumer_lag" && labels.contains("group=\"slow\"")
                })
                .count();
            assert_eq!(partitions, 2, "one lag series per partition");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no lag of 40 for group slow"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// A `direct.writes=always` topic keeps its newest appends in memory: a consumer at its end is
/// served from there (and sees every record), while a topic on the page cache reads its files.
#[test]
fn tail_reads_of_an_always_topic_come_from_memory() {
    let temp = tempfile::tempdir().unwrap();
    let (node, admin) = TestNode::start_with_admin(temp.path(), 1);
    node.cli(
        &[
            "topic",
            "create",
            "tail",
            "--partitions",
            "1",
            "--config",
            "direct.writes=always",
        ],
        None,
    );
    let counts = || {
        let (_, body) = http_get(admin, "/metrics");
        let samples = parse(&body);
        (
            total(&samples, "strata_tail_cache_reads_total"),
            total(&samples, "strata_log_file_reads_total"),
        )
    };
    let input: String = (0..300).map(|i| format!("record-{i:04}\n")).collect();
    node.cli(&["produce", "tail"], Some(input.as_bytes()));
    let before = counts();
    let consumed = node.cli(
        &[
            "consume",
            "tail",
            "--from-beginning",
            "--max-messages",
            "300",
        ],
        None,
    );
    assert_eq!(
        consumed.lines().collect::<Vec<_>>(),
        input.lines().collect::<Vec<_>>()
    );
    let after = counts();
    assert!(
        after.0 > before.0,
        "no read came from the cache: {before:?} -> {after:?}"
    );
    assert_eq!(
        after.1, before.1,
        "a read went to the files: {before:?} -> {after:?}"
    );
}
