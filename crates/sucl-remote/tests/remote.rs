//! The daemon as a real process on loopback, used through the client API.

mod common;
use common::*;
use sucl_remote::wire::code;
use sucl_remote::{Arg, Remote, RemoteError};

#[test]
fn buffers_kernels_and_events_work_through_a_remote_host_device() {
    let d = Sucld::start(&["--host-devices", "2"]);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let devs = r.devices().unwrap();
    assert_eq!(devs.iter().map(|d| d.name().to_string()).collect::<Vec<_>>(), ["host0", "host1"]);
    let q = devs[1].queue().unwrap();
    let x = q.upload(&[1f32, 2., 3., 4., 5.]).unwrap();
    let mut y = q.alloc::<f32>(5).unwrap();
    y.fill(10.0).unwrap();
    q.launch("axpy_f32", &[y.arg(), x.arg(), Arg::F64(2.0)], 0).unwrap();
    let ev = q.record().unwrap();
    let q2 = devs[1].queue().unwrap();
    q2.wait_for(&ev).unwrap();
    let mut z = q2.alloc::<f32>(5).unwrap();
    z.copy_from(&y).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(z.to_vec().unwrap(), [12., 14., 16., 18., 20.]);
    let mut w = q2.alloc::<f32>(5).unwrap();
    q2.launch("stencil3_f32", &[w.arg(), z.arg()], 0).unwrap();
    q2.synchronize().unwrap();
    assert_eq!(w.to_vec().unwrap(), [12., 14., 16., 18., 20.]);
    w.write(1, &[0.5, 0.25]).unwrap();
    assert_eq!(w.read(0, 3).unwrap(), [12., 0.5, 0.25]);
    // A launch's failure is reported by the next call that waits, naming the server.
    q.launch("no_such_kernel", &[], 0).unwrap();
    match q.synchronize() {
        Err(RemoteError::Failed { server, code: c, message, .. }) => {
            assert_eq!((server.as_str(), c), (d.addr.as_str(), code::KERNEL));
            assert!(message.contains("no host kernel named `no_such_kernel`"), "{message}");
        }
        other => panic!("expected the kernel failure, got {other:?}"),
    }
    // Large transfers are split into frames.
    let big: Vec<u64> = (0..3_000_000u64).collect();
    let b = q.upload(&big).unwrap();
    assert_eq!(b.to_vec().unwrap(), big);
}

use std::io::Write;
use std::time::Duration;
use sucl_remote::auth::random;
use sucl_remote::wire::{Command, Frame};
use sucl_remote::{ClientOptions, Token};

