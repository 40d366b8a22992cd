//! Kafka record batches (magic 2) as the log stores them: told apart from Strata's, checked
//! whole once, stamped in place with the CRC kept, read record for record in every codec.

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_wire::batch::kafka::{
    self, EXPECTED_OFFSET_HEADER, KafkaBatchFields, KafkaCodec, RecordToWrite,
};
use strata_wire::batch::{
    self, Batch, BatchBuilder, BatchError, BatchFormat, BatchHeader, split_batches,
};

const CODECS: [KafkaCodec; 5] = [
    KafkaCodec::None,
    KafkaCodec::Gzip,
    KafkaCodec::Snappy,
    KafkaCodec::Lz4,
    KafkaCodec::Zstd,
];

type Headers = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A record as a test writes it.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    timestamp_ms: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Headers,
}

fn fields(codec: KafkaCodec, count: u32) -> KafkaBatchFields {
    KafkaBatchFields {
        base_offset: 0,
        leader_epoch: u32::MAX, // what producers send: -1
        codec,
        transactional: false,
        last_offset_delta: count - 1,
        base_timestamp_ms: 1_700_000_000_000,
        max_timestamp_ms: 1_700_000_000_000 + i64::from(count) - 1,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        delete_horizon: false,
    }
}

fn sample(count: usize) -> Vec<Sent> {
    (0..count)
        .map(|i| Sent {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: (i % 3 != 0).then(|| format!("key-{i}").into_bytes()),
            value: (i % 5 != 4).then(|| format!("a log line, number {i}, ").repeat(4).into_bytes()),
            headers: match i % 4 {
                0 => vec![],
                1 => vec![(b"trace".to_vec(), Some(b"abc".to_vec()))],
                // Repeated keys and a null value, as Kafka allows.
                _ => vec![(b"h".to_vec(), Some(b"1".to_vec())), (b"h".to_vec(), None)],
            },
        })
        .collect()
}

fn write(fields: &KafkaBatchFields, records: &[Sent]) -> Vec<u8> {
    kafka::write_batch(
        fields,
        records.iter().enumerate().map(|(i, sent)| {
            (
                RecordToWrite {
                    offset_delta: i as u32,
                    timestamp_ms: sent.timestamp_ms,
                    key: sent.key.as_deref(),
                    value: sent.value.as_deref(),
                },
                sent.headers
                    .iter()
                    .map(|(key, value)| (&key[..], value.as_deref())),
            )
        }),
    )
}

fn read_back(batch: &Batch) -> Vec<Sent> {
    batch
        .records()
        .map(|record| Sent {
            timestamp_ms: record.timestamp_ms,
            key: record.key.map(<[u8]>::to_vec),
            value: record.nullable_value().map(<[u8]>::to_vec),
            headers: record
                .nullable_headers()
                .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
                .collect(),
        })
        .collect()
}

#[test]
fn kafka_batches_read_back_record_for_record_in_every_codec() {
    let sent = sample(40);
    for codec in CODECS {
        let bytes = write(&fields(codec, 40), &sent);
        let header = BatchHeader::parse(&bytes).unwrap();
        assert_eq!(header.format, BatchFormat::Kafka, "{codec:?}");
        assert_eq!(header.batch_len as usize, bytes.len());
        assert_eq!(header.offset_count, 40);
        assert_eq!(header.kafka_codec(), Ok(codec));
        assert_eq!(header.codec_name(), codec.name());
        let produced = batch::check_produced_batch(&bytes, false).unwrap();
        assert_eq!(produced.header.max_timestamp_ms, sent[39].timestamp_ms);
        let batch = Batch::validate(Bytes::from(bytes.clone())).unwrap();
        assert_eq!(batch.format(), BatchFormat::Kafka);
        assert_eq!(batch.record_count(), 40);
        assert_eq!(read_back(&batch), sent, "{codec:?}");
        let offsets: Vec<u64> = batch.records().map(|record| record.offset).collect();
        assert_eq!(offsets, (0..40).collect::<Vec<_>>());
        if codec != KafkaCodec::None {
            assert!(bytes.len() < write(&fields(KafkaCodec::None, 40), &sent).len());
        }
    }
}

