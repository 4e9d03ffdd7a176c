//! The v-collectives part of `sucl check`: gatherv, scatterv, all_gatherv and all_to_allv with
//! uneven counts (zeros included) and displacements with gaps and out of rank order, checked
//! element by element — gaps too, which must keep their sentinel — against a reference built
//! serially from the value function, independently of any communication.
//!
//! Test hook: `SUCL_CHECK_V_MISMATCH=R` adds calls in which rank `R` passes a counts table that
//! differs from the others'; every rank must get `Mismatch` from each of them (printed as
//! `v-mismatch detected: ...`; anything else counts as wrong), and later calls still work.

use sucl::{Communicator, Element, Error, Result};

/// What a gap (an element no block covers) holds before and after the call.
const SENTINEL: i16 = -7;

/// The value of element `k` of the block rank `src` sends to rank `dst`.
fn val<T: From<i16>>(src: usize, dst: usize, k: usize) -> T {
    T::from(((src * 97 + dst * 31 + k * 7) % 30000) as i16)
}

/// Displacements for `counts` with a gap of `gap` elements before each block, blocks placed in
/// reverse rank order when `reverse`; returns them and the buffer length needed.
fn layout(counts: &[usize], gap: usize, reverse: bool) -> (Vec<usize>, usize) {
    let n = counts.len();
    let mut displs = vec![0; n];
    let mut at = 0;
    for i in 0..n {
        let r = if reverse { n - 1 - i } else { i };
        at += gap;
        displs[r] = at;
        at += counts[r];
    }
    (displs, at + gap)
}

/// Count tables exercised at `n` ranks (each includes zeros once `n > 1`).
fn count_tables(n: usize) -> Vec<Vec<usize>> {
    vec![
        (0..n).map(|r| (r * 3 + 1) % 4).collect(),
        (0..n).map(|r| if r == n - 1 { 5 } else { 0 }).collect(),
        (0..n).map(|r| 1000 + r * 37).collect(),
    ]
}

/// Runs every v-check; `record(what, wrong_elements)` collects the results.
pub fn run(comm: &Communicator, record: &mut dyn FnMut(&str, usize)) -> Result<()> {
    let bad_rank: Option<usize> = std::env::var("SUCL_CHECK_V_MISMATCH").ok().and_then(|s| s.parse().ok());
    if let Some(bad) = bad_rank {
        check_mismatch(comm, bad, record)?;
    }
    typed::<i32>(comm, record)?;
    typed::<f64>(comm, record)?;
    typed::<i64>(comm, record)
}

/// Rank `bad` passes a counts table with one more element for rank 0 (gatherv) and for the
/// pair 0 → 0 (all_to_allv); every rank must see `Mismatch`.
fn check_mismatch(comm: &Communicator, bad: usize, record: &mut dyn FnMut(&str, usize)) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let mut counts = vec![1usize; n];
    if me == bad {
        counts[0] += 1;
    }
    let send = vec![1i32; counts[me]];
    let displs: Vec<usize> = (0..n).map(|r| 2 * r).collect();
    let mut recv = vec![0i32; 2 * n];
    let r = comm.gatherv(&send[..], &mut recv[..], &counts, &displs, 0);
    report_mismatch(me, "gatherv", r, record);
    let mut matrix = vec![1usize; n * n];
    if me == bad {
        matrix[0] += 1;
    }
    let d: Vec<usize> = (0..n).map(|r| 2 * r).collect();
    let send = vec![1i32; 2 * n];
    let mut recv = vec![0i32; 2 * n];
    let r = comm.all_to_allv(&send[..], &d, &mut recv[..], &d, &matrix);
    report_mismatch(me, "all_to_allv", r, record);
    Ok(())
}

