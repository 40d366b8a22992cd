//! One segment: a `.log` file of back-to-back batches plus its sparse index files.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use strata_wire::AlignedVec;
use strata_wire::batch::{self, BatchHeader, HEADER_LEN};

use super::Buffers;
use super::index::{IndexCadence, IndexEntry, OFFSET_ENTRY_LEN, SegmentIndex, TIME_ENTRY_LEN};
use crate::io::{DIRECT_BLOCK, DirectReadBuf, ReadBuf, Storage, StorageFile};

/// How much a recovery or lookup scan reads per IO.
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Smallest read of a file written direct that goes past the page cache when its pages are not
/// cached: the kernel's default readahead window. A read this large gains nothing from
/// readahead, and smaller ones (batch headers, small fetches) are cheaper through the cache.
pub(crate) const DIRECT_READ_MIN_BYTES: usize = 128 << 10;

pub(crate) fn file_name(base_offset: u64, extension: &str) -> PathBuf {
    PathBuf::from(format!("{base_offset:020}.{extension}"))
}

/// Parses `00000000000000001234.log` into 1234.
pub(crate) fn parse_base_offset(name: &Path, extension: &str) -> Option<u64> {
    let name = name.to_str()?;
    let stem = name.strip_suffix(extension)?.strip_suffix('.')?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
}

pub(crate) struct Segment<F> {
    pub base_offset: u64,
    /// Offset after the last batch in the segment.
    pub next_offset: u64,
    /// Bytes of whole batches in the `.log` file.
    pub size: u64,
    /// Largest record timestamp in the segment; `i64::MIN` while empty.
    pub max_timestamp_ms: i64,
    /// When this process created or opened the segment (age-based rolling).
    pub opened_at_ms: i64,
    /// Written since the last successful sync.
    pub dirty: bool,
    /// Where the next writeback hint starts: bytes before it were handed to the kernel's
    /// writeback already (see `PartitionLog::hint_writeback`).
    pub writeback_from: u64,
    /// The bytes of the partial block at the end of the data, `[size - size % DIRECT_BLOCK,
    /// size)`, as the last direct write left them; `None` when unknown (after a write through
    /// the page cache, a replay, or on open), and then read back before the next direct write.
    pub direct_tail: Option<Vec<u8>>,
    /// A direct write ran past `size` to the end of its block: the file is longer than the data,
    /// by zeros. Cut when the segment closes; recovery cuts it too.
    pub padded: bool,
    /// The log file's blocks are reserved (`fallocate`, keeping the file's length) up to here,
    /// so appends below it find their blocks allocated (see `PartitionLog::reserve_ahead`).
    /// What lies past `size` is cut when the segment closes.
    pub reserved_to: u64,
    pub index: SegmentIndex,
    pub cadence: IndexCadence,
    /// Shared with in-flight [`super::FlushJob`]s, which sync it while the log moves on. The
    /// index files are not held: each use opens them (see [`open_index_files`]).
    pub log: Rc<F>,
}

/// Opens (creating where missing) the offset and time index files of the segment at
/// `base_offset` in `dir`, for one use. They are written at flushes and read on an index-cache
/// miss only, so a segment holds no descriptor for them: a broker's descriptors go to log
/// files, and an idle partition holds its active segment's log alone (its other files are
/// opened when written too), where holding them cost five descriptors a partition.
pub(crate) async fn open_index_files<S: Storage>(
    storage: &S,
    dir: &Path,
    base_offset: u64,
) -> io::Result<(S::File, S::File)> {
    Ok((
        storage
            .open(&dir.join(file_name(base_offset, "index")), true)
            .await?,
        storage
            .open(&dir.join(file_name(base_offset, "timeindex")), true)
            .await?,
    ))
}

