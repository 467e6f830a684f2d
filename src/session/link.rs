//! One upstream connection as the session sees it: handshake state, PING ledger, and the
//! client data written on it that the server has not yet confirmed.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use super::action::Epoch;
use crate::proto::json::ServerInfo;
use crate::proto::{Limits, ServerDecoder};

/// Handshake progress of an upstream link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkState {
    /// TCP connect in progress.
    Dialing,
    /// Connected; waiting for the server's INFO.
    AwaitInfo,
    /// INFO received; CONNECT not sent yet (the client has not connected yet).
    AwaitClientConnect,
    /// CONNECT + PING and the subscription replay written.
    Established,
}

/// Who a PING sent upstream belongs to; its PONG goes to that owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PingOwner {
    /// The client's PING: relay a PONG to the client.
    Client,
    /// The PING right after CONNECT: the server accepted us.
    Handshake,
    /// The PING after the subscription replay: the subscriptions are registered.
    Replay,
    /// Barrier on the old link before client traffic moves to the new one.
    Switch,
    /// Barrier after UNSUB-ing everything on the old link: it delivers nothing more.
    Drain,
    /// Keepalive, or confirmation of client data written.
    Keepalive,
}

/// A PING written and not yet answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct PingEntry {
    pub(super) owner: PingOwner,
    pub(super) sent_at: Instant,
    /// Client data written before this PING (sequence number): its PONG confirms it.
    pub(super) mark: u64,
}

/// An upstream connection.
pub(super) struct Link {
    pub(super) epoch: Epoch,
    pub(super) addr: String,
    pub(super) state: LinkState,
    pub(super) info: Option<ServerInfo>,
    /// PINGs written and not yet answered, oldest first.
    pub(super) pings: VecDeque<PingEntry>,
    /// When the next keepalive PING is due.
    pub(super) keepalive_at: Instant,
    /// Decoder of this link's byte stream.
    pub(super) decoder: ServerDecoder,
    /// Client publishes written on this link and not yet confirmed by a PONG.
    /// Publishes written and not yet confirmed: (seq, frames, how many publishes).
    pub(super) unconfirmed: VecDeque<(u64, Bytes, u32)>,
    pub(super) unconfirmed_bytes: usize,
    /// Sequence number of the last client publish written.
    pub(super) seq: u64,
    /// The server announced lame duck mode on this link.
    leaving: bool,
    /// The handshake PONG arrived: the server took our CONNECT.
    accepted: bool,
    /// The `-ERR` the server gave before it took our CONNECT (it closes next).
    pub(super) refusal: Option<Bytes>,
    /// The server's `connect_info` INFO (2.12+), for the client's first PONG.
    pub(super) connect_info: Option<ServerInfo>,
}

impl Link {
    /// A link being dialed.
    pub(super) fn new(epoch: Epoch, addr: String, now: Instant) -> Self {
        Link {
            epoch,
            addr,
            state: LinkState::Dialing,
            info: None,
            pings: VecDeque::new(),
            keepalive_at: now,
            decoder: ServerDecoder::new(Limits::upstream()),
            unconfirmed: VecDeque::new(),
            unconfirmed_bytes: 0,
            seq: 0,
            leaving: false,
            accepted: false,
            refusal: None,
            connect_info: None,
        }
    }

    /// True once CONNECT has been written: client traffic may follow it.
    pub(super) fn established(&self) -> bool {
        self.state == LinkState::Established
    }

    /// Send time of the oldest unanswered PING.
    pub(super) fn oldest_ping(&self) -> Option<Instant> {
        self.pings.front().map(|p| p.sent_at)
    }

    /// Records a PING written now.
    pub(super) fn ping_sent(&mut self, owner: PingOwner, now: Instant) {
        self.pings.push_back(PingEntry {
            owner,
            sent_at: now,
            mark: self.seq,
        });
    }

    /// Records `msgs` client publishes (`b`, one or a run of frames) written on this link.
    pub(super) fn publish_sent(&mut self, b: Bytes, msgs: u32) {
        self.seq += 1;
        self.unconfirmed_bytes += b.len();
        self.unconfirmed.push_back((self.seq, b, msgs));
    }

    /// Client publishes written and not yet confirmed.
    pub(super) fn unconfirmed_msgs(&self) -> u64 {
        self.unconfirmed.iter().map(|u| u64::from(u.2)).sum()
    }

    /// The server announced lame duck mode; true the first time.
    pub(super) fn mark_leaving(&mut self) -> bool {
        !std::mem::replace(&mut self.leaving, true)
    }

    /// True once the server announced lame duck mode on this link.
    pub(super) fn is_leaving(&self) -> bool {
        self.leaving
    }

    /// True once the server answered the PING after our CONNECT (it took the CONNECT).
    pub(super) fn is_accepted(&self) -> bool {
        self.accepted
    }

    /// A PONG arrived: returns the entry it answers and drops the data it confirms.
    pub(super) fn pong(&mut self) -> Option<PingEntry> {
        let e = self.pings.pop_front()?;
        if e.owner == PingOwner::Handshake {
            self.accepted = true;
        }
        while self.unconfirmed.front().is_some_and(|(s, ..)| *s <= e.mark) {
            if let Some((_, b, _)) = self.unconfirmed.pop_front() {
                self.unconfirmed_bytes -= b.len();
            }
        }
        Some(e)
    }

    /// Name of the server for logs.
    pub(super) fn server_name(&self) -> &str {
        self.info.as_ref().map_or("", |i| i.server_name.as_str())
    }
}
