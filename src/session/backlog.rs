//! Client traffic toward the upstream: the backlog while no primary can take it, the
//! publishes kept until a PONG confirms them, and SUB/UNSUB to every link.
//!
//! [`Backlog`] owns the queue, its byte count and the confirmation of publishes, and has
//! the one path by which a client publish or PING is written to a link
//! ([`Backlog::send`], [`Backlog::flush`]): nothing else in the session changes them.

use bytes::Bytes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::action::Action;
use super::link::{Link, PingOwner};
use crate::proto::encode;

/// Longest a publish waits for its confirmation PING (see `Backlog::confirm_soon`).
pub const CONFIRM_DELAY: Duration = Duration::from_millis(20);

/// Unconfirmed publish bytes that get their confirmation PING at once.
pub const CONFIRM_BYTES: usize = 64 * 1024;

/// Unconfirmed publish bytes on the primary past which the client is not read until a
/// PONG confirms some (`Session::wants_client_input`): what a burst holds for
/// re-sending, and what a dead node's publishes cost to send again. On loopback 1 MiB
/// is about 6 ms of publishes at the proxy's top rate, many confirmation round trips.
/// Without a primary the backlog takes up to `max_backlog` instead.
pub const MAX_UNCONFIRMED: usize = 1024 * 1024;

/// A client op waiting for a primary that accepts traffic.
#[derive(Debug)]
pub(super) enum Pending {
    /// Client publishes (one frame, or a run of them read together: how many), kept
    /// until confirmed.
    Data(Bytes, u32),
    /// A publish the proxy does not keep for re-sending (pull requests: the tracker does).
    Untracked(Bytes),
    Ping,
}

impl Pending {
    fn bytes(&self) -> usize {
        match self {
            Pending::Data(b, _) | Pending::Untracked(b) => b.len(),
            Pending::Ping => 0,
        }
    }
}

/// The client's publishes and PINGs on their way upstream.
///
/// Bound: the session stops reading the client once [`Backlog::bytes`] plus the
/// primary's unconfirmed bytes reach `max_backlog`, or the unconfirmed bytes alone
/// reach [`MAX_UNCONFIRMED`] (`Session::wants_client_input`); the queue itself never
/// refuses an op.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// Ops waiting for a primary that takes traffic, in the client's order.
    queue: VecDeque<Pending>,
    /// Bytes of the publishes in `queue`.
    bytes: usize,
    /// Publishes were written to the primary since its last PING.
    unpinged: bool,
    /// When the confirmation PING for them is due.
    confirm_at: Option<Instant>,
}

impl Backlog {
    /// True when nothing waits in the queue.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Bytes waiting in the queue.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// When [`Self::confirm_now`] is due, if publishes wait for a confirmation.
    pub(super) fn confirm_at(&self) -> Option<Instant> {
        self.confirm_at
    }

    /// `p` goes to `to` now, or waits behind what is already queued (`to` is `None`
    /// while no primary takes traffic).
    pub(super) fn send(
        &mut self,
        to: Option<&mut Link>,
        p: Pending,
        now: Instant,
        out: &mut VecDeque<Action>,
    ) {
        match to {
            Some(l) if self.queue.is_empty() => self.write(l, p, now, out),
            _ => {
                self.bytes += p.bytes();
                self.queue.push_back(p);
            }
        }
    }

    /// Everything queued goes to `to`, in order.
    pub(super) fn flush(&mut self, to: &mut Link, now: Instant, out: &mut VecDeque<Action>) {
        while let Some(p) = self.queue.pop_front() {
            self.bytes -= p.bytes();
            self.write(to, p, now, out);
        }
    }

    /// Ops a dead link never confirmed, in their order: they go out again before
    /// anything queued since.
    pub(super) fn requeue_front(&mut self, ops: impl DoubleEndedIterator<Item = Pending>) {
        for p in ops.rev() {
            self.bytes += p.bytes();
            self.queue.push_front(p);
        }
    }

    /// A PING the session wrote to the primary for its own reasons (the switch
    /// barrier): it confirms every publish before it.
    pub(super) fn pinged(&mut self) {
        self.unpinged = false;
    }

    /// The one write path of a client op to a link.
    fn write(&mut self, l: &mut Link, p: Pending, now: Instant, out: &mut VecDeque<Action>) {
        let frame = match p {
            Pending::Data(b, msgs) => {
                l.publish_sent(b.clone(), msgs);
                self.unpinged = true;
                b
            }
            Pending::Untracked(b) => b,
            Pending::Ping => {
                l.ping_sent(PingOwner::Client, now);
                self.unpinged = false;
                Bytes::from_static(encode::PING)
            }
        };
        out.push_back(Action::ToUpstream(l.epoch, frame));
    }

