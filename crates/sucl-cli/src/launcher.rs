//! `sucl run`: starts N ranks on this machine, hosts their rendezvous store, forwards their
//! output whole lines at a time (prefixed with the rank unless asked not to), forwards signals,
//! and ends the whole job when any rank fails.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sucl_core::store::{JobSecret, StoreServer, SECRET_ENV};

/// How to launch.
pub struct LaunchOpts {
    /// Number of ranks.
    pub ranks: usize,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Prefix every output line with `[rank] `.
    pub prefix: bool,
    /// Grace period between SIGTERM and SIGKILL when tearing the job down.
    pub grace: Duration,
    /// Bind each rank to its own contiguous block of the allowed CPUs (as `mpirun --map-by
    /// slot:PE=k` does): one CPU each when the ranks use them all, more otherwise, so that
    /// helper threads (NCCL's proxy, for one) do not share the rank's only core. Only when the
    /// ranks fit the CPUs.
    pub bind: bool,
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![];
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Longest line the forwarder holds while waiting for its newline: a rank that writes more
/// without one has it forwarded in pieces of this size, each ended as a line of its own.
const MAX_HELD_LINE: usize = 1 << 20;

/// Where a forwarded stream of a rank goes.
#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// Writes `bytes` (whole lines) to `sink` while holding `lock`, which every writer of the
/// launcher's stdout and stderr takes, so that no other rank's line lands inside them.
fn write_whole(sink: Sink, bytes: &[u8], lock: &Mutex<()>) {
    let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
    let _ = match sink {
        Sink::Stdout => {
            let mut o = std::io::stdout().lock();
            o.write_all(bytes).and_then(|_| o.flush())
        }
        Sink::Stderr => std::io::stderr().lock().write_all(bytes),
    };
}

/// A line of the launcher's own on stderr, never inside a rank's line.
fn say(lock: &Mutex<()>, msg: &str) {
    write_whole(Sink::Stderr, format!("{msg}\n").as_bytes(), lock);
}

/// `lines` (whole lines, the last ending in a newline) with `prefix` before each.
fn prefixed(lines: &[u8], prefix: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        return lines.to_vec();
    }
    let mut out = Vec::with_capacity(lines.len() + prefix.len() * 8);
    for line in lines.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(prefix);
        out.extend_from_slice(line);
    }
    out
}

/// Forwards a rank's output whole lines at a time: whatever whole lines one read brings go out
/// in one locked write, the bytes after the last newline wait for the rest of their line, and a
/// last line without a newline goes out, ended by one, when the rank closes the stream.
fn forward_lines(mut src: impl Read + Send + 'static, prefix: String, sink: Sink, lock: Arc<Mutex<()>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = vec![0u8; 64 << 10];
        let mut held: Vec<u8> = Vec::new();
        loop {
            let n = match src.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            held.extend_from_slice(&chunk[..n]);
            let whole = match held.iter().rposition(|&b| b == b'\n') {
                Some(last) => last + 1,
                None if held.len() >= MAX_HELD_LINE => {
                    held.push(b'\n');
                    held.len()
                }
                None => continue,
            };
            write_whole(sink, &prefixed(&held[..whole], prefix.as_bytes()), &lock);
            held.drain(..whole);
        }
        if !held.is_empty() {
            held.push(b'\n');
            write_whole(sink, &prefixed(&held, prefix.as_bytes()), &lock);
        }
    })
}

