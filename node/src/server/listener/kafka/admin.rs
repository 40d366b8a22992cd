//! Kafka's administration APIs on the Kafka listener: each topic, group or config resource of
//! a request runs as its native request (`strata_kafka::admin` translates both ways).

use std::rc::Rc;

use strata_kafka::admin;
use strata_kafka::errors::{self, kafka_error};
use strata_kafka::kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use strata_kafka::kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use strata_kafka::kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteGroupsRequest, DeleteGroupsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, ListGroupsRequest, ListGroupsResponse, OffsetDeleteRequest,
    OffsetDeleteResponse, TopicName, alter_configs_response, incremental_alter_configs_response,
};
use strata_kafka::kafka_protocol::protocol::StrBytes;
use strata_wire::protocol::{self as native, Request, Response};

use super::{authorize, native, share_admin};
use crate::server::groups::coordinator_of;
use crate::server::listener::Client;
use crate::server::shard::Shard;
use strata_auth::acl::Operation;
use strata_coordinator::broker_configs::BrokerScope;

use super::encoded;
use crate::server::broker_config::{DynamicSettings, check_topic_settings};
use crate::server::listener::Outcome;
use strata_kafka::frame::{Header, KafkaRequest};

async fn create_topics(
    shard: &Rc<Shard>,
    client: &Client,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut results = Vec::new();
    let defaults = shard.kafka_topic_defaults();
    for (name, translated) in admin::create_topics_requests(&request, defaults) {
        let result = match translated {
            Err(refusal) => admin::create_topic_result(&name, Err(refusal)),
            Ok(_) if !authorize::create_topic(shard, client, &name) => admin::create_topic_result(
                &name,
                Err(admin::Refusal {
                    error: errors::TOPIC_AUTHORIZATION_FAILED,
                    message: "Create on the cluster or the topic is needed".into(),
                }),
            ),
            Ok(create) if request.validate_only => {
                let checked = check_create(shard, &create);
                admin::create_topic_result(&name, Ok((checked, &create)))
            }
            Ok(create) => {
                let response = match native(shard, Request::CreateTopic(create.clone())).await {
                    Ok(Response::CreateTopic(response)) => response,
                    Ok(_) | Err(_) => native::CreateTopicResponse {
                        error: native::ErrorCode::Internal,
                        message: "no answer from the broker".into(),
                    },
                };
                let mut result = admin::create_topic_result(&name, Ok((response, &create)));
                let view = shard.view.borrow();
                if let Some(topic) = view.topics.iter().find(|topic| topic.name == name) {
                    result.topic_id = super::kafka_topic_id(topic);
                }
                result
            }
        };
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// What creating `create` would answer, from this broker's view, creating nothing (Kafka's
/// `validate_only`): the name, that no topic has it, the settings, the partition count and
/// that enough brokers are live for the replication factor, or that the brokers a replica
/// assignment names are registered. The create itself can still fail
/// if the cluster changes first, as Kafka's can.
fn check_create(shard: &Shard, create: &native::CreateTopicRequest) -> native::CreateTopicResponse {
    let failed = |error, message: String| native::CreateTopicResponse { error, message };
    if let Err(error) = strata_coordinator::validate_topic_name(&create.name) {
        return failed(native::ErrorCode::InvalidTopicName, error.to_string());
    }
    let view = shard.view.borrow();
    if view.topics.iter().any(|topic| topic.name == create.name) {
        return failed(
            native::ErrorCode::TopicAlreadyExists,
            format!("topic {} already exists", create.name),
        );
    }
    let overrides = create
        .configs
        .iter()
        .map(|entry| (entry.key.clone(), entry.value.clone()))
        .collect();
    if let Err(message) = check_topic_settings(view.dynamic.records(), &overrides) {
        return failed(native::ErrorCode::InvalidConfig, message);
    }
    if let Err(message) = crate::server::control::check_partition_count(create.partitions) {
        return failed(native::ErrorCode::InvalidConfig, message);
    }
    if !create.replica_assignment.0.is_empty() {
        if let Err(message) =
            strata_coordinator::placement::assigned(&view.brokers, &create.replica_assignment.0)
        {
            return failed(native::ErrorCode::InvalidReplicaAssignment, message);
        }
    } else if usize::from(create.replication_factor) > view.brokers.len() {
        return failed(
            native::ErrorCode::InvalidConfig,
            format!(
                "replication factor {} is more than the {} live brokers",
                create.replication_factor,
                view.brokers.len()
            ),
        );
    }
    native::CreateTopicResponse {
        error: native::ErrorCode::None,
        message: String::new(),
    }
}

/// What growing a topic would answer, from this broker's view, growing nothing (Kafka's
/// `validate_only`): the topic exists, the new count is above its current one, and an
/// assignment of the new partitions names registered brokers, as many as the topic's
/// replication factor.
fn check_create_partitions(
    shard: &Shard,
    create: &native::CreatePartitionsRequest,
) -> native::CreatePartitionsResponse {
    let view = shard.view.borrow();
    let Some(topic) = view.topics.iter().find(|topic| topic.name == create.topic) else {
        return native::CreatePartitionsResponse {
            error: native::ErrorCode::UnknownTopic,
            message: format!("unknown topic {}", create.topic),
        };
    };
    if let Err(error) = strata_coordinator::placement::grow_as_asked(
        &view.brokers,
        topic,
        create.partitions,
        &create.replica_assignment.0,
    ) {
        let code = match error {
            strata_coordinator::CoordinatorError::InvalidReplicaAssignment(_) => {
                native::ErrorCode::InvalidReplicaAssignment
            }
            _ => native::ErrorCode::InvalidConfig,
        };
        return native::CreatePartitionsResponse {
            error: code,
            message: error.to_string(),
        };
    }
    native::CreatePartitionsResponse {
        error: native::ErrorCode::None,
        message: String::new(),
    }
}

/// What altering a topic's settings would answer, altering nothing (Kafka's `validate_only`):
/// the topic's overrides with `alter` applied must parse.
fn check_alter(
    current: &native::DescribeTopicConfigResponse,
    alter: &native::AlterTopicConfigRequest,
    live_defaults: &[strata_coordinator::broker_configs::BrokerConfigRecord],
) -> native::AlterTopicConfigResponse {
    if current.error != native::ErrorCode::None {
        return native::AlterTopicConfigResponse {
            error: current.error,
            message: format!("the topic's settings could not be read: {}", current.error),
        };
    }
    let mut overrides: std::collections::BTreeMap<String, String> = current
        .configs
        .iter()
        .filter(|entry| entry.is_override)
        .map(|entry| (entry.key.clone(), entry.value.clone()))
        .collect();
    for key in &alter.delete {
        overrides.remove(key);
    }
    for entry in &alter.set {
        overrides.insert(entry.key.clone(), entry.value.clone());
    }
    match check_topic_settings(live_defaults, &overrides) {
        Ok(()) => native::AlterTopicConfigResponse {
            error: native::ErrorCode::None,
            message: String::new(),
        },
        Err(message) => native::AlterTopicConfigResponse {
            error: native::ErrorCode::InvalidConfig,
            message,
        },
    }
}

async fn delete_topics(
    shard: &Rc<Shard>,
    client: &Client,
    version: i16,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut results = Vec::new();
    for name in admin::delete_topics_names(&request, version) {
        let error = match &name {
            None => errors::UNKNOWN_TOPIC_OR_PARTITION,
            Some(name) if !authorize::topic(shard, client, Operation::Delete, name) => {
                errors::TOPIC_AUTHORIZATION_FAILED
            }
            Some(name) => {
                let delete = native::DeleteTopicRequest { name: name.clone() };
                match native(shard, Request::DeleteTopic(delete)).await {
                    Ok(Response::DeleteTopic(response)) => kafka_error(response.error),
                    Ok(_) => errors::UNKNOWN_SERVER_ERROR,
                    Err(code) => kafka_error(code),
                }
            }
        };
        results.push(admin::delete_topic_result(name, error));
    }
    DeleteTopicsResponse::default().with_responses(results)
}

async fn create_partitions(
    shard: &Rc<Shard>,
    client: &Client,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    for (name, translated) in admin::create_partitions_requests(&request) {
        let created = match translated {
            Err(refusal) => Err(refusal),
            Ok(_) if !authorize::topic(shard, client, Operation::Alter, &name) => {
                Err(admin::Refusal {
                    error: errors::TOPIC_AUTHORIZATION_FAILED,
                    message: "Alter on the topic is needed".into(),
                })
            }
            Ok(create) if request.validate_only => Ok(check_create_partitions(shard, &create)),
            Ok(create) => match native(shard, Request::CreatePartitions(create)).await {
                Ok(Response::CreatePartitions(response)) => Ok(response),
                Ok(_) | Err(_) => Ok(native::CreatePartitionsResponse {
                    error: native::ErrorCode::Internal,
                    message: "no answer from the broker".into(),
                }),
            },
        };
        results.push(admin::create_partitions_result(&name, created));
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// ListGroups: the groups this broker coordinates (admin clients ask every broker and join
/// the lists), each with its state and type: consumer groups from the store, share groups
/// from their coordinator's group thread (running, or with state stored).
async fn list_groups(
    shard: &Rc<Shard>,
    client: &Client,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let mut groups = match native(shard, Request::ListGroups(native::ListGroupsRequest {})).await {
        Ok(Response::ListGroups(groups)) => groups,
        Ok(_) => {
            return ListGroupsResponse::default().with_error_code(errors::UNKNOWN_SERVER_ERROR);
        }
        Err(code) => return ListGroupsResponse::default().with_error_code(kafka_error(code)),
    };
    let types = match share_admin::group_types(shard).await {
        Ok(types) => types,
        Err(code) => return ListGroupsResponse::default().with_error_code(kafka_error(code)),
    };
    let wanted = |group_type: admin::GroupType| {
        request.types_filter.is_empty()
            || request
                .types_filter
                .iter()
                .any(|wanted| wanted.trim().eq_ignore_ascii_case(group_type.name()))
    };
    let brokers: Vec<i32> = shard.view.borrow().brokers.iter().map(|b| b.id).collect();
    let here = shard.context.config.node_id;
    // Without Describe on the cluster, only the groups the client may Describe.
    let all = authorize::cluster(shard, client, Operation::Describe);
    let may = |group: &str| all || authorize::group(shard, client, Operation::Describe, group);
    let consumer_type = |group: &str| {
        if types.classic.contains(group) {
            admin::GroupType::Classic
        } else {
            admin::GroupType::Consumer
        }
    };
    groups.groups.retain(|listed| {
        coordinator_of(&listed.group, &brokers) == Some(here)
            && !types.share.contains_key(&listed.group)
            && wanted(consumer_type(&listed.group))
            && may(&listed.group)
    });
    // Their states, as this broker (their coordinator) describes them; a group whose
    // description fails is listed with an empty state.
    let mut listed = Vec::with_capacity(groups.groups.len() + types.share.len());
    for group in groups.groups {
        let describe = native::DescribeGroupRequest {
            group: group.group.clone(),
        };
        let state = match native(shard, Request::DescribeGroup(describe)).await {
            Ok(Response::DescribeGroup(described))
                if described.error == native::ErrorCode::None =>
            {
                described.state
            }
            _ => String::new(),
        };
        listed.push(admin::ListedKafkaGroup {
            group_type: consumer_type(&group.group),
            group: group.group,
            state,
        });
    }
    if wanted(admin::GroupType::Share) {
        for (group, members) in &types.share {
            if may(group) {
                listed.push(admin::ListedKafkaGroup {
                    group: group.clone(),
                    group_type: admin::GroupType::Share,
                    state: if *members > 0 { "Stable" } else { "Empty" }.to_string(),
                });
            }
        }
    }
    admin::list_groups_response(
        groups.error,
        listed,
        &request.states_filter,
        &request.types_filter,
    )
}

async fn describe_groups(
    shard: &Rc<Shard>,
    client: &Client,
    version: i16,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut groups = Vec::new();
    for group in request.groups {
        let describe = native::DescribeGroupRequest {
            group: group.0.to_string(),
        };
        let refused = |error| native::DescribeGroupResponse {
            error,
            group: group.0.to_string(),
            generation: -1,
            state: String::new(),
            assignor: String::new(),
            members: Vec::new(),
            offsets: Vec::new(),
        };
        let described = if !authorize::group(shard, client, Operation::Describe, &group.0) {
            refused(native::ErrorCode::GroupAuthorizationFailed)
        } else {
            match native(shard, Request::DescribeGroup(describe)).await {
                Ok(Response::DescribeGroup(described)) => described,
                Ok(_) | Err(_) => refused(native::ErrorCode::CoordinatorNotAvailable),
            }
        };
        // Nothing of a consumer group by that name: a share group is described as Kafka
        // describes a group of another type here (Dead; from v6, GROUP_ID_NOT_FOUND).
        let unknown = described.error == native::ErrorCode::None
            && described.generation == 0
            && described.members.is_empty()
            && described.offsets.is_empty();
        if unknown {
            let share = share_admin::inspect(shard, &group.0).await;
            groups.push(if share.is_ok_and(|stored| stored.exists()) {
                admin::other_type_of_group(&group.0, version)
            } else {
                admin::missing_group(&group.0, version)
            });
            continue;
        }
        groups.push(admin::described_group(described));
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

async fn topic_config(shard: &Rc<Shard>, topic: &str) -> native::DescribeTopicConfigResponse {
    let describe = native::DescribeTopicConfigRequest {
        topic: topic.to_string(),
    };
    match native(shard, Request::DescribeTopicConfig(describe)).await {
        Ok(Response::DescribeTopicConfig(described)) => described,
        Ok(_) | Err(_) => native::DescribeTopicConfigResponse {
            error: native::ErrorCode::Internal,
            configs: Vec::new(),
        },
    }
}

/// Runs a translated alter, or with `validate_only` checks it against the topic's settings.
async fn alter(
    shard: &Rc<Shard>,
    alter: Result<native::AlterTopicConfigRequest, admin::Refusal>,
    validate_only: bool,
) -> (i16, Option<StrBytes>) {
    let altered = match alter {
        Err(refusal) => Err(refusal),
        Ok(alter) if validate_only => {
            let current = topic_config(shard, &alter.topic).await;
            let dynamic = shard.view.borrow().dynamic.clone();
            Ok(check_alter(&current, &alter, dynamic.records()))
        }
        Ok(alter) => match native(shard, Request::AlterTopicConfig(alter)).await {
            Ok(Response::AlterTopicConfig(altered)) => Ok(altered),
            Ok(_) | Err(_) => Ok(native::AlterTopicConfigResponse {
                error: native::ErrorCode::Internal,
                message: "no answer from the broker".into(),
            }),
        },
    };
    admin::alter_outcome(altered)
}

async fn describe_configs(
    shard: &Rc<Shard>,
    client: &Client,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut results = Vec::new();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        if resource.resource_type == admin::RESOURCE_BROKER {
            results.push(describe_broker_configs(shard, client, resource));
            continue;
        }
        if resource.resource_type == admin::RESOURCE_GROUP {
            results.push(describe_group_configs(
                shard,
                client,
                resource,
                request.include_documentation,
            ));
            continue;
        }
        if resource.resource_type != admin::RESOURCE_TOPIC {
            results.push(
                DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(StrBytes::from_static_str(
                        "only topic, broker and group configs are served",
                    ))),
            );
            continue;
        }
        if !authorize::topic(shard, client, Operation::DescribeConfigs, &name) {
            results.push(
                DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(StrBytes::from_static_str(
                        "DescribeConfigs on the topic is needed",
                    ))),
            );
            continue;
        }
        let keys: Option<Vec<String>> = resource
            .configuration_keys
            .map(|keys| keys.iter().map(ToString::to_string).collect());
        let described = topic_config(shard, &name).await;
        let dynamic = shard.view.borrow().dynamic.clone();
        results.push(admin::describe_configs_result(
            &name,
            described,
            keys.as_deref(),
            |key| match dynamic.topic_default_scope(key) {
                Some(BrokerScope::Broker(_)) => admin::SOURCE_DYNAMIC_BROKER,
                Some(BrokerScope::Default) => admin::SOURCE_DYNAMIC_DEFAULT_BROKER,
                None => admin::SOURCE_DEFAULT,
            },
        ));
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// This broker's settings (DescribeConfigs on the cluster needed): a client asks each broker
/// for its own, by id; the empty name is the settings set live for every broker.
fn describe_broker_configs(
    shard: &Shard,
    client: &Client,
    resource: strata_kafka::kafka_protocol::messages::describe_configs_request::DescribeConfigsResource,
) -> DescribeConfigsResult {
    let refused = |error, message: String| {
        DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone())
            .with_error_code(error)
            .with_error_message(Some(StrBytes::from_string(message)))
    };
    if !authorize::cluster(shard, client, Operation::DescribeConfigs) {
        return refused(
            errors::CLUSTER_AUTHORIZATION_FAILED,
            "DescribeConfigs on the cluster is needed".into(),
        );
    }
    let name = resource.resource_name.to_string();
    let broker = match BrokerScope::from_resource_name(&name) {
        Some(BrokerScope::Default) => None,
        Some(BrokerScope::Broker(id)) => Some(id),
        None => {
            return refused(
                errors::INVALID_REQUEST,
                format!("{name:?} is not a broker id (or \"\" for every broker)"),
            );
        }
    };
    let described = super::super::broker_configs::describe(
        shard,
        &native::DescribeBrokerConfigsRequest { broker },
    );
    let keys: Option<Vec<String>> = resource
        .configuration_keys
        .map(|keys| keys.iter().map(ToString::to_string).collect());
    admin::describe_broker_configs_result(&name, described, keys.as_deref())
}

/// A group's configs (DescribeConfigs on the group needed): every config a group may set,
/// those it sets as DYNAMIC_GROUP_CONFIG, the others at their defaults.
fn describe_group_configs(
    shard: &Shard,
    client: &Client,
    resource: strata_kafka::kafka_protocol::messages::describe_configs_request::DescribeConfigsResource,
    include_documentation: bool,
) -> DescribeConfigsResult {
    let refused = |error, message: &'static str| {
        DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone())
            .with_error_code(error)
            .with_error_message(Some(StrBytes::from_static_str(message)))
    };
    let group = resource.resource_name.to_string();
    if !authorize::group(shard, client, Operation::DescribeConfigs, &group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            "DescribeConfigs on the group is needed",
        );
    }
    if group.is_empty() {
        return refused(
            errors::INVALID_REQUEST,
            "a group config resource needs a group name",
        );
    }
    let described = super::super::group_configs::describe(shard, &group);
    let entries = described.iter().map(|config| admin::GroupConfigEntry {
        name: config.name,
        value: &config.value,
        set: config.set,
        documentation: config.documentation,
    });
    // As Kafka reads the filter: no keys, or an empty list of them, asks for every config.
    let keys: Option<Vec<String>> = resource
        .configuration_keys
        .filter(|keys| !keys.is_empty())
        .map(|keys| keys.iter().map(ToString::to_string).collect());
    admin::describe_group_configs_result(&group, entries, keys.as_deref(), include_documentation)
}

/// A GROUP resource's changes (AlterConfigs on the group needed), translated, checked and,
/// unless only validated, stored; with `replace` (the legacy AlterConfigs) the configs given
/// become the whole of the group's.
async fn alter_group_configs(
    shard: &Shard,
    client: &Client,
    group: &str,
    configs: impl IntoIterator<Item = (String, i8, Option<String>)>,
    replace: bool,
    validate_only: bool,
) -> (i16, Option<StrBytes>) {
    let refused = |error, message: String| (error, Some(StrBytes::from_string(message)));
    if !authorize::group(shard, client, Operation::AlterConfigs, group) {
        return refused(
            errors::GROUP_AUTHORIZATION_FAILED,
            "AlterConfigs on the group is needed".into(),
        );
    }
    let change = match admin::group_alter_request(group, configs) {
        Ok(change) => change,
        Err(refusal) => return refused(refusal.error, refusal.message),
    };
    let alteration = strata_coordinator::group_configs::GroupConfigAlteration {
        group: group.to_string(),
        set: change.set.into_iter().collect(),
        delete: change.delete,
        replace,
    };
    match super::super::group_configs::alter(shard, alteration, validate_only).await {
        Ok(()) => (errors::NONE, None),
        Err((error, message)) => {
            tracing::debug!(group, "group configs refused: {message}");
            refused(kafka_error(error), message)
        }
    }
}

/// The value set live of `setting` for the BROKER resource `name` ("" every broker's, else
/// that broker's own or, without one, every broker's).
fn live_value(dynamic: &DynamicSettings, name: &str, setting: &str) -> Option<String> {
    match BrokerScope::from_resource_name(name)? {
        BrokerScope::Default => dynamic.of_scope(BrokerScope::Default).remove(setting),
        BrokerScope::Broker(id) => DynamicSettings::new(dynamic.records().to_vec(), id)
            .get(setting)
            .map(|(value, _)| value.to_string()),
    }
}

/// A BROKER resource's changes (AlterConfigs on the cluster needed), translated and applied.
async fn alter_broker_configs(
    shard: &Shard,
    client: &Client,
    name: &str,
    translated: Result<native::AlterBrokerConfigsRequest, admin::Refusal>,
) -> (i16, Option<StrBytes>) {
    if !authorize::cluster(shard, client, Operation::AlterConfigs) {
        return (
            errors::CLUSTER_AUTHORIZATION_FAILED,
            Some(StrBytes::from_static_str(
                "AlterConfigs on the cluster is needed",
            )),
        );
    }
    let request = match translated {
        Ok(request) => request,
        Err(refusal) => return (refusal.error, Some(StrBytes::from_string(refusal.message))),
    };
    let altered = super::super::broker_configs::alter(shard, &request).await;
    if altered.error == native::ErrorCode::None {
        return (errors::NONE, None);
    }
    tracing::debug!(
        broker = name,
        "broker settings refused: {}",
        altered.message
    );
    (
        kafka_error(altered.error),
        Some(StrBytes::from_string(altered.message)),
    )
}

async fn incremental_alter_configs(
    shard: &Rc<Shard>,
    client: &Client,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        if resource.resource_type == admin::RESOURCE_BROKER {
            let configs = resource.configs.iter().map(|config| {
                (
                    config.name.to_string(),
                    config.config_operation,
                    config.value.as_ref().map(ToString::to_string),
                )
            });
            let dynamic = shard.view.borrow().dynamic.clone();
            let current = |setting: &str| live_value(&dynamic, &name, setting);
            let translated =
                admin::broker_alter_request(&name, configs, current, false, request.validate_only);
            let (error, message) = alter_broker_configs(shard, client, &name, translated).await;
            responses.push(
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(error)
                    .with_error_message(message),
            );
            continue;
        }
        if resource.resource_type == admin::RESOURCE_GROUP {
            let configs = resource.configs.iter().map(|config| {
                (
                    config.name.to_string(),
                    config.config_operation,
                    config.value.as_ref().map(ToString::to_string),
                )
            });
            let (error, message) =
                alter_group_configs(shard, client, &name, configs, false, request.validate_only)
                    .await;
            responses.push(
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(error)
                    .with_error_message(message),
            );
            continue;
        }
        // APPEND and SUBTRACT start from the topic's current value.
        let mut overrides = std::collections::BTreeMap::new();
        if resource
            .configs
            .iter()
            .any(|config| matches!(config.config_operation, 2 | 3))
        {
            for entry in topic_config(shard, &name).await.configs {
                if entry.is_override {
                    overrides.insert(entry.key, entry.value);
                }
            }
        }
        let configs = resource.configs.iter().map(|config| {
            (
                config.name.to_string(),
                config.config_operation,
                config.value.as_ref().map(ToString::to_string),
            )
        });
        let translated = if authorize::topic(shard, client, Operation::AlterConfigs, &name) {
            admin::incremental_alter_request(resource.resource_type, &name, configs, &overrides)
        } else {
            Err(admin::Refusal {
                error: errors::TOPIC_AUTHORIZATION_FAILED,
                message: "AlterConfigs on the topic is needed".into(),
            })
        };
        let (error, message) = alter(shard, translated, request.validate_only).await;
        responses.push(
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name)
                .with_error_code(error)
                .with_error_message(message),
        );
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// The legacy AlterConfigs: each resource's settings replace the topic's overrides (a
/// broker's settings set live, a group's configs).
async fn alter_configs(
    shard: &Rc<Shard>,
    client: &Client,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let mut responses = Vec::new();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        if resource.resource_type == admin::RESOURCE_BROKER {
            let configs = resource.configs.iter().map(|config| {
                (
                    config.name.to_string(),
                    0,
                    config.value.as_ref().map(ToString::to_string),
                )
            });
            let translated =
                admin::broker_alter_request(&name, configs, |_| None, true, request.validate_only);
            let (error, message) = alter_broker_configs(shard, client, &name, translated).await;
            responses.push(
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(error)
                    .with_error_message(message),
            );
            continue;
        }
        if resource.resource_type == admin::RESOURCE_GROUP {
            let configs = resource.configs.iter().map(|config| {
                (
                    config.name.to_string(),
                    0,
                    config.value.as_ref().map(ToString::to_string),
                )
            });
            let (error, message) =
                alter_group_configs(shard, client, &name, configs, true, request.validate_only)
                    .await;
            responses.push(
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name)
                    .with_error_code(error)
                    .with_error_message(message),
            );
            continue;
        }
        let current = topic_config(shard, &name).await;
        let configs = resource.configs.iter().map(|config| {
            (
                config.name.to_string(),
                config.value.as_ref().map(ToString::to_string),
            )
        });
        let translated = if !authorize::topic(shard, client, Operation::AlterConfigs, &name) {
            Err(admin::Refusal {
                error: errors::TOPIC_AUTHORIZATION_FAILED,
                message: "AlterConfigs on the topic is needed".into(),
            })
        } else if current.error == native::ErrorCode::None {
            admin::replacing_alter_request(resource.resource_type, &name, configs, &current)
        } else {
            Err(admin::Refusal {
                error: kafka_error(current.error),
                message: format!("the topic's settings could not be read: {}", current.error),
            })
        };
        let (error, message) = alter(shard, translated, request.validate_only).await;
        responses.push(
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name)
                .with_error_code(error)
                .with_error_message(message),
        );
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// Deletes groups without members, with their committed offsets (the native DeleteGroup:
/// NON_EMPTY_GROUP while a group has members, GROUP_ID_NOT_FOUND for one never seen); a share
/// group, with its stored share-partition state (`share_admin::delete_share_group`).
async fn delete_groups(
    shard: &Rc<Shard>,
    client: &Client,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for group in request.groups_names {
        let delete = native::DeleteGroupRequest {
            group: group.0.to_string(),
        };
        if !authorize::group(shard, client, Operation::Delete, &group.0) {
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(group)
                    .with_error_code(errors::GROUP_AUTHORIZATION_FAILED),
            );
            continue;
        }
        let error = match share_admin::delete_share_group(shard, &group.0).await {
            Some(error) => error,
            None => match native(shard, Request::DeleteGroup(delete)).await {
                Ok(Response::DeleteGroup(deleted)) => kafka_error(deleted.error),
                Ok(_) => errors::UNKNOWN_SERVER_ERROR,
                Err(code) => kafka_error(code),
            },
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group)
                .with_error_code(error),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// OffsetDelete: Delete on the group, Read on each topic (a topic refused is
/// TOPIC_AUTHORIZATION_FAILED, the rest go on), then the group's coordinator forgets the
/// offsets of partitions its members do not read.
async fn offset_delete(
    shard: &Rc<Shard>,
    client: &Client,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    use strata_kafka::kafka_protocol::messages::offset_delete_response::{
        OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
    };
    let group = request.group_id.0.to_string();
    if !authorize::group(shard, client, Operation::Delete, &group) {
        return OffsetDeleteResponse::default().with_error_code(errors::GROUP_AUTHORIZATION_FAILED);
    }
    let answer = |name: TopicName, partitions: Vec<(i32, i16)>| {
        OffsetDeleteResponseTopic::default()
            .with_name(name)
            .with_partitions(
                partitions
                    .into_iter()
                    .map(|(index, error)| {
                        OffsetDeleteResponsePartition::default()
                            .with_partition_index(index)
                            .with_error_code(error)
                    })
                    .collect(),
            )
    };
    let mut topics = Vec::new();
    let mut asked = Vec::new();
    for topic in request.topics {
        let indexes = topic.partitions.iter().map(|p| p.partition_index);
        if !authorize::topic(shard, client, Operation::Read, &topic.name.0) {
            let refused = indexes.map(|i| (i, errors::TOPIC_AUTHORIZATION_FAILED));
            topics.push(answer(topic.name, refused.collect()));
            continue;
        }
        asked.push(native::TopicPartitions {
            topic: topic.name.0.to_string(),
            partitions: indexes.filter_map(|i| u32::try_from(i).ok()).collect(),
        });
    }
    if !asked.is_empty() {
        let delete = native::DeleteOffsetsRequest {
            group,
            topics: asked,
        };
        let deleted = match native(shard, Request::DeleteOffsets(delete)).await {
            Ok(Response::DeleteOffsets(deleted)) => deleted,
            Ok(_) => {
                return OffsetDeleteResponse::default()
                    .with_error_code(errors::UNKNOWN_SERVER_ERROR);
            }
            Err(code) => return OffsetDeleteResponse::default().with_error_code(kafka_error(code)),
        };
        if deleted.error != native::ErrorCode::None {
            return OffsetDeleteResponse::default().with_error_code(kafka_error(deleted.error));
        }
        for topic in deleted.topics {
            let partitions = topic
                .partitions
                .into_iter()
                .map(|p| (p.partition as i32, kafka_error(p.error)))
                .collect();
            topics.push(answer(
                TopicName(StrBytes::from_string(topic.name)),
                partitions,
            ));
        }
    }
    OffsetDeleteResponse::default().with_topics(topics)
}

/// Answers a topic, config or group administration request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    let version = header.api_version;
    match request {
        KafkaRequest::CreateTopics(request) => {
            encoded(&header, create_topics(shard, client, request).await)
        }
        KafkaRequest::DeleteTopics(request) => encoded(
            &header,
            delete_topics(shard, client, version, request).await,
        ),
        KafkaRequest::CreatePartitions(request) => {
            encoded(&header, create_partitions(shard, client, request).await)
        }
        KafkaRequest::DescribeConfigs(request) => {
            encoded(&header, describe_configs(shard, client, request).await)
        }
        KafkaRequest::AlterConfigs(request) => {
            encoded(&header, alter_configs(shard, client, request).await)
        }
        KafkaRequest::IncrementalAlterConfigs(request) => encoded(
            &header,
            incremental_alter_configs(shard, client, request).await,
        ),
        KafkaRequest::ListGroups(request) => {
            encoded(&header, list_groups(shard, client, request).await)
        }
        KafkaRequest::DescribeGroups(request) => encoded(
            &header,
            describe_groups(shard, client, version, request).await,
        ),
        KafkaRequest::DeleteGroups(request) => {
            encoded(&header, delete_groups(shard, client, request).await)
        }
        KafkaRequest::OffsetDelete(request) => {
            encoded(&header, offset_delete(shard, client, request).await)
        }
        _ => unreachable!("only the administration APIs come here"),
    }
}
