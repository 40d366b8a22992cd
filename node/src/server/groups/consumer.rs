//! KIP-848's consumer group protocol (Kafka clients with `group.protocol=consumer`) on
//! Strata's own groups: the same server-side, cooperative state machine ([`crate::group`])
//! that native members use, so a group's members may speak either protocol.
//!
//! A heartbeat at epoch 0 joins (or, for a member the group still has, joins again), then
//! reports what the member owns; a later one reports at the member's epoch (Strata's member
//! generation); -1 leaves; -2 (a static member going for now) leaves its place held for its
//! session timeout, for the next process with its instance id. A member whose epoch is not
//! the group's for it is fenced: it drops its partitions and joins again at epoch 0. Members
//! send their subscription only when it changes; a regular expression is kept here and
//! matched again against the topics at each heartbeat, so new topics join it. Sessions last
//! `--group-consumer-session-timeout-ms`, as Kafka's members do not choose their own.

use std::collections::BTreeSet;

use strata_coordinator::GroupStore;
use strata_wire::protocol::ErrorCode;

use crate::group::{AssignorKind, GroupError, GroupState, JoinParams};
use crate::server::messages::{
    ConsumerAssignment, ConsumerGroupDescription, ConsumerHeartbeat, ConsumerRefusal,
};

use super::GroupManager;
use super::manager::Core;
use super::native::heartbeat_interval_ms;

/// A member's subscription by regular expression, as it sent it and compiled, and the topics
/// it names besides (a subscription is the names and the pattern's matches together).
pub(super) struct Pattern {
    pub(super) source: String,
    regex: regex_automata::meta::Regex,
    names: BTreeSet<String>,
}

impl Pattern {
    /// Kafka's subscriptions use RE2/J syntax, which this engine shares; the whole topic
    /// name must match, as Java's `Pattern.matches` does.
    fn compile(source: &str) -> Result<Pattern, ConsumerRefusal> {
        let anchored = format!("^(?:{source})$");
        regex_automata::meta::Regex::new(&anchored)
            .map(|regex| Pattern {
                source: source.to_string(),
                regex,
                names: BTreeSet::new(),
            })
            .map_err(|error| ConsumerRefusal::InvalidRegex(format!("{source:?}: {error}")))
    }

    fn matches(&self, topic: &str) -> bool {
        self.regex.is_match(topic)
    }
}

/// The server-side assignor a member names: Kafka's `uniform` is Strata's sticky one (it
/// balances and keeps partitions where they are), `range` its range one.
fn assignor(name: &str) -> Option<AssignorKind> {
    match name {
        "uniform" => Some(AssignorKind::Sticky),
        "range" => Some(AssignorKind::Range),
        _ => None,
    }
}

fn refusal(error: GroupError) -> ConsumerRefusal {
    match error {
        GroupError::IllegalGeneration => ConsumerRefusal::FencedEpoch,
        GroupError::UnknownMember => ConsumerRefusal::Group(ErrorCode::UnknownMemberId),
        GroupError::FencedInstanceId => ConsumerRefusal::Group(ErrorCode::FencedInstanceId),
        GroupError::InconsistentAssignor => ConsumerRefusal::UnsupportedAssignor(
            "the group's other members use another assignor".into(),
        ),
    }
}

