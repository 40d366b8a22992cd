//! What the admin APIs read from partitions and shards: a partition's leader epochs,
//! producers and size, wherever on this node its replica is. Work for another shard goes over
//! its mailbox as a closure ([`ShardMessage::Run`]) and runs on that shard's thread, so no
//! state is shared; the answer comes back over a channel.

use std::future::Future;
use std::rc::Rc;

use strata_wire::protocol::{
    DeleteRecordsRequest, DeleteRecordsResponse, DeletedRecordsPartition, DeletedRecordsTopic,
    ErrorCode,
};
use tokio::sync::oneshot;

use super::Shard;
use super::replica::Role;
use crate::log::writer::LogSummary;
use crate::server::messages::ShardMessage;

/// One replica on this node, as DescribeLogDirs lists it.
#[derive(Debug, Clone)]
pub struct ReplicaSize {
    pub topic: String,
    pub partition: u32,
    pub size_bytes: u64,
    /// How far its log end is behind its leader's high watermark as this replica knows it
    /// (0 for a leader): Kafka's `offset_lag`.
    pub offset_lag: u64,
}

impl Shard {
    /// Runs `work` on shard `owner` of this node (this one, or another through its mailbox).
    /// `None` when that shard is gone (shutting down).
    pub(crate) async fn run_on<T, F, Fut>(self: &Rc<Self>, owner: usize, work: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        if owner == self.context.index {
            return Some(work(self.clone()).await);
        }
        let (reply, answer) = oneshot::channel();
        let message = ShardMessage::Run(Box::new(move |shard: Rc<dyn std::any::Any>| {
            let shard = shard
                .downcast::<Shard>()
                .expect("a shard runs its mailbox's work");
            tokio::task::spawn_local(async move {
                let _ = reply.send(work(shard).await);
            });
        }));
        if !self.forward(owner, message) {
            return None;
        }
        answer.await.ok()
    }

