//! Topic configuration: Kafka-style string keys, validated into typed settings.

use std::collections::BTreeMap;

use strata_wire::batch::kafka::KafkaCodec;

use crate::log::{CleanupPolicy, DirectWrites, FlushPolicy, LogConfig, SEGMENT_BYTES_MAX};

/// A topic's settings, parsed.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    pub log: LogConfig,
    /// The largest produce payload for one partition.
    pub max_message_bytes: usize,
    pub min_insync_replicas: u16,
    pub unclean_leader_election: bool,
    /// The most each leader broker sends per second to replicas of this topic outside the ISR
    /// (`replica.recovery.bytes.per.sec`; on top of the broker's own limit); `None`: no limit.
    pub recovery_bytes_per_sec: Option<u64>,
    /// Kafka's `compression.type`, one of [`COMPRESSION_TYPES`]: the codec batches produced
    /// through the Kafka listener are stored with ([`kafka_compression_codec`]). Native
    /// producers' batches are stored as they were sent.
    pub compression_type: &'static str,
    /// Kafka's `message.format.version`: kept and shown, without effect, as on Kafka 3.0 and
    /// later (KIP-724): every batch is stored in the current format.
    pub message_format_version: String,
    /// Kafka's compaction settings (`delete.retention.ms`, `min.compaction.lag.ms`,
    /// `max.compaction.lag.ms`, `min.cleanable.dirty.ratio`), in that order, as given (and shown
    /// so); parsed into `log.compaction`. They act only on compacted topics, in Kafka as here.
    pub compaction: [String; 4],
}

/// Kafka's compaction settings and their defaults (Kafka's), in [`TopicConfig::compaction`]'s
/// order.
const COMPACTION_KEYS: [(&str, &str); 4] = [
    ("delete.retention.ms", "86400000"),
    ("min.compaction.lag.ms", "0"),
    ("max.compaction.lag.ms", "9223372036854775807"),
    ("min.cleanable.dirty.ratio", "0.5"),
];

/// Kafka's `compression.type` values; `producer` (the default) keeps each batch's own codec.
pub const COMPRESSION_TYPES: &[&str] =
    &["producer", "uncompressed", "zstd", "lz4", "snappy", "gzip"];

/// The codec a Kafka batch is stored with under `compression.type`, a value of
/// [`COMPRESSION_TYPES`] (`None` for any other): `Some(None)` keeps the batch's own
/// (`producer`); any other recompresses a batch sent with another codec, as Kafka's broker does.
pub fn kafka_compression_codec(compression_type: &str) -> Option<Option<KafkaCodec>> {
    match compression_type {
        "producer" => Some(None),
        "uncompressed" => Some(Some(KafkaCodec::None)),
        "lz4" => Some(Some(KafkaCodec::Lz4)),
        "snappy" => Some(Some(KafkaCodec::Snappy)),
        "zstd" => Some(Some(KafkaCodec::Zstd)),
        "gzip" => Some(Some(KafkaCodec::Gzip)),
        _ => None,
    }
}

/// What `message.format.version` shows when a topic does not set it (Kafka 3's).
const DEFAULT_MESSAGE_FORMAT_VERSION: &str = "3.0-IV1";

