//! `strata user` and `strata acl`: SCRAM users and ACL bindings, kept by the cluster's
//! coordinator and changed through any broker (which needs Alter on the cluster from whoever
//! asks, once `--authorizer acl` is on).

use anyhow::Context;
use base64::Engine;
use clap::{Args, Subcommand};
use serde_json::json;
use strata_auth::scram::{DEFAULT_ITERATIONS, SALT_BYTES, ScramMechanism, check_iterations};
use strata_wire::protocol::{
    AclEntry, AlterUserRequest, CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeUsersRequest, ErrorCode, Request, Response,
};

use super::Connection;
use crate::client_cmd::{Format, connect};

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user, or set a new password (read from stdin, never from the command line):
    /// a SCRAM credential per mechanism, salted and iterated; the password itself is not
    /// sent to the broker nor kept anywhere.
    Create {
        name: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (default: both, so clients may use either).
        #[arg(long)]
        mechanism: Option<String>,
        /// PBKDF2 iterations, 4096 to 16384 (default 4096).
        #[arg(long, default_value_t = DEFAULT_ITERATIONS)]
        iterations: u32,
        /// Read the password from the first line of stdin (required: a password on the
        /// command line would be in the shell's history and the process list).
        #[arg(long, required = true)]
        password_stdin: bool,
    },
    /// Delete a user's credentials (of one mechanism, or all).
    Delete {
        name: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (default: every mechanism the user has).
        #[arg(long)]
        mechanism: Option<String>,
    },
    /// Every user and its SCRAM mechanisms.
    List {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

/// One ACL binding, as `strata acl add|remove` take it.
#[derive(Args)]
pub struct AclArgs {
    /// `User:NAME`, or `User:*` for every user.
    #[arg(long)]
    principal: String,
    /// The client address it applies from (default *: any).
    #[arg(long, default_value = "*")]
    host: String,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
    /// AlterConfigs, IdempotentWrite or All.
    #[arg(long)]
    operation: String,
    /// The topic it is about (one of --topic, --group, --cluster, --transactional-id is
    /// needed; default: none).
    #[arg(long, group = "resource")]
    topic: Option<String>,
    /// The consumer group it is about (default: none).
    #[arg(long, group = "resource")]
    group: Option<String>,
    /// The cluster (its one resource, kafka-cluster): admin operations (default: off).
    #[arg(long, group = "resource")]
    cluster: bool,
    /// The transactional id it is about (default: none).
    #[arg(long, group = "resource")]
    transactional_id: Option<String>,
    /// The name is a prefix: the binding covers every resource whose name starts with it.
    #[arg(long)]
    prefixed: bool,
    /// Deny instead of allow (a deny wins over any allow).
    #[arg(long)]
    deny: bool,
}

impl AclArgs {
    fn entry(&self) -> anyhow::Result<AclEntry> {
        let (resource_type, resource_name) = match (
            &self.topic,
            &self.group,
            self.cluster,
            &self.transactional_id,
        ) {
            (Some(topic), None, false, None) => ("Topic", topic.clone()),
            (None, Some(group), false, None) => ("Group", group.clone()),
            (None, None, true, None) => ("Cluster", strata_auth::acl::CLUSTER_NAME.to_string()),
            (None, None, false, Some(id)) => ("TransactionalId", id.clone()),
            _ => anyhow::bail!(
                "name one resource: --topic, --group, --cluster or --transactional-id"
            ),
        };
        Ok(AclEntry {
            resource_type: resource_type.into(),
            resource_name,
            pattern_type: if self.prefixed { "Prefixed" } else { "Literal" }.into(),
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: self.operation.clone(),
            permission: if self.deny { "Deny" } else { "Allow" }.into(),
        })
    }
}

#[derive(Subcommand)]
pub enum AclCommand {
    /// Add a binding.
    Add(AclArgs),
    /// Remove a binding (exactly the one these flags name).
    Remove(AclArgs),
    /// Every binding.
    List {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

/// An answer's error as the command's, with the broker's message where it gave one.
pub(crate) fn refused(error: ErrorCode, message: &str) -> anyhow::Result<()> {
    match error {
        ErrorCode::None => Ok(()),
        _ if message.is_empty() => anyhow::bail!("refused: {error}"),
        _ => anyhow::bail!("refused: {message} ({error})"),
    }
}

fn mechanisms(named: Option<&str>) -> anyhow::Result<Vec<ScramMechanism>> {
    match named {
        None => Ok(ScramMechanism::ALL.to_vec()),
        Some(name) => Ok(vec![
            ScramMechanism::from_name(&name.to_ascii_uppercase()).ok_or_else(|| {
                anyhow::anyhow!("unknown mechanism {name:?} (SCRAM-SHA-256, SCRAM-SHA-512)")
            })?,
        ]),
    }
}

pub async fn user(connection: Connection, command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Create {
            name,
            mechanism,
            iterations,
            password_stdin: _,
        } => {
            check_iterations(iterations).map_err(|error| anyhow::anyhow!("{error}"))?;
            let mechanisms = mechanisms(mechanism.as_deref())?;
            let mut password = String::new();
            std::io::stdin()
                .read_line(&mut password)
                .context("reading the password from stdin")?;
            let password = password.trim_end_matches(['\n', '\r']);
            anyhow::ensure!(!password.is_empty(), "an empty password (read from stdin)");
            let client = connect(&connection).await?;
            let base64 = base64::engine::general_purpose::STANDARD;
            for mechanism in mechanisms {
                let mut salt = [0u8; SALT_BYTES];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
                    .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
                let iterations_nonzero =
                    std::num::NonZeroU32::new(iterations).expect("checked above");
                let salted =
                    mechanism.salted_password(password.as_bytes(), &salt, iterations_nonzero);
                let request = Request::AlterUser(AlterUserRequest {
                    user: name.clone(),
                    mechanism: mechanism.name().into(),
                    delete: false,
                    iterations,
                    salt: base64.encode(salt),
                    salted_password: base64.encode(salted),
                });
                match client.any_broker(request).await? {
                    Response::AlterUser(answer) => refused(answer.error, &answer.message)?,
                    other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
                }
            }
            println!("user {name} set");
        }
        UserCommand::Delete { name, mechanism } => {
            let client = connect(&connection).await?;
            let mut deleted = 0;
            for mechanism in mechanisms(mechanism.as_deref())? {
                let request = Request::AlterUser(AlterUserRequest {
                    user: name.clone(),
                    mechanism: mechanism.name().into(),
                    delete: true,
                    iterations: 0,
                    salt: String::new(),
                    salted_password: String::new(),
                });
                match client.any_broker(request).await? {
                    Response::AlterUser(answer) if answer.error == ErrorCode::None => deleted += 1,
                    Response::AlterUser(_) => {}
                    other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
                }
            }
            anyhow::ensure!(deleted > 0, "no such user credential: {name}");
            println!("user {name}: {deleted} credential(s) deleted");
        }
        UserCommand::List { format } => {
            let client = connect(&connection).await?;
            let users = match client
                .any_broker(Request::DescribeUsers(DescribeUsersRequest { users: None }))
                .await?
            {
                Response::DescribeUsers(answer) => {
                    refused(answer.error, &answer.message)?;
                    answer.users
                }
                other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
            };
            for user in users {
                match format {
                    Format::Json => println!(
                        "{}",
                        json!({"user": user.name, "mechanisms": user.mechanisms, "iterations": user.iterations})
                    ),
                    Format::Text => println!("{}\t{}", user.name, user.mechanisms.join(",")),
                }
            }
        }
    }
    Ok(())
}

pub async fn acl(connection: Connection, command: AclCommand) -> anyhow::Result<()> {
    let client = connect(&connection).await?;
    match command {
        AclCommand::Add(args) => {
            let request = Request::CreateAcls(CreateAclsRequest {
                acls: vec![args.entry()?],
            });
            match client.any_broker(request).await? {
                Response::CreateAcls(answer) => refused(answer.error, &answer.message)?,
                other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
            }
            println!("added");
        }
        AclCommand::Remove(args) => {
            let request = Request::DeleteAcls(DeleteAclsRequest {
                filter: args.entry()?,
            });
            match client.any_broker(request).await? {
                Response::DeleteAcls(answer) => {
                    refused(answer.error, &answer.message)?;
                    anyhow::ensure!(!answer.deleted.is_empty(), "no such binding");
                    println!("removed {}", answer.deleted.len());
                }
                other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
            }
        }
        AclCommand::List { format } => {
            let any = AclEntry {
                resource_type: String::new(),
                resource_name: String::new(),
                pattern_type: String::new(),
                principal: String::new(),
                host: String::new(),
                operation: String::new(),
                permission: String::new(),
            };
            let acls = match client
                .any_broker(Request::DescribeAcls(DescribeAclsRequest { filter: any }))
                .await?
            {
                Response::DescribeAcls(answer) => {
                    refused(answer.error, &answer.message)?;
                    answer.acls
                }
                other => anyhow::bail!("unexpected answer {:?}", other.api_key()),
            };
            for acl in acls {
                match format {
                    Format::Json => println!(
                        "{}",
                        json!({
                            "principal": acl.principal, "host": acl.host,
                            "operation": acl.operation, "permission": acl.permission,
                            "resource_type": acl.resource_type, "resource_name": acl.resource_name,
                            "pattern_type": acl.pattern_type,
                        })
                    ),
                    Format::Text => println!(
                        "{} {} {} from {} on {}:{}:{}",
                        acl.principal,
                        acl.permission,
                        acl.operation,
                        acl.host,
                        acl.resource_type,
                        acl.pattern_type,
                        acl.resource_name
                    ),
                }
            }
        }
    }
    Ok(())
}
