//! A JetStream durable pull consumer read through the proxy exactly as Vector 0.51 reads
//! it (async-nats 0.42, `consumer.stream().max_messages_per_batch(200)`, stop at the first
//! `Err` item, ack every message).

mod common;
use common::*;

use async_nats::jetstream::{self, consumer::pull, stream};
use natsproxy_kit::vector;
use std::ops::ControlFlow;
use std::time::Duration;

/// Stream, consumer and subject from the Vector configuration shipped in deploy/.
fn vector_source() -> (String, String, String) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/vector/vector.toml");
    let v: toml::Value = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let src = &v["sources"]["nats_logs"];
    (
        src["jetstream"]["stream"].as_str().unwrap().to_string(),
        src["jetstream"]["consumer"].as_str().unwrap().to_string(),
        src["subject"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_style_pull_consumer_through_the_proxy() {
    let (stream_name, consumer_name, subject) = vector_source();
    let publish_subject = subject.replace(['>', '*'], "v");
    init_logs();
    let server = NatsServer::start(ServerOpts {
        jetstream: true,
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start(&[server.url()]).await;

    // Set-up and publishing go straight to the server.
    let direct = async_nats::connect(server.url()).await.unwrap();
    let js_direct = jetstream::new(direct);
    let s = js_direct
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    s.create_consumer(pull::Config {
        durable_name: Some(consumer_name.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    const N: u64 = 3000;
    for i in 0..N {
        js_direct
            .publish(publish_subject.clone(), i.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    // The consumer goes through the proxy, as Vector's source would.
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let js = jetstream::new(via);
    let mut messages = vector::open(&js, &stream_name, &consumer_name)
        .await
        .unwrap();
    let mut next = 0u64;
    within(Duration::from_secs(60), "all JetStream messages", async {
        let end = vector::run(&mut messages, |msg| {
            assert_eq!(msg.payload, bytes::Bytes::from(next.to_string()), "order");
            next += 1;
            if next < N {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .await;
        assert_eq!(end, vector::End::Stopped, "after {next} messages");
    })
    .await;
    // Every ack reached the server: nothing pending, nothing waiting for an ack.
    let mut c = js_direct
        .get_stream(&stream_name)
        .await
        .unwrap()
        .get_consumer::<pull::Config>(&consumer_name)
        .await
        .unwrap();
    within(Duration::from_secs(10), "acks to settle", async {
        loop {
            let info = c.info().await.unwrap();
            if info.num_ack_pending == 0
                && info.num_pending == 0
                && info.ack_floor.stream_sequence == N
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(proxy.stats.clients_accepted.get(), 1);
}
