//! The consumer in assign mode: positions per partition, fetches with long-poll.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use strata_wire::batch::{Batch, BatchError, Record, split_batches};
use strata_wire::protocol::{
    AbortedTransaction, Appended, EARLIEST_TIMESTAMP, ErrorCode, FetchPartition, FetchRequest,
    FetchTopic, LATEST_TIMESTAMP, Records, Request, Response,
};

use crate::{Client, ClientError};

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Long-poll: how long a fetch waits at the end of the log.
    pub max_wait: Duration,
    pub min_bytes: u32,
    pub max_bytes: u32,
    pub partition_max_bytes: u32,
    /// Where a position the log no longer holds moves (Kafka's `auto.offset.reset`): below the
    /// log start once retention deleted it, or past the end after an unclean leader election.
    /// `None`: `poll` fails with OFFSET_OUT_OF_RANGE instead (Kafka's `none`).
    pub auto_offset_reset: Option<OffsetReset>,
    /// How long `poll` waits before returning nothing after a fetch failed in a way worth
    /// retrying (a broker down or no longer the leader), so a caller polling in a loop does not
    /// hammer it (Kafka's `retry.backoff.ms`).
    pub retry_backoff: Duration,
    /// What transactional records `poll` returns (Kafka's `isolation.level`).
    pub isolation: IsolationLevel,
}

/// Which records of transactions a consumer reads. Transaction markers are never returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Everything up to the high watermark, records of open and aborted transactions too.
    #[default]
    ReadUncommitted,
    /// Only up to the last stable offset (below every open transaction), without the records
    /// of aborted transactions.
    ReadCommitted,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            max_bytes: 50 << 20,
            partition_max_bytes: 1 << 20,
            auto_offset_reset: Some(OffsetReset::Latest),
            retry_backoff: Duration::from_millis(100),
            isolation: IsolationLevel::ReadUncommitted,
        }
    }
}

/// Which batches of one partition's answer a consumer returns: never a marker, and for
/// `read_committed` none of an aborted transaction's (Kafka's consumer does the same with the
/// aborted transactions its fetch answer lists). Fed the batches in offset order.
struct Visible {
    /// Aborted transactions by first offset, those not yet reached.
    aborted: std::collections::VecDeque<AbortedTransaction>,
    /// Producers whose aborted transaction the batches are inside.
    aborting: std::collections::HashSet<i64>,
}

impl Visible {
    fn new(mut aborted: Vec<AbortedTransaction>) -> Visible {
        aborted.sort_by_key(|txn| txn.first_offset);
        Visible {
            aborted: aborted.into(),
            aborting: Default::default(),
        }
    }

    fn keeps(&mut self, header: &strata_wire::BatchHeader) -> bool {
        while self
            .aborted
            .front()
            .is_some_and(|txn| txn.first_offset <= header.last_offset())
        {
            let txn = self.aborted.pop_front().expect("checked");
            self.aborting.insert(txn.producer_id);
        }
        if header.is_control() {
            if !header.marker_commits() {
                self.aborting.remove(&header.producer_id);
            }
            return false;
        }
        !(header.is_transactional() && self.aborting.contains(&header.producer_id))
    }
}

/// Where a consumer starts without a position of its own (a group's partition nobody
/// committed), and where it goes when its position is out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    Earliest,
    #[default]
    Latest,
}

