//! Several daemons (real processes on loopback) as one client's peer mesh: server-to-server
//! migration, completion notices between servers, content size, peer authentication, a killed
//! member, and exactly-once execution with migrations across random connection cuts.

mod common;
use common::*;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use sucl_remote::auth::{random, MeshKey};
use sucl_remote::wire::{Command, Frame, PeerSpec};
use sucl_remote::{Arg, Mesh, Remote, RemoteError};

/// Sessions on `ds`, each reached through its own byte-counting proxy (the client's link),
/// made one mesh whose members reach each other directly.
fn mesh_behind_proxies(ds: &[&Sucld]) -> (Vec<Remote>, Vec<FaultProxy>, Mesh) {
    let proxies: Vec<FaultProxy> = ds.iter().map(|d| FaultProxy::counting(&d.addr)).collect();
    let rs: Vec<Remote> = ds
        .iter()
        .zip(&proxies)
        .map(|(d, p)| {
            let r = Remote::connect(&p.addr, d.options()).unwrap();
            r.set_peer_address(&d.addr);
            r
        })
        .collect();
    let mesh = Mesh::new(&rs).unwrap();
    (rs, proxies, mesh)
}

#[test]
fn a_buffer_migrates_server_to_server_and_the_client_link_carries_none_of_it() {
    let (a, b) = (Sucld::start(&[]), Sucld::start(&[]));
    let (rs, proxies, _mesh) = mesh_behind_proxies(&[&a, &b]);
    let qa = rs[0].devices().unwrap()[0].queue().unwrap();
    let qb = rs[1].devices().unwrap()[0].queue().unwrap();
    const N: usize = 1 << 20; // 8 MiB
    let src: Vec<u64> = (0..N as u64).map(|i| i * 3 + 1).collect();
    let xa = qa.upload(&src).unwrap();
    qa.synchronize().unwrap();
    let mut xb = qb.alloc::<u64>(N).unwrap();
    qb.synchronize().unwrap();
    let before: u64 = proxies.iter().map(|p| p.bytes.load(Ordering::SeqCst)).sum();
    xb.migrate_from(&xa).unwrap();
    qb.synchronize().unwrap(); // B answers once the bytes are in
    let during: u64 = proxies.iter().map(|p| p.bytes.load(Ordering::SeqCst)).sum::<u64>() - before;
    assert!(during < 64 << 10, "{during} bytes crossed the client's links for an 8 MiB migration");
    assert_eq!(xb.to_vec().unwrap(), src);
    assert!(rs[1].stats().unwrap().peer_frames >= 8, "the bytes came over the peer link");
    // Back the other way, after a kernel on B changed them.
    qb.launch("increment_u64", &[xb.arg()], 0).unwrap();
    let mut xa2 = qa.alloc::<u64>(N).unwrap();
    xa2.migrate_from(&xb).unwrap();
    let back = xa2.to_vec().unwrap();
    assert!(back.iter().zip(&src).all(|(x, s)| *x == s + 1));
}

#[test]
fn a_dependent_chain_crosses_servers_with_notices_only_to_the_servers_that_wait() {
    let (a, b, c) = (Sucld::start(&[]), Sucld::start(&[]), Sucld::start(&[]));
    let (rs, _proxies, _mesh) = mesh_behind_proxies(&[&a, &b, &c]);
    let qa = rs[0].devices().unwrap()[0].queue().unwrap();
    let qb = rs[1].devices().unwrap()[0].queue().unwrap();
    let qc = rs[2].devices().unwrap()[0].queue().unwrap();
    let xa = qa.upload(&[10u64; 16]).unwrap();
    let mut xb = qb.alloc::<u64>(16).unwrap();
    let flag_b = qb.alloc::<u64>(1).unwrap();
    let mut xa_back = qa.alloc::<u64>(1).unwrap();
    qa.synchronize().unwrap();
    qb.synchronize().unwrap();
    let frames_before: Vec<u64> = rs.iter().map(|r| r.stats().unwrap().peer_frames).collect();
    // The whole chain is submitted without waiting: kernel on A (slow) → migrate to B →
    // kernel on B → event on B that A waits for → migrate back → read on A.
    qa.launch("sleep_ms", &[Arg::U64(100)], 0).unwrap();
    qa.launch("increment_u64", &[xa.arg()], 0).unwrap();
    xb.migrate_from(&xa).unwrap();
    qb.launch("increment_u64", &[xb.arg()], 0).unwrap();
    qb.launch("increment_u64", &[flag_b.arg()], 0).unwrap();
    let ev_b = qb.record().unwrap();
    qa.wait_for(&ev_b).unwrap(); // A learns of B's event from B
    xa_back.migrate_from(&flag_b).unwrap();
    let t0 = Instant::now();
    assert_eq!(xa_back.to_vec().unwrap(), [1]);
    assert!(t0.elapsed() >= Duration::from_millis(90), "the read did wait for the chain");
    assert_eq!(xb.to_vec().unwrap(), [12u64; 16]);
    let delta: Vec<u64> = rs.iter().zip(&frames_before).map(|(r, b)| r.stats().unwrap().peer_frames - b).collect();
    // A: a notice of B's event, the migrated flag, and B's receipt for the first migration's
    // data (and nothing else); B: the data of the first migration; C: nothing — no one
    // waited on it and it waited on no one.
    assert_eq!(delta[0], 3, "A receives B's notice, the migrated flag and B's receipt: {delta:?}");
    assert!(delta[1] >= 2, "B receives A's data and A's subscription: {delta:?}");
    assert_eq!(delta[2], 0, "C takes part in nothing and hears nothing: {delta:?}");
    qc.synchronize().unwrap();
}