fn report_mismatch(me: usize, op: &str, r: Result<()>, record: &mut dyn FnMut(&str, usize)) {
    match r {
        Err(e @ Error::Mismatch { .. }) => {
            // One write(2) for the whole line: under mpirun every rank shares one stderr pipe,
            // and a line written in pieces interleaves with other ranks' lines.
            let line = format!("v-mismatch detected: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        other => {
            eprintln!("rank {me}: {op} with a differing counts table gave {other:?}, not a Mismatch");
            record(&format!("{op} counts mismatch"), 1);
            return;
        }
    }
    record(&format!("{op} counts mismatch"), 0);
}

fn typed<T: Element + From<i16> + PartialEq + Copy>(comm: &Communicator, record: &mut dyn FnMut(&str, usize)) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let s: T = T::from(SENTINEL);
    for (t, base) in count_tables(n).into_iter().enumerate() {
        let counts = base.clone();
        let root = t % n;
        let dt = T::DTYPE;
        // gatherv
        let (displs, len) = layout(&base, 2, t % 2 == 0);
        let send: Vec<T> = (0..base[me]).map(|k| val(me, root, k)).collect();
        let mut recv = vec![s; if me == root { len } else { 0 }];
        comm.gatherv(&send[..], &mut recv[..], &counts, &displs, root)?;
        if me == root {
            let mut want = vec![s; len];
            for (r, (&c, &d)) in base.iter().zip(&displs).enumerate() {
                for k in 0..c {
                    want[d + k] = val(r, root, k);
                }
            }
            record(&format!("gatherv {dt} table {t} root {root}"), diff(&recv, &want));
        }
        // scatterv
        let send: Vec<T> = if me == root {
            let mut v = vec![s; len];
            for (r, (&c, &d)) in base.iter().zip(&displs).enumerate() {
                for k in 0..c {
                    v[d + k] = val(root, r, k);
                }
            }
            v
        } else {
            Vec::new()
        };
        let mut recv = vec![s; base[me]];
        comm.scatterv(&send[..], &mut recv[..], &counts, &displs, root)?;
        let want: Vec<T> = (0..base[me]).map(|k| val(root, me, k)).collect();
        record(&format!("scatterv {dt} table {t} root {root}"), diff(&recv, &want));
        // all_gatherv
        let (displs, len) = layout(&base, 1, t % 2 == 1);
        let send: Vec<T> = (0..base[me]).map(|k| val(me, usize::MAX % 7, k)).collect();
        let mut recv = vec![s; len];
        comm.all_gatherv(&send[..], &mut recv[..], &counts, &displs)?;
        let mut want = vec![s; len];
        for (r, (&c, &d)) in base.iter().zip(&displs).enumerate() {
            for k in 0..c {
                want[d + k] = val(r, usize::MAX % 7, k);
            }
        }
        record(&format!("all_gatherv {dt} table {t}"), diff(&recv, &want));
        // all_to_allv: counts[i][j] from a rotation of the table, so rows and columns differ.
        let matrix: Vec<usize> = (0..n * n).map(|x| base[(x / n + 2 * (x % n)) % n] / (1 + x % 3)).collect();
        let mine = matrix.clone();
        let row: Vec<usize> = matrix[me * n..(me + 1) * n].to_vec();
        let col: Vec<usize> = (0..n).map(|i| matrix[i * n + me]).collect();
        let (sd, slen) = layout(&row, 1, false);
        let (rd, rlen) = layout(&col, 3, true);
        let mut send = vec![s; slen];
        for j in 0..n {
            for k in 0..row[j] {
                send[sd[j] + k] = val(me, j, k);
            }
        }
        let mut recv = vec![s; rlen];
        comm.all_to_allv(&send[..], &sd, &mut recv[..], &rd, &mine)?;
        let mut want = vec![s; rlen];
        for i in 0..n {
            for k in 0..col[i] {
                want[rd[i] + k] = val(i, me, k);
            }
        }
        record(&format!("all_to_allv {dt} table {t}"), diff(&recv, &want));
    }
    check_errors(comm, record)
}

/// Invalid arguments are rejected on the rank that passed them (and as Mismatch elsewhere),
/// before anything moves; the communicator keeps working afterwards.
fn check_errors(comm: &Communicator, record: &mut dyn FnMut(&str, usize)) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let counts = vec![2usize; n];
    let send = [1i32; 2];
    // Overlapping receive blocks on the root (only when there are two blocks to overlap).
    if n > 1 {
        let displs: Vec<usize> = (0..n).collect();
        let mut recv = vec![0i32; 2 * n];
        let r = comm.all_gatherv(&send[..], &mut recv[..], &counts, &displs);
        record("all_gatherv with overlapping blocks is rejected", usize::from(!matches!(r, Err(Error::InvalidArgument { .. }))));
    }
    // A displacement past the end, on one rank only: that rank gets InvalidArgument, the others Mismatch.
    let mut displs: Vec<usize> = (0..n).map(|r| 2 * r).collect();
    if me == n - 1 {
        displs[n - 1] = 2 * n - 1;
    }
    let mut recv = vec![0i32; 2 * n];
    let r = comm.all_gatherv(&send[..], &mut recv[..], &counts, &displs);
    let ok = if me == n - 1 { matches!(r, Err(Error::InvalidArgument { .. })) } else { matches!(r, Err(Error::Mismatch { .. })) };
    record("all_gatherv with a block past the end is rejected on every rank", usize::from(!ok));
    // Root out of range.
    let r = comm.gatherv(&send[..], &mut recv[..], &counts, &displs, n);
    record("gatherv with root out of range is rejected", usize::from(!matches!(r, Err(Error::InvalidArgument { .. }))));
    // Still usable: a valid call after the rejected ones.
    let displs: Vec<usize> = (0..n).map(|r| 2 * r).collect();
    let send = [me as i32; 2];
    comm.all_gatherv(&send[..], &mut recv[..], &counts, &displs)?;
    let want: Vec<i32> = (0..2 * n).map(|x| (x / 2) as i32).collect();
    record("all_gatherv after rejected calls", diff(&recv, &want));
    Ok(())
}

