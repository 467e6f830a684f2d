//! Bounds under a client that stops reading: it is closed as a slow consumer once its
//! pending bytes pass `--max-client-pending` (as nats-server does), counted, and the
//! proxy's buffer never grows past the bound plus one read; a healthy client of the same
//! proxy gets every message meanwhile, at a comparable pace.

mod common;
use common::*;

use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const N: u64 = 20_000;
const SIZE: usize = 1024;
const BOUND: usize = 4 * 1024 * 1024;

/// Messages the publisher may be ahead of the healthy subscriber: 1 MiB in flight, well
/// under the bound, so only a client that stops reading can reach it. (Unpaced, a burst
/// of 20 MB outran the healthy client itself in 1 of 8 runs, and it was cut off too.)
const WINDOW: u64 = 1_000;

/// Publishes N numbered 1 KiB messages on `load`, at most WINDOW ahead of the healthy
/// subscriber, and returns how long that subscriber took to get all of them.
async fn run_load(publisher: &async_nats::Client, sub: &mut async_nats::Subscriber) -> Duration {
    let started = Instant::now();
    let payload = vec![b'x'; SIZE - 8];
    let p = publisher.clone();
    let (got_tx, mut got_rx) = tokio::sync::watch::channel(0u64);
    let tx = tokio::spawn(async move {
        for i in 0..N {
            if i >= *got_rx.borrow() + WINDOW {
                p.flush().await.unwrap();
                got_rx
                    .wait_for(|&got| i < got + WINDOW)
                    .await
                    .expect("subscriber alive");
            }
            let mut m = format!("{i:08}").into_bytes();
            m.extend_from_slice(&payload);
            p.publish("load", m.into()).await.unwrap();
        }
        p.flush().await.unwrap();
    });
    let mut next = 0u64;
    within(
        Duration::from_secs(60),
        "the healthy client to get every message",
        async {
            while next < N {
                let m = sub.next().await.unwrap();
                let n: u64 = std::str::from_utf8(&m.payload[..8])
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(n, next, "in order, none lost");
                next += 1;
                if next % 100 == 0 {
                    got_tx.send_replace(next);
                }
            }
        },
    )
    .await;
    tx.await.unwrap();
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_is_cut_off_and_the_healthy_one_keeps_its_pace() {
    init_logs();
    let server = NatsServer::start(ServerOpts::default()).await;
    let proxy = TestProxy::start_with(&[server.url()], |c| c.max_client_pending = BOUND).await;
    let healthy = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 16)
        .connect(proxy.url())
        .await
        .unwrap();
    let mut sub = healthy.subscribe("load").await.unwrap();
    healthy.flush().await.unwrap();
    let publisher = async_nats::connect(server.url()).await.unwrap();
    let alone = run_load(&publisher, &mut sub).await;

    // A client that subscribes and then never reads again.
    let mut stalled = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stalled
        .write_all(b"CONNECT {\"verbose\":false}\r\nSUB load 1\r\nPING\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    within(
        Duration::from_secs(10),
        "the stalled client's PONG",
        async {
            let mut b = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains("PONG") {
                let n = stalled.read(&mut b).await.unwrap();
                seen.extend_from_slice(&b[..n]);
            }
        },
    )
    .await;
    let with_stalled = run_load(&publisher, &mut sub).await;
    within(
        Duration::from_secs(10),
        "the slow consumer to be cut off",
        async {
            while proxy.stats.slow_consumers.get() == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    let peak = proxy
        .stats
        .max_slow_consumer_pending
        .load(Ordering::Relaxed);
    println!(
        "healthy client, {N} x {SIZE} B: alone {alone:?}, next to a stalled client {with_stalled:?}; \
         stalled client closed at {peak} bytes pending (bound {BOUND})"
    );
    assert!(peak as usize > BOUND, "closed only past the bound");
    assert!(
        peak as usize <= BOUND + 256 * 1024,
        "buffer grew to {peak} bytes past the bound {BOUND} plus one read"
    );
    assert!(
        with_stalled < alone * 3 + Duration::from_secs(1),
        "the healthy client slowed down: {alone:?} alone, {with_stalled:?} next to a stalled one"
    );
    assert_eq!(
        proxy.stats.clients_active.get(),
        1,
        "the stalled client is gone"
    );
    // The healthy client is still served.
    healthy
        .publish("load", "00000000 after".into())
        .await
        .unwrap();
    let m = within(Duration::from_secs(5), "a message after", sub.next())
        .await
        .unwrap();
    assert!(m.payload.ends_with(b"after"));
}
