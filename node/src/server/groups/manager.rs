//! The groups this broker coordinates: claiming a group from the store (fenced on the
//! revision it read), writing each generation back, and the producer-id blocks.

use strata_coordinator::GroupStore;
use strata_coordinator::groups::{GroupOffsets, GroupRecord, PRODUCER_ID_BLOCK, Revision};
use strata_wire::protocol::{ErrorCode, InitProducerIdRequest, InitProducerIdResponse};

use crate::group::classic::{ClassicGroup, ClassicSnapshot};
use crate::group::{Group, GroupSnapshot, PartitionCounts};
use crate::server::messages::ClusterView;

use super::GroupManager;
use super::wire::{classic_error, group_error, store_error};

/// The state machine running a group: Strata's own protocol, or Kafka's classic one (Kafka
/// clients on the Kafka listener). A group runs one at a time; an empty group takes whichever
/// its next member speaks.
pub(super) enum Core {
    Strata(Group),
    Kafka(ClassicGroup),
}

impl Core {
    pub(super) fn generation(&self) -> i32 {
        match self {
            Core::Strata(group) => group.generation(),
            Core::Kafka(group) => group.generation(),
        }
    }

    pub(super) fn has_no_members(&self) -> bool {
        match self {
            Core::Strata(group) => group.has_no_members(),
            Core::Kafka(group) => group.has_no_members(),
        }
    }

    pub(super) fn member_count(&self) -> usize {
        match self {
            Core::Strata(group) => group.describe().members.len(),
            Core::Kafka(group) => group.describe().len(),
        }
    }

    /// What the group record stores of the membership. A Kafka group stores one only while
    /// stable: a coordinator taking over mid-rebalance starts it empty, and its members, who
    /// were rejoining anyway, join again.
    pub(super) fn snapshot(&self) -> Option<StoredMembership> {
        match self {
            Core::Strata(group) => Some(StoredMembership::Strata(group.snapshot())),
            Core::Kafka(group) => group.snapshot().map(StoredMembership::Kafka),
        }
    }

    pub(super) fn check_commit(&self, member_id: &str, generation: i32) -> Result<(), ErrorCode> {
        match self {
            Core::Strata(group) => group
                .check_commit(member_id, generation)
                .map_err(group_error),
            Core::Kafka(group) => group
                .check_commit(member_id, generation)
                .map_err(classic_error),
        }
    }
}

/// A group this broker coordinates.
pub(super) struct Coordinated {
    pub(super) core: Core,
    /// The store revision of the group record this broker wrote last.
    pub(super) fence: Revision,
    /// The generation that record holds.
    pub(super) stored_generation: i32,
    /// The membership that record holds.
    pub(super) stored_membership: Option<StoredMembership>,
    /// Since when the group has had no members, as that record holds (wall clock, ms).
    pub(super) empty_since_ms: Option<i64>,
    pub(super) offsets: GroupOffsets,
    /// Offsets open transactions commit, by producer id, as that record holds them.
    pub(super) pending_txn_offsets: std::collections::BTreeMap<i64, GroupOffsets>,
}

impl Coordinated {
    /// The group's Strata-protocol state machine; an empty group running Kafka's protocol
    /// switches (its generation goes on). A group with Kafka members refuses Strata members.
    pub(super) fn strata(&mut self, group: &str) -> Result<&mut Group, ErrorCode> {
        if let Core::Kafka(classic) = &self.core {
            if !classic.has_no_members() {
                return Err(ErrorCode::InconsistentAssignor);
            }
            self.core = Core::Strata(Group::new(group.to_string(), classic.generation()));
        }
        match &mut self.core {
            Core::Strata(core) => Ok(core),
            Core::Kafka(_) => unreachable!("switched above"),
        }
    }

