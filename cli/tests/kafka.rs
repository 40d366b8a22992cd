//! The Kafka listener against a real Kafka client: kcat (librdkafka) produces and consumes
//! through `strata serve --kafka-listen`, next to Strata's own client, on one node and on a
//! replicated cluster; bad Kafka input closes only its connection.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use strata_coordinator::testing::EtcdServer;
use strata_kafka::kafka_protocol::messages::produce_request::{
    PartitionProduceData, TopicProduceData,
};
use strata_kafka::kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, ListGroupsRequest, ListGroupsResponse, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, ResponseHeader, TopicName,
    UpdateFeaturesRequest, UpdateFeaturesResponse,
};
use strata_kafka::kafka_protocol::protocol::{Decodable, StrBytes};
use support::{
    TestNode, etcd_args, free_base_port, history::read_to_end, read_frame, request_frame, runtime,
    stored_records, wait_for, wait_for_at_most,
};

/// kcat, librdkafka's command-line client (Debian's `kcat`, which `scripts/test.sh` installs):
/// its output, once it succeeded.
fn kcat(broker: &str, args: &[&str], stdin: Option<&[u8]>) -> String {
    let output = kcat_output(broker, args, stdin);
    assert!(
        output.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// [`kcat`]'s run, whatever its outcome.
fn kcat_output(broker: &str, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = support::kcat_command()
        .arg("-b")
        .arg(broker)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat (Debian package kcat) is needed: scripts/test.sh installs it");
    let mut input = child.stdin.take().unwrap();
    if let Some(stdin) = stdin {
        input.write_all(stdin).unwrap();
    }
    drop(input);
    wait_with_timeout(child, Duration::from_secs(60))
}

/// Waits for `child` while draining its output (a consumer's output outgrows a pipe), killing
/// it after `patience`.
fn wait_with_timeout(child: std::process::Child, patience: Duration) -> std::process::Output {
    let pid = child.id();
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match output.recv_timeout(patience) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the child's pid (not yet reaped: its waiter is still waiting).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("kcat ran for more than {patience:?}");
        }
    }
}

/// A node with a Kafka listener on a free port: (node, "127.0.0.1:port").
fn kafka_node(dir: &std::path::Path, shards: usize, extra: &[&str]) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let mut args = vec!["--kafka-listen", &kafka];
    args.extend_from_slice(extra);
    let node = TestNode::start_with(dir, shards, &args);
    (node, kafka)
}

/// Brokers 1, 2, ... on `etcd`, one per data dir, each with a Kafka listener.
fn kafka_cluster(etcd: &EtcdServer, dirs: &[tempfile::TempDir]) -> Vec<(TestNode, String)> {
    dirs.iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            kafka_node(dir.path(), 1, &etcd_args(etcd, &id))
        })
        .collect()
}

/// A fetch answer is held to the Kafka consumer's `fetch.max.bytes`. librdkafka refuses an
/// answer over its `receive.message.max.bytes` (here 2 MB, against 8 partitions of 1 MB each
/// at 1 MiB per partition), so a consumer of many partitions with a backlog could read nothing
/// if the broker answered every partition's limit at once.
#[test]
fn kafka_fetch_answers_are_held_to_fetch_max_bytes() {
    const PARTITIONS: u32 = 8;
    const RECORDS: usize = 100;
    let temp = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(temp.path(), 2, &[]);
    node.cli(
        &[
            "topic",
            "create",
            "wide",
            "--partitions",
            &PARTITIONS.to_string(),
        ],
        None,
    );
    let value = "v".repeat(10_000);
    let lines: String = (0..RECORDS).map(|_| format!("{value}\n")).collect();
    for partition in 0..PARTITIONS {
        kcat(
            &kafka,
            &["-P", "-t", "wide", "-p", &partition.to_string()],
            Some(lines.as_bytes()),
        );
    }
    let consumed = kcat(
        &kafka,
        &[
            "-C",
            "-t",
            "wide",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\n",
            "-X",
            "fetch.max.bytes=1000000",
            "-X",
            "receive.message.max.bytes=2000000",
            "-X",
            "max.partition.fetch.bytes=1048576",
        ],
        None,
    );
    let mut per_partition = BTreeMap::new();
    for partition in consumed.lines() {
        *per_partition
            .entry(partition.parse::<u32>().unwrap())
            .or_insert(0) += 1;
    }
    assert_eq!(
        per_partition,
        (0..PARTITIONS)
            .map(|p| (p, RECORDS))
            .collect::<BTreeMap<_, _>>()
    );
}

/// kcat (librdkafka 2.0.2) compresses with every codec it is asked for. librdkafka before 2.10
/// turns gzip and snappy on only when the broker advertises Produce from version 0, and sent
/// those batches uncompressed while the listener advertised Produce from 3
/// (apache/kafka#18727): Strata advertises v0–2 and refuses them, as Kafka 4 does. (The broker
/// does not compress what a producer left uncompressed: what is stored shows what was sent.)
#[test]
fn kcat_compresses_with_every_codec() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &[]);
    let lines: String = (0..200)
        .map(|i| format!("record {i:04} of a highly compressible payload payload payload\n"))
        .collect();
    // Each batch is stored as kcat sent it: a Kafka batch, its codec kept.
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("c-{codec}");
        node.cli(&["topic", "create", &topic, "--partitions", "1"], None);
        kcat(
            &kafka,
            &["-P", "-t", &topic, "-z", codec],
            Some(lines.as_bytes()),
        );
        assert_eq!(stored_records(&node, &topic), 200, "{codec}");
        let dump = support::strata()
            .args(["log", "dump"])
            .arg(dir.path().join(format!("{topic}-0")))
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout);
        let batches: Vec<&str> = dump.lines().filter(|l| l.starts_with("batch ")).collect();
        assert!(!batches.is_empty(), "{dump}");
        // librdkafka sends a batch uncompressed when compressing would not shrink it (a lone
        // record that linger sent by itself, on a loaded machine): the batches of several
        // records are what must keep the codec.
        let several = batches
            .iter()
            .filter(|batch| !batch.contains(" records=1 "));
        let (mut count, mut kept) = (0, 0);
        for batch in several {
            count += 1;
            kept += usize::from(batch.ends_with(&format!("format=kafka codec={codec}")));
        }
        assert!(
            count > 0 && kept == count,
            "kcat -z {codec} stored as: {dump}"
        );
        let read = kcat(&kafka, &["-C", "-t", &topic, "-e", "-q"], None);
        assert_eq!(read, lines, "{codec}");
    }
}

/// A Kafka tombstone (a null value) is stored as one and read back as one, told from an
/// empty value, by kcat and by Strata's own consumer.
#[test]
fn kafka_tombstones_stay_null() {
    let temp = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(temp.path(), 1, &[]);
    node.cli(&["topic", "create", "users", "--partitions", "1"], None);
    // -Z: an empty value goes out as null.
    kcat(
        &kafka,
        &["-P", "-t", "users", "-K", ":", "-Z"],
        Some(b"alice:home\nalice:\nbob:cart\n"),
    );
    let runtime = runtime();
    let client = runtime.block_on(node.client());
    // An empty value that is not null, from Strata's producer (librdkafka sends an empty
    // payload as null).
    runtime.block_on(async {
        let producer = strata_client::Producer::new(client.clone(), Default::default());
        let record = strata_client::ProducerRecord::new("users", Some("dave".into()), "");
        producer.send(record).await.unwrap().await.unwrap();
    });
    let consumed = kcat(
        &kafka,
        &[
            "-C",
            "-t",
            "users",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-Z",
            "-f",
            "%k=%s:%S\n",
        ],
        None,
    );
    // %S, the value's length: -1 for null (kcat's -Z prints an empty value as NULL too).
    assert_eq!(
        consumed,
        "alice=home:4\nalice=NULL:-1\nbob=cart:4\ndave=NULL:0\n"
    );
    let stored: Vec<Option<Vec<u8>>> = runtime.block_on(async {
        let mut consumer = strata_client::Consumer::new(client, Default::default());
        consumer
            .assign("users", &[0], strata_client::SeekTo::Beginning)
            .await
            .unwrap();
        let mut values = Vec::new();
        while values.len() < 4 {
            for batch in consumer.poll().await.unwrap() {
                values.extend(
                    batch
                        .records()
                        .map(|r| r.nullable_value().map(<[u8]>::to_vec)),
                );
            }
        }
        values
    });
    assert_eq!(
        stored,
        [
            Some(b"home".to_vec()),
            None,
            Some(b"cart".to_vec()),
            Some(Vec::new())
        ]
    );
}

