use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record as KafkaRecord, RecordBatchDecoder};
use strata_wire::batch::{Codec, split_batches, stamp};

use super::{RecordsError, to_strata, translate_to_kafka};

const LIMIT: usize = 1 << 20;

/// A test record with a header of its own.
fn record(offset: i64, key: Option<&'static [u8]>, value: &'static [u8]) -> KafkaRecord {
    let mut record = crate::test_records::record(offset, key, value);
    let mut headers = IndexMap::new();
    headers.insert(
        StrBytes::from_static_str("trace"),
        Some(Bytes::from(format!("t-{offset}"))),
    );
    record.headers = headers;
    record
}

use crate::test_records::batch as kafka_batch;

fn sample() -> Vec<KafkaRecord> {
    vec![
        record(0, Some(b"k0"), b"first value"),
        record(1, None, b"no key"),
        record(2, Some(b"k2"), b""),
    ]
}

/// A produced Kafka batch, in each of Kafka's codecs, becomes one Strata batch holding the same
/// records; stamped by the log and fetched back, it is a Kafka batch with the log's offsets
/// and epoch and the same keys, values, headers and timestamps.
/// A topic's compression.type stores every Kafka batch with its codec, whatever the
/// producer's; the records read back the same.
#[test]
fn a_topics_compression_type_overrides_the_producers_codec() {
    for (sent_with, stored_as) in [
        (Compression::None, Codec::Zstd),
        (Compression::Gzip, Codec::Lz4),
        (Compression::Lz4, Codec::None),
    ] {
        let sent = sample();
        let mut stored = to_strata(kafka_batch(&sent, sent_with), LIMIT, Some(stored_as)).unwrap();
        stamp(&mut stored, 0, 0);
        let batch = split_batches(stored.freeze()).next().unwrap().unwrap();
        assert_eq!(batch.codec(), stored_as, "{sent_with:?}");
        let values: Vec<Option<&[u8]>> = batch.records().map(|r| r.nullable_value()).collect();
        let expected: Vec<Option<&[u8]>> = sent.iter().map(|r| r.value.as_deref()).collect();
        assert_eq!(values, expected, "{sent_with:?}");
    }
}

#[test]
fn kafka_batches_become_strata_batches_and_back_in_every_codec() {
    for (compression, codec) in [
        (Compression::None, Codec::None),
        (Compression::Gzip, Codec::Zstd),
        (Compression::Snappy, Codec::Lz4),
        (Compression::Lz4, Codec::Lz4),
        (Compression::Zstd, Codec::Zstd),
    ] {
        let sent = sample();
        let mut stored = to_strata(kafka_batch(&sent, compression), LIMIT, None).unwrap();
        stamp(&mut stored, 100, 7);
        let batches: Vec<_> = split_batches(stored.clone().freeze())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches.len(), 1, "{compression:?}");
        assert_eq!(batches[0].codec(), codec, "{compression:?}");
        assert_eq!(batches[0].record_count(), 3);

        let mut fetched = BytesMut::new();
        translate_to_kafka(stored.freeze(), &mut fetched).unwrap();
        let sets = RecordBatchDecoder::decode_all(&mut fetched.freeze()).unwrap();
        assert_eq!(sets.len(), 1);
        let got = &sets[0].records;
        assert_eq!(got.len(), sent.len());
        for (index, (got, sent)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(got.offset, 100 + index as i64);
            assert_eq!(got.partition_leader_epoch, 7);
            assert_eq!(got.key, sent.key, "{compression:?} record {index}");
            assert_eq!(got.value, sent.value);
            assert_eq!(got.timestamp, sent.timestamp);
            assert_eq!(got.headers, sent.headers);
            assert_eq!(got.producer_id, -1);
        }
    }
}

