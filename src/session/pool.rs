//! Which upstream node to dial next: the configured addresses plus those learned from the
//! cluster's INFO `connect_urls`, never a node in lame duck mode, skipping nodes that just
//! failed. Pure: no I/O, time is a parameter.

use std::time::{Duration, Instant};

/// How long a node that announced lame duck mode is avoided.
pub const LDM_AVOID: Duration = Duration::from_secs(30);
/// How long a node whose dial or link just failed is avoided.
pub const FAILED_AVOID: Duration = Duration::from_secs(5);
/// Bound on remembered nodes (configured ones are never dropped).
pub const MAX_NODES: usize = 64;

#[derive(Debug, Clone)]
struct Node {
    addr: String,
    configured: bool,
    avoid_until: Option<Instant>,
}

/// The known nodes, in order of preference (configured first, then discovered).
#[derive(Debug, Clone)]
pub struct NodePool {
    nodes: Vec<Node>,
    /// Index after the one picked last (round robin).
    cursor: usize,
}

impl NodePool {
    /// A pool of the configured addresses (`host:port`).
    pub fn new(configured: &[String]) -> NodePool {
        NodePool {
            nodes: configured
                .iter()
                .map(|a| Node {
                    addr: a.clone(),
                    configured: true,
                    avoid_until: None,
                })
                .collect(),
            cursor: 0,
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
                avoid_until: None,
            });
        }
    }

    fn avoid(&mut self, addr: &str, until: Instant) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
            n.avoid_until = Some(n.avoid_until.map_or(until, |u| u.max(until)));
        }
    }

    /// The node announced lame duck mode.
    pub fn mark_ldm(&mut self, addr: &str, now: Instant) {
        self.avoid(addr, now + LDM_AVOID);
    }

    /// A dial to, or a link with, the node failed.
    pub fn mark_failed(&mut self, addr: &str, now: Instant) {
        self.avoid(addr, now + FAILED_AVOID);
    }

    /// The node answered: stop avoiding it for failures (lame duck avoidance stays).
    pub fn mark_ok(&mut self, addr: &str, now: Instant) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == addr) {
            if n.avoid_until.is_some_and(|u| u <= now + FAILED_AVOID) {
                n.avoid_until = None;
            }
        }
    }

    /// The next node to dial, never `exclude` unless it is the only one: round robin over
    /// nodes not being avoided; if all are avoided, the one whose avoidance ends first.
    pub fn pick(&mut self, exclude: Option<&str>, now: Instant) -> Option<String> {
        let len = self.nodes.len();
        let candidates = (0..len).map(|k| (self.cursor + k) % len);
        let mut best_avoided: Option<(usize, Instant)> = None;
        for i in candidates {
            let n = &self.nodes[i];
            if exclude == Some(n.addr.as_str()) && len > 1 {
                continue;
            }
            match n.avoid_until {
                Some(u) if u > now => {
                    if best_avoided.is_none_or(|(_, b)| u < b) {
                        best_avoided = Some((i, u));
                    }
                }
                _ => {
                    self.cursor = (i + 1) % len;
                    return Some(n.addr.clone());
                }
            }
        }
        let (i, _) = best_avoided?;
        self.cursor = (i + 1) % len;
        Some(self.nodes[i].addr.clone())
    }

    /// Number of known nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no node is known (never, once configured).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
        assert_eq!(p.pick(Some("a:1"), now).as_deref(), Some("b:2"));
        assert_eq!(p.pick(Some("a:1"), now).as_deref(), Some("c:3"));
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
}
