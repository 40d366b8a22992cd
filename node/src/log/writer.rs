//! Group commit: one task owns a [`PartitionLog`]; appends arrive as messages and share syncs.
//!
//! The task takes every command that is waiting and writes all the appends among them. With
//! `flush = always` it then starts ONE `fdatasync` for all of them and answers them when it
//! completes. The sync runs without borrowing the log, so while the disk works the task keeps
//! writing the next group, which the next sync covers: one sync in flight, one group filling.
//! The number of syncs per second stays at what the disk can do while throughput grows with
//! the number of concurrent producers.
//! With `interval`, appends are answered once written and a sync runs when the interval is due;
//! with `never`, once written. A retried idempotent batch (`AppendInfo::duplicate`) is answered
//! no earlier than its original: at once if that is durable, else with the next sync.
//!
//! Runs on one shard's single-threaded runtime: the channels and the task are local to the shard.

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use super::cleaner::{CleanOutcome, OffsetMap, clean};
use super::group_commit::{GroupCommit, SyncStart};
use super::shared_sync::SharedSync;
use super::transactions::{AbortedTxn, OpenTxn};
use super::{
    AppendInfo, AppendSource, CompactionStatus, FlushOutcome, FlushPolicy, LogConfig, LogError,
    PartitionLog, PlacedBatches, PlannedRead, PlannedSend, RetentionReport, Served, SwapReport,
};
use crate::clock::Clock;
use crate::io::Storage;
use crate::replication::RecoveryThrottle;
use crate::replication::{self, Divergence};

/// The most commands taken into one group; bounds the latency one group can add.
const GROUP_COMMANDS_MAX: usize = 1024;

/// What tiered storage asks of, or tells, the log.
enum TieringCommand {
    /// The next closed segment for the remote tier (see [`PartitionLog::next_upload`]).
    NextUpload {
        from_offset: u64,
        below_offset: u64,
        reply: oneshot::Sender<(Option<super::SegmentUpload>, super::UploadBacklog)>,
    },
    /// The remote tier holds every record below `offset`.
    RemoteCopied { offset: u64 },
}

impl TieringCommand {
    fn run<S: Storage>(self, log: &mut PartitionLog<S>) {
        match self {
            TieringCommand::NextUpload {
                from_offset,
                below_offset,
                reply,
            } => {
                let next = log.next_upload(from_offset, below_offset);
                let _ = reply.send((next, log.upload_backlog(from_offset)));
            }
            TieringCommand::RemoteCopied { offset } => log.set_remote_copied(offset),
        }
    }
}

