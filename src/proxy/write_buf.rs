//! What a driver has for a socket and the socket has not taken yet.
//!
//! Two shapes, one per direction:
//! - toward the client, one [`BytesMut`]: the session writes relayed `MSG`s into it
//!   directly (`Session::take_client_output`), so those bytes are copied once in all;
//! - toward an upstream, [`Chunks`]: the session's frames as they came, written with a
//!   vectored write. A run of client publishes is a slice of the client's read buffer
//!   that the session keeps anyway until a PONG confirms it, so queueing it costs no
//!   copy and no memory of its own; copied into one buffer, a burst grew that buffer
//!   to the backlog bound (8 MiB, doubling to 16 MiB of capacity) beside the same bytes
//!   held for re-sending, and the allocator kept what it had grown to (BENCHMARKS.md,
//!   issue 36).
//!
//! Bounds: neither refuses bytes; the driver stops reading the client while the
//! upstream write buffers hold `max_backlog` bytes, and closes a client whose write
//! buffer passes `max_client_pending` (a slow consumer). Once drained, a write buffer
//! keeps at most [`RETAIN_WRITE`] bytes (or [`RETAIN_CHUNKS`] slots) of capacity; a
//! larger one is released.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;

/// Capacity a drained client write buffer may keep; a larger one is released.
const RETAIN_WRITE: usize = 1024 * 1024;
/// Slots a drained upstream write queue may keep; a larger queue is released.
const RETAIN_CHUNKS: usize = 1024;
/// Chunks handed to one vectored write (Linux takes up to 1,024).
const MAX_IOV: usize = 64;

/// Bytes waiting for a socket.
pub(super) trait WriteBuf: Default {
    /// Bytes waiting.
    fn len(&self) -> usize;
    /// Writes what `io` takes now; `Ready(Ok)` once empty.
    fn poll_write_to<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>>;
}

impl WriteBuf for BytesMut {
    fn len(&self) -> usize {
        BytesMut::len(self)
    }

    fn poll_write_to<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            match Pin::new(&mut *io).poll_write(cx, self) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        // A buffer that grew toward a slow reader gives its memory back once drained.
        if self.capacity() > RETAIN_WRITE {
            *self = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

/// Frames in the order the session wrote them, each as it came.
#[derive(Debug, Default)]
pub(super) struct Chunks {
    queue: VecDeque<Bytes>,
    /// Bytes in `queue`.
    bytes: usize,
}

impl Chunks {
    /// Queues `b` behind what waits.
    pub(super) fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.bytes += b.len();
            self.queue.push_back(b);
        }
    }

    /// Drops the first `n` bytes: what a write took.
    fn consume(&mut self, mut n: usize) {
        self.bytes -= n;
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.queue.pop_front();
        }
    }
}

impl WriteBuf for Chunks {
    fn len(&self) -> usize {
        self.bytes
    }

    fn poll_write_to<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.bytes > 0 {
            let mut slices = [IoSlice::new(&[]); MAX_IOV];
            let mut used = 0;
            for (slot, b) in slices.iter_mut().zip(&self.queue) {
                *slot = IoSlice::new(b);
                used += 1;
            }
            match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..used]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.consume(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.queue.capacity() > RETAIN_CHUNKS {
            self.queue = VecDeque::new();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `per_write` bytes of each vectored write.
    struct Trickle {
        got: Vec<u8>,
        per_write: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.per_write);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut left = self.per_write;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(left);
                self.got.extend_from_slice(&b[..take]);
                (left, n) = (left - take, n + take);
            }
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn chunks_go_out_in_order_whatever_each_write_takes() {
        let frames: Vec<Bytes> = (0..200u32)
            .map(|i| Bytes::from(format!("PUB s {} {i}\r\n", i % 7)))
            .chain(std::iter::once(Bytes::new()))
            .collect();
        let want: Vec<u8> = frames.iter().flat_map(|b| b.to_vec()).collect();
        for per_write in [1, 5, 13, 4096] {
            let mut out = Chunks::default();
            frames.iter().cloned().for_each(|b| out.push(b));
            assert_eq!(out.len(), want.len());
            let mut w = Trickle {
                got: Vec::new(),
                per_write,
            };
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(out.poll_write_to(&mut w, &mut cx).is_ready());
            assert_eq!((w.got, out.len()), (want.clone(), 0), "{per_write}");
        }
    }
}
