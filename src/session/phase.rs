//! The session's phase and the overlap of a migration, with the transitions between
//! phases (see the diagram in the [`super`] module docs).

use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::time::Instant;
use tracing::{debug, info, warn};

use super::action::{Action, CloseReason, Epoch};
use super::backlog::Pending;
use super::client_side::ClientState;
use super::dedup::{Dedup, Tally};
use super::link::{Link, PingOwner};
use super::links::Role;
use super::overlap::Bounds;
use super::stats::{MoveReason, SessionEvent};
use super::Session;
use crate::proto::{encode, Message};

/// A move off a node: why, since when, from which address.
#[derive(Debug, Clone)]
pub(super) struct Move {
    pub(super) reason: MoveReason,
    pub(super) started: Instant,
    pub(super) from: String,
}

/// What the session is doing about its upstream; the words of the module's diagram.
#[derive(Debug)]
pub(super) enum Phase {
    /// No link has carried the client's traffic yet. `failures`: dials that failed before
    /// the client got an INFO (each node is tried once, then the client is closed).
    Starting { failures: usize },
    /// A primary carries the client's traffic; nothing is moving. `since`: when this
    /// began; the primary's PINGs count as unanswered from then on at the earliest (a
    /// migration's new node, busy with the arrivals, is not suspect for what it was slow
    /// to answer meanwhile: in the storm test under load, every hedge came at a
    /// migration's end, for a PONG already on its way).
    Steady { since: Instant },
    /// The primary's PING is unanswered for `hedge_after`: it still carries the client's
    /// traffic, and a standby on another node is being brought up with every
    /// subscription (both deliver; the overlap gives the client each message once). The
    /// primary's next PONG drops the standby; the primary found dead promotes it.
    Hedging { since: Instant },
    /// Make-before-break off a primary in lame duck mode.
    Migrating(Move, Step),
    /// The primary is gone: the client is served from the backlog until a standby is up;
    /// `since` starts the `max_outage` clock.
    Outage { from: Move, since: Instant },
}

/// The step of a migration from A (primary, leaving) to B (standby, then primary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// B is being dialled and brought up.
    Preparing,
    /// B's replay PONG came: the switch barrier PING is out on A; client traffic waits.
    /// A's UNSUBs are due at `drain_at` (the settle delay after B's replay PONG).
    Switching { drain_at: Instant },
    /// Client traffic is on B; A is retiring, delivering until the PONG after its UNSUBs.
    Draining { drain_at: Instant, drain: Drain },
}

/// A's subscriptions while it retires. From the settle delay on, a subscription leaves A
/// once B has proved its interest on it (a copy of something A delivered: B's interest
/// reached that publisher's node), or at once if it can prove nothing (a queue group
/// gets each message on one member, a pull inbox each on one request). The others,
/// also those idle through the switch, are `kept` on A until their proof comes, A's
/// server closes A, or B itself announces lame duck mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Drain {
    /// The settle delay has passed: UNSUBs have started.
    pub(super) started: bool,
    /// Sids still subscribed on A, waiting for their proof.
    pub(super) kept: Vec<Bytes>,
    /// Sids UNSUBbed on A in batches, each waiting for the PONG of the PING after it;
    /// at that PONG A delivers nothing more on them.
    pub(super) batches: VecDeque<Vec<Bytes>>,
    /// The last UNSUBs and their PING are out: at that PONG A is retired.
    pub(super) last_sent: bool,
}

impl Session {
    /// True while a migration or failover is in progress.
    pub fn migrating(&self) -> bool {
        matches!(self.phase, Phase::Migrating(..) | Phase::Outage { .. })
    }

    /// True before the first upstream was ever established (start-up).
    pub(super) fn starting(&self) -> bool {
        matches!(self.phase, Phase::Starting { .. })
    }

    /// While hedging, the standby once it is up: where JetStream's traffic is served now
    /// (see [`Session::on_pub`]).
    pub(super) fn hedge_standby(&self) -> Option<Epoch> {
        if !matches!(self.phase, Phase::Hedging { .. }) {
            return None;
        }
        self.links
            .standby()
            .filter(|s| s.established())
            .map(|s| s.epoch)
    }

    /// True while the switch barrier PING is out on the old primary.
    pub(super) fn switching(&self) -> bool {
        matches!(self.phase, Phase::Migrating(_, Step::Switching { .. }))
    }

