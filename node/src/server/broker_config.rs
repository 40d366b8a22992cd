//! Every setting a broker runs with, as Kafka's DescribeConfigs shows a broker's
//! (`kafka-configs --describe --entity-type brokers --all`, the broker pages of Kafka UIs):
//! under Kafka's name where a Kafka setting means the same (`num.partitions`,
//! `log.retention.ms`, ...), under `strata.` and Strata's own name otherwise. The topic
//! defaults are the broker's `log.*` settings, as in Kafka.
//!
//! Some settings change live (Kafka's dynamic broker configs): the topic defaults (every topic
//! without an override of its own takes the new value at once), `num.partitions` and
//! `default.replication.factor` (topics Kafka clients create without saying), and the cleaner's
//! and replica catch-up's rates. They are stored in the coordinator for every broker (the
//! `<default>` scope) or for one, and a broker's value wins over the default, which wins over
//! what the broker started with. The rest are read-only, set at start (flags, environment,
//! config file).

use std::collections::BTreeMap;

use strata_coordinator::TopicState;
use strata_coordinator::broker_configs::{BrokerConfigAlteration, BrokerConfigRecord, BrokerScope};

use super::NodeConfig;
use super::topic_config::{KEYS, TopicConfig};

/// Where a setting's value comes from, most specific first (Kafka's config sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingSource {
    /// Set live for this broker.
    DynamicBroker,
    /// Set live for every broker (the `<default>` scope).
    DynamicDefault,
    /// Set when the broker started.
    Static,
    /// Nobody set it.
    Default,
}

/// One broker setting: its name, its value (`None` unset), where that comes from, and
/// whether it can change live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerSetting {
    pub name: String,
    pub value: Option<String>,
    pub source: SettingSource,
    pub live: bool,
}

/// How a setting that changes live takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveSetting {
    /// The default of the topic setting named: topics without an override take it at once.
    TopicDefault(&'static str),
    /// The partitions of a topic a Kafka client creates without saying (`num.partitions`).
    NumPartitions,
    /// Its replication factor (`default.replication.factor`).
    DefaultReplicationFactor,
    /// The cleaner's read and write rate, bytes per second, shared by the broker's shards.
    CleanerIoRate,
    /// The rate of catch-up answers to replicas outside the ISR, bytes per second.
    ReplicaRecoveryRate,
}

pub const NUM_PARTITIONS: &str = "num.partitions";
pub const DEFAULT_REPLICATION_FACTOR: &str = "default.replication.factor";
pub const CLEANER_IO_RATE: &str = "log.cleaner.io.max.bytes.per.second";
pub const REPLICA_RECOVERY_RATE: &str = "strata.replica.recovery.bytes.per.sec";

/// What `name` is, when it is a setting that changes live.
pub fn live_setting(name: &str) -> Option<LiveSetting> {
    match name {
        NUM_PARTITIONS => Some(LiveSetting::NumPartitions),
        DEFAULT_REPLICATION_FACTOR => Some(LiveSetting::DefaultReplicationFactor),
        CLEANER_IO_RATE => Some(LiveSetting::CleanerIoRate),
        REPLICA_RECOVERY_RATE => Some(LiveSetting::ReplicaRecoveryRate),
        _ => KEYS
            .iter()
            .find(|key| broker_name_of_topic_setting(key) == name)
            .map(|key| LiveSetting::TopicDefault(key)),
    }
}

/// Checks one live setting's value: `Err` says why it is refused.
fn check_value(name: &str, value: &str) -> Result<(), String> {
    let positive = |max: u64| {
        value
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .map(drop)
            .ok_or_else(|| format!("{name}={value}: expected an integer from 1 to {max}"))
    };
    match live_setting(name) {
        None => Err(format!(
            "{name} cannot change while the broker runs (or is not a broker setting)"
        )),
        Some(LiveSetting::TopicDefault(key)) => {
            TopicConfig::parse(&BTreeMap::from([(key.to_string(), value.to_string())]))
                .map(drop)
                .map_err(|error| format!("{name}: {error}"))
        }
        Some(LiveSetting::NumPartitions) => positive(u64::from(u32::MAX)),
        Some(LiveSetting::DefaultReplicationFactor) => positive(i16::MAX as u64),
        Some(LiveSetting::CleanerIoRate | LiveSetting::ReplicaRecoveryRate) => positive(u64::MAX),
    }
}

