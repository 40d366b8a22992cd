//! The embedded coordinator: one node, no etcd, state in `<data-dir>/__cluster/state.json`.
//!
//! Every change is written to a temporary file, synced, renamed over the old state and the
//! directory synced, so a crash leaves either the old or the new state, never a torn one.
//!
//! Membership is a cluster of one's: the lease never lapses, this node is the controller, and
//! no other broker changes the state, so its watch never fires. A partition's revision, for
//! fenced writes, is its partition epoch (every change bumps it).

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::security::{UserRecord, check_acls, check_credential, split_by_filters};
use crate::{
    BrokerInfo, ControllerKey, Coordinator, CoordinatorError, StoredPartition, TopicSpec,
    TopicState, placement, validate_topic_name,
};
use crate::{ConfigChange, ConfigCheck, PartitionChange, PartitionState};
use strata_auth::acl::{AclBinding, AclFilter};
use strata_auth::scram::{ScramCredential, ScramMechanism};

const STATE_FILE: &str = "state.json";

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct State {
    brokers: Vec<BrokerInfo>,
    topics: Vec<TopicState>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    users: Vec<UserRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    acls: Vec<AclBinding>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    quotas: Vec<crate::quotas::QuotaRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    broker_configs: Vec<crate::broker_configs::BrokerConfigRecord>,
    /// Sorted by group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    group_configs: Vec<crate::group_configs::GroupConfigRecord>,
}

pub struct LocalCoordinator {
    dir: PathBuf,
    cluster: String,
    node_id: i32,
    state: RefCell<State>,
}

impl LocalCoordinator {
    /// Opens (or creates) the state in `dir` (conventionally `<data-dir>/__cluster`).
    pub fn open(
        dir: impl Into<PathBuf>,
        cluster: impl Into<String>,
        node_id: i32,
    ) -> Result<LocalCoordinator, CoordinatorError> {
        let dir = dir.into();
        let storage = |source| CoordinatorError::Storage {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(storage)?;
        let path = dir.join(STATE_FILE);
        let state = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|error| CoordinatorError::Corrupt {
                    path: path.clone(),
                    reason: error.to_string(),
                })?
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(source) => return Err(CoordinatorError::Storage { path, source }),
        };
        Ok(LocalCoordinator {
            dir,
            cluster: cluster.into(),
            node_id,
            state: RefCell::new(state),
        })
    }

    fn persist(&self, state: &State) -> Result<(), CoordinatorError> {
        let bytes = serde_json::to_vec_pretty(state).expect("cluster state serializes");
        write_atomically(&self.dir, STATE_FILE, &bytes)
    }

    /// Applies `change` to a copy of the state, persists it, then makes it current.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut State) -> Result<T, CoordinatorError>,
    ) -> Result<T, CoordinatorError> {
        let mut next = self.state.borrow().clone();
        let result = change(&mut next)?;
        self.persist(&next)?;
        *self.state.borrow_mut() = next;
        Ok(result)
    }
}

/// Writes `dir/name` so that a crash leaves the old or the new content, never a torn one:
/// a synced temporary file renamed over it, then the directory synced.
pub(crate) fn write_atomically(
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), CoordinatorError> {
    let path = dir.join(name);
    let temporary = dir.join(format!("{name}.tmp"));
    let storage = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CoordinatorError::Storage { path, source }
    };
    let mut file = std::fs::File::create(&temporary).map_err(storage(&temporary))?;
    file.write_all(bytes).map_err(storage(&temporary))?;
    file.sync_all().map_err(storage(&temporary))?;
    std::fs::rename(&temporary, &path).map_err(storage(&path))?;
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(storage(dir))?;
    Ok(())
}

impl Coordinator for LocalCoordinator {
    async fn users(&self) -> Result<Vec<UserRecord>, CoordinatorError> {
        Ok(self.state.borrow().users.clone())
    }

