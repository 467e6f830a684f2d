//! What the client acked, so that the server's redelivery of a message the client
//! already processed is acked again by the proxy instead of reaching the client.
//!
//! Two server behaviours deliver a message the client already acked:
//! - **Redelivery**: an ack lost with a dying node (or in a leader change) makes the
//!   server redeliver after `ack_wait`, with `<delivered>` > 1.
//! - **Re-send by a new leader**: nats-server 2.9's new consumer leader does not always
//!   know what the old one delivered and sends it again as the same first delivery: the
//!   same `<delivered>` 1, stream sequence, consumer sequence and timestamp, within
//!   seconds (seen in 3 of 4 rolling restarts, one message per consumer).
//!
//! The proxy sees both sides. Every ack is a client publish to the delivery's reply
//! subject
//!
//! ```text
//! $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
//! $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>.…[.<token>]
//! ```
//!
//! with an empty payload or `+ACK` (async-nats, nats.go, cnats, nats.js, nats-py). Only
//! explicit positive acks the client really sent are remembered (`-NAK`, `+WPI`, `+TERM`,
//! `+NXT` are not), per consumer, the [`ACKED_PER_CONSUMER`] highest stream sequences, for at most
//! [`MAX_CONSUMERS`] consumers (past either bound the oldest is forgotten: its
//! redelivery then reaches the client as it would without the proxy). A delivery is
//! taken for one the client acked when
//! - `<delivered>` > 1 and the client acked that stream sequence, or
//! - `<delivered>` = 1, and the client acked that very delivery (stream sequence,
//!   consumer sequence and timestamp) less than [`RESEND_WINDOW`] ago.
//!
//! A consumer the client creates or deletes (`CONSUMER.CREATE`, `CONSUMER.DURABLE.CREATE`,
//! `CONSUMER.DELETE`) starts with no memory: its replay is new to the client. A consumer
//! recreated by someone else under the same name within [`RESEND_WINDOW`] of the
//! client's acks, replaying from the same start, is what this cannot tell apart.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Acks remembered per consumer.
pub const ACKED_PER_CONSUMER: usize = 4096;
/// Consumers remembered per session.
pub const MAX_CONSUMERS: usize = 64;
/// How long after the client's ack a first delivery sent again counts as a re-send.
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

#[derive(Debug, Clone, Copy)]
struct Acked {
    stream_seq: u64,
    consumer_seq: u64,
    timestamp: u64,
    at: Instant,
}

/// One consumer's acks, sorted by stream sequence (acks come nearly in order, so an
/// insert is a push at the back and a lookup a binary search; no hashing on the path
/// every delivery and every ack takes).
#[derive(Debug)]
struct Consumer {
    key: Bytes,
    acked: VecDeque<Acked>,
}

impl Consumer {
    fn insert(&mut self, a: Acked) {
        match self.acked.back() {
            Some(last) if last.stream_seq >= a.stream_seq => {
                match self
                    .acked
                    .binary_search_by_key(&a.stream_seq, |e| e.stream_seq)
                {
                    Ok(i) => self.acked[i] = a,
                    Err(i) => self.acked.insert(i, a),
                }
            }
            _ => self.acked.push_back(a),
        }
        if self.acked.len() > ACKED_PER_CONSUMER {
            self.acked.pop_front();
        }
    }

    fn get(&self, stream_seq: u64) -> Option<&Acked> {
        if self.acked.back().is_none_or(|l| stream_seq > l.stream_seq) {
            // Above every ack: a new message (nearly every delivery).
            return None;
        }
        let i = self
            .acked
            .binary_search_by_key(&stream_seq, |e| e.stream_seq)
            .ok()?;
        self.acked.get(i)
    }
}

/// The client's acks, per consumer (a handful per session: a short list).
#[derive(Debug, Default)]
pub struct AckMemory {
    /// In the order they were first seen (the bound drops the first).
    consumers: Vec<Consumer>,
}

