//! What the client got and acked, per JetStream consumer, so that a delivery the client
//! already has never reaches it twice: a redelivery of a message it acked is acked again
//! by the proxy instead, and the same delivery sent again is kept from it.
//!
//! Two server behaviours deliver to the client what it already has:
//! - **Redelivery**: an ack lost with a dying node (or in a leader change) makes the
//!   server redeliver after `ack_wait`, with `<delivered>` > 1.
//! - **Re-send by a new leader**: nats-server 2.9's new consumer leader does not always
//!   know what the old one delivered and sends it again as the same delivery: the same
//!   `<delivered>`, stream sequence, consumer sequence and timestamp, within seconds (seen
//!   in 3 of 4 rolling restarts, one message per consumer). It can come before the client
//!   acked the first copy: a `Fetch` loop acks a batch only once it is complete (seen in
//!   CI: nats-py's `fetch(64, timeout=1)` got message 17 again 200 ms after the first
//!   copy, with `<pending>` 38 instead of 0, before its ack). An R1 consumer whose node
//!   exits can start again from its first delivery under the same name (seen on 2.9.10
//!   and 2.15.1: nats-py's ordered consumer, 165 to 1,462 deliveries the client had got
//!   0.5 to 9 s before).
//!
//! The proxy sees both sides. Every delivery's reply, and every ack (a client publish to
//! that reply subject), names its place:
//!
//! ```text
//! $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
//! $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>.…[.<token>]
//! ```
//!
//! An ack has an empty payload or `+ACK` (async-nats, nats.go, cnats, nats.js, nats-py).
//! Per consumer, for the [`REMEMBERED_PER_CONSUMER`] highest stream sequences, the memory
//! keeps the last delivery that reached the client and whether the client acked that
//! stream sequence (explicit positive acks only: `-NAK`, `+WPI`, `+TERM`, `+NXT` are
//! not), for at most [`MAX_CONSUMERS`] consumers (past either bound the oldest is
//! forgotten: what it covered then reaches the client as it would without the proxy).
//! A delivery is, by [`Seen`]:
//! - [`Seen::Resent`]: the delivery the client got, to the same recipient (same
//!   `<delivered>`, stream sequence, consumer sequence and timestamp) less than
//!   [`RESEND_WINDOW`] after it got or acked it: kept from the client; acked again by the
//!   proxy if the client acked it (the new leader may not know that ack either), else
//!   left to the client's ack of its copy. The server sends a copy to each plain
//!   subscription matching the deliver subject and one to each queue group, to any
//!   member ([`Recipient`]): one sent again to another member of the group is the same.
//!   Only the last recipient of a stream sequence is remembered: where several get it
//!   (two subscriptions matching one deliver subject), copies sent again reach them, as
//!   they would without the proxy;
//! - [`Seen::Redelivered`]: `<delivered>` > 1 for a stream sequence the client acked:
//!   acked again by the proxy and kept from the client;
//! - [`Seen::New`]: anything else, remembered as the client's.
//!
//! A consumer the client creates or deletes (`CONSUMER.CREATE`, `CONSUMER.DURABLE.CREATE`,
//! `CONSUMER.DELETE`) starts with no memory: its replay is new to the client. A consumer
//! recreated by someone else under the same name within [`RESEND_WINDOW`] of the
//! client's deliveries, replaying from the same start, is what this cannot tell apart.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Stream sequences remembered per consumer.
pub const REMEMBERED_PER_CONSUMER: usize = 4096;
/// Consumers remembered per session.
pub const MAX_CONSUMERS: usize = 64;
/// How long after the client got or acked a delivery the same delivery counts as sent
/// again.
pub const RESEND_WINDOW: Duration = Duration::from_secs(10);

const PREFIX: &[u8] = b"$JS.ACK.";

/// A delivery's place, from its ack subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRef<'a> {
    /// `<stream>.<consumer>` (with domain and hash in the v2 form): the consumer's key.
    pub consumer: &'a [u8],
    pub delivered: u64,
    pub stream_seq: u64,
    pub consumer_seq: u64,
    /// The stored message's timestamp (ns).
    pub timestamp: u64,
}

