use bytes::Bytes;
use proptest::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_wire::batch::{
    BATCH_ALIGN, Batch, BatchBuilder, BatchError, BatchHeader, Codec, HEADER_LEN, split_batches,
    stamp,
};

#[derive(Debug, Clone, PartialEq)]
struct OwnedRecord {
    timestamp_ms: i64,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
}

fn build(records: &[OwnedRecord]) -> Bytes {
    build_with(Codec::None, records)
}

fn read_back(batch: &Batch) -> Vec<OwnedRecord> {
    batch
        .records()
        .map(|record| OwnedRecord {
            timestamp_ms: record.timestamp_ms,
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.to_vec(),
            headers: record
                .headers()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        })
        .collect()
}

fn sample() -> Vec<OwnedRecord> {
    vec![
        OwnedRecord {
            timestamp_ms: 1_700_000_000_000,
            key: Some(b"k1".to_vec()),
            value: b"hello".to_vec(),
            headers: vec![(b"trace".to_vec(), b"abc".to_vec())],
        },
        OwnedRecord {
            timestamp_ms: 1_700_000_000_005,
            key: None,
            value: b"".to_vec(),
            headers: vec![],
        },
        OwnedRecord {
            timestamp_ms: 1_699_999_999_990,
            key: Some(b"".to_vec()),
            value: b"world".to_vec(),
            headers: vec![],
        },
    ]
}

#[test]
fn round_trip_keeps_every_field() {
    let records = sample();
    let bytes = build(&records);
    assert_eq!(bytes.len() % BATCH_ALIGN, 0);
    let batch = Batch::validate(bytes).unwrap();
    assert_eq!(read_back(&batch), records);
    let header = batch.header();
    assert_eq!(header.offset_count, 3);
    assert_eq!(header.first_timestamp_ms, 1_700_000_000_000);
    assert_eq!(header.max_timestamp_ms, 1_700_000_000_005);
    assert!(!header.is_idempotent());
    let offsets: Vec<u64> = batch.records().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2]);
}

#[test]
fn stamping_keeps_the_crc_valid_and_shifts_offsets() {
    let bytes = build(&sample());
    let mut owned = bytes.to_vec();
    stamp(&mut owned, 1000, 7);
    let batch = Batch::validate(Bytes::from(owned)).unwrap();
    assert_eq!(batch.header().base_offset, 1000);
    assert_eq!(batch.header().leader_epoch, 7);
    assert_eq!(batch.last_offset(), 1002);
    let offsets: Vec<u64> = batch.records().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![1000, 1001, 1002]);
}

#[test]
fn every_single_bit_flip_in_the_covered_range_is_caught() {
    let bytes = build(&sample());
    let header = BatchHeader::parse(&bytes).unwrap();
    let body_end = HEADER_LEN + header.body_len as usize;
    for at in 12..body_end {
        for bit in 0..8 {
            let mut damaged = bytes.to_vec();
            damaged[at] ^= 1 << bit;
            assert!(
                Batch::validate(Bytes::from(damaged)).is_err(),
                "flip of bit {bit} at byte {at} went unnoticed"
            );
        }
    }
}

/// rkyv finds its root at the end of the slice; if the reader handed it the padded batch, a valid
/// archive followed by zeros would read as an empty body. The exact body length prevents that.
#[test]
fn padding_is_never_mistaken_for_the_archive() {
    let records = sample();
    let bytes = build(&records);
    let header = BatchHeader::parse(&bytes).unwrap();
    // Append more zero bytes after the batch: it still reads as itself.
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0u8; 64]);
    let batch = Batch::validate(Bytes::from(longer)).unwrap();
    assert_eq!(batch.as_bytes().len(), header.batch_len as usize);
    assert_eq!(read_back(&batch), records);
}

#[test]
fn misaligned_input_is_copied_not_rejected() {
    let bytes = build(&sample());
    let mut shifted = vec![0u8; 1];
    shifted.extend_from_slice(&bytes);
    let shifted = Bytes::from(shifted).slice(1..);
    let batch = Batch::validate(shifted).unwrap();
    assert_eq!(read_back(&batch), sample());
}

