//! `libcascade`: the C API of `include/cascade.h` (`capi`) and the interposition wrappers
//! that let unmodified programs use the node store (`interpose`): every function listed in
//! `intercepted.txt` serves paths under the mount prefix from the store and passes the rest
//! to glibc. Built as `libcascade.so` (LD_PRELOAD, or `-lcascade`) and `libcascade.a`; the
//! same sources make `libcascade_wrap.a` for static programs (crate `cascade-wrap`). Design
//! and semantics: docs/interposition.md.

mod capi;
mod interpose;
pub use capi::*;
