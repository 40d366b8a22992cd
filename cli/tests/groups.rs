//! Consumer groups against real `strata serve` processes: splitting a topic, cooperative
//! rebalances with a member killed -9, at-most-once, zombie fencing, and offsets that survive a
//! whole-cluster restart (etcd included).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_client::{
    Client, ClientConfig, GroupConfig, GroupConsumer, OffsetReset, Producer, ProducerConfig,
    ProducerRecord, RebalanceEvent,
};
use strata_coordinator::testing::EtcdServer;
use strata_wire::protocol::{
    ErrorCode, HeartbeatRequest, JoinGroupRequest, OffsetCommitPartition, OffsetCommitRequest,
    OffsetCommitTopic, Request, Response,
};
use support::{TestNode, etcd_args, etcd_nodes, runtime, strata, wait_for_at_most};

/// A record as the tests track it: (partition, offset).
type Seen = (u32, u64);

async fn produce_values(client: &Arc<Client>, topic: &str, values: impl Iterator<Item = u64>) {
    let producer = Producer::new(
        client.clone(),
        ProducerConfig {
            acks: -1,
            ..ProducerConfig::default()
        },
    );
    let mut acks = Vec::new();
    for value in values {
        let record = ProducerRecord::new(
            topic,
            Some(Bytes::from(value.to_string())),
            value.to_string(),
        );
        acks.push(producer.send(record).await.unwrap());
    }
    producer.flush().await.unwrap();
    for ack in acks {
        ack.await.unwrap();
    }
}

fn group_config(group: &str) -> GroupConfig {
    let mut config = GroupConfig::new(group);
    config.session_timeout = Duration::from_secs(3);
    config.auto_commit_interval = Some(Duration::from_millis(200));
    config.auto_offset_reset = OffsetReset::Earliest;
    config.consumer.max_wait = Duration::from_millis(100);
    config
}

/// Produces `values` (keyed by themselves) to `topic` through a client of its own.
fn produce_to(node: &TestNode, topic: &str, values: std::ops::Range<u64>) {
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        produce_values(&client, topic, values).await;
    });
}

/// `strata group describe GROUP --format json`.
fn described(node: &TestNode, group: &str) -> serde_json::Value {
    let text = node.cli(&["group", "describe", group, "--format", "json"], None);
    serde_json::from_str(&text).unwrap()
}

fn wait_for_a_member(node: &TestNode, group: &str) {
    wait_for_at_most("a member joins", Duration::from_secs(20), || {
        !described(node, group)["members"]
            .as_array()
            .unwrap()
            .is_empty()
    });
}

/// Polls `consumer` until `until` says stop, recording every record it returned.
async fn consume_into(
    consumer: &mut GroupConsumer,
    seen: &Mutex<Vec<Seen>>,
    mut until: impl FnMut() -> bool,
) {
    while !until() {
        let batches = consumer.poll().await.unwrap();
        let mut seen = seen.lock().unwrap();
        for batch in &batches {
            seen.extend(batch.records().map(|r| (batch.partition, r.offset)));
        }
    }
}

#[test]
fn members_split_the_partitions_and_every_group_sees_every_record() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "orders", "--partitions", "12"], None);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let mut members = Vec::new();
        for _ in 0..3 {
            members.push(
                GroupConsumer::subscribe(
                    client.clone(),
                    vec!["orders".into()],
                    group_config("billing"),
                )
                .await
                .unwrap(),
            );
        }
        // Let the group settle: 12 partitions over 3 members, 4 each.
        settle(&mut members, 12).await;
        let all: BTreeSet<_> = members.iter().flat_map(|m| m.assignment()).collect();
        assert_eq!(all.len(), 12, "every partition has exactly one owner");

        const RECORDS: u64 = 6000;
        produce_values(&client, "orders", 0..RECORDS).await;

        let seen: Vec<Arc<Mutex<Vec<Seen>>>> = (0..3).map(|_| Arc::default()).collect();
        let total = || {
            seen.iter()
                .map(|s| s.lock().unwrap().len() as u64)
                .sum::<u64>()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while total() < RECORDS {
            assert!(
                Instant::now() < deadline,
                "consumed {} of {RECORDS}",
                total()
            );
            for (member, seen) in members.iter_mut().zip(&seen) {
                let batches = member.poll().await.unwrap();
                let mut seen = seen.lock().unwrap();
                for batch in &batches {
                    seen.extend(batch.records().map(|r| (batch.partition, r.offset)));
                }
            }
        }
        let mut owners: HashMap<Seen, usize> = HashMap::new();
        for (index, seen) in seen.iter().enumerate() {
            for record in seen.lock().unwrap().iter() {
                assert!(
                    owners.insert(*record, index).is_none(),
                    "{record:?} was delivered twice within one group"
                );
            }
        }
        assert_eq!(owners.len() as u64, RECORDS);
        for (index, member) in members.iter().enumerate() {
            let partitions: BTreeSet<u32> = member.assignment().iter().map(|(_, p)| *p).collect();
            assert!(
                owners
                    .iter()
                    .filter(|(_, owner)| **owner == index)
                    .all(|((p, _), _)| partitions.contains(p)),
                "member {index} consumed only its own partitions"
            );
        }
        for member in members {
            member.close().await.unwrap();
        }

        // Another group reads the same records, all of them.
        let mut other =
            GroupConsumer::subscribe(client.clone(), vec!["orders".into()], group_config("audit"))
                .await
                .unwrap();
        let seen = Mutex::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        consume_into(&mut other, &seen, || {
            assert!(Instant::now() < deadline, "the second group stalled");
            seen.lock().unwrap().len() as u64 >= RECORDS
        })
        .await;
        let distinct: BTreeSet<Seen> = seen.lock().unwrap().iter().copied().collect();
        assert_eq!(distinct.len() as u64, RECORDS);
        other.close().await.unwrap();

        // Both groups are listed with their committed offsets.
        let groups: Vec<String> = client
            .list_groups()
            .await
            .unwrap()
            .into_iter()
            .map(|g| g.group)
            .collect();
        assert!(
            groups.contains(&"billing".to_string()) && groups.contains(&"audit".to_string()),
            "{groups:?}"
        );
    });
    let described: serde_json::Value = serde_json::from_str(
        &node.cli(&["group", "describe", "billing", "--format", "json"], None),
    )
    .unwrap();
    let offsets = described["offsets"].as_array().unwrap();
    assert_eq!(offsets.len(), 12, "{described}");
    let committed: u64 = offsets
        .iter()
        .map(|o| o["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(
        committed, 6000,
        "the group committed everything it consumed: {described}"
    );
    assert!(offsets.iter().all(|o| o["lag"] == 0), "{described}");
}

