//! The per-client state machine: pure, sans-io. It takes client bytes, upstream bytes,
//! connection events and `now`, and returns [`Action`]s for the driver to carry out.
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
//! ```text
//!  new() ─► Dial ─► standby: AwaitInfo ─INFO─► (client INFO sent once) ─client CONNECT─┐
//!                                                                                     ▼
//!          CONNECT, PING, replay SUBs (same sid/subject/queue, max − delivered), PING ─► promoted
//!          to primary at once when there is none (start-up, failover); backlog flushed
//!
//!  lame duck (INFO ldm:true on primary A), make-before-break (A's deliveries are
//!  remembered from here on for the overlap de-dup):
//!   Dial B ─► B established (replay written; B attached to the de-dup: both deliver)
//!     ─ B's replay PONG (its SUBs are registered) ─► switch barrier: PING on A; client
//!       traffic waits in the backlog ─ A's PONG (all earlier publishes processed) ─►
//!       SWITCH: A retiring, B primary, backlog flushed to B
//!     ─ settle delay after B's replay PONG (interest propagates through the cluster) ─►
//!       UNSUB every sid on A + PING ─ A's PONG (A delivers nothing more) ─► A closed;
//!       A's de-dup entries linger one settle delay for B's late copies; done
//!
//!  hard failover (primary closed, reset, garbage, or stale: a PING unanswered for
//!  ping_interval × max_pings_out):
//!   client stays connected; its owed PONGs are answered; publishes not confirmed by a
//!   PONG on the dead link go back to the front of the backlog; dial another node
//!   (backoff doubling from backoff_min to backoff_max, jittered) ─► promoted as above.
//!   No upstream for max_outage ─► -ERR to the client and close.
//! ```
//!
//! Client traffic that cannot be written (no established primary, or a switch barrier
//! pending) waits in the backlog, bounded with the primary's unconfirmed data by
//! `max_backlog` bytes; past it the driver stops reading the client. The client's PINGs go
//! upstream and its PONG is relayed when the upstream answers, so a PONG proves that
//! everything before it reached the server (during an outage they are answered at once).
//! Publishes written upstream are kept until a PONG confirms them; the proxy's own
//! confirmation PING goes out `CONFIRM_DELAY` (20 ms) after the first unconfirmed one, or
//! at once past `CONFIRM_BYTES` (64 KiB), so a request/reply client does not pay a PING per
//! request. A link that dies takes at most that window of publishes to be written again.

// No clock here (clippy.toml): `now` comes with every event. Tests may make up times.
#![cfg_attr(not(test), deny(clippy::disallowed_methods))]

pub mod action;
pub mod dedup;
pub mod jetstream;
pub mod link;
pub mod pool;
pub mod replies;
pub mod subs;

use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

use crate::auth::{ClientAuth, Credentials, NkeySeed};
use crate::proto::json::{ClientOptions, ServerInfo};
use crate::proto::{
    encode, subject, ClientDecoder, ClientOp, Limits, Message, ProtoError, ServerErr, ServerOp,
};
pub use action::{Action, CloseReason, Epoch};
use dedup::Dedup;
use jetstream::acks::AckMemory;
use jetstream::{PullAction, PullTracker, Shield};
use link::{Link, LinkState, PingOwner};
use pool::NodePool;
use replies::{Ready, ReplyQueue};
use subs::SubTable;

/// Longest a publish waits for its confirmation PING (see `confirm_publishes`).
pub const CONFIRM_DELAY: Duration = Duration::from_millis(20);
/// Unconfirmed publish bytes that get their confirmation PING at once.
pub const CONFIRM_BYTES: usize = 64 * 1024;
/// Default interval between the proxy's keepalive PINGs upstream.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(2);
/// Default bound of client bytes held while no upstream can take them.
pub const DEFAULT_MAX_BACKLOG: usize = 8 * 1024 * 1024;
/// Default time the new link's subscriptions get to propagate before the old link's go.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(250);
/// Default window over which the sessions of one proxy spread their dials to a new node
/// when their node goes lame duck (each waits a random part of it): 1,000 clients of a
/// shared proxy do not dial the remaining nodes in the same millisecond. nats-server
/// starts closing lame-duck clients after its grace period (10 s by default), so this
/// stays well inside it.
pub const DEFAULT_MIGRATION_SPREAD: Duration = Duration::from_millis(250);
/// Default time without any upstream before the client is closed.
pub const DEFAULT_MAX_OUTAGE: Duration = Duration::from_secs(120);
/// First reconnect delay after the immediate attempt.
pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Largest reconnect delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Static configuration of a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Upstream addresses (`host:port`) in order of preference.
    pub upstreams: Vec<String>,
    /// Credentials the proxy presents upstream instead of the client's.
    pub credentials: Option<Credentials>,
    /// The proxy's own key: signs each upstream nonce into `proxy_sig` (trusted proxies).
    pub proxy_key: Option<NkeySeed>,
    /// Credentials clients must present to the proxy (then never passed upstream).
    pub client_auth: Option<ClientAuth>,
    /// Interval of the proxy's keepalive PINGs upstream.
    pub ping_interval: Duration,
    /// A link with a PING unanswered for `ping_interval * max_pings_out` is stale.
    pub max_pings_out: u32,
    /// Bound of client bytes buffered while they cannot be written or are unconfirmed.
    pub max_backlog: usize,
    /// Time the new link's subscriptions get to propagate before the old ones are removed.
    pub settle: Duration,
    /// Time without any upstream before the client is closed with `-ERR`.
    pub max_outage: Duration,
    /// A lame-duck migration dials after a random delay below this (zero: at once).
    pub migration_spread: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Bound of the overlap de-duplication memory (fingerprints).
    pub max_dedup_entries: usize,
    /// Bound of bytes held back from the new link during an overlap.
    pub max_hold_bytes: usize,
    /// Seed of the backoff jitter.
    pub seed: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            upstreams: vec!["127.0.0.1:4222".into()],
            credentials: None,
            proxy_key: None,
            client_auth: None,
            ping_interval: DEFAULT_PING_INTERVAL,
            max_pings_out: 2,
            max_backlog: DEFAULT_MAX_BACKLOG,
            settle: DEFAULT_SETTLE,
            max_outage: DEFAULT_MAX_OUTAGE,
            migration_spread: DEFAULT_MIGRATION_SPREAD,
            backoff_min: DEFAULT_BACKOFF_MIN,
            backoff_max: DEFAULT_BACKOFF_MAX,
            max_dedup_entries: dedup::DEFAULT_MAX_ENTRIES,
            max_hold_bytes: dedup::DEFAULT_MAX_HOLD_BYTES,
            seed: 0,
        }
    }
}

