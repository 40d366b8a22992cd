//! Replication between real `strata serve` processes over QUIC on loopback, with a real etcd.

mod support;

use std::path::Path;
use std::time::Duration;

use strata_client::{Client, ClientConfig, Codec, Producer, ProducerConfig, ProducerRecord};
use strata_coordinator::testing::EtcdServer;
use support::{TestNode, describe, etcd_args, etcd_nodes, runtime, wait_for, wait_for_at_most};

/// Three brokers on `etcd`, once the first sees all three registered.
fn three_nodes(etcd: &EtcdServer, dirs: &[tempfile::TempDir], extra: &[&str]) -> Vec<TestNode> {
    let nodes = etcd_nodes(etcd, &dirs[..3], extra);
    wait_for_brokers(&nodes);
    nodes
}

/// Waits until the first node sees every node registered.
fn wait_for_brokers(nodes: &[TestNode]) {
    wait_for("every broker registered", || {
        support::alive_brokers(&support::cluster_info(&nodes[0])).len() == nodes.len()
    });
}

/// Creates `topic` through the first node and waits until every node knows it.
fn create_topic(nodes: &[TestNode], topic: &str, flags: &[&str]) {
    let mut args = vec!["topic", "create", topic];
    args.extend_from_slice(flags);
    nodes[0].cli(&args, None);
    wait_for("every node to see the topic", || {
        nodes.iter().all(|node| {
            node.cli(&["topic", "list"], None)
                .lines()
                .any(|t| t == topic)
        })
    });
}

fn isr(node: &TestNode, topic: &str, partition: usize) -> Vec<i64> {
    describe(node, topic)["partitions"][partition]["isr"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_i64().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn segment(dir: &Path, topic: &str, partition: u32) -> Vec<u8> {
    std::fs::read(dir.join(format!("{topic}-{partition}/00000000000000000000.log"))).unwrap()
}

/// RF 3, acks=all: every record reaches all three logs, byte for byte, and consumers read it
/// from the leader.
#[test]
fn three_replicas_hold_identical_logs() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = three_nodes(&etcd, &dirs, &[]);
    create_topic(
        &nodes,
        "copies",
        &[
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let runtime = runtime();
    let records = 3_000;
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(nodes[1].bootstrap()))
            .await
            .unwrap();
        // Half the batches are compressed: followers store them as the leader did.
        let producers = [Codec::None, Codec::Lz4].map(|compression| {
            Producer::new(
                client.clone(),
                ProducerConfig {
                    acks: -1,
                    compression,
                    ..ProducerConfig::default()
                },
            )
        });
        let mut acks = Vec::new();
        for i in 0..records {
            acks.push(
                producers[i % 2]
                    .send(ProducerRecord::new(
                        "copies",
                        Some(format!("k{i}").into()),
                        format!("v{i}"),
                    ))
                    .await
                    .unwrap(),
            );
        }
        for ack in acks {
            ack.await.unwrap();
        }
    });
    let consumed = nodes[2].cli(
        &[
            "consume",
            "copies",
            "--from-beginning",
            "--max-messages",
            &records.to_string(),
        ],
        None,
    );
    assert_eq!(consumed.lines().count(), records);
    for partition in 0..3 {
        assert_eq!(isr(&nodes[0], "copies", partition), vec![1, 2, 3]);
    }
    assert_eq!(support::stored_records(&nodes[0], "copies"), records as u64);
    // A clean stop flushes; then the three copies of each partition are the same bytes.
    for node in &mut nodes {
        node.stop();
    }
    for partition in 0..3 {
        let logs: Vec<Vec<u8>> = dirs
            .iter()
            .map(|dir| segment(dir.path(), "copies", partition))
            .collect();
        assert!(!logs[0].is_empty());
        assert!(
            logs.iter().all(|log| *log == logs[0]),
            "partition {partition} differs across replicas"
        );
        let codecs: Vec<Codec> =
            strata_wire::batch::split_batches(bytes::Bytes::from(logs[0].clone()))
                .map(|batch| batch.unwrap().codec())
                .collect();
        assert!(codecs.contains(&Codec::Lz4) && codecs.contains(&Codec::None));
    }
}

