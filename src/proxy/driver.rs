//! Per-client driver: the only place that touches sockets and timers for a client. It
//! feeds bytes and events into the [`Session`] and carries out its [`Action`]s; it holds
//! no protocol logic.
//!
//! Buffers and their bounds:
//! - client read buffer: grows to one frame (control line ≤ 4 KiB + payload ≤ max_payload);
//! - client write buffer: `max_client_pending`; past it the client is a slow consumer and
//!   is closed (as nats-server does, without `-ERR`);
//! - upstream write buffer + session backlog: `max_backlog`; past it the client is not
//!   read until the upstream drains (backpressure, no growth);
//! - upstream read buffer: one frame (≤ 64 MiB + control line, the server's own limit).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::io::poll_read_buf;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Stats;
use crate::config::Config;
use crate::session::{Action, CloseReason, Epoch, Session, SessionStats};

/// Spare capacity ensured before each read.
const READ_CHUNK: usize = 64 * 1024;

/// Refuses a client over the connection cap, as nats-server does.
pub(super) async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(b"-ERR 'maximum connections exceeded'\r\n"),
    )
    .await;
}

/// One socket with its buffers.
struct Conn {
    io: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

impl Conn {
    fn new(io: TcpStream) -> Conn {
        let _ = io.set_nodelay(true);
        Conn {
            io,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::new(),
        }
    }

    /// Writes as much of `wbuf` as the socket takes. Ready(Err) on failure.
    fn poll_flush_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.wbuf.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.wbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.wbuf.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf)
    }
}

struct Upstream {
    epoch: Epoch,
    conn: Conn,
    /// Close once the write buffer is flushed.
    closing: bool,
}

type DialFuture = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

enum Event {
    Shutdown,
    ClientData,
    ClientGone,
    ClientFlushedAndClosing,
    UpstreamData(Epoch),
    UpstreamLost(Epoch),
    Dialed(Epoch, io::Result<TcpStream>),
    Timer,
}

struct Driver<'a> {
    cfg: &'a Config,
    stats: &'a Stats,
    session: Session,
    client: Conn,
    client_closing: Option<CloseReason>,
    ups: Vec<Upstream>,
    dials: Vec<(Epoch, DialFuture)>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    /// Alternates which side is read first, so neither starves the other.
    upstream_first: bool,
    /// Session counters already added to `stats`.
    stats_seen: SessionStats,
}

/// Serves one client until it or the session closes, or shutdown.
pub(super) async fn serve(
    stream: TcpStream,
    cfg: &Config,
    stats: &Stats,
    shutdown: CancellationToken,
) {
    let now = Instant::now();
    let mut d = Driver {
        cfg,
        stats,
        session: Session::new(cfg.session(), now.into_std()),
        client: Conn::new(stream),
        client_closing: None,
        ups: Vec::new(),
        dials: Vec::new(),
        timer: Box::pin(tokio::time::sleep_until(now + Duration::from_secs(3600))),
        timer_at: None,
        upstream_first: false,
        stats_seen: SessionStats::default(),
    };
    d.run(shutdown).await;
}

