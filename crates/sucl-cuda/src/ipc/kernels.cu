// sucl peer-memory ("ipc") collective kernels, compiled at run time by NVRTC.
//
// Every rank owns one peer buffer: a signal area (per-block flags that peers write, and this
// rank's per-block epoch counters) followed by a data area. Every rank maps every peer's buffer;
// `Args::peers[r]` is rank r's buffer as seen from here. A kernel copies its input into its own
// data area, meets its peers at a barrier and reads their data areas.
//
// The data area has two halves (`Args::half` bytes apart), used by alternate launches: every
// rank flips its parity word after each launch (the last block to finish does, counted by the
// done word), so all ranks use the same half for the same call, and graph replays alternate too.
// That replaces an end barrier: launch c + 2 writes the half that peers read in launch c only
// after this rank's launch c + 1 passed a barrier with them, and a peer's launch c + 1 runs only
// after its launch c finished (stream order). With END_BARRIER 1 the kernels meet at an end
// barrier as well (the older protocol, for comparison).
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
// Data moves in 16-byte slots: slot i of a row of `count` bytes is bytes [16i, 16i + 16) (the
// last one shorter). Data areas are 16-byte aligned, so peers' slots are read as whole vectors
// whatever the alignment of the caller's buffers; only the copies between the caller's buffers
// and the data areas look at that alignment (per slot, locally). The grid and the slot-to-block
// mapping therefore depend only on the byte count and the rank count, which every rank shares.
//
// The including module defines ELEM (storage type), ACC (accumulator), TO_ACC(x), FROM_ACC(x),
// RED(a, b) and FINAL(acc, n) for reducing kernels; copy kernels only move bytes.

// The module's prelude (kernels.rs, from plan.rs) defines the layout and shape constants, so that
// host and device agree by construction: MAX_RANKS, MAX_BLOCKS (flags per rank), DATA_OFFSET
// (bytes of the signal area), NRANKS (this communicator's ranks) and UNROLL (slots each thread
// moves per loop iteration: it issues all their loads before any store).
#if !defined(MAX_RANKS) || !defined(MAX_BLOCKS) || !defined(DATA_OFFSET) || !defined(NRANKS) || !defined(UNROLL)
#error "the prelude must define MAX_RANKS, MAX_BLOCKS, DATA_OFFSET, NRANKS and UNROLL"
#endif
#if NRANKS < 1 || NRANKS > MAX_RANKS || UNROLL < 1
#error "bad NRANKS or UNROLL"
#endif
#if !defined(END_BARRIER) || !defined(PUSH)
#error "the prelude must define END_BARRIER and PUSH"
#endif
#define EPOCH_WORD (MAX_BLOCKS * MAX_RANKS)
// This rank's blocks finished in the current launch, and the half the next launch uses (mirrored
// by plan::DONE_WORD / plan::PARITY_WORD).
#define DONE_WORD (EPOCH_WORD + MAX_BLOCKS)
#define PARITY_WORD (DONE_WORD + 1)
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
    long long count;      // bytes per row in this launch
    long long in_pitch;   // bytes between input rows (reduce_scatter)
    long long out_pitch;  // bytes between output rows (all_gather)
    long long chunk;      // two-shot: slots per rank's chunk
    long long timeout_ns;
    int rank;
    int nranks;
    int root;
    int reserved;
    long long half;       // bytes between the data area's two halves
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
    __shared__ u32 parity0;                                                        \
    if (threadIdx.x == 0) {                                                        \
        failed = 0;                                                                \
        epoch0 = signals(a.peers[a.rank])[EPOCH_WORD + blockIdx.x];                \
        parity0 = signals(a.peers[a.rank])[PARITY_WORD];                           \
    }                                                                              \
    __syncthreads();                                                               \
    u32 epoch = epoch0;                                                            \
    const long long half_off = parity0 ? a.half : 0;