/// A follower paused past the lag time leaves the ISR; acks=all goes on with two of three;
/// after SIGCONT it catches up and rejoins. Under-replication shows in describe and metrics,
/// and each acknowledgement says how many in-sync replicas held its records: three, then two.
#[test]
fn a_paused_follower_leaves_the_isr_and_rejoins() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // A long lease: the follower must leave the ISR by lag, not by lease expiry.
    let admin_port = support::free_base_port(0);
    let admin = format!("127.0.0.1:{admin_port}");
    let nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let mut args = vec![
                "--etcd",
                &etcd.endpoint,
                "--cluster",
                "itest",
                "--node-id",
                &id,
                "--lease-ttl-ms",
                "30000",
                "--replica-lag-time-max-ms",
                "1500",
            ];
            if i == 0 {
                args.extend_from_slice(&["--admin", &admin]);
            }
            TestNode::start_with(dirs[i].path(), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    // One partition led by node 1 (the first broker in placement order for topic index 0).
    create_topic(
        &nodes,
        "lag",
        &[
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let leader = describe(&nodes[0], "lag")["partitions"][0]["leader"]
        .as_i64()
        .unwrap();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    // What each acknowledgement said of the record's durability.
    let produce_with = |line: &str, durability: &str| -> serde_json::Value {
        let printed = nodes[0].cli(
            &[
                "produce",
                "lag",
                "--acks",
                "all",
                "--durability",
                durability,
                "--print-offsets",
                "--format",
                "json",
            ],
            Some(format!("{line}\n").as_bytes()),
        );
        let acked: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
        acked["durability"].clone()
    };
    let produce = |line: &str| produce_with(line, "policy");
    let before = produce("before");
    wait_for("a full ISR", || isr(&nodes[0], "lag", 0).len() == 3);
    assert_eq!(before["replicas"], 3, "{before}");
    // Synced on the leader before the answer; the followers' syncs count as they report them.
    let synced = produce_with("synced", "synced");
    assert_eq!(synced["replicas"], 3, "{synced}");
    assert_eq!(synced["leader_synced"], true, "{synced}");
    let synced_replicas = synced["synced_replicas"].as_u64().unwrap();
    assert!((1..=3).contains(&synced_replicas), "{synced}");

    nodes[follower as usize - 1].signal(libc::SIGSTOP);
    let paused_at = std::time::Instant::now();
    wait_for("the paused follower to leave the ISR", || {
        !isr(&nodes[0], "lag", 0).contains(&follower)
    });
    println!(
        "ISR shrank {:?} after the pause (lag time 1.5 s)",
        paused_at.elapsed()
    );
    assert_eq!(
        describe(&nodes[0], "lag")["partitions"][0]["under_replicated"],
        true
    );
    if leader == 1 {
        let metrics = support::http_get(admin_port, "/metrics").1;
        assert!(
            metrics.contains("strata_under_replicated_partitions{node=\"1\",shard=\"0\"} 1"),
            "{metrics}"
        );
    }
    for i in 0..20 {
        let durability = produce(&format!("during-{i}"));
        assert_eq!(durability["replicas"], 2, "during-{i}: {durability}");
    }
    // Pause the other follower too: one in-sync replica is below min.insync.replicas = 2, so
    // acks=all is refused (NOT_ENOUGH_REPLICAS) and nothing of it is written.
    let second = (1..=3).find(|id| *id != leader && *id != follower).unwrap();
    nodes[second as usize - 1].signal(libc::SIGSTOP);
    wait_for("the ISR down to the leader", || {
        isr(&nodes[0], "lag", 0).len() == 1
    });
    let refused = nodes[0].cli_output(
        &["produce", "lag", "--acks", "all"],
        Some(b"refused\n".as_slice()),
    );
    assert!(!refused.status.success());
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains("NotEnoughReplicas"), "{reason}");
    nodes[second as usize - 1].signal(libc::SIGCONT);
    nodes[follower as usize - 1].signal(libc::SIGCONT);
    wait_for_at_most("the follower to rejoin", Duration::from_secs(20), || {
        isr(&nodes[0], "lag", 0).len() == 3
    });
    assert_eq!(
        describe(&nodes[0], "lag")["partitions"][0]["under_replicated"],
        false
    );
    assert_eq!(
        describe(&nodes[0], "lag")["partitions"][0]["high_watermark"],
        22,
        "the refused record was not written"
    );
    let consumed = nodes[0].cli(
        &["consume", "lag", "--from-beginning", "--max-messages", "22"],
        None,
    );
    assert_eq!(consumed.lines().count(), 22);
    if leader == 1 {
        // Two shrinks, then one or two expansions (the followers may rejoin in one change);
        // cluster views that merely repeat a change (the leader's own, echoed) count nothing.
        let metrics = support::http_get(admin_port, "/metrics").1;
        let changes: u64 = metrics
            .lines()
            .find(|line| {
                line.starts_with("strata_isr_changes_total{") && line.contains("topic=\"lag\"")
            })
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no ISR change counter for lag: {metrics}"));
        assert!((3..=4).contains(&changes), "{changes} ISR changes counted");
    }
}

/// What the chaos producer and consumer saw, checked against the final logs.
#[derive(Default)]
struct History {
    sent: u64,
    /// (partition, sequence) → offset the broker acknowledged.
    acked: std::collections::BTreeMap<(u32, u64), u64>,
    failed: u64,
    /// (partition, offset) → value a consumer saw during the run.
    consumed: std::collections::BTreeMap<(u32, u64), String>,
}

/// Kills -9 the leader of each of `topic`'s `partitions` in turn, `kills` times: each time
/// waits for a new leader, restarts the victim and waits for every partition's full ISR.
fn kill_leaders(nodes: &mut [TestNode], (topic, partitions): (&str, usize), kills: usize) {
    let mut killed = 0;
    while killed < kills {
        let partition = killed % partitions;
        let observer = nodes.iter().position(|node| node.is_running()).unwrap();
        let leader = describe(&nodes[observer], topic)["partitions"][partition]["leader"]
            .as_i64()
            .unwrap();
        if leader < 1 {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let victim = leader as usize - 1;
        std::thread::sleep(Duration::from_millis(700));
        nodes[victim].kill();
        killed += 1;
        let observer = (victim + 1) % 3;
        wait_for_at_most("a new leader", Duration::from_secs(15), || {
            let now = describe(&nodes[observer], topic)["partitions"][partition]["leader"]
                .as_i64()
                .unwrap();
            now > 0 && now != leader
        });
        nodes[victim].respawn();
        wait_for_at_most("the full ISR back", Duration::from_secs(30), || {
            (0..partitions).all(|p| isr(&nodes[observer], topic, p).len() == 3)
        });
    }
}

/// RF 3, acks=all, min ISR 2: a producer writes sequence-numbered records while the leader of
/// each partition in turn is killed -9 and restarted (12 kills). Afterwards every acknowledged
/// record is present exactly once, in order, at the offset it was acknowledged with; nothing a
/// consumer saw during the run vanished.
#[test]
fn acknowledged_writes_survive_leader_kills() {
    const PARTITIONS: u32 = 3;
    const KILLS: usize = 12;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = three_nodes(&etcd, &dirs, &[]);
    create_topic(
        &nodes,
        "chaos",
        &[
            "--partitions",
            "3",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let bootstrap: Vec<String> = nodes.iter().map(|node| node.bootstrap()).collect();
    let history = std::sync::Arc::new(std::sync::Mutex::new(History::default()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runtime = runtime();
    let load = {
        let history = history.clone();
        let stop = stop.clone();
        let bootstrap = bootstrap.join(",");
        runtime.spawn(async move {
            let client = Client::connect(ClientConfig::new(bootstrap.clone()))
                .await
                .unwrap();
            // No retries and one request in flight: each record is sent once, so an
            // acknowledged one can only appear once, and records land in send order.
            let producer = Producer::new(
                client.clone(),
                ProducerConfig {
                    acks: -1,
                    retries: 0,
                    max_in_flight: 1,
                    linger: Duration::from_millis(1),
                    ..ProducerConfig::default()
                },
            );
            let mut tasks = Vec::new();
            for partition in 0..PARTITIONS {
                let producer = producer.clone();
                let history = history.clone();
                let stop = stop.clone();
                tasks.push(tokio::spawn(async move {
                    let mut sequence = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let mut record = ProducerRecord::new(
                            "chaos",
                            None,
                            support::history::value(partition, sequence),
                        );
                        record.partition = Some(partition);
                        let Ok(ack) = producer.send(record).await else {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        };
                        let outcome = ack.await;
                        let failed = {
                            let mut history = history.lock().unwrap();
                            history.sent += 1;
                            match outcome {
                                Ok(ack) => {
                                    history
                                        .acked
                                        .insert((partition, sequence), ack.offset as u64);
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
                        sequence += 1;
                    }
                }));
            }
            // A consumer reading along: what it sees must never vanish.
            let mut consumer = strata_client::Consumer::new(client, Default::default());
            let partitions: Vec<u32> = (0..PARTITIONS).collect();
            while consumer
                .assign("chaos", &partitions, strata_client::SeekTo::Beginning)
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match consumer.poll().await {
                    Ok(batches) => {
                        let seen = support::history::seen(&batches)
                            .map(|(_, partition, offset, value)| ((partition, offset), value));
                        history.lock().unwrap().consumed.extend(seen);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };

    kill_leaders(&mut nodes, ("chaos", PARTITIONS as usize), KILLS);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    runtime.block_on(load).unwrap();

    // The final logs, read from the leaders up to the high watermark.
    let final_logs = runtime.block_on(support::history::read_to_end(
        &bootstrap.join(","),
        "chaos",
        PARTITIONS,
    ));
    let history = history.lock().unwrap();
    let mut present = 0;
    for (partition, log) in final_logs.iter().enumerate() {
        let partition = partition as u32;
        let acked = history
            .acked
            .range((partition, 0)..(partition + 1, 0))
            .map(|((_, sequence), offset)| (*sequence, *offset));
        let consumed = history
            .consumed
            .range((partition, 0)..(partition + 1, 0))
            .map(|((_, offset), value)| (*offset, value));
        present += support::history::check_partition("chaos", partition, log, acked, consumed);
    }
    println!(
        "{KILLS} leader kills: sent {}, acknowledged {}, failed {}, consumed during the run {}, in the final logs {present} ({} unacknowledged but written)",
        history.sent,
        history.acked.len(),
        history.failed,
        history.consumed.len(),
        present - history.acked.len(),
    );
    assert!(history.acked.len() > 1000, "the producer made progress");
}

/// A leader that appended records nobody else has (its followers were paused), then died,
/// truncates them when it comes back as a follower of the new leader: afterwards its log is
/// the new leader's, byte for byte.
#[test]
fn a_diverged_old_leader_truncates_when_it_rejoins() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let args = [
                "--etcd",
                &etcd.endpoint,
                "--cluster",
                "itest",
                "--node-id",
                &id,
                "--lease-ttl-ms",
                "3000",
                // Caught-up followers long-poll a quarter of this: 500 ms.
                "--replica-lag-time-max-ms",
                "2000",
            ];
            TestNode::start_with(dirs[i].path(), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    create_topic(
        &nodes,
        "split",
        &[
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let old = describe(&nodes[0], "split")["partitions"][0]["leader"]
        .as_i64()
        .unwrap() as usize;
    let followers: Vec<usize> = (1..=3).filter(|id| *id != old).collect();
    let committed: String = (0..50).map(|i| format!("committed-{i}\n")).collect();
    nodes[old - 1].cli(
        &["produce", "split", "--acks", "all"],
        Some(committed.as_bytes()),
    );

    // Followers paused (briefly: their leases outlive it): the leader appends alone.
    for id in &followers {
        nodes[id - 1].signal(libc::SIGSTOP);
    }
    // Past the followers' pending long-polls (500 ms): no fetch is waiting at the leader to
    // carry the next records out.
    std::thread::sleep(Duration::from_millis(800));
    let lonely: String = (0..30).map(|i| format!("uncommitted-{i}\n")).collect();
    nodes[old - 1].cli(
        &["produce", "split", "--acks", "1"],
        Some(lonely.as_bytes()),
    );
    nodes[old - 1].kill();
    for id in &followers {
        nodes[id - 1].signal(libc::SIGCONT);
    }
    let observer = followers[0] - 1;
    wait_for("a new leader", || {
        let leader = describe(&nodes[observer], "split")["partitions"][0]["leader"]
            .as_i64()
            .unwrap();
        leader > 0 && leader as usize != old
    });
    let after: String = (0..40).map(|i| format!("new-epoch-{i}\n")).collect();
    nodes[observer].cli(
        &["produce", "split", "--acks", "all"],
        Some(after.as_bytes()),
    );

    // The old leader comes back: it must drop its 30 lonely records and take the new ones.
    nodes[old - 1].respawn();
    wait_for_at_most(
        "the old leader back in the ISR",
        Duration::from_secs(20),
        || isr(&nodes[observer], "split", 0).len() == 3,
    );
    let consumed = nodes[observer].cli(
        &[
            "consume",
            "split",
            "--from-beginning",
            "--max-messages",
            "90",
        ],
        None,
    );
    assert!(!consumed.contains("uncommitted"), "{consumed}");
    assert_eq!(consumed.lines().count(), 90);
    for node in &mut nodes {
        node.stop();
    }
    let logs: Vec<Vec<u8>> = dirs
        .iter()
        .map(|dir| segment(dir.path(), "split", 0))
        .collect();
    assert!(
        logs.iter().all(|log| *log == logs[0]),
        "the replicas' logs differ"
    );
    let text = String::from_utf8_lossy(&logs[old - 1]);
    assert!(
        !text.contains("uncommitted"),
        "the old leader kept its diverged records"
    );
}

fn replicas(node: &TestNode, topic: &str, partition: usize) -> Vec<i64> {
    describe(node, topic)["partitions"][partition]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_i64().unwrap())
        .collect()
}

/// `topic reassign`: raising the replication factor from 1 to 3 (the new replicas catch up
/// before they join the ISR), then moving the partition off its first broker (leadership moves
/// with it, the data stays whole, the dropped replica's files go).
#[test]
fn reassignment_raises_the_replication_factor_and_moves_replicas() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = three_nodes(&etcd, &dirs, &[]);
    create_topic(&nodes, "grow", &["--partitions", "1"]);
    let first = replicas(&nodes[0], "grow", 0)[0];
    // 24 MB: a new replica catches up over several fetches, each sent while the previous
    // answer is written.
    let padding = "x".repeat(12_000);
    let lines: String = (0..2_000)
        .map(|i| format!("record-{i}-{padding}\n"))
        .collect();
    nodes[0].cli(&["produce", "grow"], Some(lines.as_bytes()));

    let others: Vec<i64> = (1..=3).filter(|id| *id != first).collect();
    let all = format!("{first},{},{}", others[0], others[1]);
    nodes[0].cli(&["topic", "reassign", "grow", "--replicas", &all], None);
    wait_for_at_most("three in-sync replicas", Duration::from_secs(20), || {
        replicas(&nodes[0], "grow", 0).len() == 3 && isr(&nodes[0], "grow", 0).len() == 3
    });
    assert_eq!(
        describe(&nodes[0], "grow")["partitions"][0]["target_replicas"],
        serde_json::Value::Null
    );
    // acks=all now waits for three copies.
    nodes[0].cli(
        &["produce", "grow", "--acks", "all"],
        Some(b"after-growing\n"),
    );

    // Move off the first broker (it leads): leadership moves to an in-sync new replica.
    let moved = format!("{},{}", others[0], others[1]);
    nodes[0].cli(&["topic", "reassign", "grow", "--replicas", &moved], None);
    wait_for_at_most(
        "the first broker to be dropped",
        Duration::from_secs(20),
        || replicas(&nodes[0], "grow", 0) == others,
    );
    let leader = describe(&nodes[0], "grow")["partitions"][0]["leader"]
        .as_i64()
        .unwrap();
    assert!(
        others.contains(&leader),
        "leader {leader} is one of {others:?}"
    );
    wait_for(
        "the new leader's high watermark to cover every record",
        || describe(&nodes[0], "grow")["partitions"][0]["high_watermark"].as_u64() == Some(2001),
    );
    let consumed = nodes[0].cli(
        &[
            "consume",
            "grow",
            "--from-beginning",
            "--max-messages",
            "2001",
        ],
        None,
    );
    assert_eq!(consumed.lines().count(), 2001);
    assert!(consumed.contains("after-growing"));
    let dropped = dirs[first as usize - 1].path().join("grow-0");
    wait_for("the dropped replica's files to go", || !dropped.exists());
}

/// A one-partition topic on one of two brokers holding about 8 MB: (its broker, the other
/// broker, the bytes produced).
/// A broker per directory on `etcd`, each with an admin port (returned in the same order), once
/// the first sees them all registered.
fn nodes_with_admin(
    etcd: &EtcdServer,
    dirs: &[tempfile::TempDir],
    extra: &[&str],
) -> (Vec<TestNode>, Vec<u16>) {
    let admins: Vec<u16> = dirs.iter().map(|_| support::free_base_port(0)).collect();
    let nodes: Vec<TestNode> = dirs
        .iter()
        .zip(&admins)
        .enumerate()
        .map(|(i, (dir, admin))| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(etcd, &id);
            let admin = format!("127.0.0.1:{admin}");
            args.extend_from_slice(&["--admin", &admin]);
            args.extend_from_slice(extra);
            TestNode::start_with(dir.path(), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    (nodes, admins)
}

/// A histogram's `(count, sum)` on a node's `/metrics`.
fn histogram_totals(admin: u16, name: &str) -> (f64, f64) {
    let metrics = support::http_get(admin, "/metrics").1;
    let value = |suffix: &str| {
        let prefix = format!("{name}_{suffix}{{");
        metrics
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    (value("count"), value("sum"))
}

/// Replication latency is timed from the leader's append to each follower holding the records:
/// followers idling in long-polls between sparse records add nothing to it, where their own
/// fetch round trips (`strata_replica_fetch_latency_seconds`) include those waits.
#[test]
fn replication_latency_is_timed_from_the_leaders_append() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, admins) = nodes_with_admin(&etcd, &dirs, &[]);
    create_topic(
        &nodes,
        "sparse",
        &["--partitions", "1", "--replication-factor", "3"],
    );
    wait_for("three in-sync replicas", || {
        isr(&nodes[0], "sparse", 0).len() == 3
    });
    let leader = describe(&nodes[0], "sparse")["partitions"][0]["leader"]
        .as_i64()
        .unwrap() as usize;
    let records = 12;
    runtime().block_on(async {
        let client = Client::connect(ClientConfig::new(nodes[0].bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(
            client,
            ProducerConfig {
                acks: -1,
                ..ProducerConfig::default()
            },
        );
        for i in 0..records {
            let ack = producer
                .send(ProducerRecord::new("sparse", None, format!("v{i}")))
                .await
                .unwrap();
            ack.await.unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let (count, sum) = histogram_totals(admins[leader - 1], "strata_replication_latency_seconds");
    assert!(
        count >= records as f64,
        "{count} samples for {records} records on 2 followers"
    );
    let mean = sum / count;
    assert!(mean < 0.05, "mean replication latency {mean} s");
    // The followers' fetches waited for each next record: their round trips are long-polls.
    let (fetches, fetch_seconds) = admins
        .iter()
        .enumerate()
        .filter(|(i, _)| i + 1 != leader)
        .map(|(_, admin)| histogram_totals(*admin, "strata_replica_fetch_latency_seconds"))
        .fold((0.0, 0.0), |(a, b), (c, d)| (a + c, b + d));
    assert!(fetches > 0.0);
    assert!(
        fetch_seconds / fetches > 0.1,
        "mean follower fetch {} s",
        fetch_seconds / fetches
    );
}

fn one_replica_with_a_backlog(nodes: &[TestNode], topic: &str) -> (i64, i64, usize) {
    create_topic(nodes, topic, &["--partitions", "1"]);
    let leader = replicas(&nodes[0], topic, 0)[0];
    let padding = "x".repeat(12_000);
    let lines: String = (0..650)
        .map(|i| format!("record-{i}-{padding}\n"))
        .collect();
    nodes[0].cli(&["produce", topic], Some(lines.as_bytes()));
    (leader, 3 - leader, lines.len())
}

/// `--replica-recovery-bytes-per-sec`: a new replica's catch-up goes no faster than the limit
/// (it joins the ISR only after the backlog could have moved at that rate), the leader counts
/// the time it held answers, and in-sync followers are not held: `acks=all` answers at once.
#[test]
fn catch_up_keeps_to_the_recovery_limit() {
    const RATE: u64 = 2_000_000;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let rate = RATE.to_string();
    let (nodes, admins) =
        nodes_with_admin(&etcd, &dirs, &["--replica-recovery-bytes-per-sec", &rate]);
    // 4 s at the limit, a fraction of a second without it.
    let (leader, follower, backlog) = one_replica_with_a_backlog(&nodes, "held");
    let backlog = backlog as f64;

    let started = std::time::Instant::now();
    let both = format!("{leader},{follower}");
    nodes[0].cli(&["topic", "reassign", "held", "--replicas", &both], None);
    // The leader shows how far behind the new replica is while it catches up.
    let leader_admin = admins[leader as usize - 1];
    let lag_series = format!(
        "strata_replica_lag_records{{node=\"{leader}\",topic=\"held\",partition=\"0\",replica=\"{follower}\"}}"
    );
    let replica_lag = || -> Option<u64> {
        support::http_get(leader_admin, "/metrics")
            .1
            .lines()
            .find_map(|line| line.strip_prefix(&lag_series))
            .map(|value| value.trim().parse().unwrap())
    };
    let mut most_behind = 0;
    wait_for_at_most("two in-sync replicas", Duration::from_secs(60), || {
        most_behind = most_behind.max(replica_lag().unwrap_or(0));
        isr(&nodes[0], "held", 0).len() == 2
    });
    let took = started.elapsed().as_secs_f64();
    assert!(
        most_behind >= 100,
        "the catch-up's lag was seen: {most_behind} records at most"
    );
    wait_for("the new replica's lag to reach zero", || {
        replica_lag() == Some(0)
    });
    // The bucket starts full (64 KiB at this rate); the rest waits for the limit.
    let least = (backlog - 65_536.0) / RATE as f64;
    assert!(
        took >= least * 0.9,
        "{backlog} bytes caught up in {took:.2} s: faster than {RATE} B/s allows ({least:.2} s)"
    );
    let metrics = support::http_get(admins[leader as usize - 1], "/metrics").1;
    let held: f64 = metrics
        .lines()
        .find(|line| line.starts_with("strata_replica_recovery_throttled_seconds_total{"))
        .and_then(|line| line.rsplit_once(' '))
        .map(|(_, value)| value.parse().unwrap())
        .expect("the leader exports the held time");
    assert!(held >= least * 0.5, "held {held} s of {took:.2} s");

    // In sync now: the follower is not held, so 6 MB with acks=all takes well under the 3 s
    // the limit would ask.
    let padding = "x".repeat(12_000);
    let more: String = (0..500)
        .map(|i| format!("in-sync-{i}-{padding}\n"))
        .collect();
    let acked = std::time::Instant::now();
    nodes[0].cli(&["produce", "held", "--acks", "all"], Some(more.as_bytes()));
    assert!(
        acked.elapsed() < Duration::from_millis(1_500),
        "acks=all of {} bytes took {:?}",
        more.len(),
        acked.elapsed()
    );
}

/// `topic reassign --throttle`: the topic's own catch-up limit (`replica.recovery.bytes.per.sec`)
/// holds the new replica back while it is set, and lifting it with `topic alter` lets the
/// catch-up finish at once, with no broker restarted.
#[test]
fn a_reassignments_throttle_holds_its_catch_up_until_lifted() {
    const RATE: u64 = 1_000_000;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = etcd_nodes(&etcd, &dirs, &[]);
    wait_for_brokers(&nodes);
    // 8 s at the limit.
    let (leader, follower, backlog) = one_replica_with_a_backlog(&nodes, "lifted");
    let at_the_limit = Duration::from_secs_f64(backlog as f64 / RATE as f64);

    let started = std::time::Instant::now();
    let both = format!("{leader},{follower}");
    let rate = RATE.to_string();
    nodes[0].cli(
        &[
            "topic",
            "reassign",
            "lifted",
            "--replicas",
            &both,
            "--throttle",
            &rate,
        ],
        None,
    );
    let setting = |node: &TestNode| {
        describe(node, "lifted")["config"]["replica.recovery.bytes.per.sec"].clone()
    };
    assert_eq!(setting(&nodes[0]), serde_json::json!(rate));
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        isr(&nodes[0], "lifted", 0),
        vec![leader],
        "the new replica is still catching up at the limit"
    );
    nodes[0].cli(
        &[
            "topic",
            "alter",
            "lifted",
            "--delete-config",
            "replica.recovery.bytes.per.sec",
        ],
        None,
    );
    wait_for_at_most("two in-sync replicas", Duration::from_secs(60), || {
        isr(&nodes[0], "lifted", 0).len() == 2
    });
    assert!(
        started.elapsed() < at_the_limit * 3 / 4,
        "the catch-up took {:?} after the limit was lifted; {at_the_limit:?} at the limit",
        started.elapsed()
    );
    assert_eq!(setting(&nodes[0]), serde_json::json!("-1"));
}

/// Writes a CA and a node certificate (for 127.0.0.1) signed by it into `dir`.
fn write_tls(dir: &Path, ca: &(rcgen::Certificate, rcgen::KeyPair)) -> [String; 3] {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca.0, &ca.1).unwrap();
    let paths = [
        dir.join("node.pem"),
        dir.join("node.key"),
        dir.join("ca.pem"),
    ];
    std::fs::write(&paths[0], cert.pem()).unwrap();
    std::fs::write(&paths[1], key.serialize_pem()).unwrap();
    std::fs::write(&paths[2], ca.0.pem()).unwrap();
    paths.map(|path| path.display().to_string())
}

fn certificate_authority() -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    (params.self_signed(&key).unwrap(), key)
}

/// `--tls-cert/--tls-key/--tls-ca`: mutual TLS on replication links. Two nodes with
/// certificates from the cluster's CA replicate; a third with a certificate from another CA
/// never gets a byte, so it never joins the ISR.
#[test]
fn replication_with_real_certificates_refuses_a_foreign_one() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let cluster_ca = certificate_authority();
    let foreign_ca = certificate_authority();
    let tls: Vec<[String; 3]> = (0..3)
        .map(|i| {
            write_tls(
                dirs[i].path(),
                if i < 2 { &cluster_ca } else { &foreign_ca },
            )
        })
        .collect();
    let nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(&etcd, &id);
            args.extend_from_slice(&[
                "--tls-cert",
                &tls[i][0],
                "--tls-key",
                &tls[i][1],
                "--tls-ca",
                &tls[i][2],
            ]);
            // Data under a subfolder: the certificates live in the temp dir's root.
            TestNode::start_with(&dirs[i].path().join("data"), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    create_topic(&nodes, "secure", &["--partitions", "1"]);
    // Put the partition on the two trusted brokers, then on all three.
    nodes[0].cli(&["topic", "reassign", "secure", "--replicas", "1,2"], None);
    wait_for_at_most(
        "two in-sync replicas over mutual TLS",
        Duration::from_secs(20),
        || isr(&nodes[0], "secure", 0) == vec![1, 2],
    );
    nodes[0].cli(&["produce", "secure", "--acks", "all"], Some(b"sealed\n"));
    nodes[0].cli(
        &["topic", "reassign", "secure", "--replicas", "1,2,3"],
        None,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        isr(&nodes[0], "secure", 0),
        vec![1, 2],
        "the foreign certificate was accepted"
    );
    assert!(
        std::fs::read(
            dirs[2]
                .path()
                .join("data/secure-0/00000000000000000000.log")
        )
        .map_or(true, |log| log.is_empty()),
        "the foreign node received records"
    );
}

/// With every in-sync replica gone, a partition stays leaderless, unless its topic says
/// `unclean.leader.election=true`: then a live replica from outside the ISR takes over (and
/// the records only the old leader had are lost, which is what the setting accepts).
#[test]
fn unclean_election_only_where_the_topic_allows_it() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<TestNode> = (0..2)
        .map(|i| {
            let id = (i + 1).to_string();
            TestNode::start_with(dirs[i].path(), 1, &etcd_args(&etcd, &id))
        })
        .collect();
    wait_for_brokers(&nodes);
    let flags = ["--partitions", "2", "--replication-factor", "2"];
    create_topic(&nodes, "clean", &flags);
    let mut unclean_flags = flags.to_vec();
    unclean_flags.extend_from_slice(&["--config", "unclean.leader.election=true"]);
    create_topic(&nodes, "unclean", &unclean_flags);
    // The partition of each topic that broker 1 leads.
    let led_by_one = |topic: &str| {
        describe(&nodes[0], topic)["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .position(|p| p["leader"] == 1)
            .unwrap()
    };
    let (clean, unclean) = (led_by_one("clean"), led_by_one("unclean"));
    wait_for("full ISRs", || {
        isr(&nodes[0], "clean", clean).len() == 2 && isr(&nodes[0], "unclean", unclean).len() == 2
    });
    // Broker 2 dies: it leaves the ISRs; broker 1 goes on alone, then dies too.
    nodes[1].kill();
    wait_for_at_most("broker 2 out of the ISRs", Duration::from_secs(10), || {
        isr(&nodes[0], "clean", clean) == vec![1] && isr(&nodes[0], "unclean", unclean) == vec![1]
    });
    nodes[0].kill();
    // Broker 2 comes back: it is live, but in neither ISR.
    nodes[1].respawn();
    wait_for_at_most(
        "the unclean topic to elect broker 2",
        Duration::from_secs(15),
        || describe(&nodes[1], "unclean")["partitions"][unclean]["leader"] == 2,
    );
    let clean_state = &describe(&nodes[1], "clean")["partitions"][clean];
    assert_eq!(
        clean_state["leader"], -1,
        "a clean topic stays leaderless: {clean_state}"
    );
    assert_eq!(isr(&nodes[1], "unclean", unclean), vec![2]);
    // The unclean partition takes writes again.
    let mut produce = vec!["produce", "unclean", "--acks", "1", "--partition"];
    let index = unclean.to_string();
    produce.push(&index);
    nodes[1].cli(&produce, Some(b"after an unclean election\n"));
}

/// `--replication` on an address of its own (another loopback address standing in for a
/// separate replication network): brokers advertise it and followers dial it, not the client
/// host. Before, the address was bound but never told, so followers never reached their leader.
#[test]
fn followers_reach_leaders_on_their_own_replication_address() {
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let replication = format!("127.0.0.{}:{}", i + 2, support::free_base_port(1));
            let mut args = etcd_args(&etcd, &id);
            args.extend_from_slice(&["--replication", &replication]);
            TestNode::start_with(dirs[i].path(), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    create_topic(
        &nodes,
        "apart",
        &[
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "3",
        ],
    );
    let lines: String = (0..10).map(|i| format!("r{i}\n")).collect();
    // acks=all with min.insync.replicas=3: answered only once both followers have the records.
    nodes[0].cli(
        &["produce", "apart", "--acks", "all"],
        Some(lines.as_bytes()),
    );
    assert_eq!(
        describe(&nodes[0], "apart")["partitions"][0]["high_watermark"],
        10
    );
    assert_eq!(isr(&nodes[0], "apart", 0).len(), 3);
}

/// Keyed records over many partitions at full speed with acks=all: the producer puts several
/// batches of one partition into one request, and the broker registers their waits for the
/// high watermark in whatever order their tasks run. Every record is acknowledged, once. (An
/// assertion that waits came in log order turned such requests into panics, never answered:
/// clients timed out after 30 s and sent the batches again.)
#[test]
fn keyed_records_over_many_partitions_are_all_acknowledged_once() {
    const RECORDS: usize = 40_000;
    const PARTITIONS: u32 = 48;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = three_nodes(&etcd, &dirs, &[]);
    create_topic(
        &nodes,
        "spread",
        &[
            "--partitions",
            &PARTITIONS.to_string(),
            "--replication-factor",
            "3",
        ],
    );
    let runtime = runtime();
    runtime.block_on(async {
        let mut config = ClientConfig::new(nodes[0].bootstrap());
        config.request_timeout = Duration::from_secs(10);
        let client = Client::connect(config).await.unwrap();
        // Without retries, the records must find every partition led. The cluster state names
        // a leader (and a full ISR) before the leader's shard has taken the role up: one
        // record per partition, with retries, proves every leader serves first.
        let warm_up = Producer::new(
            client.clone(),
            ProducerConfig {
                acks: -1,
                ..ProducerConfig::default()
            },
        );
        let mut served = Vec::new();
        for partition in 0..PARTITIONS {
            let mut record = ProducerRecord::new("spread", None, vec![1u8]);
            record.partition = Some(partition);
            served.push(warm_up.send(record).await.unwrap());
        }
        for ack in served {
            ack.await.unwrap();
        }
        let producer = Producer::new(
            client,
            ProducerConfig {
                acks: -1,
                retries: 0,
                ..ProducerConfig::default()
            },
        );
        let mut acks = Vec::with_capacity(RECORDS);
        for i in 0..RECORDS {
            let record =
                ProducerRecord::new("spread", Some(format!("k{i}").into()), vec![7u8; 100]);
            acks.push(producer.send(record).await.unwrap());
        }
        for (i, ack) in acks.into_iter().enumerate() {
            if let Err(error) = ack.await {
                panic!("record {i} failed: {error}");
            }
        }
    });
    assert_eq!(
        support::stored_records(&nodes[1], "spread"),
        (RECORDS + PARTITIONS as usize) as u64
    );
}

/// Conditional appends through leader failover, checked as a model over the history: two
/// idempotent writers share one RF 3 partition (acks=all, min ISR 2), each appending at the
/// log end it last learnt (from its own win, a refusal, or ListOffsets after an unknown
/// outcome) while the partition's leader is killed -9 and restarted. Every record names the
/// offset its writer expected: in the final log each sits exactly there (no record ever
/// landed elsewhere, whatever happened to its request), the log has no gap and no record
/// twice, and every acknowledged win is there at its offset.
#[test]
fn conditional_appends_hold_their_offsets_through_leader_kills() {
    const KILLS: usize = 4;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = three_nodes(&etcd, &dirs, &[]);
    create_topic(
        &nodes,
        "cas",
        &[
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let bootstrap: Vec<String> = nodes.iter().map(|node| node.bootstrap()).collect();
    let wins = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runtime = runtime();
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let (wins, stop, bootstrap) = (wins.clone(), stop.clone(), bootstrap.join(","));
            runtime.spawn(async move {
                let client = Client::connect(ClientConfig::new(bootstrap)).await.unwrap();
                let producer = Producer::new(
                    client.clone(),
                    ProducerConfig {
                        acks: -1,
                        idempotent: true,
                        linger: Duration::ZERO,
                        ..ProducerConfig::default()
                    },
                );
                let mut end = 0u64;
                let mut attempt = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    attempt += 1;
                    let value = format!("w{writer}-{attempt}@{end}");
                    match producer
                        .send_if("cas", 0, end, &[(None, value.as_bytes())])
                        .await
                    {
                        Ok(landed) => {
                            let offset = landed.offset as u64;
                            assert_eq!(offset, end, "{value} won somewhere else");
                            wins.lock().unwrap().push((value, offset));
                            end += 1;
                        }
                        Err(strata_client::ClientError::LogEndMismatch { log_end, .. }) => {
                            end = log_end;
                        }
                        // An unknown outcome (the leader died under it): learn the end again.
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            if let Ok(Some(latest)) = client
                                .list_offset("cas", 0, strata_wire::protocol::LATEST_TIMESTAMP)
                                .await
                            {
                                end = latest;
                            }
                        }
                    }
                }
            })
        })
        .collect();

    kill_leaders(&mut nodes, ("cas", 1), KILLS);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        runtime.block_on(writer).unwrap();
    }

    let log = runtime.block_on(support::history::read_to_end(
        &bootstrap.join(","),
        "cas",
        1,
    ));
    let log = &log[0];
    let mut values = std::collections::BTreeSet::new();
    for (at, (offset, value)) in log.iter().enumerate() {
        assert_eq!(*offset, at as u64, "no gap before {value}");
        let expected: u64 = value.rsplit_once('@').unwrap().1.parse().unwrap();
        assert_eq!(expected, *offset, "{value} landed at {offset}");
        assert!(values.insert(value.clone()), "{value} twice");
    }
    let wins = wins.lock().unwrap();
    for (value, offset) in wins.iter() {
        assert_eq!(
            log.get(*offset as usize).map(|(_, v)| v),
            Some(value),
            "the acknowledged win {value} at {offset}"
        );
    }
    println!(
        "{KILLS} leader kills: {} acknowledged wins, {} records in the log",
        wins.len(),
        log.len()
    );
    assert!(wins.len() > 100, "the writers made progress");
}

/// RF 3, Kafka batches: a Kafka producer (librdkafka, zstd, idempotent, acks=all) writes
/// while the leader of each partition in turn is killed -9 and restarted. Every acknowledged
/// record is read back once, at its offset, and the three replicas of each partition end
/// byte-identical: followers copied the Kafka batches as the leader stored them.
#[test]
fn kafka_batches_stay_byte_identical_across_replicas_through_leader_kills() {
    const PARTITIONS: usize = 2;
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let kafka_ports: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", support::free_base_port(0)))
        .collect();
    let mut nodes: Vec<TestNode> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(&etcd, &id);
            args.extend_from_slice(&["--kafka-listen", &kafka_ports[i]]);
            TestNode::start_with(dir.path(), 1, &args)
        })
        .collect();
    wait_for_brokers(&nodes);
    create_topic(
        &nodes,
        "kafka-copies",
        &[
            "--partitions",
            &PARTITIONS.to_string(),
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
    );
    let stop_file = dirs[0].path().join("stop-producing");
    let producer = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/kafka_compat/confluent.py"
        ))
        .args(["produce_until", &kafka_ports.join(","), "kafka-copies"])
        .arg(&stop_file)
        .arg("zstd")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("python3 with confluent-kafka (scripts/test.sh installs it)");
    wait_for("records on every partition", || {
        (0..PARTITIONS).all(|partition| {
            describe(&nodes[0], "kafka-copies")["partitions"][partition]["high_watermark"]
                .as_i64()
                .is_some_and(|high| high > 100)
        })
    });
    kill_leaders(&mut nodes, ("kafka-copies", PARTITIONS), 4);
    std::fs::write(&stop_file, b"").unwrap();
    let output = producer.wait_with_output().unwrap();
    assert!(output.status.success(), "the producer failed");
    let produced: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let acked = produced["acked"].as_array().unwrap();
    assert!(acked.len() > 1000, "{} acknowledged", acked.len());
    // The leaders' logs no longer grow: every replica holds as many batch bytes as the
    // others before the logs are compared.
    let batch_bytes = |log: &[u8]| {
        let mut at = 0;
        while let Ok(header) = strata_wire::BatchHeader::parse(&log[at..]) {
            if at + header.batch_len as usize > log.len() {
                break;
            }
            at += header.batch_len as usize;
        }
        at
    };
    wait_for_at_most("every replica caught up", Duration::from_secs(30), || {
        (0..PARTITIONS as u32).all(|partition| {
            let held: Vec<usize> = dirs
                .iter()
                .map(|dir| batch_bytes(&segment(dir.path(), "kafka-copies", partition)))
                .collect();
            held.iter().all(|bytes| *bytes == held[0])
        })
    });
    let read = nodes[1].cli(
        &[
            "consume",
            "kafka-copies",
            "--from-beginning",
            "--format",
            "json",
            "--max-messages",
            &acked.len().to_string(),
        ],
        None,
    );
    let stored: std::collections::BTreeMap<(u64, u64), String> = read
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                (
                    record["partition"].as_u64().unwrap(),
                    record["offset"].as_u64().unwrap(),
                ),
                record["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for record in acked {
        let at = (record[0].as_u64().unwrap(), record[1].as_u64().unwrap());
        assert_eq!(
            stored.get(&at).map(String::as_str),
            record[2].as_str(),
            "{at:?}"
        );
    }
    let values: std::collections::BTreeSet<&String> = stored.values().collect();
    assert_eq!(values.len(), stored.len(), "a record stored twice");
    for node in &mut nodes {
        node.stop();
    }
    for partition in 0..PARTITIONS as u32 {
        let logs: Vec<Vec<u8>> = dirs
            .iter()
            .map(|dir| segment(dir.path(), "kafka-copies", partition))
            .collect();
        assert!(
            logs.iter().all(|log| *log == logs[0]),
            "partition {partition} differs across replicas"
        );
        let batches: Vec<strata_wire::Batch> =
            strata_wire::batch::split_batches(bytes::Bytes::from(logs[0].clone()))
                .collect::<Result<_, _>>()
                .unwrap();
        assert!(
            batches.iter().any(|batch| batch.header().kafka_codec()
                == Ok(strata_wire::batch::kafka::KafkaCodec::Zstd))
        );
    }
}
