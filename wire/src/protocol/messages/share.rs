//! Share groups (KIP-932, queues): Strata's own messages for them.
//!
//! A member joins with [`ShareGroupHeartbeatRequest`] at the group's coordinator (as a consumer
//! group member does), hears which partitions it is assigned by topic name, and fetches from
//! each partition's leader with [`ShareFetchRequest`], which acquires records (each delivered
//! to one member at a time, under a lock) and carries the acknowledgements of records acquired
//! before; [`ShareAcknowledgeRequest`] acknowledges without fetching (a commit, a close).
//!
//! Stateless where Kafka keeps share sessions: every native fetch names the partitions it
//! fetches, with no session epoch. Kafka's incremental sessions save a large consumer from
//! resending hundreds of partition ids per fetch and let the broker release a closed
//! session's records; a native member fetches only the few partitions its leader's shard
//! owns (the client sends one fetch per leader shard), so naming them costs a few bytes, and
//! nothing per connection must be kept, expired or found again after a reconnect or on
//! another shard. What a session's close did, [`ShareAcknowledgeRequest::release_remaining`]
//! does: the member's records still held on the partitions named are given back.

use super::super::ErrorCode;
use super::super::codec::{DecodeError, Decoder, Encoder, Records};
use super::{TopicPartitions, Wire};

/// How a record acquired from a share group is acknowledged; the numbers are Kafka's
/// `AcknowledgeType`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum AckType {
    /// No record is at the offset (a transaction marker, a record compacted away): done.
    Gap = 0,
    /// Processed: done.
    #[default]
    Accept = 1,
    /// Given back: delivered again, to this member or another (its delivery count grows).
    Release = 2,
    /// Not processable: archived (and written to the group's dead-letter topic if it has
    /// one), never delivered again.
    Reject = 3,
    /// Still being processed: the lock lasts another lock duration (KIP-1222).
    Renew = 4,
}

impl AckType {
    pub fn from_u8(value: u8) -> Option<AckType> {
        Some(match value {
            0 => AckType::Gap,
            1 => AckType::Accept,
            2 => AckType::Release,
            3 => AckType::Reject,
            4 => AckType::Renew,
            _ => return None,
        })
    }
}

impl Wire for AckType {
    const MIN_LEN: usize = 1;
    fn encode(self, encoder: &mut Encoder) {
        encoder.put_u8(self as u8);
    }
    fn decode(decoder: &mut Decoder) -> Result<Self, DecodeError> {
        let value = decoder.get_u8()?;
        AckType::from_u8(value).ok_or(DecodeError::InvalidValue {
            field: "ack_type",
            value: i64::from(value),
        })
    }
}

