//! Consumer groups from the client side: the coordinator connection, committed offsets, and the
//! subscribe-mode consumer ([`GroupConsumer`]).
//!
//! Assignment is computed by the group's coordinator (server side, cooperative): a background
//! task heartbeats with the partitions this member owns, and each answer is exactly the set it
//! may own now. `poll` applies the difference: revoked partitions are committed (at-least-once)
//! and dropped first, then new ones start from the group's committed offsets (or
//! `auto_offset_reset`). Partitions that stay are never paused, whatever else moves.
//!
//! Delivery:
//! - at-least-once (default): offsets of records returned by earlier polls are committed
//!   (auto-commit every `auto_commit_interval`, on revocation, and on `close`), so a crash
//!   re-delivers at most what was returned since the last commit;
//! - at-most-once: each poll commits the positions past what it returns *before* returning it,
//!   so a crash skips what was being processed but never delivers a record twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_wire::protocol::{
    CommittedOffset, DeleteGroupRequest, DescribeGroupRequest, DescribeGroupResponse, ErrorCode,
    FindCoordinatorRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListedGroup, OffsetCommitPartition, OffsetCommitRequest, OffsetCommitTopic,
    OffsetFetchRequest, Request, Response, TopicPartitions,
};
use tokio::time::Instant;

use crate::{Client, ClientError, ConsumedBatch, Consumer, ConsumerConfig, OffsetReset, SeekTo};

/// A partition of a topic, as groups name it.
pub type TopicPartition = (String, u32);

fn coordinator_error(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable | ErrorCode::NotReady
    )
}

/// Offsets (the next offset to consume per partition) as a commit request carries them.
pub(crate) fn offset_topics(offsets: &BTreeMap<TopicPartition, u64>) -> Vec<OffsetCommitTopic> {
    let mut topics: Vec<OffsetCommitTopic> = Vec::new();
    for ((topic, partition), offset) in offsets {
        let entry = OffsetCommitPartition {
            partition: *partition,
            offset: *offset,
            metadata: String::new(),
        };
        match topics.last_mut().filter(|t| &t.name == topic) {
            Some(last) => last.partitions.push(entry),
            None => topics.push(OffsetCommitTopic {
                name: topic.clone(),
                partitions: vec![entry],
            }),
        }
    }
    topics
}

impl Client {
    /// The `host:port` of the broker coordinating `group`.
    pub async fn find_coordinator(&self, group: &str) -> Result<String, ClientError> {
        self.find_coordinator_of(group, false).await
    }

