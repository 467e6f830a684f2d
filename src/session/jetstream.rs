//! JetStream pull requests: tracking, status shielding, re-issue.
//!
//! A pull request is a publish to `<api prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`
//! with the client's inbox as reply; its body is empty (batch 1), a bare integer (the
//! batch) or JSON (`batch`, `max_bytes`, `expires` and `idle_heartbeat` in ns, `no_wait`,
//! priority fields). The server keeps it independently of any connection and serves it by
//! publishing to the inbox: deliveries keep the *stream* subject and carry the inbox
//! subscription's sid; statuses are header-only messages to the inbox itself.
//!
//! Per inbox the tracker keeps the outstanding requests with their remaining credit
//! (batch and bytes minus deliveries; a 408/409 ends one) and deadline, and:
//! - **shields** the client from statuses its library turns into an error item (async-nats:
//!   503 → `Err(NoResponders)`, 400/404/412/423… → `Err(Other)`; Vector's source ends at
//!   the first one): they are swallowed and the request is re-sent by the proxy, with the
//!   remaining batch, bytes and expiry, with backoff, until the consumer answers again;
//!   100, 408 and 409 pass (the library handles them), `409 Consumer Deleted` and
//!   `409 Consumer is push based` pass and end tracking (they are real);
//! - **detects loss** exactly where it happens: a 503 (the newest request on that inbox
//!   found no consumer), a hard failover (interest may have lapsed: every request), and
//!   missing heartbeats. For that the proxy adds `idle_heartbeat` (at most half the
//!   expiry, at most [`INJECTED_HB_MAX`]) to requests that have none and swallows the 100s
//!   the client did not ask for; no heartbeat for two intervals means the request is gone
//!   (an R1 consumer on a node that went lame duck loses its requests silently).
//!   A `400 … heartbeat value too large` caused by the injection is swallowed and the
//!   request re-sent without it.
//!
//! Re-sending a request that is still alive adds credit (the server does not merge
//! requests), so nothing is re-sent on a mere suspicion.
//!
//! Bounds: at most [`MAX_TRACKED_REQUESTS`] requests per session (past it the oldest is
//! forgotten: it is then only relayed, not protected).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::proto::{encode, Message};

/// Largest idle heartbeat the proxy adds to a request that has none.
pub const INJECTED_HB_MAX: Duration = Duration::from_secs(5);
/// Requests expiring sooner than this are not injected with a heartbeat.
pub const MIN_EXPIRES_FOR_HB: Duration = Duration::from_secs(2);
/// Re-issue backoff after a shielded status.
pub const REISSUE_BACKOFF_MIN: Duration = Duration::from_millis(250);
pub const REISSUE_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A lost request with less expiry left than this is dropped instead of re-sent.
pub const MIN_REISSUE_EXPIRY: Duration = Duration::from_secs(1);
/// Bound of tracked requests per session.
pub const MAX_TRACKED_REQUESTS: usize = 1024;

/// Whether `subject` is `<prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
pub fn is_pull_subject(subject: &[u8]) -> bool {
    // Cheap pre-check: this runs for every client publish.
    if memchr::memmem::find(subject, b".CONSUMER.MSG.NEXT.").is_none() {
        return false;
    }
    let tokens: Vec<&[u8]> = subject.split(|&c| c == b'.').collect();
    let n = tokens.len();
    n >= 6
        && tokens[n - 5] == b"CONSUMER"
        && tokens[n - 4] == b"MSG"
        && tokens[n - 3] == b"NEXT"
        && tokens[..n - 5].iter().any(|t| *t == b"API")
        && tokens.iter().all(|t| !t.is_empty())
}

/// A parsed pull request body.
#[derive(Debug, Clone, PartialEq)]
pub struct PullBody {
    pub batch: u64,
    pub max_bytes: u64,
    pub expires: Option<Duration>,
    pub no_wait: bool,
    pub idle_heartbeat: Option<Duration>,
    /// The JSON object, to re-send with other fields intact (None for the short forms).
    pub json: Option<Map<String, Value>>,
}

fn ns(v: Option<&Value>) -> Option<Duration> {
    v.and_then(Value::as_u64)
        .filter(|&n| n > 0)
        .map(Duration::from_nanos)
}

