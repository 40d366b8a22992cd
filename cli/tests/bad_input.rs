//! Bad input against a running node: each gets a typed error or a closed connection with a
//! logged reason, and the node keeps serving everyone else, losing nothing.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_client::{Client, ClientConfig, ErrorCode, Producer, ProducerConfig, ProducerRecord};
use strata_wire::batch::{BatchBuilder, Codec};
use strata_wire::protocol::{
    ApiKey, ApiVersionsRequest, MetadataRequest, ProducePartition, ProduceRequest, ProduceTopic,
    Records, Request, Response,
};
use support::{TestNode, runtime};

fn raw(node: &TestNode) -> TcpStream {
    let stream = TcpStream::connect(node.bootstrap()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

fn send_frame(stream: &mut TcpStream, body: &[u8]) {
    stream
        .write_all(&(body.len() as u32).to_le_bytes())
        .unwrap();
    stream.write_all(body).unwrap();
}

fn send_chunks(stream: &mut TcpStream, chunks: Vec<Bytes>) {
    for chunk in chunks {
        stream.write_all(&chunk).unwrap();
    }
}

/// Reads one response frame; `None` if the broker closed the connection.
fn read_response(
    stream: &mut TcpStream,
    api: ApiKey,
) -> Option<(u32, Result<Response, ErrorCode>)> {
    let mut prefix = [0u8; 4];
    if stream.read_exact(&mut prefix).is_err() {
        return None;
    }
    let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
    stream.read_exact(&mut body).ok()?;
    Some(Response::decode(api, BytesMut::from(&body[..])).expect("a well-formed response"))
}

fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
}

fn request_body(request: Request, correlation_id: u32) -> Vec<u8> {
    let mut frame = Vec::new();
    for chunk in request.encode(correlation_id) {
        frame.extend_from_slice(&chunk);
    }
    frame[4..].to_vec()
}

/// Produces `first` to partition 0 and `second` to partition 1 of topic `t` in one request and
/// returns each partition's error code.
fn produce_to_both_partitions(
    stream: &mut TcpStream,
    correlation_id: u32,
    first: Bytes,
    second: Bytes,
) -> Vec<ErrorCode> {
    let produce = Request::Produce(ProduceRequest {
        acks: 1,
        timeout_ms: 1000,
        topics: vec![ProduceTopic {
            name: "t".into(),
            partitions: vec![
                ProducePartition {
                    partition: 0,
                    records: Records::from(first),
                },
                ProducePartition {
                    partition: 1,
                    records: Records::from(second),
                },
            ],
        }],
        expected_offsets: Default::default(),
        durability: Default::default(),
    });
    send_chunks(stream, produce.encode(correlation_id));
    let (_, result) = read_response(stream, ApiKey::Produce).unwrap();
    let Ok(Response::Produce(response)) = result else {
        panic!("produce response expected")
    };
    response.topics[0]
        .partitions
        .iter()
        .map(|p| p.error)
        .collect()
}

#[test]
fn bad_input_gets_typed_errors_and_the_node_keeps_serving() {
    let temp = tempfile::tempdir().unwrap();
    let node = TestNode::start_with(temp.path(), 2, &["--max-frame-bytes", "1048576"]);
    node.cli(&["topic", "create", "t", "--partitions", "2"], None);

    // A client that connects and sends nothing stays connected while others work.
    let _idle = raw(&node);
    // One that sends half a frame and stalls.
    let mut stalled = raw(&node);
    stalled.write_all(&100u32.to_le_bytes()).unwrap();
    stalled.write_all(&[1, 2, 3]).unwrap();

    // Unknown api: a typed error, and the connection stays usable.
    let mut stream = raw(&node);
    let mut body = request_body(Request::ApiVersions(ApiVersionsRequest {}), 11);
    body[0] = 200;
    send_frame(&mut stream, &body);
    let (id, result) = read_response(&mut stream, ApiKey::ApiVersions).unwrap();
    assert_eq!((id, result.unwrap_err()), (11, ErrorCode::UnknownApi));
    // Unsupported version.
    let mut body = request_body(Request::ApiVersions(ApiVersionsRequest {}), 12);
    body[2] = 9;
    send_frame(&mut stream, &body);
    let (id, result) = read_response(&mut stream, ApiKey::ApiVersions).unwrap();
    assert_eq!(
        (id, result.unwrap_err()),
        (12, ErrorCode::UnsupportedVersion)
    );
    // A malformed message body (trailing garbage) after a valid header.
    let mut body = request_body(Request::Metadata(MetadataRequest { topics: None }), 13);
    body.extend_from_slice(&[0xde, 0xad]);
    send_frame(&mut stream, &body);
    let (id, result) = read_response(&mut stream, ApiKey::Metadata).unwrap();
    assert_eq!((id, result.unwrap_err()), (13, ErrorCode::InvalidRequest));
    // Still usable: a good request on the same connection.
    send_chunks(
        &mut stream,
        Request::ApiVersions(ApiVersionsRequest {}).encode(14),
    );
    let (id, result) = read_response(&mut stream, ApiKey::ApiVersions).unwrap();
    assert_eq!(id, 14);
    assert!(result.is_ok());

    // A corrupt batch: that partition gets CORRUPT_BATCH, the other partition's batch is written.
    let good = {
        let mut builder = BatchBuilder::default();
        builder.push(1, None, b"good");
        builder.finish()
    };
    let mut bad = good.to_vec();
    let last = bad.len() - 12;
    bad[last] ^= 0xff;
    assert_eq!(
        produce_to_both_partitions(&mut stream, 15, Bytes::from(bad), good),
        vec![ErrorCode::CorruptBatch, ErrorCode::None]
    );

    // A compressed batch whose stream is garbage under a correct CRC (a producer's codec bug):
    // the broker decompresses to check it, so no consumer is ever handed it. A good zstd batch
    // beside it is written.
    let compressed = |codec, value: &[u8]| {
        let mut builder = BatchBuilder::default();
        builder.set_codec(codec);
        for _ in 0..50 {
            builder.push(1, None, value);
        }
        builder.finish()
    };
    let mut garbled = compressed(Codec::Lz4, b"compressible compressible").to_vec();
    let body_len = u32::from_le_bytes(garbled[20..24].try_into().unwrap()) as usize;
    garbled[64 + 4..64 + body_len].fill(0x55);
    let crc = strata_wire::crc32c(&garbled[16..64 + body_len]);
    garbled[12..16].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        produce_to_both_partitions(
            &mut stream,
            16,
            Bytes::from(garbled),
            compressed(Codec::Zstd, b"fine fine fine"),
        ),
        vec![ErrorCode::CorruptBatch, ErrorCode::None]
    );

    // A frame shorter than a request header: the connection is closed.
    let mut tiny = raw(&node);
    send_frame(&mut tiny, &[1, 2, 3]);
    assert!(closed(&mut tiny));

    // An oversized frame: MESSAGE_TOO_LARGE, then the connection is closed; no allocation of
    // the claimed size happens (the node would not survive 4 GiB per attempt).
    for _ in 0..20 {
        let mut huge = raw(&node);
        huge.write_all(&u32::MAX.to_le_bytes()).unwrap();
        huge.write_all(&request_body(Request::ApiVersions(ApiVersionsRequest {}), 16)[..8])
            .unwrap();
        let (id, result) = read_response(&mut huge, ApiKey::ApiVersions).unwrap();
        assert_eq!((id, result.unwrap_err()), (16, ErrorCode::MessageTooLarge));
        assert!(closed(&mut huge));
    }
    // The limit is the configured one: 2 MiB is over this node's --max-frame-bytes.
    let mut over = raw(&node);
    over.write_all(&(2u32 << 20).to_le_bytes()).unwrap();
    over.write_all(&request_body(Request::ApiVersions(ApiVersionsRequest {}), 17)[..8])
        .unwrap();
    let (id, result) = read_response(&mut over, ApiKey::ApiVersions).unwrap();
    assert_eq!((id, result.unwrap_err()), (17, ErrorCode::MessageTooLarge));
    assert!(closed(&mut over));

    // Random garbage frames on many connections.
    for seed in 0..50u8 {
        let mut garbage = raw(&node);
        let body: Vec<u8> = (0..64).map(|i| i ^ seed.wrapping_mul(31)).collect();
        send_frame(&mut garbage, &body);
        let _ = read_response(&mut garbage, ApiKey::ApiVersions);
    }

    // Everything else still works, and nothing was lost: the good batches are there (one
    // record, then the zstd batch's 50).
    let runtime = runtime();
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(node.bootstrap()))
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default());
        let metadata = producer
            .send(ProducerRecord::new("t", None, "after"))
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(metadata.offset >= 0);
        assert_eq!(
            client.list_offset("t", 1, -1).await.unwrap(),
            Some(51 + u64::from(metadata.partition == 1))
        );
    });
}

