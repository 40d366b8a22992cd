//! Share groups from the client side (KIP-932, queues): [`ShareConsumer`].
//!
//! A member subscribes to topics in a share group. The group's coordinator assigns it
//! partitions (shared with other members where they outnumber the partitions); a background
//! task heartbeats at the interval the coordinator names and takes up each new assignment.
//! `poll` fetches from each assigned partition's leader shard (one fetch on its way per
//! partition, as the [`crate::Consumer`] keeps them), and the leader hands each record to one
//! member at a time, under a lock: the member acknowledges it (accept, release, reject,
//! renew the lock), or the record goes to another member once the lock runs out.
//! Acknowledgements travel with the next fetch to the partition's leader, or with
//! [`ShareConsumer::commit`] and [`ShareConsumer::close`].
//!
//! Acknowledgement modes ([`AckMode`]):
//! - implicit (the default): what a poll returned is accepted by the next poll (or commit or
//!   close), each record unless the application acknowledged it otherwise before;
//! - explicit: the application acknowledges each record ([`ShareConsumer::acknowledge`]);
//!   one it leaves unacknowledged stays its own until the lock runs out, or until `close`
//!   gives it back.
//!
//! The native protocol keeps no share session: each fetch names the partitions it fetches.
//! `close` acknowledges what is pending, gives back what the member still holds, and leaves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use strata_wire::batch::split_batches;
use strata_wire::protocol::{
    AckType, AcknowledgementBatch, AcquiredRecords, DescribeShareGroupRequest,
    DescribeShareGroupResponse, DescribeSharePartitionsRequest, ErrorCode, Request, Response,
    ShareAcknowledgePartition, ShareAcknowledgeRequest, ShareAcknowledgeTopic, ShareFetchPartition,
    ShareFetchRequest, ShareFetchTopic, ShareGroupHeartbeatRequest, SharePartitionDescription,
    TopicPartitions,
};

use crate::{Client, ClientError, TopicPartition};

/// How records a poll returned are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// The next poll (or commit, or close) accepts what a poll returned, each record unless
    /// acknowledged otherwise before.
    #[default]
    Implicit,
    /// Only what [`ShareConsumer::acknowledge`] says.
    Explicit,
}

#[derive(Debug, Clone)]
pub struct ShareConfig {
    pub group: String,
    /// Shown by `strata group describe`.
    pub client_id: String,
    pub acknowledgement: AckMode,
    /// Long-poll: how long a fetch waits for records to acquire.
    pub max_wait: Duration,
    /// The most records one fetch acquires (over its partitions).
    pub max_records: u32,
    /// The most bytes a fetch reads from one partition.
    pub partition_max_bytes: u32,
}

impl ShareConfig {
    /// Records asked for per fetch unless set: Kafka's `max.poll.records` default.
    pub const DEFAULT_MAX_RECORDS: u32 = 500;

    pub fn new(group: impl Into<String>) -> ShareConfig {
        ShareConfig {
            group: group.into(),
            client_id: "strata-share-consumer".into(),
            acknowledgement: AckMode::Implicit,
            max_wait: Duration::from_millis(500),
            max_records: ShareConfig::DEFAULT_MAX_RECORDS,
            partition_max_bytes: 1 << 20,
        }
    }
}

/// A record acquired from a share group: owned (its key, value and headers share the fetched
/// batch's memory), and its delivery count (1 on first delivery; more once it was released,
/// or its lock ran out, before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRecord {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    /// `None` for a null value (a tombstone).
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Bytes)>,
    pub delivery_count: u16,
}

/// What the heartbeat task keeps and `poll` reads.
#[derive(Debug)]
struct Membership {
    /// 0 to join (again).
    epoch: i32,
    interval: Duration,
    assignment: BTreeSet<TopicPartition>,
    /// A refusal joining again cannot cure (no ACL, a consumer group's id): `poll` reports it.
    fatal: Option<ErrorCode>,
}

