//! Arbitrary bytes as a whole request frame (`decode_request_frame`), as a reply frame, and
//! as the body of every message kind, request and reply (`Request::decode`, `Reply::decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cascade_wire_fuzz::decode_frame(data);
});
