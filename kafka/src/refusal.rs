//! The answer to a request of an API or version the listener does not serve.
//!
//! Kafka answers such a request with UNSUPPORTED_VERSION in that API's own response, so the
//! client's tool fails with a clear error instead of a dropped connection it would retry.
//! Most responses have a top-level error code for it; Produce, whose errors are per
//! partition, gets each partition it named refused. A response with no place for the code at
//! the version asked (one that only reports errors per entity) is not answered: the caller
//! closes the connection, as Kafka does for a request it cannot parse.
//!
//! Produce v0–2 are advertised but refused, as Kafka 4 does (apache/kafka#18727): librdkafka
//! before 2.10 turns gzip and snappy on only when the broker's Produce range starts at 0, and
//! otherwise sends those batches uncompressed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::errors::UNSUPPORTED_VERSION;
use crate::frame::{Header, SIZE_LEN, encode_response};

/// The versions of Produce advertised below the served ones: refused when sent.
pub const PRODUCE_REFUSED_VERSIONS: std::ops::RangeInclusive<i16> = 0..=2;

/// The UNSUPPORTED_VERSION answer (size prefix included) to the request `frame` (after its
/// size prefix) of `api_key` at `api_version`; `None` when its response has no place for the
/// code at that version, or when no answer is due (a produce with acks=0, whose client only
/// notices a closed connection, which Kafka closes for it).
pub fn unsupported_version_answer(
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
    frame: &Bytes,
) -> Option<BytesMut> {
    let api = ApiKey::try_from(api_key).ok()?;
    let header = Header {
        api_key: api,
        api_version,
        correlation_id,
        client_id: String::new(),
        throttle_ms: 0,
    };
    macro_rules! with_error_code {
        ($($key:ident => $response:ident),* $(,)?) => {
            match api {
                ApiKey::Produce => produce_refused(&header, frame),
                $(ApiKey::$key => {
                    let response = $response::default().with_error_code(UNSUPPORTED_VERSION);
                    // Fields a version lacks are dropped silently by some encoders: the code
                    // must survive a round trip at this version to be an answer.
                    let mut body = BytesMut::new();
                    response.encode(&mut body, api_version).ok()?;
                    let decoded = $response::decode(&mut body.freeze(), api_version).ok()?;
                    (decoded.error_code == UNSUPPORTED_VERSION)
                        .then(|| encode_response(&header, &response).ok())
                        .flatten()
                })*
                _ => None,
            }
        };
    }
    with_error_code! {
        Fetch => FetchResponse,
        Metadata => MetadataResponse,
        OffsetFetch => OffsetFetchResponse,
        FindCoordinator => FindCoordinatorResponse,
        JoinGroup => JoinGroupResponse,
        Heartbeat => HeartbeatResponse,
        LeaveGroup => LeaveGroupResponse,
        SyncGroup => SyncGroupResponse,
        ListGroups => ListGroupsResponse,
        SaslHandshake => SaslHandshakeResponse,
        InitProducerId => InitProducerIdResponse,
        AddPartitionsToTxn => AddPartitionsToTxnResponse,
        AddOffsetsToTxn => AddOffsetsToTxnResponse,
        EndTxn => EndTxnResponse,
        DescribeAcls => DescribeAclsResponse,
        SaslAuthenticate => SaslAuthenticateResponse,
        CreateDelegationToken => CreateDelegationTokenResponse,
        RenewDelegationToken => RenewDelegationTokenResponse,
        ExpireDelegationToken => ExpireDelegationTokenResponse,
        DescribeDelegationToken => DescribeDelegationTokenResponse,
        ElectLeaders => ElectLeadersResponse,
        AlterPartitionReassignments => AlterPartitionReassignmentsResponse,
        ListPartitionReassignments => ListPartitionReassignmentsResponse,
        OffsetDelete => OffsetDeleteResponse,
        DescribeClientQuotas => DescribeClientQuotasResponse,
        DescribeUserScramCredentials => DescribeUserScramCredentialsResponse,
        DescribeQuorum => DescribeQuorumResponse,
        UpdateFeatures => UpdateFeaturesResponse,
        DescribeCluster => DescribeClusterResponse,
        DescribeLogDirs => DescribeLogDirsResponse,
        UnregisterBroker => UnregisterBrokerResponse,
        ListTransactions => ListTransactionsResponse,
        ConsumerGroupHeartbeat => ConsumerGroupHeartbeatResponse,
        GetTelemetrySubscriptions => GetTelemetrySubscriptionsResponse,
        PushTelemetry => PushTelemetryResponse,
        ListConfigResources => ListConfigResourcesResponse,
        ShareGroupHeartbeat => ShareGroupHeartbeatResponse,
        ShareFetch => ShareFetchResponse,
        ShareAcknowledge => ShareAcknowledgeResponse,
        AlterShareGroupOffsets => AlterShareGroupOffsetsResponse,
        DeleteShareGroupOffsets => DeleteShareGroupOffsetsResponse,
    }
}

