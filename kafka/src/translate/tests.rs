use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, MetadataResponse, ProduceRequest, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::Compression;
use strata_wire::protocol as native;

use super::*;
use crate::errors;
use crate::frame::{Decoded, Header, KafkaRequest, Rejected, decode_request, encode_response};

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_owned()))
}

fn kafka_records() -> Bytes {
    crate::test_records::batch(
        &[crate::test_records::record(0, None, b"v")],
        Compression::None,
    )
}

/// Partitions refused on sight are answered beside the broker's answers, under their topic.
#[test]
fn produce_refuses_bad_partitions_on_sight_and_answers_them_beside_the_rest() {
    let partition = |index: i32, records: Option<Bytes>| {
        PartitionProduceData::default()
            .with_index(index)
            .with_records(records)
    };
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(1500)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name("orders"))
                .with_partition_data(vec![
                    partition(0, Some(kafka_records())),
                    partition(-1, Some(kafka_records())),
                    partition(2, Some(Bytes::from_static(b"garbage bytes, not a batch"))),
                ]),
        ]);
    let translated = produce_request(produced(request), |_| None);
    assert_eq!(translated.native.acks, native::ACKS_ALL);
    assert_eq!(translated.native.timeout_ms, 1500);
    assert_eq!(translated.native.topics.len(), 1);
    assert_eq!(translated.native.topics[0].partitions.len(), 1);
    assert_eq!(translated.native.topics[0].partitions[0].partition, 0);
    assert_eq!(
        translated.refused,
        [
            Refused {
                topic: "orders".into(),
                partition: -1,
                error: errors::UNKNOWN_TOPIC_OR_PARTITION
            },
            Refused {
                topic: "orders".into(),
                partition: 2,
                error: errors::CORRUPT_MESSAGE
            },
        ]
    );
    let answered = native::ProduceResponse {
        topics: vec![native::ProduceTopicResponse {
            name: "orders".into(),
            partitions: vec![
                native::ProducePartitionResponse {
                    partition: 0,
                    error: native::ErrorCode::None,
                    base_offset: 41,
                    log_start_offset: 0,
                    leader_hint: -1,
                },
                native::ProducePartitionResponse {
                    partition: 1,
                    error: native::ErrorCode::InvalidRecord,
                    base_offset: 0,
                    log_start_offset: 0,
                    leader_hint: -1,
                },
            ],
        }],
        record_errors: native::Appended(vec![native::RecordErrors {
            topic: "orders".into(),
            partition: 1,
            indices: vec![0, 10],
            message: "records [0, 10] have no key".into(),
        }]),
        durability: Default::default(),
        log_append_times: native::Appended(vec![1_700_000_000_123, -1]),
    };
    let response = produce_response(answered, translated.refused);
    assert_eq!(response.responses.len(), 1, "one entry per topic");
    let partitions = &response.responses[0].partition_responses;
    let summary: Vec<(i32, i16, i64)> = partitions
        .iter()
        .map(|p| (p.index, p.error_code, p.base_offset))
        .collect();
    assert_eq!(
        summary,
        [
            (0, errors::NONE, 41),
            (1, errors::INVALID_RECORD, -1),
            (-1, errors::UNKNOWN_TOPIC_OR_PARTITION, -1),
            (2, errors::CORRUPT_MESSAGE, -1)
        ]
    );
    // KIP-467: the records a batch was refused for, by index, and why.
    let refused_records: Vec<i32> = partitions[1]
        .record_errors
        .iter()
        .map(|error| error.batch_index)
        .collect();
    assert_eq!(refused_records, [0, 10]);
    assert_eq!(
        partitions[1].error_message.as_deref(),
        Some("records [0, 10] have no key")
    );
    assert!(partitions[0].record_errors.is_empty());
    assert_eq!(partitions[0].error_message, None);
    // LogAppendTime: the broker's time for the partition stamped, -1 for the others.
    let times: Vec<i64> = partitions.iter().map(|p| p.log_append_time_ms).collect();
    assert_eq!(times, [1_700_000_000_123, -1, -1, -1]);

    let bad_acks = produce_request(
        produced(ProduceRequest::default().with_acks(2).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name("orders"))
                .with_partition_data(vec![partition(0, Some(kafka_records()))]),
        ])),
        |_| None,
    );
    assert!(bad_acks.native.topics.is_empty());
    assert_eq!(bad_acks.refused[0].error, 21);
}

#[test]
fn fetches_naming_a_session_are_refused_and_negative_offsets_are_out_of_range() {
    let topic = FetchTopic::default()
        .with_topic(name("t"))
        .with_partitions(vec![
            FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(5)
                .with_partition_max_bytes(1000),
            FetchPartition::default()
                .with_partition(1)
                .with_fetch_offset(-1),
        ]);
    let request = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![topic]);
    assert_eq!(
        fetch_request(&request.clone().with_session_id(7), |_| None).unwrap_err(),
        FETCH_SESSION_ID_NOT_FOUND
    );
    let translated = fetch_request(&request, |_| None).unwrap();
    assert_eq!(translated.native.max_wait_ms, 500);
    let partitions = &translated.native.topics[0].partitions;
    assert_eq!(partitions.len(), 1);
    assert_eq!(
        (
            partitions[0].partition,
            partitions[0].fetch_offset,
            partitions[0].max_bytes
        ),
        (0, 5, 1000)
    );
    assert_eq!(translated.refused[0].error, errors::OFFSET_OUT_OF_RANGE);
}