/// An idempotent producer's id, epoch and sequences survive both ways: the log's duplicate
/// and gap checks see Kafka's sequences, and consumers see them again.
#[test]
fn idempotent_producer_fields_survive_the_round_trip() {
    let sent: Vec<_> = sample()
        .into_iter()
        .map(|mut record| {
            record.producer_id = 42;
            record.producer_epoch = 3;
            record.sequence = 10 + record.offset as i32;
            record
        })
        .collect();
    let mut stored = to_strata(kafka_batch(&sent, Compression::None), LIMIT, None).unwrap();
    let header = strata_wire::BatchHeader::parse(&stored).unwrap();
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (42, 3, 10)
    );
    stamp(&mut stored, 5, 1);
    let mut fetched = BytesMut::new();
    translate_to_kafka(stored.freeze(), &mut fetched).unwrap();
    let info = RecordBatchDecoder::decode_batch_info(&mut fetched.freeze()).unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (
            info[0].producer_id,
            info[0].producer_epoch,
            info[0].base_sequence,
            info[0].min_offset
        ),
        (42, 3, 10, 5)
    );
}

/// Several Kafka batches for one partition become as many Strata batches, back to back; and
/// several stored batches go out as as many Kafka batches.
#[test]
fn several_batches_stay_several() {
    let mut two = BytesMut::new();
    two.extend_from_slice(&kafka_batch(&sample(), Compression::None));
    two.extend_from_slice(&kafka_batch(&sample()[..1], Compression::Lz4));
    let mut stored = to_strata(two.freeze(), LIMIT, None).unwrap();
    let first_len = strata_wire::BatchHeader::parse(&stored).unwrap().batch_len as usize;
    stamp(&mut stored[..first_len], 0, 0);
    stamp(&mut stored[first_len..], 3, 0);
    let counts: Vec<u32> = split_batches(stored.clone().freeze())
        .map(|batch| batch.unwrap().record_count())
        .collect();
    assert_eq!(counts, [3, 1]);
    let mut fetched = BytesMut::new();
    translate_to_kafka(stored.freeze(), &mut fetched).unwrap();
    let offsets: Vec<Vec<i64>> = RecordBatchDecoder::decode_all(&mut fetched.freeze())
        .unwrap()
        .iter()
        .map(|set| set.records.iter().map(|record| record.offset).collect())
        .collect();
    assert_eq!(offsets, [vec![0, 1, 2], vec![3]]);
}

#[test]
fn bad_batches_are_refused_with_their_reason() {
    let mut corrupt = BytesMut::from(&kafka_batch(&sample(), Compression::None)[..]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert!(matches!(
        to_strata(corrupt.freeze(), LIMIT, None),
        Err(RecordsError::Malformed(reason)) if reason.contains("Cyclic redundancy check")
    ));
    assert!(matches!(
        to_strata(Bytes::from_static(&[0; 10]), LIMIT, None),
        Err(RecordsError::Malformed(_))
    ));
    assert!(matches!(
        to_strata(Bytes::new(), LIMIT, None),
        Err(RecordsError::Empty)
    ));
    let transactional: Vec<_> = sample()
        .into_iter()
        .map(|mut record| {
            record.transactional = true;
            record.producer_id = 1;
            record.producer_epoch = 0;
            record.sequence = record.offset as i32;
            record
        })
        .collect();
    // A transactional batch keeps its bit, and comes back out with it.
    let stored = to_strata(kafka_batch(&transactional, Compression::None), LIMIT, None).unwrap();
    let header = strata_wire::batch::check(&stored).unwrap();
    assert!(header.is_transactional() && !header.is_control());
    assert_eq!((header.producer_id, header.producer_epoch), (1, 0));
    let control: Vec<_> = sample()
        .into_iter()
        .map(|mut record| {
            record.control = true;
            record
        })
        .collect();
    assert!(matches!(
        to_strata(kafka_batch(&control, Compression::None), LIMIT, None),
        Err(RecordsError::ControlBatch)
    ));
    // A compressed batch that inflates past the limit is refused before it is built.
    let big = vec![record(0, None, &[7; 60_000]); 1]
        .into_iter()
        .chain((1..20).map(|offset| record(offset, None, &[7; 60_000])))
        .collect::<Vec<_>>();
    let compressed = kafka_batch(&big, Compression::Zstd);
    assert!(compressed.len() < 100_000);
    assert!(matches!(
        to_strata(compressed, 1_000_000, None),
        Err(RecordsError::TooLarge { .. })
    ));
}

/// A batch that inflates past the limit is refused before it is inflated whole, in each codec
/// (a few kilobytes of gzip can stand for gigabytes).
#[test]
fn batches_that_would_inflate_past_the_limit_are_refused_in_every_codec() {
    static ZEROS: [u8; 200_000] = [0; 200_000];
    let bomb: Vec<KafkaRecord> = (0..50)
        .map(|offset| crate::test_records::record(offset, None, &ZEROS))
        .collect();
    for compression in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let compressed = kafka_batch(&bomb, compression);
        assert!(compressed.len() < 1_000_000, "{compression:?} compresses");
        match to_strata(compressed.clone(), 1_000_000, None) {
            // Streams are cut one byte past the limit; snappy's stated size is refused before
            // any of it is inflated. Either way, long before the 10 MB the batch stands for.
            Err(RecordsError::TooLarge { bytes, limit }) if compression == Compression::Snappy => {
                assert!(bytes > limit && bytes < 11_000_000, "{bytes}");
            }
            Err(RecordsError::TooLarge { bytes, limit }) => {
                assert_eq!(bytes, limit + 1, "{compression:?} read past its cap");
            }
            other => panic!("{compression:?}: {other:?}"),
        }
        // Under a limit it fits, it goes through.
        let batch = to_strata(compressed, 20_000_000, None).unwrap();
        assert!(!batch.is_empty());
    }
}

