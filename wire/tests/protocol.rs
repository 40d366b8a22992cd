use bytes::{Bytes, BytesMut};
use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_wire::batch::{Batch, BatchBuilder};
use strata_wire::protocol::*;

/// Joins a frame's chunks and strips the length prefix, checking it.
fn body_of(chunks: Vec<Bytes>) -> BytesMut {
    let mut frame = BytesMut::new();
    for chunk in chunks {
        frame.extend_from_slice(&chunk);
    }
    let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(len, frame.len() - 4, "length prefix");
    // A fresh, allocator-aligned buffer, as the broker reads a frame body into.
    let mut body = BytesMut::with_capacity(len);
    body.extend_from_slice(&frame[4..]);
    body
}

fn txn_producer() -> TxnProducer {
    TxnProducer {
        transactional_id: "tx".into(),
        producer_id: 7,
        producer_epoch: 2,
    }
}

fn a_batch(values: &[&str]) -> Bytes {
    let mut builder = BatchBuilder::default();
    for value in values {
        builder.push(1000, Some(b"k"), value.as_bytes());
    }
    builder.finish()
}

fn produce(records: Bytes) -> Request {
    Request::Produce(ProduceRequest {
        acks: ACKS_LEADER,
        timeout_ms: 30_000,
        topics: vec![ProduceTopic {
            name: "orders".into(),
            partitions: vec![
                ProducePartition {
                    partition: 3,
                    records: Records::from(records),
                },
                ProducePartition {
                    partition: 4,
                    records: Records::empty(),
                },
            ],
        }],
        expected_offsets: Appended(vec![NO_EXPECTED_OFFSET, 7]),
        durability: Appended(DURABILITY_SYNCED),
    })
}

#[test]
fn produce_round_trips_with_records_aligned_and_mutable() {
    let batch = a_batch(&["a", "bb", "ccc"]);
    let body = body_of(produce(batch.clone()).encode(77));
    let base = body.as_ptr() as usize;
    let (header, request) = Request::decode(body).unwrap();
    assert_eq!(header.correlation_id, 77);
    assert_eq!(header.api_key, ApiKey::Produce as u16);
    let Request::Produce(request) = request else {
        panic!("not a produce")
    };
    assert_eq!(request.acks, ACKS_LEADER);
    let partition = &request.topics[0].partitions[0];
    assert_eq!(partition.partition, 3);
    let Records::Mutable(records) = &partition.records else {
        panic!("decoded records are mutable, for stamping in place")
    };
    assert_eq!(&records[..], &batch[..]);
    assert_eq!(
        (records.as_ptr() as usize - base) % 8,
        0,
        "records start 8-aligned in the body"
    );
    assert!(request.topics[0].partitions[1].records.is_empty());
    let batch = Batch::validate(partition.records.clone().freeze()).unwrap();
    assert_eq!(batch.record_count(), 3);
}

