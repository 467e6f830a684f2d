//! The transparent relay against a real nats-server, with async-nats 0.42 (Vector 0.51's
//! client) as the client.

mod common;
use common::raw::RawClient;
use common::*;

use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

async fn setup() -> (NatsServer, TestProxy) {
    init_logs();
    let server = NatsServer::start(ServerOpts {
        max_payload: Some(64 * 1024),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start(&[server.url()]).await;
    (server, proxy)
}

#[tokio::test]
async fn info_hides_the_cluster_and_carries_upstream_max_payload() {
    let (_server, proxy) = setup().await;
    let c = async_nats::connect(proxy.url()).await.unwrap();
    let info = c.server_info();
    assert_eq!(info.max_payload, 64 * 1024);
    assert!(info.connect_urls.is_empty());
    assert!(!info.lame_duck_mode);
    assert!(!info.tls_required);
    assert!(info.headers);
    assert_eq!(info.proto, 1);
}

#[tokio::test]
async fn pubsub_both_directions_through_the_proxy() {
    let (server, proxy) = setup().await;
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut sub_via = via.subscribe("a.>").await.unwrap();
    let mut sub_direct = direct.subscribe("b.x").await.unwrap();
    via.flush().await.unwrap();
    direct.flush().await.unwrap();
    // flush() is local in async-nats 0.42; a request round trip proves registration.
    within(T, "subscription registered", async {
        loop {
            direct.publish("a.1", "ping".into()).await.unwrap();
            if tokio::time::timeout(Duration::from_millis(100), sub_via.next())
                .await
                .is_ok()
            {
                break;
            }
        }
    })
    .await;
    direct
        .publish("a.2", "to-proxy-client".into())
        .await
        .unwrap();
    loop {
        let m = within(T, "message via proxy", sub_via.next())
            .await
            .unwrap();
        if m.subject.as_str() == "a.2" {
            assert_eq!(m.payload, Bytes::from("to-proxy-client"));
            break;
        }
    }
    via.publish("b.x", "from-proxy-client".into())
        .await
        .unwrap();
    let m = within(T, "message from proxy client", sub_direct.next())
        .await
        .unwrap();
    assert_eq!(m.payload, Bytes::from("from-proxy-client"));
}

#[tokio::test]
async fn queue_group_members_share_the_messages() {
    let (server, proxy) = setup().await;
    let c1 = async_nats::connect(proxy.url()).await.unwrap();
    let c2 = async_nats::connect(proxy.url()).await.unwrap();
    let mut q1 = c1.queue_subscribe("work", "workers".into()).await.unwrap();
    let mut q2 = c2.queue_subscribe("work", "workers".into()).await.unwrap();
    // Round trips through both proxied connections make sure both SUBs are registered.
    c1.request("nobody.1", "".into()).await.unwrap_err();
    c2.request("nobody.2", "".into()).await.unwrap_err();
    let publisher = async_nats::connect(server.url()).await.unwrap();
    const N: usize = 200;
    for i in 0..N {
        publisher
            .publish("work", i.to_string().into())
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    let mut got = Vec::new();
    let (mut n1, mut n2) = (0, 0);
    within(T, "all queue messages", async {
        while got.len() < N {
            tokio::select! {
                Some(m) = q1.next() => { n1 += 1; got.push(m.payload); }
                Some(m) = q2.next() => { n2 += 1; got.push(m.payload); }
            }
        }
    })
    .await;
    got.sort();
    got.dedup();
    assert_eq!(got.len(), N, "each message exactly once");
    assert!(n1 > 0 && n2 > 0, "both members got work: {n1} / {n2}");
}

#[tokio::test]
async fn request_reply_and_no_responders() {
    let (server, proxy) = setup().await;
    let responder = async_nats::connect(server.url()).await.unwrap();
    let mut svc = responder.subscribe("svc.echo").await.unwrap();
    responder.flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(m) = svc.next().await {
            if let Some(r) = m.reply {
                responder.publish(r, m.payload).await.unwrap();
            }
        }
    });
    let client = async_nats::connect(proxy.url()).await.unwrap();
    let err = within(T, "no responders", client.request("svc.nobody", "x".into()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), async_nats::RequestErrorKind::NoResponders);
    for i in 0..50 {
        let r = within(
            T,
            "reply",
            client.request("svc.echo", format!("q{i}").into()),
        )
        .await
        .unwrap();
        assert_eq!(r.payload, Bytes::from(format!("q{i}")));
    }
    // A proxied responder works too.
    let presp = async_nats::connect(proxy.url()).await.unwrap();
    let mut psvc = presp.subscribe("svc.proxied").await.unwrap();
    presp.request("nobody.x", "".into()).await.unwrap_err();
    tokio::spawn(async move {
        while let Some(m) = psvc.next().await {
            if let Some(r) = m.reply {
                presp.publish(r, "pong".into()).await.unwrap();
            }
        }
    });
    let r = within(
        T,
        "proxied responder",
        client.request("svc.proxied", "".into()),
    )
    .await
    .unwrap();
    assert_eq!(r.payload, Bytes::from("pong"));
    drop(server);
}

#[tokio::test]
async fn headers_pass_through() {
    let (server, proxy) = setup().await;
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut sub = via.subscribe("h").await.unwrap();
    via.request("nobody", "".into()).await.unwrap_err();
    let mut h = async_nats::HeaderMap::new();
    h.insert("X-Trace", "abc");
    h.insert("X-Multi", "1");
    h.append("X-Multi", "2");
    direct
        .publish_with_headers("h", h, "body".into())
        .await
        .unwrap();
    let m = within(T, "header message", sub.next()).await.unwrap();
    let hm = m.headers.expect("headers");
    assert_eq!(hm.get("X-Trace").map(|v| v.as_str()), Some("abc"));
    assert_eq!(
        hm.get_all("X-Multi")
            .map(|v| v.as_str())
            .collect::<Vec<_>>(),
        vec!["1", "2"]
    );
    assert_eq!(m.payload, Bytes::from("body"));
    // And from the proxied client to a direct subscriber.
    let mut dsub = direct.subscribe("h2").await.unwrap();
    direct.flush().await.unwrap();
    direct.request("nobody", "".into()).await.unwrap_err();
    let mut h = async_nats::HeaderMap::new();
    h.insert("K", "v");
    via.publish_with_headers("h2", h, "b2".into())
        .await
        .unwrap();
    let m = within(T, "header message upstream", dsub.next())
        .await
        .unwrap();
    assert_eq!(m.headers.unwrap().get("K").map(|v| v.as_str()), Some("v"));
}

#[tokio::test]
async fn payload_at_max_payload_passes_and_over_is_refused() {
    let (server, proxy) = setup().await;
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut sub = direct.subscribe("big").await.unwrap();
    direct.request("nobody", "".into()).await.unwrap_err();
    let max = via.server_info().max_payload;
    let payload: Bytes = (0..max).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
    via.publish("big", payload.clone()).await.unwrap();
    let m = within(T, "max-size message", sub.next()).await.unwrap();
    assert_eq!(m.payload, payload);
    // The client library enforces the limit the proxy announced (the server's).
    let over: Bytes = vec![0u8; max + 1].into();
    assert!(via.publish("big", over).await.is_err());
    // Through the proxy to a proxied subscriber as well.
    let mut psub = via.subscribe("big2").await.unwrap();
    via.request("nobody", "".into()).await.unwrap_err();
    direct.publish("big2", payload.clone()).await.unwrap();
    let m = within(T, "max-size message via proxy", psub.next())
        .await
        .unwrap();
    assert_eq!(m.payload, payload);
}

#[tokio::test]
async fn ten_thousand_messages_arrive_in_order() {
    let (server, proxy) = setup().await;
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut sub = via.subscribe("seq").await.unwrap();
    via.request("nobody", "".into()).await.unwrap_err();
    const N: u32 = 10_000;
    let publisher = tokio::spawn(async move {
        for i in 0..N {
            direct.publish("seq", i.to_string().into()).await.unwrap();
        }
        direct.flush().await.unwrap();
        direct
    });
    within(Duration::from_secs(30), "10k messages", async {
        for i in 0..N {
            let m = sub.next().await.unwrap();
            assert_eq!(m.payload, Bytes::from(i.to_string()), "out of order at {i}");
        }
    })
    .await;
    publisher.await.unwrap();
    // And the other way: 10k published through the proxy, in order at a direct subscriber.
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut dsub = direct.subscribe("seq2").await.unwrap();
    direct.request("nobody", "".into()).await.unwrap_err();
    for i in 0..N {
        via.publish("seq2", i.to_string().into()).await.unwrap();
    }
    via.flush().await.unwrap();
    within(Duration::from_secs(30), "10k published via proxy", async {
        for i in 0..N {
            let m = dsub.next().await.unwrap();
            assert_eq!(m.payload, Bytes::from(i.to_string()), "out of order at {i}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients() {
    let (server, proxy) = setup().await;
    const CLIENTS: usize = 50;
    const PER: usize = 100;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let url = proxy.url();
        tasks.push(tokio::spawn(async move {
            let nc = async_nats::connect(url).await.unwrap();
            let subject = format!("many.{c}");
            let mut sub = nc.subscribe(subject.clone()).await.unwrap();
            nc.request("nobody", "".into()).await.unwrap_err();
            for i in 0..PER {
                nc.publish(subject.clone(), i.to_string().into())
                    .await
                    .unwrap();
            }
            for i in 0..PER {
                let m = sub.next().await.unwrap();
                assert_eq!(m.payload, Bytes::from(i.to_string()));
            }
        }));
    }
    within(Duration::from_secs(60), "all clients", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert_eq!(proxy.stats.clients_accepted.get(), CLIENTS as u64);
    drop(server);
}

#[tokio::test]
async fn client_ping_is_answered_after_upstream_processed_earlier_ops() {
    // A SUB followed by PING: when the PONG arrives, the subscription is registered on the
    // server, so a message published right after by another client is delivered.
    let (server, proxy) = setup().await;
    let direct = async_nats::connect(server.url()).await.unwrap();
    for round in 0..20 {
        let subject = format!("flush.{round}");
        let mut c = RawClient::connect(proxy.addr).await;
        c.send(format!("CONNECT {{\"verbose\":false}}\r\nSUB {subject} 1\r\nPING\r\n").as_bytes())
            .await;
        c.until(b"PONG\r\n").await;
        direct.publish(subject.clone(), "x".into()).await.unwrap();
        direct.flush().await.unwrap();
        let msg = c.until_or_closed(b"x\r\n").await;
        let closed = msg.is_none();
        let out = String::from_utf8_lossy(&msg.unwrap_or_default()).to_string();
        assert!(!closed);
        assert_eq!(out, format!("MSG {subject} 1 1\r\nx\r\n"));
    }
}

#[tokio::test]
async fn client_without_headers_gets_plain_msg() {
    let (server, proxy) = setup().await;
    let mut c = RawClient::connect(proxy.addr).await;
    c.send(b"CONNECT {\"verbose\":false}\r\nSUB foo 1\r\nPING\r\n")
        .await;
    c.until(b"PONG\r\n").await;
    let direct = async_nats::connect(server.url()).await.unwrap();
    let mut h = async_nats::HeaderMap::new();
    h.insert("A", "b");
    direct
        .publish_with_headers("foo", h, "hi".into())
        .await
        .unwrap();
    direct.flush().await.unwrap();
    let msg = c.until(b"hi\r\n").await;
    // What nats-server does for a subscriber without header support.
    assert_eq!(msg, b"MSG foo 1 2\r\nhi\r\n");
}

#[tokio::test]
async fn upstream_auth_failure_reaches_the_client() {
    init_logs();
    let server = NatsServer::start(ServerOpts {
        extra: "authorization { user: alice, password: s3cret }\n".into(),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start(&[server.url()]).await;
    // Wrong password: the client sees exactly the server's verdict.
    for input in [
        &b"CONNECT {\"verbose\":false,\"user\":\"alice\",\"pass\":\"wrong\"}\r\nPING\r\n"[..],
        b"CONNECT {\"verbose\":false}\r\nPING\r\n",
    ] {
        let direct = raw_exchange(server.addr(), input).await;
        let proxied = raw_exchange(proxy.addr, input).await;
        assert_eq!(proxied, direct);
        assert_eq!(
            proxied,
            ("-ERR 'Authorization Violation'\r\n".to_string(), true)
        );
    }
    let c = async_nats::connect(proxy.url()).await;
    assert!(c.is_err(), "async-nats must see the authorization failure");
    // Right password passes through.
    let c = async_nats::ConnectOptions::new()
        .user_and_password("alice".into(), "s3cret".into())
        .connect(proxy.url())
        .await
        .unwrap();
    let mut sub = c.subscribe("auth.ok").await.unwrap();
    c.publish("auth.ok", "y".into()).await.unwrap();
    assert_eq!(
        within(T, "authorized message", sub.next())
            .await
            .unwrap()
            .payload,
        Bytes::from("y")
    );
    // Credentials held by the proxy (in the upstream URL) replace the client's.
    let held = TestProxy::start(&[format!("nats://alice:s3cret@127.0.0.1:{}", server.port)]).await;
    let c = async_nats::connect(held.url()).await.unwrap();
    let mut sub = c.subscribe("auth.held").await.unwrap();
    c.publish("auth.held", "z".into()).await.unwrap();
    assert_eq!(
        within(T, "message with held credentials", sub.next())
            .await
            .unwrap()
            .payload,
        Bytes::from("z")
    );
}
