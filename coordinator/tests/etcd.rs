//! The etcd coordinator against a real etcd (started per test on free loopback ports).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use strata_coordinator::testing::EtcdServer;
use strata_coordinator::{
    BrokerInfo, ConfigChange, Coordinator, CoordinatorError, EtcdCoordinator, PartitionChange,
    PartitionState, TopicSpec,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn broker(id: i32) -> BrokerInfo {
    BrokerInfo {
        id,
        host: "127.0.0.1".into(),
        port: 7300 + 100 * id as u16,
        shard_ports: vec![7310 + 100 * id as u16],
        replication_ports: vec![],
        replication_host: None,
        rack: None,
        kafka_port: None,
        kafka_listeners: Vec::new(),
        native_listeners: Vec::new(),
    }
}

fn spec(name: &str, partitions: u32, replication_factor: u16) -> TopicSpec {
    TopicSpec {
        name: name.into(),
        partitions,
        replication_factor,
        config: BTreeMap::from([("flush".to_string(), "always".to_string())]),
        assignment: Vec::new(),
    }
}

async fn connect(etcd: &EtcdServer, node: i32, ttl: Duration) -> EtcdCoordinator {
    EtcdCoordinator::connect(std::slice::from_ref(&etcd.endpoint), "test", node, ttl)
        .await
        .unwrap()
}

/// Brokers 1, 2 and 3, each connected and registered.
async fn three_brokers(etcd: &EtcdServer) -> [EtcdCoordinator; 3] {
    let nodes = [
        connect(etcd, 1, Duration::from_secs(5)).await,
        connect(etcd, 2, Duration::from_secs(5)).await,
        connect(etcd, 3, Duration::from_secs(5)).await,
    ];
    for (at, node) in nodes.iter().enumerate() {
        node.register_broker(broker(at as i32 + 1)).await.unwrap();
    }
    nodes
}

#[test]
fn brokers_register_once_and_vanish_with_their_lease() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let one = connect(&etcd, 1, Duration::from_secs(2)).await;
        one.register_broker(broker(1)).await.unwrap();
        // The same process may re-register (new addresses); another process may not take id 1.
        let mut moved = broker(1);
        moved.port = 9999;
        one.register_broker(moved.clone()).await.unwrap();
        let imposter = connect(&etcd, 1, Duration::from_secs(2)).await;
        assert!(matches!(
            imposter.register_broker(broker(1)).await,
            Err(CoordinatorError::BrokerIdTaken(1))
        ));
        assert_eq!(one.brokers().await.unwrap(), vec![moved]);

        // A clean resign removes the registration at once.
        let two = connect(&etcd, 2, Duration::from_secs(2)).await;
        two.register_broker(broker(2)).await.unwrap();
        assert_eq!(one.brokers().await.unwrap().len(), 2);
        two.resign().await.unwrap();
        assert_eq!(one.brokers().await.unwrap().len(), 1);

        // A crashed node (no keep-alive) disappears within its TTL plus a second.
        let started = Instant::now();
        one.abandon();
        let watcher = connect(&etcd, 3, Duration::from_secs(2)).await;
        while !watcher.brokers().await.unwrap().is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "lease did not expire"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And then the id is free again.
        imposter.register_broker(broker(1)).await.unwrap();
    });
}

