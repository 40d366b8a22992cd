//! Kafka's classic group protocol, for clients on the Kafka listener: JoinGroup and
//! SyncGroup wait for the rebalance, answered when the group's state machine says so.

use strata_coordinator::GroupStore;
use strata_wire::protocol::ErrorCode;
use tokio::sync::oneshot;

use crate::group::classic::{ClassicError, ClassicGroup, Joined, Reply, Synced};
use crate::server::messages::{KafkaGroupAnswer, KafkaGroupError, KafkaGroupRequest};

use super::GroupManager;
use super::manager::Core;
use super::wire::{SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN};

/// The answer to a Kafka join or sync that a newer one of the same member replaced.
pub(super) fn superseded(join: bool) -> KafkaGroupAnswer {
    if join {
        KafkaGroupAnswer::Join(Err(ErrorCode::RebalanceInProgress))
    } else {
        KafkaGroupAnswer::Sync(Err(KafkaGroupError::Classic(
            ClassicError::RebalanceInProgress,
        )))
    }
}

impl<S: GroupStore> GroupManager<S> {
    /// The group's Kafka-protocol state machine, claimed (and switched to) if needed.
    pub(super) async fn kafka_group(
        &mut self,
        group: &str,
    ) -> Result<&mut ClassicGroup, ErrorCode> {
        let delay = self.config.group_initial_rebalance_delay_ms;
        self.claim(group).await?.kafka(delay)
    }

