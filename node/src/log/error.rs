//! The log's operating errors (programmer errors are assertions instead).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use strata_wire::batch::BatchError;

use super::producers::ProducerError;

/// Operating errors of the log. Programmer errors are assertions instead.
/// Cloned for each of several waiters on one outcome (a group commit's appends).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// Batch `index` of an append failed validation; nothing of that append was written.
    #[error("batch {index} of the append is invalid: {source}")]
    CorruptBatch { index: usize, source: BatchError },
    /// A replicated batch does not continue the log.
    #[error("replicated batch starts at offset {got}, the log ends at {expected}")]
    NotContiguous { expected: u64, got: u64 },
    #[error("offset {requested} is outside the log [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: u64,
        log_start: u64,
        log_end: u64,
    },
    /// A write or sync failed earlier; the log accepts no more writes until it is reopened.
    #[error("log {dir} stopped after an IO failure: {reason}")]
    Failed { dir: PathBuf, reason: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: Arc<io::Error>,
    },
    #[error("invalid log configuration: {0}")]
    Config(String),
    /// An append carries an older leader epoch than the log already holds: it comes from a
    /// leader that has been replaced.
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleEpoch { epoch: u32, latest: u32 },
    /// An idempotent request breaks the producer rules before sequences are even compared: it
    /// holds more than one batch (Kafka allows exactly one per partition), or a negative
    /// producer id, epoch or sequence. Nothing of it was written.
    #[error("invalid idempotent produce: {0}")]
    InvalidProducerBatch(String),
    /// A conditional append ([`crate::log::AppendSource::ProducerAt`]) found the log ending
    /// elsewhere than expected: another writer got there first. Nothing was written.
    #[error("the log ends at {log_end}, not at the expected {expected}")]
    LogEndMismatch { expected: u64, log_end: u64 },
    /// An idempotent batch breaks its producer's sequence or comes from a fenced epoch
    /// (see [`ProducerError`]). Nothing was written.
    #[error(transparent)]
    Producer(#[from] ProducerError),
}
