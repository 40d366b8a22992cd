//! The Kafka surface operators' tools call, through the Java client's AdminClient
//! (`kafka_admin/AdminSurface.java`, one step per run, each printing one JSON line), on one
//! node and on three brokers: each API checked for its effect, not only for an answer.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use strata_coordinator::testing::EtcdServer;
use support::{AdminSurface, TestNode, etcd_args, free_base_port, log_segments, wait_for_at_most};

/// Broker `id` on `etcd` with a Kafka listener: (node, its Kafka address).
fn broker(etcd: &EtcdServer, dir: &Path, id: &str, extra: &[&str]) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let mut args = etcd_args(etcd, id);
    args.extend_from_slice(&["--kafka-listen", &kafka]);
    args.extend_from_slice(extra);
    (TestNode::start_with(dir, 1, &args), kafka)
}

/// Brokers 1, 2 and 3 on `etcd`, in `dirs`, and their Kafka listeners as a bootstrap list.
fn three_brokers(
    etcd: &EtcdServer,
    dirs: &[tempfile::TempDir],
) -> (Vec<(TestNode, String)>, String) {
    let brokers: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| broker(etcd, dir.path(), &(i + 1).to_string(), &[]))
        .collect();
    let all: Vec<&str> = brokers.iter().map(|(_, kafka)| kafka.as_str()).collect();
    let bootstrap = all.join(",");
    (brokers, bootstrap)
}

/// `count` records produced to partition 0 of `topic`.
fn produce_to_partition_0(java: &AdminSurface, bootstrap: &str, topic: &str, count: u64) {
    let count_text = count.to_string();
    let produced = java.step(
        bootstrap,
        &["produce", topic, &count_text, "none", "partition=0"],
    );
    assert_eq!(produced["acked"], count, "{produced}");
}

/// OffsetForLeaderEpoch v4 for partition 0 of `elect` at `leader` (a Kafka address):
/// (error code, leader epoch, end offset).
fn epoch_end(leader: &str, epoch: i32, current_leader_epoch: i32) -> (i16, i32, i64) {
    use strata_kafka::kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    use strata_kafka::kafka_protocol::messages::{
        ApiKey, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
    };
    use strata_kafka::kafka_protocol::protocol::StrBytes;
    let request = OffsetForLeaderEpochRequest::default()
        .with_replica_id(strata_kafka::kafka_protocol::messages::BrokerId(-1))
        .with_topics(vec![
            OffsetForLeaderTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("elect")))
                .with_partitions(vec![
                    OffsetForLeaderPartition::default()
                        .with_partition(0)
                        .with_current_leader_epoch(current_leader_epoch)
                        .with_leader_epoch(epoch),
                ]),
        ]);
    let response: OffsetForLeaderEpochResponse =
        support::raw_request(leader, ApiKey::OffsetForLeaderEpoch, 4, &request);
    let partition = &response.topics[0].partitions[0];
    (
        partition.error_code,
        partition.leader_epoch,
        partition.end_offset,
    )
}

/// ListOffsets v7 (latest) for partition 0 of `elect` at `leader`, naming
/// `current_leader_epoch`: (error code, offset).
fn latest_offset(leader: &str, current_leader_epoch: i32) -> (i16, i64) {
    use strata_kafka::kafka_protocol::messages::list_offsets_request::{
        ListOffsetsPartition, ListOffsetsTopic,
    };
    use strata_kafka::kafka_protocol::messages::{
        ApiKey, BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName,
    };
    use strata_kafka::kafka_protocol::protocol::StrBytes;
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("elect")))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_current_leader_epoch(current_leader_epoch)
                        .with_timestamp(-1),
                ]),
        ]);
    let response: ListOffsetsResponse =
        support::raw_request(leader, ApiKey::ListOffsets, 7, &request);
    let partition = &response.topics[0].partitions[0];
    (partition.error_code, partition.offset)
}

/// The replicas, ISR and leader of `topic`'s partition `partition` as AdminClient describes it
/// (waiting for a new topic to reach the broker answering).
fn described(java: &AdminSurface, bootstrap: &str, topic: &str, partition: usize) -> Value {
    let mut described = Value::Null;
    wait_for_at_most("the topic described", Duration::from_secs(10), || {
        let topics = java.step(bootstrap, &["describe-topics", topic]);
        described = topics["topics"][0]["partitions"][partition].clone();
        !described.is_null()
    });
    described
}

