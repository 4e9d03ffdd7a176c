//! `Communicator::interruptible`: a rank blocked in a receive that never comes is interrupted
//! by its check; it aborts the job, its later calls fail, and the peer blocked on it gets the
//! error instead of waiting for its timeout. Two real processes (torchrun's variables, rank 0
//! hosting the store) over shm and tcp.
//!
//! The test re-runs its own binary as the two ranks: with `SUCL_INT_TEST_RANK` set it is a
//! rank, otherwise it is the parent that starts both and checks their outcome.

mod common;
use common::run_ranks;
use std::cell::Cell;
use std::time::Duration;
use sucl_runtime::{Communicator, Error};

const TEST_NAME: &str = "an_interrupted_wait_aborts_the_job_on_every_rank";

/// Each rank receives from the other, which never sends: both block until the interrupt.
fn rank_main(comm: &Communicator) -> Result<String, String> {
    let mut buf = [0u32; 4];
    let peer = 1 - comm.rank();
    if comm.rank() == 1 {
        return match comm.recv(&mut buf[..], peer, 5) {
            Err(e @ Error::Aborted { .. }) if e.to_string().contains("rank 0 was interrupted") => Ok(format!("peer saw: {e}")),
            other => Err(format!("the peer's receive ended with {other:?}")),
        };
    }
    let asked = Cell::new(0u32);
    let check = || {
        asked.set(asked.get() + 1);
        asked.get() >= 3
    };
    let r = comm.interruptible(&check, || comm.recv(&mut buf[..], peer, 5));
    match r {
        Err(e @ Error::Aborted { .. }) if e.to_string().contains("rank 0 was interrupted") => {}
        other => return Err(format!("the interrupted receive ended with {other:?} after {} checks", asked.get())),
    }
    if asked.get() != 3 {
        return Err(format!("the check was asked {} times, not 3", asked.get()));
    }
    match comm.barrier() {
        Err(e @ Error::Aborted { .. }) if e.to_string().contains("rank 0 was interrupted") => Ok(format!("later call: {e}")),
        other => Err(format!("a call after the interrupt returned {other:?}")),
    }
}

#[test]
fn an_interrupted_wait_aborts_the_job_on_every_rank() {
    if let Ok(rank) = std::env::var("SUCL_INT_TEST_RANK") {
        let comm = sucl_runtime::init().expect("init");
        assert_eq!(comm.rank().to_string(), rank);
        match rank_main(&comm) {
            Ok(seen) => println!("RANK {rank} OK: {seen}"),
            Err(why) => panic!("RANK FAILED: {why}"),
        }
        // Stay until the peer has seen the abort through the store (it then exits too).
        std::thread::sleep(Duration::from_millis(500));
        return;
    }
    // SUCL_TIMEOUT: long enough that a wait the check failed to end shows as a timeout.
    let env = [("SUCL_BACKENDS", "shm,tcp"), ("SUCL_TIMEOUT", "30")];
    for (r, (status, out)) in run_ranks(TEST_NAME, "SUCL_INT_TEST_RANK", 2, &env, Duration::from_secs(90)).into_iter().enumerate() {
        assert!(status.success() && out.contains(&format!("RANK {r} OK")), "rank {r} failed ({status}):\n{out}");
    }
}
