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