/// A Kafka version as `message.format.version` spells them: `0.10.2`, `2.8-IV1`, `3.0`.
fn is_kafka_version(value: &str) -> bool {
    let (release, iv) = value.split_once("-IV").unwrap_or((value, "0"));
    let parts: Vec<&str> = release.split('.').collect();
    (2..=4).contains(&parts.len())
        && parts
            .iter()
            .chain([&iv])
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// `flush=interval`'s period unless `flush.interval.ms` says otherwise.
const DEFAULT_FLUSH_INTERVAL_MS: u64 = 1000;

/// Every key a topic accepts, for error messages and `topic describe`.
pub const KEYS: &[&str] = &[
    "flush",
    "flush.interval.ms",
    "segment.bytes",
    "segment.ms",
    "retention.ms",
    "retention.bytes",
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
    "index.interval.bytes",
    "max.message.bytes",
    "preallocate",
    "preallocate.step.bytes",
    "direct.writes",
    "direct.write.min.bytes",
    "min.insync.replicas",
    "unclean.leader.election",
    "replica.recovery.bytes.per.sec",
    "compression.type",
    "message.timestamp.type",
    "message.format.version",
    "cleanup.policy",
    "delete.retention.ms",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "min.cleanable.dirty.ratio",
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
            recovery_bytes_per_sec: None,
            compression_type: "producer",
            message_format_version: DEFAULT_MESSAGE_FORMAT_VERSION.to_string(),
            compaction: COMPACTION_KEYS.map(|(_, default)| default.to_string()),
        };
        let mut flush = None;
        let mut flush_interval_ms = DEFAULT_FLUSH_INTERVAL_MS;
        // `local.retention.ms` and `.bytes` as given (`None` inside: Kafka's -2).
        let mut locals = (None, None);
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
                "remote.storage.enable" | "local.retention.ms" | "local.retention.bytes" => {
                    set_tiering(&mut config, &mut locals, key, value)?;
                }
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
                "preallocate.step.bytes" => {
                    config.log.preallocate_step_bytes = u64::try_from(number()?)
                        .map_err(|_| bad("0 (off) or a positive integer"))?;
                }
                "direct.writes" => {
                    config.log.direct_writes = DirectWrites::parse(value)
                        .ok_or_else(|| bad("never, replicated, auto or always"))?;
                }
                "direct.write.min.bytes" => {
                    config.log.direct_write_min_bytes =
                        u64::try_from(number()?).map_err(|_| bad("a non-negative integer"))?;
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
                "replica.recovery.bytes.per.sec" => {
                    config.recovery_bytes_per_sec = match number()? {
                        -1 => None,
                        n if n > 0 => Some(n as u64),
                        _ => return Err(bad("-1 (no limit) or a positive integer")),
                    };
                }
                "compression.type" => {
                    config.compression_type = COMPRESSION_TYPES
                        .iter()
                        .find(|known| **known == value.as_str())
                        .ok_or_else(|| bad(&COMPRESSION_TYPES.join(", ")))?;
                }
                "message.timestamp.type" => {
                    config.log.log_append_time = match value.as_str() {
                        "CreateTime" => false,
                        "LogAppendTime" => true,
                        _ => return Err(bad("CreateTime or LogAppendTime")),
                    };
                }
                "message.format.version" => {
                    if !is_kafka_version(value) {
                        return Err(bad("a Kafka version such as 2.8 or 3.0-IV1"));
                    }
                    config.message_format_version = value.clone();
                }
                "cleanup.policy" => {
                    config.log.cleanup = CleanupPolicy::parse(value)
                        .ok_or_else(|| bad("delete, compact or compact,delete"))?;
                }
                "delete.retention.ms"
                | "min.compaction.lag.ms"
                | "max.compaction.lag.ms"
                | "min.cleanable.dirty.ratio" => {
                    set_compaction(&mut config, key, value)?;
                }
                _ => {
                    return Err(format!(
                        "unknown topic config {key:?} (known: {})",
                        KEYS.join(", ")
                    ));
                }
            }
        }
        set_local_retention(&mut config, locals.0, locals.1)?;
        let compaction = config.log.compaction;
        if compaction.min_lag_ms > compaction.max_lag_ms {
            return Err(format!(
                "min.compaction.lag.ms={} is greater than max.compaction.lag.ms={}",
                compaction.min_lag_ms, compaction.max_lag_ms
            ));
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

/// A tiered storage setting, into `config` or, for the local limits (resolved once every
/// setting is read), `locals`.
fn set_tiering(
    config: &mut TopicConfig,
    locals: &mut (Option<Option<i64>>, Option<Option<i64>>),
    key: &str,
    value: &str,
) -> Result<(), String> {
    let bad = |expected: &str| format!("{key}={value}: expected {expected}");
    if key == "remote.storage.enable" {
        config.log.remote_storage = value.parse().map_err(|_| bad("true or false"))?;
        return Ok(());
    }
    let local = match value.parse::<i64>() {
        Ok(-2) => None,
        Ok(-1) => Some(None),
        Ok(n) if n >= 0 => Some(Some(n)),
        _ => {
            return Err(bad(
                "-2 (the topic's retention), -1 (no limit) or a non-negative integer",
            ));
        }
    };
    if key == "local.retention.ms" {
        locals.0 = local;
    } else {
        locals.1 = local;
    }
    Ok(())
}

/// The local tier's limits (`None`: Kafka's -2, the whole log's), checked as Kafka checks
/// them: no larger than the whole log's, and no remote tier for a compacted topic (its
/// cleaner rewrites closed segments, which uploaded copies would no longer match).
fn set_local_retention(
    config: &mut TopicConfig,
    local_ms: Option<Option<i64>>,
    local_bytes: Option<Option<i64>>,
) -> Result<(), String> {
    let log = &mut config.log;
    log.local_retention_ms = local_ms.unwrap_or(log.retention_ms);
    log.local_retention_bytes = local_bytes
        .map(|bytes| bytes.map(|n| n as u64))
        .unwrap_or(log.retention_bytes);
    let exceeds = |local: Option<u64>, whole: Option<u64>| match (local, whole) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(local), Some(whole)) => local > whole,
    };
    if exceeds(
        log.local_retention_ms.map(|n| n as u64),
        log.retention_ms.map(|n| n as u64),
    ) {
        return Err(format!(
            "local.retention.ms must be at most retention.ms ({})",
            log.retention_ms.unwrap_or(-1)
        ));
    }
    if exceeds(log.local_retention_bytes, log.retention_bytes) {
        return Err(format!(
            "local.retention.bytes must be at most retention.bytes ({})",
            log.retention_bytes.map_or(-1, |n| n as i64)
        ));
    }
    if log.remote_storage && log.cleanup.compact {
        return Err(
            "remote.storage.enable=true is refused on a compacted topic (cleanup.policy includes compact), as Kafka refuses it"
                .to_string(),
        );
    }
    Ok(())
}

