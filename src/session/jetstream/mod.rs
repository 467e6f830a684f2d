//! JetStream pull requests: what they ask ([`request`]), what becomes of each
//! ([`tracker`]), and how the server's statuses are read ([`crate::proto::status`]).
//!
//! A pull request is a publish to `<api prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`
//! with the client's inbox as reply. The server keeps it independently of any connection
//! and serves it by publishing to the inbox: deliveries keep the *stream* subject and
//! carry the inbox subscription's sid; statuses are header-only messages to the reply.
//! The proxy tracks every request per inbox, hides the statuses that only say the
//! consumer moved or is away, places lost requests again, and keeps the client's
//! heartbeat monitor fed while the consumer is away; it also remembers what the client
//! got and acked ([`acks`]) so that a delivery it has already (a redelivery of what it
//! acked, the same delivery sent again by a new leader) does not reach it twice, and
//! amends the push consumer's heartbeats that would tell ([`heartbeat`]).

pub mod acks;
pub mod consuming;
pub mod heartbeat;
pub mod pull_phase;
pub mod request;
pub mod tracker;

#[cfg(test)]
mod tests;

use std::time::Instant;

pub use request::is_pull_subject;
pub use tracker::{PullAction, PullTracker, Shield};

/// The JetStream side of a session: the client's pull requests, what it got and acked
/// of each consumer, and when it last pulled, acked and got deliveries (each bounded by
/// its own type: [`tracker`], [`acks`], [`consuming`]).
#[derive(Debug, Default)]
pub(super) struct JetStream {
    pub(super) pulls: PullTracker,
    pub(super) deliveries: acks::Deliveries,
    pub(super) consuming: consuming::Consuming,
}

impl JetStream {
    /// What a delivery with `reply` to `to` is to the client; a new one is remembered
    /// as the client's (and as its consumer's activity).
    pub(super) fn seen(
        &mut self,
        to: acks::Recipient<'_>,
        reply: &[u8],
        now: Instant,
    ) -> acks::Seen {
        if !acks::is_delivery(reply) {
            return acks::Seen::New;
        }
        let Some(d) = acks::AckRef::parse(reply) else {
            return acks::Seen::New;
        };
        let seen = self.deliveries.on_delivery_of(to, &d, now);
        if seen == acks::Seen::New {
            self.consuming.delivered(d.consumer);
        }
        seen
    }

    /// Pull requests held unplaced now.
    pub(super) fn pulls_unplaced(&self) -> usize {
        if self.pulls.is_empty() {
            0
        } else {
            self.pulls.unplaced()
        }
    }
}
