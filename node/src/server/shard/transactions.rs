//! Transaction markers: a coordinator's decided transaction written to each partition this
//! broker leads (a control batch, answered once every in-sync replica has it, as an
//! `acks=all` produce is), and sent on over QUIC to the brokers that lead the others; the
//! transaction's group offsets handed to the group thread of the broker coordinating each
//! group.

use std::rc::Rc;

use bytes::BytesMut;
use strata_wire::protocol::{
    ACKS_ALL, ErrorCode, GroupSettled, MarkerWritten, Request, Response, TopicPartitions,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use tokio::sync::oneshot;

use super::Shard;
use crate::log::AppendSource;
use crate::log::writer::AnswerWhen;
use crate::server::groups::coordinator_of;
use crate::server::messages::{AckTerms, GroupMessage};

/// How long a marker may wait for the in-sync replicas before the coordinator hears it
/// failed (and writes it again).
const MARKER_TIMEOUT_MS: u32 = 30_000;

/// What every marker of one decided transaction says.
#[derive(Debug, Clone, Copy)]
struct Marker {
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
}

impl Shard {
    /// Writes the markers of `request` to its partitions and settles its groups. `forward`:
    /// partitions led, and groups coordinated, by other brokers are sent on to them (the
    /// coordinator's own broker); a broker a peer asks writes only its own.
    pub(in crate::server) async fn write_txn_markers(
        self: &Rc<Self>,
        request: WriteTxnMarkersRequest,
        forward: bool,
    ) -> WriteTxnMarkersResponse {
        let marker = Marker {
            producer_id: request.producer_id,
            producer_epoch: request.producer_epoch,
            commit: request.commit,
            coordinator_epoch: request.coordinator_epoch,
        };
        let mut work = Vec::new();
        for topic in request.topics {
            for partition in topic.partitions {
                let shard = self.clone();
                let topic = topic.topic.clone();
                work.push(async move {
                    let error = shard
                        .write_marker(topic.clone(), partition, marker, forward)
                        .await;
                    MarkerWritten {
                        topic,
                        partition,
                        error,
                    }
                });
            }
        }
        let partitions = futures_util::future::join_all(work).await;
        let mut groups = Vec::with_capacity(request.groups.len());
        for group in request.groups {
            let error = self.settle_txn_offsets(&group, marker, forward).await;
            groups.push(GroupSettled { group, error });
        }
        WriteTxnMarkersResponse { partitions, groups }
    }

    async fn write_marker(
        self: &Rc<Self>,
        topic: String,
        partition: u32,
        marker: Marker,
        forward: bool,
    ) -> ErrorCode {
        match self.route(&topic, partition) {
            Ok(owner) => self
                .run_on(owner, move |shard| async move {
                    shard.write_marker_local(&topic, partition, marker).await
                })
                .await
                .unwrap_or(ErrorCode::NotReady),
            Err(ErrorCode::NotLeader) if forward => {
                let leader = self.leader_hint(&topic, partition, ErrorCode::NotLeader);
                let Some((addr, host)) = self.replication_target(leader, &topic, partition) else {
                    return ErrorCode::NotLeader;
                };
                let request = marker_request(
                    marker,
                    vec![TopicPartitions {
                        topic,
                        partitions: vec![partition],
                    }],
                    Vec::new(),
                );
                match self.call_peer(addr, &host, request).await {
                    Some(answer) => answer
                        .partitions
                        .first()
                        .map_or(ErrorCode::NotLeader, |written| written.error),
                    None => ErrorCode::NotLeader,
                }
            }
            Err(error) => error,
        }
    }

    /// The marker, appended as this partition's leader and answered once every in-sync
    /// replica has it.
    async fn write_marker_local(&self, topic: &str, partition: u32, marker: Marker) -> ErrorCode {
        let batch = strata_wire::batch::marker(
            marker.producer_id,
            marker.producer_epoch,
            marker.commit,
            marker.coordinator_epoch,
            self.clock().wall_ms(),
        );
        let produced = self
            .produce_local(
                topic,
                partition,
                BytesMut::from(&batch[..]),
                AckTerms {
                    acks: ACKS_ALL,
                    timeout_ms: MARKER_TIMEOUT_MS,
                    answer: AnswerWhen::FlushPolicy,
                },
                AppendSource::Markers,
            )
            .await;
        if produced.response.error != ErrorCode::None {
            tracing::debug!(
                topic,
                partition,
                producer_id = marker.producer_id,
                "transaction marker not written: {}",
                produced.response.error
            );
        }
        produced.response.error
    }

    /// The transaction's offsets of `group`, settled by the group thread of the broker that
    /// coordinates the group.
    async fn settle_txn_offsets(&self, group: &str, marker: Marker, forward: bool) -> ErrorCode {
        let brokers: Vec<i32> = self.view.borrow().brokers.iter().map(|b| b.id).collect();
        match coordinator_of(group, &brokers) {
            Some(id) if id == self.context.config.node_id => {
                let (reply, answer) = oneshot::channel();
                let message = GroupMessage::SettleTxnOffsets {
                    group: group.to_string(),
                    producer_id: marker.producer_id,
                    commit: marker.commit,
                    reply,
                };
                if self.context.groups.send(message).is_err() {
                    return ErrorCode::NotReady;
                }
                answer.await.unwrap_or(ErrorCode::NotReady)
            }
            Some(id) if forward => {
                let Some((addr, host)) = self.replication_address(id, |_| 0) else {
                    return ErrorCode::NotCoordinator;
                };
                let request = marker_request(marker, Vec::new(), vec![group.to_string()]);
                match self.call_peer(addr, &host, request).await {
                    Some(answer) => answer
                        .groups
                        .first()
                        .map_or(ErrorCode::NotCoordinator, |settled| settled.error),
                    None => ErrorCode::NotCoordinator,
                }
            }
            _ => ErrorCode::NotCoordinator,
        }
    }

    /// A marker request to a peer broker over QUIC; `None` when it did not answer.
    async fn call_peer(
        &self,
        addr: std::net::SocketAddr,
        host: &str,
        request: WriteTxnMarkersRequest,
    ) -> Option<WriteTxnMarkersResponse> {
        let quic = self.quic.as_ref()?;
        match quic
            .call(addr, host, Request::WriteTxnMarkers(request))
            .await
        {
            Ok(Response::WriteTxnMarkers(answer)) => Some(answer),
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(%addr, "transaction markers not delivered: {error}");
                None
            }
        }
    }
}

fn marker_request(
    marker: Marker,
    topics: Vec<TopicPartitions>,
    groups: Vec<String>,
) -> WriteTxnMarkersRequest {
    WriteTxnMarkersRequest {
        producer_id: marker.producer_id,
        producer_epoch: marker.producer_epoch,
        commit: marker.commit,
        coordinator_epoch: marker.coordinator_epoch,
        topics,
        groups,
    }
}
