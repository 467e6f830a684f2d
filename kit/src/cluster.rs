//! A real nats-server cluster on free loopback ports: start, lame duck (SIGUSR2), wait
//! for exit, restart, wait until whole again, SIGKILL, SIGSTOP/SIGCONT. Every process is
//! ours and is stopped by its PID; dropping the [`Cluster`] stops them and removes its
//! directory. Every operation returns [`Error`] with the node and, for a wait, the end of
//! its log.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::slow_route::{RouteForwarder, SlowRoute};
use crate::{deadline, free_port, http_get, server_bin, Error, TempDir};

/// One cluster node.
pub struct Node {
    pub name: String,
    pub port: u16,
    pub http: u16,
    pub cluster_port: u16,
    conf: PathBuf,
    log: PathBuf,
    pub child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
    fn spawn(&mut self) -> Result<(), Error> {
        if self.child.is_some() {
            return Err(self.refused("started while still running"));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(Error::io(format!("open {}", self.log.display())))?;
        let bin = server_bin()?;
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(Error::io(format!("start {}", bin.display())))?;
        self.child = Some(child);
        Ok(())
    }
    fn signal(&self, sig: &str) -> Result<(), Error> {
        let pid = self
            .pid()
            .ok_or_else(|| self.refused("signalled while not running"))?;
        let what = format!("kill {sig} {pid} ({})", self.name);
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map_err(Error::io(what.clone()))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::io(what)(std::io::Error::other(status.to_string())))
        }
    }
    fn refused(&self, what: &'static str) -> Error {
        Error::Node {
            node: self.name.clone(),
            what,
        }
    }
    /// The node's log so far (stderr of every run).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// The last 20 lines of the log, for an error message.
    fn log_tail(&self) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// Cluster options.
#[derive(Clone, Default)]
pub struct ClusterOpts {
    pub nodes: usize,
    pub jetstream: bool,
    /// Add a node outside the proxy's view (no JetStream, not advertised) for publishers.
    pub publisher_node: bool,
    /// A `tls { }` block for the client port of the cluster's nodes (not the publisher's).
    pub client_tls: Option<String>,
    /// No node advertises its client URL (no `connect_urls`): reached through one address.
    pub no_advertise: bool,
    /// `lame_duck_grace_period` (default 1 s: a node exits 2-5 s after SIGUSR2). The time
    /// before a lame-duck node starts closing its clients; nats-server's own default is
    /// 10 s.
    pub lame_duck_grace: Option<Duration>,
    /// One route made slow on purpose (see [`super::slow_route`]).
    pub slow_route: Option<SlowRoute>,
    /// The tag of the cluster's directory, `natsproxy-{tag}-{pid}-{n}` (default `cluster`).
    pub dir_tag: Option<&'static str>,
}

/// One cluster at a time per test binary: clusters are heavy for 2 cores, and free-port
/// picking across concurrently starting clusters can collide.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct Cluster {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    pub nodes: Vec<Node>,
    /// The publisher node, if any (index `nodes.len()` is not used for it).
    pub publisher: Option<Node>,
    /// Each node's route forwarder, when a route is slow.
    pub forwarders: Vec<RouteForwarder>,
    dir: TempDir,
}

impl Cluster {
    /// Starts the nodes and waits until each is healthy and the routes are complete.
    pub async fn start(opts: ClusterOpts) -> Result<Cluster, Error> {
        let turn = ONE_AT_A_TIME.lock().await;
        let dir = TempDir::new(opts.dir_tag.unwrap_or("cluster"))?;
        let n = opts.nodes;
        let total = n + usize::from(opts.publisher_node);
        let cports = (0..total)
            .map(|_| free_port())
            .collect::<Result<Vec<u16>, _>>()?;
        let name_of = |i: usize| {
            if i == n {
                "pub".to_string()
            } else {
                format!("n{}", i + 1)
            }
        };
        // With a slow route every node is reached through its forwarder, also by the
        // routes the nodes learn from each other (the advertised address).
        let mut forwarders = Vec::new();
        if let Some(slow) = &opts.slow_route {
            for (i, &p) in cports.iter().enumerate() {
                forwarders.push(RouteForwarder::start(name_of(i), p, slow.clone()).await);
            }
        }
        let reach: Vec<u16> = if forwarders.is_empty() {
            cports.clone()
        } else {
            forwarders.iter().map(|f| f.port).collect()
        };
        let routes: Vec<String> = reach
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect();
        let mut all = Vec::new();
        for (i, &cport) in cports.iter().enumerate() {
            let is_pub = i == n;
            let name = name_of(i);
            let port = free_port()?;
            let http = free_port()?;
            let plan = Plan {
                name: &name,
                port,
                http,
                cluster_port: cport,
                advertise: (!forwarders.is_empty()).then(|| reach[i]),
                publisher: is_pub,
            };
            let node = plan.write(&opts, &routes, &dir.0, i)?;
            all.push(node);
        }
        let publisher = if opts.publisher_node { all.pop() } else { None };
        let mut c = Cluster {
            _turn: turn,
            nodes: all,
            publisher,
            forwarders,
            dir,
        };
        for node in c.nodes.iter_mut().chain(c.publisher.iter_mut()) {
            node.spawn()?;
        }
        for i in 0..c.nodes.len() {
            c.wait_healthy(i).await?;
        }
        if let Some(p) = &c.publisher {
            wait_healthz(p).await?;
        }
        c.wait_routes().await?;
        Ok(c)
    }

