//! The example programs on 1, 2, 3 and 4 real host ranks (separate processes meeting through
//! the torchrun-style environment) print bit-identical results to one rank.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed and reaped when dropped, so a failing test leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[allow(dead_code)]
mod program {
    include!("../examples/graph_programs.rs");
}

/// One rank of the programs: the parent test starts this test binary again, running only this.
#[test]
#[ignore = "a rank of programs_give_identical_results_on_1_to_4_ranks, started by it"]
fn graph_programs_rank() {
    program::run().unwrap();
}

const PROGRAMS: [&str; 4] = ["stencil:", "all:", "master:", "transpose:"];

/// Runs the example on `n` ranks; rank 0's stdout. Panics on a failure or after 60 s.
fn run(n: usize) -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut ranks: Vec<Reaped> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["graph_programs_rank", "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
            if n > 1 {
                cmd.env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", n.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            }
            cmd.env("SUCL_TIMEOUT", "20").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            Reaped(cmd.spawn().expect("start a rank (this test binary again)"))
        })
        .collect();
    let start = Instant::now();
    for (r, c) in ranks.iter_mut().enumerate() {
        loop {
            if let Some(status) = c.0.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
                assert!(status.success(), "{n} ranks: rank {r} failed: {err}");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "{n} ranks: rank {r} still running after 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(ranks[0].0.stdout.as_mut().unwrap(), &mut out).unwrap();
    // Only the programs' lines, not the test harness's ("test graph_programs_rank ... " may
    // precede the first one on its line).
    out.lines().filter_map(|l| PROGRAMS.iter().filter_map(|p| l.find(p)).min().map(|at| format!("{}\n", &l[at..]))).collect()
}

#[test]
fn programs_give_identical_results_on_1_to_4_ranks() {
    let one = run(1);
    assert_eq!(one.lines().count(), 4, "four programs: {one}");
    assert!(one.contains("transpose: 0.0 10.0 20.0 30.0 40.0 50.0 1.0 11.0"), "{one}");
    for n in 2..=4 {
        assert_eq!(run(n), one, "{n} ranks against 1");
    }
}
