//! When the session dials, and what it remembers of dials that failed: the next dial's
//! time (a backoff, a migration's spread, the window's wait), the backoff's attempts,
//! the handshakes refused, and the last upstream `-ERR` for the log.
//!
//! A session's own bound on dialling: at most [`MAX_DIALS_PER_WINDOW`] dials in any
//! [`DIAL_WINDOW`], whatever the cause (a node that takes the handshake and dies at
//! once, lame ducks announced one after another, a bug). A dial over the bound waits
//! until the oldest of the window's dials leaves it. With the process's dial budget
//! (`proxy::budget`) on top, no input can make the proxy hammer the cluster.
//!
//! Backoff: the n-th dial in a row that failed waits `backoff_min × 2^(n-1)`, at most
//! `backoff_max`, jittered by ±10 %; a node that takes our CONNECT starts it over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, warn};

use super::action::Epoch;
use super::session_config::MIGRATION_DIAL_RATE;
use crate::proto::ServerErr;

/// The window over which a session's dials are counted.
pub const DIAL_WINDOW: Duration = Duration::from_secs(1);
/// Dials one session may make in one [`DIAL_WINDOW`]: a start-up over a few nodes, or a
/// failover and the migration after it, never a loop.
pub const MAX_DIALS_PER_WINDOW: usize = 6;

/// The times of the last dials, at most [`MAX_DIALS_PER_WINDOW`].
#[derive(Debug, Default)]
struct DialWindow {
    recent: VecDeque<Instant>,
}

impl DialWindow {
    /// `None`: dial now (and it is counted). `Some(t)`: not before `t`.
    fn admit(&mut self, now: Instant) -> Option<Instant> {
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= DIAL_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= MAX_DIALS_PER_WINDOW {
            return self.recent.front().map(|&t| t + DIAL_WINDOW);
        }
        self.recent.push_back(now);
        None
    }
}

/// An upstream `-ERR` text and how many times it came again: one client's repeated
/// error is one log line with a count, not one per event.
#[derive(Debug, Default)]
struct RepeatedErr {
    text: Option<Bytes>,
    repeats: u32,
}

/// The dialing side of a session.
#[derive(Debug)]
pub(super) struct Dialing {
    /// When the next dial is due, if one is scheduled.
    at: Option<Instant>,
    /// Dials in a row that did not end in an accepted handshake (the backoff's exponent).
    attempts: u32,
    /// Handshakes refused (an `-ERR` before the server took our CONNECT) since a node
    /// last took one; at one per known node the client is told and closed.
    refusals: usize,
    window: DialWindow,
    /// Other sessions of the process moving off a lame-duck node now (from the driver).
    peers_moving: usize,
    err_log: RepeatedErr,
    /// Jitter and spread; seeded from the session's seed, so tests replay.
    rng: fastrand::Rng,
}

impl Dialing {
    /// The dialing side, and a seed for the node pool drawn from the same `seed`.
    pub(super) fn new(seed: u64) -> (Dialing, u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let pool_seed = rng.u64(..);
        let d = Dialing {
            at: None,
            attempts: 0,
            refusals: 0,
            window: DialWindow::default(),
            peers_moving: 0,
            err_log: RepeatedErr::default(),
            rng,
        };
        (d, pool_seed)
    }

    /// When the next dial is due.
    pub(super) fn due(&self) -> Option<Instant> {
        self.at
    }

    /// No dial is scheduled any more (one is made now, or none is wanted).
    pub(super) fn cancel(&mut self) {
        self.at = None;
    }

    /// True when a dial may be made now (it is counted); else the dial is scheduled for
    /// when the window has room.
    pub(super) fn admit(&mut self, now: Instant) -> bool {
        self.at = None;
        match self.window.admit(now) {
            None => true,
            Some(at) => {
                debug!(?at, "dialled too often this second; the next dial waits");
                self.at = Some(at);
                false
            }
        }
    }

    /// Schedules the next dial after a failed one: exponential backoff with jitter.
    pub(super) fn back_off(&mut self, now: Instant, min: Duration, max: Duration) {
        self.attempts += 1;
        let exp = self.attempts.saturating_sub(1).min(16);
        let base = min.saturating_mul(1 << exp).min(max);
        let jitter = base.mul_f64(self.rng.f64() * 0.2);
        self.at = Some(now + base - base.mul_f64(0.1) + jitter);
    }

    /// How many other sessions of the process are moving off a lame-duck node now.
    pub(super) fn set_peers_moving(&mut self, n: usize) {
        self.peers_moving = n;
    }

    /// A migration's dial: true to dial now (the session moves alone), else it is
    /// scheduled at a random point of a window that grows with the sessions moving
    /// together, at most `max_spread`.
    pub(super) fn spread(&mut self, now: Instant, max_spread: Duration) -> bool {
        let window =
            Duration::from_secs_f64(self.peers_moving as f64 / MIGRATION_DIAL_RATE).min(max_spread);
        let spread = window.mul_f64(self.rng.f64());
        if spread.is_zero() {
            return true;
        }
        self.at = Some(now + spread);
        false
    }

    /// A node took our CONNECT: backoff and refusals start over.
    pub(super) fn handshake_taken(&mut self) {
        self.attempts = 0;
        self.refusals = 0;
    }

    /// A handshake refused with `text`. True when the refusal holds everywhere: one every
    /// node gives (credentials), or each of the `nodes` known has refused once.
    pub(super) fn refused(&mut self, text: &Bytes, nodes: usize) -> bool {
        self.refusals += 1;
        ServerErr::classify(text) == ServerErr::Authorization || self.refusals >= nodes
    }

    /// Handshakes refused since a node last took one.
    pub(super) fn refusals(&self) -> usize {
        self.refusals
    }

    /// Logs an upstream `-ERR` the first time its text comes; repeats are counted and
    /// logged once, when another text comes or the client closes.
    pub(super) fn log_err(&mut self, epoch: Epoch, addr: &str, text: &Bytes) {
        if self.err_log.text.as_ref() == Some(text) {
            self.err_log.repeats += 1;
            debug!(%epoch, upstream = %addr, repeats = self.err_log.repeats, "upstream -ERR again");
            return;
        }
        self.flush_err_log();
        warn!(%epoch, upstream = %addr, err = %String::from_utf8_lossy(text), "upstream -ERR");
        self.err_log.text = Some(text.clone());
    }

    /// Logs how often the last upstream `-ERR` came again, if it did.
    pub(super) fn flush_err_log(&mut self) {
        let repeats = std::mem::take(&mut self.err_log.repeats);
        if let (Some(text), true) = (&self.err_log.text, repeats > 0) {
            warn!(err = %String::from_utf8_lossy(text), repeats, "upstream -ERR came again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_bound_in_any_window() {
        let t0 = Instant::now();
        let mut w = DialWindow::default();
        for _ in 0..MAX_DIALS_PER_WINDOW {
            assert_eq!(w.admit(t0), None);
        }
        assert_eq!(w.admit(t0), Some(t0 + DIAL_WINDOW));
        assert_eq!(
            w.admit(t0 + Duration::from_millis(999)),
            Some(t0 + DIAL_WINDOW)
        );
        assert_eq!(w.admit(t0 + DIAL_WINDOW), None);
    }
}
