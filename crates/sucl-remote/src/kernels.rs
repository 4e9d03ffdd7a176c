//! Host kernels: a registry of named Rust functions the daemon was built with, and the memory
//! they run on. A program that embeds the daemon registers its own next to the built-in ones
//! ([`KernelRegistry::register`]); clients launch them by name.

use crate::wire::Arg;
use std::collections::HashMap;
use std::sync::Arc;

/// Host device memory: zeroed bytes kept in 8-byte words, so that any element type up to
/// `u64`/`f64` can view it aligned.
pub struct HostMem {
    words: Vec<u64>,
    len: usize,
}

impl HostMem {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> HostMem {
        HostMem { words: vec![0; len.div_ceil(8)], len }
    }
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    /// Its bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// One launch as a kernel sees it: its arguments, with buffer arguments resolved to the
/// session's memory (each buffer at most once per launch), and its range.
pub struct KernelCall<'a> {
    args: &'a [Arg],
    /// Buffers in argument order (`None` for scalar arguments).
    mems: Vec<Option<&'a mut HostMem>>,
    range: u64,
}

fn view<T: bytemuck::Pod>(m: &mut HostMem, i: usize) -> Result<&mut [T], String> {
    let n = std::mem::size_of::<T>();
    let b = m.bytes_mut();
    if !b.len().is_multiple_of(n) {
        return Err(format!("argument {i}: a buffer of {} bytes is not a whole number of {n}-byte elements", b.len()));
    }
    bytemuck::try_cast_slice_mut(b).map_err(|e| format!("argument {i}: {e}"))
}

impl<'a> KernelCall<'a> {
    /// Builds a call (the daemon does this; public for testing kernels without a daemon).
    pub fn new(args: &'a [Arg], mems: Vec<Option<&'a mut HostMem>>, range: u64) -> KernelCall<'a> {
        KernelCall { args, mems, range }
    }

    /// The number of arguments.
    pub fn arg_count(&self) -> usize {
        self.args.len()
    }

    /// Fails unless there are exactly `n` arguments.
    pub fn expect_args(&self, n: usize) -> Result<(), String> {
        if self.args.len() != n {
            return Err(format!("takes {n} arguments, got {}", self.args.len()));
        }
        Ok(())
    }

    /// The launch's range (0 = the whole buffer, by convention).
    pub fn range(&self) -> u64 {
        self.range
    }

    /// The first `range` of `len` elements (all of them when the range is 0).
    pub fn extent(&self, len: usize) -> Result<usize, String> {
        c_extent(self.range, len)
    }

    /// Argument `i`, a buffer, as elements of `T`.
    pub fn buffer<T: bytemuck::Pod>(&mut self, i: usize) -> Result<&mut [T], String> {
        match self.mems.get_mut(i) {
            Some(Some(m)) => view(m, i),
            Some(None) => Err(format!("argument {i} must be a buffer")),
            None => Err(format!("argument {i} is missing")),
        }
    }

    /// Arguments `i` and `j` (`i < j`), both buffers, as elements of `T`.
    pub fn buffer_pair<T: bytemuck::Pod>(&mut self, i: usize, j: usize) -> Result<(&mut [T], &mut [T]), String> {
        if i >= j || j >= self.mems.len() {
            return Err(format!("arguments {i} and {j} must be two buffers"));
        }
        let (lo, hi) = self.mems.split_at_mut(j);
        match (&mut lo[i], &mut hi[0]) {
            (Some(a), Some(b)) => Ok((view(a, i)?, view(b, j)?)),
            _ => Err(format!("arguments {i} and {j} must be buffers")),
        }
    }

    /// Arguments `idx` (strictly increasing), all buffers, as elements of `T`.
    pub fn buffers<T: bytemuck::Pod, const N: usize>(&mut self, idx: [usize; N]) -> Result<[&mut [T]; N], String> {
        if idx.windows(2).any(|w| w[0] >= w[1]) || idx.last().is_some_and(|&l| l >= self.mems.len()) {
            return Err(format!("arguments {idx:?} must be {N} buffers"));
        }
        let mut out = Vec::with_capacity(N);
        let mut rest = self.mems.iter_mut().enumerate();
        for want in idx {
            match rest.find(|(i, _)| *i == want) {
                Some((i, Some(m))) => out.push(view(m, i)?),
                _ => return Err(format!("argument {want} must be a buffer")),
            }
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!("one view per index")))
    }

    /// Argument `i` as a `u64` (unsigned integers only).
    pub fn u64(&self, i: usize) -> Result<u64, String> {
        match self.args.get(i) {
            Some(Arg::U64(v)) => Ok(*v),
            Some(a) => Err(format!("argument {i} must be an unsigned integer, got {a:?}")),
            None => Err(format!("argument {i} is missing")),
        }
    }

    /// Argument `i` as an `f64` (floats and integers convert).
    pub fn f64(&self, i: usize) -> Result<f64, String> {
        match self.args.get(i) {
            Some(Arg::F64(v)) => Ok(*v),
            Some(Arg::F32(v)) => Ok(*v as f64),
            Some(Arg::U64(v)) => Ok(*v as f64),
            Some(Arg::I64(v)) => Ok(*v as f64),
            Some(Arg::Buffer(_)) => Err(format!("argument {i} must be a number, got a buffer")),
            None => Err(format!("argument {i} is missing")),
        }
    }
}

