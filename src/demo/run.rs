//! The demo's script: cluster up, proxy, publisher, Vector's loop through the proxy, a
//! rolling lame-duck restart with live progress, and the summary.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, UpstreamUrl};
use crate::proxy::Proxy;

use super::cluster::*;

/// What one Vector-style consumer got so far.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) consumed: u64,
    pub(super) distinct: std::collections::BTreeSet<u64>,
    pub(super) last: Option<Instant>,
    pub(super) max_gap: Duration,
    /// Why it ended (Vector's source stops there).
    pub(super) err: Option<String>,
}

pub async fn run(bin: PathBuf, rate: u64) -> Res<bool> {
    let started = Instant::now();
    let (mut cluster, interrupted, proxy) = set_up(bin).await?;
    let (proxy_addr, stats) = (proxy.addr, proxy.stats.clone());

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
    let publisher = spawn_publisher(pub_js, rate, published.clone(), stop.clone());
    let progress = Arc::new(Mutex::new(Progress::default()));
    let consumer = spawn_consumer(format!("nats://{proxy_addr}"), "vector", progress.clone());
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
    proxy.stop().await;

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

/// Publishes numbered messages to `logs.demo` at `rate` a second until `stop`;
/// `published` counts those the stream stored.
pub(super) fn spawn_publisher(
    js: jetstream::Context,
    rate: u64,
    published: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let n = published.load(Ordering::Relaxed);
            let p = jetstream::context::Publish::build()
                .payload(n.to_string().into())
                .message_id(n.to_string());
            let stored =
                match tokio::time::timeout(Duration::from_secs(2), js.send_publish("logs.demo", p))
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
}

/// Vector's JetStream source on the durable consumer `durable` of `LOGS`, connected to
/// `url`: progress into `progress`, and its end (the first error item) as `err`.
pub(super) fn spawn_consumer(
    url: String,
    durable: &'static str,
    progress: Arc<Mutex<Progress>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let run = async {
            let c = async_nats::ConnectOptions::new()
                .name(durable)
                .connect(url)
                .await
                .map_err(|e| e.to_string())?;
            let js = jetstream::new(c);
            let mut msgs = crate::vector::open(&js, "LOGS", durable).await?;
            let end = crate::vector::run(&mut msgs, |m| {
                if let Ok(mut p) = progress.lock() {
                    let now = Instant::now();
                    if let Some(l) = p.last {
                        p.max_gap = p.max_gap.max(now - l);
                    }
                    p.last = Some(now);
                    p.consumed += 1;
                    if let Ok(n) = std::str::from_utf8(&m.payload).unwrap_or("").parse::<u64>() {
                        p.distinct.insert(n);
                    }
                }
                std::ops::ControlFlow::Continue(())
            })
            .await;
            Err::<(), String>(match end {
                crate::vector::End::ErrItem(e) => format!("error item: {e}"),
                _ => "the message stream ended".into(),
            })
        };
        if let Err(e) = run.await {
            if let Ok(mut p) = progress.lock() {
                p.err = Some(e);
            }
        }
    })
}

/// The proxy of a demo, in this process.
pub(super) struct DemoProxy {
    pub(super) addr: std::net::SocketAddr,
    pub(super) stats: Arc<crate::proxy::Stats>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl DemoProxy {
    pub(super) async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }
}

/// What both demos start with: the cluster (healthy), a flag Ctrl-C sets, and the proxy
/// in front of the three JetStream nodes.
pub(super) async fn set_up(bin: PathBuf) -> Res<(Cluster, Arc<AtomicBool>, DemoProxy)> {
    let cluster = Cluster::start(bin)?;
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
    let ups = (0..3)
        .map(|i| UpstreamUrl::parse(&cluster.url(i)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut cfg = Config::new("127.0.0.1:0".parse().map_err(|_| "addr")?, ups);
    cfg.metrics_listen = Some("127.0.0.1:0".parse().map_err(|_| "addr")?);
    let proxy = Proxy::bind(cfg).await.map_err(|e| e.to_string())?;
    let addr = proxy.local_addr().map_err(|e| e.to_string())?;
    let stats = proxy.stats();
    let token = CancellationToken::new();
    let task = tokio::spawn(proxy.run(token.clone()));
    let proxy = DemoProxy {
        addr,
        stats,
        token,
        task,
    };
    Ok((cluster, interrupted, proxy))
}
