//! The overlap's memory and hold: [`Dedup`] (see the module above for the method).

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use bytes::Bytes;

use crate::session::action::Epoch;

/// Default bound of remembered fingerprints (about 40 bytes each).
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;
/// Default bound of bytes held back from the new link.
pub const DEFAULT_MAX_HOLD_BYTES: usize = 16 * 1024 * 1024;

/// Fingerprint of a message's content: subject, reply, headers and payload.
pub fn fingerprint(subject: &[u8], reply: Option<&[u8]>, headers: &[u8], payload: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    subject.hash(&mut h);
    reply.hash(&mut h);
    headers.hash(&mut h);
    payload.hash(&mut h);
    h.finish()
}

type Counts = HashMap<u64, u32>;
type Multiset = HashMap<Bytes, Counts>;

fn take(m: &mut Multiset, sid: &[u8], fp: u64) -> bool {
    m.get_mut(sid).is_some_and(|per| take_count(per, fp))
}

fn take_count(per: &mut Counts, fp: u64) -> bool {
    match per.get_mut(&fp) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            per.remove(&fp);
            true
        }
        None => false,
    }
}

fn put(m: &mut Multiset, sid: &[u8], fp: u64) {
    match m.get_mut(sid) {
        Some(per) => *per.entry(fp).or_insert(0) += 1,
        None => {
            m.insert(Bytes::copy_from_slice(sid), HashMap::from([(fp, 1)]));
        }
    }
}

/// What the old link delivered on one sid during the overlap.
#[derive(Default)]
struct OldSeen {
    /// Delivered before the new link's replay PONG was read.
    early: Counts,
    /// Delivered after it.
    late: Counts,
    /// A message of the new link matched a late entry or none: the new link's window
    /// has passed the early ones, which no later message of it may match.
    early_closed: bool,
    /// The old link delivered on this sid after the new link's replay PONG.
    live: bool,
    /// The new link delivered a copy of something the old one did: its interest arrived.
    proven: bool,
    /// The old link delivers nothing more on this sid (its UNSUB's barrier PONG).
    done: bool,
    /// The old link's latest delivery on this sid, and whether the new link has
    /// delivered its copy (or was ahead): the new link has caught up with the old one.
    last: Option<u64>,
    caught_up: bool,
}

fn count(m: &Multiset) -> usize {
    m.values()
        .map(|p| p.values().map(|&n| n as usize).sum::<usize>())
        .sum()
}

struct Held<T> {
    sid: Bytes,
    fp: u64,
    size: usize,
    msg: T,
}

/// Overlap de-duplication between an old and a new link; `T` is the message.
pub struct Dedup<T> {
    old: Epoch,
    /// None while the new link is being brought up: the old link's deliveries are
    /// already remembered (see the module doc).
    new: Option<Epoch>,
    seen_old: HashMap<Bytes, OldSeen>,
    seen_new: Multiset,
    own: Multiset,
    entries: usize,
    max_entries: usize,
    held: VecDeque<Held<T>>,
    /// The fingerprints in `held`, per sid (for the proof of overlap).
    held_index: Multiset,
    held_bytes: usize,
    max_hold_bytes: usize,
    ready: VecDeque<T>,
    /// The old link can deliver no more.
    old_done: bool,
    /// The new link's replay PONG was read: the old link's messages are late ones.
    recording: bool,
    /// A hedge (see [`hedge`](Self::hedge)): the new link's messages are not held back.
    hedged: bool,
    /// In a hedge, the new link's last release per sid whose copy the old link has not
    /// delivered yet.
    hedge_last: HashMap<Bytes, u64>,
    /// What the call in progress decided; handed to the caller as it returns.
    tally: Tally,
}

/// What one call decided, for the caller to count at once (a client that closes while
/// the overlap lingers takes nothing uncounted with it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Tally {
    /// Duplicates dropped.
    pub suppressed: u64,
    /// Messages forwarded without protection (bounds reached): possible duplicates.
    pub overflowed: u64,
    /// Own messages dropped (echo:false).
    pub echoes: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, t: Tally) {
        self.suppressed += t.suppressed;
        self.overflowed += t.overflowed;
        self.echoes += t.echoes;
    }
}