fn refused_because(f: Option<Frame>) -> String {
    match f {
        Some(Frame::Refused { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_client_without_the_token_is_refused() {
    let d = Sucld::start(&[]);
    let mut wrong = d.options();
    wrong.token = Token::generate();
    match Remote::connect(&d.addr, wrong) {
        Err(RemoteError::Refused { server, why }) => {
            assert_eq!(server, d.addr);
            assert!(why.contains("authentication failed"), "{why}");
        }
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("a client with the wrong token was let in"),
    }
    // Commands before (or instead of) the handshake are refused too.
    let mut s = raw_connect(&d.addr, &d.tls());
    s.write_all(&Frame::Command { seq: 1, ack: 0, cmd: Command::Devices }.encode()).unwrap();
    assert!(refused_because(read(&mut s)).contains("expected a hello"));
    // The right token still works.
    Remote::connect(&d.addr, d.options()).unwrap().nop().unwrap();
}

#[test]
fn a_forged_session_is_refused() {
    let d = Sucld::start(&[]);
    let victim = Remote::connect(&d.addr, d.options()).unwrap();
    let q = victim.devices().unwrap()[0].queue().unwrap();
    let secret = q.upload(&[42u64]).unwrap();
    // An attacker who knows the session id (ids are not secret) but not its secret.
    let (mut s, _) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Attach { session: victim.session_id(), last_reply: 0, mac: random() }.encode()).unwrap();
    assert!(refused_because(read(&mut s)).contains("authentication failed: wrong proof for this session"));
    // An attacker who guesses an id.
    let (mut s, _) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Attach { session: random(), last_reply: 0, mac: random() }.encode()).unwrap();
    assert!(refused_because(read(&mut s)).contains("no such session"));
    // Another legitimate session cannot reach the victim's buffers: requests carry no session.
    let other = Remote::connect(&d.addr, d.options()).unwrap();
    let oq = other.devices().unwrap()[0].queue().unwrap();
    oq.launch("increment_u64", &[secret.arg()], 0).unwrap();
    let e = oq.synchronize().unwrap_err().to_string();
    assert!(e.contains("does not exist in this session"), "{e}");
    assert_eq!(secret.to_vec().unwrap(), [42]);
}

/// Records what a client sends, to replay it later.
fn recording_proxy(target: String) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let mut srv = std::net::TcpStream::connect(&target).unwrap();
            let (mut c2, mut s2) = (c.try_clone().unwrap(), srv.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
            let idx = {
                let mut l = log2.lock().unwrap();
                l.push(Vec::new());
                l.len() - 1
            };
            let log3 = log2.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            log3.lock().unwrap()[idx].extend_from_slice(&buf[..n]);
                            if srv.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = srv.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (addr, log)
}

/// Replays every connection a client made (recorded by a proxy) verbatim; returns what the
/// server answered to each, as frames, or `None` where it closed without a frame.
fn replay_recorded(d: &Sucld) -> Vec<(Option<Frame>, Option<Frame>)> {
    let (proxy, log) = recording_proxy(d.addr.clone());
    let r = Remote::connect(&proxy, d.options()).unwrap();
    r.nop().unwrap();
    r.drop_connection(); // the client re-attaches: a second recorded connection
    r.nop().unwrap();
    assert_eq!(r.reconnects(), 1);
    std::thread::sleep(Duration::from_millis(50));
    let recorded = log.lock().unwrap().clone();
    assert_eq!(recorded.len(), 2);
    recorded
        .iter()
        .map(|bytes| {
            let mut s = std::net::TcpStream::connect(&d.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(bytes);
            (read(&mut s), read(&mut s))
        })
        .collect()
}

#[test]
fn a_replayed_connection_is_refused() {
    // TLS (the default): the recorded bytes are a TLS session; replayed, the server's fresh
    // handshake randomness makes them meaningless and it closes without a single frame.
    let d = Sucld::start(&[]);
    for (i, (first, _)) in replay_recorded(&d).into_iter().enumerate() {
        assert!(first.is_none(), "connection {i}: a replayed TLS connection got {first:?}");
    }
    // Even where the bytes are readable (a daemon with --no-tls), the proofs are bound to the
    // server's fresh nonce: the hello is answered, the open or attach refused.
    let d = Sucld::start(&["--no-tls"]);
    for (i, (welcome, refusal)) in replay_recorded(&d).into_iter().enumerate() {
        assert!(matches!(welcome, Some(Frame::Welcome { .. })), "connection {i}");
        let why = refused_because(refusal);
        assert!(why.contains("authentication failed"), "connection {i}: {why}");
    }
}

#[test]
fn malformed_oversized_and_mismatched_frames_close_the_connection() {
    let d = Sucld::start(&[]);
    // A length prefix far over the handshake limit.
    let mut s = raw_connect(&d.addr, &d.tls());
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let why = refused_because(read(&mut s));
    assert!(why.contains("frame length of 4294967295 exceeds the limit of 1024"), "{why}");
    assert!(read(&mut s).is_none(), "the server closes after refusing");
    // Bad magic.
    let mut s = raw_connect(&d.addr, &d.tls());
    let mut hello = Frame::Hello { min_version: 1, max_version: 1, features: 0, max_frame: 1 << 20, nonce: [0; 16] }.encode();
    hello[5] ^= 0xff;
    s.write_all(&hello).unwrap();
    assert!(refused_because(read(&mut s)).contains("bad magic"));
    // A version this server does not speak.
    let mut s = raw_connect(&d.addr, &d.tls());
    let (lo, hi) = (sucl_remote::wire::VERSION + 1, sucl_remote::wire::VERSION + 2);
    s.write_all(&Frame::Hello { min_version: lo, max_version: hi, features: 0, max_frame: 1 << 20, nonce: [0; 16] }.encode()).unwrap();
    let why = refused_because(read(&mut s));
    assert!(why.contains(&format!("the client speaks versions {lo}..={hi}; this server speaks {}", sucl_remote::wire::VERSION)), "{why}");
    // After the handshake: a frame over the negotiated limit, and an undecodable one.
    for bad in [(8u32 << 20).to_le_bytes().to_vec(), vec![2, 0, 0, 0, 16, 0]] {
        let (mut s, n) = raw_greet(&d.addr, &d.tls());
        s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
        assert!(matches!(read(&mut s), Some(Frame::Opened { .. })));
        s.write_all(&bad).unwrap();
        match read(&mut s) {
            Some(Frame::Fatal { reason }) => assert!(reason.contains("malformed frame"), "{reason}"),
            other => panic!("expected a fatal frame, got {other:?}"),
        }
    }
    // The daemon survived all of it.
    Remote::connect(&d.addr, d.options()).unwrap().nop().unwrap();
}

#[test]
fn session_limits_fail_with_clear_errors() {
    let d = Sucld::start(&["--max-session-bytes", "4096", "--max-buffers", "3", "--max-inflight", "8"]);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    let e = q.alloc::<u8>(5000).err().unwrap().to_string();
    assert!(e.contains("would exceed the session's memory limit: 0 in use of 4096"), "{e}");
    let _a = q.alloc::<u8>(1).unwrap();
    let _b = q.alloc::<u8>(1).unwrap();
    let _c = q.alloc::<u8>(1).unwrap();
    let e = q.alloc::<u8>(1).err().unwrap().to_string();
    assert!(e.contains("already holds 3 buffers (its limit)"), "{e}");
    // The client keeps to the in-flight limit by itself: 100 posted commands, nothing refused.
    for _ in 0..100 {
        q.launch("noop", &[], 0).unwrap();
    }
    q.synchronize().unwrap();
    // A raw client that ignores it is cut off.
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Opened { max_inflight: 8, .. })));
    for seq in 1..=20 {
        let _ = s.write_all(&Frame::Command { seq, ack: 0, cmd: Command::Nop }.encode());
    }
    let mut last = None;
    while let Some(f) = read(&mut s) {
        last = Some(f);
    }
    match last {
        Some(Frame::Fatal { reason }) => assert!(reason.contains("more than 8 commands in flight"), "{reason}"),
        other => panic!("expected a fatal frame, got {other:?}"),
    }
}

