//! JetStream pull consumers of every official client library, each behind its own
//! natsproxy (as a sidecar), while a real cluster restarts or loses a node.
//!
//! The consumers live in `tests/clients/`: nats.go 1.22 (`Fetch` loop), cnats 3.4
//! (`natsSubscription_Fetch` loop), nats.js v3 and v2 (`consume()`), nats-py (`fetch`
//! loop), plus Vector's own loop on async-nats 0.42 in process. Each counts every
//! disconnect, reconnect and library error, and exits non-zero on any, or when a message
//! is missing. A publisher on a 4th node that never restarts sends numbered messages
//! (message id = number, retried until stored), so every loss counted is the proxy's.
//! All clients of a scenario run side by side. Set-up: `.ci/setup` installs Go, cnats,
//! the npm packages and nats-py.

mod common;
use common::cluster::{Cluster, ClusterOpts};
use common::*;

use async_nats::jetstream::{self, consumer::pull, consumer::push, stream};
use natsproxy_kit::vector;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const STREAM: &str = "LOGS";
/// The durable of [`spawn_reference`].
const REFERENCE: &str = "REF";

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn run_ok(cmd: &mut std::process::Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (run .ci/setup to install the client toolchains)"));
    assert!(
        out.status.success(),
        "{what} failed (run .ci/setup):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the Go and C consumers once per test binary; returns their paths.
fn binaries() -> &'static (PathBuf, PathBuf) {
    static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINS.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clients");
        std::fs::create_dir_all(&out).unwrap();
        let go = out.join("go-consumer");
        run_ok(
            std::process::Command::new("go")
                .args(["build", "-o"])
                .arg(&go)
                .arg("consumer.go")
                .current_dir(clients_dir().join("go"))
                .env("GO111MODULE", "off")
                .env("GOPATH", "/usr/share/gocode")
                .env("GOCACHE", out.join("gocache")),
            "go build",
        );
        let c = out.join("c-consumer");
        run_ok(
            std::process::Command::new("cc")
                // -g -rdynamic: a crash's backtrace (consumer.c) names functions.
                .args(["-O1", "-g", "-rdynamic", "-Wall", "-Werror", "-o"])
                .arg(&c)
                .arg(clients_dir().join("c/consumer.c"))
                .arg("-lnats"),
            "cc consumer.c -lnats",
        );
        assert!(
            clients_dir().join("js/node_modules/nats").is_dir()
                && clients_dir()
                    .join("js/node_modules/@nats-io/jetstream")
                    .is_dir(),
            "tests/clients/js/node_modules missing (run .ci/setup)"
        );
        (go, c)
    })
}

/// What a client program does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A pull consumer on `LOGS` with this durable.
    Pull(&'static str),
    /// A plain subscription on `core.v`.
    Core,
    /// nats-py's other JetStream patterns (push, queue, KV, object store; and ordered
    /// when `true`).
    Patterns(bool),
}

/// One client program.
struct Client {
    name: String,
    mode: Mode,
    argv: Vec<String>,
    /// Extra environment (`STALL_AT`, `STALL_SECS`: a blocked downstream).
    env: Vec<(&'static str, String)>,
}

impl Client {
    fn args(&self, url: &str, expect: u64, secs: u64) -> Vec<String> {
        let (expect, secs) = (expect.to_string(), secs.to_string());
        let tail: Vec<&str> = match self.mode {
            Mode::Pull(durable) => vec!["js", url, STREAM, durable, &expect, &secs],
            Mode::Core => vec!["core", url, CORE_SUBJECT, "-", &expect, &secs],
            Mode::Patterns(true) => vec![url, STREAM, &expect, &secs],
            Mode::Patterns(false) => vec![url, STREAM, &expect, &secs, "no-ordered"],
        };
        self.argv
            .iter()
            .cloned()
            .chain(tail.into_iter().map(str::to_owned))
            .collect()
    }
}

const CORE_SUBJECT: &str = "core.v";

/// The four libraries' programs (nats.go, cnats, nats.js v3 and v2) and nats-py's.
fn programs() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let (go, c) = binaries();
    let node = |flavour: &str| {
        vec![
            "node".into(),
            clients_dir().join("js/consumer.mjs").display().to_string(),
            flavour.into(),
        ]
    };
    let py = |file: &str| {
        vec![
            python().display().to_string(),
            clients_dir().join("py").join(file).display().to_string(),
        ]
    };
    vec![
        ("nats.go", "GO", vec![go.display().to_string()]),
        ("cnats", "C", vec![c.display().to_string()]),
        ("nats.js v3", "JS3", node("v3")),
        ("nats.js v2", "JS2", node("v2")),
        ("nats-py", "PY", py("consumer.py")),
    ]
}

/// Every library's pull consumer; with `core`, every library's core subscriber too; with
/// `patterns`, nats-py's other JetStream patterns (`Some(true)`: the ordered consumer
/// too).
fn external_clients(core: bool, patterns: Option<bool>) -> Vec<Client> {
    let mut out = Vec::new();
    for (name, durable, argv) in programs() {
        out.push(Client {
            name: name.into(),
            mode: Mode::Pull(durable),
            argv: argv.clone(),
            env: Vec::new(),
        });
        if core {
            out.push(Client {
                name: format!("{name} core"),
                mode: Mode::Core,
                argv,
                env: Vec::new(),
            });
        }
    }
    if let Some(ordered) = patterns {
        out.push(Client {
            name: "nats-py patterns".into(),
            mode: Mode::Patterns(ordered),
            argv: vec![
                python().display().to_string(),
                clients_dir().join("py/patterns.py").display().to_string(),
            ],
            env: Vec::new(),
        });
    }
    out
}

