//! What Kafka's authorizer checks for each API, applied to the Kafka listener's requests before
//! they run: the parts a client may not touch are taken out of the request and answered with
//! Kafka's error for them (TOPIC_AUTHORIZATION_FAILED per partition, GROUP_AUTHORIZATION_FAILED
//! for a group, CLUSTER_AUTHORIZATION_FAILED for the cluster), the rest runs as usual.
//!
//! | API | needs |
//! |---|---|
//! | Produce | Write on the topic |
//! | Fetch | Read on the topic |
//! | ListOffsets, Metadata | Describe on the topic (Metadata lists only those) |
//! | Metadata creating a topic | Create on the cluster or the topic |
//! | InitProducerId | IdempotentWrite on the cluster, or Write on any topic |
//! | FindCoordinator, DescribeGroups, OffsetFetch | Describe on the group |
//! | JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit | Read on the group |
//! | OffsetCommit | Read on each topic; OffsetFetch: Describe on each topic |
//! | ListGroups | Describe on the cluster, or lists the groups it may Describe |
//! | DeleteGroups | Delete on the group (a share group's too) |
//! | CreateTopics | Create on the cluster or the topic |
//! | DeleteTopics | Delete on the topic |
//! | CreatePartitions | Alter on the topic |
//! | DescribeConfigs | DescribeConfigs on the topic, the cluster for a broker, or the group |
//! | AlterConfigs, IncrementalAlterConfigs | AlterConfigs on the topic, the cluster for a broker, or the group |
//! | ACLs and SCRAM users | Describe / Alter on the cluster (see `security_admin`) |
//! | ShareGroupHeartbeat | Read on the group, Describe on each topic subscribed |
//! | ShareFetch, ShareAcknowledge | Read on the group, Read on each topic |
//! | ShareGroupDescribe | Describe on the group |
//! | DescribeShareGroupOffsets | Describe on the group, Describe on each topic (those refused left out when all are asked for) |
//! | AlterShareGroupOffsets | Read on the group, Read on each topic |
//! | DeleteShareGroupOffsets | Delete on the group, Read on each topic |
//! | FindCoordinator of a share-partition key (type 2) | ClusterAction on the cluster |
//!
//! A node without `--authorizer` allows everything, and every check here is then a no-op.

use strata_auth::acl::{CLUSTER_NAME, Operation, ResourceType};
use strata_kafka::errors;
use strata_kafka::translate::Refused;
use strata_wire::protocol::{FetchTopic, ListOffsetsTopic, ProduceTopic};

use crate::server::listener::Client;
use crate::server::shard::Shard;

/// Whether `client` may do `operation` on topic `name`.
pub(super) fn topic(shard: &Shard, client: &Client, operation: Operation, name: &str) -> bool {
    client.may(shard, operation, ResourceType::Topic, name)
}

/// Whether `client` may do `operation` on group `name`.
pub(super) fn group(shard: &Shard, client: &Client, operation: Operation, name: &str) -> bool {
    client.may(shard, operation, ResourceType::Group, name)
}

/// Whether `client` may do `operation` on the transactional id `id`.
pub(super) fn transactional_id(
    shard: &Shard,
    client: &Client,
    operation: Operation,
    id: &str,
) -> bool {
    client.may(shard, operation, ResourceType::TransactionalId, id)
}

/// Whether `client` may do `operation` on the cluster.
pub(super) fn cluster(shard: &Shard, client: &Client, operation: Operation) -> bool {
    client.may(shard, operation, ResourceType::Cluster, CLUSTER_NAME)
}

/// Whether `client` may create topic `name` (Create on the cluster or on the topic).
pub(super) fn create_topic(shard: &Shard, client: &Client, name: &str) -> bool {
    cluster(shard, client, Operation::Create) || topic(shard, client, Operation::Create, name)
}

/// A topic of a translated request: its name and partitions.
pub(super) trait TopicEntry {
    fn topic(&self) -> &str;
    fn partitions(&self) -> impl Iterator<Item = u32>;
}

macro_rules! topic_entries {
    ($($entry:ty),*) => {$(
        impl TopicEntry for $entry {
            fn topic(&self) -> &str {
                &self.name
            }
            fn partitions(&self) -> impl Iterator<Item = u32> {
                self.partitions.iter().map(|partition| partition.partition)
            }
        }
    )*};
}

topic_entries!(ProduceTopic, FetchTopic, ListOffsetsTopic);

/// Takes the topics `client` may not `operation` out of `topics`, each partition of them
/// answered TOPIC_AUTHORIZATION_FAILED in `refused`.
pub(super) fn refuse_topics<T: TopicEntry>(
    shard: &Shard,
    client: &Client,
    operation: Operation,
    topics: &mut Vec<T>,
    refused: &mut Vec<Refused>,
) {
    topics.retain(|entry| {
        let name = entry.topic();
        if topic(shard, client, operation, name) {
            return true;
        }
        refused.extend(entry.partitions().map(|partition| Refused {
            topic: name.to_string(),
            partition: partition as i32,
            error: errors::TOPIC_AUTHORIZATION_FAILED,
        }));
        false
    });
}
