//! natsproxy: a NATS-aware localhost sidecar proxy.
//!
//! ```text
//!  client TCP ──► driver (proxy/) ──bytes──► Session (session/, pure) ──Actions──► driver ──► upstream
//!                      ▲                          │ uses proto/ (pure codec)
//!                      └──────── Actions ◄────────┘
//! ```
//! - [`proto`]: sans-io NATS codec, both directions.
//! - [`session`]: sans-io per-client state machine (bytes, events and `now` in; actions out).
//! - [`proxy`]: the tokio shell: listener, per-client driver, dialing, shutdown.
//! - [`auth`]: credentials the proxy holds and asks for, nonce signing.
//! - [`cli`] and [`settings`]: one struct for flags, environment and file; merged,
//!   checked and turned into a [`config::Config`].
//!
//! The binary (`src/bin/natsproxy/`) adds the `demo` subcommand on top of this library and
//! the test kit (`kit/`); the library itself holds no demo or test code, with or without
//! the `demo` feature.

pub mod auth;
pub mod cli;
pub mod config;
pub mod metrics;
pub mod proto;
pub mod proxy;
pub mod session;
pub mod settings;
pub mod shutdown;
pub mod telemetry;
