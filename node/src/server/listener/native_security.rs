//! Authorization and security administration on the native protocol: what each native API
//! needs (the same operations Kafka's authorizer checks for its counterpart), and the users,
//! ACL and quota requests `strata user`, `strata acl` and `strata quota` send (with the
//! broker settings and group configs ones, answered by `broker_configs` and `group_configs`).
//!
//! A native request is refused whole, with a response-level TOPIC_, GROUP_ or
//! CLUSTER_AUTHORIZATION_FAILED, when any resource it names is not allowed (the native client
//! reports it as one error); Metadata and ListGroups leave out what the client may not
//! Describe instead.

use std::rc::Rc;

use base64::Engine;
use strata_auth::acl::{
    AclBinding, AclFilter, CLUSTER_NAME, Operation, PatternFilter, PatternType, Permission,
    ResourceType,
};
use strata_auth::scram::{ScramCredential, ScramMechanism};
use strata_coordinator::quotas::{QuotaFilter, QuotaKey};
use strata_wire::protocol::{
    AclEntry, AlterUserRequest, AlterUserResponse, CreateAclsRequest, CreateAclsResponse,
    DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest, DescribeAclsResponse,
    DescribeUsersRequest, DescribeUsersResponse, ErrorCode, Request, Response, UserCredentials,
};
use strata_wire::protocol::{
    AlterQuotasRequest, AlterQuotasResponse, DescribeQuotasRequest, DescribeQuotasResponse,
    QuotaAlterResult, QuotaEntityPart, QuotaEntry, QuotaValue,
};

use super::Client;
use crate::server::messages::{CredentialChange, SettingsChange, SettingsChanged};
use crate::server::shard::Shard;

/// What a client may do, as the code a request it may not send is answered with.
struct Rights<'a> {
    shard: &'a Shard,
    client: &'a Client,
}

impl Rights<'_> {
    fn check(
        &self,
        operation: Operation,
        resource: ResourceType,
        name: &str,
        refused: ErrorCode,
    ) -> Option<ErrorCode> {
        (!self.client.may(self.shard, operation, resource, name)).then_some(refused)
    }

    fn topic(&self, operation: Operation, name: &str) -> Option<ErrorCode> {
        let refused = ErrorCode::TopicAuthorizationFailed;
        self.check(operation, ResourceType::Topic, name, refused)
    }

    fn group(&self, operation: Operation, name: &str) -> Option<ErrorCode> {
        let refused = ErrorCode::GroupAuthorizationFailed;
        self.check(operation, ResourceType::Group, name, refused)
    }

    fn cluster(&self, operation: Operation) -> Option<ErrorCode> {
        let refused = ErrorCode::ClusterAuthorizationFailed;
        self.check(operation, ResourceType::Cluster, CLUSTER_NAME, refused)
    }

    fn transactional_id(&self, operation: Operation, id: &str) -> Option<ErrorCode> {
        let refused = ErrorCode::TransactionalIdAuthorizationFailed;
        self.check(operation, ResourceType::TransactionalId, id, refused)
    }
}