enum Command {
    Append {
        batches: BytesMut,
        leader_epoch: u32,
        source: AppendSource,
        answer: AnswerWhen,
        reply: oneshot::Sender<Result<AppendInfo, LogError>>,
    },
    /// Batches a leader stamped (the follower path), appended verbatim.
    AppendReplicated {
        batches: ReplicatedBatches,
        reply: oneshot::Sender<Result<AppendInfo, LogError>>,
    },
    ReplicaInfo {
        reply: oneshot::Sender<ReplicaInfo>,
    },
    /// What the admin APIs read of a log.
    Summary {
        reply: oneshot::Sender<LogSummary>,
    },
    /// The leader side of a follower fetch: does the follower's log diverge from this one?
    Diverging {
        fetch_offset: u64,
        last_fetched_epoch: Option<u32>,
        reply: oneshot::Sender<(Option<Divergence>, LogOffsets)>,
    },
    /// The follower side: cut the log where the leader said it diverges.
    TruncateDiverged {
        divergence: Divergence,
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    RestartAt {
        offset: u64,
        below: super::StateBelow,
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    CheckpointHighWatermark {
        high_watermark: u64,
    },
    /// New settings (a topic's config was altered); they apply from the next append on.
    Reconfigure {
        config: LogConfig,
    },
    /// Syncs everything written so far (whatever the policy); answers the durable end.
    Sync {
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    Read {
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
        reply: oneshot::Sender<Result<Bytes, LogError>>,
    },
    ReadForSending {
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
        reply: oneshot::Sender<Result<super::Served, LogError>>,
    },
    Retention {
        below_offset: u64,
        reply: oneshot::Sender<Result<RetentionReport, LogError>>,
    },
    Offsets {
        reply: oneshot::Sender<LogOffsets>,
    },
    /// Tiered storage's questions and news.
    Tiering(TieringCommand),
    /// The aborted transactions with records in `[from, to)` (a `read_committed` fetch).
    AbortedTxns {
        from: u64,
        to: u64,
        reply: oneshot::Sender<Vec<AbortedTxn>>,
    },
    /// Plans a clean of a compacted log and runs it beside the log's other work.
    Clean {
        below_offset: u64,
        resources: CleanerResources,
        reply: CleanReply,
    },
    /// Swaps in what a clean started by [`Command::Clean`] wrote.
    FinishClean {
        outcome: CleanOutcome,
        resources: CleanerResources,
        /// Where the clean stopped (for the state reported after it).
        below_offset: u64,
        reply: CleanReply,
    },
    /// A follower's read: what `Read` and `Offsets` answer together, parked until the log
    /// holds something past `offset` when `wait` is set (answered by the log task right after
    /// the append that brings it, with no trip back through the fetching task).
    ReadForFollower {
        read: ParkedRead,
        wait: bool,
    },
    OffsetForTimestamp {
        timestamp_ms: i64,
        reply: oneshot::Sender<Result<Option<(u64, i64)>, LogError>>,
    },
    OffsetOfMaxTimestamp {
        reply: oneshot::Sender<Result<Option<(u64, i64)>, LogError>>,
    },
    DeleteRecordsBefore {
        offset: u64,
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    Close {
        reply: oneshot::Sender<Result<(), LogError>>,
    },
}

type CleanReply = oneshot::Sender<CleanAnswer>;

/// What [`LogHandle::clean`] answers: the resources lent, the swap's report if a clean ran,
/// and the log's compaction state after it.
pub struct CleanAnswer {
    pub resources: CleanerResources,
    pub report: Option<Result<SwapReport, LogError>>,
    pub status: CompactionStatus,
}

/// What a shard lends each clean it runs: one key map and one IO limit for all its logs.
pub struct CleanerResources {
    pub map: OffsetMap,
    pub throttle: Option<RecoveryThrottle>,
}

/// What the admin APIs read of a log (Kafka's OffsetForLeaderEpoch, DescribeLogDirs,
/// DescribeProducers, ListOffsets' epochs): a copy, taken between two of the log's commands.
#[derive(Debug, Clone)]
pub struct LogSummary {
    pub offsets: LogOffsets,
    pub size_bytes: u64,
    pub epochs: crate::replication::EpochCache,
    /// Each idempotent producer's id, epoch, last sequence and last timestamp.
    pub producers: Vec<ProducerSummary>,
    /// The open transactions, by producer id.
    pub open_transactions: std::collections::BTreeMap<i64, OpenTxn>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp_ms: i64,
}

/// What a replica needs to know about its log to fetch or to lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub offsets: LogOffsets,
    pub latest_epoch: Option<u32>,
    pub high_watermark_checkpoint: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    pub log_start: u64,
    pub log_end: u64,
    pub durable: u64,
    /// The first offset the cleaner has not cleaned (the log start where it never has).
    pub clean: u64,
    /// The first record of the first transaction still open (the log end with none open):
    /// the last stable offset is this or the high watermark, whichever is lower.
    pub first_unstable: u64,
}

impl LogOffsets {
    /// Where `read_committed` reads stop: below every open transaction, and the high
    /// watermark.
    pub fn last_stable(&self, high_watermark: u64) -> u64 {
        self.first_unstable.min(high_watermark)
    }
}

/// What the log task publishes after each command, for its shard to read without asking.
#[derive(Debug, Default)]
struct Published {
    /// [`PartitionLog::direct_phase`].
    direct_phase: Cell<Option<usize>>,
    /// [`PartitionLog::durable_offset`].
    durable: Cell<u64>,
    /// [`PartitionLog::log_start_offset`].
    log_start: Cell<u64>,
    transactions: Cell<OpenTransactions>,
}

impl Published {
    fn of<S: Storage>(log: &PartitionLog<S>) -> Published {
        let published = Published::default();
        published.update(log);
        published
    }

    fn update<S: Storage>(&self, log: &PartitionLog<S>) {
        self.direct_phase.set(log.direct_phase());
        self.durable.set(log.durable_offset());
        self.log_start.set(log.log_start_offset());
        let transactions = log.producers().transactions();
        self.transactions.set(OpenTransactions {
            count: transactions.open().len(),
            oldest_started_ms: transactions.oldest_open().map(|(_, open)| open.started_ms),
            aborted: transactions.aborted().len(),
        });
    }
}

/// A partition's open transactions, for metrics: how many, and when the oldest began (a
/// stuck one holds every `read_committed` consumer of the partition back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenTransactions {
    pub count: usize,
    pub oldest_started_ms: Option<i64>,
    /// Aborted transactions the log still holds records of.
    pub aborted: usize,
}

/// When an append is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerWhen {
    /// Once it is as durable as the log's flush policy promises (written, with `interval` or
    /// `never`; synced, with `always`).
    FlushPolicy,
    /// Once a sync covers it, whatever the flush policy: it joins the next group-commit sync.
    Synced,
}

/// Cheap handle to a log task; clone it for each producer.
#[derive(Clone)]
pub struct LogHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// What the log task published after its last command.
    published: Rc<Published>,
}

/// Replicated batches as the follower received them: anywhere, or in place for a direct write.
pub enum ReplicatedBatches {
    Bytes(Bytes),
    Placed(PlacedBatches),
}

impl ReplicatedBatches {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReplicatedBatches::Bytes(bytes) => bytes,
            ReplicatedBatches::Placed(placed) => placed.batches(),
        }
    }
}

fn stopped() -> LogError {
    LogError::Failed {
        dir: Default::default(),
        reason: "the log task has stopped".into(),
    }
}

impl LogHandle {
    /// Sends the log task the command `make` builds around a reply channel, and waits for the
    /// reply.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, LogError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(make(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }

    /// Appends and resolves when the batches are as durable as the flush policy promises.
    pub async fn append(
        &self,
        batches: BytesMut,
        leader_epoch: u32,
    ) -> Result<AppendInfo, LogError> {
        self.append_from(
            batches,
            leader_epoch,
            AppendSource::Producer,
            AnswerWhen::FlushPolicy,
        )
        .await
    }

