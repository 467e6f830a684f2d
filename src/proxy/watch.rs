//! The client watch: is the proxy's client still consuming? Behind `GET /livez/client`
//! and the `natsproxy_client_*` gauges, so that a pipeline that stopped (Vector's
//! JetStream source ends at its first error item; the process stays up) is restarted
//! by its liveness probe instead of staying silent.
//!
//! Drivers report to it: a client joins once it connected (CONNECT, or another op
//! first), is updated with what its session saw it do ([`Consuming`]: pulls, acks,
//! deliveries per consumer) at most every [`REPORT_EVERY`], and leaves when its
//! connection ends. Clients are grouped by their CONNECT `name`: a name is one
//! pipeline, however many connections it opens or how often it reconnects.
//!
//! A name is **stopped**, once [`Watch::stall_after`] has passed, when:
//! - it consumed (subscribed to a subject other than a reply inbox, or pulled from a
//!   JetStream consumer) and no connection of that name is open;
//! - or one of its consumers has had no pull request sent, none waiting at the server
//!   (a request counts until its `expires`) and no ack, while the client holds no
//!   delivery it has not acked: it neither asks for messages nor works on any.
//!
//! A consumer whose client holds a delivery it has not acked and that shows no progress
//! is **slow**: a blocked downstream (Vector's sink full) and a client stuck for good
//! look the same on the wire, so it is reported (the body, the gauges) and not failed,
//! which would restart a pipeline that is only waiting.
//!
//! Never stopped: a name before it ever connected (start-up), and anything shorter
//! than the bound (a migration, an outage, a reconnect).
//!
//! Bounds: connected names are bounded by `--max-clients`; names that left are kept (so
//! that their absence is reported) up to [`MAX_ABSENT_NAMES`], the one that left first
//! forgotten past it. A name is cut to [`MAX_NAME_LEN`] bytes.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::metrics::{ClientLabel, ConsumerLabel, Stats};
use crate::session::{ConsumerActivity, Consuming, Session};

/// How often a driver copies its session's consumer activity here (when it changed).
pub const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Names kept after their last connection closed.
pub const MAX_ABSENT_NAMES: usize = 256;
/// Longest name kept (bytes; longer ones are cut at a character boundary).
pub const MAX_NAME_LEN: usize = 64;

/// One pull consumer of one connection, as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerReport {
    /// `STREAM/CONSUMER`.
    pub name: String,
    pub pulled_at: Option<Instant>,
    pub progress_at: Option<Instant>,
    /// Deliveries the client holds without having acked them.
    pub unacked: u64,
}

impl ConsumerReport {
    /// The report of one session's consumer.
    pub fn of(a: &ConsumerActivity) -> ConsumerReport {
        ConsumerReport {
            name: String::from_utf8_lossy(&a.key).replacen('.', "/", 1),
            pulled_at: a.pulled_at,
            progress_at: a.progress_at(),
            unacked: a.outstanding,
        }
    }
}

#[derive(Debug)]
struct Conn {
    id: u64,
    consumers: Vec<ConsumerReport>,
}

#[derive(Debug)]
struct Client {
    name: String,
    conns: Vec<Conn>,
    /// One of its connections consumed.
    consumed: bool,
    /// When its last connection closed (None while one is open).
    left_at: Option<Instant>,
}

/// What one consumer of a name looks like now, its connections merged.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerState {
    pub client: String,
    pub consumer: String,
    /// Since the last pull request.
    pub pull_age: Option<Duration>,
    /// Since the last sign of progress (a pull sent or waiting, an ack); zero while a
    /// pull waits.
    pub idle: Duration,
    /// Deliveries held unacked, over its connections.
    pub unacked: u64,
}

/// What the watch says now.
#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    /// Why the client counts as stopped (empty: live).
    pub stopped: Vec<String>,
    /// What is worth saying but does not fail the check (slow consumers).
    pub notes: Vec<String>,
    /// Connections watched (of the names asked about).
    pub connections: usize,
}

impl Verdict {
    /// True when `/livez/client` answers 200.
    pub fn live(&self) -> bool {
        self.stopped.is_empty()
    }

    /// The plain-text body: the reasons, one a line, then the notes.
    pub fn body(&self) -> String {
        let mut s = String::new();
        if self.live() {
            let _ = writeln!(s, "ok: {} client connection(s) watched", self.connections);
        }
        for l in self.stopped.iter().chain(&self.notes) {
            let _ = writeln!(s, "{l}");
        }
        s
    }
}

fn secs(d: Duration) -> u64 {
    d.as_secs()
}