/// Why `client` may not send `request`, as the code to answer; `None` when it may.
pub(super) fn refusal(shard: &Shard, client: &Client, request: &Request) -> Option<ErrorCode> {
    let may = Rights { shard, client };
    match request {
        // Open to all: version discovery, and the answers filtered by what the client may see.
        Request::ApiVersions(_)
        | Request::Metadata(_)
        | Request::ListGroups(_)
        | Request::ListTransactions(_)
        | Request::DescribeTransactions(_)
        | Request::Authenticate(_) => None,
        Request::Produce(produce) => produce
            .topics
            .iter()
            .find_map(|t| may.topic(Operation::Write, &t.name)),
        Request::Fetch(fetch) => fetch
            .topics
            .iter()
            .find_map(|t| may.topic(Operation::Read, &t.name)),
        Request::ListOffsets(list) => list
            .topics
            .iter()
            .find_map(|t| may.topic(Operation::Describe, &t.name)),
        Request::CreateTopic(create) => may
            .cluster(Operation::Create)
            .and(may.topic(Operation::Create, &create.name)),
        Request::DeleteTopic(delete) => may.topic(Operation::Delete, &delete.name),
        Request::DeleteRecords(delete) => delete
            .topics
            .iter()
            .find_map(|t| may.topic(Operation::Delete, &t.name)),
        Request::CreatePartitions(create) => may.topic(Operation::Alter, &create.topic),
        Request::AlterTopicConfig(alter) => may.topic(Operation::AlterConfigs, &alter.topic),
        Request::DescribeTopicConfig(describe) => {
            may.topic(Operation::DescribeConfigs, &describe.topic)
        }
        Request::ReassignPartition(_) | Request::ElectLeaders(_) => may.cluster(Operation::Alter),
        // Between brokers only (QUIC); a client sending one acts for the cluster.
        Request::ReplicaFetch(_) | Request::WriteTxnMarkers(_) => {
            may.cluster(Operation::ClusterAction)
        }
        Request::InitProducerId(init) => match &init.transactional.0 {
            Some(txn) => may.transactional_id(Operation::Write, &txn.transactional_id),
            None => (!client.may_write_idempotently(shard))
                .then_some(ErrorCode::ClusterAuthorizationFailed),
        },
        Request::FindCoordinator(find) if find.transaction.0 => {
            may.transactional_id(Operation::Describe, &find.group)
        }
        Request::FindCoordinator(find) => may.group(Operation::Describe, &find.group),
        Request::AddPartitionsToTxn(add) => may
            .transactional_id(Operation::Write, &add.producer.transactional_id)
            .or_else(|| {
                add.topics
                    .iter()
                    .find_map(|t| may.topic(Operation::Write, &t.topic))
            }),
        Request::AddOffsetsToTxn(add) => may
            .transactional_id(Operation::Write, &add.producer.transactional_id)
            .or_else(|| may.group(Operation::Read, &add.group)),
        Request::EndTxn(end) => {
            may.transactional_id(Operation::Write, &end.producer.transactional_id)
        }
        // As Kafka: Write on the transactional id, then Read on the group and its topics.
        Request::TxnOffsetCommit(commit) => may
            .transactional_id(Operation::Write, &commit.producer.transactional_id)
            .or_else(|| may.group(Operation::Read, &commit.group))
            .or_else(|| {
                commit
                    .topics
                    .iter()
                    .find_map(|t| may.topic(Operation::Read, &t.name))
            }),
        Request::DescribeGroup(describe) => may.group(Operation::Describe, &describe.group),
        Request::DeleteGroup(delete) => may.group(Operation::Delete, &delete.group),
        Request::DeleteOffsets(delete) => {
            may.group(Operation::Delete, &delete.group).or_else(|| {
                delete
                    .topics
                    .iter()
                    .find_map(|t| may.topic(Operation::Read, &t.topic))
            })
        }
        Request::JoinGroup(join) => may.group(Operation::Read, &join.group),
        Request::Heartbeat(heartbeat) => may.group(Operation::Read, &heartbeat.group),
        Request::LeaveGroup(leave) => may.group(Operation::Read, &leave.group),
        Request::OffsetCommit(commit) => may.group(Operation::Read, &commit.group).or_else(|| {
            commit
                .topics
                .iter()
                .find_map(|t| may.topic(Operation::Read, &t.name))
        }),
        Request::OffsetFetch(fetch) => may.group(Operation::Describe, &fetch.group).or_else(|| {
            fetch
                .topics
                .iter()
                .flatten()
                .find_map(|t| may.topic(Operation::Describe, &t.topic))
        }),
        // Share groups, as Kafka checks them: Read on the group and on each topic read or
        // acknowledged, Describe on the topics a member subscribes to or a describe names.
        Request::ShareGroupHeartbeat(beat) => {
            may.group(Operation::Read, &beat.group).or_else(|| {
                beat.topics
                    .iter()
                    .flatten()
                    .find_map(|t| may.topic(Operation::Describe, t))
            })
        }
        Request::ShareFetch(fetch) => may.group(Operation::Read, &fetch.group).or_else(|| {
            fetch
                .topics
                .iter()
                .find_map(|t| may.topic(Operation::Read, &t.name))
        }),
        Request::ShareAcknowledge(ack) => may.group(Operation::Read, &ack.group).or_else(|| {
            ack.topics
                .iter()
                .find_map(|t| may.topic(Operation::Read, &t.name))
        }),
        Request::DescribeShareGroup(describe) => may.group(Operation::Describe, &describe.group),
        Request::DescribeSharePartitions(describe) => {
            may.group(Operation::Describe, &describe.group).or_else(|| {
                describe
                    .topics
                    .iter()
                    .find_map(|t| may.topic(Operation::Describe, &t.topic))
            })
        }
        // As Kafka checks a GROUP config resource.
        Request::DescribeGroupConfigs(describe) => {
            may.group(Operation::DescribeConfigs, &describe.group)
        }
        Request::AlterGroupConfigs(alter) => may.group(Operation::AlterConfigs, &alter.group),
        Request::DescribeUsers(_) | Request::DescribeAcls(_) => may.cluster(Operation::Describe),
        Request::DescribeQuotas(_) | Request::DescribeBrokerConfigs(_) => {
            may.cluster(Operation::DescribeConfigs)
        }
        Request::AlterQuotas(_) | Request::AlterBrokerConfigs(_) => {
            may.cluster(Operation::AlterConfigs)
        }
        Request::AlterUser(_) | Request::CreateAcls(_) | Request::DeleteAcls(_) => {
            may.cluster(Operation::Alter)
        }
    }
}

