//! Arbitrary bytes as a stream of frames read with `protocol::read_frame` (the first byte
//! chooses how the reader splits the stream; see `cascade_wire_fuzz::read_frames`).
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;

thread_local! {
    // Reused between inputs, as the server and client reuse theirs.
    static BODY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fuzz_target!(|data: &[u8]| {
    BODY.with(|b| {
        cascade_wire_fuzz::read_frames(data, &mut b.borrow_mut());
    });
});
