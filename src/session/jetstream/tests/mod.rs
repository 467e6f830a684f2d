//! Unit tests of the pull tracker: one per status class and per phase transition.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::phase::{PullPhase, EXPIRE_LEAD, HB_SLACK, PROBE_EXPIRES, PROBE_GRACE, PROBE_INTERVAL};
use super::request::{parse_body, UPSTREAM_HB_MAX};
use super::*;
use crate::proto::{encode, Limits, Message, ServerDecoder, ServerOp};

fn msg(frame: &[u8]) -> Message {
    let mut d = ServerDecoder::new(Limits::upstream());
    let mut b = BytesMut::from(frame);
    match d.decode(&mut b) {
        Ok(Some(ServerOp::Msg(m))) => m,
        other => panic!("{other:?}"),
    }
}

fn status_on(reply: &str, sid: &str, line: &str) -> Message {
    let h = format!("NATS/1.0 {line}\r\n\r\n");
    msg(&encode::msg(
        reply.as_bytes(),
        sid.as_bytes(),
        None,
        Some(h.as_bytes()),
        b"",
    ))
}

fn status(sid: &str, line: &str) -> Message {
    status_on("_INBOX.a", sid, line)
}

fn delivery(sid: &str, n: u64) -> Message {
    let reply = format!("$JS.ACK.S.C.1.{n}.{n}.0.0");
    msg(&encode::msg(
        b"logs.v",
        sid.as_bytes(),
        Some(reply.as_bytes()),
        None,
        b"data",
    ))
}

const VECTOR_BODY: &[u8] = br#"{"batch":200,"expires":30000000000,"max_bytes":0,"min_pending":null,"min_ack_pending":null,"group":null}"#;
/// nats.js `consume({max_messages: 256, expires: 5000})`.
const JS_BODY: &[u8] =
    br#"{"batch":256,"max_bytes":0,"idle_heartbeat":2500000000,"expires":5000000000}"#;
const API: &[u8] = b"$JS.API.CONSUMER.MSG.NEXT.LOGS.CV";

fn body_of(frame: &[u8]) -> Value {
    let s = std::str::from_utf8(frame).unwrap();
    let body = s.split("\r\n").nth(1).unwrap();
    serde_json::from_str(body).unwrap()
}

fn upstream(actions: &[PullAction]) -> Vec<Bytes> {
    actions
        .iter()
        .filter_map(|a| match a {
            PullAction::Reissue(b) => Some(b.clone()),
            PullAction::ToClient(_) => None,
        })
        .collect()
}

fn client(actions: &[PullAction]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            PullAction::ToClient(b) => Some(String::from_utf8_lossy(b).into_owned()),
            PullAction::Reissue(_) => None,
        })
        .collect()
}

fn request(t: &mut PullTracker, body: &[u8], now: Instant) -> Option<Bytes> {
    t.on_request(API, b"_INBOX.a", "1".into(), None, body, now)
}

/// Runs every due step until `until`, as the driver would at each `poll_timeout`.
fn run_until(t: &mut PullTracker, until: Instant, up: bool) -> Vec<PullAction> {
    let mut out = Vec::new();
    while let Some(at) = t.poll_timeout(up).filter(|&at| at <= until) {
        out.extend(t.on_timeout(at, up));
    }
    out
}

#[test]
fn pull_subjects() {
    assert!(is_pull_subject(b"$JS.API.CONSUMER.MSG.NEXT.S.C"));
    assert!(is_pull_subject(b"$JS.hub.API.CONSUMER.MSG.NEXT.S.C"));
    assert!(is_pull_subject(b"my.API.CONSUMER.MSG.NEXT.S.C"));
    assert!(!is_pull_subject(b"$JS.API.CONSUMER.INFO.S.C"));
    assert!(!is_pull_subject(b"$JS.API.CONSUMER.MSG.NEXT.S"));
    assert!(!is_pull_subject(b"CONSUMER.MSG.NEXT.S.C"));
}

