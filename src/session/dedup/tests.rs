//! The overlap's tests: matching, ambiguity, bounds, echo and the proof of overlap.

use super::memory::*;
use crate::session::action::Epoch;
use bytes::Bytes;
use proptest::prelude::*;

/// A `Dedup` whose returned tallies are added up, as the session adds them to its stats.
struct Counted {
    d: Dedup<u32>,
    tally: Tally,
}

impl Counted {
    fn new(old: Epoch, new: Epoch, max_entries: usize, max_hold: usize) -> Counted {
        Counted {
            d: Dedup::new(old, new, max_entries, max_hold),
            tally: Tally::default(),
        }
    }
    fn recording(old: Epoch, max_entries: usize, max_hold: usize) -> Counted {
        Counted {
            d: Dedup::recording(old, max_entries, max_hold),
            tally: Tally::default(),
        }
    }
    fn add(&mut self, t: Tally) {
        self.tally.suppressed += t.suppressed;
        self.tally.overflowed += t.overflowed;
        self.tally.echoes += t.echoes;
    }
    fn on_message(&mut self, e: Epoch, sid: &[u8], fp: u64, size: usize, m: u32) {
        let t = self.d.on_message(e, sid, fp, size, m);
        self.add(t);
    }
    fn old_finished(&mut self) {
        let t = self.d.old_finished();
        self.add(t);
    }
}

impl std::ops::Deref for Counted {
    type Target = Dedup<u32>;
    fn deref(&self) -> &Dedup<u32> {
        &self.d
    }
}

impl std::ops::DerefMut for Counted {
    fn deref_mut(&mut self) -> &mut Dedup<u32> {
        &mut self.d
    }
}

#[test]
fn what_the_old_link_delivered_while_the_new_one_was_dialled_is_matched() {
    // 300 clients migrating at once: B's node already receives the subject for
    // others, so B's window begins with m1, which A delivered before B existed.
    let mut d = Counted::recording(A, 100, 100);
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
    assert_eq!(d.tally.suppressed, 3);
}

#[test]
fn the_new_link_proves_its_interest_with_a_copy_on_each_sid() {
    let mut d = Counted::recording(A, 100, 100);
    d.on_message(A, b"1", 1, 1, 1);
    d.attach(B);
    d.start_recording();
    // A delivers on sids 1 and 2 during the overlap; B's interest has not arrived.
    d.on_message(A, b"1", 2, 1, 2);
    d.on_message(A, b"2", 20, 1, 20);
    assert!(!d.proven(b"1") && !d.proven(b"2") && !d.proven(b"3"));
    // B's copy of 2 (A first) proves sid 1; on sid 2, B is ahead of A.
    d.on_message(B, b"1", 2, 1, 102);
    d.on_message(B, b"2", 21, 1, 121);
    assert!(d.proven(b"1") && !d.proven(b"2"));
    d.on_message(A, b"2", 21, 1, 21);
    assert!(d.proven(b"2"));
    // A B message A never delivered proves nothing.
    let mut e = Counted::new(A, B, 100, 100);
    e.start_recording();
    e.on_message(A, b"1", 5, 1, 5);
    e.on_message(B, b"1", 6, 1, 106);
    assert!(!e.proven(b"1"));
}

#[test]
fn the_new_link_catches_up_when_it_copied_the_old_links_last_delivery() {
    let mut d = Counted::new(A, B, 100, 100);
    d.start_recording();
    assert!(d.new_link_caught_up());
    // A delivers 1 and 2; B's route is slower: A ends before B's copies come.
    d.on_message(A, b"1", 1, 1, 1);
    d.on_message(A, b"1", 2, 1, 2);
    d.old_finished();
    assert!(!d.new_link_caught_up());
    d.on_message(B, b"1", 1, 1, 101);
    assert!(!d.new_link_caught_up(), "2's copy still on its way");
    d.on_message(B, b"1", 2, 1, 102);
    assert!(d.new_link_caught_up());
    let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
    assert_eq!(out, [1, 2], "B's copies dropped");
}

#[test]
fn one_sid_finished_on_the_old_link_releases_its_held_messages_only() {
    let mut d = Counted::new(A, B, 100, 100);
    d.start_recording();
    d.on_message(A, b"1", 1, 1, 1);
    d.on_message(B, b"1", 1, 1, 101);
    d.on_message(B, b"1", 2, 1, 102);
    d.on_message(B, b"2", 3, 1, 103);
    let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
    assert_eq!(out, [1], "B's held back");
    let t = d.old_finished_on(&[Bytes::from_static(b"1")]);
    assert_eq!(t.suppressed, 1, "B's copy of 1");
    let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
    assert_eq!(out, [102], "sid 2 still held");
    assert_eq!(d.held_bytes(), 1);
    // B on sid 1 now goes out at once; sid 2 waits for its own end.
    d.on_message(B, b"1", 4, 1, 104);
    d.on_message(B, b"2", 5, 1, 105);
    let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
    assert_eq!(out, [104]);
    d.old_finished();
    let out: Vec<u32> = std::iter::from_fn(|| d.pop_ready()).collect();
    assert_eq!(out, [103, 105]);
}