#[test]
fn zero_copy_slices_point_into_the_batch() {
    let bytes = build(&sample());
    let batch = Batch::validate(bytes.clone()).unwrap();
    let record = batch.records().next().unwrap();
    let value = batch.slice_ref(record.value);
    assert_eq!(&value[..], b"hello");
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    assert!(
        range.contains(&(value.as_ptr() as usize)),
        "value was copied"
    );
}

#[test]
fn truncated_batches_are_rejected_at_every_length() {
    let bytes = build(&sample());
    for len in 0..bytes.len() {
        let result = Batch::validate(bytes.slice(..len));
        assert!(result.is_err(), "a {len}-byte prefix validated");
    }
}

#[test]
fn split_reads_back_to_back_batches_and_stops_at_damage() {
    let mut all = Vec::new();
    for i in 0..3u64 {
        let mut one = build(&sample()).to_vec();
        stamp(&mut one, i * 3, 1);
        all.extend_from_slice(&one);
    }
    let batches: Vec<_> = split_batches(Bytes::from(all.clone())).collect();
    assert_eq!(batches.len(), 3);
    assert!(batches.iter().all(Result::is_ok));
    let last = all.len() - 10;
    all[last] ^= 0xff;
    let batches: Vec<_> = split_batches(Bytes::from(all)).collect();
    assert_eq!(batches.len(), 3);
    assert!(batches[2].is_err());
}

#[test]
fn producer_fields_round_trip() {
    let mut builder = BatchBuilder::default();
    builder.set_producer(42, 3, 100);
    builder.push(5, None, b"v");
    let batch = Batch::validate(builder.finish()).unwrap();
    let header = batch.header();
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (42, 3, 100)
    );
    // The builder resets producer fields for the next batch.
    builder.push(6, None, b"w");
    let batch = Batch::validate(builder.finish()).unwrap();
    assert!(!batch.header().is_idempotent());
}

#[test]
fn unknown_version_and_codec_are_typed_errors() {
    let bytes = build(&sample());
    let mut other_version = bytes.to_vec();
    other_version[24] = 9;
    assert_eq!(
        Batch::validate(Bytes::from(other_version)).unwrap_err(),
        BatchError::UnknownVersion(9)
    );
    // Codec 3 is not one this build knows (the CRC is made right, so the codec is what fails).
    let mut other_codec = bytes.to_vec();
    other_codec[26] = 3;
    fix_crc(&mut other_codec);
    assert_eq!(
        Batch::validate(Bytes::from(other_codec)).unwrap_err(),
        BatchError::UnsupportedCodec(3)
    );
}

/// Recomputes a batch's CRC after a test changed covered bytes (as a buggy producer would).
fn fix_crc(batch: &mut [u8]) {
    let body_len = u32::from_le_bytes(batch[20..24].try_into().unwrap()) as usize;
    let crc = strata_wire::crc32c(&batch[16..HEADER_LEN + body_len]);
    batch[12..16].copy_from_slice(&crc.to_le_bytes());
}

fn compressible(count: usize) -> Vec<OwnedRecord> {
    (0..count)
        .map(|i| OwnedRecord {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: (i % 3 != 0).then(|| format!("key-{}", i % 7).into_bytes()),
            value: format!("{{\"order\": {i}, \"status\": \"shipped\", \"warehouse\": \"east\"}}")
                .into_bytes(),
            headers: if i % 5 == 0 {
                vec![(b"trace".to_vec(), i.to_le_bytes().to_vec())]
            } else {
                vec![]
            },
        })
        .collect()
}

fn build_with(codec: Codec, records: &[OwnedRecord]) -> Bytes {
    let mut builder = BatchBuilder::default();
    builder.set_codec(codec);
    for record in records {
        builder.push_with_headers(
            record.timestamp_ms,
            record.key.as_deref(),
            &record.value,
            record
                .headers
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice())),
        );
    }
    builder.finish()
}

