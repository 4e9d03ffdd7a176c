//! The fuzz targets' corpora and findings (`fuzz/corpus/<target>`, `fuzz/findings/<target>`)
//! replayed through the same entry points as plain tests: frames between client and daemon, and between daemons. Every input that once
//! failed stays here as a regression test (see `scripts/fuzz.sh`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn remote_frame_corpus_and_findings() {
    replay("remote_frame", sucl_remote::wire::fuzz::frame);
}

#[test]
fn remote_peer_frame_corpus_and_findings() {
    replay("remote_peer_frame", sucl_remote::wire::fuzz::peer_frame);
}
