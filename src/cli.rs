//! Command line (clap derive) and configuration file (serde), one struct for both:
//! [`Opts`]. Each option is one field: its doc is the `--help` text, its `#[arg]` names
//! the flag and the `NATSPROXY_*` variable, its name is the file's key. Precedence flag >
//! env > file > default; the merge and the checks are in [`crate::settings`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

/// natsproxy: a NATS-aware sidecar proxy that keeps clients connected while the cluster
/// behind it restarts (lame duck mode) or loses nodes.
///
/// Point your client (e.g. Vector's `sources.nats.url`) at --listen; natsproxy holds one
/// upstream connection per client to a node of --upstream and moves it, invisibly to the
/// client, when that node leaves.
///
/// Bounds (each named below where it can be set): --max-clients connections;
/// --max-client-pending bytes queued toward one client (then it is closed as a slow
/// consumer); --max-backlog client bytes held toward the upstream (then the client is not
/// read); --max-hold bytes held back from the new node during a migration (then released
/// early and counted as possible duplicates); 200,000 de-duplication fingerprints; a client
/// control line of 4096 argument bytes and the upstream's max_payload, both as
/// nats-server enforces them; 64 KiB for an upstream control line and 64 MiB for an
/// upstream payload.
#[derive(Debug, Parser)]
#[command(name = "natsproxy", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub opts: Opts,
}

/// Subcommands; without one, natsproxy runs the proxy.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the configuration and print the effective values (secrets masked).
    CheckConfig,
    /// Run a self-contained demonstration: a local 3-node cluster, the proxy, a publisher
    /// and a Vector-style JetStream consumer through a rolling lame-duck restart.
    Demo(DemoArgs),
}

/// Options of `natsproxy demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Messages per second the demo publisher sends.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Show the failure natsproxy prevents instead: an R1 stream's node goes lame duck
    /// and stays away; two Vector-style consumers side by side, one straight to the
    /// cluster (it ends at its first error item), one through the proxy (it resumes).
    #[arg(long)]
    pub compare: bool,
}