/// The groups one broker's Kafka listener lists, with their states (ListGroups v4), only those
/// in `states` when it names any.
fn list_groups(kafka: &str, states: &[&str]) -> Vec<(String, String)> {
    let mut stream = connect(kafka);
    let request = ListGroupsRequest::default().with_states_filter(
        states
            .iter()
            .map(|state| StrBytes::from_string(state.to_string()))
            .collect(),
    );
    stream
        .write_all(&request_frame(ApiKey::ListGroups, 4, 7, &request))
        .unwrap();
    let mut answer = read_frame(&mut stream).expect("a ListGroups answer");
    ResponseHeader::decode(&mut answer, ApiKey::ListGroups.response_header_version(4)).unwrap();
    let response = ListGroupsResponse::decode(&mut answer, 4).unwrap();
    assert_eq!(response.error_code, 0);
    response
        .groups
        .iter()
        .map(|group| (group.group_id.to_string(), group.group_state.to_string()))
        .collect()
}

/// Every record kcat consumed from the beginning to the end of each partition:
/// (partition, offset) → (key, value).
fn kcat_consume_all(broker: &str, topic: &str) -> BTreeMap<(u32, u64), (String, String)> {
    kcat(
        broker,
        &["-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q"],
        None,
    )
    .lines()
    .map(|line| {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        (
            (
                record["partition"].as_u64().unwrap() as u32,
                record["offset"].as_u64().unwrap(),
            ),
            (
                record["key"].as_str().unwrap_or_default().to_string(),
                record["payload"].as_str().unwrap().to_string(),
            ),
        )
    })
    .collect()
}

/// Checks the consumed records against what was sent as `key:value` lines: each sent value
/// exactly once, each key on one partition in the order sent, each partition's offsets dense
/// from 0. Returns how many were seen.
fn check_against_sent(
    consumed: &BTreeMap<(u32, u64), (String, String)>,
    sent: &[(String, String)],
) -> usize {
    let mut by_value = BTreeMap::new();
    for ((partition, offset), (key, value)) in consumed {
        assert!(
            by_value
                .insert(value.clone(), (key.clone(), *partition, *offset))
                .is_none(),
            "{value} consumed twice"
        );
    }
    let mut last: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    for (key, value) in sent {
        let (got_key, partition, offset) = by_value
            .get(value)
            .unwrap_or_else(|| panic!("{value} was acknowledged but not consumed"));
        assert_eq!(got_key, key);
        if let Some((last_partition, last_offset)) = last.insert(key, (*partition, *offset)) {
            assert_eq!(last_partition, *partition, "key {key} moved partitions");
            assert!(*offset > last_offset, "key {key} out of order at {value}");
        }
    }
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    for (partition, offset) in consumed.keys() {
        let expected = next.entry(*partition).or_default();
        assert_eq!(offset, expected, "partition {partition} has a gap");
        *expected += 1;
    }
    consumed.len()
}

/// A group as `strata group describe --format json` shows it, and the sum of its committed
/// offsets.
fn group_committed(node: &TestNode, group: &str) -> (serde_json::Value, u64) {
    let described: serde_json::Value =
        serde_json::from_str(&node.cli(&["group", "describe", group, "--format", "json"], None))
            .unwrap();
    let committed = described["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|offset| offset["committed"].as_u64().unwrap())
        .sum();
    (described, committed)
}

/// Runs a kafka-python `script` with the Kafka listener's address as its argument; returns
/// the JSON it prints.
fn kafka_python(script: &str, kafka: &str) -> serde_json::Value {
    let output = Command::new("python3")
        .args(["-c", script, kafka])
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 with kafka-python (scripts/test.sh installs it)");
    assert!(output.status.success(), "the kafka-python script failed");
    serde_json::from_slice(&output.stdout).unwrap()
}

fn keyed_lines(prefix: &str, count: usize) -> (Vec<(String, String)>, Vec<u8>) {
    let sent: Vec<(String, String)> = (0..count)
        .map(|i| (format!("key{}", i % 37), format!("{prefix}-{i:06}")))
        .collect();
    let mut input = Vec::new();
    for (key, value) in &sent {
        writeln!(input, "{key}:{value}").unwrap();
    }
    (sent, input)
}

/// kcat produces keyed records (plain, then compressed by an idempotent producer with
/// acks=all) through the Kafka listener of a two-shard node; kcat and Strata's own consumer
/// both read every one back, the same records at the same offsets; records Strata's client
/// produced are read by kcat; kcat's offset queries answer the log's ends.
#[test]
fn kcat_produces_and_consumes_through_the_kafka_listener_beside_native_clients() {
    let dir = tempfile::tempdir().unwrap();
    let admin = free_base_port(0);
    let (node, kafka) = kafka_node(dir.path(), 2, &["--admin", &format!("127.0.0.1:{admin}")]);
    node.cli(&["topic", "create", "orders", "--partitions", "4"], None);

    let metadata = kcat(&kafka, &["-L", "-t", "orders"], None);
    assert!(
        metadata.contains(&format!("broker 1 at {kafka}")),
        "{metadata}"
    );
    assert!(metadata.contains("4 partitions"), "{metadata}");

    let (mut sent, input) = keyed_lines("plain", 20_000);
    kcat(
        &kafka,
        &["-P", "-t", "orders", "-K", ":", "-X", "acks=1"],
        Some(&input),
    );
    let (more, input) = keyed_lines("zstd-idempotent", 5_000);
    kcat(
        &kafka,
        &[
            "-P",
            "-t",
            "orders",
            "-K",
            ":",
            "-z",
            "zstd",
            "-X",
            "acks=all",
            "-X",
            "enable.idempotence=true",
        ],
        Some(&input),
    );
    sent.extend(more);

    let consumed = kcat_consume_all(&kafka, "orders");
    assert_eq!(check_against_sent(&consumed, &sent), 25_000);
    assert_eq!(stored_records(&node, "orders"), 25_000);

    // Strata's consumer reads the same records at the same offsets.
    let native = runtime().block_on(read_to_end(&node.bootstrap(), "orders", 4));
    let native: BTreeMap<(u32, u64), String> = native
        .into_iter()
        .enumerate()
        .flat_map(|(partition, log)| {
            log.into_iter()
                .map(move |(offset, value)| ((partition as u32, offset), value))
        })
        .collect();
    let kcat_values: BTreeMap<(u32, u64), String> = consumed
        .iter()
        .map(|(at, (_, value))| (*at, value.clone()))
        .collect();
    assert_eq!(native, kcat_values);

    // What Strata's client produced, kcat reads, after what kcat wrote.
    std::thread::sleep(Duration::from_millis(5));
    let native_from_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    node.cli(
        &["produce", "orders", "--partition", "3"],
        Some(b"native-1\nnative-2\n"),
    );
    let consumed = kcat_consume_all(&kafka, "orders");
    let tail: Vec<&str> = consumed
        .range((3, 0)..(4, 0))
        .rev()
        .take(2)
        .map(|(_, (_, value))| value.as_str())
        .collect();
    assert_eq!(tail, ["native-2", "native-1"]);

    // Offsets by position and by time.
    let partition_3 = consumed.range((3, 0)..(4, 0)).count();
    let latest = kcat(&kafka, &["-Q", "-t", "orders:3:-1"], None);
    assert_eq!(latest.trim(), format!("orders [3] offset {partition_3}"));
    let earliest = kcat(&kafka, &["-Q", "-t", "orders:3:-2"], None);
    assert_eq!(earliest.trim(), "orders [3] offset 0");
    // The first record at or after the native records' time is the first native record.
    let after = kcat(
        &kafka,
        &["-Q", "-t", &format!("orders:3:{native_from_ms}")],
        None,
    );
    assert_eq!(
        after.trim(),
        format!("orders [3] offset {}", partition_3 - 2)
    );

    // The listener's traffic is in /metrics; kcat's connections closed when it exited.
    // Eight kcat runs, each at least an ApiVersions and a Metadata.
    assert!(support::metric_total(admin, "strata_kafka_requests_total") >= 16.0);
    wait_for("every kafka connection closed", || {
        support::metric_total(admin, "strata_kafka_connections") == 0.0
    });
}

/// A replicated cluster: every broker has a Kafka listener, kcat learns all three from one,
/// produces with acks=all to the leaders of an RF 3 topic, reads everything back, and reads it
/// again in consumer groups coordinated on different brokers.
#[test]
fn kcat_reaches_every_leader_of_a_replicated_cluster() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = kafka_cluster(&etcd, &dirs);
    let (first, kafka) = &nodes[0];
    wait_for("three brokers", || {
        kcat(kafka, &["-L"], None).contains(" 3 brokers:")
    });
    first.cli(
        &[
            "topic",
            "create",
            "replicated",
            "--partitions",
            "6",
            "--replication-factor",
            "3",
        ],
        None,
    );
    wait_for(
        "a leader for every partition, on every broker's metadata",
        || {
            nodes.iter().all(|(_, kafka)| {
                let metadata = kcat(kafka, &["-L", "-t", "replicated"], None);
                metadata.matches(", leader ").count() == 6 && !metadata.contains("leader -1")
            })
        },
    );
    let metadata = kcat(kafka, &["-L", "-t", "replicated"], None);
    for (_, address) in &nodes {
        assert!(metadata.contains(address.as_str()), "{metadata}");
    }
    // Idempotent: the per-key order checked below is what Kafka promises only then (a plain
    // producer with several requests in flight may reorder on a retry, as leaderships settle
    // after the topic's creation; seen once in CI).
    let (sent, input) = keyed_lines("replicated", 6_000);
    kcat(
        &nodes[2].1,
        &[
            "-P",
            "-t",
            "replicated",
            "-K",
            ":",
            "-X",
            "acks=all",
            "-X",
            "enable.idempotence=true",
        ],
        Some(&input),
    );
    let consumed = kcat_consume_all(&nodes[1].1, "replicated");
    assert_eq!(check_against_sent(&consumed, &sent), 6_000);
    let leaders: std::collections::BTreeSet<i64> =
        support::leaders(first, "replicated").into_iter().collect();
    assert_eq!(
        leaders.len(),
        3,
        "leaders spread over the brokers: {leaders:?}"
    );

    // Consumer groups, each coordinated by the broker its id hashes to (crc32c mod 3: audit on
    // broker 1, search on 2, orders on 3), found through one broker's FindCoordinator.
    for group in ["audit", "search", "orders"] {
        let read = kcat(
            kafka,
            &[
                "-G",
                group,
                "-o",
                "beginning",
                "-e",
                "-q",
                "-f",
                "%s\n",
                "replicated",
            ],
            None,
        );
        assert_eq!(read.lines().count(), 6_000, "{group}");
        let (described, committed) = group_committed(first, group);
        assert_eq!(committed, 6_000, "{described}");
    }
}

