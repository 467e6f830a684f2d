//! What an upstream `-ERR` means, from nats-server's own texts (`server/errors.go`,
//! `server/client.go`). The session acts on the class; the text itself is relayed as it
//! came.

/// The class of a server's `-ERR` text (quotes included or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerErr {
    /// `'Stale Connection'`: the server missed our PONGs and closes the link. The link's
    /// business, never the client's.
    StaleConnection,
    /// `'Authorization Violation'`, `'Authentication Timeout'`, `'User Authentication
    /// Expired'`, `'User Authentication Revoked'`, `'Account Authentication Expired'`: the
    /// credentials were refused; the server closes the link.
    Authorization,
    /// `'Permissions Violation for Publish to …'` or `… Subscription to …`: one operation
    /// refused, the connection stays.
    Permissions,
    /// Anything else (`'Maximum Payload Violation'`, `'Slow Consumer'`, …).
    Other,
}

impl ServerErr {
    pub fn classify(text: &[u8]) -> ServerErr {
        let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
        if has(b"Stale Connection") {
            ServerErr::StaleConnection
        } else if has(b"Authorization Violation") || has(b"Authentication") {
            ServerErr::Authorization
        } else if has(b"Permissions Violation") {
            ServerErr::Permissions
        } else {
            ServerErr::Other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_server_texts_by_class() {
        let cases: [(&[u8], ServerErr); 9] = [
            (b"'Stale Connection'", ServerErr::StaleConnection),
            (b"'Authorization Violation'", ServerErr::Authorization),
            (b"'Authentication Timeout'", ServerErr::Authorization),
            (b"'User Authentication Expired'", ServerErr::Authorization),
            (b"'User Authentication Revoked'", ServerErr::Authorization),
            (
                b"'Account Authentication Expired'",
                ServerErr::Authorization,
            ),
            (
                b"'Permissions Violation for Publish to \"a.b\"'",
                ServerErr::Permissions,
            ),
            (
                b"'Permissions Violation for Subscription to \"x\"'",
                ServerErr::Permissions,
            ),
            (b"'Maximum Payload Violation'", ServerErr::Other),
        ];
        for (text, class) in cases {
            assert_eq!(
                ServerErr::classify(text),
                class,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
