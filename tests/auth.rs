//! Credentials held by the proxy, against real nats-servers: nkey users (each node's
//! nonce signed afresh, also after a failover), trusted-proxy signatures (`proxy_sig`,
//! nats-server 2.12+), and secrets kept out of logs and messages.

mod common;
use common::*;

use natsproxy::config::{Credentials, NkeySeed};
use std::process::{Command, Stdio};

fn new_user() -> (String, String) {
    let kp = nkeys::KeyPair::new_user();
    (kp.seed().unwrap(), kp.public_key())
}

#[tokio::test]
async fn nkey_user_signs_each_nodes_nonce_also_after_failover() {
    init_logs();
    let (seed, public) = new_user();
    let conf = format!("authorization {{ users: [ {{ nkey: \"{public}\" }} ] }}\n");
    let a = NatsServer::start(ServerOpts {
        extra: conf.clone(),
        ..Default::default()
    })
    .await;
    let b = NatsServer::start(ServerOpts {
        extra: conf,
        ..Default::default()
    })
    .await;
    // Without the seed, the client (which has no credentials) is refused.
    let bare = TestProxy::start(&[a.url()]).await;
    let err = async_nats::ConnectOptions::new()
        .max_reconnects(1)
        .connect(bare.url())
        .await;
    assert!(err.is_err(), "no credentials must be refused");

    let key = NkeySeed::new(&seed).unwrap();
    let proxy = TestProxy::start_with(&[a.url(), b.url()], |c| {
        c.session.credentials = Some(Credentials::Nkey(key));
    })
    .await;
    let c = async_nats::connect(proxy.url()).await.unwrap();
    roundtrip(&c, "nkey.a").await;
    // The node goes away (whichever the proxy picked; the INFO shows its port): the next
    // one sends another nonce, which the proxy signs.
    let connects = proxy.stats.upstream_connects.get();
    if u32::from(a.port) == u32::from(c.server_info().port) {
        drop(a);
    } else {
        drop(b);
    }
    roundtrip(&c, "nkey.b").await;
    assert!(
        proxy.stats.upstream_connects.get() > connects,
        "moved to the other node"
    );
    assert_eq!(
        c.connection_state(),
        async_nats::connection::State::Connected
    );
}

#[tokio::test]
async fn trusted_proxy_signature_is_accepted_and_required() {
    init_logs();
    let (proxy_seed, proxy_public) = new_user();
    let server = NatsServer::start(ServerOpts {
        extra: format!(
            "proxies {{ trusted: [ {{ key: \"{proxy_public}\" }} ] }}\n\
             authorization {{ users: [ {{ user: \"app\", password: \"pw\", proxy_required: true }} ] }}\n"
        ),
        ..Default::default()
    })
    .await;
    let user = Some(Credentials::UserPass {
        user: "app".into(),
        pass: "pw".into(),
    });
    // With natsproxy's key: accepted.
    let (u, k) = (user.clone(), NkeySeed::new(&proxy_seed).unwrap());
    let signed = TestProxy::start_with(&[server.url()], |c| {
        c.session.credentials = u;
        c.session.proxy_key = Some(k);
    })
    .await;
    let c = async_nats::connect(signed.url()).await.unwrap();
    roundtrip(&c, "proxied.ok").await;
    // Same user without the proxy signature, or signed by an untrusted key: refused.
    let (other_seed, _) = new_user();
    for key in [None, Some(NkeySeed::new(&other_seed).unwrap())] {
        let u = user.clone();
        let p = TestProxy::start_with(&[server.url()], |c| {
            c.session.credentials = u;
            c.session.proxy_key = key;
        })
        .await;
        let (reply, closed) =
            raw_exchange(p.addr, b"CONNECT {\"verbose\":false}\r\nPING\r\n").await;
        assert!(
            reply.contains("-ERR 'Authorization Violation'") && closed,
            "{reply:?} {closed}\n{}",
            server.log()
        );
    }
}

