//! `strata group reset-offsets`: moves a stopped group's committed offsets, as
//! `kafka-consumer-groups --reset-offsets` does: a plan printed first, applied with `--execute`.
//!
//! The commit goes through the group's coordinator outside membership (member "", generation
//! -1), which the coordinator accepts only while the group has no members: the offsets of a
//! running group are its members' to commit.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use strata_client::Client;
use strata_wire::protocol::{EARLIEST_TIMESTAMP, ErrorCode, LATEST_TIMESTAMP};

use super::client_cmd::Format;

/// Where each partition's committed offset goes (exactly one).
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct ResetTo {
    /// The log start: the group reads everything still stored.
    #[arg(long)]
    pub to_earliest: bool,
    /// The high watermark: the group skips everything stored so far.
    #[arg(long)]
    pub to_latest: bool,
    /// This offset (clamped to what the partition holds).
    #[arg(long, value_name = "OFFSET")]
    pub to_offset: Option<u64>,
    /// The first record at or after this time: milliseconds since the epoch, or UTC as
    /// `2026-11-30T12:00:00Z` (fractions of a second allowed). Past the newest record: the end.
    #[arg(long, value_name = "TIME", value_parser = parse_time_ms)]
    pub to_datetime: Option<i64>,
    /// The committed offset moved by N (negative: back), clamped to what the partition holds.
    /// Partitions without a committed offset are left alone.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
}

#[derive(Args)]
pub struct ResetOffsetsArgs {
    pub group: String,
    /// A topic to reset: NAME for all its partitions, NAME:0,3 for some. Repeat for several.
    #[arg(long = "topic", required = true, value_name = "NAME[:PARTITIONS]")]
    pub topics: Vec<String>,
    #[command(flatten)]
    pub to: ResetTo,
    /// Commit the new offsets. Without it the plan is only printed (a dry run).
    #[arg(long)]
    pub execute: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// What one partition holds and the group has committed there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionState {
    pub log_start: u64,
    pub high_watermark: u64,
    pub committed: Option<u64>,
    /// `--to-datetime`: the first offset at or after the time (`None`: no such record).
    pub at_time: Option<u64>,
}

/// The new committed offset of a partition; `None` leaves it as it is.
pub fn target(to: &ResetTo, state: PartitionState) -> Option<u64> {
    let clamp = |offset: u64| offset.clamp(state.log_start, state.high_watermark);
    if to.to_earliest {
        Some(state.log_start)
    } else if to.to_latest {
        Some(state.high_watermark)
    } else if let Some(offset) = to.to_offset {
        Some(clamp(offset))
    } else if to.to_datetime.is_some() {
        Some(clamp(state.at_time.unwrap_or(state.high_watermark)))
    } else if let Some(shift) = to.shift_by {
        let committed = state.committed?;
        Some(clamp(committed.saturating_add_signed(shift)))
    } else {
        unreachable!("clap requires one target")
    }
}

