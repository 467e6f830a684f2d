//! The demo's local cluster: four nats-server processes in a temporary directory, started,
//! lame-ducked and restarted by PID, and their monitoring endpoints.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) type Res<T> = Result<T, String>;

pub fn server_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    // `.ci/setup`'s virtual environment (an externally managed system Python) when
    // run from the repository, as the README does.
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from(".venv/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A free loopback port below the kernel's ephemeral range, so that no outgoing
/// connection (a route, a client) takes it between this check and the server's bind,
/// nor while a node is down for its restart. Falls back to `bind(0)` where the range
/// leaves no room below it.
pub(super) fn free_port() -> Res<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LO: u32 = 10_000;
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    if ephemeral_lo < LO + 1_000 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        return Ok(l.local_addr().map_err(|e| e.to_string())?.port());
    }
    let span = ephemeral_lo - LO;
    let seed = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LO + seed.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free port in {LO}..{ephemeral_lo}"))
}

pub(super) struct Node {
    pub(super) name: String,
    pub(super) port: u16,
    pub(super) http: u16,
    pub(super) conf: PathBuf,
    pub(super) child: Option<Child>,
}

/// The demo's processes and files; dropped = stopped and removed.
pub(super) struct Cluster {
    pub(super) bin: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) nodes: Vec<Node>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    pub(super) fn start(bin: PathBuf) -> Res<Cluster> {
        let dir = std::env::temp_dir().join(format!("natsproxy-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut c = Cluster {
            bin,
            dir,
            nodes: Vec::new(),
        };
        let cports = (0..4).map(|_| free_port()).collect::<Res<Vec<_>>>()?;
        let routes: Vec<String> = cports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        for (i, cport) in cports.iter().enumerate() {
            let publisher = i == 3;
            let name = if publisher {
                "pub".to_string()
            } else {
                format!("n{}", i + 1)
            };
            let (port, http) = (free_port()?, free_port()?);
            let mut conf = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{http}\"\n\
                 lame_duck_duration: \"30s\"\nlame_duck_grace_period: \"1s\"\n"
            );
            if !publisher {
                conf += &format!(
                    "jetstream {{ store_dir: \"{}\" }}\n",
                    c.dir.join(&name).display()
                );
                // `demo --compare` places its R1 stream by this tag.
                conf += &format!("server_tags: [\"node:{name}\"]\n");
            }
            conf += &format!(
                "cluster {{ name: demo, listen: \"127.0.0.1:{cport}\", routes: [{}]{} }}\n",
                routes.join(", "),
                if publisher {
                    ", no_advertise: true"
                } else {
                    ""
                }
            );
            let path = c.dir.join(format!("{name}.conf"));
            std::fs::write(&path, conf).map_err(|e| e.to_string())?;
            c.nodes.push(Node {
                name,
                port,
                http,
                conf: path,
                child: None,
            });
            c.spawn(i)?;
        }
        Ok(c)
    }

    pub(super) fn spawn(&mut self, i: usize) -> Res<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.nodes[i].name)))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.nodes[i].conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    pub(super) fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    pub(super) async fn wait_healthy(&self, i: usize) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !healthz(self.nodes[i].http).await {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not become healthy; see {}",
                    self.nodes[i].name,
                    self.dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    pub(super) fn lame_duck(&self, i: usize) -> Res<()> {
        let pid = self.nodes[i]
            .child
            .as_ref()
            .map(Child::id)
            .ok_or("node not running")?;
        let ok = Command::new("kill")
            .args(["-USR2", &pid.to_string()])
            .status()
            .map_err(|e| e.to_string())?
            .success();
        ok.then_some(()).ok_or_else(|| "kill -USR2 failed".into())
    }

    pub(super) async fn wait_exit(&mut self, i: usize) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(c) = self.nodes[i].child.as_mut() {
                if c.try_wait().map_err(|e| e.to_string())?.is_some() {
                    self.nodes[i].child = None;
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not exit after lame duck",
                    self.nodes[i].name
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub(super) async fn healthz(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.ok()?;
        let mut b = Vec::new();
        s.read_to_end(&mut b).await.ok()?;
        Some(b.starts_with(b"HTTP/1.1 200") || b.starts_with(b"HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(true))
    )
}

/// True if the server's `/connz` lists a client connection with this name.
pub(super) async fn connz_has(port: u16, name: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /connz?limit=1024 HTTP/1.0\r\n\r\n")
            .await
            .ok()?;
        let mut b = Vec::new();
        s.read_to_end(&mut b).await.ok()?;
        let text = String::from_utf8_lossy(&b);
        Some(
            text.contains(&format!("\"name\": \"{name}\""))
                || text.contains(&format!("\"name\":\"{name}\"")),
        )
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Some(true))
    )
}
