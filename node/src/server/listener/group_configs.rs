//! Group configs on both protocols (Kafka's GROUP config resources: DescribeConfigs,
//! IncrementalAlterConfigs and AlterConfigs, `kafka-configs --entity-type groups`; natively
//! DescribeGroupConfigs and AlterGroupConfigs, `strata group config`): described from the
//! cluster view, checked here against it (`server::group_config` says which names and values
//! a group may have), stored by the control thread in the coordinator, and carried to every
//! broker by its view, where whichever coordinates the group reads them.

use strata_coordinator::group_configs::GroupConfigAlteration;
use strata_wire::protocol::{
    AlterGroupConfigsRequest, AlterGroupConfigsResponse, DescribeGroupConfigsRequest,
    DescribeGroupConfigsResponse, ErrorCode, GroupConfigEntry,
};

use crate::server::group_config::{GROUP_CONFIGS, check_group_alteration};
use crate::server::messages::{SettingsChange, SettingsChanged};
use crate::server::shard::Shard;

/// One config of a group as described: its value, and whether the group sets it (else it is
/// the default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DescribedGroupConfig {
    pub(super) name: &'static str,
    pub(super) value: String,
    pub(super) set: bool,
    pub(super) documentation: &'static str,
}

/// Every group config of `group`, in the order of [`GROUP_CONFIGS`]: those it sets with their
/// values, the others at their defaults. A group need not exist to have configs.
pub(super) fn describe(shard: &Shard, group: &str) -> Vec<DescribedGroupConfig> {
    let all = shard.view.borrow().group_configs.clone();
    let set = all.get(group);
    GROUP_CONFIGS
        .iter()
        .map(|&(name, default, documentation)| {
            let value = set.and_then(|values| values.get(name));
            DescribedGroupConfig {
                name,
                value: value.map_or(default, String::as_str).to_string(),
                set: value.is_some(),
                documentation,
            }
        })
        .collect()
}

/// Checks `alteration` against the group's configs in the cluster view and, unless only
/// validating, has the control thread store it. The error: INVALID_CONFIG for a change the
/// group may not have, otherwise why it was not stored.
pub(super) async fn alter(
    shard: &Shard,
    alteration: GroupConfigAlteration,
    validate_only: bool,
) -> Result<(), (ErrorCode, String)> {
    let checked = {
        let view = shard.view.borrow();
        let current = view
            .group_configs
            .get(&alteration.group)
            .cloned()
            .unwrap_or_default();
        check_group_alteration(&current, &alteration)
    };
    checked.map_err(|why| (ErrorCode::InvalidConfig, why))?;
    if validate_only {
        return Ok(());
    }
    let group = alteration.group.clone();
    let set: Vec<String> = alteration.set.keys().cloned().collect();
    let delete = alteration.delete.clone();
    match super::change_settings(shard, SettingsChange::AlterGroupConfigs(alteration)).await {
        Some(SettingsChanged::AlterGroupConfigs(Ok(()))) => {
            tracing::info!(%group, ?set, ?delete, "group configs changed");
            Ok(())
        }
        Some(SettingsChanged::AlterGroupConfigs(Err(why))) => Err((ErrorCode::Internal, why)),
        Some(_) => Err((ErrorCode::Internal, "the change got another answer".into())),
        None => Err((ErrorCode::NotReady, "the node is stopping".into())),
    }
}

/// The native DescribeGroupConfigs: [`describe`], refused for an unnamed group.
pub(super) fn describe_native(
    shard: &Shard,
    request: &DescribeGroupConfigsRequest,
) -> DescribeGroupConfigsResponse {
    if request.group.is_empty() {
        return DescribeGroupConfigsResponse {
            error: ErrorCode::InvalidGroupId,
            message: "a group config needs a group name".into(),
            entries: Vec::new(),
        };
    }
    let entries = describe(shard, &request.group)
        .into_iter()
        .map(|config| GroupConfigEntry {
            name: config.name.to_string(),
            value: config.value,
            set: config.set,
        })
        .collect();
    DescribeGroupConfigsResponse {
        error: ErrorCode::None,
        message: String::new(),
        entries,
    }
}

/// The native AlterGroupConfigs: refused for an unnamed group, and (INVALID_REQUEST, as
/// Kafka's path) when it names a config twice, which would leave which change wins a guess;
/// else [`alter`].
pub(super) async fn alter_native(
    shard: &Shard,
    request: &AlterGroupConfigsRequest,
) -> AlterGroupConfigsResponse {
    let answer = |error, message: String| AlterGroupConfigsResponse { error, message };
    if request.group.is_empty() {
        return answer(
            ErrorCode::InvalidGroupId,
            "a group config needs a group name".into(),
        );
    }
    let mut named = std::collections::BTreeSet::new();
    let names = request
        .set
        .iter()
        .map(|entry| &entry.key)
        .chain(&request.delete);
    for name in names {
        if !named.insert(name) {
            return answer(ErrorCode::InvalidRequest, format!("{name} is named twice"));
        }
    }
    let alteration = GroupConfigAlteration {
        group: request.group.clone(),
        set: request
            .set
            .iter()
            .map(|entry| (entry.key.clone(), entry.value.clone()))
            .collect(),
        delete: request.delete.clone(),
        replace: request.replace,
    };
    match alter(shard, alteration, request.validate_only).await {
        Ok(()) => answer(ErrorCode::None, String::new()),
        Err((error, message)) => {
            tracing::debug!(group = %request.group, "group configs refused: {message}");
            answer(error, message)
        }
    }
}
