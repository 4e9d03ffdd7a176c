//! The peer-memory (ipc) device backend on 2 GPUs: the correctness matrix with every op its
//! kernels serve (f32, f16, bf16; sum, max, min, avg; 0 elements to 64 MiB, odd counts, slices,
//! one- and two-shot, calls split into pieces), a killed and a stalled rank that end every rank
//! with an error, and NCCL working on the same GPUs afterwards. Without 2 GPUs these tests return
//! early, and with `SUCL_REQUIRE_GPU=1` (scripts/gpu-check.sh, scripts/ipc-check.sh) they fail.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// The number of CUDA devices `sucl info` lists, and its ipc line.
fn gpus() -> (usize, String) {
    let info = Command::new(env!("CARGO_BIN_EXE_sucl")).arg("info").output().unwrap();
    let text = String::from_utf8_lossy(&info.stdout).into_owned();
    let n = text.lines().filter(|l| l.starts_with("  cuda:")).count();
    let ipc = text.lines().find(|l| l.trim_start().starts_with("ipc")).unwrap_or("no ipc line").trim().to_string();
    (n, ipc)
}

/// Whether two GPUs are here; with `SUCL_REQUIRE_GPU=1`, panics instead of skipping.
fn two_gpus() -> bool {
    let (n, ipc) = gpus();
    if n < 2 {
        assert!(std::env::var("SUCL_REQUIRE_GPU").as_deref() != Ok("1"), "SUCL_REQUIRE_GPU=1 but {n} GPUs here ({ipc})");
        return false;
    }
    true
}

fn check(extra_env: &[(&str, &str)], args: &[&str]) -> Outcome {
    let mut cmd = sucl();
    cmd.args(["check", "--device", "cuda", "--ranks", "2"]).args(args).env("NCCL_NVLS_ENABLE", "0");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    finish(spawn(cmd), Duration::from_secs(900), "ipc device check")
}

fn assert_clean(out: &Outcome, what: &str) {
    assert!(
        out.status.success() && out.stdout.contains(" 0 wrong") && !out.stderr.contains("WRONG"),
        "{what}\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
}

const OPS: &[&str] =
    &["--ops", "all_reduce,broadcast,all_gather,reduce_scatter", "--dtypes", "f32,f16,bf16", "--redops", "sum,max,min,avg"];

#[test]
fn ipc_is_set_up_on_two_gpus_and_info_says_so() {
    if !two_gpus() {
        return;
    }
    let (_, ipc) = gpus();
    assert!(ipc.starts_with("ipc   available"), "{ipc}");
}

#[test]
fn ipc_matrix_every_op_dtype_and_redop_up_to_64_mib() {
    if !two_gpus() {
        return;
    }
    let mut args = OPS.to_vec();
    args.extend(["--device-backends", "ipc", "--big-mib", "64"]);
    let out = check(&[], &args);
    assert_clean(&out, "ipc matrix (default buffer and two-shot threshold)");
    assert!(out.stdout.contains("device backends nccl,ipc,staged"), "{}", out.stdout);
}

#[test]
fn ipc_matrix_two_shot_everywhere_and_small_pieces() {
    if !two_gpus() {
        return;
    }
    // Two-shot from 16 bytes on, and a 64 KiB data area: every size above it runs in pieces.
    let mut args = OPS.to_vec();
    args.extend(["--device-backends", "ipc", "--big-mib", "3"]);
    let out = check(&[("SUCL_IPC_TWO_SHOT_BYTES", "16"), ("SUCL_IPC_BUFFER_BYTES", "65536")], &args);
    assert_clean(&out, "ipc matrix (two-shot, 64 KiB pieces)");
}

#[test]
fn ipc_forced_serves_what_it_can_and_the_rest_falls_back() {
    if !two_gpus() {
        return;
    }
    // Every op and an integer type: ipc where its kernels serve, NCCL for the rest, all right.
    let out = check(
        &[("SUCL_IPC", "force")],
        &["--device-backends", "ipc", "--ops", "all_reduce,reduce,all_to_all,gather", "--dtypes", "f32,i32", "--redops", "sum,prod"],
    );
    assert_clean(&out, "SUCL_IPC=force with ops it lacks");
}

#[test]
fn ipc_off_leaves_it_out_and_says_why() {
    if !two_gpus() {
        return;
    }
    let out = check(&[("SUCL_IPC", "off")], &["--device-backends", "ipc", "--ops", "all_reduce", "--dtypes", "f32", "--redops", "sum"]);
    assert!(!out.status.success(), "asking for ipc that is disabled must fail: {}", out.stdout);
    assert!(out.stderr.contains("backend ipc cannot serve") && out.stderr.contains("disabled by the configuration"), "{}", out.stderr);
}

/// Starts two ranks of `sucl check` directly (torchrun's variables, rank 0 hosting the store) so
/// that no launcher ends the survivor first; returns rank 0's outcome (rank 1 is killed after).
fn fault_pair(inject: &str, timeout_s: &str, limit: Duration) -> Outcome {
    let port = free_port().to_string();
    let mut ranks = vec![];
    for r in 0..2 {
        let mut cmd = sucl();
        cmd.args(["check", "--device", "cuda", "--device-backends", "ipc", "--ops", "all_reduce", "--dtypes", "f32", "--redops", "sum"])
            .args([inject, "1", "--inject-after", "3"])
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("SUCL_TIMEOUT", timeout_s)
            .env("NCCL_NVLS_ENABLE", "0");
        ranks.push(spawn(cmd));
    }
    let mut it = ranks.into_iter();
    let (r0, r1) = (it.next().unwrap(), it.next().unwrap());
    let out = finish(r0, limit, "rank 0 of a fault run");
    drop(r1);
    out
}

/// NCCL on both GPUs still works after a fault run (no GPU left hung or in an error state).
fn nccl_still_works() {
    let out = check(&[], &["--device-backends", "nccl", "--ops", "all_reduce", "--dtypes", "f32", "--redops", "sum", "--big-mib", "0"]);
    assert_clean(&out, "an NCCL check after the fault run");
}

#[test]
fn ipc_killed_rank_is_an_error_on_the_survivor_then_nccl_works() {
    if !two_gpus() {
        return;
    }
    let out = fault_pair("--inject-kill", "30", Duration::from_secs(120));
    assert!(!out.status.success(), "the survivor must fail: {}", out.stdout);
    assert!(out.stderr.contains("rank 0: lost peer rank 1"), "{}", out.stderr);
    nccl_still_works();
}

#[test]
fn ipc_stalled_rank_times_out_on_the_waiting_rank_then_nccl_works() {
    if !two_gpus() {
        return;
    }
    let out = fault_pair("--inject-stall", "5", Duration::from_secs(60));
    assert!(!out.status.success(), "the waiting rank must fail: {}", out.stdout);
    assert!(out.stderr.contains("rank 0: ") && out.stderr.contains("timed out after"), "{}", out.stderr);
    nccl_still_works();
}
