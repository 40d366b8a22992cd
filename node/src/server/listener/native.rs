//! The native protocol on the connection driver: little-endian frames, requests answered as
//! they complete (matched by correlation id), every API through [`Shard::handle`].
//!
//! An oversized frame gets MESSAGE_TOO_LARGE (with its correlation id when its header came)
//! and the connection is closed; an undecodable request gets a typed error response; a
//! handler's panic is answered INTERNAL, so the client need not wait out its request timeout.
//!
//! On a SASL listener the first requests are Authenticate steps ([`super::sasl`]); anything
//! else before them is answered AUTHENTICATION_FAILED and the connection closed. Every request
//! is then checked against the ACLs ([`super::native_security`]).

use std::net::SocketAddr;
use std::rc::Rc;

use bytes::{Buf, BytesMut};
use strata_coordinator::quotas::QuotaKey;
use strata_wire::protocol::{
    AuthenticateResponse, ErrorCode, REQUEST_HEADER_LEN, Request, RequestHeader, Response,
};
use tokio::task::JoinHandle;

use super::sasl::{self, SaslSession};
use super::{
    Authentication, Client, Decoded, Endpoint, Outcome, Protocol, native_security, native_share,
    quota,
};
use crate::server::messages::Delivery;
use crate::server::security::ListenerSpec;
use crate::server::shard::Shard;

/// Binds the shared client port (SO_REUSEPORT, every shard) and this shard's own port, and
/// starts accepting on both.
pub(super) fn listen(
    shard: &Rc<Shard>,
    auth: &Rc<Authentication>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut accepting = Vec::new();
    for listener in shard.context.config.native_listeners() {
        let shared = super::bind(listener.address, true)?;
        let own_port =
            crate::server::listener_shard_port(listener.address.port(), shard.context.index);
        let own_address = SocketAddr::new(listener.address.ip(), own_port);
        let own = super::bind(own_address, false)?;
        let endpoint = |address| {
            Endpoint::new(
                shard,
                ListenerSpec {
                    protocol: listener.protocol,
                    address,
                },
                auth.clone(),
            )
        };
        accepting.push(super::accept::<Native>(
            shard.clone(),
            shared,
            endpoint(listener.address)?,
        ));
        accepting.push(super::accept::<Native>(
            shard.clone(),
            own,
            endpoint(own_address)?,
        ));
    }
    Ok(accepting)
}

pub(super) struct Native;

fn error_answer(correlation_id: u32, code: ErrorCode) -> Outcome {
    Outcome::Answer(Response::encode_error(correlation_id, code).into())
}

impl Protocol for Native {
    type Header = RequestHeader;
    type Request = Request;
    const NAME: &'static str = "native";
    const IN_FLIGHT: usize = 256;
    const IN_ORDER: bool = false;
    const BIG_ENDIAN: bool = false;
    const HEAD_LEN: usize = REQUEST_HEADER_LEN;
    const MIN_FRAME_LEN: usize = REQUEST_HEADER_LEN;

    fn count_connection(shard: &Shard, delta: i64) {
        shard.metrics.native_connections(delta);
    }

    fn refuse_frame(len: usize, max: usize, head: Option<&[u8]>) -> (Option<Outcome>, String) {
        let code = if len > max {
            ErrorCode::MessageTooLarge
        } else {
            ErrorCode::InvalidRequest
        };
        let answer = head.map(|head| error_answer((&head[4..8]).get_u32_le(), code));
        (answer, format!("frame of {len} bytes ({code})"))
    }

