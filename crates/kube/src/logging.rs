//! Structured logs for every nodemedic process.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); JSON when `json` is set, for log
/// pipelines. Safe to call twice (the second call does nothing).
pub fn init(json: bool) {
    init_with_default(json, "info");
}

/// Like [`init`], with `default` as the filter when `RUST_LOG` is unset.
pub fn init_with_default(json: bool, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry.with(fmt::layer().with_writer(std::io::stderr)).try_init()
    };
    // Already initialised (tests start several components in one process): keep the first.
    let _ = result;
}
