//! Reads: whole batches from an offset, from the tail cache or a segment file, planned on the
//! shard and run as file IO that needs no borrow of the log; for sending, a range of a segment
//! file when the batches are large enough for `sendfile`; and the offset of a timestamp.

use super::PartitionLog;
use super::error::LogError;
use super::segment;
use std::ops::ControlFlow;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use strata_wire::batch::{self, Batch, BatchFormat, BatchHeader};

use super::index::SegmentIndex;
use super::segment::{SCAN_CHUNK_BYTES, file_name};
use crate::io::{Storage, StorageFile};

/// Smallest read sent from the file (`sendfile`) instead of memory: below it, the header
/// reads and the descriptor cost more than the copy they save.
pub const REGION_MIN_BYTES: usize = 256 << 10;

/// Batch headers a file region is looked for through; logs of smaller batches are read.
pub(super) const REGION_HEADERS_MAX: usize = 128;

/// Headers read before judging whether the batches are large enough for a region.
pub(super) const REGION_HEADERS_PROBE: usize = 8;

/// What a read for sending found: bytes in memory, or a range of a segment file.
#[derive(Debug)]
pub enum Served {
    Bytes(Bytes),
    Region(FileRegion),
}

/// Whole batches as a range of a segment file, with a descriptor of the file of its own (so the
/// range can be sent from another task or shard, and a segment deleted meanwhile stays
/// readable). A truncation of the file before the range is sent shortens what `sendfile`
/// finds; the sender must then drop the connection, as the frame cannot be completed.
#[derive(Debug)]
pub struct FileRegion {
    pub file: std::os::fd::OwnedFd,
    pub position: u64,
    pub len: usize,
    /// Records in the range, and the newest timestamp among them.
    pub records: u64,
    pub newest_ms: Option<i64>,
    /// Every batch in the range is a Kafka batch: a Kafka consumer takes the range as it is.
    pub kafka_only: bool,
    /// The range's batches, in order, as their headers were read to find it.
    pub batches: Vec<RegionBatch>,
}

/// One batch of a [`FileRegion`]: its header, and where it starts in the region.
#[derive(Debug, Clone, Copy)]
pub struct RegionBatch {
    pub header: BatchHeader,
    pub at: u64,
}

impl FileRegion {
    /// Narrows the region to its batches `first..=last` (indexes into
    /// [`FileRegion::batches`]): what a share acquisition hands out of what it read.
    pub fn narrow(&mut self, first: usize, last: usize) {
        assert!(
            first <= last && last < self.batches.len(),
            "batches within the region"
        );
        self.batches.truncate(last + 1);
        self.batches.drain(..first);
        let start = self.batches[0].at;
        let end = self
            .batches
            .last()
            .map_or(start, |batch| batch.at + u64::from(batch.header.batch_len));
        for batch in &mut self.batches {
            batch.at -= start;
        }
        self.position += start;
        self.len = (end - start) as usize;
        self.records = self
            .batches
            .iter()
            .map(|b| u64::from(b.header.offset_count))
            .sum();
        self.newest_ms = self.batches.iter().map(|b| b.header.max_timestamp_ms).max();
        self.kafka_only = self
            .batches
            .iter()
            .all(|b| b.header.format == BatchFormat::Kafka);
    }
}

/// A read for sending planned by [`PartitionLog::plan_read_for_sending`]: one of three outcomes.
pub enum PlannedSend<F> {
    /// A range of a segment file, to send as it is (`sendfile`).
    Region(FileRegion),
    /// Bytes at hand without IO (from the tail cache, or nothing to read).
    Ready(Bytes),
    /// Bytes to read from a segment file first: run it.
    File(FileRead<F>),
}

/// A read planned by [`PartitionLog::plan_read`].
pub enum PlannedRead<F> {
    /// Answered without IO (from the tail cache, or nothing to read).
    Ready(Bytes),
    /// Answered from a segment file: run it.
    File(FileRead<F>),
}

