//! A driver's share of the process-wide metrics: what it last added to the gauges and
//! counters of [`Stats`], so that each report adds only what changed and the driver's
//! end takes its share out again.

use crate::metrics::{NodeLabel, ReasonLabel};
use crate::session::{Session, SessionEvent, SessionStats};

use super::Stats;

/// What one driver holds right now, as it reports it.
pub(super) struct Holding {
    /// Bytes in the client's write buffer.
    pub client_out: usize,
    /// Bytes in the upstream links' write buffers.
    pub upstream_out: usize,
    /// Bytes the client sent, and the upstreams, since the driver started.
    pub bytes_to_client: u64,
    pub bytes_to_upstream: u64,
}

/// What this driver last reported.
#[derive(Default)]
pub(super) struct Reported {
    stats: SessionStats,
    /// Client write buffer, upstream write buffers, backlog, hold (`Stats::hot.buffers`).
    buffers: [i64; 4],
    has_upstream: bool,
    migrating: bool,
    outage: bool,
    unplaced: i64,
    bytes_to_client: u64,
    bytes_to_upstream: u64,
}

impl Reported {
    /// Adds what changed since the last report (cheap: a few compares; atomics only for
    /// what changed) and records the session's events.
    pub fn sync(&mut self, st: &Stats, session: &mut Session, h: Holding) {
        let now = session.stats();
        if *now != self.stats {
            st.add_session(&self.stats, now);
            self.stats = now.clone();
        }
        while let Some(e) = session.poll_event() {
            match e {
                SessionEvent::Moved { reason, took } => {
                    let l = ReasonLabel {
                        reason: reason.to_string(),
                    };
                    st.migrations_by_reason.get_or_create(&l).inc();
                    st.migration_seconds
                        .get_or_create(&l)
                        .observe(took.as_secs_f64());
                    st.record_switch(took);
                }
                SessionEvent::Rtt(d) => st.upstream_rtt_seconds.observe(d.as_secs_f64()),
                SessionEvent::OutageEnded(d) => st.outage_seconds.observe(d.as_secs_f64()),
                SessionEvent::PullReplaced(d) => {
                    st.pull_replacement_seconds.observe(d.as_secs_f64())
                }
            }
        }
        let (backlog, hold) = session.buffered();
        let cur = [h.client_out, h.upstream_out, backlog, hold].map(|v| v as i64);
        for (i, (&c, r)) in cur.iter().zip(self.buffers.iter_mut()).enumerate() {
            if c != *r {
                st.hot.buffers[i].inc_by(c - *r);
                *r = c;
            }
        }
        flip(
            &st.sessions_with_upstream,
            &mut self.has_upstream,
            session.has_upstream(),
        );
        flip(
            &st.sessions_migrating,
            &mut self.migrating,
            session.is_migrating(),
        );
        flip(
            &st.sessions_without_upstream,
            &mut self.outage,
            session.in_outage(),
        );
        let unplaced = session.pulls_unplaced() as i64;
        if unplaced != self.unplaced {
            st.pulls_unplaced.inc_by(unplaced - self.unplaced);
            self.unplaced = unplaced;
        }
        if h.bytes_to_client != self.bytes_to_client {
            st.hot
                .bytes_to_client
                .inc_by(h.bytes_to_client - self.bytes_to_client);
            self.bytes_to_client = h.bytes_to_client;
        }
        if h.bytes_to_upstream != self.bytes_to_upstream {
            st.hot
                .bytes_to_upstream
                .inc_by(h.bytes_to_upstream - self.bytes_to_upstream);
            self.bytes_to_upstream = h.bytes_to_upstream;
        }
    }

    /// Takes this driver's share out of the gauges when it ends (its links are counted
    /// out one by one with [`link_closed`]).
    pub fn withdraw(&mut self, st: &Stats) {
        for (i, r) in self.buffers.iter_mut().enumerate() {
            st.hot.buffers[i].dec_by(*r);
            *r = 0;
        }
        flip(&st.sessions_with_upstream, &mut self.has_upstream, false);
        flip(&st.sessions_migrating, &mut self.migrating, false);
        flip(&st.sessions_without_upstream, &mut self.outage, false);
        st.pulls_unplaced.dec_by(self.unplaced);
        self.unplaced = 0;
    }
}

/// Counts this driver in or out of `gauge` when `now` differs from what it reported.
fn flip(gauge: &prometheus_client::metrics::gauge::Gauge, reported: &mut bool, now: bool) {
    if now != *reported {
        if now {
            gauge.inc();
        } else {
            gauge.dec();
        }
        *reported = now;
    }
}

/// A link to `node` was made.
pub(super) fn link_opened(st: &Stats, node: &str) {
    st.upstream_connects.inc();
    st.upstream_connections
        .get_or_create(&NodeLabel { node: node.into() })
        .inc();
}

/// A link to `node` ended.
pub(super) fn link_closed(st: &Stats, node: &str) {
    st.upstream_connections
        .get_or_create(&NodeLabel { node: node.into() })
        .dec();
}
