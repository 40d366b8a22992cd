//! The follower side of replication: a loop per followed partition that fetches from its
//! leader over QUIC (the next fetch sent before the previous answer is appended), truncates
//! to the leader's log where they diverge, and appends what it gets.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_wire::batch::BatchHeader;
use strata_wire::protocol::{Appended, ErrorCode, Records, ReplicaFetchRequest};

use crate::io::DIRECT_BLOCK;
use crate::log::LogError;
use crate::log::writer::{LogHandle, ReplicatedBatches};
use crate::replication::Divergence;
use crate::server::quic::{QuicError, ReplicaFetchAnswer};
use crate::server::shard::{Shard, shard_of};

use super::{FETCH_AHEAD_BYTES_MIN, REPLICA_FETCH_BYTES_MAX, replica_fetch_wait_ms};

impl Shard {
    /// Where the leader's owning shard takes replication fetches for this partition.
    pub(in crate::server::shard) fn replication_target(
        &self,
        leader: i32,
        topic: &str,
        partition: u32,
    ) -> Option<(SocketAddr, String)> {
        self.replication_address(leader, |shards| shard_of(topic, partition, shards))
    }

    /// The replication (QUIC) address of shard `pick(its shard count)` of broker `broker_id`,
    /// and the name it presents.
    pub(in crate::server::shard) fn replication_address(
        &self,
        broker_id: i32,
        pick: impl FnOnce(usize) -> usize,
    ) -> Option<(SocketAddr, String)> {
        let view = self.view.borrow();
        let broker = view.brokers.iter().find(|broker| broker.id == broker_id)?;
        let shard = pick(broker.replication_ports.len().max(1));
        let port = *broker.replication_ports.get(shard)?;
        // The broker's identity (TLS server name) is its advertised host wherever it replicates.
        let host = broker.replication_host.as_deref().unwrap_or(&broker.host);
        let addr = format!("{host}:{port}").parse().ok().or_else(|| {
            use std::net::ToSocketAddrs;
            (host, port).to_socket_addrs().ok()?.next()
        })?;
        Some((addr, broker.host.clone()))
    }

    /// The next fetch, sent before the answer in hand (`bytes` long, ending at `next` in leader
    /// epoch `next_epoch`) is written: see [`Self::follow`].
    fn fetch_ahead(
        self: &Rc<Self>,
        key: &(String, u32),
        epoch: u32,
        log_end: u64,
        (next, next_epoch, bytes): (u64, u32, u64),
        (addr, host): (SocketAddr, String),
        log: &LogHandle,
    ) -> FetchAhead {
        let request = self.follower_fetch(key, epoch, next, Some(next_epoch), (log_end, log));
        // Where these records will leave the log's last block (a roll in between only costs
        // that answer's placement: it is copied instead).
        let phase = log
            .direct_phase()
            .map(|phase| (phase + bytes as usize) % DIRECT_BLOCK);
        FetchAhead::send(self, addr, host, request, phase)
    }