#[test]
fn killing_the_daemon_fails_waiting_calls_with_its_name() {
    let mut d = Sucld::start(&[]);
    let mut o = d.options();
    o.reconnect_window = Duration::from_millis(500);
    let r = Remote::connect(&d.addr, o).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    q.launch("sleep_ms", &[sucl_remote::Arg::U64(5000)], 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || tx.send(q.synchronize()).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    d.kill();
    // Bounded: a hang fails here instead of stalling the suite.
    let got = rx.recv_timeout(Duration::from_secs(30)).expect("the waiting call did not return");
    waiter.join().unwrap();
    match got {
        Err(e @ RemoteError::Lost { .. }) => assert!(e.to_string().contains(&d.addr), "{e}"),
        other => panic!("expected a lost-connection error, got {other:?}"),
    }
    // Later calls fail the same way at once.
    assert!(matches!(r.nop(), Err(RemoteError::Lost { .. })));
}

/// One scripted run: `n` commands (counter increments over random ranges, writes, reads),
/// returning every read and the final counters.
fn scripted_run(r: &Remote, n: usize, seed: u64) -> (Vec<Vec<u64>>, Vec<u64>, u64) {
    let q = r.devices().unwrap()[0].queue().unwrap();
    let counters = q.alloc::<u64>(64).unwrap();
    let mut data = q.alloc::<u64>(256).unwrap();
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut reads, mut launches) = (Vec::new(), 0);
    for _ in 0..n {
        match rnd() % 10 {
            0..=5 => {
                q.launch("increment_u64", &[counters.arg()], 1 + rnd() % 64).unwrap();
                launches += 1;
            }
            6..=8 => {
                let at = (rnd() % 250) as usize;
                let v: Vec<u64> = (0..1 + rnd() % 6).map(|_| rnd()).collect();
                data.write(at, &v).unwrap();
            }
            _ => reads.push(data.read((rnd() % 200) as usize, 50).unwrap()),
        }
    }
    reads.push(data.to_vec().unwrap());
    (reads, counters.to_vec().unwrap(), launches)
}

#[test]
fn commands_run_exactly_once_across_random_connection_cuts() {
    const N: usize = 10_000;
    let d = Sucld::start(&[]);
    let clean = Remote::connect(&d.addr, d.options()).unwrap();
    let t0 = std::time::Instant::now();
    let (want_reads, want_counters, launches) = scripted_run(&clean, N, 7);
    let clean_time = t0.elapsed();
    // Counters prove each increment ran once: element i was incremented by every launch
    // whose range covered it, so element 0 counts every launch.
    assert_eq!(want_counters[0], launches);
    // The same script through a proxy that cuts every connection after a random number of
    // bytes (mean 4 KiB: about a hundred cuts over this run).
    let proxy = FaultProxy::start(&d.addr, 4096, 99);
    let faulty = Remote::connect(&proxy.addr, d.options()).unwrap();
    let t0 = std::time::Instant::now();
    let (reads, counters, _) = scripted_run(&faulty, N, 7);
    let faulty_time = t0.elapsed();
    proxy.calm();
    let cuts = proxy.cuts.load(std::sync::atomic::Ordering::SeqCst);
    assert!(cuts >= 50, "only {cuts} cuts: the test did not exercise reconnects");
    assert!(faulty.reconnects() >= cuts / 2, "{} re-attaches for {cuts} cuts", faulty.reconnects());
    assert_eq!(reads, want_reads, "reads differ from the fault-free run");
    assert_eq!(counters, want_counters, "counters differ: some command ran twice or never");
    let stats = faulty.stats().unwrap();
    assert_eq!(stats.executed, faulty.commands_sent(), "every sequence number executed exactly once");
    assert_eq!(stats.launches, launches);
    eprintln!("{N} commands, {cuts} cuts, {} re-attaches; fault-free run {clean_time:?}, with cuts {faulty_time:?}", faulty.reconnects());
}

