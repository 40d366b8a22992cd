//! Kafka's administration APIs (what `kafka-topics.sh`, AdminClient and the tools built on it
//! send) as native requests: CreateTopics, DeleteTopics, CreatePartitions, ListGroups,
//! DescribeGroups. Each topic or group of a Kafka request is one native request; the answers
//! are gathered back into one Kafka response.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest,
    GroupId, ListGroupsResponse, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use strata_wire::protocol as native;

use crate::errors::{self, kafka_error};
use crate::text;

/// The broker's defaults for a topic a Kafka client creates without naming them (Kafka's
/// `num.partitions` and `default.replication.factor`): CreateTopics with -1 (KIP-464), and
/// topics created on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicDefaults {
    pub partitions: u32,
    pub replication_factor: u16,
}

impl Default for TopicDefaults {
    /// Kafka's own defaults.
    fn default() -> TopicDefaults {
        TopicDefaults {
            partitions: 1,
            replication_factor: 1,
        }
    }
}

/// Config resource types (Kafka's ConfigResource.Type, in DescribeConfigs and AlterConfigs): a
/// topic's settings, a broker's, and a consumer or share group's (KIP-848, KIP-932; not the
/// ACL resource type of a group, 3).
pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
pub const RESOURCE_GROUP: i8 = 32;
/// Where a config value comes from (Kafka's ConfigSource): a topic's override, a broker
/// setting set live for that broker or for every broker, one given at start, or the default.
pub const SOURCE_TOPIC_OVERRIDE: i8 = 1;
pub const SOURCE_DYNAMIC_BROKER: i8 = 2;
pub const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub const SOURCE_STATIC_BROKER: i8 = 4;
pub const SOURCE_DEFAULT: i8 = 5;
/// A config set on a group (Kafka's DYNAMIC_GROUP_CONFIG).
pub const SOURCE_DYNAMIC_GROUP: i8 = 8;
/// IncrementalAlterConfigs operations (APPEND and SUBTRACT, for list values, are refused).
const OPERATION_SET: i8 = 0;
const OPERATION_DELETE: i8 = 1;
const OPERATION_APPEND: i8 = 2;
const OPERATION_SUBTRACT: i8 = 3;

/// Kafka's list-valued topic settings that Strata serves, with the value every topic has:
/// only these take APPEND and SUBTRACT. Every topic's cleanup policy is `delete` (compaction
/// is refused), so a list operation starts from it.
/// (Their defaults, for a topic that does not set them.)
const LIST_CONFIGS: &[(&str, &str)] = &[(CLEANUP_POLICY, CLEANUP_DELETE)];

/// The version of ConsumerProtocolAssignment that DescribeGroups answers carry.
const ASSIGNMENT_VERSION: i16 = 0;

/// A topic the listener answers itself, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: i16,
    pub message: String,
}

fn refuse(error: i16, message: &str) -> Refusal {
    Refusal {
        error,
        message: message.to_string(),
    }
}

/// Kafka's name for a topic setting Strata names otherwise.
const KAFKA_UNCLEAN: &str = "unclean.leader.election.enable";
const STRATA_UNCLEAN: &str = "unclean.leader.election";
/// Kafka's cleanup policy (`delete`, `compact`, or both), a list-valued setting.
const CLEANUP_POLICY: &str = "cleanup.policy";
const CLEANUP_DELETE: &str = "delete";

/// Kafka topic settings whose every valid value is what Strata does anyway (or that change
/// nothing Strata has), with the value they are described with. Kafka Streams puts several on
/// every internal topic, so CreateTopics must take them: they are accepted (when valid, as
/// Kafka checks them) and dropped, and DescribeConfigs shows them at these values.
const WHAT_STRATA_DOES: &[(&str, &str)] = &[
    // Kafka 4 reads and writes record batches of magic 2 only: nothing is converted down.
    ("message.downconversion.enable", "true"),
    // Segments are unlinked once no reader holds them: there is no delay to set.
    ("file.delete.delay.ms", "60000"),
    // Offset indexes are sized by their segment, not preallocated to a size.
    ("segment.index.bytes", "10485760"),
    // Segments roll at `segment.ms` exactly.
    ("segment.jitter.ms", "0"),
];

/// Whether `value` is one Kafka takes for the setting `key` of [`WHAT_STRATA_DOES`], and one
/// Strata does.
fn does_already(key: &str, value: &str) -> Result<(), Refusal> {
    let valid = match key {
        "message.downconversion.enable" => value == "true" || value == "false",
        "segment.index.bytes" => value.parse::<i32>().is_ok_and(|bytes| bytes >= 4),
        _ => value.parse::<i64>().is_ok_and(|ms| ms >= 0),
    };
    if valid {
        Ok(())
    } else {
        Err(refuse(
            errors::INVALID_CONFIG,
            &format!("{key}={value}: not a value Kafka takes"),
        ))
    }
}

/// A Kafka topic setting as Strata's: Kafka's names mapped, the settings of
/// [`WHAT_STRATA_DOES`] (what every Strata topic does) dropped. `None`: nothing to set.
pub fn strata_config(key: &str, value: &str) -> Result<Option<native::ConfigEntry>, Refusal> {
    let entry = |key: &str| {
        Ok(Some(native::ConfigEntry {
            key: key.to_string(),
            value: value.to_string(),
        }))
    };
    match key {
        _ if WHAT_STRATA_DOES.iter().any(|(known, _)| *known == key) => {
            does_already(key, value).map(|()| None)
        }
        KAFKA_UNCLEAN => entry(STRATA_UNCLEAN),
        _ => entry(key),
    }
}

/// One native CreateTopic per topic, or why the topic is refused on sight. A topic with a
/// replica assignment takes its partition count and replication factor from it (Kafka
/// requires both to be -1 then); the broker checks the brokers it names.
pub fn create_topics_requests(
    request: &CreateTopicsRequest,
    defaults: TopicDefaults,
) -> Vec<(String, Result<native::CreateTopicRequest, Refusal>)> {
    request
        .topics
        .iter()
        .map(|topic| {
            (
                topic.name.0.to_string(),
                create_topic_request(topic, defaults),
            )
        })
        .collect()
}