/// The replication port (QUIC) takes bad input too: garbage, a truncated frame, a client api
/// and a fetch from a broker that is not a replica each get their stream closed or a typed
/// refusal; the node keeps serving.
#[test]
fn bad_input_on_the_replication_port_closes_that_stream_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 1);
    node.cli(&["topic", "create", "quic-bad", "--partitions", "1"], None);
    let replication: std::net::SocketAddr = format!("127.0.0.1:{}", node.port + 1).parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let peer = strata_node::server::quic::QuicPeer::bind("127.0.0.1:0".parse().unwrap(), None)
            .unwrap();
        let connection = peer
            .endpoint()
            .connect_with(peer.client_config().clone(), replication, "strata-node")
            .unwrap()
            .await
            .expect("the node accepts QUIC connections");
        let exchange = |bytes: Vec<u8>| {
            let connection = connection.clone();
            async move {
                let (mut send, mut receive) = connection.open_bi().await.unwrap();
                send.write_all(&bytes).await.unwrap();
                send.finish().unwrap();
                receive.read_to_end(1 << 20).await
            }
        };
        // Garbage, and a frame whose length prefix lies: the stream is reset, not answered.
        assert!(exchange(b"not a frame at all".to_vec()).await.is_err());
        assert!(exchange(vec![200, 0, 0, 0, 1, 2, 3]).await.is_err());
        // A client api on the replication port: refused the same way.
        let metadata = Request::Metadata(strata_wire::protocol::MetadataRequest { topics: None });
        let frame: Vec<u8> = metadata.encode(1).concat();
        assert!(exchange(frame).await.is_err());
        // Well-formed fetches get typed refusals: (log end, correlation id) → error.
        let refusal = |(log_end, synced): (u64, u64), correlation_id: u32| {
            let fetch = Request::ReplicaFetch(strata_wire::protocol::ReplicaFetchRequest {
                replica_id: 42,
                topic: "quic-bad".into(),
                partition: 0,
                leader_epoch: 0,
                fetch_offset: 0,
                last_fetched_epoch: -1,
                log_end,
                max_bytes: 1 << 20,
                max_wait_ms: 0,
                synced_offset: strata_wire::protocol::Appended(synced),
                log_start: strata_wire::protocol::Appended(0),
            });
            let answer = exchange(fetch.encode(correlation_id).concat());
            async move {
                let answer = answer.await.expect("an answer");
                let body = BytesMut::from(&answer[4..]);
                match Response::decode(ApiKey::ReplicaFetch, body).unwrap() {
                    (id, Ok(Response::ReplicaFetch(response))) if id == correlation_id => {
                        response.error
                    }
                    other => panic!("unexpected answer {other:?}"),
                }
            }
        };
        // From a broker that is not a replica.
        assert_eq!(refusal((0, 0), 2).await, ErrorCode::NotReplica);
        // From a follower claiming to hold more than it fetched, or to have synced more than
        // it holds: nothing counted.
        assert_eq!(refusal((5, 0), 3).await, ErrorCode::InvalidRequest);
        assert_eq!(refusal((0, 3), 4).await, ErrorCode::InvalidRequest);
    });
    // And the node still serves clients.
    let printed = node.cli(
        &["produce", "quic-bad", "--print-offsets"],
        Some(b"still here\n"),
    );
    assert_eq!(printed.trim(), "0 0");
}

