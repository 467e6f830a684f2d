//! Per-client driver: the only place that touches sockets and timers for a client. It
//! feeds bytes and events into the [`Session`] and carries out its [`Action`]s; it holds
//! no protocol logic.
//!
//! Buffers and their bounds:
//! - client read buffer: grows to one frame (control line ≤ 4 KiB + payload ≤ max_payload);
//! - client write buffer: `max_client_pending`; past it the client is a slow consumer and
//!   is closed (as nats-server does, without `-ERR`); once drained, it keeps at most
//!   `RETAIN_WRITE` (1 MiB) of capacity (see `write_buf`);
//! - upstream write queue + session backlog: `max_backlog`; past it the client is not
//!   read until the upstream drains (backpressure, no growth). The queue holds the
//!   session's frames uncopied (see `write_buf`);
//! - upstream read buffer: one frame (≤ 64 MiB + control line, the server's own limit).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::io::poll_read_buf;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::dial::{DialError, DialStage, Dialer};
use super::report::{self, Holding, Reported};
use super::tls::UpstreamIo;
use super::watch::{ClientWatch, Member};
use super::write_buf::{Chunks, WriteBuf};
use super::Stats;
use crate::config::Config;
use crate::session::{Action, CloseReason, Epoch, Session};

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

/// One socket with its buffers: what was read, and what waits to be written.
struct Conn<S, O> {
    io: S,
    rbuf: BytesMut,
    wbuf: O,
}

impl Conn<TcpStream, BytesMut> {
    fn new(io: TcpStream) -> Self {
        let _ = io.set_nodelay(true);
        Conn::with_read(io, BytesMut::with_capacity(READ_CHUNK))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin, O: WriteBuf> Conn<S, O> {
    /// A connection whose first bytes were already read (the upstream INFO).
    fn with_read(io: S, rbuf: BytesMut) -> Self {
        Conn {
            io,
            rbuf,
            wbuf: O::default(),
        }
    }

    /// Writes as much of `wbuf` as the socket takes. Ready(Err) on failure.
    fn poll_flush_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.wbuf.poll_write_to(&mut self.io, cx)
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
    /// `host:port`, the metrics label.
    addr: String,
    conn: Conn<UpstreamIo, Chunks>,
    /// Close once the write buffer is flushed.
    closing: bool,
}

type DialFuture = Pin<Box<dyn Future<Output = Result<(UpstreamIo, BytesMut), DialError>> + Send>>;

enum Event {
    Shutdown,
    ClientData,
    /// The client closed (`None`: at a message boundary or not, it sent EOF) or its
    /// socket failed.
    ClientGone(Option<io::Error>),
    ClientFlushedAndClosing,
    UpstreamData(Epoch),
    /// More than `max_client_pending` bytes the client's socket would not take.
    SlowConsumer,
    /// The upstream of this epoch closed (`None`: EOF) or its socket failed.
    UpstreamLost(Epoch, Option<io::Error>),
    Dialed(Epoch, String, Result<(UpstreamIo, BytesMut), DialError>),
    Timer,
}

struct Driver<'a> {
    cfg: &'a Config,
    /// This client in the client watch (`/livez/client`).
    member: Member<'a>,
    dialer: &'a Arc<Dialer>,
    stats: &'a Stats,
    session: Session,
    client: Conn<TcpStream, BytesMut>,
    client_closing: Option<CloseReason>,
    ups: Vec<Upstream>,
    dials: Vec<(Epoch, String, DialFuture)>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    /// Alternates which side is read first, so neither starves the other.
    upstream_first: bool,
    /// What this driver already added to `stats`.
    reported: Reported,
    bytes_to_client: u64,
    bytes_to_upstream: u64,
    /// The client's CONNECT name is in the span.
    named: bool,
}

/// The process-wide parts a driver works with.
pub(super) struct Shared<'a> {
    pub cfg: &'a Config,
    pub dialer: &'a Arc<Dialer>,
    pub stats: &'a Stats,
    pub watch: &'a ClientWatch,
}