#[test]
fn stamping_writes_offset_and_epoch_in_place_and_keeps_the_crc() {
    let sent = sample(5);
    let mut bytes = write(&fields(KafkaCodec::Zstd, 5), &sent);
    let before = bytes.clone();
    batch::stamp(&mut bytes, 1_000, 7);
    assert_eq!(&bytes[..8], &1_000u64.to_be_bytes());
    assert_eq!(&bytes[12..16], &7u32.to_be_bytes());
    assert_eq!(bytes[16..], before[16..], "nothing else moves");
    let header = batch::check_integrity(&bytes).unwrap();
    assert_eq!((header.base_offset, header.leader_epoch), (1_000, 7));
    assert_eq!(header.last_offset(), 1_004);
    let batch = Batch::validate(Bytes::from(bytes)).unwrap();
    assert_eq!(batch.records().last().unwrap().offset, 1_004);
}

#[test]
fn every_bit_flip_under_the_crc_is_caught() {
    let bytes = write(&fields(KafkaCodec::None, 3), &sample(3));
    for at in 21..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[at] ^= 1 << bit;
            assert!(
                batch::check_integrity(&flipped).is_err(),
                "a flip of bit {bit} at {at} passed"
            );
        }
    }
}

#[test]
fn a_max_timestamp_that_disagrees_with_the_records_is_set_and_the_crc_recomputed() {
    let sent = sample(4);
    let mut wrong = fields(KafkaCodec::Lz4, 4);
    wrong.max_timestamp_ms = 5;
    let mut bytes = write(&wrong, &sent);
    let produced = batch::check_produced_batch(&bytes, false).unwrap();
    assert_eq!(produced.header.max_timestamp_ms, sent[3].timestamp_ms);
    batch::set_kafka_timestamps(&mut bytes, produced.header.max_timestamp_ms, false);
    let header = batch::check_integrity(&bytes).unwrap();
    assert_eq!(header.max_timestamp_ms, sent[3].timestamp_ms);
    assert!(!header.is_log_append_time());

    // LogAppendTime: every record reads the broker's time.
    batch::set_kafka_timestamps(&mut bytes, 42, true);
    let batch = Batch::validate(Bytes::from(bytes)).unwrap();
    assert!(batch.header().is_log_append_time());
    assert!(batch.records().all(|record| record.timestamp_ms == 42));
}

#[test]
fn the_formats_are_told_apart_and_lie_back_to_back() {
    let mut builder = BatchBuilder::default();
    builder.push(1, Some(b"native"), b"record");
    let strata = builder.finish();
    let kafka_batch = write(&fields(KafkaCodec::Snappy, 3), &sample(3));
    // Strata's byte 16 is its length's low byte, a multiple of 8: never Kafka's magic.
    assert!(!kafka::is_kafka(&strata));
    let mut both = BytesMut::new();
    both.extend_from_slice(&kafka_batch);
    both.extend_from_slice(&strata); // now at an address that is not a multiple of 8
    both.extend_from_slice(&kafka_batch);
    let read: Vec<Batch> = split_batches(both.freeze())
        .collect::<Result<_, _>>()
        .unwrap();
    let formats: Vec<BatchFormat> = read.iter().map(Batch::format).collect();
    assert_eq!(
        formats,
        [BatchFormat::Kafka, BatchFormat::Strata, BatchFormat::Kafka]
    );
    assert_eq!(read[1].records().next().unwrap().value, b"record");
    assert_eq!(read_back(&read[2]), sample(3));
}

