//! The upstream links: dialling, the handshake and replay, the server's ops, and a link's
//! loss.

use bytes::{Bytes, BytesMut};
use tracing::{debug, info, warn};

use super::action::{Action, CloseReason, Epoch};
use super::client_side::ClientState;
use super::dedup;
use super::jetstream::PullAction;
use super::link::{Link, LinkState, PingOwner};
use super::links::Role;
use super::phase::Phase;
use super::stats::{MoveReason, SessionEvent};
use super::Session;
use crate::auth;
use crate::proto::json::ServerInfo;
use crate::proto::{encode, Limits, Message, ServerErr, ServerOp, MAX_CONTROL_LINE};

impl Session {
    pub(super) fn link(&self, role: Role) -> Option<&Link> {
        self.links.get(role)
    }

    pub(super) fn link_mut(&mut self, role: Role) -> Option<&mut Link> {
        self.links.get_mut(role)
    }

    pub(super) fn role_of(&self, epoch: Epoch) -> Option<Role> {
        self.links.role_of(epoch)
    }

    /// Dials the next node as the standby link.
    pub(super) fn start_dial(&mut self) {
        self.dialing.cancel();
        if self.client.is_closed() {
            return;
        }
        let exclude = match &self.phase {
            Phase::Migrating(m, _) | Phase::Outage { from: m, .. } => Some(m.from.clone()),
            _ => self.links.primary().map(|l| l.addr.clone()),
        };
        if !self.dialing.admit(self.now) {
            return;
        }
        let Some(addr) = self.pool.pick(exclude.as_deref(), self.now) else {
            return;
        };
        let epoch = self.links.new_standby(addr.clone(), self.now);
        debug!(%epoch, upstream = %addr, "dialing");
        self.out.actions.push_back(Action::Dial { epoch, addr });
    }

    /// Schedules the next dial with exponential backoff and jitter.
    pub(super) fn schedule_dial(&mut self) {
        let (min, max) = (self.cfg.backoff_min, self.cfg.backoff_max);
        self.dialing.back_off(self.now, min, max);
    }

