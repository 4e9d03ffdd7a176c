//! The rendezvous store's protocol, server and client side: see `sucl_core::store::fuzz::frames` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_core::store::fuzz::frames(data));
