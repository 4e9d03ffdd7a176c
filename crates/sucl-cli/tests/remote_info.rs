//! `sucl info` lists remote devices: each server named in `SUCL_REMOTE` with its devices, its
//! state and its measured latency, and a server that cannot be reached as unreachable.

use std::process::Command;
use sucl_remote::transport::pin_hex;
use sucl_remote::{Daemon, DaemonConfig, Token};

#[test]
fn sucl_info_lists_remote_devices_with_server_state_and_latency() {
    let token = Token::generate();
    let mut cfg = DaemonConfig::new(token.clone());
    cfg.host_devices = 2;
    let daemon = Daemon::start(cfg).unwrap();
    let addr = daemon.local_addr().to_string();
    // A port nothing listens on (bound, then closed).
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sucl"))
        .arg("info")
        .env("SUCL_REMOTE", format!("{addr},{dead}"))
        .env("SUCL_REMOTE_TOKEN", token.to_hex())
        .env("SUCL_REMOTE_TLS_PIN", pin_hex(&daemon.tls_pin().unwrap()))
        .env_remove("SUCL_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for i in 0..2 {
        let line =
            text.lines().find(|l| l.contains(&format!("remote {addr} #{i}:"))).unwrap_or_else(|| panic!("no line for device {i}:\n{text}"));
        assert!(line.contains(&format!("Host host{i}")) && line.contains("state up, latency"), "{line}");
    }
    let line = text.lines().find(|l| l.contains(&format!("remote {dead}:"))).unwrap_or_else(|| panic!("no line for {dead}:\n{text}"));
    assert!(line.contains("state unreachable") && line.contains("cannot connect"), "{line}");
    daemon.shutdown();
}
