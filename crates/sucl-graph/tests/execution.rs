//! The example programs on 1, 2, 3 and 4 real host ranks (separate processes meeting through
//! the torchrun-style environment) print bit-identical results to one rank.

use std::net::TcpListener;
use std::path::PathBuf;
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

fn example() -> PathBuf {
    // target/<profile>/deps/execution-… → target/<profile>/examples/graph_programs
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples").join("graph_programs")
}

/// Runs the example on `n` ranks; rank 0's stdout. Panics on a failure or after 60 s.
fn run(n: usize) -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut ranks: Vec<Reaped> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(example());
            if n > 1 {
                cmd.env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", n.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            }
            cmd.env("SUCL_TIMEOUT", "20").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            Reaped(cmd.spawn().expect("spawn the graph_programs example (built by cargo test)"))
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
    out
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
