//! Group configs (Kafka's GROUP config resources, KIP-848 and KIP-932, `kafka-configs
//! --entity-type groups`): which names a consumer or share group may set, the values each
//! takes, and the default each has when unset. Pure: the listener checks a change here before
//! the control thread stores it in the coordinator (`strata_coordinator::group_configs`), and
//! whoever coordinates a group reads its values back through the typed parsers below, so a
//! stored value always parses.

use std::collections::BTreeMap;

use strata_coordinator::group_configs::GroupConfigAlteration;

pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
pub const SHARE_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
pub const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
pub const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";
pub const CONSUMER_SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
pub const CONSUMER_HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";
pub const DEAD_LETTER_TOPIC: &str = "errors.deadletterqueue.topic.name";
pub const SHARE_KEY_ORDERING: &str = "strata.share.key.ordering";
pub const SHARE_REDELIVERY_BACKOFF_MS: &str = "strata.share.redelivery.backoff.ms";
pub const SHARE_REDELIVERY_BACKOFF_MAX_MS: &str = "strata.share.redelivery.backoff.max.ms";
pub const SHARE_DELAYED_DELIVERY: &str = "strata.share.delayed.delivery";
pub const SHARE_RENEW_ACKNOWLEDGE_ENABLE: &str = "share.renew.acknowledge.enable";

/// Every config a group may set: (name, the default an unset one has, as Kafka documents it,
/// what it does). DescribeConfigs on a group answers each of them.
pub const GROUP_CONFIGS: &[(&str, &str, &str)] = &[
    (
        SHARE_AUTO_OFFSET_RESET,
        "latest",
        "Where a share group starts on a partition it has no offset for: earliest, latest, or \
         by_duration:<ISO-8601 duration> (the first record at most that long ago).",
    ),
    (
        SHARE_RECORD_LOCK_DURATION_MS,
        "30000",
        "How long a share group's member holds a record it was given before the record can go \
         to another member.",
    ),
    (
        SHARE_ISOLATION_LEVEL,
        "read_uncommitted",
        "Whether a share group reads only committed transactional records (read_committed) or \
         every record (read_uncommitted).",
    ),
    (
        SHARE_DELIVERY_COUNT_LIMIT,
        "5",
        "How many times a share group delivers a record before it is archived (or sent to the \
         dead-letter topic).",
    ),
    (
        SHARE_RENEW_ACKNOWLEDGE_ENABLE,
        "true",
        "Whether a share group's members may extend the locks of records they hold with RENEW \
         acknowledgements (KIP-1222).",
    ),
    (
        SHARE_SESSION_TIMEOUT_MS,
        "45000",
        "How long a share group's member may go without a heartbeat before it is removed.",
    ),
    (
        SHARE_HEARTBEAT_INTERVAL_MS,
        "5000",
        "How often a share group's members heartbeat.",
    ),
    (
        CONSUMER_SESSION_TIMEOUT_MS,
        "45000",
        "How long a consumer group's member (group.protocol=consumer) may go without a \
         heartbeat before it is removed.",
    ),
    (
        CONSUMER_HEARTBEAT_INTERVAL_MS,
        "5000",
        "How often a consumer group's members (group.protocol=consumer) heartbeat.",
    ),
    (
        DEAD_LETTER_TOPIC,
        "",
        "The topic a share group writes records to that reached the delivery count limit or \
         were rejected; empty: none.",
    ),
    (
        SHARE_KEY_ORDERING,
        "false",
        "Strata: a share group delivers the records of one key to one member at a time, in \
         offset order.",
    ),
    (
        SHARE_REDELIVERY_BACKOFF_MS,
        "0",
        "Strata: how long a share group waits before delivering a released or timed-out record \
         again; doubled on each delivery up to strata.share.redelivery.backoff.max.ms.",
    ),
    (
        SHARE_REDELIVERY_BACKOFF_MAX_MS,
        "60000",
        "Strata: the longest wait before a record is delivered again.",
    ),
    (
        SHARE_DELAYED_DELIVERY,
        "false",
        "Strata: a share group delivers a record with the header strata.deliver.after.ms \
         (Unix time, ms) no sooner than that time.",
    ),
];