/// Why the session moved (or is moving) to another upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The node announced lame duck mode.
    LameDuck,
    /// The connection closed or reset.
    Closed,
    /// The node stopped answering PINGs.
    Stale,
    /// The node sent something that is not NATS protocol.
    Protocol,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::LameDuck => "ldm",
            Reason::Closed => "closed",
            Reason::Stale => "stale",
            Reason::Protocol => "protocol",
        })
    }
}

/// Counters of one session (the driver adds them to the process-wide metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Completed make-before-break switches.
    pub migrations: u64,
    /// Primaries lost without warning.
    pub failovers: u64,
    /// SUBs written in replays.
    pub subs_replayed: u64,
    /// Overlap duplicates dropped.
    pub duplicates_suppressed: u64,
    /// Messages forwarded after the de-dup bound was reached.
    pub possible_duplicates: u64,
    /// Own messages dropped for echo:false clients.
    pub echoes_suppressed: u64,
    /// Unconfirmed publishes written again after a link died.
    pub publishes_resent: u64,
    /// Time from lame-duck INFO to switch of the last migration.
    pub last_switch: Option<Duration>,
    /// JetStream pull requests re-sent by the proxy.
    pub pulls_reissued: u64,
    /// Redeliveries of messages the client had acked, acked again by the proxy.
    pub redeliveries_acked: u64,
    /// Statuses kept from the client (503 and others its library turns into errors).
    pub statuses_shielded: u64,
    /// Messages relayed to the client.
    pub msgs_to_client: u64,
    /// Messages (publishes) relayed upstream.
    pub msgs_to_upstream: u64,
}

/// Something the driver reports to metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// Client traffic flows on a new upstream: trigger-to-switch time.
    Moved { reason: Reason, took: Duration },
    /// Round trip of a keepalive PING.
    Rtt(Duration),
}

/// Client-facing progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// Our INFO has not been sent (no upstream INFO yet).
    NoInfo,
    /// INFO sent, no CONNECT (nor other op) received yet.
    AwaitConnect,
    /// The client connected (explicitly or by sending another op first).
    Connected,
    /// Closed; everything further is ignored.
    Closed,
}

/// A client op waiting for a primary that accepts traffic.
#[derive(Debug)]
enum Pending {
    /// A client publish, kept until confirmed.
    Data(Bytes),
    /// A publish the proxy does not keep for re-sending (pull requests: the tracker does).
    Untracked(Bytes),
    Ping,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Primary,
    Standby,
    Retiring,
}

/// A move in progress.
#[derive(Debug)]
struct Migration {
    reason: Reason,
    started: Instant,
    from: String,
}

/// The pure per-client state machine. See the module docs for the phase diagram.
pub struct Session {
    cfg: SessionConfig,
    client_state: ClientState,
    opts: ClientOptions,
    client_dec: ClientDecoder,
    replies: ReplyQueue,
    subs: SubTable,
    pool: NodePool,
    primary: Option<Link>,
    standby: Option<Link>,
    retiring: Option<Link>,
    /// A switch barrier PING is outstanding on the primary.
    switching: bool,
    /// When to UNSUB everything on the retiring link.
    drain_at: Option<Instant>,
    drain_sent: bool,
    migration: Option<Migration>,
    dedup: Option<Dedup<Message>>,
    linger_until: Option<Instant>,
    outage_since: Option<Instant>,
    dial_at: Option<Instant>,
    attempts: u32,
    /// Dial failures before the client ever got an INFO.
    initial_failures: usize,
    next_epoch: u64,
    backlog: VecDeque<Pending>,
    backlog_bytes: usize,
    /// Publishes written to the primary since the last confirmation PING.
    unpinged: bool,
    /// When the confirmation PING for `unpinged` publishes is due.
    confirm_at: Option<Instant>,
    actions: VecDeque<Action>,
    /// Bytes for the client, in order (see `poll_action`).
    client_out: BytesMut,
    /// The `now` of the event being handled.
    now: Instant,
    rng: fastrand::Rng,
    stats: SessionStats,
    pulls: PullTracker,
    acks: AckMemory,
    /// Re-issue every tracked pull request once a new primary is up (hard failover).
    reissue_pulls: bool,
    /// Events for metrics; bounded (oldest dropped past [`MAX_EVENTS`]).
    events: VecDeque<SessionEvent>,
}

/// Bound of undrained metric events.
pub const MAX_EVENTS: usize = 64;

impl Session {
    /// A session for a freshly accepted client; the first action dials an upstream.
    pub fn new(cfg: SessionConfig, now: Instant) -> Session {
        let pool = NodePool::new(&cfg.upstreams);
        let rng = fastrand::Rng::with_seed(cfg.seed);
        let mut s = Session {
            cfg,
            client_state: ClientState::NoInfo,
            opts: ClientOptions::default(),
            client_dec: ClientDecoder::new(Limits::default()),
            replies: ReplyQueue::default(),
            subs: SubTable::default(),
            pool,
            primary: None,
            standby: None,
            retiring: None,
            switching: false,
            drain_at: None,
            drain_sent: false,
            migration: None,
            dedup: None,
            linger_until: None,
            outage_since: None,
            dial_at: None,
            attempts: 0,
            initial_failures: 0,
            next_epoch: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            unpinged: false,
            confirm_at: None,
            actions: VecDeque::new(),
            client_out: BytesMut::new(),
            now,
            rng,
            stats: SessionStats::default(),
            pulls: PullTracker::default(),
            acks: AckMemory::default(),
            reissue_pulls: false,
            events: VecDeque::new(),
        };
        s.start_dial();
        s
    }

    /// The next action for the driver, in order.
    ///
    /// Bytes for the client are gathered into one buffer and come first, as one
    /// `ToClient`: nothing queued for the client ever has to wait for another action.
    pub fn poll_action(&mut self) -> Option<Action> {
        if !self.client_out.is_empty() {
            return Some(Action::ToClient(self.client_out.split().freeze()));
        }
        self.actions.pop_front()
    }

    /// Moves what is queued for the client to the end of `dst` (the driver's write
    /// buffer): a swap when `dst` is empty, so relayed bytes are copied once in all.
    /// Call before [`poll_action`](Self::poll_action).
    pub fn take_client_output(&mut self, dst: &mut BytesMut) {
        if dst.is_empty() {
            std::mem::swap(dst, &mut self.client_out);
        } else {
            dst.extend_from_slice(&self.client_out);
            self.client_out.clear();
        }
    }

