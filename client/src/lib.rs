//! `strata-client`: the Rust client for Strata.
//!
//! - [`Client`]: bootstrap, metadata, admin calls (create/delete topics, list offsets).
//! - [`Producer`]: batches records per partition (`linger`, `batch_bytes`), key-hash partitioner
//!   (keyless records fill one partition a batch at a time: Kafka's sticky partitioner),
//!   acks 0/1/all, retries with backoff on retriable errors, a future per record that resolves to
//!   (partition, offset), idempotence on request. A partition's batches are written in order
//!   (up to `max_in_flight` awaiting answers); batches of many partitions bound for one leader
//!   shard share a produce request.
//! - [`Consumer`]: assign mode, seek to beginning/end/offset/timestamp, fetch with long-poll, and
//!   zero-copy records borrowed from the fetched batches.
//! - [`GroupConsumer`]: subscribe mode in a consumer group (server-side cooperative assignment,
//!   rebalance callbacks, auto/sync/async commits, at-least-once or at-most-once).
//! - [`ShareConsumer`]: a member of a share group (KIP-932, queues): records handed to one
//!   member at a time, each acknowledged (implicitly by the next poll, or explicitly), with
//!   its delivery count.
//!
//! Shard-aware: requests for a partition go to the shard port that owns it, so the broker never
//! forwards them across cores.

mod connection;
mod consumer;
mod group;
mod metadata;
mod producer;
mod security;
mod share;
mod timer;
mod transactions;

pub use connection::Connection;
pub use consumer::{ConsumedBatch, Consumer, ConsumerConfig, IsolationLevel, OffsetReset, SeekTo};
pub use group::{Delivery, GroupConfig, GroupConsumer, RebalanceEvent, TopicPartition};
pub use metadata::{Client, ClientConfig, ClusterMetadata};
pub use producer::{
    Producer, ProducerConfig, ProducerRecord, RecordFuture, RecordMetadata, partition_for_key,
};
pub use security::{SaslCredentials, Security, tls_config};
pub use share::{AckMode, ShareConfig, ShareConsumer, ShareRecord};
pub use strata_net::{
    DEFAULT_TCP_CONGESTION, FrameReader, HOST_TCP_CONGESTION, apply_tcp_congestion,
    parse_tcp_congestion, tcp_congestion, write_all_chunks,
};
pub use strata_wire::batch::Codec;
pub use strata_wire::protocol::{AckDurability, AckType, ErrorCode};
pub use timer::PreciseTimer;

use std::net::SocketAddr;

/// Everything a client call can fail with. Cloneable, so one failure can answer many waiters.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: SocketAddr, reason: String },
    #[error("no broker reachable (bootstrap: {0})")]
    NoBrokers(String),
    #[error("connection lost: {0}")]
    Disconnected(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The broker refused the whole request.
    #[error("broker error: {0}")]
    Broker(ErrorCode),
    /// The broker refused one partition's part of a request.
    #[error("{topic}-{partition}: {code}")]
    Partition {
        topic: String,
        partition: u32,
        code: ErrorCode,
    },
    /// A conditional append ([`Producer::send_if`]) found the partition ending elsewhere:
    /// another writer got there first. Nothing was written; `log_end` is where it ends.
    #[error("{topic}-{partition}: the log ends at {log_end}, not where expected")]
    LogEndMismatch {
        topic: String,
        partition: u32,
        log_end: u64,
    },
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("topic {topic} has no partition {partition}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("the producer is closed")]
    Closed,
    /// The broker refused the credentials, or the TLS handshake failed.
    #[error("authentication failed: {0}")]
    Authentication(String),
}

impl ClientError {
    /// Whether retrying (after a metadata refresh) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::Disconnected(_)
            | ClientError::Timeout(_) => true,
            ClientError::Broker(code) | ClientError::Partition { code, .. } => code.is_retriable(),
            _ => false,
        }
    }

    /// The broker's code, if this is a broker error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker(code) | ClientError::Partition { code, .. } => Some(*code),
            ClientError::LogEndMismatch { .. } => Some(ErrorCode::LogEndMismatch),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> ClientError {
        ClientError::Disconnected(error.to_string())
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}
