//! Dialing one upstream node: resolve its name, connect, read its INFO, and do TLS where
//! planned or asked, so the sans-io session only ever sees a link and the INFO.
//!
//! NATS starts in cleartext: the server sends INFO, then, if it asks for TLS
//! (`tls_required`), the client does the handshake and only then sends CONNECT. A server
//! with `tls { handshake_first: true }` instead waits for the ClientHello before its INFO;
//! nothing on the wire tells, so that is per-upstream configuration (`?tls_first`).
//!
//! A name is resolved at every dial, and each address it resolves to is tried in turn, each
//! with an equal share of the time left (as Go's dialer does): a headless Service's pod IPs
//! are followed as they change, and one dead address does not take the whole timeout.
//!
//! A failed dial is a [`DialError`]: the address, the stage it failed in, and the source
//! error, so its log line says why.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::budget::DialBudget;
use super::tls::{TlsError, TlsFiles, UpstreamIo};
use crate::config::{UpstreamTls, UpstreamUrl, DEFAULT_DIAL_BURST, DEFAULT_DIAL_RATE};
use crate::proto::json::ServerInfo;

/// Bound of the INFO line read before TLS (nats-server's INFO is a few KiB).
const MAX_INFO_LINE: usize = 64 * 1024;

/// How to reach one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Refuse the node unless the connection is TLS.
    pub require_tls: bool,
    /// TLS before INFO.
    pub tls_first: bool,
}

/// The step of a dial that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialStage {
    /// Looking up the host name.
    Resolve,
    /// Opening the TCP connection (every address tried).
    Connect,
    /// Reading the server's first line.
    Info,
    /// The TLS handshake, or the server refusing or not offering TLS.
    Tls,
    /// Not dialled: the process's dial budget is spent (see [`DialBudget`]).
    Budget,
}

impl std::fmt::Display for DialStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DialStage::Resolve => "resolving the host name",
            DialStage::Connect => "connecting",
            DialStage::Info => "reading the server's INFO",
            DialStage::Tls => "TLS",
            DialStage::Budget => "waiting for the dial budget",
        })
    }
}

/// A dial that failed: where, at which step, and why.
#[derive(Debug, thiserror::Error)]
#[error("{addr}: {stage}{}: {source}", tried_suffix(.tried))]
pub struct DialError {
    /// The `host:port` dialled.
    pub addr: String,
    pub stage: DialStage,
    /// The addresses the name resolved to, in the order tried (for `Connect`: all failed).
    pub tried: Vec<SocketAddr>,
    #[source]
    pub source: io::Error,
}

fn tried_suffix(tried: &[SocketAddr]) -> String {
    match tried {
        [] | [_] => String::new(),
        many => {
            let list: Vec<String> = many.iter().map(SocketAddr::to_string).collect();
            format!(" (tried {})", list.join(", "))
        }
    }
}

/// Resolves `host:port` to socket addresses (the system's resolver unless replaced).
pub type Resolver = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

fn system_resolver() -> Resolver {
    Arc::new(|addr: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host(addr).await?.collect()) })
    })
}

/// Dials upstream nodes with the proxy's TLS settings; shared by all clients.
pub struct Dialer {
    tls: TlsFiles,
    /// Per configured `host:port`: its URL's TLS settings. Learned nodes use the defaults.
    plans: Vec<(String, Plan)>,
    resolve: Resolver,
    /// Shared by every client of the process.
    budget: Mutex<DialBudget>,
}

impl Dialer {
    /// Loads the TLS files once, so that a wrong path fails at start-up.
    pub fn new(tls: UpstreamTls, upstreams: &[UpstreamUrl]) -> Result<Dialer, TlsError> {
        let plans = upstreams
            .iter()
            .map(|u| {
                let plan = Plan {
                    require_tls: u.tls || tls.required,
                    tls_first: u.tls_first,
                };
                (u.addr.clone(), plan)
            })
            .collect();
        let d = Dialer {
            tls: TlsFiles::new(tls),
            plans,
            resolve: system_resolver(),
            budget: Mutex::new(DialBudget::new(DEFAULT_DIAL_RATE, DEFAULT_DIAL_BURST)),
        };
        if d.tls.uses_files() || d.plans.iter().any(|p| p.1.require_tls) {
            d.tls.client_config()?;
        }
        Ok(d)
    }

    /// The same dialer with another dial budget: `rate` dials per second after `burst`
    /// at once (`rate` 0: no limit).
    pub fn with_budget(mut self, rate: u32, burst: u32) -> Dialer {
        self.budget = Mutex::new(DialBudget::new(rate, burst));
        self
    }

    /// The same dialer with another resolver (a name whose addresses change).
    #[cfg(test)]
    pub fn with_resolver(mut self, resolve: Resolver) -> Dialer {
        self.resolve = resolve;
        self
    }

