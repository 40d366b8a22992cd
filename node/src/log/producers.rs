//! Idempotent-producer state of one partition (Kafka's `ProducerStateManager`): for each
//! producer id, its epoch and the sequence ranges and offsets of its last few batches, so a
//! retried batch is recognised and answered with its original offsets instead of written twice,
//! and a batch that skips sequences or comes from a fenced epoch is refused.
//!
//! Pure: no IO, no runtime, time as an argument. The log feeds it batch headers in log order —
//! the leader after [`ProducerStates::check`], followers and rebuild scans verbatim — so every
//! replica that holds the same batches holds the same state.
//!
//! Sequences count records: a batch with base sequence `s` and `n` records covers
//! `s ..= s + n - 1`, and the next batch must start at `s + n`, wrapping from `i32::MAX` to 0.
//!
//! Transactions are part of a producer's state (as in Kafka's): each producer's open
//! transaction on the partition and the aborted ones, in [`PartitionTxns`], fed the same
//! headers. A transaction marker (a control batch) closes its producer's transaction; at a
//! newer epoch it fences the older one, whose sequences then start afresh.
//!
//! Invariants: every entry holds up to [`RETAINED_BATCHES`] batches, oldest first, all of the
//! entry's epoch (none after a marker bumped the epoch); a producer with an open transaction
//! never expires; a snapshot decodes to exactly what was encoded or to an error, never a panic.

use std::collections::BTreeMap;

use strata_wire::batch::BatchHeader;

use super::transactions::{AbortedTxn, OpenTxn, PartitionTxns, TxnBatch};

/// Batches remembered per producer: Kafka lets a producer have five requests in flight, so a
/// retry can only repeat one of the last five.
pub const RETAINED_BATCHES: usize = 5;
/// A producer whose last batch is older than this is forgotten when a snapshot is taken
/// (Kafka's `producer.id.expiration.ms` default, one day).
pub const PRODUCER_EXPIRATION_MS: i64 = 86_400_000;

/// Where one retained batch sits in the sequence space and in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

/// One producer's state.
#[derive(Debug, Clone)]
pub struct ProducerEntry {
    pub epoch: i16,
    /// Max timestamp of the last batch applied; expiry compares it with `now_ms`.
    pub last_timestamp_ms: i64,
    /// Oldest first; `batches[..len]` are live (none after a marker bumped the epoch). A fixed
    /// array: applying allocates nothing.
    batches: [BatchMetadata; RETAINED_BATCHES],
    len: u8,
    /// The newest coordinator epoch of the producer's markers here
    /// ([`NO_COORDINATOR_EPOCH`] before any): a marker from an older coordinator is refused.
    pub coordinator_epoch: i32,
}

/// A producer entry's coordinator epoch before any marker (and a marker's, written before
/// markers carried one).
pub const NO_COORDINATOR_EPOCH: i32 = -1;

/// Equal when the epoch, timestamp and live batches are; slots past `len` do not count.
impl PartialEq for ProducerEntry {
    fn eq(&self, other: &ProducerEntry) -> bool {
        self.epoch == other.epoch
            && self.last_timestamp_ms == other.last_timestamp_ms
            && self.batches() == other.batches()
            && self.coordinator_epoch == other.coordinator_epoch
    }
}

impl Eq for ProducerEntry {}

impl ProducerEntry {
    fn new(epoch: i16, batch: BatchMetadata, timestamp_ms: i64) -> ProducerEntry {
        let mut batches = [BatchMetadata::default(); RETAINED_BATCHES];
        batches[0] = batch;
        ProducerEntry {
            epoch,
            last_timestamp_ms: timestamp_ms,
            batches,
            len: 1,
            coordinator_epoch: NO_COORDINATOR_EPOCH,
        }
    }

    /// The retained batches, oldest first.
    pub fn batches(&self) -> &[BatchMetadata] {
        &self.batches[..usize::from(self.len)]
    }

    /// The last batch written at the entry's epoch, if any.
    pub fn last(&self) -> Option<&BatchMetadata> {
        self.batches().last()
    }

