//! The messages, field by field in declaration order (see [`super::codec`] for field encodings).

use super::ErrorCode;
use super::codec::{DecodeError, Decoder, Encoder, Records};

/// A value with a wire encoding. `MIN_LEN` is the fewest bytes an encoded value takes; array
/// decoding checks counts against it.
pub trait Wire: Sized {
    const MIN_LEN: usize;
    fn encode(self, encoder: &mut Encoder);
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError>;
    /// Whether the value may be left off the wire when nothing is written after it: only an
    /// [`Appended`] field at its default.
    fn omissible(&self) -> bool {
        false
    }
    /// Encodes the value even where [`Wire::encode`] would leave it off (an [`Appended`] field
    /// that a later appended field follows).
    fn encode_in_full(self, encoder: &mut Encoder) {
        self.encode(encoder);
    }
}

macro_rules! primitive {
    ($($ty:ty: $len:literal, $put:ident, $get:ident;)*) => {$(
        impl Wire for $ty {
            const MIN_LEN: usize = $len;
            fn encode(self, encoder: &mut Encoder) {
                encoder.$put(self);
            }
            fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
                decoder.$get()
            }
        }
    )*};
}

primitive! {
    u8: 1, put_u8, get_u8;
    i8: 1, put_i8, get_i8;
    u16: 2, put_u16, get_u16;
    i16: 2, put_i16, get_i16;
    u32: 4, put_u32, get_u32;
    i32: 4, put_i32, get_i32;
    u64: 8, put_u64, get_u64;
    i64: 8, put_i64, get_i64;
    bool: 1, put_bool, get_bool;
}

impl Wire for f64 {
    const MIN_LEN: usize = 8;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_u64(self.to_bits());
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        decoder.get_u64().map(f64::from_bits)
    }
}

impl Wire for String {
    const MIN_LEN: usize = 2;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_str(&self);
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        decoder.get_str()
    }
}

impl Wire for Records {
    const MIN_LEN: usize = 4;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_records(self);
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        decoder.get_records()
    }
}

impl Wire for ErrorCode {
    const MIN_LEN: usize = 2;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_u16(self as u16);
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        let value = decoder.get_u16()?;
        ErrorCode::from_u16(value).ok_or(DecodeError::InvalidValue {
            field: "error_code",
            value: i64::from(value),
        })
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_LEN: usize = 4;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_count(self.len());
        for item in self {
            item.encode(encoder);
        }
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        let count = decoder.get_count(T::MIN_LEN)?;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(T::decode(decoder)?);
        }
        Ok(items)
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_LEN: usize = 1;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_bool(self.is_some());
        if let Some(value) = self {
            value.encode(encoder);
        }
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        Ok(if decoder.get_bool()? {
            Some(T::decode(decoder)?)
        } else {
            None
        })
    }
}

impl TransactionDescription {
    /// The answer for an id that is not described (`error` says why).
    pub fn refused(transactional_id: String, error: ErrorCode) -> TransactionDescription {
        TransactionDescription {
            transactional_id,
            error,
            state: String::new(),
            producer_id: -1,
            producer_epoch: -1,
            timeout_ms: 0,
            started_ms: -1,
            partitions: Vec::new(),
            groups: Vec::new(),
        }
    }
}

impl FetchRequest {
    /// How much a record-timestamp lookup reads: the batch holding the offset comes whole
    /// however small the limit; a little more lets a marker (which holds no record of the
    /// topic's) be stepped over.
    pub const TIMESTAMP_LOOKUP_BYTES: u32 = 64 << 10;

    /// A read of `topic`-`partition` at `offset` that does not wait, enough to find the
    /// timestamp of the record there (`crate::batch::first_record_timestamp`): what a
    /// consumer's lag in seconds is measured from.
    pub fn timestamp_lookup(topic: &str, partition: u32, offset: u64) -> FetchRequest {
        FetchRequest {
            max_wait_ms: 0,
            min_bytes: 0,
            max_bytes: Self::TIMESTAMP_LOOKUP_BYTES,
            topics: vec![FetchTopic {
                name: topic.to_string(),
                partitions: vec![FetchPartition {
                    partition,
                    fetch_offset: offset,
                    max_bytes: Self::TIMESTAMP_LOOKUP_BYTES,
                }],
            }],
            read_committed: Appended(false),
        }
    }
}

/// In [`ProduceRequest::expected_offsets`]: this partition's records are not conditional.
pub const NO_EXPECTED_OFFSET: i64 = -1;

/// [`ProduceRequest::durability`] values. Unreported: the answer says nothing of durability
/// (what a client built before durability was reported sends).
pub const DURABILITY_UNREPORTED: u8 = 0;
/// The answer reports each partition's [`AckDurability`]; the records are as durable as the
/// topic's flush policy makes them.
pub const DURABILITY_REPORTED: u8 = 1;
/// As reported, and the leader syncs the records to disk before answering (joining the
/// partition's next group-commit sync), whatever the topic's flush policy.
pub const DURABILITY_SYNCED: u8 = 2;

