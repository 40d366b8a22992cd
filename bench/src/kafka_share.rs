//! `strata bench consume --share-group G --protocol kafka`: a share consumer speaking Kafka's
//! share-group protocol (KIP-932) over plain TCP, with the Kafka codec Strata's own listener
//! decodes requests with. librdkafka as the `rdkafka` crate builds it has no share consumer, so
//! the bench carries one that does what Kafka's Java `KafkaShareConsumer` does in its implicit
//! acknowledgement mode: join with ShareGroupHeartbeat (the member id its own), fetch each
//! assigned partition from its leader in one share session per leader (ShareFetch), accept
//! every record of a fetch in the next fetch's request, and close with a ShareAcknowledge that
//! ends the session, then a leaving heartbeat.
//!
//! It speaks to any broker with share groups: Strata's Kafka listener or Kafka 4.2+.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use strata_kafka::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, metadata_request,
    share_acknowledge_request, share_fetch_request,
};
use strata_kafka::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use strata_kafka::text;
use strata_wire::Batch;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BenchConfig;
use crate::consume::{RecordCounter, work};

/// Kafka's ACCEPT and GAP acknowledgement types.
const ACCEPT: i8 = 1;
const GAP: i8 = 0;
/// A share session's epoch that closes it.
const CLOSE_SESSION: i32 = -1;
/// A member epoch that leaves the group.
const LEAVE_GROUP: i32 = -1;
/// The versions this consumer speaks, highest first chosen where the broker has it.
const SHARE_FETCH_VERSIONS: (i16, i16) = (1, 2);
const SHARE_ACKNOWLEDGE_VERSIONS: (i16, i16) = (1, 2);
const SHARE_HEARTBEAT_VERSION: i16 = 1;
const METADATA_VERSION: i16 = 12;
const FIND_COORDINATOR_VERSION: i16 = 6;
/// The broker waits up to this long for records before answering an empty fetch (the Java
/// client's `fetch.max.wait.ms`).
const FETCH_MAX_WAIT_MS: i32 = 500;
/// The most bytes one fetch's answer holds (the Java client's `fetch.max.bytes`).
const FETCH_MAX_BYTES: i32 = 50 << 20;

/// One connection to a broker: one request at a time, each answered before the next.
struct Connection {
    stream: TcpStream,
    correlation_id: i32,
    client_id: StrBytes,
}

impl Connection {
    async fn open(address: &str, client_id: &str) -> anyhow::Result<Connection> {
        let stream = TcpStream::connect(address)
            .await
            .with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            correlation_id: 0,
            client_id: text(client_id),
        })
    }

    /// Sends `request` as `api` at `version` and decodes its answer.
    async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        request: &Req,
    ) -> anyhow::Result<Resp> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        header.encode(&mut frame, api.request_header_version(version))?;
        request.encode(&mut frame, version)?;
        let size = i32::try_from(frame.len() - 4).context("a request over 2 GiB")?;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        self.stream.write_all(&frame).await?;

        let size = self.stream.read_i32().await.context("the broker hung up")?;
        let size = usize::try_from(size).context("a negative frame size")?;
        let mut answer = vec![0; size];
        self.stream.read_exact(&mut answer).await?;
        let mut answer = Bytes::from(answer);
        let header = ResponseHeader::decode(&mut answer, api.response_header_version(version))?;
        anyhow::ensure!(
            header.correlation_id == self.correlation_id,
            "{api:?} answered with correlation id {}, not {}",
            header.correlation_id,
            self.correlation_id
        );
        let response = Resp::decode(&mut answer, version)
            .with_context(|| format!("decoding the {api:?} v{version} answer"))?;
        anyhow::ensure!(
            !answer.has_remaining(),
            "{} bytes after the {api:?} answer",
            answer.remaining()
        );
        Ok(response)
    }
}

/// The highest version of `api` both sides speak.
fn negotiated(
    versions: &ApiVersionsResponse,
    api: ApiKey,
    ours: (i16, i16),
) -> anyhow::Result<i16> {
    let theirs = versions
        .api_keys
        .iter()
        .find(|key| key.api_key == api as i16)
        .with_context(|| format!("the broker does not serve {api:?}: no share groups"))?;
    let version = ours.1.min(theirs.max_version);
    anyhow::ensure!(
        version >= ours.0.max(theirs.min_version),
        "no version of {api:?} in common: the broker serves {}..={}",
        theirs.min_version,
        theirs.max_version
    );
    Ok(version)
}

