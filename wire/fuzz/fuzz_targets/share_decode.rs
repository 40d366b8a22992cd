//! The share group messages (KIP-932: heartbeat, fetch, acknowledge, describes), straight at
//! their decoders: the first byte picks the api, the rest is the message after the header.
//! Any bytes give a value or a typed error, never a panic; a request that decodes re-encodes
//! to a frame that decodes to the same thing.

#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use strata_wire::protocol::{ApiKey, Request, Response};

const SHARE_APIS: [ApiKey; 5] = [
    ApiKey::ShareGroupHeartbeat,
    ApiKey::ShareFetch,
    ApiKey::ShareAcknowledge,
    ApiKey::DescribeShareGroup,
    ApiKey::DescribeSharePartitions,
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, message)) = data.split_first() else {
        return;
    };
    let api = SHARE_APIS[usize::from(pick) % SHARE_APIS.len()];
    let mut request = BytesMut::new();
    request.put_u16_le(api as u16);
    request.put_u16_le(0);
    request.put_u32_le(7);
    request.extend_from_slice(message);
    if let Ok((header, decoded)) = Request::decode(request) {
        let again = format!("{decoded:?}");
        let mut frame = Vec::new();
        for chunk in decoded.encode(header.correlation_id) {
            frame.extend_from_slice(&chunk);
        }
        let (_, redecoded) =
            Request::decode(BytesMut::from(&frame[4..])).expect("a re-encoded request decodes");
        let normalise = |text: String| text.replace("Shared(", "R(").replace("Mutable(", "R(");
        assert_eq!(normalise(format!("{redecoded:?}")), normalise(again));
    }
    let mut response = BytesMut::new();
    response.put_u32_le(7);
    response.put_u16_le(0);
    response.extend_from_slice(message);
    let _ = Response::decode(api, response);
});
