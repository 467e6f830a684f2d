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
/// the subject, the reply and the size (the full path; the fast one is [`pub_line`]).
#[inline(always)]
pub(super) fn pub_args(buf: &[u8], start: usize, end: usize) -> Option<(Span, Option<Span>, Span)> {
    let (f, n) = split_args::<3>(buf, start, end, &BLANK)?;
    match n {
        2 => Some((f[0], None, f[1])),
        3 => Some((f[0], Some(f[1]), f[2])),
        _ => None,
    }
}

/// Where the first byte of `buf[i..end]` that ends a PUB argument is (a blank, or the
/// line's `\n`), or `end`. Eight bytes a step: most of a PUB line is its subject, and a
/// byte-class loop over it, after a `memchr` for the line's end, was a third of the
/// proxy's CPU on 16-byte publishes (BENCHMARKS.md, issue 36).
#[inline(always)]
fn find_arg_end(buf: &[u8], mut i: usize, end: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // The lowest byte flagged is the first zero byte of `v` (flags above it may be
    // false: the borrow), which is all this asks.
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let is_end = |c: u8| matches!(c, b' ' | b'\t' | b'\n');
    while let Some(word) = buf.get(i..i + 8).filter(|_| i + 8 <= end) {
        let mut w = [0; 8];
        w.copy_from_slice(word);
        let w = u64::from_le_bytes(w);
        let hits = zero_bytes(w ^ (ONES * u64::from(b' ')))
            | zero_bytes(w ^ (ONES * u64::from(b'\t')))
            | zero_bytes(w ^ (ONES * u64::from(b'\n')));
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < end && !is_end(buf[i]) {
        i += 1;
    }
    i
}

/// A PUB line's arguments, read in one pass from `start` (just past `PUB `).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PubLine {
    /// Offset of the line's `\n`.
    pub nl: usize,
    /// Where the arguments start (past the blanks after the verb).
    pub args: usize,
    pub subject: Span,
    pub reply: Option<Span>,
    pub size: Span,
}

/// The PUB line starting at `buf[start..]`, if its `\n` comes before `limit`, it ends in
/// `\r\n` and it has two or three arguments: what [`args::pub_args`] reads from the
/// text between `start` and the `\r` (split on blanks only, a `\r` elsewhere is a
/// subject's byte).
#[inline(always)]
pub(super) fn pub_line(buf: &[u8], start: usize, limit: usize) -> Option<PubLine> {
    let limit = limit.min(buf.len());
    let mut f = [Span::default(); 3];
    let mut n = 0;
    let mut i = start;
    let mut args = None;
    loop {
        while i < limit && matches!(buf[i], b' ' | b'\t') {
            i += 1;
        }
        args.get_or_insert(i);
        let s = i;
        i = find_arg_end(buf, i, limit);
        let c = *buf.get(i).filter(|_| i < limit)?;
        // The line's last argument ends before its `\r` (a lone `\r` is none).
        let e = if c == b'\n' { i.checked_sub(1)? } else { i };
        if e > s {
            *f.get_mut(n)? = Span::new(s..e);
            n += 1;
        }
        if c == b'\n' {
            if buf.get(e) != Some(&b'\r') || e < start {
                return None;
            }
            let (subject, reply, size) = match n {
                2 => (f[0], None, f[1]),
                3 => (f[0], Some(f[1]), f[2]),
                _ => return None,
            };
            return Some(PubLine {
                nl: i,
                args: args.unwrap_or(start),
                subject,
                reply,
                size,
            });
        }
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
            prop_oneof![Just(b' '), Just(b'\t'), Just(b'\r'), Just(b'a'), Just(b'1'), any::<u8>()], 0..90)) {
            let fast = pub_args(&line, 0, line.len())
                .map(|(s, r, n)| (&line[s.range()], r.map(|r| &line[r.range()]), &line[n.range()]));
            let nom = args::pub_args(&line).map(|a| (a.subject, a.reply, a.size));
            prop_assert_eq!(fast, nom);
        }

        /// The one-pass PUB line reader finds what the line's end and the splitter find.
        #[test]
        fn pub_line_is_the_line_end_and_the_splitter(line in proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\t'), Just(b'\r'), Just(b'\n'), Just(b'a'), Just(b'1'), any::<u8>()], 0..90),
            limit in 0usize..100) {
            let two_pass = memchr::memchr(b'\n', &line[..limit.min(line.len())])
                .filter(|&nl| nl > 0 && line[nl - 1] == b'\r')
                .and_then(|nl| {
                    let (s, r, z) = pub_args(&line, 0, nl - 1)?;
                    let args = super::super::framer::skip_blanks(&line, 0, nl - 1);
                    Some((nl, args, s, r, z))
                });
            let one_pass = pub_line(&line, 0, limit)
                .map(|l| (l.nl, l.args, l.subject, l.reply, l.size));
            prop_assert_eq!(one_pass, two_pass);
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
