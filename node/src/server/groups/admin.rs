//! Listing, describing and deleting groups.

use strata_coordinator::GroupStore;
use strata_wire::protocol::{
    DeleteGroupRequest, DeleteGroupResponse, DescribeGroupRequest, DescribeGroupResponse,
    ErrorCode, GroupMember, ListGroupsResponse, ListedGroup,
};

use crate::group::{AssignorKind, GroupState};

use super::GroupManager;
use super::manager::Core;
use super::wire::{committed, consumer_assignment, store_error, to_wire};

pub(super) fn state_name(state: GroupState) -> &'static str {
    match state {
        GroupState::Empty => "Empty",
        GroupState::Stable => "Stable",
        GroupState::Reconciling => "Reconciling",
    }
}

impl<S: GroupStore> GroupManager<S> {
    pub(super) async fn list(&self) -> ListGroupsResponse {
        match self.store.list_groups().await {
            Ok(groups) => ListGroupsResponse {
                error: ErrorCode::None,
                groups: groups
                    .into_iter()
                    .map(|(group, generation)| ListedGroup { group, generation })
                    .collect(),
            },
            Err(error) => ListGroupsResponse {
                error: store_error(&error),
                groups: Vec::new(),
            },
        }
    }

    /// Removes a group without members, with its committed offsets (Kafka's DeleteGroups):
    /// claimed first like any write, so the delete is fenced on this broker's record.
    pub(super) async fn delete_group(
        &mut self,
        request: DeleteGroupRequest,
    ) -> DeleteGroupResponse {
        DeleteGroupResponse {
            error: self.delete_empty_group(&request.group).await,
        }
    }

    /// Deletes `group` if it has no members: by request, or when its offsets expire.
    pub(super) async fn delete_empty_group(&mut self, group: &str) -> ErrorCode {
        if strata_coordinator::groups::validate_group_id(group).is_err() {
            return ErrorCode::InvalidGroupId;
        }
        if !self.is_coordinator(group) {
            return ErrorCode::NotCoordinator;
        }
        if !self.groups.contains_key(group) {
            // Claiming would store a record: an unknown group must stay unknown.
            match self.store.load_group(group).await {
                Ok(loaded) if loaded.record.is_none() && loaded.offsets.is_empty() => {
                    return ErrorCode::GroupIdNotFound;
                }
                Ok(_) => {}
                Err(error) => return store_error(&error),
            }
        }
        let fence = match self.claim(group).await {
            Ok(coordinated) if !coordinated.core.has_no_members() => {
                return ErrorCode::NonEmptyGroup;
            }
            Ok(coordinated) => coordinated.fence,
            Err(error) => return error,
        };
        let deleted = self.store.delete_group(group, fence).await;
        match deleted {
            Ok(true) => {
                self.groups.remove(group);
                tracing::info!(%group, "group deleted");
                ErrorCode::None
            }
            Ok(false) => {
                // Another broker claimed the group since: it is no longer this one's.
                self.groups.remove(group);
                ErrorCode::NotCoordinator
            }
            Err(error) => store_error(&error),
        }
    }

    pub(super) async fn describe(
        &mut self,
        request: DescribeGroupRequest,
    ) -> DescribeGroupResponse {
        let mut response = DescribeGroupResponse {
            error: ErrorCode::None,
            group: request.group.clone(),
            generation: 0,
            state: state_name(GroupState::Empty).to_string(),
            assignor: AssignorKind::default().name().to_string(),
            members: Vec::new(),
            offsets: Vec::new(),
        };
        let (offsets, running) = match self.offsets_of(&request.group).await {
            Ok(found) => found,
            Err(error) => {
                response.error = error;
                return response;
            }
        };
        response.offsets = committed(&offsets.offsets);
        match running.map(|coordinated| &coordinated.core) {
            Some(Core::Kafka(classic)) => {
                response.generation = classic.generation();
                response.state = classic.state().name().to_string();
                response.assignor = classic.protocol().unwrap_or_default().to_string();
                let consumer = classic.protocol_type() == Some("consumer");
                response.members = classic
                    .describe()
                    .into_iter()
                    .map(|member| GroupMember {
                        member_id: member.member_id,
                        instance_id: None,
                        client_id: member.client_id,
                        generation: classic.generation(),
                        assignment: if consumer {
                            consumer_assignment(member.assignment)
                        } else {
                            Vec::new()
                        },
                    })
                    .collect();
            }
            Some(Core::Strata(core)) => {
                let description = core.describe();
                response.generation = description.generation;
                response.state = state_name(description.state).to_string();
                response.assignor = description.assignor.name().to_string();
                response.members = description
                    .members
                    .into_iter()
                    .map(|member| GroupMember {
                        member_id: member.member_id,
                        instance_id: member.instance_id,
                        client_id: member.client_id,
                        generation: member.generation,
                        assignment: to_wire(&member.assigned),
                    })
                    .collect();
            }
            None => {
                if let Ok(loaded) = self.store.load_group(&request.group).await {
                    response.generation = loaded.record.map_or(0, |record| record.generation);
                }
            }
        }
        response
    }
}