    fn decode(
        shard: &Shard,
        session: &SaslSession,
        client: &Client,
        body: BytesMut,
    ) -> Decoded<Native> {
        let peer = client.peer;
        match Request::decode(body) {
            Ok((header, request @ Request::Authenticate(_))) => {
                Decoded::Authenticate(header, request)
            }
            Ok((header, request)) => match session.admit(shard.context.config.clock.now()) {
                Ok(()) => {
                    if let Request::Produce(produce) = &request {
                        let bytes = produce
                            .topics
                            .iter()
                            .flat_map(|topic| &topic.partitions)
                            .map(|partition| partition.records.len())
                            .sum();
                        quota::charge_produce(shard, client, "", bytes);
                    }
                    Decoded::Request(header, request)
                }
                Err(why) => Decoded::Close(
                    Some(error_answer(
                        header.correlation_id,
                        ErrorCode::AuthenticationFailed,
                    )),
                    format!("{:?} {why}", request.api_key()),
                ),
            },
            Err(rejected) => {
                tracing::warn!(%peer, code = %rejected.code, "rejected request: {}", rejected.reason);
                match rejected.header {
                    Some(header) => {
                        Decoded::Answered(error_answer(header.correlation_id, rejected.code))
                    }
                    None => Decoded::Close(None, "a request without a readable header".into()),
                }
            }
        }
    }

    async fn authenticate(
        shard: &Rc<Shard>,
        endpoint: &Endpoint,
        session: &mut SaslSession,
        client: &mut Client,
        header: RequestHeader,
        request: Request,
    ) -> Decoded<Native> {
        let Request::Authenticate(request) = request else {
            return Decoded::Close(None, "an authentication step that is not one".into());
        };
        let answer = |response: AuthenticateResponse| {
            Outcome::Answer(Response::Authenticate(response).encode_parts(header.correlation_id))
        };
        let refused = |message: String| AuthenticateResponse {
            error: ErrorCode::AuthenticationFailed,
            message,
            token: String::new(),
            authenticated: false,
            session_lifetime_ms: 0,
        };
        if !session.exchanging() {
            let offered: &[_] = if endpoint.spec.protocol.uses_sasl() {
                &shard.context.config.security.sasl_mechanisms
            } else {
                &[]
            };
            let started = session.handle_handshake(
                1,
                &request.mechanism,
                offered,
                crate::server::security::random_nonce(18),
                endpoint.auth.unknown_user_key,
            );
            if started.is_err() {
                let names: Vec<&str> = offered.iter().map(|m| m.name()).collect();
                let why = format!(
                    "{} is not offered here (offered: {})",
                    request.mechanism,
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                );
                return Decoded::Close(Some(answer(refused(why.clone()))), why);
            }
        }
        let step = sasl::step(shard, endpoint, session, client, request.token.as_bytes()).await;
        let (token, authenticated, session_lifetime_ms) = match step {
            sasl::Step::Continue(bytes) => (bytes, false, 0),
            sasl::Step::Authenticated { bytes, lifetime_ms } => {
                (bytes, true, lifetime_ms.max(0) as u64)
            }
            sasl::Step::Failed { mechanism, why } => {
                let message = format!("invalid credentials with SASL mechanism {mechanism}");
                return Decoded::Close(
                    Some(answer(refused(message))),
                    format!("SASL authentication failed: {why}"),
                );
            }
        };
        Decoded::Answered(answer(AuthenticateResponse {
            error: ErrorCode::None,
            message: String::new(),
            token: String::from_utf8_lossy(&token).into_owned(),
            authenticated,
            session_lifetime_ms,
        }))
    }

    async fn respond(
        shard: Rc<Shard>,
        client: Client,
        header: &RequestHeader,
        request: Request,
    ) -> Outcome {
        if let Some(code) = native_security::refusal(&shard, &client, &request) {
            return error_answer(header.correlation_id, code);
        }
        if let Some(response) = native_security::respond(&shard, &request).await {
            return Outcome::Answer(response.encode_parts(header.correlation_id));
        }
        let mut answer = serve_under_quotas(&shard, &client, request).await;
        if let Some(Ok(response)) = &mut answer {
            native_security::filter_answer(&shard, &client, response);
            match response {
                Response::Metadata(metadata) => same_listener_ports(&shard, &client, metadata),
                Response::FindCoordinator(found) => {
                    if let Some(listener) = same_listener(&shard, &client, found.node_id) {
                        found.port = listener.port;
                    }
                }
                _ => {}
            }
        }
        match answer {
            Some(Ok(response)) => Outcome::Answer(response.encode_parts(header.correlation_id)),
            Some(Err(code)) => error_answer(header.correlation_id, code),
            None => Outcome::NoAnswer,
        }
    }

