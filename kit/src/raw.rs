//! A raw NATS protocol client for tests that must see the exact bytes: it reads the
//! server's (or proxy's) INFO line however it is split across reads, then sends and
//! reads until a given ending, each step bounded by a timeout.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::within;

/// How long one step may take.
const STEP: Duration = Duration::from_secs(10);

pub struct RawClient {
    s: TcpStream,
    /// Read but not yet returned.
    pending: Vec<u8>,
    /// The INFO line it was greeted with, `\r\n` included.
    pub info: String,
}

impl RawClient {
    /// Connects and reads the INFO line.
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).await.unwrap();
        let mut c = RawClient {
            s,
            pending: Vec::new(),
            info: String::new(),
        };
        let info = c.until(b"\r\n").await;
        assert!(
            info.starts_with(b"INFO "),
            "no INFO: {:?}",
            String::from_utf8_lossy(&info)
        );
        c.info = String::from_utf8_lossy(&info).into_owned();
        c
    }

    /// The socket, and what was read past the INFO line.
    pub fn into_parts(self) -> (TcpStream, Vec<u8>) {
        (self.s, self.pending)
    }

    pub async fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
    }

    /// Everything up to and including the first `end`; panics on close or timeout.
    pub async fn until(&mut self, end: &[u8]) -> Vec<u8> {
        match self.until_or_closed(end).await {
            Some(b) => b,
            None => panic!(
                "closed before {:?}; got {:?}",
                String::from_utf8_lossy(end),
                String::from_utf8_lossy(&self.pending)
            ),
        }
    }

    /// Everything up to and including the first `end`, or `None` if the peer closed
    /// first (what was read stays in `pending`). Panics on timeout.
    pub async fn until_or_closed(&mut self, end: &[u8]) -> Option<Vec<u8>> {
        let what = format!("{:?}", String::from_utf8_lossy(end));
        within(STEP, &what, async {
            loop {
                if let Some(i) = find(&self.pending, end) {
                    let rest = self.pending.split_off(i + end.len());
                    return Some(std::mem::replace(&mut self.pending, rest));
                }
                let mut b = [0u8; 4096];
                match self.s.read(&mut b).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.pending.extend_from_slice(&b[..n]),
                }
            }
        })
        .await
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
