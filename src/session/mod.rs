//! The per-client state machine: pure, sans-io (see [`Session`], and its phase diagram
//! in `facade.rs`).

// No clock here (clippy.toml): `now` comes with every event. Tests may make up times.
#![cfg_attr(not(test), deny(clippy::disallowed_methods))]

pub mod action;
mod backlog;
mod client;
mod config;
pub mod dedup;
mod dial_window;
mod facade;
pub mod jetstream;
pub mod link;
mod phase;
pub mod pool;
pub mod replies;
mod stats;
pub mod subs;
mod timers;
mod upstream;

pub use action::{Action, CloseReason, Epoch};
pub use backlog::{CONFIRM_BYTES, CONFIRM_DELAY};
pub use config::*;
pub use dial_window::{DIAL_WINDOW, MAX_DIALS_PER_WINDOW};
pub use facade::Session;
pub use stats::{MoveReason, SessionEvent, SessionStats, MAX_EVENTS};

#[cfg(test)]
mod tests;
