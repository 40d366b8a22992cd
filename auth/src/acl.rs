//! ACLs with Kafka's model and semantics, and the [`Authorizer`] that checks requests
//! against them.
//!
//! A binding ([`AclBinding`]) allows or denies one principal (or `User:*`), from one host (or
//! `*`), one operation on the resources a pattern names: a literal name, the `*` wildcard, or
//! a prefix. A request is allowed when
//! 1. its principal is a super user; otherwise
//! 2. no matching binding denies the operation (a deny of `All` denies everything), and
//! 3. a matching binding allows it, directly or by implication (an allow of Read, Write,
//!    Delete or Alter allows Describe; AlterConfigs allows DescribeConfigs; All allows all);
//!    or, with `allow.everyone.if.no.acl.found`, no binding at all names the resource.
//!
//! These are the rules of Kafka's `StandardAuthorizer`. The [`Authorizer`] is built once per
//! change of the bindings and then only read: a check is a few hash lookups and compares, with
//! no allocation and no lock, so it can run on every produce and fetch.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{AuthError, Principal};

/// The one name a Cluster resource has, as Kafka names it.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The name (literal pattern) that matches every resource of its type.
pub const WILDCARD: &str = "*";

/// Defines an enum with its Kafka wire code and its name as Kafka's tools print it.
macro_rules! kafka_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $code:literal, $text:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $($variant,)* }

        impl $name {
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant,)*];

            /// Kafka's wire code.
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code,)* }
            }

            pub fn from_code(code: i8) -> Option<$name> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// The name Kafka's tools print and take (`Topic`, `IdempotentWrite`).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// Parses a name, ignoring case and `-`/`_` (`idempotent-write`, `IDEMPOTENT_WRITE`).
            pub fn parse(text: &str) -> Option<$name> {
                let wanted: String = text.chars().filter(|c| *c != '-' && *c != '_').collect();
                $name::ALL_VALUES.iter().copied().find(|value| value.name().eq_ignore_ascii_case(&wanted))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

kafka_enum!(
    /// What kind of resource a binding is about.
    ResourceType {
        Topic = 2, "Topic";
        Group = 3, "Group";
        Cluster = 4, "Cluster";
        TransactionalId = 5, "TransactionalId";
    }
);

kafka_enum!(
    /// How a binding's name matches resources.
    PatternType {
        Literal = 3, "Literal";
        Prefixed = 4, "Prefixed";
    }
);

kafka_enum!(
    /// What a request does to a resource.
    Operation {
        All = 2, "All";
        Read = 3, "Read";
        Write = 4, "Write";
        Create = 5, "Create";
        Delete = 6, "Delete";
        Alter = 7, "Alter";
        Describe = 8, "Describe";
        ClusterAction = 9, "ClusterAction";
        DescribeConfigs = 10, "DescribeConfigs";
        AlterConfigs = 11, "AlterConfigs";
        IdempotentWrite = 12, "IdempotentWrite";
    }
);

kafka_enum!(
    /// Whether a binding allows or denies.
    Permission {
        Deny = 2, "Deny";
        Allow = 3, "Allow";
    }
);

impl Operation {
    /// Whether an allow of `self` allows `wanted` (Kafka's implied operations).
    fn allows(self, wanted: Operation) -> bool {
        use Operation::*;
        self == All
            || self == wanted
            || (wanted == Describe && matches!(self, Read | Write | Delete | Alter))
            || (wanted == DescribeConfigs && self == AlterConfigs)
    }

    /// Whether a deny of `self` denies `wanted`: only the operation itself, or All.
    fn denies(self, wanted: Operation) -> bool {
        self == Operation::All || self == wanted
    }
}

/// One ACL, as stored and as Kafka's CreateAcls, DescribeAcls and DeleteAcls carry it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `User:NAME`, or `User:*` for every user.
    pub principal: String,
    /// A client's IP address, or `*` for any.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclBinding {
    /// Refuses what Kafka refuses: a principal that is not `TYPE:NAME`, a host that is not an
    /// IP address or `*`, a cluster resource not named `kafka-cluster`, an empty name, a
    /// prefixed wildcard.
    pub fn validate(&self) -> Result<(), AuthError> {
        Principal::parse(&self.principal)?;
        if self.host != WILDCARD && self.host.parse::<IpAddr>().is_err() {
            return Err(AuthError::Invalid(format!(
                "an ACL's host is an IP address or *, not {:?}",
                self.host
            )));
        }
        if self.resource_name.is_empty() {
            return Err(AuthError::Invalid("an ACL's resource name is empty".into()));
        }
        if self.resource_type == ResourceType::Cluster
            && (self.resource_name != CLUSTER_NAME || self.pattern_type != PatternType::Literal)
        {
            return Err(AuthError::Invalid(format!(
                "the cluster resource is the literal {CLUSTER_NAME}"
            )));
        }
        if self.pattern_type == PatternType::Prefixed && self.resource_name == WILDCARD {
            return Err(AuthError::Invalid(
                "a prefixed ACL cannot be the * wildcard: use a literal *".into(),
            ));
        }
        Ok(())
    }

    /// Kafka's one-line rendering (`kafka-acls --list` prints much the same).
    pub fn describe(&self) -> String {
        format!(
            "{} {} {} from {} on {}:{}:{}",
            self.principal,
            self.permission,
            self.operation,
            self.host,
            self.resource_type,
            self.pattern_type,
            self.resource_name
        )
    }
}

