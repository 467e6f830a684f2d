//! Process-wide metrics, exposed in the Prometheus text format by `prometheus-client`.
//!
//! Per-client drivers add to these; nothing here is on the per-message path except
//! batched adds (once per socket read or write batch).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::session::SHIELDED_CODES;

/// `node` label: the upstream's `host:port`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

/// `reason` label: ldm, closed, stale, protocol.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// `direction` label: `client_to_upstream` or `upstream_to_client`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
}

/// `version` label: the crate version that runs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: &'static str,
}

/// `code` label: a JetStream status code (`409`, `503`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: &'static str,
}

/// `buffer` label: client_out, upstream_out, backlog, hold.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BufferLabel {
    pub buffer: &'static str,
}

/// `client` label: a client's CONNECT name (cut to 64 bytes; empty when it gave none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientLabel {
    pub client: String,
}

/// `client` and `consumer` (`STREAM/CONSUMER`) labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabel {
    pub client: String,
    pub consumer: String,
}

type SecondsFamily<L> = Family<L, Gauge<f64, AtomicU64>>;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 0.5 ms … ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Every metric of the process.
pub struct Stats {
    registry: Registry,
    pub clients_active: Gauge,
    pub clients_accepted: Counter,
    pub clients_refused: Counter,
    pub upstream_connects: Counter,
    /// Dials that failed: refused, timed out, TLS handshake or verification failed.
    pub upstream_dial_failures: Counter,
    /// Dials not made: the process's dial budget was spent.
    pub upstream_dials_refused: Counter,
    pub upstream_connections: Family<NodeLabel, Gauge>,
    pub migrations_by_reason: Family<ReasonLabel, Counter>,
    pub migration_seconds: HistogramFamily<ReasonLabel>,
    /// Completed make-before-break migrations.
    pub migrations: Counter,
    /// Primaries lost without warning.
    pub failovers: Counter,
    /// Failovers in the middle of a make-before-break migration.
    pub migrations_failed: Counter,
    /// When this process started (Unix seconds): a change means a restart.
    pub start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Standbys brought up on suspicion (a PING unanswered for `hedge_after`).
    pub hedges: Counter,
    pub subs_replayed: Counter,
    pub pulls_reissued: Counter,
    /// Statuses kept from clients, by code (the series are in [`Hot::shielded`]).
    pub statuses_shielded: Family<CodeLabel, Counter>,
    pub redeliveries_acked: Counter,
    pub heartbeats_amended: Counter,
    pub duplicates_suppressed: Counter,
    pub possible_duplicates: Counter,
    pub publishes_resent: Counter,
    pub slow_consumers: Counter,
    pub bytes: Family<DirectionLabel, Counter>,
    pub messages: Family<DirectionLabel, Counter>,
    pub buffered_bytes: Family<BufferLabel, Gauge>,
    pub upstream_rtt_seconds: Histogram,
    /// Clients whose session has a working upstream now.
    pub sessions_with_upstream: Gauge,
    /// Sessions moving off a lame-duck node now (paces their dials).
    pub sessions_migrating: Gauge,
    /// Sessions in an outage now: their upstream lost, no other carrying their traffic.
    pub sessions_without_upstream: Gauge,
    /// How long outages lasted (loss to traffic on a new upstream, or to the close at
    /// `--max-outage`).
    pub outage_seconds: Histogram,
    /// Pull requests held unplaced now (consumer away or moved, link lost).
    pub pulls_unplaced: Gauge,
    /// Time from a pull request found lost to its full placement again.
    pub pull_replacement_seconds: Histogram,
    /// 1 when /readyz answers 200.
    pub ready: Gauge,
    /// The client watch (`/livez/client`), set from it at each scrape: connections by
    /// client name, and per consumer the seconds since its last pull request, since its
    /// last sign of progress, and the deliveries it holds unacked.
    pub client_connected: Family<ClientLabel, Gauge>,
    pub client_consumer_pull_age: SecondsFamily<ConsumerLabel>,
    pub client_consumer_idle: SecondsFamily<ConsumerLabel>,
    pub client_consumer_unacked: Family<ConsumerLabel, Gauge>,
    /// 1 when /livez/client answers 200.
    pub client_live: Gauge,
    /// Longest lame-duck-INFO-to-switch time seen, in microseconds.
    pub max_switch_us: AtomicU64,
    /// The last [`RECENT_SWITCHES`] trigger-to-switch times (for percentiles in tests
    /// and benchmarks; the histogram above is what /metrics serves).
    pub recent_switches: std::sync::Mutex<std::collections::VecDeque<std::time::Duration>>,
    /// Largest write buffer toward a client at the moment it was closed as a slow
    /// consumer (bytes): the bound plus at most one read's worth.
    pub max_slow_consumer_pending: AtomicU64,
    /// The hot per-direction series, resolved once: updating them is one atomic add, no
    /// label hashing or family lock on the relay path.
    pub hot: Hot,
}

