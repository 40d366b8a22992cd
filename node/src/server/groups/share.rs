//! Share groups (KIP-932) on the group thread: the membership of the share groups this broker
//! coordinates ([`crate::share::group`]), and the store of share-partition state for the
//! partition leaders that hold it.
//!
//! Where share-partition state lives: in the group store (etcd in a cluster, files on one
//! node), one record per share-partition, fenced on its revision, written by the partition's
//! leader before it answers an acknowledgement. Kafka keeps it in `__share_group_state`
//! through a share coordinator; Strata's group store already is the replicated, fenced,
//! per-key store that groups and transactions use, so a leader change needs no log of its
//! own to replay: the new leader reads one record and claims it (a fenced write naming its
//! leader epoch), after which the old leader's writes fail and it answers nothing more.

use std::collections::BTreeMap;

use strata_coordinator::GroupStore;
use strata_coordinator::groups::{Durability, RecordKind};
use strata_wire::protocol::{
    DescribeShareGroupRequest, DescribeShareGroupResponse, ErrorCode, ShareGroupMember,
    TopicPartitions,
};

use crate::server::messages::{ManifestRequest, ShareGroupRequest, ShareHeartbeat, ShareRefusal};
use crate::share::config::ShareGroupConfig;
use crate::share::group::{Heartbeat, HeartbeatError};

use super::GroupManager;
use super::wire::store_error;

impl<S: GroupStore> GroupManager<S> {
    pub(super) async fn handle_share(&mut self, request: ShareGroupRequest) {
        match request {
            ShareGroupRequest::Heartbeat {
                group,
                member,
                member_epoch,
                topics,
                rack,
                client_id,
                client_host,
                reply,
            } => {
                let beat = Heartbeat {
                    member: &member,
                    member_epoch,
                    topics,
                    rack,
                    client_id: &client_id,
                    client_host: &client_host,
                };
                let _ = reply.send(self.share_heartbeat(&group, beat));
            }
            ShareGroupRequest::Describe { group, reply } => {
                let answer = if self.is_coordinator(&group) {
                    Ok(self.share_groups.get(&group).cloned())
                } else {
                    Err(ErrorCode::NotCoordinator)
                };
                let _ = reply.send(answer);
            }
            ShareGroupRequest::LoadState { id, reply } => {
                let loaded = self
                    .store
                    .load_record(RecordKind::ShareState, &id)
                    .await
                    .map_err(|error| store_error(&error));
                let _ = reply.send(loaded);
            }
            ShareGroupRequest::StoreState {
                id,
                expected,
                record,
                durability,
                reply,
            } => {
                let stored = self
                    .store
                    .store_record(RecordKind::ShareState, &id, expected, &record, durability)
                    .await
                    .map_err(|error| store_error(&error));
                let _ = reply.send(stored);
            }
        }
    }

    /// A remote manifest's record: the store holds it for partition leaders, as it holds
    /// share-partition states.
    pub(super) async fn handle_manifest(&mut self, request: ManifestRequest) {
        let kind = RecordKind::RemoteManifest;
        match request {
            ManifestRequest::Load { id, reply } => {
                let loaded = self.store.load_record(kind, &id).await;
                let _ = reply.send(loaded.map_err(|error| store_error(&error)));
            }
            ManifestRequest::Store {
                id,
                expected,
                record,
                reply,
            } => {
                let stored = self
                    .store
                    .store_record(kind, &id, expected, &record, Durability::Synced)
                    .await;
                let _ = reply.send(stored.map_err(|error| store_error(&error)));
            }
            ManifestRequest::Delete { id, reply } => {
                let deleted = self.store.delete_record(kind, &id).await;
                let _ = reply.send(deleted.map_err(|error| store_error(&error)));
            }
        }
    }