/// The limits of a session timeout or heartbeat interval, and of a record lock (ms).
const GROUP_TIMING_MS: (i64, i64) = (1_000, 3_600_000);
/// The limits of a redelivery backoff (ms): up to a day.
const REDELIVERY_BACKOFF_MS: (i64, i64) = (0, 86_400_000);
const DELIVERY_COUNT_LIMIT: (i64, i64) = (2, 10);

/// What the value of a config may be.
enum Rule {
    /// An integer within these bounds, inclusive.
    Integer(i64, i64),
    OneOf(&'static [&'static str]),
    AutoOffsetReset,
    /// A valid topic name, or empty for none.
    TopicName,
}

fn rule(name: &str) -> Option<Rule> {
    Some(match name {
        SHARE_AUTO_OFFSET_RESET => Rule::AutoOffsetReset,
        SHARE_RECORD_LOCK_DURATION_MS
        | SHARE_SESSION_TIMEOUT_MS
        | SHARE_HEARTBEAT_INTERVAL_MS
        | CONSUMER_SESSION_TIMEOUT_MS
        | CONSUMER_HEARTBEAT_INTERVAL_MS => Rule::Integer(GROUP_TIMING_MS.0, GROUP_TIMING_MS.1),
        SHARE_ISOLATION_LEVEL => Rule::OneOf(&["read_committed", "read_uncommitted"]),
        SHARE_DELIVERY_COUNT_LIMIT => Rule::Integer(DELIVERY_COUNT_LIMIT.0, DELIVERY_COUNT_LIMIT.1),
        DEAD_LETTER_TOPIC => Rule::TopicName,
        SHARE_KEY_ORDERING | SHARE_DELAYED_DELIVERY | SHARE_RENEW_ACKNOWLEDGE_ENABLE => {
            Rule::OneOf(&["true", "false"])
        }
        SHARE_REDELIVERY_BACKOFF_MS | SHARE_REDELIVERY_BACKOFF_MAX_MS => {
            Rule::Integer(REDELIVERY_BACKOFF_MS.0, REDELIVERY_BACKOFF_MS.1)
        }
        _ => return None,
    })
}

/// Whether `name` is a group config.
pub fn is_group_config(name: &str) -> bool {
    GROUP_CONFIGS.iter().any(|(known, _, _)| *known == name)
}

/// The value an unset config `name` has.
pub fn default_of(name: &str) -> Option<&'static str> {
    GROUP_CONFIGS
        .iter()
        .find(|(known, _, _)| *known == name)
        .map(|(_, default, _)| *default)
}

/// Whether a group may set `name` to `value`; the error says why not.
pub fn check_group_config(name: &str, value: &str) -> Result<(), String> {
    let Some(rule) = rule(name) else {
        return Err(format!("{name} is not a group config"));
    };
    match rule {
        Rule::Integer(min, max) => value
            .parse::<i64>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .map(drop)
            .ok_or_else(|| format!("{name}={value}: expected an integer from {min} to {max}")),
        Rule::OneOf(values) if values.contains(&value) => Ok(()),
        Rule::OneOf(values) => Err(format!(
            "{name}={value}: expected one of {}",
            values.join(", ")
        )),
        Rule::AutoOffsetReset => crate::share::config::AutoOffsetReset::parse(value)
            .map(drop)
            .map_err(|why| format!("{name}={value}: {why}")),
        Rule::TopicName if value.is_empty() => Ok(()),
        Rule::TopicName => strata_coordinator::validate_topic_name(value)
            .map_err(|error| format!("{name}={value}: {error}")),
    }
}

/// Checks a change to a group's configs (`current`: what is set now): every name it sets or
/// deletes is a group config (those that are not are named together), every value it sets is
/// valid, and the configs it leaves agree with each other, unset ones at their defaults (a
/// heartbeat interval below its session timeout, a redelivery backoff at most its maximum).
pub fn check_group_alteration(
    current: &BTreeMap<String, String>,
    alteration: &GroupConfigAlteration,
) -> Result<(), String> {
    alteration.check().map_err(|error| error.to_string())?;
    let unknown: Vec<&str> = alteration
        .set
        .keys()
        .chain(&alteration.delete)
        .map(String::as_str)
        .filter(|name| !is_group_config(name))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "not a group config: {} (group configs: {})",
            unknown.join(", "),
            GROUP_CONFIGS
                .iter()
                .map(|(name, _, _)| *name)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (name, value) in &alteration.set {
        check_group_config(name, value)?;
    }
    check_consistent(&alteration.apply(current))
}

