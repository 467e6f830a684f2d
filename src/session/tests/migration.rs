//! Lame-duck migration, failover, outage, the overlap and its proof.

use super::harness::*;
use super::*;

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
    let lost = h.now;
    assert!(h.s.in_outage());
    let a = h.actions();
    let (e2, _) = dial_of(&a).expect("redial");
    // Meanwhile the client's PINGs are answered and its publishes buffered.
    let a = h.client(b"PING\r\nPUB acks 1\r\nb\r\n");
    h.now += Duration::from_millis(40);
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
    assert!(!h.s.in_outage());
    let events: Vec<_> = std::iter::from_fn(|| h.s.poll_event()).collect();
    assert!(
        events.contains(&SessionEvent::OutageEnded(h.now - lost)),
        "{events:?}"
    );
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
    let events: Vec<_> = std::iter::from_fn(|| h.s.poll_event()).collect();
    assert!(
        events.contains(&SessionEvent::OutageEnded(DEFAULT_MAX_OUTAGE)),
        "the outage that closed the client is reported: {events:?}"
    );
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
        up.contains(&format!(
            "\"idle_heartbeat\":{}",
            crate::session::jetstream::request::UPSTREAM_HB_MAX.as_nanos()
        )),
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
    assert_eq!(h.s.stats().statuses_shielded_total(), 1);
    assert_eq!(h.s.stats().statuses_shielded, [0, 1], "counted under 503");
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
    // 1,000 sessions of one process moving at once: each waits its share of the spread.
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
        h.s.set_peers_moving(999);
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
fn a_lone_session_dials_at_once_and_a_few_spread_over_a_short_window() {
    let up = |peers| {
        let mut h = H::with(SessionConfig::default()).up(
            b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"]} \r\n",
            b"CONNECT {\"verbose\":false}\r\n",
        );
        h.s.set_peers_moving(peers);
        let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"ldm\":true} \r\n");
        (dial_of(&a).is_some(), h.s.poll_timeout().map(|t| t - h.now))
    };
    // A sidecar's only client: no spread at all.
    assert!(up(0).0, "a lone session dials at once");
    // 10 moving together: within 10 / MIGRATION_DIAL_RATE.
    for _ in 0..20 {
        let (now, wait) = up(9);
        let bound = Duration::from_secs_f64(10.0 / MIGRATION_DIAL_RATE);
        assert!(now || wait.is_some_and(|w| w <= bound), "{wait:?}");
    }
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
fn without_a_copy_the_old_link_keeps_the_subscription_until_its_server_closes_it() {
    // foo carried traffic, idle carried none: neither is proved. The queue group `work`
    // can prove nothing and leaves A at the settle delay.
    let mut h = switched_to_b(b"SUB foo 1\r\nSUB work q 2\r\nSUB idle 3\r\n");
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\nMSG work 2 2\r\nw1\r\n");
    let settle = h.now + DEFAULT_SETTLE;
    h.now = h.s.poll_timeout().unwrap();
    assert!(h.now <= settle);
    h.s.handle_timeout(h.now);
    let up = String::from_utf8(to_upstream(&h.actions())).unwrap();
    assert_eq!(up, "UNSUB 2\r\nPING\r\n", "only the queue group leaves A");
    // No timer gives up on the proof.
    assert_eq!(h.s.drain_due(), None);
    // B's copies wait for A's: a message on idle from B only (its interest reached the
    // publisher before A's UNSUB would have) is held, A's copy goes out.
    h.upstream(1, b"PONG\r\n");
    assert_eq!(
        to_client(&h.upstream(1, b"MSG idle 3 2\r\ni1\r\n")),
        b"MSG idle 3 2\r\ni1\r\n"
    );
    // A's server closes A (lame duck): what B held is released minus A's copies.
    let a = h.upstream(2, b"MSG idle 3 2\r\ni2\r\n");
    assert_eq!(to_client(&a), b"", "held while A may still deliver it");
    h.s.handle_upstream_lost(Epoch(1), h.now);
    let a = h.actions();
    assert_eq!(to_client(&a), b"MSG idle 3 2\r\ni2\r\n");
    assert!(!h.s.migrating());
}

