//! A round-robin TCP balancer, as a Kubernetes Service's virtual IP is to the proxy: one
//! address, each new connection to the next backend in turn. A backend that refuses the
//! connection (a node restarting) gets the client connection closed, as a balancer without
//! health checks does; the next connection goes to the next backend.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};

pub struct Balancer {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    pub async fn start(backends: Vec<SocketAddr>) -> Balancer {
        let listener = TcpListener::bind(("127.0.0.1", crate::free_port().expect("a free port")))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut client, _)) = listener.accept().await {
                let backend = backends[next % backends.len()];
                next += 1;
                count.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Balancer {
            addr,
            accepted,
            task,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
