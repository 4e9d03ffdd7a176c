//! What a daemon holds for connections and clients that do not behave — silent or trickling
//! handshakes, frames announced and never sent, sessions abandoned — and what a client is told
//! when it and the daemon disagree about TLS. Alone in its test binary, so that the threads
//! counted in this process are this test's own.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use sucl_remote::auth::random;
use sucl_remote::transport::Tls;
use sucl_remote::wire::{self, Command, Frame, Outcome};
use sucl_remote::{ClientOptions, Daemon, DaemonConfig, Remote, RemoteError, Token};

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's threads named `name` (`comm` keeps 15 bytes).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
        .count()
}

/// A plain-TCP daemon in this process, shaped by `tune`, and options for its clients.
fn plain_daemon(tune: impl FnOnce(&mut DaemonConfig)) -> (Daemon, ClientOptions) {
    let token = Token::generate();
    let mut cfg = DaemonConfig::new(token.clone());
    cfg.tls = None;
    tune(&mut cfg);
    let d = Daemon::start(cfg).unwrap();
    let mut o = ClientOptions::new(token);
    o.tls = Tls::Off;
    o.call_timeout = Duration::from_secs(20);
    (d, o)
}

/// Whether the server closed `s` (a read ends, or fails as a reset) within 30 s.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    match s.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn silent_connections_beyond_the_handshake_limit_are_closed_at_once_and_cost_no_thread() {
    let (d, o) = plain_daemon(|c| {
        c.max_handshakes = 8;
        c.handshake_timeout = Duration::from_secs(60); // only the limit closes them here
    });
    let addr = d.local_addr().to_string();
    let mut silent: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // The first 8 hold a thread each; the other 32 are closed as they arrive.
    let closed = silent[8..].iter_mut().map(closed_by_server).filter(|c| *c).count();
    assert_eq!(closed, 32, "every connection over the limit is closed");
    // The threads that closed them go back to the pool or end: on a loaded machine some are
    // still on their way when the last connection is seen closed.
    wait_until("the threads that closed the connections over the limit end", || d.connection_threads() <= 8 + 3);
    // Once those 8 go away, a client gets in.
    drop(silent);
    wait_until("the handshakes end", || d.connection_threads() <= 3);
    Remote::connect(&addr, o).unwrap().nop().unwrap();
}