/// A `strata consume --group` process printing JSON records; its lines are collected.
struct CliMember {
    child: Child,
    lines: Arc<Mutex<Vec<Seen>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl CliMember {
    fn start(node: &TestNode, topic: &str, group: &str, extra: &[&str]) -> CliMember {
        let mut child = strata()
            .args([
                "consume",
                topic,
                "--group",
                group,
                "--format",
                "json",
                "--from-beginning",
            ])
            .args(["--auto-commit-interval-ms", "200"])
            .args(if extra.contains(&"--session-timeout-ms") {
                &[][..]
            } else {
                &["--session-timeout-ms", "3000"][..]
            })
            .args(extra)
            .env("STRATA_BOOTSTRAP", node.bootstrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let record: serde_json::Value = serde_json::from_str(&line).unwrap();
                sink.lock().unwrap().push((
                    record["partition"].as_u64().unwrap() as u32,
                    record["offset"].as_u64().unwrap(),
                ));
            }
        });
        CliMember {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.lines.lock().unwrap().clone()
    }

    fn kill(&mut self) -> Vec<Seen> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.seen()
    }

    /// SIGTERM: commit what was printed, leave the group.
    fn stop(&mut self) -> Vec<Seen> {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "a graceful stop exits 0: {status}");
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.seen()
    }
}