    /// The `host:port` of the broker coordinating `key`: a group, or with `transaction` a
    /// transactional id.
    pub async fn find_coordinator_of(
        &self,
        key: &str,
        transaction: bool,
    ) -> Result<String, ClientError> {
        let request = Request::FindCoordinator(FindCoordinatorRequest {
            group: key.to_string(),
            transaction: strata_wire::protocol::Appended(transaction),
        });
        let Response::FindCoordinator(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "find coordinator answered with another api".into(),
            ));
        };
        if response.error != ErrorCode::None {
            return Err(ClientError::Broker(response.error));
        }
        Ok(format!("{}:{}", response.host, response.port))
    }

    /// Sends a group request to the group's coordinator, finding it again (and retrying) while
    /// it moves or loads, for up to the request timeout. `code` reads the answer's error.
    pub async fn group_request(
        &self,
        group: &str,
        request: Request,
        code: fn(&Response) -> ErrorCode,
    ) -> Result<Response, ClientError> {
        self.coordinator_request(group, false, request, code).await
    }

    /// [`Client::group_request`] for a group (`transaction` false) or a transactional id.
    pub(crate) async fn coordinator_request(
        &self,
        key: &str,
        transaction: bool,
        request: Request,
        code: fn(&Response) -> ErrorCode,
    ) -> Result<Response, ClientError> {
        let deadline = Instant::now() + self.config().request_timeout;
        // Groups and transactional ids may share names, not coordinators' cache entries.
        let cache_key = if transaction {
            format!("\0txn\0{key}")
        } else {
            key.to_string()
        };
        let group = cache_key.as_str();
        loop {
            let attempt = async {
                let cached = self
                    .coordinators
                    .lock()
                    .expect("coordinators")
                    .get(group)
                    .cloned();
                let address = match cached {
                    Some(address) => address,
                    None => {
                        let address = self.find_coordinator_of(key, transaction).await?;
                        self.coordinators
                            .lock()
                            .expect("coordinators")
                            .insert(group.to_string(), address.clone());
                        address
                    }
                };
                let response = self.request(&address, request.clone()).await?;
                match code(&response) {
                    ErrorCode::None => Ok(response),
                    code => Err(ClientError::Broker(code)),
                }
            };
            match attempt.await {
                Err(error)
                    if (error.code().is_some_and(coordinator_error)
                        || matches!(
                            error,
                            ClientError::Connect { .. } | ClientError::Disconnected(_)
                        ))
                        && Instant::now() < deadline =>
                {
                    // The coordinator moved or is down: find it again.
                    self.coordinators
                        .lock()
                        .expect("coordinators")
                        .remove(group);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => return result,
            }
        }
    }

    /// Commits `offsets` (the next offset to consume per partition) for `group` in one
    /// transaction. `member_id` "" and generation -1 commit outside membership (assign mode).
    pub async fn commit_offsets(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        offsets: &BTreeMap<TopicPartition, u64>,
    ) -> Result<(), ClientError> {
        let topics = offset_topics(offsets);
        let request = Request::OffsetCommit(OffsetCommitRequest {
            group: group.to_string(),
            member_id: member_id.to_string(),
            generation,
            topics,
        });
        self.group_request(group, request, |r| match r {
            Response::OffsetCommit(r) => r.error,
            _ => ErrorCode::InvalidRequest,
        })
        .await
        .map(|_| ())
    }

    /// The group's committed offsets (every partition it has committed).
    pub async fn committed_offsets(
        &self,
        group: &str,
    ) -> Result<Vec<CommittedOffset>, ClientError> {
        let request = Request::OffsetFetch(OffsetFetchRequest {
            group: group.to_string(),
            topics: None,
            require_stable: Default::default(),
        });
        match self
            .group_request(group, request, |r| match r {
                Response::OffsetFetch(r) => r.error,
                _ => ErrorCode::InvalidRequest,
            })
            .await?
        {
            Response::OffsetFetch(response) => Ok(response.offsets),
            _ => unreachable!("checked by group_request"),
        }
    }

    pub async fn list_groups(&self) -> Result<Vec<ListedGroup>, ClientError> {
        let Response::ListGroups(response) = self
            .any_broker(Request::ListGroups(ListGroupsRequest {}))
            .await?
        else {
            return Err(ClientError::Protocol(
                "list groups answered with another api".into(),
            ));
        };
        if response.error != ErrorCode::None {
            return Err(ClientError::Broker(response.error));
        }
        Ok(response.groups)
    }

    pub async fn describe_group(&self, group: &str) -> Result<DescribeGroupResponse, ClientError> {
        let request = Request::DescribeGroup(DescribeGroupRequest {
            group: group.to_string(),
        });
        match self
            .group_request(group, request, |r| match r {
                Response::DescribeGroup(r) => r.error,
                _ => ErrorCode::InvalidRequest,
            })
            .await?
        {
            Response::DescribeGroup(response) => Ok(response),
            _ => unreachable!("checked by group_request"),
        }
    }

    /// Deletes `group` and its committed offsets; refused (NonEmptyGroup) while it has
    /// members, GroupIdNotFound when no such group is stored.
    pub async fn delete_group(&self, group: &str) -> Result<(), ClientError> {
        let request = Request::DeleteGroup(DeleteGroupRequest {
            group: group.to_string(),
        });
        self.group_request(group, request, |r| match r {
            Response::DeleteGroup(r) => r.error,
            _ => ErrorCode::InvalidRequest,
        })
        .await
        .map(|_| ())
    }
}

