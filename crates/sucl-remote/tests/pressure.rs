//! Large transfers from several threads of one session at once, and connections that stall:
//! neither side writes without reading, every call returns within its timeout, and a stalled
//! connection is re-made as a cut one is.

mod common;
use common::*;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use sucl_remote::{Remote, RemoteError};

/// 16 MiB of `u32`.
const ELEMS: usize = 4 << 20;

/// On one session, three threads read a whole 16 MiB buffer while a fourth overwrites another
/// 16 MiB buffer, `rounds` times each. Every value read is the one uploaded; every write lands.
/// A thread that never reports means the session deadlocked (its threads are left behind).
fn readers_and_a_writer(d: &Sucld, rounds: u32) {
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    let src: Arc<Vec<u32>> = Arc::new((0..ELEMS as u32).map(|i| i.wrapping_mul(2654435761)).collect());
    let read = Arc::new(q.upload(&src).unwrap());
    let mut written = q.alloc::<u32>(ELEMS).unwrap();
    let (tx, rx) = mpsc::channel::<Result<(), String>>();
    for t in 0..3 {
        let (tx, read, src) = (tx.clone(), read.clone(), src.clone());
        std::thread::spawn(move || {
            let result = (0..rounds).try_for_each(|i| match read.to_vec() {
                Ok(v) if v == *src => Ok(()),
                Ok(_) => Err(format!("reader {t}, round {i}: wrong bytes")),
                Err(e) => Err(format!("reader {t}, round {i}: {e}")),
            });
            let _ = tx.send(result);
        });
    }
    let (wtx, wrx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = (1..=rounds).try_for_each(|i| written.write(0, &vec![i; ELEMS]).map_err(|e| format!("writer, round {i}: {e}")));
        let _ = wtx.send(written);
        let _ = tx.send(result);
    });
    for _ in 0..4 {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(result) => result.unwrap(),
            Err(_) => panic!("a thread neither finished nor failed within 120 s: the session deadlocked"),
        }
    }
    let written = wrx.recv().unwrap();
    assert!(written.to_vec().unwrap().iter().all(|x| *x == rounds), "the last write landed");
}

#[test]
fn concurrent_16_mib_reads_and_writes_on_one_session_never_deadlock_over_plain_tcp() {
    let d = Sucld::start(&["--no-tls"]);
    for _ in 0..3 {
        readers_and_a_writer(&d, 6);
    }
}

#[test]
fn concurrent_16_mib_reads_and_writes_on_one_session_never_deadlock_over_tls() {
    let d = Sucld::start(&[]);
    for _ in 0..3 {
        readers_and_a_writer(&d, 6);
    }
}

/// Runs `f` on a thread of its own; fails if it neither returns nor panics within `secs`.
fn within(secs: u64, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(t.join().unwrap_err()),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still blocked after {secs} s"),
    }
}

/// One session through a proxy whose connections stall on demand (both ends stay open).
fn stalled_session(tls: bool) {
    let d = Sucld::start(if tls { &[][..] } else { &["--no-tls"][..] });
    let proxy = FaultProxy::counting(&d.addr);
    let mut o = d.options();
    o.call_timeout = Duration::from_secs(2);
    let r = Remote::connect(&proxy.addr, o).unwrap();
    let q = r.devices().unwrap()[0].queue().unwrap();
    let counter = q.upload(&[0u64]).unwrap();
    let small: Vec<u32> = (0..16 << 10).collect();
    let mut buf = q.upload(&vec![0u32; ELEMS]).unwrap();
    r.nop().unwrap();

    // Replies stop: the call times out, and the client re-attaches by itself.
    proxy.stall();
    q.launch("increment_u64", &[counter.arg()], 1).unwrap(); // posted into the stall
    buf.write(0, &small).unwrap();
    match counter.to_vec() {
        Err(RemoteError::Timeout { .. }) => {}
        other => panic!("tls {tls}: a read over a stalled connection must time out, got {other:?}"),
    }
    assert_eq!(counter.to_vec().unwrap(), vec![1], "tls {tls}: the increment ran exactly once");
    assert_eq!(buf.read(0, small.len()).unwrap(), small, "tls {tls}");
    let after_first = r.reconnects();
    assert!(after_first >= 1, "tls {tls}: re-attached");

    // Writes stop too: a 16 MiB write fills the socket, gives up after the call timeout, and
    // goes again over the connection made anew.
    proxy.stall();
    let data: Vec<u32> = (0..ELEMS as u32).rev().collect();
    buf.write(0, &data).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data, "tls {tls}");
    assert!(r.reconnects() > after_first, "tls {tls}: re-attached again");
    q.launch("increment_u64", &[counter.arg()], 1).unwrap();
    assert_eq!(counter.to_vec().unwrap(), vec![2], "tls {tls}");
}

#[test]
fn a_stalled_connection_times_the_call_out_then_the_client_re_attaches_by_itself() {
    within(120, "plain TCP", || stalled_session(false));
    within(120, "TLS", || stalled_session(true));
}
