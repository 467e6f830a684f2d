//! The pull requests of one client, per inbox subscription: each status and delivery
//! goes to the request it concerns ([`super::phase`] says what becomes of it), and the
//! frames due are returned for the session to write.
//!
//! While a client that asked for `idle_heartbeat` sees nothing on the inbox for that
//! long, the proxy sends it a heartbeat in the server's exact shape, so no library's
//! heartbeat monitor fires while the consumer is away.
//!
//! Bounds: at most [`MAX_TRACKED_REQUESTS`] requests per session; past it the oldest
//! request of one inbox is forgotten (it is then only relayed, not protected).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::pull_phase::{place, Due, Hidden, Placement, PullPhase, Request, PROBE_INTERVAL};
use super::request::{self, Ask, Sequences};
use crate::proto::status::{PullStatus, Rejection};
use crate::proto::Message;

/// Bound of tracked requests per session.
pub const MAX_TRACKED_REQUESTS: usize = 1024;

/// How far before a request's deadline a `408` still counts as that request's expiry
/// (the server's timer and the proxy's clock differ by the link's latency and the
/// driver's scheduling).
pub const EXPIRY_MATCH: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Inbox {
    requests: VecDeque<Request>,
    /// Last time the upstream sent anything on this inbox.
    upstream_seen: Instant,
    /// Last time the client got anything on it (relayed or made by the proxy).
    client_seen: Instant,
    last: Sequences,
}

impl Inbox {
    /// The heartbeat the client expects: the shortest its live requests asked for.
    fn client_hb(&self) -> Option<Duration> {
        self.requests
            .iter()
            .filter_map(|r| r.body.idle_heartbeat)
            .min()
    }

    fn probe_out(&self) -> bool {
        self.requests
            .iter()
            .any(|r| matches!(r.phase, PullPhase::Probing { .. }))
    }

    /// The oldest (or `newest`) placed request on `reply` (statuses name the reply they
    /// answer).
    fn placed_on(&self, reply: &[u8], newest: bool) -> Option<usize> {
        let hit = |r: &Request| r.placed() && r.reply == reply;
        if newest {
            self.requests.iter().rposition(hit)
        } else {
            self.requests.iter().position(hit)
        }
    }

    /// The placed request on `reply` that an end status with `code` closes. A status
    /// names only the reply, and a client may keep several requests on one inbox: nats.go
    /// returns from `Fetch` at its first message and leaves its waiting request behind, so
    /// the next `Fetch`'s `no_wait` request is out beside it. A `408` at a request's
    /// deadline (within [`EXPIRY_MATCH`]) is that request's expiry; any other `404` or
    /// `408` answers a `no_wait` request (nothing pending, other requests pending, or the
    /// one-shot served), the oldest one; everything else the oldest request. Closing the
    /// wrong one would leave the right one tracked as placed: its heartbeats then stop,
    /// and the proxy would answer the client again for a request the server already
    /// ended.
    fn ended_by(&self, reply: &[u8], code: Option<u16>, now: Instant) -> Option<usize> {
        let placed = |r: &&Request| r.placed() && r.reply == reply;
        let candidates = || self.requests.iter().enumerate().filter(|(_, r)| placed(r));
        if code == Some(408) {
            let expiring = candidates()
                .filter_map(|(i, r)| r.deadline.map(|d| (i, d)))
                .filter(|(_, d)| d.saturating_duration_since(now) <= EXPIRY_MATCH)
                .min_by_key(|(_, d)| *d);
            if let Some((i, _)) = expiring {
                return Some(i);
            }
        }
        if matches!(code, Some(404 | 408)) {
            if let Some((i, _)) = candidates().find(|(_, r)| r.body.no_wait) {
                return Some(i);
            }
        }
        candidates().map(|(i, _)| i).next()
    }

    /// The consumer answered: a probe has done its job, and requests waiting for a
    /// probe turn can be placed in full.
    fn consumer_answered(&mut self, now: Instant, replaced: &mut Replaced) {
        for r in self.requests.iter_mut() {
            match &mut r.phase {
                PullPhase::Probing { answered, .. } => {
                    *answered = true;
                    // The consumer serves it again: the gap it stood for ends here.
                    replaced.extend(r.lost_at.take().map(|t| now.saturating_duration_since(t)));
                }
                PullPhase::Unplaced { at, next } if *next == Placement::Probe => {
                    *at = now;
                    *next = Placement::Full;
                }
                _ => {}
            }
        }
    }
}

