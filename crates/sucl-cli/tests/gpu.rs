//! Device buffers: with a CUDA GPU, the device correctness matrix over NCCL and the staged path;
//! without one (CI), `sucl check --device cuda` must fail with a message naming the reason. A
//! skip shows in the test list: `gpu_tests_skipped_no_gpu` passes only where no GPU was found
//! (and fails where one was, since then the GPU tests ran). With `SUCL_REQUIRE_GPU=1` (set by
//! scripts/gpu-check.sh) every skip is a failure.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// The number of CUDA devices `sucl info` lists, and its cuda line.
fn gpus() -> (usize, String) {
    let info = Command::new(env!("CARGO_BIN_EXE_sucl")).arg("info").output().unwrap();
    let text = String::from_utf8_lossy(&info.stdout).into_owned();
    let n = text.lines().filter(|l| l.starts_with("  cuda:")).count();
    let line = text.lines().find(|l| l.trim_start().starts_with("cuda")).unwrap_or("cuda: no line").trim().to_string();
    (n, line)
}

fn gpu_required() -> bool {
    std::env::var("SUCL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Whether the GPU tests may run; without a GPU, fails under SUCL_REQUIRE_GPU=1.
fn gpu_or_skip() -> Option<usize> {
    let (n, line) = gpus();
    if n == 0 {
        assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here: {line}");
        return None;
    }
    Some(n)
}

#[test]
fn gpu_tests_skipped_no_gpu() {
    let (n, line) = gpus();
    assert_eq!(n, 0, "{n} GPUs are present, so the GPU tests ran: this test passes only where they were skipped");
    assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here, so the GPU tests were skipped: {line}");
}

#[test]
fn without_a_gpu_device_check_names_why() {
    let (n, line) = gpus();
    if n > 0 {
        return;
    }
    assert!(line.contains("unavailable"), "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_sucl")).args(["check", "--device", "cuda"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("backend cuda cannot serve") && (err.contains("not found") || err.contains("no devices")), "{err}");
}

#[test]
fn device_check_on_gpus() {
    let Some(gpus) = gpu_or_skip() else { return };
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

/// The raw NCCL baseline is captured into CUDA graphs like sucl's own choices.
#[test]
fn raw_nccl_baseline_replays_from_a_cuda_graph() {
    let Some(gpus) = gpu_or_skip() else { return };
    let ranks = gpus.min(2).to_string();
    let mut cmd = sucl();
    cmd.args(["bench", "all_reduce", "--device", "cuda", "--ranks", &ranks, "--compare", "raw,nccl", "--graph"])
        .args(["--min-bytes", "8", "--max-bytes", "256K", "--factor", "64", "--iters", "20", "--rounds", "1"])
        .env("NCCL_NVLS_ENABLE", "0");
    let out = finish(spawn(cmd), Duration::from_secs(300), "raw baseline under capture");
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
}

/// An NCCL failure says what NCCL said: the call, the code's name, its text and NCCL's last
/// message, never a bare `NcclError`.
#[test]
fn nccl_errors_carry_nccls_own_words() {
    let Some(gpus) = gpu_or_skip() else { return };
    let ranks = gpus.min(2).to_string();
    let mut cmd = sucl();
    cmd.args(["bench", "all_reduce", "--device", "cuda", "--ranks", &ranks, "--backend", "raw", "--max-bytes", "64", "--iters", "2"])
        .env("NCCL_NVLS_ENABLE", "0")
        .env("NCCL_SOCKET_IFNAME", "=sucl-no-such-interface");
    let out = finish(spawn(cmd), Duration::from_secs(120), "NCCL without a socket interface");
    assert!(!out.status.success());
    assert!(out.stderr.contains("rank 0: backend nccl cannot serve: ncclGetUniqueId failed: nccl"), "{}", out.stderr);
    assert!(out.stderr.contains("Bootstrap") && !out.stderr.contains("NcclError"), "{}", out.stderr);
}
