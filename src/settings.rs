//! From [`Opts`] to [`Settings`]: the configuration file is read into the same struct as
//! the flags, the two are merged (flag and env over file), and the result is checked and
//! turned into a [`Config`], with defaults where nothing was given. The effective
//! configuration is rendered from the `Config` itself, so every option shows up there
//! without being listed again.

use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;

use crate::cli::{LogFormat, Opts, Text};
use crate::config::{self, ClientAuth, Config, ConfigError, Credentials, NkeySeed, UpstreamUrl};

/// Everything the binary needs: the proxy configuration and logging.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    #[serde(flatten)]
    pub config: Config,
    pub log_level: String,
    pub log_format: LogFormat,
}

/// Reads a secret file; errors name the option and the path, never the content.
fn read_secret(option: &'static str, path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::SecretFile {
        option,
        path: path.display().to_string(),
        kind: e.kind(),
    })
}

fn seed_file(option: &'static str, path: &Path) -> Result<NkeySeed, ConfigError> {
    let text = read_secret(option, path)?;
    // A seed file may carry comments or the .creds markers: take the line with the seed.
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with('S') && l.len() > 50)
        .unwrap_or(text.trim());
    NkeySeed::new(line).map_err(|why| ConfigError::Seed {
        option,
        path: path.display().to_string(),
        why,
    })
}

