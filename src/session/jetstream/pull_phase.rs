//! What becomes of one pull request: its phases and the events that move it.
//!
//! ```text
//!   client PUB ──► Live ──(credit used up, Ended status)──► gone (status relayed)
//!                   │  ▲
//!   a 409,          │  │ placed Full
//!   heartbeats      ▼  │
//!   missed, ──► Unplaced{at, Probe|Full} ◄──(503: at + PROBE_INTERVAL)── Probing
//!   failover        │   ▲                                                 ▲  │
//!                   │   └──(unanswered by until + PROBE_GRACE: Probe)─────┘  │
//!                   └──(at, upstream, no other probe on the inbox)──────────►┘
//!                          Probing ──(answered: 408, 100 or a delivery)──► Unplaced{now, Full}
//!   LeaderChanged (409 Leadership Change) ──► Unplaced{now, Full}: its sender is the new leader
//!   LeaderShutDown, heartbeats missed, failover ──► Unplaced{now, Probe}: the consumer may be away
//!   Unplaced at the client's deadline - EXPIRE_LEAD ──► 408 Request Timeout made by the proxy
//!   Unplaced no_wait without expiry ──► 404 No Messages made by the proxy, at once
//!   Live past deadline + LIVE_EXPIRY_GRACE without an end ──► forgotten
//!   Live, its placement's credit used by deliveries kept from the client ──► Unplaced{now, Full}
//! ```
//!
//! - **Live**: placed upstream with the client's remaining credit and expiry, and a
//!   heartbeat chosen by [`PullBody::upstream_heartbeat`]; two missed beats mean the
//!   request vanished (an R1 consumer whose node went lame duck drops it silently).
//! - **Probing**: placed with a short expiry ([`PROBE_EXPIRES`]) to learn whether the
//!   consumer is back. Any answer from it moves the request to a full placement; no
//!   answer at all (nats-server 2.9 never answers a pull to an unavailable consumer) or a
//!   `503` means: not yet. At most one probe per inbox is out at a time, so credit never
//!   doubles; probes go at most every [`PROBE_INTERVAL`] (2.15: `503` at once) or every
//!   [`PROBE_EXPIRES`] + [`PROBE_GRACE`] (2.9: no answer), i.e. at most 10 a second per
//!   inbox while its consumer has no leader (2.15), 2.5 a second on 2.9: a new leader is
//!   found within about 100 ms of its election.
//! - **Unplaced**: known not to be placed anywhere (it died with its consumer leader, or
//!   the link that carried it failed), waiting for a link or its probe turn.
//!
//! While a client that asked for `idle_heartbeat` sees nothing on the inbox for that
//! long, the proxy sends it a heartbeat in the server's exact shape, so no library's
//! heartbeat monitor fires while the consumer is away. A request that ends normally
//! (expiry, `408`, credit used) is never placed again behind the client's back.
//!
//! [`super::tracker`] holds the requests per inbox and feeds them the events.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::request::{self, Ask, PullBody};

/// Upstream expiry of a probe.
pub const PROBE_EXPIRES: Duration = Duration::from_millis(250);
/// How long after a probe's expiry its `408` may still come before it counts as unanswered.
pub const PROBE_GRACE: Duration = Duration::from_millis(150);
/// Wait before the next probe after a `503`.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Slack on "two heartbeats missed" for timer and network jitter.
pub const HB_SLACK: Duration = Duration::from_millis(50);
/// How long past its deadline a placed request's `408` may come before it is forgotten.
pub const LIVE_EXPIRY_GRACE: Duration = Duration::from_secs(1);
/// How long before the client's deadline the proxy's own `408` ends an unplaced request
/// (at most; a tenth of the request's expiry when that is less). The client's timer fires
/// at the deadline too, and a `408` that comes after it is taken by the client's next
/// request on the same inbox. cnats 3.4 reads every `Fetch` from one inbox: its next
/// `Fetch` ends on the stale `408`, that `Fetch`'s own `404` then reaches the one after
/// it, which reports `Not Found` (seen in CI: 4 errors while an R1 consumer was away 40 s,
/// the proxy's timers late under load).
pub const EXPIRE_LEAD: Duration = Duration::from_millis(50);

