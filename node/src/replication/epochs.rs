//! The leader-epoch cache: for each leader epoch that wrote to this log, the offset where its
//! first batch sits (Kafka's `leader-epoch-checkpoint`).
//!
//! Invariants: epochs strictly increase and start offsets never decrease along the list; every
//! entry's start is below the log end (truncation removes entries at or above the cut).

/// One epoch and the offset of its first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: u32,
    pub start_offset: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochCache {
    entries: Vec<EpochEntry>,
}

const MAGIC: &[u8; 8] = b"STRATAE1";

impl EpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<u32> {
        self.entries.last().map(|entry| entry.epoch)
    }

    pub fn first_start(&self) -> Option<u64> {
        self.entries.first().map(|entry| entry.start_offset)
    }

    /// Records that a batch of `epoch` was appended at `offset`. Returns true when this is the
    /// epoch's first batch (the cache changed and should be persisted).
    pub fn assign(&mut self, epoch: u32, offset: u64) -> bool {
        match self.entries.last() {
            Some(last) if epoch <= last.epoch => {
                // Batches of one epoch arrive in offset order; an older epoch after a newer one
                // would mean a stale leader's batch reached the log, which the epoch checks on
                // the produce and replication paths exclude.
                assert!(
                    epoch == last.epoch,
                    "epoch {epoch} appended after epoch {} (at offset {offset})",
                    last.epoch
                );
                assert!(offset >= last.start_offset);
                false
            }
            last => {
                assert!(last.is_none_or(|last| offset >= last.start_offset));
                self.entries.push(EpochEntry {
                    epoch,
                    start_offset: offset,
                });
                true
            }
        }
    }

    /// The epoch that wrote `offset`: the last one that started at or before it.
    pub fn epoch_of(&self, offset: u64) -> Option<u32> {
        let at = self
            .entries
            .partition_point(|entry| entry.start_offset <= offset);
        at.checked_sub(1).map(|at| self.entries[at].epoch)
    }

    /// The largest epoch not above `epoch` and the offset where it ends: where the next epoch
    /// starts, or `log_end` for the latest. `None` when every epoch here is above `epoch`.
    pub fn end_offset_for(&self, epoch: u32, log_end: u64) -> Option<(u32, u64)> {
        let at = self.entries.partition_point(|entry| entry.epoch <= epoch);
        if at == 0 {
            return None;
        }
        let found = self.entries[at - 1];
        let end = self
            .entries
            .get(at)
            .map_or(log_end, |next| next.start_offset);
        Some((found.epoch, end))
    }

    /// Forgets epochs that started at or after `offset` (the log was cut there). Returns true
    /// when something was removed.
    pub fn truncate_from(&mut self, offset: u64) -> bool {
        let keep = self
            .entries
            .partition_point(|entry| entry.start_offset < offset);
        let changed = keep < self.entries.len();
        self.entries.truncate(keep);
        changed
    }

    /// Forgets epochs wholly before `log_start` (retention removed their records), keeping the
    /// one that covers `log_start`.
    pub fn trim_before(&mut self, log_start: u64) -> bool {
        let covering = self
            .entries
            .partition_point(|entry| entry.start_offset <= log_start);
        if covering <= 1 {
            return false;
        }
        self.entries.drain(..covering - 1);
        true
    }

    /// The checkpoint file: magic, count, (epoch u32, start u64) entries, CRC32C of all before.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(16 + self.entries.len() * 12);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.epoch.to_le_bytes());
            bytes.extend_from_slice(&entry.start_offset.to_le_bytes());
        }
        let crc = strata_wire::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for anything but a whole, intact, well-ordered checkpoint.
    pub fn decode(bytes: &[u8]) -> Option<EpochCache> {
        let count = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let body_len = 12usize.checked_add(count.checked_mul(12)?)?;
        if bytes.get(..8)? != MAGIC || bytes.len() != body_len + 4 {
            return None;
        }
        let crc = u32::from_le_bytes(bytes[body_len..].try_into().ok()?);
        if strata_wire::crc32c(&bytes[..body_len]) != crc {
            return None;
        }
        let mut cache = EpochCache::default();
        for chunk in bytes[12..body_len].chunks_exact(12) {
            let epoch = u32::from_le_bytes(chunk[..4].try_into().ok()?);
            let start_offset = u64::from_le_bytes(chunk[4..].try_into().ok()?);
            if let Some(last) = cache.entries.last()
                && (epoch <= last.epoch || start_offset < last.start_offset)
            {
                return None;
            }
            cache.entries.push(EpochEntry {
                epoch,
                start_offset,
            });
        }
        Some(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_of_an_offset_is_the_last_that_started_at_or_before_it() {
        let mut cache = EpochCache::default();
        assert_eq!(cache.epoch_of(0), None);
        cache.assign(2, 10);
        cache.assign(5, 40);
        assert_eq!(cache.epoch_of(9), None);
        assert_eq!(cache.epoch_of(10), Some(2));
        assert_eq!(cache.epoch_of(39), Some(2));
        assert_eq!(cache.epoch_of(40), Some(5));
        assert_eq!(cache.epoch_of(1_000), Some(5));
    }

    #[test]
    fn assign_lookup_truncate_and_round_trip() {
        let mut cache = EpochCache::default();
        assert!(cache.assign(1, 0));
        assert!(!cache.assign(1, 5));
        assert!(cache.assign(3, 10));
        assert_eq!(cache.end_offset_for(0, 20), None);
        assert_eq!(cache.end_offset_for(1, 20), Some((1, 10)));
        assert_eq!(cache.end_offset_for(2, 20), Some((1, 10)));
        assert_eq!(cache.end_offset_for(3, 20), Some((3, 20)));
        assert_eq!(cache.end_offset_for(9, 20), Some((3, 20)));
        let bytes = cache.encode();
        assert_eq!(EpochCache::decode(&bytes), Some(cache.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(EpochCache::decode(&bytes[..cut]), None, "prefix {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[13] ^= 1;
        assert_eq!(EpochCache::decode(&flipped), None);
        assert!(cache.truncate_from(10));
        assert_eq!(cache.latest_epoch(), Some(1));
        assert!(!cache.truncate_from(10));
        assert!(cache.truncate_from(0));
        assert_eq!(cache.latest_epoch(), None);
    }

    #[test]
    fn trim_keeps_the_covering_epoch() {
        let mut cache = EpochCache::default();
        cache.assign(1, 0);
        cache.assign(2, 10);
        cache.assign(4, 20);
        assert!(!cache.trim_before(5));
        assert!(cache.trim_before(15));
        assert_eq!(cache.first_start(), Some(10));
        assert_eq!(cache.end_offset_for(2, 30), Some((2, 20)));
    }

    #[test]
    #[should_panic(expected = "appended after epoch")]
    fn an_older_epoch_after_a_newer_one_is_a_bug() {
        let mut cache = EpochCache::default();
        cache.assign(2, 0);
        cache.assign(1, 5);
    }
}