/// The settings set live that apply to one broker, read from the coordinator's records: each
/// name's value and the scope it comes from (the broker's own wins over `<default>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicSettings {
    records: Vec<BrokerConfigRecord>,
    effective: BTreeMap<String, (String, BrokerScope)>,
    /// The topic defaults among them, under the topics' names.
    topic_defaults: BTreeMap<String, String>,
}

impl DynamicSettings {
    pub fn new(records: Vec<BrokerConfigRecord>, node_id: i32) -> DynamicSettings {
        let mut effective = BTreeMap::new();
        for scope in [BrokerScope::Default, BrokerScope::Broker(node_id)] {
            for record in records.iter().filter(|record| record.scope == scope) {
                for (name, value) in &record.values {
                    effective.insert(name.clone(), (value.clone(), scope));
                }
            }
        }
        let topic_defaults = effective
            .iter()
            .filter_map(|(name, (value, _))| match live_setting(name) {
                Some(LiveSetting::TopicDefault(key)) => Some((key.to_string(), value.clone())),
                _ => None,
            })
            .collect();
        DynamicSettings {
            records,
            effective,
            topic_defaults,
        }
    }

    /// The value set live for `name`, and for whom.
    pub fn get(&self, name: &str) -> Option<(&str, BrokerScope)> {
        self.effective
            .get(name)
            .map(|(value, scope)| (value.as_str(), *scope))
    }

    /// A numeric setting's live value; `None` when none is set (or, impossibly for a stored
    /// one, when it does not parse).
    pub fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.get(name).and_then(|(value, _)| value.parse().ok())
    }

    /// The settings stored for `scope` alone.
    pub fn of_scope(&self, scope: BrokerScope) -> BTreeMap<String, String> {
        self.records
            .iter()
            .find(|record| record.scope == scope)
            .map(|record| record.values.clone())
            .unwrap_or_default()
    }

    /// Every scope's stored settings.
    pub fn records(&self) -> &[BrokerConfigRecord] {
        &self.records
    }

    /// For whom the default of the topic setting `key` (`retention.ms`, ...) is set live.
    pub fn topic_default_scope(&self, key: &str) -> Option<BrokerScope> {
        self.get(&broker_name_of_topic_setting(key))
            .map(|(_, scope)| scope)
    }

    /// The topic defaults set live, under the topics' names (`retention.ms`, ...).
    pub fn topic_defaults(&self) -> &BTreeMap<String, String> {
        &self.topic_defaults
    }

    /// A topic's settings as this broker applies them: its overrides on top of the topic
    /// defaults set live.
    pub fn topic_config(&self, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        if self.topic_defaults.is_empty() {
            return overrides.clone();
        }
        let mut merged = self.topic_defaults.clone();
        merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged
    }

    /// Whether the controller may elect a leader of `topic` from outside its ISR: the topic's
    /// own setting, else the default set live.
    pub fn unclean_election(&self, topic: &TopicState) -> bool {
        topic
            .config
            .get("unclean.leader.election")
            .or_else(|| self.topic_defaults.get("unclean.leader.election"))
            .is_some_and(|value| value == "true")
    }

    /// Checks `alteration` before it is stored: every name it sets changes live and its value
    /// is valid, and the topic defaults it leaves every broker with parse together with each
    /// topic's overrides (a default no topic can open with is refused here, naming the topic,
    /// not found by a broker opening its partitions).
    pub fn check(
        &self,
        alteration: &BrokerConfigAlteration,
        topics: &[TopicState],
    ) -> Result<(), String> {
        alteration.check().map_err(|error| error.to_string())?;
        for (name, value) in &alteration.set {
            check_value(name, value)?;
        }
        let mut records = self.records.clone();
        strata_coordinator::broker_configs::apply(&mut records, alteration);
        for settings in every_broker(&records) {
            let defaults = settings.topic_defaults();
            TopicConfig::parse(defaults).map_err(|error| format!("the topic defaults: {error}"))?;
            for topic in topics {
                TopicConfig::parse(&settings.topic_config(&topic.config)).map_err(|error| {
                    format!("with these defaults, topic {}: {error}", topic.name)
                })?;
            }
        }
        Ok(())
    }
}

