//! The tcp mesh handshake: a connection proves it belongs to the job before any frame of it
//! is read as data.
//!
//! The rank that accepts opens with a challenge (its rank, the communicator id and a random
//! 32-byte nonce). The connecting rank answers with a hello: its rank, the same communicator
//! id, its own nonce and `HMAC-SHA256(secret, "sucl-mesh-hello" ‖ challenge nonce ‖ its nonce ‖
//! its rank ‖ acceptor's rank ‖ communicator id)`. The acceptor checks it and answers with
//! `HMAC-SHA256(secret, "sucl-mesh-welcome" ‖ its nonce ‖ challenge nonce ‖ ...)`, which the
//! connecting rank checks in turn, so each side knows the other holds the job secret (the one
//! the rendezvous store checks, see `sucl_core::store`) without it crossing the wire. Every
//! field is validated and every read bounded in size and time; a connection that fails is
//! closed and never becomes a peer.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use sucl_core::store::{random_nonce, JobSecret, NONCE_BYTES, PROOF_LEN};
use sucl_core::wire::{Header, Kind, HEADER_LEN};

const HELLO_LABEL: &[u8] = b"sucl-mesh-hello\0";
const WELCOME_LABEL: &[u8] = b"sucl-mesh-welcome\0";

/// Who a handshake is between: the communicator and the two ranks in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ends {
    /// The communicator's id (a hash of its store prefix).
    pub ctx: u64,
    /// The rank that accepts (the lower one).
    pub acceptor: usize,
}

fn words(ends: Ends, connector: usize) -> [u8; 24] {
    let mut w = [0u8; 24];
    w[..8].copy_from_slice(&(connector as u64).to_le_bytes());
    w[8..16].copy_from_slice(&(ends.acceptor as u64).to_le_bytes());
    w[16..].copy_from_slice(&ends.ctx.to_le_bytes());
    w
}

fn send(s: &mut impl Write, kind: Kind, meta: [u64; 2], payload: &[&[u8]]) -> io::Result<()> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let mut buf = Header { kind, tag: 0, len: len as u64, meta }.encode().to_vec();
    for p in payload {
        buf.extend_from_slice(p);
    }
    s.write_all(&buf)
}

/// Reads one frame of `kind` whose payload is exactly `len` bytes (checked before reading it).
fn expect(s: &mut impl Read, kind: Kind, len: usize) -> Result<(Header, Vec<u8>), String> {
    let failed = |what: &str, e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!("no {kind:?} {what} in time"),
        io::ErrorKind::UnexpectedEof => format!("the connection closed before a {kind:?} {what}"),
        _ => format!("reading a {kind:?} {what}: {e}"),
    };
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).map_err(|e| failed("header", e))?;
    let hdr = Header::decode(&h, len as u64).map_err(|e| format!("bad {kind:?} header: {e}"))?;
    if hdr.kind != kind || hdr.len != len as u64 {
        return Err(format!("expected a {kind:?} frame of {len} bytes, got a {:?} frame of {}", hdr.kind, hdr.len));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).map_err(|e| failed("payload", e))?;
    Ok((hdr, payload))
}

/// The accepting side: challenges `s`, checks the answer and welcomes it; returns the rank
/// it proved to be (one of `peers`), or why it was refused. Every read and write is bounded by
/// `wait`.
pub(crate) fn accept(
    s: &mut TcpStream,
    ends: Ends,
    peers: std::ops::Range<usize>,
    secret: &JobSecret,
    wait: Duration,
) -> Result<usize, String> {
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(wait)).map_err(|e| e.to_string())?;
    let peer = accept_on(s, ends, peers, secret)?;
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    s.set_write_timeout(None).map_err(|e| e.to_string())?;
    Ok(peer)
}

