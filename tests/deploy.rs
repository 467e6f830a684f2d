//! deploy/ is checked here: every file parses, the Vector configuration everywhere is the
//! one the tests use, the NATS snippet is accepted by nats-server, the systemd unit
//! verifies, the Dockerfile's build stage builds the binary from exactly what it copies.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn toml_json(text: &str) -> serde_json::Value {
    let v: toml::Value = toml::from_str(text).expect("valid TOML");
    serde_json::to_value(v).unwrap()
}

fn vector_config() -> serde_json::Value {
    toml_json(&std::fs::read_to_string(repo("deploy/vector/vector.toml")).unwrap())
}

#[test]
fn vector_config_points_at_the_proxy() {
    let v = vector_config();
    let src = &v["sources"]["nats_logs"];
    assert_eq!(src["type"], "nats");
    assert_eq!(
        src["url"],
        format!("nats://{}", natsproxy::config::DEFAULT_LISTEN)
    );
    assert!(src["jetstream"]["stream"].is_string() && src["jetstream"]["consumer"].is_string());
}

#[test]
fn kubernetes_and_helm_files_embed_the_same_vector_config() {
    let vector = vector_config();
    let helm = &yaml_docs(&repo("deploy/helm/vector-values.yaml"))[0];
    assert_eq!(
        helm["customConfig"]["sources"], vector["sources"],
        "helm values differ from deploy/vector/vector.toml"
    );
    let k8s = yaml_docs(&repo("deploy/kubernetes/vector-with-natsproxy.yaml"));
    let cm = k8s
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("ConfigMap");
    assert_eq!(
        toml_json(cm["data"]["vector.toml"].as_str().unwrap()),
        vector,
        "ConfigMap differs from deploy/vector/vector.toml"
    );
    let dep = k8s
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    let vector_container = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "vector")
        .expect("Vector is the main container");
    // Issue 34: Kubernetes restarts Vector when natsproxy says its pipeline stopped.
    for (what, probe) in [
        ("Deployment", &vector_container["livenessProbe"]),
        ("Helm values", &helm["livenessProbe"]),
    ] {
        assert_eq!(probe["httpGet"]["path"], "/livez/client", "{what}");
        assert_eq!(
            probe["httpGet"]["port"], 9464,
            "{what}: natsproxy's metrics port"
        );
        let (period, failures) = (
            probe["periodSeconds"].as_u64(),
            probe["failureThreshold"].as_u64(),
        );
        assert_eq!(
            (period, failures),
            (Some(10), Some(3)),
            "{what}: the 90 s of docs/operating.md"
        );
    }
    let sidecars = [
        pod["initContainers"]
            .as_array()
            .expect("natsproxy as a native sidecar (an init container)")
            .iter()
            .find(|c| c["name"] == "natsproxy")
            .expect("natsproxy init container")
            .clone(),
        helm["initContainers"][0].clone(),
    ];
    for np in &sidecars {
        // Native sidecar: restarted like a container, started (ready) before Vector,
        // stopped after it.
        assert_eq!(np["restartPolicy"], "Always");
        assert_eq!(np["startupProbe"]["httpGet"]["path"], "/readyz");
        let args: Vec<&str> = np["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--metrics-listen=0.0.0.0:9464"), "{args:?}");
        assert!(args.contains(&"--listen=127.0.0.1:4222"), "{args:?}");
        assert_eq!(np["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(np["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(np["securityContext"]["runAsNonRoot"], true);
        assert!(np["resources"]["requests"]["memory"].is_string());
        // The flags are the binary's own: check-config accepts them.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_natsproxy"));
        cmd.arg("check-config")
            .args(&args)
            .env_remove("NATSPROXY_UPSTREAM");
        for e in np["env"].as_array().unwrap() {
            cmd.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn nats_lame_duck_snippet_is_accepted_by_nats_server() {
    let dir = temp_dir("deploy");
    let snippet = std::fs::read_to_string(repo("deploy/nats/lame-duck.conf")).unwrap();
    let pid = dir.0.join("nats.pid");
    let conf = snippet.replace("/var/run/nats/nats.pid", pid.to_str().unwrap())
        + &format!("listen: \"127.0.0.1:{}\"\n", free_port());
    let path = dir.0.join("server.conf");
    std::fs::write(&path, conf).unwrap();
    let out = Command::new(server_bin())
        .arg("-c")
        .arg(&path)
        .arg("-t")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nats-server -t: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn systemd_unit_and_its_config_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_natsproxy"))
        .args(["check-config", "--config"])
        .arg(repo("deploy/systemd/natsproxy.toml"))
        .env_remove("NATSPROXY_UPSTREAM")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit = std::fs::read_to_string(repo("deploy/systemd/natsproxy.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/natsproxy --config /etc/natsproxy/natsproxy.toml")
    );
    let Ok(sa) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("systemd-analyze not installed: unit checked for its ExecStart only");
        return;
    };
    assert!(sa.status.success());
    let dir = temp_dir("unit");
    let path = dir.0.join("natsproxy.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/natsproxy", env!("CARGO_BIN_EXE_natsproxy")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Outside a booted systemd the only complaints allowed are about the environment.
    let real: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("natsproxy.service"))
        .filter(|l| !l.contains("vector.service"))
        .collect();
    assert!(
        out.status.success() && real.is_empty(),
        "systemd-analyze verify:\n{err}"
    );
}

#[test]
fn dockerfile_builds_this_crates_binary_non_root() {
    let d = std::fs::read_to_string(repo("deploy/Dockerfile")).unwrap();
    let froms: Vec<&str> = d.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    assert!(
        froms[1].contains("distroless") && froms[1].contains("nonroot"),
        "{froms:?}"
    );
    assert!(d.contains("USER nonroot"));
    assert!(d.contains("cargo build --release --locked"));
    assert!(
        d.contains("target/release/natsproxy")
            && d.contains(r#"ENTRYPOINT ["/usr/local/bin/natsproxy"]"#)
    );
}

/// The build stage of deploy/Dockerfile, minus the base image (no Docker engine on these
/// machines): exactly the files its COPY lines name, staged into an otherwise empty
/// directory, and its own RUN command run there.
#[test]
fn dockerfile_build_stage_builds_from_exactly_what_it_copies() {
    let d = std::fs::read_to_string(repo("deploy/Dockerfile")).unwrap();
    let stage: Vec<&str> = d
        .split("\nFROM ")
        .nth(1)
        .expect("a build stage")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    // Stage dir inside target/ so that dependencies stay compiled between runs.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docker-build-stage");
    for name in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if name.file_name() != "target" {
            let p = name.path();
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
    }
    std::fs::create_dir_all(&dir).unwrap();
    let mut copied = Vec::new();
    for l in stage.iter().filter(|l| l.starts_with("COPY ")) {
        let words: Vec<&str> = l.split_whitespace().skip(1).collect();
        let (dest, srcs) = words.split_last().unwrap();
        for src in srcs {
            let to = if dest.ends_with('/') {
                dir.join(dest).join(Path::new(src).file_name().unwrap())
            } else {
                dir.join(dest)
            };
            let status = Command::new("cp")
                .args(["-r"])
                .arg(repo(src))
                .arg(&to)
                .status()
                .unwrap();
            assert!(status.success(), "COPY {src} {dest}");
            copied.push(src.to_string());
        }
    }
    // The RUN line, continuation lines joined.
    let run = stage
        .join("\n")
        .split("\nRUN ")
        .nth(1)
        .expect("a RUN line in the build stage")
        .split("\n")
        .scan(true, |more, l| {
            let take = *more;
            *more = l.trim_end().ends_with('\\');
            take.then(|| l.trim_end().trim_end_matches('\\').to_string())
        })
        .collect::<Vec<_>>()
        .join(" ");
    assert!(run.contains("cargo build --release --locked"), "{run}");
    let out = Command::new("sh")
        .args(["-c", &run])
        .current_dir(&dir)
        .env_remove("CARGO_TARGET_DIR")
        .env("CARGO_TERM_COLOR", "never")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Dockerfile's build (`{run}`) fails with only {copied:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = dir.join("target/release/natsproxy");
    let size = std::fs::metadata(&bin)
        .expect("the binary the image copies")
        .len();
    eprintln!(
        "image binary (stripped, no demo): {} bytes ({:.1} MiB)",
        size,
        size as f64 / 1048576.0
    );
    assert!(size < 16 << 20, "binary is {size} bytes");
    let help = Command::new(&bin).arg("--help").output().unwrap();
    assert!(help.status.success());
    let demo = Command::new(&bin).arg("demo").output().unwrap();
    assert!(
        !demo.status.success() && String::from_utf8_lossy(&demo.stderr).contains("without"),
        "built without the demo"
    );
}

/// Where the system's Python refuses `pip install` (PEP 668), `.ci/setup` puts nats-py,
/// PyYAML and nats-server 2.15 in a virtual environment. Forced here
/// (`NATSPROXY_FORCE_VENV`) into a scratch directory: the rest of the script finds its
/// other packages installed already and changes nothing.
#[test]
fn setup_script_falls_back_to_a_virtual_environment() {
    let dir = temp_dir("venv");
    let venv = dir.0.join("venv");
    let out = Command::new("bash")
        .arg(repo(".ci/setup"))
        .env("NATSPROXY_FORCE_VENV", "1")
        .env("NATSPROXY_VENV", &venv)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py = venv.join("bin/python3");
    assert!(
        stdout.contains(&format!("python: {}", py.display())),
        "{stdout}"
    );
    let imports = Command::new(&py)
        .args([
            "-c",
            "import nats, yaml; print(nats.__name__, yaml.__name__)",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&imports.stdout).trim(), "nats yaml");
    let server = Command::new(venv.join("bin/nats-server"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&server.stdout);
    assert!(v.contains("v2.15") || v.contains("v2.16"), "{v}");
}

#[test]
fn prometheus_operator_objects_scrape_the_sidecar_and_carry_the_rule_file() {
    let docs = yaml_docs(&repo("deploy/kubernetes/natsproxy-monitoring.yaml"));
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("{k}"))
    };
    let pm = kind("PodMonitor");
    let rule = kind("PrometheusRule");
    for d in [pm, rule] {
        assert_eq!(d["apiVersion"], "monitoring.coreos.com/v1");
        assert!(d["metadata"]["name"].is_string());
    }
    // The PodMonitor selects the Deployment's pods and scrapes the sidecar's port.
    let app = yaml_docs(&repo("deploy/kubernetes/vector-with-natsproxy.yaml"));
    let dep = app.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"],
        dep["spec"]["selector"]["matchLabels"]
    );
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    let sidecar = dep["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "natsproxy")
        .unwrap();
    assert!(
        sidecar["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == endpoint["port"]),
        "the sidecar exposes the port the PodMonitor scrapes"
    );
    assert_eq!(endpoint["path"], "/metrics");
    // The PrometheusRule is the rule file that promtool tests.
    let file = &yaml_docs(&repo("deploy/prometheus/natsproxy-rules.yaml"))[0];
    assert_eq!(rule["spec"]["groups"], file["groups"]);
}
