//! Metadata and topic settings, answered from the cluster view the shard holds.

use strata_coordinator::TopicState;
use strata_wire::protocol::{
    BrokerMetadata, ErrorCode, MetadataRequest, MetadataResponse, PartitionMetadata, TopicMetadata,
};

use crate::server::topic_config::TopicConfig;

use super::{Shard, shard_of};

impl Shard {
    pub(super) fn metadata(&self, request: MetadataRequest) -> MetadataResponse {
        let config = &self.context.config;
        let view = self.view.borrow();
        let topics = &view.topics;
        let describe = |topic: &TopicState| TopicMetadata {
            name: topic.name.clone(),
            error: ErrorCode::None,
            partitions: topic
                .partitions
                .iter()
                .map(|partition| PartitionMetadata {
                    partition: partition.partition,
                    error: ErrorCode::None,
                    leader: partition.leader,
                    leader_epoch: partition.leader_epoch,
                    // The owning shard on the leader, which may run a different shard count.
                    shard: shard_of(
                        &topic.name,
                        partition.partition,
                        view.brokers
                            .iter()
                            .find(|broker| broker.id == partition.leader)
                            .map_or(config.shards, |broker| broker.shard_ports.len().max(1)),
                    ) as u16,
                    replicas: partition.replicas.clone(),
                    isr: partition.isr.clone(),
                })
                .collect(),
        };
        let topics = match request.topics {
            None => topics.iter().map(describe).collect(),
            Some(names) => names
                .into_iter()
                .map(|name| match topics.iter().find(|t| t.name == name) {
                    Some(topic) => describe(topic),
                    None => TopicMetadata {
                        name,
                        error: ErrorCode::UnknownTopic,
                        partitions: Vec::new(),
                    },
                })
                .collect(),
        };
        MetadataResponse {
            cluster: config.cluster.clone(),
            controller: view.controller,
            brokers: view
                .brokers
                .iter()
                .map(|broker| BrokerMetadata {
                    node_id: broker.id,
                    host: broker.host.clone(),
                    port: broker.port,
                    shard_ports: broker.shard_ports.clone(),
                })
                .collect(),
            topics,
        }
    }

    /// What a topic a Kafka client creates without saying gets: the broker's `num.partitions`
    /// and `default.replication.factor`, as set live, else as the broker started.
    pub(in crate::server) fn kafka_topic_defaults(&self) -> strata_kafka::admin::TopicDefaults {
        use crate::server::broker_config::{DEFAULT_REPLICATION_FACTOR, NUM_PARTITIONS};
        let started = self.context.config.kafka_topic_defaults;
        let dynamic = &self.view.borrow().dynamic;
        strata_kafka::admin::TopicDefaults {
            partitions: dynamic.number(NUM_PARTITIONS).unwrap_or(started.partitions),
            replication_factor: dynamic
                .number(DEFAULT_REPLICATION_FACTOR)
                .unwrap_or(started.replication_factor),
        }
    }

    /// A topic's effective settings from the cluster view (the coordinator's state as this node
    /// last read it): its overrides on top of the topic defaults set live.
    pub(super) fn describe_topic_config(
        &self,
        topic: &str,
    ) -> strata_wire::protocol::DescribeTopicConfigResponse {
        use strata_wire::protocol::{DescribeTopicConfigResponse, TopicConfigEntry};
        let view = self.view.borrow();
        let Some(state) = view.topics.iter().find(|t| t.name == topic) else {
            return DescribeTopicConfigResponse {
                error: ErrorCode::UnknownTopic,
                configs: Vec::new(),
            };
        };
        let Ok(parsed) = TopicConfig::parse(&view.dynamic.topic_config(&state.config)) else {
            // Stored configs were validated before they were stored.
            return DescribeTopicConfigResponse {
                error: ErrorCode::Internal,
                configs: Vec::new(),
            };
        };
        DescribeTopicConfigResponse {
            error: ErrorCode::None,
            configs: parsed
                .entries()
                .into_iter()
                .map(|(key, value)| TopicConfigEntry {
                    key: key.to_string(),
                    is_override: state.config.contains_key(key),
                    value,
                })
                .collect(),
        }
    }
}