/// Parses a pull request body as the server does (`nextReqFromMsg`).
pub fn parse_body(payload: &[u8]) -> Option<PullBody> {
    let trimmed = payload.trim_ascii();
    if trimmed.is_empty() {
        return Some(PullBody {
            batch: 1,
            max_bytes: 0,
            expires: None,
            no_wait: false,
            idle_heartbeat: None,
            json: None,
        });
    }
    if trimmed[0] == b'{' {
        let Value::Object(m) = serde_json::from_slice(trimmed).ok()? else {
            return None;
        };
        return Some(PullBody {
            batch: m.get("batch").and_then(Value::as_u64).unwrap_or(1).max(1),
            max_bytes: m.get("max_bytes").and_then(Value::as_u64).unwrap_or(0),
            expires: ns(m.get("expires")),
            no_wait: m.get("no_wait").and_then(Value::as_bool).unwrap_or(false),
            idle_heartbeat: ns(m.get("idle_heartbeat")),
            json: Some(m),
        });
    }
    let n: u64 = std::str::from_utf8(trimmed).ok()?.parse().ok()?;
    Some(PullBody {
        batch: n.max(1),
        max_bytes: 0,
        expires: None,
        no_wait: false,
        idle_heartbeat: None,
        json: None,
    })
}

#[derive(Debug)]
struct Request {
    api_subject: Bytes,
    headers: Option<Bytes>,
    body: PullBody,
    batch_left: u64,
    bytes_left: Option<u64>,
    expires_at: Option<Instant>,
    /// Heartbeat in effect upstream, and whether the proxy added it.
    hb: Option<Duration>,
    injected: bool,
    /// Lost: waiting for re-issue at this time.
    reissue_at: Option<Instant>,
    attempts: u32,
}

impl Request {
    fn remaining_expiry(&self, now: Instant) -> Option<Duration> {
        self.expires_at.map(|t| t.saturating_duration_since(now))
    }
}

#[derive(Debug)]
struct Inbox {
    requests: VecDeque<Request>,
    last_activity: Instant,
    /// The client itself asked for heartbeats (then 100s are its business).
    client_hb: bool,
}

/// What to do with a message on a tracked inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shield {
    Forward,
    Swallow,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullStats {
    pub tracked: u64,
    pub reissued: u64,
    pub shielded: u64,
    pub heartbeats_swallowed: u64,
}

/// Pull requests of one client, per inbox.
#[derive(Debug, Default)]
pub struct PullTracker {
    /// reply subject → inbox state
    inboxes: HashMap<Bytes, Inbox>,
    /// sid → reply subject (deliveries are routed by sid)
    by_sid: HashMap<Bytes, Bytes>,
    count: usize,
    pub stats: PullStats,
}

impl PullTracker {
    /// True when nothing is tracked (the hot path skips the tracker then).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// A client request on `api_subject` with reply `reply`, delivered on `sid`. Returns
    /// the frame to send upstream instead of the client's when the proxy changed it (a
    /// heartbeat added), or None to send the client's bytes as they are (also for
    /// anything that does not parse: it is then only relayed).
    pub fn on_request(
        &mut self,
        api_subject: &[u8],
        reply: &[u8],
        sid: Bytes,
        headers: Option<&[u8]>,
        payload: &[u8],
        now: Instant,
    ) -> Option<Bytes> {
        let body = parse_body(payload)?;
        // The heartbeat upstream: at most INJECTED_HB_MAX and half the expiry, so that a
        // lost request is noticed (after two missed beats) well before the client's own
        // timers fire (async-nats' 35 s backstop, or 2 × its own heartbeat). A client
        // that asked for a slower heartbeat still gets beats, only more often.
        let mut hb = body.idle_heartbeat;
        let mut injected = false;
        if !body.no_wait && body.json.is_some() {
            if let Some(exp) = body.expires.filter(|&e| e >= MIN_EXPIRES_FOR_HB) {
                let ours = (exp / 2).min(INJECTED_HB_MAX);
                if hb.is_none_or(|h| h > ours) {
                    hb = Some(ours);
                    injected = true;
                }
            }
        }
        let req = Request {
            api_subject: Bytes::copy_from_slice(api_subject),
            headers: headers.map(Bytes::copy_from_slice),
            batch_left: body.batch,
            bytes_left: (body.max_bytes > 0).then_some(body.max_bytes),
            expires_at: body.expires.map(|e| now + e),
            hb,
            injected,
            reissue_at: None,
            attempts: 0,
            body,
        };
        let client_hb = req.body.idle_heartbeat.is_some();
        let frame = injected.then(|| self.encode(&req, reply, now));
        if self.count >= MAX_TRACKED_REQUESTS {
            self.forget_oldest();
        }
        let reply_b = Bytes::copy_from_slice(reply);
        let inbox = self
            .inboxes
            .entry(reply_b.clone())
            .or_insert_with(|| Inbox {
                requests: VecDeque::new(),
                last_activity: now,
                client_hb: false,
            });
        if inbox.requests.is_empty() {
            inbox.last_activity = now;
        }
        inbox.client_hb |= client_hb;
        inbox.requests.push_back(req);
        self.by_sid.insert(sid, reply_b);
        self.count += 1;
        self.stats.tracked += 1;
        frame
    }

