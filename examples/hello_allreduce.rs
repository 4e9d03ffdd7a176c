//! Every rank contributes its rank number; all_reduce sums them everywhere, then each half of the
//! world (even and odd ranks) sums over its own sub-communicator.
//!
//! Run with: `cargo run --release -p sucl-cli -- run -n 4 -- target/release/examples/hello_allreduce`
//! (build it first with `cargo build --release -p sucl --example hello_allreduce`).

use std::process::ExitCode;

const HELP: &str = "\
hello_allreduce: every rank contributes its rank number to an all_reduce (f64 sum) and checks the
total; then even and odd ranks each sum over their own sub-communicator (split). Prints one line
per rank: its rank, the world size, the backend used and both sums.

Usage: hello_allreduce [--help]
  Ranks come from the launcher: sucl run, torchrun, mpirun, srun or PMI (alone: a world of 1).

Example:
  sucl run -n 4 -- target/release/examples/hello_allreduce";

fn main() -> ExitCode {
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        eprintln!("hello_allreduce: unexpected argument `{arg}` (see --help)");
        return ExitCode::from(2);
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let comm = sucl::init().map_err(|e| e.to_string())?;
    let (rank, size) = (comm.rank(), comm.size());
    let mine = vec![rank as f64; 8];
    let mut sum = vec![0.0; 8];
    comm.all_reduce(&mine, &mut sum, sucl::ReduceOp::Sum).map_err(|e| e.to_string())?;
    let expected = (size * (size - 1) / 2) as f64;
    if sum.iter().any(|&x| x != expected) {
        return Err(format!("rank {rank}: all_reduce gave {sum:?}, expected {expected} everywhere"));
    }

    // Halves of the world: even and odd ranks, each with its own sub-communicator.
    let half = comm.split(Some((rank % 2) as u32), rank as i64).map_err(|e| e.to_string())?;
    let half = half.ok_or_else(|| format!("rank {rank}: split gave no sub-communicator"))?;
    let mut v = [1u32];
    half.all_reduce_in_place(&mut v, sucl::ReduceOp::Sum).map_err(|e| e.to_string())?;
    println!("rank {rank}/{size} via {}: sum {} (my half has {} ranks)", comm.backend_name(), sum[0], v[0]);
    Ok(())
}
