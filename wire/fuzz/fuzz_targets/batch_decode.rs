//! Fuzz target `batch_decode`: the record batch decoder of `strata-wire` must never panic, and a
//! batch it accepts must iterate cleanly and consistently.
//!
//! What one input goes through:
//! 1. `Batch::validate` on the input as given, and again on a copy at a misaligned address (the
//!    decoder copies such input into aligned memory): both must give the same outcome.
//! 2. `split_batches` on the input: its first item must agree with step 1, and the accepted
//!    batches must not span more bytes than the input has.
//! 3. The same walk with CRCs repaired: a mutated batch almost always fails the CRC check, which
//!    hides the rkyv and record checks behind it from the fuzzer. Each time a batch fails *only*
//!    on its CRC, the CRC the decoder computed (it is in the error) is written into the header and
//!    the batch is validated again; `split_batches` on the repaired buffer must then accept
//!    exactly the batches the walk accepted.
//! 4. If the input is longer than 8 bytes, its first 8 bytes are a stamp (little-endian `u64`
//!    base offset; the leader epoch is its high 32 bits) and the rest is a candidate batch. If the
//!    candidate is valid (after a CRC repair as in 3), stamping it must keep it valid — unless the
//!    base offset leaves no room for its records, which must be `OffsetOverflow` — and must change
//!    nothing but the two stamped fields and the record offsets.
//!
//! Every accepted batch has all its records and headers iterated (and `black_box`ed).

#![no_main]

use std::hint::black_box;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use strata_wire::batch::{self, Batch, BatchError, BatchHeader, OFFSET_MAX, Record, split_batches};

/// Where the CRC32C sits in the header (`layout::AT_CRC` is crate-private; see the layout table
/// in `wire/src/batch/layout.rs`). The CRC does not cover these bytes, so writing them never
/// changes the CRC the decoder computes.
const AT_CRC: usize = 12;
const STAMP_LEN: usize = 8;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);

    // 1. As given, and from a misaligned address.
    let direct = Batch::validate(bytes.clone());
    let via_copy = Batch::validate(misaligned_copy(data));
    assert_eq!(outcome(&direct), outcome(&via_copy), "alignment changed the outcome");
    if let (Ok(a), Ok(b)) = (&direct, &via_copy) {
        walk(a);
        assert!(same_records(a, b), "alignment changed the records");
    }

    // 2. Back-to-back batches.
    let mut consumed = 0usize;
    for (index, item) in split_batches(bytes).enumerate() {
        if index == 0 {
            assert_eq!(outcome(&item), outcome(&direct), "split and validate disagree");
        }
        match item {
            Ok(batch) => {
                consumed += batch.as_bytes().len();
                walk(&batch);
            }
            Err(_) => break,
        }
    }
    assert!(consumed <= data.len(), "split accepted more bytes than it was given");

    // 3. The same with every CRC repaired.
    let mut buf = data.to_vec();
    let (accepted, repaired) = walk_repairing(&mut buf);
    if repaired > 0 {
        let split_ok = split_batches(Bytes::from(buf)).take_while(Result::is_ok).count();
        assert_eq!(split_ok, accepted, "split disagrees with validate after CRC repair");
    }

    // 4. Stamping.
    if data.len() > STAMP_LEN {
        let (stamp, candidate) = data.split_at(STAMP_LEN);
        check_stamp(stamp, candidate);
    }
});

/// Validates back-to-back batches in `buf`, repairing the CRC of any batch that fails only on its
/// CRC. Returns (batches accepted, CRCs repaired).
fn walk_repairing(buf: &mut [u8]) -> (usize, usize) {
    let (mut at, mut accepted, mut repaired) = (0usize, 0usize, 0usize);
    while at < buf.len() {
        let result = validate_repairing(&mut buf[at..], &mut repaired);
        let Ok(batch) = result else { break };
        walk(&batch);
        accepted += 1;
        at += batch.as_bytes().len();
    }
    (accepted, repaired)
}

