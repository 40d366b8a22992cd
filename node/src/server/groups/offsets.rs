//! Committed offsets: commits checked against their group and written together in one
//! fenced store transaction per batch, fetches, and the expiry of an empty group's offsets.

use std::collections::BTreeMap;

use strata_coordinator::GroupStore;
use strata_coordinator::groups::{GroupOffsets, LoadedGroup, StoredOffset, offsets_expired};
use strata_wire::protocol::{
    CommittedOffset, DeleteOffsetsRequest, DeleteOffsetsResponse, DeleteOffsetsTopic, ErrorCode,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    PartitionError, Response, TopicPartitions,
};
use tokio::sync::oneshot;

use super::GroupManager;
use super::manager::{Coordinated, Core};
use super::wire::{committed, consumer_subscription, from_wire, store_error};

/// A commit checked against its group, waiting to be written with the others that arrived
/// together.
pub(super) struct PendingCommit {
    pub(super) group: String,
    pub(super) topics: Vec<strata_wire::protocol::OffsetCommitTopic>,
    pub(super) reply: oneshot::Sender<Response>,
}

impl<S: GroupStore> GroupManager<S> {
    /// Checks a commit against the group (claiming it if needed); the write waits in `pending`
    /// for [`Self::flush_commits`], so commits that arrive together share transactions.
    pub(super) async fn validate_commit(
        &mut self,
        request: OffsetCommitRequest,
        reply: oneshot::Sender<Response>,
        pending: &mut Vec<PendingCommit>,
    ) {
        let refuse = |reply: oneshot::Sender<Response>, error| {
            let _ = reply.send(Response::OffsetCommit(OffsetCommitResponse { error }));
        };
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(reply, error),
        };
        if let Err(error) = coordinated
            .core
            .check_commit(&request.member_id, request.generation)
        {
            return refuse(reply, error);
        }
        pending.push(PendingCommit {
            group: request.group,
            topics: request.topics,
            reply,
        });
    }

    /// Writes the validated commits: one transaction per group (its commits merged in arrival
    /// order), the groups' transactions concurrently. Called before anything that could change
    /// a group's stored generation, so every commit is written under the generation it was
    /// checked against.
    pub(super) async fn flush_commits(&mut self, pending: &mut Vec<PendingCommit>) {
        if pending.is_empty() {
            return;
        }
        let mut by_group: BTreeMap<String, (GroupOffsets, Vec<oneshot::Sender<Response>>)> =
            BTreeMap::new();
        let committed_ms = self.config.clock.wall_ms();
        for commit in pending.drain(..) {
            let Some(coordinated) = self.groups.get(&commit.group) else {
                let _ = commit
                    .reply
                    .send(Response::OffsetCommit(OffsetCommitResponse {
                        error: ErrorCode::NotCoordinator,
                    }));
                continue;
            };
            let (touched, replies) = by_group.entry(commit.group).or_default();
            // Every partition of each touched topic goes into the write (one key per topic).
            for topic in commit.topics {
                let entry = touched.entry(topic.name.clone()).or_insert_with(|| {
                    coordinated
                        .offsets
                        .get(&topic.name)
                        .cloned()
                        .unwrap_or_default()
                });
                for partition in topic.partitions {
                    entry.insert(
                        partition.partition,
                        StoredOffset {
                            offset: partition.offset,
                            metadata: partition.metadata,
                            committed_ms: Some(committed_ms),
                        },
                    );
                }
            }
            replies.push(commit.reply);
        }
        let store = &self.store;
        let groups = &self.groups;
        let writes = by_group.iter().map(|(group, (touched, _))| async move {
            let fence = groups[group].fence;
            store.commit_offsets(group, fence, touched).await
        });
        let outcomes = futures_util::future::join_all(writes).await;
        for ((group, (touched, replies)), outcome) in by_group.into_iter().zip(outcomes) {
            let error = match outcome {
                Ok(true) => {
                    let coordinated = self.groups.get_mut(&group).expect("checked above");
                    coordinated.offsets.extend(touched);
                    ErrorCode::None
                }
                Ok(false) => {
                    tracing::warn!(%group, "offset commit fenced: another broker runs the group");
                    self.groups.remove(&group);
                    ErrorCode::NotCoordinator
                }
                Err(error) => {
                    tracing::warn!(%group, "committing offsets: {error}");
                    store_error(&error)
                }
            };
            for reply in replies {
                let _ = reply.send(Response::OffsetCommit(OffsetCommitResponse { error }));
            }
        }
    }

    /// The group's offsets: from memory when this broker runs it, else from the store.
    /// Forgets the group's committed offsets of the partitions asked for (Kafka's
    /// OffsetDelete), in one fenced write: an empty group's, or those of topics no member of
    /// a consumer group subscribes to (the others are refused GroupSubscribedToTopic, so a
    /// running consumer never loses its position). A non-empty group of another kind
    /// (Connect's, say) is NonEmptyGroup, as in Kafka.
    pub(super) async fn delete_offsets(
        &mut self,
        request: DeleteOffsetsRequest,
    ) -> DeleteOffsetsResponse {
        let failed = |error| DeleteOffsetsResponse {
            error,
            topics: Vec::new(),
        };
        let group = request.group.as_str();
        if strata_coordinator::groups::validate_group_id(group).is_err() {
            return failed(ErrorCode::InvalidGroupId);
        }
        if !self.is_coordinator(group) {
            return failed(ErrorCode::NotCoordinator);
        }
        if !self.groups.contains_key(group) {
            // Claiming would store a record: an unknown group must stay unknown.
            match self.store.load_group(group).await {
                Ok(loaded) if loaded.record.is_none() && loaded.offsets.is_empty() => {
                    return failed(ErrorCode::GroupIdNotFound);
                }
                Ok(_) => {}
                Err(error) => return failed(store_error(&error)),
            }
        }
        let coordinated = match self.claim(group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return failed(error),
        };
        let subscribed = match subscribed_topics(&coordinated.core) {
            Subscribed::Nothing => None,
            Subscribed::Topics(topics) => Some(topics),
            Subscribed::NotAConsumerGroup => return failed(ErrorCode::NonEmptyGroup),
        };
        let fence = coordinated.fence;
        let mut touched = GroupOffsets::new();
        let mut topics = Vec::new();
        for asked in request.topics {
            let held = subscribed
                .as_ref()
                .is_some_and(|topics| topics.contains(&asked.topic));
            if !held {
                let mut kept = coordinated
                    .offsets
                    .get(&asked.topic)
                    .cloned()
                    .unwrap_or_default();
                for partition in &asked.partitions {
                    kept.remove(partition);
                }
                touched.insert(asked.topic.clone(), kept);
            }
            let error = if held {
                ErrorCode::GroupSubscribedToTopic
            } else {
                ErrorCode::None
            };
            topics.push(DeleteOffsetsTopic {
                name: asked.topic,
                partitions: asked
                    .partitions
                    .into_iter()
                    .map(|partition| PartitionError { partition, error })
                    .collect(),
            });
        }
        if !touched.is_empty() {
            match self.store.commit_offsets(group, fence, &touched).await {
                Ok(true) => {
                    let coordinated = self.groups.get_mut(group).expect("claimed above");
                    for (topic, kept) in touched {
                        if kept.is_empty() {
                            coordinated.offsets.remove(&topic);
                        } else {
                            coordinated.offsets.insert(topic, kept);
                        }
                    }
                    tracing::info!(%group, "committed offsets deleted on request");
                }
                Ok(false) => {
                    self.groups.remove(group);
                    return failed(ErrorCode::NotCoordinator);
                }
                Err(error) => return failed(store_error(&error)),
            }
        }
        DeleteOffsetsResponse {
            error: ErrorCode::None,
            topics,
        }
    }

    /// The group as the store holds it (its committed offsets, and the offsets open
    /// transactions hold pending), and the group if it runs here.
    ///
    /// Offsets are read from the store, never from the group running here: a broker that
    /// missed a change of brokers (one left and came back between two views it saw) can hold
    /// a group that another broker ran meanwhile, its offsets behind what was committed there.
    /// The record's revision tells: another broker wrote it since this one did. The stale
    /// group is forgotten, to be claimed afresh on its next request, as it would have been had
    /// this broker seen the change.
    pub(super) async fn offsets_of(
        &mut self,
        group: &str,
    ) -> Result<(LoadedGroup, Option<&Coordinated>), ErrorCode> {
        if !self.is_coordinator(group) {
            return Err(ErrorCode::NotCoordinator);
        }
        let loaded = self
            .store
            .load_group(group)
            .await
            .map_err(|e| store_error(&e))?;
        if self
            .groups
            .get(group)
            .is_some_and(|running| running.fence != loaded.revision)
        {
            tracing::info!(
                group,
                "another broker ran the group since this one claimed it: claiming it again"
            );
            self.groups.remove(group);
            self.fail_kafka_waiters(group, ErrorCode::NotCoordinator);
        }
        Ok((loaded, self.groups.get(group)))
    }

    pub(super) async fn fetch_offsets(
        &mut self,
        request: OffsetFetchRequest,
    ) -> OffsetFetchResponse {
        let loaded = match self.offsets_of(&request.group).await {
            Ok((loaded, _)) => loaded,
            Err(error) => {
                return OffsetFetchResponse {
                    error,
                    offsets: Vec::new(),
                };
            }
        };
        if request.require_stable.0
            && let Some(record) = &loaded.record
            && txn_offsets_pending(&record.pending_txn_offsets, request.topics.as_deref())
        {
            return OffsetFetchResponse {
                error: ErrorCode::UnstableOffsetCommit,
                offsets: Vec::new(),
            };
        }
        let offsets = loaded.offsets;
        let offsets = match request.topics {
            None => committed(&offsets),
            Some(topics) => from_wire(topics)
                .into_iter()
                .map(|tp| {
                    let stored = offsets.get(&tp.topic).and_then(|p| p.get(&tp.partition));
                    CommittedOffset {
                        offset: stored.map_or(-1, |s| s.offset as i64),
                        metadata: stored.map(|s| s.metadata.clone()).unwrap_or_default(),
                        topic: tp.topic,
                        partition: tp.partition,
                    }
                })
                .collect(),
        };
        OffsetFetchResponse {
            error: ErrorCode::None,
            offsets,
        }
    }

    /// Deletes the groups this broker coordinates whose offsets expired (no members and no
    /// commit for the retention, `--offsets-retention-ms`).
    pub(super) async fn expire_offsets(&mut self) {
        let Some(retention) = self.config.offsets_retention else {
            return;
        };
        let groups = match self.store.list_groups().await {
            Ok(groups) => groups,
            Err(error) => {
                tracing::debug!("listing groups for offset expiry: {error}");
                return;
            }
        };
        for (group, _) in groups {
            let busy = self
                .groups
                .get(&group)
                .is_some_and(|running| !running.core.has_no_members());
            if busy || !self.is_coordinator(&group) {
                continue;
            }
            let Ok(loaded) = self.store.load_group(&group).await else {
                continue;
            };
            if !offsets_expired(
                &loaded,
                self.config.clock.wall_ms(),
                retention.as_millis() as i64,
            ) {
                continue;
            }
            match self.delete_empty_group(&group).await {
                ErrorCode::None => tracing::info!(
                    %group,
                    "offsets expired ({} ms without members or commits): group deleted",
                    retention.as_millis()
                ),
                error => tracing::debug!(%group, "offsets expired, not deleted: {error}"),
            }
        }
    }
}

