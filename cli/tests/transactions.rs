//! Kafka's transactions (KIP-98) through real clients: confluent-kafka (librdkafka) against
//! one node, each step checked for what consumers of both isolation levels read.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use strata_client::{Client, ClientConfig, Consumer, ConsumerConfig, IsolationLevel, SeekTo};
use support::{TestNode, free_base_port, metric_total, wait_for_at_most};

/// `transactions/confluent_txn.py MODE BOOTSTRAP TOPIC ARGS`: its JSON.
fn confluent(mode: &str, bootstrap: &str, topic: &str, args: &[&str]) -> Value {
    confluent_with(mode, bootstrap, topic, args, &[])
}

/// [`confluent`] with environment variables (`STRATA_SASL`: "user:password").
fn confluent_with(
    mode: &str,
    bootstrap: &str,
    topic: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let path = format!(
        "{}/tests/transactions/confluent_txn.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = Command::new("python3")
        .arg(path)
        .args([mode, bootstrap, topic])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("python3 with confluent-kafka (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "{mode}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{mode} printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn node_with_kafka(dir: &std::path::Path) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(dir, 2, &["--kafka-listen", &kafka]);
    (node, kafka)
}

/// An aborted transaction over two partitions, a committed one, and one left open: a
/// read_committed consumer sees only the committed records and stops below the open one (its
/// end, the LSO, is below the high watermark), a read_uncommitted one sees all of them; once
/// the third commits, read_committed sees it too. Markers are never handed to applications.
#[test]
fn read_committed_consumers_see_committed_transactions_only() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "txn", "--partitions", "2"], None);
    let seen = confluent("basic", &kafka, "txn", &[]);
    let committed = |p: usize| -> Vec<String> {
        (0..6)
            .filter(|i| i % 2 == p)
            .map(|i| format!("committed-{i}"))
            .collect()
    };
    let open = |p: usize| -> Vec<String> {
        (0..4)
            .filter(|i| i % 2 == p)
            .map(|i| format!("open-{i}"))
            .collect()
    };
    let aborted = |p: usize| -> Vec<String> {
        (0..5)
            .filter(|i| i % 2 == p)
            .map(|i| format!("aborted-{i}"))
            .collect()
    };
    for p in 0..2 {
        let key = p.to_string();
        assert_eq!(
            seen["while_open_committed"][&key],
            json!(committed(p)),
            "{seen}"
        );
        let everything = [aborted(p), committed(p), open(p)].concat();
        assert_eq!(seen["while_open_uncommitted"][&key], json!(everything));
        assert_eq!(seen["after_uncommitted"][&key], json!(everything));
        assert_eq!(
            seen["after_committed"][&key],
            json!([committed(p), open(p)].concat())
        );
        // Records and one marker per transaction: the open one's first record is the LSO.
        let aborted_n = aborted(p).len() as i64;
        let committed_n = committed(p).len() as i64;
        let lso = aborted_n + 1 + committed_n + 1;
        assert_eq!(
            seen["while_open_ends"]["committed"][&key],
            json!(lso),
            "{seen}"
        );
        assert_eq!(
            seen["while_open_ends"]["uncommitted"][&key],
            json!(lso + open(p).len() as i64)
        );
        // The same partitions through Strata's own consumer, which reads the Kafka producer's
        // batches itself and the markers as it reads its own: the same records, either way.
        assert_eq!(
            native_values(&node, "txn", p as u32, IsolationLevel::ReadCommitted),
            [committed(p), open(p)].concat()
        );
        assert_eq!(
            native_values(&node, "txn", p as u32, IsolationLevel::ReadUncommitted),
            everything
        );
    }
}

/// The values of a partition's records from its start to its high watermark, as Strata's own
/// consumer reads them at `isolation` (markers never among them).
fn native_values(
    node: &TestNode,
    topic: &str,
    partition: u32,
    isolation: IsolationLevel,
) -> Vec<String> {
    let end = support::describe(node, topic)["partitions"][partition as usize]["high_watermark"]
        .as_u64()
        .unwrap();
    support::runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let mut consumer = Consumer::new(
            client,
            ConsumerConfig {
                isolation,
                ..ConsumerConfig::default()
            },
        );
        consumer
            .assign(topic, &[partition], SeekTo::Beginning)
            .await
            .unwrap();
        let mut values = Vec::new();
        // Read to the high watermark: the last records may be a marker, which no poll returns.
        while consumer
            .position(topic, partition)
            .is_none_or(|at| at < end)
        {
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    values.push(String::from_utf8(record.value.to_vec()).unwrap());
                }
            }
        }
        values
    })
}

