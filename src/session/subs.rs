//! The client's live subscriptions: what must be replayed on a new upstream link.

use bytes::Bytes;
use rustc_hash::FxHashMap;

use super::jetstream::heartbeat::HiddenRun;
use crate::proto::encode;

/// One subscription as the client made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sub {
    pub subject: Bytes,
    pub queue: Option<Bytes>,
    /// Auto-unsubscribe after this many deliveries (`UNSUB <sid> <max>`).
    pub max: Option<u64>,
    /// Messages delivered to the client on this sid so far.
    pub delivered: u64,
    /// The redeliveries hidden from the client last, in a row (for its heartbeats).
    pub hidden: Option<HiddenRun>,
    /// Creation order, so that replay preserves the client's order.
    order: u64,
}

/// sid → subscription. A second SUB with a used sid is ignored, as nats-server does.
#[derive(Debug, Default)]
pub struct SubTable {
    /// Looked up for every message: a fast hash (sids are the client's own choice, so a
    /// client can only slow down its own session with colliding ones).
    subs: FxHashMap<Bytes, Sub>,
    next_order: u64,
}

impl SubTable {
    /// Adds a subscription; returns false (and changes nothing) if the sid is in use.
    pub fn subscribe(&mut self, sid: Bytes, subject: Bytes, queue: Option<Bytes>) -> bool {
        if self.subs.contains_key(&sid) {
            return false;
        }
        self.next_order += 1;
        self.subs.insert(
            sid,
            Sub {
                subject,
                queue,
                max: None,
                delivered: 0,
                hidden: None,
                order: self.next_order,
            },
        );
        true
    }

    /// `UNSUB <sid> [max]`: removes now, or sets the auto-unsubscribe count. A max at or
    /// below what was already delivered removes at once (nats-server's rule).
    pub fn unsubscribe(&mut self, sid: &[u8], max: Option<u64>) {
        match (self.subs.get_mut(sid), max) {
            (Some(s), Some(m)) if m > s.delivered => s.max = Some(m),
            (Some(_), _) => {
                self.subs.remove(sid);
            }
            (None, _) => {}
        }
    }

    /// Counts a delivery on `sid`; removes the subscription when its max is reached.
    pub fn delivered(&mut self, sid: &[u8]) {
        if let Some(s) = self.subs.get_mut(sid) {
            s.delivered += 1;
            if s.max.is_some_and(|m| s.delivered >= m) {
                self.subs.remove(sid);
            }
        }
    }

    /// A redelivery with `consumer_seq` was hidden from the client on `sid`.
    pub fn hid_redelivery(&mut self, sid: &[u8], consumer_seq: u64) {
        if let Some(s) = self.subs.get_mut(sid) {
            s.hidden = Some(HiddenRun::after(s.hidden, consumer_seq));
        }
    }

    /// The subscription with this sid.
    pub fn get(&self, sid: &[u8]) -> Option<&Sub> {
        self.subs.get(sid)
    }

    /// Number of live subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// The sids whose subject matches the literal `subject` (for echo suppression).
    pub fn matching<'a>(&'a self, subject: &'a [u8]) -> impl Iterator<Item = Bytes> + 'a {
        self.subs
            .iter()
            .filter(move |(_, s)| crate::proto::subject::matches(&s.subject, subject))
            .map(|(sid, _)| sid.clone())
    }

    /// The sid a message to the literal `subject` would be delivered on (an exact match
    /// first, else a wildcard one): where a pull request's replies arrive.
    pub fn sid_for(&self, subject: &[u8]) -> Option<Bytes> {
        self.subs
            .iter()
            .find(|(_, s)| s.subject == subject)
            .or_else(|| {
                self.subs
                    .iter()
                    .find(|(_, s)| crate::proto::subject::matches(&s.subject, subject))
            })
            .map(|(sid, _)| sid.clone())
    }

    /// The sids of all live subscriptions.
    pub fn sids(&self) -> impl Iterator<Item = &Bytes> {
        self.subs.keys()
    }

    /// The live subscriptions in creation order, as (sid, sub).
    pub fn iter_ordered(&self) -> Vec<(&Bytes, &Sub)> {
        let mut v: Vec<_> = self.subs.iter().collect();
        v.sort_by_key(|(_, s)| s.order);
        v
    }

    /// The SUB (and UNSUB max, reduced by what was delivered) lines that recreate every
    /// live subscription on a new link, same sid, subject and queue group.
    pub fn replay(&self) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(self.subs.len());
        for (sid, s) in self.iter_ordered() {
            out.push(encode::sub(&s.subject, s.queue.as_deref(), sid));
            if let Some(m) = s.max {
                out.push(encode::unsub(sid, Some(m - s.delivered)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Ev {
        Sub(u8, u8),
        Unsub(u8, Option<u8>),
        Msg(u8),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0u8..6, 0u8..3).prop_map(|(s, q)| Ev::Sub(s, q)),
            (0u8..6, proptest::option::of(0u8..4)).prop_map(|(s, m)| Ev::Unsub(s, m)),
            (0u8..6).prop_map(Ev::Msg),
        ]
    }

    proptest! {
        /// The replay set equals a straightforward model of the live subscriptions after
        /// any SUB/UNSUB/MSG sequence.
        #[test]
        fn replay_equals_live_subscriptions(evs in proptest::collection::vec(ev(), 0..60)) {
            let mut t = SubTable::default();
            // model: (sid, subject, delivered, max)
            let mut model: Vec<(u8, String, u64, Option<u64>)> = Vec::new();
            for e in evs {
                match e {
                    Ev::Sub(s, q) => {
                        let subj = format!("s.{q}");
                        let added = t.subscribe(Bytes::from(s.to_string()), Bytes::from(subj.clone()), None);
                        let exists = model.iter().any(|m| m.0 == s);
                        prop_assert_eq!(added, !exists);
                        if !exists { model.push((s, subj, 0, None)); }
                    }
                    Ev::Unsub(s, max) => {
                        t.unsubscribe(s.to_string().as_bytes(), max.map(u64::from));
                        if let Some(i) = model.iter().position(|m| m.0 == s) {
                            match max.map(u64::from) {
                                Some(m) if m > model[i].2 => model[i].3 = Some(m),
                                _ => { model.remove(i); }
                            }
                        }
                    }
                    Ev::Msg(s) => {
                        t.delivered(s.to_string().as_bytes());
                        if let Some(i) = model.iter().position(|m| m.0 == s) {
                            model[i].2 += 1;
                            if model[i].3.is_some_and(|m| model[i].2 >= m) { model.remove(i); }
                        }
                    }
                }
            }
            let expect: Vec<Bytes> = model.iter().flat_map(|(s, subj, d, max)| {
                let mut v = vec![encode::sub(subj.as_bytes(), None, s.to_string().as_bytes())];
                if let Some(m) = max { v.push(encode::unsub(s.to_string().as_bytes(), Some(m - d))); }
                v
            }).collect();
            prop_assert_eq!(t.replay(), expect);
        }
    }

    #[test]
    fn duplicate_sid_keeps_first() {
        let mut t = SubTable::default();
        assert!(t.subscribe("1".into(), "a".into(), None));
        assert!(!t.subscribe("1".into(), "b".into(), Some("q".into())));
        assert_eq!(t.replay(), vec![Bytes::from_static(b"SUB a 1\r\n")]);
    }
}