/// One of Kafka's compaction settings, checked as Kafka checks it, into `config`.
fn set_compaction(config: &mut TopicConfig, key: &str, value: &str) -> Result<(), String> {
    let bad = |expected: &str| format!("{key}={value}: expected {expected}");
    let number = || value.parse::<i64>().map_err(|_| bad("an integer"));
    let compaction = &mut config.log.compaction;
    match key {
        "min.cleanable.dirty.ratio" => {
            let ratio: f64 = value.parse().map_err(|_| bad("a number from 0 to 1"))?;
            if !(0.0..=1.0).contains(&ratio) {
                return Err(bad("a number from 0 to 1"));
            }
            compaction.min_cleanable_dirty_ratio = ratio;
        }
        "max.compaction.lag.ms" if number()? < 1 => {
            return Err(bad("a positive integer"));
        }
        _ if number()? < 0 => return Err(bad("a non-negative integer")),
        "max.compaction.lag.ms" => compaction.max_lag_ms = number()?,
        "min.compaction.lag.ms" => compaction.min_lag_ms = number()?,
        _ => compaction.delete_retention_ms = number()?,
    }
    let at = COMPACTION_KEYS
        .iter()
        .position(|(known, _)| *known == key)
        .expect("a compaction key");
    config.compaction[at] = value.to_string();
    Ok(())
}

