//! The Kafka listener against a current librdkafka: confluent-kafka (PyPI, librdkafka 2.16),
//! where `kafka.rs`'s kcat is Debian's librdkafka 2.0.2. Each test runs a scenario of
//! `kafka_compat/confluent.py` and checks what the client saw, and what the broker kept, against
//! what Kafka's brokers answer.

mod support;

use std::process::{Command, Stdio};

use strata_coordinator::testing::EtcdServer;
use support::{TestNode, etcd_args, free_base_port, metric_total};

/// Runs a scenario of `confluent.py` against `kafka`; returns the JSON it prints.
fn confluent(scenario: &str, kafka: &str, args: &[&str]) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/kafka_compat/confluent.py"
    );
    let output = Command::new("python3")
        .arg(script)
        .arg(scenario)
        .arg(kafka)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 with confluent-kafka (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "the confluent-kafka scenario {scenario} failed"
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A node with a Kafka listener and an admin endpoint on free ports: (node, kafka, admin).
fn kafka_node(dir: &std::path::Path, extra: &[&str]) -> (TestNode, String, u16) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let mut args = vec!["--kafka-listen", &kafka, "--admin", &admin_address];
    args.extend_from_slice(extra);
    let node = TestNode::start_with(dir, 2, &args);
    (node, kafka, admin)
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap().to_string())
        .collect()
}

/// librdkafka 2.1 and later send the all-topics Metadata v12 with three bytes past its end;
/// Kafka's brokers ignore them, and so must Strata, or `list_topics()` and every regex
/// subscription fail with a closed connection.
#[test]
fn a_current_librdkafka_lists_every_topic_and_a_regex_subscription_is_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, admin) = kafka_node(dir.path(), &[]);
    for topic in ["t-one", "t-two", "other"] {
        node.cli(&["topic", "create", topic, "--partitions", "2"], None);
    }
    let seen = confluent("list_topics_and_regex", &kafka, &["regex-readers"]);
    assert_eq!(strings(&seen["topics"]), ["other", "t-one", "t-two"]);
    assert_eq!(strings(&seen["assigned"]), ["t-one", "t-two"]);
    assert_eq!(strings(&seen["values"]), ["one", "two"]);
    // The broker saw the trailing bytes, and counted them.
    assert!(metric_total(admin, "strata_kafka_requests_with_trailing_bytes_total") >= 1.0);
}

/// Topics Kafka clients create without a count take the broker's `--num-partitions`, on first
/// use and through CreateTopics with -1, as Kafka's take `num.partitions`.
#[test]
fn topics_kafka_clients_create_take_the_brokers_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(
        dir.path(),
        &["--kafka-auto-create-topics", "--num-partitions", "4"],
    );
    let counts = confluent("created_topics", &kafka, &[]);
    assert_eq!(counts["on-first-use"], 4);
    assert_eq!(counts["by-defaults"], 4);
    for topic in ["on-first-use", "by-defaults"] {
        let described = support::describe(&node, topic);
        assert_eq!(described["partitions"].as_array().unwrap().len(), 4);
    }
}

/// A commit for a topic the broker does not know, or a partition past a topic's last, is
/// answered UNKNOWN_TOPIC_OR_PARTITION for that partition and stored nowhere; the known
/// partition of the same request is committed. (librdkafka reports the request's error on the
/// partitions that had none, so the known one's success shows in what is committed.)
#[test]
fn offsets_committed_for_unknown_partitions_are_refused_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    node.cli(&["topic", "create", "known", "--partitions", "1"], None);
    let seen = confluent("commit_unknown", &kafka, &["committers"]);
    let errors = &seen["errors"];
    assert_eq!(errors["nowhere/0"], "UNKNOWN_TOPIC_OR_PART", "{seen}");
    assert_eq!(errors["known/99"], "UNKNOWN_TOPIC_OR_PART", "{seen}");
    assert_eq!(seen["committed"], 3);
    let described = node.cli(
        &["group", "describe", "committers", "--format", "json"],
        None,
    );
    assert!(!described.contains("nowhere"), "{described}");
}

/// A header's null value comes back null, told apart from an empty one.
#[test]
fn null_header_values_come_back_null() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    node.cli(&["topic", "create", "headers", "--partitions", "1"], None);
    let seen = confluent("null_headers", &kafka, &[]);
    assert_eq!(
        seen["headers"],
        serde_json::json!([["absent", null], ["blank", ""], ["set", "v"]])
    );
}