impl<S: GroupStore> GroupManager<S> {
    pub(super) async fn consumer_heartbeat(
        &mut self,
        request: ConsumerHeartbeat,
    ) -> Result<ConsumerAssignment, ConsumerRefusal> {
        let pattern = match &request.regex {
            Some(source) if !source.is_empty() => Some(Pattern::compile(source)?),
            _ => None,
        };
        let asked_assignor = match &request.assignor {
            Some(name) => Some(assignor(name).ok_or_else(|| {
                ConsumerRefusal::UnsupportedAssignor(format!(
                    "{name:?}: the assignors are uniform and range"
                ))
            })?),
            None => None,
        };
        let now_ms = self.now_ms();
        let partitions = self.partitions.clone();
        let session_timeout_ms = self.config.group_consumer_session_timeout_ms;
        let generated_id = request
            .member_id
            .is_empty()
            .then(|| self.new_member_id(&request.client_id));
        let topics = self.subscription(&request, pattern);
        let coordinated = self
            .claim(&request.group)
            .await
            .map_err(ConsumerRefusal::Group)?;
        let core = coordinated
            .strata(&request.group)
            .map_err(|error| match error {
                ErrorCode::InconsistentAssignor => {
                    ConsumerRefusal::Group(ErrorCode::InconsistentAssignor)
                }
                other => ConsumerRefusal::Group(other),
            })?;
        let member_id = generated_id.unwrap_or_else(|| request.member_id.clone());
        let known = core.member_topics(&member_id).cloned();
        match request.member_epoch {
            -1 => {
                if known.is_some() {
                    core.leave(now_ms, &member_id, &partitions)
                        .map_err(refusal)?;
                    tracing::info!(group = %request.group, member = %member_id, "consumer left");
                }
                self.persist_group(&request.group)
                    .await
                    .map_err(ConsumerRefusal::Group)?;
                return Ok(ConsumerAssignment {
                    member_id,
                    member_epoch: -1,
                    heartbeat_interval_ms: 0,
                    partitions: None,
                });
            }
            // A static member going for now keeps its place until its session times out.
            -2 => {
                return Ok(ConsumerAssignment {
                    member_id,
                    member_epoch: -2,
                    heartbeat_interval_ms: 0,
                    partitions: None,
                });
            }
            _ => {}
        }
        let joining = request.member_epoch == 0;
        if !joining && known.is_none() {
            return Err(ConsumerRefusal::Group(ErrorCode::UnknownMemberId));
        }
        if known.is_none() && core.was_fenced(&member_id) {
            // The id of a static member another process took over: that one is it now.
            return Err(ConsumerRefusal::Group(ErrorCode::FencedInstanceId));
        }
        let topics_changed = topics
            .as_ref()
            .is_some_and(|topics| Some(topics) != known.as_ref());
        let mut epoch = request.member_epoch;
        if joining || topics_changed {
            let assignor = asked_assignor.unwrap_or_else(|| {
                if core.has_no_members() {
                    AssignorKind::Sticky
                } else {
                    core.assignor()
                }
            });
            let params = JoinParams {
                member_id: known.is_some().then(|| member_id.clone()),
                instance_id: request.instance_id.clone(),
                client_id: request.client_id.clone(),
                topics: topics
                    .clone()
                    .or(known.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
                session_timeout_ms,
                rebalance_timeout_ms: u32::try_from(request.rebalance_timeout_ms)
                    .unwrap_or(300_000)
                    .max(1),
                assignor,
            };
            let joined = core
                .join(now_ms, params, &partitions, member_id.clone())
                .map_err(refusal)?;
            if joining {
                tracing::info!(group = %request.group, member = %joined.member_id, "consumer joined");
                epoch = joined.generation;
            }
        }
        let owned = if joining {
            Vec::new()
        } else {
            request.owned.clone().unwrap_or_default()
        };
        let assignment = core
            .heartbeat(now_ms, &member_id, epoch, &owned, &partitions)
            .map_err(refusal)?;
        let interval =
            heartbeat_interval_ms(session_timeout_ms, core.state() == GroupState::Reconciling);
        self.persist_group(&request.group)
            .await
            .map_err(ConsumerRefusal::Group)?;
        Ok(ConsumerAssignment {
            member_id,
            member_epoch: assignment.generation,
            heartbeat_interval_ms: i32::try_from(interval).unwrap_or(i32::MAX),
            partitions: Some(assignment.partitions),
        })
    }

    /// The member's subscription: the topics it names and those its regular expression
    /// matches now, each as it sent it or, where it sent nothing (unchanged), as kept; `None`
    /// when it sent no names and has no pattern (its subscription is the group's record of it).
    /// An empty expression clears the pattern.
    fn subscription(
        &mut self,
        request: &ConsumerHeartbeat,
        pattern: Option<Pattern>,
    ) -> Option<BTreeSet<String>> {
        let key = (request.group.clone(), request.member_id.clone());
        let sent_names = request
            .topics
            .as_ref()
            .map(|topics| topics.iter().cloned().collect::<BTreeSet<String>>());
        if request.member_epoch == -1 {
            self.consumer_patterns.remove(&key);
        } else if let Some(mut pattern) = pattern {
            let kept = self.consumer_patterns.remove(&key);
            pattern.names = sent_names
                .clone()
                .or(kept.map(|kept| kept.names))
                .unwrap_or_default();
            self.consumer_patterns.insert(key.clone(), pattern);
        } else if request.regex.is_some() {
            self.consumer_patterns.remove(&key);
        } else if let (Some(names), Some(kept)) =
            (&sent_names, self.consumer_patterns.get_mut(&key))
        {
            kept.names = names.clone();
        }
        match self.consumer_patterns.get(&key) {
            Some(pattern) => Some(
                self.partitions
                    .keys()
                    .filter(|topic| pattern.matches(topic))
                    .chain(&pattern.names)
                    .cloned()
                    .collect(),
            ),
            None => sent_names,
        }
    }

    /// The KIP-848 view of `group`, when it is one of Strata's groups and runs here.
    pub(super) async fn consumer_describe(
        &mut self,
        group: &str,
    ) -> Result<Option<ConsumerGroupDescription>, ErrorCode> {
        let (_, running) = self.offsets_of(group).await?;
        let Some(Core::Strata(core)) = running.map(|coordinated| &coordinated.core) else {
            return Ok(None);
        };
        let description = core.describe();
        let regexes = self
            .consumer_patterns
            .iter()
            .filter(|((of, _), _)| of == group)
            .map(|((_, member), pattern)| (member.clone(), pattern.source.clone()))
            .collect();
        Ok(Some(ConsumerGroupDescription {
            description,
            regexes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_names_and_bad_ones_are_refused() {
        let pattern = Pattern::compile("orders-.*").unwrap();
        assert!(pattern.matches("orders-eu"));
        assert!(
            !pattern.matches("old-orders-eu"),
            "the whole name must match"
        );
        let alternatives = Pattern::compile("a|b").unwrap();
        assert!(alternatives.matches("a") && alternatives.matches("b"));
        assert!(!alternatives.matches("ab"));
        assert!(matches!(
            Pattern::compile("orders-("),
            Err(ConsumerRefusal::InvalidRegex(_))
        ));
        assert_eq!(assignor("uniform"), Some(AssignorKind::Sticky));
        assert_eq!(assignor("range"), Some(AssignorKind::Range));
        assert_eq!(assignor("cooperative-sticky"), None);
    }
}
