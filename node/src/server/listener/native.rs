//! The native protocol on the connection driver: little-endian frames, requests answered as
//! they complete (matched by correlation id), every API through [`Shard::handle`].
//!
//! An oversized frame gets MESSAGE_TOO_LARGE (with its correlation id when its header came)
//! and the connection is closed; an undecodable request gets a typed error response; a
//! handler's panic is answered INTERNAL, so the client need not wait out its request timeout.

use std::net::SocketAddr;
use std::rc::Rc;

use bytes::{Buf, BytesMut};
use strata_wire::protocol::{ErrorCode, REQUEST_HEADER_LEN, Request, RequestHeader, Response};
use tokio::task::JoinHandle;

use super::{Authentication, Client, Decoded, Endpoint, Outcome, Protocol};
use crate::server::messages::Delivery;
use crate::server::security::ListenerSpec;
use crate::server::shard::Shard;

/// Binds the shared client port (SO_REUSEPORT, every shard) and this shard's own port, and
/// starts accepting on both.
pub(super) fn listen(
    shard: &Rc<Shard>,
    auth: &Rc<Authentication>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let config = &shard.context.config;
    let shared = super::bind(config.listen, true)?;
    let own_address = SocketAddr::new(config.listen.ip(), config.shard_port(shard.context.index));
    let own = super::bind(own_address, false)?;
    let endpoint = |address| {
        Endpoint::new(
            shard,
            ListenerSpec {
                protocol: config.listen_protocol,
                address,
            },
            auth.clone(),
        )
    };
    Ok(vec![
        super::accept::<Native>(shard.clone(), shared, endpoint(config.listen)?),
        super::accept::<Native>(shard.clone(), own, endpoint(own_address)?),
    ])
}

pub(super) struct Native;

fn error_answer(correlation_id: u32, code: ErrorCode) -> Outcome {
    Outcome::Answer(Response::encode_error(correlation_id, code).into())
}

impl Protocol for Native {
    type Header = RequestHeader;
    type Request = Request;
    type Session = ();
    const NAME: &'static str = "native";
    const IN_FLIGHT: usize = 256;
    const IN_ORDER: bool = false;
    const BIG_ENDIAN: bool = false;
    const HEAD_LEN: usize = REQUEST_HEADER_LEN;
    const MIN_FRAME_LEN: usize = REQUEST_HEADER_LEN;

    fn count_connection(_shard: &Shard, _delta: i64) {}

    fn open(_endpoint: &Endpoint) {}

    fn max_frame_bytes(_session: &(), configured: usize) -> usize {
        configured
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

    fn decode(_shard: &Shard, _session: &(), client: &Client, body: BytesMut) -> Decoded<Native> {
        let peer = client.peer;
        match Request::decode(body) {
            Ok((header, request)) => Decoded::Request(header, request),
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
        _shard: &Rc<Shard>,
        _endpoint: &Endpoint,
        _session: &mut (),
        _client: &mut Client,
        header: RequestHeader,
        _request: Request,
    ) -> Decoded<Native> {
        Decoded::Answered(error_answer(
            header.correlation_id,
            ErrorCode::InvalidRequest,
        ))
    }

    async fn respond(
        shard: Rc<Shard>,
        client: Client,
        header: &RequestHeader,
        request: Request,
    ) -> Outcome {
        let answer = match request {
            // Through TLS, records travel as bytes: sendfile would bypass the session.
            Request::Fetch(fetch) if !client.takes_file_ranges() => Some(Ok(Response::Fetch(
                shard.fetch(fetch, Delivery::Bytes).await,
            ))),
            request => shard.handle(request).await,
        };
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
