//! A nemesis soak: three brokers, each in a network namespace of its own, on a real etcd take
//! continuous `acks=all` load while a seeded schedule of faults hits them one after another:
//! kill -9 of any broker, of a leader, of the controller; SIGSTOP shorter and longer than the
//! lease, of any broker or of a leader; two brokers down at once; a clean restart; a broker cut
//! off from everyone, a leader cut off from its followers only (it keeps its lease), a broker
//! losing 5-40% of its packets (iptables); etcd paused (past the lease or not) or restarted;
//! a partition's replicas reassigned (three down to two, two back up to three).
//! Afterwards the history is checked: every acknowledged record is present exactly once, in
//! order, at its acknowledged offset; nothing a consumer saw vanished; the idempotent producer
//! wrote nothing twice; below the consumer group's commits every record reached a member; and
//! the three replicas of every partition hold the same batches.
//!
//! `STRATA_SOAK_SECS` (default 40) sets how long faults are injected, `STRATA_SOAK_SEED` the
//! schedule (printed at the start; the same seed gives the same faults, not the same timing).
//! Needs root (namespaces, iptables), as `tests/partition.rs`.

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_client::{
    Client, ClientConfig, Consumer, GroupConfig, GroupConsumer, OffsetReset, Producer,
    ProducerConfig, ProducerRecord,
};
use strata_coordinator::testing::EtcdServer;
use support::history::{self, value};
use support::netns::{NsNode, TestNet, require_root};
use support::{runtime, wait_for_at_most};

/// Offsets and acknowledgements: one topic per producer kind.
const PLAIN: &str = "soak";
const IDEMPOTENT: &str = "soak-idem";
const PARTITIONS: u32 = 3;
/// The consumer group reading `PLAIN`.
const GROUP: &str = "soak-group";

/// splitmix64: a seeded schedule without a dependency.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NodeState {
    Up,
    Killed,
    Paused,
}

/// The brokers (host `i + 1` of `net` is broker `i + 1`) and what the nemesis has done to each.
struct Cluster {
    nodes: Vec<NsNode>,
    states: Vec<NodeState>,
    /// Whether iptables rules in the host's namespace cut or thin its traffic.
    faulty_network: Vec<bool>,
    /// `None` only while it restarts.
    etcd: Option<EtcdServer>,
    etcd_paused: bool,
    /// Dropped after the nodes (fields drop in order): namespaces outlive their brokers.
    net: TestNet,
}

impl Cluster {
    /// A broker that answers the CLI promptly: up, not paused, its network whole.
    fn observer(&self) -> Option<usize> {
        (0..self.nodes.len())
            .find(|index| self.states[*index] == NodeState::Up && !self.faulty_network[*index])
    }

    fn kill(&mut self, index: usize) {
        if self.states[index] == NodeState::Paused {
            self.nodes[index].signal(libc::SIGCONT);
        }
        self.nodes[index].kill();
        self.states[index] = NodeState::Killed;
    }

    fn pause(&mut self, index: usize) {
        self.nodes[index].signal(libc::SIGSTOP);
        self.states[index] = NodeState::Paused;
    }

