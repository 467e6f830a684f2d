//! The tokio shell: listener, accept loop with a connection cap, per-client drivers,
//! graceful shutdown.

pub(crate) mod budget;
mod dial;
mod driver;
mod http;
mod report;
mod tls;
pub mod watch;
mod write_buf;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::config::Config;

pub use crate::metrics::Stats;
pub use tls::TlsError;

/// Why the proxy could not start; the binary maps it to its exit code.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A TLS file is missing or does not load (the error names the flag and the file).
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

impl StartError {
    /// 2 for configuration (as for a bad flag), 1 for what the machine refused.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Tls(_) => 2,
            StartError::Listen { .. } | StartError::Metrics { .. } => 1,
        }
    }
}

/// Loads every TLS file the configuration names, as start-up would (`check-config`).
pub fn check_files(cfg: &Config) -> Result<(), StartError> {
    dial::Dialer::new(cfg.upstream_tls.clone(), &cfg.upstreams)
        .map(drop)
        .map_err(StartError::Tls)
}

/// A bound proxy, ready to run.
pub struct Proxy {
    listener: TcpListener,
    metrics: Option<TcpListener>,
    cfg: Arc<Config>,
    dialer: Arc<dial::Dialer>,
    stats: Arc<Stats>,
    watch: Arc<watch::ClientWatch>,
}

impl Proxy {
    /// Binds the listen address. Fails early on TLS files that do not load.
    pub async fn bind(cfg: Config) -> Result<Proxy, StartError> {
        let dialer = dial::Dialer::new(cfg.upstream_tls.clone(), &cfg.upstreams)
            .map_err(StartError::Tls)?
            .with_budget(cfg.dial_rate, cfg.dial_burst);
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: cfg.listen,
                    source,
                })?;
        let metrics = match cfg.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::Metrics { addr, source })?,
            ),
            None => None,
        };
        Ok(Proxy {
            listener,
            metrics,
            watch: Arc::new(watch::ClientWatch::new(cfg.client_stall_after)),
            cfg: Arc::new(cfg),
            dialer: Arc::new(dialer),
            stats: Arc::default(),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The metrics endpoint's bound address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Shared counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The client watch behind `/livez/client`.
    pub fn client_watch(&self) -> Arc<watch::ClientWatch> {
        self.watch.clone()
    }

    /// Accepts clients until `shutdown` fires; then stops accepting (and reports not
    /// ready), lets open clients carry on for the shutdown grace period so that they can
    /// drain (a sidecar's client is told to stop at the same moment), and closes whatever
    /// is still open after it.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Clients, and the HTTP endpoints apart: the grace period waits for clients only
        // (with none connected, SIGTERM exits at once), the endpoints answer until the end.
        let clients = TaskTracker::new();
        let endpoints = TaskTracker::new();
        let hard = CancellationToken::new();
        let ready = Arc::new(http::Readiness::new());
        if let Some(l) = self.metrics.take() {
            let ups = self.cfg.session().upstreams;
            endpoints.spawn(http::probe(
                self.dialer.clone(),
                ups,
                self.stats.clone(),
                ready.clone(),
                shutdown.clone(),
            ));
            endpoints.spawn(http::serve(
                l,
                http::State {
                    stats: self.stats.clone(),
                    ready: ready.clone(),
                    watch: self.watch.clone(),
                },
                hard.clone(),
            ));
        }
        info!(listen = %self.cfg.listen, upstreams = ?self.cfg.session().upstreams, "natsproxy listening");
        self.accept_until(&shutdown, &clients, &hard).await;
        let Proxy {
            listener,
            cfg,
            stats,
            ..
        } = self;
        drop(listener);
        ready.set_draining();
        drain(&cfg, &stats, clients, endpoints, hard).await;
        info!("natsproxy stopped");
    }

    /// Accepts clients, each a driver task on `clients` with a child of `hard`, until
    /// `shutdown` fires; one past `max_clients` is refused as nats-server refuses it.
    async fn accept_until(
        &self,
        shutdown: &CancellationToken,
        clients: &TaskTracker,
        hard: &CancellationToken,
    ) {
        let slots = Arc::new(Semaphore::new(self.cfg.max_clients));
        let mut conn_id: u64 = 0;
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = self.listener.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                self.stats.clients_refused.inc();
                warn!(%peer, max = self.cfg.max_clients, "refusing client: maximum connections exceeded");
                clients.spawn(driver::refuse(stream));
                continue;
            };
            conn_id += 1;
            self.stats.clients_accepted.inc();
            let cfg = self.cfg.clone();
            let dialer = self.dialer.clone();
            let stats = self.stats.clone();
            let watch = self.watch.clone();
            let token = hard.child_token();
            let span = tracing::info_span!("client", conn = conn_id, %peer, client = tracing::field::Empty);
            let conn = conn_id;
            clients.spawn(
                async move {
                    stats.clients_active.inc();
                    let shared = driver::Shared {
                        cfg: &cfg,
                        dialer: &dialer,
                        stats: &stats,
                        watch: &watch,
                    };
                    driver::serve(stream, conn, shared, token).await;
                    stats.clients_active.dec();
                    drop(permit);
                }
                .instrument(span),
            );
        }
    }
}

/// After the listener closed: open clients may finish for the shutdown grace period;
/// then `hard` closes what is left, and the endpoints, within 2 s.
async fn drain(
    cfg: &Config,
    stats: &Stats,
    clients: TaskTracker,
    endpoints: TaskTracker,
    hard: CancellationToken,
) {
    clients.close();
    let open = stats.clients_active.get();
    info!(clients = open, grace = ?cfg.shutdown_grace, "shutting down: no new clients; open ones may finish");
    if tokio::time::timeout(cfg.shutdown_grace, clients.wait())
        .await
        .is_err()
    {
        warn!(
            clients = stats.clients_active.get(),
            "shutdown grace period over; closing remaining clients"
        );
    }
    hard.cancel();
    endpoints.close();
    let all = async {
        clients.wait().await;
        endpoints.wait().await;
    };
    if tokio::time::timeout(std::time::Duration::from_secs(2), all)
        .await
        .is_err()
    {
        warn!("connections still open after close; abandoning them");
    }
}
