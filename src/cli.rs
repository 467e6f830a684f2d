//! Command line (clap derive). Every flag can also come from a `NATSPROXY_*` variable.

use std::net::SocketAddr;

use clap::{Parser, ValueEnum};

use crate::config::{self, Config, ConfigError, UpstreamUrl};

/// natsproxy: a NATS-aware sidecar proxy that keeps clients connected while the cluster
/// behind it restarts (lame duck mode) or loses nodes.
///
/// Point your client (e.g. Vector's `sources.nats.url`) at --listen; natsproxy holds one
/// upstream connection per client to a node of --upstream.
#[derive(Debug, Parser)]
#[command(name = "natsproxy", version, about, long_about)]
pub struct Cli {
    /// Address clients connect to. Loopback by default: natsproxy is a sidecar.
    #[arg(long, env = "NATSPROXY_LISTEN", default_value = config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Upstream NATS server URL(s): nats://[user:pass@|token@]host:port. Repeat the flag or
    /// separate with commas. Credentials in a URL are presented by the proxy upstream;
    /// without them, the client's own user/password/token pass through.
    #[arg(
        long = "upstream",
        env = "NATSPROXY_UPSTREAM",
        value_delimiter = ',',
        required = true
    )]
    pub upstreams: Vec<String>,

    /// Interval of the proxy's keepalive PINGs upstream; two missed = the node is dead.
    #[arg(long, env = "NATSPROXY_PING_INTERVAL", default_value = "2s")]
    pub ping_interval: String,

    /// Timeout of one upstream TCP connect.
    #[arg(long, env = "NATSPROXY_CONNECT_TIMEOUT", default_value = "2s")]
    pub connect_timeout: String,

    /// Maximum concurrent client connections; more are refused with
    /// -ERR 'maximum connections exceeded'.
    #[arg(long, env = "NATSPROXY_MAX_CLIENTS", default_value_t = config::DEFAULT_MAX_CLIENTS)]
    pub max_clients: usize,

    /// Bytes queued toward one client before it is closed as a slow consumer.
    #[arg(long, env = "NATSPROXY_MAX_CLIENT_PENDING", default_value = "64MiB")]
    pub max_client_pending: String,

    /// Bytes of client traffic buffered toward the upstream; past it the proxy stops
    /// reading from the client until the upstream drains.
    #[arg(long, env = "NATSPROXY_MAX_BACKLOG", default_value = "8MiB")]
    pub max_backlog: String,

    /// How long the new upstream's subscriptions get to propagate through the cluster
    /// before the old upstream's are removed during a lame-duck migration.
    #[arg(long, env = "NATSPROXY_SETTLE", default_value = "250ms")]
    pub settle: String,

    /// With no upstream reachable for this long, the client is closed with -ERR so that
    /// its own reconnect logic takes over. Meanwhile its publishes are buffered (up to
    /// --max-backlog) and its PINGs answered.
    #[arg(long, env = "NATSPROXY_MAX_OUTAGE", default_value = "2m")]
    pub max_outage: String,

    /// Time connections get to finish on SIGTERM/SIGINT.
    #[arg(long, env = "NATSPROXY_SHUTDOWN_GRACE", default_value = "5s")]
    pub shutdown_grace: String,

    /// Log filter (error, warn, info, debug, trace, or a tracing EnvFilter directive).
    #[arg(long, env = "NATSPROXY_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "NATSPROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

impl Cli {
    /// Validates the flags into a [`Config`].
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let upstreams = self
            .upstreams
            .iter()
            .filter(|u| !u.trim().is_empty())
            .map(|u| UpstreamUrl::parse(u.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if upstreams.is_empty() {
            return Err(ConfigError::NoUpstream);
        }
        let mut c = Config::new(self.listen, upstreams);
        c.ping_interval = config::parse_duration("--ping-interval", &self.ping_interval)?;
        c.connect_timeout = config::parse_duration("--connect-timeout", &self.connect_timeout)?;
        c.shutdown_grace = config::parse_duration("--shutdown-grace", &self.shutdown_grace)?;
        c.settle = config::parse_duration("--settle", &self.settle)?;
        c.max_outage = config::parse_duration("--max-outage", &self.max_outage)?;
        c.max_clients = self.max_clients;
        c.max_client_pending =
            config::parse_size("--max-client-pending", &self.max_client_pending)?;
        c.max_backlog = config::parse_size("--max-backlog", &self.max_backlog)?;
        Ok(c)
    }
}
