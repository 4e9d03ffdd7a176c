//! Re-attaching fast without giving anything up: a channel-bound attach on TLS (sent with the
//! hello), commands sent along with an attach, TLS session resumption that still authenticates
//! the server, and the daemon's pool of connection threads.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use sucl_remote::auth::{random, Nonces, SessionSecret};
use sucl_remote::transport::{Link, Tls};
use sucl_remote::wire::{self, feature, Command, Frame, Outcome};
use sucl_remote::{ClientOptions, Daemon, DaemonConfig, Remote, Token};

fn hello(features: u64, nonce: [u8; 16]) -> Frame {
    Frame::Hello { min_version: wire::VERSION, max_version: wire::VERSION, features, max_frame: 1 << 20, nonce }
}

fn nop(seq: u64) -> Frame {
    Frame::Command { seq, ack: seq - 1, cmd: Command::Nop }
}

/// Opens a session by hand asking for `features`; returns its id and secret, and the link.
fn open(d: &Sucld, features: u64) -> (Link, [u8; 16], SessionSecret) {
    let mut s = raw_connect(&d.addr, &d.tls());
    let client: [u8; 16] = random();
    s.write_all(&hello(features, client).encode()).unwrap();
    let Some(Frame::Welcome { nonce, features: agreed, .. }) = read(&mut s) else { panic!("no welcome") };
    assert_eq!(agreed & features, features, "the server agrees to {features:#x}");
    let n = Nonces { client, server: nonce };
    s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
    let Some(Frame::Opened { session, .. }) = read(&mut s) else { panic!("not opened") };
    let secret = d.token.session_secret(&n, &session);
    (s, session, secret)
}

fn refusal(f: Option<Frame>) -> String {
    match f {
        Some(Frame::Refused { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_channel_bound_attach_goes_with_the_hello_and_a_replayed_or_forged_one_is_refused() {
    let d = Sucld::start(&[]);
    let (mut s, session, secret) = open(&d, feature::CHANNEL_BOUND_ATTACH);
    s.write_all(&nop(1).encode()).unwrap();
    assert_eq!(read(&mut s), Some(Frame::Reply { seq: 1, outcome: Outcome::Done }));
    drop(s);

    // Re-attach: hello, attach and the next command in one write, before reading anything. The
    // session's TLS is resumed (the ticket came before the welcome) and the exporter value of
    // this connection binds the proof.
    let mut s = raw_connect(&d.addr, &d.tls());
    assert!(s.resumed(), "the re-attach resumed the TLS session");
    let channel = s.channel_binding().expect("a TLS 1.3 link has an exporter value");
    let client: [u8; 16] = random();
    let mut out = hello(feature::CHANNEL_BOUND_ATTACH, client).encode();
    out.extend(Frame::Attach { session, last_reply: 1, mac: secret.attach_proof_channel(&channel, &client, &session, 1) }.encode());
    out.extend(nop(2).encode());
    s.write_all(&out).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Welcome { .. })));
    match read(&mut s) {
        Some(Frame::Attached { last_received: 1, mac }) => {
            assert!(
                secret.check_attached_channel(&channel, &client, 1, &mac),
                "the server proves it holds the session, bound to this channel"
            );
            assert!(!secret.check_attached_channel(&random(), &client, 1, &mac));
        }
        other => panic!("expected attached, got {other:?}"),
    }
    assert_eq!(read(&mut s), Some(Frame::Reply { seq: 2, outcome: Outcome::Done }), "the command sent with the attach ran");

    // The same proof on another connection (a replay: another exporter value) is refused.
    let mut r = raw_connect(&d.addr, &d.tls());
    assert_ne!(r.channel_binding().unwrap(), channel, "each connection has its own exporter value");
    let mut out = hello(feature::CHANNEL_BOUND_ATTACH, client).encode();
    out.extend(Frame::Attach { session, last_reply: 2, mac: secret.attach_proof_channel(&channel, &client, &session, 2) }.encode());
    r.write_all(&out).unwrap();
    assert!(matches!(read(&mut r), Some(Frame::Welcome { .. })));
    assert!(refusal(read(&mut r)).contains("authentication failed"));

    // A proof under another secret (a client that does not hold the session) is refused.
    let mut r = raw_connect(&d.addr, &d.tls());
    let ch = r.channel_binding().unwrap();
    let stranger = Token::generate().session_secret(&Nonces { client, server: client }, &session);
    let mut out = hello(feature::CHANNEL_BOUND_ATTACH, client).encode();
    out.extend(Frame::Attach { session, last_reply: 2, mac: stranger.attach_proof_channel(&ch, &client, &session, 2) }.encode());
    r.write_all(&out).unwrap();
    assert!(matches!(read(&mut r), Some(Frame::Welcome { .. })));
    assert!(refusal(read(&mut r)).contains("authentication failed"));

    // A session that agreed on channel binding takes no nonce-bound proof over TLS.
    let (mut r, n) = raw_greet(&d.addr, &d.tls());
    r.write_all(&Frame::Attach { session, last_reply: 2, mac: secret.attach_proof(&n, &session, 2) }.encode()).unwrap();
    assert!(refusal(read(&mut r)).contains("authentication failed"));

    // The session is intact: a right attach resumes it, and each command ran once.
    let mut s = raw_connect(&d.addr, &d.tls());
    let ch = s.channel_binding().unwrap();
    let mut out = hello(feature::CHANNEL_BOUND_ATTACH, client).encode();
    out.extend(Frame::Attach { session, last_reply: 2, mac: secret.attach_proof_channel(&ch, &client, &session, 2) }.encode());
    out.extend(Frame::Command { seq: 3, ack: 2, cmd: Command::Stats }.encode());
    s.write_all(&out).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Welcome { .. })));
    assert!(matches!(read(&mut s), Some(Frame::Attached { last_received: 2, .. })));
    match read(&mut s) {
        Some(Frame::Reply { seq: 3, outcome: Outcome::Stats(st) }) => assert_eq!(st.executed, 3, "commands 1, 2 and 3, once each"),
        other => panic!("expected the stats, got {other:?}"),
    }
}

