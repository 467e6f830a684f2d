//! Encode/decode round trip on arbitrary ops, both directions: what the proxy writes
//! decodes to the same op, whole and split at fuzzer-chosen points.
#![no_main]

use arbitrary::Arbitrary;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use natsproxy::proto::{encode, ClientDecoder, ClientOp, Limits, ServerDecoder, ServerOp};

#[derive(Arbitrary, Debug)]
enum Op {
    Pub {
        subject: Vec<u8>,
        reply: Option<Vec<u8>>,
        headers: Option<Vec<u8>>,
        payload: Vec<u8>,
    },
    Sub {
        subject: Vec<u8>,
        queue: Option<Vec<u8>>,
        sid: Vec<u8>,
    },
    Unsub {
        sid: Vec<u8>,
        max: Option<u32>,
    },
    Msg {
        subject: Vec<u8>,
        sid: Vec<u8>,
        reply: Option<Vec<u8>>,
        headers: Option<Vec<u8>>,
        payload: Vec<u8>,
    },
    Connect {
        name: Vec<u8>,
    },
    Info {
        id: Vec<u8>,
    },
    Err {
        text: Vec<u8>,
    },
    Ping,
    Pong,
    Ok,
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
    split: u16,
}

/// A protocol token: no whitespace, never empty.
fn token(v: &[u8]) -> Vec<u8> {
    let t: Vec<u8> = v
        .iter()
        .map(|&b| {
            if matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
                b'x'
            } else {
                b
            }
        })
        .take(64)
        .collect();
    if t.is_empty() {
        b"x".to_vec()
    } else {
        t
    }
}

/// JSON-safe text.
fn text(v: &[u8]) -> Vec<u8> {
    v.iter()
        .filter(|b| b.is_ascii_alphanumeric())
        .copied()
        .take(64)
        .collect()
}

fn headers(h: &Option<Vec<u8>>) -> Option<Vec<u8>> {
    h.as_ref()
        .map(|v| [b"NATS/1.0\r\nK: ", &text(v)[..], b"\r\n\r\n"].concat())
}

fn same_message(a: &natsproxy::proto::Message, b: &natsproxy::proto::Message) -> bool {
    a.subject() == b.subject()
        && a.reply() == b.reply()
        && a.has_headers() == b.has_headers()
        && a.headers() == b.headers()
        && a.payload() == b.payload()
}

fn decode_all<T>(
    wire: &[u8],
    split: usize,
    mut dec: impl FnMut(&mut BytesMut) -> Result<Option<T>, natsproxy::proto::ProtoError>,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut buf = BytesMut::new();
    for chunk in [&wire[..split], &wire[split..]] {
        buf.extend_from_slice(chunk);
        while let Some(op) = dec(&mut buf).expect("what the proxy encodes decodes") {
            out.push(op);
        }
    }
    assert!(buf.is_empty(), "bytes left over");
    out
}

