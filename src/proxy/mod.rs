//! The tokio shell: listener, accept loop with a connection cap, per-client drivers,
//! graceful shutdown.

mod driver;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::config::Config;

/// Process-wide counters (the metrics endpoint reads these).
#[derive(Debug, Default)]
pub struct Stats {
    /// Client connections accepted since start.
    pub clients_accepted: AtomicU64,
    /// Client connections open now.
    pub clients_active: AtomicU64,
    /// Client connections refused because `max_clients` were open.
    pub clients_refused: AtomicU64,
    /// Upstream connections established since start.
    pub upstream_connects: AtomicU64,
    /// Clients closed as slow consumers.
    pub slow_consumers: AtomicU64,
    /// Completed make-before-break migrations (all clients).
    pub migrations: AtomicU64,
    /// Upstreams lost without warning (all clients).
    pub failovers: AtomicU64,
    /// Subscriptions replayed on new upstream links.
    pub subs_replayed: AtomicU64,
    /// Overlap duplicates dropped.
    pub duplicates_suppressed: AtomicU64,
    /// Messages forwarded past the de-dup bounds (possible duplicates).
    pub possible_duplicates: AtomicU64,
    /// Unconfirmed publishes written again after a link died.
    pub publishes_resent: AtomicU64,
    /// Longest lame-duck-INFO-to-switch time seen, in microseconds.
    pub max_switch_us: AtomicU64,
    /// JetStream pull requests re-sent by the proxy.
    pub pulls_reissued: AtomicU64,
    /// Statuses kept from clients (503 and others their library turns into errors).
    pub statuses_shielded: AtomicU64,
}

impl Stats {
    /// Adds what a session counted since `before`.
    pub(crate) fn add_session(
        &self,
        before: &crate::session::SessionStats,
        now: &crate::session::SessionStats,
    ) {
        let add = |c: &AtomicU64, a: u64, b: u64| {
            if b > a {
                c.fetch_add(b - a, Ordering::Relaxed);
            }
        };
        add(&self.migrations, before.migrations, now.migrations);
        add(&self.failovers, before.failovers, now.failovers);
        add(&self.subs_replayed, before.subs_replayed, now.subs_replayed);
        add(
            &self.duplicates_suppressed,
            before.duplicates_suppressed,
            now.duplicates_suppressed,
        );
        add(
            &self.possible_duplicates,
            before.possible_duplicates,
            now.possible_duplicates,
        );
        add(
            &self.publishes_resent,
            before.publishes_resent,
            now.publishes_resent,
        );
        add(
            &self.pulls_reissued,
            before.pulls_reissued,
            now.pulls_reissued,
        );
        add(
            &self.statuses_shielded,
            before.statuses_shielded,
            now.statuses_shielded,
        );
        if let Some(t) = now.last_switch {
            self.max_switch_us
                .fetch_max(t.as_micros() as u64, Ordering::Relaxed);
        }
    }
}

/// A bound proxy, ready to run.
pub struct Proxy {
    listener: TcpListener,
    cfg: Arc<Config>,
    stats: Arc<Stats>,
}

impl Proxy {
    /// Binds the listen address.
    pub async fn bind(cfg: Config) -> io::Result<Proxy> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Ok(Proxy {
            listener,
            cfg: Arc::new(cfg),
            stats: Arc::default(),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Shared counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Accepts clients until `shutdown` fires, then closes every client and waits up to
    /// the shutdown grace period for their drivers to finish.
    pub async fn run(self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
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
                self.stats.clients_refused.fetch_add(1, Ordering::Relaxed);
                warn!(%peer, max = self.cfg.max_clients, "refusing client: maximum connections exceeded");
                tracker.spawn(driver::refuse(stream));
                continue;
            };
            conn_id += 1;
            self.stats.clients_accepted.fetch_add(1, Ordering::Relaxed);
            let cfg = self.cfg.clone();
            let stats = self.stats.clone();
            let token = shutdown.child_token();
            let span = tracing::info_span!("client", conn = conn_id, %peer);
            tracker.spawn(
                async move {
                    stats.clients_active.fetch_add(1, Ordering::Relaxed);
                    driver::serve(stream, &cfg, &stats, token).await;
                    stats.clients_active.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                }
                .instrument(span),
            );
        }
        tracker.close();
        if tokio::time::timeout(self.cfg.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            warn!("shutdown grace period over; abandoning remaining connections");
        }
        info!("natsproxy stopped");
    }
}