impl OffsetReset {
    pub fn seek_to(self) -> SeekTo {
        match self {
            OffsetReset::Earliest => SeekTo::Beginning,
            OffsetReset::Latest => SeekTo::End,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTo {
    Beginning,
    End,
    Offset(u64),
    /// The first record at or after this time (the end if there is none).
    Timestamp(i64),
}

/// A fetched batch and where the consumer's position was when it was fetched: records below
/// `from_offset` were consumed before and are skipped by [`ConsumedBatch::records`].
#[derive(Debug, Clone)]
pub struct ConsumedBatch {
    pub topic: String,
    pub partition: u32,
    pub from_offset: u64,
    pub batch: Batch,
}

impl ConsumedBatch {
    /// The new records, borrowed from the batch (no copies).
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        let from = self.from_offset;
        self.batch
            .records()
            .filter(move |record| record.offset >= from)
    }
}

pub struct Consumer {
    client: Arc<Client>,
    config: ConsumerConfig,
    /// (topic, partition) → next offset to fetch.
    positions: HashMap<(String, u32), u64>,
    /// Fetches on their way, each partition in at most one (see `poll`).
    in_flight: Vec<InFlightFetch>,
    /// Batches a `poll` took (positions already past them) and has not returned yet: a poll
    /// dropped at a later await (a caller's `select!`) leaves them for the next one.
    taken: Vec<ConsumedBatch>,
    /// When metadata was last refreshed for partitions without a known leader.
    unresolved_refresh: Option<std::time::Instant>,
    /// When each partition last brought records (a count of answers taken), to ask first for
    /// those served longest ago: brokers fill an answer's `max_bytes` in request order, so a
    /// fixed order would let the first partitions' backlog starve the rest (Kafka's fetcher
    /// moves partitions that returned data to the end likewise).
    last_served: HashMap<PartitionKey, u64>,
    answers_taken: u64,
}

/// Fetches a broker shard has on their way from one consumer, each for its own share of the
/// consumer's partitions there: while one answer travels and is checked, the shard reads and
/// sends the next, where with one fetch it would idle (one consumer read 20% faster here; see
/// docs/performance.md). Kafka's fetcher keeps one per broker.
const FETCHES_PER_SHARD: usize = 2;

/// (topic, partition).
type PartitionKey = (String, u32);

/// A fetch request on its way, with what it asked for: partitions and the offsets they were
/// fetched from. Dropping it abandons the answer.
struct InFlightFetch {
    /// The broker shard asked.
    address: String,
    asked: Vec<(PartitionKey, u64)>,
    task: tokio::task::JoinHandle<Result<CheckedFetch, ClientError>>,
}

/// A fetch answer with its partitions' records already split into checked batches (CRC and
/// structure), in the answer's order. The checks run on the fetch's own task, so the answers of
/// several broker shards are checked on several cores at once rather than one after another on
/// the thread calling `poll` (a fifth of a fast consumer's time is these checks).
struct CheckedFetch {
    response: Response,
    /// Per partition: its batches, then the error that ended them if one did.
    batches: Vec<Vec<Result<Batch, BatchError>>>,
}

impl CheckedFetch {
    fn check(mut response: Response) -> CheckedFetch {
        let mut batches = Vec::new();
        if let Response::Fetch(fetch) = &mut response {
            for partition in fetch
                .topics
                .iter_mut()
                .flat_map(|t| t.partitions.iter_mut())
            {
                let records = std::mem::replace(&mut partition.records, Records::empty()).freeze();
                batches.push(split_batches(records).collect());
            }
        }
        CheckedFetch { response, batches }
    }
}

impl Drop for InFlightFetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Consumer {
    pub fn new(client: Arc<Client>, config: ConsumerConfig) -> Consumer {
        Consumer {
            client,
            config,
            positions: HashMap::new(),
            in_flight: Vec::new(),
            taken: Vec::new(),
            unresolved_refresh: None,
            last_served: HashMap::new(),
            answers_taken: 0,
        }
    }

    /// Takes `partitions` of `topic` (all of them if empty), each starting at `start`.
    pub async fn assign(
        &mut self,
        topic: &str,
        partitions: &[u32],
        start: SeekTo,
    ) -> Result<(), ClientError> {
        let metadata = self.client.metadata_for(topic).await?;
        let count = metadata.partition_count(topic)?;
        let partitions: Vec<u32> = if partitions.is_empty() {
            (0..count).collect()
        } else {
            partitions.to_vec()
        };
        for partition in partitions {
            if partition >= count {
                return Err(ClientError::UnknownPartition {
                    topic: topic.to_string(),
                    partition,
                });
            }
            self.seek(topic, partition, start).await?;
        }
        Ok(())
    }

    pub async fn seek(
        &mut self,
        topic: &str,
        partition: u32,
        to: SeekTo,
    ) -> Result<(), ClientError> {
        let offset = match to {
            SeekTo::Offset(offset) => offset,
            SeekTo::Beginning => self.list(topic, partition, EARLIEST_TIMESTAMP).await?,
            SeekTo::End => self.list(topic, partition, LATEST_TIMESTAMP).await?,
            SeekTo::Timestamp(timestamp) => {
                match self
                    .client
                    .list_offset_retrying(topic, partition, timestamp)
                    .await?
                {
                    Some(offset) => offset,
                    None => self.list(topic, partition, LATEST_TIMESTAMP).await?,
                }
            }
        };
        self.positions
            .insert((topic.to_string(), partition), offset);
        self.drop_taken(topic, partition);
        Ok(())
    }

    async fn list(&self, topic: &str, partition: u32, timestamp: i64) -> Result<u64, ClientError> {
        self.client
            .list_offset_retrying(topic, partition, timestamp)
            .await?
            .ok_or_else(|| ClientError::Protocol("no offset for earliest/latest".into()))
    }

    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        self.positions.get(&(topic.to_string(), partition)).copied()
    }

    /// Stops fetching `partition` of `topic`; returns its position.
    pub fn unassign(&mut self, topic: &str, partition: u32) -> Option<u64> {
        self.drop_taken(topic, partition);
        let key = (topic.to_string(), partition);
        self.last_served.remove(&key);
        self.positions.remove(&key)
    }

    /// Forgets batches of `partition` of `topic` a dropped `poll` left: a seek or unassign
    /// supersedes them, as it does fetches on their way.
    fn drop_taken(&mut self, topic: &str, partition: u32) {
        self.taken
            .retain(|batch| !(batch.topic == topic && batch.partition == partition));
    }

    /// Every assigned partition with its next offset.
    pub fn positions(&self) -> impl Iterator<Item = (&str, u32, u64)> {
        self.positions
            .iter()
            .map(|((topic, partition), offset)| (topic.as_str(), *partition, *offset))
    }

    /// Returns the records of the next fetch answers to arrive (possibly none, after the
    /// long-poll wait) and advances positions past them.
    ///
    /// Each broker shard leading an assigned partition has a fetch on its way at all times, as
    /// with Kafka's fetcher: `poll` waits for the first answer (taking any others that came
    /// too), and sends that shard its next fetch before returning, so brokers read and send
    /// while the caller processes, and a shard with records is never held back by another
    /// still waiting at the end of its log. A seek, assign or unassign abandons the fetch that
    /// asked for the partition's old position.
    ///
    /// Cancel-safe: records a dropped or failed `poll` had taken come with the next one.
    pub async fn poll(&mut self) -> Result<Vec<ConsumedBatch>, ClientError> {
        if !self.taken.is_empty() {
            return Ok(std::mem::take(&mut self.taken));
        }
        let positions = &self.positions;
        self.in_flight.retain(|fetch| {
            fetch
                .asked
                .iter()
                .all(|(partition, offset)| positions.get(partition) == Some(offset))
        });
        let unresolved = self.send_fetches().await?;
        if self.in_flight.is_empty() {
            if unresolved {
                self.refresh_for_unresolved().await;
                tokio::time::sleep(self.config.retry_backoff).await;
            }
            return Ok(Vec::new());
        }
        let (first, index, _) = futures_util::future::select_all(
            self.in_flight.iter_mut().map(|fetch| &mut fetch.task),
        )
        .await;
        self.in_flight.swap_remove(index);
        let mut answers = vec![first];
        while let Some(index) = self
            .in_flight
            .iter()
            .position(|fetch| fetch.task.is_finished())
        {
            let mut done = self.in_flight.swap_remove(index);
            answers.push((&mut done.task).await);
        }
        let mut consumed = Vec::new();
        let mut refresh = false;
        let mut resets = Vec::new();
        let mut failure = None;
        for answer in answers {
            let taken = answer
                .map_err(|error| ClientError::Protocol(error.to_string()))
                .and_then(|answer| {
                    self.take_answer(answer, &mut consumed, &mut refresh, &mut resets)
                });
            // The partitions of answers left untaken are fetched again from their positions.
            if let Err(error) = taken {
                failure = Some(error);
                break;
            }
        }
        // The positions are past these batches now: from here on they wait in `taken`, also
        // when this poll fails or is dropped.
        self.taken = consumed;
        if let Some(error) = failure {
            return Err(error);
        }
        if refresh {
            let _ = self.client.refresh_metadata().await;
            if self.taken.is_empty() {
                tokio::time::sleep(self.config.retry_backoff).await;
            }
        }
        for ((topic, partition), reset) in resets {
            self.seek(&topic, partition, reset.seek_to()).await?;
        }
        if self.send_fetches().await? && !refresh {
            self.refresh_for_unresolved().await;
        }
        Ok(std::mem::take(&mut self.taken))
    }

    /// Fetch requests this consumer has on their way to brokers (answered ones not yet taken
    /// by `poll` included): with partitions on one broker shard, two.
    pub fn fetches_on_the_way(&self) -> usize {
        self.in_flight.len()
    }

    /// Refreshes metadata for partitions without a known leader, at most once per
    /// `retry_backoff` (a deleted topic stays unresolved for good).
    async fn refresh_for_unresolved(&mut self) {
        let due = self
            .unresolved_refresh
            .is_none_or(|at| at.elapsed() >= self.config.retry_backoff);
        if due {
            self.unresolved_refresh = Some(std::time::Instant::now());
            let _ = self.client.refresh_metadata().await;
        }
    }

    /// Sends fetches for the assigned partitions no fetch on its way covers, to the broker
    /// shards leading them (up to [`FETCHES_PER_SHARD`] on their way to each, every partition in
    /// one), each partition from its position. Returns whether some
    /// partition has no leader known to the cached metadata (a failover under way, its topic
    /// deleted): those wait for a metadata refresh, and the others are fetched meanwhile.
    async fn send_fetches(&mut self) -> Result<bool, ClientError> {
        let covered: std::collections::HashSet<&PartitionKey> = self
            .in_flight
            .iter()
            .flat_map(|fetch| fetch.asked.iter().map(|(partition, _)| partition))
            .collect();
        if covered.len() == self.positions.len() {
            return Ok(false);
        }
        let metadata = self.client.metadata().await?;
        let shard_aware = self.client.config().shard_aware;
        let mut by_address: HashMap<String, Vec<(PartitionKey, u64)>> = HashMap::new();
        let mut unresolved = false;
        for (key, offset) in &self.positions {
            if covered.contains(key) {
                continue;
            }
            match metadata.leader_address(&key.0, key.1, shard_aware) {
                Ok(address) => by_address
                    .entry(address)
                    .or_default()
                    .push((key.clone(), *offset)),
                Err(error) => {
                    tracing::debug!(topic = %key.0, partition = key.1, "not fetched: {error}");
                    unresolved = true;
                }
            }
        }
        for (address, mut uncovered) in by_address {
            let served = |key: &PartitionKey| self.last_served.get(key).copied().unwrap_or(0);
            uncovered.sort_by(|(a, _), (b, _)| (served(a), a).cmp(&(served(b), b)));
            let on_the_way = self
                .in_flight
                .iter()
                .filter(|fetch| fetch.address == address)
                .count();
            let requests = FETCHES_PER_SHARD
                .saturating_sub(on_the_way)
                .clamp(1, uncovered.len());
            let per_request = uncovered.len().div_ceil(requests);
            while !uncovered.is_empty() {
                let rest = uncovered.split_off(per_request.min(uncovered.len()));
                let asked = std::mem::replace(&mut uncovered, rest);
                self.send_fetch(address.clone(), asked);
            }
        }
        Ok(unresolved)
    }

    /// Sends one fetch for `asked` (partitions and their positions) to `address`, its answer's
    /// batches checked on its own task.
    fn send_fetch(&mut self, address: String, asked: Vec<(PartitionKey, u64)>) {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for ((topic, partition), offset) in &asked {
            let fetch = FetchPartition {
                partition: *partition,
                fetch_offset: *offset,
                max_bytes: self.config.partition_max_bytes,
            };
            match topics.iter_mut().find(|t| t.name == *topic) {
                Some(entry) => entry.partitions.push(fetch),
                None => topics.push(FetchTopic {
                    name: topic.clone(),
                    partitions: vec![fetch],
                }),
            }
        }
        let request = Request::Fetch(FetchRequest {
            max_wait_ms: self.config.max_wait.as_millis() as u32,
            min_bytes: self.config.min_bytes,
            max_bytes: self.config.max_bytes,
            topics,
            read_committed: Appended(self.config.isolation == IsolationLevel::ReadCommitted),
        });
        let client = self.client.clone();
        let to = address.clone();
        let task = tokio::spawn(async move {
            let response = client.request(&to, request).await?;
            Ok(CheckedFetch::check(response))
        });
        self.in_flight.push(InFlightFetch {
            address,
            asked,
            task,
        });
    }

    /// Turns one fetch answer into batches past the positions, moving the positions along;
    /// notes out-of-range positions to reset and retriable errors (metadata to refresh).
    fn take_answer(
        &mut self,
        answer: Result<CheckedFetch, ClientError>,
        consumed: &mut Vec<ConsumedBatch>,
        refresh: &mut bool,
        resets: &mut Vec<(PartitionKey, OffsetReset)>,
    ) -> Result<(), ClientError> {
        let (response, mut checked) = match answer {
            Ok(CheckedFetch {
                response: Response::Fetch(response),
                batches,
            }) => (response, batches.into_iter()),
            Ok(_) => {
                return Err(ClientError::Protocol(
                    "fetch answered with another api".into(),
                ));
            }
            Err(error) if error.is_retriable() => {
                *refresh = true;
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let mut stability: HashMap<(String, u32), Vec<AbortedTransaction>> = response
            .stability
            .0
            .into_iter()
            .map(|stable| ((stable.topic, stable.partition), stable.aborted))
            .collect();
        for topic in response.topics {
            for partition in topic.partitions {
                let batches = checked.next().expect("a checked entry per partition");
                let mut visible = Visible::new(
                    stability
                        .remove(&(topic.name.clone(), partition.partition))
                        .unwrap_or_default(),
                );
                let key = (topic.name.clone(), partition.partition);
                if partition.error == ErrorCode::OffsetOutOfRange
                    && let Some(reset) = self.config.auto_offset_reset
                    && let Some(&position) = self.positions.get(&key)
                {
                    tracing::warn!(
                        topic = %topic.name,
                        partition = partition.partition,
                        position,
                        log_start = partition.log_start_offset,
                        high_watermark = partition.high_watermark,
                        "position out of range; resetting to the {}",
                        if reset == OffsetReset::Earliest { "earliest" } else { "latest" }
                    );
                    resets.push((key, reset));
                    continue;
                }
                if partition.error != ErrorCode::None {
                    if partition.error.is_retriable() {
                        *refresh = true;
                        continue;
                    }
                    return Err(ClientError::Partition {
                        topic: topic.name.clone(),
                        partition: partition.partition,
                        code: partition.error,
                    });
                }
                let Some(position) = self.positions.get_mut(&key) else {
                    continue;
                };
                if batches.iter().any(Result::is_ok) {
                    self.answers_taken += 1;
                    self.last_served.insert(key.clone(), self.answers_taken);
                }
                for batch in batches {
                    let batch = batch.map_err(|error| {
                        ClientError::Protocol(format!(
                            "{}-{}: corrupt batch from the broker: {error}",
                            topic.name, partition.partition
                        ))
                    })?;
                    if batch.last_offset() < *position {
                        continue;
                    }
                    let from_offset = *position;
                    *position = batch.last_offset() + 1;
                    if !visible.keeps(batch.header()) {
                        continue;
                    }
                    consumed.push(ConsumedBatch {
                        topic: topic.name.clone(),
                        partition: partition.partition,
                        from_offset,
                        batch,
                    });
                }
            }
        }
        Ok(())
    }
}
