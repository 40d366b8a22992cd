//! The native protocol: length-prefixed frames carrying typed requests and responses.
//!
//! ```text
//! frame    = u32 body_len, body
//! request  = u16 api_key, u16 api_version, u32 correlation_id, message
//! response = u32 correlation_id, u16 error_code, message (absent unless error_code = NONE)
//! ```
//!
//! Requests on one connection are pipelined; responses carry the request's correlation id and
//! may come back in any order. A response-level error code answers requests the broker could not
//! take at all (unknown api, unsupported version, malformed message); per-partition errors live
//! inside the messages. Error codes are typed ([`ErrorCode`]), never strings to parse.
//!
//! Invariant: decoding any bytes returns a value or a [`DecodeError`]; it never panics and never
//! allocates more than the frame can justify (array counts are checked against remaining bytes).

mod codec;
mod messages;

pub use codec::{DecodeError, Decoder, Elsewhere, Encoder, FrameParts, Records};
pub use messages::*;

use bytes::{Bytes, BytesMut};

/// Request and response header lengths, for budgeting.
pub const REQUEST_HEADER_LEN: usize = 8;
pub const FRAME_PREFIX_LEN: usize = 4;

/// API keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ApiKey {
    ApiVersions = 0,
    Metadata = 1,
    CreateTopic = 2,
    DeleteTopic = 3,
    Produce = 4,
    Fetch = 5,
    ListOffsets = 6,
    /// Follower to leader, over QUIC between brokers (not a client api).
    ReplicaFetch = 7,
    /// Moves a partition to a new replica set (`strata topic reassign`).
    ReassignPartition = 8,
    /// A producer id and epoch for an idempotent producer.
    InitProducerId = 9,
    /// Which broker coordinates a consumer group.
    FindCoordinator = 10,
    JoinGroup = 11,
    /// Keeps a member alive and carries its assignment (server-side, cooperative).
    Heartbeat = 12,
    LeaveGroup = 13,
    OffsetCommit = 14,
    OffsetFetch = 15,
    ListGroups = 16,
    DescribeGroup = 17,
    /// Grows a topic to more partitions (`strata topic add-partitions`).
    CreatePartitions = 18,
    /// Sets or removes a topic's config overrides (`strata topic alter`).
    AlterTopicConfig = 19,
    /// A topic's effective settings and which of them are overrides (`strata topic describe`).
    DescribeTopicConfig = 20,
    /// Moves leaderships back to preferred replicas now (`strata topic elect-leaders`).
    ElectLeaders = 21,
    /// Removes a consumer group without members, and its committed offsets (`strata group delete`).
    DeleteGroup = 22,
    /// A SASL step: the first requests on a listener that asks for authentication.
    Authenticate = 23,
    /// Users and their SCRAM mechanisms (`strata user list`).
    DescribeUsers = 24,
    /// Sets or removes a user's SCRAM credential (`strata user create|delete`).
    AlterUser = 25,
    /// ACL bindings matching a filter (`strata acl list`).
    DescribeAcls = 26,
    CreateAcls = 27,
    DeleteAcls = 28,
    /// Forgets a group's committed offsets of some partitions (`strata group delete-offsets`).
    DeleteOffsets = 29,
    /// Moves partitions' log starts up (`strata topic delete-records`).
    DeleteRecords = 30,
    /// Client quotas matching a filter (`strata quota list`).
    DescribeQuotas = 31,
    /// Sets or removes client quotas (`strata quota set|remove`).
    AlterQuotas = 32,
    /// A broker's settings, or those set live for every broker (`strata cluster config list`).
    DescribeBrokerConfigs = 33,
    /// Sets or removes broker settings while the cluster runs (`strata cluster config set`).
    AlterBrokerConfigs = 34,
    /// Adds partitions to a producer's open transaction (opening it).
    AddPartitionsToTxn = 35,
    /// Adds a group's offsets to a producer's open transaction (opening it).
    AddOffsetsToTxn = 36,
    /// Commits or aborts a producer's open transaction.
    EndTxn = 37,
    /// Offsets committed as part of a transaction: visible once it commits.
    TxnOffsetCommit = 38,
    /// Transaction coordinator to partition leader, between brokers (not a client api): write
    /// a decided transaction's markers.
    WriteTxnMarkers = 39,
    /// The state of transactional ids this broker coordinates (`strata txn describe`).
    DescribeTransactions = 40,
    /// The transactional ids this broker coordinates (`strata txn list`: every broker).
    ListTransactions = 41,
    /// Joins, stays in or leaves a share group (KIP-932), on the group's coordinator.
    ShareGroupHeartbeat = 42,
    /// Acquires records of a share group's partitions, and acknowledges earlier ones, on the
    /// partitions' leader.
    ShareFetch = 43,
    /// Acknowledges records a share group member acquired, on the partitions' leader.
    ShareAcknowledge = 44,
    /// A share group's members and the partitions it holds state for (`strata group
    /// describe`), on the group's coordinator.
    DescribeShareGroup = 45,
    /// Where a share group stands on partitions (start offset, records in flight, lag), on
    /// the partitions' leader.
    DescribeSharePartitions = 46,
    /// A group's configs (`share.auto.offset.reset`, ...), set or at their defaults (`strata
    /// group config`); any broker answers.
    DescribeGroupConfigs = 47,
    /// Sets or removes a group's configs (`strata group config --set|--delete`).
    AlterGroupConfigs = 48,
}

