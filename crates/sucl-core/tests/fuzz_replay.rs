//! The fuzz targets' corpora and findings (`fuzz/corpus/<target>`, `fuzz/findings/<target>`)
//! replayed through the same entry points as plain tests: the rendezvous store's frames and c10d store replies. Every input that once
//! failed stays here as a regression test (see `scripts/fuzz.sh`).

#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::replay;

#[test]
fn store_frames_corpus_and_findings() {
    replay("store_frames", sucl_core::store::fuzz::frames);
}

#[test]
fn c10d_replies_corpus_and_findings() {
    replay("c10d_replies", sucl_core::c10d::fuzz::replies);
}
