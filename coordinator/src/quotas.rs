//! Client quotas as the coordinator keeps them (Kafka's `/config/users` and `/config/clients`):
//! limits on produce and fetch byte rates and on the share of request-handling time, set per
//! user, per client id, or per both, each a name or the default for any. Every broker enforces
//! them on its own traffic; they are stored once for the cluster and reach every broker through
//! the watch that carries topic changes.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::CoordinatorError;

/// One part of a quota entity: a name, or the default that applies to every name without one
/// of its own (Kafka's `<default>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EntityName {
    Named(String),
    Default,
}

impl EntityName {
    /// Kafka's wire form: the name, or null for the default.
    pub fn as_option(&self) -> Option<&str> {
        match self {
            EntityName::Named(name) => Some(name),
            EntityName::Default => None,
        }
    }

    pub fn from_option(name: Option<&str>) -> EntityName {
        name.map_or(EntityName::Default, |name| EntityName::Named(name.into()))
    }
}

impl fmt::Display for EntityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntityName::Named(name) => f.write_str(name),
            EntityName::Default => f.write_str("<default>"),
        }
    }
}

/// Who a quota applies to: a user, a client id, or a user's client id. At least one is set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QuotaEntity {
    pub user: Option<EntityName>,
    pub client_id: Option<EntityName>,
}

impl QuotaEntity {
    /// An entity that can be stored: at least one part, names of at most 255 bytes without
    /// control characters (a client id may be empty, as Kafka's may).
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        if self.user.is_none() && self.client_id.is_none() {
            return Err(CoordinatorError::InvalidArgument(
                "a quota entity names a user, a client id or both".into(),
            ));
        }
        if let Some(EntityName::Named(user)) = &self.user {
            crate::security::validate_user_name(user)?;
        }
        if let Some(EntityName::Named(client_id)) = &self.client_id
            && (client_id.len() > 255 || client_id.chars().any(char::is_control))
        {
            return Err(CoordinatorError::InvalidArgument(format!(
                "a client id is at most 255 bytes without control characters, not {client_id:?}"
            )));
        }
        Ok(())
    }
}

/// The entity types Kafka names a quota entity's parts by.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";

impl QuotaEntity {
    /// The entity of Kafka's (entity type, name or null for the default) parts: `user` and
    /// `client-id`, each at most once.
    pub fn from_parts<'a>(
        parts: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<QuotaEntity, CoordinatorError> {
        let mut entity = QuotaEntity {
            user: None,
            client_id: None,
        };
        for (kind, name) in parts {
            let part = match kind {
                USER => &mut entity.user,
                CLIENT_ID => &mut entity.client_id,
                "ip" => {
                    return Err(CoordinatorError::InvalidArgument(
                        "IP quotas (connection_creation_rate) are not enforced by Strata".into(),
                    ));
                }
                other => {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "unknown quota entity type {other:?}: user or client-id"
                    )));
                }
            };
            if part.is_some() {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "the entity type {kind} is given twice"
                )));
            }
            *part = Some(EntityName::from_option(name));
        }
        entity.validate()?;
        Ok(entity)
    }

    /// Kafka's (entity type, name or null for the default) parts, user first.
    pub fn parts(&self) -> Vec<(&'static str, Option<&str>)> {
        let mut parts = Vec::with_capacity(2);
        if let Some(user) = &self.user {
            parts.push((USER, user.as_option()));
        }
        if let Some(client_id) = &self.client_id {
            parts.push((CLIENT_ID, client_id.as_option()));
        }
        parts
    }
}

/// How a filter matches one part of an entity (Kafka's match types 0, 1 and 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaMatch {
    Exactly(String),
    Default,
    /// Any name or the default, as long as the entity has this part.
    Any,
}

/// Which entities a describe answers: each part given must match; with `strict`, an entity may
/// have no part the filter leaves out (Kafka's DescribeClientQuotas filter).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaFilter {
    pub user: Option<QuotaMatch>,
    pub client_id: Option<QuotaMatch>,
    pub strict: bool,
}

