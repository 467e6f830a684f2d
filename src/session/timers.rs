//! The session's timers, as one table.
//!
//! Every deadline has a name, a [`Timer`]. [`Session::deadline`] says when it is due (from
//! the state it belongs to: a link, the phase, the overlap) and [`Session::fire`] what it
//! does. `poll_timeout` is the earliest deadline of all; `handle_timeout` fires every timer
//! that is due, in the order of [`Timer::ALL`], each checked again just before it fires (an
//! earlier one may have changed it: a stale link closed, a link promoted). A new timer is
//! one variant, one `deadline` arm and one `fire` arm.

use bytes::Bytes;
use std::time::Instant;
use tracing::warn;

use super::action::{Action, CloseReason};
use super::link::PingOwner;
use super::links::Role;
use super::phase::Phase;
use super::stats::{MoveReason, SessionEvent};
use super::Session;
use crate::proto::encode;

/// A named deadline of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The link's oldest PING is unanswered for `ping_interval × max_pings_out`: stale.
    Stale(Role),
    /// The link's next keepalive PING (`ping_interval`, at most `HEDGE_KEEPALIVE` while
    /// hedging is on).
    Keepalive(Role),
    /// Steady: the primary's oldest PING unanswered for `hedge_after`: hedge.
    Suspect,
    /// The next dial: a backoff after a failure, or the migration spread.
    Dial,
    /// The confirmation PING of unconfirmed publishes (`CONFIRM_DELAY`).
    Confirm,
    /// Draining: the first UNSUBs on the retiring link (the settle delay after B's
    /// replay PONG).
    Drain,
    /// JetStream pull requests: placements, probes, statuses made for the client.
    Pulls,
    /// The overlap stops matching the new link's late copies.
    Linger,
    /// Outage: no upstream for `max_outage`; the client gets `-ERR` and is closed.
    Outage,
}

impl Timer {
    /// Every timer, in the order `handle_timeout` fires them.
    pub(super) const ALL: [Timer; 13] = [
        Timer::Stale(Role::Primary),
        Timer::Keepalive(Role::Primary),
        Timer::Suspect,
        Timer::Stale(Role::Standby),
        Timer::Keepalive(Role::Standby),
        Timer::Stale(Role::Retiring),
        Timer::Keepalive(Role::Retiring),
        Timer::Dial,
        Timer::Confirm,
        Timer::Drain,
        Timer::Pulls,
        Timer::Linger,
        Timer::Outage,
    ];
}

impl Session {
    /// When `timer` is due, if it is armed.
    pub(super) fn deadline(&self, timer: Timer) -> Option<Instant> {
        match timer {
            Timer::Stale(role) => {
                let l = self.link(role)?;
                l.oldest_ping().map(|t| t + self.stale_after())
            }
            Timer::Keepalive(role) => {
                let l = self.link(role)?;
                l.established().then_some(l.keepalive_at)
            }
            Timer::Suspect => self.suspect_at(),
            Timer::Dial => self
                .dialing
                .due()
                .filter(|_| self.links.standby().is_none()),
            Timer::Confirm => self.backlog.confirm_at(),
            Timer::Drain => self.drain_due(),
            // Placements wait for a working upstream (see `reissue_due_pulls`); statuses
            // made for the client do not.
            Timer::Pulls => self.js.pulls.poll_timeout(self.has_upstream()),
            Timer::Linger => self.overlap.linger_until(),
            Timer::Outage => match self.phase {
                Phase::Outage { since, .. } => Some(since + self.cfg.max_outage),
                _ => None,
            },
        }
    }

    /// What `timer` does when it is due.
    fn fire(&mut self, timer: Timer) {
        let now = self.now;
        match timer {
            Timer::Stale(role) => {
                if let Some(l) = self.link(role) {
                    let epoch = l.epoch;
                    warn!(upstream = %l.addr, "upstream stale: PING unanswered");
                    self.link_lost(epoch, MoveReason::Stale);
                }
            }
            Timer::Keepalive(role) => {
                let interval = self.cfg.keepalive_interval();
                let Some(l) = self.link_mut(role) else { return };
                l.keepalive_at = now + interval;
                if l.pings.is_empty() {
                    l.ping_sent(PingOwner::Keepalive, now);
                    let epoch = l.epoch;
                    self.out
                        .actions
                        .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                }
            }
            Timer::Suspect => self.begin_hedge(),
            Timer::Dial => self.start_dial(),
            Timer::Confirm => {
                let primary = self.links.primary_mut();
                self.backlog
                    .confirm_now(primary, now, &mut self.out.actions);
            }
            Timer::Drain => self.maybe_drain(),
            Timer::Pulls => self.reissue_due_pulls(),
            Timer::Linger => self.linger_due(),
            Timer::Outage => {
                if let Phase::Outage { since, .. } = self.phase {
                    let outage = now.saturating_duration_since(since);
                    self.event(SessionEvent::OutageEnded(outage));
                }
                let secs = self.cfg.max_outage.as_secs();
                warn!(secs, "no upstream reachable; closing client");
                let text = format!("natsproxy: no NATS server reachable for {secs}s");
                self.close_with_err(&text, CloseReason::UpstreamLost);
            }
        }
    }

    /// The earliest moment `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.client.is_closed() {
            return None;
        }
        Timer::ALL
            .into_iter()
            .filter_map(|t| self.deadline(t))
            .min()
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        for timer in Timer::ALL {
            if self.client.is_closed() {
                return;
            }
            if self.deadline(timer).is_some_and(|t| t <= now) {
                self.fire(timer);
            }
        }
    }
}
