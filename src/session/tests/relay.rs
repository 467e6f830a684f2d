//! Handshake, relay, keepalive and what the upstream sends.

use super::harness::*;
use super::*;

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
    // CONNECT, PING, the (empty) replay, PING, then the SUB and the client's PING.
    assert!(
        up.ends_with("PING\r\nPING\r\nSUB foo 1\r\nPING\r\n"),
        "{up}"
    );
    // Handshake and replay PONGs stay with the proxy; the third is the client's.
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\nPONG\r\n")), b"");
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
    // The publish gets its confirmation PING after CONFIRM_DELAY, not at once.
    assert_eq!(h.s.poll_timeout(), Some(h.now + CONFIRM_DELAY));
    h.now += CONFIRM_DELAY;
    h.s.handle_timeout(h.now);
    assert_eq!(to_upstream(&h.actions()), b"PING\r\n");
}

#[test]
fn confirmation_pings_wait_for_a_delay_or_enough_bytes() {
    let mut h = H::connected();
    let t0 = h.now;
    // Small publishes over 15 ms: one PING, CONFIRM_DELAY after the first.
    for i in 0..4u32 {
        h.now = t0 + Duration::from_millis(5 * u64::from(i));
        let a = h.client(b"PUB a 1\r\nx\r\n");
        assert_eq!(to_upstream(&a), b"PUB a 1\r\nx\r\n");
    }
    assert_eq!(h.s.poll_timeout(), Some(t0 + CONFIRM_DELAY));
    h.now = t0 + CONFIRM_DELAY;
    h.s.handle_timeout(h.now);
    assert_eq!(to_upstream(&h.actions()), b"PING\r\n");
    assert_eq!(h.s.links.primary().unwrap().unconfirmed.len(), 4);
    h.upstream(1, b"PONG\r\n");
    assert_eq!(h.s.links.primary().unwrap().unconfirmed_bytes, 0);
    // CONFIRM_BYTES of publishes in one read: the PING goes with them.
    let mut pubs = Vec::new();
    while pubs.len() < CONFIRM_BYTES {
        pubs.extend_from_slice(b"PUB a 1000\r\n");
        pubs.extend_from_slice(&[b'p'; 1000]);
        pubs.extend_from_slice(b"\r\n");
    }
    let a = h.client(&pubs);
    assert!(to_upstream(&a).ends_with(b"\r\nPING\r\n"));
    // A client PING confirms them as well: no extra PING later.
    h.upstream(1, b"PONG\r\n");
    let a = h.client(b"PUB a 1\r\nx\r\nPING\r\n");
    assert_eq!(to_upstream(&a), b"PUB a 1\r\nx\r\nPING\r\n");
    h.now += CONFIRM_DELAY;
    h.s.handle_timeout(h.now);
    assert_eq!(to_upstream(&h.actions()), b"");
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
fn keepalive_pings_and_stale_detection() {
    // Without hedging: PINGs every ping_interval, stale after two.
    let mut h = H::connected_with(H::with(SessionConfig {
        hedge_after: Duration::ZERO,
        ..SessionConfig::default()
    }));
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
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::Dial {
                epoch: Epoch(2),
                ..
            }
        )),
        "fails over: {a:?}"
    );
    assert!(!h.s.is_closed());
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
    h.upstream(1, b"PONG\r\nPONG\r\n");
    let status = b"HMSG _INBOX.x 7 38 38\r\nNATS/1.0 503\r\nNats-Subject: nobody\r\n\r\n\r\n";
    assert_eq!(to_client(&h.upstream(1, status)), b"");
    let mut h = H::connected();
    h.client(b"SUB _INBOX.x 7\r\n");
    assert_eq!(to_client(&h.upstream(1, status)), status);
}

