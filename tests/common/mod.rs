//! Test harness: real nats-server processes on free ports, the proxy in-process, and
//! helpers that wait on events with timeouts (never fixed sleeps). The cluster, Vector's
//! loop, the raw client, the balancer, the slow route and the rolling-restart check are
//! the test kit's (`kit/`, shared with the demo and the benches); what is here is what
//! only the tests use, and the kit's fallible calls as the panics a test wants.
#![allow(dead_code)]

#[allow(unused_imports)] // each test binary uses some of them
pub use natsproxy_kit::{balancer, cluster, http_get, raw, roll, slow_route, within, TempDir};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use natsproxy::config::{Config, UpstreamUrl};
use natsproxy::proxy::{Proxy, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

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

/// The nats-server binary ([`natsproxy_kit::server_bin`]); every integration test needs
/// one, so none is a panic saying how to get it.
pub fn server_bin() -> PathBuf {
    natsproxy_kit::server_bin().unwrap_or_else(|e| panic!("{e}"))
}

/// The version string of the server binary under test, e.g. "2.15.1".
pub fn server_version() -> String {
    natsproxy_kit::server_version().unwrap_or_else(|e| panic!("{e}"))
}

/// A free loopback port below the ephemeral range ([`natsproxy_kit::free_port`]).
pub fn free_port() -> u16 {
    natsproxy_kit::free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// A temporary directory `natsproxy-test-{tag}-…`, removed on drop.
pub fn temp_dir(tag: &str) -> TempDir {
    TempDir::new(&format!("test-{tag}")).unwrap_or_else(|e| panic!("{e}"))
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
        let dir = temp_dir("srv");
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

/// A GET on loopback within 2 s: the status code and the body, or None.
pub async fn http_status(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let code = text.get(9..12)?.parse().ok()?;
        let (_, body) = text.split_once("\r\n\r\n")?;
        Some((code, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .ok()
        .flatten()
}

/// An answer of `/livez/client` that was not 200: when (since the sampler started), the
/// status (0: no answer) and the body.
pub type NotLive = (Duration, u16, String);

/// Asks `/livez/client` every 250 ms until stopped; keeps every answer that was not 200.
pub struct LivenessSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<NotLive>)>,
}

impl LivenessSampler {
    pub fn start(metrics: SocketAddr) -> LivenessSampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let (mut asked, mut bad) = (0, Vec::new());
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                asked += 1;
                match http_status(metrics, "/livez/client").await {
                    Some((200, _)) => {}
                    Some((code, body)) => bad.push((t0.elapsed(), code, body)),
                    None => bad.push((t0.elapsed(), 0, "no answer".into())),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (asked, bad)
        });
        LivenessSampler { stop, task }
    }

    /// Stops; panics unless every answer was 200 (and there were some).
    pub async fn assert_live_throughout(self, what: &str) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (asked, bad) = within(Duration::from_secs(5), "the liveness sampler", self.task)
            .await
            .unwrap();
        println!(
            "{what}: /livez/client asked {asked} times, {} not 200",
            bad.len()
        );
        assert!(asked > 10, "{what}: /livez/client asked only {asked} times");
        assert!(bad.is_empty(), "{what}: /livez/client failed: {bad:?}");
    }
}
