//! Ordering of the proxy's replies to the client's own commands.
//!
//! nats-server answers a client's commands in order (`+OK` for verbose clients, `PONG` for
//! `PING`). The proxy answers `+OK` itself but relays `PONG` only after the upstream has
//! answered a PING sent behind everything the client wrote before it (flush semantics).
//! An `+OK` that follows a not-yet-answered PING waits behind it, and so does an `-ERR`
//! the proxy makes itself (`'Invalid Subject'`, or a fatal one before the close): the
//! server would have answered the PING first.

use bytes::Bytes;
use std::collections::VecDeque;

use super::action::CloseReason;

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Pong { ready: bool },
    Ok,
    Err(Bytes, Option<CloseReason>),
}

/// Replies owed to the client, in command order. Bounded by what the client can have
/// outstanding: PINGs are bounded by the upstream ledger, `+OK`s by the input rate.
#[derive(Debug, Default)]
pub struct ReplyQueue {
    q: VecDeque<Reply>,
}

/// One reply to write to the client now.
#[derive(Debug, Clone, PartialEq)]
pub enum Ready {
    Pong,
    Ok,
    /// A whole `-ERR` line; with a reason, the client is closed after it.
    Err(Bytes, Option<CloseReason>),
}

impl ReplyQueue {
    /// A PING was sent on; its PONG is owed.
    pub fn push_pong(&mut self) {
        self.q.push_back(Reply::Pong { ready: false });
    }
    /// An `+OK` is owed; returns true if it can be written at once.
    pub fn push_ok(&mut self) -> bool {
        if self.q.is_empty() {
            return true;
        }
        self.q.push_back(Reply::Ok);
        false
    }
    /// An `-ERR` line is owed (and a close after it, with `close`); returns true if it
    /// can be written at once.
    pub fn push_err(&mut self, line: Bytes, close: Option<CloseReason>) -> bool {
        if self.q.is_empty() {
            return true;
        }
        self.q.push_back(Reply::Err(line, close));
        false
    }
    /// The oldest owed PONG may be sent.
    pub fn pong_arrived(&mut self) {
        if let Some(r) = self
            .q
            .iter_mut()
            .find(|r| matches!(r, Reply::Pong { ready: false }))
        {
            *r = Reply::Pong { ready: true };
        }
    }
    /// Pops the next reply that can be written, in order.
    pub fn pop_ready(&mut self) -> Option<Ready> {
        match self.q.front()? {
            Reply::Pong { ready: true } => {
                self.q.pop_front();
                Some(Ready::Pong)
            }
            Reply::Ok => {
                self.q.pop_front();
                Some(Ready::Ok)
            }
            Reply::Err(..) => match self.q.pop_front() {
                Some(Reply::Err(line, close)) => Some(Ready::Err(line, close)),
                _ => None,
            },
            Reply::Pong { ready: false } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ok_waits_behind_an_unanswered_ping() {
        let mut q = ReplyQueue::default();
        assert!(q.push_ok());
        q.push_pong();
        assert!(!q.push_ok());
        assert_eq!(q.pop_ready(), None);
        q.pong_arrived();
        assert_eq!(q.pop_ready(), Some(Ready::Pong));
        assert_eq!(q.pop_ready(), Some(Ready::Ok));
        assert_eq!(q.pop_ready(), None);
    }

    #[test]
    fn err_waits_behind_an_unanswered_ping() {
        let mut q = ReplyQueue::default();
        let e = Bytes::from_static(b"-ERR 'Invalid Subject'\r\n");
        assert!(q.push_err(e.clone(), None));
        q.push_pong();
        assert!(!q.push_err(e.clone(), None));
        assert!(!q.push_err(e.clone(), Some(CloseReason::ClientProtocol)));
        assert_eq!(q.pop_ready(), None);
        q.pong_arrived();
        assert_eq!(q.pop_ready(), Some(Ready::Pong));
        assert_eq!(q.pop_ready(), Some(Ready::Err(e.clone(), None)));
        assert_eq!(
            q.pop_ready(),
            Some(Ready::Err(e, Some(CloseReason::ClientProtocol)))
        );
        assert_eq!(q.pop_ready(), None);
    }
}
