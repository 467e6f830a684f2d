//! Pure session tests: events in with a fake clock, actions out.

use super::*;
use crate::proto::encode;
use bytes::{Bytes, BytesMut};
use std::time::{Duration, Instant};

struct H {
    s: Session,
    now: Instant,
}

impl H {
    fn new() -> H {
        // Dials at the lame duck at once; `migration_spread` has its own test.
        H::with(SessionConfig {
            migration_spread: Duration::ZERO,
            ..SessionConfig::default()
        })
    }
    fn with(cfg: SessionConfig) -> H {
        let now = Instant::now();
        H {
            s: Session::new(cfg, now),
            now,
        }
    }
    /// The first link up: its dial, `info` from the server, the client's `connect` (and
    /// whatever follows it), the handshake PONGs.
    fn up(mut self, info: &[u8], connect: &[u8]) -> H {
        self.actions();
        self.s.handle_upstream_connected(Epoch(1), self.now);
        self.upstream(1, info);
        self.client(connect);
        self.upstream(1, b"PONG\r\nPONG\r\n");
        self
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
        assert_eq!(a.len(), 1, "{a:?}");
        h.upstream(1, b"PONG\r\nPONG\r\n");
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
    assert_eq!(h.s.primary.as_ref().unwrap().unconfirmed.len(), 4);
    h.upstream(1, b"PONG\r\n");
    assert_eq!(h.s.primary.as_ref().unwrap().unconfirmed_bytes, 0);
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

fn dial_of(a: &[Action]) -> Option<(Epoch, String)> {
    a.iter().find_map(|a| match a {
        Action::Dial { epoch, addr } => Some((*epoch, addr.clone())),
        _ => None,
    })
}

const INFO_B: &[u8] =
    b"INFO {\"server_id\":\"B\",\"server_name\":\"n2\",\"max_payload\":2048} \r\n";

#[test]
fn lame_duck_make_before_break() {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\nSUB work q 2\r\nUNSUB 1 5\r\n");
    h.upstream(1, b"MSG foo 1 2\r\nm0\r\n");
    // Lame duck: dial another node (from connect_urls, never the leaving one).
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\",\"127.0.0.1:4222\"],\"ldm\":true} \r\n");
    assert_eq!(to_client(&a), b"", "the client never sees ldm");
    let (e2, addr) = dial_of(&a).expect("dial");
    assert_eq!((e2, addr.as_str()), (Epoch(2), "x:1"));
    h.s.handle_upstream_connected(e2, h.now);
    let a = h.upstream(2, INFO_B);
    assert_eq!(to_client(&a), b"", "no second INFO for the client");
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    // Replay: same sids, subjects, queue; max reduced by the one delivery.
    assert!(
        up.ends_with("PING\r\nSUB foo 1\r\nUNSUB 1 4\r\nSUB work q 2\r\nPING\r\n"),
        "{up}"
    );
    // B's SUBs registered (its PONGs come before anything routed to it after them):
    // switch barrier on A; client publishes wait.
    let a = h.upstream(2, b"PONG\r\nPONG\r\n");
    assert_eq!(
        a,
        vec![Action::ToUpstream(
            Epoch(1),
            Bytes::from_static(b"PING\r\n")
        )]
    );
    // Both links deliver: A's forwarded at once, B's held back.
    assert_eq!(to_client(&h.upstream(2, b"MSG foo 1 2\r\nm1\r\n")), b"");
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm1\r\n")),
        b"MSG foo 1 2\r\nm1\r\n"
    );
    let a = h.client(b"PUB out 1\r\np\r\n");
    assert_eq!(to_upstream(&a), b"", "waits for the barrier");
    // A's PONG: everything before it was processed; client traffic moves to B.
    let a = h.upstream(1, b"PONG\r\n");
    assert!(
        a.iter()
            .all(|a| matches!(a, Action::ToUpstream(Epoch(2), _))),
        "{a:?}"
    );
    assert_eq!(to_upstream(&a), b"PUB out 1\r\np\r\n");
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    // A still delivers until drained; B still held.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm2\r\n")),
        b"MSG foo 1 2\r\nm2\r\n"
    );
    h.upstream(2, b"MSG foo 1 2\r\nm2\r\nMSG foo 1 2\r\nm3\r\n");
    // Settle: UNSUB everything on A and a barrier (B's confirmation PING may come first).
    let (mut a, mut up) = (Vec::new(), String::new());
    while !up.contains("UNSUB") {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        a = h.actions();
        up = String::from_utf8(to_upstream(&a)).unwrap();
    }
    assert!(
        up.contains("UNSUB 1\r\n") && up.contains("UNSUB 2\r\n") && up.ends_with("PING\r\n"),
        "{up}"
    );
    assert!(
        a.iter()
            .all(|a| matches!(a, Action::ToUpstream(Epoch(1), _))),
        "{a:?}"
    );
    // A's drain PONG: A retired; B's held messages released minus what A delivered.
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    assert_eq!(to_client(&a), b"MSG foo 1 2\r\nm3\r\n");
    // Anything A still sends is ignored; B flows directly.
    assert_eq!(h.upstream(1, b"MSG foo 1 2\r\nm9\r\n"), vec![]);
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm4\r\n")),
        b"MSG foo 1 2\r\nm4\r\n"
    );
    assert_eq!(h.s.stats().migrations, 1);
    assert!(!h.s.migrating());
    // m0..m4: five deliveries reach UNSUB 1 5's max.
    assert!(h.s.subscriptions().get(b"1".as_slice()).is_none());
}

