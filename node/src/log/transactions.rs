//! A partition's transactions as its log records them (Kafka's ongoing transactions of the
//! producer state, and its transaction index): which producers have a transaction open and
//! since which offset, the last stable offset (LSO) below the first of them, and the aborted
//! transactions a `read_committed` fetch hands consumers so they drop those records.
//!
//! Pure: fed the transactional batches and the markers (control batches) in log order, by the
//! leader as it appends and a follower as it copies, and by recovery as it replays the log.
//! A tail truncation is followed by a replay ([`PartitionTxns::rebuild`]): a marker cut off
//! reopens its transaction, which only the records can tell.
//!
//! Invariants ([`PartitionTxns::assert_invariants`]):
//! - a producer has at most one open transaction, and `by_first` indexes exactly the open ones;
//! - aborted transactions are in marker order, each with `first_offset <= last_offset`;
//! - the LSO never passes the first offset of an open transaction nor the high watermark.

use std::collections::{BTreeMap, BTreeSet};

/// An open transaction of one producer on this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenTxn {
    /// The offset of its first record here: the LSO stays at or below it.
    pub first_offset: u64,
    pub epoch: i16,
    /// The first record's timestamp (the oldest open transaction's age is a metric).
    pub started_ms: i64,
}

/// A transaction aborted on this partition: its records from `first_offset` to
/// `last_offset` (the abort marker's offset), of `producer_id`, are skipped by
/// `read_committed` consumers (Kafka's FetchResponse `aborted_transactions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: u64,
    pub last_offset: u64,
}

/// One batch of the log, as far as transactions are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnBatch {
    /// Records of a transaction, at `base_offset` on.
    Records {
        producer_id: i64,
        epoch: i16,
        base_offset: u64,
        timestamp_ms: i64,
    },
    /// A commit or abort marker at `offset`.
    Marker {
        producer_id: i64,
        epoch: i16,
        commit: bool,
        offset: u64,
    },
}

/// Why a batch does not fit the partition's transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxnBatchError {
    /// Records or a marker at an epoch older than the producer's open transaction's: a
    /// zombie producer, or a coordinator fenced since.
    #[error("producer {producer_id}: epoch {epoch} is older than its transaction's {current}")]
    StaleEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
}

/// A partition's open and aborted transactions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartitionTxns {
    open: BTreeMap<i64, OpenTxn>,
    /// The open transactions by first offset: (first offset, producer id).
    by_first: BTreeSet<(u64, i64)>,
    /// Aborted transactions in marker order.
    aborted: Vec<AbortedTxn>,
}

impl PartitionTxns {
    /// Replays `batches` (the whole log, in order, from its start) into a fresh state.
    pub fn rebuild(
        batches: impl IntoIterator<Item = TxnBatch>,
    ) -> Result<PartitionTxns, TxnBatchError> {
        let mut txns = PartitionTxns::default();
        for batch in batches {
            txns.handle_batch(batch)?;
        }
        Ok(txns)
    }

    /// The state a snapshot held, or `None` if it breaks an invariant (two open transactions
    /// of one producer, aborted ones out of order or with their range reversed).
    pub fn restore(open: Vec<(i64, OpenTxn)>, aborted: Vec<AbortedTxn>) -> Option<PartitionTxns> {
        let mut txns = PartitionTxns::default();
        for (producer_id, txn) in open {
            if txns.open.insert(producer_id, txn).is_some() {
                return None;
            }
            txns.by_first.insert((txn.first_offset, producer_id));
        }
        let ordered = aborted
            .windows(2)
            .all(|pair| pair[0].last_offset <= pair[1].last_offset);
        if !ordered
            || txns.by_first.len() != txns.open.len()
            || aborted.iter().any(|txn| txn.first_offset > txn.last_offset)
        {
            return None;
        }
        txns.aborted = aborted;
        txns.assert_invariants();
        Some(txns)
    }

