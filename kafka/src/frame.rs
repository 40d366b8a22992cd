//! Kafka request and response frames: a big-endian `i32` size, a header, a body.
//!
//! The header's own version depends on the API and its version (flexible versions add tagged
//! fields), and so does the body's layout; `kafka-protocol` knows both for every message. This
//! module decides which APIs and versions the listener serves, decodes requests of those, and
//! encodes responses.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, AlterClientQuotasRequest,
    AlterConfigsRequest, AlterPartitionReassignmentsRequest, AlterShareGroupOffsetsRequest,
    AlterUserScramCredentialsRequest, ApiKey, ApiVersionsRequest, ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest, CreateAclsRequest, CreatePartitionsRequest, CreateTopicsRequest,
    DeleteAclsRequest, DeleteGroupsRequest, DeleteRecordsRequest, DeleteShareGroupOffsetsRequest,
    DeleteTopicsRequest, DescribeAclsRequest, DescribeClientQuotasRequest, DescribeClusterRequest,
    DescribeConfigsRequest, DescribeGroupsRequest, DescribeLogDirsRequest,
    DescribeProducersRequest, DescribeShareGroupOffsetsRequest, DescribeTopicPartitionsRequest,
    DescribeTransactionsRequest, DescribeUserScramCredentialsRequest, ElectLeadersRequest,
    EndTxnRequest, FetchRequest, FetchResponse, FindCoordinatorRequest, HeartbeatRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListOffsetsRequest, ListPartitionReassignmentsRequest,
    ListTransactionsRequest, MetadataRequest, OffsetCommitRequest, OffsetDeleteRequest,
    OffsetFetchRequest, OffsetForLeaderEpochRequest, ProduceRequest, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslHandshakeRequest, ShareAcknowledgeRequest, ShareFetchRequest,
    ShareFetchResponse, ShareGroupDescribeRequest, ShareGroupHeartbeatRequest, SyncGroupRequest,
    TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use strata_wire::protocol::FrameParts;

/// Kafka's frame size prefix.
pub const SIZE_LEN: usize = 4;

/// api key, api version and correlation id: what every request header starts with.
const HEADER_PREFIX_LEN: usize = 8;

/// The APIs served and their version ranges. Ceilings stop before versions that need what
/// Strata does not keep: Produce 13 addresses topics by id, OffsetFetch 8 and JoinGroup 8
/// bring batching and fields of newer group protocols.
pub const SUPPORTED: [(ApiKey, i16, i16); 56] = [
    // 10 and 11 add KIP-951's leader hints and KIP-890's TRANSACTION_ABORTABLE; 12 is for
    // transactions v2 (not finalized here, so no client sends it inside a transaction).
    (ApiKey::Produce, 3, 11),
    // 13 asks topics by id (UNKNOWN_TOPIC_ID for an id no topic has); 15 to 18 add what only
    // followers and KRaft voters send. 16's leader hints (KIP-951) are optional tagged fields.
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    // 5 adds TRANSACTION_ABORTABLE to the errors, 6 the share-partition key type (KIP-932).
    (ApiKey::FindCoordinator, 0, 6),
    // JoinGroup 8 and LeaveGroup 5 carry the client's reason (KIP-800, logged), JoinGroup 9
    // lets a static leader skip the assignment (KIP-814: never asked here).
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    // 6 answers a group it finds nothing of GROUP_ID_NOT_FOUND (KIP-1043).
    (ApiKey::DescribeGroups, 0, 6),
    // 5 filters by group type (classic, consumer, share) and answers each group's.
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    // 3 and 4 carry the supported and finalized features (4 allows a supported minimum of 0).
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    // 0 and 1 predate flexible versions and the client's epoch; no current client sends them.
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932) as Kafka 4.1 made them: version 0 was its early access. ShareFetch
    // and ShareAcknowledge 2 (Kafka 4.2) add KIP-1222's lock renewal and KIP-1206's acquire
    // mode.
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 2),
    (ApiKey::ShareAcknowledge, 1, 2),
    // Their offsets (the share-partitions' start offsets): DescribeShareGroupOffsets 1 adds the
    // lag (Kafka 4.3).
    (ApiKey::DescribeShareGroupOffsets, 0, 1),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
    // Transactions as KIP-98 has them: AddPartitionsToTxn 4 and later are the brokers' own
    // (KIP-890 verification), the fourth versions of the others add KIP-890's errors.
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    // 1 filters by how long transactions have run, 2 by a pattern of ids (KIP-1152).
    (ApiKey::ListTransactions, 0, 2),
];

