//! Faces: the nearest-neighbour exchange of spectral-element codes (after the public Faces
//! benchmark, itself after CORAL-2 Nekbone), on host ranks, in two variants that move the same
//! data — a baseline with host-side non-blocking calls and a stream-triggered one on a
//! [`HostQueue`].
//!
//! Ranks form an `lx × ly × lz` grid (not periodic: off-grid neighbours are [`PROC_NULL`]);
//! each holds `mx × my × mz` elements of `n³` points. One *share* makes every grid point that
//! several elements duplicate (on element faces, edges and corners, within a rank and across
//! ranks) hold the sum of all its copies, with 26 messages per rank (6 faces, 12 edges, 8
//! corners) of every copy on that part of the rank's surface:
//! - pack: each outgoing copy gets the sum of this rank's copies of its point (read before the
//!   interior step changes them);
//! - interior: sums between this rank's own elements, in x, then y, then z passes;
//! - unpack: every copy adds what each neighbour sharing its point sent for it.
//!
//! A host reference checks the result: after `k` shares a point holds `c^(k-1)` times the sum of
//! its copies' initial values (`c` its number of copies), and the initial values are multiples
//! of 1/1024, so every sum is exact and the relative difference must be below 1e-15.

use crate::{CommQueue, HostQueue, SharedBuf, PROC_NULL};
use std::time::{Duration, Instant};
use sucl_runtime::{Communicator, Error, Result};

/// The benchmark's input (`lx ly lz mx my mz n nk nj ni`, as the public Faces reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input {
    /// Ranks along x, y, z.
    pub l: [usize; 3],
    /// Elements per rank along x, y, z.
    pub m: [usize; 3],
    /// Points per element edge (order n − 1).
    pub n: usize,
    /// Outer repetitions (setup included).
    pub nk: usize,
    /// Middle repetitions (re-initialization; the first pass is untimed).
    pub nj: usize,
    /// Shares per middle pass (timed).
    pub ni: usize,
}

impl Input {
    /// Parses the ten numbers.
    pub fn parse(text: &str) -> Result<Input> {
        let v: Vec<usize> = text
            .split_whitespace()
            .map(|w| w.parse::<usize>().map_err(|_| Error::Config(format!("faces input: `{w}` is not a non-negative integer"))))
            .collect::<Result<_>>()?;
        if v.len() != 10 {
            return Err(Error::Config(format!("faces input needs 10 numbers (lx ly lz mx my mz n nk nj ni), got {}", v.len())));
        }
        let inp = Input { l: [v[0], v[1], v[2]], m: [v[3], v[4], v[5]], n: v[6], nk: v[7], nj: v[8], ni: v[9] };
        if inp.l.contains(&0) || inp.m.contains(&0) || inp.n < 2 || inp.ni == 0 {
            return Err(Error::Config("faces input: lx ly lz mx my mz must be ≥ 1, n ≥ 2 and ni ≥ 1".into()));
        }
        let pts = inp.m.iter().product::<usize>().checked_mul(inp.n.pow(3)).filter(|&p| p <= 1 << 31);
        if pts.is_none() {
            return Err(Error::Config("faces input: more than 2^31 points per rank".into()));
        }
        Ok(inp)
    }
}

/// One rank's geometry: its grid position, its 26 neighbours and the layout of its points.
pub struct Grid {
    inp: Input,
    k: [usize; 3],
    /// Neighbour rank per direction (PROC_NULL off the grid), in [`DIRS`] order.
    pub peers: [usize; 26],
}

/// The 26 directions, (dx, dy, dz) ∈ {−1, 0, 1}³ without (0, 0, 0).
pub const DIRS: [[i32; 3]; 26] = {
    let mut d = [[0i32; 3]; 26];
    let mut i = 0;
    let mut z = -1;
    while z <= 1 {
        let mut y = -1;
        while y <= 1 {
            let mut x = -1;
            while x <= 1 {
                if !(x == 0 && y == 0 && z == 0) {
                    d[i] = [x, y, z];
                    i += 1;
                }
                x += 1;
            }
            y += 1;
        }
        z += 1;
    }
    d
};

fn opposite(d: usize) -> usize {
    25 - d
}

