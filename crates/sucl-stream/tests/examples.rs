//! The examples answer `--help` (what they do, their arguments, an example command) without
//! running any work, and a wrong launch is a one-line error, not a panic. The examples are the
//! binaries `cargo test` builds beside this one (`cargo test -p sucl-stream` builds them;
//! `--test examples` alone does not).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

const EXAMPLES: [&str; 4] = ["faces", "ring", "st_gpu", "stream_plot"];

fn example(name: &str, args: &[&str]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe.parent().and_then(|deps| deps.parent()).unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is missing: run `cargo test -p sucl-stream`, which builds the examples", path.display());
    Command::new(&path).args(args).env_remove("SUCL_TIMEOUT").output().expect("running an example")
}

#[test]
fn every_example_answers_help_without_running() {
    if common::child_rank().is_some() {
        return;
    }
    for name in EXAMPLES {
        let out = example(name, &["--help"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("Usage:") && text.contains("Example"), "{name} --help does not say how to run it:\n{text}");
        // No work: no result line (each example starts those with its name).
        let ran = text.lines().any(|l| l.starts_with(&format!("{name}: ")) || l.starts_with("st-gpu: "));
        assert!(!ran, "{name} --help ran work:\n{text}");
        assert!(out.stderr.is_empty(), "{name} --help wrote to stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_wrong_rank_count_is_a_one_line_error() {
    if common::child_rank().is_some() {
        return;
    }
    // A world of one (no launcher) for programs that need more ranks.
    for (name, args, says) in [
        ("ring", &[][..], "at least 2 ranks"),
        ("st_gpu", &["order", "staged"][..], "runs on 2 ranks"),
        ("faces", &["2", "2", "2", "4", "4", "4", "4", "1", "1", "2"][..], "lx·ly·lz = 8 but there are 1 ranks"),
    ] {
        let out = example(name, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(says), "{name} did not say `{says}`: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: not one line: {err}");
        assert!(!err.contains("panicked"), "{name} panicked: {err}");
    }
}
