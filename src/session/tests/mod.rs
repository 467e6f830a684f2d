//! Pure session tests: events in with a fake clock, actions out.

use super::*;
use crate::proto::encode;
use bytes::{Bytes, BytesMut};
use std::time::{Duration, Instant};

mod handshake;
mod harness;
mod hedge;
mod jetstream;
mod migration;
mod relay;
