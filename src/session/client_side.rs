//! The client side of a session, as a part: how far the client's connection is, what
//! its CONNECT said, its decoder, the replies it is owed, and the bytes waiting for it.
//! What the session does with the client's ops is `client.rs`.

use bytes::BytesMut;

use super::replies::ReplyQueue;
use crate::proto::json::ClientOptions;
use crate::proto::{ClientDecoder, Limits};

/// Client-facing progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientState {
    /// Our INFO has not been sent (no upstream INFO yet).
    NoInfo,
    /// INFO sent, no CONNECT (nor other op) received yet.
    AwaitConnect,
    /// The client connected (explicitly or by sending another op first).
    Connected,
    /// A fatal `-ERR` (or silent close) waits behind replies still owed (a PONG the
    /// upstream has not answered yet); the client's input is ignored, and it is closed
    /// once they are written.
    Ending,
    /// Closed; everything further is ignored.
    Closed,
}

/// The client side of a session: how far its connection is, what its CONNECT said, its
/// decoder, the replies it is owed in order, and the bytes waiting for it.
///
/// `out` is unbounded here: the driver takes it after every event handled and stops
/// reading upstream past `max_client_pending` (the slow-consumer rule).
pub(super) struct ClientSide {
    pub(super) state: ClientState,
    pub(super) opts: ClientOptions,
    pub(super) dec: ClientDecoder,
    pub(super) replies: ReplyQueue,
    /// A PONG was written to the client (the `connect_info` INFO follows the first).
    pub(super) first_pong_sent: bool,
    /// Bytes for the client, in order (see `Session::poll_action`).
    pub(super) out: BytesMut,
    /// The client subscribed to something other than a reply inbox (`_INBOX.`).
    pub(super) subscribed: bool,
}

impl ClientSide {
    pub(super) fn new() -> ClientSide {
        ClientSide {
            state: ClientState::NoInfo,
            opts: ClientOptions::default(),
            dec: ClientDecoder::new(Limits::default()),
            replies: ReplyQueue::default(),
            first_pong_sent: false,
            out: BytesMut::new(),
            subscribed: false,
        }
    }

    /// True while the client's input is read and handled (not ending, not closed).
    pub(super) fn is_open(&self) -> bool {
        !matches!(self.state, ClientState::Closed | ClientState::Ending)
    }

    /// True once the client is closed; everything further is ignored.
    pub(super) fn is_closed(&self) -> bool {
        self.state == ClientState::Closed
    }

    /// True once the client connected, until it is closed.
    pub(super) fn is_connected(&self) -> bool {
        matches!(self.state, ClientState::Connected | ClientState::Ending)
    }

    /// Moves the bytes for the client to the end of `dst`: a swap when `dst` is empty.
    pub(super) fn take_output(&mut self, dst: &mut BytesMut) {
        if dst.is_empty() {
            std::mem::swap(dst, &mut self.out);
        } else {
            dst.extend_from_slice(&self.out);
            self.out.clear();
        }
    }
}
