//! End-to-end benchmark on loopback against a real nats-server, three paths side by side
//! in one run, alternating each round: direct (client ↔ nats-server), a plain TCP relay
//! (tokio `copy_bidirectional`, the floor of what any proxy costs) and natsproxy.
//!
//!   cargo bench --bench e2e                 # full run (7 rounds)
//!   cargo bench --bench e2e -- --quick      # smoke run (CI): 1 round, small counts
//!   cargo bench --bench e2e -- --only sub --sizes 128 --rounds 9
//!                                           # one section (sub, pub, rr, js), for A/B work
//!
//! Both the relay and natsproxy run as their own processes (the relay is this binary
//! re-executed with `--relay`), so CPU time and RSS are theirs alone.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

// The tests' harness over the test kit: free ports, the server binary, the cluster for
// the migration-cost section.
#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--relay") {
        return relay(&args[i + 1], &args[i + 2]);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let opts = Opts {
        quick,
        only: value("--only"),
        rounds: value("--rounds").map(|r| r.parse().expect("--rounds N")),
        sizes: value("--sizes").map(|s| {
            s.split(',')
                .map(|v| v.parse().expect("--sizes 128,1024"))
                .collect()
        }),
        messages: value("--messages").map(|m| m.parse().expect("--messages N")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.iter().any(|a| a == "--migration") {
        return rt.block_on(migration_table());
    }
    rt.block_on(run(opts));
}

/// The paths in the order round `round` runs them: A B C, then C B A, alternating.
fn round_order(paths: &[Path], round: usize) -> Vec<Path> {
    if round % 2 == 0 {
        paths.to_vec()
    } else {
        paths.iter().rev().copied().collect()
    }
}

struct Opts {
    quick: bool,
    /// Run one section only: sub, pub, rr, js.
    only: Option<String>,
    rounds: Option<usize>,
    sizes: Option<Vec<usize>>,
    /// Messages per subscriber or publisher run (default 500,000; `--quick` 20,000).
    messages: Option<u64>,
}

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

/// The plain relay: accept on `listen`, copy bytes both ways to `upstream`.
fn relay(listen: &str, upstream: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(listen).await.unwrap();
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            let up = upstream.to_string();
            tokio::spawn(async move {
                let _ = c.set_nodelay(true);
                if let Ok(mut u) = tokio::net::TcpStream::connect(up).await {
                    let _ = u.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                }
            });
        }
    });
}

use common::{free_port, server_bin};

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "port {port} never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (utime + stime) in seconds and RSS in KiB of a process.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // fields after ')' start at state (3rd field): utime is field 14 → index 11.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    (cpu, rss)
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Path {
    Direct,
    Relay,
    Proxy,
}

struct Env {
    server: SocketAddr,
    relay: SocketAddr,
    proxy: SocketAddr,
    proxy_pid: u32,
    relay_pid: u32,
}

impl Env {
    fn url(&self, p: Path) -> String {
        let a = match p {
            Path::Direct => self.server,
            Path::Relay => self.relay,
            Path::Proxy => self.proxy,
        };
        format!("nats://{a}")
    }
}

/// Subscriber throughput: the publisher is direct, the subscriber goes through `path`.
async fn sub_throughput(env: &Env, path: Path, size: usize, n: u64) -> f64 {
    let sub_c = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 20)
        .connect(env.url(path))
        .await
        .unwrap();
    let publisher = async_nats::connect(env.url(Path::Direct)).await.unwrap();
    let subject = format!("bench.sub.{}", fastrand_u32());
    let mut sub = sub_c.subscribe(subject.clone()).await.unwrap();
    sub_c.flush().await.unwrap();
    // Interest registered (a round trip through the path).
    let _ = sub_c.request("bench.nobody", "".into()).await;
    let payload: bytes::Bytes = vec![b'x'; size].into();
    let got = Arc::new(AtomicU64::new(0));
    let counter = {
        let got = got.clone();
        tokio::spawn(async move {
            let mut first = None;
            let mut last = Instant::now();
            while let Some(_m) = sub.next().await {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                if got.fetch_add(1, Ordering::Relaxed) + 1 >= n {
                    break;
                }
            }
            first.map(|f| last.duration_since(f)).unwrap_or_default()
        })
    };
    let p = tokio::spawn(async move {
        for _ in 0..n {
            publisher
                .publish(subject.clone(), payload.clone())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
    });
    let took = tokio::time::timeout(Duration::from_secs(120), counter).await;
    p.abort();
    match took {
        Ok(Ok(d)) if d > Duration::ZERO => n as f64 / d.as_secs_f64(),
        _ => {
            eprintln!(
                "  {path:?}: subscriber got {} of {n} (slow consumer?)",
                got.load(Ordering::Relaxed)
            );
            0.0
        }
    }
}