/// From Fetch 13 topics are asked by id: a known id is fetched by its topic's name, and the
/// answer carries the id; an id no topic has is answered UNKNOWN_TOPIC_ID, by id.
#[test]
fn fetches_by_topic_id_resolve_known_ids_and_refuse_unknown_ones() {
    let known = uuid::Uuid::from_u128(7);
    let unknown = uuid::Uuid::from_u128(9);
    let by_id = |id: uuid::Uuid| {
        FetchTopic::default()
            .with_topic_id(id)
            .with_partitions(vec![
                FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(3)
                    .with_partition_max_bytes(1000),
            ])
    };
    let request = FetchRequest::default().with_topics(vec![by_id(known), by_id(unknown)]);
    let named = |id: uuid::Uuid| (id == known).then(|| "orders".to_string());
    let translated = fetch_request(&request, named).unwrap();
    assert_eq!(translated.native.topics.len(), 1);
    assert_eq!(translated.native.topics[0].name, "orders");
    assert_eq!(translated.unknown_ids, vec![(unknown, vec![0])]);

    let answer = native::FetchResponse {
        topics: vec![native::FetchTopicResponse {
            name: "orders".into(),
            partitions: vec![native::FetchPartitionResponse {
                partition: 0,
                error: native::ErrorCode::None,
                high_watermark: 3,
                log_start_offset: 0,
                records: native::Records::empty(),
                leader_hint: Default::default(),
            }],
        }],
        stability: Default::default(),
    };
    let id_of = |name: &str| {
        if name == "orders" {
            known
        } else {
            uuid::Uuid::nil()
        }
    };
    let (response, _) = fetch_response(answer, Vec::new(), translated.unknown_ids, id_of);
    let header = crate::frame::Header {
        api_key: ApiKey::Fetch,
        api_version: 13,
        correlation_id: 1,
        client_id: String::new(),
        throttle_ms: 0,
    };
    let mut frame = Bytes::from(crate::frame::encode_fetch_response(&header, &response).concat());
    bytes::Buf::advance(&mut frame, 4 + 4 + 1); // size, correlation id, header tags
    let decoded = FetchResponse::decode(&mut frame, 13).unwrap();
    let topics: Vec<_> = decoded
        .responses
        .iter()
        .map(|topic| (topic.topic_id, topic.partitions[0].error_code))
        .collect();
    assert_eq!(
        topics,
        vec![(known, 0), (unknown, errors::UNKNOWN_TOPIC_ID)]
    );
}

/// Brokers are advertised at their Kafka listeners; a partition led by a broker without one
/// has no leader a Kafka client can reach.
#[test]
fn metadata_advertises_kafka_listeners_and_leaders_without_one_are_unavailable() {
    let partition = |partition: u32, leader: i32| native::PartitionMetadata {
        partition,
        error: native::ErrorCode::None,
        leader,
        leader_epoch: 3,
        shard: 0,
        replicas: vec![1, 2],
        isr: vec![1, 2],
    };
    let response = metadata_response(
        native::MetadataResponse {
            cluster: "c".into(),
            controller: 2,
            brokers: vec![],
            topics: vec![native::TopicMetadata {
                name: "t".into(),
                error: native::ErrorCode::None,
                partitions: vec![partition(0, 1), partition(1, 2)],
            }],
        },
        &[KafkaBroker {
            node_id: 1,
            host: "10.0.0.1".into(),
            port: 9092,
            rack: None,
        }],
    );
    assert_eq!(response.brokers.len(), 1);
    assert_eq!(response.brokers[0].port, 9092);
    assert_eq!(response.controller_id.0, -1);
    let partitions = &response.topics[0].partitions;
    assert_eq!(
        (
            partitions[0].error_code,
            partitions[0].leader_id.0,
            partitions[0].leader_epoch
        ),
        (errors::NONE, 1, 3)
    );
    assert_eq!(
        (partitions[1].error_code, partitions[1].leader_id.0),
        (errors::LEADER_NOT_AVAILABLE, -1)
    );
    assert_eq!(partitions[0].offline_replicas, [BrokerId(2)]);
}

fn frame<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("test")));
    let mut out = BytesMut::new();
    header
        .encode(&mut out, api.request_header_version(version))
        .unwrap();
    body.encode(&mut out, version).unwrap();
    out.freeze()
}

/// `request` as the listener has it: encoded in a frame (Produce v9) and decoded, its records
/// detached from the frame.
fn produced(request: ProduceRequest) -> crate::frame::Produced {
    match decode_request(frame(ApiKey::Produce, 9, 1, &request))
        .unwrap()
        .request
    {
        KafkaRequest::Produce(produced) => produced,
        other => panic!("decoded as {other:?}"),
    }
}

/// A produce's records come out of the frame they were decoded from, each partition's its
/// own, and in place: no copy where nothing else holds the frame, a copy where something does.
#[test]
fn a_produces_records_are_detached_from_its_frame_in_place() {
    let partition = |index: i32, records: Bytes| {
        PartitionProduceData::default()
            .with_index(index)
            .with_records(Some(records))
    };
    let request = ProduceRequest::default().with_acks(1).with_topic_data(vec![
        TopicProduceData::default()
            .with_name(name("orders"))
            .with_partition_data(vec![
                partition(0, kafka_records()),
                partition(1, Bytes::from_static(b"second partition's bytes")),
            ]),
    ]);
    let whole = frame(ApiKey::Produce, 9, 1, &request);
    let (start, end) = (
        whole.as_ptr() as usize,
        whole.as_ptr() as usize + whole.len(),
    );
    let KafkaRequest::Produce(detached) = decode_request(whole).unwrap().request else {
        panic!("a produce")
    };
    assert_eq!(detached.records.len(), 2);
    assert_eq!(
        &detached.records[0].as_ref().unwrap()[..],
        &kafka_records()[..]
    );
    assert_eq!(
        &detached.records[1].as_ref().unwrap()[..],
        b"second partition's bytes"
    );
    for records in detached.records.iter().flatten() {
        let at = records.as_ptr() as usize;
        assert!((start..end).contains(&at), "copied out of the frame");
    }
    assert_eq!(detached.request.topic_data[0].name.0.as_str(), "orders");
    assert!(
        detached.request.topic_data[0]
            .partition_data
            .iter()
            .all(|partition| partition.records.is_none())
    );
    // A frame someone else holds too is left alone: its records are copied.
    let whole = frame(ApiKey::Produce, 9, 1, &request);
    let KafkaRequest::Produce(copied) = decode_request(whole.clone()).unwrap().request else {
        panic!("a produce")
    };
    let at = copied.records[0].as_ref().unwrap().as_ptr() as usize;
    assert!(!(whole.as_ptr() as usize..whole.as_ptr() as usize + whole.len()).contains(&at));
    assert_eq!(copied.records_len(), detached.records_len());
}

