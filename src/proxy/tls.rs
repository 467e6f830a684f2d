//! Upstream TLS: the client configuration (rustls with ring; no OpenSSL), re-read when its
//! files change, the handshake, and the stream type that is either cleartext or TLS.
//! Which node gets TLS, and when in the exchange, is the dialer's business (`dial.rs`).
//!
//! Verification is on by default; the roots are `--upstream-tls-ca` or the system's. The CA,
//! certificate and key files are checked for changes (modification time and size) at each
//! dial and re-read when they changed; open connections keep the session they negotiated. A
//! change that does not load (a half-written file) is logged and the previous configuration
//! kept.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::{info, warn};

use crate::config::UpstreamTls;

/// An upstream connection, cleartext or TLS.
pub enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
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

/// The TLS client configuration built from the proxy's settings, re-read when its files
/// change; shared by all clients.
pub struct TlsFiles {
    tls: UpstreamTls,
    loaded: Mutex<Option<Loaded>>,
}

impl TlsFiles {
    pub fn new(tls: UpstreamTls) -> TlsFiles {
        if tls.insecure_skip_verify {
            warn!("--upstream-tls-insecure-skip-verify: upstream TLS certificates are NOT verified; anyone in the path can read and change the traffic");
        }
        TlsFiles {
            tls,
            loaded: Mutex::new(None),
        }
    }

    pub fn settings(&self) -> &UpstreamTls {
        &self.tls
    }

    /// True when a CA or client certificate is configured (then they load at start-up).
    pub fn uses_files(&self) -> bool {
        self.tls.ca.is_some() || self.tls.cert.is_some()
    }

    fn files(&self) -> Vec<&PathBuf> {
        [&self.tls.ca, &self.tls.cert, &self.tls.key]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The current TLS client configuration, re-read if its files changed.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
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

    /// The TLS handshake on `tcp`, the certificate verified for `name` (a DNS name or an
    /// IP address).
    pub async fn handshake(&self, name: &str, tcp: TcpStream) -> io::Result<UpstreamIo> {
        let config = self.client_config().map_err(io::Error::other)?;
        let server_name = match name.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(name.to_owned()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("`{name}` is not a TLS server name: {e}"),
                )
            })?,
        };
        let s = TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(|e| {
                io::Error::new(e.kind(), format!("certificate checked for `{name}`: {e}"))
            })?;
        Ok(UpstreamIo::Tls(Box::new(s)))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why the upstream TLS configuration does not load; each names the flag and the file,
/// never a key's content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the TLS provider refuses the default protocol versions: {0}")]
    Provider(#[source] rustls::Error),
    #[error("--upstream-tls-ca {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("--upstream-tls-ca {}: {source}", path.display())]
    CaCertificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("--upstream-tls-ca {}: no certificate in it", path.display())]
    NoCaCertificate { path: PathBuf },
    #[error("--upstream-tls-cert {}: {source}", path.display())]
    CertFile {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("--upstream-tls-key {}: {source}", path.display())]
    KeyFile {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("--upstream-tls-cert/--upstream-tls-key: {0}")]
    ClientAuth(#[source] rustls::Error),
    #[error("--upstream-tls-cert and --upstream-tls-key go together")]
    CertWithoutKey,
}

/// Builds the client configuration from the files.
fn build(t: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Provider)?;
    let builder = if t.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    } else {
        let mut roots = RootCertStore::empty();
        match &t.ca {
            Some(ca) => {
                let file = |source| TlsError::CaFile {
                    path: ca.clone(),
                    source,
                };
                for c in CertificateDer::pem_file_iter(ca).map_err(file)? {
                    roots
                        .add(c.map_err(file)?)
                        .map_err(|source| TlsError::CaCertificate {
                            path: ca.clone(),
                            source,
                        })?;
                }
                if roots.is_empty() {
                    return Err(TlsError::NoCaCertificate { path: ca.clone() });
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
                .map_err(|source| TlsError::CertFile {
                    path: cert.clone(),
                    source,
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::KeyFile {
                path: key.clone(),
                source,
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::ClientAuth)
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(TlsError::CertWithoutKey),
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