fn check(code: i16, message: Option<&StrBytes>, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        code == 0,
        "{what}: error code {code}{}",
        message.map(|m| format!(" ({m})")).unwrap_or_default()
    );
    Ok(())
}

/// The topic as the metadata names it: its id and each partition's leader's address.
struct TopicLayout {
    id: uuid::Uuid,
    leaders: HashMap<i32, String>,
}

async fn topic_layout(bootstrap: &mut Connection, topic: &str) -> anyhow::Result<TopicLayout> {
    let request = MetadataRequest::default().with_topics(Some(vec![
        metadata_request::MetadataRequestTopic::default().with_name(Some(text(topic).into())),
    ]));
    let metadata: MetadataResponse = bootstrap
        .call(ApiKey::Metadata, METADATA_VERSION, &request)
        .await?;
    let brokers: HashMap<i32, String> = metadata
        .brokers
        .iter()
        .map(|broker| (broker.node_id.0, format!("{}:{}", broker.host, broker.port)))
        .collect();
    let found = metadata
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|name| name.as_str() == topic))
        .with_context(|| format!("topic {topic} is not in the metadata"))?;
    check(
        found.error_code,
        None,
        &format!("the metadata of topic {topic}"),
    )?;
    let mut leaders = HashMap::new();
    for partition in &found.partitions {
        let leader = brokers
            .get(&partition.leader_id.0)
            .with_context(|| format!("partition {} has no leader", partition.partition_index))?;
        leaders.insert(partition.partition_index, leader.clone());
    }
    Ok(TopicLayout {
        id: found.topic_id,
        leaders,
    })
}

/// The address of `group`'s coordinator.
async fn coordinator(bootstrap: &mut Connection, group: &str) -> anyhow::Result<String> {
    let request = FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![text(group)]);
    let response: FindCoordinatorResponse = bootstrap
        .call(ApiKey::FindCoordinator, FIND_COORDINATOR_VERSION, &request)
        .await?;
    let found = response
        .coordinators
        .first()
        .context("FindCoordinator answered no coordinator")?;
    check(
        found.error_code,
        found.error_message.as_ref(),
        "finding the group's coordinator",
    )?;
    Ok(format!("{}:{}", found.host, found.port))
}

/// A share session with one leader: its connection, its next epoch, the partitions it fetches,
/// and the acknowledgements to send with its next request.
struct Session {
    connection: Connection,
    epoch: i32,
    partitions: Vec<i32>,
    /// The partitions the leader holds in the session, as the last request left it.
    joined: Vec<i32>,
    acks: BTreeMap<i32, Vec<share_fetch_request::AcknowledgementBatch>>,
}

/// The group membership: the coordinator's connection, the member's id and epoch, and when to
/// heartbeat next.
struct Membership {
    connection: Connection,
    group: String,
    member_id: String,
    epoch: i32,
    interval: Duration,
    next_heartbeat: Instant,
    assigned: Vec<i32>,
}

impl Membership {
    /// One ShareGroupHeartbeat at `epoch`, naming `topics` (the subscription, when it changes).
    async fn send(
        &mut self,
        epoch: i32,
        topics: Option<Vec<strata_kafka::kafka_protocol::messages::TopicName>>,
        what: &str,
    ) -> anyhow::Result<ShareGroupHeartbeatResponse> {
        let request = ShareGroupHeartbeatRequest::default()
            .with_group_id(text(&self.group).into())
            .with_member_id(text(&self.member_id))
            .with_member_epoch(epoch)
            .with_subscribed_topic_names(topics);
        let response: ShareGroupHeartbeatResponse = self
            .connection
            .call(
                ApiKey::ShareGroupHeartbeat,
                SHARE_HEARTBEAT_VERSION,
                &request,
            )
            .await?;
        check(response.error_code, response.error_message.as_ref(), what)?;
        Ok(response)
    }