    fn panicked(header: &RequestHeader) -> Outcome {
        error_answer(header.correlation_id, ErrorCode::Internal)
    }
}

/// Runs a request under the client's fetch and request-time quotas (its produce bytes were
/// counted as it was read). Native clients send no client id: their quotas are their user's
/// and the default client id's. Native answers have no throttle field: the connection is
/// held instead, and a fetch over its rate is answered empty once its wait is over.
async fn serve_under_quotas(
    shard: &Rc<Shard>,
    client: &Client,
    mut request: Request,
) -> Option<Result<Response, ErrorCode>> {
    let charge = quota::Charge::new(shard, client, "");
    let now = shard.context.config.clock.now();
    if let Request::Fetch(fetch) = &mut request {
        let wait = charge.throttle(QuotaKey::ConsumerByteRate, now);
        if !wait.is_zero() {
            charge.hold(QuotaKey::ConsumerByteRate, wait, now);
            shard.context.config.clock.sleep(wait).await;
            let empty = strata_wire::protocol::FetchResponse {
                topics: Vec::new(),
                stability: Default::default(),
            };
            return Some(Ok(Response::Fetch(empty)));
        }
        if let Some(most) = charge.max_answer_bytes(QuotaKey::ConsumerByteRate) {
            let most = u32::try_from(most.max(1)).unwrap_or(u32::MAX);
            fetch.max_bytes = fetch.max_bytes.min(most);
        }
    }
    let serve = async {
        match request {
            // Through TLS, records travel as bytes: sendfile would bypass the session.
            Request::Fetch(fetch) if !client.takes_file_ranges() => Some(Ok(Response::Fetch(
                shard.fetch(fetch, Delivery::Bytes).await,
            ))),
            request if native_share::is_share_request(&request) => {
                native_share::serve(shard, client, request).await
            }
            request => shard.handle(request).await,
        }
    };
    let answer = if charge.governs(QuotaKey::RequestPercentage).is_some() {
        let (answer, spent) = quota::timed(serve).await;
        let now = shard.context.config.clock.now();
        let share = quota::request_share(spent);
        let wait = charge.record(QuotaKey::RequestPercentage, share, now);
        charge.hold(QuotaKey::RequestPercentage, wait, now);
        answer
    } else {
        serve.await
    };
    if let Some(Ok(Response::Fetch(fetched))) = &answer
        && charge.governs(QuotaKey::ConsumerByteRate).is_some()
    {
        let bytes: usize = fetched
            .topics
            .iter()
            .flat_map(|topic| &topic.partitions)
            .map(|partition| partition.records.len())
            .sum();
        let now = shard.context.config.clock.now();
        let wait = charge.record(QuotaKey::ConsumerByteRate, bytes as f64, now);
        charge.hold(QuotaKey::ConsumerByteRate, wait, now);
    }
    answer
}

/// Points each broker of a Metadata answer at the ports of the listener `client` came through
/// (its name, on every broker), when that is not the broker's first listener.
fn same_listener_ports(
    shard: &Shard,
    client: &Client,
    metadata: &mut strata_wire::protocol::MetadataResponse,
) {
    for broker in &mut metadata.brokers {
        if let Some(listener) = same_listener(shard, client, broker.node_id) {
            broker.port = listener.port;
            broker.shard_ports = listener.shard_ports;
        }
    }
}

/// Broker `node_id`'s native listener of the kind `client` came through, when it has more than
/// its first: where Metadata and FindCoordinator answers send the client.
fn same_listener(
    shard: &Shard,
    client: &Client,
    node_id: i32,
) -> Option<strata_coordinator::AdvertisedNativeListener> {
    let name = client.listener.protocol.name();
    let view = shard.view.borrow();
    view.brokers
        .iter()
        .find(|known| known.id == node_id)
        .and_then(|known| known.native_listeners.iter().find(|l| l.name == name))
        .cloned()
}