    fn signal_etcd(&self, signal: i32) {
        let pid = self.etcd.as_ref().expect("etcd runs").pid();
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(pid as i32, signal) };
    }

    /// Restarts killed brokers, wakes paused ones and etcd, removes every network fault.
    fn heal(&mut self) {
        if self.etcd_paused {
            self.signal_etcd(libc::SIGCONT);
            self.etcd_paused = false;
        }
        for index in 0..self.nodes.len() {
            if self.faulty_network[index] {
                self.net.heal_all(index + 1);
                self.faulty_network[index] = false;
            }
            match self.states[index] {
                NodeState::Up => {}
                NodeState::Killed => self.nodes[index].spawn(),
                NodeState::Paused => self.nodes[index].signal(libc::SIGCONT),
            }
            self.states[index] = NodeState::Up;
        }
    }

    /// `topic describe` through a healthy broker; `None` when none answers.
    fn describe(&self, topic: &str) -> Option<serde_json::Value> {
        let observer = self.observer()?;
        let text = self.nodes[observer]
            .try_cli(&["topic", "describe", topic, "--format", "json"], None)
            .ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The node index of partition `partition`'s leader of `PLAIN`, as a healthy broker sees it.
    fn leader_of(&self, partition: u32) -> Option<usize> {
        let leader = self.describe(PLAIN)?["partitions"][partition as usize]["leader"].as_i64()?;
        (leader >= 1).then(|| leader as usize - 1)
    }

    fn controller(&self) -> Option<usize> {
        let observer = self.observer()?;
        let text = self.nodes[observer]
            .try_cli(&["cluster", "info", "--format", "json"], None)
            .ok()?;
        let info: serde_json::Value = serde_json::from_str(&text).ok()?;
        let controller = info["controller"].as_i64()?;
        (controller >= 1).then(|| controller as usize - 1)
    }

    /// Whether every partition of both topics has a leader and every replica in sync (no
    /// reassignment waiting for a replica to catch up).
    fn fully_in_sync(&self) -> bool {
        [PLAIN, IDEMPOTENT].iter().all(|topic| {
            self.describe(topic).is_some_and(|described| {
                described["partitions"]
                    .as_array()
                    .is_some_and(|partitions| {
                        partitions.iter().all(|partition| {
                            let ids = |field: &str| {
                                let mut ids: Vec<i64> = partition[field]
                                    .as_array()
                                    .map(|ids| ids.iter().filter_map(|id| id.as_i64()).collect())
                                    .unwrap_or_default();
                                ids.sort_unstable();
                                ids
                            };
                            partition["leader"].as_i64() > Some(0) && ids("isr") == ids("replicas")
                        })
                    })
            })
        })
    }
}

/// What the clients saw.
#[derive(Default)]
struct History {
    sent: u64,
    failed: u64,
    /// (topic index, partition, sequence) → acknowledged offset.
    acked: BTreeMap<(usize, u32, u64), u64>,
    /// (topic index, partition, offset) → value a consumer saw during the run.
    consumed: BTreeMap<(usize, u32, u64), String>,
    /// (partition, offset) → value the group's members saw (of `PLAIN`).
    group_consumed: BTreeMap<(u32, u64), String>,
    /// Members that joined the group (each leaves after a while and another joins).
    group_members: u64,
}

fn topic_index(topic: &str) -> usize {
    usize::from(topic == IDEMPOTENT)
}