#[test]
fn topics_are_created_once_placed_across_brokers_and_kept_in_etcd() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let nodes = three_brokers(&etcd).await;
        let topic = nodes[0].create_topic(spec("orders", 6, 3)).await.unwrap();
        assert_eq!(topic.partitions.len(), 6);
        let mut leaders = [0; 3];
        for partition in &topic.partitions {
            let mut replicas = partition.replicas.clone();
            replicas.sort_unstable();
            assert_eq!(replicas, vec![1, 2, 3]);
            leaders[partition.leader as usize - 1] += 1;
        }
        assert_eq!(leaders, [2, 2, 2], "leadership balanced");

        // Every node sees the same state, read back from etcd.
        for node in &nodes {
            let topics = node.topics().await.unwrap();
            assert_eq!(topics.len(), 1);
            assert_eq!(topics[0], topic);
        }
        assert!(matches!(
            nodes[1].create_topic(spec("orders", 1, 1)).await,
            Err(CoordinatorError::TopicExists(_))
        ));
        assert!(matches!(
            nodes[1].create_topic(spec("too-wide", 1, 4)).await,
            Err(CoordinatorError::Invalid(_))
        ));

        // Racing creators: the compare-first transaction lets exactly one win.
        let (a, b) = tokio::join!(
            nodes[0].create_topic(spec("race", 3, 1)),
            nodes[1].create_topic(spec("race", 5, 1))
        );
        assert!(
            a.is_ok() != b.is_ok(),
            "exactly one creator wins: {a:?} {b:?}"
        );
        let race = nodes[2]
            .topics()
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.name == "race")
            .unwrap();
        let winner = if a.is_ok() { 3 } else { 5 };
        assert_eq!(
            race.partitions.len(),
            winner,
            "no mix of the two placements"
        );

        // Config changes: validated, compare-and-set on the topic record, never a lost update.
        let set = |key: &str, value: &str| ConfigChange {
            set: BTreeMap::from([(key.to_string(), value.to_string())]),
            delete: vec![],
        };
        let altered = nodes[1]
            .alter_topic_config("race", &set("retention.ms", "1000"), &|_| Ok(()))
            .await
            .unwrap();
        assert_eq!(altered.config["retention.ms"], "1000");
        assert_eq!(altered.partitions.len(), winner);
        assert!(matches!(
            nodes[1]
                .alter_topic_config("race", &set("x", "y"), &|_| Err("no".into()))
                .await,
            Err(CoordinatorError::Invalid(_))
        ));
        let (segment, retention) = (set("segment.bytes", "4096"), set("retention.bytes", "4096"));
        let (a, b) = tokio::join!(
            nodes[0].alter_topic_config("race", &segment, &|_| Ok(())),
            nodes[2].alter_topic_config("race", &retention, &|_| Ok(()))
        );
        assert!(
            a.is_ok() || b.is_ok(),
            "one of two racing alters lands: {a:?} {b:?}"
        );
        let stored = nodes[1]
            .topics()
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.name == "race")
            .unwrap()
            .config;
        assert_eq!(
            stored.contains_key("segment.bytes"),
            a.is_ok(),
            "{stored:?}"
        );
        assert_eq!(
            stored.contains_key("retention.bytes"),
            b.is_ok(),
            "{stored:?}"
        );
        assert_eq!(stored["retention.ms"], "1000");

        nodes[2].delete_topic("race").await.unwrap();
        assert!(matches!(
            nodes[0].delete_topic("race").await,
            Err(CoordinatorError::UnknownTopic(_))
        ));
        assert_eq!(nodes[0].topics().await.unwrap().len(), 1);
    });
    // A new process after everything above still finds the topic: the state lives in etcd.
    runtime().block_on(async {
        let later = connect(&etcd, 9, Duration::from_secs(5)).await;
        let topics = later.topics().await.unwrap();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0].name, "orders");
        assert_eq!(topics[0].config["flush"], "always");
    });
}

/// etcd caps a transaction at 128 operations; a topic may have thousands of partitions. The
/// record creates it in one write, the partition keys follow in chunks, and a creator that
/// stopped half way leaves nothing a reader misses or a later writer cannot complete.
#[test]
fn topics_wider_than_one_etcd_transaction_are_created_grown_and_completed() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let nodes = three_brokers(&etcd).await;
        let keys = "/strata/test/partitions/wide/";
        let created = nodes[0].create_topic(spec("wide", 1000, 3)).await.unwrap();
        assert_eq!(created.partitions.len(), 1000);
        assert_eq!(
            etcd.count_prefix(keys).await,
            1000,
            "every partition key written"
        );
        let read = nodes[1].topics().await.unwrap();
        assert_eq!(read, vec![created.clone()], "read back as created");
        let mut leaders = [0; 3];
        for (index, partition) in read[0].partitions.iter().enumerate() {
            assert_eq!(partition.partition, index as u32);
            assert_eq!(partition.replicas.len(), 3);
            leaders[partition.leader as usize - 1] += 1;
        }
        assert!(
            leaders.iter().all(|count| (333..=334).contains(count)),
            "{leaders:?}"
        );

        let grown = nodes[2].add_partitions("wide", 1300, &[]).await.unwrap();
        assert_eq!(grown.partitions.len(), 1300);
        assert_eq!(etcd.count_prefix(keys).await, 1300);
        assert_eq!(nodes[0].topics().await.unwrap(), vec![grown.clone()]);

        // A creator that stopped after the record: readers still see every partition, in its
        // initial state, and the next writer completes the keys without touching the others.
        let moved = nodes[0].topics().await.unwrap()[0].partitions[5].clone();
        let shrunk = moved.isr[..2].to_vec();
        let isr_change = strata_coordinator::PartitionChange::Isr(shrunk.clone());
        let stored = nodes[0].update_partition("wide", &moved, isr_change).await;
        assert!(stored.unwrap().is_some());
        let lost = etcd.delete_prefix("/strata/test/partitions/wide/12").await;
        assert_eq!(lost, 111, "keys 12 and 120-129 and 1200-1299");
        let seen = nodes[1].topics().await.unwrap();
        assert_eq!(seen[0].partitions.len(), 1300);
        assert_eq!(
            seen[0].partitions[1250], grown.partitions[1250],
            "the initial state"
        );
        assert_eq!(
            nodes[2].create_missing_partitions("wide").await.unwrap(),
            111
        );
        assert_eq!(nodes[2].create_missing_partitions("wide").await.unwrap(), 0);
        assert_eq!(etcd.count_prefix(keys).await, 1300);
        let completed = nodes[1].topics().await.unwrap();
        assert_eq!(
            completed[0].partitions[5].isr, shrunk,
            "a changed partition kept its state"
        );

        // Deleted: nothing left, and a late completer writes nothing.
        nodes[0].delete_topic("wide").await.unwrap();
        assert_eq!(nodes[2].create_missing_partitions("wide").await.unwrap(), 0);
        assert_eq!(etcd.count_prefix(keys).await, 0);
        assert!(nodes[0].topics().await.unwrap().is_empty());
    });
}

