//! The differential test: every input of `tests/corpus/protocol.txt` (carried over from
//! nats-server's own parser and protocol tests, plus the control-line edges) goes to a
//! real nats-server and through natsproxy, sent whole, one byte at a time and in 4
//! pieces, and the answers must be the same bytes with the same close.
//!
//! What may differ is normalized, and only what is in [`NORMALIZED`]. Each input runs on
//! its own connection; the runs are spread over a few server + proxy pairs (two runs on
//! one server at once would see each other's messages). A healthy single node must cost
//! each proxied connection exactly one upstream dial, whatever the input.

mod common;
use common::*;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The accepted differences, each with its reason. Nothing else is normalized.
const NORMALIZED: &[(&str, &str)] = &[
    (
        "INFO lines: their JSON becomes `INFO` (or `INFO connect_info` for the INFO after \
         the first PONG)",
        "server_id, ports, nonce and client id differ by design: the proxy's INFO is \
         derived from its upstream's (its fields are tested in the session tests)",
    ),
    (
        "`PING` lines from the server are dropped",
        "the server's first keepalive PING comes ~2 s after CONNECT, at a time of its \
         choosing; the proxy answers upstream PINGs itself",
    ),
    (
        "a run of identical `-ERR 'Invalid Publish Subject'` lines counts as one",
        "nats-server parses a PUB's arguments again when its payload comes in a later read \
         (clonePubArg), and a pedantic client is told twice; how the bytes are split into \
         reads is up to the network",
    ),
    (
        "for inputs named `~queue`, the sid of each `MSG` line becomes `*`",
        "which member of a queue group gets a message is the server's random choice",
    ),
];

/// How the input is written.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Whole,
    Bytewise,
    Pieces4,
}

const MODES: [Mode; 3] = [Mode::Whole, Mode::Bytewise, Mode::Pieces4];

/// Server and proxy pairs running side by side.
const WORKERS: usize = 6;

/// Quiet time after which an answer is complete (no close, no awaited PONG).
const QUIET: Duration = Duration::from_millis(400);

struct Entry {
    name: String,
    input: Vec<u8>,
    queue: bool,
}

fn macro_text(name: &str) -> Option<&'static str> {
    Some(match name {
        "quiet" => "CONNECT {\"verbose\":false,\"pedantic\":false}\r\n",
        "verbose" => "CONNECT {\"verbose\":true,\"pedantic\":false}\r\n",
        "pedantic" => "CONNECT {\"verbose\":false,\"pedantic\":true}\r\n",
        "hdrs" => "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n",
        "proto1" => "CONNECT {\"verbose\":false,\"pedantic\":false,\"protocol\":1}\r\n",
        _ => return None,
    })
}

/// Expands the corpus escapes: `\r \n \t \\ \xNN`, `{N*text}`, `{macro}`.
fn expand(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if i + 1 < b.len() => {
                let (byte, used) = match b[i + 1] {
                    b'r' => (b'\r', 2),
                    b'n' => (b'\n', 2),
                    b't' => (b'\t', 2),
                    b'\\' => (b'\\', 2),
                    b'x' => (u8::from_str_radix(&s[i + 2..i + 4], 16).unwrap(), 4),
                    c => panic!("unknown escape \\{} in {s:?}", c as char),
                };
                out.push(byte);
                i += used;
            }
            b'{' => {
                let close = s[i..].find('}').map(|k| i + k);
                let inner = close.map(|c| &s[i + 1..c]);
                if let Some(text) = inner.and_then(macro_text) {
                    out.extend_from_slice(text.as_bytes());
                    i = close.unwrap() + 1;
                } else if let Some((n, text)) = inner
                    .and_then(|t| t.split_once('*'))
                    .and_then(|(n, t)| Some((n.parse::<usize>().ok()?, t)))
                {
                    let one = expand(text);
                    for _ in 0..n {
                        out.extend_from_slice(&one);
                    }
                    i = close.unwrap() + 1;
                } else {
                    out.push(b'{');
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn corpus() -> Vec<Entry> {
    let text = include_str!("corpus/protocol.txt");
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, input) = l.split_once('\t').unwrap_or_else(|| panic!("no tab: {l}"));
            Entry {
                name: name.to_owned(),
                input: expand(input),
                queue: name.ends_with("~queue"),
            }
        })
        .collect()
}

