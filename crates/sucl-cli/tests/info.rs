//! `sucl info` says which interface and address the store and the tcp endpoints use, and why.

mod common;
use common::*;
use std::time::Duration;

fn info(env: &[(&str, &str)]) -> String {
    let mut cmd = sucl();
    cmd.arg("info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = finish(spawn(cmd), Duration::from_secs(60), "sucl info");
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    out.stdout
}

#[test]
fn info_names_the_interface_ports_and_reason() {
    let torchrun = [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")];
    let mut env = torchrun.to_vec();
    env.extend([("SUCL_SOCKET_IFNAME", "=lo"), ("SUCL_PORT_RANGE", "50000-50010"), ("SUCL_HOSTNAME", "nodeA")]);
    let out = info(&env);
    assert!(
        out.contains("tcp endpoints: lo 127.0.0.1, chosen by SUCL_SOCKET_IFNAME=\"=lo\"; ports 50000-50010 (SUCL_PORT_RANGE)"),
        "{out}"
    );
    assert!(out.contains("store: 127.0.0.1:29511 from the launch environment, hosted by rank 0"), "{out}");
    assert!(out.contains("host identity nodeA (SUCL_HOSTNAME"), "{out}");

    // Without the settings: the address the store is reached from, any port.
    let out = info(&torchrun);
    assert!(out.contains("tcp endpoints: lo 127.0.0.1, the address this host reaches the store from; any free port"), "{out}");
}