/// What every request carries ahead of its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub api_key: ApiKey,
    pub api_version: i16,
    pub correlation_id: i32,
    /// The client's `client.id` (empty when it sent none).
    pub client_id: String,
    /// The `throttle_time_ms` the answer reports: 0 as decoded; the listener sets it from the
    /// client's quotas (see [`Throttled`]).
    pub throttle_ms: i32,
}

/// A request decoded from its frame.
#[derive(Debug)]
pub struct Decoded {
    pub header: Header,
    pub request: KafkaRequest,
    /// Bytes the frame held after the request's last field. Kafka's brokers read the fields
    /// they know and ignore the rest, and clients rely on it: librdkafka 2.1 and later send
    /// an all-topics Metadata v12 with three bytes past its end. Counted, never read.
    pub trailing_bytes: usize,
}

/// A Produce request with its partitions' records detached from the frame: one buffer per
/// partition, in the request's order (`None` where a partition has no records), each the only
/// owner of its bytes, so the log stamps offsets into them in place with no copy. The
/// request's own `records` fields are emptied.
#[derive(Debug)]
pub struct Produced {
    pub request: ProduceRequest,
    pub records: Vec<Option<BytesMut>>,
}

impl Produced {
    /// The record bytes the request carries: what its byte-rate quota counts, whatever
    /// becomes of them (counted as the request is read).
    pub fn records_len(&self) -> usize {
        self.records.iter().flatten().map(BytesMut::len).sum()
    }

    /// Detaches `request`'s records from `whole`, the frame they were decoded from: where
    /// nothing else holds the frame, it becomes mutable again and is split among the
    /// partitions without a copy; otherwise each partition's records are copied out.
    fn detach(mut request: ProduceRequest, whole: Bytes) -> Produced {
        let start = whole.as_ptr() as usize;
        let mut ranges = Vec::new();
        let mut sent = Vec::new();
        // Records lie in the frame in decoding order, apart: where one does not (a decoder
        // that copied), every partition's records are copied out, never split at a guess.
        let (mut end, mut in_place) = (0, true);
        for topic in &mut request.topic_data {
            // The names are slices of the frame too: owned, they let it go.
            topic.name.0 = StrBytes::from_string(topic.name.0.to_string());
            for partition in &mut topic.partition_data {
                let records = partition.records.take();
                let range = records.as_ref().map(|records| {
                    (
                        (records.as_ptr() as usize).wrapping_sub(start),
                        records.len(),
                    )
                });
                if let Some((at, len)) = range {
                    in_place &= at >= end && at.saturating_add(len) <= whole.len();
                    end = at.saturating_add(len);
                }
                ranges.push(range);
                sent.push(records);
            }
        }
        if let Some(id) = &mut request.transactional_id {
            id.0 = StrBytes::from_string(id.0.to_string());
        }
        let copied = |sent: Vec<Option<Bytes>>| {
            sent.into_iter()
                .map(|records| records.map(|records| BytesMut::from(&records[..])))
                .collect()
        };
        if !in_place {
            return Produced {
                request,
                records: copied(sent),
            };
        }
        drop(sent);
        let records = match whole.try_into_mut() {
            Ok(mut frame) => {
                let mut consumed = 0;
                ranges
                    .into_iter()
                    .map(|range| {
                        let (at, len) = range?;
                        let _ = frame.split_to(at - consumed);
                        consumed = at + len;
                        Some(frame.split_to(len))
                    })
                    .collect()
            }
            Err(shared) => ranges
                .into_iter()
                .map(|range| range.map(|(at, len)| BytesMut::from(&shared[at..at + len])))
                .collect(),
        };
        Produced { request, records }
    }
}