impl ApiKey {
    pub const ALL: [ApiKey; 49] = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::CreateTopic,
        ApiKey::DeleteTopic,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::ReplicaFetch,
        ApiKey::ReassignPartition,
        ApiKey::InitProducerId,
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroup,
        ApiKey::CreatePartitions,
        ApiKey::AlterTopicConfig,
        ApiKey::DescribeTopicConfig,
        ApiKey::ElectLeaders,
        ApiKey::DeleteGroup,
        ApiKey::Authenticate,
        ApiKey::DescribeUsers,
        ApiKey::AlterUser,
        ApiKey::DescribeAcls,
        ApiKey::CreateAcls,
        ApiKey::DeleteAcls,
        ApiKey::DeleteOffsets,
        ApiKey::DeleteRecords,
        ApiKey::DescribeQuotas,
        ApiKey::AlterQuotas,
        ApiKey::DescribeBrokerConfigs,
        ApiKey::AlterBrokerConfigs,
        ApiKey::AddPartitionsToTxn,
        ApiKey::AddOffsetsToTxn,
        ApiKey::EndTxn,
        ApiKey::TxnOffsetCommit,
        ApiKey::WriteTxnMarkers,
        ApiKey::DescribeTransactions,
        ApiKey::ListTransactions,
        ApiKey::ShareGroupHeartbeat,
        ApiKey::ShareFetch,
        ApiKey::ShareAcknowledge,
        ApiKey::DescribeShareGroup,
        ApiKey::DescribeSharePartitions,
        ApiKey::DescribeGroupConfigs,
        ApiKey::AlterGroupConfigs,
    ];

    pub fn from_u16(value: u16) -> Option<ApiKey> {
        ApiKey::ALL.into_iter().find(|key| *key as u16 == value)
    }

    /// The versions this build speaks: (min, max).
    pub fn versions(self) -> (u16, u16) {
        (0, 0)
    }
}

