//! The overlaps of a session's moves: the one in progress, and the earlier ones that
//! linger.
//!
//! A move (a migration, or a hedge's standby) has an *old* link and a *new* one that
//! both deliver for a while; a [`Dedup`] reconciles their copies (see `dedup`). The
//! overlap is **live** while the old link may still deliver: the old link's deliveries
//! go out and are remembered, the new link's are held back. Once the old link delivers
//! nothing more, what the new one held back is released and the overlap **lingers**:
//! the new link may still be behind the old one (its route slower), so what the client
//! is about to get is still matched against the old link's deliveries, for a settle
//! delay, longer while the new link has not caught up, at most [`LINGER_MAX`].
//!
//! A lingering overlap does not end when the next move begins. A hedge right after a
//! migration (the new node slow to answer under the arrivals), or the new node's own
//! lame duck, starts a live overlap from a link that still owes copies of the old one's
//! last deliveries (seen in CI: one of 300 clients got 120 messages twice when the
//! hedge's end dropped the lingering memory). So what the client gets is the live
//! overlap's output, then filtered by each lingering overlap, newest first:
//!
//! ```text
//!   (none) ─ lame duck, or a suspect primary: record(old) ─► live, recording
//!   live, recording ─ attach(new): both deliver ─► live
//!   live ─ standby_gone ─► live, recording
//!   (none) ─ a suspect primary: hedge(old) ─► live, hedged: both deliver, first copy out
//!   live, hedged ─ end_hedge, the standby released nothing ─► (none)
//!   live, hedged ─ end_hedge, it did: the primary's copies still to come ─► lingering
//!   live ─ old_finished: held copies released ─► lingering (with the ones before it)
//!   lingering ─ linger_due: caught up, or LINGER_MAX ─► ended
//! ```
//!
//! Bound: at most [`MAX_LINGERING`] overlaps linger at once (each holds up to
//! `max_dedup_entries` fingerprints); past it the oldest ends early, and copies its new
//! link still owes would reach the client (a session moves at most
//! `MAX_DIALS_PER_WINDOW` times a second, and only a move whose old link finished adds
//! one).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tracing::debug;

use super::action::Epoch;
use super::dedup::{self, Dedup, Tally};
use crate::proto::Message;

/// Longest a new link's late copies are matched after its old link ended.
pub const LINGER_MAX: Duration = Duration::from_secs(5);

/// Most overlaps lingering at once (see the module doc).
pub const MAX_LINGERING: usize = 3;

/// An overlap whose old link delivers nothing more.
struct Lingering {
    dedup: Dedup<Message>,
    since: Instant,
    until: Instant,
}

/// The session's overlaps (see the module doc).
#[derive(Default)]
pub(super) struct Overlap {
    live: Option<Dedup<Message>>,
    /// Oldest first.
    lingering: VecDeque<Lingering>,
}

/// Bounds of a new overlap's memory (`SessionConfig`'s).
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) max_entries: usize,
    pub(super) max_hold_bytes: usize,
}

impl Overlap {
    /// The overlap in progress.
    pub(super) fn live(&self) -> Option<&Dedup<Message>> {
        self.live.as_ref()
    }

    pub(super) fn live_mut(&mut self) -> Option<&mut Dedup<Message>> {
        self.live.as_mut()
    }

    /// Whether a message from `epoch` must go through the overlaps (not the fast path).
    pub(super) fn filters(&self, epoch: Epoch) -> bool {
        !self.lingering.is_empty() || self.live.as_ref().is_some_and(|d| d.covers(epoch))
    }

    /// Starts remembering what `old` delivers, for a new link not dialled yet; a live
    /// overlap already doing so is kept.
    pub(super) fn record(&mut self, old: Epoch, b: Bounds) {
        if self.live.is_none() {
            self.live = Some(Dedup::recording(old, b.max_entries, b.max_hold_bytes));
        }
    }

    /// `new`'s SUBs are written: both links deliver. What `old` delivered since its
    /// recording began stays remembered; another live overlap ends here.
    pub(super) fn attach(&mut self, old: Epoch, new: Epoch, b: Bounds) {
        match &mut self.live {
            Some(d) if d.awaits_new_link(old) => d.attach(new),
            _ => self.live = Some(Dedup::new(old, new, b.max_entries, b.max_hold_bytes)),
        }
    }

