//! A session's static configuration and its defaults.

use std::time::Duration;

use serde::Serialize;

use super::dedup;
use crate::auth::{ClientAuth, Credentials, NkeySeed};

/// Default interval between the proxy's keepalive PINGs upstream.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(2);

/// Default bound of client bytes held while no upstream can take them.
pub const DEFAULT_MAX_BACKLOG: usize = 8 * 1024 * 1024;

/// Default time the new link's subscriptions get to propagate before the old link's go.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(250);

/// Default time a PING of the primary may go unanswered before the session hedges (a
/// standby on another node); above a 500 ms stall of a node under load, so that such a
/// stall brings up no standby at all.
pub const DEFAULT_HEDGE_AFTER: Duration = Duration::from_millis(600);

/// While hedging is on, the longest an established link goes without a PING of the
/// proxy's: a frozen node is suspected within this plus `hedge_after` (1.1 s).
pub const HEDGE_KEEPALIVE: Duration = Duration::from_millis(500);

/// Default window over which the sessions of one proxy spread their dials to a new node
/// when their node goes lame duck (each waits a random part of it): 1,000 clients of a
/// shared proxy do not dial the remaining nodes in the same millisecond. nats-server
/// starts closing lame-duck clients after its grace period (10 s by default), so this
/// stays well inside it.
pub const DEFAULT_MIGRATION_SPREAD: Duration = Duration::from_millis(250);
/// The rate at which the sessions of one process that move at once dial their new
/// nodes: with `n` sessions moving, each waits a random part of `n / MIGRATION_DIAL_RATE`
/// seconds (at most `migration_spread`). A lone sidecar client dials at once; 100 or
/// more spread over the whole `migration_spread`.
pub const MIGRATION_DIAL_RATE: f64 = 400.0;

/// Default time without any upstream before the client is closed.
pub const DEFAULT_MAX_OUTAGE: Duration = Duration::from_secs(120);

/// First reconnect delay after the immediate attempt.
pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// Largest reconnect delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Static configuration of a session. Serialized (in `check-config`'s output), each
/// field is keyed as its option; fields no option sets are skipped, and secrets show only
/// their kind and public part.
#[derive(Debug, Clone, Serialize)]
pub struct SessionConfig {
    /// Upstream addresses (`host:port`) in order of preference.
    #[serde(skip)]
    pub upstreams: Vec<String>,
    /// Credentials the proxy presents upstream instead of the client's.
    #[serde(serialize_with = "masked", skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// The proxy's own key: signs each upstream nonce into `proxy_sig` (trusted proxies).
    #[serde(serialize_with = "masked", skip_serializing_if = "Option::is_none")]
    pub proxy_key: Option<NkeySeed>,
    /// Credentials clients must present to the proxy (then never passed upstream).
    #[serde(serialize_with = "masked", skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,
    /// Interval of the proxy's keepalive PINGs upstream.
    #[serde(serialize_with = "as_millis")]
    pub ping_interval: Duration,
    /// A link with a PING unanswered for `ping_interval * max_pings_out` is stale.
    #[serde(skip)]
    pub max_pings_out: u32,
    /// Bound of client bytes buffered while they cannot be written or are unconfirmed.
    pub max_backlog: usize,
    /// Time the new link's subscriptions get to propagate before the old ones are removed.
    #[serde(serialize_with = "as_millis")]
    pub settle: Duration,
    /// A primary's PING unanswered this long brings up a standby (zero: never).
    #[serde(serialize_with = "as_millis")]
    pub hedge_after: Duration,
    /// Time without any upstream before the client is closed with `-ERR`.
    #[serde(serialize_with = "as_millis")]
    pub max_outage: Duration,
    /// A lame-duck migration dials after a random delay below this (zero: at once).
    #[serde(serialize_with = "as_millis")]
    pub migration_spread: Duration,
    #[serde(skip)]
    pub backoff_min: Duration,
    #[serde(skip)]
    pub backoff_max: Duration,
    /// Bound of the overlap de-duplication memory (fingerprints).
    #[serde(skip)]
    pub max_dedup_entries: usize,
    /// Bound of bytes held back from the new link during an overlap (`max_hold`).
    #[serde(rename = "max_hold")]
    pub max_hold_bytes: usize,
    /// Seed of the backoff jitter.
    #[serde(skip)]
    pub seed: u64,
}

impl SessionConfig {
    /// The interval of keepalive PINGs: `ping_interval`, at most [`HEDGE_KEEPALIVE`]
    /// while hedging is on.
    pub fn keepalive_interval(&self) -> Duration {
        if self.hedge_after.is_zero() {
            self.ping_interval
        } else {
            self.ping_interval.min(HEDGE_KEEPALIVE)
        }
    }
}

/// A duration as its option takes it: `"250ms"`.
pub fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

/// A secret by its `Debug`, which shows only its kind and public part.
fn masked<S: serde::Serializer, T: std::fmt::Debug>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&format!("{v:?}")),
        None => s.serialize_none(),
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            upstreams: vec!["127.0.0.1:4222".into()],
            credentials: None,
            proxy_key: None,
            client_auth: None,
            ping_interval: DEFAULT_PING_INTERVAL,
            max_pings_out: 2,
            max_backlog: DEFAULT_MAX_BACKLOG,
            settle: DEFAULT_SETTLE,
            hedge_after: DEFAULT_HEDGE_AFTER,
            max_outage: DEFAULT_MAX_OUTAGE,
            migration_spread: DEFAULT_MIGRATION_SPREAD,
            backoff_min: DEFAULT_BACKOFF_MIN,
            backoff_max: DEFAULT_BACKOFF_MAX,
            max_dedup_entries: dedup::DEFAULT_MAX_ENTRIES,
            max_hold_bytes: dedup::DEFAULT_MAX_HOLD_BYTES,
            seed: 0,
        }
    }
}
