//! Strata's own group protocol: join, heartbeat (which carries the assignment) and leave.

use strata_coordinator::GroupStore;
use strata_wire::protocol::{
    ErrorCode, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse,
};

use crate::group::{AssignorKind, GroupState, JoinParams};

use super::GroupManager;
use super::wire::{
    SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN, from_wire, group_error, to_wire,
};

/// How often members heartbeat: a sixth of the session timeout, at most 500 ms, so a plan
/// change reaches every member within half a second (a crashed member's partitions move
/// within its session timeout + about 0.5 s). While a group reconciles, 100 ms: each handover
/// step (revoke, report, assign) then costs a heartbeat round trip, not an interval.
pub(super) fn heartbeat_interval_ms(session_timeout_ms: u32, reconciling: bool) -> u32 {
    if reconciling {
        return 100;
    }
    (session_timeout_ms / 6).clamp(100, 500)
}

impl<S: GroupStore> GroupManager<S> {
    pub(super) async fn join(&mut self, request: JoinGroupRequest) -> JoinGroupResponse {
        let refuse = |error| JoinGroupResponse {
            error,
            member_id: String::new(),
            generation: -1,
            heartbeat_interval_ms: 0,
        };
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&request.session_timeout_ms)
        {
            return refuse(ErrorCode::InvalidConfig);
        }
        let assignor = if request.assignor.is_empty() {
            AssignorKind::default()
        } else {
            match AssignorKind::parse(&request.assignor) {
                Some(assignor) => assignor,
                None => return refuse(ErrorCode::InconsistentAssignor),
            }
        };
        let new_member_id = self.new_member_id(&request.client_id);
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(error),
        };
        let params = JoinParams {
            member_id: (!request.member_id.is_empty()).then_some(request.member_id),
            instance_id: request.instance_id,
            client_id: request.client_id,
            topics: request.topics,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            assignor,
        };
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return refuse(error),
        };
        let joined = match core.join(now_ms, params, &partitions, new_member_id) {
            Ok(joined) => joined,
            Err(error) => return refuse(group_error(error)),
        };
        if let Err(error) = self.persist_group(&request.group).await {
            return refuse(error);
        }
        tracing::info!(group = %request.group, member = %joined.member_id, generation = joined.generation, "member joined");
        JoinGroupResponse {
            error: ErrorCode::None,
            member_id: joined.member_id,
            generation: joined.generation,
            // The group reconciles after a join: the member's first answers come quickly.
            heartbeat_interval_ms: heartbeat_interval_ms(request.session_timeout_ms, true),
        }
    }

    /// A member id no other member had: unique across restarts of this broker too (the start
    /// time is in it).
    pub(super) fn new_member_id(&mut self, client_id: &str) -> String {
        self.members_named += 1;
        let client = if client_id.is_empty() {
            "member"
        } else {
            client_id
        };
        format!(
            "{client}-{}-{}-{}",
            self.config.node_id,
            self.config.clock.wall_ms(),
            self.members_named
        )
    }

    pub(super) async fn heartbeat(&mut self, request: HeartbeatRequest) -> HeartbeatResponse {
        let refuse = |error| HeartbeatResponse {
            error,
            generation: -1,
            assignment: Vec::new(),
            heartbeat_interval_ms: 0,
        };
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return refuse(error),
        };
        let owned = from_wire(request.owned);
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return refuse(error),
        };
        let assignment = match core.heartbeat(
            now_ms,
            &request.member_id,
            request.generation,
            &owned,
            &partitions,
        ) {
            Ok(assignment) => assignment,
            Err(error) => return refuse(group_error(error)),
        };
        let interval_ms = heartbeat_interval_ms(
            core.session_timeout_ms(&request.member_id)
                .unwrap_or(10_000),
            core.state() == GroupState::Reconciling,
        );
        if let Err(error) = self.persist_group(&request.group).await {
            return refuse(error);
        }
        HeartbeatResponse {
            error: ErrorCode::None,
            generation: assignment.generation,
            assignment: to_wire(&assignment.partitions),
            heartbeat_interval_ms: interval_ms,
        }
    }

    pub(super) async fn leave(&mut self, request: LeaveGroupRequest) -> LeaveGroupResponse {
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let coordinated = match self.claim(&request.group).await {
            Ok(coordinated) => coordinated,
            Err(error) => return LeaveGroupResponse { error },
        };
        let core = match coordinated.strata(&request.group) {
            Ok(core) => core,
            Err(error) => return LeaveGroupResponse { error },
        };
        if let Err(error) = core.leave(now_ms, &request.member_id, &partitions) {
            return LeaveGroupResponse {
                error: group_error(error),
            };
        }
        tracing::info!(group = %request.group, member = %request.member_id, "member left");
        let error = self
            .persist_group(&request.group)
            .await
            .err()
            .unwrap_or(ErrorCode::None);
        LeaveGroupResponse { error }
    }
}
