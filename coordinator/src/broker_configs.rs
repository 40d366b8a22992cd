//! Dynamic broker settings as the coordinator keeps them (Kafka's dynamic broker configs,
//! `kafka-configs --entity-type brokers --entity-default | --entity-name ID`): values set while
//! the cluster runs, for every broker (the cluster-wide default) or for one, stored once for
//! the cluster and carried to every broker by the watch that carries topic changes. Which
//! names may be set and which values they take is the broker's to say: this module stores
//! checked strings.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::CoordinatorError;

/// Whom a dynamic setting applies to: every broker without one of its own, or one broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerScope {
    /// Kafka's `<default>` broker entity: the resource named "".
    Default,
    Broker(i32),
}

impl BrokerScope {
    /// The scope a Kafka BROKER resource name means: "" is the default, else a broker id.
    pub fn from_resource_name(name: &str) -> Option<BrokerScope> {
        if name.is_empty() {
            return Some(BrokerScope::Default);
        }
        name.parse::<i32>()
            .ok()
            .filter(|id| *id >= 0)
            .map(BrokerScope::Broker)
    }

    /// The Kafka resource name of the scope.
    pub fn resource_name(self) -> String {
        match self {
            BrokerScope::Default => String::new(),
            BrokerScope::Broker(id) => id.to_string(),
        }
    }
}

impl fmt::Display for BrokerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerScope::Default => f.write_str("<default>"),
            BrokerScope::Broker(id) => write!(f, "broker {id}"),
        }
    }
}

/// The dynamic settings of one scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerConfigRecord {
    pub scope: BrokerScope,
    pub values: BTreeMap<String, String>,
}

/// A change to one scope's settings: with `replace`, `set` becomes the whole of them (Kafka's
/// legacy AlterConfigs); otherwise `set` adds or replaces and `delete` removes
/// (IncrementalAlterConfigs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfigAlteration {
    pub scope: BrokerScope,
    pub set: BTreeMap<String, String>,
    pub delete: Vec<String>,
    pub replace: bool,
}

impl BrokerConfigAlteration {
    /// What `current` becomes.
    pub fn apply(&self, current: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        altered_values(current, &self.set, &self.delete, self.replace)
    }

    /// A stored name is never empty, and a scope is never a negative broker id.
    pub fn check(&self) -> Result<(), CoordinatorError> {
        if let BrokerScope::Broker(id) = self.scope
            && id < 0
        {
            return Err(CoordinatorError::Invalid(format!(
                "broker id {id} is negative"
            )));
        }
        check_names(&self.set, &self.delete, "a broker setting's name is empty")
    }
}

/// What a scope's stored values `current` become under a change: with `replace`, `set` is the
/// whole of them; otherwise `delete` removes and `set` adds or replaces. Shared by every
/// alteration of named string values (broker settings, group configs).
pub(crate) fn altered_values(
    current: &BTreeMap<String, String>,
    set: &BTreeMap<String, String>,
    delete: &[String],
    replace: bool,
) -> BTreeMap<String, String> {
    let mut next = if replace {
        BTreeMap::new()
    } else {
        current.clone()
    };
    for name in delete {
        next.remove(name);
    }
    next.extend(
        set.iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    next
}

/// Refuses an alteration naming a blank setting (`empty` says which kind): a stored name is
/// never empty.
pub(crate) fn check_names(
    set: &BTreeMap<String, String>,
    delete: &[String],
    empty: &str,
) -> Result<(), CoordinatorError> {
    if set.keys().chain(delete).any(|name| name.trim().is_empty()) {
        return Err(CoordinatorError::Invalid(empty.to_string()));
    }
    Ok(())
}

/// Applies `alteration` to `records`, dropping a scope left with no settings.
pub fn apply(records: &mut Vec<BrokerConfigRecord>, alteration: &BrokerConfigAlteration) {
    let current = records
        .iter()
        .find(|record| record.scope == alteration.scope)
        .map(|record| record.values.clone())
        .unwrap_or_default();
    let values = alteration.apply(&current);
    records.retain(|record| record.scope != alteration.scope);
    if !values.is_empty() {
        records.push(BrokerConfigRecord {
            scope: alteration.scope,
            values,
        });
    }
    records.sort_by_key(|record| record.scope);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn resource_names_are_the_default_or_a_broker_id() {
        assert_eq!(
            BrokerScope::from_resource_name(""),
            Some(BrokerScope::Default)
        );
        assert_eq!(
            BrokerScope::from_resource_name("2"),
            Some(BrokerScope::Broker(2))
        );
        assert_eq!(BrokerScope::from_resource_name("-1"), None);
        assert_eq!(BrokerScope::from_resource_name("two"), None);
        assert_eq!(BrokerScope::Broker(2).resource_name(), "2");
    }

    #[test]
    fn alterations_set_delete_or_replace_and_empty_scopes_go() {
        let mut records = Vec::new();
        let set = |pairs: &[(&str, &str)], delete: &[&str], replace| BrokerConfigAlteration {
            scope: BrokerScope::Default,
            set: values(pairs),
            delete: delete.iter().map(|d| d.to_string()).collect(),
            replace,
        };
        apply(&mut records, &set(&[("a", "1"), ("b", "2")], &[], false));
        apply(&mut records, &set(&[("c", "3")], &["a"], false));
        assert_eq!(records[0].values, values(&[("b", "2"), ("c", "3")]));
        apply(&mut records, &set(&[("d", "4")], &[], true));
        assert_eq!(records[0].values, values(&[("d", "4")]));
        apply(&mut records, &set(&[], &["d"], false));
        assert!(records.is_empty());
        assert!(set(&[(" ", "1")], &[], false).check().is_err());
    }
}