/// Requests decode at every served version (flexible or not), others are refused with what
/// is needed to answer or log them; responses carry the header their version calls for.
#[test]
fn frames_decode_at_served_versions_and_refuse_the_rest() {
    for version in 0..=12 {
        let request = kafka_protocol::messages::MetadataRequest::default();
        let decoded =
            decode_request(frame(ApiKey::Metadata, version, version as i32, &request)).unwrap();
        assert_eq!(decoded.header.correlation_id, version as i32);
        assert_eq!(decoded.trailing_bytes, 0);
        assert!(matches!(decoded.request, KafkaRequest::Metadata(_)));
    }
    for version in 3..=9 {
        let request = ProduceRequest::default().with_acks(1);
        let decoded = decode_request(frame(ApiKey::Produce, version, 1, &request)).unwrap();
        assert!(
            matches!(decoded.request, KafkaRequest::Produce(p) if p.request.acks == 1),
            "v{version}"
        );
    }
    let api_versions = kafka_protocol::messages::ApiVersionsRequest::default();
    assert!(matches!(
        decode_request(frame(ApiKey::ApiVersions, 3, 9, &api_versions)),
        Ok(Decoded {
            request: KafkaRequest::ApiVersions(_),
            ..
        })
    ));
    // Version 5, past what this build knows (its body as 4's).
    let mut newer = BytesMut::from(&frame(ApiKey::ApiVersions, 4, 9, &api_versions)[..]);
    newer[2..4].copy_from_slice(&5i16.to_be_bytes());
    assert!(matches!(
        decode_request(newer.freeze()),
        Err(Rejected::Unsupported {
            api_key: 18,
            api_version: 5,
            correlation_id: 9
        })
    ));
    // 4 names the features: KIP-848's and KIP-932's groups finalized, transactions v2 not.
    let features = api_versions_response(0);
    let finalized: Vec<_> = features
        .finalized_features
        .iter()
        .map(|f| (f.name.to_string(), f.max_version_level))
        .collect();
    assert_eq!(
        finalized,
        [
            ("group.version".to_string(), 1),
            ("share.version".to_string(), 1)
        ]
    );
    assert!(
        features
            .supported_features
            .iter()
            .any(|f| f.name.as_str() == "transaction.version" && f.max_version == 0)
    );
    assert!(matches!(
        decode_request(frame(ApiKey::Produce, 13, 9, &ProduceRequest::default())),
        Err(Rejected::Unsupported { .. })
    ));
    let mut trailing = BytesMut::from(
        &frame(
            ApiKey::Metadata,
            4,
            1,
            &kafka_protocol::messages::MetadataRequest::default(),
        )[..],
    );
    // Bytes after a whole request are ignored and counted, as Kafka's brokers ignore them.
    trailing.extend_from_slice(b"xx");
    assert!(matches!(
        decode_request(trailing.freeze()),
        Ok(Decoded {
            request: KafkaRequest::Metadata(_),
            trailing_bytes: 2,
            ..
        })
    ));
    let whole = frame(ApiKey::Produce, 9, 1, &ProduceRequest::default());
    assert!(matches!(
        decode_request(whole.slice(..whole.len() - 1)),
        Err(Rejected::Malformed(_))
    ));
    assert!(matches!(
        decode_request(Bytes::from_static(b"abc")),
        Err(Rejected::Malformed(_))
    ));

    // A response frame: size, header (tagged fields at flexible versions), body.
    for version in [4, 12] {
        let header = Header {
            api_key: ApiKey::Metadata,
            api_version: version,
            correlation_id: 77,
            client_id: String::new(),
            throttle_ms: 0,
        };
        let response =
            MetadataResponse::default().with_cluster_id(Some(StrBytes::from_static_str("c")));
        let mut encoded = encode_response(&header, &response).unwrap().freeze();
        let size = i32::from_be_bytes(encoded[..4].try_into().unwrap());
        assert_eq!(size as usize, encoded.len() - 4);
        let mut body = encoded.split_off(4);
        let response_header =
            ResponseHeader::decode(&mut body, ApiKey::Metadata.response_header_version(version))
                .unwrap();
        assert_eq!(response_header.correlation_id, 77);
        let decoded = MetadataResponse::decode(&mut body, version).unwrap();
        assert_eq!(
            decoded.cluster_id.map(|c| c.to_string()).as_deref(),
            Some("c")
        );
    }
}

/// Metadata v0 has no null topic array: an empty one asks for every topic, as Kafka's
/// brokers read it; from v1 on, empty asks for none (brokers only) and null for every one.
#[test]
fn an_empty_metadata_v0_request_asks_for_every_topic() {
    let empty = kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![]));
    assert_eq!(crate::translate::metadata_request(&empty, 0).topics, None);
    assert_eq!(
        crate::translate::metadata_request(&empty, 1).topics,
        Some(vec![])
    );
    let all = kafka_protocol::messages::MetadataRequest::default().with_topics(None);
    assert_eq!(crate::translate::metadata_request(&all, 12).topics, None);
}

