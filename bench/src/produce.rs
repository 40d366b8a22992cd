//! The producer side of a run: unpaced, paced (open loop, on threads of their own) and pinned
//! producers, the records they send (payload, keys, partitions), transactions, and the
//! acknowledgements they wait for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_client::{
    AckDurability, Client, ClientConfig, Producer, ProducerConfig, ProducerRecord, RecordMetadata,
};

use crate::pacing::{PreciseTimer, Schedule};

use crate::{
    config::{BenchConfig, KeyDistribution, TxnSpan},
    kafka,
    measure::{AckReport, ProducerMeasures, SentBytes, Tally, histogram, now_us},
    pacing,
};

/// Where a record goes when the bench picks partitions itself (over Kafka's protocol, or with
/// `spread`): its key's partition by Strata's hash, else one partition a batch's worth of bytes
/// at a time, as the native client's sticky partitioner does.
pub(crate) struct PartitionChooser {
    partitions: u32,
    batch_bytes: usize,
    sticky: u32,
    filled: usize,
}

impl PartitionChooser {
    /// Over partitions `0..partitions`; producer `index` starts at its own partition.
    pub(crate) fn new(partitions: u32, batch_bytes: usize, index: usize) -> PartitionChooser {
        let partitions = partitions.max(1);
        PartitionChooser {
            partitions,
            batch_bytes: batch_bytes.max(1),
            sticky: (index % partitions as usize) as u32,
            filled: 0,
        }
    }

    /// The partition of a record of `bytes` with `key`.
    pub(crate) fn next(&mut self, key: Option<&[u8]>, bytes: usize) -> u32 {
        if let Some(key) = key {
            return strata_client::partition_for_key(key, self.partitions);
        }
        let chosen = self.sticky;
        self.filled += bytes;
        if self.filled >= self.batch_bytes {
            (self.sticky, self.filled) = ((chosen + 1) % self.partitions, 0);
        }
        chosen
    }
}

/// What one producer task works with.
pub(crate) struct ProducerTask {
    pub(crate) producer: BenchProducer,
    pub(crate) config: BenchConfig,
    /// This producer's number (its partition in the pinned presets, its key seed).
    pub(crate) index: u64,
    /// Records to send, when the run is bounded by a count.
    pub(crate) quota: Option<u64>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) tally: Tally,
    /// Records intended before this are warmup: sent, not measured.
    pub(crate) measure_from: Instant,
}

/// What one producer's loop returns.
pub(crate) type ProducerOutcome = anyhow::Result<ProducerMeasures>;

/// One producer, as fast as acknowledgements allow (no rate), until stopped or its quota is
/// sent. Paced producers run in [`produce_paced`] instead.
pub(crate) async fn produce(task: ProducerTask) -> ProducerOutcome {
    if let Some(per_batch) = task.config.batch_records.filter(|_| task.config.pinned) {
        return produce_pinned(task, per_batch.max(1)).await;
    }
    let mut sender = RecordSender::new(task);
    while !sender.done() {
        sender.send(Instant::now()).await;
    }
    sender.finish().await
}

/// The paced rate one producer thread takes before the next thread starts. On a 2-core VM,
/// one thread at 200,000 records/s used 63% of a core where the earlier
/// design (a pacing thread feeding the shared runtime) used 104%, with the same latency and
/// the same broker CPU; a second thread (a second client) lowered p50 by a fifth to a third but
/// cost the broker a quarter more CPU (twice the requests), worth it only where one thread
/// falls behind: at 320,000 records/s one thread delivered 318,700 with p50 1.4-2.5 ms, two
/// held the rate with p50 0.9-1.0 ms.
pub(crate) const PACED_RECORDS_PER_THREAD: f64 = 200_000.0;

/// A paced producer before it starts: its client and producer are made on the thread that
/// will run it.
pub(crate) struct PacedProducer {
    pub(crate) index: usize,
    pub(crate) producer_config: ProducerConfig,
    pub(crate) make_task: Box<dyn FnOnce(BenchProducer) -> ProducerTask + Send>,
}