    async fn upsert_scram_credential(
        &self,
        user: &str,
        credential: ScramCredential,
    ) -> Result<(), CoordinatorError> {
        check_credential(user, &credential)?;
        self.update(|state| {
            match state.users.iter_mut().find(|known| known.name == user) {
                Some(known) => known.set(credential),
                None => {
                    let mut record = UserRecord {
                        name: user.to_string(),
                        credentials: Vec::new(),
                    };
                    record.set(credential);
                    state.users.push(record);
                    state.users.sort_by(|a, b| a.name.cmp(&b.name));
                }
            }
            Ok(())
        })
    }

    async fn delete_scram_credential(
        &self,
        user: &str,
        mechanism: Option<ScramMechanism>,
    ) -> Result<bool, CoordinatorError> {
        let present = self
            .state
            .borrow()
            .users
            .iter()
            .any(|known| known.name == user);
        if !present {
            return Ok(false);
        }
        self.update(|state| {
            let Some(known) = state.users.iter_mut().find(|known| known.name == user) else {
                return Ok(false);
            };
            let removed = known.remove(mechanism);
            state.users.retain(|known| !known.credentials.is_empty());
            Ok(removed)
        })
    }

    async fn client_quotas(&self) -> Result<Vec<crate::quotas::QuotaRecord>, CoordinatorError> {
        Ok(self.state.borrow().quotas.clone())
    }

    async fn alter_client_quotas(
        &self,
        alterations: &[crate::quotas::QuotaAlteration],
    ) -> Result<(), CoordinatorError> {
        crate::quotas::check_alterations(alterations)?;
        self.update(|state| {
            crate::quotas::apply_all(&mut state.quotas, alterations);
            Ok(())
        })
    }

    async fn broker_configs(
        &self,
    ) -> Result<Vec<crate::broker_configs::BrokerConfigRecord>, CoordinatorError> {
        Ok(self.state.borrow().broker_configs.clone())
    }

    async fn alter_broker_configs(
        &self,
        alteration: &crate::broker_configs::BrokerConfigAlteration,
    ) -> Result<(), CoordinatorError> {
        alteration.check()?;
        self.update(|state| {
            crate::broker_configs::apply(&mut state.broker_configs, alteration);
            Ok(())
        })
    }

    async fn group_configs(
        &self,
    ) -> Result<Vec<crate::group_configs::GroupConfigRecord>, CoordinatorError> {
        Ok(self.state.borrow().group_configs.clone())
    }

    async fn alter_group_configs(
        &self,
        alteration: &crate::group_configs::GroupConfigAlteration,
    ) -> Result<(), CoordinatorError> {
        alteration.check()?;
        self.update(|state| {
            crate::group_configs::apply(&mut state.group_configs, alteration);
            Ok(())
        })
    }

    async fn acls(&self) -> Result<Vec<AclBinding>, CoordinatorError> {
        Ok(self.state.borrow().acls.clone())
    }

    async fn create_acls(&self, bindings: &[AclBinding]) -> Result<(), CoordinatorError> {
        check_acls(bindings)?;
        self.update(|state| {
            state.acls.extend(bindings.iter().cloned());
            state.acls.sort();
            state.acls.dedup();
            Ok(())
        })
    }

    async fn delete_acls(
        &self,
        filters: &[AclFilter],
    ) -> Result<Vec<Vec<AclBinding>>, CoordinatorError> {
        let (deleted, kept) = split_by_filters(self.state.borrow().acls.clone(), filters);
        if deleted.iter().any(|matches| !matches.is_empty()) {
            self.update(|state| {
                state.acls = kept;
                Ok(())
            })?;
        }
        Ok(deleted)
    }

    fn cluster_name(&self) -> &str {
        &self.cluster
    }

    fn node_id(&self) -> i32 {
        self.node_id
    }

    fn lease_valid(&self) -> bool {
        true
    }

    async fn renew_lease(&self) -> Result<(), CoordinatorError> {
        Ok(())
    }

    async fn leave(&self) -> Result<(), CoordinatorError> {
        // No other broker can take over: the registration stays for the next start.
        Ok(())
    }

    async fn topics_at(&self) -> Result<(Vec<TopicState>, i64), CoordinatorError> {
        Ok((self.topics().await?, 0))
    }

