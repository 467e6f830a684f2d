//! tracing-subscriber setup; nothing else.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. `level` is an EnvFilter directive (`info`, `natsproxy=debug`).
/// The human format is coloured only when stderr is a terminal and `NO_COLOR` is unset
/// or empty (<https://no-color.org>): `kubectl logs` and a log pipeline's file source
/// get plain text.
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Human => b.try_init(),
        LogFormat::Json => b.json().flatten_event(true).try_init(),
    };
}

/// Colour on a terminal, unless `NO_COLOR` is set to anything but the empty string.
pub fn use_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
    }
}
