//! Meeting the other ranks over MPI: under mpirun, srun or hydra no `MASTER_ADDR` is needed,
//! because MPI already connects the ranks. Rank 0 starts sucl's rendezvous store and passes its
//! address (and, unless `SUCL_JOB_SECRET` was given, a random job secret) to every rank with an
//! MPI broadcast; an all_gather of host names first tells whether the store must be reachable
//! from other hosts. Both exchanges are MPI's blocking calls on `MPI_COMM_WORLD`, bounded by the
//! watchdog (a rank that never arrives ends the job at the timeout).

use crate::watchdog::{Watch, BOOTSTRAP_OP};
use crate::{init, mpi_error, sucl_mpi_coll_world};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;
use sucl_core::bootstrap::{hostname, interface_addrs, Network};
use sucl_core::store::{JobSecret, SecretSource, StoreServer, SECRET_ENV};
use sucl_core::{AbortState, CollOp, DType, Error, Result};

/// Bytes of one rank's host name in the all_gather (longer names are cut: only equality counts).
const HOST_SLOT: usize = 256;
/// Bytes of rank 0's message: `OK <address>`, then ` <secret>` unless the secret was given
/// (`SUCL_JOB_SECRET`, which every rank then has), or `ERR <why>`.
const MESSAGE_SLOT: usize = 1024;

/// Rank 0 starts sucl's store and every rank learns its address over MPI (see the module
/// documentation); returns the address and, on rank 0, the server. `rank` and `size` are the
/// launcher's, and must be MPI's. The store binds and advertises the interface `net` chooses
/// (`SUCL_SOCKET_IFNAME`) and a port of its range (`SUCL_PORT_RANGE`); without a choice, 127.0.0.1
/// when every rank runs on this host, else the address this host's name resolves to (or the
/// first address of an interface that is up, not loopback and not a container bridge), on every
/// interface. Unless `secret` was given, rank 0 replaces it with a random one that every rank
/// takes from the broadcast. If rank 0 cannot start the store, every rank returns that error.
pub fn meet_over_mpi(
    rank: usize,
    size: usize,
    net: &Network,
    timeout: Duration,
    secret: &mut JobSecret,
) -> Result<(String, Option<StoreServer>)> {
    let (mpi_rank, mpi_size) = init().map_err(|why| Error::BackendUnavailable { rank, backend: "mpi".into(), why })?;
    if (mpi_rank, mpi_size) != (rank, size) {
        return Err(Error::Config(format!(
            "the launcher's environment says rank {rank} of {size}, but MPI says rank {mpi_rank} of {mpi_size}"
        )));
    }
    let watch = Watch::new(rank, timeout, AbortState::new());
    let hosts = all_gather_world(&watch, rank, &slot(hostname().as_bytes(), HOST_SLOT), size)?;
    let one_host = hosts.chunks(HOST_SLOT).all(|h| h == &hosts[..HOST_SLOT]);
    let mut message = vec![0u8; MESSAGE_SLOT];
    let mut server = None;
    if rank == 0 {
        let text = match start_store(net, one_host, secret) {
            Ok((addr, srv)) => {
                server = Some(srv);
                match secret.source() {
                    SecretSource::Given => format!("OK {addr}"),
                    _ => format!("OK {addr} {}", secret.expose()),
                }
            }
            Err(e) => format!("ERR {e}"),
        };
        message = slot(text.as_bytes(), MESSAGE_SLOT);
    }
    broadcast_world(&watch, rank, &mut message)?;
    let text = String::from_utf8_lossy(&message[..message.iter().position(|&b| b == 0).unwrap_or(message.len())]).into_owned();
    let (addr, sent) = parse_message(&text).map_err(|why| Error::Aborted { rank, reason: why })?;
    if rank != 0 && secret.source() != SecretSource::Given {
        let sent = sent
            .ok_or_else(|| Error::Config(format!("{SECRET_ENV} is set on rank 0 but not on rank {rank}: set it on every rank or none")))?;
        *secret = JobSecret::given(sent);
    }
    Ok((addr.to_string(), server))
}

/// Reads rank 0's message: `(address, secret if sent)`, or why not.
fn parse_message(text: &str) -> std::result::Result<(&str, Option<&str>), String> {
    if let Some(why) = text.strip_prefix("ERR ") {
        return Err(format!("rank 0 could not start the rendezvous store: {why}"));
    }
    let mut words = text.strip_prefix("OK ").ok_or_else(|| format!("rank 0 sent an unreadable message {text:?}"))?.split(' ');
    let (Some(addr), secret, None) = (words.next(), words.next(), words.next()) else {
        return Err(format!("rank 0 sent an unreadable message {text:?}"));
    };
    if addr.parse::<SocketAddr>().is_err() {
        return Err(format!("rank 0 sent an unreadable store address {addr:?}"));
    }
    if secret.is_some_and(|s| s.is_empty() || s.len() > 256 || !s.bytes().all(|b| b.is_ascii_graphic())) {
        return Err("rank 0 sent an unreadable job secret".into());
    }
    Ok((addr, secret))
}

/// `bytes`, cut or padded with zeros to `len`.
fn slot(bytes: &[u8], len: usize) -> Vec<u8> {
    let mut v = bytes[..bytes.len().min(len - 1)].to_vec();
    v.resize(len, 0);
    v
}

