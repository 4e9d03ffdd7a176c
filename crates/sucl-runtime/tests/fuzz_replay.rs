//! The fuzz targets' corpora and findings (`fuzz/corpus/<target>`, `fuzz/findings/<target>`)
//! replayed through the same entry points as plain tests: the config file. Every input that once
//! failed stays here as a regression test (see `scripts/fuzz.sh`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn config_toml_corpus_and_findings() {
    replay("config_toml", sucl_runtime::config::fuzz::config_toml);
}