/// The file IO of a read, with what it needs of the log taken along: the segment's file (shared:
/// a segment deleted meanwhile stays readable, as with `sendfile`), its data size when planned
/// (bytes below it do not change while the log appends), and where to start.
pub struct FileRead<F> {
    pub(super) log: Rc<F>,
    pub(super) size: u64,
    pub(super) base_offset: u64,
    pub(super) dir: Rc<Path>,
    /// A batch start at or before the batch holding `offset`.
    pub(super) start: u64,
    /// How much to read first.
    pub(super) window: usize,
    pub(super) offset: u64,
    pub(super) max_bytes: usize,
    pub(super) max_offset: u64,
}

impl<F: StorageFile> FileRead<F> {
    /// Reads and returns whole batches as [`PartitionLog::read`] describes.
    pub async fn run(self) -> Result<Bytes, LogError> {
        let FileRead {
            log,
            size,
            base_offset,
            dir,
            start,
            window,
            offset,
            max_bytes,
            max_offset,
        } = self;
        // The path is made only for an error: a read is on every fetch's path.
        let read_at = |position: u64, len: usize| {
            let (log, dir) = (&log, &dir);
            async move {
                segment::read_file(log.as_ref(), size, position, len)
                    .await
                    .map_err(|source| LogError::Io {
                        what: "read",
                        path: dir.join(file_name(base_offset, "log")),
                        source: Arc::new(source),
                    })
            }
        };
        // Walk batch headers from the index entry: skip batches below `offset` (their bytes need
        // not be in the chunk), then take whole batches while the budget allows.
        let mut chunk = read_at(start, window).await?;
        let mut chunk_position = start;
        let mut position = start;
        let mut first: Option<usize> = None;
        while position < size {
            let at = (position - chunk_position) as usize;
            let rest = chunk.get(at..).unwrap_or_default();
            if rest.is_empty() && first.is_some() {
                break; // the window ended at a batch start (the index's)
            }
            let header = match BatchHeader::parse(rest) {
                Ok(header) => header,
                Err(_) if first.is_none() && rest.len() < batch::HEADER_LEN => {
                    chunk = read_at(position, window).await?;
                    chunk_position = position;
                    continue;
                }
                Err(error) => {
                    // Batches were validated before they were written; a bad header here means
                    // the file changed underneath us (a truncation since the read was planned).
                    tracing::error!(dir = %dir.display(), "unreadable batch header at position {position}: {error}");
                    break;
                }
            };
            let batch_len = header.batch_len as usize;
            if header.next_offset() > max_offset {
                break;
            }
            if header.next_offset() <= offset {
                position += batch_len as u64;
                continue;
            }
            if let Some(first) = first
                && at - first + batch_len > max_bytes
            {
                break;
            }
            if batch_len > rest.len() {
                if first.is_some() {
                    break;
                }
                // The first wanted batch does not fit the window: read exactly it and the budget.
                chunk = read_at(position, batch_len.max(max_bytes)).await?;
                chunk_position = position;
                continue;
            }
            first.get_or_insert(at);
            position += batch_len as u64;
        }
        Ok(match first {
            Some(first) => chunk.slice(first..(position - chunk_position) as usize),
            None => Bytes::new(),
        })
    }
}