impl Client {
    /// Forgets `group`'s committed offsets of `topics`' partitions (Kafka's OffsetDelete):
    /// each partition's result, `GroupSubscribedToTopic` where a member still reads its topic.
    pub async fn delete_offsets(
        &self,
        group: &str,
        topics: Vec<strata_wire::protocol::TopicPartitions>,
    ) -> Result<Vec<strata_wire::protocol::DeleteOffsetsTopic>, ClientError> {
        let request = Request::DeleteOffsets(strata_wire::protocol::DeleteOffsetsRequest {
            group: group.to_string(),
            topics,
        });
        let response = self
            .group_request(group, request, |r| match r {
                Response::DeleteOffsets(r) => r.error,
                _ => ErrorCode::InvalidRequest,
            })
            .await?;
        match response {
            Response::DeleteOffsets(response) => Ok(response.topics),
            _ => unreachable!("checked by group_request"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Commit what earlier polls returned (after the application processed it).
    #[default]
    AtLeastOnce,
    /// Commit before handing records out.
    AtMostOnce,
}

#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub group: String,
    /// `group.instance.id`: static membership (a restart within the session timeout keeps the
    /// assignment, and `close` does not leave the group).
    pub instance_id: Option<String>,
    pub client_id: String,
    pub session_timeout: Duration,
    /// The longest the application may take between polls; past it, this member leaves the
    /// group so its partitions move on.
    pub max_poll_interval: Duration,
    /// `sticky` (default), `range` or `roundrobin`.
    pub assignor: String,
    /// `None`: commit only by `commit_sync`/`commit_async`.
    pub auto_commit_interval: Option<Duration>,
    pub delivery: Delivery,
    pub auto_offset_reset: OffsetReset,
    pub consumer: ConsumerConfig,
}

impl GroupConfig {
    pub fn new(group: impl Into<String>) -> GroupConfig {
        GroupConfig {
            group: group.into(),
            instance_id: None,
            client_id: "strata".into(),
            session_timeout: Duration::from_secs(10),
            max_poll_interval: Duration::from_secs(300),
            assignor: "sticky".into(),
            auto_commit_interval: Some(Duration::from_secs(5)),
            delivery: Delivery::AtLeastOnce,
            auto_offset_reset: OffsetReset::Latest,
            consumer: ConsumerConfig::default(),
        }
    }
}

/// What a rebalance did to this member, told to the listener inside `poll`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    /// These partitions are now this member's; consumption starts at the committed offsets.
    Assigned(Vec<TopicPartition>),
    /// These partitions move to another member; their positions were committed first
    /// (at-least-once) before they stopped.
    Revoked(Vec<TopicPartition>),
    /// The membership was lost (session expired, fenced): these partitions may already be
    /// another member's, so nothing was committed for them.
    Lost(Vec<TopicPartition>),
}

/// Membership as the heartbeat task and `poll` share it.
#[derive(Debug, Default)]
struct Membership {
    member_id: String,
    generation: i32,
    /// What this member owns (what `poll` applied); heartbeats report it.
    owned: BTreeSet<TopicPartition>,
    /// The latest assignment from the coordinator, not applied yet.
    pending: Option<BTreeSet<TopicPartition>>,
    /// Partitions `poll` is starting (taken from `pending`, not yet in `owned`).
    applying: BTreeSet<TopicPartition>,
    /// Set when the coordinator no longer knows this member; `poll` rejoins.
    lost: Option<ErrorCode>,
    last_poll: Option<std::time::Instant>,
    heartbeat_interval: Duration,
}

type Listener = Box<dyn FnMut(&RebalanceEvent) + Send>;

/// A consumer in subscribe mode: a member of a group, given partitions by its coordinator.
pub struct GroupConsumer {
    client: Arc<Client>,
    config: GroupConfig,
    topics: Vec<String>,
    consumer: Consumer,
    membership: Arc<Mutex<Membership>>,
    heartbeats: tokio::task::JoinHandle<()>,
    /// Makes the heartbeat task report a changed assignment at once (handover is faster).
    heartbeat_now: Arc<tokio::sync::Notify>,
    /// Positions past what previous polls returned: what at-least-once commits.
    returned: BTreeMap<TopicPartition, u64>,
    /// What the group has stored (skip commits that change nothing).
    committed: BTreeMap<TopicPartition, u64>,
    last_commit: Instant,
    /// The last `commit_async`: later commits wait for it, so an older position can never
    /// land after a newer one (a handover would then re-deliver).
    commit_in_flight: Option<tokio::task::JoinHandle<()>>,
    listener: Option<Listener>,
}

impl GroupConsumer {
    /// Joins `config.group` subscribed to `topics`. Partitions arrive with the first polls.
    pub async fn subscribe(
        client: Arc<Client>,
        topics: Vec<String>,
        config: GroupConfig,
    ) -> Result<GroupConsumer, ClientError> {
        let membership = Arc::new(Mutex::new(Membership::default()));
        join(&client, &config, &topics, &membership).await?;
        let heartbeat_now = Arc::new(tokio::sync::Notify::new());
        let heartbeats = tokio::spawn(heartbeat_loop(
            client.clone(),
            config.clone(),
            membership.clone(),
            heartbeat_now.clone(),
        ));
        Ok(GroupConsumer {
            // One reset policy, as Kafka's: for partitions nobody committed and for positions
            // out of range alike.
            consumer: Consumer::new(
                client.clone(),
                ConsumerConfig {
                    auto_offset_reset: Some(config.auto_offset_reset),
                    ..config.consumer.clone()
                },
            ),
            client,
            config,
            topics,
            membership,
            heartbeats,
            heartbeat_now,
            returned: BTreeMap::new(),
            committed: BTreeMap::new(),
            last_commit: Instant::now(),
            commit_in_flight: None,
            listener: None,
        })
    }