#[test]
fn hard_failover_buffers_answers_pings_and_resends_unconfirmed() {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    let a = h.client(b"PUB acks 1\r\na\r\n");
    assert_eq!(to_upstream(&a), b"PUB acks 1\r\na\r\n");
    // The link dies before its confirmation: the publish is unconfirmed.
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let a = h.actions();
    let (e2, _) = dial_of(&a).expect("redial");
    // Meanwhile the client's PINGs are answered and its publishes buffered.
    let a = h.client(b"PING\r\nPUB acks 1\r\nb\r\n");
    assert_eq!(to_client(&a), b"PONG\r\n");
    assert_eq!(to_upstream(&a), b"");
    h.s.handle_upstream_connected(e2, h.now);
    let a = h.upstream(e2.0, INFO_B);
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(
        up.ends_with("PING\r\nSUB foo 1\r\nPING\r\nPUB acks 1\r\na\r\nPUB acks 1\r\nb\r\n"),
        "replay, then the unconfirmed publish, then the buffered one: {up}"
    );
    assert_eq!(h.s.stats().failovers, 1);
    assert_eq!(h.s.stats().publishes_resent, 1);
    assert!(!h.s.is_closed());
}

#[test]
fn dial_failures_back_off_and_outage_ends_with_err() {
    let mut h = H::connected();
    let t0 = h.now;
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let mut a = h.actions();
    let mut dials = 0;
    let mut last_gap = Duration::ZERO;
    let mut last_dial = t0;
    while let Some((e, _)) = dial_of(&a) {
        dials += 1;
        h.s.handle_upstream_lost(e, h.now);
        h.actions();
        let Some(next) = h.s.poll_timeout() else {
            break;
        };
        h.now = next;
        h.s.handle_timeout(next);
        a = h.actions();
        if dial_of(&a).is_some() {
            last_gap = next - last_dial;
            last_dial = next;
        }
        if h.s.is_closed() {
            break;
        }
    }
    assert!(h.s.is_closed());
    assert!(dials > 10, "{dials}");
    assert!(
        last_gap <= DEFAULT_BACKOFF_MAX + DEFAULT_BACKOFF_MAX / 10,
        "{last_gap:?}"
    );
    assert!(h.now - t0 >= DEFAULT_MAX_OUTAGE);
    let text = String::from_utf8(to_client(&a)).unwrap();
    assert!(
        text.starts_with("-ERR 'natsproxy: no NATS server reachable"),
        "{text}"
    );
}

#[test]
fn echo_false_client_never_gets_its_own_messages_from_the_other_link() {
    let mut h = H::new().up(
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"]} \r\n",
        b"CONNECT {\"verbose\":false,\"echo\":false,\"headers\":true}\r\nSUB foo 1\r\n",
    );
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"ldm\":true} \r\n");
    let (e2, _) = dial_of(&a).unwrap();
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    // Published on A (no echo there); B, another connection, delivers it.
    h.client(b"PUB foo 4\r\nmine\r\n");
    h.upstream(2, b"MSG foo 1 4\r\nmine\r\n");
    h.upstream(2, b"PONG\r\nPONG\r\n");
    h.upstream(1, b"PONG\r\nPONG\r\n"); // confirmation + switch barrier
                                        // Published on B after the switch; A, still subscribed, delivers it.
    h.client(b"PUB foo 5\r\nmine2\r\n");
    assert_eq!(to_client(&h.upstream(1, b"MSG foo 1 5\r\nmine2\r\n")), b"");
    h.now = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(h.now);
    h.actions();
    let a = h.upstream(1, b"PONG\r\n");
    assert_eq!(to_client(&a), b"", "held echo from B dropped at release");
    assert_eq!(h.s.stats().migrations, 1);
}