/// A Produce request of a version below the served ones, every partition it names refused.
/// Versions 0–2 are read by hand: `kafka-protocol` follows Kafka 4's schemas, which start at
/// 3. Their request has no transactional id; their answer is a topic list of (partition,
/// error, base offset), with the throttle time after it from v1 and a log-append time per
/// partition from v2.
fn produce_refused(header: &Header, frame: &Bytes) -> Option<BytesMut> {
    if !PRODUCE_REFUSED_VERSIONS.contains(&header.api_version) {
        return None;
    }
    let mut request = frame.clone();
    // api key, version, correlation id, then the client id (a nullable i16 string).
    skip(&mut request, 8)?;
    let client_id_len = get_i16(&mut request)?;
    skip(&mut request, usize::try_from(client_id_len).unwrap_or(0))?;
    let acks = get_i16(&mut request)?;
    skip(&mut request, 4)?; // the timeout
    if acks == 0 {
        return None;
    }
    let mut body = BytesMut::new();
    let topics = get_count(&mut request)?;
    body.put_i32(topics as i32);
    for _ in 0..topics {
        let name_len = usize::try_from(get_i16(&mut request)?).ok()?;
        let name = take(&mut request, name_len)?;
        body.put_i16(name_len as i16);
        body.put_slice(&name);
        let partitions = get_count(&mut request)?;
        body.put_i32(partitions as i32);
        for _ in 0..partitions {
            let index = get_i32(&mut request)?;
            let records = get_i32(&mut request)?;
            skip(&mut request, usize::try_from(records).unwrap_or(0))?;
            body.put_i32(index);
            body.put_i16(UNSUPPORTED_VERSION);
            body.put_i64(-1); // base offset
            if header.api_version >= 2 {
                body.put_i64(-1); // log-append time
            }
        }
    }
    if header.api_version >= 1 {
        body.put_i32(0); // throttle time
    }
    let mut out = BytesMut::with_capacity(SIZE_LEN + 4 + body.len());
    out.put_i32(4 + body.len() as i32);
    out.put_i32(header.correlation_id);
    out.put_slice(&body);
    Some(out)
}

fn skip(buf: &mut Bytes, len: usize) -> Option<()> {
    (buf.remaining() >= len).then(|| buf.advance(len))
}

fn take(buf: &mut Bytes, len: usize) -> Option<Bytes> {
    (buf.remaining() >= len).then(|| buf.split_to(len))
}

fn get_i16(buf: &mut Bytes) -> Option<i16> {
    (buf.remaining() >= 2).then(|| buf.get_i16())
}

fn get_i32(buf: &mut Bytes) -> Option<i32> {
    (buf.remaining() >= 4).then(|| buf.get_i32())
}