/// Serves client connection `conn` until it or the session closes, or shutdown.
pub(super) async fn serve(
    stream: TcpStream,
    conn: u64,
    shared: Shared<'_>,
    shutdown: CancellationToken,
) {
    let Shared {
        cfg,
        dialer,
        stats,
        watch,
    } = shared;
    let now = Instant::now();
    let mut d = Driver {
        cfg,
        member: Member::new(watch, conn, now.into_std()),
        dialer,
        stats,
        session: Session::new(cfg.session(), now.into_std()),
        client: Conn::new(stream),
        client_closing: None,
        ups: Vec::new(),
        dials: Vec::new(),
        timer: Box::pin(tokio::time::sleep_until(now + Duration::from_secs(3600))),
        timer_at: None,
        upstream_first: false,
        reported: Reported::default(),
        bytes_to_client: 0,
        bytes_to_upstream: 0,
        named: false,
    };
    info!("client connected");
    let started = Instant::now();
    let reason = d.run(shutdown).await;
    d.sync_stats();
    d.unreport();
    d.member.leave(Instant::now().into_std());
    let s = d.session.stats();
    info!(
        ?reason,
        secs = started.elapsed().as_secs(),
        migrations = s.migrations,
        failovers = s.failovers,
        messages_in = s.msgs_to_upstream,
        messages_out = s.msgs_to_client,
        "client closed"
    );
}

