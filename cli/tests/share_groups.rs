//! Share groups (KIP-932: ShareGroupHeartbeat, ShareFetch, ShareAcknowledge) through the Java
//! client's KafkaShareConsumer (`share_groups/ShareConsumers.java`, kafka-clients 4.3) against
//! one node: records of one partition shared by several consumers, each delivered once; explicit
//! RELEASE, ACCEPT and REJECT; the records of a killed consumer delivered again when their
//! acquisition lock lapses; a record archived at the group's delivery count limit. Each group is
//! configured first through the Admin (IncrementalAlterConfigs on the GROUP resource), so its
//! consumers start at the partition's earliest offset.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::{TestNode, free_base_port, java_classpath};

/// How long the Java program's consuming steps run before giving up (its TIMEOUT_S).
const STEP_SECONDS: &str = "120";
/// How long the test waits for a Java run: the step's own limit, a JVM's start and its close.
const RUN_PATIENCE: Duration = Duration::from_secs(180);
/// The acquisition lock of the groups whose tests see it lapse or do not care.
const LOCK_MS: &str = "2000";

/// A node with a Kafka listener on a free port: (node, "127.0.0.1:port").
fn node_with_kafka(dir: &std::path::Path) -> (TestNode, String) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let node = TestNode::start_with(dir, 2, &["--kafka-listen", &kafka]);
    (node, kafka)
}

/// A node with a Kafka listener and an admin endpoint on free ports: (node, "127.0.0.1:port",
/// admin port).
fn node_with_kafka_and_admin(dir: &std::path::Path) -> (TestNode, String, u16) {
    let kafka = format!("127.0.0.1:{}", free_base_port(0));
    let admin = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin}");
    let node = TestNode::start_with(
        dir,
        2,
        &["--kafka-listen", &kafka, "--admin", &admin_address],
    );
    (node, kafka, admin)
}

/// `share_groups/ShareConsumers.java`, compiled into a directory of its own, run against one
/// bootstrap address.
struct ShareConsumers {
    classpath: String,
    bootstrap: String,
    _classes: tempfile::TempDir,
}

impl ShareConsumers {
    fn compile(bootstrap: &str) -> ShareConsumers {
        let classes = tempfile::tempdir().unwrap();
        let source = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/share_groups/ShareConsumers.java"
        );
        ShareConsumers {
            classpath: java_classpath(source, classes.path()),
            bootstrap: bootstrap.to_string(),
            _classes: classes,
        }
    }

    /// The program running `args`, its lines collected as it prints them.
    fn spawn(&self, args: &[&str]) -> Running {
        let mut command = Command::new("java");
        command
            .args(["-cp", &self.classpath, "ShareConsumers", &self.bootstrap])
            .args(args);
        Running::spawn(command, format!("ShareConsumers {}", args.join(" ")))
    }

    /// Runs `args` to its end: its lines. Panics, showing them, unless it exits 0.
    fn run(&self, args: &[&str]) -> Vec<String> {
        self.spawn(args).finish()
    }

    /// Sets `pairs` (KEY=VALUE) on `group`'s configuration.
    fn configure(&self, group: &str, pairs: &[&str]) {
        let args = [&["configure", group][..], pairs].concat();
        let lines = self.run(&args);
        assert!(
            lines.iter().any(|line| line.starts_with("CONFIGURED ")),
            "{}",
            lines.join("\n")
        );
    }

    /// Produces `specs` (a value, or PREFIX*N for PREFIX-0..PREFIX-(N-1)) to partition 0 of
    /// `topic`, in order: (offset, value) of each.
    fn produce(&self, topic: &str, specs: &[&str]) -> Vec<(i64, String)> {
        let args = [&["produce", topic][..], specs].concat();
        self.run(&args)
            .iter()
            .filter_map(|line| line.strip_prefix("PRODUCED "))
            .map(|rest| {
                let mut fields = rest.splitn(3, ' ');
                assert_eq!(fields.next(), Some("0"), "{rest}");
                let offset = fields.next().unwrap().parse().unwrap();
                (offset, fields.next().unwrap_or_default().to_string())
            })
            .collect()
    }
}

/// A thread appending each line of `stream` to `into`.
fn collect(
    stream: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            into.lock().unwrap().push(line);
        }
    })
}