messages! {
    /// `member_epoch` 0 joins (naming `topics`), -1 leaves, any other is the member's epoch as
    /// last answered. The member chooses its id (unique, kept for its whole life, also across
    /// joins after a fence).
    pub struct ShareGroupHeartbeatRequest {
        pub group: String,
        pub member_id: String,
        pub member_epoch: i32,
        /// The topics it subscribes to; `None`: unchanged since its last heartbeat.
        pub topics: Option<Vec<String>>,
        /// For people: who the member is (`strata group describe` shows it).
        pub client_id: String,
    }

    /// `error` `FencedMemberEpoch` or `UnknownMemberId`: join again at epoch 0;
    /// `InconsistentGroupProtocol`: the group id is a consumer group's.
    pub struct ShareGroupHeartbeatResponse {
        pub error: ErrorCode,
        /// The epoch the member's next heartbeat carries (-1 after a leave).
        pub member_epoch: i32,
        pub heartbeat_interval_ms: u32,
        /// The member's partitions by topic name, when they changed since it last heard
        /// (`None`: unchanged). A partition may be assigned to several members at once: its
        /// leader hands each record to one of them.
        pub assignment: Option<Vec<TopicPartitions>>,
    }

    /// Acknowledgements of the offsets `first_offset..=last_offset`: `types` holds one type
    /// for all of them, or one per offset.
    pub struct AcknowledgementBatch {
        pub first_offset: u64,
        pub last_offset: u64,
        pub types: Vec<AckType>,
    }

    pub struct ShareFetchPartition {
        pub partition: u32,
        /// Acquire records of it (false: only acknowledge, e.g. a partition no longer
        /// assigned to the member).
        pub acquire: bool,
        /// Applied before records are acquired, all or none per partition.
        pub acknowledgements: Vec<AcknowledgementBatch>,
    }

    pub struct ShareFetchTopic {
        pub name: String,
        pub partitions: Vec<ShareFetchPartition>,
    }

    /// Sent to the leader of the partitions named (any shard of it answers; the owning
    /// shard's port saves a hop). Stateless: see the module's documentation.
    pub struct ShareFetchRequest {
        pub group: String,
        pub member_id: String,
        /// Long-poll: wait up to this long for records to acquire.
        pub max_wait_ms: u32,
        /// The most records acquired over all partitions (0: the broker's default, 500).
        pub max_records: u32,
        /// The most bytes read from one partition (0: the broker's default, 8 MiB).
        pub max_bytes: u32,
        pub topics: Vec<ShareFetchTopic>,
    }

    /// A run of offsets acquired with the same delivery count (1 on first delivery).
    #[derive(PartialEq, Eq, Copy)]
    pub struct AcquiredRecords {
        pub first_offset: u64,
        pub last_offset: u64,
        pub delivery_count: u16,
    }

    pub struct ShareFetchPartitionResponse {
        pub partition: u32,
        /// Why no records were acquired (`NotLeader`: refresh metadata and fetch from the new
        /// leader).
        pub error: ErrorCode,
        /// How the partition's acknowledgements went: `InvalidRecordState` when one names a
        /// record the member does not hold (then none of them was applied).
        pub acknowledge_error: ErrorCode,
        /// Only the offsets in these runs are the member's; other records of `records` are
        /// not (they share a batch with acquired ones).
        pub acquired: Vec<AcquiredRecords>,
        /// Whole stored batches holding the acquired records, verbatim (either format, as
        /// the native fetch carries them).
        pub records: Records,
    }

    pub struct ShareFetchTopicResponse {
        pub name: String,
        pub partitions: Vec<ShareFetchPartitionResponse>,
    }

    /// One answer per partition named, in request order.
    pub struct ShareFetchResponse {
        /// How long the member holds what it acquired before the records go to another.
        pub acquisition_lock_timeout_ms: u32,
        pub topics: Vec<ShareFetchTopicResponse>,
    }

    pub struct ShareAcknowledgePartition {
        pub partition: u32,
        pub acknowledgements: Vec<AcknowledgementBatch>,
    }

    pub struct ShareAcknowledgeTopic {
        pub name: String,
        pub partitions: Vec<ShareAcknowledgePartition>,
    }

    /// Sent to the leader of the partitions named; answered once the acknowledgements are
    /// stored.
    pub struct ShareAcknowledgeRequest {
        pub group: String,
        pub member_id: String,
        pub topics: Vec<ShareAcknowledgeTopic>,
        /// After the acknowledgements, give back every record the member still holds on the
        /// partitions named (it is closing: what Kafka's closing of a share session does).
        pub release_remaining: bool,
    }

    pub struct ShareAcknowledgeTopicResponse {
        pub name: String,
        pub partitions: Vec<super::PartitionError>,
    }

    pub struct ShareAcknowledgeResponse {
        pub topics: Vec<ShareAcknowledgeTopicResponse>,
    }

    pub struct DescribeShareGroupRequest {
        pub group: String,
    }

    pub struct ShareGroupMember {
        pub member_id: String,
        pub client_id: String,
        pub client_host: String,
        pub member_epoch: i32,
        pub topics: Vec<String>,
        pub assignment: Vec<TopicPartitions>,
    }

    /// `error` `GroupIdNotFound` when no share group of that name has members or stored
    /// state (it may be a consumer group).
    pub struct DescribeShareGroupResponse {
        pub error: ErrorCode,
        pub group: String,
        pub epoch: i32,
        /// `Empty` or `Stable`.
        pub state: String,
        pub members: Vec<ShareGroupMember>,
        /// The partitions the group holds state for or has assigned: ask their leaders
        /// (`DescribeSharePartitions`) where it stands on them.
        pub partitions: Vec<TopicPartitions>,
    }

    /// Sent to the leader of the partitions named.
    pub struct DescribeSharePartitionsRequest {
        pub group: String,
        pub topics: Vec<TopicPartitions>,
    }

    /// Where a share group stands on a partition (`error` `GroupIdNotFound`: it holds no
    /// state there yet).
    pub struct SharePartitionDescription {
        pub topic: String,
        pub partition: u32,
        pub error: ErrorCode,
        /// Every record below it is done (acknowledged or archived).
        pub start_offset: u64,
        /// The first offset never read into the window of records in flight.
        pub end_offset: u64,
        /// Records from the start offset on not done yet (available again or acquired).
        pub in_flight: u64,
        /// Of those, acquired by a member now.
        pub acquired: u64,
        pub high_watermark: u64,
        /// Records not yet done: those in flight and those past the window, up to the high
        /// watermark.
        pub lag: u64,
        /// The timestamp (ms) of the record at the start offset, the oldest not done: its
        /// age is the lag in seconds. `None` when there is none (caught up) or it could not
        /// be read.
        pub oldest_timestamp_ms: Option<i64>,
    }

    pub struct DescribeSharePartitionsResponse {
        pub partitions: Vec<SharePartitionDescription>,
    }
}