/// An array's length, held to what the rest of the request could hold (each element takes
/// at least 4 bytes), so a forged count cannot make the answer large.
fn get_count(buf: &mut Bytes) -> Option<usize> {
    let count = usize::try_from(get_i32(buf)?).ok()?;
    (count <= buf.remaining() / 4).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::HeaderVersion;

    fn request_prefix(api: ApiKey, version: i16) -> BytesMut {
        let mut frame = BytesMut::new();
        frame.put_i16(api as i16);
        frame.put_i16(version);
        frame.put_i32(7);
        frame
    }

    #[test]
    fn an_unserved_api_gets_its_response_with_unsupported_version() {
        let frame = request_prefix(ApiKey::DescribeCluster, 0).freeze();
        let mut answer = unsupported_version_answer(ApiKey::DescribeCluster as i16, 0, 7, &frame)
            .expect("DescribeCluster has a top-level error code")
            .freeze();
        let size = answer.get_i32() as usize;
        assert_eq!(size, answer.len());
        let header =
            ResponseHeader::decode(&mut answer, DescribeClusterResponse::header_version(0))
                .unwrap();
        assert_eq!(header.correlation_id, 7);
        let response = DescribeClusterResponse::decode(&mut answer, 0).unwrap();
        assert_eq!(response.error_code, UNSUPPORTED_VERSION);
        assert!(!answer.has_remaining());
    }

    #[test]
    fn a_response_without_a_place_for_the_code_is_not_answered() {
        // DescribeLogDirs has its top-level error code from v3; TxnOffsetCommit has none.
        let frame = request_prefix(ApiKey::DescribeLogDirs, 1).freeze();
        assert!(unsupported_version_answer(ApiKey::DescribeLogDirs as i16, 1, 7, &frame).is_none());
        assert!(unsupported_version_answer(ApiKey::TxnOffsetCommit as i16, 3, 7, &frame).is_none());
        assert!(unsupported_version_answer(999, 0, 7, &frame).is_none());
    }

    fn produce_v2(acks: i16, topics: &[(&str, &[i32])]) -> Bytes {
        let mut frame = request_prefix(ApiKey::Produce, 2);
        frame.put_i16(5);
        frame.put_slice(b"kcat1");
        frame.put_i16(acks);
        frame.put_i32(1000);
        frame.put_i32(topics.len() as i32);
        for (name, partitions) in topics {
            frame.put_i16(name.len() as i16);
            frame.put_slice(name.as_bytes());
            frame.put_i32(partitions.len() as i32);
            for partition in *partitions {
                frame.put_i32(*partition);
                frame.put_i32(3);
                frame.put_slice(b"abc");
            }
        }
        frame.freeze()
    }

    #[test]
    fn an_old_produce_has_every_partition_refused() {
        let frame = produce_v2(1, &[("a", &[0, 2]), ("bb", &[1])]);
        let mut answer = unsupported_version_answer(ApiKey::Produce as i16, 2, 7, &frame)
            .unwrap()
            .freeze();
        assert_eq!(answer.get_i32() as usize, answer.len());
        assert_eq!(answer.get_i32(), 7);
        assert_eq!(answer.get_i32(), 2);
        for (name, partitions) in [("a", vec![0, 2]), ("bb", vec![1])] {
            let len = answer.get_i16() as usize;
            assert_eq!(&answer.split_to(len)[..], name.as_bytes());
            assert_eq!(answer.get_i32(), partitions.len() as i32);
            for partition in partitions {
                assert_eq!(answer.get_i32(), partition);
                assert_eq!(answer.get_i16(), UNSUPPORTED_VERSION);
                assert_eq!(answer.get_i64(), -1);
                assert_eq!(answer.get_i64(), -1);
            }
        }
        assert_eq!(answer.get_i32(), 0, "throttle time");
        assert!(!answer.has_remaining());
    }

    #[test]
    fn an_old_produce_that_wants_no_answer_or_is_cut_short_gets_none() {
        let frame = produce_v2(0, &[("a", &[0])]);
        assert!(unsupported_version_answer(ApiKey::Produce as i16, 2, 7, &frame).is_none());
        let whole = produce_v2(1, &[("a", &[0])]);
        for cut in 0..whole.len() {
            let short = whole.slice(..cut);
            assert!(unsupported_version_answer(ApiKey::Produce as i16, 2, 7, &short).is_none());
        }
        // A served version is not refused here.
        assert!(unsupported_version_answer(ApiKey::Produce as i16, 3, 7, &whole).is_none());
    }

    /// Every API at every version its schema has: either no answer, or a whole frame whose
    /// response carries UNSUPPORTED_VERSION (checked by the round trip the answer makes).
    #[test]
    fn every_answer_is_a_whole_frame() {
        let mut answered = 0;
        for api_key in 0..100 {
            let Ok(api) = ApiKey::try_from(api_key) else {
                continue;
            };
            let versions = api.valid_versions();
            for version in versions.min..=versions.max {
                let frame = request_prefix(api, version).freeze();
                if let Some(answer) = unsupported_version_answer(api_key, version, 7, &frame) {
                    let size = i32::from_be_bytes(answer[..4].try_into().unwrap());
                    assert_eq!(size as usize + SIZE_LEN, answer.len(), "{api:?} v{version}");
                    answered += 1;
                }
            }
        }
        assert!(answered > 100, "{answered} API versions answered");
    }

    proptest::proptest! {
        /// Whatever bytes follow a request's prefix, the refusal neither panics nor answers
        /// with more than the request could name.
        #[test]
        fn arbitrary_requests_never_panic(
            api_key in 0i16..100,
            version in -1i16..20,
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let mut frame = BytesMut::new();
            frame.put_i16(api_key);
            frame.put_i16(version);
            frame.put_i32(7);
            frame.extend_from_slice(&body);
            let frame = frame.freeze();
            if let Some(answer) = unsupported_version_answer(api_key, version, 7, &frame) {
                proptest::prop_assert!(answer.len() < 512 + 4 * frame.len());
            }
        }
    }
}