/// The frames confluent-kafka 2.16 (librdkafka 2.16) sends for `AdminClient.list_topics()`,
/// captured off the wire: ApiVersions v3, a brokers-only Metadata v12, then the all-topics
/// Metadata v12, which carries three bytes past its tagged fields (`01 00 00`). Kafka's
/// brokers read the fields and ignore the rest; so must Strata, or every client on a
/// current librdkafka loses its connection on its first all-topics request.
#[test]
fn librdkafka_2_16s_metadata_requests_decode_as_kafkas_brokers_read_them() {
    let hex = |text: &str| -> Bytes {
        (0..text.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
            .collect::<Vec<u8>>()
            .into()
    };
    let api_versions = hex(concat!(
        "0012000300000001000772646b61666b610017636f6e666c75656e742d6b61666b612d707974686f6e",
        "16322e31362e302d72646b61666b612d322e31362e3000"
    ));
    let decoded = decode_request(api_versions).unwrap();
    assert_eq!(decoded.trailing_bytes, 0);
    let KafkaRequest::ApiVersions(request) = decoded.request else {
        panic!("ApiVersions")
    };
    assert_eq!(
        request.client_software_name.as_str(),
        "confluent-kafka-python"
    );

    let brokers_only = hex("0003000c00000002000772646b61666b610001000000");
    let decoded = decode_request(brokers_only).unwrap();
    assert_eq!(decoded.trailing_bytes, 0);
    let KafkaRequest::Metadata(request) = decoded.request else {
        panic!("Metadata")
    };
    assert_eq!(request.topics.map(|topics| topics.len()), Some(0));

    let all_topics = hex("0003000c00000003000772646b61666b610000000000010000");
    let decoded = decode_request(all_topics.clone()).unwrap();
    assert_eq!(
        (decoded.header.api_version, decoded.header.correlation_id),
        (12, 3)
    );
    assert_eq!(decoded.header.client_id, "rdkafka");
    assert_eq!(decoded.trailing_bytes, 3);
    let KafkaRequest::Metadata(request) = decoded.request else {
        panic!("Metadata")
    };
    // A null topic array asks for every topic (Java's broker reads these same values).
    assert!(request.topics.is_none());
    assert!(!request.allow_auto_topic_creation);
    // Still refused: that frame cut anywhere inside its fields.
    for keep in 8..all_topics.len() - 3 {
        assert!(
            matches!(
                decode_request(all_topics.slice(..keep)),
                Err(Rejected::Malformed(_))
            ),
            "cut to {keep} bytes"
        );
    }
}

/// Every API and version the listener advertises reaches a decoder of its own: a request
/// whose body is missing is malformed (or, for APIs with nothing in the body, decodes), never
/// an unserved API and never a panic.
#[test]
fn every_served_api_and_version_has_a_decoder() {
    for (api, min, max) in crate::frame::SUPPORTED {
        for version in min..=max {
            let header = RequestHeader::default()
                .with_request_api_key(api as i16)
                .with_request_api_version(version)
                .with_correlation_id(1);
            let mut out = BytesMut::new();
            header
                .encode(&mut out, api.request_header_version(version))
                .unwrap();
            match decode_request(out.freeze()) {
                Ok(decoded) => assert_eq!(decoded.header.api_key, api),
                Err(Rejected::Malformed(_)) => {}
                Err(rejected) => panic!("{api:?} v{version}: {rejected}"),
            }
        }
    }
}

/// Only versions the decoder knows are advertised: a client that picks one (librdkafka's
/// OffsetForLeaderEpoch v0-1 once) would have its request refused and its connection closed.
#[test]
fn every_advertised_version_is_one_the_protocol_crate_decodes() {
    for (api, min, max) in crate::frame::SUPPORTED {
        let known = api.valid_versions();
        assert!(
            known.min <= min && max <= known.max,
            "{api:?} advertised {min}..={max}, decoded {}..={}",
            known.min,
            known.max
        );
    }
}

/// Counts and lengths come from the peer: a request claiming more elements or bytes than it
/// carries is malformed, without the allocation it asks for (a 14-byte Metadata request once
/// asked for 154 GB and aborted the broker).
#[test]
fn counts_and_lengths_past_the_frame_are_refused_before_allocating() {
    let header = |api: ApiKey, version: i16| {
        let mut out = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(1)
            .encode(&mut out, api.request_header_version(version))
            .unwrap();
        out
    };
    // An array count of 2^31 - 1 (Metadata v1's topics), and a compact one (v9).
    let mut topics = header(ApiKey::Metadata, 1);
    topics.extend_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        decode_request(topics.freeze()),
        Err(Rejected::Malformed(_))
    ));
    let mut compact = header(ApiKey::Metadata, 9);
    compact.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]);
    assert!(matches!(
        decode_request(compact.freeze()),
        Err(Rejected::Malformed(_))
    ));
    // A byte length of 2^31 - 1 (Produce v3's records).
    let mut records = header(ApiKey::Produce, 3);
    records.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
    records.extend_from_slice(&1i16.to_be_bytes()); // acks
    records.extend_from_slice(&1000i32.to_be_bytes()); // timeout
    records.extend_from_slice(&1i32.to_be_bytes()); // one topic
    records.extend_from_slice(&1i16.to_be_bytes());
    records.extend_from_slice(b"t");
    records.extend_from_slice(&1i32.to_be_bytes()); // one partition
    records.extend_from_slice(&0i32.to_be_bytes());
    records.extend_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        decode_request(records.freeze()),
        Err(Rejected::Malformed(_))
    ));
}

mod mangled {
    use proptest::prelude::*;

    use super::*;
    use crate::records::to_store;