// End of a kernel that passed all its barriers: keep the block's epoch for the next call; the
// last block to finish resets the done count and flips the parity. (Every block read the parity
// before it counted itself done, so all blocks of a launch use the same half; the next launch on
// the stream sees the flip.) With END_BARRIER, meet the peers once more first.
#if END_BARRIER
#define END_MEET BARRIER
#else
#define END_MEET
#endif
#define EPILOGUE                                                                   \
    END_MEET                                                                       \
    if (threadIdx.x == 0) {                                                        \
        u32* s = signals(a.peers[a.rank]);                                         \
        s[EPOCH_WORD + blockIdx.x] = epoch;                                        \
        if (atomicAdd(s + DONE_WORD, 1u) == gridDim.x - 1) {                       \
            s[DONE_WORD] = 0;                                                      \
            s[PARITY_WORD] ^= 1u;                                                  \
        }                                                                          \
    }

#define BARRIER                                                                    \
    if (!barrier(a, epoch, &failed)) return;

#define SLOT 16
#define SLOTS(bytes) (((bytes) + SLOT - 1) / SLOT)

// Rank r's data area, the half at byte offset `half_off` (0 or Args::half).
__device__ __forceinline__ const char* peer_data(const Args& a, int r, long long half_off) { return data_area(a.peers[r]) + half_off; }

// Bytes of slot i of a row of `len` bytes.
__device__ __forceinline__ int slot_bytes(long long i, long long len) {
    long long left = len - i * SLOT;
    return left >= SLOT ? SLOT : (int)left;
}

// Copies n <= 16 bytes with the widest accesses the addresses and n allow.
__device__ __forceinline__ void copy_bytes(char* dst, const char* src, int n) {
    unsigned a = (unsigned)((u64)dst | (u64)src) | (unsigned)n;
    if ((a & 15u) == 0) {
        if (n) *(uint4*)dst = *(const uint4*)src;
    } else if ((a & 7u) == 0) {
        for (int k = 0; k < n; k += 8) *(u64*)(dst + k) = *(const u64*)(src + k);
    } else if ((a & 3u) == 0) {
        for (int k = 0; k < n; k += 4) *(u32*)(dst + k) = *(const u32*)(src + k);
    } else if ((a & 1u) == 0) {
        for (int k = 0; k < n; k += 2) *(unsigned short*)(dst + k) = *(const unsigned short*)(src + k);
    } else {
        for (int k = 0; k < n; k++) dst[k] = src[k];
    }
}

// The grid-stride loop every phase uses, UNROLL slots per iteration: the thread with global
// index `first` handles slots lo + first + m·stride (m = 0, 1, ...) of [lo, hi), the same
// slots as a plain grid-stride loop, so every slot belongs to the same block in every phase.
#define THREAD_FIRST ((long long)blockIdx.x * blockDim.x + threadIdx.x)
#define GRID_STRIDE ((long long)gridDim.x * blockDim.x)

// Copies slots [lo, hi) of a row of `len` bytes from src to dst. With both rows 16-byte aligned,
// each thread loads its UNROLL slots as vectors before storing any (so that UNROLL remote loads
// are in flight at once); a short last slot, or misaligned rows, go through copy_bytes.
__device__ __forceinline__ void copy_slots(char* dst, const char* src, long long lo, long long hi, long long len) {
    const long long stride = GRID_STRIDE;
    const bool vec = (((u64)dst | (u64)src) & 15u) == 0;
    for (long long i = lo + THREAD_FIRST; i < hi; i += stride * UNROLL) {
        if (vec) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                long long j = i + u * stride;
                if (j < hi && slot_bytes(j, len) == SLOT) v[u] = *(const uint4*)(src + j * SLOT);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                long long j = i + u * stride;
                if (j < hi) {
                    int n = slot_bytes(j, len);
                    if (n == SLOT)
                        *(uint4*)(dst + j * SLOT) = v[u];
                    else
                        copy_bytes(dst + j * SLOT, src + j * SLOT, n);
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                long long j = i + u * stride;
                if (j < hi) copy_bytes(dst + j * SLOT, src + j * SLOT, slot_bytes(j, len));
            }
        }
    }
}