/// A running `ShareConsumers` process and what it printed so far.
struct Running {
    what: String,
    child: Option<Child>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Running {
    /// Starts `command`, collecting what it prints.
    fn spawn(mut command: Command, what: String) -> Running {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("starting {what}: {error}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Running {
            what,
            child: Some(child),
            stdout,
            stderr,
            readers,
        }
    }

    fn lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// What it printed, stdout then the end of stderr, for a failure message.
    fn transcript(&self) -> String {
        let stderr = self.stderr.lock().unwrap();
        let tail = &stderr[stderr.len().saturating_sub(40)..];
        format!(
            "{}\n--- stdout\n{}\n--- stderr (last {} lines)\n{}",
            self.what,
            self.lines().join("\n"),
            tail.len(),
            tail.join("\n")
        )
    }

    /// Waits until its lines satisfy `check`; panics if it exits first or takes too long.
    fn wait_for(&mut self, what: &str, check: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + RUN_PATIENCE;
        loop {
            if check(&self.lines()) {
                return;
            }
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            if let Some(status) = exited {
                self.join_readers();
                assert!(
                    check(&self.lines()),
                    "exited ({status}) before {what}:\n{}",
                    self.transcript()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.transcript()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for it to exit: its lines. Panics, showing them, unless it exits 0 in time.
    fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + RUN_PATIENCE;
        let status = loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                self.kill_child();
                panic!(
                    "ran for more than {RUN_PATIENCE:?}; killed:\n{}",
                    self.transcript()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.child = None;
        self.join_readers();
        assert!(status.success(), "exited {status}:\n{}", self.transcript());
        self.lines()
    }

    /// SIGKILL, as a crashed consumer: no close, no acknowledgement. Its lines.
    fn kill(mut self) -> Vec<String> {
        self.kill_child();
        self.join_readers();
        self.lines()
    }

    fn kill_child(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill_child();
    }
}

/// One record as a consumer got it: `<KIND> <consumer> <partition> <offset> <count> <value>`.
#[derive(Debug, Clone, PartialEq)]
struct Delivery {
    /// DELIVERED (implicit mode), ACCEPTED, RELEASED, REJECTED or ACQUIRED (never acknowledged).
    kind: String,
    consumer: u32,
    partition: i32,
    offset: i64,
    /// The broker's delivery count.
    count: i32,
    value: String,
}

const DELIVERY_KINDS: [&str; 5] = ["DELIVERED", "ACCEPTED", "RELEASED", "REJECTED", "ACQUIRED"];

fn deliveries(lines: &[String]) -> Vec<Delivery> {
    lines
        .iter()
        .filter(|line| {
            DELIVERY_KINDS
                .iter()
                .any(|kind| line.split(' ').next() == Some(*kind))
        })
        .map(|line| {
            let fields: Vec<&str> = line.splitn(6, ' ').collect();
            assert_eq!(fields.len(), 6, "a delivery line: {line}");
            Delivery {
                kind: fields[0].to_string(),
                consumer: fields[1].parse().unwrap(),
                partition: fields[2].parse().unwrap(),
                offset: fields[3].parse().unwrap(),
                count: fields[4].parse().unwrap(),
                value: fields[5].to_string(),
            }
        })
        .collect()
}

/// Each offset's deliveries in the order they came, as (kind, delivery count).
fn by_offset(deliveries: &[Delivery]) -> BTreeMap<i64, Vec<(String, i32)>> {
    let mut offsets: BTreeMap<i64, Vec<(String, i32)>> = BTreeMap::new();
    for delivery in deliveries {
        offsets
            .entry(delivery.offset)
            .or_default()
            .push((delivery.kind.clone(), delivery.count));
    }
    offsets
}

/// `kind` at delivery count `count`, for comparing with [`by_offset`].
fn seen(kind: &str, count: i32) -> (String, i32) {
    (kind.to_string(), count)
}

/// Asserts each delivery's value is the one produced at its offset, all on partition 0.
fn check_values(deliveries: &[Delivery], produced: &[(i64, String)], transcript: &str) {
    let values: BTreeMap<i64, &str> = produced
        .iter()
        .map(|(offset, value)| (*offset, value.as_str()))
        .collect();
    for delivery in deliveries {
        assert_eq!(delivery.partition, 0, "{delivery:?}\n{transcript}");
        assert_eq!(
            values.get(&delivery.offset).copied(),
            Some(delivery.value.as_str()),
            "a delivery's value is the one produced at its offset: {delivery:?}\n{transcript}"
        );
    }
}

/// Three share consumers in one group on one partition, in implicit mode (each poll accepts
/// what the previous one delivered, a commit before closing accepts the last): together they get every record
/// exactly once, each at delivery count 1 (the lock is long, so none lapses on a slow machine).
/// One consumer may take them all: nothing is asserted about the split. Once all three closed,
/// a new member of the group gets nothing of them again, only a record produced later.
#[test]
fn three_share_consumers_of_one_partition_get_each_record_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "shared", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "shared-group",
        &[
            "share.auto.offset.reset=earliest",
            "share.record.lock.duration.ms=15000",
        ],
    );
    let produced = java.produce("shared", &["r*200"]);
    assert_eq!(produced.len(), 200);
    let count = produced.len().to_string();
    let lines = java.run(&[
        "implicit",
        "shared-group",
        "shared",
        "3",
        &count,
        STEP_SECONDS,
    ]);
    let transcript = lines.join("\n");
    let delivered = deliveries(&lines);
    check_values(&delivered, &produced, &transcript);
    assert!(
        delivered
            .iter()
            .all(|d| d.kind == "DELIVERED" && d.count == 1),
        "every delivery a first one: {transcript}"
    );
    let offsets = by_offset(&delivered);
    let not_once: Vec<_> = offsets
        .iter()
        .filter(|(_, deliveries)| deliveries.len() != 1)
        .collect();
    assert!(
        not_once.is_empty(),
        "offsets delivered more than once: {not_once:?}\n{transcript}"
    );
    let expected: Vec<i64> = produced.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(
        offsets.keys().copied().collect::<Vec<_>>(),
        expected,
        "every produced offset delivered: {transcript}"
    );
    assert_eq!(delivered.len(), produced.len(), "{transcript}");
    let per_consumer = delivered.iter().fold(BTreeMap::new(), |mut counts, d| {
        *counts.entry(d.consumer).or_insert(0) += 1;
        counts
    });
    eprintln!("deliveries per consumer: {per_consumer:?}");
    for consumer in 0..3 {
        assert!(
            lines.contains(&format!("CLOSED {consumer}")),
            "consumer {consumer} closed: {transcript}"
        );
    }

    let sentinel = java.produce("shared", &["end"]);
    let lines = java.run(&["drain", "shared-group", "shared", "end", STEP_SECONDS]);
    assert_eq!(
        deliveries(&lines),
        vec![Delivery {
            kind: "DELIVERED".into(),
            consumer: 0,
            partition: 0,
            offset: sentinel[0].0,
            count: 1,
            value: "end".into(),
        }],
        "after the consumers closed, only the later record: {}",
        lines.join("\n")
    );
}

/// One consumer in explicit mode RELEASEs each record the first time it sees it and ACCEPTs it
/// when it comes again (delivery count 2), REJECTs a poison record: the poison record is never
/// delivered again, not before a record produced once it was rejected has been accepted (it too
/// released first, then accepted). Each commitSync after a poll answers without an error.
#[test]
fn explicit_acknowledgements_release_accept_and_reject_records() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "acks", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "acks-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
        ],
    );
    let mut produced = java.produce("acks", &["a*5", "poison", "b*5"]);
    let poison = produced[5].0;
    assert_eq!(produced[5].1, "poison");
    let mut consumer = java.spawn(&["explicit", "acks-group", "acks", "end", STEP_SECONDS]);
    consumer.wait_for("the poison record rejected", |lines| {
        lines.iter().any(|line| line.starts_with("REJECTED "))
    });
    let sentinel = java.produce("acks", &["end"]);
    produced.extend(sentinel.iter().cloned());
    let lines = consumer.finish();
    let transcript = lines.join("\n");
    let delivered = deliveries(&lines);
    check_values(&delivered, &produced, &transcript);
    let offsets = by_offset(&delivered);
    assert_eq!(
        offsets.get(&poison),
        Some(&vec![seen("REJECTED", 1)]),
        "the poison record rejected at its first delivery and never delivered again: {transcript}"
    );
    for (offset, value) in produced.iter().filter(|(offset, _)| *offset != poison) {
        assert_eq!(
            offsets.get(offset),
            Some(&vec![seen("RELEASED", 1), seen("ACCEPTED", 2)]),
            "{value} at {offset}: released at its first delivery, accepted at its second, then \
             never delivered again: {transcript}"
        );
    }
    let commits: Vec<&String> = lines
        .iter()
        .filter(|line| line.starts_with("COMMIT "))
        .collect();
    assert!(
        commits.iter().any(|line| line.ends_with(" acks-0 OK")),
        "commitSync answered for the partition: {transcript}"
    );
    assert!(
        commits
            .iter()
            .all(|line| line.ends_with(" OK") || line.ends_with(" NONE")),
        "commitSync answered without errors: {transcript}"
    );
    assert!(
        lines.contains(&"CLOSED 0".to_string()),
        "closed: {transcript}"
    );
}