fn pieces(input: &[u8], mode: Mode) -> Vec<&[u8]> {
    match mode {
        Mode::Whole => vec![input],
        Mode::Bytewise => input.chunks(1).collect(),
        Mode::Pieces4 => {
            let n = input.len().div_ceil(4).max(1);
            input.chunks(n).collect()
        }
    }
}

/// Connects, reads the INFO line, writes `input` as `mode` says while reading, and
/// returns what came back after the INFO and whether the peer closed.
async fn exchange(addr: SocketAddr, input: &[u8], mode: Mode) -> (Vec<u8>, bool) {
    let (stream, pending) = raw::RawClient::connect(addr).await.into_parts();
    stream.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let out = Arc::new(Mutex::new(pending));
    let closed = Arc::new(AtomicBool::new(false));
    let wants_pong = input.ends_with(b"PING\r\n") || input.ends_with(b"PING\n");
    // Reads all the time, so that the answer is in hand before a reset could drop it.
    let reader = {
        let (out, closed) = (out.clone(), closed.clone());
        tokio::spawn(async move {
            let mut b = vec![0u8; 16 * 1024];
            loop {
                match rd.read(&mut b).await {
                    Ok(0) | Err(_) => break closed.store(true, Ordering::SeqCst),
                    Ok(n) => out.lock().unwrap().extend_from_slice(&b[..n]),
                }
            }
        })
    };
    for p in pieces(input, mode) {
        if closed.load(Ordering::SeqCst) || wr.write_all(p).await.is_err() {
            break;
        }
        if !matches!(mode, Mode::Whole) {
            tokio::task::yield_now().await;
        }
    }
    // Complete: closed; or the awaited PONG came and nothing followed for a moment; or
    // nothing came for QUIET.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut seen = 0;
    let mut quiet_since = tokio::time::Instant::now();
    while tokio::time::Instant::now() < deadline && !closed.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now_len = out.lock().unwrap().len();
        if now_len != seen {
            seen = now_len;
            quiet_since = tokio::time::Instant::now();
            continue;
        }
        let done_pong = wants_pong && normalize(&out.lock().unwrap(), false).ends_with(b"PONG\r\n");
        let quiet = quiet_since.elapsed();
        if (done_pong && quiet >= Duration::from_millis(30)) || quiet >= QUIET {
            break;
        }
    }
    reader.abort();
    let out = out.lock().unwrap().clone();
    (out, closed.load(Ordering::SeqCst))
}

/// Applies [`NORMALIZED`].
fn normalize(out: &[u8], queue: bool) -> Vec<u8> {
    let mut res = Vec::with_capacity(out.len());
    let mut rest = out;
    while !rest.is_empty() {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(rest.len(), |p| p + 2);
        let (line, tail) = rest.split_at(end);
        rest = tail;
        if line == b"PING\r\n" {
            continue;
        }
        const PEDANTIC_PUB: &[u8] = b"-ERR 'Invalid Publish Subject'\r\n";
        if line == PEDANTIC_PUB && res.ends_with(PEDANTIC_PUB) {
            continue;
        }
        if line.starts_with(b"INFO ") && line.ends_with(b"\r\n") {
            let ci = line.windows(19).any(|w| w == b"\"connect_info\":true");
            res.extend_from_slice(if ci {
                b"INFO connect_info\r\n"
            } else {
                b"INFO\r\n"
            });
            continue;
        }
        if queue && line.starts_with(b"MSG ") {
            let text = String::from_utf8_lossy(line);
            let mut f: Vec<&str> = text.split(' ').collect();
            if f.len() >= 4 {
                f[2] = "*";
            }
            res.extend_from_slice(f.join(" ").as_bytes());
            continue;
        }
        res.extend_from_slice(line);
    }
    res
}

