//! A session's own bound on dialling: at most [`MAX_DIALS_PER_WINDOW`] dials in any
//! [`DIAL_WINDOW`], whatever the cause (a node that takes the handshake and dies at
//! once, lame ducks announced one after another, a bug). A dial over the bound waits
//! until the oldest of the window's dials leaves it. With the process's dial budget
//! (`proxy::budget`) on top, no input can make the proxy hammer the cluster.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The window over which a session's dials are counted.
pub const DIAL_WINDOW: Duration = Duration::from_secs(1);
/// Dials one session may make in one [`DIAL_WINDOW`]: a start-up over a few nodes, or a
/// failover and the migration after it, never a loop.
pub const MAX_DIALS_PER_WINDOW: usize = 6;

/// The times of the last dials, at most [`MAX_DIALS_PER_WINDOW`].
#[derive(Debug, Default)]
pub(super) struct DialWindow {
    recent: VecDeque<Instant>,
}

impl DialWindow {
    /// `None`: dial now (and it is counted). `Some(t)`: not before `t`.
    pub(super) fn admit(&mut self, now: Instant) -> Option<Instant> {
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= DIAL_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= MAX_DIALS_PER_WINDOW {
            return self.recent.front().map(|&t| t + DIAL_WINDOW);
        }
        self.recent.push_back(now);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_bound_in_any_window() {
        let t0 = Instant::now();
        let mut w = DialWindow::default();
        for _ in 0..MAX_DIALS_PER_WINDOW {
            assert_eq!(w.admit(t0), None);
        }
        assert_eq!(w.admit(t0), Some(t0 + DIAL_WINDOW));
        assert_eq!(
            w.admit(t0 + Duration::from_millis(999)),
            Some(t0 + DIAL_WINDOW)
        );
        assert_eq!(w.admit(t0 + DIAL_WINDOW), None);
    }
}
