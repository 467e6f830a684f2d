//! The per-connection state machine driven by an arbitrary sequence of client ops, upstream
//! ops, raw bytes, link failures, lame-duck INFOs and clock jumps. Invariants checked after
//! every step: no panic; the backlog and hold-back buffers stay within their bounds; every
//! handshake written to a new link replays exactly the live subscriptions; nothing that
//! arrives on a retired link reaches the client; and no input makes the session dial
//! more than `MAX_DIALS_PER_WINDOW` times in any `DIAL_WINDOW` of simulated time.
#![no_main]

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use natsproxy::proto::{encode, ClientDecoder, ClientOp, Limits};
use natsproxy::session::{
    Action, Epoch, Session, SessionConfig, DIAL_WINDOW, MAX_DIALS_PER_WINDOW,
};

const SUBJECTS: [&str; 7] = [
    "a",
    "b.c",
    "_INBOX.x.1",
    "$JS.API.CONSUMER.MSG.NEXT.S.C",
    "$JS.ACK.S.C.1.2.3.4.5",
    "foo.>",
    "*",
];
const MARKER: &[u8] = b"RETIRED-LINK";
const MAX_BACKLOG: usize = 4096;
const MAX_HOLD: usize = 4096;
const MAX_CHUNK: usize = 1024;

#[derive(Arbitrary, Debug)]
enum COp {
    Connect {
        echo: bool,
        verbose: bool,
        headers: bool,
    },
    Sub {
        subject: u8,
        queue: bool,
        sid: u8,
    },
    Unsub {
        sid: u8,
        max: Option<u8>,
    },
    Pub {
        subject: u8,
        reply: Option<u8>,
        payload: Vec<u8>,
    },
    Pull {
        batch: u8,
        expires_ms: u16,
        heartbeat_ms: Option<u16>,
        no_wait: bool,
    },
    Ping,
    Pong,
}

#[derive(Arbitrary, Debug)]
enum SOp {
    Info {
        connect_urls: bool,
        ldm: bool,
    },
    Msg {
        subject: u8,
        sid: u8,
        reply: Option<u8>,
        payload: Vec<u8>,
    },
    Status {
        code: u8,
        sid: u8,
    },
    Ping,
    Pong,
    Err,
}

#[derive(Arbitrary, Debug)]
enum Ev {
    Client(COp),
    ClientRaw(Vec<u8>),
    Up { link: u8, op: SOp },
    UpRaw { link: u8, bytes: Vec<u8> },
    Connected { link: u8 },
    Lost { link: u8 },
    Advance { ms: u16 },
    ClientClosed,
}

fn subject(i: u8) -> &'static [u8] {
    SUBJECTS[usize::from(i) % SUBJECTS.len()].as_bytes()
}

fn sid(i: u8) -> Vec<u8> {
    (i % 8).to_string().into_bytes()
}