#[test]
fn a_new_link_lost_before_the_switch_leaves_the_memory_for_the_next_one() {
    let mut d = Counted::recording(A, 100, 100);
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
    let mut d = Counted::new(A, B, 100, 100);
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
    let mut d = Counted::new(A, B, 100, 100);
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
    assert_eq!(d.tally.suppressed, 4);
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
        let mut d = Counted::new(A, B, 1000, 1 << 20);
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
            d.on_message(e, b"1", fp, 1, m as u32);
            // A's drain PONG comes after the last message A delivers.
            if i == a.len() { d.old_finished(); }
            while let Some(m) = d.pop_ready() { out.push(m); }
        }
        d.old_finished();
        while let Some(m) = d.pop_ready() { out.push(m); }
        prop_assert_eq!(out, (0..n as u32).collect::<Vec<_>>());
    }
}

proptest! {
    /// A hedge: A (the suspect primary) delivers the whole sequence, late or not; B (the
    /// standby) delivers from where its SUB took effect. For any interleaving, then A
    /// answering (B closed, A's rest through the lingering match) or A found dead (B's
    /// rest through it): nothing twice, and nothing lost that a link delivered.
    #[test]
    fn hedged_delivery_gives_each_message_once(
        n in 1usize..60,
        b_start_frac in 0.0f64..1.0,
        choices in proptest::collection::vec(any::<bool>(), 0..200),
        end_at in 0usize..130,
        answered in any::<bool>(),
    ) {
        let b_start = ((n as f64) * b_start_frac) as usize;
        let a: Vec<usize> = (0..n).collect();
        let b: Vec<usize> = (b_start..n).collect();
        let mut d = Counted::recording(A, 1000, 1 << 20);
        d.hedge();
        d.attach(B);
        let fp = |m: usize| fingerprint(b"s", None, b"", m.to_string().as_bytes());
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        let mut c = choices.into_iter();
        while (i < a.len() || j < b.len()) && i + j < end_at {
            let from_a = if i == a.len() { false } else if j == b.len() { true } else { c.next().unwrap_or(true) };
            let (e, m) = if from_a { i += 1; (A, a[i - 1]) } else { j += 1; (B, b[j - 1]) };
            d.on_message(e, b"1", fp(m), 1, m as u32);
            while let Some(m) = d.pop_ready() { out.push(m); }
        }
        let mut expected: Vec<u32>;
        if answered {
            d.hedge_answered();
            for &m in &a[i..] {
                let (dup, t) = d.late_copy(b"1", fp(m));
                d.add(t);
                if !dup { out.push(m as u32); }
            }
            expected = (0..n as u32).collect();
        } else {
            d.old_finished();
            while let Some(m) = d.pop_ready() { out.push(m); }
            for &m in &b[j..] {
                let (dup, t) = d.late_copy(b"1", fp(m));
                d.add(t);
                if !dup { out.push(m as u32); }
            }
            expected = a[..i].iter().chain(&b).map(|&m| m as u32).collect();
            expected.sort_unstable();
            expected.dedup();
        }
        let mut got = out.clone();
        got.sort_unstable();
        got.dedup();
        prop_assert_eq!(got.len(), out.len(), "nothing twice: {:?}", out);
        prop_assert_eq!(got, expected);
    }
}

fn run(d: &mut Counted, e: Epoch, sid: &[u8], fp: u64, m: u32) -> Vec<u32> {
    d.on_message(e, sid, fp, 1, m);
    std::iter::from_fn(|| d.pop_ready()).collect()
}

#[test]
fn identical_payloads_count_as_a_multiset() {
    let mut d = Counted::new(A, B, 100, 100);
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
    assert_eq!(d.tally.suppressed, 2);
}

#[test]
fn echo_false_own_messages_are_dropped_from_either_link() {
    let mut d = Counted::new(A, B, 100, 100);
    d.start_recording();
    d.own_publish([Bytes::from_static(b"1")].into_iter(), 9);
    d.own_publish([Bytes::from_static(b"1")].into_iter(), 10);
    assert_eq!(run(&mut d, B, b"1", 9, 1), Vec::<u32>::new());
    assert_eq!(run(&mut d, A, b"1", 10, 2), Vec::<u32>::new());
    d.old_finished();
    assert_eq!(d.pop_ready(), None);
    assert_eq!(d.tally.echoes, 2);
}

#[test]
fn bounds_release_early_and_count() {
    let mut d = Counted::new(A, B, 100, 2);
    d.start_recording();
    assert_eq!(run(&mut d, B, b"1", 1, 1), Vec::<u32>::new());
    assert_eq!(run(&mut d, B, b"1", 2, 2), Vec::<u32>::new());
    // Over the hold bound: the oldest goes out early and is remembered...
    assert_eq!(run(&mut d, B, b"1", 3, 3), vec![1]);
    assert_eq!(d.tally.overflowed, 1);
    // ...so that A's copy of it is dropped.
    assert_eq!(run(&mut d, A, b"1", 1, 10), Vec::<u32>::new());
    let mut d = Counted::new(A, B, 2, 100);
    d.start_recording();
    for i in 0..5u64 {
        assert_eq!(run(&mut d, A, b"1", i, i as u32), vec![i as u32]);
    }
    assert_eq!(d.entries(), 2);
    assert_eq!(d.tally.overflowed, 3);
}

#[test]
fn after_the_old_link_finishes_only_its_entries_matter() {
    let mut d = Counted::new(A, B, 100, 100);
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
