//! A Kafka request frame's content, as a client that has proven nothing yet can send it: the
//! listener decodes it, and refuses an API or version it does not serve with the answer
//! `refusal` builds. Neither may panic, and a refusal is a whole frame.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use strata_kafka::frame::{Rejected, SIZE_LEN, decode_request};
use strata_kafka::refusal::unsupported_version_answer;

fuzz_target!(|data: &[u8]| {
    let frame = Bytes::copy_from_slice(data);
    if let Err(Rejected::Unsupported {
        api_key,
        api_version,
        correlation_id,
    }) = decode_request(frame.clone())
        && let Some(answer) = unsupported_version_answer(api_key, api_version, correlation_id, &frame)
    {
        let size = i32::from_be_bytes(answer[..SIZE_LEN].try_into().unwrap());
        assert_eq!(size as usize + SIZE_LEN, answer.len());
    }
});
