//! Pure session tests: events in with a fake clock, actions out.

use super::*;
use bytes::Bytes;

struct H {
    s: Session,
    now: Instant,
}

impl H {
    fn new() -> H {
        let now = Instant::now();
        H {
            s: Session::new(SessionConfig::default(), now),
            now,
        }
    }
    fn actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.s.poll_action()).collect()
    }
    fn client(&mut self, b: &[u8]) -> Vec<Action> {
        let mut buf = BytesMut::from(b);
        self.s.handle_client_bytes(&mut buf, self.now);
        self.actions()
    }
    fn upstream(&mut self, e: u64, b: &[u8]) -> Vec<Action> {
        let mut buf = BytesMut::from(b);
        self.s.handle_upstream_bytes(Epoch(e), &mut buf, self.now);
        self.actions()
    }
    /// Dial, connect, INFO, client CONNECT, handshake PONG.
    fn connected() -> H {
        let mut h = H::new();
        assert!(matches!(
            h.actions()[..],
            [Action::Dial {
                epoch: Epoch(1),
                ..
            }]
        ));
        h.s.handle_upstream_connected(Epoch(1), h.now);
        let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"server_name\":\"n1\",\"max_payload\":2048,\"connect_urls\":[\"x:1\"]} \r\n");
        assert!(matches!(&a[..], [Action::ToClient(_)]));
        let a =
            h.client(b"CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\n");
        assert_eq!(a.len(), 2, "{a:?}");
        h.upstream(1, b"PONG\r\n");
        h
    }
}

fn to_client(a: &[Action]) -> Vec<u8> {
    a.iter()
        .filter_map(|a| match a {
            Action::ToClient(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn to_upstream(a: &[Action]) -> Vec<u8> {
    a.iter()
        .filter_map(|a| match a {
            Action::ToUpstream(_, b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn handshake_sends_our_info_and_an_explicit_connect() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"max_payload\":2048,\"connect_urls\":[\"x:1\"],\"ldm\":false,\"nonce\":\"abc\"} \r\n");
    let info = String::from_utf8(to_client(&a)).unwrap();
    assert!(
        info.starts_with("INFO {") && info.ends_with(" \r\n"),
        "{info}"
    );
    assert!(
        !info.contains("connect_urls") && !info.contains("nonce") && !info.contains("ldm"),
        "{info}"
    );
    assert!(info.contains("\"max_payload\":2048"));
    // Ops before CONNECT reaches upstream wait in the backlog, in order.
    let a = h.client(
        b"CONNECT {\"verbose\":false,\"echo\":false,\"name\":\"vector\"}\r\nSUB foo 1\r\nPING\r\n",
    );
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(up.starts_with("CONNECT {"), "{up}");
    for f in [
        "\"verbose\":false",
        "\"pedantic\":false",
        "\"protocol\":1",
        "\"headers\":true",
        "\"no_responders\":true",
        "\"echo\":false",
        "\"name\":\"vector\"",
    ] {
        assert!(up.contains(f), "{f} missing in {up}");
    }
    assert!(up.ends_with("PING\r\nSUB foo 1\r\nPING\r\n"), "{up}");
    // First PONG completes the handshake; the second is the client's.
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\n")), b"");
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\n")), b"PONG\r\n");
}

#[test]
fn client_pong_waits_for_upstream_and_ok_waits_behind_it() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":true}\r\n");
    let a = h.client(b"PING\r\nPUB a 1\r\nx\r\n");
    assert_eq!(
        to_client(&a),
        b"",
        "+OK must wait behind the unanswered PING"
    );
    assert_eq!(to_upstream(&a), b"PING\r\nPUB a 1\r\nx\r\n");
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\n")), b"PONG\r\n+OK\r\n");
}

#[test]
fn messages_are_forwarded_from_their_original_bytes_and_counted() {
    let mut h = H::connected();
    h.client(b"SUB foo 7\r\nUNSUB 7 2\r\n");
    let raw = b"MSG foo 7 reply 5\r\nhello\r\n";
    assert_eq!(to_client(&h.upstream(1, raw)), raw);
    assert_eq!(
        h.s.subscriptions()
            .get(b"7".as_slice())
            .map(|s| s.delivered),
        Some(1)
    );
    h.upstream(1, raw);
    assert!(h.s.subscriptions().is_empty(), "auto-unsubscribe reached");
}

#[test]
fn a_retired_epoch_is_never_forwarded() {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    assert_eq!(h.upstream(2, b"MSG foo 1 1\r\nx\r\n"), vec![]);
    h.s.handle_upstream_lost(Epoch(2), h.now);
    assert!(!h.s.is_closed(), "a stale epoch's loss changes nothing");
}

#[test]
fn upstream_loss_closes_the_client() {
    let mut h = H::connected();
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let a = h.actions();
    assert!(
        a.contains(&Action::CloseClient(CloseReason::UpstreamLost)),
        "{a:?}"
    );
}

#[test]
fn keepalive_pings_and_stale_detection() {
    let mut h = H::connected();
    let t0 = h.now;
    let due = h.s.poll_timeout().unwrap();
    assert_eq!(due, t0 + DEFAULT_PING_INTERVAL);
    h.s.handle_timeout(due);
    assert_eq!(to_upstream(&h.actions()), b"PING\r\n");
    // Answered: no stale.
    h.now = due;
    h.upstream(1, b"PONG\r\n");
    let due = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(due);
    assert_eq!(to_upstream(&h.actions()), b"PING\r\n");
    // Unanswered for 2 intervals: stale.
    let stale = due + DEFAULT_PING_INTERVAL * 2;
    h.s.handle_timeout(due + DEFAULT_PING_INTERVAL);
    h.actions();
    h.s.handle_timeout(stale);
    let a = h.actions();
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    assert!(h.s.is_closed());
}

#[test]
fn upstream_ping_is_answered_and_errors_relayed() {
    let mut h = H::connected();
    let a = h.upstream(1, b"PING\r\n");
    assert_eq!(to_upstream(&a), b"PONG\r\n");
    assert_eq!(to_client(&a), b"");
    let a = h.upstream(1, b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n");
    assert_eq!(
        to_client(&a),
        b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n"
    );
}

#[test]
fn async_info_never_reaches_the_client() {
    let mut h = H::connected();
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"a:1\",\"b:2\"],\"ldm\":true} \r\n",
    );
    assert_eq!(to_client(&a), b"");
}

#[test]
fn no_responders_status_only_for_clients_that_asked() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    h.upstream(1, b"INFO {\"server_id\":\"S\"} \r\n");
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB _INBOX.x 7\r\n");
    h.upstream(1, b"PONG\r\n");
    let status = b"HMSG _INBOX.x 7 38 38\r\nNATS/1.0 503\r\nNats-Subject: nobody\r\n\r\n\r\n";
    assert_eq!(to_client(&h.upstream(1, status)), b"");
    let mut h = H::connected();
    h.client(b"SUB _INBOX.x 7\r\n");
    assert_eq!(to_client(&h.upstream(1, status)), status);
}

#[test]
fn garbage_from_upstream_is_a_lost_link_not_a_panic() {
    let mut h = H::connected();
    let a = h.upstream(1, b"BOGUS\r\n");
    assert!(
        a.contains(&Action::CloseClient(CloseReason::UpstreamLost)),
        "{a:?}"
    );
    let _ = Bytes::new();
}
