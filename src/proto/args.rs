//! The argument grammar of a complete control line, in nom combinators.
//!
//! The framer ([`super::framer`]) has found the op name and the line's end; what is left
//! is the argument bytes, blanks already skipped at the front and the `\r` dropped at the
//! back. Each verb's arguments are a fixed sequence of fields:
//!
//! ```text
//! PUB   <subject> [reply] <size>            fields split on blanks
//! HPUB  <subject> [reply] <hdr> <total>     fields split on blanks
//! SUB   <subject> [queue] <sid>             fields split on blanks, \r and \n
//! UNSUB <sid> [max]                         fields split on blanks, \r and \n
//! MSG   <subject> <sid> [reply] <size>      fields split on blanks, \r and \n
//! HMSG  <subject> <sid> [reply] <hdr> <total>
//! CONNECT / INFO / -ERR <text>              trailing blanks trimmed
//! size  1 to 9 decimal digits               nats-server's parseSize
//! ```
//!
//! As in nats-server (`server/parser.go`, `processPub` and friends), PUB and HPUB split
//! on spaces and tabs only, the others on `\r` and `\n` too. A wrong number of fields is
//! `None` here; the decoders turn that into the verb's `-ERR`. Sizes are separate so that
//! a bad number is told apart from a wrong field count.
//!
//! Every op's arguments are read here but those of the two hot ops, which
//! [`super::fast`] reads by hand: `MSG` on the relay's fast path
//! ([`super::ServerDecoder::peek_msg`]; `decode` reads even a `MSG` here) and `PUB`. Both
//! are checked against this grammar: by proptest in `fast.rs`, and by the fuzz targets.

use nom::bytes::complete::{take_while, take_while_m_n};
use nom::combinator::{all_consuming, opt};
use nom::error::{Error, ErrorKind};
use nom::sequence::preceded;
use nom::{IResult, Parser};

use super::op::Span;

type In<'a> = &'a [u8];

/// Which bytes separate fields: `CRLF` false for spaces and tabs (PUB, HPUB), true for
/// `\r` and `\n` too (SUB, UNSUB, MSG, HMSG). A const parameter and a lookup table, so
/// that each grammar is compiled with a one-load separator test (the field scans are most
/// of a small message's decoding).
#[inline(always)]
fn is_sep<const CRLF: bool>(c: u8) -> bool {
    SEPS[usize::from(CRLF)][usize::from(c)]
}

static SEPS: [[bool; 256]; 2] = [class(b" \t"), class(b" \t\r\n")];

const fn class(members: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < members.len() {
        t[members[i] as usize] = true;
        i += 1;
    }
    t
}

/// One field: separators, then at least one other byte.
#[inline(always)]
fn field<'a, const CRLF: bool>() -> impl Parser<In<'a>, Output = In<'a>, Error = Error<In<'a>>> {
    preceded(take_while(is_sep::<CRLF>), till_sep::<CRLF>)
}

/// At least one byte, up to the first separator (nom's `take_till1`, with a faster scan).
#[inline(always)]
fn till_sep<const CRLF: bool>(i: In<'_>) -> IResult<In<'_>, In<'_>> {
    match field_len::<CRLF>(i) {
        0 => Err(nom::Err::Error(Error::new(i, ErrorKind::TakeTill1))),
        n => Ok((&i[n..], &i[..n])),
    }
}

/// Bytes before the first separator in `i`, eight at a time while eight are left. Every
/// separator is at most `b' '` and field bytes almost never are: a word test flags the
/// bytes below `0x21`, and the lowest flag is exact (a subtraction borrows only upward).
/// A flagged byte that is no separator (a control byte inside a field) is stepped over.
#[inline(always)]
fn field_len<const CRLF: bool>(i: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    let mut at = 0;
    while let Some(w) = i.get(at..at + 8) {
        let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let low = x.wrapping_sub(ONES * 0x21) & !x & HIGH;
        if low == 0 {
            at += 8;
            continue;
        }
        let j = at + (low.trailing_zeros() / 8) as usize;
        if is_sep::<CRLF>(i[j]) {
            return j;
        }
        at = j + 1;
    }
    // Fewer than eight bytes left.
    at + i[at..]
        .iter()
        .position(|&c| is_sep::<CRLF>(c))
        .unwrap_or(i.len() - at)
}