    /// Called inside `poll` with each assignment change, before records of new partitions are
    /// fetched and after revoked ones were committed.
    pub fn on_rebalance(&mut self, listener: impl FnMut(&RebalanceEvent) + Send + 'static) {
        self.listener = Some(Box::new(listener));
    }

    pub fn member_id(&self) -> String {
        self.membership
            .lock()
            .expect("membership")
            .member_id
            .clone()
    }

    pub fn generation(&self) -> i32 {
        self.membership.lock().expect("membership").generation
    }

    /// The partitions this member consumes now.
    pub fn assignment(&self) -> BTreeSet<TopicPartition> {
        self.membership.lock().expect("membership").owned.clone()
    }

    /// Applies any new assignment, auto-commits when due, then fetches once (long-poll).
    pub async fn poll(&mut self) -> Result<Vec<ConsumedBatch>, ClientError> {
        self.membership.lock().expect("membership").last_poll = Some(std::time::Instant::now());
        self.reconcile().await?;
        if self.config.delivery == Delivery::AtLeastOnce
            && let Some(interval) = self.config.auto_commit_interval
            && self.last_commit.elapsed() >= interval
        {
            self.commit_async();
        }
        if self.assignment().is_empty() {
            // Nothing to fetch yet: wait a heartbeat for partitions to arrive.
            let wait = self
                .membership
                .lock()
                .expect("membership")
                .heartbeat_interval;
            tokio::time::sleep(wait.min(self.config.consumer.max_wait)).await;
            return Ok(Vec::new());
        }
        let batches = self.consumer.poll().await?;
        for batch in &batches {
            let key = (batch.topic.clone(), batch.partition);
            // Only partitions still owned count (a revoked one's stray batch is dropped).
            if self
                .membership
                .lock()
                .expect("membership")
                .owned
                .contains(&key)
            {
                self.returned.insert(key, batch.batch.last_offset() + 1);
            }
        }
        if self.config.delivery == Delivery::AtMostOnce && !batches.is_empty() {
            // Commit first: if this process dies while handling them, they are not re-read.
            self.commit_sync().await?;
        }
        Ok(batches)
    }

    /// Says the application handled `partition` of `topic` only up to `next_offset` (it stopped
    /// inside a returned batch): commits then cover exactly that.
    pub fn consumed_up_to(&mut self, topic: &str, partition: u32, next_offset: u64) {
        self.returned
            .insert((topic.to_string(), partition), next_offset);
    }

    /// Commits the positions past everything `poll` has returned, and waits for it.
    pub async fn commit_sync(&mut self) -> Result<(), ClientError> {
        let offsets = self.uncommitted();
        self.last_commit = Instant::now();
        if offsets.is_empty() {
            return Ok(());
        }
        self.wait_for_commit_in_flight().await;
        let (member_id, generation) = self.identity();
        let mut committed = self
            .client
            .commit_offsets(&self.config.group, &member_id, generation, &offsets)
            .await;
        if let Err(ClientError::Broker(ErrorCode::IllegalGeneration)) = committed {
            // The coordinator may have moved this member to a new generation with an answer
            // not applied yet (in flight, or cut off by `close`). Learn the generation and, if
            // it moved and the member is still in the group, commit again: the offsets are of
            // partitions it still holds, which nobody else reads until it lets them go.
            let request =
                heartbeat_request(&self.config, &self.membership.lock().expect("membership"));
            send_heartbeat(&self.client, &self.config, &self.membership, request).await;
            let (lost, current) = {
                let state = self.membership.lock().expect("membership");
                (state.lost.is_some(), state.generation)
            };
            if !lost && current != generation {
                committed = self
                    .client
                    .commit_offsets(&self.config.group, &member_id, current, &offsets)
                    .await;
            }
        }
        committed?;
        self.committed.extend(offsets);
        Ok(())
    }