/// How a filter's name matches a binding's pattern (Kafka's `PatternType` in filters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternFilter {
    /// Any pattern type, the name compared as it is.
    Any,
    /// Every binding that would apply to a resource of this name: the literal name, the `*`
    /// wildcard, and every prefix of the name.
    Match,
    Exactly(PatternType),
}

/// Selects bindings (DescribeAcls, DeleteAcls, `strata acl list`): each `None` matches
/// anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub resource_name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    /// The filter that matches every binding.
    pub fn any() -> AclFilter {
        AclFilter {
            resource_type: None,
            resource_name: None,
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        }
    }

    /// The filter that matches exactly this binding (deleting one binding).
    pub fn exactly(binding: &AclBinding) -> AclFilter {
        AclFilter {
            resource_type: Some(binding.resource_type),
            resource_name: Some(binding.resource_name.clone()),
            pattern: PatternFilter::Exactly(binding.pattern_type),
            principal: Some(binding.principal.clone()),
            host: Some(binding.host.clone()),
            operation: Some(binding.operation),
            permission: Some(binding.permission),
        }
    }

    pub fn matches(&self, binding: &AclBinding) -> bool {
        let name_matches = match (&self.resource_name, self.pattern) {
            (None, PatternFilter::Exactly(pattern)) => binding.pattern_type == pattern,
            (None, _) => true,
            (Some(name), PatternFilter::Any) => &binding.resource_name == name,
            (Some(name), PatternFilter::Exactly(pattern)) => {
                binding.pattern_type == pattern && &binding.resource_name == name
            }
            (Some(name), PatternFilter::Match) => match binding.pattern_type {
                PatternType::Literal => {
                    &binding.resource_name == name || binding.resource_name == WILDCARD
                }
                PatternType::Prefixed => name.starts_with(&binding.resource_name),
            },
        };
        name_matches
            && self
                .resource_type
                .is_none_or(|kind| kind == binding.resource_type)
            && self
                .principal
                .as_ref()
                .is_none_or(|principal| principal == &binding.principal)
            && self.host.as_ref().is_none_or(|host| host == &binding.host)
            && self
                .operation
                .is_none_or(|operation| operation == binding.operation)
            && self
                .permission
                .is_none_or(|permission| permission == binding.permission)
    }
}

/// One binding as the authorizer keeps it: what to compare on a check.
#[derive(Debug, Clone)]
struct Rule {
    /// `None`: every principal (`User:*`).
    principal: Option<Box<str>>,
    /// `None`: every host.
    host: Option<IpAddr>,
    operation: Operation,
    permission: Permission,
}

impl Rule {
    fn applies(&self, principal: &Principal, host: Option<IpAddr>) -> bool {
        self.principal
            .as_deref()
            .is_none_or(|wanted| wanted == principal.as_str())
            && self.host.is_none_or(|wanted| Some(wanted) == host)
    }
}

/// The bindings of one resource type, indexed by how they match names.
#[derive(Debug, Clone, Default)]
struct ResourceRules {
    literal: HashMap<Box<str>, Vec<Rule>>,
    wildcard: Vec<Rule>,
    prefixed: HashMap<Box<str>, Vec<Rule>>,
    /// The lengths of the prefixes in `prefixed`, ascending: a check looks each length up.
    prefix_lens: Vec<usize>,
}

