//! The control thread: owns the coordinator, applies topic changes, and tells every shard.
//!
//! It runs on its own thread and runtime, and builds the coordinator there (an etcd client is
//! bound to the runtime it was created on), so a slow control-plane call never stalls a shard.
//! With etcd it also re-reads the cluster's keys every 250 ms (a watch from a revision is the
//! next step): a topic created through another broker, or a broker joining or leaving, reaches
//! this node's shards the same way as a local change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use strata_coordinator::{
    Coordinator, CoordinatorError, EtcdCoordinator, LocalCoordinator, TopicSpec,
};
use strata_wire::protocol::{
    CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest, DeleteTopicResponse, ErrorCode,
};
use tokio::sync::{mpsc, oneshot};

use super::NodeConfig;
use super::shard::{ClusterView, ShardMessage};
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
    /// Resign from the cluster (revoke the broker lease) and stop.
    Shutdown { reply: oneshot::Sender<()> },
}

/// Which coordinator the node runs on.
enum AnyCoordinator {
    Local(LocalCoordinator),
    Etcd(Box<EtcdCoordinator>),
}

macro_rules! each {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            AnyCoordinator::Local($name) => $body,
            AnyCoordinator::Etcd($name) => $body,
        }
    };
}

impl AnyCoordinator {
    async fn open(config: &NodeConfig) -> Result<AnyCoordinator, CoordinatorError> {
        Ok(match &config.etcd {
            None => AnyCoordinator::Local(LocalCoordinator::open(
                config.data_dir.join("__cluster"),
                config.cluster.clone(),
                config.node_id,
            )?),
            Some(endpoints) => AnyCoordinator::Etcd(Box::new(
                EtcdCoordinator::connect(
                    endpoints,
                    &config.cluster,
                    config.node_id,
                    config.lease_ttl,
                )
                .await?,
            )),
        })
    }

    async fn view(&self) -> Result<ClusterView, CoordinatorError> {
        let (topics, brokers) = each!(self, c => (c.topics().await?, c.brokers().await?));
        Ok(ClusterView {
            topics: Arc::new(topics),
            brokers: Arc::new(brokers),
            controller: each!(self, c => c.controller()),
        })
    }
}

/// Starts the control thread; returns once the coordinator is open and this broker registered,
/// with the cluster as it is now.
pub fn start(
    config: Arc<NodeConfig>,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    mailbox: mpsc::UnboundedReceiver<ControlMessage>,
) -> anyhow::Result<(std::thread::JoinHandle<()>, ClusterView)> {
    let (ready, started) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("strata-control".into())
        .spawn(move || run(config, shards, mailbox, ready))?;
    match started.blocking_recv() {
        Ok(Ok(view)) => Ok((thread, view)),
        Ok(Err(error)) => {
            let _ = thread.join();
            Err(anyhow::anyhow!("{error}"))
        }
        Err(_) => anyhow::bail!("the control thread stopped while starting"),
    }
}

fn run(
    config: Arc<NodeConfig>,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    mut mailbox: mpsc::UnboundedReceiver<ControlMessage>,
    ready: oneshot::Sender<Result<ClusterView, String>>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async move {
        let coordinator = match AnyCoordinator::open(&config).await {
            Ok(coordinator) => coordinator,
            Err(error) => {
                let _ = ready.send(Err(format!("opening the coordinator: {error}")));
                return;
            }
        };
        let registered = each!(&coordinator, c => c.register_broker(config.broker_info()).await);
        if let Err(error) = registered {
            let _ = ready.send(Err(format!("registering broker {}: {error}", config.node_id)));
            return;
        }
        match coordinator.view().await {
            Ok(view) => {
                let _ = ready.send(Ok(view));
            }
            Err(error) => {
                let _ = ready.send(Err(format!("reading cluster state: {error}")));
                return;
            }
        }
        // With etcd, other brokers change the cluster too: poll for changes.
        let mut changes = tokio::time::interval(Duration::from_millis(match &coordinator {
            AnyCoordinator::Etcd(_) => 250,
            AnyCoordinator::Local(_) => 3_600_000,
        }));
        let mut last = coordinator.view().await.ok();
        loop {
            tokio::select! {
                message = mailbox.recv() => {
                    let Some(message) = message else { break };
                    match message {
                        ControlMessage::CreateTopic { request, reply } => {
                            let response = create_topic(&config, &coordinator, request).await;
                            last = announce(&coordinator, &shards).await.or(last);
                            let _ = reply.send(response);
                        }
                        ControlMessage::DeleteTopic { request, reply } => {
                            let result = each!(&coordinator, c => c.delete_topic(&request.name).await);
                            let error = match result {
                                Ok(_) => {
                                    tracing::info!(topic = %request.name, "topic deleted");
                                    ErrorCode::None
                                }
                                Err(error) => error_code(&error),
                            };
                            last = announce(&coordinator, &shards).await.or(last);
                            let _ = reply.send(DeleteTopicResponse { error });
                        }
                        ControlMessage::Shutdown { reply } => {
                            if let AnyCoordinator::Etcd(etcd) = coordinator
                                && let Err(error) = etcd.resign().await
                            {
                                tracing::warn!("resigning from etcd: {error}");
                            }
                            let _ = reply.send(());
                            return;
                        }
                    }
                }
                _ = changes.tick() => {
                    match coordinator.view().await {
                        Ok(view) if Some(&view) != last.as_ref() => {
                            tracing::info!(
                                topics = view.topics.len(),
                                brokers = view.brokers.len(),
                                "cluster state changed"
                            );
                            send_view(&shards, view.clone()).await;
                            last = Some(view);
                        }
                        Ok(_) => {}
                        Err(error) => tracing::warn!("reading cluster state: {error}"),
                    }
                }
            }
        }
    });
}

async fn create_topic(
    config: &NodeConfig,
    coordinator: &AnyCoordinator,
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
    match each!(coordinator, c => c.create_topic(spec).await) {
        Ok(topic) => {
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

/// Sends the current cluster state to every shard and waits until each has opened or closed its
/// partitions to match, so a client that saw CreateTopic succeed can produce at once.
async fn announce(
    coordinator: &AnyCoordinator,
    shards: &[mpsc::UnboundedSender<ShardMessage>],
) -> Option<ClusterView> {
    match coordinator.view().await {
        Ok(view) => {
            send_view(shards, view.clone()).await;
            Some(view)
        }
        Err(error) => {
            tracing::error!("reading cluster state failed: {error}");
            None
        }
    }
}

async fn send_view(shards: &[mpsc::UnboundedSender<ShardMessage>], view: ClusterView) {
    let mut acks = Vec::new();
    for shard in shards {
        let (reply, ack) = oneshot::channel();
        if shard
            .send(ShardMessage::ClusterChanged {
                view: view.clone(),
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
        CoordinatorError::Unavailable(_) => ErrorCode::NotReady,
        CoordinatorError::BrokerIdTaken(_)
        | CoordinatorError::Storage { .. }
        | CoordinatorError::Corrupt { .. } => ErrorCode::Internal,
    }
}
