//! Codec and session micro-benchmarks: MSG/HMSG/PUB streams of 16 B … 64 KiB payloads,
//! fed in 64 KiB reads (what the driver reads at a time), through the decoder alone and
//! through the whole per-connection state machine.
//!
//! cargo bench --bench codec

use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use natsproxy::proto::{encode, ClientDecoder, Limits, ServerDecoder};

#[path = "../tests/common/connected.rs"]
mod connected;
use connected::connected_session;

const SIZES: [usize; 4] = [16, 128, 1024, 64 * 1024];
const READ: usize = 64 * 1024;
/// Bytes of frames per benchmark iteration.
const STREAM: usize = 4 * 1024 * 1024;

fn frames(frame: &[u8]) -> (Vec<u8>, usize) {
    let n = (STREAM / frame.len()).max(1);
    (frame.repeat(n), n)
}

fn msg_stream(size: usize, headers: bool) -> (Vec<u8>, usize) {
    let payload = vec![b'x'; size];
    let h: &[u8] = b"NATS/1.0\r\nA: b\r\n\r\n";
    frames(&encode::msg(
        b"logs.app.v1",
        b"1",
        Some(b"$JS.ACK.LOGS.C.1.5.5.1795971532879267765.0"),
        headers.then_some(h),
        &payload,
    ))
}

/// JetStream deliveries of `size` bytes, each with its own sequence (the session keeps
/// back the same delivery sent again), about [`STREAM`] bytes of them.
fn delivery_stream(size: usize) -> (Vec<u8>, usize) {
    let payload = vec![b'x'; size];
    let mut out = Vec::with_capacity(STREAM + 1024);
    let mut n = 0;
    while out.len() < STREAM {
        n += 1;
        let reply = format!("$JS.ACK.LOGS.C.1.{n}.{n}.1795971532879267765.0");
        out.extend_from_slice(&encode::msg(
            b"logs.app.v1",
            b"1",
            Some(reply.as_bytes()),
            None,
            &payload,
        ));
    }
    (out, n)
}

fn pub_stream(size: usize) -> (Vec<u8>, usize) {
    frames(&encode::publish(
        b"logs.app.v1",
        None,
        None,
        &vec![b'x'; size],
    ))
}

/// Feeds `stream` in READ-sized chunks to `f`, as the driver does.
fn feed(stream: &[u8], mut f: impl FnMut(&mut BytesMut)) {
    let mut buf = BytesMut::with_capacity(READ * 2);
    for chunk in stream.chunks(READ) {
        if buf.capacity() - buf.len() < READ {
            buf.reserve(READ);
        }
        buf.extend_from_slice(chunk);
        f(&mut buf);
    }
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    for size in SIZES {
        for (name, (stream, n)) in [
            ("MSG", msg_stream(size, false)),
            ("HMSG", msg_stream(size, true)),
            ("PUB", pub_stream(size)),
        ] {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(name, size), &stream, |b, stream| {
                b.iter(|| {
                    let mut count = 0;
                    if name == "PUB" {
                        let mut d = ClientDecoder::new(Limits {
                            max_payload: 1 << 20,
                            ..Limits::default()
                        });
                        feed(stream, |buf| {
                            while let Ok(Some(_)) = d.decode(buf) {
                                count += 1;
                            }
                        });
                    } else {
                        let mut d = ServerDecoder::new(Limits::upstream());
                        feed(stream, |buf| {
                            while let Ok(Some(_)) = d.decode(buf) {
                                count += 1;
                            }
                        });
                    }
                    assert_eq!(count, n);
                })
            });
        }
    }
    g.finish();
}

fn session(c: &mut Criterion) {
    let mut g = c.benchmark_group("session");
    for size in SIZES {
        let (stream, n) = delivery_stream(size);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(
            BenchmarkId::new("MSG upstream→client", size),
            &stream,
            |b, stream| {
                let (mut s, epoch) = connected_session("logs.>");
                let mut now = Instant::now();
                // As the driver does: the client's bytes go into its write buffer.
                let mut wbuf = BytesMut::with_capacity(1 << 20);
                b.iter(|| {
                    // Past the re-send window: the stream's deliveries are new again.
                    now += Duration::from_secs(11);
                    let mut out = 0usize;
                    feed(stream, |buf| {
                        s.handle_upstream_bytes(epoch, buf, now);
                        s.take_client_output(&mut wbuf);
                        out += wbuf.len();
                        wbuf.clear();
                        while s.poll_action().is_some() {}
                    });
                    assert!(out >= stream.len(), "every delivery relayed");
                })
            },
        );
        let (stream, n) = pub_stream(size);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(
            BenchmarkId::new("PUB client→upstream", size),
            &stream,
            |b, stream| {
                let (mut s, epoch) = connected_session("logs.>");
                let now = Instant::now();
                b.iter(|| {
                    feed(stream, |buf| {
                        s.handle_client_bytes(buf, now);
                        while s.poll_action().is_some() {}
                        // The upstream confirms what was written, as it would.
                        let mut pong = BytesMut::from(&b"PONG\r\n"[..]);
                        s.handle_upstream_bytes(epoch, &mut pong, now);
                        while s.poll_action().is_some() {}
                    });
                })
            },
        );
    }
    g.finish();
}

fn bytes_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_bytes");
    for size in [1024usize, 64 * 1024] {
        let (stream, _) = msg_stream(size, false);
        g.throughput(Throughput::Bytes(stream.len() as u64));
        g.bench_with_input(BenchmarkId::new("MSG", size), &stream, |b, stream| {
            b.iter(|| {
                let mut d = ServerDecoder::new(Limits::upstream());
                feed(stream, |buf| while let Ok(Some(_)) = d.decode(buf) {});
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = decode, session, bytes_throughput
}
criterion_main!(benches);