    async fn wait_for_commit_in_flight(&mut self) {
        if let Some(commit) = self.commit_in_flight.take() {
            let _ = commit.await;
        }
    }

    /// Starts a commit of the same positions and returns at once; a failure is logged (the
    /// next commit covers it).
    pub fn commit_async(&mut self) {
        let offsets = self.uncommitted();
        self.last_commit = Instant::now();
        if offsets.is_empty() {
            return;
        }
        let (member_id, generation) = self.identity();
        let client = self.client.clone();
        let group = self.config.group.clone();
        self.committed.extend(offsets.clone());
        tokio::spawn(async move {
            if let Err(error) = client
                .commit_offsets(&group, &member_id, generation, &offsets)
                .await
            {
                tracing::warn!(%group, "offset commit failed: {error}");
            }
        });
    }

    /// Commits what was returned (at-least-once) and leaves the group, so its partitions move
    /// on at once. A static member keeps its place instead (it is expected back).
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.heartbeats.abort();
        let committed = if self.config.delivery == Delivery::AtLeastOnce {
            self.commit_sync().await
        } else {
            Ok(())
        };
        if self.config.instance_id.is_none() {
            let (member_id, _) = self.identity();
            let request = Request::LeaveGroup(LeaveGroupRequest {
                group: self.config.group.clone(),
                member_id,
            });
            self.client
                .group_request(&self.config.group, request, |r| match r {
                    Response::LeaveGroup(r) => r.error,
                    _ => ErrorCode::InvalidRequest,
                })
                .await?;
        }
        committed
    }

    fn identity(&self) -> (String, i32) {
        let membership = self.membership.lock().expect("membership");
        (membership.member_id.clone(), membership.generation)
    }

    fn uncommitted(&self) -> BTreeMap<TopicPartition, u64> {
        let owned = self.assignment();
        self.returned
            .iter()
            .filter(|(key, offset)| {
                owned.contains(*key) && self.committed.get(*key) != Some(offset)
            })
            .map(|(key, offset)| (key.clone(), *offset))
            .collect()
    }

    fn tell(&mut self, event: RebalanceEvent) {
        if let Some(listener) = self.listener.as_mut() {
            listener(&event);
        }
    }

    /// Applies what the heartbeat task learned: a lost membership, or a new assignment.
    async fn reconcile(&mut self) -> Result<(), ClientError> {
        let lost = self.membership.lock().expect("membership").lost.take();
        if lost == Some(ErrorCode::FencedInstanceId) {
            // Another process runs with this instance id: rejoining would fence it in turn.
            return Err(ClientError::Broker(ErrorCode::FencedInstanceId));
        }
        if let Some(code) = lost {
            let owned = std::mem::take(&mut self.membership.lock().expect("membership").owned);
            tracing::warn!(group = %self.config.group, %code, "group membership lost; joining again");
            for (topic, partition) in &owned {
                self.consumer.unassign(topic, *partition);
                self.returned.remove(&(topic.clone(), *partition));
            }
            if !owned.is_empty() {
                self.tell(RebalanceEvent::Lost(owned.into_iter().collect()));
            }
            join(&self.client, &self.config, &self.topics, &self.membership).await?;
        }
        let (target, owned, added) = {
            let mut membership = self.membership.lock().expect("membership");
            let Some(target) = membership.pending.take() else {
                return Ok(());
            };
            let owned = membership.owned.clone();
            let added: Vec<TopicPartition> = target.difference(&owned).cloned().collect();
            // Reported from now on, though their positions are still being looked up.
            membership.applying = added.iter().cloned().collect();
            (target, owned, added)
        };
        let revoked: Vec<TopicPartition> = owned.difference(&target).cloned().collect();
        if !revoked.is_empty() {
            if self.config.delivery == Delivery::AtLeastOnce {
                // Hand over exactly where this member stopped: the next owner starts there.
                let offsets: BTreeMap<TopicPartition, u64> = revoked
                    .iter()
                    .filter_map(|key| {
                        let offset = *self.returned.get(key)?;
                        (self.committed.get(key) != Some(&offset)).then(|| (key.clone(), offset))
                    })
                    .collect();
                self.wait_for_commit_in_flight().await;
                if !offsets.is_empty() {
                    let (member_id, generation) = self.identity();
                    if let Err(error) = self
                        .client
                        .commit_offsets(&self.config.group, &member_id, generation, &offsets)
                        .await
                    {
                        tracing::warn!(group = %self.config.group, "commit on revocation failed: {error}");
                    }
                }
            }
            for key in &revoked {
                self.consumer.unassign(&key.0, key.1);
                self.returned.remove(key);
                self.committed.remove(key);
            }
            self.membership
                .lock()
                .expect("membership")
                .owned
                .retain(|key| !revoked.contains(key));
            self.tell(RebalanceEvent::Revoked(revoked));
        }
        if !added.is_empty() {
            if let Err(error) = self.start_partitions(&added).await {
                // Not started: apply the assignment again at the next poll (still reported).
                let mut membership = self.membership.lock().expect("membership");
                membership.applying.clear();
                membership.pending.get_or_insert(target);
                return Err(error);
            }
            let mut membership = self.membership.lock().expect("membership");
            membership.owned.extend(added.iter().cloned());
            membership.applying.clear();
            drop(membership);
            self.tell(RebalanceEvent::Assigned(added));
        }
        // Report what is owned now at once: released partitions can move on.
        self.heartbeat_now.notify_one();
        Ok(())
    }
}