/// The configuration file, read into the flags' struct (unknown keys refused).
fn read_file(path: &Path) -> Result<Opts, ConfigError> {
    let err = |why: String| ConfigError::File {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    toml::from_str(&text).map_err(|e: toml::de::Error| err(e.to_string()))
}

impl Opts {
    /// These options over `base`: each option given here replaces the one there.
    fn over(&self, base: &Opts) -> Result<Opts, ConfigError> {
        let internal = |e: String| ConfigError::File {
            path: "(merging)".into(),
            why: e,
        };
        let mut merged = toml::Table::try_from(base).map_err(|e| internal(e.to_string()))?;
        let mut given = toml::Table::try_from(self).map_err(|e| internal(e.to_string()))?;
        // An empty --upstream (or NATSPROXY_UPSTREAM="") is no upstream given.
        if self.upstreams.iter().all(|u| u.trim().is_empty()) {
            given.remove("upstream");
        }
        merged.extend(given);
        let mut o: Opts = merged.try_into().map_err(|e| internal(e.to_string()))?;
        o.config = self.config.clone();
        Ok(o)
    }

    /// Merges flag/env values over the file over the defaults, and validates.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let o = match &self.config {
            Some(p) => self.over(&read_file(p)?)?,
            None => self.over(&Opts::default())?,
        };
        o.apply()
    }

    /// Checks the merged options and builds the configuration.
    fn apply(&self) -> Result<Settings, ConfigError> {
        let upstreams = self
            .upstreams
            .iter()
            .filter(|u| !u.trim().is_empty())
            .map(|u| UpstreamUrl::parse(u.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if upstreams.is_empty() {
            return Err(ConfigError::NoUpstream);
        }
        let addr = |field: &'static str, v: &str| -> Result<SocketAddr, ConfigError> {
            v.parse().map_err(|_| ConfigError::Address {
                field,
                value: v.to_owned(),
            })
        };
        let listen = addr(
            "listen",
            self.listen.as_deref().unwrap_or(config::DEFAULT_LISTEN),
        )?;
        let mut c = Config::new(listen, upstreams);
        if let Some(m) = &self.metrics_listen {
            c.metrics_listen = Some(addr("metrics_listen", m)?);
        }
        self.apply_limits(&mut c)?;
        c.session.credentials = self.credentials()?;
        if let Some(p) = &self.proxy_nkey_seed {
            c.session.proxy_key = Some(seed_file("proxy-nkey-seed", p)?);
        }
        c.session.client_auth = self.client_auth()?;
        c.upstream_tls = self.upstream_tls_config()?;
        Ok(Settings {
            config: c,
            log_level: self.log_filter(),
            log_format: self.log_format.unwrap_or(LogFormat::Human),
        })
    }

    /// Durations, sizes and counts: each the option's value, else the default already in
    /// `c`.
    fn apply_limits(&self, c: &mut Config) -> Result<(), ConfigError> {
        let dur = |v: &Option<Text>, key: &'static str, d| {
            v.as_ref()
                .map_or(Ok(d), |v| config::parse_duration(key, &v.0))
        };
        let size = |v: &Option<Text>, key: &'static str, d| {
            v.as_ref().map_or(Ok(d), |v| config::parse_size(key, &v.0))
        };
        let s = &mut c.session;
        s.ping_interval = dur(&self.ping_interval, "ping_interval", s.ping_interval)?;
        s.settle = dur(&self.settle, "settle", s.settle)?;
        s.hedge_after = dur(&self.hedge_after, "hedge_after", s.hedge_after)?;
        s.max_outage = dur(&self.max_outage, "max_outage", s.max_outage)?;
        s.migration_spread = dur(
            &self.migration_spread,
            "migration_spread",
            s.migration_spread,
        )?;
        s.max_backlog = size(&self.max_backlog, "max_backlog", s.max_backlog)?;
        s.max_hold_bytes = size(&self.max_hold, "max_hold", s.max_hold_bytes)?;
        c.connect_timeout = dur(&self.connect_timeout, "connect_timeout", c.connect_timeout)?;
        c.shutdown_grace = dur(&self.shutdown_grace, "shutdown_grace", c.shutdown_grace)?;
        c.client_stall_after = dur(
            &self.client_stall_after,
            "client_stall_after",
            c.client_stall_after,
        )?;
        c.max_client_pending = size(
            &self.max_client_pending,
            "max_client_pending",
            c.max_client_pending,
        )?;
        let count = |v: &Option<Text>, field: &'static str, d: u32, min: u32| {
            v.as_ref().map_or(Ok(d), |v| {
                v.0.trim()
                    .parse()
                    .ok()
                    .filter(|&n| n >= min)
                    .ok_or(ConfigError::Number {
                        field,
                        value: v.0.clone(),
                    })
            })
        };
        let max_clients = u32::try_from(c.max_clients).unwrap_or(u32::MAX);
        c.max_clients = count(&self.max_clients, "max_clients", max_clients, 1)? as usize;
        c.dial_rate = count(&self.dial_rate, "dial_rate", c.dial_rate, 0)?;
        c.dial_burst = count(&self.dial_burst, "dial_burst", c.dial_burst, 1)?;
        if c.session.ping_interval.is_zero() {
            return Err(ConfigError::Duration {
                field: "ping_interval",
                value: "0".into(),
            });
        }
        Ok(())
    }

    /// TLS toward the upstreams.
    fn upstream_tls_config(&self) -> Result<config::UpstreamTls, ConfigError> {
        let tls = config::UpstreamTls {
            required: self.upstream_tls.unwrap_or(false),
            ca: self.upstream_tls_ca.clone(),
            cert: self.upstream_tls_cert.clone(),
            key: self.upstream_tls_key.clone(),
            insecure_skip_verify: self.upstream_tls_insecure_skip_verify.unwrap_or(false),
            server_name: self.upstream_tls_server_name.clone(),
        };
        if tls.cert.is_some() != tls.key.is_some() {
            return Err(ConfigError::Together(
                "upstream-tls-cert",
                "upstream-tls-key",
            ));
        }
        Ok(tls)
    }

    /// The log filter.
    fn log_filter(&self) -> String {
        // natsproxy's own setting (flag, NATSPROXY_LOG_LEVEL, file) wins; without one,
        // RUST_LOG as in every tracing-based tool; else info.
        match &self.log_level {
            Some(l) => l.clone(),
            None => std::env::var("RUST_LOG")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "info".into()),
        }
    }

    /// What the proxy presents upstream: at most one kind.
    fn credentials(&self) -> Result<Option<Credentials>, ConfigError> {
        let given = [
            self.creds.is_some(),
            self.nkey_seed.is_some(),
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(ConfigError::SeveralCredentials);
        }
        if let Some(p) = &self.creds {
            let text = read_secret("creds", p)?;
            return Credentials::from_creds(&text)
                .map(Some)
                .map_err(|why| ConfigError::Creds {
                    path: p.display().to_string(),
                    why,
                });
        }
        if let Some(p) = &self.nkey_seed {
            return Ok(Some(Credentials::Nkey(seed_file("nkey-seed", p)?)));
        }
        if let Some(t) = &self.token {
            return Ok(Some(Credentials::Token(t.clone())));
        }
        match (&self.user, &self.password) {
            (Some(user), Some(pass)) => Ok(Some(Credentials::UserPass {
                user: user.clone(),
                pass: pass.clone(),
            })),
            (None, None) => Ok(None),
            _ => Err(ConfigError::Together("user", "password")),
        }
    }

    /// What clients must present to the proxy.
    fn client_auth(&self) -> Result<Option<ClientAuth>, ConfigError> {
        match (&self.client_token, &self.client_user, &self.client_password) {
            (None, None, None) => Ok(None),
            (Some(t), None, None) => Ok(Some(ClientAuth::Token(t.clone()))),
            (None, Some(user), Some(pass)) => Ok(Some(ClientAuth::UserPass {
                user: user.clone(),
                pass: pass.clone(),
            })),
            _ => Err(ConfigError::ClientAuth),
        }
    }
}

impl Settings {
    /// The effective configuration as TOML, with passwords, tokens and seeds masked.
    pub fn render(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}
