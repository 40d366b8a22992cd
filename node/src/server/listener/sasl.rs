//! One connection's SASL state, for both protocols: on Kafka's, SaslHandshake chooses a
//! mechanism and SaslAuthenticate (v0–2) carries its messages (after a version-0 handshake the
//! messages travel as bare length-prefixed tokens, Kafka's pre-1.0 framing, which librdkafka
//! before 2.1 still checks a broker for); on the native protocol, Authenticate does both.
//! KIP-368's session lifetime asks clients to authenticate again on the same connection
//! before it ends.
//!
//! [`SaslSession`] is sans-IO: it takes the messages and the time, and says what to answer.
//! What a connection may send in each state:
//! - before authentication, on a SASL listener: only the authentication requests (and Kafka's
//!   ApiVersions); anything else closes the connection (Kafka's ILLEGAL_SASL_STATE);
//! - authenticated: everything, until the session's lifetime is over; past it only a new
//!   exchange (re-authentication, which must name the same user).

use std::time::{Duration, Instant};

use strata_auth::scram::{ScramServer, ScramStep};
use strata_auth::{AuthError, Principal, plain};

use crate::server::messages::SecurityView;
use crate::server::security::SaslMechanism;

/// Largest frame a connection may send before it is authenticated: the SASL messages are a
/// few hundred bytes, so a peer that has not proven anything allocates little.
pub(super) const UNAUTHENTICATED_MAX_FRAME_BYTES: usize = 64 << 10;

enum Exchange {
    Plain,
    Scram(ScramServer),
}

/// One connection's SASL state.
pub(in crate::server) struct SaslSession {
    /// The listener asks for SASL (SASL_PLAINTEXT, SASL_SSL).
    required: bool,
    /// The mechanism a handshake chose and its exchange so far.
    exchange: Option<(SaslMechanism, Exchange)>,
    /// Who the connection authenticated as.
    authenticated: Option<Principal>,
    /// When the session ends (`connections.max.reauth.ms`); `None`: never.
    expires_at: Option<Instant>,
    /// The exchange under way began with a version-0 handshake: its messages are bare tokens.
    unframed: bool,
}

/// What a SaslAuthenticate request leads to.
pub(super) enum TokenOutcome {
    /// Answer with these bytes; the exchange goes on.
    Continue(Vec<u8>),
    /// Authenticated: answer with these bytes, the session lasting `lifetime` (`None`: no end).
    Authenticated {
        bytes: Vec<u8>,
        principal: Principal,
        lifetime: Option<Duration>,
    },
    /// PLAIN's password must be checked against `credential` (PBKDF2: the caller does it off
    /// the shard thread) and the result handed to [`SaslSession::finish_plain`].
    CheckPassword {
        user: String,
        password: Vec<u8>,
        credential: Option<strata_auth::scram::ScramCredential>,
    },
    /// Refused; the connection closes after the answer.
    Failed { user: Option<String>, why: String },
}

impl SaslSession {
    pub(super) fn new(required: bool) -> SaslSession {
        SaslSession {
            required,
            exchange: None,
            authenticated: None,
            expires_at: None,
            unframed: false,
        }
    }

    /// Whether the next frame is a bare SASL token (see the module doc).
    pub(super) fn unframed(&self) -> bool {
        self.unframed && self.exchange.is_some()
    }

    /// The largest frame the connection may send now: before authentication, a SASL
    /// message's worth.
    pub(super) fn max_frame_bytes(&self, configured: usize) -> usize {
        if self.unauthenticated() {
            configured.min(UNAUTHENTICATED_MAX_FRAME_BYTES)
        } else {
            configured
        }
    }

    /// Whether the connection has proven nothing yet on a listener that asks it to.
    pub(super) fn unauthenticated(&self) -> bool {
        self.required && self.authenticated.is_none()
    }