/// Two producers with one transactional id: the newer one's InitProducerId fences the older
/// (its open transaction aborted), whose next write fails fenced, and nothing of the older's
/// is ever read committed.
#[test]
fn a_newer_producer_fences_the_older_and_aborts_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "fenced", "--partitions", "2"], None);
    let seen = confluent("fence", &kafka, "fenced", &[]);
    assert_eq!(seen["old"], "_FENCED", "{seen}");
    assert_eq!(seen["old_fatal"], true);
    assert_eq!(seen["committed"], json!({"0": ["new-1"], "1": []}));
}

/// A producer that opens a transaction and goes away: the LSO stays at its first record
/// (read_committed consumers wait there) until the transaction's timeout, when the
/// coordinator aborts it and the LSO moves to the high watermark; its records are never read
/// committed. The same holds across a restart of the node in the middle. `/metrics` shows the
/// open transactions and the oldest one's age while it is open, and the abort after.
#[test]
fn a_transaction_left_open_is_aborted_at_its_timeout_and_the_lso_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let mut node = TestNode::start_with(
        dir.path(),
        2,
        &["--kafka-listen", &kafka, "--admin", &admin_address],
    );
    node.cli(&["topic", "create", "stuck", "--partitions", "2"], None);
    let java = support::AdminSurface::compile();
    // Long enough for the checks below on a loaded machine; the wait for the abort is as long.
    confluent("open", &kafka, "stuck", &["6", "txn-stuck", "30000"]);
    let ends = confluent("ends", &kafka, "stuck", &[]);
    assert_eq!(ends["committed"], json!({"0": 0, "1": 0}), "{ends}");
    assert_eq!(ends["uncommitted"], json!({"0": 3, "1": 3}), "{ends}");
    assert_eq!(metric_total(admin, "strata_open_transactions"), 2.0);
    assert!(metric_total(admin, "strata_oldest_open_transaction_seconds") > 0.0);
    // The operators' view: `strata txn`, and the Java client's Admin (`kafka-transactions.sh
    // list | describe | describe-producers`).
    let listed: Value =
        serde_json::from_str(&node.cli(&["txn", "list", "--format", "json"], None)).unwrap();
    assert_eq!(
        listed["transactions"][0]["transactional_id"], "txn-stuck",
        "{listed}"
    );
    assert_eq!(listed["transactions"][0]["state"], "Ongoing");
    let described: Value = serde_json::from_str(
        &node.cli(&["txn", "describe", "txn-stuck", "--format", "json"], None),
    )
    .unwrap();
    assert_eq!(
        described["partitions"],
        json!(["stuck-0", "stuck-1"]),
        "{described}"
    );
    assert_eq!(described["timeout_ms"], 30000);
    let listed = java.step(&kafka, &["list-transactions"]);
    let producer_id = listed["transactions"][0]["producer_id"].clone();
    assert_eq!(
        listed,
        json!({"transactions": [
            {"transactional_id": "txn-stuck", "producer_id": producer_id, "state": "Ongoing"}
        ]})
    );
    // Filtered by a pattern of ids (v2, KIP-1152) and by how long they have run (v1).
    let only = |pattern: &str, longer_ms: &str| {
        let listed = java.step(&kafka, &["list-transactions", pattern, longer_ms]);
        let ids = listed["transactions"].as_array().unwrap().iter();
        ids.map(|t| t["transactional_id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(only("txn-st.*", "0"), ["txn-stuck"]);
    assert!(only("txn-st", "0").is_empty(), "the whole id matches");
    assert!(only("other-.*", "0").is_empty());
    assert!(
        only("txn-.*", "3600000").is_empty(),
        "it has not run an hour"
    );
    let described = java.step(&kafka, &["describe-transactions", "txn-stuck"]);
    assert_eq!(
        described,
        json!({"txn-stuck": {
            "state": "Ongoing", "producer_id": producer_id, "producer_epoch": 0,
            "timeout_ms": 30000, "started": true, "partitions": ["stuck-0", "stuck-1"]
        }})
    );
    let producers = java.step(&kafka, &["describe-producers", "stuck", "1"]);
    assert_eq!(
        producers["producers"][0]["current_txn_start_offset"], 0,
        "{producers}"
    );
    // The coordinator's record and the partitions' open transactions survive a restart.
    node.restart();
    let ends = confluent("ends", &kafka, "stuck", &[]);
    assert_eq!(
        ends["committed"],
        json!({"0": 0, "1": 0}),
        "after a restart: {ends}"
    );
    wait_for_at_most(
        "the timeout to abort the transaction",
        Duration::from_secs(60),
        || {
            let ends = confluent("ends", &kafka, "stuck", &[]);
            // Three records and the abort marker on each partition.
            ends["committed"] == json!({"0": 4, "1": 4})
        },
    );
    let read = confluent("consume", &kafka, "stuck", &["committed"]);
    assert_eq!(read, json!({"0": [], "1": []}));
    assert_eq!(metric_total(admin, "strata_open_transactions"), 0.0);
    assert_eq!(
        metric_total(admin, "strata_transactions_aborted_by_timeout_total"),
        1.0
    );
    let described = java.step(&kafka, &["describe-transactions", "txn-stuck"]);
    assert_eq!(
        described["txn-stuck"]["state"], "CompleteAbort",
        "{described}"
    );
    assert_eq!(described["txn-stuck"]["partitions"], json!([]));
    let producers = java.step(&kafka, &["describe-producers", "stuck", "1"]);
    assert_eq!(
        producers["producers"][0]["current_txn_start_offset"],
        Value::Null,
        "{producers}"
    );
}

/// `transactions/eos.py ROLE BOOTSTRAP ARGS` as a child process.
fn eos(role: &str, bootstrap: &str, args: &[&str]) -> std::process::Child {
    let path = format!("{}/tests/transactions/eos.py", env!("CARGO_MANIFEST_DIR"));
    Command::new("python3")
        .arg(path)
        .args([role, bootstrap])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with confluent-kafka")
}

/// A finished `eos.py` child's JSON.
fn eos_output(child: std::process::Child, role: &str) -> Value {
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{role}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{role} printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// One exactly-once application of the fault test: its client, output topic, group,
/// transactional id and the prefix it puts on each value.
struct Pipeline {
    client: &'static str,
    out: &'static str,
    group: &'static str,
    txn_id: &'static str,
    prefix: &'static str,
}

const PIPELINES: [Pipeline; 2] = [
    Pipeline {
        client: "confluent-kafka",
        out: "eos-out",
        group: "eos-app",
        txn_id: "eos-txn",
        prefix: "T:",
    },
    Pipeline {
        client: "java",
        out: "eos-out-java",
        group: "eos-java",
        txn_id: "eos-java-txn",
        prefix: "J:",
    },
];

impl Pipeline {
    /// The application, reading `eos-in`, until it finds nothing new for `idle_s` seconds.
    fn start(&self, bootstrap: &str, java_classpath: &str, idle_s: &str) -> std::process::Child {
        let args = ["eos-in", self.out, self.group, self.txn_id, idle_s];
        if self.client == "java" {
            Command::new("java")
                .args(["-cp", java_classpath, "EosApp", bootstrap])
                .args(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("java (Debian's default-jdk-headless)")
        } else {
            eos("app", bootstrap, &args)
        }
    }
}

/// Records in a dumped topic.
fn total(records: &Value) -> usize {
    records
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_array().unwrap().len())
        .sum()
}

/// Exactly-once consume-transform-produce under faults, checked as Jepsen checks it. Three
/// brokers on etcd; a feeder writes keyed records to `eos-in` while two applications, one on
/// confluent-kafka and one on the Java client, each read it (read_committed, a consumer group
/// of its own), write each record transformed to the same partition of their output topic
/// and commit their offsets in the same transaction. For the run (`STRATA_EOS_SECONDS`,
/// default 60), the test kills -9 at random an application (it is started again, fencing its
/// previous self) or a broker (the leader of some partitions, and now and then a transaction
/// or group coordinator; started again two seconds later). At the end, for each application:
/// - every input record is in its output exactly once, each partition's output in its input's
///   order (so each key's order is kept);
/// - a read_committed reader that ran throughout saw, per partition, a prefix of the final
///   output: it never saw a record that was later absent (no aborted or lost reads).
#[test]
fn exactly_once_pipelines_survive_killed_apps_leaders_and_coordinators() {
    use rand::{Rng, SeedableRng};
    use strata_coordinator::testing::EtcdServer;
    let seconds: u64 = std::env::var("STRATA_EOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("STRATA_EOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fault schedule seed {seed} (STRATA_EOS_SEED replays it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let classes = tempfile::tempdir().unwrap();
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/transactions/EosApp.java"
    );
    let classpath = support::java_classpath(source, classes.path());
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut brokers: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let kafka = format!("127.0.0.1:{}", free_base_port(0));
            let id = (i + 1).to_string();
            let mut args = support::etcd_args(&etcd, &id);
            args.extend_from_slice(&["--kafka-listen", &kafka]);
            (TestNode::start_with(dir.path(), 1, &args), kafka)
        })
        .collect();
    let bootstrap = brokers
        .iter()
        .map(|(_, kafka)| kafka.as_str())
        .collect::<Vec<_>>()
        .join(",");
    for topic in ["eos-in", PIPELINES[0].out, PIPELINES[1].out] {
        let create = ["topic", "create", topic, "--partitions", "3"];
        brokers[0].0.cli(
            &[&create[..], &["--replication-factor", "3"]].concat(),
            None,
        );
    }
    let rate = 40;
    let count = (seconds * 3 / 4) * rate;
    let feeder = eos(
        "feed",
        &bootstrap,
        &["eos-in", &count.to_string(), &rate.to_string()],
    );
    let watching = (seconds + 120).to_string();
    let watchers: Vec<_> = PIPELINES
        .iter()
        .map(|pipeline| {
            let path = dirs[0].path().join(format!("{}.json", pipeline.out));
            let args = [pipeline.out, watching.as_str(), path.to_str().unwrap()];
            (eos("watch", &bootstrap, &args), path)
        })
        .collect();
    let mut apps: Vec<_> = PIPELINES
        .iter()
        .map(|pipeline| pipeline.start(&bootstrap, &classpath, "8"))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    let mut faults = Vec::new();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(rng.random_range(2000..4500)));
        let app = rng.random_range(0..2);
        if apps[app].try_wait().unwrap().is_some() || rng.random_bool(0.4) {
            let _ = apps[app].kill();
            let _ = apps[app].wait();
            faults.push(format!("{} app", PIPELINES[app].client));
            apps[app] = PIPELINES[app].start(&bootstrap, &classpath, "8");
        } else {
            let victim = rng.random_range(0..3);
            faults.push(format!("broker {}", victim + 1));
            brokers[victim].0.kill();
            std::thread::sleep(Duration::from_secs(2));
            brokers[victim].0.respawn();
        }
    }
    eprintln!("faults: {faults:?}");
    let fed = eos_output(feeder, "feed");
    assert_eq!(fed["acked"], json!(count), "{fed}");
    for app in &mut apps {
        let _ = app.kill();
        let _ = app.wait();
    }
    let dump = |topic: &str, isolation: &str| {
        let child = eos("dump", &bootstrap, &[topic, isolation]);
        eos_output(child, "dump")
    };
    let input = dump("eos-in", "read_uncommitted");
    assert_eq!(total(&input) as u64, count);
    for (pipeline, (mut watcher, watched)) in PIPELINES.iter().zip(watchers) {
        // The application runs until it finds nothing new; once more if that was early.
        let mut output = json!({});
        for _ in 0..5 {
            eos_output(pipeline.start(&bootstrap, &classpath, "8"), pipeline.client);
            output = dump(pipeline.out, "read_committed");
            if total(&output) >= total(&input) {
                break;
            }
        }
        let _ = watcher.kill();
        let _ = watcher.wait();
        let seen: Value = serde_json::from_slice(&std::fs::read(&watched).unwrap()).unwrap();
        check_exactly_once(pipeline, &input, &output, &seen, &faults);
    }
}

