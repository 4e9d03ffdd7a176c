//! CUDA C for the peer-memory kernels (`kernels.cu`), specialized per element type and reduce
//! op by a short prelude, compiled by NVRTC for the device's architecture and cached.

use super::plan::{self, redop_name, Kind};
use sucl_core::{DType, ReduceOp};

/// The kernels' source (without a prelude).
pub const SOURCE: &str = include_str!("kernels.cu");

/// Which compiled module a kernel lives in: one for the copy kernels (any element type), one
/// per (element type, reduce op) for the reducing ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleKey {
    /// Broadcast and all_gather, moving bytes.
    Copy,
    /// all_reduce (one- and two-shot) and reduce_scatter of one type and op.
    Reduce(DType, ReduceOp),
}

impl ModuleKey {
    /// The module holding `kind`'s kernel for `dtype` and `redop`.
    pub fn of(kind: Kind, dtype: DType, redop: ReduceOp) -> ModuleKey {
        if kind.reduces() {
            ModuleKey::Reduce(dtype, redop)
        } else {
            ModuleKey::Copy
        }
    }
}

const F16: &str = r#"
#define ELEM unsigned short
#define ACC float
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#define TO_ACC(x) h2f(x)
#define FROM_ACC(x) f2h(x)
"#;

const BF16: &str = r#"
#define ELEM unsigned short
#define ACC float
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
    unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (unsigned short)(x >> 16);
}
#define TO_ACC(x) b2f(x)
#define FROM_ACC(x) f2b(x)
"#;

/// What every module of one communicator is compiled for besides its [`ModuleKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The communicator's ranks (the kernels' `NRANKS`: the reduce loops load exactly these).
    pub nranks: usize,
    /// Slots each thread moves per loop iteration (the kernels' `UNROLL`, one of [`plan::UNROLLS`]).
    pub unroll: usize,
    /// Whether the kernels meet their peers at an end barrier as well (`END_BARRIER`; the
    /// alternating halves make it unnecessary).
    pub end_barrier: bool,
    /// Whether one-shot all_reduce pushes each rank's input into its peers' data areas (`PUSH`).
    pub push: bool,
}

/// The layout and shape constants, from plan.rs, so that the kernels cannot disagree with the
/// host about the signal area.
fn constants(shape: Shape) -> String {
    format!(
        "#define MAX_RANKS {}\n#define MAX_BLOCKS {}\n#define DATA_OFFSET {}\n#define NRANKS {}\n#define UNROLL {}\n#define END_BARRIER {}\n#define PUSH {}\n",
        plan::MAX_RANKS,
        plan::MAX_BLOCKS,
        plan::SIGNAL_BYTES,
        shape.nranks,
        shape.unroll,
        shape.end_barrier as u8,
        shape.push as u8
    )
}

/// The prelude that specializes [`SOURCE`] for `key` (without the [`Shape`] constants).
pub fn prelude(key: ModuleKey) -> String {
    let (dtype, redop) = match key {
        ModuleKey::Copy => return "#define IPC_COPY 1\n".into(),
        ModuleKey::Reduce(d, r) => (d, r),
    };
    let mut s = match dtype {
        DType::F32 => "#define ELEM float\n#define ACC float\n#define TO_ACC(x) (x)\n#define FROM_ACC(x) (x)\n".to_string(),
        DType::F64 => "#define ELEM double\n#define ACC double\n#define TO_ACC(x) (x)\n#define FROM_ACC(x) (x)\n".to_string(),
        DType::F16 => F16.to_string(),
        DType::BF16 => BF16.to_string(),
        other => unreachable!("no peer-memory reduction for {other}: plan::supports refuses it"),
    };
    s += match redop {
        ReduceOp::Sum | ReduceOp::Avg => "#define RED(a, b) ((a) + (b))\n",
        ReduceOp::Prod => "#define RED(a, b) ((a) * (b))\n",
        ReduceOp::Min => "#define RED(a, b) ((b) < (a) ? (b) : (a))\n",
        ReduceOp::Max => "#define RED(a, b) ((b) > (a) ? (b) : (a))\n",
    };
    s += match redop {
        ReduceOp::Avg => "#define FINAL(acc, n) ((acc) / (ACC)(n))\n",
        _ => "#define FINAL(acc, n) (acc)\n",
    };
    s
}