impl TopicConfig {
    /// Every setting as `topic create --config` spells it, one per [`KEYS`] entry in that
    /// order: what `topic describe` shows. Parsing these back gives the same settings.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let limit = |value: Option<i64>| value.map_or("-1".to_string(), |n| n.to_string());
        let log = &self.log;
        let (flush, interval_ms) = match log.flush {
            FlushPolicy::Always => ("always", None),
            FlushPolicy::Never => ("never", None),
            FlushPolicy::Interval { interval_ms } => ("interval", Some(interval_ms)),
        };
        let mut entries = vec![
            ("flush", flush.to_string()),
            (
                "flush.interval.ms",
                interval_ms.unwrap_or(DEFAULT_FLUSH_INTERVAL_MS).to_string(),
            ),
            ("segment.bytes", log.segment_bytes.to_string()),
            ("segment.ms", limit(log.segment_ms)),
            ("retention.ms", limit(log.retention_ms)),
            (
                "retention.bytes",
                limit(log.retention_bytes.map(|n| n as i64)),
            ),
            ("remote.storage.enable", log.remote_storage.to_string()),
            ("local.retention.ms", limit(log.local_retention_ms)),
            (
                "local.retention.bytes",
                limit(log.local_retention_bytes.map(|n| n as i64)),
            ),
            ("index.interval.bytes", log.index_interval_bytes.to_string()),
            ("max.message.bytes", self.max_message_bytes.to_string()),
            ("preallocate", log.preallocate.to_string()),
            (
                "preallocate.step.bytes",
                log.preallocate_step_bytes.to_string(),
            ),
            ("direct.writes", log.direct_writes.name().to_string()),
            (
                "direct.write.min.bytes",
                log.direct_write_min_bytes.to_string(),
            ),
            ("min.insync.replicas", self.min_insync_replicas.to_string()),
            (
                "unclean.leader.election",
                self.unclean_leader_election.to_string(),
            ),
            (
                "replica.recovery.bytes.per.sec",
                limit(self.recovery_bytes_per_sec.map(|n| n as i64)),
            ),
            ("compression.type", self.compression_type.to_string()),
            (
                "message.timestamp.type",
                if log.log_append_time {
                    "LogAppendTime"
                } else {
                    "CreateTime"
                }
                .to_string(),
            ),
            (
                "message.format.version",
                self.message_format_version.clone(),
            ),
            ("cleanup.policy", log.cleanup.name().to_string()),
        ];
        entries.extend(
            COMPACTION_KEYS
                .iter()
                .zip(&self.compaction)
                .map(|((key, _), value)| (*key, value.clone())),
        );
        debug_assert!(entries.iter().map(|(key, _)| *key).eq(KEYS.iter().copied()));
        entries
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
        assert_eq!(parse(&[]).unwrap().log.direct_writes, DirectWrites::Auto);
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
        assert!(
            parse(&[("direct.write.min.bytes", "-1")])
                .unwrap_err()
                .contains("direct.write.min.bytes")
        );
        assert_eq!(
            parse(&[("direct.write.min.bytes", "4096")])
                .unwrap()
                .log
                .direct_write_min_bytes,
            4096
        );
        // A catch-up limit of nothing would keep a new replica out of the ISR for ever.
        assert!(
            parse(&[("replica.recovery.bytes.per.sec", "0")])
                .unwrap_err()
                .contains("replica.recovery.bytes.per.sec")
        );
        assert_eq!(parse(&[]).unwrap().recovery_bytes_per_sec, None);
        assert_eq!(
            parse(&[]).unwrap().log.preallocate_step_bytes,
            crate::log::PREALLOCATE_STEP_BYTES
        );
        assert_eq!(
            parse(&[("preallocate.step.bytes", "0")])
                .unwrap()
                .log
                .preallocate_step_bytes,
            0
        );
        assert!(
            parse(&[("preallocate.step.bytes", "-1")])
                .unwrap_err()
                .contains("preallocate.step.bytes")
        );
        assert!(parse(&[("colour", "red")]).unwrap_err().contains("unknown"));
        // Kafka's compression.type: every value Kafka takes, and only those.
        assert_eq!(parse(&[]).unwrap().compression_type, "producer");
        for value in COMPRESSION_TYPES {
            let config = parse(&[("compression.type", value)]).unwrap();
            assert_eq!(config.compression_type, *value);
            assert!(kafka_compression_codec(value).is_some());
        }
        assert_eq!(kafka_compression_codec("producer"), Some(None));
        assert_eq!(
            kafka_compression_codec("gzip"),
            Some(Some(KafkaCodec::Gzip))
        );
        assert_eq!(
            kafka_compression_codec("snappy"),
            Some(Some(KafkaCodec::Snappy))
        );
        assert_eq!(
            kafka_compression_codec("uncompressed"),
            Some(Some(KafkaCodec::None))
        );
        assert_eq!(kafka_compression_codec("brotli"), None);
        assert!(
            parse(&[("compression.type", "brotli")])
                .unwrap_err()
                .contains("compression.type")
        );
        // message.format.version: Kafka's version spellings, kept as given.
        for value in ["0.10.2", "2.8-IV1", "3.0", "0.10.0-IV1", "1.1.0"] {
            assert_eq!(
                parse(&[("message.format.version", value)])
                    .unwrap()
                    .message_format_version,
                value
            );
        }
        for value in ["", "3", "x.y", "2.8-IV", "2.8-iv1", "3..0"] {
            assert!(
                parse(&[("message.format.version", value)]).is_err(),
                "{value}"
            );
        }
        assert!(parse(&[("retention.ms", "-5")]).is_err());
        // Kafka's compaction settings: validated as Kafka validates them, kept as given.
        let compaction = parse(&[
            ("delete.retention.ms", "900"),
            ("min.cleanable.dirty.ratio", "0.1"),
        ])
        .unwrap()
        .compaction;
        assert_eq!(compaction[0], "900");
        assert_eq!(compaction[3], "0.1");
        for (key, value) in [
            ("delete.retention.ms", "-1"),
            ("min.compaction.lag.ms", "soon"),
            ("max.compaction.lag.ms", "0"),
            ("min.cleanable.dirty.ratio", "1.5"),
        ] {
            assert!(
                parse(&[(key, value)]).unwrap_err().contains(key),
                "{key}={value}"
            );
        }
    }

    #[test]
    fn described_entries_parse_back_to_the_same_settings() {
        let cases: [&[(&str, &str)]; 3] = [
            &[],
            &[
                ("flush", "never"),
                ("retention.ms", "60000"),
                ("retention.bytes", "1048576"),
                ("segment.ms", "3600000"),
                ("direct.writes", "always"),
                ("direct.write.min.bytes", "0"),
                ("min.insync.replicas", "2"),
                ("unclean.leader.election", "true"),
                ("replica.recovery.bytes.per.sec", "50000000"),
                ("preallocate", "true"),
                ("preallocate.step.bytes", "1048576"),
                ("max.message.bytes", "2048"),
                ("index.interval.bytes", "8192"),
                ("segment.bytes", "65536"),
                ("compression.type", "gzip"),
                ("message.format.version", "0.10.2"),
                ("delete.retention.ms", "900"),
                ("min.compaction.lag.ms", "5"),
                ("max.compaction.lag.ms", "3600000"),
                ("min.cleanable.dirty.ratio", "0.25"),
            ],
            &[("flush.interval.ms", "250"), ("direct.writes", "auto")],
        ];
        for case in cases {
            let config = parse(case).unwrap();
            let entries = config.entries();
            assert_eq!(entries.len(), KEYS.len());
            let again = TopicConfig::parse(
                &entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            )
            .unwrap();
            assert_eq!(again.entries(), entries, "{case:?}");
            for (key, value) in case {
                let shown = &entries.iter().find(|(k, _)| k == key).unwrap().1;
                assert_eq!(shown, value, "{key}");
            }
        }
    }
}
