//! Hedging: a primary slow to answer a PING gets a standby on another node, dropped when
//! the primary answers, promoted when it is found dead; the client gets each message
//! once either way.

use super::harness::*;
use super::*;

/// Connected, subscribed to `foo`, the keepalive PING out and unanswered: the hedge's
/// standby (epoch 2) has been dialled and brought up, its replay registered.
fn hedging() -> H {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    h.actions();
    let ping = h.s.poll_timeout().unwrap();
    assert_eq!(ping, h.now + HEDGE_KEEPALIVE, "idle links are PINGed often");
    h.now = ping;
    h.s.handle_timeout(h.now);
    assert_eq!(to_upstream(&h.actions()), b"PING\r\n");
    // A message before the node froze: delivered as usual.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm1\r\n")),
        b"MSG foo 1 2\r\nm1\r\n"
    );
    let (e2, addr) = loop {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if let Some(d) = dial_of(&h.actions()) {
            break d;
        }
        assert!(
            h.now < ping + DEFAULT_HEDGE_AFTER,
            "no standby by hedge_after"
        );
    };
    assert_eq!(h.now, ping + DEFAULT_HEDGE_AFTER);
    assert_eq!((e2, addr.as_str()), (Epoch(2), "x:1"), "another node");
    assert_eq!(h.s.stats().hedges, 1);
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    let a = h.upstream(2, b"PONG\r\nPONG\r\n");
    assert!(
        !a.contains(&Action::CloseUpstream(Epoch(1))),
        "the primary stays"
    );
    h
}

#[test]
fn a_primary_that_answers_drops_the_standby_and_what_it_delivered() {
    let mut h = hedging();
    // Both deliver m2; the standby's copy is held, the primary's (late) goes out.
    assert_eq!(to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\n")), b"");
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm2\r\n")),
        b"MSG foo 1 2\r\nm2\r\n"
    );
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(2))), "{a:?}");
    assert_eq!(to_client(&a), b"");
    assert_eq!((h.s.stats().failovers, h.s.stats().migrations), (0, 0));
    assert_eq!(h.s.upstream_addr(), Some("127.0.0.1:4222"));
    // Traffic goes on on the primary, on the fast path again.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
}

#[test]
fn a_primary_found_dead_promotes_the_standby_with_nothing_lost_or_twice() {
    let mut h = hedging();
    // The primary delivers m2, then freezes; the standby delivers m2 and m3, held while
    // the primary might still deliver them.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm2\r\n")),
        b"MSG foo 1 2\r\nm2\r\n"
    );
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\nMSG foo 1 2\r\nm3\r\n")),
        b""
    );
    // Stale: ping_interval × 2 after the PING.
    let mut closed = false;
    for _ in 0..20 {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        let a = h.actions();
        if a.contains(&Action::CloseUpstream(Epoch(1))) {
            assert_eq!(
                to_client(&a),
                b"MSG foo 1 2\r\nm3\r\n",
                "m2 was delivered already"
            );
            closed = true;
            break;
        }
    }
    assert!(closed, "the frozen primary is found dead");
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    assert_eq!(h.s.stats().failovers, 1);
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm4\r\n")),
        b"MSG foo 1 2\r\nm4\r\n"
    );
}

#[test]
fn no_hedge_when_it_is_off_or_the_primary_answers_in_time() {
    let mut h = H::connected_with(H::with(SessionConfig {
        hedge_after: Duration::ZERO,
        ..SessionConfig::default()
    }));
    h.now = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(h.now);
    let stale = h.now + DEFAULT_PING_INTERVAL * 2;
    while h.now < stale {
        assert!(dial_of(&h.actions()).is_none(), "no standby before stale");
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
    }
    assert_eq!(h.s.stats().hedges, 0);
    let mut h = H::connected();
    h.now = h.s.poll_timeout().unwrap();
    h.s.handle_timeout(h.now);
    h.actions();
    // A 500 ms stall: the PONG comes before hedge_after.
    h.now += Duration::from_millis(500);
    h.upstream(1, b"PONG\r\n");
    h.now += HEDGE_KEEPALIVE - Duration::from_millis(500);
    h.s.handle_timeout(h.now);
    assert!(dial_of(&h.actions()).is_none());
    assert_eq!(h.s.stats().hedges, 0);
}