/// What a group's members subscribe to, for an offset delete.
enum Subscribed {
    /// No members: every offset may go.
    Nothing,
    /// The topics some member subscribes to.
    Topics(std::collections::BTreeSet<String>),
    /// Members of a Kafka group whose protocol is not the consumer's (or whose subscription
    /// does not decode): what they read is unknown.
    NotAConsumerGroup,
}

fn subscribed_topics(core: &Core) -> Subscribed {
    match core {
        _ if core.has_no_members() => Subscribed::Nothing,
        Core::Strata(group) => Subscribed::Topics(
            group
                .describe()
                .members
                .into_iter()
                .flat_map(|member| member.topics)
                .collect(),
        ),
        Core::Kafka(classic) if classic.protocol_type() == Some("consumer") => {
            let mut topics = std::collections::BTreeSet::new();
            for member in classic.describe() {
                match consumer_subscription(member.metadata) {
                    Some(subscribed) => topics.extend(subscribed),
                    None => return Subscribed::NotAConsumerGroup,
                }
            }
            Subscribed::Topics(topics)
        }
        Core::Kafka(_) => Subscribed::NotAConsumerGroup,
    }
}

/// Whether an open transaction's offsets (`pending`, by producer id) are pending for one of
/// `topics` (all: any); an OffsetFetch with `require_stable` is answered
/// UNSTABLE_OFFSET_COMMIT then.
fn txn_offsets_pending(
    pending: &BTreeMap<i64, GroupOffsets>,
    topics: Option<&[TopicPartitions]>,
) -> bool {
    pending.values().any(|offsets| match topics {
        None => !offsets.is_empty(),
        Some(topics) => topics.iter().any(|asked| {
            offsets.get(&asked.topic).is_some_and(|partitions| {
                asked.partitions.iter().any(|p| partitions.contains_key(p))
            })
        }),
    })
}

