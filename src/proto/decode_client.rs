//! Decodes what a client sends, as nats-server's client parser does: the framer finds the
//! op and its line, [`args`] reads the arguments (PUB's by hand, in [`super::fast`]),
//! and this puts the op together.

use bytes::{Buf, BytesMut};

use super::args;
use super::error::ProtoError;
use super::fast;
use super::framer::{Framer, Step, Verb, CLIENT_VERBS};
use super::op::{ClientOp, Span};
use super::Limits;

/// A complete `PUB` frame seen in place by [`ClientDecoder::peek_pub`]: offsets from the
/// start of the buffer it was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubView {
    /// Bytes of the whole frame, control line to the payload's `\r\n`.
    pub frame_len: usize,
    pub subject: Span,
    pub reply: Option<Span>,
}

impl PubView {
    /// Whether `m`, decoded from the same bytes `buf` this view was peeked in, is the same
    /// publish: what the tests and fuzz targets assert of the fast path.
    pub fn agrees_with(&self, buf: &[u8], m: &super::op::Message) -> bool {
        let f = &buf[..self.frame_len];
        m.raw[..] == *f
            && !m.has_headers()
            && m.subject() == &f[self.subject.range()]
            && m.reply() == self.reply.map(|r| &f[r.range()])
    }
}

/// Decodes what a client sends.
pub struct ClientDecoder {
    framer: Framer,
    limits: Limits,
    headers: bool,
}

impl ClientDecoder {
    /// A decoder with the given limits; HPUB is refused until [`set_headers`](Self::set_headers).
    pub fn new(limits: Limits) -> Self {
        ClientDecoder {
            framer: Framer::default(),
            limits,
            headers: false,
        }
    }

    /// Whether the client's CONNECT enabled headers (HPUB allowed).
    pub fn set_headers(&mut self, on: bool) {
        self.headers = on;
    }

    /// Updates the limits (the payload limit comes from the upstream INFO).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// A complete, well-formed `PUB` frame at the start of `buf`, without consuming it:
    /// the relay's fast path for publishes. `None` when anything is unusual: a frame in
    /// progress, not `PUB ` in its canonical spelling, the line not ending in `\r\n`, the
    /// frame incomplete, or [`decode`](Self::decode) would fail. Then `decode` handles
    /// it, so a `Some` always agrees with what `decode` returns for the same bytes (the
    /// tests and the fuzz targets check).
    #[inline]
    pub fn peek_pub(&self, buf: &[u8]) -> Option<PubView> {
        if self.framer.pending.is_some() || self.framer.scanned != 0 || !buf.starts_with(b"PUB ") {
            return None;
        }
        let fast::PubLine {
            nl,
            args,
            subject,
            reply,
            size,
        } = fast::pub_line(buf, 4, 4 + self.limits.max_control_line + 2)?;
        if nl - 1 - args > self.limits.max_control_line {
            return None;
        }
        let size = fast::parse_size(&buf[size.range()])?;
        if size > self.limits.max_payload {
            return None;
        }
        let frame_len = nl + 1 + size + 2;
        if buf.len() < frame_len || &buf[frame_len - 2..frame_len] != b"\r\n" {
            return None;
        }
        Some(PubView {
            frame_len,
            subject,
            reply,
        })
    }

    /// Decodes the next op from `buf`, consuming its bytes. `Ok(None)`: need more bytes.
    ///
    /// One function, every op written out in its arm: split into a function per op
    /// (b39c428) it ran PUB 16 % slower in wall clock on fewer instructions, with the
    /// rare ops alone moved out still 6 % (BENCHMARKS.md, eighth run); the length check
    /// in `tests/modules.rs` names it as its one exception.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<ClientOp>, ProtoError> {
        let line = match self.framer.next(
            buf,
            CLIENT_VERBS,
            (b"PUB ", Verb::Pub),
            self.limits.max_control_line,
        )? {
            None => return Ok(None),
            Some(Step::Msg(m)) => return Ok(Some(ClientOp::Pub(m))),
            Some(Step::Line(l)) => l,
        };
        let (a, b) = (line.arg_start, line.arg_end);
        let span = |f: &[u8]| args::span(buf, f);
        let op = match line.verb {
            Verb::Ping => ClientOp::Ping,
            Verb::Pong => ClientOp::Pong,
            Verb::Ok => ClientOp::Ok,
            Verb::Connect | Verb::Info | Verb::Err => {
                let text = span(args::text(&buf[a..b]));
                let arg = buf.split_to(line.nl + 1).freeze().slice(text.range());
                return Ok(Some(match line.verb {
                    Verb::Connect => ClientOp::Connect(arg),
                    Verb::Info => ClientOp::Info(arg),
                    _ => ClientOp::Err(arg),
                }));
            }
            Verb::Pub => {
                let (subject, reply, size) =
                    fast::pub_args(buf, a, b).ok_or(ProtoError::BadArgs("PUB"))?;
                let size =
                    fast::parse_size(&buf[size.range()]).ok_or(ProtoError::BadSize("PUB"))?;
                if size > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let m =
                    self.framer
                        .message(buf, &line, subject, Span::default(), reply, None, size)?;
                return Ok(m.map(ClientOp::Pub));
            }
            Verb::HPub => {
                if !self.headers {
                    return Err(ProtoError::HeadersNotSupported);
                }
                let f = args::hpub_args(&buf[a..b]).ok_or(ProtoError::BadArgs("HPUB"))?;
                let hdr = args::size(f.hdr).ok_or(ProtoError::BadSize("HPUB"))?;
                let total = args::size(f.total).ok_or(ProtoError::BadSize("HPUB"))?;
                if hdr > total {
                    return Err(ProtoError::BadSize("HPUB"));
                }
                if total > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let (subject, reply) = (span(f.subject), f.reply.map(span));
                let m = self.framer.message(
                    buf,
                    &line,
                    subject,
                    Span::default(),
                    reply,
                    Some(hdr as u32),
                    total,
                )?;
                return Ok(m.map(ClientOp::Pub));
            }
            Verb::Sub => {
                let (subject, queue, sid) =
                    args::sub_args(&buf[a..b]).ok_or(ProtoError::BadArgs("SUB"))?;
                let (subject, queue, sid) = (span(subject), queue.map(span), span(sid));
                let frame = buf.split_to(line.nl + 1).freeze();
                return Ok(Some(ClientOp::Sub {
                    subject: frame.slice(subject.range()),
                    queue: queue.map(|q| frame.slice(q.range())),
                    sid: frame.slice(sid.range()),
                    raw: frame,
                }));
            }
            Verb::Unsub => {
                let (sid, max) =
                    args::unsub_args(&buf[a..b]).ok_or(ProtoError::BadArgs("UNSUB"))?;
                // A bad max is 0: nats-server reads it as -1, and both mean now.
                let max = max.map(|m| args::size(m).unwrap_or(0) as u64);
                let sid = span(sid);
                let frame = buf.split_to(line.nl + 1).freeze();
                return Ok(Some(ClientOp::Unsub {
                    sid: frame.slice(sid.range()),
                    max,
                    raw: frame,
                }));
            }
            Verb::Msg | Verb::HMsg => return Err(ProtoError::UnknownOp),
        };
        buf.advance(line.nl + 1);
        Ok(Some(op))
    }
}
