//! SIGTERM/SIGINT → cancellation. A second signal exits at once.

use tokio_util::sync::CancellationToken;
use tracing::info;

/// Cancels `token` on the first SIGTERM or SIGINT; exits the process on the second.
pub async fn on_signal(token: CancellationToken) {
    wait_signal().await;
    info!("shutdown requested");
    token.cancel();
    wait_signal().await;
    info!("second signal: exiting now");
    std::process::exit(130);
}

#[cfg(unix)]
async fn wait_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(not(unix))]
async fn wait_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