impl<T> Dedup<T> {
    /// Starts an overlap between `old` and `new`.
    pub fn new(old: Epoch, new: Epoch, max_entries: usize, max_hold_bytes: usize) -> Dedup<T> {
        let mut d = Dedup::recording(old, max_entries, max_hold_bytes);
        d.new = Some(new);
        d
    }

    /// Starts remembering what `old` delivers before the new link exists (the old node
    /// announced lame duck mode; the new link is being dialled).
    pub fn recording(old: Epoch, max_entries: usize, max_hold_bytes: usize) -> Dedup<T> {
        Dedup {
            old,
            new: None,
            seen_old: HashMap::new(),
            seen_new: Multiset::new(),
            own: Multiset::new(),
            entries: 0,
            max_entries,
            held: VecDeque::new(),
            held_index: Multiset::new(),
            held_bytes: 0,
            max_hold_bytes,
            ready: VecDeque::new(),
            old_done: false,
            recording: false,
            hedged: false,
            hedge_last: HashMap::new(),
            tally: Tally::default(),
        }
    }

    /// Hedged delivery: the old link is suspect, not leaving. Each message goes to the
    /// client from whichever link delivers it first, and its copy from the other link is
    /// dropped: the new link's messages are released at once (remembered, so that the
    /// old link's copies of them are dropped when it thaws), and everything the old link
    /// delivers counts as late (matched whenever the new link's copy comes).
    pub fn hedge(&mut self) {
        self.hedged = true;
        self.recording = true;
    }

    /// Whether this is a hedge's overlap.
    pub fn is_hedged(&self) -> bool {
        self.hedged
    }

    /// Whether the new link delivered anything the client got.
    pub fn released_new(&self) -> bool {
        !self.seen_new.is_empty()
    }

    /// The hedge ends with the old link staying (it answered): what the new link
    /// released is now what a finished link delivered, and the old link's copies of it
    /// still to come are the late ones (see [`late_copy`](Self::late_copy)). The
    /// overlap is caught up once the old link delivered its copy of the new link's last
    /// message on every sid.
    pub fn hedge_answered(&mut self) {
        debug_assert!(self.hedged && self.held.is_empty());
        let released = std::mem::take(&mut self.seen_new);
        let mut owed = std::mem::take(&mut self.hedge_last);
        self.seen_old = released
            .into_iter()
            .map(|(sid, late)| {
                let last = owed.remove(&sid);
                let o = OldSeen {
                    late,
                    live: last.is_some(),
                    last,
                    ..OldSeen::default()
                };
                (sid, o)
            })
            .collect();
        self.entries = self
            .seen_old
            .values()
            .map(|o| o.late.values().map(|&n| n as usize).sum::<usize>())
            .sum::<usize>()
            + count(&self.own);
        if let Some(new) = self.new.take() {
            (self.old, self.new) = (new, Some(self.old));
        }
        self.old_done = true;
        self.held_index.clear();
    }

    /// True if `epoch` is one of the two links of this overlap.
    pub fn covers(&self, epoch: Epoch) -> bool {
        epoch == self.old || Some(epoch) == self.new
    }

    /// Whether this remembers what `old` delivers for a new link not attached yet, or
    /// not attached any more.
    pub fn awaits_new_link(&self, old: Epoch) -> bool {
        self.is_overlap_from(old) && self.new.is_none()
    }

    /// Whether this is the overlap of a migration away from `old` that is still going
    /// on (the old link has not finished delivering).
    pub fn is_overlap_from(&self, old: Epoch) -> bool {
        self.old == old && !self.old_done
    }

    /// The new link's SUBs are written: its messages are held from now on.
    pub fn attach(&mut self, new: Epoch) {
        self.new = Some(new);
    }

    /// The new link is gone before the switch (it failed, or announced lame duck
    /// mode): what it delivered is dropped (the old link still delivers everything),
    /// what the old link delivered stays remembered for the next one.
    pub fn detach(&mut self) {
        self.new = None;
        if self.hedged {
            // What it released went to the client: the old link's copies of it are
            // still dropped. Nothing is held in a hedge.
            return;
        }
        self.held.clear();
        self.held_index.clear();
        self.held_bytes = 0;
        self.entries -= count(&self.seen_new);
        self.seen_new.clear();
        self.recording = false;
        for o in self.seen_old.values_mut() {
            o.early.extend(o.late.drain());
            o.early_closed = false;
            o.proven = false;
        }
    }

