//! Logs and metrics of the long-running commands (`agent`, `stage-server`): docs/operations.md.

use std::time::Duration;

use cascade_config::Config;
use cascade_observe::log::{Format, Guard, LogOptions};

use crate::failure::Failure;

/// Sets up the log lines from log.* (`quiet`: warnings and errors only). Keep the guard
/// until the command returns: it reports repeats still held back.
pub fn start_logs(config: &Config, quiet: bool) -> Result<Guard, Failure> {
    let opts = LogOptions {
        format: config
            .text("log.format")
            .parse::<Format>()
            .map_err(Failure::new)?,
        filter: filter(if quiet {
            "warn"
        } else {
            config.text("log.level")
        }),
        repeats: u32::try_from(config.number("log.repeats")).unwrap_or(u32::MAX),
        window: Duration::from_millis(config.number("log.repeat_window").max(1)),
    };
    cascade_observe::log::init(&opts).map_err(Failure::new)
}

/// A bare level is for Cascade's own lines; other libraries' (the S3 client's retries, ...)
/// are shown from warn up, or as given in directives with `=`.
fn filter(level: &str) -> String {
    if level.contains('=') || level.contains(',') || level.is_empty() {
        return level.to_string();
    }
    let others = match level.to_ascii_lowercase().as_str() {
        "off" => "off",
        "error" => "error",
        _ => "warn",
    };
    format!("{others},cascade={level}")
}

/// Serves `render` at http://ADDR/metrics if `addr` (the setting `key`) is set.
pub fn serve_metrics(
    config: &Config,
    key: &str,
    who: &str,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> Result<(), Failure> {
    let addr = config.text(key);
    if addr.is_empty() {
        return Ok(());
    }
    let bound = cascade_observe::metrics::serve(addr, render)
        .map_err(|e| Failure::new(format!("cannot serve metrics on {addr} ({key}): {e}")))?;
    cascade_observe::info!("{who}: metrics on http://{bound}/metrics");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::filter;

    #[test]
    fn a_bare_level_is_for_cascade_and_directives_are_kept() {
        assert_eq!(filter("info"), "warn,cascade=info");
        assert_eq!(filter("debug"), "warn,cascade=debug");
        assert_eq!(filter("error"), "error,cascade=error");
        assert_eq!(filter("warn,object_store=info"), "warn,object_store=info");
    }
}
