//! Validated runtime configuration, with defaults as named constants.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::session::SessionConfig;

/// Default listen address: loopback only, the NATS port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4222";
/// Default cap on concurrent client connections; further ones are refused.
pub const DEFAULT_MAX_CLIENTS: usize = 1024;
/// Default bound of bytes queued toward one client; past it the client is closed as a
/// slow consumer (nats-server's default `max_pending`).
pub const DEFAULT_MAX_CLIENT_PENDING: usize = 64 * 1024 * 1024;
/// Default timeout of one upstream TCP connect.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time given to connections to finish on shutdown.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Default time after which a client that left, or stopped pulling, is reported stopped
/// by `/livez/client`: twice the 30 s pull expiry of async-nats, nats.go and nats.js,
/// whose idle consumers pull again at least that often.
pub const DEFAULT_CLIENT_STALL_AFTER: Duration = Duration::from_secs(60);
/// Default sustained upstream dials per second for the whole process (the dial budget).
pub const DEFAULT_DIAL_RATE: u32 = 200;
/// Default upstream dials that may go at once (a lame duck moving every client together).
pub const DEFAULT_DIAL_BURST: u32 = 1000;

pub use crate::auth::{ClientAuth, Credentials, NkeySeed};

/// One upstream server URL: `nats://[user:pass@|token@]host:port`, or `tls://…` (TLS
/// required), optionally `?tls_first` (TLS before INFO, for `handshake_first` servers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `host:port`
    pub addr: String,
    pub credentials: Option<Credentials>,
    /// TLS is required toward this node (`tls://`); a node that offers none is refused.
    pub tls: bool,
    /// TLS handshake before the server's INFO (`?tls_first`).
    pub tls_first: bool,
}

/// TLS toward the upstreams (rustls). A node that asks for TLS (`tls_required` in its
/// INFO) gets it even on a `nats://` URL; `tls://` or `--upstream-tls` insist on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamTls {
    /// Require TLS toward every node, learned ones included (`--upstream-tls`).
    #[serde(rename = "upstream_tls")]
    pub required: bool,
    /// PEM CA bundle to verify servers with; the system's roots when None.
    #[serde(rename = "upstream_tls_ca", skip_serializing_if = "Option::is_none")]
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate chain and key, for servers with `verify: true`.
    #[serde(rename = "upstream_tls_cert", skip_serializing_if = "Option::is_none")]
    pub cert: Option<std::path::PathBuf>,
    #[serde(rename = "upstream_tls_key", skip_serializing_if = "Option::is_none")]
    pub key: Option<std::path::PathBuf>,
    /// Accept any server certificate (`--upstream-tls-insecure-skip-verify`).
    #[serde(rename = "upstream_tls_insecure_skip_verify")]
    pub insecure_skip_verify: bool,
    /// The name every node's certificate is verified against
    /// (`--upstream-tls-server-name`); None: a configured URL's own host, and for nodes
    /// learned from the cluster (announced by IP) the first configured host name.
    #[serde(
        rename = "upstream_tls_server_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub server_name: Option<String>,
}

