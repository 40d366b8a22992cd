//! What a clean of a compacted log is given and what it reports back of its sources: the
//! contract between the log's side of compaction (the `compaction` module, which plans a clean and
//! swaps its output in) and the cleaner (the `cleaner` module, which reads and writes in between).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::io::Storage;

use super::segment::file_name;
use super::transactions::AbortedTxn;

/// The suffix of a cleaned segment's files until they are swapped in.
pub(crate) const CLEANED_SUFFIX: &str = "cleaned";

/// A closed segment a clean reads.
pub struct SourceSegment<F> {
    pub base_offset: u64,
    pub next_offset: u64,
    pub size: u64,
    /// The segment's log file, readable even if the log removes it meanwhile.
    pub log: Rc<F>,
}

/// What a clean may do to a log, handed to the cleaner.
pub struct CleanPlan<S: Storage> {
    pub storage: S,
    pub dir: Rc<Path>,
    /// The closed segments from the log start up to `cleanable_end`, in order.
    pub sources: Vec<SourceSegment<S::File>>,
    /// Everything below this has been cleaned (the key map is built from here on).
    pub first_dirty: u64,
    /// Nothing at or past this is cleaned: the active segment, what is younger than
    /// `min.compaction.lag.ms`, what is not below the high watermark.
    pub cleanable_end: u64,
    pub segment_bytes: u64,
    pub index_interval_bytes: u32,
    pub delete_retention_ms: i64,
    pub producer_last_offsets: HashMap<i64, u64>,
    /// The log's aborted transactions, in marker order.
    pub aborted: Vec<AbortedTxn>,
    pub now_ms: i64,
}

/// The path of one of a cleaned segment's files before its swap (`extension`: log, index,
/// timeindex).
pub(crate) fn cleaned_path(dir: &Path, base_offset: u64, extension: &str) -> PathBuf {
    let mut name = file_name(base_offset, extension).into_os_string();
    name.push(".");
    name.push(CLEANED_SUFFIX);
    dir.join(PathBuf::from(name))
}

/// A source segment as the clean read it: the swap goes ahead only if the log still has it so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceSummary {
    pub base_offset: u64,
    pub next_offset: u64,
    pub size: u64,
}
