// sucl peer-memory ("ipc") collective kernels, compiled at run time by NVRTC.
//
// Every rank owns one peer buffer: a signal area (per-block flags that peers write, and this
// rank's per-block epoch counters) followed by a data area. Every rank maps every peer's buffer;
// `Args::peers[r]` is rank r's buffer as seen from here. A kernel copies its input into its own
// data area, meets its peers at a barrier, reads their data areas, and meets them again at an
// end barrier before it returns, so that the next call may overwrite the data area.
//
// Barriers are per block: block b of every rank stores its epoch into flag [b][me] of every peer
// (st.release.sys) and spins on its own flags [b][*] (ld.acquire.sys) until each reached the
// epoch. Epochs only grow (compared with wrap-around), so a peer one barrier ahead does no harm.
// All ranks launch the same grid for the same call and every phase maps an element to the same
// block, so matching blocks order every cross-rank read after the write it depends on.
//
// No wait is unbounded: every 1024 polls a spinning thread checks %globaltimer against the
// timeout, a host-written abort word and the status word; on expiry it writes the status word
// (host-mapped: the host reads it at synchronization) and the block returns. No __trap: the
// context stays usable.
//
// The including module defines ELEM (storage type), ACC (accumulator), TO_ACC(x), FROM_ACC(x),
// RED(a, b) and FINAL(acc, n) for reducing kernels; copy kernels only move bytes.

#define MAX_RANKS 8
#define MAX_BLOCKS 32
#define EPOCH_WORD (MAX_BLOCKS * MAX_RANKS)
#define DATA_OFFSET 4096
#define ERR_TIMEOUT 1u
#define ERR_ABORT 2u

typedef unsigned int u32;
typedef unsigned long long u64;

struct Args {
    u64 peers[MAX_RANKS];
    u64 status;
    u64 abort_word;
    u64 input;
    u64 output;
    long long count;
    long long in_pitch;
    long long out_pitch;
    long long chunk;
    long long timeout_ns;
    int rank;
    int nranks;
    int root;
    int reserved;
};

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Whether flag value v has reached epoch e (wrap-around safe; mirrored by plan::reached).
__device__ __forceinline__ bool reached(u32 v, u32 e) { return (int)(v - e) >= 0; }

__device__ __forceinline__ u32* signals(u64 base) { return (u32*)base; }
__device__ __forceinline__ char* data_area(u64 base) { return (char*)(base + DATA_OFFSET); }

__device__ void fail(const Args& a, u32 code, int peer) {
    volatile u32* s = (volatile u32*)a.status;
    if (*s == 0) *s = (code << 24) | ((u32)peer << 16) | (u32)blockIdx.x;
    __threadfence_system();
}

