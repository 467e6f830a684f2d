//! The per-client state machine: pure, sans-io. It takes client bytes, upstream bytes,
//! connection events and `now`, and returns [`Action`]s for the driver to carry out.
//!
//! # Parts
//!
//! `Session` routes events between parts that each own their data and its bounds:
//! - `ClientSide` (`client_side.rs`): the client's connection: state, CONNECT, decoder, owed
//!   replies, output;
//! - `Dialing` (`dialing.rs`): when to dial, backoff, refusals, the dial window, the
//!   `-ERR` log;
//! - `Links`, `NodePool`, `SubTable`, `Phase`, `Overlap` (de-dup across links) and
//!   `Backlog` (client traffic not yet confirmed);
//! - `JetStream` (`jetstream/mod.rs`): pull requests, deliveries and acks, consumer
//!   activity;
//! - `Outbox` (`action.rs`): actions and events for the driver; `SessionStats`.
//!
//! Five files hold `impl Session`, each a routing concern that reaches several parts:
//! this one (the driver's API and the relay's fast path), `client.rs` (the client's ops
//! and what goes to it), `upstream.rs` (a link's ops, its handshake and replay, its
//! loss), `phase.rs` (the transitions of the diagram below) and `timers.rs` (the timer
//! table). Everything inside one part is that part's own `impl`.
//!
//! # Links
//!
//! A session has up to three upstream links, each with its own [`Epoch`]:
//! - **primary**: receives the client's traffic;
//! - **standby**: being brought up (dial → INFO → CONNECT+PING → SUB replay → PING);
//! - **retiring**: the old primary after a switch, until it has been drained.
//!
//! Events from an epoch that holds none of these roles are dropped, never routed.
//!
//! # Phases
//!
//! The session's `Phase` (`phase.rs`, and a migration's `Step`), in the words
//! the code uses:
//!
//! ```text
//!  Starting ── dial ─► standby: AwaitInfo ─INFO─► (client INFO sent once) ─client CONNECT─┐
//!     │ each node failed once, no INFO yet ─► closed (the client's own retry takes over)  ▼
//!     │            CONNECT, PING, replay SUBs (same sid/subject/queue, max − delivered), PING
//!     └───────────────────────────────── promote (backlog flushed) ─► Steady
//!
//!  Steady ─ lame duck (INFO ldm:true on primary A; A's deliveries are remembered from
//!  here on: the overlap is live) ─► Migrating(Preparing): dial B after a random part of
//!  `migration_spread`; B established (replay written, B attached to the overlap: both
//!  deliver, B's copies held back)
//!    ─ B's replay PONG (its SUBs are registered) ─► Switching: barrier PING on A, client
//!      traffic waits in the backlog
//!    ─ A's PONG (all earlier publishes processed) ─► Draining: A retiring, B primary,
//!      backlog flushed to B
//!    ─ the settle delay after B's replay PONG ─► UNSUB on A, with a PING, every sid B has
//!      proved (a copy of something A delivered) or that can prove nothing (queue group,
//!      pull inbox); the others are kept on A (Drain), each leaving at its proof; that
//!      PONG ends A's side of those sids (B's held copies go out)
//!    ─ the PONG after the last UNSUBs, A closed by its server, or B's own lame duck
//!      (everything leaves A at once) ─► finish_migration: Steady; the overlap lingers,
//!      matching B's late copies for a settle delay or until B caught up (at most
//!      LINGER_MAX), also through a hedge or a migration that starts meanwhile
//!
//!  Steady ─ the primary's PING unanswered for hedge_after, counted from the start of
//!  Steady at the earliest (idle links are PINGed every HEDGE_KEEPALIVE) ─► Hedging: a
//!  standby on another node, attached to the overlap in hedged delivery: each message
//!  goes out from whichever link delivers it first, its copy from the other is dropped;
//!  once the standby is up, the client's pull requests go through it (once) and its
//!  acks through both
//!    ─ the primary's PONG ─► Steady: the standby closed; the primary's copies of what
//!      the standby gave still dropped (the overlap lingers until it caught up)
//!    ─ the primary lost or stale ─► Outage, and at once Steady on the standby if it is up
//!      (the overlap lingers, matching the standby's late copies of the primary's)
//!
//!  Steady or Migrating ─ primary lost (closed, reset, garbage, or stale: a PING
//!  unanswered for ping_interval × max_pings_out) ─► Outage: the client stays connected,
//!  its owed PONGs are answered, publishes the dead link never confirmed go back to the
//!  front of the backlog; dial another node (backoff from backoff_min to backoff_max,
//!  jittered) ─► promote: Steady, every tracked pull request placed again.
//!  Outage for max_outage ─► -ERR to the client and close.
//!
//!  A link that closes before its handshake PONG never took our CONNECT: its publishes
//!  wait again in the backlog (it processed nothing), and the next node is dialled after
//!  a backoff (never at once). If its server gave an -ERR first, it refused the CONNECT:
//!  the client's PINGs wait again too (else they are answered, as in any outage). Credentials refused, or each known node refused once, with no accepted
//!  primary left ─► that -ERR to the client and close (UpstreamRefused). Whatever the
//!  cause, a session dials at most MAX_DIALS_PER_WINDOW times per DIAL_WINDOW.
//! ```

