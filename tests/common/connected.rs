//! A session past its handshake, for the programs that drive the session core directly
//! without sockets: `tests/alloc.rs`, `benches/codec.rs`, `examples/hotpath.rs` and
//! `examples/instructions.rs` include this file by path (`#[path]`), so there is one copy.

use std::time::Instant;

use bytes::BytesMut;
use natsproxy::session::{Action, Epoch, Session, SessionConfig};

/// A new session taken through its dial, the upstream's INFO, the client's CONNECT and
/// `SUB <subject> 1`, and the PONGs, every action drained; with its upstream's epoch.
pub fn connected_session(subject: &str) -> (Session, Epoch) {
    let now = Instant::now();
    let mut s = Session::new(SessionConfig::default(), now);
    let epoch = std::iter::from_fn(|| s.poll_action())
        .find_map(|a| match a {
            Action::Dial { epoch, .. } => Some(epoch),
            _ => None,
        })
        .expect("a new session dials first");
    while s.poll_action().is_some() {}
    s.handle_upstream_connected(epoch, now);
    let mut b = BytesMut::from(&b"INFO {\"server_id\":\"S\",\"max_payload\":1048576} \r\n"[..]);
    s.handle_upstream_bytes(epoch, &mut b, now);
    let connect = format!("CONNECT {{\"verbose\":false,\"headers\":true}}\r\nSUB {subject} 1\r\n");
    let mut b = BytesMut::from(connect.as_bytes());
    s.handle_client_bytes(&mut b, now);
    let mut b = BytesMut::from(&b"PONG\r\nPONG\r\n"[..]);
    s.handle_upstream_bytes(epoch, &mut b, now);
    while s.poll_action().is_some() {}
    (s, epoch)
}
