//! Appends: a producer's batches stamped with offsets and checked against their producer's
//! sequence, a follower's replicated batches checked to continue the log, both written to the
//! active segment (directly, or through the page cache), rolling segments as they fill.

use super::PartitionLog;
use super::config::DirectWrites;
use super::config::PREALLOCATE_AHEAD_MIN_BYTES;
use super::config::WRITEBACK_CHUNK_BYTES;
use super::error::LogError;

use bytes::{Bytes, BytesMut};
use strata_wire::batch::{self, BatchError, BatchFormat, BatchHeader};

use super::index::SegmentIndex;
use super::producers::SequenceCheck;
use crate::io::{DIRECT_BLOCK, Storage, StorageFile};
use strata_wire::AlignedVec;

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: u64,
    pub last_offset: u64,
    pub max_timestamp_ms: i64,
    pub bytes: u64,
    /// The request was a retry of an idempotent batch the log already holds: nothing was
    /// written, and the offsets are the original batch's (`bytes` is 0).
    pub duplicate: bool,
    /// The broker's time the log stamped into the request's Kafka batches, under
    /// `message.timestamp.type=LogAppendTime` (Kafka's produce answer reports it).
    pub log_append_time_ms: Option<i64>,
}

/// Who wrote a request's batches: a client, whose batches get every check, or the partition's
/// leader writing the markers a transaction coordinator decided (control batches, which no
/// client may send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendSource {
    Producer,
    /// A producer's conditional append: written only if the log ends at this offset when its
    /// turn comes (after the requests grouped before it), else refused whole
    /// ([`LogError::LogEndMismatch`]). An idempotent retry of one already written is answered
    /// as the duplicate it is, whatever the log end is now.
    ProducerAt(u64),
    Markers,
}

/// How [`PartitionLog::stamp_request`] left a request.
pub(super) enum Stamped {
    /// Stamped and to be written; the log end after it.
    Next(u64),
    /// A retried idempotent batch: not to be written, answered with the original's offsets.
    Duplicate(AppendInfo),
}

impl AppendInfo {
    /// Summarises the stamped headers of one request.
    pub(super) fn of(headers: &[BatchHeader]) -> AppendInfo {
        let first = headers.first().expect("a request has a batch");
        let last = headers.last().expect("a request has a batch");
        AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset(),
            max_timestamp_ms: headers
                .iter()
                .map(|h| h.max_timestamp_ms)
                .max()
                .unwrap_or(i64::MIN),
            bytes: headers.iter().map(|h| u64::from(h.batch_len)).sum(),
            duplicate: false,
            log_append_time_ms: first.is_log_append_time().then_some(first.max_timestamp_ms),
        }
    }
}

/// What one write puts on disk: one request's bytes, a group's, or replicated batches received
/// where a direct write wants them.
pub(super) enum Buffers {
    One(Bytes),
    Many(Vec<Bytes>),
    Placed(PlacedBatches),
}

impl Buffers {
    pub(super) fn len(&self) -> u64 {
        self.slices().map(|b| b.len() as u64).sum()
    }

    pub(super) fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let (one, many): (Option<&[u8]>, &[Bytes]) = match self {
            Buffers::One(bytes) => (Some(bytes), &[]),
            Buffers::Many(buffers) => (None, buffers),
            Buffers::Placed(placed) => (Some(placed.batches()), &[]),
        };
        one.into_iter().chain(many.iter().map(|bytes| &bytes[..]))
    }
}

/// Replicated batches read straight into a block-aligned buffer, at `batches.start`, with room
/// before them for the segment's partial last block and after them for the padding: when
/// `batches.start % DIRECT_BLOCK` is where the segment's data ends within its last block (the
/// follower predicts it, [`PartitionLog::direct_phase`]), a direct write of them needs no copy
/// of the batches. Otherwise they are written as any other bytes.
pub struct PlacedBatches {
    pub(super) buf: AlignedVec<DIRECT_BLOCK>,
    pub(super) batches: std::ops::Range<usize>,
}

