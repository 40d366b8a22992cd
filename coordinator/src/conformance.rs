//! What every store behind the crate's traits must do, as checks run against each of them: the
//! file-backed stores in their unit tests, the etcd ones in `tests/etcd.rs` against a real etcd.
//! A difference between the two is a bug in one of them; each check panics on it.

use std::collections::BTreeMap;

use crate::groups::{
    Durability, GroupOffsets, GroupRecord, GroupStore, LoadedGroup, RecordKind, StoredOffset,
};
use crate::{BrokerInfo, ConfigChange, Coordinator, CoordinatorError, PartitionChange, TopicSpec};

/// A broker for the checks: id `id`, ports that nothing needs to listen on.
pub fn broker(id: i32) -> BrokerInfo {
    BrokerInfo {
        id,
        host: "127.0.0.1".into(),
        port: 7300 + id as u16,
        shard_ports: vec![7310 + id as u16],
        replication_ports: vec![],
        replication_host: None,
        rack: None,
        kafka_port: None,
        kafka_listeners: Vec::new(),
        native_listeners: Vec::new(),
    }
}

/// A topic of `partitions` partitions, replication factor 1, `flush=always`.
pub fn spec(name: &str, partitions: u32) -> TopicSpec {
    TopicSpec {
        name: name.into(),
        partitions,
        replication_factor: 1,
        config: BTreeMap::from([("flush".to_string(), "always".to_string())]),
        assignment: Vec::new(),
    }
}

/// A [`Coordinator`] of an empty cluster, for the broker it was opened as: registration, the
/// topic operations and their typed errors, the leader's fenced partition change, the
/// controller's election and fenced writes, and the epoch rule after a restart.
pub async fn check_coordinator(coordinator: &impl Coordinator) {
    let id = coordinator.node_id();
    coordinator.register_broker(broker(id)).await.unwrap();
    assert_eq!(coordinator.brokers().await.unwrap(), vec![broker(id)]);
    assert!(coordinator.lease_valid());

    // Topics: created whole, once, under valid names; read back at one revision.
    let created = coordinator
        .create_topic(spec("conformance", 3))
        .await
        .unwrap();
    assert_eq!(created.partitions.len(), 3);
    assert!(
        created
            .partitions
            .iter()
            .all(|p| p.leader == id && p.isr == [id])
    );
    assert!(matches!(
        coordinator.create_topic(spec("conformance", 1)).await,
        Err(CoordinatorError::TopicExists(_))
    ));
    assert!(matches!(
        coordinator.create_topic(spec("bad/name", 1)).await,
        Err(CoordinatorError::InvalidTopicName { .. })
    ));
    let (topics, revision) = coordinator.topics_at().await.unwrap();
    assert!(revision >= 0);
    assert_eq!(topics, coordinator.topics().await.unwrap());
    assert_eq!(topics, vec![created.clone()]);

    // A leader's own change applies to the state it read, and only to that.
    let first = &created.partitions[0];
    let next = coordinator
        .update_partition("conformance", first, PartitionChange::NextLeaderEpoch)
        .await
        .unwrap()
        .expect("the state as read takes the change");
    assert_eq!(next.leader_epoch, first.leader_epoch + 1);
    assert_eq!(next.partition_epoch, first.partition_epoch + 1);
    assert_eq!(
        coordinator
            .update_partition("conformance", first, PartitionChange::NextLeaderEpoch)
            .await
            .unwrap(),
        None,
        "a stale expected state is fenced"
    );

    // The controller: elected (the only candidate), named, and writing fenced on revisions.
    let key = coordinator.campaign().await.unwrap();
    assert_eq!(coordinator.refresh_controller().await.unwrap(), id);
    assert_eq!(coordinator.controller(), id);
    let (topics, stored) = coordinator.topics_with_revisions().await.unwrap();
    assert_eq!(stored.len(), 3, "every partition with its revision");
    assert_eq!(topics[0].partitions[0], next);
    let (topic, state, revision) = stored
        .iter()
        .find(|(_, state, _)| state.partition == 1)
        .cloned()
        .unwrap();
    let mut moved = state.clone();
    moved.partition_epoch += 1;
    moved.leader_epoch += 1;
    let stale = (topic.clone(), moved.clone(), revision - 1);
    let current = (topic.clone(), moved.clone(), revision);
    // (One batch names a partition once: etcd refuses a transaction that writes a key twice.)
    assert_eq!(
        coordinator
            .write_partitions_fenced(&[stale], &key)
            .await
            .unwrap(),
        vec![false],
        "a write on a revision the partition has left"
    );
    assert_eq!(
        coordinator
            .write_partitions_fenced(std::slice::from_ref(&current), &key)
            .await
            .unwrap(),
        vec![true]
    );
    assert_eq!(
        coordinator
            .write_partitions_fenced(&[current], &key)
            .await
            .unwrap(),
        vec![false],
        "the revision moved with the write"
    );
    assert_eq!(coordinator.topics().await.unwrap()[0].partitions[1], moved);
    assert_eq!(
        coordinator
            .create_missing_partitions("conformance")
            .await
            .unwrap(),
        0
    );

    // Configuration changes are judged whole; partitions only grow.
    let change = ConfigChange {
        set: BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]),
        delete: vec!["flush".into()],
    };
    let refuse_all = |_: &BTreeMap<String, String>| Err("refused".to_string());
    assert!(matches!(
        coordinator.alter_topic_config("conformance", &change, &refuse_all).await,
        Err(CoordinatorError::Invalid(why)) if why == "refused"
    ));
    let altered = coordinator
        .alter_topic_config("conformance", &change, &|_| Ok(()))
        .await
        .unwrap();
    assert_eq!(altered.config, change.set);
    assert!(matches!(
        coordinator
            .alter_topic_config("nope", &change, &|_| Ok(()))
            .await,
        Err(CoordinatorError::UnknownTopic(_))
    ));
    let grown = coordinator
        .add_partitions("conformance", 5, &[])
        .await
        .unwrap();
    assert_eq!(grown.partitions.len(), 5);
    assert_eq!(grown.partitions[4].leader, id);

    // After a restart, what this node still leads moves to its next epoch where a follower
    // could hold records under the old one; a store of one broker has none.
    let before = coordinator.topics().await.unwrap();
    let taken = coordinator.take_next_epochs().await;
    let after = coordinator.topics().await.unwrap();
    assert!(
        taken == 0 || taken == 5,
        "all or none of its partitions: {taken}"
    );
    for (old, new) in before[0].partitions.iter().zip(&after[0].partitions) {
        let bump = u32::from(taken > 0);
        assert_eq!(new.leader_epoch, old.leader_epoch + bump);
    }

    let deleted = coordinator.delete_topic("conformance").await.unwrap();
    assert_eq!(deleted.name, "conformance");
    assert!(matches!(
        coordinator.delete_topic("conformance").await,
        Err(CoordinatorError::UnknownTopic(_))
    ));
    assert!(coordinator.topics().await.unwrap().is_empty());
}

