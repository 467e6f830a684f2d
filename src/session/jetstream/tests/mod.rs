//! Unit tests of the pull tracker: one per status class and per phase transition.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::pull_phase::{
    PullPhase, EXPIRE_LEAD, HB_SLACK, PROBE_EXPIRES, PROBE_GRACE, PROBE_INTERVAL,
};
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

mod consumer_away;
