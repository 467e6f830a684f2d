//! The operator's side, against the real tools: the alerting rules through `promtool`
//! (syntax and a unit test for every alert), and a real Prometheus scraping a real
//! proxy at a 1 s interval while a real cluster goes through a lame-duck migration and a
//! hard failover. Prometheus is then asked for every dashboard panel's query and every
//! rule's expression: each must evaluate, and each metric they name must have data.
//!
//! `prometheus` and `promtool` come from Debian's `prometheus` package (`.ci/setup`).

mod common;
use common::cluster::*;
use common::*;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;

const RULES: &str = "deploy/prometheus/natsproxy-rules.yaml";
const RULE_TESTS: &str = "deploy/prometheus/natsproxy-rules.test.yaml";
const DASHBOARD: &str = "deploy/grafana/natsproxy.json";

fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("{name} not found: `apt-get install prometheus` (or run .ci/setup)")
    })
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(repo_file("deploy/prometheus"))
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Every rule of the rule file: (alert or record name, expression).
fn rules() -> Vec<(String, serde_json::Value)> {
    let doc = &yaml_docs(&repo_file(RULES))[0];
    doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap();
            (name.to_string(), r)
        })
        .collect()
}

/// Every panel query of the dashboard: (panel title, expression).
fn panel_queries() -> Vec<(String, String)> {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file(DASHBOARD)).unwrap())
            .expect("the dashboard is JSON");
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap().to_string();
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The metric names (and recorded series) an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("natsproxy") {
        let s = i + at;
        let mut e = s;
        while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_' || b[e] == b':') {
            e += 1;
        }
        let before = s.checked_sub(1).map(|k| b[k]);
        // Not inside a label value or a string (`"natsproxy …"` in an annotation).
        if !matches!(before, Some(b'"') | Some(b'_') | Some(b'.')) {
            out.insert(expr[s..e].to_string());
        }
        i = e;
    }
    out
}

