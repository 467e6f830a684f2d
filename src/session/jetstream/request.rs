//! A pull request on the wire: its subject, its body, and the frames the proxy writes for
//! it (a placement upstream, a synthetic status toward the client).
//!
//! Syntax (nats-server `nextReqFromMsg`, consumer.go): the subject is
//! `<api prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`, the reply the client's inbox, and
//! the body one of
//! ```text
//! (empty)            batch 1
//! <decimal>          that batch
//! {json}             batch, max_bytes, expires (ns), no_wait, idle_heartbeat (ns), priority fields
//! ```

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::proto::{encode, Message};

/// Largest idle heartbeat the proxy asks of the server for a request: a request lost
/// without a status (its consumer leader moved before it replicated, or an R1 consumer's
/// node went lame duck) is noticed after two of them and [`HB_SLACK`](super::pull_phase::HB_SLACK),
/// 250 ms after its last sign. The price: 10 small statuses (about 90 bytes each) a
/// second per request waiting idle, which the proxy swallows; 10,000 a second (0.9 MB/s
/// from the servers) for a shared proxy whose 1,000 clients each keep one waiting. A
/// request that receives messages gets none.
pub const UPSTREAM_HB_MAX: Duration = Duration::from_millis(100);
/// Smallest one: a request expiring so soon that its heartbeat would be shorter is only
/// watched through its expiry.
pub const UPSTREAM_HB_MIN: Duration = Duration::from_millis(100);

/// Whether `subject` is `<prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
pub fn is_pull_subject(subject: &[u8]) -> bool {
    // Cheap pre-check: this runs for every client publish.
    if memchr::memmem::find(subject, b".CONSUMER.MSG.NEXT.").is_none() {
        return false;
    }
    let tokens: Vec<&[u8]> = subject.split(|&c| c == b'.').collect();
    let n = tokens.len();
    n >= 6
        && tokens[n - 5] == b"CONSUMER"
        && tokens[n - 4] == b"MSG"
        && tokens[n - 3] == b"NEXT"
        && tokens[..n - 5].iter().any(|t| *t == b"API")
        && tokens.iter().all(|t| !t.is_empty())
}

/// A parsed pull request body.
#[derive(Debug, Clone, PartialEq)]
pub struct PullBody {
    pub batch: u64,
    pub max_bytes: u64,
    pub expires: Option<Duration>,
    pub no_wait: bool,
    pub idle_heartbeat: Option<Duration>,
    /// The JSON object, to re-send with other fields intact (None for the short forms).
    pub json: Option<Map<String, Value>>,
}

fn ns(v: Option<&Value>) -> Option<Duration> {
    v.and_then(Value::as_u64)
        .filter(|&n| n > 0)
        .map(Duration::from_nanos)
}

/// Parses a pull request body as the server does (`nextReqFromMsg`).
pub fn parse_body(payload: &[u8]) -> Option<PullBody> {
    let trimmed = payload.trim_ascii();
    let short = |batch: u64| PullBody {
        batch: batch.max(1),
        max_bytes: 0,
        expires: None,
        no_wait: false,
        idle_heartbeat: None,
        json: None,
    };
    if trimmed.is_empty() {
        return Some(short(1));
    }
    if trimmed[0] == b'{' {
        let Value::Object(m) = serde_json::from_slice(trimmed).ok()? else {
            return None;
        };
        return Some(PullBody {
            batch: m.get("batch").and_then(Value::as_u64).unwrap_or(1).max(1),
            max_bytes: m.get("max_bytes").and_then(Value::as_u64).unwrap_or(0),
            expires: ns(m.get("expires")),
            no_wait: m.get("no_wait").and_then(Value::as_bool).unwrap_or(false),
            idle_heartbeat: ns(m.get("idle_heartbeat")),
            json: Some(m),
        });
    }
    let n: u64 = std::str::from_utf8(trimmed).ok()?.parse().ok()?;
    Some(short(n))
}

impl PullBody {
    /// A `no_wait` request without an expiry: the server answers it at once (messages
    /// and an end, or `404 No Messages`) and never holds it. A `no_wait` request with an
    /// expiry is held like any other until its first delivery or its expiry, which ends
    /// it with `408 Request Timeout` (seen on 2.15.1 and 2.9.10), and is treated as one.
    pub fn answered_at_once(&self) -> bool {
        self.no_wait && self.expires.is_none()
    }

    /// The heartbeat the proxy asks of the server: a quarter of the expiry (so two missed
    /// beats, the loss signal, come by half of it, leaving the other half to place the
    /// request again), at most half the client's own (so the loss shows before the
    /// client's monitor fires) and at most [`UPSTREAM_HB_MAX`]. `None`: no JSON body, no
    /// expiry, or an expiry under 4 × [`UPSTREAM_HB_MIN`]; the client's own heartbeat (if
    /// any) is then kept as it is. A `no_wait` request with an expiry gets one too: the
    /// server holds it until its first delivery or its expiry, with heartbeats
    /// (`consumer.go`, `processNextMsgRequest`: "a one-shot situation"), and nats.go's,
    /// cnats' and nats-py's `Fetch` start with one; lost with its consumer leader, it
    /// would cost the client its whole wait.
    pub fn upstream_heartbeat(&self, expires: Option<Duration>) -> Option<Duration> {
        if self.json.is_none() {
            return self.idle_heartbeat;
        }
        let (Some(exp), Some(original)) = (expires, self.expires) else {
            return self.idle_heartbeat;
        };
        if self.idle_heartbeat.is_some_and(|h| h * 2 > original) {
            // The server refuses the client's request (`heartbeat value too large`): its
            // answer, not ours.
            return self.idle_heartbeat;
        }
        let mut hb = (exp / 4).min(UPSTREAM_HB_MAX);
        if let Some(client) = self.idle_heartbeat {
            hb = hb.min(client / 2);
        }
        if hb < UPSTREAM_HB_MIN {
            // Too short to watch: the client's own where it is still valid, else none.
            return self.idle_heartbeat.filter(|&h| h * 2 <= exp);
        }
        Some(hb)
    }
}