impl QuotaFilter {
    /// The filter of Kafka's (entity type, match type, name) components.
    pub fn from_components<'a>(
        components: impl IntoIterator<Item = (&'a str, i8, Option<&'a str>)>,
        strict: bool,
    ) -> Result<QuotaFilter, CoordinatorError> {
        let mut filter = QuotaFilter {
            strict,
            ..QuotaFilter::default()
        };
        for (kind, match_type, name) in components {
            let matching = match (match_type, name) {
                (0, Some(name)) => QuotaMatch::Exactly(name.to_string()),
                (1, _) => QuotaMatch::Default,
                (2, _) => QuotaMatch::Any,
                (0, None) => {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "an exact match of {kind} needs a name"
                    )));
                }
                (other, _) => {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "unknown match type {other}"
                    )));
                }
            };
            let part = match kind {
                USER => &mut filter.user,
                CLIENT_ID => &mut filter.client_id,
                other => {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "unknown quota entity type {other:?}: user or client-id"
                    )));
                }
            };
            if part.is_some() {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "the entity type {kind} is filtered twice"
                )));
            }
            *part = Some(matching);
        }
        Ok(filter)
    }

    pub fn matches(&self, entity: &QuotaEntity) -> bool {
        fn part(filter: &Option<QuotaMatch>, name: &Option<EntityName>, strict: bool) -> bool {
            match (filter, name) {
                (None, None) => true,
                (None, Some(_)) => !strict,
                (Some(_), None) => false,
                (Some(QuotaMatch::Any), Some(_)) => true,
                (Some(QuotaMatch::Default), Some(name)) => *name == EntityName::Default,
                (Some(QuotaMatch::Exactly(wanted)), Some(name)) => {
                    name.as_option() == Some(wanted.as_str())
                }
            }
        }
        part(&self.user, &entity.user, self.strict)
            && part(&self.client_id, &entity.client_id, self.strict)
    }
}

impl fmt::Display for QuotaEntity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.user, &self.client_id) {
            (Some(user), Some(client_id)) => write!(f, "user={user},client-id={client_id}"),
            (Some(user), None) => write!(f, "user={user}"),
            (None, Some(client_id)) => write!(f, "client-id={client_id}"),
            (None, None) => f.write_str("(nobody)"),
        }
    }
}

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QuotaKey {
    /// Bytes per second of produce requests.
    ProducerByteRate,
    /// Bytes per second of fetch answers.
    ConsumerByteRate,
    /// Percent of one request-handling thread's time (100: one whole thread).
    RequestPercentage,
}

impl QuotaKey {
    pub const ALL: [QuotaKey; 3] = [
        QuotaKey::ProducerByteRate,
        QuotaKey::ConsumerByteRate,
        QuotaKey::RequestPercentage,
    ];

    /// Kafka's name.
    pub fn name(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
        }
    }

    /// The key of Kafka name `name`, or why it cannot be set here.
    pub fn parse(name: &str) -> Result<QuotaKey, CoordinatorError> {
        if let Some(key) = QuotaKey::ALL.into_iter().find(|key| key.name() == name) {
            return Ok(key);
        }
        let why = match name {
            "controller_mutation_rate" => {
                "controller_mutation_rate is not enforced by Strata (topic changes are not throttled)"
                    .to_string()
            }
            "connection_creation_rate" => {
                "connection_creation_rate (IP quotas) is not enforced by Strata".to_string()
            }
            _ => format!(
                "unknown quota {name:?}: one of producer_byte_rate, consumer_byte_rate, request_percentage"
            ),
        };
        Err(CoordinatorError::InvalidArgument(why))
    }

    /// A value this quota can take: positive and finite; byte rates whole numbers.
    pub fn validate(self, value: f64) -> Result<(), CoordinatorError> {
        let whole = matches!(
            self,
            QuotaKey::ProducerByteRate | QuotaKey::ConsumerByteRate
        );
        if !value.is_finite() || value <= 0.0 || (whole && value.fract() != 0.0) {
            let kind = if whole {
                "a whole number of bytes per second above 0"
            } else {
                "a percentage above 0"
            };
            return Err(CoordinatorError::InvalidArgument(format!(
                "{} must be {kind}, not {value}",
                self.name()
            )));
        }
        Ok(())
    }
}

