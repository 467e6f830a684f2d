//! What the client acked, so that the server's redelivery of a message the client
//! already processed is acked again by the proxy instead of reaching the client.
//!
//! An ack lost with a dying node (or in a leader change) makes the server redeliver after
//! `ack_wait`, although the client processed the message. The proxy sees both sides:
//! every ack is a client publish to the delivery's reply subject
//!
//! ```text
//! $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
//! $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>.…[.<token>]
//! ```
//!
//! with an empty payload or `+ACK` (async-nats, nats.go, cnats, nats.js, nats-py), and
//! every redelivery carries `<delivered>` > 1 and the same stream sequence. Only explicit
//! positive acks the client really sent are remembered (`-NAK`, `+WPI`, `+TERM`, `+NXT`
//! are not), per consumer, the most recent [`ACKED_PER_CONSUMER`] of them, for at most
//! [`MAX_CONSUMERS`] consumers (past either bound the oldest is forgotten: its
//! redelivery then reaches the client as it would without the proxy).

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;

/// Acks remembered per consumer.
pub const ACKED_PER_CONSUMER: usize = 4096;
/// Consumers remembered per session.
pub const MAX_CONSUMERS: usize = 64;

const PREFIX: &[u8] = b"$JS.ACK.";

/// A delivery's place, from its ack subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRef<'a> {
    /// `<stream>.<consumer>` (with domain and hash in the v2 form): the consumer's key.
    pub consumer: &'a [u8],
    pub delivered: u64,
    pub stream_seq: u64,
}

fn number(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

impl AckRef<'_> {
    /// Parses an ack subject in either form; None for anything else.
    pub fn parse(subject: &[u8]) -> Option<AckRef<'_>> {
        let rest = subject.strip_prefix(PREFIX)?;
        let dots: Vec<usize> = memchr::memchr_iter(b'.', rest).collect();
        // v1: 7 tokens (6 dots), the delivered count is token 2; v2: 9 or 10, token 4.
        let key_tokens = match dots.len() {
            6 => 2,
            8 | 9 => 4,
            _ => return None,
        };
        let token = |i: usize| {
            let start = if i == 0 { 0 } else { dots[i - 1] + 1 };
            let end = dots.get(i).copied().unwrap_or(rest.len());
            &rest[start..end]
        };
        Some(AckRef {
            consumer: &rest[..dots[key_tokens - 1]],
            delivered: number(token(key_tokens))?,
            stream_seq: number(token(key_tokens + 1))?,
        })
    }
}