/// What a placement upstream asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub batch: u64,
    pub max_bytes: Option<u64>,
    pub expires: Option<Duration>,
    pub idle_heartbeat: Option<Duration>,
}

/// The `PUB`/`HPUB` that places `body` upstream with the credit and timing of `ask`; the
/// client's other fields (priority group, `min_pending`, …) are kept.
pub fn encode_placement(
    api_subject: &[u8],
    reply: &[u8],
    headers: Option<&[u8]>,
    body: &PullBody,
    ask: Ask,
) -> Bytes {
    let mut m = body.json.clone().unwrap_or_default();
    m.insert("batch".into(), ask.batch.into());
    if let Some(b) = ask.max_bytes {
        m.insert("max_bytes".into(), b.into());
    }
    let nanos = |d: Duration| Value::from(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    match ask.expires {
        Some(e) => m.insert("expires".into(), nanos(e)),
        None => m.remove("expires"),
    };
    match ask.idle_heartbeat {
        Some(h) => m.insert("idle_heartbeat".into(), nanos(h)),
        None => m.remove("idle_heartbeat"),
    };
    // A Map of plain values always serializes.
    let json = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
    encode::publish(api_subject, Some(reply), headers, &json)
}

/// The server's `100 Idle Heartbeat` for a pull inbox, byte for byte
/// (`sendIdleHeartbeat`, consumer.go), with the last delivered sequences.
pub fn idle_heartbeat(reply: &[u8], sid: &[u8], last: Sequences) -> Bytes {
    let h = format!(
        "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {}\r\nNats-Last-Stream: {}\r\n\r\n",
        last.consumer, last.stream
    );
    encode::msg(reply, sid, None, Some(h.as_bytes()), b"")
}

/// The server's `408 Request Timeout` with the credit left unused.
pub fn request_timeout(reply: &[u8], sid: &[u8], batch_left: u64, bytes_left: u64) -> Bytes {
    let h = format!(
        "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: {batch_left}\r\nNats-Pending-Bytes: {bytes_left}\r\n\r\n"
    );
    encode::msg(reply, sid, None, Some(h.as_bytes()), b"")
}

/// `m`, an end status carrying the server's `Nats-Pending-Messages` (and
/// `Nats-Pending-Bytes`), with `msgs` and `bytes` added to them: the credit left as the
/// client counts it, where the deliveries the proxy kept from it were never made.
/// Clients that keep their own count of outstanding credit (async-nats, nats.js
/// `consume()`) subtract these values from it; without the amendment each hidden
/// delivery would stay counted as still to come. `None`: no such header, nothing to add.
pub fn with_hidden_credit(m: &Message, msgs: u64, bytes: u64) -> Option<Bytes> {
    const MSGS: &[u8] = b"Nats-Pending-Messages:";
    const BYTES: &[u8] = b"Nats-Pending-Bytes:";
    let headers = m.headers();
    let mut out = Vec::with_capacity(headers.len() + 8);
    let mut amended = false;
    for line in headers.split_inclusive(|&c| c == b'\n') {
        let add = if line.starts_with(MSGS) {
            Some((MSGS, msgs))
        } else if line.starts_with(BYTES) {
            Some((BYTES, bytes))
        } else {
            None
        };
        let value = add.and_then(|(name, n)| {
            let v = std::str::from_utf8(&line[name.len()..]).ok()?.trim();
            Some((name, v.parse::<u64>().ok()?.saturating_add(n)))
        });
        match value {
            Some((name, v)) => {
                out.extend_from_slice(name);
                out.extend_from_slice(format!(" {v}\r\n").as_bytes());
                amended = true;
            }
            None => out.extend_from_slice(line),
        }
    }
    amended.then(|| encode::msg(m.subject(), m.sid(), m.reply(), Some(&out), m.payload()))
}

/// The server's answer to a `no_wait` request with nothing to deliver.
pub fn no_messages(reply: &[u8], sid: &[u8]) -> Bytes {
    encode::msg(
        reply,
        sid,
        None,
        Some(b"NATS/1.0 404 No Messages\r\n\r\n"),
        b"",
    )
}

/// The consumer and stream sequence of a delivery, from its `$JS.ACK` reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sequences {
    pub consumer: u64,
    pub stream: u64,
}

impl Sequences {
    /// `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (v1) or
    /// `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<token>`
    /// (v2), as [`super::acks::AckRef::parse`] reads them.
    pub fn of_ack(reply: &[u8]) -> Option<Sequences> {
        let a = super::acks::AckRef::parse(reply)?;
        Some(Sequences {
            consumer: a.consumer_seq,
            stream: a.stream_seq,
        })
    }
}