/// Publisher throughput: the publisher goes through `path`, the subscriber is direct.
async fn pub_throughput(env: &Env, path: Path, size: usize, n: u64) -> f64 {
    let sub_c = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 20)
        .connect(env.url(Path::Direct))
        .await
        .unwrap();
    let publisher = async_nats::connect(env.url(path)).await.unwrap();
    let subject = format!("bench.pub.{}", fastrand_u32());
    let mut sub = sub_c.subscribe(subject.clone()).await.unwrap();
    let _ = sub_c.request("bench.nobody", "".into()).await;
    let payload: bytes::Bytes = vec![b'x'; size].into();
    let start = Instant::now();
    let p = tokio::spawn(async move {
        for _ in 0..n {
            publisher
                .publish(subject.clone(), payload.clone())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
        publisher
    });
    let mut got = 0;
    let ok = tokio::time::timeout(Duration::from_secs(120), async {
        while sub.next().await.is_some() {
            got += 1;
            if got >= n {
                break;
            }
        }
    })
    .await;
    let took = start.elapsed();
    let _ = p.await;
    if ok.is_err() {
        eprintln!("  {path:?}: subscriber got {got} of {n}");
        return 0.0;
    }
    n as f64 / took.as_secs_f64()
}

/// Request/reply round trips at `rate`/s for `secs`: the requester goes through `path`,
/// the responder is direct. Returns sorted latencies.
async fn req_reply(env: &Env, path: Path, rate: u64, secs: f64) -> Vec<Duration> {
    let responder = async_nats::connect(env.url(Path::Direct)).await.unwrap();
    let subject = format!("bench.svc.{}", fastrand_u32());
    let mut svc = responder.subscribe(subject.clone()).await.unwrap();
    responder.flush().await.unwrap();
    let r = tokio::spawn(async move {
        while let Some(m) = svc.next().await {
            if let Some(reply) = m.reply {
                let _ = responder.publish(reply, m.payload).await;
            }
        }
    });
    let c = async_nats::connect(env.url(path)).await.unwrap();
    while c.request(subject.clone(), "warm".into()).await.is_err() {}
    let mut lat = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    let n = (rate as f64 * secs) as usize;
    for _ in 0..n {
        tick.tick().await;
        let t = Instant::now();
        if c.request(subject.clone(), "q".into()).await.is_ok() {
            lat.push(t.elapsed());
        }
    }
    r.abort();
    lat.sort();
    lat
}

