//! The sparse segment index: pure data, no IO.
//!
//! One entry every `index_interval_bytes` of log (and one for the first batch), each naming a batch
//! start: its offset relative to the segment base, its byte position in the segment file, and the
//! largest record timestamp of every batch BEFORE it. Two files hold it, as in Kafka:
//! `.index` = (relative offset u32, position u32) and `.timeindex` = (max timestamp before i64,
//! relative offset u32), both little-endian. The files are a cache: recovery checks them against
//! the log and rebuilds what does not agree.
//!
//! Why "max timestamp before" rather than Kafka's "max timestamp so far at offset": with it, a
//! timestamp lookup can skip every batch before the last entry whose value is below the target and
//! still agree exactly with a linear scan, even when producers send timestamps out of order.

pub const OFFSET_ENTRY_LEN: usize = 8;
pub const TIME_ENTRY_LEN: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub relative_offset: u32,
    pub position: u32,
    pub max_timestamp_before_ms: i64,
}

#[derive(Debug, Default, Clone)]
pub struct SegmentIndex {
    entries: Vec<IndexEntry>,
    /// Entries `[0, persisted)` are in the index files; the rest are written at the next flush.
    persisted: usize,
}

impl SegmentIndex {
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    pub fn last(&self) -> Option<&IndexEntry> {
        self.entries.last()
    }

    pub fn push(&mut self, entry: IndexEntry) {
        if let Some(last) = self.entries.last() {
            assert!(
                entry.relative_offset > last.relative_offset && entry.position > last.position,
                "index entries must grow"
            );
        }
        self.entries.push(entry);
    }

    /// The last entry at or before `relative_offset`: where a read for that offset starts looking.
    pub fn floor_by_offset(&self, relative_offset: u32) -> Option<&IndexEntry> {
        let after = self
            .entries
            .partition_point(|entry| entry.relative_offset <= relative_offset);
        after.checked_sub(1).map(|at| &self.entries[at])
    }

    /// Where a read of whole batches from `start` (a batch start) can end so that it takes at
    /// most `budget` bytes and no partial batch: the last indexed batch start within the budget,
    /// or, when the batch at `start` alone runs past it, the next indexed batch start (so the read
    /// holds that first batch whole). Batches between the last entry within the budget and the
    /// budget's end are left for the next read: less than an index interval of them, as entries
    /// come at least that often. `None` when no entry lies past the budget: what follows the last
    /// entry is unindexed up to the end of the segment.
    pub fn batches_end_within(&self, start: u32, budget: u64) -> Option<u32> {
        let limit = u64::from(start) + budget;
        let after_start = self
            .entries
            .partition_point(|entry| entry.position <= start);
        let beyond = self
            .entries
            .partition_point(|entry| u64::from(entry.position) <= limit);
        let past_budget = self.entries.get(beyond)?;
        Some(if beyond > after_start {
            self.entries[beyond - 1].position
        } else {
            past_budget.position
        })
    }

    /// The last entry before which every record is older than `timestamp_ms`: a timestamp lookup
    /// may skip everything before it. Entries' `max_timestamp_before_ms` never decrease.
    pub fn floor_by_timestamp(&self, timestamp_ms: i64) -> Option<&IndexEntry> {
        let after = self
            .entries
            .partition_point(|entry| entry.max_timestamp_before_ms < timestamp_ms);
        after.checked_sub(1).map(|at| &self.entries[at])
    }

    /// Drops entries at or beyond `position` (truncation). Returns how many persisted entries remain.
    pub fn truncate_to_position(&mut self, position: u32) -> usize {
        let keep = self
            .entries
            .partition_point(|entry| entry.position < position);
        self.entries.truncate(keep);
        self.persisted = self.persisted.min(keep);
        self.persisted
    }

    pub fn persisted(&self) -> usize {
        self.persisted
    }

