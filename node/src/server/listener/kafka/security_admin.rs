//! Users and ACLs through Kafka's admin APIs, so `kafka-acls`, `kafka-configs --entity-type
//! users` and every AdminClient manage them: CreateAcls, DescribeAcls and DeleteAcls (versions
//! 1–3), DescribeUserScramCredentials and AlterUserScramCredentials.
//!
//! Reads answer from the shard's view; changes go to the control thread, which writes the
//! coordinator and announces the new view to every shard before answering (and the watch
//! carries it to every other broker). As Kafka's brokers, the ACL APIs answer
//! SECURITY_DISABLED when no authorizer is configured, and each API needs the cluster
//! operation Kafka's authorizer checks (Describe to read, Alter to change).

use std::rc::Rc;

use strata_auth::acl::{
    AclBinding, AclFilter, Operation, PatternFilter, PatternType, Permission, ResourceType,
};
use strata_auth::scram::{ScramCredential, ScramMechanism};
use strata_kafka::errors;
use strata_kafka::kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use strata_kafka::kafka_protocol::messages::create_acls_response::AclCreationResult;
use strata_kafka::kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use strata_kafka::kafka_protocol::messages::describe_acls_response::{
    AclDescription, DescribeAclsResource,
};
use strata_kafka::kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use strata_kafka::kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, CreateAclsRequest,
    CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use strata_kafka::text;

use super::encoded;
use crate::server::listener::Client;
use crate::server::listener::Outcome;
use crate::server::messages::{CredentialChange, SettingsChange, SettingsChanged};
use crate::server::shard::Shard;
use strata_kafka::frame::{Header, KafkaRequest};

/// Why an ACL API is refused before it runs: no authorizer (SECURITY_DISABLED, as Kafka
/// answers), or the client may not do `operation` on the cluster.
fn acl_api_refusal(
    shard: &Shard,
    client: &Client,
    operation: Operation,
) -> Option<(i16, &'static str)> {
    if shard.context.config.security.authorizer.is_none() {
        return Some((errors::SECURITY_DISABLED, "no authorizer is configured"));
    }
    if !super::authorize::cluster(shard, client, operation) {
        return Some((
            errors::CLUSTER_AUTHORIZATION_FAILED,
            match operation {
                Operation::Describe => "Describe on the cluster is needed",
                _ => "Alter on the cluster is needed",
            },
        ));
    }
    None
}