#[test]
fn old_link_closing_before_the_switch_promotes_the_standby() {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"],\"ldm\":true} \r\n",
    );
    let (e2, _) = dial_of(&a).unwrap();
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n"); // B registered; switch barrier sent on A
    h.upstream(2, b"MSG foo 1 1\r\na\r\nMSG foo 1 1\r\nb\r\n");
    h.upstream(1, b"MSG foo 1 1\r\na\r\n");
    // Lame duck closes A before its switch PONG.
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let a = h.actions();
    assert_eq!(
        to_client(&a),
        b"MSG foo 1 1\r\nb\r\n",
        "held released, minus A's"
    );
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    let a = h.client(b"PUB x 1\r\n1\r\n");
    assert!(
        a.iter()
            .all(|a| matches!(a, Action::ToUpstream(Epoch(2), _))),
        "{a:?}"
    );
}

#[test]
fn a_jetstream_delivery_arriving_on_both_links_is_forwarded_once() {
    let mut h = H::connected();
    h.client(b"SUB _INBOX.v 1\r\n");
    let pull = b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.v 41\r\n{\"batch\":200,\"expires\":30000000000,\"x\":1}\r\n";
    let a = h.client(pull);
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(
        up.contains("\"idle_heartbeat\":1000000000"),
        "heartbeat added: {up}"
    );
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"],\"ldm\":true} \r\n",
    );
    let (e2, _) = dial_of(&a).unwrap();
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n"); // B's SUBs are registered
    let d1 = b"MSG logs.v 1 $JS.ACK.LOGS.CV.1.5.5.17.0 3\r\nm05\r\n";
    let d2 = b"MSG logs.v 1 $JS.ACK.LOGS.CV.1.6.6.18.0 3\r\nm06\r\n";
    // Both links deliver both (the consumer leader publishes to the inbox subject).
    assert_eq!(to_client(&h.upstream(1, d1)), d1);
    assert_eq!(to_client(&h.upstream(2, d1)), b"");
    assert_eq!(to_client(&h.upstream(2, d2)), b"");
    h.s.handle_upstream_lost(Epoch(1), h.now); // lame duck closes A
    let a = h.actions();
    assert_eq!(to_client(&a), d2, "each $JS.ACK delivery exactly once");
    // A 503 on the pull inbox never reaches the client.
    let s503 = b"HMSG _INBOX.v 1 38 38\r\nNATS/1.0 503\r\nNats-Subject: nobody\r\n\r\n\r\n";
    assert_eq!(to_client(&h.upstream(2, s503)), b"");
    // The swallowed heartbeat neither.
    let hb = b"HMSG _INBOX.v 1 31 31\r\nNATS/1.0 100 Idle Heartbeat\r\n\r\n\r\n";
    let a = h.upstream(2, hb);
    assert_eq!(a, vec![], "swallowed, and the link is fine");
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    assert_eq!(h.s.stats().statuses_shielded, 1);
}

/// Found by the session fuzz target: with no upstream (the dial never completes), a pull
/// request's heartbeat deadline passing again and again re-issued it into the backlog
/// each time, past the backlog bound (and each copy would have added credit).
#[test]
fn no_pull_reissue_piles_up_without_an_upstream() {
    let mut h = H::new();
    h.actions();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB _INBOX.x.1 1\r\n");
    h.client(b"PUB $JS.API.CONSUMER.MSG.NEXT.S.C _INBOX.x.1 67\r\n{\"batch\":3,\"expires\":0,\"idle_heartbeat\":56070000000,\"no_wait\":true}\r\n");
    let backlog = h.s.buffered().0;
    assert!(backlog > 0, "the request waits for an upstream");
    for _ in 0..20 {
        h.now += Duration::from_secs(56);
        h.s.handle_timeout(h.now);
        h.actions();
    }
    assert_eq!(h.s.buffered().0, backlog, "nothing added while no upstream");
    assert_eq!(h.s.stats().pulls_reissued, 0);
}