/// Reads `[position, position + len)` of a segment's log file holding `size` bytes of data,
/// never past them: past the page cache when the file was opened for that (`direct.writes`), the
/// read is at least [`DIRECT_READ_MIN_BYTES`] and not every page of it is cached (see
/// [`read_direct`]).
pub(crate) async fn read_file<F: StorageFile>(
    log: &F,
    size: u64,
    position: u64,
    len: usize,
) -> io::Result<Bytes> {
    let len = len.min((size.saturating_sub(position)) as usize);
    if len >= DIRECT_READ_MIN_BYTES && log.writes_direct() && !log.is_cached(position, len as u64) {
        return read_direct(log, position, len).await;
    }
    let (result, buf) = log.read_at(ReadBuf::with_capacity(len), position).await;
    result?;
    Ok(buf.into_bytes())
}

/// Reads `[position, position + len)` from the disk into memory, the whole blocks around it in
/// one `O_DIRECT` read. Data appended direct is not in the page cache, and a buffered read of it
/// would copy it there first, a page at a time behind readahead: on a 2-core cloud VM
/// (docs/performance.md) `fio` read 1 MiB at a time at 606 MB/s buffered against 1,434 MB/s
/// direct (2.6 GB/s with four in flight), and the page cache it fills then has to be reclaimed.
async fn read_direct<F: StorageFile>(log: &F, position: u64, len: usize) -> io::Result<Bytes> {
    let block = DIRECT_BLOCK as u64;
    let start = position / block * block;
    let end = (position + len as u64).next_multiple_of(block);
    let (result, buf) = log
        .read_direct_at(DirectReadBuf::with_capacity((end - start) as usize), start)
        .await;
    result?;
    let skip = (position - start) as usize;
    let bytes = buf.into_bytes();
    // Short only where the file ends, which is never before the data.
    let end = (skip + len).min(bytes.len());
    Ok(bytes.slice(skip.min(end)..end))
}

/// Where a scan over a segment stopped.
#[derive(Debug)]
pub(crate) struct ScanEnd {
    /// Length of the valid prefix of the file.
    pub valid_len: u64,
    pub next_offset: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub damage: Option<String>,
}

