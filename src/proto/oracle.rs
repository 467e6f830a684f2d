//! The decoders' test oracle, shared by the proptests (`proto/tests.rs`) and the fuzz
//! targets (`fuzz/fuzz_targets/decode_*.rs`), so the property they check is one text:
//!
//! - the same bytes fed whole or in any chunks give the same ops and the same first
//!   error (decoding stops there, as the proxy does);
//! - wherever the relay's fast paths ([`ServerDecoder::peek_msg`],
//!   [`ClientDecoder::peek_pub`]) see a message, `decode` returns that message; where
//!   `decode` needs more bytes or fails, the fast path sees nothing.
//!
//! A failed check panics with the input, which is what both harnesses want.

use bytes::BytesMut;

use super::{ClientDecoder, ClientOp, Limits, ProtoError, ServerDecoder, ServerOp};

/// What decoding a byte stream gave: the ops, then the error that stopped it, if any.
pub type Decoded<Op> = (Vec<Op>, Option<ProtoError>);

/// Feeds `chunks` one after another to a client-direction decoder, checking the fast
/// path against `decode` before every op.
pub fn client_chunks(limits: Limits, headers: bool, chunks: &[&[u8]]) -> Decoded<ClientOp> {
    let mut d = ClientDecoder::new(limits);
    d.set_headers(headers);
    let mut buf = BytesMut::new();
    let mut ops = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        loop {
            let view = d.peek_pub(&buf);
            let before = buf.clone();
            match d.decode(&mut buf) {
                Ok(Some(op)) => {
                    if let Some(v) = view {
                        match &op {
                            ClientOp::Pub(m) => {
                                assert!(v.agrees_with(&before, m), "{v:?} {m:?} in {before:?}")
                            }
                            other => panic!("peek saw a PUB, decode {other:?} in {before:?}"),
                        }
                    }
                    ops.push(op)
                }
                Ok(None) => {
                    assert!(view.is_none(), "peek saw a PUB in an incomplete frame");
                    break;
                }
                Err(e) => {
                    assert!(view.is_none(), "peek saw a PUB where decode failed: {e:?}");
                    return (ops, Some(e));
                }
            }
        }
    }
    (ops, None)
}

/// Feeds `chunks` one after another to a server-direction decoder, checking the fast
/// path against `decode` before every op.
pub fn server_chunks(limits: Limits, chunks: &[&[u8]]) -> Decoded<ServerOp> {
    let mut d = ServerDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut ops = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        loop {
            let view = d.peek_msg(&buf);
            let before = buf.clone();
            match d.decode(&mut buf) {
                Ok(Some(op)) => {
                    if let Some(v) = view {
                        match &op {
                            ServerOp::Msg(m) => {
                                assert!(v.agrees_with(&before, m), "{v:?} {m:?} in {before:?}")
                            }
                            other => panic!("peek saw a MSG, decode {other:?} in {before:?}"),
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

/// `bytes` cut at `points` (sorted, each at most `bytes.len()`).
pub fn cut<'a>(bytes: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut chunks = Vec::with_capacity(points.len() + 1);
    let mut at = 0;
    for &p in points {
        chunks.push(&bytes[at..p]);
        at = p;
    }
    chunks.push(&bytes[at..]);
    chunks
}

/// Checks that `decode` gives the same result for `bytes` whole and cut at `points`;
/// returns the result.
pub fn same_however_cut<Op: PartialEq + std::fmt::Debug>(
    bytes: &[u8],
    points: &[usize],
    decode: impl Fn(&[&[u8]]) -> Decoded<Op>,
) -> Decoded<Op> {
    let whole = decode(&[bytes]);
    let chunks = cut(bytes, points);
    assert_eq!(
        decode(&chunks),
        whole,
        "chunking changed the result: {chunks:?}"
    );
    whole
}

/// [`same_however_cut`] for byte by byte and for every two-way cut: what the fixture
/// tests check.
pub fn same_every_cut<Op: PartialEq + std::fmt::Debug>(
    bytes: &[u8],
    decode: impl Fn(&[&[u8]]) -> Decoded<Op>,
) -> Decoded<Op> {
    let all: Vec<usize> = (0..=bytes.len()).collect();
    let whole = same_however_cut(bytes, &all, &decode);
    for i in 0..=bytes.len() {
        same_however_cut(bytes, &[i], &decode);
    }
    whole
}

/// A fuzz input: the protocol bytes, where to cut them, and the decoder's settings.
///
/// Layout: `n` (number of cut points, mod 8), `n` little-endian u16 cut points, a flags
/// byte (bit 0: headers on, bit 1: 16-byte control line limit, bit 2: 8-byte payload
/// limit), then the protocol bytes. `fuzz/run.sh` prefixes the seeds (one protocol op
/// per file) with such a header.
pub struct FuzzInput<'a> {
    pub headers: bool,
    pub limits: Limits,
    /// Sorted, each at most `bytes.len()`.
    pub cuts: Vec<usize>,
    pub bytes: &'a [u8],
}

impl<'a> FuzzInput<'a> {
    /// `None` when `data` is too short for its header.
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        let (&n, rest) = data.split_first()?;
        let n = usize::from(n % 8);
        let points = rest.get(..2 * n)?;
        let (&flags, bytes) = rest[2 * n..].split_first()?;
        let mut cuts: Vec<usize> = points
            .chunks(2)
            .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (bytes.len() + 1))
            .collect();
        cuts.sort_unstable();
        Some(FuzzInput {
            headers: flags & 1 != 0,
            limits: Limits {
                max_control_line: if flags & 2 != 0 { 16 } else { 4096 },
                max_payload: if flags & 4 != 0 { 8 } else { 1 << 20 },
            },
            cuts,
            bytes,
        })
    }
}