/// A fetch on its way to a leader shard, and the partitions it acquires from.
struct InFlight {
    acquiring: Vec<TopicPartition>,
    task: tokio::task::JoinHandle<Result<Response, ClientError>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A member of a share group: see the module documentation.
pub struct ShareConsumer {
    client: Arc<Client>,
    config: ShareConfig,
    member_id: String,
    membership: Arc<Mutex<Membership>>,
    heartbeats: tokio::task::JoinHandle<()>,
    in_flight: Vec<InFlight>,
    /// Acknowledgements not yet sent, by partition and offset.
    pending: BTreeMap<TopicPartition, BTreeMap<u64, AckType>>,
    /// Offsets returned by polls and not acknowledged yet.
    delivered: BTreeMap<TopicPartition, BTreeSet<u64>>,
    /// Records a poll took and has not returned (it was dropped at an await).
    taken: Vec<ShareRecord>,
}

/// A member id: unique, chosen by the member (as KIP-932 has it).
fn new_member_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        bytes = (nanos ^ u128::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl ShareConsumer {
    /// Joins `config.group` subscribed to `topics` (at its coordinator, found as consumer
    /// groups find theirs) and starts heartbeating.
    pub async fn subscribe(
        client: Arc<Client>,
        topics: Vec<String>,
        config: ShareConfig,
    ) -> Result<ShareConsumer, ClientError> {
        if topics.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a share consumer subscribes to at least one topic".into(),
            ));
        }
        let member_id = new_member_id();
        let membership = Arc::new(Mutex::new(Membership {
            epoch: 0,
            interval: Duration::from_secs(5),
            assignment: BTreeSet::new(),
            fatal: None,
        }));
        let beat = Beat {
            client: client.clone(),
            config: config.clone(),
            member_id: member_id.clone(),
            topics,
            membership: membership.clone(),
        };
        beat.once().await?;
        let heartbeats = tokio::spawn(beat.run());
        Ok(ShareConsumer {
            client,
            config,
            member_id,
            membership,
            heartbeats,
            in_flight: Vec::new(),
            pending: BTreeMap::new(),
            delivered: BTreeMap::new(),
            taken: Vec::new(),
        })
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The partitions the coordinator assigned this member, as last heard.
    pub fn assignment(&self) -> BTreeSet<TopicPartition> {
        self.membership
            .lock()
            .expect("membership")
            .assignment
            .clone()
    }

    /// Acknowledges `record` as `kind`: sent with the next fetch from its partition, or by
    /// `commit` or `close`. Renew keeps the record this member's (its lock restarts); any
    /// other kind ends its delivery here.
    pub fn acknowledge(&mut self, record: &ShareRecord, kind: AckType) -> Result<(), ClientError> {
        let key = (record.topic.clone(), record.partition);
        let held = self
            .delivered
            .get_mut(&key)
            .is_some_and(|offsets| offsets.contains(&record.offset));
        if !held {
            return Err(ClientError::InvalidArgument(format!(
                "{}-{} offset {} is not a record this consumer holds",
                record.topic, record.partition, record.offset
            )));
        }
        if kind != AckType::Renew
            && let Some(offsets) = self.delivered.get_mut(&key)
        {
            offsets.remove(&record.offset);
        }
        self.pending
            .entry(key)
            .or_default()
            .insert(record.offset, kind);
        Ok(())
    }

