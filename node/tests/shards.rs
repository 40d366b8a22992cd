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
        advertised_host: "127.0.0.1".into(),
        shards: 2,
        max_frame_bytes: 64 << 20,
        pin_cores: false,
        etcd: None,
        lease_ttl: std::time::Duration::from_secs(5),
        rack: None,
        admin: None,
        replication: SocketAddr::from(([127, 0, 0, 1], port + 1)),
        replica_lag_time_max_ms: 10_000,
        retention_check_interval: std::time::Duration::from_secs(300),
        tls: None,
        io_properties: None,
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
