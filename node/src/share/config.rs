//! A share group's configs (Kafka's GROUP config resource), typed. The broker checks values when
//! they are set; here a value that does not read (never expected) falls back to its default.

use std::collections::BTreeMap;
use std::time::Duration;

use super::partition::ShareSettings;

/// Where a share group starts on a partition it has no offset for (`share.auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOffsetReset {
    Earliest,
    Latest,
    /// The first record whose timestamp is at most this long ago.
    ByDuration(Duration),
}

impl AutoOffsetReset {
    /// `earliest`, `latest` or `by_duration:<ISO-8601 duration>`, as Kafka takes them.
    pub fn parse(value: &str) -> Result<AutoOffsetReset, String> {
        match value {
            "earliest" => Ok(AutoOffsetReset::Earliest),
            "latest" => Ok(AutoOffsetReset::Latest),
            _ => match value.strip_prefix("by_duration:") {
                Some(duration) => iso8601_duration(duration)
                    .map(AutoOffsetReset::ByDuration)
                    .ok_or_else(|| {
                        format!(
                            "{duration:?} is not a non-negative ISO-8601 duration \
                             (PnDTnHnMn.nS, as PT1H or P1DT12H)"
                        )
                    }),
                None => {
                    Err("expected earliest, latest or by_duration:<ISO-8601 duration>".to_string())
                }
            },
        }
    }
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
    /// Strata's delayed delivery (`strata.share.delayed.delivery`): records' delivery times
    /// are read from their headers (off, records are listed a batch at a time, unread).
    pub delayed_delivery: bool,
    /// KIP-1222's `share.renew.acknowledge.enable`: members may RENEW their locks.
    pub renew_enabled: bool,
}

impl Default for ShareGroupConfig {
    fn default() -> ShareGroupConfig {
        ShareGroupConfig::from_configs(None)
    }
}

impl ShareGroupConfig {
    /// The group's configs as set (`None`: none set).
    pub fn from_configs(configs: Option<&BTreeMap<String, String>>) -> ShareGroupConfig {
        let get = |name: &str| {
            configs
                .and_then(|configs| configs.get(name))
                .map(String::as_str)
        };
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
            auto_offset_reset: get("share.auto.offset.reset")
                .and_then(|value| AutoOffsetReset::parse(value).ok())
                .unwrap_or(AutoOffsetReset::Latest),
            read_committed: get("share.isolation.level") == Some("read_committed"),
            heartbeat_interval: millis("share.heartbeat.interval.ms", 5_000),
            session_timeout: millis("share.session.timeout.ms", 45_000),
            dead_letter_topic,
            delayed_delivery: get("strata.share.delayed.delivery") == Some("true"),
            renew_enabled: get("share.renew.acknowledge.enable") != Some("false"),
        }
    }
}

/// An ISO-8601 duration as Java's `Duration.parse` (what Kafka reads `by_duration:` with)
/// takes it, `PnDTnHnMn.nS`, any letters' case, each part optional but one, without its
/// signs: Kafka refuses a negative duration. `None` when `text` is none, or too long to hold.
pub fn iso8601_duration(text: &str) -> Option<Duration> {
    let upper = text.to_ascii_uppercase();
    let rest = upper.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((days, time)) => (days, Some(time)),
        None => (rest, None),
    };
    let mut seconds: u64 = 0;
    let mut nanos: u32 = 0;
    let mut parts = 0;
    let mut add = |count: u64, unit: u64| -> Option<()> {
        seconds = seconds.checked_add(count.checked_mul(unit)?)?;
        parts += 1;
        Some(())
    };
    if !days.is_empty() {
        add(digits(days.strip_suffix('D')?)?, 86_400)?;
    }
    if let Some(mut time) = time {
        // "P1DT" has a time part with nothing in it: Java refuses it too.
        if time.is_empty() {
            return None;
        }
        for (unit, length) in [('H', 3_600), ('M', 60)] {
            if let Some((count, after)) = time.split_once(unit) {
                add(digits(count)?, length)?;
                time = after;
            }
        }
        if !time.is_empty() {
            let given = time.strip_suffix('S')?;
            let (whole, fraction) = match given.split_once(['.', ',']) {
                Some((whole, fraction)) => (whole, Some(fraction)),
                None => (given, None),
            };
            add(digits(whole)?, 1)?;
            if let Some(fraction) = fraction {
                // Up to nanoseconds, as Java takes them.
                if fraction.is_empty() || fraction.len() > 9 {
                    return None;
                }
                let padded = format!("{fraction:0<9}");
                nanos = u32::try_from(digits(&padded)?).ok()?;
            }
        }
    }
    (parts > 0).then(|| Duration::new(seconds, nanos))
}

/// `text` as a number, when it is only decimal digits (no sign, no space).
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
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
    fn auto_offset_reset_is_earliest_latest_or_a_duration_ago() {
        let parse = AutoOffsetReset::parse;
        assert_eq!(parse("earliest"), Ok(AutoOffsetReset::Earliest));
        assert_eq!(parse("latest"), Ok(AutoOffsetReset::Latest));
        assert_eq!(
            parse("by_duration:PT1H"),
            Ok(AutoOffsetReset::ByDuration(Duration::from_secs(3_600)))
        );
        for bad in [
            "",
            "none",
            "Earliest",
            "by_duration:",
            "by_duration:1h",
            "by_duration:-PT1H",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_are_java_s_day_time_form() {
        let seconds = |text| iso8601_duration(text).map(|d| d.as_secs_f64());
        assert_eq!(seconds("P1D"), Some(86_400.0));
        assert_eq!(seconds("PT1H"), Some(3_600.0));
        assert_eq!(seconds("PT15M"), Some(900.0));
        assert_eq!(seconds("PT20S"), Some(20.0));
        assert_eq!(seconds("PT0S"), Some(0.0));
        assert_eq!(seconds("PT1.5S"), Some(1.5));
        assert_eq!(seconds("PT0,25S"), Some(0.25));
        assert_eq!(
            seconds("P2DT3H4M5S"),
            Some(2.0 * 86_400.0 + 3.0 * 3_600.0 + 245.0)
        );
        assert_eq!(seconds("pt2h30m"), Some(9_000.0), "any case");
        assert_eq!(seconds("PT36H"), Some(129_600.0), "hours past a day");
        for bad in [
            "",
            "P",
            "PT",
            "P1DT",
            "1H",
            "PT1",
            "P1H",
            "PT1D",
            "PT1M1H",
            "P1W",
            "P1Y",
            "P-1D",
            "PT+1H",
            "PT1.S",
            "PT1.1234567891S",
            "PT.5S",
            "PT1H ",
            " PT1H",
            "P99999999999999999999D",
            "P999999999999999D",
        ] {
            assert_eq!(iso8601_duration(bad), None, "{bad:?}");
        }
    }
}