fn signal_group(child: &Child, sig: libc::c_int) {
    // Each rank leads its own process group, so this reaches anything it started too.
    // SAFETY: plain kill(2) on a process group we created.
    unsafe { libc::kill(-(child.id() as libc::pid_t), sig) };
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (_, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

fn termed_by_us(st: ExitStatus) -> bool {
    matches!(st.signal(), Some(libc::SIGTERM) | Some(libc::SIGKILL))
}

fn code_of(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(1))
}

/// Removes shared-memory segments a crashed job left behind.
fn remove_segments(job: &str) {
    let prefix = sucl::shm_prefix(job);
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Runs the job; returns the launcher's exit code.
pub fn launch(opts: &LaunchOpts) -> i32 {
    let Some((prog, args)) = opts.argv.split_first() else {
        eprintln!("sucl run: no program given (usage: sucl run -n N -- PROG ARGS...)");
        return 2;
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let job = format!("j{}x{nanos}", std::process::id());
    // A fresh random secret per job: only the ranks we start (handed it below) can use the
    // store, which listens on loopback only (all ranks run on this host).
    let secret = match JobSecret::random() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sucl run: cannot make a job secret: {e}");
            return 1;
        }
    };
    let server = match StoreServer::start("127.0.0.1:0", secret.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sucl run: cannot start the rendezvous store: {e}");
            return 1;
        }
    };
    let signals = Arc::new(AtomicUsize::new(0));
    let last_sig = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        let (count, which) = (signals.clone(), last_sig.clone());
        // SAFETY: the handler only does atomic stores.
        let _ = unsafe {
            signal_hook::low_level::register(sig, move || {
                count.fetch_add(1, Ordering::SeqCst);
                which.store(sig as usize, Ordering::SeqCst);
            })
        };
    }
    let lock = Arc::new(Mutex::new(()));
    let cpus = allowed_cpus();
    let bind = opts.bind && !cpus.is_empty() && opts.ranks <= cpus.len();
    let mut children: Vec<Option<Child>> = Vec::with_capacity(opts.ranks);
    let mut pipes = Vec::new();
    for r in 0..opts.ranks {
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env("SUCL_RANK", r.to_string())
            .env("SUCL_WORLD_SIZE", opts.ranks.to_string())
            .env("SUCL_LOCAL_RANK", r.to_string())
            .env("SUCL_LOCAL_SIZE", opts.ranks.to_string())
            .env("SUCL_STORE_ADDR", server.addr().to_string())
            .env("SUCL_STORE_HOST", "launcher")
            .env("SUCL_JOB_ID", &job)
            .env(SECRET_ENV, secret.expose())
            .stdin(Stdio::null())
            .process_group(0);
        // Always through the launcher, so that lines of several ranks never tear each other.
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if bind {
            let per = cpus.len() / opts.ranks;
            let block: Vec<usize> = cpus[r * per..(r + 1) * per].to_vec();
            cmd.env("SUCL_BOUND_CPUS", block.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
            // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
            // sched_setaffinity on plain data.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    for &cpu in &block {
                        libc::CPU_SET(cpu, &mut set);
                    }
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        match cmd.spawn() {
            Ok(mut c) => {
                let prefix = if opts.prefix { format!("[{r}] ") } else { String::new() };
                if let Some(o) = c.stdout.take() {
                    pipes.push(forward_lines(o, prefix.clone(), Sink::Stdout, lock.clone()));
                }
                if let Some(e) = c.stderr.take() {
                    pipes.push(forward_lines(e, prefix, Sink::Stderr, lock.clone()));
                }
                children.push(Some(c));
            }
            Err(e) => {
                say(&lock, &format!("sucl run: cannot start rank {r} ({prog}): {e}"));
                for c in children.iter_mut().flatten() {
                    signal_group(c, libc::SIGKILL);
                    let _ = c.wait();
                }
                remove_segments(&job);
                return 127;
            }
        }
    }
    let mut exit_code = 0;
    let mut codes: Vec<Option<i32>> = vec![None; opts.ranks];
    // Ranks that ended by the signal we sent them during teardown: never the root cause, even
    // when the store saw their connection drop before the failing rank's (it serves each
    // connection on its own thread, so the order it sees drops in is not the order of deaths).
    let mut ended_by_us = vec![false; opts.ranks];
    let mut first_failure: Option<i32> = None;
    let mut teardown: Option<Instant> = None;
    let mut seen_signals = 0;
    let mut killed = false;
    let mut termed = false;
    loop {
        let sigs = signals.load(Ordering::SeqCst);
        if sigs > seen_signals {
            seen_signals = sigs;
            let sig = last_sig.load(Ordering::SeqCst) as libc::c_int;
            let sig = if sigs > 1 { libc::SIGKILL } else { sig };
            for c in children.iter().flatten() {
                signal_group(c, sig);
            }
            if exit_code == 0 {
                exit_code = 128 + sig;
            }
            teardown.get_or_insert_with(Instant::now);
        }
        let mut running = 0;
        for (r, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    if !st.success() {
                        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        if teardown.is_none() {
                            eprintln!("sucl run: rank {r} {}; ending the other ranks", describe(st));
                            teardown = Some(Instant::now());
                            first_failure = Some(code_of(st));
                        } else if !killed && !termed_by_us(st) {
                            eprintln!("sucl run: rank {r} {}", describe(st));
                        }
                        codes[r] = Some(code_of(st));
                        // Only after our SIGTERM went out (at the end of the pass that saw the
                        // first failure): a rank killed from outside before it is still a cause.
                        ended_by_us[r] = termed && termed_by_us(st);
                    }
                    // The rank is gone; anything it left in its group goes too.
                    signal_group(c, libc::SIGKILL);
                    *slot = None;
                }
                Ok(None) => running += 1,
                Err(_) => *slot = None,
            }
        }
        if running == 0 {
            break;
        }
        if let Some(t) = teardown {
            if !termed {
                for c in children.iter().flatten() {
                    signal_group(c, libc::SIGTERM);
                }
                termed = true;
            }
            if !killed && t.elapsed() >= opts.grace {
                for c in children.iter().flatten() {
                    signal_group(c, libc::SIGKILL);
                }
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    for p in pipes {
        while !p.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if p.is_finished() {
            let _ = p.join();
        }
    }
    // The exit code is the root cause's: the rank the store saw lost, else the first failure.
    let cause = server.abort_info();
    if exit_code == 0 {
        exit_code = cause
            .as_ref()
            .and_then(|i| i.lost_rank)
            .filter(|&r| !ended_by_us.get(r).copied().unwrap_or(false))
            .and_then(|r| codes.get(r).copied().flatten())
            .or(first_failure)
            .unwrap_or(0);
    }
    if let Some(info) = cause {
        if exit_code != 0 {
            say(&lock, &format!("sucl run: job aborted: {}", info.reason));
        }
    }
    drop(server);
    remove_segments(&job);
    exit_code
}

#[cfg(test)]
mod tests {
    use super::prefixed;

    #[test]
    fn every_line_of_a_batch_gets_the_prefix() {
        assert_eq!(prefixed(b"a\nbb\n\nc\n", b"[3] "), b"[3] a\n[3] bb\n[3] \n[3] c\n".to_vec());
        assert_eq!(prefixed(b"a\nb\n", b""), b"a\nb\n".to_vec());
    }
}
