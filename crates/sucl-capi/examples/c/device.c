/*
 * sucl's C API on CUDA device pointers, ordered on a stream the program created itself.
 *
 * The CUDA driver is loaded at run time (dlopen of libcuda.so.1; the few prototypes are
 * declared here), so no CUDA toolkit is needed to build it. Each rank takes GPU rank % count,
 * makes a non-blocking stream, allocates device memory, fills it with cuMemcpyHtoD, enqueues
 * all_reduce (out of place, in place, int32 max), broadcast, reduce, all_gather (out of place
 * and in place, the latter from the all_reduce's result: stream order), reduce_scatter,
 * gather, scatter, all_to_all, all_gatherv, send/recv and sendrecv on that stream, then one
 * all_reduce on the legacy default stream (NULL), waits with sucl_synchronize_device, copies
 * back and checks every element against a serial reference. A host pointer given to a device
 * call must be refused. Prints "rank R: N wrong"; exits 0 only when N is 0 on this rank.
 *
 *     sucl run -n 2 -- ./device            (one GPU per rank: NCCL / peer memory)
 *     ./device --count 4099                (elements per rank per call; default 1048579)
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
} cu;

/* A CUDA driver call that must succeed. */
#define CU(call)                                                                \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != 0) {                                                          \
            fprintf(stderr, "rank %d: %s failed: CUresult %d\n", me, #call, r_); \
            exit(2);                                                            \
        }                                                                       \
    } while (0)

static void load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "rank %d: cannot load the CUDA driver: %s\n", me, dlerror());
        exit(2);
    }
    struct { void **slot; const char *name; } syms[] = {
        {(void **)&cu.Init, "cuInit"},
        {(void **)&cu.DeviceGetCount, "cuDeviceGetCount"},
        {(void **)&cu.DeviceGet, "cuDeviceGet"},
        {(void **)&cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu.CtxSetCurrent, "cuCtxSetCurrent"},
        {(void **)&cu.CtxSynchronize, "cuCtxSynchronize"},
        {(void **)&cu.StreamCreate, "cuStreamCreate"},
        {(void **)&cu.StreamDestroy, "cuStreamDestroy_v2"},
        {(void **)&cu.MemAlloc, "cuMemAlloc_v2"},
        {(void **)&cu.MemFree, "cuMemFree_v2"},
        {(void **)&cu.MemcpyHtoD, "cuMemcpyHtoD_v2"},
        {(void **)&cu.MemcpyDtoH, "cuMemcpyDtoH_v2"},
        {(void **)&cu.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            fprintf(stderr, "rank %d: libcuda.so.1 lacks %s\n", me, syms[i].name);
            exit(2);
        }
    }
}

static CUdeviceptr dev_alloc(size_t bytes) {
    CUdeviceptr p;
    CU(cu.MemAlloc(&p, bytes ? bytes : 1));
    return p;
}

