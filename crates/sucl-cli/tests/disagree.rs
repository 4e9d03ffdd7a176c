//! Ranks that disagree on a collective's arguments, on real processes: with the checking mode
//! every rank gets `Mismatch` and the communicator stays poisoned (every later call returns
//! `Unusable`, quoting the `Mismatch`); without it, data left behind
//! by a disagreeing call never reaches a later one; a bad argument fails before anything is
//! posted. The black-box client is the `sucl-disagree` helper binary.

mod common;
use common::*;
use std::time::Duration;

/// Runs `sucl-disagree ARGS` on `n` ranks over `backend`; returns each rank's STEP lines.
fn run(n: usize, backend: &str, check: bool, args: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = sucl();
    cmd.args(["run", "-n", &n.to_string(), "--", env!("CARGO_BIN_EXE_sucl-disagree")])
        .args(args)
        .env("SUCL_BACKEND", backend)
        // Low, so that a disagreement found only by a timeout fails fast (and as Timeout).
        .env("SUCL_TIMEOUT", "5")
        .env("SUCL_CHECK_COLLECTIVES", if check { "1" } else { "0" });
    let out = finish(spawn(cmd), Duration::from_secs(60), &format!("{args:?} on {backend}"));
    assert!(out.status.success(), "{args:?} on {backend}: the helper failed\n{}\n{}", out.stdout, out.stderr);
    steps_by_rank(n, &out.stdout)
}

fn assert_all_mismatch(n: usize, backend: &str, what: &str, args: &[&str]) {
    let ranks = run(n, backend, true, args);
    for (r, steps) in ranks.iter().enumerate() {
        assert_eq!(steps.len(), 2, "{backend} {args:?}: rank {r}: {steps:?}");
        assert!(
            steps[0].contains("ERR Mismatch") && steps[0].contains(what),
            "{backend} {args:?}: rank {r} should report the disagreement on {what}: {steps:?}"
        );
        assert_unusable_since(&steps[1], "barrier", args[1], &steps[0]);
    }
}

/// The message of a `Mismatch` (or any error) in a STEP line: what follows the timing.
fn message(step: &str) -> &str {
    step.split_once(" ms): ").map_or("", |(_, m)| m)
}

/// `step` refused `op` as `Unusable` since `failed_op` failed, quoting `first`'s error message
/// word for word, and says what to do.
fn assert_unusable_since(step: &str, op: &str, failed_op: &str, first: &str) {
    let quoted = format!("since its {failed_op} failed with \"{}\"", message(first));
    assert!(
        step.contains("ERR Unusable")
            && step.contains(&format!(": {op} refused: this communicator is unusable "))
            && step.contains(&quoted)
            && step.ends_with("free it and create a new communicator"),
        "{step}\nshould refuse {op} as unusable, quoting {quoted}"
    );
}

/// After a count mismatch on an all_reduce, a broadcast that every rank calls alike, an
/// all_reduce whose dtypes differ and a sendrecv are each refused as `Unusable`, quoting the
/// first error (never a `Mismatch` of their own, never run).
fn after_failure_later_calls_say_unusable(n: usize, backend: &str, check: bool) {
    let ranks = run(n, backend, check, &["after-failure"]);
    for (r, steps) in ranks.iter().enumerate() {
        assert_eq!(steps.len(), 4, "{backend}: rank {r}: {steps:?}");
        assert!(steps[0].starts_with("all_reduce ERR Mismatch") && steps[0].contains("count"), "{backend}: rank {r}: {steps:?}");
        assert_unusable_since(&steps[1], "broadcast", "all_reduce", &steps[0]);
        assert_unusable_since(&steps[2], "all_reduce", "all_reduce", &steps[0]);
        assert!(!message(&steps[2]).contains("dtype"), "{backend}: rank {r}: the dtype mismatch must not be reported: {steps:?}");
        assert_unusable_since(&steps[3], "sendrecv", "all_reduce", &steps[0]);
    }
}

#[test]
fn after_failure_later_calls_say_unusable_shm() {
    after_failure_later_calls_say_unusable(2, "shm", false);
}

#[test]
fn after_failure_later_calls_say_unusable_tcp_checking() {
    after_failure_later_calls_say_unusable(3, "tcp", true);
}

#[test]
fn checking_mode_reports_root_disagreement_on_every_rank_tcp() {
    for op in ["broadcast", "reduce", "gather", "scatter"] {
        assert_all_mismatch(3, "tcp", "root (0 on ranks 0, 2; 1 on rank 1)", &["root", op]);
    }
}

#[test]
fn checking_mode_reports_root_disagreement_on_every_rank_shm() {
    // shm finds some disagreements itself; this text is the checking mode's.
    assert_all_mismatch(2, "shm", "root (0 on rank 0; 1 on rank 1)", &["root", "gather"]);
}

