//! The tokio shell: listener, accept loop with a connection cap, per-client drivers,
//! graceful shutdown.

mod driver;
pub mod http;
pub mod tls;

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

/// A bound proxy, ready to run.
pub struct Proxy {
    listener: TcpListener,
    metrics: Option<TcpListener>,
    cfg: Arc<Config>,
    dialer: Arc<tls::Dialer>,
    stats: Arc<Stats>,
}

impl Proxy {
    /// Binds the listen address. Fails early on TLS files that do not load.
    pub async fn bind(cfg: Config) -> io::Result<Proxy> {
        let dialer =
            tls::Dialer::new(cfg.upstream_tls.clone(), &cfg.upstreams).map_err(io::Error::other)?;
        let listener = TcpListener::bind(cfg.listen).await?;
        let metrics = match cfg.metrics_listen {
            Some(a) => Some(TcpListener::bind(a).await?),
            None => None,
        };
        Ok(Proxy {
            listener,
            metrics,
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

    /// Accepts clients until `shutdown` fires; then stops accepting (and reports not
    /// ready), lets open clients carry on for the shutdown grace period so that they can
    /// drain (a sidecar's client is told to stop at the same moment), and closes whatever
    /// is still open after it.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let hard = CancellationToken::new();
        let ready = Arc::new(http::Readiness::new());
        if let Some(l) = self.metrics {
            let ups = self.cfg.session().upstreams;
            tracker.spawn(http::probe(
                ups,
                self.stats.clone(),
                ready.clone(),
                shutdown.clone(),
            ));
            tracker.spawn(http::serve(
                l,
                self.stats.clone(),
                ready.clone(),
                hard.clone(),
            ));
        }
        let slots = Arc::new(Semaphore::new(self.cfg.max_clients));
        let mut conn_id: u64 = 0;
        info!(listen = %self.cfg.listen, upstreams = ?self.cfg.session().upstreams, "natsproxy listening");
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
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
                tracker.spawn(driver::refuse(stream));
                continue;
            };
            conn_id += 1;
            self.stats.clients_accepted.inc();
            let cfg = self.cfg.clone();
            let dialer = self.dialer.clone();
            let stats = self.stats.clone();
            let token = hard.child_token();
            let span = tracing::info_span!("client", conn = conn_id, %peer);
            tracker.spawn(
                async move {
                    stats.clients_active.inc();
                    driver::serve(stream, &cfg, &dialer, &stats, token).await;
                    stats.clients_active.dec();
                    drop(permit);
                }
                .instrument(span),
            );
        }
        drop(self.listener);
        ready.set_draining();
        tracker.close();
        let open = self.stats.clients_active.get();
        info!(clients = open, grace = ?self.cfg.shutdown_grace, "shutting down: no new clients; open ones may finish");
        if tokio::time::timeout(self.cfg.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            warn!(
                clients = self.stats.clients_active.get(),
                "shutdown grace period over; closing remaining clients"
            );
        }
        hard.cancel();
        if tokio::time::timeout(std::time::Duration::from_secs(2), tracker.wait())
            .await
            .is_err()
        {
            warn!("connections still open after close; abandoning them");
        }
        info!("natsproxy stopped");
    }
}