    /// A valid request of each served API at each served version (empty bodies as the schema's
    /// defaults encode them), and a produce carrying a real batch.
    fn valid_frames() -> Vec<Bytes> {
        let mut frames = Vec::new();
        for (api, min, max) in crate::frame::SUPPORTED {
            for version in min..=max {
                let mut out = BytesMut::new();
                RequestHeader::default()
                    .with_request_api_key(api as i16)
                    .with_request_api_version(version)
                    .with_correlation_id(7)
                    .encode(&mut out, api.request_header_version(version))
                    .unwrap();
                // An empty body may not decode for every API; the header alone still exercises
                // the version checks, and mutations grow bodies out of it.
                frames.push(out.freeze());
            }
        }
        let produce = ProduceRequest::default().with_acks(1).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(name("t"))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(kafka_records())),
                ]),
        ]);
        for version in 3..=9 {
            frames.push(frame(ApiKey::Produce, version, 1, &produce));
        }
        frames
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever a peer sends (bytes flipped, big counts written anywhere, frames cut
        /// short), decoding and translating return; nothing panics or asks for memory the
        /// frame does not justify (an over-allocation would abort this test process).
        #[test]
        fn mangled_requests_are_refused_or_translated_never_fatal(
            pick in any::<prop::sample::Index>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 0..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let frames = valid_frames();
            let mut frame = BytesMut::from(&pick.get(&frames)[..]);
            for (at, byte, big) in edits {
                if frame.len() < 4 {
                    break;
                }
                let at = at.index(frame.len() - 3);
                if big {
                    frame[at..at + 4].copy_from_slice(&0x7fff_fff0_i32.to_be_bytes());
                } else {
                    frame[at] ^= byte;
                }
            }
            // Cut anywhere past the first 8 bytes (shorter frames are refused up front).
            let keep = cut.index(frame.len() + 1).max(frame.len().min(8));
            let frame = frame.freeze().slice(..keep);
            if let Ok(Decoded {
                request: KafkaRequest::Produce(produce),
                ..
            }) = decode_request(frame)
            {
                let translated = produce_request(produce, |_| None);
                let _ = translated.native.topics.len();
            }
        }

        /// Batches with any byte changed or cut short: taking them for the log, and the log's
        /// check, return an error or a batch.
        #[test]
        fn mangled_batches_are_refused_or_translated_never_fatal(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut batch = BytesMut::from(&kafka_records()[..]);
            for (at, byte) in edits {
                let at = at.index(batch.len());
                batch[at] ^= byte;
            }
            let keep = cut.index(batch.len() + 1);
            let batch = batch.freeze().slice(..keep);
            let _ = strata_wire::batch::check_produced_batch(&batch, true);
            if let Ok(stored) = to_store(BytesMut::from(&batch[..]), Some(strata_wire::batch::kafka::KafkaCodec::Zstd)) {
                let _ = strata_wire::batch::check_produced_batch(&stored, false);
            }
        }
    }
}

mod fetch_chunks {
    use kafka_protocol::messages::fetch_response::{
        FetchableTopicResponse, LeaderIdAndEpoch, NodeEndpoint, PartitionData,
    };
    use kafka_protocol::messages::{BrokerId, FetchResponse};
    use proptest::prelude::*;

    use super::*;
    use crate::frame::{encode_fetch_response, encode_response};

    fn partition() -> impl Strategy<Value = PartitionData> {
        (
            any::<i32>(),
            any::<i16>(),
            any::<i64>(),
            any::<i64>(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
            any::<i32>(),
            prop::option::of((any::<i32>(), any::<i32>())),
        )
            .prop_map(|(index, error, high, start, records, replica, leader)| {
                let mut partition = PartitionData::default()
                    .with_partition_index(index)
                    .with_error_code(error)
                    .with_high_watermark(high)
                    .with_last_stable_offset(high)
                    .with_log_start_offset(start)
                    .with_preferred_read_replica(BrokerId(replica))
                    .with_records(records.map(Bytes::from));
                if let Some((id, epoch)) = leader {
                    partition.current_leader = LeaderIdAndEpoch::default()
                        .with_leader_id(BrokerId(id))
                        .with_leader_epoch(epoch);
                }
                partition
            })
    }

    fn response() -> impl Strategy<Value = FetchResponse> {
        let topic = (
            "[a-z.]{1,20}",
            any::<u128>(),
            prop::collection::vec(partition(), 0..4),
        )
            .prop_map(|(name, id, partitions)| {
                FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_string(name)))
                    .with_topic_id(uuid::Uuid::from_u128(id))
                    .with_partitions(partitions)
            });
        let endpoint = (
            any::<i32>(),
            "[a-z.]{1,20}",
            any::<u16>(),
            prop::option::of("[a-z]{1,8}"),
        )
            .prop_map(|(id, host, port, rack)| {
                NodeEndpoint::default()
                    .with_node_id(BrokerId(id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(i32::from(port))
                    .with_rack(rack.map(StrBytes::from_string))
            });
        (
            any::<i32>(),
            any::<i16>(),
            prop::collection::vec(topic, 0..4),
            prop::collection::vec(endpoint, 0..3),
        )
            .prop_map(|(throttle, error, topics, endpoints)| {
                FetchResponse::default()
                    .with_throttle_time_ms(throttle)
                    .with_error_code(error)
                    .with_responses(topics)
                    .with_node_endpoints(endpoints)
            })
    }

    proptest! {
        /// The chunked Fetch encoder writes exactly what kafka-protocol's encoder writes, at
        /// every served version; it only leaves the records where they are.
        #[test]
        fn the_chunked_fetch_encoding_is_kafka_protocols_byte_for_byte(
            version in 4i16..=18,
            response in response(),
        ) {
            let header = Header {
                api_key: ApiKey::Fetch,
                api_version: version,
                correlation_id: 99,
                client_id: String::new(),
                throttle_ms: 0,
            };
            // Fields a version lacks stay at their defaults (kafka-protocol refuses others).
            let mut response = response;
            if version < 7 {
                response.error_code = 0;
            }
            if version < 16 {
                response.node_endpoints.clear();
            }
            for partition in response.responses.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                if version < 12 {
                    partition.current_leader = Default::default();
                }
                if version < 5 {
                    partition.log_start_offset = -1;
                }
                if version < 11 {
                    partition.preferred_read_replica = BrokerId(-1);
                }
            }
            let whole = encode_response(&header, &response).unwrap();
            let chunks: Vec<u8> = encode_fetch_response(&header, &response).concat();
            prop_assert_eq!(&chunks[..], &whole[..]);

            // The same records from elsewhere (as a file range sent with sendfile): each
            // empty chunk, filled with its source's bytes, gives the same frame.
            let key = |topic: &FetchableTopicResponse, partition: &PartitionData| {
                (topic.topic.0.to_string(), partition.partition_index)
            };
            let mut seen = std::collections::HashMap::new();
            for topic in &response.responses {
                for partition in &topic.partitions {
                    *seen.entry(key(topic, partition)).or_insert(0) += 1;
                }
            }
            let mut elsewhere = Vec::new();
            for topic in &response.responses {
                for partition in &topic.partitions {
                    if let Some(records) = &partition.records
                        && !records.is_empty()
                        && seen[&key(topic, partition)] == 1
                    {
                        let (name, index) = key(topic, partition);
                        elsewhere.push((name, index, native::Elsewhere {
                            len: records.len() as u32,
                            source: std::sync::Arc::new(records.clone()),
                        }));
                    }
                }
            }
            let parts = crate::frame::encode_fetch_parts(&header, &response, elsewhere);
            prop_assert_eq!(&filled(&parts)[..], &whole[..]);
        }
    }
}