    /// Heartbeats (joining at epoch 0, naming the topic); takes a new assignment in.
    async fn heartbeat(&mut self, topic: &str, topic_id: uuid::Uuid) -> anyhow::Result<()> {
        let topics = (self.epoch == 0).then(|| vec![text(topic).into()]);
        let response = self
            .send(self.epoch, topics, "the share group heartbeat")
            .await?;
        self.epoch = response.member_epoch;
        self.interval = Duration::from_millis(response.heartbeat_interval_ms.max(100) as u64);
        self.next_heartbeat = Instant::now() + self.interval;
        if let Some(assignment) = response.assignment {
            self.assigned = assignment
                .topic_partitions
                .iter()
                .filter(|t| t.topic_id == topic_id)
                .flat_map(|t| t.partitions.iter().copied())
                .collect();
            self.assigned.sort_unstable();
        }
        Ok(())
    }

    async fn leave(&mut self) -> anyhow::Result<()> {
        self.send(LEAVE_GROUP, None, "leaving the share group")
            .await
            .map(|_| ())
    }
}

/// The acknowledgements of what one partition's answer acquired: each acquired run accepted
/// whole where a record stood at each of its offsets, else offset by offset, the offsets
/// without a record (compacted away, transaction markers) acknowledged as gaps. `seen` holds
/// the offsets of the records read, ascending.
fn acknowledgements(
    acquired: &[(u64, u64)],
    seen: &[u64],
) -> Vec<share_fetch_request::AcknowledgementBatch> {
    acquired
        .iter()
        .map(|&(first, last)| {
            let from = seen.partition_point(|offset| *offset < first);
            let to = seen.partition_point(|offset| *offset <= last);
            let present = &seen[from..to];
            let types = if present.len() as u64 == last - first + 1 {
                vec![ACCEPT]
            } else {
                (first..=last)
                    .map(|offset| {
                        if present.binary_search(&offset).is_ok() {
                            ACCEPT
                        } else {
                            GAP
                        }
                    })
                    .collect()
            };
            share_fetch_request::AcknowledgementBatch::default()
                .with_first_offset(first as i64)
                .with_last_offset(last as i64)
                .with_acknowledge_types(types)
        })
        .collect()
}

/// What one share consumer speaks with: the bootstrap broker, the versions negotiated there,
/// the topic's layout, its membership, and a share session per leader.
struct ShareMember {
    bootstrap: Connection,
    client_id: String,
    fetch_version: i16,
    acknowledge_version: i16,
    layout: TopicLayout,
    membership: Membership,
    sessions: HashMap<String, Session>,
}

impl ShareMember {
    /// Connects, negotiates versions, reads the topic's layout and finds the group's
    /// coordinator (the member joins with its first heartbeat).
    async fn start(config: &BenchConfig, group: &str, index: usize) -> anyhow::Result<Self> {
        let client_id = format!("strata-bench-{index}");
        let bootstrap_address = crate::kafka::bootstrap_servers(&config.bootstrap)
            .split(',')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut bootstrap = Connection::open(&bootstrap_address, &client_id).await?;
        let versions: ApiVersionsResponse = bootstrap
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await?;
        check(versions.error_code, None, "ApiVersions")?;
        let fetch_version = negotiated(&versions, ApiKey::ShareFetch, SHARE_FETCH_VERSIONS)?;
        let acknowledge_version = negotiated(
            &versions,
            ApiKey::ShareAcknowledge,
            SHARE_ACKNOWLEDGE_VERSIONS,
        )?;
        let layout = topic_layout(&mut bootstrap, &config.topic).await?;
        let coordinator_address = coordinator(&mut bootstrap, group).await?;
        let membership = Membership {
            connection: Connection::open(&coordinator_address, &client_id).await?,
            group: group.to_string(),
            member_id: format!("{}", uuid::Uuid::new_v4()),
            epoch: 0,
            interval: Duration::from_secs(5),
            next_heartbeat: Instant::now(),
            assigned: Vec::new(),
        };
        Ok(ShareMember {
            bootstrap,
            client_id,
            fetch_version,
            acknowledge_version,
            layout,
            membership,
            sessions: HashMap::new(),
        })
    }

