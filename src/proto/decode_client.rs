//! Decodes what a client sends, as nats-server's client parser does: the framer finds the
//! op and its line, [`args`] reads the arguments (PUB's by hand, in [`super::fast`]),
//! and this puts the op together.

use bytes::{Buf, BytesMut};

use super::args;
use super::error::ProtoError;
use super::fast;
use super::framer::{Framer, Line, Step, Verb, CLIENT_VERBS};
use super::op::{ClientOp, Span};
use super::Limits;

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

    /// Decodes the next op from `buf`, consuming its bytes. `Ok(None)`: need more bytes.
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
        let op = match line.verb {
            Verb::Ping => ClientOp::Ping,
            Verb::Pong => ClientOp::Pong,
            Verb::Ok => ClientOp::Ok,
            Verb::Connect | Verb::Info | Verb::Err => return Ok(Some(text_op(buf, &line))),
            Verb::Pub => return self.publish(buf, &line),
            Verb::HPub => return self.publish_with_headers(buf, &line),
            Verb::Sub => return sub(buf, &line).map(Some),
            Verb::Unsub => return unsub(buf, &line).map(Some),
            Verb::Msg | Verb::HMsg => return Err(ProtoError::UnknownOp),
        };
        buf.advance(line.nl + 1);
        Ok(Some(op))
    }

    /// `PUB <subject> [reply] <size>`: its arguments read by hand (the hot path), then
    /// the payload once it is all there.
    fn publish(&mut self, buf: &mut BytesMut, line: &Line) -> Result<Option<ClientOp>, ProtoError> {
        let (subject, reply, size) =
            fast::pub_args(buf, line.arg_start, line.arg_end).ok_or(ProtoError::BadArgs("PUB"))?;
        let size = fast::parse_size(&buf[size.range()]).ok_or(ProtoError::BadSize("PUB"))?;
        if size > self.limits.max_payload {
            return Err(ProtoError::PayloadTooLarge);
        }
        let m = self
            .framer
            .message(buf, line, subject, Span::default(), reply, None, size)?;
        Ok(m.map(ClientOp::Pub))
    }

    /// `HPUB <subject> [reply] <header size> <total size>`, refused unless the client's
    /// CONNECT enabled headers.
    fn publish_with_headers(
        &mut self,
        buf: &mut BytesMut,
        line: &Line,
    ) -> Result<Option<ClientOp>, ProtoError> {
        if !self.headers {
            return Err(ProtoError::HeadersNotSupported);
        }
        let f = args::hpub_args(&buf[line.arg_start..line.arg_end])
            .ok_or(ProtoError::BadArgs("HPUB"))?;
        let hdr = args::size(f.hdr).ok_or(ProtoError::BadSize("HPUB"))?;
        let total = args::size(f.total).ok_or(ProtoError::BadSize("HPUB"))?;
        if hdr > total {
            return Err(ProtoError::BadSize("HPUB"));
        }
        if total > self.limits.max_payload {
            return Err(ProtoError::PayloadTooLarge);
        }
        let (subject, reply) = (
            args::span(buf, f.subject),
            f.reply.map(|r| args::span(buf, r)),
        );
        let m = self.framer.message(
            buf,
            line,
            subject,
            Span::default(),
            reply,
            Some(hdr as u32),
            total,
        )?;
        Ok(m.map(ClientOp::Pub))
    }
}

/// CONNECT, INFO or -ERR: the line's text, trimmed, without a copy.
fn text_op(buf: &mut BytesMut, line: &Line) -> ClientOp {
    let text = args::span(buf, args::text(&buf[line.arg_start..line.arg_end]));
    let arg = buf.split_to(line.nl + 1).freeze().slice(text.range());
    match line.verb {
        Verb::Connect => ClientOp::Connect(arg),
        Verb::Info => ClientOp::Info(arg),
        _ => ClientOp::Err(arg),
    }
}

/// `SUB <subject> [queue] <sid>`.
fn sub(buf: &mut BytesMut, line: &Line) -> Result<ClientOp, ProtoError> {
    let (subject, queue, sid) =
        args::sub_args(&buf[line.arg_start..line.arg_end]).ok_or(ProtoError::BadArgs("SUB"))?;
    let span = |f: &[u8]| args::span(buf, f);
    let (subject, queue, sid) = (span(subject), queue.map(span), span(sid));
    let frame = buf.split_to(line.nl + 1).freeze();
    Ok(ClientOp::Sub {
        subject: frame.slice(subject.range()),
        queue: queue.map(|q| frame.slice(q.range())),
        sid: frame.slice(sid.range()),
        raw: frame,
    })
}

/// `UNSUB <sid> [max]`.
fn unsub(buf: &mut BytesMut, line: &Line) -> Result<ClientOp, ProtoError> {
    let (sid, max) =
        args::unsub_args(&buf[line.arg_start..line.arg_end]).ok_or(ProtoError::BadArgs("UNSUB"))?;
    // A bad max is 0: nats-server reads it as -1, and both mean now.
    let max = max.map(|m| args::size(m).unwrap_or(0) as u64);
    let sid = args::span(buf, sid);
    let frame = buf.split_to(line.nl + 1).freeze();
    Ok(ClientOp::Unsub {
        sid: frame.slice(sid.range()),
        max,
        raw: frame,
    })
}
