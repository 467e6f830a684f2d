//! The consumer away (no leader, R1 node down, a server that never answers): probes,
//! heartbeats toward the client, no-wait requests and the credit an end status leaves.

use super::*;

#[test]
fn while_the_consumer_is_away_the_client_gets_heartbeats_and_probes_are_bounded() {
    // nats.js consume: 5 s expiry, 2.5 s heartbeat. The R1 consumer's node is away:
    // every probe gets a 503 (2.15).
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, JS_BODY, t0);
    assert_eq!(t.on_message(&status("1", "503"), t0), Shield::Hide);
    let mut probes = 0;
    let mut beats = Vec::new();
    let mut now = t0;
    while let Some(at) = t
        .poll_timeout(true)
        .filter(|&at| at < t0 + Duration::from_millis(4900))
    {
        now = at;
        for a in t.on_timeout(at, true) {
            match a {
                PullAction::Reissue(_) => {
                    probes += 1;
                    assert_eq!(t.on_message(&status("1", "503"), at), Shield::Hide);
                }
                PullAction::ToClient(b) => {
                    let s = String::from_utf8_lossy(&b).into_owned();
                    assert!(
                        s.starts_with("HMSG _INBOX.a 1 ")
                            && s.contains("\r\nNATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0\r\n\r\n"),
                        "{s}"
                    );
                    beats.push(at - t0);
                }
            }
        }
    }
    assert!(now > t0 + Duration::from_secs(4));
    // A 503 is answered at once: one probe per PROBE_INTERVAL while it lasts.
    let most = (4900 / PROBE_INTERVAL.as_millis()) as usize;
    assert!(
        (most * 8 / 10..=most).contains(&probes),
        "{probes} probes in 4.9 s"
    );
    assert_eq!(
        beats,
        [Duration::from_millis(2500)],
        "one heartbeat per 2.5 s"
    );
    // At the client's deadline: the server's 408, made by the proxy, with the credit
    // (the probes still get their 503s meanwhile).
    let mut c = Vec::new();
    while let Some(at) = t
        .poll_timeout(true)
        .filter(|&at| at <= t0 + Duration::from_secs(5))
    {
        for a in t.on_timeout(at, true) {
            match a {
                PullAction::Reissue(_) => {
                    let _ = t.on_message(&status("1", "503"), at);
                }
                PullAction::ToClient(b) => c.push(String::from_utf8_lossy(&b).into_owned()),
            }
        }
    }
    let ends: Vec<&String> = c.iter().filter(|m| m.contains("408")).collect();
    assert_eq!(ends.len(), 1, "{c:?}");
    assert!(ends[0].contains(
        "408 Request Timeout\r\nNats-Pending-Messages: 256\r\nNats-Pending-Bytes: 0\r\n"
    ));
    assert!(t.is_empty());
}

/// cnats 3.4 `Fetch(64, 1 s)` while its R1 consumer is away (2.15: every placement gets a
/// `503`): the proxy's `408` comes before the client's deadline, so that the client's own
/// timer does not end the request first and leave the `408` to its next request.
#[test]
fn the_proxys_408_comes_before_the_clients_deadline() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":64,"expires":998000000}"#, t0);
    assert_eq!(t.on_message(&status("1", "503"), t0), Shield::Hide);
    let deadline = t0 + Duration::from_millis(998);
    let mut ended = Vec::new();
    while let Some(at) = t.poll_timeout(true).filter(|&at| at <= deadline) {
        for a in t.on_timeout(at, true) {
            match a {
                PullAction::Reissue(_) => {
                    assert_eq!(t.on_message(&status("1", "503"), at), Shield::Hide);
                }
                PullAction::ToClient(b) => {
                    let s = String::from_utf8_lossy(&b).into_owned();
                    assert!(s.contains("408 Request Timeout"), "{s}");
                    ended.push(at);
                }
            }
        }
    }
    assert_eq!(ended, [deadline - EXPIRE_LEAD]);
    assert!(t.is_empty());
    // A short request ends a tenth of its expiry early.
    request(&mut t, br#"{"batch":1,"expires":100000000}"#, t0);
    assert_eq!(t.on_message(&status("1", "503"), t0), Shield::Hide);
    let out = run_until(&mut t, t0 + Duration::from_millis(89), true);
    assert!(client(&out).is_empty());
    let out = run_until(&mut t, t0 + Duration::from_millis(90), true);
    assert_eq!(client(&out).len(), 1);
}