#[test]
fn bodies() {
    assert_eq!(parse_body(b"").unwrap().batch, 1);
    assert_eq!(parse_body(b"17").unwrap().batch, 17);
    let b = parse_body(VECTOR_BODY).unwrap();
    assert_eq!(
        (b.batch, b.max_bytes, b.expires),
        (200, 0, Some(Duration::from_secs(30)))
    );
    assert_eq!(b.idle_heartbeat, None);
    let b = parse_body(
        br#"{"batch":5,"no_wait":true,"idle_heartbeat":1000000000,"expires":3000000000}"#,
    )
    .unwrap();
    assert!(b.no_wait);
    assert_eq!(b.idle_heartbeat, Some(Duration::from_secs(1)));
    assert!(parse_body(b"{bad").is_none());
    assert!(parse_body(b"x").is_none());
}

#[test]
fn ack_sequences_in_both_reply_formats() {
    use super::request::Sequences;
    let v1 = Sequences::of_ack(b"$JS.ACK.LOGS.CV.1.58.5.1795971532879267765.0").unwrap();
    assert_eq!((v1.stream, v1.consumer), (58, 5));
    let v2 = Sequences::of_ack(b"$JS.ACK.hub.ACC.LOGS.CV.1.58.5.17959.0.tok").unwrap();
    assert_eq!((v2.stream, v2.consumer), (58, 5));
    assert!(Sequences::of_ack(b"_INBOX.x").is_none());
}

