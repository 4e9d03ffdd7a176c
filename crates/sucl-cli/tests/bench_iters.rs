//! `sucl bench` chooses the timed iterations of each size from a time budget (all ranks
//! running the same count), unless `--iters` fixes it.

mod common;

use common::{finish, sucl, Reaped};
use std::process::Stdio;
use std::time::Duration;

/// The `iters` of each JSON row of a 2-rank all_reduce sweep with `extra` options; checks that
/// the job succeeded and that every result was right.
fn iters_of(extra: &[&str]) -> Vec<u64> {
    let mut cmd = sucl();
    cmd.args([
        "bench",
        "all_reduce",
        "--ranks",
        "2",
        "--backend",
        "shm",
        "--min-bytes",
        "8",
        "--max-bytes",
        "64K",
        "--factor",
        "8",
        "--json",
    ])
    .args(extra)
    .env("SUCL_TIMEOUT", "30")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let out = finish(Reaped(cmd.spawn().expect("spawn sucl bench")), Duration::from_secs(240), "sucl bench");
    assert!(out.status.success(), "sucl bench {extra:?} failed: {:?}\n{}", out.status, out.stderr);
    let rows: Vec<serde_json::Value> =
        out.stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect("a JSON row")).collect();
    assert_eq!(rows.len(), 5, "one row per size (8, 64, 512, 4K, 32K): {}", out.stdout);
    for r in &rows {
        assert_eq!(r["wrong"], 0, "{r}");
    }
    rows.iter().map(|r| r["iters"].as_u64().expect("iters in every row")).collect()
}

#[test]
fn every_size_runs_within_the_bounds_and_all_ranks_agree() {
    // A wide range, so the count comes from the estimate; ranks that disagreed on it would
    // pair one rank's timing reduction with the other's collective and fail or time out.
    let iters = iters_of(&["--budget-ms", "30", "--min-iters", "3", "--max-iters", "200000"]);
    assert!(iters.iter().all(|&i| (3..=200_000).contains(&i)), "{iters:?}");
    // Fixed bounds fix the count.
    assert_eq!(iters_of(&["--min-iters", "37", "--max-iters", "37"]), vec![37; 5]);
}

#[test]
fn iters_overrides_the_budget() {
    assert_eq!(iters_of(&["--iters", "7", "--min-iters", "50"]), vec![7; 5]);
}

#[test]
fn bad_bounds_are_refused_before_anything_runs() {
    let out = sucl().args(["bench", "all_reduce", "--min-iters", "9", "--max-iters", "3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-iters at most --max-iters"));
}