    fn forget_oldest(&mut self) {
        if let Some(inbox) = self.inboxes.values_mut().find(|i| !i.requests.is_empty()) {
            inbox.requests.pop_front();
            self.count -= 1;
        }
    }

    /// The frame that (re-)sends `r` now: remaining batch, bytes and expiry; heartbeat at
    /// most half the remaining expiry.
    fn encode(&self, r: &Request, reply: &[u8], now: Instant) -> Bytes {
        let mut m = r.body.json.clone().unwrap_or_default();
        m.insert("batch".into(), r.batch_left.into());
        if let Some(b) = r.bytes_left {
            m.insert("max_bytes".into(), b.into());
        }
        let exp = r.remaining_expiry(now);
        if let Some(e) = exp {
            m.insert("expires".into(), (e.as_nanos() as u64).into());
        }
        match (r.hb, exp) {
            (Some(hb), Some(e)) => {
                let hb = hb.min(e / 2);
                if hb.is_zero() {
                    m.remove("idle_heartbeat");
                } else {
                    m.insert("idle_heartbeat".into(), (hb.as_nanos() as u64).into());
                }
            }
            (Some(hb), None) => {
                m.insert("idle_heartbeat".into(), (hb.as_nanos() as u64).into());
            }
            (None, _) => {
                m.remove("idle_heartbeat");
            }
        }
        let body = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
        encode::publish(&r.api_subject, Some(reply), r.headers.as_deref(), &body)
    }

    /// A message on `sid`. Untracked sids are forwarded without a lookup of anything else.
    /// A delivery on `sid` (not a status; its reply is the `$JS.ACK` subject) of
    /// `total_len` header and payload bytes: takes one from the credit of the oldest live
    /// request of its inbox, if it is a tracked one.
    pub fn on_delivery(&mut self, sid: &[u8], total_len: usize, now: Instant) {
        let Some(reply) = self.by_sid.get(sid) else {
            return;
        };
        let Some(inbox) = self.inboxes.get_mut(reply) else {
            return;
        };
        inbox.last_activity = now;
        if let Some(i) = inbox.requests.iter().position(|r| r.reissue_at.is_none()) {
            let r = &mut inbox.requests[i];
            r.batch_left = r.batch_left.saturating_sub(1);
            if let Some(b) = r.bytes_left.as_mut() {
                *b = b.saturating_sub(total_len as u64);
            }
            if r.batch_left == 0 || r.bytes_left == Some(0) {
                inbox.requests.remove(i);
                self.count -= 1;
            }
        }
    }

