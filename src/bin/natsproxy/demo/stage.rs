//! What both demos stand on: the cluster and the in-process proxy in front of it, the
//! stream set-up, the publisher, Vector-style consumers and what they have seen, and the
//! demo's errors.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use natsproxy::config::{Config, ConfigError, UpstreamUrl};
use natsproxy::proxy::{Proxy, StartError, Stats};
use natsproxy_kit::cluster::{Cluster, ClusterOpts};
use natsproxy_kit::vector;
use tokio_util::sync::CancellationToken;

/// Why a demo could not run to its summary.
#[derive(Debug, thiserror::Error)]
pub(super) enum DemoError {
    #[error(transparent)]
    Kit(#[from] natsproxy_kit::Error),
    #[error("connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("JetStream did not come up within {SETUP_MAX:?}: {last}")]
    JetStream { last: String },
    #[error("upstream {url}: {source}")]
    Upstream {
        url: String,
        #[source]
        source: ConfigError,
    },
    #[error("proxy: {0}")]
    Proxy(#[from] StartError),
    #[error("proxy address: {0}")]
    ProxyAddr(#[source] std::io::Error),
}

/// How long the stream and its consumers may take to be created after start.
const SETUP_MAX: Duration = Duration::from_secs(30);

/// The proxy of a demo, in this process.
pub(super) struct DemoProxy {
    pub(super) addr: SocketAddr,
    pub(super) stats: Arc<Stats>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl DemoProxy {
    /// Starts a proxy in front of `upstreams`, with a metrics endpoint.
    async fn start(upstreams: Vec<String>) -> Result<DemoProxy, DemoError> {
        let ups = upstreams
            .into_iter()
            .map(|url| {
                UpstreamUrl::parse(&url).map_err(|source| DemoError::Upstream { url, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut cfg = Config::new(SocketAddr::from(([127, 0, 0, 1], 0)), ups);
        cfg.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let proxy = Proxy::bind(cfg).await?;
        let addr = proxy.local_addr().map_err(DemoError::ProxyAddr)?;
        let stats = proxy.stats();
        let token = CancellationToken::new();
        let task = tokio::spawn(proxy.run(token.clone()));
        Ok(DemoProxy {
            addr,
            stats,
            token,
            task,
        })
    }

    pub(super) fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    pub(super) async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }
}

/// The cluster (healthy, routed), a flag Ctrl-C sets, and the proxy in front of the
/// three JetStream nodes.
pub(super) struct Stage {
    pub(super) cluster: Cluster,
    pub(super) interrupted: Arc<AtomicBool>,
    pub(super) proxy: DemoProxy,
}

impl Stage {
    pub(super) async fn set_up() -> Result<Stage, DemoError> {
        let interrupted = Arc::new(AtomicBool::new(false));
        let flag = interrupted.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                flag.store(true, Ordering::Relaxed);
            }
        });
        eprintln!("starting a 3-node nats-server cluster with JetStream …");
        let cluster = Cluster::start(ClusterOpts {
            nodes: 3,
            jetstream: true,
            publisher_node: true,
            dir_tag: Some("demo"),
            ..Default::default()
        })
        .await?;
        eprintln!("cluster up in {}", cluster.dir().display());
        let proxy = DemoProxy::start(cluster.urls()).await?;
        Ok(Stage {
            cluster,
            interrupted,
            proxy,
        })
    }

    pub(super) fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// A JetStream context on node `i` of the cluster, or on the publisher node.
    pub(super) async fn jetstream(
        &self,
        node: Option<usize>,
    ) -> Result<jetstream::Context, DemoError> {
        let url = match node {
            Some(i) => self.cluster.nodes[i].url(),
            None => self
                .cluster
                .publisher
                .as_ref()
                .map(|p| p.url())
                .unwrap_or_default(),
        };
        let c = async_nats::connect(&url)
            .await
            .map_err(|source| DemoError::Connect { url, source })?;
        Ok(jetstream::new(c))
    }
}

/// Creates the stream `LOGS` (`logs.>`) and durable pull consumers on it, retrying until
/// JetStream has a meta leader (at most [`SETUP_MAX`]).
pub(super) async fn create_stream(
    admin: &jetstream::Context,
    config: stream::Config,
    consumers: &[pull::Config],
) -> Result<(), DemoError> {
    let deadline = Instant::now() + SETUP_MAX;
    loop {
        let last = match admin.create_stream(config.clone()).await {
            Ok(s) => {
                let mut failed = None;
                for c in consumers {
                    if let Err(e) = s.create_consumer(c.clone()).await {
                        failed = Some(e.to_string());
                    }
                }
                match failed {
                    None => return Ok(()),
                    Some(e) => e,
                }
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(DemoError::JetStream { last });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A durable pull consumer as the demos configure it.
pub(super) fn durable(name: &str, replicas: usize) -> pull::Config {
    pull::Config {
        durable_name: Some(name.into()),
        ack_wait: Duration::from_secs(5),
        num_replicas: replicas,
        ..Default::default()
    }
}

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

impl Progress {
    fn saw(&mut self, payload: &[u8]) {
        let now = Instant::now();
        if let Some(l) = self.last {
            self.max_gap = self.max_gap.max(now - l);
        }
        self.last = Some(now);
        self.consumed += 1;
        if let Ok(n) = std::str::from_utf8(payload).unwrap_or("").parse::<u64>() {
            self.distinct.insert(n);
        }
    }
}

/// One consumer's [`Progress`], shared with its task.
pub(super) type Shared = Arc<Mutex<Progress>>;

/// Reads a shared [`Progress`]; a poisoned lock (a panicked task) reads as `fallback`.
pub(super) fn read<T>(p: &Shared, fallback: T, f: impl FnOnce(&Progress) -> T) -> T {
    p.lock().map(|p| f(&p)).unwrap_or(fallback)
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
    progress: Shared,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let run = async {
            let c = async_nats::ConnectOptions::new()
                .name(durable)
                .connect(url)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let js = jetstream::new(c);
            let mut msgs = vector::open(&js, "LOGS", durable)
                .await
                .map_err(|e| e.to_string())?;
            let end = vector::run(&mut msgs, |m| {
                if let Ok(mut p) = progress.lock() {
                    p.saw(&m.payload);
                }
                std::ops::ControlFlow::Continue(())
            })
            .await;
            Err::<(), String>(match end {
                vector::End::ErrItem(e) => format!("error item: {e}"),
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
