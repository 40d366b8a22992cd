//! The cleaner's key → offset map, in a fixed amount of memory.

use xxhash_rust::xxh3::xxh3_128;

/// Bytes one entry takes: a 128-bit key hash and an offset.
pub const ENTRY_BYTES: usize = 24;
/// The table is filled to this fraction of its slots at most, so a probe stays short.
const LOAD_FACTOR: f64 = 0.75;
/// Marks an empty slot (offsets stay below `i64::MAX`).
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy)]
struct Slot {
    hash: [u64; 2],
    offset: u64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == ENTRY_BYTES);

/// Each key's last offset in the part of a log the cleaner reads, as Kafka's `SkimpyOffsetMap`:
/// a key is kept as its 128-bit hash (xxh3; Kafka uses MD5), so an entry is 24 bytes whatever
/// the key's length, in an open-addressing table allocated once. Two keys with the same hash
/// would be taken for one; at 128 bits that needs about 2^64 keys.
pub struct OffsetMap {
    slots: Vec<Slot>,
    used: usize,
    max_entries: usize,
}

impl OffsetMap {
    /// A map in at most `memory_bytes`; panics below one entry's worth.
    pub fn with_memory(memory_bytes: usize) -> OffsetMap {
        let slots = memory_bytes / ENTRY_BYTES;
        assert!(slots >= 2, "the cleaner's map needs room for an entry");
        OffsetMap {
            slots: vec![
                Slot {
                    hash: [0; 2],
                    offset: EMPTY,
                };
                slots
            ],
            used: 0,
            max_entries: ((slots as f64 * LOAD_FACTOR) as usize).max(1),
        }
    }

    /// The most keys the map takes.
    pub fn capacity(&self) -> usize {
        self.max_entries
    }

    pub fn len(&self) -> usize {
        self.used
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The bytes the table holds (what `--cleaner-memory-bytes` bounds).
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * ENTRY_BYTES
    }

    /// Empties the map, keeping its memory.
    pub fn clear(&mut self) {
        if self.used > 0 {
            self.slots.iter_mut().for_each(|slot| slot.offset = EMPTY);
            self.used = 0;
        }
    }

    /// Records `offset` as `key`'s latest. Returns false, changing nothing, when `key` is new
    /// and the map is full.
    pub fn put(&mut self, key: &[u8], offset: u64) -> bool {
        debug_assert!(offset != EMPTY);
        let hash = split(xxh3_128(key));
        let at = self.probe(hash);
        let slot = &mut self.slots[at];
        if slot.offset == EMPTY {
            if self.used == self.max_entries {
                return false;
            }
            self.used += 1;
            slot.hash = hash;
        }
        slot.offset = offset;
        true
    }

    /// `key`'s latest offset, if the map holds it.
    pub fn get(&self, key: &[u8]) -> Option<u64> {
        let slot = &self.slots[self.probe(split(xxh3_128(key)))];
        (slot.offset != EMPTY).then_some(slot.offset)
    }

    /// The slot holding `hash`, or the empty one where it would go (linear probing; the load
    /// factor guarantees an empty slot).
    fn probe(&self, hash: [u64; 2]) -> usize {
        let mut at = (hash[0] % self.slots.len() as u64) as usize;
        loop {
            let slot = &self.slots[at];
            if slot.offset == EMPTY || slot.hash == hash {
                return at;
            }
            at += 1;
            if at == self.slots.len() {
                at = 0;
            }
        }
    }
}

fn split(hash: u128) -> [u64; 2] {
    [hash as u64, (hash >> 64) as u64]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn keeps_each_keys_latest_offset_until_full() {
        let mut map = OffsetMap::with_memory(24 * 1000);
        assert_eq!(map.capacity(), 750);
        assert!(map.memory_bytes() <= 24 * 1000);
        let mut model = HashMap::new();
        for offset in 0..5_000u64 {
            let key = format!("key-{}", offset % 700);
            assert!(map.put(key.as_bytes(), offset));
            model.insert(key, offset);
        }
        assert_eq!(map.len(), 700);
        for (key, offset) in &model {
            assert_eq!(map.get(key.as_bytes()), Some(*offset));
        }
        assert_eq!(map.get(b"absent"), None);
        for extra in 0..50 {
            assert!(map.put(format!("more-{extra}").as_bytes(), 9_000));
        }
        assert!(!map.put(b"one too many", 9_001), "full");
        assert_eq!(map.get(b"one too many"), None);
        assert!(map.put(b"key-3", 9_002), "a known key still updates");
        assert_eq!(map.get(b"key-3"), Some(9_002));
        map.clear();
        assert!(map.is_empty());
        assert_eq!(map.get(b"key-3"), None);
        assert!(map.put(b"key-3", 1));
    }
}