/// The fault test's checks of one application's output against the input, and of what its
/// read_committed watcher saw against the output.
fn check_exactly_once(
    pipeline: &Pipeline,
    input: &Value,
    output: &Value,
    seen: &Value,
    faults: &[String],
) {
    let client = pipeline.client;
    for partition in ["0", "1", "2"] {
        let expected: Vec<Value> = input[partition]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| {
                let value = format!("{}{}", pipeline.prefix, record[1].as_str().unwrap());
                json!([record[0], value])
            })
            .collect();
        let produced = output[partition].as_array().unwrap();
        // Where the output first leaves the input, and what it holds from there.
        let parted = produced
            .iter()
            .zip(&expected)
            .position(|(out, wanted)| out != wanted)
            .unwrap_or(produced.len().min(expected.len()));
        let around = |records: &[Value]| {
            records[parted.min(records.len())..(parted + 3).min(records.len())].to_vec()
        };
        assert_eq!(
            produced.len(),
            expected.len(),
            "{client}, partition {partition}: every input record once in the output; they part \
             at {parted}: output {:?}, input {:?} (faults {faults:?})",
            around(produced),
            around(&expected)
        );
        assert_eq!(
            produced, &expected,
            "{client}, partition {partition}: in input order"
        );
        let seen = seen[partition].as_array().unwrap();
        let values: Vec<&Value> = produced.iter().map(|record| &record[1]).collect();
        assert!(
            seen.len() <= values.len() && seen.iter().zip(&values).all(|(a, b)| a == *b),
            "{client}, partition {partition}: the read_committed reader saw what the output \
             does not hold (an aborted or lost read); faults {faults:?}"
        );
    }
}