#[test]
fn fast_path_runs_keep_order_with_everything_else() {
    let mut h = H::connected();
    h.client(b"SUB a 1\r\nSUB b 2\r\nUNSUB 2 2\r\n");
    let hmsg = encode::msg(b"a", b"1", None, Some(b"NATS/1.0\r\nK: v\r\n\r\n"), b"h");
    let mut wire = Vec::new();
    wire.extend_from_slice(b"MSG a 1 2\r\nm1\r\n");
    wire.extend_from_slice(&hmsg);
    wire.extend_from_slice(b"MSG a 1 r 2\r\nm2\r\nMSG b 2 1\r\nx\r\n-ERR 'some error'\r\n");
    wire.extend_from_slice(
        b"MSG b 2 1\r\ny\r\nmsg a 1 2\r\nm3\r\nMSG a 1 2\nm4\r\nMSG a 1 2\r\nm5",
    );
    let mut buf = BytesMut::from(&wire[..]);
    h.s.handle_upstream_bytes(Epoch(1), &mut buf, h.now);
    let a = h.actions();
    let mut expect = Vec::new();
    expect.extend_from_slice(b"MSG a 1 2\r\nm1\r\n");
    expect.extend_from_slice(&hmsg);
    expect.extend_from_slice(b"MSG a 1 r 2\r\nm2\r\nMSG b 2 1\r\nx\r\n-ERR 'some error'\r\n");
    expect.extend_from_slice(b"MSG b 2 1\r\ny\r\nmsg a 1 2\r\nm3\r\nMSG a 1 2\nm4\r\n");
    assert_eq!(
        String::from_utf8_lossy(&to_client(&a)),
        String::from_utf8_lossy(&expect)
    );
    // The incomplete last frame completes with the next read.
    assert_eq!(&buf[..], b"MSG a 1 2\r\nm5");
    buf.extend_from_slice(b"\r\n");
    h.s.handle_upstream_bytes(Epoch(1), &mut buf, h.now);
    let a = h.actions();
    assert_eq!(to_client(&a), b"MSG a 1 2\r\nm5\r\n");
    // Counted on both paths: 6 on sid 1 plus 2 on sid 2, whose auto-unsubscribe ran.
    assert_eq!(h.s.stats().msgs_to_client, 8);
    assert!(h.s.subs.get(b"2").is_none());
    assert_eq!(h.s.subs.get(b"1").map(|s| s.delivered), Some(6));
}

#[test]
fn a_redelivery_of_an_acked_message_is_acked_again_not_delivered() {
    let mut h = H::connected();
    h.client(b"SUB _INBOX.v 1\r\n");
    let first = b"MSG logs.v 1 $JS.ACK.LOGS.CV.1.58.5.1795971532879267765.0 3\r\nm58\r\n";
    assert_eq!(to_client(&h.upstream(1, first)), first.to_vec());
    // The client acks; the ack dies with the node; the server redelivers after ack_wait.
    h.client(b"PUB $JS.ACK.LOGS.CV.1.58.5.1795971532879267765.0 0\r\n\r\n");
    let again = b"MSG logs.v 1 $JS.ACK.LOGS.CV.2.58.6.1795971562879267765.0 3\r\nm58\r\n";
    let other = b"MSG logs.v 1 $JS.ACK.LOGS.CV.2.59.7.1795971562879267766.0 3\r\nm59\r\n";
    let mut both = again.to_vec();
    both.extend_from_slice(other);
    let a = h.upstream(1, &both);
    assert_eq!(
        to_client(&a),
        other.to_vec(),
        "only the redelivery of what the client never acked reaches it"
    );
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(
        up.contains("PUB $JS.ACK.LOGS.CV.2.58.6.1795971562879267765.0 0\r\n\r\n"),
        "acked again by the proxy: {up:?}"
    );
    assert_eq!(h.s.stats().redeliveries_acked, 1);
    // nats-server 2.9's new consumer leader sends the same first delivery again.
    let resent = b"MSG logs.v 1 $JS.ACK.LOGS.CV.1.58.5.1795971532879267765.3 3\r\nm58\r\n";
    let a = h.upstream(1, resent);
    assert!(
        to_client(&a).is_empty(),
        "a re-sent delivery the client acked"
    );
    assert_eq!(h.s.stats().redeliveries_acked, 2);
    // A NAKed message is the client's to get again.
    h.client(b"PUB $JS.ACK.LOGS.CV.2.59.7.1795971562879267766.0 4\r\n-NAK\r\n");
    let nak = b"MSG logs.v 1 $JS.ACK.LOGS.CV.3.59.8.1795971592879267766.0 3\r\nm59\r\n";
    assert_eq!(to_client(&h.upstream(1, nak)), nak.to_vec());
}

