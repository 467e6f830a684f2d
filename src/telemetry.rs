//! tracing-subscriber setup; nothing else.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. `level` is an EnvFilter directive (`info`, `natsproxy=debug`).
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => b.try_init(),
        LogFormat::Json => b.json().flatten_event(true).try_init(),
    };
}