/// A Produce v2 request (Kafka 4's schemas, and so `kafka-protocol`, start at v3) of one
/// record set to partition 0 of `topic`, with acks=1.
fn produce_v2(correlation_id: i32, topic: &str) -> Vec<u8> {
    let mut content = BytesMut::new();
    content.put_i16(ApiKey::Produce as i16);
    content.put_i16(2);
    content.put_i32(correlation_id);
    content.put_i16(3);
    content.put_slice(b"raw");
    content.put_i16(1); // acks
    content.put_i32(5000); // timeout
    content.put_i32(1);
    content.put_i16(topic.len() as i16);
    content.put_slice(topic.as_bytes());
    content.put_i32(1);
    content.put_i32(0);
    let message_set = [0u8; 40];
    content.put_i32(message_set.len() as i32);
    content.put_slice(&message_set);
    let mut frame = (content.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&content);
    frame
}

fn connect(kafka: &str) -> TcpStream {
    let stream = TcpStream::connect(kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Each kind of bad Kafka input costs only its own connection (or, for a batch, its own
/// partition), with nothing stored; the node keeps serving.
#[test]
fn bad_kafka_input_closes_its_connection_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let (node, kafka) = kafka_node(
        dir.path(),
        1,
        &["--max-frame-bytes", "1048576", "--admin", &admin_address],
    );
    node.cli(&["topic", "create", "t", "--partitions", "1"], None);

    // ApiVersions of a version not served: answered at version 0 with the versions served.
    let mut stream = connect(&kafka);
    let future = request_frame(
        ApiKey::ApiVersions,
        3,
        7,
        &strata_kafka::kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    let mut unsupported = future.clone();
    unsupported[6..8].copy_from_slice(&99i16.to_be_bytes());
    stream.write_all(&unsupported).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer");
    assert_eq!(
        ResponseHeader::decode(&mut answer, 0)
            .unwrap()
            .correlation_id,
        7
    );
    let versions = ApiVersionsResponse::decode(&mut answer, 0).unwrap();
    assert_eq!(versions.error_code, 35, "UNSUPPORTED_VERSION");
    assert!(
        versions
            .api_keys
            .iter()
            .any(|api| api.api_key == ApiKey::Produce as i16)
    );
    // ... and the connection stays usable.
    stream.write_all(&future).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer");
    ResponseHeader::decode(&mut answer, 0).unwrap();
    assert_eq!(
        ApiVersionsResponse::decode(&mut answer, 3)
            .unwrap()
            .error_code,
        0
    );

    let hung_up = |bytes: &[u8]| {
        let mut stream = connect(&kafka);
        stream.write_all(bytes).unwrap();
        read_frame(&mut stream).is_none()
    };
    // A frame over --max-frame-bytes: closed before its body is read.
    assert!(hung_up(&(64i32 << 20).to_be_bytes()));
    let metadata = request_frame(ApiKey::Metadata, 9, 1, &MetadataRequest::default());
    // An API or version not served is answered UNSUPPORTED_VERSION in its own response, and
    // the connection stays usable: a version it does not serve (Metadata 13), an API it does
    // not (UpdateFeatures), Produce v2 (advertised, as Kafka 4 does, so that librdkafka
    // before 2.10 compresses with gzip and snappy; refused per partition, nothing stored).
    let mut stream = connect(&kafka);
    let mut metadata_13 = metadata.clone();
    metadata_13[6..8].copy_from_slice(&13i16.to_be_bytes());
    stream.write_all(&metadata_13).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer to Metadata 13");
    ResponseHeader::decode(&mut answer, ApiKey::Metadata.response_header_version(13)).unwrap();
    assert_eq!(
        MetadataResponse::decode(&mut answer, 13)
            .unwrap()
            .error_code,
        35
    );
    let features = request_frame(
        ApiKey::UpdateFeatures,
        1,
        2,
        &UpdateFeaturesRequest::default(),
    );
    stream.write_all(&features).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer to UpdateFeatures");
    let header = ResponseHeader::decode(
        &mut answer,
        ApiKey::UpdateFeatures.response_header_version(1),
    );
    assert_eq!(header.unwrap().correlation_id, 2);
    assert_eq!(
        UpdateFeaturesResponse::decode(&mut answer, 1)
            .unwrap()
            .error_code,
        35
    );
    stream.write_all(&produce_v2(3, "t")).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer to Produce v2");
    assert_eq!(answer.get_i32(), 3, "correlation id");
    assert_eq!(answer.get_i32(), 1, "one topic");
    let name_len = answer.get_i16() as usize;
    assert_eq!(&answer.split_to(name_len)[..], b"t");
    assert_eq!(answer.get_i32(), 1, "one partition");
    assert_eq!(answer.get_i32(), 0, "partition 0");
    assert_eq!(answer.get_i16(), 35, "UNSUPPORTED_VERSION");
    stream.write_all(&metadata).unwrap();
    read_frame(&mut stream).expect("the connection still serves");
    assert_eq!(stored_records(&node, "t"), 0);
    let refused = |api: &str| {
        let (_, text) = support::http_get(admin, "/metrics");
        text.lines()
            .find(|line| {
                line.starts_with("strata_kafka_unsupported_requests_total")
                    && line.contains(&format!("api=\"{api}\""))
            })
            .and_then(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
    };
    assert_eq!(refused("Metadata"), Some(1));
    assert_eq!(refused("UpdateFeatures"), Some(1));
    assert_eq!(refused("Produce"), Some(1));
    // An API whose answer has no place for the code (TxnOffsetCommit's errors are per
    // partition) closes the connection, as Kafka does for a request it cannot take.
    let mut txn_commit = metadata.clone();
    txn_commit[4..6].copy_from_slice(&(ApiKey::TxnOffsetCommit as i16).to_be_bytes());
    txn_commit[6..8].copy_from_slice(&0i16.to_be_bytes());
    assert!(hung_up(&txn_commit));
    // A body cut short is refused; bytes past a whole request are ignored, as Kafka's brokers
    // ignore them (librdkafka 2.1 and later send some), and the request is answered.
    let mut short = metadata[..metadata.len() - 1].to_vec();
    let size = (short.len() - 4) as i32;
    short[..4].copy_from_slice(&size.to_be_bytes());
    assert!(hung_up(&short));
    let mut long = metadata.clone();
    long.extend_from_slice(b"zz");
    let size = (long.len() - 4) as i32;
    long[..4].copy_from_slice(&size.to_be_bytes());
    let mut stream = connect(&kafka);
    stream.write_all(&long).unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer to a request with bytes past it");
    let header =
        ResponseHeader::decode(&mut answer, ApiKey::Metadata.response_header_version(9)).unwrap();
    assert_eq!(header.correlation_id, 1);
    // A frame too short for a header.
    assert!(hung_up(&[0, 0, 0, 3, 1, 2, 3]));
    // A Metadata request claiming 2^31 - 1 topics in 14 bytes: malformed, not a 154 GB
    // allocation (which aborted the broker before kafka-protocol was patched).
    let mut bomb = vec![0, 0, 0, 14, 0, 3, 0, 1, 0, 0, 0, 1, 0xff, 0xff];
    bomb.extend_from_slice(&i32::MAX.to_be_bytes());
    assert!(hung_up(&bomb));

    // A produce whose records are no Kafka batch: that partition is CORRUPT_MESSAGE, nothing
    // stored (a batch failing its CRC is refused the same way: `strata-kafka`'s unit tests).
    let corrupt = Bytes::from_static(&[0u8; 70]);
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(corrupt)),
                ]),
        ]);
    let mut stream = connect(&kafka);
    stream
        .write_all(&request_frame(ApiKey::Produce, 9, 11, &produce))
        .unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer");
    let header = ResponseHeader::decode(&mut answer, ApiKey::Produce.response_header_version(9));
    assert_eq!(header.unwrap().correlation_id, 11);
    let produced = ProduceResponse::decode(&mut answer, 9).unwrap();
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 2);
    assert!(!answer.has_remaining());
    assert_eq!(stored_records(&node, "t"), 0);

    // The node still serves Kafka clients and its own.
    kcat(&kafka, &["-P", "-t", "t"], Some(b"after\n"));
    assert_eq!(stored_records(&node, "t"), 1);
    assert!(kcat(&kafka, &["-L"], None).contains("topic \"t\""));
}