// The block's barrier with every rank; false when it gave up (the status word says why).
__device__ bool barrier(const Args& a, u32& epoch, int* failed) {
    epoch++;
    __syncthreads();
    int t = threadIdx.x;
    if (t < a.nranks) {
        // The release store orders every write of the block before it (the CTA barrier above
        // makes them visible to this thread; release is cumulative) at system scope.
        st_release(signals(a.peers[t]) + blockIdx.x * MAX_RANKS + a.rank, epoch);
        const u32* mine = signals(a.peers[a.rank]) + blockIdx.x * MAX_RANKS + t;
        u64 start = 0;
        u32 polls = 0;
        while (!reached(ld_acquire(mine), epoch)) {
            if ((++polls & 1023u) == 0) {
                u64 now = now_ns();
                if (start == 0) {
                    start = now;
                } else if ((long long)(now - start) > a.timeout_ns) {
                    fail(a, ERR_TIMEOUT, t);
                    *failed = 1;
                    break;
                }
                if (*(volatile u32*)a.abort_word != 0) {
                    fail(a, ERR_ABORT, t);
                    *failed = 1;
                    break;
                }
                if (*(volatile u32*)a.status != 0) {
                    *failed = 1;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return *(volatile int*)failed == 0;
}

// Start of every kernel: load the block's epoch. (A kernel queued after a failed one does not
// read the host-mapped status word here, which would cost a PCIe round trip per call: its
// first barrier sees the status word within 1024 polls and gives up.)
#define PROLOGUE                                                                   \
    __shared__ int failed;                                                         \
    __shared__ u32 epoch0;                                                         \
    if (threadIdx.x == 0) {                                                        \
        failed = 0;                                                                \
        epoch0 = signals(a.peers[a.rank])[EPOCH_WORD + blockIdx.x];                \
    }                                                                              \
    __syncthreads();                                                               \
    u32 epoch = epoch0;                                                            \
    const long long stride = (long long)gridDim.x * blockDim.x;                    \
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;

// End of a kernel that passed all its barriers: keep the block's epoch for the next call.
#define EPILOGUE                                                                   \
    if (threadIdx.x == 0) signals(a.peers[a.rank])[EPOCH_WORD + blockIdx.x] = epoch;

#define BARRIER                                                                    \
    if (!barrier(a, epoch, &failed)) return;

template <typename U>
__device__ __forceinline__ const U* peer_data(const Args& a, int r) {
    return (const U*)data_area(a.peers[r]);
}

// ---- copy kernels (broadcast, all_gather), any element type: U is the unit moved ----

// broadcast: the root's input goes to every rank's output (`count` units).
template <typename U>
__device__ void broadcast_body(const Args& a) {
    PROLOGUE
    const U* in = (const U*)a.input;
    U* out = (U*)a.output;
    U* mine = (U*)data_area(a.peers[a.rank]);
    if (a.rank == a.root)
        for (long long i = first; i < a.count; i += stride) mine[i] = in[i];
    BARRIER
    if (a.rank != a.root) {
        const U* src = peer_data<U>(a, a.root);
        for (long long i = first; i < a.count; i += stride) out[i] = src[i];
    } else if (in != out) {
        for (long long i = first; i < a.count; i += stride) out[i] = in[i];
    }
    BARRIER
    EPILOGUE
}

// all_gather: `count` units from every rank into row r (pitch `out_pitch` units) of the output.
template <typename U>
__device__ void all_gather_body(const Args& a) {
    PROLOGUE
    const U* in = (const U*)a.input;
    U* out = (U*)a.output;
    U* mine = (U*)data_area(a.peers[a.rank]);
    for (long long i = first; i < a.count; i += stride) mine[i] = in[i];
    BARRIER
    for (int k = 0; k < a.nranks; k++) {
        const U* src = peer_data<U>(a, k);
        U* row = out + k * a.out_pitch;
        for (long long i = first; i < a.count; i += stride) row[i] = src[i];
    }
    BARRIER
    EPILOGUE
}

#define COPY_KERNELS(SUFFIX, U)                                                                    \
    extern "C" __global__ void __launch_bounds__(512) ipc_broadcast_##SUFFIX(Args a) { broadcast_body<U>(a); } \
    extern "C" __global__ void __launch_bounds__(512) ipc_all_gather_##SUFFIX(Args a) { all_gather_body<U>(a); }

#ifdef IPC_COPY
COPY_KERNELS(16, uint4)
COPY_KERNELS(8, unsigned long long)
COPY_KERNELS(4, unsigned int)
COPY_KERNELS(2, unsigned short)
COPY_KERNELS(1, unsigned char)
#endif

// ---- reducing kernels: one dtype and reduce op per module ----
#ifdef ELEM

template <typename U>
union Pack {
    U u;
    ELEM e[sizeof(U) / sizeof(ELEM)];
};

// Unit `idx` of every rank's data area, reduced in rank order (the same bits on every rank).
template <typename U>
__device__ __forceinline__ U reduce_unit(const Args& a, long long idx) {
    constexpr int N = sizeof(U) / sizeof(ELEM);
    Pack<U> v[MAX_RANKS];
#pragma unroll
    for (int r = 0; r < MAX_RANKS; r++)
        if (r < a.nranks) v[r].u = peer_data<U>(a, r)[idx];
    ACC acc[N];
#pragma unroll
    for (int k = 0; k < N; k++) acc[k] = TO_ACC(v[0].e[k]);
#pragma unroll
    for (int r = 1; r < MAX_RANKS; r++)
        if (r < a.nranks) {
#pragma unroll
            for (int k = 0; k < N; k++) acc[k] = RED(acc[k], TO_ACC(v[r].e[k]));
        }
    Pack<U> out;
#pragma unroll
    for (int k = 0; k < N; k++) out.e[k] = FROM_ACC(FINAL(acc[k], a.nranks));
    return out.u;
}

// One-shot all_reduce: every rank reads every rank's whole input.
template <typename U>
__device__ void one_shot_body(const Args& a) {
    PROLOGUE
    const U* in = (const U*)a.input;
    U* out = (U*)a.output;
    U* mine = (U*)data_area(a.peers[a.rank]);
    for (long long i = first; i < a.count; i += stride) mine[i] = in[i];
    BARRIER
    for (long long i = first; i < a.count; i += stride) out[i] = reduce_unit<U>(a, i);
    BARRIER
    EPILOGUE
}

// Two-shot all_reduce: rank r reduces chunk r (`chunk` units) in its own data area, then every
// rank reads chunk k from rank k. Within chunk k, offset o always belongs to the same block.
template <typename U>
__device__ void two_shot_body(const Args& a) {
    PROLOGUE
    const U* in = (const U*)a.input;
    U* out = (U*)a.output;
    U* mine = (U*)data_area(a.peers[a.rank]);
    for (int k = 0; k < a.nranks; k++) {
        long long lo = k * a.chunk, hi = min(lo + a.chunk, a.count);
        for (long long o = first; lo + o < hi; o += stride) mine[lo + o] = in[lo + o];
    }
    BARRIER
    {
        long long lo = a.rank * a.chunk, hi = min(lo + a.chunk, a.count);
        for (long long o = first; lo + o < hi; o += stride) mine[lo + o] = reduce_unit<U>(a, lo + o);
    }
    BARRIER
    for (int k = 0; k < a.nranks; k++) {
        long long lo = k * a.chunk, hi = min(lo + a.chunk, a.count);
        const U* src = peer_data<U>(a, k);
        for (long long o = first; lo + o < hi; o += stride) out[lo + o] = src[lo + o];
    }
    BARRIER
    EPILOGUE
}

// reduce_scatter: input rows k = 0..n-1 of `count` units (pitch `in_pitch`); rank r gets the
// reduction of row r.
template <typename U>
__device__ void reduce_scatter_body(const Args& a) {
    PROLOGUE
    const U* in = (const U*)a.input;
    U* out = (U*)a.output;
    U* mine = (U*)data_area(a.peers[a.rank]);
    for (int k = 0; k < a.nranks; k++)
        for (long long i = first; i < a.count; i += stride) mine[k * a.count + i] = in[k * a.in_pitch + i];
    BARRIER
    for (long long i = first; i < a.count; i += stride) out[i] = reduce_unit<U>(a, a.rank * a.count + i);
    BARRIER
    EPILOGUE
}

#define REDUCE_KERNELS(SUFFIX, U)                                                                   \
    extern "C" __global__ void __launch_bounds__(512) ipc_one_shot_##SUFFIX(Args a) { one_shot_body<U>(a); } \
    extern "C" __global__ void __launch_bounds__(512) ipc_two_shot_##SUFFIX(Args a) { two_shot_body<U>(a); } \
    extern "C" __global__ void __launch_bounds__(512) ipc_reduce_scatter_##SUFFIX(Args a) { reduce_scatter_body<U>(a); }

REDUCE_KERNELS(v, uint4)
REDUCE_KERNELS(s, ELEM)

#endif