impl<S: Storage> PartitionLog<S> {
    /// The batches [`PartitionLog::read`] would return, as a range of their segment file where
    /// that is the cheaper way to send them: at least [`REGION_MIN_BYTES`], every page in the
    /// page cache now (so `sendfile` never waits for the disk on a shard thread), not held by the
    /// tail cache, on a backend with file descriptors. Otherwise read into memory.
    pub async fn read_for_sending(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Served, LogError> {
        match self
            .plan_read_for_sending(offset, max_bytes, max_offset)
            .await?
        {
            PlannedSend::Region(region) => Ok(Served::Region(region)),
            PlannedSend::Ready(bytes) => Ok(Served::Bytes(bytes)),
            PlannedSend::File(read) => read.run().await.map(Served::Bytes),
        }
    }

    /// [`PartitionLog::read_for_sending`] up to its file IO, as [`PartitionLog::plan_read`].
    pub async fn plan_read_for_sending(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<PlannedSend<S::File>, LogError> {
        if let Some(region) = self.file_region(offset, max_bytes, max_offset).await? {
            return Ok(PlannedSend::Region(region));
        }
        Ok(match self.plan_read(offset, max_bytes, max_offset).await? {
            PlannedRead::Ready(bytes) => PlannedSend::Ready(bytes),
            PlannedRead::File(read) => PlannedSend::File(read),
        })
    }

    /// See [`PartitionLog::read_for_sending`]. Finds the batches by their headers alone (a
    /// small read each, at most [`REGION_HEADERS_MAX`]); `None` wherever `read` should decide.
    pub(super) async fn file_region(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Option<FileRegion>, LogError> {
        let max_offset = max_offset.min(self.log_end_offset());
        if max_bytes < REGION_MIN_BYTES
            || offset < self.log_start_offset()
            || offset >= max_offset
            || self.tail_cache.holds(offset)
        {
            return Ok(None);
        }
        let at = self.segment_holding(offset);
        let relative = (offset - self.segments[at].base_offset) as u32;
        let mut position = self
            .index_entry(at, |index| index.floor_by_offset(relative).copied())
            .await?
            .map_or(0, |entry| u64::from(entry.position));
        let segment = &self.segments[at];
        // A consumer near the log end (the usual case) is answered from memory at no cost.
        let left = segment.size.saturating_sub(position);
        if left < REGION_MIN_BYTES as u64 {
            return Ok(None);
        }
        // Not cached (written direct, or evicted): walking its headers would read them from the
        // disk one by one, only to find the range cannot be sent from the page cache.
        if !segment.log.is_cached(position, left.min(max_bytes as u64)) {
            return Ok(None);
        }
        let (mut first, mut records, mut newest_ms) = (None::<u64>, 0u64, None::<i64>);
        let mut kafka_only = true;
        let mut batches = Vec::new();
        for walked in 0..REGION_HEADERS_MAX {
            if position >= segment.size {
                break;
            }
            // Batches too small for the headers allowed to reach REGION_MIN_BYTES: a log of
            // small batches is read, after a few header reads rather than all of them.
            if walked == REGION_HEADERS_PROBE
                && let Some(first) = first
                && (position - first) * (REGION_HEADERS_MAX as u64)
                    < REGION_MIN_BYTES as u64 * (walked as u64)
            {
                return Ok(None);
            }
            let head = segment
                .read(position, batch::HEADER_LEN)
                .await
                .map_err(|source| LogError::Io {
                    what: "read",
                    path: self.segment_path(segment.base_offset, "log"),
                    source: Arc::new(source),
                })?;
            let Ok(header) = BatchHeader::parse(&head) else {
                return Ok(None);
            };
            let batch_len = u64::from(header.batch_len);
            if header.next_offset() > max_offset {
                break;
            }
            if header.next_offset() <= offset {
                position += batch_len;
                continue;
            }
            if let Some(first) = first
                && position + batch_len - first > max_bytes as u64
            {
                break;
            }
            let start = *first.get_or_insert(position);
            batches.push(RegionBatch {
                header,
                at: position - start,
            });
            records += u64::from(header.offset_count);
            newest_ms = newest_ms.max(Some(header.max_timestamp_ms));
            kafka_only &= header.format == BatchFormat::Kafka;
            position += batch_len;
        }
        let Some(first) = first else {
            return Ok(None);
        };
        let len = position - first;
        if len < REGION_MIN_BYTES as u64 || !segment.log.is_cached(first, len) {
            return Ok(None);
        }
        let Some(file) = segment.log.share_descriptor() else {
            return Ok(None);
        };
        Ok(Some(FileRegion {
            file,
            position: first,
            len: len as usize,
            records,
            newest_ms,
            kafka_only,
            batches,
        }))
    }

    /// Reads whole stored batches starting with the one holding `offset`, up to `max_bytes`
    /// (at least one batch, so a consumer always progresses), only batches that end at or
    /// before `max_offset` (exclusive; the high watermark or durable offset), from one segment.
    /// Returns empty bytes at the end of the log.
    pub async fn read(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<Bytes, LogError> {
        match self.plan_read(offset, max_bytes, max_offset).await? {
            PlannedRead::Ready(bytes) => Ok(bytes),
            PlannedRead::File(read) => read.run().await,
        }
    }

    /// [`PartitionLog::read`] up to its file IO: answered here when the tail cache holds the
    /// batches or there are none, else a [`FileRead`] to run, which needs the log no longer.
    /// The log task runs it beside appends, so a read from the disk does not hold up the
    /// partition's producers, and several reads of one partition are at the disk at once.
    pub async fn plan_read(
        &mut self,
        offset: u64,
        max_bytes: usize,
        max_offset: u64,
    ) -> Result<PlannedRead<S::File>, LogError> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        if offset < log_start || offset > log_end {
            return Err(LogError::OffsetOutOfRange {
                requested: offset,
                log_start,
                log_end,
            });
        }
        let max_offset = max_offset.min(log_end);
        if offset >= max_offset {
            return Ok(PlannedRead::Ready(Bytes::new()));
        }
        if let Some(cached) = self.tail_cache.read(offset, max_bytes, max_offset) {
            self.tail_cache.count_read(true);
            return Ok(PlannedRead::Ready(cached));
        }
        self.tail_cache.count_read(false);
        let at = self.segment_holding(offset);
        let relative = (offset - self.segments[at].base_offset) as u32;
        let budget = max_bytes.max(batch::HEADER_LEN);
        let (start, indexed_end) = self
            .index_entry(at, |index| {
                let start = index
                    .floor_by_offset(relative)
                    .map_or(0, |entry| entry.position);
                (start, index.batches_end_within(start, budget as u64))
            })
            .await?;
        let start = u64::from(start);
        let segment = &self.segments[at];
        // Whole batches up to an indexed batch start when the index knows one: bytes read past
        // the last batch the answer takes are read again by the next fetch, which from a file
        // written direct means from the disk again (a quarter of every read, with 1 MB batches
        // and 4 MiB fetches). Else the budget and an index interval, enough to find where
        // batches end.
        let window = match indexed_end {
            Some(end) => (u64::from(end) - start) as usize,
            None => budget + self.config.index_interval_bytes as usize,
        };
        Ok(PlannedRead::File(FileRead {
            log: segment.log.clone(),
            size: segment.size,
            base_offset: segment.base_offset,
            dir: self.dir.clone(),
            start,
            window,
            offset,
            max_bytes,
            max_offset,
        }))
    }

    /// The first record whose timestamp is at or after `timestamp_ms`, as (offset, timestamp).
    /// Agrees with a linear scan of the log, even with out-of-order timestamps. A compacted
    /// batch keeps the max timestamp of records it no longer holds, so a batch (or a segment)
    /// whose max reaches the target may hold no such record: the search goes on past it.
    pub async fn offset_for_timestamp(
        &mut self,
        timestamp_ms: i64,
    ) -> Result<Option<(u64, i64)>, LogError> {
        // Every record in a segment before the first whose max reaches the target is older.
        let Some(first) = self
            .segments
            .iter()
            .position(|segment| segment.max_timestamp_ms >= timestamp_ms)
        else {
            return Ok(None);
        };
        for at in first..self.segments.len() {
            if self.segments[at].max_timestamp_ms < timestamp_ms {
                continue;
            }
            let start = if at == first {
                self.index_entry(at, |index| index.floor_by_timestamp(timestamp_ms).copied())
                    .await?
                    .map_or(0, |entry| u64::from(entry.position))
            } else {
                0
            };
            if let Some(found) = self.first_at_or_after(at, start, timestamp_ms).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The record with the largest timestamp (the first of several with it), as (offset,
    /// timestamp): Kafka's max-timestamp spec (KIP-734). Segments are tried by their max
    /// timestamp, largest first: a compacted segment may keep the max of a record it lost,
    /// and then the next largest holds the answer.
    pub async fn offset_of_max_timestamp(&mut self) -> Result<Option<(u64, i64)>, LogError> {
        let mut order: Vec<usize> = (0..self.segments.len())
            .filter(|&at| self.segments[at].max_timestamp_ms != i64::MIN)
            .collect();
        // Largest max first; among equal ones the earliest segment, whose record comes first.
        order.sort_by_key(|&at| (std::cmp::Reverse(self.segments[at].max_timestamp_ms), at));
        let mut best: Option<(u64, i64)> = None;
        for at in order {
            let segment_max = self.segments[at].max_timestamp_ms;
            if best.is_some_and(|(_, found)| found >= segment_max) {
                break;
            }
            // The largest timestamp actually held: the first record at the segment's max, or
            // (a compacted segment that lost it) below it, found by the batches' own maxima.
            if let Some(found) = self.first_at_or_after(at, 0, segment_max).await? {
                best = Some(found);
                break;
            }
            if let Some(found) = self.largest_in_segment(at).await? {
                best = match best {
                    Some(current) if current.1 >= found.1 => Some(current),
                    _ => Some(found),
                };
            }
        }
        Ok(best)
    }

    /// The largest record timestamp segment `at` holds (the first record with it), as
    /// (offset, timestamp): every batch whose max is above the best so far is decoded.
    async fn largest_in_segment(&self, at: usize) -> Result<Option<(u64, i64)>, LogError> {
        let mut best: Option<(u64, i64)> = None;
        self.walk_batches(at, 0, |header, batch| {
            if best.is_some_and(|(_, found)| found >= header.max_timestamp_ms) {
                return Ok(ControlFlow::Continue(()));
            }
            for record in batch()?.records() {
                if best.is_none_or(|(_, found)| record.timestamp_ms > found) {
                    best = Some((record.offset, record.timestamp_ms));
                }
            }
            Ok(ControlFlow::Continue(()))
        })
        .await?;
        Ok(best)
    }

    /// In segment `at`, from byte `start`, the first record whose timestamp reaches
    /// `timestamp_ms`. Walks batch headers and decodes only the batches whose max reaches it.
    async fn first_at_or_after(
        &self,
        at: usize,
        start: u64,
        timestamp_ms: i64,
    ) -> Result<Option<(u64, i64)>, LogError> {
        let mut found = None;
        self.walk_batches(at, start, |header, batch| {
            if header.max_timestamp_ms < timestamp_ms {
                return Ok(ControlFlow::Continue(()));
            }
            if let Some(record) = batch()?
                .records()
                .find(|record| record.timestamp_ms >= timestamp_ms)
            {
                found = Some((record.offset, record.timestamp_ms));
                return Ok(ControlFlow::Break(()));
            }
            // Only a compacted batch may lack the record its max timestamp names.
            debug_assert!(header.is_compacted());
            Ok(ControlFlow::Continue(()))
        })
        .await?;
        Ok(found)
    }

    /// Visits each batch of segment `at` from byte `start`, in order, reading the file in
    /// chunks: `visit` gets the batch's header and a way to decode it (only the batches it
    /// needs are checked whole), and stops the walk with `Break`.
    async fn walk_batches(
        &self,
        at: usize,
        start: u64,
        mut visit: impl FnMut(
            &BatchHeader,
            &dyn Fn() -> Result<Batch, LogError>,
        ) -> Result<ControlFlow<()>, LogError>,
    ) -> Result<(), LogError> {
        let segment = &self.segments[at];
        let io_error = |source| LogError::Io {
            what: "read",
            path: self.segment_path(segment.base_offset, "log"),
            source: Arc::new(source),
        };
        let mut position = start;
        let mut want = SCAN_CHUNK_BYTES;
        while position < segment.size {
            let chunk = segment.read(position, want).await.map_err(io_error)?;
            let mut at_byte = 0usize;
            want = SCAN_CHUNK_BYTES;
            while at_byte < chunk.len() {
                let rest = &chunk[at_byte..];
                let header = match BatchHeader::parse(rest) {
                    Ok(header) => header,
                    // A header cut by the chunk's end: read on from it.
                    Err(_) if rest.len() < batch::HEADER_LEN && at_byte > 0 => break,
                    Err(source) => return Err(LogError::CorruptBatch { index: 0, source }),
                };
                let batch_len = header.batch_len as usize;
                if batch_len > rest.len() {
                    // Read this batch whole next time round.
                    want = want.max(batch_len);
                    break;
                }
                let decode = || {
                    Batch::validate(chunk.slice(at_byte..at_byte + batch_len))
                        .map_err(|source| LogError::CorruptBatch { index: 0, source })
                };
                if visit(&header, &decode)?.is_break() {
                    return Ok(());
                }
                at_byte += batch_len;
            }
            position += at_byte as u64;
        }
        Ok(())
    }

    /// Looks something up in segment `at`'s index: the active segment's lives in memory; a closed
    /// segment's is read from its index files into a small cache, so memory does not grow with
    /// the number of segments.
    pub(super) async fn index_entry<T>(
        &mut self,
        at: usize,
        find: impl Fn(&SegmentIndex) -> T,
    ) -> Result<T, LogError> {
        if at + 1 == self.segments.len() {
            return Ok(find(&self.segments[at].index));
        }
        let base = self.segments[at].base_offset;
        if let Some(index) = self.index_cache.get(base) {
            return Ok(find(&index));
        }
        let index = self.load_index_of(at).await?;
        let found = find(&index);
        self.index_cache.insert(base, Rc::new(index));
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(
        base_offset: u64,
        offset_count: u32,
        batch_len: u32,
        format: BatchFormat,
    ) -> BatchHeader {
        BatchHeader {
            format,
            base_offset,
            leader_epoch: 0,
            crc: 0,
            batch_len,
            body_len: 0,
            version: 0,
            attributes: 0,
            offset_count,
            first_timestamp_ms: base_offset as i64,
            max_timestamp_ms: base_offset as i64 + 1,
            producer_id: -1,
            base_sequence: -1,
            producer_epoch: -1,
        }
    }

    #[test]
    fn a_narrowed_region_spans_its_batches_from_the_first_kept() {
        use std::os::fd::AsFd;
        let file = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
        let batches = vec![
            RegionBatch {
                header: header(10, 5, 100, BatchFormat::Strata),
                at: 0,
            },
            RegionBatch {
                header: header(15, 3, 150, BatchFormat::Kafka),
                at: 100,
            },
            RegionBatch {
                header: header(18, 4, 200, BatchFormat::Kafka),
                at: 250,
            },
        ];
        let mut region = FileRegion {
            file,
            position: 1000,
            len: 450,
            records: 12,
            newest_ms: Some(19),
            kafka_only: false,
            batches,
        };
        region.narrow(1, 2);
        assert_eq!((region.position, region.len), (1100, 350));
        assert_eq!(region.records, 7);
        assert_eq!(region.newest_ms, Some(19));
        assert!(region.kafka_only, "the Strata batch was left out");
        let starts: Vec<u64> = region.batches.iter().map(|batch| batch.at).collect();
        assert_eq!(starts, vec![0, 150]);
        region.narrow(0, 0);
        assert_eq!(
            (region.position, region.len, region.records),
            (1100, 150, 3)
        );
    }
}
