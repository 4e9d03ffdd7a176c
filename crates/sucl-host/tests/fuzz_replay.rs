//! The fuzz targets' corpora and findings (`fuzz/corpus/<target>`, `fuzz/findings/<target>`)
//! replayed through the same entry points as plain tests: the tcp mesh handshake. Every input that once
//! failed stays here as a regression test (see `scripts/fuzz.sh`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn mesh_handshake_corpus_and_findings() {
    replay("mesh_handshake", sucl_host::tcp_auth_fuzz::mesh_handshake);
}