#[cfg(test)]
mod tests {
    use strata_coordinator::groups::LocalGroupStore;
    use strata_wire::protocol::{
        Appended, OffsetCommitPartition, OffsetCommitTopic, TxnOffsetCommitRequest, TxnProducer,
    };

    use super::*;

    fn fetch(group: &str, require_stable: bool) -> OffsetFetchRequest {
        OffsetFetchRequest {
            group: group.into(),
            topics: Some(vec![TopicPartitions {
                topic: "in".into(),
                partitions: vec![0],
            }]),
            require_stable: Appended(require_stable),
        }
    }

    fn txn_commit(group: &str, offset: u64) -> TxnOffsetCommitRequest {
        TxnOffsetCommitRequest {
            producer: TxnProducer {
                transactional_id: "t".into(),
                producer_id: 7,
                producer_epoch: 0,
            },
            group: group.into(),
            member_id: String::new(),
            generation: -1,
            topics: vec![OffsetCommitTopic {
                name: "in".into(),
                partitions: vec![OffsetCommitPartition {
                    partition: 0,
                    offset,
                    metadata: String::new(),
                }],
            }],
        }
    }

    /// Two brokers on one store, each seeing itself alone alive: how two views look to a
    /// broker that missed the other's coming and going. What the second commits, the first
    /// answers, although it ran the group before and never heard it move.
    #[tokio::test]
    async fn a_broker_that_missed_the_group_moving_answers_offsets_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = || LocalGroupStore::open(dir.path().join("__cluster")).unwrap();
        let mut first = GroupManager::for_tests(1, dir.path(), store(), &[1]);
        let mut second = GroupManager::for_tests(2, dir.path(), store(), &[2]);
        first
            .claim("g")
            .await
            .expect("the first broker runs the group");
        let answer = first.fetch_offsets(fetch("g", true)).await;
        assert_eq!(
            (answer.error, answer.offsets[0].offset),
            (ErrorCode::None, -1)
        );