impl GroupConsumer {
    /// Positions newly assigned partitions at the group's committed offsets (or the reset).
    async fn start_partitions(&mut self, added: &[TopicPartition]) -> Result<(), ClientError> {
        // Partitions added to a topic since the metadata was read are not in it yet.
        let metadata = self.client.metadata().await?;
        let known = |(topic, partition): &TopicPartition| {
            metadata
                .topics
                .get(topic)
                .is_some_and(|t| t.partitions.iter().any(|p| p.partition == *partition))
        };
        if !added.iter().all(known) {
            self.client.refresh_metadata().await?;
        }
        let committed: HashMap<TopicPartition, i64> = self
            .client
            .committed_offsets(&self.config.group)
            .await?
            .into_iter()
            .map(|c| ((c.topic, c.partition), c.offset))
            .collect();
        for key in added {
            let start = match committed.get(key) {
                Some(&offset) if offset >= 0 => SeekTo::Offset(offset as u64),
                _ => self.config.auto_offset_reset.seek_to(),
            };
            self.consumer.seek(&key.0, key.1, start).await?;
            if let Some(&offset) = committed.get(key).filter(|offset| **offset >= 0) {
                self.committed.insert(key.clone(), offset as u64);
            }
        }
        Ok(())
    }
}

impl Membership {
    /// What heartbeats report: everything this member owns or has been given and is still
    /// starting, and what an unapplied answer gives it. The coordinator takes a partition
    /// missing from a report as released, so a report must never miss one this member may
    /// still read (it would be handed to another member too).
    fn reported(&self) -> BTreeSet<TopicPartition> {
        let mut reported = self.owned.clone();
        reported.extend(self.applying.iter().cloned());
        if let Some(pending) = &self.pending {
            reported.extend(pending.iter().cloned());
        }
        reported
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// Joins (or rejoins) the group; a static member keeps its instance id.
async fn join(
    client: &Client,
    config: &GroupConfig,
    topics: &[String],
    membership: &Mutex<Membership>,
) -> Result<(), ClientError> {
    let request = Request::JoinGroup(JoinGroupRequest {
        group: config.group.clone(),
        member_id: String::new(),
        instance_id: config.instance_id.clone(),
        client_id: config.client_id.clone(),
        topics: topics.to_vec(),
        session_timeout_ms: config.session_timeout.as_millis() as u32,
        rebalance_timeout_ms: config.max_poll_interval.as_millis() as u32,
        assignor: config.assignor.clone(),
    });
    let response = client
        .group_request(&config.group, request, |r| match r {
            Response::JoinGroup(r) => r.error,
            _ => ErrorCode::InvalidRequest,
        })
        .await?;
    let Response::JoinGroup(joined) = response else {
        unreachable!("checked by group_request");
    };
    let mut membership = membership.lock().expect("membership");
    membership.member_id = joined.member_id;
    membership.generation = joined.generation;
    membership.heartbeat_interval = Duration::from_millis(u64::from(joined.heartbeat_interval_ms));
    membership.lost = None;
    tracing::info!(group = %config.group, member = %membership.member_id, generation = joined.generation, "joined the group");
    Ok(())
}

fn to_wire(partitions: &BTreeSet<TopicPartition>) -> Vec<TopicPartitions> {
    let mut wire: Vec<TopicPartitions> = Vec::new();
    for (topic, partition) in partitions {
        match wire.last_mut().filter(|t| &t.topic == topic) {
            Some(last) => last.partitions.push(*partition),
            None => wire.push(TopicPartitions {
                topic: topic.clone(),
                partitions: vec![*partition],
            }),
        }
    }
    wire
}

/// The heartbeat a member sends now: who it is, at which generation, what it may still read.
fn heartbeat_request(config: &GroupConfig, state: &Membership) -> Request {
    Request::Heartbeat(HeartbeatRequest {
        group: config.group.clone(),
        member_id: state.member_id.clone(),
        generation: state.generation,
        owned: to_wire(&state.reported()),
    })
}

/// Sends a heartbeat and applies its answer: the generation, the interval, a new assignment to
/// take up, or the loss of membership.
async fn send_heartbeat(
    client: &Client,
    config: &GroupConfig,
    membership: &Mutex<Membership>,
    request: Request,
) {
    let answer = client
        .group_request(&config.group, request, |r| match r {
            Response::Heartbeat(r) => r.error,
            _ => ErrorCode::InvalidRequest,
        })
        .await;
    let mut state = membership.lock().expect("membership");
    match answer {
        Ok(Response::Heartbeat(response)) => {
            state.generation = response.generation;
            state.heartbeat_interval =
                Duration::from_millis(u64::from(response.heartbeat_interval_ms));
            let assignment: BTreeSet<TopicPartition> = response
                .assignment
                .into_iter()
                .flat_map(|tp| {
                    let topic = tp.topic;
                    tp.partitions.into_iter().map(move |p| (topic.clone(), p))
                })
                .collect();
            let mut applied = state.owned.clone();
            applied.extend(state.applying.iter().cloned());
            state.pending = (assignment != applied).then_some(assignment);
        }
        Ok(_) => {}
        Err(ClientError::Broker(
            code @ (ErrorCode::UnknownMemberId
            | ErrorCode::IllegalGeneration
            | ErrorCode::FencedInstanceId),
        )) => {
            state.lost = Some(code);
            state.pending = None;
        }
        Err(error) => tracing::warn!(group = %config.group, "heartbeat failed: {error}"),
    }
}

/// Keeps the membership alive independently of how long the application takes per record,
/// up to `max_poll_interval`.
async fn heartbeat_loop(
    client: Arc<Client>,
    config: GroupConfig,
    membership: Arc<Mutex<Membership>>,
    now: Arc<tokio::sync::Notify>,
) {
    enum Next {
        Wait,
        Leave(Request),
        Beat(Request, Duration),
    }
    loop {
        let next = {
            let mut state = membership.lock().expect("membership");
            if state.lost.is_some() {
                Next::Wait
            } else if state
                .last_poll
                .is_some_and(|at| at.elapsed() > config.max_poll_interval)
            {
                // The application stopped polling: give the partitions to someone who will.
                tracing::warn!(group = %config.group, "max poll interval exceeded; leaving the group");
                state.lost = Some(ErrorCode::UnknownMemberId);
                Next::Leave(Request::LeaveGroup(LeaveGroupRequest {
                    group: config.group.clone(),
                    member_id: state.member_id.clone(),
                }))
            } else {
                Next::Beat(
                    heartbeat_request(&config, &state),
                    state.heartbeat_interval.max(Duration::from_millis(50)),
                )
            }
        };
        let (request, interval) = match next {
            Next::Wait => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Next::Leave(request) => {
                let _ = client
                    .group_request(&config.group, request, |r| match r {
                        Response::LeaveGroup(r) => r.error,
                        _ => ErrorCode::InvalidRequest,
                    })
                    .await;
                continue;
            }
            Next::Beat(request, interval) => (request, interval),
        };
        send_heartbeat(&client, &config, &membership, request).await;
        let _ = tokio::time::timeout(interval, now.notified()).await;
    }
}
