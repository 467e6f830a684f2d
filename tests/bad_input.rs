//! Bad (and odd but valid) client input: the proxy must answer exactly what nats-server
//! answers to the same bytes. The expectation is measured against a real server in the
//! same test run, not assumed.

mod common;
use common::*;

fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let c = |s: &str| s.as_bytes().to_vec();
    let quiet = "CONNECT {\"verbose\":false,\"pedantic\":false}\r\n";
    let hdrs = "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n";
    vec![
        ("empty line", c("\r\n")),
        ("unknown op", c("FOO bar\r\n")),
        ("MSG from a client", c("MSG foo 1 2\r\nhi\r\n")),
        ("PUB without separator", c("PUBfoo 2\r\n")),
        ("UNSUB without separator", c(&format!("{quiet}UNSUB\r\n"))),
        ("payload longer than announced", c(&format!("{quiet}PUB foo 5\r\nhi\r\nPING\r\n"))),
        ("CONNECT with bad JSON", c("CONNECT {bad json\r\n")),
        ("CONNECT protocol 2", c("CONNECT {\"protocol\":2}\r\n")),
        ("no_responders without headers", c("CONNECT {\"no_responders\":true}\r\n")),
        ("PUB missing size", c(&format!("{quiet}PUB foo\r\n"))),
        ("PUB too many args", c(&format!("{quiet}PUB a b c 1\r\n"))),
        ("PUB non-numeric size", c("PUB foo x\r\n")),
        ("stray CR in size", c(&format!("{quiet}PUB foo 1\rx\r\n"))),
        ("ten-digit size", c(&format!("{quiet}PUB foo 1234567890\r\n"))),
        ("SUB missing sid", c("CONNECT {}\r\nSUB foo\r\n")),
        ("SUB too many args", c(&format!("{quiet}SUB a b c d\r\n"))),
        ("SUB arg of 4096 bytes", c(&format!("{quiet}SUB {} 1\r\nPING\r\n", "a".repeat(4094)))),
        ("SUB arg of 4097 bytes", c(&format!("{quiet}SUB {} 1\r\n", "a".repeat(4095)))),
        ("5000-byte PUB line without CRLF", c(&format!("{quiet}PUB {}", "b".repeat(5000)))),
        ("payload over max_payload", c(&format!("{quiet}PUB foo 1025\r\n"))),
        ("payload at max_payload", c(&format!("{quiet}PUB foo 1024\r\n{}\r\nPING\r\n", "x".repeat(1024)))),
        ("HPUB total over max_payload", c(&format!("{hdrs}HPUB foo 12 1025\r\n"))),
        ("HPUB without headers", c(&format!("{quiet}HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"))),
        ("HPUB header longer than total", c(&format!("{hdrs}HPUB foo 5 2\r\n"))),
        ("-ERR from a client", c(&format!("{quiet}-ERR 'x'\r\n"))),
        ("INFO with bad JSON", c(&format!("{quiet}INFO {{bad\r\n"))),
        ("INFO from a client", c(&format!("{quiet}INFO {{}}\r\nPING\r\n"))),
        ("PING variants", c("CONNECT {}\r\nPING\r\nPINGXYZ\r\nping\nPiNg\r\n")),
        ("ops before CONNECT use defaults", c("SUB foo 1\r\nPING\r\n")),
        ("CONNECT {} keeps verbose", c("CONNECT {}\r\nSUB foo 1\r\nPING\r\n")),
        ("CONNECT without space", c("CONNECT{\"verbose\":true}\r\nPING\r\n")),
        ("pedantic wildcard publish", c("CONNECT {\"verbose\":true,\"pedantic\":true}\r\nPUB foo.* 1\r\nx\r\nPING\r\n")),
        ("invalid SUB subject", c("CONNECT {\"verbose\":true}\r\nSUB foo..bar 1\r\nPING\r\n")),
        ("UNSUB unknown sid", c("CONNECT {\"verbose\":true}\r\nUNSUB 99\r\nPING\r\n")),
        ("duplicate sid", c("CONNECT {\"verbose\":true}\r\nSUB foo 1\r\nSUB bar 1\r\nPING\r\n")),
        ("runs of spaces", c("PUB   foo    2  \r\nok\r\nPING\r\n")),
        ("tabs", c("PUB\tfoo\t2\r\nok\r\nSUB\tfoo\t\tq1\t5\r\nPING\r\n")),
        ("lowercase verbs and bare LF", c("connect {\"verbose\":false}\nsub foo 1\npub foo 2\nhi\r\nping\n")),
        (
            // Different subjects: the server's order among several matching subscriptions
            // of one connection is not defined.
            "sid 0 and odd sids with delivery",
            c(&format!("{hdrs}SUB foo 0\r\nSUB bar abc\r\nPUB foo 2\r\nhi\r\nHPUB bar 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPUB bar 2\r\nho\r\nPING\r\n")),
        ),
        ("auto-unsubscribe", c(&format!("{quiet}SUB foo 1\r\nUNSUB 1 2\r\nPUB foo 1\r\na\r\nPUB foo 1\r\nb\r\nPUB foo 1\r\nc\r\nPING\r\n"))),
        ("unsubscribe with max at delivered", c(&format!("{quiet}SUB foo 1\r\nPUB foo 1\r\na\r\nPING\r\n"))),
        ("account in CONNECT", c("CONNECT {\"account\":\"A\"}\r\nPING\r\n")),
        ("+OK from a client", c(&format!("{quiet}+OK\r\nPING\r\n"))),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_answers_bad_input_exactly_as_nats_server() {
    init_logs();
    let server = NatsServer::start(ServerOpts {
        max_payload: Some(1024),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start(&[server.url()]).await;
    let mut mismatches = Vec::new();
    let cases = cases();
    for (name, input) in &cases {
        // One after the other: concurrent runs would receive each other's messages.
        let direct = raw_exchange(server.addr(), input).await;
        let proxied = raw_exchange(proxy.addr, input).await;
        if direct != proxied {
            mismatches.push(format!(
                "{name}:\n  nats-server: {direct:?}\n  natsproxy:   {proxied:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
    // A misbehaving client never affects another: the proxy still serves.
    let (out, closed) = raw_exchange(proxy.addr, b"CONNECT {}\r\nPING\r\n").await;
    assert_eq!((out.as_str(), closed), ("+OK\r\nPONG\r\n", false));
    println!(
        "{} bad-input cases identical to nats-server {}",
        cases.len(),
        server_version()
    );
}