/// DescribeCluster, DescribeTopicPartitions, a reassignment listed while it runs, cancelled,
/// run again to completion; preferred and unclean elections, each with its effect on the
/// partition's leader.
#[test]
fn the_java_admin_client_reassigns_partitions_and_elects_leaders_on_three_brokers() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut brokers: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| broker(&etcd, dir.path(), &(i + 1).to_string(), &[]))
        .collect();
    let all: Vec<String> = brokers.iter().map(|(_, kafka)| kafka.clone()).collect();
    let bootstrap = all.join(",");
    let java = AdminSurface::compile();

    let cluster = java.step(&bootstrap, &["describe-cluster"]);
    assert_eq!(cluster["cluster_id"], "itest", "{cluster}");
    let ids: Vec<i64> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3], "{cluster}");
    assert!(ids.contains(&cluster["controller"].as_i64().unwrap()));
    for (id, node) in cluster["nodes"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            node["port"].as_i64().unwrap().to_string(),
            all[id].split(':').nth(1).unwrap()
        );
    }

    // DeleteRecords: the log start moves on the leader and on its followers, so a consumer
    // from the beginning starts there after the leader is gone too.
    java.step(&bootstrap, &["create-topic", "trim", "1", "3"]);
    produce_to_partition_0(&java, &bootstrap, "trim", 200);
    let deleted = java.step(&bootstrap, &["delete-records", "trim", "0", "150"]);
    assert_eq!(deleted, json!({"low_watermark": 150}));
    let first = java.step(&bootstrap, &["consume-beginning", "trim", "0", "1"]);
    assert_eq!(first["records"][0]["offset"], 150, "{first}");
    let leader = described(&java, &bootstrap, "trim", 0)["leader"]
        .as_i64()
        .unwrap();
    let at = |id: i64| (id - 1) as usize;
    brokers[at(leader)].0.stop();
    let others: Vec<&str> = (1..=3)
        .filter(|id| *id != leader)
        .map(|id| all[at(id)].as_str())
        .collect();
    let others = others.join(",");
    wait_for_at_most("a new leader of trim", Duration::from_secs(20), || {
        let now = described(&java, &others, "trim", 0)["leader"].clone();
        now != leader && now != -1
    });
    let first = java.step(&others, &["consume-beginning", "trim", "0", "1"]);
    assert_eq!(first["records"][0]["offset"], 150, "{first}");
    let earliest = java.step(&others, &["list-offsets", "trim", "0", "earliest"]);
    assert_eq!(earliest["offset"], 150, "{earliest}");
    let past = java.step(&others, &["delete-records", "trim", "0", "999"]);
    assert_eq!(past["error"], "OffsetOutOfRangeException", "{past}");
    brokers[at(leader)].0.restart();

    // A reassignment slowed by its catch-up throttle is listed while it runs, with the
    // replicas it adds and removes; a cancel goes back to where it started.
    let created = java.step(
        &bootstrap,
        &[
            "create-topic",
            "moves",
            "1",
            "2",
            "replica.recovery.bytes.per.sec=4000",
        ],
    );
    assert_eq!(created, json!({"created": true}));
    let partition = described(&java, &bootstrap, "moves", 0);
    let from: Vec<i64> = serde_json::from_value(partition["replicas"].clone()).unwrap();
    let spare = (1..=3).find(|id| !from.contains(id)).unwrap();
    // Kafka batches are stored as the producer sent them, compact: enough records that the
    // catch-up outlasts one throttled answer (64 KiB) by many seconds at 4,000 bytes/s.
    let produced = java.step(&bootstrap, &["produce", "moves", "10000", "none"]);
    assert_eq!(produced["acked"], 10000, "{produced}");
    let target = format!("{},{spare}", from[1]);
    let started = java.step(&bootstrap, &["reassign", "moves", "0", &target]);
    assert_eq!(started, json!({"reassigned": true}));
    let listed = java.step(&bootstrap, &["list-reassignments"]);
    let moving = &listed["reassignments"]["moves-0"];
    assert_eq!(moving["adding"], json!([spare]), "{listed}");
    assert_eq!(moving["removing"], json!([from[0]]), "{listed}");
    assert_eq!(
        moving["replicas"],
        json!([from[0], from[1], spare]),
        "{listed}"
    );
    let cancelled = java.step(&bootstrap, &["reassign", "moves", "0", "cancel"]);
    assert_eq!(cancelled, json!({"reassigned": true}));
    wait_for_at_most("the cancel to complete", Duration::from_secs(20), || {
        let listed = java.step(&bootstrap, &["list-reassignments"]);
        listed["reassignments"].as_object().unwrap().is_empty()
    });
    let partition = described(&java, &bootstrap, "moves", 0);
    assert_eq!(partition["replicas"], json!(from), "{partition}");
    let again = java.step(&bootstrap, &["reassign", "moves", "0", "cancel"]);
    assert_eq!(
        again["error"], "NoReassignmentInProgressException",
        "{again}"
    );
    // Without the throttle it runs to completion and leaves the listing.
    let unthrottled = java.step(
        &bootstrap,
        &[
            "alter-config",
            "topic",
            "moves",
            "replica.recovery.bytes.per.sec",
            "--delete",
        ],
    );
    assert_eq!(unthrottled, json!({"altered": true}));
    java.step(&bootstrap, &["reassign", "moves", "0", &target]);
    wait_for_at_most(
        "the reassignment to complete",
        Duration::from_secs(30),
        || {
            let listed = java.step(&bootstrap, &["list-reassignments"]);
            listed["reassignments"].as_object().unwrap().is_empty()
        },
    );
    let partition = described(&java, &bootstrap, "moves", 0);
    assert_eq!(
        partition["replicas"],
        json!([from[1], spare]),
        "{partition}"
    );
    // Preferred election: the preferred replica's broker restarts, its leadership stays with
    // the other replica (the controller's own rebalance is minutes away) until asked back.
    java.step(&bootstrap, &["create-topic", "elect", "1", "2"]);
    let partition = described(&java, &bootstrap, "elect", 0);
    let replicas: Vec<i64> = serde_json::from_value(partition["replicas"].clone()).unwrap();
    let (preferred, other) = (replicas[0], replicas[1]);
    assert_eq!(partition["leader"], preferred);
    let not_needed = java.step(&bootstrap, &["elect-leaders", "preferred", "elect", "0"]);
    assert_eq!(
        not_needed["results"]["elect-0"],
        "ElectionNotNeededException"
    );
    // 20 records at leader epoch 0 here, 20 more at epoch 1 once the other replica leads.
    produce_to_partition_0(&java, &bootstrap, "elect", 20);
    let at = |id: i64| (id - 1) as usize;
    brokers[at(preferred)].0.stop();
    let survivors = |down: &[i64]| -> String {
        (1..=3)
            .filter(|id| !down.contains(id))
            .map(|id| all[at(id)].as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let up = survivors(&[preferred]);
    wait_for_at_most("the other replica to lead", Duration::from_secs(20), || {
        described(&java, &up, "elect", 0)["leader"] == other
    });
    produce_to_partition_0(&java, &up, "elect", 20);
    let list = |spec: &str| java.step(&up, &["list-offsets", "elect", "0", spec]);
    assert_eq!(list("earliest")["leader_epoch"], 0);
    assert_eq!(
        list("latest"),
        json!({"offset": 40, "timestamp": -1, "leader_epoch": 1})
    );
    // OffsetForLeaderEpoch: where each epoch ended, and the caller's epoch fenced.
    let leader = all[at(other)].as_str();
    assert_eq!(epoch_end(leader, 0, -1), (0, 0, 20));
    assert_eq!(epoch_end(leader, 1, 1), (0, 1, 40));
    assert_eq!(epoch_end(leader, 7, -1), (0, 1, 40));
    assert_eq!(epoch_end(leader, 0, 0).0, 74, "FENCED_LEADER_EPOCH");
    assert_eq!(epoch_end(leader, 0, 9).0, 75, "UNKNOWN_LEADER_EPOCH");
    // ListOffsets checks the caller's leader epoch the same way.
    assert_eq!(latest_offset(leader, 1), (0, 40));
    assert_eq!(latest_offset(leader, 0).0, 74, "FENCED_LEADER_EPOCH");
    assert_eq!(latest_offset(leader, 9).0, 75, "UNKNOWN_LEADER_EPOCH");
    assert_eq!(
        latest_offset(leader, -1),
        (0, 40),
        "no epoch named: not checked"
    );
    brokers[at(preferred)].0.restart();
    wait_for_at_most(
        "the preferred replica back in sync",
        Duration::from_secs(20),
        || {
            let isr = &described(&java, &bootstrap, "elect", 0)["isr"];
            isr.as_array().unwrap().len() == 2
        },
    );
    assert_eq!(described(&java, &bootstrap, "elect", 0)["leader"], other);
    let elected = java.step(&bootstrap, &["elect-leaders", "preferred", "elect", "0"]);
    assert_eq!(elected["results"]["elect-0"], Value::Null, "{elected}");
    assert_eq!(
        described(&java, &bootstrap, "elect", 0)["leader"],
        preferred
    );

    // Unclean election: the leader stops, then the last in-sync replica; the first comes
    // back out of sync and the partition stays leaderless (unclean.leader.election.enable is
    // off) until an unclean election gives it that replica.
    brokers[at(preferred)].0.stop();
    let up = survivors(&[preferred]);
    wait_for_at_most(
        "the other replica to lead alone",
        Duration::from_secs(20),
        || {
            let partition = described(&java, &up, "elect", 0);
            partition["leader"] == other && partition["isr"] == json!([other])
        },
    );
    brokers[at(other)].0.stop();
    brokers[at(preferred)].0.restart();
    let up = survivors(&[other]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(described(&java, &up, "elect", 0)["leader"], -1);
    let refused = java.step(&up, &["elect-leaders", "preferred", "elect", "0"]);
    assert_eq!(
        refused["results"]["elect-0"],
        "PreferredLeaderNotAvailableException"
    );
    let unclean = java.step(&up, &["elect-leaders", "unclean", "elect", "0"]);
    assert_eq!(unclean["results"]["elect-0"], Value::Null, "{unclean}");
    let partition = described(&java, &up, "elect", 0);
    assert_eq!(partition["leader"], preferred, "{partition}");
    assert_eq!(partition["isr"], json!([preferred]), "{partition}");
    let led = java.step(&up, &["elect-leaders", "unclean", "elect", "0"]);
    assert_eq!(
        led["results"]["elect-0"], "ElectionNotNeededException",
        "{led}"
    );
}

/// The sum of the `.log` segment files' sizes in a partition folder: what Kafka (and
/// DescribeLogDirs) counts as a replica's size.
fn segment_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .map(|path| std::fs::metadata(path).unwrap().len())
        .sum()
}

/// On one node: ListOffsets' specs with their leader epochs, DescribeLogDirs sizes that are
/// the segment files', DescribeProducers showing the Java client's idempotent producer, and
/// an API Strata does not serve answered UNSUPPORTED_VERSION (the client says so).
#[test]
fn the_java_admin_client_reads_offsets_log_dirs_and_producers_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(dir.path(), 2, &["--kafka-listen", &kafka]);
    let java = AdminSurface::compile();

    let cluster = java.step(&kafka, &["describe-cluster"]);
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 1, "{cluster}");
    assert_eq!(cluster["controller"], 1);
    // The features (ApiVersions 3 and 4, KIP-584), as `kafka-features.sh describe` shows them.
    assert_eq!(
        java.step(&kafka, &["describe-features"]),
        json!({
            "group.version": {"min": 0, "max": 1, "level": 1},
            "share.version": {"min": 0, "max": 1, "level": 1},
            "transaction.version": {"min": 0, "max": 0, "level": 0},
        })
    );

    java.step(&kafka, &["create-topic", "reads", "3", "1"]);
    let produced = java.step(&kafka, &["produce", "reads", "600", "lz4"]);
    assert_eq!(produced["acked"], 600, "{produced}");
    let last: Vec<i64> = (0..3)
        .map(|p| produced["offsets"][p.to_string()][1].as_i64().unwrap())
        .collect();

    let list = |spec: &str| java.step(&kafka, &["list-offsets", "reads", "0", spec]);
    assert_eq!(
        list("earliest"),
        json!({"offset": 0, "timestamp": -1, "leader_epoch": 0})
    );
    assert_eq!(list("earliest-local")["offset"], 0);
    assert_eq!(list("latest")["offset"], last[0] + 1);
    assert_eq!(list("latest-tiered")["offset"], -1);
    // The record with the largest timestamp is the first record at that time.
    let max = list("max-timestamp");
    let at_max = list(&max["timestamp"].as_i64().unwrap().to_string());
    assert_eq!(at_max["offset"], max["offset"], "{max} {at_max}");
    assert!(max["offset"].as_i64().unwrap() <= last[0]);
    let later = list(&(max["timestamp"].as_i64().unwrap() + 1).to_string());
    assert_eq!(later["offset"], -1, "nothing after the max: {later}");

    let dirs = java.step(&kafka, &["log-dirs", "1"]);
    let (path, described) = dirs["brokers"]["1"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(
        Path::new(path),
        std::fs::canonicalize(dir.path()).unwrap(),
        "{dirs}"
    );
    for partition in 0..3 {
        let replica = &described["partitions"][format!("reads-{partition}")];
        let folder = dir.path().join(format!("reads-{partition}"));
        assert_eq!(replica["size"].as_u64().unwrap(), segment_bytes(&folder));
        assert_eq!(replica["offset_lag"], 0);
    }

    for (partition, last) in last.iter().enumerate() {
        let producers = java.step(
            &kafka,
            &["describe-producers", "reads", &partition.to_string()],
        );
        let producers = producers["producers"].as_array().unwrap();
        assert_eq!(producers.len(), 1, "{producers:?}");
        assert_eq!(producers[0]["epoch"], 0);
        assert_eq!(producers[0]["last_sequence"], *last, "{producers:?}");
    }
    // OffsetDelete: refused while a member reads the topic, done once it left; the rest with
    // `strata group delete-offsets`.
    std::thread::scope(|scope| {
        let member = scope.spawn(|| java.step(&kafka, &["group-member", "readers", "reads", "25"]));
        wait_for_at_most("the member's commits", Duration::from_secs(20), || {
            let offsets = java.step(&kafka, &["group-offsets", "readers"]);
            offsets["offsets"].as_object().is_some_and(|o| o.len() == 3)
        });
        let refused = java.step(&kafka, &["delete-offsets", "readers", "reads", "0"]);
        assert_eq!(
            refused["error"], "GroupSubscribedToTopicException",
            "{refused}"
        );
        let read = member.join().unwrap();
        assert_eq!(read["records"], 600, "{read}");
    });
    let deleted = java.step(&kafka, &["delete-offsets", "readers", "reads", "0"]);
    assert_eq!(deleted, json!({"deleted": true}));
    let offsets = java.step(&kafka, &["group-offsets", "readers"]);
    let left: Vec<&String> = offsets["offsets"].as_object().unwrap().keys().collect();
    assert_eq!(left, ["reads-1", "reads-2"], "{offsets}");
    node.cli(
        &["group", "delete-offsets", "readers", "--topic", "reads"],
        None,
    );
    let offsets = java.step(&kafka, &["group-offsets", "readers"]);
    assert_eq!(offsets, json!({"offsets": {}}));
    let unknown = java.step(&kafka, &["delete-offsets", "nobody", "reads", "0"]);
    assert_eq!(unknown["error"], "GroupIdNotFoundException", "{unknown}");

    // The broker's settings, under Kafka's names where they mean the same; read-only but for
    // those that change live.
    let configs = java.step(&kafka, &["describe-configs", "broker", "1"]);
    let configs = &configs["configs"];
    assert_eq!(configs["broker.id"]["value"], "1", "{configs}");
    assert_eq!(configs["strata.shards"]["value"], "2", "{configs}");
    assert_eq!(
        configs["log.retention.ms"]["value"], "604800000",
        "{configs}"
    );
    assert_eq!(configs["log.retention.ms"]["source"], "DEFAULT_CONFIG");
    assert_eq!(
        configs["log.dirs"]["value"],
        dir.path().display().to_string()
    );
    assert_eq!(configs["log.retention.ms"]["read_only"], false);
    assert_eq!(configs["broker.id"]["read_only"], true);
    assert_eq!(configs["log.dirs"]["read_only"], true);

    // Set live for this broker: the broker says so, and so does a topic without its own.
    let altered = java.step(
        &kafka,
        &["alter-config", "broker", "1", "log.retention.ms", "1000"],
    );
    assert_eq!(altered, json!({"altered": true}));
    let configs = java.step(&kafka, &["describe-configs", "broker", "1"]);
    assert_eq!(
        configs["configs"]["log.retention.ms"],
        json!({"value": "1000", "read_only": false, "source": "DYNAMIC_BROKER_CONFIG"})
    );
    let topic = java.step(&kafka, &["describe-configs", "topic", "reads"]);
    assert_eq!(
        topic["configs"]["retention.ms"],
        json!({"value": "1000", "read_only": false, "source": "DYNAMIC_BROKER_CONFIG"}),
        "{topic}"
    );
    let altered = java.step(
        &kafka,
        &[
            "alter-config",
            "broker",
            "1",
            "log.retention.ms",
            "--delete",
        ],
    );
    assert_eq!(altered, json!({"altered": true}));
    let topic = java.step(&kafka, &["describe-configs", "topic", "reads"]);
    assert_eq!(topic["configs"]["retention.ms"]["source"], "DEFAULT_CONFIG");
    let refused = java.step(&kafka, &["alter-config", "broker", "1", "broker.id", "7"]);
    assert_eq!(
        refused["error"], "InvalidConfigurationException",
        "{refused}"
    );

    check_client_quotas(&java, &node, &kafka);
}