    /// The group's Kafka-protocol state machine, the same way round; a new one waits
    /// `initial_delay_ms` out of Empty (Kafka's `group.initial.rebalance.delay.ms`).
    pub(super) fn kafka(&mut self, initial_delay_ms: u64) -> Result<&mut ClassicGroup, ErrorCode> {
        if let Core::Strata(native) = &self.core {
            if !native.has_no_members() {
                return Err(ErrorCode::InconsistentAssignor);
            }
            self.core = Core::Kafka(
                ClassicGroup::new(native.generation())
                    .with_initial_rebalance_delay(initial_delay_ms),
            );
        }
        match &mut self.core {
            Core::Kafka(core) => Ok(core),
            Core::Strata(_) => unreachable!("switched above"),
        }
    }
}

/// The most a group's membership may take in its record: etcd refuses requests over 1.5 MiB
/// by default, and a refused write would refuse the group's heartbeats with it.
pub(super) const MEMBERSHIP_RECORD_MAX_BYTES: usize = 1 << 20;

/// A group's membership as its record keeps it, for a coordinator taking the group over.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StoredMembership {
    /// Stored bare, as before Kafka groups stored theirs.
    Strata(GroupSnapshot),
    /// Stored under a `"kafka"` key.
    Kafka(ClassicSnapshot),
}

impl StoredMembership {
    pub(super) fn parse(record: serde_json::Value) -> Result<StoredMembership, serde_json::Error> {
        match record.get("kafka") {
            Some(kafka) => serde_json::from_value(kafka.clone()).map(StoredMembership::Kafka),
            None => serde_json::from_value(record).map(StoredMembership::Strata),
        }
    }

    /// Whether a group whose record holds `self` may keep that record now that its
    /// membership is `now` (see [`GroupSnapshot::only_releases_since`]).
    pub(super) fn still_holds(&self, now: &StoredMembership) -> bool {
        match (self, now) {
            (StoredMembership::Strata(stored), StoredMembership::Strata(now)) => {
                stored.only_releases_since(now)
            }
            (stored, now) => stored == now,
        }
    }
}

/// The membership as the group record stores it; `None` (a new coordinator then starts the
/// group empty, as before memberships were stored) for a group too large for one record.
pub(super) fn membership_record(
    group: &str,
    membership: &StoredMembership,
) -> Option<serde_json::Value> {
    let bytes = match membership {
        StoredMembership::Strata(snapshot) => serde_json::to_vec(snapshot),
        StoredMembership::Kafka(snapshot) => {
            serde_json::to_vec(&serde_json::json!({ "kafka": snapshot }))
        }
    }
    .expect("a snapshot serializes");
    if bytes.len() > MEMBERSHIP_RECORD_MAX_BYTES {
        tracing::warn!(
            group,
            bytes = bytes.len(),
            "membership too large to store; a coordinator taking over starts the group afresh"
        );
        return None;
    }
    Some(serde_json::from_slice(&bytes).expect("just serialized"))
}

pub(super) fn partition_counts(view: &ClusterView) -> PartitionCounts {
    view.topics
        .iter()
        .map(|topic| (topic.name.clone(), topic.partitions.len() as u32))
        .collect()
}

