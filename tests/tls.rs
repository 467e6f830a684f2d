//! TLS toward upstream nodes against a real nats-server, with certificates made at test
//! time (rcgen): verification on by default, a wrong CA refused, the loudly named
//! insecure switch, mutual TLS, `handshake_first` servers, and CA/certificate files
//! re-read when they change without dropping open connections.

mod common;
use common::*;

use natsproxy::config::{Config, UpstreamTls};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const T: Duration = Duration::from_secs(10);

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn new_ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A leaf certificate signed by `ca`, as (cert PEM, key PEM).
fn leaf(ca: &Ca, usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.distinguished_name
        .push(DnType::CommonName, "natsproxy test");
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

struct Pki {
    dir: TempDir,
    ca: Ca,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: temp_dir("tls"),
            ca: new_ca("natsproxy test CA"),
        }
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    /// A `tls { }` block for nats-server.
    fn server_block(&self, extra: &str) -> String {
        let (cert, key) = leaf(&self.ca, ExtendedKeyUsagePurpose::ServerAuth);
        let c = self.write("server.pem", &cert);
        let k = self.write("server.key", &key);
        let ca = self.write("server-ca.pem", &self.ca.cert.pem());
        format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", timeout: 2 {extra} }}\n",
            c.display(),
            k.display(),
            ca.display()
        )
    }
}

async fn tls_server(pki: &Pki, extra: &str) -> NatsServer {
    NatsServer::start(ServerOpts {
        extra: pki.server_block(extra),
        ready_on_listen: extra.contains("handshake_first"),
        ..Default::default()
    })
    .await
}

async fn proxy(url: String, tls: UpstreamTls) -> TestProxy {
    TestProxy::start_with(&[url], move |c: &mut Config| {
        c.upstream_tls = tls;
        c.connect_timeout = Duration::from_secs(2);
    })
    .await
}

/// A client of a proxy whose upstream cannot be reached: it never gets an INFO, and is
/// closed (at start-up the proxy tries each node once; the client's own retry takes over).
async fn refused_client(p: &TestProxy) {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let mut got = Vec::new();
    within(T, "the proxy to close the client", s.read_to_end(&mut got))
        .await
        .unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("INFO"), "{got}");
    assert!(p.stats.upstream_dial_failures.get() >= 1);
}

#[tokio::test]
async fn verified_tls_upstream_and_a_wrong_ca_refused() {
    init_logs();
    let pki = Pki::new();
    let server = tls_server(&pki, "").await;
    let ca = pki.write("ca.pem", &pki.ca.cert.pem());
    let tls = UpstreamTls {
        ca: Some(ca.clone()),
        ..Default::default()
    };
    // tls:// with the right CA; the client itself speaks cleartext to the proxy.
    let p = proxy(format!("tls://127.0.0.1:{}", server.port), tls.clone()).await;
    let c = async_nats::connect(p.url()).await.unwrap();
    assert!(
        !c.server_info().tls_required,
        "the client must not start TLS"
    );
    roundtrip(&c, "tls.ok").await;
    // nats:// to a server that asks for TLS: TLS anyway.
    let p2 = proxy(server.url(), tls).await;
    let c2 = async_nats::connect(p2.url()).await.unwrap();
    roundtrip(&c2, "tls.asked").await;

    // Another CA: the certificate is refused, the client gets nothing.
    let other = pki.write("other-ca.pem", &new_ca("someone else").cert.pem());
    let bad = proxy(
        format!("tls://127.0.0.1:{}", server.port),
        UpstreamTls {
            ca: Some(other.clone()),
            ..Default::default()
        },
    )
    .await;
    refused_client(&bad).await;
    assert_eq!(bad.stats.upstream_connects.get(), 0);
    // The same CA with verification switched off: connects.
    let insecure = proxy(
        format!("tls://127.0.0.1:{}", server.port),
        UpstreamTls {
            ca: Some(other),
            insecure_skip_verify: true,
            ..Default::default()
        },
    )
    .await;
    let c3 = async_nats::connect(insecure.url()).await.unwrap();
    roundtrip(&c3, "tls.insecure").await;

    // tls:// toward a node that offers no TLS: refused, never cleartext.
    let plain = NatsServer::start(ServerOpts::default()).await;
    let downgrade = proxy(
        format!("tls://127.0.0.1:{}", plain.port),
        UpstreamTls {
            ca: Some(ca),
            ..Default::default()
        },
    )
    .await;
    refused_client(&downgrade).await;
}

