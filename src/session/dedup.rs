//! De-duplication while two upstream links hold the same subscriptions.
//!
//! During a make-before-break migration the old link (A) and the new link (B) both deliver
//! every plain-subscription message. A's messages are forwarded at once and remembered
//! (per sid, as a multiset of fingerprints of subject, reply, headers and payload); B's
//! are held back. When A can deliver nothing more (its UNSUB barrier PONG, or its close),
//! the held messages are released in order, skipping those A already delivered. Each
//! link delivers a contiguous window of every publisher's sequence (A up to where its
//! UNSUB took effect, B from where its SUB took effect), so the client gets A's window
//! and then the rest of B's: every message once, in publish order. JetStream deliveries
//! carry a unique `$JS.ACK…` reply, so for them the match is exact.
//!
//! A's deliveries are remembered from the moment the migration starts (A's lame-duck
//! INFO is read), while B is still being dialled, not only from when B's SUBs are
//! written: B's node may receive the subject already for other connections (the other
//! clients of this proxy, migrating at the same moment, or anyone else), so B's window
//! can begin with a message that A delivered just before B's SUB was written, when the
//! route to B's node was slower than the proxy (seen with 300 clients migrating at once:
//! 130 to 396 of 1,800,000 messages twice, each one published a few hundred ms before
//! its second copy).
//!
//! Identical messages (same subject, headers and payload) make the match ambiguous. A's
//! deliveries are split at the moment B's replay PONG is read into
//! *early* and *late*. B's window normally starts after the PONG, but not always: under
//! load A's socket can be read before B's PONG although B's first messages are already
//! on their way (seen in CI: 20 of 21,340 duplicated when early entries were ignored).
//! So B's messages match late entries first and early ones only as a prefix of B's
//! stream on that sid (its window is contiguous): identical messages A delivered just
//! before the PONG are not taken for B's new ones, and distinct ones are matched wherever
//! they fall. What stays ambiguous: identical messages A delivered after the PONG but
//! before B's interest reached the publisher's node are counted as overlap, so as many of
//! B's later identical messages are dropped (seen: 10 of 30,180 at 10k msg/s, all with
//! the same payload). Content alone cannot tell them apart.
//!
//! Proof of overlap: the old link's UNSUBs wait, after the settle delay, until the new
//! link has delivered a copy of something the old one delivered on every subscription that
//! is live (the old link delivered on it since the new link's replay PONG), as long as
//! [`PROOF_WAIT`] at most. The settle delay assumes the new node's interest reaches the
//! publishers' nodes within it; under load it may not (seen with 1,000 clients moving at
//! once on 2 shared cores: the node read its route 2.1 s late, and every client lost the
//! same 0.6 to 5 s of messages). A copy on the new link proves its interest arrived. The
//! caller says which subscriptions can prove nothing this way: queue groups (each message
//! goes to one member) and JetStream pull inboxes (each message to one request).
//!
//! Echo: a client that connected with `echo:false` does not get its own messages from the
//! link it published on, but the other link is a different connection and would deliver
//! them. Its publishes during the overlap are recorded per matching sid and their
//! deliveries dropped.
//!
//! Bounds: at most `max_entries` fingerprints are remembered (past it nothing more is
//! recorded and each forwarded message counts as a possible duplicate); at most
//! `max_hold_bytes` are held back (past it the oldest held message is released early,
//! counted, and remembered so that A's later copy of it is dropped).

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use bytes::Bytes;

use super::action::Epoch;