// ---- copy kernels (broadcast, all_gather): bytes of any element type ----
#ifdef IPC_COPY

// broadcast: the root's `count` bytes (its output, in place) go to every rank's output.
extern "C" __global__ void __launch_bounds__(512, 1) ipc_broadcast(Args a) {
    PROLOGUE
    const char* in = (const char*)a.input;
    char* out = (char*)a.output;
    char* mine = data_area(a.peers[a.rank]) + half_off;
    const long long slots = SLOTS(a.count);
    if (a.rank == a.root) copy_slots(mine, in, 0, slots, a.count);
    BARRIER
    if (a.rank != a.root) copy_slots(out, peer_data(a, a.root, half_off), 0, slots, a.count);
    EPILOGUE
}

// all_gather: `count` bytes from every rank k into row k (pitch `out_pitch` bytes) of the output.
extern "C" __global__ void __launch_bounds__(512, 1) ipc_all_gather(Args a) {
    PROLOGUE
    const char* in = (const char*)a.input;
    char* out = (char*)a.output;
    char* mine = data_area(a.peers[a.rank]) + half_off;
    const long long slots = SLOTS(a.count);
    copy_slots(mine, in, 0, slots, a.count);
    BARRIER
    for (int k = 0; k < a.nranks; k++) copy_slots(out + k * a.out_pitch, peer_data(a, k, half_off), 0, slots, a.count);
    EPILOGUE
}

#endif

// ---- reducing kernels: one dtype and reduce op per module ----
#ifdef ELEM

#define PER_SLOT (SLOT / (int)sizeof(ELEM))

// Slots per thread per iteration of the reducing loops: UNROLL, fewer where NRANKS × UNROLL
// vectors (4 registers each, all loaded before reducing) would pass 16.
#define RUNROLL (UNROLL * NRANKS <= 16 ? UNROLL : (16 / NRANKS > 0 ? 16 / NRANKS : 1))

union Pack {
    uint4 u;
    ELEM e[SLOT / sizeof(ELEM)];
};

// Reduces one slot loaded from every rank, in rank order (the same bits on every rank), and
// stores its first `n` bytes at `dst` (element-aligned).
__device__ __forceinline__ void reduce_store(const Args& a, const Pack (&v)[NRANKS], char* dst, int n) {
    ACC acc[PER_SLOT];
#pragma unroll
    for (int k = 0; k < PER_SLOT; k++) acc[k] = TO_ACC(v[0].e[k]);
#pragma unroll
    for (int r = 1; r < NRANKS; r++) {
#pragma unroll
        for (int k = 0; k < PER_SLOT; k++) acc[k] = RED(acc[k], TO_ACC(v[r].e[k]));
    }
    Pack out;
#pragma unroll
    for (int k = 0; k < PER_SLOT; k++) out.e[k] = FROM_ACC(FINAL(acc[k], a.nranks));
    if (n == SLOT && ((u64)dst & 15u) == 0) {
        *(uint4*)dst = out.u;
    } else {
#pragma unroll
        for (int k = 0; k < PER_SLOT; k++)
            if (k * (int)sizeof(ELEM) < n) ((ELEM*)dst)[k] = out.e[k];
    }
}

// Where rank r's row of a reduction lies: in rank r's data area at byte offset `base` (pull),
// or row r of this rank's own data area, `row` bytes apart (push).
struct PeerRows {
    const Args* a;
    long long base;
    __device__ __forceinline__ const char* operator()(int r) const { return peer_data(*a, r, 0) + base; }
};
struct LocalRows {
    const char* rows;
    long long row;
    __device__ __forceinline__ const char* operator()(int r) const { return rows + r * row; }
};

