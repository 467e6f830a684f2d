//! Server-direction decoder: the same bytes decoded whole and split at fuzzer-chosen
//! points give the same ops and the same error, and never panic; the relay's fast path
//! (`peek_msg`) agrees with `decode` wherever it sees a message.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use natsproxy::proto::{Limits, ProtoError, ServerDecoder, ServerOp};

/// Input layout: `n` (number of split points, mod 8), `n` little-endian u16 split
/// points, a flags byte (bit 0: headers on, bit 1: 16-byte control line limit, bit 2:
/// 8-byte payload limit), then the protocol bytes. `run.sh` prefixes the seeds (one
/// protocol op per file) with such a header.
struct Input<'a> {
    limits: Limits,
    splits: Vec<usize>,
    bytes: &'a [u8],
}

fn parse(data: &[u8]) -> Option<Input<'_>> {
    let (&n, rest) = data.split_first()?;
    let n = usize::from(n % 8);
    let splits = rest.get(..2 * n)?;
    let (&flags, bytes) = rest[2 * n..].split_first()?;
    let mut points: Vec<usize> = splits
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (bytes.len() + 1))
        .collect();
    points.sort_unstable();
    Some(Input {
        limits: Limits {
            max_control_line: if flags & 2 != 0 { 16 } else { 4096 },
            max_payload: if flags & 4 != 0 { 8 } else { 1 << 20 },
        },
        splits: points,
        bytes,
    })
}

/// Decodes `chunks` fed one after another; stops at the first error, as the proxy does.
fn decode(limits: Limits, chunks: &[&[u8]]) -> (Vec<ServerOp>, Option<ProtoError>) {
    let mut dec = ServerDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut ops = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        loop {
            // The relay's fast path: where it sees a MSG, decode returns the same one.
            let view = dec.peek_msg(&buf);
            let before = buf.clone();
            match dec.decode(&mut buf) {
                Ok(Some(op)) => {
                    if let Some(v) = view {
                        match &op {
                            ServerOp::Msg(m) => assert!(v.agrees_with(&before, m), "{v:?}"),
                            _ => panic!("peek saw a MSG, decode {op:?}"),
                        }
                    }
                    ops.push(op)
                }
                Ok(None) => {
                    assert!(view.is_none(), "peek saw a MSG in an incomplete frame");
                    break;
                }
                Err(e) => {
                    assert!(view.is_none(), "peek saw a MSG where decode failed: {e:?}");
                    return (ops, Some(e));
                }
            }
        }
    }
    (ops, None)
}

fuzz_target!(|data: &[u8]| {
    let Some(i) = parse(data) else { return };
    let whole = decode(i.limits, &[i.bytes]);
    let mut chunks = Vec::new();
    let mut at = 0;
    for &p in &i.splits {
        chunks.push(&i.bytes[at..p]);
        at = p;
    }
    chunks.push(&i.bytes[at..]);
    let split = decode(i.limits, &chunks);
    assert_eq!(whole, split, "chunking changed the result: {chunks:?}");
});
