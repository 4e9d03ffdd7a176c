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
/// since MPI would go on writing into the buffers it was given, the job is ended (MPI_Abort)
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
/// Mismatch on every rank (MPI itself cannot tell), and the communicator stays poisoned: the
/// next call is refused as Unusable, quoting it.
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
            let what = "root (0 on ranks 0, 2; 1 on rank 1)";
            assert!(steps[0].contains("ERR Mismatch") && steps[0].contains(what), "{op}: rank {r}: {steps:?}");
            let refusal = format!("barrier refused: this communicator is unusable since its {op} failed with ");
            assert!(
                steps[1].contains("ERR Unusable") && steps[1].contains(&refusal) && steps[1].contains(what),
                "{op}: rank {r}: {steps:?}"
            );
        }
    }
}

/// `mpirun -n 2` of `sucl ARGS` through `wrapper` (a shell snippet run by `sh -c` before
/// `exec "$@"`), with no MASTER_ADDR anywhere and `envs` set.
fn mpirun_wrapped(wrapper: &str, args: &[&str], envs: &[(&str, &str)], limit: u64) -> Outcome {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", "2", "sh", "-c", &format!("{wrapper}\nexec \"$@\""), "sh", env!("CARGO_BIN_EXE_sucl")])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .env_remove("SUCL_STORE_ADDR")
        .env("SUCL_TIMEOUT", "30");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    finish(spawn(cmd), Duration::from_secs(limit), &format!("mpirun -n 2 {args:?} through {wrapper:?}"))
}

/// What the launcher tells each rank when it is alone on its host (of 2).
const TWO_HOSTS: &str = "export OMPI_COMM_WORLD_LOCAL_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_MCA_orte_num_nodes=2";

/// Ranks the launcher places on two hosts, with no MASTER_ADDR and no Slurm host list: without
/// MPI that is an error at init ("set MASTER_ADDR"); with it, rank 0's store address travels
/// over MPI. Here the two "hosts" share a host name, so the all_gather of host names finds one
/// host and the store stays on loopback.
#[test]
fn ranks_on_several_hosts_meet_over_mpi_without_master_addr() {
    let out = mpirun_wrapped(TWO_HOSTS, &["check", "--ops", "all_reduce,broadcast", "--dtypes", "f32"], &[], 120);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("2 ranks, backend auto:") && out.stdout.contains(" 0 wrong"), "{}\n{}", out.stdout, out.stderr);
}

/// As above, but each rank in its own UTS namespace with its own host name (`unshare --uts`,
/// where creating namespaces is permitted): the store must now be reachable from "other hosts",
/// so rank 0 listens beyond loopback (the store logs it) and shm is not used between "hosts".
#[test]
fn ranks_with_different_host_names_meet_over_mpi_at_a_routable_address() {
    let probe = Command::new("unshare").args(["--uts", "true"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: `unshare --uts` is not permitted here");
        return;
    }
    let wrapper =
        format!("{TWO_HOSTS}\nexec unshare --uts sh -c 'hostname \"sucl-test-host-$OMPI_COMM_WORLD_RANK\" && exec \"$@\"' sh \"$@\"");
    let out =
        mpirun_wrapped(&wrapper, &["bench", "all_reduce", "--max-bytes", "64", "--iters", "2"], &[("RUST_LOG", "sucl_core=info")], 120);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("rendezvous store listening beyond this host"), "the store must listen beyond loopback:\n{}", out.stderr);
    assert!(out.stdout.contains("loaded: tcp, mpi"), "two hosts: no shm between them\n{}", out.stdout);
}

/// Rank 0 cannot start the store (the only port it may use is taken): every rank fails at init
/// with rank 0's reason, at once, instead of waiting for a store that never comes.
#[test]
fn a_store_rank0_cannot_start_fails_every_rank_over_mpi() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let range = format!("{port}-{port}");
    let out = mpirun_wrapped(TWO_HOSTS, &["check", "--ops", "all_reduce"], &[("SUCL_PORT_RANGE", &range)], 60);
    assert!(!out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("rank 0: I/O error during starting the rendezvous store"), "rank 0's own error:\n{all}");
    assert!(
        all.contains("rank 1") && all.contains("rank 0 could not start the rendezvous store"),
        "rank 1 must get rank 0's reason:\n{all}"
    );
    drop(taken);
}

