//! The rendezvous store admits only processes that know the job secret: a rank with another
//! secret is refused with an error that says why, and an outsider who reaches the store's port
//! cannot abort the job or write its keys. Real processes, real sockets; every wait is bounded.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use sucl_core::wire::{Header, Kind, HEADER_LEN};

/// One rank of a torchrun-style job on 127.0.0.1:`port`.
fn rank(r: usize, n: usize, port: u16, secret: &str, timeout_s: &str) -> Reaped {
    let mut cmd = sucl();
    cmd.args(["check", "--ops", "all_reduce", "--dtypes", "f32"])
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("SUCL_BACKEND", "tcp")
        .env("SUCL_TIMEOUT", timeout_s)
        .env("SUCL_JOB_SECRET", secret)
        .env("TORCHELASTIC_RUN_ID", format!("auth{port}"));
    spawn(cmd)
}

#[test]
fn a_rank_with_another_secret_is_refused_with_a_reason() {
    let port = free_port();
    let r0 = rank(0, 2, port, "the-job-secret", "3");
    let r1 = rank(1, 2, port, "another-secret", "3");
    let out1 = finish(r1, Duration::from_secs(30), "rank 1");
    assert!(!out1.status.success());
    assert!(out1.stderr.contains("refused rank 1") && out1.stderr.contains("SUCL_JOB_SECRET"), "rank 1:\n{}", out1.stderr);
    let out0 = finish(r0, Duration::from_secs(30), "rank 0");
    assert!(!out0.status.success(), "rank 0 cannot finish without rank 1");
    assert!(out0.stderr.contains("timed out"), "rank 0:\n{}", out0.stderr);
}

fn frame(kind: Kind, tag: u64, meta: [u64; 2], payload: &[u8]) -> Vec<u8> {
    let mut v = Header { kind, tag, len: payload.len() as u64, meta }.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

/// Connects as an outsider, sends `bytes` after the server's challenge, and checks that the
/// server hangs up without answering.
fn intrude(port: u16, bytes: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the store is listening");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut challenge = [0u8; HEADER_LEN + 32];
    s.read_exact(&mut challenge).expect("the store's challenge");
    let _ = s.write_all(bytes);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the store answered an outsider: {rest:?}");
}

#[test]
fn an_outsider_cannot_abort_the_job_or_write_its_keys() {
    let port = free_port();
    let secret = "the-job-secret";
    // Rank 0 hosts the store and waits (bounded) for rank 1, which we start only after the
    // outsider had its go: every frame below would break the job if the store took it.
    let r0 = rank(0, 2, port, secret, "20");
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "rank 0's store never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let evil_host = b"world/host/1";
    let mut set = frame(Kind::StoreSet, evil_host.len() as u64, [0, 0], evil_host);
    set.extend_from_slice(b"nowhere");
    intrude(port, &frame(Kind::StoreAbort, 0, [2, 0], b"injected: rank 1 is lost"));
    intrude(port, &set);
    let mut forged = frame(Kind::StoreHello, 0, [1, 0], &[0u8; 64]);
    forged.extend(frame(Kind::StoreAbort, 0, [0, 0], b"injected abort"));
    intrude(port, &forged);
    let r1 = rank(1, 2, port, secret, "20");
    for (r, c) in [(0, r0), (1, r1)] {
        let out = finish(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(out.status.success(), "rank {r} failed:\n{}", out.stderr);
        assert!(!out.stderr.contains("injected"), "rank {r}:\n{}", out.stderr);
    }
}
