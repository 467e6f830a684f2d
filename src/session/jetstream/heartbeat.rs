//! A push consumer's idle heartbeats, once the proxy has hidden its redeliveries.
//!
//! A push consumer with `idle_heartbeat` gets, while the server has nothing to deliver,
//!
//! ```text
//! HMSG <deliver subject> <sid> <hdr_len> <hdr_len>
//! NATS/1.0 100 Idle Heartbeat
//! Nats-Last-Consumer: <consumer sequence of the last delivery to it>
//! Nats-Last-Stream: <stream sequence>
//! ```
//!
//! (nats-server `consumer.go`, `sendIdleHeartbeat`: the two numbers are the consumer's
//! next sequences minus one). nats-py and nats.go compare `Nats-Last-Consumer` with the
//! consumer sequence in the ack subject of the last delivery they got; on a difference a
//! plain push consumer reports `ConsumerSequenceMismatch` to the error callback, an
//! ordered one recreates itself. A redelivery takes the next consumer sequence but not
//! the next stream sequence.
//!
//! When the proxy acks again, and hides, a redelivery the client had acked
//! ([`super::acks`]), the server's last delivery is one the client never got: every
//! heartbeat until the next delivery would be such an error (seen in CI: nats-py's push
//! consumer, 3 to 5 errors in a rolling restart, the heartbeat saying 3001 where the
//! client had 3000).
//!
//! So each subscription keeps its [`HiddenRun`]: the consumer sequences `first..=last` of
//! the redeliveries hidden in a row, the latest run only. A push consumer's deliveries
//! to its subscription take consecutive consumer sequences, so the client's last one is
//! `first - 1`; a heartbeat saying `last` is amended to say `first - 1`. A heartbeat
//! saying anything else comes after a delivery the client did get, and goes as it is.
//! What the run does not cover:
//! - re-sends (`<delivered>` 1, see [`super::acks`]) repeat a sequence the client has:
//!   they start no run;
//! - pull inboxes are left out: their deliveries need not take consecutive sequences
//!   (other requests, other clients of the consumer). Of the libraries tested only
//!   nats.go 1.22 would compare a pull inbox's heartbeats, and its `Fetch` never asks
//!   for them (those the proxy asks for itself are swallowed, see [`super::tracker`]);
//! - if the delivery before the run never reached the client (lost, not hidden), the
//!   client's last is lower than `first - 1` and it still sees a mismatch, as it would
//!   without the proxy.

use bytes::Bytes;

use super::acks::number;
use crate::proto::{encode, Message};

/// The header whose value a heartbeat after a hidden run gets amended.
pub const LAST_CONSUMER: &[u8] = b"Nats-Last-Consumer";

/// Consumer sequences of the redeliveries hidden in a row on one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HiddenRun {
    pub first: u64,
    pub last: u64,
}

impl HiddenRun {
    /// The run after hiding a redelivery with `consumer_seq`: the same run grown when it
    /// is the next sequence, else a new one.
    pub fn after(run: Option<HiddenRun>, consumer_seq: u64) -> HiddenRun {
        match run {
            Some(r) if r.last.checked_add(1) == Some(consumer_seq) => HiddenRun {
                last: consumer_seq,
                ..r
            },
            _ => HiddenRun {
                first: consumer_seq,
                last: consumer_seq,
            },
        }
    }

    /// `m` re-encoded to say the client's last consumer sequence, when it is an idle
    /// heartbeat that names the run's last hidden delivery as the server's last.
    pub fn amend(self, m: &Message) -> Option<Bytes> {
        if m.status() != Some(100) || m.reply().is_some() || !m.payload().is_empty() {
            return None;
        }
        let h = m.headers();
        let at = value_at(h, LAST_CONSUMER)?;
        if number(&h[at.clone()]) != Some(self.last) {
            return None;
        }
        let shown = self.first.checked_sub(1)?.to_string();
        let headers = [&h[..at.start], shown.as_bytes(), &h[at.end..]].concat();
        Some(encode::msg(m.subject(), m.sid(), None, Some(&headers), b""))
    }
}