    /// Heartbeats, and puts each assigned partition in its leader's session.
    async fn heartbeat(&mut self, topic: &str) -> anyhow::Result<()> {
        self.membership.heartbeat(topic, self.layout.id).await?;
        if self
            .membership
            .assigned
            .iter()
            .any(|partition| !self.layout.leaders.contains_key(partition))
        {
            self.layout = topic_layout(&mut self.bootstrap, topic).await?;
        }
        for session in self.sessions.values_mut() {
            session.partitions.clear();
        }
        for partition in &self.membership.assigned {
            let leader = self.layout.leaders[partition].clone();
            if !self.sessions.contains_key(&leader) {
                let session = Session {
                    connection: Connection::open(&leader, &self.client_id).await?,
                    epoch: 0,
                    partitions: Vec::new(),
                    joined: Vec::new(),
                    acks: BTreeMap::new(),
                };
                self.sessions.insert(leader.clone(), session);
            }
            let session = self.sessions.get_mut(&leader).expect("inserted");
            session.partitions.push(*partition);
        }
        Ok(())
    }

    /// The last acknowledgements, each session ended, the group left.
    async fn close(mut self) -> anyhow::Result<()> {
        for session in self.sessions.values_mut() {
            let acks = std::mem::take(&mut session.acks);
            let partitions = acks
                .into_iter()
                .map(|(partition, batches)| {
                    share_acknowledge_request::AcknowledgePartition::default()
                        .with_partition_index(partition)
                        .with_acknowledgement_batches(
                            batches
                                .into_iter()
                                .map(|batch| {
                                    share_acknowledge_request::AcknowledgementBatch::default()
                                        .with_first_offset(batch.first_offset)
                                        .with_last_offset(batch.last_offset)
                                        .with_acknowledge_types(batch.acknowledge_types)
                                })
                                .collect(),
                        )
                })
                .collect();
            let request = ShareAcknowledgeRequest::default()
                .with_group_id(Some(text(&self.membership.group).into()))
                .with_member_id(Some(text(&self.membership.member_id)))
                .with_share_session_epoch(CLOSE_SESSION)
                .with_topics(vec![
                    share_acknowledge_request::AcknowledgeTopic::default()
                        .with_topic_id(self.layout.id)
                        .with_partitions(partitions),
                ]);
            let response: ShareAcknowledgeResponse = session
                .connection
                .call(ApiKey::ShareAcknowledge, self.acknowledge_version, &request)
                .await?;
            check(
                response.error_code,
                response.error_message.as_ref(),
                "closing the share session",
            )?;
        }
        self.membership.leave().await
    }
}

/// What one fetch asks for, beside its session's partitions and acknowledgements.
struct FetchAsk<'a> {
    group: &'a str,
    member_id: &'a str,
    topic_id: uuid::Uuid,
    version: i16,
    config: &'a BenchConfig,
}

