//! Whether the client is still consuming: per JetStream consumer, when it last asked
//! for messages (a pull request), how long that request waits, when it last acked, and
//! how many deliveries it holds unacked. The shell ([`crate::proxy`]) reads these to tell a
//! client that stopped from one that is slow (`/livez/client`).
//!
//! Keys are `<stream>.<consumer>`, taken from the last two tokens of a pull subject
//! (`<prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`) and of an ack reply's consumer key
//! (`<stream>.<consumer>`, or `<domain>.<hash>.<stream>.<consumer>`), so that a pull and
//! the acks of its deliveries meet in one entry.
//!
//! Bound: [`MAX_WATCHED_CONSUMERS`] per session; past it the consumer
//! first seen is forgotten.

use std::time::{Duration, Instant};

use bytes::Bytes;

/// Consumers watched per session.
pub const MAX_WATCHED_CONSUMERS: usize = 64;

/// What the client did last with one consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerActivity {
    /// `<stream>.<consumer>`.
    pub key: Bytes,
    /// The client's last pull request.
    pub pulled_at: Option<Instant>,
    /// Until when the client's pull requests wait at the server (the latest
    /// `pulled_at + expires`; a request without an expiry waits until served, which this
    /// counts as no wait: its sending is the sign).
    pub waiting_until: Option<Instant>,
    /// The client's last ack of any kind (`+ACK`, `-NAK`, `+WPI`, `+TERM`, `+NXT`):
    /// each is work on the consumer's messages.
    pub acked_at: Option<Instant>,
    /// Deliveries that reached the client less the acks that end one (all but `+WPI`,
    /// which says the client still works on it), at least zero.
    pub outstanding: u64,
}

impl ConsumerActivity {
    /// The last sign that the client is consuming: a pull sent, a pull still waiting
    /// (counted to its expiry), an ack.
    pub fn progress_at(&self) -> Option<Instant> {
        [self.pulled_at, self.waiting_until, self.acked_at]
            .into_iter()
            .flatten()
            .max()
    }

    /// True when the client holds a delivery it has not acked: a message it has not
    /// finished (a slow downstream), or one it will never ack (a client stuck
    /// mid-message, acks disabled, one `AckAll` ack for many): the wire cannot tell
    /// these apart. Counted, not matched: an ack sent twice for one delivery counts
    /// twice.
    pub fn holding(&self) -> bool {
        self.outstanding > 0
    }
}

/// The last two dot-separated tokens of `s` (`<stream>.<consumer>`), if it has two.
fn stream_and_consumer(s: &[u8]) -> Option<&[u8]> {
    let last = memchr::memrchr(b'.', s)?;
    let start = memchr::memrchr(b'.', &s[..last]).map_or(0, |d| d + 1);
    (start < last && last + 1 < s.len()).then_some(&s[start..])
}

/// Every consumer the client used, with what it did last.
#[derive(Debug, Default)]
pub struct Consuming {
    /// In the order they were first seen (the bound drops the first).
    consumers: Vec<ConsumerActivity>,
    /// Changes since the session started: the driver copies the list out only when it
    /// moved.
    changes: u64,
}

impl Consuming {
    /// The consumers, oldest change first.
    pub fn consumers(&self) -> &[ConsumerActivity] {
        &self.consumers
    }