/// A cluster's partition keys take more than one etcd answer may carry (gRPC's 4 MiB): reads
/// page through them.
#[test]
fn a_cluster_with_more_partition_state_than_one_etcd_answer() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let node = connect(&etcd, 1, Duration::from_secs(5)).await;
        for id in 1..=3 {
            node.register_broker(broker(id)).await.unwrap();
        }
        let mut created = Vec::new();
        for topic in ["wide-a", "wide-b", "wide-c"] {
            created.push(node.create_topic(spec(topic, 12_000, 3)).await.unwrap());
        }
        assert_eq!(
            etcd.count_prefix("/strata/test/partitions/").await,
            36_000,
            "every key written"
        );
        let read = node.topics().await.unwrap();
        assert_eq!(read, created);
    });
}

#[test]
fn group_offsets_are_fenced_by_generation_and_survive_an_etcd_restart() {
    use strata_coordinator::groups::{GroupOffsets, GroupRecord, StoredOffset};
    use strata_coordinator::{EtcdGroupStore, GroupStore};

    let offsets = |topic: &str, partitions: u32, offset: u64| -> GroupOffsets {
        let map = (0..partitions)
            .map(|p| {
                (
                    p,
                    StoredOffset {
                        offset: offset + u64::from(p),
                        metadata: String::new(),
                        committed_ms: None,
                    },
                )
            })
            .collect();
        GroupOffsets::from([(topic.to_string(), map)])
    };
    let etcd = EtcdServer::start();
    let endpoints = vec![etcd.endpoint.clone()];
    let etcd = runtime().block_on(async {
        let old = EtcdGroupStore::connect(&endpoints, "test").await.unwrap();
        let new = EtcdGroupStore::connect(&endpoints, "test").await.unwrap();
        let first = old
            .store_group("g", 0, &GroupRecord::at(1))
            .await
            .unwrap()
            .expect("claims an absent group");
        // 300 partitions commit in one transaction (one key per topic).
        assert!(
            old.commit_offsets("g", first, &offsets("t", 300, 10))
                .await
                .unwrap()
        );
        // Another coordinator takes the group over at the next generation...
        let loaded = new.load_group("g").await.unwrap();
        assert_eq!(loaded.revision, first);
        assert_eq!(loaded.offsets["t"].len(), 300);
        let second = new
            .store_group("g", loaded.revision, &GroupRecord::at(2))
            .await
            .unwrap()
            .expect("the read revision is current");
        // ...and the old one can neither claim nor commit any more.
        assert_eq!(
            old.store_group("g", first, &GroupRecord::at(2))
                .await
                .unwrap(),
            None
        );
        assert!(
            !old.commit_offsets("g", first, &offsets("t", 1, 999))
                .await
                .unwrap()
        );
        assert!(
            new.commit_offsets("g", second, &offsets("t", 300, 20))
                .await
                .unwrap()
        );
        // Producer ids: racing allocations never overlap.
        let (a, b) = tokio::join!(
            old.allocate_producer_ids(1000),
            new.allocate_producer_ids(1000)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a + 1000 <= b || b + 1000 <= a, "{a} and {b} overlap");
        etcd
    });
    let etcd = etcd.restart();
    runtime().block_on(async {
        let store = EtcdGroupStore::connect(std::slice::from_ref(&etcd.endpoint), "test")
            .await
            .unwrap();
        let loaded = store.load_group("g").await.unwrap();
        assert_eq!(loaded.record, Some(GroupRecord::at(2)));
        assert_eq!(loaded.offsets["t"][&0].offset, 20);
        assert_eq!(loaded.offsets["t"][&299].offset, 319);
        assert_eq!(
            store.list_groups().await.unwrap(),
            vec![("g".to_string(), 2)]
        );
        assert!(store.allocate_producer_ids(1).await.unwrap() >= 2000);
        // Deleting the group takes its record and every offset, fenced like a commit.
        let stale = loaded.revision - 1;
        assert!(!store.delete_group("g", stale).await.unwrap());
        assert_eq!(store.load_group("g").await.unwrap().offsets["t"].len(), 300);
        assert!(store.delete_group("g", loaded.revision).await.unwrap());
        assert_eq!(
            store.load_group("g").await.unwrap(),
            strata_coordinator::groups::LoadedGroup::default()
        );
        assert!(store.list_groups().await.unwrap().is_empty());
        // The id can start again from nothing.
        assert!(
            store
                .store_group("g", 0, &GroupRecord::at(1))
                .await
                .unwrap()
                .is_some()
        );
    });
}

