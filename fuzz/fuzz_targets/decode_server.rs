//! Server-direction decoder: the same bytes decoded whole and cut at fuzzer-chosen
//! points give the same ops and the same error, and never panic; the relay's fast path
//! (`peek_msg`) agrees with `decode` wherever it sees a message (the property is
//! `natsproxy::proto::oracle`'s, shared with the proptests). The flags byte's headers
//! bit does nothing here: servers send HMSG whatever was negotiated.
#![no_main]

use libfuzzer_sys::fuzz_target;
use natsproxy::proto::oracle::{self, FuzzInput};

fuzz_target!(|data: &[u8]| {
    let Some(i) = FuzzInput::parse(data) else {
        return;
    };
    oracle::same_however_cut(i.bytes, &i.cuts, |c| oracle::server_chunks(i.limits, c));
});
