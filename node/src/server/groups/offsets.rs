//! Committed offsets: commits checked against their group and written together in one
//! fenced store transaction per batch, fetches, and the expiry of an empty group's offsets.

use std::collections::BTreeMap;

use strata_coordinator::GroupStore;
use strata_coordinator::groups::{GroupOffsets, StoredOffset, offsets_expired};
use strata_wire::protocol::{
    CommittedOffset, DeleteOffsetsRequest, DeleteOffsetsResponse, DeleteOffsetsTopic, ErrorCode,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    PartitionError, Response,
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

    pub(super) async fn offsets_of(
        &self,
        group: &str,
    ) -> Result<(GroupOffsets, Option<&Coordinated>), ErrorCode> {
        if !self.is_coordinator(group) {
            return Err(ErrorCode::NotCoordinator);
        }
        match self.groups.get(group) {
            Some(coordinated) => Ok((coordinated.offsets.clone(), Some(coordinated))),
            None => {
                let loaded = self
                    .store
                    .load_group(group)
                    .await
                    .map_err(|e| store_error(&e))?;
                Ok((loaded.offsets, None))
            }
        }
    }

    pub(super) async fn fetch_offsets(
        &mut self,
        request: OffsetFetchRequest,
    ) -> OffsetFetchResponse {
        if request.require_stable.0
            && self.txn_offsets_pending(&request.group, request.topics.as_deref())
        {
            return OffsetFetchResponse {
                error: ErrorCode::UnstableOffsetCommit,
                offsets: Vec::new(),
            };
        }
        let offsets = match self.offsets_of(&request.group).await {
            Ok((offsets, _)) => offsets,
            Err(error) => {
                return OffsetFetchResponse {
                    error,
                    offsets: Vec::new(),
                };
            }
        };
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
