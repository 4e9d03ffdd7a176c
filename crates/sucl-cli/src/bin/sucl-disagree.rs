//! Test helper (not a user command): a black-box client whose ranks call the API with arguments
//! they disagree on, for the multi-process tests in `crates/sucl-cli/tests/disagree.rs` and
//! `tests/mpi.rs`. Every step prints one line — `rank <r> STEP <name> OK|ERR|WRONG ...` — and the process
//! exits 0 whatever the steps returned, so the launcher does not end the other ranks early.
//!
//! Scenarios (`sucl-disagree SCENARIO [OP]`):
//! - `root OP`: OP (broadcast, reduce, gather, scatter) with root `rank % 2`, then a barrier.
//! - `count OP`: OP with root 0 and `4 + rank % 2` elements per rank, then a barrier.
//! - `leftover OP`: OP (broadcast or scatter) with root `rank % 2`, its result ignored, then the
//!   same OP with root 0 on every rank, whose data is checked.
//! - `count-large all_reduce`: a 2-rank-tcp-pair-sized all_reduce (100 000 f32) with one more
//!   element on odd ranks, then a barrier.
//! - `sendrecv-bad-peer`: sendrecv to rank `size` while receiving from itself, then a barrier.
//! - `after-failure`: an all_reduce with `4 + rank % 2` elements, then a broadcast that every
//!   rank calls alike, then an all_reduce of f64 on odd ranks and f32 on even ones, then a
//!   send and receive around a ring.

use std::time::Instant;
use sucl::{Communicator, Error, ReduceOp};

fn kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument { .. } => "InvalidArgument",
        Error::LostPeer { .. } => "LostPeer",
        Error::Timeout { .. } => "Timeout",
        Error::Mismatch { .. } => "Mismatch",
        Error::Unusable { .. } => "Unusable",
        Error::BackendUnavailable { .. } => "BackendUnavailable",
        Error::Config(_) => "Config",
        Error::Protocol { .. } => "Protocol",
        Error::Aborted { .. } => "Aborted",
        Error::Io { .. } => "Io",
    }
}

/// Runs one step and prints its outcome; `check` turns an Ok into WRONG when the data is wrong.
fn step(rank: usize, name: &str, f: impl FnOnce() -> sucl::Result<Option<String>>) {
    let t = Instant::now();
    let r = f();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    match r {
        Ok(None) => println!("rank {rank} STEP {name} OK ({ms:.1} ms)"),
        Ok(Some(wrong)) => println!("rank {rank} STEP {name} WRONG {wrong} ({ms:.1} ms)"),
        Err(e) => println!("rank {rank} STEP {name} ERR {} ({ms:.1} ms): {e}", kind(&e)),
    }
}

/// One rooted collective with `root` and `count` elements per rank; every rank's data is
/// `salt + rank`. Returns what broadcast and scatter received (empty for the others).
fn rooted(comm: &Communicator, op: &str, root: usize, count: usize, salt: f32) -> sucl::Result<Vec<f32>> {
    let (r, n) = (comm.rank(), comm.size());
    let mut mine = vec![salt + r as f32; count];
    match op {
        "broadcast" => comm.broadcast(&mut mine, root).map(|_| mine),
        "reduce" => comm.reduce(&mine, &mut vec![0.0f32; if r == root { count } else { 0 }], ReduceOp::Sum, root).map(|_| vec![]),
        "gather" => comm.gather(&mine, &mut vec![0.0f32; if r == root { count * n } else { 0 }], root).map(|_| vec![]),
        "scatter" => {
            let mut got = vec![0.0f32; count];
            comm.scatter(&vec![salt + r as f32; if r == root { count * n } else { 0 }], &mut got, root).map(|_| got)
        }
        other => Err(Error::invalid(r, "op", format!("unknown op {other}"))),
    }
}

fn main() {
    let comm = match sucl::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sucl-disagree: init failed: {e}");
            std::process::exit(2);
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (r, n) = (comm.rank(), comm.size());
    let op = args.get(1).map(String::as_str).unwrap_or("broadcast");
    println!("backend {} checking {}", comm.backend_name(), comm.checks_collectives());
    match args.first().map(String::as_str) {
        Some("root") => {
            step(r, op, || rooted(&comm, op, r % 2, 4, 100.0).map(|_| None));
            step(r, "barrier-after", || comm.barrier().map(|_| None));
        }
        Some("count") => {
            step(r, op, || rooted(&comm, op, 0, 4 + r % 2, 100.0).map(|_| None));
            step(r, "barrier-after", || comm.barrier().map(|_| None));
        }
        Some("count-large") => {
            step(r, op, || {
                let mut v = vec![1.0f32; 100_000 + r % 2];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|_| None)
            });
            step(r, "barrier-after", || comm.barrier().map(|_| None));
        }
        Some("leftover") => {
            step(r, op, || rooted(&comm, op, r % 2, 4, 100.0).map(|_| None));
            // The same call with root 0 everywhere: its descriptor equals the leftovers' of root
            // 0, so only the tag's sequence number keeps them apart.
            step(r, "again", || {
                let got = rooted(&comm, op, 0, 4, 200.0)?;
                Ok(got.iter().any(|&x| x != 200.0).then(|| format!("received {got:?}, root 0 sent 200.0")))
            });
        }
        Some("after-failure") => {
            step(r, "all_reduce", || comm.all_reduce_in_place(&mut vec![1.0f32; 4 + r % 2], ReduceOp::Sum).map(|_| None));
            step(r, "broadcast", || comm.broadcast(&mut [1.0f32; 4], 0).map(|_| None));
            step(r, "all_reduce-dtype", || match r % 2 {
                0 => comm.all_reduce_in_place(&mut [1.0f32; 4], ReduceOp::Sum).map(|_| None),
                _ => comm.all_reduce_in_place(&mut [1.0f64; 4], ReduceOp::Sum).map(|_| None),
            });
            step(r, "sendrecv", || comm.sendrecv(&[1u32], (r + 1) % n, &mut [0u32], (r + n - 1) % n, 5).map(|_| None));
        }
        Some("sendrecv-bad-peer") => {
            step(r, "sendrecv", || {
                let mut got = [0u32; 1];
                comm.sendrecv(&[1u32], n, &mut got, r, 5).map(|_| None)
            });
            step(r, "barrier-after", || comm.barrier().map(|_| None));
        }
        _ => {
            eprintln!("usage: sucl-disagree root|count|leftover OP | sendrecv-bad-peer | after-failure");
            std::process::exit(2);
        }
    }
}