    /// Records acquired for this member, after the wait for records (possibly none). In
    /// implicit mode it first accepts what the previous poll returned. Cancel-safe: records a
    /// dropped poll took come with the next one.
    pub async fn poll(&mut self) -> Result<Vec<ShareRecord>, ClientError> {
        if let Some(code) = self.membership.lock().expect("membership").fatal {
            return Err(ClientError::Broker(code));
        }
        if !self.taken.is_empty() {
            return Ok(std::mem::take(&mut self.taken));
        }
        if self.config.acknowledgement == AckMode::Implicit {
            self.accept_delivered();
        }
        let unresolved = self.send_fetches().await?;
        if self.in_flight.is_empty() {
            // Nothing assigned yet (or no leader known): wait a little for that to change.
            if unresolved {
                let _ = self.client.refresh_metadata().await;
            }
            let interval = self.membership.lock().expect("membership").interval;
            tokio::time::sleep(interval.min(self.config.max_wait)).await;
            return Ok(Vec::new());
        }
        let (first, index, _) = futures_util::future::select_all(
            self.in_flight.iter_mut().map(|fetch| &mut fetch.task),
        )
        .await;
        self.in_flight.swap_remove(index);
        let mut answers = vec![first];
        while let Some(index) = self
            .in_flight
            .iter()
            .position(|fetch| fetch.task.is_finished())
        {
            let mut done = self.in_flight.swap_remove(index);
            answers.push((&mut done.task).await);
        }
        let mut refresh = unresolved;
        for answer in answers {
            let answer = answer.map_err(|error| ClientError::Protocol(error.to_string()))?;
            refresh |= self.take_answer(answer)?;
        }
        if refresh {
            let _ = self.client.refresh_metadata().await;
        }
        Ok(std::mem::take(&mut self.taken))
    }