/// One fault and its healing; returns what it did, for the log.
fn inject(cluster: &mut Cluster, schedule: &mut Schedule) -> String {
    let brokers = cluster.nodes.len() as u64;
    let any = |schedule: &mut Schedule| schedule.below(brokers) as usize;
    let (what, hold) = match schedule.below(13) {
        0 => {
            let victim = any(schedule);
            cluster.kill(victim);
            (
                format!("kill -9 broker {}", victim + 1),
                schedule.millis(0, 3000),
            )
        }
        1 => {
            let partition = schedule.below(u64::from(PARTITIONS)) as u32;
            let Some(victim) = cluster.leader_of(partition) else {
                return "no leader to kill".into();
            };
            cluster.kill(victim);
            (
                format!("kill -9 broker {} (leader of {partition})", victim + 1),
                schedule.millis(500, 3000),
            )
        }
        2 => {
            let Some(victim) = cluster.controller() else {
                return "no controller to kill".into();
            };
            cluster.kill(victim);
            (
                format!("kill -9 broker {} (the controller)", victim + 1),
                schedule.millis(500, 3000),
            )
        }
        3 => {
            let victim = any(schedule);
            cluster.pause(victim);
            // The lease is 2 s: some pauses outlast it, some do not.
            (
                format!("SIGSTOP broker {}", victim + 1),
                schedule.millis(300, 5000),
            )
        }
        4 => {
            let partition = schedule.below(u64::from(PARTITIONS)) as u32;
            let Some(victim) = cluster.leader_of(partition) else {
                return "no leader to pause".into();
            };
            cluster.pause(victim);
            // Past the lease: it wakes as a leader that was replaced.
            (
                format!("SIGSTOP broker {} (leader of {partition})", victim + 1),
                schedule.millis(3000, 6000),
            )
        }
        5 => {
            let first = any(schedule);
            let second = (first + 1 + schedule.below(brokers - 1) as usize) % brokers as usize;
            cluster.kill(first);
            cluster.pause(second);
            (
                format!(
                    "kill -9 broker {} and SIGSTOP broker {}",
                    first + 1,
                    second + 1
                ),
                schedule.millis(500, 3000),
            )
        }
        6 => {
            let victim = any(schedule);
            cluster.net.isolate(victim + 1);
            cluster.faulty_network[victim] = true;
            (
                format!("broker {} cut off from everyone", victim + 1),
                schedule.millis(1000, 5000),
            )
        }
        7 => {
            let partition = schedule.below(u64::from(PARTITIONS)) as u32;
            let Some(victim) = cluster.leader_of(partition) else {
                return "no leader to cut off".into();
            };
            // It keeps its lease (etcd and clients still reach it), so it stays the leader,
            // and its followers drop out of the ISR: acks=all must fail, not half-succeed.
            cluster.net.isolate_from_peers(victim + 1);
            cluster.faulty_network[victim] = true;
            (
                format!(
                    "broker {} (leader of {partition}) cut off from the other brokers",
                    victim + 1
                ),
                schedule.millis(1000, 6000),
            )
        }
        8 => {
            let victim = any(schedule);
            let loss = 0.05 + schedule.below(35) as f64 / 100.0;
            cluster.net.lossy(victim + 1, loss);
            cluster.faulty_network[victim] = true;
            (
                format!(
                    "broker {} drops {:.0}% of its packets",
                    victim + 1,
                    loss * 100.0
                ),
                schedule.millis(2000, 8000),
            )
        }
        9 => {
            // The lease is 2 s: longer outages take every broker out of the cluster until etcd
            // answers again.
            cluster.signal_etcd(libc::SIGSTOP);
            cluster.etcd_paused = true;
            ("etcd paused (SIGSTOP)".into(), schedule.millis(500, 4000))
        }
        10 => {
            let etcd = cluster.etcd.take().expect("etcd runs");
            cluster.etcd = Some(etcd.restart());
            (
                "etcd killed and restarted on its data".into(),
                Duration::ZERO,
            )
        }
        11 => {
            // Replicas move while faults go on: 3 replicas down to 2 (min ISR stays 2), or 2
            // back up to 3 (the new one catches up before it joins), in a shuffled order.
            let partition = schedule.below(u64::from(PARTITIONS)) as u32;
            let Some(replicas) = cluster.describe(PLAIN).and_then(|described| {
                described["partitions"][partition as usize]["replicas"]
                    .as_array()
                    .map(|ids| ids.len())
            }) else {
                return "no state to reassign from".into();
            };
            let mut target: Vec<u64> = (1..=brokers).collect();
            for i in (1..target.len()).rev() {
                let j = schedule.below(i as u64 + 1) as usize;
                target.swap(i, j);
            }
            if replicas == 3 {
                target.pop();
            }
            let list: Vec<String> = target.iter().map(u64::to_string).collect();
            let list = list.join(",");
            let Some(observer) = cluster.observer() else {
                return "nobody to ask for a reassignment".into();
            };
            let partition_arg = partition.to_string();
            let args = [
                "topic",
                "reassign",
                PLAIN,
                "--partition",
                &partition_arg,
                "--replicas",
                &list,
            ];
            let outcome = match cluster.nodes[observer].try_cli(&args, None) {
                Ok(_) => "started",
                Err(_) => "refused",
            };
            (
                format!("reassign {PLAIN}-{partition} to [{list}]: {outcome}"),
                Duration::ZERO,
            )
        }
        _ => {
            let victim = any(schedule);
            cluster.nodes[victim].stop();
            cluster.states[victim] = NodeState::Killed;
            (
                format!("clean restart of broker {}", victim + 1),
                schedule.millis(0, 1000),
            )
        }
    };
    std::thread::sleep(hold);
    cluster.heal();
    format!("{what}, healed after {} ms", hold.as_millis())
}

