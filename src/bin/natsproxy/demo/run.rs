//! The demo's script: cluster up, proxy, publisher, Vector's loop through the proxy, a
//! rolling lame-duck restart with live progress, and the summary.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::stream;
use natsproxy::proxy::Stats;
use natsproxy_kit::cluster::{connz_has, Cluster};

use super::stage::{
    create_stream, durable, read, spawn_consumer, spawn_publisher, DemoError, Shared, Stage,
};

/// How long a lame-duck node may take to exit (nats-server's own limit is
/// `lame_duck_duration`, 30 s).
const EXIT_MAX: Duration = Duration::from_secs(40);
/// How long the consumer has, after the publisher stopped, to have every message.
const CATCH_UP: Duration = Duration::from_secs(20);
/// How often the status line is redrawn.
const REDRAW: Duration = Duration::from_millis(200);

pub async fn run(rate: u64) -> Result<bool, DemoError> {
    let started = Instant::now();
    let mut stage = Stage::set_up().await?;
    // The stream (R3) and its durable pull consumer, created straight on the cluster.
    let admin = stage.jetstream(Some(1)).await?;
    let config = stream::Config {
        name: "LOGS".into(),
        subjects: vec!["logs.>".into()],
        num_replicas: 3,
        ..Default::default()
    };
    create_stream(&admin, config, &[durable("vector", 3)]).await?;

    // Publisher on the 4th node; consumer through the proxy, as Vector does it.
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(
        stage.jetstream(None).await?,
        rate,
        published.clone(),
        stop.clone(),
    );
    let progress = Shared::default();
    let consumer = spawn_consumer(stage.proxy.url(), "vector", progress.clone());
    let upstream = Arc::new(Mutex::new(String::from("?")));
    let watcher = watch_upstream(&stage.cluster, upstream.clone());
    let status = Status {
        started,
        published: published.clone(),
        progress: progress.clone(),
        upstream,
        stats: stage.proxy.stats.clone(),
    };

    status.hold("consuming", Duration::from_secs(3)).await;
    let steps = roll(&mut stage, &status).await?;
    stop.store(true, Ordering::Relaxed);
    let _ = publisher.await;
    let total = published.load(Ordering::Relaxed);
    catch_up(&progress, total, &status).await;
    status.show("done");
    eprintln!();
    consumer.abort();
    watcher.abort();
    let stats = stage.proxy.stats.clone();
    let interrupted = stage.interrupted();
    let Stage { cluster, proxy, .. } = stage;
    proxy.stop().await;
    drop(cluster);
    let ok = summary(&steps, total, &progress, &stats, started) && !interrupted;
    println!(
        "  result: {}",
        if ok {
            "PASS — the consumer never noticed"
        } else {
            "FAIL"
        }
    );
    Ok(ok)
}

/// Lame duck, exit, restart and healthy again for each JetStream node in turn; how long
/// each took. Stops early on Ctrl-C.
async fn roll(stage: &mut Stage, status: &Status) -> Result<Vec<(String, Duration)>, DemoError> {
    let mut steps = Vec::new();
    for i in 0..stage.cluster.nodes.len() {
        if stage.interrupted() {
            break;
        }
        let name = stage.cluster.nodes[i].name.clone();
        let t = Instant::now();
        stage.cluster.lame_duck(i)?;
        status.show(&format!("{name}: lame duck"));
        let draining = format!("{name}: lame duck, draining");
        status
            .while_waiting(&draining, stage.cluster.wait_exit(i, EXIT_MAX))
            .await?;
        status.show(&format!("{name}: restarting"));
        stage.cluster.restart(i).await?;
        steps.push((name, t.elapsed()));
        status.hold("consuming", Duration::from_secs(2)).await;
    }
    Ok(steps)
}