    pub(super) async fn handle_kafka(
        &mut self,
        request: KafkaGroupRequest,
        reply: oneshot::Sender<KafkaGroupAnswer>,
    ) {
        let now_ms = self.now_ms();
        let group = match request {
            KafkaGroupRequest::ConsumerHeartbeat(heartbeat) => {
                let answer = self.consumer_heartbeat(heartbeat).await;
                let _ = reply.send(KafkaGroupAnswer::ConsumerHeartbeat(answer));
                return;
            }
            KafkaGroupRequest::ConsumerDescribe { group } => {
                let answer = self.consumer_describe(&group).await;
                let _ = reply.send(KafkaGroupAnswer::ConsumerDescribed(answer));
                return;
            }
            KafkaGroupRequest::Join { group, request } => {
                if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX)
                    .contains(&request.session_timeout_ms)
                {
                    let _ = reply.send(KafkaGroupAnswer::Join(Err(ErrorCode::InvalidConfig)));
                    return;
                }
                let new_member_id = self.new_member_id(&request.client_id);
                let classic = match self.kafka_group(&group).await {
                    Ok(classic) => classic,
                    Err(error) => {
                        let _ = reply.send(KafkaGroupAnswer::Join(Err(error)));
                        return;
                    }
                };
                let asked = request.member_id.clone();
                match classic.join(now_ms, request, new_member_id) {
                    Joined::Now(answer) => {
                        tracing::debug!(%group, member = %asked, error = ?answer.error, generation = answer.generation, "kafka join answered at once");
                        let _ = reply.send(KafkaGroupAnswer::Join(Ok(answer)));
                    }
                    Joined::Wait { member_id } => {
                        tracing::info!(%group, member = %member_id, "kafka member joining");
                        self.wait_kafka(&group, member_id, true, reply);
                    }
                }
                group
            }
            KafkaGroupRequest::Sync {
                group,
                member_id,
                instance_id,
                generation,
                assignments,
            } => {
                let synced = match self.kafka_group(&group).await {
                    Ok(classic) => classic
                        .check_instance(&member_id, instance_id.as_deref())
                        .and_then(|()| classic.sync(now_ms, &member_id, generation, assignments))
                        .map_err(KafkaGroupError::Classic),
                    Err(error) => Err(KafkaGroupError::Coordinator(error)),
                };
                tracing::debug!(%group, member = %member_id, generation, waiting = matches!(synced, Ok(Synced::Wait)), error = ?synced.as_ref().err(), "kafka sync");
                match synced {
                    Ok(Synced::Now(assignment)) => {
                        let _ = reply.send(KafkaGroupAnswer::Sync(Ok(assignment)));
                    }
                    Ok(Synced::Wait) => self.wait_kafka(&group, member_id, false, reply),
                    Err(error) => {
                        let _ = reply.send(KafkaGroupAnswer::Sync(Err(error)));
                    }
                }
                group
            }
            KafkaGroupRequest::Heartbeat {
                group,
                member_id,
                instance_id,
                generation,
            } => {
                let beat = match self.kafka_group(&group).await {
                    Ok(classic) => classic
                        .check_instance(&member_id, instance_id.as_deref())
                        .and_then(|()| classic.heartbeat(now_ms, &member_id, generation))
                        .map_err(KafkaGroupError::Classic),
                    Err(error) => Err(KafkaGroupError::Coordinator(error)),
                };
                tracing::debug!(%group, member = %member_id, generation, outcome = ?beat, "kafka heartbeat");
                let _ = reply.send(KafkaGroupAnswer::Heartbeat(beat));
                // A heartbeat changes only when its member was last heard from, which is not
                // stored: nothing to store (no snapshot of the group to build) or deliver.
                return;
            }
            KafkaGroupRequest::Leave { group, members } => {
                let left = match self.kafka_group(&group).await {
                    Ok(classic) => members
                        .into_iter()
                        .map(|(member, instance)| {
                            let member = match (&instance, member.is_empty()) {
                                (Some(instance), true) => classic
                                    .member_of_instance(instance)
                                    .unwrap_or_default()
                                    .to_string(),
                                _ => member,
                            };
                            let left = classic
                                .check_instance(&member, instance.as_deref())
                                .and_then(|()| classic.leave(now_ms, &member))
                                .map_err(KafkaGroupError::Classic);
                            (member, left)
                        })
                        .collect(),
                    Err(error) => members
                        .into_iter()
                        .map(|(member, _)| (member, Err(KafkaGroupError::Coordinator(error))))
                        .collect(),
                };
                let _ = reply.send(KafkaGroupAnswer::Leave(left));
                group
            }
        };
        self.deliver_kafka(&group).await;
    }

    pub(super) fn wait_kafka(
        &mut self,
        group: &str,
        member_id: String,
        join: bool,
        reply: oneshot::Sender<KafkaGroupAnswer>,
    ) {
        // A member asking again replaces its earlier request, which hears it was superseded.
        if let Some((was_join, earlier)) = self
            .kafka_waiters
            .insert((group.to_string(), member_id), (join, reply))
        {
            tracing::debug!(%group, join = was_join, "a member's earlier request superseded");
            let _ = earlier.send(superseded(was_join));
        }
    }

    /// Answers the Kafka members the group's last steps answered, once a new generation is in
    /// the store (a member is never told of a generation a coordinator taking over could
    /// repeat). If the store refuses, every waiting member of the group hears why.
    pub(super) async fn deliver_kafka(&mut self, group: &str) {
        let Some(Core::Kafka(classic)) = self.groups.get_mut(group).map(|c| &mut c.core) else {
            self.fail_kafka_waiters(group, ErrorCode::NotCoordinator);
            return;
        };
        let replies = classic.take_replies();
        if let Err(error) = self.persist_group(group).await {
            self.fail_kafka_waiters(group, error);
            return;
        }
        for (member, reply) in replies {
            let Some((_, waiter)) = self
                .kafka_waiters
                .remove(&(group.to_string(), member.clone()))
            else {
                tracing::debug!(%group, %member, "a reply for a member not waiting");
                continue;
            };
            tracing::debug!(%group, %member, join = matches!(reply, Reply::Join(_)), "reply delivered");
            let answer = match reply {
                Reply::Join(answer) => KafkaGroupAnswer::Join(Ok(answer)),
                Reply::Sync(synced) => {
                    KafkaGroupAnswer::Sync(synced.map_err(KafkaGroupError::Classic))
                }
            };
            let _ = waiter.send(answer);
        }
    }

    pub(super) fn fail_kafka_waiters(&mut self, group: &str, error: ErrorCode) {
        let waiting: Vec<(String, String)> = self
            .kafka_waiters
            .keys()
            .filter(|(name, _)| name == group)
            .cloned()
            .collect();
        for key in waiting {
            let (join, waiter) = self.kafka_waiters.remove(&key).expect("listed");
            let _ = waiter.send(if join {
                KafkaGroupAnswer::Join(Err(error))
            } else {
                KafkaGroupAnswer::Sync(Err(KafkaGroupError::Coordinator(error)))
            });
        }
    }
}
