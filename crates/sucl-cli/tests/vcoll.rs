//! V-collectives (gatherv, scatterv, all_gatherv, all_to_allv) on real processes over shm and
//! tcp at 1–5 ranks: `sucl check` with the cheapest collective matrix runs its v-checks
//! (uneven counts with zeros, displacements with gaps and out of rank order, invalid arguments)
//! against serial references; and a rank passing a different counts table is a Mismatch on
//! every rank, not a truncation or a hang.

mod common;
use common::*;
use std::time::Duration;

fn v_check(backend: &str, ranks: usize, mismatch_rank: Option<usize>) -> Outcome {
    let mut cmd = sucl();
    cmd.args(["check", "--ranks", &ranks.to_string(), "--backend", backend, "--ops", "barrier", "--sizes", "1"]).env("SUCL_TIMEOUT", "20");
    if let Some(r) = mismatch_rank {
        cmd.env("SUCL_CHECK_V_MISMATCH", r.to_string());
    }
    finish(spawn(cmd), Duration::from_secs(120), &format!("{backend} v-check with {ranks} ranks"))
}

#[test]
fn v_collectives_match_serial_references_on_shm_and_tcp() {
    for backend in ["shm", "tcp"] {
        for n in 1..=5 {
            let out = v_check(backend, n, None);
            assert!(out.status.success(), "{backend} x{n} failed: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
            let line = out.stdout.lines().find(|l| l.contains("sucl check:")).unwrap_or_else(|| panic!("no summary:\n{}", out.stderr));
            assert!(line.contains(" 0 wrong"), "{line}");
            assert!(!out.stderr.contains("WRONG"), "{}", out.stderr);
        }
    }
}

#[test]
fn a_rank_with_a_different_counts_table_is_a_mismatch_on_every_rank() {
    for backend in ["shm", "tcp"] {
        let n = 3;
        let out = v_check(backend, n, Some(1));
        assert!(out.status.success(), "{backend}: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
        assert!(out.stdout.contains(" 0 wrong"), "{}", out.stdout);
        for r in 0..n {
            for op in ["Gatherv", "AllToAllv"] {
                let want = format!("v-mismatch detected: rank {r}: ranks disagree on {op}");
                assert!(out.stderr.contains(&want), "{backend}: rank {r} did not report the {op} mismatch:\n{}", out.stderr);
            }
        }
        assert!(!out.stderr.contains("timed out"), "{backend}: a mismatch must not wait for a timeout:\n{}", out.stderr);
    }
}
