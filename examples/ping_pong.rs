//! Ranks 0 and 1 bounce a message and report the one-way time (OSU latency style).
//!
//! Run with: `target/release/sucl run -n 2 -- target/release/examples/ping_pong`

use std::process::ExitCode;
use std::time::Instant;

const HELP: &str = "\
ping_pong: ranks 0 and 1 bounce a message of 8 B, 1 KiB, 64 KiB and 1 MiB (send, then receive
the reply) and rank 0 prints the one-way time per size (half the mean round trip) and the backend.
Needs at least 2 ranks; ranks from 2 on only take part in the barriers.

Usage: ping_pong [--iters N] [--help]
  --iters N   round trips per size (default 200)

Example:
  sucl run -n 2 -- target/release/examples/ping_pong --iters 1000";

fn main() -> ExitCode {
    let iters = match parse_args() {
        Ok(Some(n)) => n,
        Ok(None) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ping_pong: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    match run(iters) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ping_pong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The round trips per size, or `None` when help was asked for.
fn parse_args() -> Result<Option<usize>, String> {
    let mut iters = 200;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--iters" => {
                let v = args.next().ok_or("--iters needs a number")?;
                iters = v.parse().ok().filter(|&n| n > 0).ok_or(format!("--iters `{v}` is not a positive number"))?;
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(Some(iters))
}

fn run(iters: usize) -> Result<(), String> {
    let comm = sucl::init().map_err(|e| e.to_string())?;
    if comm.size() < 2 {
        return Err(format!("needs at least 2 ranks, got {} (start it with `sucl run -n 2 -- ...`)", comm.size()));
    }
    let rank = comm.rank();
    for bytes in [8usize, 1024, 65536, 1 << 20] {
        let mut buf = vec![0u8; bytes];
        comm.barrier().map_err(|e| e.to_string())?;
        let t = Instant::now();
        for _ in 0..iters {
            let step = match rank {
                0 => comm.send(&buf, 1, 7).and_then(|_| comm.recv(&mut buf, 1, 7).map(|_| ())),
                1 => comm.recv(&mut buf, 0, 7).and_then(|_| comm.send(&buf, 0, 7)),
                _ => Ok(()),
            };
            step.map_err(|e| e.to_string())?;
        }
        if rank == 0 {
            let half_rtt = t.elapsed().as_secs_f64() / iters as f64 / 2.0 * 1e6;
            println!("{bytes:>8} B  one-way {half_rtt:8.2} µs  via {}", comm.backend_name());
        }
    }
    Ok(())
}
