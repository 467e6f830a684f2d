//! The process's dial budget: a token bucket over every upstream dial of every client.
//!
//! Sessions already back off and try each node at most once per refusal round, so a
//! storm needs a bug or many clients at once. The budget makes one impossible whatever
//! the cause: at most `burst` dials at once and `rate` per second after that. A dial
//! over the budget is not made; the session is told and tries again after its backoff,
//! without holding it against the node (`natsproxy_upstream_dials_refused_total`).
//!
//! Pure: the caller passes `now`.

use std::time::{Duration, Instant};

/// A token bucket: `burst` tokens, refilled at `rate` per second.
#[derive(Debug)]
pub struct DialBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Option<Instant>,
}

impl DialBudget {
    /// A full bucket. A `rate` of 0 means no limit.
    pub fn new(rate: u32, burst: u32) -> DialBudget {
        DialBudget {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            at: None,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let elapsed = self
            .at
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.at = Some(now);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = DialBudget::new(10, 5);
        assert_eq!((0..8).filter(|_| b.try_take(t0)).count(), 5);
        // 10 per second: one token per 100 ms, never more than the burst.
        assert!(!b.try_take(t0 + Duration::from_millis(50)));
        assert!(b.try_take(t0 + Duration::from_millis(110)));
        assert!(!b.try_take(t0 + Duration::from_millis(120)));
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..8).filter(|_| b.try_take(later)).count(), 5);
        // Over one simulated second of constant asking: burst + rate, no more.
        let mut b = DialBudget::new(10, 5);
        let granted = (0..1000)
            .filter(|i| b.try_take(t0 + Duration::from_millis(*i)))
            .count();
        assert!((14..=15).contains(&granted), "{granted}");
    }

    #[test]
    fn zero_rate_is_unlimited() {
        let t0 = Instant::now();
        let mut b = DialBudget::new(0, 0);
        assert!((0..10_000).all(|_| b.try_take(t0)));
    }
}