/// What to do with a message on a tracked inbox: the tracker decides, the session counts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Shield {
    Forward,
    /// An end status for a request some of whose deliveries the proxy hid: this frame,
    /// whose credit left counts them as never made, goes to the client instead.
    Amended(Bytes),
    /// A status the client's library would turn into an error (the consumer moved or
    /// is away): kept from the client, and counted as shielded.
    Hide,
    /// The proxy's own business (a heartbeat no client request asked for, the end of a
    /// probe): dropped, not counted.
    Swallow,
}

/// A frame the tracker wants written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullAction {
    /// A request placed again (lost with a link, or moved), to publish upstream: the
    /// session counts each as a re-issued pull.
    Reissue(Bytes),
    /// A status made by the proxy in the server's shape, for the client.
    ToClient(Bytes),
}

/// Pull requests of one client, per inbox subscription (sid).
#[derive(Debug, Default)]
pub struct PullTracker {
    inboxes: HashMap<Bytes, Inbox>,
    /// Lost requests served again since the last [`Self::poll_replaced`]: how long each
    /// was lost. At most [`MAX_REPLACED`]; past it the oldest is dropped.
    replaced: Replaced,
}

/// Bound of [`PullTracker::poll_replaced`]'s queue.
pub const MAX_REPLACED: usize = 64;

#[derive(Debug, Default)]
struct Replaced(VecDeque<Duration>);

impl Extend<Duration> for Replaced {
    fn extend<T: IntoIterator<Item = Duration>>(&mut self, it: T) {
        for d in it {
            if self.0.len() >= MAX_REPLACED {
                self.0.pop_front();
            }
            self.0.push_back(d);
        }
    }
}

impl PullTracker {
    /// True when nothing is tracked (the hot path skips the tracker then).
    pub fn is_empty(&self) -> bool {
        self.inboxes.is_empty()
    }

    /// True if `sid` is an inbox with tracked pull requests.
    pub fn tracks(&self, sid: &[u8]) -> bool {
        self.inboxes.contains_key(sid)
    }

    /// Requests tracked now.
    pub fn len(&self) -> usize {
        self.inboxes.values().map(|i| i.requests.len()).sum()
    }

    /// The next lost request served again: how long from its loss to the first answer of
    /// its consumer (a probe's delivery or status) or to its full placement.
    pub fn poll_replaced(&mut self) -> Option<Duration> {
        self.replaced.0.pop_front()
    }

    /// Requests known not to be placed in full now (Unplaced, or only probing).
    pub fn unplaced(&self) -> usize {
        self.inboxes
            .values()
            .flat_map(|i| i.requests.iter())
            .filter(|r| !matches!(r.phase, PullPhase::Live { .. }))
            .count()
    }

    /// The phases of the requests on `sid`, oldest first.
    #[cfg(test)]
    pub fn phases(&self, sid: &[u8]) -> Vec<PullPhase> {
        self.inboxes
            .get(sid)
            .map(|i| i.requests.iter().map(|r| r.phase).collect())
            .unwrap_or_default()
    }

    /// A client request on `api_subject` with reply `reply`, delivered on `sid`. Returns
    /// the frame to send upstream instead of the client's when the proxy changed it (its
    /// heartbeat), or None to send the client's bytes as they are (also for anything
    /// that does not parse: it is then only relayed).
    pub fn on_request(
        &mut self,
        api_subject: &[u8],
        reply: &[u8],
        sid: Bytes,
        headers: Option<&[u8]>,
        payload: &[u8],
        now: Instant,
    ) -> Option<Bytes> {
        let body = request::parse_body(payload)?;
        if self.len() >= MAX_TRACKED_REQUESTS {
            self.forget_oldest();
        }
        let hb = body.upstream_heartbeat(body.expires);
        let rewritten = (hb != body.idle_heartbeat).then(|| {
            let ask = Ask {
                batch: body.batch,
                max_bytes: (body.max_bytes > 0).then_some(body.max_bytes),
                expires: body.expires,
                idle_heartbeat: hb,
            };
            request::encode_placement(api_subject, reply, headers, &body, ask)
        });
        let req = Request {
            reply: Bytes::copy_from_slice(reply),
            api_subject: Bytes::copy_from_slice(api_subject),
            headers: headers.map(Bytes::copy_from_slice),
            batch_left: body.batch,
            bytes_left: (body.max_bytes > 0).then_some(body.max_bytes),
            deadline: body.expires.map(|e| now + e),
            hb,
            no_hb: false,
            as_sent: rewritten.is_none(),
            served: false,
            hidden: Hidden::default(),
            phase: PullPhase::Live { placed: now },
            lost_at: None,
            body,
        };
        let inbox = self.inboxes.entry(sid).or_insert_with(|| Inbox {
            requests: VecDeque::new(),
            upstream_seen: now,
            client_seen: now,
            last: Sequences::default(),
        });
        inbox.requests.push_back(req);
        rewritten
    }

