//! The correctness matrix over the MPI backend, under the system's mpirun. Built only with the
//! `mpi` feature (`cargo test -p sucl-cli --features mpi --test mpi`), where MPI must be present.
#![cfg(feature = "mpi")]

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

fn mpirun(n: usize, args: &[&str]) -> Outcome {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", &n.to_string(), env!("CARGO_BIN_EXE_sucl")])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SUCL_TIMEOUT", "120");
    finish(spawn(cmd), Duration::from_secs(600), &format!("mpirun -n {n}"))
}

#[test]
fn mpi_backend_matrix() {
    for n in [1, 2, 3, 4] {
        let out = mpirun(n, &["check", "--backend", "mpi"]);
        assert!(out.status.success(), "n={n}\n{}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains(&format!("{n} ranks, backend mpi:")) && out.stdout.contains(" 0 wrong"), "{}", out.stdout);
    }
    let out = mpirun(2, &["check", "--backend", "mpi", "--ops", "barrier", "--big-mib", "64"]);
    assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{}\n{}", out.stdout, out.stderr);
}

#[test]
fn auto_selection_under_mpirun_loads_mpi_beside_shm_and_tcp() {
    let out = mpirun(2, &["check", "--ops", "all_reduce", "--dtypes", "f32"]);
    assert!(out.status.success(), "{}", out.stderr);
    let out = mpirun(2, &["bench", "all_reduce", "--max-bytes", "64", "--iters", "2"]);
    assert!(out.status.success() && out.stdout.contains("loaded: shm, tcp, mpi"), "{}\n{}", out.stdout, out.stderr);
}

/// `sucl check` over mpi on 2 ranks under mpirun, rank 1 stalling after check operation
/// `after`, `SUCL_TIMEOUT=2`: the outcome and its stdout and stderr together, after checking
/// that the stall was injected.
fn stalled_mpi_check(after: &str) -> (Outcome, String) {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", "2", env!("CARGO_BIN_EXE_sucl")])
        .args(["check", "--backend", "mpi", "--ops", "all_reduce", "--dtypes", "f32", "--redops", "sum"])
        .args(["--inject-stall", "1", "--inject-after", after])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SUCL_TIMEOUT", "2");
    let out = finish(spawn(cmd), Duration::from_secs(60), "mpirun -n 2 with a stalled rank");
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("injected fault: rank 1 stops answering"), "the stall was not injected:\n{all}");
    (out, all)
}

/// A rank that never joins a collective: the waiting rank's MPI collective times out, and
/// since MPI would go on writing into the buffers it was lent, the job is ended (MPI_Abort)
/// instead of the buffers being handed back. Rank 1 stalls for 120 s; the job must end long
/// before that, with the error printed and MPI_Abort's exit code. (Check operation 7 is the
/// first all_reduce that moves data: 4 sendrecv rounds, the tag test and an empty all_reduce
/// come before it.)
#[test]
fn timed_out_mpi_collective_aborts_the_job_instead_of_returning_its_buffers() {
    let (out, all) = stalled_mpi_check("7");
    assert!(all.contains("rank 0: all_reduce (mpi) timed out after"), "rank 0 must report its timeout:\n{all}");
    assert!(all.contains("so the job is ended (MPI_Abort, code 75)"), "rank 0 must end the job:\n{all}");
    assert!(!out.status.success(), "the job must fail:\n{all}");
}

/// A point-to-point receive from a rank that stopped answering: the request is cancelled
/// (MPI_Cancel, then completed) and the timeout comes back to the caller as an error; since the
/// job failed, the teardown ends it with MPI_Abort instead of waiting in MPI_Finalize for the
/// stalled rank (120 s).
#[test]
fn timed_out_mpi_receive_is_cancelled_and_the_failed_job_ends_without_waiting_in_finalize() {
    let (out, all) = stalled_mpi_check("2");
    assert!(all.contains("sucl check: error: rank 0: receive (mpi) timed out after"), "the error must reach the caller:\n{all}");
    assert!(!all.contains("cancelling a receive"), "the cancel must complete:\n{all}");
    assert!(all.contains("so the job is ended (MPI_Abort, code 75)"), "the failed job must end at teardown:\n{all}");
    assert!(!out.status.success(), "the job must fail:\n{all}");
}

/// With the checking mode, MPI ranks that disagree on the root of each rooted collective get
/// Mismatch on every rank (MPI itself cannot tell), and the communicator stays poisoned.
#[test]
fn checking_mode_reports_root_disagreement_on_every_rank_mpi() {
    for op in ["broadcast", "reduce", "gather", "scatter"] {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-n", "3", env!("CARGO_BIN_EXE_sucl-disagree"), "root", op])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("SUCL_BACKEND", "mpi")
            .env("SUCL_CHECK_COLLECTIVES", "1")
            // Low, so that a disagreement found only by a timeout fails fast (and as Timeout).
            .env("SUCL_TIMEOUT", "5");
        let out = finish(spawn(cmd), Duration::from_secs(120), &format!("mpirun sucl-disagree root {op}"));
        assert!(out.status.success(), "{op}: {}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("backend mpi checking true"), "{}", out.stdout);
        for (r, steps) in steps_by_rank(3, &out.stdout).iter().enumerate() {
            assert_eq!(steps.len(), 2, "{op}: rank {r}: {steps:?}");
            for s in steps {
                assert!(s.contains("ERR Mismatch") && s.contains("root (0 on ranks 0, 2; 1 on rank 1)"), "{op}: rank {r}: {s}");
            }
        }
    }
}

/// V-collectives over MPI's native MPI_I*v under mpirun (1–4 ranks), against the serial
/// references of `sucl check`, and a rank with a different counts table: a Mismatch on every
/// rank before MPI is called.
#[test]
fn mpi_v_collectives_and_counts_mismatch() {
    for n in [1, 2, 3, 4] {
        let out = mpirun(n, &["check", "--backend", "mpi", "--ops", "barrier", "--sizes", "1"]);
        assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "n={n}\n{}\n{}", out.stdout, out.stderr);
    }
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", "3", env!("CARGO_BIN_EXE_sucl")])
        .args(["check", "--backend", "mpi", "--ops", "barrier", "--sizes", "1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SUCL_CHECK_V_MISMATCH", "2")
        .env("SUCL_TIMEOUT", "20");
    let out = finish(spawn(cmd), Duration::from_secs(120), "mpirun -n 3 with a differing counts table");
    assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{}\n{}", out.stdout, out.stderr);
    for r in 0..3 {
        for op in ["Gatherv", "AllToAllv"] {
            let want = format!("v-mismatch detected: rank {r}: ranks disagree on {op}");
            assert!(out.stderr.contains(&want), "rank {r} did not report the {op} mismatch:\n{}", out.stderr);
        }
    }
}
