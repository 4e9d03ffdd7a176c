//! Device buffers: with a CUDA GPU, the device correctness matrix over NCCL and the staged path;
//! without one (CI), `sucl check --device cuda` must fail with a message naming the reason, and
//! this test says it skipped the GPU part. scripts/gpu-check.sh runs the full GPU suite and
//! fails instead of skipping.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn device_check_runs_or_names_why_not() {
    let info = Command::new(env!("CARGO_BIN_EXE_sucl")).arg("info").output().unwrap();
    let text = String::from_utf8_lossy(&info.stdout).into_owned();
    let gpus = text.lines().filter(|l| l.starts_with("  cuda:")).count();
    if gpus == 0 {
        let line = text.lines().find(|l| l.trim_start().starts_with("cuda")).unwrap_or("cuda: no line").trim().to_string();
        eprintln!("skipping the GPU part: {line}");
        assert!(line.contains("unavailable"), "{text}");
        let out = Command::new(env!("CARGO_BIN_EXE_sucl")).args(["check", "--device", "cuda"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("backend cuda cannot serve") && (err.contains("not found") || err.contains("no devices")), "{err}");
        return;
    }
    let ranks = gpus.min(2).to_string();
    let mut cmd = sucl();
    cmd.args([
        "check",
        "--device",
        "cuda",
        "--ranks",
        &ranks,
        "--ops",
        "all_reduce,broadcast,all_gather,all_to_all",
        "--dtypes",
        "f32,bf16",
        "--redops",
        "sum",
    ])
    .env("NCCL_NVLS_ENABLE", "0");
    let out = finish(spawn(cmd), Duration::from_secs(600), "device check");
    assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{}\n{}", out.stdout, out.stderr);
}