/// A consumer acquires records and is killed (SIGKILL: no acknowledgement, no close, its member
/// left to time out): another consumer of the group gets those records again once their
/// acquisition lock lapses, at delivery count 2, and accepts every record once.
#[test]
fn records_a_killed_consumer_held_are_delivered_again_after_their_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "abandoned", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "abandoned-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
        ],
    );
    let produced = java.produce("abandoned", &["a*5"]);
    let mut holder = java.spawn(&["hold", "abandoned-group", "abandoned", STEP_SECONDS]);
    holder.wait_for("the first consumer holding records", |lines| {
        lines.iter().any(|line| line.starts_with("HOLDING "))
    });
    let held_lines = holder.kill();
    let held = deliveries(&held_lines);
    let held_transcript = held_lines.join("\n");
    check_values(&held, &produced, &held_transcript);
    assert!(
        !held.is_empty() && held.iter().all(|d| d.kind == "ACQUIRED" && d.count == 1),
        "the first consumer acquired records at their first delivery: {held_transcript}"
    );

    let count = produced.len().to_string();
    let lines = java.run(&["take", "abandoned-group", "abandoned", &count, STEP_SECONDS]);
    let transcript = format!(
        "held by the killed consumer:\n{held_transcript}\ntaken:\n{}",
        lines.join("\n")
    );
    let taken = deliveries(&lines);
    check_values(&taken, &produced, &transcript);
    let offsets = by_offset(&taken);
    for (offset, _) in &produced {
        let deliveries = offsets.get(offset).cloned().unwrap_or_default();
        assert!(
            deliveries.len() == 1 && deliveries[0].0 == "ACCEPTED",
            "offset {offset} accepted once by the second consumer: {transcript}"
        );
        // Records the killed consumer's client fetched ahead, never handed to it, lapse too.
        assert!(
            [1, 2].contains(&deliveries[0].1),
            "offset {offset} at delivery count 1 or 2: {transcript}"
        );
    }
    for record in &held {
        assert_eq!(
            offsets.get(&record.offset),
            Some(&vec![seen("ACCEPTED", 2)]),
            "offset {} held by the killed consumer came again at delivery count 2: {transcript}",
            record.offset
        );
    }
}

