//! Bootstrap, metadata and admin calls.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_wire::protocol::{
    Appended, BrokerMetadata, ConfigEntry, CreateTopicRequest, DeleteTopicRequest, ErrorCode,
    FetchRequest, ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, MetadataRequest,
    MetadataResponse, Request, Response, TopicMetadata,
};

use crate::{ClientError, Connection};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of one or more brokers.
    pub bootstrap: Vec<String>,
    pub request_timeout: Duration,
    /// Send partition requests to the owning shard's port (otherwise to the shared port).
    pub shard_aware: bool,
    /// TCP congestion control for connections to brokers; `None`: the host's default (see
    /// [`DEFAULT_TCP_CONGESTION`](crate::DEFAULT_TCP_CONGESTION)).
    pub tcp_congestion: Option<String>,
    /// TLS and SASL for every connection (default: neither).
    pub security: crate::Security,
}

impl ClientConfig {
    pub fn new(bootstrap: impl Into<String>) -> ClientConfig {
        ClientConfig {
            bootstrap: bootstrap
                .into()
                .split(',')
                .map(|address| address.trim().to_string())
                .filter(|address| !address.is_empty())
                .collect(),
            request_timeout: Duration::from_secs(30),
            shard_aware: true,
            tcp_congestion: Some(crate::DEFAULT_TCP_CONGESTION.to_string()),
            security: crate::Security::default(),
        }
    }
}

/// What the cluster looked like at the last metadata refresh.
#[derive(Debug, Clone)]
pub struct ClusterMetadata {
    pub cluster: String,
    pub controller: i32,
    pub brokers: HashMap<i32, BrokerMetadata>,
    pub topics: HashMap<String, TopicMetadata>,
}

impl ClusterMetadata {
    fn from_response(response: MetadataResponse) -> ClusterMetadata {
        ClusterMetadata {
            cluster: response.cluster,
            controller: response.controller,
            brokers: response
                .brokers
                .into_iter()
                .map(|broker| (broker.node_id, broker))
                .collect(),
            topics: response
                .topics
                .into_iter()
                // A topic without partitions (only a broker in error would send one) is as
                // good as unknown: nothing could be sent to it, and a partitioner would divide
                // by its count.
                .filter(|topic| topic.error == ErrorCode::None && !topic.partitions.is_empty())
                .map(|topic| (topic.name.clone(), topic))
                .collect(),
        }
    }

    pub fn partition_count(&self, topic: &str) -> Result<u32, ClientError> {
        self.topics
            .get(topic)
            .map(|metadata| metadata.partitions.len() as u32)
            .ok_or_else(|| ClientError::UnknownTopic(topic.to_string()))
    }

    /// `host:port` of the leader of `partition`: its owning shard's port when shard-aware.
    pub fn leader_address(
        &self,
        topic: &str,
        partition: u32,
        shard_aware: bool,
    ) -> Result<String, ClientError> {
        let metadata = self
            .topics
            .get(topic)
            .ok_or_else(|| ClientError::UnknownTopic(topic.to_string()))?;
        let state = metadata
            .partitions
            .iter()
            .find(|p| p.partition == partition)
            .ok_or_else(|| ClientError::UnknownPartition {
                topic: topic.to_string(),
                partition,
            })?;
        let broker = self
            .brokers
            .get(&state.leader)
            .ok_or(ClientError::Partition {
                topic: topic.to_string(),
                partition,
                code: ErrorCode::NotLeader,
            })?;
        let port = match broker.shard_ports.get(usize::from(state.shard)) {
            Some(port) if shard_aware => *port,
            _ => broker.port,
        };
        Ok(format!("{}:{port}", broker.host))
    }
}

/// Connections and metadata shared by producers, consumers and admin calls.
pub struct Client {
    config: ClientConfig,
    connections: Mutex<HashMap<String, Arc<Connection>>>,
    metadata: Mutex<Option<Arc<ClusterMetadata>>>,
    /// group → its coordinator's `host:port`, until it answers NOT_COORDINATOR.
    pub(crate) coordinators: Mutex<HashMap<String, String>>,
    /// Held while a new connection is made (see [`Client::connection`]).
    connecting: tokio::sync::Mutex<()>,
}

