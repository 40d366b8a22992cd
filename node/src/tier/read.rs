//! Reading a remote segment: which bytes of its object a fetch needs, taken in fixed chunks
//! (the unit of the chunk cache and of read-ahead) and cut to whole batches. Pure.

use strata_wire::batch::{BatchError, BatchHeader};

/// The unit of remote reads, caching and read-ahead.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// The chunk holding byte `position` of an object.
pub fn chunk_of(position: u64) -> u64 {
    position / CHUNK_BYTES
}

/// What walking the batches of a buffer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// The batches to answer with: `len` bytes from `start` of the buffer (0 when the
    /// segment holds nothing at or past the offset below the end).
    Done { start: usize, len: usize },
    /// A batch runs past the buffer: the next chunk is needed.
    NeedMore,
    /// Bytes that are not a batch: the object is damaged.
    Corrupt { at: usize },
}

/// Walks whole batches of `buffer` from `from` (a batch start at or before `offset`): skips
/// those wholly below `offset`, then takes batches below `end_offset` while they fit in
/// `max_bytes` (the first always, so a large batch still makes progress). `at_object_end`:
/// the buffer reaches the end of the object, so a short tail is the end, not a cut.
pub fn walk_batches(
    buffer: &[u8],
    from: usize,
    offset: u64,
    end_offset: u64,
    max_bytes: usize,
    at_object_end: bool,
) -> Walk {
    let mut at = from;
    let mut start = None;
    loop {
        let rest = &buffer[at.min(buffer.len())..];
        if rest.is_empty() {
            return if at_object_end {
                done(start, at)
            } else {
                Walk::NeedMore
            };
        }
        let header = match BatchHeader::parse(rest) {
            Ok(header) => header,
            Err(BatchError::TooShort { .. }) if !at_object_end => return Walk::NeedMore,
            Err(_) => return Walk::Corrupt { at },
        };
        let len = header.batch_len as usize;
        if len == 0 {
            return Walk::Corrupt { at };
        }
        let next_offset = header.base_offset + u64::from(header.offset_count);
        if header.base_offset >= end_offset {
            return done(start, at);
        }
        if next_offset <= offset {
            if rest.len() < len && at_object_end {
                return Walk::Corrupt { at };
            }
            at += len;
            continue;
        }
        let first = *start.get_or_insert(at);
        if at + len - first > max_bytes && at > first {
            return done(start, at);
        }
        if rest.len() < len {
            return if at_object_end {
                Walk::Corrupt { at }
            } else {
                Walk::NeedMore
            };
        }
        at += len;
    }
}

fn done(start: Option<usize>, at: usize) -> Walk {
    match start {
        Some(start) => Walk::Done {
            start,
            len: at - start,
        },
        None => Walk::Done { start: at, len: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::batch::BatchBuilder;

    fn batches(counts: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut base = 0u64;
        for &count in counts {
            let mut builder = BatchBuilder::with_capacity(4096);
            for i in 0..count {
                builder.push(1, None, &[i as u8; 100]);
            }
            let mut batch = builder.finish().to_vec();
            strata_wire::batch::stamp(&mut batch, base, 0);
            base += u64::from(count);
            out.extend_from_slice(&batch);
        }
        out
    }

    fn lens(buffer: &[u8]) -> Vec<usize> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < buffer.len() {
            let len = BatchHeader::parse(&buffer[at..]).unwrap().batch_len as usize;
            out.push(len);
            at += len;
        }
        out
    }

    #[test]
    fn a_walk_skips_batches_below_the_offset_and_stops_at_the_byte_limit() {
        let buffer = batches(&[2, 2, 2, 2]);
        let l = lens(&buffer);
        // Offset 3 is in the second batch: the walk starts there.
        assert_eq!(
            walk_batches(&buffer, 0, 3, u64::MAX, l[1] + l[2], true),
            Walk::Done {
                start: l[0],
                len: l[1] + l[2]
            }
        );
        // The first batch is taken whatever the limit.
        assert_eq!(
            walk_batches(&buffer, 0, 0, u64::MAX, 1, true),
            Walk::Done {
                start: 0,
                len: l[0]
            }
        );
        // Nothing at or past the end offset.
        assert_eq!(
            walk_batches(&buffer, 0, 0, 4, usize::MAX, true),
            Walk::Done {
                start: 0,
                len: l[0] + l[1]
            }
        );
    }

    #[test]
    fn a_batch_cut_by_the_buffer_asks_for_more_or_is_damage_at_the_objects_end() {
        let buffer = batches(&[3, 3]);
        let cut = &buffer[..buffer.len() - 10];
        assert_eq!(
            walk_batches(cut, 0, 0, u64::MAX, usize::MAX, false),
            Walk::NeedMore
        );
        assert!(matches!(
            walk_batches(cut, 0, 0, u64::MAX, usize::MAX, true),
            Walk::Corrupt { .. }
        ));
        assert_eq!(
            walk_batches(&buffer[..20], 0, 0, u64::MAX, usize::MAX, false),
            Walk::NeedMore
        );
        assert!(matches!(
            walk_batches(&[0xff; 100], 0, 0, u64::MAX, usize::MAX, true),
            Walk::Corrupt { at: 0 }
        ));
    }
}