impl Grid {
    /// The grid position of `rank` among `size` ranks.
    pub fn new(inp: Input, rank: usize, size: usize) -> Result<Grid> {
        if inp.l.iter().product::<usize>() != size {
            return Err(Error::Config(format!("faces: lx·ly·lz = {} but there are {size} ranks", inp.l.iter().product::<usize>())));
        }
        let k = [rank % inp.l[0], (rank / inp.l[0]) % inp.l[1], rank / (inp.l[0] * inp.l[1])];
        let mut peers = [PROC_NULL; 26];
        for (i, d) in DIRS.iter().enumerate() {
            let q: Vec<i64> = (0..3).map(|a| k[a] as i64 + d[a] as i64).collect();
            if (0..3).all(|a| q[a] >= 0 && q[a] < inp.l[a] as i64) {
                peers[i] = ((q[2] as usize * inp.l[1]) + q[1] as usize) * inp.l[0] + q[0] as usize;
            }
        }
        Ok(Grid { inp, k, peers })
    }

    /// Points of this rank.
    pub fn points(&self) -> usize {
        self.inp.m.iter().product::<usize>() * self.inp.n.pow(3)
    }

    fn at(&self, j: [usize; 3], i: [usize; 3]) -> usize {
        let (n, m) = (self.inp.n, self.inp.m);
        i[0] + n * (i[1] + n * (i[2] + n * (j[0] + m[0] * (j[1] + m[1] * j[2]))))
    }

    /// Length of the message in direction `d`.
    pub fn message_len(&self, d: usize) -> usize {
        (0..3).map(|a| if DIRS[d][a] == 0 { self.inp.m[a] * self.inp.n } else { 1 }).product()
    }

    /// The (element, point) pairs along axis `a` that region `dir` covers.
    fn axis(&self, a: usize, dir: i32) -> Vec<(usize, usize)> {
        let (m, n) = (self.inp.m[a], self.inp.n);
        match dir {
            -1 => vec![(0, 0)],
            1 => vec![(m - 1, n - 1)],
            _ => (0..m).flat_map(|j| (0..n).map(move |i| (j, i))).collect(),
        }
    }

    /// Calls `f(message index, copy)` for every copy in region `d`, in message order.
    fn region(&self, d: usize, mut f: impl FnMut(usize, [usize; 3], [usize; 3])) {
        let ax: Vec<Vec<(usize, usize)>> = (0..3).map(|a| self.axis(a, DIRS[d][a])).collect();
        let mut c = 0;
        for &(jz, iz) in &ax[2] {
            for &(jy, iy) in &ax[1] {
                for &(jx, ix) in &ax[0] {
                    f(c, [jx, jy, jz], [ix, iy, iz]);
                    c += 1;
                }
            }
        }
    }

    /// This rank's other copies along axis `a` of the point at (j, i) (within the rank).
    fn local_twin(&self, a: usize, j: usize, i: usize) -> Option<(usize, usize)> {
        let (m, n) = (self.inp.m[a], self.inp.n);
        if i == 0 && j > 0 {
            Some((j - 1, n - 1))
        } else if i == n - 1 && j + 1 < m {
            Some((j + 1, 0))
        } else {
            None
        }
    }

    /// Pack: message `d` gets, per copy, the sum of this rank's copies of its point.
    pub fn pack(&self, u: &[f64], d: usize, out: &mut [f64]) {
        self.region(d, |c, j, i| {
            let mut s = 0.0;
            let opts: Vec<Vec<(usize, usize)>> = (0..3)
                .map(|a| {
                    let mut v = vec![(j[a], i[a])];
                    if DIRS[d][a] == 0 {
                        v.extend(self.local_twin(a, j[a], i[a]));
                    }
                    v
                })
                .collect();
            for &(jz, iz) in &opts[2] {
                for &(jy, iy) in &opts[1] {
                    for &(jx, ix) in &opts[0] {
                        s += u[self.at([jx, jy, jz], [ix, iy, iz])];
                    }
                }
            }
            out[c] = s;
        });
    }

