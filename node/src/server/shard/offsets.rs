//! ListOffsets: a partition's start, end (its high watermark) or the first offset at a time,
//! answered only by a leader whose high watermark is settled, so an end is never behind an
//! acknowledged write.

use std::rc::Rc;

use strata_wire::protocol::{
    CLEAN_OFFSET_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, ErrorCode,
    LATEST_TIERED_TIMESTAMP, LATEST_TIMESTAMP, ListOffsetsPartition, ListOffsetsPartitionResponse,
    ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopicResponse, MAX_TIMESTAMP,
};

use super::replica::Role;

use super::{Shard, log_error_code};

impl Shard {
    pub(in crate::server) async fn list_offsets(
        self: &Rc<Self>,
        request: ListOffsetsRequest,
    ) -> ListOffsetsResponse {
        let mut topics = Vec::new();
        let read_committed = request.read_committed.0;
        for topic in request.topics {
            let mut partitions = Vec::new();
            for partition in topic.partitions {
                let index = partition.partition;
                let response = match self.route(&topic.name, index) {
                    Err(error) => list_error(index, error),
                    Ok(owner) if owner == self.context.index => {
                        self.list_offset_local(&topic.name, partition, read_committed)
                            .await
                    }
                    Ok(owner) => {
                        let name = topic.name.clone();
                        self.run_on(owner, move |shard| async move {
                            shard
                                .list_offset_local(&name, partition, read_committed)
                                .await
                        })
                        .await
                        .unwrap_or_else(|| list_error(index, ErrorCode::NotReady))
                    }
                };
                partitions.push(response);
            }
            topics.push(ListOffsetsTopicResponse {
                name: topic.name,
                partitions,
            });
        }
        ListOffsetsResponse { topics }
    }

    /// Whether this replica leads `topic`-`partition` with a high watermark no earlier
    /// leader's is ahead of ([`crate::replication::Leader::high_watermark_settled`]).
    pub(super) fn high_watermark_settled(&self, topic: &str, partition: u32) -> bool {
        let partitions = self.partitions.borrow();
        matches!(
            partitions.get(&(topic.to_string(), partition)).map(|p| &p.role),
            Some(Role::Leader(leader)) if leader.high_watermark_settled()
        )
    }

    pub(super) async fn list_offset_local(
        &self,
        topic: &str,
        partition: ListOffsetsPartition,
        read_committed: bool,
    ) -> ListOffsetsPartitionResponse {
        let index = partition.partition;
        let Some((log, high_watermark, _)) = self.leader_view(topic, index) else {
            return list_error(index, ErrorCode::NotLeader);
        };
        // Offsets a reader is told never go backwards: a new leader answers only once its
        // high watermark is at least every earlier leader's (as Kafka's brokers do).
        if !self.high_watermark_settled(topic, index) {
            return list_error(index, ErrorCode::OffsetNotAvailable);
        }
        let found = match partition.timestamp {
            // A tiered log starts in its remote tier; `earliest-local` is the local start.
            EARLIEST_TIMESTAMP => {
                let remote = match self.remote_start(topic, index) {
                    Ok(start) => start,
                    Err(error) => return list_error(index, error),
                };
                log.offsets().await.map(|offsets| {
                    let start = remote.map_or(offsets.log_start, |r| r.min(offsets.log_start));
                    Some((start, -1))
                })
            }
            EARLIEST_LOCAL_TIMESTAMP => log
                .offsets()
                .await
                .map(|offsets| Some((offsets.log_start, -1))),
            // The end a consumer can read to: the last stable offset for read_committed.
            LATEST_TIMESTAMP if read_committed => log
                .offsets()
                .await
                .map(|offsets| Some((offsets.last_stable(high_watermark), -1))),
            LATEST_TIMESTAMP => Ok(Some((high_watermark, -1))),
            // The last record the remote tier holds.
            LATEST_TIERED_TIMESTAMP => Ok(self
                .remote_copied_end(topic, index)
                .map(|end| (end - 1, -1))),
            // Among committed records only, as for a time.
            MAX_TIMESTAMP => log
                .offset_of_max_timestamp()
                .await
                .map(|found| found.filter(|(offset, _)| *offset < high_watermark)),
            CLEAN_OFFSET_TIMESTAMP => log
                .offsets()
                .await
                .map(|offsets| Some((offsets.clean.min(high_watermark), -1))),
            // Only committed records are found: one past the high watermark may yet be
            // truncated away.
            timestamp => match self
                .remote_offset_for_timestamp(topic, index, timestamp)
                .await
            {
                Some(Ok(Some(found))) => Ok(Some(found)),
                Some(Err(error)) => {
                    tracing::warn!(%topic, partition = index, "remote timestamp lookup failed: {error}");
                    return list_error(index, ErrorCode::StorageError);
                }
                // Not in the remote tier: in the local log, if anywhere.
                Some(Ok(None)) | None => log
                    .offset_for_timestamp(timestamp)
                    .await
                    .map(|found| found.filter(|(offset, _)| *offset < high_watermark)),
            },
        };
        match found {
            Ok(Some((offset, timestamp))) => ListOffsetsPartitionResponse {
                partition: index,
                error: ErrorCode::None,
                offset: offset as i64,
                timestamp,
            },
            Ok(None) => ListOffsetsPartitionResponse {
                partition: index,
                error: ErrorCode::None,
                offset: -1,
                timestamp: -1,
            },
            Err(error) => list_error(index, log_error_code(&error)),
        }
    }
}

pub(super) fn list_error(partition: u32, error: ErrorCode) -> ListOffsetsPartitionResponse {
    ListOffsetsPartitionResponse {
        partition,
        error,
        offset: -1,
        timestamp: -1,
    }
}
