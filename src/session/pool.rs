//! Which upstream node to dial next: the configured addresses plus those learned from the
//! cluster's INFO `connect_urls`, never a node in lame duck mode, skipping nodes that just
//! failed. Pure: no I/O, time is a parameter.
//!
//! A node is who it says it is: once a link to an address has read the server's INFO, the
//! address is known to be that `server_id`, and avoiding a node (lame duck, failure) avoids
//! every address known to be it. `localhost:4222` configured and `127.0.0.1:4222` learned
//! are one node. `server_id` is new at each start of nats-server, so a restarted node is a
//! new node; `server_name` is not, and is not used here. An address behind which the node
//! changes (a Service's balancer) is the node it was last seen to be.

use std::time::{Duration, Instant};

/// How long a node that announced lame duck mode is avoided.
pub const LDM_AVOID: Duration = Duration::from_secs(30);
/// How long a node whose dial or link just failed is avoided.
pub const FAILED_AVOID: Duration = Duration::from_secs(5);
/// Bound on remembered nodes (configured ones are never dropped), and on identities.
pub const MAX_NODES: usize = 64;

/// Why a node (address or identity) is avoided, and until when.
#[derive(Debug, Clone, Copy, Default)]
struct Avoid {
    ldm_until: Option<Instant>,
    failed_until: Option<Instant>,
}

impl Avoid {
    fn until(&self, now: Instant) -> Option<Instant> {
        [self.ldm_until, self.failed_until]
            .into_iter()
            .flatten()
            .filter(|u| *u > now)
            .max()
    }
}

fn later(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.max(b)))
}

#[derive(Debug, Clone)]
struct Node {
    addr: String,
    configured: bool,
    /// Avoidance by address: a dial failed (no identity is known for a dial that failed).
    avoid: Avoid,
    /// The `server_id` the last link to this address read in the INFO.
    server_id: Option<String>,
}

/// The known nodes, in order of preference (configured first, then discovered).
#[derive(Debug, Clone)]
pub struct NodePool {
    nodes: Vec<Node>,
    /// Avoidance by identity (`server_id`), oldest first.
    servers: Vec<(String, Avoid)>,
    /// Where each pick starts looking: sessions with other seeds spread over the nodes.
    rng: fastrand::Rng,
}

impl NodePool {
    /// Seeds where each pick starts among the nodes: the sessions of one proxy spread
    /// over the nodes at start-up and when they all move at once (1,000 clients did not
    /// all land on one node), as the official clients randomize their server list.
    pub fn seeded(mut self, seed: u64) -> NodePool {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    /// A pool of the configured addresses (`host:port`).
    pub fn new(configured: &[String]) -> NodePool {
        NodePool {
            nodes: configured
                .iter()
                .map(|a| Node {
                    addr: a.clone(),
                    configured: true,
                    avoid: Avoid::default(),
                    server_id: None,
                })
                .collect(),
            servers: Vec::new(),
            rng: fastrand::Rng::with_seed(0),
        }
    }

    /// Adds addresses learned from an INFO's `connect_urls`.
    pub fn learn(&mut self, urls: &[String]) {
        for u in urls {
            let addr = u.trim_start_matches("nats://").trim_end_matches('/');
            if addr.is_empty() || self.nodes.iter().any(|n| n.addr == addr) {
                continue;
            }
            if self.nodes.len() >= MAX_NODES {
                // Forget the oldest discovered node to stay bounded.
                if let Some(i) = self.nodes.iter().position(|n| !n.configured) {
                    self.nodes.remove(i);
                } else {
                    return;
                }
            }
            self.nodes.push(Node {
                addr: addr.to_owned(),
                configured: false,
                avoid: Avoid::default(),
                server_id: None,
            });
        }
    }

    /// A link to `addr` read this `server_id` in the server's INFO.
    pub fn identify(&mut self, addr: &str, server_id: &str) {
        if server_id.is_empty() {
            return;
        }
        if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
            n.server_id = Some(server_id.to_owned());
        }
    }

