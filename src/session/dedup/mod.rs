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
//! Proof of overlap: a subscription leaves the old link (its UNSUB, then the PONG of a
//! PING after it) only once the new link has delivered a copy of something the old one
//! delivered on it ([`Dedup::proven`]): the new node's interest reached that publisher's
//! node. Until then the old link keeps it, also when it carried nothing through the
//! switch, until its server closes the old link. A settle delay alone is no proof: under
//! load a node read its route 2.1 s late (1,000 clients moving at once on 2 shared
//! cores, every client lost the same 0.6 to 5 s of messages), and an idle subscription
//! lost what was published just after the old link's UNSUB whenever the new node's
//! interest came later (seen once in CI; `tests/migration.rs` reproduces it with a
//! delayed route). Each subscription's old side ends on its own
//! ([`Dedup::old_finished_on`]): what the new link held back on it is released then, the
//! others stay held. The caller says which subscriptions can prove nothing this way and
//! leave at once: queue groups (each message goes to one member) and JetStream pull
//! inboxes (each message to one request).
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

mod memory;

pub use memory::{fingerprint, Dedup, Tally, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_HOLD_BYTES};

#[cfg(test)]
mod tests;
