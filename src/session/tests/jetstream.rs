//! Pull requests, statuses, acks and the fast path through the whole session.

use super::harness::*;
use super::*;

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

/// The client's pull request `body` for consumer `LOGS.<consumer>`, to inbox `_INBOX.p`.
fn pull_request(consumer: &str, body: &str) -> Vec<u8> {
    format!(
        "PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.{consumer} _INBOX.p {}\r\n{body}\r\n",
        body.len()
    )
    .into_bytes()
}

/// Seen in CI (nats-server 2.9.10, rolling restart): the consumer's new leader sent
/// message 17 again as the same first delivery (only `<pending>` differed) 200 ms after
/// the first copy, while nats-py's `fetch(64, timeout=1)` was still collecting its batch
/// and had not acked it: the client counted it twice.
#[test]
fn the_same_delivery_sent_again_before_the_client_acked_it_reaches_it_once() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB _INBOX.p 1\r\n");
    h.client(&pull_request("PY", r#"{"batch":64,"expires":990000000}"#));
    let d = |seq: u64, pending: u64| {
        format!("MSG logs.v 1 $JS.ACK.LOGS.PY.1.{seq}.{seq}.17965383203100379{seq}.{pending} 2\r\n{seq}\r\n")
            .into_bytes()
    };
    // New deliveries take the fast path; what the client has goes the full one.
    assert_eq!(to_client(&h.upstream(1, &d(17, 0))), d(17, 0));
    assert_eq!(to_client(&h.upstream(1, &d(18, 0))), d(18, 0));
    h.now += Duration::from_millis(200);
    let mut wire = d(17, 38);
    wire.extend_from_slice(&d(19, 37));
    let a = h.upstream(1, &wire);
    assert_eq!(
        String::from_utf8(to_client(&a)).unwrap(),
        String::from_utf8(d(19, 37)).unwrap(),
        "the copy kept back, the next one passes"
    );
    assert!(
        to_upstream(&a).is_empty(),
        "no ack: the client acks its own copy"
    );
    assert_eq!(h.s.stats().duplicates_suppressed, 1);
    let hmsg = encode::msg(
        b"logs.v",
        b"1",
        Some(b"$JS.ACK.LOGS.PY.1.18.18.1796538320310037918.36"),
        Some(b"NATS/1.0\r\nNats-Msg-Id: 18\r\n\r\n"),
        b"18",
    );
    assert!(
        to_client(&h.upstream(1, &hmsg)).is_empty(),
        "with headers too"
    );
    assert_eq!(h.s.stats().duplicates_suppressed, 2);
    // The batch ends; the client acks what it got, each once.
    for seq in 17..=19 {
        let ack = format!("PUB $JS.ACK.LOGS.PY.1.{seq}.{seq}.17965383203100379{seq}.0 0\r\n\r\n");
        let up = String::from_utf8(to_upstream(&h.client(ack.as_bytes()))).unwrap();
        assert!(up.contains(&format!(".1.{seq}.{seq}.")), "{up:?}");
    }
    // Sent again once more after the acks: acked again by the proxy, still kept back.
    let a = h.upstream(1, &d(17, 40));
    assert!(to_client(&a).is_empty());
    assert!(String::from_utf8(to_upstream(&a))
        .unwrap()
        .contains(".1.17.17."));
    assert_eq!(h.s.stats().redeliveries_acked, 1);
    assert_eq!(h.s.stats().msgs_to_client, 3);
}

/// Seen while testing the rule above (2.9.10, rolling restart): a delivery to one member
/// of nats-py's queue group (two push subscribers on one durable) sent again to the
/// other. The server sends one copy per queue group and one per plain subscription.
#[test]
fn a_delivery_sent_again_to_another_queue_member_is_the_same_one() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB dlv Q 3\r\nSUB dlv Q 4\r\nSUB mon 5\r\nSUB mon.> 6\r\n");
    let d = |subject: &str, sid: u64, seq: u64, pending: u64| {
        format!("MSG {subject} {sid} $JS.ACK.LOGS.PYQ.1.{seq}.{seq}.17965403668750000{seq}.{pending} 2\r\n{seq}\r\n")
            .into_bytes()
    };
    assert_eq!(
        to_client(&h.upstream(1, &d("dlv", 3, 17, 0))),
        d("dlv", 3, 17, 0)
    );
    h.client(b"PUB $JS.ACK.LOGS.PYQ.1.17.17.1796540366875000017.0 0\r\n\r\n");
    assert_eq!(
        to_client(&h.upstream(1, &d("dlv", 4, 18, 0))),
        d("dlv", 4, 18, 0)
    );
    h.now += Duration::from_millis(300);
    let a = h.upstream(1, &d("dlv", 4, 17, 12));
    assert!(to_client(&a).is_empty(), "the group had it");
    assert!(
        String::from_utf8(to_upstream(&a))
            .unwrap()
            .contains(".1.17.17."),
        "acked again"
    );
    assert!(
        to_client(&h.upstream(1, &d("dlv", 3, 18, 11))).is_empty(),
        "not acked yet"
    );
    assert_eq!(h.s.stats().redeliveries_acked, 1);
    assert_eq!(h.s.stats().duplicates_suppressed, 1);
    // Two plain subscriptions matching one deliver subject: each gets its copy.
    let mut wire = d("mon", 5, 19, 0);
    wire.extend_from_slice(&d("mon", 6, 19, 0));
    assert_eq!(to_client(&h.upstream(1, &wire)), wire);
    assert_eq!(h.s.stats().msgs_to_client, 4);
}