impl Session {
    /// One ShareFetch: this session's partitions (those no longer assigned forgotten), with
    /// the acknowledgements of what the last fetch acquired; each record acquired is counted
    /// (after the configured work), and its acknowledgement goes with the next.
    async fn fetch(
        &mut self,
        ask: &FetchAsk<'_>,
        counter: &mut RecordCounter,
        (acquired, seen): (&mut Vec<(u64, u64)>, &mut Vec<u64>),
    ) -> anyhow::Result<()> {
        let mut partitions: Vec<i32> = self.partitions.clone();
        partitions.extend(self.acks.keys().copied());
        partitions.sort_unstable();
        partitions.dedup();
        let forgotten: Vec<i32> = self
            .joined
            .iter()
            .filter(|partition| !partitions.contains(partition))
            .copied()
            .collect();
        let fetched = partitions
            .iter()
            .map(|partition| {
                share_fetch_request::FetchPartition::default()
                    .with_partition_index(*partition)
                    .with_partition_max_bytes(ask.config.partition_fetch_bytes as i32)
                    .with_acknowledgement_batches(self.acks.remove(partition).unwrap_or_default())
            })
            .collect();
        let request = ShareFetchRequest::default()
            .with_group_id(Some(text(ask.group).into()))
            .with_member_id(Some(text(ask.member_id)))
            .with_share_session_epoch(self.epoch)
            .with_max_wait_ms(FETCH_MAX_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_MAX_BYTES)
            .with_max_records(ask.config.max_poll_records as i32)
            .with_batch_size(ask.config.max_poll_records as i32)
            .with_topics(vec![
                share_fetch_request::FetchTopic::default()
                    .with_topic_id(ask.topic_id)
                    .with_partitions(fetched),
            ])
            .with_forgotten_topics_data(if forgotten.is_empty() {
                Vec::new()
            } else {
                vec![
                    share_fetch_request::ForgottenTopic::default()
                        .with_topic_id(ask.topic_id)
                        .with_partitions(forgotten),
                ]
            });
        let response: ShareFetchResponse = self
            .connection
            .call(ApiKey::ShareFetch, ask.version, &request)
            .await?;
        check(
            response.error_code,
            response.error_message.as_ref(),
            "ShareFetch",
        )?;
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.joined = partitions;
        for partition in response.responses.iter().flat_map(|t| &t.partitions) {
            check(
                partition.acknowledge_error_code,
                partition.acknowledge_error_message.as_ref(),
                "acknowledging",
            )?;
            check(
                partition.error_code,
                partition.error_message.as_ref(),
                "ShareFetch of a partition",
            )?;
            acquired.clear();
            acquired.extend(
                partition
                    .acquired_records
                    .iter()
                    .map(|run| (run.first_offset as u64, run.last_offset as u64)),
            );
            if acquired.is_empty() {
                continue;
            }
            seen.clear();
            let mut records = partition.records.clone().unwrap_or_default();
            while records.has_remaining() {
                let header =
                    strata_wire::BatchHeader::parse(&records).context("a fetched record batch")?;
                let length = (header.batch_len as usize).min(records.len());
                let batch =
                    Batch::validate(records.split_to(length)).context("a fetched record batch")?;
                // Records of the batch another member holds are not this member's.
                let held = |offset: u64| {
                    acquired
                        .iter()
                        .any(|(first, last)| (*first..=*last).contains(&offset))
                };
                let process = ask.config.process_per_record;
                if process.is_zero() {
                    counter.count(batch.records().filter(|r| held(r.offset)).map(|record| {
                        seen.push(record.offset);
                        record.value
                    }));
                    continue;
                }
                for record in batch.records().filter(|r| held(r.offset)) {
                    work(process).await;
                    counter.count(std::iter::once(record.value));
                    seen.push(record.offset);
                }
            }
            seen.sort_unstable();
            self.acks
                .entry(partition.partition_index)
                .or_default()
                .extend(acknowledgements(acquired, seen));
        }
        Ok(())
    }
}

/// Share consumer `index` of the bench's share group until `stop`: counts what it reads into
/// `counter`, each record after `config.process_per_record` of work.
pub async fn consume(
    config: &BenchConfig,
    index: usize,
    stop: Arc<AtomicBool>,
    mut counter: RecordCounter,
) -> anyhow::Result<RecordCounter> {
    let group = config
        .share_group
        .clone()
        .context("a share consumer needs --share-group")?;
    let mut member = ShareMember::start(config, &group, index).await?;
    let mut buffers = (Vec::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= member.membership.next_heartbeat {
            member.heartbeat(&config.topic).await?;
        }
        if member.membership.assigned.is_empty() {
            let wait = member.membership.interval.min(Duration::from_millis(200));
            tokio::time::sleep(wait).await;
            continue;
        }
        let ask = FetchAsk {
            group: &group,
            member_id: &member.membership.member_id,
            topic_id: member.layout.id,
            version: member.fetch_version,
            config,
        };
        for session in member.sessions.values_mut() {
            if session.partitions.is_empty() && session.acks.is_empty() {
                continue;
            }
            session
                .fetch(&ask, &mut counter, (&mut buffers.0, &mut buffers.1))
                .await?;
        }
    }
    member.close().await?;
    Ok(counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_runs_are_accepted_and_offsets_without_records_are_gaps() {
        let batches = acknowledgements(&[(10, 14), (20, 23)], &[10, 11, 12, 13, 14, 20, 22]);
        assert_eq!(batches.len(), 2);
        assert_eq!((batches[0].first_offset, batches[0].last_offset), (10, 14));
        assert_eq!(batches[0].acknowledge_types, vec![ACCEPT]);
        assert_eq!((batches[1].first_offset, batches[1].last_offset), (20, 23));
        assert_eq!(batches[1].acknowledge_types, vec![ACCEPT, GAP, ACCEPT, GAP]);
    }
}
