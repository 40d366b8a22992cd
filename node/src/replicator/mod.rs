//! Replication's drivers: the IO around the sans-IO state machines of [`crate::replication`].
//!
//! [`follow`] is a follower's loop: it carries out what a [`crate::replication::Follower`]
//! decides, over a [`ReplicaNetwork`] and the partition's log task. [`serve_fetch`] answers a
//! follower's fetch on the leader: a [`crate::replication::Leader`] plans it, the log reads it,
//! and a [`LeaderHost`] (the shard, or a simulated broker) holds the leader state and the
//! effects outside this partition (ISR writes, throttles, metrics).
//!
//! Nothing here knows about shards, QUIC or the coordinator: the broker runs these drivers over
//! QUIC and its partitions' map (`server::shard::replica`), and the replication simulator
//! (`node/tests/replication_sim.rs`) runs the same drivers over an in-memory network, simulated
//! storage and virtual time.
//!
//! Arrows: `replicator` → `log`, `replication`, `clock`; nothing below it points back.

// The shards are single-threaded (thread per core): these futures are deliberately not `Send`.
#![allow(async_fn_in_trait)]

mod follower;
mod leader;

pub use follower::{FollowedPartition, follow, last_batch_header};
pub use leader::{LeaderHost, PartitionRole, replica_fetch_error, serve_fetch};

use strata_wire::protocol::{ReplicaFetchRequest, ReplicaFetchResponse};

use crate::log::PlacedBatches;

/// A leader's answer to a follower's fetch, as the network delivered it.
pub struct ReplicaFetchAnswer {
    pub response: ReplicaFetchResponse,
    /// The records, already placed where a direct write of them can take them (QUIC reads
    /// them so); `None` when they are in `response.records`.
    pub placed: Option<PlacedBatches>,
}

/// The follower's side of the replication network: QUIC between brokers in production, an
/// in-memory network in the simulator.
pub trait ReplicaNetwork: 'static {
    type Error: std::fmt::Display;

    /// Sends `request` to broker `leader` (to its shard that owns the partition) and waits for
    /// the answer. `records_phase` is where in a direct-write block the answer's records will
    /// start in the log, so a network that reads them from a socket can place them there.
    async fn replica_fetch(
        &self,
        leader: i32,
        request: ReplicaFetchRequest,
        records_phase: Option<usize>,
    ) -> Result<ReplicaFetchAnswer, Self::Error>;

    /// An answer of `bytes` was appended, `elapsed_us` after its fetch was sent.
    fn replicated(&self, _topic: &str, _bytes: u64, _elapsed_us: u64) {}

    /// What a follower starting over at `offset` (its leader's log start) takes from below it:
    /// the producer state and leader epochs there, which a tiered partition's remote tier
    /// holds beside the segment ending at `offset`. `None`: it starts with none.
    async fn state_below(
        &self,
        _topic: &str,
        _partition: u32,
        _offset: u64,
    ) -> Option<crate::log::StateBelow> {
        None
    }
}
