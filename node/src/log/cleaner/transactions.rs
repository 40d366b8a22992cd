//! What a clean does with transactions, as Kafka's cleaner does it: an aborted transaction's
//! records go (a `read_committed` consumer skips them anyway, a `read_uncommitted` one is not
//! promised them past a clean), committed ones are compacted like any, and a marker stays as
//! long as a batch of its transaction does (a replay of the log would otherwise reopen that
//! transaction and hold the LSO back for ever), then `delete.retention.ms` more, so a consumer
//! part way through still sees it, then goes.
//!
//! An aborted transaction that holds no batch any more leaves the partition's aborted list (a
//! `read_committed` fetch would otherwise name it, and a Kafka client, seeing that producer's
//! next batch without the abort marker that ends the aborted range, would drop it). Its abort
//! marker is removed only by a later clean that no longer finds it listed: the list leaves with
//! the producer snapshot written after the clean that emptied it, so a listed transaction always
//! has its marker in the log, even after a crash brought an older snapshot back.
//!
//! A clean covers only what lies below the last stable offset (see
//! [`crate::log::PartitionLog::plan_clean`]): every transaction with records there is decided.

use std::collections::HashMap;

use crate::log::transactions::AbortedTxn;

/// The aborted transactions of a log, by producer: `(first_offset, last_offset)` ranges in
/// offset order.
#[derive(Debug, Default)]
pub struct AbortedRanges(HashMap<i64, Vec<(u64, u64)>>);

impl AbortedRanges {
    /// From the partition's aborted transactions, in marker order.
    pub fn new(aborted: &[AbortedTxn]) -> AbortedRanges {
        let mut ranges: HashMap<i64, Vec<(u64, u64)>> = HashMap::new();
        for txn in aborted {
            let of_producer = ranges.entry(txn.producer_id).or_default();
            // One producer's transactions never overlap: each ends with its marker before the
            // next one's first record.
            assert!(
                of_producer
                    .last()
                    .is_none_or(|(_, last)| *last < txn.first_offset),
                "a producer's aborted transactions are ordered and apart"
            );
            of_producer.push((txn.first_offset, txn.last_offset));
        }
        AbortedRanges(ranges)
    }

    /// Whether the abort marker of `producer_id` at `offset` ends a transaction the partition
    /// still lists as aborted.
    pub fn lists_marker(&self, producer_id: i64, offset: u64) -> bool {
        // A producer's ranges are in marker order: a binary search, not a scan per marker.
        self.0.get(&producer_id).is_some_and(|ranges| {
            ranges
                .binary_search_by_key(&offset, |(_, last)| *last)
                .is_ok()
        })
    }

    /// Whether the transactional batch of `producer_id` at `offset` belongs to an aborted
    /// transaction.
    pub fn contains(&self, producer_id: i64, offset: u64) -> bool {
        let Some(ranges) = self.0.get(&producer_id) else {
            return false;
        };
        let at = ranges.partition_point(|(_, last)| *last < offset);
        ranges.get(at).is_some_and(|(first, _)| *first <= offset)
    }
}

/// What a clean's rewrite learns of transactions, carried from one cleaned segment to the next:
/// for each producer whose transaction's records have been read but not its marker yet, whether
/// any of its batches stays in the cleaned log; and the listed aborted transactions found to
/// hold no batch any more.
#[derive(Debug, Default)]
pub struct OngoingTxns {
    ongoing: HashMap<i64, bool>,
    emptied_aborts: Vec<EmptiedAbort>,
}

/// An aborted transaction with nothing left in the log but its marker: its producer, and its
/// marker's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptiedAbort {
    pub producer_id: i64,
    pub marker_offset: u64,
}

impl OngoingTxns {
    /// A transactional batch of `producer_id` was read; `stays` when the cleaned log keeps it
    /// (whole, compacted, or emptied to hold the producer's sequence).
    pub fn on_batch(&mut self, producer_id: i64, stays: bool) {
        *self.ongoing.entry(producer_id).or_default() |= stays;
    }

    /// The marker of `producer_id`'s transaction was read: whether a batch of that transaction
    /// stays (the marker must too).
    pub fn on_marker(&mut self, producer_id: i64) -> bool {
        self.ongoing.remove(&producer_id).unwrap_or(false)
    }

    /// A listed aborted transaction holds nothing any more: the partition may forget it.
    pub fn on_emptied_abort(&mut self, emptied: EmptiedAbort) {
        self.emptied_aborts.push(emptied);
    }

    /// The listed aborted transactions found empty, in log order.
    pub fn into_emptied_aborts(self) -> Vec<EmptiedAbort> {
        self.emptied_aborts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_aborted_only_inside_its_producers_aborted_range() {
        let ranges = AbortedRanges::new(&[
            AbortedTxn {
                producer_id: 7,
                first_offset: 10,
                last_offset: 20,
            },
            AbortedTxn {
                producer_id: 8,
                first_offset: 12,
                last_offset: 25,
            },
            AbortedTxn {
                producer_id: 7,
                first_offset: 30,
                last_offset: 31,
            },
        ]);
        for (producer, offset, aborted) in [
            (7, 9, false),
            (7, 10, true),
            (7, 20, true),
            (7, 21, false),
            (7, 30, true),
            (7, 32, false),
            (8, 11, false),
            (8, 12, true),
            (9, 15, false),
        ] {
            assert_eq!(
                ranges.contains(producer, offset),
                aborted,
                "{producer}@{offset}"
            );
        }
    }

    #[test]
    fn a_marker_stays_while_a_batch_of_its_transaction_does() {
        let mut ongoing = OngoingTxns::default();
        ongoing.on_batch(1, false);
        ongoing.on_batch(1, true);
        ongoing.on_batch(1, false);
        ongoing.on_batch(2, false);
        assert!(ongoing.on_marker(1));
        assert!(!ongoing.on_marker(2));
        assert!(
            !ongoing.on_marker(3),
            "a transaction with nothing left here"
        );
        assert!(!ongoing.on_marker(1), "the marker closed the transaction");
    }
}
