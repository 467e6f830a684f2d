//! Codec tests: fixtures decoded whole, byte by byte and at every split point give the
//! same ops; invalid inputs give nats-server's errors; decode(encode(op)) == op.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::op::{ClientOp, ServerOp};
use super::{encode, oracle, ClientDecoder, Limits, ProtoError, ServerDecoder};

fn client_dec() -> ClientDecoder {
    let mut d = ClientDecoder::new(Limits::default());
    d.set_headers(true);
    d
}

/// Decodes `chunks` as the client direction, headers on.
fn decode_client_chunks(chunks: &[&[u8]]) -> oracle::Decoded<ClientOp> {
    oracle::client_chunks(Limits::default(), true, chunks)
}

fn decode_server_chunks(chunks: &[&[u8]]) -> oracle::Decoded<ServerOp> {
    oracle::server_chunks(Limits::upstream(), chunks)
}

/// Whole, byte-by-byte and every two-way split must agree.
fn assert_chunking_invariant_client(input: &[u8]) -> oracle::Decoded<ClientOp> {
    oracle::same_every_cut(input, decode_client_chunks)
}

fn assert_chunking_invariant_server(input: &[u8]) -> oracle::Decoded<ServerOp> {
    oracle::same_every_cut(input, decode_server_chunks)
}

const CLIENT_FIXTURES: &[&[u8]] = &[
    b"CONNECT {\"verbose\":false}\r\n",
    b"CONNECT{\"verbose\":true}\r\n",
    b"connect\t {}\n",
    b"PUB foo 5\r\nhello\r\n",
    b"pub foo.bar reply.to 0\r\n\r\n",
    b"PUB\tfoo\t2\r\nok\r\n",
    b"PUB   foo    2  \r\nok\r\n",
    b"PUB foo 2\nok\r\n",
    b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"hpub foo bar 18 18\r\nNATS/1.0\r\nA: b\r\n\r\n\r\n",
    b"SUB foo 1\r\n",
    b"SUB\tfoo\t\tq1\t5\r\n",
    b"sub foo.* 0\r\nSUB > abc\r\n",
    b"UNSUB 1\r\nUNSUB 1 10\r\nunsub 2 x\r\n",
    b"PING\r\nPONG\r\nPINGXYZ\r\nping\nPiNg\r\n",
    b"+OK\r\n",
    b"-ERR 'oops'\r\n",
    b"INFO {}\r\n",
    b"PUB foo 5\r\nhello\r\nPUB bar 3\r\nabc\r\nPING\r\nSUB a 1\r\n",
];

#[test]
fn client_fixtures_decode_the_same_however_chunked() {
    for f in CLIENT_FIXTURES {
        let (ops, err) = assert_chunking_invariant_client(f);
        assert_eq!(err, None, "{:?}", String::from_utf8_lossy(f));
        assert!(!ops.is_empty(), "{:?}", String::from_utf8_lossy(f));
    }
}