/// What one consumer reported.
#[derive(Debug, Default, Clone)]
struct Outcome {
    name: String,
    /// A JetStream consumer (its resume after an outage is measured).
    jetstream: bool,
    /// A pull consumer (its largest gap in a rolling restart is bounded).
    pull: bool,
    /// How many consumers of `LOGS` its counts add up (a stream copy of a message, see
    /// [`Finished::stream_copies`], reaches each once).
    consumers: u64,
    ok: bool,
    received: u64,
    dups: u64,
    errors: u64,
    disconnects: u64,
    max_gap_ms: u64,
    resume_unix_ms: u64,
    /// When it printed STALLED and RESUMED (a blocked downstream, see [`Client::env`]).
    stalled: Option<Instant>,
    resumed: Option<Instant>,
    stderr: String,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn parse_result(name: &str, line: &str) -> Outcome {
    let mut o = Outcome {
        name: name.into(),
        ..Default::default()
    };
    for kv in line.split_whitespace().skip(1) {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "received" => o.received = v,
            "dups" => o.dups = v,
            "errors" => o.errors = v,
            "disconnects" => o.disconnects = v,
            "max_gap_ms" => o.max_gap_ms = v,
            "resume_unix_ms" => o.resume_unix_ms = v,
            _ => {}
        }
    }
    o
}

/// Echoes a client program's stderr, each line tagged with `name`; ends with all of it.
fn collect_stderr(
    name: &str,
    stderr: tokio::process::ChildStderr,
) -> tokio::task::JoinHandle<String> {
    let name = name.to_owned();
    let mut lines = BufReader::new(stderr).lines();
    tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            eprintln!("[{name}] {l}");
            all += &l;
            all.push('\n');
        }
        all
    })
}

