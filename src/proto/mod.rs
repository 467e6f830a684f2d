//! Sans-io NATS wire layer: framing, parsing and encoding for both directions.
//! No sockets, no clocks, no tokio: bytes in, ops out.

// No clock here (clippy.toml); tests may make up times.
#![cfg_attr(not(test), deny(clippy::disallowed_methods))]

mod args;
mod decode_client;
mod decode_server;
pub mod encode;
mod error;
mod fast;
mod framer;
pub(crate) mod json;
mod op;
#[cfg(any(test, feature = "oracle"))]
pub mod oracle;
mod server_err;
pub(crate) mod status;
pub(crate) mod subject;

pub use decode_client::{ClientDecoder, PubView};
pub use decode_server::{MsgView, ServerDecoder};
pub use error::ProtoError;
pub use op::{ClientOp, Message, ServerOp};
pub use server_err::ServerErr;

/// nats-server's default `max_control_line`.
pub const MAX_CONTROL_LINE: usize = 4096;
/// nats-server's default `max_payload` (1 MiB).
pub const MAX_PAYLOAD: usize = 1024 * 1024;
/// Control-line bound for what upstream servers send (INFO with many URLs, long MSG lines).
pub const UPSTREAM_MAX_CONTROL_LINE: usize = 64 * 1024;
/// Payload bound for what upstream servers send (nats-server caps max_payload at 64 MiB).
pub const UPSTREAM_MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// Decoder bounds. Exceeding one is a protocol error, answered as nats-server answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum argument bytes of a control line.
    pub max_control_line: usize,
    /// Maximum PUB size / HPUB total size.
    pub max_payload: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_control_line: MAX_CONTROL_LINE,
            max_payload: MAX_PAYLOAD,
        }
    }
}

impl Limits {
    /// Bounds for the upstream (server → proxy) direction.
    pub fn upstream() -> Self {
        Limits {
            max_control_line: UPSTREAM_MAX_CONTROL_LINE,
            max_payload: UPSTREAM_MAX_PAYLOAD,
        }
    }
}

#[cfg(test)]
mod tests;
