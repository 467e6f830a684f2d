//! The session tests' harness: a session with a fake clock, and readers of its actions.

use super::*;

pub(super) struct H {
    pub s: Session,
    pub now: Instant,
}

impl H {
    pub(super) fn new() -> H {
        // Dials at the lame duck at once; `migration_spread` has its own test.
        H::with(SessionConfig {
            migration_spread: Duration::ZERO,
            ..SessionConfig::default()
        })
    }
    pub(super) fn with(cfg: SessionConfig) -> H {
        let now = Instant::now();
        H {
            s: Session::new(cfg, now),
            now,
        }
    }
    /// The first link up: its dial, `info` from the server, the client's `connect` (and
    /// whatever follows it), the handshake PONGs.
    pub(super) fn up(mut self, info: &[u8], connect: &[u8]) -> H {
        self.actions();
        self.s.handle_upstream_connected(Epoch(1), self.now);
        self.upstream(1, info);
        self.client(connect);
        self.upstream(1, b"PONG\r\nPONG\r\n");
        self
    }
    pub(super) fn actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.s.poll_action()).collect()
    }
    pub(super) fn client(&mut self, b: &[u8]) -> Vec<Action> {
        let mut buf = BytesMut::from(b);
        self.s.handle_client_bytes(&mut buf, self.now);
        self.actions()
    }
    pub(super) fn upstream(&mut self, e: u64, b: &[u8]) -> Vec<Action> {
        let mut buf = BytesMut::from(b);
        self.s.handle_upstream_bytes(Epoch(e), &mut buf, self.now);
        self.actions()
    }
    /// Dial, connect, INFO, client CONNECT, handshake PONG.
    pub(super) fn connected() -> H {
        H::connected_with(H::new())
    }
    /// [`H::connected`], from `h`.
    pub(super) fn connected_with(mut h: H) -> H {
        assert!(matches!(
            h.actions()[..],
            [Action::Dial {
                epoch: Epoch(1),
                ..
            }]
        ));
        h.s.handle_upstream_connected(Epoch(1), h.now);
        let a = h.upstream(1, b"INFO {\"server_id\":\"S\",\"server_name\":\"n1\",\"max_payload\":2048,\"connect_urls\":[\"x:1\"]} \r\n");
        assert!(matches!(&a[..], [Action::ToClient(_)]));
        let a =
            h.client(b"CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\n");
        assert_eq!(a.len(), 1, "{a:?}");
        h.upstream(1, b"PONG\r\nPONG\r\n");
        h
    }
}

pub(super) fn to_client(a: &[Action]) -> Vec<u8> {
    a.iter()
        .filter_map(|a| match a {
            Action::ToClient(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

pub(super) fn to_upstream(a: &[Action]) -> Vec<u8> {
    a.iter()
        .filter_map(|a| match a {
            Action::ToUpstream(_, b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

pub(super) fn dial_of(a: &[Action]) -> Option<(Epoch, String)> {
    a.iter().find_map(|a| match a {
        Action::Dial { epoch, addr } => Some((*epoch, addr.clone())),
        _ => None,
    })
}

pub(super) const INFO_B: &[u8] =
    b"INFO {\"server_id\":\"B\",\"server_name\":\"n2\",\"max_payload\":2048} \r\n";

/// Lame duck on A, B up and switched to; returns with A retiring (Draining).
pub(super) fn switched_to_b(subs: &[u8]) -> H {
    let mut h = H::connected();
    h.client(subs);
    let a = h.upstream(
        1,
        b"INFO {\"server_id\":\"S\",\"connect_urls\":[\"x:1\"],\"ldm\":true} \r\n",
    );
    let (e2, _) = dial_of(&a).expect("dial");
    h.s.handle_upstream_connected(e2, h.now);
    h.upstream(2, INFO_B);
    h.upstream(2, b"PONG\r\nPONG\r\n");
    h.upstream(1, b"PONG\r\n");
    assert_eq!(h.s.upstream_addr(), Some("x:1"));
    h
}

/// Migrated from A to B and A retired, B behind: A delivered m1 and m2, B only m1 so
/// far (its copy of m2 is still on its way). The overlap lingers.
pub(super) fn migrated_with_b_behind() -> H {
    let mut h = switched_to_b(b"SUB foo 1\r\n");
    h.upstream(1, b"MSG foo 1 2\r\nm1\r\nMSG foo 1 2\r\nm2\r\n");
    // B's copy of m1 proves its interest: A's UNSUBs go once the settle delay is up.
    h.upstream(2, b"MSG foo 1 2\r\nm1\r\n");
    while !unsub_sent(&h.actions()) {
        h.now = h.s.poll_timeout().unwrap();
        h.s.handle_timeout(h.now);
    }
    let a = h.upstream(1, b"PONG\r\n");
    assert!(a.contains(&Action::CloseUpstream(Epoch(1))), "{a:?}");
    assert_eq!(to_client(&a), b"");
    h
}

pub(super) fn unsub_sent(a: &[Action]) -> bool {
    String::from_utf8(to_upstream(a)).unwrap().contains("UNSUB")
}