#[tokio::test]
async fn mutual_tls_and_handshake_first() {
    init_logs();
    let pki = Pki::new();
    let ca = pki.write("ca.pem", &pki.ca.cert.pem());
    let (cert, key) = leaf(&pki.ca, ExtendedKeyUsagePurpose::ClientAuth);
    let cert = pki.write("client.pem", &cert);
    let key = pki.write("client.key", &key);
    let verifying = tls_server(&pki, ", verify: true").await;
    let with_cert = UpstreamTls {
        ca: Some(ca.clone()),
        cert: Some(cert),
        key: Some(key),
        ..Default::default()
    };
    let p = proxy(
        format!("tls://127.0.0.1:{}", verifying.port),
        with_cert.clone(),
    )
    .await;
    let c = async_nats::connect(p.url()).await.unwrap();
    roundtrip(&c, "mtls.ok").await;
    // Without a client certificate the server ends the connection after the handshake
    // (TLS 1.3 checks it last): the proxy never gets a working upstream.
    let p2 = proxy(
        format!("tls://127.0.0.1:{}", verifying.port),
        UpstreamTls {
            ca: Some(ca),
            ..Default::default()
        },
    )
    .await;
    let c2 = async_nats::connect(p2.url()).await.unwrap();
    within(
        T,
        "the server to refuse the proxy's certificate-less TLS",
        async {
            while !verifying.log().contains("TLS handshake error") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert_eq!(p2.stats.sessions_with_upstream.get(), 0);
    drop(c2);

    // A server that wants the TLS handshake before its INFO.
    let first = tls_server(&pki, ", handshake_first: true").await;
    let p3 = proxy(
        format!("tls://127.0.0.1:{}?tls_first", first.port),
        with_cert,
    )
    .await;
    let c3 = async_nats::connect(p3.url()).await.unwrap();
    roundtrip(&c3, "tls.first").await;
}

#[tokio::test]
async fn ca_file_changes_apply_to_new_connections_only() {
    init_logs();
    let pki = Pki::new();
    let server = tls_server(&pki, "").await;
    let wrong = new_ca("not the server's").cert.pem();
    let ca_file = pki.write("ca.pem", &wrong);
    let p = proxy(
        format!("tls://127.0.0.1:{}", server.port),
        UpstreamTls {
            ca: Some(ca_file.clone()),
            ..Default::default()
        },
    )
    .await;
    // The wrong CA: refused.
    refused_client(&p).await;
    // The right CA is put in place: the next dial uses it, no restart.
    pki.write("ca.pem", &pki.ca.cert.pem());
    let c = async_nats::connect(p.url()).await.unwrap();
    roundtrip(&c, "reload.ok").await;
    // Back to a wrong CA: the open connection keeps working, new ones fail.
    let failures = p.stats.upstream_dial_failures.get();
    std::fs::write(&ca_file, new_ca("another stranger").cert.pem()).unwrap();
    refused_client(&p).await;
    assert!(p.stats.upstream_dial_failures.get() > failures);
    roundtrip(&c, "reload.still").await;
    assert_eq!(
        c.connection_state(),
        async_nats::connection::State::Connected
    );
    assert_eq!(p.stats.upstream_connects.get(), 1);
}

/// Readiness dials as a session does: a `handshake_first` node, which sends nothing
/// before the TLS handshake, makes the proxy ready with no client connected.
#[tokio::test]
async fn readiness_with_a_handshake_first_upstream() {
    init_logs();
    let pki = Pki::new();
    let ca = pki.write("ca.pem", &pki.ca.cert.pem());
    let first = tls_server(&pki, ", handshake_first: true").await;
    let url = format!("tls://127.0.0.1:{}?tls_first", first.port);
    let metrics = free_port();
    let p = TestProxy::start_with(&[url], move |c: &mut Config| {
        c.upstream_tls = UpstreamTls {
            ca: Some(ca),
            ..Default::default()
        };
        c.metrics_listen = Some(format!("127.0.0.1:{metrics}").parse().unwrap());
    })
    .await;
    within(T, "/readyz 200 without a client", async {
        while common::http_get(metrics, "/readyz").await.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(p.stats.clients_active.get(), 0);
}

/// A leaf certificate for exactly these names (no IP SAN unless given).
fn leaf_for(ca: &Ca, names: &[&str]) -> (String, String) {
    let mut p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name
        .push(DnType::CommonName, "natsproxy test node");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// How the proxy is pointed at a TLS cluster whose certificates name only `localhost`.
#[derive(Debug)]
enum Reach {
    /// `tls://localhost:<n1>`; the nodes learned from INFO are IPs.
    ByName,
    /// `tls://127.0.0.1:<n1>` with `--upstream-tls-server-name localhost`.
    ByIpWithServerName,
}

/// Rolling lame-duck restart of a 3-node TLS cluster under a steady publisher (on a 4th
/// node that never restarts): every message once, no client disconnect, gaps under 1 s.
async fn rolling_restart_of_a_host_named_tls_cluster(reach: Reach) {
    use common::cluster::{Cluster, ClusterOpts};
    use common::roll::{rolling_restart_under_traffic, N};
    init_logs();
    let pki = Pki::new();
    let (cert, key) = leaf_for(&pki.ca, &["localhost"]);
    let block = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", timeout: 2 }}\n",
        pki.write("node.pem", &cert).display(),
        pki.write("node.key", &key).display()
    );
    let ca = pki.write("ca.pem", &pki.ca.cert.pem());
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        publisher_node: true,
        client_tls: Some(block),
        ..Default::default()
    })
    .await
    .unwrap();
    let port = cluster.nodes[0].port;
    let (url, server_name) = match reach {
        Reach::ByName => (format!("tls://localhost:{port}"), None),
        Reach::ByIpWithServerName => (format!("tls://127.0.0.1:{port}"), Some("localhost".into())),
    };
    let p = TestProxy::start_with(&[url], move |c: &mut Config| {
        c.upstream_tls = UpstreamTls {
            ca: Some(ca),
            server_name,
            ..Default::default()
        };
    })
    .await;
    let r = rolling_restart_under_traffic(&mut cluster, p.url(), "tls.roll").await;
    let migrations = p.stats.migrations.get();
    eprintln!(
        "TLS by host name ({reach:?}): {} of {N} received, largest gap {:?}, {migrations} \
         migrations, {} client disconnects",
        r.got.len(),
        r.gap,
        r.disconnects
    );
    r.assert_clean(Duration::from_secs(1));
    // The proxy moves only when its own node leaves (2 or 3 times in 3 restarts); its
    // first move goes to a node it learned from INFO, by IP.
    assert!(migrations >= 1, "{migrations} migrations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_whose_certificates_name_only_a_host_through_a_rolling_restart() {
    rolling_restart_of_a_host_named_tls_cluster(Reach::ByName).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_reached_by_ip_with_an_explicit_server_name() {
    rolling_restart_of_a_host_named_tls_cluster(Reach::ByIpWithServerName).await;
}