/// Rank 0's store: started on the address chosen (see [`meet_over_mpi`]); returns the address
/// the other ranks connect to. Makes the random secret first unless one was given.
fn start_store(net: &Network, one_host: bool, secret: &mut JobSecret) -> Result<(String, StoreServer)> {
    if secret.source() != SecretSource::Given {
        *secret = JobSecret::random().map_err(|e| Error::io(0, "making the job secret", e))?;
    }
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let (advertise, bind) = match &net.interface {
        Some((_, ip)) => (*ip, *ip),
        None if one_host => (loopback, loopback),
        None => {
            let ip = reachable_ip()?;
            (ip, if ip.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) })
        }
    };
    let server = net
        .bind_port(bind, |a| StoreServer::start(a, secret.clone()))
        .map_err(|e| Error::io(0, format!("starting the rendezvous store on {bind}"), e))?;
    Ok((SocketAddr::new(advertise, server.addr().port()).to_string(), server))
}

/// An address of this host that other hosts can reach: the one its name resolves to, unless
/// that is a loopback address (Debian maps the host name to 127.0.1.1), else the first IPv4
/// address of an interface that is up and neither loopback nor a container or VM bridge.
fn reachable_ip() -> Result<IpAddr> {
    let by_name = (hostname().as_str(), 0).to_socket_addrs().ok().and_then(|mut a| a.find(|a| !a.ip().is_loopback()).map(|a| a.ip()));
    if let Some(ip) = by_name {
        return Ok(ip);
    }
    let bridge = |name: &str| ["docker", "virbr", "veth", "br-"].iter().any(|p| name.starts_with(p));
    interface_addrs().into_iter().find(|(name, ip)| !ip.is_loopback() && ip.is_ipv4() && !bridge(name)).map(|(_, ip)| ip).ok_or_else(|| {
        Error::Config(
            "the ranks run on several hosts, but this host has no network address other than loopback \
             (set SUCL_SOCKET_IFNAME to the interface to use, or MASTER_ADDR)"
                .into(),
        )
    })
}

/// MPI_Allgather of `mine` (the same length on every rank) over `MPI_COMM_WORLD`.
fn all_gather_world(watch: &Watch, rank: usize, mine: &[u8], size: usize) -> Result<Vec<u8>> {
    let mut all = vec![0u8; mine.len() * size];
    world_call(watch, rank, CollOp::AllGather, mine.as_ptr() as *const c_void, all.as_mut_ptr() as *mut c_void, mine.len())?;
    Ok(all)
}

/// MPI_Bcast of `buf` (the same length on every rank) from rank 0 over `MPI_COMM_WORLD`.
fn broadcast_world(watch: &Watch, rank: usize, buf: &mut [u8]) -> Result<()> {
    world_call(watch, rank, CollOp::Broadcast, std::ptr::null(), buf.as_mut_ptr() as *mut c_void, buf.len())
}

/// One blocking byte collective on `MPI_COMM_WORLD`, under the watchdog.
fn world_call(watch: &Watch, rank: usize, op: CollOp, send: *const c_void, recv: *mut c_void, len: usize) -> Result<()> {
    let count = c_int::try_from(len).expect("bootstrap messages are small");
    let running = watch.enter_code(BOOTSTRAP_OP);
    // SAFETY: MPI is initialized (meet_over_mpi called init); `send` (all_gather) and `recv`
    // hold `len` bytes, or `len` × the world size for all_gather's receive buffer (the callers
    // size them so); the blocking call is done with them when it returns, and if it overstays
    // the watchdog ends the job while it is still inside MPI.
    let rc = unsafe { sucl_mpi_coll_world(op as c_int, send, recv, count, DType::U8 as c_int, 0, 0) };
    watch.leave(running);
    if rc != 0 {
        return Err(Error::BackendUnavailable { rank, backend: "mpi".into(), why: format!("bootstrap {}: {}", op.name(), mpi_error(rc)) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank0s_message_is_validated() {
        assert_eq!(parse_message("OK 10.0.0.1:4000 abc"), Ok(("10.0.0.1:4000", Some("abc"))));
        assert_eq!(parse_message("OK [::1]:4000 abc"), Ok(("[::1]:4000", Some("abc"))));
        assert_eq!(parse_message("OK 10.0.0.1:4000"), Ok(("10.0.0.1:4000", None)));
        let e = parse_message("ERR rank 0: I/O error").unwrap_err();
        assert!(e.contains("could not start the rendezvous store: rank 0: I/O error"), "{e}");
        assert!(parse_message("OK host:4000 abc").unwrap_err().contains("store address"));
        assert!(parse_message("OK ").unwrap_err().contains("store address"));
        assert!(parse_message("OK").unwrap_err().contains("unreadable message"));
        assert!(parse_message("OK 10.0.0.1:4000 a b").unwrap_err().contains("unreadable message"));
        assert!(parse_message("OK 10.0.0.1:4000 \u{7f}").unwrap_err().contains("job secret"));
        assert!(parse_message("").unwrap_err().contains("unreadable message"));
    }

    #[test]
    fn slots_are_cut_and_padded_with_a_terminating_zero() {
        assert_eq!(slot(b"ab", 4), b"ab\0\0");
        assert_eq!(slot(b"abcdef", 4), b"abc\0");
    }
}