/// Leaves out of an answer what `client` may not Describe (topics in Metadata, groups in
/// ListGroups).
pub(super) fn filter_answer(shard: &Shard, client: &Client, response: &mut Response) {
    match response {
        Response::Metadata(metadata) => metadata
            .topics
            .retain(|t| client.may(shard, Operation::Describe, ResourceType::Topic, &t.name)),
        Response::ListGroups(groups)
            if !client.may(
                shard,
                Operation::Describe,
                ResourceType::Cluster,
                CLUSTER_NAME,
            ) =>
        {
            groups
                .groups
                .retain(|g| client.may(shard, Operation::Describe, ResourceType::Group, &g.group))
        }
        Response::ListTransactions(listed) => listed.transactions.retain(|t| {
            client.may(
                shard,
                Operation::Describe,
                ResourceType::TransactionalId,
                &t.transactional_id,
            )
        }),
        Response::DescribeTransactions(described) => {
            for transaction in &mut described.transactions {
                if !client.may(
                    shard,
                    Operation::Describe,
                    ResourceType::TransactionalId,
                    &transaction.transactional_id,
                ) {
                    *transaction = strata_wire::protocol::TransactionDescription::refused(
                        std::mem::take(&mut transaction.transactional_id),
                        ErrorCode::TransactionalIdAuthorizationFailed,
                    );
                }
            }
        }
        _ => {}
    }
}