// Reduces slots [lo, hi) of every rank's row (src(r)) into dst (slot j at dst + 16j, its first
// slot_bytes(j, len) bytes). Each thread loads its RUNROLL slots from every rank before it
// reduces any.
template <typename Rows>
__device__ __forceinline__ void reduce_rows(const Args& a, Rows src, char* dst, long long lo, long long hi, long long len) {
    const long long stride = GRID_STRIDE;
    for (long long i = lo + THREAD_FIRST; i < hi; i += stride * RUNROLL) {
        Pack v[RUNROLL][NRANKS];
#pragma unroll
        for (int r = 0; r < NRANKS; r++) {
            const char* from = src(r);
#pragma unroll
            for (int u = 0; u < RUNROLL; u++) {
                long long j = i + u * stride;
                if (j < hi) v[u][r].u = *(const uint4*)(from + j * SLOT);
            }
        }
#pragma unroll
        for (int u = 0; u < RUNROLL; u++) {
            long long j = i + u * stride;
            if (j < hi) reduce_store(a, v[u], dst + j * SLOT, slot_bytes(j, len));
        }
    }
}

// Reduces slots [lo, hi) at byte offset `base` of every rank's data area into dst.
__device__ __forceinline__ void reduce_slots(const Args& a, long long base, char* dst, long long lo, long long hi, long long len) {
    reduce_rows(a, PeerRows{&a, base}, dst, lo, hi, len);
}

// Slot j of a row of `len` bytes at src as a vector: whole and aligned slots in one load, else
// byte-wise with the rest zero.
__device__ __forceinline__ uint4 load_slot(const char* src, long long j, long long len, bool vec) {
    const int n = slot_bytes(j, len);
    if (vec && n == SLOT) return *(const uint4*)(src + j * SLOT);
    uint4 t = make_uint4(0u, 0u, 0u, 0u);
    copy_bytes((char*)&t, src + j * SLOT, n);
    return t;
}

// One-shot push: slots [0, slots) of this rank's input row (`len` bytes) go to row `rank`
// (`row` bytes apart) of every rank's data area half. Each thread loads its UNROLL slots once
// and stores them to every rank.
__device__ __forceinline__ void push_rows(const Args& a, const char* src, long long half_off, long long row, long long slots, long long len) {
    const long long stride = GRID_STRIDE;
    const bool vec = ((u64)src & 15u) == 0;
    for (long long i = THREAD_FIRST; i < slots; i += stride * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            long long j = i + u * stride;
            if (j < slots) v[u] = load_slot(src, j, len, vec);
        }
#pragma unroll
        for (int k = 0; k < NRANKS; k++) {
            char* dst = data_area(a.peers[k]) + half_off + a.rank * row;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                long long j = i + u * stride;
                if (j < slots) *(uint4*)(dst + j * SLOT) = v[u];
            }
        }
    }
}