    // Not an `async fn`: the watch outlives `&self` (it runs in a task of its own).
    #[allow(clippy::manual_async_fn)]
    fn watch_changes(
        &self,
        _read_at: i64,
        changed: tokio::sync::mpsc::UnboundedSender<()>,
    ) -> impl std::future::Future<Output = Result<(), CoordinatorError>> + Send + 'static {
        async move {
            // Held, not used: every change is this node's own, announced where it is made.
            let _changed = changed;
            std::future::pending().await
        }
    }

    fn campaign(
        &self,
    ) -> impl std::future::Future<Output = Result<ControllerKey, CoordinatorError>> + Send + 'static
    {
        std::future::ready(Ok(ControllerKey(self.node_id.to_be_bytes().to_vec())))
    }

    async fn refresh_controller(&self) -> Result<i32, CoordinatorError> {
        Ok(self.node_id)
    }

    async fn topics_with_revisions(
        &self,
    ) -> Result<(Vec<TopicState>, Vec<StoredPartition>), CoordinatorError> {
        let topics = self.topics().await?;
        let stored = topics
            .iter()
            .flat_map(|topic| {
                topic.partitions.iter().map(|partition| {
                    let revision = partition.partition_epoch as i64;
                    (topic.name.clone(), partition.clone(), revision)
                })
            })
            .collect();
        Ok((topics, stored))
    }

    async fn write_partitions_fenced(
        &self,
        changes: &[StoredPartition],
        proof: &ControllerKey,
    ) -> Result<Vec<bool>, CoordinatorError> {
        if proof.0 != self.node_id.to_be_bytes() {
            return Ok(vec![false; changes.len()]);
        }
        self.update(|state| {
            let stored = changes
                .iter()
                .map(|(topic, next, revision)| {
                    let current = state
                        .topics
                        .iter_mut()
                        .find(|t| &t.name == topic)
                        .and_then(|t| t.partitions.get_mut(next.partition as usize));
                    match current {
                        Some(current) if current.partition_epoch as i64 == *revision => {
                            *current = next.clone();
                            true
                        }
                        _ => false,
                    }
                })
                .collect();
            Ok(stored)
        })
    }

    async fn create_missing_partitions(&self, _topic: &str) -> Result<usize, CoordinatorError> {
        // A topic is created whole, in one atomic write of the state.
        Ok(0)
    }

    async fn take_next_epochs(&self) -> usize {
        // Every replica of a cluster of one is this node: no follower can hold records under
        // its epoch that its log lost.
        0
    }

    fn controller(&self) -> i32 {
        self.node_id
    }

    async fn brokers(&self) -> Result<Vec<BrokerInfo>, CoordinatorError> {
        Ok(self.state.borrow().brokers.clone())
    }

    async fn register_broker(&self, broker: BrokerInfo) -> Result<(), CoordinatorError> {
        if self.state.borrow().brokers == [broker.clone()] {
            return Ok(());
        }
        self.update(|state| {
            state.brokers = vec![broker];
            Ok(())
        })
    }

    async fn topics(&self) -> Result<Vec<TopicState>, CoordinatorError> {
        Ok(self.state.borrow().topics.clone())
    }

    async fn create_topic(&self, spec: TopicSpec) -> Result<TopicState, CoordinatorError> {
        validate_topic_name(&spec.name)?;
        self.update(|state| {
            if state.topics.iter().any(|topic| topic.name == spec.name) {
                return Err(CoordinatorError::TopicExists(spec.name.clone()));
            }
            let partitions = placement::for_new_topic(&state.brokers, &spec, state.topics.len())?;
            let topic = TopicState {
                name: spec.name.clone(),
                replication_factor: spec.replication_factor,
                config: spec.config.clone(),
                partitions,
                id: crate::TopicId::random(),
            };
            state.topics.push(topic.clone());
            Ok(topic)
        })
    }

    async fn add_partitions(
        &self,
        topic: &str,
        partitions: u32,
        assignment: &[Vec<i32>],
    ) -> Result<TopicState, CoordinatorError> {
        self.update(|state| {
            let brokers = state.brokers.clone();
            let existing = state
                .topics
                .iter_mut()
                .find(|t| t.name == topic)
                .ok_or_else(|| CoordinatorError::UnknownTopic(topic.to_string()))?;
            let added = placement::grow_as_asked(&brokers, existing, partitions, assignment)?;
            existing.partitions.extend(added);
            Ok(existing.clone())
        })
    }

    async fn alter_topic_config(
        &self,
        topic: &str,
        change: &ConfigChange,
        validate: &ConfigCheck<'_>,
    ) -> Result<TopicState, CoordinatorError> {
        self.update(|state| {
            let existing = state
                .topics
                .iter_mut()
                .find(|t| t.name == topic)
                .ok_or_else(|| CoordinatorError::UnknownTopic(topic.to_string()))?;
            let config = change.apply(&existing.config);
            validate(&config).map_err(CoordinatorError::Invalid)?;
            existing.config = config;
            Ok(existing.clone())
        })
    }

    async fn delete_topic(&self, name: &str) -> Result<TopicState, CoordinatorError> {
        self.update(|state| {
            let at = state
                .topics
                .iter()
                .position(|topic| topic.name == name)
                .ok_or_else(|| CoordinatorError::UnknownTopic(name.to_string()))?;
            Ok(state.topics.remove(at))
        })
    }

    async fn reassign(
        &self,
        topic: &str,
        partition: u32,
        replicas: Vec<i32>,
    ) -> Result<PartitionState, CoordinatorError> {
        self.update(|state| {
            let brokers = state.brokers.iter().map(|b| b.id).collect();
            let current = state
                .topics
                .iter_mut()
                .find(|t| t.name == topic)
                .ok_or_else(|| CoordinatorError::UnknownTopic(topic.to_string()))?
                .partitions
                .get_mut(partition as usize)
                .ok_or_else(|| CoordinatorError::Invalid(format!("no partition {partition}")))?;
            let started = placement::start_reassignment(current, &replicas, &brokers)?;
            // One broker, no followers to wait for: the reassignment completes at once.
            *current = placement::complete_reassignment(&started).unwrap_or(started);
            Ok(current.clone())
        })
    }

    async fn update_partition(
        &self,
        topic: &str,
        expected: &PartitionState,
        change: PartitionChange,
    ) -> Result<Option<PartitionState>, CoordinatorError> {
        self.update(|state| {
            let Some(current) = state
                .topics
                .iter_mut()
                .find(|t| t.name == topic)
                .and_then(|t| t.partitions.get_mut(expected.partition as usize))
            else {
                return Ok(None);
            };
            if current != expected {
                return Ok(None);
            }
            *current = change.apply(current);
            Ok(Some(current.clone()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        // The local coordinator's futures never wait on anything: poll once.
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => unreachable!("local coordinator futures are ready"),
        }
    }

    use crate::conformance::spec;

    #[test]
    fn the_local_coordinator_conforms() {
        let temp = tempfile::tempdir().unwrap();
        let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        block_on(crate::conformance::check_coordinator(&coordinator));
    }

    #[test]
    fn the_local_security_store_conforms_and_keeps_no_password() {
        let temp = tempfile::tempdir().unwrap();
        let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        block_on(crate::conformance::check_security_store(&coordinator));
        let credential = strata_auth::scram::ScramCredential::new(
            strata_auth::scram::ScramMechanism::Sha512,
            b"a-password-on-disk",
            b"salt",
            4096,
        )
        .unwrap();
        block_on(coordinator.upsert_scram_credential("dora", credential.clone())).unwrap();
        let stored = std::fs::read_to_string(temp.path().join(STATE_FILE)).unwrap();
        assert!(!stored.contains("a-password-on-disk"));
        // Users outlive the process.
        drop(coordinator);
        let reopened = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        let users = block_on(reopened.users()).unwrap();
        assert_eq!(users.last().unwrap().credentials, vec![credential]);
    }

    #[test]
    fn topics_survive_a_restart_and_errors_are_typed() {
        let temp = tempfile::tempdir().unwrap();
        let broker = BrokerInfo {
            id: 1,
            host: "127.0.0.1".into(),
            port: 7300,
            shard_ports: vec![7310, 7311],
            replication_ports: vec![],
            replication_host: None,
            rack: None,
            kafka_port: None,
            kafka_listeners: Vec::new(),
            native_listeners: Vec::new(),
        };
        {
            let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
            block_on(coordinator.register_broker(broker.clone())).unwrap();
            let topic = block_on(coordinator.create_topic(spec("orders", 8))).unwrap();
            assert_eq!(topic.partitions.len(), 8);
            assert!(
                topic
                    .partitions
                    .iter()
                    .all(|p| p.leader == 1 && p.replicas == [1])
            );
            assert!(matches!(
                block_on(coordinator.create_topic(spec("orders", 1))),
                Err(CoordinatorError::TopicExists(_))
            ));
            assert!(matches!(
                block_on(coordinator.create_topic(spec("bad/name", 1))),
                Err(CoordinatorError::InvalidTopicName { .. })
            ));
            block_on(coordinator.create_topic(spec("gone", 2))).unwrap();
            block_on(coordinator.delete_topic("gone")).unwrap();
            assert!(matches!(
                block_on(coordinator.delete_topic("gone")),
                Err(CoordinatorError::UnknownTopic(_))
            ));
        }
        let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        let topics = block_on(coordinator.topics()).unwrap();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0].name, "orders");
        assert_eq!(topics[0].config["flush"], "always");
        assert_eq!(block_on(coordinator.brokers()).unwrap(), vec![broker]);
    }

    #[test]
    fn config_changes_are_validated_whole_and_survive_a_restart() {
        let temp = tempfile::tempdir().unwrap();
        let no_retention_over_a_day = |config: &BTreeMap<String, String>| match config
            .get("retention.ms")
            .map(|v| v.parse::<u64>().unwrap())
        {
            Some(ms) if ms > 86_400_000 => Err(format!("retention.ms={ms} is too long")),
            _ => Ok(()),
        };
        {
            let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
            block_on(coordinator.register_broker(BrokerInfo {
                id: 1,
                host: "127.0.0.1".into(),
                port: 7300,
                shard_ports: vec![7310],
                replication_ports: vec![],
                replication_host: None,
                rack: None,
                kafka_port: None,
                kafka_listeners: Vec::new(),
                native_listeners: Vec::new(),
            }))
            .unwrap();
            block_on(coordinator.create_topic(spec("orders", 2))).unwrap();
            let change = ConfigChange {
                set: BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]),
                delete: vec!["flush".into()],
            };
            let topic = block_on(coordinator.alter_topic_config(
                "orders",
                &change,
                &no_retention_over_a_day,
            ))
            .unwrap();
            let expected = BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]);
            assert_eq!(topic.config, expected);
            let refused = ConfigChange {
                set: BTreeMap::from([
                    ("retention.ms".to_string(), "999999999".to_string()),
                    ("segment.bytes".to_string(), "4096".to_string()),
                ]),
                delete: vec![],
            };
            assert!(matches!(
                block_on(coordinator.alter_topic_config("orders", &refused, &no_retention_over_a_day)),
                Err(CoordinatorError::Invalid(why)) if why.contains("too long")
            ));
            assert!(matches!(
                block_on(coordinator.alter_topic_config("nope", &change, &|_| Ok(()))),
                Err(CoordinatorError::UnknownTopic(_))
            ));
            assert_eq!(block_on(coordinator.topics()).unwrap()[0].config, expected);
        }
        let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        let topics = block_on(coordinator.topics()).unwrap();
        assert_eq!(
            topics[0].config,
            BTreeMap::from([("retention.ms".to_string(), "60000".to_string())])
        );
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let temp = tempfile::tempdir().unwrap();
        let coordinator = LocalCoordinator::open(temp.path(), "test", 1).unwrap();
        block_on(coordinator.register_broker(BrokerInfo {
            id: 1,
            host: "h".into(),
            port: 1,
            shard_ports: vec![],
            replication_ports: vec![],
            replication_host: None,
            rack: None,
            kafka_port: None,
            kafka_listeners: Vec::new(),
            native_listeners: Vec::new(),
        }))
        .unwrap();
        // Replication factor 2 cannot be placed on one broker: nothing is stored.
        let mut two = spec("t", 1);
        two.replication_factor = 2;
        assert!(block_on(coordinator.create_topic(two)).is_err());
        assert!(block_on(coordinator.topics()).unwrap().is_empty());
    }
}
