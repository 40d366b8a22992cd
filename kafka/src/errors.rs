//! Strata's error codes as Kafka's (the numbers of Kafka's `Errors` enum).

use strata_wire::protocol::ErrorCode;

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const LEADER_NOT_AVAILABLE: i16 = 5;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const REQUEST_TIMED_OUT: i16 = 7;
pub const MESSAGE_TOO_LARGE: i16 = 10;
pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub const NOT_COORDINATOR: i16 = 16;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
pub const NOT_ENOUGH_REPLICAS: i16 = 19;
pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
pub const ILLEGAL_GENERATION: i16 = 22;
pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
pub const INVALID_GROUP_ID: i16 = 24;
pub const UNKNOWN_MEMBER_ID: i16 = 25;
pub const REBALANCE_IN_PROGRESS: i16 = 27;
pub const UNSUPPORTED_VERSION: i16 = 35;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const INVALID_CONFIG: i16 = 40;
pub const INVALID_REQUEST: i16 = 42;
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
pub const ILLEGAL_SASL_STATE: i16 = 34;
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
pub const SECURITY_DISABLED: i16 = 54;
pub const RESOURCE_NOT_FOUND: i16 = 91;
pub const DUPLICATE_RESOURCE: i16 = 92;
pub const UNACCEPTABLE_CREDENTIAL: i16 = 93;
pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const INVALID_TXN_STATE: i16 = 48;
pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
pub const CONCURRENT_TRANSACTIONS: i16 = 51;
pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
pub const PRODUCER_FENCED: i16 = 90;
pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
pub const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const NON_EMPTY_GROUP: i16 = 68;
pub const GROUP_ID_NOT_FOUND: i16 = 69;
pub const OFFSET_NOT_AVAILABLE: i16 = 78;
pub const MEMBER_ID_REQUIRED: i16 = 79;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
pub const FENCED_INSTANCE_ID: i16 = 82;
pub const INVALID_RECORD: i16 = 87;
pub const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
pub const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;
pub const ELECTION_NOT_NEEDED: i16 = 84;
pub const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
pub const UNSUPPORTED_ENDPOINT_TYPE: i16 = 115;
pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
/// KIP-516: a request names a topic by an id no topic has.
pub const UNKNOWN_TOPIC_ID: i16 = 100;
/// KIP-848: a member's epoch is not the one the group has for it (it rejoins at epoch 0).
pub const FENCED_MEMBER_EPOCH: i16 = 110;
/// KIP-848: a member asked for a server-side assignor the broker does not have.
pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
/// KIP-848: a subscription's regular expression does not compile.
pub const INVALID_REGULAR_EXPRESSION: i16 = 128;
/// Share groups (KIP-932): an acknowledgement of a record the member does not hold.
pub const INVALID_RECORD_STATE: i16 = 121;
pub const SHARE_SESSION_NOT_FOUND: i16 = 122;
pub const INVALID_SHARE_SESSION_EPOCH: i16 = 123;

