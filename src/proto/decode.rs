//! Resumable, bounded decoders for both directions.
//!
//! Framing follows nats-server's byte parser (`server/parser.go`):
//! - op names are matched case-insensitively as the bytes arrive, so garbage is rejected
//!   at its first byte, not when a newline finally shows up;
//! - a control line ends at `\n`; a `\r` anywhere in the arguments means one byte before the
//!   `\n` is dropped (so both `\r\n` and a bare `\n` end a line);
//! - the argument bytes (after the op name and separator) may not exceed the control-line
//!   limit, checked on every partial read and when the line completes;
//! - PUB/HPUB/MSG/HMSG are followed by exactly `size` bytes and `\r\n`.
//!
//! The newline search resumes where the previous call stopped (`scanned`), so a slow sender
//! never causes a rescan. A frame is split off the read buffer with `split_to().freeze()`:
//! the payload is never copied.

use bytes::{Buf, BytesMut};

use super::error::ProtoError;
use super::op::{ClientOp, Message, ServerOp, Span};
use super::Limits;

/// Ops, as recognised by their name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Pub,
    HPub,
    Sub,
    Unsub,
    Msg,
    HMsg,
    Ping,
    Pong,
    Ok,
    Err,
    Connect,
    Info,
}

/// What may follow the op name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sep {
    /// At least one space or tab (PUB, SUB, ...); anything else is an unknown op.
    Required,
    /// Spaces and tabs are skipped but not required (CONNECT, INFO).
    Optional,
    /// Everything up to the newline is ignored (PING, PONG, +OK).
    Ignored,
}