/// The controller's writes go in transactions of many partitions. A partition changed since it
/// was read is refused alone (the rest of its transaction is then written one by one), and
/// nothing is written once the controller's election key is gone.
#[test]
fn controller_writes_are_batched_and_fenced() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let [one, two, _three] = three_brokers(&etcd).await;
        one.create_topic(spec("moves", 150, 3)).await.unwrap();
        let key = one.campaign().await.unwrap();
        let read = one.topics_with_revisions().await.unwrap().1;
        assert_eq!(read.len(), 150);
        // A leader changes partition 7 after the controller read it.
        let (_, seven, _) = read.iter().find(|(_, s, _)| s.partition == 7).unwrap();
        two.update_partition("moves", seven, PartitionChange::NextLeaderEpoch)
            .await
            .unwrap()
            .expect("stored");
        let by_ten =
            |read: &[(String, PartitionState, i64)]| -> Vec<(String, PartitionState, i64)> {
                read.iter()
                    .map(|(topic, state, revision)| {
                        let mut next = state.clone();
                        next.leader_epoch += 10;
                        next.partition_epoch += 1;
                        (topic.clone(), next, *revision)
                    })
                    .collect()
            };
        let txns = || etcd.metric("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\"");
        let txns_before = txns();
        let stored = one
            .write_partitions_fenced(&by_ten(&read), &key)
            .await
            .unwrap();
        // Three transactions of 60, 60 and 30; the first refused, then its 60 one by one.
        assert_eq!(txns() - txns_before, 63.0);
        let refused: Vec<u32> = read
            .iter()
            .zip(&stored)
            .filter(|(_, stored)| !**stored)
            .map(|((_, state, _), _)| state.partition)
            .collect();
        assert_eq!(refused, vec![7]);
        let after = one.topics_with_revisions().await.unwrap().1;
        for ((_, before, _), (_, now, _)) in read.iter().zip(&after) {
            let expected = if before.partition == 7 { 1 } else { 10 };
            assert_eq!(now.leader_epoch, before.leader_epoch + expected, "{now:?}");
        }

        // Without its election key, the old controller writes nothing, in one transaction per
        // pass rather than one per partition.
        one.resign().await.unwrap();
        let txns_before = txns();
        let stored = two
            .write_partitions_fenced(&by_ten(&after), &key)
            .await
            .unwrap();
        assert!(stored.iter().all(|stored| !stored));
        assert_eq!(txns() - txns_before, 1.0);
        let unchanged = two.topics_with_revisions().await.unwrap().1;
        for ((_, before, _), (_, now, _)) in after.iter().zip(&unchanged) {
            assert_eq!(now.leader_epoch, before.leader_epoch);
        }
    });
}

#[test]
fn the_etcd_group_store_conforms() {
    let etcd = EtcdServer::start();
    let endpoints = vec![etcd.endpoint.clone()];
    runtime().block_on(async {
        let store = strata_coordinator::EtcdGroupStore::connect(&endpoints, "test")
            .await
            .unwrap();
        strata_coordinator::conformance::check_group_store(&store).await;
    });
}

#[test]
fn the_etcd_coordinator_conforms() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let coordinator = connect(&etcd, 1, Duration::from_secs(5)).await;
        strata_coordinator::conformance::check_coordinator(&coordinator).await;
    });
}

#[test]
fn the_etcd_security_store_conforms() {
    let etcd = EtcdServer::start();
    runtime().block_on(async {
        let coordinator = connect(&etcd, 1, Duration::from_secs(5)).await;
        strata_coordinator::conformance::check_security_store(&coordinator).await;
    });
}