/// How a thread of paced producers makes them: native ones share a client of the thread's
/// own (or each has its own with `own_connections`, the flag); over Kafka each is a librdkafka
/// producer (on a topic of this many partitions).
pub(crate) enum Connect {
    Native(ClientConfig, bool),
    Kafka(Box<BenchConfig>, u32),
}

/// Makes `group`'s producers on this thread and runs them paced (see [`on_own_runtime`]).
pub(crate) async fn produce_paced_on_this_thread(
    connect: Connect,
    group: Vec<PacedProducer>,
) -> Vec<ProducerOutcome> {
    let mut tasks = Vec::with_capacity(group.len());
    match connect {
        Connect::Native(client_config, own_connections) => {
            let mut shared = None;
            for paced in group {
                let client = match &shared {
                    Some(client) if !own_connections => Arc::clone(client),
                    _ => match Client::connect(client_config.clone()).await {
                        Ok(client) => shared.insert(client).clone(),
                        Err(error) => {
                            return vec![Err(anyhow::Error::from(error).context("connecting"))];
                        }
                    },
                };
                let producer = Producer::new(client, paced.producer_config);
                tasks.push((paced.make_task)(BenchProducer::Native(producer)));
            }
        }
        Connect::Kafka(config, partitions) => {
            for paced in group {
                match kafka::KafkaProducer::new(&config, paced.index, partitions) {
                    Ok(producer) => tasks.push((paced.make_task)(BenchProducer::Kafka(producer))),
                    Err(error) => return vec![Err(error)],
                }
            }
        }
    }
    produce_paced(tasks).await
}

/// A bench producer: Strata's client, or librdkafka over Kafka's protocol.
pub(crate) enum BenchProducer {
    Native(Producer),
    Kafka(kafka::KafkaProducer),
}

/// A record's acknowledgement, from either producer.
pub(crate) enum BenchAck {
    Native(strata_client::RecordFuture),
    Kafka(kafka::KafkaAck),
}

impl Future for BenchAck {
    type Output = anyhow::Result<RecordMetadata>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            BenchAck::Native(ack) => ack.poll_unpin(context).map_err(Into::into),
            BenchAck::Kafka(ack) => ack.poll_unpin(context),
        }
    }
}

impl BenchProducer {
    /// Strata's own producer, for what only it does (transactions).
    fn native(&self) -> anyhow::Result<&Producer> {
        match self {
            BenchProducer::Native(producer) => Ok(producer),
            BenchProducer::Kafka(_) => {
                anyhow::bail!("only the native producer writes transactions")
            }
        }
    }

    /// Hands `record` to the client: its partition, and its acknowledgement to come.
    async fn send(&self, record: ProducerRecord) -> anyhow::Result<(u32, BenchAck)> {
        match self {
            BenchProducer::Native(producer) => {
                let ack = producer.send(record).await?;
                Ok((ack.partition(), BenchAck::Native(ack)))
            }
            BenchProducer::Kafka(producer) => {
                let timestamp_ms = record
                    .timestamp_ms
                    .unwrap_or_else(|| (now_us() / 1000) as i64);
                let (partition, ack) = producer
                    .send(
                        &record.topic,
                        (record.partition, record.key.as_deref()),
                        &record.value,
                        timestamp_ms,
                    )
                    .await?;
                Ok((partition, BenchAck::Kafka(ack)))
            }
        }
    }

    /// Many records to one partition (the pinned presets); the acknowledgements that, all
    /// resolved, say every record was acknowledged.
    async fn send_batch(
        &self,
        topic: &Arc<str>,
        partition: u32,
        records: &[(Option<&[u8]>, &[u8])],
    ) -> anyhow::Result<Vec<BenchAck>> {
        match self {
            BenchProducer::Native(producer) => Ok(producer
                .send_batch(topic, partition, None, records)
                .await?
                .into_iter()
                .map(BenchAck::Native)
                .collect()),
            BenchProducer::Kafka(producer) => {
                let timestamp_ms = (now_us() / 1000) as i64;
                let mut acks = Vec::with_capacity(records.len());
                for (key, value) in records {
                    let (_, ack) = producer
                        .send(topic, (Some(partition), *key), value, timestamp_ms)
                        .await?;
                    acks.push(BenchAck::Kafka(ack));
                }
                Ok(acks)
            }
        }
    }