    fn share_heartbeat(
        &mut self,
        group: &str,
        beat: Heartbeat<'_>,
    ) -> Result<ShareHeartbeat, ShareRefusal> {
        if !self.is_coordinator(group) {
            return Err(ShareRefusal::NotCoordinator);
        }
        if self.groups.contains_key(group) {
            return Err(ShareRefusal::InconsistentProtocol);
        }
        let config = ShareGroupConfig::from_configs(self.view.group_configs.get(group));
        let now_ms = self.now_ms() as i64;
        let share = self.share_groups.entry(group.to_string()).or_default();
        // The partitions of what the members subscribe to (this one's new subscription
        // included), as the view has them now: a change moves partitions before the answer.
        let mut topics = share.subscribed_topics();
        topics.extend(beat.topics.iter().flatten().cloned());
        let counts = topics
            .into_iter()
            .filter_map(|topic| {
                let known = self.view.topics.iter().find(|known| known.name == topic)?;
                Some((topic, known.partitions.len() as u32))
            })
            .collect();
        share.set_partitions(counts);
        let answer = share.heartbeat(beat, now_ms).map_err(|error| match error {
            HeartbeatError::UnknownMember(_) => ShareRefusal::UnknownMember,
            HeartbeatError::FencedMemberEpoch { .. } => ShareRefusal::FencedMemberEpoch,
            HeartbeatError::Invalid(why) => ShareRefusal::Invalid(why.into()),
        })?;
        if share.is_empty() {
            self.share_groups.remove(group);
        }
        Ok(ShareHeartbeat {
            answer,
            heartbeat_interval_ms: config.heartbeat_interval.as_millis() as i32,
        })
    }

    /// The native DescribeShareGroup: the members of a share group this broker coordinates,
    /// and the partitions it holds state for (stored by their leaders) or has assigned.
    pub(super) async fn describe_share_group(
        &mut self,
        request: DescribeShareGroupRequest,
    ) -> DescribeShareGroupResponse {
        let group = request.group;
        let mut response = DescribeShareGroupResponse {
            error: ErrorCode::None,
            group: group.clone(),
            epoch: 0,
            state: "Empty".into(),
            members: Vec::new(),
            partitions: Vec::new(),
        };
        if !self.is_coordinator(&group) {
            response.error = ErrorCode::NotCoordinator;
            return response;
        }
        let mut partitions: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        match self.store.list_records(RecordKind::ShareState).await {
            // Ids are `<group>/<topic>/<partition>`; a topic name holds no `/`.
            Ok(ids) => {
                let prefix = format!("{group}/");
                for rest in ids.iter().filter_map(|id| id.strip_prefix(&prefix)) {
                    if let Some((topic, partition)) = rest.split_once('/')
                        && let Ok(partition) = partition.parse::<u32>()
                    {
                        partitions
                            .entry(topic.to_string())
                            .or_default()
                            .push(partition);
                    }
                }
            }
            // None stored yet (the single-node store has no folder for them then).
            Err(error) => tracing::debug!(%group, "share-partition states not listed: {error}"),
        }
        if let Some(share) = self.share_groups.get(&group) {
            response.epoch = share.epoch();
            response.state = if share.is_empty() { "Empty" } else { "Stable" }.into();
            for (id, member) in share.members() {
                for (topic, assigned) in &member.assignment {
                    partitions
                        .entry(topic.clone())
                        .or_default()
                        .extend(assigned.iter().copied());
                }
                response.members.push(ShareGroupMember {
                    member_id: id.clone(),
                    client_id: member.client_id.clone(),
                    client_host: member.client_host.clone(),
                    member_epoch: member.epoch,
                    topics: member.topics.iter().cloned().collect(),
                    assignment: member
                        .assignment
                        .iter()
                        .map(|(topic, partitions)| TopicPartitions {
                            topic: topic.clone(),
                            partitions: partitions.clone(),
                        })
                        .collect(),
                });
            }
        } else if partitions.is_empty() {
            response.error = ErrorCode::GroupIdNotFound;
        }
        response.partitions = partitions
            .into_iter()
            .map(|(topic, mut partitions)| {
                partitions.sort_unstable();
                partitions.dedup();
                TopicPartitions { topic, partitions }
            })
            .collect();
        response
    }

    /// Drops share group members silent for longer than their group's session timeout.
    pub(super) fn expire_share_members(&mut self) {
        let now_ms = self.now_ms() as i64;
        for (name, share) in &mut self.share_groups {
            let config = ShareGroupConfig::from_configs(self.view.group_configs.get(name));
            for member in share.expire(now_ms, config.session_timeout.as_millis() as i64) {
                tracing::info!(group = %name, %member, "share group member expired (session timeout)");
            }
        }
        self.share_groups.retain(|_, share| !share.is_empty());
    }
}