    /// Interior: sums between this rank's own elements (x, then y, then z).
    pub fn interior(&self, u: &mut [f64]) {
        let (n, m) = (self.inp.n, self.inp.m);
        for a in 0..3 {
            let (b, c) = ((a + 1) % 3, (a + 2) % 3);
            for ja in 0..m[a] - 1 {
                for jb in 0..m[b] {
                    for jc in 0..m[c] {
                        for ib in 0..n {
                            for ic in 0..n {
                                let mut j = [0; 3];
                                let mut i = [0; 3];
                                (j[b], j[c], i[b], i[c]) = (jb, jc, ib, ic);
                                (j[a], i[a]) = (ja, n - 1);
                                let p = self.at(j, i);
                                (j[a], i[a]) = (ja + 1, 0);
                                let q = self.at(j, i);
                                let s = u[p] + u[q];
                                u[p] = s;
                                u[q] = s;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Unpack: every copy of region `d` adds what the neighbour there sent for it.
    pub fn unpack(&self, u: &mut [f64], d: usize, got: &[f64]) {
        let o = opposite(d);
        debug_assert_eq!(self.message_len(d), self.message_len(o));
        self.region(d, |c, j, i| {
            let p = self.at(j, i);
            u[p] += got[c];
        });
    }

    /// For the device kernels: per copy of message `d`, the (up to 4) indices of this rank's
    /// copies that [`Grid::pack`] sums, −1 where there are fewer.
    pub fn pack_sources(&self, d: usize) -> Vec<i32> {
        let mut out = vec![-1i32; 4 * self.message_len(d)];
        self.region(d, |c, j, i| {
            let opts: Vec<Vec<(usize, usize)>> = (0..3)
                .map(|a| {
                    let mut v = vec![(j[a], i[a])];
                    if DIRS[d][a] == 0 {
                        v.extend(self.local_twin(a, j[a], i[a]));
                    }
                    v
                })
                .collect();
            let mut k = 0;
            for &(jz, iz) in &opts[2] {
                for &(jy, iy) in &opts[1] {
                    for &(jx, ix) in &opts[0] {
                        out[4 * c + k] = self.at([jx, jy, jz], [ix, iy, iz]) as i32;
                        k += 1;
                    }
                }
            }
        });
        out
    }

    /// For the device kernels: per copy of message `d`, the index it is added to on unpack.
    pub fn unpack_targets(&self, d: usize) -> Vec<i32> {
        let mut out = vec![0i32; self.message_len(d)];
        self.region(d, |c, j, i| out[c] = self.at(j, i) as i32);
        out
    }

    /// For the device kernels: the disjoint pairs of copies the interior pass along axis `a`
    /// sums, flattened.
    pub fn interior_pairs(&self, a: usize) -> Vec<i32> {
        let (n, m) = (self.inp.n, self.inp.m);
        let (b, c) = ((a + 1) % 3, (a + 2) % 3);
        let mut out = vec![];
        for ja in 0..m[a].saturating_sub(1) {
            for jb in 0..m[b] {
                for jc in 0..m[c] {
                    for ib in 0..n {
                        for ic in 0..n {
                            let mut j = [0; 3];
                            let mut i = [0; 3];
                            (j[b], j[c], i[b], i[c]) = (jb, jc, ib, ic);
                            (j[a], i[a]) = (ja, n - 1);
                            out.push(self.at(j, i) as i32);
                            (j[a], i[a]) = (ja + 1, 0);
                            out.push(self.at(j, i) as i32);
                        }
                    }
                }
            }
        }
        out
    }

    /// The input this grid was made from.
    pub fn input(&self) -> Input {
        self.inp
    }

    fn global(&self, a: usize, j: usize) -> usize {
        self.k[a] * self.inp.m[a] + j
    }

    /// The initial value of a copy: a multiple of 1/1024 in [0, 1) from its global position.
    pub fn initial(&self, j: [usize; 3], i: [usize; 3]) -> f64 {
        let g = [self.global(0, j[0]), self.global(1, j[1]), self.global(2, j[2])];
        let mut h: u64 = 1469598103934665603;
        for v in g.iter().chain(i.iter()) {
            h ^= *v as u64;
            h = h.wrapping_mul(1099511628211);
        }
        ((h >> 20) % 1024) as f64 / 1024.0
    }

    /// The initial field.
    pub fn init(&self, u: &mut [f64]) {
        let (n, m) = (self.inp.n, self.inp.m);
        for jz in 0..m[2] {
            for jy in 0..m[1] {
                for jx in 0..m[0] {
                    for iz in 0..n {
                        for iy in 0..n {
                            for ix in 0..n {
                                u[self.at([jx, jy, jz], [ix, iy, iz])] = self.initial([jx, jy, jz], [ix, iy, iz]);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The host reference after `shares` shares, at every copy of this rank.
    pub fn reference(&self, shares: usize) -> Vec<f64> {
        let (n, m) = (self.inp.n, self.inp.m);
        let total = [self.inp.l[0] * m[0], self.inp.l[1] * m[1], self.inp.l[2] * m[2]];
        let mut out = vec![0.0; self.points()];
        for jz in 0..m[2] {
            for jy in 0..m[1] {
                for jx in 0..m[0] {
                    for iz in 0..n {
                        for iy in 0..n {
                            for ix in 0..n {
                                let (j, i) = ([jx, jy, jz], [ix, iy, iz]);
                                // Every global copy of this point, axis by axis.
                                let opts: Vec<Vec<(i64, usize)>> = (0..3)
                                    .map(|a| {
                                        let g = self.global(a, j[a]) as i64;
                                        let mut v = vec![(g, i[a])];
                                        if i[a] == 0 && g > 0 {
                                            v.push((g - 1, n - 1));
                                        } else if i[a] == n - 1 && g + 1 < total[a] as i64 {
                                            v.push((g + 1, 0));
                                        }
                                        v
                                    })
                                    .collect();
                                let mut s = 0.0;
                                for &(gz, iz2) in &opts[2] {
                                    for &(gy, iy2) in &opts[1] {
                                        for &(gx, ix2) in &opts[0] {
                                            s += initial_at([gx as usize, gy as usize, gz as usize], [ix2, iy2, iz2]);
                                        }
                                    }
                                }
                                let copies = (opts[0].len() * opts[1].len() * opts[2].len()) as f64;
                                out[self.at(j, i)] = s * copies.powi(shares as i32 - 1);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

fn initial_at(g: [usize; 3], i: [usize; 3]) -> f64 {
    let mut h: u64 = 1469598103934665603;
    for v in g.iter().chain(i.iter()) {
        h ^= *v as u64;
        h = h.wrapping_mul(1099511628211);
    }
    ((h >> 20) % 1024) as f64 / 1024.0
}

/// Largest relative difference between `got` and `want` (absolute where `want` is 0).
pub fn max_rel_diff(got: &[f64], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(&g, &w)| if w == 0.0 { g.abs() } else { ((g - w) / w).abs() }).fold(0.0, f64::max)
}

/// Timing and check of one variant on this rank.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    /// Mean seconds per share over the timed passes.
    pub per_step: f64,
    /// Largest relative difference from the reference over every pass.
    pub max_diff: f64,
    /// Mean seconds per share that the program's thread spent blocked on communication or on
    /// the device over the timed passes (waits, synchronizations, throttled starts).
    pub blocked: f64,
}

/// The baseline: pack, (host: nothing to sync), isend/irecv, interior, wait all, unpack.
pub fn run_baseline(comm: &Communicator, g: &Grid, tag: u32) -> Result<Outcome> {
    let lens: Vec<usize> = (0..26).map(|d| g.message_len(d)).collect();
    let mut sends: Vec<Vec<f64>> = lens.iter().map(|&l| vec![0.0; l]).collect();
    let mut recvs: Vec<Vec<f64>> = lens.iter().map(|&l| vec![0.0; l]).collect();
    let mut u = vec![0.0; g.points()];
    let (mut timed, mut steps, mut worst, mut blocked) = (0.0, 0usize, 0.0f64, 0.0);
    for _k in 0..g.inp.nk {
        for j in 0..=g.inp.nj {
            g.init(&mut u);
            comm.barrier()?;
            let t0 = Instant::now();
            let mut waited = Duration::ZERO;
            for _ in 0..g.inp.ni {
                for (d, s) in sends.iter_mut().enumerate() {
                    if g.peers[d] != PROC_NULL {
                        g.pack(&u, d, s);
                    }
                }
                comm.nonblocking(|sc| {
                    let mut rq = vec![];
                    for (d, r) in recvs.iter_mut().enumerate() {
                        if g.peers[d] != PROC_NULL {
                            rq.push((d, sc.irecv(r, g.peers[d], tag)?));
                        }
                    }
                    for (d, s) in sends.iter().enumerate() {
                        if g.peers[d] != PROC_NULL {
                            sc.isend(s, g.peers[d], tag)?;
                        }
                    }
                    g.interior(&mut u);
                    let tw = Instant::now();
                    for (_, r) in rq {
                        r.wait()?;
                    }
                    Ok(tw)
                })
                .map(|tw| waited += tw.elapsed())?;
                for (d, r) in recvs.iter().enumerate() {
                    if g.peers[d] != PROC_NULL {
                        g.unpack(&mut u, d, r);
                    }
                }
            }
            if j > 0 {
                timed += t0.elapsed().as_secs_f64();
                blocked += waited.as_secs_f64();
                steps += g.inp.ni;
            }
            worst = worst.max(max_rel_diff(&u, &g.reference(g.inp.ni)));
        }
    }
    let per = steps.max(1) as f64;
    Ok(Outcome { per_step: timed / per, max_diff: worst, blocked: blocked / per })
}

/// The stream-triggered variant on a host queue: pack, enqueue the receives and sends, start,
/// interior, wait, unpack — all queued; the host blocks only at the end of each pass.
pub fn run_triggered(comm: Communicator, g: &Grid, tag: u32) -> Result<(Outcome, Communicator)> {
    let lens: Vec<usize> = (0..26).map(|d| g.message_len(d)).collect();
    // Shared by the step's tasks through one handle each (not 26 buffer handles per task).
    let sends: std::sync::Arc<Vec<SharedBuf<f64>>> = std::sync::Arc::new(lens.iter().map(|&l| SharedBuf::zeroed(l)).collect());
    let recvs: std::sync::Arc<Vec<SharedBuf<f64>>> = std::sync::Arc::new(lens.iter().map(|&l| SharedBuf::zeroed(l)).collect());
    let u = SharedBuf::<f64>::zeroed(g.points());
    let grid = std::sync::Arc::new(Grid { inp: g.inp, k: g.k, peers: g.peers });
    let q = HostQueue::new();
    // A second communicator for the barriers, so that they never wait behind queued work.
    let ctl = comm.split(Some(0), comm.rank() as i64)?.ok_or_else(|| Error::Config("faces: split".into()))?;
    let mut cq = CommQueue::on_host(comm, &q)?;
    let (mut timed, mut steps, mut worst, mut blocked) = (0.0, 0usize, 0.0f64, 0.0);
    for _k in 0..g.inp.nk {
        for j in 0..=g.inp.nj {
            g.init(&mut u.write());
            ctl.barrier()?;
            let t0 = Instant::now();
            let b0 = cq.host_blocked();
            for _ in 0..g.inp.ni {
                let (gr, uu, ss) = (grid.clone(), u.clone(), sends.clone());
                q.submit(move || {
                    let u = uu.read();
                    for (d, s) in ss.iter().enumerate() {
                        if gr.peers[d] != PROC_NULL {
                            gr.pack(&u, d, &mut s.write());
                        }
                    }
                });
                for (r, &p) in recvs.iter().zip(&g.peers) {
                    cq.enqueue_recv(r, p, tag)?;
                }
                for (s, &p) in sends.iter().zip(&g.peers) {
                    cq.enqueue_send(s, p, tag)?;
                }
                cq.start()?;
                let (gr, uu) = (grid.clone(), u.clone());
                q.submit(move || gr.interior(&mut uu.write()));
                cq.wait()?;
                let (gr, uu, rr) = (grid.clone(), u.clone(), recvs.clone());
                q.submit(move || {
                    let mut u = uu.write();
                    for (d, r) in rr.iter().enumerate() {
                        if gr.peers[d] != PROC_NULL {
                            gr.unpack(&mut u, d, &r.read());
                        }
                    }
                });
            }
            cq.synchronize()?;
            if j > 0 {
                timed += t0.elapsed().as_secs_f64();
                blocked += (cq.host_blocked() - b0).as_secs_f64();
                steps += g.inp.ni;
            }
            worst = worst.max(max_rel_diff(&u.read(), &g.reference(g.inp.ni)));
        }
    }
    drop(ctl);
    let comm = cq.close()?;
    let per = steps.max(1) as f64;
    Ok((Outcome { per_step: timed / per, max_diff: worst, blocked: blocked / per }, comm))
}
