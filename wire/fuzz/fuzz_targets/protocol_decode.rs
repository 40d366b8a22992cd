//! Request and response decoding: any bytes give a value or a typed error, never a panic, and
//! a decoded request re-encodes to a frame that decodes to the same thing.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use strata_wire::protocol::{ApiKey, Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok((header, request)) = Request::decode(BytesMut::from(data)) {
        let again = format!("{request:?}");
        let mut frame = Vec::new();
        for chunk in request.encode(header.correlation_id) {
            frame.extend_from_slice(&chunk);
        }
        let (header2, decoded) =
            Request::decode(BytesMut::from(&frame[4..])).expect("a re-encoded request decodes");
        assert_eq!(header.correlation_id, header2.correlation_id);
        let normalise = |text: String| text.replace("Shared(", "R(").replace("Mutable(", "R(");
        assert_eq!(normalise(format!("{decoded:?}")), normalise(again));
    }
    for api in ApiKey::ALL {
        let _ = Response::decode(api, BytesMut::from(data));
    }
});