#[test]
fn on_a_server_that_never_answers_probes_go_every_expiry_plus_grace() {
    // nats-server 2.9: a pull to an unavailable consumer gets no answer at all.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, t0);
    t.all_lost(t0);
    let out = run_until(&mut t, t0 + Duration::from_secs(6), true);
    let n = upstream(&out).len();
    let cycle = PROBE_EXPIRES + PROBE_GRACE;
    let want = (Duration::from_secs(6).as_millis() / cycle.as_millis()) as usize + 1;
    assert_eq!(n, want, "one probe per {cycle:?}");
    assert!(client(&out).is_empty(), "Vector asked for no heartbeat");
    // The consumer comes back: the next probe lands and delivers; the rest goes full.
    let at = t.poll_timeout(true).unwrap();
    let up = upstream(&t.on_timeout(at, true));
    assert_eq!(up.len(), 1);
    assert_eq!(t.on_message(&delivery("1", 7), at), Shield::Forward);
    let out = run_until(&mut t, at + PROBE_EXPIRES + PROBE_GRACE, true);
    let up = upstream(&out);
    assert_eq!(up.len(), 1);
    assert_eq!(body_of(&up[0])["batch"], 199);
    assert!(body_of(&up[0])["expires"].as_u64().unwrap() > 20_000_000_000);
}

#[test]
fn without_an_upstream_nothing_is_placed_but_the_client_is_kept_alive() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, JS_BODY, t0);
    t.all_lost(t0);
    let out = run_until(&mut t, t0 + Duration::from_millis(4000), false);
    assert!(upstream(&out).is_empty());
    assert_eq!(client(&out).len(), 1, "a heartbeat at 2.5 s");
    // A link again: probed at once.
    let out = t.on_timeout(t0 + Duration::from_millis(4000), true);
    assert_eq!(upstream(&out).len(), 1);
}

#[test]
fn no_wait_requests_are_answered_no_messages_when_the_consumer_is_away() {
    let now = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":5,"no_wait":true}"#, now);
    assert_eq!(t.on_message(&status("1", "503"), now), Shield::Hide);
    let out = t.on_timeout(now, false);
    let c = client(&out);
    assert_eq!(
        c,
        ["HMSG _INBOX.a 1 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n"]
    );
    assert!(t.is_empty());
    // And the normal end of a no_wait fetch passes.
    request(&mut t, br#"{"batch":5,"no_wait":true}"#, now);
    assert_eq!(
        t.on_message(&status("1", "404 No Messages"), now),
        Shield::Forward
    );
    assert!(t.is_empty());
}

#[test]
fn heartbeats_the_client_did_not_ask_for_are_swallowed() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, t0);
    let hb = status(
        "1",
        "100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0",
    );
    assert_eq!(
        t.on_message(&hb, t0 + Duration::from_secs(5)),
        Shield::Swallow
    );
    let mut t = PullTracker::default();
    request(&mut t, JS_BODY, t0);
    assert_eq!(t.on_message(&hb, t0), Shield::Forward);
}

#[test]
fn statuses_find_their_request_by_reply_on_a_wildcard_inbox() {
    let now = Instant::now();
    let mut t = PullTracker::default();
    t.on_request(API, b"_INBOX.w.1", "9".into(), None, VECTOR_BODY, now);
    t.on_request(API, b"_INBOX.w.2", "9".into(), None, VECTOR_BODY, now);
    let end = status_on("_INBOX.w.2", "9", "408 Request Timeout");
    assert_eq!(t.on_message(&end, now), Shield::Forward);
    assert_eq!(t.len(), 1);
    let moved = status_on("_INBOX.w.1", "9", "409 Leadership Change");
    assert_eq!(t.on_message(&moved, now), Shield::Hide);
    let up = upstream(&t.on_timeout(now, true));
    assert!(String::from_utf8_lossy(&up[0])
        .starts_with("PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.w.1 "));
}

#[test]
fn probe_bounds_hold_with_many_requests_on_one_inbox() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    for _ in 0..5 {
        request(&mut t, VECTOR_BODY, t0);
    }
    t.all_lost(t0);
    // Unanswered probes (nats-server 2.9: a pull to an unavailable consumer gets no
    // answer) go one at a time per inbox, each PROBE_EXPIRES + PROBE_GRACE long.
    let out = run_until(&mut t, t0 + Duration::from_secs(3), true);
    let n = upstream(&out).len();
    let bound = (Duration::from_secs(3).as_millis() / (PROBE_EXPIRES + PROBE_GRACE).as_millis())
        as usize
        + 1;
    assert!(n <= bound, "one probe out at a time per inbox: {n} in 3 s");
    assert!(t.poll_timeout(true).unwrap() > t0 + Duration::from_secs(3));
}