// No clock here (clippy.toml): `now` comes with every event. Tests may make up times.
#![cfg_attr(not(test), deny(clippy::disallowed_methods))]

mod action;
mod backlog;
mod client;
mod client_side;
mod dedup;
mod dialing;
mod jetstream;
mod link;
mod links;
mod overlap;
mod phase;
mod pool;
mod replies;
mod session_config;
mod stats;
mod subs;
mod timers;
mod upstream;

pub use action::{Action, CloseReason, Epoch};
pub use backlog::{CONFIRM_BYTES, CONFIRM_DELAY, MAX_UNCONFIRMED};
pub use dialing::{DIAL_WINDOW, MAX_DIALS_PER_WINDOW};
pub use jetstream::consuming::{ConsumerActivity, Consuming, MAX_WATCHED_CONSUMERS};
pub use session_config::*;
pub use stats::{MoveReason, SessionEvent, SessionStats, MAX_EVENTS, SHIELDED_CODES};

#[cfg(test)]
mod tests;

use bytes::BytesMut;
use std::time::{Duration, Instant};
use tracing::warn;

use self::action::Outbox;
use self::backlog::Backlog;
use self::client_side::{ClientSide, ClientState};
use self::dialing::Dialing;
use self::jetstream::acks::{Recipient, Seen};
use self::jetstream::JetStream;
use self::link::{Link, LinkState};
use self::links::{Links, Role};
use self::overlap::Overlap;
use self::phase::Phase;
use self::pool::NodePool;
use self::subs::SubTable;

/// The pure per-client state machine; the phase diagram is in the module docs.
///
/// # Call order (for the driver)
///
/// Methods are of four kinds, as in quinn-proto: getters; `handle_*` for incoming events
/// (client bytes, upstream bytes, a dial that connected or failed, a lost link, a due
/// timer); `shutdown`; and `poll_*`/`take_*` for what the driver must do. After every
/// `handle_*` call: first [`take_client_output`](Session::take_client_output) (bytes for
/// the client, in order, before any action), then [`poll_action`](Session::poll_action)
/// until `None`, then [`poll_event`](Session::poll_event) for metrics, then
/// [`poll_timeout`](Session::poll_timeout) to arm the timer. Report
/// `handle_upstream_connected` before the first `handle_upstream_bytes` of an epoch. Call
/// `handle_timeout` when the deadline is reached, and also when the clock passed it while
/// other events kept the driver busy: it fires every timer that is due.
///
/// Client traffic that cannot be written (no established primary, or a switch barrier
/// pending) waits in the backlog, bounded with the primary's unconfirmed data by
/// `max_backlog` bytes; past it the driver stops reading the client. The client's PINGs go
/// upstream and its PONG is relayed when the upstream answers, so a PONG proves that
/// everything before it reached the server (during an outage they are answered at once).
/// Publishes written upstream are kept until a PONG confirms them; the proxy's own
/// confirmation PING goes out `CONFIRM_DELAY` (20 ms) after the first unconfirmed one, or
/// at once past `CONFIRM_BYTES` (64 KiB), so a request/reply client does not pay a PING per
/// request. A link that dies takes at most that window of publishes to be written again.
pub struct Session {
    cfg: SessionConfig,
    /// The client's connection: its state, CONNECT, decoder, owed replies, output.
    client: ClientSide,
    subs: SubTable,
    pool: NodePool,
    links: Links,
    phase: Phase,
    overlap: Overlap,
    /// When to dial next, the backoff, refusals, the dial window.
    dialing: Dialing,
    backlog: Backlog,
    /// Actions and metric events for the driver.
    out: Outbox,
    /// The `now` of the event being handled.
    now: Instant,
    stats: SessionStats,
    /// Pull requests, deliveries and acks, per-consumer activity.
    js: JetStream,
}