fn create_topic_request(
    topic: &CreatableTopic,
    defaults: TopicDefaults,
) -> Result<native::CreateTopicRequest, Refusal> {
    let configs = topic
        .configs
        .iter()
        .filter_map(|config| {
            let value = config.value.as_ref()?;
            strata_config(&config.name, value).transpose()
        })
        .collect::<Result<Vec<native::ConfigEntry>, Refusal>>()?;
    let (partitions, replication_factor, replica_assignment) = if topic.assignments.is_empty() {
        let partitions = match topic.num_partitions {
            -1 => defaults.partitions,
            count => u32::try_from(count)
                .ok()
                .filter(|&count| count > 0)
                .ok_or_else(|| refuse(errors::INVALID_PARTITIONS, "partitions must be positive"))?,
        };
        let replication_factor = match topic.replication_factor {
            -1 => defaults.replication_factor,
            factor => u16::try_from(factor)
                .ok()
                .filter(|&factor| factor > 0)
                .ok_or_else(|| {
                    refuse(
                        errors::INVALID_REPLICATION_FACTOR,
                        "the replication factor must be positive",
                    )
                })?,
        };
        (partitions, replication_factor, Vec::new())
    } else {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err(refuse(
                errors::INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
            ));
        }
        let assignment = replica_assignment(&topic.assignments)?;
        let replication_factor = u16::try_from(assignment[0].len())
            .map_err(|_| refuse(errors::INVALID_REPLICA_ASSIGNMENT, "too many replicas"))?;
        (assignment.len() as u32, replication_factor, assignment)
    };
    Ok(native::CreateTopicRequest {
        name: topic.name.0.to_string(),
        partitions,
        replication_factor,
        configs,
        replica_assignment: native::Appended(replica_assignment),
    })
}

/// A CreateTopics assignment in partition order: it must name partitions 0, 1, … each once.
fn replica_assignment(
    assignments: &[CreatableReplicaAssignment],
) -> Result<Vec<Vec<i32>>, Refusal> {
    let mut by_partition: Vec<Option<Vec<i32>>> = vec![None; assignments.len()];
    for assignment in assignments {
        let slot = usize::try_from(assignment.partition_index)
            .ok()
            .and_then(|index| by_partition.get_mut(index))
            .filter(|slot| slot.is_none())
            .ok_or_else(|| {
                refuse(
                    errors::INVALID_REPLICA_ASSIGNMENT,
                    &format!(
                        "partitions must be numbered 0 to {} each once; {} is not",
                        assignments.len() - 1,
                        assignment.partition_index
                    ),
                )
            })?;
        *slot = Some(assignment.broker_ids.iter().map(|id| id.0).collect());
    }
    Ok(by_partition
        .into_iter()
        .map(|replicas| replicas.expect("every slot filled"))
        .collect())
}

/// A CreateTopics result per topic: its number of partitions and replication factor on
/// success (what versions 5 and up report back).
pub fn create_topic_result(
    name: &str,
    created: Result<(native::CreateTopicResponse, &native::CreateTopicRequest), Refusal>,
) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(TopicName(text(name)));
    match created {
        Ok((response, request)) if response.error == native::ErrorCode::None => result
            .with_num_partitions(request.partitions as i32)
            .with_replication_factor(request.replication_factor as i16),
        Ok((response, _)) => result
            .with_error_code(kafka_error(response.error))
            .with_error_message(Some(text(&response.message)))
            .with_num_partitions(-1)
            .with_replication_factor(-1),
        Err(refusal) => result
            .with_error_code(refusal.error)
            .with_error_message(Some(text(&refusal.message)))
            .with_num_partitions(-1)
            .with_replication_factor(-1),
    }
}

/// The topics named (versions 6 and up may name them by id only: those are refused, Strata
/// topics have no ids).
pub fn delete_topics_names(request: &DeleteTopicsRequest, version: i16) -> Vec<Option<String>> {
    if version >= 6 {
        request
            .topics
            .iter()
            .map(|topic| topic.name.as_ref().map(|name| name.0.to_string()))
            .collect()
    } else {
        request
            .topic_names
            .iter()
            .map(|name| Some(name.0.to_string()))
            .collect()
    }
}

pub fn delete_topic_result(name: Option<String>, error: i16) -> DeletableTopicResult {
    DeletableTopicResult::default()
        .with_name(name.map(|name| TopicName(text(&name))))
        .with_error_code(error)
}

/// One native CreatePartitions per topic (the new total count), or why not.
pub fn create_partitions_requests(
    request: &CreatePartitionsRequest,
) -> Vec<(String, Result<native::CreatePartitionsRequest, Refusal>)> {
    request
        .topics
        .iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let assignment: Vec<Vec<i32>> = topic
                .assignments
                .iter()
                .flatten()
                .map(|assignment| assignment.broker_ids.iter().map(|id| id.0).collect())
                .collect();
            let native = u32::try_from(topic.count)
                .map(|partitions| native::CreatePartitionsRequest {
                    topic: name.clone(),
                    partitions,
                    replica_assignment: native::Appended(assignment),
                })
                .map_err(|_| refuse(errors::INVALID_PARTITIONS, "partitions must be positive"));
            (name, native)
        })
        .collect()
}

pub fn create_partitions_result(
    name: &str,
    created: Result<native::CreatePartitionsResponse, Refusal>,
) -> CreatePartitionsTopicResult {
    let (error, message) = match created {
        Ok(response) if response.error == native::ErrorCode::None => (errors::NONE, None),
        Ok(response) => (kafka_error(response.error), Some(response.message)),
        Err(refusal) => (refusal.error, Some(refusal.message)),
    };
    CreatePartitionsTopicResult::default()
        .with_name(TopicName(text(name)))
        .with_error_code(error)
        .with_error_message(message.map(|message| text(&message)))
}

