//! DescribeClientQuotas and AlterClientQuotas: Kafka's quota entities and filters translated
//! onto the cluster's stored quotas (see [`crate::server::listener::quota`]). Describing
//! needs DescribeConfigs on the cluster, altering AlterConfigs, as in Kafka.

use std::rc::Rc;

use strata_auth::acl::Operation;
use strata_coordinator::quotas::{QuotaAlteration, QuotaEntity, QuotaFilter, QuotaKey};
use strata_kafka::errors;
use strata_kafka::kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlteredEntity, EntryData as AlteredEntry,
};
use strata_kafka::kafka_protocol::messages::describe_client_quotas_response::{
    EntityData, EntryData, ValueData,
};
use strata_kafka::kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use strata_kafka::text;

use super::authorize;
use super::encoded;
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::listener::quota::{self, AlterRefused};
use crate::server::shard::Shard;
use strata_kafka::frame::{Header, KafkaRequest};

fn describe_client_quotas(
    shard: &Shard,
    client: &Client,
    request: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let refused = |code, message: String| {
        DescribeClientQuotasResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(&message)))
            .with_entries(None)
    };
    if !authorize::cluster(shard, client, Operation::DescribeConfigs) {
        return refused(
            errors::CLUSTER_AUTHORIZATION_FAILED,
            "describing client quotas needs DescribeConfigs on the cluster".into(),
        );
    }
    let components = request.components.iter().map(|component| {
        (
            component.entity_type.as_str(),
            component.match_type,
            component._match.as_ref().map(|name| name.as_str()),
        )
    });
    let filter = match QuotaFilter::from_components(components, request.strict) {
        Ok(filter) => filter,
        Err(error) => return refused(errors::INVALID_REQUEST, error.to_string()),
    };
    let entries = quota::describe(shard, &filter)
        .into_iter()
        .map(|record| {
            let entity = record
                .entity
                .parts()
                .into_iter()
                .map(|(kind, name)| {
                    EntityData::default()
                        .with_entity_type(text(kind))
                        .with_entity_name(name.map(text))
                })
                .collect();
            let values = record
                .values
                .iter()
                .map(|(key, value)| {
                    ValueData::default()
                        .with_key(text(key.name()))
                        .with_value(*value)
                })
                .collect();
            EntryData::default().with_entity(entity).with_values(values)
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

async fn alter_client_quotas(
    shard: &Rc<Shard>,
    client: &Client,
    request: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let allowed = authorize::cluster(shard, client, Operation::AlterConfigs);
    let alterations = request
        .entries
        .iter()
        .map(|entry| {
            let entity = QuotaEntity::from_parts(entry.entity.iter().map(|part| {
                (
                    part.entity_type.as_str(),
                    part.entity_name.as_ref().map(|name| name.as_str()),
                )
            }))
            .map_err(|error| error.to_string())?;
            let changes = entry
                .ops
                .iter()
                .map(|op| {
                    let key = QuotaKey::parse(op.key.as_str()).map_err(|e| e.to_string())?;
                    Ok((key, (!op.remove).then_some(op.value)))
                })
                .collect::<Result<_, String>>()?;
            Ok(QuotaAlteration { entity, changes })
        })
        .collect();
    let answers = if allowed {
        quota::alter(shard, alterations, request.validate_only).await
    } else {
        Vec::new()
    };
    let entries = request
        .entries
        .iter()
        .enumerate()
        .map(|(at, entry)| {
            let (code, message) = match answers.get(at) {
                _ if !allowed => (
                    errors::CLUSTER_AUTHORIZATION_FAILED,
                    Some("altering client quotas needs AlterConfigs on the cluster".to_string()),
                ),
                Some(Ok(())) => (errors::NONE, None),
                Some(Err(AlterRefused::Invalid(why))) => {
                    (errors::INVALID_REQUEST, Some(why.clone()))
                }
                Some(Err(AlterRefused::Failed(why))) => {
                    (errors::UNKNOWN_SERVER_ERROR, Some(why.clone()))
                }
                None => (errors::UNKNOWN_SERVER_ERROR, None),
            };
            let entity = entry
                .entity
                .iter()
                .map(|part| {
                    AlteredEntity::default()
                        .with_entity_type(part.entity_type.clone())
                        .with_entity_name(part.entity_name.clone())
                })
                .collect();
            AlteredEntry::default()
                .with_error_code(code)
                .with_error_message(message.map(|message| text(&message)))
                .with_entity(entity)
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}

/// Answers a client quota request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::DescribeClientQuotas(request) => {
            encoded(&header, describe_client_quotas(shard, client, request))
        }
        KafkaRequest::AlterClientQuotas(request) => {
            encoded(&header, alter_client_quotas(shard, client, request).await)
        }
        _ => unreachable!("only the client quota APIs come here"),
    }
}
