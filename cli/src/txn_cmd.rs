//! `strata txn`: the transactional ids the cluster coordinates, and one id's transaction
//! (Kafka's `kafka-transactions list|describe`).

use clap::Subcommand;
use serde_json::json;
use strata_client::ErrorCode;

use super::Connection;
use crate::client_cmd::{Format, connect};

#[derive(Subcommand)]
pub enum TxnCommand {
    /// Every transactional id, its producer id and its transaction's state.
    List {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// One transactional id: producer id and epoch, state, timeout, when its open transaction
    /// began and the partitions and groups it holds.
    Describe {
        transactional_id: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

pub async fn txn(connection: Connection, command: TxnCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    match command {
        TxnCommand::List { format } => {
            let listed = client.list_transactions().await?;
            if format == Format::Json {
                let listed: Vec<_> = listed
                    .iter()
                    .map(|t| {
                        json!({
                            "transactional_id": t.transactional_id,
                            "producer_id": t.producer_id,
                            "state": t.state,
                        })
                    })
                    .collect();
                outln!("{}", json!({ "transactions": listed }));
            } else {
                for t in listed {
                    outln!(
                        "{} producer {} {}",
                        t.transactional_id,
                        t.producer_id,
                        t.state
                    );
                }
            }
        }
        TxnCommand::Describe {
            transactional_id,
            format,
        } => {
            let described = match client.describe_transaction(&transactional_id).await {
                Ok(described) => described,
                Err(error) if error.code() == Some(ErrorCode::TransactionalIdNotFound) => {
                    anyhow::bail!("no transactional id {transactional_id}")
                }
                Err(error) => return Err(error.into()),
            };
            let partitions: Vec<String> = described
                .partitions
                .iter()
                .flat_map(|topic| {
                    topic
                        .partitions
                        .iter()
                        .map(move |p| format!("{}-{p}", topic.topic))
                })
                .collect();
            if format == Format::Json {
                outln!(
                    "{}",
                    json!({
                        "transactional_id": described.transactional_id,
                        "producer_id": described.producer_id,
                        "producer_epoch": described.producer_epoch,
                        "state": described.state,
                        "timeout_ms": described.timeout_ms,
                        "started_ms": described.started_ms,
                        "partitions": partitions,
                        "groups": described.groups,
                    })
                );
            } else {
                outln!("transactional id  {}", described.transactional_id);
                outln!(
                    "producer          {} (epoch {})",
                    described.producer_id,
                    described.producer_epoch
                );
                outln!("state             {}", described.state);
                outln!("timeout           {} ms", described.timeout_ms);
                if described.started_ms >= 0 {
                    let open_ms = strata_client::now_ms().saturating_sub(described.started_ms);
                    outln!("open for          {} ms", open_ms.max(0));
                }
                outln!("partitions        {}", partitions.join(", "));
                outln!("groups            {}", described.groups.join(", "));
            }
        }
    }
    Ok(())
}