/// `topic`'s offsets as committed: `(partition, offset)` pairs, no metadata.
pub fn offsets(topic: &str, partitions: &[(u32, u64)]) -> GroupOffsets {
    let partitions = partitions
        .iter()
        .map(|&(partition, offset)| {
            (
                partition,
                StoredOffset {
                    offset,
                    metadata: String::new(),
                    committed_ms: None,
                },
            )
        })
        .collect();
    GroupOffsets::from([(topic.to_string(), partitions)])
}

/// A [`GroupStore`] holding no groups: the group record fences the claim, commits and deletion;
/// a commit replaces the committed topics' offsets; producer ids come in disjoint blocks.
pub async fn check_group_store(store: &impl GroupStore) {
    assert_eq!(store.load_group("g").await.unwrap(), LoadedGroup::default());
    let first = store
        .store_group("g", 0, &GroupRecord::at(1))
        .await
        .unwrap()
        .expect("the first claim wins");
    // A second coordinator that read revision 0 is fenced.
    assert_eq!(
        store
            .store_group("g", 0, &GroupRecord::at(1))
            .await
            .unwrap(),
        None
    );
    assert!(
        store
            .commit_offsets("g", first, &offsets("t", &[(0, 5), (1, 7)]))
            .await
            .unwrap()
    );
    let second = store
        .store_group("g", first, &GroupRecord::at(2))
        .await
        .unwrap()
        .unwrap();
    // The old revision no longer commits.
    assert!(
        !store
            .commit_offsets("g", first, &offsets("t", &[(0, 99)]))
            .await
            .unwrap()
    );
    assert!(
        store
            .commit_offsets("g", second, &offsets("u", &[(0, 1)]))
            .await
            .unwrap()
    );
    let loaded = store.load_group("g").await.unwrap();
    assert_eq!(loaded.record, Some(GroupRecord::at(2)));
    assert_eq!(loaded.revision, second);
    assert_eq!(loaded.offsets["t"][&0].offset, 5);
    assert_eq!(loaded.offsets["t"][&1].offset, 7);
    assert_eq!(loaded.offsets["u"][&0].offset, 1);
    // A commit replaces a topic's offsets whole (partitions it names no more are gone).
    assert!(
        store
            .commit_offsets("g", second, &offsets("t", &[(1, 8)]))
            .await
            .unwrap()
    );
    let loaded = store.load_group("g").await.unwrap();
    assert_eq!(loaded.offsets["t"].len(), 1);
    assert_eq!(loaded.offsets["t"][&1].offset, 8);
    assert_eq!(loaded.offsets["u"][&0].offset, 1);
    assert_eq!(
        store.list_groups().await.unwrap(),
        vec![("g".to_string(), 2)]
    );

    // Producer ids: each call a block of its own.
    let a = store
        .allocate_producer_ids(crate::groups::PRODUCER_ID_BLOCK)
        .await
        .unwrap();
    let b = store
        .allocate_producer_ids(crate::groups::PRODUCER_ID_BLOCK)
        .await
        .unwrap();
    assert!(a >= 0);
    assert_eq!(b, a + crate::groups::PRODUCER_ID_BLOCK);

    // Deleting takes the record and every offset, fenced like a commit.
    let revision = store.load_group("g").await.unwrap().revision;
    assert!(!store.delete_group("g", revision - 1).await.unwrap());
    assert!(store.delete_group("g", revision).await.unwrap());
    assert_eq!(store.load_group("g").await.unwrap(), LoadedGroup::default());
    assert!(store.list_groups().await.unwrap().is_empty());

    check_group_ids_are_kept_apart(store).await;
    check_txn_store(store).await;
    check_share_state_store(store).await;
}