#[test]
fn garbage_from_upstream_is_a_lost_link_not_a_panic() {
    let mut h = H::connected();
    let a = h.upstream(1, b"MSG a 1 3\r\nabc\r\nBOGUS\r\nMSG a 1 3\r\nxyz\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    // Nothing of the garbage, nor what follows it, reaches the client.
    assert!(!String::from_utf8_lossy(&to_client(&a)).contains("BOGUS"));
    assert!(!String::from_utf8_lossy(&to_client(&a)).contains("xyz"));
    assert!(
        a.iter().any(|a| matches!(a, Action::Dial { .. })),
        "fails over: {a:?}"
    );
    assert!(!h.s.is_closed());
}

/// The upstream-bound actions, each as text.
fn upstream_frames(a: &[Action]) -> Vec<String> {
    a.iter()
        .filter_map(|a| match a {
            Action::ToUpstream(_, b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect()
}

/// Connected as real clients connect: not verbose, not pedantic.
fn connected_plain() -> H {
    let mut h = H::connected();
    let a = h.client(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n");
    assert!(to_client(&a).is_empty());
    h
}

#[test]
fn plain_publishes_go_upstream_as_one_frame_in_order_with_the_rest() {
    let mut h = connected_plain();
    let a = h.client(
        b"PUB a 1\r\nx\r\nPUB  b\tr 2\r\nyy\r\nPUB $JS.ACK.S.C.1.1.1.1.0 0\r\n\r\npub c 1\r\nz\r\nPUB d 1\r\nw\r\nPING\r\n",
    );
    assert_eq!(
        upstream_frames(&a),
        [
            "PUB a 1\r\nx\r\nPUB  b\tr 2\r\nyy\r\n",
            "PUB $JS.ACK.S.C.1.1.1.1.0 0\r\n\r\n",
            "pub c 1\r\nz\r\n",
            "PUB d 1\r\nw\r\n",
            "PING\r\n",
        ],
        "a run, the ack on the full path, a spelling the fast path leaves to decode"
    );
    assert_eq!(h.s.stats().msgs_to_upstream, 5);
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\n")), b"PONG\r\n");
    // An incomplete publish waits in the read buffer for its end, then goes.
    let mut buf = BytesMut::from(&b"PUB e 3\r\nab"[..]);
    h.s.handle_client_bytes(&mut buf, h.now);
    assert!(upstream_frames(&h.actions()).is_empty());
    buf.extend_from_slice(b"c\r\nPUB f 1\r\ng\r\n");
    h.s.handle_client_bytes(&mut buf, h.now);
    assert_eq!(
        upstream_frames(&h.actions()),
        ["PUB e 3\r\nabc\r\n", "PUB f 1\r\ng\r\n"]
    );
    assert!(buf.is_empty());
    // Too large for the server's max_payload (2048): the server's -ERR, as before.
    let big = format!("PUB h 4096\r\n{}\r\n", "x".repeat(4096));
    let a = h.client(big.as_bytes());
    assert_eq!(
        to_client(&a),
        b"-ERR 'Maximum Payload Violation'\r\n",
        "{a:?}"
    );
}

#[test]
fn a_run_of_publishes_lost_with_its_link_is_sent_again_and_counted_each() {
    let mut h = connected_plain();
    let a = h.client(b"PUB a 1\r\nx\r\nPUB a 1\r\ny\r\nPUB a 1\r\nz\r\n");
    assert_eq!(upstream_frames(&a).len(), 1, "one run");
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let (e2, _) = dial_of(&h.actions()).expect("redial");
    h.s.handle_upstream_connected(e2, h.now);
    let up = upstream_frames(&h.upstream(e2.0, INFO_B)).concat();
    assert!(
        up.ends_with("PUB a 1\r\nx\r\nPUB a 1\r\ny\r\nPUB a 1\r\nz\r\n"),
        "{up}"
    );
    assert_eq!(h.s.stats().publishes_resent, 3);
}

#[test]
fn a_verbose_client_gets_an_ok_per_publish() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":true}\r\n");
    let a = h.client(b"PUB a 1\r\nx\r\nPUB a 1\r\ny\r\n");
    assert_eq!(to_client(&a), b"+OK\r\n+OK\r\n");
    assert_eq!(
        upstream_frames(&a).concat(),
        "PUB a 1\r\nx\r\nPUB a 1\r\ny\r\n"
    );
}

/// A burst of publishes holds at most `MAX_UNCONFIRMED` for re-sending: past it the
/// client is not read, and a PONG that confirms some lets it be read again.
#[test]
fn a_burst_is_read_no_further_than_the_unconfirmed_bound() {
    let mut h = H::connected();
    let chunk: Vec<u8> = b"PUB burst 100\r\n"
        .iter()
        .copied()
        .chain([b'x'; 100])
        .chain(*b"\r\n")
        .cycle()
        .take(117 * 512)
        .collect();
    let (mut read, mut pings) = (0, 0);
    while h.s.wants_client_input() {
        let a = h.client(&chunk);
        read += chunk.len();
        pings += to_upstream(&a)
            .windows(6)
            .filter(|w| w == b"PING\r\n")
            .count();
        assert!(read < 2 * MAX_UNCONFIRMED, "still read after {read} bytes");
    }
    assert!(read >= MAX_UNCONFIRMED, "stopped after {read} bytes");
    assert!(pings > 0, "confirmation PINGs went out");
    h.upstream(1, b"PONG\r\n");
    assert!(
        h.s.wants_client_input(),
        "a confirmation lets the client be read"
    );
}