#[test]
fn every_request_round_trips() {
    let requests = vec![
        Request::ApiVersions(ApiVersionsRequest {}),
        Request::Metadata(MetadataRequest { topics: None }),
        Request::Metadata(MetadataRequest {
            topics: Some(vec!["a".into(), "b".into()]),
        }),
        Request::CreateTopic(CreateTopicRequest {
            name: "t".into(),
            partitions: 8,
            replication_factor: 1,
            configs: vec![ConfigEntry {
                key: "flush".into(),
                value: "always".into(),
            }],
            replica_assignment: Appended(Vec::new()),
        }),
        Request::CreateTopic(CreateTopicRequest {
            name: "placed".into(),
            partitions: 2,
            replication_factor: 2,
            configs: vec![],
            replica_assignment: Appended(vec![vec![1, 2], vec![2, 3]]),
        }),
        Request::DeleteTopic(DeleteTopicRequest { name: "t".into() }),
        produce(a_batch(&["x"])),
        Request::Fetch(FetchRequest {
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 1 << 20,
            topics: vec![FetchTopic {
                name: "t".into(),
                partitions: vec![FetchPartition {
                    partition: 0,
                    fetch_offset: 42,
                    max_bytes: 4096,
                }],
            }],
            read_committed: Appended(true),
        }),
        Request::ListOffsets(ListOffsetsRequest {
            topics: vec![ListOffsetsTopic {
                name: "t".into(),
                partitions: vec![ListOffsetsPartition {
                    partition: 1,
                    timestamp: EARLIEST_TIMESTAMP,
                }],
            }],
            read_committed: Appended(true),
        }),
        Request::InitProducerId(InitProducerIdRequest {
            producer_id: 7,
            producer_epoch: 3,
            transactional: Appended(Some(TransactionalInit {
                transactional_id: "tx".into(),
                timeout_ms: 60_000,
            })),
        }),
        Request::FindCoordinator(FindCoordinatorRequest {
            group: "g".into(),
            transaction: Appended(true),
        }),
        Request::JoinGroup(JoinGroupRequest {
            group: "g".into(),
            member_id: String::new(),
            instance_id: Some("host-1".into()),
            client_id: "c".into(),
            topics: vec!["a".into(), "b".into()],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 300_000,
            assignor: "sticky".into(),
        }),
        Request::Heartbeat(HeartbeatRequest {
            group: "g".into(),
            member_id: "m-1".into(),
            generation: 4,
            owned: vec![TopicPartitions {
                topic: "a".into(),
                partitions: vec![0, 3],
            }],
        }),
        Request::LeaveGroup(LeaveGroupRequest {
            group: "g".into(),
            member_id: "m-1".into(),
        }),
        Request::OffsetCommit(OffsetCommitRequest {
            group: "g".into(),
            member_id: "m-1".into(),
            generation: -1,
            topics: vec![OffsetCommitTopic {
                name: "a".into(),
                partitions: vec![OffsetCommitPartition {
                    partition: 3,
                    offset: 99,
                    metadata: "m".into(),
                }],
            }],
        }),
        Request::OffsetFetch(OffsetFetchRequest {
            group: "g".into(),
            topics: None,
            require_stable: Appended(true),
        }),
        Request::ListGroups(ListGroupsRequest {}),
        Request::DescribeGroup(DescribeGroupRequest { group: "g".into() }),
        Request::CreatePartitions(CreatePartitionsRequest {
            replica_assignment: Appended(vec![vec![4, 5]]),
            topic: "t".into(),
            partitions: 12,
        }),
        Request::AlterTopicConfig(AlterTopicConfigRequest {
            topic: "t".into(),
            set: vec![ConfigEntry {
                key: "retention.ms".into(),
                value: "60000".into(),
            }],
            delete: vec!["flush".into()],
        }),
        Request::DescribeTopicConfig(DescribeTopicConfigRequest { topic: "t".into() }),
        Request::ElectLeaders(ElectLeadersRequest {
            topic: "t".into(),
            partitions: Appended(vec![]),
            unclean: Appended(false),
        }),
        Request::ElectLeaders(ElectLeadersRequest {
            topic: "t".into(),
            partitions: Appended(vec![0, 3]),
            unclean: Appended(true),
        }),
        // An appended field at its default before one that is not: written all the same, so
        // the later one is read where it belongs.
        Request::ElectLeaders(ElectLeadersRequest {
            topic: "t".into(),
            partitions: Appended(vec![]),
            unclean: Appended(true),
        }),
        Request::DeleteGroup(DeleteGroupRequest { group: "g".into() }),
        Request::DeleteRecords(DeleteRecordsRequest {
            topics: vec![DeleteRecordsTopic {
                name: "t".into(),
                partitions: vec![DeleteRecordsPartition {
                    partition: 1,
                    offset: -1,
                }],
            }],
        }),
        Request::DescribeQuotas(DescribeQuotasRequest {
            filter: vec![QuotaFilterPart {
                kind: "user".into(),
                match_type: 0,
                name: Some("alice".into()),
            }],
            strict: true,
        }),
        Request::AlterQuotas(AlterQuotasRequest {
            entries: vec![QuotaAlteration {
                entity: vec![
                    QuotaEntityPart {
                        kind: "user".into(),
                        name: None,
                    },
                    QuotaEntityPart {
                        kind: "client-id".into(),
                        name: Some("app".into()),
                    },
                ],
                changes: vec![QuotaChange {
                    key: "request_percentage".into(),
                    value: 12.5,
                    remove: false,
                }],
            }],
            validate_only: true,
        }),
        Request::DescribeBrokerConfigs(DescribeBrokerConfigsRequest { broker: Some(2) }),
        Request::DescribeBrokerConfigs(DescribeBrokerConfigsRequest { broker: None }),
        Request::AlterBrokerConfigs(AlterBrokerConfigsRequest {
            broker: None,
            set: vec![ConfigEntry {
                key: "log.retention.ms".into(),
                value: "60000".into(),
            }],
            delete: vec!["num.partitions".into()],
            replace: false,
            validate_only: true,
        }),
        Request::DescribeGroupConfigs(DescribeGroupConfigsRequest {
            group: "orders".into(),
        }),
        Request::AlterGroupConfigs(AlterGroupConfigsRequest {
            group: "orders".into(),
            set: vec![
                ConfigEntry {
                    key: "share.auto.offset.reset".into(),
                    value: "earliest".into(),
                },
                ConfigEntry {
                    key: "errors.deadletterqueue.topic.name".into(),
                    value: String::new(),
                },
            ],
            delete: vec!["share.record.lock.duration.ms".into()],
            replace: true,
            validate_only: false,
        }),
        Request::DeleteOffsets(DeleteOffsetsRequest {
            group: "g".into(),
            topics: vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 2],
            }],
        }),
        Request::Authenticate(AuthenticateRequest {
            mechanism: "SCRAM-SHA-512".into(),
            token: "n,,n=alice,r=abc".into(),
        }),
        Request::DescribeUsers(DescribeUsersRequest {
            users: Some(vec!["alice".into()]),
        }),
        Request::AlterUser(AlterUserRequest {
            user: "alice".into(),
            mechanism: "SCRAM-SHA-256".into(),
            delete: false,
            iterations: 4096,
            salt: "c2FsdA==".into(),
            salted_password: "cGFzcw==".into(),
        }),
        Request::DescribeAcls(DescribeAclsRequest {
            filter: acl_entry(),
        }),
        Request::CreateAcls(CreateAclsRequest {
            acls: vec![acl_entry(), acl_entry()],
        }),
        Request::DeleteAcls(DeleteAclsRequest {
            filter: acl_entry(),
        }),
        Request::ReplicaFetch(ReplicaFetchRequest {
            replica_id: 2,
            topic: "t".into(),
            partition: 1,
            leader_epoch: 3,
            fetch_offset: 10,
            last_fetched_epoch: -1,
            log_end: 8,
            max_bytes: 1 << 20,
            max_wait_ms: 500,
            synced_offset: Appended(6),
            log_start: Appended(2),
        }),
        Request::ReassignPartition(ReassignPartitionRequest {
            topic: "t".into(),
            partition: 0,
            replicas: vec![1, 2, 3],
        }),
        Request::AddPartitionsToTxn(AddPartitionsToTxnRequest {
            producer: txn_producer(),
            topics: vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 2],
            }],
        }),
        Request::AddOffsetsToTxn(AddOffsetsToTxnRequest {
            producer: txn_producer(),
            group: "g".into(),
        }),
        Request::EndTxn(EndTxnRequest {
            producer: txn_producer(),
            commit: true,
        }),
        Request::TxnOffsetCommit(TxnOffsetCommitRequest {
            producer: txn_producer(),
            group: "g".into(),
            member_id: "m-1".into(),
            generation: 3,
            topics: vec![OffsetCommitTopic {
                name: "a".into(),
                partitions: vec![OffsetCommitPartition {
                    partition: 1,
                    offset: 7,
                    metadata: String::new(),
                }],
            }],
        }),
        Request::WriteTxnMarkers(WriteTxnMarkersRequest {
            producer_id: 7,
            producer_epoch: 2,
            commit: false,
            coordinator_epoch: 0,
            topics: vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![1],
            }],
            groups: vec!["g".into()],
        }),
        Request::DescribeTransactions(DescribeTransactionsRequest {
            transactional_ids: vec!["tx".into()],
        }),
        Request::ListTransactions(ListTransactionsRequest {
            states: vec!["Ongoing".into()],
            producer_ids: vec![7],
            running_longer_than_ms: Appended(Some(60_000)),
            id_pattern: Appended(Some("orders-.*".into())),
        }),
        Request::ShareGroupHeartbeat(ShareGroupHeartbeatRequest {
            group: "sg".into(),
            member_id: "m-1".into(),
            member_epoch: 0,
            topics: Some(vec!["t".into()]),
            client_id: "c".into(),
        }),
        Request::ShareFetch(ShareFetchRequest {
            group: "sg".into(),
            member_id: "m-1".into(),
            max_wait_ms: 500,
            max_records: 100,
            max_bytes: 1 << 20,
            topics: vec![ShareFetchTopic {
                name: "t".into(),
                partitions: vec![ShareFetchPartition {
                    partition: 2,
                    acquire: true,
                    acknowledgements: vec![AcknowledgementBatch {
                        first_offset: 3,
                        last_offset: 5,
                        types: vec![AckType::Accept, AckType::Gap, AckType::Renew],
                    }],
                }],
            }],
        }),
        Request::ShareAcknowledge(ShareAcknowledgeRequest {
            group: "sg".into(),
            member_id: "m-1".into(),
            topics: vec![ShareAcknowledgeTopic {
                name: "t".into(),
                partitions: vec![ShareAcknowledgePartition {
                    partition: 0,
                    acknowledgements: vec![AcknowledgementBatch {
                        first_offset: 9,
                        last_offset: 9,
                        types: vec![AckType::Reject],
                    }],
                }],
            }],
            release_remaining: true,
        }),
        Request::DescribeShareGroup(DescribeShareGroupRequest { group: "sg".into() }),
        Request::DescribeSharePartitions(DescribeSharePartitionsRequest {
            group: "sg".into(),
            topics: vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 1],
            }],
        }),
    ];
    assert_eq!(
        requests
            .iter()
            .map(|r| r.api_key())
            .collect::<std::collections::HashSet<_>>()
            .len(),
        ApiKey::ALL.len(),
        "every api has a case"
    );
    for (id, request) in requests.into_iter().enumerate() {
        let expected = format!("{request:?}").replace("Shared", "Mutable");
        let (header, decoded) = Request::decode(body_of(request.encode(id as u32))).unwrap();
        assert_eq!(header.correlation_id, id as u32);
        // Records print as bytes either way; compare everything through Debug.
        let got = format!("{decoded:?}");
        assert_eq!(normalise(&got), normalise(&expected));
    }
}