    /// Sends every pending acknowledgement (in implicit mode, accepting what the last poll
    /// returned first) and waits until their leaders stored them.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        if self.config.acknowledgement == AckMode::Implicit {
            self.accept_delivered();
        }
        let pending = std::mem::take(&mut self.pending);
        self.send_acknowledgements(pending, BTreeSet::new(), false)
            .await
    }

    /// Sends pending acknowledgements (implicit mode: accepting what the last poll
    /// returned), gives back every record this member still holds, and leaves the group.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.heartbeats.abort();
        let mut partitions = self.assignment();
        // What fetches on their way acquire is given back below, once they are answered.
        for mut fetch in std::mem::take(&mut self.in_flight) {
            partitions.extend(fetch.acquiring.iter().cloned());
            let _ = (&mut fetch.task).await;
        }
        if self.config.acknowledgement == AckMode::Implicit {
            self.accept_delivered();
        }
        partitions.extend(self.delivered.keys().cloned());
        let pending = std::mem::take(&mut self.pending);
        let acknowledged = self.send_acknowledgements(pending, partitions, true).await;
        let leave = Request::ShareGroupHeartbeat(ShareGroupHeartbeatRequest {
            group: self.config.group.clone(),
            member_id: self.member_id.clone(),
            member_epoch: -1,
            topics: None,
            client_id: self.config.client_id.clone(),
        });
        let left = self
            .client
            .group_request(&self.config.group, leave, heartbeat_error)
            .await;
        acknowledged?;
        left.map(|_| ())
    }

    /// Moves every delivered, unacknowledged record to the pending acceptances.
    fn accept_delivered(&mut self) {
        for (key, offsets) in std::mem::take(&mut self.delivered) {
            let pending = self.pending.entry(key).or_default();
            for offset in offsets {
                pending.entry(offset).or_insert(AckType::Accept);
            }
        }
    }

    /// Sends a fetch to each leader shard of assigned partitions no fetch on its way
    /// covers, carrying the pending acknowledgements of the partitions it names (also of
    /// partitions no longer assigned, without acquiring). Whether some partition's leader
    /// is unknown.
    async fn send_fetches(&mut self) -> Result<bool, ClientError> {
        let covered: BTreeSet<TopicPartition> = self
            .in_flight
            .iter()
            .flat_map(|fetch| fetch.acquiring.iter().cloned())
            .collect();
        let assigned = self.assignment();
        let mut wanted: BTreeMap<TopicPartition, bool> = assigned
            .iter()
            .filter(|key| !covered.contains(*key))
            .map(|key| (key.clone(), true))
            .collect();
        for key in self.pending.keys() {
            wanted.entry(key.clone()).or_insert(false);
        }
        if wanted.is_empty() {
            return Ok(false);
        }
        let metadata = self.client.metadata().await?;
        let shard_aware = self.client.config().shard_aware;
        let mut by_address: HashMap<String, Vec<(TopicPartition, bool)>> = HashMap::new();
        let mut unresolved = false;
        for (key, acquire) in wanted {
            match metadata.leader_address(&key.0, key.1, shard_aware) {
                Ok(address) => by_address.entry(address).or_default().push((key, acquire)),
                Err(_) => unresolved = true,
            }
        }
        for (address, partitions) in by_address {
            let acquiring: Vec<TopicPartition> = partitions
                .iter()
                .filter(|(_, acquire)| *acquire)
                .map(|(key, _)| key.clone())
                .collect();
            let mut topics: Vec<ShareFetchTopic> = Vec::new();
            for ((topic, partition), acquire) in partitions {
                let acks = self.pending.remove(&(topic.clone(), partition));
                let entry = ShareFetchPartition {
                    partition,
                    acquire,
                    acknowledgements: acks.map(|acks| ack_batches(&acks)).unwrap_or_default(),
                };
                match topics.last_mut().filter(|t| t.name == topic) {
                    Some(last) => last.partitions.push(entry),
                    None => topics.push(ShareFetchTopic {
                        name: topic,
                        partitions: vec![entry],
                    }),
                }
            }
            let request = Request::ShareFetch(ShareFetchRequest {
                group: self.config.group.clone(),
                member_id: self.member_id.clone(),
                max_wait_ms: self.config.max_wait.as_millis() as u32,
                max_records: self.config.max_records,
                max_bytes: self.config.partition_max_bytes,
                topics,
            });
            let client = self.client.clone();
            let task = tokio::spawn(async move { client.request(&address, request).await });
            self.in_flight.push(InFlight { acquiring, task });
        }
        Ok(unresolved)
    }

    /// Takes one fetch's answer: its records into `taken` (and `delivered`), offsets
    /// acquired without a record acknowledged as gaps. Whether metadata should be refreshed.
    fn take_answer(&mut self, answer: Result<Response, ClientError>) -> Result<bool, ClientError> {
        let response = match answer {
            Ok(Response::ShareFetch(response)) => response,
            Ok(_) => {
                return Err(ClientError::Protocol(
                    "a share fetch answered with another api".into(),
                ));
            }
            // What the request acknowledged may be lost: those records come again once
            // their locks run out.
            Err(error) if error.is_retriable() => {
                tracing::debug!(group = %self.config.group, "share fetch failed: {error}");
                return Ok(true);
            }
            Err(error) => return Err(error),
        };
        let mut refresh = false;
        for topic in response.topics {
            for partition in topic.partitions {
                if partition.acknowledge_error != ErrorCode::None {
                    tracing::warn!(
                        group = %self.config.group,
                        topic = %topic.name,
                        partition = partition.partition,
                        "acknowledgements refused: {}",
                        partition.acknowledge_error
                    );
                }
                match partition.error {
                    ErrorCode::None => {}
                    code if code.is_retriable() => {
                        refresh = true;
                        continue;
                    }
                    code => {
                        return Err(ClientError::Partition {
                            topic: topic.name,
                            partition: partition.partition,
                            code,
                        });
                    }
                }
                let key = (topic.name.clone(), partition.partition);
                let records = partition.records.freeze();
                self.take_records(key, records, &partition.acquired)?;
            }
        }
        Ok(refresh)
    }

    /// The acquired records of one partition's answer.
    fn take_records(
        &mut self,
        key: TopicPartition,
        records: Bytes,
        acquired: &[AcquiredRecords],
    ) -> Result<(), ClientError> {
        if acquired.is_empty() {
            return Ok(());
        }
        let run_of = |offset: u64| {
            acquired
                .iter()
                .find(|run| run.first_offset <= offset && offset <= run.last_offset)
        };
        let mut seen = BTreeSet::new();
        for batch in split_batches(records) {
            let batch = batch.map_err(|error| {
                ClientError::Protocol(format!(
                    "{}-{}: corrupt batch from the broker: {error}",
                    key.0, key.1
                ))
            })?;
            if batch.header().is_control() {
                continue;
            }
            for record in batch.records() {
                let Some(run) = run_of(record.offset) else {
                    continue;
                };
                seen.insert(record.offset);
                self.taken.push(ShareRecord {
                    topic: key.0.clone(),
                    partition: key.1,
                    offset: record.offset,
                    timestamp_ms: record.timestamp_ms,
                    key: record.key.map(|bytes| batch.slice_ref(bytes)),
                    value: record.nullable_value().map(|bytes| batch.slice_ref(bytes)),
                    headers: record
                        .headers()
                        .map(|(name, value)| (batch.slice_ref(name), batch.slice_ref(value)))
                        .collect(),
                    delivery_count: run.delivery_count,
                });
            }
        }
        let delivered = self.delivered.entry(key.clone()).or_default();
        delivered.extend(seen.iter().copied());
        // Offsets acquired that hold no record the member can be given: done, as gaps.
        for run in acquired {
            for offset in run.first_offset..=run.last_offset {
                if !seen.contains(&offset) {
                    self.pending
                        .entry(key.clone())
                        .or_default()
                        .insert(offset, AckType::Gap);
                }
            }
        }
        Ok(())
    }

    /// Sends `pending` (and with `release_remaining`, a release of what this member holds on
    /// them and on `partitions`) to the partitions' leaders, and waits for the answers: the
    /// first partition refused, if one was.
    async fn send_acknowledgements(
        &self,
        pending: BTreeMap<TopicPartition, BTreeMap<u64, AckType>>,
        partitions: BTreeSet<TopicPartition>,
        release_remaining: bool,
    ) -> Result<(), ClientError> {
        let mut named: BTreeMap<TopicPartition, Vec<AcknowledgementBatch>> = pending
            .iter()
            .map(|(key, acks)| (key.clone(), ack_batches(acks)))
            .collect();
        for key in partitions {
            named.entry(key).or_default();
        }
        if named.is_empty() {
            return Ok(());
        }
        let metadata = self.client.metadata().await?;
        let shard_aware = self.client.config().shard_aware;
        let mut by_address: HashMap<String, Vec<ShareAcknowledgeTopic>> = HashMap::new();
        // A partition without a known leader is reported, after the others are sent.
        let mut unresolved = None;
        for ((topic, partition), acknowledgements) in named {
            let address = match metadata.leader_address(&topic, partition, shard_aware) {
                Ok(address) => address,
                Err(error) => {
                    unresolved.get_or_insert(error);
                    continue;
                }
            };
            let topics = by_address.entry(address).or_default();
            let entry = ShareAcknowledgePartition {
                partition,
                acknowledgements,
            };
            match topics.last_mut().filter(|t| t.name == topic) {
                Some(last) => last.partitions.push(entry),
                None => topics.push(ShareAcknowledgeTopic {
                    name: topic,
                    partitions: vec![entry],
                }),
            }
        }
        let sends = by_address.into_iter().map(|(address, topics)| {
            let request = Request::ShareAcknowledge(ShareAcknowledgeRequest {
                group: self.config.group.clone(),
                member_id: self.member_id.clone(),
                topics,
                release_remaining,
            });
            let client = self.client.clone();
            async move { client.request(&address, request).await }
        });
        let mut outcome = unresolved.map_or(Ok(()), Err);
        for answer in futures_util::future::join_all(sends).await {
            if let Err(refused) = acknowledged(answer) {
                outcome = outcome.and(Err(refused));
            }
        }
        outcome
    }
}