#[test]
fn produced_batches_are_checked_as_kafkas_broker_checks_them() {
    let sent = sample(6);
    let good = write(&fields(KafkaCodec::None, 6), &sent);
    // A last offset delta past the records: not dense.
    let mut gap = fields(KafkaCodec::None, 6);
    gap.last_offset_delta = 7;
    assert!(matches!(
        batch::check_produced_batch(&write(&gap, &sent), false),
        Err(BatchError::InconsistentRecord { .. })
    ));
    // Keyless records on a compacted topic are named (KIP-467).
    assert_eq!(
        batch::check_produced_batch(&good, true),
        Err(BatchError::MissingKeys {
            indices: vec![0, 3]
        })
    );
    // Transactional without a producer.
    let mut transactional = fields(KafkaCodec::None, 6);
    transactional.transactional = true;
    assert_eq!(
        batch::check_produced_batch(&write(&transactional, &sent), false),
        Err(BatchError::TransactionalWithoutProducer)
    );
    // A control batch is the broker's to write.
    let mut control = good.clone();
    control[22] |= 1 << 5;
    assert_eq!(
        batch::check_produced_batch(&control, false),
        Err(BatchError::ControlBatch)
    );
    // Every truncation is refused, never read past.
    for len in 0..good.len() {
        assert!(batch::check_produced_batch(&good[..len], false).is_err());
        assert!(Batch::validate(Bytes::copy_from_slice(&good[..len])).is_err());
    }
    // A record's length that disagrees with its fields, CRC fixed so the walk sees it.
    let mut framing = good.clone();
    framing[kafka::HEADER_LEN] ^= 0x02;
    let crc = strata_wire::crc32c(&framing[21..]);
    framing[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(batch::check_produced_batch(&framing, false).is_err());
}

#[test]
fn the_first_records_expected_offset_header_is_read_as_the_records_are_checked() {
    let mut sent = sample(3);
    sent[0].headers = vec![(
        EXPECTED_OFFSET_HEADER.as_bytes().to_vec(),
        Some(b"1234".to_vec()),
    )];
    for codec in [KafkaCodec::None, KafkaCodec::Zstd] {
        let produced =
            batch::check_produced_batch(&write(&fields(codec, 3), &sent), false).unwrap();
        assert_eq!(produced.expected_offset, Some(1234));
    }
    let plain =
        batch::check_produced_batch(&write(&fields(KafkaCodec::None, 3), &sample(3)), false)
            .unwrap();
    assert_eq!(plain.expected_offset, None);
}

#[test]
fn records_that_inflate_past_the_limit_are_refused_before_they_do() {
    let zeros = vec![0u8; kafka::INFLATED_LEN_MAX + 1];
    for codec in [
        KafkaCodec::Gzip,
        KafkaCodec::Zstd,
        KafkaCodec::Lz4,
        KafkaCodec::Snappy,
    ] {
        let compressed = kafka::compress(codec, &zeros);
        assert_eq!(
            kafka::decompress(codec, &compressed, kafka::INFLATED_LEN_MAX),
            Err(BatchError::Inflates {
                limit: kafka::INFLATED_LEN_MAX
            }),
            "{codec:?}"
        );
    }
}

#[test]
fn a_compacted_kafka_batch_keeps_its_offsets_codec_and_producer_and_is_a_valid_kafka_batch() {
    let sent = sample(10);
    let mut original_fields = fields(KafkaCodec::Zstd, 10);
    original_fields.producer_id = 9;
    original_fields.producer_epoch = 2;
    original_fields.base_sequence = 100;
    let mut bytes = write(&original_fields, &sent);
    batch::stamp(&mut bytes, 500, 3);
    let original = Batch::validate(Bytes::from(bytes)).unwrap();
    let kept = original
        .records()
        .filter(|record| (record.offset - 500) % 3 == 0);
    let compacted = kafka::compacted(original.header(), Some(99), kept);
    let header = batch::check_integrity(&compacted).unwrap();
    assert_eq!(header.format, BatchFormat::Kafka);
    assert_eq!(header.base_offset, 500);
    assert_eq!(header.last_offset(), 509);
    assert_eq!(header.leader_epoch, 3);
    assert_eq!(header.kafka_codec(), Ok(KafkaCodec::Zstd));
    assert_eq!(
        (
            header.producer_id,
            header.producer_epoch,
            header.base_sequence
        ),
        (9, 2, 100)
    );
    assert_eq!(header.delete_horizon_ms(), Some(99));
    let batch = Batch::validate(compacted).unwrap();
    let offsets: Vec<u64> = batch.records().map(|record| record.offset).collect();
    assert_eq!(offsets, [500, 503, 506, 509]);
    let timestamps: Vec<i64> = batch.records().map(|record| record.timestamp_ms).collect();
    let expected: Vec<i64> = [0, 3, 6, 9].iter().map(|i| sent[*i].timestamp_ms).collect();
    assert_eq!(
        timestamps, expected,
        "timestamps stay exact under a horizon"
    );
    // A run that lost every record: an empty batch spanning it.
    let empty = kafka::compacted(original.header(), None, std::iter::empty());
    assert_eq!(empty.len(), kafka::HEADER_LEN);
    let empty = Batch::validate(empty).unwrap();
    assert_eq!(empty.record_count(), 0);
    assert_eq!(empty.header().next_offset(), 510);
}

#[test]
fn the_decoder_survives_random_and_mutated_kafka_input() {
    let mut rng = StdRng::seed_from_u64(0x4b41_464b);
    let seeds: Vec<Vec<u8>> = CODECS
        .iter()
        .map(|codec| write(&fields(*codec, 6), &sample(6)))
        .collect();
    let mut accepted = 0;
    for round in 0..4000 {
        let mut input = seeds[round % seeds.len()].clone();
        for _ in 0..rng.random_range(1..4) {
            match rng.random_range(0..3) {
                0 => {
                    let at = rng.random_range(0..input.len());
                    input[at] = rng.random();
                }
                1 => input.truncate(rng.random_range(0..input.len())),
                _ => input.extend((0..rng.random_range(1..16)).map(|_| rng.random::<u8>())),
            }
            if input.is_empty() {
                break;
            }
        }
        if input.len() > 21 && rng.random_bool(0.7) {
            // Fix the CRC so the walk of the records sees the damage.
            let crc = strata_wire::crc32c(&input[21..]);
            input[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        let _ = batch::check_produced_batch(&input, rng.random_bool(0.5));
        if let Ok(batch) = Batch::validate(Bytes::from(input)) {
            accepted += 1;
            for record in batch.records() {
                std::hint::black_box((record.key, record.value, record.headers().count()));
            }
        }
    }
    assert!(
        accepted > 0,
        "the mutator never kept a batch valid: it tests nothing"
    );
}

/// zstd streams as Kafka's clients write them: librdkafka's declare their size (one call into
/// exactly that much memory), a streaming compressor's (the Java client's) do not, and a
/// stream may hold several frames; each inflates to the same records.
#[test]
fn zstd_records_inflate_with_or_without_a_declared_size_and_across_frames() {
    let records: Vec<u8> = (0..20_000u32)
        .flat_map(|i| (i % 97).to_be_bytes())
        .collect();
    let declared = zstd::bulk::compress(&records, 3).unwrap();
    let streamed = zstd::stream::encode_all(&records[..], 3).unwrap();
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&streamed)
            .ok()
            .flatten(),
        None,
        "a streamed frame states no size"
    );
    let mut two_frames = zstd::bulk::compress(&records[..40_000], 3).unwrap();
    two_frames.extend_from_slice(&zstd::bulk::compress(&records[40_000..], 3).unwrap());
    for (what, stream) in [
        ("declared", declared),
        ("streamed", streamed),
        ("two frames", two_frames),
    ] {
        let inflated = kafka::decompress(KafkaCodec::Zstd, &stream, kafka::INFLATED_LEN_MAX)
            .unwrap_or_else(|error| panic!("{what}: {error}"));
        assert_eq!(&inflated[..], &records[..], "{what}");
    }
}
