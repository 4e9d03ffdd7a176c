//! sucl's config file (TOML): see `sucl_runtime::config::fuzz::config_toml` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_runtime::config::fuzz::config_toml(data));