#[test]
fn content_size_limits_reads_copies_and_migrations_to_the_meaningful_bytes() {
    let (a, b) = (Sucld::start(&[]), Sucld::start(&[]));
    let (rs, _proxies, _mesh) = mesh_behind_proxies(&[&a, &b]);
    let qa = rs[0].devices().unwrap()[0].queue().unwrap();
    let qb = rs[1].devices().unwrap()[0].queue().unwrap();
    let data: Vec<u32> = (0..4096).collect();
    let mut xa = qa.upload(&data).unwrap();
    let size_a = qa.upload(&[400u64]).unwrap(); // 100 meaningful u32s
    xa.set_content_size(Some(&size_a)).unwrap();
    assert_eq!(xa.read_content().unwrap(), &data[..100]);
    // A copy on one server moves only the meaningful bytes.
    let mut ya = qa.upload(&vec![7u32; 4096]).unwrap();
    ya.copy_from(&xa).unwrap();
    let y = ya.to_vec().unwrap();
    assert_eq!(&y[..100], &data[..100]);
    assert!(y[100..].iter().all(|v| *v == 7), "bytes past the content size were copied");
    // A migration sends only them, and sets the destination's size buffer.
    let mut xb = qb.upload(&vec![u32::MAX; 4096]).unwrap();
    let size_b = qb.alloc::<u64>(1).unwrap();
    xb.set_content_size(Some(&size_b)).unwrap();
    let frames = rs[1].stats().unwrap().peer_frames;
    xb.migrate_from(&xa).unwrap();
    assert_eq!(size_b.to_vec().unwrap(), [400]);
    assert_eq!(xb.read_content().unwrap(), &data[..100]);
    xb.set_content_size::<u64>(None).unwrap();
    let all = xb.to_vec().unwrap();
    assert!(all[100..].iter().all(|v| *v == u32::MAX), "bytes past the content size were migrated");
    assert_eq!(rs[1].stats().unwrap().peer_frames - frames, 1, "400 bytes travel in one piece");
    // Bad size buffers are refused, naming the problem.
    let tiny = qa.alloc::<u8>(4).unwrap();
    let mut tb = qa.alloc::<u64>(4).unwrap();
    tb.set_content_size(Some(&tiny)).unwrap();
    let e = qa.synchronize().unwrap_err().to_string();
    assert!(e.contains("must be another buffer of at least 8 bytes"), "{e}");
}