impl Drop for CliMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn cooperative_rebalances_move_only_what_moves_and_a_killed_member_costs_only_its_uncommitted_window()
 {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "events", "--partitions", "12"], None);
    let events: Arc<Mutex<Vec<(usize, RebalanceEvent)>>> = Arc::default();
    // How many rebalance events happened before the 4th member was killed.
    let before_kill = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let produced: u64 = runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap())).await.unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A producer writes throughout.
        let producer = {
            let client = client.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut next = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    produce_values(&client, "events", next..next + 200).await;
                    next += 200;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                next
            })
        };
        let seen: Vec<Arc<Mutex<Vec<Seen>>>> = (0..3).map(|_| Arc::default()).collect();
        let mut tasks = Vec::new();
        let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
        for index in 0..3 {
            let client = client.clone();
            let seen = seen[index].clone();
            let events = events.clone();
            let running = running.clone();
            tasks.push(tokio::spawn(async move {
                let mut member = GroupConsumer::subscribe(client, vec!["events".into()], group_config("g"))
                    .await
                    .unwrap();
                member.on_rebalance(move |event| events.lock().unwrap().push((index, event.clone())));
                consume_into(&mut member, &seen, || !running.load(std::sync::atomic::Ordering::Relaxed)).await;
                // Drain a little more so everything produced is consumed, then stop cleanly.
                member.close().await.unwrap();
            }));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        // A 4th member joins (a process, so it can be killed -9), takes its share, consumes...
        let mut fourth = CliMember::start(&node, "events", "g", &[]);
        wait_for_at_most("the 4th member to consume", Duration::from_secs(20), || !fourth.seen().is_empty());
        tokio::time::sleep(Duration::from_secs(2)).await;
        // ...and dies without a word. Its partitions go back to the others after the session.
        before_kill.store(events.lock().unwrap().len(), std::sync::atomic::Ordering::SeqCst);
        let killed_at = Instant::now();
        let killed = fourth.kill();
        let killed_partitions: BTreeSet<u32> = killed.iter().map(|(p, _)| *p).collect();
        // Time to consumption again: the others take its partitions once its session expires.
        let in_killed_partitions = || -> usize {
            seen.iter()
                .map(|s| s.lock().unwrap().iter().filter(|(p, _)| killed_partitions.contains(p)).count())
                .sum()
        };
        let baseline = in_killed_partitions();
        let taken_over = loop {
            if in_killed_partitions() > baseline {
                break killed_at.elapsed();
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(20),
                "the killed member's partitions were never taken over"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!("partitions of the killed member consumed again {taken_over:?} after the kill (session timeout 3 s)");
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let produced = producer.await.unwrap();
        // Let the members catch up with the last records, then stop them.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let distinct: BTreeSet<Seen> = seen
                .iter()
                .flat_map(|s| s.lock().unwrap().clone())
                .chain(killed.iter().copied())
                .collect();
            if distinct.len() as u64 >= produced {
                break;
            }
            assert!(Instant::now() < deadline, "consumed {} of {produced}", distinct.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }

        // Every record at least once; duplicates only where the killed member had been.
        let mut counts: BTreeMap<Seen, u32> = BTreeMap::new();
        for record in seen.iter().flat_map(|s| s.lock().unwrap().clone()).chain(killed.iter().copied()) {
            *counts.entry(record).or_default() += 1;
        }
        assert_eq!(counts.len() as u64, produced, "every record was consumed");
        let duplicates: Vec<Seen> = counts.iter().filter(|(_, n)| **n > 1).map(|(r, _)| *r).collect();
        eprintln!(
            "{produced} records, {} duplicates (the killed member printed {} records)",
            duplicates.len(),
            killed.len()
        );
        let killed_set: BTreeSet<Seen> = killed.iter().copied().collect();
        for duplicate in &duplicates {
            assert!(
                killed_set.contains(duplicate),
                "{duplicate:?} was delivered twice but the killed member never had it"
            );
        }
        produced
    });
    assert!(produced > 0);

    // Cooperative: a member only ever gives up a partition that goes to another member, and
    // never gets back one it was revoked in the same breath (no stop-the-world revoke-all).
    let events = events.lock().unwrap().clone();
    let mut owner: HashMap<u32, usize> = HashMap::new();
    for (member, event) in &events {
        match event {
            RebalanceEvent::Assigned(tps) => {
                for (_, p) in tps {
                    owner.insert(*p, *member);
                }
            }
            RebalanceEvent::Revoked(tps) => {
                for (_, p) in tps {
                    assert_eq!(
                        owner.get(p),
                        Some(member),
                        "member {member} revoked p{p} it did not own"
                    );
                    owner.remove(p);
                }
            }
            RebalanceEvent::Lost(tps) => panic!("member {member} lost {tps:?}"),
        }
    }
    let revocations: usize = events
        .iter()
        .map(|(_, e)| match e {
            RebalanceEvent::Revoked(tps) => tps.len(),
            _ => 0,
        })
        .sum();
    // 3 members settle on 4 partitions each (from 12 on the first) and give 3 to the 4th: an
    // eager protocol would revoke all 12 at every step.
    assert!(
        revocations <= 8 + 3 + 12,
        "{revocations} revocations: {events:?}"
    );
    // Until the kill (after it, the dead member's partitions, once some of theirs, come back).
    let before_kill = before_kill
        .load(std::sync::atomic::Ordering::SeqCst)
        .min(events.len());
    let events = &events[..before_kill];
    for (member, event) in events {
        if let RebalanceEvent::Revoked(tps) = event {
            let later_assigned_back = events
                .iter()
                .skip_while(|(m, e)| !(m == member && e == event))
                .skip(1)
                .take(1)
                .any(|(m, e)| m == member && matches!(e, RebalanceEvent::Assigned(a) if a.iter().any(|tp| tps.contains(tp))));
            assert!(
                !later_assigned_back,
                "member {member} was revoked {tps:?} and given them straight back"
            );
        }
    }
}