/// A configuration error, naming the field and the fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("upstream `{url}`: {why}")]
    Upstream { url: String, why: &'static str },
    #[error("no upstream given: pass --upstream nats://host:4222 (or NATSPROXY_UPSTREAM)")]
    NoUpstream,
    #[error("--{} / {field}: `{value}` is not a duration (use e.g. 500ms, 2s, 2m)", field.replace('_', "-"))]
    Duration { field: &'static str, value: String },
    #[error("--{} / {field}: `{value}` is not a size (use e.g. 65536, 512KiB, 8MiB)", field.replace('_', "-"))]
    Size { field: &'static str, value: String },
    #[error("--{} / {field}: `{value}` is not a positive whole number", field.replace('_', "-"))]
    Number { field: &'static str, value: String },
    #[error("--{} / {field}: `{value}` is not an address (use ip:port, e.g. 127.0.0.1:4222)", field.replace('_', "-"))]
    Address { field: &'static str, value: String },
    #[error("configuration file {path}: {why}")]
    File { path: String, why: String },
    /// A secret file (`--creds`, a seed) cannot be read. Like every credentials
    /// error, never carries a secret: only the option, the file path and what is wrong.
    #[error("credentials: --{option} {path}: {kind}")]
    SecretFile {
        option: &'static str,
        path: String,
        kind: std::io::ErrorKind,
    },
    /// A seed file holds no valid nkey seed.
    #[error("credentials: --{option} {path}: {why}")]
    Seed {
        option: &'static str,
        path: String,
        why: crate::auth::SeedError,
    },
    /// A `.creds` file gives no credentials.
    #[error("credentials: --creds {path}: {why}")]
    Creds {
        path: String,
        why: crate::auth::CredsError,
    },
    /// Two options of which one was given without the other.
    #[error("credentials: --{0} and --{1} go together")]
    Together(&'static str, &'static str),
    /// More than one kind of upstream credentials.
    #[error("credentials: give one of --creds, --nkey-seed, --user/--password, --token")]
    SeveralCredentials,
    /// Client credentials that are neither a token nor a user with a password.
    #[error("credentials: give either --client-token or --client-user with --client-password")]
    ClientAuth,
}

impl UpstreamUrl {
    /// Parses `nats://…` (the scheme may be omitted) or `tls://…` (TLS required toward
    /// the node), with `?tls_first` for servers with `handshake_first`, and credentials
    /// in the user part.
    pub fn parse(url: &str) -> Result<UpstreamUrl, ConfigError> {
        let err = |why| ConfigError::Upstream {
            url: redact(url),
            why,
        };
        let (url_part, query) = match url.split_once('?') {
            Some((u, q)) => (u, Some(q)),
            None => (url, None),
        };
        let mut tls = false;
        let rest = if let Some(r) = url_part.strip_prefix("nats://") {
            r
        } else if let Some(r) = url_part.strip_prefix("tls://") {
            tls = true;
            r
        } else if url_part.contains("://") {
            return Err(err(
                "unknown scheme; use nats://host:port or tls://host:port",
            ));
        } else {
            url_part
        };
        let mut tls_first = false;
        for q in query.into_iter().flat_map(|q| q.split('&')) {
            match q {
                "tls_first" | "tls_first=true" | "handshake_first" | "handshake_first=true" => {
                    tls_first = true;
                    tls = true;
                }
                "tls_first=false" | "handshake_first=false" | "" => {}
                _ => return Err(err("unknown URL option; the one known is ?tls_first")),
            }
        }
        let rest = rest.trim_end_matches('/');
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let credentials = match auth {
            None => None,
            Some(a) => match a.split_once(':') {
                Some((u, p)) => Some(Credentials::UserPass {
                    user: u.to_owned(),
                    pass: p.to_owned(),
                }),
                None if !a.is_empty() => Some(Credentials::Token(a.to_owned())),
                None => return Err(err("empty credentials before '@'")),
            },
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p))
                if !p.is_empty() && !h.ends_with(']')
                    || hostport.starts_with('[') && hostport.contains("]:") =>
            {
                (h, p)
            }
            _ => (hostport, "4222"),
        };
        if host.is_empty() {
            return Err(err("missing host"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| err("port is not a number 1-65535"))?;
        if port == 0 {
            return Err(err("port is not a number 1-65535"));
        }
        Ok(UpstreamUrl {
            addr: format!("{host}:{port}"),
            credentials,
            tls,
            tls_first,
        })
    }
}

impl UpstreamUrl {
    /// The URL with any password or token masked.
    pub fn masked(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        let q = if self.tls_first { "?tls_first" } else { "" };
        match &self.credentials {
            None => format!("{scheme}://{}{q}", self.addr),
            Some(Credentials::UserPass { user, .. }) => {
                format!("{scheme}://{user}:***@{}{q}", self.addr)
            }
            Some(_) => format!("{scheme}://***@{}{q}", self.addr),
        }
    }
}

/// Replaces the credentials part of a URL with `***` for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}***{}", &url[..s + 3], &url[a..]),
        (None, Some(a)) => format!("***{}", &url[a..]),
        _ => url.to_owned(),
    }
}

/// Parses `500ms`, `2s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(field: &'static str, v: &str) -> Result<Duration, ConfigError> {
    let e = || ConfigError::Duration {
        field,
        value: v.to_owned(),
    };
    let v = v.trim();
    let split = v
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().map_err(|_| e())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(e()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| e())
}

/// Parses a byte size: `65536`, `64KiB`, `8MiB`, `1GiB` (also KB/MB/GB as powers of 1000).
pub fn parse_size(field: &'static str, v: &str) -> Result<usize, ConfigError> {
    let e = || ConfigError::Size {
        field,
        value: v.to_owned(),
    };
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: usize = num.parse().map_err(|_| e())?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(e()),
    };
    n.checked_mul(mul).ok_or_else(e)
}