    /// An entry with no batch yet: a marker gave the producer this epoch.
    fn fenced_at(epoch: i16, timestamp_ms: i64) -> ProducerEntry {
        ProducerEntry {
            epoch,
            last_timestamp_ms: timestamp_ms,
            batches: [BatchMetadata::default(); RETAINED_BATCHES],
            len: 0,
            coordinator_epoch: NO_COORDINATOR_EPOCH,
        }
    }

    fn push(&mut self, batch: BatchMetadata) {
        let len = usize::from(self.len);
        if len == RETAINED_BATCHES {
            self.batches.copy_within(1.., 0);
            self.batches[RETAINED_BATCHES - 1] = batch;
        } else {
            self.batches[len] = batch;
            self.len += 1;
        }
    }
}

/// What the leader should do with an idempotent batch that passed [`ProducerStates::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New records: stamp, apply, write.
    Append,
    /// A retry of a batch the log already holds at these offsets: write nothing, answer them.
    Duplicate { base_offset: u64, last_offset: u64 },
}

/// Why an idempotent batch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    /// The batch does not start where the producer's last batch ended (records were lost in
    /// between, or a new epoch did not start at 0).
    #[error("producer {producer_id}: expected sequence {expected}, got {got}")]
    OutOfOrderSequence {
        producer_id: i64,
        expected: i32,
        got: i32,
    },
    /// The batch comes from an older epoch of the producer: another instance has taken over.
    #[error("producer {producer_id}: epoch {epoch} is fenced by epoch {current_epoch}")]
    ProducerFenced {
        producer_id: i64,
        epoch: i16,
        current_epoch: i16,
    },
    /// A marker from a coordinator older than one whose marker the producer has here: the
    /// transactional id moved to a newer coordinator since.
    #[error(
        "producer {producer_id}: a marker of coordinator epoch {coordinator_epoch} after one of {current}"
    )]
    CoordinatorFenced {
        producer_id: i64,
        coordinator_epoch: i32,
        current: i32,
    },
}

/// Why snapshot bytes were not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Shorter than its fixed fields or than its entry count says.
    #[error("truncated producer snapshot ({0} bytes)")]
    Truncated(usize),
    #[error("not a producer snapshot (bad magic)")]
    BadMagic,
    #[error("unsupported producer snapshot version {0}")]
    UnsupportedVersion(u16),
    /// Longer than its entry count says.
    #[error("producer snapshot has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("producer snapshot CRC mismatch")]
    BadCrc,
    /// The CRC matched but a field breaks an invariant (a writer bug, not media damage).
    #[error("invalid producer snapshot: {0}")]
    Invalid(&'static str),
}

/// A decoded snapshot: the state of every producer after the batches below `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSnapshot {
    pub offset: u64,
    pub states: ProducerStates,
}

/// Producer id → state, and the partition's transactions. A `BTreeMap` so snapshots are
/// deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStates {
    producers: BTreeMap<i64, ProducerEntry>,
    transactions: PartitionTxns,
}

/// `seq + delta` in the sequence space `0..=i32::MAX`, wrapping to 0 as Kafka's
/// `DefaultRecordBatch.incrementSequence` does. Total for any input (followers apply verbatim).
pub fn sequence_add(seq: i32, delta: i64) -> i32 {
    (i64::from(seq) + delta).rem_euclid(i64::from(i32::MAX) + 1) as i32
}

/// The sequence of the batch's last record.
fn last_sequence(header: &BatchHeader) -> i32 {
    sequence_add(header.base_sequence, i64::from(header.offset_count) - 1)
}

const MAGIC: &[u8; 8] = b"STRATAP1";
/// 2 added the transactions after the producers, 3 each producer's coordinator epoch (versions
/// 1 and 2 are still read).
const VERSION: u16 = 3;
/// magic, version u16, reserved u16, offset u64, count u32.
const FIXED_LEN: usize = 8 + 2 + 2 + 8 + 4;
/// producer_id i64, epoch i16, batch count u8, reserved u8, last timestamp i64, coordinator
/// epoch i32 (from version 3).
const ENTRY_LEN: usize = 8 + 2 + 1 + 1 + 8 + 4;
/// first_seq i32, last_seq i32, base_offset u64, last_offset u64.
const BATCH_LEN: usize = 4 + 4 + 8 + 8;
/// producer_id i64, first_offset u64, epoch i16, reserved u16, started_ms i64.
const OPEN_TXN_LEN: usize = 8 + 8 + 2 + 2 + 8;
/// producer_id i64, first_offset u64, last_offset u64.
const ABORTED_TXN_LEN: usize = 8 + 8 + 8;
const CRC_LEN: usize = 4;

