//! Helpers for the multi-process tests: bounded waits, reaping, and leak checks.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn sucl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sucl"))
}

/// A child that is killed and reaped when dropped, so a failing test leaves nothing behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Waits at most `limit` for the child, then kills it and panics (a hang is a failure).
pub fn finish(mut c: Reaped, limit: Duration, what: &str) -> Outcome {
    let start = Instant::now();
    let mut out = c.0.stdout.take();
    let mut err = c.0.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    loop {
        if let Some(status) = c.0.try_wait().expect("try_wait") {
            let elapsed = start.elapsed();
            return Outcome { status, stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap(), elapsed };
        }
        if start.elapsed() > limit {
            drop(c);
            panic!("{what}: still running after {limit:?} (hang)\nstdout: {}\nstderr: {}", t_out.join().unwrap(), t_err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn spawn(mut cmd: Command) -> Reaped {
    Reaped(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).spawn().expect("spawn"))
}

pub fn free_port() -> u16 {
    sucl::unused_loopback_port().expect("a free port for the store")
}

/// Processes whose environment carries `marker` (e.g. `SUCL_JOB_ID=j123x`).
pub fn processes_with_env(marker: &str) -> Vec<u32> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(env) = std::fs::read(e.path().join("environ")) {
            if env.split(|&b| b == 0).any(|kv| kv.starts_with(marker.as_bytes())) {
                // Zombies are gone as far as resources go, but still count: nobody reaped them.
                found.push(pid);
            }
        }
    }
    found
}

/// Shared-memory segments whose name starts with `prefix`.
pub fn segments_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// The `STEP` lines of each rank (`rank R STEP ...`, printed by the `sucl-disagree` helper), in order, without that prefix.
pub fn steps_by_rank(n: usize, stdout: &str) -> Vec<Vec<String>> {
    (0..n)
        .map(|r| {
            let p = format!("rank {r} STEP ");
            stdout.lines().filter_map(|l| l.split_once(&p).map(|(_, s)| s.to_string())).collect()
        })
        .collect()
}
