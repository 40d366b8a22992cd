//! Writes the seed corpus of the `batch_decode` fuzz target: valid batches made with
//! `BatchBuilder`, covering the shapes the decoder distinguishes (null and empty keys, headers,
//! producer fields, attributes, LZ4 and zstd bodies, a stamped batch, back-to-back batches, and
//! inputs with the 8-byte stamp prefix the target's stamping check reads).
//!
//! Usage (from `wire/fuzz`): `cargo run --example make_seeds [OUT_DIR]`
//! OUT_DIR defaults to `seeds/batch_decode` in this crate. Output is deterministic, so re-running
//! it leaves the committed seeds unchanged unless the batch format changed.
//!
//! It is an example, not a `src/bin` binary, on purpose: `cargo fuzz build` builds every `[[bin]]`
//! and `src/bin` binary of this crate with coverage instrumentation, which does not link without
//! libFuzzer.

use std::path::PathBuf;

use bytes::Bytes;
use strata_wire::batch::{self, Batch, BatchBuilder, Codec, OFFSET_MAX, attributes};

const T0: i64 = 1_764_374_400_000; // 2025-11-29T00:00:00Z in milliseconds

fn main() {
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds/batch_decode"));
    std::fs::create_dir_all(&out).expect("create the seed directory");

    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();

    let one = one_record();
    let with_headers = with_headers();
    seeds.push(("one_record", one.to_vec()));
    seeds.push(("null_key_empty_value", {
        let mut b = BatchBuilder::default();
        b.push(0, None, b"");
        b.finish().to_vec()
    }));
    seeds.push(("empty_key_and_negative_timestamps", {
        let mut b = BatchBuilder::default();
        b.push(-5, Some(b""), b"v0");
        b.push(-1, None, b"v1");
        b.push(-9, Some(b"k"), b"");
        b.finish().to_vec()
    }));
    seeds.push(("headers", with_headers.to_vec()));
    seeds.push(("idempotent_transactional", {
        let mut b = BatchBuilder::default();
        b.set_producer(42, 3, 100);
        b.set_attributes(attributes::TRANSACTIONAL);
        b.push(T0, Some(b"order-17"), b"created");
        b.push(T0 + 1, Some(b"order-17"), b"paid");
        b.finish().to_vec()
    }));
    seeds.push(("control", {
        let mut b = BatchBuilder::default();
        b.set_producer(42, 3, 102);
        b.set_attributes(attributes::TRANSACTIONAL | attributes::CONTROL);
        b.push(T0 + 2, Some(&[0, 0, 0, 1]), &[0, 0, 0, 0, 0, 7]);
        b.finish().to_vec()
    }));
    seeds.push(("many_records", {
        let mut b = BatchBuilder::default();
        for i in 0..40u8 {
            let key = [b'k', i];
            let value = vec![i; usize::from(i % 7) * 5];
            let header_value = [i];
            let headers = (0..usize::from(i % 3)).map(|_| (&b"h"[..], &header_value[..]));
            let key = (i % 5 != 0).then_some(&key[..]);
            b.push_with_headers(T0 + i64::from(i % 11) * 3, key, &value, headers);
        }
        b.finish().to_vec()
    }));
    // Compressed bodies: the decoder inflates them before its archive checks.
    for (name, codec) in [("many_records_lz4", Codec::Lz4), ("many_records_zstd", Codec::Zstd)] {
        seeds.push((name, {
            let mut b = BatchBuilder::default();
            b.set_codec(codec);
            for i in 0..40u8 {
                let key = [b'k', i % 4];
                b.push(T0 + i64::from(i), Some(&key[..]), b"order shipped order shipped");
            }
            b.finish().to_vec()
        }));
    }
    seeds.push(("stamped", {
        let mut bytes = with_headers.to_vec();
        batch::stamp(&mut bytes, 1_000, 7);
        bytes
    }));
    seeds.push(("two_batches", [one.to_vec(), with_headers.to_vec()].concat()));
    // The target reads the first 8 bytes of an input as a stamp and the rest as a batch.
    seeds.push(("stamp_prefix_small_offset", prefixed(1_000, &with_headers)));
    seeds.push(("stamp_prefix_last_valid_offset", prefixed(OFFSET_MAX - 3, &with_headers)));
    seeds.push(("stamp_prefix_offset_overflow", prefixed(OFFSET_MAX - 2, &with_headers)));

    for (name, bytes) in &seeds {
        // Every seed must reach past the decoder's checks, as a whole or after its stamp prefix.
        let batch = if name.starts_with("stamp_prefix") { &bytes[8..] } else { &bytes[..] };
        Batch::validate(Bytes::copy_from_slice(batch))
            .unwrap_or_else(|error| panic!("seed {name} is not a valid batch: {error}"));
        let path = out.join(format!("{name}.bin"));
        std::fs::write(&path, bytes).expect("write a seed");
        println!("{} ({} bytes)", path.display(), bytes.len());
    }
}

fn one_record() -> Bytes {
    let mut b = BatchBuilder::default();
    b.push(T0, Some(b"key"), b"value");
    b.finish()
}

/// Three records (the last with the largest timestamp in the middle) with headers.
fn with_headers() -> Bytes {
    let mut b = BatchBuilder::default();
    b.push_with_headers(T0, Some(b"user-1"), b"{\"n\":1}", [(&b"trace"[..], &b"abc"[..])]);
    b.push_with_headers(
        T0 + 50,
        None,
        b"second",
        [(&b""[..], &b""[..]), (&b"content-type"[..], &b"json"[..])],
    );
    b.push_with_headers(T0 + 10, Some(b"user-2"), b"", std::iter::empty());
    b.finish()
}

fn prefixed(base_offset: u64, batch: &[u8]) -> Vec<u8> {
    [&base_offset.to_le_bytes()[..], batch].concat()
}