impl<F: StorageFile> Segment<F> {
    /// A segment with no batches accounted yet (new, or about to be replayed by recovery).
    pub fn new(
        base_offset: u64,
        now_ms: i64,
        index: SegmentIndex,
        index_interval_bytes: u32,
        log: Rc<F>,
    ) -> Segment<F> {
        Segment {
            base_offset,
            next_offset: base_offset,
            size: 0,
            max_timestamp_ms: i64::MIN,
            opened_at_ms: now_ms,
            dirty: false,
            writeback_from: 0,
            direct_tail: Some(Vec::new()),
            padded: false,
            reserved_to: 0,
            index,
            cadence: IndexCadence::new(index_interval_bytes),
            log,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Records a batch written at `position`: offsets, timestamps, index.
    pub fn on_batch(&mut self, header: &BatchHeader, position: u64) {
        apply_batch(
            self.base_offset,
            &mut self.next_offset,
            &mut self.max_timestamp_ms,
            &mut self.index,
            &mut self.cadence,
            header,
            position,
        );
    }

    /// Forgets everything from `from` (an index entry; `None` = the segment start) on and replays
    /// the file from there: rebuilds offsets, timestamps and index entries, stopping at damage, at
    /// the end of the file, or before the first batch that ends above `keep_below`. Sets `size`
    /// to the end of the last replayed batch. Used by recovery (with `verify`) and truncation.
    pub async fn replay(
        &mut self,
        from: Option<IndexEntry>,
        file_len: u64,
        verify: bool,
        keep_below: u64,
        interval_bytes: u32,
    ) -> io::Result<ScanEnd> {
        let (position, relative_offset, max_before) = from.map_or((0, 0, i64::MIN), |entry| {
            (
                u64::from(entry.position),
                entry.relative_offset,
                entry.max_timestamp_before_ms,
            )
        });
        self.index.truncate_to_position(position as u32);
        self.cadence = IndexCadence::resume(interval_bytes, max_before);
        self.next_offset = self.base_offset + u64::from(relative_offset);
        self.max_timestamp_ms = max_before;
        let Segment {
            base_offset,
            next_offset,
            max_timestamp_ms,
            index,
            cadence,
            log,
            ..
        } = self;
        let end = Self::scan(
            log,
            file_len,
            position,
            *next_offset,
            verify,
            |header, at| {
                if header.next_offset() > keep_below {
                    return false;
                }
                apply_batch(
                    *base_offset,
                    next_offset,
                    max_timestamp_ms,
                    index,
                    cadence,
                    header,
                    at,
                );
                true
            },
        )
        .await?;
        assert_eq!(end.next_offset, self.next_offset);
        self.size = end.valid_len;
        // What is on disk already needs no hint; a truncated tail must not delay the next.
        self.writeback_from = self.size;
        self.direct_tail = None;
        Ok(end)
    }

    /// Writes `buffers` at the end of the data past the page cache. A direct write covers whole
    /// blocks, so it starts at the block holding the end of the data, repeating that block's
    /// bytes (`direct_tail`), and ends with zeros up to the next block boundary; the next direct
    /// write rewrites that last block with more data in place of the zeros. Batches received
    /// into place (`Buffers::Placed` at this segment's block phase) are written where they lie,
    /// the tail copied in front of them; others are copied into an aligned buffer, a copy that
    /// replaces the page-cache copy it saves, in memory the allocator reuses. The caller
    /// accounts the batches (`on_batch`, `size`).
    pub async fn write_direct(&mut self, buffers: Buffers) -> io::Result<()> {
        let block = DIRECT_BLOCK as u64;
        let block_start = self.size / block * block;
        let mut tail = match self.direct_tail.take() {
            Some(tail) => tail,
            None => {
                let (result, buf) = self
                    .log
                    .read_at(
                        ReadBuf::with_capacity((self.size - block_start) as usize),
                        block_start,
                    )
                    .await;
                result?;
                buf.as_slice().to_vec()
            }
        };
        assert_eq!(
            tail.len() as u64,
            self.size - block_start,
            "the tail is the partial block before the end of the data"
        );
        // The aligned buffer and where in it the write starts.
        let (mut aligned, start) = match buffers {
            Buffers::Placed(placed) if placed.batches.start % DIRECT_BLOCK == tail.len() => {
                // Received into place: the tail goes in front, no copy of the batches.
                let start = placed.batches.start - tail.len();
                let mut buf = placed.buf;
                buf[start..placed.batches.start].copy_from_slice(&tail);
                (buf, start)
            }
            buffers => {
                let mut buf = AlignedVec::<DIRECT_BLOCK>::with_capacity(
                    (tail.len() + buffers.len() as usize).next_multiple_of(DIRECT_BLOCK),
                );
                buf.extend_from_slice(&tail);
                for bytes in buffers.slices() {
                    buf.extend_from_slice(bytes);
                }
                (buf, 0)
            }
        };
        let end = aligned.len();
        let len = end - start;
        let padded_len = len.next_multiple_of(DIRECT_BLOCK);
        aligned.resize(start + padded_len, 0);
        tail.clear();
        tail.extend_from_slice(&aligned[start + len / DIRECT_BLOCK * DIRECT_BLOCK..end]);
        let write = Bytes::from_owner(aligned).slice(start..start + padded_len);
        self.log.write_direct_at(write, block_start).await?;
        self.padded |= padded_len > len;
        self.direct_tail = Some(tail);
        Ok(())
    }

    /// Cuts what the file holds past the data: the zeros a direct write left (see `padded`) and
    /// blocks reserved ahead of appends (see `reserved_to`), so a closed segment takes on disk
    /// what its data does.
    pub async fn trim(&mut self) -> io::Result<()> {
        if self.padded || self.reserved_to > self.size {
            self.log.truncate(self.size).await?;
            self.padded = false;
            self.reserved_to = self.size;
        }
        Ok(())
    }

    /// Appends index entries not yet in the index files of this segment (in `dir`). Not synced:
    /// the files are a cache that recovery checks against the log.
    pub async fn persist_index<S: Storage<File = F>>(
        &mut self,
        storage: &S,
        dir: &Path,
    ) -> io::Result<()> {
        if self.index.persisted() == self.index.entries().len() {
            return Ok(());
        }
        let files = open_index_files(storage, dir, self.base_offset).await?;
        self.persist_index_to(&files).await
    }

    /// [`Segment::persist_index`] into index files already open.
    pub async fn persist_index_to(
        &mut self,
        (offset_index, time_index): &(F, F),
    ) -> io::Result<()> {
        let (mut offsets, mut times) = (Vec::new(), Vec::new());
        let first = self.index.take_unpersisted(&mut offsets, &mut times);
        if offsets.is_empty() {
            return Ok(());
        }
        let offsets_at = (first * OFFSET_ENTRY_LEN) as u64;
        let times_at = (first * TIME_ENTRY_LEN) as u64;
        offset_index
            .write_all_at(Bytes::from(offsets), offsets_at)
            .await?;
        time_index.write_all_at(Bytes::from(times), times_at).await
    }

    /// Cuts the index files to the entries persisted (after the log was cut below entries
    /// written past the new end).
    pub async fn truncate_index<S: Storage<File = F>>(
        &self,
        storage: &S,
        dir: &Path,
    ) -> io::Result<()> {
        let persisted = self.index.persisted() as u64;
        let (offset_index, time_index) = open_index_files(storage, dir, self.base_offset).await?;
        offset_index
            .truncate(persisted * OFFSET_ENTRY_LEN as u64)
            .await?;
        time_index.truncate(persisted * TIME_ENTRY_LEN as u64).await
    }

    /// Reads the index files back (a closed segment's index is not kept in memory).
    pub async fn load_index<S: Storage<File = F>>(
        &self,
        storage: &S,
        dir: &Path,
    ) -> io::Result<SegmentIndex> {
        let (offset_index, time_index) = open_index_files(storage, dir, self.base_offset).await?;
        let offsets = read_whole(&offset_index).await?;
        let times = read_whole(&time_index).await?;
        Ok(SegmentIndex::decode(
            offsets.as_slice(),
            times.as_slice(),
            self.size,
        ))
    }

    /// Reads `[position, position + len)` of the log file, never past the segment's data.
    pub async fn read(&self, position: u64, len: usize) -> io::Result<Bytes> {
        read_file(self.log.as_ref(), self.size, position, len).await
    }

    /// Walks batches from `position` (a batch start holding `offset`) to the end of the file.
    /// With `verify`, every batch is fully validated (CRC, structure); without, only headers and
    /// offset continuity are checked. Calls `on_batch` for each good batch in order; when it
    /// returns false the scan stops before that batch (not damage).
    pub async fn scan(
        log: &F,
        file_len: u64,
        mut position: u64,
        mut offset: u64,
        verify: bool,
        mut on_batch: impl FnMut(&BatchHeader, u64) -> bool,
    ) -> io::Result<ScanEnd> {
        let mut want = SCAN_CHUNK_BYTES;
        loop {
            if position == file_len {
                return Ok(ScanEnd {
                    valid_len: position,
                    next_offset: offset,
                    damage: None,
                });
            }
            let len = want.min((file_len - position) as usize);
            let (result, buf) = log.read_at(ReadBuf::with_capacity(len), position).await;
            result?;
            let chunk = buf.as_slice();
            let mut at = 0usize;
            let damage = loop {
                let rest = &chunk[at..];
                if rest.is_empty() && position + at as u64 == file_len {
                    return Ok(ScanEnd {
                        valid_len: file_len,
                        next_offset: offset,
                        damage: None,
                    });
                }
                // The last block's bytes not all in this chunk: read on, so a direct write's
                // padding is seen whole (and not taken for a bad header).
                let to_end = file_len - (position + at as u64);
                if to_end < DIRECT_BLOCK as u64 && rest.len() < to_end as usize {
                    break None;
                }
                if is_direct_padding(rest, position + chunk.len() as u64, file_len) {
                    return Ok(ScanEnd {
                        valid_len: position + at as u64,
                        next_offset: offset,
                        damage: None,
                    });
                }
                if rest.len() < batch::BATCH_LEN_MIN
                    && position + (at + rest.len()) as u64 == file_len
                {
                    break Some(format!(
                        "{} trailing bytes are not a whole header",
                        rest.len()
                    ));
                }
                // A header of either format fits in HEADER_LEN bytes.
                if rest.len() < HEADER_LEN && position + (at + rest.len()) as u64 != file_len {
                    break None;
                }
                let header = match BatchHeader::parse(rest) {
                    Ok(header) => header,
                    Err(error) => break Some(format!("bad header: {error}")),
                };
                let batch_len = header.batch_len as usize;
                if position + (at + batch_len) as u64 > file_len {
                    break Some(format!(
                        "batch at offset {} needs {batch_len} bytes, the file ends first",
                        header.base_offset
                    ));
                }
                if batch_len > rest.len() {
                    break None;
                }
                if header.base_offset != offset {
                    break Some(format!(
                        "expected a batch at offset {offset}, found offset {}",
                        header.base_offset
                    ));
                }
                // Header, lengths and CRC: what a torn or damaged write breaks. The body's
                // structure was checked before it was written (and a compressed one would
                // have to be inflated again here).
                if verify && let Err(error) = batch::check_integrity(&rest[..batch_len]) {
                    break Some(format!("batch at offset {offset}: {error}"));
                }
                if !on_batch(&header, position + at as u64) {
                    return Ok(ScanEnd {
                        valid_len: position + at as u64,
                        next_offset: offset,
                        damage: None,
                    });
                }
                offset = header.next_offset();
                at += batch_len;
            };
            if let Some(damage) = damage {
                return Ok(ScanEnd {
                    valid_len: position + at as u64,
                    next_offset: offset,
                    damage: Some(damage),
                });
            }
            // Need more bytes: either the next chunk, or one large batch that did not fit.
            let rest = &chunk[at..];
            want = if rest.len() >= HEADER_LEN {
                BatchHeader::parse(rest)
                    .map(|header| header.batch_len as usize)
                    .unwrap_or(SCAN_CHUNK_BYTES)
                    .max(SCAN_CHUNK_BYTES)
            } else {
                SCAN_CHUNK_BYTES
            };
            position += at as u64;
        }
    }
}

/// Whether `rest`, the bytes after the last batch (ending at `rest_end`), are what a direct
/// write leaves: zeros from inside the last block to the end of a file whose length is a whole
/// number of blocks. (A torn write that left such zeros ends the data at the same place; only
/// the report differs. A zeroed tail of any other length is reported as damage.)
fn is_direct_padding(rest: &[u8], rest_end: u64, file_len: u64) -> bool {
    rest_end == file_len
        && file_len.is_multiple_of(DIRECT_BLOCK as u64)
        && !rest.is_empty()
        && rest.len() < DIRECT_BLOCK
        && rest.iter().all(|b| *b == 0)
}

fn apply_batch(
    base_offset: u64,
    next_offset: &mut u64,
    max_timestamp_ms: &mut i64,
    index: &mut SegmentIndex,
    cadence: &mut IndexCadence,
    header: &BatchHeader,
    position: u64,
) {
    assert_eq!(header.base_offset, *next_offset, "batches are contiguous");
    assert!(position <= u64::from(u32::MAX), "segment positions fit u32");
    let relative_offset =
        u32::try_from(header.base_offset - base_offset).expect("relative offsets fit u32");
    if let Some(entry) = cadence.on_batch(
        relative_offset,
        position as u32,
        header.batch_len,
        header.max_timestamp_ms,
    ) {
        index.push(entry);
    }
    *max_timestamp_ms = (*max_timestamp_ms).max(header.max_timestamp_ms);
    *next_offset = header.next_offset();
}

pub(crate) async fn read_whole<F: StorageFile>(file: &F) -> io::Result<ReadBuf> {
    let len = file.file_len().await?;
    let (result, buf) = file.read_at(ReadBuf::with_capacity(len as usize), 0).await;
    result.map(|()| buf)
}