    pub fn on_message(&mut self, m: &Message, now: Instant) -> Shield {
        let Some(reply) = self.by_sid.get(m.sid()) else {
            return Shield::Forward;
        };
        let Some(inbox) = self.inboxes.get_mut(reply) else {
            return Shield::Forward;
        };
        inbox.last_activity = now;
        let status = if m.has_headers() && m.payload().is_empty() {
            m.status()
        } else {
            None
        };
        let Some(code) = status else {
            self.on_delivery(m.sid(), m.total_len(), now);
            return Shield::Forward;
        };
        let desc = m.status_description();
        match code {
            100 => {
                if inbox.client_hb {
                    Shield::Forward
                } else {
                    self.stats.heartbeats_swallowed += 1;
                    Shield::Swallow
                }
            }
            409 if desc.starts_with(b"Consumer Deleted")
                || desc.starts_with(b"Consumer is push based") =>
            {
                // Real: the client must learn it. Nothing left to protect.
                self.count -= inbox.requests.len();
                inbox.requests.clear();
                Shield::Forward
            }
            408 | 409 => {
                // Ends one request (expired, leadership change, batch completed...).
                if let Some(i) = inbox.requests.iter().position(|r| r.reissue_at.is_none()) {
                    inbox.requests.remove(i);
                    self.count -= 1;
                }
                Shield::Forward
            }
            404 if inbox.requests.iter().any(|r| r.body.no_wait) => {
                // no_wait "No Messages": the normal end of a fetch.
                if let Some(i) = inbox.requests.iter().position(|r| r.body.no_wait) {
                    inbox.requests.remove(i);
                    self.count -= 1;
                }
                Shield::Forward
            }
            400 if desc.windows(9).any(|w| w == b"heartbeat") => {
                // Caused by an injected heartbeat: re-send without it.
                if let Some(r) = inbox
                    .requests
                    .iter_mut()
                    .rev()
                    .find(|r| r.injected && r.reissue_at.is_none())
                {
                    r.hb = None;
                    r.injected = false;
                    r.reissue_at = Some(now);
                } else if let Some(i) = inbox.requests.iter().rposition(|r| r.reissue_at.is_none())
                {
                    // The client's own invalid request: re-sending cannot help.
                    inbox.requests.remove(i);
                    self.count -= 1;
                }
                self.stats.shielded += 1;
                Shield::Swallow
            }
            400 => {
                if let Some(i) = inbox.requests.iter().rposition(|r| r.reissue_at.is_none()) {
                    inbox.requests.remove(i);
                    self.count -= 1;
                }
                self.stats.shielded += 1;
                Shield::Swallow
            }
            _ => {
                // 503 (no consumer reachable) and every other status async-nats turns into
                // an error item: the newest live request did not land; re-send it later.
                if let Some(r) = inbox
                    .requests
                    .iter_mut()
                    .rev()
                    .find(|r| r.reissue_at.is_none())
                {
                    r.attempts += 1;
                    let exp = r.attempts.saturating_sub(1).min(10);
                    let delay = REISSUE_BACKOFF_MIN
                        .saturating_mul(1 << exp)
                        .min(REISSUE_BACKOFF_MAX);
                    r.reissue_at = Some(now + delay);
                }
                self.stats.shielded += 1;
                Shield::Swallow
            }
        }
    }

    /// Every live request may be gone (hard failover): re-issue all at once.
    pub fn all_lost(&mut self, now: Instant) {
        for inbox in self.inboxes.values_mut() {
            for r in inbox.requests.iter_mut() {
                r.reissue_at.get_or_insert(now);
            }
            inbox.last_activity = now;
        }
    }

    /// The client unsubscribed `sid`: its requests can no longer be served.
    pub fn unsubscribed(&mut self, sid: &[u8]) {
        if let Some(reply) = self.by_sid.remove(sid) {
            if let Some(inbox) = self.inboxes.remove(&reply) {
                self.count -= inbox.requests.len();
            }
        }
    }