    /// The follower's loop: fetch from the leader, truncate where the leader says the logs
    /// diverge, append what it sends verbatim, repeat. Runs until its role ends (aborted).
    ///
    /// While the follower is behind (the answer ends below the leader's log end), the next
    /// fetch goes out before the answer is written, so the link moves bytes while the disk
    /// takes them. That fetch reports the log end as it was, so the leader counts only what is
    /// written; a caught-up follower fetches after each write, which reports it at once.
    pub(super) async fn follow(
        self: Rc<Self>,
        key: (String, u32),
        leader: i32,
        epoch: u32,
        log: LogHandle,
        high_watermark: Rc<Cell<u64>>,
    ) {
        let (topic, partition) = key.clone();
        let mut failures = 0u32;
        let backoff = |failures: &mut u32| {
            *failures += 1;
            Duration::from_millis(50 * u64::from((*failures).min(10)))
        };
        // Each pass starts from what the log says it holds: at the start, and after anything
        // other than a clean append.
        'resync: loop {
            let Some((addr, host)) = self.replication_target(leader, &topic, partition) else {
                tokio::time::sleep(backoff(&mut failures)).await;
                continue;
            };
            let info = match log.replica_info().await {
                Ok(info) => info,
                Err(error) => {
                    tracing::error!(%topic, partition, "follower stops: {error}");
                    return;
                }
            };
            let mut log_end = info.offsets.log_end;
            let mut log_start = info.offsets.log_start;
            let mut last_epoch = info.latest_epoch;
            let mut ahead: Option<FetchAhead> = None;
            loop {
                let (started, result) = match ahead.take() {
                    Some(mut ahead) => (ahead.started, ahead.answer().await),
                    None => {
                        let request =
                            self.follower_fetch(&key, epoch, log_end, last_epoch, (log_end, &log));
                        let started = Instant::now();
                        let Some(quic) = self.quic.as_ref() else {
                            return;
                        };
                        let phase = log.direct_phase();
                        (
                            started,
                            quic.replica_fetch(addr, &host, request, phase).await,
                        )
                    }
                };
                let (mut response, placed) = match result {
                    Ok(answer) => (answer.response, answer.placed),
                    Err(error) => {
                        if failures.is_multiple_of(20) {
                            tracing::warn!(%topic, partition, leader, "replication fetch failed: {error}");
                        }
                        if let QuicError::Malformed { .. } = error {
                            tracing::error!(%topic, partition, "{error}");
                        }
                        tokio::time::sleep(backoff(&mut failures)).await;
                        continue 'resync;
                    }
                };
                match response.error {
                    ErrorCode::None => {}
                    ErrorCode::OffsetOutOfRange if response.log_start_offset > log_end => {
                        // The leader's retention removed what we would fetch next.
                        tracing::warn!(%topic, partition, from = log_end, to = response.log_start_offset,
                            "the leader no longer holds our log end: starting over at its log start");
                        if let Err(error) = log.restart_at(response.log_start_offset).await {
                            tracing::error!(%topic, partition, "follower stops: {error}");
                            return;
                        }
                        continue 'resync;
                    }
                    error => {
                        // Not (yet) the leader, or a different epoch: the state will change.
                        if failures.is_multiple_of(20) {
                            tracing::info!(%topic, partition, leader, epoch, "leader refused the fetch: {error}");
                        }
                        tokio::time::sleep(backoff(&mut failures)).await;
                        continue 'resync;
                    }
                }
                failures = 0;
                if let Some(diverging) = response.diverging {
                    let divergence = Divergence {
                        epoch: u32::try_from(diverging.epoch).ok(),
                        end_offset: diverging.end_offset,
                    };
                    if truncate_diverged(
                        &log,
                        &topic,
                        partition,
                        log_end,
                        divergence,
                        &high_watermark,
                    )
                    .await
                    .is_err()
                    {
                        return;
                    }
                    continue 'resync;
                }
                let records = match placed {
                    Some(placed) => ReplicatedBatches::Placed(placed),
                    None => ReplicatedBatches::Bytes(
                        std::mem::replace(&mut response.records, Records::empty()).freeze(),
                    ),
                };
                if !records.as_slice().is_empty() {
                    let bytes = records.as_slice().len() as u64;
                    let answered_us = started.elapsed().as_micros();
                    let last = last_batch_header(records.as_slice());
                    if let Some(last) = &last
                        && last.next_offset() < response.log_end_offset
                        && bytes >= FETCH_AHEAD_BYTES_MIN
                    {
                        let after = (last.next_offset(), last.leader_epoch, bytes);
                        let target = (addr, host.clone());
                        ahead = Some(self.fetch_ahead(&key, epoch, log_end, after, target, &log));
                    }
                    match log.append_replicated(records).await {
                        Ok(appended) => {
                            tracing::trace!(%topic, partition, bytes, answered_us, appended_us = started.elapsed().as_micros(), "replicated");
                            log_end = appended.last_offset + 1;
                            last_epoch = last.map(|header| header.leader_epoch).or(last_epoch);
                            self.metrics.replicated(
                                &topic,
                                bytes,
                                started.elapsed().as_micros() as u64,
                            );
                        }
                        Err(LogError::NotContiguous { .. }) => continue 'resync,
                        Err(error) => {
                            tracing::error!(%topic, partition, "follower stops: append failed: {error}");
                            return;
                        }
                    }
                }
                let marks = (response.high_watermark, response.log_start_offset);
                match follow_marks(&log, &high_watermark, log_start, log_end, marks).await {
                    Ok(start) => log_start = start,
                    Err(error) => {
                        tracing::error!(%topic, partition, "follower stops: moving the log start failed: {error}");
                        return;
                    }
                }
            }
        }
    }

    pub(super) fn follower_fetch(
        &self,
        (topic, partition): &(String, u32),
        epoch: u32,
        fetch_offset: u64,
        last_fetched_epoch: Option<u32>,
        (log_end, log): (u64, &LogHandle),
    ) -> ReplicaFetchRequest {
        debug_assert!(log_end <= fetch_offset);
        ReplicaFetchRequest {
            replica_id: self.context.config.node_id,
            topic: topic.clone(),
            partition: *partition,
            leader_epoch: epoch,
            fetch_offset,
            last_fetched_epoch: last_fetched_epoch.map_or(-1, i64::from),
            log_end,
            max_bytes: REPLICA_FETCH_BYTES_MAX,
            max_wait_ms: replica_fetch_wait_ms(self.context.config.replica_lag_time_max_ms),
            // What the log has synced, as of its last command; never above what is reported
            // held (a truncation may have moved the log end below it since).
            synced_offset: Appended(log.synced_offset().min(log_end)),
            log_start: Appended(log.log_start_offset().min(log_end)),
        }
    }
}

