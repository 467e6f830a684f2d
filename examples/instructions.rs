//! Fixed work for instruction counts (callgrind), which are repeatable for a binary where
//! wall-clock benchmarks on a shared VM vary by ±15 %: 100,000 frames of 128 B in 64 KiB
//! reads (5 passes over a 20,000-frame stream, the copy into the read buffer included),
//! through one of five paths, the same as `benches/codec.rs` measures.
//!
//!   cargo build --release --example instructions
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!       target/release/examples/instructions decode-msg
//!   target/release/examples/instructions decode-msg 200   # wall clock: min of 200 runs
//!
//! Paths: decode-msg, decode-hmsg, decode-pub, session-msg (decode, route by sid,
//! relay), session-pub (decode, keep until confirmed, relay, confirm).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use natsproxy::proto::{encode, ClientDecoder, Limits, ServerDecoder};

#[path = "../tests/common/connected.rs"]
mod connected;
use connected::connected_session;

const FRAMES: usize = 20_000;
const PASSES: usize = 5;
const READ: usize = 64 * 1024;

/// A frame of the stream: the `n`-th JetStream delivery (each its own sequence, fixed
/// width so every frame has one length: the session keeps back a delivery sent again).
fn msg(headers: bool, n: usize) -> Vec<u8> {
    let h: &[u8] = b"NATS/1.0\r\nA: b\r\n\r\n";
    let reply = format!("$JS.ACK.LOGS.C.1.{n:06}.{n:06}.1795971532879267765.0");
    encode::msg(
        b"logs.app.v1",
        b"1",
        Some(reply.as_bytes()),
        headers.then_some(h),
        &[b'x'; 128],
    )
    .to_vec()
}

fn publish() -> Vec<u8> {
    encode::publish(b"logs.app.v1", None, None, &[b'x'; 128]).to_vec()
}

/// Feeds `stream` in `READ`-byte reads, as the driver reads a socket.
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

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "decode-msg".into());
    let repeats: usize = args
        .next()
        .map_or(1, |r| r.parse().expect("repeats: a number"));
    let frames: Vec<Vec<u8>> = (1..=FRAMES)
        .map(|n| match path.as_str() {
            "decode-msg" | "session-msg" => msg(false, n),
            "decode-hmsg" => msg(true, n),
            "decode-pub" | "session-pub" => publish(),
            other => panic!("unknown path {other}"),
        })
        .collect();
    let frame = frames[0].clone();
    let stream = frames.concat();
    if repeats == 1 {
        let count = run(&path, &stream, frame.len());
        assert_eq!(count, FRAMES * PASSES, "{path}: every frame through");
        println!("{path}: {count} frames of {} bytes", frame.len());
        return;
    }
    // Wall clock, for A/B runs on a noisy machine: the fastest of `repeats` runs is the
    // one least disturbed by other work.
    let mut ns: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            let count = run(&path, &stream, frame.len());
            assert_eq!(count, FRAMES * PASSES, "{path}: every frame through");
            t.elapsed().as_nanos() as f64 / count as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    println!(
        "{path}: ns per frame min {:.2} median {:.2} over {repeats} runs",
        ns[0],
        ns[repeats / 2]
    );
}

/// Runs `path` over `stream` [`PASSES`] times; returns the frames that went through.
fn run(path: &str, stream: &[u8], frame_len: usize) -> usize {
    let mut count = 0usize;
    match path {
        "decode-pub" => {
            let limits = Limits {
                max_payload: 1 << 20,
                ..Limits::default()
            };
            for _ in 0..PASSES {
                let mut d = ClientDecoder::new(limits);
                feed(stream, |buf| {
                    while let Ok(Some(_)) = d.decode(buf) {
                        count += 1;
                    }
                });
            }
        }
        "decode-msg" | "decode-hmsg" => {
            for _ in 0..PASSES {
                let mut d = ServerDecoder::new(Limits::upstream());
                feed(stream, |buf| {
                    while let Ok(Some(_)) = d.decode(buf) {
                        count += 1;
                    }
                });
            }
        }
        "session-msg" => {
            let (mut s, epoch) = connected_session("logs.>");
            let mut now = Instant::now();
            let mut wbuf = BytesMut::with_capacity(1 << 20);
            for _ in 0..PASSES {
                // Past the re-send window: the stream's deliveries are new again.
                now += Duration::from_secs(11);
                feed(stream, |buf| {
                    s.handle_upstream_bytes(epoch, buf, now);
                    s.take_client_output(&mut wbuf);
                    count += wbuf.len();
                    wbuf.clear();
                    while s.poll_action().is_some() {}
                });
            }
            count /= frame_len;
        }
        _ => {
            let (mut s, epoch) = connected_session("logs.>");
            let now = Instant::now();
            for _ in 0..PASSES {
                feed(stream, |buf| {
                    let before = buf.len();
                    s.handle_client_bytes(buf, now);
                    count += (before - buf.len()) / frame_len;
                    while s.poll_action().is_some() {}
                    // The upstream confirms what was written, as it would.
                    let mut pong = BytesMut::from(&b"PONG\r\n"[..]);
                    s.handle_upstream_bytes(epoch, &mut pong, now);
                    while s.poll_action().is_some() {}
                });
            }
        }
    }
    count
}
