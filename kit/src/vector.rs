//! Vector 0.51's JetStream source loop on async-nats 0.42: the one copy that the demo,
//! the integration tests and the end-to-end benchmark run, so that what proves Vector
//! fidelity cannot drift from what Vector does.
//!
//! Vector's `nats` source with `jetstream` set opens the durable pull consumer's message
//! stream with `max_messages_per_batch(200)` and `max_bytes_per_batch(0)`, reads it as
//! `while let Some(Ok(msg)) = stream.next().await`, and acks each message after handing
//! it on (a failed ack is logged, not fatal). The first `Err` item ends the loop and with
//! it the source: Vector does not open the stream again. That last rule is the one
//! natsproxy exists for.

use std::ops::ControlFlow;

use async_nats::jetstream::{self, consumer::pull, Message};
use futures::StreamExt;

/// Why the loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The stream yielded an `Err` item: Vector's source stops here.
    ErrItem(String),
    /// The stream ended (`None`): Vector's source stops too.
    StreamEnded,
    /// The caller's callback said stop (a test or the demo has what it wanted).
    Stopped,
}

/// Why [`open`] failed, and on what.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("stream {stream}: {source}")]
    Stream {
        stream: String,
        #[source]
        source: jetstream::context::GetStreamError,
    },
    #[error("consumer {consumer}: {source}")]
    Consumer {
        consumer: String,
        #[source]
        source: async_nats::Error,
    },
    #[error("messages of {consumer}: {source}")]
    Messages {
        consumer: String,
        #[source]
        source: jetstream::consumer::StreamError,
    },
}

/// Opens the durable pull consumer `consumer` of `stream` as Vector does.
pub async fn open(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<pull::Stream, OpenError> {
    let durable: jetstream::consumer::PullConsumer = js
        .get_stream(stream)
        .await
        .map_err(|source| OpenError::Stream {
            stream: stream.to_owned(),
            source,
        })?
        .get_consumer(consumer)
        .await
        .map_err(|source| OpenError::Consumer {
            consumer: consumer.to_owned(),
            source,
        })?;
    durable
        .stream()
        .max_messages_per_batch(200)
        .max_bytes_per_batch(0)
        .messages()
        .await
        .map_err(|source| OpenError::Messages {
            consumer: consumer.to_owned(),
            source,
        })
}

/// Vector's loop over `messages`: `on_msg` sees each message before it is acked, and
/// may stop the loop.
pub async fn run(
    messages: &mut pull::Stream,
    mut on_msg: impl FnMut(&Message) -> ControlFlow<()>,
) -> End {
    while let Some(item) = messages.next().await {
        match item {
            Ok(m) => {
                let flow = on_msg(&m);
                // Vector logs a failed ack and carries on.
                let _ = m.ack().await;
                if flow.is_break() {
                    return End::Stopped;
                }
            }
            Err(e) => return End::ErrItem(format!("{e:?}")),
        }
    }
    End::StreamEnded
}