    /// Bytes of the batches sent so far, after compression; 0 where the client does not say.
    fn batch_bytes(&self) -> u64 {
        match self {
            BenchProducer::Native(producer) => producer.batch_bytes(),
            BenchProducer::Kafka(_) => 0,
        }
    }
}

/// This thread's paced producers, each open loop at its share of the rate. The thread wakes
/// for all of them, at most once per [`pacing::QUANTUM`]: a wake-up is the expensive part of
/// pacing on a VM (three producers on threads of their own, waking for every record at 35,000
/// records/s, took 97% of a core, 70% of it switching threads).
pub(crate) async fn produce_paced(tasks: Vec<ProducerTask>) -> Vec<ProducerOutcome> {
    let timer = PreciseTimer::new();
    let start = Instant::now();
    let mut senders: Vec<(RecordSender, Schedule)> = tasks
        .into_iter()
        .map(|task| {
            let rate = task
                .config
                .rate
                .map(|rate| rate / task.config.producers.max(1) as f64);
            (RecordSender::new(task), Schedule::new(start, rate))
        })
        .collect();
    loop {
        let now = Instant::now();
        let mut next_due: Option<Instant> = None;
        for (sender, schedule) in &mut senders {
            let due = schedule.due_by(now);
            while !sender.done() && sender.sent < due {
                sender.send(schedule.due_at(sender.sent)).await;
            }
            if !sender.done() {
                let due = schedule.due_at(sender.sent);
                next_due = Some(next_due.map_or(due, |next| next.min(due)));
            }
        }
        match next_due {
            Some(next_due) => pacing::wait_precisely_for(&timer, next_due).await,
            None => break,
        }
    }
    let mut outcomes = Vec::new();
    for (sender, _) in senders {
        outcomes.push(sender.finish().await);
    }
    outcomes
}

/// One producer's record loop: builds each record (with its intended send time leading the
/// value), hands it to the client, and passes the ack to a collector task that records latency.
pub(crate) struct RecordSender {
    producer: BenchProducer,
    config: BenchConfig,
    index: u64,
    quota: Option<u64>,
    stop: Arc<AtomicBool>,
    topic: Arc<str>,
    keys: KeyChooser,
    /// With `spread`: where records go, the bench choosing among the first partitions.
    spread: Option<PartitionChooser>,
    value: BytesMut,
    sent: u64,
    /// Why this producer stopped early: a send failed, or the collector stopped because an
    /// ack did (then `finish` returns the collector's error instead).
    failure: Option<anyhow::Error>,
    pending: tokio::sync::mpsc::UnboundedSender<PendingAck<BenchAck>>,
    collector: tokio::task::JoinHandle<ProducerOutcome>,
    /// One reading of both clocks, to turn an intended `Instant` into wall-clock time by
    /// arithmetic: reading the clocks per record took about 6% of the bench's samples.
    epoch: (Instant, u64),
    /// Where `finish` adds what this producer sent.
    sent_bytes: Arc<SentBytes>,
    /// A transactional producer's open transaction.
    transaction: Option<TxnProgress>,
}

/// A transactional producer's progress through its current transaction, and its commits'
/// latency.
pub(crate) struct TxnProgress {
    span: TxnSpan,
    initialized: bool,
    /// When the open transaction began; `None` between transactions.
    opened: Option<Instant>,
    records: u64,
    commits: Histogram<u64>,
    measure_from: Instant,
}

impl TxnProgress {
    /// Opens a transaction if none is (initializing the producer's transactional id first).
    async fn open(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        let producer = producer.native()?;
        if self.opened.is_some() {
            return Ok(());
        }
        if !self.initialized {
            producer
                .init_transactions()
                .await
                .context("initializing the transactional producer")?;
            self.initialized = true;
        }
        producer.begin()?;
        self.opened = Some(Instant::now());
        self.records = 0;
        Ok(())
    }

    /// One more record sent in the open transaction; commits it if it is full or old enough.
    async fn sent(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        self.records += 1;
        let opened = self
            .opened
            .expect("records are sent in an open transaction");
        let full = self.span.records.is_some_and(|limit| self.records >= limit);
        if full || opened.elapsed() >= self.span.age {
            self.commit(producer).await?;
        }
        Ok(())
    }