/// Share states are kept apart from transactions of the same id, fenced alike, and deleted.
async fn check_share_state_store(store: &impl GroupStore) {
    let id = "g/orders/0";
    let first = store
        .store_record(
            RecordKind::ShareState,
            id,
            0,
            &serde_json::json!({"start": 1}),
            Durability::Written,
        )
        .await
        .unwrap()
        .unwrap();
    store.sync_written().await.unwrap();
    assert_eq!(
        store
            .load_record(RecordKind::Transaction, id)
            .await
            .unwrap(),
        (None, 0)
    );
    assert_eq!(
        store
            .store_record(
                RecordKind::ShareState,
                id,
                0,
                &serde_json::json!({}),
                Durability::Synced,
            )
            .await
            .unwrap(),
        None,
        "fenced on the revision read"
    );
    assert_eq!(
        store.list_records(RecordKind::ShareState).await.unwrap(),
        vec![id.to_string()]
    );
    assert_eq!(
        store.load_record(RecordKind::ShareState, id).await.unwrap(),
        (Some(serde_json::json!({"start": 1})), first)
    );
    store
        .delete_record(RecordKind::ShareState, id)
        .await
        .unwrap();
    store
        .delete_record(RecordKind::ShareState, id)
        .await
        .unwrap();
    assert_eq!(
        store.load_record(RecordKind::ShareState, id).await.unwrap(),
        (None, 0)
    );
}

