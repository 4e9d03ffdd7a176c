//! The replay of one fuzz target's committed inputs as a plain test, shared by the crates'
//! `tests/fuzz_replay.rs` (each includes this file with `#[path]`).

use std::path::{Path, PathBuf};

/// Runs `check` on every input of `target`'s corpus (`fuzz/corpus/<target>`, which must not be
/// empty) and findings (`fuzz/findings/<target>`); fails naming each input that panics.
pub fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let inputs = |dir: &str| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> =
            std::fs::read_dir(root.join(dir).join(target)).map_or(Vec::new(), |d| d.flatten().map(|e| e.path()).collect());
        v.sort();
        v
    };
    let corpus = inputs("corpus");
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} holds no input");
    let failed: Vec<String> = corpus
        .iter()
        .chain(&inputs("findings"))
        .filter(|p| {
            let bytes = std::fs::read(p).expect("reading an input");
            std::panic::catch_unwind(|| check(&bytes)).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target}: these inputs fail: {failed:?}");
}