#[test]
fn pull_statuses_through_the_session_shielded_or_passed_by_class() {
    let pull = b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.v 41\r\n{\"batch\":200,\"expires\":30000000000,\"x\":1}\r\n";
    let status = |line: &str| {
        let h = format!("NATS/1.0 {line}\r\n\r\n");
        format!("HMSG _INBOX.v 1 {0} {0}\r\n{h}\r\n", h.len()).into_bytes()
    };
    for (line, shielded) in [
        ("409 Leadership Change", true),
        ("409 Server Shutdown", true),
        ("503", true),
        ("408 Request Timeout", false),
        ("409 Consumer Deleted", false),
        ("409 Exceeded MaxWaiting", false),
        ("400 Bad Request", false),
    ] {
        let mut h = H::connected();
        h.client(b"SUB _INBOX.v 1\r\n");
        h.client(pull);
        let mut a = h.upstream(1, &status(line));
        h.s.handle_timeout(h.now);
        a.extend(h.actions());
        let got = to_client(&a);
        assert_eq!(
            got.is_empty(),
            shielded,
            "{line}: {:?}",
            String::from_utf8_lossy(&got)
        );
        if shielded && line.starts_with("409") {
            // Placed again at once, as a probe with the remaining batch.
            let up = String::from_utf8(to_upstream(&a)).unwrap();
            assert!(
                up.contains("PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.v ")
                    && up.contains("\"batch\":200")
                    && up.contains("\"expires\":400000000"),
                "{line}: {up}"
            );
        }
    }
}

#[test]
fn a_short_pull_lost_without_a_status_is_placed_again_before_it_expires() {
    let mut h = H::connected();
    h.client(b"SUB _INBOX.v 1\r\n");
    h.client(b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.v 32\r\n{\"batch\":10,\"expires\":990000000}\r\n");
    let t0 = h.now;
    let mut placed = None;
    while let Some(at) =
        h.s.poll_timeout()
            .filter(|&at| at < t0 + Duration::from_millis(990))
    {
        h.now = at;
        h.s.handle_timeout(at);
        let up = String::from_utf8(to_upstream(&h.actions())).unwrap();
        if up.contains("CONSUMER.MSG.NEXT") {
            placed = Some(at - t0);
            break;
        }
    }
    let placed = placed.expect("placed again before the client's 990 ms ran out");
    assert!(placed <= Duration::from_millis(600), "{placed:?}");
}

#[test]
fn the_leaving_node_under_another_name_is_never_moved_onto() {
    // The node announces itself also as `twin:1` (e.g. `localhost` vs `127.0.0.1`).
    let mut h = H::new().up(
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"twin:1\"]} \r\n",
        b"CONNECT {\"verbose\":false}\r\nSUB foo 1\r\n",
    );
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"ldm\":true} \r\n");
    let (e2, addr) = dial_of(&a).expect("dial");
    assert_eq!(addr, "twin:1", "not known yet to be the same node");
    h.s.handle_upstream_connected(e2, h.now);
    let a = h.upstream(e2.0, b"INFO {\"server_id\":\"S\"} \r\n");
    assert!(a.contains(&Action::CloseUpstream(e2)), "{a:?}");
    assert_eq!(to_upstream(&a), b"", "no CONNECT to the leaving node");
    assert!(dial_of(&a).is_none(), "the next dial waits a backoff");
    // Meanwhile another node joins the cluster.
    h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"ldm\":true,\"connect_urls\":[\"twin:1\",\"x:1\"]} \r\n",
    );
    h.now = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(h.now);
    let a = h.actions();
    let (e3, addr) = dial_of(&a).expect("dial after the backoff");
    assert_eq!(addr, "x:1");
    h.s.handle_upstream_connected(e3, h.now);
    let up = String::from_utf8(to_upstream(&h.upstream(e3.0, INFO_B))).unwrap();
    assert!(
        up.starts_with("CONNECT ") && up.contains("SUB foo 1\r\n"),
        "{up}"
    );
    // Still migrating from S, and twin:1 is never dialled again while S is leaving.
    assert!(h.s.migrating());
    let mut pool = h.s.pool.clone();
    for _ in 0..3 {
        assert_eq!(
            pool.pick(Some("127.0.0.1:4222"), h.now).as_deref(),
            Some("x:1")
        );
    }
}

