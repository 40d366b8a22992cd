//! `strata quota`: client quotas (Kafka's `kafka-configs --entity-type users|clients`), kept
//! by the cluster's coordinator, enforced by every broker on its own traffic, changed through
//! any broker (which needs AlterConfigs on the cluster from whoever asks, once `--authorizer
//! acl` is on).

use clap::{Args, Subcommand};
use serde_json::json;
use strata_wire::protocol::{
    AlterQuotasRequest, DescribeQuotasRequest, QuotaAlteration, QuotaChange, QuotaEntityPart,
    QuotaFilterPart, Request, Response,
};

use super::Connection;
use crate::client_cmd::{Format, connect};
use crate::security_cmd::refused;

/// Who a quota applies to: a user, a client id, or both; each named or the default (Kafka's
/// `--entity-type users|clients --entity-name|--entity-default`).
#[derive(Args)]
pub struct EntityArgs {
    /// The user (as authenticated: a SASL user or a certificate's subject; `ANONYMOUS` without
    /// authentication). Without it or --entity-user-default, the quota is the client id's
    /// alone.
    #[arg(long, conflicts_with = "entity_user_default")]
    entity_user: Option<String>,
    /// Every user without a quota of their own (Kafka's `<default>` user).
    #[arg(long)]
    entity_user_default: bool,
    /// The client id (Kafka's `client.id`; native clients send none, an empty one). Without
    /// it or --entity-client-id-default, the quota is the user's alone.
    #[arg(long, conflicts_with = "entity_client_id_default")]
    entity_client_id: Option<String>,
    /// Every client id without a quota of its own (Kafka's `<default>` client id).
    #[arg(long)]
    entity_client_id_default: bool,
}

impl EntityArgs {
    fn parts(&self) -> Vec<QuotaEntityPart> {
        let mut parts = Vec::new();
        if self.entity_user.is_some() || self.entity_user_default {
            parts.push(QuotaEntityPart {
                kind: "user".into(),
                name: self.entity_user.clone(),
            });
        }
        if self.entity_client_id.is_some() || self.entity_client_id_default {
            parts.push(QuotaEntityPart {
                kind: "client-id".into(),
                name: self.entity_client_id.clone(),
            });
        }
        parts
    }

    /// A filter matching this entity exactly; everything when no part is given.
    fn filter(&self) -> Vec<QuotaFilterPart> {
        self.parts()
            .into_iter()
            .map(|part| QuotaFilterPart {
                kind: part.kind,
                match_type: if part.name.is_some() { 0 } else { 1 },
                name: part.name,
            })
            .collect()
    }
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set quotas of a user, a client id, or a user's client id (the most specific entity
    /// that sets a quota governs, as in Kafka).
    Set {
        #[command(flatten)]
        entity: EntityArgs,
        /// Produced bytes per second (64KiB, 10MB, ...); unchanged when not given.
        #[arg(long, value_parser = crate::units::parse_bytes)]
        producer_byte_rate: Option<u64>,
        /// Fetched bytes per second; unchanged when not given.
        #[arg(long, value_parser = crate::units::parse_bytes)]
        consumer_byte_rate: Option<u64>,
        /// Percent of one request-handling thread's time (100: a whole shard thread); unchanged
        /// when not given.
        #[arg(long)]
        request_percentage: Option<f64>,
    },
    /// Remove quotas of an entity: those named, or every one it has.
    Remove {
        #[command(flatten)]
        entity: EntityArgs,
        /// producer_byte_rate, consumer_byte_rate or request_percentage (repeatable; default:
        /// all three).
        #[arg(long = "quota")]
        quotas: Vec<String>,
    },
    /// Quotas set: of the entity given exactly, or every one.
    List {
        #[command(flatten)]
        entity: EntityArgs,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

const QUOTAS: [&str; 3] = [
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
];

pub async fn quota(connection: Connection, command: QuotaCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    match command {
        QuotaCommand::Set {
            entity,
            producer_byte_rate,
            consumer_byte_rate,
            request_percentage,
        } => {
            let changes: Vec<QuotaChange> = [
                (QUOTAS[0], producer_byte_rate.map(|rate| rate as f64)),
                (QUOTAS[1], consumer_byte_rate.map(|rate| rate as f64)),
                (QUOTAS[2], request_percentage),
            ]
            .into_iter()
            .filter_map(|(key, value)| {
                value.map(|value| QuotaChange {
                    key: key.into(),
                    value,
                    remove: false,
                })
            })
            .collect();
            anyhow::ensure!(
                !changes.is_empty(),
                "give at least one of --producer-byte-rate, --consumer-byte-rate, --request-percentage"
            );
            alter(&client, entity.parts(), changes).await?;
            println!("set");
        }
        QuotaCommand::Remove { entity, quotas } => {
            let keys: Vec<String> = if quotas.is_empty() {
                QUOTAS.iter().map(|key| key.to_string()).collect()
            } else {
                quotas
            };
            let changes = keys
                .into_iter()
                .map(|key| QuotaChange {
                    key,
                    value: 0.0,
                    remove: true,
                })
                .collect();
            alter(&client, entity.parts(), changes).await?;
            println!("removed");
        }
        QuotaCommand::List { entity, format } => {
            let filter = entity.filter();
            let strict = !filter.is_empty();
            let entries = match client
                .any_broker(Request::DescribeQuotas(DescribeQuotasRequest {
                    filter,
                    strict,
                }))
                .await?
            {
                Response::DescribeQuotas(answer) => {
                    refused(answer.error, &answer.message)?;
                    answer.entries
                }
                other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
            };
            for entry in entries {
                let name = |part: &QuotaEntityPart| {
                    part.name.clone().unwrap_or_else(|| "<default>".into())
                };
                match format {
                    Format::Json => {
                        let mut object = serde_json::Map::new();
                        for part in &entry.entity {
                            object.insert(part.kind.clone(), json!(part.name));
                        }
                        for value in &entry.values {
                            object.insert(value.key.clone(), json!(value.value));
                        }
                        println!("{}", serde_json::Value::Object(object));
                    }
                    Format::Text => {
                        let entity: Vec<String> = entry
                            .entity
                            .iter()
                            .map(|part| format!("{}={}", part.kind, name(part)))
                            .collect();
                        let values: Vec<String> = entry
                            .values
                            .iter()
                            .map(|value| format!("{}={}", value.key, value.value))
                            .collect();
                        println!("{}: {}", entity.join(","), values.join(" "));
                    }
                }
            }
        }
    }
    Ok(())
}

async fn alter(
    client: &strata_client::Client,
    entity: Vec<QuotaEntityPart>,
    changes: Vec<QuotaChange>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !entity.is_empty(),
        "name the entity: --entity-user, --entity-user-default, --entity-client-id or --entity-client-id-default"
    );
    let request = Request::AlterQuotas(AlterQuotasRequest {
        entries: vec![QuotaAlteration { entity, changes }],
        validate_only: false,
    });
    match client.any_broker(request).await? {
        Response::AlterQuotas(answer) => {
            refused(answer.error, "")?;
            for result in answer.results {
                refused(result.error, &result.message)?;
            }
            Ok(())
        }
        other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
    }
}
