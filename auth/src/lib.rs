//! `strata-auth`: who a connection is, and what it may do.
//!
//! - [`scram`]: SCRAM-SHA-256/512 exchanges (server and client sides) and the stored
//!   credential they check against;
//! - [`plain`]: SASL/PLAIN, checked against the same stored credential;
//! - [`Principal`]: the identity a connection acts as once authenticated;
//! - [`acl`]: ACL bindings with Kafka's model, and the [`acl::Authorizer`] a shard consults
//!   on every request.
//!
//! Pure logic: the listeners own sockets, TLS and timers; randomness (nonces, salts) comes in
//! as arguments, so every exchange here is deterministic and testable as it stands.

pub mod acl;
pub mod plain;
pub mod scram;

use std::fmt;
use std::sync::Arc;

/// Why an exchange or a stored credential was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The peer's message does not follow the mechanism's grammar.
    #[error("malformed authentication message: {0}")]
    Malformed(&'static str),
    /// Well-formed, but the credentials are wrong (or the request is one Strata refuses).
    #[error("authentication failed: {0}")]
    Failed(String),
    /// A credential or ACL that cannot be stored as given.
    #[error("{0}")]
    Invalid(String),
}

/// The identity a request acts as: Kafka's `KafkaPrincipal`, `TYPE:NAME` (`User:alice`).
/// Cheap to clone: connections hand it to each request they start.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal(Arc<str>);

impl Principal {
    /// Who a connection is before (or without) authentication, as Kafka names it.
    pub fn anonymous() -> Principal {
        Principal::user("ANONYMOUS")
    }

    /// `User:NAME`: a SASL user, or a client certificate's subject.
    pub fn user(name: &str) -> Principal {
        Principal(format!("User:{name}").into())
    }

    /// Parses `TYPE:NAME` (a super-user list, an ACL's principal).
    pub fn parse(text: &str) -> Result<Principal, AuthError> {
        match text.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {
                Ok(Principal(text.into()))
            }
            _ => Err(AuthError::Invalid(format!(
                "a principal is TYPE:NAME (User:alice), not {text:?}"
            ))),
        }
    }

    /// `TYPE:NAME`, as ACLs name it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part after `TYPE:`.
    pub fn name(&self) -> &str {
        self.0.split_once(':').map_or(&self.0, |(_, name)| name)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether two secrets are equal, in time that depends on their lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_name_their_type() {
        assert_eq!(Principal::user("alice").as_str(), "User:alice");
        assert_eq!(Principal::user("alice").name(), "alice");
        assert_eq!(Principal::anonymous().as_str(), "User:ANONYMOUS");
        assert_eq!(
            Principal::parse("User:CN=client,O=acme").unwrap().name(),
            "CN=client,O=acme"
        );
        assert!(Principal::parse("alice").is_err());
        assert!(Principal::parse("User:").is_err());
    }
}
