//! Messages that pass through unmodified cost no allocation on the relay path: counted
//! with a counting global allocator over 20,000 MSGs and PUBs through the session.
#![allow(unsafe_code)] // the GlobalAlloc impl below; nothing else

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::BytesMut;
use natsproxy::proto::encode;
use natsproxy::session::Action;

#[path = "common/connected.rs"]
mod connected;
use connected::connected_session;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations per message over `rounds` passes of `n` messages through `step`, after
/// one warm-up pass (buffers reach their steady size); pass `k` feeds `streams[k]` (the
/// last one again past the end).
fn per_message(streams: &[Vec<u8>], n: usize, mut step: impl FnMut(&mut BytesMut)) -> f64 {
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut k = 0;
    let mut pass = |buf: &mut BytesMut| {
        let stream = &streams[k.min(streams.len() - 1)];
        k += 1;
        for chunk in stream.chunks(64 * 1024) {
            if buf.capacity() - buf.len() < chunk.len() {
                buf.reserve(128 * 1024);
            }
            buf.extend_from_slice(chunk);
            step(buf);
        }
    };
    pass(&mut buf);
    let before = ALLOCS.load(Ordering::Relaxed);
    let rounds = 4;
    for _ in 0..rounds {
        pass(&mut buf);
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / (rounds * n) as f64
}

#[test]
fn relaying_messages_allocates_nothing_per_message() {
    const N: usize = 5000;
    // JetStream deliveries, each a new one (the session remembers what the client got
    // and keeps back the same delivery sent again): five passes of N in sequence.
    let streams: Vec<Vec<u8>> = (0..5)
        .map(|pass| {
            (1..=N)
                .flat_map(|i| {
                    let seq = pass * N + i;
                    let reply = format!("$JS.ACK.LOGS.C.1.{seq}.{seq}.1796540366875000000.0");
                    encode::msg(
                        b"logs.app",
                        b"1",
                        Some(reply.as_bytes()),
                        None,
                        &[b'x'; 128],
                    )
                })
                .collect()
        })
        .collect();
    let (mut s, epoch) = connected_session("logs.>");
    let now = Instant::now();
    let mut out = 0usize;
    // As the driver does: take the client's bytes into its write buffer, "write" them.
    let mut wbuf = BytesMut::with_capacity(1 << 20);
    let per = per_message(&streams, N, |buf| {
        s.handle_upstream_bytes(epoch, buf, now);
        s.take_client_output(&mut wbuf);
        out += wbuf.len();
        wbuf.clear();
        while let Some(a) = s.poll_action() {
            assert!(!matches!(a, Action::ToClient(_)), "all taken above");
        }
    });
    assert_eq!(out, streams.iter().map(Vec::len).sum::<usize>());
    println!("MSG upstream→client: {per:.4} allocations per message");
    assert!(per < 0.01, "{per} allocations per message");

    let pubf = encode::publish(b"logs.app", None, None, &[b'y'; 128]);
    let stream = pubf.repeat(N);
    let mut written = 0usize;
    let per = per_message(&[stream], N, |buf| {
        s.handle_client_bytes(buf, now);
        while let Some(a) = s.poll_action() {
            if let Action::ToUpstream(_, _) = a {
                written += 1;
            }
        }
        // The server confirms each batch, as it does.
        let mut pong = BytesMut::from(&b"PONG\r\n"[..]);
        s.handle_upstream_bytes(epoch, &mut pong, now);
        while s.poll_action().is_some() {}
    });
    assert!(written >= 5 * N);
    println!("PUB client→upstream: {per:.4} allocations per message");
    assert!(per < 0.01, "{per} allocations per message");
}