impl<S: GroupStore> GroupManager<S> {
    /// The group, loaded and claimed if this broker does not run it yet.
    pub(super) async fn claim(&mut self, group: &str) -> Result<&mut Coordinated, ErrorCode> {
        if !self.is_coordinator(group) {
            self.groups.remove(group);
            return Err(ErrorCode::NotCoordinator);
        }
        if !self.groups.contains_key(group) {
            let loaded = self
                .store
                .load_group(group)
                .await
                .map_err(|e| store_error(&e))?;
            let generation = loaded.record.as_ref().map_or(0, |record| record.generation) + 1;
            // The members a previous coordinator stored go on where they were.
            let stored: Option<StoredMembership> = loaded
                .record
                .as_ref()
                .and_then(|record| record.membership.clone())
                .and_then(|membership| match StoredMembership::parse(membership) {
                    Ok(snapshot) => Some(snapshot),
                    Err(error) => {
                        tracing::warn!(
                            group,
                            "stored membership unreadable ({error}); starting empty"
                        );
                        None
                    }
                });
            let now_ms = self.now_ms();
            let restored = stored.clone().map(|membership| match membership {
                StoredMembership::Strata(snapshot) => {
                    Group::restore(group.to_string(), generation, snapshot, now_ms)
                        .map(|core| (Core::Strata(core), generation))
                }
                // Kafka members know only their generation: it goes on unchanged.
                StoredMembership::Kafka(snapshot) => {
                    let at = snapshot.generation;
                    let delay = self.config.group_initial_rebalance_delay_ms;
                    ClassicGroup::restore(snapshot, now_ms)
                        .map(|core| (Core::Kafka(core.with_initial_rebalance_delay(delay)), at))
                }
            });
            let (core, stored_membership, generation) = match restored {
                Some(Ok((core, at))) => {
                    tracing::info!(
                        group,
                        members = core.member_count(),
                        generation = at,
                        "restored the group's members"
                    );
                    (core, stored, at)
                }
                Some(Err(why)) => {
                    tracing::warn!(group, "stored membership refused ({why}); starting empty");
                    (
                        Core::Strata(Group::new(group.to_string(), generation)),
                        None,
                        generation,
                    )
                }
                None => (
                    Core::Strata(Group::new(group.to_string(), generation)),
                    None,
                    generation,
                ),
            };
            // Claiming is no activity of the group's own: an empty group stays empty since
            // when it became so.
            let empty_since_ms = core.has_no_members().then(|| {
                loaded
                    .record
                    .as_ref()
                    .and_then(|record| record.empty_since_ms)
                    .unwrap_or_else(|| self.config.clock.wall_ms())
            });
            let pending_txn_offsets = loaded
                .record
                .as_ref()
                .map(|record| record.pending_txn_offsets.clone())
                .unwrap_or_default();
            let record = GroupRecord {
                generation,
                membership: stored_membership
                    .as_ref()
                    .and_then(|snapshot| membership_record(group, snapshot)),
                empty_since_ms,
                pending_txn_offsets: pending_txn_offsets.clone(),
            };
            let fence = match self
                .store
                .store_group(group, loaded.revision, &record)
                .await
            {
                Ok(Some(fence)) => fence,
                Ok(None) => return Err(ErrorCode::NotCoordinator),
                Err(error) => return Err(store_error(&error)),
            };
            tracing::info!(group, generation, "coordinating the group");
            self.groups.insert(
                group.to_string(),
                Coordinated {
                    core,
                    fence,
                    stored_generation: generation,
                    stored_membership,
                    empty_since_ms,
                    offsets: loaded.offsets,
                    pending_txn_offsets,
                },
            );
        }
        Ok(self.groups.get_mut(group).expect("loaded above"))
    }

    /// Stores the group's generation and membership if either changed since they were last
    /// stored; callers answer only after this, so a member is never told of holdings the store
    /// does not have (a coordinator taking over restores no less than any member was told). A
    /// fenced write means another broker runs the group now: forget it.
    pub(super) async fn persist_group(&mut self, group: &str) -> Result<(), ErrorCode> {
        let Some(coordinated) = self.groups.get_mut(group) else {
            return Err(ErrorCode::NotCoordinator);
        };
        let generation = coordinated.core.generation();
        let membership = coordinated.core.snapshot();
        let membership_unchanged = match (&coordinated.stored_membership, &membership) {
            (Some(stored), Some(now)) => stored.still_holds(now),
            (None, None) => true,
            _ => false,
        };
        if generation == coordinated.stored_generation && membership_unchanged {
            return Ok(());
        }
        self.write_group_record(group).await
    }