/// Debug output of records differs between Bytes and BytesMut only in type names.
fn normalise(debug: &str) -> String {
    debug.replace("Mutable(", "R(").replace("Shared(", "R(")
}

#[test]
fn fetch_response_round_trips_and_keeps_records_zero_copy_on_encode() {
    let stored = a_batch(&["one", "two"]);
    let response = Response::Fetch(FetchResponse {
        topics: vec![FetchTopicResponse {
            name: "t".into(),
            partitions: vec![FetchPartitionResponse {
                partition: 0,
                error: ErrorCode::None,
                high_watermark: 2,
                log_start_offset: 0,
                leader_hint: -1,
                records: Records::from(stored.clone()),
            }],
        }],
        stability: Appended(vec![PartitionStability {
            topic: "t".into(),
            partition: 0,
            last_stable_offset: 1,
            aborted: vec![AbortedTransaction {
                producer_id: 7,
                first_offset: 0,
            }],
        }]),
    });
    let chunks = response.encode(9);
    assert!(
        chunks.iter().any(|chunk| chunk.as_ptr() == stored.as_ptr()),
        "the stored bytes are sent as their own chunk, not copied"
    );
    let (id, decoded) = Response::decode(ApiKey::Fetch, body_of(chunks)).unwrap();
    assert_eq!(id, 9);
    let Ok(Response::Fetch(fetch)) = decoded else {
        panic!("not a fetch response")
    };
    let records = fetch.topics[0].partitions[0].records.clone().freeze();
    assert_eq!(records, stored);
}