/// Transactional ids' records: fenced on the revision read like group records, each id apart
/// from the others (however alike), listed by id, and apart from the groups of the same name.
async fn check_txn_store(store: &impl GroupStore) {
    assert_eq!(
        store
            .load_record(RecordKind::Transaction, "app")
            .await
            .unwrap(),
        (None, 0)
    );
    let record = |epoch: i64| serde_json::json!({"producer_id": 7, "epoch": epoch});
    let first = store
        .store_record(
            RecordKind::Transaction,
            "app",
            0,
            &record(0),
            Durability::Synced,
        )
        .await
        .unwrap()
        .expect("the first write wins");
    // A coordinator that read revision 0 is fenced once another stored.
    assert_eq!(
        store
            .store_record(
                RecordKind::Transaction,
                "app",
                0,
                &record(5),
                Durability::Synced
            )
            .await
            .unwrap(),
        None
    );
    let second = store
        .store_record(
            RecordKind::Transaction,
            "app",
            first,
            &record(1),
            Durability::Synced,
        )
        .await
        .unwrap()
        .expect("at the revision read");
    assert_eq!(
        store
            .load_record(RecordKind::Transaction, "app")
            .await
            .unwrap(),
        (Some(record(1)), second)
    );
    assert_eq!(
        store
            .store_record(
                RecordKind::Transaction,
                "app",
                first,
                &record(9),
                Durability::Synced
            )
            .await
            .unwrap(),
        None,
        "an old revision no longer writes"
    );
    for id in ["app/b", "app%2Fb"] {
        store
            .store_record(
                RecordKind::Transaction,
                id,
                0,
                &record(3),
                Durability::Synced,
            )
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        store.list_records(RecordKind::Transaction).await.unwrap(),
        ["app", "app%2Fb", "app/b"]
    );
    assert_eq!(
        store
            .load_record(RecordKind::Transaction, "app")
            .await
            .unwrap()
            .0,
        Some(record(1))
    );
    assert_eq!(
        store.load_group("app").await.unwrap(),
        LoadedGroup::default(),
        "a transactional id is not a group"
    );
    assert!(
        store
            .load_record(RecordKind::Transaction, "")
            .await
            .is_err(),
        "ids are never empty"
    );
}

/// What every [`GroupStore`] must do with group ids that are not
/// topic names (Kafka allows any non-empty string): keep each group's record and offsets apart
/// from every other's, however alike their ids, and list each by its own id.
async fn check_group_ids_are_kept_apart(store: &impl GroupStore) {
    // "a/b" must not fall under "a"'s keys, nor "a%2Fb" (a literal escape) meet "a/b".
    let ids = [
        "a",
        "a/b",
        "a%2Fb",
        "roundrobin,range",
        "grüppe",
        " spaced ",
    ];
    for (generation, id) in (1..).zip(ids) {
        let revision = store
            .store_group(id, 0, &GroupRecord::at(generation))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("group {id:?} claimed"));
        let offsets = GroupOffsets::from([(
            "t".to_string(),
            std::collections::BTreeMap::from([(
                0,
                StoredOffset {
                    offset: generation as u64 * 10,
                    metadata: id.to_string(),
                    committed_ms: None,
                },
            )]),
        )]);
        assert!(store.commit_offsets(id, revision, &offsets).await.unwrap());
    }
    let listed = store.list_groups().await.unwrap();
    let mut expected: Vec<(String, i32)> = (1..).zip(ids).map(|(g, id)| (id.into(), g)).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for (generation, id) in (1..).zip(ids) {
        let loaded = store.load_group(id).await.unwrap();
        assert_eq!(loaded.record.unwrap().generation, generation, "{id:?}");
        let offset = &loaded.offsets["t"][&0];
        assert_eq!(
            (offset.offset, offset.metadata.as_str()),
            (generation as u64 * 10, id)
        );
    }
    // Deleting "a" leaves "a/b" whole.
    let revision = store.load_group("a").await.unwrap().revision;
    assert!(store.delete_group("a", revision).await.unwrap());
    assert_eq!(store.load_group("a/b").await.unwrap().offsets["t"].len(), 1);
    assert_eq!(store.list_groups().await.unwrap().len(), ids.len() - 1);
    // An empty id, or one too long once escaped, is refused.
    assert!(store.load_group("").await.is_err());
    assert!(store.load_group(&"/".repeat(84)).await.is_err());
    assert!(store.load_group(&"/".repeat(83)).await.is_ok());
}

