//! Client traffic toward the upstream: the backlog while no primary can take it, the
//! publishes kept until a PONG confirms them, and SUB/UNSUB to every link.

use bytes::Bytes;
use std::time::Duration;

use super::action::Action;
use super::facade::{Role, Session};
use super::link::{Link, PingOwner};
use super::phase::{Phase, Step};
use crate::proto::encode;

/// Longest a publish waits for its confirmation PING (see `confirm_publishes`).
pub const CONFIRM_DELAY: Duration = Duration::from_millis(20);

/// Unconfirmed publish bytes that get their confirmation PING at once.
pub const CONFIRM_BYTES: usize = 64 * 1024;

/// A client op waiting for a primary that accepts traffic.
#[derive(Debug)]
pub(super) enum Pending {
    /// A client publish, kept until confirmed.
    Data(Bytes),
    /// A publish the proxy does not keep for re-sending (pull requests: the tracker does).
    Untracked(Bytes),
    Ping,
}

impl Session {
    /// Writes a publish (or client PING) to the primary, or queues it in the backlog.
    pub(super) fn send_publish(&mut self, p: Pending) {
        let now = self.now;
        let switching = self.switching();
        match &mut self.primary {
            Some(l) if l.established() && !switching && self.backlog.is_empty() => {
                let epoch = l.epoch;
                match p {
                    Pending::Data(b) => {
                        l.publish_sent(b.clone());
                        self.unpinged = true;
                        self.actions.push_back(Action::ToUpstream(epoch, b));
                    }
                    Pending::Untracked(b) => self.actions.push_back(Action::ToUpstream(epoch, b)),
                    Pending::Ping => {
                        l.ping_sent(PingOwner::Client, now);
                        self.unpinged = false;
                        self.actions
                            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                    }
                }
            }
            _ => {
                if let Pending::Data(b) | Pending::Untracked(b) = &p {
                    self.backlog_bytes += b.len();
                }
                self.backlog.push_back(p);
            }
        }
    }

    /// SUB/UNSUB go to every link that already replayed, so all hold the same set. A link
    /// not yet replayed gets the table's state in its replay instead.
    pub(super) fn send_sub_op(&mut self, raw: Bytes, is_unsub: bool) {
        let drain_sent = matches!(
            self.phase,
            Phase::Migrating(
                _,
                Step::Draining {
                    unsub_sent: true,
                    ..
                }
            )
        );
        for role in [Role::Primary, Role::Standby, Role::Retiring] {
            let Some(l) = self.link(role) else { continue };
            let wanted = match role {
                Role::Retiring => is_unsub && !drain_sent,
                _ => l.established(),
            };
            if wanted {
                let epoch = l.epoch;
                self.actions
                    .push_back(Action::ToUpstream(epoch, raw.clone()));
            }
        }
    }

    /// One PING confirms every publish before it: its PONG lets the link forget them
    /// (until then they are kept to be written again if the link dies). It goes out once
    /// `CONFIRM_BYTES` are unconfirmed or `CONFIRM_DELAY` after the first of them, not
    /// after every batch: at 1,000 requests/s a PING per request cost +50 µs at p50 and
    /// +360 µs at p99 of the round trip (the server's work and the proxy's wake-ups for
    /// as many PONGs). A PING of the client's or a keepalive confirms them sooner.
    pub(super) fn confirm_publishes(&mut self) {
        self.confirm_publishes_at(false);
    }

    pub(super) fn confirm_publishes_at(&mut self, due: bool) {
        if !self.unpinged {
            self.confirm_at = None;
            return;
        }
        let now = self.now;
        let pending = self.primary.as_ref().map_or(0, |l| l.unconfirmed_bytes);
        if !due && pending < CONFIRM_BYTES {
            self.confirm_at.get_or_insert(now + CONFIRM_DELAY);
            return;
        }
        self.confirm_at = None;
        let needs = |l: &Link| l.pings.back().is_none_or(|p| p.mark < l.seq);
        match self.primary.as_mut() {
            Some(l) if needs(l) => {
                l.ping_sent(PingOwner::Keepalive, now);
                self.unpinged = false;
                let epoch = l.epoch;
                self.actions
                    .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
            }
            // A PING already on its way covers them.
            Some(_) => self.unpinged = false,
            // The link died: they are in the backlog, confirmed once written again.
            None => {}
        }
    }

    pub(super) fn flush_backlog(&mut self) {
        let now = self.now;
        let Some(l) = self.primary.as_mut() else {
            return;
        };
        let epoch = l.epoch;
        while let Some(p) = self.backlog.pop_front() {
            match p {
                Pending::Data(b) => {
                    self.backlog_bytes -= b.len();
                    l.publish_sent(b.clone());
                    self.unpinged = true;
                    self.actions.push_back(Action::ToUpstream(epoch, b));
                }
                Pending::Untracked(b) => {
                    self.backlog_bytes -= b.len();
                    self.actions.push_back(Action::ToUpstream(epoch, b));
                }
                Pending::Ping => {
                    l.ping_sent(PingOwner::Client, now);
                    self.actions
                        .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
                }
            }
        }
        self.confirm_publishes();
    }
}
