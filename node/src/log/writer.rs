//! Group commit: one task owns a [`PartitionLog`]; appends arrive as messages and share syncs.
//!
//! The task takes every command that is waiting, writes all the appends among them, then (with
//! `flush = always`) issues ONE `fdatasync` for all of them before answering. While that sync
//! runs, new appends queue up and form the next group, so the number of syncs per second stays
//! at what the disk can do while throughput grows with the number of concurrent producers.
//! With `interval`, appends are answered once written and a sync runs when the interval is due;
//! with `never`, once written.
//!
//! Runs on one shard's single-threaded runtime: the channels and the task are local to the shard.

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};

use super::{AppendInfo, FlushPolicy, LogError, PartitionLog, RetentionReport};
use crate::io::Storage;

/// Milliseconds since the Unix epoch; a parameter so tests can run on virtual time.
pub type Clock = fn() -> i64;

pub fn system_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

/// The most commands taken into one group; bounds the latency one group can add.
const GROUP_COMMANDS_MAX: usize = 1024;

enum Command {
    Append {
        batches: BytesMut,
        leader_epoch: u32,
        reply: oneshot::Sender<Result<AppendInfo, LogError>>,
    },
    Read {
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
        reply: oneshot::Sender<Result<Bytes, LogError>>,
    },
    Retention {
        reply: oneshot::Sender<Result<RetentionReport, LogError>>,
    },
    Offsets {
        reply: oneshot::Sender<LogOffsets>,
    },
    Close {
        reply: oneshot::Sender<Result<(), LogError>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    pub log_start: u64,
    pub log_end: u64,
    pub durable: u64,
}

/// Cheap handle to a log task; clone it for each producer.
#[derive(Clone)]
pub struct LogHandle {
    commands: mpsc::UnboundedSender<Command>,
}

fn stopped() -> LogError {
    LogError::Failed {
        dir: Default::default(),
        reason: "the log task has stopped".into(),
    }
}

impl LogHandle {
    /// Appends and resolves when the batches are as durable as the flush policy promises.
    pub async fn append(
        &self,
        batches: BytesMut,
        leader_epoch: u32,
    ) -> Result<AppendInfo, LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Append {
                batches,
                leader_epoch,
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    pub async fn read(
        &self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Bytes, LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Read {
                offset,
                max_bytes,
                max_offset,
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    pub async fn enforce_retention(&self) -> Result<RetentionReport, LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Retention { reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    pub async fn offsets(&self) -> Result<LogOffsets, LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Offsets { reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }

    /// Flushes and closes the log; later calls fail.
    pub async fn close(&self) -> Result<(), LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Close { reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Starts the task that owns `log` on the current (shard-local) runtime.
pub fn spawn<S: Storage>(log: PartitionLog<S>, clock: Clock) -> LogHandle {
    let (commands, receiver) = mpsc::unbounded_channel();
    tokio::task::spawn_local(run(log, receiver, clock));
    LogHandle { commands }
}

async fn run<S: Storage>(
    mut log: PartitionLog<S>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    clock: Clock,
) {
    let mut group = Vec::with_capacity(64);
    let mut waiting_for_sync: Vec<(oneshot::Sender<Result<AppendInfo, LogError>>, AppendInfo)> =
        Vec::with_capacity(64);
    loop {
        let first = match log.config().flush {
            FlushPolicy::Interval { interval_ms }
                if log.durable_offset() < log.log_end_offset() =>
            {
                let wait = std::time::Duration::from_millis(interval_ms);
                match tokio::time::timeout(wait, commands.recv()).await {
                    Ok(command) => command,
                    Err(_elapsed) => {
                        if let Err(error) = log.flush(clock()).await {
                            tracing::error!("interval flush failed: {error}");
                        }
                        continue;
                    }
                }
            }
            _ => commands.recv().await,
        };
        let Some(first) = first else {
            // Every handle is gone: shut down cleanly.
            let _ = log.close(clock()).await;
            return;
        };
        group.push(first);
        while group.len() < GROUP_COMMANDS_MAX {
            match commands.try_recv() {
                Ok(command) => group.push(command),
                Err(_) => break,
            }
        }
        let mut close = None;
        for command in group.drain(..) {
            match command {
                Command::Append {
                    batches,
                    leader_epoch,
                    reply,
                } => match log.append(batches, leader_epoch, clock()).await {
                    Ok(info) if log.config().flush == FlushPolicy::Always => {
                        waiting_for_sync.push((reply, info));
                    }
                    result => {
                        let _ = reply.send(result);
                    }
                },
                Command::Read {
                    offset,
                    max_bytes,
                    max_offset,
                    reply,
                } => {
                    let _ = reply.send(log.read(offset, max_bytes, max_offset).await);
                }
                Command::Retention { reply } => {
                    let _ = reply.send(log.enforce_retention(clock()).await);
                }
                Command::Offsets { reply } => {
                    let _ = reply.send(LogOffsets {
                        log_start: log.log_start_offset(),
                        log_end: log.log_end_offset(),
                        durable: log.durable_offset(),
                    });
                }
                Command::Close { reply } => close = Some(reply),
            }
        }
        if !waiting_for_sync.is_empty() {
            let synced = log.flush(clock()).await;
            for (reply, info) in waiting_for_sync.drain(..) {
                let _ = reply.send(match &synced {
                    Ok(_) => Ok(info),
                    Err(error) => Err(LogError::Failed {
                        dir: log.dir().to_path_buf(),
                        reason: error.to_string(),
                    }),
                });
            }
        } else if log.flush_due(clock())
            && let Err(error) = log.flush(clock()).await
        {
            tracing::error!("flush failed: {error}");
        }
        if let Some(reply) = close {
            let _ = reply.send(log.close(clock()).await);
            // Answer whatever raced in after the close.
            commands.close();
            while let Some(command) = commands.recv().await {
                if let Command::Append { reply, .. } = command {
                    let _ = reply.send(Err(stopped()));
                }
            }
            return;
        }
    }
}