#[test]
fn at_most_once_never_delivers_a_record_twice_across_a_crash() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "jobs", "--partitions", "3"], None);
    // Records keep arriving while a member crashes and another takes over.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let bootstrap = node.bootstrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            runtime().block_on(async move {
                let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
                let mut next = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    produce_values(&client, "jobs", next..next + 100).await;
                    next += 100;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                next
            })
        })
    };
    let mut first = CliMember::start(&node, "jobs", "workers", &["--at-most-once"]);
    wait_for_at_most(
        "the first member to consume",
        Duration::from_secs(20),
        || first.seen().len() > 2000,
    );
    let before_crash = first.kill();
    // The next member resumes after whatever the crashed one committed before printing.
    let mut second = CliMember::start(&node, "jobs", "workers", &["--at-most-once"]);
    wait_for_at_most(
        "the second member to consume",
        Duration::from_secs(20),
        || second.seen().len() > 2000,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let produced = producer.join().unwrap();
    // Wait until the second member has read up to the end.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (0, Instant::now());
    loop {
        let count = second.seen().len();
        if count != last.0 {
            last = (count, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second member never went quiet"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = second.stop();
    let mut all: Vec<Seen> = before_crash.clone();
    all.extend(&after);
    let distinct: BTreeSet<Seen> = all.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "at-most-once delivered a record twice"
    );
    eprintln!(
        "at-most-once: {produced} produced, {} before the crash, {} after, {} skipped",
        before_crash.len(),
        after.len(),
        produced as usize - distinct.len()
    );
    // Skips are bounded by what the crashed member had committed but not printed.
    assert!(distinct.len() as u64 > produced / 2);
}

#[test]
fn a_zombie_of_an_old_generation_cannot_commit() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "t", "--partitions", "2"], None);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let join = |session_timeout_ms| {
            Request::JoinGroup(JoinGroupRequest {
                group: "z".into(),
                member_id: String::new(),
                instance_id: None,
                client_id: "raw".into(),
                topics: vec!["t".into()],
                session_timeout_ms,
                rebalance_timeout_ms: 10_000,
                assignor: String::new(),
            })
        };
        let joined = |response: Response| match response {
            Response::JoinGroup(r) => (r.error, r.member_id, r.generation),
            other => panic!("{other:?}"),
        };
        let commit = |member_id: &str, generation| {
            Request::OffsetCommit(OffsetCommitRequest {
                group: "z".into(),
                member_id: member_id.into(),
                generation,
                topics: vec![OffsetCommitTopic {
                    name: "t".into(),
                    partitions: vec![OffsetCommitPartition {
                        partition: 0,
                        offset: 42,
                        metadata: String::new(),
                    }],
                }],
            })
        };
        let commit_error = |response: Response| match response {
            Response::OffsetCommit(r) => r.error,
            other => panic!("{other:?}"),
        };
        let address = client.find_coordinator("z").await.unwrap();
        let (error, zombie, zombie_generation) =
            joined(client.request(&address, join(1000)).await.unwrap());
        assert_eq!(error, ErrorCode::None);
        // While it is a member at its generation, it may commit.
        assert_eq!(
            commit_error(
                client
                    .request(&address, commit(&zombie, zombie_generation))
                    .await
                    .unwrap()
            ),
            ErrorCode::None
        );
        // A live member joins and keeps heartbeating; the zombie falls silent past its session.
        let (_, live, mut live_generation) =
            joined(client.request(&address, join(10_000)).await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let response = client
                .request(
                    &address,
                    Request::Heartbeat(HeartbeatRequest {
                        group: "z".into(),
                        member_id: live.clone(),
                        generation: live_generation,
                        owned: Vec::new(),
                    }),
                )
                .await
                .unwrap();
            if let Response::Heartbeat(r) = response
                && r.error == ErrorCode::None
            {
                live_generation = r.generation;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            live_generation > zombie_generation,
            "the group moved on: {live_generation}"
        );
        assert_eq!(
            commit_error(
                client
                    .request(&address, commit(&zombie, zombie_generation))
                    .await
                    .unwrap()
            ),
            ErrorCode::IllegalGeneration,
            "the zombie's commit is fenced"
        );
        assert_eq!(
            commit_error(
                client
                    .request(&address, commit(&live, live_generation))
                    .await
                    .unwrap()
            ),
            ErrorCode::None
        );
        let offsets = client.committed_offsets("z").await.unwrap();
        assert_eq!(offsets.len(), 1);
        assert_eq!(offsets[0].offset, 42);
    });
}

#[test]
fn committed_offsets_survive_a_restart_of_the_whole_cluster() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |etcd: &EtcdServer, i: usize| {
        let id = (i + 1).to_string();
        TestNode::start_with(dirs[i].path(), 1, &etcd_args(etcd, &id))
    };
    let mut nodes: Vec<TestNode> = (0..3).map(|i| start(&etcd, i)).collect();
    nodes[0].cli(
        &[
            "topic",
            "create",
            "ledger",
            "--partitions",
            "4",
            "--replication-factor",
            "3",
        ],
        None,
    );
    const FIRST: u64 = 400;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(nodes[0].bootstrap()))
            .await
            .unwrap();
        produce_values(&client, "ledger", 0..FIRST).await;
        let mut member =
            GroupConsumer::subscribe(client.clone(), vec!["ledger".into()], group_config("keep"))
                .await
                .unwrap();
        let seen = Mutex::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        consume_into(&mut member, &seen, || {
            assert!(Instant::now() < deadline, "stalled");
            seen.lock().unwrap().len() as u64 >= FIRST
        })
        .await;
        member.close().await.unwrap();
    });
    for node in &mut nodes {
        node.kill();
    }
    let etcd = etcd.restart();
    for (i, node) in nodes.iter_mut().enumerate() {
        // Same data dirs and flags, etcd on its new port.
        *node = start(&etcd, i);
    }
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(nodes[1].bootstrap()))
            .await
            .unwrap();
        let committed: u64 = client
            .committed_offsets("keep")
            .await
            .unwrap()
            .iter()
            .map(|c| c.offset as u64)
            .sum();
        assert_eq!(committed, FIRST, "every consumed record stays committed");
        produce_values(&client, "ledger", FIRST..FIRST + 100).await;
        let mut member =
            GroupConsumer::subscribe(client.clone(), vec!["ledger".into()], group_config("keep"))
                .await
                .unwrap();
        let seen = Mutex::new(Vec::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        consume_into(&mut member, &seen, || {
            assert!(Instant::now() < deadline, "stalled after the restart");
            seen.lock().unwrap().len() >= 100
        })
        .await;
        member.close().await.unwrap();
        assert_eq!(
            seen.lock().unwrap().len(),
            100,
            "the group resumed where it committed"
        );
    });
}

