//! The control thread: owns the coordinator, applies topic changes, and tells every shard.
//!
//! It runs on its own thread and runtime (the etcd client will live here too), so a slow
//! control-plane call never stalls a shard's data path.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_coordinator::{Coordinator, CoordinatorError, LocalCoordinator, TopicSpec, TopicState};
use strata_wire::protocol::{
    CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest, DeleteTopicResponse, ErrorCode,
};
use tokio::sync::{mpsc, oneshot};

use super::NodeConfig;
use super::shard::ShardMessage;
use super::topic_config::TopicConfig;

pub enum ControlMessage {
    CreateTopic {
        request: CreateTopicRequest,
        reply: oneshot::Sender<CreateTopicResponse>,
    },
    DeleteTopic {
        request: DeleteTopicRequest,
        reply: oneshot::Sender<DeleteTopicResponse>,
    },
}

pub fn run(
    config: Arc<NodeConfig>,
    coordinator: LocalCoordinator,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    mut mailbox: mpsc::UnboundedReceiver<ControlMessage>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async move {
        while let Some(message) = mailbox.recv().await {
            match message {
                ControlMessage::CreateTopic { request, reply } => {
                    let response = create_topic(&config, &coordinator, &shards, request).await;
                    let _ = reply.send(response);
                }
                ControlMessage::DeleteTopic { request, reply } => {
                    let error = match coordinator.delete_topic(&request.name).await {
                        Ok(_) => {
                            announce(&coordinator, &shards).await;
                            tracing::info!(topic = %request.name, "topic deleted");
                            ErrorCode::None
                        }
                        Err(error) => error_code(&error),
                    };
                    let _ = reply.send(DeleteTopicResponse { error });
                }
            }
        }
    });
}

async fn create_topic(
    config: &NodeConfig,
    coordinator: &LocalCoordinator,
    shards: &[mpsc::UnboundedSender<ShardMessage>],
    request: CreateTopicRequest,
) -> CreateTopicResponse {
    let failed = |error: ErrorCode, message: String| CreateTopicResponse { error, message };
    let overrides: BTreeMap<String, String> = request
        .configs
        .into_iter()
        .map(|entry| (entry.key, entry.value))
        .collect();
    if let Err(message) = TopicConfig::parse(&overrides) {
        return failed(ErrorCode::InvalidConfig, message);
    }
    if request.partitions == 0 || request.partitions > 100_000 {
        return failed(
            ErrorCode::InvalidConfig,
            format!("partitions={}: expected 1 to 100000", request.partitions),
        );
    }
    let spec = TopicSpec {
        name: request.name.clone(),
        partitions: request.partitions,
        replication_factor: request.replication_factor.max(1),
        config: overrides,
    };
    match coordinator.create_topic(spec).await {
        Ok(topic) => {
            announce(coordinator, shards).await;
            tracing::info!(
                node = config.node_id,
                topic = %topic.name,
                partitions = topic.partitions.len(),
                "topic created"
            );
            CreateTopicResponse {
                error: ErrorCode::None,
                message: String::new(),
            }
        }
        Err(error) => failed(error_code(&error), error.to_string()),
    }
}

/// Sends the current topic table to every shard and waits until each has opened or closed its
/// partitions to match, so a client that saw CreateTopic succeed can produce at once.
async fn announce(coordinator: &LocalCoordinator, shards: &[mpsc::UnboundedSender<ShardMessage>]) {
    let topics: Arc<Vec<TopicState>> = match coordinator.topics().await {
        Ok(topics) => Arc::new(topics),
        Err(error) => {
            tracing::error!("reading topics failed: {error}");
            return;
        }
    };
    let mut acks = Vec::new();
    for shard in shards {
        let (reply, ack) = oneshot::channel();
        if shard
            .send(ShardMessage::TopicsChanged {
                topics: topics.clone(),
                reply,
            })
            .is_ok()
        {
            acks.push(ack);
        }
    }
    for ack in acks {
        let _ = ack.await;
    }
}

fn error_code(error: &CoordinatorError) -> ErrorCode {
    match error {
        CoordinatorError::TopicExists(_) => ErrorCode::TopicAlreadyExists,
        CoordinatorError::UnknownTopic(_) => ErrorCode::UnknownTopic,
        CoordinatorError::InvalidTopicName { .. } => ErrorCode::InvalidTopicName,
        CoordinatorError::Invalid(_) => ErrorCode::InvalidConfig,
        CoordinatorError::Storage { .. } | CoordinatorError::Corrupt { .. } => ErrorCode::Internal,
    }
}
