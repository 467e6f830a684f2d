//! Encoding of the ops the proxy writes itself. Toward clients lines are server-style:
//! single spaces, numeric fields in decimal (async-nats splits MSG on single spaces).
//! Ops that pass through unmodified are never re-encoded: their `raw` bytes are forwarded.

use bytes::{BufMut, Bytes, BytesMut};

use super::op::{ClientOp, Message, ServerOp};

pub const PING: &[u8] = b"PING\r\n";
pub const PONG: &[u8] = b"PONG\r\n";
pub const OK: &[u8] = b"+OK\r\n";

fn put_usize(b: &mut BytesMut, mut n: usize) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    b.put_slice(&tmp[i..]);
}

/// `-ERR '<text>'\r\n`
pub fn err(text: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(text.len() + 9);
    b.put_slice(b"-ERR '");
    b.put_slice(text.as_bytes());
    b.put_slice(b"'\r\n");
    b.freeze()
}

/// `INFO <json> \r\n` (with the space nats-server puts before CRLF).
pub fn info(json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(json.len() + 8);
    b.put_slice(b"INFO ");
    b.put_slice(json);
    b.put_slice(b" \r\n");
    b.freeze()
}

/// `CONNECT <json>\r\n`
pub fn connect(json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(json.len() + 10);
    b.put_slice(b"CONNECT ");
    b.put_slice(json);
    b.put_slice(b"\r\n");
    b.freeze()
}

/// `SUB <subject> [queue] <sid>\r\n`
pub fn sub(subject: &[u8], queue: Option<&[u8]>, sid: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(subject.len() + sid.len() + 32);
    b.put_slice(b"SUB ");
    b.put_slice(subject);
    if let Some(q) = queue {
        b.put_u8(b' ');
        b.put_slice(q);
    }
    b.put_u8(b' ');
    b.put_slice(sid);
    b.put_slice(b"\r\n");
    b.freeze()
}

/// `UNSUB <sid> [max]\r\n`
pub fn unsub(sid: &[u8], max: Option<u64>) -> Bytes {
    let mut b = BytesMut::with_capacity(sid.len() + 32);
    b.put_slice(b"UNSUB ");
    b.put_slice(sid);
    if let Some(m) = max {
        b.put_u8(b' ');
        put_usize(&mut b, m as usize);
    }
    b.put_slice(b"\r\n");
    b.freeze()
}

fn message(
    verb: &[u8],
    subject: &[u8],
    sid: Option<&[u8]>,
    reply: Option<&[u8]>,
    headers: Option<&[u8]>,
    payload: &[u8],
) -> Bytes {
    let hl = headers.map_or(0, <[u8]>::len);
    let mut b = BytesMut::with_capacity(
        verb.len() + subject.len() + reply.map_or(0, <[u8]>::len) + 48 + hl + payload.len(),
    );
    b.put_slice(verb);
    b.put_u8(b' ');
    b.put_slice(subject);
    if let Some(s) = sid {
        b.put_u8(b' ');
        b.put_slice(s);
    }
    if let Some(r) = reply {
        b.put_u8(b' ');
        b.put_slice(r);
    }
    b.put_u8(b' ');
    if let Some(h) = headers {
        put_usize(&mut b, h.len());
        b.put_u8(b' ');
    }
    put_usize(&mut b, hl + payload.len());
    b.put_slice(b"\r\n");
    if let Some(h) = headers {
        b.put_slice(h);
    }
    b.put_slice(payload);
    b.put_slice(b"\r\n");
    b.freeze()
}

/// `PUB` or, with headers, `HPUB`.
pub fn publish(
    subject: &[u8],
    reply: Option<&[u8]>,
    headers: Option<&[u8]>,
    payload: &[u8],
) -> Bytes {
    let verb: &[u8] = if headers.is_some() { b"HPUB" } else { b"PUB" };
    message(verb, subject, None, reply, headers, payload)
}

/// `MSG` or, with headers, `HMSG`.
pub fn msg(
    subject: &[u8],
    sid: &[u8],
    reply: Option<&[u8]>,
    headers: Option<&[u8]>,
    payload: &[u8],
) -> Bytes {
    let verb: &[u8] = if headers.is_some() { b"HMSG" } else { b"MSG" };
    message(verb, subject, Some(sid), reply, headers, payload)
}

fn headers_of(m: &Message) -> Option<&[u8]> {
    m.has_headers().then(|| m.headers())
}

/// Encodes any client op (used for replay, tests and fuzzing).
pub fn client_op(op: &ClientOp) -> Bytes {
    match op {
        ClientOp::Connect(j) => connect(j),
        ClientOp::Pub(m) => publish(m.subject(), m.reply(), headers_of(m), m.payload()),
        ClientOp::Sub {
            subject,
            queue,
            sid,
            ..
        } => sub(subject, queue.as_deref(), sid),
        ClientOp::Unsub { sid, max, .. } => unsub(sid, *max),
        ClientOp::Ping => Bytes::from_static(PING),
        ClientOp::Pong => Bytes::from_static(PONG),
        ClientOp::Ok => Bytes::from_static(OK),
        ClientOp::Err(t) => [b"-ERR ", &t[..], b"\r\n"].concat().into(),
        ClientOp::Info(j) => info(j),
    }
}

/// Encodes any server op.
pub fn server_op(op: &ServerOp) -> Bytes {
    match op {
        ServerOp::Info(j) => info(j),
        ServerOp::Msg(m) => msg(m.subject(), m.sid(), m.reply(), headers_of(m), m.payload()),
        ServerOp::Ping => Bytes::from_static(PING),
        ServerOp::Pong => Bytes::from_static(PONG),
        ServerOp::Ok => Bytes::from_static(OK),
        ServerOp::Err(t) => [b"-ERR ", &t[..], b"\r\n"].concat().into(),
    }
}