    /// The cluster's directory: configurations, logs, JetStream stores.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir.0
    }

    /// Waits until node `i` answers `/healthz` with 200 (JetStream current, if enabled).
    pub async fn wait_healthy(&self, i: usize) -> Result<(), Error> {
        wait_healthz(&self.nodes[i]).await
    }

    /// Waits until every running node has its routes to every other running node by
    /// name, the same number to each: a route pool (nats-server 2.10 on: 3 connections
    /// and the system account's) is complete, not just its first connection. A test that
    /// slows a route afterwards must not slow the handshake of a pool connection still
    /// forming (2.15 then keeps duplicate routes, and interest sent on one is lost).
    pub async fn wait_routes(&self) -> Result<(), Error> {
        let running: Vec<&Node> = self
            .nodes
            .iter()
            .chain(self.publisher.iter())
            .filter(|n| n.child.is_some())
            .collect();
        // The pool's connections come one after another: the same complete counts twice
        // in a row, 100 ms apart.
        let mut last = None;
        deadline(Duration::from_secs(30), "cluster routes", async {
            loop {
                let mut round = Vec::new();
                for n in &running {
                    let body = http_get(n.http, "/routez").await.unwrap_or_default();
                    let others = running.len() - 1;
                    let state = match route_counts(&body) {
                        Some(counts) => {
                            let each = running
                                .iter()
                                .filter(|o| o.name != n.name)
                                .map(|o| counts.get(&o.name).copied().unwrap_or(0))
                                .collect::<Vec<_>>();
                            let complete = each.iter().all(|&c| c > 0 && c == each[0])
                                && counts.len() == others;
                            complete.then_some(each)
                        }
                        // Before 2.10 (no names, no pools): one route per other node.
                        None => (num_routes(&body) == others).then(|| vec![1; others]),
                    };
                    round.push(state);
                }
                let round: Option<Vec<Vec<usize>>> = round.into_iter().collect();
                if round.is_some() && round == last {
                    return;
                }
                last = round;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    }

    /// SIGUSR2: lame duck mode.
    pub fn lame_duck(&self, i: usize) -> Result<(), Error> {
        self.nodes[i].signal("-USR2")
    }

    /// Waits for node `i` to exit (after lame duck), at most `d`.
    pub async fn wait_exit(&mut self, i: usize, d: Duration) -> Result<(), Error> {
        let node = &mut self.nodes[i];
        let what = format!("{} to exit", node.name);
        deadline(d, &what, async {
            while let Some(c) = node.child.as_mut() {
                if c.try_wait().map_err(Error::io(what.clone()))?.is_some() {
                    node.child = None;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        })
        .await?
    }

    /// True when node `i` has exited (after lame duck); reaps it.
    pub fn exited(&mut self, i: usize) -> Result<bool, Error> {
        let node = &mut self.nodes[i];
        let Some(c) = node.child.as_mut() else {
            return Ok(true);
        };
        let gone = c
            .try_wait()
            .map_err(Error::io(format!("wait for {}", node.name)))?
            .is_some();
        if gone {
            node.child = None;
        }
        Ok(gone)
    }

    /// Starts node `i` again and waits until it is healthy and routed; returns when its
    /// `/healthz` first answered 200.
    pub async fn restart(&mut self, i: usize) -> Result<std::time::SystemTime, Error> {
        self.nodes[i].spawn()?;
        self.wait_healthy(i).await?;
        let healthy = std::time::SystemTime::now();
        self.wait_routes().await?;
        Ok(healthy)
    }

    /// SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the process hangs with its sockets open.
    pub fn stop(&self, i: usize) -> Result<(), Error> {
        self.nodes[i].signal("-STOP")
    }

    /// SIGCONT.
    pub fn cont(&self, i: usize) -> Result<(), Error> {
        self.nodes[i].signal("-CONT")
    }

    /// Index of the node that holds a client connection named `name` (from `/connz`).
    pub async fn node_of_client(&self, name: &str) -> Option<usize> {
        for (i, n) in self.nodes.iter().enumerate() {
            if n.child.is_none() {
                continue;
            }
            if connz_has(n.http, name).await {
                return Some(i);
            }
        }
        None
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut().chain(self.publisher.iter_mut()) {
            if let Some(mut c) = n.child.take() {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Route connections per remote node name, from a `/routez` body; None from a server
/// that names no remotes (before 2.10).
fn route_counts(routez: &str) -> Option<std::collections::HashMap<String, usize>> {
    if !routez.contains("\"remote_name\"") {
        return None;
    }
    let mut counts = std::collections::HashMap::new();
    for part in routez.split("\"remote_name\":").skip(1) {
        let name = part.trim_start().trim_start_matches('"');
        if let Some(end) = name.find('"') {
            *counts.entry(name[..end].to_owned()).or_default() += 1;
        }
    }
    Some(counts)
}

fn num_routes(routez: &str) -> usize {
    routez
        .split("\"num_routes\":")
        .nth(1)
        .and_then(|r| {
            r.trim()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// One node's place in the cluster, from which its configuration is written.
struct Plan<'a> {
    name: &'a str,
    port: u16,
    http: u16,
    cluster_port: u16,
    /// The route address the others reach it at, when it differs (a slow route's
    /// forwarder).
    advertise: Option<u16>,
    /// The publisher node: no JetStream, no client TLS, not advertised.
    publisher: bool,
}

impl Plan<'_> {
    /// Writes the node's configuration into `dir`: the node, not yet started (its log
    /// is `{index}.log`).
    fn write(
        &self,
        opts: &ClusterOpts,
        routes: &[String],
        dir: &std::path::Path,
        index: usize,
    ) -> Result<Node, Error> {
        let conf_path = dir.join(format!("{}.conf", self.name));
        std::fs::write(&conf_path, self.conf(opts, routes, dir))
            .map_err(Error::io(format!("write {}", conf_path.display())))?;
        Ok(Node {
            name: self.name.to_owned(),
            port: self.port,
            http: self.http,
            cluster_port: self.cluster_port,
            conf: conf_path,
            log: dir.join(format!("{index}.log")),
            child: None,
        })
    }

    /// The node's nats-server configuration: `routes` to every node, JetStream stores
    /// under `dir`.
    fn conf(&self, opts: &ClusterOpts, routes: &[String], dir: &std::path::Path) -> String {
        let Plan {
            name,
            port,
            http,
            cluster_port,
            advertise,
            publisher,
        } = *self;
        let grace = opts.lame_duck_grace.unwrap_or(Duration::from_secs(1));
        let mut conf = format!(
            "server_name: {name}\nlisten: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{http}\"\n\
             lame_duck_duration: \"30s\"\nlame_duck_grace_period: \"{}ms\"\n",
            grace.as_millis()
        );
        if let (Some(tls), false) = (&opts.client_tls, publisher) {
            conf += tls;
        }
        if opts.jetstream && !publisher {
            conf += &format!(
                "jetstream {{ store_dir: \"{}\" }}\n",
                dir.join(name).display()
            );
            conf += &format!("server_tags: [\"node:{name}\"]\n");
        }
        let advertise = advertise
            .map(|p| format!("  advertise: \"127.0.0.1:{p}\"\n"))
            .unwrap_or_default();
        let no_advertise = if publisher || opts.no_advertise {
            "  no_advertise: true\n"
        } else {
            ""
        };
        conf += &format!(
            "cluster {{\n  name: c1\n  listen: \"127.0.0.1:{cluster_port}\"\n{advertise}  routes: [{}]\n{no_advertise}}}\n",
            routes.join(", "),
        );
        conf
    }
}

/// True if the server whose monitoring port is `http` lists a client connection named
/// `name` in its `/connz`.
pub async fn connz_has(http: u16, name: &str) -> bool {
    let body = http_get(http, "/connz?limit=1024")
        .await
        .unwrap_or_default();
    body.contains(&format!("\"name\": \"{name}\""))
        || body.contains(&format!("\"name\":\"{name}\""))
}

/// Waits (60 s at most) until `node` answers `/healthz` with 200.
async fn wait_healthz(node: &Node) -> Result<(), Error> {
    let after = Duration::from_secs(60);
    let ok = tokio::time::timeout(after, async {
        while http_get(node.http, "/healthz").await.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    ok.map_err(|_| Error::Timeout {
        what: format!("{} to be healthy", node.name),
        after,
        log_tail: node.log_tail(),
    })
}