    /// One batch appended (or replayed). Records of a producer without an open transaction
    /// open one; a marker closes the producer's (an abort is remembered for fetches); a marker
    /// with nothing open is accepted and changes nothing (a coordinator writing a decision
    /// again after taking over). Returns the transaction a marker closed.
    pub fn handle_batch(&mut self, batch: TxnBatch) -> Result<Option<OpenTxn>, TxnBatchError> {
        let closed = match batch {
            TxnBatch::Records {
                producer_id,
                epoch,
                base_offset,
                timestamp_ms,
            } => {
                match self.open.get(&producer_id) {
                    Some(open) if epoch < open.epoch => {
                        return Err(TxnBatchError::StaleEpoch {
                            producer_id,
                            epoch,
                            current: open.epoch,
                        });
                    }
                    Some(_) => {}
                    None => {
                        self.open.insert(
                            producer_id,
                            OpenTxn {
                                first_offset: base_offset,
                                epoch,
                                started_ms: timestamp_ms,
                            },
                        );
                        self.by_first.insert((base_offset, producer_id));
                    }
                }
                None
            }
            TxnBatch::Marker {
                producer_id,
                epoch,
                commit,
                offset,
            } => {
                let Some(open) = self.open.get(&producer_id).copied() else {
                    return Ok(None);
                };
                if epoch < open.epoch {
                    return Err(TxnBatchError::StaleEpoch {
                        producer_id,
                        epoch,
                        current: open.epoch,
                    });
                }
                self.open.remove(&producer_id);
                self.by_first.remove(&(open.first_offset, producer_id));
                if !commit {
                    self.aborted.push(AbortedTxn {
                        producer_id,
                        first_offset: open.first_offset,
                        last_offset: offset,
                    });
                }
                Some(open)
            }
        };
        self.assert_invariants();
        Ok(closed)
    }

    /// The last stable offset: below the first record of any open transaction, and never
    /// past the high watermark. `read_committed` reads stop there.
    pub fn last_stable_offset(&self, high_watermark: u64) -> u64 {
        self.by_first
            .first()
            .map_or(high_watermark, |(first, _)| (*first).min(high_watermark))
    }

    /// The aborted transactions with records in `[from, to)`, for a `read_committed` fetch of
    /// that range.
    pub fn aborted_between(&self, from: u64, to: u64) -> impl Iterator<Item = &AbortedTxn> {
        // Markers are in offset order: those at `from` or later may hold records in range.
        let start = self.aborted.partition_point(|txn| txn.last_offset < from);
        self.aborted[start..]
            .iter()
            .filter(move |txn| txn.first_offset < to)
    }

    /// The aborted transactions still in the log, in marker order.
    pub fn aborted(&self) -> &[AbortedTxn] {
        &self.aborted
    }

    /// The open transactions, by producer id.
    pub fn open(&self) -> &BTreeMap<i64, OpenTxn> {
        &self.open
    }

    /// The open transaction that started first: what holds the LSO back.
    pub fn oldest_open(&self) -> Option<(i64, OpenTxn)> {
        let (_, producer_id) = self.by_first.first()?;
        Some((*producer_id, self.open[producer_id]))
    }

    /// Forgets the aborted transactions of `producer_id` whose marker is at `marker_offset`,
    /// for each pair (compaction removed their records).
    pub fn forget_aborted(&mut self, emptied: impl IntoIterator<Item = (i64, u64)>) {
        let emptied: BTreeSet<(i64, u64)> = emptied.into_iter().collect();
        self.aborted
            .retain(|txn| !emptied.contains(&(txn.producer_id, txn.last_offset)));
        self.assert_invariants();
    }

    /// Forgets aborted transactions wholly below `log_start` (retention deleted their records).
    pub fn forget_below(&mut self, log_start: u64) {
        let gone = self
            .aborted
            .partition_point(|txn| txn.last_offset < log_start);
        self.aborted.drain(..gone);
        self.assert_invariants();
    }

