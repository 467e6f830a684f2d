//! The per-client state machine: pure, sans-io. It takes client bytes, upstream bytes,
//! connection events and `now`, and returns [`Action`]s for the driver to carry out.
//!
//! # Phases
//!
//! ```text
//!            new()                      upstream INFO                 client CONNECT
//!  ──► Dial(epoch 1) ──► AwaitInfo ─────────────────► (client INFO sent) ───────────────┐
//!                                                                                        ▼
//!                                            CONNECT+PING upstream, backlog flushed: Handshake
//!                                                                                        │ PONG
//!                                                                                        ▼
//!                                                                                      Ready
//!   upstream closed / reset / stale (2 keepalive intervals without PONG) ──► client closed
//!   client protocol error ──► -ERR (as nats-server) + close;   client EOF ──► everything closed
//! ```
//!
//! Client traffic that arrives before CONNECT could be sent upstream waits in the backlog
//! (bounded by `max_backlog` bytes; past it the driver stops reading the client).
//! The client's PINGs are sent upstream and the PONG is relayed when the upstream answers
//! them, so a PONG proves that everything the client sent before reached the server.
//! Every upstream link has an [`Epoch`]; events from an epoch that is not live are dropped.

pub mod action;
pub mod link;
pub mod replies;
pub mod subs;

use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

use crate::proto::json::{ClientOptions, ServerInfo};
use crate::proto::{
    encode, subject, ClientDecoder, ClientOp, Limits, Message, ProtoError, ServerOp,
};
pub use action::{Action, CloseReason, Epoch};
use link::{Link, LinkState, PingOwner};
use replies::{Ready, ReplyQueue};
use subs::SubTable;

/// Default interval between the proxy's keepalive PINGs upstream.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(2);
/// Default bound of client bytes held while no upstream can take them.
pub const DEFAULT_MAX_BACKLOG: usize = 8 * 1024 * 1024;

/// Static configuration of a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Upstream addresses (`host:port`) in order of preference.
    pub upstreams: Vec<String>,
    /// Credentials the proxy presents upstream instead of the client's.
    pub credentials: Option<crate::config::Credentials>,
    /// Interval of the proxy's keepalive PINGs upstream; a link with a PING unanswered for
    /// `ping_interval * max_pings_out` is stale.
    pub ping_interval: Duration,
    /// Missed keepalives that make a link stale.
    pub max_pings_out: u32,
    /// Bound of client bytes buffered while no upstream accepts traffic.
    pub max_backlog: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            upstreams: vec!["127.0.0.1:4222".into()],
            credentials: None,
            ping_interval: DEFAULT_PING_INTERVAL,
            max_pings_out: 2,
            max_backlog: DEFAULT_MAX_BACKLOG,
        }
    }
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

/// A client op waiting for an upstream that accepts traffic.
#[derive(Debug)]
enum Pending {
    Data(Bytes),
    Ping,
}

/// The pure per-client state machine. See the module docs for the phase diagram.
pub struct Session {
    cfg: SessionConfig,
    client_state: ClientState,
    opts: ClientOptions,
    client_dec: ClientDecoder,
    replies: ReplyQueue,
    subs: SubTable,
    link: Option<Link>,
    next_epoch: u64,
    backlog: VecDeque<Pending>,
    backlog_bytes: usize,
    /// The max_payload announced to the client.
    client_max_payload: usize,
    actions: VecDeque<Action>,
    /// The `now` of the event being handled.
    now: Instant,
}

impl Session {
    /// A session for a freshly accepted client; the first action dials the upstream.
    pub fn new(cfg: SessionConfig, now: Instant) -> Session {
        let mut s = Session {
            cfg,
            client_state: ClientState::NoInfo,
            opts: ClientOptions::default(),
            client_dec: ClientDecoder::new(Limits::default()),
            replies: ReplyQueue::default(),
            subs: SubTable::default(),
            link: None,
            next_epoch: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            client_max_payload: crate::proto::MAX_PAYLOAD,
            actions: VecDeque::new(),
            now,
        };
        s.dial(0, now);
        s
    }