/* The device address as the pointer sucl's C API takes. */
static void *dp(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* Rank r's input element i: small integers, exact in float sums. */
static float in_f(int r, size_t i) { return (float)((r * 7 + (int)(i % 13)) % 17); }
static int32_t in_i(int r, size_t i) { return (int32_t)((r * 31 + (int)(i % 101)) % 97) - 40; }

static int size = 0;

/* The serial references: element i over every rank. */
static float sum_f(size_t i) {
    float t = 0;
    for (int r = 0; r < size; r++) t += in_f(r, i);
    return t;
}

static float max_f(size_t i) {
    float t = in_f(0, i);
    for (int r = 1; r < size; r++) t = in_f(r, i) > t ? in_f(r, i) : t;
    return t;
}

/* Copies `n` floats back and counts the elements differing from `want(i)`. */
#define CHECK_F(what, dptr, n, want_expr)                                              \
    do {                                                                               \
        float *h_ = malloc((n) * sizeof(float) + 1);                                   \
        CU(cu.MemcpyDtoH(h_, (dptr), (n) * sizeof(float)));                            \
        for (size_t i = 0; i < (n); i++) {                                             \
            float w_ = (want_expr);                                                    \
            EXPECT(h_[i] == w_, "%s[%zu] = %g, want %g", (what), i, h_[i], w_);        \
        }                                                                              \
        free(h_);                                                                      \
    } while (0)

int main(int argc, char **argv) {
    size_t count = (1u << 20) + 3;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            printf("device: sucl's C API on CUDA device pointers and a user-created stream: every\n"
                   "collective, all_gatherv, send/recv and sendrecv, checked against a serial\n"
                   "reference; a host pointer must be refused. Needs one GPU per rank (rank %% GPUs)\n"
                   "and libcuda.so.1; no CUDA toolkit.\n\n"
                   "  --count N   elements per rank per call (default 1048579)\n\n"
                   "example: sucl run -n 2 -- ./device --count 4099\n");
            return 0;
        }
        if (!strcmp(argv[a], "--count") && a + 1 < argc) {
            count = strtoull(argv[++a], NULL, 10);
        } else {
            fprintf(stderr, "device: unknown argument %s (see --help)\n", argv[a]);
            return 2;
        }
    }
    sucl_comm comm;
    int rank;
    CHECK(sucl_init(&comm));
    CHECK(sucl_comm_rank(comm, &rank));
    CHECK(sucl_comm_size(comm, &size));
    me = rank;
    load_driver();
    int ngpu;
    CU(cu.Init(0));
    CU(cu.DeviceGetCount(&ngpu));
    if (ngpu == 0) {
        fprintf(stderr, "rank %d: no GPU\n", rank);
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CU(cu.DeviceGet(&dev, rank % ngpu));
    CU(cu.DevicePrimaryCtxRetain(&ctx, dev)); /* the context the CUDA runtime would use */
    CU(cu.CtxSetCurrent(ctx));
    CU(cu.StreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
    CHECK(sucl_comm_attach_device(comm, rank % ngpu));

    size_t n = count, big = count * (size_t)size, fb = n * sizeof(float), bigb = big * sizeof(float);
    float *h = malloc(bigb + 1);
    int32_t *hi = malloc(n * sizeof(int32_t) + 1);
    for (size_t i = 0; i < big; i++) h[i] = in_f(rank, i);
    for (size_t i = 0; i < n; i++) hi[i] = in_i(rank, i);

    CUdeviceptr x = dev_alloc(bigb), y = dev_alloc(fb), z = dev_alloc(fb), gath = dev_alloc(bigb), ip = dev_alloc(fb), ag = dev_alloc(bigb),
                ii = dev_alloc(n * sizeof(int32_t)), bc = dev_alloc(fb), red = dev_alloc(fb), rs = dev_alloc(fb),
                g = dev_alloc(bigb), sc = dev_alloc(fb), a2a = dev_alloc(bigb), agv = dev_alloc(bigb), p2p = dev_alloc(fb),
                ring = dev_alloc(fb), dflt = dev_alloc(fb);
    CU(cu.MemcpyHtoD(x, h, bigb)); /* x: size × n elements (reduce_scatter, scatter, all_to_all read them all) */
    CU(cu.MemcpyHtoD(ip, h, fb));
    CU(cu.MemcpyHtoD(bc, h, fb));
    CU(cu.MemcpyHtoD(ii, hi, n * sizeof(int32_t)));
    CU(cu.MemcpyHtoD(dflt, h, fb));
    CU(cu.CtxSynchronize()); /* the copies above ran on the legacy stream; ours does not wait for it */

    /* A host pointer is refused before anything moves. */
    sucl_result bad = sucl_all_reduce_device(comm, h, dp(y), n, SUCL_FLOAT32, SUCL_SUM, stream);
    EXPECT(bad == SUCL_ERR_INVALID_ARGUMENT && strstr(sucl_last_error(), "host memory"), "a host pointer gave %s: %s",
           sucl_result_name(bad), sucl_last_error());

    void *s = stream;
    CHECK(sucl_all_reduce_device(comm, dp(x), dp(y), n, SUCL_FLOAT32, SUCL_SUM, s));
    CHECK(sucl_all_reduce_device(comm, dp(ip), dp(ip), n, SUCL_FLOAT32, SUCL_MAX, s));
    CHECK(sucl_all_reduce_device(comm, dp(ii), dp(ii), n, SUCL_INT32, SUCL_MIN, s));
    CHECK(sucl_broadcast_device(comm, dp(bc), n, SUCL_FLOAT32, size - 1, s));
    CHECK(sucl_reduce_device(comm, dp(x), dp(red), n, SUCL_FLOAT32, SUCL_SUM, 0, s));
    CHECK(sucl_all_gather_device(comm, dp(x), dp(ag), n, SUCL_FLOAT32, s));
    /* In place, from the all_reduce's result copied into this rank's block: stream order alone
     * puts the copy after the all_reduce and the all_gather after the copy. */
    CU(cu.MemcpyDtoDAsync(gath + rank * fb, y, fb, stream));
    CHECK(sucl_all_gather_device(comm, dp(gath + rank * fb), dp(gath), n, SUCL_FLOAT32, s));
    CHECK(sucl_reduce_scatter_device(comm, dp(x), dp(rs), n, SUCL_FLOAT32, SUCL_SUM, s));
    CHECK(sucl_gather_device(comm, dp(x), dp(g), n, SUCL_FLOAT32, 0, s));
    CHECK(sucl_scatter_device(comm, dp(x), dp(sc), n, SUCL_FLOAT32, 0, s));
    CHECK(sucl_all_to_all_device(comm, dp(x), dp(a2a), n, SUCL_FLOAT32, s));
    /* all_gatherv: rank r gives n − r elements, packed in rank order. */
    size_t *vc = malloc(sizeof(size_t) * size), *vd = malloc(sizeof(size_t) * size), off = 0;
    for (int r = 0; r < size; r++) {
        vc[r] = n > (size_t)r ? n - r : 0;
        vd[r] = off;
        off += vc[r];
    }
    CHECK(sucl_all_gatherv_device(comm, dp(x), dp(agv), vc, vd, SUCL_FLOAT32, s));
    /* send/recv: even ranks send x to the next rank, which receives into p2p. */
    size_t got = 0;
    if (rank % 2 == 0 && rank + 1 < size) CHECK(sucl_send_device(comm, dp(x), n, SUCL_FLOAT32, rank + 1, 0, s));
    if (rank % 2 == 1) CHECK(sucl_recv_device(comm, dp(p2p), n, SUCL_FLOAT32, rank - 1, 0, &got, s));
    size_t ring_got = 0;
    CHECK(sucl_sendrecv_device(comm, dp(x), n, (rank + 1) % size, dp(ring), n, (rank + size - 1) % size, SUCL_FLOAT32, 0,
                               &ring_got, s));
    CHECK(sucl_synchronize_device(comm, s));
    /* The legacy default stream (NULL). */
    CHECK(sucl_all_reduce_device(comm, dp(dflt), dp(z), n, SUCL_FLOAT32, SUCL_SUM, NULL));
    CHECK(sucl_synchronize_device(comm, NULL));

    CHECK_F("all_reduce sum", y, n, sum_f(i));
    CHECK_F("all_reduce max in place", ip, n, max_f(i));
    {
        int32_t *hh = malloc(n * sizeof(int32_t) + 1);
        CU(cu.MemcpyDtoH(hh, ii, n * sizeof(int32_t)));
        for (size_t i = 0; i < n; i++) {
            int32_t w = in_i(0, i);
            for (int r = 1; r < size; r++) w = in_i(r, i) < w ? in_i(r, i) : w;
            EXPECT(hh[i] == w, "all_reduce int32 min[%zu] = %d, want %d", i, hh[i], w);
        }
        free(hh);
    }
    CHECK_F("broadcast", bc, n, in_f(size - 1, i));
    if (rank == 0) CHECK_F("reduce", red, n, sum_f(i));
    CHECK_F("all_gather", ag, big, in_f((int)(i / n), i % n));
    CHECK_F("all_gather in place of the all_reduce", gath, big, sum_f(i % n));
    CHECK_F("reduce_scatter", rs, n, sum_f(rank * n + i));
    if (rank == 0) CHECK_F("gather", g, big, in_f((int)(i / n), i % n));
    CHECK_F("scatter", sc, n, in_f(0, rank * n + i));
    CHECK_F("all_to_all", a2a, big, in_f((int)(i / n), rank * n + i % n));
    {
        size_t total = off;
        float *hv = malloc(total * sizeof(float) + 1);
        CU(cu.MemcpyDtoH(hv, agv, total * sizeof(float)));
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < vc[r]; i++)
                EXPECT(hv[vd[r] + i] == in_f(r, i), "all_gatherv[%d][%zu] = %g, want %g", r, i, hv[vd[r] + i], in_f(r, i));
        free(hv);
    }
    if (rank % 2 == 1) {
        EXPECT(got == n, "recv_device received %zu elements, want %zu", got, n);
        CHECK_F("recv", p2p, n, in_f(rank - 1, i));
    }
    EXPECT(ring_got == n, "sendrecv_device received %zu elements, want %zu", ring_got, n);
    CHECK_F("sendrecv ring", ring, n, in_f((rank + size - 1) % size, i));
    CHECK_F("all_reduce on the default stream", z, n, sum_f(i));

    CUdeviceptr all[] = {x, y, z, gath, ag, ip, ii, bc, red, rs, g, sc, a2a, agv, p2p, ring, dflt};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) CU(cu.MemFree(all[k]));
    CU(cu.StreamDestroy(stream));
    CHECK(sucl_comm_free(comm));
    free(h);
    free(hi);
    free(vc);
    free(vd);
    printf("rank %d: %ld wrong (%zu elements per rank per call, %d ranks)\n", rank, wrong, n, size);
    return wrong == 0 ? 0 : 1;
}
