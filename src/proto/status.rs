//! JetStream pull statuses: what a header-only message on a pull inbox means.
//!
//! The server answers a pull request (`CONSUMER.MSG.NEXT`) with deliveries and, around
//! them, status messages: an `HMSG` to the request's reply subject whose headers start
//! with `NATS/1.0 <code> <description>` and whose payload is empty. What the proxy does
//! with one depends only on what it says about the request, so the meaning is decided
//! here, once, from the code and the description (nats-server `server/consumer.go` and
//! `server/jetstream.go`, 2.9 to 2.15):
//!
//! | status | sent by nats-server when | [`PullStatus`] |
//! |---|---|---|
//! | `100 Idle Heartbeat` | a waiting request asked for `idle_heartbeat` | `Heartbeat` |
//! | `408 Request Timeout` | the request expired (`Nats-Pending-*`: credit left) | `Ended` |
//! | `408 Interest Expired` | the reply's interest went away (account exports) | `Ended` |
//! | `408 Requests Pending` | `no_wait`: other requests cover what is pending | `Ended` |
//! | `404 No Messages` | `no_wait` and nothing pending | `Ended` |
//! | `409 Batch Completed` | the batch is served but `max_bytes` is left | `Ended` |
//! | `409 Message Size Exceeds MaxBytes` | the next message is larger than the credit | `Ended` |
//! | `409 Leadership Change` | a new consumer leader releases the requests it knew of (`checkPendingRequests`) | `LeaderChanged` |
//! | `409 Server Shutdown` | the leader's JetStream shut down (`jetstream.go`, normal shutdown; sent by 2.9) | `LeaderShutDown` |
//! | `503` | no responders: nobody serves `MSG.NEXT` (R1 node away, no leader yet) | `ConsumerUnavailable` |
//! | `409 Consumer Deleted` | the consumer was deleted (`releaseAnyPendingRequests`) | `Rejected` |
//! | `409 Consumer is push based` | a pull sent to a push consumer | `Rejected` |
//! | `409 Exceeded MaxWaiting` / `MaxRequestBatch` / `MaxRequestExpires` / `MaxRequestMaxBytes` | the request breaks a consumer limit | `Rejected` |
//! | `400 Bad Request …` | the request is invalid (`heartbeat value too large`, …) | `Rejected` |
//! | `423 …`, `412 …`, anything else | pinning, API level, future statuses | `Other` |
//!
//! `LeaderChanged`, `LeaderShutDown` and `ConsumerUnavailable` say nothing about the
//! request itself, only that the consumer serving it went away (or, for the first, that
//! a new leader serves it now): the proxy hides them and places the request again.
//! Everything else is the server's true answer and reaches the client.

use super::Message;

/// The meaning of a status message on a pull inbox (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStatus {
    /// `100`: the request is alive, nothing to deliver.
    Heartbeat,
    /// The request ended normally (expiry, batch or bytes served, `no_wait` answered).
    Ended,
    /// `409 Leadership Change`: the new consumer leader released the request; it is
    /// the one that sends this, so it serves a new request at once.
    LeaderChanged,
    /// `409 Server Shutdown`: the request died with its leader's JetStream; a new leader
    /// may not be elected yet.
    LeaderShutDown,
    /// `503`: nothing serves the consumer right now; the request never landed.
    ConsumerUnavailable,
    /// A real problem with the request or the consumer.
    Rejected(Rejection),
    /// A status this table does not know; relayed as it is, tracking unchanged.
    Other,
}

/// Why the server refused a request ([`PullStatus::Rejected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// `409 Consumer Deleted` / `409 Consumer is push based`: no request on this consumer
    /// can be served.
    ConsumerGone,
    /// `400 Bad Request - heartbeat value too large`: `idle_heartbeat` × 2 > `expires`.
    HeartbeatTooLarge,
    /// Any other `400` or `409 Exceeded …`: this request is wrong; others may be fine.
    Request,
}

impl PullStatus {
    /// Classifies `code` with its `description` (the text after the code on the status
    /// line, as [`Message::status_description`] returns it).
    pub fn classify(code: u16, description: &[u8]) -> PullStatus {
        let starts = |p: &[u8]| description.starts_with(p);
        match code {
            100 => PullStatus::Heartbeat,
            404 | 408 => PullStatus::Ended,
            409 if starts(b"Leadership Change") => PullStatus::LeaderChanged,
            409 if starts(b"Server Shutdown") => PullStatus::LeaderShutDown,
            409 if starts(b"Consumer Deleted") || starts(b"Consumer is push based") => {
                PullStatus::Rejected(Rejection::ConsumerGone)
            }
            409 if starts(b"Exceeded ") => PullStatus::Rejected(Rejection::Request),
            409 => PullStatus::Ended,
            400 if memchr::memmem::find(description, b"heartbeat").is_some() => {
                PullStatus::Rejected(Rejection::HeartbeatTooLarge)
            }
            400 => PullStatus::Rejected(Rejection::Request),
            503 => PullStatus::ConsumerUnavailable,
            _ => PullStatus::Other,
        }
    }

    /// The status of `m`, if it is a status message (headers, a status line, no payload).
    pub fn of(m: &Message) -> Option<PullStatus> {
        if !m.has_headers() || !m.payload().is_empty() {
            return None;
        }
        let code = m.status()?;
        Some(PullStatus::classify(code, m.status_description()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_status_has_its_class() {
        use PullStatus::*;
        let cases: &[(u16, &str, PullStatus)] = &[
            (100, "Idle Heartbeat", Heartbeat),
            (408, "Request Timeout", Ended),
            (408, "Interest Expired", Ended),
            (408, "Requests Pending", Ended),
            (404, "No Messages", Ended),
            (409, "Batch Completed", Ended),
            (409, "Message Size Exceeds MaxBytes", Ended),
            (409, "Leadership Change", LeaderChanged),
            (409, "Server Shutdown", LeaderShutDown),
            (503, "", ConsumerUnavailable),
            (409, "Consumer Deleted", Rejected(Rejection::ConsumerGone)),
            (
                409,
                "Consumer is push based",
                Rejected(Rejection::ConsumerGone),
            ),
            (409, "Exceeded MaxWaiting", Rejected(Rejection::Request)),
            (
                409,
                "Exceeded MaxRequestBatch of 10",
                Rejected(Rejection::Request),
            ),
            (
                409,
                "Exceeded MaxRequestExpires of 1s",
                Rejected(Rejection::Request),
            ),
            (
                409,
                "Exceeded MaxRequestMaxBytes of 5",
                Rejected(Rejection::Request),
            ),
            (
                400,
                "Bad Request - heartbeat value too large",
                Rejected(Rejection::HeartbeatTooLarge),
            ),
            (400, "Bad Request", Rejected(Rejection::Request)),
            (423, "Nats-Pin-Id mismatch", Other),
            (412, "Required Api Level", Other),
        ];
        for &(code, desc, want) in cases {
            assert_eq!(
                PullStatus::classify(code, desc.as_bytes()),
                want,
                "{code} {desc}"
            );
        }
    }
}