#[test]
fn the_upstream_heartbeat_follows_the_expiry_and_the_clients_own() {
    let now = Instant::now();
    let mut t = PullTracker::default();
    let hb = |f: &Bytes| body_of(f)["idle_heartbeat"].as_u64();
    let max = Some(UPSTREAM_HB_MAX.as_nanos() as u64);
    // Vector: 30 s, no heartbeat of its own: a quarter, at most UPSTREAM_HB_MAX. Other
    // fields kept.
    let f = request(&mut t, VECTOR_BODY, now).expect("rewritten");
    assert_eq!(hb(&f), max);
    assert_eq!(body_of(&f)["batch"], 200);
    assert!(body_of(&f)["min_pending"].is_null(), "other fields kept");
    // nats.js, 5 s with 2.5 s: at most UPSTREAM_HB_MAX too.
    let f = request(&mut t, JS_BODY, now).unwrap();
    assert_eq!(hb(&f), max);
    // nats.go Fetch, 990 ms: a quarter would be 247.5 ms, so the bound again.
    let f = request(&mut t, br#"{"batch":10,"expires":990000000}"#, now).unwrap();
    assert_eq!(hb(&f), max);
    // 400 ms: a quarter is the bound itself (a loss is seen by about half the expiry).
    let f = request(&mut t, br#"{"batch":10,"expires":400000000}"#, now).unwrap();
    assert_eq!(hb(&f), Some(100_000_000));
    // nats.go's, cnats' and nats-py's Fetch start with a no_wait request with an
    // expiry, which the server holds like any other: watched too.
    let f = request(
        &mut t,
        br#"{"batch":64,"expires":990000000,"no_wait":true}"#,
        now,
    )
    .unwrap();
    assert_eq!(hb(&f), max);
    assert_eq!(body_of(&f)["no_wait"], true);
    // Too short to watch, no_wait without an expiry (answered at once), no JSON: left
    // alone.
    assert!(request(&mut t, br#"{"batch":1,"expires":300000000}"#, now).is_none());
    assert!(request(&mut t, br#"{"batch":5,"no_wait":true}"#, now).is_none());
    assert!(request(&mut t, b"", now).is_none());
    // The client's own heartbeat: at most half of it (200 ms here).
    let fast = br#"{"batch":1,"expires":30000000000,"idle_heartbeat":400000000}"#;
    let f = request(&mut t, fast, now).unwrap();
    let own = br#"{"batch":1,"expires":30000000000,"idle_heartbeat":200000000}"#;
    let g = request(&mut t, own, now).unwrap();
    assert_eq!(hb(&f), max, "the bound, under half the client's 400 ms");
    assert_eq!(hb(&g), Some(100_000_000), "half the client's own 200 ms");
    assert_eq!(t.len(), 10);
}

#[test]
fn credit_accounting_with_deliveries_and_ending_statuses() {
    let now = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":3,"expires":30000000000}"#, now);
    request(&mut t, br#"{"batch":2,"expires":30000000000}"#, now);
    for n in 0..3 {
        assert_eq!(t.on_message(&delivery("1", n), now), Shield::Forward);
    }
    assert_eq!(t.len(), 1, "the first request is used up");
    let timeout = "408 Request Timeout\r\nNats-Pending-Messages: 2\r\nNats-Pending-Bytes: 0";
    assert_eq!(t.on_message(&status("1", timeout), now), Shield::Forward);
    assert_eq!(t.len(), 0, "a 408 ends it and reaches the client");
    request(&mut t, b"5", now);
    assert_eq!(
        t.on_message(&status("1", "409 Batch Completed"), now),
        Shield::Forward
    );
    assert_eq!(t.len(), 0);
}

#[test]
fn a_leadership_change_places_the_rest_in_full_at_once() {
    // The new leader sends the 409: it serves a new request now, and a probe would
    // only wait out its own expiry if that leader delivers a little later.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, t0);
    assert_eq!(t.on_message(&delivery("1", 1), t0), Shield::Forward);
    let t1 = t0 + Duration::from_secs(10);
    let moved = status("1", "409 Leadership Change");
    assert_eq!(t.on_message(&moved, t1), Shield::Hide);
    let up = upstream(&t.on_timeout(t1, true));
    assert_eq!(up.len(), 1);
    let v = body_of(&up[0]);
    assert_eq!(v["batch"], 199);
    assert_eq!(v["expires"], Duration::from_secs(20).as_nanos() as u64);
    assert_eq!(v["idle_heartbeat"], UPSTREAM_HB_MAX.as_nanos() as u64);
    assert_eq!(t.unplaced(), 0, "placed in full");
    assert_eq!(t.poll_replaced(), Some(Duration::ZERO));
    // Its heartbeats stop (the new leader lost it too): probed, as any silent loss.
    let late = t1 + UPSTREAM_HB_MAX * 2 + HB_SLACK;
    let up = upstream(&t.on_timeout(late, true));
    assert_eq!(up.len(), 1);
    assert_eq!(body_of(&up[0])["expires"], PROBE_EXPIRES.as_nanos() as u64);
}

#[test]
fn a_leader_shut_down_is_shielded_and_the_rest_probed_then_placed_again() {
    let line = "409 Server Shutdown\r\nNats-Pending-Messages: 199\r\nNats-Pending-Bytes: 0";
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, t0);
    assert_eq!(t.on_message(&delivery("1", 1), t0), Shield::Forward);
    let t1 = t0 + Duration::from_secs(10);
    assert_eq!(t.on_message(&status("1", line), t1), Shield::Hide, "{line}");
    // A probe first (is the new leader there?), with the remaining batch.
    let out = t.on_timeout(t1, true);
    let up = upstream(&out);
    assert_eq!(up.len(), 1);
    let v = body_of(&up[0]);
    assert_eq!(v["batch"], 199);
    assert_eq!(v["expires"], PROBE_EXPIRES.as_nanos() as u64);
    assert!(v.get("idle_heartbeat").is_none());
    // The new leader delivers on it: the consumer is back; at the probe's end the
    // rest is placed in full with the client's remaining expiry.
    assert_eq!(t.on_message(&delivery("1", 2), t1), Shield::Forward);
    let t2 = t1 + PROBE_EXPIRES;
    let end = "408 Request Timeout\r\nNats-Pending-Messages: 198\r\nNats-Pending-Bytes: 0";
    assert_eq!(
        t.on_message(&status("1", end), t2),
        Shield::Swallow,
        "the probe's end is ours"
    );
    let up = upstream(&t.on_timeout(t2, true));
    assert_eq!(up.len(), 1);
    let v = body_of(&up[0]);
    assert_eq!(v["batch"], 198);
    let exp = v["expires"].as_u64().unwrap();
    let want = (Duration::from_secs(20) - PROBE_EXPIRES).as_nanos() as u64;
    assert_eq!(exp, want);
    assert_eq!(v["idle_heartbeat"], UPSTREAM_HB_MAX.as_nanos() as u64);
    assert!(matches!(t.phases(b"1")[..], [PullPhase::Live { .. }]));
}

#[test]
fn real_problems_pass_and_end_tracking() {
    let now = Instant::now();
    for (line, left) in [
        ("409 Consumer Deleted", 0),
        ("409 Consumer is push based", 0),
        ("409 Exceeded MaxWaiting", 1),
        ("409 Exceeded MaxRequestBatch of 10", 1),
        ("409 Exceeded MaxRequestExpires of 1s", 1),
        ("409 Exceeded MaxRequestMaxBytes of 5", 1),
        ("400 Bad Request", 1),
    ] {
        let mut t = PullTracker::default();
        request(&mut t, VECTOR_BODY, now);
        request(&mut t, VECTOR_BODY, now);
        assert_eq!(
            t.on_message(&status("1", line), now),
            Shield::Forward,
            "{line}"
        );
        assert_eq!(t.len(), left, "{line}");
    }
    // Unknown statuses reach the client and change nothing.
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, now);
    assert_eq!(
        t.on_message(&status("1", "423 Nats-Pin-Id mismatch"), now),
        Shield::Forward
    );
    assert_eq!(t.len(), 1);
}

#[test]
fn a_heartbeat_refused_by_the_server_is_dropped_if_it_was_ours() {
    let now = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, VECTOR_BODY, now);
    let refused = status("1", "400 Bad Request - heartbeat value too large");
    assert_eq!(t.on_message(&refused, now), Shield::Hide);
    let up = upstream(&t.on_timeout(now, true));
    assert_eq!(up.len(), 1);
    assert!(body_of(&up[0]).get("idle_heartbeat").is_none());
    // The client's own too-large heartbeat is its problem.
    let mut t = PullTracker::default();
    let own = br#"{"batch":1,"expires":1000000000,"idle_heartbeat":900000000}"#;
    assert!(
        request(&mut t, own, now).is_none(),
        "invalid: sent as it is"
    );
    assert_eq!(t.on_message(&refused, now), Shield::Forward);
    assert_eq!(t.len(), 0);
}

#[test]
fn a_short_request_lost_silently_is_placed_again_before_it_expires() {
    // nats.go Fetch(10, MaxWait(2s)): expires 1,990 ms; the request vanishes (R1
    // consumer's node in lame duck mode) with no status at all.
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":10,"expires":1990000000}"#, t0);
    let noticed = UPSTREAM_HB_MAX * 2 + HB_SLACK;
    let out = run_until(&mut t, t0 + noticed, true);
    let up = upstream(&out);
    assert_eq!(up.len(), 1, "two missed heartbeats noticed, {noticed:?} in");
    let v = body_of(&up[0]);
    assert_eq!(v["batch"], 10);
    assert!(v["expires"].as_u64().unwrap() <= PROBE_EXPIRES.as_nanos() as u64);
    // The consumer answers (it moved): the rest of the expiry is placed in full.
    let t1 = t0 + noticed + Duration::from_millis(100);
    let _ = t.on_message(&status("1", "100 Idle Heartbeat"), t1);
    let out = run_until(&mut t, t0 + Duration::from_millis(1900), true);
    assert!(client(&out).is_empty());
    // No end comes at all (the placements vanish too): the proxy ends it, with the
    // server's 408, before the client's deadline.
    let out = run_until(&mut t, t0 + Duration::from_secs(3), true);
    let c = client(&out);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(
        c[0].contains("408 Request Timeout\r\nNats-Pending-Messages: 10\r\n"),
        "{}",
        c[0]
    );
    assert_eq!(t.len(), 0);
}

#[test]
fn a_request_that_ends_normally_is_never_placed_again() {
    let t0 = Instant::now();
    let mut t = PullTracker::default();
    request(&mut t, br#"{"batch":10,"expires":1000000000}"#, t0);
    let end = "408 Request Timeout\r\nNats-Pending-Messages: 10\r\nNats-Pending-Bytes: 0";
    assert_eq!(
        t.on_message(&status("1", end), t0 + Duration::from_secs(1)),
        Shield::Forward
    );
    assert!(run_until(&mut t, t0 + Duration::from_secs(60), true).is_empty());
    assert!(t.is_empty());
}

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