fn idle_heartbeat(last_consumer: u64) -> Vec<u8> {
    let h = format!(
        "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {last_consumer}\r\nNats-Last-Stream: 3000\r\n\r\n"
    );
    format!("HMSG dlv 1 {0} {0}\r\n{h}\r\n", h.len()).into_bytes()
}

/// Seen in CI: nats-py's push consumer reported `ConsumerSequenceMismatch` for every
/// heartbeat after the proxy hid a redelivery, the heartbeat naming the hidden one.
#[test]
fn a_push_consumers_heartbeat_never_names_a_redelivery_hidden_from_the_client() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB dlv 1\r\n");
    let d = |dlv: u64, sseq: u64, cseq: u64| {
        format!(
            "MSG dlv 1 $JS.ACK.LOGS.PUSH.{dlv}.{sseq}.{cseq}.179597153287926{cseq}.0 1\r\nx\r\n"
        )
        .into_bytes()
    };
    for n in 2999..=3000 {
        assert_eq!(to_client(&h.upstream(1, &d(1, n, n))), d(1, n, n));
        h.client(
            format!("PUB $JS.ACK.LOGS.PUSH.1.{n}.{n}.179597153287926{n}.0 0\r\n\r\n").as_bytes(),
        );
    }
    // Both acks died with a node: the server redelivers both, as 3001 and 3002.
    assert!(to_client(&h.upstream(1, &d(2, 2999, 3001))).is_empty());
    assert!(to_client(&h.upstream(1, &d(2, 3000, 3002))).is_empty());
    assert_eq!(h.s.stats().redeliveries_acked, 2);
    let a = h.upstream(1, &idle_heartbeat(3002));
    assert_eq!(
        String::from_utf8(to_client(&a)).unwrap(),
        String::from_utf8(idle_heartbeat(3000)).unwrap(),
        "the heartbeat names the client's last delivery"
    );
    assert_eq!(h.s.stats().heartbeats_amended, 1);
    // A new message reaches the client: its heartbeats are the server's again.
    assert_eq!(
        to_client(&h.upstream(1, &d(1, 3001, 3003))),
        d(1, 3001, 3003)
    );
    assert_eq!(
        to_client(&h.upstream(1, &idle_heartbeat(3003))),
        idle_heartbeat(3003)
    );
    // A re-send of what the client has (`<delivered>` 1) changes nothing.
    h.client(b"PUB $JS.ACK.LOGS.PUSH.1.3001.3003.1795971532879263003.0 0\r\n\r\n");
    assert!(to_client(&h.upstream(1, &d(1, 3001, 3003))).is_empty());
    assert_eq!(
        to_client(&h.upstream(1, &idle_heartbeat(3003))),
        idle_heartbeat(3003)
    );
    assert_eq!(h.s.stats().heartbeats_amended, 1);
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
            // Placed again at once with the remaining batch: in full after a leadership
            // change (its sender is the new leader), else as a probe.
            let up = String::from_utf8(to_upstream(&a)).unwrap();
            let expires = if line.contains("Leadership") {
                Duration::from_secs(30).as_nanos()
            } else {
                crate::session::jetstream::pull_phase::PROBE_EXPIRES.as_nanos()
            };
            assert!(
                up.contains("PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.CV _INBOX.v ")
                    && up.contains("\"batch\":200")
                    && up.contains(&format!("\"expires\":{expires}")),
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

/// Acks lost with a node come back as redeliveries after `ack_wait`, and the proxy hides
/// them (seen in the rolling-restart test, right before nats-py's one 1.0 s gap). A
/// request whose whole credit such a redelivery took gets nothing more from the server,
/// not even an end, and the client would wait out its expiry with messages pending. The
/// proxy places the request again with the client's credit, and only once the server
/// holds none of it.
#[test]
fn a_request_whose_credit_a_hidden_redelivery_took_is_placed_again() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB _INBOX.p 1\r\n");
    let first = b"MSG logs.v 1 $JS.ACK.LOGS.PY.1.58.5.1795971532879267765.0 3\r\nm58\r\n";
    h.client(b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.PY _INBOX.p 1\r\n1\r\n");
    assert_eq!(to_client(&h.upstream(1, first)), first.to_vec());
    h.client(b"PUB $JS.ACK.LOGS.PY.1.58.5.1795971532879267765.0 0\r\n\r\n");

    // batch 1, 990 ms: the redelivery takes the placement's only credit.
    h.client(&pull_request("PY", r#"{"batch":1,"expires":990000000}"#));
    h.now += Duration::from_millis(2);
    let again = b"MSG logs.v 1 $JS.ACK.LOGS.PY.2.58.6.1795971562879267765.0 3\r\nm58\r\n";
    let a = h.upstream(1, again);
    assert!(to_client(&a).is_empty(), "hidden from the client");
    h.s.handle_timeout(h.now);
    let up = String::from_utf8(to_upstream(&h.actions())).unwrap();
    assert!(
        up.contains("PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.PY _INBOX.p")
            && up.contains(r#""batch":1,"expires":988000000"#),
        "placed again with the client's credit and remaining expiry: {up:?}"
    );
    assert_eq!(h.s.stats().pulls_reissued, 1);
    // The new placement's delivery reaches the client and ends the request.
    let next = b"MSG logs.v 1 $JS.ACK.LOGS.PY.1.59.7.1795971562879267766.0 3\r\nm59\r\n";
    assert_eq!(to_client(&h.upstream(1, next)), next.to_vec());
    assert_eq!(h.s.js.pulls.len(), 0);

    // batch 64: the placement keeps 63 at the server, nothing is placed again.
    h.client(b"PUB $JS.ACK.LOGS.PY.1.59.7.1795971562879267766.0 0\r\n\r\n");
    h.client(b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.PY _INBOX.p 2\r\n64\r\n");
    let again = b"MSG logs.v 1 $JS.ACK.LOGS.PY.2.59.8.1795971562879267766.0 3\r\nm59\r\n";
    assert!(to_client(&h.upstream(1, again)).is_empty());
    h.now += Duration::from_millis(2);
    h.s.handle_timeout(h.now);
    let up = String::from_utf8(to_upstream(&h.actions())).unwrap();
    assert!(!up.contains("CONSUMER.MSG.NEXT"), "{up:?}");
    assert_eq!(h.s.stats().pulls_reissued, 1);
}

/// async-nats and nats.js `consume()` count the credit they have out and subtract the
/// server's `Nats-Pending-Messages` when a request ends: the end of a request one of
/// whose deliveries the proxy hid names the credit left as the client counts it.
#[test]
fn an_end_status_counts_a_hidden_redelivery_as_never_made() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB _INBOX.p 1\r\n");
    h.client(b"PUB $JS.API.CONSUMER.MSG.NEXT.LOGS.AN _INBOX.p 1\r\n1\r\n");
    let first = b"MSG logs.v 1 $JS.ACK.LOGS.AN.1.58.5.1795971532879267765.0 3\r\nm58\r\n";
    assert_eq!(to_client(&h.upstream(1, first)), first.to_vec());
    h.client(b"PUB $JS.ACK.LOGS.AN.1.58.5.1795971532879267765.0 0\r\n\r\n");

    h.client(&pull_request(
        "AN",
        r#"{"batch":64,"max_bytes":100000,"expires":30000000000}"#,
    ));
    let again = b"MSG logs.v 1 $JS.ACK.LOGS.AN.2.58.6.1795971562879267765.0 3\r\nm58\r\n";
    assert!(to_client(&h.upstream(1, again)).is_empty());
    let next = b"MSG logs.v 1 $JS.ACK.LOGS.AN.1.59.7.1795971562879267766.0 3\r\nm59\r\n";
    assert_eq!(to_client(&h.upstream(1, next)), next.to_vec());
    // The server's view: 62 messages and 100000 - 2 * 3 bytes left.
    let end = |msgs: u64, bytes: u64| {
        let hd = format!(
            "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: {msgs}\r\nNats-Pending-Bytes: {bytes}\r\n\r\n"
        );
        format!("HMSG _INBOX.p 1 {0} {0}\r\n{hd}\r\n", hd.len()).into_bytes()
    };
    h.now += Duration::from_secs(30);
    let a = h.upstream(1, &end(62, 99994));
    assert_eq!(
        String::from_utf8(to_client(&a)).unwrap(),
        String::from_utf8(end(63, 99997)).unwrap(),
        "the client got one message of 3 bytes"
    );
    assert_eq!(h.s.js.pulls.len(), 0);
}

/// The client watch's facts come from the wire: a pull request (and its `expires`), each
/// new delivery (fast path and full path), each ack; a re-sent copy the client never sees
/// is not counted as held.
#[test]
fn pulls_deliveries_and_acks_feed_the_consumer_activity() {
    let mut h = H::connected();
    assert!(h.s.is_client_connected());
    assert!(!h.s.consumes(), "connected, nothing consumed yet");
    h.client(b"SUB _INBOX.p 1\r\n");
    assert!(!h.s.consumes(), "an inbox is not consuming");
    let t0 = h.now;
    h.client(&pull_request("VEC", r#"{"batch":2,"expires":30000000000}"#));
    assert!(h.s.consumes());
    let c = &h.s.consuming().consumers()[0];
    assert_eq!(&c.key[..], b"LOGS.VEC");
    assert_eq!(c.pulled_at, Some(t0));
    assert_eq!(c.waiting_until, Some(t0 + Duration::from_secs(30)));
    assert_eq!(c.outstanding, 0);
    let d = |seq: u64| {
        format!(
            "MSG logs.v 1 $JS.ACK.LOGS.VEC.1.{seq}.{seq}.17965383203100379{seq}.0 2\r\nm{seq}\r\n"
        )
        .into_bytes()
    };
    h.now += Duration::from_secs(1);
    // The first goes the fast path; the second with a PING behind it, the full path.
    let a = h.upstream(1, &d(1));
    assert_eq!(to_client(&a), d(1), "{a:?}");
    let mut wire = d(2);
    wire.extend_from_slice(b"PING\r\n");
    h.upstream(1, &wire);
    assert_eq!(h.s.consuming().consumers()[0].outstanding, 2);
    // The same delivery again: kept back, not held twice.
    h.upstream(1, &d(2));
    assert_eq!(h.s.consuming().consumers()[0].outstanding, 2);
    h.now += Duration::from_secs(1);
    h.client(b"PUB $JS.ACK.LOGS.VEC.1.1.1.179653832031003791.0 4\r\n+WPI\r\n");
    let c = &h.s.consuming().consumers()[0];
    assert_eq!(
        (c.outstanding, c.acked_at),
        (2, Some(h.now)),
        "+WPI: work, not done"
    );
    h.client(b"PUB $JS.ACK.LOGS.VEC.1.1.1.179653832031003791.0 0\r\n\r\n");
    h.client(b"PUB $JS.ACK.LOGS.VEC.1.2.2.179653832031003792.0 4\r\n-NAK\r\n");
    assert_eq!(h.s.consuming().consumers()[0].outstanding, 0);
    // A core subscription on a real subject is consuming too.
    let mut h = H::connected();
    h.client(b"SUB logs.> 1\r\n");
    assert!(h.s.consumes());
}