/// A group's type as ListGroups (v5) reports it and filters by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupType {
    /// Run by Kafka's classic protocol (JoinGroup, SyncGroup).
    Classic,
    /// Server-side assignment: Strata's own groups and Kafka's KIP-848 consumers.
    Consumer,
    /// A share group (KIP-932).
    Share,
}

impl GroupType {
    /// Kafka's name for it, as ListGroups v5 answers it.
    pub fn name(self) -> &'static str {
        match self {
            GroupType::Classic => "classic",
            GroupType::Consumer => "consumer",
            GroupType::Share => "share",
        }
    }

    /// The protocol type a listing carries: Kafka's `share` for share groups; `consumer` for
    /// the others (Strata's store keeps no other protocol type).
    fn protocol_type(self) -> &'static str {
        match self {
            GroupType::Share => "share",
            GroupType::Classic | GroupType::Consumer => "consumer",
        }
    }
}

/// One group of a ListGroups answer: its id, its type and its state as its coordinator
/// describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedKafkaGroup {
    pub group: String,
    pub group_type: GroupType,
    pub state: String,
}

/// Groups as Kafka's ListGroups lists them, each with its state (v4) and type (v5). When
/// `states_filter` names any states, only groups in one of them are listed; when
/// `types_filter` names any types, only groups of one of them (both compared without regard to
/// case, as Kafka does: Java's Admin sends `Share`, `Consumer`, `Classic`).
pub fn list_groups_response(
    error: native::ErrorCode,
    groups: Vec<ListedKafkaGroup>,
    states_filter: &[StrBytes],
    types_filter: &[StrBytes],
) -> ListGroupsResponse {
    let wanted = |filter: &[StrBytes], value: &str| {
        filter.is_empty()
            || filter
                .iter()
                .any(|wanted| wanted.trim().eq_ignore_ascii_case(value))
    };
    ListGroupsResponse::default()
        .with_error_code(kafka_error(error))
        .with_groups(
            groups
                .into_iter()
                .filter(|listed| {
                    wanted(states_filter, &listed.state)
                        && wanted(types_filter, listed.group_type.name())
                })
                .map(|listed| {
                    ListedGroup::default()
                        .with_group_id(GroupId(text(&listed.group)))
                        .with_protocol_type(text(listed.group_type.protocol_type()))
                        .with_group_state(text(&listed.state))
                        .with_group_type(text(listed.group_type.name()))
                })
                .collect(),
        )
}

/// A group as DescribeGroups describes it: each member's partitions as a consumer
/// assignment (ConsumerProtocolAssignment version 0, what Kafka's tools decode).
pub fn described_group(native: native::DescribeGroupResponse) -> DescribedGroup {
    let members = native
        .members
        .into_iter()
        .map(|member| {
            DescribedGroupMember::default()
                .with_member_id(text(&member.member_id))
                .with_group_instance_id(member.instance_id.map(|id| text(&id)))
                .with_client_id(text(&member.client_id))
                .with_member_assignment(consumer_assignment(&member.assignment))
        })
        .collect();
    DescribedGroup::default()
        .with_error_code(kafka_error(native.error))
        .with_group_id(GroupId(text(&native.group)))
        .with_group_state(text(&native.state))
        .with_protocol_type(text("consumer"))
        .with_protocol_data(text(&native.assignor))
        .with_members(members)
}

/// A group DescribeGroups does not describe because it is of another type (a share group), as
/// Kafka answers it: Dead, with no members; from version 6 (KIP-1043), GROUP_ID_NOT_FOUND with
/// a message naming why.
pub fn other_type_of_group(group: &str, version: i16) -> DescribedGroup {
    dead_group(
        group,
        version,
        &format!("Group {group} is not a classic group."),
    )
}

/// A group DescribeGroups finds nothing of: Dead, with no members; from version 6 (KIP-1043),
/// GROUP_ID_NOT_FOUND too.
pub fn missing_group(group: &str, version: i16) -> DescribedGroup {
    dead_group(group, version, &format!("Group {group} not found."))
}

/// Dead, with no members; from version 6, GROUP_ID_NOT_FOUND saying `why`.
fn dead_group(group: &str, version: i16, why: &str) -> DescribedGroup {
    let described = DescribedGroup::default()
        .with_group_id(GroupId(text(group)))
        .with_group_state(text("Dead"));
    if version < 6 {
        return described;
    }
    described
        .with_error_code(errors::GROUP_ID_NOT_FOUND)
        .with_error_message(Some(text(why)))
}

fn consumer_assignment(partitions: &[native::TopicPartitions]) -> Bytes {
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(
        partitions
            .iter()
            .map(|topic| {
                TopicPartition::default()
                    .with_topic(TopicName(text(&topic.topic)))
                    .with_partitions(topic.partitions.iter().map(|&p| p as i32).collect())
            })
            .collect(),
    );
    let mut out = BytesMut::new();
    out.put_i16(ASSIGNMENT_VERSION);
    assignment
        .encode(&mut out, ASSIGNMENT_VERSION)
        .expect("an assignment encodes");
    out.freeze()
}

/// A broker's settings as DescribeConfigs answers them (only `keys` when given): those that
/// cannot change live are read-only, and each says where its value comes from.
pub fn describe_broker_configs_result(
    broker: &str,
    described: native::DescribeBrokerConfigsResponse,
    keys: Option<&[String]>,
) -> DescribeConfigsResult {
    let result = DescribeConfigsResult::default()
        .with_resource_type(RESOURCE_BROKER)
        .with_resource_name(text(broker));
    if described.error != native::ErrorCode::None {
        return result
            .with_error_code(kafka_error(described.error))
            .with_error_message(Some(text(&described.message)));
    }
    result.with_configs(
        described
            .entries
            .into_iter()
            .filter(|entry| keys.is_none_or(|keys| keys.contains(&entry.name)))
            .map(|entry| {
                DescribeConfigsResourceResult::default()
                    .with_name(text(&entry.name))
                    .with_value(entry.value.as_deref().map(text))
                    .with_read_only(!entry.live)
                    .with_config_source(match entry.source {
                        3 => SOURCE_DYNAMIC_BROKER,
                        2 => SOURCE_DYNAMIC_DEFAULT_BROKER,
                        1 => SOURCE_STATIC_BROKER,
                        _ => SOURCE_DEFAULT,
                    })
            })
            .collect(),
    )
}