/// A decimal token (at most 20 digits), without going through `str`.
pub(super) fn number(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 20 {
        return None;
    }
    t.iter().try_fold(0u64, |n, &c| {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// The fields of an ack subject, as slices: consumer key, delivered, stream sequence,
/// consumer sequence, timestamp.
type Fields<'a> = (&'a [u8], &'a [u8], &'a [u8], &'a [u8], &'a [u8]);

fn fields(subject: &[u8]) -> Option<Fields<'_>> {
    let rest = subject.strip_prefix(PREFIX)?;
    // Dot positions, without allocating (this runs for every JetStream delivery).
    let mut dots = [0usize; 10];
    let mut n = 0;
    for d in memchr::memchr_iter(b'.', rest) {
        if n == dots.len() {
            return None;
        }
        dots[n] = d;
        n += 1;
    }
    // v1: 7 tokens (6 dots), the delivered count is token 2; v2: 9 or 10, token 4.
    let k = match n {
        6 => 2,
        8 | 9 => 4,
        _ => return None,
    };
    let token = |i: usize| &rest[dots[i - 1] + 1..dots.get(i).copied().unwrap_or(rest.len())];
    Some((
        &rest[..dots[k - 1]],
        token(k),
        token(k + 1),
        token(k + 2),
        token(k + 3),
    ))
}

impl AckRef<'_> {
    /// Parses an ack subject in either form; None for anything else.
    pub fn parse(subject: &[u8]) -> Option<AckRef<'_>> {
        let (consumer, delivered, sseq, cseq, ts) = fields(subject)?;
        Some(AckRef {
            consumer,
            delivered: number(delivered)?,
            stream_seq: number(sseq)?,
            consumer_seq: number(cseq)?,
            timestamp: number(ts)?,
        })
    }
}

/// The `<stream>.<consumer>` an API subject creates or deletes, if it does:
/// `<prefix>.CONSUMER.CREATE.<stream>.<consumer>[.<filter>…]`,
/// `<prefix>.CONSUMER.DURABLE.CREATE.<stream>.<consumer>`,
/// `<prefix>.CONSUMER.DELETE.<stream>.<consumer>`.
fn managed_consumer(subject: &[u8]) -> Option<Vec<u8>> {
    let at = memchr::memmem::find(subject, b".CONSUMER.")?;
    let rest = &subject[at + b".CONSUMER.".len()..];
    let rest = rest
        .strip_prefix(b"CREATE.")
        .or_else(|| rest.strip_prefix(b"DURABLE.CREATE."))
        .or_else(|| rest.strip_prefix(b"DELETE."))?;
    let mut tokens = rest.split(|&c| c == b'.');
    let (stream, consumer) = (tokens.next()?, tokens.next()?);
    let mut key = stream.to_vec();
    key.push(b'.');
    key.extend_from_slice(consumer);
    Some(key)
}

/// What a delivery is to the client (the module doc has the rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not a JetStream delivery, or one the client has not had: it goes to the client.
    New,
    /// The delivery the client got, sent again; `acked`: the client acked it (the proxy
    /// acks it again). Kept from the client.
    Resent { acked: bool },
    /// A redelivery (`<delivered>` > 1) of a message the client acked: acked again by
    /// the proxy and kept from the client.
    Redelivered,
}

/// The client's side of one stream sequence.
#[derive(Debug, Clone, Copy)]
struct Entry {
    stream_seq: u64,
    /// The last delivery of it that reached the client (or the one the client acked).
    consumer_seq: u64,
    delivered: u64,
    timestamp: u64,
    /// When the client got it or acked it, whichever came last.
    at: Instant,
    /// Who got it ([`Recipient::tag`]; [`ANY_RECIPIENT`] for an entry made by an ack).
    to: u32,
    acked: bool,
}

/// An entry's recipient when only the client's ack made it.
const ANY_RECIPIENT: u32 = 0;