/// KIP-1222's RENEW through the Java client (ShareAcknowledge v2): a consumer holding records
/// for 5 s under a 2 s lock, renewing them every 700 ms, keeps them: a second consumer of the
/// group polling all along never gets them, and the holder accepts each at its first delivery.
/// Without the renewals the locks would lapse at 2 s and the second consumer take the records.
#[test]
fn renewed_locks_keep_records_with_their_holder_past_the_lock_duration() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "renewed", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "renewed-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
        ],
    );
    let produced = java.produce("renewed", &["r*5"]);
    let lines = java.run(&[
        "renew",
        "renewed-group",
        "renewed",
        "5000",
        "700",
        STEP_SECONDS,
    ]);
    let transcript = lines.join("\n");
    assert!(lines.iter().any(|line| line == "DONE"), "{transcript}");
    let renewals = lines
        .iter()
        .filter(|line| line.starts_with("RENEWED "))
        .count();
    assert!(renewals >= 5, "renewed every 700 ms for 5 s: {transcript}");
    assert!(
        !lines
            .iter()
            .any(|line| line.starts_with("COMMIT") && line.contains(" ERROR ")),
        "every renewal and acceptance committed: {transcript}"
    );
    let seen = deliveries(&lines);
    check_values(&seen, &produced, &transcript);
    let held: Vec<i64> = seen
        .iter()
        .filter(|d| d.kind == "ACQUIRED")
        .map(|d| d.offset)
        .collect();
    assert!(!held.is_empty(), "{transcript}");
    let offsets = by_offset(&seen);
    for offset in &held {
        let holder: Vec<_> = seen
            .iter()
            .filter(|d| d.offset == *offset && d.kind == "ACCEPTED")
            .map(|d| (d.consumer, d.count))
            .collect();
        assert_eq!(
            holder,
            vec![(0, 1)],
            "offset {offset} accepted once, by its holder, at its first delivery \
             ({:?}): {transcript}",
            offsets.get(offset)
        );
    }
}

/// With the group's `share.delivery.count.limit` at 2, a record its consumer releases at every
/// delivery is delivered twice and then archived: never again, while the records around it are
/// accepted at their first delivery and a record produced after its second release is still
/// delivered (the consumer goes on).
#[test]
fn a_record_released_at_every_delivery_is_archived_at_the_delivery_count_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "limited", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "limited-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
            "share.delivery.count.limit=2",
        ],
    );
    let mut produced = java.produce("limited", &["cold-a", "hot", "cold-b"]);
    let hot = produced[1].0;
    let mut consumer = java.spawn(&[
        "limit",
        "limited-group",
        "limited",
        "hot",
        "end",
        STEP_SECONDS,
    ]);
    consumer.wait_for("the hot record released twice", |lines| {
        deliveries(lines)
            .iter()
            .filter(|d| d.offset == hot && d.kind == "RELEASED")
            .count()
            >= 2
    });
    let sentinel = java.produce("limited", &["end"]);
    produced.extend(sentinel.iter().cloned());
    let lines = consumer.finish();
    let transcript = lines.join("\n");
    let delivered = deliveries(&lines);
    check_values(&delivered, &produced, &transcript);
    let offsets = by_offset(&delivered);
    assert_eq!(
        offsets.get(&hot),
        Some(&vec![seen("RELEASED", 1), seen("RELEASED", 2)]),
        "the hot record delivered exactly twice, then archived: {transcript}"
    );
    for (offset, value) in produced.iter().filter(|(offset, _)| *offset != hot) {
        assert_eq!(
            offsets.get(offset),
            Some(&vec![seen("ACCEPTED", 1)]),
            "{value} at {offset} accepted at its first delivery: {transcript}"
        );
    }
}

/// With `errors.deadletterqueue.topic.name` set on the group, a rejected record and a record
/// out of deliveries are written to the dead-letter topic (read back with kcat): the record's
/// own key and value, with headers naming the group, source topic, partition and offset, its
/// delivery count and why. Records accepted are not. The leader's `/metrics` count them.
#[test]
fn rejected_and_exhausted_records_are_written_to_the_dead_letter_topic() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka, admin) = node_with_kafka_and_admin(dir.path());
    node.cli(&["topic", "create", "orders", "--partitions", "1"], None);
    node.cli(
        &["topic", "create", "orders-dlq", "--partitions", "1"],
        None,
    );
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "dlq-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
            "share.delivery.count.limit=2",
            "errors.deadletterqueue.topic.name=orders-dlq",
        ],
    );
    let first = java.produce("orders", &["fine", "poison"]);
    let mut consumer = java.spawn(&["explicit", "dlq-group", "orders", "end", STEP_SECONDS]);
    consumer.wait_for("the poison record rejected", |lines| {
        lines.iter().any(|line| line.starts_with("REJECTED "))
    });
    java.produce("orders", &["end"]);
    consumer.finish();
    let second = java.produce("orders", &["hot"]);
    let hot = second[0].0;
    let mut consumer = java.spawn(&["limit", "dlq-group", "orders", "hot", "end2", STEP_SECONDS]);
    consumer.wait_for("the hot record released twice", |lines| {
        deliveries(lines)
            .iter()
            .filter(|d| d.offset == hot && d.kind == "RELEASED")
            .count()
            >= 2
    });
    java.produce("orders", &["end2"]);
    consumer.finish();

    let expected = [
        (first[1].0, "poison", "1", "rejected"),
        (second[0].0, "hot", "2", "delivery-limit"),
    ];
    let deadline = Instant::now() + RUN_PATIENCE;
    let letters = loop {
        let output = support::kcat_command()
            .args(["-C", "-b", &kafka, "-t", "orders-dlq", "-e", "-q"])
            .args(["-f", "%s|%h\n"])
            .output()
            .expect("kcat (Debian's kcat)");
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let letters: Vec<String> = text.lines().map(str::to_string).collect();
        if letters.len() >= expected.len() || Instant::now() > deadline {
            break letters;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(letters.len(), expected.len(), "{letters:?}");
    for ((offset, value, deliveries, reason), letter) in expected.iter().zip(&letters) {
        let (got_value, headers) = letter.split_once('|').unwrap();
        assert_eq!(got_value, *value, "{letters:?}");
        for header in [
            "strata.dlq.group=dlq-group".to_string(),
            "strata.dlq.topic=orders".to_string(),
            "strata.dlq.partition=0".to_string(),
            format!("strata.dlq.offset={offset}"),
            format!("strata.dlq.delivery.count={deliveries}"),
            format!("strata.dlq.reason={reason}"),
        ] {
            assert!(
                headers.split(',').any(|h| h == header),
                "{header} in {letter}"
            );
        }
    }
    // The leader's metrics of the share-partition: every record done, two dead letters.
    let metric = |name: &str| support::metric_total(admin, name);
    assert_eq!(metric("strata_share_dead_letters_total"), 2.0);
    assert_eq!(
        metric("strata_share_start_offset"),
        5.0,
        "all five records done"
    );
    assert_eq!(metric("strata_share_lag"), 0.0);
    assert_eq!(metric("strata_share_in_flight"), 0.0);
    assert!(metric("strata_share_redeliveries_total") >= 2.0);
}

/// Three brokers on etcd, each with a Kafka listener, and the bootstrap list of those.
fn three_brokers(
    etcd: &strata_coordinator::testing::EtcdServer,
    dirs: &[tempfile::TempDir],
) -> (Vec<(TestNode, String)>, String) {
    let brokers: Vec<(TestNode, String)> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let kafka = format!("127.0.0.1:{}", free_base_port(0));
            let mut args = support::etcd_args(etcd, &id);
            args.extend_from_slice(&["--kafka-listen", &kafka]);
            (TestNode::start_with(dir.path(), 1, &args), kafka)
        })
        .collect();
    let bootstrap = brokers
        .iter()
        .map(|(_, kafka)| kafka.as_str())
        .collect::<Vec<_>>()
        .join(",");
    (brokers, bootstrap)
}