/// One entity's quotas, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaRecord {
    pub entity: QuotaEntity,
    /// Never empty: an entity whose last quota is removed is not stored.
    pub values: BTreeMap<QuotaKey, f64>,
}

/// Changes to one entity's quotas: each key set to a value, or removed (`None`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaAlteration {
    pub entity: QuotaEntity,
    pub changes: Vec<(QuotaKey, Option<f64>)>,
}

impl QuotaAlteration {
    /// An alteration that can be applied: a valid entity, valid values, each key at most once.
    pub fn validate(&self) -> Result<(), CoordinatorError> {
        self.entity.validate()?;
        for (at, (key, value)) in self.changes.iter().enumerate() {
            if self.changes[..at].iter().any(|(earlier, _)| earlier == key) {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "{} is changed twice for {}",
                    key.name(),
                    self.entity
                )));
            }
            if let Some(value) = value {
                key.validate(*value)?;
            }
        }
        Ok(())
    }

    /// The entity's values after this alteration, from `current`.
    pub fn apply(&self, current: &BTreeMap<QuotaKey, f64>) -> BTreeMap<QuotaKey, f64> {
        let mut values = current.clone();
        for (key, value) in &self.changes {
            match value {
                Some(value) => values.insert(*key, *value),
                None => values.remove(key),
            };
        }
        values
    }
}

/// Applies validated `alterations` to `records` (kept in entity order, without empty ones).
pub(crate) fn apply_all(records: &mut Vec<QuotaRecord>, alterations: &[QuotaAlteration]) {
    for alteration in alterations {
        let at = records.binary_search_by(|record| record.entity.cmp(&alteration.entity));
        let current = at.map(|at| records[at].values.clone()).unwrap_or_default();
        let values = alteration.apply(&current);
        match (at, values.is_empty()) {
            (Ok(at), true) => {
                records.remove(at);
            }
            (Ok(at), false) => records[at].values = values,
            (Err(_), true) => {}
            (Err(at), false) => records.insert(
                at,
                QuotaRecord {
                    entity: alteration.entity.clone(),
                    values,
                },
            ),
        }
    }
}

