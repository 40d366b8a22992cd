//! SASL/PLAIN (RFC 4616): `[authzid] NUL authcid NUL passwd`, checked against the user's
//! stored SCRAM credential, so one stored credential serves both mechanisms and no password is
//! ever kept. PLAIN sends the password itself: offer it on TLS listeners only.

use crate::AuthError;

/// Longest PLAIN message accepted (Kafka's own limit on names and passwords is looser; real
/// ones are short).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// A PLAIN message's user and password.
#[derive(PartialEq, Eq)]
pub struct PlainCredentials<'a> {
    pub user: &'a str,
    pub password: &'a [u8],
}

impl std::fmt::Debug for PlainCredentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainCredentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Parses a PLAIN message. An authorization identity other than the user is refused, as
/// Kafka refuses it.
pub fn parse(message: &[u8]) -> Result<PlainCredentials<'_>, AuthError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(AuthError::Malformed("a PLAIN message over 4 KiB"));
    }
    let mut parts = message.split(|&byte| byte == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed(
            "a PLAIN message is authzid, user and password separated by NUL",
        ));
    };
    let user = std::str::from_utf8(user)
        .map_err(|_| AuthError::Malformed("a PLAIN user name that is not UTF-8"))?;
    if user.is_empty() || password.is_empty() {
        return Err(AuthError::Malformed("an empty PLAIN user or password"));
    }
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(AuthError::Failed(
            "an authorization identity other than the user".into(),
        ));
    }
    Ok(PlainCredentials { user, password })
}

/// A PLAIN message (Strata's own clients).
pub fn encode(user: &str, password: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(user.len() + password.len() + 2);
    message.push(0);
    message.extend_from_slice(user.as_bytes());
    message.push(0);
    message.extend_from_slice(password);
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_and_without_an_authorization_identity() {
        let parsed = parse(b"\0alice\0secret").unwrap();
        assert_eq!(parsed.user, "alice");
        assert_eq!(parsed.password, b"secret");
        assert_eq!(parse(b"alice\0alice\0secret").unwrap().user, "alice");
        assert_eq!(parse(&encode("bob", b"pw")).unwrap().user, "bob");
    }

    #[test]
    fn refuses_what_is_not_plain() {
        for message in [
            &b""[..],
            b"alice",
            b"\0alice",
            b"\0\0secret",
            b"\0alice\0",
            b"\0alice\0secret\0more",
            b"mallory\0alice\0secret",
            b"\0\xff\0secret",
        ] {
            assert!(parse(message).is_err(), "{message:?}");
        }
        assert!(parse(&[b'a'; MAX_MESSAGE_BYTES + 1]).is_err());
    }

    #[test]
    fn debug_output_hides_the_password() {
        assert!(!format!("{:?}", parse(b"\0alice\0hunter2").unwrap()).contains("hunter2"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_messages_never_panic(message in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse(&message);
        }
    }
}