    /// Appends `source`'s batches, grouped with the other appends, and resolves when `answer`
    /// says: a producer's records; a conditional append, written only if the log ends at its
    /// expected offset when its turn comes ([`LogError::LogEndMismatch`] otherwise, nothing
    /// written); or a transaction marker ([`strata_wire::batch::marker`]) this broker built
    /// as the partition's leader, refused if its producer epoch is fenced.
    pub async fn append_from(
        &self,
        batches: BytesMut,
        leader_epoch: u32,
        source: AppendSource,
        answer: AnswerWhen,
    ) -> Result<AppendInfo, LogError> {
        self.ask(|reply| Command::Append {
            batches,
            leader_epoch,
            source,
            answer,
            reply,
        })
        .await?
    }

    /// Appends batches stamped by the leader, verbatim; resolves when they are as durable as the
    /// flush policy promises.
    pub async fn append_replicated(
        &self,
        batches: ReplicatedBatches,
    ) -> Result<AppendInfo, LogError> {
        self.ask(|reply| Command::AppendReplicated { batches, reply })
            .await?
    }

    /// Where the next replicated batches should start within a block to be written direct
    /// without a copy ([`PartitionLog::direct_phase`]), as of the log task's last command.
    pub fn direct_phase(&self) -> Option<usize> {
        self.published.direct_phase.get()
    }

    /// The partition's open transactions, as of the log task's last command.
    /// Everything below this offset is synced to disk, as of the log task's last command or
    /// sync.
    pub fn synced_offset(&self) -> u64 {
        self.published.durable.get()
    }

    /// The log's first offset, as of the log task's last command.
    pub fn log_start_offset(&self) -> u64 {
        self.published.log_start.get()
    }

    pub fn open_transactions(&self) -> OpenTransactions {
        self.published.transactions.get()
    }

    pub async fn replica_info(&self) -> Result<ReplicaInfo, LogError> {
        self.ask(|reply| Command::ReplicaInfo { reply }).await
    }

    pub async fn summary(&self) -> Result<LogSummary, LogError> {
        self.ask(|reply| Command::Summary { reply }).await
    }

    pub async fn diverging(
        &self,
        fetch_offset: u64,
        last_fetched_epoch: Option<u32>,
    ) -> Result<(Option<Divergence>, LogOffsets), LogError> {
        self.ask(|reply| Command::Diverging {
            fetch_offset,
            last_fetched_epoch,
            reply,
        })
        .await
    }

    /// Truncates where the leader's answer says this log diverges; returns the new log end.
    pub async fn truncate_diverged(&self, divergence: Divergence) -> Result<u64, LogError> {
        self.ask(|reply| Command::TruncateDiverged { divergence, reply })
            .await?
    }

    /// Empties the log and starts it at `offset`, with the producer state and epochs of
    /// `below`.
    pub async fn restart_at(&self, offset: u64, below: super::StateBelow) -> Result<u64, LogError> {
        self.ask(|reply| Command::RestartAt {
            offset,
            below,
            reply,
        })
        .await?
    }

    /// Makes everything written so far durable; returns the durable end.
    pub async fn sync(&self) -> Result<u64, LogError> {
        self.ask(|reply| Command::Sync { reply }).await?
    }

    pub fn checkpoint_high_watermark(&self, high_watermark: u64) {
        let _ = self
            .commands
            .send(Command::CheckpointHighWatermark { high_watermark });
    }

    /// Applies new settings once the appends already taken are written (a policy change never
    /// splits a group of appends).
    pub fn reconfigure(&self, config: LogConfig) {
        let _ = self.commands.send(Command::Reconfigure { config });
    }

