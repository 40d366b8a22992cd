//! The shard as a follower's network: a followed partition's fetches go over QUIC to the
//! leader's owning shard. The loop itself is [`crate::replicator::follow`].

use std::net::SocketAddr;

use strata_wire::protocol::ReplicaFetchRequest;

use crate::replicator::{ReplicaFetchAnswer, ReplicaNetwork};
use crate::server::quic::QuicError;
use crate::server::shard::{Shard, shard_of};

impl Shard {
    /// Where the leader's owning shard takes replication fetches for this partition.
    pub(in crate::server::shard) fn replication_target(
        &self,
        leader: i32,
        topic: &str,
        partition: u32,
    ) -> Option<(SocketAddr, String)> {
        self.replication_address(leader, |shards| shard_of(topic, partition, shards))
    }

    /// The replication (QUIC) address of shard `pick(its shard count)` of broker `broker_id`,
    /// and the name it presents.
    pub(in crate::server::shard) fn replication_address(
        &self,
        broker_id: i32,
        pick: impl FnOnce(usize) -> usize,
    ) -> Option<(SocketAddr, String)> {
        let view = self.view.borrow();
        let broker = view.brokers.iter().find(|broker| broker.id == broker_id)?;
        let shard = pick(broker.replication_ports.len().max(1));
        let port = *broker.replication_ports.get(shard)?;
        // The broker's identity (TLS server name) is its advertised host wherever it replicates.
        let host = broker.replication_host.as_deref().unwrap_or(&broker.host);
        let addr = format!("{host}:{port}").parse().ok().or_else(|| {
            use std::net::ToSocketAddrs;
            (host, port).to_socket_addrs().ok()?.next()
        })?;
        Some((addr, broker.host.clone()))
    }
}

impl ReplicaNetwork for Shard {
    type Error = QuicError;

    async fn replica_fetch(
        &self,
        leader: i32,
        request: ReplicaFetchRequest,
        records_phase: Option<usize>,
    ) -> Result<ReplicaFetchAnswer, QuicError> {
        let unknown = |reason: &str| QuicError::NoRoute {
            broker: leader,
            reason: reason.to_string(),
        };
        let (addr, host) = self
            .replication_target(leader, &request.topic, request.partition)
            .ok_or_else(|| unknown("its replication address is not known"))?;
        let quic = self
            .quic
            .as_ref()
            .ok_or_else(|| unknown("this node has no replication endpoint"))?;
        let answer = quic
            .replica_fetch(addr, &host, request, records_phase)
            .await;
        if let Err(error @ QuicError::Malformed { .. }) = &answer {
            tracing::error!(leader, "{error}");
        }
        answer
    }

    fn replicated(&self, topic: &str, bytes: u64, elapsed_us: u64) {
        self.metrics.replicated(topic, bytes, elapsed_us);
    }

    async fn state_below(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Option<crate::log::StateBelow> {
        self.remote_state_below(topic, partition, offset).await
    }
}