/// Kafka takes any non-empty group id: ids with commas, slashes and non-ASCII letters form
/// groups, commit, and a later member resumes from the commit, each apart from the others;
/// the native CLI sees them by the same ids.
#[test]
fn any_non_empty_group_id_forms_a_group_that_commits_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    node.cli(&["topic", "create", "shared", "--partitions", "1"], None);
    node.cli(&["produce", "shared"], Some(b"first\nsecond\n"));
    let groups = ["roundrobin,range", "team/a", "grüppe"];
    let mut args = vec!["shared"];
    args.extend_from_slice(&groups);
    let seen = confluent("group_ids", &kafka, &args);
    for (i, group) in groups.iter().enumerate() {
        let group_seen = &seen[group];
        // Each group reads what was there when it started, then only what came after its
        // commit: the records the earlier groups added, and its own.
        let mut expected_read = vec!["first".to_string(), "second".to_string()];
        expected_read.extend(groups[..i].iter().map(|g| format!("after-{g}")));
        expected_read.sort();
        assert_eq!(strings(&group_seen["read"]), expected_read, "{group}");
        assert_eq!(
            strings(&group_seen["resumed"]),
            [format!("after-{group}")],
            "{group}"
        );
        let described: serde_json::Value = serde_json::from_str(
            &node.cli(&["group", "describe", group, "--format", "json"], None),
        )
        .unwrap();
        assert!(
            described.to_string().contains("shared"),
            "{group}: {described}"
        );
    }
    let listed = node.cli(&["group", "list"], None);
    for group in groups {
        assert!(listed.contains(group), "{group} in {listed}");
    }
}

/// IncrementalAlterConfigs' APPEND and SUBTRACT on a list setting, Kafka's refusal of them on
/// any other, Kafka's `compression.type` and `message.format.version` kept and described,
/// and `validate_only` checking creates and alters without applying them.
#[test]
fn kafka_admin_tools_alter_list_settings_and_dry_run_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    let seen = confluent("configs", &kafka, &[]);
    let null = serde_json::Value::Null;
    assert_eq!(seen["append_delete"], null, "{seen}");
    assert_eq!(seen["subtract_compact"], null, "{seen}");
    assert_eq!(seen["append_compact"], null, "{seen}");
    assert_eq!(seen["append_retention"], "INVALID_CONFIG", "{seen}");
    assert_eq!(seen["validate_only_set"], null, "{seen}");
    assert_eq!(seen["validate_only_bad"], "INVALID_CONFIG", "{seen}");
    // Nothing a dry run checked was applied.
    assert_eq!(
        seen["after_validate_only"]["retention.ms"], "604800000",
        "{seen}"
    );
    assert_eq!(seen["after_validate_only"]["compression.type"], "zstd");
    assert_eq!(
        seen["after_validate_only"]["message.format.version"],
        "2.8-IV1"
    );
    assert_eq!(seen["set_compression"], null);
    assert_eq!(seen["described"]["compression.type"], "lz4");
    assert_eq!(seen["described"]["cleanup.policy"], "compact,delete");
    assert_eq!(seen["described"]["message.timestamp.type"], "CreateTime");
    assert_eq!(seen["create_log_append_time"], null, "{seen}");
    assert_eq!(
        seen["create_bad_timestamp_type"], "INVALID_CONFIG",
        "{seen}"
    );
    assert_eq!(seen["validate_create"], null, "{seen}");
    assert_eq!(seen["validate_create_bad"], "INVALID_CONFIG", "{seen}");
    assert_eq!(
        seen["validate_create_existing"], "TOPIC_ALREADY_EXISTS",
        "{seen}"
    );
    assert_eq!(strings(&seen["topics"]), ["appended", "configured"]);
    let described = support::describe(&node, "configured");
    assert_eq!(described["partitions"].as_array().unwrap().len(), 2);
}

