//! Command line (clap derive). Every option can come from a flag, a `NATSPROXY_*`
//! variable, or the TOML file named by `--config`; precedence flag > env > file > default.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, Config, ConfigError, Credentials, NkeySeed, UpstreamUrl};

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
}

/// Proxy options. Defaults are applied after the configuration file is read.
#[derive(Debug, Args, Default)]
pub struct Opts {
    /// TOML configuration file with any of the options below (keys as the long flag
    /// names with `_` for `-`, `upstream` a string or a list).
    #[arg(long, env = "NATSPROXY_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Address clients connect to. Loopback by default: natsproxy is a sidecar.
    /// [default: 127.0.0.1:4222]
    #[arg(long, env = "NATSPROXY_LISTEN", global = true)]
    pub listen: Option<String>,

    /// Upstream NATS server URL(s): nats://[user:pass@|token@]host:port. Repeat the flag or
    /// separate with commas. More nodes are learned from the cluster. Credentials in a URL
    /// are presented by the proxy upstream; without them the client's own pass through.
    #[arg(
        long = "upstream",
        env = "NATSPROXY_UPSTREAM",
        value_delimiter = ',',
        global = true
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
    pub ping_interval: Option<String>,

    /// Timeout of one upstream TCP connect. [default: 2s]
    #[arg(long, env = "NATSPROXY_CONNECT_TIMEOUT", global = true)]
    pub connect_timeout: Option<String>,

    /// Bound: concurrent client connections; more are refused with
    /// -ERR 'maximum connections exceeded'. [default: 1024]
    #[arg(long, env = "NATSPROXY_MAX_CLIENTS", global = true)]
    pub max_clients: Option<String>,

    /// Bound: bytes queued toward one client; past it the client is closed as a slow
    /// consumer, as nats-server does. [default: 64MiB]
    #[arg(long, env = "NATSPROXY_MAX_CLIENT_PENDING", global = true)]
    pub max_client_pending: Option<String>,

    /// Bound: client bytes buffered toward the upstream (during a switch or an outage, and
    /// publishes not yet confirmed); past it the client is not read until it drains.
    /// [default: 8MiB]
    #[arg(long, env = "NATSPROXY_MAX_BACKLOG", global = true)]
    pub max_backlog: Option<String>,

    /// Bound: bytes held back from the new upstream while both old and new deliver during a
    /// migration; past it the oldest are released early and counted as possible
    /// duplicates. [default: 16MiB]
    #[arg(long, env = "NATSPROXY_MAX_HOLD", global = true)]
    pub max_hold: Option<String>,

    /// How long the new upstream's subscriptions get to propagate through the cluster
    /// before the old upstream's are removed during a lame-duck migration. [default: 250ms]
    #[arg(long, env = "NATSPROXY_SETTLE", global = true)]
    pub settle: Option<String>,

    /// When a node goes lame duck, each client's proxy session dials its new node after a
    /// random delay below this, so that the many clients of a shared proxy (a DaemonSet)
    /// do not dial the remaining nodes all at once. 0 dials at once. [default: 250ms]
    #[arg(long, env = "NATSPROXY_MIGRATION_SPREAD", global = true)]
    pub migration_spread: Option<String>,

    /// With no upstream reachable for this long the client is closed with -ERR, so that
    /// its own reconnect logic takes over. Meanwhile its publishes are buffered (up to
    /// --max-backlog) and its PINGs answered. [default: 2m]
    #[arg(long, env = "NATSPROXY_MAX_OUTAGE", global = true)]
    pub max_outage: Option<String>,

    /// Time connections get to finish on SIGTERM/SIGINT. [default: 5s]
    #[arg(long, env = "NATSPROXY_SHUTDOWN_GRACE", global = true)]
    pub shutdown_grace: Option<String>,

    /// Log filter: error, warn, info, debug, trace, or a tracing directive. [default:
    /// RUST_LOG if set, else info]
    #[arg(long, env = "NATSPROXY_LOG_LEVEL", global = true)]
    pub log_level: Option<String>,

    /// Log format. [default: human]
    #[arg(long, env = "NATSPROXY_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

/// Everything the binary needs: the proxy configuration and logging.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    pub log_level: String,
    pub log_format: LogFormat,
}

