//! Share groups as operators see them, on the group thread of the broker coordinating them:
//! which share groups exist (ListGroups, DescribeGroups, DeleteGroups), and operators'
//! changes to their share-partitions' stored state (AlterShareGroupOffsets,
//! DeleteShareGroupOffsets, DeleteGroups).
//!
//! A share group exists while it has members (in memory, [`GroupManager::share_groups`]) or
//! share-partition state stored (records `<group>/<topic>/<partition>`, written by the
//! partitions' leaders): a group whose members all left is listed, `Empty`, until its state is
//! deleted.
//!
//! A change is made only while the group has no members, checked in the same turn of this
//! thread as the store write, so no member joins between the check and the write (Kafka's
//! rule: NON_EMPTY_GROUP otherwise). The record is written fenced on the revision read: a
//! leader that still holds the share-partition finds its next write fenced and loads the
//! record again (the Kafka listener also drops what this broker's own shards hold, and a
//! leader elsewhere checks the record when the partition joins a share session there).

use std::collections::BTreeMap;

use strata_coordinator::groups::{Durability, RecordKind};
use strata_coordinator::{CoordinatorError, GroupStore};
use strata_wire::protocol::ErrorCode;

use crate::server::messages::{GroupTypes, ShareAdminRequest, ShareGroupStored, ShareStateChange};

use super::GroupManager;
use super::manager::Core;
use super::wire::store_error;

/// How many times a change is tried when a leader's write fences it.
const CHANGE_ATTEMPTS: usize = 3;

/// A stored share-partition's id (`<group>/<topic>/<partition>`, the leaders' format) split
/// into its parts; a topic name holds no `/`, a group id may.
fn parse_share_state_id(id: &str) -> Option<(&str, &str, u32)> {
    let (rest, partition) = id.rsplit_once('/')?;
    let (group, topic) = rest.rsplit_once('/')?;
    Some((group, topic, partition.parse().ok()?))
}

impl<S: GroupStore> GroupManager<S> {
    pub(super) async fn handle_share_admin(&mut self, request: ShareAdminRequest) {
        match request {
            ShareAdminRequest::List { reply } => {
                let _ = reply.send(self.group_types().await);
            }
            ShareAdminRequest::Inspect { group, reply } => {
                let _ = reply.send(self.inspect_share(&group).await);
            }
            ShareAdminRequest::Change {
                group,
                topic,
                partition,
                change,
                reply,
            } => {
                let changed = self
                    .change_share_state(&group, &topic, partition, change)
                    .await;
                let _ = reply.send(changed);
            }
        }
    }

    /// Every share-partition with state stored, by group (all groups, coordinated here or not).
    async fn stored_share_partitions(
        &self,
    ) -> Result<BTreeMap<String, Vec<(String, u32)>>, ErrorCode> {
        let ids = match self.store.list_records(RecordKind::ShareState).await {
            Ok(ids) => ids,
            // The single-node store has no folder for them until one is stored.
            Err(CoordinatorError::Storage { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Vec::new()
            }
            Err(error) => return Err(store_error(&error)),
        };
        let mut groups: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
        for id in &ids {
            if let Some((group, topic, partition)) = parse_share_state_id(id) {
                groups
                    .entry(group.to_string())
                    .or_default()
                    .push((topic.to_string(), partition));
            }
        }
        for partitions in groups.values_mut() {
            partitions.sort();
        }
        Ok(groups)
    }

    /// The share groups this broker coordinates (running, or with state stored) and the groups
    /// it runs with Kafka's classic protocol.
    async fn group_types(&self) -> Result<GroupTypes, ErrorCode> {
        let mut types = GroupTypes::default();
        for group in self.stored_share_partitions().await?.into_keys() {
            if self.is_coordinator(&group) {
                types.share.insert(group, 0);
            }
        }
        for (group, share) in &self.share_groups {
            if self.is_coordinator(group) {
                types.share.insert(group.clone(), share.members().len());
            }
        }
        types.classic = self
            .groups
            .iter()
            .filter(|(_, coordinated)| matches!(coordinated.core, Core::Kafka(_)))
            .map(|(group, _)| group.clone())
            .collect();
        Ok(types)
    }

    async fn inspect_share(&self, group: &str) -> Result<ShareGroupStored, ErrorCode> {
        if !self.is_coordinator(group) {
            return Err(ErrorCode::NotCoordinator);
        }
        let members = self
            .share_groups
            .get(group)
            .map_or(0, |share| share.members().len());
        let partitions = self
            .stored_share_partitions()
            .await?
            .remove(group)
            .unwrap_or_default();
        Ok(ShareGroupStored {
            members,
            partitions,
        })
    }

    /// Makes `change` to `group`'s stored state of `topic`-`partition` while the group has no
    /// members (see the module doc).
    async fn change_share_state(
        &mut self,
        group: &str,
        topic: &str,
        partition: u32,
        change: ShareStateChange,
    ) -> Result<(), ErrorCode> {
        if !self.is_coordinator(group) {
            return Err(ErrorCode::NotCoordinator);
        }
        if self
            .share_groups
            .get(group)
            .is_some_and(|share| !share.is_empty())
        {
            return Err(ErrorCode::NonEmptyGroup);
        }
        let id = format!("{group}/{topic}/{partition}");
        for _ in 0..CHANGE_ATTEMPTS {
            let (stored, revision) = self
                .store
                .load_record(RecordKind::ShareState, &id)
                .await
                .map_err(|error| store_error(&error))?;
            let existed = stored.is_some();
            let Some(record) = change(stored) else {
                if existed {
                    self.store
                        .delete_record(RecordKind::ShareState, &id)
                        .await
                        .map_err(|error| store_error(&error))?;
                    tracing::info!(%group, %topic, partition, "share-partition state deleted");
                }
                return Ok(());
            };
            let stored = self
                .store
                .store_record(
                    RecordKind::ShareState,
                    &id,
                    revision,
                    &record,
                    Durability::Synced,
                )
                .await
                .map_err(|error| store_error(&error))?;
            if stored.is_some() {
                tracing::info!(%group, %topic, partition, "share-partition state altered");
                return Ok(());
            }
        }
        // Leaders kept writing it: the caller may try again.
        Err(ErrorCode::CoordinatorNotAvailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_state_id_splits_from_the_right() {
        assert_eq!(parse_share_state_id("g/t/3"), Some(("g", "t", 3)));
        assert_eq!(
            parse_share_state_id("a/b/orders/12"),
            Some(("a/b", "orders", 12))
        );
        assert_eq!(parse_share_state_id("g/t/x"), None);
        assert_eq!(parse_share_state_id("t/3"), None);
    }
}