/// [`accept`]'s exchange on a stream whose reads and writes are bounded already.
pub(crate) fn accept_on(
    s: &mut (impl Read + Write),
    ends: Ends,
    peers: std::ops::Range<usize>,
    secret: &JobSecret,
) -> Result<usize, String> {
    let challenge = random_nonce().map_err(|e| format!("no randomness: {e}"))?;
    let meta = [ends.acceptor as u64, ends.ctx];
    send(s, Kind::MeshChallenge, meta, &[&challenge]).map_err(|e| format!("sending the challenge: {e}"))?;
    let (hdr, payload) = expect(s, Kind::Hello, NONCE_BYTES + PROOF_LEN)?;
    let claimed = hdr.meta[0];
    if hdr.meta[1] != ends.ctx || !peers.contains(&(claimed as usize)) || claimed > u32::MAX as u64 {
        return Err(format!("a hello for communicator {:#x} from rank {claimed} (expected {:#x}, ranks {peers:?})", hdr.meta[1], ends.ctx));
    }
    let peer = claimed as usize;
    let (nonce, proof) = payload.split_at(NONCE_BYTES);
    let w = words(ends, peer);
    if !secret.check_proof(HELLO_LABEL, &[&challenge, nonce, &w], proof) {
        return Err(format!("a connection claiming rank {peer} does not know the job secret"));
    }
    let welcome = secret.proof(WELCOME_LABEL, &[nonce, &challenge, &w]);
    send(s, Kind::MeshWelcome, meta, &[&welcome]).map_err(|e| format!("sending the welcome: {e}"))?;
    Ok(peer)
}

/// The connecting side: answers `ends.acceptor`'s challenge as rank `me` and checks its
/// welcome; every read and write is bounded by `wait`.
pub(crate) fn connect(s: &mut TcpStream, ends: Ends, me: usize, secret: &JobSecret, wait: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(wait)).map_err(|e| e.to_string())?;
    connect_on(s, ends, me, secret)?;
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    s.set_write_timeout(None).map_err(|e| e.to_string())?;
    Ok(())
}

/// [`connect`]'s exchange on a stream whose reads and writes are bounded already.
pub(crate) fn connect_on(s: &mut (impl Read + Write), ends: Ends, me: usize, secret: &JobSecret) -> Result<(), String> {
    let (hdr, challenge) = expect(s, Kind::MeshChallenge, NONCE_BYTES)?;
    let meta = [ends.acceptor as u64, ends.ctx];
    if hdr.meta != meta {
        return Err(format!("the challenge names rank {} of communicator {:#x} (expected {meta:?})", hdr.meta[0], hdr.meta[1]));
    }
    let nonce = random_nonce().map_err(|e| format!("no randomness: {e}"))?;
    let w = words(ends, me);
    let proof = secret.proof(HELLO_LABEL, &[&challenge, &nonce, &w]);
    send(s, Kind::Hello, [me as u64, ends.ctx], &[&nonce, &proof]).map_err(|e| format!("sending the hello: {e}"))?;
    let (hdr, welcome) =
        expect(s, Kind::MeshWelcome, PROOF_LEN).map_err(|e| format!("refused ({e}): does every rank share the job secret?"))?;
    if hdr.meta != meta || !secret.check_proof(WELCOME_LABEL, &[&nonce, &challenge, &w], &welcome) {
        return Err("the listener does not know the job secret (another job on this port?)".into());
    }
    Ok(())
}

/// Entry point of the coverage-guided fuzz target `mesh_handshake` (`fuzz/`) and of the tests
/// that replay its corpus: not part of the API.
#[doc(hidden)]
pub mod fuzz {
    use super::*;

    /// A stream whose reads come from the fuzzer's bytes and whose writes are kept.
    struct Scripted<'a> {
        input: &'a [u8],
        written: Vec<u8>,
    }

    impl Read for Scripted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Scripted<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Plays one side of the handshake against `bytes` (the other side's frames): the first
    /// byte picks the side (even: the rank that accepts, odd: the one that connects). Bytes
    /// without the job secret's proofs must be refused; the written frames stay bounded.
    pub fn mesh_handshake(bytes: &[u8]) {
        let Some((&side, rest)) = bytes.split_first() else { return };
        let secret = JobSecret::given("sucl-fuzz");
        let ends = Ends { ctx: 0x5eed, acceptor: 1 };
        let mut s = Scripted { input: rest, written: Vec::new() };
        let r = if side % 2 == 0 { accept_on(&mut s, ends, 2..8, &secret).map(|_| ()) } else { connect_on(&mut s, ends, 3, &secret) };
        assert!(r.is_err(), "a handshake without the secret's proofs passed");
        assert!(s.written.len() <= 2 * (HEADER_LEN + NONCE_BYTES + PROOF_LEN));
    }
}