    /// Runs `work` on every shard of this node, in shard order.
    pub(crate) async fn run_on_every_shard<T, F, Fut>(self: &Rc<Self>, work: F) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(Rc<Shard>) -> Fut + Send + Clone + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let mut answers = Vec::new();
        for owner in 0..self.context.config.shards {
            if let Some(answer) = self.run_on(owner, work.clone()).await {
                answers.push(answer);
            }
        }
        answers
    }

    /// The summary of `topic`-`partition`'s log where this node leads it, with the leader's
    /// epoch: NOT_LEADER elsewhere, UNKNOWN_TOPIC for a topic it does not know.
    pub(crate) async fn leader_summary(
        self: &Rc<Self>,
        topic: &str,
        partition: u32,
    ) -> Result<(LogSummary, u32), ErrorCode> {
        let owner = self.route(topic, partition)?;
        let topic = topic.to_string();
        self.run_on(owner, move |shard| async move {
            let (log, epoch) = {
                let partitions = shard.partitions.borrow();
                let Some(replica) = partitions.get(&(topic, partition)) else {
                    return Err(ErrorCode::NotLeader);
                };
                let Role::Leader(leader) = &replica.role else {
                    return Err(ErrorCode::NotLeader);
                };
                (replica.log.clone(), leader.epoch())
            };
            let summary = log.summary().await.map_err(|_| ErrorCode::StorageError)?;
            Ok((summary, epoch))
        })
        .await
        .unwrap_or(Err(ErrorCode::NotReady))
    }

    /// Kafka's DeleteRecords on the partitions this node leads: each log start moves up to the
    /// offset asked (-1: the high watermark; past it, OffsetOutOfRange) and the answer is the
    /// new log start once every in-sync replica's is there (Kafka's low watermark): followers
    /// move theirs on the fetch that carries it and report it on the next, so a leader lost
    /// after the answer leaves no replica that serves the deleted records.
    pub(crate) async fn delete_records(
        self: &Rc<Self>,
        request: DeleteRecordsRequest,
    ) -> DeleteRecordsResponse {
        let mut topics = Vec::new();
        for topic in request.topics {
            let mut partitions = Vec::new();
            for asked in topic.partitions {
                let index = asked.partition;
                let answer = match self.route(&topic.name, index) {
                    Err(error) => Err(error),
                    Ok(owner) => {
                        let name = topic.name.clone();
                        self.run_on(owner, move |shard| async move {
                            shard.delete_records_local(&name, index, asked.offset).await
                        })
                        .await
                        .unwrap_or(Err(ErrorCode::NotReady))
                    }
                };
                partitions.push(match answer {
                    Ok(log_start) => DeletedRecordsPartition {
                        partition: index,
                        error: ErrorCode::None,
                        log_start_offset: log_start as i64,
                    },
                    Err(error) => DeletedRecordsPartition {
                        partition: index,
                        error,
                        log_start_offset: -1,
                    },
                });
            }
            topics.push(DeletedRecordsTopic {
                name: topic.name,
                partitions,
            });
        }
        DeleteRecordsResponse { topics }
    }

    async fn delete_records_local(
        &self,
        topic: &str,
        partition: u32,
        offset: i64,
    ) -> Result<u64, ErrorCode> {
        let Some((log, high_watermark, _)) = self.leader_view(topic, partition) else {
            return Err(ErrorCode::NotLeader);
        };
        if !self.high_watermark_settled(topic, partition) {
            return Err(ErrorCode::OffsetNotAvailable);
        }
        let offset = match offset {
            -1 => high_watermark,
            offset => match u64::try_from(offset) {
                Ok(offset) if offset <= high_watermark => offset,
                _ => return Err(ErrorCode::OffsetOutOfRange),
            },
        };
        let tiered = self.remote_delete_records(topic, partition, offset).await?;
        let log_start = log
            .delete_records_before(offset)
            .await
            .map_err(|error| super::log_error_code(&error))?;
        self.wait_for_in_sync_log_start(topic, partition, log_start)
            .await?;
        // Below the local start, the remote tier's start answers.
        Ok(if tiered {
            self.remote_start(topic, partition)?
                .unwrap_or(log_start)
                .min(log_start)
        } else {
            log_start
        })
    }

    /// Until every in-sync follower of a partition this node leads reports its log start at
    /// `log_start` or beyond; a follower that does not leaves the ISR after the lag time.
    async fn wait_for_in_sync_log_start(
        &self,
        topic: &str,
        partition: u32,
        log_start: u64,
    ) -> Result<(), ErrorCode> {
        const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
        let key = (topic.to_string(), partition);
        let clock = self.clock();
        let deadline = clock.now() + PATIENCE;
        loop {
            let low_watermark = match self.partitions.borrow().get(&key).map(|p| &p.role) {
                Some(Role::Leader(leader)) => leader.in_sync_log_start(log_start),
                _ => return Err(ErrorCode::NotLeader),
            };
            if low_watermark >= log_start {
                return Ok(());
            }
            if clock.now() >= deadline {
                return Err(ErrorCode::RequestTimedOut);
            }
            clock.sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Every replica this node holds, led or followed, with its size on disk.
    pub(crate) async fn replica_sizes(self: &Rc<Self>) -> Vec<ReplicaSize> {
        let per_shard = self
            .run_on_every_shard(|shard| async move {
                let replicas: Vec<_> = shard
                    .partitions
                    .borrow()
                    .iter()
                    .map(|((topic, partition), replica)| {
                        let high_watermark = match &replica.role {
                            Role::Leader(_) | Role::Idle => None,
                            Role::Follower { high_watermark, .. } => Some(high_watermark.get()),
                        };
                        (
                            topic.clone(),
                            *partition,
                            replica.log.clone(),
                            high_watermark,
                        )
                    })
                    .collect();
                let mut sizes = Vec::with_capacity(replicas.len());
                for (topic, partition, log, high_watermark) in replicas {
                    let Ok(summary) = log.summary().await else {
                        continue;
                    };
                    let offset_lag =
                        high_watermark.map_or(0, |hw| hw.saturating_sub(summary.offsets.log_end));
                    sizes.push(ReplicaSize {
                        topic,
                        partition,
                        size_bytes: summary.size_bytes,
                        offset_lag,
                    });
                }
                sizes
            })
            .await;
        per_shard.into_iter().flatten().collect()
    }
}