macro_rules! error_codes {
    ($($(#[$meta:meta])* $name:ident = $value:literal, retriable = $retriable:literal;)*) => {
        /// Typed error codes: what went wrong, as a number both sides agree on.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(u16)]
        pub enum ErrorCode {
            $($(#[$meta])* $name = $value,)*
        }

        impl ErrorCode {
            pub fn from_u16(value: u16) -> Option<ErrorCode> {
                match value {
                    $($value => Some(ErrorCode::$name),)*
                    _ => None,
                }
            }

            /// A client may retry a request that failed with a retriable code (after refreshing
            /// metadata where the code says the cluster changed).
            pub fn is_retriable(self) -> bool {
                match self {
                    $(ErrorCode::$name => $retriable,)*
                }
            }
        }
    };
}

error_codes! {
    #[default]
    None = 0, retriable = false;
    /// The request's api key is not one this broker knows.
    UnknownApi = 1, retriable = false;
    /// The broker does not speak this version of the api.
    UnsupportedVersion = 2, retriable = false;
    /// The request could not be decoded.
    InvalidRequest = 3, retriable = false;
    /// Retriable as in Kafka: a broker may not have learned of a new topic yet.
    UnknownTopic = 4, retriable = true;
    UnknownPartition = 5, retriable = true;
    /// The fetch offset is outside [log start, log end].
    OffsetOutOfRange = 6, retriable = false;
    /// A record batch failed its CRC or structure check.
    CorruptBatch = 7, retriable = false;
    /// A batch or request is larger than the broker accepts.
    MessageTooLarge = 8, retriable = false;
    /// This broker does not lead the partition; refresh metadata and retry.
    NotLeader = 9, retriable = true;
    TopicAlreadyExists = 10, retriable = false;
    /// Partition count, replication factor or a config value is invalid.
    InvalidConfig = 11, retriable = false;
    /// The partition's storage failed (fail-stop); another replica may serve it.
    StorageError = 12, retriable = true;
    NotEnoughReplicas = 13, retriable = true;
    RequestTimedOut = 14, retriable = true;
    /// The broker is starting up or shutting down.
    NotReady = 15, retriable = true;
    InvalidTopicName = 16, retriable = false;
    /// Unexpected broker failure; the broker's log has the details.
    Internal = 17, retriable = false;
    /// A follower fetched with an older leader epoch than the leader's: it must catch up with
    /// the partition state first.
    FencedLeaderEpoch = 18, retriable = true;
    /// The request names a newer leader epoch than this broker knows: this broker is stale.
    UnknownLeaderEpoch = 19, retriable = true;
    /// `acks=all`: the records were written, but the ISR fell below `min.insync.replicas` before
    /// they were committed. They may be visible to consumers; a retry may duplicate them.
    NotEnoughReplicasAfterAppend = 20, retriable = true;
    /// The broker is not a replica of the partition.
    NotReplica = 21, retriable = false;
    /// The group coordinator cannot serve yet (its store is unreachable, or it is loading).
    CoordinatorNotAvailable = 22, retriable = true;
    /// This broker does not coordinate the group: find the coordinator again.
    NotCoordinator = 23, retriable = true;
    /// The group does not know this member (it left, or its session expired): join again.
    UnknownMemberId = 24, retriable = false;
    /// The request carries another generation than the member's: a zombie of an old
    /// generation, or a member that must take its new assignment first.
    IllegalGeneration = 25, retriable = false;
    /// Another process joined with this member's `group.instance.id`.
    FencedInstanceId = 26, retriable = false;
    /// The member asks for another assignor than the group uses.
    InconsistentAssignor = 27, retriable = false;
    /// An idempotent batch does not follow the producer's last sequence: a batch before it
    /// was lost. Nothing was written.
    OutOfOrderSequence = 28, retriable = false;
    /// An idempotent batch carries an older producer epoch than the partition has seen:
    /// a newer instance of the producer exists.
    InvalidProducerEpoch = 29, retriable = false;
    /// An idempotent batch must travel alone in its partition's request.
    InvalidProducerBatch = 30, retriable = false;
    /// The group id is empty or too long.
    InvalidGroupId = 31, retriable = false;
    /// The group has members: only a group without members may be deleted.
    NonEmptyGroup = 32, retriable = false;
    /// No such group is stored.
    GroupIdNotFound = 33, retriable = false;
    /// The group (of Kafka's classic protocol) is rebalancing: the member must rejoin first.
    RebalanceInProgress = 34, retriable = false;
    /// A replica assignment the cluster cannot take (Kafka's INVALID_REPLICA_ASSIGNMENT).
    InvalidReplicaAssignment = 35, retriable = false;
    /// A new leader's high watermark has not yet reached where its epoch began, so the end
    /// it could name might be behind one an earlier leader named (Kafka's
    /// OFFSET_NOT_AVAILABLE): ask again shortly.
    OffsetNotAvailable = 36, retriable = true;
    /// The principal may not do this to the topic (Kafka's TOPIC_AUTHORIZATION_FAILED).
    TopicAuthorizationFailed = 37, retriable = false;
    /// The principal may not do this to the group (Kafka's GROUP_AUTHORIZATION_FAILED).
    GroupAuthorizationFailed = 38, retriable = false;
    /// The principal may not do this to the cluster (Kafka's CLUSTER_AUTHORIZATION_FAILED).
    ClusterAuthorizationFailed = 39, retriable = false;
    /// The connection has not authenticated, or its credentials were refused (Kafka's
    /// SASL_AUTHENTICATION_FAILED).
    AuthenticationFailed = 40, retriable = false;
    /// A record the topic cannot take: on a compacted topic, one without a key (Kafka's
    /// INVALID_RECORD). Nothing of the batch was written.
    InvalidRecord = 41, retriable = false;
    /// The replica an election wants already leads (Kafka's ELECTION_NOT_NEEDED).
    ElectionNotNeeded = 42, retriable = false;
    /// A preferred election's preferred replica is down or out of sync (Kafka's
    /// PREFERRED_LEADER_NOT_AVAILABLE).
    PreferredLeaderNotAvailable = 43, retriable = true;
    /// An unclean election found no live replica (Kafka's ELIGIBLE_LEADERS_NOT_AVAILABLE).
    EligibleLeadersNotAvailable = 44, retriable = true;
    /// A cancel of a reassignment when none is under way (Kafka's
    /// NO_REASSIGNMENT_IN_PROGRESS).
    NoReassignmentInProgress = 45, retriable = false;
    /// An offset delete of a topic a member of the group still subscribes to (Kafka's
    /// GROUP_SUBSCRIBED_TO_TOPIC).
    GroupSubscribedToTopic = 46, retriable = false;
    /// A change of the transactional id is being stored, or its markers written: retry.
    ConcurrentTransactions = 47, retriable = true;
    /// A newer producer with the same transactional id took it over (Kafka's
    /// PRODUCER_FENCED).
    ProducerFenced = 48, retriable = false;
    /// The producer id is not the transactional id's.
    InvalidProducerIdMapping = 49, retriable = false;
    /// The request does not fit the transaction's state (EndTxn with nothing open, ...).
    InvalidTxnState = 50, retriable = false;
    /// A transaction timeout of zero or above the broker's `transaction.max.timeout.ms`.
    InvalidTransactionTimeout = 51, retriable = false;
    /// Offsets a transaction commits are pending for a partition asked with `require_stable`.
    UnstableOffsetCommit = 52, retriable = true;
    /// The client may not use the transactional id (no Write ACL on it).
    TransactionalIdAuthorizationFailed = 53, retriable = false;
    /// No transaction coordinator knows the transactional id.
    TransactionalIdNotFound = 54, retriable = false;
    /// A marker from a coordinator older than one whose marker the partition has taken for
    /// the producer: the transactional id moved since (Kafka's
    /// TRANSACTION_COORDINATOR_FENCED).
    TransactionCoordinatorFenced = 55, retriable = false;
    /// A conditional append's partition does not end at the offset the producer expected
    /// (another writer got there first): nothing was written; the answer's base offset is the
    /// log end.
    LogEndMismatch = 56, retriable = false;
    /// A share group member's epoch is not the one the group has for it (Kafka's
    /// FENCED_MEMBER_EPOCH): it joins again at epoch 0, keeping its member id.
    FencedMemberEpoch = 57, retriable = false;
    /// The group is of another kind than the request's (a share group heartbeat to a consumer
    /// group's id; Kafka's INCONSISTENT_GROUP_PROTOCOL).
    InconsistentGroupProtocol = 58, retriable = false;
    /// An acknowledgement names a record the member does not hold: never acquired by it, its
    /// lock ran out (another member may have it), or already acknowledged (Kafka's
    /// INVALID_RECORD_STATE). Nothing of the partition's acknowledgements was applied.
    InvalidRecordState = 59, retriable = false;
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: u16,
    pub api_version: u16,
    pub correlation_id: u32,
}

/// A request the broker could not take, with what it could read of its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRequest {
    pub header: Option<RequestHeader>,
    pub code: ErrorCode,
    pub reason: String,
}

macro_rules! requests {
    ($($api:ident($request:ident, $response:ident)),* $(,)?) => {
        #[derive(Debug, Clone)]
        pub enum Request {
            $($api($request),)*
        }

        #[derive(Debug, Clone)]
        pub enum Response {
            $($api($response),)*
        }

        impl Request {
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $(Request::$api(_) => ApiKey::$api,)*
                }
            }

            /// The whole frame (length prefix included) as chunks for one vectored write.
            pub fn encode(self, correlation_id: u32) -> Vec<Bytes> {
                let mut encoder = Encoder::new();
                encoder.put_u16(self.api_key() as u16);
                encoder.put_u16(0);
                encoder.put_u32(correlation_id);
                match self {
                    $(Request::$api(message) => message.encode(&mut encoder),)*
                }
                encoder.finish_frame()
            }

            /// Decodes a frame body (after the length prefix).
            pub fn decode(body: BytesMut) -> Result<(RequestHeader, Request), RejectedRequest> {
                let mut decoder = Decoder::new(body);
                let header = (|| {
                    Ok::<_, DecodeError>(RequestHeader {
                        api_key: decoder.get_u16()?,
                        api_version: decoder.get_u16()?,
                        correlation_id: decoder.get_u32()?,
                    })
                })()
                .map_err(|error| RejectedRequest {
                    header: None,
                    code: ErrorCode::InvalidRequest,
                    reason: error.to_string(),
                })?;
                let reject = |code, reason: String| RejectedRequest { header: Some(header), code, reason };
                let Some(api) = ApiKey::from_u16(header.api_key) else {
                    return Err(reject(ErrorCode::UnknownApi, format!("unknown api key {}", header.api_key)));
                };
                let (min, max) = api.versions();
                if header.api_version < min || header.api_version > max {
                    return Err(reject(
                        ErrorCode::UnsupportedVersion,
                        format!("{api:?} version {} (this broker speaks {min}..={max})", header.api_version),
                    ));
                }
                let request = match api {
                    $(ApiKey::$api => $request::decode(&mut decoder).map(Request::$api),)*
                };
                let request = request
                    .and_then(|request| decoder.finish().map(|()| request))
                    .map_err(|error| reject(ErrorCode::InvalidRequest, format!("{api:?}: {error}")))?;
                Ok((header, request))
            }
        }

        impl Response {
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $(Response::$api(_) => ApiKey::$api,)*
                }
            }

            pub fn encode(self, correlation_id: u32) -> Vec<Bytes> {
                self.encoded(correlation_id).finish_frame()
            }

            /// As [`Response::encode`], for a response that may carry records from elsewhere
            /// ([`Records::Elsewhere`]): their sources come back beside the chunks.
            pub fn encode_parts(self, correlation_id: u32) -> FrameParts {
                self.encoded(correlation_id).finish_parts()
            }

            /// The frame's header and body, not yet finished.
            fn encoded(self, correlation_id: u32) -> Encoder {
                let mut encoder = Encoder::new();
                encoder.put_u32(correlation_id);
                encoder.put_u16(ErrorCode::None as u16);
                match self {
                    $(Response::$api(message) => message.encode(&mut encoder),)*
                }
                encoder
            }

            /// A response-level error: the request was not taken at all.
            pub fn encode_error(correlation_id: u32, code: ErrorCode) -> Vec<Bytes> {
                let mut encoder = Encoder::new();
                encoder.put_u32(correlation_id);
                encoder.put_u16(code as u16);
                encoder.finish_frame()
            }

            /// Reads the correlation id of a response frame body, to find the request it answers.
            pub fn peek_correlation_id(body: &[u8]) -> Option<u32> {
                body.get(..4).map(|id| u32::from_le_bytes(id.try_into().expect("4 bytes")))
            }

            /// Decodes the first bytes of a response body whose records field is its last (a
            /// ReplicaFetch answer, say) without the records: the response comes back with empty
            /// records, beside `(offset, length)` of the records in the body (`None` for an
            /// error answer). Errors if the prefix ends before the records field does.
            pub fn decode_head(api: ApiKey, prefix: BytesMut) -> Result<(u32, Result<Response, ErrorCode>, Option<(usize, usize)>), DecodeError> {
                let mut decoder = Decoder::head_only(prefix);
                let correlation_id = decoder.get_u32()?;
                let code = decoder.get_u16()?;
                let code = ErrorCode::from_u16(code).ok_or(DecodeError::InvalidValue { field: "error_code", value: i64::from(code) })?;
                if code != ErrorCode::None {
                    return Ok((correlation_id, Err(code), None));
                }
                let response = match api {
                    $(ApiKey::$api => Response::$api($response::decode(&mut decoder)?),)*
                };
                Ok((correlation_id, Ok(response), decoder.elided_records()))
            }

            /// Decodes a response body to a request of `api`. The outer error is a broken frame;
            /// the inner one a response-level error code.
            pub fn decode(api: ApiKey, body: BytesMut) -> Result<(u32, Result<Response, ErrorCode>), DecodeError> {
                let mut decoder = Decoder::new(body);
                let correlation_id = decoder.get_u32()?;
                let code = decoder.get_u16()?;
                let code = ErrorCode::from_u16(code).ok_or(DecodeError::InvalidValue { field: "error_code", value: i64::from(code) })?;
                if code != ErrorCode::None {
                    decoder.finish()?;
                    return Ok((correlation_id, Err(code)));
                }
                let response = match api {
                    $(ApiKey::$api => Response::$api($response::decode(&mut decoder)?),)*
                };
                decoder.finish()?;
                Ok((correlation_id, Ok(response)))
            }
        }
    };
}