/// The users and ACLs of a [`Coordinator`] (empty at the start): credentials stored per
/// mechanism and never as passwords, removal per mechanism and whole, ACLs stored once and
/// removed by filter.
pub async fn check_security_store(coordinator: &impl Coordinator) {
    use strata_auth::acl::{
        AclBinding, AclFilter, Operation, PatternFilter, PatternType, Permission, ResourceType,
    };
    use strata_auth::scram::{ScramCredential, ScramMechanism};

    assert!(coordinator.users().await.unwrap().is_empty());
    let sha256 =
        ScramCredential::new(ScramMechanism::Sha256, b"first-password", b"salt-a", 4096).unwrap();
    let sha512 =
        ScramCredential::new(ScramMechanism::Sha512, b"first-password", b"salt-b", 8192).unwrap();
    coordinator
        .upsert_scram_credential("alice", sha256.clone())
        .await
        .unwrap();
    coordinator
        .upsert_scram_credential("alice", sha512.clone())
        .await
        .unwrap();
    coordinator
        .upsert_scram_credential("bob", sha512.clone())
        .await
        .unwrap();
    let users = coordinator.users().await.unwrap();
    assert_eq!(
        users
            .iter()
            .map(|user| user.name.as_str())
            .collect::<Vec<_>>(),
        ["alice", "bob"]
    );
    assert_eq!(users[0].credentials, vec![sha256.clone(), sha512.clone()]);
    // A new password replaces the credential of its mechanism only.
    let changed =
        ScramCredential::new(ScramMechanism::Sha256, b"second-password", b"salt-c", 4096).unwrap();
    coordinator
        .upsert_scram_credential("alice", changed.clone())
        .await
        .unwrap();
    let alice = coordinator.users().await.unwrap().remove(0);
    assert_eq!(alice.credential(ScramMechanism::Sha256), Some(&changed));
    assert_eq!(alice.credential(ScramMechanism::Sha512), Some(&sha512));
    assert!(matches!(
        coordinator
            .upsert_scram_credential("", sha256.clone())
            .await,
        Err(CoordinatorError::InvalidArgument(_))
    ));
    let mut bad = sha256.clone();
    bad.stored_key.truncate(3);
    assert!(matches!(
        coordinator.upsert_scram_credential("carol", bad).await,
        Err(CoordinatorError::InvalidArgument(_))
    ));
    assert!(
        coordinator
            .delete_scram_credential("alice", Some(ScramMechanism::Sha256))
            .await
            .unwrap()
    );
    assert!(
        !coordinator
            .delete_scram_credential("alice", Some(ScramMechanism::Sha256))
            .await
            .unwrap()
    );
    assert!(
        coordinator
            .delete_scram_credential("bob", None)
            .await
            .unwrap()
    );
    assert!(
        !coordinator
            .delete_scram_credential("nobody", None)
            .await
            .unwrap()
    );
    let users = coordinator.users().await.unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].credentials, vec![sha512]);

    assert!(coordinator.acls().await.unwrap().is_empty());
    let read = AclBinding {
        resource_type: ResourceType::Topic,
        resource_name: "orders".into(),
        pattern_type: PatternType::Literal,
        principal: "User:alice".into(),
        host: "*".into(),
        operation: Operation::Read,
        permission: Permission::Allow,
    };
    let write = AclBinding {
        resource_name: "orders-".into(),
        pattern_type: PatternType::Prefixed,
        operation: Operation::Write,
        ..read.clone()
    };
    coordinator
        .create_acls(&[read.clone(), write.clone()])
        .await
        .unwrap();
    coordinator
        .create_acls(std::slice::from_ref(&read))
        .await
        .unwrap();
    let mut both = vec![read.clone(), write.clone()];
    both.sort();
    assert_eq!(coordinator.acls().await.unwrap(), both);
    let mut invalid = read.clone();
    invalid.host = "not-an-address".into();
    assert!(matches!(
        coordinator.create_acls(&[invalid]).await,
        Err(CoordinatorError::InvalidArgument(_))
    ));
    let mut prefixed = AclFilter::any();
    prefixed.pattern = PatternFilter::Exactly(PatternType::Prefixed);
    let deleted = coordinator
        .delete_acls(&[prefixed, AclFilter::exactly(&write)])
        .await
        .unwrap();
    assert_eq!(deleted, vec![vec![write.clone()], vec![write]]);
    assert_eq!(coordinator.acls().await.unwrap(), vec![read]);
    assert_eq!(
        coordinator.delete_acls(&[AclFilter::any()]).await.unwrap()[0].len(),
        1
    );
    assert!(coordinator.acls().await.unwrap().is_empty());
    check_quota_store(coordinator).await;
    check_broker_config_store(coordinator).await;
    check_group_config_store(coordinator).await;
}

