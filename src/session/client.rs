//! The client side: CONNECT and authentication, PUB, SUB/UNSUB, PING, replies, and
//! delivery of upstream messages to the client.

use bytes::Bytes;
use std::time::Instant;
use tracing::{debug, info, warn};

use super::action::{Action, CloseReason};
use super::backlog::Pending;
use super::client_side::ClientState;
use super::dedup;
use super::jetstream::acks::{AckRef, Seen};
use super::jetstream::{self, Shield};
use super::link::{Link, LinkState};
use super::links::Role;
use super::phase::{Phase, Step};
use super::replies::Ready;
use super::Session;
use crate::proto::{encode, subject, ClientOp, Message, ProtoError};

impl Session {
    /// Handles one decoded client op.
    pub(super) fn handle_client_op(&mut self, op: ClientOp, now: Instant) {
        self.now = now;
        if matches!(self.client.state, ClientState::Closed | ClientState::Ending) {
            return;
        }
        if !matches!(op, ClientOp::Connect(_)) && self.client.state != ClientState::Connected {
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
                    return self.local_err(encode::err("Invalid Subject"));
                }
                self.client.subscribed |= !subject.starts_with(b"_INBOX.");
                if self.subs.subscribe(sid, subject, queue) {
                    self.send_sub_op(raw, false);
                }
                self.reply_ok();
            }
            ClientOp::Unsub { raw, sid, max } => {
                self.subs.unsubscribe(&sid, max);
                if self.subs.get(&sid).is_none() {
                    self.js.pulls.unsubscribed(&sid);
                }
                self.send_sub_op(raw, true);
                // It may have been the last one the retiring link kept.
                self.maybe_drain();
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

    pub(super) fn on_connect(&mut self, json: &[u8]) {
        match self.client.opts.apply_connect(json) {
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
                self.client.opts = o;
                self.client.dec.set_headers(self.client.opts.headers);
                if self.client.state != ClientState::Connected {
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

    pub(super) fn on_pub(&mut self, m: Message) {
        self.stats.msgs_to_upstream += 1;
        if let Some(consumer) =
            self.js
                .deliveries
                .on_client_publish(m.subject(), m.payload(), self.now)
        {
            self.js.consuming.acked(consumer, m.payload(), self.now);
        }
        if self.client.opts.pedantic && !subject::is_valid_literal_subject(m.subject()) {
            // nats-server complains but still processes the message.
            self.local_err(encode::err("Invalid Publish Subject"));
        }
        if !self.client.opts.echo {
            if let Some(d) = self.overlap.live_mut() {
                let fp = dedup::fingerprint(m.subject(), m.reply(), m.headers(), m.payload());
                d.own_publish(self.subs.matching(m.subject()), fp);
            }
        }
        if let (Some(reply), true) = (m.reply(), jetstream::is_pull_subject(m.subject())) {
            let expires = jetstream::request::parse_body(m.payload()).and_then(|b| b.expires);
            self.js.consuming.pulled(m.subject(), expires, self.now);
            if let Some(sid) = self.subs.sid_for(reply) {
                let headers = m.has_headers().then(|| m.headers());
                let rewritten = self.js.pulls.on_request(
                    m.subject(),
                    reply,
                    sid,
                    headers,
                    m.payload(),
                    self.now,
                );
                debug!(subject = %String::from_utf8_lossy(m.subject()), body = %String::from_utf8_lossy(&m.payload()[..m.payload().len().min(120)]), rewritten = rewritten.is_some(), tracked = self.js.pulls.len(), "pull request");
                // Tracked requests are not kept as unconfirmed publishes: the tracker
                // re-issues them itself when they are lost.
                self.send_pull(rewritten.unwrap_or(m.raw));
                self.reply_ok();
                return;
            }
        }
        let ack = || m.reply().is_none() && jetstream::acks::is_delivery(m.subject());
        if let Some(epoch) = self.hedge_standby().filter(|_| ack()) {
            // An ack while the primary is suspect goes through the standby too, so the
            // consumer's pending count does not grow while the primary is frozen; the
            // primary's copy is kept for re-sending as usual (acks are idempotent; one
            // asking a reply goes once, not to be answered twice).
            self.out
                .actions
                .push_back(Action::ToUpstream(epoch, m.raw.clone()));
        }
        self.send_publish(Pending::Data(m.raw, 1));
        self.reply_ok();
    }

    pub(super) fn on_client_ping(&mut self) {
        let primary_ready = self.links.primary().is_some_and(Link::established);
        if primary_ready || self.switching() || self.starting() {
            self.client.replies.push_pong();
            self.send_publish(Pending::Ping);
        } else {
            // Outage: keep the client alive; nothing upstream can answer.
            self.client.replies.push_pong();
            self.client.replies.pong_arrived();
            self.flush_replies();
        }
    }

    pub(super) fn client_connected(&mut self) {
        self.client.state = ClientState::Connected;
        for role in [Role::Primary, Role::Standby] {
            if self
                .link(role)
                .is_some_and(|l| l.state == LinkState::AwaitClientConnect)
            {
                self.establish(role);
            }
        }
    }

    pub(super) fn client_protocol_error(&mut self, e: ProtoError) {
        debug!(error = %e, "client protocol error");
        let line = e.server_err_line().map_or(Bytes::new(), Bytes::from_static);
        self.fatal_err(line, CloseReason::ClientProtocol);
    }

    pub(super) fn close_with_err(&mut self, text: &str, reason: CloseReason) {
        self.fatal_err(encode::err(text), reason);
    }

    /// An `-ERR` the proxy makes itself; after the replies still owed, as the server
    /// would answer.
    pub(super) fn local_err(&mut self, line: Bytes) {
        if self.client.replies.push_err(line.clone(), None) {
            self.send_client(line);
        }
    }

    /// `line` (empty: a silent close) and the close, after the replies still owed.
    pub(super) fn fatal_err(&mut self, line: Bytes, reason: CloseReason) {
        if self.client.replies.push_err(line.clone(), Some(reason)) {
            self.send_client(line);
            return self.close_client(reason);
        }
        self.client.state = ClientState::Ending;
    }

    pub(super) fn close_client(&mut self, reason: CloseReason) {
        if self.client.is_closed() {
            return;
        }
        self.client.state = ClientState::Closed;
        self.dialing.flush_err_log();
        // What the overlap counted is the session's, also when it ends with the client.
        self.overlap.end_all();
        for l in self.links.take_all().into_iter().flatten() {
            self.out.actions.push_back(Action::CloseUpstream(l.epoch));
        }
        self.out.actions.push_back(Action::CloseClient(reason));
    }

    pub(super) fn send_client(&mut self, b: Bytes) {
        if !self.client.is_closed() {
            self.client.out.extend_from_slice(&b);
        }
    }

    pub(super) fn reply_ok(&mut self) {
        if self.client.opts.verbose && self.client.replies.push_ok() {
            self.send_client(Bytes::from_static(encode::OK));
        }
    }

    pub(super) fn flush_replies(&mut self) {
        while let Some(r) = self.client.replies.pop_ready() {
            match r {
                Ready::Pong => {
                    self.send_client(Bytes::from_static(encode::PONG));
                    if !std::mem::replace(&mut self.client.first_pong_sent, true) {
                        if let Some(info) = self.connect_info_for_client() {
                            self.send_client(info);
                        }
                    }
                }
                Ready::Ok => self.send_client(Bytes::from_static(encode::OK)),
                Ready::Err(line, close) => {
                    self.send_client(line);
                    if let Some(reason) = close {
                        return self.close_client(reason);
                    }
                }
            }
        }
    }

    /// Counts a message and relays it to the client.
    pub(super) fn deliver(&mut self, m: Message) {
        if m.has_headers()
            && !self.client.opts.no_responders
            && m.status() == Some(503)
            && m.payload().is_empty()
        {
            // The server sends no-responders statuses only to clients that asked for them.
            return;
        }
        let seen = m.reply().map_or(Seen::New, |r| self.seen(m.sid(), r));
        if seen != Seen::New {
            return self.keep_back(&m, seen);
        }
        if !self.js.pulls.is_empty() {
            let shield = self.js.pulls.on_message(&m, self.now);
            self.report_replaced_pulls();
            if tracing::enabled!(tracing::Level::DEBUG) {
                if let Some(code) = m.status().filter(|&c| c != 100) {
                    debug!(code, ?shield, sid = %String::from_utf8_lossy(m.sid()), "pull status");
                }
            }
            match shield {
                Shield::Forward => {}
                Shield::Amended(b) if self.client.opts.headers => {
                    self.subs.delivered(m.sid());
                    self.stats.msgs_to_client += 1;
                    self.send_client(b);
                    return;
                }
                Shield::Amended(_) => {}
                Shield::Hide => {
                    self.stats.count_shielded(m.status().unwrap_or(0));
                    info!(status = %String::from_utf8_lossy(m.headers().split(|&c| c == b'\r').next().unwrap_or_default()),
                        sid = %String::from_utf8_lossy(m.sid()), "shielded a JetStream status from the client");
                    return;
                }
                Shield::Swallow => return,
            }
        }
        self.subs.delivered(m.sid());
        self.stats.msgs_to_client += 1;
        if m.has_headers() && !self.client.opts.headers {
            // What nats-server does for clients without header support: strip them.
            let b = encode::msg(m.subject(), m.sid(), m.reply(), None, m.payload());
            self.send_client(b);
        } else if let Some(b) = self.amended_heartbeat(&m) {
            self.stats.heartbeats_amended += 1;
            self.send_client(b);
        } else {
            self.send_client(m.raw);
        }
    }

    /// Keeps from the client a delivery it already has (`seen`, from
    /// [`Deliveries::on_delivery_of`](super::jetstream::acks::Deliveries::on_delivery_of)): one
    /// it acked is acked again (its ack was lost upstream, or the new consumer leader does
    /// not know it); the credit it used is the placement's, not the client's.
    fn keep_back(&mut self, m: &Message, seen: Seen) {
        let reply = m.reply().unwrap_or_default();
        if seen == (Seen::Resent { acked: false }) {
            debug!(reply = %String::from_utf8_lossy(reply), sid = %String::from_utf8_lossy(m.sid()), "kept back a delivery sent again");
            self.stats.duplicates_suppressed += 1;
        } else {
            debug!(reply = %String::from_utf8_lossy(reply), "acked again a delivery the client had acked");
            self.stats.redeliveries_acked += 1;
            self.send_publish(Pending::Data(encode::publish(reply, None, None, b""), 1));
        }
        if !self.js.pulls.is_empty() {
            self.js
                .pulls
                .on_hidden_delivery(m.sid(), m.total_len(), self.now);
        }
        if seen == Seen::Redelivered && !self.js.pulls.tracks(m.sid()) {
            // A push consumer's: its heartbeats must not name a redelivery the client
            // never got (a delivery sent again is one it got).
            if let Some(a) = AckRef::parse(reply) {
                self.subs.hid_redelivery(m.sid(), a.consumer_seq);
            }
        }
        self.subs.delivered(m.sid());
    }

    /// `m` amended when it is an idle heartbeat that names a delivery the proxy hid.
    fn amended_heartbeat(&self, m: &Message) -> Option<Bytes> {
        if !m.has_headers() || m.reply().is_some() {
            return None;
        }
        let run = self.subs.get(m.sid())?.hidden?;
        let b = run.amend(m)?;
        debug!(sid = %String::from_utf8_lossy(m.sid()), last_consumer = run.first - 1,
            "amended a heartbeat that named a redelivery hidden from the client");
        Some(b)
    }
}

impl Session {
    /// Writes a publish (or client PING) to the primary, or queues it in the backlog.
    pub(super) fn send_publish(&mut self, p: Pending) {
        let switching = self.switching();
        let to = self
            .links
            .primary_mut()
            .filter(|l| l.established() && !switching);
        self.backlog.send(to, p, self.now, &mut self.out.actions);
    }

    /// Writes a pull request (the client's, or the tracker's placing it again). While
    /// hedging with the standby up, it goes through the standby instead, once (the
    /// credit is not doubled): the suspect primary may hold it for seconds, and its
    /// deliveries reach the client through either link, whichever is first.
    pub(super) fn send_pull(&mut self, frame: Bytes) {
        match self.hedge_standby() {
            Some(epoch) => self.out.actions.push_back(Action::ToUpstream(epoch, frame)),
            None => self.send_publish(Pending::Untracked(frame)),
        }
    }

    /// SUB/UNSUB go to every link that already replayed, so all hold the same set. A link
    /// not yet replayed gets the table's state in its replay instead.
    pub(super) fn send_sub_op(&mut self, raw: Bytes, is_unsub: bool) {
        let drain_sent = matches!(
            &self.phase,
            Phase::Migrating(_, Step::Draining { drain, .. }) if drain.last_sent
        );
        for role in [Role::Primary, Role::Standby, Role::Retiring] {
            let Some(l) = self.link(role) else { continue };
            let wanted = match role {
                Role::Retiring => is_unsub && !drain_sent,
                _ => l.established(),
            };
            if wanted {
                let epoch = l.epoch;
                self.out
                    .actions
                    .push_back(Action::ToUpstream(epoch, raw.clone()));
            }
        }
    }

    /// Publishes written since the last PING get their confirmation soon (see
    /// [`super::backlog::Backlog::confirm_soon`]).
    pub(super) fn confirm_publishes(&mut self) {
        let primary = self.links.primary_mut();
        self.backlog
            .confirm_soon(primary, self.now, &mut self.out.actions);
    }

    /// The backlog goes to the primary, which now takes traffic.
    pub(super) fn flush_backlog(&mut self) {
        if let Some(l) = self.links.primary_mut() {
            self.backlog.flush(l, self.now, &mut self.out.actions);
        }
        self.confirm_publishes();
    }
}
