//! A node that refuses the handshake the proxy makes for a client is never redialled in
//! a loop: the incident of a long CONNECT (a server took it, the proxy's rewrite was
//! longer and refused, and the proxy redialled thousands of times a second).

mod common;
use common::*;

use std::time::Duration;

/// The incident's CONNECT: 4,094 bytes, a long name.
fn long_connect() -> Vec<u8> {
    let name = "n".repeat(4057);
    format!("CONNECT {{\"verbose\":false,\"name\":\"{name}\"}}\r\nPING\r\n").into_bytes()
}

fn dials(p: &TestProxy) -> u64 {
    p.stats.upstream_connects.get() + p.stats.upstream_dial_failures.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incidents_long_connect_is_served_with_one_dial() {
    init_logs();
    let server = NatsServer::start(ServerOpts::default()).await;
    let proxy = TestProxy::start(&[server.url()]).await;
    let input = long_connect();
    assert_eq!(input.len(), 4094 + b"PING\r\n".len());
    let direct = raw_exchange(server.addr(), &input).await;
    let proxied = raw_exchange(proxy.addr, &input).await;
    assert_eq!(direct, ("PONG\r\n".to_owned(), false));
    assert_eq!(proxied, direct);
    assert_eq!(dials(&proxy), 1);
}

/// Three nodes whose control line is shorter than the proxy's: the client's 3,000-byte
/// CONNECT passes the proxy and is refused by every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_every_node_refuses_ends_the_client_after_one_try_each() {
    init_logs();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            NatsServer::start(ServerOpts {
                extra: "max_control_line: 2048\n".into(),
                ..Default::default()
            })
            .await,
        );
    }
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let proxy = TestProxy::start(&urls).await;
    let name = "n".repeat(3000);
    let input = format!("CONNECT {{\"verbose\":false,\"name\":\"{name}\"}}\r\nPING\r\n");
    let direct = raw_exchange(servers[0].addr(), input.as_bytes()).await;
    assert_eq!(
        direct,
        ("-ERR 'maximum control line exceeded'\r\n".to_owned(), true)
    );
    // The client's PING is answered while the proxy tries the nodes (no upstream has
    // taken the connection yet), then it gets the nodes' -ERR, once, and is closed.
    let (out, closed) = within(
        Duration::from_secs(20),
        "the refused client's close",
        raw_exchange(proxy.addr, input.as_bytes()),
    )
    .await;
    assert!(closed, "{out:?}");
    assert_eq!(out.matches("-ERR").count(), 1, "{out:?}");
    assert!(
        out.ends_with("-ERR 'maximum control line exceeded'\r\n"),
        "{out:?}"
    );
    assert!(dials(&proxy) <= 3, "{} dials", dials(&proxy));
    // The proxy stays calm and serves the next client.
    let ok = raw_exchange(proxy.addr, b"CONNECT {\"verbose\":false}\r\nPING\r\n").await;
    assert_eq!(ok, ("PONG\r\n".to_owned(), false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dials_over_the_process_budget_are_refused_and_counted() {
    init_logs();
    let server = NatsServer::start(ServerOpts::default()).await;
    // A budget of one dial, refilled once a second.
    let proxy = TestProxy::start_with(&[server.url()], |c| {
        c.dial_rate = 1;
        c.dial_burst = 1;
    })
    .await;
    let first = raw_exchange(proxy.addr, b"CONNECT {\"verbose\":false}\r\nPING\r\n").await;
    assert_eq!(first, ("PONG\r\n".to_owned(), false));
    // The second client's dial waits for the budget (refused, then retried after the
    // session's backoff): served within a few seconds, never refused for good.
    let second = within(
        Duration::from_secs(10),
        "the second client, over the budget",
        raw_exchange(proxy.addr, b"CONNECT {\"verbose\":false}\r\nPING\r\n"),
    )
    .await;
    assert_eq!(second, ("PONG\r\n".to_owned(), false));
    assert!(proxy.stats.upstream_dials_refused.get() >= 1);
    let body = proxy.stats.encode();
    assert!(
        metric(&body, "natsproxy_upstream_dials_refused_total").is_some_and(|v| v >= 1.0),
        "{body}"
    );
}