#[test]
fn share_fetch_response_round_trips_with_its_records_and_acquired_runs() {
    let stored = a_batch(&["one", "two", "three"]);
    let response = Response::ShareFetch(ShareFetchResponse {
        acquisition_lock_timeout_ms: 30_000,
        topics: vec![ShareFetchTopicResponse {
            name: "t".into(),
            partitions: vec![
                ShareFetchPartitionResponse {
                    partition: 0,
                    error: ErrorCode::None,
                    acknowledge_error: ErrorCode::InvalidRecordState,
                    acquired: vec![AcquiredRecords {
                        first_offset: 1,
                        last_offset: 2,
                        delivery_count: 2,
                    }],
                    records: Records::from(stored.clone()),
                },
                ShareFetchPartitionResponse {
                    partition: 1,
                    error: ErrorCode::NotLeader,
                    acknowledge_error: ErrorCode::None,
                    acquired: Vec::new(),
                    records: Records::empty(),
                },
            ],
        }],
    });
    let chunks = response.encode(4);
    assert!(
        chunks.iter().any(|chunk| chunk.as_ptr() == stored.as_ptr()),
        "the stored bytes are sent as their own chunk, not copied"
    );
    let (id, decoded) = Response::decode(ApiKey::ShareFetch, body_of(chunks)).unwrap();
    assert_eq!(id, 4);
    let Ok(Response::ShareFetch(fetch)) = decoded else {
        panic!("not a share fetch response")
    };
    let partitions = &fetch.topics[0].partitions;
    assert_eq!(partitions[0].records.clone().freeze(), stored);
    assert_eq!(
        partitions[0].acknowledge_error,
        ErrorCode::InvalidRecordState
    );
    assert_eq!(
        partitions[0].acquired,
        vec![AcquiredRecords {
            first_offset: 1,
            last_offset: 2,
            delivery_count: 2
        }]
    );
    assert_eq!(partitions[1].error, ErrorCode::NotLeader);
    assert!(partitions[1].records.is_empty());
}