/// Pre-resolved series of the label families updated on every read.
pub struct Hot {
    pub msgs_to_client: Counter,
    pub msgs_to_upstream: Counter,
    pub bytes_to_client: Counter,
    pub bytes_to_upstream: Counter,
    /// client_out, upstream_out, backlog, hold (as `BUFFERS`).
    pub buffers: [Gauge; 4],
    /// Shielded statuses, by code in the order of [`SHIELDED_CODES`].
    pub shielded: [Counter; SHIELDED_CODES.len()],
}

impl Hot {
    /// Resolves the hot series of their families once.
    fn resolve(
        messages: &Family<DirectionLabel, Counter>,
        bytes: &Family<DirectionLabel, Counter>,
        buffered_bytes: &Family<BufferLabel, Gauge>,
        statuses_shielded: &Family<CodeLabel, Counter>,
    ) -> Hot {
        // One statement per series: `get_or_create` returns a read guard that lives to the
        // end of its statement, and the next one may need the write lock.
        fn counter(f: &Family<DirectionLabel, Counter>, d: &'static str) -> Counter {
            let c = f.get_or_create(&DirectionLabel { direction: d }).clone();
            c
        }
        fn gauge(f: &Family<BufferLabel, Gauge>, b: &'static str) -> Gauge {
            let g = f.get_or_create(&BufferLabel { buffer: b }).clone();
            g
        }
        Hot {
            msgs_to_client: counter(messages, "upstream_to_client"),
            msgs_to_upstream: counter(messages, "client_to_upstream"),
            bytes_to_client: counter(bytes, "upstream_to_client"),
            bytes_to_upstream: counter(bytes, "client_to_upstream"),
            buffers: BUFFERS.map(|b| gauge(buffered_bytes, b)),
            shielded: SHIELDED_CODES.map(|code| {
                let c = statuses_shielded.get_or_create(&CodeLabel { code }).clone();
                c
            }),
        }
    }
}

/// Bound of [`Stats::recent_switches`]; past it the oldest is dropped.
pub const RECENT_SWITCHES: usize = 4096;

impl Stats {
    /// Records one migration's trigger-to-switch time.
    pub fn record_switch(&self, took: std::time::Duration) {
        if let Ok(mut r) = self.recent_switches.lock() {
            if r.len() >= RECENT_SWITCHES {
                r.pop_front();
            }
            r.push_back(took);
        }
    }
}