    fn remember(&mut self, new_side: bool, sid: &[u8], fp: u64) {
        if self.entries >= self.max_entries {
            self.tally.overflowed += 1;
            return;
        }
        self.entries += 1;
        if new_side {
            return put(&mut self.seen_new, sid, fp);
        }
        let late = self.recording;
        let held = self
            .held_index
            .get(sid)
            .is_some_and(|c| c.contains_key(&fp));
        let o = self.old_seen(sid);
        o.live |= late;
        o.proven |= held;
        o.last = Some(fp);
        o.caught_up = held;
        let per = if late { &mut o.late } else { &mut o.early };
        *per.entry(fp).or_insert(0) += 1;
    }

    fn old_seen(&mut self, sid: &[u8]) -> &mut OldSeen {
        if !self.seen_old.contains_key(sid) {
            self.seen_old
                .insert(Bytes::copy_from_slice(sid), OldSeen::default());
        }
        self.seen_old.get_mut(sid).expect("inserted above")
    }

    /// A message of the old link that the new link delivered already.
    fn take_seen_new(&mut self, sid: &[u8], fp: u64) -> bool {
        let hit = take(&mut self.seen_new, sid, fp);
        if hit {
            self.entries -= 1;
            self.tally.suppressed += 1;
        }
        hit
    }

    /// A message of the new link (taken in its order) that the old link delivered
    /// already. Late entries are matched first; an early one only while every earlier
    /// message of the new link on this sid matched an early one too, since the new
    /// link's window is contiguous.
    fn take_seen_old(&mut self, sid: &[u8], fp: u64) -> bool {
        let o = self.old_seen(sid);
        let hit = if take_count(&mut o.late, fp) {
            o.early_closed = true;
            true
        } else if !o.early_closed && take_count(&mut o.early, fp) {
            true
        } else {
            o.early_closed = true;
            false
        };
        if hit {
            if o.last == Some(fp) {
                o.caught_up = true;
            }
            self.entries -= 1;
            self.tally.suppressed += 1;
        }
        hit
    }

    /// A message with fingerprint `fp` (and `size` bytes) on `sid` from link `epoch`.
    /// What may be forwarded now is queued for [`pop_ready`](Self::pop_ready); what was
    /// dropped or released unprotected is returned.
    pub fn on_message(&mut self, epoch: Epoch, sid: &[u8], fp: u64, size: usize, msg: T) -> Tally {
        self.admit(epoch, sid, fp, size, msg);
        std::mem::take(&mut self.tally)
    }

    /// Once the old link is finished: whether a message the client is about to get (from
    /// the new link, or from any link after it) is a copy of one the old link delivered,
    /// or the client's own publish (echo:false). Such a message is dropped and counted.
    pub fn late_copy(&mut self, sid: &[u8], fp: u64) -> (bool, Tally) {
        debug_assert!(self.old_done, "only once the old link is finished");
        let dup = self.take_own(sid, fp) || self.take_seen_old(sid, fp);
        (dup, std::mem::take(&mut self.tally))
    }

    fn take_own(&mut self, sid: &[u8], fp: u64) -> bool {
        let hit = take(&mut self.own, sid, fp);
        if hit {
            self.entries -= 1;
            self.tally.echoes += 1;
        }
        hit
    }