struct Pair {
    server: NatsServer,
    proxy: TestProxy,
    /// The server's monitoring port.
    http: u16,
}

impl Pair {
    /// Waits until the server has no client connection left: a run's subscriptions (a
    /// queue member, say) must be gone before the next run starts.
    async fn wait_idle(&self) {
        within(
            Duration::from_secs(10),
            "the server to drop the run's connections",
            async {
                loop {
                    let varz = common::http_get(self.http, "/varz")
                        .await
                        .unwrap_or_default();
                    if varz.contains("\"connections\": 0,") {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
        )
        .await;
    }
}

#[derive(Default)]
struct Tally {
    runs: usize,
    identical: usize,
    differences: Vec<String>,
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 300 {
        format!("{:?}…({} bytes)", &s[..300], s.len())
    } else {
        format!("{s:?}")
    }
}

async fn work(pair: &Pair, entries: &[&Entry], tally: &Mutex<Tally>) -> usize {
    let mut proxied = 0;
    for e in entries {
        for mode in MODES {
            let direct = exchange(pair.server.addr(), &e.input, mode).await;
            pair.wait_idle().await;
            let through = exchange(pair.proxy.addr, &e.input, mode).await;
            pair.wait_idle().await;
            proxied += 1;
            let d = (normalize(&direct.0, e.queue), direct.1);
            let p = (normalize(&through.0, e.queue), through.1);
            let mut t = tally.lock().unwrap();
            t.runs += 1;
            if d == p {
                t.identical += 1;
            } else {
                t.differences.push(format!(
                    "{} ({mode:?}):\n  nats-server: {} closed={}\n  natsproxy:   {} closed={}",
                    e.name,
                    show(&d.0),
                    d.1,
                    show(&p.0),
                    p.1
                ));
            }
        }
    }
    proxied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_input_gets_the_servers_bytes_and_close() {
    init_logs();
    let entries = corpus();
    assert!(entries.len() >= 150, "corpus of {} inputs", entries.len());
    let mut pairs = Vec::new();
    for _ in 0..WORKERS {
        let http = free_port();
        let server = NatsServer::start(ServerOpts {
            max_payload: Some(1024),
            extra: format!("http: \"127.0.0.1:{http}\"\n"),
            ..Default::default()
        })
        .await;
        let proxy = TestProxy::start(&[server.url()]).await;
        pairs.push(Pair {
            server,
            proxy,
            http,
        });
    }
    let tally = Mutex::new(Tally::default());
    let shares: Vec<Vec<&Entry>> = (0..WORKERS)
        .map(|w| entries.iter().skip(w).step_by(WORKERS).collect())
        .collect();
    let proxied = within(
        Duration::from_secs(600),
        "the differential runs",
        futures::future::join_all(
            pairs
                .iter()
                .zip(&shares)
                .map(|(p, share)| work(p, share, &tally)),
        ),
    )
    .await;
    // One dial per proxied connection: no input makes the proxy dial again.
    for (pair, runs) in pairs.iter().zip(&proxied) {
        let dials = pair.proxy.stats.upstream_connects.get()
            + pair.proxy.stats.upstream_dial_failures.get();
        assert_eq!(dials, *runs as u64, "upstream dials for {runs} connections");
    }
    let t = tally.into_inner().unwrap();
    println!(
        "differential: {} inputs, {} runs, {} identical to nats-server {} after normalizing:",
        entries.len(),
        t.runs,
        t.identical,
        server_version()
    );
    for (what, why) in NORMALIZED {
        println!("  - {what}: {why}");
    }
    assert!(
        t.differences.is_empty(),
        "{} of {} runs differ:\n{}",
        t.differences.len(),
        t.runs,
        t.differences.join("\n")
    );
}