        // The group moves to the second broker, which commits a transaction's offsets.
        second
            .claim("g")
            .await
            .expect("the second broker takes the group");
        assert_eq!(
            second.txn_offset_commit(txn_commit("g", 40)).await.error,
            ErrorCode::None
        );
        let pending = first.fetch_offsets(fetch("g", true)).await;
        assert_eq!(
            pending.error,
            ErrorCode::UnstableOffsetCommit,
            "offsets pending in a transaction are unstable wherever the group ran"
        );
        assert!(
            !first.groups.contains_key("g"),
            "the stale group is forgotten"
        );
        assert_eq!(
            second.settle_txn_offsets("g", 7, true).await,
            ErrorCode::None
        );

        // Back at the first broker, which claims the group again on its next request.
        let answer = first.fetch_offsets(fetch("g", true)).await;
        assert_eq!(
            (answer.error, answer.offsets[0].offset),
            (ErrorCode::None, 40)
        );
        first
            .claim("g")
            .await
            .expect("the first broker runs the group again");
        assert_eq!(
            first.txn_offset_commit(txn_commit("g", 55)).await.error,
            ErrorCode::None
        );
        assert_eq!(
            first.settle_txn_offsets("g", 7, true).await,
            ErrorCode::None
        );
        let answer = second.fetch_offsets(fetch("g", false)).await;
        assert_eq!(
            (answer.error, answer.offsets[0].offset),
            (ErrorCode::None, 55)
        );
    }
}