    fn admit(&mut self, epoch: Epoch, sid: &[u8], fp: u64, size: usize, msg: T) {
        if self.take_own(sid, fp) {
            return;
        }
        if epoch == self.old {
            if self.take_seen_new(sid, fp) {
                if self.hedge_last.get(sid) == Some(&fp) {
                    // The old link caught up with the new one's last release here.
                    self.hedge_last.remove(sid);
                }
                // The new link delivered it first (released early): proof as well.
                let o = self.old_seen(sid);
                o.proven = true;
                (o.last, o.caught_up) = (Some(fp), true);
            } else {
                self.remember(false, sid, fp);
                self.ready.push_back(msg);
            }
            return;
        }
        if self.old_done || self.seen_old.get(sid).is_some_and(|o| o.done) {
            if !self.take_seen_old(sid, fp) {
                self.ready.push_back(msg);
            }
            return;
        }
        if self.hedged {
            if !self.take_seen_old(sid, fp) {
                self.remember(true, sid, fp);
                match self.hedge_last.get_mut(sid) {
                    Some(last) => *last = fp,
                    None => {
                        self.hedge_last.insert(Bytes::copy_from_slice(sid), fp);
                    }
                }
                self.ready.push_back(msg);
            }
            return;
        }
        if let Some(o) = self.seen_old.get_mut(sid) {
            o.proven |= o.early.contains_key(&fp) || o.late.contains_key(&fp);
        }
        put(&mut self.held_index, sid, fp);
        self.held.push_back(Held {
            sid: Bytes::copy_from_slice(sid),
            fp,
            size,
            msg,
        });
        self.held_bytes += size;
        while self.held_bytes > self.max_hold_bytes {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            take(&mut self.held_index, &h.sid, h.fp);
            self.held_bytes -= h.size;
            if !self.take_seen_old(&h.sid, h.fp) {
                self.tally.overflowed += 1;
                self.remember(true, &h.sid, h.fp);
                self.ready.push_back(h.msg);
            }
        }
    }

    /// The new link's SUBs are registered (its replay PONG): the old link's deliveries
    /// from now on are late ones (see the module doc).
    pub fn start_recording(&mut self) {
        self.recording = true;
    }

    /// The next message to forward, in order.
    pub fn pop_ready(&mut self) -> Option<T> {
        self.ready.pop_front()
    }

    /// Records the client's own publish (echo:false) for every sid it will be delivered on.
    pub fn own_publish(&mut self, sids: impl Iterator<Item = Bytes>, fp: u64) {
        for sid in sids {
            if self.entries < self.max_entries {
                put(&mut self.own, &sid, fp);
                self.entries += 1;
            }
        }
    }

    /// The old link will deliver nothing more: release what the new link delivered,
    /// skipping what the old one already did. The old link's entries stay (the new link
    /// may lag behind) until the caller drops this after a linger time. Returns the
    /// duplicates it dropped.
    pub fn old_finished(&mut self) -> Tally {
        if self.old_done {
            return Tally::default();
        }
        self.old_done = true;
        self.held_index.clear();
        while let Some(h) = self.held.pop_front() {
            self.held_bytes -= h.size;
            if !self.take_seen_old(&h.sid, h.fp) {
                self.ready.push_back(h.msg);
            }
        }
        self.entries -= count(&self.seen_new);
        self.seen_new.clear();
        std::mem::take(&mut self.tally)
    }

    /// Whether the new link has delivered a copy of something the old one delivered on
    /// `sid`: the new node's interest reached that publisher's node.
    pub fn proven(&self, sid: &[u8]) -> bool {
        self.seen_old.get(sid).is_some_and(|o| o.proven)
    }

    /// The old link will deliver nothing more on `sids` (the PONG after their UNSUBs):
    /// what the new link delivered on them is released, skipping what the old one
    /// already did; from now on the new link's messages on them go out at once. The
    /// other sids' held messages stay held, in order.
    pub fn old_finished_on(&mut self, sids: &[Bytes]) -> Tally {
        if self.old_done {
            return Tally::default();
        }
        for sid in sids {
            self.old_seen(sid).done = true;
        }
        let mut keep = VecDeque::with_capacity(self.held.len());
        while let Some(h) = self.held.pop_front() {
            if !sids.contains(&h.sid) {
                keep.push_back(h);
                continue;
            }
            take(&mut self.held_index, &h.sid, h.fp);
            self.held_bytes -= h.size;
            if !self.take_seen_old(&h.sid, h.fp) {
                self.ready.push_back(h.msg);
            }
        }
        self.held = keep;
        std::mem::take(&mut self.tally)
    }

    /// Whether the new link has delivered its copy of the old link's latest delivery on
    /// every sid the old link delivered on since the new link's SUBs were registered: no
    /// copy of anything it delivered is still on its way (a late copy would otherwise be
    /// a duplicate once the overlap ends). A sid whose last delivery came before the new
    /// node's interest reached its publisher never catches up: the caller bounds the wait.
    pub fn new_link_caught_up(&self) -> bool {
        self.seen_old.values().all(|o| !o.live || o.caught_up)
    }

    /// Remembered fingerprints.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Bytes held back.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}