#[test]
fn a_graceful_stop_commits_what_was_printed_so_the_next_member_repeats_nothing() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "lines", "--partitions", "2"], None);
    const RECORDS: u64 = 3000;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        produce_values(&client, "lines", 0..RECORDS).await;
    });
    // --max-messages stops inside a batch: only what was printed is committed.
    let first = node.cli(
        &[
            "consume",
            "lines",
            "--group",
            "cli",
            "--from-beginning",
            "--max-messages",
            "1234",
            "--format",
            "json",
        ],
        None,
    );
    let mut member = CliMember::start(&node, "lines", "cli", &[]);
    wait_for_at_most("the rest", Duration::from_secs(20), || {
        member.seen().len() as u64 >= RECORDS - 1234
    });
    std::thread::sleep(Duration::from_millis(500));
    let second = member.stop();
    let first: Vec<Seen> = first
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                v["partition"].as_u64().unwrap() as u32,
                v["offset"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(first.len(), 1234);
    let all: BTreeSet<Seen> = first.iter().chain(&second).copied().collect();
    assert_eq!(
        all.len(),
        first.len() + second.len(),
        "a record was printed twice"
    );
    assert_eq!(all.len() as u64, RECORDS);
}

/// Polls every member until `total` partitions are split evenly between them.
async fn settle(members: &mut [GroupConsumer], total: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for member in members.iter_mut() {
            member.poll().await.unwrap();
        }
        let sizes: Vec<usize> = members.iter().map(|m| m.assignment().len()).collect();
        if sizes.iter().sum::<usize>() == total && sizes.iter().all(|n| *n == total / members.len())
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never settled on {total}: {sizes:?}"
        );
    }
}

#[test]
fn partitions_added_to_a_subscribed_topic_are_shared_out() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "grow", "--partitions", "4"], None);
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let mut members = Vec::new();
        for _ in 0..2 {
            members.push(
                GroupConsumer::subscribe(
                    client.clone(),
                    vec!["grow".into()],
                    group_config("growers"),
                )
                .await
                .unwrap(),
            );
        }
        settle(&mut members, 4).await;
        client.add_partitions("grow", 8).await.unwrap();
        settle(&mut members, 8).await;
        // Records on the new partitions reach the members.
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut acks = Vec::new();
        for partition in 4..8u32 {
            let mut record = ProducerRecord::new("grow", None, format!("p{partition}"));
            record.partition = Some(partition);
            acks.push(producer.send(record).await.unwrap());
        }
        producer.flush().await.unwrap();
        for ack in acks {
            ack.await.unwrap();
        }
        let seen = Mutex::new(BTreeSet::new());
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.lock().unwrap().len() < 4 {
            assert!(
                Instant::now() < deadline,
                "records on new partitions not consumed"
            );
            for member in &mut members {
                for batch in member.poll().await.unwrap() {
                    seen.lock().unwrap().insert(batch.partition);
                }
            }
        }
        assert_eq!(*seen.lock().unwrap(), (4..8).collect::<BTreeSet<u32>>());
    });
    assert!(
        !node
            .cli_output(
                &["topic", "add-partitions", "grow", "--partitions", "3"],
                None
            )
            .status
            .success(),
        "partitions never shrink"
    );
}

