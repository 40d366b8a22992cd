//! What the cleaner keeps of each batch, and the cleaned segment it writes: pure, given the
//! key map and the time.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_wire::batch::{
    Batch, BatchBuilder, BatchFormat, BatchHeader, FORMAT_VERSION, HEADER_LEN, kafka,
};

use super::offset_map::OffsetMap;
use super::transactions::{AbortedRanges, EmptiedAbort, OngoingTxns};
use crate::log::index::{IndexCadence, SegmentIndex};

/// What decides a record's fate in one clean.
pub struct Rules {
    /// Each key's last offset in `[map_start, map_end)`.
    pub map: OffsetMap,
    /// Records at or past this are beyond what the map saw, and are kept.
    pub map_end: u64,
    pub now_ms: i64,
    /// How long a tombstone stays after the clean that first kept it.
    pub delete_retention_ms: i64,
    /// Each idempotent producer's last batch (its last offset): kept, emptied if need be, so the
    /// producer's sequence survives the clean (Kafka keeps it the same way).
    pub producer_last_offsets: HashMap<i64, u64>,
    /// The log's aborted transactions: their records go.
    pub aborted: Arc<AbortedRanges>,
}

/// What a clean did, for the logs and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// Records without a key (written before the topic was compacted): Kafka's cleaner drops
    /// them too.
    pub keyless_removed: u64,
    /// Records of aborted transactions.
    pub aborted_removed: u64,
    /// Markers whose transaction held nothing any more, past their delete horizon.
    pub markers_removed: u64,
}

impl CleanStats {
    pub fn add(&mut self, other: &CleanStats) {
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.records_read += other.records_read;
        self.records_removed += other.records_removed;
        self.tombstones_removed += other.tombstones_removed;
        self.keyless_removed += other.keyless_removed;
        self.aborted_removed += other.aborted_removed;
        self.markers_removed += other.markers_removed;
    }
}

impl Rules {
    /// Whether the record at `offset` stays: not in an aborted transaction (`aborted`), the
    /// last of its key (as far as the map saw), and, a tombstone, not past its batch's delete
    /// horizon.
    fn keeps(
        &self,
        aborted: bool,
        key: Option<&[u8]>,
        is_tombstone: bool,
        offset: u64,
        horizon: Option<i64>,
    ) -> Fate {
        if aborted {
            return Fate::RemoveAborted;
        }
        if offset >= self.map_end {
            return Fate::Keep;
        }
        let Some(key) = key else {
            return Fate::RemoveKeyless;
        };
        if self.map.get(key).is_some_and(|latest| latest > offset) {
            return Fate::Remove;
        }
        if is_tombstone && horizon.is_some_and(|horizon| horizon <= self.now_ms) {
            return Fate::RemoveTombstone;
        }
        Fate::Keep
    }
}

enum Fate {
    Keep,
    Remove,
    RemoveTombstone,
    RemoveKeyless,
    RemoveAborted,
}

/// Builds one cleaned segment from the batches of the source segments it replaces, in order:
/// batches kept whole go out as they are, others rewritten as compacted batches, and runs of
/// batches that lost every record become one empty batch spanning them, so the cleaned
/// segment's batches still tile its offsets.
pub struct SegmentWriter {
    base_offset: u64,
    next_offset: u64,
    size: u64,
    /// Cleaned batches not yet handed out for writing.
    pending: Vec<Bytes>,
    index: SegmentIndex,
    cadence: IndexCadence,
    /// A run of batches that lost every record, not yet written.
    gap: Option<BatchHeader>,
    builder: BatchBuilder,
    /// Whether anything differs from the sources.
    changed: bool,
    /// The earliest delete horizon of a batch kept for a while: one holding a tombstone, or
    /// the marker of a transaction that holds nothing any more.
    delete_horizon_ms: Option<i64>,
    /// Transactions read up to here whose marker comes later (from the segments before too).
    ongoing: OngoingTxns,
}

impl SegmentWriter {
    /// A cleaned segment starting at `base_offset`, after a part of the log whose unfinished
    /// transactions are `ongoing`.
    pub fn new(base_offset: u64, index_interval_bytes: u32, ongoing: OngoingTxns) -> SegmentWriter {
        SegmentWriter {
            base_offset,
            next_offset: base_offset,
            size: 0,
            pending: Vec::new(),
            index: SegmentIndex::default(),
            cadence: IndexCadence::new(index_interval_bytes),
            gap: None,
            builder: BatchBuilder::with_capacity(64 << 10),
            changed: false,
            delete_horizon_ms: None,
            ongoing,
        }
    }