#[test]
fn an_unknown_acknowledge_type_is_a_typed_rejection() {
    let request = Request::ShareAcknowledge(ShareAcknowledgeRequest {
        group: "sg".into(),
        member_id: "m".into(),
        topics: vec![ShareAcknowledgeTopic {
            name: "t".into(),
            partitions: vec![ShareAcknowledgePartition {
                partition: 0,
                acknowledgements: vec![AcknowledgementBatch {
                    first_offset: 0,
                    last_offset: 0,
                    types: vec![AckType::Accept],
                }],
            }],
        }],
        release_remaining: false,
    });
    let mut body = body_of(request.encode(1));
    // The one type is the byte before the trailing `release_remaining`.
    let at = body.len() - 2;
    assert_eq!(body[at], AckType::Accept as u8);
    body[at] = 9;
    let rejected = Request::decode(body).unwrap_err();
    assert_eq!(rejected.code, ErrorCode::InvalidRequest);
}

/// Records from elsewhere (a file range the broker sends with `sendfile`): the frame leaves an
/// empty chunk where they go, and with their bytes put there it is byte for byte the frame of
/// the same records held in memory.
#[test]
fn records_from_elsewhere_frame_exactly_as_records_held_in_memory() {
    let first = a_batch(&["one", "two"]);
    let second = a_batch(&["three"]);
    let fetch = |records: [Records; 3]| {
        let [a, b, c] = records;
        let partition = |index, records| FetchPartitionResponse {
            partition: index,
            error: ErrorCode::None,
            high_watermark: 9,
            log_start_offset: 0,
            leader_hint: -1,
            records,
        };
        Response::Fetch(FetchResponse {
            topics: vec![FetchTopicResponse {
                name: "t".into(),
                partitions: vec![partition(0, a), partition(1, b), partition(2, c)],
            }],
            stability: Appended::default(),
        })
    };
    let elsewhere = |bytes: &Bytes| {
        Records::Elsewhere(Elsewhere {
            len: bytes.len() as u32,
            source: std::sync::Arc::new(bytes.clone()),
        })
    };
    let in_memory = fetch([
        Records::from(first.clone()),
        Records::empty(),
        Records::from(second.clone()),
    ])
    .encode(7);
    let parts = fetch([elsewhere(&first), Records::empty(), elsewhere(&second)]).encode_parts(7);
    assert_eq!(parts.elsewhere.len(), 2);
    let mut sources = parts.elsewhere.iter();
    let mut filled = Vec::new();
    for chunk in parts.chunks {
        if chunk.is_empty() {
            let source = sources.next().expect("a source per empty chunk");
            let bytes = source.source.downcast_ref::<Bytes>().unwrap();
            assert_eq!(source.len as usize, bytes.len());
            filled.push(bytes.clone());
        } else {
            filled.push(chunk);
        }
    }
    assert!(sources.next().is_none());
    assert_eq!(body_of(filled), body_of(in_memory));
}

