//! The tcp mesh admits only connections that prove they belong to the job (its secret): a
//! stranger on a rank's mesh port is refused and the job still completes; a rank with a wrong
//! secret is refused. Ranks are threads here, on real sockets and a real rendezvous store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use sucl_core::backend::{Backend, CollDesc, CollOp};
use sucl_core::store::{JobSecret, StoreClient, StoreServer};
use sucl_core::wire::HEADER_LEN;
use sucl_core::{AbortState, DType, ReduceOp};
use sucl_host::tcp::TcpBackend;
use sucl_host::HostConfig;

const PREFIX: &str = "world";

fn cfg(timeout: Duration) -> HostConfig {
    HostConfig { timeout, ..Default::default() }
}

fn client(server: &StoreServer, rank: usize) -> StoreClient {
    StoreClient::connect(&server.addr().to_string(), rank, None, Duration::from_secs(10), AbortState::new(), &JobSecret::given("job"))
        .unwrap()
}

/// Rank `rank` of 2 building its mesh with `secret`, on a thread.
fn rank_thread(
    server: &StoreServer,
    rank: usize,
    secret: &str,
    timeout: Duration,
) -> std::thread::JoinHandle<sucl_core::Result<TcpBackend>> {
    let store = client(server, rank);
    let secret = JobSecret::given(secret);
    std::thread::spawn(move || TcpBackend::connect(&store, PREFIX, rank, vec![0, 1], AbortState::new(), &cfg(timeout), &secret))
}

/// Everything `s` sends until it closes (bounded in time).
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = vec![];
    let _ = s.read_to_end(&mut got);
    got
}

fn sum_of_ranks(b: &mut TcpBackend) -> f32 {
    let mut v = [b.rank() as f32 + 1.0; 4];
    let d = CollDesc { op: CollOp::AllReduce, dtype: DType::F32, redop: ReduceOp::Sum, root: 0, count: 4 };
    b.collective(&d, None, bytemuck_bytes(&mut v)).unwrap();
    assert!(v.iter().all(|&x| x == v[0]));
    v[0]
}

fn bytemuck_bytes(v: &mut [f32; 4]) -> &mut [u8] {
    // SAFETY: f32 has no padding and any bytes are a valid u8; the slice covers exactly `v`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

#[test]
fn strangers_on_a_mesh_port_are_refused_and_the_job_completes() {
    let server = StoreServer::start("127.0.0.1:0", JobSecret::given("job")).unwrap();
    let r0 = rank_thread(&server, 0, "job", Duration::from_secs(30));
    // The stranger learns the port as anyone on the host could (here: from the store).
    let addr = String::from_utf8(client(&server, 9).get(&format!("{PREFIX}/tcp/0")).unwrap()).unwrap();

    // One stranger sends bytes that are no handshake, one answers the challenge as "rank 1"
    // without the secret.
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789012345678901234567890123456789").unwrap();
    let mut impostor = TcpStream::connect(&addr).unwrap();
    let mut challenge = [0u8; HEADER_LEN + 32];
    impostor.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    impostor.read_exact(&mut challenge).unwrap();
    let mut hello = sucl_core::wire::Header { kind: sucl_core::wire::Kind::Hello, tag: 0, len: 64, meta: [1, 0] }.encode().to_vec();
    hello[32..40].copy_from_slice(&challenge[32..40]); // the communicator id the challenge named
    hello.extend_from_slice(&[7u8; 64]); // a nonce and a proof made up without the secret
    impostor.write_all(&hello).unwrap();
    // Each is closed after the challenge (40-byte header + 32-byte nonce), never welcomed.
    assert_eq!(read_until_closed(&mut garbage).len(), HEADER_LEN + 32, "the garbage connection got more than a challenge");
    assert!(read_until_closed(&mut impostor).is_empty(), "the impostor got an answer to its hello");

    // A third stranger connects and says nothing, just before the real rank 1, which waits
    // for its challenge for less than rank 0 gives the silent one to speak: rank 1 joins only
    // if the silent stranger holds nothing up.
    let _silent = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut b1 = rank_thread(&server, 1, "job", Duration::from_secs(3)).join().unwrap().expect("rank 1 joins the mesh");
    let mut b0 = r0.join().unwrap().expect("rank 0 builds its mesh");
    let t = std::thread::spawn(move || sum_of_ranks(&mut b1));
    assert_eq!(sum_of_ranks(&mut b0), 3.0);
    assert_eq!(t.join().unwrap(), 3.0);
}

#[test]
fn a_rank_with_a_wrong_secret_is_refused() {
    let server = StoreServer::start("127.0.0.1:0", JobSecret::given("job")).unwrap();
    let r0 = rank_thread(&server, 0, "job", Duration::from_secs(3));
    let e1 = rank_thread(&server, 1, "not the job's", Duration::from_secs(3)).join().unwrap().err().expect("rank 1 is refused");
    assert!(e1.to_string().contains("does every rank share the job secret"), "{e1}");
    let e0 = r0.join().unwrap().err().expect("rank 0 never gets its peer");
    assert!(e0.to_string().contains("waiting for higher ranks to connect"), "{e0}");
}

#[test]
fn a_listener_without_the_secret_is_not_trusted() {
    // Rank 1 is told rank 0's address, but whoever listens there answers with a made-up welcome.
    let server = StoreServer::start("127.0.0.1:0", JobSecret::given("job")).unwrap();
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    client(&server, 9).set(&format!("{PREFIX}/tcp/0"), fake.local_addr().unwrap().to_string().as_bytes()).unwrap();
    let r1 = rank_thread(&server, 1, "job", Duration::from_secs(5));
    let (mut s, _) = fake.accept().unwrap();
    let ctx = PREFIX.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let kind = |k| sucl_core::wire::Header { kind: k, tag: 0, len: 32, meta: [0, ctx] }.encode();
    s.write_all(&kind(sucl_core::wire::Kind::MeshChallenge)).unwrap();
    s.write_all(&[1u8; 32]).unwrap();
    let mut hello = [0u8; HEADER_LEN + 64];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&kind(sucl_core::wire::Kind::MeshWelcome)).unwrap();
    s.write_all(&[2u8; 32]).unwrap();
    let e = r1.join().unwrap().err().expect("rank 1 refuses the fake");
    assert!(e.to_string().contains("does not know the job secret"), "{e}");
}
