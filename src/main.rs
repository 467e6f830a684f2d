//! natsproxy binary: parse flags, set up logging, run the proxy until a signal.

use clap::Parser;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

use natsproxy::cli::Cli;
use natsproxy::proxy::Proxy;
use natsproxy::{shutdown, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(&cli.log_level, cli.log_format);
    let cfg = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("natsproxy: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("natsproxy: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let listen = cfg.listen;
        let proxy = match Proxy::bind(cfg).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("natsproxy: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let token = CancellationToken::new();
        tokio::spawn(shutdown::on_signal(token.clone()));
        proxy.run(token).await;
        ExitCode::SUCCESS
    })
}
