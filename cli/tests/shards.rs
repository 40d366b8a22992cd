//! Shards: each partition is owned (opened, written) by exactly one shard; requests through the
//! shared port are forwarded to the owner, requests through the owner's port are not.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use strata_client::{
    Client, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord,
    SeekTo,
};
use strata_node::server::{Node, NodeConfig, shard_of};

mod support;

#[test]
fn each_partition_has_one_owner_and_both_ports_work() {
    let temp = tempfile::tempdir().unwrap();
    let port = support::free_base_port(2);
    let config = NodeConfig {
        data_dir: temp.path().to_path_buf(),
        node_id: 1,
        cluster: "shards".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        listen_protocol: strata_node::server::security::SecurityProtocol::Plaintext,
        more_listeners: Vec::new(),
        advertised_host: "127.0.0.1".into(),
        shards: 2,
        max_frame_bytes: 64 << 20,
        pin_cores: false,
        tcp_congestion: None,
        etcd: None,
        lease_ttl: std::time::Duration::from_secs(5),
        rack: None,
        admin: None,
        kafka: Vec::new(),
        security: Default::default(),
        kafka_auto_create_topics: false,
        kafka_topic_defaults: Default::default(),
        group_initial_rebalance_delay_ms: 0,
        group_consumer_session_timeout_ms: 45_000,
        replication: SocketAddr::from(([127, 0, 0, 1], port + 1)),
        replica_lag_time_max_ms: 10_000,
        replica_recovery_bytes_per_sec: None,
        tail_cache_bytes: 64 << 20,
        leader_rebalance_interval: None,
        offsets_retention: None,
        retention_check_interval: std::time::Duration::from_secs(300),
        cleaner: Default::default(),
        quota_window: Default::default(),
        tls: None,
        io_properties: None,
        clock: strata_node::clock::Clock::SYSTEM,
        remote_storage: None,
    };
    let node = Node::start(config).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bootstrap = format!("127.0.0.1:{port}");
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(&bootstrap))
            .await
            .unwrap();
        client.create_topic("sharded", 8, 1, &[]).await.unwrap();
    });

    // Ownership: disjoint, complete, and as `shard_of` says.
    let stats = node.stats();
    assert_eq!(stats.len(), 2);
    let mut all = BTreeSet::new();
    for shard in &stats {
        for (topic, partition) in &shard.partitions {
            assert_eq!(shard_of(topic, *partition, 2), shard.shard);
            assert!(
                all.insert((topic.clone(), *partition)),
                "{topic}-{partition} has two owners"
            );
        }
        assert!(!shard.partitions.is_empty(), "both shards own partitions");
    }
    assert_eq!(all.len(), 8);

    // Shard-aware: every produce goes straight to the owner; no forwarding.
    let hops_before: u64 = stats.iter().map(|s| s.cross_shard_hops).sum();
    runtime.block_on(produce_each_partition(&bootstrap, true, "aware"));
    let hops_aware: u64 = node.stats().iter().map(|s| s.cross_shard_hops).sum();
    assert_eq!(
        hops_aware, hops_before,
        "shard-aware requests are never forwarded"
    );

    // Through the shared port: a connection lands on one shard, which forwards what it does
    // not own; the data still lands, written by the owner only (the other never opened it).
    runtime.block_on(produce_each_partition(&bootstrap, false, "shared"));
    let hops_shared: u64 = node.stats().iter().map(|s| s.cross_shard_hops).sum();
    assert!(
        hops_shared > hops_aware,
        "the shared port forwards to the owner"
    );
    assert_eq!(
        node.stats()
            .iter()
            .map(|s| s.partitions.len())
            .sum::<usize>(),
        8,
        "forwarding opened nothing on the wrong shard"
    );

    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(&bootstrap))
            .await
            .unwrap();
        let mut consumer = Consumer::new(client, ConsumerConfig::default());
        consumer
            .assign("sharded", &[], SeekTo::Beginning)
            .await
            .unwrap();
        let mut values = Vec::new();
        while values.len() < 16 {
            for batch in consumer.poll().await.unwrap() {
                for record in batch.records() {
                    values.push(String::from_utf8(record.value.to_vec()).unwrap());
                }
            }
        }
        values.sort();
        let mut expected: Vec<String> = (0..8)
            .flat_map(|p| [format!("aware-{p}"), format!("shared-{p}")])
            .collect();
        expected.sort();
        assert_eq!(values, expected);
    });
    node.shutdown();
}

async fn produce_each_partition(bootstrap: &str, shard_aware: bool, tag: &str) {
    let mut config = ClientConfig::new(bootstrap);
    config.shard_aware = shard_aware;
    let client = Client::connect(config).await.unwrap();
    let producer = Producer::new(client, ProducerConfig::default());
    for partition in 0..8 {
        let mut record = ProducerRecord::new("sharded", None, format!("{tag}-{partition}"));
        record.partition = Some(partition);
        let metadata = producer.send(record).await.unwrap().await.unwrap();
        assert_eq!(metadata.partition, partition);
    }
}

/// A process narrowed to some CPUs (`taskset`, a cpuset) pins its shards among those CPUs,
/// never outside them (shard i takes the i-th allowed CPU, not CPU i).
#[test]
fn shards_pin_themselves_within_the_cpus_the_process_may_use() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let only = cores - 1;
    // SAFETY: cpu_set_t is plain data; this narrows the test thread, which the node inherits.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(only, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
    let data = tempfile::tempdir().unwrap();
    let node = support::TestNode::start(data.path(), 2);
    let shards = shard_cpus(node.pid());
    assert_eq!(shards.len(), 2, "{shards:?}");
    for (name, allowed) in &shards {
        assert_eq!(
            *allowed,
            only.to_string(),
            "{name} runs outside the process's CPUs"
        );
    }
}

/// `--overprovisioned` (cores shared with other busy processes) leaves shard threads free to
/// run on any CPU the process may use; by default each shard has a CPU of its own.
#[test]
fn overprovisioned_shards_are_not_pinned() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let process_cpus = if cores == 1 {
        "0".to_string()
    } else {
        format!("0-{}", cores - 1)
    };
    let data = tempfile::tempdir().unwrap();
    let node = support::TestNode::start_with(data.path(), 2, &["--overprovisioned"]);
    let shards = shard_cpus(node.pid());
    assert_eq!(shards.len(), 2, "{shards:?}");
    for (name, allowed) in &shards {
        assert_eq!(*allowed, process_cpus, "{name} is pinned");
    }
    drop(node);

    if cores > 1 {
        let data = tempfile::tempdir().unwrap();
        let node = support::TestNode::start(data.path(), 2);
        let mut pinned: Vec<String> = shard_cpus(node.pid())
            .into_iter()
            .map(|(_, allowed)| allowed)
            .collect();
        pinned.sort();
        assert_eq!(pinned, ["0", "1"], "each shard on a CPU of its own");
    }
}

/// The CPUs each shard thread of process `pid` may run on: (thread name, Cpus_allowed_list).
fn shard_cpus(pid: u32) -> Vec<(String, String)> {
    let mut shards = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !name.starts_with("strata-shard") {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        let allowed = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        shards.push((name.trim().to_string(), allowed));
    }
    shards
}
