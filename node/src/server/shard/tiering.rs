//! Tiered storage on the shard: each partition this shard leads with `remote.storage.enable`
//! uploads its closed, committed segments, records them in its remote manifest (stored fenced
//! in the group store before and after each upload), lets local retention delete what the
//! remote tier holds, and applies the topic's whole-log retention to the remote tier. Reads
//! below the local log start are answered from the remote tier (`remote_read`).
//!
//! The decisions on the manifest are `crate::tier::manifest`'s; the object store is the tier
//! thread's (`server/tier.rs`). Followers never upload: a new leader claims the manifest at
//! its epoch (fencing its predecessor's writes), deletes what its predecessor left unfinished,
//! and carries on from the manifest's end.

use std::rc::Rc;
use std::time::Duration;

use strata_wire::protocol::ErrorCode;
use tokio::sync::oneshot;

use super::Shard;
use crate::server::messages::{GroupMessage, ManifestRequest};
use crate::server::tier::{RemoteBatches, Tier, TierError};
use crate::tier::{ManifestError, RemoteManifest, RemoteSegment, SegmentState};

/// How often leaders look for segments to upload and remote segments past retention.
const TICK: Duration = Duration::from_millis(500);
/// The remote segments after the one read that a read may fetch ahead into.
const READ_AHEAD_SEGMENTS: usize = 8;
/// How long uploads fail before the broker logs an error about it (and again as often).
const UPLOAD_ALARM_AFTER: Duration = Duration::from_secs(30);
/// How often a leader lists its partition's folder for objects no manifest entry names.
const ORPHAN_SWEEP_TICKS: u64 = 120;

/// A led partition's remote manifest as last stored, and the epoch it was claimed at.
pub(in crate::server) struct RemotePartition {
    pub epoch: u32,
    pub manifest: RemoteManifest,
    pub revision: i64,
    pub folder: String,
    /// What waited for upload at the last pass.
    pub backlog: crate::log::UploadBacklog,
}

