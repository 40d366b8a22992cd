//! Share groups (queues) from the command line: `consume --share-group` and the share group
//! view of `group describe`.

use std::io::Write;
use std::sync::Arc;

use serde_json::json;
use strata_client::{AckMode, AckType, Client, ShareConfig, ShareConsumer};
use strata_wire::protocol::{DescribeShareGroupResponse, ErrorCode};

use crate::client_cmd::{Format, Printed, interrupted, print_record};

/// `consume --share-group`: prints each record acquired, then accepts it; stops after
/// `limit` records (giving back any acquired past it) or on SIGINT/SIGTERM, sending its
/// acknowledgements and giving back what it holds as it leaves.
pub async fn consume(
    client: Arc<Client>,
    group: String,
    topic: String,
    limit: u64,
    format: Format,
) -> anyhow::Result<()> {
    let mut config = ShareConfig::new(group);
    config.client_id = "strata-consume".into();
    config.acknowledgement = AckMode::Explicit;
    let mut consumer = ShareConsumer::subscribe(client, vec![topic], config).await?;
    let mut printed = 0u64;
    let stop = interrupted();
    tokio::pin!(stop);
    while printed < limit {
        let records = tokio::select! {
            records = consumer.poll() => records?,
            _ = &mut stop => break,
        };
        let mut stdout = std::io::stdout().lock();
        let mut done = Vec::with_capacity(records.len());
        for record in &records {
            if printed == limit {
                done.push((record, AckType::Release));
                continue;
            }
            let shown = Printed {
                partition: record.partition,
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
                key: record.key.as_deref(),
                value: record.value.as_deref(),
            };
            print_record(&mut stdout, format, shown)?;
            printed += 1;
            done.push((record, AckType::Accept));
        }
        // Accepted once printed: what a crash cut short is delivered again.
        stdout.flush()?;
        drop(stdout);
        for (record, kind) in done {
            consumer.acknowledge(record, kind)?;
        }
    }
    consumer.close().await?;
    Ok(())
}

/// `group describe` of a share group: its members, and where it stands on each partition
/// (asked of the partitions' leaders).
pub async fn describe(
    client: &Client,
    share: DescribeShareGroupResponse,
    format: Format,
) -> anyhow::Result<()> {
    let asked: Vec<(String, u32)> = share
        .partitions
        .iter()
        .flat_map(|tp| tp.partitions.iter().map(|p| (tp.topic.clone(), *p)))
        .collect();
    let now_ms = strata_client::now_ms();
    let partitions: Vec<_> = client
        .describe_share_partitions(&share.group, &asked)
        .await?
        .into_iter()
        .map(|p| {
            let known = p.error == ErrorCode::None;
            // The age of the oldest record not done: 0 when there is none.
            let lag_seconds = match (known, p.lag, p.oldest_timestamp_ms) {
                (false, _, _) => None,
                (true, 0, _) => Some(0.0),
                (true, _, Some(timestamp_ms)) => {
                    Some(now_ms.saturating_sub(timestamp_ms).max(0) as f64 / 1000.0)
                }
                (true, _, None) => None,
            };
            json!({
                "topic": p.topic,
                "partition": p.partition,
                "error": (!known).then(|| p.error.to_string()),
                "start_offset": known.then_some(p.start_offset),
                "end_offset": known.then_some(p.end_offset),
                "in_flight": known.then_some(p.in_flight),
                "acquired": known.then_some(p.acquired),
                "high_watermark": known.then_some(p.high_watermark),
                "lag": known.then_some(p.lag),
                "lag_seconds": lag_seconds,
            })
        })
        .collect();
    let members: Vec<_> = share
        .members
        .iter()
        .map(|member| {
            let partitions: Vec<_> = member
                .assignment
                .iter()
                .flat_map(|tp| {
                    tp.partitions
                        .iter()
                        .map(move |p| json!({ "topic": tp.topic, "partition": p }))
                })
                .collect();
            json!({
                "id": member.member_id,
                "client_id": member.client_id,
                "client_host": member.client_host,
                "epoch": member.member_epoch,
                "topics": member.topics,
                "partitions": partitions,
            })
        })
        .collect();
    if format == Format::Json {
        outln!(
            "{}",
            json!({
                "group": share.group,
                "type": "share",
                "epoch": share.epoch,
                "state": share.state,
                "members": members,
                "partitions": partitions,
            })
        );
        return Ok(());
    }
    outln!(
        "share group {} epoch {} state {}",
        share.group,
        share.epoch,
        share.state
    );
    for member in &members {
        outln!(
            "  member {} client {} ({}) [{}]",
            member["id"].as_str().unwrap_or_default(),
            member["client_id"].as_str().unwrap_or_default(),
            member["client_host"].as_str().unwrap_or_default(),
            crate::client_cmd::member_partitions(member)
        );
    }
    for p in &partitions {
        let name = format!(
            "{}-{}",
            p["topic"].as_str().unwrap_or_default(),
            p["partition"]
        );
        match p["error"].as_str() {
            Some(error) => outln!("  {name} unknown ({error})"),
            None => outln!(
                "  {name} start {} in-flight {} (acquired {}) lag {} ({} s)",
                p["start_offset"],
                p["in_flight"],
                p["acquired"],
                p["lag"],
                p["lag_seconds"]
            ),
        }
    }
    Ok(())
}
