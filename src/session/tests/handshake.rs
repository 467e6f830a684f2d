//! The handshake on the client's behalf: a CONNECT that must fit, refusals that must not
//! become a dial loop, and the order of the replies the proxy makes itself.

use super::harness::*;
use super::*;

const INFO_ABC: &[u8] =
    b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"a:1\",\"b:1\",\"c:1\"]} \r\n";

fn three_nodes() -> H {
    H::with(SessionConfig {
        upstreams: vec!["a:1".into(), "b:1".into(), "c:1".into()],
        migration_spread: Duration::ZERO,
        ..SessionConfig::default()
    })
}

fn connect_args(up: &[u8]) -> &[u8] {
    let s = up.strip_prefix(b"CONNECT ").expect("a CONNECT first");
    let end = s.iter().position(|&c| c == b'\r').unwrap();
    &s[..end]
}

fn closed(a: &[Action]) -> Option<CloseReason> {
    a.iter().find_map(|a| match a {
        Action::CloseClient(r) => Some(*r),
        _ => None,
    })
}

#[test]
fn a_connect_the_server_takes_is_rewritten_within_its_control_line() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    h.upstream(1, b"INFO {\"server_id\":\"S\"} \r\n");
    // The 4,094-byte CONNECT of the incident: its JSON is 4,084 bytes.
    let name = "n".repeat(4084 - r#"{"verbose":false,"name":""}"#.len());
    let json = format!(r#"{{"verbose":false,"name":"{name}"}}"#);
    let line = format!("CONNECT {json}\r\n");
    assert_eq!(line.len(), 4094);
    let a = h.client(line.as_bytes());
    let up = to_upstream(&a);
    let args = connect_args(&up);
    assert!(
        args.len() <= crate::proto::MAX_CONTROL_LINE,
        "{}",
        args.len()
    );
    let v: serde_json::Value = serde_json::from_slice(args).unwrap();
    assert_eq!(v["pedantic"], false);
    assert_eq!(v["protocol"], 1);
    let sent = v["name"].as_str().unwrap();
    assert!(
        name.starts_with(sent) && sent.len() > 3900,
        "{}",
        sent.len()
    );
    assert_eq!(closed(&a), None);
    // Taken: PONGs, no -ERR, no second dial.
    let a = h.upstream(1, b"PONG\r\nPONG\r\n");
    assert!(dial_of(&a).is_none() && to_client(&a).is_empty());
}

#[test]
fn what_the_proxy_adds_to_a_connect_is_bounded() {
    // The worst case: a client that sent nothing the proxy can copy.
    let o = crate::proto::json::ClientOptions::default();
    let json = o
        .upstream_connect_json(&crate::auth::connect_auth(None, &o, None, None), 4096)
        .unwrap();
    assert_eq!(
        json.len() - b"{}".len(),
        crate::proto::json::CONNECT_OVERHEAD,
        "{}",
        String::from_utf8_lossy(&json)
    );
    // Defaults the server assumes anyway are not written.
    let s = String::from_utf8(json).unwrap();
    for absent in ["echo", "tls_required", "name", "lang", "version"] {
        assert!(!s.contains(absent), "{s}");
    }
}

#[test]
fn a_connect_that_cannot_fit_ends_the_client_once_without_redialling() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    h.upstream(1, b"INFO {\"server_id\":\"S\",\"auth_required\":true} \r\n");
    // A credential cannot be cut short.
    let token = "t".repeat(4060);
    let line = format!("CONNECT {{\"verbose\":false,\"auth_token\":\"{token}\"}}\r\n");
    let a = h.client(line.as_bytes());
    assert_eq!(
        to_client(&a),
        b"-ERR 'maximum control line exceeded'\r\n".to_vec()
    );
    assert_eq!(closed(&a), Some(CloseReason::ClientProtocol));
    assert!(to_upstream(&a).is_empty(), "nothing too long is written");
    h.now += Duration::from_secs(60);
    h.s.handle_timeout(h.now);
    assert!(dial_of(&h.actions()).is_none());
}