    fn forget_oldest(&mut self) {
        let oldest = self.inboxes.keys().next().cloned();
        if let Some(sid) = oldest {
            if let Some(inbox) = self.inboxes.get_mut(&sid) {
                inbox.requests.pop_front();
            }
            self.drop_if_empty(&sid);
        }
    }

    fn drop_if_empty(&mut self, sid: &[u8]) {
        if self.inboxes.get(sid).is_some_and(|i| i.requests.is_empty()) {
            self.inboxes.remove(sid);
        }
    }

    /// A delivery on `sid` (not a status) of `total_len` header and payload bytes, with
    /// its `$JS.ACK` reply: takes one from the credit of the oldest placed request.
    pub fn on_delivery(
        &mut self,
        sid: &[u8],
        reply: Option<&[u8]>,
        total_len: usize,
        now: Instant,
    ) {
        self.delivery(sid, reply, total_len, false, now);
    }

    /// A delivery on `sid` the proxy kept from the client (a redelivery of a message it
    /// had acked): it used the credit of the oldest placed request's placement, not the
    /// client's; a placement it used up is placed again (see [`Request::delivered`]).
    pub fn on_hidden_delivery(&mut self, sid: &[u8], total_len: usize, now: Instant) {
        self.delivery(sid, None, total_len, true, now);
    }

    fn delivery(
        &mut self,
        sid: &[u8],
        reply: Option<&[u8]>,
        total_len: usize,
        hidden: bool,
        now: Instant,
    ) {
        let Some(inbox) = self.inboxes.get_mut(sid) else {
            return;
        };
        inbox.upstream_seen = now;
        if !hidden {
            inbox.client_seen = now;
        }
        // Only a client that asked for heartbeats gets the proxy's, which carry these.
        if inbox.client_hb().is_some() {
            if let Some(s) = reply.and_then(Sequences::of_ack) {
                inbox.last = s;
            }
        }
        inbox.consumer_answered(now, &mut self.replaced);
        if let Some(i) = inbox.requests.iter().position(Request::placed) {
            if inbox.requests[i].delivered(total_len as u64, hidden, now) {
                inbox.requests.remove(i);
            }
        }
        self.drop_if_empty(sid);
    }

    /// A message on a subscription; deliveries go to [`Self::on_delivery`], statuses are
    /// decided by their [`PullStatus`].
    pub fn on_message(&mut self, m: &Message, now: Instant) -> Shield {
        let sid = m.sid();
        let Some(status) = PullStatus::of(m) else {
            self.on_delivery(sid, m.reply(), m.total_len(), now);
            return Shield::Forward;
        };
        let Some(inbox) = self.inboxes.get_mut(sid) else {
            return Shield::Forward;
        };
        inbox.upstream_seen = now;
        let reply = m.subject();
        let shield = match status {
            PullStatus::Heartbeat => {
                inbox.consumer_answered(now, &mut self.replaced);
                if inbox.client_hb().is_some() {
                    Shield::Forward
                } else {
                    Shield::Swallow
                }
            }
            PullStatus::Ended => {
                inbox.consumer_answered(now, &mut self.replaced);
                match inbox.ended_by(reply, m.status(), now) {
                    Some(i) => ended(inbox, i, m, now),
                    None => Shield::Forward,
                }
            }
            PullStatus::LeaderChanged
            | PullStatus::LeaderShutDown
            | PullStatus::ConsumerUnavailable => {
                let newest = status == PullStatus::ConsumerUnavailable;
                if let Some(i) = inbox.placed_on(reply, newest) {
                    lost_to_leader(inbox, i, status, now);
                }
                Shield::Hide
            }
            PullStatus::Rejected(Rejection::ConsumerGone) => {
                inbox.requests.clear();
                Shield::Forward
            }
            PullStatus::Rejected(Rejection::HeartbeatTooLarge) => {
                match inbox.placed_on(reply, true) {
                    Some(i) => heartbeat_refused(inbox, i, now),
                    None => Shield::Forward,
                }
            }
            PullStatus::Rejected(Rejection::Request) => {
                if let Some(i) = inbox.placed_on(reply, true) {
                    inbox.requests.remove(i);
                }
                Shield::Forward
            }
            PullStatus::Other => Shield::Forward,
        };
        if matches!(shield, Shield::Forward | Shield::Amended(_)) {
            inbox.client_seen = now;
        }
        self.drop_if_empty(sid);
        shield
    }

