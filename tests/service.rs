//! The Service shape: the proxy's only upstream is one address, a round-robin TCP
//! balancer over a cluster that advertises nothing (`no_advertise`: no `connect_urls`),
//! as a Kubernetes Service's virtual IP in front of NATS pods. A rolling lame-duck restart
//! under traffic: every message once, in order, and the client never disconnected.

mod common;
use common::balancer::Balancer;
use common::cluster::{Cluster, ClusterOpts};
use common::roll::{rolling_restart_under_traffic, N};
use common::*;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_address_in_front_of_a_no_advertise_cluster_through_a_rolling_restart() {
    init_logs();
    let mut cluster = Cluster::start(ClusterOpts {
        nodes: 3,
        publisher_node: true,
        no_advertise: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let backends: Vec<SocketAddr> = cluster
        .nodes
        .iter()
        .map(|n| n.addr().parse().unwrap())
        .collect();
    let lb = Balancer::start(backends).await;
    let p = TestProxy::start(&[format!("nats://{}", lb.addr)]).await;
    let r = rolling_restart_under_traffic(&mut cluster, p.url(), "svc.roll").await;
    let (migrations, failovers) = (p.stats.migrations.get(), p.stats.failovers.get());
    eprintln!(
        "Service shape: {} of {N} received, largest gap {:?}, {migrations} migrations, \
         {failovers} failovers, {} upstream dials failed, {} balancer connections, {} client \
         disconnects",
        r.got.len(),
        r.gap,
        p.stats.upstream_dial_failures.get(),
        lb.accepted.load(Ordering::Relaxed),
        r.disconnects
    );
    r.assert_clean(Duration::from_secs(1));
    // Its node left at least once (round robin put it on one of the three), and each
    // move was make-before-break, never a failover.
    assert!(migrations >= 1, "{migrations} migrations");
    assert_eq!(failovers, 0);
}
