//! `libcascade`: the C API of `include/cascade.h` and (issue 3, in progress) the
//! interposition wrappers that let unmodified programs use the node store.

mod capi;
mod interpose;
pub use capi::*;
