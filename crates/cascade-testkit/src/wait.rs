//! Waiting for a condition: poll it with a deadline. A test never sleeps a guessed time to let
//! something happen; it polls what it waits for and fails with a message when the deadline
//! passes.

use std::time::{Duration, Instant};

/// How long the waits here pause between two polls.
pub const POLL: Duration = Duration::from_millis(5);

/// Polls `cond` until it holds, failing the test after `timeout` with `what`.
#[track_caller]
pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// Polls `cond` until it holds (true) or `timeout` passes (false), for callers that add
/// their own diagnostics to the failure.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll(timeout, || cond().then_some(())).is_some()
}

/// Polls `probe` until it returns something (returned) or `timeout` passes (None).
pub fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}