    pub(super) fn on_ldm(&mut self, role: Role) {
        let now = self.now;
        let Some(l) = self.link(role) else { return };
        let addr = l.addr.clone();
        let link_epoch = l.epoch;
        info!(upstream = %addr, server = %l.server_name(), "upstream entered lame duck mode");
        self.pool.mark_ldm(&addr, now);
        if role == Role::Primary && matches!(self.phase, Phase::Hedging { .. }) {
            // It answers: no longer suspect; the migration brings its own standby.
            self.end_hedge();
        }
        match role {
            Role::Primary if matches!(self.phase, Phase::Steady { .. }) => {
                // Steady ─► Migrating(Preparing).
                let m = Move {
                    reason: MoveReason::LameDuck,
                    started: now,
                    from: addr,
                };
                self.phase = Phase::Migrating(m, Step::Preparing);
                // The overlap's memory starts now (see `dedup`: the new node may
                // already receive these subjects for other connections).
                self.overlap.record(link_epoch, self.overlap_bounds());
                // The old link still works: spread the dials of the sessions moving
                // together (`migration_spread`, see MIGRATION_DIAL_RATE); alone, at once.
                if self.dialing.spread(now, self.cfg.migration_spread) {
                    self.start_dial();
                }
            }
            // Already moving; a new migration starts when this one ends: A keeps nothing
            // more waiting for proof.
            Role::Primary => self.drain_old_link(true),
            Role::Standby => {
                // Never move onto a node that is leaving.
                if let Some(s) = self.links.take(Role::Standby) {
                    self.out.actions.push_back(Action::CloseUpstream(s.epoch));
                }
                self.standby_gone();
                self.start_dial();
            }
            Role::Retiring => {}
        }
    }

    /// When the primary becomes suspect (Steady, hedging on): its oldest PING unanswered
    /// for `hedge_after`, counted from the start of Steady at the earliest.
    pub(super) fn suspect_at(&self) -> Option<Instant> {
        let Phase::Steady { since } = self.phase else {
            return None;
        };
        if self.cfg.hedge_after.is_zero() {
            return None;
        }
        let p = self.links.primary().filter(|p| p.established())?;
        p.oldest_ping().map(|t| t.max(since) + self.cfg.hedge_after)
    }

    /// Steady ─ the primary's PING unanswered for `hedge_after` ─► Hedging: a standby on
    /// another node, its deliveries held against the primary's (which are remembered
    /// from now on).
    pub(super) fn begin_hedge(&mut self) {
        let Some(p) = self.links.primary() else {
            return;
        };
        let (addr, epoch) = (p.addr.clone(), p.epoch);
        warn!(upstream = %addr, server = %p.server_name(), after_ms = self.cfg.hedge_after.as_millis() as u64,
            "upstream slow to answer a PING; bringing up a standby on another node");
        self.phase = Phase::Hedging { since: self.now };
        self.stats.hedges += 1;
        self.overlap.hedge(epoch, self.overlap_bounds());
        self.start_dial();
    }

    /// Hedging ─ the primary answered ─► Steady: the standby is closed, what it
    /// delivered dropped (the primary delivers all of it).
    pub(super) fn end_hedge(&mut self) {
        let Phase::Hedging { since } = self.phase else {
            return;
        };
        if let Some(s) = self.links.take(Role::Standby) {
            self.out.actions.push_back(Action::CloseUpstream(s.epoch));
        }
        self.dialing.cancel();
        self.overlap.end_hedge(self.now, self.cfg.settle);
        self.phase = Phase::Steady { since: self.now };
        let waited = self.now.saturating_duration_since(since) + self.cfg.hedge_after;
        info!(
            waited_ms = waited.as_millis() as u64,
            "upstream answered; standby dropped"
        );
    }