/// The header of the last whole batch in a fetch answer; `None` when a header does not parse
/// (the append that follows reports why).
pub(super) fn last_batch_header(records: &[u8]) -> Option<BatchHeader> {
    let mut at = 0;
    let mut last = None;
    while at < records.len() {
        let header = BatchHeader::parse(&records[at..]).ok()?;
        at += header.batch_len as usize;
        if at > records.len() {
            return None;
        }
        last = Some(header);
    }
    last
}

/// A follower's fetch sent before the previous answer is written. Dropping it (a resync, the
/// role ending) abandons the request.
struct FetchAhead {
    started: Instant,
    task: tokio::task::JoinHandle<Result<ReplicaFetchAnswer, QuicError>>,
    addr: SocketAddr,
}

impl FetchAhead {
    fn send(
        shard: &Rc<Shard>,
        addr: SocketAddr,
        host: String,
        request: ReplicaFetchRequest,
        records_phase: Option<usize>,
    ) -> Self {
        let shard = shard.clone();
        let task = tokio::task::spawn_local(async move {
            match shard.quic.as_ref() {
                Some(quic) => {
                    quic.replica_fetch(addr, &host, request, records_phase)
                        .await
                }
                None => Err(QuicError::Stream {
                    addr,
                    reason: "no replication endpoint".into(),
                }),
            }
        });
        FetchAhead {
            started: Instant::now(),
            task,
            addr,
        }
    }

    async fn answer(&mut self) -> Result<ReplicaFetchAnswer, QuicError> {
        (&mut self.task).await.unwrap_or_else(|error| {
            Err(QuicError::Stream {
                addr: self.addr,
                reason: error.to_string(),
            })
        })
    }
}

impl Drop for FetchAhead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Takes the leader's high watermark and log start (`marks`) as far as this replica's log
/// (ending at `log_end`) holds them: the high watermark for its readers, and the log start
/// moved up when the leader's moved (DeleteRecords, retention), as Kafka's followers do.
/// Returns this replica's log start.
async fn follow_marks(
    log: &LogHandle,
    high_watermark: &Cell<u64>,
    log_start: u64,
    log_end: u64,
    (leader_high_watermark, leader_start): (u64, u64),
) -> Result<u64, LogError> {
    let known = leader_high_watermark.min(log_end);
    if known > high_watermark.get() {
        high_watermark.set(known);
    }
    let leader_start = leader_start.min(known);
    if leader_start <= log_start {
        return Ok(log_start);
    }
    log.delete_records_before(leader_start).await
}

/// Cuts the log where the leader said it diverges; the high watermark comes down with it.
/// An error (logged) stops the follower.
async fn truncate_diverged(
    log: &LogHandle,
    topic: &str,
    partition: u32,
    log_end: u64,
    divergence: Divergence,
    high_watermark: &Cell<u64>,
) -> Result<(), LogError> {
    match log.truncate_diverged(divergence).await {
        Ok(end) => {
            tracing::warn!(%topic, partition, from = log_end, to = end, ?divergence,
                "log diverged from the leader's: truncated");
            high_watermark.set(high_watermark.get().min(end));
            Ok(())
        }
        Err(error) => {
            tracing::error!(%topic, partition, "follower stops: truncation failed: {error}");
            Err(error)
        }
    }
}