impl Client {
    /// Connects to the first reachable bootstrap broker and loads metadata.
    pub async fn connect(config: ClientConfig) -> Result<Arc<Client>, ClientError> {
        if config.bootstrap.is_empty() {
            return Err(ClientError::InvalidArgument("no bootstrap address".into()));
        }
        let client = Arc::new(Client {
            config,
            connections: Mutex::default(),
            metadata: Mutex::default(),
            coordinators: Mutex::default(),
            connecting: tokio::sync::Mutex::new(()),
        });
        client.refresh_metadata().await?;
        Ok(client)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// A connection to `address` (`host:port`), reused while it lives. Callers racing for a
    /// new one share it: requests that must arrive in order (a partition's pipelined batches)
    /// never travel on two connections.
    pub async fn connection(&self, address: &str) -> Result<Arc<Connection>, ClientError> {
        if let Some(connection) = self.cached_connection(address) {
            return Ok(connection);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(connection) = self.cached_connection(address) {
            return Ok(connection);
        }
        let resolved: SocketAddr = tokio::net::lookup_host(address)
            .await
            .map_err(|error| ClientError::InvalidArgument(format!("{address}: {error}")))?
            .next()
            .ok_or_else(|| ClientError::InvalidArgument(format!("{address}: no address")))?;
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        let connection = Connection::connect_secured(
            resolved,
            host.trim_start_matches('[').trim_end_matches(']'),
            self.config.tcp_congestion.as_deref(),
            &self.config.security,
        )
        .await?;
        self.connections
            .lock()
            .expect("connections")
            .insert(address.to_string(), connection.clone());
        Ok(connection)
    }

    fn cached_connection(&self, address: &str) -> Option<Arc<Connection>> {
        self.connections
            .lock()
            .expect("connections")
            .get(address)
            .filter(|connection| !connection.is_closed())
            .cloned()
    }

    /// Sends `request` to `address` with the request timeout.
    pub async fn request(&self, address: &str, request: Request) -> Result<Response, ClientError> {
        let connection = self.connection(address).await?;
        let timeout = self.config.request_timeout;
        tokio::time::timeout(timeout, connection.request(request))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Sends `request` to the first bootstrap broker that answers.
    pub async fn any_broker(&self, request: Request) -> Result<Response, ClientError> {
        let mut last = None;
        for address in &self.config.bootstrap {
            match self.request(address, request.clone()).await {
                Ok(response) => return Ok(response),
                Err(error) if error.is_retriable() => last = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::NoBrokers(self.config.bootstrap.join(","))))
    }

    pub async fn refresh_metadata(&self) -> Result<Arc<ClusterMetadata>, ClientError> {
        let response = self
            .any_broker(Request::Metadata(MetadataRequest { topics: None }))
            .await?;
        let Response::Metadata(response) = response else {
            return Err(ClientError::Protocol(
                "metadata answered with another api".into(),
            ));
        };
        let metadata = Arc::new(ClusterMetadata::from_response(response));
        *self.metadata.lock().expect("metadata") = Some(metadata.clone());
        Ok(metadata)
    }

    /// The cached metadata (refreshed when missing).
    pub async fn metadata(&self) -> Result<Arc<ClusterMetadata>, ClientError> {
        let cached = self.metadata.lock().expect("metadata").clone();
        match cached {
            Some(metadata) => Ok(metadata),
            None => self.refresh_metadata().await,
        }
    }

    /// The partition count of `topic` in the cached metadata, if it knows the topic: one lock
    /// and one lookup, for the producer's per-record path.
    pub(crate) fn cached_partition_count(&self, topic: &str) -> Option<u32> {
        let cached = self.metadata.lock().expect("metadata");
        cached
            .as_ref()?
            .topics
            .get(topic)
            .map(|metadata| metadata.partitions.len() as u32)
    }

    /// Metadata that knows `topic`, refreshing once if the cache does not.
    pub async fn metadata_for(&self, topic: &str) -> Result<Arc<ClusterMetadata>, ClientError> {
        let metadata = self.metadata().await?;
        if metadata.topics.contains_key(topic) {
            return Ok(metadata);
        }
        // A topic just created through another broker may take a moment to reach this one:
        // ask again for a little while before calling it unknown (as Kafka clients wait for
        // metadata).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let metadata = self.refresh_metadata().await?;
            if metadata.topics.contains_key(topic) {
                return Ok(metadata);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClientError::UnknownTopic(topic.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u16,
        configs: &[(String, String)],
    ) -> Result<(), ClientError> {
        self.create(name, partitions, replication_factor, Vec::new(), configs)
            .await
    }

    /// Creates a topic whose partition `i` lives on `assignment[i]` (first the preferred
    /// leader), as Kafka's `--replica-assignment` places them; every partition needs the same
    /// number of replicas.
    pub async fn create_topic_assigned(
        &self,
        name: &str,
        assignment: Vec<Vec<i32>>,
        configs: &[(String, String)],
    ) -> Result<(), ClientError> {
        let (Ok(partitions), Some(Ok(replication_factor))) = (
            u32::try_from(assignment.len()),
            assignment
                .first()
                .map(|replicas| u16::try_from(replicas.len())),
        ) else {
            return Err(ClientError::Protocol(
                "a replica assignment needs at least one partition".into(),
            ));
        };
        self.create(name, partitions, replication_factor, assignment, configs)
            .await
    }

    async fn create(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u16,
        assignment: Vec<Vec<i32>>,
        configs: &[(String, String)],
    ) -> Result<(), ClientError> {
        let request = Request::CreateTopic(CreateTopicRequest {
            name: name.to_string(),
            partitions,
            replication_factor,
            configs: configs
                .iter()
                .map(|(key, value)| ConfigEntry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            replica_assignment: strata_wire::protocol::Appended(assignment),
        });
        let Response::CreateTopic(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "create topic answered with another api".into(),
            ));
        };
        admin_outcome(response.error, &response.message)?;
        self.refresh_metadata().await?;
        Ok(())
    }

    /// Starts moving a partition to `replicas` (added replicas catch up and join the ISR, then
    /// the others are dropped); returns once the move is recorded, not when it completes.
    /// Empty `replicas` cancels the reassignment under way, back to where it started.
    pub async fn reassign_partition(
        &self,
        topic: &str,
        partition: u32,
        replicas: &[i32],
    ) -> Result<(), ClientError> {
        let request = Request::ReassignPartition(strata_wire::protocol::ReassignPartitionRequest {
            topic: topic.to_string(),
            partition,
            replicas: replicas.to_vec(),
        });
        let Response::ReassignPartition(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "reassign answered with another api".into(),
            ));
        };
        admin_outcome(response.error, &response.message)?;
        self.refresh_metadata().await?;
        Ok(())
    }

    /// Moves leaderships back to preferred replicas now, in `topic` or in every topic; returns
    /// how many moved.
    pub async fn elect_leaders(&self, topic: Option<&str>) -> Result<u32, ClientError> {
        let elected = self
            .elect_partition_leaders(topic.unwrap_or_default(), &[], false)
            .await?;
        Ok(elected.moved)
    }

    /// Kafka's ElectLeaders on `partitions` of `topic` (every partition when empty): to the
    /// preferred replica, or `unclean`ly for partitions whose in-sync replicas are all down;
    /// the answer has each named partition's result.
    pub async fn elect_partition_leaders(
        &self,
        topic: &str,
        partitions: &[u32],
        unclean: bool,
    ) -> Result<strata_wire::protocol::ElectLeadersResponse, ClientError> {
        let request = Request::ElectLeaders(strata_wire::protocol::ElectLeadersRequest {
            topic: topic.to_string(),
            partitions: strata_wire::protocol::Appended(partitions.to_vec()),
            unclean: strata_wire::protocol::Appended(unclean),
        });
        let Response::ElectLeaders(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "elect leaders answered with another api".into(),
            ));
        };
        admin_outcome(response.error, &response.message)?;
        self.refresh_metadata().await?;
        Ok(response)
    }