/// Default bound of remembered fingerprints (about 40 bytes each).
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;
/// Default bound of bytes held back from the new link.
pub const DEFAULT_MAX_HOLD_BYTES: usize = 16 * 1024 * 1024;
/// Longest the old link's UNSUBs wait past the settle delay for the new link's proof of
/// overlap; then they go anyway (logged).
pub const PROOF_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// Messages forwarded without protection (bounds reached): possible duplicates.
    pub overflowed: u64,
    /// Duplicates dropped.
    pub suppressed: u64,
    /// Own messages dropped (echo:false).
    pub echoes: u64,
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
            overflowed: 0,
            suppressed: 0,
            echoes: 0,
        }
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
            self.overflowed += 1;
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
            self.suppressed += 1;
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
            self.entries -= 1;
            self.suppressed += 1;
        }
        hit
    }

    /// A message with fingerprint `fp` (and `size` bytes) on `sid` from link `epoch`.
    /// What may be forwarded now is queued for [`pop_ready`](Self::pop_ready).
    pub fn on_message(&mut self, epoch: Epoch, sid: &[u8], fp: u64, size: usize, msg: T) {
        if take(&mut self.own, sid, fp) {
            self.entries -= 1;
            self.echoes += 1;
            return;
        }
        if epoch == self.old {
            if self.take_seen_new(sid, fp) {
                // The new link delivered it first (released early): proof as well.
                self.old_seen(sid).proven = true;
            } else {
                self.remember(false, sid, fp);
                self.ready.push_back(msg);
            }
            return;
        }
        if self.old_done {
            if !self.take_seen_old(sid, fp) {
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
                self.overflowed += 1;
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
    /// may lag behind) until the caller drops this after a linger time.
    pub fn old_finished(&mut self) {
        if self.old_done {
            return;
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
    }

    /// Subscriptions that are live on the old link and for which the new link has not yet
    /// delivered a copy, among those `provable` accepts (see the module doc).
    pub fn unproven(&self, provable: impl Fn(&[u8]) -> bool) -> usize {
        self.seen_old
            .iter()
            .filter(|(sid, o)| o.live && !o.proven && provable(sid))
            .count()
    }

    /// Remembered fingerprints.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Bytes held back.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn what_the_old_link_delivered_while_the_new_one_was_dialled_is_matched() {
        // 300 clients migrating at once: B's node already receives the subject for
        // others, so B's window begins with m1, which A delivered before B existed.
        let mut d: Dedup<u32> = Dedup::recording(A, 100, 100);
        assert!(d.covers(A) && !d.covers(B) && d.awaits_new_link(A));
        for m in 1..=3 {
            d.on_message(A, b"1", m, 1, m as u32);
        }
        d.attach(B);
        d.start_recording();
        for m in 1..=5 {
            d.on_message(B, b"1", m, 1, 100 + m as u32);
        }
        d.old_finished();
        let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
        assert_eq!(out, [1, 2, 3, 104, 105]);
        assert_eq!(d.suppressed, 3);
    }

    #[test]
    fn the_new_link_proves_its_interest_with_a_copy_on_each_live_sid() {
        let mut d: Dedup<u32> = Dedup::recording(A, 100, 100);
        d.on_message(A, b"1", 1, 1, 1);
        d.attach(B);
        d.start_recording();
        assert_eq!(d.unproven(|_| true), 0, "nothing live yet");
        // A delivers on sids 1 and 2 during the overlap; B's interest has not arrived.
        d.on_message(A, b"1", 2, 1, 2);
        d.on_message(A, b"2", 20, 1, 20);
        assert_eq!(d.unproven(|_| true), 2);
        assert_eq!(
            d.unproven(|sid| sid != b"2"),
            1,
            "the caller excludes sid 2"
        );
        // B's copy of 2 (A first) proves sid 1; on sid 2, B is ahead of A.
        d.on_message(B, b"1", 2, 1, 102);
        d.on_message(B, b"2", 21, 1, 121);
        assert_eq!(d.unproven(|_| true), 1);
        d.on_message(A, b"2", 21, 1, 21);
        assert_eq!(d.unproven(|_| true), 0);
        // A B message A never delivered proves nothing.
        let mut e: Dedup<u32> = Dedup::new(A, B, 100, 100);
        e.start_recording();
        e.on_message(A, b"1", 5, 1, 5);
        e.on_message(B, b"1", 6, 1, 106);
        assert_eq!(e.unproven(|_| true), 1);
    }

    #[test]
    fn a_new_link_lost_before_the_switch_leaves_the_memory_for_the_next_one() {
        let mut d: Dedup<u32> = Dedup::recording(A, 100, 100);
        d.on_message(A, b"1", 1, 1, 1);
        d.attach(B);
        d.start_recording();
        d.on_message(A, b"1", 2, 1, 2);
        d.on_message(B, b"1", 2, 1, 102);
        d.detach();
        assert!(d.awaits_new_link(A) && d.held_bytes() == 0);
        const C: Epoch = Epoch(3);
        d.attach(C);
        d.on_message(C, b"1", 1, 1, 201);
        d.on_message(C, b"1", 2, 1, 202);
        d.on_message(C, b"1", 3, 1, 203);
        d.old_finished();
        let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
        assert_eq!(
            out,
            [1, 2, 203],
            "B's copy is dropped with B; C's overlap matched"
        );
    }

    #[test]
    fn identical_messages_the_old_link_delivered_before_the_new_subscription_are_not_matched() {
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 100);
        // A delivers 5 identical messages before B's SUBs are registered...
        for m in 0..5 {
            d.on_message(A, b"1", 7, 1, m);
        }
        d.start_recording();
        // ...then 2 more, which B also gets; B then gets 3 that A no longer does.
        for m in 5..7 {
            d.on_message(A, b"1", 7, 1, m);
        }
        for m in 5..10 {
            d.on_message(B, b"1", 7, 1, m + 100);
        }
        d.old_finished();
        let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
        assert_eq!(out.len(), 7 + 3, "A's 7 and B's 3 new ones: {out:?}");
    }

    #[test]
    fn the_old_links_deliveries_before_the_pong_are_matched_as_a_prefix() {
        // A's socket was read before B's PONG: A delivered 1..=4 early, of which B's
        // window holds 3 and 4; then 5 and 6 late. B delivers 3..=8.
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 100);
        for m in 1..=4 {
            d.on_message(A, b"1", m as u64, 1, m);
        }
        d.start_recording();
        for m in 5..=6 {
            d.on_message(A, b"1", m as u64, 1, m);
        }
        for m in 3..=8 {
            d.on_message(B, b"1", m as u64, 1, m + 100);
        }
        d.old_finished();
        let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
        assert_eq!(out, vec![1, 2, 3, 4, 5, 6, 107, 108]);
        assert_eq!(d.suppressed, 4);
    }

    const A: Epoch = Epoch(1);
    const B: Epoch = Epoch(2);

    proptest! {
        /// Each link delivers a contiguous window of the publisher's sequence (A from the
        /// start to where its UNSUB took effect, B from where its SUB took effect to the
        /// end, overlapping). For any interleaving of the two streams that keeps each
        /// link's own order, every distinct message is forwarded exactly once, in order.
        #[test]
        fn every_message_exactly_once_in_order(
            n in 1usize..60,
            a_end_frac in 0.0f64..1.0,
            b_start_frac in 0.0f64..1.0,
            choices in proptest::collection::vec(any::<bool>(), 0..200),
            pong_at in 0usize..260,
        ) {
            let a_end = ((n as f64) * a_end_frac) as usize;
            let b_start = ((a_end as f64) * b_start_frac) as usize; // B starts before A ends
            let a: Vec<usize> = (0..a_end).collect();
            let b: Vec<usize> = (b_start..n).collect();
            let mut d = Dedup::new(A, B, 1000, 1 << 20);
            let (mut i, mut j) = (0, 0);
            let mut out = Vec::new();
            let mut c = choices.into_iter();
            while i < a.len() || j < b.len() {
                // B's replay PONG is read at any point: before B's window, or (reads
                // racing) after A delivered some of it.
                if i + j == pong_at { d.start_recording(); }
                let from_a = if i == a.len() { false } else if j == b.len() { true } else { c.next().unwrap_or(true) };
                let (e, m) = if from_a { i += 1; (A, a[i - 1]) } else { j += 1; (B, b[j - 1]) };
                let fp = fingerprint(b"s", None, b"", m.to_string().as_bytes());
                d.on_message(e, b"1", fp, 1, m);
                // A's drain PONG comes after the last message A delivers.
                if i == a.len() { d.old_finished(); }
                while let Some(m) = d.pop_ready() { out.push(m); }
            }
            d.old_finished();
            while let Some(m) = d.pop_ready() { out.push(m); }
            prop_assert_eq!(out, (0..n).collect::<Vec<_>>());
        }
    }

    fn run(d: &mut Dedup<u32>, e: Epoch, sid: &[u8], fp: u64, m: u32) -> Vec<u32> {
        d.on_message(e, sid, fp, 1, m);
        std::iter::from_fn(|| d.pop_ready()).collect()
    }

    #[test]
    fn identical_payloads_count_as_a_multiset() {
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 100);
        d.start_recording();
        assert_eq!(run(&mut d, A, b"1", 5, 1), vec![1]);
        assert_eq!(run(&mut d, A, b"1", 5, 2), vec![2]);
        for m in 3..=5 {
            assert_eq!(run(&mut d, B, b"1", 5, m), Vec::<u32>::new(), "held");
        }
        // Per sid: the same content on another sid is another delivery.
        assert_eq!(run(&mut d, B, b"2", 5, 6), Vec::<u32>::new());
        d.old_finished();
        assert_eq!(
            std::iter::from_fn(|| d.pop_ready()).collect::<Vec<_>>(),
            vec![5, 6]
        );
        assert_eq!(d.suppressed, 2);
    }

    #[test]
    fn echo_false_own_messages_are_dropped_from_either_link() {
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 100);
        d.start_recording();
        d.own_publish([Bytes::from_static(b"1")].into_iter(), 9);
        d.own_publish([Bytes::from_static(b"1")].into_iter(), 10);
        assert_eq!(run(&mut d, B, b"1", 9, 1), Vec::<u32>::new());
        assert_eq!(run(&mut d, A, b"1", 10, 2), Vec::<u32>::new());
        d.old_finished();
        assert_eq!(d.pop_ready(), None);
        assert_eq!(d.echoes, 2);
    }

    #[test]
    fn bounds_release_early_and_count() {
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 2);
        d.start_recording();
        assert_eq!(run(&mut d, B, b"1", 1, 1), Vec::<u32>::new());
        assert_eq!(run(&mut d, B, b"1", 2, 2), Vec::<u32>::new());
        // Over the hold bound: the oldest goes out early and is remembered...
        assert_eq!(run(&mut d, B, b"1", 3, 3), vec![1]);
        assert_eq!(d.overflowed, 1);
        // ...so that A's copy of it is dropped.
        assert_eq!(run(&mut d, A, b"1", 1, 10), Vec::<u32>::new());
        let mut d: Dedup<u32> = Dedup::new(A, B, 2, 100);
        d.start_recording();
        for i in 0..5u64 {
            assert_eq!(run(&mut d, A, b"1", i, i as u32), vec![i as u32]);
        }
        assert_eq!(d.entries(), 2);
        assert_eq!(d.overflowed, 3);
    }

    #[test]
    fn after_the_old_link_finishes_only_its_entries_matter() {
        let mut d: Dedup<u32> = Dedup::new(A, B, 100, 100);
        d.start_recording();
        assert_eq!(run(&mut d, A, b"1", 7, 1), vec![1]);
        assert_eq!(run(&mut d, A, b"1", 8, 2), vec![2]);
        assert_eq!(run(&mut d, B, b"1", 7, 3), Vec::<u32>::new());
        d.old_finished();
        assert_eq!(d.pop_ready(), None, "held copy of 7 skipped");
        assert_eq!(
            run(&mut d, B, b"1", 8, 4),
            Vec::<u32>::new(),
            "B lagging behind A"
        );
        assert_eq!(run(&mut d, B, b"1", 9, 5), vec![5]);
        assert_eq!(d.entries(), 0);
    }
}