    /// One PING confirms every publish before it: its PONG lets the link forget them
    /// (until then they are kept to be written again if the link dies). It goes out once
    /// [`CONFIRM_BYTES`] are unconfirmed or [`CONFIRM_DELAY`] after the first of them,
    /// not after every batch: at 1,000 requests/s a PING per request cost +50 µs at p50
    /// and +360 µs at p99 of the round trip (the server's work and the proxy's wake-ups
    /// for as many PONGs). A PING of the client's or a keepalive confirms them sooner.
    pub(super) fn confirm_soon(
        &mut self,
        primary: Option<&mut Link>,
        now: Instant,
        out: &mut VecDeque<Action>,
    ) {
        if !self.unpinged {
            self.confirm_at = None;
            return;
        }
        let pending = primary.as_ref().map_or(0, |l| l.unconfirmed_bytes);
        if pending < CONFIRM_BYTES {
            self.confirm_at.get_or_insert(now + CONFIRM_DELAY);
            return;
        }
        self.confirm_now(primary, now, out);
    }

    /// The confirmation PING goes out now, unless one already on its way covers the
    /// publishes.
    pub(super) fn confirm_now(
        &mut self,
        primary: Option<&mut Link>,
        now: Instant,
        out: &mut VecDeque<Action>,
    ) {
        self.confirm_at = None;
        if !self.unpinged {
            return;
        }
        let needs = |l: &Link| l.pings.back().is_none_or(|p| p.mark < l.seq);
        match primary {
            Some(l) if needs(l) => {
                l.ping_sent(PingOwner::Keepalive, now);
                self.unpinged = false;
                out.push_back(Action::ToUpstream(
                    l.epoch,
                    Bytes::from_static(encode::PING),
                ));
            }
            // A PING already on its way covers them.
            Some(_) => self.unpinged = false,
            // The link died: they are in the queue, confirmed once written again.
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Epoch;

    fn link(now: Instant) -> Link {
        Link::new(Epoch(1), "n1".into(), now)
    }

    #[test]
    fn queued_ops_go_out_in_order_and_a_client_ping_confirms_what_came_before() {
        let now = Instant::now();
        let (mut b, mut out) = (Backlog::default(), VecDeque::new());
        b.send(
            None,
            Pending::Data(Bytes::from_static(b"PUB a 1\r\nx\r\n"), 1),
            now,
            &mut out,
        );
        b.send(None, Pending::Ping, now, &mut out);
        assert_eq!(b.bytes(), 12);
        let mut l = link(now);
        // The queue is not empty: a new op waits behind it, also with a link.
        b.send(
            Some(&mut l),
            Pending::Untracked(Bytes::from_static(b"PUB r 0\r\n\r\n")),
            now,
            &mut out,
        );
        assert!(out.is_empty());
        b.flush(&mut l, now, &mut out);
        assert_eq!(b.bytes(), 0);
        let frames: Vec<_> = out
            .iter()
            .map(|a| match a {
                Action::ToUpstream(_, f) => f.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            frames,
            [&b"PUB a 1\r\nx\r\n"[..], b"PING\r\n", b"PUB r 0\r\n\r\n"]
        );
        // The client's PING covers the publish: no confirmation PING of the proxy's.
        b.confirm_soon(Some(&mut l), now, &mut out);
        assert_eq!(b.confirm_at(), None);
        assert_eq!(l.unconfirmed.len(), 1);
    }

    #[test]
    fn a_publish_is_confirmed_after_the_delay_or_at_once_past_the_bytes() {
        let now = Instant::now();
        let (mut b, mut out) = (Backlog::default(), VecDeque::new());
        let mut l = link(now);
        b.send(
            Some(&mut l),
            Pending::Data(Bytes::from_static(b"PUB a 0\r\n\r\n"), 1),
            now,
            &mut out,
        );
        b.confirm_soon(Some(&mut l), now, &mut out);
        assert_eq!(b.confirm_at(), Some(now + CONFIRM_DELAY));
        assert_eq!(out.len(), 1);
        b.confirm_now(Some(&mut l), now + CONFIRM_DELAY, &mut out);
        assert_eq!(out.len(), 2, "the confirmation PING");
        assert_eq!(l.pings.len(), 1);
        let big = Bytes::from(vec![b'x'; CONFIRM_BYTES]);
        b.send(Some(&mut l), Pending::Data(big, 1), now, &mut out);
        b.confirm_soon(Some(&mut l), now, &mut out);
        assert_eq!((out.len(), b.confirm_at()), (4, None), "at once");
        // Requeued after a link died: in front, counted again.
        b.requeue_front([Pending::Data(Bytes::from_static(b"PUB a 0\r\n\r\n"), 1)].into_iter());
        assert_eq!(b.bytes(), 11);
    }
}