/// Producers on both topics and a consumer reading along, until `stop`.
async fn load(bootstrap: String, history: Arc<Mutex<History>>, stop: Arc<AtomicBool>) {
    let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
    // No retries and one request in flight: each record is sent once, so an acknowledged one
    // can only appear once, and records land in send order.
    let plain = Producer::new(
        client.clone(),
        ProducerConfig {
            acks: -1,
            retries: 0,
            max_in_flight: 1,
            linger: Duration::from_millis(1),
            ..ProducerConfig::default()
        },
    );
    // Retries and five requests in flight: idempotence must keep them exactly once, in order.
    let idempotent = Producer::new(
        client.clone(),
        ProducerConfig {
            acks: -1,
            idempotent: true,
            retries: 20,
            retry_backoff: Duration::from_millis(50),
            linger: Duration::from_millis(2),
            ..ProducerConfig::default()
        },
    );
    let mut tasks = Vec::new();
    for (topic, producer, window) in [(PLAIN, plain, 32), (IDEMPOTENT, idempotent, 64)] {
        for partition in 0..PARTITIONS {
            let producer = producer.clone();
            let history = history.clone();
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut in_flight = VecDeque::new();
                let mut sequence = 0u64;
                loop {
                    let stopping = stop.load(Ordering::Relaxed);
                    if !stopping {
                        let mut record =
                            ProducerRecord::new(topic, None, value(partition, sequence));
                        record.partition = Some(partition);
                        match producer.send(record).await {
                            Ok(ack) => in_flight.push_back((sequence, ack)),
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                        sequence += 1;
                    }
                    if in_flight.len() < window && !stopping {
                        continue;
                    }
                    let Some((acked_sequence, ack)) = in_flight.pop_front() else {
                        break;
                    };
                    let outcome = ack.await;
                    let failed = {
                        let mut history = history.lock().unwrap();
                        history.sent += 1;
                        match outcome {
                            Ok(ack) => {
                                history.acked.insert(
                                    (topic_index(topic), partition, acked_sequence),
                                    ack.offset as u64,
                                );
                                false
                            }
                            Err(_) => {
                                history.failed += 1;
                                true
                            }
                        }
                    };
                    if failed {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }));
        }
    }
    // Two members of a consumer group on `PLAIN`, each leaving after a while for a new one to
    // join: rebalances under faults, commits to a coordinator that moves.
    for member in 0..2u64 {
        let client = client.clone();
        let history = history.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(group_member(client, member, history, stop)));
    }
    // A consumer reading along: what it sees must never vanish.
    let mut consumer = Consumer::new(client, Default::default());
    let partitions: Vec<u32> = (0..PARTITIONS).collect();
    for topic in [PLAIN, IDEMPOTENT] {
        while consumer
            .assign(topic, &partitions, strata_client::SeekTo::Beginning)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while !stop.load(Ordering::Relaxed) {
        let polled = tokio::time::timeout(Duration::from_millis(500), consumer.poll()).await;
        match polled {
            Ok(Ok(batches)) => {
                let seen = history::seen(&batches)
                    .map(|(topic, p, offset, v)| ((topic_index(topic), p, offset), v));
                history.lock().unwrap().consumed.extend(seen);
            }
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(_) => {}
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// One seat in the group: members come and go (each stays 4-12 s), until `stop`; the last one
/// commits and leaves.
async fn group_member(
    client: Arc<Client>,
    seat: u64,
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
) {
    let mut config = GroupConfig::new(GROUP);
    config.session_timeout = Duration::from_secs(6);
    config.auto_commit_interval = Some(Duration::from_millis(500));
    config.auto_offset_reset = OffsetReset::Earliest;
    let mut generation = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut member) =
            GroupConsumer::subscribe(client.clone(), vec![PLAIN.to_string()], config.clone()).await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        history.lock().unwrap().group_members += 1;
        let stays = Duration::from_millis(4000 + (seat * 7 + generation * 3) % 9 * 1000);
        generation += 1;
        let joined = Instant::now();
        while joined.elapsed() < stays && !stop.load(Ordering::Relaxed) {
            match member.poll().await {
                Ok(batches) => {
                    let seen = history::seen(&batches).map(|(_, p, offset, v)| ((p, offset), v));
                    history.lock().unwrap().group_consumed.extend(seen);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        // Commits what it consumed and leaves; a close that fails (a fault) leaves the
        // session to expire instead.
        let _ = tokio::time::timeout(Duration::from_secs(5), member.close()).await;
    }
}

/// Checks one topic's final logs against the history; returns the records present.
fn check_topic(topic: &str, logs: &[Vec<(u64, String)>], history: &History) -> usize {
    let index = topic_index(topic);
    let mut present = 0;
    for (partition, log) in logs.iter().enumerate() {
        let partition = partition as u32;
        let acked = history
            .acked
            .range((index, partition, 0)..(index, partition + 1, 0))
            .map(|((_, _, sequence), offset)| (*sequence, *offset));
        let consumed = history
            .consumed
            .range((index, partition, 0)..(index, partition + 1, 0))
            .map(|((_, _, offset), value)| (*offset, value));
        present += history::check_partition(topic, partition, log, acked, consumed);
    }
    present
}

/// The group's at-least-once promise: below each committed offset, every record of the final
/// log reached a member (across rebalances and coordinator moves), no commit passes the log's
/// end, and nothing a member saw vanished.
fn check_group(
    logs: &[Vec<(u64, String)>],
    committed: &[strata_wire::protocol::CommittedOffset],
    history: &History,
) {
    for (partition, log) in logs.iter().enumerate() {
        let partition = partition as u32;
        let end = log.last().map_or(0, |(offset, _)| offset + 1);
        let commit = committed
            .iter()
            .find(|c| c.topic == PLAIN && c.partition == partition)
            .map_or(0, |c| c.offset.max(0) as u64);
        assert!(
            commit <= end,
            "{GROUP}: committed {commit} on {PLAIN}-{partition}, past its end {end}"
        );
        println!("soak: {GROUP} committed {commit} of {end} on {PLAIN}-{partition}");
        assert!(
            commit > 0,
            "{GROUP} committed progress on {PLAIN}-{partition}"
        );
        for (offset, value) in log.iter().take_while(|(offset, _)| *offset < commit) {
            assert_eq!(
                history.group_consumed.get(&(partition, *offset)),
                Some(value),
                "{GROUP}: committed past {PLAIN}-{partition} offset {offset}, which no member saw"
            );
        }
        let by_offset: BTreeMap<u64, &String> =
            log.iter().map(|(offset, value)| (*offset, value)).collect();
        for ((_, offset), seen) in history
            .group_consumed
            .range((partition, 0)..(partition + 1, 0))
        {
            assert_eq!(
                by_offset.get(offset).copied(),
                Some(seen),
                "{GROUP}: a member saw {seen} at {PLAIN}-{partition} offset {offset}, which later vanished"
            );
        }
    }
}

/// `strata log dump` of a partition folder without its first line (the recovery report).
fn dump(dir: &Path) -> String {
    let output = support::strata()
        .args(["log", "dump"])
        .arg(dir)
        .output()
        .expect("strata log dump");
    assert!(
        output.status.success(),
        "log dump {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    text.split_once('\n')
        .map_or("", |(_, rest)| rest)
        .to_string()
}

#[test]
fn acknowledged_writes_survive_random_faults() {
    let seconds: u64 = std::env::var("STRATA_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("STRATA_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("soak: STRATA_SOAK_SEED={seed} STRATA_SOAK_SECS={seconds}");
    let mut schedule = Schedule(seed);

    require_root();
    let net = TestNet::create(3);
    let etcd = EtcdServer::start_also_on(&net.gateway());
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Followers out of touch for 3 s leave the ISR, so cuts that short still shrink it; and
    // leaderships go back to preferred replicas every 5 s, so leaders also move between live
    // brokers under load.
    let nodes: Vec<NsNode> = (1..=3)
        .map(|host| {
            NsNode::start(
                &net,
                host,
                &etcd.endpoint,
                "soak",
                dirs[host - 1].path(),
                &[
                    "--replica-lag-time-max-ms",
                    "3000",
                    "--leader-rebalance-interval-ms",
                    "5000",
                ],
            )
        })
        .collect();
    wait_for_at_most("three brokers", Duration::from_secs(20), || {
        support::alive_brokers(&nodes[0].cluster_info()).len() == 3
    });
    // `PLAIN` takes the defaults: its appends are small, so they go through the page cache.
    // `IDEMPOTENT` writes every append past it, on leaders and followers alike, and its
    // readers at the tail are served from the tail cache.
    for (topic, settings) in [
        (PLAIN, &[][..]),
        (
            IDEMPOTENT,
            &[
                "--config",
                "direct.writes=always",
                "--config",
                "direct.write.min.bytes=0",
            ][..],
        ),
    ] {
        let partitions = PARTITIONS.to_string();
        let mut args = vec![
            "topic",
            "create",
            topic,
            "--partitions",
            &partitions,
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ];
        args.extend_from_slice(settings);
        nodes[0].cli(&args, None);
    }
    let mut cluster = Cluster {
        net,
        etcd: Some(etcd),
        etcd_paused: false,
        states: vec![NodeState::Up; nodes.len()],
        faulty_network: vec![false; nodes.len()],
        nodes,
    };
    wait_for_at_most("every replica in sync", Duration::from_secs(30), || {
        cluster.fully_in_sync()
    });

    let bootstrap: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| node.address.clone())
        .collect();
    let bootstrap = bootstrap.join(",");
    let history = Arc::new(Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = runtime();
    let load = runtime.spawn(load(bootstrap.clone(), history.clone(), stop.clone()));

    let started = Instant::now();
    let mut faults = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(schedule.millis(200, 2000));
        let what = inject(&mut cluster, &mut schedule);
        faults += 1;
        println!("soak {:>5.1} s: {what}", started.elapsed().as_secs_f64());
        // Now and then, let the cluster recover fully, so load keeps making progress.
        if faults % 4 == 0 {
            wait_for_at_most(
                "every replica back in sync",
                Duration::from_secs(60),
                || cluster.fully_in_sync(),
            );
        }
    }
    cluster.heal();
    wait_for_at_most(
        "every replica back in sync",
        Duration::from_secs(60),
        || cluster.fully_in_sync(),
    );
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(load).unwrap();

    let history = history.lock().unwrap();
    let mut present = 0;
    for topic in [PLAIN, IDEMPOTENT] {
        let logs = runtime.block_on(history::read_to_end(&bootstrap, topic, PARTITIONS));
        present += check_topic(topic, &logs, &history);
        if topic == PLAIN {
            let committed = runtime.block_on(async {
                let client = Client::connect(ClientConfig::new(bootstrap.clone()))
                    .await
                    .unwrap();
                client.committed_offsets(GROUP).await.unwrap()
            });
            check_group(&logs, &committed, &history);
        }
    }
    println!(
        "soak: {faults} faults; sent {}, acknowledged {}, failed {}, consumed during the run {}, in the final logs {present}; group: {} members, {} records seen",
        history.sent,
        history.acked.len(),
        history.failed,
        history.consumed.len(),
        history.group_members,
        history.group_consumed.len(),
    );
    for topic in [PLAIN, IDEMPOTENT] {
        for partition in 0..PARTITIONS {
            let acked = history
                .acked
                .range((topic_index(topic), partition, 0)..(topic_index(topic), partition + 1, 0))
                .count();
            assert!(
                acked > 100,
                "{topic}-{partition} made progress ({acked} acknowledged)"
            );
        }
    }

    // Quiet now: the followers catch up to the leaders' log ends, then every replica of a
    // partition holds the same batches.
    std::thread::sleep(Duration::from_secs(2));
    let mut replicas_of = BTreeMap::new();
    for topic in [PLAIN, IDEMPOTENT] {
        let described = cluster.describe(topic).expect("a broker answers");
        for partition in 0..PARTITIONS {
            let replicas: Vec<usize> = described["partitions"][partition as usize]["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_u64().unwrap() as usize)
                .collect();
            replicas_of.insert((topic, partition), replicas);
        }
    }
    for node in &mut cluster.nodes {
        node.stop();
    }
    for ((topic, partition), replicas) in replicas_of {
        let folder = format!("{topic}-{partition}");
        let dumps: Vec<(usize, String)> = replicas
            .iter()
            .map(|id| (*id, dump(&dirs[id - 1].path().join(&folder))))
            .collect();
        let (first, batches) = &dumps[0];
        assert!(!batches.is_empty(), "{folder} holds batches");
        for (id, other) in &dumps[1..] {
            assert_eq!(
                batches, other,
                "{folder}: broker {id} holds other batches than broker {first}"
            );
        }
    }
}
