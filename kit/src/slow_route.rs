//! A forwarder in front of a node's cluster (route) port that delays the routes between
//! two named nodes, every byte both ways and in order, so that interest propagates
//! between them late on purpose. Every node of such a cluster advertises its forwarder
//! and every route list names forwarders, so a route passes one whichever node dials.
//!
//! The dialling node's name is read from the INFO it sends after its CONNECT
//! (`"server_name":"n2"`); its first bytes wait for it (at most [`SNIFF_LIMIT`]), the
//! other direction flows meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Bytes of a dialling node read while looking for its name; past them the route is
/// not a slow one.
pub const SNIFF_LIMIT: usize = 16 * 1024;

/// Which route is slow, and by how much (each way). The delay starts at zero, so that
/// the cluster forms its routes as usual (a route handshake that takes seconds makes
/// nats-server 2.15 keep duplicate routes); the test sets it once the cluster is up.
#[derive(Clone, Debug)]
pub struct SlowRoute {
    pub between: (String, String),
    /// Microseconds, shared by every forwarder of the cluster.
    delay: Arc<AtomicU64>,
}

impl SlowRoute {
    pub fn between(a: &str, b: &str) -> SlowRoute {
        SlowRoute {
            between: (a.into(), b.into()),
            delay: Arc::default(),
        }
    }

    /// From now on every byte of the route waits `d`.
    pub fn set_delay(&self, d: Duration) {
        self.delay.store(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn applies(&self, a: &str, b: &str) -> bool {
        let (x, y) = (&self.between.0, &self.between.1);
        (a == x && b == y) || (a == y && b == x)
    }
}

pub struct RouteForwarder {
    pub port: u16,
    /// Route connections that were slowed.
    pub slowed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RouteForwarder {
    /// Forwards to `target_port`, the cluster port of the node `target`.
    pub async fn start(target: String, target_port: u16, slow: SlowRoute) -> RouteForwarder {
        let listener = TcpListener::bind(("127.0.0.1", crate::free_port().expect("a free port")))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let slowed = Arc::new(AtomicU64::new(0));
        let count = slowed.clone();
        let task = tokio::spawn(async move {
            while let Ok((dialer, _)) = listener.accept().await {
                let (target, slow, count) = (target.clone(), slow.clone(), count.clone());
                tokio::spawn(async move {
                    if let Ok(node) = TcpStream::connect(("127.0.0.1", target_port)).await {
                        forward(dialer, node, &target, &slow, &count).await;
                    }
                });
            }
        });
        RouteForwarder { port, slowed, task }
    }
}

impl Drop for RouteForwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    dialer: TcpStream,
    node: TcpStream,
    target: &str,
    slow: &SlowRoute,
    count: &AtomicU64,
) {
    let (mut dr, dw) = dialer.into_split();
    let (nr, nw) = node.into_split();
    // The route's delay once it is known to be the slow one (none until then).
    let none = Arc::new(AtomicU64::new(0));
    let delay = Arc::new(std::sync::OnceLock::<Arc<AtomicU64>>::new());
    // Node → dialer flows at once.
    let back = tokio::spawn(pipe(nr, dw, Vec::new(), delay.clone(), none.clone()));
    let mut first = Vec::new();
    let mut buf = [0u8; 4096];
    let name = loop {
        if let Some(n) = server_name(&first) {
            break Some(n);
        }
        if first.len() >= SNIFF_LIMIT {
            break None;
        }
        match dr.read(&mut buf).await {
            Ok(0) | Err(_) => break None,
            Ok(n) => first.extend_from_slice(&buf[..n]),
        }
    };
    if name.is_some_and(|n| slow.applies(&n, target)) {
        count.fetch_add(1, Ordering::Relaxed);
        let _ = delay.set(slow.delay.clone());
    }
    pipe(dr, nw, first, delay, none).await;
    let _ = back.await;
}

fn server_name(b: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(b);
    let at = text.find("\"server_name\":\"")? + "\"server_name\":\"".len();
    let end = text[at..].find('"')?;
    Some(text[at..at + end].to_owned())
}

/// Copies `r` to `w` (after `first`), each chunk the route's delay (µs, `none` until
/// it is known) after it was read.
async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    first: Vec<u8>,
    delay: Arc<std::sync::OnceLock<Arc<AtomicU64>>>,
    none: Arc<AtomicU64>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if w.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let due = || {
        let us = delay.get().unwrap_or(&none).load(Ordering::Relaxed);
        Instant::now() + Duration::from_micros(us)
    };
    if !first.is_empty() {
        let _ = tx.send((due(), first));
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((due(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