#[test]
fn a_session_whose_client_never_returns_is_freed_after_the_window() {
    let token = Token::generate();
    let mut cfg = sucl_remote::DaemonConfig::new(token.clone());
    cfg.reconnect_window = Duration::from_millis(200);
    let daemon = sucl_remote::Daemon::start(cfg).unwrap();
    let mut o = ClientOptions::new(token).pin(daemon.tls_pin().unwrap());
    o.reconnect_window = Duration::from_millis(200);
    let proxy = FaultProxy::counting(&daemon.local_addr().to_string());
    let r = Remote::connect(&proxy.addr, o).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    let b = q.alloc::<u8>(1 << 20).unwrap();
    assert_eq!(daemon.session_count(), 1);
    // Cut the connection and keep the client from re-attaching until the window has passed.
    proxy.sever();
    let t0 = std::time::Instant::now();
    while daemon.session_count() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the session was never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    match b.to_vec() {
        Err(RemoteError::Lost { .. }) | Err(RemoteError::Refused { .. }) => {}
        other => panic!("expected the session to be gone, got {other:?}"),
    }
    daemon.shutdown();
}

#[test]
fn the_server_runs_a_resent_command_once() {
    use sucl_remote::wire::{Arg as A, Outcome};
    let d = Sucld::start(&[]);
    let (mut s, _, session, secret) = raw_open(&d);
    let cmds = [
        Command::CreateQueue { queue: 1, device: 0 },
        Command::Alloc { buffer: 2, device: 0, bytes: 8 },
        Command::Launch { queue: 1, kernel: "increment_u64".into(), args: vec![A::Buffer(2)], range: 0 },
    ];
    for (i, cmd) in cmds.iter().enumerate() {
        s.write_all(&Frame::Command { seq: i as u64 + 1, ack: 0, cmd: cmd.clone() }.encode()).unwrap();
    }
    for seq in 1..=3 {
        assert_eq!(read(&mut s), Some(Frame::Reply { seq, outcome: Outcome::Done }));
    }
    drop(s);
    // Re-attach claiming no reply arrived: the server says it received all three, re-sends the
    // three replies, and runs none of the three again when the client sends them anyway.
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Attach { session, last_reply: 0, mac: secret.attach_proof(&n, &session, 0) }.encode()).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Attached { last_received: 3, .. })));
    for seq in 1..=3 {
        assert_eq!(read(&mut s), Some(Frame::Reply { seq, outcome: Outcome::Done }));
    }
    for (i, cmd) in cmds.iter().enumerate() {
        s.write_all(&Frame::Command { seq: i as u64 + 1, ack: 3, cmd: cmd.clone() }.encode()).unwrap();
    }
    s.write_all(&Frame::Command { seq: 4, ack: 3, cmd: Command::Read { buffer: 2, offset: 0, len: 8 } }.encode()).unwrap();
    assert_eq!(read(&mut s), Some(Frame::Reply { seq: 4, outcome: Outcome::Data(1u64.to_le_bytes().to_vec()) }));
}

#[test]
fn a_reconnect_resumes_the_tls_session_and_runs_each_command_once() {
    let d = Sucld::start(&[]);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    let x = q.alloc::<u64>(1).unwrap();
    // The server's session tickets come before its first reply, so the client holds some now.
    for _ in 0..3 {
        r.drop_connection();
        q.launch("increment_u64", &[x.arg()], 0).unwrap();
        r.nop().unwrap();
    }
    assert_eq!(r.reconnects(), 3);
    assert_eq!(r.resumed_reconnects(), 3, "every re-attach resumed its TLS session (no full handshake)");
    assert_eq!(x.to_vec().unwrap(), [3], "each launch ran once");
}