#[test]
fn peer_links_without_the_mesh_key_are_refused() {
    let (a, b) = (Sucld::start(&[]), Sucld::start(&[]));
    let ra = Remote::connect(&a.addr, a.options()).unwrap();
    let rb = Remote::connect(&b.addr, b.options()).unwrap();
    // A mesh made by hand, so that the test knows its id (a client never reveals its key).
    let (mesh, key): ([u8; 16], [u8; 32]) = (random(), random());
    let spec = |i: u32, d: &Sucld| PeerSpec { index: i, address: d.addr.clone(), pin: d.pin.unwrap() };
    let join = |r: &Remote, i: u32, other: PeerSpec| {
        // JoinMesh through the public protocol: a raw session would do as well.
        r.call_raw(Command::JoinMesh { mesh, key, index: i, peers: vec![other] }).unwrap()
    };
    join(&ra, 0, spec(1, &b));
    join(&rb, 1, spec(0, &a));
    let open = |mac_key: &MeshKey, mesh_id: [u8; 16], from: u32, to: u32| {
        let (mut s, n) = raw_greet(&b.addr, &b.tls());
        s.write_all(&Frame::PeerOpen { mesh: mesh_id, from, to, mac: mac_key.open_proof(&n, &mesh_id, from, to) }.encode()).unwrap();
        read(&mut s)
    };
    let why = |f: Option<Frame>| match f {
        Some(Frame::Refused { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Without the key (a guessed one), with the right key but an unknown mesh, and as a member
    // the mesh does not have: each refused.
    assert!(why(open(&MeshKey(random()), mesh, 0, 1)).contains("does not hold this mesh's key"));
    assert!(why(open(&MeshKey(key), random(), 0, 1)).contains("no such mesh"));
    assert!(why(open(&MeshKey(key), mesh, 5, 1)).contains("does not fit this member"));
    // With the key, the link opens.
    assert!(matches!(open(&MeshKey(key), mesh, 0, 1), Some(Frame::PeerOpened { .. })));
}

#[test]
fn killing_a_member_fails_the_calls_waiting_on_it_naming_it_and_the_others_keep_serving() {
    let (mut a, b, c) = (Sucld::start(&[]), Sucld::start(&[]), Sucld::start(&[]));
    let opts = |d: &Sucld| {
        let mut o = d.options();
        o.reconnect_window = Duration::from_millis(500);
        o
    };
    let rs: Vec<Remote> = [&a, &b, &c].iter().map(|d| Remote::connect(&d.addr, opts(d)).unwrap()).collect();
    let _mesh = Mesh::new(&rs).unwrap();
    let qa = rs[0].devices().unwrap()[0].queue().unwrap();
    let qb = rs[1].devices().unwrap()[0].queue().unwrap();
    let qc = rs[2].devices().unwrap()[0].queue().unwrap();
    let xa = qa.alloc::<u64>(8).unwrap();
    let mut xc = qc.alloc::<u64>(8).unwrap();
    qa.launch("sleep_ms", &[Arg::U64(8_000)], 0).unwrap();
    let ev_a = qa.record().unwrap();
    qb.wait_for(&ev_a).unwrap();
    xc.migrate_from(&xa).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for (name, q) in [("a", qa.clone()), ("b", qb.clone()), ("c", qc.clone())] {
        let tx = tx.clone();
        std::thread::spawn(move || tx.send((name, q.synchronize())).unwrap());
    }
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    a.kill();
    let mut got = std::collections::HashMap::new();
    for _ in 0..3 {
        let (name, r) = rx.recv_timeout(Duration::from_secs(20)).expect("a waiting call did not return");
        got.insert(name, r);
    }
    eprintln!("all three waiting calls returned {:?} after the kill", t0.elapsed());
    match &got["a"] {
        Err(e @ RemoteError::Lost { .. }) => assert!(e.to_string().contains(&a.addr), "{e}"),
        other => panic!("the killed server's own call: {other:?}"),
    }
    for (name, d) in [("b", &b), ("c", &c)] {
        match &got[name] {
            Err(e @ RemoteError::Failed { server, .. }) => {
                assert_eq!(server, &d.addr);
                assert!(e.to_string().contains(&format!("peer server {}", a.addr)), "{name}: {e}");
            }
            other => panic!("{name}: expected a failure naming the killed peer, got {other:?}"),
        }
    }
    // The others keep serving.
    let yb = qb.upload(&[5u64]).unwrap();
    assert_eq!(yb.to_vec().unwrap(), [5]);
    rs[2].nop().unwrap();
}

/// One scripted run over two servers: `n` commands — counter increments on both, writes,
/// reads, and migrations A → B and B → A — returning every read and the final counters.
fn scripted_mesh_run(ra: &Remote, rb: &Remote, n: usize, seed: u64) -> (Vec<Vec<u64>>, [Vec<u64>; 2], u64) {
    let qa = ra.devices().unwrap()[0].queue().unwrap();
    let qb = rb.devices().unwrap()[0].queue().unwrap();
    let counters = [qa.alloc::<u64>(64).unwrap(), qb.alloc::<u64>(64).unwrap()];
    let mut data = [qa.alloc::<u64>(256).unwrap(), qb.alloc::<u64>(256).unwrap()];
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut reads, mut migrations) = (Vec::new(), 0);
    let qs = [&qa, &qb];
    for _ in 0..n {
        let side = (rnd() % 2) as usize;
        match rnd() % 20 {
            0..=10 => qs[side].launch("increment_u64", &[counters[side].arg()], 1 + rnd() % 64).unwrap(),
            11..=15 => {
                let at = (rnd() % 250) as usize;
                let v: Vec<u64> = (0..1 + rnd() % 6).map(|_| rnd()).collect();
                data[side].write(at, &v).unwrap();
            }
            16..=17 => {
                let [d0, d1] = &mut data;
                if side == 0 {
                    d1.migrate_from(d0).unwrap();
                } else {
                    d0.migrate_from(d1).unwrap();
                }
                migrations += 1;
            }
            18 => {
                // The other server waits for an event of this one (a notice between servers).
                let ev = qs[side].record().unwrap();
                qs[1 - side].wait_for(&ev).unwrap();
            }
            _ => reads.push(data[side].read((rnd() % 200) as usize, 50).unwrap()),
        }
    }
    reads.push(data[0].to_vec().unwrap());
    reads.push(data[1].to_vec().unwrap());
    (reads, [counters[0].to_vec().unwrap(), counters[1].to_vec().unwrap()], migrations)
}

#[test]
fn commands_and_migrations_run_exactly_once_across_random_cuts_of_the_client_links() {
    // SUCL_REMOTE_FAULT_SCALE multiplies the 10 000 commands (and the cuts with them).
    let scale: f64 = std::env::var("SUCL_REMOTE_FAULT_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let n = (10_000.0 * scale) as usize;
    let (a, b) = (Sucld::start(&[]), Sucld::start(&[]));
    let clean: Vec<Remote> = [&a, &b].iter().map(|d| Remote::connect(&d.addr, d.options()).unwrap()).collect();
    let _m1 = Mesh::new(&clean).unwrap();
    let t0 = Instant::now();
    let (want_reads, want_counters, migrations) = scripted_mesh_run(&clean[0], &clean[1], n, 11);
    let clean_time = t0.elapsed();
    assert!(migrations > n as u64 / 20, "{migrations} migrations");
    // The same script with both client links through proxies that cut every connection after
    // a random number of bytes (mean 20 KiB: about a hundred cuts in all at the default scale).
    let proxies = [FaultProxy::start(&a.addr, 20 << 10, 5), FaultProxy::start(&b.addr, 20 << 10, 77)];
    let faulty: Vec<Remote> = [&a, &b]
        .iter()
        .zip(&proxies)
        .map(|(d, p)| {
            // Opening a session is not resumable (there is none yet): a cut there means another try.
            let r = (0..20).find_map(|_| Remote::connect(&p.addr, d.options()).ok()).expect("no session opened in 20 tries");
            r.set_peer_address(&d.addr);
            r
        })
        .collect();
    let _m2 = Mesh::new(&faulty).unwrap();
    let t0 = Instant::now();
    let (reads, counters, _) = scripted_mesh_run(&faulty[0], &faulty[1], n, 11);
    let faulty_time = t0.elapsed();
    proxies.iter().for_each(FaultProxy::calm);
    let cuts: u64 = proxies.iter().map(|p| p.cuts.load(Ordering::SeqCst)).sum();
    let reconnects: u64 = faulty.iter().map(Remote::reconnects).sum();
    assert!(cuts as f64 >= 50.0 * scale, "only {cuts} cuts: the test did not exercise reconnects");
    assert_eq!(reads, want_reads, "reads differ from the fault-free run");
    assert_eq!(counters, want_counters, "counters differ: some increment ran twice or never");
    for r in &faulty {
        let stats = r.stats().unwrap();
        assert_eq!(stats.executed, r.commands_sent(), "every sequence number executed exactly once on {}", r.server());
    }
    eprintln!("{n} commands ({migrations} migrations), {cuts} cuts, {reconnects} re-attaches; fault-free {clean_time:?}, with cuts {faulty_time:?}");
}

/// Sessions on `ds`, reached by the client directly; each member reaches each other one
/// through that one's fault proxy (the links between servers), cutting connections after
/// `mean_bytes` on average (0: never).
fn mesh_with_peer_proxies(ds: &[&Sucld], mean_bytes: u64, seed: u64) -> (Vec<Remote>, Vec<FaultProxy>, Mesh) {
    let proxies: Vec<FaultProxy> = ds.iter().enumerate().map(|(i, d)| FaultProxy::start(&d.addr, mean_bytes, seed + i as u64)).collect();
    let rs: Vec<Remote> = ds
        .iter()
        .zip(&proxies)
        .map(|(d, p)| {
            let r = Remote::connect(&d.addr, d.options()).unwrap();
            r.set_peer_address(&p.addr);
            r
        })
        .collect();
    let mesh = Mesh::new(&rs).unwrap();
    (rs, proxies, mesh)
}

#[test]
fn migrations_and_notices_resume_exactly_once_across_cuts_of_the_links_between_servers() {
    let scale: f64 = std::env::var("SUCL_REMOTE_FAULT_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let n = (3000.0 * scale) as usize;
    let (a, b) = (Sucld::start(&[]), Sucld::start(&[]));
    let clean: Vec<Remote> = [&a, &b].iter().map(|d| Remote::connect(&d.addr, d.options()).unwrap()).collect();
    let _m1 = Mesh::new(&clean).unwrap();
    let (want_reads, want_counters, migrations) = scripted_mesh_run(&clean[0], &clean[1], n, 23);
    let fds = |d: &Sucld| std::fs::read_dir(format!("/proc/{}/fd", d.child.id())).map(|r| r.count()).unwrap_or(0);
    let fds_before = [fds(&a), fds(&b)];
    // The same script with every server-to-server connection cut after ~32 KiB (both ways;
    // more often and no TLS record of 16 KiB would get through): migrations break
    // mid-transfer, notices and receipts are lost in flight.
    let (faulty, proxies, _m2) = mesh_with_peer_proxies(&[&a, &b], 32 << 10, 41);
    let t0 = Instant::now();
    let (reads, counters, _) = scripted_mesh_run(&faulty[0], &faulty[1], n, 23);
    // A transfer of 1 MiB is cut dozens of times on its way and resumes where it stopped.
    let qa = faulty[0].devices().unwrap()[0].queue().unwrap();
    let qb = faulty[1].devices().unwrap()[0].queue().unwrap();
    let big: Vec<u64> = (0..1u64 << 17).map(|i| i * 7 + 3).collect();
    let xa = qa.upload(&big).unwrap();
    let mut xb = qb.alloc::<u64>(big.len()).unwrap();
    xb.migrate_from(&xa).unwrap();
    assert!(xb.to_vec().unwrap() == big, "the big transfer arrived wrong");
    let took = t0.elapsed();
    let cuts: u64 = proxies.iter().map(|p| p.cuts.load(Ordering::SeqCst)).sum();
    proxies.iter().for_each(FaultProxy::calm);
    assert!(cuts >= 50, "only {cuts} cuts between the servers: the test did not exercise peer reconnects");
    assert_eq!(reads, want_reads, "reads differ from the run without cuts");
    assert_eq!(counters, want_counters, "counters differ: some increment ran twice or never");
    for r in &faulty {
        assert_eq!(r.stats().unwrap().executed, r.commands_sent(), "every command executed exactly once on {}", r.server());
        assert_eq!(r.reconnects(), 0, "the client's own links were never cut");
    }
    // No socket of a broken link stays open (a new session and its links account for a few).
    std::thread::sleep(Duration::from_millis(200));
    let fds_after = [fds(&a), fds(&b)];
    for (before, after) in fds_before.iter().zip(fds_after) {
        assert!(after < before + 12, "file descriptors grew from {before} to {after} over {cuts} cuts: broken links leak");
    }
    eprintln!("{n} commands ({migrations} migrations) and a 1 MiB transfer with {cuts} cuts between the servers: {took:?}; fds {fds_before:?} → {fds_after:?}");
}

#[test]
fn a_severed_link_between_servers_fails_the_waiting_commands_naming_both_servers() {
    let (a, b) = (Sucld::start(&["--peer-timeout-ms", "1500"]), Sucld::start(&["--peer-timeout-ms", "1500"]));
    let (rs, proxies, _mesh) = mesh_with_peer_proxies(&[&a, &b], 0, 1);
    let qa = rs[0].devices().unwrap()[0].queue().unwrap();
    let qb = rs[1].devices().unwrap()[0].queue().unwrap();
    let xa = qa.upload(&[1u64, 2, 3]).unwrap();
    let mut xb = qb.alloc::<u64>(3).unwrap();
    xb.migrate_from(&xa).unwrap();
    assert_eq!(xb.to_vec().unwrap(), [1, 2, 3], "the links work before the cut");
    // The way from A to B is gone for good (its connection cut, new ones dropped): A's
    // migration cannot send, B's cannot receive, and B never hears of A's event.
    proxies[1].sever();
    let t0 = Instant::now();
    xb.migrate_from(&xa).unwrap();
    let ev = qa.record().unwrap();
    qb.wait_for(&ev).unwrap();
    let (ea, eb) = (qa.synchronize().unwrap_err(), qb.synchronize().unwrap_err());
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(15), "the failures took {took:?}");
    // Each error comes from its server and names the other as that server reaches it.
    match &ea {
        RemoteError::Failed { server, .. } => assert_eq!(server, &a.addr, "{ea}"),
        other => panic!("A: {other:?}"),
    }
    assert!(ea.to_string().contains(&format!("peer server {} (mesh member 1)", proxies[1].addr)), "A: {ea}");
    match &eb {
        RemoteError::Failed { server, .. } => assert_eq!(server, &b.addr, "{eb}"),
        other => panic!("B: {other:?}"),
    }
    assert!(eb.to_string().contains(&format!("peer server {} (mesh member 0)", proxies[0].addr)), "B: {eb}");
    eprintln!("after the cut, in {took:?}:\n  {ea}\n  {eb}");
    // Both keep serving their client.
    rs[0].nop().unwrap();
    assert_eq!(xb.to_vec().unwrap(), [1, 2, 3]);
}

#[test]
fn a_blocked_matmul_round_a_ring_of_three_servers_equals_the_local_product_bit_for_bit() {
    use sucl_remote::kernels::{gemm, Gemm};
    let ds = [Sucld::start(&[]), Sucld::start(&[]), Sucld::start(&[])];
    let rs: Vec<Remote> = ds.iter().map(|d| Remote::connect(&d.addr, d.options()).unwrap()).collect();
    let _mesh = Mesh::new(&rs).unwrap();
    let qs: Vec<_> = rs.iter().map(|r| r.devices().unwrap()[0].queue().unwrap()).collect();
    let (n, d) = (24, 3);
    let w = n / d;
    let a: Vec<f64> = (0..n * n).map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0).collect();
    let b: Vec<f64> = (0..n * n).map(|i| ((i * 53 % 89) as f64 - 44.0) / 3.0).collect();
    let mut want = vec![0.0; n * n];
    gemm(&mut want, &a, &b, Gemm { m: n, n, k: n, ldc: n, col0: 0 }).unwrap();
    let b_cols = |j: usize| -> Vec<f64> { (0..n).flat_map(|r| b[r * n + j * w..r * n + (j + 1) * w].to_vec()).collect() };
    let ak: Vec<_> = (0..d).map(|k| qs[k].upload(&a[k * w * n..(k + 1) * w * n]).unwrap()).collect();
    let ck: Vec<_> = (0..d).map(|k| qs[k].alloc::<f64>(w * n).unwrap()).collect();
    let mut cur: Vec<_> = (0..d).map(|k| qs[k].upload(&b_cols(k)).unwrap()).collect();
    let mut next: Vec<_> = (0..d).map(|k| qs[k].alloc::<f64>(n * w).unwrap()).collect();
    for s in 0..d {
        if s + 1 < d {
            for (k, block) in cur.iter().enumerate() {
                next[(k + d - 1) % d].migrate_from(block).unwrap();
            }
        }
        for (k, q) in qs.iter().enumerate() {
            let col0 = ((k + s) % d * w) as u64;
            let args = [
                ck[k].arg(),
                ak[k].arg(),
                cur[k].arg(),
                Arg::U64(w as u64),
                Arg::U64(w as u64),
                Arg::U64(n as u64),
                Arg::U64(n as u64),
                Arg::U64(col0),
            ];
            q.launch("gemm_f64", &args, 0).unwrap();
        }
        std::mem::swap(&mut cur, &mut next);
    }
    for k in 0..d {
        let got = ck[k].to_vec().unwrap();
        assert!(got.iter().zip(&want[k * w * n..]).all(|(x, y)| x.to_bits() == y.to_bits()), "rows of server {k} differ");
    }
    // A shape that does not fit its buffers is refused by the kernel, naming it.
    qs[0]
        .launch(
            "gemm_f64",
            &[
                ck[0].arg(),
                ak[0].arg(),
                cur[0].arg(),
                Arg::U64(n as u64),
                Arg::U64(w as u64),
                Arg::U64(n as u64),
                Arg::U64(n as u64),
                Arg::U64(0),
            ],
            0,
        )
        .unwrap();
    let e = qs[0].synchronize().unwrap_err().to_string();
    assert!(e.contains("kernel `gemm_f64`") && e.contains("does not fit"), "{e}");
}