/// The configs a group is left with agree with each other, unset ones at their defaults.
fn check_consistent(values: &BTreeMap<String, String>) -> Result<(), String> {
    // Each value was checked (or is a default): it parses.
    let number = |name: &str| -> i64 {
        values
            .get(name)
            .map(String::as_str)
            .or_else(|| default_of(name))
            .and_then(|value| value.parse().ok())
            .unwrap_or_default()
    };
    let below = |smaller: &str, larger: &str, strictly: bool| {
        let (small, large) = (number(smaller), number(larger));
        if small < large || (!strictly && small == large) {
            return Ok(());
        }
        let relation = if strictly { "less than" } else { "at most" };
        Err(format!(
            "{smaller} ({small}) must be {relation} {larger} ({large})"
        ))
    };
    below(SHARE_HEARTBEAT_INTERVAL_MS, SHARE_SESSION_TIMEOUT_MS, true)?;
    below(
        CONSUMER_HEARTBEAT_INTERVAL_MS,
        CONSUMER_SESSION_TIMEOUT_MS,
        true,
    )?;
    below(
        SHARE_REDELIVERY_BACKOFF_MS,
        SHARE_REDELIVERY_BACKOFF_MAX_MS,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alteration(set: &[(&str, &str)], delete: &[&str]) -> GroupConfigAlteration {
        GroupConfigAlteration {
            group: "g".into(),
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            delete: delete.iter().map(|d| d.to_string()).collect(),
            replace: false,
        }
    }

    #[test]
    fn every_config_has_a_rule_and_a_default_it_takes() {
        for (name, default, doc) in GROUP_CONFIGS {
            assert!(rule(name).is_some(), "{name}");
            assert_eq!(check_group_config(name, default), Ok(()), "{name}");
            assert!(!doc.is_empty(), "{name}");
        }
        assert_eq!(check_consistent(&BTreeMap::new()), Ok(()));
        assert_eq!(default_of(SHARE_DELIVERY_COUNT_LIMIT), Some("5"));
        assert_eq!(default_of("group.id"), None);
    }

    #[test]
    fn integers_are_held_to_their_bounds() {
        let check = check_group_config;
        assert!(check(SHARE_RECORD_LOCK_DURATION_MS, "5000").is_ok());
        assert!(check(SHARE_RECORD_LOCK_DURATION_MS, "1000").is_ok());
        assert!(check(SHARE_RECORD_LOCK_DURATION_MS, "3600000").is_ok());
        for bad in ["999", "3600001", "-5", "", "5s", " 5000", "5000.0"] {
            assert!(
                check(SHARE_RECORD_LOCK_DURATION_MS, bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(check(SHARE_DELIVERY_COUNT_LIMIT, "2").is_ok());
        assert!(check(SHARE_DELIVERY_COUNT_LIMIT, "10").is_ok());
        assert!(check(SHARE_DELIVERY_COUNT_LIMIT, "1").is_err());
        assert!(check(SHARE_DELIVERY_COUNT_LIMIT, "11").is_err());
        for name in [
            SHARE_SESSION_TIMEOUT_MS,
            SHARE_HEARTBEAT_INTERVAL_MS,
            CONSUMER_SESSION_TIMEOUT_MS,
            CONSUMER_HEARTBEAT_INTERVAL_MS,
        ] {
            assert!(check(name, "45000").is_ok(), "{name}");
            assert!(check(name, "500").is_err(), "{name}");
        }
        assert!(check(SHARE_REDELIVERY_BACKOFF_MS, "0").is_ok());
        assert!(check(SHARE_REDELIVERY_BACKOFF_MAX_MS, "86400000").is_ok());
        assert!(check(SHARE_REDELIVERY_BACKOFF_MAX_MS, "86400001").is_err());
        assert_eq!(
            check(SHARE_DELIVERY_COUNT_LIMIT, "11"),
            Err("share.delivery.count.limit=11: expected an integer from 2 to 10".into())
        );
    }

    #[test]
    fn words_are_one_of_theirs_and_topics_valid_names() {
        let check = check_group_config;
        assert!(check(SHARE_ISOLATION_LEVEL, "read_committed").is_ok());
        assert!(check(SHARE_ISOLATION_LEVEL, "read_uncommitted").is_ok());
        let refused = check(SHARE_ISOLATION_LEVEL, "bogus").unwrap_err();
        assert!(refused.contains("read_committed"), "{refused}");
        assert!(check(SHARE_KEY_ORDERING, "true").is_ok());
        assert!(check(SHARE_KEY_ORDERING, "yes").is_err());
        assert!(check(DEAD_LETTER_TOPIC, "orders.dlq").is_ok());
        assert!(check(DEAD_LETTER_TOPIC, "").is_ok(), "none");
        assert!(check(DEAD_LETTER_TOPIC, "no spaces").is_err());
        assert!(check(DEAD_LETTER_TOPIC, "..").is_err());
        assert!(check("group.id", "x").unwrap_err().contains("group.id"));
    }

    #[test]
    fn auto_offset_reset_is_checked_as_the_share_core_reads_it() {
        for bad in ["", "none", "Earliest", "by_duration:", "by_duration:-PT1H"] {
            assert!(
                check_group_config(SHARE_AUTO_OFFSET_RESET, bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(check_group_config(SHARE_AUTO_OFFSET_RESET, "by_duration:P1DT2H").is_ok());
    }

    #[test]
    fn alterations_name_every_unknown_config_and_keep_configs_in_agreement() {
        let none = BTreeMap::new();
        let refused =
            check_group_alteration(&none, &alteration(&[("bogus", "1")], &["also.bogus"]))
                .unwrap_err();
        assert!(
            refused.starts_with("not a group config: bogus, also.bogus"),
            "{refused}"
        );
        assert!(
            check_group_alteration(
                &none,
                &alteration(
                    &[
                        (SHARE_AUTO_OFFSET_RESET, "earliest"),
                        (SHARE_RECORD_LOCK_DURATION_MS, "5000"),
                    ],
                    &[SHARE_ISOLATION_LEVEL],
                ),
            )
            .is_ok()
        );
        assert!(
            check_group_alteration(&none, &alteration(&[(SHARE_ISOLATION_LEVEL, "bogus")], &[]))
                .is_err()
        );
        // A heartbeat not below its session timeout, the other at its default (45 s) or set.
        let refused = check_group_alteration(
            &none,
            &alteration(&[(CONSUMER_HEARTBEAT_INTERVAL_MS, "45000")], &[]),
        )
        .unwrap_err();
        assert!(refused.contains("must be less than"), "{refused}");
        let session: BTreeMap<String, String> =
            [(SHARE_SESSION_TIMEOUT_MS.to_string(), "60000".to_string())].into();
        assert!(
            check_group_alteration(
                &session,
                &alteration(&[(SHARE_HEARTBEAT_INTERVAL_MS, "50000")], &[])
            )
            .is_ok()
        );
        // Removing the session timeout would leave the heartbeat above its default.
        let both: BTreeMap<String, String> = [
            (SHARE_SESSION_TIMEOUT_MS.to_string(), "60000".to_string()),
            (SHARE_HEARTBEAT_INTERVAL_MS.to_string(), "50000".to_string()),
        ]
        .into();
        assert!(
            check_group_alteration(&both, &alteration(&[], &[SHARE_SESSION_TIMEOUT_MS])).is_err()
        );
        // A backoff at most its maximum (default 60 s).
        assert!(
            check_group_alteration(
                &none,
                &alteration(&[(SHARE_REDELIVERY_BACKOFF_MS, "60000")], &[])
            )
            .is_ok()
        );
        assert!(
            check_group_alteration(
                &none,
                &alteration(
                    &[
                        (SHARE_REDELIVERY_BACKOFF_MS, "2000"),
                        (SHARE_REDELIVERY_BACKOFF_MAX_MS, "1000"),
                    ],
                    &[],
                )
            )
            .is_err()
        );
        let mut unnamed = alteration(&[], &[]);
        unnamed.group.clear();
        assert!(check_group_alteration(&none, &unnamed).is_err());
    }
}
