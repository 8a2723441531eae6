//! `libcascade_wrap.a`: the interposition wrappers of `crates/cascade-preload`, compiled a
//! second time with `cfg(cascade_wrap)` so that each one is exported as `__wrap_NAME` and
//! reaches the original through `__real_NAME`, for programs linked statically with
//! `ld --wrap=NAME` (the flags `cascade link-flags` prints). One source, two exports.

#[path = "../../cascade-preload/src/capi.rs"]
mod capi;
#[path = "../../cascade-preload/src/interpose/mod.rs"]
mod interpose;

pub use capi::*;