    /// Commits the open transaction, if one is: waits for its records' acknowledgements, then
    /// times the commit alone.
    async fn commit(&mut self, producer: &BenchProducer) -> anyhow::Result<()> {
        let producer = producer.native()?;
        if self.opened.take().is_none() {
            return Ok(());
        }
        producer.flush().await?;
        let asked = Instant::now();
        producer.commit().await.context("committing")?;
        if asked >= self.measure_from {
            let _ = self
                .commits
                .record(asked.elapsed().as_micros().max(1) as u64);
        }
        Ok(())
    }
}

impl RecordSender {
    fn new(task: ProducerTask) -> RecordSender {
        let ProducerTask {
            producer,
            config,
            index,
            quota,
            stop,
            tally,
            measure_from,
        } = task;
        let Tally {
            produced,
            interval,
            sent: sent_bytes,
        } = tally;
        let (pending, acks) = tokio::sync::mpsc::unbounded_channel();
        let collector = tokio::spawn(async move {
            let mut measures = ProducerMeasures::new();
            let mut acks = AcksInFlight::new(acks);
            while let Some((intended, size, durability)) = acks.next().await? {
                if intended >= measure_from {
                    let latency = intended.elapsed().as_micros().max(1) as u64;
                    let _ = measures.records.record(latency);
                    measures.durability.count(durability, 1);
                    let _ = interval.lock().expect("interval recorder").record(latency);
                    measures.bytes += size as u64;
                    produced.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, anyhow::Error>(measures)
        });
        let transaction = config.transactions.map(|span| TxnProgress {
            span,
            initialized: false,
            opened: None,
            records: 0,
            commits: histogram(),
            measure_from,
        });
        RecordSender {
            topic: config.topic.as_str().into(),
            keys: KeyChooser::new(config.key_distribution, config.keys, index),
            spread: config
                .spread
                .filter(|_| !config.pinned)
                .map(|spread| PartitionChooser::new(spread, config.batch_bytes, index as usize)),
            value: BytesMut::with_capacity(config.record_size),
            producer,
            config,
            index,
            quota,
            stop,
            sent: 0,
            failure: None,
            pending,
            collector,
            epoch: (Instant::now(), now_us()),
            sent_bytes,
            transaction,
        }
    }

    fn done(&self) -> bool {
        self.failure.is_some()
            || self.stop.load(Ordering::Relaxed)
            || self.quota.is_some_and(|quota| self.sent >= quota)
    }

    /// Sends the next record, intended for `intended`. A failure ends this producer
    /// ([`RecordSender::done`]) and is reported by `finish`.
    async fn send(&mut self, intended: Instant) {
        if let Some(transaction) = &mut self.transaction
            && let Err(error) = transaction.open(&self.producer).await
        {
            self.failure = Some(error);
            return;
        }
        // The intended time in wall-clock µs leads the value (consumers measure end-to-end
        // latency from it) and is the record's timestamp.
        let (epoch, epoch_wall_us) = self.epoch;
        let intended_us = match intended.checked_duration_since(epoch) {
            Some(after) => epoch_wall_us + after.as_micros() as u64,
            None => epoch_wall_us.saturating_sub(epoch.duration_since(intended).as_micros() as u64),
        };
        let value = &mut self.value;
        value.clear();
        value.put_u64_le(intended_us);
        let rest = self.config.record_size.saturating_sub(value.len());
        put_text(value, self.sent, rest);
        let mut record =
            ProducerRecord::new(self.topic.clone(), self.keys.next(), value.split().freeze());
        record.timestamp_ms = Some((intended_us / 1000) as i64);
        if self.config.pinned {
            record.partition = Some(self.index as u32);
        } else if let Some(spread) = &mut self.spread {
            record.partition = Some(spread.next(record.key.as_deref(), record.value.len()));
        }
        let (partition, ack) = match self.producer.send(record).await {
            Ok(sent) => sent,
            Err(error) => {
                self.failure = Some(error);
                return;
            }
        };
        if self
            .pending
            .send(PendingAck {
                intended,
                size: self.config.record_size,
                partition,
                ack,
            })
            .is_err()
        {
            self.failure = Some(anyhow::anyhow!("the ack collector stopped"));
            return;
        }
        self.sent += 1;
        if let Some(transaction) = &mut self.transaction
            && let Err(error) = transaction.sent(&self.producer).await
        {
            self.failure = Some(error);
        }
    }

    /// Commits an open transaction, waits for every ack sent and returns the measurements, or
    /// why the producer failed.
    async fn finish(mut self) -> ProducerOutcome {
        if let Some(transaction) = &mut self.transaction
            && self.failure.is_none()
            && let Err(error) = transaction.commit(&self.producer).await
        {
            self.failure = Some(error);
        }
        drop(self.pending);
        let mut measured = self.collector.await?;
        if let (Ok(measures), Some(transaction)) = (&mut measured, &self.transaction) {
            measures.commits.add(&transaction.commits)?;
        }
        self.sent_bytes.add(
            self.sent * self.config.record_size as u64,
            self.producer.batch_bytes(),
        );
        match self.failure {
            // The collector's own error says which ack failed; prefer it.
            Some(failure) => Err(measured.err().unwrap_or(failure)),
            None => measured,
        }
    }
}

/// A record handed to the client: when it was meant to leave, its size, its partition and
/// its acknowledgement.
pub(crate) struct PendingAck<A> {
    intended: Instant,
    size: usize,
    partition: u32,
    ack: A,
}

/// The records of one producer awaiting acknowledgement, yielded as each is acknowledged.
/// Acks of one partition come in order, those of different partitions do not: awaiting them
/// all in send order would charge a record acknowledged early with the wait for an earlier
/// record of a slower partition (at 200,000 records/s over 4 partitions that put the p50 at
/// the slowest partition's round trip). So only the oldest record of each partition is
/// awaited (woken alone when its batch is acknowledged); the records behind it, mostly of the
/// same batch, are taken as soon as they are found done.
pub(crate) struct AcksInFlight<A> {
    incoming: tokio::sync::mpsc::UnboundedReceiver<PendingAck<A>>,
    incoming_open: bool,
    /// Per partition, in send order, the records behind the one awaited.
    queued: Vec<std::collections::VecDeque<PendingAck<A>>>,
    /// Per partition, whether its oldest record is in `oldest`.
    awaited: Vec<bool>,
    oldest: futures_util::stream::FuturesUnordered<OldestAck<A>>,
    /// Acknowledged, not yet yielded.
    done: std::collections::VecDeque<anyhow::Result<Acknowledged>>,
}

/// A record acknowledged: when it was meant to be sent, its size, and how durable its
/// acknowledgement said it was.
pub(crate) type Acknowledged = (Instant, usize, Option<AckDurability>);

/// A partition's oldest unacknowledged record; resolves to the record and its ack's outcome.
pub(crate) struct OldestAck<A> {
    pending: Option<PendingAck<A>>,
}

impl<A, T, E> Future for OldestAck<A>
where
    A: Future<Output = Result<T, E>> + Unpin,
{
    type Output = (PendingAck<()>, Result<T, E>);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let pending = self.pending.as_mut().expect("polled after completion");
        let result = std::task::ready!(pending.ack.poll_unpin(context));
        let pending = self.pending.take().expect("checked above");
        std::task::Poll::Ready((pending.without_ack(), result))
    }
}

impl<A> PendingAck<A> {
    fn without_ack(self) -> PendingAck<()> {
        PendingAck {
            intended: self.intended,
            size: self.size,
            partition: self.partition,
            ack: (),
        }
    }
}

impl<A, T, E> AcksInFlight<A>
where
    A: Future<Output = Result<T, E>> + Unpin,
    T: AckReport,
    E: Into<anyhow::Error>,
{
    fn new(incoming: tokio::sync::mpsc::UnboundedReceiver<PendingAck<A>>) -> AcksInFlight<A> {
        AcksInFlight {
            incoming,
            incoming_open: true,
            queued: Vec::new(),
            awaited: Vec::new(),
            oldest: futures_util::stream::FuturesUnordered::new(),
            done: std::collections::VecDeque::new(),
        }
    }

    /// The next acknowledged record; `None` once the sender is gone and every record is
    /// acknowledged; a failed ack's error.
    async fn next(&mut self) -> anyhow::Result<Option<Acknowledged>> {
        std::future::poll_fn(|context| self.poll_next(context)).await
    }

    fn poll_next(
        &mut self,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<anyhow::Result<Option<Acknowledged>>> {
        use futures_util::StreamExt;
        use std::task::Poll;
        while self.incoming_open {
            match self.incoming.poll_recv(context) {
                Poll::Ready(Some(pending)) => self.add(pending),
                Poll::Ready(None) => self.incoming_open = false,
                Poll::Pending => break,
            }
        }
        while self.done.is_empty() {
            match self.oldest.poll_next_unpin(context) {
                Poll::Ready(Some((acked, result))) => {
                    self.done.push_back(
                        result
                            .map(|ack| (acked.intended, acked.size, ack.durability()))
                            .map_err(Into::into),
                    );
                    self.take_done_behind(acked.partition as usize);
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        match self.done.pop_front() {
            Some(acked) => Poll::Ready(acked.map(Some)),
            None if self.incoming_open || !self.oldest.is_empty() => Poll::Pending,
            None => Poll::Ready(Ok(None)),
        }
    }

    fn add(&mut self, pending: PendingAck<A>) {
        let partition = pending.partition as usize;
        if self.queued.len() <= partition {
            self.queued.resize_with(partition + 1, Default::default);
            self.awaited.resize(partition + 1, false);
        }
        if self.awaited[partition] {
            self.queued[partition].push_back(pending);
        } else {
            self.awaited[partition] = true;
            self.oldest.push(OldestAck {
                pending: Some(pending),
            });
        }
    }

    /// After `partition`'s oldest record was acknowledged: takes the records behind it that
    /// are acknowledged too and awaits the first that is not.
    fn take_done_behind(&mut self, partition: usize) {
        let mut glance = std::task::Context::from_waker(std::task::Waker::noop());
        while let Some(mut pending) = self.queued[partition].pop_front() {
            match pending.ack.poll_unpin(&mut glance) {
                std::task::Poll::Ready(result) => self.done.push_back(
                    result
                        .map(|ack| (pending.intended, pending.size, ack.durability()))
                        .map_err(Into::into),
                ),
                std::task::Poll::Pending => {
                    self.oldest.push(OldestAck {
                        pending: Some(pending),
                    });
                    return;
                }
            }
        }
        self.awaited[partition] = false;
    }
}

/// The pinned presets' loop, as iggy-bench's pinned producers run: producer `index` writes
/// partition `index` in batches of `per_batch` records, each handed to the client in one call
/// once the previous batch is acknowledged (closed loop). A batch's latency runs from its
/// intended send time to its acknowledgement, and every record in it counts that latency.
/// The values live in one buffer filled once; each batch rewrites only their timestamps.
pub(crate) async fn produce_pinned(task: ProducerTask, per_batch: usize) -> ProducerOutcome {
    let (config, quota, measure_from) = (&task.config, task.quota, task.measure_from);
    let Tally {
        produced,
        interval,
        sent: sent_bytes,
    } = &task.tally;
    let topic: Arc<str> = config.topic.as_str().into();
    let partition = task.index as u32;
    let rate = config
        .rate
        .map(|rate| rate / config.producers.max(1) as f64);
    let mut keys = KeyChooser::new(config.key_distribution, config.keys, task.index);
    let ProducerMeasures {
        mut records,
        mut batches,
        mut bytes,
        commits,
        durability: mut measured_durability,
    } = ProducerMeasures::new();
    let record_size = config.record_size.max(1);
    let mut values: Vec<u8> = Vec::with_capacity(per_batch * record_size);
    for record in 0..per_batch as u64 {
        put_text(&mut values, record, record_size);
    }
    let mut batch_keys: Vec<Option<Bytes>> = Vec::with_capacity(per_batch);
    let schedule = Schedule::new(Instant::now(), rate);
    let mut sent = 0u64;
    while !task.stop.load(Ordering::Relaxed) && quota.is_none_or(|quota| sent < quota) {
        let count = quota.map_or(per_batch, |quota| {
            (quota - sent).min(per_batch as u64) as usize
        });
        let intended = schedule.wait_until_due(sent);
        let lateness = Instant::now().saturating_duration_since(intended);
        let stamp = now_us()
            .saturating_sub(lateness.as_micros() as u64)
            .to_le_bytes();
        for value in values.chunks_mut(record_size).take(count) {
            let len = stamp.len().min(value.len());
            value[..len].copy_from_slice(&stamp[..len]);
        }
        batch_keys.clear();
        batch_keys.extend((0..count).map(|_| keys.next()));
        let batch: Vec<(Option<&[u8]>, &[u8])> = batch_keys
            .iter()
            .map(Option::as_deref)
            .zip(values.chunks(record_size))
            .collect();
        let acks = task.producer.send_batch(&topic, partition, &batch).await?;
        let mut durability = None;
        for ack in acks {
            // The batch's last part was acknowledged last: its durability stands for all.
            durability = ack.await?.durability;
        }
        sent += count as u64;
        if intended >= measure_from {
            measured_durability.count(durability, count as u64);
            let latency = intended.elapsed().as_micros().max(1) as u64;
            let _ = batches.record(latency);
            let _ = records.record_n(latency, count as u64);
            let _ = interval
                .lock()
                .expect("interval recorder")
                .record_n(latency, count as u64);
            bytes += (count * config.record_size) as u64;
            produced.fetch_add(count as u64, Ordering::Relaxed);
        }
    }
    sent_bytes.add(sent * record_size as u64, task.producer.batch_bytes());
    Ok(ProducerMeasures {
        records,
        batches,
        commits,
        bytes,
        durability: measured_durability,
    })
}

/// The words record values are made of: text with the redundancy of logs or JSON, so that a
/// compressed run (`--compression`) shrinks its batches about as much as real data would (zstd
/// 3-4x, LZ4 about 2x; the same bytes of 'x' shrink 100x and would flatter every codec).
pub(crate) const PAYLOAD_WORDS: [&str; 32] = [
    "order",
    "status",
    "shipped",
    "pending",
    "user",
    "session",
    "region",
    "eu-west",
    "us-east",
    "latency",
    "request",
    "response",
    "GET",
    "POST",
    "/api/v1/items",
    "200",
    "404",
    "true",
    "false",
    "null",
    "amount",
    "currency",
    "EUR",
    "USD",
    "timestamp",
    "trace",
    "span",
    "service",
    "checkout",
    "inventory",
    "payment",
    "retry",
];

/// Appends `len` bytes of value text for record `record`: a window into one pool (so nothing is
/// generated per record), wrapping around it for values longer than the pool.
pub(crate) fn put_text(out: &mut impl BufMut, record: u64, len: usize) {
    static POOL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        // A fixed linear congruential sequence: every run sends the same bytes.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut pool = Vec::with_capacity((1 << 20) + 64);
        while pool.len() < 1 << 20 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let word = PAYLOAD_WORDS[(state >> 59) as usize];
            pool.extend_from_slice(word.as_bytes());
            pool.push(if state & 0x100 == 0 { b' ' } else { b'"' });
        }
        pool
    });
    let mut start = (record.wrapping_mul(7_919) % (POOL.len() / 2) as u64) as usize;
    let mut left = len;
    while left > 0 {
        let take = left.min(POOL.len() - start);
        out.put_slice(&POOL[start..start + take]);
        left -= take;
        start = 0;
    }
}

/// Record bytes per batch byte; `None` when no batch was sent.
pub(crate) fn ratio(record_bytes: u64, batch_bytes: u64) -> Option<f64> {
    (batch_bytes > 0).then(|| record_bytes as f64 / batch_bytes as f64)
}

/// Picks record keys.
pub(crate) struct KeyChooser {
    distribution: KeyDistribution,
    keys: u64,
    rng: StdRng,
    /// Cumulative Zipf weights over the key space.
    zipf: Vec<f64>,
}

impl KeyChooser {
    pub(crate) fn new(distribution: KeyDistribution, keys: u64, seed: u64) -> KeyChooser {
        let keys = keys.max(1);
        let zipf = if distribution == KeyDistribution::Zipf {
            let mut total = 0.0;
            let mut cumulative: Vec<f64> = (1..=keys)
                .map(|rank| {
                    total += 1.0 / rank as f64;
                    total
                })
                .collect();
            for weight in &mut cumulative {
                *weight /= total;
            }
            cumulative
        } else {
            Vec::new()
        };
        KeyChooser {
            distribution,
            keys,
            rng: StdRng::seed_from_u64(seed),
            zipf,
        }
    }

    pub(crate) fn next(&mut self) -> Option<Bytes> {
        let key = match self.distribution {
            KeyDistribution::None => return None,
            KeyDistribution::Uniform => self.rng.random_range(0..self.keys),
            KeyDistribution::Zipf => {
                let draw: f64 = self.rng.random();
                self.zipf.partition_point(|weight| *weight < draw) as u64
            }
        };
        Some(Bytes::from(format!("key-{key}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::time::Duration;

    #[test]
    fn value_text_has_the_asked_length_at_any_size() {
        for len in [0, 8, 1024, 600_000, 3 << 20] {
            let mut out = Vec::new();
            put_text(&mut out, 12_345, len);
            assert_eq!(out.len(), len);
            assert!(out.iter().all(|b| b.is_ascii_graphic() || *b == b' '));
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        put_text(&mut a, 1, 64);
        put_text(&mut b, 2, 64);
        assert_ne!(a, b, "records differ");
    }

    #[test]
    fn zipf_keys_are_skewed_and_uniform_keys_are_not() {
        let mut zipf = KeyChooser::new(KeyDistribution::Zipf, 100, 1);
        let mut uniform = KeyChooser::new(KeyDistribution::Uniform, 100, 1);
        let count = |chooser: &mut KeyChooser| {
            (0..10_000)
                .filter(|_| chooser.next().unwrap() == "key-0")
                .count()
        };
        let hot = count(&mut zipf);
        let flat = count(&mut uniform);
        assert!(hot > 1000, "the top zipf key takes ~19%: {hot}");
        assert!(flat < 200, "a uniform key takes ~1%: {flat}");
        assert!(
            KeyChooser::new(KeyDistribution::None, 10, 1)
                .next()
                .is_none()
        );
    }

    #[tokio::test]
    async fn acks_are_yielded_as_they_come_in_partition_order() {
        let (sender, incoming) = tokio::sync::mpsc::unbounded_channel();
        let mut acks = AcksInFlight::new(incoming);
        let start = Instant::now();
        let mut replies = Vec::new();
        // Records 0 and 2 on partition 0, record 1 on partition 3.
        for (record, partition) in [(0u64, 0u32), (1, 3), (2, 0)] {
            let (reply, ack) = tokio::sync::oneshot::channel::<()>();
            replies.push(Some(reply));
            sender
                .send(PendingAck {
                    intended: start + Duration::from_micros(record),
                    size: record as usize,
                    partition,
                    ack,
                })
                .unwrap();
        }
        assert!(
            acks.next().now_or_never().is_none(),
            "nothing acknowledged yet"
        );

        // Partition 3's record is acknowledged first and comes first, though sent later.
        replies[1].take().unwrap().send(()).unwrap();
        let (_, size, _) = acks.next().await.unwrap().unwrap();
        assert_eq!(size, 1);
        // Record 2 is done before record 0 of its partition: it waits for record 0.
        replies[2].take().unwrap().send(()).unwrap();
        assert!(acks.next().now_or_never().is_none());
        replies[0].take().unwrap().send(()).unwrap();
        assert_eq!(acks.next().await.unwrap().unwrap().1, 0);
        assert_eq!(acks.next().await.unwrap().unwrap().1, 2);

        // Open while the sender may still send; then done.
        assert!(acks.next().now_or_never().is_none());
        drop(sender);
        assert!(acks.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_failed_ack_is_an_error() {
        let (sender, incoming) = tokio::sync::mpsc::unbounded_channel();
        let mut acks = AcksInFlight::new(incoming);
        let (reply, ack) = tokio::sync::oneshot::channel::<()>();
        sender
            .send(PendingAck {
                intended: Instant::now(),
                size: 1,
                partition: 2,
                ack,
            })
            .unwrap();
        drop(reply);
        assert!(acks.next().await.is_err());
    }
}