#[test]
fn compressed_batches_read_back_the_same_records_zero_copy_from_their_archive() {
    let records = compressible(500);
    let plain = build(&records);
    for codec in [Codec::Lz4, Codec::Zstd] {
        let bytes = build_with(codec, &records);
        assert!(
            bytes.len() * 3 < plain.len(),
            "{codec}: {} compressed bytes against {} plain",
            bytes.len(),
            plain.len()
        );
        let header = strata_wire::batch::check(&bytes).unwrap();
        assert_eq!(header.codec().unwrap(), codec);
        // The body starts with the archive's length: what the plain batch's body is.
        let plain_body_len = BatchHeader::parse(&plain).unwrap().body_len;
        assert_eq!(
            u32::from_le_bytes(bytes[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap()),
            plain_body_len
        );
        let mut stamped = bytes.to_vec();
        stamp(&mut stamped, 1_000, 7);
        let batch = Batch::validate(Bytes::from(stamped)).unwrap();
        assert_eq!(batch.codec(), codec);
        assert_eq!(batch.base_offset(), 1_000);
        assert_eq!(read_back(&batch), records);
        let record = batch.records().nth(1).unwrap();
        assert_eq!(
            batch.slice_ref(record.value),
            Bytes::from(records[1].value.clone())
        );
        // Batches of several codecs read back to back, as a fetch answer holds them.
        let mut mixed = plain.to_vec();
        mixed.extend_from_slice(&bytes);
        let split: Vec<Batch> = split_batches(Bytes::from(mixed))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(split.len(), 2);
        assert_eq!(read_back(&split[1]), records);
    }
}

#[test]
fn a_compressed_body_that_does_not_decompress_to_a_valid_archive_is_refused() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let bytes = build_with(codec, &compressible(200));
        // A producer that compressed garbage, or cut its stream, under a correct CRC: the CRC
        // cannot tell, so the reader's decompression and archive checks must.
        let mut cut = bytes.to_vec();
        let body_len = BatchHeader::parse(&cut).unwrap().body_len as usize;
        cut[HEADER_LEN + body_len / 2..HEADER_LEN + body_len].fill(0);
        fix_crc(&mut cut);
        // A follower's check (the leader checked the body) passes it: only damage on the way
        // is its business.
        assert!(strata_wire::batch::check_integrity(&cut).is_ok());
        let error = Batch::validate(Bytes::from(cut.clone())).unwrap_err();
        assert!(
            matches!(
                error,
                BatchError::BadCompression(_)
                    | BatchError::MalformedBody
                    | BatchError::InconsistentRecord { .. }
                    | BatchError::OutOfBounds { .. }
            ),
            "{codec}: {error:?}"
        );
        // Damage on the way fails both checks.
        let mut damaged = bytes.to_vec();
        damaged[HEADER_LEN + 5] ^= 1;
        assert!(matches!(
            strata_wire::batch::check_integrity(&damaged),
            Err(BatchError::CrcMismatch { .. })
        ));
        // A compressed archive whose record count disagrees with the header.
        let mut miscounted = bytes.to_vec();
        miscounted[28..32].copy_from_slice(&199u32.to_le_bytes());
        fix_crc(&mut miscounted);
        assert!(matches!(
            Batch::validate(Bytes::from(miscounted)).unwrap_err(),
            BatchError::InconsistentRecord { .. }
        ));
    }
}

#[test]
fn the_codec_is_kept_across_batches_and_other_attributes_are_not() {
    let mut builder = BatchBuilder::default();
    builder.set_codec(Codec::Zstd);
    builder.set_attributes(strata_wire::batch::attributes::TRANSACTIONAL);
    builder.push(1, None, b"a");
    let first = Batch::validate(builder.finish()).unwrap();
    builder.push(2, None, b"b");
    let second = Batch::validate(builder.finish()).unwrap();
    assert_eq!(first.codec(), Codec::Zstd);
    assert_eq!(second.codec(), Codec::Zstd);
    assert_ne!(
        first.header().attributes & strata_wire::batch::attributes::TRANSACTIONAL,
        0
    );
    assert_eq!(
        second.header().attributes & strata_wire::batch::attributes::TRANSACTIONAL,
        0
    );
}

/// The on-disk format, byte for byte. If this fails, the format changed: bump FORMAT_VERSION and
/// teach the reader the old version instead of editing the expected bytes.
#[test]
fn golden_bytes() {
    let mut builder = BatchBuilder::default();
    builder.push_with_headers(
        1_000,
        Some(b"key"),
        b"value",
        [(b"h".as_slice(), b"v".as_slice())],
    );
    builder.push(1_002, None, b"xy");
    let mut bytes = builder.finish().to_vec();
    stamp(&mut bytes, 0x0102_0304_0506_0708, 0x0a0b_0c0d);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let batch = Batch::validate(Bytes::from(bytes.clone())).unwrap();
    assert_eq!(batch.record_count(), 2);
    assert_eq!(hex, GOLDEN, "the batch format changed");
}

