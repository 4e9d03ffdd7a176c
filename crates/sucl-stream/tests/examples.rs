//! The examples answer `--help` (what they do, their arguments, an example command) without
//! running any work, and a wrong launch is a one-line error, not a panic. The examples are the
//! binaries `cargo test` builds beside this one (`cargo test -p sucl-stream` builds them;
//! `--test examples` alone does not).

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXAMPLES: [&str; 4] = ["faces", "ring", "st_gpu", "stream_plot"];

fn example(name: &str, args: &[&str]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe.parent().and_then(|deps| deps.parent()).unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is missing: run `cargo test -p sucl-stream`, which builds the examples", path.display());
    let child = Command::new(&path)
        .args(args)
        .env_remove("SUCL_TIMEOUT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running an example");
    finish_within(name, child, Duration::from_secs(60))
}

/// The example's output once it exited; kills it (and fails) if it runs past `limit`, so a
/// `--help` that runs work, or a launch error that waits for other ranks, cannot hang the test.
fn finish_within(name: &str, mut child: Child, limit: Duration) -> Output {
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = vec![];
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for an example") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: out.join().expect("stdout reader"), stderr: err.join().expect("stderr reader") }
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