    /// The next source batch. Panics unless it starts where the previous one ended.
    pub fn push(&mut self, batch: &Batch, rules: &Rules, stats: &mut CleanStats) {
        let header = *batch.header();
        assert_eq!(
            header.base_offset,
            self.gap.map_or(self.next_offset, |gap| gap.next_offset()),
            "source batches tile the offsets"
        );
        stats.bytes_read += u64::from(header.batch_len);
        if header.is_control() {
            self.push_marker(batch, &header, rules, stats);
            return;
        }
        let horizon = header.delete_horizon_ms();
        let aborted = header.is_transactional()
            && rules
                .aborted
                .contains(header.producer_id, header.base_offset);
        let mut kept = 0u32;
        let mut tombstone_kept = false;
        let records = batch.record_count();
        stats.records_read += u64::from(records);
        // First pass: decide, without building anything (most batches of a clean part keep all).
        for record in batch.records() {
            match rules.keeps(
                aborted,
                record.key,
                record.nullable_value().is_none(),
                record.offset,
                horizon,
            ) {
                Fate::Keep => {
                    kept += 1;
                    tombstone_kept |= record.nullable_value().is_none();
                }
                Fate::Remove => stats.records_removed += 1,
                Fate::RemoveTombstone => {
                    stats.records_removed += 1;
                    stats.tombstones_removed += 1;
                }
                Fate::RemoveKeyless => {
                    stats.records_removed += 1;
                    stats.keyless_removed += 1;
                }
                Fate::RemoveAborted => {
                    stats.records_removed += 1;
                    stats.aborted_removed += 1;
                }
            }
        }
        let needs_horizon = tombstone_kept && horizon.is_none();
        let new_horizon =
            needs_horizon.then(|| rules.now_ms.saturating_add(rules.delete_retention_ms));
        if tombstone_kept && let Some(batch_horizon) = horizon.or(new_horizon) {
            self.note_horizon(batch_horizon);
        }
        let producer_keeps = header.is_idempotent()
            && rules.producer_last_offsets.get(&header.producer_id) == Some(&header.last_offset());
        let stays = kept > 0 || producer_keeps;
        if header.is_transactional() {
            self.ongoing.on_batch(header.producer_id, stays);
        }
        if kept == records && !needs_horizon {
            self.emit(batch.as_bytes().clone(), &header);
            return;
        }
        self.changed = true;
        if !stays {
            self.extend_gap(&header);
            return;
        }
        let kept = batch.records().filter(|record| {
            matches!(
                rules.keeps(
                    aborted,
                    record.key,
                    record.nullable_value().is_none(),
                    record.offset,
                    horizon
                ),
                Fate::Keep
            )
        });
        let bytes = match header.format {
            BatchFormat::Kafka => kafka::compacted(&header, new_horizon, kept),
            BatchFormat::Strata => {
                self.builder.start_compacted(&header, new_horizon);
                for record in kept {
                    self.builder.push_kept(&record);
                }
                self.builder.finish_compacted()
            }
        };
        let rewritten = BatchHeader::parse(&bytes).expect("the builders write valid batches");
        self.emit(bytes, &rewritten);
    }

    /// A marker: kept while a batch of its transaction stays; once none does, kept until its
    /// delete horizon (set by the first clean that finds it so), then removed; an abort marker
    /// also while the partition lists its transaction (see [`super::transactions`]).
    fn push_marker(
        &mut self,
        batch: &Batch,
        header: &BatchHeader,
        rules: &Rules,
        stats: &mut CleanStats,
    ) {
        stats.records_read += u64::from(batch.record_count());
        if self.ongoing.on_marker(header.producer_id) {
            self.emit(batch.as_bytes().clone(), header);
            return;
        }
        let listed = !header.marker_commits()
            && rules
                .aborted
                .lists_marker(header.producer_id, header.base_offset);
        if listed {
            self.ongoing.on_emptied_abort(EmptiedAbort {
                producer_id: header.producer_id,
                marker_offset: header.base_offset,
            });
        }
        match header.delete_horizon_ms() {
            Some(horizon) if horizon <= rules.now_ms && !listed => {
                stats.records_removed += u64::from(batch.record_count());
                stats.markers_removed += 1;
                self.changed = true;
                self.extend_gap(header);
            }
            Some(horizon) => {
                self.note_horizon(horizon);
                self.emit(batch.as_bytes().clone(), header);
            }
            None => {
                let horizon = rules.now_ms.saturating_add(rules.delete_retention_ms);
                self.note_horizon(horizon);
                self.changed = true;
                self.builder.start_compacted(header, Some(horizon));
                for record in batch.records() {
                    self.builder.push_kept(&record);
                }
                let bytes = self.builder.finish_compacted();
                let rewritten =
                    BatchHeader::parse(&bytes).expect("the builder writes valid batches");
                self.emit(bytes, &rewritten);
            }
        }
    }

