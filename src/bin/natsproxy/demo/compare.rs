//! `natsproxy demo --compare`: the failure natsproxy exists for, and its absence, side by
//! side. An R1 stream lives on n1 with two durable pull consumers, each read by Vector's
//! JetStream source loop (async-nats 0.42, stop at the first error item): `direct` is
//! connected straight to the cluster (to n1, as a client of that node), `proxied` goes
//! through natsproxy. n1 goes lame duck and stays away until the direct consumer has
//! failed (or 40 s), then comes back. The direct one ends at its first error item (on
//! nats-server 2.9 it gets none but stalls: nothing arrives after the node is back); the
//! proxied one carries on and resumes by itself.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::stream;

use super::stage::{
    create_stream, durable, read, spawn_consumer, spawn_publisher, DemoError, Shared, Stage,
};

/// How long n1 stays away at most (the direct consumer fails within ~20 s on 2.15).
const AWAY_MAX: Duration = Duration::from_secs(40);
/// How long after n1 is back the consumers have to catch up.
const CATCH_UP: Duration = Duration::from_secs(20);

/// One consumer's state, as the summary says it.
struct Column {
    consumed: u64,
    distinct: u64,
    max_gap: Duration,
    err: Option<String>,
    /// Messages consumed after n1 was healthy again.
    after_return: u64,
}

