//! Broker settings on both protocols: what a broker runs with (DescribeConfigs on a BROKER
//! resource, `strata cluster config list --broker`), and the settings that change live, set
//! for every broker or for one (IncrementalAlterConfigs and AlterConfigs on a BROKER resource,
//! `strata cluster config set|remove`). Checked here against the cluster view (names that
//! change live, valid values, defaults every topic still opens with), stored by the control
//! thread in the coordinator, applied by every broker when its view carries them.

use strata_coordinator::broker_configs::{BrokerConfigAlteration, BrokerScope};
use strata_wire::protocol::{
    AlterBrokerConfigsRequest, AlterBrokerConfigsResponse, BrokerConfigEntry,
    DescribeBrokerConfigsRequest, DescribeBrokerConfigsResponse, ErrorCode,
};

use crate::server::broker_config::SettingSource;
use crate::server::messages::{SettingsChange, SettingsChanged};
use crate::server::shard::Shard;

/// The wire number of a setting's source (see [`BrokerConfigEntry`]).
pub(super) fn source_code(source: SettingSource) -> u8 {
    match source {
        SettingSource::Default => 0,
        SettingSource::Static => 1,
        SettingSource::DynamicDefault => 2,
        SettingSource::DynamicBroker => 3,
    }
}

/// With a broker id (this broker's: only it knows what it started with), every setting it
/// runs with; without, the settings set live for every broker.
pub(super) fn describe(
    shard: &Shard,
    request: &DescribeBrokerConfigsRequest,
) -> DescribeBrokerConfigsResponse {
    let dynamic = shard.view.borrow().dynamic.clone();
    let node_id = shard.context.config.node_id;
    let entries = match request.broker {
        None => dynamic
            .of_scope(BrokerScope::Default)
            .into_iter()
            .map(|(name, value)| BrokerConfigEntry {
                name,
                value: Some(value),
                source: source_code(SettingSource::DynamicDefault),
                live: true,
            })
            .collect(),
        Some(broker) if broker == node_id => shard
            .context
            .config
            .broker_settings(&dynamic)
            .into_iter()
            .map(|setting| BrokerConfigEntry {
                name: setting.name,
                value: setting.value,
                source: source_code(setting.source),
                live: setting.live,
            })
            .collect(),
        Some(broker) => {
            return DescribeBrokerConfigsResponse {
                error: ErrorCode::InvalidRequest,
                message: format!("this is broker {node_id}: ask broker {broker} for its settings"),
                entries: Vec::new(),
            };
        }
    };
    DescribeBrokerConfigsResponse {
        error: ErrorCode::None,
        message: String::new(),
        entries,
    }
}

/// Checks an alteration against the cluster view and, unless only validating, has the
/// control thread store it.
pub(super) async fn alter(
    shard: &Shard,
    request: &AlterBrokerConfigsRequest,
) -> AlterBrokerConfigsResponse {
    let answer = |error, message: String| AlterBrokerConfigsResponse { error, message };
    let scope = match request.broker {
        None => BrokerScope::Default,
        Some(id) if id >= 0 => BrokerScope::Broker(id),
        Some(id) => {
            return answer(ErrorCode::InvalidRequest, format!("no broker has id {id}"));
        }
    };
    let alteration = BrokerConfigAlteration {
        scope,
        set: request
            .set
            .iter()
            .map(|entry| (entry.key.clone(), entry.value.clone()))
            .collect(),
        delete: request.delete.clone(),
        replace: request.replace,
    };
    let checked = {
        let view = shard.view.borrow();
        view.dynamic.check(&alteration, &view.topics)
    };
    if let Err(why) = checked {
        return answer(ErrorCode::InvalidConfig, why);
    }
    if request.validate_only {
        return answer(ErrorCode::None, String::new());
    }
    match super::change_settings(shard, SettingsChange::AlterBrokerConfigs(alteration)).await {
        Some(SettingsChanged::AlterBrokerConfigs(Ok(()))) => {
            tracing::info!(%scope, set = ?request.set.iter().map(|e| &e.key).collect::<Vec<_>>(), delete = ?request.delete, "broker settings changed");
            answer(ErrorCode::None, String::new())
        }
        Some(SettingsChanged::AlterBrokerConfigs(Err(why))) => answer(ErrorCode::Internal, why),
        Some(_) => answer(ErrorCode::Internal, "the change got another answer".into()),
        None => answer(ErrorCode::NotReady, "the node is stopping".into()),
    }
}
