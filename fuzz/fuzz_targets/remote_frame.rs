//! Frames between a remote client and its daemon: see `sucl_remote::wire::fuzz::frame` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_remote::wire::fuzz::frame(data));