    /// Grows `topic` to `partitions` partitions in total.
    pub async fn add_partitions(&self, topic: &str, partitions: u32) -> Result<(), ClientError> {
        let request = Request::CreatePartitions(strata_wire::protocol::CreatePartitionsRequest {
            replica_assignment: Default::default(),
            topic: topic.to_string(),
            partitions,
        });
        let Response::CreatePartitions(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "create partitions answered with another api".into(),
            ));
        };
        admin_outcome(response.error, &response.message)?;
        self.refresh_metadata().await?;
        Ok(())
    }

    /// Sets (`set`: key, value) and removes (`delete`: back to the default) config overrides of
    /// `topic`, all or nothing. The brokers apply them to the topic's partitions as they learn
    /// of the change.
    pub async fn alter_topic_config(
        &self,
        topic: &str,
        set: &[(String, String)],
        delete: &[String],
    ) -> Result<(), ClientError> {
        let request = Request::AlterTopicConfig(strata_wire::protocol::AlterTopicConfigRequest {
            topic: topic.to_string(),
            set: set
                .iter()
                .map(|(key, value)| ConfigEntry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            delete: delete.to_vec(),
        });
        let Response::AlterTopicConfig(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "alter topic config answered with another api".into(),
            ));
        };
        admin_outcome(response.error, &response.message)
    }

    /// Every setting of `topic`: its effective value, and whether the topic overrides it.
    pub async fn describe_topic_config(
        &self,
        topic: &str,
    ) -> Result<Vec<strata_wire::protocol::TopicConfigEntry>, ClientError> {
        let request =
            Request::DescribeTopicConfig(strata_wire::protocol::DescribeTopicConfigRequest {
                topic: topic.to_string(),
            });
        let Response::DescribeTopicConfig(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "describe topic config answered with another api".into(),
            ));
        };
        admin_outcome(response.error, "")?;
        Ok(response.configs)
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), ClientError> {
        let request = Request::DeleteTopic(DeleteTopicRequest {
            name: name.to_string(),
        });
        let Response::DeleteTopic(response) = self.any_broker(request).await? else {
            return Err(ClientError::Protocol(
                "delete topic answered with another api".into(),
            ));
        };
        if response.error != ErrorCode::None {
            return Err(ClientError::Broker(response.error));
        }
        self.refresh_metadata().await?;
        Ok(())
    }

    /// A producer id and epoch for an idempotent producer: a new id, or (with `current`) the
    /// same id at the next epoch, which fences the producer's older instance.
    pub async fn init_producer_id(
        &self,
        current: Option<(i64, i16)>,
    ) -> Result<(i64, i16), ClientError> {
        let (producer_id, producer_epoch) = current.unwrap_or((-1, -1));
        let request = Request::InitProducerId(strata_wire::protocol::InitProducerIdRequest {
            producer_id,
            producer_epoch,
            transactional: Appended(None),
        });
        let deadline = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            let Response::InitProducerId(response) = self.any_broker(request.clone()).await? else {
                return Err(ClientError::Protocol(
                    "init producer id answered with another api".into(),
                ));
            };
            match response.error {
                ErrorCode::None => return Ok((response.producer_id, response.producer_epoch)),
                code if code.is_retriable() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                code => return Err(ClientError::Broker(code)),
            }
        }
    }

    /// [`Client::list_offset`], retrying retriable errors (a leader moving, a broker
    /// restarting) with a metadata refresh, for up to the request timeout.
    pub async fn list_offset_retrying(
        &self,
        topic: &str,
        partition: u32,
        timestamp: i64,
    ) -> Result<Option<u64>, ClientError> {
        let deadline = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            match self.list_offset(topic, partition, timestamp).await {
                Err(error) if error.is_retriable() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = self.refresh_metadata().await;
                }
                result => return result,
            }
        }
    }

    /// Deletes the records of `topic`-`partition` below `before` (-1: below the high
    /// watermark), Kafka's DeleteRecords: its log start moves there, on its followers too;
    /// returns the new log start.
    pub async fn delete_records(
        &self,
        topic: &str,
        partition: u32,
        before: i64,
    ) -> Result<u64, ClientError> {
        let metadata = self.metadata_for(topic).await?;
        let address = metadata.leader_address(topic, partition, self.config.shard_aware)?;
        let request = Request::DeleteRecords(strata_wire::protocol::DeleteRecordsRequest {
            topics: vec![strata_wire::protocol::DeleteRecordsTopic {
                name: topic.to_string(),
                partitions: vec![strata_wire::protocol::DeleteRecordsPartition {
                    partition,
                    offset: before,
                }],
            }],
        });
        let Response::DeleteRecords(response) = self.request(&address, request).await? else {
            return Err(ClientError::Protocol(
                "delete records answered with another api".into(),
            ));
        };
        let first = response.topics.first().and_then(|t| t.partitions.first());
        let answer = only_partition(first, topic, partition, |p| p.error)?;
        Ok(answer.log_start_offset as u64)
    }

    /// The offset for `timestamp` (or the `EARLIEST`/`LATEST` sentinels); `None` when no record
    /// is at or after the timestamp.
    pub async fn list_offset(
        &self,
        topic: &str,
        partition: u32,
        timestamp: i64,
    ) -> Result<Option<u64>, ClientError> {
        let metadata = self.metadata_for(topic).await?;
        let address = metadata.leader_address(topic, partition, self.config.shard_aware)?;
        let request = Request::ListOffsets(ListOffsetsRequest {
            topics: vec![ListOffsetsTopic {
                name: topic.to_string(),
                partitions: vec![ListOffsetsPartition {
                    partition,
                    timestamp,
                }],
            }],
            read_committed: Appended(false),
        });
        let Response::ListOffsets(response) = self.request(&address, request).await? else {
            return Err(ClientError::Protocol(
                "list offsets answered with another api".into(),
            ));
        };
        let first = response.topics.first().and_then(|t| t.partitions.first());
        let answer = only_partition(first, topic, partition, |p| p.error)?;
        Ok(u64::try_from(answer.offset).ok())
    }

    /// The timestamp of the first record at or after `offset` (the record there, unless
    /// compaction removed it), read from the partition's leader; `None` when there is none
    /// below the high watermark. What a consumer lag in seconds is measured from.
    pub async fn record_timestamp_at(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<Option<i64>, ClientError> {
        let metadata = self.metadata_for(topic).await?;
        let address = metadata.leader_address(topic, partition, self.config.shard_aware)?;
        let request = Request::Fetch(FetchRequest::timestamp_lookup(topic, partition, offset));
        let Response::Fetch(mut response) = self.request(&address, request).await? else {
            return Err(ClientError::Protocol(
                "fetch answered with another api".into(),
            ));
        };
        let first = response
            .topics
            .first_mut()
            .and_then(|t| t.partitions.first_mut());
        let answer = only_partition(first.as_deref(), topic, partition, |p| p.error)?;
        let records = answer.records.clone().freeze();
        strata_wire::batch::first_record_timestamp(records, offset)
            .map_err(|error| ClientError::Protocol(error.to_string()))
    }
}