type VerbTable = [(&'static [u8], Verb, Sep)];

const CLIENT_VERBS: &VerbTable = &[
    (b"PUB", Verb::Pub, Sep::Required),
    (b"PING", Verb::Ping, Sep::Ignored),
    (b"PONG", Verb::Pong, Sep::Ignored),
    (b"HPUB", Verb::HPub, Sep::Required),
    (b"SUB", Verb::Sub, Sep::Required),
    (b"UNSUB", Verb::Unsub, Sep::Required),
    (b"CONNECT", Verb::Connect, Sep::Optional),
    (b"INFO", Verb::Info, Sep::Optional),
    (b"+OK", Verb::Ok, Sep::Ignored),
    (b"-ERR", Verb::Err, Sep::Required),
];

const SERVER_VERBS: &VerbTable = &[
    (b"MSG", Verb::Msg, Sep::Required),
    (b"HMSG", Verb::HMsg, Sep::Required),
    (b"PING", Verb::Ping, Sep::Ignored),
    (b"PONG", Verb::Pong, Sep::Ignored),
    (b"INFO", Verb::Info, Sep::Optional),
    (b"+OK", Verb::Ok, Sep::Ignored),
    (b"-ERR", Verb::Err, Sep::Required),
];

enum VerbMatch {
    NeedMore,
    Unknown,
    /// `name_end`: index just after the op name (and, for `Required`, its first separator).
    Found(Verb, usize),
}

/// The direction's hot op in its canonical spelling (`MSG ` from servers, `PUB ` from
/// clients): matched with one 4-byte compare before the table walk.
type Hot = (&'static [u8; 4], Verb);

fn match_verb(buf: &[u8], table: &VerbTable, hot: Hot) -> VerbMatch {
    if buf.get(..4) == Some(&hot.0[..]) {
        return VerbMatch::Found(hot.1, 4);
    }
    let mut partial = false;
    for &(name, verb, sep) in table {
        let n = name.len().min(buf.len());
        if !buf[..n].eq_ignore_ascii_case(&name[..n]) {
            continue;
        }
        if buf.len() < name.len() {
            partial = true;
            continue;
        }
        return match sep {
            Sep::Required => match buf.get(name.len()) {
                None => VerbMatch::NeedMore,
                Some(b' ' | b'\t') => VerbMatch::Found(verb, name.len() + 1),
                Some(_) => VerbMatch::Unknown,
            },
            Sep::Optional | Sep::Ignored => VerbMatch::Found(verb, name.len()),
        };
    }
    if partial {
        VerbMatch::NeedMore
    } else {
        VerbMatch::Unknown
    }
}

fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

/// Byte classes as lookup tables: one load a byte in the field-splitting loops, which are
/// most of the decoder's work on small messages.
type Class = [bool; 256];

const fn class(members: &[u8]) -> Class {
    let mut t = [false; 256];
    let mut i = 0;
    while i < members.len() {
        t[members[i] as usize] = true;
        i += 1;
    }
    t
}

/// Separators of PUB/HPUB arguments (nats-server splits those on blanks only).
static BLANK: Class = class(b" \t");
/// Separators of SUB/UNSUB/MSG/HMSG arguments.
static ARG_SEP: Class = class(b" \t\r\n");

/// Splits `buf[range]` into at most `N` fields; more fields is an error.
/// Spans are absolute offsets into `buf`.
#[inline(always)]
fn split_args<const N: usize>(
    buf: &[u8],
    start: usize,
    end: usize,
    sep: &Class,
) -> Option<([Span; N], usize)> {
    let mut out = [Span::default(); N];
    let mut n = 0;
    let args = &buf[..end];
    let mut i = start;
    while i < end {
        while i < end && sep[usize::from(args[i])] {
            i += 1;
        }
        if i == end {
            break;
        }
        let s = i;
        while i < end && !sep[usize::from(args[i])] {
            i += 1;
        }
        if n == N {
            return None;
        }
        out[n] = Span::new(s..i);
        n += 1;
    }
    Some((out, n))
}

/// nats-server's `parseSize`: 1 to 9 decimal digits, nothing else.
pub(crate) fn parse_size(d: &[u8]) -> Option<usize> {
    if d.is_empty() || d.len() > 9 {
        return None;
    }
    d.iter().try_fold(0usize, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + usize::from(c - b'0'))
    })
}

/// A message whose control line was parsed but whose payload has not fully arrived.
#[derive(Clone, Copy)]
struct PendingMsg {
    frame_len: usize,
    subject: Span,
    sid: Span,
    reply: Option<Span>,
    body: usize,
    hdr_len: Option<u32>,
}

impl PendingMsg {
    fn try_complete(&self, buf: &mut BytesMut) -> Result<Option<Message>, ProtoError> {
        if buf.len() < self.frame_len {
            return Ok(None);
        }
        if &buf[self.frame_len - 2..self.frame_len] != b"\r\n" {
            return Err(ProtoError::UnknownOp);
        }
        let raw = buf.split_to(self.frame_len).freeze();
        Ok(Some(Message {
            raw,
            subject: self.subject,
            sid: self.sid,
            reply: self.reply,
            body: self.body as u32,
            hdr_len: self.hdr_len,
        }))
    }
}

/// Framing state shared by both directions.
#[derive(Default)]
struct Framer {
    /// Bytes of the current line already searched for `\n`.
    scanned: usize,
    /// A `\r` was seen in the already-scanned part of the current line.
    cr_seen: bool,
    pending: Option<PendingMsg>,
}

/// A complete control line: `verb`, arguments in `buf[arg_start..arg_end]`, line ends at
/// `buf[nl]` (the `\n`).
struct Line {
    verb: Verb,
    arg_start: usize,
    arg_end: usize,
    nl: usize,
}

enum Step {
    Line(Line),
    Msg(Message),
}

impl Framer {
    fn next(
        &mut self,
        buf: &mut BytesMut,
        table: &VerbTable,
        hot: Hot,
        max_line: usize,
    ) -> Result<Option<Step>, ProtoError> {
        if let Some(p) = self.pending {
            return match p.try_complete(buf)? {
                Some(m) => {
                    self.pending = None;
                    Ok(Some(Step::Msg(m)))
                }
                None => Ok(None),
            };
        }
        if buf.is_empty() {
            return Ok(None);
        }
        let (verb, name_end) = match match_verb(buf, table, hot) {
            VerbMatch::NeedMore => return Ok(None),
            VerbMatch::Unknown => return Err(ProtoError::UnknownOp),
            VerbMatch::Found(v, e) => (v, e),
        };
        let from = self.scanned.max(name_end);
        let ignored = matches!(verb, Verb::Ping | Verb::Pong | Verb::Ok);
        let Some(off) = memchr::memchr(b'\n', &buf[from..]) else {
            if ignored {
                // The server ignores everything after PING/PONG/+OK up to the newline:
                // drop it instead of buffering it.
                buf.truncate(name_end);
                self.scanned = name_end;
                return Ok(None);
            }
            self.cr_seen |= memchr::memchr(b'\r', &buf[from..]).is_some();
            self.scanned = buf.len();
            let arg_start = skip_blanks(buf, name_end, buf.len());
            let arg_len = (buf.len() - arg_start).saturating_sub(usize::from(self.cr_seen));
            if arg_len > max_line {
                return Err(ProtoError::ControlLineTooLong);
            }
            return Ok(None);
        };
        let nl = from + off;
        // The usual `\r\n` settles it without a scan.
        let has_cr = (nl > from && buf[nl - 1] == b'\r')
            || self.cr_seen
            || memchr::memchr(b'\r', &buf[from..nl]).is_some();
        self.scanned = 0;
        self.cr_seen = false;
        let arg_start = skip_blanks(buf, name_end, nl);
        let arg_end = if has_cr { (nl - 1).max(arg_start) } else { nl };
        if !ignored && arg_end - arg_start > max_line {
            return Err(ProtoError::ControlLineTooLong);
        }
        Ok(Some(Step::Line(Line {
            verb,
            arg_start,
            arg_end,
            nl,
        })))
    }

    /// Parses the message control line and either completes the frame or parks it.
    #[allow(clippy::too_many_arguments)]
    fn message(
        &mut self,
        buf: &mut BytesMut,
        line: &Line,
        subject: Span,
        sid: Span,
        reply: Option<Span>,
        hdr_len: Option<u32>,
        total: usize,
    ) -> Result<Option<Message>, ProtoError> {
        let body = line.nl + 1;
        let p = PendingMsg {
            frame_len: body + total + 2,
            subject,
            sid,
            reply,
            body,
            hdr_len,
        };
        match p.try_complete(buf)? {
            Some(m) => Ok(Some(m)),
            None => {
                buf.reserve(p.frame_len - buf.len());
                self.pending = Some(p);
                Ok(None)
            }
        }
    }
}

/// End of `buf[start..end]` without trailing spaces and tabs (INFO ends with ` \r\n`).
fn trim_end_blanks(buf: &[u8], start: usize, mut end: usize) -> usize {
    while end > start && is_blank(buf[end - 1]) {
        end -= 1;
    }
    end
}

fn skip_blanks(buf: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && is_blank(buf[i]) {
        i += 1;
    }
    i
}

/// Decodes what a client sends, as nats-server's client parser does.
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
        let (a, b) = (line.arg_start, line.arg_end);
        let op = match line.verb {
            Verb::Ping => ClientOp::Ping,
            Verb::Pong => ClientOp::Pong,
            Verb::Ok => ClientOp::Ok,
            Verb::Connect | Verb::Info | Verb::Err => {
                let frame = buf.split_to(line.nl + 1).freeze();
                let arg = frame.slice(a..trim_end_blanks(&frame, a, b));
                return Ok(Some(match line.verb {
                    Verb::Connect => ClientOp::Connect(arg),
                    Verb::Info => ClientOp::Info(arg),
                    _ => ClientOp::Err(arg),
                }));
            }
            Verb::Pub => {
                let (f, n) =
                    split_args::<3>(buf, a, b, &BLANK).ok_or(ProtoError::BadArgs("PUB"))?;
                let (reply, size) = match n {
                    2 => (None, f[1]),
                    3 => (Some(f[1]), f[2]),
                    _ => return Err(ProtoError::BadArgs("PUB")),
                };
                let size = parse_size(&buf[size.range()]).ok_or(ProtoError::BadSize("PUB"))?;
                if size > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let m =
                    self.framer
                        .message(buf, &line, f[0], Span::default(), reply, None, size)?;
                return Ok(m.map(ClientOp::Pub));
            }
            Verb::HPub => {
                if !self.headers {
                    return Err(ProtoError::HeadersNotSupported);
                }
                let (f, n) =
                    split_args::<4>(buf, a, b, &BLANK).ok_or(ProtoError::BadArgs("HPUB"))?;
                let (reply, hdr, total) = match n {
                    3 => (None, f[1], f[2]),
                    4 => (Some(f[1]), f[2], f[3]),
                    _ => return Err(ProtoError::BadArgs("HPUB")),
                };
                let hdr = parse_size(&buf[hdr.range()]).ok_or(ProtoError::BadSize("HPUB"))?;
                let total = parse_size(&buf[total.range()]).ok_or(ProtoError::BadSize("HPUB"))?;
                if hdr > total {
                    return Err(ProtoError::BadSize("HPUB"));
                }
                if total > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let m = self.framer.message(
                    buf,
                    &line,
                    f[0],
                    Span::default(),
                    reply,
                    Some(hdr as u32),
                    total,
                )?;
                return Ok(m.map(ClientOp::Pub));
            }
            Verb::Sub => {
                let (f, n) =
                    split_args::<3>(buf, a, b, &ARG_SEP).ok_or(ProtoError::BadArgs("SUB"))?;
                let frame = buf.split_to(line.nl + 1).freeze();
                return Ok(Some(match n {
                    2 => ClientOp::Sub {
                        subject: frame.slice(f[0].range()),
                        queue: None,
                        sid: frame.slice(f[1].range()),
                        raw: frame,
                    },
                    3 => ClientOp::Sub {
                        subject: frame.slice(f[0].range()),
                        queue: Some(frame.slice(f[1].range())),
                        sid: frame.slice(f[2].range()),
                        raw: frame,
                    },
                    _ => return Err(ProtoError::BadArgs("SUB")),
                }));
            }
            Verb::Unsub => {
                let (f, n) =
                    split_args::<2>(buf, a, b, &ARG_SEP).ok_or(ProtoError::BadArgs("UNSUB"))?;
                let frame = buf.split_to(line.nl + 1).freeze();
                return Ok(Some(match n {
                    1 => ClientOp::Unsub {
                        sid: frame.slice(f[0].range()),
                        max: None,
                        raw: frame,
                    },
                    2 => ClientOp::Unsub {
                        sid: frame.slice(f[0].range()),
                        max: Some(parse_size(&frame[f[1].range()]).unwrap_or(0) as u64),
                        raw: frame,
                    },
                    _ => return Err(ProtoError::BadArgs("UNSUB")),
                }));
            }
            Verb::Msg | Verb::HMsg => return Err(ProtoError::UnknownOp),
        };
        buf.advance(line.nl + 1);
        Ok(Some(op))
    }
}

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
        let op = match line.verb {
            Verb::Ping => ServerOp::Ping,
            Verb::Pong => ServerOp::Pong,
            Verb::Ok => ServerOp::Ok,
            Verb::Info | Verb::Err => {
                let frame = buf.split_to(line.nl + 1).freeze();
                let arg = frame.slice(a..trim_end_blanks(&frame, a, b));
                return Ok(Some(if line.verb == Verb::Info {
                    ServerOp::Info(arg)
                } else {
                    ServerOp::Err(arg)
                }));
            }
            Verb::Msg => {
                let (f, n) =
                    split_args::<4>(buf, a, b, &ARG_SEP).ok_or(ProtoError::BadArgs("MSG"))?;
                let (reply, size) = match n {
                    3 => (None, f[2]),
                    4 => (Some(f[2]), f[3]),
                    _ => return Err(ProtoError::BadArgs("MSG")),
                };
                let size = parse_size(&buf[size.range()]).ok_or(ProtoError::BadSize("MSG"))?;
                if size > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let m = self
                    .framer
                    .message(buf, &line, f[0], f[1], reply, None, size)?;
                return Ok(m.map(ServerOp::Msg));
            }
            Verb::HMsg => {
                let (f, n) =
                    split_args::<5>(buf, a, b, &ARG_SEP).ok_or(ProtoError::BadArgs("HMSG"))?;
                let (reply, hdr, total) = match n {
                    4 => (None, f[2], f[3]),
                    5 => (Some(f[2]), f[3], f[4]),
                    _ => return Err(ProtoError::BadArgs("HMSG")),
                };
                let hdr = parse_size(&buf[hdr.range()]).ok_or(ProtoError::BadSize("HMSG"))?;
                let total = parse_size(&buf[total.range()]).ok_or(ProtoError::BadSize("HMSG"))?;
                if hdr > total {
                    return Err(ProtoError::BadSize("HMSG"));
                }
                if total > self.limits.max_payload {
                    return Err(ProtoError::PayloadTooLarge);
                }
                let m =
                    self.framer
                        .message(buf, &line, f[0], f[1], reply, Some(hdr as u32), total)?;
                return Ok(m.map(ServerOp::Msg));
            }
            _ => return Err(ProtoError::UnknownOp),
        };
        buf.advance(line.nl + 1);
        Ok(Some(op))
    }
}
