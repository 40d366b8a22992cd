//! Consumer lag: each coordinated group's committed offsets against its partitions' high
//! watermarks, asked of the leaders every few seconds and rendered as metrics, in records and
//! in seconds (the age of the oldest record the group has not consumed: the one at its
//! committed offset). Records per second vary tenfold over a day; the age of what a group has
//! yet to read is what tells an on-call engineer how far behind it is.

use std::time::Duration;

use strata_coordinator::GroupStore;
use tokio::sync::{mpsc, oneshot};

use super::GroupManager;
use crate::server::messages::{GroupPosition, PositionAsked, ShardMessage};
use crate::server::shard_of;

/// How often the lag of coordinated groups is measured (high watermarks asked of the leaders).
pub(super) const LAG_REFRESH: Duration = Duration::from_secs(5);

/// Committed offset and lag of one partition of one group, as last measured.
#[derive(Debug, Clone)]
pub(super) struct Lag {
    pub(super) group: String,
    pub(super) topic: String,
    pub(super) partition: u32,
    pub(super) committed: u64,
    /// `None` when the partition's leader could not be asked.
    pub(super) lag: Option<u64>,
    /// The timestamp (ms) of the oldest record the group has not consumed, as last read:
    /// `Some(None)` when it has consumed everything; `None` when unknown. Its age is taken when
    /// rendered, so it keeps growing between refreshes.
    pub(super) oldest_unconsumed_ms: Option<Option<i64>>,
}

impl Lag {
    /// Seconds since the oldest record the group has not consumed was written (0 when caught
    /// up; never negative, whatever the producers' clocks said).
    pub(super) fn seconds(&self, now_ms: i64) -> Option<f64> {
        self.oldest_unconsumed_ms.map(|oldest| {
            oldest.map_or(0.0, |timestamp_ms| {
                now_ms.saturating_sub(timestamp_ms).max(0) as f64 / 1000.0
            })
        })
    }
}

/// Asks the shard of this node that owns `topic`-`partition` where a group at `committed` stands.
async fn position(
    shards: &[mpsc::UnboundedSender<ShardMessage>],
    topic: String,
    partition: u32,
    committed: u64,
) -> GroupPosition {
    let unknown = GroupPosition {
        end: None,
        oldest_unconsumed_ms: None,
    };
    let owner = shard_of(&topic, partition, shards.len());
    let (reply, answer) = oneshot::channel();
    let asked = ShardMessage::GroupPosition(PositionAsked {
        topic,
        partition,
        committed,
        reply,
    });
    if shards[owner].send(asked).is_err() {
        return unknown;
    }
    answer.await.unwrap_or(unknown)
}

impl<S: GroupStore> GroupManager<S> {
    /// Starts measuring every coordinated group's lag in the background: each partition's end
    /// and oldest unconsumed record, asked of its leader through this node's owning shard.
    pub(super) async fn refresh_lag(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let committed: Vec<(String, String, u32, u64)> = self
            .groups
            .iter()
            .flat_map(|(group, coordinated)| {
                coordinated
                    .offsets
                    .iter()
                    .flat_map(move |(topic, partitions)| {
                        partitions.iter().map(move |(partition, stored)| {
                            (group.clone(), topic.clone(), *partition, stored.offset)
                        })
                    })
            })
            .collect();
        if committed.is_empty() {
            self.lags.lock().expect("lags").clear();
            return None;
        }
        let shards = self.shards.clone();
        let lags = self.lags.clone();
        Some(tokio::spawn(async move {
            let mut measured = Vec::with_capacity(committed.len());
            for (group, topic, partition, committed) in committed {
                let position = position(&shards, topic.clone(), partition, committed).await;
                let lag = position.end.map(|end| end.saturating_sub(committed));
                let oldest_unconsumed_ms = position.oldest_unconsumed_ms;
                measured.push(Lag {
                    group,
                    topic,
                    partition,
                    committed,
                    lag,
                    oldest_unconsumed_ms,
                });
            }
            *lags.lock().expect("lags") = measured;
        }))
    }

    /// Group gauges for `/metrics`: members and generation of each group this broker
    /// coordinates, and each partition's committed offset and lag (as of the last refresh).
    pub(super) fn render_metrics(&self) -> String {
        use std::fmt::Write;
        let node = self.config.node_id;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP strata_group_members Members of each group this broker coordinates.\n# TYPE strata_group_members gauge"
        );
        let mut names: Vec<&String> = self.groups.keys().collect();
        names.sort();
        for name in &names {
            let _ = writeln!(
                out,
                "strata_group_members{{node=\"{node}\",group=\"{name}\"}} {}",
                self.groups[*name].core.member_count()
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_group_generation Generation of each group this broker coordinates.\n# TYPE strata_group_generation gauge"
        );
        for name in &names {
            let _ = writeln!(
                out,
                "strata_group_generation{{node=\"{node}\",group=\"{name}\"}} {}",
                self.groups[*name].core.generation()
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_transactions_aborted_by_timeout_total Transactions this broker's coordinator aborted because they outlived their transaction.timeout.ms.\n# TYPE strata_transactions_aborted_by_timeout_total counter\nstrata_transactions_aborted_by_timeout_total{{node=\"{node}\"}} {}",
            self.txn_aborts_by_timeout
        );
        let _ = writeln!(
            out,
            "# HELP strata_transactional_ids Transactional ids this broker coordinates, by the state of their transaction.\n# TYPE strata_transactional_ids gauge"
        );
        let mut states: std::collections::BTreeMap<&str, u64> = Default::default();
        for record in self.txns.core.records() {
            *states.entry(record.state.name()).or_default() += 1;
        }
        for (state, count) in states {
            let _ = writeln!(
                out,
                "strata_transactional_ids{{node=\"{node}\",state=\"{state}\"}} {count}"
            );
        }
        let lags = self.lags.lock().expect("lags");
        let _ = writeln!(
            out,
            "# HELP strata_group_committed_offset The next offset a group consumes, per partition.\n# TYPE strata_group_committed_offset gauge"
        );
        for lag in lags.iter() {
            let _ = writeln!(
                out,
                "strata_group_committed_offset{{node=\"{node}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                lag.group, lag.topic, lag.partition, lag.committed
            );
        }
        let _ = writeln!(
            out,
            "# HELP strata_consumer_lag Records between a group's committed offset and the high watermark.\n# TYPE strata_consumer_lag gauge"
        );
        for lag in lags.iter() {
            if let Some(value) = lag.lag {
                let _ = writeln!(
                    out,
                    "strata_consumer_lag{{node=\"{node}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {value}",
                    lag.group, lag.topic, lag.partition
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP strata_group_lag_seconds Age of the oldest record a group has not consumed (the one at its committed offset), per partition; 0 when caught up.\n# TYPE strata_group_lag_seconds gauge"
        );
        let now_ms = self.config.clock.wall_ms();
        for lag in lags.iter() {
            if let Some(seconds) = lag.seconds(now_ms) {
                let _ = writeln!(
                    out,
                    "strata_group_lag_seconds{{node=\"{node}\",group=\"{}\",topic=\"{}\",partition=\"{}\"}} {seconds:.3}",
                    lag.group, lag.topic, lag.partition
                );
            }
        }
        out
    }
}