/// A frame's parts as the connection writes them: each empty chunk filled with the bytes of
/// its records from elsewhere (here `Bytes`, standing for a file range), each source used once.
fn filled(parts: &native::FrameParts) -> Vec<u8> {
    let mut sources = parts.elsewhere.iter();
    let mut filled = Vec::new();
    for chunk in &parts.chunks {
        if chunk.is_empty() {
            let source = sources.next().expect("a source for each empty chunk");
            filled.extend_from_slice(source.source.downcast_ref::<Bytes>().unwrap());
        } else {
            filled.extend_from_slice(chunk);
        }
    }
    assert!(sources.next().is_none(), "a source without its empty chunk");
    filled
}

/// The chunked ShareFetch encoder writes exactly what kafka-protocol's encoder writes, at
/// versions 1 and 2, with its records in place or from elsewhere.
mod share_fetch_chunks {
    use kafka_protocol::messages::share_fetch_response::{
        AcquiredRecords, LeaderIdAndEpoch, NodeEndpoint, PartitionData, ShareFetchableTopicResponse,
    };
    use kafka_protocol::messages::{BrokerId, ShareFetchResponse};
    use proptest::prelude::*;

    use super::*;
    use crate::frame::{encode_response, encode_share_fetch_parts};

    fn text() -> impl Strategy<Value = Option<StrBytes>> {
        prop::option::of("[a-z ]{0,12}".prop_map(StrBytes::from_string))
    }

    fn partition() -> impl Strategy<Value = PartitionData> {
        (
            (any::<i32>(), any::<i16>(), text(), any::<i16>(), text()),
            (any::<i32>(), any::<i32>()),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
            prop::collection::vec((any::<i64>(), any::<i64>(), any::<i16>()), 0..3),
        )
            .prop_map(
                |(
                    (index, error, message, ack_error, ack_message),
                    (leader, epoch),
                    records,
                    runs,
                )| {
                    PartitionData::default()
                        .with_partition_index(index)
                        .with_error_code(error)
                        .with_error_message(message)
                        .with_acknowledge_error_code(ack_error)
                        .with_acknowledge_error_message(ack_message)
                        .with_current_leader(
                            LeaderIdAndEpoch::default()
                                .with_leader_id(leader)
                                .with_leader_epoch(epoch),
                        )
                        .with_records(records.map(Bytes::from))
                        .with_acquired_records(
                            runs.into_iter()
                                .map(|(first, last, count)| {
                                    AcquiredRecords::default()
                                        .with_first_offset(first)
                                        .with_last_offset(last)
                                        .with_delivery_count(count)
                                })
                                .collect(),
                        )
                },
            )
    }