/// A rank killed in the middle of a collective, under a launcher that lets the job go on
/// (`mpirun --enable-recovery`, as srun without --kill-on-bad-exit does): the store reports the
/// lost rank, and since the waiting rank is inside MPI's blocking call, its watchdog ends the
/// job with the error naming the lost rank — long before the 60 s timeout.
#[test]
fn a_rank_killed_mid_collective_ends_the_job_with_a_lost_peer_error_mpi() {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--enable-recovery", "-n", "2", env!("CARGO_BIN_EXE_sucl")])
        .args(["check", "--backend", "mpi", "--ops", "all_reduce", "--dtypes", "f32", "--redops", "sum"])
        .args(["--inject-kill", "1", "--inject-after", "7"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SUCL_TIMEOUT", "60");
    let out = finish(spawn(cmd), Duration::from_secs(120), "mpirun --enable-recovery with a killed rank");
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("injected fault: rank 1 kills itself"), "the kill was not injected:\n{all}");
    assert!(all.contains("rank 0: lost peer rank 1 during all_reduce (mpi)"), "rank 0 must name the lost rank:\n{all}");
    assert!(all.contains("so the job is ended (MPI_Abort, code 75)"), "{all}");
}

/// `sucl bench --compare` measures the mpi backend (blocking and non-blocking collectives)
/// beside MPI called directly, every row of each checked against the serial reference.
#[test]
fn compare_measures_mpi_beside_raw_mpi_and_checks_every_choice() {
    for op in ["all_reduce", "broadcast", "all_gather", "reduce", "gather", "scatter", "all_to_all", "reduce_scatter", "barrier"] {
        let out = mpirun(
            2,
            &[
                "bench",
                op,
                "--compare",
                "mpi,raw-mpi,mpi-nonblocking",
                "--min-bytes",
                "8",
                "--max-bytes",
                "64K",
                "--factor",
                "64",
                "--iters",
                "3",
                "--warmup",
                "1",
                "--rounds",
                "1",
                "--json",
            ],
        );
        assert!(out.status.success(), "{op}: {}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("mpi/raw"), "{op}: the table must show the ratio to raw MPI\n{}", out.stdout);
        let rows: Vec<serde_json::Value> =
            out.stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
        let sizes = if op == "barrier" { 1 } else { 3 };
        for choice in ["mpi", "raw-mpi", "mpi-nonblocking"] {
            let mine: Vec<&serde_json::Value> = rows.iter().filter(|r| r["backend"] == choice).collect();
            assert_eq!(mine.len(), sizes, "{op} {choice}: {}", out.stdout);
            assert!(mine.iter().all(|r| r["wrong"] == 0), "{op} {choice}: every row checked and right\n{}", out.stdout);
        }
    }
}

/// Without the checking mode, 2 ranks that disagree on a gather's or a reduce's count (rank 1
/// sends 5 elements where the root expects 4): MPI tells the root its message was truncated,
/// and the root gets Mismatch, not an MPI error, and stays poisoned (its barrier is refused as
/// Unusable, quoting the Mismatch). Rank 1 has returned Ok
/// (its send completed); it must not carry on silently: its next call returns the Mismatch (the
/// root's abort reached it first) or, if it already waits inside MPI's barrier, which the
/// poisoned root never joins, the job ends naming the disagreement. Never a Timeout. (Whether
/// MPI notices at all depends on its algorithm: on 3 ranks Open MPI 4.1's gather does not.)
#[test]
fn count_disagreement_without_checking_is_a_mismatch_not_an_mpi_error() {
    for op in ["gather", "reduce"] {
        count_disagreement_without_checking(op);
    }
}

fn count_disagreement_without_checking(op: &str) {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", "2", env!("CARGO_BIN_EXE_sucl-disagree"), "count", op])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SUCL_BACKEND", "mpi")
        .env("SUCL_CHECK_COLLECTIVES", "0")
        .env("SUCL_TIMEOUT", "20");
    let out = finish(spawn(cmd), Duration::from_secs(120), &format!("mpirun sucl-disagree count {op}"));
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("backend mpi checking false"), "{all}");
    let ranks = steps_by_rank(2, &out.stdout);
    let root = &ranks[0];
    assert!(
        root.len() == 2
            && root[0].contains("ERR Mismatch")
            && root[1].contains("ERR Unusable")
            && root.iter().all(|s| s.contains(&format!("the count of {op}"))),
        "{op}: root: {root:?}\n{all}"
    );
    for (r, steps) in ranks.iter().enumerate().skip(1) {
        let after = steps.iter().find(|s| s.starts_with("barrier-after"));
        match after {
            Some(s) => assert!(s.contains("ERR Mismatch") && s.contains(&format!("the count of {op}")), "{op}: rank {r}: {steps:?}\n{all}"),
            // Ended inside MPI: by its own watchdog, another's, or the root's teardown (which
            // ends a failed job rather than wait in MPI_Finalize); each names the disagreement.
            None => assert!(
                all.contains(&format!("ranks disagree on the count of {op}")) && all.contains("so the job is ended (MPI_Abort, code 75)"),
                "{op}: rank {r} neither got the Mismatch nor was the job ended naming it: {steps:?}\n{all}"
            ),
        }
    }
    assert!(!all.contains("timed out"), "{op}: {all}");
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