    /// Every placed request may be gone (the link that carried them failed): place all
    /// again, probing first.
    pub fn all_lost(&mut self, now: Instant) {
        self.all_placed_again(now, Placement::Probe);
    }

    /// The link that carried the requests is suspect and another is up (a hedge): the
    /// consumer answers, so every placed request goes again at once, in full, with its
    /// remaining credit and expiry (through the other link: the session's choice).
    pub fn link_suspect(&mut self, now: Instant) {
        self.all_placed_again(now, Placement::Full);
    }

    fn all_placed_again(&mut self, now: Instant, next: Placement) {
        for inbox in self.inboxes.values_mut() {
            for r in inbox.requests.iter_mut().filter(|r| r.placed()) {
                r.lose(now, next, now);
            }
            inbox.upstream_seen = now;
        }
    }

    /// A sign that a consumer away may be back (a node joined the cluster): requests
    /// waiting for their next probe are probed now (still one probe per inbox).
    pub fn consumer_may_be_back(&mut self, now: Instant) {
        for r in self
            .inboxes
            .values_mut()
            .flat_map(|i| i.requests.iter_mut())
        {
            if let PullPhase::Unplaced {
                at,
                next: Placement::Probe,
            } = &mut r.phase
            {
                *at = (*at).min(now);
            }
        }
    }

    /// The client unsubscribed `sid`: its requests can no longer be served.
    pub fn unsubscribed(&mut self, sid: &[u8]) {
        self.inboxes.remove(sid);
    }

    /// Runs what is due at `now`; `upstream`: a link can carry placements. Returns the
    /// frames to write, in order.
    pub fn on_timeout(&mut self, now: Instant, upstream: bool) -> Vec<PullAction> {
        let mut out = Vec::new();
        let mut emptied = Vec::new();
        for (sid, inbox) in self.inboxes.iter_mut() {
            let mut i = 0;
            while i < inbox.requests.len() {
                let probe_out = inbox.probe_out();
                let seen = inbox.upstream_seen;
                let due = inbox.requests[i].due(seen, upstream, probe_out);
                let Some((_, what)) = due.filter(|(t, _)| *t <= now) else {
                    i += 1;
                    continue;
                };
                let r = &mut inbox.requests[i];
                match what {
                    Due::Expire => {
                        let frame = if r.body.answered_at_once() {
                            request::no_messages(&r.reply, sid)
                        } else {
                            let bytes = r.bytes_left.unwrap_or(0);
                            request::request_timeout(&r.reply, sid, r.batch_left, bytes)
                        };
                        out.push(PullAction::ToClient(frame));
                        inbox.client_seen = now;
                        inbox.requests.remove(i);
                        continue;
                    }
                    Due::Forget => {
                        inbox.requests.remove(i);
                        continue;
                    }
                    Due::HeartbeatsMissed => r.lose(now, Placement::Probe, now),
                    Due::ProbeUnanswered => {
                        let answered = matches!(r.phase, PullPhase::Probing { answered: true, .. });
                        r.phase = PullPhase::Unplaced {
                            at: now,
                            next: if answered {
                                Placement::Full
                            } else {
                                Placement::Probe
                            },
                        };
                    }
                    Due::Place(_) if r.body.answered_at_once() => {
                        // The consumer is away or moved: a no_wait request is answered
                        // "nothing now", as the server answers it with nothing pending.
                        out.push(PullAction::ToClient(request::no_messages(&r.reply, sid)));
                        inbox.client_seen = now;
                        inbox.requests.remove(i);
                        continue;
                    }
                    Due::Place(how) => {
                        let (frame, lost_for) = place(r, how, now);
                        self.replaced.extend(lost_for);
                        out.push(PullAction::Reissue(frame));
                    }
                }
                // The phase changed; look at this request again.
            }
            if let Some(hb) = inbox.client_hb() {
                if now >= inbox.client_seen + hb {
                    let newest = inbox.requests.back().map(|r| r.reply.clone());
                    if let Some(reply) = newest {
                        out.push(PullAction::ToClient(request::idle_heartbeat(
                            &reply, sid, inbox.last,
                        )));
                        inbox.client_seen = now;
                    }
                }
            }
            if inbox.requests.is_empty() {
                emptied.push(sid.clone());
            }
        }
        for sid in emptied {
            self.inboxes.remove(&sid);
        }
        out
    }