/// Starts `c` against `url`; resolves once it printed READY, to a task that ends with
/// its outcome.
async fn spawn_client(
    c: &Client,
    url: &str,
    expect: u64,
    secs: u64,
    probed: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Outcome> {
    let args = c.args(url, expect, secs);
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .current_dir(clients_dir().join("js"))
        .envs(c.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run .ci/setup)", c.name));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut errs = collect_stderr(&c.name, child.stderr.take().unwrap());
    within(
        Duration::from_secs(30),
        &format!("{} READY", c.name),
        async {
            loop {
                match stdout.next_line().await.unwrap() {
                    Some(l) if l == "READY" => return,
                    Some(_) => {}
                    None => panic!(
                        "{} exited before READY: {}",
                        c.name,
                        (&mut errs).await.unwrap()
                    ),
                }
            }
        },
    )
    .await;
    let name = c.name.to_string();
    let jetstream = c.mode != Mode::Core;
    let pull = matches!(c.mode, Mode::Pull(_));
    let consumers = match c.mode {
        Mode::Core => 0,
        Mode::Pull(_) => 1,
        Mode::Patterns(ordered) => 2 + u64::from(ordered),
    };
    tokio::spawn(async move {
        let mut result = String::new();
        let (mut stalled, mut resumed) = (None, None);
        while let Ok(Some(l)) = stdout.next_line().await {
            if l.starts_with("RESULT ") {
                result = l;
            } else if l == "PROBED" {
                probed.fetch_add(1, Ordering::Relaxed);
            } else if l == "STALLED" {
                stalled = Some(Instant::now());
            } else if l == "RESUMED" {
                resumed = Some(Instant::now());
            }
        }
        let status = child.wait().await.unwrap();
        let mut o = parse_result(&name, &result);
        (o.stalled, o.resumed) = (stalled, resumed);
        o.jetstream = jetstream;
        o.pull = pull;
        o.consumers = consumers;
        o.ok = status.success() && !result.is_empty();
        o.stderr = errs.await.unwrap_or_default();
        o
    })
}

/// Vector 0.51's loop on async-nats 0.42 (stop at the first `Err` item), as an outcome.
async fn spawn_vector(url: &str, expect: u64, secs: u64) -> tokio::task::JoinHandle<Outcome> {
    let changes = Arc::new(AtomicU64::new(0));
    let counter = changes.clone();
    let c = async_nats::ConnectOptions::new()
        .name("vector")
        .event_callback(move |ev| {
            let counter = counter.clone();
            async move {
                // Every reconnect follows a disconnect; the first Connected is the start.
                if matches!(ev, async_nats::Event::Disconnected) {
                    eprintln!("[async-nats] ERROR disconnected");
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .connect(url)
        .await
        .unwrap();
    let js = jetstream::new(c);
    let mut messages = vector::open(&js, STREAM, "AN").await.unwrap();
    tokio::spawn(async move {
        let mut o = Outcome {
            name: "async-nats (Vector loop)".into(),
            jetstream: true,
            pull: true,
            consumers: 1,
            ..Default::default()
        };
        let mut got = Receipts::new();
        let deadline = Instant::now() + Duration::from_secs(secs);
        let run = vector::run(&mut messages, |m| {
            if !got.record(&mut o, &m.payload) {
                o.dups += 1;
            }
            if got.seen.len() as u64 >= expect {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        let end = tokio::time::timeout_at(deadline.into(), run).await;
        if let Ok(vector::End::ErrItem(e)) = end {
            o.errors += 1;
            o.stderr = format!("Err item (Vector's source stops here): {e}");
        }
        o.received = got.seen.len() as u64;
        o.disconnects = changes.load(Ordering::Relaxed);
        o.ok = o.received >= expect && o.errors == 0 && o.disconnects == 0;
        o
    })
}

/// A pull consumer through no proxy, for comparison: a `fetch` loop on the publisher node
/// (it never restarts, so nothing of the client's connection moves), each request
/// expiring after 300 ms. A request lost with its consumer leader costs it 5.3 s all the
/// same: async-nats ends a fetch the server never answers 5 s after its expiry. Its
/// 409s and timeouts are the server's; they are not counted.
async fn spawn_reference(url: String, expect: u64, secs: u64) -> tokio::task::JoinHandle<Outcome> {
    use futures::StreamExt;
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    tokio::spawn(async move {
        let mut o = Outcome {
            name: "direct reference".into(),
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut got = Receipts::new();
        while (got.seen.len() as u64) < expect && Instant::now() < deadline {
            let consumer: Result<jetstream::consumer::PullConsumer, _> =
                async { js.get_stream(STREAM).await?.get_consumer(REFERENCE).await }
                    .await
                    .map_err(|e: Box<dyn std::error::Error + Send + Sync>| e);
            let Ok(consumer) = consumer else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            while (got.seen.len() as u64) < expect && Instant::now() < deadline {
                let batch = consumer
                    .fetch()
                    .max_messages(200)
                    .expires(Duration::from_millis(300))
                    .messages()
                    .await;
                let Ok(mut batch) = batch else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                while let Some(Ok(m)) = batch.next().await {
                    got.record(&mut o, &m.payload);
                    let _ = m.ack().await;
                }
            }
        }
        o.received = got.seen.len() as u64;
        o
    })
}

/// The longest a pull consumer may have messages to deliver and no request of its
/// client's at the server, in a rolling restart (issue 16: 0.5 s), for every client.
/// Measured 2026-12-06 in 7 runs (4 on 2.15.1, 3 on 2.9.10): at most 0.22 s. Before
/// 45d658a one run in 14 showed 0.51 s for nats-py, right after two redeliveries the
/// proxy hid; 45d658a closed the one way found for a hidden redelivery to leave a
/// request unserved (it took the request's last credit).
const STARVED_BOUND: Duration = Duration::from_millis(500);

/// How often [`spawn_consumer_watch`] asks for each consumer's state.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The cluster's side of a pull consumer's gaps: `CONSUMER.INFO` of each durable every
/// [`WATCH_EVERY`], from the publisher node (it never restarts, no proxy between).
/// "Starved": the consumer answers (it has a leader), has messages to deliver
/// (`num_pending` > 0), delivered nothing since the last sample and has no request
/// waiting (`num_waiting` = 0): the client gets nothing because no request of its is at
/// the server, one lost and not placed again (the proxy's business) or the client
/// between two of its own. A gap without a starved stretch is the cluster's: no leader,
/// nothing yet for the consumer to deliver (its replica behind), or a request held and
/// not served. (A `Fetch` loop catching up on a backlog has no request waiting at most
/// samples, one-shot requests being served at once: its deliveries tell it apart.)
/// A durable stops counting once its client is done (`done`): it has every message and
/// asks for no more, while the consumer's new leader may still count some as pending
/// (seen: 2.9.10, 800 ms after the last restart, two clients done 14 s before).
/// Ends when `stop` is set, with the longest starved stretch of each durable (first to
/// last starved sample, plus one interval) and when it ended.
fn spawn_consumer_watch(
    url: String,
    durables: Vec<(String, Arc<std::sync::atomic::AtomicBool>)>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(String, Duration, u64)>> {
    tokio::spawn(async move {
        let js = jetstream::new(async_nats::connect(url).await.unwrap());
        let mut consumers: Vec<Option<jetstream::consumer::PullConsumer>> =
            durables.iter().map(|_| None).collect();
        let mut since: Vec<Option<Instant>> = vec![None; durables.len()];
        let mut delivered = vec![0u64; durables.len()];
        let mut longest = vec![(Duration::ZERO, 0u64); durables.len()];
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            for (i, (d, done)) in durables.iter().enumerate() {
                if done.load(Ordering::Relaxed) {
                    since[i] = None;
                    continue;
                }
                if consumers[i].is_none() {
                    consumers[i] =
                        async { js.get_stream(STREAM).await.ok()?.get_consumer(d).await.ok() }
                            .await;
                }
                let Some(c) = consumers[i].as_mut() else {
                    continue;
                };
                let info = tokio::time::timeout(WATCH_EVERY * 2, c.info()).await;
                let starved = match &info {
                    Ok(Ok(c)) => {
                        let idle = c.delivered.consumer_sequence == delivered[i];
                        delivered[i] = c.delivered.consumer_sequence;
                        idle && c.num_pending > 0 && c.num_waiting == 0
                    }
                    _ => false,
                };
                let now = Instant::now();
                since[i] = if starved {
                    Some(since[i].unwrap_or(now))
                } else {
                    None
                };
                if let Some(first) = since[i] {
                    let stretch = now - first + WATCH_EVERY;
                    if stretch > longest[i].0 {
                        longest[i] = (stretch, unix_ms());
                    }
                }
            }
        }
        durables
            .into_iter()
            .zip(longest)
            .map(|((d, _), (l, at))| (d, l, at))
            .collect()
    })
}

/// What an in-process consumer has received: the message numbers seen, and when the
/// last one came, for the largest gap of its [`Outcome`].
struct Receipts {
    seen: std::collections::HashSet<u64>,
    last: Instant,
}

impl Receipts {
    fn new() -> Self {
        Receipts {
            seen: Default::default(),
            last: Instant::now(),
        }
    }

    /// Records one message's payload (its number); false if that number came before.
    fn record(&mut self, o: &mut Outcome, payload: &[u8]) -> bool {
        let gap = self.last.elapsed().as_millis() as u64;
        if gap > o.max_gap_ms {
            o.max_gap_ms = gap;
            o.resume_unix_ms = unix_ms();
        }
        self.last = Instant::now();
        let n = std::str::from_utf8(payload)
            .unwrap_or("")
            .parse()
            .unwrap_or(0);
        self.seen.insert(n)
    }
}

async fn setup(cluster: &Cluster, replicas: usize, place_on: Option<&str>, durables: &[&str]) {
    let c = async_nats::connect(cluster.nodes[1].url()).await.unwrap();
    let js = jetstream::new(c);
    let placement = place_on.map(|n| stream::Placement {
        cluster: None,
        tags: vec![format!("node:{n}")],
    });
    within(Duration::from_secs(30), "stream and consumers", async {
        'again: loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(s) = js
                .create_stream(stream::Config {
                    name: STREAM.into(),
                    subjects: vec!["logs.>".into()],
                    num_replicas: replicas,
                    placement: placement.clone(),
                    ..Default::default()
                })
                .await
            else {
                continue;
            };
            for d in durables {
                let made = s
                    .create_consumer(pull::Config {
                        durable_name: Some((*d).into()),
                        ack_wait: Duration::from_secs(10),
                        num_replicas: replicas,
                        ..Default::default()
                    })
                    .await;
                if made.is_err() {
                    continue 'again;
                }
            }
            return;
        }
    })
    .await;
}

/// Publishes 1..=n at about `per_sec`, each retried until stored; `stored` counts them.
/// Returns the largest time between two stored messages: a stream leader change stalls
/// the publisher too, and what a consumer sees beyond it is the proxy's.
///
/// An unacked publish is retried after `PUBLISH_RETRY` (the message id makes a retry
/// of a stored message a no-op): with async-nats' 2 s wait, a publish lost in a leader
/// change put a 2 s gap in front of every consumer.
fn spawn_publisher(
    url: String,
    n: u64,
    per_sec: u64,
    stored: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Duration> {
    const PUBLISH_RETRY: Duration = Duration::from_millis(250);
    tokio::spawn(async move {
        let js = jetstream::new(async_nats::connect(url).await.unwrap());
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
        let mut last: Option<Instant> = None;
        let mut max_gap = Duration::ZERO;
        for i in 1..=n {
            tick.tick().await;
            loop {
                let p = jetstream::context::Publish::build()
                    .payload(i.to_string().into())
                    .message_id(i.to_string());
                let sent = tokio::time::timeout(PUBLISH_RETRY, async {
                    js.send_publish("logs.v", p).await.ok()?.await.ok()
                })
                .await;
                if matches!(sent, Ok(Some(_))) {
                    stored.store(i, Ordering::Relaxed);
                    let now = Instant::now();
                    if let Some(l) = last {
                        max_gap = max_gap.max(now - l);
                    }
                    last = Some(now);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        max_gap
    })
}

struct Run {
    cluster: Cluster,
    proxies: Vec<TestProxy>,
    tasks: Vec<tokio::task::JoinHandle<Outcome>>,
    /// Core subscribers, and how many of them saw a probe.
    core: (u64, Arc<AtomicU64>),
    /// Each pull client's name, durable, and whether the client is done.
    durables: Vec<(String, String, Arc<std::sync::atomic::AtomicBool>)>,
    /// The consumer watch, if started ([`Run::watch_consumers`]), and its stop flag.
    watch: Option<Watch>,
}

type Watch = (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<Vec<(String, Duration, u64)>>,
);

impl Run {
    /// Starts watching every pull client's consumer (see [`spawn_consumer_watch`]) until
    /// the clients are done.
    fn watch_consumers(&mut self) {
        let url = self.cluster.publisher.as_ref().unwrap().url();
        let durables = self
            .durables
            .iter()
            .map(|(_, d, done)| (d.clone(), done.clone()))
            .collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.watch = Some((stop.clone(), spawn_consumer_watch(url, durables, stop)));
    }
}

/// Cluster, stream, one proxy per client, every client READY.
async fn start(
    clients: Vec<Client>,
    replicas: usize,
    place_on: Option<&str>,
    expect: u64,
    secs: u64,
) -> Run {
    init_logs();
    // NATSPROXY_CLIENTS=a,b runs only the clients whose names contain a or b (the Vector
    // loop is "async-nats"): to chase one client's failure without the others' load.
    let only: Option<Vec<String>> = std::env::var("NATSPROXY_CLIENTS")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|w| name.contains(w.as_str())))
    };
    let clients: Vec<Client> = clients.into_iter().filter(|c| wanted(&c.name)).collect();
    let cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        jetstream: true,
        publisher_node: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut durables: Vec<&str> = clients
        .iter()
        .filter_map(|c| match c.mode {
            Mode::Pull(d) => Some(d),
            _ => None,
        })
        .collect();
    durables.push("AN");
    durables.push(REFERENCE);
    setup(&cluster, replicas, place_on, &durables).await;
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    let mut pull_durables = Vec::new();
    // A client's task, with a flag set when it ends.
    let flagged = |t: tokio::task::JoinHandle<Outcome>| {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let t = tokio::spawn(async move {
            let o = t.await.unwrap();
            flag.store(true, Ordering::Relaxed);
            o
        });
        (t, done)
    };
    let probed = Arc::new(AtomicU64::new(0));
    for c in &clients {
        let p = TestProxy::start(&cluster.urls()).await;
        let (t, done) = flagged(spawn_client(c, &p.url(), expect, secs, probed.clone()).await);
        tasks.push(t);
        if let Mode::Pull(d) = c.mode {
            pull_durables.push((c.name.clone(), d.to_owned(), done));
        }
        proxies.push(p);
    }
    if wanted("async-nats (Vector loop)") {
        let p = TestProxy::start(&cluster.urls()).await;
        let (t, done) = flagged(spawn_vector(&p.url(), expect, secs).await);
        tasks.push(t);
        pull_durables.push(("async-nats (Vector loop)".into(), "AN".into(), done));
        proxies.push(p);
    }
    let cores = clients.iter().filter(|c| c.mode == Mode::Core).count() as u64;
    Run {
        cluster,
        proxies,
        tasks,
        core: (cores, probed),
        durables: pull_durables,
        watch: None,
    }
}

/// Core messages 1..=n at `per_sec` from the publisher node, once every core subscriber
/// saw a probe (its interest reached that node).
async fn spawn_core_publisher(run: &Run, n: u64, per_sec: u64) -> tokio::task::JoinHandle<()> {
    let url = run.cluster.publisher.as_ref().unwrap().url();
    let c = async_nats::connect(url).await.unwrap();
    let (cores, probed) = (run.core.0, run.core.1.clone());
    within(
        Duration::from_secs(30),
        "core subscribers' interest",
        async {
            while probed.load(Ordering::Relaxed) < cores {
                c.publish(CORE_SUBJECT, "p".into()).await.unwrap();
                c.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
        for i in 1..=n {
            tick.tick().await;
            c.publish(CORE_SUBJECT, i.to_string().into()).await.unwrap();
        }
        c.flush().await.unwrap();
    })
}

/// What the clients reported, and how many messages beyond the published ones the
/// stream holds.
struct Finished {
    outcomes: Vec<Outcome>,
    /// The stream's extra copies of a published number: a publish whose ack was lost in
    /// a leader change is retried, and nats-server 2.9's new stream leader does not
    /// always know the first copy's message id (seen: 1 in 3,000). Each consumer then
    /// gets both copies, under two stream sequences; that is not the proxy's doing.
    stream_copies: u64,
    /// Each watched pull client's longest starved stretch (see [`spawn_consumer_watch`])
    /// and when it ended (unix ms).
    starved: Vec<(String, Duration, u64)>,
}

async fn finish(run: Run, published: u64, healthy_unix_ms: Option<u64>) -> Finished {
    let mut outcomes = Vec::new();
    for t in run.tasks {
        outcomes.push(t.await.unwrap());
    }
    let mut starved = Vec::new();
    if let Some((stop, watch)) = run.watch {
        stop.store(true, Ordering::Relaxed);
        for (durable, longest, at) in watch.await.unwrap() {
            let name = run
                .durables
                .iter()
                .find(|(_, d, _)| *d == durable)
                .unwrap()
                .0
                .clone();
            eprintln!(
                "{name:<26} longest starved stretch {} ms, ended unix ms {at}",
                longest.as_millis()
            );
            starved.push((name, longest, at));
        }
    }
    let url = run.cluster.publisher.as_ref().unwrap().url();
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    let stored = within(Duration::from_secs(30), "stream info", async {
        loop {
            if let Ok(mut s) = js.get_stream(STREAM).await {
                if let Ok(i) = s.info().await {
                    return i.state.messages;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let stream_copies = stored.saturating_sub(published);
    eprintln!(
        "server {}; stream holds {stored} messages for {published} published",
        server_version()
    );
    for o in &outcomes {
        let resume =
            healthy_unix_ms.map_or(format!(" gap_ended_unix_ms={}", o.resume_unix_ms), |h| {
                format!(
                    " resume_after_healthy={}ms",
                    o.resume_unix_ms as i64 - h as i64
                )
            });
        eprintln!(
            "{:<26} received={} dups={} errors={} disconnects={} max_gap={}ms{resume}",
            o.name, o.received, o.dups, o.errors, o.disconnects, o.max_gap_ms
        );
    }
    for p in run.proxies {
        p.stop().await;
    }
    drop(run.cluster);
    Finished {
        outcomes,
        stream_copies,
        starved,
    }
}

fn assert_clean(f: &Finished, expect: u64) {
    let bad: Vec<String> = f
        .outcomes
        .iter()
        .filter(|o| {
            // dups: a redelivery of an acked message is acked again by the proxy; only
            // the stream's own extra copies may reach a consumer twice.
            let copies = o.consumers * f.stream_copies;
            !o.ok || o.received < expect || o.errors > 0 || o.disconnects > 0 || o.dups > copies
        })
        .map(|o| format!("{o:?}"))
        .collect();
    assert!(bad.is_empty(), "clients that noticed:\n{}", bad.join("\n"));
}

/// R3 stream and consumers; every node in turn: lame duck, exit, restart, healthy.
/// Pull consumers and core subscribers of every library, and nats-py's push, queue,
/// ordered, KV and object-store patterns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_through_a_rolling_lame_duck_restart_r3() {
    const N: u64 = 3000;
    let mut run = start(external_clients(true, Some(true)), 3, None, N, 180).await;
    run.watch_consumers();
    let url = run.cluster.publisher.as_ref().unwrap().url();
    let reference = spawn_reference(url.clone(), N, 180).await;
    let publisher = spawn_publisher(url, N, 150, Arc::default());
    let core = spawn_core_publisher(&run, N, 150).await;
    for i in 0..3 {
        eprintln!("n{} lame duck at unix ms {}", i + 1, unix_ms());
        run.cluster.lame_duck(i).unwrap();
        run.cluster
            .wait_exit(i, Duration::from_secs(40))
            .await
            .unwrap();
        eprintln!("n{} exited at unix ms {}", i + 1, unix_ms());
        run.cluster.restart(i).await.unwrap();
        eprintln!("n{} healthy at unix ms {}", i + 1, unix_ms());
    }
    let publisher_gap = within(Duration::from_secs(120), "publisher", publisher)
        .await
        .unwrap();
    within(Duration::from_secs(60), "core publisher", core)
        .await
        .unwrap();
    eprintln!("publisher's largest gap between stored messages: {publisher_gap:?}");
    let reference = within(Duration::from_secs(120), "direct reference", reference)
        .await
        .unwrap();
    eprintln!(
        "direct reference on the publisher node: received={} max_gap={}ms gap_ended_unix_ms={}",
        reference.received, reference.max_gap_ms, reference.resume_unix_ms
    );
    let finished = finish(run, N, None).await;
    assert_clean(&finished, N);
    // Issue 16: no pull client waits more than 0.5 s for a request the proxy lost. A
    // client's largest gap also holds the cluster's own stalls, which no proxy shortens
    // (seen: three consumers' last message 1.56 s late, all three in the same
    // millisecond, their consumers answering `404 No Messages` meanwhile; nats-py's 2.3 s
    // on 2.15.1 while its consumer's leader held its requests, heartbeats flowing, and
    // delivered nothing). So the gaps are printed, and
    // what is asserted is the time each consumer had a leader and messages to deliver
    // but no request of its client's at the server: a request lost with its leader and
    // not yet placed again.
    let gaps: Vec<String> = finished
        .outcomes
        .iter()
        .filter(|o| o.pull)
        .map(|o| format!("{} {} ms", o.name, o.max_gap_ms))
        .collect();
    eprintln!("largest pull gaps: {}", gaps.join(", "));
    let starved: Vec<String> = finished
        .starved
        .iter()
        .filter(|(_, longest, _)| *longest > STARVED_BOUND)
        .map(|(name, longest, at)| {
            format!(
                "{name}: {} ms (bound {STARVED_BOUND:?}), ended unix ms {at}",
                longest.as_millis()
            )
        })
        .collect();
    assert_eq!(
        finished.starved.len(),
        finished.outcomes.iter().filter(|o| o.pull).count()
    );
    assert!(
        starved.is_empty(),
        "pull consumers with messages and no request at the server for too long:\n{}",
        starved.join("\n")
    );
}

/// R1 stream and consumers on n1; n1 goes lame duck and stays away 40 s. Every client
/// keeps its connection and gets no error meanwhile, and resumes within 1 s of n1 being
/// healthy again: every library's pull consumer, and nats-py's R1 push and queue
/// consumers (not its ordered one: see `tests/clients/py/patterns.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_through_a_40s_outage_of_its_r1_consumer() {
    const N: u64 = 1500;
    let mut run = start(external_clients(false, Some(false)), 1, Some("n1"), N, 180).await;
    let stored = Arc::new(AtomicU64::new(0));
    let url = run.cluster.publisher.as_ref().unwrap().url();
    let publisher = spawn_publisher(url, N, 100, stored.clone());
    // Some traffic first, then the outage.
    within(Duration::from_secs(30), "first messages stored", async {
        while stored.load(Ordering::Relaxed) < 300 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    run.cluster.lame_duck(0).unwrap();
    run.cluster
        .wait_exit(0, Duration::from_secs(40))
        .await
        .unwrap();
    let away = Instant::now();
    tokio::time::sleep(Duration::from_secs(40).saturating_sub(away.elapsed())).await;
    let healthy = run.cluster.restart(0).await.unwrap();
    let healthy = healthy.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    within(Duration::from_secs(120), "publisher", publisher)
        .await
        .unwrap();
    let finished = finish(run, N, Some(healthy)).await;
    assert_clean(&finished, N);
    for o in finished.outcomes.iter().filter(|o| o.jetstream) {
        let after = o.resume_unix_ms as i64 - healthy as i64;
        // Vector's loop and nats.js keep a request waiting: within 1 s of /healthz (the
        // issue's bound). A Fetch(MaxWait 1s) loop (nats.go, cnats, nats-py) asks anew
        // each second, and on 2.9 a request to an absent consumer gets no answer at all,
        // so it may need one more of its own rounds (measured 528-856 ms on 2.9.10).
        let bound = if o.name.starts_with("async-nats") || o.name.starts_with("nats.js") {
            1000
        } else {
            2000
        };
        assert!(
            after <= bound,
            "{} resumed {after} ms after the node was healthy (bound {bound} ms)",
            o.name
        );
    }
}

/// The delivered consumer sequence of `consumer` in node `i`'s own replica (`/jsz`).
async fn replica_delivered(cluster: &Cluster, i: usize, consumer: &str) -> Option<u64> {
    fn find(v: &serde_json::Value, name: &str) -> Option<u64> {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("name").and_then(|n| n.as_str()) == Some(name) {
                    if let Some(d) = o.get("delivered") {
                        return d.get("consumer_seq")?.as_u64();
                    }
                }
                o.values().find_map(|v| find(v, name))
            }
            serde_json::Value::Array(a) => a.iter().find_map(|v| find(v, name)),
            _ => None,
        }
    }
    let body = http_get(
        cluster.nodes[i].http,
        "/jsz?accounts=true&streams=true&consumers=true",
    )
    .await?;
    find(&serde_json::from_str(&body).ok()?, consumer)
}

/// nats-py's push consumer with idle heartbeats; the ack of its first message dies with
/// the consumer leader (frozen, the ack queued in a route to it, then killed), so the
/// next leader sends the message again. The proxy acks it again and keeps it from the
/// client. On 2.10 and later the replicas know the delivery and it is a redelivery with
/// the next consumer sequence: the heartbeats that follow name it as the server's last,
/// nats-py would report a ConsumerSequenceMismatchError for each (seen in CI in the
/// rolling restart above), and the proxy amends them. 2.9.10's replicas do not show
/// the delivery (their `/jsz` says 0): its next leader redelivers (seen), or may send
/// the same first delivery again, whose heartbeats name the client's own last. Either
/// way: no error, no disconnect, each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_py_push_consumer_through_a_redelivery_of_what_it_acked() {
    use tokio::io::AsyncWriteExt;
    init_logs();
    let replicas_track_deliveries = !server_version().starts_with("2.9.");
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        jetstream: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let js = jetstream::new(async_nats::connect(cluster.nodes[0].url()).await.unwrap());
    let mut consumer = within(Duration::from_secs(30), "stream and push consumer", async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(s) = js
                .create_stream(stream::Config {
                    name: "HB".into(),
                    subjects: vec!["hb.>".into()],
                    num_replicas: 3,
                    ..Default::default()
                })
                .await
            else {
                continue;
            };
            let made = s
                .create_consumer(push::Config {
                    durable_name: Some("HB".into()),
                    deliver_subject: "dlv.hb".into(),
                    ack_wait: Duration::from_secs(2),
                    idle_heartbeat: Duration::from_millis(500),
                    num_replicas: 3,
                    ..Default::default()
                })
                .await;
            if let Ok(c) = made {
                return c;
            }
        }
    })
    .await;
    let leader = within(Duration::from_secs(30), "consumer leader", async {
        loop {
            if let Ok(i) = consumer.info().await {
                if let Some(l) = i.cluster.as_ref().and_then(|c| c.leader.clone()) {
                    return l;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let l = cluster.nodes.iter().position(|n| n.name == leader).unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    // The proxy's link goes to a node that stays.
    let urls: Vec<String> = others.iter().map(|&i| cluster.nodes[i].url()).collect();
    let proxy = TestProxy::start(&urls).await;
    let mut child = Command::new(python())
        .arg(clients_dir().join("py/redelivery.py"))
        .args([&proxy.url(), "HB", "HB", "hb.>"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python (run .ci/setup)");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = collect_stderr("nats-py redelivery", child.stderr.take().unwrap());
    let mut expect_line = async |what: &str| -> String {
        within(Duration::from_secs(30), what, async {
            match out.next_line().await.unwrap() {
                Some(l) if l.starts_with(what) => l,
                Some(l) => panic!("expected {what}, got {l:?}"),
                None => panic!("redelivery.py exited before {what}"),
            }
        })
        .await
    };
    expect_line("READY").await;
    let publisher = jetstream::new(
        async_nats::connect(cluster.nodes[others[0]].url())
            .await
            .unwrap(),
    );
    // Retried: after the kill, the stream may be electing a leader.
    let publish = async |n: &str| {
        within(Duration::from_secs(30), "publish", async {
            loop {
                if let Ok(ack) = publisher.publish("hb.v", n.to_owned().into()).await {
                    if ack.await.is_ok() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    };
    publish("1").await;
    assert_eq!(expect_line("GOT").await, "GOT 1 1 1");
    if replicas_track_deliveries {
        within(Duration::from_secs(10), "delivery replicated", async {
            for &i in &others {
                while replica_delivered(&cluster, i, "HB").await != Some(1) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
        .await;
    }
    cluster.stop(l).unwrap();
    stdin.write_all(b"ack\n").await.unwrap();
    expect_line("ACKED").await;
    cluster.kill(l);
    within(
        Duration::from_secs(30),
        "message 1 sent again and acked again",
        async {
            while proxy.stats.redeliveries_acked.get() == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    // Three heartbeats reach the client (each one a message to it).
    let sent = proxy.stats.hot.msgs_to_client.get();
    within(Duration::from_secs(10), "heartbeats", async {
        while proxy.stats.hot.msgs_to_client.get() < sent + 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A redelivery (the next consumer sequence) has every heartbeat after it amended; a
    // re-send (2.9.10, when its next leader did not know of the delivery) none.
    let amended = proxy.stats.heartbeats_amended.get();
    let redelivered = replicas_track_deliveries || amended > 0;
    if redelivered {
        assert!(amended >= 3, "{amended} heartbeats amended");
    }
    // A new message reaches the client, with the consumer sequence after the one sent
    // again.
    publish("2").await;
    let next = if redelivered { 3 } else { 2 };
    assert_eq!(expect_line("GOT").await, format!("GOT 2 1 {next}"));
    stdin.write_all(b"ack\n").await.unwrap();
    expect_line("ACKED").await;
    stdin.write_all(b"end\n").await.unwrap();
    let result = expect_line("RESULT").await;
    let stderr = stderr.await.unwrap();
    assert_eq!(
        result, "RESULT got=2 errors=0 disconnects=0",
        "nats-py noticed:\n{stderr}"
    );
    assert!(child.wait().await.unwrap().success());
    proxy.stop().await;
}

/// One look at a proxy's client watch: `/livez/client`'s status and body, and the
/// `natsproxy_client_consumer_*` gauges of its (only) consumer.
#[derive(Debug, Clone)]
struct WatchSample {
    at: Instant,
    livez: u16,
    body: String,
    pull_age: Option<f64>,
    idle: Option<f64>,
    unacked: Option<f64>,
}

/// The value of the first sample of `family` (any labels) in a `/metrics` body.
fn gauge(body: &str, family: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Samples the client watch of the proxy whose metrics listen on `metrics` every 500 ms
/// until `stop`.
fn spawn_watch_sampler(
    metrics: std::net::SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<WatchSample>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let (livez, body) = http_status(metrics, "/livez/client")
                .await
                .unwrap_or((0, "no answer".into()));
            let m = http_status(metrics, "/metrics").await.unwrap_or_default().1;
            out.push(WatchSample {
                at: Instant::now(),
                livez,
                body,
                pull_age: gauge(&m, "natsproxy_client_consumer_pull_age_seconds"),
                idle: gauge(&m, "natsproxy_client_consumer_idle_seconds"),
                unacked: gauge(&m, "natsproxy_client_consumer_unacked"),
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        out
    })
}

/// Vector's loop on async-nats 0.42 with a sink that blocks: the `at`-th message's send
/// waits `stall` before its ack (Vector acks once the event is handed on).
async fn spawn_blocked_vector(
    url: &str,
    expect: u64,
    at: u64,
    stall: Duration,
) -> tokio::task::JoinHandle<Outcome> {
    use futures::StreamExt;
    let c = async_nats::ConnectOptions::new()
        .name("vector")
        .connect(url)
        .await
        .unwrap();
    let js = jetstream::new(c);
    let mut messages = vector::open(&js, STREAM, "AN").await.unwrap();
    tokio::spawn(async move {
        let mut o = Outcome {
            name: "async-nats (Vector loop)".into(),
            jetstream: true,
            pull: true,
            consumers: 1,
            ..Default::default()
        };
        let mut got = Receipts::new();
        while let Some(item) = messages.next().await {
            let m = match item {
                Ok(m) => m,
                Err(e) => {
                    o.errors += 1;
                    o.stderr = format!("Err item (Vector's source stops here): {e}");
                    break;
                }
            };
            if !got.record(&mut o, &m.payload) {
                o.dups += 1;
            }
            if got.seen.len() as u64 == at && o.stalled.is_none() {
                o.stalled = Some(Instant::now());
                tokio::time::sleep(stall).await;
                o.resumed = Some(Instant::now());
            }
            let _ = m.ack().await;
            if got.seen.len() as u64 >= expect {
                break;
            }
        }
        o.received = got.seen.len() as u64;
        o.ok = o.received >= expect && o.errors == 0;
        o
    })
}

/// Issue 34, item 2: what each library sends while its downstream blocks, and that the
/// proxy calls it slow, not stopped. Every library's pull consumer (and Vector's loop)
/// behind its own proxy (`--client-stall-after` 4 s); the 20th message's handling blocks
/// for 3 x the bound before its ack while the publisher goes on. `/livez/client` stays
/// 200 throughout, the client holds a delivery unacked throughout its stall, and it gets
/// every message afterwards. Prints, per library, the pull requests it sent during the
/// stall and the gauges. `NATSPROXY_STALL_SECS=300` measures a 5-minute stall the same
/// way (ack_wait 30 s: redeliveries then come too, and are counted, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_whose_downstream_blocks_is_slow_not_stopped() {
    const BOUND: Duration = Duration::from_secs(4);
    const AT: u64 = 20;
    const PER_SEC: u64 = 20;
    init_logs();
    let stall_secs: u64 = std::env::var("NATSPROXY_STALL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3 * BOUND.as_secs());
    let stall = Duration::from_secs(stall_secs);
    let n = PER_SEC * (stall_secs + 15);
    let server = NatsServer::start(ServerOpts {
        jetstream: true,
        ..Default::default()
    })
    .await;
    let clients: Vec<Client> = programs()
        .into_iter()
        .map(|(name, durable, argv)| Client {
            name: name.into(),
            mode: Mode::Pull(durable),
            argv,
            env: vec![
                ("STALL_AT", AT.to_string()),
                ("STALL_SECS", stall_secs.to_string()),
            ],
        })
        .collect();
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let s = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["logs.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    for d in clients
        .iter()
        .filter_map(|c| match c.mode {
            Mode::Pull(d) => Some(d),
            _ => None,
        })
        .chain(["AN"])
    {
        s.create_consumer(pull::Config {
            durable_name: Some(d.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let secs = stall_secs + 90;
    let (mut proxies, mut tasks, mut samplers) = (Vec::new(), Vec::new(), Vec::new());
    let upstream = [server.url()];
    let watched = || {
        TestProxy::start_with(&upstream, |c| {
            c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
            c.client_stall_after = BOUND;
        })
    };
    for c in &clients {
        let p = watched().await;
        samplers.push(spawn_watch_sampler(p.metrics_addr.unwrap(), stop.clone()));
        tasks.push(spawn_client(c, &p.url(), n, secs, Arc::default()).await);
        proxies.push(p);
    }
    let p = watched().await;
    samplers.push(spawn_watch_sampler(p.metrics_addr.unwrap(), stop.clone()));
    tasks.push(spawn_blocked_vector(&p.url(), n, AT, stall).await);
    proxies.push(p);
    let publisher = spawn_publisher(server.url(), n, PER_SEC, Arc::default());
    let mut outcomes = Vec::new();
    for t in tasks {
        let limit = Duration::from_secs(secs + 30);
        outcomes.push(within(limit, "a stalled client", t).await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    within(Duration::from_secs(30), "publisher", publisher)
        .await
        .unwrap();
    let mut failures = Vec::new();
    for (o, sampler) in outcomes.iter().zip(samplers) {
        let samples = within(Duration::from_secs(10), "a watch sampler", sampler)
            .await
            .unwrap();
        let (Some(from), Some(to)) = (o.stalled, o.resumed) else {
            failures.push(format!("{}: never stalled: {o:?}", o.name));
            continue;
        };
        let during: Vec<&WatchSample> = samples
            .iter()
            .filter(|s| s.at > from + Duration::from_secs(1) && s.at < to)
            .collect();
        // A pull request sent shows as the pull age going down between two samples.
        let pulls = during
            .windows(2)
            .filter(|w| matches!((w[0].pull_age, w[1].pull_age), (Some(a), Some(b)) if b < a))
            .count();
        let max = |f: fn(&WatchSample) -> Option<f64>| {
            during.iter().filter_map(|s| f(s)).fold(0.0, f64::max)
        };
        let min_unacked = during
            .iter()
            .map(|s| s.unacked.unwrap_or(0.0))
            .fold(f64::INFINITY, f64::min);
        let slow = during.iter().filter(|s| s.body.contains("slow")).count();
        eprintln!(
            "{}: downstream blocked {:.1} s: {pulls} pull request(s) sent meanwhile, \
             pull age up to {:.1} s, idle up to {:.1} s, unacked {min_unacked}-{}; \
             /livez/client 200 in {} of {} samples ({slow} saying slow); \
             received {} of {n}, {} dup(s), {} error(s), {} disconnect(s)",
            o.name,
            (to - from).as_secs_f64(),
            max(|s| s.pull_age),
            max(|s| s.idle),
            max(|s| s.unacked),
            samples.iter().filter(|s| s.livez == 200).count(),
            samples.len(),
            o.received,
            o.dups,
            o.errors,
            o.disconnects,
        );
        let bad: Vec<_> = samples.iter().filter(|s| s.livez != 200).collect();
        if !bad.is_empty() {
            failures.push(format!("{}: /livez/client not 200: {bad:?}", o.name));
        }
        if during.len() < 4 || min_unacked < 1.0 {
            failures.push(format!(
                "{}: not holding a delivery throughout its stall: {during:?}",
                o.name
            ));
        }
        // nats.js' consume() sends no new pull while it is not iterated, and its
        // heartbeat monitor then reports `heartbeats_missed` (2 x 2.5 s after the last
        // request expired): seen straight to nats-server as well, the library's own
        // report of a stalled iterator. That status is allowed here, nothing else.
        let library_reports = o.stderr.lines().filter(|l| l.contains("heartbeats_missed"));
        let errors_not_reports = o.errors - (library_reports.count() as u64).min(o.errors);
        let clean = o.received >= n && errors_not_reports == 0 && o.disconnects == 0;
        if !clean || (stall < Duration::from_secs(30) && o.dups > 0) {
            failures.push(format!("{}: {o:?}", o.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
