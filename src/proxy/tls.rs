//! Dialing upstream nodes, in cleartext or TLS (rustls with ring; no OpenSSL).
//!
//! NATS starts in cleartext: the server sends INFO, then, if it asks for TLS
//! (`tls_required`), the client does the handshake and only then sends CONNECT. A server
//! with `tls { handshake_first: true }` instead waits for the ClientHello before its
//! INFO; nothing on the wire tells, so that is per-upstream configuration (`?tls_first`).
//! The dialer does all of this before the session sees the link: it hands the session the
//! INFO it read (or the stream, for tls_first), so the sans-io core never knows about TLS.
//!
//! Verification is on by default: the server name is the URL's host (DNS name or IP
//! address), the roots are `--upstream-tls-ca` or the system's. The CA, certificate and key
//! files are checked for changes (modification time and size) at each dial and re-read
//! when they changed; open connections keep the session they negotiated. A change that
//! does not load (a half-written file) is logged and the previous configuration kept.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::{info, warn};

use crate::config::{UpstreamTls, UpstreamUrl};
use crate::proto::json::ServerInfo;

/// Bound of the INFO line read before TLS (nats-server's INFO is a few KiB).
const MAX_INFO_LINE: usize = 64 * 1024;

/// An upstream connection, cleartext or TLS.
pub enum UpStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for UpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// How to reach one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Refuse the node unless the connection is TLS.
    pub require_tls: bool,
    /// TLS before INFO.
    pub tls_first: bool,
}

/// Modification time and size of a file, to notice a change.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(p: &Path) -> Stamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

struct Loaded {
    stamps: Vec<Stamp>,
    config: Arc<ClientConfig>,
}

/// Dials upstream nodes with the proxy's TLS settings; shared by all clients.
pub struct Dialer {
    tls: UpstreamTls,
    /// Per configured `host:port`: its URL's TLS settings. Learned nodes use the defaults.
    plans: Vec<(String, Plan)>,
    loaded: Mutex<Option<Loaded>>,
}

impl Dialer {
    /// Loads the TLS files once, so that a wrong path fails at start-up.
    pub fn new(tls: UpstreamTls, upstreams: &[UpstreamUrl]) -> Result<Dialer, String> {
        let plans = upstreams
            .iter()
            .map(|u| {
                let plan = Plan {
                    require_tls: u.tls || tls.required,
                    tls_first: u.tls_first,
                };
                (u.addr.clone(), plan)
            })
            .collect();
        let d = Dialer {
            tls,
            plans,
            loaded: Mutex::new(None),
        };
        if d.tls.insecure_skip_verify {
            warn!("--upstream-tls-insecure-skip-verify: upstream TLS certificates are NOT verified; anyone in the path can read and change the traffic");
        }
        if d.uses_files() || d.plans.iter().any(|p| p.1.require_tls) {
            d.client_config()?;
        }
        Ok(d)
    }

    fn uses_files(&self) -> bool {
        self.tls.ca.is_some() || self.tls.cert.is_some()
    }

    fn files(&self) -> Vec<&PathBuf> {
        [&self.tls.ca, &self.tls.cert, &self.tls.key]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The plan for `addr`: its URL's, or for a node learned from the cluster, TLS only
    /// if required everywhere (or asked for by the node itself).
    pub fn plan(&self, addr: &str) -> Plan {
        self.plans
            .iter()
            .find(|(a, _)| a == addr)
            .map(|p| p.1)
            .unwrap_or(Plan {
                require_tls: self.tls.required,
                tls_first: false,
            })
    }

    /// The current TLS client configuration, re-read if its files changed.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let stamps: Vec<Stamp> = self.files().iter().map(|p| stamp(p)).collect();
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = loaded.as_ref() {
            if l.stamps == stamps {
                return Ok(l.config.clone());
            }
        }
        match build(&self.tls) {
            Ok(c) => {
                let c = Arc::new(c);
                if loaded.is_some() {
                    info!("upstream TLS files changed: new connections use the new ones");
                }
                *loaded = Some(Loaded {
                    stamps,
                    config: c.clone(),
                });
                Ok(c)
            }
            Err(e) => match loaded.as_ref() {
                Some(l) => {
                    warn!(error = %e, "upstream TLS files changed but do not load; keeping the previous ones");
                    Ok(l.config.clone())
                }
                None => Err(e),
            },
        }
    }