impl ProducerStates {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Every producer's state, by id.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(id, entry)| (*id, entry))
    }

    /// Each producer's last batch, by its last offset (what the cleaner must keep).
    pub fn last_offsets(&self) -> std::collections::HashMap<i64, u64> {
        self.producers
            .iter()
            .filter_map(|(producer_id, entry)| Some((*producer_id, entry.last()?.last_offset)))
            .collect()
    }

    /// The partition's open and aborted transactions.
    pub fn transactions(&self) -> &PartitionTxns {
        &self.transactions
    }

    /// Forgets the aborted transactions compaction emptied: (producer id, marker offset) pairs.
    pub fn forget_emptied_aborts(&mut self, emptied: impl IntoIterator<Item = (i64, u64)>) {
        self.transactions.forget_aborted(emptied);
    }

    /// Forgets aborted transactions wholly below `log_start` (their records are gone).
    pub fn forget_transactions_below(&mut self, log_start: u64) {
        self.transactions.forget_below(log_start);
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Decides what to do with an idempotent batch (`header.is_idempotent()`), as its leader.
    /// Does not change the state: [`Self::apply`] the batch once it is stamped.
    pub fn check(&self, header: &BatchHeader) -> Result<SequenceCheck, ProducerError> {
        debug_assert!(header.is_idempotent());
        let producer_id = header.producer_id;
        let Some(entry) = self
            .producers
            .get(&producer_id)
            .filter(|entry| entry.last().is_some() || header.producer_epoch != entry.epoch)
        else {
            // A producer's first batch starts at 0. Accepting any sequence here would let a
            // later batch that overtook the first (another connection, a retry) start the
            // state, and the first could then never land. A producer idle past its expiry
            // resumes by taking a new epoch (sequences from 0 again).
            return match header.base_sequence {
                0 => Ok(SequenceCheck::Append),
                got => Err(ProducerError::OutOfOrderSequence {
                    producer_id,
                    expected: 0,
                    got,
                }),
            };
        };
        let (epoch, first_seq) = (header.producer_epoch, header.base_sequence);
        if epoch < entry.epoch {
            return Err(ProducerError::ProducerFenced {
                producer_id,
                epoch,
                current_epoch: entry.epoch,
            });
        }
        if epoch > entry.epoch {
            // A bumped epoch starts its sequences afresh.
            return match first_seq {
                0 => Ok(SequenceCheck::Append),
                got => Err(ProducerError::OutOfOrderSequence {
                    producer_id,
                    expected: 0,
                    got,
                }),
            };
        }
        let last_seq = last_sequence(header);
        if let Some(original) = entry
            .batches()
            .iter()
            .find(|batch| batch.first_seq == first_seq && batch.last_seq == last_seq)
        {
            return Ok(SequenceCheck::Duplicate {
                base_offset: original.base_offset,
                last_offset: original.last_offset,
            });
        }
        let last = entry
            .last()
            .expect("an entry at the batch's epoch without batches is new");
        let expected = sequence_add(last.last_seq, 1);
        if first_seq == expected {
            Ok(SequenceCheck::Append)
        } else {
            Err(ProducerError::OutOfOrderSequence {
                producer_id,
                expected,
                got: first_seq,
            })
        }
    }

    /// Whether a marker for `producer_id` at `epoch` from a coordinator at `coordinator_epoch`
    /// may be written (as its leader): not at an epoch older than the producer's, which a newer
    /// coordinator decision has fenced, and not from a coordinator older than one whose marker
    /// is here (a late marker of a coordinator that lost the id must not end the transaction
    /// its successor let begin since).
    pub fn check_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), ProducerError> {
        match self.producers.get(&producer_id) {
            Some(entry) if epoch < entry.epoch => Err(ProducerError::ProducerFenced {
                producer_id,
                epoch,
                current_epoch: entry.epoch,
            }),
            Some(entry) if coordinator_epoch < entry.coordinator_epoch => {
                Err(ProducerError::CoordinatorFenced {
                    producer_id,
                    coordinator_epoch,
                    current: entry.coordinator_epoch,
                })
            }
            _ => Ok(()),
        }
    }

    /// Records a batch that is (about to be) in the log, with its stamped offsets: an
    /// idempotent producer's (transactional or not) or a marker. Checks nothing: the log is
    /// the truth, and a follower or a rebuild scan must end in the state the leader had. A
    /// batch of a different epoch than the entry's starts the entry afresh.
    pub fn apply(&mut self, header: &BatchHeader) {
        if header.is_control() {
            self.apply_marker(header);
            return;
        }
        if !header.is_idempotent() {
            return;
        }
        if header.is_transactional() {
            let records = TxnBatch::Records {
                producer_id: header.producer_id,
                epoch: header.producer_epoch,
                base_offset: header.base_offset,
                timestamp_ms: header.first_timestamp_ms,
            };
            if let Err(error) = self.transactions.handle_batch(records) {
                // The leader fenced such a batch; a replica records what its log holds.
                tracing::warn!(offset = header.base_offset, "{error}");
            }
        }
        self.apply_records(header);
    }

    /// A marker closes its producer's open transaction; at a newer epoch it fences the older
    /// (the retained batches go: the new epoch's sequences start at 0).
    fn apply_marker(&mut self, header: &BatchHeader) {
        let marker = TxnBatch::Marker {
            producer_id: header.producer_id,
            epoch: header.producer_epoch,
            commit: header.marker_commits(),
            offset: header.base_offset,
        };
        if let Err(error) = self.transactions.handle_batch(marker) {
            tracing::warn!(offset = header.base_offset, "{error}");
        }
        let (epoch, timestamp_ms) = (header.producer_epoch, header.max_timestamp_ms);
        let entry = self
            .producers
            .entry(header.producer_id)
            .or_insert_with(|| ProducerEntry::fenced_at(epoch, timestamp_ms));
        if epoch > entry.epoch {
            let coordinator_epoch = entry.coordinator_epoch;
            *entry = ProducerEntry::fenced_at(epoch, timestamp_ms);
            entry.coordinator_epoch = coordinator_epoch;
        }
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(timestamp_ms);
        entry.coordinator_epoch = entry
            .coordinator_epoch
            .max(header.marker_coordinator_epoch());
    }

    fn apply_records(&mut self, header: &BatchHeader) {
        let batch = BatchMetadata {
            first_seq: header.base_sequence,
            last_seq: last_sequence(header),
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
        };
        let (epoch, timestamp_ms) = (header.producer_epoch, header.max_timestamp_ms);
        match self.producers.get_mut(&header.producer_id) {
            Some(entry) if entry.epoch == epoch => {
                entry.push(batch);
                entry.last_timestamp_ms = timestamp_ms;
            }
            Some(entry) => {
                let coordinator_epoch = entry.coordinator_epoch;
                *entry = ProducerEntry::new(epoch, batch, timestamp_ms);
                entry.coordinator_epoch = coordinator_epoch;
            }
            None => {
                self.producers.insert(
                    header.producer_id,
                    ProducerEntry::new(epoch, batch, timestamp_ms),
                );
            }
        }
    }

    /// Forgets producers whose last batch is [`PRODUCER_EXPIRATION_MS`] or more older than
    /// `now_ms`. Returns how many went.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let before = self.producers.len();
        let open = self.transactions.open();
        self.producers.retain(|producer_id, entry| {
            now_ms.saturating_sub(entry.last_timestamp_ms) < PRODUCER_EXPIRATION_MS
                || open.contains_key(producer_id)
        });
        before - self.producers.len()
    }

    /// The snapshot bytes for this state, valid for the log below `offset` (see
    /// `docs/format.md`): fixed fields, entries by producer id, CRC32C of everything before it.
    pub fn encode(&self, offset: u64) -> Vec<u8> {
        let len = FIXED_LEN
            + self
                .producers
                .values()
                .map(|entry| ENTRY_LEN + entry.batches().len() * BATCH_LEN)
                .sum::<usize>()
            + 4
            + self.transactions.open().len() * OPEN_TXN_LEN
            + 4
            + self.transactions.aborted().len() * ABORTED_TXN_LEN
            + CRC_LEN;
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u16.to_le_bytes());
        bytes.extend_from_slice(&offset.to_le_bytes());
        bytes.extend_from_slice(&(self.producers.len() as u32).to_le_bytes());
        for (producer_id, entry) in &self.producers {
            bytes.extend_from_slice(&producer_id.to_le_bytes());
            bytes.extend_from_slice(&entry.epoch.to_le_bytes());
            bytes.push(entry.len);
            bytes.push(0);
            bytes.extend_from_slice(&entry.last_timestamp_ms.to_le_bytes());
            bytes.extend_from_slice(&entry.coordinator_epoch.to_le_bytes());
            for batch in entry.batches() {
                bytes.extend_from_slice(&batch.first_seq.to_le_bytes());
                bytes.extend_from_slice(&batch.last_seq.to_le_bytes());
                bytes.extend_from_slice(&batch.base_offset.to_le_bytes());
                bytes.extend_from_slice(&batch.last_offset.to_le_bytes());
            }
        }
        let open = self.transactions.open();
        bytes.extend_from_slice(&(open.len() as u32).to_le_bytes());
        for (producer_id, txn) in open {
            bytes.extend_from_slice(&producer_id.to_le_bytes());
            bytes.extend_from_slice(&txn.first_offset.to_le_bytes());
            bytes.extend_from_slice(&txn.epoch.to_le_bytes());
            bytes.extend_from_slice(&0u16.to_le_bytes());
            bytes.extend_from_slice(&txn.started_ms.to_le_bytes());
        }
        let aborted = self.transactions.aborted();
        bytes.extend_from_slice(&(aborted.len() as u32).to_le_bytes());
        for txn in aborted {
            bytes.extend_from_slice(&txn.producer_id.to_le_bytes());
            bytes.extend_from_slice(&txn.first_offset.to_le_bytes());
            bytes.extend_from_slice(&txn.last_offset.to_le_bytes());
        }
        let crc = strata_wire::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(bytes.len(), len);
        bytes
    }

    /// Reads snapshot bytes back. Any damage, truncation or unknown version is an error.
    pub fn decode(bytes: &[u8]) -> Result<ProducerSnapshot, SnapshotError> {
        if bytes.len() < FIXED_LEN + CRC_LEN {
            return Err(SnapshotError::Truncated(bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let (body, crc) = bytes.split_at(bytes.len() - CRC_LEN);
        if strata_wire::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(SnapshotError::BadCrc);
        }
        let mut reader = Reader { bytes: body, at: 8 };
        let version = u16::from_le_bytes(reader.take()?);
        if !(1..=VERSION).contains(&version) {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        if u16::from_le_bytes(reader.take()?) != 0 {
            return Err(SnapshotError::Invalid("reserved bits set"));
        }
        let offset = u64::from_le_bytes(reader.take()?);
        let count = u32::from_le_bytes(reader.take()?);
        let mut producers = BTreeMap::new();
        let mut previous_id = None;
        for _ in 0..count {
            let producer_id = i64::from_le_bytes(reader.take()?);
            let epoch = i16::from_le_bytes(reader.take()?);
            let [len, reserved] = reader.take::<2>()?;
            let last_timestamp_ms = i64::from_le_bytes(reader.take()?);
            let coordinator_epoch = if version >= 3 {
                i32::from_le_bytes(reader.take()?)
            } else {
                NO_COORDINATOR_EPOCH
            };
            if previous_id.is_some_and(|previous| producer_id <= previous) {
                return Err(SnapshotError::Invalid("producer ids out of order"));
            }
            if (version == 1 && len == 0) || usize::from(len) > RETAINED_BATCHES || reserved != 0 {
                return Err(SnapshotError::Invalid("bad batch count"));
            }
            previous_id = Some(producer_id);
            let mut batches = [BatchMetadata::default(); RETAINED_BATCHES];
            for batch in &mut batches[..usize::from(len)] {
                *batch = BatchMetadata {
                    first_seq: i32::from_le_bytes(reader.take()?),
                    last_seq: i32::from_le_bytes(reader.take()?),
                    base_offset: u64::from_le_bytes(reader.take()?),
                    last_offset: u64::from_le_bytes(reader.take()?),
                };
                if batch.last_offset < batch.base_offset || batch.last_offset >= offset {
                    return Err(SnapshotError::Invalid("batch offsets"));
                }
            }
            producers.insert(
                producer_id,
                ProducerEntry {
                    epoch,
                    last_timestamp_ms,
                    batches,
                    len,
                    coordinator_epoch,
                },
            );
        }
        let transactions = if version == 1 {
            PartitionTxns::default()
        } else {
            decode_transactions(&mut reader, offset)?
        };
        if reader.at != body.len() {
            return Err(SnapshotError::TrailingBytes(body.len() - reader.at));
        }
        Ok(ProducerSnapshot {
            offset,
            states: ProducerStates {
                producers,
                transactions,
            },
        })
    }
}

/// The transactions section of a snapshot for the log below `offset`.
fn decode_transactions(reader: &mut Reader, offset: u64) -> Result<PartitionTxns, SnapshotError> {
    let count = u32::from_le_bytes(reader.take()?);
    let mut open = Vec::new();
    for _ in 0..count {
        let producer_id = i64::from_le_bytes(reader.take()?);
        let first_offset = u64::from_le_bytes(reader.take()?);
        let epoch = i16::from_le_bytes(reader.take()?);
        if u16::from_le_bytes(reader.take()?) != 0 {
            return Err(SnapshotError::Invalid("reserved bits set"));
        }
        let started_ms = i64::from_le_bytes(reader.take()?);
        if first_offset >= offset {
            return Err(SnapshotError::Invalid("open transaction offsets"));
        }
        let txn = OpenTxn {
            first_offset,
            epoch,
            started_ms,
        };
        open.push((producer_id, txn));
    }
    let count = u32::from_le_bytes(reader.take()?);
    let mut aborted = Vec::new();
    for _ in 0..count {
        let txn = AbortedTxn {
            producer_id: i64::from_le_bytes(reader.take()?),
            first_offset: u64::from_le_bytes(reader.take()?),
            last_offset: u64::from_le_bytes(reader.take()?),
        };
        if txn.last_offset >= offset {
            return Err(SnapshotError::Invalid("aborted transaction offsets"));
        }
        aborted.push(txn);
    }
    PartitionTxns::restore(open, aborted).ok_or(SnapshotError::Invalid("transactions"))
}

/// Reads fixed-size fields in order, failing (never panicking) when the bytes run out.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let field = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or(SnapshotError::Truncated(self.bytes.len() + CRC_LEN))?;
        self.at += N;
        Ok(field.try_into().expect("N bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::batch::{FORMAT_VERSION, HEADER_LEN};

    /// A stamped header: producer, epoch, base sequence, record count, base offset, timestamp.
    fn header(
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        records: u32,
        base_offset: u64,
        timestamp_ms: i64,
    ) -> BatchHeader {
        BatchHeader {
            format: strata_wire::batch::BatchFormat::Strata,
            base_offset,
            leader_epoch: 0,
            crc: 0,
            batch_len: HEADER_LEN as u32,
            body_len: 0,
            version: FORMAT_VERSION,
            attributes: 0,
            offset_count: records,
            first_timestamp_ms: timestamp_ms,
            max_timestamp_ms: timestamp_ms,
            producer_id,
            base_sequence,
            producer_epoch: epoch,
        }
    }

    /// Producer 7 at epoch 3 has written seq 0..=4 at offsets 100..=104 and seq 5..=9 at
    /// 200..=204; producer 8 at epoch 0 wrote seq 2147483645..=2147483647 at 300..=302.
    fn states() -> ProducerStates {
        let mut states = ProducerStates::default();
        states.apply(&header(7, 3, 0, 5, 100, 1_000));
        states.apply(&header(7, 3, 5, 5, 200, 2_000));
        states.apply(&header(8, 0, i32::MAX - 2, 3, 300, 3_000));
        states
    }

    #[test]
    fn check_rules_from_a_table() {
        use ProducerError::*;
        use SequenceCheck::*;
        type Outcome = Result<SequenceCheck, ProducerError>;
        // (producer, epoch, base sequence, records, expected outcome)
        let table: &[(i64, i16, i32, u32, Outcome)] = &[
            // An unknown producer starts at 0, whatever its epoch.
            (9, 0, 0, 1, Ok(Append)),
            (9, 4, 0, 2, Ok(Append)),
            (
                9,
                4,
                1234,
                2,
                Err(OutOfOrderSequence {
                    producer_id: 9,
                    expected: 0,
                    got: 1234,
                }),
            ),
            // Same epoch: continue at last_seq + 1.
            (7, 3, 10, 1, Ok(Append)),
            (7, 3, 10, 50, Ok(Append)),
            // Retries of retained batches are duplicates with their original offsets.
            (
                7,
                3,
                0,
                5,
                Ok(Duplicate {
                    base_offset: 100,
                    last_offset: 104,
                }),
            ),
            (
                7,
                3,
                5,
                5,
                Ok(Duplicate {
                    base_offset: 200,
                    last_offset: 204,
                }),
            ),
            // Same first sequence but a different range is not a duplicate: it is out of order.
            (
                7,
                3,
                5,
                4,
                Err(OutOfOrderSequence {
                    producer_id: 7,
                    expected: 10,
                    got: 5,
                }),
            ),
            // Gaps and repeats of unretained ranges.
            (
                7,
                3,
                11,
                1,
                Err(OutOfOrderSequence {
                    producer_id: 7,
                    expected: 10,
                    got: 11,
                }),
            ),
            (
                7,
                3,
                3,
                2,
                Err(OutOfOrderSequence {
                    producer_id: 7,
                    expected: 10,
                    got: 3,
                }),
            ),
            // Older epoch: fenced, whatever the sequence.
            (
                7,
                2,
                10,
                1,
                Err(ProducerFenced {
                    producer_id: 7,
                    epoch: 2,
                    current_epoch: 3,
                }),
            ),
            (
                7,
                2,
                0,
                5,
                Err(ProducerFenced {
                    producer_id: 7,
                    epoch: 2,
                    current_epoch: 3,
                }),
            ),
            // Newer epoch: must start at 0.
            (7, 4, 0, 3, Ok(Append)),
            (
                7,
                4,
                10,
                1,
                Err(OutOfOrderSequence {
                    producer_id: 7,
                    expected: 0,
                    got: 10,
                }),
            ),
            // Wrapping: after i32::MAX comes 0.
            (8, 0, 0, 4, Ok(Append)),
            (
                8,
                0,
                i32::MAX - 2,
                3,
                Ok(Duplicate {
                    base_offset: 300,
                    last_offset: 302,
                }),
            ),
            (
                8,
                0,
                1,
                1,
                Err(OutOfOrderSequence {
                    producer_id: 8,
                    expected: 0,
                    got: 1,
                }),
            ),
        ];
        let states = states();
        for &(producer_id, epoch, base_sequence, records, expected) in table {
            let batch = header(producer_id, epoch, base_sequence, records, 0, 0);
            assert_eq!(
                states.check(&batch),
                expected,
                "producer {producer_id} epoch {epoch} seq {base_sequence} x{records}"
            );
        }
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        for (seq, delta, expected) in [
            (0, 0, 0),
            (0, 4, 4),
            (i32::MAX, 1, 0),
            (i32::MAX - 1, 3, 1),
            (5, -1, 4),
            (-1, 1, 0),
        ] {
            assert_eq!(sequence_add(seq, delta), expected, "{seq} + {delta}");
        }
        let wrapping = header(1, 0, i32::MAX - 1, 4, 0, 0);
        assert_eq!(last_sequence(&wrapping), 1);
    }

    #[test]
    fn apply_keeps_the_last_five_batches_and_a_new_epoch_starts_afresh() {
        let mut states = ProducerStates::default();
        for at in 0..7 {
            states.apply(&header(1, 0, at * 2, 2, at as u64 * 2, at.into()));
        }
        let entry = states.get(1).unwrap();
        let firsts: Vec<i32> = entry.batches().iter().map(|b| b.first_seq).collect();
        assert_eq!(firsts, [4, 6, 8, 10, 12], "oldest dropped first");
        assert_eq!(entry.last_timestamp_ms, 6);
        // The oldest forgotten batch is no longer a duplicate: it is out of order.
        assert!(matches!(
            states.check(&header(1, 0, 0, 2, 0, 0)),
            Err(ProducerError::OutOfOrderSequence { expected: 14, .. })
        ));
        states.apply(&header(1, 1, 0, 1, 14, 7));
        let entry = states.get(1).unwrap();
        assert_eq!((entry.epoch, entry.batches().len()), (1, 1));
        assert_eq!(
            *entry.last().unwrap(),
            BatchMetadata {
                first_seq: 0,
                last_seq: 0,
                base_offset: 14,
                last_offset: 14
            }
        );
    }

    #[test]
    fn expiry_by_last_timestamp() {
        let mut states = states();
        // Producer 7's last batch is at 2_000, producer 8's at 3_000.
        for (now_ms, left) in [
            (0, 2),
            (2_000 + PRODUCER_EXPIRATION_MS - 1, 2),
            (2_000 + PRODUCER_EXPIRATION_MS, 1),
            (3_000 + PRODUCER_EXPIRATION_MS, 0),
        ] {
            states.expire(now_ms);
            assert_eq!(states.len(), left, "now {now_ms}");
        }
    }

    /// [`states`], and producer 10's transaction open at 350, producer 11's aborted at 370.
    fn states_with_transactions() -> ProducerStates {
        use strata_wire::batch::attributes::{CONTROL, TRANSACTIONAL};
        let mut states = states();
        let mut open = header(10, 1, 0, 2, 350, 3_500);
        open.attributes = TRANSACTIONAL;
        states.apply(&open);
        let mut aborted = header(11, 0, 0, 1, 360, 3_600);
        aborted.attributes = TRANSACTIONAL;
        states.apply(&aborted);
        let mut marker = header(11, 0, -1, 1, 370, 3_700);
        marker.attributes = TRANSACTIONAL | CONTROL;
        states.apply(&marker);
        assert_eq!(states.transactions().open().len(), 1);
        assert_eq!(states.transactions().aborted().len(), 1);
        states
    }

    #[test]
    fn snapshot_round_trip() {
        let states = states_with_transactions();
        let bytes = states.encode(400);
        let snapshot = ProducerStates::decode(&bytes).unwrap();
        assert_eq!(snapshot.offset, 400);
        assert_eq!(snapshot.states, states);
        let empty = ProducerStates::default().encode(0);
        assert_eq!(
            ProducerStates::decode(&empty).unwrap(),
            ProducerSnapshot {
                offset: 0,
                states: ProducerStates::default()
            }
        );
    }

    #[test]
    fn damaged_snapshots_are_errors_not_panics() {
        let bytes = states_with_transactions().encode(400);
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x04;
            assert!(ProducerStates::decode(&damaged).is_err(), "flip at {at}");
        }
        for len in 0..bytes.len() {
            assert!(
                ProducerStates::decode(&bytes[..len]).is_err(),
                "cut at {len}"
            );
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 8]);
        assert!(ProducerStates::decode(&longer).is_err());
        // A CRC-valid snapshot whose fields are wrong: a batch at or past the snapshot offset.
        let mut inconsistent = states().encode(302);
        inconsistent.truncate(inconsistent.len() - CRC_LEN);
        let crc = strata_wire::crc32c(&inconsistent);
        inconsistent.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            ProducerStates::decode(&inconsistent),
            Err(SnapshotError::Invalid("batch offsets"))
        );
        // Garbage of every small length, with the CRC fixed so parsing is reached.
        let mut seed = 0x9e37_79b9_u32;
        for len in 0..200 {
            let mut garbage: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 24) as u8
                })
                .collect();
            if len >= FIXED_LEN {
                garbage[..8].copy_from_slice(MAGIC);
                garbage[8..12].copy_from_slice(&[1, 0, 0, 0]);
                garbage.extend_from_slice(&strata_wire::crc32c(&garbage).to_le_bytes());
            }
            let _ = ProducerStates::decode(&garbage);
        }
    }
}