    /// Changes so far (a counter: equal means nothing changed).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    fn entry(&mut self, key: &[u8]) -> &mut ConsumerActivity {
        self.changes += 1;
        // The last one touched is the one hit nearly always: checked first.
        let i = match self.consumers.iter().rposition(|c| c.key[..] == *key) {
            Some(i) => i,
            None => {
                if self.consumers.len() >= MAX_WATCHED_CONSUMERS {
                    self.consumers.remove(0);
                }
                self.consumers.push(ConsumerActivity {
                    key: Bytes::copy_from_slice(key),
                    pulled_at: None,
                    waiting_until: None,
                    acked_at: None,
                    outstanding: 0,
                });
                self.consumers.len() - 1
            }
        };
        &mut self.consumers[i]
    }

    /// A pull request on `api_subject` at `now`, waiting up to `expires` at the server
    /// (None: no expiry, or a `no_wait` request the server answers at once).
    pub fn pulled(&mut self, api_subject: &[u8], expires: Option<Duration>, now: Instant) {
        let Some(key) = stream_and_consumer(api_subject) else {
            return;
        };
        let e = self.entry(key);
        e.pulled_at = Some(now);
        if let Some(x) = expires {
            e.waiting_until = e.waiting_until.max(Some(now + x));
        }
    }

    /// An ack by the client of a delivery of `consumer` (an ack subject's consumer key),
    /// with its body (`+WPI`: still working on it; anything else ends the delivery).
    pub fn acked(&mut self, consumer: &[u8], body: &[u8], now: Instant) {
        if let Some(key) = stream_and_consumer(consumer) {
            let e = self.entry(key);
            e.acked_at = Some(now);
            if !body.trim_ascii_start().starts_with(b"+WPI") {
                e.outstanding = e.outstanding.saturating_sub(1);
            }
        }
    }

    /// A delivery of `consumer` (an ack subject's consumer key) reached the client.
    pub fn delivered(&mut self, consumer: &[u8]) {
        let Some(key) = stream_and_consumer(consumer) else {
            return;
        };
        // No reordering on this path (every delivery): the entry stays where it is.
        match self.consumers.iter_mut().rev().find(|c| c.key[..] == *key) {
            Some(c) => {
                c.outstanding += 1;
                self.changes += 1;
            }
            None => self.entry(key).outstanding = 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_and_the_acks_of_its_deliveries_meet_in_one_entry() {
        let t0 = Instant::now();
        let mut c = Consuming::default();
        c.pulled(
            b"$JS.API.CONSUMER.MSG.NEXT.LOGS.vec",
            Some(Duration::from_secs(30)),
            t0,
        );
        let t1 = t0 + Duration::from_millis(5);
        c.delivered(b"LOGS.vec");
        c.acked(b"hub.ACCHASH.LOGS.vec", b"", t1 + Duration::from_millis(1));
        let [e] = c.consumers() else {
            panic!("{:?}", c.consumers())
        };
        assert_eq!(&e.key[..], b"LOGS.vec");
        assert_eq!(e.pulled_at, Some(t0));
        assert_eq!(e.waiting_until, Some(t0 + Duration::from_secs(30)));
        assert_eq!(e.progress_at(), Some(t0 + Duration::from_secs(30)));
        assert!(!e.holding());
        c.delivered(b"LOGS.vec");
        assert!(c.consumers()[0].holding());
    }

    #[test]
    fn a_batch_acked_but_for_its_last_message_is_held_and_work_in_progress_too() {
        let t0 = Instant::now();
        let mut c = Consuming::default();
        for _ in 0..10 {
            c.delivered(b"S.C");
        }
        for _ in 0..9 {
            c.acked(b"S.C", b"+ACK", t0);
        }
        assert!(c.consumers()[0].holding());
        c.acked(b"S.C", b"+WPI", t0);
        assert!(c.consumers()[0].holding(), "+WPI: still working on it");
        c.acked(b"S.C", b"-NAK", t0);
        assert!(!c.consumers()[0].holding());
        c.acked(b"S.C", b"+ACK", t0);
        assert_eq!(c.consumers()[0].outstanding, 0, "never below zero");
    }

    #[test]
    fn a_delivery_never_acked_is_held_and_a_short_wait_does_not_undo_a_long_one() {
        let t0 = Instant::now();
        let mut c = Consuming::default();
        c.pulled(
            b"$JS.API.CONSUMER.MSG.NEXT.S.C",
            Some(Duration::from_secs(60)),
            t0,
        );
        c.pulled(
            b"$JS.API.CONSUMER.MSG.NEXT.S.C",
            None,
            t0 + Duration::from_secs(1),
        );
        c.delivered(b"S.C");
        let e = &c.consumers()[0];
        assert!(e.holding());
        assert_eq!(e.waiting_until, Some(t0 + Duration::from_secs(60)));
        assert_eq!(e.pulled_at, Some(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn keys_need_a_stream_and_a_consumer_and_the_list_is_bounded() {
        let t0 = Instant::now();
        let mut c = Consuming::default();
        c.acked(b"nodots", b"", t0);
        c.acked(b"trailing.", b"", t0);
        assert!(c.consumers().is_empty());
        for i in 0..MAX_WATCHED_CONSUMERS + 3 {
            c.pulled(
                format!("$JS.API.CONSUMER.MSG.NEXT.S.c{i}").as_bytes(),
                None,
                t0,
            );
        }
        assert_eq!(c.consumers().len(), MAX_WATCHED_CONSUMERS);
        assert_eq!(&c.consumers()[0].key[..], b"S.c3");
        let before = c.changes();
        c.delivered(b"S.c3");
        assert_eq!(
            &c.consumers()[0].key[..],
            b"S.c3",
            "a delivery moves nothing"
        );
        assert!(c.changes() > before);
    }
}
