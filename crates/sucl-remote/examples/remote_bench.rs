//! Latency of remote devices on loopback, side by side with a raw TCP round trip measured in the
//! same run (a benchmark, not a test):
//!
//! ```sh
//! cargo run --release -p sucl-remote --example remote_bench -- [--iters 20000] [--out FILE.md]
//! ```
//!
//! - raw TCP: a 22-byte message and a 14-byte answer (the sizes of a no-op command frame and its
//!   reply) between two threads over one `TCP_NODELAY` loopback connection;
//! - `nop`: one no-op command sent to an in-process `sucld` (the same daemon library the binary
//!   runs) and its reply awaited;
//! - `launch noop + synchronize`: a kernel launch (sent without waiting) and a queue
//!   synchronize, i.e. two commands in one round trip;
//! - reconnect: the connection is cut, then a no-op command re-attaches the session and runs.
//!
//! Each row reports the median, p99 and mean in microseconds.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use sucl_remote::{ClientOptions, Daemon, DaemonConfig, Remote, Token};

fn stats(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = us(v[v.len() / 2]);
    let p99 = us(v[(v.len() * 99 / 100).min(v.len() - 1)]);
    let mean = v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64;
    (median, p99, mean)
}

fn time(iters: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..iters / 10 {
        f(); // warm-up
    }
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn raw_tcp(iters: usize) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let total = iters + iters / 10;
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let (mut req, reply) = ([0u8; 22], [0u8; 14]);
        for _ in 0..total {
            s.read_exact(&mut req).unwrap();
            s.write_all(&reply).unwrap();
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let (req, mut reply) = ([0u8; 22], [0u8; 14]);
    let v = time(iters, || {
        c.write_all(&req).unwrap();
        c.read_exact(&mut reply).unwrap();
    });
    echo.join().unwrap();
    v
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let iters: usize = opt("--iters").map(|s| s.parse().expect("--iters N")).unwrap_or(20_000);
    let token = Token::generate();
    let daemon = Daemon::start(DaemonConfig::new(token.clone())).expect("starting the daemon");
    let remote = Remote::connect(&daemon.local_addr().to_string(), ClientOptions::new(token)).expect("connecting");
    let queue = remote.devices().unwrap()[0].queue().unwrap();

    let mut rows = Vec::new();
    rows.push(("raw TCP round trip (22 B → 14 B)", stats(raw_tcp(iters))));
    rows.push(("nop command (enqueue + wait)", stats(time(iters, || remote.nop().unwrap()))));
    rows.push((
        "launch noop + synchronize",
        stats(time(iters, || {
            queue.launch("noop", &[], 0).unwrap();
            queue.synchronize().unwrap();
        })),
    ));
    let reconnects = (iters / 100).clamp(20, 500);
    rows.push((
        "reconnect (cut, re-attach, nop)",
        stats(time(reconnects, || {
            remote.drop_connection();
            remote.nop().unwrap();
        })),
    ));

    let raw_median = rows[0].1 .0;
    let mut md = String::new();
    md.push_str("| what | iterations | median µs | p99 µs | mean µs | median − raw TCP µs |\n|---|---:|---:|---:|---:|---:|\n");
    for (i, (name, (median, p99, mean))) in rows.iter().enumerate() {
        let n = if i == 3 { reconnects } else { iters };
        md.push_str(&format!("| {name} | {n} | {median:.1} | {p99:.1} | {mean:.1} | {:+.1} |\n", median - raw_median));
    }
    print!("{md}");
    if let Some(path) = opt("--out") {
        std::fs::write(&path, &md).expect("writing the results");
        eprintln!("wrote {path}");
    }
    daemon.shutdown();
}