    /// Whether a request other than an authentication step may run now; `Err` says why not
    /// (the connection then closes).
    pub(super) fn admit(&self, now: Instant) -> Result<(), &'static str> {
        if !self.required {
            return Ok(());
        }
        if self.authenticated.is_none() {
            return Err("before SASL authentication (ILLEGAL_SASL_STATE)");
        }
        if self.exchange.is_none() && self.expires_at.is_some_and(|end| now >= end) {
            return Err(
                "after the SASL session expired without re-authentication (connections.max.reauth.ms)",
            );
        }
        Ok(())
    }

    /// Whether an exchange is under way (a native Authenticate continues it rather than
    /// starting one).
    pub(super) fn exchanging(&self) -> bool {
        self.exchange.is_some()
    }

    /// A SaslHandshake naming `mechanism`: `Ok` when it is one of `offered` (the exchange
    /// begins), else the error code to answer with before closing.
    pub(super) fn handle_handshake(
        &mut self,
        version: i16,
        mechanism: &str,
        offered: &[SaslMechanism],
        server_nonce: String,
        unknown_user_key: [u8; 32],
    ) -> Result<(), i16> {
        if !self.required {
            return Err(strata_kafka::errors::ILLEGAL_SASL_STATE);
        }
        let Some(chosen) = offered
            .iter()
            .copied()
            .find(|offer| offer.name() == mechanism)
        else {
            return Err(strata_kafka::errors::UNSUPPORTED_SASL_MECHANISM);
        };
        let exchange = match chosen {
            SaslMechanism::Plain => Exchange::Plain,
            SaslMechanism::Scram(scram) => {
                Exchange::Scram(ScramServer::new(scram, server_nonce, unknown_user_key))
            }
        };
        self.exchange = Some((chosen, exchange));
        self.unframed = version == 0;
        Ok(())
    }

    /// The mechanism of the exchange under way.
    pub(super) fn mechanism(&self) -> Option<SaslMechanism> {
        self.exchange.as_ref().map(|(mechanism, _)| *mechanism)
    }

    /// A SaslAuthenticate carrying `token`, checked against `users`; `lifetime` is the
    /// listener's session lifetime.
    pub(super) fn handle_token(
        &mut self,
        token: &[u8],
        users: &SecurityView,
        lifetime: Option<Duration>,
        now: Instant,
    ) -> TokenOutcome {
        let Some((_, exchange)) = self.exchange.as_mut() else {
            return TokenOutcome::Failed {
                user: None,
                why: "SaslAuthenticate without a SaslHandshake (ILLEGAL_SASL_STATE)".into(),
            };
        };
        match exchange {
            Exchange::Plain => {
                self.exchange = None;
                match plain::parse(token) {
                    Ok(credentials) => TokenOutcome::CheckPassword {
                        user: credentials.user.to_string(),
                        password: credentials.password.to_vec(),
                        credential: users.any_credential(credentials.user).cloned(),
                    },
                    Err(error) => TokenOutcome::Failed {
                        user: None,
                        why: error.to_string(),
                    },
                }
            }
            Exchange::Scram(server) => {
                let scram = server.mechanism();
                match server.handle_message(token, |user| users.credential(user, scram).cloned()) {
                    Ok(ScramStep::Challenge(bytes)) => TokenOutcome::Continue(bytes),
                    Ok(ScramStep::Authenticated { user, server_final }) => {
                        self.exchange = None;
                        self.finish(user, server_final, lifetime, now)
                    }
                    Err(error) => {
                        self.exchange = None;
                        TokenOutcome::Failed {
                            user: None,
                            why: describe(&error),
                        }
                    }
                }
            }
        }
    }

    /// The result of a PLAIN password check [`TokenOutcome::CheckPassword`] asked for.
    pub(super) fn finish_plain(
        &mut self,
        user: String,
        password_matches: bool,
        lifetime: Option<Duration>,
        now: Instant,
    ) -> TokenOutcome {
        if !password_matches {
            return TokenOutcome::Failed {
                why: format!("invalid credentials for user {user}"),
                user: Some(user),
            };
        }
        self.finish(user, Vec::new(), lifetime, now)
    }

    fn finish(
        &mut self,
        user: String,
        bytes: Vec<u8>,
        lifetime: Option<Duration>,
        now: Instant,
    ) -> TokenOutcome {
        let principal = Principal::user(&user);
        if let Some(before) = &self.authenticated
            && before != &principal
        {
            return TokenOutcome::Failed {
                why: format!("re-authentication as {principal}, not {before}"),
                user: Some(user),
            };
        }
        self.authenticated = Some(principal.clone());
        self.expires_at = lifetime.map(|lifetime| now + lifetime);
        TokenOutcome::Authenticated {
            bytes,
            principal,
            lifetime,
        }
    }
}

