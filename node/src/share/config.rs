//! A share group's configs (Kafka's GROUP config resource), typed. The broker checks values when
//! they are set; here a value that does not read (never expected) falls back to its default.

use std::collections::BTreeMap;
use std::time::Duration;

use super::partition::ShareSettings;

/// Where a share-partition starts when the group first reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOffsetReset {
    Earliest,
    /// Kafka's default: only records produced from now on.
    Latest,
    /// The first record no older than this.
    ByDuration(Duration),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupConfig {
    pub partition: ShareSettings,
    pub auto_offset_reset: AutoOffsetReset,
    pub read_committed: bool,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    /// KIP-1191's `errors.deadletterqueue.topic.name`.
    pub dead_letter_topic: Option<String>,
}

impl Default for ShareGroupConfig {
    fn default() -> ShareGroupConfig {
        ShareGroupConfig::from_configs(None)
    }
}

impl ShareGroupConfig {
    /// The group's configs as set (`None`: none set).
    pub fn from_configs(configs: Option<&BTreeMap<String, String>>) -> ShareGroupConfig {
        let get = |name: &str| configs.and_then(|configs| configs.get(name)).map(String::as_str);
        let millis = |name: &str, default: u64| {
            Duration::from_millis(get(name).and_then(|v| v.parse().ok()).unwrap_or(default))
        };
        let dead_letter_topic = get("errors.deadletterqueue.topic.name")
            .filter(|topic| !topic.is_empty())
            .map(str::to_string);
        ShareGroupConfig {
            partition: ShareSettings {
                lock_duration: millis("share.record.lock.duration.ms", 30_000),
                delivery_limit: get("share.delivery.count.limit")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(5),
                key_ordering: get("strata.share.key.ordering") == Some("true"),
                redelivery_backoff: millis("strata.share.redelivery.backoff.ms", 0),
                redelivery_backoff_max: millis("strata.share.redelivery.backoff.max.ms", 60_000),
                dead_letters: dead_letter_topic.is_some(),
                ..ShareSettings::default()
            },
            auto_offset_reset: match get("share.auto.offset.reset") {
                Some("earliest") => AutoOffsetReset::Earliest,
                Some(other) => other
                    .strip_prefix("by_duration:")
                    .and_then(iso8601_duration)
                    .map_or(AutoOffsetReset::Latest, AutoOffsetReset::ByDuration),
                None => AutoOffsetReset::Latest,
            },
            read_committed: get("share.isolation.level") == Some("read_committed"),
            heartbeat_interval: millis("share.heartbeat.interval.ms", 5_000),
            session_timeout: millis("share.session.timeout.ms", 45_000),
            dead_letter_topic,
        }
    }
}

/// An ISO-8601 duration of days, hours, minutes and seconds (`P1DT2H`, `PT30M`, `PT0.5S`).
pub fn iso8601_duration(text: &str) -> Option<Duration> {
    let rest = text.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((days, time)) => (days, Some(time)),
        None => (rest, None),
    };
    let mut seconds = 0f64;
    if !days.is_empty() {
        seconds += days.strip_suffix('D')?.parse::<f64>().ok()? * 86_400.0;
    }
    if let Some(mut time) = time {
        if time.is_empty() {
            return None;
        }
        for (unit, scale) in [('H', 3_600.0), ('M', 60.0), ('S', 1.0)] {
            if let Some((number, after)) = time.split_once(unit) {
                seconds += number.parse::<f64>().ok()? * scale;
                time = after;
            }
        }
        if !time.is_empty() {
            return None;
        }
    }
    (seconds.is_finite() && seconds >= 0.0 && (!days.is_empty() || time.is_some()))
        .then(|| Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_defaults_unless_set() {
        let config = ShareGroupConfig::default();
        assert_eq!(config.auto_offset_reset, AutoOffsetReset::Latest);
        assert_eq!(config.partition.lock_duration, Duration::from_secs(30));
        assert_eq!(config.partition.delivery_limit, 5);
        assert!(!config.read_committed && !config.partition.key_ordering);
        let set: BTreeMap<String, String> = [
            ("share.auto.offset.reset", "by_duration:PT1H"),
            ("share.record.lock.duration.ms", "2000"),
            ("share.isolation.level", "read_committed"),
            ("share.delivery.count.limit", "3"),
            ("strata.share.key.ordering", "true"),
            ("errors.deadletterqueue.topic.name", "dead"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = ShareGroupConfig::from_configs(Some(&set));
        assert_eq!(
            config.auto_offset_reset,
            AutoOffsetReset::ByDuration(Duration::from_secs(3600))
        );
        assert_eq!(config.partition.lock_duration, Duration::from_secs(2));
        assert_eq!(config.partition.delivery_limit, 3);
        assert!(config.read_committed && config.partition.key_ordering);
        assert!(config.partition.dead_letters);
        assert_eq!(config.dead_letter_topic.as_deref(), Some("dead"));
    }

    #[test]
    fn iso8601_durations() {
        assert_eq!(iso8601_duration("P1D"), Some(Duration::from_secs(86_400)));
        assert_eq!(
            iso8601_duration("P1DT2H3M4S"),
            Some(Duration::from_secs(86_400 + 7_200 + 180 + 4))
        );
        assert_eq!(iso8601_duration("PT0.5S"), Some(Duration::from_millis(500)));
        for bad in ["", "P", "PT", "1D", "PT5X", "P1H"] {
            assert_eq!(iso8601_duration(bad), None, "{bad}");
        }
    }
}