/// Runs the session for up to `secs` of simulated time against nodes that each answer
/// a new link with INFO, then `reply` (after the client's CONNECT and PING, sent once),
/// then close it; returns the dial times, the client's bytes and the close.
fn against_nodes(reply: &[u8], secs: u64) -> (Vec<Instant>, Vec<u8>, Option<CloseReason>) {
    let mut h = three_nodes();
    let t_end = h.now + Duration::from_secs(secs);
    let (mut dials, mut to_cli, mut close) = (Vec::new(), Vec::new(), None);
    let mut connected = false;
    let mut a = h.actions();
    while close.is_none() && h.now < t_end {
        to_cli.extend(to_client(&a));
        close = closed(&a);
        if let Some((e, _)) = dial_of(&a) {
            dials.push(h.now);
            h.s.handle_upstream_connected(e, h.now);
            a = h.upstream(e.0, INFO_ABC);
            if !connected {
                a.extend(h.client(b"CONNECT {\"verbose\":false}\r\nPING\r\n"));
                connected = true;
            }
            a.extend(h.upstream(e.0, reply));
            h.s.handle_upstream_lost(e, h.now);
            a.extend(h.actions());
            continue;
        }
        let Some(t) = h.s.poll_timeout() else { break };
        h.now = t.max(h.now);
        h.s.handle_timeout(h.now);
        a = h.actions();
    }
    (dials, to_cli, close)
}

#[test]
fn a_handshake_refused_on_every_node_ends_the_client_after_one_try_each() {
    let err = b"-ERR 'maximum control line exceeded'\r\n";
    let (dials, out, close) = against_nodes(err, 600);
    assert_eq!(close, Some(CloseReason::UpstreamRefused));
    assert_eq!(dials.len(), 3, "one try per known node");
    // Backed off between tries, never at once.
    for w in dials.windows(2) {
        assert!(w[1] - w[0] >= DEFAULT_BACKOFF_MIN.mul_f64(0.9), "{w:?}");
    }
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.matches("-ERR").count(), 1, "{out}");
    assert!(
        out.ends_with("-ERR 'maximum control line exceeded'\r\n"),
        "{out}"
    );
}

#[test]
fn refused_credentials_end_the_client_at_the_first_node() {
    let (dials, out, close) = against_nodes(b"-ERR 'Authorization Violation'\r\n", 600);
    assert_eq!(close, Some(CloseReason::UpstreamRefused));
    assert_eq!(dials.len(), 1);
    assert!(String::from_utf8(out)
        .unwrap()
        .ends_with("-ERR 'Authorization Violation'\r\n"));
}

#[test]
fn a_node_that_closes_before_taking_the_connect_is_redialled_with_backoff() {
    // No -ERR at all (a crash loop): not a refusal, but never a dial loop either.
    let (dials, _, _) = against_nodes(b"", 10);
    // Backoff doubling from backoff_min to backoff_max: a handful in 10 s, not thousands.
    assert!((2..=12).contains(&dials.len()), "{} dials", dials.len());
}

#[test]
fn a_dial_refused_by_the_budget_is_retried_after_a_backoff() {
    let mut h = H::new();
    let (e, _) = dial_of(&h.actions()).unwrap();
    h.s.handle_dial_refused(e, h.now);
    assert!(dial_of(&h.actions()).is_none(), "not at once");
    let t = h.s.poll_timeout().unwrap();
    assert!(t >= h.now + DEFAULT_BACKOFF_MIN.mul_f64(0.9));
    h.now = t;
    h.s.handle_timeout(h.now);
    let (e2, addr) = dial_of(&h.actions()).expect("dialled again");
    assert!(e2 > e);
    assert_eq!(addr, "127.0.0.1:4222", "the node is not held responsible");
}

#[test]
fn a_pong_owed_before_a_fatal_error_is_written_first() {
    let mut h = H::connected();
    let a = h.client(b"PING\r\nRMSG x\r\n");
    assert_eq!(to_upstream(&a), b"PING\r\n");
    assert_eq!(to_client(&a), b"", "the -ERR waits behind the PONG");
    assert_eq!(closed(&a), None);
    // Nothing more is read from the client meanwhile.
    assert!(!h.s.wants_client_input());
    let a = h.upstream(1, b"PONG\r\n");
    assert_eq!(
        to_client(&a),
        b"PONG\r\n-ERR 'Unknown Protocol Operation'\r\n".to_vec()
    );
    assert_eq!(closed(&a), Some(CloseReason::ClientProtocol));
}