/// An APPEND or SUBTRACT of `value` (comma-separated) to or from `current`, a list-valued
/// setting's value (`None`: the setting is not a list, refused with Kafka's error).
fn list_operation(
    key: &str,
    operation: i8,
    value: &str,
    current: Option<&str>,
) -> Result<String, Refusal> {
    let Some(current) = current else {
        let verb = if operation == OPERATION_APPEND {
            "append"
        } else {
            "subtract"
        };
        return Err(refuse(
            errors::INVALID_CONFIG,
            &format!("Config value {verb} is not allowed for config key: {key}"),
        ));
    };
    let given: Vec<&str> = value.split(',').map(str::trim).collect();
    let mut values: Vec<&str> = current.split(',').map(str::trim).collect();
    if operation == OPERATION_APPEND {
        for value in given {
            if !values.contains(&value) {
                values.push(value);
            }
        }
    } else {
        values.retain(|value| !given.contains(value));
    }
    if values.is_empty() {
        return Err(refuse(
            errors::INVALID_CONFIG,
            &format!("{key} cannot be left empty"),
        ));
    }
    Ok(values.join(","))
}

/// The broker's name of the list-valued topic default, and its value when none is set.
const BROKER_CLEANUP_POLICY: (&str, &str) = ("log.cleanup.policy", CLEANUP_DELETE);

/// A BROKER resource's changes as a native alter of the settings set live: the resource
/// named "" is every broker's, a broker id that broker's. APPEND and SUBTRACT work on the one
/// list, `log.cleanup.policy`, from its value set live (`current`) or its default; with
/// `replace` (the legacy AlterConfigs), the settings given become the whole of them.
pub fn broker_alter_request(
    broker: &str,
    configs: impl IntoIterator<Item = (String, i8, Option<String>)>,
    current: impl Fn(&str) -> Option<String>,
    replace: bool,
    validate_only: bool,
) -> Result<native::AlterBrokerConfigsRequest, Refusal> {
    let broker = if broker.is_empty() {
        None
    } else {
        Some(
            broker
                .parse::<i32>()
                .ok()
                .filter(|id| *id >= 0)
                .ok_or_else(|| {
                    refuse(
                        errors::INVALID_REQUEST,
                        &format!("{broker:?} is not a broker id (or \"\" for every broker)"),
                    )
                })?,
        )
    };
    let mut alter = native::AlterBrokerConfigsRequest {
        broker,
        set: Vec::new(),
        delete: Vec::new(),
        replace,
        validate_only,
    };
    for (key, operation, value) in configs {
        match (operation, value) {
            (OPERATION_SET, Some(value)) => alter.set.push(native::ConfigEntry { key, value }),
            (OPERATION_DELETE, _) => alter.delete.push(key),
            (OPERATION_SET, None) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: a value is needed"),
                ));
            }
            (operation @ (OPERATION_APPEND | OPERATION_SUBTRACT), Some(value)) => {
                let (list, default) = BROKER_CLEANUP_POLICY;
                let base = (key == list).then(|| current(&key).unwrap_or(default.to_string()));
                let value = list_operation(&key, operation, &value, base.as_deref())?;
                alter.set.push(native::ConfigEntry { key, value });
            }
            (OPERATION_APPEND | OPERATION_SUBTRACT, None) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: APPEND and SUBTRACT need a value"),
                ));
            }
            (operation, _) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("unknown config operation {operation}"),
                ));
            }
        }
    }
    Ok(alter)
}

/// One config of a group as DescribeConfigs answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfigEntry<'a> {
    pub name: &'a str,
    pub value: &'a str,
    /// Set on the group (DYNAMIC_GROUP_CONFIG); otherwise the default (DEFAULT_CONFIG).
    pub set: bool,
    /// Sent only when the request asks for documentation.
    pub documentation: &'a str,
}

/// A group's configs as DescribeConfigs answers them (only `keys` when given): every one a
/// group may set, each changeable, with where its value comes from.
pub fn describe_group_configs_result<'a>(
    group: &str,
    entries: impl IntoIterator<Item = GroupConfigEntry<'a>>,
    keys: Option<&[String]>,
    include_documentation: bool,
) -> DescribeConfigsResult {
    let configs = entries
        .into_iter()
        .filter(|entry| keys.is_none_or(|keys| keys.iter().any(|key| key == entry.name)))
        .map(|entry| {
            DescribeConfigsResourceResult::default()
                .with_name(text(entry.name))
                .with_value(Some(text(entry.value)))
                .with_read_only(false)
                .with_config_source(if entry.set {
                    SOURCE_DYNAMIC_GROUP
                } else {
                    SOURCE_DEFAULT
                })
                .with_documentation(include_documentation.then(|| text(entry.documentation)))
        })
        .collect();
    DescribeConfigsResult::default()
        .with_resource_type(RESOURCE_GROUP)
        .with_resource_name(text(group))
        .with_configs(configs)
}

/// A GROUP resource's changes: the configs to set, and those to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupConfigChange {
    pub set: Vec<(String, String)>,
    pub delete: Vec<String>,
}

