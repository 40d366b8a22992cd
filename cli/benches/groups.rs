//! Consumer groups, measured on a real 3-broker cluster (etcd) on the host running the bench.
//!
//! `cargo bench -p strata-cli --bench groups -- [--members N] [--partitions N]`
//!
//! 1. Rebalance time: N members (default 10) join a group on a topic of P partitions (default
//!    100) at once; time until every partition is owned and the group is settled. Then one more
//!    member joins, then one leaves cleanly: time until settled again.
//! 2. Crash to consumption: a `strata consume --group` process owning partitions is killed -9
//!    while a producer writes; time until the other members consume its partitions again
//!    (session timeouts 3 s and 10 s).
//! 3. Offset commits through etcd: commits/s from 8 concurrent committers, with 1 and with 100
//!    partitions per commit (one transaction each), on the etcd cluster and on one node's
//!    embedded store.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_client::{
    Client, ClientConfig, GroupConfig, GroupConsumer, OffsetReset, Producer, ProducerConfig,
    ProducerRecord,
};
use strata_coordinator::testing::EtcdServer;

#[path = "../tests/support/mod.rs"]
mod support;

use support::{TestNode, etcd_args, strata};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut members = 10usize;
    let mut partitions = 100u32;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--members" => members = args.next().unwrap().parse().unwrap(),
            "--partitions" => partitions = args.next().unwrap().parse().unwrap(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let etcd = EtcdServer::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<TestNode> = (0..3)
        .map(|i| TestNode::start_with(dirs[i].path(), 1, &etcd_args(&etcd, &(i + 1).to_string())))
        .collect();
    println!("# 3 brokers (1 shard each) + etcd on one machine");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(rebalance_time(&nodes[0], members, partitions));
    for session_ms in [3000u64, 10_000] {
        runtime.block_on(crash_to_consumption(&nodes[0], session_ms));
    }
    runtime.block_on(commit_rate(&nodes[0], "3 brokers, etcd"));
    drop(nodes);
    let data = tempfile::tempdir().unwrap();
    let single = TestNode::start(data.path(), 1);
    runtime.block_on(commit_rate(&single, "1 node, embedded store"));
}

fn config(group: &str, session: Duration) -> GroupConfig {
    let mut config = GroupConfig::new(group);
    config.session_timeout = session;
    config.auto_offset_reset = OffsetReset::Earliest;
    config.consumer.max_wait = Duration::from_millis(50);
    config
}

/// Polls every member until `settled` holds for the assignments, returning the time taken.
async fn poll_until(
    members: &mut [GroupConsumer],
    mut settled: impl FnMut(&[BTreeSet<(String, u32)>]) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let assignments: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        if settled(&assignments) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "never settled"
        );
        let polls = members.iter_mut().map(|member| member.poll());
        for result in futures_util::future::join_all(polls).await {
            result.unwrap();
        }
    }
}

fn balanced(partitions: u32) -> impl FnMut(&[BTreeSet<(String, u32)>]) -> bool {
    move |assignments| {
        let total: usize = assignments.iter().map(BTreeSet::len).sum();
        let all: BTreeSet<_> = assignments.iter().flatten().collect();
        let (min, max) = (
            assignments.iter().map(BTreeSet::len).min().unwrap_or(0),
            assignments.iter().map(BTreeSet::len).max().unwrap_or(0),
        );
        total == partitions as usize && all.len() == total && max - min <= 1
    }
}

async fn rebalance_time(node: &TestNode, members: usize, partitions: u32) {
    let client = Client::connect(ClientConfig::new(node.bootstrap()))
        .await
        .unwrap();
    client
        .create_topic("rebalance", partitions, 1, &[])
        .await
        .unwrap();
    let started = Instant::now();
    let joins = (0..members).map(|_| {
        GroupConsumer::subscribe(
            client.clone(),
            vec!["rebalance".into()],
            config("r", Duration::from_secs(10)),
        )
    });
    let mut group: Vec<GroupConsumer> = futures_util::future::join_all(joins)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let joined = started.elapsed();
    let settled = poll_until(&mut group, balanced(partitions)).await;
    println!(
        "rebalance: {members} members join a {partitions}-partition topic at once: settled {:.0} ms after the first join ({:.0} ms to join)",
        (joined + settled).as_secs_f64() * 1e3,
        joined.as_secs_f64() * 1e3
    );
    group.push(
        GroupConsumer::subscribe(
            client.clone(),
            vec!["rebalance".into()],
            config("r", Duration::from_secs(10)),
        )
        .await
        .unwrap(),
    );
    let added = poll_until(&mut group, balanced(partitions)).await;
    println!(
        "rebalance: member {} joins: settled in {:.0} ms",
        members + 1,
        added.as_secs_f64() * 1e3
    );
    group.pop().unwrap().close().await.unwrap();
    let removed = poll_until(&mut group, balanced(partitions)).await;
    println!(
        "rebalance: a member leaves cleanly: settled in {:.0} ms",
        removed.as_secs_f64() * 1e3
    );
    for member in group {
        member.close().await.unwrap();
    }
}