/// A topic name no topic may have is INVALID_TOPIC_EXCEPTION in Metadata when topics are
/// created on first use, so a producer fails those records at once (librdkafka's
/// TOPIC_EXCEPTION) instead of retrying until its timeout, and its good records still go.
#[test]
fn records_for_an_invalid_topic_name_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &["--kafka-auto-create-topics"]);
    let seen = confluent("invalid_topic", &kafka, &[]);
    assert_eq!(seen["reports"]["bad$#!"], "TOPIC_EXCEPTION", "{seen}");
    assert_eq!(seen["reports"]["good"], serde_json::Value::Null, "{seen}");
    assert_eq!(seen["left"], 0);
    assert_eq!(node.cli(&["topic", "list"], None).trim(), "good");
}

/// CreateTopics and CreatePartitions with a replica assignment place the partitions as asked;
/// one naming a broker that is not registered, or not one entry per new partition, is refused
/// with Kafka's INVALID_REPLICA_ASSIGNMENT, dry run or not, and changes nothing.
#[test]
fn kafka_clients_create_topics_with_replica_assignments() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, kafka, _) = kafka_node(dir.path(), &[]);
    let seen = confluent("assigned", &kafka, &[]);
    assert_eq!(seen["placed"], serde_json::Value::Null, "{seen}");
    assert_eq!(
        seen["unknown_broker"], "INVALID_REPLICA_ASSIGNMENT",
        "{seen}"
    );
    assert_eq!(
        seen["unknown_broker_dry_run"], "INVALID_REPLICA_ASSIGNMENT",
        "{seen}"
    );
    assert_eq!(seen["grown"], serde_json::Value::Null, "{seen}");
    assert_eq!(seen["grown_short"], "INVALID_REPLICA_ASSIGNMENT", "{seen}");
    assert_eq!(
        seen["grown_elsewhere_dry_run"], "INVALID_REPLICA_ASSIGNMENT",
        "{seen}"
    );
    assert_eq!(
        seen["partitions"],
        serde_json::json!({"placed": [[1], [1], [1], [1], [1]]})
    );
}

/// A topic's `compression.type` is the codec that batches produced through the Kafka listener
/// are stored with, whatever the producer sent.
#[test]
fn a_topics_compression_type_is_the_codec_kafka_batches_are_stored_with() {
    let dir = tempfile::tempdir().unwrap();
    let (mut node, kafka, _) = kafka_node(dir.path(), &[]);
    node.cli(
        &[
            "topic",
            "create",
            "squeezed",
            "--partitions",
            "1",
            "--config",
            "compression.type=zstd",
        ],
        None,
    );
    confluent("compressed", &kafka, &["squeezed"]);
    node.stop();
    let dump = support::strata()
        .args(["log", "dump"])
        .arg(dir.path().join("squeezed-0"))
        .output()
        .unwrap();
    assert!(dump.status.success());
    let text = String::from_utf8(dump.stdout).unwrap();
    let batches: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("batch "))
        .collect();
    assert!(!batches.is_empty(), "{text}");
    assert!(
        batches.iter().all(|batch| batch.ends_with("codec=zstd")),
        "{text}"
    );
}

