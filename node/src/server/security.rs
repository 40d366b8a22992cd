//! Security settings of a node: what each client listener speaks (Kafka's security protocols),
//! how TLS peers are asked for certificates, which SASL mechanisms are offered, and how
//! requests are authorized. The mechanisms themselves are in `strata_auth`; the listeners
//! apply them (`listener::tls`, `listener::kafka::sasl`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use strata_auth::acl::AuthorizerConfig;
use strata_auth::scram::{ScramCredential, ScramMechanism};

/// A listener's security protocol, as Kafka names them (`listeners=SASL_SSL://...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    /// Kafka's name, which is also the listener's name: `PLAINTEXT`, `SASL_SSL`.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SecurityProtocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        SecurityProtocol::ALL
            .into_iter()
            .find(|protocol| protocol.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                format!(
                    "unknown security protocol {text:?} (plaintext, ssl, sasl_plaintext, sasl_ssl)"
                )
            })
    }
}

/// One listener: `SCHEME://HOST:PORT`, or a bare `HOST:PORT` for plaintext.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerSpec {
    pub protocol: SecurityProtocol,
    pub address: SocketAddr,
}

impl ListenerSpec {
    pub fn plaintext(address: SocketAddr) -> ListenerSpec {
        ListenerSpec {
            protocol: SecurityProtocol::Plaintext,
            address,
        }
    }
}

impl fmt::Display for ListenerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}",
            self.protocol.name().to_ascii_lowercase(),
            self.address
        )
    }
}

impl FromStr for ListenerSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (protocol, address) = match text.split_once("://") {
            Some((scheme, address)) => (scheme.parse()?, address),
            None => (SecurityProtocol::Plaintext, text),
        };
        let address = address
            .parse()
            .map_err(|_| format!("{address:?} is not HOST:PORT (an IP address and a port)"))?;
        Ok(ListenerSpec { protocol, address })
    }
}

/// Parses `SCHEME://HOST:PORT[,SCHEME://HOST:PORT]`: at most one listener per security
/// protocol (a listener is named by its protocol, and clients are sent to the listener of the
/// same name on every broker), no address twice.
pub fn parse_listeners(text: &str) -> Result<Vec<ListenerSpec>, String> {
    let listeners: Vec<ListenerSpec> = text
        .split(',')
        .filter(|part| !part.trim().is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if listeners.is_empty() {
        return Err("no listener given".into());
    }
    for (i, listener) in listeners.iter().enumerate() {
        for other in &listeners[..i] {
            if other.protocol == listener.protocol {
                return Err(format!(
                    "two {} listeners: one listener per security protocol",
                    listener.protocol
                ));
            }
            if other.address == listener.address {
                return Err(format!("two listeners on {}", listener.address));
            }
        }
    }
    Ok(listeners)
}

/// Whether TLS listeners ask clients for a certificate (Kafka's `ssl.client.auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for and checked when given; clients without one connect too.
    Requested,
    /// A client without a certificate that chains to the CA cannot connect.
    Required,
}

impl FromStr for ClientAuth {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.to_ascii_lowercase().as_str() {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            _ => Err(format!(
                "unknown client authentication {text:?} (none, requested, required)"
            )),
        }
    }
}

/// A SASL mechanism a listener offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Scram(ScramMechanism),
}

impl SaslMechanism {
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(scram) => scram.name(),
        }
    }
}

impl FromStr for SaslMechanism {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let upper = text.trim().to_ascii_uppercase();
        if upper == "PLAIN" {
            return Ok(SaslMechanism::Plain);
        }
        ScramMechanism::from_name(&upper)
            .map(SaslMechanism::Scram)
            .ok_or_else(|| {
                format!("unknown SASL mechanism {text:?} (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN)")
            })
    }
}

/// A new SCRAM credential for `password` with a fresh random salt.
pub fn new_credential(
    mechanism: ScramMechanism,
    password: &[u8],
    iterations: u32,
) -> Result<ScramCredential, strata_auth::AuthError> {
    let mut salt = [0u8; strata_auth::scram::SALT_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
        .map_err(|_| strata_auth::AuthError::Invalid("the system's random source failed".into()))?;
    ScramCredential::new(mechanism, password, &salt, iterations)
}

/// `count` random bytes as printable nonce characters (base64 without padding: no commas).
pub fn random_nonce(count: usize) -> String {
    use base64::Engine;
    let mut bytes = vec![0u8; count];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

/// How the node authenticates and authorizes clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityConfig {
    /// Whether TLS listeners ask for client certificates.
    pub client_auth: ClientAuth,
    /// Offered on SASL listeners, in this order.
    pub sasl_mechanisms: Vec<SaslMechanism>,
    /// `Some`: every request is checked against the ACLs (`--authorizer acl`); `None`: every
    /// authenticated client may do everything.
    pub authorizer: Option<AuthorizerConfig>,
    /// Kafka's `connections.max.reauth.ms`: a SASL session lasts this long, then the client
    /// must authenticate again on the same connection or be disconnected; `None`: forever.
    pub connections_max_reauth: Option<Duration>,
    /// Kafka's `connection.failed.authentication.delay.ms`: a failed authentication is answered
    /// this late, so guessing passwords is slow.
    pub failed_authentication_delay: Duration,
    /// A user (name, password) created at start when it does not exist, so a secured cluster
    /// can be set up from nothing (`STRATA_BOOTSTRAP_USER`).
    pub bootstrap_user: Option<(String, String)>,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            client_auth: ClientAuth::None,
            sasl_mechanisms: vec![
                SaslMechanism::Scram(ScramMechanism::Sha512),
                SaslMechanism::Scram(ScramMechanism::Sha256),
            ],
            authorizer: None,
            connections_max_reauth: None,
            failed_authentication_delay: Duration::from_millis(100),
            bootstrap_user: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_parse_as_kafkas() {
        let listeners =
            parse_listeners("plaintext://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093").unwrap();
        assert_eq!(listeners[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(listeners[1].protocol, SecurityProtocol::SaslSsl);
        assert_eq!(listeners[1].address.port(), 9093);
        assert_eq!(
            parse_listeners("127.0.0.1:9092").unwrap(),
            vec![ListenerSpec::plaintext("127.0.0.1:9092".parse().unwrap())]
        );
        assert_eq!(
            listeners[1].to_string().parse::<ListenerSpec>().unwrap(),
            listeners[1]
        );
        for bad in [
            "",
            "tls://127.0.0.1:1",
            "ssl://localhost:1",
            "ssl://127.0.0.1:1,ssl://127.0.0.1:2",
            "ssl://127.0.0.1:1,plaintext://127.0.0.1:1",
        ] {
            assert!(parse_listeners(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mechanisms_and_client_auth_parse() {
        assert_eq!(
            "scram-sha-512".parse::<SaslMechanism>().unwrap(),
            SaslMechanism::Scram(ScramMechanism::Sha512)
        );
        assert_eq!(
            "PLAIN".parse::<SaslMechanism>().unwrap(),
            SaslMechanism::Plain
        );
        assert!("GSSAPI".parse::<SaslMechanism>().is_err());
        assert_eq!(
            "Required".parse::<ClientAuth>().unwrap(),
            ClientAuth::Required
        );
        assert!("sometimes".parse::<ClientAuth>().is_err());
    }
}