    /// The plan for `addr`: its URL's, or for a node learned from the cluster, TLS only
    /// if required everywhere (or asked for by the node itself).
    pub fn plan(&self, addr: &str) -> Plan {
        self.plans
            .iter()
            .find(|(a, _)| a == addr)
            .map(|p| p.1)
            .unwrap_or(Plan {
                require_tls: self.tls.settings().required,
                tls_first: false,
            })
    }

    /// The name `addr`'s certificate is verified against: `--upstream-tls-server-name`;
    /// else a configured URL's own host; else (a node learned from the cluster's INFO,
    /// announced by IP) the first configured host that is a name, as nats.go verifies
    /// implicit servers against the host of the URL it was given.
    pub fn verify_name<'a>(&'a self, addr: &'a str) -> &'a str {
        if let Some(n) = &self.tls.settings().server_name {
            return n;
        }
        let host = host_of(addr);
        if self.plans.iter().any(|(a, _)| a == addr) {
            return host;
        }
        self.plans
            .iter()
            .map(|(a, _)| host_of(a))
            .find(|h| h.parse::<IpAddr>().is_err())
            .unwrap_or(host)
    }

    /// Connects to `addr`, negotiates TLS as planned or as the server asks, and returns
    /// the stream with what was read from it (the INFO line, when read before TLS). The
    /// whole dial takes at most `timeout`.
    pub async fn dial(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<(UpstreamIo, BytesMut), DialError> {
        let deadline = Instant::now() + timeout;
        let fail = |stage, tried: &[SocketAddr], source| DialError {
            addr: addr.to_owned(),
            stage,
            tried: tried.to_vec(),
            source,
        };
        let granted = self
            .budget
            .lock()
            .map_or(true, |mut b| b.try_take(Instant::now().into_std()));
        if !granted {
            let e = io::Error::new(io::ErrorKind::WouldBlock, "dial budget spent");
            return Err(fail(DialStage::Budget, &[], e));
        }
        let resolved = tokio::time::timeout_at(deadline, (self.resolve)(addr.to_owned()))
            .await
            .unwrap_or_else(|_| Err(timed_out(timeout)))
            .and_then(|v| {
                if v.is_empty() {
                    Err(io::Error::new(io::ErrorKind::NotFound, "no address"))
                } else {
                    Ok(v)
                }
            })
            .map_err(|e| fail(DialStage::Resolve, &[], e))?;
        let tcp = connect_any(&resolved, deadline, timeout)
            .await
            .map_err(|e| fail(DialStage::Connect, &resolved, e))?;
        let _ = tcp.set_nodelay(true);
        let plan = self.plan(addr);
        let name = self.verify_name(addr);
        let r: Result<_, (DialStage, io::Error)> = async {
            if plan.tls_first {
                let tls = within(
                    deadline,
                    timeout,
                    DialStage::Tls,
                    self.tls.handshake(name, tcp),
                )
                .await?;
                return Ok((tls, BytesMut::new()));
            }
            let (tcp, line) =
                within(deadline, timeout, DialStage::Info, read_info_line(tcp)).await?;
            let (required, available) = parse_info(&line).map_err(|e| (DialStage::Info, e))?;
            if required || (plan.require_tls && available) {
                let tls = within(
                    deadline,
                    timeout,
                    DialStage::Tls,
                    self.tls.handshake(name, tcp),
                )
                .await?;
                return Ok((tls, line));
            }
            if plan.require_tls {
                let e = io::Error::other(
                    "the server offers no TLS but the upstream is tls:// (or --upstream-tls)",
                );
                return Err((DialStage::Tls, e));
            }
            Ok((UpstreamIo::Plain(tcp), line))
        }
        .await;
        r.map_err(|(stage, e)| fail(stage, &resolved, e))
    }
}

/// `fut`, failed as `stage` if it fails or is not done by `deadline`.
async fn within<T>(
    deadline: Instant,
    timeout: Duration,
    stage: DialStage,
    fut: impl Future<Output = io::Result<T>>,
) -> Result<T, (DialStage, io::Error)> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r.map_err(|e| (stage, e)),
        Err(_) => Err((stage, timed_out(timeout))),
    }
}

fn timed_out(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no answer within {timeout:?}"),
    )
}

/// Connects to the first of `addrs` that accepts; each gets an equal share of the time
/// left. The error is the last address's.
async fn connect_any(
    addrs: &[SocketAddr],
    deadline: Instant,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let mut last = None;
    for (i, sa) in addrs.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = left / (addrs.len() - i) as u32;
        match tokio::time::timeout(share, TcpStream::connect(sa)).await {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(e)) => last = Some(io::Error::new(e.kind(), format!("{sa}: {e}"))),
            Err(_) => last = Some(timed_out(timeout)),
        }
    }
    Err(last.unwrap_or_else(|| timed_out(timeout)))
}