#[test]
fn on_plain_tcp_a_session_with_channel_binding_attaches_with_the_nonces() {
    let d = Sucld::start(&["--no-tls"]);
    let (s, session, secret) = open(&d, feature::CHANNEL_BOUND_ATTACH);
    assert!(s.channel_binding().is_none(), "plain TCP has no channel to bind to");
    drop(s);
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Attach { session, last_reply: 0, mac: secret.attach_proof(&n, &session, 0) }.encode()).unwrap();
    match read(&mut s) {
        Some(Frame::Attached { last_received: 0, mac }) => assert!(secret.check_attached(&n, 0, &mac)),
        other => panic!("expected attached, got {other:?}"),
    }
    // And the client library does the same through a proxy that cuts it.
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    for _ in 0..3 {
        r.drop_connection();
        r.nop().unwrap();
    }
    assert_eq!(r.reconnects(), 3);
}

#[test]
fn commands_sent_with_the_attach_before_its_answer_run_once() {
    use sucl_remote::wire::Arg;
    let d = Sucld::start(&[]);
    let (mut s, _, session, secret) = raw_open(&d);
    let cmds = [
        Command::CreateQueue { queue: 1, device: 0 },
        Command::Alloc { buffer: 2, device: 0, bytes: 8 },
        Command::Launch { queue: 1, kernel: "increment_u64".into(), args: vec![Arg::Buffer(2)], range: 0 },
        Command::Launch { queue: 1, kernel: "increment_u64".into(), args: vec![Arg::Buffer(2)], range: 0 },
    ];
    let frame = |i: usize| Frame::Command { seq: i as u64 + 1, ack: 0, cmd: cmds[i].clone() }.encode();
    for i in 0..3 {
        s.write_all(&frame(i)).unwrap();
    }
    for seq in 1..=3 {
        assert_eq!(read(&mut s), Some(Frame::Reply { seq, outcome: Outcome::Done }));
    }
    drop(s);
    // The client does not know what arrived: it sends 2, 3 and 4 right behind its attach
    // (claiming no reply came after 1). The server answers that it holds 1-3, re-sends
    // replies 2 and 3, runs 4 — and neither 2 nor 3 again.
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    let mut out = Frame::Attach { session, last_reply: 1, mac: secret.attach_proof(&n, &session, 1) }.encode();
    for i in 1..4 {
        out.extend(frame(i));
    }
    s.write_all(&out).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Attached { last_received: 3, .. })));
    for seq in 2..=4 {
        assert_eq!(read(&mut s), Some(Frame::Reply { seq, outcome: Outcome::Done }));
    }
    s.write_all(&Frame::Command { seq: 5, ack: 4, cmd: Command::Read { buffer: 2, offset: 0, len: 8 } }.encode()).unwrap();
    assert_eq!(read(&mut s), Some(Frame::Reply { seq: 5, outcome: Outcome::Data(2u64.to_le_bytes().to_vec()) }), "two launches, once each");
}

/// Forwards one connection to `target`, flipping the last byte of the client's first TLS
/// record (a ClientHello: with a ticket to offer, its last extension is the pre-shared key, and
/// its last byte that key's binder). Returns the proxy's address and, once the client spoke,
/// the type of the ClientHello's last extension.
fn binder_tamperer(target: String) -> (String, std::sync::mpsc::Receiver<u16>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut srv = TcpStream::connect(target).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 5];
        c.read_exact(&mut head).unwrap();
        let mut body = vec![0u8; u16::from_be_bytes([head[3], head[4]]) as usize];
        c.read_exact(&mut body).unwrap();
        let _ = tx.send(last_extension(&body));
        *body.last_mut().unwrap() ^= 1;
        srv.write_all(&head).unwrap();
        srv.write_all(&body).unwrap();
        let (mut c2, mut s2) = (c.try_clone().unwrap(), srv.try_clone().unwrap());
        std::thread::spawn(move || drop(std::io::copy(&mut s2, &mut c2)));
        let _ = std::io::copy(&mut c, &mut srv);
    });
    (addr, rx)
}