const GOLDEN: &str = concat!(
    // base offset (stamped), leader epoch (stamped), crc32c
    "0807060504030201",
    "0d0c0b0a",
    "467ece60",
    // batch_len 200, body_len 136, version 1, reserved, attributes, record_count 2
    "c8000000",
    "88000000",
    "01",
    "00",
    "0000",
    "02000000",
    // first timestamp 1000, max timestamp 1002
    "e803000000000000",
    "ea03000000000000",
    // producer id -1, base sequence -1, producer epoch -1, reserved
    "ffffffffffffffff",
    "ffffffff",
    "ffff",
    "0000",
    // body at 64: payload "key" "value" "h" "v" "xy", padded to 8 for the record array
    "6b657976616c756568767879",
    "00000000",
    // record 0: timestamp delta 0, offset delta 0, key 0+3, value 3+5, headers 0+1, padding
    "0000000000000000",
    "00000000",
    "00000000",
    "03000000",
    "03000000",
    "05000000",
    "00000000",
    "01000000",
    "00000000",
    // record 1: timestamp delta 2, offset delta 1, null key, value 10+2, headers 1+0, padding
    "0200000000000000",
    "01000000",
    "0a000000",
    "ffffffff",
    "0a000000",
    "02000000",
    "01000000",
    "00000000",
    "00000000",
    // header 0: key 8+1, value 9+1
    "08000000",
    "01000000",
    "09000000",
    "01000000",
    // root (last 24 bytes): payload, records, headers as (relative pointer, length)
    "90ffffff",
    "0c000000",
    "98ffffff",
    "02000000",
    "e0ffffff",
    "01000000",
);

fn arb_record() -> impl Strategy<Value = OwnedRecord> {
    (
        0i64..4_000_000_000_000,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..10),
                proptest::collection::vec(any::<u8>(), 0..10),
            ),
            0..3,
        ),
    )
        .prop_map(|(timestamp_ms, key, value, headers)| OwnedRecord {
            timestamp_ms,
            key,
            value,
            headers,
        })
}

proptest! {
    #[test]
    fn random_batches_round_trip(records in proptest::collection::vec(arb_record(), 1..60),
                                 base_offset in 0u64..(1 << 50), epoch: u32) {
        let mut bytes = build(&records).to_vec();
        stamp(&mut bytes, base_offset, epoch);
        let batch = Batch::validate(Bytes::from(bytes)).unwrap();
        prop_assert_eq!(read_back(&batch), records.clone());
        prop_assert_eq!(batch.base_offset(), base_offset);
        prop_assert_eq!(batch.last_offset(), base_offset + records.len() as u64 - 1);
        let max = records.iter().map(|r| r.timestamp_ms).max().unwrap();
        prop_assert_eq!(batch.header().max_timestamp_ms, max);
    }
}

