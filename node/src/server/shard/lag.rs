//! Where a consumer group stands on a partition, for the group thread's lag metrics: the
//! partition's end (its high watermark) and the time of the oldest record the group has not
//! read, asked of the partition's leader: this broker's owning shard where it leads, else the
//! leader's owning shard over QUIC, broker to broker (the replication endpoint, with its TLS
//! identity), so no listener, credential or client is involved.

use std::rc::Rc;

use strata_wire::protocol::{
    Appended, ErrorCode, FetchRequest, FetchResponse, LATEST_TIMESTAMP, ListOffsetsPartition,
    ListOffsetsRequest, ListOffsetsTopic, Records, Request, Response,
};

use super::Shard;
use crate::server::messages::{Delivery, GroupPosition, PositionAsked};

impl Shard {
    /// Answers the group thread's question from a task of its own.
    pub(super) fn answer_position(self: &Rc<Self>, asked: PositionAsked) {
        let shard = self.clone();
        tokio::task::spawn_local(async move {
            let PositionAsked {
                topic,
                partition,
                committed,
                reply,
            } = asked;
            let _ = reply.send(shard.group_position(topic, partition, committed).await);
        });
    }

    /// The end of `topic`-`partition` and the timestamp of its record at `committed`, as its
    /// leader says; unknown where the leader cannot be asked.
    pub(in crate::server) async fn group_position(
        self: &Rc<Self>,
        topic: String,
        partition: u32,
        committed: u64,
    ) -> GroupPosition {
        let end = self.partition_end(&topic, partition, false).await;
        let oldest_unconsumed_ms = match end.map(|end| end.saturating_sub(committed)) {
            None => None,
            Some(0) => Some(None),
            Some(_) => self.timestamp_at(&topic, partition, committed).await,
        };
        GroupPosition {
            end,
            oldest_unconsumed_ms,
        }
    }

    /// The end of `topic`-`partition` as its leader says: its high watermark, or its last
    /// stable offset for `read_committed`; `None` where the leader cannot be asked.
    pub(in crate::server) async fn partition_end(
        self: &Rc<Self>,
        topic: &str,
        partition: u32,
        read_committed: bool,
    ) -> Option<u64> {
        let latest = Request::ListOffsets(ListOffsetsRequest {
            topics: vec![ListOffsetsTopic {
                name: topic.to_string(),
                partitions: vec![ListOffsetsPartition {
                    partition,
                    timestamp: LATEST_TIMESTAMP,
                }],
            }],
            read_committed: Appended(read_committed),
        });
        match self.ask_leader(topic, partition, latest).await {
            Some(Response::ListOffsets(answer)) => answer
                .topics
                .first()
                .and_then(|topic| topic.partitions.first())
                .filter(|answer| answer.error == ErrorCode::None)
                .and_then(|answer| u64::try_from(answer.offset).ok()),
            _ => None,
        }
    }

    /// The timestamp of the first record at or past `offset` (`Some(None)`: there is none).
    async fn timestamp_at(
        self: &Rc<Self>,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Option<Option<i64>> {
        let fetch = Request::Fetch(FetchRequest::timestamp_lookup(topic, partition, offset));
        let Some(Response::Fetch(mut answer)) = self.ask_leader(topic, partition, fetch).await
        else {
            return None;
        };
        let answer = answer.topics.first_mut()?.partitions.first_mut()?;
        if answer.error != ErrorCode::None {
            return None;
        }
        let records = std::mem::replace(&mut answer.records, Records::empty()).freeze();
        strata_wire::batch::first_record_timestamp(records, offset).ok()
    }

    /// `request`, about `topic`-`partition` only, answered by the partition's leader.
    async fn ask_leader(
        self: &Rc<Self>,
        topic: &str,
        partition: u32,
        request: Request,
    ) -> Option<Response> {
        match self.route(topic, partition) {
            Ok(_) => match request {
                Request::ListOffsets(request) => {
                    Some(Response::ListOffsets(self.list_offsets(request).await))
                }
                Request::Fetch(request) => Some(Response::Fetch(self.peer_fetch(request).await)),
                _ => None,
            },
            Err(ErrorCode::NotLeader) => {
                let leader = self.leader_hint(topic, partition, ErrorCode::NotLeader);
                let (addr, host) = self.replication_target(leader, topic, partition)?;
                let quic = self.quic.as_ref()?;
                match quic.call(addr, &host, request).await {
                    Ok(response) => Some(response),
                    Err(error) => {
                        tracing::debug!(%topic, partition, leader, "a group's position unanswered: {error}");
                        None
                    }
                }
            }
            Err(_) => None,
        }
    }

    /// A peer broker's read of a partition this broker leads (to find a record's timestamp).
    pub(in crate::server) async fn peer_fetch(
        self: &Rc<Self>,
        request: FetchRequest,
    ) -> FetchResponse {
        self.fetch(request, Delivery::Bytes).await
    }
}