/// Every value of `topic` read from the start by a consumer of `isolation`, until a poll
/// brings nothing for a second.
async fn read_native(
    client: &std::sync::Arc<strata_client::Client>,
    topic: &str,
    isolation: strata_client::IsolationLevel,
) -> Vec<String> {
    use strata_client::{Consumer, ConsumerConfig, SeekTo};
    let config = ConsumerConfig {
        isolation,
        max_wait: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(client.clone(), config);
    consumer
        .assign(topic, &[], SeekTo::Beginning)
        .await
        .unwrap();
    let mut values = Vec::new();
    let mut idle = 0;
    while idle < 5 {
        let batches = consumer.poll().await.unwrap();
        if batches.is_empty() {
            idle += 1;
        }
        for batch in batches {
            idle = 0;
            values.extend(
                batch
                    .records()
                    .map(|record| String::from_utf8(record.value.to_vec()).unwrap()),
            );
        }
    }
    values.sort();
    values
}

/// The Rust client's transactions on Strata's own protocol: an aborted transaction and a
/// committed one with a group's offsets; a read_committed consumer sees the committed records
/// only, a read_uncommitted one both (never a marker); the offsets become the group's at the
/// commit, not before; a second producer with the same id fences the first.
#[test]
fn the_rust_client_commits_aborts_and_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 2);
    node.cli(
        &["topic", "create", "native-txn", "--partitions", "2"],
        None,
    );
    support::runtime().block_on(native_commit_abort_fence(&node.bootstrap(), "native-txn"));
}