pub async fn run(rate: u64) -> Result<bool, DemoError> {
    let started = Instant::now();
    let mut stage = Stage::set_up().await?;
    // The R1 stream on n1 and its two consumers, created straight on the cluster.
    let admin = stage.jetstream(Some(1)).await?;
    let config = stream::Config {
        name: "LOGS".into(),
        subjects: vec!["logs.>".into()],
        num_replicas: 1,
        placement: Some(stream::Placement {
            cluster: None,
            tags: vec!["node:n1".into()],
        }),
        ..Default::default()
    };
    create_stream(
        &admin,
        config,
        &[durable("direct", 1), durable("proxied", 1)],
    )
    .await?;

    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(
        stage.jetstream(None).await?,
        rate,
        published.clone(),
        stop.clone(),
    );
    let (direct, proxied) = (Shared::default(), Shared::default());
    let direct_task = spawn_consumer(stage.cluster.nodes[0].url(), "direct", direct.clone());
    let proxied_task = spawn_consumer(stage.proxy.url(), "proxied", proxied.clone());
    let status = Status {
        started,
        published: published.clone(),
        direct: direct.clone(),
        proxied: proxied.clone(),
    };

    status.hold("consuming", Duration::from_secs(3)).await;
    let away = Instant::now();
    outage(&mut stage, &status).await?;
    let back = Instant::now();
    let at_return = (consumed(&direct), consumed(&proxied));
    status.hold("n1 back", Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = publisher.await;
    let total = published.load(Ordering::Relaxed);
    while back.elapsed() < CATCH_UP && !stage.interrupted() {
        if distinct(&proxied) >= total && (failed(&direct) || distinct(&direct) >= total) {
            break;
        }
        status.show("catching up");
        tokio::time::sleep(REDRAW).await;
    }
    status.show("done");
    eprintln!();
    direct_task.abort();
    proxied_task.abort();
    let interrupted = stage.interrupted();
    let Stage { cluster, proxy, .. } = stage;
    let proxy_stats = (proxy.stats.migrations.get(), proxy.stats.failovers.get());
    proxy.stop().await;
    drop(cluster);

    // A consumer that ended or stalled has been without messages since its last one.
    let end = Instant::now();
    let d = column(&direct, at_return.0, end);
    let n = column(&proxied, at_return.1, end);
    println!();
    println!(
        "  R1 stream on n1; n1 goes lame duck, stays away {:.1?}, comes back",
        back - away
    );
    let ok = summary(&d, &n, total, proxy_stats, started) && !interrupted;
    println!("  result: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

/// How often the status line is redrawn.
const REDRAW: Duration = Duration::from_millis(200);

/// n1, the stream's only node, goes lame duck and stays away until it has exited and the
/// direct consumer has failed (or [`AWAY_MAX`], or Ctrl-C); then it is restarted.
async fn outage(stage: &mut Stage, status: &Status) -> Result<(), DemoError> {
    stage.cluster.lame_duck(0)?;
    let away = Instant::now();
    while !stage.interrupted() {
        let exited = stage.cluster.exited(0)?;
        if exited && (failed(&status.direct) || away.elapsed() > AWAY_MAX) {
            break;
        }
        status.show(if exited { "n1 away" } else { "n1: lame duck" });
        tokio::time::sleep(REDRAW).await;
    }
    if !stage.cluster.exited(0)? {
        // Interrupted while n1 drains: let it finish, the cluster's drop stops it.
        return Ok(());
    }
    status.show("n1 restarting");
    stage.cluster.restart(0).await?;
    Ok(())
}

fn consumed(p: &Shared) -> u64 {
    read(p, 0, |p| p.consumed)
}
fn distinct(p: &Shared) -> u64 {
    read(p, 0, |p| p.distinct.len() as u64)
}
fn failed(p: &Shared) -> bool {
    read(p, true, |p| p.err.is_some())
}

fn column(p: &Shared, before: u64, end: Instant) -> Column {
    read(
        p,
        Column {
            consumed: 0,
            distinct: 0,
            max_gap: Duration::ZERO,
            err: Some("its task panicked".into()),
            after_return: 0,
        },
        |p| Column {
            consumed: p.consumed,
            distinct: p.distinct.len() as u64,
            max_gap: p.max_gap.max(p.last.map_or(Duration::ZERO, |l| end - l)),
            err: p.err.clone(),
            after_return: p.consumed.saturating_sub(before),
        },
    )
}

/// The side-by-side live status line on stderr.
struct Status {
    started: Instant,
    published: Arc<AtomicU64>,
    direct: Shared,
    proxied: Shared,
}

impl Status {
    fn show(&self, phase: &str) {
        let cell = |p: &Shared| {
            let state = if failed(p) {
                "ENDED (error item)"
            } else {
                "running"
            };
            format!("{:>6} {state}", consumed(p))
        };
        eprint!(
            "\r\x1b[K[{:>5.1}s] {phase:<22} published {:>6} │ direct {:<26} │ through natsproxy {}",
            self.started.elapsed().as_secs_f64(),
            self.published.load(Ordering::Relaxed),
            cell(&self.direct),
            cell(&self.proxied),
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
}

/// Prints the side-by-side table and the verdicts; true when the direct consumer failed
/// (an error item, or nothing after n1 was back) and the proxied one has every message.
fn summary(d: &Column, n: &Column, total: u64, proxy: (u64, u64), started: Instant) -> bool {
    let row = |label: &str, direct: String, proxied: String| {
        println!("  {label:<40} {direct:>12} {proxied:>14}");
    };
    println!("  ──────────────────────────────────────────────────────────────────────");
    row("", "direct".into(), "natsproxy".into());
    row("messages published", total.to_string(), total.to_string());
    row(
        "messages consumed (acked)",
        d.consumed.to_string(),
        n.consumed.to_string(),
    );
    row(
        "messages missing",
        total.saturating_sub(d.distinct).to_string(),
        total.saturating_sub(n.distinct).to_string(),
    );
    row(
        "consumed after n1 was back",
        d.after_return.to_string(),
        n.after_return.to_string(),
    );
    row(
        "error items (each stops Vector's source)",
        usize::from(d.err.is_some()).to_string(),
        usize::from(n.err.is_some()).to_string(),
    );
    row(
        "largest gap (to the end for a stopped one)",
        format!("{:.1?}", d.max_gap),
        format!("{:.1?}", n.max_gap),
    );
    row(
        "migrations / failovers by the proxy",
        "-".into(),
        format!("{} / {}", proxy.0, proxy.1),
    );
    println!("  {:<40} {:>12.1?}", "total time", started.elapsed());
    if let Some(e) = &d.err {
        println!("  direct consumer's first error item: {e}");
    }
    let direct_failed = d.err.is_some() || d.after_return == 0;
    let proxied_ok = n.err.is_none() && n.distinct >= total;
    println!(
        "  direct:    {}",
        if d.err.is_some() {
            "FAILED, ended at its first error item (Vector's source stops here)"
        } else if d.after_return == 0 {
            "FAILED, stalled: nothing after n1 came back"
        } else {
            "survived (this run did not show the failure)"
        }
    );
    println!(
        "  natsproxy: {}",
        if proxied_ok {
            "carried on, and resumed by itself when n1 was back"
        } else {
            "FAILED"
        }
    );
    direct_failed && proxied_ok
}