requests! {
    ApiVersions(ApiVersionsRequest, ApiVersionsResponse),
    Metadata(MetadataRequest, MetadataResponse),
    CreateTopic(CreateTopicRequest, CreateTopicResponse),
    DeleteTopic(DeleteTopicRequest, DeleteTopicResponse),
    Produce(ProduceRequest, ProduceResponse),
    Fetch(FetchRequest, FetchResponse),
    ListOffsets(ListOffsetsRequest, ListOffsetsResponse),
    ReplicaFetch(ReplicaFetchRequest, ReplicaFetchResponse),
    ReassignPartition(ReassignPartitionRequest, ReassignPartitionResponse),
    InitProducerId(InitProducerIdRequest, InitProducerIdResponse),
    FindCoordinator(FindCoordinatorRequest, FindCoordinatorResponse),
    JoinGroup(JoinGroupRequest, JoinGroupResponse),
    Heartbeat(HeartbeatRequest, HeartbeatResponse),
    LeaveGroup(LeaveGroupRequest, LeaveGroupResponse),
    OffsetCommit(OffsetCommitRequest, OffsetCommitResponse),
    OffsetFetch(OffsetFetchRequest, OffsetFetchResponse),
    ListGroups(ListGroupsRequest, ListGroupsResponse),
    DescribeGroup(DescribeGroupRequest, DescribeGroupResponse),
    CreatePartitions(CreatePartitionsRequest, CreatePartitionsResponse),
    AlterTopicConfig(AlterTopicConfigRequest, AlterTopicConfigResponse),
    DescribeTopicConfig(DescribeTopicConfigRequest, DescribeTopicConfigResponse),
    ElectLeaders(ElectLeadersRequest, ElectLeadersResponse),
    DeleteGroup(DeleteGroupRequest, DeleteGroupResponse),
    Authenticate(AuthenticateRequest, AuthenticateResponse),
    DescribeUsers(DescribeUsersRequest, DescribeUsersResponse),
    AlterUser(AlterUserRequest, AlterUserResponse),
    DescribeAcls(DescribeAclsRequest, DescribeAclsResponse),
    CreateAcls(CreateAclsRequest, CreateAclsResponse),
    DeleteAcls(DeleteAclsRequest, DeleteAclsResponse),
    DeleteOffsets(DeleteOffsetsRequest, DeleteOffsetsResponse),
    DeleteRecords(DeleteRecordsRequest, DeleteRecordsResponse),
    DescribeQuotas(DescribeQuotasRequest, DescribeQuotasResponse),
    AlterQuotas(AlterQuotasRequest, AlterQuotasResponse),
    DescribeBrokerConfigs(DescribeBrokerConfigsRequest, DescribeBrokerConfigsResponse),
    AlterBrokerConfigs(AlterBrokerConfigsRequest, AlterBrokerConfigsResponse),
    AddPartitionsToTxn(AddPartitionsToTxnRequest, TxnResponse),
    AddOffsetsToTxn(AddOffsetsToTxnRequest, TxnResponse),
    EndTxn(EndTxnRequest, TxnResponse),
    TxnOffsetCommit(TxnOffsetCommitRequest, TxnResponse),
    WriteTxnMarkers(WriteTxnMarkersRequest, WriteTxnMarkersResponse),
    DescribeTransactions(DescribeTransactionsRequest, DescribeTransactionsResponse),
    ListTransactions(ListTransactionsRequest, ListTransactionsResponse),
    ShareGroupHeartbeat(ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse),
    ShareFetch(ShareFetchRequest, ShareFetchResponse),
    ShareAcknowledge(ShareAcknowledgeRequest, ShareAcknowledgeResponse),
    DescribeShareGroup(DescribeShareGroupRequest, DescribeShareGroupResponse),
    DescribeSharePartitions(DescribeSharePartitionsRequest, DescribeSharePartitionsResponse),
    DescribeGroupConfigs(DescribeGroupConfigsRequest, DescribeGroupConfigsResponse),
    AlterGroupConfigs(AlterGroupConfigsRequest, AlterGroupConfigsResponse),
}
