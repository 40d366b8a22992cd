//! The control thread: owns the coordinator, applies topic changes, and tells every shard.
//!
//! It runs on its own thread and runtime, and builds the coordinator there (an etcd client is
//! bound to the runtime it was created on), so a slow control-plane call never stalls a shard.
//! It watches the cluster's keys from the revision of its last read and reads the state again
//! when they change: a topic created through another broker, or a broker joining or leaving,
//! reaches this node's shards the same way as a local change. Which store it runs on (the
//! embedded one, etcd) is a type parameter: the loop below is the same for both.
//!
//! - [`membership`]: when to read, what a read means for the view, rejoining and leaving (no IO).
//! - [`controller`]: the election and the controller's failover passes.
//! - [`admin`]: the operations clients ask for.
//! - [`view`]: the cluster view as this node reads it.

mod admin;
mod controller;
mod membership;
mod view;

use std::sync::Arc;
use std::time::Duration;

use strata_coordinator::{Coordinator, CoordinatorError, EtcdCoordinator, LocalCoordinator};
use tokio::sync::{mpsc, oneshot, watch};

use self::controller::Controller;
use self::membership::{Membership, Step, Wake};
use super::NodeConfig;
use super::messages::{ClusterView, ControlMessage, ShardMessage};

pub(crate) use self::admin::check_partition_count;

/// How often the control thread wakes with no change reported: to check the lease and the
/// election, and to read the state when [`Membership::poll_read`] says so.
const TICK: Duration = Duration::from_secs(1);

/// How long the coordinator may be unreachable at start (etcd starting too) before the node
/// gives up.
const OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// Starts the control thread; returns once the coordinator is open and this broker registered,
/// with the cluster as it is now.
pub fn start(
    config: Arc<NodeConfig>,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    views: watch::Sender<ClusterView>,
    mailbox: mpsc::UnboundedReceiver<ControlMessage>,
) -> anyhow::Result<(std::thread::JoinHandle<()>, ClusterView)> {
    let (ready, started) = oneshot::channel();
    let audience = Audience { shards, views };
    let thread = std::thread::Builder::new()
        .name("strata-control".into())
        .spawn(move || run(config, audience, mailbox, ready))?;
    match started.blocking_recv() {
        Ok(Ok(view)) => Ok((thread, view)),
        Ok(Err(error)) => {
            let _ = thread.join();
            Err(anyhow::anyhow!("{error}"))
        }
        Err(_) => anyhow::bail!("the control thread stopped while starting"),
    }
}

/// Who hears of every new cluster view: the shards (and the control thread waits until each
/// has applied it) and the group thread.
struct Audience {
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    views: watch::Sender<ClusterView>,
}

type Ready = oneshot::Sender<Result<ClusterView, String>>;

fn run(
    config: Arc<NodeConfig>,
    audience: Audience,
    mailbox: mpsc::UnboundedReceiver<ControlMessage>,
    ready: Ready,
) {
    let _span = tracing::info_span!("control", node = config.node_id).entered();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async move {
        match &config.etcd {
            None => {
                let opened = LocalCoordinator::open(
                    config.data_dir.join("__cluster"),
                    config.cluster.clone(),
                    config.node_id,
                );
                match opened {
                    Ok(local) => serve(local, &config, audience, mailbox, ready).await,
                    Err(error) => {
                        let _ = ready.send(Err(format!("opening the coordinator: {error}")));
                    }
                }
            }
            Some(endpoints) => {
                // etcd may be starting too: keep trying for a while, saying so.
                let opened = config.clock.now();
                let etcd = loop {
                    let connected = EtcdCoordinator::connect(
                        endpoints,
                        &config.cluster,
                        config.node_id,
                        config.lease_ttl,
                    )
                    .await;
                    match connected {
                        Ok(etcd) => break etcd,
                        Err(CoordinatorError::Unavailable(error))
                            if config.clock.now().saturating_duration_since(opened)
                                < OPEN_PATIENCE =>
                        {
                            tracing::warn!(
                                "the coordinator is not reachable yet ({error}); retrying"
                            );
                            config.clock.sleep(Duration::from_millis(500)).await;
                        }
                        Err(error) => {
                            let _ = ready.send(Err(format!("opening the coordinator: {error}")));
                            return;
                        }
                    }
                };
                serve(etcd, &config, audience, mailbox, ready).await;
            }
        }
    });
}