#[test]
fn checking_mode_reports_count_disagreement_on_every_rank_tcp() {
    for op in ["gather", "scatter"] {
        assert_all_mismatch(3, "tcp", "count (4 on ranks 0, 2; 5 on rank 1)", &["count", op]);
    }
}

/// Without the checking mode a disagreeing count of a rooted collective on tcp is found by the
/// rank that receives; every rank must still end up with Mismatch (at once or at its next call),
/// never Ok on both calls, never Aborted.
#[test]
fn count_disagreement_without_checking_poisons_every_rank_tcp() {
    for op in ["gather", "scatter"] {
        let ranks = run(3, "tcp", false, &["count", op]);
        for (r, steps) in ranks.iter().enumerate() {
            assert_eq!(steps.len(), 2, "{op}: rank {r}: {steps:?}");
            assert!(steps.iter().any(|s| s.contains("ERR Mismatch")), "{op}: rank {r} never saw the Mismatch: {steps:?}");
            let first = steps.iter().find(|s| s.contains("ERR Mismatch")).expect("seen above");
            if steps[0].contains("ERR Mismatch") {
                assert_unusable_since(&steps[1], "barrier", op, first);
            } else {
                // This rank's gather or scatter returned; its barrier got the other's abort.
                assert!(steps[1].starts_with("barrier-after ERR Mismatch"), "{op}: rank {r}: {steps:?}");
            }
            assert!(!steps.iter().any(|s| s.contains("Aborted") || s.contains("Timeout")), "{op}: rank {r}: {steps:?}");
        }
    }
}

/// Without the checking mode tcp cannot see that ranks disagree on a broadcast's root (a rank
/// may return at once), but the messages it leaves behind show it: a rank reports Mismatch in
/// the broadcast itself when a stray message reaches it in time, else at its next call —
/// never carrying on.
#[test]
fn root_disagreement_without_checking_is_reported_by_the_next_call_tcp() {
    let ranks = run(3, "tcp", false, &["root", "broadcast"]);
    for (r, steps) in ranks.iter().enumerate() {
        assert_eq!(steps.len(), 2, "rank {r}: {steps:?}");
        if steps[0].contains("ERR Mismatch") {
            assert!(steps[0].contains("an earlier collective"), "rank {r}: {steps:?}");
            assert_unusable_since(&steps[1], "barrier", "broadcast", &steps[0]);
        } else {
            let reported = steps[1].starts_with("barrier-after ERR Mismatch") && steps[1].contains("an earlier collective");
            assert!(reported, "rank {r}: {steps:?}");
        }
    }
}

/// Without the checking mode, 2 ranks over tcp that disagree on a large all_reduce's count (the
/// pair algorithm of tcp_pair.rs) both get Mismatch at once, and the communicator stays
/// poisoned: the ready frame that opens the call carries the descriptor.
#[test]
fn large_all_reduce_count_disagreement_on_two_ranks_tcp() {
    let ranks = run(2, "tcp", false, &["count-large", "all_reduce"]);
    for (r, steps) in ranks.iter().enumerate() {
        assert_eq!(steps.len(), 2, "rank {r}: {steps:?}");
        assert!(steps[0].contains("ERR Mismatch") && steps[0].contains("count"), "rank {r}: {steps:?}");
        assert_unusable_since(&steps[1], "barrier", "all_reduce", &steps[0]);
    }
}

/// Without the checking mode, a broadcast or scatter whose ranks disagree on the root leaves
/// messages behind; the next collective must never receive them (correct data or an error).
#[test]
fn leftovers_of_a_disagreement_never_reach_a_later_call_tcp() {
    for op in ["broadcast", "scatter"] {
        let ranks = run(2, "tcp", false, &["leftover", op]);
        for (r, steps) in ranks.iter().enumerate() {
            assert_eq!(steps.len(), 2, "{op}: rank {r}: {steps:?}");
            assert!(steps[1].starts_with("again "), "{steps:?}");
            assert!(!steps[1].contains("WRONG"), "{op}: rank {r} received leftover data: {}", steps[1]);
        }
    }
}

/// A bad destination fails at once with InvalidArgument, before the receive half is posted, and
/// leaves the communicator usable.
#[test]
fn sendrecv_to_an_out_of_range_rank_fails_before_posting() {
    for backend in ["tcp", "shm"] {
        let ranks = run(2, backend, false, &["sendrecv-bad-peer"]);
        for (r, steps) in ranks.iter().enumerate() {
            assert!(
                steps[0].starts_with("sendrecv ERR InvalidArgument") && steps[0].contains("rank 2 out of range"),
                "{backend}: rank {r}: {steps:?}"
            );
            assert!(steps[1].starts_with("barrier-after OK"), "{backend}: rank {r}: the communicator must still work: {steps:?}");
        }
    }
}
