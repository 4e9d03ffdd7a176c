//! `sucl run` forwards the output of its ranks whole lines at a time: lines that several ranks
//! print at once never tear each other, with or without the rank prefix, and a last line
//! without a newline still arrives, as a line of its own.

mod common;

use common::{finish, sucl, Reaped};
use std::process::Stdio;
use std::time::Duration;

const RANKS: usize = 4;
const LINES: usize = 200;
const WIDTH: usize = 10_000;

/// Every rank prints `LINES` lines of `WIDTH` copies of its own letter (rank 0: `a`, ...) as
/// fast as it can to stdout and to stderr, through stdio buffers that cut them at arbitrary
/// points, then a last line `end-R` with no newline.
fn noisy_job(no_prefix: bool) -> (String, String) {
    let script = format!(
        "case $SUCL_RANK in 0) l=a;; 1) l=b;; 2) l=c;; *) l=d;; esac; \
         line=$(head -c {WIDTH} /dev/zero | tr '\\0' \"$l\"); \
         yes \"$line\" | head -n {LINES} & yes \"$line\" | head -n {LINES} >&2; wait; printf end-$SUCL_RANK"
    );
    let mut cmd = sucl();
    cmd.args(["run", "-n", &RANKS.to_string()]);
    if no_prefix {
        cmd.arg("--no-prefix");
    }
    cmd.args(["--", "sh", "-c", &script]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = finish(Reaped(cmd.spawn().expect("spawn sucl run")), Duration::from_secs(120), "noisy job");
    assert!(out.status.success(), "sucl run failed: {:?}\n{}", out.status, out.stderr.lines().last().unwrap_or(""));
    (out.stdout, out.stderr)
}

/// Checks that `text` is made of whole lines only: per rank `LINES` lines of its letter and
/// its `end-R` line, each line (after the prefix, if any) exactly one of those.
fn assert_whole_lines(text: &str, prefixed: bool, what: &str) {
    let mut full = [0usize; RANKS];
    let mut ends = [0usize; RANKS];
    for (i, line) in text.lines().enumerate() {
        let (rank, body) = if prefixed {
            let (p, b) = line.split_once("] ").unwrap_or_else(|| panic!("{what} line {i} has no prefix: {:.60}", line));
            (Some(p.trim_start_matches('[').parse::<usize>().unwrap_or_else(|_| panic!("{what} line {i}: bad prefix {p:.20}"))), b)
        } else {
            (None, line)
        };
        if let Some(r) = body.strip_prefix("end-") {
            let r: usize = r.parse().unwrap_or_else(|_| panic!("{what} line {i}: torn end line {body:.60}"));
            assert!(rank.is_none_or(|p| p == r), "{what} line {i}: end-{r} under prefix {rank:?}");
            ends[r] += 1;
            continue;
        }
        let letter = body.as_bytes().first().copied().unwrap_or(b'?');
        let r = letter.wrapping_sub(b'a') as usize;
        assert!(
            r < RANKS && body.len() == WIDTH && body.bytes().all(|b| b == letter),
            "{what} line {i} is torn: {} bytes starting {:.40}...",
            body.len(),
            body
        );
        assert!(rank.is_none_or(|p| p == r), "{what} line {i}: rank {r}'s line under prefix {rank:?}");
        full[r] += 1;
    }
    assert_eq!(full, [LINES; RANKS], "{what}: whole lines per rank");
    // The unterminated last line goes to stdout only (printf there).
    let want_ends = if what == "stdout" { [1; RANKS] } else { [0; RANKS] };
    assert_eq!(ends, want_ends, "{what}: end lines per rank");
}

#[test]
fn concurrent_long_lines_arrive_whole_with_the_prefix() {
    let (out, err) = noisy_job(false);
    assert_whole_lines(&out, true, "stdout");
    assert_whole_lines(&err, true, "stderr");
}

#[test]
fn concurrent_long_lines_arrive_whole_without_the_prefix() {
    let (out, err) = noisy_job(true);
    assert_whole_lines(&out, false, "stdout");
    assert_whole_lines(&err, false, "stderr");
}