/// Where the value of the header `name` (case-insensitive, the first of that name) lies
/// in the header block `h`, without the blanks around it.
fn value_at(h: &[u8], name: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    // The first line is the version and status.
    for line in h.split_inclusive(|&c| c == b'\n') {
        let at = start;
        start += line.len();
        if at == 0 {
            continue;
        }
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        if !line[..colon].trim_ascii().eq_ignore_ascii_case(name) {
            continue;
        }
        let value = &line[colon + 1..];
        let lead = value.len() - value.trim_ascii_start().len();
        let trail = value.len() - value.trim_ascii_end().len();
        let from = at + colon + 1 + lead;
        let to = (at + line.len() - trail).max(from);
        return Some(from..to);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Limits, ServerDecoder, ServerOp};
    use bytes::BytesMut;

    fn message(frame: &[u8]) -> Message {
        let mut d = ServerDecoder::new(Limits::default());
        let mut buf = BytesMut::from(frame);
        match d.decode(&mut buf) {
            Ok(Some(ServerOp::Msg(m))) => m,
            _ => panic!("not a message: {}", String::from_utf8_lossy(frame)),
        }
    }

    fn heartbeat(last_consumer: u64) -> Message {
        let h = format!(
            "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {last_consumer}\r\nNats-Last-Stream: 3000\r\n\r\n"
        );
        message(format!("HMSG dlv 7 {0} {0}\r\n{h}\r\n", h.len()).as_bytes())
    }

    #[test]
    fn a_run_grows_by_consecutive_sequences_only() {
        let r = HiddenRun::after(None, 3001);
        assert_eq!(
            r,
            HiddenRun {
                first: 3001,
                last: 3001
            }
        );
        let r = HiddenRun::after(Some(r), 3002);
        assert_eq!(
            r,
            HiddenRun {
                first: 3001,
                last: 3002
            }
        );
        // Something the client got came between: a new run.
        let r = HiddenRun::after(Some(r), 3005);
        assert_eq!(
            r,
            HiddenRun {
                first: 3005,
                last: 3005
            }
        );
        let r = HiddenRun::after(
            Some(HiddenRun {
                first: 1,
                last: u64::MAX,
            }),
            0,
        );
        assert_eq!(r, HiddenRun { first: 0, last: 0 });
    }

    #[test]
    fn a_heartbeat_naming_the_hidden_delivery_says_the_clients_last_instead() {
        let run = HiddenRun {
            first: 3001,
            last: 3002,
        };
        let amended = run.amend(&heartbeat(3002)).expect("amended");
        let m = message(&amended);
        assert_eq!(m.subject(), b"dlv");
        assert_eq!(m.sid(), b"7");
        assert_eq!(m.reply(), None);
        assert_eq!(m.status(), Some(100));
        assert_eq!(m.header(LAST_CONSUMER), Some(&b"3000"[..]));
        assert_eq!(m.header(b"Nats-Last-Stream"), Some(&b"3000"[..]));
        assert!(m.payload().is_empty());
    }

    #[test]
    fn anything_else_goes_as_it_is() {
        let run = HiddenRun {
            first: 3001,
            last: 3001,
        };
        // After a delivery the client got.
        assert_eq!(run.amend(&heartbeat(3002)), None);
        // A flow control request (it has a reply), a data message, another status.
        let fc = "NATS/1.0 100 FlowControl Request\r\n\r\n";
        let fc = format!("HMSG dlv 7 $JS.FC.S.C.x {0} {0}\r\n{fc}\r\n", fc.len());
        assert_eq!(run.amend(&message(fc.as_bytes())), None);
        let data = "NATS/1.0\r\nNats-Last-Consumer: 3001\r\n\r\n";
        let data = format!(
            "HMSG dlv 7 {} {}\r\n{data}x\r\n",
            data.len(),
            data.len() + 1
        );
        assert_eq!(run.amend(&message(data.as_bytes())), None);
        assert_eq!(run.amend(&message(b"MSG dlv 7 1\r\nx\r\n")), None);
        // No such header, or not a number.
        let bare = "NATS/1.0 100 Idle Heartbeat\r\n\r\n";
        let bare = format!("HMSG dlv 7 {0} {0}\r\n{bare}\r\n", bare.len());
        assert_eq!(run.amend(&message(bare.as_bytes())), None);
        let odd = "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: x\r\n\r\n";
        let odd = format!("HMSG dlv 7 {0} {0}\r\n{odd}\r\n", odd.len());
        assert_eq!(run.amend(&message(odd.as_bytes())), None);
    }

    #[test]
    fn the_header_is_found_however_it_is_spelled() {
        let h = b"NATS/1.0 100 Idle Heartbeat\r\nnats-last-consumer :  42 \r\n\r\n";
        let at = value_at(h, LAST_CONSUMER).unwrap();
        assert_eq!(&h[at], b"42");
        let h = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer:\r\n\r\n";
        let at = value_at(h, LAST_CONSUMER).unwrap();
        assert!(h[at].is_empty());
        assert_eq!(value_at(b"NATS/1.0 100\r\n\r\n", LAST_CONSUMER), None);
    }
}
