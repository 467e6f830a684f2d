//! Framing, shared by both directions' decoders: which op a line is, where it ends, and
//! when a message's payload is complete.
//!
//! It follows nats-server's byte parser (`server/parser.go`):
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
//! the payload is never copied. What a complete line's arguments mean is
//! [`super::args`]'s grammar; the two decoders put the parts together.

use bytes::BytesMut;

use super::error::ProtoError;
use super::op::{Message, Span};

/// Ops, as recognised by their name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb {
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
pub(super) enum Sep {
    /// At least one space or tab (PUB, SUB, ...); anything else is an unknown op.
    Required,
    /// Spaces and tabs are skipped but not required (CONNECT, INFO).
    Optional,
    /// Everything up to the newline is ignored (PING, PONG, +OK).
    Ignored,
}

pub(super) type VerbTable = [(&'static [u8], Verb, Sep)];

pub(super) const CLIENT_VERBS: &VerbTable = &[
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
    // nats-server reads a client's HMSG line like a route's (so an over-long one is
    // 'maximum control line exceeded') and only then refuses it; MSG it refuses at `M`.
    (b"HMSG", Verb::HMsg, Sep::Required),
];

pub(super) const SERVER_VERBS: &VerbTable = &[
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
pub(super) type Hot = (&'static [u8; 4], Verb);

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

/// A message whose control line was parsed but whose payload has not fully arrived.
#[derive(Clone, Copy)]
pub(super) struct PendingMsg {
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
pub(super) struct Framer {
    /// Bytes of the current line already searched for `\n`.
    pub(super) scanned: usize,
    /// A `\r` was seen in the already-scanned part of the current line.
    cr_seen: bool,
    pub(super) pending: Option<PendingMsg>,
}

/// A complete control line: `verb`, arguments in `buf[arg_start..arg_end]`, line ends at
/// `buf[nl]` (the `\n`).
pub(super) struct Line {
    pub verb: Verb,
    pub arg_start: usize,
    pub arg_end: usize,
    pub nl: usize,
}

pub(super) enum Step {
    Line(Line),
    Msg(Message),
}

impl Framer {
    pub(super) fn next(
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
    pub(super) fn message(
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

pub(super) fn skip_blanks(buf: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && is_blank(buf[i]) {
        i += 1;
    }
    i
}