#[test]
fn rules_pass_promtool_check() {
    let out = promtool(&["check", "rules", "natsproxy-rules.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_has_a_unit_test_a_severity_and_a_runbook_in_the_docs() {
    let out = promtool(&["test", "rules", "natsproxy-rules.test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    let tests = std::fs::read_to_string(repo_file(RULE_TESTS)).unwrap();
    let runbooks = std::fs::read_to_string(repo_file("docs/operating.md")).unwrap();
    let headings: BTreeSet<String> = runbooks
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            // GitHub's anchor: lower case, spaces to dashes, most punctuation dropped.
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let mut alerts = 0;
    for (name, r) in rules() {
        if r["alert"].is_null() {
            continue;
        }
        alerts += 1;
        // Fires somewhere and stays quiet somewhere in the unit tests.
        let mentions = tests.matches(&format!("alertname: {name}\n")).count();
        assert!(mentions >= 2, "{name}: {mentions} alert_rule_test cases");
        assert!(
            matches!(
                r["labels"]["severity"].as_str(),
                Some("critical" | "warning")
            ),
            "{name}: severity"
        );
        let runbook = r["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        let anchor = runbook
            .strip_prefix("docs/operating.md#")
            .expect("docs/operating.md#…");
        assert!(
            headings.contains(anchor),
            "{name}: no heading in docs/operating.md for {runbook}"
        );
    }
    assert!(alerts >= 8, "{alerts} alerts");
}

#[test]
fn the_dashboard_is_templated_on_job_instance_and_pod() {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file(DASHBOARD)).unwrap()).unwrap();
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance", "pod"]);
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel ids unique");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(p["description"].as_str().is_some_and(|s| !s.is_empty()));
        for t in p["targets"].as_array().unwrap() {
            let e = t["expr"].as_str().unwrap();
            assert!(
                e.contains(r#"{job=~"$job", instance=~"$instance", pod=~"$pod"}"#),
                "{}: every selector is templated: {e}",
                p["title"]
            );
        }
    }
}

/// A Prometheus of its own: scrapes `target` every second, evaluates the rule file.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Prometheus {
    async fn start(target: std::net::SocketAddr) -> Prometheus {
        let dir = temp_dir("prometheus");
        let port = free_port();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [\"{}\"]\n\
             scrape_configs:\n  - job_name: natsproxy\n    static_configs:\n      - targets: [\"{target}\"]\n        labels: {{pod: natsproxy-test}}\n",
            repo_file(RULES).display()
        );
        std::fs::write(dir.0.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new(tool("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            port,
            _dir: dir,
        };
        within(Duration::from_secs(60), "Prometheus ready", async {
            while http_get(port, "/-/ready").await.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        p
    }

    /// An instant query: `(status, result)`.
    async fn query(&self, q: &str) -> (String, Vec<serde_json::Value>) {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let body = http_get(self.port, &path).await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let status = v["status"].as_str().unwrap_or("no answer").to_string();
        let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
        (status, result)
    }

    /// The value of a query that returns one sample.
    async fn value(&self, q: &str) -> Option<f64> {
        let (_, r) = self.query(q).await;
        r.first()?["value"][1].as_str()?.parse().ok()
    }

    async fn wait_value(&self, q: &str, want: f64, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            let v = self.value(q).await;
            if v == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{q}: Prometheus reads {v:?}, the test did {want}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What the dashboard's Grafana variables stand for when every value is chosen.
fn as_grafana_runs_it(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", ".*")
        .replace("$instance", ".*")
        .replace("$pod", ".*")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_reads_every_panel_and_rule_through_a_migration_and_a_failover() {
    init_logs();
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        jetstream: true,
        publisher_node: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let proxy = TestProxy::start_with(&cluster.urls(), |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let prom = Prometheus::start(proxy.metrics_addr.unwrap()).await;

    // One client, as Vector: a JetStream pull consumer (R3) and a core subscription.
    let admin =
        async_nats::jetstream::new(async_nats::connect(cluster.nodes[1].url()).await.unwrap());
    within(Duration::from_secs(30), "stream and consumer", async {
        loop {
            let s = admin
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "LOGS".into(),
                    subjects: vec!["logs.>".into()],
                    num_replicas: 3,
                    ..Default::default()
                })
                .await;
            if let Ok(s) = s {
                let c = s
                    .create_consumer(async_nats::jetstream::consumer::pull::Config {
                        durable_name: Some("CV".into()),
                        num_replicas: 3,
                        ..Default::default()
                    })
                    .await;
                if c.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let client = async_nats::ConnectOptions::new()
        .name("vector")
        .connect(proxy.url())
        .await
        .unwrap();
    let mut core = client.subscribe("events").await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    // Vector's loop (the kit's `vector`): batches of 200, ack
    // each, end at the first error item.
    let pull: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream("LOGS")
        .await
        .unwrap()
        .get_consumer("CV")
        .await
        .unwrap();
    let mut msgs = pull
        .stream()
        .max_messages_per_batch(200)
        .messages()
        .await
        .unwrap();
    let consumer = tokio::spawn(async move {
        while let Some(m) = msgs.next().await {
            match m {
                Ok(m) => {
                    let _ = m.ack().await;
                }
                Err(e) => return format!("{e:?}"),
            }
        }
        "the stream ended".to_string()
    });
    let core_reader = tokio::spawn(async move { while core.next().await.is_some() {} });
    let publisher_url = cluster.publisher.as_ref().unwrap().url();
    let publisher = tokio::spawn(async move {
        let c = async_nats::connect(publisher_url).await.unwrap();
        let js = async_nats::jetstream::new(c.clone());
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        loop {
            tick.tick().await;
            let _ = c.publish("events", "e".into()).await;
            let _ = js.publish("logs.x", "l".into()).await;
        }
    });
    roundtrip(&client, "ready.check").await;
    prom.wait_value("up", 1.0, Duration::from_secs(30)).await;

    // A lame-duck migration off the client's node, then a SIGKILL of the next one.
    let i = cluster
        .node_of_client("vector")
        .await
        .expect("client's node");
    cluster.lame_duck(i).unwrap();
    within(Duration::from_secs(30), "the migration", async {
        while proxy.stats.migrations.get() < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    cluster.wait_exit(i, Duration::from_secs(40)).await.unwrap();
    cluster.restart(i).await.unwrap();
    let j = within(Duration::from_secs(30), "the client's new node", async {
        loop {
            match cluster.node_of_client("vector").await {
                Some(j) if j != i => return j,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    cluster.kill(j);
    within(Duration::from_secs(30), "the failover", async {
        while proxy.stats.failovers.get() < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    roundtrip(&client, "after.failover").await;
    cluster.restart(j).await.unwrap();

    // What Prometheus read is what the test did.
    let (migrations, failovers) = (proxy.stats.migrations.get(), proxy.stats.failovers.get());
    assert_eq!((migrations, failovers), (1, 1), "one session, one of each");
    let d = Duration::from_secs(30);
    prom.wait_value("natsproxy_migrations_total", 1.0, d).await;
    prom.wait_value("natsproxy_failovers_total", 1.0, d).await;
    prom.wait_value(
        r#"natsproxy_migrations_by_reason_total{reason="ldm"}"#,
        1.0,
        d,
    )
    .await;
    prom.wait_value(
        r#"natsproxy_migrations_by_reason_total{reason="closed"}"#,
        1.0,
        d,
    )
    .await;
    prom.wait_value("natsproxy_outage_duration_seconds_count", 1.0, d)
        .await;
    prom.wait_value("natsproxy_sessions_without_upstream", 0.0, d)
        .await;
    // The failover fires its alert (no `for:`) in the real Prometheus.
    prom.wait_value(
        r#"count(ALERTS{alertname="NatsproxyFailovers", alertstate="firing"})"#,
        1.0,
        d,
    )
    .await;
    // Recording rules (15 s interval) have been evaluated.
    within(Duration::from_secs(40), "recorded series", async {
        while prom.query("natsproxy:messages:rate1m").await.1.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;

    let mut problems = Vec::new();
    let mut checked = 0;
    for (title, expr) in panel_queries() {
        let q = as_grafana_runs_it(&expr);
        let (status, result) = prom.query(&q).await;
        checked += 1;
        if status != "success" || result.is_empty() {
            problems.push(format!(
                "panel {title:?}: {status}, {} series: {q}",
                result.len()
            ));
        }
    }
    for (name, r) in rules() {
        let expr = r["expr"].as_str().unwrap();
        let (status, _) = prom.query(expr).await;
        checked += 1;
        if status != "success" {
            problems.push(format!("rule {name}: {status}: {expr}"));
        }
        // An alert's condition is empty while it is quiet; what it reads must not be.
        for m in metric_names(expr) {
            if prom.query(&m).await.1.is_empty() {
                problems.push(format!("rule {name}: no data for {m}"));
            }
        }
    }
    let shielded = prom
        .value(r#"sum(natsproxy_statuses_shielded_total)"#)
        .await
        .unwrap_or(-1.0);
    let reissued = prom
        .value("natsproxy_pull_requests_reissued_total")
        .await
        .unwrap_or(-1.0);
    let switch = prom
        .value(r#"natsproxy_migration_duration_seconds_sum{reason="ldm"}"#)
        .await
        .unwrap_or(-1.0);
    let outage = prom
        .value("natsproxy_outage_duration_seconds_sum")
        .await
        .unwrap_or(-1.0);
    println!(
        "Prometheus read back: migrations_total 1, failovers_total 1, by reason ldm 1 / closed 1, \
         lame-duck switch {:.1} ms, outage {:.1} ms, statuses shielded {shielded}, pulls re-issued {reissued}; \
         {checked} panel queries and rule expressions evaluated",
        switch * 1e3,
        outage * 1e3
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        !consumer.is_finished(),
        "the Vector loop ended: {:?}",
        consumer.await
    );
    publisher.abort();
    consumer.abort();
    core_reader.abort();
}

#[test]
fn metric_names_are_found_in_expressions() {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(natsproxy_rtt_bucket{job=~"natsproxy_x"}[5m]))) / natsproxy:a:b"#,
    );
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        ["natsproxy:a:b", "natsproxy_rtt_bucket"]
    );
}