/// The type of the last extension of a ClientHello handshake message.
fn last_extension(hs: &[u8]) -> u16 {
    let mut at = 4 + 2 + 32; // handshake header, version, random
    at += 1 + hs[at] as usize; // session id
    at += 2 + u16::from_be_bytes([hs[at], hs[at + 1]]) as usize; // cipher suites
    at += 1 + hs[at] as usize; // compression methods
    at += 2; // extensions' length
    let mut last = 0;
    while at + 4 <= hs.len() {
        last = u16::from_be_bytes([hs[at], hs[at + 1]]);
        at += 4 + u16::from_be_bytes([hs[at + 2], hs[at + 3]]) as usize;
    }
    last
}

#[test]
fn a_resumed_session_still_authenticates_the_server_and_a_tampered_ticket_fails_cleanly() {
    const PRE_SHARED_KEY: u16 = 41;
    let d = Sucld::start(&[]);
    let impostor = Sucld::start(&[]);
    let t = Duration::from_secs(10);
    // A first connection (full handshake) leaves a ticket, which comes before the welcome.
    drop(raw_greet(&d.addr, &d.tls()));
    // The ticket is offered to whoever answers at another address under the same name; a
    // server that did not issue it cannot resume, so the handshake is a full one and the
    // impostor's certificate is checked against the pin — and refused.
    let e = sucl_remote::transport::connect(&impostor.addr, &d.tls(), t).err().expect("the impostor was trusted");
    assert!(e.to_string().contains("is not pinned"), "{e}");
    // A binder flipped on the way: the server refuses the handshake; the client gets a clear
    // TLS error, within its timeout.
    drop(raw_greet(&d.addr, &d.tls())); // a fresh ticket
    let (proxy, last) = binder_tamperer(d.addr.clone());
    let t0 = Instant::now();
    let e = sucl_remote::transport::connect(&proxy, &d.tls(), t).err().expect("a tampered ticket was accepted");
    assert_eq!(last.recv().unwrap(), PRE_SHARED_KEY, "the flipped byte was an offered ticket's binder");
    assert!(e.to_string().contains("TLS"), "{e}");
    assert!(t0.elapsed() < t, "the failure took {:?}", t0.elapsed());
    // The server is unharmed and the client still gets in (and authenticates it) directly.
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
    assert!(matches!(read(&mut s), Some(Frame::Opened { .. })));
    assert_eq!(s.peer_pin(), d.pin);
}

fn in_process(handshake_timeout: Duration) -> (Daemon, ClientOptions) {
    let token = Token::generate();
    let mut cfg = DaemonConfig::new(token.clone());
    cfg.handshake_timeout = handshake_timeout;
    let d = Daemon::start(cfg).unwrap();
    let mut o = ClientOptions::new(token).pin(d.tls_pin().unwrap());
    o.reconnect_window = Duration::from_secs(1); // a client left behind gives up soon
    (d, o)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connection_threads_are_reused_and_bounded_and_shutdown_closes_the_port() {
    let (d, o) = in_process(Duration::from_secs(5));
    let addr = d.local_addr().to_string();
    let tls = Tls::Pinned(vec![d.tls_pin().unwrap()]);
    // More connections at once than threads wait in accept: each is served (one thread each).
    let links: Vec<_> = (0..5).map(|_| raw_greet(&addr, &tls)).collect();
    assert!(d.connection_threads() >= 6, "5 serving and one waiting: {}", d.connection_threads());
    drop(links);
    // Their threads end or wait again, at most two waiting.
    wait_until("the threads of ended connections end", || d.connection_threads() <= 2);
    // Re-attaches reuse threads: one serving, at most two waiting, however many there were.
    let r = Remote::connect(&addr, o).unwrap();
    for _ in 0..30 {
        r.drop_connection();
        r.nop().unwrap();
    }
    assert_eq!(r.reconnects(), 30);
    wait_until("the threads settle", || d.connection_threads() <= 3);
    d.shutdown();
    assert!(TcpStream::connect(&addr).is_err(), "the port is closed once the daemon shut down");
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_timeout_and_blocks_no_one() {
    let (d, o) = in_process(Duration::from_millis(300));
    let addr = d.local_addr().to_string();
    let mut silent = TcpStream::connect(&addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Meanwhile another client gets in and works.
    let r = Remote::connect(&addr, o).unwrap();
    r.nop().unwrap();
    // The silent one is closed by the server: its read ends (no TLS handshake ever began).
    let t0 = Instant::now();
    let n = silent.read(&mut [0u8; 64]).expect("the server closed it before the test's own timeout");
    assert_eq!(n, 0);
    assert!(t0.elapsed() < Duration::from_secs(5), "closed after {:?}", t0.elapsed());
    r.nop().unwrap();
}
