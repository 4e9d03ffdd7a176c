//! The fuzz targets' corpora and findings (`fuzz/corpus/<target>`, `fuzz/findings/<target>`)
//! replayed through the same entry points as plain tests: task-graph scenarios. Every input that once
//! failed stays here as a regression test (see `scripts/fuzz.sh`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn scenario_toml_corpus_and_findings() {
    replay("scenario_toml", sucl_graph::scenario::fuzz::scenario_toml);
}