/// kcat consumes in a consumer group (Kafka's classic group protocol, librdkafka's
/// assignor): a lone member reads everything and commits; a second run resumes from the
/// commits; two members split the partitions between them and leave cleanly, and `strata
/// group describe` shows all of it.
#[test]
fn kcat_consumer_groups_split_partitions_commit_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 2, &[]);
    node.cli(&["topic", "create", "events", "--partitions", "4"], None);
    let (sent, input) = keyed_lines("first", 2_000);
    kcat(&kafka, &["-P", "-t", "events", "-K", ":"], Some(&input));

    let group_read = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["-G", "readers", "-e", "-q", "-f", "%s\n"];
        args.extend_from_slice(extra);
        args.push("events");
        kcat(&kafka, &args, None)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let mut first = group_read(&["-o", "beginning"]);
    first.sort();
    let mut expected: Vec<String> = sent.iter().map(|(_, value)| value.clone()).collect();
    expected.sort();
    assert_eq!(first, expected);
    let describe = |group: &str| group_committed(&node, group).0;
    let (described, committed) = group_committed(&node, "readers");
    assert_eq!(committed, 2_000, "{described}");

    let (more, input) = keyed_lines("second", 300);
    kcat(&kafka, &["-P", "-t", "events", "-K", ":"], Some(&input));
    let mut second = group_read(&[]);
    second.sort();
    let mut expected: Vec<String> = more.iter().map(|(_, value)| value.clone()).collect();
    expected.sort();
    assert_eq!(
        second, expected,
        "the second run starts at the committed offsets"
    );

    // Two members at once: each gets its share, then they leave.
    let member = || {
        support::kcat_command()
            .args(["-b", &kafka, "-G", "pair", "-q", "-f", "%s\n", "events"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let assignments = || -> Vec<Vec<u64>> {
        let described = describe("pair");
        let mut shares: Vec<Vec<u64>> = described["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|member| {
                member["partitions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["partition"].as_u64().unwrap())
                    .collect()
            })
            .collect();
        shares.sort();
        shares
    };
    let mut one = member();
    wait_for("the first member to hold every partition", || {
        assignments() == [vec![0, 1, 2, 3]]
    });
    let mut two = member();
    wait_for("two members sharing the partitions", || {
        let shares = assignments();
        let mut all: Vec<u64> = shares.iter().flatten().copied().collect();
        all.sort();
        shares.len() == 2 && shares.iter().all(|share| share.len() == 2) && all == [0, 1, 2, 3]
    });
    assert_eq!(describe("pair")["state"], "Stable");
    for member in [&mut one, &mut two] {
        // SAFETY: kill(2) on a child this test spawned and has not reaped.
        unsafe { libc::kill(member.id() as i32, libc::SIGTERM) };
        member.wait().unwrap();
    }
    wait_for("the group to be empty after both left", || {
        describe("pair")["members"].as_array().unwrap().is_empty()
    });
}

/// kafka-python (a Kafka client written apart from librdkafka, in Python) produces gzip
/// batches with headers and acks=all, and two of its consumers share a group: every record
/// arrives once, with its key and headers, and the group's commits are in Strata's store.
#[test]
fn kafka_python_produces_and_consumes_in_a_group() {
    let dir = tempfile::tempdir().unwrap();
    // Its consumers stop after 5 s without a record (consumer_timeout_ms), and a group's first
    // generation would wait the initial delay (3 s by default) for more members.
    let (node, kafka) = kafka_node(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    node.cli(&["topic", "create", "py", "--partitions", "4"], None);
    let script = r#"
import json, sys, threading
from kafka import KafkaConsumer, KafkaProducer
bootstrap = sys.argv[1]
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                         compression_type="gzip")
sent = [producer.send("py", key=f"k{i % 11}".encode(), value=f"v{i}".encode(),
                      headers=[("seq", str(i).encode())]) for i in range(3000)]
producer.flush()
acked = [future.get(timeout=30) for future in sent]
seen, lock, partitions = [], threading.Lock(), {}
def consume(name):
    consumer = KafkaConsumer("py", bootstrap_servers=bootstrap, group_id="pygroup",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=5000)
    for message in consumer:
        with lock:
            seen.append([message.partition, message.offset, message.key.decode(),
                         message.value.decode(), dict(message.headers)["seq"].decode()])
        consumer.commit()
    partitions[name] = sorted(tp.partition for tp in consumer.assignment())
    consumer.close()
threads = [threading.Thread(target=consume, args=(name,)) for name in ("a", "b")]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(json.dumps({"acked": [[m.partition, m.offset] for m in acked], "seen": seen,
                  "partitions": partitions}))
"#;
    let result = kafka_python(script, &kafka);
    let acked: Vec<(u64, u64)> = result["acked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap()))
        .collect();
    let mut seen: BTreeMap<(u64, u64), (String, String, String)> = BTreeMap::new();
    for record in result["seen"].as_array().unwrap() {
        let at = (record[0].as_u64().unwrap(), record[1].as_u64().unwrap());
        let fields = (
            record[2].as_str().unwrap().to_string(),
            record[3].as_str().unwrap().to_string(),
            record[4].as_str().unwrap().to_string(),
        );
        // At least once: a record read twice (a rebalance before a commit) is the same record.
        if let Some(earlier) = seen.insert(at, fields.clone()) {
            assert_eq!(earlier, fields);
        }
    }
    assert_eq!(seen.len(), 3000);
    for (i, at) in acked.iter().enumerate() {
        let (key, value, seq) = &seen[at];
        assert_eq!(
            (key.as_str(), value.as_str(), seq.as_str()),
            (
                format!("k{}", i % 11).as_str(),
                format!("v{i}").as_str(),
                i.to_string().as_str()
            ),
            "the record acknowledged at {at:?}"
        );
    }
    let (described, committed) = group_committed(&node, "pygroup");
    assert_eq!(committed, 3000, "{described}");
}

/// Kafka's AdminClient (kafka-python's) manages topics through the Kafka listener: creates
/// them (defaults and configs), grows one, deletes another, reads and changes a topic's
/// configs, lists and describes a consumer group with its members' partitions, and deletes it
/// once empty. Strata's CLI sees the same.
#[test]
fn a_kafka_admin_client_manages_topics_and_sees_groups() {
    let dir = tempfile::tempdir().unwrap();
    // Its consumer reads for 2 s (consumer_timeout_ms), less than a group's default initial
    // rebalance delay.
    let (node, kafka) = kafka_node(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let script = r#"
import json, sys
from kafka import KafkaConsumer
from kafka.admin import (ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions,
                         NewTopic)
bootstrap = sys.argv[1]
admin = KafkaAdminClient(bootstrap_servers=bootstrap)
out = {}
created = admin.create_topics([NewTopic("kept", 3, 1, topic_configs={
                                   "retention.ms": "60000", "cleanup.policy": "delete"}),
                               NewTopic("dropped", -1, -1)])
out["created"] = {t["name"]: t["error_code"] for t in created["topics"]}
for bad in [NewTopic("bad", 0, 1),
            NewTopic("compacted", 1, 1, topic_configs={"cleanup.policy": "compact"})]:
    try:
        admin.create_topics([bad])
        out["created"][bad.name] = 0
    except Exception as error:
        out["created"][bad.name] = getattr(error, "errno", str(error))
out["grown"] = [r.error_code for r in admin.create_partitions({"kept": NewPartitions(5)}).results]
out["deleted"] = [t["error_code"] for t in admin.delete_topics(["dropped"])["topics"]]
out["topics"] = sorted(admin.list_topics())
kept = ConfigResource(ConfigResourceType.TOPIC, "kept")
overrides = lambda: {key: entry["value"] for key, entry in
                     admin.describe_configs([kept])["topic"]["kept"].items()}
out["overrides"] = overrides()
out["altered"] = admin.alter_configs([ConfigResource(
    ConfigResourceType.TOPIC, "kept", configs={"segment.bytes": "1048576"})])["topic"]["kept"]
out["replaced"] = admin.alter_configs([ConfigResource(
    ConfigResourceType.TOPIC, "kept", configs={"retention.ms": "120000"})],
    incremental=False)["topic"]["kept"]
out["after"] = overrides()
consumer = KafkaConsumer("kept", bootstrap_servers=bootstrap, group_id="watchers",
                         consumer_timeout_ms=2000)
for _ in consumer:
    pass
out["groups"] = [g["group_id"] for g in admin.list_groups()]
described = admin.describe_groups(["watchers"])["watchers"]
out["state"] = described["group_state"]
out["members"] = [sorted(p for a in m["member_assignment"]["assigned_partitions"]
                         for p in a["partitions"]) for m in described["members"]]
consumer.close()
out["group_deleted"] = {group: str(outcome) for group, outcome in
                        admin.delete_groups(["watchers", "never-seen"]).items()}
out["groups_after"] = [g["group_id"] for g in admin.list_groups()]
print(json.dumps(out))
"#;
    let result = kafka_python(script, &kafka);
    assert_eq!(
        result["created"],
        serde_json::json!({"kept": 0, "dropped": 0, "bad": 37, "compacted": 0}),
        "INVALID_PARTITIONS for 0 partitions; a compacted topic is created"
    );
    assert_eq!(result["grown"], serde_json::json!([0]));
    assert_eq!(result["deleted"], serde_json::json!([0]));
    assert_eq!(result["topics"], serde_json::json!(["compacted", "kept"]));
    // Configs: the overrides set at creation, one added incrementally, one replaced (the
    // legacy AlterConfigs replaces the overrides; kafka-python sends the others along).
    assert_eq!(
        result["overrides"],
        serde_json::json!({"retention.ms": "60000", "cleanup.policy": "delete"})
    );
    assert_eq!(result["altered"], "OK");
    assert_eq!(result["replaced"], "OK");
    assert_eq!(
        result["after"],
        serde_json::json!({
            "retention.ms": "120000",
            "segment.bytes": "1048576",
            "cleanup.policy": "delete"
        })
    );
    assert_eq!(result["groups"], serde_json::json!(["watchers"]));
    assert_eq!(result["state"], "Stable");
    assert_eq!(result["members"], serde_json::json!([[0, 1, 2, 3, 4]]));
    // Once its member left, the group is deleted with its offsets.
    assert_eq!(
        result["group_deleted"],
        serde_json::json!({"watchers": "OK", "never-seen": "GroupIdNotFoundError"})
    );
    assert_eq!(result["groups_after"], serde_json::json!([]));

    let described = support::describe(&node, "kept");
    assert_eq!(described["partitions"].as_array().unwrap().len(), 5);
    let config = node.cli(&["topic", "describe", "kept"], None);
    assert!(config.contains("retention.ms=120000"), "{config}");
    assert!(config.contains("segment.bytes=1048576"), "{config}");
    assert_eq!(node.cli(&["topic", "list"], None).trim(), "compacted\nkept");
}

/// A Kafka consumer group outlives its coordinator: kill -9 of the broker coordinating the
/// group (and leading a third of the partitions) while a kcat member consumes; another broker
/// takes the group over from its record, the member goes on as it was (the same member id and
/// generation: no rebalance, as with Kafka's coordinator), and every record, those produced
/// after the kill too, is consumed (at least once) and finally committed.
#[test]
fn a_kafka_consumer_group_survives_the_loss_of_its_coordinator() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = kafka_cluster(&etcd, &dirs);
    let kafka = nodes[0].1.clone();
    wait_for("three brokers", || {
        kcat(&kafka, &["-L"], None).contains(" 3 brokers:")
    });
    nodes[0].0.cli(
        &[
            "topic",
            "create",
            "ledger",
            "--partitions",
            "6",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
        None,
    );
    wait_for("leaders for every partition", || {
        !kcat(&kafka, &["-L", "-t", "ledger"], None).contains("leader -1")
    });
    let (mut sent, input) = keyed_lines("before", 3_000);
    kcat(
        &kafka,
        &["-P", "-t", "ledger", "-K", ":", "-X", "acks=all"],
        Some(&input),
    );

    // "orders" hashes to broker 3 among brokers 1-3 (crc32c mod 3).
    let consumed = dirs[0].path().join("consumed.txt");
    let mut member = support::kcat_command()
        .args([
            "-b",
            &kafka,
            "-G",
            "orders",
            "-o",
            "beginning",
            "-q",
            "-u",
            "-f",
            "%s\n",
            "-X",
            "auto.commit.interval.ms=500",
            "ledger",
        ])
        .stdout(std::fs::File::create(&consumed).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = || -> std::collections::BTreeSet<String> {
        std::fs::read_to_string(&consumed)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    wait_for_at_most(
        "the member to read the first records",
        Duration::from_secs(30),
        || seen().len() == 3_000,
    );
    let membership = |described: &serde_json::Value| {
        (
            described["generation"].as_i64().unwrap(),
            described["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|member| member["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>(),
        )
    };
    let before = membership(&group_committed(&nodes[0].0, "orders").0);
    assert_eq!(before.1.len(), 1, "{before:?}");
    nodes[2].0.kill();

    let (more, input) = keyed_lines("after", 3_000);
    kcat(
        &kafka,
        &["-P", "-t", "ledger", "-K", ":", "-X", "acks=all"],
        Some(&input),
    );
    sent.extend(more);
    let expected: std::collections::BTreeSet<String> =
        sent.into_iter().map(|(_, value)| value).collect();
    wait_for_at_most(
        "every record consumed after the coordinator died",
        Duration::from_secs(60),
        || seen() == expected,
    );
    wait_for_at_most("the commits to catch up", Duration::from_secs(30), || {
        group_committed(&nodes[0].0, "orders").1 == 6_000
    });
    let (described, _) = group_committed(&nodes[1].0, "orders");
    assert_eq!(membership(&described), before, "{described}");
    // Each broker lists the groups it coordinates, as Kafka's do (admin clients ask every
    // broker and join the lists): the group is listed once, by the broker running it now, with
    // its state; a filter of states keeps it or leaves it out.
    let listed = |states: &[&str]| -> Vec<String> {
        nodes[..2]
            .iter()
            .flat_map(|(_, kafka)| list_groups(kafka, states))
            .filter(|(group, _)| group == "orders")
            .map(|(_, state)| state)
            .collect()
    };
    assert_eq!(listed(&[]), ["Stable"]);
    assert_eq!(listed(&["stable", "Empty"]), ["Stable"]);
    assert!(listed(&["Empty"]).is_empty());
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(member.id() as i32, libc::SIGTERM) };
    member.wait().unwrap();
}

/// kafkajs (a third Kafka client, in JavaScript) creates a topic, produces gzip batches with
/// headers from an idempotent producer with acks=all, and consumes them in a group whose
/// commits its admin client reads back.
#[test]
fn kafkajs_produces_idempotently_and_consumes_in_a_group() {
    let modules = support::kafkajs_modules();
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 2, &[]);
    let script = r#"
const { Kafka, logLevel, CompressionTypes } = require('kafkajs')
const kafka = new Kafka({ clientId: 'strata-test', brokers: [process.env.STRATA_KAFKA], logLevel: logLevel.ERROR })
async function main() {
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ topics: [{ topic: 'js', numPartitions: 3 }] })
  const producer = kafka.producer({ idempotent: true })
  await producer.connect()
  const acked = []
  for (let i = 0; i < 10; i++) {
    const messages = Array.from({ length: 100 }, (_, j) =>
      ({ key: `k${j % 7}`, value: `v${i * 100 + j}`, headers: { seq: `${i * 100 + j}` } }))
    const sent = await producer.send({ topic: 'js', acks: -1, compression: CompressionTypes.GZIP, messages })
    acked.push(...sent.map((r) => r.errorCode))
  }
  await producer.disconnect()
  const consumer = kafka.consumer({ groupId: 'jsgroup' })
  await consumer.connect()
  await consumer.subscribe({ topic: 'js', fromBeginning: true })
  const seen = new Map()
  await new Promise((resolve) => {
    consumer.run({ eachMessage: async ({ partition, message }) => {
      seen.set(message.value.toString(), [partition, message.key.toString(), message.headers.seq.toString()])
      if (seen.size === 1000) resolve()
    } })
  })
  await consumer.disconnect()
  const offsets = await admin.fetchOffsets({ groupId: 'jsgroup', topics: ['js'] })
  await admin.disconnect()
  console.log(JSON.stringify({ acked, seen: Object.fromEntries(seen),
    committed: offsets[0].partitions.reduce((sum, p) => sum + Number(p.offset), 0) }))
}
main().catch((error) => { console.error(error); process.exit(1) })
"#;
    let output = Command::new("node")
        .args(["-e", script])
        .env("STRATA_KAFKA", &kafka)
        .env("NODE_PATH", &modules)
        .env("KAFKAJS_NO_PARTITIONER_WARNING", "1")
        .stderr(Stdio::inherit())
        .output()
        .expect("node (Debian's nodejs)");
    assert!(output.status.success(), "the kafkajs script failed");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        result["acked"]
            .as_array()
            .unwrap()
            .iter()
            .all(|code| code == 0),
        "{}",
        result["acked"]
    );
    let seen = result["seen"].as_object().unwrap();
    assert_eq!(seen.len(), 1000);
    let mut partition_of_key = BTreeMap::new();
    for i in 0..1000 {
        let record = &seen[&format!("v{i}")];
        let key = format!("k{}", (i % 100) % 7);
        assert_eq!(record[1], key.as_str());
        assert_eq!(record[2], i.to_string().as_str());
        let partition = record[0].as_u64().unwrap();
        assert_eq!(
            *partition_of_key.entry(key).or_insert(partition),
            partition,
            "a key stays on one partition"
        );
    }
    assert_eq!(result["committed"], 1000);
    assert_eq!(stored_records(&node, "js"), 1000);
}

/// Static membership (KIP-345) with kcat: two members with instance ids share the partitions;
/// the follower, then the leader, is killed and restarted with its instance id, and takes its
/// partitions back at the same generation: no rebalance, its partner untouched.
#[test]
fn a_restarted_static_kcat_member_gets_its_partitions_back_without_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 2, &[]);
    node.cli(&["topic", "create", "static", "--partitions", "4"], None);
    let member = |instance: &str| {
        support::kcat_command()
            .args([
                "-b",
                &kafka,
                "-G",
                "pods",
                "-q",
                "-X",
                &format!("group.instance.id={instance}"),
                "-X",
                "session.timeout.ms=30000",
                "static",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let state = || -> (i64, Vec<(String, Vec<u64>)>) {
        let (described, _) = group_committed(&node, "pods");
        let mut members: Vec<(String, Vec<u64>)> = described["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|member| {
                let partitions = member["partitions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["partition"].as_u64().unwrap())
                    .collect();
                (member["id"].as_str().unwrap().to_string(), partitions)
            })
            .collect();
        members.sort();
        (described["generation"].as_i64().unwrap(), members)
    };
    // pod-a first, so that it leads.
    let mut a = member("pod-a");
    wait_for_at_most(
        "pod-a alone holds every partition",
        Duration::from_secs(30),
        || {
            let (_, members) = state();
            members.len() == 1 && members[0].1.len() == 4
        },
    );
    let mut b = member("pod-b");
    wait_for_at_most(
        "both static members assigned",
        Duration::from_secs(30),
        || {
            let (_, members) = state();
            members.len() == 2 && members.iter().all(|(_, partitions)| partitions.len() == 2)
        },
    );
    let shares = |members: &[(String, Vec<u64>)]| -> Vec<Vec<u64>> {
        let mut shares: Vec<Vec<u64>> = members.iter().map(|(_, p)| p.clone()).collect();
        shares.sort();
        shares
    };
    // Kills a member and starts its instance again: it comes back under a new member id with
    // the same partitions, at the same generation.
    let restart = |child: &mut std::process::Child, instance: &str| -> std::process::Child {
        let (generation, before) = state();
        child.kill().unwrap();
        child.wait().unwrap();
        let restarted = member(instance);
        wait_for_at_most(
            "the instance back under a new member id",
            Duration::from_secs(30),
            || {
                let (_, members) = state();
                members.len() == 2
                    && members
                        .iter()
                        .filter(|member| before.contains(member))
                        .count()
                        == 1
                    && members.iter().all(|(_, partitions)| partitions.len() == 2)
            },
        );
        // A rebalance, had there been one, would have started at that join: give the members a
        // few heartbeats (3 s apart) to hear of it and the group to settle, then look again.
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(group_committed(&node, "pods").0["state"], "Stable");
        let (generation_after, after) = state();
        assert_eq!(
            generation_after, generation,
            "{instance}: no rebalance: {before:?} → {after:?}"
        );
        assert_eq!(
            shares(&after),
            shares(&before),
            "{instance}: the same partitions"
        );
        restarted
    };
    let mut b = restart(&mut b, "pod-b");
    // The leader too (it hears everyone's metadata; its sync gets the current assignment).
    let mut a = restart(&mut a, "pod-a");
    for member in [&mut a, &mut b] {
        member.kill().unwrap();
        member.wait().unwrap();
    }
}

/// Fetch answers decode at every version served (4 to 18, flexible or not, by topic name up
/// to 12 and by topic id from 13), with the records produced, as Kafka's own decoder reads
/// them: the listener's chunked Fetch encoder (which leaves the records where they are) writes
/// each version's fields and no others. An id no topic has is answered UNKNOWN_TOPIC_ID.
#[test]
fn fetches_are_answered_at_every_served_version() {
    use strata_kafka::kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use strata_kafka::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use strata_kafka::kafka_protocol::messages::{FetchRequest, FetchResponse};
    use strata_kafka::kafka_protocol::records::RecordBatchDecoder;
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &[]);
    node.cli(&["topic", "create", "one", "--partitions", "1"], None);
    kcat(&kafka, &["-P", "-t", "one"], Some(b"a\nb\nc\n"));
    let mut stream = connect(&kafka);
    let one = TopicName(StrBytes::from_static_str("one"));
    let asked = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(one.clone())),
    ]));
    stream
        .write_all(&request_frame(ApiKey::Metadata, 12, 1, &asked))
        .unwrap();
    let mut answer = read_frame(&mut stream).unwrap();
    ResponseHeader::decode(&mut answer, ApiKey::Metadata.response_header_version(12)).unwrap();
    let topic_id = MetadataResponse::decode(&mut answer, 12).unwrap().topics[0].topic_id;
    assert!(!topic_id.is_nil());
    let fetch = |version: i16, topic_id| {
        let topic = if version >= 13 {
            FetchTopic::default().with_topic_id(topic_id)
        } else {
            FetchTopic::default().with_topic(one.clone())
        };
        FetchRequest::default()
            .with_replica_id(strata_kafka::kafka_protocol::messages::BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![topic.with_partitions(vec![
                FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20),
            ])])
    };
    let mut ask = |version: i16, request: &FetchRequest| {
        stream
            .write_all(&request_frame(
                ApiKey::Fetch,
                version,
                version as i32,
                request,
            ))
            .unwrap();
        let mut answer = read_frame(&mut stream)
            .unwrap_or_else(|| panic!("Fetch v{version}: the connection closed"));
        let header =
            ResponseHeader::decode(&mut answer, ApiKey::Fetch.response_header_version(version))
                .unwrap();
        assert_eq!(header.correlation_id, version as i32);
        FetchResponse::decode(&mut answer, version).unwrap()
    };
    for version in 4..=18 {
        let response = ask(version, &fetch(version, topic_id));
        if version >= 13 {
            assert_eq!(response.responses[0].topic_id, topic_id, "v{version}");
        }
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, 0, "v{version}");
        assert_eq!(partition.high_watermark, 3, "v{version}");
        let mut records = partition.records.clone().unwrap();
        let values: Vec<String> = RecordBatchDecoder::decode_all(&mut records)
            .unwrap()
            .into_iter()
            .flat_map(|set| set.records)
            .map(|record| String::from_utf8(record.value.unwrap().to_vec()).unwrap())
            .collect();
        assert_eq!(values, ["a", "b", "c"], "v{version}");
    }
    let unknown = uuid::Uuid::from_u128(42);
    let response = ask(13, &fetch(13, unknown));
    assert_eq!(response.responses[0].topic_id, unknown);
    assert_eq!(response.responses[0].partitions[0].error_code, 100);
}

