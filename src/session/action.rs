//! What the session asks its driver to do.

use bytes::Bytes;
use std::collections::VecDeque;

use super::stats::{SessionEvent, MAX_EVENTS};

/// Generation number of an upstream connection. Every dial gets a new one; anything that
/// arrives from an epoch that is no longer live is ignored, never routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub(crate) u64);

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why the client connection is being closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client violated the protocol (the matching `-ERR`, if any, was queued first).
    ClientProtocol,
    /// The client went away.
    ClientGone,
    /// The upstream closed, failed or went stale and no other could take over.
    UpstreamLost,
    /// Every known node refused the handshake (the proxy's CONNECT on the client's
    /// behalf) with the same kind of `-ERR`; the client got the last one.
    UpstreamRefused,
    /// More than `max_client_pending` bytes were waiting for the client's socket (back-pressure
    /// from a client that reads too slowly): nats-server's slow-consumer rule.
    SlowConsumer,
    /// The proxy is shutting down.
    Shutdown,
}

/// An effect for the driver to carry out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write these bytes to the client.
    ToClient(Bytes),
    /// Write these bytes to the upstream connection of this epoch.
    ToUpstream(Epoch, Bytes),
    /// Open a TCP connection to `addr` (`host:port`) for this epoch; report with
    /// `handle_upstream_connected` or `handle_upstream_lost`.
    Dial { epoch: Epoch, addr: String },
    /// Close the upstream connection of this epoch (after writing what is queued).
    CloseUpstream(Epoch),
    /// Flush what is queued for the client, then close it.
    CloseClient(CloseReason),
}

/// What the session has for its driver: actions, in order, and events for metrics.
///
/// Actions are drained after every event handled (the call order in [`super::Session`]),
/// so they stay few; events are bounded by [`MAX_EVENTS`], the oldest dropped past it
/// (metrics lose a sample, nothing else depends on them).
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub(super) actions: VecDeque<Action>,
    events: VecDeque<SessionEvent>,
}

impl Outbox {
    /// Queues an event for metrics.
    pub(super) fn event(&mut self, e: SessionEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    /// The next event for metrics.
    pub(super) fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }
}
