//! `strata cluster config`: broker settings (Kafka's `kafka-configs --entity-type brokers`).
//! Those that change live are set for every broker or for one, kept by the cluster's
//! coordinator, and applied by each broker at once; a broker's own value wins over the one
//! set for every broker, which wins over what the broker started with.

use clap::Subcommand;
use serde_json::json;
use strata_wire::protocol::{
    AlterBrokerConfigsRequest, ConfigEntry, DescribeBrokerConfigsRequest, Request, Response,
};

use super::Connection;
use crate::client_cmd::{Format, connect, parse_key_value};
use crate::security_cmd::refused;

#[derive(Subcommand)]
pub enum ClusterConfigCommand {
    /// Without --broker, the settings set live for every broker; with it, every setting that
    /// broker runs with, where each comes from, and which change live.
    List {
        /// A broker's id (without it: the settings set for every broker).
        #[arg(long)]
        broker: Option<i32>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Set settings live: for every broker, or with --broker for one. All or nothing; topics
    /// without an override of their own follow a new `log.*` default at once.
    Set {
        /// KEY=VALUE (log.retention.ms=86400000, num.partitions=3, ...); repeat for several.
        #[arg(value_parser = parse_key_value, required = true)]
        settings: Vec<(String, String)>,
        /// The broker they are for (without it: every broker).
        #[arg(long)]
        broker: Option<i32>,
    },
    /// Remove settings set live (for every broker, or with --broker for one), so the broker's
    /// own from start apply again.
    Remove {
        #[arg(required = true)]
        names: Vec<String>,
        /// The broker they were set for (without it: every broker).
        #[arg(long)]
        broker: Option<i32>,
    },
}

/// A setting's source as the wire numbers it (see `BrokerConfigEntry`).
fn source_name(source: u8) -> &'static str {
    match source {
        3 => "broker",
        2 => "every-broker",
        1 => "start",
        _ => "default",
    }
}

pub async fn cluster_config(
    connection: &Connection,
    command: ClusterConfigCommand,
) -> anyhow::Result<()> {
    let client = connect(connection).await?;
    match command {
        ClusterConfigCommand::List { broker, format } => {
            let request = Request::DescribeBrokerConfigs(DescribeBrokerConfigsRequest { broker });
            // A broker alone knows what it started with: ask it.
            let answer = match broker {
                None => client.any_broker(request).await?,
                Some(id) => {
                    let metadata = client.refresh_metadata().await?;
                    let known = metadata
                        .brokers
                        .get(&id)
                        .ok_or_else(|| anyhow::anyhow!("no broker {id} is alive"))?;
                    let address = format!("{}:{}", known.host, known.port);
                    client.request(&address, request).await?
                }
            };
            let Response::DescribeBrokerConfigs(answer) = answer else {
                anyhow::bail!("unexpected answer {:?}", answer.api_key());
            };
            refused(answer.error, &answer.message)?;
            if format == Format::Json {
                let entries: Vec<_> = answer
                    .entries
                    .iter()
                    .map(|entry| {
                        json!({
                            "name": entry.name,
                            "value": entry.value,
                            "source": source_name(entry.source),
                            "live": entry.live,
                        })
                    })
                    .collect();
                println!("{}", json!({ "broker": broker, "settings": entries }));
            } else {
                for entry in &answer.entries {
                    let value = entry.value.as_deref().unwrap_or("(unset)");
                    let live = if entry.live { " live" } else { "" };
                    println!(
                        "{}={value} ({}{live})",
                        entry.name,
                        source_name(entry.source)
                    );
                }
            }
        }
        ClusterConfigCommand::Set { settings, broker } => {
            let set = settings
                .into_iter()
                .map(|(key, value)| ConfigEntry { key, value })
                .collect();
            alter(&client, broker, set, Vec::new()).await?;
            println!("set");
        }
        ClusterConfigCommand::Remove { names, broker } => {
            alter(&client, broker, Vec::new(), names).await?;
            println!("removed");
        }
    }
    Ok(())
}

async fn alter(
    client: &strata_client::Client,
    broker: Option<i32>,
    set: Vec<ConfigEntry>,
    delete: Vec<String>,
) -> anyhow::Result<()> {
    let request = Request::AlterBrokerConfigs(AlterBrokerConfigsRequest {
        broker,
        set,
        delete,
        replace: false,
        validate_only: false,
    });
    match client.any_broker(request).await? {
        Response::AlterBrokerConfigs(answer) => refused(answer.error, &answer.message),
        other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
    }
}