/// DescribeClientQuotas and AlterClientQuotas through the Java AdminClient: quotas of every
/// entity shape set, read back (also by `strata quota list`, over the native protocol),
/// changed key by key and removed; invalid ones refused.
fn check_client_quotas(java: &AdminSurface, node: &TestNode, kafka: &str) {
    let quotas = java.step(kafka, &["describe-quotas"]);
    assert_eq!(quotas["quotas"], json!([]), "{quotas}");
    for alteration in [
        &["user", "default", "producer_byte_rate=1048576"][..],
        &[
            "user",
            "alice",
            "consumer_byte_rate=2097152",
            "request_percentage=25.5",
        ],
        &["client-id", "etl", "producer_byte_rate=524288"],
        &[
            "user+client-id",
            "alice",
            "default",
            "request_percentage=10",
        ],
    ] {
        let altered = java.step(kafka, &[&["alter-quota"][..], alteration].concat());
        assert_eq!(altered["altered"], true, "{alteration:?}: {altered}");
    }
    let quotas = java.step(kafka, &["describe-quotas"]);
    let described: Vec<(Value, Value)> = quotas["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|quota| (quota["entity"].clone(), quota["values"].clone()))
        .collect();
    let expected = [
        (
            json!({"client-id": "etl"}),
            json!({"producer_byte_rate": 524288.0}),
        ),
        (
            json!({"user": "alice"}),
            json!({"consumer_byte_rate": 2097152.0, "request_percentage": 25.5}),
        ),
        (
            json!({"client-id": null, "user": "alice"}),
            json!({"request_percentage": 10.0}),
        ),
        (
            json!({"user": null}),
            json!({"producer_byte_rate": 1048576.0}),
        ),
    ];
    for (entity, values) in &expected {
        assert!(
            described.iter().any(|(e, v)| e == entity && v == values),
            "{entity} {values} in {quotas}"
        );
    }
    assert_eq!(described.len(), expected.len(), "{quotas}");
    let listed = node.cli(&["quota", "list", "--entity-user", "alice"], None);
    assert_eq!(
        listed.trim(),
        "user=alice: consumer_byte_rate=2097152 request_percentage=25.5",
        "strata quota list reads what the Java client set"
    );
    let removed = java.step(
        kafka,
        &[
            "alter-quota",
            "user",
            "alice",
            "consumer_byte_rate=--delete",
        ],
    );
    assert_eq!(removed["altered"], true, "{removed}");
    node.cli(&["quota", "remove", "--entity-client-id", "etl"], None);
    let listed = node.cli(&["quota", "list", "--format", "json"], None);
    let listed: Vec<Value> = support::json_lines(&listed);
    assert_eq!(
        listed,
        vec![
            json!({"user": "alice", "request_percentage": 25.5}),
            json!({"user": "alice", "client-id": null, "request_percentage": 10.0}),
            json!({"user": null, "producer_byte_rate": 1048576.0}),
        ],
        "the etl quota and alice's consumer rate are gone"
    );
    for invalid in [
        &["user", "bob", "producer_byte_rate=1.5"][..],
        &["user", "bob", "producer_byte_rate=-1"],
        &["user", "bob", "controller_mutation_rate=10"],
        &["user", "bob", "no_such_quota=1"],
    ] {
        let refused = java.step(kafka, &[&["alter-quota"][..], invalid].concat());
        assert_eq!(
            refused["error"], "InvalidRequestException",
            "{invalid:?}: {refused}"
        );
    }
}

/// `kafka_admin/python_admin.py` with `args`: its JSON.
fn python_admin(args: &[&str]) -> Value {
    python_json("python_admin.py", args)
}

/// The JSON `kafka_admin/<script>` prints with `args` (it exits 0 and reports failures in it).
fn python_json(script: &str, args: &[&str]) -> Value {
    let path = format!("{}/tests/kafka_admin/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("python3")
        .arg(path)
        .args(args)
        .output()
        .expect("python3 with kafka-python and confluent-kafka (scripts/test.sh installs them)");
    assert!(
        output.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{script} {args:?} printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// kafka-python's and confluent-kafka's admin clients against one node: each call answered,
/// and each change seen by the next read (records deleted below their offsets, a group's
/// offset of one partition forgotten, the others kept).
#[test]
fn the_python_admin_clients_describe_and_change_what_they_ask_for() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let _node = TestNode::start_with(dir.path(), 2, &["--kafka-listen", &kafka]);
    let committed = python_admin(&["prepare", &kafka, "py", "pygroup"]);
    let ends: Vec<i64> = (0..3)
        .map(|p| committed[format!("py-{p}")].as_i64().unwrap())
        .collect();
    assert_eq!(ends.iter().sum::<i64>(), 300, "{committed}");

    let seen = python_admin(&[&kafka, "py", "pygroup"]);
    let kafka_python = &seen["kafka_python"];
    assert_eq!(kafka_python["cluster"]["broker_ids"], json!([1]), "{seen}");
    assert_eq!(kafka_python["cluster"]["controller_id"], 1);
    assert_eq!(
        kafka_python["leaders"],
        json!({"py-0": 1, "py-1": 1, "py-2": 1})
    );
    for partition in 0..3 {
        let size = &kafka_python["log_dirs"][format!("py-{partition}")];
        assert!(size.as_u64().is_some_and(|size| size > 0), "{seen}");
    }
    assert_eq!(kafka_python["reassignments"], json!({}));
    assert_eq!(kafka_python["delete_records"], json!({"py-0": 10}));
    assert_eq!(kafka_python["delete_group_offsets"], json!({"py-1": null}));
    assert_eq!(
        kafka_python["group_offsets"],
        json!({"py-0": ends[0], "py-2": ends[2]})
    );
    assert_eq!(
        kafka_python["elect_leaders"],
        json!({"py-0": "ElectionNotNeededError"})
    );
    assert_eq!(
        kafka_python["producers"]["py-0"].as_array().unwrap().len(),
        1
    );

    let confluent = &seen["confluent"];
    assert_eq!(confluent["cluster"]["node_ids"], json!([1]), "{seen}");
    assert_eq!(confluent["delete_records"], json!({"py-2": 20}));
    assert_eq!(confluent["earliest"]["offset"], 20);
    assert_eq!(confluent["latest"]["offset"], ends[2]);
    let max = confluent["max_timestamp"]["offset"].as_i64().unwrap();
    assert!((20..ends[2]).contains(&max), "{seen}");
    assert_eq!(
        confluent["elect_leaders"],
        json!({"py-1": "ELECTION_NOT_NEEDED"})
    );
    assert_eq!(
        confluent["broker_configs"]["num.partitions"],
        json!({"read_only": false, "value": "1"})
    );
}

/// The Java client's data path on three brokers: the default (idempotent, acks=all) producer
/// with every codec, a consumer by assign reading each back, and a group of three consumers
/// of which one is killed outright: the other two take its partitions and, between them,
/// read everything.
/// The Java client (kafka-clients 4.3) in every codec: 20,000 log lines read back the same,
/// and its consumer receives no more than 5% over what its producer sent (the clients' own
/// byte metrics): each batch is stored and served as the producer compressed it.
#[test]
fn the_java_clients_consumer_receives_batches_as_its_producer_compressed_them() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", support::free_base_port(0));
    let _node = TestNode::start_with(dir.path(), 2, &["--kafka-listen", &kafka]);
    let java = AdminSurface::compile();
    let mut uncompressed = 0.0;
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("java-{codec}");
        java.step(&kafka, &["create-topic", &topic, "1", "1"]);
        let run = java.step(&kafka, &["round-trip", &topic, "20000", codec]);
        eprintln!("{codec}: {run}");
        assert_eq!(run["same"], true, "{codec}: {run}");
        let sent = run["sent_bytes"].as_f64().unwrap();
        let received = run["received_bytes"].as_f64().unwrap();
        assert!(sent > 0.0 && received > 0.0, "{codec}: {run}");
        assert!(received <= sent * 1.05, "{codec}: {run}");
        if codec == "none" {
            uncompressed = sent;
        } else {
            assert!(sent * 3.0 < uncompressed, "{codec} did not compress: {run}");
        }
    }
}

#[test]
fn the_java_client_produces_with_every_codec_and_a_group_survives_a_killed_member() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_brokers, bootstrap) = three_brokers(&etcd, &dirs);
    let java = AdminSurface::compile();
    java.step(&bootstrap, &["create-topic", "codecs", "6", "3"]);
    described(&java, &bootstrap, "codecs", 5);
    let mut produced = 0;
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let acked = java.step(&bootstrap, &["produce", "codecs", "400", codec]);
        assert_eq!(acked["acked"], 400, "{codec}: {acked}");
        produced += 400;
        let held = acked["offsets"]["0"][1].as_i64().unwrap() + 1;
        let held = held.to_string();
        let read = java.step(&bootstrap, &["consume-assign", "codecs", "0", "0", &held]);
        let offsets: Vec<i64> = read["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| record["offset"].as_i64().unwrap())
            .collect();
        let expected: Vec<i64> = (0..held.parse().unwrap()).collect();
        assert_eq!(
            offsets, expected,
            "{codec}: partition 0 read back whole, in order"
        );
    }

    let member = |name: &str| {
        Command::new("java")
            .args(["-cp", &java.classpath, "AdminSurface", &bootstrap])
            .args(["group-member", "trio", "codecs", "45", "classic", "6000"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("member {name}: {error}"))
    };
    let mut members: Vec<_> = ["a", "b", "c"].into_iter().map(member).collect();
    // Let the three share the partitions, then kill one without a goodbye. Not mid-rebalance:
    // a classic member that stops while the group waits for it to rejoin is dropped only at
    // its rebalance timeout (max.poll.interval.ms, 5 minutes), as in Kafka.
    wait_for_at_most(
        "the three members to share the topic",
        Duration::from_secs(40),
        || {
            let group = java.step(&bootstrap, &["describe-group", "trio"]);
            let members = group["members"].as_array().cloned().unwrap_or_default();
            group["state"] == "Stable"
                && members.len() == 3
                && members.iter().all(|member| {
                    member["partitions"]
                        .as_array()
                        .is_some_and(|p| !p.is_empty())
                })
        },
    );
    members[0].kill().unwrap();
    let _ = members[0].wait();
    let mut seen = std::collections::BTreeSet::new();
    let mut records = 0;
    for member in members.drain(1..) {
        let output = member.wait_with_output().unwrap();
        assert!(output.status.success());
        let result: Value = serde_json::from_slice(&output.stdout).unwrap();
        records += result["records"].as_i64().unwrap();
        let last = result["assignments"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        seen.extend(
            last.as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string()),
        );
    }
    let every: std::collections::BTreeSet<String> = (0..6).map(|p| format!("codecs-{p}")).collect();
    assert_eq!(seen, every, "the survivors hold every partition at the end");
    // What the killed member read but did not commit is read again: at least everything.
    assert!(records >= produced, "{records} of {produced}");
}