#[test]
fn a_placement_later_in_the_expiry_never_carries_a_heartbeat_too_large_for_it() {
    // async-nats messages(): 30 s with 15 s; moved after 20 s, 10 s left.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    let body = br#"{"batch":200,"expires":30000000000,"idle_heartbeat":15000000000}"#;
    request(&mut t, body, t0);
    let t1 = t0 + Duration::from_secs(20);
    let _ = t.on_message(&status("1", "409 Server Shutdown"), t1);
    t.on_timeout(t1, true);
    let _ = t.on_message(&status("1", "100 Idle Heartbeat"), t1);
    let t2 = t1 + PROBE_EXPIRES;
    let _ = t.on_message(&status("1", "408 Request Timeout"), t2);
    let up = upstream(&t.on_timeout(t2, true));
    let v = body_of(&up[0]);
    let (exp, hb) = (
        v["expires"].as_u64().unwrap(),
        v["idle_heartbeat"].as_u64().unwrap(),
    );
    assert!(hb * 2 <= exp, "{hb} x 2 > {exp}");
    // Refused anyway (older server rules): ours, so swallowed and placed without one.
    let refused = status("1", "400 Bad Request - heartbeat value too large");
    assert_eq!(t.on_message(&refused, t2), Shield::Hide);
}

#[test]
fn an_unanswered_no_wait_request_without_expiry_is_forgotten_quietly() {
    // cnats' first Fetch request: {"no_wait":true,"batch":64}, lost with its link.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"no_wait":true,"batch":64}"#, t0);
    let out = run_until(&mut t, t0 + Duration::from_secs(5), true);
    assert!(out.is_empty(), "{out:?}");
    assert!(t.is_empty());
}

#[test]
fn a_lost_requests_time_until_it_is_served_again_is_reported_once() {
    let replaced =
        |t: &mut PullTracker| std::iter::from_fn(|| t.poll_replaced()).collect::<Vec<_>>();
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, t0);
    assert_eq!(t.unplaced(), 0);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(
        t.on_message(&status("1", "409 Server Shutdown"), t1),
        Shield::Hide
    );
    assert_eq!(t.unplaced(), 1, "lost: unplaced");
    // The probe is not yet the end of the gap, and the request still counts as
    // unplaced while it only probes.
    assert_eq!(upstream(&t.on_timeout(t1, true)).len(), 1);
    assert!(replaced(&mut t).is_empty());
    assert_eq!(t.unplaced(), 1, "probing");
    // The consumer answers the probe: served again, reported once.
    let t2 = t1 + PROBE_EXPIRES;
    let end = "408 Request Timeout\r\nNats-Pending-Messages: 200\r\nNats-Pending-Bytes: 0";
    assert_eq!(t.on_message(&status("1", end), t2), Shield::Swallow);
    assert_eq!(replaced(&mut t), [t2 - t1]);
    assert_eq!(
        upstream(&t.on_timeout(t2, true)).len(),
        1,
        "the full placement"
    );
    assert!(replaced(&mut t).is_empty(), "not twice");
    assert_eq!(t.unplaced(), 0, "placed in full");
    // Lost again later with its link: the clock starts at that loss; a delivery on the
    // probe ends the gap.
    let t3 = t2 + Duration::from_secs(2);
    t.all_lost(t3);
    assert_eq!(t.unplaced(), 1);
    assert_eq!(upstream(&t.on_timeout(t3, true)).len(), 1);
    let t4 = t3 + Duration::from_millis(30);
    assert_eq!(t.on_message(&delivery("1", 1), t4), Shield::Forward);
    assert_eq!(replaced(&mut t), [t4 - t3]);
    run_until(&mut t, t4 + PROBE_EXPIRES + PROBE_GRACE, true);
    assert!(replaced(&mut t).is_empty());
    assert_eq!(t.unplaced(), 0);
}

