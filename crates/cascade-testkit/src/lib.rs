//! The test kit of the Cascade workspace: what more than one test suite needs, in one place.
//! Not published; a dev-dependency of the crates whose tests use it (and usable by the
//! bench). Everything is re-exported at the root, so a test file says
//! `use cascade_testkit::*;`.
//!
//! - **Data** ([`data`]): [`pattern`] (xorshift bytes), [`random`] (BLAKE3 XOF bytes),
//!   [`compressible`] and [`counting_doubles`] (doubles that compress), [`b3`] (BLAKE3 hex),
//!   [`MIB`].
//! - **Waiting** ([`wait`]): [`wait_for`], [`wait_until`], [`poll`]: poll a condition with a
//!   deadline; a test never sleeps a guessed time as synchronisation.
//! - **Artifacts** ([`build`](mod@build)): [`repo_root`], [`build`](fn@build) (`cargo build -p ...`
//!   into the running test's target directory and profile), [`cascade_bin`] (the `cascade`
//!   binary with libcascade.so next to it), [`preload_library`] (libcascade.so).
//! - **Processes** ([`process`]): [`run_with_timeout`] and its [`Out`] (text), or
//!   [`output_within`], [`number_printed_by`] and [`wait_output`] (a std `Output`): a command that hangs is killed
//!   and fails the test; [`Daemon`], a
//!   background process whose stderr is collected as whole lines (readiness is one whole
//!   line it prints, [`Daemon::wait_line`]), always killed and reaped.
//! - **A node** ([`node`]): [`Env`], a store of the test's own with the `cascade` binary run
//!   against it in a clean environment (commands, [`Env::agent`] ready after its start line);
//!   [`cascade_command`], [`serial`] and [`begin`] (tests that must not run at once),
//!   [`stop_agent`], [`levels_line`], [`read_store_file`], [`write_store_file`].
//! - **Servers**: [`StageServer`] (`cascade stage-server`, ready after its start line, the
//!   address read from it; kill and restart on the same port), [`Versitygw`] (a real S3
//!   server, ready when its port accepts; stop and restart on the same port), with
//!   [`versitygw::ACCESS`], [`versitygw::SECRET`] and [`free_port`]; [`CuttingProxy`], a
//!   TCP proxy in front of it that cuts chosen PUTs part-way through their bodies.
//! - **TLS** ([`tls`]): [`TestPki`], a CA and a server certificate for 127.0.0.1 and
//!   localhost (rcgen), written as PEM files, and a second CA that signed nothing of it.
//! - **Durable stores** ([`durable`]): [`durable_at`] (a directory as the durable store),
//!   [`Expected`] and [`assert_durable_checkpoint`]; [`fsync`]: checks of a directory
//!   store's fsync trace (every write durable before it returned, markers last).
//! - **Another uid** ([`impostor`]): a process bound at an agent's socket path answering as
//!   another user, for the socket owner checks.
//! - **Real checkpoint series** ([`real_series`]): bench/datasets/make.sh's quick series.
//! - **File system** ([`fs`]): [`files_below`] (a tree's files), [`Tmpfs`] (a small full
//!   disk; root only) and [`RemoveDir`].

pub mod build;
pub mod cut_proxy;
pub mod data;
pub mod durable;
pub mod fs;
pub mod fsync;
pub mod impostor;
pub mod node;
pub mod process;
pub mod real_series;
pub mod stage_server;
pub mod tls;
pub mod versitygw;
pub mod wait;

pub use build::{build, cascade_bin, compile_heat, preload_library, repo_root};
pub use cut_proxy::CuttingProxy;
pub use data::{b3, compressible, counting_doubles, pattern, random, MIB};
pub use durable::{assert_durable_checkpoint, durable_at, expected, Expected};
pub use fs::{files_below, RemoveDir, Tmpfs};
pub use node::{
    begin, cascade_command, levels_line, read_store_file, serial, stop_agent, write_store_file, Env,
};
pub use process::{
    log_message, number_printed_by, output_within, run_with_timeout, seconds_after, wait_output,
    with_default_signal_actions, Daemon, Out,
};
pub use stage_server::{break_drain_target, with_unreachable_target, StageServer};
pub use tls::TestPki;
pub use versitygw::{free_port, Versitygw};
pub use wait::{poll, wait_for, wait_until};