/// `kafka_admin/broker_settings.py` with `args`: its JSON.
fn python_broker_settings(args: &[&str]) -> Value {
    python_json("broker_settings.py", args)
}

/// Broker settings set live (Kafka's dynamic broker configs) on three brokers, through the
/// Java AdminClient, both Python admin clients and the CLI: a broker's own setting applies to
/// it alone and wins over the one for every broker; a topic default reaches every topic
/// without an override of its own at once (here, the segment size each replica rolls at);
/// `num.partitions` sizes the topics clients create without saying; removing a setting
/// brings back what the broker started with; settings that cannot change live, and
/// defaults a topic could not open with, are refused. The Python clients also reassign a
/// partition and elect its leader here, on three brokers.
#[test]
fn broker_settings_change_live_for_every_broker_or_for_one() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (brokers, bootstrap) = three_brokers(&etcd, &dirs);
    let java = AdminSurface::compile();
    java.step(&bootstrap, &["create-topic", "plain", "1", "3"]);
    java.step(
        &bootstrap,
        &["create-topic", "own", "1", "3", "segment.bytes=1073741824"],
    );
    java.step(
        &bootstrap,
        &[
            "create-topic",
            "lagged",
            "1",
            "1",
            "max.compaction.lag.ms=60000",
        ],
    );

    // Every broker's and the leader's own, through the Java client; a follower's, through
    // kafka-python's legacy AlterConfigs; the other follower's, through confluent-kafka
    // (which names no resource "", so sets no default for every broker).
    let leader = described(&java, &bootstrap, "plain", 0)["leader"]
        .as_i64()
        .unwrap();
    let followers: Vec<i64> = (1..=3).filter(|id| *id != leader).collect();
    let [leader_id, follower, other] =
        [leader, followers[0], followers[1]].map(|id| id.to_string());
    for (broker, name, value) in [
        ("", "num.partitions", "5"),
        (leader_id.as_str(), "log.segment.bytes", "16384"),
    ] {
        let altered = java.step(&bootstrap, &["alter-config", "broker", broker, name, value]);
        assert_eq!(altered, json!({"altered": true}));
    }
    let altered = python_broker_settings(&[
        "kafka-python",
        &bootstrap,
        &follower,
        "log.segment.bytes=65536",
    ]);
    assert_eq!(altered, json!({"altered": true}));
    let altered = python_broker_settings(&[
        "confluent",
        &bootstrap,
        &other,
        "log.retention.bytes=1073741824",
    ]);
    assert_eq!(altered, json!({"altered": true}));
    let setting = |broker: &str, name: &str| {
        java.step(&bootstrap, &["describe-configs", "broker", broker])["configs"][name].clone()
    };
    wait_for_at_most(
        "every broker to apply the settings",
        Duration::from_secs(60),
        || {
            setting(&follower, "log.segment.bytes")["value"] == "65536"
                && ["1", "2", "3"]
                    .iter()
                    .all(|broker| setting(broker, "num.partitions")["value"] == "5")
        },
    );
    assert_eq!(
        setting(&leader_id, "log.segment.bytes"),
        json!({"value": "16384", "read_only": false, "source": "DYNAMIC_BROKER_CONFIG"})
    );
    assert_eq!(
        setting(&other, "log.segment.bytes")["source"],
        "DEFAULT_CONFIG"
    );
    assert_eq!(
        setting(&other, "log.retention.bytes"),
        json!({"value": "1073741824", "read_only": false, "source": "DYNAMIC_BROKER_CONFIG"})
    );
    assert_eq!(
        setting(&other, "num.partitions"),
        json!({"value": "5", "read_only": false, "source": "DYNAMIC_DEFAULT_BROKER_CONFIG"})
    );

    // The leader rolls at its own size, batch by batch as they are produced; a broker without
    // a size of its own keeps one segment, and a topic's own size wins everywhere. (A
    // follower appends what it copies a fetch at a time, so where it rolls depends on how
    // far behind it was.)
    for topic in ["plain", "own"] {
        produce_to_partition_0(&java, &bootstrap, topic, 8000);
    }
    let segments = |broker: &str, topic: &str| {
        let at: usize = broker.parse().unwrap();
        log_segments(&dirs[at - 1].path().join(format!("{topic}-0")))
    };
    assert!(
        segments(&leader_id, "plain") > 3,
        "the leader rolls at 16 KiB"
    );
    assert_eq!(
        segments(&other, "plain"),
        1,
        "broker {other} has no size of its own"
    );
    for broker in ["1", "2", "3"] {
        assert_eq!(
            segments(broker, "own"),
            1,
            "broker {broker}: the topic's own size"
        );
    }

    // The Python admin clients on three brokers: kafka-python reverses a partition's replicas
    // (AlterPartitionReassignments, listed until done, read with DescribeTopicPartitions), the
    // leader stays, and confluent-kafka's preferred election moves it to the new first replica.
    java.step(&bootstrap, &["create-topic", "moves", "1", "2"]);
    let moved = python_admin(&["move", &bootstrap, "moves"]);
    let before: Vec<i64> = serde_json::from_value(moved["before"]["replicas"].clone())
        .unwrap_or_else(|_| panic!("{moved}"));
    let reversed: Vec<i64> = before.iter().rev().copied().collect();
    assert_eq!(moved["reassigned"], json!({"moves-0": null}), "{moved}");
    assert_eq!(moved["after"]["replicas"], json!(reversed), "{moved}");
    assert_eq!(
        moved["after"]["leader"], before[0],
        "the leader stays: {moved}"
    );
    assert_eq!(moved["elected"], json!({"moves-0": null}), "{moved}");
    assert_eq!(moved["leader"], reversed[0], "{moved}");

    // num.partitions sizes a topic created without a count, whichever broker creates it.
    java.step(&bootstrap, &["create-topic", "sized", "-1", "-1"]);
    let sized = java.step(&bootstrap, &["describe-topics", "sized"]);
    assert_eq!(
        sized["topics"][0]["partitions"].as_array().unwrap().len(),
        5,
        "{sized}"
    );

    // The CLI sees the same, over the native protocol.
    let cli = &brokers[0].0;
    let every = cli.cli(&["cluster", "config", "list"], None);
    assert_eq!(every.trim(), "num.partitions=5 (every-broker live)");
    let led: Value = serde_json::from_str(&cli.cli(
        &[
            "cluster", "config", "list", "--broker", &leader_id, "--format", "json",
        ],
        None,
    ))
    .unwrap();
    let segment_bytes = led["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["name"] == "log.segment.bytes")
        .cloned();
    assert_eq!(
        segment_bytes,
        Some(
            json!({"name": "log.segment.bytes", "value": "16384", "source": "broker", "live": true})
        )
    );

    // Refused: a setting that cannot change live, and a default the topic "lagged" could not
    // open with (its own maximum compaction lag is below it).
    let refused = java.step(
        &bootstrap,
        &["alter-config", "broker", "", "broker.id", "9"],
    );
    assert_eq!(
        refused["error"], "InvalidConfigurationException",
        "{refused}"
    );
    let refused = java.step(
        &bootstrap,
        &[
            "alter-config",
            "broker",
            "",
            "log.cleaner.min.compaction.lag.ms",
            "120000",
        ],
    );
    let why = refused["message"].as_str().unwrap_or_default();
    assert!(why.contains("lagged"), "{refused}");
    let refused = python_broker_settings(&["confluent", &bootstrap, "2", "strata.shards=4"]);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|why| why.contains("cannot change")),
        "{refused}"
    );
    // A topic some broker could not open under its defaults is refused too.
    cli.cli(
        &[
            "cluster",
            "config",
            "set",
            "log.cleaner.max.compaction.lag.ms=100000",
            "--broker",
            "3",
        ],
        None,
    );
    let refused = java.step(
        &bootstrap,
        &[
            "create-topic",
            "slow",
            "1",
            "1",
            "min.compaction.lag.ms=200000",
        ],
    );
    assert_eq!(
        refused["error"], "InvalidConfigurationException",
        "{refused}"
    );
    let output = cli.cli_output(&["cluster", "config", "set", "log.segment.bytes=12"], None);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("segment.bytes"),
        "{output:?}"
    );

    // Removed, the brokers' own defaults apply again.
    cli.cli(&["cluster", "config", "remove", "num.partitions"], None);
    wait_for_at_most(
        "every broker to drop the setting",
        Duration::from_secs(60),
        || {
            ["1", "2", "3"]
                .iter()
                .all(|broker| setting(broker, "num.partitions")["source"] == "STATIC_BROKER_CONFIG")
        },
    );
    java.step(&bootstrap, &["create-topic", "unsized", "-1", "-1"]);
    let described = java.step(&bootstrap, &["describe-topics", "unsized"]);
    assert_eq!(
        described["topics"][0]["partitions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        cli.cli(&["cluster", "config", "list"], None).trim(),
        "",
        "nothing set for every broker"
    );
}

