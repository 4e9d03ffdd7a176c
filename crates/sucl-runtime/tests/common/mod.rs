//! Helpers shared by the multi-process tests of sucl-runtime.

use std::process::Child;

/// A free TCP port on loopback (for the rendezvous store of a test's ranks).
pub fn free_port() -> u16 {
    sucl_runtime::unused_loopback_port().expect("a free port for the store")
}

/// Kills and reaps the child when dropped, so a failing test leaves no process behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the ranks of [`spawn_ranks`]. Waits at most `limit` (then kills them and panics: a hang) and returns each rank's
/// exit status and output (stdout, then stderr).
#[allow(dead_code)] // not every test file uses it
pub fn run_ranks(
    test: &str,
    rank_var: &str,
    n: usize,
    env: &[(&str, &str)],
    limit: std::time::Duration,
) -> Vec<(std::process::ExitStatus, String)> {
    use std::io::Read;
    let mut ranks = spawn_ranks(test, rank_var, n, env);
    let start = std::time::Instant::now();
    let mut done = vec![None; n];
    while done.iter().any(Option::is_none) {
        for (r, c) in ranks.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.0.try_wait().expect("try_wait");
            }
        }
        assert!(start.elapsed() < limit, "{test}: the ranks still run after {limit:?} (a hang)");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    ranks
        .iter_mut()
        .zip(done)
        .map(|(c, status)| {
            let mut out = String::new();
            let _ = c.0.stdout.take().unwrap().read_to_string(&mut out);
            let _ = c.0.stderr.take().unwrap().read_to_string(&mut out);
            (status.unwrap(), out)
        })
        .collect()
}

/// Starts `n` copies of this test binary, each running only `test`, as the ranks of one job
/// (torchrun's variables, rank 0 hosting the store) with `rank_var` set to the rank and `env`
/// added; stdout and stderr piped.
#[allow(dead_code)] // not every test file uses it
pub fn spawn_ranks(test: &str, rank_var: &str, n: usize, env: &[(&str, &str)]) -> Vec<Reaped> {
    use std::process::{Command, Stdio};
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(rank_var, r.to_string())
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_RUN_ID", format!("t{port}"));
            for (k, v) in env {
                cmd.env(k, v);
            }
            Reaped(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).spawn().expect("spawning a rank"))
        })
        .collect()
}