    pub async fn read(
        &self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Bytes, LogError> {
        self.ask(|reply| Command::Read {
            offset,
            max_bytes,
            max_offset,
            reply,
        })
        .await?
    }

    /// See [`PartitionLog::read_for_sending`].
    pub async fn read_for_sending(
        &self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<super::Served, LogError> {
        self.ask(|reply| Command::ReadForSending {
            offset,
            max_bytes,
            max_offset,
            reply,
        })
        .await?
    }

    /// The aborted transactions with records in `[from, to)`, for a `read_committed` fetch.
    pub async fn aborted_transactions(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<AbortedTxn>, LogError> {
        if self.published.transactions.get().aborted == 0 {
            // No trip to the log task for the logs (most) that never saw an abort.
            return Ok(Vec::new());
        }
        self.ask(|reply| Command::AbortedTxns { from, to, reply })
            .await
    }

    /// See [`PartitionLog::next_upload`]; with what waits for upload past `from_offset`.
    pub async fn next_upload(
        &self,
        from_offset: u64,
        below_offset: u64,
    ) -> Result<(Option<super::SegmentUpload>, super::UploadBacklog), LogError> {
        self.ask(|reply| {
            Command::Tiering(TieringCommand::NextUpload {
                from_offset,
                below_offset,
                reply,
            })
        })
        .await
    }

    /// See [`PartitionLog::set_remote_copied`].
    pub fn set_remote_copied(&self, offset: u64) {
        let _ = self
            .commands
            .send(Command::Tiering(TieringCommand::RemoteCopied { offset }));
    }

    /// See [`PartitionLog::enforce_retention`].
    pub async fn enforce_retention(&self, below_offset: u64) -> Result<RetentionReport, LogError> {
        self.ask(|reply| Command::Retention {
            below_offset,
            reply,
        })
        .await?
    }

    /// Cleans the log if it is compacted and due, below `below_offset` (the high watermark):
    /// the reading and writing run beside the log's appends and reads, only the plan and the
    /// swap in the log's task. Hands `resources` back, with the swap's report if a clean ran.
    pub async fn clean(
        &self,
        below_offset: u64,
        resources: CleanerResources,
    ) -> Result<CleanAnswer, LogError> {
        self.ask(|reply| Command::Clean {
            below_offset,
            resources,
            reply,
        })
        .await
    }

    pub async fn offsets(&self) -> Result<LogOffsets, LogError> {
        self.ask(|reply| Command::Offsets { reply }).await
    }

    /// The stored batches from `offset` (as [`LogHandle::read`] with no upper bound) and the
    /// log's offsets at that moment, in one trip to the log task. With `wait`, answers once
    /// the log holds something past `offset` (a caught-up follower's long-poll); dropping the
    /// future withdraws the wait.
    pub async fn read_for_follower(
        &self,
        offset: u64,
        max_bytes: usize,
        wait: bool,
    ) -> Result<(Bytes, LogOffsets), LogError> {
        self.ask(|reply| Command::ReadForFollower {
            read: ParkedRead {
                offset,
                max_bytes,
                reply,
            },
            wait,
        })
        .await?
    }

    pub async fn offset_for_timestamp(
        &self,
        timestamp_ms: i64,
    ) -> Result<Option<(u64, i64)>, LogError> {
        self.ask(|reply| Command::OffsetForTimestamp {
            timestamp_ms,
            reply,
        })
        .await?
    }

    /// Moves the log start up to `offset` (see [`PartitionLog::delete_records_before`]);
    /// returns the log start.
    pub async fn delete_records_before(&self, offset: u64) -> Result<u64, LogError> {
        self.ask(|reply| Command::DeleteRecordsBefore { offset, reply })
            .await?
    }

    /// The record with the largest timestamp, as (offset, timestamp).
    pub async fn offset_of_max_timestamp(&self) -> Result<Option<(u64, i64)>, LogError> {
        self.ask(|reply| Command::OffsetOfMaxTimestamp { reply })
            .await?
    }

    /// Flushes and closes the log; later calls fail.
    pub async fn close(&self) -> Result<(), LogError> {
        self.ask(|reply| Command::Close { reply }).await?
    }
}

/// How a log task groups its IO: from `strata iotune`'s io-properties, or the defaults.
#[derive(Clone, Debug)]
pub struct WriterTuning {
    /// A group takes appends until it holds this many bytes (at least one append): a burst
    /// becomes several groups, and the first one's sync overlaps the next one's write.
    pub group_bytes_max: usize,
    /// With `flush=always` and no sync running, how long written appends wait for more before
    /// their sync starts (more appends per sync on disks where a sync is slow).
    pub group_commit_window: std::time::Duration,
    /// Where each sync's duration (µs) is recorded (the shard's fsync histogram). Shard-local.
    pub sync_latency_us: Option<std::rc::Rc<std::cell::RefCell<hdrhistogram::Histogram<u64>>>>,
    /// Device writes (syncs) in flight on this shard, over all its logs (`None`: unbounded).
    /// Shard-local. Appends themselves land in the page cache and are not limited.
    pub device_writes: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    /// The shard's `syncfs` rounds, which `flush=interval` syncs join (`None`: each log syncs
    /// its own files). Shard-local.
    pub shared_sync: Option<Rc<SharedSync>>,
}

impl Default for WriterTuning {
    fn default() -> Self {
        WriterTuning {
            group_bytes_max: 64 << 20,
            group_commit_window: std::time::Duration::ZERO,
            sync_latency_us: None,
            device_writes: None,
            shared_sync: None,
        }
    }
}

/// Starts the task that owns `log` on the current (shard-local) runtime.
pub fn spawn<S: Storage>(log: PartitionLog<S>, clock: Clock) -> LogHandle {
    spawn_tuned(log, clock, WriterTuning::default())
}

/// [`spawn`] with explicit IO tuning.
pub fn spawn_tuned<S: Storage>(
    log: PartitionLog<S>,
    clock: Clock,
    tuning: WriterTuning,
) -> LogHandle {
    assert!(
        tuning.group_bytes_max > 0,
        "a group must be able to hold an append"
    );
    let (commands, receiver) = mpsc::unbounded_channel();
    let published = Rc::new(Published::of(&log));
    tokio::task::spawn_local(run(
        log,
        receiver,
        commands.downgrade(),
        clock,
        tuning,
        published.clone(),
    ));
    LogHandle {
        commands,
        published,
    }
}

type AppendReply = oneshot::Sender<Result<AppendInfo, LogError>>;

/// A follower's read waiting for the log to grow past `offset`.
struct ParkedRead {
    offset: u64,
    max_bytes: usize,
    reply: oneshot::Sender<Result<(Bytes, LogOffsets), LogError>>,
}

impl ParkedRead {
    /// Answers with the log's offsets as of now; a read from a file runs beside the appends (a
    /// follower catching up reads old segments, from the disk).
    async fn answer<S: Storage>(self, log: &mut PartitionLog<S>) {
        let offsets = offsets_of(log);
        let reply = self.reply;
        answer_read(
            log.plan_read(self.offset, self.max_bytes, u64::MAX).await,
            move |read| {
                let _ = reply.send(read.map(|bytes| (bytes, offsets)));
            },
        );
    }
}

/// Answers a planned read: at once when it needs no file IO, else from a task of its own, so
/// the log task goes on with appends while the read waits for the disk.
fn answer_read<F: crate::io::StorageFile>(
    planned: Result<PlannedRead<F>, LogError>,
    answer: impl FnOnce(Result<Bytes, LogError>) + 'static,
) {
    match planned {
        Ok(PlannedRead::File(read)) => {
            tokio::task::spawn_local(async move { answer(read.run().await) });
        }
        Ok(PlannedRead::Ready(bytes)) => answer(Ok(bytes)),
        Err(error) => answer(Err(error)),
    }
}

/// [`answer_read`] for a read to send: a file region or bytes at hand are answered at once.
fn answer_read_for_sending<F: crate::io::StorageFile>(
    planned: Result<PlannedSend<F>, LogError>,
    answer: impl FnOnce(Result<Served, LogError>) + 'static,
) {
    match planned {
        Ok(PlannedSend::File(read)) => {
            tokio::task::spawn_local(async move { answer(read.run().await.map(Served::Bytes)) });
        }
        Ok(PlannedSend::Region(region)) => answer(Ok(Served::Region(region))),
        Ok(PlannedSend::Ready(bytes)) => answer(Ok(Served::Bytes(bytes))),
        Err(error) => answer(Err(error)),
    }
}

type Waiter = (AppendReply, AppendInfo);

/// The sync on the disk, if one runs (its waiters are [`GroupCommit`]'s).
type SyncInFlight = Option<Pin<Box<dyn Future<Output = FlushOutcome>>>>;

/// The log task: takes commands in groups, writes appends, and runs the syncs
/// [`GroupCommit`] asks for. The policy (what waits for which sync, when one starts) is
/// `GroupCommit`'s; this task only dispatches.
async fn run<S: Storage>(
    log: PartitionLog<S>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    own_commands: mpsc::WeakUnboundedSender<Command>,
    clock: Clock,
    tuning: WriterTuning,
    published: Rc<Published>,
) {
    // Only for a log on the filesystem the rounds sync.
    let shared_sync = tuning
        .shared_sync
        .clone()
        .filter(|shared| shared.covers(log.dir()));
    let mut task = LogTask {
        own_commands,
        commit: GroupCommit::new(tuning.group_commit_window),
        log,
        clock,
        tuning,
        shared_sync,
        published,
        in_flight: None,
        parked_reads: Vec::new(),
        appends: Vec::with_capacity(64),
        append_replies: Vec::with_capacity(64),
        others: Vec::with_capacity(64),
    };
    let mut group = Vec::with_capacity(64);
    loop {
        // Appends, rolls and truncations all move it; reading it is a few loads.
        task.published.update(&task.log);
        let now = task.clock.now();
        task.poll_sync(now);
        let idle_flush_wait = task.poll_timeout(now);
        // Biased, in this order: a finished sync answers its waiters before new commands are
        // taken, and the same events are handled in the same order on every run (the
        // replication simulator replays a seed exactly).
        tokio::select! {
            biased;
            outcome = async {
                match task.in_flight.as_mut() {
                    Some(sync) => sync.as_mut().await,
                    None => std::future::pending().await,
                }
            } => task.on_synced(outcome).await,
            _ = async {
                match idle_flush_wait {
                    Some(wait) => task.clock.sleep(wait).await,
                    None => std::future::pending().await,
                }
            } => {}
            command = commands.recv() => {
                let Some(first) = command else {
                    // Every handle is gone: finish the sync in flight and shut down cleanly.
                    task.finish().await;
                    let _ = task.log.close(task.clock.wall_ms()).await;
                    return;
                };
                take_group(first, &mut commands, &mut group, task.tuning.group_bytes_max);
                if let Some(reply) = task.handle_group(&mut group).await {
                    task.finish().await;
                    let _ = reply.send(task.log.close(task.clock.wall_ms()).await);
                    refuse_the_rest(commands).await;
                    return;
                }
            }
        }
    }
}

/// Takes `first` and whatever else is waiting into `group`, up to [`GROUP_COMMANDS_MAX`]
/// commands and `bytes_max` of appends.
fn take_group(
    first: Command,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    group: &mut Vec<Command>,
    bytes_max: usize,
) {
    let append_bytes = |command: &Command| match command {
        Command::Append { batches, .. } => batches.len(),
        _ => 0,
    };
    let mut group_bytes = append_bytes(&first);
    group.push(first);
    while group.len() < GROUP_COMMANDS_MAX && group_bytes < bytes_max {
        match commands.try_recv() {
            Ok(command) => {
                group_bytes += append_bytes(&command);
                group.push(command);
            }
            Err(_) => break,
        }
    }
}

/// After a close: answers whatever raced in after it.
async fn refuse_the_rest(mut commands: mpsc::UnboundedReceiver<Command>) {
    commands.close();
    while let Some(command) = commands.recv().await {
        match command {
            Command::Append { reply, .. } | Command::AppendReplicated { reply, .. } => {
                let _ = reply.send(Err(stopped()));
            }
            _ => {}
        }
    }
}

/// What the log task owns: the log, its group commit and the sync on the disk.
struct LogTask<S: Storage> {
    log: PartitionLog<S>,
    /// The task's own mailbox, for a clean running beside it to hand its outcome back; weak,
    /// so the task still ends when every handle is dropped.
    own_commands: mpsc::WeakUnboundedSender<Command>,
    commit: GroupCommit<Waiter>,
    clock: Clock,
    tuning: WriterTuning,
    /// The shard's `syncfs` rounds, if they cover this log.
    shared_sync: Option<Rc<SharedSync>>,
    published: Rc<Published>,
    in_flight: SyncInFlight,
    parked_reads: Vec<ParkedRead>,
    /// A group's appends and their replies, reused from group to group.
    appends: Vec<(BytesMut, u32, AppendSource)>,
    append_replies: Vec<(AppendReply, AnswerWhen)>,
    /// A group's other commands, likewise.
    others: Vec<Command>,
}

impl<S: Storage> LogTask<S> {
    /// Starts the sync [`GroupCommit`] asks for, if it asks for one.
    fn poll_sync(&mut self, now: std::time::Instant) {
        let log = &mut self.log;
        let interval_due =
            log.flush_due(self.clock.wall_ms()) && log.config().flush != FlushPolicy::Always;
        let Some(start) = self.commit.poll_sync(now, interval_due) else {
            return;
        };
        match log.begin_flush() {
            Ok(job) => {
                tracing::debug!(target = job.target_offset(), "sync starts");
                // Nothing waits on an interval sync, so it may join the shard's round.
                let shared = self
                    .shared_sync
                    .clone()
                    .filter(|_| start == SyncStart::Unwaited);
                self.in_flight = Some(Box::pin(sync_job(
                    job,
                    shared,
                    self.tuning.device_writes.clone(),
                    self.tuning.sync_latency_us.clone(),
                )));
            }
            Err(error) => answer_failed(self.commit.on_synced(), &error),
        }
    }

    /// How long to wait for commands before polling again.
    fn poll_timeout(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let interval_wait = match self.log.config().flush {
            FlushPolicy::Interval { interval_ms }
                if self.log.durable_offset() < self.log.log_end_offset() =>
            {
                Some(std::time::Duration::from_millis(interval_ms))
            }
            _ => None,
        };
        self.commit.poll_timeout(now, interval_wait)
    }

    async fn on_synced(&mut self, outcome: FlushOutcome) {
        self.in_flight = None;
        let waiters = self.commit.on_synced();
        tracing::debug!(appends = waiters.len(), "sync done");
        let result = self.log.complete_flush(outcome, self.clock.wall_ms()).await;
        // Before the answers: whoever reads the synced offset after one sees the sync.
        self.published.update(&self.log);
        answer_synced(result, waiters);
    }

    /// Completes the sync in flight and syncs what is left, answering every waiter.
    async fn finish(&mut self) {
        if let Some(sync) = self.in_flight.take() {
            let outcome = sync.await;
            let waiters = self.commit.on_synced();
            let result = self.log.complete_flush(outcome, self.clock.wall_ms()).await;
            answer_synced(result, waiters);
        }
        let unsynced = self.commit.take_unsynced();
        if !unsynced.is_empty() {
            answer_synced(self.log.flush(self.clock.wall_ms()).await, unsynced);
        }
    }

    /// An append is written: answered now, or when a sync covers it.
    fn on_written(
        &mut self,
        (reply, answer): (AppendReply, AnswerWhen),
        written: Result<AppendInfo, LogError>,
    ) {
        match written {
            // A retry whose original is already durable. One that is not waits for a sync
            // like any append: `GroupCommit` starts one whenever appends wait, even if this
            // group wrote nothing new.
            Ok(info) if info.duplicate && info.last_offset < self.log.durable_offset() => {
                let _ = reply.send(Ok(info));
            }
            Ok(info)
                if self.log.config().flush == FlushPolicy::Always
                    || answer == AnswerWhen::Synced =>
            {
                self.commit.on_appended((reply, info), self.clock.now());
            }
            result => {
                let _ = reply.send(result);
            }
        }
    }

    /// Runs a group of commands: its appends validated together and written back to back,
    /// then the rest in order. Returns the reply of a close among them.
    async fn handle_group(
        &mut self,
        group: &mut Vec<Command>,
    ) -> Option<oneshot::Sender<Result<(), LogError>>> {
        let mut others = std::mem::take(&mut self.others);
        for command in group.drain(..) {
            match command {
                Command::Append {
                    batches,
                    leader_epoch,
                    source,
                    answer,
                    reply,
                } => {
                    self.appends.push((batches, leader_epoch, source));
                    self.append_replies.push((reply, answer));
                }
                other => others.push(other),
            }
        }
        if !self.appends.is_empty() {
            let appends = std::mem::take(&mut self.appends);
            let results = self
                .log
                .append_group_from(appends, self.clock.wall_ms())
                .await;
            // Taken out and put back, so its capacity is kept from group to group.
            let mut replies = std::mem::take(&mut self.append_replies);
            for (reply, result) in replies.drain(..).zip(results) {
                self.on_written(reply, result);
            }
            self.append_replies = replies;
        }
        let mut close = None;
        for command in others.drain(..) {
            if let Command::Close { reply } = command {
                close = Some(reply);
            } else {
                self.handle(command).await;
            }
        }
        self.others = others;
        self.answer_parked_reads().await;
        close
    }

    /// Every command but appends and close.
    /// Plans a clean and runs it beside this task; the outcome comes back as
    /// [`Command::FinishClean`] (see [`LogHandle::clean`]).
    async fn start_clean(
        &mut self,
        below_offset: u64,
        mut resources: CleanerResources,
        reply: CleanReply,
        now_ms: i64,
    ) {
        let log = &mut self.log;
        let status = log.compaction_status(now_ms, below_offset);
        if let Err(error) = log.roll_for_compaction(now_ms).await {
            let report = Some(Err(error));
            let _ = reply.send(CleanAnswer {
                resources,
                report,
                status,
            });
            return;
        }
        let Some(plan) = log.plan_clean(now_ms, below_offset) else {
            let _ = reply.send(CleanAnswer {
                resources,
                report: None,
                status,
            });
            return;
        };
        let own_commands = self.own_commands.clone();
        tokio::task::spawn_local(async move {
            let (map, outcome) = clean(plan, resources.map, &mut resources.throttle).await;
            resources.map = map;
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(error) => {
                    let report = Some(Err(error));
                    let _ = reply.send(CleanAnswer {
                        resources,
                        report,
                        status,
                    });
                    return;
                }
            };
            if let Some(commands) = own_commands.upgrade() {
                let _ = commands.send(Command::FinishClean {
                    outcome,
                    resources,
                    below_offset,
                    reply,
                });
            }
        });
    }

    async fn handle(&mut self, command: Command) {
        let now_ms = self.clock.wall_ms();
        let log = &mut self.log;
        match command {
            Command::Append { .. } | Command::Close { .. } => {
                unreachable!("appends and close are the group's")
            }
            Command::AppendReplicated { batches, reply } => {
                let appended = match batches {
                    ReplicatedBatches::Bytes(batches) => {
                        log.append_replicated(batches, now_ms).await
                    }
                    ReplicatedBatches::Placed(placed) => {
                        log.append_replicated_placed(placed, now_ms).await
                    }
                };
                self.published.direct_phase.set(log.direct_phase());
                self.on_written((reply, AnswerWhen::FlushPolicy), appended);
            }
            Command::Summary { reply } => {
                let _ = reply.send(summary_of(log));
            }
            Command::ReplicaInfo { reply } => {
                let _ = reply.send(ReplicaInfo {
                    offsets: offsets_of(log),
                    latest_epoch: log.epochs().latest_epoch(),
                    high_watermark_checkpoint: log.high_watermark_checkpoint(),
                });
            }
            Command::Diverging {
                fetch_offset,
                last_fetched_epoch,
                reply,
            } => {
                let _ = reply.send(diverging(log, fetch_offset, last_fetched_epoch));
            }
            Command::TruncateDiverged { divergence, reply } => {
                let cut =
                    replication::truncation_offset(log.epochs(), log.log_end_offset(), divergence);
                // Nothing unsynced may be answered as durable past the cut.
                self.finish().await;
                let _ = reply.send(self.log.truncate_to(cut, now_ms).await);
            }
            Command::RestartAt {
                offset,
                below,
                reply,
            } => {
                self.finish().await;
                let _ = reply.send(self.log.restart_at(offset, below, now_ms).await);
            }
            Command::CheckpointHighWatermark { high_watermark } => {
                log.checkpoint_high_watermark(high_watermark).await;
            }
            Command::Reconfigure { config } => {
                self.finish().await;
                self.log.reconfigure(config);
            }
            Command::Sync { reply } => {
                self.finish().await;
                let _ = reply.send(self.log.flush(now_ms).await);
            }
            // File reads run beside the appends (see `PartitionLog::plan_read`).
            Command::Read {
                offset,
                max_bytes,
                max_offset,
                reply,
            } => answer_read(
                log.plan_read(offset, max_bytes, max_offset).await,
                move |read| {
                    let _ = reply.send(read);
                },
            ),
            Command::ReadForSending {
                offset,
                max_bytes,
                max_offset,
                reply,
            } => answer_read_for_sending(
                log.plan_read_for_sending(offset, max_bytes, max_offset)
                    .await,
                move |read| {
                    let _ = reply.send(read);
                },
            ),
            Command::Retention {
                below_offset,
                reply,
            } => {
                let _ = reply.send(log.enforce_retention(now_ms, below_offset).await);
            }
            Command::Clean {
                below_offset,
                resources,
                reply,
            } => {
                self.start_clean(below_offset, resources, reply, now_ms)
                    .await
            }
            Command::FinishClean {
                outcome,
                resources,
                below_offset,
                reply,
            } => {
                let report = Some(log.finish_clean(outcome, now_ms).await);
                let status = log.compaction_status(now_ms, below_offset);
                let _ = reply.send(CleanAnswer {
                    resources,
                    report,
                    status,
                });
            }
            Command::Offsets { reply } => {
                let _ = reply.send(offsets_of(log));
            }
            Command::ReadForFollower { read, wait } => {
                if wait && read.offset >= log.log_end_offset() {
                    self.parked_reads.push(read);
                } else {
                    read.answer(log).await;
                }
            }
            Command::OffsetForTimestamp {
                timestamp_ms,
                reply,
            } => {
                let _ = reply.send(log.offset_for_timestamp(timestamp_ms).await);
            }
            Command::DeleteRecordsBefore { offset, reply } => {
                self.finish().await;
                let _ = reply.send(self.log.delete_records_before(offset, now_ms).await);
                // Followers waiting at the end hear of the new log start now, not at their
                // wait's end: DeleteRecords is answered once they have moved theirs.
                self.answer_every_parked_read().await;
            }
            Command::Tiering(command) => command.run(log),
            Command::AbortedTxns { from, to, reply } => {
                let txns = log.producers().transactions();
                let _ = reply.send(txns.aborted_between(from, to).copied().collect());
            }
            Command::OffsetOfMaxTimestamp { reply } => {
                let _ = reply.send(log.offset_of_max_timestamp().await);
            }
        }
    }

    /// Answers the follower reads the appends satisfied; forgets withdrawn ones.
    /// Answers every parked read, whatever it waits for (the log's offsets moved).
    async fn answer_every_parked_read(&mut self) {
        for read in std::mem::take(&mut self.parked_reads) {
            if !read.reply.is_closed() {
                read.answer(&mut self.log).await;
            }
        }
    }

    async fn answer_parked_reads(&mut self) {
        let log_end = self.log.log_end_offset();
        self.parked_reads.retain(|read| !read.reply.is_closed());
        let mut index = 0;
        while index < self.parked_reads.len() {
            if self.parked_reads[index].offset < log_end {
                self.parked_reads
                    .swap_remove(index)
                    .answer(&mut self.log)
                    .await;
            } else {
                index += 1;
            }
        }
    }
}

fn summary_of<S: Storage>(log: &PartitionLog<S>) -> LogSummary {
    let producers = log
        .producers()
        .iter()
        .map(|(producer_id, entry)| ProducerSummary {
            producer_id,
            epoch: entry.epoch,
            last_sequence: entry.last().map_or(-1, |batch| batch.last_seq),
            last_timestamp_ms: entry.last_timestamp_ms,
        })
        .collect();
    LogSummary {
        offsets: offsets_of(log),
        size_bytes: log.size_bytes(),
        epochs: log.epochs().clone(),
        producers,
        open_transactions: log.producers().transactions().open().clone(),
    }
}

/// Where a follower fetching at `fetch_offset` after `last_fetched_epoch` diverges from `log`,
/// and the log's offsets.
fn diverging<S: Storage>(
    log: &PartitionLog<S>,
    fetch_offset: u64,
    last_fetched_epoch: Option<u32>,
) -> (Option<Divergence>, LogOffsets) {
    let divergence = replication::diverging(
        log.epochs(),
        log.log_end_offset(),
        fetch_offset,
        last_fetched_epoch,
    );
    (divergence, offsets_of(log))
}

fn offsets_of<S: Storage>(log: &PartitionLog<S>) -> LogOffsets {
    let log_end = log.log_end_offset();
    LogOffsets {
        clean: log.clean_offset(),
        log_start: log.log_start_offset(),
        log_end,
        durable: log.durable_offset(),
        first_unstable: log.producers().transactions().last_stable_offset(log_end),
    }
}

/// Runs a log's sync: through the shard's `syncfs` round when it has one and covers the log,
/// else file by file, holding the shard's device-write permit and timed into the fsync
/// histogram (the round times its own `syncfs`).
async fn sync_job<F: crate::io::StorageFile>(
    job: super::FlushJob<F>,
    shared: Option<Rc<SharedSync>>,
    device_writes: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    latency_us: Option<Rc<std::cell::RefCell<hdrhistogram::Histogram<u64>>>>,
) -> FlushOutcome {
    let job = match shared {
        Some(shared) => match join_shared_round(job, &shared).await {
            Ok(outcome) => return outcome,
            Err(job) => job,
        },
        None => job,
    };
    if !job.syncs_files() {
        return job.run().await;
    }
    // Syncs are what reach the device (appends land in the page cache): the shard's limit
    // holds for as long as one runs.
    let _permit = match &device_writes {
        Some(limit) => limit.clone().acquire_owned().await.ok(),
        None => None,
    };
    let started = std::time::Instant::now();
    let outcome = job.run().await;
    if let Some(histogram) = latency_us {
        let _ = histogram
            .borrow_mut()
            .record((started.elapsed().as_micros() as u64).max(1));
    }
    outcome
}

/// Joins the shard's `syncfs` round. `Err` hands the job back when the round does not cover it
/// (a round of too few logs, or a failed one): the log then syncs its own files.
async fn join_shared_round<F: crate::io::StorageFile>(
    job: super::FlushJob<F>,
    shared: &Rc<SharedSync>,
) -> Result<FlushOutcome, super::FlushJob<F>> {
    if !job.syncs_files() || !matches!(shared.sync().await, Ok(true)) {
        return Err(job);
    }
    Ok(FlushOutcome {
        target_offset: job.target_offset,
        point: job.point,
        failure: None,
    })
}

/// Answers a sync's waiters with its outcome.
fn answer_synced(result: Result<u64, LogError>, waiters: Vec<Waiter>) {
    match result {
        Ok(_) => {
            for (reply, info) in waiters {
                let _ = reply.send(Ok(info));
            }
        }
        Err(error) => answer_failed(waiters, &error),
    }
}

fn answer_failed(waiters: Vec<Waiter>, error: &LogError) {
    for (reply, _) in waiters {
        let _ = reply.send(Err(LogError::Failed {
            dir: Default::default(),
            reason: error.to_string(),
        }));
    }
}