/// `fields` and then nothing but separators up to the end of the line.
#[inline(always)]
fn line<'a, O, const CRLF: bool>(
    fields: impl Parser<In<'a>, Output = O, Error = Error<In<'a>>>,
    args: In<'a>,
) -> Option<O> {
    let r: IResult<In<'a>, (O, In<'a>)> =
        all_consuming((fields, take_while(is_sep::<CRLF>))).parse(args);
    r.ok().map(|(_, (o, _))| o)
}

/// Blanks only.
const B: bool = false;
/// Blanks, `\r` and `\n`.
const W: bool = true;

/// `<subject> [reply] <size>`.
pub(super) struct PubArgs<'a> {
    pub subject: In<'a>,
    pub reply: Option<In<'a>>,
    pub size: In<'a>,
}

/// `<subject> [reply] <hdr> <total>`.
pub(super) struct HPubArgs<'a> {
    pub subject: In<'a>,
    pub reply: Option<In<'a>>,
    pub hdr: In<'a>,
    pub total: In<'a>,
}

/// PUB's arguments (the decoder reads them by hand, [`super::fast::pub_args`]; this is
/// the grammar it is checked against).
#[cfg_attr(not(test), allow(dead_code))]
pub(super) fn pub_args(args: In<'_>) -> Option<PubArgs<'_>> {
    let (subject, a, b) = line::<_, B>((field::<B>(), field::<B>(), opt(field::<B>())), args)?;
    Some(match b {
        Some(size) => PubArgs {
            subject,
            reply: Some(a),
            size,
        },
        None => PubArgs {
            subject,
            reply: None,
            size: a,
        },
    })
}

/// HPUB's arguments.
#[inline]
pub(super) fn hpub_args(args: In<'_>) -> Option<HPubArgs<'_>> {
    let (subject, a, b, c) = line::<_, B>(
        (field::<B>(), field::<B>(), field::<B>(), opt(field::<B>())),
        args,
    )?;
    Some(match c {
        Some(total) => HPubArgs {
            subject,
            reply: Some(a),
            hdr: b,
            total,
        },
        None => HPubArgs {
            subject,
            reply: None,
            hdr: a,
            total: b,
        },
    })
}

/// SUB's arguments: `(subject, queue, sid)`.
#[inline]
pub(super) fn sub_args(args: In<'_>) -> Option<(In<'_>, Option<In<'_>>, In<'_>)> {
    let (subject, a, b) = line::<_, W>((field::<W>(), field::<W>(), opt(field::<W>())), args)?;
    Some(match b {
        Some(sid) => (subject, Some(a), sid),
        None => (subject, None, a),
    })
}

/// UNSUB's arguments: `(sid, max)`.
#[inline]
pub(super) fn unsub_args(args: In<'_>) -> Option<(In<'_>, Option<In<'_>>)> {
    line::<_, W>((field::<W>(), opt(field::<W>())), args)
}

/// MSG's arguments, as PUB's with the sid second.
#[inline]
pub(super) fn msg_args(args: In<'_>) -> Option<(In<'_>, PubArgs<'_>)> {
    let (subject, sid, a, b) = line::<_, W>(
        (field::<W>(), field::<W>(), field::<W>(), opt(field::<W>())),
        args,
    )?;
    let (reply, size) = match b {
        Some(size) => (Some(a), size),
        None => (None, a),
    };
    Some((
        sid,
        PubArgs {
            subject,
            reply,
            size,
        },
    ))
}

/// HMSG's arguments, as HPUB's with the sid second.
#[inline]
pub(super) fn hmsg_args(args: In<'_>) -> Option<(In<'_>, HPubArgs<'_>)> {
    let (subject, sid, a, b, c) = line::<_, W>(
        (
            field::<W>(),
            field::<W>(),
            field::<W>(),
            field::<W>(),
            opt(field::<W>()),
        ),
        args,
    )?;
    let (reply, hdr, total) = match c {
        Some(total) => (Some(a), b, total),
        None => (None, a, b),
    };
    Some((
        sid,
        HPubArgs {
            subject,
            reply,
            hdr,
            total,
        },
    ))
}

/// A size: 1 to 9 decimal digits and nothing else (nats-server's `parseSize`).
#[inline]
pub(crate) fn size(field: In<'_>) -> Option<usize> {
    let r: IResult<In<'_>, In<'_>> =
        all_consuming(take_while_m_n(1, 9, |c: u8| c.is_ascii_digit())).parse(field);
    let (_, digits) = r.ok()?;
    Some(
        digits
            .iter()
            .fold(0, |acc, &c| acc * 10 + usize::from(c - b'0')),
    )
}

/// The text of CONNECT, INFO and -ERR: everything to the end of the line, trailing blanks
/// trimmed (INFO ends with ` \r\n`). Leading blanks are the framer's.
pub(super) fn text(args: In<'_>) -> In<'_> {
    let end = args
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(0, |i| i + 1);
    &args[..end]
}

/// Where `part`, a sub-slice of `whole`, lies in it.
#[inline(always)]
pub(super) fn span(whole: &[u8], part: &[u8]) -> Span {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    Span::new(start..start + part.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pub_takes_two_or_three_fields() {
        let a = pub_args(b"s 5").unwrap();
        assert_eq!((a.subject, a.reply, a.size), (&b"s"[..], None, &b"5"[..]));
        let a = pub_args(b"s\t r  5 \t").unwrap();
        assert_eq!(
            (a.subject, a.reply, a.size),
            (&b"s"[..], Some(&b"r"[..]), &b"5"[..])
        );
        assert!(pub_args(b"s").is_none());
        assert!(pub_args(b"").is_none());
        assert!(pub_args(b"a b c d").is_none());
        // PUB splits on blanks only: a \r is part of a field.
        let a = pub_args(b"s\r 5").unwrap();
        assert_eq!(a.subject, b"s\r");
    }

    #[test]
    fn hpub_takes_three_or_four_fields() {
        let a = hpub_args(b"s 2 5").unwrap();
        assert_eq!((a.reply, a.hdr, a.total), (None, &b"2"[..], &b"5"[..]));
        let a = hpub_args(b"s r 2 5").unwrap();
        assert_eq!(a.reply, Some(&b"r"[..]));
        assert!(hpub_args(b"s 5").is_none());
        assert!(hpub_args(b"s r 2 5 x").is_none());
    }

    #[test]
    fn sub_unsub_msg_hmsg_split_on_cr_and_lf_too() {
        assert_eq!(sub_args(b"s\r1"), Some((&b"s"[..], None, &b"1"[..])));
        assert_eq!(
            sub_args(b"s q 1"),
            Some((&b"s"[..], Some(&b"q"[..]), &b"1"[..]))
        );
        assert!(sub_args(b"s").is_none());
        assert!(sub_args(b"s q 1 x").is_none());
        assert_eq!(unsub_args(b"1"), Some((&b"1"[..], None)));
        assert_eq!(unsub_args(b"1\n5"), Some((&b"1"[..], Some(&b"5"[..]))));
        assert!(unsub_args(b"1 5 6").is_none());
        let (sid, a) = msg_args(b"s 1 r 5").unwrap();
        assert_eq!(
            (sid, a.reply, a.size),
            (&b"1"[..], Some(&b"r"[..]), &b"5"[..])
        );
        assert!(msg_args(b"s 1").is_none());
        let (sid, a) = hmsg_args(b"s 1 2 5").unwrap();
        assert_eq!(
            (sid, a.reply, a.hdr, a.total),
            (&b"1"[..], None, &b"2"[..], &b"5"[..])
        );
        assert!(hmsg_args(b"s 1 r 2 5 6").is_none());
    }

    #[test]
    fn sizes_are_one_to_nine_digits() {
        assert_eq!(size(b"0"), Some(0));
        assert_eq!(size(b"999999999"), Some(999_999_999));
        assert_eq!(size(b"1000000000"), None);
        assert_eq!(size(b""), None);
        assert_eq!(size(b"-1"), None);
        assert_eq!(size(b"1x"), None);
    }

    #[test]
    fn text_trims_trailing_blanks() {
        assert_eq!(text(b"{} \t"), b"{}");
        assert_eq!(text(b"  "), b"");
        assert_eq!(text(b""), b"");
    }
}
