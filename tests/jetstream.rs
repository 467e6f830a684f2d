//! A JetStream durable pull consumer read through the proxy exactly as Vector 0.51 reads
//! it (async-nats 0.42, `consumer.stream().max_messages_per_batch(200)`, stop at the first
//! `Err` item, ack every message).

mod common;
use common::*;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_style_pull_consumer_through_the_proxy() {
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
            name: "LOGS".into(),
            subjects: vec!["logs.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    s.create_consumer(pull::Config {
        durable_name: Some("CV".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    const N: u64 = 3000;
    for i in 0..N {
        js_direct
            .publish("logs.v", i.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    // The consumer goes through the proxy, as Vector's source would.
    let via = async_nats::connect(proxy.url()).await.unwrap();
    let js = jetstream::new(via);
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream("LOGS")
        .await
        .unwrap()
        .get_consumer("CV")
        .await
        .unwrap();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(200)
        .max_bytes_per_batch(0)
        .messages()
        .await
        .unwrap();
    let mut next = 0u64;
    within(Duration::from_secs(60), "all JetStream messages", async {
        // Vector's loop: `while let Some(Ok(msg)) = stream.next().await`.
        while next < N {
            let item = messages.next().await.expect("stream ended");
            let msg = match item {
                Ok(m) => m,
                Err(e) => {
                    panic!("Err item after {next} messages: {e} (Vector's source would stop here)")
                }
            };
            assert_eq!(msg.payload, bytes::Bytes::from(next.to_string()), "order");
            msg.ack().await.unwrap();
            next += 1;
        }
    })
    .await;
    // Every ack reached the server: nothing pending, nothing waiting for an ack.
    let mut c = js_direct
        .get_stream("LOGS")
        .await
        .unwrap()
        .get_consumer::<pull::Config>("CV")
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