/// A batch whose header claims 2^31 - 1 records (with a CRC that matches, as anyone can
/// compute) is malformed, without reserving room for them.
#[test]
fn a_record_count_past_the_batch_is_refused_before_allocating() {
    let mut batch = BytesMut::from(&kafka_batch(&sample(), Compression::None)[..]);
    // Record count: the last field of the 61-byte v2 header; the CRC covers from byte 21.
    batch[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = strata_wire::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(
        to_strata(batch.freeze(), LIMIT, None),
        Err(RecordsError::Malformed(_))
    ));
}

mod direct_encoding {
    use kafka_protocol::records::TimestampType;
    use proptest::prelude::*;
    use strata_wire::BatchBuilder;
    use strata_wire::batch::attributes;

    use super::*;
    use crate::records::translate_to_kafka;

    /// `kafka-protocol`'s encoder fed the batch's records: the reference `to_kafka` must match.
    fn reference(stored: &Bytes) -> BytesMut {
        let mut out = BytesMut::new();
        for batch in split_batches(stored.clone()) {
            let batch = batch.unwrap();
            let header = *batch.header();
            let records: Vec<KafkaRecord> = batch
                .records()
                .map(|record| KafkaRecord {
                    transactional: header.attributes & attributes::TRANSACTIONAL != 0,
                    control: header.attributes & attributes::CONTROL != 0,
                    delete_horizon: false,
                    partition_leader_epoch: header.leader_epoch as i32,
                    producer_id: header.producer_id,
                    producer_epoch: header.producer_epoch,
                    timestamp_type: TimestampType::Creation,
                    offset: record.offset as i64,
                    sequence: header
                        .base_sequence
                        .wrapping_add((record.offset - header.base_offset) as i32),
                    timestamp: record.timestamp_ms,
                    key: record.key.map(Bytes::copy_from_slice),
                    value: record.nullable_value().map(Bytes::copy_from_slice),
                    headers: record
                        .nullable_headers()
                        .map(|(key, value)| {
                            (
                                StrBytes::from_string(String::from_utf8_lossy(key).into_owned()),
                                value.map(Bytes::copy_from_slice),
                            )
                        })
                        .collect(),
                })
                .collect();
            kafka_protocol::records::RecordBatchEncoder::encode(
                &mut out,
                &records,
                &kafka_protocol::records::RecordEncodeOptions {
                    version: 2,
                    compression: Compression::None,
                },
            )
            .unwrap();
        }
        out
    }

    /// (timestamp, key, value, headers): null keys, null values (tombstones) and null header
    /// values included.
    type TestRecord = (
        i64,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Vec<(Vec<u8>, Option<Vec<u8>>)>,
    );

    fn test_record() -> impl Strategy<Value = TestRecord> {
        (
            -1_000_000i64..1_000_000,
            prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
            prop::option::weighted(0.8, prop::collection::vec(any::<u8>(), 0..300)),
            // Distinct UTF-8 keys: the reference's records keep headers in a map of strings
            // (keys that are not UTF-8 are checked apart).
            prop::collection::btree_map(
                "\\PC{0,8}",
                prop::option::weighted(0.8, prop::collection::vec(any::<u8>(), 0..20)),
                0..3,
            )
            .prop_map(|headers| {
                headers
                    .into_iter()
                    .map(|(key, value)| (key.into_bytes(), value))
                    .collect()
            }),
        )
    }