/// A share consumer taking every record of "durable" (RF 3) while the partition's leader is
/// killed: `take` starts it (a running `take` of ShareConsumers.java or librdkafka_take.py).
/// Once it committed a few times the leader gets SIGKILL; then every produced record must
/// have been accepted, and none delivered again after a commit confirmed its acceptance.
fn kill_the_leader_under(take: impl FnOnce(&ShareConsumers, &str) -> Running) {
    const RECORDS: usize = 1500;
    let etcd = strata_coordinator::testing::EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (mut brokers, bootstrap) = three_brokers(&etcd, &dirs);
    brokers[0].0.cli(
        &[
            "topic",
            "create",
            "durable",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
        ],
        None,
    );
    let java = ShareConsumers::compile(&bootstrap);
    java.configure(
        "durable-group",
        &[
            "share.auto.offset.reset=earliest",
            &format!("share.record.lock.duration.ms={LOCK_MS}"),
        ],
    );
    let produced = java.produce("durable", &[&format!("r*{RECORDS}")]);
    assert_eq!(produced.len(), RECORDS);
    let mut consumer = take(&java, &RECORDS.to_string());
    consumer.wait_for("a few hundred records accepted and committed", |lines| {
        lines
            .iter()
            .filter(|line| line.starts_with("COMMIT "))
            .count()
            >= 6
    });
    let leader = support::leaders(&brokers[0].0, "durable")[0];
    brokers[(leader - 1) as usize].0.kill();
    let lines = consumer.finish();
    let transcript = lines.join("\n");

    // Offsets whose acceptance a commit confirmed, and every delivery after that.
    let mut confirmed = std::collections::BTreeSet::new();
    let mut pending = Vec::new();
    let mut accepted = std::collections::BTreeSet::new();
    for line in &lines {
        if let Some(delivery) = deliveries(std::slice::from_ref(line)).first() {
            assert!(
                !confirmed.contains(&delivery.offset),
                "offset {} delivered again after its acceptance was committed: {transcript}",
                delivery.offset
            );
            pending.push(delivery.offset);
            accepted.insert(delivery.offset);
        } else if line.starts_with("COMMIT ") {
            if line.ends_with(" OK") {
                confirmed.extend(pending.drain(..));
            } else {
                pending.clear();
            }
        }
    }
    let expected: std::collections::BTreeSet<i64> =
        produced.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(accepted, expected, "every record accepted: {transcript}");
    assert!(
        confirmed.len() > 100,
        "commits were confirmed before and after the kill: {transcript}"
    );
}

/// Three brokers, the partition replicated on all three; Java's share consumer accepts
/// records, committing after each poll, while the partition's leader is killed (SIGKILL). The
/// new leader carries on from the stored share-partition: no record is lost (every offset is
/// accepted), and none whose acceptance a commit confirmed is delivered again.
#[test]
fn a_killed_leader_loses_no_record_and_no_acknowledgement() {
    kill_the_leader_under(|java, records| {
        java.spawn(&[
            "take",
            "durable-group",
            "durable",
            records,
            STEP_SECONDS,
            "50",
        ])
    });
}

/// [`a_killed_leader_loses_no_record_and_no_acknowledgement`] with librdkafka's share
/// consumer (confluent-kafka 2.16's `ShareConsumer`, librdkafka 2.16) in place of Java's.
#[test]
fn a_killed_leader_loses_nothing_under_librdkafkas_share_consumer() {
    kill_the_leader_under(|java, records| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/share_groups/librdkafka_take.py"
        );
        let mut command = Command::new("python3");
        command.args([
            script,
            &java.bootstrap,
            "durable-group",
            "durable",
            records,
            STEP_SECONDS,
            "50",
        ]);
        Running::spawn(command, "librdkafka_take.py".to_string())
    });
}