// Two-shot copies: for every rank k, slots [k·chunk, min(k·chunk + chunk, slots)) of a row of
// `len` bytes go from rank k's source to dst, where the source is `src` for every k (copy-in) or
// rank k's data area half (gather, `from_peers`). A thread takes the chunk offsets first +
// m·stride, the same slots as a grid-stride loop per chunk (so each slot keeps its block), RUNROLL
// offsets per iteration, and loads those slots of every chunk before it stores any (CUNROLL ×
// NRANKS vectors at most 8, past which registers spill). Misaligned rows go chunk by chunk
// through copy_slots.
#define CUNROLL (UNROLL * NRANKS <= 8 ? UNROLL : (8 / NRANKS > 0 ? 8 / NRANKS : 1))
__device__ __forceinline__ void copy_chunks(const Args& a, char* dst, const char* src, bool from_peers, long long half_off, long long slots, long long len) {
    const long long chunk = a.chunk;
    if ((((u64)dst | (from_peers ? 0ull : (u64)src)) & 15u) != 0) {
        for (int k = 0; k < NRANKS; k++)
            copy_slots(dst, from_peers ? peer_data(a, k, half_off) : src, k * chunk, min(k * chunk + chunk, slots), len);
        return;
    }
    const long long stride = GRID_STRIDE;
    for (long long o = THREAD_FIRST; o < chunk; o += stride * CUNROLL) {
        uint4 v[CUNROLL][NRANKS];
#pragma unroll
        for (int u = 0; u < CUNROLL; u++) {
#pragma unroll
            for (int k = 0; k < NRANKS; k++) {
                const long long off = o + u * stride, j = k * chunk + off;
                const char* from = from_peers ? peer_data(a, k, half_off) : src;
                if (off < chunk && j < slots && slot_bytes(j, len) == SLOT) v[u][k] = *(const uint4*)(from + j * SLOT);
            }
        }
#pragma unroll
        for (int u = 0; u < CUNROLL; u++) {
#pragma unroll
            for (int k = 0; k < NRANKS; k++) {
                const long long off = o + u * stride, j = k * chunk + off;
                if (off < chunk && j < slots) {
                    const int n = slot_bytes(j, len);
                    if (n == SLOT)
                        *(uint4*)(dst + j * SLOT) = v[u][k];
                    else
                        copy_bytes(dst + j * SLOT, (from_peers ? peer_data(a, k, half_off) : src) + j * SLOT, n);
                }
            }
        }
    }
}

// One-shot all_reduce of `count` bytes: every rank reads every rank's whole input.
extern "C" __global__ void __launch_bounds__(512, 1) ipc_one_shot(Args a) {
    PROLOGUE
    const char* in = (const char*)a.input;
    char* out = (char*)a.output;
    char* mine = data_area(a.peers[a.rank]) + half_off;
    const long long slots = SLOTS(a.count);
#if PUSH
    // Row r of this rank's data area (rows of whole slots) holds rank r's input.
    const long long row = slots * SLOT;
    push_rows(a, in, half_off, row, slots, a.count);
    BARRIER
    reduce_rows(a, LocalRows{mine, row}, out, 0, slots, a.count);
#else
    copy_slots(mine, in, 0, slots, a.count);
    BARRIER
    reduce_slots(a, half_off, out, 0, slots, a.count);
#endif
    EPILOGUE
}

// Two-shot all_reduce: rank r reduces its chunk (`chunk` slots) into its own data area, then
// every rank copies chunk k from rank k. Within chunk k, offset o always belongs to the same
// block, in every phase and on every rank.
extern "C" __global__ void __launch_bounds__(512, 1) ipc_two_shot(Args a) {
    PROLOGUE
    const char* in = (const char*)a.input;
    char* out = (char*)a.output;
    char* mine = data_area(a.peers[a.rank]) + half_off;
    const long long slots = SLOTS(a.count);
    copy_chunks(a, mine, in, false, half_off, slots, a.count);
    BARRIER
    // Whole slots: the data area holds the padded row (len = slots · 16, so no short slot).
    reduce_slots(a, half_off, mine, a.rank * a.chunk, min(a.rank * a.chunk + a.chunk, slots), slots * SLOT);
    BARRIER
    copy_chunks(a, out, nullptr, true, half_off, slots, a.count);
    EPILOGUE
}

// reduce_scatter: input rows k = 0..n-1 of `count` bytes (pitch `in_pitch` bytes), kept in the
// data area at a 16-byte-aligned stride; rank r gets the reduction of row r.
extern "C" __global__ void __launch_bounds__(512, 1) ipc_reduce_scatter(Args a) {
    PROLOGUE
    const char* in = (const char*)a.input;
    char* out = (char*)a.output;
    char* mine = data_area(a.peers[a.rank]) + half_off;
    const long long slots = SLOTS(a.count), row = slots * SLOT;
    for (int k = 0; k < a.nranks; k++) copy_slots(mine + k * row, in + k * a.in_pitch, 0, slots, a.count);
    BARRIER
    reduce_slots(a, half_off + a.rank * row, out, 0, slots, a.count);
    EPILOGUE
}

#endif