    proptest! {
        /// What a Kafka client encodes (`kafka-protocol`'s encoder, any codec), the direct
        /// decoder reads back record for record: keys, values, headers, timestamps.
        #[test]
        fn kafka_encoded_batches_decode_record_for_record(
            records in prop::collection::vec(test_record(), 1..20),
            codec in 0usize..5,
        ) {
            let compression = [
                Compression::None,
                Compression::Gzip,
                Compression::Snappy,
                Compression::Lz4,
                Compression::Zstd,
            ][codec];
            let sent: Vec<KafkaRecord> = records
                .iter()
                .enumerate()
                .map(|(i, (timestamp, key, value, headers))| {
                    let mut record = crate::test_records::record(i as i64, None, b"");
                    record.timestamp = 1_700_000_000_000 + timestamp;
                    record.key = key.clone().map(Bytes::from);
                    record.value = value.clone().map(Bytes::from);
                    record.headers = headers
                        .iter()
                        .map(|(k, v)| {
                            (
                                StrBytes::from_string(String::from_utf8(k.clone()).unwrap()),
                                v.clone().map(Bytes::from),
                            )
                        })
                        .collect();
                    record
                })
                .collect();
            let mut stored = to_strata(kafka_batch(&sent, compression), 1 << 24, None).unwrap();
            stamp(&mut stored, 0, 0);
            let batch = split_batches(stored.freeze()).next().unwrap().unwrap();
            prop_assert_eq!(batch.record_count() as usize, sent.len());
            for (got, sent) in batch.records().zip(&sent) {
                prop_assert_eq!(got.timestamp_ms, sent.timestamp);
                prop_assert_eq!(got.key, sent.key.as_deref());
                prop_assert_eq!(got.nullable_value(), sent.value.as_deref());
                let headers: Vec<(Vec<u8>, Option<Vec<u8>>)> = got
                    .nullable_headers()
                    .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                    .collect();
                let expected: Vec<(Vec<u8>, Option<Vec<u8>>)> = sent
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_deref().map(<[u8]>::to_vec)))
                    .collect();
                prop_assert_eq!(headers, expected);
            }
        }
    }

    proptest! {
        /// The direct encoder writes exactly what `kafka-protocol` writes for the same records:
        /// timestamps out of order, null and empty keys and values, headers, producer fields and the
        /// transactional bit, several batches back to back.
        #[test]
        fn the_direct_kafka_encoding_is_kafka_protocols_byte_for_byte(
            batches in prop::collection::vec(
                (prop::collection::vec(test_record(), 1..20), any::<bool>(), any::<bool>()),
                1..4,
            ),
            base in 0u64..1_000_000,
            epoch in any::<u32>(),
        ) {
            let mut stored = BytesMut::new();
            let mut offset = base;
            for (records, idempotent, transactional) in &batches {
                let mut builder = BatchBuilder::default();
                if *idempotent {
                    builder.set_producer(7, 2, 40);
                }
                if *transactional {
                    builder.set_attributes(attributes::TRANSACTIONAL);
                }
                for (timestamp, key, value, headers) in records {
                    builder.push_nullable(
                        1_700_000_000_000 + timestamp,
                        key.as_deref(),
                        value.as_deref(),
                        headers.iter().map(|(k, v)| (&k[..], v.as_deref())),
                    );
                }
                let mut batch = BytesMut::from(&builder.into_batch()[..]);
                stamp(&mut batch, offset, epoch);
                offset += records.len() as u64;
                stored.extend_from_slice(&batch);
            }
            let stored = stored.freeze();
            let mut direct = BytesMut::new();
            translate_to_kafka(stored.clone(), &mut direct).unwrap();
            prop_assert_eq!(&direct[..], &reference(&stored)[..]);
        }
    }
}