/// The answer of the one partition a request named, or its error.
fn only_partition<'a, P>(
    answer: Option<&'a P>,
    topic: &str,
    partition: u32,
    error_of: impl Fn(&P) -> ErrorCode,
) -> Result<&'a P, ClientError> {
    let answer =
        answer.ok_or_else(|| ClientError::Protocol("an answer without its partition".into()))?;
    match error_of(answer) {
        ErrorCode::None => Ok(answer),
        code => Err(ClientError::Partition {
            topic: topic.to_string(),
            partition,
            code,
        }),
    }
}

/// An admin request's answer: an error with the broker's explanation, when it gave one.
fn admin_outcome(error: ErrorCode, message: &str) -> Result<(), ClientError> {
    match error {
        ErrorCode::None => Ok(()),
        code if message.is_empty() => Err(ClientError::Broker(code)),
        code => Err(ClientError::InvalidArgument(format!("{code}: {message}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::protocol::TopicMetadata;

    #[test]
    fn a_topic_without_partitions_or_with_an_error_is_unknown() {
        let topic = |name: &str, error, partitions| TopicMetadata {
            name: name.into(),
            error,
            partitions,
        };
        let metadata = ClusterMetadata::from_response(MetadataResponse {
            cluster: "c".into(),
            controller: 1,
            brokers: Vec::new(),
            topics: vec![
                topic("empty", ErrorCode::None, Vec::new()),
                topic("failed", ErrorCode::UnknownTopic, Vec::new()),
            ],
        });
        for name in ["empty", "failed"] {
            assert!(
                matches!(
                    metadata.partition_count(name),
                    Err(ClientError::UnknownTopic(_))
                ),
                "{name}"
            );
        }
    }
}