/// Why a pass over one partition stopped.
#[derive(Debug, thiserror::Error)]
enum TieringError {
    #[error("{0}")]
    Tier(#[from] TierError),
    #[error("the group store: {0:?}")]
    Store(ErrorCode),
    #[error("another leader changed the manifest")]
    Fenced,
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{0}")]
    Log(#[from] crate::log::LogError),
}

/// One partition as a pass sees it.
struct Led {
    topic: String,
    partition: u32,
    epoch: u32,
    high_watermark: u64,
    log: crate::log::writer::LogHandle,
    retention_ms: Option<i64>,
    retention_bytes: Option<u64>,
}

impl Shard {
    /// The shard's tiering loop (a no-op without a remote tier).
    pub(in crate::server) async fn tiering_ticks(self: Rc<Self>) {
        let Some(tier) = self.context.tier.clone() else {
            return;
        };
        let mut ticks = self.clock().ticks(TICK);
        let mut passes = 0u64;
        loop {
            ticks.tick().await;
            passes += 1;
            let led = self.tiered_leaders();
            let still_led: Vec<_> = led.iter().map(|p| (p.topic.clone(), p.partition)).collect();
            self.remote
                .borrow_mut()
                .retain(|key, _| still_led.contains(key));
            for partition in led {
                let sweep = passes.is_multiple_of(ORPHAN_SWEEP_TICKS);
                if let Err(error) = self.tier_partition(&tier, &partition, sweep).await {
                    tracing::warn!(
                        topic = %partition.topic,
                        partition = partition.partition,
                        "tiered storage: {error}"
                    );
                    if matches!(error, TieringError::Fenced | TieringError::Manifest(_)) {
                        // Read it again on the next pass.
                        self.remote
                            .borrow_mut()
                            .remove(&(partition.topic.clone(), partition.partition));
                    }
                }
            }
            self.report_backlog(&tier);
        }
    }

    /// Publishes this shard's upload lag, and raises the alarm when uploads have failed for
    /// a while: produce goes on, and the local disk keeps what the remote tier has not taken.
    fn report_backlog(&self, tier: &Tier) {
        let (mut backlog, mut held) = ((0, 0), (0, 0));
        for remote in self.remote.borrow().values() {
            backlog.0 += remote.backlog.segments;
            backlog.1 += remote.backlog.bytes;
            held.0 += remote.manifest.copied().count() as u64;
            held.1 += remote.manifest.copied_bytes();
        }
        tier.metrics.set_shard(self.context.index, backlog, held);
        if let Some(failing) = tier.metrics.uploads_failing_for(self.clock().wall_ms())
            && failing >= UPLOAD_ALARM_AFTER
            && self.context.index == 0
            && tier.metrics.alarm_due(self.clock().wall_ms())
        {
            tracing::error!(
                failing_seconds = failing.as_secs(),
                waiting_bytes = tier.metrics.backlog().1,
                "remote tier: uploads have failed for {}s; produce goes on and the local disk holds every segment not uploaded (see strata_remote_upload_lag_bytes)",
                failing.as_secs()
            );
        }
    }

    /// The partitions this shard leads whose topic has `remote.storage.enable`.
    fn tiered_leaders(&self) -> Vec<Led> {
        self.partitions
            .borrow()
            .iter()
            .filter(|(_, p)| p.remote_storage)
            .filter_map(|((topic, partition), p)| {
                let high_watermark = p.leader_high_watermark()?;
                Some(Led {
                    topic: topic.clone(),
                    partition: *partition,
                    epoch: p.state.leader_epoch,
                    high_watermark,
                    log: p.log.clone(),
                    retention_ms: p.retention.0,
                    retention_bytes: p.retention.1,
                })
            })
            .collect()
    }

    /// One pass over a led partition: claim (once per epoch), upload, retention.
    async fn tier_partition(
        &self,
        tier: &Tier,
        led: &Led,
        sweep: bool,
    ) -> Result<(), TieringError> {
        let key = (led.topic.clone(), led.partition);
        let claimed = self
            .remote
            .borrow()
            .get(&key)
            .is_some_and(|remote| remote.epoch == led.epoch);
        if !claimed {
            self.claim_manifest(tier, led).await?;
        } else if sweep {
            self.sweep_orphans(tier, led).await?;
        }
        self.upload_next(tier, led).await?;
        self.remote_retention(tier, led).await
    }

    /// Loads the manifest, claims it at this leader's epoch, finishes what earlier leaders
    /// left unfinished, and sweeps the folder for orphans.
    async fn claim_manifest(&self, tier: &Tier, led: &Led) -> Result<(), TieringError> {
        let id = format!("{}/{}", led.topic, led.partition);
        let (record, revision) = self
            .manifest_call(|reply| ManifestRequest::Load {
                id: id.clone(),
                reply,
            })
            .await?;
        let manifest: RemoteManifest = record
            .and_then(|value| serde_json::from_value(value).ok())
            .unwrap_or_default();
        let folder = self.remote_folder(tier, &led.topic, led.partition);
        self.remote.borrow_mut().insert(
            (led.topic.clone(), led.partition),
            RemotePartition {
                epoch: led.epoch,
                manifest,
                revision,
                folder,
                backlog: Default::default(),
            },
        );
        self.change_manifest(led, |manifest| manifest.claim(led.epoch).map(|_| ()))
            .await?;
        let (abandoned, folder) = self.with_remote(led, |remote| {
            (remote.manifest.abandoned(led.epoch), remote.folder.clone())
        });
        if !abandoned.is_empty() {
            let stems = abandoned.iter().map(RemoteSegment::stem).collect();
            tier.delete_segments(folder, stems).await?;
            let ids: Vec<String> = abandoned.iter().map(|s| s.id.clone()).collect();
            self.change_manifest(led, |manifest| {
                manifest.finish_delete(led.epoch, &ids)?;
                manifest.forget(led.epoch, &ids)
            })
            .await?;
            tracing::info!(topic = %led.topic, partition = led.partition, segments = ids.len(), "tiered storage: removed what an earlier leader left unfinished");
        }
        self.sweep_orphans(tier, led).await?;
        let copied = self.with_remote(led, |remote| remote.manifest.copied_end());
        led.log.set_remote_copied(copied.unwrap_or(0));
        Ok(())
    }

    /// The partition's folder in the remote tier (named by its topic's id too: a topic
    /// deleted and made again starts in a folder of its own).
    fn remote_folder(&self, tier: &Tier, topic: &str, partition: u32) -> String {
        let topic_id = self
            .view
            .borrow()
            .topics
            .iter()
            .find(|state| state.name == topic)
            .map(|state| {
                uuid::Uuid::from_bytes(state.topic_id().0)
                    .simple()
                    .to_string()
            })
            .unwrap_or_default();
        tier.partition_folder(topic, &topic_id, partition)
    }

    /// What a follower of a tiered partition starting over at `offset` (its leader's local
    /// log start) takes from the remote segment ending there: the producer state and leader
    /// epochs. `None` when the partition is not tiered or the remote tier holds no segment
    /// ending at `offset`.
    pub(in crate::server) async fn remote_state_below(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Option<crate::log::StateBelow> {
        let tier = self.context.tier.clone()?;
        let (record, _) = self
            .manifest_call(|reply| ManifestRequest::Load {
                id: format!("{topic}/{partition}"),
                reply,
            })
            .await
            .ok()?;
        let manifest: RemoteManifest = serde_json::from_value(record?).ok()?;
        let segment = manifest
            .copied()
            .find(|segment| segment.next_offset == offset)?
            .clone();
        let folder = self.remote_folder(&tier, topic, partition);
        match tier.state_after(folder, segment).await {
            Ok(below) => Some(below),
            Err(error) => {
                tracing::warn!(%topic, partition, offset, "the producer state below the leader's log start is not in the remote tier: {error}");
                None
            }
        }
    }

    /// Deletes objects of the partition's folder that no manifest entry names: uploads that
    /// outlived their leader's fence.
    async fn sweep_orphans(&self, tier: &Tier, led: &Led) -> Result<(), TieringError> {
        let folder = self.with_remote(led, |remote| remote.folder.clone());
        let objects = tier.list(folder.clone()).await?;
        let orphans: Vec<String> = self.with_remote(led, |remote| {
            objects
                .into_iter()
                .filter(|name| !remote.manifest.names_object(name))
                .collect()
        });
        if !orphans.is_empty() {
            tracing::info!(topic = %led.topic, partition = led.partition, objects = orphans.len(), "tiered storage: deleting orphaned objects");
            tier.delete_objects(folder, orphans).await?;
        }
        Ok(())
    }

    /// Forgets this leader's own uploads that did not finish (the store failed under them):
    /// uploads run one at a time per partition, so none is in flight between passes. Their
    /// objects are deleted if the store lets us, else the orphan sweep finds them. Without
    /// this, the next upload would start past a segment that never arrived.
    async fn forget_failed_uploads(&self, tier: &Tier, led: &Led) -> Result<(), TieringError> {
        let (failed, folder): (Vec<RemoteSegment>, String) = self.with_remote(led, |remote| {
            let failed = remote
                .manifest
                .segments
                .iter()
                .filter(|segment| segment.state == SegmentState::CopyStarted)
                .cloned()
                .collect();
            (failed, remote.folder.clone())
        });
        if failed.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = failed.iter().map(|segment| segment.id.clone()).collect();
        self.change_manifest(led, |manifest| manifest.forget(led.epoch, &ids))
            .await?;
        let stems = failed.iter().map(RemoteSegment::stem).collect();
        if let Err(error) = tier.delete_segments(folder, stems).await {
            tracing::debug!(topic = %led.topic, partition = led.partition, "a failed upload's objects stay for the sweep: {error}");
        }
        Ok(())
    }

    /// Uploads the next closed, committed segment past the manifest's end, if there is one.
    async fn upload_next(&self, tier: &Tier, led: &Led) -> Result<(), TieringError> {
        self.forget_failed_uploads(tier, led).await?;
        let (end, folder) = self.with_remote(led, |remote| {
            (remote.manifest.end_offset(), remote.folder.clone())
        });
        let (next, backlog) = led.log.next_upload(end, led.high_watermark).await?;
        if let Some(remote) = self
            .remote
            .borrow_mut()
            .get_mut(&(led.topic.clone(), led.partition))
        {
            remote.backlog = backlog;
        }
        let Some(upload) = next else {
            return Ok(());
        };
        let segment = RemoteSegment {
            id: format!("{:032x}", rand::random::<u128>()),
            // Where the remote tier ends, or the segment's base: what was uploaded may start
            // lower (the batch holding the log's start), and is recorded when it ends.
            base_offset: upload.segment_base.max(end),
            next_offset: upload.next_offset,
            size_bytes: upload.file_len,
            max_timestamp_ms: upload.max_timestamp_ms,
            uploader_epoch: led.epoch,
            state: SegmentState::CopyStarted,
        };
        let stem = segment.stem();
        let id = segment.id.clone();
        self.change_manifest(led, |manifest| {
            manifest.begin_copy(led.epoch, segment.clone())
        })
        .await?;
        let uploaded = tier
            .upload(folder, stem, upload, self.clock().wall_ms())
            .await?;
        let uploaded_as = Some((uploaded.base_offset, uploaded.size_bytes));
        self.change_manifest(led, |manifest| {
            manifest.finish_copy(led.epoch, &id, uploaded_as)
        })
        .await?;
        led.log.set_remote_copied(uploaded.next_offset);
        tracing::debug!(topic = %led.topic, partition = led.partition, base = uploaded.base_offset, next = uploaded.next_offset, "tiered storage: segment uploaded");
        Ok(())
    }

    /// Deletes remote segments past the topic's whole-log retention.
    async fn remote_retention(&self, tier: &Tier, led: &Led) -> Result<(), TieringError> {
        let now_ms = self.clock().wall_ms();
        let (cut, folder) = self.with_remote(led, |remote| {
            let cut = remote
                .manifest
                // The whole log: the remote tier and what waits locally for upload.
                .retention_cut(
                    now_ms,
                    led.retention_ms,
                    led.retention_bytes,
                    remote.backlog.bytes,
                );
            (cut, remote.folder.clone())
        });
        let Some(cut) = cut else {
            return Ok(());
        };
        let mut marked = Vec::new();
        self.change_manifest(led, |manifest| {
            marked = manifest.begin_delete(led.epoch, Some(cut))?;
            Ok(())
        })
        .await?;
        let stems = marked.iter().map(RemoteSegment::stem).collect();
        tier.delete_segments(folder, stems).await?;
        let ids: Vec<String> = marked.iter().map(|s| s.id.clone()).collect();
        self.change_manifest(led, |manifest| manifest.finish_delete(led.epoch, &ids))
            .await?;
        tracing::info!(topic = %led.topic, partition = led.partition, segments = ids.len(), below = cut, "retention deleted remote segments");
        Ok(())
    }

    /// A deleted topic's partition this shard led: its remote objects and manifest go (in a
    /// task of their own; a failure leaves objects the next broker's sweep cannot see, so it
    /// is logged as an error for the operator).
    pub(in crate::server) fn delete_remote_partition(&self, key: &(String, u32)) {
        let (Some(tier), Some(remote)) = (
            self.context.tier.clone(),
            self.remote.borrow_mut().remove(key),
        ) else {
            return;
        };
        let groups = self.context.groups.clone();
        let id = format!("{}/{}", key.0, key.1);
        tokio::task::spawn_local(async move {
            let deleted = match tier.list(remote.folder.clone()).await {
                Ok(names) => tier.delete_objects(remote.folder.clone(), names).await,
                Err(error) => Err(error),
            };
            if let Err(error) = deleted {
                tracing::error!(folder = %remote.folder, "deleting a deleted topic's remote objects: {error}");
                return;
            }
            let (reply, answer) = oneshot::channel();
            let _ = groups.send(GroupMessage::Manifest(ManifestRequest::Delete {
                id,
                reply,
            }));
            let _ = answer.await;
            tracing::info!(folder = %remote.folder, "deleted a deleted topic's remote segments");
        });
    }

    fn with_remote<T>(&self, led: &Led, read: impl FnOnce(&RemotePartition) -> T) -> T {
        let remote = self.remote.borrow();
        read(
            remote
                .get(&(led.topic.clone(), led.partition))
                .expect("claimed before use"),
        )
    }

    /// Applies `change` to a copy of the manifest and stores it fenced on the revision read;
    /// the shard's copy changes only once stored.
    async fn change_manifest(
        &self,
        led: &Led,
        mut change: impl FnMut(&mut RemoteManifest) -> Result<(), ManifestError>,
    ) -> Result<(), TieringError> {
        let key = (led.topic.clone(), led.partition);
        let (mut manifest, revision) = {
            let remote = self.remote.borrow();
            let remote = remote.get(&key).expect("claimed before use");
            (remote.manifest.clone(), remote.revision)
        };
        change(&mut manifest)?;
        let record = serde_json::to_value(&manifest).expect("a manifest serializes");
        let stored = self
            .manifest_call(|reply| ManifestRequest::Store {
                id: format!("{}/{}", led.topic, led.partition),
                expected: revision,
                record,
                reply,
            })
            .await?;
        let Some(revision) = stored else {
            return Err(TieringError::Fenced);
        };
        if let Some(remote) = self.remote.borrow_mut().get_mut(&key) {
            remote.manifest = manifest;
            remote.revision = revision;
        }
        Ok(())
    }

    async fn manifest_call<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, ErrorCode>>) -> ManifestRequest,
    ) -> Result<T, TieringError> {
        let (reply, answer) = oneshot::channel();
        self.context
            .groups
            .send(GroupMessage::Manifest(request(reply)))
            .map_err(|_| TieringError::Store(ErrorCode::NotReady))?;
        answer
            .await
            .map_err(|_| TieringError::Store(ErrorCode::NotReady))?
            .map_err(TieringError::Store)
    }

    /// DeleteRecords below `offset` on a tiered partition this shard leads: stored in its
    /// manifest before the answer, so the remote tier serves nothing below it from then on.
    /// `Ok(false)`: not tiered here, nothing to do. A tiered partition whose manifest is not
    /// claimed yet (a leader of a moment) answers retriably.
    pub(in crate::server) async fn remote_delete_records(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<bool, ErrorCode> {
        let led = self
            .tiered_leaders()
            .into_iter()
            .find(|led| led.topic == topic && led.partition == partition);
        let Some(led) = led else {
            return Ok(false);
        };
        let claimed = self
            .remote
            .borrow()
            .get(&(topic.to_string(), partition))
            .is_some_and(|remote| remote.epoch == led.epoch);
        if !claimed {
            return Err(ErrorCode::NotReady);
        }
        match self
            .change_manifest(&led, |manifest| {
                manifest.delete_records_before(led.epoch, offset)
            })
            .await
        {
            Ok(()) => Ok(true),
            Err(error) => {
                tracing::warn!(%topic, partition, "deleting remote records: {error}");
                Err(ErrorCode::NotReady)
            }
        }
    }

    /// The first offset the remote tier serves for a partition this shard leads (`None`: the
    /// partition is not tiered, or its remote tier is empty). A tiered partition whose leader
    /// has not claimed its manifest yet (leader of a moment) answers OFFSET_NOT_AVAILABLE,
    /// retriable: its log start is not known until then, and a reader told the local start
    /// would skip what the remote tier holds.
    pub(in crate::server) fn remote_start(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<u64>, ErrorCode> {
        // Every fetch asks: a node without a remote tier answers without a lookup.
        if self.context.tier.is_none() {
            return Ok(None);
        }
        let key = (topic.to_string(), partition);
        let epoch = match self.partitions.borrow().get(&key) {
            Some(tiered) if tiered.remote_storage && tiered.leader_high_watermark().is_some() => {
                tiered.state.leader_epoch
            }
            _ => return Ok(None),
        };
        match self.remote.borrow().get(&key) {
            Some(remote) if remote.epoch == epoch => Ok(remote.manifest.start_offset()),
            _ => Err(ErrorCode::OffsetNotAvailable),
        }
    }

    /// The offset after the last record the remote tier holds for a partition this shard leads.
    pub(in crate::server) fn remote_copied_end(&self, topic: &str, partition: u32) -> Option<u64> {
        self.remote
            .borrow()
            .get(&(topic.to_string(), partition))
            .and_then(|remote| remote.manifest.copied_end())
    }

    /// Whole batches from the remote segment holding `offset` (below `end_offset`, within
    /// `max_bytes`); `None` when the remote tier holds no such segment.
    pub(in crate::server) async fn remote_read(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        end_offset: u64,
        max_bytes: usize,
    ) -> Option<Result<RemoteBatches, TierError>> {
        let tier = self.context.tier.clone()?;
        let (segment, next, folder) = {
            let remote = self.remote.borrow();
            let remote = remote.get(&(topic.to_string(), partition))?;
            let segment = remote.manifest.find(offset)?.clone();
            // Those after it, for read-ahead across boundaries: as many as the read-ahead can
            // reach (it stops at 32 MiB and more only for larger fetches).
            let next = remote
                .manifest
                .copied()
                .filter(|later| later.base_offset >= segment.next_offset)
                .take(READ_AHEAD_SEGMENTS)
                .cloned()
                .collect();
            (segment, next, remote.folder.clone())
        };
        Some(
            tier.read(folder, segment, next, offset, end_offset, max_bytes)
                .await,
        )
    }

    /// The first offset at or after `timestamp_ms` in the remote tier, and its timestamp.
    pub(in crate::server) async fn remote_offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
    ) -> Option<Result<Option<(u64, i64)>, TierError>> {
        let tier = self.context.tier.clone()?;
        let (segment, folder) = {
            let remote = self.remote.borrow();
            let remote = remote.get(&(topic.to_string(), partition))?;
            (
                remote.manifest.find_by_timestamp(timestamp_ms)?.clone(),
                remote.folder.clone(),
            )
        };
        Some(
            tier.offset_for_timestamp(folder, segment.stem(), segment.size_bytes, timestamp_ms)
                .await,
        )
    }
}