    fn note_horizon(&mut self, horizon_ms: i64) {
        self.delete_horizon_ms = Some(
            self.delete_horizon_ms
                .map_or(horizon_ms, |earliest| earliest.min(horizon_ms)),
        );
    }

    /// Cleaned batches ready to be written, in order, since the last call.
    pub fn take_pending(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.pending)
    }

    /// Ends the segment: returns the last batches to write, what the segment holds, and what it
    /// learnt of transactions (for the next segment's writer).
    pub fn finish(mut self) -> (Vec<Bytes>, CleanedSegment, OngoingTxns) {
        self.flush_gap();
        let pending = std::mem::take(&mut self.pending);
        (
            pending,
            CleanedSegment {
                base_offset: self.base_offset,
                next_offset: self.next_offset,
                size: self.size,
                index: self.index,
                changed: self.changed,
                delete_horizon_ms: self.delete_horizon_ms,
            },
            self.ongoing,
        )
    }

    fn emit(&mut self, bytes: Bytes, header: &BatchHeader) {
        self.flush_gap();
        self.append(bytes, header);
    }

    fn append(&mut self, bytes: Bytes, header: &BatchHeader) {
        debug_assert_eq!(header.base_offset, self.next_offset);
        let relative = u32::try_from(header.base_offset - self.base_offset)
            .expect("a cleaned segment's offsets fit its index");
        let position = u32::try_from(self.size).expect("a cleaned segment fits u32 positions");
        if let Some(entry) = self.cadence.on_batch(
            relative,
            position,
            header.batch_len,
            header.max_timestamp_ms,
        ) {
            self.index.push(entry);
        }
        self.size += bytes.len() as u64;
        self.next_offset = header.next_offset();
        self.pending.push(bytes);
    }

    /// Adds a batch that lost every record to the run of such batches, starting a new run where
    /// the epoch changes or the run would span more offsets than a batch can.
    fn extend_gap(&mut self, header: &BatchHeader) {
        if let Some(gap) = &mut self.gap {
            let span = header.next_offset() - gap.base_offset;
            if gap.leader_epoch == header.leader_epoch && span <= u64::from(u32::MAX) {
                gap.offset_count = span as u32;
                gap.max_timestamp_ms = gap.max_timestamp_ms.max(header.max_timestamp_ms);
                return;
            }
            self.flush_gap();
        }
        self.gap = Some(BatchHeader {
            // A run of Kafka batches becomes an empty Kafka batch, which Kafka's consumers
            // read as stored.
            format: header.format,
            base_offset: header.base_offset,
            leader_epoch: header.leader_epoch,
            crc: 0,
            batch_len: HEADER_LEN as u32,
            body_len: 0,
            version: FORMAT_VERSION,
            attributes: 0,
            offset_count: header.offset_count,
            first_timestamp_ms: header.max_timestamp_ms,
            max_timestamp_ms: header.max_timestamp_ms,
            producer_id: strata_wire::batch::NO_PRODUCER_ID,
            base_sequence: strata_wire::batch::NO_SEQUENCE,
            producer_epoch: strata_wire::batch::NO_PRODUCER_EPOCH,
        });
    }

    fn flush_gap(&mut self) {
        let Some(gap) = self.gap.take() else {
            return;
        };
        let bytes = match gap.format {
            BatchFormat::Kafka => kafka::compacted(&gap, None, std::iter::empty()),
            BatchFormat::Strata => {
                self.builder.start_compacted(&gap, None);
                self.builder.finish_compacted()
            }
        };
        let header = BatchHeader::parse(&bytes).expect("the builder writes valid batches");
        self.append(bytes, &header);
    }
}

/// A cleaned segment as written.
pub struct CleanedSegment {
    pub base_offset: u64,
    pub next_offset: u64,
    pub size: u64,
    pub index: SegmentIndex,
    /// False when it holds exactly the batches of its sources.
    pub changed: bool,
    /// When its earliest tombstone or emptied transaction's marker may go (`None`: it keeps
    /// none).
    pub delete_horizon_ms: Option<i64>,
}