#[test]
fn a_static_member_restarting_within_its_session_keeps_its_partitions_without_a_rebalance() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 1);
    node.cli(&["topic", "create", "pinned", "--partitions", "4"], None);
    let describe = || -> serde_json::Value {
        serde_json::from_str(&node.cli(&["group", "describe", "statics", "--format", "json"], None))
            .unwrap()
    };
    let partitions_of = |described: &serde_json::Value, instance: &str| -> Vec<u64> {
        described["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["instance_id"] == instance)
            .flat_map(|m| {
                m["partitions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["partition"].as_u64().unwrap())
            })
            .collect()
    };
    let static_args = |instance: &'static str| -> Vec<&'static str> {
        vec!["--instance-id", instance, "--session-timeout-ms", "10000"]
    };
    let _a = CliMember::start(&node, "pinned", "statics", &static_args("a"));
    let mut b = CliMember::start(&node, "pinned", "statics", &static_args("b"));
    let mut settled = serde_json::Value::Null;
    wait_for_at_most(
        "two static members with two partitions each",
        Duration::from_secs(20),
        || {
            settled = describe();
            settled["state"] == "Stable"
                && partitions_of(&settled, "a").len() == 2
                && partitions_of(&settled, "b").len() == 2
        },
    );
    let generation = settled["generation"].as_i64().unwrap();
    let before = partitions_of(&settled, "b");
    let member_id_of = |described: &serde_json::Value, instance: &str| -> String {
        described["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["instance_id"] == instance)
            .map(|m| m["id"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let old_id = member_id_of(&settled, "b");
    // b dies and comes back well within its 10 s session: the new process takes its place.
    b.kill();
    let _b = CliMember::start(&node, "pinned", "statics", &static_args("b"));
    let mut after = serde_json::Value::Null;
    wait_for_at_most("the new b to take over", Duration::from_secs(10), || {
        after = describe();
        let id = member_id_of(&after, "b");
        !id.is_empty() && id != old_id && after["state"] == "Stable"
    });
    assert_eq!(after["members"].as_array().unwrap().len(), 2, "{after}");
    assert_eq!(
        after["generation"].as_i64().unwrap(),
        generation,
        "no rebalance: {after}"
    );
    assert_eq!(partitions_of(&after, "b"), before, "b kept its partitions");
}

/// Three brokers: the broker coordinating a group dies mid-stream, another takes the group
/// over with its members; then its lag in seconds is measured across brokers.
#[test]
fn the_group_moves_to_another_coordinator_when_its_broker_dies() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = etcd_nodes(&etcd, &dirs, &[]);
    nodes[0].cli(
        &[
            "topic",
            "create",
            "moving",
            "--partitions",
            "6",
            "--replication-factor",
            "3",
        ],
        None,
    );
    let bootstrap: Vec<String> = nodes.iter().map(TestNode::bootstrap).collect();
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    const RECORDS: u64 = 3000;
    let killed = runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(bootstrap.join(",")))
            .await
            .unwrap();
        produce_values(&client, "moving", 0..RECORDS).await;
        let lost: Arc<Mutex<Vec<RebalanceEvent>>> = Arc::default();
        let mut members = Vec::new();
        for _ in 0..2 {
            let mut member = GroupConsumer::subscribe(
                client.clone(),
                vec!["moving".into()],
                group_config("movers"),
            )
            .await
            .unwrap();
            let lost = lost.clone();
            member.on_rebalance(move |event| {
                if matches!(event, RebalanceEvent::Lost(_)) {
                    lost.lock().unwrap().push(event.clone());
                }
            });
            members.push(member);
        }
        let mut seen: BTreeSet<Seen> = BTreeSet::new();
        let mut killed = None;
        let deadline = Instant::now() + Duration::from_secs(60);
        while (seen.len() as u64) < RECORDS {
            assert!(
                Instant::now() < deadline,
                "consumed {} of {RECORDS} (coordinator killed: {killed:?})",
                seen.len()
            );
            for member in members.iter_mut() {
                // Errors while the cluster moves are retried by polling again.
                if let Ok(batches) = member.poll().await {
                    for batch in &batches {
                        seen.extend(batch.records().map(|r| (batch.partition, r.offset)));
                    }
                }
            }
            if killed.is_none() && seen.len() as u64 >= RECORDS / 3 {
                // The broker coordinating the group dies mid-stream.
                let coordinator = client.find_coordinator("movers").await.unwrap();
                let port: u16 = coordinator.rsplit(':').next().unwrap().parse().unwrap();
                let index = ports
                    .iter()
                    .position(|p| *p == port)
                    .expect("a node's port");
                nodes[index].kill();
                killed = Some(index);
            }
        }
        let killed = killed.expect("the coordinator was killed");
        // Once the dead broker's lease runs out, another broker coordinates the group and both
        // members are in it again (members keep consuming what they own meanwhile).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for member in members.iter_mut() {
                let _ = member.poll().await;
            }
            let coordinator = client.find_coordinator("movers").await;
            let moved = coordinator.is_ok_and(|address| {
                address.rsplit(':').next().unwrap().parse::<u16>().unwrap() != ports[killed]
            });
            if moved
                && let Ok(described) = client.describe_group("movers").await
                && described.members.len() == 2
                && described.state == "Stable"
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the group never moved to a live coordinator"
            );
        }
        // The new coordinator restored the members the old one stored: they kept their
        // partitions (a lost membership drops them, uncommitted, and joins again).
        assert!(
            lost.lock().unwrap().is_empty(),
            "{:?}",
            lost.lock().unwrap()
        );
        for member in members {
            member.close().await.unwrap();
        }
        killed
    });
    // Lag in seconds across brokers: with the group's offsets at the end, a record written a
    // minute ago (by its timestamp) is partition 0's oldest unread one, and the coordinator
    // reads its age from whichever broker leads the partition.
    let live = &nodes[(killed + 1) % nodes.len()];
    live.cli(
        &[
            "group",
            "reset-offsets",
            "movers",
            "--topic",
            "moving",
            "--to-latest",
            "--execute",
        ],
        None,
    );
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(live.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut late = ProducerRecord::new("moving", None, "late");
        late.partition = Some(0);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        late.timestamp_ms = Some(now_ms - 60_000);
        producer.send(late).await.unwrap().await.unwrap();
    });
    let lag_seconds = |partition: u64| {
        described(live, "movers")["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["topic"] == "moving" && o["partition"] == partition)
            .and_then(|o| o["lag_seconds"].as_f64())
    };
    wait_for_at_most(
        "a minute of lag on partition 0",
        Duration::from_secs(30),
        || lag_seconds(0).is_some_and(|lag| lag >= 58.0),
    );
    assert!(lag_seconds(0).unwrap() < 120.0);
    assert_eq!(lag_seconds(1), Some(0.0), "partition 1 is read to its end");
}