/// A host kernel.
pub type HostKernel = Arc<dyn Fn(&mut KernelCall) -> Result<(), String> + Send + Sync>;

/// Named host kernels.
#[derive(Clone, Default)]
pub struct KernelRegistry {
    kernels: HashMap<String, HostKernel>,
}

impl KernelRegistry {
    /// An empty registry.
    pub fn new() -> KernelRegistry {
        KernelRegistry::default()
    }

    /// The built-in kernels: `gemm_f64(c, a, b, m, n, k, ldc, col0)` (see [`gemm`]),
    /// `noop()`, `increment_u64(buf)`, `fill_u64(buf, value)`,
    /// `axpy_f32(y, x, a)` and `axpy_f64(y, x, a)` (y ← a·x + y), `stencil3_f32(out, in)`
    /// (`out[i]` ← mean of `in[i-1..=i+1]` inside, copied at the ends), `sleep_ms(ms)` (at most
    /// 10 000), and `jacobi3d_f64(out, in, nx, ny)`: one 7-point Jacobi step on a block of
    /// `nz` planes of `nx`×`ny` stored with one halo plane below and above (`(nz+2)·nx·ny`
    /// elements): interior cells of planes 1..=nz become the mean of their six neighbours,
    /// cells on the x/y faces keep their values, halo planes are left alone. A range limits
    /// each to its first `range` elements.
    pub fn with_builtins() -> KernelRegistry {
        let mut r = KernelRegistry::new();
        r.register("noop", |_| Ok(()));
        r.register("increment_u64", |c| {
            c.expect_args(1)?;
            let range = c.range();
            let b = c.buffer::<u64>(0)?;
            let n = c_extent(range, b.len())?;
            for v in &mut b[..n] {
                *v = v.wrapping_add(1);
            }
            Ok(())
        });
        r.register("fill_u64", |c| {
            c.expect_args(2)?;
            let (v, range) = (c.u64(1)?, c.range());
            let b = c.buffer::<u64>(0)?;
            let n = c_extent(range, b.len())?;
            b[..n].fill(v);
            Ok(())
        });
        r.register("axpy_f32", |c| axpy::<f32>(c, |a, x, y| (a as f32) * x + y));
        r.register("axpy_f64", |c| axpy::<f64>(c, |a, x, y| a * x + y));
        r.register("stencil3_f32", |c| {
            c.expect_args(2)?;
            let range = c.range;
            let (out, inp) = c.buffer_pair::<f32>(0, 1)?;
            if out.len() != inp.len() {
                return Err(format!("out has {} elements, in has {}", out.len(), inp.len()));
            }
            let n = c_extent(range, out.len())?;
            for i in 0..n {
                out[i] = if i == 0 || i + 1 == n { inp[i] } else { (inp[i - 1] + inp[i] + inp[i + 1]) / 3.0 };
            }
            Ok(())
        });
        r.register("jacobi3d_f64", |c| {
            c.expect_args(4)?;
            let (nx, ny) = (c.u64(2)? as usize, c.u64(3)? as usize);
            let (out, inp) = c.buffer_pair::<f64>(0, 1)?;
            jacobi3d(out, inp, nx, ny)
        });
        r.register("gemm_f64", |c| {
            c.expect_args(8)?;
            let dims = [c.u64(3)?, c.u64(4)?, c.u64(5)?, c.u64(6)?, c.u64(7)?].map(|v| v as usize);
            let [out, a, b] = c.buffers::<f64, 3>([0, 1, 2])?;
            gemm(out, a, b, Gemm { m: dims[0], n: dims[1], k: dims[2], ldc: dims[3], col0: dims[4] })
        });
        r.register("sleep_ms", |c| {
            c.expect_args(1)?;
            let ms = c.u64(0)?;
            if ms > 10_000 {
                return Err(format!("sleeps at most 10000 ms, asked for {ms}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        });
        r
    }

    /// Adds (or replaces) kernel `name`.
    pub fn register(&mut self, name: &str, f: impl Fn(&mut KernelCall) -> Result<(), String> + Send + Sync + 'static) -> &mut Self {
        self.kernels.insert(name.to_string(), Arc::new(f));
        self
    }

    /// Kernel `name`.
    pub fn get(&self, name: &str) -> Option<&HostKernel> {
        self.kernels.get(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<_> = self.kernels.keys().cloned().collect();
        v.sort();
        v
    }
}

/// One 7-point Jacobi step (see [`KernelRegistry::with_builtins`]); public so that a benchmark
/// can check a remote run against the same arithmetic run locally.
pub fn jacobi3d(out: &mut [f64], inp: &[f64], nx: usize, ny: usize) -> Result<(), String> {
    let plane = nx.checked_mul(ny).filter(|p| *p > 0).ok_or("nx and ny must be positive")?;
    if out.len() != inp.len() || !out.len().is_multiple_of(plane) || out.len() / plane < 3 {
        return Err(format!("out ({}) and in ({}) must be the same whole number (≥ 3) of {nx}×{ny} planes", out.len(), inp.len()));
    }
    let nz = out.len() / plane - 2;
    for z in 1..=nz {
        for y in 0..ny {
            for x in 0..nx {
                let i = z * plane + y * nx + x;
                out[i] = if x == 0 || y == 0 || x + 1 == nx || y + 1 == ny {
                    inp[i]
                } else {
                    (inp[i - 1] + inp[i + 1] + inp[i - nx] + inp[i + nx] + inp[i - plane] + inp[i + plane]) / 6.0
                };
            }
        }
    }
    Ok(())
}

/// CUDA C versions of the benchmark kernels, for CUDA devices (compiled by NVRTC on the server,
/// or locally for a reference run). Each thread computes one element with the same arithmetic
/// in the same order wherever it runs, so a split run equals a whole one bit for bit.
pub mod cuda_src {
    /// The CUDA C of a Jacobi 3D kernel named `$name` on cells of type `$t` (`$six`: 6 in it).
    macro_rules! jacobi3d_src {
        ($name:literal, $t:literal, $six:literal) => {
            concat!(
                "\nextern \"C\" __global__ void ",
                $name,
                "(",
                $t,
                "* out, const ",
                $t,
                "* in, unsigned long long nx,
                                        unsigned long long ny, unsigned long long nz) {
    unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long plane = nx * ny;
    if (t >= plane * nz) return;
    unsigned long long i = t + plane;
    unsigned long long x = i % nx, y = (i / nx) % ny;
    if (x == 0 || y == 0 || x + 1 == nx || y + 1 == ny) {
        out[i] = in[i];
    } else {
        out[i] = (in[i - 1] + in[i + 1] + in[i - nx] + in[i + nx] + in[i - plane] + in[i + plane]) / ",
                $six,
                ";
    }
}
"
            )
        };
    }

    /// `jacobi3d_f64(out, in, nx, ny, nz)` over `nx·ny·nz` threads: [`super::jacobi3d`] on a block
    /// of `nz` planes with one halo plane below and above.
    pub const JACOBI3D_F64: &str = jacobi3d_src!("jacobi3d_f64", "double", "6.0");

    /// `jacobi3d_f32(out, in, nx, ny, nz)`: [`JACOBI3D_F64`] in single precision.
    pub const JACOBI3D_F32: &str = jacobi3d_src!("jacobi3d_f32", "float", "6.0f");

    /// `gemm_f64(c, a, b, m, n, k, ldc, col0)` over `256 · ⌈m/16⌉ · ⌈n/16⌉` threads: the
    /// product of [`super::gemm`] in 16×16 tiles through shared memory, each element an `fma`
    /// chain over `k` in order.
    pub const GEMM_F64: &str = r#"
extern "C" __global__ void gemm_f64(double* c, const double* a, const double* b, unsigned long long m,
                                    unsigned long long n, unsigned long long k, unsigned long long ldc,
                                    unsigned long long col0) {
    __shared__ double tile_a[16][16];
    __shared__ double tile_b[16][16];
    unsigned long long tiles_n = (n + 15) / 16;
    unsigned long long bi = blockIdx.x / tiles_n, bj = blockIdx.x % tiles_n;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    unsigned long long i = bi * 16 + ty, j = bj * 16 + tx;
    double acc = 0.0;
    for (unsigned long long k0 = 0; k0 < k; k0 += 16) {
        tile_a[ty][tx] = (i < m && k0 + tx < k) ? a[i * k + k0 + tx] : 0.0;
        tile_b[ty][tx] = (k0 + ty < k && j < n) ? b[(k0 + ty) * n + j] : 0.0;
        __syncthreads();
        for (int q = 0; q < 16; ++q) acc = fma(tile_a[ty][q], tile_b[q][tx], acc);
        __syncthreads();
    }
    if (i < m && j < n) c[i * ldc + col0 + j] = acc;
}
"#;

    /// The threads `gemm_f64` is launched over for an `m×n` block.
    pub fn gemm_range(m: u64, n: u64) -> u64 {
        256 * m.div_ceil(16) * n.div_ceil(16)
    }
}

/// The shape of one [`gemm`] call.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B (and of the block of C written).
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Row stride of C (≥ `col0 + n`).
    pub ldc: usize,
    /// The first column of C written.
    pub col0: usize,
}

/// `C[i, col0 + j] = Σ_k A[i, k] · B[k, j]` for `i < m`, `j < n` (A is `m×k`, B `k×n`, both
/// row-major and dense; C row-major with stride `ldc`): one block of a blocked matrix product.
/// Each element sums its `k` products in order, so a product computed in column blocks equals
/// the one computed whole, bit for bit. Kernel `gemm_f64` (arguments C, A, B, m, n, k, ldc,
/// col0); public so that a benchmark can check a remote run against a local one.
pub fn gemm(c: &mut [f64], a: &[f64], b: &[f64], g: Gemm) -> Result<(), String> {
    let Gemm { m, n, k, ldc, col0 } = g;
    let need = |x: usize, y: usize| x.checked_mul(y).ok_or_else(|| format!("{x}×{y} overflows"));
    let c_need = if m == 0 { 0 } else { need(m - 1, ldc)?.checked_add(col0 + n).ok_or("C overflows")? };
    if col0.checked_add(n).is_none_or(|e| e > ldc) || a.len() < need(m, k)? || b.len() < need(k, n)? || c.len() < c_need {
        return Err(format!(
            "gemm {m}×{n}×{k} (C stride {ldc}, first column {col0}) does not fit A ({}), B ({}) and C ({}) elements",
            a.len(),
            b.len(),
            c.len()
        ));
    }
    for i in 0..m {
        let row = &mut c[i * ldc + col0..i * ldc + col0 + n];
        row.fill(0.0);
        for (kk, aik) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (cj, bj) in row.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *cj += aik * bj;
            }
        }
    }
    Ok(())
}

fn c_extent(range: u64, len: usize) -> Result<usize, String> {
    match range {
        0 => Ok(len),
        r if r as usize <= len => Ok(r as usize),
        r => Err(format!("range {r} exceeds the buffer's {len} elements")),
    }
}

fn axpy<T: bytemuck::Pod>(c: &mut KernelCall, f: impl Fn(f64, T, T) -> T) -> Result<(), String> {
    c.expect_args(3)?;
    let (a, range) = (c.f64(2)?, c.range);
    let (y, x) = c.buffer_pair::<T>(0, 1)?;
    if y.len() != x.len() {
        return Err(format!("y has {} elements, x has {}", y.len(), x.len()));
    }
    let n = c_extent(range, y.len())?;
    for (yi, xi) in y[..n].iter_mut().zip(&x[..n]) {
        *yi = f(a, *xi, *yi);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axpy_and_stencil_compute_what_they_say() {
        let r = KernelRegistry::with_builtins();
        let (mut y, mut x) = (HostMem::zeroed(16), HostMem::zeroed(16));
        y.bytes_mut().copy_from_slice(bytemuck::cast_slice(&[1f32, 2., 3., 4.]));
        x.bytes_mut().copy_from_slice(bytemuck::cast_slice(&[1f32, 1., 1., 1.]));
        let args = [Arg::Buffer(1), Arg::Buffer(2), Arg::F64(2.0)];
        r.get("axpy_f32").unwrap()(&mut KernelCall::new(&args, vec![Some(&mut y), Some(&mut x), None], 0)).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(y.bytes()), &[3., 4., 5., 6.]);
        let mut out = HostMem::zeroed(16);
        r.get("stencil3_f32").unwrap()(&mut KernelCall::new(&args[..2], vec![Some(&mut out), Some(&mut y)], 0)).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(out.bytes()), &[3., 4., 5., 6.]);
        let e = r.get("axpy_f32").unwrap()(&mut KernelCall::new(&args[..2], vec![Some(&mut out), Some(&mut y)], 0)).unwrap_err();
        assert!(e.contains("takes 3 arguments"), "{e}");
    }

    #[test]
    fn gemm_in_column_blocks_equals_gemm_whole_and_refuses_shapes_that_do_not_fit() {
        let (m, n, k) = (5, 6, 7);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        let mut whole = vec![0.0; m * n];
        gemm(&mut whole, &a, &b, Gemm { m, n, k, ldc: n, col0: 0 }).unwrap();
        assert!((whole[n + 2] - (0..k).map(|kk| a[k + kk] * b[kk * n + 2]).sum::<f64>()).abs() < 1e-12);
        let mut blocked = vec![f64::NAN; m * n];
        for (col0, w) in [(0, 2), (2, 3), (5, 1)] {
            let bb: Vec<f64> = (0..k).flat_map(|kk| b[kk * n + col0..kk * n + col0 + w].to_vec()).collect();
            gemm(&mut blocked, &a, &bb, Gemm { m, n: w, k, ldc: n, col0 }).unwrap();
        }
        assert_eq!(blocked, whole, "column blocks give the same bits");
        let e = gemm(&mut blocked, &a, &b, Gemm { m, n, k, ldc: n, col0: 1 }).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
    }
}