/// Keys of the configuration file.
const FILE_KEYS: &[&str] = &[
    "listen",
    "upstream",
    "metrics_listen",
    "ping_interval",
    "connect_timeout",
    "max_clients",
    "max_client_pending",
    "max_backlog",
    "max_hold",
    "settle",
    "migration_spread",
    "max_outage",
    "shutdown_grace",
    "log_level",
    "log_format",
    "creds",
    "nkey_seed",
    "user",
    "password",
    "token",
    "proxy_nkey_seed",
    "upstream_tls",
    "upstream_tls_ca",
    "upstream_tls_cert",
    "upstream_tls_key",
    "upstream_tls_insecure_skip_verify",
    "upstream_tls_server_name",
    "client_token",
    "client_user",
    "client_password",
];

/// Reads a secret file; errors name the option and the path, never the content.
fn read_secret(option: &str, path: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Credentials(format!("--{option} {path}: {e}")))
}

fn seed_file(option: &str, path: &str) -> Result<NkeySeed, ConfigError> {
    let text = read_secret(option, path)?;
    // A seed file may carry comments or the .creds markers: take the line with the seed.
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with('S') && l.len() > 50)
        .unwrap_or(text.trim());
    NkeySeed::new(line).map_err(|why| ConfigError::Credentials(format!("--{option} {path}: {why}")))
}

/// The configuration file, as strings keyed by option.
fn read_file(path: &PathBuf) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
    for k in table.keys() {
        if !FILE_KEYS.contains(&k.as_str()) {
            return Err(ConfigError::File {
                path: path.display().to_string(),
                why: format!("unknown key `{k}`; known keys: {}", FILE_KEYS.join(", ")),
            });
        }
    }
    Ok(table)
}

/// A file value as a string (numbers and strings alike).
fn file_str(t: &toml::Table, k: &'static str) -> Result<Option<String>, ConfigError> {
    match t.get(k) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(toml::Value::Integer(i)) => Ok(Some(i.to_string())),
        Some(other) => Err(ConfigError::FileValue {
            key: k,
            why: format!("expected a string or a number, found {}", other.type_str()),
        }),
    }
}

fn file_list(t: &toml::Table, k: &'static str) -> Result<Vec<String>, ConfigError> {
    match t.get(k) {
        None => Ok(Vec::new()),
        Some(toml::Value::String(s)) => Ok(s.split(',').map(str::to_owned).collect()),
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ConfigError::FileValue {
                        key: k,
                        why: "expected a list of URL strings".into(),
                    })
            })
            .collect(),
        Some(other) => Err(ConfigError::FileValue {
            key: k,
            why: format!(
                "expected a URL string or a list of them, found {}",
                other.type_str()
            ),
        }),
    }
}