/// What a group member (AdminSurface's group-member step, or kip848_member.py) printed.
fn member_result(child: std::process::Child, name: &str) -> Value {
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "member {name} failed");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("member {name} printed no JSON: {error}"))
}

/// A member's assignments, in order, as sets of "TOPIC-PARTITION".
fn assignments(result: &Value) -> Vec<std::collections::BTreeSet<String>> {
    result["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|assignment| {
            assignment
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// KIP-848 (`group.protocol=consumer`): two Java consumers and a librdkafka one share a topic
/// through the broker's assignor, one of the Java ones is killed outright, and the other two
/// take its partitions without giving up theirs meanwhile (no stop-the-world rebalance). The
/// group is a consumer group to the Java AdminClient (ConsumerGroupDescribe), a classic member
/// cannot join it while it has members, and a subscription by regular expression picks up a
/// topic created later.
#[test]
fn kip848_groups_split_topics_and_rebalance_without_stopping_their_members() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let _node = TestNode::start_with(
        dir.path(),
        2,
        &[
            "--kafka-listen",
            &kafka,
            "--group-consumer-session-timeout-ms",
            "6000",
        ],
    );
    let java = AdminSurface::compile();
    java.step(&kafka, &["create-topic", "split", "6", "1"]);
    let produced = java.step(&kafka, &["produce", "split", "600", "none"]);
    assert_eq!(produced["acked"], 600, "{produced}");
    let java_member = || {
        Command::new("java")
            .args(["-cp", &java.classpath, "AdminSurface", &kafka])
            .args(["group-member", "kip848", "split", "30", "consumer"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/kafka_admin/kip848_member.py"
    );
    let librdkafka_member = |group: &str, subscription: &str, seconds: &str| {
        Command::new("python3")
            .args([script, &kafka, group, subscription, seconds])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 with confluent-kafka")
    };
    let mut killed = java_member();
    let survivor = java_member();
    let librdkafka = librdkafka_member("kip848", "split", "30");
    // A subscription by regular expression beside a topic named, in a group of its own, from
    // before the topic the expression matches exists.
    let by_regex = librdkafka_member("kip848-regex", "^split-.*,split", "25");
    std::thread::sleep(Duration::from_secs(12));

    let described = java.step(&kafka, &["describe-group", "kip848"]);
    assert_eq!(described["type"], "Consumer", "{described}");
    let members = described["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{described}");
    let mut held: Vec<String> = members
        .iter()
        .flat_map(|member| member["partitions"].as_array().unwrap().clone())
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    held.sort();
    let every: Vec<String> = (0..6).map(|p| format!("split-{p}")).collect();
    assert_eq!(held, every, "the broker split the topic: {described}");
    assert!(
        members
            .iter()
            .all(|member| member["partitions"].as_array().unwrap().len() == 2),
        "uniform: two each: {described}"
    );
    // One protocol at a time: a classic member is refused while the group has members.
    let join: strata_kafka::kafka_protocol::messages::JoinGroupResponse = support::raw_request(
        &kafka,
        strata_kafka::kafka_protocol::messages::ApiKey::JoinGroup,
        5,
        &strata_kafka::kafka_protocol::messages::JoinGroupRequest::default()
            .with_group_id(strata_kafka::kafka_protocol::messages::GroupId(
                strata_kafka::text("kip848"),
            ))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(strata_kafka::text("consumer")),
    );
    assert_eq!(
        join.error_code,
        strata_kafka::errors::INCONSISTENT_GROUP_PROTOCOL
    );
    java.step(&kafka, &["create-topic", "split-late", "2", "1"]);

    killed.kill().unwrap();
    let _ = killed.wait();
    let survivors = [
        member_result(survivor, "java"),
        member_result(librdkafka, "librdkafka"),
    ];
    let mut finally_held = std::collections::BTreeSet::new();
    let mut records = 0;
    for result in &survivors {
        records += result["records"].as_i64().unwrap();
        let history = assignments(result);
        let first_held = history.iter().position(|held| !held.is_empty()).unwrap();
        for (before, after) in history[first_held..].iter().zip(&history[first_held + 1..]) {
            assert!(!after.is_empty(), "a member stopped everything: {result}");
            // Cooperative: what a member keeps, it keeps throughout; its last change, taking
            // the killed member's partitions, only adds.
            assert!(
                !before.is_disjoint(after),
                "a member lost all it held at once: {result}"
            );
        }
        let last = history.last().unwrap();
        assert!(
            last.is_superset(&history[history.len() - 2]),
            "the rebalance after the kill took partitions away: {result}"
        );
        finally_held.extend(last.iter().cloned());
    }
    let every: std::collections::BTreeSet<String> = every.into_iter().collect();
    assert_eq!(finally_held, every, "the survivors hold every partition");
    assert!(records >= 600, "everything read: {records}");

    let regex = member_result(by_regex, "regex");
    let last = assignments(&regex).pop().unwrap();
    assert!(
        last.contains("split-late-0") && last.contains("split-late-1") && last.contains("split-0"),
        "the regular expression took the later topic in, beside the topic named: {regex}"
    );
}

/// A group's configs as broker `kafka` describes them over DescribeConfigs (v4): name ->
/// (value, source).
fn group_configs_at(kafka: &str, group: &str) -> std::collections::BTreeMap<String, (String, i8)> {
    use strata_kafka::kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use strata_kafka::kafka_protocol::messages::{
        ApiKey, DescribeConfigsRequest, DescribeConfigsResponse,
    };
    let request = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(strata_kafka::admin::RESOURCE_GROUP)
            .with_resource_name(strata_kafka::text(group)),
    ]);
    let response: DescribeConfigsResponse =
        support::raw_request(kafka, ApiKey::DescribeConfigs, 4, &request);
    let result = &response.results[0];
    assert_eq!(result.error_code, 0, "{result:?}");
    result
        .configs
        .iter()
        .map(|config| {
            let value = config.value.as_deref().unwrap_or_default().to_string();
            (config.name.to_string(), (value, config.config_source))
        })
        .collect()
}

/// Group configs (KIP-848/KIP-932's GROUP config resources) on two brokers, through
/// confluent-kafka's AdminClient (`kafka_admin/group_configs.py`): set incrementally and
/// described back with their sources (the rest at their defaults), untouched by a
/// validate_only change, an invalid value and an unknown name refused with INVALID_CONFIG, a
/// config deleted back to its default; and every broker describes what was set, whichever
/// stored it (the configs travel in the cluster view).
#[test]
fn group_configs_are_set_described_and_refused_through_the_kafka_admin_apis() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let brokers: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| broker(&etcd, dir.path(), &(i + 1).to_string(), &[]))
        .collect();
    let (first, second) = (&brokers[0].1, &brokers[1].1);

    let seen = python_json("group_configs.py", &[first, "orders-share"]);
    assert_eq!(seen["set"], json!(true), "{seen}");
    let described = &seen["described"];
    assert_eq!(
        described["share.auto.offset.reset"],
        json!({"value": "earliest", "source": "GROUP_CONFIG"}),
        "{seen}"
    );
    assert_eq!(
        described["share.record.lock.duration.ms"],
        json!({"value": "5000", "source": "GROUP_CONFIG"})
    );
    assert_eq!(
        described["share.isolation.level"],
        json!({"value": "read_uncommitted", "source": "DEFAULT_CONFIG"})
    );
    // Every config of the broker's group-config table (node/src/server/group_config.rs).
    assert_eq!(
        described.as_object().unwrap().len(),
        14,
        "every group config: {seen}"
    );
    assert_eq!(
        described["share.renew.acknowledge.enable"],
        json!({"value": "true", "source": "DEFAULT_CONFIG"}),
        "{seen}"
    );
    assert_eq!(seen["validated"], json!(true), "{seen}");
    assert_eq!(
        seen["after_validate"]["share.delivery.count.limit"],
        json!({"value": "5", "source": "DEFAULT_CONFIG"}),
        "validate_only stored nothing: {seen}"
    );
    assert_eq!(seen["bogus"]["error"], "INVALID_CONFIG", "{seen}");
    let why = seen["bogus"]["message"].as_str().unwrap();
    assert!(why.contains("share.isolation.level"), "{seen}");
    assert_eq!(seen["unknown"]["error"], "INVALID_CONFIG", "{seen}");
    let why = seen["unknown"]["message"].as_str().unwrap();
    assert!(why.contains("share.no.such.config"), "{seen}");
    assert_eq!(seen["deleted"], json!(true), "{seen}");
    assert_eq!(
        seen["after_delete"]["share.record.lock.duration.ms"],
        json!({"value": "30000", "source": "DEFAULT_CONFIG"}),
        "{seen}"
    );
    assert_eq!(
        seen["after_delete"]["share.auto.offset.reset"]["value"],
        "earliest"
    );

    // Both brokers describe what is set, whichever one stored it.
    for kafka in [first, second] {
        wait_for_at_most(
            "every broker to describe the group's configs",
            Duration::from_secs(10),
            || {
                let configs = group_configs_at(kafka, "orders-share");
                configs["share.auto.offset.reset"] == ("earliest".to_string(), 8)
                    && configs["share.record.lock.duration.ms"] == ("30000".to_string(), 5)
            },
        );
    }
    // Another group has nothing set.
    let other = group_configs_at(second, "another");
    assert!(other.values().all(|(_, source)| *source == 5), "{other:?}");

    // The legacy AlterConfigs replaces the group's configs with those it names.
    let altered =
        alter_group_configs_replacing(second, "orders-share", "share.delivery.count.limit", "3");
    assert_eq!(altered, 0);
    let configs = group_configs_at(second, "orders-share");
    assert_eq!(configs["share.delivery.count.limit"], ("3".to_string(), 8));
    assert_eq!(
        configs["share.auto.offset.reset"],
        ("latest".to_string(), 5)
    );
    let refused =
        alter_group_configs_replacing(second, "orders-share", "share.delivery.count.limit", "11");
    assert_eq!(refused, strata_kafka::errors::INVALID_CONFIG);
}

/// The legacy AlterConfigs (v1) of `group` on broker `kafka`, setting `name` to `value` alone:
/// the resource's error code.
fn alter_group_configs_replacing(kafka: &str, group: &str, name: &str, value: &str) -> i16 {
    use strata_kafka::kafka_protocol::messages::alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use strata_kafka::kafka_protocol::messages::{
        AlterConfigsRequest, AlterConfigsResponse, ApiKey,
    };
    let request = AlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(strata_kafka::admin::RESOURCE_GROUP)
            .with_resource_name(strata_kafka::text(group))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(strata_kafka::text(name))
                    .with_value(Some(strata_kafka::text(value))),
            ]),
    ]);
    let response: AlterConfigsResponse =
        support::raw_request(kafka, ApiKey::AlterConfigs, 1, &request);
    response.responses[0].error_code
}