/// Whether a delivery with this reply could be a redelivery (its delivered count is not
/// `1`): the relay's fast path leaves such deliveries to the full path. Cheap: one scan
/// to the third (v1) token; v2 replies are always left to the full path.
pub fn maybe_redelivery(reply: &[u8]) -> bool {
    let Some(rest) = reply.strip_prefix(PREFIX) else {
        return false;
    };
    let mut it = memchr::memchr_iter(b'.', rest);
    let (Some(_), Some(b), Some(c)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    &rest[b + 1..c] != b"1"
}

#[derive(Debug, Default)]
struct Acked {
    seqs: HashSet<u64>,
    order: VecDeque<u64>,
}

/// The client's acks, per consumer.
#[derive(Debug, Default)]
pub struct AckMemory {
    consumers: HashMap<Bytes, Acked>,
    /// Consumers in the order they were first seen (for the bound).
    order: VecDeque<Bytes>,
}

impl AckMemory {
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
    }

    /// A client publish to `subject` with `payload`: remembered if it is a positive ack.
    pub fn on_client_publish(&mut self, subject: &[u8], payload: &[u8]) {
        if !subject.starts_with(PREFIX) {
            return;
        }
        let positive = payload.is_empty() || payload.trim_ascii() == b"+ACK";
        let Some(a) = AckRef::parse(subject).filter(|_| positive) else {
            return;
        };
        if !self.consumers.contains_key(a.consumer) {
            if self.order.len() >= MAX_CONSUMERS {
                if let Some(old) = self.order.pop_front() {
                    self.consumers.remove(&old);
                }
            }
            let key = Bytes::copy_from_slice(a.consumer);
            self.order.push_back(key.clone());
            self.consumers.insert(key, Acked::default());
        }
        let Some(acked) = self.consumers.get_mut(a.consumer) else {
            return;
        };
        if acked.seqs.insert(a.stream_seq) {
            acked.order.push_back(a.stream_seq);
            if acked.order.len() > ACKED_PER_CONSUMER {
                if let Some(old) = acked.order.pop_front() {
                    acked.seqs.remove(&old);
                }
            }
        }
    }

    /// Whether a delivery with this reply is a redelivery of a message the client acked.
    pub fn is_acked_redelivery(&self, reply: &[u8]) -> bool {
        let Some(a) = AckRef::parse(reply) else {
            return false;
        };
        a.delivered > 1
            && self
                .consumers
                .get(a.consumer)
                .is_some_and(|c| c.seqs.contains(&a.stream_seq))
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
            (a.consumer, a.delivered, a.stream_seq),
            (&b"LOGS.CV"[..], 1, 58)
        );
        let a = AckRef::parse(b"$JS.ACK.hub.ACC.LOGS.CV.3.58.5.1795.0.tok").unwrap();
        assert_eq!(
            (a.consumer, a.delivered, a.stream_seq),
            (&b"hub.ACC.LOGS.CV"[..], 3, 58)
        );
        assert!(AckRef::parse(b"$JS.ACK.LOGS.CV.x.58.5.1.0").is_none());
        assert!(AckRef::parse(b"$JS.ACK.LOGS").is_none());
        assert!(AckRef::parse(b"_INBOX.a.b.c.d.e.f.g").is_none());
        assert!(!maybe_redelivery(V1));
        assert!(maybe_redelivery(
            b"$JS.ACK.LOGS.CV.2.58.5.1795971532879267765.0"
        ));
        assert!(!maybe_redelivery(b"_INBOX.x"));
    }

    #[test]
    fn only_a_redelivery_of_what_the_client_acked_is_recognised() {
        let mut m = AckMemory::default();
        m.on_client_publish(V1, b"");
        m.on_client_publish(b"$JS.ACK.LOGS.CV.1.59.6.1795971532879267765.0", b"+ACK");
        m.on_client_publish(b"$JS.ACK.LOGS.CV.1.60.7.1795971532879267765.0", b"-NAK");
        m.on_client_publish(b"$JS.ACK.LOGS.CV.1.61.8.1795971532879267765.0", b"+WPI");
        let again = |s: u64| format!("$JS.ACK.LOGS.CV.2.{s}.9.1795971532879267799.0");
        assert!(m.is_acked_redelivery(again(58).as_bytes()));
        assert!(m.is_acked_redelivery(again(59).as_bytes()));
        assert!(
            !m.is_acked_redelivery(again(60).as_bytes()),
            "a NAK is no ack"
        );
        assert!(!m.is_acked_redelivery(again(61).as_bytes()));
        assert!(!m.is_acked_redelivery(V1), "a first delivery always passes");
        assert!(
            !m.is_acked_redelivery(b"$JS.ACK.LOGS.OTHER.2.58.9.1.0"),
            "per consumer"
        );
    }

    #[test]
    fn memory_is_bounded_per_consumer_and_in_consumers() {
        let mut m = AckMemory::default();
        for s in 1..=(ACKED_PER_CONSUMER as u64 + 10) {
            m.on_client_publish(format!("$JS.ACK.S.C.1.{s}.{s}.0.0").as_bytes(), b"");
        }
        assert!(
            !m.is_acked_redelivery(b"$JS.ACK.S.C.2.1.1.0.0"),
            "oldest forgotten"
        );
        assert!(m.is_acked_redelivery(b"$JS.ACK.S.C.2.4106.1.0.0"));
        for c in 0..=MAX_CONSUMERS {
            m.on_client_publish(format!("$JS.ACK.S.K{c}.1.1.1.0.0").as_bytes(), b"");
        }
        assert_eq!(m.consumers.len(), MAX_CONSUMERS);
        assert!(!m.is_acked_redelivery(b"$JS.ACK.S.C.2.4106.1.0.0"));
    }
}