impl PlacedBatches {
    /// `buf[batches]` holds the batches; nothing follows them. The buffer should have a block
    /// of spare capacity for the padding: without it, it grows here (a copy).
    pub fn new(
        mut buf: AlignedVec<DIRECT_BLOCK>,
        batches: std::ops::Range<usize>,
    ) -> PlacedBatches {
        assert_eq!(batches.end, buf.len(), "the batches end the buffer");
        buf.reserve(DIRECT_BLOCK);
        PlacedBatches { buf, batches }
    }

    pub fn batches(&self) -> &[u8] {
        &self.buf[self.batches.clone()]
    }

    /// The batches as `Bytes`, without a copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self.buf).slice(self.batches)
    }
}

impl<S: Storage> PartitionLog<S> {
    /// Validates `batches` (one or more whole batches, back to back, as a producer sent them),
    /// stamps consecutive base offsets and `leader_epoch` into them in place, and writes them
    /// with one IO. Nothing is written if any batch is invalid. Does not sync: see [`Self::flush`].
    pub async fn append(
        &mut self,
        mut batches: BytesMut,
        leader_epoch: u32,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.check_writable()?;
        self.roll_ahead(batches.len() as u64, now_ms).await?;
        self.headers.clear();
        let stamped = self.stamp_request(
            &mut batches,
            leader_epoch,
            AppendSource::Producer,
            self.log_end_offset(),
            now_ms,
        )?;
        if let Stamped::Duplicate(info) = stamped {
            return Ok(info);
        }
        self.write_batches(Buffers::One(batches.freeze()), false, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// Appends several producers' requests back to back: all are validated and stamped first,
    /// then written in order (see `StorageFile::write_all_in_order_at`). Each request is
    /// validated on its own: a bad one fails alone and the others are written. Results come
    /// back in request order. A retried idempotent batch is answered with its original offsets
    /// and not written; if the original is in this same group, it shares the group's fate.
    pub async fn append_group(
        &mut self,
        requests: Vec<(BytesMut, u32)>,
        now_ms: i64,
    ) -> Vec<Result<AppendInfo, LogError>> {
        let requests = requests
            .into_iter()
            .map(|(batches, leader_epoch)| (batches, leader_epoch, AppendSource::Producer))
            .collect();
        self.append_group_from(requests, now_ms).await
    }

    /// [`Self::append_group`] of requests from producers and from coordinators' markers.
    pub async fn append_group_from(
        &mut self,
        requests: Vec<(BytesMut, u32, AppendSource)>,
        now_ms: i64,
    ) -> Vec<Result<AppendInfo, LogError>> {
        let mut results: Vec<Option<Result<AppendInfo, LogError>>> =
            (0..requests.len()).map(|_| None).collect();
        let incoming: usize = requests.iter().map(|(batches, ..)| batches.len()).sum();
        let ready = match self.check_writable() {
            Ok(()) => self.roll_ahead(incoming as u64, now_ms).await,
            Err(error) => Err(error),
        };
        if let Err(error) = ready {
            return results.iter().map(|_| Err(error.clone())).collect();
        }
        self.headers.clear();
        let mut buffers = Vec::with_capacity(requests.len());
        let mut spans = Vec::with_capacity(requests.len());
        let group_start = self.log_end_offset();
        let mut next_offset = group_start;
        // Retries of batches written by this very group: answered only if the write succeeds.
        let mut duplicates_in_group = Vec::new();
        for (at, (mut batches, leader_epoch, source)) in requests.into_iter().enumerate() {
            let first_header = self.headers.len();
            match self.stamp_request(&mut batches, leader_epoch, source, next_offset, now_ms) {
                Ok(Stamped::Next(next)) => {
                    next_offset = next;
                    buffers.push(batches.freeze());
                    spans.push((at, first_header..self.headers.len()));
                }
                Ok(Stamped::Duplicate(info)) if info.last_offset >= group_start => {
                    duplicates_in_group.push((at, info));
                }
                Ok(Stamped::Duplicate(info)) => results[at] = Some(Ok(info)),
                Err(error) => {
                    self.headers.truncate(first_header);
                    results[at] = Some(Err(error));
                }
            }
        }
        assert!(duplicates_in_group.is_empty() || !buffers.is_empty());
        if !buffers.is_empty() {
            match self
                .write_batches(Buffers::Many(buffers), false, now_ms)
                .await
            {
                Ok(()) => {
                    for (at, headers) in spans {
                        results[at] = Some(Ok(AppendInfo::of(&self.headers[headers])));
                    }
                    for (at, info) in duplicates_in_group {
                        results[at] = Some(Ok(info));
                    }
                }
                Err(error) => {
                    for (at, _) in spans {
                        results[at] = Some(Err(error.clone()));
                    }
                    for (at, _) in duplicates_in_group {
                        results[at] = Some(Err(error.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every request has a result"))
            .collect()
    }

    /// Validates every batch of one request, stamps consecutive offsets from `next_offset` and
    /// the epoch in place, and appends the headers to `self.headers`. Returns the next offset,
    /// or, for a retried idempotent batch, the original's offsets (its header is not kept).
    /// An idempotent batch that passes its producer check is applied to the producer state here.
    pub(super) fn stamp_request(
        &mut self,
        batches: &mut BytesMut,
        leader_epoch: u32,
        source: AppendSource,
        mut next_offset: u64,
        now_ms: i64,
    ) -> Result<Stamped, LogError> {
        if let Some(latest) = self.epochs.latest_epoch()
            && leader_epoch < latest
        {
            return Err(LogError::StaleEpoch {
                epoch: leader_epoch,
                latest,
            });
        }
        let first_header = self.headers.len();
        let start = next_offset;
        let mut idempotent = false;
        // A Kafka producer's conditional append: its first record's header names the offset.
        let mut kafka_expected = None;
        let mut at = 0;
        while at < batches.len() {
            let index = self.headers.len() - first_header;
            let checked = match source {
                AppendSource::Markers => check_marker(&batches[at..]),
                AppendSource::Producer | AppendSource::ProducerAt(_) => {
                    batch::check_produced_batch(&batches[at..], self.config.cleanup.compact).map(
                        |produced| {
                            if index == 0 {
                                kafka_expected = produced.expected_offset;
                            }
                            produced.header
                        },
                    )
                }
            };
            let mut header = checked.map_err(|source| LogError::CorruptBatch { index, source })?;
            let batch_len = header.batch_len as usize;
            let batch = &mut batches[at..at + batch_len];
            batch::stamp(batch, next_offset, leader_epoch);
            if header.format == BatchFormat::Kafka && source != AppendSource::Markers {
                // As Kafka's broker does: under LogAppendTime the broker's time, else the
                // records' max timestamp where the producer's header disagreed (the CRC
                // recomputed only when either changes a field).
                let log_append_time = self.config.log_append_time;
                if log_append_time {
                    header.max_timestamp_ms = now_ms;
                    header.attributes |= batch::attributes::KAFKA_LOG_APPEND_TIME;
                }
                batch::set_kafka_timestamps(batch, header.max_timestamp_ms, log_append_time);
            }
            header.base_offset = next_offset;
            header.leader_epoch = leader_epoch;
            next_offset = header.next_offset();
            idempotent |= header.is_idempotent();
            self.headers.push(header);
            at += batch_len;
        }
        if self.headers.len() == first_header {
            return Err(LogError::CorruptBatch {
                index: 0,
                source: BatchError::TooShort {
                    needed: batch::HEADER_LEN,
                    available: 0,
                },
            });
        }
        if source == AppendSource::Markers {
            return self.check_markers(first_header, next_offset);
        }
        let expected = match source {
            AppendSource::ProducerAt(expected) => Some(expected),
            _ => kafka_expected,
        };
        if idempotent {
            return self.check_producer(first_header, (start, next_offset), expected);
        }
        self.check_log_end(first_header, start, expected)?;
        Ok(Stamped::Next(next_offset))
    }

    /// A conditional request's condition: the log ends (this request starts) where expected.
    /// Its headers go when it does not.
    fn check_log_end(
        &mut self,
        first_header: usize,
        start: u64,
        expected: Option<u64>,
    ) -> Result<(), LogError> {
        match expected {
            Some(expected) if expected != start => {
                self.headers.truncate(first_header);
                Err(LogError::LogEndMismatch {
                    expected,
                    log_end: start,
                })
            }
            _ => Ok(()),
        }
    }

    /// A marker request holds one marker, of a producer epoch no newer marker or batch has
    /// fenced (a coordinator that lost its id to a newer one must not close the newer one's
    /// transaction). Applied, as a producer's batch is, before the write.
    fn check_markers(
        &mut self,
        first_header: usize,
        next_offset: u64,
    ) -> Result<Stamped, LogError> {
        let [header] = self.headers[first_header..] else {
            return Err(LogError::InvalidProducerBatch(format!(
                "a marker request holds one marker; this one holds {} batches",
                self.headers.len() - first_header
            )));
        };
        self.producers.check_marker(
            header.producer_id,
            header.producer_epoch,
            header.marker_coordinator_epoch(),
        )?;
        self.producers.apply(&header);
        Ok(Stamped::Next(next_offset))
    }

    /// The producer rules for a stamped idempotent request (`self.headers[first_header..]`):
    /// refuse it, answer it as a duplicate (dropping its header), or apply it and let it be
    /// written. Applied before the write: a failed write stops the log, and reopening rebuilds
    /// the state from what reached the disk.
    pub(super) fn check_producer(
        &mut self,
        first_header: usize,
        (start, next_offset): (u64, u64),
        expected: Option<u64>,
    ) -> Result<Stamped, LogError> {
        let headers = &self.headers[first_header..];
        if headers.len() != 1 {
            return Err(LogError::InvalidProducerBatch(format!(
                "an idempotent batch must be alone in its request; this one holds {} batches",
                headers.len()
            )));
        }
        let header = headers[0];
        if header.producer_id < 0 || header.producer_epoch < 0 || header.base_sequence < 0 {
            return Err(LogError::InvalidProducerBatch(format!(
                "producer id {}, epoch {}, base sequence {}: none may be negative",
                header.producer_id, header.producer_epoch, header.base_sequence
            )));
        }
        match self.producers.check(&header)? {
            SequenceCheck::Append => {
                self.check_log_end(first_header, start, expected)?;
                self.producers.apply(&header);
                Ok(Stamped::Next(next_offset))
            }
            SequenceCheck::Duplicate {
                base_offset,
                last_offset,
            } => {
                self.headers.truncate(first_header);
                Ok(Stamped::Duplicate(AppendInfo {
                    base_offset,
                    last_offset,
                    max_timestamp_ms: header.max_timestamp_ms,
                    bytes: 0,
                    duplicate: true,
                    log_append_time_ms: None,
                }))
            }
        }
    }

    /// Appends batches a leader already stamped (the follower path), verbatim.
    pub async fn append_replicated(
        &mut self,
        batches: Bytes,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.take_compacted_overlap(&batches, now_ms).await?;
        self.roll_ahead(batches.len() as u64, now_ms).await?;
        self.check_replicated(&batches)?;
        self.write_batches(Buffers::One(batches), true, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// [`Self::append_replicated`] for batches received into place for a direct write.
    pub async fn append_replicated_placed(
        &mut self,
        placed: PlacedBatches,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.take_compacted_overlap(placed.batches(), now_ms)
            .await?;
        self.roll_ahead(placed.batches().len() as u64, now_ms)
            .await?;
        self.check_replicated(placed.batches())?;
        self.write_batches(Buffers::Placed(placed), true, now_ms)
            .await?;
        Ok(AppendInfo::of(&self.headers))
    }

    /// A follower behind its leader's cleaner may fetch from inside a compacted batch that spans
    /// offsets the follower holds as written (the leader's cleaner merged a run of batches that
    /// lost every record into one). The leader's clean says nothing at those offsets survives,
    /// so the follower drops its own batches from where the leader's begins and takes it.
    async fn take_compacted_overlap(
        &mut self,
        batches: &[u8],
        now_ms: i64,
    ) -> Result<(), LogError> {
        let Ok(first) = BatchHeader::parse(batches) else {
            return Ok(());
        };
        let end = self.log_end_offset();
        if first.is_compacted()
            && first.base_offset < end
            && first.next_offset() > end
            && first.base_offset >= self.log_start_offset()
        {
            tracing::info!(
                dir = %self.dir.display(),
                from = first.base_offset,
                to = end,
                "replacing offsets the leader's cleaner emptied"
            );
            self.truncate_to(first.base_offset, now_ms).await?;
        }
        Ok(())
    }

    /// Where the next replicated batches should start within a block for a direct write of them
    /// to need no copy (see [`PlacedBatches`]); `None` when this log never writes them direct.
    /// (Batches that go through the page cache are written wherever they lie.)
    pub fn direct_phase(&self) -> Option<usize> {
        let active = self.active();
        (self.config.direct_writes != DirectWrites::Never && active.log.writes_direct())
            .then(|| (active.size % DIRECT_BLOCK as u64) as usize)
    }

    /// Validates replicated batches into `self.headers`: whole and undamaged (the CRC: the leader
    /// checked their bodies, so a follower does not decompress or walk them again), contiguous
    /// with the log, no older epoch than the log's; applies idempotent ones to the producer state.
    pub(super) fn check_replicated(&mut self, batches: &[u8]) -> Result<(), LogError> {
        self.check_writable()?;
        self.headers.clear();
        let mut expected = self.log_end_offset();
        let mut at = 0;
        while at < batches.len() {
            let index = self.headers.len();
            let header = batch::check_integrity(&batches[at..])
                .map_err(|source| LogError::CorruptBatch { index, source })?;
            if header.base_offset != expected {
                return Err(LogError::NotContiguous {
                    expected,
                    got: header.base_offset,
                });
            }
            let latest = self
                .headers
                .last()
                .map(|h| h.leader_epoch)
                .or(self.epochs.latest_epoch());
            if let Some(latest) = latest
                && header.leader_epoch < latest
            {
                return Err(LogError::StaleEpoch {
                    epoch: header.leader_epoch,
                    latest,
                });
            }
            expected = header.next_offset();
            at += header.batch_len as usize;
            self.headers.push(header);
        }
        if self.headers.is_empty() {
            return Err(LogError::CorruptBatch {
                index: 0,
                source: BatchError::TooShort {
                    needed: batch::HEADER_LEN,
                    available: 0,
                },
            });
        }
        // The leader checked them; a follower records them as they are, so that it holds the
        // leader's producer state if it becomes leader.
        for header in &self.headers {
            self.producers.apply(header);
        }
        Ok(())
    }

    /// Writes validated, stamped batches (`self.headers` describes them) at the end of the log:
    /// past the page cache where `direct_writes` sends this kind of append (`replicated`: a
    /// follower's), it is large enough, and the file system allows it.
    pub(super) async fn write_batches(
        &mut self,
        buffers: Buffers,
        replicated: bool,
        now_ms: i64,
    ) -> Result<(), LogError> {
        let last = *self.headers.last().expect("at least one batch");
        let mut new_epoch = false;
        for header in &self.headers {
            if self
                .epochs
                .latest_epoch()
                .is_none_or(|latest| header.leader_epoch > latest)
            {
                new_epoch |= self.epochs.assign(header.leader_epoch, header.base_offset);
            }
        }
        if new_epoch {
            // Before the batches: a batch on disk whose epoch the file lacks would give wrong
            // answers to followers asking where an epoch ends.
            self.persist_epochs().await?;
        }
        let total = buffers.len();
        debug_assert_eq!(
            total,
            self.headers
                .iter()
                .map(|h| u64::from(h.batch_len))
                .sum::<u64>()
        );
        let roll = self.should_roll(total, last.last_offset(), now_ms);
        if roll && let Err(error) = self.roll(now_ms).await {
            if self.headers.iter().any(BatchHeader::is_idempotent) {
                // The producer state already counts these batches: it must not outlive them.
                return Err(self.fail(format!("rolling a segment failed: {error}")));
            }
            return Err(error);
        }
        let position = self.active().size;
        self.reserve_ahead(position + total).await;
        let min_bytes = self.config.direct_write_min_bytes;
        let direct = match self.config.direct_writes {
            DirectWrites::Never => false,
            DirectWrites::Replicated => replicated && total >= min_bytes,
            DirectWrites::Auto if replicated => self.replicated_appends.choose(total, min_bytes),
            DirectWrites::Auto => self.own_appends.choose(total, min_bytes),
            DirectWrites::Always => total >= min_bytes,
        } && self.active().log.writes_direct();
        // Shared, not copied: the cache keeps the request buffers themselves.
        let cached: Vec<Bytes> = match &buffers {
            Buffers::One(bytes) if !replicated && self.caches_tail() => vec![bytes.clone()],
            Buffers::Many(many) if !replicated && self.caches_tail() => many.clone(),
            _ => Vec::new(),
        };
        let written = if direct {
            self.active_mut().write_direct(buffers).await
        } else {
            let active = self.active_mut();
            // The page cache now holds the tail block; the copy kept for direct writes is stale.
            active.direct_tail = None;
            match buffers {
                Buffers::One(bytes) => active.log.write_all_at(bytes, position).await,
                Buffers::Many(buffers) => active.log.write_all_in_order_at(buffers, position).await,
                Buffers::Placed(placed) => {
                    active.log.write_all_at(placed.into_bytes(), position).await
                }
            }
        };
        if let Err(error) = written {
            let path = self.segment_path(self.active().base_offset, "log");
            return Err(self.fail(format!("write to {} failed: {error}", path.display())));
        }
        if direct {
            // On its way to the disk already: nothing for writeback to start.
            self.active_mut().writeback_from = position + total;
        } else {
            self.hint_writeback(position + total).await;
        }
        if cached.is_empty() {
            // Not kept (a follower's append, or a log that does not cache): what the cache
            // holds no longer reaches the log end.
            self.tail_cache.clear();
        }
        for bytes in cached {
            self.tail_cache.push(bytes);
        }
        let mut batch_position = position;
        let headers = std::mem::take(&mut self.headers);
        let active = self.active_mut();
        for header in &headers {
            active.on_batch(header, batch_position);
            batch_position += u64::from(header.batch_len);
        }
        active.size += total;
        active.dirty = true;
        self.headers = headers;
        if roll {
            // Here, not in `roll`: only now does the producer state match the log end.
            self.snapshot_producers(now_ms).await;
        }
        Ok(())
    }

    /// Hands written bytes to the kernel's writeback in chunks of [`WRITEBACK_CHUNK_BYTES`]
    /// (`sync_file_range(WRITE)`, which does not wait), so a later `fdatasync` finds most of
    /// them on their way to the disk instead of all at once, and, whatever the flush policy,
    /// dirty pages never pile up for the kernel's flusher to write back in bursts: each burst
    /// took a core for a while and a shard waited behind it (`flush=never` at 300,000
    /// records/s: ack p99 1.8–9.0 ms without these hints, 0.8–1.5 ms with them).
    /// Not per write: the call runs on the shard thread and submits block IO there, and on
    /// small appends it cost a third of a shard's time (one disk request and one virtio
    /// notification per 1 KiB record at 20,000 records/s, measured with `perf`).
    pub(super) async fn hint_writeback(&mut self, written_to: u64) {
        let active = self.active_mut();
        let from = active.writeback_from;
        if written_to < from + WRITEBACK_CHUNK_BYTES {
            return;
        }
        active.writeback_from = written_to;
        if let Err(error) = active.log.start_writeback(from, written_to - from).await {
            tracing::debug!("sync_file_range hint failed: {error}");
        }
    }

    /// Reserves the active segment's blocks ahead of an append that ends at `end` (see
    /// [`PREALLOCATE_STEP_BYTES`]): once appends come within half of `ahead` of the
    /// reservation, one `fallocate` (on the ring, so the shard serves others meanwhile)
    /// reserves up to the `ahead` boundary past `end`, never past the segment's size limit.
    /// `ahead` grows with the segment up to the step ([`PREALLOCATE_AHEAD_MIN_BYTES`]). Not
    /// fatal when it fails: the append then allocates as it writes, as it would without
    /// reservation.
    pub(super) async fn reserve_ahead(&mut self, end: u64) {
        let step = self.config.preallocate_step_bytes;
        if step == 0 || self.config.preallocate {
            return;
        }
        let limit = self.config.segment_bytes.max(end);
        let ahead = step.min(end.max(PREALLOCATE_AHEAD_MIN_BYTES).next_power_of_two());
        let active = self.active_mut();
        if end + ahead / 2 <= active.reserved_to {
            return;
        }
        let from = active.reserved_to.max(active.size);
        let to = (end + ahead).next_multiple_of(ahead).min(limit);
        if to <= from {
            return;
        }
        // Not retried within this step when it fails: a file system without `fallocate`
        // would otherwise pay a failed call per append.
        active.reserved_to = to;
        if let Err(error) = active.log.allocate(from, to - from).await {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "reserving segment blocks ahead of appends failed (appends allocate as they write; further failures are not logged): {error}"
                );
            });
        }
    }

    pub(super) fn should_roll(
        &self,
        incoming_bytes: u64,
        incoming_last_offset: u64,
        now_ms: i64,
    ) -> bool {
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        let too_big = active.size + incoming_bytes > self.config.segment_bytes;
        let too_old = self
            .config
            .segment_ms
            .is_some_and(|segment_ms| now_ms - active.opened_at_ms >= segment_ms);
        let offsets_overflow = incoming_last_offset - active.base_offset > u64::from(u32::MAX);
        too_big || too_old || offsets_overflow
    }

    /// Rolls before an append of `incoming_bytes` that would not fit the active segment (or
    /// finds it too old), while the producer state still matches the log end: the snapshot
    /// taken here is the state at the new segment's base, which a tiered partition uploads
    /// with the segment it closes. Sized by the bytes, an upper bound of the records too.
    /// `write_batches` rolls as well, should this not have.
    async fn roll_ahead(&mut self, incoming_bytes: u64, now_ms: i64) -> Result<(), LogError> {
        let end = self.log_end_offset();
        if !self.should_roll(incoming_bytes, end + incoming_bytes, now_ms) {
            return Ok(());
        }
        self.roll(now_ms).await?;
        self.snapshot_producers(now_ms).await;
        Ok(())
    }

    /// Starts a new active segment at the log end.
    pub(super) async fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let base = self.log_end_offset();
        let (storage, dir) = (self.storage.clone(), self.dir.clone());
        let previous = self.active_mut();
        if let Err(error) = previous.persist_index(&storage, &dir).await {
            tracing::warn!(
                "writing index of segment {} failed: {error}",
                previous.base_offset
            );
        }
        // Closed segments keep no index in memory (see `index_entry`).
        previous.index = SegmentIndex::default();
        if let Err(error) = previous.trim().await {
            tracing::warn!(
                "trimming segment {} to its data failed: {error}",
                previous.base_offset
            );
        }
        let segment = self.create_segment(base, now_ms).await?;
        self.segments.push(segment);
        tracing::debug!(dir = %self.dir.display(), "rolled to segment {base}");
        Ok(())
    }
}

/// The checks for a marker the leader built itself: whole and undamaged, a control batch of a
/// producer.
fn check_marker(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = batch::check_integrity(bytes)?;
    if !header.is_control() || header.producer_id < 0 || header.producer_epoch < 0 {
        return Err(BatchError::InconsistentRecord {
            index: 0,
            what: "a marker is a control batch of a producer",
        });
    }
    Ok(header)
}
