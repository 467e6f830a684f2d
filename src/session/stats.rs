//! What a session counts and reports: its counters, its events for metrics, and why it
//! moved.

use std::time::Duration;

/// Why the session moved (or is moving) to another upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// The node announced lame duck mode.
    LameDuck,
    /// The connection closed or reset.
    Closed,
    /// The node stopped answering PINGs.
    Stale,
    /// The node sent something that is not NATS protocol.
    Protocol,
}

impl std::fmt::Display for MoveReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MoveReason::LameDuck => "ldm",
            MoveReason::Closed => "closed",
            MoveReason::Stale => "stale",
            MoveReason::Protocol => "protocol",
        })
    }
}

/// Counters of one session (the driver adds them to the process-wide metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Completed make-before-break switches.
    pub migrations: u64,
    /// Primaries lost without warning.
    pub failovers: u64,
    /// Of those, losses in the middle of a make-before-break migration (the new link or
    /// the old one died before the move was complete).
    pub migrations_failed: u64,
    /// Standbys brought up because the primary was slow to answer a PING.
    pub hedges: u64,
    /// SUBs written in replays.
    pub subs_replayed: u64,
    /// Overlap duplicates dropped.
    pub duplicates_suppressed: u64,
    /// Messages forwarded after the de-dup bound was reached.
    pub possible_duplicates: u64,
    /// Own messages dropped for echo:false clients.
    pub echoes_suppressed: u64,
    /// Unconfirmed publishes written again after a link died.
    pub publishes_resent: u64,
    /// Time from lame-duck INFO to switch of the last migration.
    pub last_switch: Option<Duration>,
    /// JetStream pull requests re-sent by the proxy.
    pub pulls_reissued: u64,
    /// Redeliveries of messages the client had acked, acked again by the proxy.
    pub redeliveries_acked: u64,
    /// Idle heartbeats amended to name the client's last delivery, not a hidden one.
    pub heartbeats_amended: u64,
    /// Statuses kept from the client (those its library turns into errors), by code in
    /// the order of [`SHIELDED_CODES`].
    pub statuses_shielded: [u64; SHIELDED_CODES.len()],
    /// Messages relayed to the client.
    pub msgs_to_client: u64,
    /// Messages (publishes) relayed upstream.
    pub msgs_to_upstream: u64,
}

/// The codes of the statuses the proxy shields: `409` (Leadership Change, Server
/// Shutdown) and `503` (no responders), the index of [`SessionStats::statuses_shielded`].
pub const SHIELDED_CODES: [&str; 2] = ["409", "503"];

impl SessionStats {
    /// Statuses kept from the client, every code.
    pub fn statuses_shielded_total(&self) -> u64 {
        self.statuses_shielded.iter().sum()
    }

    /// Counts one shielded status of `code` (a code not in [`SHIELDED_CODES`] counts as
    /// the last).
    pub(super) fn count_shielded(&mut self, code: u16) {
        let i = SHIELDED_CODES
            .iter()
            .position(|c| c.parse() == Ok(code))
            .unwrap_or(SHIELDED_CODES.len() - 1);
        self.statuses_shielded[i] += 1;
    }

    /// What the overlap's de-duplication decided in one call.
    pub(super) fn count_overlap(&mut self, t: super::dedup::Tally) {
        self.duplicates_suppressed += t.suppressed;
        self.possible_duplicates += t.overflowed;
        self.echoes_suppressed += t.echoes;
    }
}

/// Something the driver reports to metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// Client traffic flows on a new upstream: trigger-to-switch time.
    Moved { reason: MoveReason, took: Duration },
    /// Round trip of a keepalive PING.
    Rtt(Duration),
    /// An outage ended (traffic resumed on a new upstream, or the client was closed at
    /// `max_outage`): how long the session had no working upstream.
    OutageEnded(Duration),
    /// A pull request lost upstream (its consumer leader moved, its link failed, its
    /// heartbeats stopped) is placed in full again: how long after it was found lost.
    PullReplaced(Duration),
}

/// Bound of undrained metric events.
pub const MAX_EVENTS: usize = 64;
