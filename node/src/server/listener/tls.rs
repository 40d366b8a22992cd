//! TLS on the client listeners (rustls): the server certificate and key from PEM files,
//! client certificates checked against the CA when asked for (mTLS), and the files re-read
//! when they change, so certificates rotate without a restart.
//!
//! Each shard keeps its own [`TlsListener`]: it looks at the files' modification times at
//! most once a second, on an accept, and builds a new server configuration when they moved.
//! A configuration that does not load (a half-written file during a rotation) is logged and
//! the previous one kept. Connections already open keep the configuration they began with.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use strata_auth::Principal;
use tokio_rustls::TlsAcceptor;

use crate::server::quic::TlsFiles;
use crate::server::security::ClientAuth;

/// How often, at most, the files are looked at for a change.
const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What a file looked like when last loaded: changed when either moves.
type Stamp = Option<(SystemTime, u64)>;

struct Loaded {
    acceptor: TlsAcceptor,
    stamps: [Stamp; 3],
    checked: Instant,
}

/// A shard's TLS server side for its client listeners.
pub(crate) struct TlsListener {
    files: TlsFiles,
    client_auth: ClientAuth,
    loaded: RefCell<Loaded>,
}

impl TlsListener {
    /// Loads the files; an error here stops the node from starting (a listener that cannot
    /// speak TLS must not run).
    pub(crate) fn load(
        files: &TlsFiles,
        client_auth: ClientAuth,
        now: Instant,
    ) -> anyhow::Result<TlsListener> {
        let stamps = stamps(files);
        let acceptor = TlsAcceptor::from(server_config(files, client_auth)?);
        Ok(TlsListener {
            files: files.clone(),
            client_auth,
            loaded: RefCell::new(Loaded {
                acceptor,
                stamps,
                checked: now,
            }),
        })
    }

    /// The acceptor for a new connection: the current files' (see the module doc).
    pub(crate) fn acceptor(&self, now: Instant) -> TlsAcceptor {
        let mut loaded = self.loaded.borrow_mut();
        if now.saturating_duration_since(loaded.checked) >= RELOAD_CHECK_INTERVAL {
            loaded.checked = now;
            let stamps = stamps(&self.files);
            if stamps != loaded.stamps {
                match server_config(&self.files, self.client_auth) {
                    Ok(config) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificate files changed: new connections use them");
                        loaded.acceptor = TlsAcceptor::from(config);
                        loaded.stamps = stamps;
                    }
                    Err(error) => {
                        tracing::warn!(
                            "TLS certificate files changed but do not load (keeping the previous ones): {error:#}"
                        );
                    }
                }
            }
        }
        loaded.acceptor.clone()
    }
}

fn stamps(files: &TlsFiles) -> [Stamp; 3] {
    let stamp = |path: &Path| {
        let metadata = std::fs::metadata(path).ok()?;
        Some((metadata.modified().ok()?, metadata.len()))
    };
    [stamp(&files.cert), stamp(&files.key), stamp(&files.ca)]
}

fn read_pem(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(!certs.is_empty(), "{}: no certificate", path.display());
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = read_pem(path)?;
    rustls_pemfile::private_key(&mut pem.as_slice())?
        .ok_or_else(|| anyhow::anyhow!("{}: no private key", path.display()))
}

fn server_config(
    files: &TlsFiles,
    client_auth: ClientAuth,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Requested | ClientAuth::Required => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in certificates(&files.ca)? {
                roots.add(ca)?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let verifier = if client_auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
    };
    let config = builder
        .with_single_cert(certificates(&files.cert)?, private_key(&files.key)?)
        .map_err(|error| anyhow::anyhow!("{}: {error}", files.key.display()))?;
    Ok(Arc::new(config))
}

/// The principal a verified client certificate stands for: `User:` and its subject as an RFC
/// 2253 distinguished name (`User:CN=alice,OU=eng,O=acme`), as Kafka's default principal
/// builder names it. `None` without a certificate or with one whose subject does not parse.
pub(crate) fn certificate_principal(
    certificates: Option<&[CertificateDer<'_>]>,
) -> Option<Principal> {
    let certificate = certificates?.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    Some(Principal::user(&rfc2253(parsed.subject())?))
}

/// A name as RFC 2253 writes it: the last RDN first, attributes by their short names.
fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> Option<String> {
    let mut rdns = Vec::new();
    for rdn in name.iter_rdn() {
        let mut attributes = Vec::new();
        for attribute in rdn.iter() {
            let value = attribute.as_str().ok()?;
            let oid = attribute.attr_type().to_id_string();
            let key = match oid.as_str() {
                "2.5.4.3" => "CN".to_string(),
                "2.5.4.6" => "C".to_string(),
                "2.5.4.7" => "L".to_string(),
                "2.5.4.8" => "ST".to_string(),
                "2.5.4.9" => "STREET".to_string(),
                "2.5.4.10" => "O".to_string(),
                "2.5.4.11" => "OU".to_string(),
                "0.9.2342.19200300.100.1.25" => "DC".to_string(),
                "0.9.2342.19200300.100.1.1" => "UID".to_string(),
                _ => oid,
            };
            attributes.push(format!("{key}={}", escape_rfc2253(value)));
        }
        rdns.push(attributes.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

fn escape_rfc2253(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == value.chars().count() - 1 && c == ' ');
        if special {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_subject_becomes_kafkas_principal() {
        let mut params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
        let mut name = rcgen::DistinguishedName::new();
        name.push(rcgen::DnType::CountryName, "DE");
        name.push(rcgen::DnType::OrganizationName, "Acme, Inc");
        name.push(rcgen::DnType::OrganizationalUnitName, "eng");
        name.push(rcgen::DnType::CommonName, "alice");
        params.distinguished_name = name;
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let der = certificate.der().clone();
        assert_eq!(
            certificate_principal(Some(&[der])).unwrap().as_str(),
            "User:CN=alice,OU=eng,O=Acme\\, Inc,C=DE"
        );
        assert_eq!(certificate_principal(None), None);
    }
}