#[test]
fn secrets_never_appear_in_output_or_errors() {
    let dir = temp_dir("secrets");
    let (seed, public) = new_user();
    let seed_file = dir.0.join("proxy.nk");
    std::fs::write(&seed_file, &seed).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_natsproxy"))
            .arg("check-config")
            .args(args)
            .env_remove("NATSPROXY_PASSWORD")
            .env_remove("NATSPROXY_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, out) = run(&[
        "--upstream",
        "nats://u:url-pass-123@127.0.0.1:4222",
        "--user",
        "alice",
        "--password",
        "flag-pass-456",
        "--proxy-nkey-seed",
        seed_file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    for secret in ["url-pass-123", "flag-pass-456", &seed[..]] {
        assert!(!out.contains(secret), "secret shown: {out}");
    }
    assert!(
        out.contains(&public),
        "the public key identifies the proxy key: {out}"
    );
    // A broken seed file: the error names the option and the file, not the content.
    let bad = dir.0.join("bad.nk");
    let almost = format!("{}X", &seed[..seed.len() - 1]);
    std::fs::write(&bad, &almost).unwrap();
    let (code, out) = run(&[
        "--upstream",
        "nats://127.0.0.1:4222",
        "--nkey-seed",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--nkey-seed") && out.contains("bad.nk"),
        "{out}"
    );
    assert!(!out.contains(&almost), "seed shown: {out}");
    // A creds file whose seed is broken, likewise.
    let creds = dir.0.join("u.creds");
    std::fs::write(
        &creds,
        format!("-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{almost}\n------END USER NKEY SEED------\n"),
    )
    .unwrap();
    let (code, out) = run(&[
        "--upstream",
        "nats://127.0.0.1:4222",
        "--creds",
        creds.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(!out.contains(&almost), "seed shown: {out}");
}

#[tokio::test]
async fn client_authentication_answers_as_nats_server_does() {
    init_logs();
    let upstream = NatsServer::start(ServerOpts::default()).await;
    // A real server that wants the same token, to compare the answers with.
    let reference = NatsServer::start(ServerOpts {
        extra: "authorization { token: \"ctok\" }\n".into(),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start_with(&[upstream.url()], |c| {
        c.session.client_auth = Some(natsproxy::config::ClientAuth::Token("ctok".into()));
    })
    .await;
    let cases: [&[u8]; 4] = [
        b"PUB x 1\r\na\r\n",
        b"CONNECT {\"verbose\":false,\"auth_token\":\"wrong\"}\r\nPING\r\n",
        b"CONNECT {\"verbose\":false}\r\nPING\r\n",
        b"CONNECT {\"verbose\":false,\"auth_token\":\"ctok\"}\r\nPING\r\n",
    ];
    for input in cases {
        let direct = raw_exchange(reference.addr(), input).await;
        let proxied = raw_exchange(proxy.addr, input).await;
        assert_eq!(proxied, direct, "{}", String::from_utf8_lossy(input));
    }
    // The INFO asks for credentials, so async-nats sends them.
    let ok = async_nats::ConnectOptions::with_token("ctok".into())
        .connect(proxy.url())
        .await
        .unwrap();
    roundtrip(&ok, "client.auth").await;
    let bad = async_nats::ConnectOptions::with_token("nope".into())
        .max_reconnects(1)
        .connect(proxy.url())
        .await;
    assert!(bad.is_err());

    // User and password.
    let proxy = TestProxy::start_with(&[upstream.url()], |c| {
        c.session.client_auth = Some(natsproxy::config::ClientAuth::UserPass {
            user: "v".into(),
            pass: "p".into(),
        });
    })
    .await;
    let ok = async_nats::ConnectOptions::with_user_and_password("v".into(), "p".into())
        .connect(proxy.url())
        .await
        .unwrap();
    roundtrip(&ok, "client.auth.user").await;
    let (reply, closed) = raw_exchange(
        proxy.addr,
        b"CONNECT {\"verbose\":false,\"user\":\"v\",\"pass\":\"x\"}\r\nPING\r\n",
    )
    .await;
    assert_eq!(
        (reply.as_str(), closed),
        ("-ERR 'Authorization Violation'\r\n", true)
    );
}