/// Key order (`strata.share.key.ordering=true`): eight consumers share one partition of 100
/// keys. Each key's records are processed in offset order and never two at once (the broker
/// hands out no record while an earlier one of its key is acquired or waiting), and the eight
/// finish sooner than one consumer does alone: the group scales past the partition count.
#[test]
fn key_order_holds_each_key_to_one_record_at_a_time_and_scales_past_one_consumer() {
    const RECORDS: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "keyed", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    for group in ["keyed-one", "keyed-eight"] {
        java.configure(
            group,
            &[
                "share.auto.offset.reset=earliest",
                "share.record.lock.duration.ms=15000",
                "strata.share.key.ordering=true",
            ],
        );
    }
    let produced = java.run(&["produce-keyed", "keyed", &RECORDS.to_string(), "100"]);
    assert_eq!(
        produced
            .iter()
            .filter(|l| l.starts_with("PRODUCED "))
            .count(),
        RECORDS
    );
    let elapsed = |lines: &[String]| -> u64 {
        lines
            .iter()
            .find_map(|line| line.strip_prefix("ELAPSED-MS "))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no ELAPSED-MS: {}", lines.join("\n")))
    };
    let run = |group: &str, consumers: &str| {
        java.run(&[
            "keyed",
            group,
            "keyed",
            consumers,
            &RECORDS.to_string(),
            "5",
            STEP_SECONDS,
        ])
    };
    let alone = run("keyed-one", "1");
    let eight = run("keyed-eight", "8");
    let transcript = eight.join("\n");
    // (key) → [(offset, start, end)] in start order.
    let mut starts: BTreeMap<(String, String), u128> = BTreeMap::new();
    let mut spans: BTreeMap<String, Vec<(i64, u128, u128)>> = BTreeMap::new();
    for line in &eight {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["START", consumer, offset, _key, nanos] => {
                starts.insert(
                    (consumer.to_string(), offset.to_string()),
                    nanos.parse().unwrap(),
                );
            }
            ["END", consumer, offset, key, nanos] => {
                let start = starts[&(consumer.to_string(), offset.to_string())];
                spans.entry(key.to_string()).or_default().push((
                    offset.parse().unwrap(),
                    start,
                    nanos.parse().unwrap(),
                ));
            }
            _ => {}
        }
    }
    let processed: usize = spans.values().map(Vec::len).sum();
    assert!(processed >= RECORDS, "every record processed: {transcript}");
    assert!(spans.len() > 90, "the keys processed: {transcript}");
    let consumers_used: std::collections::BTreeSet<&str> = eight
        .iter()
        .filter_map(|line| line.strip_prefix("START "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    assert!(
        consumers_used.len() > 1,
        "more than one consumer worked: {transcript}"
    );
    for (key, mut records) in spans {
        records.sort_by_key(|(_, start, _)| *start);
        for pair in records.windows(2) {
            let ((before, _, before_end), (after, after_start, _)) = (pair[0], pair[1]);
            assert!(
                before < after,
                "key {key}: offset {after} processed after {before}, out of order: {transcript}"
            );
            assert!(
                before_end <= after_start,
                "key {key}: offsets {before} and {after} processed at once: {transcript}"
            );
        }
    }
    let (one, many) = (elapsed(&alone), elapsed(&eight));
    eprintln!("{RECORDS} records of 5 ms each: one consumer {one} ms, eight {many} ms");
    assert!(
        many < one,
        "eight consumers ({many} ms) finish before one alone ({one} ms)"
    );
}

/// Strata's redelivery backoff and delivery delay, end to end: with
/// `strata.share.redelivery.backoff.ms` at 1 s, a released record comes back no sooner than
/// 1 s after its release; with `strata.share.delayed.delivery`, a record produced with
/// `strata.deliver.after.ms` is not delivered before that time. (That it holds back no record after it is checked at the core, with time
/// as an argument: here the consumer's start may come after the time.)
#[test]
fn released_records_wait_out_their_backoff_and_delayed_records_their_time() {
    const BACKOFF_MS: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "paced", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    java.configure(
        "paced-group",
        &[
            "share.auto.offset.reset=earliest",
            "share.record.lock.duration.ms=15000",
            &format!("strata.share.redelivery.backoff.ms={BACKOFF_MS}"),
            "strata.share.delayed.delivery=true",
        ],
    );
    let delayed = java.run(&["produce-delayed", "paced", "later", "5000"]);
    let after: u64 = delayed
        .iter()
        .find_map(|line| line.strip_prefix("AFTER "))
        .and_then(|ms| ms.parse().ok())
        .unwrap();
    let now = java.produce("paced", &["now-a", "now-b"]);
    let lines = java.run(&["timed", "paced-group", "paced", "3", STEP_SECONDS]);
    let transcript = lines.join("\n");
    // offset → [(kind, deliveries, unix ms)]
    let mut seen: BTreeMap<i64, Vec<(String, i32, u64)>> = BTreeMap::new();
    for line in &lines {
        if let ["AT", kind, offset, count, at] = line.split(' ').collect::<Vec<_>>().as_slice() {
            seen.entry(offset.parse().unwrap()).or_default().push((
                kind.to_string(),
                count.parse().unwrap(),
                at.parse().unwrap(),
            ));
        }
    }
    for (offset, _) in &now {
        let times = &seen[offset];
        assert_eq!(times.len(), 2, "released once, accepted once: {transcript}");
        assert_eq!((times[0].1, times[1].1), (1, 2), "{transcript}");
        assert!(
            times[1].2 >= times[0].2 + BACKOFF_MS,
            "offset {offset} came back {} ms after its release, within its backoff: {transcript}",
            times[1].2 - times[0].2
        );
    }
    let later = delayed
        .iter()
        .find_map(|line| line.strip_prefix("PRODUCED 0 "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|offset| offset.parse::<i64>().ok())
        .unwrap();
    let first_delivery = seen[&later][0].2;
    assert!(
        first_delivery >= after,
        "the delayed record came {} ms before its time: {transcript}",
        after - first_delivery
    );
}

/// The `LISTED ...` lines of a `list-groups` run: `<share|all> <group> type=<t> state=<s>`.
fn listed_groups(java: &ShareConsumers) -> Vec<String> {
    java.run(&["list-groups"])
        .iter()
        .filter_map(|line| line.strip_prefix("LISTED "))
        .map(str::to_string)
        .collect()
}

/// A share-partition's offsets as the Admin described them: (start, leader epoch, lag), each
/// `-` where the broker answered none.
type Described = BTreeMap<String, (String, String, String)>;

/// `describe-offsets` of `group` (every share-partition, or `partition` of `topic`).
fn described_offsets(java: &ShareConsumers, group: &str, named: Option<(&str, &str)>) -> Described {
    let mut args = vec!["describe-offsets", group];
    if let Some((topic, partition)) = named {
        args.extend([topic, partition]);
    }
    let lines = java.run(&args);
    let offsets: Described = lines
        .iter()
        .filter_map(|line| line.strip_prefix("OFFSET "))
        .map(|rest| {
            let fields: Vec<&str> = rest.split(' ').collect();
            assert_eq!(fields.len(), 5, "an offset line: {rest}");
            let field = |at: usize, name: &str| {
                fields[at]
                    .strip_prefix(name)
                    .unwrap_or_else(|| panic!("{name} in {rest}"))
                    .to_string()
            };
            (
                fields[1].to_string(),
                (field(2, "start="), field(3, "epoch="), field(4, "lag=")),
            )
        })
        .collect();
    assert!(
        lines.contains(&format!("OFFSETS {}", offsets.len())),
        "{}",
        lines.join("\n")
    );
    offsets
}

/// Runs an Admin step that answers one line starting with `prefix`: that line.
fn admin_step(java: &ShareConsumers, args: &[&str], prefix: &str) -> String {
    let lines = java.run(args);
    lines
        .iter()
        .find(|line| line.starts_with(prefix))
        .cloned()
        .unwrap_or_else(|| panic!("no {prefix} line: {}", lines.join("\n")))
}

/// Share groups through the Java client's Admin (ListGroups v5, DescribeShareGroupOffsets v1,
/// AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups): a group whose consumer
/// accepted records and closed is listed as a share group, Empty, its start offset past what
/// was accepted and its lag what was produced since; while a member holds records it is
/// Stable and no offset change or delete is allowed (NON_EMPTY_GROUP); once the member is gone,
/// the start offset is altered and a new consumer starts there; deleting the offsets makes
/// the next consumer start afresh (the group's `share.auto.offset.reset`), and deleting the
/// group takes it off the list.
#[test]
fn the_admin_lists_share_groups_and_describes_alters_and_deletes_their_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "managed", "--partitions", "1"], None);
    let java = ShareConsumers::compile(&kafka);
    let group = "managed-group";
    java.configure(
        group,
        &[
            "share.auto.offset.reset=earliest",
            "share.record.lock.duration.ms=15000",
            "share.heartbeat.interval.ms=1000",
            "share.session.timeout.ms=5000",
        ],
    );
    let first = java.produce("managed", &["a*10"]);
    assert_eq!(first.last().map(|(offset, _)| *offset), Some(9));
    let taken = java.run(&["take", group, "managed", "10", STEP_SECONDS]);
    assert!(
        taken.contains(&"CLOSED 1".to_string()),
        "{}",
        taken.join("\n")
    );

    let listed = listed_groups(&java);
    for scope in ["share", "all"] {
        let line = format!("{scope} {group} type=Share state=Empty");
        assert!(listed.contains(&line), "{line} in {listed:?}");
    }
    let offsets = described_offsets(&java, group, None);
    let (start, epoch, lag) = &offsets["managed-0"];
    assert_eq!((start.as_str(), lag.as_str()), ("10", "0"), "{offsets:?}");
    assert!(epoch.parse::<i32>().is_ok_and(|e| e >= 0), "{offsets:?}");
    java.produce("managed", &["b*5"]);
    let offsets = described_offsets(&java, group, None);
    assert_eq!(
        (
            offsets["managed-0"].0.as_str(),
            offsets["managed-0"].2.as_str()
        ),
        ("10", "5"),
        "the lag counts what was produced since: {offsets:?}"
    );

    // A member holding records: the group is Stable and refuses every change.
    let mut holder = java.spawn(&["hold", group, "managed", STEP_SECONDS]);
    holder.wait_for("a member holding records", |lines| {
        lines.iter().any(|line| line.starts_with("HOLDING "))
    });
    let listed = listed_groups(&java);
    let stable = format!("share {group} type=Share state=Stable");
    assert!(listed.contains(&stable), "{stable} in {listed:?}");
    for (args, prefix) in [
        (vec!["delete-group", group], "DELETE-GROUP-FAILED "),
        (
            vec!["alter-offsets", group, "managed", "0", "12"],
            "ALTER-FAILED ",
        ),
        (
            vec!["delete-offsets", group, "managed"],
            "DELETE-OFFSETS-FAILED ",
        ),
    ] {
        let line = admin_step(&java, &args, prefix);
        assert!(
            line.contains("GroupNotEmptyException"),
            "refused while the group has a member: {line}"
        );
    }
    holder.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    let empty = format!("share {group} type=Share state=Empty");
    while !listed_groups(&java).contains(&empty) {
        assert!(Instant::now() < deadline, "the killed member never expired");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Its start moved: a new consumer starts there, the records before it done.
    let line = admin_step(
        &java,
        &["alter-offsets", group, "managed", "0", "12"],
        "ALTER",
    );
    assert_eq!(line, format!("ALTERED {group} managed-0"));
    let offsets = described_offsets(&java, group, None);
    assert_eq!(
        (
            offsets["managed-0"].0.as_str(),
            offsets["managed-0"].2.as_str()
        ),
        ("12", "3"),
        "{offsets:?}"
    );
    let lines = java.run(&["take", group, "managed", "3", STEP_SECONDS]);
    let taken: Vec<(i64, i32)> = deliveries(&lines)
        .iter()
        .map(|delivery| (delivery.offset, delivery.count))
        .collect();
    assert_eq!(
        taken,
        [(12, 1), (13, 1), (14, 1)],
        "the new consumer starts at the altered offset: {}",
        lines.join("\n")
    );

    // Its offsets deleted: gone from the list, and the next consumer starts afresh.
    let line = admin_step(&java, &["delete-offsets", group, "managed"], "DELETE");
    assert_eq!(line, format!("DELETED-OFFSETS {group} managed"));
    assert!(described_offsets(&java, group, None).is_empty());
    let named = described_offsets(&java, group, Some(("managed", "0")));
    assert_eq!(named["managed-0"].0, "-", "no start offset: {named:?}");
    let listed = listed_groups(&java);
    assert!(
        !listed
            .iter()
            .any(|line| line.contains(&format!(" {group} "))),
        "{listed:?}"
    );
    let lines = java.run(&["take", group, "managed", "15", STEP_SECONDS]);
    let mut taken: Vec<(i64, i32)> = deliveries(&lines)
        .iter()
        .map(|delivery| (delivery.offset, delivery.count))
        .collect();
    taken.sort_unstable();
    assert_eq!(
        taken,
        (0..15).map(|offset| (offset, 1)).collect::<Vec<_>>(),
        "after its offsets were deleted, every record from the earliest, each a first \
         delivery: {}",
        lines.join("\n")
    );

    // The group deleted: not listed, no offsets.
    let line = admin_step(&java, &["delete-group", group], "DELETE");
    assert_eq!(line, format!("DELETED-GROUP {group}"));
    let listed = listed_groups(&java);
    assert!(
        !listed
            .iter()
            .any(|line| line.contains(&format!(" {group} "))),
        "{listed:?}"
    );
    assert!(described_offsets(&java, group, None).is_empty());
}