#[test]
fn members_joining_while_records_wait_never_read_a_record_twice() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "backlog", "--partitions", "4"], None);
    const RECORDS: u64 = 20_000;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap())).await.unwrap();
        // 1 KiB records, so a fetch of 4 MiB per partition takes most of a partition at once.
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let mut acks = Vec::new();
        for value in 0..RECORDS {
            let record = ProducerRecord::new("backlog", Some(Bytes::from(value.to_string())), vec![b'x'; 1024]);
            acks.push(producer.send(record).await.unwrap());
        }
        producer.flush().await.unwrap();
        for ack in acks {
            ack.await.unwrap();
        }
        for round in 0..4 {
            let group = format!("late-{round}");
            let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
            let events: Arc<Mutex<Vec<(usize, RebalanceEvent)>>> = Arc::default();
            let mut tasks = Vec::new();
            for index in 0..2 {
                let mut config = group_config(&group);
                config.consumer.partition_max_bytes = 4 << 20;
                let mut member = GroupConsumer::subscribe(client.clone(), vec!["backlog".into()], config)
                    .await
                    .unwrap();
                let events = events.clone();
                member.on_rebalance(move |event| events.lock().unwrap().push((index, event.clone())));
                let seen = seen.clone();
                tasks.push(tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while (seen.lock().unwrap().len() as u64) < RECORDS && Instant::now() < deadline {
                        for batch in member.poll().await.unwrap() {
                            seen.lock().unwrap().extend(batch.records().map(|r| (batch.partition, r.offset)));
                        }
                    }
                    member.close().await.unwrap();
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            let seen = seen.lock().unwrap().clone();
            let distinct: BTreeSet<Seen> = seen.iter().copied().collect();
            let mut duplicated: BTreeMap<u32, (u64, u64, usize)> = BTreeMap::new();
            let mut counts: BTreeMap<Seen, u32> = BTreeMap::new();
            for record in &seen {
                *counts.entry(*record).or_default() += 1;
            }
            for ((partition, offset), n) in counts {
                if n > 1 {
                    let entry = duplicated.entry(partition).or_insert((offset, offset, 0));
                    entry.0 = entry.0.min(offset);
                    entry.1 = entry.1.max(offset);
                    entry.2 += 1;
                }
            }
            assert!(
                duplicated.is_empty() && distinct.len() as u64 == RECORDS,
                "round {round}: {} seen, {} distinct; duplicated (partition: first, last, count) {duplicated:?}; events {:?}",
                seen.len(),
                distinct.len(),
                events.lock().unwrap()
            );
        }
    });
}

/// `strata group reset-offsets`: a dry run changes nothing; `--execute` moves a stopped group to
/// the earliest offset (the group reads everything again), back by N on one partition, and to
/// a time (the group reads exactly what was produced after it); a running group is refused.
#[test]
fn a_stopped_group_is_reset_by_offset_shift_or_time_and_a_running_one_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "r", "--partitions", "2"], None);
    produce_to(&node, "r", 0..200);
    std::thread::sleep(Duration::from_millis(50));
    let between = strata_client::now_ms();
    std::thread::sleep(Duration::from_millis(50));
    produce_to(&node, "r", 200..300);
    // Reads `count` records as the group, committing them; returns their values.
    let consume = |count: usize| -> Vec<u64> {
        let count = count.to_string();
        let printed = node.cli(
            &[
                "consume",
                "r",
                "--group",
                "g",
                "--from-beginning",
                "--max-messages",
                &count,
                "--format",
                "json",
            ],
            None,
        );
        printed
            .lines()
            .map(|line| {
                let record: serde_json::Value = serde_json::from_str(line).unwrap();
                record["value"].as_str().unwrap().parse().unwrap()
            })
            .collect()
    };
    let committed = || -> BTreeMap<u64, i64> {
        described(&node, "g")["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["partition"].as_u64().unwrap(),
                    o["committed"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let sorted = |mut values: Vec<u64>| {
        values.sort_unstable();
        values
    };
    assert_eq!(sorted(consume(300)), (0..300).collect::<Vec<_>>());
    let ends = committed();
    assert_eq!(ends.values().sum::<i64>(), 300, "{ends:?}");
    assert!(
        ends.values().all(|&end| end > 5),
        "both partitions hold records: {ends:?}"
    );

    let reset = |extra: &[&str]| {
        let mut args = vec!["group", "reset-offsets", "g", "--topic"];
        args.extend_from_slice(extra);
        node.cli(&args, None)
    };
    let plan = reset(&["r", "--to-earliest"]);
    assert!(plan.contains("dry run: 2 partition(s)"), "{plan}");
    assert_eq!(committed(), ends, "a dry run commits nothing");

    reset(&["r", "--to-earliest", "--execute"]);
    assert_eq!(committed(), BTreeMap::from([(0, 0), (1, 0)]));
    assert_eq!(
        sorted(consume(300)),
        (0..300).collect::<Vec<_>>(),
        "read again"
    );

    reset(&["r:0", "--shift-by", "-5", "--execute"]);
    assert_eq!(
        committed(),
        BTreeMap::from([(0, ends[&0] - 5), (1, ends[&1])])
    );
    assert_eq!(
        consume(5).len(),
        5,
        "the last 5 records of partition 0 again"
    );

    let time = between.to_string();
    reset(&["r", "--to-datetime", &time, "--execute"]);
    assert_eq!(
        sorted(consume(100)),
        (200..300).collect::<Vec<_>>(),
        "exactly what was produced after the time"
    );

    // A running member owns the offsets: the reset is refused, and says why.
    let member = CliMember::start(&node, "r", "g", &[]);
    wait_for_a_member(&node, "g");
    let refused = node.cli_output(
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "r",
            "--to-earliest",
            "--execute",
        ],
        None,
    );
    assert!(!refused.status.success());
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains("active member"), "{reason}");
    drop(member);
}