/// Kafka lets a record carry several headers with the same key (tracing does); they come in
/// and go out as the producer sent them, in order.
#[test]
fn repeated_header_keys_are_all_kept() {
    let mut builder = strata_wire::BatchBuilder::default();
    builder.push_with_headers(
        1,
        None,
        b"v",
        [(&b"hop"[..], &b"a"[..]), (&b"hop"[..], &b"b"[..])],
    );
    let mut stored = BytesMut::from(&builder.into_batch()[..]);
    stamp(&mut stored, 0, 0);
    let mut out = BytesMut::new();
    translate_to_kafka(stored.freeze(), &mut out).unwrap();
    // Decoded by hand: kafka-protocol's records keep headers in a map and would merge them.
    let record = &out[61..];
    let tail = &record[record.len() - 13..];
    assert_eq!(
        tail,
        &[
            4, 6, b'h', b'o', b'p', 2, b'a', 6, b'h', b'o', b'p', 2, b'b'
        ]
    );
    // That Kafka batch, produced back: both headers arrive.
    let mut again = to_strata(out.freeze(), LIMIT, None).unwrap();
    stamp(&mut again, 0, 0);
    let batch = split_batches(again.freeze()).next().unwrap().unwrap();
    let record = batch.records().next().unwrap();
    let headers: Vec<(&[u8], &[u8])> = record.headers().collect();
    assert_eq!(
        headers,
        [(&b"hop"[..], &b"a"[..]), (&b"hop"[..], &b"b"[..])]
    );
}

/// Kafka's header keys are strings: a native producer's key that is not UTF-8 goes out with
/// its invalid bytes replaced.
#[test]
fn header_keys_that_are_not_utf8_go_out_replaced() {
    let mut builder = strata_wire::BatchBuilder::default();
    builder.push_with_headers(1, None, b"v", [(&[0xff, b'k'][..], &b"x"[..])]);
    let mut stored = BytesMut::from(&builder.into_batch()[..]);
    stamp(&mut stored, 0, 0);
    let mut out = BytesMut::new();
    translate_to_kafka(stored.freeze(), &mut out).unwrap();
    let sets = RecordBatchDecoder::decode_all(&mut out.freeze()).unwrap();
    let key = sets[0].records[0]
        .headers
        .keys()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(key, "\u{fffd}k");
}

/// A compacted batch goes out as Kafka's cleaner leaves one: the records kept at their own
/// offsets, the batch's lastOffsetDelta unchanged, and a batch compaction emptied with no
/// records at all, so a Kafka consumer moves past both.
#[test]
fn compacted_batches_keep_their_offsets_and_last_offset_delta() {
    use strata_wire::batch::BatchBuilder;
    let sent: Vec<KafkaRecord> = (0..6)
        .map(|offset| record(offset, Some(b"k"), b"v"))
        .collect();
    let mut stored = to_strata(kafka_batch(&sent, Compression::None), LIMIT, None).unwrap();
    stamp(&mut stored, 200, 3);
    let original = split_batches(stored.freeze()).next().unwrap().unwrap();
    let mut builder = BatchBuilder::default();
    let mut compacted = BytesMut::new();
    for keep in [&[1usize, 4][..], &[]] {
        builder.start_compacted(original.header(), None);
        for (index, record) in original.records().enumerate() {
            if keep.contains(&index) {
                builder.push_kept(&record);
            }
        }
        compacted.extend_from_slice(&builder.finish_compacted());
    }
    let mut fetched = BytesMut::new();
    translate_to_kafka(compacted.freeze(), &mut fetched).unwrap();
    let fetched = fetched.freeze();
    // Header fields straight from the bytes: lastOffsetDelta at 23, recordCount at 57.
    let be_i32 = |at: usize| i32::from_be_bytes(fetched[at..at + 4].try_into().unwrap());
    let first_len = 12 + be_i32(8) as usize;
    assert_eq!((be_i32(23), be_i32(57)), (5, 2));
    assert_eq!(
        (be_i32(first_len + 23), be_i32(first_len + 57)),
        (5, 0),
        "the emptied batch"
    );
    let sets = RecordBatchDecoder::decode_all(&mut fetched.clone()).unwrap();
    let offsets: Vec<i64> = sets
        .iter()
        .flat_map(|set| set.records.iter().map(|record| record.offset))
        .collect();
    assert_eq!(offsets, vec![201, 204]);
}