    /// Stores the group's record as it stands (generation, membership, pending transactional
    /// offsets), fenced on the revision this broker wrote last.
    pub(super) async fn write_group_record(&mut self, group: &str) -> Result<(), ErrorCode> {
        let Some(coordinated) = self.groups.get_mut(group) else {
            return Err(ErrorCode::NotCoordinator);
        };
        let generation = coordinated.core.generation();
        let membership = coordinated.core.snapshot();
        let empty_since_ms = coordinated.core.has_no_members().then(|| {
            coordinated
                .empty_since_ms
                .unwrap_or_else(|| self.config.clock.wall_ms())
        });
        let record = GroupRecord {
            generation,
            membership: membership
                .as_ref()
                .and_then(|membership| membership_record(group, membership)),
            empty_since_ms,
            pending_txn_offsets: coordinated.pending_txn_offsets.clone(),
        };
        match self
            .store
            .store_group(group, coordinated.fence, &record)
            .await
        {
            Ok(Some(fence)) => {
                coordinated.fence = fence;
                coordinated.stored_generation = generation;
                coordinated.stored_membership = membership;
                coordinated.empty_since_ms = empty_since_ms;
                Ok(())
            }
            Ok(None) => {
                tracing::warn!(group, "another broker took the group over");
                self.groups.remove(group);
                Err(ErrorCode::NotCoordinator)
            }
            Err(error) => {
                tracing::warn!(group, "storing the group: {error}");
                Err(store_error(&error))
            }
        }
    }

    pub(super) async fn init_producer_id(
        &mut self,
        request: InitProducerIdRequest,
    ) -> InitProducerIdResponse {
        let answer = |error, producer_id, producer_epoch| InitProducerIdResponse {
            error,
            producer_id,
            producer_epoch,
        };
        // A known producer moves to its next epoch, which fences its older instance on every
        // partition it writes to next.
        if request.producer_id >= 0
            && request.producer_epoch >= 0
            && request.producer_epoch < i16::MAX
        {
            return answer(
                ErrorCode::None,
                request.producer_id,
                request.producer_epoch + 1,
            );
        }
        if self.producer_ids.is_empty()
            && let Err(error) = self.refill_producer_ids().await
        {
            return answer(error, -1, -1);
        }
        let id = self.producer_ids.next().expect("a non-empty block");
        answer(ErrorCode::None, id, 0)
    }

    /// Takes a block of producer ids from the shared counter.
    pub(super) async fn refill_producer_ids(&mut self) -> Result<(), ErrorCode> {
        match self.store.allocate_producer_ids(PRODUCER_ID_BLOCK).await {
            Ok(first) => {
                self.producer_ids = first..first + PRODUCER_ID_BLOCK;
                Ok(())
            }
            Err(error) => {
                tracing::warn!("allocating producer ids: {error}");
                Err(ErrorCode::CoordinatorNotAvailable)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{AssignorKind, Group, JoinParams, PartitionCounts, TopicPartition};

    #[test]
    fn a_membership_too_large_for_one_record_is_not_stored() {
        let partitions = PartitionCounts::from([("t".to_string(), 100)]);
        let mut group = Group::new("g".into(), 0);
        let params = JoinParams {
            member_id: None,
            instance_id: None,
            client_id: "c".into(),
            topics: vec!["t".into()],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            assignor: AssignorKind::Sticky,
        };
        group.join(0, params, &partitions, "a".into()).unwrap();
        group.heartbeat(1, "a", 1, &[], &partitions).unwrap();
        let small = group.snapshot();
        let stored = membership_record("g", &StoredMembership::Strata(small.clone()))
            .expect("a small group is stored");
        assert_eq!(
            StoredMembership::parse(stored).unwrap(),
            StoredMembership::Strata(small.clone())
        );

        let mut huge = small.clone();
        let member = huge.members.get_mut("a").unwrap();
        for partition in 0..60_000 {
            member
                .target
                .insert(TopicPartition::new("a-rather-long-topic-name", partition));
            member
                .assigned
                .insert(TopicPartition::new("a-rather-long-topic-name", partition));
        }
        assert_eq!(
            membership_record("g", &StoredMembership::Strata(huge)),
            None
        );
    }
}
