//! Decodes what a server sends: the relay's fast path ([`ServerDecoder::peek_msg`], a
//! hand-tuned reader of well-formed `MSG` frames) and the general decoder (the framer,
//! then [`args`]'s grammar).

use bytes::{Buf, BytesMut};

use super::args;
use super::error::ProtoError;
use super::fast::{parse_size, split_args, ARG_SEP};
use super::framer::{skip_blanks, Framer, Step, Verb, SERVER_VERBS};
use super::op::{Message, ServerOp, Span};
use super::Limits;

/// A complete `MSG` frame (no headers) seen in place by [`ServerDecoder::peek_msg`]:
/// offsets from the start of the buffer it was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgView {
    /// Bytes of the whole frame, control line to the payload's `\r\n`.
    pub frame_len: usize,
    pub subject: Span,
    pub sid: Span,
    pub reply: Option<Span>,
    /// Where the payload starts.
    pub body: usize,
}

impl MsgView {
    /// Payload bytes.
    pub fn size(&self) -> usize {
        self.frame_len - 2 - self.body
    }

    /// Whether `m`, decoded from the same bytes `buf` this view was peeked in, is the same
    /// message: what the tests and fuzz targets assert of the fast path.
    pub fn agrees_with(&self, buf: &[u8], m: &Message) -> bool {
        let f = &buf[..self.frame_len];
        m.raw[..] == *f
            && !m.has_headers()
            && m.subject() == &f[self.subject.range()]
            && m.sid() == &f[self.sid.range()]
            && m.reply() == self.reply.map(|r| &f[r.range()])
            && m.payload() == &f[self.body..self.frame_len - 2]
    }
}

/// Decodes what a server sends.
pub struct ServerDecoder {
    framer: Framer,
    limits: Limits,
}

impl ServerDecoder {
    /// A decoder with the given limits (use [`Limits::upstream`]).
    pub fn new(limits: Limits) -> Self {
        ServerDecoder {
            framer: Framer::default(),
            limits,
        }
    }

    /// The relay's fast path: a complete, well-formed `MSG` frame (no headers) at the
    /// start of `buf`, described without consuming or copying anything, so that runs of
    /// such frames can be forwarded as one slice.
    ///
    /// `None` whenever anything is unusual: the decoder is inside a frame, the op is not
    /// `MSG ` in its canonical spelling, the line does not end in `\r\n`, the frame is
    /// incomplete, or [`decode`](Self::decode) would fail. Then `decode` handles it, so a
    /// `Some` always agrees with what `decode` would return for the same bytes (a property
    /// the tests and the fuzz targets check).
    #[inline]
    pub fn peek_msg(&self, buf: &[u8]) -> Option<MsgView> {
        if self.framer.pending.is_some() || self.framer.scanned != 0 || !buf.starts_with(b"MSG ") {
            return None;
        }
        // The argument bytes may not exceed the limit: look no further than that.
        let window = &buf[..buf.len().min(4 + self.limits.max_control_line + 2)];
        let nl = 4 + memchr::memchr(b'\n', &window[4..])?;
        if buf[nl - 1] != b'\r' {
            return None;
        }
        let (f, n) = split_args::<4>(buf, 4, nl - 1, &ARG_SEP)?;
        let args = skip_blanks(buf, 4, nl - 1);
        if nl - 1 - args > self.limits.max_control_line {
            return None;
        }
        let (reply, size) = match n {
            3 => (None, f[2]),
            4 => (Some(f[2]), f[3]),
            _ => return None,
        };
        let size = parse_size(&buf[size.range()])?;
        if size > self.limits.max_payload {
            return None;
        }
        let frame_len = nl + 1 + size + 2;
        if buf.len() < frame_len || &buf[frame_len - 2..frame_len] != b"\r\n" {
            return None;
        }
        Some(MsgView {
            frame_len,
            subject: f[0],
            sid: f[1],
            reply,
            body: nl + 1,
        })
    }

    /// Decodes the next op from `buf`, consuming its bytes. `Ok(None)`: need more bytes.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<ServerOp>, ProtoError> {
        let line = match self.framer.next(
            buf,
            SERVER_VERBS,
            (b"MSG ", Verb::Msg),
            self.limits.max_control_line,
        )? {
            None => return Ok(None),
            Some(Step::Msg(m)) => return Ok(Some(ServerOp::Msg(m))),
            Some(Step::Line(l)) => l,
        };
        let (a, b) = (line.arg_start, line.arg_end);
        let span = |f: &[u8]| args::span(buf, f);
        let op = match line.verb {
            Verb::Ping => ServerOp::Ping,
            Verb::Pong => ServerOp::Pong,
            Verb::Ok => ServerOp::Ok,
            Verb::Info | Verb::Err => {
                let text = span(args::text(&buf[a..b]));
                let arg = buf.split_to(line.nl + 1).freeze().slice(text.range());
                return Ok(Some(if line.verb == Verb::Info {
                    ServerOp::Info(arg)
                } else {
                    ServerOp::Err(arg)
                }));
            }
            Verb::Msg => {
                let (sid, f) = args::msg_args(&buf[a..b]).ok_or(ProtoError::BadArgs("MSG"))?;
                let size = args::size(f.size).ok_or(ProtoError::BadSize("MSG"))?;
                if size > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let (subject, sid, reply) = (span(f.subject), span(sid), f.reply.map(span));
                let m = self
                    .framer
                    .message(buf, &line, subject, sid, reply, None, size)?;
                return Ok(m.map(ServerOp::Msg));
            }
            Verb::HMsg => {
                let (sid, f) = args::hmsg_args(&buf[a..b]).ok_or(ProtoError::BadArgs("HMSG"))?;
                let hdr = args::size(f.hdr).ok_or(ProtoError::BadSize("HMSG"))?;
                let total = args::size(f.total).ok_or(ProtoError::BadSize("HMSG"))?;
                if hdr > total {
                    return Err(ProtoError::BadSize("HMSG"));
                }
                if total > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let (subject, sid, reply) = (span(f.subject), span(sid), f.reply.map(span));
                let m = self.framer.message(
                    buf,
                    &line,
                    subject,
                    sid,
                    reply,
                    Some(hdr as u32),
                    total,
                )?;
                return Ok(m.map(ServerOp::Msg));
            }
            _ => return Err(ProtoError::UnknownOp),
        };
        buf.advance(line.nl + 1);
        Ok(Some(op))
    }
}