impl AckMemory {
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
    }

    fn consumer(&self, key: &[u8]) -> Option<&Consumer> {
        self.consumers.iter().find(|c| c.key[..] == *key)
    }

    /// A client publish to `subject` with `payload` at `now`: remembered if it is a
    /// positive ack; a consumer the client creates or deletes is forgotten.
    pub fn on_client_publish(&mut self, subject: &[u8], payload: &[u8], now: Instant) {
        if !subject.starts_with(PREFIX) {
            if !self.consumers.is_empty() && subject.starts_with(b"$JS.") {
                if let Some(key) = managed_consumer(subject) {
                    self.consumers.retain(|c| c.key[..] != key[..]);
                }
            }
            return;
        }
        let positive = payload.is_empty() || payload.trim_ascii() == b"+ACK";
        let Some(a) = AckRef::parse(subject).filter(|_| positive) else {
            return;
        };
        let entry = Acked {
            stream_seq: a.stream_seq,
            consumer_seq: a.consumer_seq,
            timestamp: a.timestamp,
            at: now,
        };
        match self.consumers.iter_mut().find(|c| c.key[..] == *a.consumer) {
            Some(c) => c.insert(entry),
            None => {
                if self.consumers.len() >= MAX_CONSUMERS {
                    self.consumers.remove(0);
                }
                let mut c = Consumer {
                    key: Bytes::copy_from_slice(a.consumer),
                    acked: VecDeque::new(),
                };
                c.insert(entry);
                self.consumers.push(c);
            }
        }
    }

    /// Whether a delivery with this reply, at `now`, is one of a message the client
    /// acked (see the module doc for the two rules).
    pub fn is_acked_redelivery(&self, reply: &[u8], now: Instant) -> bool {
        // Cheapest first: nearly every delivery is above every ack of its consumer.
        let Some((consumer, _, sseq, _, _)) = fields(reply) else {
            return false;
        };
        let Some(acked) = number(sseq).and_then(|sseq| self.consumer(consumer)?.get(sseq)) else {
            return false;
        };
        let Some(a) = AckRef::parse(reply) else {
            return false;
        };
        a.delivered > 1
            || (acked.consumer_seq == a.consumer_seq
                && acked.timestamp == a.timestamp
                && now.saturating_duration_since(acked.at) < RESEND_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &[u8] = b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267765.0";

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
        let mut m = AckMemory::default();
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
        assert!(m.is_acked_redelivery(again(58).as_bytes(), now));
        assert!(m.is_acked_redelivery(again(59).as_bytes(), now));
        assert!(
            !m.is_acked_redelivery(again(60).as_bytes(), now),
            "a NAK is no ack"
        );
        assert!(!m.is_acked_redelivery(again(61).as_bytes(), now));
        assert!(
            !m.is_acked_redelivery(b"$JS.ACK.LOGS.OTHER.2.58.9.1.0", now),
            "per consumer"
        );
    }

    #[test]
    fn a_first_delivery_sent_again_by_a_new_leader_is_recognised_for_a_while() {
        let t0 = Instant::now();
        let mut m = AckMemory::default();
        m.on_client_publish(V1, b"", t0);
        // The same delivery; only <pending> differs.
        let resent = b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267765.3";
        assert!(m.is_acked_redelivery(resent, t0 + Duration::from_secs(2)));
        assert!(!m.is_acked_redelivery(resent, t0 + RESEND_WINDOW));
        // Another consumer sequence or message: a replay, not a re-send.
        assert!(!m.is_acked_redelivery(b"$JS.ACK.LOGS.CV.1.58.1.1795971532879267765.0", t0));
        assert!(!m.is_acked_redelivery(b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267999.0", t0));
    }

    #[test]
    fn a_consumer_the_client_recreates_starts_with_no_memory() {
        let now = Instant::now();
        let mut m = AckMemory::default();
        m.on_client_publish(V1, b"", now);
        let again = b"$JS.ACK.LOGS.CV.2.58.5.1795971532879267765.0";
        assert!(m.is_acked_redelivery(again, now));
        m.on_client_publish(b"$JS.API.CONSUMER.INFO.LOGS.CV", b"", now);
        assert!(m.is_acked_redelivery(again, now), "INFO changes nothing");
        m.on_client_publish(b"$JS.API.CONSUMER.DELETE.LOGS.CV", b"", now);
        assert!(!m.is_acked_redelivery(again, now));
        m.on_client_publish(V1, b"", now);
        m.on_client_publish(b"$JS.hub.API.CONSUMER.CREATE.LOGS.CV.logs.>", b"{}", now);
        assert!(!m.is_acked_redelivery(again, now));
        m.on_client_publish(V1, b"", now);
        m.on_client_publish(b"$JS.API.CONSUMER.DURABLE.CREATE.LOGS.CV", b"{}", now);
        assert!(!m.is_acked_redelivery(again, now));
    }

    #[test]
    fn memory_is_bounded_per_consumer_and_in_consumers() {
        let now = Instant::now();
        let mut m = AckMemory::default();
        for s in 1..=(ACKED_PER_CONSUMER as u64 + 10) {
            m.on_client_publish(format!("$JS.ACK.S.C.1.{s}.{s}.0.0").as_bytes(), b"", now);
        }
        assert!(
            !m.is_acked_redelivery(b"$JS.ACK.S.C.2.1.1.0.0", now),
            "oldest forgotten"
        );
        assert!(m.is_acked_redelivery(b"$JS.ACK.S.C.2.4106.1.0.0", now));
        for c in 0..=MAX_CONSUMERS {
            m.on_client_publish(format!("$JS.ACK.S.K{c}.1.1.1.0.0").as_bytes(), b"", now);
        }
        assert_eq!(m.consumers.len(), MAX_CONSUMERS);
        assert!(!m.is_acked_redelivery(b"$JS.ACK.S.C.2.4106.1.0.0", now));
    }
}