fn client_bytes(op: &COp) -> Bytes {
    match op {
        COp::Connect { echo, verbose, headers } => encode::connect(
            format!(r#"{{"echo":{echo},"verbose":{verbose},"pedantic":false,"headers":{headers},"no_responders":true}}"#)
                .as_bytes(),
        ),
        COp::Sub { subject: s, queue, sid: i } => {
            encode::sub(subject(*s), queue.then_some(&b"q"[..]), &sid(*i))
        }
        COp::Unsub { sid: i, max } => encode::unsub(&sid(*i), max.map(u64::from)),
        COp::Pub { subject: s, reply, payload } => {
            let r = reply.map(subject);
            encode::publish(subject(*s), r, None, &sanitize(payload.clone()))
        }
        COp::Pull { batch, expires_ms, heartbeat_ms, no_wait } => {
            let mut j = format!(r#"{{"batch":{batch},"expires":{}"#, u64::from(*expires_ms) * 1_000_000);
            if let Some(h) = heartbeat_ms {
                j.push_str(&format!(r#","idle_heartbeat":{}"#, u64::from(*h) * 1_000_000));
            }
            if *no_wait {
                j.push_str(r#","no_wait":true"#);
            }
            j.push('}');
            encode::publish(b"$JS.API.CONSUMER.MSG.NEXT.S.C", Some(b"_INBOX.x.1"), None, j.as_bytes())
        }
        COp::Ping => Bytes::from_static(encode::PING),
        COp::Pong => Bytes::from_static(encode::PONG),
    }
}

fn server_bytes(op: &SOp) -> Bytes {
    match op {
        SOp::Info { connect_urls, ldm } => {
            let urls = if *connect_urls {
                r#","connect_urls":["127.0.0.1:4223","127.0.0.1:4224"]"#
            } else {
                ""
            };
            encode::info(format!(r#"{{"server_id":"S","server_name":"n","max_payload":1048576,"headers":true,"proto":1,"ldm":{ldm}{urls}}}"#).as_bytes())
        }
        SOp::Msg {
            subject: s,
            sid: i,
            reply,
            payload,
        } => {
            let r = reply.map(subject);
            encode::msg(subject(*s), &sid(*i), r, None, &sanitize(payload.clone()))
        }
        SOp::Status { code, sid: i } => {
            let (c, text) = [
                (100, "Idle Heartbeat"),
                (404, "No Messages"),
                (408, "Request Timeout"),
                (409, "Consumer Deleted"),
                (409, "Leadership Change"),
                (503, ""),
            ][usize::from(*code) % 6];
            let h = format!(
                "NATS/1.0 {c} {text}\r\nNats-Pending-Messages: 1\r\nNats-Pending-Bytes: 0\r\n\r\n"
            );
            encode::msg(b"_INBOX.x.1", &sid(*i), None, Some(h.as_bytes()), b"")
        }
        SOp::Ping => Bytes::from_static(encode::PING),
        SOp::Pong => Bytes::from_static(encode::PONG),
        SOp::Err => Bytes::from_static(b"-ERR 'Stale Connection'\r\n"),
    }
}

/// Removes the retired-link marker from arbitrary bytes, so that only the harness sends it.
fn sanitize(mut v: Vec<u8>) -> Vec<u8> {
    for i in 0..v.len() {
        if v[i..].starts_with(MARKER) {
            v[i] = b'r';
        }
    }
    v.truncate(MAX_CHUNK);
    v
}

type SubKey = (Bytes, Bytes, Option<Bytes>);

/// What an upstream server has been told: the subscriptions written on that link.
struct View {
    dec: ClientDecoder,
    buf: BytesMut,
    subs: BTreeSet<SubKey>,
}

impl View {
    fn feed(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        while let Ok(Some(op)) = self.dec.decode(&mut self.buf) {
            match op {
                ClientOp::Sub {
                    subject,
                    queue,
                    sid,
                    ..
                } => {
                    self.subs.insert((sid, subject, queue));
                }
                ClientOp::Unsub {
                    sid,
                    max: None | Some(0),
                    ..
                } => self.subs.retain(|k| k.0 != sid),
                _ => {}
            }
        }
    }
}

struct Harness {
    views: HashMap<Epoch, View>,
    s: Session,
    now: Instant,
    known: Vec<Epoch>,
    dead: HashSet<Epoch>,
    closed: bool,
    /// When the last dials were asked for (simulated time).
    dials: VecDeque<Instant>,
}

impl Harness {
    fn drain(&mut self, exact_replay: bool) -> Vec<Action> {
        let actions: Vec<Action> = std::iter::from_fn(|| self.s.poll_action()).collect();
        let mut handshakes = Vec::new();
        for a in &actions {
            match a {
                Action::Dial { epoch, .. } => {
                    self.known.push(*epoch);
                    self.dials.push_back(self.now);
                    while self
                        .dials
                        .front()
                        .is_some_and(|&t| self.now - t >= DIAL_WINDOW)
                    {
                        self.dials.pop_front();
                    }
                    assert!(
                        self.dials.len() <= MAX_DIALS_PER_WINDOW,
                        "{} dials within {DIAL_WINDOW:?}",
                        self.dials.len()
                    );
                }
                Action::CloseUpstream(e) => {
                    self.dead.insert(*e);
                }
                Action::CloseClient(_) => self.closed = true,
                Action::ToUpstream(e, b) => {
                    assert!(!self.dead.contains(e), "write to a retired link {e}");
                    if b.starts_with(b"CONNECT ") {
                        handshakes.push(*e);
                        self.views.insert(
                            *e,
                            View {
                                dec: ClientDecoder::new(Limits::default()),
                                buf: BytesMut::new(),
                                subs: BTreeSet::new(),
                            },
                        );
                    }
                    if let Some(v) = self.views.get_mut(e) {
                        v.feed(b);
                    }
                }
                Action::ToClient(_) => {}
            }
        }
        if exact_replay {
            for e in handshakes {
                self.check_replay(e);
            }
        }
        let (backlog, held) = self.s.buffered();
        assert!(
            backlog <= MAX_BACKLOG + MAX_CHUNK + 512,
            "backlog {backlog}"
        );
        assert!(held <= MAX_HOLD + 512, "held {held}");
        actions
    }

    /// A new link has been told exactly the live subscriptions (its handshake's replay
    /// plus what the same step forwarded after it).
    fn check_replay(&self, e: Epoch) {
        let replayed = &self.views[&e].subs;
        let live: BTreeSet<_> = self
            .s
            .subscriptions()
            .iter_ordered()
            .into_iter()
            .map(|(sid, s)| (sid.clone(), s.subject.clone(), s.queue.clone()))
            .collect();
        assert_eq!(
            replayed, &live,
            "replay differs from the live subscriptions"
        );
    }

    fn link(&self, i: u8) -> Option<Epoch> {
        (!self.known.is_empty()).then(|| self.known[usize::from(i) % self.known.len()])
    }
}

fuzz_target!(|evs: Vec<Ev>| {
    let now = Instant::now();
    let cfg = SessionConfig {
        upstreams: vec!["127.0.0.1:4222".into(), "127.0.0.1:4223".into()],
        max_backlog: MAX_BACKLOG,
        max_hold_bytes: MAX_HOLD,
        max_dedup_entries: 64,
        ..SessionConfig::default()
    };
    let mut h = Harness {
        views: HashMap::new(),
        s: Session::new(cfg, now),
        now,
        known: Vec::new(),
        dead: HashSet::new(),
        closed: false,
        dials: VecDeque::new(),
    };
    h.drain(true);
    for ev in evs.into_iter().take(300) {
        if h.closed {
            break;
        }
        let now = h.now;
        let mut retired_probe = false;
        let exact = match ev {
            Ev::Client(op) => {
                if !h.s.wants_client_input() {
                    continue;
                }
                h.s.handle_client_bytes(&mut BytesMut::from(&client_bytes(&op)[..]), now);
                true
            }
            Ev::ClientRaw(bytes) => {
                if !h.s.wants_client_input() {
                    continue;
                }
                h.s.handle_client_bytes(&mut BytesMut::from(&sanitize(bytes)[..]), now);
                false
            }
            Ev::Up { link, op } => {
                let Some(e) = h.link(link) else { continue };
                let mut b = server_bytes(&op);
                if h.dead.contains(&e) {
                    // Whatever a retired link still says must not reach the client.
                    let sid =
                        h.s.subscriptions()
                            .iter_ordered()
                            .first()
                            .map(|(s, _)| (*s).clone());
                    if let Some(sid) = sid {
                        b = encode::msg(b"a", &sid, None, None, MARKER);
                        retired_probe = true;
                    }
                }
                h.s.handle_upstream_bytes(e, &mut BytesMut::from(&b[..]), now);
                true
            }
            Ev::UpRaw { link, bytes } => {
                let Some(e) = h.link(link) else { continue };
                h.s.handle_upstream_bytes(e, &mut BytesMut::from(&sanitize(bytes)[..]), now);
                false
            }
            Ev::Connected { link } => {
                let Some(e) = h.link(link) else { continue };
                h.s.handle_upstream_connected(e, now);
                true
            }
            Ev::Lost { link } => {
                let Some(e) = h.link(link) else { continue };
                h.s.handle_upstream_lost(e, now);
                h.dead.insert(e);
                true
            }
            Ev::Advance { ms } => {
                h.now += Duration::from_millis(u64::from(ms));
                h.s.handle_timeout(h.now);
                true
            }
            Ev::ClientClosed => {
                h.s.handle_client_closed();
                true
            }
        };
        let actions = h.drain(exact);
        for a in &actions {
            if let Action::ToClient(b) = a {
                assert!(
                    !b.windows(MARKER.len()).any(|w| w == MARKER),
                    "a retired link's message reached the client (probe {retired_probe})"
                );
            }
        }
    }
});