/// [`the_rust_client_commits_aborts_and_is_fenced`] on three brokers and etcd: the partitions'
/// leaders, the transaction's coordinator and the group's are spread over the brokers, so
/// markers and settled offsets go between them over QUIC.
#[test]
fn the_rust_client_commits_aborts_and_is_fenced_on_three_brokers() {
    use strata_coordinator::testing::EtcdServer;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let brokers: Vec<TestNode> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            TestNode::start_with(
                dir.path(),
                1,
                &support::etcd_args(&etcd, &(i + 1).to_string()),
            )
        })
        .collect();
    brokers[0].cli(
        &[
            "topic",
            "create",
            "native-txn",
            "--partitions",
            "2",
            "--replication-factor",
            "3",
        ],
        None,
    );
    let described = brokers[0].cli(
        &["topic", "describe", "native-txn", "--format", "json"],
        None,
    );
    let described: Value = serde_json::from_str(&described).unwrap();
    let leaders: std::collections::BTreeSet<u64> = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|partition| partition["leader"].as_u64().unwrap())
        .collect();
    assert_eq!(
        leaders.len(),
        2,
        "the two partitions lead on two brokers: {described}"
    );
    support::runtime().block_on(native_commit_abort_fence(
        &brokers[2].bootstrap(),
        "native-txn",
    ));
}

/// An aborted transaction over two partitions of `topic` and a committed one with a group's
/// offsets; a read_committed consumer sees the committed records only, a read_uncommitted one
/// both (never a marker); the offsets become the group's at the commit, not before; a second
/// producer with the same id fences the first.
async fn native_commit_abort_fence(bootstrap: &str, topic: &str) {
    use strata_client::{
        Client, ClientConfig, IsolationLevel, Producer, ProducerConfig, ProducerRecord,
    };
    let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
    let config = ProducerConfig {
        transactional_id: Some("native".into()),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), config.clone());
    let record = |value: &str, partition: u32| {
        let mut record = ProducerRecord::new(topic, None, value.to_string());
        record.partition = Some(partition);
        record
    };
    assert!(producer.begin().is_err(), "init_transactions comes first");
    producer.init_transactions().await.unwrap();
    producer.begin().unwrap();
    for i in 0..4 {
        producer
            .send(record(&format!("aborted-{i}"), i % 2))
            .await
            .unwrap();
    }
    producer.abort().await.unwrap();
    producer.begin().unwrap();
    for i in 0..4 {
        producer
            .send(record(&format!("committed-{i}"), i % 2))
            .await
            .unwrap();
    }
    producer
        .send_offsets("native-app", &[(topic.into(), 0, 42)])
        .await
        .unwrap();
    let before = client.committed_offsets("native-app").await.unwrap();
    assert!(
        before.iter().all(|c| c.offset != 42),
        "pending until the commit: {before:?}"
    );
    producer.commit().await.unwrap();
    // The commit is answered once decided; the offsets settle with the markers after it.
    let settled = async {
        loop {
            let after = client.committed_offsets("native-app").await.unwrap();
            if after
                .iter()
                .any(|c| c.topic == topic && c.partition == 0 && c.offset == 42)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), settled)
        .await
        .expect("the committed transaction's offsets become the group's");
    let committed = read_native(&client, topic, IsolationLevel::ReadCommitted).await;
    assert_eq!(
        committed,
        ["committed-0", "committed-1", "committed-2", "committed-3"]
    );
    let everything = read_native(&client, topic, IsolationLevel::ReadUncommitted).await;
    assert_eq!(everything.len(), 8, "{everything:?}");
    // A second producer of the id fences the first.
    producer.begin().unwrap();
    producer.send(record("zombie", 0)).await.unwrap();
    producer.flush().await.unwrap();
    let newer = Producer::new(client.clone(), config);
    newer.init_transactions().await.unwrap();
    let refused = producer.commit().await.unwrap_err();
    assert_eq!(
        refused.code(),
        Some(strata_client::ErrorCode::ProducerFenced),
        "{refused}"
    );
    let committed = read_native(&client, topic, IsolationLevel::ReadCommitted).await;
    assert!(!committed.contains(&"zombie".to_string()), "{committed:?}");
}