    /// Every entry, encoded for both files (an uploaded segment's index objects).
    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        let (mut offsets, mut times) = (Vec::new(), Vec::new());
        let mut all = SegmentIndex {
            entries: self.entries.clone(),
            persisted: 0,
        };
        all.take_unpersisted(&mut offsets, &mut times);
        (offsets, times)
    }

    /// Encodes the entries not yet persisted, for both files, and marks them persisted.
    pub fn take_unpersisted(&mut self, offsets: &mut Vec<u8>, times: &mut Vec<u8>) -> usize {
        let start = self.persisted;
        for entry in &self.entries[start..] {
            offsets.extend_from_slice(&entry.relative_offset.to_le_bytes());
            offsets.extend_from_slice(&entry.position.to_le_bytes());
            times.extend_from_slice(&entry.max_timestamp_before_ms.to_le_bytes());
            times.extend_from_slice(&entry.relative_offset.to_le_bytes());
        }
        self.persisted = self.entries.len();
        start
    }

    /// Loads the entries the two files agree on, stopping at the first entry that is torn, does
    /// not grow, points past `file_len`, or disagrees between the files.
    pub fn decode(offsets: &[u8], times: &[u8], file_len: u64) -> SegmentIndex {
        let mut index = SegmentIndex::default();
        let pairs = offsets
            .chunks_exact(OFFSET_ENTRY_LEN)
            .zip(times.chunks_exact(TIME_ENTRY_LEN));
        for (offset_entry, time_entry) in pairs {
            let word = |bytes: &[u8], at: usize| {
                u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
            };
            let entry = IndexEntry {
                relative_offset: word(offset_entry, 0),
                position: word(offset_entry, 4),
                max_timestamp_before_ms: i64::from_le_bytes(
                    time_entry[..8].try_into().expect("8 bytes"),
                ),
            };
            let grows = index.entries.last().is_none_or(|last| {
                entry.relative_offset > last.relative_offset
                    && entry.position > last.position
                    && entry.max_timestamp_before_ms >= last.max_timestamp_before_ms
            });
            let first_ok =
                !index.entries.is_empty() || (entry.position == 0 && entry.relative_offset == 0);
            if word(time_entry, 8) != entry.relative_offset
                || !grows
                || !first_ok
                || u64::from(entry.position) >= file_len
            {
                break;
            }
            index.entries.push(entry);
        }
        index.persisted = index.entries.len();
        index
    }
}

/// Decides when to add an index entry while appending or scanning batches.
#[derive(Debug, Clone)]
pub struct IndexCadence {
    interval_bytes: u32,
    bytes_since_entry: u64,
    max_timestamp_ms: i64,
}

impl IndexCadence {
    pub fn new(interval_bytes: u32) -> IndexCadence {
        IndexCadence {
            interval_bytes,
            bytes_since_entry: u64::MAX,
            max_timestamp_ms: i64::MIN,
        }
    }

    /// Starts afresh at a batch start before which the largest timestamp was `max_before_ms`:
    /// the next batch gets an entry, exactly as it did when the index was first built there.
    pub fn resume(interval_bytes: u32, max_before_ms: i64) -> IndexCadence {
        IndexCadence {
            interval_bytes,
            bytes_since_entry: u64::MAX,
            max_timestamp_ms: max_before_ms,
        }
    }

    /// Called for each batch in log order. Returns the entry to add, if this batch gets one.
    pub fn on_batch(
        &mut self,
        relative_offset: u32,
        position: u32,
        batch_len: u32,
        batch_max_timestamp_ms: i64,
    ) -> Option<IndexEntry> {
        let entry = (self.bytes_since_entry >= u64::from(self.interval_bytes)).then(|| {
            self.bytes_since_entry = 0;
            IndexEntry {
                relative_offset,
                position,
                max_timestamp_before_ms: self.max_timestamp_ms,
            }
        });
        self.bytes_since_entry = self.bytes_since_entry.saturating_add(u64::from(batch_len));
        self.max_timestamp_ms = self.max_timestamp_ms.max(batch_max_timestamp_ms);
        entry
    }