/// Who of the client gets a delivery: the server sends one copy to each plain
/// subscription matching the deliver subject, and one to each queue group (to one of its
/// members).
#[derive(Debug, Clone, Copy)]
pub enum Recipient<'a> {
    /// A plain subscription, by sid.
    Sub(&'a [u8]),
    /// A queue group, by name.
    Queue(&'a [u8]),
}

impl Recipient<'_> {
    /// Its tag in an [`Entry`]: FNV-1a of the sid or the group's name (from different
    /// offsets), never [`ANY_RECIPIENT`]. Two recipients with the same tag (one pair in
    /// 2^31) are taken for one.
    fn tag(self) -> u32 {
        let (basis, name) = match self {
            Recipient::Sub(sid) => (0x811c_9dc5u32, sid),
            Recipient::Queue(q) => (0x050c_5d1fu32, q),
        };
        let h = name
            .iter()
            .fold(basis, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        h | 1
    }
}

/// Whether a reply subject is a JetStream delivery's (what [`Deliveries::on_delivery_of`]
/// looks at; anything else is [`Seen::New`]).
pub fn is_delivery(reply: &[u8]) -> bool {
    reply.starts_with(PREFIX)
}

/// One consumer's stream sequences, sorted (deliveries and acks come nearly in order,
/// so an insert is a push at the back and a lookup a binary search; no hashing on the
/// path every delivery and every ack takes).
#[derive(Debug)]
struct Consumer {
    key: Bytes,
    entries: VecDeque<Entry>,
}

impl Consumer {
    fn new(key: &[u8]) -> Consumer {
        Consumer {
            key: Bytes::copy_from_slice(key),
            entries: VecDeque::new(),
        }
    }

    fn find(&self, stream_seq: u64) -> Result<usize, usize> {
        match self.entries.back() {
            // Above every entry: a new message (nearly every delivery and ack).
            None => Err(0),
            Some(l) if stream_seq > l.stream_seq => Err(self.entries.len()),
            _ => self
                .entries
                .binary_search_by_key(&stream_seq, |e| e.stream_seq),
        }
    }

    fn put(&mut self, e: Entry) {
        match self.find(e.stream_seq) {
            Ok(i) => self.entries[i] = e,
            Err(i) if i == self.entries.len() => self.entries.push_back(e),
            Err(i) => self.entries.insert(i, e),
        }
        if self.entries.len() > REMEMBERED_PER_CONSUMER {
            self.entries.pop_front();
        }
    }
}

/// What the client got and acked, per consumer (a handful per session: a short list).
#[derive(Debug, Default)]
pub struct Deliveries {
    /// In the order they were first seen (the bound drops the first).
    consumers: Vec<Consumer>,
}

impl Deliveries {
    fn consumer_mut(&mut self, key: &[u8]) -> &mut Consumer {
        let i = match self.consumers.iter().position(|c| c.key[..] == *key) {
            Some(i) => i,
            None => {
                if self.consumers.len() >= MAX_CONSUMERS {
                    self.consumers.remove(0);
                }
                self.consumers.push(Consumer::new(key));
                self.consumers.len() - 1
            }
        };
        &mut self.consumers[i]
    }

    /// A client publish to `subject` with `payload` at `now`: remembered if it is a
    /// positive ack; a consumer the client creates or deletes is forgotten. Returns the
    /// consumer key of an ack of any kind.
    pub fn on_client_publish<'s>(
        &mut self,
        subject: &'s [u8],
        payload: &[u8],
        now: Instant,
    ) -> Option<&'s [u8]> {
        if !subject.starts_with(PREFIX) {
            if !self.consumers.is_empty() && subject.starts_with(b"$JS.") {
                if let Some(key) = managed_consumer(subject) {
                    self.consumers.retain(|c| c.key[..] != key[..]);
                }
            }
            return None;
        }
        let a = AckRef::parse(subject)?;
        let positive = payload.is_empty() || payload.trim_ascii() == b"+ACK";
        if !positive {
            return Some(a.consumer);
        }
        let c = self.consumer_mut(a.consumer);
        match c.find(a.stream_seq) {
            Ok(i) => {
                let e = &mut c.entries[i];
                e.acked = true;
                e.at = now;
            }
            Err(_) => c.put(Entry {
                stream_seq: a.stream_seq,
                consumer_seq: a.consumer_seq,
                delivered: a.delivered,
                timestamp: a.timestamp,
                at: now,
                to: ANY_RECIPIENT,
                acked: true,
            }),
        }
        Some(a.consumer)
    }

    /// [`on_delivery_of`](Self::on_delivery_of) of a reply not parsed yet (the tests').
    #[cfg(test)]
    pub fn on_delivery(&mut self, to: Recipient<'_>, reply: &[u8], now: Instant) -> Seen {
        if !is_delivery(reply) {
            return Seen::New;
        }
        match AckRef::parse(reply) {
            Some(d) => self.on_delivery_of(to, &d, now),
            None => Seen::New,
        }
    }

    /// A delivery to `to` whose reply is `d`, at `now`: what it is to the client. A
    /// [`Seen::New`] one is remembered as the client's, so call this only for a delivery
    /// that goes to the client unless it is kept back for what this returns.
    pub fn on_delivery_of(&mut self, to: Recipient<'_>, d: &AckRef<'_>, now: Instant) -> Seen {
        let c = self.consumer_mut(d.consumer);
        let fresh = Entry {
            stream_seq: d.stream_seq,
            consumer_seq: d.consumer_seq,
            delivered: d.delivered,
            timestamp: d.timestamp,
            at: now,
            to: to.tag(),
            acked: false,
        };
        let i = match c.find(d.stream_seq) {
            Ok(i) => i,
            Err(_) => {
                c.put(fresh);
                return Seen::New;
            }
        };
        let e = c.entries[i];
        let same = e.consumer_seq == d.consumer_seq
            && (e.to == fresh.to || e.to == ANY_RECIPIENT)
            && e.delivered == d.delivered
            && e.timestamp == d.timestamp
            && now.saturating_duration_since(e.at) < RESEND_WINDOW;
        if same {
            Seen::Resent { acked: e.acked }
        } else if e.acked && d.delivered > 1 {
            Seen::Redelivered
        } else {
            c.entries[i] = fresh;
            Seen::New
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &[u8] = b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267765.0";
    const S1: Recipient<'static> = Recipient::Sub(b"1");

    #[test]
    fn both_subject_forms_parse() {
        let a = AckRef::parse(V1).unwrap();
        assert_eq!(
            (a.consumer, a.delivered, a.stream_seq, a.consumer_seq),
            (&b"LOGS.CV"[..], 1, 58, 5)
        );
        assert_eq!(a.timestamp, 1795971532879267765);
        let a = AckRef::parse(b"$JS.ACK.hub.ACC.LOGS.CV.3.58.5.1795.0.tok").unwrap();
        assert_eq!(
            (a.consumer, a.delivered, a.stream_seq),
            (&b"hub.ACC.LOGS.CV"[..], 3, 58)
        );
        assert!(AckRef::parse(b"$JS.ACK.LOGS.CV.x.58.5.1.0").is_none());
        assert!(AckRef::parse(b"$JS.ACK.LOGS").is_none());
        assert!(AckRef::parse(b"_INBOX.a.b.c.d.e.f.g").is_none());
    }

    #[test]
    fn only_a_redelivery_of_what_the_client_acked_is_recognised() {
        let now = Instant::now();
        let mut m = Deliveries::default();
        m.on_client_publish(V1, b"", now);
        m.on_client_publish(
            b"$JS.ACK.LOGS.CV.1.59.6.1795971532879267765.0",
            b"+ACK",
            now,
        );
        m.on_client_publish(
            b"$JS.ACK.LOGS.CV.1.60.7.1795971532879267765.0",
            b"-NAK",
            now,
        );
        m.on_client_publish(
            b"$JS.ACK.LOGS.CV.1.61.8.1795971532879267765.0",
            b"+WPI",
            now,
        );
        let again = |s: u64| format!("$JS.ACK.LOGS.CV.2.{s}.9.1795971532879267799.0");
        assert_eq!(
            m.on_delivery(S1, again(58).as_bytes(), now),
            Seen::Redelivered
        );
        assert_eq!(
            m.on_delivery(S1, again(59).as_bytes(), now),
            Seen::Redelivered
        );
        assert_eq!(
            m.on_delivery(S1, again(60).as_bytes(), now),
            Seen::New,
            "a NAK is no ack"
        );
        assert_eq!(m.on_delivery(S1, again(61).as_bytes(), now), Seen::New);
        assert_eq!(
            m.on_delivery(S1, b"$JS.ACK.LOGS.OTHER.2.58.9.1.0", now),
            Seen::New,
            "per consumer"
        );
        assert_eq!(m.on_delivery(S1, b"_INBOX.x.y", now), Seen::New);
    }

    #[test]
    fn the_same_delivery_sent_again_is_recognised_for_a_while_acked_or_not() {
        let t0 = Instant::now();
        let mut m = Deliveries::default();
        assert_eq!(m.on_delivery(S1, V1, t0), Seen::New);
        // The same delivery; only <pending> differs. The client has not acked it yet.
        let resent = b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267765.3";
        let t1 = t0 + Duration::from_secs(2);
        let not_acked = Seen::Resent { acked: false };
        assert_eq!(m.on_delivery(S1, resent, t1), not_acked);
        assert_eq!(
            m.on_delivery(S1, resent, t1),
            not_acked,
            "kept back: not the client's"
        );
        m.on_client_publish(V1, b"+ACK", t1);
        let acked = Seen::Resent { acked: true };
        assert_eq!(
            m.on_delivery(S1, resent, t1 + Duration::from_secs(9)),
            acked
        );
        assert_eq!(
            m.on_delivery(S1, resent, t1 + RESEND_WINDOW),
            Seen::New,
            "too late for a re-send: a replay"
        );
        // Another consumer sequence or message: a replay, not a re-send.
        let t2 = t1 + RESEND_WINDOW;
        let replay = b"$JS.ACK.LOGS.CV.1.58.1.1795971532879267765.0";
        assert_eq!(m.on_delivery(S1, replay, t2), Seen::New);
        let other = b"$JS.ACK.LOGS.CV.1.58.1.1795971532879267999.0";
        assert_eq!(m.on_delivery(S1, other, t2), Seen::New);
        // A redelivery of what the client did not ack is the client's, once.
        let redelivered = b"$JS.ACK.LOGS.CV.2.58.9.1795971532879267999.0";
        assert_eq!(m.on_delivery(S1, redelivered, t2), Seen::New);
        assert_eq!(m.on_delivery(S1, redelivered, t2), not_acked);
    }

    #[test]
    fn each_subscription_and_queue_group_gets_its_own_copy_of_a_delivery() {
        let now = Instant::now();
        let mut m = Deliveries::default();
        assert_eq!(m.on_delivery(S1, V1, now), Seen::New);
        let s2 = Recipient::Sub(b"2");
        assert_eq!(
            m.on_delivery(s2, V1, now),
            Seen::New,
            "a second subscription matching the deliver subject"
        );
        assert_eq!(m.on_delivery(s2, V1, now), Seen::Resent { acked: false });
        // A queue group gets one copy, to any member: sent again, to another.
        let v2 = b"$JS.ACK.LOGS.CV.1.59.6.1795971532879267765.0";
        assert_eq!(m.on_delivery(Recipient::Queue(b"Q"), v2, now), Seen::New);
        let again = m.on_delivery(Recipient::Queue(b"Q"), v2, now);
        assert_eq!(again, Seen::Resent { acked: false });
        assert_eq!(m.on_delivery(Recipient::Queue(b"R"), v2, now), Seen::New);
        // An entry the client's ack made matches any recipient.
        m.on_client_publish(b"$JS.ACK.LOGS.CV.1.70.9.5.0", b"", now);
        let resent = m.on_delivery(Recipient::Sub(b"7"), b"$JS.ACK.LOGS.CV.1.70.9.5.3", now);
        assert_eq!(resent, Seen::Resent { acked: true });
        assert_ne!(Recipient::Sub(b"").tag(), ANY_RECIPIENT);
        assert_ne!(Recipient::Sub(b"Q").tag(), Recipient::Queue(b"Q").tag());
    }

    #[test]
    fn deliveries_out_of_order_are_remembered_in_place() {
        let now = Instant::now();
        let mut m = Deliveries::default();
        for s in [5u64, 9, 7, 1] {
            let r = format!("$JS.ACK.S.C.1.{s}.{s}.0.0");
            assert_eq!(m.on_delivery(S1, r.as_bytes(), now), Seen::New);
        }
        for s in [1u64, 5, 7, 9] {
            let r = format!("$JS.ACK.S.C.1.{s}.{s}.0.1");
            let again = m.on_delivery(S1, r.as_bytes(), now);
            assert_eq!(again, Seen::Resent { acked: false }, "{s}");
        }
        assert_eq!(m.on_delivery(S1, b"$JS.ACK.S.C.1.6.6.0.0", now), Seen::New);
    }

    #[test]
    fn a_consumer_the_client_recreates_starts_with_no_memory() {
        let now = Instant::now();
        let mut m = Deliveries::default();
        m.on_client_publish(V1, b"", now);
        let again = b"$JS.ACK.LOGS.CV.2.58.5.1795971532879267765.0";
        assert_eq!(m.on_delivery(S1, again, now), Seen::Redelivered);
        m.on_client_publish(b"$JS.API.CONSUMER.INFO.LOGS.CV", b"", now);
        let info = m.on_delivery(S1, again, now);
        assert_eq!(info, Seen::Redelivered, "INFO changes nothing");
        m.on_client_publish(b"$JS.API.CONSUMER.DELETE.LOGS.CV", b"", now);
        assert_eq!(m.on_delivery(S1, again, now), Seen::New);
        m.on_client_publish(V1, b"", now);
        m.on_client_publish(b"$JS.hub.API.CONSUMER.CREATE.LOGS.CV.logs.>", b"{}", now);
        assert_eq!(m.on_delivery(S1, again, now), Seen::New);
        m.on_client_publish(V1, b"", now);
        m.on_client_publish(b"$JS.API.CONSUMER.DURABLE.CREATE.LOGS.CV", b"{}", now);
        assert_eq!(m.on_delivery(S1, again, now), Seen::New);
    }

    #[test]
    fn memory_is_bounded_per_consumer_and_in_consumers() {
        let now = Instant::now();
        let mut m = Deliveries::default();
        for s in 1..=(REMEMBERED_PER_CONSUMER as u64 + 10) {
            m.on_client_publish(format!("$JS.ACK.S.C.1.{s}.{s}.0.0").as_bytes(), b"", now);
        }
        assert_eq!(m.consumers[0].entries.len(), REMEMBERED_PER_CONSUMER);
        assert_eq!(
            m.on_delivery(S1, b"$JS.ACK.S.C.2.1.1.0.0", now),
            Seen::New,
            "oldest forgotten"
        );
        let kept = m.on_delivery(S1, b"$JS.ACK.S.C.2.4106.1.0.0", now);
        assert_eq!(kept, Seen::Redelivered);
        for c in 0..=MAX_CONSUMERS {
            m.on_delivery(S1, format!("$JS.ACK.S.K{c}.1.1.1.0.0").as_bytes(), now);
        }
        assert_eq!(m.consumers.len(), MAX_CONSUMERS);
        assert_eq!(
            m.on_delivery(S1, b"$JS.ACK.S.C.2.4106.1.0.0", now),
            Seen::New
        );
    }
}