/// Answers a users, ACL, quota, broker settings or group configs request; `None` for any other
/// request.
pub(super) async fn respond(shard: &Rc<Shard>, request: &Request) -> Option<Response> {
    Some(match request {
        Request::DescribeUsers(request) => Response::DescribeUsers(describe_users(shard, request)),
        Request::AlterUser(request) => Response::AlterUser(alter_user(shard, request).await),
        Request::DescribeAcls(request) => Response::DescribeAcls(describe_acls(shard, request)),
        Request::CreateAcls(request) => Response::CreateAcls(create_acls(shard, request).await),
        Request::DeleteAcls(request) => Response::DeleteAcls(delete_acls(shard, request).await),
        Request::DescribeQuotas(request) => {
            Response::DescribeQuotas(describe_quotas(shard, request))
        }
        Request::AlterQuotas(request) => Response::AlterQuotas(alter_quotas(shard, request).await),
        Request::DescribeBrokerConfigs(request) => {
            Response::DescribeBrokerConfigs(super::broker_configs::describe(shard, request))
        }
        Request::AlterBrokerConfigs(request) => {
            Response::AlterBrokerConfigs(super::broker_configs::alter(shard, request).await)
        }
        Request::DescribeGroupConfigs(request) => {
            Response::DescribeGroupConfigs(super::group_configs::describe_native(shard, request))
        }
        Request::AlterGroupConfigs(request) => {
            Response::AlterGroupConfigs(super::group_configs::alter_native(shard, request).await)
        }
        _ => return None,
    })
}

fn describe_users(shard: &Shard, request: &DescribeUsersRequest) -> DescribeUsersResponse {
    let view = shard.view.borrow();
    let users = view
        .security
        .users
        .iter()
        .filter(|user| {
            request
                .users
                .as_ref()
                .is_none_or(|names| names.contains(&user.name))
        })
        .map(|user| UserCredentials {
            name: user.name.clone(),
            mechanisms: user
                .credentials
                .iter()
                .map(|credential| credential.mechanism.name().to_string())
                .collect(),
            iterations: user.credentials.iter().map(|c| c.iterations).collect(),
        })
        .collect();
    DescribeUsersResponse {
        error: ErrorCode::None,
        message: String::new(),
        users,
    }
}

async fn alter_user(shard: &Shard, request: &AlterUserRequest) -> AlterUserResponse {
    let refused = |error, message: String| AlterUserResponse { error, message };
    let Some(mechanism) = ScramMechanism::from_name(&request.mechanism) else {
        return refused(
            ErrorCode::InvalidRequest,
            format!("unknown SCRAM mechanism {:?}", request.mechanism),
        );
    };
    let credential = if request.delete {
        None
    } else {
        let base64 = base64::engine::general_purpose::STANDARD;
        let (Ok(salt), Ok(salted)) = (
            base64.decode(&request.salt),
            base64.decode(&request.salted_password),
        ) else {
            return refused(
                ErrorCode::InvalidRequest,
                "salt and salted password are base64".into(),
            );
        };
        match ScramCredential::from_salted_password(mechanism, &salted, &salt, request.iterations) {
            Ok(credential) => Some(credential),
            Err(error) => return refused(ErrorCode::InvalidRequest, error.to_string()),
        }
    };
    let deleting = credential.is_none();
    let changes = vec![CredentialChange {
        user: request.user.clone(),
        mechanism,
        credential,
    }];
    match super::change_settings(shard, SettingsChange::Credentials(changes)).await {
        Some(SettingsChanged::Credentials(answers)) => match answers.into_iter().next() {
            Some(Ok(true)) => refused(ErrorCode::None, String::new()),
            Some(Ok(false)) if deleting => refused(
                ErrorCode::InvalidRequest,
                format!("user {} has no {mechanism} credential", request.user),
            ),
            Some(Ok(false)) => refused(ErrorCode::None, String::new()),
            Some(Err(why)) => refused(ErrorCode::InvalidRequest, why),
            None => refused(ErrorCode::Internal, "no answer".into()),
        },
        _ => refused(ErrorCode::NotReady, "the control thread is stopping".into()),
    }
}

fn entry(binding: &AclBinding) -> AclEntry {
    AclEntry {
        resource_type: binding.resource_type.name().to_string(),
        resource_name: binding.resource_name.clone(),
        pattern_type: binding.pattern_type.name().to_string(),
        principal: binding.principal.clone(),
        host: binding.host.clone(),
        operation: binding.operation.name().to_string(),
        permission: binding.permission.name().to_string(),
    }
}

