use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record as KafkaRecord, RecordBatchDecoder};
use strata_wire::batch::kafka::KafkaCodec;
use strata_wire::batch::{split_batches, stamp};
use strata_wire::{Batch, BatchBuilder, BatchError};

use super::{RecordsError, to_kafka, to_store};

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

/// `kafka`'s records as one Strata batch: what a native producer of the same records sends.
fn as_strata(kafka: Bytes) -> BytesMut {
    let batch = Batch::validate(kafka).unwrap();
    let header = *batch.header();
    let mut builder = BatchBuilder::default();
    if header.is_idempotent() {
        builder.set_producer(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
        );
    }
    if header.is_transactional() {
        builder.set_attributes(strata_wire::batch::attributes::TRANSACTIONAL);
    }
    for record in batch.records() {
        builder.push_nullable(
            record.timestamp_ms,
            record.key,
            record.nullable_value(),
            record.nullable_headers(),
        );
    }
    BytesMut::from(&builder.into_batch()[..])
}

const KAFKA_CODECS: [(Compression, KafkaCodec); 5] = [
    (Compression::None, KafkaCodec::None),
    (Compression::Gzip, KafkaCodec::Gzip),
    (Compression::Snappy, KafkaCodec::Snappy),
    (Compression::Lz4, KafkaCodec::Lz4),
    (Compression::Zstd, KafkaCodec::Zstd),
];

/// A topic's compression.type recompresses a Kafka batch sent with another codec (Kafka's
/// rule): a Kafka batch still, with the topic's codec and the same records; `producer` (no
/// codec) keeps the bytes as sent.
#[test]
fn a_topics_compression_type_recompresses_batches_sent_with_another_codec() {
    for (sent_with, stored_as) in [
        (Compression::None, KafkaCodec::Zstd),
        (Compression::Gzip, KafkaCodec::Lz4),
        (Compression::Lz4, KafkaCodec::None),
        (Compression::Zstd, KafkaCodec::Snappy),
    ] {
        let sent = sample();
        let kafka = kafka_batch(&sent, sent_with);
        assert_eq!(to_store(BytesMut::from(&kafka[..]), None).unwrap(), kafka);
        let stored = to_store(BytesMut::from(&kafka[..]), Some(stored_as)).unwrap();
        let checked = strata_wire::batch::check_produced_batch(&stored, false).unwrap();
        assert_eq!(checked.header.kafka_codec(), Ok(stored_as), "{sent_with:?}");
        let batch = split_batches(stored.freeze()).next().unwrap().unwrap();
        let values: Vec<Option<&[u8]>> = batch.records().map(|r| r.nullable_value()).collect();
        let expected: Vec<Option<&[u8]>> = sent.iter().map(|r| r.value.as_deref()).collect();
        assert_eq!(values, expected, "{sent_with:?}");
    }
}

