//! Launch environments on real processes. torchrun with the agent's store: a c10d TCPStore
//! already listens on MASTER_PORT (here a small stand-in speaking the same protocol), the workers
//! get `TORCHELASTIC_USE_AGENT_STORE=True`, and sucl must meet there instead of binding the port.
//! Network choice: `SUCL_SOCKET_IFNAME` and `SUCL_PORT_RANGE` place the tcp endpoints.

mod common;
use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Kv = Arc<(Mutex<HashMap<Vec<u8>, Vec<u8>>>, Condvar)>;

/// The agent's store: VALIDATE, then SET (no reply), WAIT (answered once every key exists),
/// GET; anything else closes the connection, as torch's server does with an unknown request.
fn agent_store() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let kv: Kv = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let keys = Arc::new(Mutex::new(vec![]));
    let seen = keys.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (kv, seen) = (kv.clone(), seen.clone());
            std::thread::spawn(move || serve(conn, &kv, &seen));
        }
    });
    (port, keys)
}

fn serve(mut c: TcpStream, kv: &Kv, seen: &Mutex<Vec<String>>) -> Option<()> {
    let mut hello = [0u8; 5];
    c.read_exact(&mut hello).ok()?;
    if hello != [0x00, 0xce, 0xf7, 0x85, 0x3c] {
        return None;
    }
    let (map, cond) = &**kv;
    loop {
        let mut op = [0u8; 1];
        c.read_exact(&mut op).ok()?;
        match op[0] {
            1 => {
                let (k, v) = (read_str(&mut c)?, read_str(&mut c)?);
                seen.lock().unwrap().push(String::from_utf8_lossy(&k).into_owned());
                map.lock().unwrap().insert(k, v);
                cond.notify_all();
            }
            6 => {
                let n = read_u64(&mut c)?;
                let keys: Vec<Vec<u8>> = (0..n.min(16)).map(|_| read_str(&mut c)).collect::<Option<_>>()?;
                let mut g = map.lock().unwrap();
                while !keys.iter().all(|k| g.contains_key(k)) {
                    g = cond.wait_timeout(g, Duration::from_millis(50)).unwrap().0;
                }
                drop(g);
                c.write_all(&[0]).ok()?;
            }
            3 => {
                let k = read_str(&mut c)?;
                let v = map.lock().unwrap().get(&k).cloned().unwrap_or_default();
                c.write_all(&(v.len() as u64).to_le_bytes()).ok()?;
                c.write_all(&v).ok()?;
            }
            _ => return None,
        }
    }
}

fn read_u64(c: &mut TcpStream) -> Option<u64> {
    let mut b = [0u8; 8];
    c.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_str(c: &mut TcpStream) -> Option<Vec<u8>> {
    let n = read_u64(c)?;
    let mut v = vec![0u8; usize::try_from(n).ok().filter(|&n| n <= 1 << 16)?];
    c.read_exact(&mut v).ok()?;
    Some(v)
}

#[test]
fn ranks_meet_through_the_agent_store_on_master_port() {
    let (port, keys) = agent_store();
    let n = 3;
    let ranks: Vec<Reaped> = (0..n)
        .map(|r| {
            let mut cmd = sucl();
            cmd.args(["check", "--ops", "all_reduce,broadcast", "--dtypes", "f32"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("GROUP_RANK", "0")
                .env("MASTER_ADDR", "localhost")
                .env("MASTER_PORT", port.to_string())
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .env("TORCHELASTIC_RUN_ID", format!("t{port}"))
                .env("TORCHELASTIC_RESTART_COUNT", "1")
                .env("SUCL_TIMEOUT", "30");
            spawn(cmd)
        })
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(out.status.success(), "rank {r} failed:\n{}", out.stderr);
    }
    // Rank 0 published its store's random secret and address under sucl's prefix, and nothing
    // else was written.
    assert_eq!(*keys.lock().unwrap(), [format!("/sucl/t{port}/1/store_secret"), format!("/sucl/t{port}/1/store_addr")]);
}

fn tcp_pair(extra: &[(&str, &str)]) -> Vec<Outcome> {
    let port = free_port().to_string();
    let ranks: Vec<Reaped> = (0..2)
        .map(|r| {
            let mut cmd = sucl();
            cmd.args(["check", "--ops", "all_reduce", "--dtypes", "f32"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("SUCL_BACKEND", "tcp")
                .env("SUCL_TIMEOUT", "30")
                .envs(extra.iter().copied());
            spawn(cmd)
        })
        .collect();
    ranks.into_iter().enumerate().map(|(r, c)| finish(c, Duration::from_secs(60), &format!("rank {r}"))).collect()
}

#[test]
fn tcp_endpoints_follow_socket_ifname_and_port_range() {
    // A range that starts with a port in use: the endpoints take the next free ones.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = held.local_addr().unwrap().port();
    let range = format!("{p}-{}", p.saturating_add(60));
    for out in tcp_pair(&[("SUCL_SOCKET_IFNAME", "=lo"), ("SUCL_PORT_RANGE", &range), ("RUST_LOG", "off")]) {
        assert!(out.status.success(), "{}", out.stderr);
    }
    // A range wholly in use: the tcp endpoints cannot bind, and say why.
    let held_range = format!("{p}-{p}");
    for (r, out) in tcp_pair(&[("SUCL_PORT_RANGE", &held_range)]).into_iter().enumerate() {
        assert!(!out.status.success(), "rank {r} bound a port outside SUCL_PORT_RANGE");
        assert!(out.stderr.contains(&format!("every port of SUCL_PORT_RANGE={held_range} is in use")), "rank {r}: {}", out.stderr);
    }
    for (r, out) in tcp_pair(&[("SUCL_SOCKET_IFNAME", "=nosuch0,nosuch1")]).into_iter().enumerate() {
        assert!(!out.status.success(), "rank {r} must refuse an interface list that matches nothing");
        assert!(out.stderr.contains("SUCL_SOCKET_IFNAME=\"=nosuch0,nosuch1\" matches no interface"), "rank {r}: {}", out.stderr);
        assert!(out.elapsed < Duration::from_secs(20), "rank {r} waited instead of failing at init");
    }
}
