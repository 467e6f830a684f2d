//! A rolling lame-duck restart of every node under steady core traffic, as seen by one
//! client of a proxy: the publisher is on the cluster's publisher node (it never
//! restarts), so anything missing is the proxy's. A test helper: it panics with context.

use crate::cluster::Cluster;
use crate::within;
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages published during the restart, 2 ms apart.
pub const N: u64 = 6000;

/// What the client saw.
pub struct Rolled {
    /// Numbers received, in arrival order.
    pub got: Vec<u64>,
    /// Largest time between two messages.
    pub gap: Duration,
    /// async-nats `Disconnected` events at the client.
    pub disconnects: u64,
}

impl Rolled {
    /// Every message exactly once, in order; no disconnect; gaps under `max_gap`.
    pub fn assert_clean(&self, max_gap: Duration) {
        let first_off = self.got.iter().zip(1..).position(|(g, w)| *g != w);
        assert!(
            self.got.len() as u64 == N && first_off.is_none(),
            "every message once, in order: {} of {N}, first off at {first_off:?}",
            self.got.len()
        );
        assert!(self.gap < max_gap, "largest gap {:?}", self.gap);
        assert_eq!(self.disconnects, 0, "client disconnects");
    }
}

/// Subscribes through `proxy_url`, publishes `N` numbered messages on the publisher node
/// while nodes 0, 1, 2 go lame duck, exit and restart one after the other.
pub async fn rolling_restart_under_traffic(
    cluster: &mut Cluster,
    proxy_url: String,
    subject: &str,
) -> Rolled {
    let disconnects = Arc::new(AtomicU64::new(0));
    let client = counting_disconnects(proxy_url, disconnects.clone()).await;
    let mut sub = client.subscribe(subject.to_owned()).await.unwrap();
    client.flush().await.unwrap();
    let publisher = async_nats::connect(cluster.publisher.as_ref().expect("publisher node").url())
        .await
        .unwrap();
    wait_for_interest(&publisher, &mut sub, subject).await;
    let (pubc, subj) = (publisher.clone(), subject.to_owned());
    let publishing = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        for n in 1..=N {
            tick.tick().await;
            pubc.publish(subj.clone(), n.to_string().into())
                .await
                .unwrap();
        }
        pubc.flush().await.unwrap();
    });
    let receiving = tokio::spawn(receive_numbers(sub));
    for i in 0..cluster.nodes.len() {
        cluster.lame_duck(i).expect("lame duck");
        cluster
            .wait_exit(i, Duration::from_secs(40))
            .await
            .expect("lame-duck node exits");
        cluster.restart(i).await.expect("node restarts");
    }
    within(Duration::from_secs(60), "publisher", publishing)
        .await
        .unwrap();
    let (got, gap) = within(Duration::from_secs(60), "subscriber", receiving)
        .await
        .unwrap();
    drop(client);
    Rolled {
        got,
        gap,
        disconnects: disconnects.load(Ordering::Relaxed),
    }
}

/// A client of `url` that counts its `Disconnected` events in `disconnects`.
async fn counting_disconnects(url: String, disconnects: Arc<AtomicU64>) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .event_callback(move |ev| {
            let d = disconnects.clone();
            async move {
                if matches!(ev, async_nats::Event::Disconnected) {
                    d.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .connect(url)
        .await
        .unwrap()
}

/// Publishes probes until one arrives on `sub`: its interest reached the publisher's node.
async fn wait_for_interest(
    publisher: &async_nats::Client,
    sub: &mut async_nats::Subscriber,
    subject: &str,
) {
    within(
        Duration::from_secs(30),
        "interest on the publisher node",
        async {
            loop {
                publisher
                    .publish(subject.to_owned(), "p".into())
                    .await
                    .unwrap();
                publisher.flush().await.unwrap();
                if let Ok(Some(_)) =
                    tokio::time::timeout(Duration::from_millis(100), sub.next()).await
                {
                    return;
                }
            }
        },
    )
    .await;
}

/// Reads numbered messages (probes are skipped) until `N` came or none came for 20 s:
/// the numbers in arrival order, and the largest time between two.
async fn receive_numbers(mut sub: async_nats::Subscriber) -> (Vec<u64>, Duration) {
    let (mut got, mut gap, mut last) = (Vec::new(), Duration::ZERO, None::<Instant>);
    while (got.len() as u64) < N {
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(20), sub.next()).await else {
            break;
        };
        let Ok(n) = std::str::from_utf8(&m.payload).unwrap_or("").parse::<u64>() else {
            continue;
        };
        if let Some(l) = last {
            gap = gap.max(l.elapsed());
        }
        last = Some(Instant::now());
        got.push(n);
    }
    (got, gap)
}