/// Reads up to and including the first line (the server's INFO).
async fn read_info_line(mut tcp: TcpStream) -> io::Result<(TcpStream, BytesMut)> {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        if let Some(i) = memchr::memchr(b'\n', &buf) {
            if i + 1 != buf.len() {
                // A server says nothing after INFO until the client's CONNECT.
                return Err(io::Error::other("unexpected bytes after the server's INFO"));
            }
            return Ok((tcp, buf));
        }
        if buf.len() > MAX_INFO_LINE {
            return Err(io::Error::other("server INFO line too long"));
        }
        buf.reserve(4096);
        if tcp.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before its INFO",
            ));
        }
    }
}

/// (tls_required, tls_available) of an INFO line.
fn parse_info(line: &[u8]) -> io::Result<(bool, bool)> {
    let bad = || io::Error::other("the server's first line is not an INFO");
    let json = line
        .get(..5)
        .filter(|v| v.eq_ignore_ascii_case(b"INFO ") || v.eq_ignore_ascii_case(b"INFO\t"))
        .map(|_| line[5..].trim_ascii())
        .ok_or_else(bad)?;
    let info = ServerInfo::parse(json).ok_or_else(bad)?;
    let available = info
        .raw
        .get("tls_available")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Ok((info.tls_required, available))
}

/// The host of `host:port` (`[v6]:port` without brackets).
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A listener that sends a minimal INFO to each connection.
    async fn fake_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(b"INFO {\"server_id\":\"X\"}\r\n").await;
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
                });
            }
        });
        a
    }

    /// An address nothing listens on.
    async fn dead_addr() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    }

    fn dialer(resolved: Arc<Mutex<Vec<SocketAddr>>>, calls: Arc<Mutex<u32>>) -> Dialer {
        let url = UpstreamUrl {
            addr: "nats.example:4222".into(),
            credentials: None,
            tls: false,
            tls_first: false,
        };
        Dialer::new(UpstreamTls::default(), &[url])
            .unwrap()
            .with_resolver(Arc::new(move |_| {
                *calls.lock().unwrap() += 1;
                let v = resolved.lock().unwrap().clone();
                Box::pin(async move { Ok(v) })
            }))
    }

    #[tokio::test]
    async fn every_address_is_tried_and_the_name_is_resolved_at_each_dial() {
        let (live, dead) = (fake_server().await, dead_addr().await);
        let resolved = Arc::new(Mutex::new(vec![dead, live]));
        let calls = Arc::new(Mutex::new(0));
        let d = dialer(resolved.clone(), calls.clone());
        let (_, info) = d
            .dial("nats.example:4222", Duration::from_secs(2))
            .await
            .unwrap();
        assert!(info.starts_with(b"INFO "));
        // The pod moved: the name now resolves to the dead address only.
        *resolved.lock().unwrap() = vec![dead];
        let e = d
            .dial("nats.example:4222", Duration::from_secs(2))
            .await
            .err()
            .expect("nothing listens there now");
        assert_eq!(*calls.lock().unwrap(), 2);
        assert_eq!(e.stage, DialStage::Connect);
        assert_eq!(e.tried, vec![dead]);
        let text = e.to_string();
        assert!(
            text.starts_with("nats.example:4222: connecting: "),
            "{text}"
        );
        assert!(text.contains(&dead.to_string()), "{text}");
        assert_eq!(e.source.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_nothing_fails_at_resolve() {
        let d = dialer(Arc::new(Mutex::new(vec![])), Arc::new(Mutex::new(0)));
        let e = d
            .dial("nats.example:4222", Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert_eq!(e.stage, DialStage::Resolve);
        assert!(e.to_string().contains("resolving the host name"));
    }

    #[tokio::test]
    async fn a_silent_server_fails_at_info_within_the_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        let d = dialer(Arc::new(Mutex::new(vec![a])), Arc::new(Mutex::new(0)));
        let t0 = std::time::Instant::now();
        let e = d
            .dial("nats.example:4222", Duration::from_millis(300))
            .await
            .err()
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(e.stage, DialStage::Info);
        assert_eq!(e.source.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn learned_nodes_are_verified_against_the_configured_name() {
        let url = |a: &str| UpstreamUrl {
            addr: a.into(),
            credentials: None,
            tls: true,
            tls_first: false,
        };
        let tls = UpstreamTls {
            insecure_skip_verify: true,
            ..UpstreamTls::default()
        };
        let d = Dialer::new(tls.clone(), &[url("10.0.0.1:4222"), url("nats.svc:4222")]).unwrap();
        assert_eq!(d.verify_name("nats.svc:4222"), "nats.svc");
        assert_eq!(d.verify_name("10.0.0.1:4222"), "10.0.0.1");
        assert_eq!(d.verify_name("10.0.0.7:4222"), "nats.svc");
        assert_eq!(d.verify_name("[::1]:4222"), "nats.svc");
        let named = UpstreamTls {
            server_name: Some("nats.internal".into()),
            ..tls
        };
        let d = Dialer::new(named, &[url("10.0.0.1:4222")]).unwrap();
        assert_eq!(d.verify_name("10.0.0.9:4222"), "nats.internal");
    }
}
