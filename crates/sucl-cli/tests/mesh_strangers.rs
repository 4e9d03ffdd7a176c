//! Real processes: a job on the tcp backend completes while a stranger keeps connecting to the
//! ports its ranks' meshes listen on (`SUCL_PORT_RANGE`); no stranger gets past the challenge.

mod common;

use common::{finish, free_port, sucl, Reaped};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Challenge frame: a 40-byte header and a 32-byte nonce.
const CHALLENGE: usize = 72;

/// What the stranger saw: connections that got a challenge, and bytes any got beyond it.
#[derive(Default)]
struct Seen {
    challenged: AtomicUsize,
    beyond: AtomicUsize,
}

/// Answers a challenge with garbage (or, every other time, with silence) and reads whatever
/// comes back until the rank closes the connection.
fn pester(mut s: TcpStream, silent: bool, seen: &Seen) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut challenge = [0u8; CHALLENGE];
    if s.read_exact(&mut challenge).is_err() {
        return;
    }
    seen.challenged.fetch_add(1, Ordering::Relaxed);
    if !silent {
        let _ = s.write_all(&[0x5a; 104]);
    }
    let mut rest = vec![];
    let _ = s.read_to_end(&mut rest);
    seen.beyond.fetch_add(rest.len(), Ordering::Relaxed);
}

#[test]
fn a_job_completes_while_a_stranger_knocks_on_its_mesh_ports() {
    let low = free_port();
    let ports: Vec<u16> = (low..low.saturating_add(24)).collect();
    let range = format!("{}-{}", ports[0], ports[ports.len() - 1]);
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let stranger = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut threads = vec![];
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) && threads.len() < 400 {
                for &p in &ports {
                    let addr = SocketAddr::from(([127, 0, 0, 1], p));
                    if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(20)) {
                        k += 1;
                        let seen = seen.clone();
                        threads.push(std::thread::spawn(move || pester(s, k.is_multiple_of(2), &seen)));
                    }
                }
            }
            for t in threads {
                let _ = t.join();
            }
        })
    };
    let mut cmd = sucl();
    cmd.args(["check", "--ranks", "3", "--backend", "tcp", "--ops", "all_reduce,broadcast", "--dtypes", "f32", "--redops", "sum"])
        .env("SUCL_PORT_RANGE", &range)
        .env("SUCL_TIMEOUT", "60")
        .env("RUST_LOG", "sucl_host=warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = finish(Reaped(cmd.spawn().expect("spawn sucl check")), Duration::from_secs(300), "tcp job with a stranger");
    stop.store(true, Ordering::Relaxed);
    stranger.join().unwrap();
    assert!(out.status.success() && out.stdout.contains(" 0 wrong"), "{}\n{}", out.stdout, out.stderr);
    let challenged = seen.challenged.load(Ordering::Relaxed);
    assert_eq!(seen.beyond.load(Ordering::Relaxed), 0, "a stranger got an answer beyond the challenge");
    assert!(challenged > 0, "the stranger never reached a mesh port while the job set up its meshes");
    assert!(out.stderr.contains("tcp mesh: refused a connection"), "{challenged} challenged, no refusal logged:\n{}", out.stderr);
}
