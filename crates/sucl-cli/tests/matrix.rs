//! The correctness matrix on real processes: every op × dtype × reduce op × size, point-to-point,
//! in-place forms and split, on both host backends at 1, 2, 3, 4, 5 and 8 ranks, plus 64 MiB
//! collectives. Each world starts once and runs its whole matrix (`sucl check`).

mod common;
use common::*;
use std::time::Duration;

fn check_world(backend: &str, ranks: usize, extra: &[&str]) {
    let mut cmd = sucl();
    cmd.args(["check", "--ranks", &ranks.to_string(), "--backend", backend]).args(extra).env("SUCL_TIMEOUT", "120");
    let out = finish(spawn(cmd), Duration::from_secs(600), &format!("{backend} check with {ranks} ranks"));
    assert!(out.status.success(), "{backend} x{ranks} failed: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let line =
        out.stdout.lines().find(|l| l.contains("sucl check:")).unwrap_or_else(|| panic!("no summary:\n{}\n{}", out.stdout, out.stderr));
    assert!(line.contains(&format!("{ranks} ranks, backend {backend}")), "{line}");
    assert!(line.contains(" 0 wrong"), "{line}");
    assert!(!out.stderr.contains("WRONG"), "{}", out.stderr);
}

#[test]
fn shm_matrix_all_rank_counts() {
    for n in [1, 2, 3, 4, 5, 8] {
        check_world("shm", n, &[]);
    }
}

#[test]
fn tcp_matrix_all_rank_counts() {
    for n in [1, 2, 3, 4, 5, 8] {
        check_world("tcp", n, &[]);
    }
}

#[test]
fn collectives_over_64_mib() {
    for backend in ["shm", "tcp"] {
        check_world(backend, 2, &["--ops", "barrier", "--big-mib", "64"]);
        check_world(backend, 3, &["--ops", "barrier", "--big-mib", "64"]);
    }
}

/// Runs `sucl check ARGS` with `envs` (and a 120 s timeout) and asserts that it found nothing wrong.
fn check_finds_nothing_wrong(args: &[&str], envs: &[(&str, &str)], what: &str) {
    let mut cmd = sucl();
    cmd.arg("check").args(args).envs(envs.iter().copied()).env("SUCL_TIMEOUT", "120");
    let out = finish(spawn(cmd), Duration::from_secs(300), what);
    assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{what}: {}\n{}", out.stdout, out.stderr);
}

#[test]
fn small_arena_forces_many_chunks() {
    // Tiny shared-memory arenas and rings make every op chunk and wrap many times.
    check_finds_nothing_wrong(
        &["--ranks", "3", "--backend", "shm", "--dtypes", "f32,u8,bf16", "--sizes", "0,5,4099,100003"],
        &[("SUCL_SHM_ARENA_BYTES", "16K"), ("SUCL_SHM_RING_BYTES", "4K"), ("SUCL_SHM_SMALL_BYTES", "64")],
        "small arena check",
    );
}

#[test]
fn shm_reductions_either_side_of_the_one_step_cap() {
    // 5 ranks, 16 KiB small size: a reduction reads its 4 peers' whole inputs in one step up to
    // 1.5 × 16 KiB = 24 KiB, so 6144 bytes take the single-barrier path and 6145 (6148 as f32)
    // the two-barrier split.
    check_finds_nothing_wrong(
        &["--ranks", "5", "--backend", "shm", "--ops", "all_reduce,reduce", "--dtypes", "u8,f32", "--sizes", "1536,1537,6144,6145"],
        &[("SUCL_SHM_SMALL_BYTES", "16K")],
        "one-step cap check",
    );
}

#[test]
fn shm_reductions_at_16_ranks_step_by_a_mebibyte() {
    // From 16 ranks a large reduction steps by at least 1 MiB: 262145 and 300001 f32 (just over
    // 1 MiB, and 1.14 MiB) take one full step and a short one.
    check_finds_nothing_wrong(
        &[
            "--ranks",
            "16",
            "--backend",
            "shm",
            "--ops",
            "all_reduce,reduce",
            "--dtypes",
            "f32",
            "--redops",
            "sum,max",
            "--sizes",
            "262145,300001",
        ],
        &[],
        "16-rank reduction steps check",
    );
}

#[test]
fn tcp_small_pieces_and_thresholds() {
    // 2 ranks: the pair all_reduce (tcp_pair.rs) with hundreds of pieces per half, odd halves;
    // 4 ranks: the generic rings and chains.
    for ranks in ["2", "4"] {
        let mut cmd = sucl();
        cmd.args(["check", "--ranks", ranks, "--backend", "tcp", "--dtypes", "f64,i8", "--sizes", "0,2,3,777,100003"])
            .env("SUCL_TCP_SMALL_BYTES", "0")
            .env("SUCL_TCP_PIECE_BYTES", "1K")
            .env("SUCL_TIMEOUT", "120");
        let out = finish(spawn(cmd), Duration::from_secs(300), "tcp piece check");
        assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{ranks} ranks: {}\n{}", out.stdout, out.stderr);
    }
}

#[test]
fn examples_run_under_the_launcher() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_sucl")).parent().unwrap().join("examples/hello_allreduce");
    assert!(exe.exists(), "{} missing: `cargo test --workspace` builds the examples", exe.display());
    let mut cmd = sucl();
    cmd.args(["run", "-n", "3", "--"]).arg(&exe);
    let out = finish(spawn(cmd), Duration::from_secs(120), "hello_allreduce");
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] rank {r}/3 via shm: sum 3")), "{}", out.stdout);
    }
}

#[test]
fn tcp_read_ahead_and_polling_variants() {
    // No read-ahead and no poll first (every read straight into place); a read-ahead just past
    // one header (frames split across it at every size); the largest read-ahead.
    for (ahead, poll) in [("0", "0"), ("48", "1"), ("1M", "2")] {
        let mut cmd = sucl();
        cmd.args(["check", "--ranks", "3", "--backend", "tcp", "--dtypes", "f32,u8", "--sizes", "0,5,4099,100003"])
            .env("SUCL_TCP_READ_AHEAD_BYTES", ahead)
            .env("SUCL_TCP_POLL_FIRST", poll)
            .env("SUCL_TIMEOUT", "120");
        let out = finish(spawn(cmd), Duration::from_secs(300), "tcp read-ahead check");
        let ok = out.status.success() && out.stdout.contains(" 0 wrong") && !out.stderr.contains("WRONG");
        assert!(ok, "read-ahead {ahead}, poll {poll}: {}\n{}", out.stdout, out.stderr);
    }
}