/// A handler that panics (a bug; here the fault hook) costs its own request, answered at once
/// as INTERNAL, instead of an answer that never comes; the node goes on serving.
#[test]
fn a_request_whose_handler_panics_is_answered_internal() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start_with_env(
        dir.path(),
        1,
        &[],
        &[("STRATA_FAULT_PRODUCE_RESPONSE", "panic:2")],
    );
    node.cli(&["topic", "create", "bug", "--partitions", "1"], None);
    runtime().block_on(async {
        let mut config = ClientConfig::new(node.bootstrap());
        config.request_timeout = Duration::from_secs(20);
        let client = Client::connect(config).await.unwrap();
        let producer = Producer::new(
            client,
            ProducerConfig {
                retries: 0,
                ..ProducerConfig::default()
            },
        );
        let mut outcomes = Vec::new();
        for i in 0..3 {
            let started = std::time::Instant::now();
            let ack = producer
                .send(ProducerRecord::new("bug", None, format!("record {i}")))
                .await
                .unwrap();
            outcomes.push((ack.await.map(|ack| ack.offset), started.elapsed()));
        }
        assert_eq!(outcomes[0].0.as_ref().ok(), Some(&0));
        let (failed, waited) = &outcomes[1];
        assert_eq!(
            failed.as_ref().err().and_then(|error| error.code()),
            Some(ErrorCode::Internal),
            "{outcomes:?}"
        );
        assert!(
            *waited < Duration::from_secs(5),
            "answered after {waited:?}"
        );
        // The panicking handler had appended its record: the next one lands after it.
        assert_eq!(outcomes[2].0.as_ref().ok(), Some(&2));
    });
}
