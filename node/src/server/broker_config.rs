//! Every setting a broker runs with, as Kafka's DescribeConfigs shows a broker's
//! (`kafka-configs --describe --entity-type brokers --all`, the broker pages of Kafka UIs):
//! under Kafka's name where a Kafka setting means the same (`num.partitions`,
//! `log.retention.ms`, ...), under `strata.` and Strata's own name otherwise. The topic
//! defaults are the broker's `log.*` settings, as in Kafka. None changes live yet: all are
//! read-only, set at start (flags, environment, config file).

use super::NodeConfig;
use super::topic_config::TopicConfig;

/// One broker setting: its name, its value (`None` unset) and whether it is the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerSetting {
    pub name: String,
    pub value: Option<String>,
    pub is_default: bool,
}

/// A topic setting's broker-level name in Kafka (`retention.ms` is the broker's
/// `log.retention.ms`), or Strata's own under `strata.log.`.
fn broker_name_of_topic_setting(key: &str) -> String {
    let kafka = match key {
        "segment.bytes" => "log.segment.bytes",
        "segment.ms" => "log.roll.ms",
        "retention.ms" => "log.retention.ms",
        "retention.bytes" => "log.retention.bytes",
        "index.interval.bytes" => "log.index.interval.bytes",
        "max.message.bytes" => "message.max.bytes",
        "preallocate" => "log.preallocate",
        "min.insync.replicas" => "min.insync.replicas",
        "unclean.leader.election" => "unclean.leader.election.enable",
        "compression.type" => "compression.type",
        "message.format.version" => "log.message.format.version",
        "cleanup.policy" => "log.cleanup.policy",
        "delete.retention.ms" => "log.cleaner.delete.retention.ms",
        "min.cleanable.dirty.ratio" => "log.cleaner.min.cleanable.ratio",
        "min.compaction.lag.ms" => "log.cleaner.min.compaction.lag.ms",
        "max.compaction.lag.ms" => "log.cleaner.max.compaction.lag.ms",
        "flush.interval.ms" => "log.flush.interval.ms",
        other => return format!("strata.log.{other}"),
    };
    kafka.to_string()
}

impl NodeConfig {
    /// Every setting this broker runs with, sorted by name.
    pub fn broker_settings(&self) -> Vec<BrokerSetting> {
        let set = |name: &str, value: String| BrokerSetting {
            name: name.to_string(),
            value: Some(value),
            is_default: false,
        };
        let optional = |name: &str, value: Option<String>| BrokerSetting {
            name: name.to_string(),
            is_default: value.is_none(),
            value,
        };
        let millis = |duration: Option<std::time::Duration>| {
            duration.map(|duration| duration.as_millis().to_string())
        };
        let kafka_listeners: Vec<String> = self
            .kafka
            .iter()
            .map(|spec| format!("{}://{}", spec.protocol.name(), spec.address))
            .collect();
        let advertised: Vec<String> = self
            .kafka
            .iter()
            .map(|spec| {
                let port = spec.address.port();
                format!("{}://{}:{port}", spec.protocol.name(), self.advertised_host)
            })
            .collect();
        let mut settings = vec![
            set("broker.id", self.node_id.to_string()),
            set("node.id", self.node_id.to_string()),
            optional("broker.rack", self.rack.clone()),
            set("log.dirs", self.data_dir.display().to_string()),
            set("listeners", kafka_listeners.join(",")),
            set("advertised.listeners", advertised.join(",")),
            set(
                "num.partitions",
                self.kafka_topic_defaults.partitions.to_string(),
            ),
            set(
                "default.replication.factor",
                self.kafka_topic_defaults.replication_factor.to_string(),
            ),
            set(
                "auto.create.topics.enable",
                self.kafka_auto_create_topics.to_string(),
            ),
            set("socket.request.max.bytes", self.max_frame_bytes.to_string()),
            set(
                "replica.lag.time.max.ms",
                self.replica_lag_time_max_ms.to_string(),
            ),
            set(
                "auto.leader.rebalance.enable",
                self.leader_rebalance_interval.is_some().to_string(),
            ),
            optional(
                "strata.leader.rebalance.interval.ms",
                millis(self.leader_rebalance_interval),
            ),
            optional(
                "strata.offsets.retention.ms",
                millis(self.offsets_retention),
            ),
            set(
                "group.initial.rebalance.delay.ms",
                self.group_initial_rebalance_delay_ms.to_string(),
            ),
            set(
                "group.consumer.session.timeout.ms",
                self.group_consumer_session_timeout_ms.to_string(),
            ),
            set(
                "log.retention.check.interval.ms",
                self.retention_check_interval.as_millis().to_string(),
            ),
            set(
                "log.cleaner.dedupe.buffer.size",
                (self.cleaner.memory_bytes * self.shards).to_string(),
            ),
            optional(
                "log.cleaner.io.max.bytes.per.second",
                self.cleaner.io_bytes_per_sec.map(|rate| rate.to_string()),
            ),
            set(
                "log.cleaner.backoff.ms",
                self.cleaner.check_interval.as_millis().to_string(),
            ),
            set("quota.window.num", self.quota_window.samples.to_string()),
            set(
                "quota.window.size.seconds",
                self.quota_window.window.as_secs().to_string(),
            ),
            optional(
                "strata.replica.recovery.bytes.per.sec",
                self.replica_recovery_bytes_per_sec
                    .map(|rate| rate.to_string()),
            ),
            set("strata.cluster", self.cluster.clone()),
            set("strata.shards", self.shards.to_string()),
            set("strata.listen", self.listen.to_string()),
            set("strata.replication", self.replication.to_string()),
            optional("strata.etcd", self.etcd.as_ref().map(|e| e.join(","))),
            set("strata.tail.cache.bytes", self.tail_cache_bytes.to_string()),
            set("strata.pin.cores", self.pin_cores.to_string()),
        ];
        let defaults =
            TopicConfig::parse(&Default::default()).expect("the default topic settings parse");
        settings.extend(
            defaults
                .entries()
                .into_iter()
                .map(|(key, value)| BrokerSetting {
                    name: broker_name_of_topic_setting(key),
                    value: Some(value),
                    is_default: true,
                }),
        );
        settings.sort_by(|a, b| a.name.cmp(&b.name));
        settings.dedup_by(|a, b| a.name == b.name);
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_settings_take_kafkas_broker_names_or_strata_ones() {
        assert_eq!(
            broker_name_of_topic_setting("retention.ms"),
            "log.retention.ms"
        );
        assert_eq!(
            broker_name_of_topic_setting("max.message.bytes"),
            "message.max.bytes"
        );
        assert_eq!(
            broker_name_of_topic_setting("direct.writes"),
            "strata.log.direct.writes"
        );
    }
}
