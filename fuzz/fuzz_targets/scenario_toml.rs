//! Task-graph scenarios (TOML), parsed and simulated: see `sucl_graph::scenario::fuzz::scenario_toml` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sucl_graph::scenario::fuzz::scenario_toml(data));
