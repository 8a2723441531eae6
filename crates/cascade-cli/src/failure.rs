//! How the CLI fails: a one-line message and an exit code.

use cascade_config::ConfigError;
use cascade_store::{errno_text, Error};

/// Exit code for failures of the operation (and for fsck finding errors).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for a command line that does not parse, as clap and most tools use.
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: EXIT_FAILURE,
        }
    }

    /// A store error about `what` (a store path, or "store NAME"): "/ckpt/a: No such file
    /// or directory". Whatever more the store says goes in parentheses after it.
    pub fn store(what: &str, err: &Error) -> Failure {
        let text = errno_text(err.errno());
        let context = err.context();
        if context.is_empty() || context.trim_start_matches('/') == what.trim_start_matches('/') {
            Failure::new(format!("{what}: {text}"))
        } else {
            Failure::new(format!("{what}: {text} ({context})"))
        }
    }

    /// A local I/O error about `what` (usually a local path).
    pub fn io(what: &str, err: &std::io::Error) -> Failure {
        Failure::new(format!("{what}: {}", cascade_config::io_text(err)))
    }
}

impl From<ConfigError> for Failure {
    fn from(err: ConfigError) -> Failure {
        Failure::new(err.0)
    }
}

impl From<cascade_lifecycle::Error> for Failure {
    fn from(err: cascade_lifecycle::Error) -> Failure {
        Failure::new(err.message)
    }
}