    fn response() -> impl Strategy<Value = ShareFetchResponse> {
        let topic = (any::<[u8; 16]>(), prop::collection::vec(partition(), 0..4)).prop_map(
            |(id, partitions)| {
                ShareFetchableTopicResponse::default()
                    .with_topic_id(uuid::Uuid::from_bytes(id))
                    .with_partitions(partitions)
            },
        );
        let endpoint = (any::<i32>(), "[a-z.]{1,12}", any::<u16>(), text()).prop_map(
            |(id, host, port, rack)| {
                NodeEndpoint::default()
                    .with_node_id(BrokerId(id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(i32::from(port))
                    .with_rack(rack)
            },
        );
        (
            (any::<i32>(), any::<i16>(), text(), any::<i32>()),
            prop::collection::vec(topic, 0..3),
            prop::collection::vec(endpoint, 0..3),
        )
            .prop_map(|((throttle, error, message, lock), topics, endpoints)| {
                ShareFetchResponse::default()
                    .with_throttle_time_ms(throttle)
                    .with_error_code(error)
                    .with_error_message(message)
                    .with_acquisition_lock_timeout_ms(lock)
                    .with_responses(topics)
                    .with_node_endpoints(endpoints)
            })
    }

    proptest! {
        #[test]
        fn the_chunked_share_fetch_encoding_is_kafka_protocols_byte_for_byte(
            version in 1i16..=2,
            response in response(),
            from_elsewhere in any::<bool>(),
        ) {
            let header = Header {
                api_key: ApiKey::ShareFetch,
                api_version: version,
                correlation_id: 7,
                client_id: String::new(),
                throttle_ms: 0,
            };
            let whole = encode_response(&header, &response).unwrap();
            // Records from elsewhere (a file range sent with sendfile) for partitions named
            // once, each empty chunk filled with its source's bytes.
            let mut seen = std::collections::HashMap::new();
            for topic in &response.responses {
                for partition in &topic.partitions {
                    *seen.entry((topic.topic_id, partition.partition_index)).or_insert(0) += 1;
                }
            }
            let mut elsewhere = Vec::new();
            for topic in response.responses.iter().filter(|_| from_elsewhere) {
                for partition in &topic.partitions {
                    if let Some(records) = &partition.records
                        && !records.is_empty()
                        && seen[&(topic.topic_id, partition.partition_index)] == 1
                    {
                        elsewhere.push((*topic.topic_id.as_bytes(), partition.partition_index, native::Elsewhere {
                            len: records.len() as u32,
                            source: std::sync::Arc::new(records.clone()),
                        }));
                    }
                }
            }
            let parts = encode_share_fetch_parts(&header, &response, elsewhere).unwrap();
            prop_assert_eq!(&filled(&parts)[..], &whole[..]);
        }
    }
}

/// Every response the listener builds encodes at every version it serves: Kafka's schemas
/// refuse a field set to something other than its default in a version without it, and such a
/// refusal would close the client's connection.
/// A ListOffsets answer of one partition, for the encoding checks.
fn listed_offsets() -> ListOffsetsResponse {
    list_offsets_response(
        native::ListOffsetsResponse {
            topics: vec![native::ListOffsetsTopicResponse {
                name: "t".into(),
                partitions: vec![native::ListOffsetsPartitionResponse {
                    partition: 0,
                    error: native::ErrorCode::None,
                    offset: 9,
                    timestamp: 1,
                }],
            }],
        },
        vec![],
        |_, _, _| -1,
    )
}

#[test]
fn translated_responses_encode_at_every_served_version() {
    use kafka_protocol::messages::*;
    let full_partition = native::PartitionMetadata {
        partition: 0,
        error: native::ErrorCode::None,
        leader: 1,
        leader_epoch: 7,
        shard: 0,
        replicas: vec![1, 2],
        isr: vec![1],
    };
    let metadata = metadata_response(
        native::MetadataResponse {
            cluster: "c".into(),
            controller: 1,
            brokers: vec![],
            topics: vec![native::TopicMetadata {
                name: "t".into(),
                error: native::ErrorCode::None,
                partitions: vec![full_partition],
            }],
        },
        &[KafkaBroker {
            node_id: 1,
            host: "h".into(),
            port: 9092,
            rack: Some("r".into()),
        }],
    );
    let produce = produce_response(
        native::ProduceResponse {
            topics: vec![native::ProduceTopicResponse {
                name: "t".into(),
                partitions: vec![native::ProducePartitionResponse {
                    partition: 0,
                    error: native::ErrorCode::None,
                    base_offset: 5,
                    log_start_offset: 3,
                    leader_hint: -1,
                }],
            }],
            record_errors: Default::default(),
            durability: Default::default(),
            log_append_times: Default::default(),
        },
        vec![],
    );
    let listed = listed_offsets();
    let mut failures = Vec::new();
    let mut check = |api: ApiKey, encode: &dyn Fn(i16) -> Result<(), String>| {
        let (_, min, max) = crate::frame::SUPPORTED
            .iter()
            .find(|(key, _, _)| *key == api)
            .copied()
            .unwrap();
        for version in min..=max {
            if let Err(error) = encode(version) {
                failures.push(format!("{api:?} v{version}: {error}"));
            }
        }
    };
    fn at<R: Encodable>(response: &R, api: ApiKey, version: i16) -> Result<(), String> {
        let header = Header {
            api_key: api,
            api_version: version,
            correlation_id: 1,
            client_id: String::new(),
            throttle_ms: 0,
        };
        encode_response(&header, response).map(|_| ())
    }
    check(ApiKey::Metadata, &|v| at(&metadata, ApiKey::Metadata, v));
    check(ApiKey::Produce, &|v| at(&produce, ApiKey::Produce, v));
    check(ApiKey::ListOffsets, &|v| {
        at(&listed, ApiKey::ListOffsets, v)
    });
    check(ApiKey::ApiVersions, &|v| {
        at(&api_versions_response(0), ApiKey::ApiVersions, v)
    });
    // The group answers as `node/src/server/listener/kafka/groups.rs` builds them.
    let text = |value: &str| StrBytes::from_string(value.to_string());
    let joined = JoinGroupResponse::default()
        .with_generation_id(3)
        .with_protocol_type(Some(text("consumer")))
        .with_protocol_name(Some(text("range")))
        .with_leader(text("m-1"))
        .with_member_id(text("m-1"))
        .with_members(vec![
            join_group_response::JoinGroupResponseMember::default()
                .with_member_id(text("m-1"))
                .with_metadata(Bytes::from_static(b"meta")),
        ]);
    check(ApiKey::JoinGroup, &|v| at(&joined, ApiKey::JoinGroup, v));
    let synced = SyncGroupResponse::default().with_assignment(Bytes::from_static(b"a"));
    check(ApiKey::SyncGroup, &|v| at(&synced, ApiKey::SyncGroup, v));
    let found = |v: i16| {
        let coordinator = find_coordinator_response::Coordinator::default()
            .with_key(text("g"))
            .with_node_id(BrokerId(1))
            .with_host(text("h"))
            .with_port(9092);
        if v >= 4 {
            FindCoordinatorResponse::default().with_coordinators(vec![coordinator])
        } else {
            FindCoordinatorResponse::default()
                .with_node_id(coordinator.node_id)
                .with_host(coordinator.host)
                .with_port(coordinator.port)
        }
    };
    check(ApiKey::FindCoordinator, &|v| {
        at(&found(v), ApiKey::FindCoordinator, v)
    });
    let left = |v: i16| {
        if v >= 3 {
            LeaveGroupResponse::default().with_members(vec![
                leave_group_response::MemberResponse::default().with_member_id(text("m-1")),
            ])
        } else {
            LeaveGroupResponse::default()
        }
    };
    check(ApiKey::LeaveGroup, &|v| at(&left(v), ApiKey::LeaveGroup, v));
    let fetched_offsets = OffsetFetchResponse::default().with_topics(vec![
        offset_fetch_response::OffsetFetchResponseTopic::default()
            .with_name(name("t"))
            .with_partitions(vec![
                offset_fetch_response::OffsetFetchResponsePartition::default()
                    .with_committed_offset(4)
                    .with_committed_leader_epoch(-1)
                    .with_metadata(Some(text(""))),
            ]),
    ]);
    check(ApiKey::OffsetFetch, &|v| {
        at(&fetched_offsets, ApiKey::OffsetFetch, v)
    });
    // The administration answers, from `admin`'s builders.
    let created =
        CreateTopicsResponse::default().with_topics(vec![crate::admin::create_topic_result(
            "t",
            Ok((
                native::CreateTopicResponse {
                    error: native::ErrorCode::None,
                    message: String::new(),
                },
                &native::CreateTopicRequest {
                    name: "t".into(),
                    partitions: 3,
                    replication_factor: 1,
                    configs: vec![],
                    replica_assignment: Default::default(),
                },
            )),
        )]);
    check(ApiKey::CreateTopics, &|v| {
        at(&created, ApiKey::CreateTopics, v)
    });
    let described =
        DescribeGroupsResponse::default().with_groups(vec![crate::admin::described_group(
            native::DescribeGroupResponse {
                error: native::ErrorCode::None,
                group: "g".into(),
                generation: 1,
                state: "Stable".into(),
                assignor: "range".into(),
                members: vec![native::GroupMember {
                    member_id: "m".into(),
                    instance_id: None,
                    client_id: "c".into(),
                    generation: 1,
                    assignment: vec![],
                }],
                offsets: vec![],
            },
        )]);
    check(ApiKey::DescribeGroups, &|v| {
        at(&described, ApiKey::DescribeGroups, v)
    });
    let configs = DescribeConfigsResponse::default().with_results(vec![
        crate::admin::describe_configs_result(
            "t",
            native::DescribeTopicConfigResponse {
                error: native::ErrorCode::None,
                configs: vec![native::TopicConfigEntry {
                    key: "retention.ms".into(),
                    value: "1".into(),
                    is_override: true,
                }],
            },
            None,
            |_| crate::admin::SOURCE_DEFAULT,
        ),
    ]);
    check(ApiKey::DescribeConfigs, &|v| {
        at(&configs, ApiKey::DescribeConfigs, v)
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Kafka's special ListOffsets timestamps down to -5 (max timestamp, earliest local, latest
/// tiered) go to the broker; below them (Strata's own -100 among them) they are refused.
#[test]
fn list_offsets_takes_kafkas_specs_and_refuses_others() {
    use kafka_protocol::messages::ListOffsetsRequest;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let partitions = [-1, -2, -3, -4, -5, -6, -100, 1_000]
        .iter()
        .enumerate()
        .map(|(index, timestamp)| {
            ListOffsetsPartition::default()
                .with_partition_index(index as i32)
                .with_timestamp(*timestamp)
        })
        .collect();
    let request = ListOffsetsRequest::default().with_topics(vec![
        ListOffsetsTopic::default()
            .with_name(name("t"))
            .with_partitions(partitions),
    ]);
    let listed = list_offsets_request(&request);
    let sent: Vec<i64> = listed.native.topics[0]
        .partitions
        .iter()
        .map(|partition| partition.timestamp)
        .collect();
    assert_eq!(sent, [-1, -2, -3, -4, -5, 1_000]);
    let refused: Vec<(i32, i16)> = listed
        .refused
        .iter()
        .map(|refused| (refused.partition, refused.error))
        .collect();
    assert_eq!(
        refused,
        [(5, errors::INVALID_REQUEST), (6, errors::INVALID_REQUEST)]
    );
}

/// DescribeShareGroupOffsets 1 (Kafka 4.3) carries each partition's lag after its leader
/// epoch, and 0 does not (the vendored codec is patched for version 1); a request of either
/// decodes, naming its groups (topics null: every share-partition).
#[test]
fn share_group_offsets_carry_the_lag_from_version_1() {
    use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
    use kafka_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
        DescribeShareGroupOffsetsResponseTopic,
    };
    use kafka_protocol::messages::{
        DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, GroupId,
    };
    let response = DescribeShareGroupOffsetsResponse::default().with_groups(vec![
        DescribeShareGroupOffsetsResponseGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(vec![
                DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(name("t"))
                    .with_partitions(vec![
                        DescribeShareGroupOffsetsResponsePartition::default()
                            .with_partition_index(0)
                            .with_start_offset(40)
                            .with_leader_epoch(3)
                            .with_lag(7),
                    ]),
            ]),
    ]);
    let lag_at = |version: i16| {
        let mut body = BytesMut::new();
        response.encode(&mut body, version).unwrap();
        assert_eq!(body.len(), response.compute_size(version).unwrap());
        let decoded =
            DescribeShareGroupOffsetsResponse::decode(&mut body.freeze(), version).unwrap();
        let partition = &decoded.groups[0].topics[0].partitions[0];
        assert_eq!((partition.start_offset, partition.leader_epoch), (40, 3));
        partition.lag
    };
    assert_eq!(lag_at(1), 7);
    assert_eq!(lag_at(0), -1, "version 0 has no lag: unknown");
    let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(None),
    ]);
    for version in 0..=1 {
        let decoded = decode_request(frame(
            ApiKey::DescribeShareGroupOffsets,
            version,
            9,
            &request,
        ))
        .unwrap();
        let KafkaRequest::DescribeShareGroupOffsets(decoded) = decoded.request else {
            panic!("v{version}: {:?}", decoded.request);
        };
        assert_eq!(decoded.groups[0].group_id.as_str(), "g");
        assert!(decoded.groups[0].topics.is_none());
    }
}