#[test]
fn an_end_status_closes_the_request_it_answers_on_a_shared_inbox() {
    // nats.go: Fetch returned at its first message and left its waiting request (1 s)
    // behind; the next Fetch's no_wait request is out beside it on the same inbox.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":63,"expires":990000000}"#, t0);
    let t1 = t0 + Duration::from_millis(10);
    request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        t1,
    );
    // The one-shot's delivery and its 404 (2.15; 2.9 ends it with a 408) end the
    // no_wait request, not the older waiting one.
    assert_eq!(t.on_message(&delivery("1", 7), t1), Shield::Forward);
    let end = status("1", "404 No Messages");
    assert_eq!(t.on_message(&end, t1), Shield::Forward);
    let waiting = [PullPhase::Live { placed: t0 }];
    assert_eq!(t.phases(b"1"), waiting);
    request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        t1,
    );
    let end = status(
        "1",
        "408 Request Timeout\r\nNats-Pending-Messages: 63\r\nNats-Pending-Bytes: 0",
    );
    assert_eq!(t.on_message(&end, t1), Shield::Forward);
    assert_eq!(t.phases(b"1"), waiting);
    // The waiting request is still watched: its heartbeats keep it placed, and their
    // absence would be noticed; nothing is answered for it now.
    assert!(run_until(&mut t, t1 + Duration::from_millis(100), true).is_empty());
    // A 408 at its deadline is its expiry, even with a newer no_wait request out.
    let t2 = t0 + Duration::from_millis(985);
    request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        t2,
    );
    let hb = status(
        "1",
        "100 Idle Heartbeat\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 7",
    );
    assert_eq!(t.on_message(&hb, t2), Shield::Swallow);
    assert_eq!(t.on_message(&end, t2), Shield::Forward);
    assert_eq!(t.phases(b"1"), [PullPhase::Live { placed: t2 }]);
}

#[test]
fn a_lost_no_wait_request_with_an_expiry_is_placed_again_not_answered() {
    // nats.go's first Fetch request. The server holds it like a waiting one, so lost
    // with its consumer it is placed again; a 404 from the proxy would send the client
    // to its waiting request while this one may still end, and nats.go reports a 404
    // that reaches its waiting request as an error.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    let body = br#"{"batch":64,"expires":990000000,"no_wait":true}"#;
    request(&mut t, body, t0);
    let lost = t0 + UPSTREAM_HB_MAX * 2 + HB_SLACK;
    let out = run_until(&mut t, lost, true);
    assert!(client(&out).is_empty(), "{out:?}");
    let probe = upstream(&out);
    assert_eq!(probe.len(), 1, "{out:?}");
    assert_eq!(body_of(&probe[0])["no_wait"], true);
    // Unanswered to the end (2.9 never answers a pull to an absent consumer): the
    // server's own end of such a request, 408, before the client's deadline.
    let out = run_until(&mut t, t0 + Duration::from_secs(2), true);
    let c = client(&out);
    assert_eq!(c.len(), 1, "{out:?}");
    assert!(c[0].contains("408 Request Timeout"), "{c:?}");
    assert!(t.is_empty());
}

#[test]
fn a_probe_that_serves_a_no_wait_request_ends_it() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        t0,
    );
    assert_eq!(
        t.on_message(&status("1", "409 Server Shutdown"), t0),
        Shield::Hide
    );
    let out = run_until(&mut t, t0, true);
    assert_eq!(upstream(&out).len(), 1, "probed: {out:?}");
    // The probe gets a message, then the end a one-shot gets: the client's answer.
    let t1 = t0 + Duration::from_millis(20);
    assert_eq!(t.on_message(&delivery("1", 9), t1), Shield::Forward);
    assert_eq!(
        t.on_message(&status("1", "404 No Messages"), t1),
        Shield::Forward
    );
    assert!(t.is_empty());
    // A probe that got nothing ends at its expiry: swallowed, the rest placed in full.
    request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        t1,
    );
    assert_eq!(
        t.on_message(&status("1", "409 Server Shutdown"), t1),
        Shield::Hide
    );
    assert_eq!(upstream(&run_until(&mut t, t1, true)).len(), 1);
    let t2 = t1 + PROBE_EXPIRES;
    let end = status(
        "1",
        "408 Request Timeout\r\nNats-Pending-Messages: 64\r\nNats-Pending-Bytes: 0",
    );
    assert_eq!(t.on_message(&end, t2), Shield::Swallow);
    let full = upstream(&run_until(&mut t, t2, true));
    assert_eq!(full.len(), 1);
    assert_eq!(body_of(&full[0])["batch"], 64);
}

#[test]
fn the_credit_left_of_an_end_status_counts_hidden_deliveries() {
    use super::request::with_hidden_credit;
    let status = |h: &str| encode::msg(b"_INBOX.a", b"1", None, Some(h.as_bytes()), b"");
    let m = msg(&status(
        "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages:5\r\nNats-Pending-Bytes: 0\r\n\r\n",
    ));
    assert_eq!(
        with_hidden_credit(&m, 2, 0),
        Some(status(
            "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\nNats-Pending-Bytes: 0\r\n\r\n"
        ))
    );
    // No credit headers (404), or a value that is not a number: nothing to amend.
    let m = msg(&status("NATS/1.0 404 No Messages\r\n\r\n"));
    assert_eq!(with_hidden_credit(&m, 2, 0), None);
    let m = msg(&status(
        "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: x\r\n\r\n",
    ));
    assert_eq!(with_hidden_credit(&m, 2, 0), None);
}
