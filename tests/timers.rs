//! Timers under load: an upstream that floods the proxy with messages must not delay its
//! keepalive PINGs or the confirmation PING of a publish. The fake upstream below (a real
//! nats-server cannot be made to flood on demand) writes MSGs as fast as the proxy reads
//! them and notes when each PING arrives.

mod common;
use common::*;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the fake upstream saw, with arrival times.
#[derive(Default)]
struct Seen {
    pings: Vec<Instant>,
    pubs: Vec<Instant>,
}

/// Accepts one connection from the proxy, speaks enough NATS for it, and once the client's
/// SUB arrives writes MSGs for it without pause.
async fn flooding_upstream(listener: TcpListener, seen: Arc<Mutex<Seen>>) {
    let (sock, _) = listener.accept().await.unwrap();
    let (rd, mut wr) = sock.into_split();
    wr.write_all(
        b"INFO {\"server_id\":\"FLOOD\",\"max_payload\":1048576,\"proto\":1,\"headers\":true}\r\n",
    )
    .await
    .unwrap();
    let (to_writer, mut from_reader) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(rd);
            let mut line = String::new();
            while lines.read_line(&mut line).await.unwrap_or(0) > 0 {
                let now = Instant::now();
                let l = line.trim_end().to_string();
                line.clear();
                if l == "PING" {
                    seen.lock().unwrap().pings.push(now);
                    let _ = to_writer.send(b"PONG\r\n".to_vec()).await;
                } else if let Some(rest) = l.strip_prefix("SUB ") {
                    let sid = rest.split_whitespace().last().unwrap_or("1").to_string();
                    let _ = to_writer.send(sid.into_bytes()).await;
                } else if let Some(rest) = l.strip_prefix("PUB ") {
                    seen.lock().unwrap().pubs.push(now);
                    let len: usize = rest.split_whitespace().last().unwrap().parse().unwrap();
                    let mut payload = vec![0u8; len + 2];
                    lines.read_exact(&mut payload).await.unwrap();
                }
            }
        })
    };
    let mut batch: Vec<u8> = Vec::new();
    loop {
        // Control replies first, then a batch of MSGs.
        while let Ok(m) = from_reader.try_recv() {
            if m == b"PONG\r\n" {
                wr.write_all(&m).await.unwrap();
            } else {
                let sid = String::from_utf8(m).unwrap();
                let one = format!("MSG flood {sid} 64\r\n{}\r\n", "x".repeat(64));
                batch = one.repeat(512).into_bytes();
            }
        }
        if batch.is_empty() {
            match from_reader.recv().await {
                Some(m) if m == b"PONG\r\n" => wr.write_all(&m).await.unwrap(),
                Some(m) => {
                    let sid = String::from_utf8(m).unwrap();
                    let one = format!("MSG flood {sid} 64\r\n{}\r\n", "x".repeat(64));
                    batch = one.repeat(512).into_bytes();
                }
                None => break,
            }
            continue;
        }
        if wr.write_all(&batch).await.is_err() || reader.is_finished() {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_and_confirmation_pings_keep_time_under_an_upstream_flood() {
    init_logs();
    const INTERVAL: Duration = Duration::from_millis(200);
    const SLACK: Duration = Duration::from_millis(50);
    let listener = TcpListener::bind(("127.0.0.1", free_port())).await.unwrap();
    let upstream = format!("nats://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Seen::default()));
    tokio::spawn(flooding_upstream(listener, seen.clone()));
    let p = TestProxy::start_with(&[upstream], |c| c.session.ping_interval = INTERVAL).await;

    // A raw client that subscribes and reads everything as fast as it comes.
    let mut c = TcpStream::connect(p.addr).await.unwrap();
    c.write_all(b"CONNECT {\"verbose\":false}\r\nSUB flood 1\r\nPING\r\n")
        .await
        .unwrap();
    let (mut crd, mut cwr) = c.into_split();
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = received.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 20];
        while let Ok(n) = crd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            r.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
    });
    within(
        Duration::from_secs(10),
        "the flood to reach the client",
        async {
            while received.load(std::sync::atomic::Ordering::Relaxed) < 50 << 20 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;

    // Keepalives: under the flood, no gap between PINGs longer than the interval + slack.
    let from = Instant::now();
    tokio::time::sleep(INTERVAL * 8).await;
    let pings: Vec<Instant> = seen
        .lock()
        .unwrap()
        .pings
        .iter()
        .copied()
        .filter(|t| *t >= from)
        .collect();
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    eprintln!(
        "flood: {} MiB to the client; {} keepalive PINGs in {:?}, largest gap {worst:?}",
        received.load(std::sync::atomic::Ordering::Relaxed) >> 20,
        pings.len(),
        INTERVAL * 8
    );
    assert!(
        pings.len() >= 6,
        "{} PINGs in {:?}",
        pings.len(),
        INTERVAL * 8
    );
    assert!(
        worst <= INTERVAL + SLACK,
        "a keepalive came {worst:?} after the previous one"
    );

    // Confirmation: a publish's PING follows within CONFIRM_DELAY + slack, keepalive or not.
    for _ in 0..5 {
        let before = seen.lock().unwrap().pubs.len();
        cwr.write_all(b"PUB out 2\r\nhi\r\n").await.unwrap();
        let published = within(Duration::from_secs(5), "the PUB upstream", async {
            loop {
                if let Some(t) = seen.lock().unwrap().pubs.get(before).copied() {
                    return t;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let confirmed = within(Duration::from_secs(5), "a PING after the PUB", async {
            loop {
                if let Some(t) = seen.lock().unwrap().pings.iter().find(|t| **t >= published) {
                    return *t;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let took = confirmed - published;
        assert!(
            took <= natsproxy::session::CONFIRM_DELAY + SLACK,
            "the confirmation PING came {took:?} after the publish"
        );
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    p.stop().await;
}