/// A field appended to a message after the message was first released: encoded only when it,
/// or an appended field after it, holds something other than its default, and read only when
/// bytes remain. A peer built before the field existed exchanges the same bytes as before for
/// every message that leaves it at its default, and refuses (trailing bytes) one that does not,
/// which it could not honour. Only a message's last fields may be appended ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appended<T>(pub T);

impl<T: Wire + Default + PartialEq> Wire for Appended<T> {
    const MIN_LEN: usize = 0;
    fn encode(self, encoder: &mut Encoder) {
        if !self.omissible() {
            self.0.encode(encoder);
        }
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        if decoder.is_at_end() {
            return Ok(Appended(T::default()));
        }
        T::decode(decoder).map(Appended)
    }
    fn omissible(&self) -> bool {
        self.0 == T::default()
    }
    fn encode_in_full(self, encoder: &mut Encoder) {
        self.0.encode(encoder);
    }
}

macro_rules! messages {
    ($($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)* })*) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl Wire for $name {
            const MIN_LEN: usize = 0 $(+ <$ty as Wire>::MIN_LEN)*;
            #[allow(unused_variables, unused_assignments, unused_mut, reason = "messages without fields")]
            fn encode(self, encoder: &mut Encoder) {
                // Fields are written up to the last one that cannot be left off: an appended
                // field at its default goes on the wire when a later appended field does, so
                // each is read where it belongs.
                let written: &[bool] = &[$(!Wire::omissible(&self.$field)),*];
                let count = written.iter().rposition(|&w| w).map_or(0, |last| last + 1);
                let mut at = 0;
                $(
                    if at < count {
                        Wire::encode_in_full(self.$field, encoder);
                    }
                    at += 1;
                )*
            }
            #[allow(unused_variables, reason = "messages without fields")]
            fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
                Ok($name { $($field: <$ty as Wire>::decode(decoder)?,)* })
            }
        }
    )*};
}

/// `ListOffsets` timestamps with special meaning.
pub const EARLIEST_TIMESTAMP: i64 = -2;
pub const LATEST_TIMESTAMP: i64 = -1;
/// The record with the largest timestamp (KIP-734): its offset and timestamp.
pub const MAX_TIMESTAMP: i64 = -3;
/// The first offset on local disk (KIP-1005): the log start, as Strata keeps no tiered log.
pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// The last offset in tiered storage (KIP-1005): none (-1), as Strata keeps no tiered log.
pub const LATEST_TIERED_TIMESTAMP: i64 = -5;
/// Strata's own: the first offset the log cleaner has not cleaned (a compacted topic's clean
/// point; the log start for a topic never cleaned). Far from Kafka's specs (-1 to -5).
pub const CLEAN_OFFSET_TIMESTAMP: i64 = -100;

/// `ProduceRequest::acks` values.
pub const ACKS_NONE: i8 = 0;
pub const ACKS_LEADER: i8 = 1;
pub const ACKS_ALL: i8 = -1;