#[test]
fn a_pong_owed_before_a_silent_close_is_written_first() {
    let mut h = H::connected();
    let a = h.client(b"PING\r\nPUB foo x\r\n");
    assert_eq!(closed(&a), None);
    let a = h.upstream(1, b"PONG\r\n");
    assert_eq!(to_client(&a), b"PONG\r\n".to_vec());
    assert_eq!(closed(&a), Some(CloseReason::ClientProtocol));
}

#[test]
fn a_local_err_does_not_overtake_an_earlier_pong() {
    let mut h = H::connected();
    h.client(b"CONNECT {\"verbose\":false,\"pedantic\":true}\r\n");
    let a = h.client(b"PING\r\nSUB a..b 1\r\nPUB a.* 1\r\nx\r\n");
    assert_eq!(to_client(&a), b"");
    let a = h.upstream(1, b"PONG\r\n");
    assert_eq!(
        to_client(&a),
        b"PONG\r\n-ERR 'Invalid Subject'\r\n-ERR 'Invalid Publish Subject'\r\n".to_vec()
    );
    // With nothing owed, at once.
    let a = h.client(b"SUB a..b 2\r\n");
    assert_eq!(to_client(&a), b"-ERR 'Invalid Subject'\r\n".to_vec());
}

#[test]
fn a_protocol_1_client_gets_the_connect_info_after_its_first_pong() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    h.upstream(1, b"INFO {\"server_id\":\"S\",\"max_payload\":2048} \r\n");
    h.client(b"CONNECT {\"verbose\":false,\"protocol\":1}\r\nPING\r\nPING\r\n");
    let a = h.upstream(
        1,
        b"PONG\r\nINFO {\"server_id\":\"S\",\"max_payload\":2048,\"connect_info\":true,\"remote_account\":\"$G\",\"acc_is_sys\":false,\"connect_urls\":[\"x:1\"]} \r\nPONG\r\n",
    );
    assert_eq!(
        to_client(&a),
        b"",
        "handshake and replay PONGs are the proxy's"
    );
    let out = String::from_utf8(to_client(&h.upstream(1, b"PONG\r\nPONG\r\n"))).unwrap();
    assert!(out.starts_with("PONG\r\nINFO {"), "{out}");
    assert!(out.ends_with(" \r\nPONG\r\n"), "{out}");
    assert_eq!(out.matches("INFO").count(), 1, "{out}");
    for f in ["\"connect_info\":true", "\"remote_account\":\"$G\""] {
        assert!(out.contains(f), "{f}: {out}");
    }
    assert!(!out.contains("connect_urls"), "{out}");
}

#[test]
fn a_protocol_0_client_gets_no_connect_info() {
    let mut h = H::new();
    h.actions();
    h.s.handle_upstream_connected(Epoch(1), h.now);
    h.upstream(1, b"INFO {\"server_id\":\"S\"} \r\n");
    h.client(b"CONNECT {\"verbose\":false}\r\nPING\r\n");
    h.upstream(
        1,
        b"PONG\r\nINFO {\"server_id\":\"S\",\"connect_info\":true} \r\nPONG\r\n",
    );
    assert_eq!(to_client(&h.upstream(1, b"PONG\r\n")), b"PONG\r\n");
}

#[test]
fn a_node_that_takes_the_handshake_and_dies_at_once_is_not_a_dial_loop() {
    // Accepted (its handshake PONG came), then lost, again and again, with no time
    // passing: the session's dial window holds.
    let (dials, _, _) = against_nodes(b"PONG\r\nPONG\r\n", 3);
    for (i, &t) in dials.iter().enumerate() {
        let in_window = dials[i..]
            .iter()
            .take_while(|&&u| u - t < DIAL_WINDOW)
            .count();
        assert!(
            in_window <= MAX_DIALS_PER_WINDOW,
            "{in_window} dials in a window"
        );
    }
    assert!(dials.len() >= 6, "it does keep trying: {}", dials.len());
}
