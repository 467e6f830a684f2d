//! One upstream connection as the session sees it: handshake state and PING ledger.

use std::collections::VecDeque;
use std::time::Instant;

use super::action::Epoch;
use crate::proto::json::ServerInfo;
use crate::proto::{Limits, ServerDecoder};

/// Handshake progress of an upstream link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// TCP connect in progress.
    Dialing,
    /// Connected; waiting for the server's INFO.
    AwaitInfo,
    /// INFO received; CONNECT not sent yet (the client has not sent its CONNECT).
    AwaitClientConnect,
    /// CONNECT + PING written; waiting for the PONG that proves the server accepted us.
    Handshake,
    /// Handshake PONG received.
    Ready,
}

/// Who a PING sent upstream belongs to; its PONG goes to that owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingOwner {
    /// The client's PING: relay a PONG to the client.
    Client,
    /// The PING after CONNECT: the link becomes Ready.
    Handshake,
    /// The proxy's keepalive.
    Keepalive,
}

/// An upstream connection.
pub struct Link {
    pub epoch: Epoch,
    pub addr: String,
    pub state: LinkState,
    pub info: Option<ServerInfo>,
    /// PINGs written and not yet answered, oldest first.
    pub pings: VecDeque<(PingOwner, Instant)>,
    /// When the next keepalive PING is due.
    pub keepalive_at: Instant,
    /// Decoder of this link's byte stream.
    pub decoder: ServerDecoder,
}

impl Link {
    /// A link being dialed.
    pub fn new(epoch: Epoch, addr: String, now: Instant) -> Self {
        Link {
            epoch,
            addr,
            state: LinkState::Dialing,
            info: None,
            pings: VecDeque::new(),
            keepalive_at: now,
            decoder: ServerDecoder::new(Limits::upstream()),
        }
    }

    /// True once CONNECT has been written: client traffic may follow it.
    pub fn accepts_traffic(&self) -> bool {
        matches!(self.state, LinkState::Handshake | LinkState::Ready)
    }

    /// Send time of the oldest unanswered PING.
    pub fn oldest_ping(&self) -> Option<Instant> {
        self.pings.front().map(|p| p.1)
    }

    /// Name of the server for logs.
    pub fn server_name(&self) -> &str {
        self.info.as_ref().map_or("", |i| i.server_name.as_str())
    }
}
