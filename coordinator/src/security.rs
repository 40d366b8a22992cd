//! Users and ACLs as the coordinator keeps them: what every broker's authenticator and
//! authorizer read, written by whichever broker took the admin request.
//!
//! A user is a name and at most one SCRAM credential per mechanism (salt, iterations, stored
//! key, server key: never the password). An ACL binding is stored once, however often it is
//! created. Both stores keep them beside the topics, and a change reaches every broker through
//! the same watch that carries topic changes.

use serde::{Deserialize, Serialize};
use strata_auth::acl::{AclBinding, AclFilter};
use strata_auth::scram::{ScramCredential, ScramMechanism};

/// One user's stored credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub name: String,
    /// At most one per mechanism, in mechanism order.
    pub credentials: Vec<ScramCredential>,
}

impl UserRecord {
    /// This user's credential for `mechanism`.
    pub fn credential(&self, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        self.credentials
            .iter()
            .find(|credential| credential.mechanism == mechanism)
    }

    /// Sets the credential of its mechanism, replacing an older one.
    pub fn set(&mut self, credential: ScramCredential) {
        self.credentials
            .retain(|known| known.mechanism != credential.mechanism);
        self.credentials.push(credential);
        self.credentials
            .sort_by_key(|credential| credential.mechanism);
    }

    /// Removes the credential of `mechanism` (every one for `None`); whether any was removed.
    pub fn remove(&mut self, mechanism: Option<ScramMechanism>) -> bool {
        let before = self.credentials.len();
        self.credentials
            .retain(|known| mechanism.is_some_and(|mechanism| known.mechanism != mechanism));
        self.credentials.len() != before
    }
}

/// A user name that can be stored: not empty, no control characters, at most 255 bytes.
pub fn validate_user_name(name: &str) -> Result<(), crate::CoordinatorError> {
    if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return Err(crate::CoordinatorError::InvalidArgument(format!(
            "a user name is 1 to 255 bytes without control characters, not {name:?}"
        )));
    }
    Ok(())
}

/// A credential that can be stored for `user`: a valid name, a credential whose parts fit its
/// mechanism.
pub(crate) fn check_credential(
    user: &str,
    credential: &ScramCredential,
) -> Result<(), crate::CoordinatorError> {
    validate_user_name(user)?;
    credential
        .validate()
        .map_err(|error| crate::CoordinatorError::InvalidArgument(error.to_string()))
}

/// Bindings that can be stored: each valid (see [`AclBinding::validate`]).
pub(crate) fn check_acls(bindings: &[AclBinding]) -> Result<(), crate::CoordinatorError> {
    for binding in bindings {
        binding
            .validate()
            .map_err(|error| crate::CoordinatorError::InvalidArgument(error.to_string()))?;
    }
    Ok(())
}

/// Each filter's matches in `bindings`, and `bindings` without any of them.
pub fn split_by_filters(
    bindings: Vec<AclBinding>,
    filters: &[AclFilter],
) -> (Vec<Vec<AclBinding>>, Vec<AclBinding>) {
    let mut deleted = vec![Vec::new(); filters.len()];
    let mut kept = Vec::new();
    for binding in bindings {
        let mut matched = false;
        for (filter, deleted) in filters.iter().zip(&mut deleted) {
            if filter.matches(&binding) {
                deleted.push(binding.clone());
                matched = true;
            }
        }
        if !matched {
            kept.push(binding);
        }
    }
    (deleted, kept)
}