/// Group configs: each group's set, changed, replaced and removed on its own, listed in group
/// order whatever its name holds, a group gone with its last config, and an invalid alteration
/// stored nowhere.
async fn check_group_config_store(coordinator: &impl Coordinator) {
    use crate::group_configs::GroupConfigAlteration;
    assert!(coordinator.group_configs().await.unwrap().is_empty());
    let change =
        |group: &str, set: &[(&str, &str)], delete: &[&str], replace| GroupConfigAlteration {
            group: group.to_string(),
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            delete: delete.iter().map(|name| name.to_string()).collect(),
            replace,
        };
    let stored = || async {
        coordinator
            .group_configs()
            .await
            .unwrap()
            .into_iter()
            .map(|record| (record.group, record.values.into_iter().collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    // A name its etcd key escapes ("/" is no path there): as keys, "orders%2Feu" sorts
    // before "orders.us"; as ids, after it, and group order is the ids'.
    let odd = "orders/eu";
    coordinator
        .alter_group_configs(&change(
            "orders.us",
            &[
                ("share.auto.offset.reset", "earliest"),
                ("share.record.lock.duration.ms", "5000"),
            ],
            &[],
            false,
        ))
        .await
        .unwrap();
    coordinator
        .alter_group_configs(&change(
            odd,
            &[("consumer.session.timeout.ms", "60000")],
            &[],
            false,
        ))
        .await
        .unwrap();
    coordinator
        .alter_group_configs(&change(
            "orders.us",
            &[("share.isolation.level", "read_committed")],
            &["share.auto.offset.reset"],
            false,
        ))
        .await
        .unwrap();
    assert_eq!(
        stored().await,
        vec![
            (
                "orders.us".to_string(),
                vec![
                    pair("share.isolation.level", "read_committed"),
                    pair("share.record.lock.duration.ms", "5000"),
                ]
            ),
            (
                odd.to_string(),
                vec![pair("consumer.session.timeout.ms", "60000")]
            ),
        ]
    );
    coordinator
        .alter_group_configs(&change(
            "orders.us",
            &[("share.delivery.count.limit", "3")],
            &[],
            true,
        ))
        .await
        .unwrap();
    for invalid in [
        change("", &[("share.delivery.count.limit", "3")], &[], false),
        change("orders.us", &[("", "1")], &[], false),
        change("orders.us", &[], &[" "], false),
    ] {
        assert!(
            coordinator.alter_group_configs(&invalid).await.is_err(),
            "{invalid:?}"
        );
    }
    // Deleting what a group without configs does not have stores nothing.
    coordinator
        .alter_group_configs(&change("idle", &[], &["share.isolation.level"], false))
        .await
        .unwrap();
    coordinator
        .alter_group_configs(&change(odd, &[], &["consumer.session.timeout.ms"], false))
        .await
        .unwrap();
    assert_eq!(
        stored().await,
        vec![(
            "orders.us".to_string(),
            vec![pair("share.delivery.count.limit", "3")]
        )]
    );
    coordinator
        .alter_group_configs(&change("orders.us", &[], &[], true))
        .await
        .unwrap();
    assert!(coordinator.group_configs().await.unwrap().is_empty());
}

/// Dynamic broker settings: each scope's set, changed, replaced and removed on its own, a
/// scope gone with its last setting, and an invalid alteration stored nowhere.
async fn check_broker_config_store(coordinator: &impl Coordinator) {
    use crate::broker_configs::{BrokerConfigAlteration, BrokerScope};
    assert!(coordinator.broker_configs().await.unwrap().is_empty());
    let change = |scope, set: &[(&str, &str)], delete: &[&str], replace| BrokerConfigAlteration {
        scope,
        set: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        delete: delete.iter().map(|name| name.to_string()).collect(),
        replace,
    };
    let stored = || async {
        coordinator
            .broker_configs()
            .await
            .unwrap()
            .into_iter()
            .map(|record| (record.scope, record.values.into_iter().collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    coordinator
        .alter_broker_configs(&change(
            BrokerScope::Broker(2),
            &[("log.retention.ms", "1000")],
            &[],
            false,
        ))
        .await
        .unwrap();
    coordinator
        .alter_broker_configs(&change(
            BrokerScope::Default,
            &[("num.partitions", "3"), ("log.retention.ms", "5000")],
            &[],
            false,
        ))
        .await
        .unwrap();
    coordinator
        .alter_broker_configs(&change(
            BrokerScope::Default,
            &[("num.partitions", "4")],
            &["log.retention.ms"],
            false,
        ))
        .await
        .unwrap();
    assert_eq!(
        stored().await,
        vec![
            (BrokerScope::Default, vec![pair("num.partitions", "4")]),
            (
                BrokerScope::Broker(2),
                vec![pair("log.retention.ms", "1000")]
            ),
        ]
    );
    coordinator
        .alter_broker_configs(&change(
            BrokerScope::Broker(2),
            &[("log.segment.bytes", "1048576")],
            &[],
            true,
        ))
        .await
        .unwrap();
    assert!(
        coordinator
            .alter_broker_configs(&change(BrokerScope::Default, &[("", "1")], &[], false))
            .await
            .is_err()
    );
    coordinator
        .alter_broker_configs(&change(
            BrokerScope::Default,
            &[],
            &["num.partitions"],
            false,
        ))
        .await
        .unwrap();
    assert_eq!(
        stored().await,
        vec![(
            BrokerScope::Broker(2),
            vec![pair("log.segment.bytes", "1048576")]
        )]
    );
    coordinator
        .alter_broker_configs(&change(BrokerScope::Broker(2), &[], &[], true))
        .await
        .unwrap();
    assert!(coordinator.broker_configs().await.unwrap().is_empty());
}

/// Client quotas: set, replaced, removed key by key, an entity gone with its last quota, and
/// nothing applied when one alteration of several is invalid.
async fn check_quota_store(coordinator: &impl Coordinator) {
    use crate::quotas::{EntityName, QuotaAlteration, QuotaEntity, QuotaKey};
    assert!(coordinator.client_quotas().await.unwrap().is_empty());
    let alice = QuotaEntity {
        user: Some(EntityName::Named("alice".into())),
        client_id: None,
    };
    let any_client = QuotaEntity {
        user: None,
        client_id: Some(EntityName::Default),
    };
    coordinator
        .alter_client_quotas(&[
            QuotaAlteration {
                entity: alice.clone(),
                changes: vec![
                    (QuotaKey::ProducerByteRate, Some(1_048_576.0)),
                    (QuotaKey::RequestPercentage, Some(25.0)),
                ],
            },
            QuotaAlteration {
                entity: any_client.clone(),
                changes: vec![(QuotaKey::ConsumerByteRate, Some(2_097_152.0))],
            },
        ])
        .await
        .unwrap();
    let stored = coordinator.client_quotas().await.unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored[0].entity, any_client,
        "entity order: user None first"
    );
    assert_eq!(stored[1].values[&QuotaKey::RequestPercentage], 25.0);
    let invalid = coordinator
        .alter_client_quotas(&[
            QuotaAlteration {
                entity: alice.clone(),
                changes: vec![(QuotaKey::RequestPercentage, None)],
            },
            QuotaAlteration {
                entity: any_client.clone(),
                changes: vec![(QuotaKey::ConsumerByteRate, Some(-1.0))],
            },
        ])
        .await;
    assert!(invalid.is_err());
    assert_eq!(coordinator.client_quotas().await.unwrap(), stored);
    coordinator
        .alter_client_quotas(&[
            QuotaAlteration {
                entity: alice.clone(),
                changes: vec![
                    (QuotaKey::RequestPercentage, None),
                    (QuotaKey::ProducerByteRate, Some(4096.0)),
                ],
            },
            QuotaAlteration {
                entity: any_client,
                changes: vec![(QuotaKey::ConsumerByteRate, None)],
            },
        ])
        .await
        .unwrap();
    let stored = coordinator.client_quotas().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].entity, alice);
    assert_eq!(
        stored[0].values,
        std::collections::BTreeMap::from([(QuotaKey::ProducerByteRate, 4096.0)])
    );
    coordinator
        .alter_client_quotas(&[QuotaAlteration {
            entity: alice,
            changes: vec![(QuotaKey::ProducerByteRate, None)],
        }])
        .await
        .unwrap();
    assert!(coordinator.client_quotas().await.unwrap().is_empty());
}