/// kafkajs's `producer.transaction()`: one transaction aborted, one committed with a group's
/// offsets (`sendOffsets`); a read_committed kafkajs consumer reads only the committed records,
/// a read_uncommitted one reads both, and the group's offsets are the committed transaction's.
#[test]
fn kafkajs_transactions_commit_and_abort() {
    let modules = support::kafkajs_modules();
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "jstxn", "--partitions", "2"], None);
    let script = r#"
const { Kafka, logLevel } = require('kafkajs')
const kafka = new Kafka({ clientId: 'strata-txn', brokers: [process.env.STRATA_KAFKA], logLevel: logLevel.ERROR })
async function read(readUncommitted, expected) {
  const consumer = kafka.consumer({ groupId: `reader-${readUncommitted}-${Date.now()}`, readUncommitted })
  await consumer.connect()
  await consumer.subscribe({ topic: 'jstxn', fromBeginning: true })
  const seen = []
  await new Promise((resolve) => {
    const done = setTimeout(resolve, 8000)
    consumer.run({ eachMessage: async ({ message }) => {
      seen.push(message.value.toString())
      if (seen.length === expected) { clearTimeout(done); setTimeout(resolve, 1000) }
    } })
  })
  await consumer.disconnect()
  return seen.sort()
}
async function main() {
  const producer = kafka.producer({ transactionalId: 'js-txn', maxInFlightRequests: 1, idempotent: true })
  await producer.connect()
  const aborted = await producer.transaction()
  await aborted.send({ topic: 'jstxn', messages: [0, 1, 2, 3].map((i) => ({ value: `aborted-${i}`, partition: i % 2 })) })
  await aborted.abort()
  const committed = await producer.transaction()
  await committed.send({ topic: 'jstxn', messages: [0, 1, 2, 3].map((i) => ({ value: `committed-${i}`, partition: i % 2 })) })
  await committed.sendOffsets({ consumerGroupId: 'js-app', topics: [{ topic: 'jstxn', partitions: [{ partition: 0, offset: '7' }] }] })
  await committed.commit()
  await producer.disconnect()
  const readCommitted = await read(false, 4)
  const readUncommitted = await read(true, 8)
  const admin = kafka.admin()
  await admin.connect()
  let offsets = []
  for (let i = 0; i < 50; i++) {
    offsets = await admin.fetchOffsets({ groupId: 'js-app', topics: ['jstxn'] })
    if (offsets[0].partitions.some((p) => p.offset === '7')) break
    await new Promise((r) => setTimeout(r, 100))
  }
  await admin.disconnect()
  console.log(JSON.stringify({ readCommitted, readUncommitted,
    offsets: offsets[0].partitions.map((p) => [p.partition, p.offset]).sort() }))
}
main().catch((error) => { console.error(error); process.exit(1) })
"#;
    let output = Command::new("node")
        .args(["-e", script])
        .env("STRATA_KAFKA", &kafka)
        .env("NODE_PATH", &modules)
        .env("KAFKAJS_NO_PARTITIONER_WARNING", "1")
        .output()
        .expect("node (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "kafkajs: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    let committed: Vec<String> = (0..4).map(|i| format!("committed-{i}")).collect();
    assert_eq!(seen["readCommitted"], json!(committed), "{seen}");
    let mut everything: Vec<String> = (0..4).map(|i| format!("aborted-{i}")).collect();
    everything.extend(committed);
    assert_eq!(seen["readUncommitted"], json!(everything), "{seen}");
    assert_eq!(seen["offsets"], json!([[0, "7"], [1, "-1"]]), "{seen}");
}