/// A compacted topic as Kafka Connect, Schema Registry and Streams' changelogs use one: created
/// through CreateTopics, written by confluent-kafka, read back by it and by kcat. Once cleaned it
/// holds each key's last record at its original offset (tombstones included), and once the
/// tombstones' delete.retention.ms has passed, only the 90 keys still alive; a record without a
/// key is refused as Kafka refuses it.
#[test]
fn a_compacted_topic_keeps_each_keys_last_record_and_drops_tombstones_after_their_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, admin) = kafka_node(dir.path(), &["--cleaner-backoff-ms", "200"]);
    let seen = confluent("compacted", &kafka, &["changelog", "3000"]);
    assert_eq!(
        seen["refused"],
        serde_json::json!(["INVALID_RECORD"]),
        "{seen}"
    );
    let cleaned = seen["cleaned"].as_array().unwrap();
    assert_eq!(cleaned.len(), 100, "{seen}");
    // Each key's last write: versions 0..100 of key k at offset version * 100 + k, then the
    // tombstones of keys 0..10 at 10,000 + k.
    for key in 0..100u64 {
        let (offset, value) = if key < 10 {
            (10_000 + key, serde_json::Value::Null)
        } else {
            (9_900 + key, serde_json::json!(format!("v99-{key}")))
        };
        let expected = serde_json::json!([offset, format!("key{key}"), value]);
        let got = cleaned
            .iter()
            .find(|r| r[1] == format!("key{key}"))
            .unwrap_or_else(|| panic!("key{key} is gone: {seen}"));
        assert_eq!(*got, expected);
    }
    let offsets: Vec<u64> = cleaned.iter().map(|r| r[0].as_u64().unwrap()).collect();
    assert!(
        offsets.windows(2).all(|pair| pair[0] < pair[1]),
        "{offsets:?}"
    );
    let forgotten = seen["forgotten"].as_array().unwrap();
    assert_eq!(forgotten.len(), 90, "{seen}");
    assert!(forgotten.iter().all(|r| !r[2].is_null()), "{seen}");
    // kcat (librdkafka 2.0.2) reads the same, gaps and all.
    let output = support::kcat_command()
        .args([
            "-b",
            &kafka,
            "-C",
            "-t",
            "changelog",
            "-e",
            "-o",
            "beginning",
            "-q",
        ])
        .args(["-f", "%o %k %s\n"])
        .output()
        .expect("kcat");
    assert!(output.status.success());
    let lines: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let expected: Vec<String> = forgotten
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r[0],
                r[1].as_str().unwrap(),
                r[2].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(lines, expected);
    // A fetch at an offset the cleaner removed answers from the next record left.
    let output = support::kcat_command()
        .args([
            "-b",
            &kafka,
            "-C",
            "-t",
            "changelog",
            "-p",
            "0",
            "-o",
            "5000",
            "-c",
            "1",
        ])
        .args(["-q", "-f", "%o %k\\n"])
        .output()
        .expect("kcat");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "9910 key10\n");
    // What the cleaner did, on /metrics and in `topic describe`.
    assert!(metric_total(admin, "strata_log_cleaner_cleans_total") >= 2.0);
    assert!(metric_total(admin, "strata_log_cleaner_removed_records_total") >= 9_910.0);
    assert!(metric_total(admin, "strata_log_cleaner_written_bytes_total") > 0.0);
    let (_, metrics) = support::http_get(admin, "/metrics");
    assert!(
        metrics.contains(
            "strata_log_cleaner_dirty_ratio{node=\"1\",topic=\"changelog\",partition=\"0\"}"
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains("strata_log_cleaner_uncleanable{"),
        "{metrics}"
    );
    let described = support::describe(&node, "changelog");
    let clean_offset = described["partitions"][0]["clean_offset"].as_u64().unwrap();
    assert!(clean_offset >= 10_000, "{described}");
    assert_eq!(described["config"]["cleanup.policy"], "compact");
    drop(node);
}

