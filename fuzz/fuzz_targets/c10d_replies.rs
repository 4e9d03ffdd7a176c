//! Replies of a c10d TCPStore (torchrun's agent) as sucl's client reads them: see `sucl_core::c10d::fuzz::replies` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_core::c10d::fuzz::replies(data));
