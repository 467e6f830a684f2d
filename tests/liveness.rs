//! `/livez/client`: the proxy tells when its client stopped consuming, so that a
//! liveness probe restarts a pipeline that would otherwise stay stopped in silence. Real
//! nats-server with JetStream; the consumer is Vector's loop on async-nats 0.42 (the
//! kit's), named as Vector names its connection.

mod common;
use common::*;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use natsproxy_kit::vector;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A JetStream server with stream LOGS (`logs.>`) and durable pull consumer CV.
async fn js_server() -> NatsServer {
    let server = NatsServer::start(ServerOpts {
        jetstream: true,
        ..Default::default()
    })
    .await;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.create_stream(stream::Config {
        name: "LOGS".into(),
        subjects: vec!["logs.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    create_consumer(&js).await;
    server
}

async fn create_consumer(js: &jetstream::Context) {
    js.get_stream("LOGS")
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("CV".into()),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Publishes numbered messages to `logs.v` at about 100/s until `stop`.
fn spawn_publisher(url: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let js = jetstream::new(async_nats::connect(url).await.unwrap());
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            n += 1;
            if let Ok(ack) = js.publish("logs.v", n.to_string().into()).await {
                let _ = ack.await;
            }
        }
    })
}

/// The proxy in front of `upstream`, serving `/livez/client` with this bound.
async fn proxy(upstream: &str, stall_after: Duration, max_outage: Option<Duration>) -> TestProxy {
    TestProxy::start_with(&[upstream.to_owned()], |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.client_stall_after = stall_after;
        if let Some(m) = max_outage {
            c.session.max_outage = m;
        }
    })
    .await
}

async fn vector_client(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .name("vector")
        .connect(url)
        .await
        .unwrap()
}

/// Vector's source: the kit's loop until its first `Err` item; counts what it got.
fn spawn_vector(url: String, got: Arc<AtomicU64>) -> tokio::task::JoinHandle<vector::End> {
    tokio::spawn(async move {
        let js = jetstream::new(vector_client(&url).await);
        let mut messages = vector::open(&js, "LOGS", "CV").await.unwrap();
        // When it ends, its connection closes with it, as Vector's does.
        vector::run(&mut messages, |_| {
            got.fetch_add(1, Ordering::Relaxed);
            ControlFlow::Continue(())
        })
        .await
    })
}

async fn livez(metrics: SocketAddr) -> (u16, String) {
    http_status(metrics, "/livez/client")
        .await
        .expect("/livez/client answers")
}