    /// True when the node `server_id` announced lame duck mode (under any address).
    pub fn is_leaving(&self, server_id: &str, now: Instant) -> bool {
        self.servers
            .iter()
            .any(|(id, a)| id == server_id && a.ldm_until.is_some_and(|u| u > now))
    }

    fn server_mut(&mut self, id: &str) -> &mut Avoid {
        if let Some(i) = self.servers.iter().position(|(s, _)| s == id) {
            return &mut self.servers[i].1;
        }
        if self.servers.len() >= MAX_NODES {
            self.servers.remove(0);
        }
        self.servers.push((id.to_owned(), Avoid::default()));
        &mut self.servers.last_mut().expect("just pushed").1
    }

    fn id_of(&self, addr: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.addr == addr)
            .and_then(|n| n.server_id.clone())
    }

    /// The node at `addr` announced lame duck mode.
    pub fn mark_ldm(&mut self, addr: &str, now: Instant) {
        let until = now + LDM_AVOID;
        match self.id_of(addr) {
            Some(id) => {
                let a = self.server_mut(&id);
                a.ldm_until = later(a.ldm_until, until);
            }
            None => {
                if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
                    n.avoid.ldm_until = later(n.avoid.ldm_until, until);
                }
            }
        }
    }

    /// A dial to, or a link with, the node at `addr` failed.
    pub fn mark_failed(&mut self, addr: &str, now: Instant) {
        let until = now + FAILED_AVOID;
        if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
            n.avoid.failed_until = later(n.avoid.failed_until, until);
        }
        if let Some(id) = self.id_of(addr) {
            let a = self.server_mut(&id);
            a.failed_until = later(a.failed_until, until);
        }
    }

    /// The node at `addr` answered: stop avoiding it for failures (lame duck avoidance
    /// stays).
    pub fn mark_ok(&mut self, addr: &str) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
            n.avoid.failed_until = None;
        }
        if let Some(id) = self.id_of(addr) {
            self.server_mut(&id).failed_until = None;
        }
    }

    /// Until when node `i` is avoided, by its address or its identity.
    fn avoided_until(&self, i: usize, now: Instant) -> Option<Instant> {
        let n = &self.nodes[i];
        let by_id = n.server_id.as_ref().and_then(|id| {
            self.servers
                .iter()
                .find(|(s, _)| s == id)
                .and_then(|(_, a)| a.until(now))
        });
        n.avoid.until(now).into_iter().chain(by_id).max()
    }

    /// The next node to dial, never `exclude` (nor another address of the same node)
    /// unless nothing else is known: a node not being avoided, the search starting at a
    /// random one; if all are avoided, the one whose avoidance ends first.
    pub fn pick(&mut self, exclude: Option<&str>, now: Instant) -> Option<String> {
        let len = self.nodes.len();
        let excluded_id = exclude.and_then(|a| self.id_of(a));
        let is_excluded = |n: &Node| {
            exclude == Some(n.addr.as_str()) || excluded_id.is_some() && n.server_id == excluded_id
        };
        let others = self.nodes.iter().filter(|n| !is_excluded(n)).count();
        let candidates: Vec<usize> = (0..len)
            .filter(|&i| others == 0 || !is_excluded(&self.nodes[i]))
            .collect();
        let free: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| self.avoided_until(i, now).is_none())
            .collect();
        let i = if free.is_empty() {
            // All avoided: the one whose avoidance ends first.
            candidates
                .into_iter()
                .min_by_key(|&i| self.avoided_until(i, now))?
        } else {
            // Uniformly among the nodes not avoided.
            free[self.rng.usize(..free.len())]
        };
        Some(self.nodes[i].addr.clone())
    }

    /// Number of known nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_skips_ldm_and_failed_nodes() {
        let now = Instant::now();
        let mut p = NodePool::new(&["a:1".into()]);
        p.learn(&["b:2".into(), "nats://c:3".into(), "a:1".into()]);
        assert_eq!(p.len(), 3);
        p.mark_ldm("a:1", now);
        for _ in 0..10 {
            let next = p.pick(Some("a:1"), now);
            assert!(matches!(next.as_deref(), Some("b:2" | "c:3")), "{next:?}");
        }
        p.mark_failed("b:2", now);
        assert_eq!(p.pick(Some("a:1"), now).as_deref(), Some("c:3"));
        // Everything avoided: the one whose avoidance ends first.
        p.mark_failed("c:3", now + Duration::from_millis(1));
        assert_eq!(p.pick(Some("a:1"), now).as_deref(), Some("b:2"));
        // Avoidance ends.
        assert!(p
            .pick(None, now + LDM_AVOID + Duration::from_secs(1))
            .is_some());
    }

    #[test]
    fn a_single_node_is_picked_even_if_excluded() {
        let now = Instant::now();
        let mut p = NodePool::new(&["a:1".into()]);
        p.mark_ldm("a:1", now);
        assert_eq!(p.pick(Some("a:1"), now).as_deref(), Some("a:1"));
    }

    #[test]
    fn one_node_under_two_names_is_avoided_under_both() {
        let now = Instant::now();
        let mut p = NodePool::new(&["localhost:4222".into()]);
        p.identify("localhost:4222", "N1");
        p.learn(&["127.0.0.1:4222".into(), "127.0.0.1:4223".into()]);
        // The learned twin was dialled once and turned out to be N1 too.
        p.identify("127.0.0.1:4222", "N1");
        p.identify("127.0.0.1:4223", "N2");
        p.mark_ldm("localhost:4222", now);
        assert!(p.is_leaving("N1", now));
        assert!(!p.is_leaving("N2", now));
        for _ in 0..4 {
            assert_eq!(
                p.pick(Some("localhost:4222"), now).as_deref(),
                Some("127.0.0.1:4223")
            );
        }
        // Excluded by identity even when not avoided (a failure elsewhere).
        let mut q = NodePool::new(&["localhost:4222".into(), "127.0.0.1:4222".into()]);
        q.identify("localhost:4222", "N1");
        q.identify("127.0.0.1:4222", "N1");
        q.learn(&["127.0.0.1:4223".into()]);
        assert_eq!(
            q.pick(Some("localhost:4222"), now).as_deref(),
            Some("127.0.0.1:4223")
        );
        // A link failure avoids the node under every name; an answer ends it.
        q.mark_failed("127.0.0.1:4222", now);
        assert!(q.avoided_until(0, now).is_some());
        q.mark_ok("localhost:4222");
        assert!(q.avoided_until(0, now).is_none());
        assert!(
            q.avoided_until(1, now).is_some(),
            "the address's own dial failure stays"
        );
    }

    #[test]
    fn a_restarted_node_is_a_new_node() {
        let now = Instant::now();
        let mut p = NodePool::new(&["a:1".into(), "b:2".into()]);
        p.identify("a:1", "old");
        p.mark_ldm("a:1", now);
        // a:1 came back as a new process: the next link reads a new server_id.
        p.identify("a:1", "new");
        assert!(p.is_leaving("old", now));
        assert!(!p.is_leaving("new", now));
        assert_eq!(p.avoided_until(0, now), None);
    }

    #[test]
    fn sessions_seeded_differently_spread_over_the_nodes() {
        let now = Instant::now();
        let mut counts = [0usize; 3];
        for seed in 0..300 {
            let mut p = NodePool::new(&["a:1".into()]).seeded(seed);
            p.learn(&["b:2".into(), "c:3".into()]);
            p.identify("a:1", "A");
            p.mark_ldm("a:1", now);
            match p.pick(Some("a:1"), now).as_deref() {
                Some("b:2") => counts[1] += 1,
                Some("c:3") => counts[2] += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(counts[1] >= 100 && counts[2] >= 100, "{counts:?}");
    }

    #[test]
    fn identities_are_bounded() {
        let now = Instant::now();
        let mut p = NodePool::new(&["a:1".into()]);
        for i in 0..(MAX_NODES * 2) {
            p.identify("a:1", &format!("S{i}"));
            p.mark_ldm("a:1", now);
        }
        assert_eq!(p.servers.len(), MAX_NODES);
    }
}