impl Driver<'_> {
    async fn run(&mut self, shutdown: CancellationToken) {
        let mut cancelled = Box::pin(shutdown.cancelled_owned());
        loop {
            self.apply_actions();
            if let Some(reason) = self.client_closing {
                if self.client.wbuf.is_empty() {
                    let _ = self.client.io.shutdown().await;
                    debug!(?reason, "client closed");
                    return;
                }
            }
            self.sync_stats();
            self.arm_timer();
            let ev = std::future::poll_fn(|cx| self.poll_event(cx, cancelled.as_mut())).await;
            let now = Instant::now().into_std();
            match ev {
                Event::Shutdown => {
                    self.session.shutdown();
                    self.apply_actions();
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        self.client.io.write_all_buf(&mut self.client.wbuf),
                    )
                    .await;
                    return;
                }
                Event::ClientData => {
                    self.session.handle_client_bytes(&mut self.client.rbuf, now);
                }
                Event::ClientGone => {
                    self.session.handle_client_closed();
                    self.apply_actions();
                    return;
                }
                Event::ClientFlushedAndClosing => {}
                Event::UpstreamData(epoch) => {
                    if let Some(u) = self.ups.iter_mut().find(|u| u.epoch == epoch) {
                        self.session
                            .handle_upstream_bytes(epoch, &mut u.conn.rbuf, now);
                    }
                    if self.client.wbuf.len() > self.cfg.max_client_pending {
                        self.stats
                            .slow_consumers
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        warn!(
                            pending = self.client.wbuf.len(),
                            "slow consumer: closing client"
                        );
                        self.session.handle_client_closed();
                        self.apply_actions();
                        return;
                    }
                }
                Event::UpstreamLost(epoch) => {
                    self.ups.retain(|u| u.epoch != epoch);
                    self.session.handle_upstream_lost(epoch, now);
                }
                Event::Dialed(epoch, Ok(stream)) => {
                    self.stats
                        .upstream_connects
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.ups.push(Upstream {
                        epoch,
                        conn: Conn::new(stream),
                        closing: false,
                    });
                    self.session.handle_upstream_connected(epoch, now);
                }
                Event::Dialed(epoch, Err(e)) => {
                    info!(%epoch, error = %e, "upstream dial failed");
                    self.session.handle_upstream_lost(epoch, now);
                }
                Event::Timer => {
                    self.timer_at = None;
                    self.session.handle_timeout(now);
                }
            }
        }
    }

    /// Adds the session's new counts to the process-wide ones (cheap: a struct compare).
    fn sync_stats(&mut self) {
        let now = self.session.stats();
        if *now != self.stats_seen {
            self.stats.add_session(&self.stats_seen, now);
            self.stats_seen = now.clone();
        }
    }

    fn arm_timer(&mut self) {
        let want = self.session.poll_timeout().map(Instant::from_std);
        if want != self.timer_at {
            self.timer_at = want;
            if let Some(t) = want {
                self.timer.as_mut().reset(t);
            }
        }
    }

    fn apply_actions(&mut self) {
        while let Some(a) = self.session.poll_action() {
            match a {
                Action::ToClient(b) => {
                    if self.client_closing.is_none() {
                        self.client.wbuf.extend_from_slice(&b);
                    }
                }
                Action::ToUpstream(epoch, b) => {
                    if let Some(u) = self.ups.iter_mut().find(|u| u.epoch == epoch) {
                        u.conn.wbuf.extend_from_slice(&b);
                    }
                }
                Action::Dial { epoch, addr } => {
                    let timeout = self.cfg.connect_timeout;
                    let fut = async move {
                        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                            Ok(r) => r,
                            Err(_) => Err(io::ErrorKind::TimedOut.into()),
                        }
                    };
                    self.dials.push((epoch, Box::pin(fut)));
                }
                Action::CloseUpstream(epoch) => {
                    self.dials.retain(|d| d.0 != epoch);
                    if let Some(u) = self.ups.iter_mut().find(|u| u.epoch == epoch) {
                        u.closing = true;
                    }
                }
                Action::CloseClient(reason) => {
                    self.client_closing = Some(reason);
                }
            }
        }
    }

    fn upstream_backlog(&self) -> usize {
        self.ups.iter().map(|u| u.conn.wbuf.len()).sum()
    }

    fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
        cancelled: Pin<&mut tokio_util::sync::WaitForCancellationFutureOwned>,
    ) -> Poll<Event> {
        if cancelled.poll(cx).is_ready() {
            return Poll::Ready(Event::Shutdown);
        }
        // Writes first: they free buffer space and never produce input.
        if let Poll::Ready(Err(e)) = self.client.poll_flush_buf(cx) {
            debug!(error = %e, "client write failed");
            return Poll::Ready(Event::ClientGone);
        }
        if self.client_closing.is_some() && self.client.wbuf.is_empty() {
            return Poll::Ready(Event::ClientFlushedAndClosing);
        }
        let mut i = 0;
        while i < self.ups.len() {
            let u = &mut self.ups[i];
            match u.conn.poll_flush_buf(cx) {
                Poll::Ready(Err(_)) => return Poll::Ready(Event::UpstreamLost(u.epoch)),
                Poll::Ready(Ok(())) if u.closing => {
                    self.ups.swap_remove(i);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        self.upstream_first = !self.upstream_first;
        if self.upstream_first {
            if let Poll::Ready(ev) = self.poll_upstream_reads(cx) {
                return Poll::Ready(ev);
            }
            if let Poll::Ready(ev) = self.poll_client_read(cx) {
                return Poll::Ready(ev);
            }
        } else {
            if let Poll::Ready(ev) = self.poll_client_read(cx) {
                return Poll::Ready(ev);
            }
            if let Poll::Ready(ev) = self.poll_upstream_reads(cx) {
                return Poll::Ready(ev);
            }
        }
        for i in 0..self.dials.len() {
            if let Poll::Ready(r) = self.dials[i].1.as_mut().poll(cx) {
                let (epoch, _) = self.dials.swap_remove(i);
                return Poll::Ready(Event::Dialed(epoch, r));
            }
        }
        if self.timer_at.is_some() && self.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Event::Timer);
        }
        Poll::Pending
    }

    fn poll_client_read(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        let may_read = self.client_closing.is_none()
            && self.session.wants_client_input()
            && self.upstream_backlog() < self.cfg.max_backlog;
        if !may_read {
            return Poll::Pending;
        }
        match self.client.poll_read(cx) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(Event::ClientGone),
            Poll::Ready(Ok(_)) => Poll::Ready(Event::ClientData),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_upstream_reads(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        for u in self.ups.iter_mut().filter(|u| !u.closing) {
            match u.conn.poll_read(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return Poll::Ready(Event::UpstreamLost(u.epoch))
                }
                Poll::Ready(Ok(_)) => return Poll::Ready(Event::UpstreamData(u.epoch)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}