/// A decoded request of a served API.
#[derive(Debug)]
pub enum KafkaRequest {
    ApiVersions(ApiVersionsRequest),
    Metadata(MetadataRequest),
    Produce(Produced),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    InitProducerId(InitProducerIdRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    DescribeGroups(DescribeGroupsRequest),
    ListGroups(ListGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    AlterConfigs(AlterConfigsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    SaslHandshake(SaslHandshakeRequest),
    SaslAuthenticate(SaslAuthenticateRequest),
    CreateAcls(CreateAclsRequest),
    DescribeAcls(DescribeAclsRequest),
    DeleteAcls(DeleteAclsRequest),
    DescribeUserScramCredentials(DescribeUserScramCredentialsRequest),
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    DescribeCluster(DescribeClusterRequest),
    DescribeTopicPartitions(DescribeTopicPartitionsRequest),
    ListPartitionReassignments(ListPartitionReassignmentsRequest),
    AlterPartitionReassignments(AlterPartitionReassignmentsRequest),
    ElectLeaders(ElectLeadersRequest),
    OffsetForLeaderEpoch(OffsetForLeaderEpochRequest),
    DescribeLogDirs(DescribeLogDirsRequest),
    DescribeProducers(DescribeProducersRequest),
    OffsetDelete(OffsetDeleteRequest),
    DeleteRecords(DeleteRecordsRequest),
    DescribeClientQuotas(DescribeClientQuotasRequest),
    AlterClientQuotas(AlterClientQuotasRequest),
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(ConsumerGroupDescribeRequest),
    ShareGroupHeartbeat(ShareGroupHeartbeatRequest),
    ShareGroupDescribe(ShareGroupDescribeRequest),
    ShareFetch(ShareFetchRequest),
    ShareAcknowledge(ShareAcknowledgeRequest),
    DescribeShareGroupOffsets(DescribeShareGroupOffsetsRequest),
    AlterShareGroupOffsets(AlterShareGroupOffsetsRequest),
    DeleteShareGroupOffsets(DeleteShareGroupOffsetsRequest),
    AddPartitionsToTxn(AddPartitionsToTxnRequest),
    AddOffsetsToTxn(AddOffsetsToTxnRequest),
    EndTxn(EndTxnRequest),
    TxnOffsetCommit(TxnOffsetCommitRequest),
    DescribeTransactions(DescribeTransactionsRequest),
    ListTransactions(ListTransactionsRequest),
}

/// Why a request was not decoded.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// A request of an API or version not served. ApiVersions gets an answer (version 0, with
    /// the versions served, as KIP-511 asks); anything else closes the connection, as Kafka's
    /// brokers do.
    #[error("api key {api_key} version {api_version} is not served")]
    Unsupported {
        api_key: i16,
        api_version: i16,
        correlation_id: i32,
    },
    #[error("malformed request: {0}")]
    Malformed(String),
}

/// Decodes one request frame's content (after its size prefix). A frame that ends before its
/// request does, or whose fields do not decode, is refused; bytes after a whole request are
/// not (see [`Decoded::trailing_bytes`]).
/// The rejection of a frame whose header prefix names an API or version not served (what
/// [`decode_request`] would answer), without decoding it: the caller keeps the frame for the
/// refusal, and passes it on otherwise as its only holder.
pub fn unsupported(frame: &[u8]) -> Option<Rejected> {
    let mut prefix = frame.get(..HEADER_PREFIX_LEN)?;
    let (api_key, api_version, correlation_id) =
        (prefix.get_i16(), prefix.get_i16(), prefix.get_i32());
    let served = ApiKey::try_from(api_key).is_ok_and(|api| served(api, api_version));
    (!served).then_some(Rejected::Unsupported {
        api_key,
        api_version,
        correlation_id,
    })
}

/// Decodes a request frame (its size prefix removed). The frame is best passed as the only
/// holder of its bytes: a Produce request's records are then detached from it without a copy
/// ([`Produced`]).
pub fn decode_request(mut frame: Bytes) -> Result<Decoded, Rejected> {
    if frame.len() < HEADER_PREFIX_LEN {
        return Err(Rejected::Malformed(format!(
            "a {}-byte frame holds no request header",
            frame.len()
        )));
    }
    let mut prefix = &frame[..HEADER_PREFIX_LEN];
    let (api_key, api_version, correlation_id) =
        (prefix.get_i16(), prefix.get_i16(), prefix.get_i32());
    let unsupported = Rejected::Unsupported {
        api_key,
        api_version,
        correlation_id,
    };
    let Some(api) = ApiKey::try_from(api_key)
        .ok()
        .filter(|api| served(*api, api_version))
    else {
        return Err(unsupported);
    };
    let malformed = |error| Rejected::Malformed(format!("{api:?} v{api_version}: {error:#}"));
    // The whole frame, where a produce's records are detached from once decoded.
    let whole = frame.clone();
    let request_header = RequestHeader::decode(&mut frame, api.request_header_version(api_version))
        .map_err(malformed)?;
    macro_rules! decoded {
        ($variant:ident) => {
            KafkaRequest::$variant(Decodable::decode(&mut frame, api_version).map_err(malformed)?)
        };
    }
    let request = match api {
        ApiKey::ApiVersions => decoded!(ApiVersions),
        ApiKey::Metadata => decoded!(Metadata),
        ApiKey::Produce => KafkaRequest::Produce(Produced {
            request: Decodable::decode(&mut frame, api_version).map_err(malformed)?,
            records: Vec::new(),
        }),
        ApiKey::Fetch => decoded!(Fetch),
        ApiKey::ListOffsets => decoded!(ListOffsets),
        ApiKey::InitProducerId => decoded!(InitProducerId),
        ApiKey::FindCoordinator => decoded!(FindCoordinator),
        ApiKey::JoinGroup => decoded!(JoinGroup),
        ApiKey::SyncGroup => decoded!(SyncGroup),
        ApiKey::Heartbeat => decoded!(Heartbeat),
        ApiKey::LeaveGroup => decoded!(LeaveGroup),
        ApiKey::OffsetCommit => decoded!(OffsetCommit),
        ApiKey::OffsetFetch => decoded!(OffsetFetch),
        ApiKey::DescribeGroups => decoded!(DescribeGroups),
        ApiKey::ListGroups => decoded!(ListGroups),
        ApiKey::DeleteGroups => decoded!(DeleteGroups),
        ApiKey::CreateTopics => decoded!(CreateTopics),
        ApiKey::DeleteTopics => decoded!(DeleteTopics),
        ApiKey::CreatePartitions => decoded!(CreatePartitions),
        ApiKey::DescribeConfigs => decoded!(DescribeConfigs),
        ApiKey::AlterConfigs => decoded!(AlterConfigs),
        ApiKey::IncrementalAlterConfigs => decoded!(IncrementalAlterConfigs),
        ApiKey::SaslHandshake => decoded!(SaslHandshake),
        ApiKey::SaslAuthenticate => decoded!(SaslAuthenticate),
        ApiKey::CreateAcls => decoded!(CreateAcls),
        ApiKey::DescribeAcls => decoded!(DescribeAcls),
        ApiKey::DeleteAcls => decoded!(DeleteAcls),
        ApiKey::DescribeUserScramCredentials => decoded!(DescribeUserScramCredentials),
        ApiKey::AlterUserScramCredentials => decoded!(AlterUserScramCredentials),
        ApiKey::DescribeCluster => decoded!(DescribeCluster),
        ApiKey::DescribeTopicPartitions => decoded!(DescribeTopicPartitions),
        ApiKey::ListPartitionReassignments => decoded!(ListPartitionReassignments),
        ApiKey::AlterPartitionReassignments => decoded!(AlterPartitionReassignments),
        ApiKey::ElectLeaders => decoded!(ElectLeaders),
        ApiKey::OffsetForLeaderEpoch => decoded!(OffsetForLeaderEpoch),
        ApiKey::DescribeLogDirs => decoded!(DescribeLogDirs),
        ApiKey::DescribeProducers => decoded!(DescribeProducers),
        ApiKey::OffsetDelete => decoded!(OffsetDelete),
        ApiKey::DeleteRecords => decoded!(DeleteRecords),
        ApiKey::DescribeClientQuotas => decoded!(DescribeClientQuotas),
        ApiKey::AlterClientQuotas => decoded!(AlterClientQuotas),
        ApiKey::ConsumerGroupHeartbeat => decoded!(ConsumerGroupHeartbeat),
        ApiKey::ConsumerGroupDescribe => decoded!(ConsumerGroupDescribe),
        ApiKey::ShareGroupHeartbeat => decoded!(ShareGroupHeartbeat),
        ApiKey::ShareGroupDescribe => decoded!(ShareGroupDescribe),
        ApiKey::ShareFetch => decoded!(ShareFetch),
        ApiKey::ShareAcknowledge => decoded!(ShareAcknowledge),
        ApiKey::DescribeShareGroupOffsets => decoded!(DescribeShareGroupOffsets),
        ApiKey::AlterShareGroupOffsets => decoded!(AlterShareGroupOffsets),
        ApiKey::DeleteShareGroupOffsets => decoded!(DeleteShareGroupOffsets),
        ApiKey::AddPartitionsToTxn => decoded!(AddPartitionsToTxn),
        ApiKey::AddOffsetsToTxn => decoded!(AddOffsetsToTxn),
        ApiKey::EndTxn => decoded!(EndTxn),
        ApiKey::TxnOffsetCommit => decoded!(TxnOffsetCommit),
        ApiKey::DescribeTransactions => decoded!(DescribeTransactions),
        ApiKey::ListTransactions => decoded!(ListTransactions),
        _ => unreachable!("served() admits only the APIs above"),
    };
    // The header taken whole: what it holds of the frame goes with it.
    let header = {
        let request_header = request_header;
        Header {
            api_key: api,
            api_version,
            correlation_id,
            client_id: request_header
                .client_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            throttle_ms: 0,
        }
    };
    let trailing_bytes = frame.remaining();
    // Nothing of the frame is held past here but the request's slices of it.
    drop(frame);
    let request = match request {
        KafkaRequest::Produce(produced) => {
            KafkaRequest::Produce(Produced::detach(produced.request, whole))
        }
        request => request,
    };
    Ok(Decoded {
        header,
        request,
        trailing_bytes,
    })
}

fn served(api: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|&(key, min, max)| key == api && (min..=max).contains(&version))
}

/// Encodes a response frame (size prefix included) to the request `header` answers.
pub fn encode_response<R: Encodable>(header: &Header, response: &R) -> Result<BytesMut, String> {
    // ApiVersions answers with header version 0 whatever its version, so that a client that
    // sent a version the broker does not know can still read the answer (KIP-511).
    let header_version = match header.api_key {
        ApiKey::ApiVersions => 0,
        api => api.response_header_version(header.api_version),
    };
    let response_header = ResponseHeader::default().with_correlation_id(header.correlation_id);
    let size = response_header
        .compute_size(header_version)
        .and_then(|head| Ok(head + response.compute_size(header.api_version)?))
        .map_err(|error| format!("{:?} v{}: {error:#}", header.api_key, header.api_version))?;
    let mut out = BytesMut::with_capacity(SIZE_LEN + size);
    out.put_i32(i32::try_from(size).map_err(|_| format!("a response of {size} bytes"))?);
    response_header
        .encode(&mut out, header_version)
        .and_then(|()| response.encode(&mut out, header.api_version))
        .map_err(|error| format!("{:?} v{}: {error:#}", header.api_key, header.api_version))?;
    debug_assert_eq!(out.len(), SIZE_LEN + size);
    Ok(out)
}

/// A response that reports how long its client must wait for its quotas (KIP-219): every
/// response of a served API but the SASL ones, whose answers have no such field.
pub trait Throttled {
    fn set_throttle_time_ms(&mut self, throttle_ms: i32);
}

macro_rules! throttled {
    ($($response:ident),* $(,)?) => {$(
        impl Throttled for kafka_protocol::messages::$response {
            fn set_throttle_time_ms(&mut self, throttle_ms: i32) {
                self.throttle_time_ms = throttle_ms;
            }
        }
    )*};
}

throttled!(
    DescribeTransactionsResponse,
    ListTransactionsResponse,
    AddPartitionsToTxnResponse,
    AddOffsetsToTxnResponse,
    EndTxnResponse,
    TxnOffsetCommitResponse,
    ProduceResponse,
    FetchResponse,
    ListOffsetsResponse,
    MetadataResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    FindCoordinatorResponse,
    JoinGroupResponse,
    HeartbeatResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
    DeleteGroupsResponse,
    ApiVersionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    CreatePartitionsResponse,
    DescribeConfigsResponse,
    AlterConfigsResponse,
    IncrementalAlterConfigsResponse,
    InitProducerIdResponse,
    CreateAclsResponse,
    DescribeAclsResponse,
    DeleteAclsResponse,
    DescribeUserScramCredentialsResponse,
    AlterUserScramCredentialsResponse,
    DescribeClusterResponse,
    DescribeTopicPartitionsResponse,
    ListPartitionReassignmentsResponse,
    AlterPartitionReassignmentsResponse,
    ElectLeadersResponse,
    OffsetForLeaderEpochResponse,
    DescribeLogDirsResponse,
    DescribeProducersResponse,
    OffsetDeleteResponse,
    DeleteRecordsResponse,
    DescribeClientQuotasResponse,
    AlterClientQuotasResponse,
    ConsumerGroupHeartbeatResponse,
    ConsumerGroupDescribeResponse,
    ShareGroupHeartbeatResponse,
    ShareGroupDescribeResponse,
    ShareFetchResponse,
    ShareAcknowledgeResponse,
    DescribeShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponse,
);

impl Throttled for kafka_protocol::messages::SaslHandshakeResponse {
    fn set_throttle_time_ms(&mut self, _throttle_ms: i32) {}
}

impl Throttled for kafka_protocol::messages::SaslAuthenticateResponse {
    fn set_throttle_time_ms(&mut self, _throttle_ms: i32) {}
}

/// Encodes a Fetch response frame as chunks for a vectored write: the records of each
/// partition go out as the `Bytes` they are, never copied into the frame (what
/// [`encode_response`] would do). The same bytes as [`encode_response`] (a test holds it to
/// that at every served version).
pub fn encode_fetch_response(header: &Header, response: &FetchResponse) -> Vec<Bytes> {
    encode_fetch_parts(header, response, Vec::new()).chunks
}

/// Records a fetch answer carries from elsewhere (a segment file's range, sent with
/// `sendfile`): the partition (topic, index) they answer, and their source.
pub type RecordsElsewhere = Vec<(String, i32, strata_wire::protocol::Elsewhere)>;

/// [`encode_fetch_response`], with the records of the partitions `elsewhere` names written
/// from their source: their length goes in the frame, an empty chunk where their bytes go,
/// and the source beside the chunks (the records the response itself holds for those
/// partitions are ignored).
pub fn encode_fetch_parts(
    header: &Header,
    response: &FetchResponse,
    mut elsewhere: RecordsElsewhere,
) -> FrameParts {
    let mut sources = Vec::with_capacity(elsewhere.len());
    let version = header.api_version;
    debug_assert!(served(ApiKey::Fetch, version));
    let flexible = version >= 12;
    // The first chunk is the frame's size, known once everything else is.
    let mut chunks = vec![Bytes::new()];
    let mut head = BytesMut::with_capacity(256);
    head.put_i32(header.correlation_id);
    if flexible {
        put_uvarint(&mut head, 0); // the response header's tagged fields
    }
    head.put_i32(response.throttle_time_ms);
    if version >= 7 {
        head.put_i16(response.error_code);
        head.put_i32(response.session_id);
    }
    put_len(&mut head, flexible, response.responses.len());
    for topic in &response.responses {
        let name = topic.topic.0.as_bytes();
        if version >= 13 {
            head.put_slice(topic.topic_id.as_bytes());
        } else if flexible {
            put_uvarint(&mut head, name.len() as u32 + 1);
            head.put_slice(name);
        } else {
            head.put_i16(name.len() as i16);
            head.put_slice(name);
        }
        put_len(&mut head, flexible, topic.partitions.len());
        for partition in &topic.partitions {
            let from_elsewhere = elsewhere
                .iter()
                .position(|(topic, index, _)| {
                    topic.as_bytes() == name && *index == partition.partition_index
                })
                .map(|at| elsewhere.swap_remove(at).2);
            head.put_i32(partition.partition_index);
            head.put_i16(partition.error_code);
            head.put_i64(partition.high_watermark);
            head.put_i64(partition.last_stable_offset);
            if version >= 5 {
                head.put_i64(partition.log_start_offset);
            }
            match &partition.aborted_transactions {
                None if flexible => put_uvarint(&mut head, 0),
                None => head.put_i32(-1),
                Some(aborted) => {
                    put_len(&mut head, flexible, aborted.len());
                    for transaction in aborted {
                        head.put_i64(transaction.producer_id.0);
                        head.put_i64(transaction.first_offset);
                        if flexible {
                            put_uvarint(&mut head, 0);
                        }
                    }
                }
            }
            if version >= 11 {
                head.put_i32(partition.preferred_read_replica.0);
            }
            if let Some(source) = from_elsewhere {
                if flexible {
                    put_uvarint(&mut head, source.len + 1);
                } else {
                    head.put_i32(source.len as i32);
                }
                chunks.push(std::mem::take(&mut head).freeze());
                chunks.push(Bytes::new());
                sources.push(source);
            } else {
                match &partition.records {
                    None if flexible => put_uvarint(&mut head, 0),
                    None => head.put_i32(-1),
                    Some(records) => {
                        if flexible {
                            put_uvarint(&mut head, records.len() as u32 + 1);
                        } else {
                            head.put_i32(records.len() as i32);
                        }
                        if !records.is_empty() {
                            chunks.push(std::mem::take(&mut head).freeze());
                            chunks.push(records.clone());
                        }
                    }
                }
            }
            if flexible {
                // The partition's tagged fields: only its current leader is ever set (KIP-951).
                if partition.current_leader == Default::default() {
                    put_uvarint(&mut head, 0);
                } else {
                    put_uvarint(&mut head, 1);
                    put_tagged(&mut head, 1, version, &partition.current_leader);
                }
            }
        }
        if flexible {
            put_uvarint(&mut head, 0); // the topic's tagged fields
        }
    }
    if flexible {
        // The response's tagged fields: the endpoints of the leaders the partitions name.
        if version >= 16 && !response.node_endpoints.is_empty() {
            put_uvarint(&mut head, 1);
            let mut endpoints = BytesMut::new();
            put_uvarint(&mut endpoints, response.node_endpoints.len() as u32 + 1);
            for endpoint in &response.node_endpoints {
                endpoint
                    .encode(&mut endpoints, version)
                    .expect("a node endpoint encodes at a served version");
            }
            put_uvarint(&mut head, 0);
            put_uvarint(&mut head, endpoints.len() as u32);
            head.put_slice(&endpoints);
        } else {
            put_uvarint(&mut head, 0);
        }
    }
    if !head.is_empty() {
        chunks.push(head.freeze());
    }
    debug_assert!(
        elsewhere.is_empty(),
        "records elsewhere for a partition not answered"
    );
    finish_parts(chunks, sources)
}

/// A frame's parts once its chunks are written: the frame's size (its chunks' bytes and its
/// records' from elsewhere) put in the first chunk, left empty for it.
fn finish_parts(
    mut chunks: Vec<Bytes>,
    sources: Vec<strata_wire::protocol::Elsewhere>,
) -> FrameParts {
    // Empty chunks stand for records elsewhere, and only for them.
    debug_assert_eq!(
        chunks[1..].iter().filter(|chunk| chunk.is_empty()).count(),
        sources.len()
    );
    let size: usize = chunks.iter().map(Bytes::len).sum::<usize>()
        + sources
            .iter()
            .map(|source| source.len as usize)
            .sum::<usize>();
    chunks[0] = Bytes::copy_from_slice(&(size as i32).to_be_bytes());
    FrameParts {
        chunks,
        elsewhere: sources,
    }
}

/// Records a ShareFetch answer carries from elsewhere: the partition (topic id, index) they
/// answer, and their source.
/// The topic id is its 16 bytes.
pub type ShareRecordsElsewhere = Vec<([u8; 16], i32, strata_wire::protocol::Elsewhere)>;

/// A ShareFetch response frame as chunks, as [`encode_fetch_parts`] makes a Fetch one: each
/// partition's records go out as the `Bytes` they are or, for the partitions `elsewhere` names,
/// from their source (`sendfile`), never copied into the frame. The same bytes as
/// [`encode_response`] (a test holds it to that).
pub fn encode_share_fetch_parts(
    header: &Header,
    response: &ShareFetchResponse,
    mut elsewhere: ShareRecordsElsewhere,
) -> Result<FrameParts, String> {
    let version = header.api_version;
    debug_assert!(served(ApiKey::ShareFetch, version));
    fn failed(error: impl std::fmt::Display) -> String {
        format!("encoding a ShareFetch answer: {error}")
    }
    let mut sources = Vec::with_capacity(elsewhere.len());
    let mut chunks = vec![Bytes::new()];
    let mut head = BytesMut::with_capacity(256);
    head.put_i32(header.correlation_id);
    put_uvarint(&mut head, 0); // the response header's tagged fields
    head.put_i32(response.throttle_time_ms);
    head.put_i16(response.error_code);
    put_compact_string(&mut head, response.error_message.as_deref());
    head.put_i32(response.acquisition_lock_timeout_ms);
    put_uvarint(&mut head, response.responses.len() as u32 + 1);
    for topic in &response.responses {
        head.put_slice(topic.topic_id.as_bytes());
        put_uvarint(&mut head, topic.partitions.len() as u32 + 1);
        for partition in &topic.partitions {
            let from_elsewhere = elsewhere
                .iter()
                .position(|(id, index, _)| {
                    id == topic.topic_id.as_bytes() && *index == partition.partition_index
                })
                .map(|at| elsewhere.swap_remove(at).2);
            head.put_i32(partition.partition_index);
            head.put_i16(partition.error_code);
            put_compact_string(&mut head, partition.error_message.as_deref());
            head.put_i16(partition.acknowledge_error_code);
            put_compact_string(&mut head, partition.acknowledge_error_message.as_deref());
            partition
                .current_leader
                .encode(&mut head, version)
                .map_err(failed)?;
            match (from_elsewhere, &partition.records) {
                (Some(source), _) => {
                    put_uvarint(&mut head, source.len + 1);
                    chunks.push(std::mem::take(&mut head).freeze());
                    chunks.push(Bytes::new());
                    sources.push(source);
                }
                (None, None) => put_uvarint(&mut head, 0),
                (None, Some(records)) => {
                    put_uvarint(&mut head, records.len() as u32 + 1);
                    if !records.is_empty() {
                        chunks.push(std::mem::take(&mut head).freeze());
                        chunks.push(records.clone());
                    }
                }
            }
            put_uvarint(&mut head, partition.acquired_records.len() as u32 + 1);
            for run in &partition.acquired_records {
                run.encode(&mut head, version).map_err(failed)?;
            }
            put_uvarint(&mut head, 0); // the partition's tagged fields
        }
        put_uvarint(&mut head, 0); // the topic's tagged fields
    }
    put_uvarint(&mut head, response.node_endpoints.len() as u32 + 1);
    for endpoint in &response.node_endpoints {
        endpoint.encode(&mut head, version).map_err(failed)?;
    }
    put_uvarint(&mut head, 0); // the response's tagged fields
    chunks.push(head.freeze());
    if !elsewhere.is_empty() {
        return Err("records elsewhere for a partition not answered".to_string());
    }
    Ok(finish_parts(chunks, sources))
}

/// An array's length: `u32` varint of length + 1 in flexible versions, `i32` before.
fn put_len(out: &mut BytesMut, flexible: bool, len: usize) {
    if flexible {
        put_uvarint(out, len as u32 + 1);
    } else {
        out.put_i32(len as i32);
    }
}

/// A nullable string in a flexible version: length + 1 as a varint (0: null), then its bytes.
fn put_compact_string(out: &mut BytesMut, text: Option<&str>) {
    match text {
        None => put_uvarint(out, 0),
        Some(text) => {
            put_uvarint(out, text.len() as u32 + 1);
            out.put_slice(text.as_bytes());
        }
    }
}

/// A tagged field: its tag, its size, and `value` encoded at `version`.
fn put_tagged<T: Encodable>(out: &mut BytesMut, tag: u32, version: i16, value: &T) {
    let mut encoded = BytesMut::new();
    value
        .encode(&mut encoded, version)
        .expect("a tagged field encodes at a served version");
    put_uvarint(out, tag);
    put_uvarint(out, encoded.len() as u32);
    out.put_slice(&encoded);
}

fn put_uvarint(out: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}
