//! Hedging: a primary slow to answer a PING gets a standby on another node, dropped when
//! the primary answers, promoted when it is found dead. Meanwhile each message goes out
//! from whichever link delivers it first; the client gets each message once either way.

use super::harness::*;
use super::*;

/// Connected, subscribed to `foo`, the keepalive PING out and unanswered: the hedge's
/// standby (epoch 2) has been dialled and brought up, its replay registered.
fn hedging() -> H {
    hedging_after(b"").0
}

/// As [`hedging`], the client having sent `before` (after its SUB) while the primary
/// still answered; also what the standby's INFO made the session write.
fn hedging_after(before: &[u8]) -> (H, Vec<Action>) {
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    h.client(before);
    h.actions();
    let start = h.now;
    let ping = loop {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        if to_epoch(&h.actions(), Epoch(1)).contains("PING") {
            break h.now;
        }
    };
    if before.is_empty() {
        assert_eq!(ping, start + HEDGE_KEEPALIVE, "idle links are PINGed often");
    }
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
    let standby_up = h.upstream(2, INFO_B);
    let a = h.upstream(2, b"PONG\r\nPONG\r\n");
    assert!(
        !a.contains(&Action::CloseUpstream(Epoch(1))),
        "the primary stays"
    );
    (h, standby_up)
}

#[test]
fn a_primary_that_answers_ends_the_hedge_with_nothing_twice() {
    let mut h = hedging();
    // Hedged delivery: the standby's m2 goes out at once; the primary's copy, delivered
    // when it thaws, is dropped.
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\n")),
        b"MSG foo 1 2\r\nm2\r\n"
    );
    assert_eq!(to_client(&h.upstream(1, b"MSG foo 1 2\r\nm2\r\n")), b"");
    // What only the primary had (published before the standby's interest) comes late.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 3\r\nm1b\r\n")),
        b"MSG foo 1 3\r\nm1b\r\n"
    );
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(2))), "{a:?}");
    assert_eq!(to_client(&a), b"");
    assert_eq!((h.s.stats().failovers, h.s.stats().migrations), (0, 0));
    assert_eq!(h.s.upstream_addr(), Some("127.0.0.1:4222"));
    // The primary's copy of m3 comes after its PONG: still dropped.
    assert_eq!(to_client(&h.upstream(1, b"MSG foo 1 2\r\nm3\r\n")), b"");
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm4\r\n")),
        b"MSG foo 1 2\r\nm4\r\n"
    );
    assert_eq!(h.s.stats().duplicates_suppressed, 2);
    // Caught up: the overlap ends after the settle delay; the fast path again.
    h.now += DEFAULT_SETTLE;
    h.s.handle_timeout(h.now);
    assert!(!h.s.overlap.filters(Epoch(1)), "no overlap left");
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm5\r\n")),
        b"MSG foo 1 2\r\nm5\r\n"
    );
}

#[test]
fn a_primary_found_dead_promotes_the_standby_with_nothing_lost_or_twice() {
    let mut h = hedging();
    // The primary delivers m2, then freezes; the standby's m2 is dropped, its m3 goes
    // out at once.
    assert_eq!(
        to_client(&h.upstream(1, b"MSG foo 1 2\r\nm2\r\n")),
        b"MSG foo 1 2\r\nm2\r\n"
    );
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\nMSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
    // Stale: ping_interval × 2 after the PING.
    let mut closed = false;
    for _ in 0..20 {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
        let a = h.actions();
        if a.contains(&Action::CloseUpstream(Epoch(1))) {
            assert_eq!(to_client(&a), b"", "nothing was held back");
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
    assert_eq!(h.s.stats().duplicates_suppressed, 1);
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
    // C's window starts at m2, which only A delivered (dropped); m3 is new and goes out
    // at once (hedged delivery); B delivers nothing more.
    let mut out = to_client(&h.upstream(e3.0, b"MSG foo 1 2\r\nm2\r\nMSG foo 1 2\r\nm3\r\n"));
    // B found dead: C is promoted, with nothing more to give.
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

/// What went upstream on `epoch`.
fn to_epoch(a: &[Action], epoch: Epoch) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .filter_map(|a| match a {
            Action::ToUpstream(e, b) if *e == epoch => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn while_hedging_pulls_go_through_the_standby_once_and_acks_through_both() {
    let mut h = hedging();
    let a = h.client(b"SUB _INBOX.x.1 2\r\n");
    assert!(to_epoch(&a, Epoch(1)).contains("SUB _INBOX.x.1 2"), "{a:?}");
    assert!(to_epoch(&a, Epoch(2)).contains("SUB _INBOX.x.1 2"), "{a:?}");
    let body = br#"{"batch":10,"expires":30000000000}"#;
    let pull = [
        format!(
            "PUB $JS.API.CONSUMER.MSG.NEXT.S.C _INBOX.x.1 {}\r\n",
            body.len()
        )
        .as_bytes(),
        body,
        b"\r\n",
    ]
    .concat();
    let a = h.client(&pull);
    assert!(to_epoch(&a, Epoch(2)).contains("MSG.NEXT.S.C"), "{a:?}");
    assert!(!to_epoch(&a, Epoch(1)).contains("MSG.NEXT"), "once: {a:?}");
    // Its delivery through the standby goes out at once.
    let d = b"MSG logs.a 2 $JS.ACK.S.C.1.7.7.1700000000000000000.0 2\r\nd1\r\n";
    assert_eq!(to_client(&h.upstream(2, d)), d);
    let a = h.client(b"PUB $JS.ACK.S.C.1.7.7.1700000000000000000.0 0\r\n\r\n");
    assert!(
        to_epoch(&a, Epoch(1)).contains("$JS.ACK.S.C.1.7.7"),
        "{a:?}"
    );
    assert!(
        to_epoch(&a, Epoch(2)).contains("$JS.ACK.S.C.1.7.7"),
        "{a:?}"
    );
    // The frozen primary's copy of the delivery, when it thaws: dropped.
    assert_eq!(to_client(&h.upstream(1, d)), b"");
    // Steady again (the primary answered): pulls and acks go to the primary only.
    h.upstream(1, b"PONG\r\n");
    let a = h.client(&pull);
    assert!(to_epoch(&a, Epoch(2)).is_empty(), "{a:?}");
}

#[test]
fn a_pull_the_suspect_primary_holds_goes_again_through_the_standby() {
    let body = br#"{"batch":10,"expires":30000000000}"#;
    let pull = [
        b"SUB _INBOX.y.1 2\r\n".as_slice(),
        format!(
            "PUB $JS.API.CONSUMER.MSG.NEXT.S.C _INBOX.y.1 {}\r\n",
            body.len()
        )
        .as_bytes(),
        body,
        b"\r\n",
    ]
    .concat();
    let (h, standby_up) = hedging_after(&pull);
    let on_b = to_epoch(&standby_up, Epoch(2));
    let (sub, next) = (on_b.find("SUB _INBOX.y.1 2"), on_b.find("MSG.NEXT.S.C"));
    assert!(sub.is_some() && next > sub, "behind its SUB: {on_b}");
    assert!(h.s.stats().pulls_reissued >= 1);
}