/// `Batch::validate`, and if it fails only on the CRC, writes the computed CRC into the header and
/// validates again. The repaired bytes stay in `buf`.
fn validate_repairing(buf: &mut [u8], repaired: &mut usize) -> Result<Batch, BatchError> {
    match Batch::validate(Bytes::copy_from_slice(buf)) {
        Err(BatchError::CrcMismatch { actual, .. }) => {
            // A CRC error comes after the header parsed and the whole batch was present, so the
            // CRC field is in bounds.
            buf[AT_CRC..AT_CRC + 4].copy_from_slice(&actual.to_le_bytes());
            *repaired += 1;
            let again = Batch::validate(Bytes::copy_from_slice(buf));
            assert!(
                !matches!(again, Err(BatchError::CrcMismatch { .. })),
                "the CRC the decoder reported does not satisfy it: {again:?}"
            );
            again
        }
        other => other,
    }
}

fn check_stamp(stamp: &[u8], candidate: &[u8]) {
    let raw = u64::from_le_bytes(stamp.try_into().expect("8 stamp bytes"));
    let (base_offset, leader_epoch) = (raw, (raw >> 32) as u32);
    let mut candidate = candidate.to_vec();
    let Ok(batch) = validate_repairing(&mut candidate, &mut 0) else {
        return;
    };
    let mut stamped = batch.as_bytes().to_vec();
    batch::stamp(&mut stamped, base_offset, leader_epoch);
    let result = Batch::validate(Bytes::from(stamped));
    if base_offset > OFFSET_MAX - u64::from(batch.header().offset_count) {
        assert_eq!(
            result.map(|b| *b.header()),
            Err(BatchError::OffsetOverflow(base_offset)),
            "a stamp past the offset range must be rejected"
        );
        return;
    }
    let stamped = result.expect("stamping a valid batch must keep it valid");
    let expected = BatchHeader {
        base_offset,
        leader_epoch,
        ..*batch.header()
    };
    assert_eq!(*stamped.header(), expected, "stamping changed more than the stamp");
    walk(&stamped);
    assert!(same_records(&batch, &stamped), "stamping changed the records");
}

/// Iterates every record and header of an accepted batch and checks what `validate` promises.
fn walk(batch: &Batch) {
    let header = batch.header();
    let mut count = 0u64;
    for (index, record) in batch.records().enumerate() {
        assert_eq!(record.offset, batch.base_offset() + index as u64);
        if index == 0 {
            assert_eq!(record.timestamp_ms, header.first_timestamp_ms);
        }
        assert!(record.timestamp_ms <= header.max_timestamp_ms);
        black_box(record.timestamp_ms);
        if let Some(key) = record.key {
            black_box(key);
            assert_eq!(batch.slice_ref(key), key);
        }
        black_box(record.value);
        assert_eq!(batch.slice_ref(record.value), record.value);
        let headers = record.headers();
        let expected_headers = headers.len();
        let mut seen_headers = 0;
        for (key, value) in headers {
            black_box(key);
            black_box(value);
            seen_headers += 1;
        }
        assert_eq!(seen_headers, expected_headers);
        count += 1;
    }
    assert_eq!(count, u64::from(batch.record_count()));
    assert_eq!(batch.records().len() as u64, count);
    if batch.header().is_compacted() {
        assert!(count <= u64::from(batch.header().offset_count));
    } else {
        assert_eq!(batch.last_offset(), batch.base_offset() + count - 1);
    }
}

/// Same records, same content, offsets relative to each batch's base offset.
fn same_records(a: &Batch, b: &Batch) -> bool {
    let same = |x: Record<'_>, y: Record<'_>| {
        x.offset - a.base_offset() == y.offset - b.base_offset()
            && x.timestamp_ms == y.timestamp_ms
            && x.key == y.key
            && x.value == y.value
            && x.headers().eq(y.headers())
    };
    a.records().len() == b.records().len() && a.records().zip(b.records()).all(|(x, y)| same(x, y))
}

/// The outcome of a validation, comparable across copies of the same bytes.
fn outcome(result: &Result<Batch, BatchError>) -> Result<BatchHeader, BatchError> {
    result.as_ref().map(|batch| *batch.header()).map_err(Clone::clone)
}

/// `data` at an address that is not a multiple of 8 (one past an allocation's start).
fn misaligned_copy(data: &[u8]) -> Bytes {
    let mut shifted = Vec::with_capacity(data.len() + 1);
    shifted.push(0);
    shifted.extend_from_slice(data);
    Bytes::from(shifted).slice(1..)
}