impl Opts {
    /// Merges flag/env values over the file over the defaults, and validates.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(p) => read_file(p)?,
            None => toml::Table::new(),
        };
        let pick =
            |cli: &Option<String>, key: &'static str| -> Result<Option<String>, ConfigError> {
                match cli {
                    Some(v) => Ok(Some(v.clone())),
                    None => file_str(&file, key),
                }
            };
        let upstreams = if self.upstreams.iter().any(|u| !u.trim().is_empty()) {
            self.upstreams.clone()
        } else {
            file_list(&file, "upstream")?
        };
        let upstreams = upstreams
            .iter()
            .filter(|u| !u.trim().is_empty())
            .map(|u| UpstreamUrl::parse(u.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if upstreams.is_empty() {
            return Err(ConfigError::NoUpstream);
        }
        let listen = pick(&self.listen, "listen")?.unwrap_or_else(|| config::DEFAULT_LISTEN.into());
        let listen: SocketAddr = listen.parse().map_err(|_| ConfigError::Address {
            field: "listen",
            value: listen.clone(),
        })?;
        let mut c = Config::new(listen, upstreams);
        if let Some(m) = pick(&self.metrics_listen, "metrics_listen")? {
            c.metrics_listen = Some(m.parse().map_err(|_| ConfigError::Address {
                field: "metrics_listen",
                value: m.clone(),
            })?);
        }
        let dur = |cli: &Option<String>, key: &'static str, d| -> Result<_, ConfigError> {
            pick(cli, key)?.map_or(Ok(d), |v| config::parse_duration(key, &v))
        };
        let size = |cli: &Option<String>, key: &'static str, d| -> Result<_, ConfigError> {
            pick(cli, key)?.map_or(Ok(d), |v| config::parse_size(key, &v))
        };
        c.ping_interval = dur(&self.ping_interval, "ping_interval", c.ping_interval)?;
        c.connect_timeout = dur(&self.connect_timeout, "connect_timeout", c.connect_timeout)?;
        c.settle = dur(&self.settle, "settle", c.settle)?;
        c.max_outage = dur(&self.max_outage, "max_outage", c.max_outage)?;
        c.migration_spread = dur(
            &self.migration_spread,
            "migration_spread",
            c.migration_spread,
        )?;
        c.shutdown_grace = dur(&self.shutdown_grace, "shutdown_grace", c.shutdown_grace)?;
        c.max_client_pending = size(
            &self.max_client_pending,
            "max_client_pending",
            c.max_client_pending,
        )?;
        c.max_backlog = size(&self.max_backlog, "max_backlog", c.max_backlog)?;
        c.max_hold = size(&self.max_hold, "max_hold", c.max_hold)?;
        if let Some(v) = pick(&self.max_clients, "max_clients")? {
            c.max_clients =
                v.trim()
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(ConfigError::Number {
                        field: "max_clients",
                        value: v.clone(),
                    })?;
        }
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let creds = match path(&self.creds) {
            Some(p) => Some(p),
            None => file_str(&file, "creds")?,
        };
        let nkey = match path(&self.nkey_seed) {
            Some(p) => Some(p),
            None => file_str(&file, "nkey_seed")?,
        };
        let user = pick(&self.user, "user")?;
        let password = pick(&self.password, "password")?;
        let token = pick(&self.token, "token")?;
        let given = [
            creds.is_some(),
            nkey.is_some(),
            user.is_some() || password.is_some(),
            token.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(ConfigError::Credentials(
                "give one of --creds, --nkey-seed, --user/--password, --token".into(),
            ));
        }
        c.credentials = if let Some(p) = creds {
            let text = read_secret("creds", &p)?;
            Some(
                Credentials::from_creds(&text)
                    .map_err(|why| ConfigError::Credentials(format!("--creds {p}: {why}")))?,
            )
        } else if let Some(p) = nkey {
            Some(Credentials::Nkey(seed_file("nkey-seed", &p)?))
        } else if let Some(t) = token {
            Some(Credentials::Token(t))
        } else {
            match (user, password) {
                (Some(user), Some(pass)) => Some(Credentials::UserPass { user, pass }),
                (None, None) => None,
                _ => {
                    return Err(ConfigError::Credentials(
                        "--user and --password go together".into(),
                    ))
                }
            }
        };
        let proxy_key = match path(&self.proxy_nkey_seed) {
            Some(p) => Some(p),
            None => file_str(&file, "proxy_nkey_seed")?,
        };
        if let Some(p) = proxy_key {
            c.proxy_key = Some(seed_file("proxy-nkey-seed", &p)?);
        }
        let flag = |cli: Option<bool>, key: &'static str| -> Result<bool, ConfigError> {
            match cli {
                Some(b) => Ok(b),
                None => match file.get(key) {
                    None => Ok(false),
                    Some(toml::Value::Boolean(b)) => Ok(*b),
                    Some(_) => Err(ConfigError::FileValue {
                        key,
                        why: "expected true or false".into(),
                    }),
                },
            }
        };
        let file_path =
            |cli: &Option<PathBuf>, key: &'static str| -> Result<Option<PathBuf>, ConfigError> {
                match cli {
                    Some(p) => Ok(Some(p.clone())),
                    None => Ok(file_str(&file, key)?.map(PathBuf::from)),
                }
            };
        c.upstream_tls = config::UpstreamTls {
            required: flag(self.upstream_tls, "upstream_tls")?,
            ca: file_path(&self.upstream_tls_ca, "upstream_tls_ca")?,
            cert: file_path(&self.upstream_tls_cert, "upstream_tls_cert")?,
            key: file_path(&self.upstream_tls_key, "upstream_tls_key")?,
            insecure_skip_verify: flag(
                self.upstream_tls_insecure_skip_verify,
                "upstream_tls_insecure_skip_verify",
            )?,
            server_name: pick(&self.upstream_tls_server_name, "upstream_tls_server_name")?,
        };
        if c.upstream_tls.cert.is_some() != c.upstream_tls.key.is_some() {
            return Err(ConfigError::Credentials(
                "--upstream-tls-cert and --upstream-tls-key go together".into(),
            ));
        }
        c.client_auth = match (
            pick(&self.client_token, "client_token")?,
            pick(&self.client_user, "client_user")?,
            pick(&self.client_password, "client_password")?,
        ) {
            (None, None, None) => None,
            (Some(t), None, None) => Some(config::ClientAuth::Token(t)),
            (None, Some(user), Some(pass)) => Some(config::ClientAuth::UserPass { user, pass }),
            _ => {
                return Err(ConfigError::Credentials(
                    "give either --client-token or --client-user with --client-password".into(),
                ))
            }
        };
        if c.ping_interval.is_zero() {
            return Err(ConfigError::Duration {
                field: "ping_interval",
                value: "0".into(),
            });
        }
        // natsproxy's own setting (flag, NATSPROXY_LOG_LEVEL, file) wins; without one,
        // RUST_LOG as in every tracing-based tool; else info.
        let log_level = match pick(&self.log_level, "log_level")? {
            Some(l) => l,
            None => std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "info".into()),
        };
        let log_format = match (self.log_format, file_str(&file, "log_format")?) {
            (Some(f), _) => f,
            (None, Some(s)) => {
                LogFormat::from_str(&s, true).map_err(|_| ConfigError::FileValue {
                    key: "log_format",
                    why: format!("`{s}`: use human or json"),
                })?
            }
            (None, None) => LogFormat::Human,
        };
        Ok(Settings {
            config: c,
            log_level,
            log_format,
        })
    }
}

