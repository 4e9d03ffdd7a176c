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