/// The `buffer` label values, in the order of [`Hot::buffers`].
pub const BUFFERS: [&str; 4] = ["client_out", "upstream_out", "backlog", "hold"];

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    /// All metrics, registered under the `natsproxy` prefix.
    pub fn new() -> Stats {
        let mut r = Registry::with_prefix("natsproxy");
        let bytes: Family<DirectionLabel, Counter> = Family::default();
        let messages: Family<DirectionLabel, Counter> = Family::default();
        let buffered_bytes: Family<BufferLabel, Gauge> = Family::default();
        let statuses_shielded: Family<CodeLabel, Counter> = Family::default();
        let hot = Hot::resolve(&messages, &bytes, &buffered_bytes, &statuses_shielded);
        let s = Stats {
            clients_active: Gauge::default(),
            clients_accepted: Counter::default(),
            clients_refused: Counter::default(),
            upstream_connects: Counter::default(),
            upstream_dial_failures: Counter::default(),
            upstream_dials_refused: Counter::default(),
            upstream_connections: Family::default(),
            migrations_by_reason: Family::default(),
            migration_seconds: Family::new_with_constructor(duration_histogram),
            migrations: Counter::default(),
            failovers: Counter::default(),
            migrations_failed: Counter::default(),
            start_time_seconds: Gauge::default(),
            hedges: Counter::default(),
            subs_replayed: Counter::default(),
            pulls_reissued: Counter::default(),
            statuses_shielded,
            redeliveries_acked: Counter::default(),
            heartbeats_amended: Counter::default(),
            duplicates_suppressed: Counter::default(),
            possible_duplicates: Counter::default(),
            publishes_resent: Counter::default(),
            slow_consumers: Counter::default(),
            bytes,
            messages,
            buffered_bytes,
            hot,
            upstream_rtt_seconds: duration_histogram(),
            sessions_with_upstream: Gauge::default(),
            sessions_migrating: Gauge::default(),
            sessions_without_upstream: Gauge::default(),
            outage_seconds: duration_histogram(),
            pulls_unplaced: Gauge::default(),
            pull_replacement_seconds: duration_histogram(),
            ready: Gauge::default(),
            client_connected: Family::default(),
            client_consumer_pull_age: Family::default(),
            client_consumer_idle: Family::default(),
            client_consumer_unacked: Family::default(),
            client_live: Gauge::default(),
            max_switch_us: AtomicU64::new(0),
            recent_switches: Default::default(),
            max_slow_consumer_pending: AtomicU64::new(0),
            registry: Registry::default(),
        };
        s.register_clients_and_links(&mut r);
        s.register_moves(&mut r);
        s.register_delivery(&mut r);
        s.register_traffic(&mut r);
        s.register_sessions(&mut r);
        s.register_process(&mut r);
        s.register_client_watch(&mut r);
        Stats { registry: r, ..s }
    }

    /// Registers client connections and upstream links.
    fn register_clients_and_links(&self, r: &mut Registry) {
        r.register(
            "client_connections",
            "Client connections open now",
            self.clients_active.clone(),
        );
        r.register(
            "client_connections_accepted",
            "Client connections accepted",
            self.clients_accepted.clone(),
        );
        r.register(
            "client_connections_refused",
            "Client connections refused at --max-clients",
            self.clients_refused.clone(),
        );
        r.register(
            "upstream_connects",
            "Upstream connections established",
            self.upstream_connects.clone(),
        );
        r.register(
            "upstream_dial_failures",
            "Upstream dials that failed (refused, timed out, TLS handshake or verification)",
            self.upstream_dial_failures.clone(),
        );
        r.register(
            "upstream_dials_refused",
            "Upstream dials not made because the process's dial budget (--dial-rate, --dial-burst) was spent",
            self.upstream_dials_refused.clone(),
        );
        r.register(
            "upstream_connections",
            "Upstream connections open now, by node",
            self.upstream_connections.clone(),
        );
    }

    /// Registers moves between upstreams: migrations, failovers, hedges, and what was replayed.
    fn register_moves(&self, r: &mut Registry) {
        r.register(
            "migrations_by_reason",
            "Moves to another upstream, by reason (ldm = make-before-break; closed, stale, protocol = failover)",
            self.migrations_by_reason.clone(),
        );
        r.register(
            "migrations",
            "Make-before-break migrations completed (client traffic switched to a new upstream behind a PING barrier)",
            self.migrations.clone(),
        );
        r.register(
            "failovers",
            "Upstreams lost without warning (closed, reset, silent, or not NATS): the session moved to another node with an outage",
            self.failovers.clone(),
        );
        r.register(
            "migrations_failed",
            "Failovers in the middle of a make-before-break migration (its new or old link died before the move was complete)",
            self.migrations_failed.clone(),
        );
        r.register(
            "hedges",
            "Standby links brought up because the upstream was slow to answer a PING (--hedge-after)",
            self.hedges.clone(),
        );
        r.register(
            "migration_duration_seconds",
            "Time from the trigger (lame-duck INFO, loss) to client traffic flowing on the new upstream",
            self.migration_seconds.clone(),
        );
        r.register(
            "subscriptions_replayed",
            "SUBs replayed on new upstream links",
            self.subs_replayed.clone(),
        );
    }

    /// Registers what the proxy did to messages: pulls re-sent, statuses shielded, duplicates, resends, slow consumers.
    fn register_delivery(&self, r: &mut Registry) {
        r.register(
            "pull_requests_reissued",
            "JetStream pull requests re-sent by the proxy",
            self.pulls_reissued.clone(),
        );
        r.register(
            "statuses_shielded",
            "JetStream statuses kept from clients because their library would turn them into errors, by code (409 Leadership Change or Server Shutdown, 503 no responders)",
            self.statuses_shielded.clone(),
        );
        r.register(
            "redeliveries_acked",
            "Redeliveries of messages the client had acked (its ack lost upstream), acked again by the proxy and kept from the client",
            self.redeliveries_acked.clone(),
        );
        r.register(
            "heartbeats_amended",
            "Push consumer idle heartbeats amended to name the client's last delivery instead of a redelivery kept from it",
            self.heartbeats_amended.clone(),
        );
        r.register(
            "duplicates_suppressed",
            "Messages delivered twice upstream (by both links during a migration, or sent again by a new consumer leader) and forwarded once",
            self.duplicates_suppressed.clone(),
        );
        r.register(
            "possible_duplicates",
            "Messages forwarded past the de-duplication bounds",
            self.possible_duplicates.clone(),
        );
        r.register(
            "publishes_resent",
            "Client publishes written again after the link they were written on died unconfirmed",
            self.publishes_resent.clone(),
        );
        r.register(
            "slow_consumers",
            "Clients closed as slow consumers",
            self.slow_consumers.clone(),
        );
    }

    /// Registers bytes, messages, buffers and the upstream round trip.
    fn register_traffic(&self, r: &mut Registry) {
        r.register("bytes", "Bytes relayed, by direction", self.bytes.clone());
        r.register(
            "messages",
            "Messages relayed, by direction",
            self.messages.clone(),
        );
        r.register(
            "buffered_bytes",
            "Bytes held in buffers now, by buffer",
            self.buffered_bytes.clone(),
        );
        r.register(
            "upstream_rtt_seconds",
            "Round trip of the proxy's PINGs to its upstreams",
            self.upstream_rtt_seconds.clone(),
        );
    }

    /// Registers sessions by state now, outages, and pull requests held.
    fn register_sessions(&self, r: &mut Registry) {
        r.register(
            "sessions_with_upstream",
            "Clients whose session has a working upstream now",
            self.sessions_with_upstream.clone(),
        );
        r.register(
            "sessions_migrating",
            "Client sessions moving off a lame-duck node now",
            self.sessions_migrating.clone(),
        );
        r.register(
            "sessions_without_upstream",
            "Client sessions in an outage now: their upstream lost without warning, no other node carrying their traffic yet",
            self.sessions_without_upstream.clone(),
        );
        r.register(
            "outage_duration_seconds",
            "How long outages lasted: from the upstream's loss to traffic on a new one (or to the client's close at --max-outage)",
            self.outage_seconds.clone(),
        );
        r.register(
            "pull_requests_unplaced",
            "JetStream pull requests the proxy holds unplaced now (their consumer away or moving, their link lost)",
            self.pulls_unplaced.clone(),
        );
        r.register(
            "pull_request_replacement_seconds",
            "Time from a pull request found lost (leader moved, link lost, heartbeats missed) to its placement again",
            self.pull_replacement_seconds.clone(),
        );
    }

    /// Registers the process: start time, readiness, version.
    fn register_process(&self, r: &mut Registry) {
        self.start_time_seconds.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        r.register(
            "start_time_seconds",
            "When this natsproxy process started, in Unix seconds (a change is a restart)",
            self.start_time_seconds.clone(),
        );
        r.register("ready", "1 when /readyz answers 200", self.ready.clone());
        // Which version runs where, across a fleet: one series, always 1.
        let build_info: Family<VersionLabel, Gauge> = Family::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register(
            "build_info",
            "1, labelled with the natsproxy version",
            build_info,
        );
    }

    /// Registers the client watch's gauges (`/livez/client`).
    fn register_client_watch(&self, r: &mut Registry) {
        r.register(
            "client_connected",
            "Client connections open now, by the client's CONNECT name",
            self.client_connected.clone(),
        );
        r.register(
            "client_consumer_pull_age_seconds",
            "Seconds since the client last sent a pull request for this JetStream consumer",
            self.client_consumer_pull_age.clone(),
        );
        r.register(
            "client_consumer_idle_seconds",
            "Seconds since the client last showed progress on this consumer: a pull request sent or still waiting (to its expiry), an ack",
            self.client_consumer_idle.clone(),
        );
        r.register(
            "client_consumer_unacked",
            "Deliveries of this consumer the client holds without having acked them (a slow downstream, or a stuck client)",
            self.client_consumer_unacked.clone(),
        );
        r.register(
            "client_live",
            "1 when /livez/client answers 200 (every watched client connected and consuming, or slow)",
            self.client_live.clone(),
        );
    }

    /// Statuses kept from clients, every code.
    pub fn statuses_shielded_total(&self) -> u64 {
        self.hot.shielded.iter().map(Counter::get).sum()
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Adds what a session counted since `before`.
    pub(crate) fn add_session(
        &self,
        before: &crate::session::SessionStats,
        now: &crate::session::SessionStats,
    ) {
        let add = |c: &Counter, a: u64, b: u64| {
            if b > a {
                c.inc_by(b - a);
            }
        };
        add(&self.migrations, before.migrations, now.migrations);
        add(&self.failovers, before.failovers, now.failovers);
        add(
            &self.migrations_failed,
            before.migrations_failed,
            now.migrations_failed,
        );
        add(&self.hedges, before.hedges, now.hedges);
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
        for (i, c) in self.hot.shielded.iter().enumerate() {
            add(c, before.statuses_shielded[i], now.statuses_shielded[i]);
        }
        add(
            &self.redeliveries_acked,
            before.redeliveries_acked,
            now.redeliveries_acked,
        );
        add(
            &self.heartbeats_amended,
            before.heartbeats_amended,
            now.heartbeats_amended,
        );
        add(
            &self.hot.msgs_to_client,
            before.msgs_to_client,
            now.msgs_to_client,
        );
        add(
            &self.hot.msgs_to_upstream,
            before.msgs_to_upstream,
            now.msgs_to_upstream,
        );
        if let Some(t) = now.last_switch {
            self.max_switch_us
                .fetch_max(t.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_names_the_running_version() {
        let text = Stats::new().encode();
        let line = format!(
            "natsproxy_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == line), "{text}");
    }
}
