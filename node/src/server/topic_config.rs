//! Topic configuration: Kafka-style string keys, validated into typed settings.

use std::collections::BTreeMap;

use crate::log::{DirectWrites, FlushPolicy, LogConfig, SEGMENT_BYTES_MAX};

/// A topic's settings, parsed.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    pub log: LogConfig,
    /// The largest produce payload for one partition.
    pub max_message_bytes: usize,
    pub min_insync_replicas: u16,
    pub unclean_leader_election: bool,
}

pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Every key a topic accepts, for error messages and `topic describe`.
pub const KEYS: &[&str] = &[
    "flush",
    "flush.interval.ms",
    "segment.bytes",
    "segment.ms",
    "retention.ms",
    "retention.bytes",
    "index.interval.bytes",
    "max.message.bytes",
    "preallocate",
    "direct.writes",
    "min.insync.replicas",
    "unclean.leader.election",
];

impl TopicConfig {
    /// Parses `overrides` on top of the defaults. Unknown keys and bad values are errors that
    /// name the key, so `topic create` fails before anything is stored.
    pub fn parse(overrides: &BTreeMap<String, String>) -> Result<TopicConfig, String> {
        let mut config = TopicConfig {
            log: LogConfig::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            min_insync_replicas: 1,
            unclean_leader_election: false,
        };
        let mut flush = None;
        let mut flush_interval_ms = 1000u64;
        for (key, value) in overrides {
            let bad = |expected: &str| format!("{key}={value}: expected {expected}");
            let number = || value.parse::<i64>().map_err(|_| bad("an integer"));
            // Kafka spells "no limit" as -1.
            let limit = || -> Result<Option<i64>, String> {
                match number()? {
                    -1 => Ok(None),
                    n if n >= 0 => Ok(Some(n)),
                    _ => Err(bad("-1 (no limit) or a non-negative integer")),
                }
            };
            match key.as_str() {
                "flush" => flush = Some(value.as_str()),
                "flush.interval.ms" => {
                    flush_interval_ms = u64::try_from(number()?)
                        .ok()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| bad("a positive integer"))?;
                }
                "segment.bytes" => {
                    config.log.segment_bytes = u64::try_from(number()?)
                        .ok()
                        .filter(|bytes| (1024..=SEGMENT_BYTES_MAX).contains(bytes))
                        .ok_or_else(|| bad(&format!("1024 to {SEGMENT_BYTES_MAX}")))?;
                }
                "segment.ms" => config.log.segment_ms = limit()?,
                "retention.ms" => config.log.retention_ms = limit()?,
                "retention.bytes" => config.log.retention_bytes = limit()?.map(|n| n as u64),
                "index.interval.bytes" => {
                    config.log.index_interval_bytes = u32::try_from(number()?)
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("a positive integer"))?;
                }
                "max.message.bytes" => {
                    config.max_message_bytes = usize::try_from(number()?)
                        .ok()
                        .filter(|n| *n >= 1024)
                        .ok_or_else(|| bad("at least 1024"))?;
                }
                "preallocate" => {
                    config.log.preallocate = value.parse().map_err(|_| bad("true or false"))?;
                }
                "direct.writes" => {
                    config.log.direct_writes = DirectWrites::parse(value)
                        .ok_or_else(|| bad("never, replicated or always"))?;
                }
                "min.insync.replicas" => {
                    config.min_insync_replicas = u16::try_from(number()?)
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| bad("a positive integer"))?;
                }
                "unclean.leader.election" => {
                    config.unclean_leader_election =
                        value.parse().map_err(|_| bad("true or false"))?;
                }
                _ => {
                    return Err(format!(
                        "unknown topic config {key:?} (known: {})",
                        KEYS.join(", ")
                    ));
                }
            }
        }
        config.log.flush = match flush {
            None | Some("interval") => FlushPolicy::Interval {
                interval_ms: flush_interval_ms,
            },
            Some("always") => FlushPolicy::Always,
            Some("never") => FlushPolicy::Never,
            Some(other) => {
                return Err(format!("flush={other}: expected always, interval or never"));
            }
        };
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<TopicConfig, String> {
        TopicConfig::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn values_and_errors() {
        let config = parse(&[
            ("flush", "always"),
            ("retention.ms", "-1"),
            ("segment.bytes", "1048576"),
        ])
        .unwrap();
        assert_eq!(config.log.flush, FlushPolicy::Always);
        assert_eq!(config.log.retention_ms, None);
        assert_eq!(config.log.segment_bytes, 1 << 20);
        let config = parse(&[("flush.interval.ms", "5")]).unwrap();
        assert_eq!(config.log.flush, FlushPolicy::Interval { interval_ms: 5 });
        assert!(
            parse(&[("flush", "sometimes")])
                .unwrap_err()
                .contains("flush")
        );
        assert!(
            parse(&[("segment.bytes", "12")])
                .unwrap_err()
                .contains("segment.bytes")
        );
        assert_eq!(
            parse(&[]).unwrap().log.direct_writes,
            DirectWrites::Replicated
        );
        assert_eq!(
            parse(&[("direct.writes", "always")])
                .unwrap()
                .log
                .direct_writes,
            DirectWrites::Always
        );
        assert!(
            parse(&[("direct.writes", "sometimes")])
                .unwrap_err()
                .contains("direct.writes")
        );
        assert!(parse(&[("colour", "red")]).unwrap_err().contains("unknown"));
        assert!(parse(&[("retention.ms", "-5")]).is_err());
    }
}