/// The full source of `key`'s module for a communicator of `shape`.
pub fn source(key: ModuleKey, shape: Shape) -> String {
    let tag = match key {
        ModuleKey::Copy => "copy".to_string(),
        ModuleKey::Reduce(d, r) => format!("{d} {}", redop_name(r)),
    };
    format!("// sucl ipc kernels: {tag}, {} ranks, unroll {}\n{}{}{SOURCE}", shape.nranks, shape.unroll, constants(shape), prelude(key))
}

/// Whether NVRTC can be loaded (under the names cudarc tries for CUDA 12 and 13).
pub fn nvrtc_present() -> bool {
    ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"].iter().any(|l| crate::dl_present(l))
}

/// The NVRTC virtual architecture for a device of compute capability `major.minor`, or why the
/// kernels cannot run there (acquire/release at system scope needs compute capability 7.0).
pub fn arch(major: i32, minor: i32) -> Result<&'static str, String> {
    const ARCHS: [(i32, i32, &str); 10] = [
        (12, 0, "compute_120"),
        (10, 0, "compute_100"),
        (9, 0, "compute_90"),
        (8, 9, "compute_89"),
        (8, 7, "compute_87"),
        (8, 6, "compute_86"),
        (8, 0, "compute_80"),
        (7, 5, "compute_75"),
        (7, 2, "compute_72"),
        (7, 0, "compute_70"),
    ];
    ARCHS
        .iter()
        .find(|&&(ma, mi, _)| (major, minor) >= (ma, mi))
        .map(|&(_, _, a)| a)
        .ok_or_else(|| format!("compute capability {major}.{minor} is below 7.0 (no system-scope acquire/release)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module compiles with NVRTC where NVRTC can be loaded (the GPU machine; here with
    /// LD_LIBRARY_PATH naming a libnvrtc): the source is C++ that must build for each variant.
    /// Without NVRTC only the source's shape is checked, and `SUCL_REQUIRE_GPU=1` fails it.
    #[test]
    fn every_kernel_module_compiles_with_nvrtc() {
        let mut keys = vec![ModuleKey::Copy];
        for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for r in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg] {
                keys.push(ModuleKey::Reduce(d, r));
            }
        }
        let nvrtc = nvrtc_present();
        if !nvrtc {
            assert!(std::env::var("SUCL_REQUIRE_GPU").as_deref() != Ok("1"), "SUCL_REQUIRE_GPU=1 but NVRTC cannot be loaded");
            for k in keys {
                assert!(source(k, Shape { nranks: 2, unroll: 1, end_barrier: false, push: false }).contains("__global__"));
            }
            eprintln!("NVRTC not found: kernel sources not compiled");
            return;
        }
        // Every key at the default shape; the shapes' extremes for a sample of keys.
        let default = Shape { nranks: 2, unroll: crate::ipc::default_unroll(2), end_barrier: false, push: crate::ipc::DEFAULT_PUSH };
        let mut builds: Vec<(ModuleKey, Shape)> = keys.iter().map(|&k| (k, default)).collect();
        for (nranks, unroll, push) in [(1, 1, true), (3, 2, false), (2, 8, true), (8, 8, false), (4, 2, true), (8, 1, true)] {
            for k in [ModuleKey::Copy, ModuleKey::Reduce(DType::F16, ReduceOp::Avg), ModuleKey::Reduce(DType::F64, ReduceOp::Max)] {
                builds.push((k, Shape { nranks, unroll, end_barrier: unroll == 2, push }));
            }
        }
        for (k, shape) in builds {
            let opts = cudarc::nvrtc::CompileOptions { arch: Some("compute_90"), ..Default::default() };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(k, shape), opts).unwrap_or_else(|e| panic!("{k:?} {shape:?}: {e:?}"));
            let text = ptx.to_src();
            let kinds: &[Kind] = match k {
                ModuleKey::Copy => &[Kind::Broadcast, Kind::AllGather],
                _ => &[Kind::OneShot, Kind::TwoShot, Kind::ReduceScatter],
            };
            for &kind in kinds {
                assert!(text.contains(&format!(".entry {}(", kind.name())), "{k:?}: no kernel {}", kind.name());
            }
            assert!(text.contains("ld.acquire.sys") && text.contains("st.release.sys") && text.contains("%globaltimer"), "{k:?}");
        }
    }

    #[test]
    fn arch_follows_the_compute_capability() {
        assert_eq!(arch(9, 0), Ok("compute_90"));
        assert_eq!(arch(8, 6), Ok("compute_86"));
        assert_eq!(arch(10, 3), Ok("compute_100"));
        assert!(arch(6, 1).is_err());
    }
}