/// kcat (librdkafka 2.0.2) as the producer: 20 keys written 5 times and tombstones for 3 of them
/// (`-Z`: an empty value is a null) into a compacted topic created through CreateTopics.
#[test]
fn records_kcat_produces_into_a_compacted_topic_are_compacted_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, kafka, _) = kafka_node(dir.path(), &["--cleaner-backoff-ms", "200"]);
    confluent("create_compacted", &kafka, &["kcat-table", "2000"]);
    let mut input: String = (0..5)
        .flat_map(|version| (0..20).map(move |key| format!("key{key}:v{version}-{key}\n")))
        .collect();
    input.push_str("key0:\nkey1:\nkey2:\n");
    let mut kcat = support::kcat_command()
        .args([
            "-b",
            &kafka,
            "-P",
            "-t",
            "kcat-table",
            "-K:",
            "-Z",
            "-X",
            "acks=all",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("kcat");
    use std::io::Write;
    kcat.stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(kcat.wait().unwrap().success());
    // Cleaned: each key once, the three tombstones still there.
    let cleaned = confluent("wait_for", &kafka, &["kcat-table", "20", "30"]);
    let cleaned = cleaned.as_array().unwrap();
    assert_eq!(cleaned.len(), 20, "{cleaned:?}");
    for record in cleaned {
        let key: u64 = record[1].as_str().unwrap()[3..].parse().unwrap();
        if key < 3 {
            assert_eq!(record[0], 100 + key, "{record}");
            assert!(record[2].is_null(), "{record}");
        } else {
            assert_eq!(record[0], 80 + key, "{record}");
            assert_eq!(record[2], format!("v4-{key}"), "{record}");
        }
    }
    // Past delete.retention.ms, the tombstones go.
    let forgotten = confluent("wait_for", &kafka, &["kcat-table", "17", "30"]);
    assert_eq!(forgotten.as_array().unwrap().len(), 17, "{forgotten}");
}

/// The same on three brokers (replication factor 3): every replica compacts its own log, and
/// after a leader change the new leader serves what the old one did; once stopped, the three
/// replicas hold the same records at the same offsets.
#[test]
fn every_replica_of_a_compacted_topic_compacts_to_the_same_records() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(&etcd, &id);
            args.extend_from_slice(&["--cleaner-backoff-ms", "200"]);
            let kafka = format!("127.0.0.1:{}", free_base_port(0));
            args.extend_from_slice(&["--kafka-listen", &kafka]);
            (TestNode::start_with(dir.path(), 1, &args), kafka)
        })
        .collect();
    let bootstrap: Vec<&str> = nodes.iter().map(|(_, kafka)| kafka.as_str()).collect();
    let bootstrap = bootstrap.join(",");
    let seen = confluent("compacted", &bootstrap, &["changelog", "3000", "3"]);
    let forgotten = seen["forgotten"].as_array().unwrap().clone();
    assert_eq!(forgotten.len(), 90, "{seen}");
    // A leader change: the new leader's own compacted log answers the same.
    let leader = support::leaders(&nodes[0].0, "changelog")[0];
    let at = (leader - 1) as usize;
    nodes[at].0.kill();
    let others: Vec<&str> = (0..3)
        .filter(|i| *i != at)
        .map(|i| nodes[i].1.as_str())
        .collect();
    support::wait_for("a new leader", || {
        let alive = (at + 1) % 3;
        support::leaders(&nodes[alive].0, "changelog")[0] != leader
    });
    let read = confluent("read", &others.join(","), &["changelog"]);
    assert_eq!(read.as_array().unwrap(), &forgotten);
    // Every replica, read from its files: the same records at the same offsets (a replica's
    // tombstones go once their own horizon passes, so wait for each to get there).
    nodes[at].0.restart();
    let expected: Vec<String> = forgotten
        .iter()
        .map(|r| {
            format!(
                "{} key=Some({:?}) value=Some({:?})",
                r[0],
                r[1].as_str().unwrap(),
                r[2].as_str().unwrap()
            )
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(6));
    for (node, _) in &mut nodes {
        node.stop();
    }
    for dir in &dirs {
        let records: Vec<String> = support::dumped_records(&dir.path().join("changelog-0"))
            .into_iter()
            .map(|(offset, key_value)| format!("{offset} {key_value}"))
            .collect();
        assert_eq!(records, expected);
    }
}

/// The batches a producer compressed, stored as it sent them and served so: for every codec,
/// a consumer of 20,000 log lines receives no more than 5% over what their producer sent
/// (client statistics), where a broker that stored or served them decompressed would hand
/// out many times that. The log holds them as Kafka batches with their codec.
#[test]
fn kafka_consumers_receive_batches_compressed_as_their_producers_sent_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut node, kafka, _) = kafka_node(dir.path(), &[]);
    let seen = confluent("codecs", &kafka, &["20000"]);
    let uncompressed = seen["none"]["sent_bytes"].as_f64().unwrap();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let run = &seen[codec];
        assert_eq!(run["same"], true, "{codec}: {run}");
        let (sent, received) = (
            run["sent_bytes"].as_f64().unwrap(),
            run["received_bytes"].as_f64().unwrap(),
        );
        assert!(received <= sent * 1.05, "{codec}: {run}");
        if codec != "none" {
            assert!(
                sent * 3.0 < uncompressed,
                "{codec} did not compress: {seen}"
            );
        }
    }
    node.stop();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let dump = support::strata()
            .args(["log", "dump"])
            .arg(dir.path().join(format!("as-sent-{codec}-0")))
            .output()
            .unwrap();
        assert!(dump.status.success());
        let text = String::from_utf8(dump.stdout).unwrap();
        let batches: Vec<&str> = text.lines().filter(|l| l.starts_with("batch ")).collect();
        assert!(
            batches.iter().all(|batch| batch.contains("format=kafka")),
            "{text}"
        );
        // librdkafka sends a lone record uncompressed where compressing would not shrink it:
        // the batches of several records are what must keep the codec.
        let several: Vec<&&str> = batches
            .iter()
            .filter(|batch| !batch.contains(" records=1 "))
            .collect();
        assert!(!several.is_empty(), "{text}");
        assert!(
            several
                .iter()
                .all(|batch| batch.ends_with(&format!("codec={codec}"))),
            "{text}"
        );
    }
}

