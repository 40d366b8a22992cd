//! Group configs as the coordinator keeps them (Kafka's GROUP config resources, KIP-848 and
//! KIP-932, `kafka-configs --entity-type groups --entity-name GROUP`): settings of one consumer
//! or share group, set while the cluster runs, stored once for the cluster and carried to
//! every broker by the watch that carries topic changes, so whichever broker coordinates the
//! group applies them. Which names a group may set and which values they take is the broker's
//! to say: this module stores checked strings, as [`crate::broker_configs`] does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::CoordinatorError;
use crate::broker_configs::{altered_values, check_names};

/// The configs set on one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfigRecord {
    pub group: String,
    pub values: BTreeMap<String, String>,
}

/// A change to one group's configs: with `replace`, `set` becomes the whole of them (Kafka's
/// legacy AlterConfigs); otherwise `set` adds or replaces and `delete` removes
/// (IncrementalAlterConfigs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfigAlteration {
    pub group: String,
    pub set: BTreeMap<String, String>,
    pub delete: Vec<String>,
    pub replace: bool,
}

impl GroupConfigAlteration {
    /// What the group's configs `current` become.
    pub fn apply(&self, current: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        altered_values(current, &self.set, &self.delete, self.replace)
    }

    /// A group is named, and so is every config the alteration names.
    pub fn check(&self) -> Result<(), CoordinatorError> {
        if self.group.is_empty() {
            return Err(CoordinatorError::Invalid(
                "a group config needs a group name".into(),
            ));
        }
        check_names(&self.set, &self.delete, "a group config's name is empty")
    }
}

/// Applies `alteration` to `records` (kept sorted by group), dropping a group left with no
/// configs.
pub fn apply(records: &mut Vec<GroupConfigRecord>, alteration: &GroupConfigAlteration) {
    let at = records.binary_search_by(|record| record.group.as_str().cmp(&alteration.group));
    let current = match at {
        Ok(at) => records[at].values.clone(),
        Err(_) => BTreeMap::new(),
    };
    let values = alteration.apply(&current);
    match (at, values.is_empty()) {
        (Ok(at), true) => {
            records.remove(at);
        }
        (Ok(at), false) => records[at].values = values,
        (Err(_), true) => {}
        (Err(at), false) => records.insert(
            at,
            GroupConfigRecord {
                group: alteration.group.clone(),
                values,
            },
        ),
    }
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

    fn change(
        group: &str,
        set: &[(&str, &str)],
        delete: &[&str],
        replace: bool,
    ) -> GroupConfigAlteration {
        GroupConfigAlteration {
            group: group.to_string(),
            set: values(set),
            delete: delete.iter().map(|d| d.to_string()).collect(),
            replace,
        }
    }

    #[test]
    fn alterations_set_delete_or_replace_and_emptied_groups_go() {
        let mut records = Vec::new();
        apply(
            &mut records,
            &change("b", &[("x", "1"), ("y", "2")], &[], false),
        );
        apply(&mut records, &change("a", &[("z", "3")], &[], false));
        apply(&mut records, &change("b", &[("w", "4")], &["x"], false));
        let groups: Vec<&str> = records.iter().map(|r| r.group.as_str()).collect();
        assert_eq!(groups, ["a", "b"], "sorted by group");
        assert_eq!(records[1].values, values(&[("w", "4"), ("y", "2")]));
        apply(&mut records, &change("b", &[("v", "5")], &[], true));
        assert_eq!(records[1].values, values(&[("v", "5")]));
        apply(&mut records, &change("b", &[], &["v"], false));
        apply(&mut records, &change("a", &[], &[], true));
        assert!(records.is_empty());
        // Deleting from a group with nothing set stores nothing.
        apply(&mut records, &change("c", &[], &["v"], false));
        assert!(records.is_empty());
    }

    #[test]
    fn a_group_and_its_config_names_must_be_named() {
        assert!(change("g", &[("x", "1")], &["y"], false).check().is_ok());
        assert!(change("", &[("x", "1")], &[], false).check().is_err());
        assert!(change("g", &[(" ", "1")], &[], false).check().is_err());
        assert!(change("g", &[], &[""], false).check().is_err());
    }
}
