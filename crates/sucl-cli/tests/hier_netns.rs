//! Hierarchical collectives across real network stacks: every "host" is a network namespace of
//! its own (joined to the others by a veth pair on a bridge) with a hostname of its own (a UTS
//! namespace), so ranks find their hosts by `gethostname` and reach each other over the veth
//! addresses, as on a cluster: no `SUCL_HOSTNAME`, no loopback between hosts. The correctness
//! matrix runs at 2×2 and 3×2 ranks through the hier backend.
//!
//! Creating namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip`/`unshare`: where the
//! machine does not allow it, each test says so on stderr and returns (visibly skipped). The
//! namespaces and the bridge are removed when a test ends, also when it fails.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Network namespaces `ns(h)` for `hosts` hosts, host h at 10.231.`tag`.(h+1)/24 on veth
/// `v<tag>h<h>`, all joined by bridge `b<tag>` in this namespace. Removed on drop.
struct Hosts {
    tag: u8,
    hosts: usize,
}

/// Runs a setup command; Err(what failed) if it could not run or failed.
fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Hosts {
    fn ns(&self, h: usize) -> String {
        format!("sucl-{}-{}-h{h}", std::process::id(), self.tag)
    }

    fn addr(&self, h: usize) -> String {
        format!("10.231.{}.{}", self.tag, h + 1)
    }

    /// Sets up the namespaces; Err(why) where this machine does not allow it (after undoing
    /// whatever part was made).
    fn create(hosts: usize, tag: u8) -> Result<Hosts, String> {
        let made = Hosts { tag, hosts };
        let bridge = format!("b{}x{tag}", std::process::id() % 100_000);
        sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        sh(&["ip", "link", "set", &bridge, "up"])?;
        for h in 0..hosts {
            let (ns, outer, inner) = (made.ns(h), format!("v{}x{tag}h{h}", std::process::id() % 100_000), format!("sv{h}"));
            sh(&["ip", "netns", "add", &ns])?;
            sh(&["ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns])?;
            sh(&["ip", "link", "set", &outer, "master", &bridge])?;
            sh(&["ip", "link", "set", &outer, "up"])?;
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{}/24", made.addr(h)), "dev", &inner])?;
            sh(&["ip", "-n", &ns, "link", "set", &inner, "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(made)
    }

    /// `sucl ARGS` as world rank `rank` of `n` on host `h` (its own network and hostname).
    fn rank(&self, h: usize, rank: usize, local: usize, n: usize, port: u16, args: &[&str]) -> Reaped {
        let bin = sucl().get_program().to_owned();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(h), "unshare", "--uts", "sh", "-c", "hostname \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(format!("netns-host{h}"))
            .arg(bin)
            .args(args)
            .env_remove("SUCL_HOSTNAME")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("MASTER_ADDR", self.addr(0))
            .env("MASTER_PORT", port.to_string())
            .env("SUCL_TIMEOUT", "60")
            .env("TORCHELASTIC_RUN_ID", format!("ns{}x{}", std::process::id(), self.tag));
        spawn(cmd)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the outer end.
        for h in 0..self.hosts {
            let _ = sh(&["ip", "netns", "del", &self.ns(h)]);
        }
        let _ = sh(&["ip", "link", "del", &format!("b{}x{}", std::process::id() % 100_000, self.tag)]);
    }
}

/// Namespaces for `hosts` hosts, or None (skipped, said on stderr) where they cannot be made.
fn hosts_or_skip(hosts: usize, tag: u8, test: &str) -> Option<Hosts> {
    match Hosts::create(hosts, tag) {
        Ok(h) => Some(h),
        Err(why) => {
            // Whatever part was made was undone when create's partial Hosts was dropped.
            eprintln!("SKIPPED {test}: this machine does not let the test create network namespaces ({why})");
            None
        }
    }
}

/// The matrix of hier's operations (gather goes to the default backend), dtypes that catch
/// integer averaging and 16-bit floats, sizes below, at and past the ranks per host.
const MATRIX: &[&str] = &[
    "--ops",
    "barrier,broadcast,reduce,all_reduce,all_gather,reduce_scatter,gather",
    "--dtypes",
    "f32,i32,f16",
    "--sizes",
    "0,1,3,1000,70001",
];

/// Runs `sucl ARGS` on `hosts × per` ranks (hosts in blocks) and returns every rank's output,
/// asserting that each succeeded.
fn run_grid(ns: &Hosts, per: usize, args: &[&str]) -> Vec<Outcome> {
    let n = ns.hosts * per;
    let port = free_port();
    let ranks: Vec<Reaped> = (0..n).map(|r| ns.rank(r / per, r, r % per, n, port, args)).collect();
    let what = format!("{}x{per} in namespaces", ns.hosts);
    ranks
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let out = finish(c, Duration::from_secs(240), &format!("{what} rank {r}"));
            assert!(out.status.success(), "{what}: rank {r} failed: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
            assert!(!out.stderr.contains("WRONG"), "{what}: rank {r}:\n{}", out.stderr);
            out
        })
        .collect()
}

fn check_in_namespaces(hosts: usize, per: usize, tag: u8, test: &str) {
    let Some(ns) = hosts_or_skip(hosts, tag, test) else { return };
    let mut args = vec!["check", "--backend", "hier"];
    args.extend_from_slice(MATRIX);
    let outs = run_grid(&ns, per, &args);
    let line = outs[0].stdout.lines().find(|l| l.contains("sucl check:")).unwrap_or_else(|| panic!("no summary:\n{}", outs[0].stdout));
    assert!(line.contains(&format!("{} ranks, backend hier", hosts * per)) && line.contains(" 0 wrong"), "{line}");
}

#[test]
fn hier_matrix_2_hosts_x_2_in_network_namespaces() {
    check_in_namespaces(2, 2, 1, "hier_matrix_2_hosts_x_2_in_network_namespaces");
}

#[test]
fn hier_matrix_3_hosts_x_2_in_network_namespaces() {
    check_in_namespaces(3, 2, 2, "hier_matrix_3_hosts_x_2_in_network_namespaces");
}

/// Ranks find their hosts by hostname alone, and what `sucl info` reports agrees: shm inside a
/// namespace, tcp between them, the veth address advertised (never loopback).
#[test]
fn ranks_in_namespaces_see_two_hosts_and_advertise_their_veth_address() {
    let test = "ranks_in_namespaces_see_two_hosts_and_advertise_their_veth_address";
    let Some(ns) = hosts_or_skip(2, 3, test) else { return };
    let outs = run_grid(&ns, 2, &["info"]);
    for (r, o) in outs.iter().enumerate() {
        let h = r / 2;
        let want = [format!("host identity netns-host{h} (the hostname"), format!("tcp endpoints: sv{h} {}", ns.addr(h))];
        for w in &want {
            assert!(o.stdout.contains(w.as_str()), "rank {r} must report {w:?}:\n{}", o.stdout);
        }
    }
}