/// JetStream pull consumption with acks, Vector's way, through `path`.
async fn js_pull(env: &Env, path: Path, n: u64) -> f64 {
    use async_nats::jetstream::{self, consumer::pull, stream};
    let direct = jetstream::new(async_nats::connect(env.url(Path::Direct)).await.unwrap());
    let name = format!("B{}", fastrand_u32());
    let s = direct
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    s.create_consumer(pull::Config {
        durable_name: Some("C".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let payload: bytes::Bytes = vec![b'x'; 128].into();
    let mut acks = Vec::new();
    for _ in 0..n {
        acks.push(
            direct
                .publish(format!("{name}.v"), payload.clone())
                .await
                .unwrap(),
        );
        if acks.len() >= 1000 {
            for a in acks.drain(..) {
                a.await.unwrap();
            }
        }
    }
    for a in acks {
        a.await.unwrap();
    }
    let js = jetstream::new(async_nats::connect(env.url(path)).await.unwrap());
    let mut msgs = natsproxy_kit::vector::open(&js, &name, "C").await.unwrap();
    let start = Instant::now();
    let mut got = 0;
    let end = natsproxy_kit::vector::run(&mut msgs, |_| {
        got += 1;
        if got >= n {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .await;
    let took = start.elapsed();
    assert_eq!(
        end,
        natsproxy_kit::vector::End::Stopped,
        "after {got} of {n}"
    );
    let _ = direct.delete_stream(&name).await;
    n as f64 / took.as_secs_f64()
}

fn fastrand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish() as u32
}

/// p50, p99 and p99.9 of each run, in µs.
type Percentiles = (Vec<f64>, Vec<f64>, Vec<f64>);

/// The migration-cost table (also alone: `cargo bench --bench e2e -- --migration`).
async fn migration_table() {
    println!(
        "\n### Migration cost: one lame-duck migration under a steady publisher (3-node cluster)\n"
    );
    println!("| rate | lame-duck INFO → switch | largest gap at the subscriber | published | received |\n|---|---|---|---|---|");
    for rate in [1_000u64, 10_000] {
        let (switch, gap, published, received) = migration_cost(rate).await;
        println!("| {rate} msg/s | {switch:.1?} | {gap:.1?} | {published} | {received} |");
    }
}

/// One lame-duck migration under a steady publisher at `rate`/s (publisher on a node that
/// is not restarted, subscriber through natsproxy): (switch time, largest gap at the
/// subscriber, published, received).
async fn migration_cost(rate: u64) -> (Duration, Duration, u64, u64) {
    use common::cluster::{Cluster, ClusterOpts};
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        jetstream: false,
        publisher_node: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let proxy = common::TestProxy::start(&cluster.urls()).await;
    let sub_c = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 20)
        .connect(proxy.url())
        .await
        .unwrap();
    let publisher = async_nats::connect(cluster.publisher.as_ref().unwrap().url())
        .await
        .unwrap();
    let mut sub = sub_c.subscribe("mig").await.unwrap();
    loop {
        publisher.publish("mig", "probe".into()).await.unwrap();
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), sub.next()).await {
            break;
        }
    }
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), sub.next()).await {}
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let rx = tokio::spawn(async move {
        let (mut n, mut gap, mut last) = (0u64, Duration::ZERO, None::<Instant>);
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(3), sub.next()).await {
            let now = Instant::now();
            if let Some(l) = last {
                gap = gap.max(now - l);
            }
            last = Some(now);
            n += 1;
        }
        (n, gap)
    });
    let tx = {
        let (stop, published, publisher) = (stop.clone(), published.clone(), publisher.clone());
        tokio::spawn(async move {
            let per_ms = (rate / 1000).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_ms {
                    let n = published.fetch_add(1, Ordering::Relaxed);
                    publisher
                        .publish("mig", n.to_string().into())
                        .await
                        .unwrap();
                }
            }
            publisher.flush().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.lame_duck(0).unwrap();
    cluster.wait_exit(0, Duration::from_secs(40)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    tx.await.unwrap();
    let (received, gap) = rx.await.unwrap();
    let switch = Duration::from_micros(proxy.stats.max_switch_us.load(Ordering::Relaxed));
    (switch, gap, published.load(Ordering::Relaxed), received)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn pct(lat: &[Duration], p: f64) -> Duration {
    if lat.is_empty() {
        return Duration::ZERO;
    }
    lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]
}

async fn run(opts: Opts) {
    let quick = opts.quick;
    let sport = free_port();
    let dir = std::env::temp_dir().join(format!("natsproxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("s.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:{sport}\"\njetstream {{ store_dir: \"{}\" }}\n",
            dir.join("js").display()
        ),
    )
    .unwrap();
    let _server = Proc(
        Command::new(server_bin())
            .arg("-c")
            .arg(&conf)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(sport).await;
    let (rport, pport) = (free_port(), free_port());
    let me = std::env::current_exe().unwrap();
    let relay = Proc(
        Command::new(&me)
            .args([
                "--relay",
                &format!("127.0.0.1:{rport}"),
                &format!("127.0.0.1:{sport}"),
            ])
            .spawn()
            .unwrap(),
    );
    let proxy = Proc(
        Command::new(env!("CARGO_BIN_EXE_natsproxy"))
            .args([
                "--listen",
                &format!("127.0.0.1:{pport}"),
                "--upstream",
                &format!("nats://127.0.0.1:{sport}"),
                "--log-level",
                "warn",
            ])
            .spawn()
            .unwrap(),
    );
    wait_port(rport).await;
    wait_port(pport).await;
    let env = Env {
        server: format!("127.0.0.1:{sport}").parse().unwrap(),
        relay: format!("127.0.0.1:{rport}").parse().unwrap(),
        proxy: format!("127.0.0.1:{pport}").parse().unwrap(),
        proxy_pid: proxy.0.id(),
        relay_pid: relay.0.id(),
    };
    let rounds = opts.rounds.unwrap_or(if quick { 1 } else { 7 });
    let n_sub: u64 = opts
        .messages
        .unwrap_or(if quick { 20_000 } else { 500_000 });
    let n_js: u64 = if quick { 2_000 } else { 50_000 };
    let (rate, secs) = if quick { (500, 0.5) } else { (1000, 5.0) };
    let paths = [Path::Direct, Path::Relay, Path::Proxy];

    println!(
        "natsproxy end-to-end benchmark: {rounds} round(s), nats-server {}",
        String::from_utf8_lossy(
            &Command::new(server_bin())
                .arg("--version")
                .output()
                .unwrap()
                .stdout
        )
        .trim()
    );

    // Resources at rest.
    let idle1 = {
        let _c = async_nats::connect(env.url(Path::Proxy)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        usage(env.proxy_pid).1
    };
    let idle100 = {
        let mut cs = Vec::new();
        for _ in 0..100 {
            cs.push(async_nats::connect(env.url(Path::Proxy)).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        usage(env.proxy_pid).1
    };

    let sizes = opts.sizes.clone().unwrap_or(vec![128, 1024]);
    for &size in sizes.iter().filter(|_| opts.runs("sub")) {
        let mut rates: std::collections::HashMap<&str, Vec<f64>> = Default::default();
        let mut r_proxy_relay = Vec::new();
        let mut r_proxy_direct = Vec::new();
        let mut r_relay_direct = Vec::new();
        let mut cpu_per_m = Vec::new();
        let mut relay_cpu_per_m = Vec::new();
        let mut peak_rss = 0;
        for round in 0..rounds {
            let mut this = std::collections::HashMap::new();
            // Alternate the order every round.
            let order = round_order(&paths, round);
            for p in order {
                let pid = match p {
                    Path::Relay => env.relay_pid,
                    _ => env.proxy_pid,
                };
                let (cpu0, _) = usage(pid);
                let r = sub_throughput(&env, p, size, n_sub).await;
                let (cpu1, rss) = usage(pid);
                if p == Path::Proxy {
                    cpu_per_m.push((cpu1 - cpu0) / n_sub as f64 * 1e6);
                    peak_rss = peak_rss.max(rss);
                }
                if p == Path::Relay {
                    relay_cpu_per_m.push((cpu1 - cpu0) / n_sub as f64 * 1e6);
                }
                this.insert(p, r);
                rates
                    .entry(match p {
                        Path::Direct => "direct",
                        Path::Relay => "relay",
                        Path::Proxy => "natsproxy",
                    })
                    .or_default()
                    .push(r);
            }
            r_proxy_relay.push(this[&Path::Proxy] / this[&Path::Relay]);
            r_proxy_direct.push(this[&Path::Proxy] / this[&Path::Direct]);
            r_relay_direct.push(this[&Path::Relay] / this[&Path::Direct]);
        }
        println!("\n### Subscriber throughput, {size} B payload ({n_sub} messages per run; medians of {rounds} rounds)\n");
        println!("| path | msg/s (median) |\n|---|---|");
        for k in ["direct", "relay", "natsproxy"] {
            println!("| {k} | {:.0} |", median(rates[k].clone()));
        }
        println!("\n| ratio (median of per-round ratios) | value |\n|---|---|");
        println!("| natsproxy / relay | {:.3} |", median(r_proxy_relay));
        println!("| natsproxy / direct | {:.3} |", median(r_proxy_direct));
        println!("| relay / direct | {:.3} |", median(r_relay_direct));
        println!(
            "| natsproxy CPU s per million messages | {:.3} |",
            median(cpu_per_m)
        );
        println!(
            "| relay CPU s per million messages | {:.3} |",
            median(relay_cpu_per_m)
        );
        println!(
            "| natsproxy RSS at peak | {:.1} MiB |",
            peak_rss as f64 / 1024.0
        );
    }

    // Publisher throughput, and what the publish path costs each process in CPU.
    for &size in sizes.iter().filter(|_| opts.runs("pub")) {
        let mut pr = Vec::new();
        let mut pd = std::collections::HashMap::<&str, Vec<f64>>::new();
        let (mut cpu_per_m, mut relay_cpu_per_m, mut cpu_ratio) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut peak_rss = 0;
        for round in 0..rounds {
            let mut this = std::collections::HashMap::new();
            let mut cpu = std::collections::HashMap::new();
            let order = round_order(&paths, round);
            for p in order {
                let pid = match p {
                    Path::Relay => env.relay_pid,
                    _ => env.proxy_pid,
                };
                let (cpu0, _) = usage(pid);
                let r = pub_throughput(&env, p, size, n_sub).await;
                let (cpu1, _) = usage(pid);
                let per_m = (cpu1 - cpu0) / n_sub as f64 * 1e6;
                cpu.insert(p, per_m);
                if p == Path::Proxy {
                    cpu_per_m.push(per_m);
                    // Once the burst has drained and the publisher's session closed.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    peak_rss = peak_rss.max(usage(pid).1);
                }
                if p == Path::Relay {
                    relay_cpu_per_m.push(per_m);
                }
                this.insert(p, r);
                pd.entry(match p {
                    Path::Direct => "direct",
                    Path::Relay => "relay",
                    Path::Proxy => "natsproxy",
                })
                .or_default()
                .push(r);
            }
            pr.push(this[&Path::Proxy] / this[&Path::Relay]);
            if cpu[&Path::Relay] > 0.0 {
                cpu_ratio.push(cpu[&Path::Proxy] / cpu[&Path::Relay]);
            }
        }
        println!("\n### Publisher throughput through the path, {size} B ({n_sub} messages per run; medians of {rounds} rounds)\n\n| path | msg/s (median) |\n|---|---|");
        for k in ["direct", "relay", "natsproxy"] {
            println!("| {k} | {:.0} |", median(pd[k].clone()));
        }
        println!("| natsproxy / relay (median ratio) | {:.3} |", median(pr));
        println!(
            "| natsproxy CPU s per million messages | {:.3} |",
            median(cpu_per_m)
        );
        println!(
            "| relay CPU s per million messages | {:.3} |",
            median(relay_cpu_per_m)
        );
        if !cpu_ratio.is_empty() {
            println!(
                "| natsproxy / relay CPU (median ratio) | {:.2} |",
                median(cpu_ratio)
            );
        }
        println!(
            "| natsproxy RSS after a run (largest) | {:.1} MiB |",
            peak_rss as f64 / 1024.0
        );
    }
    // Request/reply latency.
    if opts.runs("rr") {
        println!("\n### Request/reply round trip at {rate}/s ({secs} s per run; medians of {rounds} rounds)\n");
        println!("| path | p50 µs | p99 µs | p99.9 µs |\n|---|---|---|---|");
        let mut lat: std::collections::HashMap<Path, Percentiles> = Default::default();
        for round in 0..rounds {
            let order = round_order(&paths, round);
            for p in order {
                let l = req_reply(&env, p, rate, secs).await;
                let e = lat.entry(p).or_default();
                e.0.push(pct(&l, 0.5).as_secs_f64() * 1e6);
                e.1.push(pct(&l, 0.99).as_secs_f64() * 1e6);
                e.2.push(pct(&l, 0.999).as_secs_f64() * 1e6);
            }
        }
        for p in paths {
            let e = &lat[&p];
            println!(
                "| {p:?} | {:.0} | {:.0} | {:.0} |",
                median(e.0.clone()),
                median(e.1.clone()),
                median(e.2.clone())
            );
        }
    }
    // JetStream pull consumption with acks.
    if opts.runs("js") {
        println!("\n### JetStream pull consumption with acks (Vector's loop), {n_js} messages\n\n| path | msg/s (median) |\n|---|---|");
        let mut js: std::collections::HashMap<Path, Vec<f64>> = Default::default();
        for round in 0..rounds.min(3) {
            let order = round_order(&paths, round);
            for p in order {
                js.entry(p).or_default().push(js_pull(&env, p, n_js).await);
            }
        }
        for p in paths {
            println!("| {p:?} | {:.0} |", median(js[&p].clone()));
        }
    }
    if !quick && opts.only.is_none() {
        migration_table().await;
    }

    println!("\n### natsproxy resources\n\n| what | value |\n|---|---|");
    println!("| RSS idle, 1 client | {:.1} MiB |", idle1 as f64 / 1024.0);
    println!(
        "| RSS idle, 100 clients | {:.1} MiB ({:.0} KiB per additional client) |",
        idle100 as f64 / 1024.0,
        (idle100 as f64 - idle1 as f64) / 99.0
    );
    let (_, relay_rss) = usage(env.relay_pid);
    println!(
        "| plain relay RSS now | {:.1} MiB |",
        relay_rss as f64 / 1024.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