/// The settings `records` give each broker that can have different ones: each broker with
/// settings of its own, and any other.
fn every_broker(records: &[BrokerConfigRecord]) -> Vec<DynamicSettings> {
    records
        .iter()
        .filter_map(|record| match record.scope {
            BrokerScope::Broker(id) => Some(id),
            BrokerScope::Default => None,
        })
        .chain([-1])
        .map(|id| DynamicSettings::new(records.to_vec(), id))
        .collect()
}

/// Checks a topic's overrides as every broker would apply them, over its topic defaults set
/// live (`records`): a topic some broker could not open is refused before it is stored.
pub fn check_topic_settings(
    records: &[BrokerConfigRecord],
    overrides: &BTreeMap<String, String>,
) -> Result<(), String> {
    for settings in every_broker(records) {
        TopicConfig::parse(&settings.topic_config(overrides))?;
    }
    Ok(())
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
    /// Every setting this broker runs with, sorted by name: what it started with, under what
    /// `dynamic` sets live.
    pub fn broker_settings(&self, dynamic: &DynamicSettings) -> Vec<BrokerSetting> {
        let set = |name: &str, value: String| BrokerSetting {
            name: name.to_string(),
            value: Some(value),
            source: SettingSource::Static,
            live: false,
        };
        let optional = |name: &str, value: Option<String>| BrokerSetting {
            name: name.to_string(),
            source: if value.is_some() {
                SettingSource::Static
            } else {
                SettingSource::Default
            },
            value,
            live: false,
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
                    source: SettingSource::Default,
                    live: false,
                }),
        );
        settings.sort_by(|a, b| a.name.cmp(&b.name));
        settings.dedup_by(|a, b| a.name == b.name);
        overlay(&mut settings, dynamic);
        settings
    }
}

