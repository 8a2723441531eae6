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
        filter: if quiet {
            "warn".to_string()
        } else {
            config.text("log.level").to_string()
        },
        repeats: u32::try_from(config.number("log.repeats")).unwrap_or(u32::MAX),
        window: Duration::from_millis(config.number("log.repeat_window").max(1)),
    };
    cascade_observe::log::init(&opts).map_err(Failure::new)
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