    pub fn assert_invariants(&self) {
        assert_eq!(self.open.len(), self.by_first.len());
        for (producer_id, open) in &self.open {
            assert!(self.by_first.contains(&(open.first_offset, *producer_id)));
        }
        for pair in self.aborted.windows(2) {
            assert!(pair[0].last_offset <= pair[1].last_offset, "{pair:?}");
        }
        for txn in &self.aborted {
            assert!(txn.first_offset <= txn.last_offset, "{txn:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(producer_id: i64, epoch: i16, base_offset: u64) -> TxnBatch {
        TxnBatch::Records {
            producer_id,
            epoch,
            base_offset,
            timestamp_ms: base_offset as i64 * 10,
        }
    }

    fn marker(producer_id: i64, epoch: i16, commit: bool, offset: u64) -> TxnBatch {
        TxnBatch::Marker {
            producer_id,
            epoch,
            commit,
            offset,
        }
    }

    /// Two producers interleave; the LSO waits below the first open transaction, moves when
    /// it closes, and aborted ones are remembered with their range.
    #[test]
    fn the_lso_waits_for_the_first_open_transaction() {
        let mut txns = PartitionTxns::default();
        assert_eq!(txns.last_stable_offset(10), 10, "nothing open: the HW");
        txns.handle_batch(records(1, 0, 10)).unwrap();
        txns.handle_batch(records(2, 0, 12)).unwrap();
        txns.handle_batch(records(1, 0, 14)).unwrap();
        assert_eq!(txns.last_stable_offset(16), 10);
        assert_eq!(txns.last_stable_offset(5), 5, "never past the HW");
        assert_eq!(txns.oldest_open().map(|(id, _)| id), Some(1));
        let closed = txns.handle_batch(marker(1, 0, false, 16)).unwrap();
        assert_eq!(closed.map(|open| open.first_offset), Some(10));
        assert_eq!(txns.last_stable_offset(17), 12, "producer 2's is next");
        txns.handle_batch(marker(2, 0, true, 17)).unwrap();
        assert_eq!(txns.last_stable_offset(18), 18);
        assert_eq!(
            txns.aborted_between(0, 100).copied().collect::<Vec<_>>(),
            [AbortedTxn {
                producer_id: 1,
                first_offset: 10,
                last_offset: 16
            }],
            "only the abort"
        );
        assert_eq!(txns.aborted_between(17, 100).count(), 0, "ends before");
        assert_eq!(txns.aborted_between(0, 10).count(), 0, "starts after");
        assert_eq!(txns.aborted_between(16, 17).count(), 1, "its marker");
    }

    /// A fenced producer's records and a stale coordinator's marker are refused; a marker
    /// written again after a takeover changes nothing.
    #[test]
    fn stale_epochs_are_refused_and_repeated_markers_are_harmless() {
        let mut txns = PartitionTxns::default();
        txns.handle_batch(records(1, 3, 0)).unwrap();
        assert_eq!(
            txns.handle_batch(records(1, 2, 5)),
            Err(TxnBatchError::StaleEpoch {
                producer_id: 1,
                epoch: 2,
                current: 3
            })
        );
        assert!(txns.handle_batch(marker(1, 2, true, 6)).is_err());
        // A fencing abort comes at a bumped epoch.
        txns.handle_batch(marker(1, 4, false, 6)).unwrap();
        assert_eq!(txns.handle_batch(marker(1, 4, false, 7)), Ok(None));
        assert_eq!(txns.aborted_between(0, 10).count(), 1);
    }

    /// Replaying the log gives the same state as appending it; retention forgets aborted
    /// transactions below the log start.
    #[test]
    fn a_replay_rebuilds_the_state_and_retention_forgets() {
        let log = [
            records(1, 0, 0),
            marker(1, 0, false, 3),
            records(2, 0, 4),
            records(1, 0, 6),
            marker(1, 0, false, 8),
            records(3, 1, 9),
        ];
        let mut appended = PartitionTxns::default();
        for batch in log {
            appended.handle_batch(batch).unwrap();
        }
        let mut replayed = PartitionTxns::rebuild(log).unwrap();
        assert_eq!(replayed.open(), appended.open());
        assert_eq!(replayed.last_stable_offset(20), 4);
        assert_eq!(replayed.aborted_between(0, 20).count(), 2);
        replayed.forget_below(4);
        assert_eq!(
            replayed
                .aborted_between(0, 20)
                .map(|txn| txn.first_offset)
                .collect::<Vec<_>>(),
            [6]
        );
        // A replay of a log cut before producer 1's second marker finds it open again.
        let cut = PartitionTxns::rebuild(log[..4].iter().copied()).unwrap();
        assert_eq!(cut.open()[&1].first_offset, 6);
        assert_eq!(cut.last_stable_offset(20), 4);
    }
}