    /// The next moment [`Self::on_timeout`] has something to do.
    pub fn poll_timeout(&self, upstream: bool) -> Option<Instant> {
        self.inboxes
            .values()
            .flat_map(|ib| {
                let probe_out = ib.probe_out();
                let beat = ib.client_hb().map(|hb| ib.client_seen + hb);
                ib.requests
                    .iter()
                    .filter_map(move |r| r.due(ib.upstream_seen, upstream, probe_out))
                    .map(|(t, _)| t)
                    .chain(beat)
            })
            .min()
    }
}

/// An `Ended` status for placed request `i`: a probe that ended before the client's
/// deadline is the proxy's business (place the rest in full), unless it served a one-shot
/// `no_wait` request (a delivery came: the server ends such a request at its first
/// messages, and so would the client's own placement have ended); anything else is the
/// request's true end and reaches the client, amended when the proxy hid some of the
/// placement's deliveries ([`request::with_hidden_credit`]).
fn ended(inbox: &mut Inbox, i: usize, m: &Message, now: Instant) -> Shield {
    let r = &mut inbox.requests[i];
    let client_time_left = r.remaining(now).is_none_or(|d| !d.is_zero());
    let one_shot_served = r.body.no_wait && r.served;
    if matches!(r.phase, PullPhase::Probing { .. }) && client_time_left && !one_shot_served {
        r.phase = PullPhase::Unplaced {
            at: now,
            next: Placement::Full,
        };
        return Shield::Swallow;
    }
    let Some(r) = inbox.requests.remove(i) else {
        return Shield::Forward;
    };
    let bytes = if r.bytes_left.is_some() {
        r.hidden.bytes
    } else {
        0
    };
    (r.hidden.msgs > 0)
        .then(|| request::with_hidden_credit(m, r.hidden.msgs, bytes))
        .flatten()
        .map_or(Shield::Forward, Shield::Amended)
}

/// A leader status (changed, shut down) or an unavailable consumer for placed request
/// `i`: it is lost, and placed again, in full at once where the sender is the new leader
/// (a probe would only wait out its own expiry if that leader is not delivering yet), as
/// a probe otherwise, after `PROBE_INTERVAL` while the consumer is unavailable.
fn lost_to_leader(inbox: &mut Inbox, i: usize, status: PullStatus, now: Instant) {
    let r = &mut inbox.requests[i];
    let (at, next) = match (status, r.phase) {
        (PullStatus::ConsumerUnavailable, _) => (now + PROBE_INTERVAL, Placement::Probe),
        (PullStatus::LeaderChanged, _) => (now, Placement::Full),
        (_, PullPhase::Probing { answered: true, .. }) => (now, Placement::Full),
        _ => (now, Placement::Probe),
    };
    // A no_wait request without expiry is answered at once rather than waited for.
    let at = if r.body.answered_at_once() { now } else { at };
    r.lose(at, next, now);
}

/// A heartbeat the server refused as too large for placed request `i`: ours (the
/// proxy added it) is placed again without one; the client's own reaches the client.
fn heartbeat_refused(inbox: &mut Inbox, i: usize, now: Instant) -> Shield {
    let r = &mut inbox.requests[i];
    if r.as_sent {
        inbox.requests.remove(i);
        return Shield::Forward;
    }
    r.no_hb = true;
    r.phase = PullPhase::Unplaced {
        at: now,
        next: Placement::Full,
    };
    Shield::Hide
}