/// `--kafka-auto-create-topics` (Kafka's auto.create.topics.enable): a Kafka producer's first
/// use of a topic creates it with Kafka's defaults; without the flag the topic stays unknown
/// and the producer's records fail.
#[test]
fn kafka_clients_create_topics_on_first_use_only_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &["--kafka-auto-create-topics"]);
    kcat(&kafka, &["-P", "-t", "fresh"], Some(b"one\ntwo\n"));
    assert_eq!(
        support::describe(&node, "fresh")["partitions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(stored_records(&node, "fresh"), 2);

    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &[]);
    let mut producer = support::kcat_command()
        .args([
            "-b",
            &kafka,
            "-P",
            "-t",
            "absent",
            "-X",
            "message.timeout.ms=2000",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    producer.stdin.take().unwrap().write_all(b"lost\n").unwrap();
    let output = wait_with_timeout(producer, Duration::from_secs(30));
    assert!(
        !output.status.success(),
        "kcat reports the records it could not deliver"
    );
    assert!(node.cli(&["topic", "list"], None).trim().is_empty());
}

/// Lag in seconds: a native group and a Kafka group (committed by kcat) that stopped
/// consuming while a producer writes a record a second show, on `/metrics` and in `strata
/// group describe`, the age of the oldest record they have not consumed (within 2 s), and 0
/// once caught up.
#[test]
fn lag_in_seconds_is_the_age_of_the_oldest_record_a_group_has_not_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let (node, kafka) = kafka_node(dir.path(), 1, &["--admin", &admin_address]);
    node.cli(&["topic", "create", "lagging", "--partitions", "1"], None);
    node.cli(&["produce", "lagging"], Some(b"0\n1\n2\n3\n4\n"));
    node.cli(
        &[
            "consume",
            "lagging",
            "--group",
            "behind",
            "--from-beginning",
            "--max-messages",
            "5",
        ],
        None,
    );
    kcat(
        &kafka,
        &[
            "-G",
            "kbehind",
            "-o",
            "beginning",
            "-c",
            "5",
            "-q",
            "lagging",
        ],
        None,
    );
    // One record a second for LAG_SECONDS; the first of them is the oldest neither group read.
    const LAG_SECONDS: u64 = 30;
    let first_unread = std::time::Instant::now();
    for i in 0..LAG_SECONDS {
        node.cli(
            &["produce", "lagging"],
            Some(format!("late-{i}\n").as_bytes()),
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let lag_seconds = |group: &str| -> f64 {
        let (_, text) = support::http_get(admin, "/metrics");
        text.lines()
            .find(|line| {
                line.starts_with("strata_group_lag_seconds{")
                    && line.contains(&format!("group=\"{group}\""))
            })
            .and_then(|line| line.rsplit_once(' ')?.1.parse().ok())
            .unwrap_or(f64::NAN)
    };
    // The broker measures every few seconds; the age it shows is taken as it answers.
    support::wait_for_at_most("both groups' lag measured", Duration::from_secs(15), || {
        !lag_seconds("behind").is_nan() && !lag_seconds("kbehind").is_nan()
    });
    for group in ["behind", "kbehind"] {
        let expected = first_unread.elapsed().as_secs_f64();
        let shown = lag_seconds(group);
        assert!(
            (shown - expected).abs() <= 2.0 && shown >= LAG_SECONDS as f64 - 2.0,
            "{group}: {shown} s on /metrics, {expected:.1} s expected"
        );
        let described: serde_json::Value = serde_json::from_str(
            &node.cli(&["group", "describe", group, "--format", "json"], None),
        )
        .unwrap();
        let expected = first_unread.elapsed().as_secs_f64();
        let shown = described["offsets"][0]["lag_seconds"].as_f64().unwrap();
        assert!(
            (shown - expected).abs() <= 2.0,
            "{group}: {shown} s in group describe, {expected:.1} s expected: {described}"
        );
        assert_eq!(described["offsets"][0]["lag"], LAG_SECONDS, "{described}");
    }
    // Caught up: no record left unread, no lag.
    node.cli(
        &[
            "consume",
            "lagging",
            "--group",
            "behind",
            "--max-messages",
            "30",
        ],
        None,
    );
    support::wait_for_at_most("the caught-up group's lag", Duration::from_secs(15), || {
        lag_seconds("behind") == 0.0
    });
    let described: serde_json::Value =
        serde_json::from_str(&node.cli(&["group", "describe", "behind", "--format", "json"], None))
            .unwrap();
    assert_eq!(described["offsets"][0]["lag_seconds"], 0.0, "{described}");
}

/// A Kafka producer's conditional append: the `strata.expected.offset` header on the first
/// record (kcat `-H`) makes the partition's records written only at that offset; elsewhere
/// kcat's delivery fails (INVALID_RECORD, the log end in the error message) and nothing is
/// written.
#[test]
fn a_kafka_producer_appends_conditionally_with_a_record_header() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &[]);
    node.cli(&["topic", "create", "kcas", "--partitions", "1"], None);
    let append = |expected: &str, value: &str| {
        let header = format!("strata.expected.offset={expected}");
        let args = ["-P", "-t", "kcas", "-p", "0", "-H", &header];
        kcat_output(&kafka, &args, Some(format!("{value}\n").as_bytes()))
    };
    assert!(append("0", "first").status.success());
    let refused = append("0", "second");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("failed to validate record"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(append("1", "third").status.success());
    let read = kcat(
        &kafka,
        &["-C", "-t", "kcas", "-e", "-q", "-f", "%o %s\n"],
        None,
    );
    assert_eq!(read, "0 first\n1 third\n");
}

/// Durability in every acknowledgement, on one node with `flush=interval`: a plain ack says
/// the records are in the leader's page cache only, and a later ack shows the interval's sync
/// covering them; a `--durability synced` produce's ack says synced, and its records are there
/// after a kill -9 taken right after it. Kafka producers get Kafka's usual answer; their acks
/// are counted in `/metrics` by durability, as the native ones are.
#[test]
fn acks_say_how_durable_their_records_were() {
    const INTERVAL_MS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let (mut node, kafka) = kafka_node(dir.path(), 1, &["--admin", &admin_address]);
    let interval = format!("flush.interval.ms={INTERVAL_MS}");
    node.cli(
        &[
            "topic",
            "create",
            "durable",
            "--partitions",
            "1",
            "--config",
            "flush=interval",
            "--config",
            &interval,
        ],
        None,
    );
    let produce = |args: &[&str], value: &str| -> serde_json::Value {
        let mut all = vec!["produce", "durable", "--print-offsets", "--format", "json"];
        all.extend_from_slice(args);
        let printed = node.cli(&all, Some(format!("{value}\n").as_bytes()));
        serde_json::from_str(printed.trim()).unwrap_or_else(|_| panic!("{printed}"))
    };
    let first = produce(&[], "first");
    let written = std::time::Instant::now();
    assert_eq!(first["offset"], 0, "{first}");
    let durability = &first["durability"];
    assert_eq!(durability["replicas"], 1, "{first}");
    assert_eq!(durability["synced_replicas"], 0, "{first}");
    assert_eq!(durability["leader_synced"], false, "{first}");
    assert_eq!(durability["leader_synced_offset"], 0, "{first}");
    // Until the interval passes, acks still find the first record unsynced.
    let second = produce(&[], "second");
    if written.elapsed() < Duration::from_millis(INTERVAL_MS) {
        assert_eq!(second["durability"]["leader_synced_offset"], 0, "{second}");
    }
    std::thread::sleep(Duration::from_millis(INTERVAL_MS + 1_500));
    let third = produce(&[], "third");
    assert_eq!(third["durability"]["leader_synced"], false, "{third}");
    assert!(
        third["durability"]["leader_synced_offset"]
            .as_u64()
            .unwrap()
            >= 2,
        "the interval's sync covers the first two records: {third}"
    );
    // Asked synced: synced before the ack, however far the interval is.
    let synced = produce(&["--durability", "synced"], "synced");
    assert_eq!(synced["offset"], 3, "{synced}");
    assert_eq!(synced["durability"]["leader_synced"], true, "{synced}");
    assert_eq!(synced["durability"]["synced_replicas"], 1, "{synced}");
    assert!(
        synced["durability"]["leader_synced_offset"]
            .as_u64()
            .unwrap()
            >= 4,
        "{synced}"
    );
    // A Kafka producer's acks count in /metrics (kcat's answer is Kafka's own).
    kcat(
        &kafka,
        &["-P", "-t", "durable", "-p", "0"],
        Some(b"from-kafka\n"),
    );
    let acks = |synced: &str| -> f64 {
        let (_, text) = support::http_get(admin, "/metrics");
        text.lines()
            .filter(|line| {
                line.starts_with("strata_produce_acks_total{")
                    && line.contains("topic=\"durable\"")
                    && line.contains("replicas=\"1\"")
                    && line.contains(&format!("synced_replicas=\"{synced}\""))
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(acks("1"), 1.0, "the one synced produce");
    assert_eq!(acks("0"), 4.0, "three plain native produces and kcat's");
    // Kill -9 right after a synced ack: its records are there after the restart.
    let last = produce(&["--durability", "synced"], "last");
    assert_eq!(last["durability"]["leader_synced"], true, "{last}");
    node.kill();
    node.respawn();
    let read = node.cli(
        &[
            "consume",
            "durable",
            "--from-beginning",
            "--max-messages",
            "6",
        ],
        None,
    );
    assert_eq!(read, "first\nsecond\nthird\nsynced\nfrom-kafka\nlast\n");
}

/// KIP-951: a broker that does not lead a partition answers a Produce (10 and later) or a
/// Fetch (16 and later) for it NOT_LEADER_OR_FOLLOWER with the partition's current leader and
/// epoch, and that leader's Kafka endpoint, so the client goes there at once; older versions
/// get the error alone.
#[test]
fn a_broker_that_does_not_lead_names_the_leader_and_its_endpoint() {
    use strata_kafka::kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use strata_kafka::kafka_protocol::messages::{FetchRequest, FetchResponse};
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = kafka_cluster(&etcd, &dirs);
    wait_for("two brokers", || {
        kcat(&nodes[0].1, &["-L"], None).contains(" 2 brokers:")
    });
    nodes[0]
        .0
        .cli(&["topic", "create", "led", "--partitions", "1"], None);
    let leader = support::leaders(&nodes[0].0, "led")[0] as i32;
    let (other_kafka, leader_kafka) = if leader == 1 {
        (&nodes[1].1, &nodes[0].1)
    } else {
        (&nodes[0].1, &nodes[1].1)
    };
    wait_for("the other broker to know the leader", || {
        let (_, kafka) = &nodes[(2 - leader) as usize];
        kcat(kafka, &["-L", "-t", "led"], None).contains(&format!("leader {leader},"))
    });
    let leader_port: i32 = leader_kafka.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut stream = connect(other_kafka);
    let led = TopicName(StrBytes::from_static_str("led"));
    for version in [9i16, 10, 11] {
        let produce = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(led.clone())
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(kafka_batch())),
                    ]),
            ]);
        stream
            .write_all(&request_frame(ApiKey::Produce, version, 1, &produce))
            .unwrap();
        let mut answer = read_frame(&mut stream).unwrap();
        ResponseHeader::decode(
            &mut answer,
            ApiKey::Produce.response_header_version(version),
        )
        .unwrap();
        let response = ProduceResponse::decode(&mut answer, version).unwrap();
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!(partition.error_code, 6, "Produce v{version}");
        if version >= 10 {
            assert_eq!(
                partition.current_leader.leader_id.0, leader,
                "Produce v{version}"
            );
            assert!(partition.current_leader.leader_epoch >= 0);
            let endpoints: Vec<_> = response
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.port))
                .collect();
            assert_eq!(endpoints, vec![(leader, leader_port)], "Produce v{version}");
        } else {
            assert_eq!(partition.current_leader.leader_id.0, -1);
        }
    }
    for version in [15i16, 16, 18] {
        let fetch = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(led.clone())
                    .with_topic_id(topic_id_of(&mut stream, "led"))
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(0)
                            .with_partition_max_bytes(1 << 20),
                    ]),
            ]);
        stream
            .write_all(&request_frame(ApiKey::Fetch, version, 2, &fetch))
            .unwrap();
        let mut answer = read_frame(&mut stream).unwrap();
        ResponseHeader::decode(&mut answer, ApiKey::Fetch.response_header_version(version))
            .unwrap();
        let response = FetchResponse::decode(&mut answer, version).unwrap();
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, 6, "Fetch v{version}");
        if version >= 16 {
            assert_eq!(
                partition.current_leader.leader_id.0, leader,
                "Fetch v{version}"
            );
            let endpoints: Vec<_> = response
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.port))
                .collect();
            assert_eq!(endpoints, vec![(leader, leader_port)], "Fetch v{version}");
        } else {
            assert_eq!(partition.current_leader.leader_id.0, -1);
        }
    }
}