/// Asks `/livez/client` until it answers `want` (every 100 ms); returns when it did.
async fn until_livez(metrics: SocketAddr, want: u16, limit: Duration) -> (Instant, String) {
    within(limit, &format!("/livez/client {want}"), async {
        loop {
            let (code, body) = livez(metrics).await;
            if code == want {
                return (Instant::now(), body);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

async fn until_count(got: &AtomicU64, n: u64) {
    within(Duration::from_secs(20), &format!("{n} messages"), async {
        while got.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_consumer_stops_the_loop_and_fails_livez_client_within_the_bound() {
    init_logs();
    const BOUND: Duration = Duration::from_secs(4);
    let server = js_server().await;
    let proxy = proxy(&server.url(), BOUND, None).await;
    let metrics = proxy.metrics_addr.unwrap();
    // Start-up: no client has connected yet (Vector starting) is not a stopped one.
    let (code, body) = livez(metrics).await;
    assert_eq!(
        (code, body.as_str()),
        (200, "ok: 0 client connection(s) watched\n")
    );
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(server.url(), stop.clone());
    let got = Arc::new(AtomicU64::new(0));
    let source = spawn_vector(proxy.url(), got.clone());
    until_count(&got, 50).await;
    assert_eq!(livez(metrics).await.0, 200);

    // An operator deletes the consumer: the server's answer is true, the proxy passes
    // it on, and Vector's source ends (its connection with it).
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.get_stream("LOGS")
        .await
        .unwrap()
        .delete_consumer("CV")
        .await
        .unwrap();
    let t0 = Instant::now();
    let at = || format!("{:6.2} s", t0.elapsed().as_secs_f64());
    println!(
        "{} consumer LOGS/CV deleted after {} messages",
        at(),
        got.load(Ordering::Relaxed)
    );
    let end = within(Duration::from_secs(10), "the loop to end", source)
        .await
        .unwrap();
    let ended = Instant::now();
    assert!(matches!(end, vector::End::ErrItem(_)), "{end:?}");
    println!(
        "{} Vector's loop ended, its connection closed: {end:?}",
        at()
    );
    // The kubelet runs Vector's livenessProbe on /livez/client (here every 1 s,
    // failureThreshold 3) and restarts Vector after 3 failures in a row.
    const PERIOD: Duration = Duration::from_secs(1);
    const FAILURES: u32 = 3;
    let mut failed_at = None;
    let mut failures = 0;
    let restarted = loop {
        tokio::time::sleep(PERIOD).await;
        let (code, body) = livez(metrics).await;
        if code == 200 {
            assert!(
                failures == 0 && failed_at.is_none(),
                "200 after a failure: {body:?}"
            );
            // Not before the bound.
            assert!(
                ended.elapsed() < BOUND + PERIOD,
                "200 past the bound: {body:?}"
            );
            continue;
        }
        assert_eq!(code, 503);
        assert!(
            body.starts_with("client \"vector\": no client connected for "),
            "{body:?}"
        );
        failed_at.get_or_insert(Instant::now());
        failures += 1;
        println!("{} probe: {code} {}", at(), body.trim_end());
        if failures == FAILURES {
            break Instant::now();
        }
    };
    let failed = failed_at.unwrap();
    assert!(
        failed - ended >= BOUND - Duration::from_millis(100),
        "failed before the bound"
    );
    assert!(
        failed - ended <= BOUND + Duration::from_secs(3),
        "failed late"
    );
    let m = http_status(metrics, "/metrics").await.unwrap().1;
    assert_eq!(metric(&m, "natsproxy_client_live"), Some(0.0), "{m}");

    // The operator re-applied the consumer; the kubelet restarts Vector: 200 within 3 s.
    create_consumer(&js).await;
    println!(
        "{} kubelet: liveness probe failed {FAILURES} times, restarting vector",
        at()
    );
    let got = Arc::new(AtomicU64::new(0));
    let source = spawn_vector(proxy.url(), got.clone());
    let (back, body) = until_livez(metrics, 200, Duration::from_secs(3)).await;
    println!("{} probe: 200 {}", at(), body.lines().next().unwrap_or(""));
    assert!(back - restarted <= Duration::from_secs(3));
    println!(
        "stopped for {:.2} s (bound {BOUND:?} + {FAILURES} x {PERIOD:?} probe period)",
        (back - ended).as_secs_f64()
    );
    until_count(&got, 20).await;
    println!(
        "{} vector consuming again: {} messages",
        at(),
        got.load(Ordering::Relaxed)
    );
    let m = http_status(metrics, "/metrics").await.unwrap().1;
    assert_eq!(metric(&m, "natsproxy_client_live"), Some(1.0));
    assert_eq!(
        metric(&m, "natsproxy_client_connected{client=\"vector\"}"),
        Some(1.0),
        "{m}"
    );
    let age = metric(
        &m,
        "natsproxy_client_consumer_pull_age_seconds{client=\"vector\",consumer=\"LOGS/CV\"}",
    );
    assert!(age.is_some_and(|a| a < BOUND.as_secs_f64()), "{age:?}\n{m}");
    source.abort();
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_past_max_outage_fails_livez_client() {
    init_logs();
    const BOUND: Duration = Duration::from_secs(3);
    const MAX_OUTAGE: Duration = Duration::from_secs(2);
    let server = js_server().await;
    let proxy = proxy(&server.url(), BOUND, Some(MAX_OUTAGE)).await;
    let metrics = proxy.metrics_addr.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(server.url(), stop.clone());
    let got = Arc::new(AtomicU64::new(0));
    let source = spawn_vector(proxy.url(), got.clone());
    until_count(&got, 50).await;
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();

    // The only node goes away for good: the proxy holds the client for --max-outage,
    // then closes it with -ERR; what the client does next is its own reconnect logic,
    // which finds no proxy session that ever gets an upstream.
    drop(server);
    let lost = Instant::now();
    let sampler_until = lost + MAX_OUTAGE + BOUND - Duration::from_millis(500);
    while Instant::now() < sampler_until {
        assert_eq!(livez(metrics).await.0, 200, "failed before the bound");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (failed, body) = until_livez(metrics, 503, Duration::from_secs(4)).await;
    println!(
        "503 {:.2} s after the node went: {body:?}; the loop: {:?}",
        (failed - lost).as_secs_f64(),
        source.is_finished()
    );
    assert!(failed - lost <= MAX_OUTAGE + BOUND + Duration::from_secs(3));
    assert!(body.contains("no client connected for"), "{body:?}");
    source.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_whose_sink_blocks_is_slow_not_stopped() {
    init_logs();
    const BOUND: Duration = Duration::from_secs(3);
    let server = js_server().await;
    let proxy = proxy(&server.url(), BOUND, None).await;
    let metrics = proxy.metrics_addr.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(server.url(), stop.clone());
    let sampler = LivenessSampler::start(metrics);
    // Vector's loop with its sink's send awaited before the ack: the 50th message's
    // send blocks for 3 × the bound (the sink's buffer is full downstream).
    let (blocked_tx, blocked_rx) = tokio::sync::oneshot::channel();
    let url = proxy.url();
    let loop_task = tokio::spawn(async move {
        let js = jetstream::new(vector_client(&url).await);
        let mut messages = vector::open(&js, "LOGS", "CV").await.unwrap();
        let mut n = 0u64;
        let mut blocked_tx = Some(blocked_tx);
        while let Some(Ok(m)) = messages.next().await {
            n += 1;
            if n == 50 {
                if let Some(tx) = blocked_tx.take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(BOUND * 3).await;
            }
            let _ = m.ack().await;
            if n == 100 {
                return n;
            }
        }
        n
    });
    within(Duration::from_secs(20), "the sink to block", blocked_rx)
        .await
        .unwrap();
    tokio::time::sleep(BOUND * 3 - Duration::from_millis(500)).await;
    let m = http_status(metrics, "/metrics").await.unwrap().1;
    let unacked = "natsproxy_client_consumer_unacked{client=\"vector\",consumer=\"LOGS/CV\"}";
    assert!(metric(&m, unacked).is_some_and(|n| n >= 1.0), "{m}");
    let got = within(Duration::from_secs(20), "the loop to go on", loop_task)
        .await
        .unwrap();
    assert_eq!(got, 100);
    sampler
        .assert_live_throughout("a sink blocked for 3 x the bound")
        .await;
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_pulling_while_connected_fails_livez_client() {
    init_logs();
    const BOUND: Duration = Duration::from_secs(3);
    let server = js_server().await;
    let proxy = proxy(&server.url(), BOUND, None).await;
    let metrics = proxy.metrics_addr.unwrap();
    let js_direct = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    for i in 0..10 {
        js_direct
            .publish("logs.v", i.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // Vector issue 24932: connected, no error, and no pull request any more. This client
    // takes one batch, acks all of it but the last message, and then only stays
    // connected.
    let client = async_nats::ConnectOptions::new()
        .name("stuck")
        .connect(proxy.url())
        .await
        .unwrap();
    let consumer: jetstream::consumer::PullConsumer = jetstream::new(client.clone())
        .get_stream("LOGS")
        .await
        .unwrap()
        .get_consumer("CV")
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(10)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut held = None;
    for i in 0..10 {
        let m = within(Duration::from_secs(5), "a message", batch.next())
            .await
            .unwrap()
            .unwrap();
        if i < 9 {
            m.ack().await.unwrap();
        } else {
            held = Some(m);
        }
    }
    let pulled = Instant::now();
    // It holds a message it has not acked: slow or stuck, the wire cannot tell; reported,
    // not failed.
    tokio::time::sleep_until((pulled + BOUND + Duration::from_secs(2)).into()).await;
    let (code, body) = livez(metrics).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("consumer LOGS/CV: slow: "), "{body:?}");
    assert!(body.contains("holds 1 deliveries unacked"), "{body:?}");
    // It acks it, and still asks for nothing: it stopped.
    held.unwrap().ack().await.unwrap();
    client.flush().await.unwrap();
    let acked = Instant::now();
    let (failed, body) = until_livez(metrics, 503, BOUND + Duration::from_secs(3)).await;
    println!(
        "503 {:.2} s after the last ack: {body:?}",
        (failed - acked).as_secs_f64()
    );
    assert!(failed - acked > BOUND - Duration::from_millis(100));
    assert!(
        body.starts_with("client \"stuck\": consumer LOGS/CV: idle "),
        "{body:?}"
    );
    // Asked about another client name, the answer is that one's.
    let other = http_status(metrics, "/livez/client?client=vector")
        .await
        .unwrap();
    assert_eq!(other.0, 200, "{other:?}");
    let this = http_status(metrics, "/livez/client?client=stuck")
        .await
        .unwrap();
    assert_eq!(this.0, 503, "{this:?}");
    drop(client);
}
