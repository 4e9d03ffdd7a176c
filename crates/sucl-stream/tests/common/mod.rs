//! Multi-process harness: a test re-runs its own test binary as N ranks (torchrun-style launch
//! environment, a fresh store port), waits for them with a bound and kills them if they hang.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "SUCL_STREAM_TEST_RANK";

/// This process's rank when it runs as a child of [`launch`].
pub fn child_rank() -> Option<usize> {
    std::env::var(ROLE).ok().and_then(|v| v.parse().ok())
}

/// A child killed and reaped on drop, so a failing test leaves nothing behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Outcome {
    pub rank: usize,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

fn free_port() -> u16 {
    sucl_runtime::unused_loopback_port().expect("a free port for the store")
}

/// Runs test `name` of this binary as `n` ranks with `env`; returns every rank's outcome.
/// Panics if any rank still runs after `limit` (a hang is a failure).
pub fn launch(name: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Vec<Outcome> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let job = format!("st{}x{}", std::process::id(), port);
    let mut kids = vec![];
    for r in 0..n {
        let mut c = Command::new(&exe);
        c.args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(ROLE, r.to_string())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("SUCL_JOB_ID", &job)
            .env("SUCL_TIMEOUT", "10")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        kids.push(Reaped(c.spawn().expect("spawning a rank")));
    }
    let start = Instant::now();
    let mut readers = vec![];
    for k in kids.iter_mut() {
        let mut o = k.0.stdout.take().unwrap();
        let mut e = k.0.stderr.take().unwrap();
        readers.push((
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = o.read_to_string(&mut s);
                s
            }),
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = e.read_to_string(&mut s);
                s
            }),
        ));
    }
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    while statuses.iter().any(|s| s.is_none()) {
        for (r, k) in kids.iter_mut().enumerate() {
            if statuses[r].is_none() {
                statuses[r] = k.0.try_wait().unwrap();
            }
        }
        if start.elapsed() > limit {
            drop(kids);
            let outs: Vec<String> = readers.into_iter().map(|(o, e)| format!("{}\n{}", o.join().unwrap(), e.join().unwrap())).collect();
            panic!("{name}: ranks still running after {limit:?} (hang)\n{}", outs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    readers
        .into_iter()
        .zip(statuses)
        .enumerate()
        .map(|(rank, ((o, e), s))| Outcome { rank, status: s.unwrap(), stdout: o.join().unwrap(), stderr: e.join().unwrap() })
        .collect()
}

/// Asserts every rank passed (its test printed `ok` and it exited 0).
pub fn all_passed(outs: &[Outcome]) {
    for o in outs {
        assert!(o.status.success(), "rank {} failed ({}):\n{}\n{}", o.rank, o.status, o.stdout, o.stderr);
    }
}

/// The world and a second communicator for control messages that must not share the queue's.
pub fn world() -> (sucl_runtime::Communicator, sucl_runtime::Communicator) {
    let comm = sucl_runtime::init().expect("init");
    let ctl = comm.split(Some(0), comm.rank() as i64).expect("split").expect("member");
    (comm, ctl)
}

/// Sends a one-byte control token to `to` on `ctl`.
pub fn token(ctl: &sucl_runtime::Communicator, to: usize) {
    ctl.send(&[1u8][..], to, 99).expect("control send");
}

/// Waits for a control token from `from` on `ctl`.
pub fn await_token(ctl: &sucl_runtime::Communicator, from: usize) {
    let mut b = [0u8];
    ctl.recv(&mut b[..], from, 99).expect("control recv");
}

/// Runs `body` as each of `n` ranks (the parent launches them and asserts they all passed).
pub fn run(name: &str, n: usize, env: &[(&str, &str)], body: fn(usize)) {
    match child_rank() {
        Some(rank) => body(rank),
        None => all_passed(&launch(name, n, env, Duration::from_secs(60))),
    }
}

/// Live progress threads of queues in this process (Linux: the kernel keeps the first 15 bytes
/// of a thread's name, "sucl-stream-progress").
pub fn progress_threads() -> usize {
    let named = |e: &std::fs::DirEntry| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == "sucl-stream-pro");
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").filter_map(|e| e.ok()).filter(named).count()
}

/// Whether every GPU test must run (`SUCL_REQUIRE_GPU=1`): a skip is then a failure.
pub fn gpu_required() -> bool {
    std::env::var("SUCL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The number of GPUs, or None (a skip) where there is none; fails under SUCL_REQUIRE_GPU=1.
#[cfg(feature = "cuda")]
pub fn gpus_or_skip() -> Option<usize> {
    match sucl_cuda::probe() {
        Ok(n) => Some(n),
        Err(why) => {
            assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here: {why}");
            None
        }
    }
}