/// A binding as Kafka's wire carries one; `Err` with the reason it is not valid.
fn binding(
    resource_type: i8,
    resource_name: &str,
    pattern_type: i8,
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Result<AclBinding, String> {
    let binding = AclBinding {
        resource_type: ResourceType::from_code(resource_type)
            .ok_or_else(|| format!("resource type {resource_type} is not one Strata knows"))?,
        resource_name: resource_name.to_string(),
        pattern_type: PatternType::from_code(pattern_type)
            .ok_or_else(|| format!("pattern type {pattern_type} cannot be created"))?,
        principal: principal.to_string(),
        host: host.to_string(),
        operation: Operation::from_code(operation)
            .ok_or_else(|| format!("operation {operation} cannot be granted"))?,
        permission: Permission::from_code(permission)
            .ok_or_else(|| format!("permission {permission} cannot be granted"))?,
    };
    binding.validate().map_err(|error| error.to_string())?;
    Ok(binding)
}

/// A filter as Kafka's wire carries one (1 is ANY in every field, MATCH for patterns).
#[allow(clippy::too_many_arguments)]
fn filter(
    resource_type: i8,
    resource_name: Option<&str>,
    pattern_type: i8,
    principal: Option<&str>,
    host: Option<&str>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    const ANY: i8 = 1;
    const MATCH: i8 = 2;
    fn any_or<T>(code: i8, parsed: Option<T>, what: &str) -> Result<Option<T>, String> {
        match code {
            ANY => Ok(None),
            _ => parsed
                .map(Some)
                .ok_or_else(|| format!("{what} {code} is not one Strata knows")),
        }
    }
    Ok(AclFilter {
        resource_type: any_or(
            resource_type,
            ResourceType::from_code(resource_type),
            "resource type",
        )?,
        resource_name: resource_name.map(str::to_string),
        pattern: match pattern_type {
            ANY => PatternFilter::Any,
            MATCH => PatternFilter::Match,
            code => PatternFilter::Exactly(
                PatternType::from_code(code)
                    .ok_or_else(|| format!("pattern type {code} is not one Strata knows"))?,
            ),
        },
        principal: principal.map(str::to_string),
        host: host.map(str::to_string),
        operation: any_or(operation, Operation::from_code(operation), "operation")?,
        permission: any_or(permission, Permission::from_code(permission), "permission")?,
    })
}

async fn create_acls(
    shard: &Rc<Shard>,
    client: &Client,
    request: CreateAclsRequest,
) -> CreateAclsResponse {
    let refuse_all = |code: i16, message: &str| {
        let results = request
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(text(message)))
            })
            .collect();
        CreateAclsResponse::default().with_results(results)
    };
    if let Some((code, message)) = acl_api_refusal(shard, client, Operation::Alter) {
        return refuse_all(code, message);
    }
    let parsed: Vec<Result<AclBinding, String>> = request
        .creations
        .iter()
        .map(|creation| {
            binding(
                creation.resource_type,
                &creation.resource_name,
                creation.resource_pattern_type,
                &creation.principal,
                &creation.host,
                creation.operation,
                creation.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclBinding> = parsed
        .iter()
        .filter_map(|b| b.as_ref().ok().cloned())
        .collect();
    let stored = if valid.is_empty() {
        Ok(())
    } else {
        match crate::server::listener::change_settings(shard, SettingsChange::CreateAcls(valid))
            .await
        {
            Some(SettingsChanged::CreateAcls(stored)) => stored,
            _ => Err("the control thread is stopping".into()),
        }
    };
    let results = parsed
        .into_iter()
        .map(|parsed| match (parsed, &stored) {
            (Err(why), _) => AclCreationResult::default()
                .with_error_code(errors::INVALID_REQUEST)
                .with_error_message(Some(text(&why))),
            (Ok(_), Err(why)) => AclCreationResult::default()
                .with_error_code(errors::UNKNOWN_SERVER_ERROR)
                .with_error_message(Some(text(why))),
            (Ok(_), Ok(())) => AclCreationResult::default(),
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

/// Bindings grouped by resource, as DescribeAcls answers them.
fn by_resource<'a>(bindings: impl Iterator<Item = &'a AclBinding>) -> Vec<DescribeAclsResource> {
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for binding in bindings {
        let description = AclDescription::default()
            .with_principal(text(&binding.principal))
            .with_host(text(&binding.host))
            .with_operation(binding.operation.code())
            .with_permission_type(binding.permission.code());
        let same = |resource: &&mut DescribeAclsResource| {
            resource.resource_type == binding.resource_type.code()
                && resource.pattern_type == binding.pattern_type.code()
                && resource.resource_name.as_str() == binding.resource_name
        };
        match resources.iter_mut().find(same) {
            Some(resource) => resource.acls.push(description),
            None => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(binding.resource_type.code())
                    .with_resource_name(text(&binding.resource_name))
                    .with_pattern_type(binding.pattern_type.code())
                    .with_acls(vec![description]),
            ),
        }
    }
    resources
}

fn describe_acls(
    shard: &Shard,
    client: &Client,
    request: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let refuse = |code: i16, message: &str| {
        DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(text(message)))
    };
    if let Some((code, message)) = acl_api_refusal(shard, client, Operation::Describe) {
        return refuse(code, message);
    }
    let selected = filter(
        request.resource_type_filter,
        request.resource_name_filter.as_deref(),
        request.pattern_type_filter,
        request.principal_filter.as_deref(),
        request.host_filter.as_deref(),
        request.operation,
        request.permission_type,
    );
    match selected {
        Err(why) => refuse(errors::INVALID_REQUEST, &why),
        Ok(selected) => {
            let view = shard.view.borrow();
            let matching = view.security.acls.iter().filter(|b| selected.matches(b));
            DescribeAclsResponse::default().with_resources(by_resource(matching))
        }
    }
}

async fn delete_acls(
    shard: &Rc<Shard>,
    client: &Client,
    request: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let refuse_all = |code: i16, message: &str| {
        let results = request
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(text(message)))
            })
            .collect();
        DeleteAclsResponse::default().with_filter_results(results)
    };
    if let Some((code, message)) = acl_api_refusal(shard, client, Operation::Alter) {
        return refuse_all(code, message);
    }
    let parsed: Vec<Result<AclFilter, String>> = request
        .filters
        .iter()
        .map(|f| {
            filter(
                f.resource_type_filter,
                f.resource_name_filter.as_deref(),
                f.pattern_type_filter,
                f.principal_filter.as_deref(),
                f.host_filter.as_deref(),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = parsed
        .iter()
        .filter_map(|f| f.as_ref().ok().cloned())
        .collect();
    let deleted = if valid.is_empty() {
        Ok(Vec::new())
    } else {
        match crate::server::listener::change_settings(shard, SettingsChange::DeleteAcls(valid))
            .await
        {
            Some(SettingsChanged::DeleteAcls(deleted)) => deleted,
            _ => Err("the control thread is stopping".into()),
        }
    };
    let mut deleted_per_valid = match &deleted {
        Ok(deleted) => deleted.clone().into_iter(),
        Err(_) => Vec::new().into_iter(),
    };
    let results = parsed
        .into_iter()
        .map(|parsed| match (parsed, &deleted) {
            (Err(why), _) => DeleteAclsFilterResult::default()
                .with_error_code(errors::INVALID_REQUEST)
                .with_error_message(Some(text(&why))),
            (Ok(_), Err(why)) => DeleteAclsFilterResult::default()
                .with_error_code(errors::UNKNOWN_SERVER_ERROR)
                .with_error_message(Some(text(why))),
            (Ok(_), Ok(_)) => {
                let matching = deleted_per_valid
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|binding| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(binding.resource_type.code())
                            .with_resource_name(text(&binding.resource_name))
                            .with_pattern_type(binding.pattern_type.code())
                            .with_principal(text(&binding.principal))
                            .with_host(text(&binding.host))
                            .with_operation(binding.operation.code())
                            .with_permission_type(binding.permission.code())
                    })
                    .collect();
                DeleteAclsFilterResult::default().with_matching_acls(matching)
            }
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

fn describe_user_scram_credentials(
    shard: &Shard,
    client: &Client,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    if !super::authorize::cluster(shard, client, Operation::Describe) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(text("Describe on the cluster is needed")));
    }
    let view = shard.view.borrow();
    let users = &view.security.users;
    let describe = |name: &str| {
        let result = DescribeUserScramCredentialsResult::default().with_user(text(name));
        match users.iter().find(|user| user.name == name) {
            Some(user) => result.with_credential_infos(
                user.credentials
                    .iter()
                    .map(|credential| {
                        CredentialInfo::default()
                            .with_mechanism(credential.mechanism.kafka_type())
                            .with_iterations(credential.iterations as i32)
                    })
                    .collect(),
            ),
            None => result
                .with_error_code(errors::RESOURCE_NOT_FOUND)
                .with_error_message(Some(text(
                    "attempt to describe a user credential that does not exist",
                ))),
        }
    };
    let results = match &request.users {
        Some(asked) if !asked.is_empty() => {
            let mut seen = Vec::new();
            asked
                .iter()
                .map(|user| {
                    let name = user.name.as_str();
                    if seen.contains(&name) {
                        DescribeUserScramCredentialsResult::default()
                            .with_user(text(name))
                            .with_error_code(errors::DUPLICATE_RESOURCE)
                            .with_error_message(Some(text("a user named twice")))
                    } else {
                        seen.push(name);
                        describe(name)
                    }
                })
                .collect()
        }
        _ => users.iter().map(|user| describe(&user.name)).collect(),
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// A Kafka error code and its message.
type Refusal = (i16, String);

async fn alter_user_scram_credentials(
    shard: &Rc<Shard>,
    client: &Client,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let names: Vec<String> = request
        .deletions
        .iter()
        .map(|deletion| deletion.name.to_string())
        .chain(
            request
                .upsertions
                .iter()
                .map(|upsertion| upsertion.name.to_string()),
        )
        .collect();
    let refusal = |name: &str, code: i16, message: &str| {
        AlterUserScramCredentialsResult::default()
            .with_user(text(name))
            .with_error_code(code)
            .with_error_message(Some(text(message)))
    };
    if !super::authorize::cluster(shard, client, Operation::Alter) {
        let results = names
            .iter()
            .map(|name| {
                refusal(
                    name,
                    errors::CLUSTER_AUTHORIZATION_FAILED,
                    "Alter on the cluster is needed",
                )
            })
            .collect();
        return AlterUserScramCredentialsResponse::default().with_results(results);
    }
    // Each change as Kafka checks it; a user named twice in one request is refused whole.
    let mut checked: Vec<(String, Result<CredentialChange, Refusal>)> = Vec::new();
    for deletion in &request.deletions {
        let change = ScramMechanism::from_kafka_type(deletion.mechanism)
            .map(|mechanism| CredentialChange {
                user: deletion.name.to_string(),
                mechanism,
                credential: None,
            })
            .ok_or((
                errors::UNSUPPORTED_SASL_MECHANISM,
                "unknown SCRAM mechanism".to_string(),
            ));
        checked.push((deletion.name.to_string(), change));
    }
    for upsertion in &request.upsertions {
        let change = ScramMechanism::from_kafka_type(upsertion.mechanism)
            .ok_or((
                errors::UNSUPPORTED_SASL_MECHANISM,
                "unknown SCRAM mechanism".to_string(),
            ))
            .and_then(|mechanism| {
                let iterations = u32::try_from(upsertion.iterations).unwrap_or(0);
                ScramCredential::from_salted_password(
                    mechanism,
                    &upsertion.salted_password,
                    &upsertion.salt,
                    iterations,
                )
                .map(|credential| CredentialChange {
                    user: upsertion.name.to_string(),
                    mechanism,
                    credential: Some(credential),
                })
                .map_err(|error| (errors::UNACCEPTABLE_CREDENTIAL, error.to_string()))
            });
        checked.push((upsertion.name.to_string(), change));
    }
    let twice: Vec<String> = names
        .iter()
        .filter(|name| names.iter().filter(|other| other == name).count() > 1)
        .cloned()
        .collect();
    let mut results: Vec<(String, Result<(), Refusal>)> = Vec::new();
    let mut changes = Vec::new();
    for (name, change) in checked {
        if twice.contains(&name) {
            if !results.iter().any(|(done, _)| done == &name) {
                results.push((
                    name,
                    Err((
                        errors::DUPLICATE_RESOURCE,
                        "a user altered twice in one request".into(),
                    )),
                ));
            }
            continue;
        }
        match change {
            Ok(change) => {
                results.push((name, Ok(())));
                changes.push(change);
            }
            Err(refused) => results.push((name, Err(refused))),
        }
    }
    if !changes.is_empty() {
        let deletions: Vec<bool> = changes
            .iter()
            .map(|change| change.credential.is_none())
            .collect();
        let names_changed: Vec<String> = changes.iter().map(|change| change.user.clone()).collect();
        let answers = match crate::server::listener::change_settings(
            shard,
            SettingsChange::Credentials(changes),
        )
        .await
        {
            Some(SettingsChanged::Credentials(answers)) => answers,
            _ => vec![Err("the control thread is stopping".to_string()); names_changed.len()],
        };
        for ((name, deletion), answer) in names_changed.iter().zip(deletions).zip(answers) {
            let outcome = match answer {
                Ok(true) => Ok(()),
                Ok(false) if deletion => Err((
                    errors::RESOURCE_NOT_FOUND,
                    "attempt to delete a user credential that does not exist".to_string(),
                )),
                Ok(false) => Ok(()),
                Err(why) => Err((errors::UNKNOWN_SERVER_ERROR, why)),
            };
            if let Some((_, result)) = results.iter_mut().find(|(done, _)| done == name) {
                *result = outcome;
            }
        }
    }
    let results = results
        .into_iter()
        .map(|(name, result)| match result {
            Ok(()) => AlterUserScramCredentialsResult::default().with_user(text(&name)),
            Err((code, why)) => refusal(&name, code, &why),
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// Answers an ACL or SCRAM credential request.
pub(super) async fn serve(
    shard: &Rc<Shard>,
    client: &Client,
    header: Header,
    request: KafkaRequest,
) -> Outcome {
    match request {
        KafkaRequest::CreateAcls(request) => {
            encoded(&header, create_acls(shard, client, request).await)
        }
        KafkaRequest::DescribeAcls(request) => {
            encoded(&header, describe_acls(shard, client, request))
        }
        KafkaRequest::DeleteAcls(request) => {
            encoded(&header, delete_acls(shard, client, request).await)
        }
        KafkaRequest::DescribeUserScramCredentials(request) => encoded(
            &header,
            describe_user_scram_credentials(shard, client, request),
        ),
        KafkaRequest::AlterUserScramCredentials(request) => encoded(
            &header,
            alter_user_scram_credentials(shard, client, request).await,
        ),
        _ => unreachable!("only the security administration APIs come here"),
    }
}
