//! Frames between two remote daemons: see `sucl_remote::wire::fuzz::peer_frame` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_remote::wire::fuzz::peer_frame(data));