/// The next placement of an unplaced request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// With the remaining credit and expiry: the consumer is known to answer.
    Full,
    /// A short probe: whether the consumer answers is unknown.
    Probe,
}

/// Where a request stands (see the module diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPhase {
    Live { placed: Instant },
    Probing { until: Instant, answered: bool },
    Unplaced { at: Instant, next: Placement },
}

#[derive(Debug)]
pub(super) struct Request {
    pub(super) reply: Bytes,
    pub(super) api_subject: Bytes,
    pub(super) headers: Option<Bytes>,
    pub(super) body: PullBody,
    pub(super) batch_left: u64,
    pub(super) bytes_left: Option<u64>,
    pub(super) deadline: Option<Instant>,
    /// The heartbeat of the current Live placement, if it has one.
    pub(super) hb: Option<Duration>,
    /// The server refused our heartbeat once (`400 … heartbeat value too large`).
    pub(super) no_hb: bool,
    /// The current placement is the client's own frame, unchanged.
    pub(super) as_sent: bool,
    /// A delivery came under the current placement (a one-shot `no_wait` request is
    /// then served, and its end is the client's).
    pub(super) served: bool,
    /// Deliveries of the current placement the proxy kept from the client (redeliveries
    /// of messages it had acked): they used the placement's credit, not the client's.
    pub(super) hidden: Hidden,
    pub(super) phase: PullPhase,
    /// When the request was found lost (its leader moved, its link failed, its
    /// heartbeats stopped); taken, and the time reported, by the consumer's first answer
    /// to a probe of it or by its next full placement, whichever comes first. A request
    /// that ends unplaced (the proxy's `408`) reports nothing.
    pub(super) lost_at: Option<Instant>,
}

/// Credit of a placement that went to deliveries the client never saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Hidden {
    pub(super) msgs: u64,
    pub(super) bytes: u64,
}

/// What is due for one request, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Unplaced at the client's deadline (less [`EXPIRE_LEAD`]): the proxy writes the
    /// server's `408`.
    Expire,
    /// Placed, and its end never came by the deadline + [`LIVE_EXPIRY_GRACE`]: forgotten
    /// without a word (the client's own timer has ended it; a late status would only
    /// confuse the client's next request on the same inbox).
    Forget,
    HeartbeatsMissed,
    ProbeUnanswered,
    Place(Placement),
}

impl Request {
    /// Live ─ lost (a `409`, heartbeats missed, link failed) ─► Unplaced: the
    /// first loss since the last full placement starts the re-placement clock.
    pub(super) fn lose(&mut self, at: Instant, next: Placement, now: Instant) {
        self.lost_at.get_or_insert(now);
        self.phase = PullPhase::Unplaced { at, next };
    }

    /// One delivery of `len` bytes under the current placement; `hidden`: the proxy kept
    /// it from the client. Returns true when the client's credit is used up (the request
    /// is done). A placement whose credit hidden deliveries used up while the client's is
    /// not (a `batch: 1` request answered by a redelivery the client had acked) gets no
    /// more from the server, not even an end: it is placed again at once with the
    /// client's credit and remaining expiry, so the client does not wait out its expiry
    /// for nothing (a `no_wait` one without expiry is answered `404`, as the server
    /// answers it with nothing pending). Credit never doubles: the server holds none for
    /// it then.
    pub(super) fn delivered(&mut self, len: u64, hidden: bool, now: Instant) -> bool {
        self.served = true;
        if hidden {
            self.hidden.msgs += 1;
            self.hidden.bytes += len;
        } else {
            self.batch_left = self.batch_left.saturating_sub(1);
            if let Some(b) = self.bytes_left.as_mut() {
                *b = b.saturating_sub(len);
            }
        }
        if self.batch_left == 0 || self.bytes_left == Some(0) {
            return true;
        }
        let placement_done = self.batch_left <= self.hidden.msgs
            || self.bytes_left.is_some_and(|b| b <= self.hidden.bytes);
        if placement_done && self.placed() {
            self.phase = PullPhase::Unplaced {
                at: now,
                next: Placement::Full,
            };
        }
        false
    }