/// Marks the settings that change live, and puts the values `dynamic` sets over the others.
fn overlay(settings: &mut [BrokerSetting], dynamic: &DynamicSettings) {
    for setting in settings {
        setting.live = live_setting(&setting.name).is_some();
        if let Some((value, scope)) = dynamic.get(&setting.name) {
            setting.value = Some(value.to_string());
            setting.source = match scope {
                BrokerScope::Default => SettingSource::DynamicDefault,
                BrokerScope::Broker(_) => SettingSource::DynamicBroker,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(scope: BrokerScope, pairs: &[(&str, &str)]) -> BrokerConfigRecord {
        BrokerConfigRecord {
            scope,
            values: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn topic(name: &str, pairs: &[(&str, &str)]) -> TopicState {
        TopicState {
            name: name.into(),
            replication_factor: 1,
            config: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            partitions: Vec::new(),
            id: Default::default(),
        }
    }

    fn alteration(scope: BrokerScope, set: &[(&str, &str)]) -> BrokerConfigAlteration {
        BrokerConfigAlteration {
            scope,
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            delete: Vec::new(),
            replace: false,
        }
    }

    /// A broker's own value wins over the one for every broker; the topic defaults among them
    /// go under the topics' names, below each topic's overrides.
    #[test]
    fn a_brokers_own_settings_win_and_topic_defaults_sit_under_overrides() {
        let records = vec![
            record(
                BrokerScope::Default,
                &[
                    ("log.retention.ms", "1000"),
                    ("num.partitions", "3"),
                    ("unclean.leader.election.enable", "true"),
                ],
            ),
            record(BrokerScope::Broker(2), &[("log.retention.ms", "2000")]),
            record(BrokerScope::Broker(3), &[("num.partitions", "9")]),
        ];
        let two = DynamicSettings::new(records.clone(), 2);
        assert_eq!(
            two.get("log.retention.ms"),
            Some(("2000", BrokerScope::Broker(2)))
        );
        assert_eq!(two.number::<u32>("num.partitions"), Some(3));
        assert_eq!(
            two.topic_default_scope("retention.ms"),
            Some(BrokerScope::Broker(2))
        );
        let own = topic("own", &[("retention.ms", "5")]);
        let plain = topic("plain", &[]);
        assert_eq!(two.topic_config(&own.config)["retention.ms"], "5");
        assert_eq!(two.topic_config(&plain.config)["retention.ms"], "2000");
        assert!(two.unclean_election(&plain));
        assert!(!two.unclean_election(&topic("clean", &[("unclean.leader.election", "false")])));
        let one = DynamicSettings::new(records, 1);
        assert_eq!(one.topic_config(&plain.config)["retention.ms"], "1000");
        assert_eq!(one.of_scope(BrokerScope::Broker(3))["num.partitions"], "9");
        assert_eq!(
            DynamicSettings::default().topic_config(&own.config),
            own.config
        );
    }

    #[test]
    fn what_a_broker_describes_says_where_each_value_comes_from() {
        let dynamic = DynamicSettings::new(
            vec![
                record(BrokerScope::Default, &[("num.partitions", "4")]),
                record(BrokerScope::Broker(1), &[("log.segment.bytes", "65536")]),
                record(BrokerScope::Broker(2), &[("log.retention.ms", "5")]),
            ],
            1,
        );
        let started = |name: &str, value: &str, source| BrokerSetting {
            name: name.into(),
            value: Some(value.into()),
            source,
            live: false,
        };
        let mut settings = vec![
            started("broker.id", "1", SettingSource::Static),
            started("num.partitions", "1", SettingSource::Static),
            started("log.segment.bytes", "1073741824", SettingSource::Default),
            started("log.retention.ms", "604800000", SettingSource::Default),
        ];
        overlay(&mut settings, &dynamic);
        let find = |name: &str| settings.iter().find(|s| s.name == name).unwrap().clone();
        let partitions = find("num.partitions");
        assert_eq!(partitions.value.as_deref(), Some("4"));
        assert_eq!(partitions.source, SettingSource::DynamicDefault);
        assert!(partitions.live);
        let segment = find("log.segment.bytes");
        assert_eq!(segment.value.as_deref(), Some("65536"));
        assert_eq!(segment.source, SettingSource::DynamicBroker);
        let retention = find("log.retention.ms");
        assert_eq!(retention.source, SettingSource::Default, "broker 2's alone");
        assert_eq!(retention.value.as_deref(), Some("604800000"));
        assert!(retention.live);
        let id = find("broker.id");
        assert_eq!(id.source, SettingSource::Static);
        assert!(!id.live, "a broker's id never changes live");
    }

    /// Only settings that change live, with valid values, and defaults every topic still
    /// parses with, whichever broker they reach.
    #[test]
    fn alterations_are_checked_against_names_values_and_every_topic() {
        let settings = DynamicSettings::new(
            vec![record(
                BrokerScope::Broker(2),
                &[("log.cleaner.max.compaction.lag.ms", "100")],
            )],
            1,
        );
        let topics = [topic("lagged", &[("max.compaction.lag.ms", "60000")])];
        let check = |alteration| settings.check(&alteration, &topics);
        for ok in [
            &[("log.retention.ms", "60000"), ("num.partitions", "3")][..],
            &[("log.cleaner.io.max.bytes.per.second", "1048576")],
            &[("strata.replica.recovery.bytes.per.sec", "1048576")],
            &[("unclean.leader.election.enable", "true")],
            &[("default.replication.factor", "3")],
        ] {
            assert_eq!(
                check(alteration(BrokerScope::Default, ok)),
                Ok(()),
                "{ok:?}"
            );
        }
        for refused in [
            &[("broker.id", "5")][..],
            &[("no.such.setting", "1")],
            &[("num.partitions", "0")],
            &[("default.replication.factor", "40000")],
            &[("log.segment.bytes", "-5")],
            &[("log.cleaner.io.max.bytes.per.second", "0")],
        ] {
            assert!(
                check(alteration(BrokerScope::Default, refused)).is_err(),
                "{refused:?}"
            );
        }
        // Above the topic's own maximum: refused, naming it.
        let lag = [("log.cleaner.min.compaction.lag.ms", "120000")];
        let why = check(alteration(BrokerScope::Broker(1), &lag)).unwrap_err();
        assert!(why.contains("lagged"), "{why}");
        // Below the topic's maximum, but above broker 2's own default maximum for the topics
        // without theirs: every broker's settings are checked.
        let lag = [("log.cleaner.min.compaction.lag.ms", "1000")];
        assert!(check(alteration(BrokerScope::Default, &lag)).is_err());
        assert_eq!(check(alteration(BrokerScope::Broker(3), &lag)), Ok(()));

        // A new topic's overrides, as each broker would apply them.
        let records = settings.records();
        let min_lag =
            |ms: &str| BTreeMap::from([("min.compaction.lag.ms".to_string(), ms.to_string())]);
        assert_eq!(check_topic_settings(records, &min_lag("50")), Ok(()));
        assert!(
            check_topic_settings(records, &min_lag("500")).is_err(),
            "above broker 2's maximum"
        );
    }

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