impl Session {
    /// A session for a freshly accepted client; the first action dials an upstream.
    pub fn new(cfg: SessionConfig, now: Instant) -> Session {
        let (dialing, pool_seed) = Dialing::new(cfg.seed);
        let pool = NodePool::new(&cfg.upstreams).seeded(pool_seed);
        let mut s = Session {
            cfg,
            client: ClientSide::new(),
            subs: SubTable::default(),
            pool,
            links: Links::default(),
            phase: Phase::Starting { failures: 0 },
            overlap: Overlap::default(),
            dialing,
            backlog: Backlog::default(),
            out: Outbox::default(),
            now,
            stats: SessionStats::default(),
            js: JetStream::default(),
        };
        s.start_dial();
        s
    }

    /// The next action for the driver, in order.
    ///
    /// Bytes for the client are gathered into one buffer and come first, as one
    /// `ToClient`: nothing queued for the client ever has to wait for another action.
    pub fn poll_action(&mut self) -> Option<Action> {
        if !self.client.out.is_empty() {
            return Some(Action::ToClient(self.client.out.split().freeze()));
        }
        self.out.actions.pop_front()
    }

    /// Moves what is queued for the client to the end of `dst` (the driver's write
    /// buffer): a swap when `dst` is empty, so relayed bytes are copied once in all.
    /// Call before [`poll_action`](Self::poll_action).
    pub fn take_client_output(&mut self, dst: &mut BytesMut) {
        self.client.take_output(dst);
    }

    /// True while the driver may read more from the client.
    pub fn wants_client_input(&self) -> bool {
        let unconfirmed = self.links.primary().map_or(0, |p| p.unconfirmed_bytes);
        self.client.is_open()
            && unconfirmed < MAX_UNCONFIRMED
            && self.backlog.bytes() + unconfirmed < self.cfg.max_backlog
    }

    /// How many other sessions of this process are moving off a lame-duck node now; the
    /// driver tells, before upstream bytes, so that a migration spreads its dial over a
    /// window that grows with them (see [`MIGRATION_DIAL_RATE`]).
    pub fn set_peers_moving(&mut self, n: usize) {
        self.dialing.set_peers_moving(n);
    }

    /// True while the session is moving off a lame-duck node.
    pub fn is_migrating(&self) -> bool {
        matches!(self.phase, Phase::Migrating(..))
    }

    /// True once the session has closed the client; the driver ends after flushing.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The client's live subscriptions.
    pub fn subscriptions(&self) -> &SubTable {
        &self.subs
    }

    /// Counters so far.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// True once the client connected (sent CONNECT, or another op first), until it is
    /// closed.
    pub fn is_client_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// Whether the client consumes: it subscribed to a subject other than a reply inbox,
    /// or pulled from a JetStream consumer. A client that only publishes and requests
    /// is not watched (`/livez/client`).
    pub fn consumes(&self) -> bool {
        self.client.subscribed || !self.js.consuming.consumers().is_empty()
    }

