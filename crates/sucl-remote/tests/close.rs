//! Dropping the last handle of a session closes it: the connection is shut and the client's
//! reader thread ends, while any clone (a buffer holds one) keeps the session open. Alone in
//! its test binary, so that the count of reader threads in this process is this test's own.

mod common;
use common::*;
use std::time::{Duration, Instant};
use sucl_remote::Remote;

/// This process's threads named like the client's reader (`comm` keeps 15 bytes).
fn reader_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == "sucl-remote-rea"))
        .count()
}

#[test]
fn dropping_the_last_handle_closes_the_session_and_ends_its_reader() {
    let d = Sucld::start(&["--host-devices", "1"]);
    assert_eq!(reader_threads(), 0);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    r.nop().unwrap();
    assert_eq!(reader_threads(), 1, "a session has one reader thread");
    let q = r.devices().unwrap()[0].queue().unwrap();
    let buf = q.upload(&[1u32, 2, 3]).unwrap();
    drop(q);
    let clone = r.clone();
    drop(r);
    clone.nop().unwrap();
    drop(clone);
    // The buffer still holds the session: it works, and dropping it posts its free.
    assert_eq!(buf.to_vec().unwrap(), vec![1, 2, 3]);
    assert_eq!(reader_threads(), 1, "a buffer keeps its session open");
    drop(buf);
    let t0 = Instant::now();
    while reader_threads() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the reader thread still runs 10 s after the last handle was dropped");
        std::thread::sleep(Duration::from_millis(10));
    }
}