/// Registers this broker, announces the cluster, then serves the mailbox and follows the
/// cluster until told to shut down.
async fn serve<C: Coordinator>(
    coordinator: C,
    config: &NodeConfig,
    audience: Audience,
    mut mailbox: mpsc::UnboundedReceiver<ControlMessage>,
    ready: Ready,
) {
    if let Err(error) = register(&coordinator, config).await {
        let _ = ready.send(Err(format!(
            "registering broker {}: {error}",
            config.node_id
        )));
        return;
    }
    if let Err(error) = bootstrap_user(&coordinator, config).await {
        let _ = ready.send(Err(format!("creating the bootstrap user: {error}")));
        return;
    }
    coordinator.take_next_epochs().await;
    let view = match view::read_view(&coordinator, &config.security).await {
        Ok((view, _)) => view,
        Err(error) => {
            let _ = ready.send(Err(format!("reading cluster state: {error}")));
            return;
        }
    };
    audience.views.send_replace(view.clone());
    let _ = ready.send(Ok(view.clone()));
    let (watch_sender, mut watched) = mpsc::unbounded_channel::<()>();
    let mut control = ControlThread {
        membership: Membership::new(config.node_id, view, config.clock.now()),
        controller: Controller::new(config.leader_rebalance_interval, config.clock.now()),
        coordinator,
        config,
        audience,
        watch_sender,
        watch: None,
        leave_reply: None,
    };
    // Other brokers change the cluster too: a watch on the cluster's keys wakes this loop on
    // every change. The tick checks the lease and the election between changes.
    let clock = control.config.clock;
    let mut ticks = clock.ticks(TICK);
    loop {
        tokio::select! {
            message = mailbox.recv() => {
                let Some(message) = message else { break };
                if control.handle_message(message).await.is_break() {
                    return;
                }
            }
            changed = async {
                tokio::select! {
                    _ = ticks.tick() => false,
                    Some(()) = watched.recv() => {
                        // Coalesce a burst of events into one re-read.
                        clock.sleep(Duration::from_millis(20)).await;
                        while watched.try_recv().is_ok() {}
                        true
                    }
                }
            } => control.handle_wake(changed).await,
        }
        control.carry_out_steps().await;
    }
}

/// Creates `STRATA_BOOTSTRAP_USER` with a credential of each SCRAM mechanism when no user of
/// that name exists (as Redpanda's `RP_BOOTSTRAP_USER`): a secured cluster's first user, so
/// that the first `strata user create` or `kafka-configs` call can authenticate. An existing
/// user is left as it is: the variable never resets a password.
async fn bootstrap_user(
    coordinator: &impl Coordinator,
    config: &NodeConfig,
) -> Result<(), CoordinatorError> {
    let Some((name, password)) = &config.security.bootstrap_user else {
        return Ok(());
    };
    if coordinator
        .users()
        .await?
        .iter()
        .any(|user| &user.name == name)
    {
        return Ok(());
    }
    for mechanism in strata_auth::scram::ScramMechanism::ALL {
        let credential = crate::server::security::new_credential(
            mechanism,
            password.as_bytes(),
            strata_auth::scram::DEFAULT_ITERATIONS,
        )
        .map_err(|error| CoordinatorError::InvalidArgument(error.to_string()))?;
        coordinator
            .upsert_scram_credential(name, credential)
            .await?;
    }
    tracing::info!(user = %name, "created the bootstrap user");
    Ok(())
}

