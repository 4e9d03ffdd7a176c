//! Non-blocking requests remember the backend they were posted on: a request posted while one
//! backend is pinned is waited for, tested and finished on that backend after the pin changed.
//! Two real processes (torchrun's variables, rank 0 hosting the store) with shm and tcp loaded.
//!
//! The test re-runs its own binary as the two ranks: with `SUCL_REQ_TEST_RANK` set it is a
//! rank, otherwise it is the parent that starts both and checks their outcome.

mod common;
use common::run_ranks;
use std::time::Duration;
use sucl_runtime::{Communicator, Error, Result};

const TEST_NAME: &str = "requests_complete_on_the_backend_they_were_posted_on";
const N: usize = 4099;

fn payload(phase: u64) -> Vec<u64> {
    (0..N as u64).map(|i| (phase << 32) | (i * 7 + 1)).collect()
}

/// Rank 0 posts a receive under one pin, switches the pin, then completes the receive; rank 1
/// sends on the backend rank 0 posted on. Each phase ends with a barrier on automatic selection.
fn rank_main(comm: &Communicator) -> Result<()> {
    let loaded = comm.backends();
    if !(loaded.contains(&"shm") && loaded.contains(&"tcp")) {
        return Err(Error::Config(format!("this test needs shm and tcp loaded, got {loaded:?}")));
    }
    let phases: [(&str, &str, u64); 3] = [("shm", "tcp", 1), ("tcp", "shm", 2), ("shm", "tcp", 3)];
    for (posted_on, pinned_later, phase) in phases {
        let want = payload(phase);
        if comm.rank() == 0 {
            let mut got = vec![0u64; N];
            comm.pin_backend(Some(posted_on))?;
            let n = comm.nonblocking(|s| {
                let mut r = s.irecv(&mut got, 1, 7)?;
                comm.pin_backend(Some(pinned_later))?;
                match phase {
                    // Request::wait
                    1 => r.wait(),
                    // Request::test, polled until complete
                    2 => loop {
                        if let Some(n) = r.test()? {
                            break Ok(n);
                        }
                        std::thread::yield_now();
                    },
                    // Left to the end of the scope
                    _ => Ok(N),
                }
            })?;
            if n != N || got != want {
                let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                return Err(Error::Config(format!("phase {phase}: received {n} elements, {wrong} of {N} wrong")));
            }
        } else {
            comm.pin_backend(Some(posted_on))?;
            comm.send(&want, 0, 7)?;
        }
        comm.pin_backend(None)?;
        comm.barrier()?;
    }
    Ok(())
}

#[test]
fn requests_complete_on_the_backend_they_were_posted_on() {
    if let Ok(rank) = std::env::var("SUCL_REQ_TEST_RANK") {
        let comm = sucl_runtime::init().expect("init");
        assert_eq!(comm.rank().to_string(), rank);
        if let Err(e) = rank_main(&comm) {
            panic!("RANK FAILED: {e}");
        }
        println!("RANK {rank} OK");
        return;
    }
    let env = [("SUCL_BACKENDS", "shm,tcp"), ("SUCL_TIMEOUT", "20")];
    for (r, (status, out)) in run_ranks(TEST_NAME, "SUCL_REQ_TEST_RANK", 2, &env, Duration::from_secs(60)).into_iter().enumerate() {
        assert!(status.success() && out.contains(&format!("RANK {r} OK")), "rank {r} failed ({status}):\n{out}");
    }
}
