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

#[test]
fn a_hedge_right_after_a_migration_keeps_matching_the_new_links_late_copies() {
    let mut h = migrated_with_b_behind();
    // B is slow to answer its PING: a hedge, then B answers and the standby goes.
    let dial = loop {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if let Some(d) = dial_of(&h.actions()) {
            break d;
        }
    };
    assert_eq!(h.s.stats().hedges, 1);
    let a = h.upstream(2, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(dial.0)), "{a:?}");
    // B's late copy of m2: the client had it from A.
    assert_eq!(to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\n")), b"");
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
    assert_eq!(h.s.stats().duplicates_suppressed, 2);
}

#[test]
fn a_standby_promoted_right_after_a_migration_gives_nothing_of_the_old_link_twice() {
    let mut h = migrated_with_b_behind();
    let (e3, c) = loop {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if let Some(d) = dial_of(&h.actions()) {
            break d;
        }
    };
    assert_ne!(c, "x:1", "another node than B");
    h.s.handle_upstream_connected(e3, h.now);
    h.upstream(e3.0, INFO_B);
    h.upstream(e3.0, b"PONG\r\nPONG\r\n");
    // C's window starts at m2, which only A delivered; B delivers nothing more.
    assert_eq!(
        to_client(&h.upstream(e3.0, b"MSG foo 1 2\r\nm2\r\nMSG foo 1 2\r\nm3\r\n")),
        b""
    );
    // B found dead: C is promoted; its m2 is A's, m3 is new.
    let mut out = Vec::new();
    while h.s.stats().failovers == 0 {
        h.now = h.s.poll_timeout().expect("a timer");
        h.s.handle_timeout(h.now);
        out.extend(to_client(&h.actions()));
    }
    assert_eq!(h.s.upstream_addr(), Some(c.as_str()));
    assert_eq!(String::from_utf8(out).unwrap(), "MSG foo 1 2\r\nm3\r\n");
}

#[test]
fn a_new_primary_is_not_suspect_for_a_ping_it_owed_during_the_migration() {
    let mut h = switched_to_b(b"SUB foo 1\r\n");
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\n");
    // B's keepalive PING goes unanswered past hedge_after while A waits for B's proof.
    let until = h.now + HEDGE_KEEPALIVE + DEFAULT_HEDGE_AFTER + Duration::from_millis(100);
    while h.now < until {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        assert!(dial_of(&h.actions()).is_none(), "no hedge while migrating");
    }
    assert!(unsub_sent(&h.upstream(2, b"MSG foo 1 2\r\nm1\r\n")));
    // A answers its keepalive PING, then the one after the UNSUBs: retired.
    let a = h.upstream(1, b"PONG\r\nPONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    // Steady on B from now: its PING counts as unanswered from here.
    let steady = h.now;
    let hedged_at = loop {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if dial_of(&h.actions()).is_some() {
            break h.now;
        }
    };
    assert_eq!(hedged_at, steady + DEFAULT_HEDGE_AFTER);
}