impl Settings {
    /// The effective configuration as TOML, with passwords and tokens masked.
    pub fn render(&self) -> String {
        let c = &self.config;
        let ups: Vec<String> = c
            .upstreams
            .iter()
            .map(|u| format!("\"{}\"", u.masked()))
            .collect();
        let d = |x: std::time::Duration| format!("\"{}ms\"", x.as_millis());
        let mut out = String::new();
        out += &format!("listen = \"{}\"\n", c.listen);
        out += &format!("upstream = [{}]\n", ups.join(", "));
        // Secrets stay out: only the kind of credentials and public keys are shown.
        match &c.credentials {
            Some(cr) => out += &format!("# credentials: {cr:?}\n"),
            None => out += "# credentials: none held (the first URL's, else the client's own)\n",
        }
        let t = &c.upstream_tls;
        out += &format!("upstream_tls = {}\n", t.required);
        for (k, v) in [
            ("upstream_tls_ca", &t.ca),
            ("upstream_tls_cert", &t.cert),
            ("upstream_tls_key", &t.key),
        ] {
            if let Some(p) = v {
                out += &format!("{k} = \"{}\"\n", p.display());
            }
        }
        if let Some(n) = &t.server_name {
            out += &format!("upstream_tls_server_name = \"{n}\"\n");
        }
        if t.insecure_skip_verify {
            out += "upstream_tls_insecure_skip_verify = true  # DANGER: no server verification\n";
        }
        if let Some(a) = &c.client_auth {
            out += &format!("# client authentication: {a:?}\n");
        }
        if let Some(k) = &c.proxy_key {
            out += &format!("# proxy key (proxy_sig): {}\n", k.public_key());
        }
        match c.metrics_listen {
            Some(a) => out += &format!("metrics_listen = \"{a}\"\n"),
            None => out += "# metrics_listen: not set (no /metrics, /healthz, /readyz)\n",
        }
        out += &format!("ping_interval = {}\n", d(c.ping_interval));
        out += &format!("connect_timeout = {}\n", d(c.connect_timeout));
        out += &format!("max_clients = {}\n", c.max_clients);
        out += &format!("max_client_pending = {}\n", c.max_client_pending);
        out += &format!("max_backlog = {}\n", c.max_backlog);
        out += &format!("max_hold = {}\n", c.max_hold);
        out += &format!("settle = {}\n", d(c.settle));
        out += &format!("max_outage = {}\n", d(c.max_outage));
        out += &format!("migration_spread = {}\n", d(c.migration_spread));
        out += &format!("shutdown_grace = {}\n", d(c.shutdown_grace));
        out += &format!("log_level = \"{}\"\n", self.log_level);
        out += &format!(
            "log_format = \"{}\"\n",
            match self.log_format {
                LogFormat::Human => "human",
                LogFormat::Json => "json",
            }
        );
        out
    }
}