    pub(super) fn placed(&self) -> bool {
        !matches!(self.phase, PullPhase::Unplaced { .. })
    }

    pub(super) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// When the proxy ends the request with its own `408` if it is still unplaced: a
    /// little before the client's deadline, so that the status reaches the client before
    /// its own timer ends the request.
    pub(super) fn expire_at(&self) -> Option<Instant> {
        let lead = self
            .body
            .expires
            .map_or(EXPIRE_LEAD, |e| (e / 10).min(EXPIRE_LEAD));
        self.deadline.map(|d| d.checked_sub(lead).unwrap_or(d))
    }

    /// The next event of this request; `upstream`: a link can carry a placement now;
    /// `probe_out`: another request of the inbox is probing.
    pub(super) fn due(
        &self,
        seen: Instant,
        upstream: bool,
        probe_out: bool,
    ) -> Option<(Instant, Due)> {
        // A probe ends through `ProbeUnanswered` (then `Expire` at once, past the
        // deadline): its 408, if the consumer is there, comes at `until`.
        let expire = match self.phase {
            PullPhase::Unplaced { .. } => self.expire_at().map(|t| (t, Due::Expire)),
            // The server answers a no_wait request without an expiry at once; one that
            // got no answer is gone.
            PullPhase::Live { placed } => self
                .deadline
                .or(self.body.answered_at_once().then_some(placed))
                .map(|d| (d + LIVE_EXPIRY_GRACE, Due::Forget)),
            PullPhase::Probing { .. } => None,
        };
        let own = match self.phase {
            PullPhase::Live { placed } => self
                .hb
                .map(|hb| (seen.max(placed) + hb * 2 + HB_SLACK, Due::HeartbeatsMissed)),
            PullPhase::Probing { until, .. } => Some((until + PROBE_GRACE, Due::ProbeUnanswered)),
            PullPhase::Unplaced { at, next } => {
                let blocked = !upstream || (next == Placement::Probe && probe_out);
                (!blocked || self.body.answered_at_once()).then_some((at, Due::Place(next)))
            }
        };
        [expire, own].into_iter().flatten().min_by_key(|(t, _)| *t)
    }
}

/// Places `r` upstream now: the frame, and its new phase; for a full placement of a
/// request that was lost, also how long it had been lost.
pub(super) fn place(r: &mut Request, how: Placement, now: Instant) -> (Bytes, Option<Duration>) {
    let remaining = r.remaining(now);
    let (expires, hb) = match how {
        Placement::Probe => (
            Some(remaining.map_or(PROBE_EXPIRES, |d| d.min(PROBE_EXPIRES))),
            None,
        ),
        Placement::Full if r.no_hb => (remaining, None),
        Placement::Full => (remaining, r.body.upstream_heartbeat(remaining)),
    };
    let ask = Ask {
        batch: r.batch_left,
        max_bytes: r.bytes_left,
        expires,
        idle_heartbeat: hb,
    };
    let frame =
        request::encode_placement(&r.api_subject, &r.reply, r.headers.as_deref(), &r.body, ask);
    r.as_sent = false;
    r.served = false;
    r.hidden = Hidden::default();
    let mut lost_for = None;
    r.phase = match how {
        Placement::Full => {
            r.hb = hb;
            lost_for = r.lost_at.take().map(|t| now.saturating_duration_since(t));
            PullPhase::Live { placed: now }
        }
        Placement::Probe => PullPhase::Probing {
            until: now + expires.unwrap_or(PROBE_EXPIRES),
            answered: false,
        },
    };
    (frame, lost_for)
}