/// `strata group delete`: a group without members goes away with its offsets (a consumer that
/// joins it later starts afresh); a group with members, or no group, is refused with a reason.
#[test]
fn a_group_without_members_is_deleted_with_its_offsets() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start(data.path(), 2);
    node.cli(&["topic", "create", "d", "--partitions", "2"], None);
    produce_to(&node, "d", 0..50);
    let consume_all = || {
        node.cli(
            &[
                "consume",
                "d",
                "--group",
                "old",
                "--from-beginning",
                "--max-messages",
                "50",
            ],
            None,
        )
        .lines()
        .count()
    };
    assert_eq!(consume_all(), 50);
    assert!(node.cli(&["group", "list"], None).contains("old"));

    // With a member, the group stays.
    let member = CliMember::start(&node, "d", "old", &[]);
    wait_for_a_member(&node, "old");
    let refused = node.cli_output(&["group", "delete", "old"], None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has members"));
    drop(member);

    // Once the member's session has expired, the group goes, offsets and all.
    wait_for_at_most("the group is deleted", Duration::from_secs(20), || {
        node.cli_output(&["group", "delete", "old"], None)
            .status
            .success()
    });
    assert!(!node.cli(&["group", "list"], None).contains("old"));
    let after = described(&node, "old");
    assert!(after["offsets"].as_array().unwrap().is_empty(), "{after}");
    // A consumer of the same name starts afresh: from the beginning, everything again.
    assert_eq!(consume_all(), 50);

    let missing = node.cli_output(&["group", "delete", "never-was"], None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no group never-was"));
}

/// Offsets expire (Kafka's `offsets.retention.minutes`, here `--offsets-retention-ms`): a group
/// that has had no members and no commit for the retention is deleted; one whose member stays
/// is kept however long it runs.
#[test]
fn the_offsets_of_a_group_left_empty_expire_and_a_running_group_keeps_them() {
    let data = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(data.path(), 1, &["--offsets-retention-ms", "1500"]);
    node.cli(&["topic", "create", "x", "--partitions", "2"], None);
    produce_to(&node, "x", 0..20);
    let mut running = CliMember::start(&node, "x", "running", &[]);
    wait_for_a_member(&node, "running");
    node.cli(
        &[
            "consume",
            "x",
            "--group",
            "left",
            "--from-beginning",
            "--max-messages",
            "20",
        ],
        None,
    );
    let listed = |group: &str| {
        node.cli(&["group", "list"], None)
            .lines()
            .any(|line| line.split_whitespace().next() == Some(group))
    };
    assert!(listed("left") && listed("running"));
    let started = Instant::now();
    wait_for_at_most("the empty group expires", Duration::from_secs(20), || {
        !listed("left")
    });
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "expired only after the retention"
    );
    std::thread::sleep(Duration::from_millis(2000));
    assert!(listed("running"), "a group with a member keeps its offsets");
    assert_eq!(running.seen().len(), 20);
    running.stop();
}

/// The coordinator's lag metrics cover partitions other brokers lead: it asks each leader over
/// the replication endpoint, with no client of its own.
#[test]
fn the_coordinator_measures_lag_on_partitions_other_brokers_lead() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let admins: Vec<u16> = (0..2).map(|_| support::free_base_port(0)).collect();
    let nodes: Vec<TestNode> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let (id, admin) = ((i + 1).to_string(), format!("127.0.0.1:{}", admins[i]));
            let mut args = etcd_args(&etcd, &id);
            args.extend_from_slice(&["--admin", &admin]);
            TestNode::start_with(dir.path(), 1, &args)
        })
        .collect();
    let node = &nodes[0];
    node.cli(
        &[
            "topic",
            "create",
            "spread",
            "--partitions",
            "4",
            "--replication-factor",
            "1",
        ],
        None,
    );
    let described: serde_json::Value =
        serde_json::from_str(&node.cli(&["topic", "describe", "spread", "--format", "json"], None))
            .unwrap();
    let leaders: BTreeSet<i64> = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|partition| partition["leader"].as_i64().unwrap())
        .collect();
    assert_eq!(
        leaders.len(),
        2,
        "both brokers lead some partition: {described}"
    );
    let records: String = (0..40).map(|i| format!("k{i}:v{i}\n")).collect();
    node.cli(
        &["produce", "spread", "--key-separator", ":"],
        Some(records.as_bytes()),
    );
    node.cli(
        &[
            "consume",
            "spread",
            "--group",
            "spreaders",
            "--from-beginning",
            "--max-messages",
            "1",
        ],
        None,
    );
    node.cli(
        &[
            "group",
            "reset-offsets",
            "spreaders",
            "--topic",
            "spread",
            "--to-earliest",
            "--execute",
        ],
        None,
    );
    // On the coordinator (whichever broker it is): every partition's lag, all 40 records.
    let measured = |admin: u16| -> BTreeMap<String, f64> {
        let (_, text) = support::http_get(admin, "/metrics");
        text.lines()
            .filter(|line| {
                line.starts_with("strata_consumer_lag{") && line.contains("group=\"spreaders\"")
            })
            .filter_map(|line| {
                let partition = line.split("partition=\"").nth(1)?.split('"').next()?;
                Some((
                    partition.to_string(),
                    line.rsplit_once(' ')?.1.parse().ok()?,
                ))
            })
            .collect()
    };
    wait_for_at_most(
        "the coordinator's lag on all four partitions",
        Duration::from_secs(30),
        || {
            admins.iter().any(|&admin| {
                let lags = measured(admin);
                lags.len() == 4 && lags.values().sum::<f64>() == 40.0
            })
        },
    );
}