/// Thousands of random and mutated buffers through the decoder: it must return, never panic, and
/// a batch it accepts must iterate cleanly. The fuzz target in `wire/fuzz` does the same for longer.
#[test]
fn decoder_survives_random_and_mutated_input() {
    let mut rng = StdRng::seed_from_u64(0x5742_4154);
    let seeds: Vec<Vec<u8>> = (0..8)
        .map(|n| {
            let records: Vec<OwnedRecord> = (0..=n)
                .map(|i| OwnedRecord {
                    timestamp_ms: 1000 + i as i64,
                    key: (i % 2 == 0).then(|| vec![i as u8; i]),
                    value: vec![7; i * 13],
                    headers: vec![(vec![1], vec![2, 3])],
                })
                .collect();
            build(&records).to_vec()
        })
        .collect();
    let mut accepted = 0;
    for round in 0..6000 {
        let input: Vec<u8> = if round % 5 == 0 {
            let len = rng.random_range(0..400);
            (0..len).map(|_| rng.random()).collect()
        } else {
            let mut input = seeds[round % seeds.len()].clone();
            let mutations = rng.random_range(1..6);
            for _ in 0..mutations {
                match rng.random_range(0..4) {
                    0 => {
                        let at = rng.random_range(0..input.len());
                        input[at] = rng.random();
                    }
                    1 => {
                        let len = rng.random_range(0..input.len());
                        input.truncate(len);
                    }
                    2 => input.extend((0..rng.random_range(1..32)).map(|_| rng.random::<u8>())),
                    _ => {
                        // Damage a length or count field, then fix the CRC so rkyv and the
                        // range checks see the damage.
                        if input.len() >= HEADER_LEN {
                            let at = [16, 20, 28, 32, 40][rng.random_range(0..5)];
                            input[at] = rng.random();
                        }
                    }
                }
                if input.is_empty() {
                    break;
                }
            }
            if rng.random_bool(0.5)
                && input.len() >= HEADER_LEN
                && let Ok(header) = BatchHeader::parse(&input)
            {
                let end = (HEADER_LEN + header.body_len as usize).min(input.len());
                let crc = strata_wire::crc32c(&input[16..end]);
                input[12..16].copy_from_slice(&crc.to_le_bytes());
            }
            input
        };
        if let Ok(batch) = Batch::validate(Bytes::from(input)) {
            accepted += 1;
            for record in batch.records() {
                std::hint::black_box((record.key, record.value, record.headers().count()));
            }
        }
    }
    assert!(
        accepted > 0,
        "the mutator never produced a valid batch: it tests nothing"
    );
}

/// A null value (Kafka's tombstone) is told from an empty one after a round trip, in plain
/// and compressed batches; a null value's entry passes the full check without payload bytes.
#[test]
fn null_values_are_told_from_empty_ones() {
    for codec in [Codec::None, Codec::Lz4, Codec::Zstd] {
        let mut builder = BatchBuilder::default();
        builder.set_codec(codec);
        builder.push_nullable(1, Some(b"deleted"), None, std::iter::empty());
        builder.push_nullable(1, Some(b"blank"), Some(b""), std::iter::empty());
        builder.push(2, Some(b"kept"), b"value");
        let batch = Batch::validate(builder.into_batch()).unwrap();
        let values: Vec<Option<&[u8]>> = batch.records().map(|r| r.nullable_value()).collect();
        assert_eq!(
            values,
            [None, Some(&b""[..]), Some(&b"value"[..])],
            "{codec:?}"
        );
        assert_eq!(batch.records().next().unwrap().value, b"", "{codec:?}");
    }
}

#[test]
fn null_header_values_are_told_from_empty_ones() {
    for codec in [Codec::None, Codec::Lz4, Codec::Zstd] {
        let mut builder = BatchBuilder::default();
        builder.set_codec(codec);
        let headers = [
            (&b"absent"[..], None),
            (&b"blank"[..], Some(&b""[..])),
            (&b"set"[..], Some(&b"v"[..])),
        ];
        builder.push_nullable(1, None, Some(b"x"), headers);
        let batch = Batch::validate(builder.into_batch()).unwrap();
        let record = batch.records().next().unwrap();
        assert_eq!(
            record.nullable_headers().collect::<Vec<_>>(),
            headers,
            "{codec:?}"
        );
        // The plain view reads a null value as empty.
        assert_eq!(
            record.headers().map(|(_, v)| v).collect::<Vec<_>>(),
            [&b""[..], b"", b"v"],
            "{codec:?}"
        );
    }
}

/// Rewrites `batch` as the log cleaner does, keeping the records `keep` picks by index.
fn compact_keeping(batch: &Batch, codec: Codec, keep: &[usize]) -> Bytes {
    let mut builder = BatchBuilder::default();
    builder.set_codec(codec);
    builder.start_compacted(batch.header(), None);
    for (index, record) in batch.records().enumerate() {
        if keep.contains(&index) {
            builder.push_kept(&record);
        }
    }
    builder.finish_compacted()
}