/// Checks every alteration before any is applied.
pub(crate) fn check_alterations(alterations: &[QuotaAlteration]) -> Result<(), CoordinatorError> {
    alterations.iter().try_for_each(QuotaAlteration::validate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> QuotaEntity {
        QuotaEntity {
            user: Some(EntityName::Named(name.into())),
            client_id: None,
        }
    }

    #[test]
    fn values_are_checked_by_their_key() {
        assert!(QuotaKey::ProducerByteRate.validate(1024.0).is_ok());
        assert!(QuotaKey::ProducerByteRate.validate(1024.5).is_err());
        assert!(QuotaKey::ConsumerByteRate.validate(0.0).is_err());
        assert!(QuotaKey::RequestPercentage.validate(12.5).is_ok());
        assert!(QuotaKey::RequestPercentage.validate(f64::NAN).is_err());
        assert!(QuotaKey::RequestPercentage.validate(-1.0).is_err());
        assert!(QuotaKey::parse("controller_mutation_rate").is_err());
        assert_eq!(
            QuotaKey::parse("consumer_byte_rate").unwrap(),
            QuotaKey::ConsumerByteRate
        );
    }

    #[test]
    fn entities_need_a_part_and_valid_names() {
        let nobody = QuotaEntity {
            user: None,
            client_id: None,
        };
        assert!(nobody.validate().is_err());
        assert!(user("").validate().is_err());
        let empty_client = QuotaEntity {
            user: None,
            client_id: Some(EntityName::Named(String::new())),
        };
        assert!(empty_client.validate().is_ok());
        assert_eq!(
            QuotaEntity {
                user: Some(EntityName::Default),
                client_id: Some(EntityName::Named("app".into())),
            }
            .to_string(),
            "user=<default>,client-id=app"
        );
    }

    #[test]
    fn filters_match_as_kafkas_do() {
        let entity = |user: Option<EntityName>, client_id: Option<EntityName>| QuotaEntity {
            user,
            client_id,
        };
        let alice_app = entity(
            Some(EntityName::Named("alice".into())),
            Some(EntityName::Named("app".into())),
        );
        let alice = entity(Some(EntityName::Named("alice".into())), None);
        let default_user = entity(Some(EntityName::Default), None);
        let any_alice = QuotaFilter::from_components([(USER, 0, Some("alice"))], false).unwrap();
        assert!(any_alice.matches(&alice_app) && any_alice.matches(&alice));
        assert!(!any_alice.matches(&default_user));
        let only_alice = QuotaFilter::from_components([(USER, 0, Some("alice"))], true).unwrap();
        assert!(only_alice.matches(&alice) && !only_alice.matches(&alice_app));
        let defaults = QuotaFilter::from_components([(USER, 1, None)], true).unwrap();
        assert!(defaults.matches(&default_user) && !defaults.matches(&alice));
        let users = QuotaFilter::from_components([(USER, 2, None)], false).unwrap();
        assert!(users.matches(&alice_app) && users.matches(&default_user));
        assert!(
            QuotaFilter::default().matches(&alice_app),
            "no components: everything"
        );
        assert!(QuotaFilter::from_components([(USER, 0, None)], false).is_err());
        assert!(QuotaFilter::from_components([(USER, 2, None), (USER, 1, None)], false).is_err());
        assert!(QuotaFilter::from_components([("group", 2, None)], false).is_err());
        assert_eq!(
            QuotaEntity::from_parts(alice_app.parts()).unwrap(),
            alice_app
        );
        assert!(QuotaEntity::from_parts([(USER, Some("a")), (USER, None)]).is_err());
        assert!(QuotaEntity::from_parts([("ip", Some("10.0.0.1"))]).is_err());
        assert!(QuotaEntity::from_parts([]).is_err());
    }

    #[test]
    fn alterations_set_replace_and_remove() {
        let mut records = Vec::new();
        let set = QuotaAlteration {
            entity: user("alice"),
            changes: vec![
                (QuotaKey::ProducerByteRate, Some(100.0)),
                (QuotaKey::ConsumerByteRate, Some(200.0)),
            ],
        };
        apply_all(&mut records, &[set]);
        apply_all(
            &mut records,
            &[QuotaAlteration {
                entity: user("bob"),
                changes: vec![(QuotaKey::RequestPercentage, Some(50.0))],
            }],
        );
        assert_eq!(records.len(), 2);
        apply_all(
            &mut records,
            &[QuotaAlteration {
                entity: user("alice"),
                changes: vec![
                    (QuotaKey::ProducerByteRate, None),
                    (QuotaKey::ConsumerByteRate, Some(300.0)),
                ],
            }],
        );
        assert_eq!(
            records[0].values,
            BTreeMap::from([(QuotaKey::ConsumerByteRate, 300.0)])
        );
        apply_all(
            &mut records,
            &[QuotaAlteration {
                entity: user("alice"),
                changes: vec![(QuotaKey::ConsumerByteRate, None)],
            }],
        );
        assert_eq!(records.len(), 1, "an entity without quotas is not kept");
        assert_eq!(records[0].entity, user("bob"));
        let twice = QuotaAlteration {
            entity: user("bob"),
            changes: vec![
                (QuotaKey::RequestPercentage, Some(1.0)),
                (QuotaKey::RequestPercentage, None),
            ],
        };
        assert!(twice.validate().is_err());
    }
}