/// FindCoordinator of a share-partition key (key type 2, `group:topicId:partition`, version 6,
/// as Kafka's brokers send it) answers the partition's leader, which keeps the
/// share-partition's state; version 4 cannot ask for it, and a key of another form is
/// INVALID_REQUEST.
#[test]
fn find_coordinator_of_a_share_partition_key_answers_the_partitions_leader() {
    use base64::Engine;
    use strata_kafka::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use strata_kafka::kafka_protocol::messages::{
        ApiKey, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse,
        TopicName,
    };
    use strata_kafka::kafka_protocol::protocol::StrBytes;
    let dir = tempfile::tempdir().unwrap();
    let (node, kafka) = node_with_kafka(dir.path());
    node.cli(&["topic", "create", "located", "--partitions", "2"], None);
    let metadata: MetadataResponse = support::raw_request(
        &kafka,
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str("located")))),
        ])),
    );
    let topic_id = metadata.topics[0].topic_id;
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic_id.as_bytes());
    let find = |version: i16, keys: &[String]| -> FindCoordinatorResponse {
        let request = FindCoordinatorRequest::default()
            .with_key_type(2)
            .with_coordinator_keys(
                keys.iter()
                    .map(|key| StrBytes::from_string(key.clone()))
                    .collect(),
            );
        support::raw_request(&kafka, ApiKey::FindCoordinator, version, &request)
    };
    let keys = [
        format!("queue:{encoded}:1"),
        format!("queue:{encoded}"),
        "queue:not-an-id:1".to_string(),
    ];
    let found = find(6, &keys);
    let answers: Vec<(String, i16, i32, i32)> = found
        .coordinators
        .iter()
        .map(|c| (c.key.to_string(), c.error_code, c.node_id.0, c.port))
        .collect();
    let port: i32 = kafka.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(answers[0], (keys[0].clone(), 0, 1, port), "{answers:?}");
    for (key, error, node_id, _) in &answers[1..] {
        assert_eq!((*error, *node_id), (42, -1), "{key}: INVALID_REQUEST");
    }
    let old = find(4, &keys[..1]);
    assert_eq!(
        old.coordinators[0].error_code, 42,
        "version 4 has no share keys"
    );
}