    /// Expires old requests, detects missing heartbeats, and returns the frames of the
    /// requests to re-send now.
    pub fn on_timeout(&mut self, now: Instant) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut frames: Vec<(Bytes, usize)> = Vec::new();
        for (reply, inbox) in self.inboxes.iter_mut() {
            let before = inbox.requests.len();
            inbox.requests.retain(|r| {
                r.expires_at
                    .is_none_or(|t| now < t + MIN_REISSUE_EXPIRY * 2)
            });
            self.count -= before - inbox.requests.len();
            // Heartbeats stopped: every live request with a heartbeat is gone.
            let hb = inbox
                .requests
                .iter()
                .filter(|r| r.reissue_at.is_none())
                .filter_map(|r| r.hb)
                .min();
            if let Some(hb) = hb {
                if now >= inbox.last_activity + hb * 2 {
                    for r in inbox.requests.iter_mut().filter(|r| r.reissue_at.is_none()) {
                        r.reissue_at = Some(now);
                    }
                    inbox.last_activity = now;
                }
            }
            for (i, r) in inbox.requests.iter().enumerate() {
                if r.reissue_at.is_some_and(|t| t <= now) {
                    frames.push((reply.clone(), i));
                }
            }
        }
        for (reply, i) in frames.into_iter().rev() {
            let Some(inbox) = self.inboxes.get(&reply) else {
                continue;
            };
            let Some(r) = inbox.requests.get(i) else {
                continue;
            };
            if r.remaining_expiry(now)
                .is_some_and(|e| e < MIN_REISSUE_EXPIRY)
            {
                if let Some(inbox) = self.inboxes.get_mut(&reply) {
                    inbox.requests.remove(i);
                    self.count -= 1;
                }
                continue;
            }
            out.push(self.encode(r, &reply, now));
            if let Some(r) = self
                .inboxes
                .get_mut(&reply)
                .and_then(|ib| ib.requests.get_mut(i))
            {
                r.reissue_at = None;
            }
            if let Some(ib) = self.inboxes.get_mut(&reply) {
                ib.last_activity = now;
            }
            self.stats.reissued += 1;
        }
        out.reverse();
        out
    }

    /// The next moment `on_timeout` has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.inboxes
            .values()
            .flat_map(|ib| {
                let hb = ib
                    .requests
                    .iter()
                    .filter(|r| r.reissue_at.is_none())
                    .filter_map(|r| r.hb)
                    .min()
                    .map(|hb| ib.last_activity + hb * 2);
                ib.requests
                    .iter()
                    .flat_map(|r| {
                        [
                            r.reissue_at,
                            r.expires_at.map(|t| t + MIN_REISSUE_EXPIRY * 2),
                        ]
                    })
                    .chain([hb])
            })
            .flatten()
            .min()
    }

    /// Requests tracked now.
    pub fn len(&self) -> usize {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Limits, ServerDecoder, ServerOp};
    use bytes::BytesMut;

    fn msg(frame: &[u8]) -> Message {
        let mut d = ServerDecoder::new(Limits::upstream());
        let mut b = BytesMut::from(frame);
        match d.decode(&mut b) {
            Ok(Some(ServerOp::Msg(m))) => m,
            other => panic!("{other:?}"),
        }
    }

    fn status(sid: &str, line: &str) -> Message {
        let h = format!("NATS/1.0 {line}\r\n\r\n");
        msg(&encode::msg(
            b"_INBOX.a",
            sid.as_bytes(),
            None,
            Some(h.as_bytes()),
            b"",
        ))
    }

    fn delivery(sid: &str, n: u64) -> Message {
        let reply = format!("$JS.ACK.S.C.1.{n}.{n}.0.0");
        msg(&encode::msg(
            b"logs.v",
            sid.as_bytes(),
            Some(reply.as_bytes()),
            None,
            b"data",
        ))
    }

    const VECTOR_BODY: &[u8] =
        br#"{"batch":200,"expires":30000000000,"max_bytes":0,"min_pending":null,"min_ack_pending":null,"group":null}"#;
    const API: &[u8] = b"$JS.API.CONSUMER.MSG.NEXT.LOGS.CV";

    fn body_of(frame: &[u8]) -> Value {
        let s = std::str::from_utf8(frame).unwrap();
        let body = s.split("\r\n").nth(1).unwrap();
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn pull_subjects() {
        assert!(is_pull_subject(b"$JS.API.CONSUMER.MSG.NEXT.S.C"));
        assert!(is_pull_subject(b"$JS.hub.API.CONSUMER.MSG.NEXT.S.C"));
        assert!(is_pull_subject(b"my.API.CONSUMER.MSG.NEXT.S.C"));
        assert!(!is_pull_subject(b"$JS.API.CONSUMER.INFO.S.C"));
        assert!(!is_pull_subject(b"$JS.API.CONSUMER.MSG.NEXT.S"));
        assert!(!is_pull_subject(b"CONSUMER.MSG.NEXT.S.C"));
    }

    #[test]
    fn bodies() {
        assert_eq!(parse_body(b"").unwrap().batch, 1);
        assert_eq!(parse_body(b"17").unwrap().batch, 17);
        let b = parse_body(VECTOR_BODY).unwrap();
        assert_eq!(
            (b.batch, b.max_bytes, b.expires),
            (200, 0, Some(Duration::from_secs(30)))
        );
        assert_eq!(b.idle_heartbeat, None);
        let b = parse_body(
            br#"{"batch":5,"no_wait":true,"idle_heartbeat":1000000000,"expires":3000000000}"#,
        )
        .unwrap();
        assert!(b.no_wait);
        assert_eq!(b.idle_heartbeat, Some(Duration::from_secs(1)));
        assert!(parse_body(b"{bad").is_none());
        assert!(parse_body(b"x").is_none());
    }

    #[test]
    fn heartbeat_is_injected_at_most_half_the_expiry() {
        let now = Instant::now();
        let mut t = PullTracker::default();
        let f = t
            .on_request(API, b"_INBOX.a", "1".into(), None, VECTOR_BODY, now)
            .expect("rewritten");
        let v = body_of(&f);
        assert_eq!(v["idle_heartbeat"], 5_000_000_000u64);
        assert_eq!(v["batch"], 200);
        assert_eq!(v["expires"], 30_000_000_000u64);
        assert!(v["min_pending"].is_null(), "other fields kept");
        let short = br#"{"batch":10,"expires":3000000000}"#;
        let f = t
            .on_request(API, b"_INBOX.b", "2".into(), None, short, now)
            .unwrap();
        assert_eq!(body_of(&f)["idle_heartbeat"], 1_500_000_000u64);
        // Too short, or the client's own heartbeat: left alone.
        assert!(t
            .on_request(
                API,
                b"_INBOX.c",
                "3".into(),
                None,
                br#"{"batch":1,"expires":1000000000}"#,
                now
            )
            .is_none());
        // The client's own heartbeat, already short enough: left alone.
        let fast = br#"{"batch":1,"expires":30000000000,"idle_heartbeat":2000000000}"#;
        assert!(t
            .on_request(API, b"_INBOX.d", "4".into(), None, fast, now)
            .is_none());
        assert!(t
            .on_request(API, b"_INBOX.e", "5".into(), None, b"", now)
            .is_none());
        // A slower client heartbeat (async-nats messages(): 15 s) is made faster upstream.
        let slow = br#"{"batch":1,"expires":30000000000,"idle_heartbeat":15000000000}"#;
        let f = t
            .on_request(API, b"_INBOX.f", "6".into(), None, slow, now)
            .unwrap();
        assert_eq!(body_of(&f)["idle_heartbeat"], 5_000_000_000u64);
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn credit_accounting_with_deliveries_and_statuses() {
        let now = Instant::now();
        let mut t = PullTracker::default();
        t.on_request(
            API,
            b"_INBOX.a",
            "1".into(),
            None,
            br#"{"batch":3,"expires":30000000000}"#,
            now,
        );
        t.on_request(
            API,
            b"_INBOX.a",
            "1".into(),
            None,
            br#"{"batch":2,"expires":30000000000}"#,
            now,
        );
        for n in 0..3 {
            assert_eq!(t.on_message(&delivery("1", n), now), Shield::Forward);
        }
        assert_eq!(t.len(), 1, "the first request is used up");
        // 408 with pending counts ends the other one, and passes.
        assert_eq!(
            t.on_message(
                &status(
                    "1",
                    "408 Request Timeout\r\nNats-Pending-Messages: 2\r\nNats-Pending-Bytes: 0"
                ),
                now
            ),
            Shield::Forward
        );
        assert_eq!(t.len(), 0);
        // 409 Leadership Change passes and ends one request.
        t.on_request(API, b"_INBOX.a", "1".into(), None, b"5", now);
        assert_eq!(
            t.on_message(&status("1", "409 Leadership Change"), now),
            Shield::Forward
        );
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn shielding_and_reissue_with_remaining_credit_and_expiry() {
        let t0 = Instant::now();
        let mut t = PullTracker::default();
        t.on_request(API, b"_INBOX.a", "1".into(), None, VECTOR_BODY, t0);
        t.on_message(&delivery("1", 1), t0);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(
            t.on_message(&status("1", "503"), t1),
            Shield::Swallow,
            "503 never reaches the client"
        );
        assert_eq!(
            t.on_timeout(t1),
            Vec::<Bytes>::new(),
            "backoff before re-sending"
        );
        let due = t.poll_timeout().unwrap();
        assert!(due > t1 && due <= t1 + REISSUE_BACKOFF_MIN);
        let frames = t.on_timeout(due);
        assert_eq!(frames.len(), 1);
        let s = std::str::from_utf8(&frames[0]).unwrap();
        assert!(
            s.starts_with("PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.a "),
            "{s}"
        );
        let v = body_of(&frames[0]);
        assert_eq!(v["batch"], 199, "remaining batch");
        let exp = v["expires"].as_u64().unwrap();
        assert!(
            exp <= 20_000_000_000 - (due - t1).as_nanos() as u64 && exp > 19_000_000_000,
            "{exp}"
        );
        assert!(
            v["idle_heartbeat"].as_u64().unwrap() * 2 <= exp,
            "heartbeat never above half the expiry"
        );
        // Still no consumer: backoff doubles.
        assert_eq!(t.on_message(&status("1", "503"), due), Shield::Swallow);
        let due2 = t.poll_timeout().unwrap();
        assert!(due2 - due > REISSUE_BACKOFF_MIN, "{:?}", due2 - due);
        // Any other unexpected status is shielded too; Consumer Deleted is real.
        assert_eq!(
            t.on_message(&status("1", "423 Nats-Pin-Id mismatch"), due),
            Shield::Swallow
        );
        assert_eq!(
            t.on_message(&status("1", "409 Consumer Deleted"), due),
            Shield::Forward
        );
        assert_eq!(t.len(), 0);
        assert_eq!(t.stats.shielded, 3);
    }

    #[test]
    fn injected_heartbeats_are_swallowed_and_their_absence_detected() {
        let t0 = Instant::now();
        let mut t = PullTracker::default();
        t.on_request(API, b"_INBOX.a", "1".into(), None, VECTOR_BODY, t0);
        let hb = status(
            "1",
            "100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0",
        );
        assert_eq!(
            t.on_message(&hb, t0 + Duration::from_secs(5)),
            Shield::Swallow
        );
        assert_eq!(
            t.on_timeout(t0 + Duration::from_secs(14)),
            Vec::<Bytes>::new()
        );
        // Nothing for two intervals: the request is gone (e.g. R1 consumer on an ldm node).
        let frames = t.on_timeout(t0 + Duration::from_secs(15));
        assert_eq!(frames.len(), 1);
        // A 400 caused by the injection: swallowed, re-sent without a heartbeat.
        let now = t0 + Duration::from_secs(16);
        assert_eq!(
            t.on_message(
                &status("1", "400 Bad Request - heartbeat value too large"),
                now
            ),
            Shield::Swallow
        );
        let frames = t.on_timeout(now);
        assert_eq!(frames.len(), 1);
        assert!(body_of(&frames[0]).get("idle_heartbeat").is_none());
        // A client that asked for heartbeats gets them.
        let mut t = PullTracker::default();
        t.on_request(
            API,
            b"_INBOX.b",
            "2".into(),
            None,
            br#"{"batch":1,"expires":30000000000,"idle_heartbeat":15000000000}"#,
            t0,
        );
        let hb = status("2", "100 Idle Heartbeat");
        assert_eq!(t.on_message(&hb, t0), Shield::Forward);
    }

    #[test]
    fn failover_reissues_everything_and_expired_requests_are_dropped() {
        let t0 = Instant::now();
        let mut t = PullTracker::default();
        t.on_request(API, b"_INBOX.a", "1".into(), None, VECTOR_BODY, t0);
        t.on_request(
            API,
            b"_INBOX.b",
            "2".into(),
            None,
            br#"{"batch":5,"expires":2000000000}"#,
            t0,
        );
        let now = t0 + Duration::from_millis(1500);
        t.all_lost(now);
        let frames = t.on_timeout(now);
        assert_eq!(
            frames.len(),
            1,
            "the one with under 1 s left is not re-sent"
        );
        assert_eq!(t.len(), 1);
        assert!(t.on_timeout(t0 + Duration::from_secs(40)).is_empty());
        assert_eq!(t.len(), 0, "expired");
    }

    #[test]
    fn no_wait_fetch_end_passes() {
        let now = Instant::now();
        let mut t = PullTracker::default();
        t.on_request(
            API,
            b"_INBOX.a",
            "1".into(),
            None,
            br#"{"batch":5,"no_wait":true}"#,
            now,
        );
        assert_eq!(
            t.on_message(&status("1", "404 No Messages"), now),
            Shield::Forward
        );
        assert_eq!(t.len(), 0);
    }
}