    /// The new link is gone before the switch: the memory of what `primary` delivered is
    /// kept for the next one, what the new link delivered is dropped.
    pub(super) fn standby_gone(&mut self, primary: Option<Epoch>) {
        match (&mut self.live, primary) {
            (Some(d), Some(p)) if d.is_overlap_from(p) => d.detach(),
            _ => self.live = None,
        }
    }

    /// A suspect primary `old`: hedged delivery (see [`Dedup::hedge`]) with the standby
    /// to come; a live overlap already there is kept.
    pub(super) fn hedge(&mut self, old: Epoch, b: Bounds) {
        if self.live.is_none() {
            let mut d = Dedup::recording(old, b.max_entries, b.max_hold_bytes);
            d.hedge();
            self.live = Some(d);
        }
    }

    /// The hedge ends with its primary (it answered). If the standby released anything,
    /// the primary's copies of it are still to come: the overlap lingers from `now`,
    /// matching them (see [`Dedup::hedge_answered`]). Otherwise it ends here (any other
    /// live overlap too, with what its new link held back: the primary delivers all of
    /// it). Lingering ones go on.
    pub(super) fn end_hedge(&mut self, now: Instant, settle: Duration) {
        let Some(mut d) = self.live.take() else {
            return;
        };
        if d.is_hedged() && d.released_new() {
            d.hedge_answered();
            self.linger(d, now, settle);
        }
    }

    /// Everything ends (the client is gone). What was decided was counted as decided.
    pub(super) fn end_all(&mut self) {
        *self = Overlap::default();
    }

    /// The live overlap's old link delivers nothing more: what its new link held back
    /// goes to `out` (minus the old link's copies, then through the lingering overlaps),
    /// and it lingers from `now` for `settle`.
    pub(super) fn old_finished(
        &mut self,
        now: Instant,
        settle: Duration,
        out: &mut Vec<Message>,
    ) -> Tally {
        let Some(mut d) = self.live.take() else {
            return Tally::default();
        };
        let mut t = d.old_finished();
        while let Some(m) = d.pop_ready() {
            if let Some(m) = self.pass_lingering(m, &mut t) {
                out.push(m);
            }
        }
        self.linger(d, now, settle);
        t
    }

    fn linger(&mut self, dedup: Dedup<Message>, now: Instant, settle: Duration) {
        if self.lingering.len() == MAX_LINGERING {
            debug!(
                MAX_LINGERING,
                "an overlap ends early: too many lingering at once"
            );
            self.lingering.pop_front();
        }
        self.lingering.push_back(Lingering {
            dedup,
            since: now,
            until: now + settle,
        });
    }

    /// `m` on its way to the client: `None` if a lingering overlap's old link delivered
    /// it already (dropped and counted in `t`).
    pub(super) fn pass_lingering(&mut self, m: Message, t: &mut Tally) -> Option<Message> {
        if self.lingering.is_empty() {
            return Some(m);
        }
        let fp = dedup::fingerprint(m.subject(), m.reply(), m.headers(), m.payload());
        for l in self.lingering.iter_mut().rev() {
            let (dup, tally) = l.dedup.late_copy(m.sid(), fp);
            *t += tally;
            if dup {
                return None;
            }
        }
        Some(m)
    }

    /// Bytes the live overlap holds back.
    pub(super) fn held_bytes(&self) -> usize {
        self.live.as_ref().map_or(0, Dedup::held_bytes)
    }

    /// When the next lingering overlap is due to be looked at.
    pub(super) fn linger_until(&self) -> Option<Instant> {
        self.lingering.iter().map(|l| l.until).min()
    }

    /// Lingering overlaps past their time end, unless their new link still owes copies
    /// of the old link's last deliveries (then a settle delay more, up to
    /// [`LINGER_MAX`] in all).
    pub(super) fn linger_due(&mut self, now: Instant, settle: Duration) {
        self.lingering.retain_mut(|l| {
            if l.until > now {
                return true;
            }
            let owed = !l.dedup.new_link_caught_up() && now < l.since + LINGER_MAX;
            l.until = (now + settle).min(l.since + LINGER_MAX);
            owed
        });
    }
}