fuzz_target!(|i: Input| {
    let mut client_wire = Vec::new();
    let mut server_wire = Vec::new();
    let mut client_ops = Vec::new();
    let mut server_ops = Vec::new();
    for op in &i.ops {
        match op {
            Op::Pub {
                subject,
                reply,
                headers: h,
                payload,
            } => {
                let (s, r, h) = (token(subject), reply.as_deref().map(token), headers(h));
                client_wire.extend_from_slice(&encode::publish(
                    &s,
                    r.as_deref(),
                    h.as_deref(),
                    payload,
                ));
                client_ops.push(op);
            }
            Op::Sub {
                subject,
                queue,
                sid,
            } => {
                let q = queue.as_deref().map(token);
                client_wire.extend_from_slice(&encode::sub(
                    &token(subject),
                    q.as_deref(),
                    &token(sid),
                ));
                client_ops.push(op);
            }
            Op::Unsub { sid, max } => {
                // nats-server reads at most 9 digits; the proxy never writes more.
                client_wire.extend_from_slice(&encode::unsub(
                    &token(sid),
                    max.map(|m| u64::from(m) % 1_000_000_000),
                ));
                client_ops.push(op);
            }
            Op::Connect { name } => {
                let j = [b"{\"headers\":true,\"name\":\"", &text(name)[..], b"\"}"].concat();
                client_wire.extend_from_slice(&encode::connect(&j));
                client_ops.push(op);
            }
            Op::Msg {
                subject,
                sid,
                reply,
                headers: h,
                payload,
            } => {
                let r = reply.as_deref().map(token);
                let b = encode::msg(
                    &token(subject),
                    &token(sid),
                    r.as_deref(),
                    headers(h).as_deref(),
                    payload,
                );
                server_wire.extend_from_slice(&b);
                server_ops.push(op);
            }
            Op::Info { id } => {
                let j = [b"{\"server_id\":\"", &text(id)[..], b"\"}"].concat();
                server_wire.extend_from_slice(&encode::info(&j));
                server_ops.push(op);
            }
            Op::Err { text: t } => {
                server_wire.extend_from_slice(&[b"-ERR '", &text(t)[..], b"'\r\n"].concat());
                server_ops.push(op);
            }
            Op::Ping | Op::Pong | Op::Ok => {
                let b: &[u8] = match op {
                    Op::Ping => encode::PING,
                    Op::Pong => encode::PONG,
                    _ => encode::OK,
                };
                client_wire.extend_from_slice(b);
                server_wire.extend_from_slice(b);
                client_ops.push(op);
                server_ops.push(op);
            }
        }
    }
    let limits = Limits {
        max_control_line: 4096,
        max_payload: 1 << 20,
    };

    let mut cdec = ClientDecoder::new(limits);
    cdec.set_headers(true);
    let split = usize::from(i.split) % (client_wire.len() + 1);
    let got = decode_all(&client_wire, split, |b| cdec.decode(b));
    assert_eq!(got.len(), client_ops.len());
    for (want, got) in client_ops.iter().zip(&got) {
        let ok = match (want, got) {
            (
                Op::Pub {
                    subject,
                    reply,
                    headers: h,
                    payload,
                },
                ClientOp::Pub(m),
            ) => {
                m.subject() == token(subject).as_slice()
                    && m.reply() == reply.as_deref().map(token).as_deref()
                    && m.has_headers() == h.is_some()
                    && (h.is_none() || m.headers() == headers(h).unwrap().as_slice())
                    && m.payload() == payload.as_slice()
            }
            (
                Op::Sub {
                    subject,
                    queue,
                    sid,
                },
                ClientOp::Sub {
                    subject: s,
                    queue: q,
                    sid: i,
                    ..
                },
            ) => {
                s[..] == token(subject)[..]
                    && q.as_deref() == queue.as_deref().map(token).as_deref()
                    && i[..] == token(sid)[..]
            }
            (Op::Unsub { sid, max }, ClientOp::Unsub { sid: i, max: m, .. }) => {
                i[..] == token(sid)[..] && *m == max.map(|m| u64::from(m) % 1_000_000_000)
            }
            (Op::Connect { .. }, ClientOp::Connect(_)) => true,
            (Op::Ping, ClientOp::Ping) | (Op::Pong, ClientOp::Pong) | (Op::Ok, ClientOp::Ok) => {
                true
            }
            _ => false,
        };
        assert!(ok, "{want:?} decoded as {got:?}");
    }
    // Re-encoding a decoded client op gives the same op again.
    for op in &got {
        let again = encode::client_op(op);
        let mut d = ClientDecoder::new(limits);
        d.set_headers(true);
        let back = decode_all(&again, 0, |b| d.decode(b));
        assert_eq!(back.len(), 1);
        if let (ClientOp::Pub(a), ClientOp::Pub(b)) = (op, &back[0]) {
            assert!(same_message(a, b));
        }
    }

    let mut sdec = ServerDecoder::new(Limits::upstream());
    let split = usize::from(i.split) % (server_wire.len() + 1);
    let got = decode_all(&server_wire, split, |b| sdec.decode(b));
    assert_eq!(got.len(), server_ops.len());
    for (want, got) in server_ops.iter().zip(&got) {
        let ok = match (want, got) {
            (
                Op::Msg {
                    subject,
                    sid,
                    reply,
                    headers: h,
                    payload,
                },
                ServerOp::Msg(m),
            ) => {
                m.subject() == token(subject).as_slice()
                    && m.sid() == token(sid).as_slice()
                    && m.reply() == reply.as_deref().map(token).as_deref()
                    && (h.is_none() || m.headers() == headers(h).unwrap().as_slice())
                    && m.payload() == payload.as_slice()
            }
            (Op::Info { id }, ServerOp::Info(j)) => {
                j[..] == [b"{\"server_id\":\"", &text(id)[..], b"\"}"].concat()[..]
            }
            (Op::Err { text: t }, ServerOp::Err(e)) => {
                e[..] == [b"'", &text(t)[..], b"'"].concat()[..]
            }
            (Op::Ping, ServerOp::Ping) | (Op::Pong, ServerOp::Pong) | (Op::Ok, ServerOp::Ok) => {
                true
            }
            _ => false,
        };
        assert!(ok, "{want:?} decoded as {got:?}");
    }
});