#[test]
fn client_fixture_fields() {
    let (ops, _) = decode_client_chunks(&[b"PUB   foo  rep  5 \r\nhello\r\n"]);
    let ClientOp::Pub(m) = &ops[0] else { panic!() };
    assert_eq!(m.subject(), b"foo");
    assert_eq!(m.reply(), Some(&b"rep"[..]));
    assert_eq!(m.payload(), b"hello");
    assert_eq!(&m.raw[..], b"PUB   foo  rep  5 \r\nhello\r\n");
    let (ops, _) = decode_client_chunks(&[b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"]);
    let ClientOp::Pub(m) = &ops[0] else { panic!() };
    assert_eq!(m.headers(), b"NATS/1.0\r\n\r\n");
    assert_eq!(m.payload(), b"hi");
    let (ops, _) = decode_client_chunks(&[b"SUB\tfoo\t\tq1\t5\r\n"]);
    assert!(
        matches!(&ops[0], ClientOp::Sub { subject, queue: Some(q), sid, .. }
        if &subject[..] == b"foo" && &q[..] == b"q1" && &sid[..] == b"5")
    );
    let (ops, _) = decode_client_chunks(&[b"UNSUB 1 10\r\nUNSUB 2 x\r\n"]);
    assert!(matches!(&ops[0], ClientOp::Unsub { max: Some(10), .. }));
    assert!(matches!(&ops[1], ClientOp::Unsub { max: Some(0), .. }));
    // Found by the roundtrip fuzz target: a max of 10 digits is no number to nats-server 2.15
    // (it reads at most 9), so the subscription goes at once; the proxy never writes one.
    let (ops, _) = decode_client_chunks(&[b"UNSUB 1 4278190080
UNSUB 1 999999999
"]);
    assert!(matches!(&ops[0], ClientOp::Unsub { max: Some(0), .. }));
    assert!(matches!(
        &ops[1],
        ClientOp::Unsub {
            max: Some(999_999_999),
            ..
        }
    ));
    let (ops, _) = decode_client_chunks(&[b"CONNECT{\"a\":1}\r\n"]);
    assert_eq!(ops[0], ClientOp::Connect(Bytes::from_static(b"{\"a\":1}")));
}

/// Invalid client input and the error nats-server reacts with (notes §1.2; the
/// integration test `bad_input` measures the same bytes against a real server).
#[test]
fn client_invalid_inputs() {
    use ProtoError::*;
    let cases: &[(&[u8], ProtoError)] = &[
        (b"\r\n", UnknownOp),
        (b"FOO bar\r\n", UnknownOp),
        (b"MSG foo 1 2\r\nhi\r\n", UnknownOp),
        (b"PUBfoo 2\r\n", UnknownOp),
        (b"UNSUB\r\n", UnknownOp),
        (b"PUB foo 5\r\nhi\r\nPING\r\n", UnknownOp),
        (b"PUB foo\r\n", BadArgs("PUB")),
        (b"PUB foo bar baz 1\r\n", BadArgs("PUB")),
        (b"PUB foo x\r\n", BadSize("PUB")),
        (b"PUB foo 1\rx\r\n", BadSize("PUB")),
        (b"PUB foo 1234567890\r\n", BadSize("PUB")),
        (b"PUB foo 1048577\r\n", PayloadTooLarge),
        (b"HPUB foo 5 2\r\n", BadSize("HPUB")),
        (b"SUB foo\r\n", BadArgs("SUB")),
        (b"SUB a b c d\r\n", BadArgs("SUB")),
        (b"UNSUB 1 2 3\r\n", BadArgs("UNSUB")),
    ];
    for (input, want) in cases {
        let (_, err) = assert_chunking_invariant_client(input);
        assert_eq!(err, Some(*want), "{:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn garbage_is_rejected_at_its_first_byte() {
    let mut d = client_dec();
    let mut buf = BytesMut::from(&b"X"[..]);
    assert_eq!(d.decode(&mut buf), Err(ProtoError::UnknownOp));
    let mut d = client_dec();
    let mut buf = BytesMut::from(&b"PUBX"[..]);
    assert_eq!(d.decode(&mut buf), Err(ProtoError::UnknownOp));
}

#[test]
fn hpub_needs_headers_enabled() {
    let mut d = ClientDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"[..]);
    assert_eq!(d.decode(&mut buf), Err(ProtoError::HeadersNotSupported));
}

#[test]
fn control_line_limit_counts_argument_bytes_only() {
    let subj = "a".repeat(4094);
    let ok = format!("SUB {subj} 1\r\n"); // args: 4094 + 2 = 4096
    let (ops, err) = decode_client_chunks(&[ok.as_bytes()]);
    assert_eq!((ops.len(), err), (1, None));
    let bad = format!("SUB {subj}x 1\r\n");
    let (_, err) = decode_client_chunks(&[bad.as_bytes()]);
    assert_eq!(err, Some(ProtoError::ControlLineTooLong));
    // Also on a partial line: 5000 bytes with no newline yet.
    let partial = format!("PUB {}", "b".repeat(5000));
    let (_, err) = decode_client_chunks(&[partial.as_bytes()]);
    assert_eq!(err, Some(ProtoError::ControlLineTooLong));
}

#[test]
fn a_clients_hmsg_is_refused_after_its_line_as_nats_server_does() {
    // Short: the line is read, then refused. Over-long: the limit speaks first, also
    // before the newline came.
    let (ops, err) = decode_client_chunks(&[b"HMSG foo 1 2 3\r\n"]);
    assert_eq!((ops.len(), err), (0, Some(ProtoError::UnknownOp)));
    let (_, err) = decode_client_chunks(&[b"HMSG foo 1 2"]);
    assert_eq!(err, None);
    let long = format!("HMSG {} 1 2 3\r\n", "s".repeat(4100));
    let (_, err) = decode_client_chunks(&[long.as_bytes()]);
    assert_eq!(err, Some(ProtoError::ControlLineTooLong));
    let (_, err) = decode_client_chunks(&[&long.as_bytes()[..4105]]);
    assert_eq!(err, Some(ProtoError::ControlLineTooLong));
    let (_, err) = decode_client_chunks(&[b"HMSGx 1\r\n"]);
    assert_eq!(err, Some(ProtoError::UnknownOp));
    let (_, err) = decode_client_chunks(&[b"MSG foo 1 2\r\n"]);
    assert_eq!(err, Some(ProtoError::UnknownOp));
}

#[test]
fn ping_garbage_is_not_buffered() {
    let mut d = client_dec();
    let mut buf = BytesMut::new();
    for _ in 0..100 {
        buf.extend_from_slice(&[b'z'; 1000]);
        if buf.len() < 4 {
            continue;
        }
        buf.extend_from_slice(b"");
        let _ = d.decode(&mut buf);
    }
    let mut buf2 = BytesMut::from(&b"PING"[..]);
    buf2.extend_from_slice(&[b'z'; 100_000]);
    assert_eq!(d.decode(&mut buf2).ok().flatten(), None);
    assert!(buf2.len() <= 4, "kept {} bytes", buf2.len());
    buf2.extend_from_slice(b"\r\n");
    assert_eq!(d.decode(&mut buf2), Ok(Some(ClientOp::Ping)));
}

#[test]
fn payload_limit_follows_configuration() {
    let mut d = ClientDecoder::new(Limits {
        max_control_line: 4096,
        max_payload: 1024,
    });
    let mut buf = BytesMut::from(&b"PUB foo 1024\r\n"[..]);
    assert_eq!(d.decode(&mut buf), Ok(None));
    let mut d = ClientDecoder::new(Limits {
        max_control_line: 4096,
        max_payload: 1024,
    });
    let mut buf = BytesMut::from(&b"PUB foo 1025\r\n"[..]);
    assert_eq!(d.decode(&mut buf), Err(ProtoError::PayloadTooLarge));
}

const SERVER_FIXTURES: &[&[u8]] = &[
    b"INFO {\"server_id\":\"x\",\"max_payload\":1048576} \r\n",
    b"MSG foo 1 5\r\nhello\r\n",
    b"MSG foo 0 reply.x 0\r\n\r\n",
    b"HMSG foo 1 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"HMSG _INBOX.x 7 38 38\r\nNATS/1.0 503\r\nNats-Subject: nobody\r\n\r\n\r\n",
    b"MSG logs.v 1 $JS.ACK.LOGS.CV.1.5.5.1795971532879267765.0 3\r\nm00\r\n",
    b"PING\r\nPONG\r\n+OK\r\n-ERR 'Stale Connection'\r\n",
];

#[test]
fn server_fixtures_decode_the_same_however_chunked() {
    for f in SERVER_FIXTURES {
        let (ops, err) = assert_chunking_invariant_server(f);
        assert_eq!(err, None, "{:?}", String::from_utf8_lossy(f));
        assert!(!ops.is_empty());
    }
}

#[test]
fn status_parsing() {
    let timeout = encode::msg(
        b"i",
        b"1",
        None,
        Some(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 5\r\nNats-Pending-Bytes: 0\r\n\r\n"),
        b"",
    );
    let (ops, _) = decode_server_chunks(&[
        b"HMSG _INBOX.x 7 38 38\r\nNATS/1.0 503\r\nNats-Subject: nobody\r\n\r\n\r\n",
        &timeout,
    ]);
    let ServerOp::Msg(m) = &ops[0] else { panic!() };
    assert_eq!(m.status(), Some(503));
    assert_eq!(m.header(b"nats-subject"), Some(&b"nobody"[..]));
    let ServerOp::Msg(m) = &ops[1] else { panic!() };
    assert_eq!(m.status(), Some(408));
    assert_eq!(m.status_description(), b"Request Timeout");
    assert_eq!(m.header(b"Nats-Pending-Messages"), Some(&b"5"[..]));
}

#[test]
fn server_invalid_inputs() {
    for input in [
        &b"PUB foo 1\r\n"[..],
        b"MSG foo\r\n",
        b"MSG foo 1 x\r\n",
        b"HMSG a 1 5 2\r\n",
        b"SUB a 1\r\n",
    ] {
        let (_, err) = assert_chunking_invariant_server(input);
        assert!(err.is_some(), "{:?}", String::from_utf8_lossy(input));
    }
}

fn token() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![b'a'..=b'z', Just(b'.'), Just(b'_'), Just(b'$'), b'0'..=b'9'],
        1..12,
    )
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..200)
}

fn headers() -> impl Strategy<Value = Option<Vec<u8>>> {
    proptest::option::of(proptest::collection::vec(b'a'..=b'z', 0..20).prop_map(|v| {
        let mut h = b"NATS/1.0\r\nK: ".to_vec();
        h.extend(v);
        h.extend(b"\r\n\r\n");
        h
    }))
}

fn client_op() -> impl Strategy<Value = ClientOp> {
    prop_oneof![
        (token(), proptest::option::of(token()), headers(), payload()).prop_map(|(s, r, h, p)| {
            let raw = encode::publish(&s, r.as_deref(), h.as_deref(), &p);
            decode_client_chunks(&[&raw]).0.remove(0)
        }),
        (token(), proptest::option::of(token()), token()).prop_map(|(s, q, sid)| {
            ClientOp::Sub {
                raw: encode::sub(&s, q.as_deref(), &sid),
                subject: s.into(),
                queue: q.map(Into::into),
                sid: sid.into(),
            }
        }),
        (token(), proptest::option::of(0u64..1_000_000)).prop_map(|(sid, max)| ClientOp::Unsub {
            raw: encode::unsub(&sid, max),
            sid: sid.into(),
            max
        }),
        Just(ClientOp::Ping),
        Just(ClientOp::Pong),
        Just(ClientOp::Ok),
        token().prop_map(|t| ClientOp::Connect(Bytes::from(
            [b"{\"name\":\"", &t[..], b"\"}"].concat()
        ))),
    ]
}

fn server_op() -> impl Strategy<Value = ServerOp> {
    prop_oneof![
        (
            token(),
            token(),
            proptest::option::of(token()),
            headers(),
            payload()
        )
            .prop_map(|(s, sid, r, h, p)| {
                let raw = encode::msg(&s, &sid, r.as_deref(), h.as_deref(), &p);
                decode_server_chunks(&[&raw]).0.remove(0)
            }),
        Just(ServerOp::Ping),
        Just(ServerOp::Pong),
        Just(ServerOp::Ok),
        token().prop_map(|t| ServerOp::Err(Bytes::from([b"'", &t[..], b"'"].concat()))),
        token().prop_map(|t| ServerOp::Info(Bytes::from(
            [b"{\"server_id\":\"", &t[..], b"\"}"].concat()
        ))),
    ]
}

/// Compares ops by meaning (raw bytes may differ in spacing).
fn same_client(a: &ClientOp, b: &ClientOp) -> bool {
    match (a, b) {
        (
            ClientOp::Sub {
                subject: s1,
                queue: q1,
                sid: i1,
                ..
            },
            ClientOp::Sub {
                subject: s2,
                queue: q2,
                sid: i2,
                ..
            },
        ) => s1 == s2 && q1 == q2 && i1 == i2,
        (
            ClientOp::Unsub {
                sid: s1, max: m1, ..
            },
            ClientOp::Unsub {
                sid: s2, max: m2, ..
            },
        ) => s1 == s2 && m1 == m2,
        _ => a == b,
    }
}

proptest! {
    #[test]
    fn client_roundtrip(ops in proptest::collection::vec(client_op(), 1..8), split in any::<prop::sample::Index>()) {
        let mut wire = Vec::new();
        for op in &ops { wire.extend_from_slice(&encode::client_op(op)); }
        let at = split.index(wire.len() + 1);
        let (got, err) = decode_client_chunks(&[&wire[..at], &wire[at..]]);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got.len(), ops.len());
        for (g, o) in got.iter().zip(&ops) { prop_assert!(same_client(g, o), "{:?} != {:?}", g, o); }
    }

    #[test]
    fn server_roundtrip(ops in proptest::collection::vec(server_op(), 1..8), split in any::<prop::sample::Index>()) {
        let mut wire = Vec::new();
        for op in &ops { wire.extend_from_slice(&encode::server_op(op)); }
        let at = split.index(wire.len() + 1);
        let (got, err) = decode_server_chunks(&[&wire[..at], &wire[at..]]);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got, ops);
    }

    /// Arbitrary bytes never panic, and chunking never changes the outcome.
    #[test]
    fn arbitrary_input_is_chunking_independent(input in proptest::collection::vec(any::<u8>(), 0..300), split in any::<prop::sample::Index>()) {
        let at = split.index(input.len() + 1);
        prop_assert_eq!(decode_client_chunks(&[&input[..at], &input[at..]]), decode_client_chunks(&[&input]));
        prop_assert_eq!(decode_server_chunks(&[&input[..at], &input[at..]]), decode_server_chunks(&[&input]));
    }
}

#[test]
fn peek_sees_only_complete_canonical_msgs() {
    let d = ServerDecoder::new(Limits::upstream());
    let v = d.peek_msg(b"MSG a.b 7 r.s 3\r\nabc\r\nMSG").unwrap();
    assert_eq!(v.frame_len, 22);
    assert_eq!(v.size(), 3);
    let v = d.peek_msg(b"MSG \t a.b   7 3\r\nabc\r\n").unwrap();
    assert_eq!(v.reply, None);
    for none in [
        &b"MSG a 1 3\r\nabc"[..],        // incomplete
        b"MSG a 1 3\r\nabcd\r\n",        // wrong size: decode's error
        b"msg a 1 3\r\nabc\r\n",         // not canonical: decode handles it
        b"MSG a 1 3\nabc\r\n",           // bare LF
        b"HMSG a 1 2 5\r\nh\r\nabc\r\n", // headers
        b"MSG a 1 x y 3\r\nabc\r\n",     // too many fields
        b"MSG a 3\r\nabc\r\n",           // too few
        b"PING\r\n",
    ] {
        assert_eq!(d.peek_msg(none), None, "{}", String::from_utf8_lossy(none));
    }
    // Inside a partly read frame the decoder's state rules: no peeking.
    let mut d = ServerDecoder::new(Limits::upstream());
    let mut buf = BytesMut::from(&b"MSG a 1 3\r\nab"[..]);
    assert!(d.decode(&mut buf).unwrap().is_none());
    assert_eq!(d.peek_msg(b"c\r\nMSG a 1 3\r\nabc\r\n"), None);
}