/// Proxy options. Defaults are applied after the configuration file is read.
#[derive(Debug, Args, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Opts {
    /// TOML configuration file with any of the options below (keys as the long flag
    /// names with `_` for `-`, `upstream` a string or a list).
    #[arg(long, env = "NATSPROXY_CONFIG", global = true)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Address clients connect to. Loopback by default: natsproxy is a sidecar.
    /// [default: 127.0.0.1:4222]
    #[arg(long, env = "NATSPROXY_LISTEN", global = true)]
    pub listen: Option<String>,

    /// Upstream NATS server URL(s): nats://host:port, or nats://user:pass@host:port, or
    /// nats://token@host:port (tls:// to require TLS). Repeat the flag or
    /// separate with commas. More nodes are learned from the cluster. Credentials in a URL
    /// are presented by the proxy upstream; without them the client's own pass through.
    #[arg(
        long = "upstream",
        env = "NATSPROXY_UPSTREAM",
        value_delimiter = ',',
        global = true
    )]
    #[serde(
        rename = "upstream",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "one_or_many"
    )]
    pub upstreams: Vec<String>,

    /// Require TLS toward every upstream node, learned ones included (as if every URL
    /// were tls://). A node that asks for TLS gets it anyway.
    #[arg(long, env = "NATSPROXY_UPSTREAM_TLS", global = true, num_args = 0..=1, default_missing_value = "true")]
    pub upstream_tls: Option<bool>,

    /// PEM CA bundle to verify upstream servers with. [default: the system's roots]
    #[arg(long, env = "NATSPROXY_UPSTREAM_TLS_CA", global = true)]
    pub upstream_tls_ca: Option<PathBuf>,

    /// PEM client certificate (chain) for upstream servers that verify clients (mTLS).
    /// Re-read when the file changes (also the CA and the key).
    #[arg(long, env = "NATSPROXY_UPSTREAM_TLS_CERT", global = true)]
    pub upstream_tls_cert: Option<PathBuf>,

    /// PEM private key of --upstream-tls-cert.
    #[arg(long, env = "NATSPROXY_UPSTREAM_TLS_KEY", global = true)]
    pub upstream_tls_key: Option<PathBuf>,

    /// Name to verify every upstream certificate against, for a cluster reached by IP
    /// whose certificates name a host. [default: each configured URL's host; nodes learned
    /// from the cluster: the first configured host name, as the official clients do]
    #[arg(long, env = "NATSPROXY_UPSTREAM_TLS_SERVER_NAME", global = true)]
    pub upstream_tls_server_name: Option<String>,

    /// DANGER: accept any upstream certificate (no server verification at all).
    #[arg(
        long,
        env = "NATSPROXY_UPSTREAM_TLS_INSECURE_SKIP_VERIFY",
        global = true,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub upstream_tls_insecure_skip_verify: Option<bool>,

    /// NATS .creds file (user JWT and nkey seed): the proxy signs each upstream node's
    /// nonce itself (a client's signature is bound to one connection).
    #[arg(long, env = "NATSPROXY_CREDS", global = true)]
    pub creds: Option<PathBuf>,

    /// File holding an nkey seed (SU…) to authenticate upstream with.
    #[arg(long, env = "NATSPROXY_NKEY_SEED", global = true)]
    pub nkey_seed: Option<PathBuf>,

    /// User name presented upstream (with --password).
    #[arg(long, env = "NATSPROXY_USER", global = true)]
    pub user: Option<String>,

    /// Password presented upstream (with --user). Prefer the environment or the file.
    #[arg(
        long,
        env = "NATSPROXY_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    pub password: Option<String>,

    /// Token presented upstream. Prefer the environment or the file.
    #[arg(long, env = "NATSPROXY_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,

    /// File holding natsproxy's own nkey seed: every upstream nonce is signed into
    /// `proxy_sig`, for servers that list the public key under `proxies { trusted }`
    /// (nats-server 2.12+). The user's credentials are still required.
    #[arg(long, env = "NATSPROXY_PROXY_NKEY_SEED", global = true)]
    pub proxy_nkey_seed: Option<PathBuf>,

    /// Token clients must present to natsproxy (their CONNECT's auth_token); others get
    /// -ERR 'Authorization Violation', as from nats-server. [default: no client auth]
    #[arg(
        long,
        env = "NATSPROXY_CLIENT_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub client_token: Option<String>,

    /// User name clients must present to natsproxy (with --client-password).
    #[arg(long, env = "NATSPROXY_CLIENT_USER", global = true)]
    pub client_user: Option<String>,

    /// Password clients must present to natsproxy (with --client-user).
    #[arg(
        long,
        env = "NATSPROXY_CLIENT_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    pub client_password: Option<String>,

    /// Serve /metrics (Prometheus), /healthz and /readyz here, e.g. 0.0.0.0:9464 for
    /// Kubernetes probes. [default: off]
    #[arg(long, env = "NATSPROXY_METRICS_LISTEN", global = true)]
    pub metrics_listen: Option<String>,

    /// Interval of the proxy's keepalive PINGs upstream; two missed = the node is dead.
    /// [default: 2s]
    #[arg(long, env = "NATSPROXY_PING_INTERVAL", global = true)]
    pub ping_interval: Option<Text>,

    /// Timeout of one upstream TCP connect. [default: 2s]
    #[arg(long, env = "NATSPROXY_CONNECT_TIMEOUT", global = true)]
    pub connect_timeout: Option<Text>,

    /// Bound: concurrent client connections; more are refused with
    /// -ERR 'maximum connections exceeded'. [default: 1024]
    #[arg(long, env = "NATSPROXY_MAX_CLIENTS", global = true)]
    pub max_clients: Option<Text>,

    /// Bound: upstream dials per second for the whole process, after --dial-burst at
    /// once. A dial over it is not made; the session retries after its backoff
    /// (natsproxy_upstream_dials_refused_total). 0: no limit. [default: 200]
    #[arg(long, env = "NATSPROXY_DIAL_RATE", global = true)]
    pub dial_rate: Option<Text>,

    /// Bound: upstream dials the process may make at once (every client of a lame-duck
    /// node moving together). [default: 1000]
    #[arg(long, env = "NATSPROXY_DIAL_BURST", global = true)]
    pub dial_burst: Option<Text>,

    /// Bound: bytes queued toward one client; past it the client is closed as a slow
    /// consumer, as nats-server does. [default: 64MiB]
    #[arg(long, env = "NATSPROXY_MAX_CLIENT_PENDING", global = true)]
    pub max_client_pending: Option<Text>,

    /// Bound: client bytes buffered toward the upstream (during a switch or an outage, and
    /// publishes not yet confirmed); past it the client is not read until it drains.
    /// [default: 8MiB]
    #[arg(long, env = "NATSPROXY_MAX_BACKLOG", global = true)]
    pub max_backlog: Option<Text>,

    /// Bound: bytes held back from the new upstream while both old and new deliver during a
    /// migration; past it the oldest are released early and counted as possible
    /// duplicates. [default: 16MiB]
    #[arg(long, env = "NATSPROXY_MAX_HOLD", global = true)]
    pub max_hold: Option<Text>,

    /// How long the new upstream's subscriptions get to propagate through the cluster
    /// before the old upstream's are removed during a lame-duck migration. [default: 250ms]
    #[arg(long, env = "NATSPROXY_SETTLE", global = true)]
    pub settle: Option<Text>,

    /// A PING of the proxy's node unanswered this long makes it suspect: the session brings
    /// up a standby link on another node with every subscription (both deliver, once each
    /// to the client) and keeps it if the node is then found dead (--ping-interval × 2
    /// without an answer), drops it when the node answers. While this is on, an idle link
    /// is PINGed every 500 ms at least, so a frozen node costs at most ~1.1 s of core
    /// messages. After a migration the new node's PINGs count from the migration's end.
    /// 0 turns it off. [default: 600ms]
    #[arg(long, env = "NATSPROXY_HEDGE_AFTER", global = true)]
    pub hedge_after: Option<Text>,

    /// When a node goes lame duck, each client's proxy session dials its new node after a
    /// random delay below this, so that the many clients of a shared proxy (a DaemonSet)
    /// do not dial the remaining nodes all at once. 0 dials at once. [default: 250ms]
    #[arg(long, env = "NATSPROXY_MIGRATION_SPREAD", global = true)]
    pub migration_spread: Option<Text>,

    /// With no upstream reachable for this long the client is closed with -ERR, so that
    /// its own reconnect logic takes over. Meanwhile its publishes are buffered (up to
    /// --max-backlog) and its PINGs answered. [default: 2m]
    #[arg(long, env = "NATSPROXY_MAX_OUTAGE", global = true)]
    pub max_outage: Option<Text>,

    /// GET /livez/client (on --metrics-listen) fails once a client that consumed has
    /// had no connection, or one of its pull consumers no pull request, none waiting and
    /// no ack, for this long; a client that holds a delivery it has not acked is only
    /// reported as slow. 0 turns the check off. [default: 60s]
    #[arg(long, env = "NATSPROXY_CLIENT_STALL_AFTER", global = true)]
    pub client_stall_after: Option<Text>,

    /// Time connections get to finish on SIGTERM/SIGINT. [default: 5s]
    #[arg(long, env = "NATSPROXY_SHUTDOWN_GRACE", global = true)]
    pub shutdown_grace: Option<Text>,

    /// Log filter: error, warn, info, debug, trace, or a tracing directive. [default:
    /// RUST_LOG if set, else info]
    #[arg(long, env = "NATSPROXY_LOG_LEVEL", global = true)]
    pub log_level: Option<String>,

    /// Log format. [default: human]
    #[arg(long, env = "NATSPROXY_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

/// A duration, size or count as given: a string (`"2s"`, `"8MiB"`) or, in the file, a
/// bare number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Text(pub String);

impl std::str::FromStr for Text {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Text(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Str(String),
            Int(i64),
        }
        Given::deserialize(d)
            .map(|g| match g {
                Given::Str(s) => Text(s),
                Given::Int(i) => Text(i.to_string()),
            })
            .map_err(|_| serde::de::Error::custom("expected a string or a number"))
    }
}

/// `upstream` in the file: one URL string (commas allowed, as in the flag) or a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        One(String),
        Many(Vec<String>),
    }
    match Given::deserialize(d) {
        Ok(Given::One(s)) => Ok(s.split(',').map(str::to_owned).collect()),
        Ok(Given::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom(
            "expected a URL string or a list of them",
        )),
    }
}
