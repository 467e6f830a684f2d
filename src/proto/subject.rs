//! Subject validation, with nats-server's rules (`IsValidSubject`, `IsValidLiteralSubject`).

/// A subject a SUB may use: non-empty tokens separated by `.`, no whitespace, `>` only as
/// the last token.
pub fn is_valid_subject(s: &[u8]) -> bool {
    if s.is_empty() {
        return false;
    }
    let mut full_wildcard_seen = false;
    for t in s.split(|&c| c == b'.') {
        if t.is_empty() || full_wildcard_seen {
            return false;
        }
        if t.len() > 1 {
            if t.iter()
                .any(|c| matches!(c, b' ' | b'\t' | b'\n' | 0x0c | b'\r'))
            {
                return false;
            }
            continue;
        }
        match t[0] {
            b'>' => full_wildcard_seen = true,
            b' ' | b'\t' | b'\n' | b'\r' | 0x0c => return false,
            _ => {}
        }
    }
    true
}

/// A subject a PUB may use in pedantic mode: valid and without wildcard tokens.
pub fn is_valid_literal_subject(s: &[u8]) -> bool {
    is_valid_subject(s) && s.split(|&c| c == b'.').all(|t| t != b"*" && t != b">")
}

/// Whether a literal `subject` matches the subscription `pattern` (`*` one token, `>` the
/// rest, at least one token).
pub fn matches(pattern: &[u8], subject: &[u8]) -> bool {
    let mut p = pattern.split(|&c| c == b'.');
    let mut s = subject.split(|&c| c == b'.');
    loop {
        match (p.next(), s.next()) {
            (Some(b">"), Some(_)) => return true,
            (Some(b"*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        assert!(matches(b"foo", b"foo"));
        assert!(matches(b"foo.*", b"foo.bar"));
        assert!(!matches(b"foo.*", b"foo.bar.baz"));
        assert!(matches(b"foo.>", b"foo.bar.baz"));
        assert!(!matches(b"foo.>", b"foo"));
        assert!(matches(b">", b"a"));
        assert!(!matches(b"foo", b"foo.bar"));
        assert!(!matches(b"foo.bar", b"foo"));
    }

    #[test]
    fn subjects() {
        for ok in [
            &b"foo"[..],
            b"foo.bar",
            b"foo.*",
            b"foo.>",
            b"*",
            b">",
            b"foo*.b>r",
        ] {
            assert!(is_valid_subject(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b""[..],
            b".",
            b"foo.",
            b".foo",
            b"foo..bar",
            b"foo.>.bar",
            b"a b",
        ] {
            assert!(!is_valid_subject(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(is_valid_literal_subject(b"foo.bar"));
        assert!(!is_valid_literal_subject(b"foo.*"));
        assert!(!is_valid_literal_subject(b">"));
        assert!(is_valid_literal_subject(b"foo*"));
    }
}