async fn crash_to_consumption(node: &TestNode, session_ms: u64) {
    let client = Client::connect(ClientConfig::new(node.bootstrap()))
        .await
        .unwrap();
    let topic = format!("crash-{session_ms}");
    let group = format!("crash-{session_ms}");
    client.create_topic(&topic, 12, 1, &[]).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (client, topic, stop) = (client.clone(), topic.clone(), stop.clone());
        tokio::spawn(async move {
            let producer = Producer::new(client, ProducerConfig::default());
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..120 {
                    let _ = producer
                        .send(ProducerRecord::new(topic.as_str(), None, "x"))
                        .await;
                }
                let _ = producer.flush().await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let session = Duration::from_millis(session_ms);
    let mut survivors = Vec::new();
    for _ in 0..2 {
        survivors.push(
            GroupConsumer::subscribe(client.clone(), vec![topic.clone()], config(&group, session))
                .await
                .unwrap(),
        );
    }
    poll_until(&mut survivors, balanced(12)).await;
    // The victim: a separate process, so it can die without a word.
    let mut victim = strata()
        .args(["consume", &topic, "--group", &group, "--format", "json"])
        .args(["--session-timeout-ms", &session_ms.to_string()])
        .env("STRATA_BOOTSTRAP", node.bootstrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let victim_partitions = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let printed = Arc::new(AtomicU64::new(0));
    {
        let (sink, printed) = (victim_partitions.clone(), printed.clone());
        let stdout = victim.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let record: serde_json::Value = serde_json::from_str(&line).unwrap();
                sink.lock()
                    .unwrap()
                    .insert(record["partition"].as_u64().unwrap() as u32);
                printed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // Survivors keep polling while the victim takes its share and consumes for a while.
    let started = Instant::now();
    while printed.load(Ordering::Relaxed) < 1000 || started.elapsed() < Duration::from_secs(2) {
        for member in &mut survivors {
            member.poll().await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the victim never consumed"
        );
    }
    let victim_partitions = victim_partitions.lock().unwrap().clone();
    victim.kill().unwrap();
    let killed = Instant::now();
    victim.wait().unwrap();
    let mut resumed = None;
    while resumed.is_none() {
        for member in &mut survivors {
            for batch in member.poll().await.unwrap() {
                if victim_partitions.contains(&batch.partition) && batch.records().next().is_some()
                {
                    resumed.get_or_insert(killed.elapsed());
                }
            }
        }
        assert!(killed.elapsed() < Duration::from_secs(120), "never resumed");
    }
    println!(
        "crash to consumption: session timeout {session_ms} ms: the killed member's {} partitions consumed again {:.0} ms after kill -9",
        victim_partitions.len(),
        resumed.unwrap().as_secs_f64() * 1e3
    );
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    for member in survivors {
        member.close().await.unwrap();
    }
}

async fn commit_rate(node: &TestNode, label: &str) {
    let client = Client::connect(ClientConfig::new(node.bootstrap()))
        .await
        .unwrap();
    let _ = client.create_topic("commits", 100, 1, &[]).await;
    for (committers, partitions_per_commit) in
        [(1usize, 1u32), (8, 1), (64, 1), (8, 100), (64, 100)]
    {
        let seconds = 3.0;
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let commits = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..committers)
            .map(|task| {
                let (client, commits) = (client.clone(), commits.clone());
                tokio::spawn(async move {
                    // Groups are spread over the coordinators by their hash.
                    let group = format!("committer-{task}-{partitions_per_commit}");
                    let mut offset = 0u64;
                    while Instant::now() < deadline {
                        offset += 1;
                        let offsets = (0..partitions_per_commit)
                            .map(|p| (("commits".to_string(), p), offset))
                            .collect();
                        client
                            .commit_offsets(&group, "", -1, &offsets)
                            .await
                            .unwrap();
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let rate = commits.load(Ordering::Relaxed) as f64 / seconds;
        println!(
            "offset commits ({label}): {committers} committers, {partitions_per_commit} partitions per commit: {rate:.0} commits/s = {:.0} partition offsets/s",
            rate * f64::from(partitions_per_commit)
        );
    }
}