/// Waits until the consumer has all `total` messages, has failed, or [`CATCH_UP`] is over.
async fn catch_up(progress: &Shared, total: u64, status: &Status) {
    let deadline = Instant::now() + CATCH_UP;
    while Instant::now() < deadline {
        let (done, failed) = read(progress, (true, true), |p| {
            (p.distinct.len() as u64 >= total, p.err.is_some())
        });
        if done || failed {
            break;
        }
        status.show("catching up");
        tokio::time::sleep(REDRAW).await;
    }
}

/// Keeps `current` naming the node that holds the consumer's upstream link (from the
/// servers' `/connz`), every 300 ms.
fn watch_upstream(cluster: &Cluster, current: Arc<Mutex<String>>) -> tokio::task::JoinHandle<()> {
    let nodes: Vec<(String, u16)> = cluster
        .nodes
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
}

/// The live status line on stderr.
struct Status {
    started: Instant,
    published: Arc<AtomicU64>,
    progress: Shared,
    upstream: Arc<Mutex<String>>,
    stats: Arc<Stats>,
}

impl Status {
    fn show(&self, phase: &str) {
        let node = self.upstream.lock().map(|c| c.clone()).unwrap_or_default();
        let (consumed, gap, err) = read(&self.progress, Default::default(), |p| {
            (p.consumed, p.max_gap, p.err.clone())
        });
        eprint!(
            "\r\x1b[K[{:>5.1}s] {phase:<26} upstream {node:<3} published {:>6}  consumed {:>6}  migrations {}  largest gap {:>7.0?}{}",
            self.started.elapsed().as_secs_f64(),
            self.published.load(Ordering::Relaxed),
            consumed,
            self.stats.migrations.get(),
            gap,
            err.map(|e| format!("  ERR {e}")).unwrap_or_default()
        );
        let _ = std::io::stderr().flush();
    }

    /// Shows `phase` for `d`.
    async fn hold(&self, phase: &str, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.show(phase);
            tokio::time::sleep(REDRAW).await;
        }
    }

    /// Shows `phase` until `fut` is done.
    async fn while_waiting<T>(&self, phase: &str, fut: impl std::future::Future<Output = T>) -> T {
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                v = &mut fut => return v,
                _ = tokio::time::sleep(REDRAW) => self.show(phase),
            }
        }
    }
}

/// Prints the summary; true when nothing was lost and no error item came.
fn summary(
    steps: &[(String, Duration)],
    total: u64,
    progress: &Shared,
    stats: &Stats,
    started: Instant,
) -> bool {
    let (consumed, distinct, max_gap, err) = read(progress, (0, 0, Duration::ZERO, None), |p| {
        (
            p.consumed,
            p.distinct.len() as u64,
            p.max_gap,
            p.err.clone(),
        )
    });
    let lost = total.saturating_sub(distinct);
    let row = |label: &str, value: String| println!("  {label:<46}{value:>8}");
    println!();
    println!("  rolling lame-duck restart through the proxy");
    println!("  ────────────────────────────────────────────────────────");
    for (name, took) in steps {
        println!("  {name}: lame duck → exit → restart → healthy   {took:>8.1?}");
    }
    row("messages published", total.to_string());
    row(
        "messages consumed (Vector-style, acked)",
        consumed.to_string(),
    );
    row("messages lost", lost.to_string());
    row(
        "client connections accepted by the proxy",
        stats.clients_accepted.get().to_string(),
    );
    row(
        "migrations (make-before-break)",
        stats.migrations.get().to_string(),
    );
    row("failovers", stats.failovers.get().to_string());
    let switch = Duration::from_micros(stats.max_switch_us.load(Ordering::Relaxed));
    row("longest lame-duck-INFO-to-switch", format!("{switch:.1?}"));
    row("largest gap seen by the consumer", format!("{max_gap:.1?}"));
    row(
        "error items (each would stop Vector's source)",
        usize::from(err.is_some()).to_string(),
    );
    row("total time", format!("{:.1?}", started.elapsed()));
    if let Some(e) = &err {
        println!("  first error item: {e}");
    }
    err.is_none() && lost == 0
}