#[test]
fn a_proved_subscription_leaves_the_old_link_alone_and_its_held_copies_go_out() {
    let mut h = switched_to_b(b"SUB foo 1\r\nSUB idle 2\r\n");
    h.now += DEFAULT_SETTLE;
    h.s.handle_timeout(h.now);
    assert!(!unsub_sent(&h.actions()), "both idle: both kept");
    // Traffic on foo through both links: B's copy proves foo, which alone leaves A.
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\n");
    let a = h.upstream(2, b"MSG foo 1 2\r\nm1\r\nMSG foo 1 2\r\nm2\r\n");
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert_eq!(up, "UNSUB 1\r\nPING\r\n");
    assert_eq!(to_client(&a), b"", "m2 held until A is done with foo");
    // The batch's PONG: A delivers nothing more on foo; B's m2 goes out, m1 once.
    let a = h.upstream(1, b"PONG\r\n");
    assert_eq!(to_client(&a), b"MSG foo 1 2\r\nm2\r\n");
    assert!(
        !a.contains(&Action::CloseUpstream(Epoch(1))),
        "idle still kept on A"
    );
    // From now on B's foo goes out at once.
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
    // The client unsubscribes idle: nothing is kept, A is retired.
    let a = h.client(b"UNSUB 2\r\n");
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(up.ends_with("PING\r\n"), "{up}");
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    assert!(!h.s.migrating());
}

#[test]
fn the_new_node_in_lame_duck_mode_ends_what_the_old_link_kept() {
    let mut h = switched_to_b(b"SUB idle 1\r\n");
    h.now += DEFAULT_SETTLE;
    h.s.handle_timeout(h.now);
    assert!(!unsub_sent(&h.actions()));
    let a = h.upstream(
        2,
        b"INFO {\"server_id\":\"B\",\"connect_urls\":[\"y:1\"],\"ldm\":true} \r\n",
    );
    let up = String::from_utf8(to_upstream(&a)).unwrap();
    assert!(up.contains("UNSUB 1\r\nPING\r\n"), "{up}");
    // A's PONG retires it and the next migration starts.
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    assert!(
        dial_of(&a).is_some() || h.s.poll_timeout().is_some(),
        "{a:?}"
    );
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

#[test]
fn a_node_lost_before_the_switch_is_a_failed_migration_after_it_a_failover_of_its_own() {
    // Before the switch: the leaving node closes while the new link is still coming up.
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\",\"127.0.0.1:4222\"],\"ldm\":true} \r\n");
    assert!(dial_of(&a).is_some());
    h.s.handle_upstream_lost(Epoch(1), h.now);
    h.actions();
    assert_eq!(
        (h.s.stats().failovers, h.s.stats().migrations_failed),
        (1, 1)
    );
    // After the switch: the new primary's loss is a plain failover.
    let mut h = H::connected();
    h.client(b"SUB foo 1\r\n");
    let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\",\"127.0.0.1:4222\"],\"ldm\":true} \r\n");
    let (e2, _) = dial_of(&a).expect("dial");
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n");
    h.upstream(1, b"PONG\r\n"); // the switch barrier
    assert_eq!(h.s.stats().migrations, 1);
    h.s.handle_upstream_lost(e2, h.now);
    h.actions();
    assert_eq!(
        (h.s.stats().failovers, h.s.stats().migrations_failed),
        (1, 0)
    );
}

#[test]
fn a_second_lame_duck_while_the_first_overlap_lingers_keeps_matching_its_late_copies() {
    let mut h = migrated_with_b_behind();
    // B, behind with m2, announces lame duck mode at once: a move to C begins.
    let a = h.upstream(
        2,
        b"INFO {\"server_id\":\"B\",\"connect_urls\":[\"y:1\"],\"ldm\":true} \r\n",
    );
    let (e3, addr) = dial_of(&a).expect("dial");
    assert_eq!(addr, "y:1");
    h.s.handle_upstream_connected(e3, h.now);
    h.upstream(
        e3.0,
        b"INFO {\"server_id\":\"C\",\"server_name\":\"n3\"} \r\n",
    );
    h.upstream(e3.0, b"PONG\r\nPONG\r\n");
    // B's late copy of m2 and C's: the client had it from A.
    assert_eq!(to_client(&h.upstream(2, b"MSG foo 1 2\r\nm2\r\n")), b"");
    assert_eq!(to_client(&h.upstream(e3.0, b"MSG foo 1 2\r\nm2\r\n")), b"");
    assert_eq!(
        to_client(&h.upstream(2, b"MSG foo 1 2\r\nm3\r\n")),
        b"MSG foo 1 2\r\nm3\r\n"
    );
    assert_eq!(h.s.stats().duplicates_suppressed, 2);
}