#[test]
fn response_level_errors() {
    let body = body_of(Response::encode_error(5, ErrorCode::UnsupportedVersion));
    assert_eq!(Response::peek_correlation_id(&body), Some(5));
    let (id, result) = Response::decode(ApiKey::Metadata, body).unwrap();
    assert_eq!(
        (id, result.unwrap_err()),
        (5, ErrorCode::UnsupportedVersion)
    );
}

#[test]
fn topic_config_answers_round_trip() {
    let response = Response::DescribeTopicConfig(DescribeTopicConfigResponse {
        error: ErrorCode::None,
        configs: vec![
            TopicConfigEntry {
                key: "flush".into(),
                value: "never".into(),
                is_override: true,
            },
            TopicConfigEntry {
                key: "segment.bytes".into(),
                value: "1073741824".into(),
                is_override: false,
            },
        ],
    });
    let expected = format!("{response:?}");
    let (id, decoded) =
        Response::decode(ApiKey::DescribeTopicConfig, body_of(response.encode(9))).unwrap();
    assert_eq!((id, format!("{:?}", decoded.unwrap())), (9, expected));
}

#[test]
fn group_config_answers_round_trip() {
    let described = Response::DescribeGroupConfigs(DescribeGroupConfigsResponse {
        error: ErrorCode::None,
        message: String::new(),
        entries: vec![
            GroupConfigEntry {
                name: "share.auto.offset.reset".into(),
                value: "earliest".into(),
                set: true,
            },
            GroupConfigEntry {
                name: "share.record.lock.duration.ms".into(),
                value: "30000".into(),
                set: false,
            },
        ],
    });
    let refused = Response::DescribeGroupConfigs(DescribeGroupConfigsResponse {
        error: ErrorCode::InvalidGroupId,
        message: "a group config needs a group name".into(),
        entries: Vec::new(),
    });
    let altered = Response::AlterGroupConfigs(AlterGroupConfigsResponse {
        error: ErrorCode::InvalidConfig,
        message: "share.auto.offset.reset=sideways: expected earliest, latest or by_duration"
            .into(),
    });
    for (id, response) in [described, refused, altered].into_iter().enumerate() {
        let api = response.api_key();
        let expected = format!("{response:?}");
        let (got_id, decoded) = Response::decode(api, body_of(response.encode(id as u32))).unwrap();
        assert_eq!(
            (got_id, format!("{:?}", decoded.unwrap())),
            (id as u32, expected)
        );
    }
}