impl ResourceRules {
    /// Every rule naming `name`, by group.
    fn matching<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        let literal = self.literal.get(name).into_iter().flatten();
        let prefixed = self
            .prefix_lens
            .iter()
            .take_while(move |&&len| len <= name.len())
            .filter_map(move |&len| name.get(..len))
            .filter_map(|prefix| self.prefixed.get(prefix))
            .flatten();
        literal.chain(self.wildcard.iter()).chain(prefixed)
    }
}

/// Settings of the authorizer that are not bindings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// Principals allowed everything (`--super-users`).
    pub super_users: Vec<Principal>,
    /// Kafka's `allow.everyone.if.no.acl.found`: a resource no binding names is open to all.
    pub allow_everyone_if_no_acl_found: bool,
}

/// Bindings compiled for checking.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    config: AuthorizerConfig,
    by_type: [ResourceRules; 4],
    bindings: usize,
}

fn type_index(kind: ResourceType) -> usize {
    match kind {
        ResourceType::Topic => 0,
        ResourceType::Group => 1,
        ResourceType::Cluster => 2,
        ResourceType::TransactionalId => 3,
    }
}

impl Authorizer {
    /// Compiles `bindings` (invalid ones are skipped: they were refused when created, so one
    /// here came from a newer or damaged store, and matching nothing is the safe reading).
    pub fn new<'a>(
        config: AuthorizerConfig,
        bindings: impl IntoIterator<Item = &'a AclBinding>,
    ) -> Authorizer {
        let mut authorizer = Authorizer {
            config,
            ..Authorizer::default()
        };
        for binding in bindings {
            if binding.validate().is_err() {
                continue;
            }
            let rule = Rule {
                principal: (binding.principal != "User:*")
                    .then(|| binding.principal.as_str().into()),
                host: binding.host.parse().ok(),
                operation: binding.operation,
                permission: binding.permission,
            };
            let rules = &mut authorizer.by_type[type_index(binding.resource_type)];
            let name: Box<str> = binding.resource_name.as_str().into();
            match binding.pattern_type {
                PatternType::Literal if binding.resource_name == WILDCARD => {
                    rules.wildcard.push(rule)
                }
                PatternType::Literal => rules.literal.entry(name).or_default().push(rule),
                PatternType::Prefixed => {
                    if !rules.prefix_lens.contains(&name.len()) {
                        rules.prefix_lens.push(name.len());
                        rules.prefix_lens.sort_unstable();
                    }
                    rules.prefixed.entry(name).or_default().push(rule)
                }
            }
            authorizer.bindings += 1;
        }
        authorizer
    }

    /// How many bindings it checks against.
    pub fn len(&self) -> usize {
        self.bindings
    }

    pub fn is_empty(&self) -> bool {
        self.bindings == 0
    }

    pub fn is_super_user(&self, principal: &Principal) -> bool {
        self.config.super_users.contains(principal)
    }

    /// Whether `principal`, connected from `host`, may do `operation` on the resource
    /// `kind`/`name`. `host` is `None` where no address is known (matching only `*`).
    pub fn authorize(
        &self,
        principal: &Principal,
        host: Option<IpAddr>,
        operation: Operation,
        kind: ResourceType,
        name: &str,
    ) -> bool {
        if self.is_super_user(principal) {
            return true;
        }
        let mut any_rule = false;
        let mut allowed = false;
        for rule in self.by_type[type_index(kind)].matching(name) {
            any_rule = true;
            if !rule.applies(principal, host) {
                continue;
            }
            match rule.permission {
                Permission::Deny if rule.operation.denies(operation) => return false,
                Permission::Allow if rule.operation.allows(operation) => allowed = true,
                _ => {}
            }
        }
        allowed || (!any_rule && self.config.allow_everyone_if_no_acl_found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(
        kind: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        operation: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: kind,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: "*".into(),
            operation,
            permission,
        }
    }

    fn allow_topic(name: &str, pattern: PatternType, principal: &str, op: Operation) -> AclBinding {
        binding(
            ResourceType::Topic,
            name,
            pattern,
            principal,
            op,
            Permission::Allow,
        )
    }

    const ALICE: &str = "User:alice";

    fn alice() -> Principal {
        Principal::user("alice")
    }

    fn check(authorizer: &Authorizer, op: Operation, topic: &str) -> bool {
        authorizer.authorize(&alice(), None, op, ResourceType::Topic, topic)
    }

    #[test]
    fn nothing_is_allowed_without_a_binding_unless_configured() {
        let closed = Authorizer::new(AuthorizerConfig::default(), []);
        assert!(!check(&closed, Operation::Read, "orders"));
        let open = Authorizer::new(
            AuthorizerConfig {
                allow_everyone_if_no_acl_found: true,
                ..Default::default()
            },
            [],
        );
        assert!(check(&open, Operation::Read, "orders"));
        // Any binding on the resource, even for someone else, closes it.
        let bob_only = [allow_topic(
            "orders",
            PatternType::Literal,
            "User:bob",
            Operation::Read,
        )];
        let open = Authorizer::new(
            AuthorizerConfig {
                allow_everyone_if_no_acl_found: true,
                ..Default::default()
            },
            &bob_only,
        );
        assert!(!check(&open, Operation::Read, "orders"));
        assert!(check(&open, Operation::Read, "payments"));
    }

    #[test]
    fn literal_wildcard_and_prefixed_patterns_match_as_kafkas() {
        let bindings = [
            allow_topic("orders", PatternType::Literal, ALICE, Operation::Write),
            allow_topic("*", PatternType::Literal, ALICE, Operation::Describe),
            allow_topic("orders-", PatternType::Prefixed, ALICE, Operation::Read),
        ];
        let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
        assert!(check(&authorizer, Operation::Write, "orders"));
        assert!(!check(&authorizer, Operation::Write, "orders-eu"));
        assert!(check(&authorizer, Operation::Read, "orders-eu"));
        assert!(check(&authorizer, Operation::Read, "orders-"));
        assert!(!check(&authorizer, Operation::Read, "orders"));
        assert!(check(&authorizer, Operation::Describe, "anything"));
        assert!(!authorizer.authorize(
            &Principal::user("bob"),
            None,
            Operation::Read,
            ResourceType::Topic,
            "orders-eu"
        ));
        // Another resource type with the same name is another resource.
        assert!(!authorizer.authorize(
            &alice(),
            None,
            Operation::Read,
            ResourceType::Group,
            "orders-eu"
        ));
    }

    #[test]
    fn deny_wins_over_allow_and_deny_all_denies_everything() {
        let bindings = [
            allow_topic("orders", PatternType::Literal, "User:*", Operation::All),
            binding(
                ResourceType::Topic,
                "orders",
                PatternType::Literal,
                ALICE,
                Operation::Write,
                Permission::Deny,
            ),
        ];
        let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
        assert!(!check(&authorizer, Operation::Write, "orders"));
        assert!(check(&authorizer, Operation::Read, "orders"));
        let bindings = [
            allow_topic("orders", PatternType::Literal, ALICE, Operation::Read),
            binding(
                ResourceType::Topic,
                "ord",
                PatternType::Prefixed,
                "User:*",
                Operation::All,
                Permission::Deny,
            ),
        ];
        let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
        assert!(!check(&authorizer, Operation::Read, "orders"));
        assert!(!check(&authorizer, Operation::Describe, "orders"));
    }

    #[test]
    fn implied_operations_are_kafkas() {
        for (granted, wanted, allowed) in [
            (Operation::Read, Operation::Describe, true),
            (Operation::Write, Operation::Describe, true),
            (Operation::Delete, Operation::Describe, true),
            (Operation::Alter, Operation::Describe, true),
            (Operation::Create, Operation::Describe, false),
            (Operation::AlterConfigs, Operation::DescribeConfigs, true),
            (Operation::DescribeConfigs, Operation::AlterConfigs, false),
            (Operation::Describe, Operation::Read, false),
            (Operation::All, Operation::IdempotentWrite, true),
            (Operation::Write, Operation::Read, false),
        ] {
            let bindings = [allow_topic("t", PatternType::Literal, ALICE, granted)];
            let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
            assert_eq!(
                check(&authorizer, wanted, "t"),
                allowed,
                "{granted} -> {wanted}"
            );
        }
        // A deny of Describe does not deny Read (Kafka denies only the operation or All).
        let bindings = [
            allow_topic("t", PatternType::Literal, ALICE, Operation::Read),
            binding(
                ResourceType::Topic,
                "t",
                PatternType::Literal,
                ALICE,
                Operation::Describe,
                Permission::Deny,
            ),
        ];
        let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
        assert!(check(&authorizer, Operation::Read, "t"));
        assert!(!check(&authorizer, Operation::Describe, "t"));
    }

    #[test]
    fn hosts_and_super_users() {
        let mut only_from = allow_topic("t", PatternType::Literal, ALICE, Operation::Read);
        only_from.host = "10.0.0.1".into();
        let authorizer = Authorizer::new(
            AuthorizerConfig {
                super_users: vec![Principal::user("admin")],
                ..Default::default()
            },
            [&only_from],
        );
        let read = |host: &str| {
            authorizer.authorize(
                &alice(),
                host.parse().ok(),
                Operation::Read,
                ResourceType::Topic,
                "t",
            )
        };
        assert!(read("10.0.0.1"));
        assert!(!read("10.0.0.2"));
        assert!(!read("unknown"));
        assert!(authorizer.authorize(
            &Principal::user("admin"),
            None,
            Operation::Alter,
            ResourceType::Cluster,
            CLUSTER_NAME
        ));
    }

    #[test]
    fn invalid_bindings_are_refused() {
        let good = allow_topic("t", PatternType::Literal, ALICE, Operation::Read);
        good.validate().unwrap();
        let mut bad = good.clone();
        bad.principal = "alice".into();
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.host = "example.com".into();
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.resource_type = ResourceType::Cluster;
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.pattern_type = PatternType::Prefixed;
        bad.resource_name = "*".into();
        assert!(bad.validate().is_err());
        // An invalid binding that reached the store matches nothing.
        let authorizer = Authorizer::new(AuthorizerConfig::default(), [&bad]);
        assert!(authorizer.is_empty());
    }

    #[test]
    fn filters_select_as_kafkas_describe_and_delete() {
        let bindings = [
            allow_topic("orders", PatternType::Literal, ALICE, Operation::Read),
            allow_topic("*", PatternType::Literal, ALICE, Operation::Read),
            allow_topic("ord", PatternType::Prefixed, "User:bob", Operation::Write),
            binding(
                ResourceType::Group,
                "orders",
                PatternType::Literal,
                ALICE,
                Operation::Read,
                Permission::Allow,
            ),
        ];
        let select = |filter: &AclFilter| bindings.iter().filter(|b| filter.matches(b)).count();
        assert_eq!(select(&AclFilter::any()), 4);
        let mut filter = AclFilter::any();
        filter.resource_type = Some(ResourceType::Topic);
        filter.resource_name = Some("orders".into());
        assert_eq!(select(&filter), 1);
        filter.pattern = PatternFilter::Match;
        assert_eq!(select(&filter), 3);
        filter.principal = Some("User:bob".into());
        assert_eq!(select(&filter), 1);
        assert_eq!(select(&AclFilter::exactly(&bindings[2])), 1);
    }

    #[test]
    fn names_parse_as_kafkas_tools_write_them() {
        assert_eq!(
            Operation::parse("idempotent-write"),
            Some(Operation::IdempotentWrite)
        );
        assert_eq!(
            Operation::parse("IDEMPOTENT_WRITE"),
            Some(Operation::IdempotentWrite)
        );
        assert_eq!(
            ResourceType::parse("transactional-id"),
            Some(ResourceType::TransactionalId)
        );
        assert_eq!(Operation::parse("fly"), None);
        for op in Operation::ALL_VALUES {
            assert_eq!(Operation::from_code(op.code()), Some(*op));
        }
    }

    #[test]
    fn a_thousand_bindings_still_answer_by_lookup() {
        let bindings: Vec<AclBinding> = (0..1000)
            .map(|i| {
                allow_topic(
                    &format!("team-{i}-"),
                    PatternType::Prefixed,
                    ALICE,
                    Operation::Write,
                )
            })
            .collect();
        let authorizer = Authorizer::new(AuthorizerConfig::default(), &bindings);
        assert_eq!(authorizer.len(), 1000);
        assert!(check(&authorizer, Operation::Write, "team-999-events"));
        assert!(!check(&authorizer, Operation::Write, "team-1000-events"));
    }
}
