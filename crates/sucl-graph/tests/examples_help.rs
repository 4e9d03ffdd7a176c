//! Every example answers `--help` with its usage (exit 0, before any rank starts) and turns
//! a bad argument into one line on stderr and exit status 2, never a panic.
//!
//! `cargo test` builds the examples next to the test binaries (`target/<profile>/examples`),
//! which is where this test finds them.

use std::path::PathBuf;
use std::process::Command;

const EXAMPLES: [&str; 6] =
    ["graph_programs", "graph_gpu_programs", "graph_cpd_bench", "graph_sched_bench", "graph_step_bench", "graph_gpu_step_bench"];

/// The GPU examples need the `cuda` feature (on by default) to be built at all.
fn built(name: &str) -> bool {
    cfg!(feature = "cuda") || !name.contains("gpu")
}

/// The example's binary, built by `cargo test` in the profile directory of this test.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let path = profile_dir.join("examples").join(name);
    assert!(path.exists(), "{} is not built: run `cargo test -p sucl-graph` (it builds the examples)", path.display());
    path
}

/// Runs `name` with `args` and no launcher environment; (status, stdout, stderr).
fn run(name: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(example(name))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SUCL_RANK")
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn every_example_answers_help_without_running() {
    for name in EXAMPLES.into_iter().filter(|n| built(n)) {
        let (code, out, err) = run(name, &["--help"]);
        assert_eq!(code, Some(0), "{name} --help: {err}");
        assert!(out.starts_with(&format!("Usage: {name}")), "{name} --help says how to call it: {out}");
        assert!(out.contains("sucl run") || out.contains("cargo run"), "{name} --help shows an example command: {out}");
        assert!(err.is_empty(), "{name} --help runs nothing: {err}");
    }
}

#[test]
fn a_bad_argument_is_one_line_and_status_2() {
    for (name, args) in [
        ("graph_programs", &["--bogus"][..]),
        ("graph_gpu_programs", &["--bogus"][..]),
        ("graph_cpd_bench", &["teleport"][..]),
        ("graph_cpd_bench", &["comm", "--rounds", "many"][..]),
        ("graph_sched_bench", &["--ranks", "0"][..]),
        ("graph_sched_bench", &["--cpd", "maybe"][..]),
        ("graph_step_bench", &["jacobi", "--size", "x"][..]),
        ("graph_gpu_step_bench", &[][..]),
    ] {
        if !built(name) {
            continue;
        }
        let (code, _, err) = run(name, args);
        assert_eq!(code, Some(2), "{name} {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{name} {args:?}: one line: {err}");
        assert!(err.starts_with(&format!("{name}: ")) && !err.contains("panicked"), "{name} {args:?}: {err}");
    }
}