#[test]
fn a_compacted_batch_keeps_offsets_timestamps_and_producer_fields_of_the_original() {
    for codec in [Codec::None, Codec::Lz4, Codec::Zstd] {
        let records = compressible(10);
        let mut original = build_with(codec, &records).to_vec();
        stamp(&mut original, 1_000, 7);
        let original = Batch::validate(Bytes::from(original)).unwrap();
        // The builder's own codec does not matter: the original's is kept.
        let compacted = compact_keeping(&original, Codec::None, &[2, 5]);
        let batch = Batch::validate(compacted.clone()).unwrap();
        let header = batch.header();
        assert!(header.is_compacted(), "{codec}");
        assert_eq!(batch.codec(), codec);
        assert_eq!(
            (header.base_offset, header.leader_epoch, header.offset_count),
            (1_000, 7, 10)
        );
        assert_eq!(
            batch.last_offset(),
            1_009,
            "the last offset outlives its record"
        );
        assert_eq!(batch.record_count(), 2);
        let original_header = original.header();
        assert_eq!(
            header.first_timestamp_ms,
            original_header.first_timestamp_ms
        );
        assert_eq!(header.max_timestamp_ms, original_header.max_timestamp_ms);
        let kept: Vec<(u64, i64)> = batch
            .records()
            .map(|record| (record.offset, record.timestamp_ms))
            .collect();
        assert_eq!(
            kept,
            vec![
                (1_002, records[2].timestamp_ms),
                (1_005, records[5].timestamp_ms)
            ]
        );
        assert_eq!(
            read_back(&batch),
            vec![records[2].clone(), records[5].clone()]
        );
        // A producer may not send one: only the cleaner writes compacted batches.
        assert_eq!(
            strata_wire::batch::check(&compacted),
            Err(BatchError::Compacted)
        );
        assert!(strata_wire::batch::check_integrity(&compacted).is_ok());
    }
}

#[test]
fn a_compacted_batch_may_hold_no_records_and_keeps_its_producer() {
    let mut builder = BatchBuilder::default();
    builder.set_producer(42, 3, 100);
    for record in sample() {
        builder.push(record.timestamp_ms, record.key.as_deref(), &record.value);
    }
    let mut original = builder.finish().to_vec();
    stamp(&mut original, 50, 2);
    let original = Batch::validate(Bytes::from(original)).unwrap();
    let empty = Batch::validate(compact_keeping(&original, Codec::None, &[])).unwrap();
    assert_eq!(empty.record_count(), 0);
    assert_eq!(empty.records().count(), 0);
    let header = empty.header();
    assert_eq!((header.base_offset, header.last_offset()), (50, 52));
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (42, 3, 100)
    );
    assert_eq!(header.max_timestamp_ms, original.header().max_timestamp_ms);
}

#[test]
fn a_batch_whose_offsets_are_not_dense_is_refused_unless_compacted() {
    let mut original = build(&sample()).to_vec();
    stamp(&mut original, 10, 0);
    let original = Batch::validate(Bytes::from(original)).unwrap();
    let compacted = compact_keeping(&original, Codec::None, &[0, 2]).to_vec();
    // Clearing the compacted bit (and fixing the CRC) leaves a batch with a gap in its deltas
    // and fewer records than offsets: refused.
    let mut forged = compacted.clone();
    let attributes = u16::from_le_bytes([forged[26], forged[27]]) & !(1 << 6);
    forged[26..28].copy_from_slice(&attributes.to_le_bytes());
    fix_crc(&mut forged);
    assert!(matches!(
        Batch::validate(Bytes::from(forged)),
        Err(BatchError::InconsistentRecord { .. })
    ));
    // Claiming fewer offsets than the kept records span is refused too.
    let mut short = compacted.clone();
    short[28..32].copy_from_slice(&2u32.to_le_bytes());
    fix_crc(&mut short);
    assert!(matches!(
        Batch::validate(Bytes::from(short)),
        Err(BatchError::InconsistentRecord { .. })
    ));
    assert!(Batch::validate(Bytes::from(compacted)).is_ok());
}