    pub(super) fn on_upstream_op(&mut self, epoch: Epoch, role: Role, op: ServerOp) {
        match op {
            ServerOp::Msg(m) => self.on_upstream_msg(epoch, m),
            ServerOp::Ping => self
                .out
                .actions
                .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PONG))),
            ServerOp::Pong => self.on_pong(role),
            ServerOp::Ok => {}
            ServerOp::Err(text) => self.on_upstream_err(epoch, role, text),
            ServerOp::Info(json) => self.on_info(epoch, role, &json),
        }
    }

    fn on_upstream_err(&mut self, epoch: Epoch, role: Role, text: Bytes) {
        let addr = self.link(role).map(|l| l.addr.clone()).unwrap_or_default();
        self.dialing.log_err(epoch, &addr, &text);
        let class = ServerErr::classify(&text);
        if class == ServerErr::StaleConnection {
            // A dying link's 'Stale Connection' is the proxy's business.
            return;
        }
        let Some(l) = self.link_mut(role) else { return };
        if !l.is_accepted() {
            // A handshake refusal (control line, credentials, ...): the server closes
            // next, and `link_lost` decides whether another node may do better.
            l.refusal = Some(text);
            return;
        }
        // Only the primary's errors concern the client.
        if role == Role::Primary {
            self.send_client([b"-ERR ", &text[..], b"\r\n"].concat().into());
        }
    }

    /// A link the server closed after refusing our handshake. True when the client was
    /// closed: the refusal is one every node gives (credentials), or each known node has
    /// refused once, and no accepted primary remains.
    fn handshake_refused(&mut self, text: &Bytes) -> bool {
        let everywhere = self.dialing.refused(text, self.pool.len());
        if !everywhere || self.links.primary().is_some_and(Link::is_accepted) {
            return false;
        }
        warn!(refusals = self.dialing.refusals(), err = %String::from_utf8_lossy(text),
            "upstream refused the handshake; closing the client with its -ERR");
        self.send_client([b"-ERR ", &text[..], b"\r\n"].concat().into());
        self.close_client(CloseReason::UpstreamRefused);
        true
    }

    pub(super) fn on_info(&mut self, epoch: Epoch, role: Role, json: &[u8]) {
        let Some(info) = ServerInfo::parse(json) else {
            warn!(%epoch, "unparsable INFO from upstream");
            return self.link_lost(epoch, MoveReason::Protocol);
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
                if let Some(s) = self.links.take(Role::Standby) {
                    self.out.actions.push_back(Action::CloseUpstream(s.epoch));
                }
                self.standby_gone();
                return self.schedule_dial();
            }
            let Some(l) = self.link_mut(role) else { return };
            l.state = LinkState::AwaitClientConnect;
            l.info = Some(info);
            self.pool.mark_ok(&addr);
            if self.client.state == ClientState::NoInfo {
                self.send_client_info(role);
            }
            if self.client.state == ClientState::Connected {
                self.establish(role);
            }
            return;
        }
        if info.is_connect_info() {
            // Not news about the cluster: what the client gets after its first PONG.
            l.connect_info = Some(info);
            return;
        }
        let newly_ldm = info.ldm && l.mark_leaving();
        // A node (re)joined the cluster: a consumer that was away may be back.
        let grew = l.info.as_ref().is_some_and(|o| {
            info.connect_urls
                .iter()
                .any(|u| !o.connect_urls.contains(u))
        });
        let old = l.info.replace(info);
        if grew && role == Role::Primary && !self.js.pulls.is_empty() {
            self.js.pulls.consumer_may_be_back(self.now);
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

    pub(super) fn send_client_info(&mut self, role: Role) {
        let Some(info) = self.link(role).and_then(|l| l.info.as_ref()) else {
            return;
        };
        let (mp, auth) = self.client_info_terms(info);
        let json = info.client_info_json(mp, auth);
        self.client.dec.set_limits(Limits {
            max_payload: mp,
            ..Limits::default()
        });
        self.send_client(encode::info(&json));
        self.client.state = ClientState::AwaitConnect;
    }

    /// The `max_payload` and `auth_required` of the INFOs the client gets from `info`.
    fn client_info_terms(&self, info: &ServerInfo) -> (usize, bool) {
        let mp = info.max_payload.unwrap_or(crate::proto::MAX_PAYLOAD);
        // Clients send credentials only when asked; ask when theirs pass through.
        let auth =
            self.cfg.client_auth.is_some() || info.auth_required && self.cfg.credentials.is_none();
        (mp, auth)
    }

    /// The INFO nats-server sends a `protocol:1` client after the PONG to its first PING,
    /// made from the primary's, if the primary's server sent one (2.12+).
    pub(super) fn connect_info_for_client(&self) -> Option<Bytes> {
        if self.client.opts.protocol < 1 {
            return None;
        }
        let info = self.links.primary()?.connect_info.as_ref()?;
        let (mp, auth) = self.client_info_terms(info);
        Some(encode::info(&info.client_connect_info_json(mp, auth)))
    }

    /// CONNECT, PING, the subscription replay and a PING on a link that has its INFO.
    pub(super) fn establish(&mut self, role: Role) {
        let nonce = self
            .link(role)
            .and_then(|l| l.info.as_ref())
            .and_then(|i| i.nonce.clone());
        let auth = auth::connect_auth(
            self.cfg.credentials.as_ref(),
            &self.client.opts,
            nonce.as_deref(),
            self.cfg.proxy_key.as_ref(),
        );
        let json = match self
            .client
            .opts
            .upstream_connect_json(&auth, MAX_CONTROL_LINE)
        {
            Ok(json) => json,
            Err(e) => {
                // Every node would refuse it the same way: say what nats-server says.
                warn!(
                    len = e.len,
                    limit = MAX_CONTROL_LINE,
                    "the client's CONNECT cannot be made to fit the upstream's control line"
                );
                return self
                    .close_with_err("maximum control line exceeded", CloseReason::ClientProtocol);
            }
        };
        let replay = self.subs.replay();
        let n_subs = self.subs.len() as u64;
        let now = self.now;
        let interval = self.cfg.keepalive_interval();
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
        self.out
            .actions
            .push_back(Action::ToUpstream(epoch, out.freeze()));
        self.stats.subs_replayed += n_subs;
        if role == Role::Standby {
            match self.links.primary() {
                // Make-before-break: both links deliver from now on.
                Some(p) => self.attach_overlap(p.epoch, epoch),
                None => self.promote_standby(),
            }
            if self.hedge_standby().is_some() && !self.js.pulls.is_empty() {
                // The suspect primary holds the client's pull requests: they go again
                // through the standby, behind its replayed SUBs.
                self.js.pulls.link_suspect(now);
                self.reissue_due_pulls();
            }
        }
    }

    pub(super) fn on_pong(&mut self, role: Role) {
        let now = self.now;
        let Some(l) = self.link_mut(role) else { return };
        let Some(entry) = l.pong() else { return };
        if role == Role::Primary && matches!(self.phase, Phase::Hedging { .. }) {
            self.end_hedge();
        }
        match entry.owner {
            PingOwner::Client => {
                self.client.replies.pong_arrived();
                self.flush_replies();
            }
            PingOwner::Handshake => {
                self.dialing.handshake_taken();
                let refusal = self.link_mut(role).and_then(|l| l.refusal.take());
                if let (Some(text), Role::Primary) = (refusal, role) {
                    // An -ERR that did not end the handshake: the client's, as usual.
                    self.send_client([b"-ERR ", &text[..], b"\r\n"].concat().into());
                }
            }
            PingOwner::Replay => {
                if role == Role::Standby && self.links.primary().is_some() {
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

    /// A message from an upstream link.
    pub(super) fn on_upstream_msg(&mut self, epoch: Epoch, m: Message) {
        if let Some(d) = self.overlap.live_mut().filter(|d| d.covers(epoch)) {
            let fp = dedup::fingerprint(m.subject(), m.reply(), m.headers(), m.payload());
            let sid = m.raw.slice(m.sid.range());
            let t = d.on_message(epoch, &sid, fp, m.raw.len(), m);
            self.stats.count_overlap(t);
            self.forward_ready();
            // The copy may have been the proof A's UNSUBs were waiting for.
            return self.maybe_drain();
        }
        self.forward(m);
    }

    pub(super) fn link_lost(&mut self, epoch: Epoch, reason: MoveReason) {
        let Some(role) = self.role_of(epoch) else {
            return;
        };
        let Some(l) = self.links.take(role) else {
            return;
        };
        self.out.actions.push_back(Action::CloseUpstream(epoch));
        if let Some(text) = &l.refusal {
            if self.handshake_refused(text) {
                return;
            }
        }
        match role {
            Role::Standby => self.standby_failed(&l, reason),
            // Lame duck closed it (or it died) before or during the drain.
            Role::Retiring => self.finish_migration("migration complete; old upstream closed"),
            Role::Primary => self.failover(l, reason),
        }
    }

    /// Runs the pull tracker's due work: placements upstream (only with a working
    /// upstream: without one they would pile up in the backlog and each add credit once
    /// sent; the next link places every request anyway) and statuses for the client.
    pub(super) fn reissue_due_pulls(&mut self) {
        if self.js.pulls.is_empty() {
            return;
        }
        let upstream = self.has_upstream();
        let mut placed = false;
        for action in self.js.pulls.on_timeout(self.now, upstream) {
            match action {
                PullAction::Reissue(frame) => {
                    self.stats.pulls_reissued += 1;
                    info!(request = %String::from_utf8_lossy(&frame[..frame.len().min(200)]).trim_end(), "placing a pull request again");
                    self.send_pull(frame);
                    placed = true;
                }
                PullAction::ToClient(frame) => {
                    debug!(status = %String::from_utf8_lossy(&frame[..frame.len().min(120)]).trim_end(), "pull status made by the proxy");
                    self.send_client(frame);
                }
            }
        }
        if placed {
            self.confirm_publishes();
        }
        self.report_replaced_pulls();
    }

    /// Reports the lost pull requests the tracker saw served again.
    pub(super) fn report_replaced_pulls(&mut self) {
        while let Some(d) = self.js.pulls.poll_replaced() {
            self.event(SessionEvent::PullReplaced(d));
        }
    }
}
