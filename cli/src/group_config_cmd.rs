//! `strata group config`: a group's configs (Kafka's GROUP config resource, `kafka-configs
//! --entity-type groups`: `share.auto.offset.reset`, `share.record.lock.duration.ms`,
//! `strata.share.key.ordering`, ...). Kept by the cluster's coordinator whether or not the
//! group exists, and read by whichever broker coordinates it.

use clap::Args;
use serde_json::json;
use strata_client::Client;
use strata_wire::protocol::{
    AlterGroupConfigsRequest, ConfigEntry, DescribeGroupConfigsRequest, Request, Response,
};

use crate::client_cmd::{Format, parse_key_value};
use crate::security_cmd::refused;

#[derive(Args)]
pub struct GroupConfigArgs {
    /// The group (a consumer or share group; it need not exist yet).
    group: String,
    /// NAME=VALUE: set a config on the group (share.auto.offset.reset=earliest, ...); repeat
    /// for several. Without --set or --delete, the group's configs are listed.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    set: Vec<(String, String)>,
    /// NAME: remove the group's own value, so the config takes its default again; repeat for
    /// several. Without --set or --delete, the group's configs are listed.
    #[arg(long = "delete", value_name = "NAME")]
    delete: Vec<String>,
    /// How the configs are listed.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Lists the group's configs, or (with --set or --delete) changes them: all or nothing.
pub async fn group_config(client: &Client, args: GroupConfigArgs) -> anyhow::Result<()> {
    let GroupConfigArgs {
        group,
        set,
        delete,
        format,
    } = args;
    if set.is_empty() && delete.is_empty() {
        return describe(client, group, format).await;
    }
    let request = Request::AlterGroupConfigs(AlterGroupConfigsRequest {
        group: group.clone(),
        set: set
            .into_iter()
            .map(|(key, value)| ConfigEntry { key, value })
            .collect(),
        delete,
        replace: false,
        validate_only: false,
    });
    match client.any_broker(request).await? {
        Response::AlterGroupConfigs(answer) => refused(answer.error, &answer.message)?,
        other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
    }
    outln!("altered group {group}");
    Ok(())
}

async fn describe(client: &Client, group: String, format: Format) -> anyhow::Result<()> {
    let request = Request::DescribeGroupConfigs(DescribeGroupConfigsRequest {
        group: group.clone(),
    });
    let answer = match client.any_broker(request).await? {
        Response::DescribeGroupConfigs(answer) => answer,
        other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
    };
    refused(answer.error, &answer.message)?;
    if format == Format::Json {
        let configs: Vec<_> = answer
            .entries
            .iter()
            .map(|entry| json!({ "name": entry.name, "value": entry.value, "set": entry.set }))
            .collect();
        outln!("{}", json!({ "group": group, "configs": configs }));
    } else {
        for entry in &answer.entries {
            let source = if entry.set { "set" } else { "default" };
            outln!("{}={} ({source})", entry.name, entry.value);
        }
    }
    Ok(())
}