/// The control thread's state between events: the membership machine and what carries out
/// its steps.
struct ControlThread<'a, C> {
    coordinator: C,
    config: &'a NodeConfig,
    audience: Audience,
    membership: Membership,
    controller: Controller,
    /// Where the watch reports changes.
    watch_sender: mpsc::UnboundedSender<()>,
    watch: Option<tokio::task::JoinHandle<Result<(), CoordinatorError>>>,
    /// The request to leave, answered once the membership says so.
    leave_reply: Option<oneshot::Sender<()>>,
}

impl<C: Coordinator> ControlThread<'_, C> {
    /// A request from a shard or an admin client; `Break` once told to shut down.
    async fn handle_message(&mut self, message: ControlMessage) -> std::ops::ControlFlow<()> {
        let coordinator = &self.coordinator;
        match message {
            ControlMessage::CreateTopic { request, reply } => {
                let response =
                    admin::create_topic(coordinator, request, self.config.remote_storage.is_some())
                        .await;
                self.announce().await;
                let _ = reply.send(response);
            }
            ControlMessage::DeleteTopic { request, reply } => {
                let response = admin::delete_topic(coordinator, request).await;
                self.announce().await;
                let _ = reply.send(response);
            }
            ControlMessage::Reassign { request, reply } => {
                let response = admin::reassign(coordinator, request).await;
                self.announce().await;
                let _ = reply.send(response);
            }
            ControlMessage::AddPartitions { request, reply } => {
                let response = admin::add_partitions(coordinator, request).await;
                self.announce().await;
                let _ = reply.send(response);
            }
            ControlMessage::AlterTopicConfig { request, reply } => {
                let response = admin::alter_topic_config(
                    coordinator,
                    request,
                    self.config.remote_storage.is_some(),
                )
                .await;
                self.announce().await;
                let _ = reply.send(response);
            }
            ControlMessage::ElectLeaders { request, reply } => {
                let response = admin::elect_leaders(coordinator, request).await;
                if response.moved > 0 {
                    self.announce().await;
                }
                let _ = reply.send(response);
            }
            ControlMessage::UpdatePartition {
                topic,
                expected,
                change,
                reply,
            } => {
                let stored = admin::update_partition(coordinator, &topic, &expected, &change).await;
                if stored.is_some() {
                    self.announce().await;
                }
                let _ = reply.send(stored);
            }
            ControlMessage::Settings { change, reply } => {
                let changed = admin::change_settings(coordinator, change).await;
                self.announce().await;
                let _ = reply.send(changed);
            }
            ControlMessage::Leave { reply } => {
                if let Err(error) = coordinator.leave().await {
                    tracing::warn!("leaving the cluster: {error}");
                }
                tracing::info!(
                    node = self.config.node_id,
                    "left the cluster: waiting for leaderships to move"
                );
                self.leave_reply = Some(reply);
                self.membership.handle_leave(self.config.clock.now());
            }
            ControlMessage::Shutdown { reply } => {
                if !self.membership.left()
                    && let Err(error) = coordinator.leave().await
                {
                    tracing::warn!("resigning from the cluster: {error}");
                }
                let _ = reply.send(());
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }

    /// A tick, or a change the watch reported: the election, then the state read if the
    /// membership asks for it.
    async fn handle_wake(&mut self, changed: bool) {
        let coordinator = &self.coordinator;
        let watching = self.watch.as_ref().is_some_and(|task| !task.is_finished());
        let wake = Wake {
            changed,
            watching,
            lease_valid: coordinator.lease_valid(),
        };
        let read_now = self.membership.poll_read(self.config.clock.now(), wake);
        if self.membership.campaigns()
            && !self
                .controller
                .tick(
                    coordinator,
                    &self.watch_sender,
                    read_now,
                    self.config.clock.now(),
                )
                .await
        {
            self.membership.handle_controller_failed();
        }
        if !read_now {
            return;
        }
        let read = view::read_view(coordinator, &self.config.security).await;
        if let Err(error) = &read {
            // A node that left gave up its lease on purpose: no alarm.
            if self.membership.left() {
                tracing::debug!("reading cluster state: {error}");
            } else {
                tracing::warn!("reading cluster state: {error}");
            }
        }
        let wake = Wake {
            lease_valid: coordinator.lease_valid(),
            ..wake
        };
        self.membership
            .handle_read(self.config.clock.now(), read.ok(), wake);
    }

    /// Does what the membership asked for, in order, until it asks nothing more.
    async fn carry_out_steps(&mut self) {
        let (coordinator, config) = (&self.coordinator, self.config);
        while let Some(step) = self.membership.poll_step() {
            match step {
                Step::Announce(view) => send_view(&self.audience, view).await,
                Step::Watch(revision) => {
                    let watching = coordinator.watch_changes(revision, self.watch_sender.clone());
                    self.watch = Some(tokio::spawn(watching));
                }
                Step::RegisterAgain => match register_again(coordinator, config).await {
                    Ok(()) => tracing::warn!(
                        node = config.node_id,
                        "registered again: this broker had dropped out of the cluster"
                    ),
                    Err(error) => tracing::debug!("registering again: {error}"),
                },
                Step::Rejoin => match rejoin(coordinator, config).await {
                    Ok(()) => tracing::warn!(
                        node = config.node_id,
                        "rejoined the cluster on a new etcd lease"
                    ),
                    Err(error) => tracing::warn!("rejoining the cluster: {error}"),
                },
                Step::CheckHandOff => {
                    let nothing_left = view::nothing_to_hand_off(coordinator).await;
                    self.membership
                        .handle_hand_off(self.config.clock.now(), nothing_left);
                }
                Step::AnswerLeave => {
                    if let Some(reply) = self.leave_reply.take() {
                        let _ = reply.send(());
                    }
                }
            }
        }
    }

    /// Sends the current cluster state to every shard and waits until each has opened or
    /// closed its partitions to match, so a client that saw CreateTopic succeed can produce at
    /// once.
    async fn announce(&mut self) {
        match view::read_view(&self.coordinator, &self.config.security).await {
            Ok((view, _)) => {
                send_view(&self.audience, view.clone()).await;
                self.membership.handle_announced(view);
            }
            Err(error) => tracing::error!("reading cluster state failed: {error}"),
        }
    }
}

/// Registers this broker. A crashed predecessor's registration lives until its lease runs out:
/// the id is taken by another live process only if it is still registered after that long.
async fn register(
    coordinator: &impl Coordinator,
    config: &NodeConfig,
) -> Result<(), CoordinatorError> {
    let patience = config.lease_ttl + Duration::from_secs(2);
    let started = config.clock.now();
    loop {
        match coordinator.register_broker(config.broker_info()).await {
            Err(CoordinatorError::BrokerIdTaken(id))
                if config.clock.now().saturating_duration_since(started) < patience =>
            {
                tracing::info!(
                    "broker id {id} is still registered (a previous run's lease?); waiting for it to expire"
                );
                config.clock.sleep(Duration::from_millis(250)).await;
            }
            result => return result,
        }
    }
}

/// Back into the cluster after the lease lapsed (paused, cut off, or etcd was down past the
/// TTL): a new lease, the registration again, and, as after a restart, the next epoch for any
/// partition still naming this node leader (it led nothing meanwhile, but the rule that no
/// leadership spans a lapse keeps the reasoning the same as for a restart).
async fn rejoin(
    coordinator: &impl Coordinator,
    config: &NodeConfig,
) -> Result<(), CoordinatorError> {
    coordinator.renew_lease().await?;
    register_again(coordinator, config).await
}

/// The registration on the current lease, and the next epoch for any partition still naming
/// this node leader (no leadership spans a time out of the cluster).
async fn register_again(
    coordinator: &impl Coordinator,
    config: &NodeConfig,
) -> Result<(), CoordinatorError> {
    coordinator.register_broker(config.broker_info()).await?;
    coordinator.take_next_epochs().await;
    Ok(())
}

async fn send_view(audience: &Audience, view: ClusterView) {
    audience.views.send_replace(view.clone());
    let mut acks = Vec::new();
    for shard in audience.shards.iter() {
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
