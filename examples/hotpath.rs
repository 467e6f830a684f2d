//! The relay hot path without sockets, for instruction-count profiles: feeds a stream of
//! `MSG` frames (payload size and count from the command line) through a connected
//! session in 64 KiB reads, as the driver does, and collects what goes to the client.
//!
//!   cargo build --release --example hotpath
//!   valgrind --tool=callgrind target/release/examples/hotpath 128 200000
//!
//! Instruction counts are stable on a shared VM where wall-clock benchmarks vary by ±15 %.

use std::time::Instant;

use bytes::BytesMut;
use natsproxy::proto::encode;

#[path = "../tests/common/connected.rs"]
mod connected;
use connected::connected_session;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(128);
    let count: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let frame = encode::msg(b"bench.sub.1234567", b"1", None, None, &vec![b'x'; size]);
    let stream = frame.repeat(count);

    let (mut s, epoch) = connected_session("bench.>");
    let now = Instant::now();

    const READ: usize = 64 * 1024;
    let mut rbuf = BytesMut::with_capacity(READ);
    let mut wbuf = BytesMut::with_capacity(1 << 20);
    let mut out = 0usize;
    let started = Instant::now();
    for chunk in stream.chunks(READ) {
        if rbuf.capacity() - rbuf.len() < READ / 4 {
            rbuf.reserve(READ);
        }
        rbuf.extend_from_slice(chunk);
        s.handle_upstream_bytes(epoch, &mut rbuf, now);
        s.take_client_output(&mut wbuf);
        out += wbuf.len();
        wbuf.clear();
        while s.poll_action().is_some() {}
    }
    let took = started.elapsed();
    assert_eq!(out, stream.len(), "every byte reaches the client");
    println!(
        "{count} x {size} B: {:.2} M msg/s ({:?})",
        count as f64 / took.as_secs_f64() / 1e6,
        took
    );
}