#[test]
fn lame_duck_dials_are_spread_over_the_migration_spread() {
    let mut delays = Vec::new();
    for seed in 0..50 {
        let mut h = H::with(SessionConfig {
            seed,
            ..SessionConfig::default()
        })
        .up(
            b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"]} \r\n",
            b"CONNECT {\"verbose\":false}\r\n",
        );
        let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"ldm\":true} \r\n");
        assert!(
            dial_of(&a).is_none(),
            "the dial waits its share of the spread"
        );
        let at = h.s.poll_timeout().unwrap();
        let delay = at - h.now;
        assert!(delay < DEFAULT_MIGRATION_SPREAD, "{delay:?}");
        h.now = at;
        h.s.handle_timeout(h.now);
        assert_eq!(dial_of(&h.actions()).map(|d| d.1).as_deref(), Some("x:1"));
        delays.push(delay);
    }
    delays.sort();
    // Spread over the window, not bunched (50 sessions: quartiles far apart).
    assert!(
        delays[37] - delays[12] > DEFAULT_MIGRATION_SPREAD / 4,
        "{delays:?}"
    );
}

#[test]
fn a_client_closing_while_the_overlap_lingers_keeps_its_duplicate_count() {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"],\"ldm\":true} \r\n",
    );
    let (e2, _) = dial_of(&a).expect("dial");
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n");
    // m1 from both links: one copy is a duplicate.
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\n");
    h.upstream(2, b"MSG foo 1 2\r\nm1\r\n");
    h.upstream(1, b"PONG\r\n");
    while !String::from_utf8(to_upstream(&h.actions()))
        .unwrap()
        .contains("UNSUB")
    {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
    }
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    // The overlap lingers (B's late copies are still matched): the client leaves now.
    assert!(h.s.poll_timeout().is_some_and(|t| t > h.now));
    h.s.handle_client_closed();
    assert_eq!(h.s.stats().duplicates_suppressed, 1);
}

/// Lame duck on A, B up and switched to; returns with A retiring (Draining).
fn switched_to_b(subs: &[u8]) -> H {
    let mut h = H::connected();
    h.client(subs);
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"],\"ldm\":true} \r\n",
    );
    let (e2, _) = dial_of(&a).expect("dial");
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n");
    h.upstream(1, b"PONG\r\n");
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    h
}

fn unsub_sent(a: &[Action]) -> bool {
    String::from_utf8(to_upstream(a)).unwrap().contains("UNSUB")
}

#[test]
fn the_old_link_keeps_its_subscriptions_until_the_new_one_delivers_a_copy() {
    let mut h = switched_to_b(b"SUB foo 1\r\n");
    // A keeps delivering; B's interest has not reached the publisher yet.
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\n");
    let settle = h.now + DEFAULT_SETTLE;
    h.now = settle + Duration::from_millis(10);
    h.s.handle_timeout(h.now);
    assert!(
        !unsub_sent(&h.actions()),
        "no proof yet: A stays subscribed"
    );
    assert!(h.s.poll_timeout().unwrap() > h.now);
    // B's copy of m1 proves it: A's UNSUBs go at once.
    let a = h.upstream(2, b"MSG foo 1 2\r\nm1\r\n");
    assert!(unsub_sent(&a), "{a:?}");
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))));
    assert_eq!(to_client(&a), b"", "m1 once: A's copy went out already");
}

#[test]
fn without_a_copy_the_old_link_is_retired_after_the_proof_wait() {
    let mut h = switched_to_b(b"SUB foo 1\r\nSUB work q 2\r\n");
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\nMSG work 2 2\r\nw1\r\n");
    let settle = h.now + DEFAULT_SETTLE;
    let mut unsub_at = None;
    while unsub_at.is_none() {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if unsub_sent(&h.actions()) {
            unsub_at = Some(h.now);
        }
    }
    // foo was never proved; the queue group `work` cannot be and does not count.
    assert_eq!(unsub_at, Some(settle + dedup::PROOF_WAIT));
}

#[test]
fn a_queue_group_alone_is_retired_after_the_settle_delay() {
    let mut h = switched_to_b(b"SUB work q 2\r\n");
    h.upstream(1, b"MSG work 2 2\r\nw1\r\n");
    let settle = h.now + DEFAULT_SETTLE;
    h.now = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(h.now);
    assert!(unsub_sent(&h.actions()));
    assert!(h.now <= settle);
}