proptest! {
    #[test]
    fn any_subset_of_a_batch_compacts_to_a_valid_batch_with_the_same_offsets(
        records in proptest::collection::vec(arb_record(), 1..40),
        keep in proptest::collection::vec(any::<bool>(), 40),
        base_offset in 0u64..(1 << 50),
    ) {
        let mut bytes = build(&records).to_vec();
        stamp(&mut bytes, base_offset, 1);
        let original = Batch::validate(Bytes::from(bytes)).unwrap();
        let kept: Vec<usize> = (0..records.len()).filter(|index| keep[*index]).collect();
        let batch = Batch::validate(compact_keeping(&original, Codec::None, &kept)).unwrap();
        prop_assert_eq!(batch.last_offset(), original.last_offset());
        let offsets: Vec<u64> = batch.records().map(|record| record.offset).collect();
        let expected: Vec<u64> = kept.iter().map(|index| base_offset + *index as u64).collect();
        prop_assert_eq!(offsets, expected);
        let expected_records: Vec<OwnedRecord> =
            kept.iter().map(|index| records[*index].clone()).collect();
        prop_assert_eq!(read_back(&batch), expected_records);
    }
}

#[test]
fn a_delete_horizon_is_set_once_and_record_timestamps_stay_exact() {
    let mut original = build(&sample()).to_vec();
    stamp(&mut original, 0, 0);
    let original = Batch::validate(Bytes::from(original)).unwrap();
    assert_eq!(original.header().delete_horizon_ms(), None);
    let horizon = 1_800_000_000_000;
    let mut builder = BatchBuilder::default();
    builder.start_compacted(original.header(), Some(horizon));
    for record in original.records() {
        builder.push_kept(&record);
    }
    let first = Batch::validate(builder.finish_compacted()).unwrap();
    assert_eq!(first.header().delete_horizon_ms(), Some(horizon));
    assert_eq!(
        read_back(&first),
        sample(),
        "timestamps survive the new base"
    );
    // A later clean keeps the horizon the first one set.
    builder.start_compacted(first.header(), Some(horizon + 1_000));
    for record in first.records().skip(1) {
        builder.push_kept(&record);
    }
    let second = Batch::validate(builder.finish_compacted()).unwrap();
    assert_eq!(second.header().delete_horizon_ms(), Some(horizon));
    assert_eq!(read_back(&second), sample()[1..].to_vec());
    // The horizon bit means nothing on a batch that is not compacted: refused.
    let mut forged = original.as_bytes().to_vec();
    forged[26..28].copy_from_slice(&(1u16 << 7).to_le_bytes());
    fix_crc(&mut forged);
    assert_eq!(
        Batch::validate(Bytes::from(forged)).map(|_| ()),
        Err(BatchError::ReservedBitsSet)
    );
}

/// A marker reads back as Kafka's control record, its header says commit or abort, and a
/// producer may neither send one nor a transactional batch without its producer fields.
#[test]
fn markers_are_control_records_that_producers_cannot_send() {
    use strata_wire::batch::{attributes, check, marker, read_marker};
    for commit in [true, false] {
        let bytes = marker(7, 3, commit, 12, 1_000);
        let batch = Batch::validate(bytes.clone()).unwrap();
        let header = batch.header();
        assert!(header.is_transactional() && header.is_control());
        assert_eq!(header.marker_commits(), commit);
        assert_eq!((header.producer_id, header.producer_epoch), (7, 3));
        let record = batch.records().next().unwrap();
        assert_eq!(record.key.unwrap(), [0, 0, 0, u8::from(commit)]);
        assert_eq!(
            read_marker(record.key.unwrap(), record.value),
            Some((commit, 12))
        );
        assert_eq!(check(&bytes), Err(BatchError::ControlBatch));
    }
    assert_eq!(
        read_marker(&[0, 1, 0, 1], &[0, 0, 0, 0, 0, 1]),
        None,
        "a newer version"
    );
    let mut builder = BatchBuilder::with_capacity(256);
    builder.set_attributes(attributes::TRANSACTIONAL);
    builder.push(1, None, b"v");
    assert_eq!(
        check(&builder.finish()),
        Err(BatchError::TransactionalWithoutProducer)
    );
    builder.set_attributes(attributes::TRANSACTIONAL);
    builder.set_producer(7, 3, 0);
    builder.push(1, None, b"v");
    assert!(check(&builder.finish()).unwrap().is_transactional());
    // COMMIT without CONTROL, and CONTROL without TRANSACTIONAL, are not headers at all.
    for bits in [attributes::COMMIT, attributes::CONTROL] {
        builder.set_attributes(bits);
        builder.push(1, None, b"v");
        assert_eq!(
            BatchHeader::parse(&builder.finish()),
            Err(BatchError::ReservedBitsSet)
        );
    }
}