fn binding(entry: &AclEntry) -> Result<AclBinding, String> {
    let parse = |what: &str, text: &str| format!("unknown {what} {text:?}");
    let binding = AclBinding {
        resource_type: ResourceType::parse(&entry.resource_type)
            .ok_or_else(|| parse("resource type", &entry.resource_type))?,
        resource_name: entry.resource_name.clone(),
        pattern_type: PatternType::parse(&entry.pattern_type)
            .ok_or_else(|| parse("pattern type", &entry.pattern_type))?,
        principal: entry.principal.clone(),
        host: if entry.host.is_empty() {
            "*".into()
        } else {
            entry.host.clone()
        },
        operation: Operation::parse(&entry.operation)
            .ok_or_else(|| parse("operation", &entry.operation))?,
        permission: Permission::parse(&entry.permission)
            .ok_or_else(|| parse("permission", &entry.permission))?,
    };
    binding.validate().map_err(|error| error.to_string())?;
    Ok(binding)
}

/// A filter: each empty field matches anything; a name matches as given (literal and prefixed
/// alike, unless a pattern type is named).
fn filter(entry: &AclEntry) -> Result<AclFilter, String> {
    let optional = |text: &str| (!text.is_empty()).then(|| text.to_string());
    fn parsed<T>(
        what: &str,
        text: &str,
        parse: fn(&str) -> Option<T>,
    ) -> Result<Option<T>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        parse(text)
            .map(Some)
            .ok_or_else(|| format!("unknown {what} {text:?}"))
    }
    Ok(AclFilter {
        resource_type: parsed("resource type", &entry.resource_type, ResourceType::parse)?,
        resource_name: optional(&entry.resource_name),
        pattern: match optional(&entry.pattern_type) {
            None => PatternFilter::Any,
            Some(text) if text.eq_ignore_ascii_case("match") => PatternFilter::Match,
            Some(text) => PatternFilter::Exactly(
                PatternType::parse(&text)
                    .ok_or_else(|| format!("unknown pattern type {text:?}"))?,
            ),
        },
        principal: optional(&entry.principal),
        host: optional(&entry.host),
        operation: parsed("operation", &entry.operation, Operation::parse)?,
        permission: parsed("permission", &entry.permission, Permission::parse)?,
    })
}

fn authorizer_off(shard: &Shard) -> Option<(ErrorCode, String)> {
    shard.context.config.security.authorizer.is_none().then(|| {
        (
            ErrorCode::InvalidRequest,
            "no authorizer is configured (strata serve --authorizer acl)".to_string(),
        )
    })
}

fn describe_acls(shard: &Shard, request: &DescribeAclsRequest) -> DescribeAclsResponse {
    let refused = |(error, message)| DescribeAclsResponse {
        error,
        message,
        acls: Vec::new(),
    };
    if let Some(off) = authorizer_off(shard) {
        return refused(off);
    }
    match filter(&request.filter) {
        Err(why) => refused((ErrorCode::InvalidRequest, why)),
        Ok(filter) => DescribeAclsResponse {
            error: ErrorCode::None,
            message: String::new(),
            acls: shard
                .view
                .borrow()
                .security
                .acls
                .iter()
                .filter(|binding| filter.matches(binding))
                .map(entry)
                .collect(),
        },
    }
}

async fn create_acls(shard: &Shard, request: &CreateAclsRequest) -> CreateAclsResponse {
    let refused = |(error, message)| CreateAclsResponse { error, message };
    if let Some(off) = authorizer_off(shard) {
        return refused(off);
    }
    let bindings: Result<Vec<AclBinding>, String> = request.acls.iter().map(binding).collect();
    let bindings = match bindings {
        Ok(bindings) => bindings,
        Err(why) => return refused((ErrorCode::InvalidRequest, why)),
    };
    match super::change_settings(shard, SettingsChange::CreateAcls(bindings)).await {
        Some(SettingsChanged::CreateAcls(Ok(()))) => refused((ErrorCode::None, String::new())),
        Some(SettingsChanged::CreateAcls(Err(why))) => refused((ErrorCode::InvalidRequest, why)),
        _ => refused((ErrorCode::NotReady, "the control thread is stopping".into())),
    }
}