#[test]
fn a_handshake_that_trickles_in_is_cut_at_its_deadline() {
    let (d, o) = plain_daemon(|c| c.handshake_timeout = Duration::from_millis(800));
    let addr = d.local_addr().to_string();
    // A hello one byte at a time, each well within the deadline of a single read.
    let hello =
        Frame::Hello { min_version: wire::VERSION, max_version: wire::VERSION, features: 0, max_frame: 1 << 20, nonce: random() }.encode();
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut sent = 0;
    for b in &hello {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(sent < hello.len() || closed_by_server(&mut s), "the trickling hello was cut (sent {sent} of {} bytes)", hello.len());
    assert!(sent < hello.len(), "cut before the whole hello trickled in ({} bytes over {} ms)", hello.len(), hello.len() * 150);
    Remote::connect(&addr, o).unwrap().nop().unwrap();
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kb << 10
}

#[test]
fn frames_announced_large_and_never_sent_hold_only_what_arrived() {
    let d = Sucld::start(&["--no-tls"]);
    let pid = d.child.id();
    // Sessions whose first command announces 16 MiB (the frame limit) and sends 10 bytes.
    let mut held = Vec::new();
    for _ in 0..32 {
        let mut s = raw_connect(&d.addr, &d.tls());
        let client: [u8; 16] = random();
        s.write_all(
            &Frame::Hello { min_version: wire::VERSION, max_version: wire::VERSION, features: 0, max_frame: 16 << 20, nonce: client }
                .encode(),
        )
        .unwrap();
        let Some(Frame::Welcome { nonce, max_frame, .. }) = read(&mut s) else { panic!("no welcome") };
        assert_eq!(max_frame, 16 << 20);
        let n = sucl_remote::auth::Nonces { client, server: nonce };
        s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
        assert!(matches!(read(&mut s), Some(Frame::Opened { .. })));
        held.push(s);
    }
    let before = rss(pid);
    for s in &mut held {
        let mut head = (16u32 << 20).to_le_bytes().to_vec();
        head.extend_from_slice(&[0; 10]);
        s.write_all(&head).unwrap();
    }
    // Each connection thread now waits inside that frame. 32 × 16 MiB would show at once;
    // watch for a while.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let grown = rss(pid).saturating_sub(before);
        assert!(grown < 64 << 20, "the daemon grew by {} MiB for 320 bytes of announced frames", grown >> 20);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its sessions still work for whoever behaves.
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    r.nop().unwrap();
    drop(held);
}

#[test]
fn sessions_are_limited_and_an_abandoned_one_holds_no_thread_and_gives_way() {
    let (d, o) = plain_daemon(|c| {
        c.max_sessions = 4;
        c.reconnect_window = Duration::from_secs(120); // only the limit frees them here
    });
    let addr = d.local_addr().to_string();
    // A command that may wait for a peer starts the session's executor thread (it fails: the
    // session is in no mesh).
    let busy = |r: &Remote| match r.call_raw(Command::WaitRemote { peer: 1, event: 1 }) {
        Err(RemoteError::Failed { message, .. }) => assert!(message.contains("not in a mesh"), "{message}"),
        other => panic!("{other:?}"),
    };
    let mut rs: Vec<Remote> = (0..4).map(|_| Remote::connect(&addr, o.clone()).unwrap()).collect();
    rs.iter().for_each(busy);
    assert_eq!(threads_named("sucld-exec"), 4, "one executor per session that needed one");
    match Remote::connect(&addr, o.clone()) {
        Err(RemoteError::Refused { why, .. }) => assert!(why.contains("holds 4 sessions") && why.contains("--max-sessions"), "{why}"),
        other => panic!("a fifth session must be refused: {:?}", other.map(|_| ())),
    }
    // Two clients go away without a word: their sessions wait for them, with no thread.
    rs.truncate(2);
    wait_until("the executors of detached sessions end", || threads_named("sucld-exec") == 2);
    assert_eq!(d.session_count(), 4);
    // New sessions take their places; the attached ones are untouched.
    let new: Vec<Remote> = (0..2).map(|_| Remote::connect(&addr, o.clone()).unwrap()).collect();
    assert_eq!(d.session_count(), 4);
    for r in rs.iter().chain(&new) {
        assert!(matches!(r.call_raw(Command::Nop), Ok(Outcome::Done)));
    }
    assert!(Remote::connect(&addr, o).is_err(), "all four attached: the next is refused again");
}

#[test]
fn a_client_and_a_daemon_that_disagree_about_tls_are_told_so() {
    let tls = Sucld::start(&[]);
    let mut o = tls.options();
    o.tls = Tls::Off;
    let e = Remote::connect(&tls.addr, o).err().expect("a plain client cannot use a TLS daemon").to_string();
    assert!(e.contains("the daemon expects TLS"), "{e}");
    assert!(!e.contains("exceeds the limit"), "{e}");

    let plain = Sucld::start(&["--no-tls"]);
    let mut o = plain.options();
    o.tls = Tls::Pinned(vec![[7; 32]]);
    let e = Remote::connect(&plain.addr, o).err().expect("a TLS client cannot use a plain daemon").to_string();
    assert!(e.contains("--no-tls"), "{e}");
}

#[test]
fn released_events_leave_room_for_new_ones_and_held_ones_count_against_the_limit() {
    let (d, o) = plain_daemon(|c| {
        c.limits.max_events = 100;
        c.host_devices = 1;
    });
    let r = Remote::connect(&d.local_addr().to_string(), o).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    // Ten times the limit, each dropped (released in batches) before the next.
    for _ in 0..1000 {
        q.record().unwrap();
    }
    q.synchronize().expect("released events do not count against the limit");
    // Held events do.
    let held: Vec<_> = (0..150).map(|_| q.record().unwrap()).collect();
    let e = q.synchronize().expect_err("150 held events pass a limit of 100").to_string();
    assert!(e.contains("events (its limit)"), "{e}");
    drop(held);
}