    /// When A's first UNSUBs are due (Draining, not started): the settle delay after
    /// B's replay PONG. Later ones follow their proofs (see [`Drain`]).
    pub(super) fn drain_due(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Migrating(_, Step::Draining { drain_at, drain }) if !drain.started => {
                Some(*drain_at)
            }
            _ => None,
        }
    }

    /// Whether `sid` may leave A now: B proved its interest on it, or it can prove
    /// nothing (queue groups, pull inboxes).
    fn may_leave_old_link(&self, sid: &[u8]) -> bool {
        let provable =
            self.subs.get(sid).is_some_and(|s| s.queue.is_none()) && !self.js.pulls.tracks(sid);
        !provable || self.overlap.live().is_some_and(|d| d.proven(sid))
    }

    /// Migrating(Preparing) ─ B's replay PONG (its subscriptions are registered) ─►
    /// Switching: the barrier PING on A.
    pub(super) fn begin_switch(&mut self) {
        let now = self.now;
        let Phase::Migrating(_, step @ Step::Preparing) = &mut self.phase else {
            return;
        };
        *step = Step::Switching {
            drain_at: now + self.cfg.settle,
        };
        if let Some(d) = self.overlap.live_mut() {
            d.start_recording();
        }
        let Some(p) = self.links.primary_mut() else {
            return;
        };
        p.ping_sent(PingOwner::Switch, now);
        self.backlog.pinged();
        let epoch = p.epoch;
        self.out
            .actions
            .push_back(Action::ToUpstream(epoch, Bytes::from_static(encode::PING)));
    }

    /// Switching ─ A's PONG (everything written on A was processed) ─► Draining: client
    /// traffic moves to B.
    pub(super) fn complete_switch(&mut self) {
        let Phase::Migrating(m, step @ Step::Switching { .. }) = &mut self.phase else {
            return;
        };
        let Step::Switching { drain_at } = *step else {
            return;
        };
        *step = Step::Draining {
            drain_at,
            drain: Drain::default(),
        };
        let m = m.clone();
        self.links.switch();
        self.flush_backlog();
        self.stats.migrations += 1;
        if let Some(p) = self.links.primary() {
            let took = self.now.saturating_duration_since(m.started);
            self.stats.last_switch = Some(took);
            info!(reason = %m.reason, from = %m.from, to = %p.addr, switch_ms = took.as_millis() as u64,
                subscriptions = self.subs.len(), "migrated to a new upstream");
            let reason = m.reason;
            self.event(SessionEvent::Moved { reason, took });
        }
        self.maybe_drain();
    }

    /// From the settle delay on, UNSUB on the retiring link every subscription that may
    /// leave it (see [`Drain`]), in a batch with a PING; the last batch retires A.
    /// `force`: every subscription leaves now (B announced lame duck mode: this
    /// migration must end for the next one to start).
    pub(super) fn maybe_drain(&mut self) {
        self.drain_old_link(false);
    }

    pub(super) fn drain_old_link(&mut self, force: bool) {
        let now = self.now;
        let Phase::Migrating(_, Step::Draining { drain_at, drain }) = &self.phase else {
            return;
        };
        if drain.last_sent || (*drain_at > now && !force) {
            return;
        }
        let candidates: Vec<Bytes> = if drain.started {
            drain.kept.clone()
        } else {
            self.subs.sids().cloned().collect()
        };
        let (leave, kept): (Vec<Bytes>, Vec<Bytes>) = candidates
            .into_iter()
            // A sid the client unsubscribed meanwhile left A with the client's UNSUB.
            .filter(|sid| self.subs.get(sid).is_some())
            .partition(|sid| force || self.may_leave_old_link(sid));
        let Phase::Migrating(_, Step::Draining { drain, .. }) = &mut self.phase else {
            return;
        };
        let first = !drain.started;
        drain.started = true;
        if first && !kept.is_empty() {
            debug!(
                kept = kept.len(),
                "the old upstream keeps the subscriptions the new one has not proved yet"
            );
        }
        if leave.is_empty() && !kept.is_empty() {
            drain.kept = kept;
            return;
        }
        let last = kept.is_empty();
        drain.kept = kept;
        drain.last_sent = last;
        if !last {
            drain.batches.push_back(leave.clone());
        }
        let Some(r) = self.links.get_mut(Role::Retiring) else {
            return;
        };
        let mut out = BytesMut::new();
        for sid in &leave {
            out.extend_from_slice(&encode::unsub(sid, None));
        }
        out.extend_from_slice(encode::PING);
        r.ping_sent(PingOwner::Drain, now);
        let epoch = r.epoch;
        self.out
            .actions
            .push_back(Action::ToUpstream(epoch, out.freeze()));
    }

    /// The PONG after a batch of A's UNSUBs: A delivers nothing more on them (what B
    /// held back on them is released); after the last batch, A is retired.
    pub(super) fn drained(&mut self) {
        let batch = match &mut self.phase {
            Phase::Migrating(_, Step::Draining { drain, .. }) => drain.batches.pop_front(),
            _ => None,
        };
        let Some(sids) = batch else {
            return self.retired();
        };
        if let Some(d) = self.overlap.live_mut() {
            let t = d.old_finished_on(&sids);
            self.stats.count_overlap(t);
        }
        self.forward_ready();
    }

    /// A's drain PONG: A delivers nothing more; close it.
    pub(super) fn retired(&mut self) {
        if let Some(r) = self.links.take(Role::Retiring) {
            self.out.actions.push_back(Action::CloseUpstream(r.epoch));
        }
        self.finish_migration("migration complete; old upstream retired");
    }

    /// Draining ─ A retired, or closed by its server ─► Steady. The one end of a
    /// migration.
    pub(super) fn finish_migration(&mut self, how: &'static str) {
        self.old_link_done();
        if let Phase::Migrating(m, _) =
            std::mem::replace(&mut self.phase, Phase::Steady { since: self.now })
        {
            let took = self.now.saturating_duration_since(m.started);
            info!(reason = %m.reason, from = %m.from, total_ms = took.as_millis() as u64, "{how}");
        }
        // The new node may itself have announced lame duck mode meanwhile.
        if self.links.primary().is_some_and(Link::is_leaving) {
            self.on_ldm(Role::Primary);
        }
    }

    /// Steady or Migrating ─ the primary is gone without a completed switch ─► Outage
    /// (and at once Steady again if a standby is up).
    pub(super) fn failover(&mut self, mut dead: Link, reason: MoveReason) {
        let now = self.now;
        let served = dead.is_accepted();
        self.stats.failovers += 1;
        self.pool.mark_failed(&dead.addr, now);
        warn!(upstream = %dead.addr, server = %dead.server_name(), %reason, "upstream lost; failing over");
        self.stats.publishes_resent += dead.unconfirmed_msgs();
        if served || dead.refusal.is_none() {
            // PONGs the dead link owed the client: answer them, the client must not stall
            // (an outage: also when the node closed before it took our CONNECT).
            for p in &dead.pings {
                if p.owner == PingOwner::Client {
                    self.client.replies.pong_arrived();
                }
            }
            self.flush_replies();
            // Publishes it never confirmed go out again first (acks are idempotent).
            let again = dead
                .unconfirmed
                .into_iter()
                .map(|(_, b, n)| Pending::Data(b, n));
            self.backlog.requeue_front(again);
        } else {
            self.requeue_refused(&mut dead);
        }
        if self.overlap.live().is_some_and(|d| d.covers(dead.epoch)) {
            self.old_link_done();
        }
        if let Some(r) = self.links.take(Role::Retiring) {
            self.out.actions.push_back(Action::CloseUpstream(r.epoch));
        }
        let from = match std::mem::replace(&mut self.phase, Phase::Steady { since: self.now }) {
            // A move already under way keeps its reason and start.
            // The switch was done: the new primary's loss is a failover of its own.
            Phase::Migrating(_, Step::Draining { .. }) => Move {
                reason,
                started: now,
                from: dead.addr.clone(),
            },
            // Before the switch: the migration failed, and its clock keeps running.
            Phase::Migrating(m, _) => {
                self.stats.migrations_failed += 1;
                m
            }
            Phase::Outage { from: m, .. } => m,
            // A hedge: traffic was in doubt since the suspicion.
            Phase::Hedging { since } => Move {
                reason,
                started: since,
                from: dead.addr.clone(),
            },
            Phase::Starting { .. } | Phase::Steady { .. } => Move {
                reason,
                started: now,
                from: dead.addr.clone(),
            },
        };
        self.phase = Phase::Outage { from, since: now };
        match self.links.standby() {
            Some(s) if s.established() => self.promote_standby(),
            Some(_) => {}
            // A node that served us is gone: the next at once. One that never took our
            // CONNECT (refused it, or closed first) is retried only after a backoff.
            None if served => self.start_dial(),
            None => self.schedule_dial(),
        }
    }

    /// The dead link refused our CONNECT, so it processed nothing written after it, and
    /// the next node may refuse it too: the client's PINGs go out again, in their places
    /// among its publishes (a PONG now would claim what no server did; if every node
    /// refuses, the client gets the -ERR instead, as directly).
    fn requeue_refused(&mut self, dead: &mut Link) {
        let mut again: Vec<(u64, Pending)> = std::mem::take(&mut dead.unconfirmed)
            .into_iter()
            .map(|(seq, b, n)| (seq, Pending::Data(b, n)))
            .collect();
        for p in dead.pings.iter().filter(|p| p.owner == PingOwner::Client) {
            // After the publishes it followed (seq <= mark), before the rest.
            let at = again.partition_point(|(seq, _)| *seq <= p.mark);
            again.insert(at, (p.mark, Pending::Ping));
        }
        self.backlog
            .requeue_front(again.into_iter().map(|(_, item)| item));
    }

    /// The standby failed before it carried traffic. Starting, with no INFO to the
    /// client yet: each node is tried once, then the client is closed (its own retry
    /// takes over). Otherwise the next node after a backoff.
    pub(super) fn standby_failed(&mut self, l: &Link, reason: MoveReason) {
        self.pool.mark_failed(&l.addr, self.now);
        let no_info = self.client.state == ClientState::NoInfo;
        if let (Phase::Starting { failures }, true) = (&mut self.phase, no_info) {
            *failures += 1;
            if *failures >= self.pool.len() {
                warn!(upstream = %l.addr, "no upstream reachable; closing client");
                return self.close_client(CloseReason::UpstreamLost);
            }
            return self.start_dial();
        }
        debug!(upstream = %l.addr, %reason, "standby upstream failed");
        self.standby_gone();
        self.schedule_dial();
    }

    /// The standby becomes the primary at once (start-up or failover: there is none).
    /// Starting or Outage ─► Steady.
    pub(super) fn promote_standby(&mut self) {
        self.links.promote();
        self.flush_backlog();
        let Some(p) = self.links.primary() else {
            return;
        };
        match std::mem::replace(&mut self.phase, Phase::Steady { since: self.now }) {
            Phase::Outage { from: m, since } => {
                let took = self.now.saturating_duration_since(m.started);
                let outage = self.now.saturating_duration_since(since);
                info!(reason = %m.reason, from = %m.from, to = %p.addr, resumed_ms = took.as_millis() as u64,
                    outage_ms = outage.as_millis() as u64, subscriptions = self.subs.len(), "failover: traffic resumed on a new upstream");
                self.event(SessionEvent::OutageEnded(outage));
                self.event(SessionEvent::Moved {
                    reason: m.reason,
                    took,
                });
                // The dead link's inbox subscriptions are gone; the server may have swept
                // the requests before the new link's interest arrived.
                if !self.js.pulls.is_empty() {
                    self.js.pulls.all_lost(self.now);
                    self.reissue_due_pulls();
                }
            }
            _ => info!(upstream = %p.addr, server = %p.server_name(), "upstream connected"),
        }
    }

    /// The old side of the live overlap can deliver nothing more: release what the new
    /// side held back; the overlap lingers (see `overlap`).
    pub(super) fn old_link_done(&mut self) {
        let mut out = Vec::new();
        let t = self
            .overlap
            .old_finished(self.now, self.cfg.settle, &mut out);
        self.stats.count_overlap(t);
        for m in out {
            self.deliver(m);
        }
    }

    /// What the live overlap let through, to the client (through the lingering ones).
    pub(super) fn forward_ready(&mut self) {
        while let Some(m) = self.overlap.live_mut().and_then(Dedup::pop_ready) {
            self.forward(m);
        }
    }

    /// A message for the client that no live overlap holds: a lingering overlap's late
    /// copy is dropped, anything else delivered.
    pub(super) fn forward(&mut self, m: Message) {
        let mut t = Tally::default();
        let m = self.overlap.pass_lingering(m, &mut t);
        self.stats.count_overlap(t);
        if let Some(m) = m {
            self.deliver(m);
        }
    }

    /// B's SUBs are written: both links deliver. A's deliveries are remembered since its
    /// lame duck (or the suspicion).
    pub(super) fn attach_overlap(&mut self, old: Epoch, new: Epoch) {
        let b = self.overlap_bounds();
        self.overlap.attach(old, new, b);
    }

    /// The standby is gone before the switch: the overlap's memory of the primary's
    /// deliveries is kept for the next standby, what the standby delivered is dropped.
    pub(super) fn standby_gone(&mut self) {
        let primary = self.links.primary().map(|p| p.epoch);
        self.overlap.standby_gone(primary);
    }

    pub(super) fn overlap_bounds(&self) -> Bounds {
        Bounds {
            max_entries: self.cfg.max_dedup_entries,
            max_hold_bytes: self.cfg.max_hold_bytes,
        }
    }

    /// A lingering overlap's time is up (see `Overlap::linger_due`).
    pub(super) fn linger_due(&mut self) {
        self.overlap.linger_due(self.now, self.cfg.settle);
    }
}
