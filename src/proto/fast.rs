//! The two hot ops' arguments by hand: `MSG` on the relay's fast path
//! ([`super::ServerDecoder::peek_msg`]) and `PUB` from clients. Each is [`super::args`]'s
//! grammar for that verb written as one byte-class loop, which the nom combinators do
//! not match for speed on a 15-byte line (measured with callgrind: a PUB decoding run
//! took 16 % more instructions through the grammar). The
//! proptests below check that both give the same fields on any line; the fuzz targets
//! check that the fast path and `decode` agree on any stream.

#[cfg(test)]
use super::args;
use super::op::Span;

/// The fast path's byte classes, as lookup tables: one load a byte in the field-splitting
/// loop, which is most of the work on small messages.
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

/// Separators of MSG arguments.
pub(super) static ARG_SEP: Class = class(b" \t\r\n");

/// Splits `buf[range]` into at most `N` fields; more fields is an error.
/// Spans are absolute offsets into `buf`.
#[inline(always)]
pub(super) fn split_args<const N: usize>(
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

/// nats-server's `parseSize`, as [`args::size`], by hand.
#[inline(always)]
pub(super) fn parse_size(d: &[u8]) -> Option<usize> {
    if d.is_empty() || d.len() > 9 {
        return None;
    }
    d.iter().try_fold(0usize, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + usize::from(c - b'0'))
    })
}

/// Separators of PUB arguments (nats-server splits those on blanks only).
static BLANK: Class = class(b" \t");

/// PUB's arguments in `buf[start..end]`, as [`args::pub_args`] reads them: spans of
/// the subject, the reply and the size.
#[inline(always)]
pub(super) fn pub_args(buf: &[u8], start: usize, end: usize) -> Option<(Span, Option<Span>, Span)> {
    let (f, n) = split_args::<3>(buf, start, end, &BLANK)?;
    match n {
        2 => Some((f[0], None, f[1])),
        3 => Some((f[0], Some(f[1]), f[2])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hand-written PUB splitter and the grammar agree on every line.
        #[test]
        fn pub_by_hand_is_the_grammar(line in proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\t'), Just(b'\r'), Just(b'a'), Just(b'1'), any::<u8>()], 0..40)) {
            let fast = pub_args(&line, 0, line.len())
                .map(|(s, r, n)| (&line[s.range()], r.map(|r| &line[r.range()]), &line[n.range()]));
            let nom = args::pub_args(&line).map(|a| (a.subject, a.reply, a.size));
            prop_assert_eq!(fast, nom);
        }

        /// The fast path's MSG splitter and the grammar agree on every line.
        #[test]
        fn msg_by_hand_is_the_grammar(line in proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\t'), Just(b'\r'), Just(b'\n'), Just(b'a'), Just(b'1'), any::<u8>()], 0..40)) {
            let fast = split_args::<4>(&line, 0, line.len(), &ARG_SEP).and_then(|(f, n)| {
                let s = |i: usize| &line[f[i].range()];
                match n {
                    3 => Some((s(0), s(1), None, s(2))),
                    4 => Some((s(0), s(1), Some(s(2)), s(3))),
                    _ => None,
                }
            });
            let nom = args::msg_args(&line).map(|(sid, a)| (a.subject, sid, a.reply, a.size));
            prop_assert_eq!(fast, nom);
        }

        /// The hand-written size reader and the grammar's agree.
        #[test]
        fn sizes_by_hand_are_the_grammar(d in proptest::collection::vec(
            prop_oneof![Just(b'0'), Just(b'9'), Just(b'5'), any::<u8>()], 0..12)) {
            prop_assert_eq!(parse_size(&d), args::size(&d));
        }
    }
}