/// How one ShareAcknowledge went: the first partition refused, if one was.
fn acknowledged(answer: Result<Response, ClientError>) -> Result<(), ClientError> {
    let Response::ShareAcknowledge(answer) = answer? else {
        return Err(ClientError::Protocol(
            "a share acknowledge answered with another api".into(),
        ));
    };
    for topic in answer.topics {
        if let Some(refused) = topic.partitions.iter().find(|p| p.error != ErrorCode::None) {
            return Err(ClientError::Partition {
                topic: topic.name,
                partition: refused.partition,
                code: refused.error,
            });
        }
    }
    Ok(())
}

impl Drop for ShareConsumer {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// A partition's pending acknowledgements as batches: runs of consecutive offsets of one
/// type, each with that one type.
fn ack_batches(acks: &BTreeMap<u64, AckType>) -> Vec<AcknowledgementBatch> {
    let mut batches: Vec<AcknowledgementBatch> = Vec::new();
    for (&offset, &kind) in acks {
        match batches.last_mut() {
            Some(last) if last.last_offset + 1 == offset && last.types == [kind] => {
                last.last_offset = offset;
            }
            _ => batches.push(AcknowledgementBatch {
                first_offset: offset,
                last_offset: offset,
                types: vec![kind],
            }),
        }
    }
    batches
}

fn heartbeat_error(response: &Response) -> ErrorCode {
    match response {
        Response::ShareGroupHeartbeat(response) => response.error,
        _ => ErrorCode::InvalidRequest,
    }
}

/// The heartbeat task's part: who beats, and what it keeps.
struct Beat {
    client: Arc<Client>,
    config: ShareConfig,
    member_id: String,
    topics: Vec<String>,
    membership: Arc<Mutex<Membership>>,
}

impl Beat {
    /// One heartbeat (a join at epoch 0, naming the topics), its answer applied.
    async fn once(&self) -> Result<(), ClientError> {
        let epoch = self.membership.lock().expect("membership").epoch;
        let request = Request::ShareGroupHeartbeat(ShareGroupHeartbeatRequest {
            group: self.config.group.clone(),
            member_id: self.member_id.clone(),
            member_epoch: epoch,
            topics: (epoch == 0).then(|| self.topics.clone()),
            client_id: self.config.client_id.clone(),
        });
        let answer = self
            .client
            .group_request(&self.config.group, request, heartbeat_error)
            .await;
        let mut membership = self.membership.lock().expect("membership");
        match answer {
            Ok(Response::ShareGroupHeartbeat(answer)) => {
                membership.epoch = answer.member_epoch;
                membership.interval =
                    Duration::from_millis(u64::from(answer.heartbeat_interval_ms.max(50)));
                if let Some(assignment) = answer.assignment {
                    membership.assignment = assignment
                        .into_iter()
                        .flat_map(|TopicPartitions { topic, partitions }| {
                            partitions.into_iter().map(move |p| (topic.clone(), p))
                        })
                        .collect();
                }
                Ok(())
            }
            Ok(_) => Err(ClientError::Protocol(
                "a share group heartbeat answered with another api".into(),
            )),
            Err(ClientError::Broker(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch)) => {
                // Out of the group (its session ran out): join again, same member id.
                tracing::warn!(group = %self.config.group, "share group membership lost; joining again");
                membership.epoch = 0;
                membership.assignment.clear();
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Heartbeats at the coordinator's interval until the consumer closes, or a refusal
    /// rejoining cannot cure.
    async fn run(self) {
        loop {
            let interval = self.membership.lock().expect("membership").interval;
            tokio::time::sleep(interval).await;
            match self.once().await {
                Ok(()) => {}
                Err(ClientError::Broker(
                    code @ (ErrorCode::GroupAuthorizationFailed
                    | ErrorCode::TopicAuthorizationFailed
                    | ErrorCode::InconsistentGroupProtocol
                    | ErrorCode::InvalidGroupId
                    | ErrorCode::InvalidRequest),
                )) => {
                    self.membership.lock().expect("membership").fatal = Some(code);
                    return;
                }
                Err(error) => {
                    tracing::warn!(group = %self.config.group, "share group heartbeat failed: {error}")
                }
            }
        }
    }
}

impl Client {
    /// A share group's members and the partitions it holds state for, as its coordinator
    /// says (`GroupIdNotFound`: no such share group).
    pub async fn describe_share_group(
        &self,
        group: &str,
    ) -> Result<DescribeShareGroupResponse, ClientError> {
        let request = Request::DescribeShareGroup(DescribeShareGroupRequest {
            group: group.to_string(),
        });
        match self
            .group_request(group, request, |r| match r {
                Response::DescribeShareGroup(r) => r.error,
                _ => ErrorCode::InvalidRequest,
            })
            .await?
        {
            Response::DescribeShareGroup(response) => Ok(response),
            _ => unreachable!("checked by group_request"),
        }
    }

    /// Where `group` stands on each of `partitions` (start offset, records in flight, lag),
    /// asked of their leaders; a partition whose leader is unknown or does not answer comes
    /// back with the error.
    pub async fn describe_share_partitions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Vec<SharePartitionDescription>, ClientError> {
        let metadata = self.metadata().await?;
        let shard_aware = self.config().shard_aware;
        let mut by_address: HashMap<String, Vec<TopicPartitions>> = HashMap::new();
        let mut described = Vec::new();
        let failed = |(topic, partition): &TopicPartition, error| SharePartitionDescription {
            topic: topic.clone(),
            partition: *partition,
            error,
            start_offset: 0,
            end_offset: 0,
            in_flight: 0,
            acquired: 0,
            high_watermark: 0,
            lag: 0,
            oldest_timestamp_ms: None,
        };
        for key in partitions {
            match metadata.leader_address(&key.0, key.1, shard_aware) {
                Ok(address) => {
                    let topics = by_address.entry(address).or_default();
                    match topics.iter_mut().find(|t| t.topic == key.0) {
                        Some(topic) => topic.partitions.push(key.1),
                        None => topics.push(TopicPartitions {
                            topic: key.0.clone(),
                            partitions: vec![key.1],
                        }),
                    }
                }
                Err(error) => {
                    described.push(failed(key, error.code().unwrap_or(ErrorCode::NotLeader)))
                }
            }
        }
        for (address, topics) in by_address {
            let asked: Vec<TopicPartition> = topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
                .collect();
            let request = Request::DescribeSharePartitions(DescribeSharePartitionsRequest {
                group: group.to_string(),
                topics,
            });
            match self.request(&address, request).await {
                Ok(Response::DescribeSharePartitions(answer)) => {
                    described.extend(answer.partitions)
                }
                Ok(_) | Err(_) => {
                    described.extend(asked.iter().map(|key| failed(key, ErrorCode::NotLeader)))
                }
            }
        }
        described.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        Ok(described)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_acknowledgements_travel_as_runs_of_one_type() {
        let acks: BTreeMap<u64, AckType> = [
            (3, AckType::Accept),
            (4, AckType::Accept),
            (5, AckType::Gap),
            (7, AckType::Accept),
            (8, AckType::Release),
        ]
        .into_iter()
        .collect();
        let runs: Vec<(u64, u64, Vec<AckType>)> = ack_batches(&acks)
            .into_iter()
            .map(|batch| (batch.first_offset, batch.last_offset, batch.types))
            .collect();
        assert_eq!(
            runs,
            vec![
                (3, 4, vec![AckType::Accept]),
                (5, 5, vec![AckType::Gap]),
                (7, 7, vec![AckType::Accept]),
                (8, 8, vec![AckType::Release]),
            ]
        );
    }

    #[test]
    fn member_ids_are_unique() {
        let ids: BTreeSet<String> = (0..100).map(|_| new_member_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|id| id.len() == 32));
    }
}