async fn delete_acls(shard: &Shard, request: &DeleteAclsRequest) -> DeleteAclsResponse {
    let refused = |(error, message)| DeleteAclsResponse {
        error,
        message,
        deleted: Vec::new(),
    };
    if let Some(off) = authorizer_off(shard) {
        return refused(off);
    }
    let filter = match filter(&request.filter) {
        Ok(filter) => filter,
        Err(why) => return refused((ErrorCode::InvalidRequest, why)),
    };
    match super::change_settings(shard, SettingsChange::DeleteAcls(vec![filter])).await {
        Some(SettingsChanged::DeleteAcls(Ok(deleted))) => DeleteAclsResponse {
            error: ErrorCode::None,
            message: String::new(),
            deleted: deleted.iter().flatten().map(entry).collect(),
        },
        Some(SettingsChanged::DeleteAcls(Err(why))) => refused((ErrorCode::InvalidRequest, why)),
        _ => refused((ErrorCode::NotReady, "the control thread is stopping".into())),
    }
}

fn describe_quotas(shard: &Shard, request: &DescribeQuotasRequest) -> DescribeQuotasResponse {
    let parts = request.filter.iter().map(|part| {
        (
            part.kind.as_str(),
            part.match_type as i8,
            part.name.as_deref(),
        )
    });
    let filter = match QuotaFilter::from_components(parts, request.strict) {
        Ok(filter) => filter,
        Err(error) => {
            return DescribeQuotasResponse {
                error: ErrorCode::InvalidRequest,
                message: error.to_string(),
                entries: Vec::new(),
            };
        }
    };
    let entries = super::quota::describe(shard, &filter)
        .into_iter()
        .map(|record| QuotaEntry {
            entity: record
                .entity
                .parts()
                .into_iter()
                .map(|(kind, name)| QuotaEntityPart {
                    kind: kind.to_string(),
                    name: name.map(str::to_string),
                })
                .collect(),
            values: record
                .values
                .iter()
                .map(|(key, value)| QuotaValue {
                    key: key.name().to_string(),
                    value: *value,
                })
                .collect(),
        })
        .collect();
    DescribeQuotasResponse {
        error: ErrorCode::None,
        message: String::new(),
        entries,
    }
}

async fn alter_quotas(shard: &Shard, request: &AlterQuotasRequest) -> AlterQuotasResponse {
    let alterations = request
        .entries
        .iter()
        .map(|entry| {
            let entity = strata_coordinator::quotas::QuotaEntity::from_parts(
                entry
                    .entity
                    .iter()
                    .map(|part| (part.kind.as_str(), part.name.as_deref())),
            )
            .map_err(|error| error.to_string())?;
            let changes = entry
                .changes
                .iter()
                .map(|change| {
                    let key = QuotaKey::parse(&change.key).map_err(|e| e.to_string())?;
                    Ok((key, (!change.remove).then_some(change.value)))
                })
                .collect::<Result<_, String>>()?;
            Ok(strata_coordinator::quotas::QuotaAlteration { entity, changes })
        })
        .collect();
    let results = super::quota::alter(shard, alterations, request.validate_only)
        .await
        .into_iter()
        .map(|answer| match answer {
            Ok(()) => QuotaAlterResult {
                error: ErrorCode::None,
                message: String::new(),
            },
            Err(super::quota::AlterRefused::Invalid(why)) => QuotaAlterResult {
                error: ErrorCode::InvalidRequest,
                message: why,
            },
            Err(super::quota::AlterRefused::Failed(why)) => QuotaAlterResult {
                error: ErrorCode::Internal,
                message: why,
            },
        })
        .collect();
    AlterQuotasResponse {
        error: ErrorCode::None,
        results,
    }
}
