//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka speaks them.
//!
//! A user's [`ScramCredential`] is what a broker stores: the salt, the iteration count, the
//! stored key `H(HMAC(SaltedPassword, "Client Key"))` and the server key
//! `HMAC(SaltedPassword, "Server Key")`. The password is never stored: the stored key lets the
//! server check a client's proof, the server key lets it prove itself to the client, and
//! neither lets anyone log in.
//!
//! [`ScramServer`] and [`ScramClient`] are the two sides of one exchange as sans-IO state
//! machines: each takes the other's message and gives the next one. The nonce parts are the
//! caller's (random in a broker, fixed in tests), so an exchange is deterministic given them.
//!
//! As Kafka does, passwords are used as their UTF-8 bytes (no SASLprep), channel binding is
//! not offered (`n` or `y` flags only), and an authorization identity other than the user is
//! refused. Unlike Kafka, an unknown user is not told so at the first message: the server
//! answers with a salt derived from the name and fails the exchange at the proof, the same
//! way a wrong password fails, so the exchange does not reveal which users exist (RFC 5802
//! §9 suggests this).

use std::fmt;
use std::num::NonZeroU32;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::AuthError;

/// Kafka's bounds on a SCRAM credential's iteration count (its `ScramMechanism`): fewer
/// iterations make a stolen credential cheap to brute-force, more make each login slow.
pub const MIN_ITERATIONS: u32 = 4096;
pub const MAX_ITERATIONS: u32 = 16384;
/// The iteration count a new credential gets when none is named (Kafka's default).
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Bytes of a new credential's salt.
pub const SALT_BYTES: usize = 32;
/// Longest SCRAM message accepted: real ones are a few hundred bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// A SCRAM mechanism: which hash it is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ScramMechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// Its SASL name, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of a SASL name (case-sensitive, as SASL names are).
    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL
            .into_iter()
            .find(|mechanism| mechanism.name() == name)
    }

    /// Kafka's wire number for it (DescribeUserScramCredentials, AlterUserScramCredentials).
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(mechanism: i8) -> Option<ScramMechanism> {
        ScramMechanism::ALL
            .into_iter()
            .find(|known| known.kafka_type() == mechanism)
    }

    fn hmac_algorithm(self) -> hmac::Algorithm {
        match self {
            ScramMechanism::Sha256 => hmac::HMAC_SHA256,
            ScramMechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2_algorithm(self) -> pbkdf2::Algorithm {
        match self {
            ScramMechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            ScramMechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    /// Bytes of its hash: the length of every key and proof.
    pub fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        let algorithm = match self {
            ScramMechanism::Sha256 => &digest::SHA256,
            ScramMechanism::Sha512 => &digest::SHA512,
        };
        digest::digest(algorithm, data).as_ref().to_vec()
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let key = hmac::Key::new(self.hmac_algorithm(), key);
        hmac::sign(&key, data).as_ref().to_vec()
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this mechanism's HMAC (what a client sends
    /// to set a credential without sending the password).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: NonZeroU32) -> Vec<u8> {
        let mut salted = vec![0u8; self.hash_len()];
        pbkdf2::derive(
            self.pbkdf2_algorithm(),
            iterations,
            salt,
            password,
            &mut salted,
        );
        salted
    }

    fn client_key(self, salted_password: &[u8]) -> Vec<u8> {
        self.hmac(salted_password, b"Client Key")
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a broker keeps of one user's password for one mechanism (never the password).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub mechanism: ScramMechanism,
    #[serde(with = "base64_bytes")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "base64_bytes")]
    pub stored_key: Vec<u8>,
    #[serde(with = "base64_bytes")]
    pub server_key: Vec<u8>,
}

impl fmt::Debug for ScramCredential {
    /// Names the mechanism and iterations only: keys do not belong in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential of `password` with `salt` (the caller's random bytes) and `iterations`
    /// (within Kafka's bounds).
    pub fn new(
        mechanism: ScramMechanism,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, AuthError> {
        check_iterations(iterations)?;
        if password.is_empty() {
            return Err(AuthError::Invalid("a password may not be empty".into()));
        }
        if salt.is_empty() {
            return Err(AuthError::Invalid("a salt may not be empty".into()));
        }
        let iterations_nonzero = NonZeroU32::new(iterations).expect("checked above");
        let salted = mechanism.salted_password(password, salt, iterations_nonzero);
        let client_key = mechanism.client_key(&salted);
        Ok(ScramCredential {
            mechanism,
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        })
    }

    /// The credential of a salted password a client computed itself (Kafka's
    /// AlterUserScramCredentials sends `Hi(password, salt, iterations)`, never the password).
    pub fn from_salted_password(
        mechanism: ScramMechanism,
        salted_password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, AuthError> {
        check_iterations(iterations)?;
        if salted_password.len() != mechanism.hash_len() || salt.is_empty() {
            return Err(AuthError::Invalid(format!(
                "a {mechanism} salted password is {} bytes, with a salt",
                mechanism.hash_len()
            )));
        }
        let client_key = mechanism.client_key(salted_password);
        Ok(ScramCredential {
            mechanism,
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
        })
    }

    /// Whether `password` is the one this credential was made from (SASL/PLAIN checks a
    /// password this way), compared in constant time.
    pub fn verify_password(&self, password: &[u8]) -> bool {
        let Some(iterations) = NonZeroU32::new(self.iterations) else {
            return false;
        };
        let salted = self
            .mechanism
            .salted_password(password, &self.salt, iterations);
        let stored_key = self.mechanism.hash(&self.mechanism.client_key(&salted));
        bool::from(stored_key.ct_eq(&self.stored_key))
    }

    /// Whether the stored parts have the lengths and bounds their mechanism gives them.
    pub fn validate(&self) -> Result<(), AuthError> {
        check_iterations(self.iterations)?;
        let len = self.mechanism.hash_len();
        if self.stored_key.len() != len || self.server_key.len() != len || self.salt.is_empty() {
            return Err(AuthError::Invalid(format!(
                "a {} credential has {len}-byte keys and a salt",
                self.mechanism
            )));
        }
        Ok(())
    }
}

/// Refuses iteration counts outside Kafka's bounds.
pub fn check_iterations(iterations: u32) -> Result<(), AuthError> {
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(AuthError::Invalid(format!(
            "iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}"
        )));
    }
    Ok(())
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// The server's next message, or the end of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramStep {
    /// Send this and wait for the client's next message.
    Challenge(Vec<u8>),
    /// The client proved it knows `user`'s password: send `server_final` (the server's own
    /// proof) and treat the connection as `user`'s.
    Authenticated { user: String, server_final: Vec<u8> },
}

enum ServerState {
    AwaitClientFirst,
    AwaitClientFinal(Box<PendingProof>),
    Finished,
}

/// What the server remembers between the two client messages.
struct PendingProof {
    user: String,
    /// `None` for an unknown user: the exchange goes on with a made-up salt and fails at the
    /// proof.
    credential: Option<ScramCredential>,
    gs2_header: String,
    nonce: String,
    /// `client-first-message-bare "," server-first-message "," `, the start of AuthMessage.
    auth_message_start: String,
}

/// The broker's side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: ScramMechanism,
    server_nonce: String,
    /// Keys the made-up salt of unknown users, so it stays the same for one name across
    /// exchanges (a changing salt would reveal that the user does not exist).
    unknown_user_key: [u8; 32],
    state: ServerState,
}

impl ScramServer {
    /// A new exchange. `server_nonce` is the server's half of the nonce (random, printable,
    /// no commas); `unknown_user_key` is a per-broker secret (see [`ScramServer`]).
    pub fn new(
        mechanism: ScramMechanism,
        server_nonce: String,
        unknown_user_key: [u8; 32],
    ) -> ScramServer {
        assert!(
            !server_nonce.is_empty() && server_nonce.bytes().all(is_nonce_byte),
            "a server nonce is printable ASCII without commas"
        );
        ScramServer {
            mechanism,
            server_nonce,
            unknown_user_key,
            state: ServerState::AwaitClientFirst,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Takes the client's next message; `credential` looks a user's credential for this
    /// mechanism up. Any error ends the exchange.
    pub fn handle_message(
        &mut self,
        message: &[u8],
        credential: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<ScramStep, AuthError> {
        if message.len() > MAX_MESSAGE_BYTES {
            self.state = ServerState::Finished;
            return Err(AuthError::Malformed("a SCRAM message over 4 KiB"));
        }
        let message = std::str::from_utf8(message)
            .map_err(|_| AuthError::Malformed("a SCRAM message that is not UTF-8"));
        match std::mem::replace(&mut self.state, ServerState::Finished) {
            ServerState::AwaitClientFirst => {
                let (pending, server_first) = self.handle_client_first(message?, credential)?;
                self.state = ServerState::AwaitClientFinal(Box::new(pending));
                Ok(ScramStep::Challenge(server_first.into_bytes()))
            }
            ServerState::AwaitClientFinal(pending) => self.handle_client_final(message?, *pending),
            ServerState::Finished => Err(AuthError::Malformed(
                "a SCRAM message after the exchange ended",
            )),
        }
    }

    fn handle_client_first(
        &self,
        message: &str,
        credential: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<(PendingProof, String), AuthError> {
        let first = ClientFirst::parse(message)?;
        if let Some(authzid) = &first.authzid
            && authzid != &first.user
        {
            return Err(AuthError::Failed(
                "an authorization identity other than the user".into(),
            ));
        }
        let credential = credential(&first.user).filter(|c| c.mechanism == self.mechanism);
        let (salt, iterations) = match &credential {
            Some(credential) => (credential.salt.clone(), credential.iterations),
            None => (self.unknown_user_salt(&first.user), DEFAULT_ITERATIONS),
        };
        let nonce = format!("{}{}", first.client_nonce, self.server_nonce);
        let server_first = format!("r={nonce},s={},i={iterations}", BASE64.encode(&salt));
        let pending = PendingProof {
            user: first.user,
            credential,
            gs2_header: first.gs2_header.to_string(),
            nonce,
            auth_message_start: format!("{},{server_first},", first.bare),
        };
        Ok((pending, server_first))
    }

    fn handle_client_final(
        &self,
        message: &str,
        pending: PendingProof,
    ) -> Result<ScramStep, AuthError> {
        let last = ClientFinal::parse(message)?;
        let binding = BASE64
            .decode(last.channel_binding)
            .map_err(|_| AuthError::Malformed("channel binding that is not base64"))?;
        if binding != pending.gs2_header.as_bytes() {
            return Err(AuthError::Failed(
                "the channel binding does not match the first message".into(),
            ));
        }
        // librdkafka before 2.6 sends the client's nonce twice (client + client + server);
        // Kafka's brokers accept a nonce that ends with the right one since 3.8.1, and so does
        // this. The proof signs the message as sent, nonce included, so nothing is weakened.
        if !last.nonce.ends_with(&pending.nonce) {
            return Err(AuthError::Failed("the nonce does not match".into()));
        }
        let proof = BASE64
            .decode(last.proof)
            .map_err(|_| AuthError::Malformed("a proof that is not base64"))?;
        let Some(credential) = pending.credential else {
            return Err(AuthError::Failed(format!(
                "invalid credentials for user {}",
                pending.user
            )));
        };
        let mechanism = self.mechanism;
        if proof.len() != mechanism.hash_len() {
            return Err(AuthError::Failed(format!(
                "invalid credentials for user {}",
                pending.user
            )));
        }
        let auth_message = format!("{}{}", pending.auth_message_start, last.without_proof);
        let client_signature = mechanism.hmac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let stored_key = mechanism.hash(&client_key);
        if !bool::from(stored_key.ct_eq(&credential.stored_key)) {
            return Err(AuthError::Failed(format!(
                "invalid credentials for user {}",
                pending.user
            )));
        }
        let server_signature = mechanism.hmac(&credential.server_key, auth_message.as_bytes());
        Ok(ScramStep::Authenticated {
            user: pending.user,
            server_final: format!("v={}", BASE64.encode(server_signature)).into_bytes(),
        })
    }

    fn unknown_user_salt(&self, user: &str) -> Vec<u8> {
        let mut salt = self.mechanism.hmac(&self.unknown_user_key, user.as_bytes());
        salt.truncate(SALT_BYTES);
        salt
    }
}

/// `gs2-header client-first-message-bare`, parsed.
struct ClientFirst<'a> {
    gs2_header: &'a str,
    authzid: Option<String>,
    bare: &'a str,
    user: String,
    client_nonce: &'a str,
}

impl<'a> ClientFirst<'a> {
    fn parse(message: &'a str) -> Result<ClientFirst<'a>, AuthError> {
        // gs2-header = gs2-cbind-flag "," [ authzid ] ","
        let (flag, rest) = message.split_once(',').ok_or(AuthError::Malformed(
            "a client-first message without a GS2 header",
        ))?;
        match flag {
            "n" | "y" => {}
            _ if flag.starts_with("p=") => {
                return Err(AuthError::Failed("channel binding is not supported".into()));
            }
            _ => return Err(AuthError::Malformed("an unknown channel-binding flag")),
        }
        let (authzid, bare) = rest.split_once(',').ok_or(AuthError::Malformed(
            "a GS2 header without its second comma",
        ))?;
        let authzid = match authzid {
            "" => None,
            _ => Some(decode_saslname(authzid.strip_prefix("a=").ok_or(
                AuthError::Malformed("an authorization identity without a="),
            )?)?),
        };
        let gs2_header = &message[..message.len() - bare.len()];
        let mut attributes = bare.split(',');
        let user = match attributes.next() {
            Some(attribute) if attribute.starts_with("m=") => {
                return Err(AuthError::Failed(
                    "mandatory SCRAM extensions are not supported".into(),
                ));
            }
            Some(attribute) => decode_saslname(
                attribute
                    .strip_prefix("n=")
                    .ok_or(AuthError::Malformed("a client-first message without n="))?,
            )?,
            None => return Err(AuthError::Malformed("an empty client-first message")),
        };
        if user.is_empty() {
            return Err(AuthError::Malformed("an empty user name"));
        }
        let client_nonce = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("r="))
            .ok_or(AuthError::Malformed("a client-first message without r="))?;
        if client_nonce.is_empty() || !client_nonce.bytes().all(is_nonce_byte) {
            return Err(AuthError::Malformed("a client nonce that is not printable"));
        }
        for extension in attributes {
            // Kafka's one extension names a delegation token, which Strata does not issue.
            if extension.starts_with("tokenauth=") {
                return Err(AuthError::Failed(
                    "delegation tokens are not supported".into(),
                ));
            }
        }
        Ok(ClientFirst {
            gs2_header,
            authzid,
            bare,
            user,
            client_nonce,
        })
    }
}

/// `client-final-message`, parsed.
struct ClientFinal<'a> {
    channel_binding: &'a str,
    nonce: &'a str,
    /// Everything before `,p=`: the last part of AuthMessage.
    without_proof: &'a str,
    proof: &'a str,
}

impl<'a> ClientFinal<'a> {
    fn parse(message: &'a str) -> Result<ClientFinal<'a>, AuthError> {
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(AuthError::Malformed("a client-final message without p="))?;
        let mut attributes = without_proof.split(',');
        let channel_binding = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("c="))
            .ok_or(AuthError::Malformed("a client-final message without c="))?;
        let nonce = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("r="))
            .ok_or(AuthError::Malformed("a client-final message without r="))?;
        Ok(ClientFinal {
            channel_binding,
            nonce,
            without_proof,
            proof,
        })
    }
}

/// Nonce characters: printable ASCII except the comma (RFC 5802 §7).
fn is_nonce_byte(byte: u8) -> bool {
    (0x21..=0x7e).contains(&byte) && byte != b','
}

/// A `saslname`: `=2C` stands for a comma and `=3D` for `=`; any other `=` is malformed.
fn decode_saslname(name: &str) -> Result<String, AuthError> {
    let mut decoded = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        decoded.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3);
        match escape {
            Some("=2C") => decoded.push(','),
            Some("=3D") => decoded.push('='),
            _ => return Err(AuthError::Malformed("a user name with a bad = escape")),
        }
        rest = &rest[at + 3..];
    }
    if rest.contains(',') {
        return Err(AuthError::Malformed("a user name with a bare comma"));
    }
    decoded.push_str(rest);
    Ok(decoded)
}

fn encode_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

enum ClientState {
    Start,
    AwaitServerFirst { bare: String },
    AwaitServerFinal { server_signature: Vec<u8> },
    Finished,
}

/// A client's side of one SCRAM exchange (Strata's own clients, and tests of the server).
pub struct ScramClient {
    mechanism: ScramMechanism,
    user: String,
    password: Vec<u8>,
    client_nonce: String,
    state: ClientState,
}

impl ScramClient {
    /// `client_nonce` is the client's half of the nonce (random, printable, no commas).
    pub fn new(
        mechanism: ScramMechanism,
        user: &str,
        password: &[u8],
        client_nonce: String,
    ) -> ScramClient {
        assert!(
            !client_nonce.is_empty() && client_nonce.bytes().all(is_nonce_byte),
            "a client nonce is printable ASCII without commas"
        );
        ScramClient {
            mechanism,
            user: user.to_string(),
            password: password.to_vec(),
            client_nonce,
            state: ClientState::Start,
        }
    }

    /// The client-first message.
    pub fn first_message(&mut self) -> Vec<u8> {
        assert!(matches!(self.state, ClientState::Start), "sent once");
        let bare = format!("n={},r={}", encode_saslname(&self.user), self.client_nonce);
        let message = format!("n,,{bare}");
        self.state = ClientState::AwaitServerFirst { bare };
        message.into_bytes()
    }

    /// Takes the server-first message, gives the client-final one.
    pub fn handle_server_first(&mut self, message: &[u8]) -> Result<Vec<u8>, AuthError> {
        let ClientState::AwaitServerFirst { bare } =
            std::mem::replace(&mut self.state, ClientState::Finished)
        else {
            return Err(AuthError::Malformed("a server-first message out of turn"));
        };
        let message = std::str::from_utf8(message)
            .map_err(|_| AuthError::Malformed("a server-first message that is not UTF-8"))?;
        if let Some(error) = message.strip_prefix("e=") {
            return Err(AuthError::Failed(error.to_string()));
        }
        let mut attributes = message.split(',');
        let nonce = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("r="))
            .ok_or(AuthError::Malformed("a server-first message without r="))?;
        let salt = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("s="))
            .ok_or(AuthError::Malformed("a server-first message without s="))?;
        let iterations: u32 = attributes
            .next()
            .and_then(|attribute| attribute.strip_prefix("i="))
            .and_then(|iterations| iterations.parse().ok())
            .ok_or(AuthError::Malformed("a server-first message without i="))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(AuthError::Failed(
                "the server's nonce does not extend the client's".into(),
            ));
        }
        check_iterations(iterations)?;
        let salt = BASE64
            .decode(salt)
            .map_err(|_| AuthError::Malformed("a salt that is not base64"))?;
        let mechanism = self.mechanism;
        let salted = mechanism.salted_password(
            &self.password,
            &salt,
            NonZeroU32::new(iterations).expect("checked above"),
        );
        let client_key = mechanism.client_key(&salted);
        let stored_key = mechanism.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", BASE64.encode("n,,"));
        let auth_message = format!("{bare},{message},{without_proof}");
        let client_signature = mechanism.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = mechanism.hmac(&salted, b"Server Key");
        self.state = ClientState::AwaitServerFinal {
            server_signature: mechanism.hmac(&server_key, auth_message.as_bytes()),
        };
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Takes the server-final message: `Ok` once the server proved it knows the credential.
    pub fn handle_server_final(&mut self, message: &[u8]) -> Result<(), AuthError> {
        let ClientState::AwaitServerFinal { server_signature } =
            std::mem::replace(&mut self.state, ClientState::Finished)
        else {
            return Err(AuthError::Malformed("a server-final message out of turn"));
        };
        let message = std::str::from_utf8(message)
            .map_err(|_| AuthError::Malformed("a server-final message that is not UTF-8"))?;
        if let Some(error) = message.strip_prefix("e=") {
            return Err(AuthError::Failed(error.to_string()));
        }
        let verifier = message
            .strip_prefix("v=")
            .ok_or(AuthError::Malformed("a server-final message without v="))?;
        let verifier = BASE64
            .decode(verifier)
            .map_err(|_| AuthError::Malformed("a server signature that is not base64"))?;
        if !bool::from(verifier.ct_eq(&server_signature)) {
            return Err(AuthError::Failed(
                "the server does not know this user's credential".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    /// RFC 7677 §3's SCRAM-SHA-256 example, end to end through both sides.
    #[test]
    fn the_rfc_7677_example_exchange() {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential =
            ScramCredential::new(ScramMechanism::Sha256, b"pencil", &salt, 4096).unwrap();
        let mut client = ScramClient::new(
            ScramMechanism::Sha256,
            "user",
            b"pencil",
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        let mut server = ScramServer::new(
            ScramMechanism::Sha256,
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            KEY,
        );
        let first = client.first_message();
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let ScramStep::Challenge(server_first) = server
            .handle_message(&first, |_| Some(credential.clone()))
            .unwrap()
        else {
            panic!("a challenge first");
        };
        assert_eq!(
            std::str::from_utf8(&server_first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let last = client.handle_server_first(&server_first).unwrap();
        assert_eq!(
            std::str::from_utf8(&last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let ScramStep::Authenticated { user, server_final } =
            server.handle_message(&last, |_| unreachable!()).unwrap()
        else {
            panic!("authenticated after the proof");
        };
        assert_eq!(user, "user");
        assert_eq!(
            std::str::from_utf8(&server_final).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        client.handle_server_final(&server_final).unwrap();
    }

    fn exchange(
        mechanism: ScramMechanism,
        stored: Option<&ScramCredential>,
        password: &[u8],
    ) -> Result<String, AuthError> {
        let mut client = ScramClient::new(mechanism, "al,i=ce", password, "clientnonce".into());
        let mut server = ScramServer::new(mechanism, "servernonce".into(), KEY);
        let ScramStep::Challenge(server_first) =
            server.handle_message(&client.first_message(), |user| {
                assert_eq!(user, "al,i=ce");
                stored.cloned()
            })?
        else {
            panic!("a challenge first");
        };
        let last = client.handle_server_first(&server_first)?;
        match server.handle_message(&last, |_| unreachable!())? {
            ScramStep::Authenticated { user, server_final } => {
                client.handle_server_final(&server_final)?;
                Ok(user)
            }
            ScramStep::Challenge(_) => panic!("two challenges"),
        }
    }

    #[test]
    fn both_mechanisms_accept_the_right_password_and_refuse_a_wrong_one() {
        for mechanism in ScramMechanism::ALL {
            let credential = ScramCredential::new(mechanism, b"secret", b"salty", 4096).unwrap();
            assert_eq!(
                exchange(mechanism, Some(&credential), b"secret").unwrap(),
                "al,i=ce"
            );
            assert!(matches!(
                exchange(mechanism, Some(&credential), b"Secret"),
                Err(AuthError::Failed(_))
            ));
        }
    }

    #[test]
    fn an_unknown_user_fails_at_the_proof_with_a_stable_salt() {
        let mut server = ScramServer::new(ScramMechanism::Sha512, "n1".into(), KEY);
        let mut again = ScramServer::new(ScramMechanism::Sha512, "n2".into(), KEY);
        let first = b"n,,n=ghost,r=abc";
        let ScramStep::Challenge(a) = server.handle_message(first, |_| None).unwrap() else {
            panic!()
        };
        let ScramStep::Challenge(b) = again.handle_message(first, |_| None).unwrap() else {
            panic!()
        };
        let salt = |m: &[u8]| {
            std::str::from_utf8(m)
                .unwrap()
                .split(',')
                .nth(1)
                .unwrap()
                .to_string()
        };
        assert_eq!(
            salt(&a),
            salt(&b),
            "the same made-up salt for the same name"
        );
        assert!(matches!(
            exchange(ScramMechanism::Sha512, None, b"anything"),
            Err(AuthError::Failed(_))
        ));
    }

    #[test]
    fn a_credential_of_the_other_mechanism_does_not_serve() {
        let sha256 = ScramCredential::new(ScramMechanism::Sha256, b"pw", b"salt", 4096).unwrap();
        assert!(exchange(ScramMechanism::Sha512, Some(&sha256), b"pw").is_err());
    }

    #[test]
    fn a_tampered_nonce_or_binding_fails() {
        let credential =
            ScramCredential::new(ScramMechanism::Sha256, b"pw", b"salt", 4096).unwrap();
        for tamper in [
            |m: String| m.replace("c=biws", "c=eSws"),
            |m: String| m.replace("r=abc", "r=abd"),
            |m: String| m.replace("srv,p=", "srw,p="),
        ] {
            let mut client = ScramClient::new(ScramMechanism::Sha256, "u", b"pw", "abc".into());
            let mut server = ScramServer::new(ScramMechanism::Sha256, "srv".into(), KEY);
            let ScramStep::Challenge(server_first) = server
                .handle_message(&client.first_message(), |_| Some(credential.clone()))
                .unwrap()
            else {
                panic!()
            };
            let last =
                String::from_utf8(client.handle_server_first(&server_first).unwrap()).unwrap();
            assert!(
                server
                    .handle_message(tamper(last).as_bytes(), |_| None)
                    .is_err()
            );
        }
    }

    /// librdkafka before 2.6 repeats its nonce in the final message (see the server).
    #[test]
    fn a_final_nonce_with_the_client_part_repeated_is_taken() {
        let credential =
            ScramCredential::new(ScramMechanism::Sha256, b"pw", b"salt", 4096).unwrap();
        let mut server = ScramServer::new(ScramMechanism::Sha256, "srv".into(), KEY);
        let first = "n,,n=u,r=abc";
        let ScramStep::Challenge(server_first) = server
            .handle_message(first.as_bytes(), |_| Some(credential.clone()))
            .unwrap()
        else {
            panic!()
        };
        // The final message as librdkafka 2.0 builds it, signed over what it sends.
        let mechanism = ScramMechanism::Sha256;
        let salted = mechanism.salted_password(b"pw", b"salt", NonZeroU32::new(4096).unwrap());
        let client_key = mechanism.client_key(&salted);
        let without_proof = "c=biws,r=abcabcsrv";
        let auth_message = format!(
            "n=u,r=abc,{},{without_proof}",
            std::str::from_utf8(&server_first).unwrap()
        );
        let signature = mechanism.hmac(&mechanism.hash(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let last = format!("{without_proof},p={}", BASE64.encode(proof));
        assert!(matches!(
            server.handle_message(last.as_bytes(), |_| None),
            Ok(ScramStep::Authenticated { .. })
        ));
    }

    #[test]
    fn malformed_first_messages_are_refused() {
        for message in [
            &b""[..],
            b"n",
            b"n,,",
            b"x,,n=u,r=a",
            b"p=tls-unique,,n=u,r=a",
            b"n,,m=ext,n=u,r=a",
            b"n,,n=u=2X,r=a",
            b"n,,n=,r=a",
            b"n,,n=u",
            b"n,,n=u,r=",
            b"n,a=other,n=u,r=a",
            b"n,,n=u,r=a,tokenauth=true",
            b"\xff\xfe",
        ] {
            let mut server = ScramServer::new(ScramMechanism::Sha256, "s".into(), KEY);
            assert!(
                server.handle_message(message, |_| None).is_err(),
                "{:?}",
                String::from_utf8_lossy(message)
            );
        }
        let mut server = ScramServer::new(ScramMechanism::Sha256, "s".into(), KEY);
        assert!(server.handle_message(&[b'a'; 5000], |_| None).is_err());
    }

    #[test]
    fn plain_passwords_check_against_the_stored_credential() {
        let credential =
            ScramCredential::new(ScramMechanism::Sha512, b"pw", b"salt", 4096).unwrap();
        assert!(credential.verify_password(b"pw"));
        assert!(!credential.verify_password(b"pW"));
        assert!(!credential.verify_password(b""));
    }

    #[test]
    fn a_salted_password_gives_the_same_credential_as_the_password() {
        let mechanism = ScramMechanism::Sha512;
        let salted = mechanism.salted_password(b"pw", b"salt", NonZeroU32::new(4096).unwrap());
        assert_eq!(
            ScramCredential::from_salted_password(mechanism, &salted, b"salt", 4096).unwrap(),
            ScramCredential::new(mechanism, b"pw", b"salt", 4096).unwrap()
        );
        assert!(
            ScramCredential::from_salted_password(mechanism, &salted[1..], b"salt", 4096).is_err()
        );
    }

    #[test]
    fn iterations_outside_kafkas_bounds_are_refused() {
        assert!(ScramCredential::new(ScramMechanism::Sha256, b"pw", b"s", 4095).is_err());
        assert!(ScramCredential::new(ScramMechanism::Sha256, b"pw", b"s", 16385).is_err());
        assert!(ScramCredential::new(ScramMechanism::Sha256, b"", b"s", 4096).is_err());
    }

    #[test]
    fn a_stored_credential_keeps_no_password_and_round_trips() {
        let credential =
            ScramCredential::new(ScramMechanism::Sha256, b"hunter2-password", b"salt", 4096)
                .unwrap();
        let json = serde_json::to_string(&credential).unwrap();
        assert!(!json.contains("hunter2"));
        assert!(json.contains("SCRAM-SHA-256"));
        let back: ScramCredential = serde_json::from_str(&json).unwrap();
        assert_eq!(back, credential);
        back.validate().unwrap();
        assert!(!format!("{credential:?}").contains("stored_key"));
    }

    proptest::proptest! {
        /// No input makes the server panic, at either step.
        #[test]
        fn arbitrary_messages_never_panic(first in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
                                          last in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let credential = ScramCredential::new(ScramMechanism::Sha256, b"pw", b"salt", 4096).unwrap();
            let mut server = ScramServer::new(ScramMechanism::Sha256, "s".into(), KEY);
            let _ = server.handle_message(&first, |_| Some(credential.clone()));
            let _ = server.handle_message(&last, |_| Some(credential.clone()));
        }

        /// Valid-looking messages with arbitrary fields never panic either.
        #[test]
        fn arbitrary_fields_never_panic(user in "[ -~]{0,20}", nonce in "[ -~]{0,20}", proof in "[ -~]{0,60}") {
            let credential = ScramCredential::new(ScramMechanism::Sha512, b"pw", b"salt", 4096).unwrap();
            let mut server = ScramServer::new(ScramMechanism::Sha512, "s".into(), KEY);
            let _ = server.handle_message(format!("n,,n={user},r={nonce}").as_bytes(), |_| Some(credential.clone()));
            let _ = server.handle_message(format!("c=biws,r={nonce}s,p={proof}").as_bytes(), |_| None);
        }
    }
}