/// A topic's id, from a Metadata request on `stream`.
fn topic_id_of(stream: &mut TcpStream, topic: &str) -> uuid::Uuid {
    use strata_kafka::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let name = TopicName(StrBytes::from_string(topic.to_string()));
    let asked = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(name)),
    ]));
    stream
        .write_all(&request_frame(ApiKey::Metadata, 12, 3, &asked))
        .unwrap();
    let mut answer = read_frame(stream).unwrap();
    ResponseHeader::decode(&mut answer, ApiKey::Metadata.response_header_version(12)).unwrap();
    MetadataResponse::decode(&mut answer, 12).unwrap().topics[0].topic_id
}

/// One record in a Kafka record batch (magic 2), as a Kafka producer sends it.
fn kafka_batch() -> Bytes {
    use strata_kafka::kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from_static(b"hint")),
        headers: Default::default(),
    };
    let mut out = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut out, &[record], &options).unwrap();
    out.freeze()
}

/// DescribeGroups of a group nothing is known of: Dead with no error before version 6, and
/// GROUP_ID_NOT_FOUND from 6 (KIP-1043), as Kafka answers; a group with members is described
/// at 6 as before.
#[test]
fn describe_groups_6_answers_a_group_it_does_not_know_group_id_not_found() {
    use strata_kafka::kafka_protocol::messages::{
        DescribeGroupsRequest, DescribeGroupsResponse, GroupId,
    };
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = kafka_node(dir.path(), 1, &[]);
    node.cli(&["topic", "create", "grouped", "--partitions", "1"], None);
    kcat(&kafka, &["-P", "-t", "grouped"], Some(b"a\n"));
    // A group with a committed offset: known.
    kcat(
        &kafka,
        &[
            "-G",
            "known",
            "-o",
            "beginning",
            "-e",
            "-X",
            "enable.auto.commit=true",
            "grouped",
        ],
        None,
    );
    let mut stream = connect(&kafka);
    let mut describe = |version: i16, group: &'static str| {
        let request = DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_static_str(group))]);
        stream
            .write_all(&request_frame(ApiKey::DescribeGroups, version, 5, &request))
            .unwrap();
        let mut answer = read_frame(&mut stream).unwrap();
        ResponseHeader::decode(
            &mut answer,
            ApiKey::DescribeGroups.response_header_version(version),
        )
        .unwrap();
        let described = DescribeGroupsResponse::decode(&mut answer, version).unwrap();
        let group = &described.groups[0];
        (group.error_code, group.group_state.to_string())
    };
    assert_eq!(describe(5, "nobody"), (0, "Dead".to_string()));
    assert_eq!(describe(6, "nobody"), (69, "Dead".to_string()));
    let (error, state) = describe(6, "known");
    assert_eq!(error, 0);
    assert_ne!(state, "Dead");
}