/// A produced Kafka batch, in each of Kafka's codecs, is stored as sent; stamped by the log and
/// fetched back, it is the same bytes but for the log's offset and epoch, and a Kafka client
/// reads it with the same keys, values, headers and timestamps.
#[test]
fn kafka_batches_are_stored_as_sent_and_served_as_stored_in_every_codec() {
    for (compression, codec) in KAFKA_CODECS {
        let sent = sample();
        let kafka = kafka_batch(&sent, compression);
        let mut stored = to_store(BytesMut::from(&kafka[..]), None).unwrap();
        let checked = strata_wire::batch::check_produced_batch(&stored, false).unwrap();
        assert_eq!(checked.header.kafka_codec(), Ok(codec));
        stamp(&mut stored, 100, 7);
        assert_eq!(
            stored[16..],
            kafka[16..],
            "{compression:?}: only offset and epoch move"
        );
        let stored = stored.freeze();
        let fetched = to_kafka(stored.clone()).unwrap();
        assert_eq!(
            fetched.as_ptr(),
            stored.as_ptr(),
            "served as stored, not copied"
        );
        let sets = RecordBatchDecoder::decode_all(&mut fetched.clone()).unwrap();
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

/// A Kafka consumer of a partition holding both formats gets the Kafka batches as stored and
/// the Strata ones translated, in order, offsets kept.
#[test]
fn a_fetch_of_both_formats_keeps_kafka_batches_and_translates_strata_ones() {
    let mut kafka = BytesMut::from(&kafka_batch(&sample(), Compression::Zstd)[..]);
    stamp(&mut kafka, 0, 1);
    let mut native = as_strata(kafka_batch(&sample(), Compression::None));
    stamp(&mut native, 3, 1);
    let mut stored = BytesMut::new();
    stored.extend_from_slice(&kafka);
    stored.extend_from_slice(&native);
    stored.extend_from_slice(&kafka);
    let fetched = to_kafka(stored.freeze()).unwrap();
    assert_eq!(
        &fetched[..kafka.len()],
        &kafka[..],
        "the Kafka batch byte for byte"
    );
    let sets = RecordBatchDecoder::decode_all(&mut fetched.clone()).unwrap();
    let offsets: Vec<Vec<i64>> = sets
        .iter()
        .map(|set| set.records.iter().map(|record| record.offset).collect())
        .collect();
    assert_eq!(offsets, [vec![0, 1, 2], vec![3, 4, 5], vec![0, 1, 2]]);
}

/// An idempotent producer's id, epoch and sequences are read from Kafka's header: the log's
/// duplicate and gap checks see Kafka's sequences, and a native batch of the same producer
/// goes out with them.
#[test]
fn idempotent_producer_fields_are_read_from_kafkas_header() {
    let sent: Vec<_> = sample()
        .into_iter()
        .map(|mut record| {
            record.producer_id = 42;
            record.producer_epoch = 3;
            record.sequence = 10 + record.offset as i32;
            record
        })
        .collect();
    let kafka = kafka_batch(&sent, Compression::None);
    let header = strata_wire::BatchHeader::parse(&kafka).unwrap();
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (42, 3, 10)
    );
    let mut stored = as_strata(kafka);
    stamp(&mut stored, 5, 1);
    let fetched = to_kafka(stored.freeze()).unwrap();
    let info = RecordBatchDecoder::decode_batch_info(&mut fetched.clone()).unwrap();
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

/// Several stored batches go out as as many Kafka batches.
#[test]
fn several_batches_stay_several() {
    let mut stored = as_strata(kafka_batch(&sample(), Compression::None));
    let first_len = stored.len();
    stored.extend_from_slice(&as_strata(kafka_batch(&sample()[..1], Compression::Lz4)));
    stamp(&mut stored[..first_len], 0, 0);
    stamp(&mut stored[first_len..], 3, 0);
    let fetched = to_kafka(stored.freeze()).unwrap();
    let offsets: Vec<Vec<i64>> = RecordBatchDecoder::decode_all(&mut fetched.clone())
        .unwrap()
        .iter()
        .map(|set| set.records.iter().map(|record| record.offset).collect())
        .collect();
    assert_eq!(offsets, [vec![0, 1, 2], vec![3]]);
}

/// What is not Kafka batches of magic 2 is refused on sight; what is, the log checks whole:
/// its CRC, its records, the count its header claims.
#[test]
fn bad_batches_are_refused_with_their_reason() {
    assert!(matches!(
        to_store(BytesMut::from(&[0u8; 10][..]), None),
        Err(RecordsError::Malformed(_))
    ));
    assert!(matches!(
        to_store(BytesMut::new(), None),
        Err(RecordsError::Empty)
    ));
    let mut old_magic = BytesMut::from(&kafka_batch(&sample(), Compression::None)[..]);
    old_magic[16] = 1;
    assert!(matches!(
        to_store(old_magic, None),
        Err(RecordsError::Malformed(reason)) if reason.contains("v1")
    ));
    let control: Vec<_> = sample()
        .into_iter()
        .map(|mut record| {
            record.control = true;
            record.transactional = true;
            record.producer_id = 1;
            record.producer_epoch = 0;
            record
        })
        .collect();
    assert!(matches!(
        to_store(
            BytesMut::from(&kafka_batch(&control, Compression::None)[..]),
            None
        ),
        Err(RecordsError::ControlBatch)
    ));
    let mut corrupt = BytesMut::from(&kafka_batch(&sample(), Compression::None)[..]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert!(matches!(
        strata_wire::batch::check_produced_batch(&corrupt, false),
        Err(BatchError::CrcMismatch { .. })
    ));
    // A transactional batch keeps its bit.
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
    let checked = strata_wire::batch::check_produced_batch(
        &kafka_batch(&transactional, Compression::None),
        false,
    )
    .unwrap();
    assert!(checked.header.is_transactional() && !checked.header.is_control());
    assert_eq!(
        (checked.header.producer_id, checked.header.producer_epoch),
        (1, 0)
    );
    // A header claiming 2^31 - 1 records (with a CRC that matches, as anyone can compute) is
    // refused without reserving room for them.
    let mut lying = BytesMut::from(&kafka_batch(&sample(), Compression::None)[..]);
    lying[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = strata_wire::crc32c(&lying[21..]);
    lying[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(
        strata_wire::batch::check_produced_batch(&lying, false),
        Err(BatchError::InconsistentRecord { .. })
    ));
}

mod direct_encoding {
    use kafka_protocol::records::TimestampType;
    use proptest::prelude::*;
    use strata_wire::BatchBuilder;
    use strata_wire::batch::attributes;

    use super::*;
    use crate::records::to_kafka;

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
        /// What a Kafka client encodes (`kafka-protocol`'s encoder, any codec), the leader's
        /// check passes and Strata's reader reads back record for record: keys, values,
        /// headers, timestamps.
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
            let kafka = kafka_batch(&sent, compression);
            prop_assert!(strata_wire::batch::check_produced_batch(&kafka, false).is_ok());
            let batch = Batch::validate(kafka).unwrap();
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
            let direct = to_kafka(stored.clone()).unwrap();
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
    let out = to_kafka(stored.freeze()).unwrap();
    // Decoded by hand: kafka-protocol's records keep headers in a map and would merge them.
    let record = &out[61..];
    let tail = &record[record.len() - 13..];
    assert_eq!(
        tail,
        &[
            4, 6, b'h', b'o', b'p', 2, b'a', 6, b'h', b'o', b'p', 2, b'b'
        ]
    );
    // That Kafka batch, read back: both headers arrive.
    let batch = Batch::validate(out).unwrap();
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
    let out = to_kafka(stored.freeze()).unwrap();
    let sets = RecordBatchDecoder::decode_all(&mut out.clone()).unwrap();
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
    let mut stored = as_strata(kafka_batch(&sent, Compression::None));
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
    let fetched = to_kafka(compacted.freeze()).unwrap();
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
