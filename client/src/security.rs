//! How the client proves who it is and keeps its traffic private: TLS (rustls, the broker's
//! certificate checked against a CA, optionally a client certificate) and SASL (SCRAM-SHA-256,
//! SCRAM-SHA-512 or PLAIN, run on each new connection before anything else).

use std::path::Path;
use std::sync::Arc;

use strata_auth::scram::{ScramClient, ScramMechanism};
use strata_wire::protocol::{AuthenticateRequest, Request, Response};

use crate::{ClientError, Connection};

/// A client's security settings; the default is plaintext without authentication.
#[derive(Clone, Default)]
pub struct Security {
    /// Speak TLS, trusting what this configuration trusts.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Authenticate each connection with SASL.
    pub sasl: Option<SaslCredentials>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

/// A SASL user and password, and the mechanism to prove them with.
#[derive(Clone)]
pub struct SaslCredentials {
    /// `SCRAM-SHA-512`, `SCRAM-SHA-256` or `PLAIN`.
    pub mechanism: String,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for SaslCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslCredentials")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

fn certificates(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, ClientError> {
    let pem = std::fs::read(path)
        .map_err(|error| ClientError::InvalidArgument(format!("{}: {error}", path.display())))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| ClientError::InvalidArgument(format!("{}: {error}", path.display())))?;
    if certs.is_empty() {
        return Err(ClientError::InvalidArgument(format!(
            "{}: no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// A TLS configuration trusting the CA in `ca` (PEM), presenting `client` (certificate and
/// key, PEM) when given.
pub fn tls_config(
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates(ca)? {
        roots
            .add(certificate)
            .map_err(|error| ClientError::InvalidArgument(format!("{}: {error}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| ClientError::InvalidArgument(error.to_string()))?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let pem = std::fs::read(key).map_err(|error| {
                ClientError::InvalidArgument(format!("{}: {error}", key.display()))
            })?;
            let key = rustls_pemfile::private_key(&mut pem.as_slice())
                .ok()
                .flatten()
                .ok_or_else(|| {
                    ClientError::InvalidArgument(format!("{}: no private key", key.display()))
                })?;
            builder
                .with_client_auth_cert(certificates(cert)?, key)
                .map_err(|error| ClientError::InvalidArgument(error.to_string()))?
        }
    };
    Ok(Arc::new(config))
}

/// A random client nonce: 24 printable characters.
fn client_nonce() -> String {
    use std::fmt::Write;
    let mut bytes = [0u8; 18];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system's random source works");
    bytes.iter().fold(String::new(), |mut nonce, byte| {
        let _ = write!(nonce, "{byte:02x}");
        nonce
    })
}

async fn authenticate_step(
    connection: &Connection,
    mechanism: &str,
    token: Vec<u8>,
) -> Result<(String, bool), ClientError> {
    let request = Request::Authenticate(AuthenticateRequest {
        mechanism: mechanism.to_string(),
        token: String::from_utf8(token)
            .map_err(|_| ClientError::InvalidArgument("credentials are UTF-8".into()))?,
    });
    match connection.request(request).await? {
        Response::Authenticate(answer)
            if answer.error == strata_wire::protocol::ErrorCode::None =>
        {
            Ok((answer.token, answer.authenticated))
        }
        Response::Authenticate(answer) => Err(ClientError::Authentication(answer.message)),
        other => Err(ClientError::Protocol(format!(
            "{:?} in answer to Authenticate",
            other.api_key()
        ))),
    }
}

/// Runs the SASL exchange on a new connection.
pub(crate) async fn authenticate(
    connection: &Connection,
    credentials: &SaslCredentials,
) -> Result<(), ClientError> {
    let mechanism = credentials.mechanism.to_ascii_uppercase();
    if mechanism == "PLAIN" {
        let token = strata_auth::plain::encode(&credentials.user, credentials.password.as_bytes());
        let (_, authenticated) = authenticate_step(connection, &mechanism, token).await?;
        return if authenticated {
            Ok(())
        } else {
            Err(ClientError::Authentication("PLAIN did not complete".into()))
        };
    }
    let scram = ScramMechanism::from_name(&mechanism).ok_or_else(|| {
        ClientError::InvalidArgument(format!(
            "unknown SASL mechanism {mechanism} (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN)"
        ))
    })?;
    let mut exchange = ScramClient::new(
        scram,
        &credentials.user,
        credentials.password.as_bytes(),
        client_nonce(),
    );
    let (server_first, _) =
        authenticate_step(connection, &mechanism, exchange.first_message()).await?;
    let last = exchange
        .handle_server_first(server_first.as_bytes())
        .map_err(|error| ClientError::Authentication(error.to_string()))?;
    let (server_final, authenticated) = authenticate_step(connection, &mechanism, last).await?;
    exchange
        .handle_server_final(server_final.as_bytes())
        .map_err(|error| ClientError::Authentication(error.to_string()))?;
    if !authenticated {
        return Err(ClientError::Authentication(
            "the broker did not finish the exchange".into(),
        ));
    }
    Ok(())
}
