//! A backend that returns wrong results is reported: with the test-only fault hook
//! (`SUCL_FAULT_CORRUPT=<backend>`, cargo feature `fault-hook`) corrupting one element of every
//! collective output of one backend, `sucl check`, `sucl bench` and `sucl bench --compare` each
//! report wrong elements and exit non-zero; without it they report none and exit 0. Built only
//! with the feature: `cargo test -p sucl-cli --features fault-hook --test faults` (add `mpi` for
//! the MPI cases, which run under mpirun).
#![cfg(feature = "fault-hook")]

mod common;
use common::*;
#[cfg(feature = "mpi")]
use std::process::Command;
use std::time::Duration;

const CHECK: &[&str] =
    &["check", "--ops", "all_reduce,all_gather,broadcast,reduce_scatter", "--dtypes", "f32,u8,bf16", "--sizes", "1,7,1000"];
const BENCH: &[&str] =
    &["bench", "all_reduce", "--min-bytes", "64", "--max-bytes", "64K", "--factor", "32", "--iters", "3", "--warmup", "1"];

/// The number in "N wrong" of `sucl check`'s summary line.
fn check_wrong(out: &Outcome) -> u64 {
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("sucl check:"))
        .unwrap_or_else(|| panic!("no summary line\nstdout: {}\nstderr: {}", out.stdout, out.stderr));
    let before = line.split(" wrong").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"))
}

/// Per JSON row of `sucl bench --json`: (backend, wrong).
fn bench_rows(out: &Outcome) -> Vec<(String, u64)> {
    let rows: Vec<(String, u64)> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let wrong = v["wrong"].as_u64().unwrap_or_else(|| panic!("row without a checked `wrong`: {l}"));
            (v["backend"].as_str().unwrap().to_string(), wrong)
        })
        .collect();
    assert!(!rows.is_empty(), "no rows\nstdout: {}\nstderr: {}", out.stdout, out.stderr);
    rows
}

fn run_sucl(args: &[&str], ranks: usize, backend: &str, fault: Option<&str>) -> Outcome {
    let mut cmd = sucl();
    cmd.args(args).args(["--ranks", &ranks.to_string(), "--backend", backend]).env("SUCL_TIMEOUT", "60").env_remove("SUCL_FAULT_CORRUPT");
    if let Some(f) = fault {
        cmd.env("SUCL_FAULT_CORRUPT", f);
    }
    finish(spawn(cmd), Duration::from_secs(120), &format!("{args:?} on {backend} (fault {fault:?})"))
}

/// check, bench and bench --compare on `backend`, with and without the fault, as `run` runs them.
fn each_command_reports(backend: &str, other: &str, run: impl Fn(&[&str], &str, Option<&str>) -> Outcome) {
    // sucl check.
    let clean = run(CHECK, backend, None);
    assert!(clean.status.success() && check_wrong(&clean) == 0, "clean check:\n{}\n{}", clean.stdout, clean.stderr);
    let bad = run(CHECK, backend, Some(backend));
    assert!(!bad.status.success(), "a corrupted check exited 0:\n{}\n{}", bad.stdout, bad.stderr);
    assert!(check_wrong(&bad) > 0, "a corrupted check reported 0 wrong:\n{}\n{}", bad.stdout, bad.stderr);

    // sucl bench.
    let args: Vec<&str> = BENCH.iter().copied().chain(["--json"]).collect();
    let clean = run(&args, backend, None);
    assert!(clean.status.success(), "clean bench:\n{}\n{}", clean.stdout, clean.stderr);
    assert!(bench_rows(&clean).iter().all(|r| r.1 == 0), "{}", clean.stdout);
    let bad = run(&args, backend, Some(backend));
    assert!(!bad.status.success(), "a corrupted bench exited 0:\n{}\n{}", bad.stdout, bad.stderr);
    assert!(bench_rows(&bad).iter().all(|r| r.1 > 0), "a corrupted bench row reported 0 wrong:\n{}", bad.stdout);

    // sucl bench --compare: the corrupted backend's rows are wrong, the other's are not.
    let list = format!("{backend},{other}");
    let args: Vec<&str> = BENCH.iter().copied().chain(["--json", "--rounds", "1", "--compare", &list]).collect();
    let clean = run(&args, backend, None);
    assert!(clean.status.success(), "clean compare:\n{}\n{}", clean.stdout, clean.stderr);
    assert!(bench_rows(&clean).iter().all(|r| r.1 == 0), "{}", clean.stdout);
    let bad = run(&args, backend, Some(backend));
    assert!(!bad.status.success(), "a corrupted compare exited 0:\n{}\n{}", bad.stdout, bad.stderr);
    let rows = bench_rows(&bad);
    assert!(rows.iter().filter(|r| r.0 == backend).all(|r| r.1 > 0), "{}", bad.stdout);
    assert!(rows.iter().filter(|r| r.0 == other).all(|r| r.1 == 0), "{}", bad.stdout);
}

#[test]
fn shm_faults_are_reported_by_check_bench_and_compare() {
    each_command_reports("shm", "tcp", |args, b, f| run_sucl(args, 3, b, f));
}

#[test]
fn tcp_faults_are_reported_by_check_bench_and_compare() {
    each_command_reports("tcp", "shm", |args, b, f| run_sucl(args, 3, b, f));
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_faults_are_reported_by_check_bench_and_compare() {
    each_command_reports("mpi", "tcp", |args, backend, fault| {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-n", "2", env!("CARGO_BIN_EXE_sucl")])
            .args(args)
            .args(["--backend", backend])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("SUCL_TIMEOUT", "60")
            .env_remove("SUCL_FAULT_CORRUPT");
        if let Some(f) = fault {
            // Ranks started by mpirun on this host inherit its environment.
            cmd.env("SUCL_FAULT_CORRUPT", f);
        }
        finish(spawn(cmd), Duration::from_secs(120), &format!("mpirun {args:?} (fault {fault:?})"))
    });
}

#[test]
fn tune_refuses_to_write_a_table_from_wrong_results() {
    let path = std::env::temp_dir().join(format!("sucl-tune-fault-{}.toml", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut cmd = sucl();
    cmd.args([
        "tune",
        "--ranks",
        "2",
        "--ops",
        "all_reduce",
        "--max-bytes",
        "4K",
        "--factor",
        "64",
        "--iters",
        "2",
        "--rounds",
        "1",
        "--out",
    ])
    .arg(&path)
    .env("SUCL_FAULT_CORRUPT", "tcp")
    .env("SUCL_TIMEOUT", "60");
    let out = finish(spawn(cmd), Duration::from_secs(120), "tune with a corrupted tcp");
    assert!(!out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("WRONG all_reduce") && out.stderr.contains("on tcp"), "{}", out.stderr);
    assert!(!path.exists(), "a table was written from wrong results");
}