/// A GROUP resource's changes (name, operation, value) as the configs to set and delete. No
/// group config is a list: APPEND and SUBTRACT are refused with Kafka's error. The legacy
/// AlterConfigs sends each config as a SET.
pub fn group_alter_request(
    group: &str,
    configs: impl IntoIterator<Item = (String, i8, Option<String>)>,
) -> Result<GroupConfigChange, Refusal> {
    if group.is_empty() {
        return Err(refuse(
            errors::INVALID_REQUEST,
            "a group config resource needs a group name",
        ));
    }
    let mut change = GroupConfigChange::default();
    for (key, operation, value) in configs {
        // As Kafka: one operation per config, or which one wins would be a guess.
        if change.set.iter().any(|(set, _)| *set == key) || change.delete.contains(&key) {
            return Err(refuse(
                errors::INVALID_REQUEST,
                &format!("{key} is named twice"),
            ));
        }
        match (operation, value) {
            (OPERATION_SET, Some(value)) => change.set.push((key, value)),
            (OPERATION_DELETE, _) => change.delete.push(key),
            (operation @ (OPERATION_APPEND | OPERATION_SUBTRACT), Some(value)) => {
                // No group config is a list: this refuses, with Kafka's error.
                list_operation(&key, operation, &value, None)?;
            }
            (OPERATION_SET | OPERATION_APPEND | OPERATION_SUBTRACT, None) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: SET, APPEND and SUBTRACT need a value"),
                ));
            }
            (operation, _) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: unknown config operation {operation}"),
                ));
            }
        }
    }
    Ok(change)
}

/// A topic's settings as DescribeConfigs reports them (`keys`: only those, when asked). A
/// setting the topic does not override has the source `default_source` gives its (Strata)
/// name: a broker default set live, or the default.
pub fn describe_configs_result(
    topic: &str,
    native: native::DescribeTopicConfigResponse,
    keys: Option<&[String]>,
    default_source: impl Fn(&str) -> i8,
) -> DescribeConfigsResult {
    let result = DescribeConfigsResult::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(text(topic))
        .with_error_code(kafka_error(native.error));
    // Under Kafka's names, with the settings whose value is what Strata does.
    let fixed = WHAT_STRATA_DOES
        .iter()
        .copied()
        .map(|(key, value)| native::TopicConfigEntry {
            key: key.to_string(),
            value: value.to_string(),
            is_override: false,
        })
        .map(|config| (config, SOURCE_DEFAULT));
    let configs = native.configs.into_iter().map(|mut config| {
        let source = if config.is_override {
            SOURCE_TOPIC_OVERRIDE
        } else {
            default_source(&config.key)
        };
        if config.key == STRATA_UNCLEAN {
            config.key = KAFKA_UNCLEAN.to_string();
        }
        (config, source)
    });
    result.with_configs(
        fixed
            .chain(configs)
            .filter(|(config, _)| keys.is_none_or(|keys| keys.contains(&config.key)))
            .map(|(config, source)| {
                DescribeConfigsResourceResult::default()
                    .with_name(text(&config.key))
                    .with_value(Some(text(&config.value)))
                    .with_config_source(source)
            })
            .collect(),
    )
}

/// An IncrementalAlterConfigs resource as a native alter. SET and DELETE change a setting;
/// APPEND and SUBTRACT add values to, or take them from, a list-valued setting
/// ([`LIST_CONFIGS`]) and are refused for any other, with Kafka's error. `overrides` are the
/// topic's current settings, which APPEND and SUBTRACT start from.
pub fn incremental_alter_request(
    resource_type: i8,
    topic: &str,
    configs: impl IntoIterator<Item = (String, i8, Option<String>)>,
    overrides: &std::collections::BTreeMap<String, String>,
) -> Result<native::AlterTopicConfigRequest, Refusal> {
    if resource_type != RESOURCE_TOPIC {
        return Err(refuse(
            errors::INVALID_REQUEST,
            "only topic configs are served",
        ));
    }
    let mut alter = native::AlterTopicConfigRequest {
        topic: topic.to_string(),
        set: Vec::new(),
        delete: Vec::new(),
    };
    for (key, operation, value) in configs {
        match (operation, value) {
            (OPERATION_SET, Some(value)) => alter.set.extend(strata_config(&key, &value)?),
            (OPERATION_DELETE, _) if WHAT_STRATA_DOES.iter().any(|(k, _)| *k == key) => {}
            (OPERATION_DELETE, _) if key == KAFKA_UNCLEAN => {
                alter.delete.push(STRATA_UNCLEAN.to_string());
            }
            (OPERATION_DELETE, _) => alter.delete.push(key),
            (operation @ (OPERATION_APPEND | OPERATION_SUBTRACT), Some(value)) => {
                let list = LIST_CONFIGS.iter().find(|(list, _)| *list == key);
                let current =
                    list.map(|(_, default)| overrides.get(&key).map_or(*default, String::as_str));
                let values = list_operation(&key, operation, &value, current)?;
                alter.set.extend(strata_config(&key, &values)?);
            }
            (OPERATION_SET | OPERATION_APPEND | OPERATION_SUBTRACT, None) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: SET, APPEND and SUBTRACT need a value"),
                ));
            }
            (operation, _) => {
                return Err(refuse(
                    errors::INVALID_REQUEST,
                    &format!("{key}: unknown config operation {operation}"),
                ));
            }
        }
    }
    Ok(alter)
}

/// A (legacy) AlterConfigs resource replaces the topic's overrides: the settings named are
/// set, every other current override is removed.
pub fn replacing_alter_request(
    resource_type: i8,
    topic: &str,
    configs: impl IntoIterator<Item = (String, Option<String>)>,
    current: &native::DescribeTopicConfigResponse,
) -> Result<native::AlterTopicConfigRequest, Refusal> {
    let set: Vec<(String, i8, Option<String>)> = configs
        .into_iter()
        .map(|(key, value)| (key, OPERATION_SET, value))
        .collect();
    let mut alter = incremental_alter_request(
        resource_type,
        topic,
        set,
        &std::collections::BTreeMap::new(),
    )?;
    alter.delete = current
        .configs
        .iter()
        .filter(|config| config.is_override && !alter.set.iter().any(|set| set.key == config.key))
        .map(|config| config.key.clone())
        .collect();
    Ok(alter)
}