/// What one authentication message led to, for the protocol to answer.
pub(super) enum Step {
    /// Answer with these bytes; the exchange goes on.
    Continue(Vec<u8>),
    /// Authenticated (`client` now names its user): answer with these bytes and the session's
    /// lifetime in milliseconds (0: no end).
    Authenticated { bytes: Vec<u8>, lifetime_ms: i64 },
    /// Refused, after the failed-authentication delay and a (rate-limited) log line: answer
    /// the refusal and close.
    Failed {
        mechanism: &'static str,
        why: String,
    },
}

/// Runs one message of the exchange under way: PLAIN's password check off the shard thread
/// (PBKDF2 takes milliseconds the shard's other connections should not wait), a failure logged
/// and answered late (Kafka's `connection.failed.authentication.delay.ms`).
pub(super) async fn step(
    shard: &crate::server::shard::Shard,
    endpoint: &super::Endpoint,
    session: &mut SaslSession,
    client: &mut super::Client,
    token: &[u8],
) -> Step {
    let security = &shard.context.config.security;
    let clock = &shard.context.config.clock;
    let mechanism = session
        .mechanism()
        .map_or("none", |mechanism| mechanism.name());
    let lifetime = security.connections_max_reauth;
    let users = shard.view.borrow().security.clone();
    let mut outcome = session.handle_token(token, &users, lifetime, clock.now());
    if let TokenOutcome::CheckPassword {
        user,
        password,
        credential,
    } = outcome
    {
        let matches = tokio::task::spawn_blocking(move || {
            credential.is_some_and(|credential| credential.verify_password(&password))
        })
        .await
        .unwrap_or(false);
        outcome = session.finish_plain(user, matches, lifetime, clock.now());
    }
    match outcome {
        TokenOutcome::Continue(bytes) => Step::Continue(bytes),
        TokenOutcome::Authenticated {
            bytes,
            principal,
            lifetime,
        } => {
            tracing::debug!(peer = %client.peer, %principal, mechanism, "authenticated");
            shard.metrics.authentication(true);
            client.principal = principal;
            let lifetime_ms = lifetime.map_or(0, |lifetime| {
                i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX)
            });
            Step::Authenticated { bytes, lifetime_ms }
        }
        TokenOutcome::Failed { user, why } => {
            shard.metrics.authentication(false);
            endpoint
                .auth
                .log_failure(clock.now(), client.peer, mechanism, user.as_deref(), &why);
            clock.sleep(security.failed_authentication_delay).await;
            Step::Failed { mechanism, why }
        }
        TokenOutcome::CheckPassword { .. } => unreachable!("the password check was made above"),
    }
}

