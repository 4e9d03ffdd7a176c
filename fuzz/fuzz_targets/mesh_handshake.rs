//! The tcp mesh handshake, either side: see `sucl_host::tcp_auth_fuzz::mesh_handshake` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_host::tcp_auth_fuzz::mesh_handshake(data));