#[test]
fn unknown_api_and_unsupported_version_are_typed_rejections() {
    let mut body = body_of(Request::ApiVersions(ApiVersionsRequest {}).encode(1));
    body[0] = 99;
    let rejected = Request::decode(body).unwrap_err();
    assert_eq!(rejected.code, ErrorCode::UnknownApi);
    assert_eq!(rejected.header.unwrap().correlation_id, 1);

    let mut body = body_of(Request::ApiVersions(ApiVersionsRequest {}).encode(2));
    body[2] = 7;
    let rejected = Request::decode(body).unwrap_err();
    assert_eq!(rejected.code, ErrorCode::UnsupportedVersion);

    let mut body = body_of(Request::ApiVersions(ApiVersionsRequest {}).encode(3));
    body.extend_from_slice(b"junk");
    assert_eq!(
        Request::decode(body).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
}

#[test]
fn a_lying_array_count_is_rejected_before_allocating() {
    let mut body = BytesMut::new();
    body.extend_from_slice(&(ApiKey::Metadata as u16).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&[1]); // Some(
    body.extend_from_slice(&u32::MAX.to_le_bytes()); // 4 billion topic names
    let rejected = Request::decode(body).unwrap_err();
    assert_eq!(rejected.code, ErrorCode::InvalidRequest);
    assert!(rejected.reason.contains("claims"), "{}", rejected.reason);
}

/// Every prefix of every request, and thousands of random mutations, decode to a value or an
/// error: never a panic.
#[test]
fn decoding_never_panics() {
    let mut rng = StdRng::seed_from_u64(0x70_72_6f_74);
    let frames: Vec<BytesMut> = vec![
        body_of(produce(a_batch(&["a", "b"])).encode(1)),
        body_of(
            Request::CreateTopic(CreateTopicRequest {
                name: "t".into(),
                partitions: 3,
                replication_factor: 1,
                configs: vec![],
                replica_assignment: Appended(vec![vec![1], vec![2], vec![3]]),
            })
            .encode(2),
        ),
        body_of(
            Request::Metadata(MetadataRequest {
                topics: Some(vec!["x".into()]),
            })
            .encode(3),
        ),
    ];
    for frame in &frames {
        for len in 0..frame.len() {
            let _ = Request::decode(BytesMut::from(&frame[..len]));
            for api in ApiKey::ALL {
                let _ = Response::decode(api, BytesMut::from(&frame[..len]));
            }
        }
    }
    for round in 0..20_000 {
        let mut frame = frames[round % frames.len()].to_vec();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..frame.len());
            frame[at] = rng.random();
        }
        let _ = Request::decode(BytesMut::from(&frame[..]));
        let _ = Response::decode(
            ApiKey::ALL[round % ApiKey::ALL.len()],
            BytesMut::from(&frame[..]),
        );
    }
}

/// A reader can decode a ReplicaFetch answer's head alone and learn where its records lie in
/// the body (to read them into a buffer of its choosing), for any prefix that reaches the
/// records field; an error answer has no records; a prefix that stops early is an error.
#[test]
fn a_replica_fetch_head_decodes_alone_and_locates_its_records() {
    for (diverging, values) in [
        (None, vec!["a"]),
        (
            Some(DivergingEpoch {
                epoch: 4,
                end_offset: 99,
            }),
            vec!["bb", "a longer value"],
        ),
        (None, vec![]),
    ] {
        let records = if values.is_empty() {
            Bytes::new()
        } else {
            a_batch(&values)
        };
        let response = Response::ReplicaFetch(ReplicaFetchResponse {
            error: ErrorCode::None,
            high_watermark: 10,
            log_start_offset: 2,
            log_end_offset: 12,
            diverging: diverging.clone(),
            records: Records::from(records.clone()),
        });
        let body = body_of(response.encode(5));
        let full_len = body.len();
        let records_at = full_len - records.len();
        for prefix_len in [records_at, records_at + 1, full_len] {
            let prefix = BytesMut::from(&body[..prefix_len.min(full_len)]);
            let (correlation_id, head, placed) =
                Response::decode_head(ApiKey::ReplicaFetch, prefix).unwrap();
            assert_eq!(correlation_id, 5);
            let Ok(Response::ReplicaFetch(head)) = head else {
                panic!("a ReplicaFetch answer")
            };
            assert_eq!(head.log_end_offset, 12);
            assert_eq!(
                head.diverging.map(|d| d.end_offset),
                diverging.as_ref().map(|d| d.end_offset)
            );
            assert!(head.records.is_empty());
            let (offset, len) = placed.expect("the records field was reached");
            assert_eq!((offset, len), (records_at, records.len()));
            assert_eq!(&body[offset..offset + len], &records[..]);
        }
        let short = BytesMut::from(&body[..20]);
        assert!(Response::decode_head(ApiKey::ReplicaFetch, short).is_err());
    }
    let refused = body_of(Response::encode_error(6, ErrorCode::NotLeader));
    let (_, head, placed) = Response::decode_head(ApiKey::ReplicaFetch, refused).unwrap();
    assert!(matches!(head, Err(ErrorCode::NotLeader)));
    assert_eq!(placed, None);
}

