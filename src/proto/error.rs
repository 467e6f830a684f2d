//! Wire-level errors. Each variant maps to exactly what nats-server does with the
//! same bytes: a specific `-ERR` text followed by a close, or a silent close.

use thiserror::Error;

/// A protocol violation found while decoding. No allocation, no I/O error inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// The op name is not one this direction accepts (or a required separator is missing,
    /// or a payload is not followed by CRLF).
    #[error("unknown protocol operation")]
    UnknownOp,
    /// The argument part of a control line exceeds the limit.
    #[error("maximum control line exceeded")]
    ControlLineTooLong,
    /// A PUB/HPUB (or MSG/HMSG) announced more bytes than the allowed payload.
    #[error("maximum payload violation")]
    PayloadTooLarge,
    /// Wrong number of arguments for the op.
    #[error("wrong number of arguments for {0}")]
    BadArgs(&'static str),
    /// A size field that is not a decimal number of at most 9 digits, or header > total.
    #[error("bad size in {0}")]
    BadSize(&'static str),
    /// HPUB from a client whose CONNECT did not enable headers.
    #[error("headers not supported by this connection")]
    HeadersNotSupported,
    /// CONNECT or INFO JSON that does not parse.
    #[error("invalid JSON in {0}")]
    BadJson(&'static str),
}

impl ProtoError {
    /// The `-ERR` line nats-server sends before closing for this error, if any.
    /// `None` means nats-server closes the connection without a word.
    pub fn server_err_line(self) -> Option<&'static [u8]> {
        match self {
            ProtoError::UnknownOp => Some(b"-ERR 'Unknown Protocol Operation'\r\n"),
            ProtoError::ControlLineTooLong => Some(b"-ERR 'maximum control line exceeded'\r\n"),
            ProtoError::PayloadTooLarge => Some(b"-ERR 'Maximum Payload Violation'\r\n"),
            ProtoError::BadArgs(_)
            | ProtoError::BadSize(_)
            | ProtoError::HeadersNotSupported
            | ProtoError::BadJson(_) => None,
        }
    }
}
