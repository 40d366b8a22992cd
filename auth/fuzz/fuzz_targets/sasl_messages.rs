//! What an unauthenticated peer can send: a SCRAM exchange's two messages (split from the input
//! at its first NUL) against both mechanisms, with and without a stored credential, and the
//! input as a PLAIN message. Any bytes give an answer or a typed error, never a panic, and
//! never an authenticated exchange without the password.

#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_auth::scram::{ScramCredential, ScramMechanism, ScramServer, ScramStep};

/// Each mechanism's stored credential, made once (PBKDF2 would dominate every run).
fn credentials() -> &'static [ScramCredential; 2] {
    static CREDENTIALS: std::sync::OnceLock<[ScramCredential; 2]> = std::sync::OnceLock::new();
    CREDENTIALS.get_or_init(|| {
        ScramMechanism::ALL.map(|mechanism| {
            ScramCredential::new(mechanism, b"fuzz-password", b"salt", 4096)
                .expect("a valid credential")
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = strata_auth::plain::parse(data);
    let (first, last) = match data.iter().position(|&byte| byte == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    for (mechanism, credential) in ScramMechanism::ALL.into_iter().zip(credentials()) {
        for stored in [Some(credential.clone()), None] {
            let mut server = ScramServer::new(mechanism, "server-nonce".into(), [3; 32]);
            let _ = server.handle_message(first, |_| stored.clone());
            let step = server.handle_message(last, |_| stored.clone());
            // A proof needs the password: random bytes never carry one.
            assert!(
                !matches!(step, Ok(ScramStep::Authenticated { .. })),
                "authenticated without the password"
            );
        }
    }
});