fn cut(name: &str) -> String {
    let mut end = name.len().min(MAX_NAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// Every client name seen, with its open connections. Pure: the time comes with each
/// call; [`ClientWatch`] shares it between the drivers and the endpoint.
#[derive(Debug)]
pub struct Watch {
    /// `--client-stall-after`; zero turns the check off.
    stall_after: Duration,
    clients: Vec<Client>,
}

impl Watch {
    pub fn new(stall_after: Duration) -> Watch {
        Watch {
            stall_after,
            clients: Vec::new(),
        }
    }

    /// The bound.
    pub fn stall_after(&self) -> Duration {
        self.stall_after
    }

    fn client_mut(&mut self, name: &str) -> &mut Client {
        let name = cut(name);
        let i = match self.clients.iter().position(|c| c.name == name) {
            Some(i) => i,
            None => {
                self.clients.push(Client {
                    name,
                    conns: Vec::new(),
                    consumed: false,
                    left_at: None,
                });
                self.clients.len() - 1
            }
        };
        &mut self.clients[i]
    }

    /// Connection `id` of client `name` connected.
    pub fn join(&mut self, id: u64, name: &str) {
        let c = self.client_mut(name);
        c.left_at = None;
        c.conns.push(Conn {
            id,
            consumers: Vec::new(),
        });
    }

    /// What connection `id` of `name` did lately: whether it consumes, and its
    /// consumers.
    pub fn update(&mut self, id: u64, name: &str, consumes: bool, consumers: Vec<ConsumerReport>) {
        let c = self.client_mut(name);
        c.consumed |= consumes;
        if let Some(conn) = c.conns.iter_mut().find(|c| c.id == id) {
            conn.consumers = consumers;
        }
    }

    /// Connection `id` of `name` closed at `now`.
    pub fn leave(&mut self, id: u64, name: &str, now: Instant) {
        let c = self.client_mut(name);
        c.conns.retain(|c| c.id != id);
        if !c.conns.is_empty() {
            return;
        }
        c.left_at = Some(now);
        // A name that never consumed has nothing to report once it is gone.
        self.clients.retain(|c| c.consumed || !c.conns.is_empty());
        let absent = self.clients.iter().filter(|c| c.conns.is_empty()).count();
        if absent > MAX_ABSENT_NAMES {
            let first = self
                .clients
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.left_at.map(|t| (i, t)))
                .min_by_key(|&(_, t)| t)
                .map(|(i, _)| i);
            if let Some(i) = first {
                self.clients.remove(i);
            }
        }
    }

    /// Every consumer of the connected names, their connections merged.
    pub fn consumers(&self, now: Instant) -> Vec<ConsumerState> {
        let mut out: Vec<ConsumerState> = Vec::new();
        for c in &self.clients {
            let start = out.len();
            for r in c.conns.iter().flat_map(|k| &k.consumers) {
                let pull_age = r.pulled_at.map(|t| now.saturating_duration_since(t));
                let idle = r
                    .progress_at
                    .or(r.pulled_at)
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                match out[start..].iter_mut().find(|s| s.consumer == r.name) {
                    Some(s) => {
                        s.pull_age = match (s.pull_age, pull_age) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        s.idle = s.idle.min(idle);
                        s.unacked += r.unacked;
                    }
                    None => out.push(ConsumerState {
                        client: c.name.clone(),
                        consumer: r.name.clone(),
                        pull_age,
                        idle,
                        unacked: r.unacked,
                    }),
                }
            }
        }
        out
    }

    /// Connections open now, by name.
    pub fn connected(&self) -> impl Iterator<Item = (&str, usize)> {
        self.clients
            .iter()
            .map(|c| (c.name.as_str(), c.conns.len()))
    }

    /// The verdict at `now`, for every name or for `only` that one.
    pub fn verdict(&self, now: Instant, only: Option<&str>) -> Verdict {
        let mut v = Verdict::default();
        let asked = |name: &str| only.is_none_or(|o| cut(o) == name);
        for c in self.clients.iter().filter(|c| asked(&c.name)) {
            v.connections += c.conns.len();
            if self.stall_after.is_zero() {
                continue;
            }
            if let (true, Some(t)) = (c.consumed, c.left_at) {
                let gone = now.saturating_duration_since(t);
                if gone > self.stall_after {
                    v.stopped.push(format!(
                        "client {:?}: no client connected for {} s",
                        c.name,
                        secs(gone)
                    ));
                }
            }
        }
        if self.stall_after.is_zero() {
            return v;
        }
        for s in self.consumers(now).into_iter().filter(|s| asked(&s.client)) {
            if s.idle <= self.stall_after {
                continue;
            }
            let last_pull = s.pull_age.map_or(String::new(), |a| {
                format!(", last pull request {} s ago", secs(a))
            });
            if s.unacked > 0 {
                v.notes.push(format!(
                    "client {:?}: consumer {}: slow: idle {} s{last_pull}, holds {} deliveries unacked (a blocked downstream or a stuck client; not counted as stopped)",
                    s.client,
                    s.consumer,
                    secs(s.idle),
                    s.unacked
                ));
            } else {
                v.stopped.push(format!(
                    "client {:?}: consumer {}: idle {} s{last_pull}: no pull request waiting, no ack, nothing held",
                    s.client,
                    s.consumer,
                    secs(s.idle)
                ));
            }
        }
        v
    }
}

/// The watch, shared by the drivers (which report) and the endpoint (which asks).
#[derive(Debug)]
pub struct ClientWatch(Mutex<Watch>);

impl ClientWatch {
    pub fn new(stall_after: Duration) -> ClientWatch {
        ClientWatch(Mutex::new(Watch::new(stall_after)))
    }

    /// Runs `f` on the watch (a poisoned lock is taken over: the watch holds no
    /// invariant a panic elsewhere could break).
    pub fn with<R>(&self, f: impl FnOnce(&mut Watch) -> R) -> R {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

/// A driver's membership in the watch: joins once its client connected, reports, and
/// leaves when dropped.
pub struct Member<'a> {
    watch: &'a ClientWatch,
    id: u64,
    /// The name it joined under, once it has.
    name: Option<String>,
    reported: u64,
    consumes: bool,
    next_report: Instant,
    /// When activity held back by the report interval is to be copied.
    due: Option<Instant>,
}

impl<'a> Member<'a> {
    pub fn new(watch: &'a ClientWatch, id: u64, now: Instant) -> Member<'a> {
        Member {
            watch,
            id,
            name: None,
            reported: 0,
            consumes: false,
            next_report: now,
            due: None,
        }
    }

    /// Tells the watch what `session` saw its client do: it joins once the client
    /// connected; what changed is copied at most every [`REPORT_EVERY`] (two compares
    /// when nothing did), the rest at [`due`](Self::due).
    pub fn observe(&mut self, session: &Session, now: Instant) {
        if self.name.is_none() {
            if !session.is_client_connected() {
                return;
            }
            self.join(session.client_name().unwrap_or_default());
        }
        let force = self.due.is_some_and(|t| t <= now);
        self.due = self.report(session.consumes(), session.consuming(), now, force);
    }

    /// When [`observe`](Self::observe) has held-back activity to copy.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Joined yet?
    pub fn joined(&self) -> bool {
        self.name.is_some()
    }

    /// The client connected under `name`.
    pub fn join(&mut self, name: &str) {
        if self.name.is_none() {
            self.watch.with(|w| w.join(self.id, name));
            self.name = Some(name.to_owned());
        }
    }

    /// Copies what changed to the watch, at most every [`REPORT_EVERY`] (`force`: now).
    /// Returns when it is due next, if something is left to report.
    pub fn report(
        &mut self,
        consumes: bool,
        c: &Consuming,
        now: Instant,
        force: bool,
    ) -> Option<Instant> {
        let name = self.name.as_deref()?;
        if c.changes() == self.reported && consumes == self.consumes {
            return None;
        }
        if now < self.next_report && !force {
            return Some(self.next_report);
        }
        // Pull consumers only: a push consumer's client is watched as a subscriber.
        let reports = c
            .consumers()
            .iter()
            .filter(|a| a.pulled_at.is_some())
            .map(ConsumerReport::of)
            .collect();
        self.watch
            .with(|w| w.update(self.id, name, consumes, reports));
        self.reported = c.changes();
        self.consumes = consumes;
        self.next_report = now + REPORT_EVERY;
        None
    }

    /// The connection ended at `now`.
    pub fn leave(&mut self, now: Instant) {
        if let Some(name) = self.name.take() {
            self.watch.with(|w| w.leave(self.id, &name, now));
        }
    }
}

/// Sets the `natsproxy_client_*` gauges from the watch at `now`; returns the verdict for
/// every name (what `natsproxy_client_live` says).
pub fn export(w: &Watch, st: &Stats, now: Instant) -> Verdict {
    st.client_connected.clear();
    for (name, n) in w.connected() {
        let l = ClientLabel {
            client: name.to_owned(),
        };
        st.client_connected.get_or_create(&l).set(n as i64);
    }
    st.client_consumer_pull_age.clear();
    st.client_consumer_idle.clear();
    st.client_consumer_unacked.clear();
    for c in w.consumers(now) {
        let l = ConsumerLabel {
            client: c.client,
            consumer: c.consumer,
        };
        if let Some(a) = c.pull_age {
            st.client_consumer_pull_age
                .get_or_create(&l)
                .set(a.as_secs_f64());
        }
        st.client_consumer_idle
            .get_or_create(&l)
            .set(c.idle.as_secs_f64());
        st.client_consumer_unacked
            .get_or_create(&l)
            .set(c.unacked as i64);
    }
    let v = w.verdict(now, None);
    st.client_live.set(i64::from(v.live()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Duration = Duration::from_secs(60);

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn consumer(t0: Instant, pulled: u64, progress: u64, unacked: u64) -> ConsumerReport {
        ConsumerReport {
            name: "LOGS/vec".into(),
            pulled_at: Some(t0 + s(pulled)),
            progress_at: Some(t0 + s(progress)),
            unacked,
        }
    }

    #[test]
    fn nothing_is_stopped_before_a_client_ever_connected() {
        let w = Watch::new(B);
        let t0 = Instant::now();
        assert!(w.verdict(t0 + s(3600), None).live());
        assert!(w.verdict(t0 + s(3600), Some("vector")).live());
    }

    #[test]
    fn a_consumer_gone_longer_than_the_bound_is_stopped_and_back_when_it_reconnects() {
        let mut w = Watch::new(B);
        let t0 = Instant::now();
        w.join(1, "vector");
        w.update(1, "vector", true, vec![consumer(t0, 0, 30, 0)]);
        w.leave(1, "vector", t0 + s(10));
        assert!(w.verdict(t0 + s(70), None).live(), "not before the bound");
        let v = w.verdict(t0 + s(73), None);
        assert_eq!(
            v.stopped,
            ["client \"vector\": no client connected for 63 s"]
        );
        assert!(!w.verdict(t0 + s(73), Some("vector")).live());
        assert!(w.verdict(t0 + s(73), Some("other")).live());
        w.join(2, "vector");
        assert!(
            w.verdict(t0 + s(74), None).live(),
            "a new connection cures it"
        );
    }

    #[test]
    fn a_client_that_never_consumed_is_forgotten_when_it_leaves() {
        let mut w = Watch::new(B);
        let t0 = Instant::now();
        w.join(1, "publisher");
        w.update(1, "publisher", false, vec![]);
        w.leave(1, "publisher", t0);
        assert!(w.verdict(t0 + s(3600), None).live());
        assert_eq!(w.connected().count(), 0);
    }

    #[test]
    fn a_consumer_not_pulled_is_stopped_unless_it_holds_a_delivery() {
        let mut w = Watch::new(B);
        let t0 = Instant::now();
        w.join(1, "vector");
        w.update(1, "vector", true, vec![consumer(t0, 0, 30, 0)]);
        assert!(
            w.verdict(t0 + s(90), None).live(),
            "its request waited to 30 s"
        );
        let v = w.verdict(t0 + s(91), None);
        assert_eq!(
            v.stopped,
            ["client \"vector\": consumer LOGS/vec: idle 61 s, last pull request 91 s ago: no pull request waiting, no ack, nothing held"]
        );
        w.update(1, "vector", true, vec![consumer(t0, 0, 30, 1)]);
        let v = w.verdict(t0 + s(300), None);
        assert!(v.live(), "{v:?}");
        assert!(v.notes[0].contains("slow"), "{v:?}");
        assert!(v.body().starts_with("ok: 1 client connection(s) watched\n"));
    }

    #[test]
    fn connections_of_one_name_are_one_pipeline() {
        let mut w = Watch::new(B);
        let t0 = Instant::now();
        w.join(1, "vector");
        w.join(2, "vector");
        w.update(1, "vector", true, vec![consumer(t0, 0, 0, 0)]);
        w.update(2, "vector", true, vec![consumer(t0, 100, 100, 0)]);
        assert!(w.verdict(t0 + s(120), None).live());
        let [c] = &w.consumers(t0 + s(120))[..] else {
            panic!()
        };
        assert_eq!((c.pull_age, c.idle), (Some(s(20)), s(20)));
        w.leave(2, "vector", t0 + s(121));
        assert!(
            !w.verdict(t0 + s(122), None).live(),
            "the other one stopped"
        );
    }

    #[test]
    fn zero_turns_the_check_off() {
        let mut w = Watch::new(Duration::ZERO);
        let t0 = Instant::now();
        w.join(1, "vector");
        w.update(1, "vector", true, vec![consumer(t0, 0, 0, 0)]);
        w.leave(1, "vector", t0);
        assert!(w.verdict(t0 + s(3600), None).live());
    }

    #[test]
    fn absent_names_are_bounded_the_first_gone_forgotten() {
        let mut w = Watch::new(B);
        let t0 = Instant::now();
        for i in 0..MAX_ABSENT_NAMES as u64 + 2 {
            let n = format!("c{i}");
            w.join(i, &n);
            w.update(i, &n, true, vec![]);
            w.leave(i, &n, t0 + s(i));
        }
        let names: Vec<_> = w.connected().map(|(n, _)| n.to_owned()).collect();
        assert_eq!(names.len(), MAX_ABSENT_NAMES);
        assert_eq!(names[0], "c2");
        let long = "x".repeat(200);
        w.join(9999, &long);
        assert!(w
            .connected()
            .any(|(n, k)| n.len() == MAX_NAME_LEN && k == 1));
    }
}