/// `message.timestamp.type=LogAppendTime` through CreateTopics: records produced with
/// timestamps of 1970 read back with the broker's time, as log-append times, from batches
/// whose CRC the consumer checks (the broker recomputed it); the produce answers report that
/// time to the producer.
#[test]
fn log_append_time_stamps_the_brokers_time_into_kafka_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    let seen = confluent("log_append_time", &kafka, &["appended"]);
    let (before, after) = (
        seen["before_ms"].as_i64().unwrap(),
        seen["after_ms"].as_i64().unwrap(),
    );
    let read = seen["read"].as_array().unwrap();
    assert_eq!(read.len(), 20, "{seen}");
    // Read back, and as the produce answers reported them to the producer.
    let reported = seen["reported"].as_array().unwrap();
    assert_eq!(reported.len(), 20, "{seen}");
    for record in read.iter().chain(reported) {
        assert_eq!(record[0], true, "not a log-append time: {seen}");
        let timestamp = record[1].as_i64().unwrap();
        assert!((before..=after).contains(&timestamp), "{seen}");
    }
    let described = node.cli(&["topic", "describe", "appended", "--format", "json"], None);
    assert!(
        described.contains(r#""message.timestamp.type":"LogAppendTime""#),
        "{described}"
    );
}

/// What a Kafka producer writes (null keys, null and empty values, repeated header keys, null
/// header values; zstd) reads back the same through Strata's own consumer, which decodes the
/// Kafka batches itself, and through a Kafka consumer.
#[test]
fn kafka_records_with_nulls_and_repeated_headers_read_back_through_both_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, _) = kafka_node(dir.path(), &[]);
    node.cli(&["topic", "create", "odd", "--partitions", "1"], None);
    confluent("write_odd", &kafka, &["odd", "zstd"]);
    type Read = (
        Option<String>,
        Option<String>,
        Vec<(String, Option<String>)>,
    );
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
    let expected: Vec<Read> = vec![
        (None, Some("no key".into()), vec![]),
        (Some("k1".into()), None, vec![]),
        (
            Some("k2".into()),
            Some(String::new()),
            vec![
                ("h".into(), Some("1".into())),
                ("h".into(), None),
                ("h".into(), Some(String::new())),
            ],
        ),
        (None, None, vec![("only".into(), None)]),
        (
            Some("k3".into()),
            Some("v3".into()),
            vec![
                ("trace".into(), Some("abc".into())),
                ("span".into(), Some("def".into())),
            ],
        ),
    ];
    let native: Vec<Read> = support::runtime().block_on(async {
        let client =
            strata_client::Client::connect(strata_client::ClientConfig::new(node.bootstrap()))
                .await
                .unwrap();
        let mut consumer =
            strata_client::Consumer::new(client, strata_client::ConsumerConfig::default());
        consumer
            .assign("odd", &[0], strata_client::SeekTo::Beginning)
            .await
            .unwrap();
        let mut read = Vec::new();
        while read.len() < expected.len() {
            for batch in consumer.poll().await.unwrap() {
                assert_eq!(batch.batch.format(), strata_wire::batch::BatchFormat::Kafka);
                for record in batch.records() {
                    read.push((
                        record.key.map(text),
                        record.nullable_value().map(text),
                        record
                            .nullable_headers()
                            .map(|(key, value)| (text(key), value.map(text)))
                            .collect(),
                    ));
                }
            }
        }
        read
    });
    assert_eq!(native, expected);
    let kafka_read = confluent("read_all", &kafka, &["odd", "5"]);
    let kafka_read: Vec<Read> = kafka_read["read"]
        .as_array()
        .unwrap()
        .iter()
        .map(|record| {
            (
                record[1].as_str().map(String::from),
                record[2].as_str().map(String::from),
                record[3]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|header| {
                        (
                            header[0].as_str().unwrap().to_string(),
                            header[1].as_str().map(String::from),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    assert_eq!(kafka_read, expected);
}
