//! The peer-memory path's protocol against a real `sucld` (host devices: no GPU here), with the
//! test as the other mesh member, speaking the peer protocol by hand: a destination that cannot
//! take a peer-memory offer refuses it, saying why (and whether for good), answers the same offer
//! sent again alike (as after a cut), and then takes the bytes over the link, exactly once.

mod common;
use common::*;
use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;
use sucl_remote::auth::{random, MeshKey, Nonces};
use sucl_remote::transport::Link;
use sucl_remote::wire::{self, Command, Frame, Outcome, PeerSpec};
use sucl_remote::{Arg, PeerPath, Remote};

/// This machine as a daemon names it in offers (the same hash of the boot id, else the host
/// name), so that an offer from "this host" gets past the host check.
fn this_node() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let id = read("/proc/sys/kernel/random/boot_id");
    let id = if id.is_empty() { read("/proc/sys/kernel/hostname") } else { id };
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Serves the daemon's outgoing link to member 0 (plain TCP: member 0's pin is zero): the
/// handshake, checking the daemon's proof of the mesh key; returns the link.
fn accept_member_link(l: &TcpListener, mesh: [u8; 16], key: &MeshKey) -> Link {
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = Link::plain(s);
    let client = match read(&mut s) {
        Some(Frame::Hello { nonce, .. }) => nonce,
        other => panic!("expected the daemon's hello, got {other:?}"),
    };
    let server: [u8; 16] = random();
    let welcome = Frame::Welcome { version: wire::VERSION, features: 0, max_frame: 1 << 20, nonce: server };
    s.write_all(&welcome.encode()).unwrap();
    let n = Nonces { client, server };
    match read(&mut s) {
        Some(Frame::PeerOpen { mesh: m, from: 1, to: 0, mac }) if m == mesh && key.check_open(&n, &mesh, 1, 0, &mac) => {}
        other => panic!("expected the daemon's authenticated peer open, got {other:?}"),
    }
    s.write_all(&Frame::PeerOpened { mac: key.opened_proof(&n, &mesh) }.encode()).unwrap();
    s
}

/// Runs one offer → refusal → offer again → same refusal → bytes over the link on a daemon
/// started with `args`; returns the refusal's (permanent, reason).
fn refused_then_sent_over_the_link(args: &[&str], node: u64) -> (bool, String) {
    let b = Sucld::start(args);
    let rb = Remote::connect(&b.addr, b.options()).unwrap();
    let q = rb.devices().unwrap()[0].queue().unwrap();
    let x = q.alloc::<u8>(64).unwrap();
    let Arg::Buffer(id) = x.arg() else { unreachable!() };
    // A mesh of two: the daemon (member 1) and this test (member 0).
    let (mesh, key): ([u8; 16], [u8; 32]) = (random(), random());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = PeerSpec { index: 0, address: listener.local_addr().unwrap().to_string(), pin: [0; 32] };
    rb.call_raw(Command::JoinMesh { mesh, key, index: 1, peers: vec![me] }).unwrap();
    let (mut to_b, n) = raw_greet(&b.addr, &b.tls());
    to_b.write_all(&Frame::PeerOpen { mesh, from: 0, to: 1, mac: MeshKey(key).open_proof(&n, &mesh, 0, 1) }.encode()).unwrap();
    assert!(matches!(read(&mut to_b), Some(Frame::PeerOpened { .. })));
    // The receiving command waits for transfer 7 (in its own thread: it answers once the bytes
    // are in).
    let r2 = rb.clone();
    let migrate_in = std::thread::spawn(move || r2.call_raw(Command::MigrateIn { buffer: id, offset: 0, len: 64, peer: 0, transfer: 7 }));
    let offer = Frame::PeerMemOffer { transfer: 7, node, pid: std::process::id(), handle: [3; 64], offset: 0, len: 64, event: [4; 64] };
    to_b.write_all(&offer.encode()).unwrap();
    let mut from_b = accept_member_link(&listener, mesh, &MeshKey(key));
    let answer = read(&mut from_b);
    let (permanent, reason) = match &answer {
        Some(Frame::PeerMemRefused { transfer: 7, permanent, reason }) => (*permanent, reason.clone()),
        other => panic!("expected a refusal of transfer 7, got {other:?}"),
    };
    // The offer again, as a source sends it after a link was made again: answered alike.
    to_b.write_all(&offer.encode()).unwrap();
    assert_eq!(read(&mut from_b), answer, "an offer sent again is answered as the first time");
    // The bytes over the link, as the source sends them after a refusal.
    let data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    to_b.write_all(&Frame::PeerData { transfer: 7, total: 64, offset: 0, data: data.clone() }.encode()).unwrap();
    assert_eq!(read(&mut from_b), Some(Frame::PeerReceived { transfer: 7, received: 64 }));
    assert_eq!(migrate_in.join().unwrap().unwrap(), Outcome::Done);
    assert_eq!(x.to_vec().unwrap(), data);
    let st = rb.stats().unwrap();
    assert_eq!((st.migrations_network, st.migrations_peer_memory, st.migrated_bytes), (1, 0, 64), "{st:?}");
    (permanent, reason)
}

#[test]
fn a_host_buffer_refuses_a_peer_memory_offer_for_this_transfer_and_takes_the_bytes_over_the_link() {
    let (permanent, reason) = refused_then_sent_over_the_link(&["--peer-path", "auto"], this_node());
    assert!(!permanent, "a host buffer refuses this transfer only: {reason}");
    assert!(reason.contains("host memory"), "{reason}");
}

#[test]
fn offers_from_another_host_or_to_a_daemon_forced_to_the_network_are_refused_for_good() {
    let (permanent, reason) = refused_then_sent_over_the_link(&["--peer-path", "auto"], this_node() ^ 1);
    assert!(permanent && reason.contains("different hosts"), "{permanent} {reason}");
    let (permanent, reason) = refused_then_sent_over_the_link(&["--peer-path", "network"], this_node());
    assert!(permanent && reason.contains(PeerPath::ENV) && reason.contains("--peer-path network"), "{permanent} {reason}");
}