    /// When the client last pulled, acked and got deliveries, per JetStream consumer.
    pub fn consuming(&self) -> &Consuming {
        &self.js.consuming
    }

    /// The name the client gave in its CONNECT, once it has.
    pub fn client_name(&self) -> Option<&str> {
        self.client.opts.name.as_deref()
    }

    /// The address of the current primary upstream, if any.
    pub fn upstream_addr(&self) -> Option<&str> {
        self.links.primary().map(|l| l.addr.as_str())
    }

    /// The next event for metrics.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.out.poll_event()
    }

    fn event(&mut self, e: SessionEvent) {
        self.out.event(e);
    }

    /// True in an outage: the primary was lost without warning and no other link carries
    /// the client's traffic yet.
    pub fn in_outage(&self) -> bool {
        matches!(self.phase, Phase::Outage { .. })
    }

    /// Pull requests held unplaced now (their consumer away or moved, their link lost).
    pub fn pulls_unplaced(&self) -> usize {
        self.js.pulls_unplaced()
    }

    /// True when the client's traffic has a working upstream now.
    pub fn has_upstream(&self) -> bool {
        self.links.primary().is_some_and(Link::established)
    }

    /// Bytes waiting in the backlog and held back during an overlap.
    pub fn buffered(&self) -> (usize, usize) {
        (self.backlog.bytes(), self.overlap.held_bytes())
    }

    fn stale_after(&self) -> Duration {
        self.cfg.ping_interval * self.cfg.max_pings_out
    }

    /// Bytes read from the client: decodes and handles every complete op in `buf`.
    pub fn handle_client_bytes(&mut self, buf: &mut BytesMut, now: Instant) {
        self.now = now;
        // Fast path: `buf[..run]` holds `msgs` plain publishes, seen in place and written
        // upstream as one frame, kept as one until confirmed, before anything after them
        // is handled (order) and before returning.
        let (mut run, mut msgs) = (0, 0);
        // Only an op on the full path changes what `plain_publishes` looks at.
        let mut plain = self.plain_publishes();
        while self.client.is_open() {
            if let Some(v) = plain
                .then(|| self.client.dec.peek_pub(&buf[run..]))
                .flatten()
            {
                let subject = &buf[run..][v.subject.range()];
                // JetStream's own (acks, pull requests, API calls) take the full path.
                if !subject.starts_with(b"$JS.")
                    && (v.reply.is_none() || !jetstream::is_pull_subject(subject))
                {
                    run += v.frame_len;
                    msgs += 1;
                    continue;
                }
            }
            if run > 0 {
                self.send_publish_run(buf, run, msgs);
                (run, msgs) = (0, 0);
            }
            match self.client.dec.decode(buf) {
                Ok(Some(op)) => {
                    self.handle_client_op(op, now);
                    plain = self.plain_publishes();
                }
                Ok(None) => break,
                Err(e) => {
                    self.client_protocol_error(e);
                    break;
                }
            }
        }
        if run > 0 {
            self.send_publish_run(buf, run, msgs);
        }
        self.confirm_publishes();
    }

    /// Whether a plain publish needs nothing but to be written to the primary: connected,
    /// neither verbose nor pedantic, no own publish to remember (`echo: false` during an
    /// overlap), and the primary taking traffic with nothing queued before it.
    fn plain_publishes(&self) -> bool {
        let o = &self.client.opts;
        self.client.state == ClientState::Connected
            && !o.verbose
            && !o.pedantic
            && (o.echo || self.overlap.live().is_none())
            && self.backlog.is_empty()
            && !self.switching()
            && self.links.primary().is_some_and(Link::established)
    }

    /// The fast path's run of `msgs` publishes, `buf[..run]`, goes upstream as one frame.
    fn send_publish_run(&mut self, buf: &mut BytesMut, run: usize, msgs: u32) {
        self.stats.msgs_to_upstream += u64::from(msgs);
        let frames = buf.split_to(run).freeze();
        self.send_publish(backlog::Pending::Data(frames, msgs));
    }

    /// The client closed its connection (or it failed).
    pub fn handle_client_closed(&mut self) {
        self.close_client(CloseReason::ClientGone);
    }

    /// The proxy is shutting down: close the client and upstreams.
    pub fn shutdown(&mut self) {
        self.close_client(CloseReason::Shutdown);
    }

    /// The TCP connection of `epoch` is established.
    pub fn handle_upstream_connected(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        let interval = self.cfg.keepalive_interval();
        if let Some(role) = self.role_of(epoch) {
            if let Some(l) = self.link_mut(role) {
                l.state = LinkState::AwaitInfo;
                l.keepalive_at = now + interval;
            }
        }
    }

    /// Bytes read from the upstream of `epoch`.
    pub fn handle_upstream_bytes(&mut self, epoch: Epoch, buf: &mut BytesMut, now: Instant) {
        self.now = now;
        // `buf[..run]`: frames already handled on the fast path, still to be copied to the
        // client in one piece, before anything else is (order) and before returning.
        let mut run = 0;
        loop {
            let Some(role) = self.role_of(epoch) else {
                buf.clear();
                return;
            };
            // Fast path: a plain MSG that goes to the client as it is. Everything it
            // changes (counts, auto-unsubscribe, pull credit) is done here and now, in
            // order; only its bytes wait for the end of the run.
            let plain = !self.client.is_closed() && !self.overlap.filters(epoch);
            let peeked = match self.link(role) {
                Some(l) if plain => l.decoder.peek_msg(&buf[run..]),
                _ => None,
            }
            .filter(|v| {
                // A delivery the client already has goes the full path (which keeps it
                // back); a new one is remembered here, as it goes to the client.
                let frame = &buf[run..];
                v.reply.is_none_or(|r| {
                    self.seen(&frame[v.sid.range()], &frame[r.range()]) == Seen::New
                })
            });
            if let Some(v) = peeked {
                let sid = &buf[run..][v.sid.range()];
                if !self.js.pulls.is_empty() {
                    let reply = v.reply.map(|r| &buf[run..][r.range()]);
                    self.js.pulls.on_delivery(sid, reply, v.size(), now);
                    self.report_replaced_pulls();
                }
                self.subs.delivered(sid);
                self.stats.msgs_to_client += 1;
                run += v.frame_len;
                continue;
            }
            if run > 0 {
                self.client.out.extend_from_slice(&buf[..run]);
                bytes::Buf::advance(buf, run);
                run = 0;
            }
            let Some(l) = self.link_mut(role) else { return };
            match l.decoder.decode(buf) {
                Ok(Some(op)) => self.on_upstream_op(epoch, role, op),
                Ok(None) => return,
                Err(e) => {
                    warn!(%epoch, error = %e, "protocol violation from upstream");
                    buf.clear();
                    return self.link_lost(epoch, MoveReason::Protocol);
                }
            }
        }
    }

    /// What a delivery on `sid` with `reply` is to the client ([`Deliveries`]); a new one
    /// is remembered as the client's.
    fn seen(&mut self, sid: &[u8], reply: &[u8]) -> Seen {
        let to = match self.subs.get(sid).and_then(|s| s.queue.as_deref()) {
            Some(q) => Recipient::Queue(q),
            None => Recipient::Sub(sid),
        };
        self.js.seen(to, reply, self.now)
    }

    /// The dial of `epoch` was not made (the process's dial budget is spent). Not the
    /// node's fault: the session dials again after its backoff.
    pub fn handle_dial_refused(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        if self.role_of(epoch) != Some(Role::Standby) {
            return;
        }
        self.links.take(Role::Standby);
        self.standby_gone();
        self.schedule_dial();
    }

    /// The upstream connection of `epoch` closed or failed to connect.
    pub fn handle_upstream_lost(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        self.link_lost(epoch, MoveReason::Closed);
    }
}