    pub fn max_timestamp_ms(&self) -> i64 {
        self.max_timestamp_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(entries: &[(u32, u32, i64)]) -> SegmentIndex {
        let mut index = SegmentIndex::default();
        for &(relative_offset, position, max_timestamp_before_ms) in entries {
            index.push(IndexEntry {
                relative_offset,
                position,
                max_timestamp_before_ms,
            });
        }
        index
    }

    #[test]
    fn floor_lookups() {
        let index = index_of(&[(0, 0, i64::MIN), (10, 4096, 50), (20, 8192, 90)]);
        assert_eq!(index.floor_by_offset(0).unwrap().position, 0);
        assert_eq!(index.floor_by_offset(9).unwrap().position, 0);
        assert_eq!(index.floor_by_offset(10).unwrap().position, 4096);
        assert_eq!(index.floor_by_offset(1000).unwrap().position, 8192);
        // Skipping is allowed only past entries whose predecessors are all older than the target.
        assert_eq!(index.floor_by_timestamp(10).unwrap().position, 0);
        assert_eq!(index.floor_by_timestamp(50).unwrap().position, 0);
        assert_eq!(index.floor_by_timestamp(51).unwrap().position, 4096);
        assert_eq!(index.floor_by_timestamp(91).unwrap().position, 8192);
    }

    #[test]
    fn a_reads_end_is_an_indexed_batch_start_within_its_budget() {
        // Batches of 1,000 bytes, each indexed, up to 10,000.
        let index = index_of(&(0..10).map(|i| (i, i * 1000, 0)).collect::<Vec<_>>());
        // Three whole batches fit 3,500 bytes from 2,000; the fourth would not.
        assert_eq!(index.batches_end_within(2000, 3500), Some(5000));
        assert_eq!(index.batches_end_within(2000, 3000), Some(5000));
        // A budget smaller than the first batch still gets that batch whole.
        assert_eq!(index.batches_end_within(2000, 10), Some(3000));
        // Past the last entry the batches are unindexed: the caller reads its budget.
        assert_eq!(index.batches_end_within(2000, 7000), None);
        assert_eq!(index.batches_end_within(9000, 1), None);
        // A sparse index (an entry per 4 batches here) leaves the rest for the next read.
        let sparse = index_of(&[(0, 0, 0), (4, 4000, 0), (8, 8000, 0)]);
        assert_eq!(sparse.batches_end_within(0, 6500), Some(4000));
        assert_eq!(sparse.batches_end_within(0, 100), Some(4000));
    }

    #[test]
    fn encode_decode_round_trip_and_torn_tails() {
        let mut index = index_of(&[(0, 0, i64::MIN), (10, 4096, 50), (20, 8192, 90)]);
        let (mut offsets, mut times) = (Vec::new(), Vec::new());
        index.take_unpersisted(&mut offsets, &mut times);
        assert_eq!(index.persisted(), 3);
        let decoded = SegmentIndex::decode(&offsets, &times, 10_000);
        assert_eq!(decoded.entries(), index.entries());
        // A torn entry, a position past the end, and files that disagree all stop the load.
        assert_eq!(
            SegmentIndex::decode(&offsets[..20], &times, 10_000)
                .entries()
                .len(),
            2
        );
        assert_eq!(
            SegmentIndex::decode(&offsets, &times, 8192).entries().len(),
            2
        );
        let mut other = times.clone();
        other[12 + 8] ^= 1;
        assert_eq!(
            SegmentIndex::decode(&offsets, &other, 10_000)
                .entries()
                .len(),
            1
        );
    }

    #[test]
    fn cadence_adds_the_first_batch_then_every_interval() {
        let mut cadence = IndexCadence::new(100);
        let mut entries = Vec::new();
        let mut position = 0;
        for offset in 0..10u32 {
            if let Some(entry) = cadence.on_batch(offset, position, 40, i64::from(offset) * 10) {
                entries.push((
                    entry.relative_offset,
                    entry.position,
                    entry.max_timestamp_before_ms,
                ));
            }
            position += 40;
        }
        assert_eq!(
            entries,
            vec![(0, 0, i64::MIN), (3, 120, 20), (6, 240, 50), (9, 360, 80)]
        );
    }
}
