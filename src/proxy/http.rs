//! The metrics and health endpoint: `GET /metrics` (Prometheus text), `/healthz` (the
//! process runs), `/readyz` (an upstream is reachable), `/livez/client` (the proxy's
//! client is consuming: [`super::watch`]; `?client=NAME` asks about one CONNECT name).
//! A deliberately small HTTP/1.1 responder: one request per connection, bounded request
//! size and time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::dial::Dialer;
use super::watch::{self, ClientWatch};
use super::Stats;

/// What the endpoint answers from.
pub struct State {
    pub stats: Arc<Stats>,
    pub ready: Arc<Readiness>,
    pub watch: Arc<ClientWatch>,
}

/// Largest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// Time a client gets to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the readiness probe dials when no client has a working upstream.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// Readiness holds this long after the last evidence of a reachable upstream, so that it
/// does not flap while nodes restart one by one.
pub const READY_HOLD: Duration = Duration::from_secs(10);

/// Readiness: an upstream answered recently (a client's session has one, or the probe
/// reached one).
pub struct Readiness {
    last_ok: std::sync::Mutex<Option<Instant>>,
    draining: std::sync::atomic::AtomicBool,
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness {
            last_ok: std::sync::Mutex::new(None),
            draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Shutdown began: not ready any more (health stays ok while clients drain).
    pub fn set_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn mark_ok(&self) {
        if let Ok(mut g) = self.last_ok.lock() {
            *g = Some(Instant::now());
        }
    }

    /// Ready now?
    pub fn is_ready(&self, stats: &Stats) -> bool {
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        if stats.sessions_with_upstream.get() > 0 {
            self.mark_ok();
            return true;
        }
        self.last_ok
            .lock()
            .ok()
            .and_then(|g| *g)
            .is_some_and(|t| t.elapsed() < READY_HOLD)
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

/// Dials the upstreams whenever no client session has a working upstream, to keep
/// readiness true while the cluster is reachable. A dial is what a session's would be
/// (the [`Dialer`]: TCP, then the server's INFO line, or the TLS handshake first for a
/// `handshake_first` node), so a node that only speaks TLS first counts too.
pub async fn probe(
    dialer: Arc<Dialer>,
    upstreams: Vec<String>,
    stats: Arc<Stats>,
    ready: Arc<Readiness>,
    shutdown: CancellationToken,
) {
    loop {
        if stats.sessions_with_upstream.get() > 0 {
            ready.mark_ok();
        } else {
            for addr in &upstreams {
                if dialer.dial(addr, PROBE_TIMEOUT).await.is_ok() {
                    ready.mark_ok();
                    break;
                }
            }
        }
        stats.ready.set(i64::from(ready.is_ready(&stats)));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
        }
    }
}

/// How long one readiness dial may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves the endpoint until shutdown.
pub async fn serve(listener: TcpListener, state: State, shutdown: CancellationToken) {
    if let Ok(a) = listener.local_addr() {
        info!(listen = %a, "metrics and health endpoint listening");
    }
    let state = Arc::new(state);
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &state)).await {
                debug!(error = %e, "metrics request timed out");
            }
        });
    }
}

/// `%XX` and `+` decoded (a client name in a query); None when not UTF-8.
fn percent_decoded(v: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let hex = |i: usize| {
            let h = std::str::from_utf8(v.get(i + 1..i + 3)?).ok()?;
            u8::from_str_radix(h, 16).ok()
        };
        match (v[i], hex(i)) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The value of `key` in a query string.
fn query_value(query: &[u8], key: &[u8]) -> Option<String> {
    query
        .split(|&c| c == b'&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix(b"="))
        .and_then(percent_decoded)
}

/// `/livez/client`: 200 while every watched client (or `?client=NAME`) is consuming.
fn client_liveness(state: &State, query: &[u8]) -> (&'static str, String) {
    let only = query_value(query, b"client");
    let now = Instant::now();
    let v = state.watch.with(|w| w.verdict(now, only.as_deref()));
    if only.is_none() {
        state.stats.client_live.set(i64::from(v.live()));
    }
    let status = if v.live() {
        "200 OK"
    } else {
        "503 Service Unavailable"
    };
    (status, v.body())
}

async fn respond(mut s: TcpStream, state: &State) {
    let (stats, ready) = (&*state.stats, &*state.ready);
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let line = buf.split(|&c| c == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&c| c == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let mut target = target.splitn(2, |&c| c == b'?');
    let path = target.next().unwrap_or_default();
    let query = target.next().unwrap_or_default();
    let (status, ctype, body) = match (method, path) {
        (b"GET", b"/metrics") => {
            let now = Instant::now();
            state.watch.with(|w| watch::export(w, stats, now));
            (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                stats.encode(),
            )
        }
        (b"GET", b"/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        (b"GET", b"/livez/client") => {
            let (status, body) = client_liveness(state, query);
            (status, "text/plain; charset=utf-8", body)
        }
        (b"GET", b"/readyz") => {
            let r = ready.is_ready(stats);
            stats.ready.set(i64::from(r));
            if r {
                ("200 OK", "text/plain", "ready\n".to_string())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "no upstream reachable\n".to_string(),
                )
            }
        }
        (b"GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
    let _ = s.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_name_in_a_query_is_decoded() {
        assert_eq!(
            query_value(b"client=vector", b"client").as_deref(),
            Some("vector")
        );
        assert_eq!(
            query_value(b"x=1&client=my%20vector+1%2", b"client").as_deref(),
            Some("my vector 1%2")
        );
        assert_eq!(query_value(b"clientx=1", b"client"), None);
        assert_eq!(query_value(b"client=%ff", b"client"), None);
    }
}