    fn dial(&mut self, node: usize, now: Instant) {
        self.next_epoch += 1;
        let epoch = Epoch(self.next_epoch);
        let addr = self.cfg.upstreams[node % self.cfg.upstreams.len()].clone();
        self.link = Some(Link::new(epoch, addr.clone(), now));
        self.actions.push_back(Action::Dial { epoch, addr });
    }

    /// The next action for the driver, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The earliest moment `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.client_state == ClientState::Closed {
            return None;
        }
        let link = self.link.as_ref()?;
        if !link.accepts_traffic() {
            return None;
        }
        let stale_at = link
            .oldest_ping()
            .map(|t| t + self.cfg.ping_interval * self.cfg.max_pings_out);
        Some(stale_at.map_or(link.keepalive_at, |s| s.min(link.keepalive_at)))
    }

    /// True while the driver may read more from the client (the backlog has room).
    pub fn wants_client_input(&self) -> bool {
        self.client_state != ClientState::Closed && self.backlog_bytes < self.cfg.max_backlog
    }

    /// True once the session has closed the client; the driver ends after flushing.
    pub fn is_closed(&self) -> bool {
        self.client_state == ClientState::Closed
    }

    /// Number of live client subscriptions.
    pub fn subscriptions(&self) -> &SubTable {
        &self.subs
    }

    // ---- client side ---------------------------------------------------------------

    /// Bytes read from the client: decodes and handles every complete op in `buf`.
    pub fn handle_client_bytes(&mut self, buf: &mut BytesMut, now: Instant) {
        self.now = now;
        while self.client_state != ClientState::Closed {
            match self.client_dec.decode(buf) {
                Ok(Some(op)) => self.handle_client_op(op, now),
                Ok(None) => return,
                Err(e) => return self.client_protocol_error(e),
            }
        }
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
        if let Some(l) = self.link.take() {
            self.actions.push_back(Action::CloseUpstream(l.epoch));
        }
        self.actions.push_back(Action::CloseClient(reason));
    }

    /// The client closed its connection (or it failed).
    pub fn handle_client_closed(&mut self) {
        self.close_client(CloseReason::ClientGone);
    }

    /// The proxy is shutting down: close the client and upstream.
    pub fn shutdown(&mut self) {
        self.close_client(CloseReason::Shutdown);
    }

    fn send_client(&mut self, b: Bytes) {
        if self.client_state != ClientState::Closed {
            self.actions.push_back(Action::ToClient(b));
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
            // nats-server serves a client that skips CONNECT with its default options.
            self.client_connected(now);
        }
        match op {
            ClientOp::Connect(json) => self.on_connect(&json, now),
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
                    self.send_upstream(Pending::Data(raw));
                }
                self.reply_ok();
            }
            ClientOp::Unsub { raw, sid, max } => {
                self.subs.unsubscribe(&sid, max);
                self.send_upstream(Pending::Data(raw));
                self.reply_ok();
            }
            ClientOp::Ping => {
                self.replies.push_pong();
                self.send_upstream(Pending::Ping);
            }
            ClientOp::Pong | ClientOp::Ok => {}
            ClientOp::Err(_) => self.close_client(CloseReason::ClientProtocol),
            ClientOp::Info(json) => {
                if serde_json::from_slice::<serde_json::Value>(&json).is_err() {
                    self.close_client(CloseReason::ClientProtocol);
                }
            }
        }
    }

    fn on_connect(&mut self, json: &[u8], now: Instant) {
        match self.opts.apply_connect(json) {
            Ok(o) => {
                self.opts = o;
                self.client_dec.set_headers(self.opts.headers);
                if self.client_state != ClientState::Connected {
                    self.client_connected(now);
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
        if self.opts.pedantic && !subject::is_valid_literal_subject(m.subject()) {
            // nats-server complains but still processes the message.
            self.send_client(encode::err("Invalid Publish Subject"));
        }
        self.send_upstream(Pending::Data(m.raw));
        self.reply_ok();
    }

    fn client_connected(&mut self, _now: Instant) {
        self.client_state = ClientState::Connected;
        if let Some(l) = &self.link {
            if l.state == LinkState::AwaitClientConnect {
                self.send_upstream_connect();
            }
        }
    }

    /// Writes to the current link if it accepts traffic, else queues in the backlog.
    fn send_upstream(&mut self, p: Pending) {
        match &mut self.link {
            Some(l) if l.accepts_traffic() && self.backlog.is_empty() => {
                let epoch = l.epoch;
                match p {
                    Pending::Data(b) => self.actions.push_back(Action::ToUpstream(epoch, b)),
                    Pending::Ping => {
                        l.pings.push_back((PingOwner::Client, self.now));
                        self.actions
                            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                    }
                }
            }
            _ => {
                if let Pending::Data(b) = &p {
                    self.backlog_bytes += b.len();
                }
                self.backlog.push_back(p);
            }
        }
    }

    fn flush_backlog(&mut self, now: Instant) {
        let Some(l) = &mut self.link else { return };
        let epoch = l.epoch;
        while let Some(p) = self.backlog.pop_front() {
            match p {
                Pending::Data(b) => {
                    self.backlog_bytes -= b.len();
                    self.actions.push_back(Action::ToUpstream(epoch, b));
                }
                Pending::Ping => {
                    l.pings.push_back((PingOwner::Client, now));
                    self.actions
                        .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                }
            }
        }
    }

    // ---- upstream side -------------------------------------------------------------

    fn live(&self, epoch: Epoch) -> bool {
        self.link.as_ref().is_some_and(|l| l.epoch == epoch)
    }

    /// The TCP connection of `epoch` is established.
    pub fn handle_upstream_connected(&mut self, epoch: Epoch, now: Instant) {
        self.now = now;
        if let Some(l) = self.link.as_mut().filter(|l| l.epoch == epoch) {
            l.state = LinkState::AwaitInfo;
            l.keepalive_at = now + self.cfg.ping_interval;
        }
    }

    /// Bytes read from the upstream of `epoch`.
    pub fn handle_upstream_bytes(&mut self, epoch: Epoch, buf: &mut BytesMut, now: Instant) {
        self.now = now;
        if !self.live(epoch) {
            buf.clear();
            return;
        }
        while let Some(l) = self.link.as_mut().filter(|l| l.epoch == epoch) {
            match l.decoder.decode(buf) {
                Ok(Some(op)) => self.handle_upstream_op(epoch, op, now),
                Ok(None) => return,
                Err(e) => {
                    warn!(%epoch, error = %e, "protocol violation from upstream");
                    buf.clear();
                    return self.handle_upstream_lost(epoch, now);
                }
            }
        }
    }

    /// Handles one decoded upstream op.
    pub fn handle_upstream_op(&mut self, epoch: Epoch, op: ServerOp, now: Instant) {
        self.now = now;
        if !self.live(epoch) {
            return;
        }
        match op {
            ServerOp::Msg(m) => self.deliver(m),
            ServerOp::Ping => self
                .actions
                .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PONG))),
            ServerOp::Pong => self.on_pong(now),
            ServerOp::Ok => {}
            ServerOp::Err(text) => {
                warn!(%epoch, err = %String::from_utf8_lossy(&text), "upstream -ERR");
                let line = [b"-ERR ", &text[..], b"\r\n"].concat();
                self.send_client(line.into());
            }
            ServerOp::Info(json) => self.on_info(&json, now),
        }
    }

    fn on_info(&mut self, json: &[u8], now: Instant) {
        let Some(info) = ServerInfo::parse(json) else {
            warn!("unparsable INFO from upstream");
            if let Some(e) = self.link.as_ref().map(|l| l.epoch) {
                self.handle_upstream_lost(e, now);
            }
            return;
        };
        let Some(l) = self.link.as_mut() else { return };
        if l.state == LinkState::AwaitInfo {
            info!(upstream = %l.addr, server = %info.server_name, "upstream connected");
            l.state = LinkState::AwaitClientConnect;
            let mp = info.max_payload.unwrap_or(crate::proto::MAX_PAYLOAD);
            l.info = Some(info);
            if self.client_state == ClientState::NoInfo {
                self.client_max_payload = mp;
                self.client_dec.set_limits(Limits {
                    max_payload: mp,
                    ..Limits::default()
                });
                let info = self.link.as_ref().and_then(|l| l.info.as_ref());
                // Clients send credentials only when asked; ask when they pass through.
                let auth = info.is_some_and(|i| i.auth_required) && self.cfg.credentials.is_none();
                let json = info
                    .map(|i| i.client_info_json(mp, auth))
                    .unwrap_or_default();
                self.send_client(encode::info(&json));
                self.client_state = ClientState::AwaitConnect;
            }
            if self.client_state == ClientState::Connected {
                self.send_upstream_connect();
            }
        } else {
            if info.ldm {
                info!(upstream = %l.addr, server = %info.server_name, "upstream entered lame duck mode");
            }
            let old = l.info.replace(info);
            if let (Some(old), Some(new)) = (old, l.info.as_mut()) {
                // Async INFOs are partial views; keep identity fields from the first.
                if new.server_name.is_empty() {
                    new.server_name = old.server_name;
                }
            }
        }
    }

    fn send_upstream_connect(&mut self) {
        let json = self
            .opts
            .upstream_connect_json(self.cfg.credentials.as_ref());
        let Some(l) = self.link.as_mut() else { return };
        let epoch = l.epoch;
        l.state = LinkState::Handshake;
        let now = self.now;
        l.pings.push_back((PingOwner::Handshake, now));
        self.actions
            .push_back(Action::ToUpstream(epoch, encode::connect(&json)));
        self.actions
            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
        self.flush_backlog(now);
    }

    fn on_pong(&mut self, now: Instant) {
        let Some(l) = self.link.as_mut() else { return };
        match l.pings.pop_front().map(|p| p.0) {
            Some(PingOwner::Client) => {
                self.replies.pong_arrived();
                self.flush_replies();
            }
            Some(PingOwner::Handshake) => {
                l.state = LinkState::Ready;
                l.keepalive_at = now + self.cfg.ping_interval;
                debug!(upstream = %l.addr, "upstream handshake complete");
            }
            Some(PingOwner::Keepalive) | None => {}
        }
    }

    /// A message from the current upstream: count it and relay it.
    fn deliver(&mut self, m: Message) {
        if m.has_headers()
            && m.status() == Some(503)
            && m.payload().is_empty()
            && !self.opts.no_responders
        {
            // The server sends no-responders statuses only to clients that asked for them.
            return;
        }
        self.subs.delivered(m.sid());
        if m.has_headers() && !self.opts.headers {
            // What nats-server does for clients without header support: strip them.
            let b = encode::msg(m.subject(), m.sid(), m.reply(), None, m.payload());
            self.send_client(b);
        } else {
            self.send_client(m.raw);
        }
    }

    /// The upstream of `epoch` closed, failed, or sent garbage.
    pub fn handle_upstream_lost(&mut self, epoch: Epoch, _now: Instant) {
        self.now = _now;
        if !self.live(epoch) {
            return;
        }
        if let Some(l) = &self.link {
            warn!(upstream = %l.addr, server = %l.server_name(), "upstream connection lost");
        }
        self.link = None;
        self.close_client(CloseReason::UpstreamLost);
    }

    /// Timers: keepalive PINGs and stale detection.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        let stale_after = self.cfg.ping_interval * self.cfg.max_pings_out;
        let Some(l) = self.link.as_mut() else { return };
        if !l.accepts_traffic() {
            return;
        }
        if l.oldest_ping().is_some_and(|t| now >= t + stale_after) {
            let epoch = l.epoch;
            warn!(upstream = %l.addr, "upstream stale: PING unanswered");
            self.actions.push_back(Action::CloseUpstream(epoch));
            return self.handle_upstream_lost(epoch, now);
        }
        if now >= l.keepalive_at {
            l.pings.push_back((PingOwner::Keepalive, now));
            l.keepalive_at = now + self.cfg.ping_interval;
            let epoch = l.epoch;
            self.actions
                .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
        }
    }
}

#[cfg(test)]
mod tests;