/// The Kafka error a Kafka client handles the way a Strata client handles `code` (retriable
/// stays retriable: a not-ready shard is LEADER_NOT_AVAILABLE, which clients retry after a
/// metadata refresh).
pub fn kafka_error(code: ErrorCode) -> i16 {
    match code {
        ErrorCode::None => NONE,
        ErrorCode::UnknownApi | ErrorCode::UnsupportedVersion => UNSUPPORTED_VERSION,
        ErrorCode::InvalidRequest => INVALID_REQUEST,
        ErrorCode::UnknownTopic | ErrorCode::UnknownPartition => UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode::OffsetOutOfRange => OFFSET_OUT_OF_RANGE,
        ErrorCode::CorruptBatch => CORRUPT_MESSAGE,
        ErrorCode::MessageTooLarge => MESSAGE_TOO_LARGE,
        ErrorCode::NotLeader => NOT_LEADER_OR_FOLLOWER,
        // Only a follower's replica fetch hears it, and followers speak the native protocol.
        ErrorCode::NotReplica => INVALID_REQUEST,
        ErrorCode::TopicAlreadyExists => TOPIC_ALREADY_EXISTS,
        ErrorCode::InvalidConfig => INVALID_CONFIG,
        ErrorCode::StorageError => KAFKA_STORAGE_ERROR,
        ErrorCode::NotEnoughReplicas => NOT_ENOUGH_REPLICAS,
        ErrorCode::NotEnoughReplicasAfterAppend => NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode::RequestTimedOut => REQUEST_TIMED_OUT,
        ErrorCode::NotReady => LEADER_NOT_AVAILABLE,
        ErrorCode::InvalidTopicName => INVALID_TOPIC_EXCEPTION,
        ErrorCode::Internal => UNKNOWN_SERVER_ERROR,
        ErrorCode::FencedLeaderEpoch => FENCED_LEADER_EPOCH,
        ErrorCode::UnknownLeaderEpoch => UNKNOWN_LEADER_EPOCH,
        ErrorCode::CoordinatorNotAvailable => COORDINATOR_NOT_AVAILABLE,
        ErrorCode::NotCoordinator => NOT_COORDINATOR,
        ErrorCode::UnknownMemberId => UNKNOWN_MEMBER_ID,
        ErrorCode::IllegalGeneration => ILLEGAL_GENERATION,
        ErrorCode::FencedInstanceId => FENCED_INSTANCE_ID,
        ErrorCode::InconsistentAssignor => INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode::OutOfOrderSequence => OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode::InvalidProducerEpoch => INVALID_PRODUCER_EPOCH,
        ErrorCode::InvalidProducerBatch | ErrorCode::InvalidRecord => INVALID_RECORD,
        ErrorCode::InvalidGroupId => INVALID_GROUP_ID,
        ErrorCode::NonEmptyGroup => NON_EMPTY_GROUP,
        ErrorCode::GroupIdNotFound => GROUP_ID_NOT_FOUND,
        ErrorCode::RebalanceInProgress => REBALANCE_IN_PROGRESS,
        ErrorCode::InvalidReplicaAssignment => INVALID_REPLICA_ASSIGNMENT,
        ErrorCode::OffsetNotAvailable => OFFSET_NOT_AVAILABLE,
        ErrorCode::TopicAuthorizationFailed => TOPIC_AUTHORIZATION_FAILED,
        ErrorCode::GroupAuthorizationFailed => GROUP_AUTHORIZATION_FAILED,
        ErrorCode::ClusterAuthorizationFailed => CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode::AuthenticationFailed => SASL_AUTHENTICATION_FAILED,
        ErrorCode::ElectionNotNeeded => ELECTION_NOT_NEEDED,
        ErrorCode::PreferredLeaderNotAvailable => PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode::EligibleLeadersNotAvailable => ELIGIBLE_LEADERS_NOT_AVAILABLE,
        ErrorCode::NoReassignmentInProgress => NO_REASSIGNMENT_IN_PROGRESS,
        ErrorCode::GroupSubscribedToTopic => GROUP_SUBSCRIBED_TO_TOPIC,
        ErrorCode::ConcurrentTransactions => CONCURRENT_TRANSACTIONS,
        ErrorCode::ProducerFenced => PRODUCER_FENCED,
        ErrorCode::InvalidProducerIdMapping => INVALID_PRODUCER_ID_MAPPING,
        ErrorCode::InvalidTxnState => INVALID_TXN_STATE,
        ErrorCode::InvalidTransactionTimeout => INVALID_TRANSACTION_TIMEOUT,
        ErrorCode::UnstableOffsetCommit => UNSTABLE_OFFSET_COMMIT,
        ErrorCode::TransactionalIdAuthorizationFailed => TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode::TransactionalIdNotFound => TRANSACTIONAL_ID_NOT_FOUND,
        ErrorCode::TransactionCoordinatorFenced => TRANSACTION_COORDINATOR_FENCED,
        // Kafka has no conditional appends: the nearest refusal of a batch as it stands.
        ErrorCode::LogEndMismatch => INVALID_RECORD,
        ErrorCode::FencedMemberEpoch => FENCED_MEMBER_EPOCH,
        ErrorCode::InconsistentGroupProtocol => INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode::InvalidRecordState => INVALID_RECORD_STATE,
    }
}

#[cfg(test)]
mod tests {
    use strata_wire::protocol::ErrorCode;

    use super::*;

    /// Every code a Strata node answers has a Kafka counterpart, and retriable codes stay
    /// retriable for Kafka clients (which retry these after refreshing metadata).
    #[test]
    fn retriable_strata_errors_map_to_retriable_kafka_errors() {
        let kafka_retriable = [
            UNKNOWN_TOPIC_OR_PARTITION,
            LEADER_NOT_AVAILABLE,
            NOT_LEADER_OR_FOLLOWER,
            REQUEST_TIMED_OUT,
            COORDINATOR_NOT_AVAILABLE,
            NOT_COORDINATOR,
            NOT_ENOUGH_REPLICAS,
            NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            KAFKA_STORAGE_ERROR,
            FENCED_LEADER_EPOCH,
            UNKNOWN_LEADER_EPOCH,
            OFFSET_NOT_AVAILABLE,
            PREFERRED_LEADER_NOT_AVAILABLE,
            ELIGIBLE_LEADERS_NOT_AVAILABLE,
            CONCURRENT_TRANSACTIONS,
            UNSTABLE_OFFSET_COMMIT,
        ];
        for value in 0..=u16::MAX {
            let Some(code) = ErrorCode::from_u16(value) else {
                continue;
            };
            let kafka = kafka_error(code);
            assert_eq!(
                code.is_retriable(),
                kafka_retriable.contains(&kafka),
                "{code:?} → {kafka}"
            );
            assert_eq!(code == ErrorCode::None, kafka == NONE, "{code:?}");
        }
    }
}