messages! {
    pub struct ApiVersionsRequest {}

    pub struct ApiVersionRange {
        pub api_key: u16,
        pub min_version: u16,
        pub max_version: u16,
    }

    pub struct ApiVersionsResponse {
        pub apis: Vec<ApiVersionRange>,
    }

    pub struct MetadataRequest {
        /// `None`: every topic.
        pub topics: Option<Vec<String>>,
    }

    pub struct BrokerMetadata {
        pub node_id: i32,
        pub host: String,
        /// The shared client port (any shard answers and forwards).
        pub port: u16,
        /// Shard `i` also listens on `shard_ports[i]`; shard-aware clients go straight there.
        pub shard_ports: Vec<u16>,
    }

    pub struct PartitionMetadata {
        pub partition: u32,
        pub error: ErrorCode,
        pub leader: i32,
        pub leader_epoch: u32,
        /// The shard of the leader that owns the partition.
        pub shard: u16,
        pub replicas: Vec<i32>,
        pub isr: Vec<i32>,
    }

    pub struct TopicMetadata {
        pub name: String,
        pub error: ErrorCode,
        pub partitions: Vec<PartitionMetadata>,
    }

    pub struct MetadataResponse {
        pub cluster: String,
        pub controller: i32,
        pub brokers: Vec<BrokerMetadata>,
        pub topics: Vec<TopicMetadata>,
    }

    pub struct ConfigEntry {
        pub key: String,
        pub value: String,
    }

    pub struct CreateTopicRequest {
        pub name: String,
        pub partitions: u32,
        pub replication_factor: u16,
        pub configs: Vec<ConfigEntry>,
        /// The replicas of each partition, in partition order, first replica the preferred
        /// leader (Kafka's manual replica assignment); empty: the broker places them. When set,
        /// it gives the partition count and replication factor.
        pub replica_assignment: Appended<Vec<Vec<i32>>>,
    }

    pub struct CreateTopicResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
    }

    pub struct DeleteTopicRequest {
        pub name: String,
    }

    pub struct DeleteTopicResponse {
        pub error: ErrorCode,
    }

    pub struct ProducePartition {
        pub partition: u32,
        pub records: Records,
    }

    pub struct ProduceTopic {
        pub name: String,
        pub partitions: Vec<ProducePartition>,
    }

    pub struct ProduceRequest {
        /// [`ACKS_NONE`], [`ACKS_LEADER`] or [`ACKS_ALL`]. With no acks the broker sends no
        /// response at all.
        pub acks: i8,
        pub timeout_ms: u32,
        pub topics: Vec<ProduceTopic>,
        /// Conditional appends: per partition of `topics`, in order (topic by topic, each
        /// topic's partitions in order), the offset its records must start at, or
        /// [`NO_EXPECTED_OFFSET`]; empty when none is conditional. A partition whose log does
        /// not end there is answered [`ErrorCode::LogEndMismatch`], with nothing written.
        pub expected_offsets: Appended<Vec<i64>>,
        /// [`DURABILITY_UNREPORTED`], [`DURABILITY_REPORTED`] or [`DURABILITY_SYNCED`]; any
        /// other value is refused as [`ErrorCode::InvalidRequest`] for every partition.
        pub durability: Appended<u8>,
    }

    pub struct ProducePartitionResponse {
        pub partition: u32,
        pub error: ErrorCode,
        /// The first record's offset; with [`ErrorCode::LogEndMismatch`], the partition's log
        /// end (where the records would have gone).
        pub base_offset: u64,
        pub log_start_offset: u64,
        /// With NOT_LEADER: the node this broker believes leads the partition (-1: none known).
        pub leader_hint: i32,
    }

    pub struct ProduceTopicResponse {
        pub name: String,
        pub partitions: Vec<ProducePartitionResponse>,
    }

    /// Why a partition's batch was refused, record by record (Kafka's KIP-467): the batch was
    /// refused whole (its partition's error says how), and these records, by index in the
    /// batch, are why.
    #[derive(PartialEq, Default)]
    pub struct RecordErrors {
        pub topic: String,
        pub partition: u32,
        pub indices: Vec<u32>,
        pub message: String,
    }

    /// How far a partition's acknowledged records had got when the answer was sent. Counts are
    /// lower bounds: replicas report their progress on their next fetch.
    #[derive(PartialEq, Eq, Default, Copy)]
    pub struct AckDurability {
        /// In-sync replicas holding the records, the leader included (1: the leader's page
        /// cache only).
        pub replicas: u16,
        /// Of those, how many had synced them to disk, the leader included.
        pub synced_replicas: u16,
        /// Whether the leader had synced them.
        pub leader_synced: bool,
        /// The leader had synced every record below this offset.
        pub leader_synced_offset: u64,
    }

    pub struct ProduceResponse {
        pub topics: Vec<ProduceTopicResponse>,
        /// The partitions refused for some of their records, and which.
        pub record_errors: Appended<Vec<RecordErrors>>,
        /// With a reported durability: one per partition answered, in answer order (topic by
        /// topic); a refused partition's is all zeros.
        pub durability: Appended<Vec<AckDurability>>,
        /// Where a partition's topic stamps the broker's time into Kafka batches
        /// (`message.timestamp.type=LogAppendTime`): one per partition answered, in answer
        /// order, that time, -1 for the others; empty when no answered partition's is stamped.
        pub log_append_times: Appended<Vec<i64>>,
    }

    pub struct FetchPartition {
        pub partition: u32,
        pub fetch_offset: u64,
        pub max_bytes: u32,
    }

    pub struct FetchTopic {
        pub name: String,
        pub partitions: Vec<FetchPartition>,
    }

    pub struct FetchRequest {
        /// Long-poll: wait up to this long for `min_bytes` to be available.
        pub max_wait_ms: u32,
        pub min_bytes: u32,
        pub max_bytes: u32,
        pub topics: Vec<FetchTopic>,
        /// Kafka's `read_committed`: read only to the last stable offset (below every open
        /// transaction), and hear of the aborted transactions in the records answered, whose
        /// records the client drops. Otherwise (`read_uncommitted`) to the high watermark.
        pub read_committed: Appended<bool>,
    }

    pub struct FetchPartitionResponse {
        pub partition: u32,
        pub error: ErrorCode,
        pub high_watermark: u64,
        pub log_start_offset: u64,
        /// With NOT_LEADER: the node this broker believes leads the partition (-1: none known).
        pub leader_hint: i32,
        /// Whole stored batches, verbatim.
        pub records: Records,
    }

    pub struct FetchTopicResponse {
        pub name: String,
        pub partitions: Vec<FetchPartitionResponse>,
    }

    /// A transaction aborted in a partition's log: its producer's records from `first_offset`
    /// up to the producer's abort marker are to be dropped by a `read_committed` reader.
    #[derive(PartialEq, Default)]
    pub struct AbortedTransaction {
        pub producer_id: i64,
        pub first_offset: u64,
    }

    /// What a `read_committed` fetch of a partition adds: where stable records end, and the
    /// aborted transactions among the records answered.
    #[derive(PartialEq, Default)]
    pub struct PartitionStability {
        pub topic: String,
        pub partition: u32,
        pub last_stable_offset: u64,
        pub aborted: Vec<AbortedTransaction>,
    }

    pub struct FetchResponse {
        pub topics: Vec<FetchTopicResponse>,
        /// Each partition of a `read_committed` fetch answered without error.
        pub stability: Appended<Vec<PartitionStability>>,
    }

    pub struct ListOffsetsPartition {
        pub partition: u32,
        /// [`EARLIEST_TIMESTAMP`], [`LATEST_TIMESTAMP`], or a time in ms.
        pub timestamp: i64,
    }

    pub struct ListOffsetsTopic {
        pub name: String,
        pub partitions: Vec<ListOffsetsPartition>,
    }

    pub struct ListOffsetsRequest {
        pub topics: Vec<ListOffsetsTopic>,
        /// The latest offset is the last stable one (below every open transaction), not the
        /// high watermark.
        pub read_committed: Appended<bool>,
    }

    pub struct ListOffsetsPartitionResponse {
        pub partition: u32,
        pub error: ErrorCode,
        /// -1 when no record is at or after the timestamp.
        pub offset: i64,
        pub timestamp: i64,
    }

    pub struct ListOffsetsTopicResponse {
        pub name: String,
        pub partitions: Vec<ListOffsetsPartitionResponse>,
    }

    pub struct ListOffsetsResponse {
        pub topics: Vec<ListOffsetsTopicResponse>,
    }

    /// A follower asks the leader for the batches after its log end (DESIGN §7).
    pub struct ReplicaFetchRequest {
        pub replica_id: i32,
        pub topic: String,
        pub partition: u32,
        /// The leader epoch the follower follows; the leader refuses any other.
        pub leader_epoch: u32,
        /// Where to read from: the end of what the follower has received. Past `log_end` when
        /// the follower fetches ahead while it still writes the previous answer.
        pub fetch_offset: u64,
        /// The epoch of the last batch below `fetch_offset`; -1 when there is none.
        pub last_fetched_epoch: i64,
        /// The follower's log end: everything below it is in its log. Its progress for the ISR
        /// and the high watermark; never above `fetch_offset`.
        pub log_end: u64,
        pub max_bytes: u32,
        /// Long-poll when the follower is caught up.
        pub max_wait_ms: u32,
        /// Everything below it is synced to the follower's disk (never above `log_end`): the
        /// leader counts it in the durability its acknowledgements report.
        pub synced_offset: Appended<u64>,
        /// The follower's log start (never above `log_end`): DeleteRecords is answered once
        /// every in-sync replica's has reached the offset asked.
        pub log_start: Appended<u64>,
    }

    /// Where the follower's log left the leader's: truncate, then fetch again.
    pub struct DivergingEpoch {
        /// The leader's largest epoch not above the follower's last one; -1 when none.
        pub epoch: i64,
        /// Where that epoch ends in the leader's log.
        pub end_offset: u64,
    }

    pub struct ReplicaFetchResponse {
        pub error: ErrorCode,
        pub high_watermark: u64,
        pub log_start_offset: u64,
        /// The leader's log end when it read: a follower whose answer ends below it may ask for
        /// the next part before writing this one.
        pub log_end_offset: u64,
        pub diverging: Option<DivergingEpoch>,
        /// Whole stored batches, verbatim, starting at the fetch offset.
        pub records: Records,
    }

    /// Moves a partition to `replicas` (Kafka's reassignment): new replicas are added, catch
    /// up and join the ISR; then the replicas not in the list are dropped (leadership moves
    /// first if the leader is one of them). Empty `replicas` cancels the reassignment under
    /// way, back to the replicas it started from (Kafka's cancel).
    pub struct ReassignPartitionRequest {
        pub topic: String,
        pub partition: u32,
        pub replicas: Vec<i32>,
    }

    pub struct ReassignPartitionResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
    }

    /// `producer_id` -1: a new producer. Otherwise the producer's current id and epoch: the
    /// answer is the same id at the next epoch, which fences the older instance.
    /// A transactional producer's id and how long its transactions may stay open.
    #[derive(PartialEq, Default)]
    pub struct TransactionalInit {
        pub transactional_id: String,
        pub timeout_ms: u32,
    }

    pub struct InitProducerIdRequest {
        pub producer_id: i64,
        pub producer_epoch: i16,
        /// A transactional producer: the id's coordinator answers, fencing earlier producers
        /// of the id (and aborting their open transaction).
        pub transactional: Appended<Option<TransactionalInit>>,
    }

    pub struct InitProducerIdResponse {
        pub error: ErrorCode,
        pub producer_id: i64,
        pub producer_epoch: i16,
    }

    pub struct FindCoordinatorRequest {
        /// The group, or with `transaction` set the transactional id.
        pub group: String,
        /// The coordinator of a transactional id (Kafka's key type 1), not of a group.
        pub transaction: Appended<bool>,
    }

    pub struct FindCoordinatorResponse {
        pub error: ErrorCode,
        pub node_id: i32,
        pub host: String,
        pub port: u16,
    }

    pub struct TopicPartitions {
        pub topic: String,
        pub partitions: Vec<u32>,
    }

    pub struct JoinGroupRequest {
        pub group: String,
        /// Empty for a new member: the coordinator names it.
        pub member_id: String,
        /// `group.instance.id`: static membership.
        pub instance_id: Option<String>,
        pub client_id: String,
        pub topics: Vec<String>,
        pub session_timeout_ms: u32,
        /// The max poll interval: how long the member may take to give partitions up.
        pub rebalance_timeout_ms: u32,
        /// `range`, `roundrobin` or `sticky` (the default).
        pub assignor: String,
    }

    pub struct JoinGroupResponse {
        pub error: ErrorCode,
        pub member_id: String,
        pub generation: i32,
        pub heartbeat_interval_ms: u32,
    }

    /// Every heartbeat says what the member owns now; the answer says what it may own.
    pub struct HeartbeatRequest {
        pub group: String,
        pub member_id: String,
        pub generation: i32,
        pub owned: Vec<TopicPartitions>,
    }

    pub struct HeartbeatResponse {
        pub error: ErrorCode,
        /// The member's generation from now on (for commits).
        pub generation: i32,
        /// Exactly the partitions the member may consume now: partitions it owns but are not
        /// here are revoked; partitions here it does not own yet are assigned.
        pub assignment: Vec<TopicPartitions>,
        pub heartbeat_interval_ms: u32,
    }

    pub struct LeaveGroupRequest {
        pub group: String,
        pub member_id: String,
    }

    pub struct LeaveGroupResponse {
        pub error: ErrorCode,
    }

    pub struct OffsetCommitPartition {
        pub partition: u32,
        /// The next offset to consume.
        pub offset: u64,
        pub metadata: String,
    }

    pub struct OffsetCommitTopic {
        pub name: String,
        pub partitions: Vec<OffsetCommitPartition>,
    }

    /// All partitions commit in one store transaction, or none does. `member_id` "" with
    /// generation -1 commits outside group membership (assign mode), allowed while the group
    /// has no members.
    pub struct OffsetCommitRequest {
        pub group: String,
        pub member_id: String,
        pub generation: i32,
        pub topics: Vec<OffsetCommitTopic>,
    }

    pub struct OffsetCommitResponse {
        pub error: ErrorCode,
    }

    pub struct OffsetFetchRequest {
        pub group: String,
        /// `None`: every partition the group has committed.
        pub topics: Option<Vec<TopicPartitions>>,
        /// Refuse (UNSTABLE_OFFSET_COMMIT, retriable) while an open transaction commits
        /// offsets of the partitions asked for: a `read_committed` consumer must not start
        /// from an offset about to move (KIP-447).
        pub require_stable: Appended<bool>,
    }

    pub struct CommittedOffset {
        pub topic: String,
        pub partition: u32,
        /// -1: nothing committed.
        pub offset: i64,
        pub metadata: String,
    }

    pub struct OffsetFetchResponse {
        pub error: ErrorCode,
        pub offsets: Vec<CommittedOffset>,
    }

    pub struct ListGroupsRequest {}

    pub struct ListedGroup {
        pub group: String,
        pub generation: i32,
    }

    pub struct ListGroupsResponse {
        pub error: ErrorCode,
        pub groups: Vec<ListedGroup>,
    }

    pub struct DescribeGroupRequest {
        pub group: String,
    }

    pub struct GroupMember {
        pub member_id: String,
        pub instance_id: Option<String>,
        pub client_id: String,
        pub generation: i32,
        pub assignment: Vec<TopicPartitions>,
    }

    pub struct DescribeGroupResponse {
        pub error: ErrorCode,
        pub group: String,
        pub generation: i32,
        /// `Empty`, `Stable` or `Reconciling`.
        pub state: String,
        pub assignor: String,
        pub members: Vec<GroupMember>,
        pub offsets: Vec<CommittedOffset>,
    }

    /// Grows `topic` to `partitions` partitions in total (never shrinks).
    pub struct CreatePartitionsRequest {
        pub topic: String,
        pub partitions: u32,
        /// The replicas of each new partition, in partition order (Kafka's CreatePartitions
        /// assignment); empty: the broker places them. Each needs the topic's replication
        /// factor.
        pub replica_assignment: Appended<Vec<Vec<i32>>>,
    }

    pub struct CreatePartitionsResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
    }

    /// Moves each partition's leadership to its preferred replica (the first of its replicas)
    /// where that replica is live, in sync and not leading: what the controller does every
    /// leader-rebalance interval, now. `topic` empty: every topic. `partitions` names some of
    /// `topic`'s (empty: all), and each named one gets a result. `unclean` instead gives a
    /// partition with no live in-sync replica a live replica outside the ISR as its leader
    /// (Kafka's unclean election), whatever the topic's `unclean.leader.election.enable`.
    pub struct ElectLeadersRequest {
        pub topic: String,
        pub partitions: Appended<Vec<u32>>,
        pub unclean: Appended<bool>,
    }

    /// One partition's election: `None` when its leader moved, `ElectionNotNeeded` when the
    /// wanted replica already leads, `PreferredLeaderNotAvailable` or
    /// `EligibleLeadersNotAvailable` when no replica can take it.
    #[derive(Default, PartialEq, Eq)]
    pub struct ElectionResult {
        pub topic: String,
        pub partition: u32,
        pub error: ErrorCode,
        pub message: String,
    }

    pub struct ElectLeadersResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
        /// Leaderships moved.
        pub moved: u32,
        /// Each partition named, and each partition of an election over whole topics whose
        /// leader moved or could not.
        pub results: Appended<Vec<ElectionResult>>,
    }

    /// One step of a SASL exchange (SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN), before any other
    /// request on a listener that asks for authentication; `token` is the mechanism's message.
    pub struct AuthenticateRequest {
        pub mechanism: String,
        pub token: String,
    }

    pub struct AuthenticateResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
        /// The server's next message (SCRAM's challenge, then its proof).
        pub token: String,
        /// Whether the exchange is over and the connection authenticated.
        pub authenticated: bool,
        /// The session lasts this long, then the client must authenticate again (0: forever).
        pub session_lifetime_ms: u64,
    }

    /// A user and the SCRAM mechanisms it has credentials for.
    pub struct UserCredentials {
        pub name: String,
        pub mechanisms: Vec<String>,
        pub iterations: Vec<u32>,
    }

    pub struct DescribeUsersRequest {
        pub users: Option<Vec<String>>,
    }

    pub struct DescribeUsersResponse {
        pub error: ErrorCode,
        pub message: String,
        pub users: Vec<UserCredentials>,
    }

    /// Sets a user's SCRAM credential for `mechanism` from a salted password the client
    /// computed (the password itself never travels), or with `delete`, removes it.
    pub struct AlterUserRequest {
        pub user: String,
        pub mechanism: String,
        pub delete: bool,
        pub iterations: u32,
        /// Base64.
        pub salt: String,
        /// Base64 of `Hi(password, salt, iterations)`.
        pub salted_password: String,
    }

    pub struct AlterUserResponse {
        pub error: ErrorCode,
        pub message: String,
    }

    /// An ACL binding with Kafka's names (`Topic`, `Prefixed`, `User:alice`, `*`, `Write`,
    /// `Allow`); in a filter, an empty field matches anything.
    pub struct AclEntry {
        pub resource_type: String,
        pub resource_name: String,
        pub pattern_type: String,
        pub principal: String,
        pub host: String,
        pub operation: String,
        pub permission: String,
    }

    pub struct DescribeAclsRequest {
        pub filter: AclEntry,
    }

    pub struct DescribeAclsResponse {
        pub error: ErrorCode,
        pub message: String,
        pub acls: Vec<AclEntry>,
    }

    pub struct CreateAclsRequest {
        pub acls: Vec<AclEntry>,
    }

    pub struct CreateAclsResponse {
        pub error: ErrorCode,
        pub message: String,
    }

    /// Removes every binding `filter` matches (exact names, or empty for any).
    pub struct DeleteAclsRequest {
        pub filter: AclEntry,
    }

    pub struct DeleteAclsResponse {
        pub error: ErrorCode,
        pub message: String,
        pub deleted: Vec<AclEntry>,
    }

    /// Removes `group` (its record and committed offsets), if it has no members.
    pub struct DeleteGroupRequest {
        pub group: String,
    }

    pub struct DeleteGroupResponse {
        pub error: ErrorCode,
    }

    /// Moves each partition's log start up to `offset` (Kafka's DeleteRecords): records below
    /// it are gone for every reader; -1 means the high watermark. Followers follow.
    pub struct DeleteRecordsPartition {
        pub partition: u32,
        pub offset: i64,
    }

    pub struct DeleteRecordsTopic {
        pub name: String,
        pub partitions: Vec<DeleteRecordsPartition>,
    }

    pub struct DeleteRecordsRequest {
        pub topics: Vec<DeleteRecordsTopic>,
    }

    /// The partition's log start after the delete (Kafka's low watermark), or why not
    /// (`OffsetOutOfRange` past the high watermark, `NotLeader`).
    pub struct DeletedRecordsPartition {
        pub partition: u32,
        pub error: ErrorCode,
        pub log_start_offset: i64,
    }

    pub struct DeletedRecordsTopic {
        pub name: String,
        pub partitions: Vec<DeletedRecordsPartition>,
    }

    pub struct DeleteRecordsResponse {
        pub topics: Vec<DeletedRecordsTopic>,
    }

    /// Forgets `group`'s committed offsets of these partitions (Kafka's OffsetDelete): each
    /// is refused with `GroupSubscribedToTopic` while a member of the group subscribes to its
    /// topic.
    pub struct DeleteOffsetsRequest {
        pub group: String,
        pub topics: Vec<TopicPartitions>,
    }

    pub struct PartitionError {
        pub partition: u32,
        pub error: ErrorCode,
    }

    pub struct DeleteOffsetsTopic {
        pub name: String,
        pub partitions: Vec<PartitionError>,
    }

    /// `error` for the whole group (`GroupIdNotFound`, `NotCoordinator`), else each
    /// partition's.
    pub struct DeleteOffsetsResponse {
        pub error: ErrorCode,
        pub topics: Vec<DeleteOffsetsTopic>,
    }

    /// One part of a client quota entity, with Kafka's names: `kind` is `user` or
    /// `client-id`; `name` is `None` for the default.
    pub struct QuotaEntityPart {
        pub kind: String,
        pub name: Option<String>,
    }

    /// A quota (`producer_byte_rate`, `consumer_byte_rate`, `request_percentage`) and its value.
    pub struct QuotaValue {
        pub key: String,
        pub value: f64,
    }

    pub struct QuotaEntry {
        pub entity: Vec<QuotaEntityPart>,
        pub values: Vec<QuotaValue>,
    }

    /// Kafka's filter component: `match_type` 0 is `name` exactly, 1 the default, 2 any.
    pub struct QuotaFilterPart {
        pub kind: String,
        pub match_type: u8,
        pub name: Option<String>,
    }

    /// The client quotas every filter part matches (all of them, without parts); with
    /// `strict`, only entities without other parts (`strata quota list`).
    pub struct DescribeQuotasRequest {
        pub filter: Vec<QuotaFilterPart>,
        pub strict: bool,
    }

    pub struct DescribeQuotasResponse {
        pub error: ErrorCode,
        pub message: String,
        pub entries: Vec<QuotaEntry>,
    }

    /// Sets (`remove` false) or removes a quota of an entity.
    pub struct QuotaChange {
        pub key: String,
        pub value: f64,
        pub remove: bool,
    }

    pub struct QuotaAlteration {
        pub entity: Vec<QuotaEntityPart>,
        pub changes: Vec<QuotaChange>,
    }

    /// Changes client quotas (`strata quota set|remove`): the valid entries together.
    pub struct AlterQuotasRequest {
        pub entries: Vec<QuotaAlteration>,
        pub validate_only: bool,
    }

    pub struct QuotaAlterResult {
        pub error: ErrorCode,
        pub message: String,
    }

    /// One result per entry, in order; `error` refuses the whole request.
    pub struct AlterQuotasResponse {
        pub error: ErrorCode,
        pub results: Vec<QuotaAlterResult>,
    }

    /// A broker's settings: with `broker`, every setting that broker runs with (asked of
    /// that broker: only it knows what it started with); without, the settings set live for
    /// every broker (`strata cluster config list`).
    pub struct DescribeBrokerConfigsRequest {
        pub broker: Option<i32>,
    }

    /// One broker setting. `source`: 0 nobody set it, 1 set at start, 2 set live for every
    /// broker, 3 set live for this broker. `live`: it can change while the broker runs.
    pub struct BrokerConfigEntry {
        pub name: String,
        pub value: Option<String>,
        pub source: u8,
        pub live: bool,
    }

    pub struct DescribeBrokerConfigsResponse {
        pub error: ErrorCode,
        pub message: String,
        /// In name order.
        pub entries: Vec<BrokerConfigEntry>,
    }

    /// Changes the settings set live of one broker (`broker`) or of every broker: `set` adds
    /// or replaces, `delete` removes; with `replace`, `set` becomes the whole of them. Checked
    /// as a whole; nothing changes if any of it is refused.
    pub struct AlterBrokerConfigsRequest {
        pub broker: Option<i32>,
        pub set: Vec<ConfigEntry>,
        pub delete: Vec<String>,
        pub replace: bool,
        pub validate_only: bool,
    }

    pub struct AlterBrokerConfigsResponse {
        pub error: ErrorCode,
        pub message: String,
    }

    /// Every config `group` may set (Kafka's GROUP config resource; `strata group config`),
    /// whether or not the group exists. Any broker answers, from the cluster view.
    pub struct DescribeGroupConfigsRequest {
        pub group: String,
    }

    /// One config of a group: its value, set on the group (`set`) or else the default.
    pub struct GroupConfigEntry {
        pub name: String,
        pub value: String,
        pub set: bool,
    }

    pub struct DescribeGroupConfigsResponse {
        pub error: ErrorCode,
        pub message: String,
        /// Every group config, in the broker's order.
        pub entries: Vec<GroupConfigEntry>,
    }

    /// Changes `group`'s configs: `set` adds or replaces, `delete` goes back to the default;
    /// with `replace`, `set` becomes the whole of them. Checked as a whole (names, values,
    /// the configs left agreeing); nothing changes if any of it is refused.
    pub struct AlterGroupConfigsRequest {
        pub group: String,
        pub set: Vec<ConfigEntry>,
        pub delete: Vec<String>,
        pub replace: bool,
        pub validate_only: bool,
    }

    /// `error` INVALID_CONFIG, with `message` naming what, for a change the group may not
    /// have.
    pub struct AlterGroupConfigsResponse {
        pub error: ErrorCode,
        pub message: String,
    }

    /// A transactional producer as the coordinator knows it.
    pub struct TxnProducer {
        pub transactional_id: String,
        pub producer_id: i64,
        pub producer_epoch: i16,
    }

    pub struct AddPartitionsToTxnRequest {
        pub producer: TxnProducer,
        pub topics: Vec<TopicPartitions>,
    }

    pub struct AddOffsetsToTxnRequest {
        pub producer: TxnProducer,
        pub group: String,
    }

    pub struct EndTxnRequest {
        pub producer: TxnProducer,
        pub commit: bool,
    }

    /// Offsets the transaction commits for `group`, sent to the group's coordinator once the
    /// group was added to the transaction (AddOffsetsToTxn).
    pub struct TxnOffsetCommitRequest {
        pub producer: TxnProducer,
        pub group: String,
        pub member_id: String,
        pub generation: i32,
        pub topics: Vec<OffsetCommitTopic>,
    }

    /// The answer to the transaction APIs: the whole request succeeded or failed.
    pub struct TxnResponse {
        pub error: ErrorCode,
    }

    /// A decided transaction's marker, for each partition named (their leader is the broker
    /// asked).
    pub struct WriteTxnMarkersRequest {
        pub producer_id: i64,
        pub producer_epoch: i16,
        pub commit: bool,
        pub coordinator_epoch: i32,
        pub topics: Vec<TopicPartitions>,
        /// Groups whose offsets the transaction commits (their coordinator is the broker
        /// asked).
        pub groups: Vec<String>,
    }

    pub struct MarkerWritten {
        pub topic: String,
        pub partition: u32,
        pub error: ErrorCode,
    }

    pub struct GroupSettled {
        pub group: String,
        pub error: ErrorCode,
    }

    pub struct WriteTxnMarkersResponse {
        pub partitions: Vec<MarkerWritten>,
        pub groups: Vec<GroupSettled>,
    }

    pub struct DescribeTransactionsRequest {
        pub transactional_ids: Vec<String>,
    }

    /// A transactional id as its coordinator keeps it.
    pub struct TransactionDescription {
        pub transactional_id: String,
        pub error: ErrorCode,
        /// Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
        /// CompleteAbort.
        pub state: String,
        pub producer_id: i64,
        pub producer_epoch: i16,
        pub timeout_ms: u32,
        /// When the open transaction began (ms since the epoch; -1 with none open).
        pub started_ms: i64,
        /// The open transaction's partitions and the groups whose offsets it commits.
        pub partitions: Vec<TopicPartitions>,
        pub groups: Vec<String>,
    }

    pub struct DescribeTransactionsResponse {
        pub transactions: Vec<TransactionDescription>,
    }

    /// Filters (empty: all): states by name, producer ids; how long the transaction has run
    /// at least (its open transaction's start to now, ms; an id with none open counts as
    /// running since ever, as in Kafka); ids matching a regular expression (RE2 syntax,
    /// the whole id).
    pub struct ListTransactionsRequest {
        pub states: Vec<String>,
        pub producer_ids: Vec<i64>,
        pub running_longer_than_ms: Appended<Option<u64>>,
        pub id_pattern: Appended<Option<String>>,
    }

    pub struct ListedTransaction {
        pub transactional_id: String,
        pub producer_id: i64,
        pub state: String,
    }

    pub struct ListTransactionsResponse {
        pub error: ErrorCode,
        pub transactions: Vec<ListedTransaction>,
    }

    /// Changes `topic`'s config overrides in one step: `set` adds or replaces, `delete` goes
    /// back to the default. Validated as a whole; nothing changes if any of it is invalid.
    pub struct AlterTopicConfigRequest {
        pub topic: String,
        pub set: Vec<ConfigEntry>,
        pub delete: Vec<String>,
    }

    pub struct AlterTopicConfigResponse {
        pub error: ErrorCode,
        /// For people: why, when `error` is not `None`.
        pub message: String,
    }

    pub struct DescribeTopicConfigRequest {
        pub topic: String,
    }

    /// One setting of a topic: its effective value, and whether the topic overrides the default.
    pub struct TopicConfigEntry {
        pub key: String,
        pub value: String,
        pub is_override: bool,
    }

    pub struct DescribeTopicConfigResponse {
        pub error: ErrorCode,
        /// Every setting a topic has, in a stable order.
        pub configs: Vec<TopicConfigEntry>,
    }
}

mod share;
pub use share::*;
