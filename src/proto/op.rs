//! Decoded protocol operations for both directions.
//!
//! Messages keep the original frame (`raw`) and refer to their fields by offsets into it,
//! so an op that passes through unmodified is forwarded from its original bytes and
//! decoding a message costs no allocation and no reference-count traffic per field.

use bytes::Bytes;
use std::ops::Range;

/// A byte range inside a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    start: u32,
    end: u32,
}

impl Span {
    pub(crate) fn new(r: Range<usize>) -> Self {
        // Frames are bounded far below 4 GiB (payload limits are at most 64 MiB).
        Span {
            start: r.start as u32,
            end: r.end as u32,
        }
    }
    /// The range this span covers in its frame.
    pub fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
    /// Length in bytes.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }
    /// True for an empty span.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

/// A message frame: client `PUB`/`HPUB` or server `MSG`/`HMSG`.
///
/// ```text
/// PUB  <subject> [reply] <size>\r\n<payload>\r\n
/// HPUB <subject> [reply] <hdr_len> <total_len>\r\n<headers><payload>\r\n
/// MSG  <subject> <sid> [reply] <size>\r\n<payload>\r\n
/// HMSG <subject> <sid> [reply] <hdr_len> <total_len>\r\n<headers><payload>\r\n
/// ```
#[derive(Clone)]
pub struct Message {
    /// The whole frame as received, control line through the trailing CRLF.
    pub raw: Bytes,
    pub(crate) subject: Span,
    /// Empty for PUB/HPUB.
    pub(crate) sid: Span,
    pub(crate) reply: Option<Span>,
    /// Offset in `raw` where headers (if any) and payload start.
    pub(crate) body: u32,
    /// Header length; `None` for PUB/MSG.
    pub(crate) hdr_len: Option<u32>,
}

impl Message {
    /// Subject bytes.
    pub fn subject(&self) -> &[u8] {
        &self.raw[self.subject.range()]
    }
    /// Subscription id (server direction only; empty for PUB/HPUB).
    pub fn sid(&self) -> &[u8] {
        &self.raw[self.sid.range()]
    }
    /// Reply subject, if any.
    pub fn reply(&self) -> Option<&[u8]> {
        self.reply.map(|r| &self.raw[r.range()])
    }
    /// True for HPUB/HMSG.
    pub fn has_headers(&self) -> bool {
        self.hdr_len.is_some()
    }
    fn body_end(&self) -> usize {
        self.raw.len() - 2
    }
    /// The header block (empty when the frame has none).
    pub fn headers(&self) -> &[u8] {
        let b = self.body as usize;
        let h = self.hdr_len.unwrap_or(0) as usize;
        &self.raw[b..b + h]
    }
    /// The payload after the headers.
    pub fn payload(&self) -> &[u8] {
        let b = self.body as usize + self.hdr_len.unwrap_or(0) as usize;
        &self.raw[b..self.body_end()]
    }
    /// The payload as a shared slice of the frame (no copy).
    pub fn payload_bytes(&self) -> Bytes {
        let b = self.body as usize + self.hdr_len.unwrap_or(0) as usize;
        self.raw.slice(b..self.body_end())
    }
    /// Header + payload length (the `total_len`/`size` field).
    pub fn total_len(&self) -> usize {
        self.body_end() - self.body as usize
    }
    /// The status code of a header-only status message (`NATS/1.0 503`), if this is one.
    pub fn status(&self) -> Option<u16> {
        let h = self.headers();
        let rest = h.strip_prefix(b"NATS/1.0 ")?;
        if rest.len() < 3 || !rest[..3].iter().all(u8::is_ascii_digit) {
            return None;
        }
        if rest.len() > 3 && !matches!(rest[3], b' ' | b'\r') {
            return None;
        }
        Some(
            rest[..3]
                .iter()
                .fold(0u16, |a, d| a * 10 + u16::from(d - b'0')),
        )
    }
    /// The description after the status code (`Leadership Change`), if any.
    pub fn status_description(&self) -> &[u8] {
        let h = self.headers();
        let line_end = memchr::memchr(b'\r', h).unwrap_or(h.len());
        let line = &h[..line_end];
        line.get(13..).unwrap_or(&[])
    }
    /// Value of the first header named `name` (case-insensitive), if present.
    pub fn header(&self, name: &[u8]) -> Option<&[u8]> {
        let h = self.headers();
        let mut lines = h.split(|&c| c == b'\n').skip(1);
        lines.find_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = memchr::memchr(b':', line)?;
            if line[..colon].eq_ignore_ascii_case(name) {
                Some(line[colon + 1..].trim_ascii())
            } else {
                None
            }
        })
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("subject", &String::from_utf8_lossy(self.subject()))
            .field("sid", &String::from_utf8_lossy(self.sid()))
            .field("reply", &self.reply().map(String::from_utf8_lossy))
            .field("headers", &String::from_utf8_lossy(self.headers()))
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

/// Semantic equality: same fields, whatever the spacing of the original control line.
impl PartialEq for Message {
    fn eq(&self, o: &Self) -> bool {
        self.subject() == o.subject()
            && self.sid() == o.sid()
            && self.reply() == o.reply()
            && self.has_headers() == o.has_headers()
            && self.headers() == o.headers()
            && self.payload() == o.payload()
    }
}

/// Operations a client sends (what nats-server's client parser accepts).
#[derive(Debug, Clone, PartialEq)]
pub enum ClientOp {
    /// `CONNECT <json>`: the JSON text.
    Connect(Bytes),
    /// `PUB` or `HPUB`.
    Pub(Message),
    /// `SUB <subject> [queue] <sid>`.
    Sub {
        raw: Bytes,
        subject: Bytes,
        queue: Option<Bytes>,
        sid: Bytes,
    },
    /// `UNSUB <sid> [max]`; an unparsable max is `Some(0)` (unsubscribe now), as the server does.
    Unsub {
        raw: Bytes,
        sid: Bytes,
        max: Option<u64>,
    },
    Ping,
    Pong,
    /// `+OK` (ignored by servers).
    Ok,
    /// `-ERR <text>` from a client: the server closes the connection.
    Err(Bytes),
    /// `INFO <json>` from a client: parsed and ignored.
    Info(Bytes),
}

/// Operations a server sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerOp {
    /// `INFO <json>`: the JSON text.
    Info(Bytes),
    /// `MSG` or `HMSG`.
    Msg(Message),
    Ping,
    Pong,
    Ok,
    /// `-ERR <text>`: the text after `-ERR `, quotes included.
    Err(Bytes),
}