/// A node with `--authorizer acl` started by `start` (given those flags and the environment
/// for its bootstrap user; the plaintext native port stays a local admin port, its anonymous
/// clients super users, for the test's CLI), with the SCRAM user alice allowed to write the
/// topic `paid`.
fn alices_node(start: impl FnOnce(&[&str], &[(&str, &str)]) -> TestNode) -> TestNode {
    let node = start(
        &[
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin;User:ANONYMOUS",
        ],
        &[("STRATA_BOOTSTRAP_USER", "admin:admin-password")],
    );
    node.cli(&["topic", "create", "paid"], None);
    node.cli(
        &["user", "create", "alice", "--password-stdin"],
        Some(b"alice-password\n"),
    );
    allow_alice(&node, &["write", "--topic", "paid"]);
    node
}

/// `strata acl add` for alice: OPERATION and the resource flags.
fn allow_alice(node: &TestNode, args: &[&str]) {
    let principal = ["acl", "add", "--principal", "User:alice", "--operation"];
    node.cli(&[&principal[..], args].concat(), None);
}

/// Kafka's ACLs on transactions, with `--authorizer acl`: a SCRAM user needs Write on its
/// transactional id to initialise (TRANSACTIONAL_ID_AUTHORIZATION_FAILED before), Read on the
/// group and on the topic to send its offsets (GROUP_AUTHORIZATION_FAILED, then
/// TOPIC_AUTHORIZATION_FAILED before), and then commits; the operators' view lists the id.
#[test]
fn transactions_need_their_acls() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let listener = format!("sasl_plaintext://{kafka}");
    let node = alices_node(|security, env| {
        let args = [&["--kafka-listen", &listener][..], security].concat();
        TestNode::start_with_env(dir.path(), 1, &args, env)
    });
    let allow = |args: &[&str]| allow_alice(&node, args);
    let alice = [("STRATA_SASL", "alice:alice-password")];
    let attempt = || confluent_with("secured", &kafka, "paid", &["alice-1", "alice-app"], &alice);
    let seen = attempt();
    assert_eq!(
        seen,
        json!({"init": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"})
    );
    allow(&["write", "--transactional-id", "alice-", "--prefixed"]);
    allow(&["describe", "--transactional-id", "alice-", "--prefixed"]);
    let seen = attempt();
    assert_eq!(
        seen,
        json!({"init": null, "offsets": "GROUP_AUTHORIZATION_FAILED"})
    );
    allow(&["read", "--group", "alice-app"]);
    // Committing offsets of a topic needs Read on it, as a plain commit does.
    let seen = attempt();
    assert_eq!(
        seen,
        json!({"init": null, "offsets": "TOPIC_AUTHORIZATION_FAILED"})
    );
    allow(&["read", "--topic", "paid"]);
    let seen = attempt();
    assert_eq!(seen, json!({"init": null, "offsets": null, "commit": null}));
    let listed = node.cli(&["txn", "list"], None);
    assert!(listed.contains("alice-1"), "{listed}");
}

/// The same ACLs on Strata's own protocol, through the Rust client as a SCRAM user on a
/// `sasl_plaintext` native listener: InitProducerId needs Write on the transactional id,
/// AddOffsetsToTxn Read on the group, TxnOffsetCommit Write on the id (checked first, as Kafka
/// does) and Read on the group and the topic; with all of them the transaction commits.
#[test]
fn native_transactions_need_their_acls() {
    use strata_client::{
        Client, ClientConfig, ErrorCode, Producer, ProducerConfig, ProducerRecord, SaslCredentials,
        Security,
    };
    use strata_wire::protocol::{
        OffsetCommitPartition, OffsetCommitTopic, Request, TxnOffsetCommitRequest, TxnProducer,
    };
    let dir = tempfile::tempdir().unwrap();
    let secured = format!("127.0.0.1:{}", free_base_port(1));
    let node = alices_node(|security, env| {
        let listeners = format!("plaintext,sasl_plaintext://{secured}");
        let args = [&["--sasl-mechanisms", "SCRAM-SHA-512"][..], security].concat();
        TestNode::start_listening(dir.path(), 1, &listeners, &args, env)
    });
    let allow = |args: &[&str]| allow_alice(&node, args);
    support::runtime().block_on(async {
        let alice = Client::connect(ClientConfig {
            security: Security {
                tls: None,
                sasl: Some(SaslCredentials {
                    mechanism: "SCRAM-SHA-512".into(),
                    user: "alice".into(),
                    password: "alice-password".into(),
                }),
            },
            ..ClientConfig::new(&secured)
        })
        .await
        .unwrap();
        let producer = Producer::new(
            alice.clone(),
            ProducerConfig {
                transactional_id: Some("alice-1".into()),
                ..ProducerConfig::default()
            },
        );
        let code = |result: Result<(), strata_client::ClientError>| result.unwrap_err().code();
        assert_eq!(
            code(producer.init_transactions().await),
            Some(ErrorCode::TransactionalIdAuthorizationFailed)
        );
        allow(&["write", "--transactional-id", "alice-", "--prefixed"]);
        allow(&["describe", "--transactional-id", "alice-", "--prefixed"]);
        producer.init_transactions().await.unwrap();
        let offsets = [("paid".to_string(), 0, 1)];
        let attempt = || async {
            producer.begin().unwrap();
            producer
                .send(ProducerRecord::new("paid", None, "paid-for".to_string()))
                .await
                .unwrap()
                .await
                .unwrap();
            let sent = producer.send_offsets("alice-app", &offsets).await;
            if sent.is_err() {
                producer.abort().await.unwrap();
            }
            sent
        };
        assert_eq!(
            code(attempt().await),
            Some(ErrorCode::GroupAuthorizationFailed)
        );
        allow(&["read", "--group", "alice-app"]);
        assert_eq!(
            code(attempt().await),
            Some(ErrorCode::TopicAuthorizationFailed)
        );
        allow(&["read", "--topic", "paid"]);
        attempt().await.unwrap();
        producer.commit().await.unwrap();
        // TxnOffsetCommit for an id alice may not write is refused before anything else.
        let request = Request::TxnOffsetCommit(TxnOffsetCommitRequest {
            producer: TxnProducer {
                transactional_id: "bob-1".into(),
                producer_id: 0,
                producer_epoch: 0,
            },
            group: "alice-app".into(),
            member_id: String::new(),
            generation: -1,
            topics: vec![OffsetCommitTopic {
                name: "paid".into(),
                partitions: vec![OffsetCommitPartition {
                    partition: 0,
                    offset: 1,
                    metadata: String::new(),
                }],
            }],
        });
        let refused = alice.request(&secured, request).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(ErrorCode::TransactionalIdAuthorizationFailed),
            "{refused}"
        );
    });
    let listed = node.cli(&["txn", "list"], None);
    assert!(listed.contains("alice-1"), "{listed}");
}