fn diff<T: PartialEq>(got: &[T], want: &[T]) -> usize {
    if got.len() != want.len() {
        return got.len().max(want.len());
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count()
}

/// The v-collectives on device buffers (run by `sucl check --device cuda` while NCCL is the
/// pinned device backend): all_gatherv, gatherv and scatterv with uneven counts and all_to_allv
/// with zero counts, displacements with gaps, against the same serial references. Returns
/// (checks, failed checks) on this rank.
#[cfg(feature = "cuda")]
pub fn run_device(comm: &Communicator, q: &sucl::cuda::Queue) -> Result<(u64, u64)> {
    let n = comm.size();
    let me = comm.rank();
    let s = f32::from(SENTINEL);
    let (mut checks, mut failures) = (0u64, 0u64);
    let mut record = |what: &str, wrong: usize| {
        checks += 1;
        if wrong > 0 {
            failures += 1;
            eprintln!("WRONG device {what}: {wrong} wrong elements");
        }
    };
    let counts: Vec<usize> = (0..n).map(|r| 1000 + r * 37).collect();
    let (displs, len) = layout(&counts, 2, true);
    let root = n - 1;
    // all_gatherv
    let send: Vec<f32> = (0..counts[me]).map(|k| val(me, 0, k)).collect();
    let dsend = q.upload(&send)?;
    let mut drecv = q.upload(&vec![s; len])?;
    comm.all_gatherv(&dsend, &mut drecv, &counts, &displs)?;
    let mut want = vec![s; len];
    for (r, (&c, &d)) in counts.iter().zip(&displs).enumerate() {
        for k in 0..c {
            want[d + k] = val(r, 0, k);
        }
    }
    record("all_gatherv f32", diff(&drecv.to_vec()?, &want));
    // gatherv to the last rank (others pass a one-element receive buffer it does not use)
    let mut drecv = q.upload(&vec![s; if me == root { len } else { 1 }])?;
    comm.gatherv(&dsend, &mut drecv, &counts, &displs, root)?;
    if me == root {
        record("gatherv f32", diff(&drecv.to_vec()?, &want));
    }
    // scatterv from the last rank
    let mut src = vec![s; len];
    for (r, (&c, &d)) in counts.iter().zip(&displs).enumerate() {
        for k in 0..c {
            src[d + k] = val(root, r, k);
        }
    }
    let dsrc = q.upload(&src)?;
    let mut drecv = q.upload(&vec![s; counts[me]])?;
    comm.scatterv(&dsrc, &mut drecv, &counts, &displs, root)?;
    let want: Vec<f32> = (0..counts[me]).map(|k| val(root, me, k)).collect();
    record("scatterv f32", diff(&drecv.to_vec()?, &want));
    // all_to_allv with zeros in the matrix
    let matrix: Vec<usize> = (0..n * n).map(|x| ((x / n) * 3 + x % n) % 4 * 500).collect();
    let row: Vec<usize> = matrix[me * n..(me + 1) * n].to_vec();
    let col: Vec<usize> = (0..n).map(|i| matrix[i * n + me]).collect();
    let (sd, slen) = layout(&row, 1, false);
    let (rd, rlen) = layout(&col, 3, true);
    let mut send = vec![s; slen];
    for j in 0..n {
        for k in 0..row[j] {
            send[sd[j] + k] = val(me, j, k);
        }
    }
    let dsend = q.upload(&send)?;
    let mut drecv = q.upload(&vec![s; rlen])?;
    comm.all_to_allv(&dsend, &sd, &mut drecv, &rd, &matrix)?;
    let mut want = vec![s; rlen];
    for i in 0..n {
        for k in 0..col[i] {
            want[rd[i] + k] = val(i, me, k);
        }
    }
    record("all_to_allv f32", diff(&drecv.to_vec()?, &want));
    Ok((checks, failures))
}
