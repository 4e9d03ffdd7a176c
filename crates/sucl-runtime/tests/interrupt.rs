//! `Communicator::interruptible`: a rank blocked in a receive that never comes is interrupted
//! by its check; it aborts the job, its later calls fail, and the peer blocked on it gets the
//! error instead of waiting for its timeout. Two real processes (torchrun's variables, rank 0
//! hosting the store) over shm and tcp.
//!
//! The test re-runs its own binary as the two ranks: with `SUCL_INT_TEST_RANK` set it is a
//! rank, otherwise it is the parent that starts both and checks their outcome.

mod common;
use common::{free_port, Reaped};
use std::cell::Cell;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
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
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let mut ranks: Vec<Reaped> = (0..2)
        .map(|r| {
            let child = Command::new(&exe)
                .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
                .env("SUCL_INT_TEST_RANK", r.to_string())
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_RUN_ID", format!("int{port}"))
                .env("SUCL_BACKENDS", "shm,tcp")
                // Long enough that a wait the check failed to end shows as a timeout.
                .env("SUCL_TIMEOUT", "30")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .stdin(Stdio::null())
                .spawn()
                .expect("spawning a rank");
            Reaped(child)
        })
        .collect();
    let start = Instant::now();
    let mut done = [None, None];
    while done.iter().any(Option::is_none) {
        for (r, c) in ranks.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.0.try_wait().expect("try_wait");
            }
        }
        assert!(start.elapsed() < Duration::from_secs(90), "the ranks hang");
        std::thread::sleep(Duration::from_millis(10));
    }
    for (r, c) in ranks.iter_mut().enumerate() {
        let mut out = String::new();
        let _ = c.0.stdout.take().unwrap().read_to_string(&mut out);
        let _ = c.0.stderr.take().unwrap().read_to_string(&mut out);
        let status = done[r].unwrap();
        assert!(status.success() && out.contains(&format!("RANK {r} OK")), "rank {r} failed ({status}):\n{out}");
    }
}