fn describe(error: &AuthError) -> String {
    match error {
        AuthError::Failed(why) => why.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_auth::scram::{ScramClient, ScramCredential, ScramMechanism};
    use strata_coordinator::security::UserRecord;

    const SCRAM: SaslMechanism = SaslMechanism::Scram(ScramMechanism::Sha512);

    fn users() -> SecurityView {
        let mut alice = UserRecord {
            name: "alice".into(),
            credentials: Vec::new(),
        };
        alice.set(ScramCredential::new(ScramMechanism::Sha512, b"pw", b"salt", 4096).unwrap());
        SecurityView::new(vec![alice], Vec::new(), None)
    }

    fn scram_login(session: &mut SaslSession, password: &[u8], now: Instant) -> TokenOutcome {
        session
            .handle_handshake(1, "SCRAM-SHA-512", &[SCRAM], "server".into(), [1; 32])
            .unwrap();
        let mut client = ScramClient::new(ScramMechanism::Sha512, "alice", password, "c".into());
        let TokenOutcome::Continue(first) =
            session.handle_token(&client.first_message(), &users(), None, now)
        else {
            panic!("a challenge first");
        };
        let last = client.handle_server_first(&first).unwrap();
        session.handle_token(&last, &users(), Some(Duration::from_secs(60)), now)
    }

    #[test]
    fn nothing_but_the_handshake_runs_before_authentication() {
        let now = Instant::now();
        let mut session = SaslSession::new(true);
        assert!(session.unauthenticated());
        assert!(session.admit(now).is_err());
        let TokenOutcome::Authenticated { principal, .. } = scram_login(&mut session, b"pw", now)
        else {
            panic!("the right password authenticates");
        };
        assert_eq!(principal.as_str(), "User:alice");
        assert!(session.admit(now).is_ok());
        // Past its lifetime the session admits nothing until it authenticates again.
        let later = now + Duration::from_secs(61);
        assert!(session.admit(later).is_err());
        assert!(matches!(
            scram_login(&mut session, b"pw", later),
            TokenOutcome::Authenticated { .. }
        ));
        assert!(session.admit(later).is_ok());
    }

    #[test]
    fn a_wrong_password_an_unknown_mechanism_or_a_missing_handshake_fail() {
        let now = Instant::now();
        let mut session = SaslSession::new(true);
        assert!(matches!(
            scram_login(&mut session, b"wrong", now),
            TokenOutcome::Failed { .. }
        ));
        assert!(session.unauthenticated());
        assert_eq!(
            session.handle_handshake(1, "GSSAPI", &[SCRAM], "s".into(), [1; 32]),
            Err(strata_kafka::errors::UNSUPPORTED_SASL_MECHANISM)
        );
        assert!(matches!(
            SaslSession::new(true).handle_token(b"n,,n=alice,r=x", &users(), None, now),
            TokenOutcome::Failed { .. }
        ));
        assert_eq!(
            SaslSession::new(false).handle_handshake(
                1,
                "SCRAM-SHA-512",
                &[SCRAM],
                "s".into(),
                [1; 32]
            ),
            Err(strata_kafka::errors::ILLEGAL_SASL_STATE)
        );
    }

    #[test]
    fn plain_hands_the_password_check_out_and_takes_its_result() {
        let now = Instant::now();
        let mut session = SaslSession::new(true);
        session
            .handle_handshake(1, "PLAIN", &[SaslMechanism::Plain], "s".into(), [1; 32])
            .unwrap();
        let TokenOutcome::CheckPassword {
            user,
            password,
            credential,
        } = session.handle_token(b"\0alice\0pw", &users(), None, now)
        else {
            panic!("PLAIN asks for a password check");
        };
        assert!(credential.unwrap().verify_password(&password));
        assert!(matches!(
            session.finish_plain(user, true, None, now),
            TokenOutcome::Authenticated { .. }
        ));
        assert!(session.admit(now).is_ok());
    }

    #[test]
    fn re_authentication_cannot_change_the_user() {
        let now = Instant::now();
        let mut session = SaslSession::new(true);
        assert!(matches!(
            session.finish_plain("alice".into(), true, None, now),
            TokenOutcome::Authenticated { .. }
        ));
        assert!(matches!(
            session.finish_plain("mallory".into(), true, None, now),
            TokenOutcome::Failed { .. }
        ));
    }
}