    /// Connects to `addr`, negotiates TLS as planned or as the server asks, and returns
    /// the stream with what was read from it (the INFO line, when read before TLS).
    pub async fn dial(&self, addr: &str, timeout: Duration) -> io::Result<(UpStream, BytesMut)> {
        let plan = self.plan(addr);
        let fut = async {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            if plan.tls_first {
                let tls = self.handshake(addr, tcp).await?;
                return Ok((tls, BytesMut::new()));
            }
            let (tcp, line) = read_info_line(tcp).await?;
            let info = parse_info(&line)?;
            if info.0 || (plan.require_tls && info.1) {
                let tls = self.handshake(addr, tcp).await?;
                return Ok((tls, line));
            }
            if plan.require_tls {
                return Err(io::Error::other(format!(
                    "{addr} offers no TLS but the upstream is tls:// (or --upstream-tls)"
                )));
            }
            Ok((UpStream::Plain(tcp), line))
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{addr}: no connection, INFO or TLS handshake within {timeout:?}"),
            )),
        }
    }

    /// The name `addr`'s certificate is verified against: `--upstream-tls-server-name`;
    /// else a configured URL's own host; else (a node learned from the cluster's INFO,
    /// announced by IP) the first configured host that is a name, as nats.go verifies
    /// implicit servers against the host of the URL it was given.
    pub fn verify_name<'a>(&'a self, addr: &'a str) -> &'a str {
        if let Some(n) = &self.tls.server_name {
            return n;
        }
        let host = host_of(addr);
        if self.plans.iter().any(|(a, _)| a == addr) {
            return host;
        }
        self.plans
            .iter()
            .map(|(a, _)| host_of(a))
            .find(|h| h.parse::<IpAddr>().is_err())
            .unwrap_or(host)
    }

    async fn handshake(&self, addr: &str, tcp: TcpStream) -> io::Result<UpStream> {
        let config = self.client_config().map_err(io::Error::other)?;
        let checked = self.verify_name(addr);
        let name = match checked.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(checked.to_owned())
                .map_err(|e| io::Error::other(format!("{checked}: not a TLS server name: {e}")))?,
        };
        let s = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| {
                io::Error::other(format!(
                    "TLS handshake with {addr} (certificate checked for `{checked}`): {e}"
                ))
            })?;
        Ok(UpStream::Tls(Box::new(s)))
    }
}

/// Reads up to and including the first line (the server's INFO).
async fn read_info_line(mut tcp: TcpStream) -> io::Result<(TcpStream, BytesMut)> {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        if let Some(i) = memchr::memchr(b'\n', &buf) {
            if i + 1 != buf.len() {
                // A server says nothing after INFO until the client's CONNECT.
                return Err(io::Error::other("unexpected bytes after the server's INFO"));
            }
            return Ok((tcp, buf));
        }
        if buf.len() > MAX_INFO_LINE {
            return Err(io::Error::other("server INFO line too long"));
        }
        buf.reserve(4096);
        if tcp.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// (tls_required, tls_available) of an INFO line.
fn parse_info(line: &[u8]) -> io::Result<(bool, bool)> {
    let bad = || io::Error::other("the server's first line is not an INFO");
    let json = line
        .get(..5)
        .filter(|v| v.eq_ignore_ascii_case(b"INFO ") || v.eq_ignore_ascii_case(b"INFO\t"))
        .map(|_| line[5..].trim_ascii())
        .ok_or_else(bad)?;
    let info = ServerInfo::parse(json).ok_or_else(bad)?;
    let available = info
        .raw
        .get("tls_available")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Ok((info.tls_required, available))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the client configuration from the files.
/// The host of `host:port` (`[v6]:port` without brackets).
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

fn build(t: &UpstreamTls) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if t.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    } else {
        let mut roots = RootCertStore::empty();
        match &t.ca {
            Some(ca) => {
                let certs = CertificateDer::pem_file_iter(ca)
                    .map_err(|e| format!("--upstream-tls-ca {}: {e}", ca.display()))?;
                for c in certs {
                    let c = c.map_err(|e| format!("--upstream-tls-ca {}: {e}", ca.display()))?;
                    roots
                        .add(c)
                        .map_err(|e| format!("--upstream-tls-ca {}: {e}", ca.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!(
                        "--upstream-tls-ca {}: no certificate in it",
                        ca.display()
                    ));
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for c in native.certs {
                    let _ = roots.add(c);
                }
            }
        }
        builder.with_root_certificates(roots)
    };
    match (&t.cert, &t.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("--upstream-tls-cert {}: {e}", cert.display()))?;
            // The key's content never appears in an error, only its path.
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("--upstream-tls-key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("--upstream-tls-cert/--upstream-tls-key: {e}"))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err("--upstream-tls-cert and --upstream-tls-key go together".into()),
    }
}

/// Accepts any certificate but still checks the handshake signatures.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