/// `NAME` or `NAME:0,3`: the topic and the partitions named (`None`: all of them).
fn parse_topic(text: &str) -> anyhow::Result<(String, Option<Vec<u32>>)> {
    match text.split_once(':') {
        None => Ok((text.to_string(), None)),
        Some((name, list)) => {
            let partitions = list
                .split(',')
                .map(|p| p.trim().parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{text}: expected NAME or NAME:0,1,2"))?;
            Ok((name.to_string(), Some(partitions)))
        }
    }
}

/// Milliseconds since the epoch, or an RFC 3339 time in UTC (`Z`).
pub fn parse_time_ms(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || format!("{text}: expected milliseconds since the epoch or 2026-11-30T12:00:00Z");
    let rest = text.strip_suffix('Z').ok_or_else(bad)?;
    let (date, time) = rest.split_once('T').ok_or_else(bad)?;
    let number = |part: &str| part.parse::<i64>().map_err(|_| bad());
    let mut date = date.split('-');
    let (year, month, day) = match (date.next(), date.next(), date.next(), date.next()) {
        (Some(y), Some(m), Some(d), None) => (number(y)?, number(m)?, number(d)?),
        _ => return Err(bad()),
    };
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut time = time.split(':');
    let (hour, minute, second) = match (time.next(), time.next(), time.next(), time.next()) {
        (Some(h), Some(m), Some(s), None) => (number(h)?, number(m)?, number(s)?),
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let millis = format!("{fraction:0<3}")[..3]
        .parse::<i64>()
        .map_err(|_| bad())?;
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Ok(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

pub async fn reset_offsets(client: &Arc<Client>, args: ResetOffsetsArgs) -> anyhow::Result<()> {
    let described = client.describe_group(&args.group).await?;
    if !described.members.is_empty() {
        let stop = format!(
            "group {} has {} active member(s): its offsets are theirs to commit; stop its consumers first",
            args.group,
            described.members.len()
        );
        if args.execute {
            bail!(stop);
        }
        eprintln!("strata: {stop} (dry run shown anyway)");
    }
    let plan = plan(client, &args).await?;
    if args.execute && !plan.is_empty() {
        let offsets = plan
            .iter()
            .map(|(key, (_, new))| (key.clone(), *new))
            .collect();
        client
            .commit_offsets(&args.group, "", -1, &offsets)
            .await
            .map_err(|error| match error.code() {
                Some(ErrorCode::IllegalGeneration) => anyhow::anyhow!(
                    "group {} gained members meanwhile: stop its consumers, then reset again",
                    args.group
                ),
                _ => anyhow::Error::new(error).context("committing the new offsets"),
            })?;
    }
    print_plan(&args, &plan)
}

/// (topic, partition) → (the committed offset, the new one), for the partitions that move.
type Plan = BTreeMap<(String, u32), (Option<u64>, u64)>;

/// Each named partition's new offset, from what it holds and what the group committed.
async fn plan(client: &Arc<Client>, args: &ResetOffsetsArgs) -> anyhow::Result<Plan> {
    let committed: BTreeMap<(String, u32), u64> = client
        .committed_offsets(&args.group)
        .await?
        .into_iter()
        .filter_map(|c| Some(((c.topic, c.partition), u64::try_from(c.offset).ok()?)))
        .collect();
    let metadata = client.refresh_metadata().await?;
    let mut plan = Plan::new();
    for topic in &args.topics {
        let (name, chosen) = parse_topic(topic)?;
        let Some(described) = metadata.topics.get(&name) else {
            bail!("unknown topic {name}");
        };
        let count = described.partitions.len() as u32;
        let partitions = chosen.unwrap_or_else(|| (0..count).collect());
        for partition in partitions {
            if partition >= count {
                bail!("{name} has {count} partitions: there is no partition {partition}");
            }
            let offset = |timestamp| client.list_offset_retrying(&name, partition, timestamp);
            let state = PartitionState {
                log_start: offset(EARLIEST_TIMESTAMP).await?.unwrap_or(0),
                high_watermark: offset(LATEST_TIMESTAMP).await?.unwrap_or(0),
                committed: committed.get(&(name.clone(), partition)).copied(),
                at_time: match args.to.to_datetime {
                    Some(time) => offset(time).await?,
                    None => None,
                },
            };
            if let Some(new) = target(&args.to, state) {
                plan.insert((name.clone(), partition), (state.committed, new));
            }
        }
    }
    Ok(plan)
}

fn print_plan(args: &ResetOffsetsArgs, plan: &Plan) -> anyhow::Result<()> {
    let applied = if args.execute { "reset" } else { "dry run" };
    if args.format == Format::Json {
        let partitions: Vec<_> = plan
            .iter()
            .map(|((topic, partition), (current, new))| {
                json!({ "topic": topic, "partition": partition, "current": current, "new": new })
            })
            .collect();
        outln!(
            "{}",
            json!({ "group": args.group, "executed": args.execute, "partitions": partitions })
        );
    } else {
        outln!(
            "{:<24} {:>9} {:>14} {:>14}",
            "TOPIC",
            "PARTITION",
            "CURRENT",
            "NEW"
        );
        for ((topic, partition), (current, new)) in plan {
            let current = current.map_or("-".to_string(), |c| c.to_string());
            outln!("{topic:<24} {partition:>9} {current:>14} {new:>14}");
        }
        outln!(
            "{applied}: {} partition(s) of group {}{}",
            plan.len(),
            args.group,
            if args.execute {
                ""
            } else {
                " (add --execute to commit)"
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to() -> ResetTo {
        ResetTo {
            to_earliest: false,
            to_latest: false,
            to_offset: None,
            to_datetime: None,
            shift_by: None,
        }
    }

    const STATE: PartitionState = PartitionState {
        log_start: 100,
        high_watermark: 500,
        committed: Some(300),
        at_time: Some(250),
    };

    #[test]
    fn targets_follow_kafka_reset_rules_and_stay_within_the_log() {
        let earliest = ResetTo {
            to_earliest: true,
            ..to()
        };
        assert_eq!(target(&earliest, STATE), Some(100));
        let latest = ResetTo {
            to_latest: true,
            ..to()
        };
        assert_eq!(target(&latest, STATE), Some(500));
        for (offset, expected) in [(50, 100), (200, 200), (900, 500)] {
            let exact = ResetTo {
                to_offset: Some(offset),
                ..to()
            };
            assert_eq!(target(&exact, STATE), Some(expected), "to offset {offset}");
        }
        let time = ResetTo {
            to_datetime: Some(1),
            ..to()
        };
        assert_eq!(target(&time, STATE), Some(250));
        let after_the_newest = PartitionState {
            at_time: None,
            ..STATE
        };
        assert_eq!(target(&time, after_the_newest), Some(500));
        for (shift, expected) in [(-50, Some(250)), (-1000, Some(100)), (1000, Some(500))] {
            let shifted = ResetTo {
                shift_by: Some(shift),
                ..to()
            };
            assert_eq!(target(&shifted, STATE), expected, "shift by {shift}");
        }
        let never_committed = PartitionState {
            committed: None,
            ..STATE
        };
        let back = ResetTo {
            shift_by: Some(-1),
            ..to()
        };
        assert_eq!(target(&back, never_committed), None);
    }

    #[test]
    fn times_parse_as_milliseconds_or_utc() {
        assert_eq!(parse_time_ms("1764504000123"), Ok(1_764_504_000_123));
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_time_ms("2026-11-30T12:00:00Z"), Ok(1_796_040_000_000));
        assert_eq!(parse_time_ms("2000-02-29T23:59:59.5Z"), Ok(951_868_799_500));
        for bad in [
            "2026-11-30",
            "2026-13-01T00:00:00Z",
            "2026-11-30T12:00:00",
            "soon",
        ] {
            assert!(parse_time_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn topics_name_all_or_some_partitions() {
        assert_eq!(parse_topic("orders").unwrap(), ("orders".into(), None));
        assert_eq!(
            parse_topic("orders:0,3").unwrap(),
            ("orders".into(), Some(vec![0, 3]))
        );
        assert!(parse_topic("orders:x").is_err());
    }
}