/// The error code and message of one altered resource.
pub fn alter_outcome(
    altered: Result<native::AlterTopicConfigResponse, Refusal>,
) -> (i16, Option<StrBytes>) {
    match altered {
        Ok(response) if response.error == native::ErrorCode::None => (errors::NONE, None),
        Ok(response) => (kafka_error(response.error), Some(text(&response.message))),
        Err(refusal) => (refusal.error, Some(text(&refusal.message))),
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
    use kafka_protocol::protocol::Decodable;

    use super::*;

    #[test]
    fn listed_groups_carry_their_states_and_types_and_filters_keep_those_named() {
        let groups: Vec<ListedKafkaGroup> = [
            ("idle", GroupType::Consumer, "Empty"),
            ("busy", GroupType::Classic, "Stable"),
            ("moving", GroupType::Classic, "PreparingRebalance"),
            ("queue", GroupType::Share, "Stable"),
        ]
        .map(|(group, group_type, state)| ListedKafkaGroup {
            group: group.to_string(),
            group_type,
            state: state.to_string(),
        })
        .to_vec();
        let listed = |states: &[&str], types: &[&str]| {
            let states: Vec<StrBytes> = states.iter().map(|state| text(state)).collect();
            let types: Vec<StrBytes> = types.iter().map(|kind| text(kind)).collect();
            list_groups_response(native::ErrorCode::None, groups.clone(), &states, &types)
                .groups
                .into_iter()
                .map(|group| {
                    (
                        group.group_id.to_string(),
                        group.group_state.to_string(),
                        group.group_type.to_string(),
                        group.protocol_type.to_string(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let row = |group: &str, state: &str, kind: &str, protocol: &str| {
            (
                group.to_string(),
                state.to_string(),
                kind.to_string(),
                protocol.to_string(),
            )
        };
        assert_eq!(
            listed(&[], &[]),
            [
                row("idle", "Empty", "consumer", "consumer"),
                row("busy", "Stable", "classic", "consumer"),
                row("moving", "PreparingRebalance", "classic", "consumer"),
                row("queue", "Stable", "share", "share"),
            ]
        );
        assert_eq!(
            listed(&["stable", "EMPTY"], &[]),
            [
                row("idle", "Empty", "consumer", "consumer"),
                row("busy", "Stable", "classic", "consumer"),
                row("queue", "Stable", "share", "share"),
            ]
        );
        assert!(listed(&["Dead"], &[]).is_empty());
        assert_eq!(
            listed(&[], &["Share"]),
            [row("queue", "Stable", "share", "share")]
        );
        assert_eq!(
            listed(&["Stable"], &["Classic", "Consumer"]),
            [row("busy", "Stable", "classic", "consumer")]
        );
    }

    /// A replica assignment gives the partition count and replication factor, in partition
    /// order; one that names partitions out of order, twice, or beside a count is refused.
    #[test]
    fn replica_assignments_become_native_creates_in_partition_order() {
        let assign = |partition: i32, brokers: &[i32]| {
            CreatableReplicaAssignment::default()
                .with_partition_index(partition)
                .with_broker_ids(brokers.iter().map(|id| BrokerId(*id)).collect())
        };
        let topic = |assignments: Vec<CreatableReplicaAssignment>, count: i32| {
            CreatableTopic::default()
                .with_name(TopicName(text("placed")))
                .with_num_partitions(count)
                .with_replication_factor(-1)
                .with_assignments(assignments)
        };
        let create = |topic: CreatableTopic| create_topic_request(&topic, TopicDefaults::default());
        let native = create(topic(vec![assign(1, &[3, 1]), assign(0, &[1, 2])], -1)).unwrap();
        assert_eq!((native.partitions, native.replication_factor), (2, 2));
        assert_eq!(native.replica_assignment.0, [vec![1, 2], vec![3, 1]]);
        for assignments in [
            vec![assign(0, &[1]), assign(0, &[2])],
            vec![assign(1, &[1])],
            vec![assign(-1, &[1])],
        ] {
            assert_eq!(
                create(topic(assignments, -1)).unwrap_err().error,
                errors::INVALID_REPLICA_ASSIGNMENT
            );
        }
        assert_eq!(
            create(topic(vec![assign(0, &[1])], 1)).unwrap_err().error,
            errors::INVALID_REQUEST
        );
    }

    #[test]
    fn topics_with_defaults_become_native_creates_and_unsupported_options_are_refused() {
        let topic = |name: &str| CreatableTopic::default().with_name(TopicName(text(name)));
        let request = CreateTopicsRequest::default().with_topics(vec![
            topic("defaults")
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_configs(vec![
                    CreatableTopicConfig::default()
                        .with_name(text("retention.ms"))
                        .with_value(Some(text("60000"))),
                ]),
            topic("zero")
                .with_num_partitions(0)
                .with_replication_factor(1),
            topic("both")
                .with_num_partitions(1)
                .with_replication_factor(1)
                .with_assignments(vec![Default::default()]),
        ]);
        let broker = TopicDefaults {
            partitions: 4,
            replication_factor: 3,
        };
        let translated = create_topics_requests(&request, broker);
        let defaults = translated[0].1.as_ref().unwrap();
        assert_eq!((defaults.partitions, defaults.replication_factor), (4, 3));
        assert_eq!(defaults.configs[0].key, "retention.ms");
        assert_eq!(
            translated[1].1.as_ref().unwrap_err().error,
            errors::INVALID_PARTITIONS
        );
        assert_eq!(
            translated[2].1.as_ref().unwrap_err().error,
            errors::INVALID_REQUEST
        );
    }

    #[test]
    fn config_changes_become_native_alters_and_a_replacing_alter_drops_other_overrides() {
        let none = std::collections::BTreeMap::new();
        let incremental = incremental_alter_request(
            RESOURCE_TOPIC,
            "t",
            [
                (
                    "retention.ms".to_string(),
                    OPERATION_SET,
                    Some("1000".to_string()),
                ),
                ("flush".to_string(), OPERATION_DELETE, None),
            ],
            &none,
        )
        .unwrap();
        assert_eq!(incremental.set[0].key, "retention.ms");
        assert_eq!(incremental.delete, ["flush"]);
        let no_value =
            incremental_alter_request(RESOURCE_TOPIC, "t", [("x".into(), 2, None)], &none);
        assert_eq!(no_value.unwrap_err().error, errors::INVALID_REQUEST);
        let broker = incremental_alter_request(4, "1", [], &none);
        assert_eq!(broker.unwrap_err().error, errors::INVALID_REQUEST);
        let nothing = |_: &str| None;
        let every = broker_alter_request(
            "",
            [
                ("num.partitions".into(), OPERATION_SET, Some("3".into())),
                ("log.retention.ms".into(), OPERATION_DELETE, None),
                (
                    "log.cleanup.policy".into(),
                    OPERATION_APPEND,
                    Some("compact".into()),
                ),
            ],
            nothing,
            false,
            true,
        )
        .unwrap();
        assert_eq!((every.broker, every.validate_only), (None, true));
        assert_eq!(every.set[0].key, "num.partitions");
        assert_eq!(
            every.set[1].value, "delete,compact",
            "appended to the default"
        );
        assert_eq!(every.delete, ["log.retention.ms"]);
        let compacting = |_: &str| Some("compact,delete".to_string());
        let subtracted = broker_alter_request(
            "1",
            [(
                "log.cleanup.policy".into(),
                OPERATION_SUBTRACT,
                Some("delete".into()),
            )],
            compacting,
            false,
            false,
        )
        .unwrap();
        assert_eq!(
            subtracted.set[0].value, "compact",
            "taken from the value set live"
        );
        assert_eq!(
            broker_alter_request("2", [], nothing, true, false)
                .unwrap()
                .broker,
            Some(2)
        );
        assert!(broker_alter_request("-1", [], nothing, false, false).is_err());
        let list = broker_alter_request(
            "",
            [("num.partitions".into(), OPERATION_APPEND, Some("1".into()))],
            nothing,
            false,
            false,
        );
        assert_eq!(list.unwrap_err().error, errors::INVALID_CONFIG);

        let entry = |key: &str, is_override| native::TopicConfigEntry {
            key: key.into(),
            value: "v".into(),
            is_override,
        };
        let current = native::DescribeTopicConfigResponse {
            error: native::ErrorCode::None,
            configs: vec![
                entry("retention.ms", true),
                entry("segment.bytes", true),
                entry("flush", false),
            ],
        };
        let replacing = replacing_alter_request(
            RESOURCE_TOPIC,
            "t",
            [("retention.ms".to_string(), Some("5".to_string()))],
            &current,
        )
        .unwrap();
        assert_eq!(replacing.set[0].value, "5");
        assert_eq!(
            replacing.delete,
            ["segment.bytes"],
            "only other overrides go"
        );
        let described =
            describe_configs_result("t", current.clone(), Some(&["flush".to_string()]), |_| {
                SOURCE_DEFAULT
            });
        assert_eq!(described.configs.len(), 1);
        assert_eq!(described.configs[0].config_source, SOURCE_DEFAULT);
        let described = describe_configs_result("t", current, None, |key| {
            if key == "flush" {
                SOURCE_DYNAMIC_DEFAULT_BROKER
            } else {
                SOURCE_DEFAULT
            }
        });
        let source = |name: &str| {
            described
                .configs
                .iter()
                .find(|config| config.name.as_str() == name)
                .map(|config| config.config_source)
        };
        assert_eq!(source("flush"), Some(SOURCE_DYNAMIC_DEFAULT_BROKER));
        assert_eq!(source("retention.ms"), Some(SOURCE_TOPIC_OVERRIDE));
    }

    /// Kafka's names and its cleanup policy: delete is what Strata does, compaction is refused
    /// (Kafka Connect and Streams check for it and must hear no), and described topics say so.
    #[test]
    fn kafka_topic_settings_map_to_strata() {
        assert_eq!(
            strata_config("cleanup.policy", "delete")
                .unwrap()
                .unwrap()
                .value,
            "delete"
        );
        // What Kafka Streams sets on its internal topics, and the rest of what changes nothing.
        // LogAppendTime is served: the setting is the broker's to check.
        assert_eq!(
            strata_config("message.timestamp.type", "LogAppendTime")
                .unwrap()
                .unwrap()
                .value,
            "LogAppendTime"
        );
        for (key, value) in [
            ("message.downconversion.enable", "false"),
            ("file.delete.delay.ms", "0"),
            ("segment.index.bytes", "1048576"),
            ("segment.jitter.ms", "100"),
        ] {
            assert!(
                strata_config(key, value).unwrap().is_none(),
                "{key}={value}"
            );
        }
        for (key, value) in [
            ("message.downconversion.enable", "maybe"),
            ("file.delete.delay.ms", "-5"),
            ("segment.index.bytes", "2"),
        ] {
            let refused = strata_config(key, value).unwrap_err();
            assert_eq!(refused.error, errors::INVALID_CONFIG);
            assert!(refused.message.contains(key), "{}", refused.message);
        }
        assert_eq!(
            strata_config("cleanup.policy", "compact")
                .unwrap()
                .unwrap()
                .value,
            "compact",
            "compaction is a setting the broker checks"
        );
        assert_eq!(
            strata_config("unclean.leader.election.enable", "true")
                .unwrap()
                .unwrap()
                .key,
            "unclean.leader.election"
        );
        let none = std::collections::BTreeMap::new();
        let altered = incremental_alter_request(
            RESOURCE_TOPIC,
            "t",
            [
                (
                    "cleanup.policy".to_string(),
                    OPERATION_SET,
                    Some("delete".to_string()),
                ),
                (
                    "unclean.leader.election.enable".to_string(),
                    OPERATION_DELETE,
                    None,
                ),
            ],
            &none,
        )
        .unwrap();
        assert_eq!(
            altered.set.len(),
            1,
            "the cleanup policy is the topic's own"
        );
        assert_eq!(altered.delete, ["unclean.leader.election"]);
        let described = describe_configs_result(
            "t",
            native::DescribeTopicConfigResponse {
                error: native::ErrorCode::None,
                configs: vec![native::TopicConfigEntry {
                    key: "unclean.leader.election".into(),
                    value: "false".into(),
                    is_override: false,
                }],
            },
            None,
            |_| SOURCE_DEFAULT,
        );
        let names: Vec<String> = described
            .configs
            .iter()
            .map(|c| c.name.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "message.downconversion.enable",
                "file.delete.delay.ms",
                "segment.index.bytes",
                "segment.jitter.ms",
                "unclean.leader.election.enable"
            ]
        );
    }

    /// APPEND and SUBTRACT work on list-valued settings, from the topic's value, and are
    /// refused for any other setting with Kafka's error and words.
    #[test]
    fn list_settings_take_append_and_subtract_and_others_refuse_them() {
        let one = |key: &str, operation, value: &str, overrides: &[(&str, &str)]| {
            let overrides = overrides
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect();
            incremental_alter_request(
                RESOURCE_TOPIC,
                "t",
                [(key.to_string(), operation, Some(value.to_string()))],
                &overrides,
            )
        };
        let set = |alter: native::AlterTopicConfigRequest| -> Vec<(String, String)> {
            alter
                .set
                .into_iter()
                .map(|entry| (entry.key, entry.value))
                .collect()
        };
        // From the default (delete), and from what the topic holds.
        assert_eq!(
            set(one(CLEANUP_POLICY, OPERATION_APPEND, "compact", &[]).unwrap()),
            vec![(CLEANUP_POLICY.to_string(), "delete,compact".to_string())]
        );
        assert_eq!(
            set(one(
                CLEANUP_POLICY,
                OPERATION_SUBTRACT,
                "delete",
                &[("cleanup.policy", "compact,delete")]
            )
            .unwrap()),
            vec![(CLEANUP_POLICY.to_string(), "compact".to_string())]
        );
        assert_eq!(
            one(CLEANUP_POLICY, OPERATION_SUBTRACT, "delete", &[])
                .unwrap_err()
                .error,
            errors::INVALID_CONFIG,
            "a policy left empty"
        );
        let refused = one("retention.ms", OPERATION_APPEND, "5", &[]).unwrap_err();
        assert_eq!(refused.error, errors::INVALID_CONFIG);
        assert_eq!(
            refused.message,
            "Config value append is not allowed for config key: retention.ms"
        );
        assert_eq!(
            one("retention.ms", 9, "5", &[]).unwrap_err().error,
            errors::INVALID_REQUEST
        );
    }

    /// Kafka's tools read a member's partitions from its assignment bytes.
    #[test]
    fn described_members_carry_consumer_assignments_kafka_tools_decode() {
        let described = described_group(native::DescribeGroupResponse {
            error: native::ErrorCode::None,
            group: "g".into(),
            generation: 4,
            state: "Stable".into(),
            assignor: "range".into(),
            members: vec![native::GroupMember {
                member_id: "m".into(),
                instance_id: None,
                client_id: "c".into(),
                generation: 4,
                assignment: vec![native::TopicPartitions {
                    topic: "t".into(),
                    partitions: vec![0, 2],
                }],
            }],
            offsets: Vec::new(),
        });
        let mut bytes = described.members[0].member_assignment.clone();
        let version = bytes::Buf::get_i16(&mut bytes);
        let decoded = ConsumerProtocolAssignment::decode(&mut bytes, version).unwrap();
        assert_eq!(decoded.assigned_partitions[0].partitions, [0, 2]);
        assert_eq!(described.group_state.to_string(), "Stable");
    }

    #[test]
    fn group_configs_are_set_or_deleted_never_appended() {
        let change = group_alter_request(
            "g",
            [
                (
                    "share.auto.offset.reset".to_string(),
                    0,
                    Some("earliest".into()),
                ),
                ("share.isolation.level".to_string(), 1, None),
            ],
        )
        .unwrap();
        assert_eq!(
            change,
            GroupConfigChange {
                set: vec![("share.auto.offset.reset".into(), "earliest".into())],
                delete: vec!["share.isolation.level".into()],
            }
        );
        let appended = group_alter_request("g", [("x".to_string(), 2, Some("1".into()))]);
        assert_eq!(appended.unwrap_err().error, errors::INVALID_CONFIG);
        let valueless = group_alter_request("g", [("x".to_string(), 0, None)]);
        assert_eq!(valueless.unwrap_err().error, errors::INVALID_REQUEST);
        let unnamed = group_alter_request("", [("x".to_string(), 0, Some("1".into()))]);
        assert_eq!(unnamed.unwrap_err().error, errors::INVALID_REQUEST);
        let twice = group_alter_request(
            "g",
            [
                ("x".to_string(), 0, Some("1".into())),
                ("x".to_string(), 1, None),
            ],
        );
        assert_eq!(twice.unwrap_err().error, errors::INVALID_REQUEST);
    }

    #[test]
    fn group_configs_are_described_with_their_sources() {
        let entries = [
            GroupConfigEntry {
                name: "share.auto.offset.reset",
                value: "earliest",
                set: true,
                documentation: "where to start",
            },
            GroupConfigEntry {
                name: "share.isolation.level",
                value: "read_uncommitted",
                set: false,
                documentation: "what to read",
            },
        ];
        let described = describe_group_configs_result("g", entries, None, false);
        assert_eq!(described.resource_type, RESOURCE_GROUP);
        assert_eq!(described.error_code, errors::NONE);
        let sources: Vec<(String, i8)> = described
            .configs
            .iter()
            .map(|config| (config.name.to_string(), config.config_source))
            .collect();
        assert_eq!(
            sources,
            [
                ("share.auto.offset.reset".to_string(), SOURCE_DYNAMIC_GROUP),
                ("share.isolation.level".to_string(), SOURCE_DEFAULT),
            ]
        );
        assert!(described.configs.iter().all(|c| c.documentation.is_none()));
        let keys = ["share.isolation.level".to_string()];
        let one = describe_group_configs_result("g", entries, Some(&keys), true);
        assert_eq!(one.configs.len(), 1);
        assert_eq!(
            one.configs[0].documentation.as_deref(),
            Some("what to read")
        );
    }
}