/// The proxy's whole configuration.
/// The proxy's configuration: the listener, the upstreams, the per-client bounds of the
/// shell, and each session's own configuration, embedded. Serialized, it is the
/// effective configuration `check-config` prints (secrets masked), keyed as the options.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub listen: SocketAddr,
    #[serde(rename = "upstream", serialize_with = "masked_urls")]
    pub upstreams: Vec<UpstreamUrl>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    #[serde(serialize_with = "crate::session::as_millis")]
    pub connect_timeout: Duration,
    pub max_clients: usize,
    /// Upstream dials per second for the process, after `dial_burst` at once (0: no
    /// limit); the proxy's dial budget.
    pub dial_rate: u32,
    pub dial_burst: u32,
    pub max_client_pending: usize,
    #[serde(serialize_with = "crate::session::as_millis")]
    pub shutdown_grace: Duration,
    /// `/livez/client` reports a client stopped once it has been gone, or has not
    /// consumed, this long (zero: never).
    #[serde(serialize_with = "crate::session::as_millis")]
    pub client_stall_after: Duration,
    #[serde(flatten)]
    pub upstream_tls: UpstreamTls,
    /// Each session's configuration. Its `upstreams` and, without credentials of its
    /// own, its `credentials` come from [`Config::upstreams`] (see [`Config::session`]).
    #[serde(flatten)]
    pub session: SessionConfig,
}

fn masked_urls<S: serde::Serializer>(urls: &[UpstreamUrl], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(urls.iter().map(UpstreamUrl::masked))
}

impl Config {
    pub fn new(listen: SocketAddr, upstreams: Vec<UpstreamUrl>) -> Config {
        Config {
            listen,
            upstreams,
            metrics_listen: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_clients: DEFAULT_MAX_CLIENTS,
            dial_rate: DEFAULT_DIAL_RATE,
            dial_burst: DEFAULT_DIAL_BURST,
            max_client_pending: DEFAULT_MAX_CLIENT_PENDING,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            client_stall_after: DEFAULT_CLIENT_STALL_AFTER,
            upstream_tls: UpstreamTls::default(),
            session: SessionConfig::default(),
        }
    }

    /// A new session's configuration: the embedded one, with the upstream addresses, the
    /// first URL's credentials where none are configured, and a seed of its own.
    pub fn session(&self) -> SessionConfig {
        SessionConfig {
            upstreams: self.upstreams.iter().map(|u| u.addr.clone()).collect(),
            credentials: self
                .session
                .credentials
                .clone()
                .or_else(|| self.upstreams.first().and_then(|u| u.credentials.clone())),
            seed: fastrand::u64(..),
            ..self.session.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let u = UpstreamUrl::parse("nats://127.0.0.1:4222").unwrap();
        assert_eq!(u.addr, "127.0.0.1:4222");
        assert_eq!(u.credentials, None);
        let u = UpstreamUrl::parse("nats://alice:s3cret@n1:4333").unwrap();
        assert_eq!(u.addr, "n1:4333");
        assert_eq!(
            u.credentials,
            Some(Credentials::UserPass {
                user: "alice".into(),
                pass: "s3cret".into()
            })
        );
        let u = UpstreamUrl::parse("nats://tok@n1").unwrap();
        assert_eq!(u.addr, "n1:4222");
        assert_eq!(u.credentials, Some(Credentials::Token("tok".into())));
        assert_eq!(
            UpstreamUrl::parse("localhost:5000").unwrap().addr,
            "localhost:5000"
        );
        assert_eq!(
            UpstreamUrl::parse("nats://[::1]:5000").unwrap().addr,
            "[::1]:5000"
        );
        assert!(UpstreamUrl::parse("http://x:1").is_err());
        assert!(UpstreamUrl::parse("nats://x:notaport").is_err());
        let u = UpstreamUrl::parse("tls://u:secret@x:1").unwrap();
        assert!(u.tls && !u.tls_first);
        assert_eq!(u.masked(), "tls://u:***@x:1");
        let u = UpstreamUrl::parse("tls://x:1?tls_first").unwrap();
        assert!(u.tls && u.tls_first);
        assert!(
            UpstreamUrl::parse("nats://x:1?handshake_first=true")
                .unwrap()
                .tls_first
        );
        let e = UpstreamUrl::parse("tls://u:secret@x:1?bogus")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("tls_first"), "{e}");
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(
            parse_duration("f", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("f", "2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("f", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("f", "3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("f", "2x").is_err());
        assert_eq!(parse_size("f", "8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("f", "65536").unwrap(), 65536);
        assert!(parse_size("f", "lots").is_err());
    }
}
