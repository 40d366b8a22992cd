//! Share groups on partition leaders, the part both listeners share (Kafka's ShareFetch and
//! ShareAcknowledge in `listener/kafka/share_groups.rs`, Strata's own in
//! `listener/native_share.rs`): each operation runs on the shard that owns its partition
//! ([`on_owner`]), and a fetch's acquisition loop ([`acquire`]) takes records from its
//! partitions in turn up to the record limit, or waits until one may have some.
//!
//! What stays with each listener: its requests and answers, its ACL checks, Kafka's share
//! sessions (the native protocol names its partitions in every fetch).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_wire::protocol::ErrorCode;

use super::messages::Delivery;
use super::shard::Shard;
use super::shard::share::{ShareAcquired, ShareFailure, ShareKey};
use crate::share::config::ShareGroupConfig;
use crate::share::partition::{AckBatch, AcquireMode};

/// The records one fetch acquires when the client names no limit.
const DEFAULT_MAX_RECORDS: usize = 500;
/// The most bytes read from one partition for one acquisition.
const PARTITION_READ_BYTES: u32 = 8 << 20;

/// A share group's configs as this broker's view has them.
pub(super) fn group_config(shard: &Shard, group: &str) -> ShareGroupConfig {
    ShareGroupConfig::from_configs(shard.view.borrow().group_configs.get(group))
}

/// Runs `work` on the shard owning `topic`-`partition`.
pub(super) async fn on_owner<T, F, Fut>(
    shard: &Rc<Shard>,
    topic: &str,
    partition: u32,
    work: F,
) -> Result<T, ShareFailure>
where
    T: Send + 'static,
    F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ShareFailure>> + 'static,
{
    let owner = shard.route(topic, partition)?;
    shard
        .run_on(owner, work)
        .await
        .unwrap_or(Err(ShareFailure::Code(ErrorCode::NotReady)))
}

/// Who is fetching, and under which group configs.
pub(super) struct Fetcher<'a> {
    pub group: &'a str,
    pub id: &'a str,
    pub config: &'a ShareGroupConfig,
}

/// A fetch's limits: records and bytes, and how long it may wait for records.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    max_records: usize,
    mode: AcquireMode,
    max_bytes: u32,
    /// How the acquired batches may travel: from the segment file (`sendfile`) where the
    /// connection takes that, else as bytes.
    delivery: Delivery,
    deadline: Instant,
}

impl Limits {
    /// The limits, the record limit applied as `mode` says.
    pub(super) fn with_mode(self, mode: AcquireMode) -> Limits {
        Limits { mode, ..self }
    }

    /// The limits, the batches travelling as `delivery` allows.
    pub(super) fn with_delivery(self, delivery: Delivery) -> Limits {
        Limits { delivery, ..self }
    }

    /// When the fetch's wait for records is over.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The limits a client asked for (zero or less: the broker's defaults; bytes per
    /// partition capped at [`PARTITION_READ_BYTES`]), its wait starting now.
    pub(super) fn new(shard: &Shard, max_records: i64, max_bytes: i64, max_wait_ms: i64) -> Limits {
        Limits {
            max_records: usize::try_from(max_records)
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or(DEFAULT_MAX_RECORDS),
            mode: AcquireMode::BatchOptimized,
            max_bytes: u32::try_from(max_bytes)
                .ok()
                .filter(|&n| n > 0)
                .map_or(PARTITION_READ_BYTES, |n| n.min(PARTITION_READ_BYTES)),
            delivery: Delivery::Bytes,
            deadline: shard.context.config.clock.now()
                + Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0)),
        }
    }
}

/// One partition's part of a fetch: what was acquired, or why nothing could be.
pub(super) type Acquisition = Result<ShareAcquired, ShareFailure>;

/// Acquires records of `partitions` for `member`, in turn, until the fetch's record limit;
/// with none to hand out, waits until some partition may have some, or the client's wait is
/// over (at once with `answer_now`: the caller has something to answer already). The
/// partitions that acquired records or failed, each with its outcome.
pub(super) async fn acquire(
    shard: &Rc<Shard>,
    member: &Fetcher<'_>,
    partitions: &[(String, u32)],
    limits: Limits,
    answer_now: bool,
) -> BTreeMap<(String, u32), Acquisition> {
    let mut answers = BTreeMap::new();
    loop {
        let mut left = limits.max_records;
        for (topic, partition) in partitions {
            if left == 0 {
                break;
            }
            let key: ShareKey = (member.group.to_string(), topic.clone(), *partition);
            let (owner_config, owner_member) = (member.config.clone(), member.id.to_string());
            let acquired = on_owner(shard, topic, *partition, move |owner| async move {
                owner
                    .share_acquire(
                        key,
                        owner_member,
                        owner_config,
                        (left, limits.mode),
                        (limits.max_bytes, limits.delivery),
                    )
                    .await
            })
            .await;
            match acquired {
                Ok(acquired) if !acquired.acquired.is_empty() => {
                    let count: u64 = acquired
                        .acquired
                        .iter()
                        .map(|run| run.last - run.first + 1)
                        .sum();
                    left = left.saturating_sub(count as usize);
                    answers.insert((topic.clone(), *partition), Ok(acquired));
                }
                Ok(_) => {}
                Err(failure) => {
                    answers.insert((topic.clone(), *partition), Err(failure));
                }
            }
        }
        if !answers.is_empty()
            || answer_now
            || partitions.is_empty()
            || shard.context.config.clock.now() >= limits.deadline
        {
            return answers;
        }
        // Nothing to hand out yet: wait until some partition may have records, or the wait
        // the client allowed is over.
        let waits = partitions.iter().map(|(topic, partition)| {
            let key: ShareKey = (member.group.to_string(), topic.clone(), *partition);
            Box::pin(on_owner(
                shard,
                topic,
                *partition,
                move |owner| async move {
                    owner.share_wait(key, limits.deadline).await;
                    Ok(())
                },
            ))
        });
        let _ = futures_util::future::select_all(waits).await;
    }
}

/// Applies `member`'s acknowledgements of `topic`-`partition` on its leader's owning shard,
/// stored before this returns.
pub(super) async fn acknowledge(
    shard: &Rc<Shard>,
    group: &str,
    member: &str,
    topic: &str,
    partition: u32,
    batches: Vec<AckBatch>,
) -> Result<(), ShareFailure> {
    let key: ShareKey = (group.to_string(), topic.to_string(), partition);
    let config = group_config(shard, group);
    let member = member.to_string();
    on_owner(shard, topic, partition, move |owner| async move {
        owner.share_acknowledge(key, member, config, batches).await
    })
    .await
}

/// Gives back what `member` holds on `partitions` (its share session closed, or it is
/// closing); failures are logged (the records' locks run out in any case).
pub(super) async fn release(
    shard: &Rc<Shard>,
    group: &str,
    member: &str,
    partitions: &[(String, u32)],
) {
    for (topic, partition) in partitions {
        let key: ShareKey = (group.to_string(), topic.clone(), *partition);
        let config = group_config(shard, group);
        let member = member.to_string();
        let released = on_owner(shard, topic, *partition, move |owner| async move {
            owner.share_release(key, member, config).await
        })
        .await;
        if let Err(failure) = released {
            tracing::debug!(%group, %topic, partition, "releasing a member's records: {failure:?}");
        }
    }
}