/// Transactions on a compacted topic through a Kafka client: once the cleaner has run, a
/// read_uncommitted consumer no longer sees the aborted transaction's records, committed ones
/// are compacted like any (a key written again keeps its last value), and both isolation
/// levels read the same compacted partition.
#[test]
fn the_cleaner_removes_aborted_transactions_from_a_compacted_topic() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(
        dir.path(),
        1,
        &["--kafka-listen", &kafka, "--cleaner-backoff-ms", "100"],
    );
    node.cli(
        &[
            "topic",
            "create",
            "txn-compacted",
            "--partitions",
            "2",
            "--config",
            "cleanup.policy=compact",
            "--config",
            "min.cleanable.dirty.ratio=0.01",
            "--config",
            "delete.retention.ms=100",
        ],
        None,
    );
    confluent("compacted", &kafka, "txn-compacted", &[]);
    let everything =
        json!({"0": ["aborted-a", "aborted-b", "committed-a", "committed-c", "plain-c"], "1": []});
    assert_eq!(
        confluent("consume", &kafka, "txn-compacted", &["uncommitted"]),
        everything,
        "before a clean, read_uncommitted reads the aborted records too"
    );
    // The active segment is never cleaned: rolled once idle for half a second, it is.
    node.cli(
        &[
            "topic",
            "alter",
            "txn-compacted",
            "--config",
            "segment.ms=500",
        ],
        None,
    );
    let cleaned = json!({"0": ["committed-a", "plain-c"], "1": []});
    let mut seen = Value::Null;
    for _ in 0..10 {
        seen = confluent("consume", &kafka, "txn-compacted", &["uncommitted"]);
        if seen == cleaned {
            break;
        }
    }
    assert_eq!(seen, cleaned, "the cleaner ran");
    assert_eq!(
        confluent("consume", &kafka, "txn-compacted", &["committed"]),
        cleaned
    );
}
