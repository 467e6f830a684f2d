//! natsproxy binary: parse flags (and env, and the config file), set up logging, run.

use clap::Parser;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

use natsproxy::cli::{Cli, Command};
use natsproxy::proxy::{self, Proxy, StartError};
use natsproxy::{shutdown, telemetry};

mod demo;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Demo(args)) = &cli.command {
        return demo::main(args);
    }
    let settings = match cli.opts.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("natsproxy: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::CheckConfig) = cli.command {
        // Every file it names must load, as at start-up (creds and seeds did above).
        if let Err(e) = proxy::check_files(&settings.config) {
            eprintln!("natsproxy: configuration error: {e}");
            return ExitCode::from(e.exit_code());
        }
        print!("{}", settings.render());
        return ExitCode::SUCCESS;
    }
    telemetry::init(&settings.log_level, settings.log_format);
    let cfg = settings.config;
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
        let proxy = match Proxy::bind(cfg).await {
            Ok(p) => p,
            Err(e @ StartError::Tls(_)) => {
                eprintln!("natsproxy: configuration error: {e}");
                return ExitCode::from(e.exit_code());
            }
            Err(e) => {
                eprintln!("natsproxy: {e}");
                return ExitCode::from(e.exit_code());
            }
        };
        let token = CancellationToken::new();
        tokio::spawn(shutdown::on_signal(token.clone()));
        proxy.run(token).await;
        ExitCode::SUCCESS
    })
}