fn acl_entry() -> AclEntry {
    AclEntry {
        resource_type: "Topic".into(),
        resource_name: "orders-".into(),
        pattern_type: "Prefixed".into(),
        principal: "User:alice".into(),
        host: "*".into(),
        operation: "Write".into(),
        permission: "Allow".into(),
    }
}

/// An election's answer carries each partition's result; one without results (as a broker
/// before per-partition elections sent it) still decodes, with none.
#[test]
fn election_results_round_trip_and_are_optional() {
    let result = |partition, error| ElectionResult {
        topic: "t".into(),
        partition,
        error,
        message: String::new(),
    };
    let response = Response::ElectLeaders(ElectLeadersResponse {
        error: ErrorCode::None,
        message: String::new(),
        moved: 1,
        results: Appended(vec![
            result(0, ErrorCode::None),
            result(1, ErrorCode::ElectionNotNeeded),
        ]),
    });
    let (_, decoded) = Response::decode(ApiKey::ElectLeaders, body_of(response.encode(3))).unwrap();
    let Ok(Response::ElectLeaders(decoded)) = decoded else {
        panic!("{decoded:?}");
    };
    assert_eq!(decoded.results.0.len(), 2);
    assert_eq!(decoded.results.0[1].error, ErrorCode::ElectionNotNeeded);
    let bare = Response::ElectLeaders(ElectLeadersResponse {
        results: Appended(vec![]),
        ..decoded
    });
    let (_, decoded) = Response::decode(ApiKey::ElectLeaders, body_of(bare.encode(4))).unwrap();
    let Ok(Response::ElectLeaders(decoded)) = decoded else {
        panic!("{decoded:?}");
    };
    assert!(decoded.results.0.is_empty());
    assert_eq!(decoded.moved, 1);
}

/// A produce answer's durability follows its record errors, written or not; an answer without
/// it (what a client that did not ask gets) is the same bytes as before durability existed.
#[test]
fn produce_durability_round_trips_after_empty_record_errors() {
    let durability = AckDurability {
        replicas: 3,
        synced_replicas: 1,
        leader_synced: true,
        leader_synced_offset: 42,
    };
    let response = |durability: Vec<AckDurability>| {
        Response::Produce(ProduceResponse {
            topics: vec![ProduceTopicResponse {
                name: "t".into(),
                partitions: vec![ProducePartitionResponse {
                    partition: 0,
                    error: ErrorCode::None,
                    base_offset: 41,
                    log_start_offset: 0,
                    leader_hint: -1,
                }],
            }],
            record_errors: Appended(vec![]),
            durability: Appended(durability),
            log_append_times: Appended(vec![1_700_000_000_123]),
        })
    };
    let (_, decoded) = Response::decode(
        ApiKey::Produce,
        body_of(response(vec![durability]).encode(1)),
    )
    .unwrap();
    let Ok(Response::Produce(decoded)) = decoded else {
        panic!("{decoded:?}");
    };
    assert!(decoded.record_errors.0.is_empty());
    assert_eq!(decoded.durability.0, vec![durability]);
    // Unreported: the appended fields are left off entirely.
    let with = body_of(response(vec![durability]).encode(2)).len();
    let without = body_of(response(vec![]).encode(2)).len();
    let record_errors_len = 4;
    assert!(with > without + record_errors_len, "{with} vs {without}");
    let (_, decoded) =
        Response::decode(ApiKey::Produce, body_of(response(vec![]).encode(2))).unwrap();
    let Ok(Response::Produce(decoded)) = decoded else {
        panic!("{decoded:?}");
    };
    assert!(decoded.durability.0.is_empty());
}
