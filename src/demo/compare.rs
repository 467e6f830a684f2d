//! `natsproxy demo --compare`: the failure natsproxy exists for, and its absence, side by
//! side. An R1 stream lives on n1 with two durable pull consumers, each read by Vector's
//! JetStream source loop (async-nats 0.42, stop at the first error item): `direct` is
//! connected straight to the cluster (to n1, as a client of that node), `proxied` goes
//! through natsproxy. n1 goes lame duck and stays away until the direct consumer has
//! failed (or 40 s), then comes back. The direct one ends at its first error item (on
//! nats-server 2.9 it gets none but stalls: nothing arrives after the node is back); the
//! proxied one carries on and resumes by itself.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};

use super::cluster::*;
use super::run::{set_up, spawn_consumer, spawn_publisher, Progress};

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

pub async fn run(bin: PathBuf, rate: u64) -> Res<bool> {
    let started = Instant::now();
    let (mut cluster, interrupted, proxy) = set_up(bin).await?;
    let (proxy_addr, stats) = (proxy.addr, proxy.stats.clone());

    // The R1 stream on n1 and its two consumers, created straight on the cluster.
    let admin = jetstream::new(
        async_nats::connect(cluster.url(1))
            .await
            .map_err(|e| e.to_string())?,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    'setup: loop {
        let r = admin
            .create_stream(stream::Config {
                name: "LOGS".into(),
                subjects: vec!["logs.>".into()],
                num_replicas: 1,
                placement: Some(stream::Placement {
                    cluster: None,
                    tags: vec!["node:n1".into()],
                }),
                ..Default::default()
            })
            .await;
        if let Ok(s) = r {
            let mut ok = true;
            for durable in ["direct", "proxied"] {
                ok &= s
                    .create_consumer(pull::Config {
                        durable_name: Some(durable.into()),
                        ack_wait: Duration::from_secs(5),
                        ..Default::default()
                    })
                    .await
                    .is_ok();
            }
            if ok {
                break 'setup;
            }
        }
        if Instant::now() > deadline {
            return Err("JetStream did not come up".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pub_js = jetstream::new(
        async_nats::connect(cluster.url(3))
            .await
            .map_err(|e| e.to_string())?,
    );
    let publisher = spawn_publisher(pub_js, rate, published.clone(), stop.clone());
    let direct = Arc::new(Mutex::new(Progress::default()));
    let proxied = Arc::new(Mutex::new(Progress::default()));
    let direct_task = spawn_consumer(cluster.url(0), "direct", direct.clone());
    let proxied_task = spawn_consumer(format!("nats://{proxy_addr}"), "proxied", proxied.clone());

    let read = |p: &Arc<Mutex<Progress>>| {
        p.lock()
            .map(|p| (p.consumed, p.distinct.len() as u64, p.err.is_some()))
            .unwrap_or_default()
    };
    let cell = |p: &Arc<Mutex<Progress>>| {
        let (consumed, _, failed) = read(p);
        format!(
            "{consumed:>6} {}",
            if failed {
                "ENDED (error item)"
            } else {
                "running"
            }
        )
    };
    let status = |phase: &str| {
        eprint!(
            "\r\x1b[K[{:>5.1}s] {phase:<22} published {:>6} │ direct {:<26} │ through natsproxy {}",
            started.elapsed().as_secs_f64(),
            published.load(Ordering::Relaxed),
            cell(&direct),
            cell(&proxied),
        );
        let _ = std::io::stderr().flush();
    };
    let tick = || tokio::time::sleep(Duration::from_millis(200));

    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        status("consuming");
        tick().await;
    }
    // n1, the stream's only node, leaves and stays away.
    cluster.lame_duck(0)?;
    let away = Instant::now();
    let mut exited = false;
    while !interrupted.load(Ordering::Relaxed) {
        if !exited {
            if let Some(c) = cluster.nodes[0].child.as_mut() {
                if c.try_wait().map_err(|e| e.to_string())?.is_some() {
                    cluster.nodes[0].child = None;
                    exited = true;
                }
            }
        }
        let direct_failed = read(&direct).2;
        if exited && (direct_failed || away.elapsed() > AWAY_MAX) {
            break;
        }
        status(if exited { "n1 away" } else { "n1: lame duck" });
        tick().await;
    }
    cluster.spawn(0)?;
    status("n1 restarting");
    cluster.wait_healthy(0).await?;
    let back = Instant::now();
    let at_return = (read(&direct).0, read(&proxied).0);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        status("n1 back");
        tick().await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = publisher.await;
    let total = published.load(Ordering::Relaxed);
    while back.elapsed() < CATCH_UP && !interrupted.load(Ordering::Relaxed) {
        if read(&proxied).1 >= total && (read(&direct).2 || read(&direct).1 >= total) {
            break;
        }
        status("catching up");
        tick().await;
    }
    status("done");
    eprintln!();
    direct_task.abort();
    proxied_task.abort();
    proxy.stop().await;

    // A consumer that ended or stalled has been without messages since its last one.
    let end = Instant::now();
    let column = |p: &Arc<Mutex<Progress>>, before: u64| -> Res<Column> {
        let p = p.lock().map_err(|_| "lock")?;
        let since_last = p.last.map_or(Duration::ZERO, |l| end - l);
        Ok(Column {
            consumed: p.consumed,
            distinct: p.distinct.len() as u64,
            max_gap: p.max_gap.max(since_last),
            err: p.err.clone(),
            after_return: p.consumed.saturating_sub(before),
        })
    };
    let d = column(&direct, at_return.0)?;
    let n = column(&proxied, at_return.1)?;
    println!();
    println!(
        "  R1 stream on n1; n1 goes lame duck, stays away {:.1?}, comes back",
        back - away
    );
    println!("  ──────────────────────────────────────────────────────────────────────");
    println!("  {:<40} {:>12} {:>14}", "", "direct", "natsproxy");
    println!("  {:<40} {:>12} {:>14}", "messages published", total, total);
    println!(
        "  {:<40} {:>12} {:>14}",
        "messages consumed (acked)", d.consumed, n.consumed
    );
    println!(
        "  {:<40} {:>12} {:>14}",
        "messages missing",
        total.saturating_sub(d.distinct),
        total.saturating_sub(n.distinct)
    );
    println!(
        "  {:<40} {:>12} {:>14}",
        "consumed after n1 was back", d.after_return, n.after_return
    );
    println!(
        "  {:<40} {:>12} {:>14}",
        "error items (each stops Vector's source)",
        usize::from(d.err.is_some()),
        usize::from(n.err.is_some())
    );
    println!(
        "  {:<40} {:>12.1?} {:>14.1?}",
        "largest gap (to the end for a stopped one)", d.max_gap, n.max_gap
    );
    println!(
        "  {:<40} {:>12} {:>14}",
        "migrations / failovers by the proxy",
        "-",
        format!("{} / {}", stats.migrations.get(), stats.failovers.get())
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
    let ok = direct_failed && proxied_ok && !interrupted.load(Ordering::Relaxed);
    println!("  result: {}", if ok { "PASS" } else { "FAIL" });
    drop(cluster);
    Ok(ok)
}