    /// The earliest moment `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.client_state == ClientState::Closed {
            return None;
        }
        let stale_after = self.stale_after();
        let links = [&self.primary, &self.standby, &self.retiring];
        let link_times = links.into_iter().flatten().flat_map(|l| {
            let keep = l.established().then_some(l.keepalive_at);
            let stale = l.oldest_ping().map(|t| t + stale_after);
            [keep, stale]
        });
        let drain = self
            .drain_at
            .filter(|_| self.retiring.is_some() && !self.drain_sent);
        let outage = self.outage_since.map(|t| t + self.cfg.max_outage);
        link_times
            .chain([
                self.dial_at,
                drain,
                self.linger_until,
                self.confirm_at,
                outage,
                // Placements wait for a working upstream (see `reissue_due_pulls`);
                // statuses made for the client do not.
                self.pulls.poll_timeout(self.has_upstream()),
            ])
            .flatten()
            .min()
    }

    /// True while the driver may read more from the client.
    pub fn wants_client_input(&self) -> bool {
        let unconfirmed = self.primary.as_ref().map_or(0, |p| p.unconfirmed_bytes);
        self.client_state != ClientState::Closed
            && self.backlog_bytes + unconfirmed < self.cfg.max_backlog
    }

    /// True once the session has closed the client; the driver ends after flushing.
    pub fn is_closed(&self) -> bool {
        self.client_state == ClientState::Closed
    }

    /// The client's live subscriptions.
    pub fn subscriptions(&self) -> &SubTable {
        &self.subs
    }

    /// Counters so far.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// The name the client gave in its CONNECT, once it has.
    pub fn client_name(&self) -> Option<&str> {
        self.opts.name.as_deref()
    }

    /// The address of the current primary upstream, if any.
    pub fn upstream_addr(&self) -> Option<&str> {
        self.primary.as_ref().map(|l| l.addr.as_str())
    }

    /// The next event for metrics.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    fn event(&mut self, e: SessionEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// True when the client's traffic has a working upstream now.
    pub fn has_upstream(&self) -> bool {
        self.primary.as_ref().is_some_and(Link::established)
    }

    /// Bytes waiting in the backlog and held back during an overlap.
    pub fn buffered(&self) -> (usize, usize) {
        (
            self.backlog_bytes,
            self.dedup.as_ref().map_or(0, Dedup::held_bytes),
        )
    }

    /// True while a migration or failover is in progress.
    pub fn migrating(&self) -> bool {
        self.migration.is_some()
    }

    fn stale_after(&self) -> Duration {
        self.cfg.ping_interval * self.cfg.max_pings_out
    }

    // ---- client side ---------------------------------------------------------------

    /// Bytes read from the client: decodes and handles every complete op in `buf`.
    pub fn handle_client_bytes(&mut self, buf: &mut BytesMut, now: Instant) {
        self.now = now;
        while self.client_state != ClientState::Closed {
            match self.client_dec.decode(buf) {
                Ok(Some(op)) => self.handle_client_op(op, now),
                Ok(None) => break,
                Err(e) => {
                    self.client_protocol_error(e);
                    break;
                }
            }
        }
        self.confirm_publishes();
    }

    fn client_protocol_error(&mut self, e: ProtoError) {
        debug!(error = %e, "client protocol error");
        if let Some(line) = e.server_err_line() {
            self.send_client(Bytes::from_static(line));
        }
        self.close_client(CloseReason::ClientProtocol);
    }

    fn close_with_err(&mut self, text: &str, reason: CloseReason) {
        self.send_client(encode::err(text));
        self.close_client(reason);
    }

    fn close_client(&mut self, reason: CloseReason) {
        if self.client_state == ClientState::Closed {
            return;
        }
        self.client_state = ClientState::Closed;
        for l in [
            self.primary.take(),
            self.standby.take(),
            self.retiring.take(),
        ]
        .into_iter()
        .flatten()
        {
            self.actions.push_back(Action::CloseUpstream(l.epoch));
        }
        self.actions.push_back(Action::CloseClient(reason));
    }

    /// The client closed its connection (or it failed).
    pub fn handle_client_closed(&mut self) {
        self.close_client(CloseReason::ClientGone);
    }

    /// The proxy is shutting down: close the client and upstreams.
    pub fn shutdown(&mut self) {
        self.close_client(CloseReason::Shutdown);
    }

    fn send_client(&mut self, b: Bytes) {
        if self.client_state != ClientState::Closed {
            self.client_out.extend_from_slice(&b);
        }
    }

    fn reply_ok(&mut self) {
        if self.opts.verbose && self.replies.push_ok() {
            self.send_client(Bytes::from_static(encode::OK));
        }
    }

    fn flush_replies(&mut self) {
        while let Some(r) = self.replies.pop_ready() {
            let b: &'static [u8] = match r {
                Ready::Pong => encode::PONG,
                Ready::Ok => encode::OK,
            };
            self.send_client(Bytes::from_static(b));
        }
    }

    /// Handles one decoded client op.
    pub fn handle_client_op(&mut self, op: ClientOp, now: Instant) {
        self.now = now;
        if self.client_state == ClientState::Closed {
            return;
        }
        if !matches!(op, ClientOp::Connect(_)) && self.client_state != ClientState::Connected {
            if self.cfg.client_auth.is_some() {
                // nats-server, when it requires authentication, takes nothing before CONNECT.
                return self.close_with_err("Authorization Violation", CloseReason::ClientProtocol);
            }
            // nats-server serves a client that skips CONNECT with its default options.
            self.client_connected();
        }
        match op {
            ClientOp::Connect(json) => self.on_connect(&json),
            ClientOp::Pub(m) => self.on_pub(m),
            ClientOp::Sub {
                raw,
                subject,
                queue,
                sid,
            } => {
                if !subject::is_valid_subject(&subject) {
                    self.send_client(encode::err("Invalid Subject"));
                    return;
                }
                if self.subs.subscribe(sid, subject, queue) {
                    self.send_sub_op(raw, false);
                }
                self.reply_ok();
            }
            ClientOp::Unsub { raw, sid, max } => {
                self.subs.unsubscribe(&sid, max);
                if self.subs.get(&sid).is_none() {
                    self.pulls.unsubscribed(&sid);
                }
                self.send_sub_op(raw, true);
                self.reply_ok();
            }
            ClientOp::Ping => self.on_client_ping(),
            ClientOp::Pong | ClientOp::Ok => {}
            ClientOp::Err(_) => self.close_client(CloseReason::ClientProtocol),
            ClientOp::Info(json) => {
                if serde_json::from_slice::<serde_json::Value>(&json).is_err() {
                    self.close_client(CloseReason::ClientProtocol);
                }
            }
        }
    }

    fn on_connect(&mut self, json: &[u8]) {
        match self.opts.apply_connect(json) {
            Ok(mut o) => {
                if let Some(auth) = &self.cfg.client_auth {
                    if !auth.admits(&o) {
                        warn!("client authentication failed");
                        return self.close_with_err(
                            "Authorization Violation",
                            CloseReason::ClientProtocol,
                        );
                    }
                    // The client's proxy credentials are not the cluster's.
                    (o.user, o.pass, o.auth_token) = (None, None, None);
                }
                self.opts = o;
                self.client_dec.set_headers(self.opts.headers);
                if self.client_state != ClientState::Connected {
                    self.client_connected();
                }
                self.reply_ok();
            }
            Err(r) => match r.err_text() {
                Some(t) => self.close_with_err(t, CloseReason::ClientProtocol),
                None => self.close_client(CloseReason::ClientProtocol),
            },
        }
    }

    fn on_pub(&mut self, m: Message) {
        self.stats.msgs_to_upstream += 1;
        self.acks
            .on_client_publish(m.subject(), m.payload(), self.now);
        if self.opts.pedantic && !subject::is_valid_literal_subject(m.subject()) {
            // nats-server complains but still processes the message.
            self.send_client(encode::err("Invalid Publish Subject"));
        }
        if !self.opts.echo {
            if let Some(d) = &mut self.dedup {
                let fp = dedup::fingerprint(m.subject(), m.reply(), m.headers(), m.payload());
                d.own_publish(self.subs.matching(m.subject()), fp);
            }
        }
        if let (Some(reply), true) = (m.reply(), jetstream::is_pull_subject(m.subject())) {
            if let Some(sid) = self.subs.sid_for(reply) {
                let headers = m.has_headers().then(|| m.headers());
                let rewritten =
                    self.pulls
                        .on_request(m.subject(), reply, sid, headers, m.payload(), self.now);
                debug!(subject = %String::from_utf8_lossy(m.subject()), rewritten = rewritten.is_some(), tracked = self.pulls.len(), "pull request");
                // Tracked requests are not kept as unconfirmed publishes: the tracker
                // re-issues them itself when they are lost.
                self.send_publish(Pending::Untracked(rewritten.unwrap_or(m.raw)));
                self.reply_ok();
                return;
            }
        }
        self.send_publish(Pending::Data(m.raw));
        self.reply_ok();
    }

    fn on_client_ping(&mut self) {
        let primary_ready = self.primary.as_ref().is_some_and(Link::established);
        if primary_ready || self.switching || self.client_state_before_upstream() {
            self.replies.push_pong();
            self.send_publish(Pending::Ping);
        } else {
            // Outage: keep the client alive; nothing upstream can answer.
            self.replies.push_pong();
            self.replies.pong_arrived();
            self.flush_replies();
        }
    }

    /// True before the first upstream was ever established (start-up).
    fn client_state_before_upstream(&self) -> bool {
        self.outage_since.is_none() && self.primary.is_none()
    }

    fn client_connected(&mut self) {
        self.client_state = ClientState::Connected;
        for role in [Role::Primary, Role::Standby] {
            if self
                .link(role)
                .is_some_and(|l| l.state == LinkState::AwaitClientConnect)
            {
                self.establish(role);
            }
        }
    }

    /// Writes a publish (or client PING) to the primary, or queues it in the backlog.
    fn send_publish(&mut self, p: Pending) {
        let now = self.now;
        match &mut self.primary {
            Some(l) if l.established() && !self.switching && self.backlog.is_empty() => {
                let epoch = l.epoch;
                match p {
                    Pending::Data(b) => {
                        l.publish_sent(b.clone());
                        self.unpinged = true;
                        self.actions.push_back(Action::ToUpstream(epoch, b));
                    }
                    Pending::Untracked(b) => self.actions.push_back(Action::ToUpstream(epoch, b)),
                    Pending::Ping => {
                        l.ping_sent(PingOwner::Client, now);
                        self.unpinged = false;
                        self.actions
                            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                    }
                }
            }
            _ => {
                if let Pending::Data(b) | Pending::Untracked(b) = &p {
                    self.backlog_bytes += b.len();
                }
                self.backlog.push_back(p);
            }
        }
    }

    /// SUB/UNSUB go to every link that already replayed, so all hold the same set. A link
    /// not yet replayed gets the table's state in its replay instead.
    fn send_sub_op(&mut self, raw: Bytes, is_unsub: bool) {
        for role in [Role::Primary, Role::Standby, Role::Retiring] {
            let drain_sent = self.drain_sent;
            let Some(l) = self.link(role) else { continue };
            let wanted = match role {
                Role::Retiring => is_unsub && !drain_sent,
                _ => l.established(),
            };
            if wanted {
                let epoch = l.epoch;
                self.actions
                    .push_back(Action::ToUpstream(epoch, raw.clone()));
            }
        }
    }

    /// One PING confirms every publish before it: its PONG lets the link forget them
    /// (until then they are kept to be written again if the link dies). It goes out once
    /// `CONFIRM_BYTES` are unconfirmed or `CONFIRM_DELAY` after the first of them, not
    /// after every batch: at 1,000 requests/s a PING per request cost +50 µs at p50 and
    /// +360 µs at p99 of the round trip (the server's work and the proxy's wake-ups for
    /// as many PONGs). A PING of the client's or a keepalive confirms them sooner.
    fn confirm_publishes(&mut self) {
        self.confirm_publishes_at(false);
    }

    fn confirm_publishes_at(&mut self, due: bool) {
        if !self.unpinged {
            self.confirm_at = None;
            return;
        }
        let now = self.now;
        let pending = self.primary.as_ref().map_or(0, |l| l.unconfirmed_bytes);
        if !due && pending < CONFIRM_BYTES {
            self.confirm_at.get_or_insert(now + CONFIRM_DELAY);
            return;
        }
        self.confirm_at = None;
        let needs = |l: &Link| l.pings.back().is_none_or(|p| p.mark < l.seq);
        match self.primary.as_mut() {
            Some(l) if needs(l) => {
                l.ping_sent(PingOwner::Keepalive, now);
                self.unpinged = false;
                let epoch = l.epoch;
                self.actions
                    .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
            }
            // A PING already on its way covers them.
            Some(_) => self.unpinged = false,
            // The link died: they are in the backlog, confirmed once written again.
            None => {}
        }
    }

    fn flush_backlog(&mut self) {
        let now = self.now;
        let Some(l) = self.primary.as_mut() else {
            return;
        };
        let epoch = l.epoch;
        while let Some(p) = self.backlog.pop_front() {
            match p {
                Pending::Data(b) => {
                    self.backlog_bytes -= b.len();
                    l.publish_sent(b.clone());
                    self.unpinged = true;
                    self.actions.push_back(Action::ToUpstream(epoch, b));
                }
                Pending::Untracked(b) => {
                    self.backlog_bytes -= b.len();
                    self.actions.push_back(Action::ToUpstream(epoch, b));
                }
                Pending::Ping => {
                    l.ping_sent(PingOwner::Client, now);
                    self.actions
                        .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                }
            }
        }
        self.confirm_publishes();
    }

    // ---- links -----------------------------------------------------------------------

    fn link(&self, role: Role) -> Option<&Link> {
        match role {
            Role::Primary => self.primary.as_ref(),
            Role::Standby => self.standby.as_ref(),
            Role::Retiring => self.retiring.as_ref(),
        }
    }

    fn link_mut(&mut self, role: Role) -> Option<&mut Link> {
        match role {
            Role::Primary => self.primary.as_mut(),
            Role::Standby => self.standby.as_mut(),
            Role::Retiring => self.retiring.as_mut(),
        }
    }

    fn role_of(&self, epoch: Epoch) -> Option<Role> {
        [Role::Primary, Role::Standby, Role::Retiring]
            .into_iter()
            .find(|&r| self.link(r).is_some_and(|l| l.epoch == epoch))
    }

    fn take_link(&mut self, role: Role) -> Option<Link> {
        match role {
            Role::Primary => self.primary.take(),
            Role::Standby => self.standby.take(),
            Role::Retiring => self.retiring.take(),
        }
    }

    /// Dials the next node as the standby link.
    fn start_dial(&mut self) {
        self.dial_at = None;
        let exclude = self
            .migration
            .as_ref()
            .map(|m| m.from.clone())
            .or_else(|| self.primary.as_ref().map(|l| l.addr.clone()));
        let Some(addr) = self.pool.pick(exclude.as_deref(), self.now) else {
            return;
        };
        self.next_epoch += 1;
        let epoch = Epoch(self.next_epoch);
        debug!(%epoch, upstream = %addr, "dialing");
        self.standby = Some(Link::new(epoch, addr.clone(), self.now));
        self.actions.push_back(Action::Dial { epoch, addr });
    }

    /// Schedules the next dial with exponential backoff and jitter.
    fn schedule_dial(&mut self) {
        self.attempts += 1;
        let exp = self.attempts.saturating_sub(1).min(16);
        let base = self
            .cfg
            .backoff_min
            .saturating_mul(1 << exp)
            .min(self.cfg.backoff_max);
        let jitter = base.mul_f64(self.rng.f64() * 0.2);
        self.dial_at = Some(self.now + base - base.mul_f64(0.1) + jitter);
    }

    /// The TCP connection of `epoch` is established.
    pub fn handle_upstream_connected(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        let interval = self.cfg.ping_interval;
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
            let plain = self.client_state != ClientState::Closed
                && !self.dedup.as_ref().is_some_and(|d| d.covers(epoch));
            let peeked = match self.link(role) {
                Some(l) if plain => l.decoder.peek_msg(&buf[run..]),
                _ => None,
            }
            .filter(|v| {
                // A delivery of something the client acked goes the full path.
                self.acks.is_empty()
                    || !v
                        .reply
                        .is_some_and(|r| self.acks.is_acked_redelivery(&buf[run..][r.range()], now))
            });
            if let Some(v) = peeked {
                let sid = &buf[run..][v.sid.range()];
                if !self.pulls.is_empty() {
                    let reply = v.reply.map(|r| &buf[run..][r.range()]);
                    self.pulls.on_delivery(sid, reply, v.size(), now);
                }
                self.subs.delivered(sid);
                self.stats.msgs_to_client += 1;
                run += v.frame_len;
                continue;
            }
            if run > 0 {
                self.client_out.extend_from_slice(&buf[..run]);
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
                    return self.link_lost(epoch, Reason::Protocol);
                }
            }
        }
    }

    /// Handles one decoded upstream op.
    pub fn handle_upstream_op(&mut self, epoch: Epoch, op: ServerOp, now: Instant) {
        self.now = now;
        if let Some(role) = self.role_of(epoch) {
            self.on_upstream_op(epoch, role, op);
        }
    }

    fn on_upstream_op(&mut self, epoch: Epoch, role: Role, op: ServerOp) {
        match op {
            ServerOp::Msg(m) => self.on_upstream_msg(epoch, m),
            ServerOp::Ping => self
                .actions
                .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PONG))),
            ServerOp::Pong => self.on_pong(role),
            ServerOp::Ok => {}
            ServerOp::Err(text) => {
                let addr = self.link(role).map(|l| l.addr.clone()).unwrap_or_default();
                warn!(%epoch, upstream = %addr, err = %String::from_utf8_lossy(&text), "upstream -ERR");
                // Only the primary's errors concern the client; a dying link's
                // 'Stale Connection' is the proxy's business.
                let class = ServerErr::classify(&text);
                let rejected = self.link(role).is_some_and(|l| !l.accepted)
                    && class == ServerErr::Authorization;
                if rejected && role == Role::Primary {
                    // The server refused our CONNECT (the client's credentials, or the
                    // proxy's): exactly what the client would have been told directly.
                    let line = [b"-ERR ", &text[..], b"\r\n"].concat();
                    self.send_client(line.into());
                    return self.close_client(CloseReason::UpstreamLost);
                }
                if role == Role::Primary && class != ServerErr::StaleConnection {
                    let line = [b"-ERR ", &text[..], b"\r\n"].concat();
                    self.send_client(line.into());
                }
            }
            ServerOp::Info(json) => self.on_info(epoch, role, &json),
        }
    }

    fn on_info(&mut self, epoch: Epoch, role: Role, json: &[u8]) {
        let Some(info) = ServerInfo::parse(json) else {
            warn!(%epoch, "unparsable INFO from upstream");
            return self.link_lost(epoch, Reason::Protocol);
        };
        self.pool.learn(&info.connect_urls);
        let now = self.now;
        let Some(l) = self.link_mut(role) else { return };
        if l.state == LinkState::AwaitInfo {
            let addr = l.addr.clone();
            self.pool.identify(&addr, &info.server_id);
            if role == Role::Standby && self.pool.is_leaving(&info.server_id, now) {
                // The leaving node under another name (or again behind a balancer):
                // never move onto it. The pool now knows the name; try the next one.
                info!(%epoch, upstream = %addr, server_id = %info.server_id,
                    "dialled the node that is leaving under another address; dialling another");
                if let Some(s) = self.standby.take() {
                    self.actions.push_back(Action::CloseUpstream(s.epoch));
                }
                self.standby_gone();
                return self.schedule_dial();
            }
            let Some(l) = self.link_mut(role) else { return };
            l.state = LinkState::AwaitClientConnect;
            l.info = Some(info);
            self.pool.mark_ok(&addr);
            if self.client_state == ClientState::NoInfo {
                self.send_client_info(role);
            }
            if self.client_state == ClientState::Connected {
                self.establish(role);
            }
            return;
        }
        let newly_ldm = info.ldm && !l.ldm;
        if newly_ldm {
            l.ldm = true;
        }
        // A node (re)joined the cluster: a consumer that was away may be back.
        let grew = l.info.as_ref().is_some_and(|o| {
            info.connect_urls
                .iter()
                .any(|u| !o.connect_urls.contains(u))
        });
        let old = l.info.replace(info);
        if grew && role == Role::Primary && !self.pulls.is_empty() {
            self.pulls.consumer_may_be_back(self.now);
            self.reissue_due_pulls();
        }
        let Some(l) = self.link_mut(role) else { return };
        if let (Some(old), Some(new)) = (old, l.info.as_mut()) {
            // Async INFOs keep the identity of the first.
            if new.server_name.is_empty() {
                new.server_name = old.server_name;
            }
        }
        if newly_ldm {
            self.on_ldm(role);
        }
    }

    fn send_client_info(&mut self, role: Role) {
        let Some(info) = self.link(role).and_then(|l| l.info.as_ref()) else {
            return;
        };
        let mp = info.max_payload.unwrap_or(crate::proto::MAX_PAYLOAD);
        // Clients send credentials only when asked; ask when theirs pass through.
        let auth =
            self.cfg.client_auth.is_some() || info.auth_required && self.cfg.credentials.is_none();
        let json = info.client_info_json(mp, auth);
        self.client_dec.set_limits(Limits {
            max_payload: mp,
            ..Limits::default()
        });
        self.send_client(encode::info(&json));
        self.client_state = ClientState::AwaitConnect;
    }

    /// CONNECT, PING, the subscription replay and a PING on a link that has its INFO.
    fn establish(&mut self, role: Role) {
        let nonce = self
            .link(role)
            .and_then(|l| l.info.as_ref())
            .and_then(|i| i.nonce.clone());
        let json = self.opts.upstream_connect_json(
            self.cfg.credentials.as_ref(),
            nonce.as_deref(),
            self.cfg.proxy_key.as_ref(),
        );
        let replay = self.subs.replay();
        let n_subs = self.subs.len() as u64;
        let now = self.now;
        let interval = self.cfg.ping_interval;
        let Some(l) = self.link_mut(role) else { return };
        let epoch = l.epoch;
        l.state = LinkState::Established;
        l.keepalive_at = now + interval;
        let mut out =
            BytesMut::with_capacity(json.len() + 64 + replay.iter().map(Bytes::len).sum::<usize>());
        out.extend_from_slice(&encode::connect(&json));
        out.extend_from_slice(encode::PING);
        l.ping_sent(PingOwner::Handshake, now);
        for b in &replay {
            out.extend_from_slice(b);
        }
        out.extend_from_slice(encode::PING);
        l.ping_sent(PingOwner::Replay, now);
        self.actions
            .push_back(Action::ToUpstream(epoch, out.freeze()));
        self.stats.subs_replayed += n_subs;
        if role == Role::Standby {
            match &self.primary {
                Some(p) => {
                    // Make-before-break: both links deliver from now on.
                    let old = p.epoch;
                    match &mut self.dedup {
                        // Remembering the old link's deliveries since its lame duck.
                        Some(d) if d.awaits_new_link(old) => d.attach(epoch),
                        _ => {
                            // A lingering previous overlap ends here; keep its counts.
                            self.take_dedup_stats();
                            self.dedup = Some(Dedup::new(
                                old,
                                epoch,
                                self.cfg.max_dedup_entries,
                                self.cfg.max_hold_bytes,
                            ));
                        }
                    }
                    self.linger_until = None;
                }
                None => self.promote_standby(),
            }
        }
    }

    /// The standby becomes the primary at once (start-up or failover: there is none).
    fn promote_standby(&mut self) {
        self.primary = self.standby.take();
        self.attempts = 0;
        self.flush_backlog();
        if std::mem::take(&mut self.reissue_pulls) && !self.pulls.is_empty() {
            self.pulls.all_lost(self.now);
            self.reissue_due_pulls();
        }
        if let (Some(m), Some(p)) = (&self.migration, &self.primary) {
            let took = self.now.saturating_duration_since(m.started);
            info!(reason = %m.reason, from = %m.from, to = %p.addr, resumed_ms = took.as_millis() as u64,
                subscriptions = self.subs.len(), "failover: traffic resumed on a new upstream");
            let reason = m.reason;
            self.event(SessionEvent::Moved { reason, took });
        } else if let Some(p) = &self.primary {
            info!(upstream = %p.addr, server = %p.server_name(), "upstream connected");
        }
        self.migration = None;
        self.outage_since = None;
    }

    fn on_ldm(&mut self, role: Role) {
        let now = self.now;
        let Some(l) = self.link(role) else { return };
        let addr = l.addr.clone();
        let link_epoch = l.epoch;
        info!(upstream = %addr, server = %l.server_name(), "upstream entered lame duck mode");
        self.pool.mark_ldm(&addr, now);
        match role {
            Role::Primary if self.migration.is_none() => {
                self.migration = Some(Migration {
                    reason: Reason::LameDuck,
                    started: now,
                    from: addr,
                });
                if self.dedup.is_none() {
                    // The overlap's memory starts now (see `dedup`: the new node may
                    // already receive these subjects for other connections).
                    self.dedup = Some(Dedup::recording(
                        link_epoch,
                        self.cfg.max_dedup_entries,
                        self.cfg.max_hold_bytes,
                    ));
                }
                // The old link still works: spread the proxy's dials (`migration_spread`).
                let spread = self.cfg.migration_spread.mul_f64(self.rng.f64());
                if spread.is_zero() {
                    self.start_dial();
                } else {
                    self.dial_at = Some(now + spread);
                }
            }
            // Already moving; a new migration starts when this one completes.
            Role::Primary => {}
            Role::Standby => {
                // Never move onto a node that is leaving.
                if let Some(s) = self.standby.take() {
                    self.actions.push_back(Action::CloseUpstream(s.epoch));
                }
                self.standby_gone();
                self.start_dial();
            }
            Role::Retiring => {}
        }
    }

    fn on_pong(&mut self, role: Role) {
        let now = self.now;
        let Some(l) = self.link_mut(role) else { return };
        let Some(entry) = l.pong() else { return };
        match entry.owner {
            PingOwner::Client => {
                self.replies.pong_arrived();
                self.flush_replies();
            }
            PingOwner::Handshake => l.accepted = true,
            PingOwner::Replay => {
                if role == Role::Standby && self.primary.is_some() {
                    self.begin_switch();
                }
            }
            PingOwner::Switch => self.complete_switch(),
            PingOwner::Drain => self.drained(),
            PingOwner::Keepalive => {
                let rtt = now.saturating_duration_since(entry.sent_at);
                self.event(SessionEvent::Rtt(rtt));
            }
        }
    }

    /// The new link's subscriptions are registered: barrier on the old link.
    fn begin_switch(&mut self) {
        let now = self.now;
        if let Some(d) = &mut self.dedup {
            d.start_recording();
        }
        self.drain_at = Some(now + self.cfg.settle);
        let Some(p) = self.primary.as_mut() else {
            return;
        };
        p.ping_sent(PingOwner::Switch, now);
        self.switching = true;
        self.unpinged = false;
        let epoch = p.epoch;
        self.actions
            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
    }

    /// Everything written on the old link has been processed: move client traffic.
    fn complete_switch(&mut self) {
        self.switching = false;
        self.retiring = self.primary.take();
        self.primary = self.standby.take();
        self.flush_backlog();
        self.stats.migrations += 1;
        if let (Some(m), Some(p)) = (&self.migration, &self.primary) {
            let took = self.now.saturating_duration_since(m.started);
            self.stats.last_switch = Some(took);
            info!(reason = %m.reason, from = %m.from, to = %p.addr, switch_ms = took.as_millis() as u64,
                subscriptions = self.subs.len(), "migrated to a new upstream");
            let reason = m.reason;
            self.event(SessionEvent::Moved { reason, took });
        }
        self.maybe_drain();
    }

    /// After the settle delay, remove every subscription from the retiring link.
    fn maybe_drain(&mut self) {
        if self.drain_sent || self.drain_at.is_none_or(|t| t > self.now) {
            return;
        }
        let now = self.now;
        let sids: Vec<Bytes> = self.subs.sids().cloned().collect();
        let Some(r) = self.retiring.as_mut() else {
            return;
        };
        let mut out = BytesMut::new();
        for sid in &sids {
            out.extend_from_slice(&encode::unsub(sid, None));
        }
        out.extend_from_slice(encode::PING);
        r.ping_sent(PingOwner::Drain, now);
        self.drain_sent = true;
        let epoch = r.epoch;
        self.actions
            .push_back(Action::ToUpstream(epoch, out.freeze()));
    }

    /// The retiring link delivers nothing more: close it and finish the migration.
    fn drained(&mut self) {
        if let Some(r) = self.retiring.take() {
            self.actions.push_back(Action::CloseUpstream(r.epoch));
        }
        self.old_link_done();
        if let Some(m) = self.migration.take() {
            let took = self.now.saturating_duration_since(m.started);
            info!(reason = %m.reason, from = %m.from, total_ms = took.as_millis() as u64, "migration complete; old upstream retired");
        }
        self.drain_at = None;
        self.drain_sent = false;
        // The new node may itself have announced lame duck mode meanwhile.
        if self.primary.as_ref().is_some_and(|p| p.ldm) {
            self.on_ldm(Role::Primary);
        }
    }

    /// The old side of an overlap can deliver nothing more: release what the new side
    /// held back.
    fn old_link_done(&mut self) {
        if let Some(d) = &mut self.dedup {
            d.old_finished();
            self.linger_until = Some(self.now + self.cfg.settle);
        }
        self.forward_ready();
    }

    fn forward_ready(&mut self) {
        while let Some(m) = self.dedup.as_mut().and_then(Dedup::pop_ready) {
            self.deliver(m);
        }
    }

    /// The standby is gone before the switch: the overlap's memory of the primary's
    /// deliveries is kept for the next standby, what the standby delivered is dropped.
    fn standby_gone(&mut self) {
        let primary = self.primary.as_ref().map(|p| p.epoch);
        match (&mut self.dedup, primary) {
            (Some(d), Some(p)) if d.is_overlap_from(p) => d.detach(),
            _ => self.take_dedup_stats(),
        }
    }

    fn take_dedup_stats(&mut self) {
        if let Some(d) = self.dedup.take() {
            self.stats.duplicates_suppressed += d.suppressed;
            self.stats.possible_duplicates += d.overflowed;
            self.stats.echoes_suppressed += d.echoes;
        }
    }

    /// A message from an upstream link.
    fn on_upstream_msg(&mut self, epoch: Epoch, m: Message) {
        if let Some(d) = self.dedup.as_mut().filter(|d| d.covers(epoch)) {
            let fp = dedup::fingerprint(m.subject(), m.reply(), m.headers(), m.payload());
            let sid = m.raw.slice(m.sid.range());
            d.on_message(epoch, &sid, fp, m.raw.len(), m);
            return self.forward_ready();
        }
        self.deliver(m);
    }

    /// Counts a message and relays it to the client.
    fn deliver(&mut self, m: Message) {
        if m.has_headers()
            && !self.opts.no_responders
            && m.status() == Some(503)
            && m.payload().is_empty()
        {
            // The server sends no-responders statuses only to clients that asked for them.
            return;
        }
        if let Some(reply) = m
            .reply()
            .filter(|r| self.acks.is_acked_redelivery(r, self.now))
        {
            // The client acked this message already (the ack was lost upstream): ack it
            // again and keep the client from processing it twice.
            let ack = encode::publish(reply, None, None, b"");
            debug!(reply = %String::from_utf8_lossy(reply), "acked again a redelivery the client had acked");
            if !self.pulls.is_empty() {
                self.pulls
                    .on_delivery(m.sid(), Some(reply), m.total_len(), self.now);
            }
            self.subs.delivered(m.sid());
            self.stats.redeliveries_acked += 1;
            self.send_publish(Pending::Data(ack));
            return;
        }
        if !self.pulls.is_empty() && self.pulls.on_message(&m, self.now) == Shield::Swallow {
            if self.pulls.stats.shielded != self.stats.statuses_shielded {
                self.stats.statuses_shielded = self.pulls.stats.shielded;
                info!(status = %String::from_utf8_lossy(m.headers().split(|&c| c == b'\r').next().unwrap_or_default()),
                    sid = %String::from_utf8_lossy(m.sid()), "shielded a JetStream status from the client");
            }
            return;
        }
        self.subs.delivered(m.sid());
        self.stats.msgs_to_client += 1;
        if m.has_headers() && !self.opts.headers {
            // What nats-server does for clients without header support: strip them.
            let b = encode::msg(m.subject(), m.sid(), m.reply(), None, m.payload());
            self.send_client(b);
        } else {
            self.send_client(m.raw);
        }
    }

    /// The upstream connection of `epoch` closed or failed to connect.
    pub fn handle_upstream_lost(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        self.link_lost(epoch, Reason::Closed);
    }

    fn link_lost(&mut self, epoch: Epoch, reason: Reason) {
        let Some(role) = self.role_of(epoch) else {
            return;
        };
        let Some(l) = self.take_link(role) else {
            return;
        };
        self.actions.push_back(Action::CloseUpstream(epoch));
        let now = self.now;
        match role {
            Role::Standby => {
                self.pool.mark_failed(&l.addr, now);
                if self.client_state == ClientState::NoInfo {
                    // Start-up: try each node once, then give up (the client retries).
                    self.initial_failures += 1;
                    if self.initial_failures >= self.pool.len() {
                        warn!(upstream = %l.addr, "no upstream reachable; closing client");
                        return self.close_client(CloseReason::UpstreamLost);
                    }
                    return self.start_dial();
                }
                debug!(upstream = %l.addr, %reason, "standby upstream failed");
                self.standby_gone();
                self.schedule_dial();
            }
            Role::Retiring => {
                // Lame duck closed it (or it died) before or during the drain.
                self.old_link_done();
                if self.switching {
                    self.switching = false;
                }
                if let Some(m) = self.migration.take() {
                    let took = now.saturating_duration_since(m.started);
                    info!(reason = %m.reason, from = %m.from, total_ms = took.as_millis() as u64, "migration complete; old upstream closed");
                }
                self.drain_at = None;
                self.drain_sent = false;
                if self.primary.as_ref().is_some_and(|p| p.ldm) {
                    self.on_ldm(Role::Primary);
                }
            }
            Role::Primary => self.failover(l, reason),
        }
    }

    /// The primary is gone without a completed switch.
    fn failover(&mut self, dead: Link, reason: Reason) {
        let now = self.now;
        self.stats.failovers += 1;
        self.pool.mark_failed(&dead.addr, now);
        warn!(upstream = %dead.addr, server = %dead.server_name(), %reason, "upstream lost; failing over");
        // PONGs the dead link owed the client: answer them, the client must not stall.
        for p in &dead.pings {
            if p.owner == PingOwner::Client {
                self.replies.pong_arrived();
            }
        }
        self.flush_replies();
        // Publishes the dead link never confirmed go out again first (acks are idempotent).
        self.stats.publishes_resent += dead.unconfirmed.len() as u64;
        for (_, b) in dead.unconfirmed.into_iter().rev() {
            self.backlog_bytes += b.len();
            self.backlog.push_front(Pending::Data(b));
        }
        self.switching = false;
        if let Some(d) = &self.dedup {
            if d.covers(dead.epoch) {
                self.old_link_done();
            }
        }
        if let Some(r) = self.retiring.take() {
            self.actions.push_back(Action::CloseUpstream(r.epoch));
            self.drain_at = None;
            self.drain_sent = false;
        }
        if self.migration.is_none() {
            self.migration = Some(Migration {
                reason,
                started: now,
                from: dead.addr.clone(),
            });
        }
        self.outage_since = Some(now);
        // The dead link's inbox subscriptions are gone; the server may sweep the
        // requests before the new link's interest arrives.
        self.reissue_pulls = true;
        match &self.standby {
            Some(s) if s.established() => self.promote_standby(),
            Some(_) => {}
            None => self.start_dial(),
        }
    }

    /// Runs the pull tracker's due work: placements upstream (only with a working
    /// upstream: without one they would pile up in the backlog and each add credit once
    /// sent; the next link places every request anyway) and statuses for the client.
    fn reissue_due_pulls(&mut self) {
        if self.pulls.is_empty() {
            return;
        }
        let upstream = self.has_upstream();
        let mut placed = false;
        for action in self.pulls.on_timeout(self.now, upstream) {
            match action {
                PullAction::ToUpstream(frame) => {
                    info!(request = %String::from_utf8_lossy(&frame[..frame.len().min(200)]).trim_end(), "placing a lost pull request again");
                    self.send_publish(Pending::Untracked(frame));
                    placed = true;
                }
                PullAction::ToClient(frame) => {
                    debug!(status = %String::from_utf8_lossy(&frame[..frame.len().min(120)]).trim_end(), "pull status made by the proxy");
                    self.send_client(frame);
                }
            }
        }
        self.stats.pulls_reissued = self.pulls.stats.reissued;
        self.stats.statuses_shielded = self.pulls.stats.shielded;
        if placed {
            self.confirm_publishes();
        }
    }

    /// Timers: keepalives, stale links, dial backoff, drain, de-dup linger, outage.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.client_state == ClientState::Closed {
            return;
        }
        let stale_after = self.stale_after();
        let interval = self.cfg.ping_interval;
        for role in [Role::Primary, Role::Standby, Role::Retiring] {
            let Some(l) = self.link_mut(role) else {
                continue;
            };
            if l.oldest_ping().is_some_and(|t| now >= t + stale_after) {
                let epoch = l.epoch;
                warn!(upstream = %l.addr, "upstream stale: PING unanswered");
                self.link_lost(epoch, Reason::Stale);
                continue;
            }
            if l.established() && now >= l.keepalive_at {
                l.keepalive_at = now + interval;
                if l.pings.is_empty() {
                    l.ping_sent(PingOwner::Keepalive, now);
                    let epoch = l.epoch;
                    self.actions
                        .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                }
            }
        }
        if self.dial_at.is_some_and(|t| now >= t) && self.standby.is_none() {
            self.start_dial();
        }
        if self.confirm_at.is_some_and(|t| now >= t) {
            self.confirm_publishes_at(true);
        }
        self.maybe_drain();
        self.reissue_due_pulls();
        if self.linger_until.is_some_and(|t| now >= t) {
            self.linger_until = None;
            self.take_dedup_stats();
        }
        if let Some(since) = self.outage_since {
            if now >= since + self.cfg.max_outage {
                let secs = self.cfg.max_outage.as_secs();
                warn!(secs, "no upstream reachable; closing client");
                let text = format!("natsproxy: no NATS server reachable for {secs}s");
                self.close_with_err(&text, CloseReason::UpstreamLost);
            }
        }
    }
}

#[cfg(test)]
mod tests;