impl Driver<'_> {
    /// Runs until the client is closed; returns why.
    async fn run(&mut self, shutdown: CancellationToken) -> CloseReason {
        let mut cancelled = Box::pin(shutdown.cancelled_owned());
        loop {
            self.apply_actions();
            if let Some(reason) = self.client_closing {
                if self.client.wbuf.is_empty() {
                    let _ = self.client.io.shutdown().await;
                    return reason;
                }
            }
            self.sync_stats();
            self.arm_timer();
            let ev = std::future::poll_fn(|cx| self.poll_event(cx, cancelled.as_mut())).await;
            let now = Instant::now();
            if let Some(reason) = self.handle(ev, now.into_std()) {
                return self.close(reason).await;
            }
            self.fire_late_timer();
            self.member.observe(&self.session, now.into_std());
        }
    }

    /// Hands one event to the session; `Some` when it ends the client's connection.
    fn handle(&mut self, ev: Event, now: std::time::Instant) -> Option<CloseReason> {
        match ev {
            Event::Shutdown => return Some(CloseReason::Shutdown),
            Event::ClientData => self.on_client_data(now),
            Event::ClientGone(e) => {
                match &e {
                    Some(e) => debug!(error = %e, "client connection failed"),
                    None => debug!("client closed its connection"),
                }
                return Some(CloseReason::ClientGone);
            }
            Event::ClientFlushedAndClosing => {}
            Event::SlowConsumer => {
                let pending = self.client.wbuf.len();
                self.stats.slow_consumers.inc();
                self.stats
                    .max_slow_consumer_pending
                    .fetch_max(pending as u64, std::sync::atomic::Ordering::Relaxed);
                warn!(pending, "slow consumer: closing client");
                return Some(CloseReason::SlowConsumer);
            }
            Event::UpstreamData(epoch) => self.on_upstream_data(epoch, now),
            Event::UpstreamLost(epoch, e) => self.on_upstream_lost(epoch, e, now),
            Event::Dialed(epoch, addr, result) => self.on_dialed(epoch, addr, result, now),
            Event::Timer => {
                self.timer_at = None;
                self.session.handle_timeout(now);
            }
        }
        None
    }

    /// Ends the client's connection: on shutdown the session's last words get a second
    /// to be written; otherwise the session learns the client is gone.
    async fn close(&mut self, reason: CloseReason) -> CloseReason {
        if reason == CloseReason::Shutdown {
            self.session.shutdown();
            self.apply_actions();
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                self.client.io.write_all_buf(&mut self.client.wbuf),
            )
            .await;
        } else {
            self.session.handle_client_closed();
            self.apply_actions();
        }
        reason
    }

    fn on_client_data(&mut self, now: std::time::Instant) {
        self.session.handle_client_bytes(&mut self.client.rbuf, now);
        if !self.named {
            if let Some(n) = self.session.client_name() {
                // Every later line of this client's span says who it is.
                tracing::Span::current().record("client", n);
                self.named = true;
            }
        }
    }

    fn on_upstream_data(&mut self, epoch: Epoch, now: std::time::Instant) {
        let peers = self.stats.sessions_migrating.get().max(0) as usize;
        self.session
            .set_peers_moving(peers.saturating_sub(usize::from(self.session.is_migrating())));
        if let Some(u) = self.ups.iter_mut().find(|u| u.epoch == epoch) {
            self.session
                .handle_upstream_bytes(epoch, &mut u.conn.rbuf, now);
        }
    }

    fn on_upstream_lost(&mut self, epoch: Epoch, e: Option<io::Error>, now: std::time::Instant) {
        if let Some(i) = self.ups.iter().position(|u| u.epoch == epoch) {
            let u = self.ups.swap_remove(i);
            let why = e.map_or_else(|| "closed by the server".to_owned(), |e| e.to_string());
            info!(%epoch, upstream = %u.addr, error = %why, "upstream connection lost");
            report::link_closed(self.stats, &u.addr);
        }
        self.session.handle_upstream_lost(epoch, now);
    }

    fn on_dialed(
        &mut self,
        epoch: Epoch,
        addr: String,
        result: Result<(UpstreamIo, BytesMut), DialError>,
        now: std::time::Instant,
    ) {
        match result {
            Ok((stream, first)) => {
                report::link_opened(self.stats, &addr);
                self.ups.push(Upstream {
                    epoch,
                    addr,
                    conn: Conn::with_read(stream, first),
                    closing: false,
                });
                self.session.handle_upstream_connected(epoch, now);
                // The dialer read the INFO (before TLS): the session gets it now.
                if let Some(u) = self.ups.last_mut().filter(|u| !u.conn.rbuf.is_empty()) {
                    self.session
                        .handle_upstream_bytes(epoch, &mut u.conn.rbuf, now);
                }
            }
            Err(e) if e.stage == DialStage::Budget => {
                self.stats.upstream_dials_refused.inc();
                debug!(%epoch, "dial refused by the process's dial budget");
                self.session.handle_dial_refused(epoch, now);
            }
            Err(e) => {
                self.stats.upstream_dial_failures.inc();
                warn!(%epoch, upstream = %addr, stage = %e.stage, error = %e, "upstream dial failed");
                self.session.handle_upstream_lost(epoch, now);
            }
        }
    }

    /// The clock is checked after every event, as quinn's endpoint does: the timer is
    /// polled last and tokio's cooperative budget can keep it from firing while a socket
    /// stays readable, so under a flood the deadlines would come late. The deadline
    /// compared is the one armed before this event (one clock read, no fold over the
    /// session's timers per event); a deadline the event itself moved earlier is armed at
    /// the top of the loop and checked after the next.
    fn fire_late_timer(&mut self) {
        let now = Instant::now();
        if self.timer_at.is_some_and(|t| t <= now) {
            self.timer_at = None;
            self.session.handle_timeout(now.into_std());
        }
    }

    /// Reports what changed since the last report to the process-wide metrics.
    fn sync_stats(&mut self) {
        let h = Holding {
            client_out: self.client.wbuf.len(),
            upstream_out: self.upstream_backlog(),
            bytes_to_client: self.bytes_to_client,
            bytes_to_upstream: self.bytes_to_upstream,
        };
        self.reported.sync(self.stats, &mut self.session, h);
    }

    /// Takes this driver's share out of the gauges when it ends.
    fn unreport(&mut self) {
        for u in std::mem::take(&mut self.ups) {
            report::link_closed(self.stats, &u.addr);
        }
        self.reported.withdraw(self.stats);
    }

    fn arm_timer(&mut self) {
        let session = self.session.poll_timeout().map(Instant::from_std);
        let watch = self.member.due().map(Instant::from_std);
        let want = match (session, watch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if want != self.timer_at {
            self.timer_at = want;
            if let Some(t) = want {
                self.timer.as_mut().reset(t);
            }
        }
    }

    fn apply_actions(&mut self) {
        if self.client_closing.is_none() {
            let before = self.client.wbuf.len();
            self.session.take_client_output(&mut self.client.wbuf);
            self.bytes_to_client += (self.client.wbuf.len() - before) as u64;
        }
        while let Some(a) = self.session.poll_action() {
            match a {
                Action::ToClient(b) => {
                    if self.client_closing.is_none() {
                        self.bytes_to_client += b.len() as u64;
                        self.client.wbuf.extend_from_slice(&b);
                    }
                }
                Action::ToUpstream(epoch, b) => {
                    if let Some(u) = self.ups.iter_mut().find(|u| u.epoch == epoch) {
                        self.bytes_to_upstream += b.len() as u64;
                        u.conn.wbuf.push(b);
                    }
                }
                Action::Dial { epoch, addr } => {
                    let timeout = self.cfg.connect_timeout;
                    let addr_label = addr.clone();
                    let dialer = self.dialer.clone();
                    let fut = async move { dialer.dial(&addr, timeout).await };
                    self.dials.push((epoch, addr_label, Box::pin(fut)));
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
        self.ups.iter().map(|u| u.conn.wbuf.len()).sum::<usize>()
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
            return Poll::Ready(Event::ClientGone(Some(e)));
        }
        // What the client's socket would not take now is its pending data; past the bound
        // it is a slow consumer (nats-server's rule), however fast it is read otherwise.
        if self.client_closing.is_none() && self.client.wbuf.len() > self.cfg.max_client_pending {
            return Poll::Ready(Event::SlowConsumer);
        }
        if self.client_closing.is_some() && self.client.wbuf.is_empty() {
            return Poll::Ready(Event::ClientFlushedAndClosing);
        }
        let mut i = 0;
        while i < self.ups.len() {
            let u = &mut self.ups[i];
            match u.conn.poll_flush_buf(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Event::UpstreamLost(u.epoch, Some(e))),
                Poll::Ready(Ok(())) if u.closing => {
                    let u = self.ups.swap_remove(i);
                    report::link_closed(self.stats, &u.addr);
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
            if let Poll::Ready(r) = self.dials[i].2.as_mut().poll(cx) {
                let (epoch, addr, _) = self.dials.swap_remove(i);
                return Poll::Ready(Event::Dialed(epoch, addr, r));
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
            && self.upstream_backlog() < self.cfg.session.max_backlog;
        if !may_read {
            return Poll::Pending;
        }
        match self.client.poll_read(cx) {
            Poll::Ready(Ok(0)) => Poll::Ready(Event::ClientGone(None)),
            Poll::Ready(Err(e)) => Poll::Ready(Event::ClientGone(Some(e))),
            Poll::Ready(Ok(_)) => Poll::Ready(Event::ClientData),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_upstream_reads(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        for u in self.ups.iter_mut().filter(|u| !u.closing) {
            match u.conn.poll_read(cx) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Event::UpstreamLost(u.epoch, None)),
                Poll::Ready(Err(e)) => return Poll::Ready(Event::UpstreamLost(u.epoch, Some(e))),
                Poll::Ready(Ok(_)) => return Poll::Ready(Event::UpstreamData(u.epoch)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}
