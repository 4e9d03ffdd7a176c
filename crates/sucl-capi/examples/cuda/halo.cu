// Halo in CUDA C++ over sucl's C ABI: the Halo of ../sycl/halo.cpp (a 3-D 7-point stencil on an
// n × n × n grid split into slabs of planes, one per rank, periodic in every dimension; every
// step exchanges the boundary planes with both neighbours, then runs the stencil) for programs
// that have CUDA but no SYCL implementation over CUDA. Each rank takes GPU rank % count, makes
// its own non-blocking stream and runs the stencil as a CUDA kernel on it. Two ways to exchange
// the halo planes:
//
//   --path device  sucl_sendrecv_device on the device pointers, enqueued on the stream after
//                  the kernel that wrote them (sucl serves it by NCCL, peer memory or staged);
//   --path host    what an MPI-style program does: copy the boundary planes to pinned host
//                  buffers, wait, sucl_sendrecv on host memory, copy the ghost planes back.
//
// The grid is gathered at the end and compared on rank 0 with the serial reference of
// ../sycl/apps.hpp: the kernel evaluates the stencil in the same order as apps::stencil, so the
// cells must agree to 1e-6 relative (they agree bit for bit where no compiler reorders).
// Prints the time per step (mean over the timed steps, max over ranks) in the line format of
// halo.cpp; exits 1 when the grid differs from the reference, 2 on a CUDA or sucl error.
//
//     nvcc -O2 -arch=sm_90 -I crates/sucl-capi/include halo.cu -o halo -L DIR -lsucl
//     sucl run -n 2 -- ./halo --size 120 --steps 50 --path device
#include "../sycl/apps.hpp"

#include <cuda_runtime.h>
#include <sucl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "halo (CUDA): a 3-D 7-point stencil over slabs of planes, one per rank, as CUDA kernels;\n"
    "halos exchanged through sucl's C API every step, checked against a serial run.\n\n" SUCL_APP_OPTIONS
    "  --ahead      enqueue every step at once (the stream orders them) instead of waiting for each\n"
    "               (--path device only)\n"
    "  --path P     device: sucl_sendrecv_device on device memory, ordered on the stream (default);\n"
    "               host: copy the planes to pinned host memory, sucl_sendrecv, copy them back\n"
    "\nexample: sucl run -n 2 -- ./halo --size 120 --steps 50 --path device\n";

int me = -1; // this rank, for messages

// A CUDA runtime call that must succeed; a failure ends the process with exit status 2.
#define CUDA(call)                                                                                             \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            std::fprintf(stderr, "halo: rank %d: %s failed: %s\n", me, #call, cudaGetErrorString(e_));         \
            std::exit(2);                                                                                      \
        }                                                                                                      \
    } while (0)

// A sucl call that must succeed; a failure prints sucl's message and ends with exit status 2.
#define SUCL(call)                                                                                             \
    do {                                                                                                       \
        sucl_result r_ = (call);                                                                               \
        if (r_ != SUCL_OK) {                                                                                   \
            std::fprintf(stderr, "halo: rank %d: %s failed: %s: %s\n", me, #call, sucl_result_name(r_),        \
                         sucl_last_error());                                                                   \
            std::exit(2);                                                                                      \
        }                                                                                                      \
    } while (0)

enum class path { device, host };

struct config {
    apps::options o;
    path p = path::device;
};

// Takes --path out of argv (apps::parse knows the rest: --size, --steps, --warmup, --no-check,
// --ahead, --help).
config parse(int argc, char **argv) {
    config c;
    std::vector<char *> rest{argv[0]};
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--path") != 0) {
            rest.push_back(argv[i]);
            continue;
        }
        std::string v = i + 1 < argc ? argv[++i] : "";
        if (v == "device") c.p = path::device;
        else if (v == "host") c.p = path::host;
        else {
            std::fprintf(stderr, "--path must be device or host, not '%s' (see --help)\n", v.c_str());
            std::exit(2);
        }
    }
    c.o = apps::parse(int(rest.size()), rest.data(), kUsage, true);
    if (c.o.ahead && c.p == path::host) {
        std::fprintf(stderr, "--ahead needs --path device: the host path waits for every step's planes\n");
        std::exit(2);
    }
    return c;
}

// apps::at for the device.
__device__ size_t cell(size_t x, size_t y, size_t z, size_t n) { return (x * n + y) * n + z; }

// apps::stencil for the device, term for term in the same order (float additions left to right,
// then one multiplication: nothing for the compiler to contract), so the results match the
// serial reference.
__device__ float stencil(const float *in, size_t x, size_t y, size_t z, size_t n) {
    size_t ym = (y + n - 1) % n, yp = (y + 1) % n, zm = (z + n - 1) % n, zp = (z + 1) % n;
    return (in[cell(x, y, z, n)] + in[cell(x - 1, y, z, n)] + in[cell(x + 1, y, z, n)] + in[cell(x, ym, z, n)] +
            in[cell(x, yp, z, n)] + in[cell(x, y, zm, n)] + in[cell(x, y, zp, n)]) *
           (1.0f / 7.0f);
}

// One thread per cell of the slab's nx interior planes (x = 1 … nx; planes 0 and nx + 1 are
// the ghosts).
__global__ void stencil_kernel(const float *in, float *out, size_t nx, size_t n) {
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nx * n * n) return;
    size_t z = i % n, y = i / n % n, x = i / (n * n) + 1;
    out[cell(x, y, z, n)] = stencil(in, x, y, z, n);
}

constexpr unsigned kBlock = 256;

// The per-rank state of the exchange: neighbours, the stream and (host path) pinned planes.
struct slab {
    sucl_comm c;
    cudaStream_t stream;
    size_t n, nx, plane;
    int left, right;
    float *send_lo = nullptr, *send_hi = nullptr, *recv_lo = nullptr, *recv_hi = nullptr; // pinned
};

// The halo planes of `in` over sucl's device calls, enqueued on the stream: the first plane to
// the left and the right neighbour's first plane into the upper ghost; then the last plane to
// the right and the left neighbour's last plane into the lower ghost (as halo.cpp).
void exchange_device(const slab &s, float *in) {
    const size_t p = s.plane;
    SUCL(sucl_sendrecv_device(s.c, in + p, p, s.left, in + (s.nx + 1) * p, p, s.right, SUCL_FLOAT32, 1, nullptr, s.stream));
    SUCL(sucl_sendrecv_device(s.c, in + s.nx * p, p, s.right, in, p, s.left, SUCL_FLOAT32, 2, nullptr, s.stream));
}

// The same exchange through pinned host memory: boundary planes down, wait, host sendrecv,
// ghost planes up (ordered before the kernel by the stream).
void exchange_host(const slab &s, float *in) {
    const size_t p = s.plane, bytes = p * sizeof(float);
    CUDA(cudaMemcpyAsync(s.send_lo, in + p, bytes, cudaMemcpyDeviceToHost, s.stream));
    CUDA(cudaMemcpyAsync(s.send_hi, in + s.nx * p, bytes, cudaMemcpyDeviceToHost, s.stream));
    CUDA(cudaStreamSynchronize(s.stream));
    SUCL(sucl_sendrecv(s.c, s.send_lo, p, s.left, s.recv_hi, p, s.right, SUCL_FLOAT32, 1, nullptr));
    SUCL(sucl_sendrecv(s.c, s.send_hi, p, s.right, s.recv_lo, p, s.left, SUCL_FLOAT32, 2, nullptr));
    CUDA(cudaMemcpyAsync(in + (s.nx + 1) * p, s.recv_hi, bytes, cudaMemcpyHostToDevice, s.stream));
    CUDA(cudaMemcpyAsync(in, s.recv_lo, bytes, cudaMemcpyHostToDevice, s.stream));
}

// One step: both halo exchanges, then the stencil from `in` into `out`, all on the stream.
void step(const slab &s, path p, float *in, float *out) {
    if (p == path::device) exchange_device(s, in);
    else exchange_host(s, in);
    const size_t cells = s.nx * s.plane;
    stencil_kernel<<<unsigned((cells + kBlock - 1) / kBlock), kBlock, 0, s.stream>>>(in, out, s.nx, s.n);
    CUDA(cudaGetLastError());
}

// Waits for the stream; on the device path through sucl, which also reports the errors of
// sucl's calls enqueued on it.
void wait(const slab &s, path p) {
    if (p == path::device) SUCL(sucl_synchronize_device(s.c, s.stream));
    else CUDA(cudaStreamSynchronize(s.stream));
}

// How many distinct GPUs the ranks drive (by UUID).
int gpus_in_use(sucl_comm c, int size, int device) {
    cudaDeviceProp prop;
    CUDA(cudaGetDeviceProperties(&prop, device));
    std::vector<char> all(size_t(size) * sizeof prop.uuid.bytes);
    SUCL(sucl_all_gather(c, prop.uuid.bytes, all.data(), sizeof prop.uuid.bytes, SUCL_INT8));
    std::vector<std::string> ids;
    for (int r = 0; r < size; r++) ids.emplace_back(&all[r * sizeof prop.uuid.bytes], sizeof prop.uuid.bytes);
    std::sort(ids.begin(), ids.end());
    return int(std::unique(ids.begin(), ids.end()) - ids.begin());
}

// Counts the cells of `got` differing from `want` by more than 1e-6 relative; `max_diff` gets
// the largest absolute difference.
long wrong_cells(const std::vector<float> &got, const std::vector<float> &want, double &max_diff) {
    long wrong = 0;
    max_diff = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double d = std::fabs(double(got[i]) - double(want[i]));
        max_diff = std::max(max_diff, d);
        if (!(d <= 1e-6 * (1.0 + std::fabs(double(want[i]))))) {
            if (wrong < 5) std::fprintf(stderr, "wrong: cell %zu = %.9g, want %.9g\n", i, double(got[i]), double(want[i]));
            wrong++;
        }
    }
    return wrong;
}

int run(const config &cfg) {
    const apps::options &o = cfg.o;
    slab s{};
    SUCL(sucl_init(&s.c));
    int32_t rank = 0, size = 0;
    SUCL(sucl_comm_rank(s.c, &rank));
    SUCL(sucl_comm_size(s.c, &size));
    me = rank;
    const size_t n = o.n, P = size_t(size), plane = n * n;
    if (n % P != 0) {
        if (rank == 0) std::fprintf(stderr, "halo: --size %zu is not a multiple of the %zu ranks\n", n, P);
        SUCL(sucl_comm_free(s.c));
        return 2;
    }
    s.n = n, s.nx = n / P, s.plane = plane;
    s.left = int((rank + size - 1) % size), s.right = int((rank + 1) % size);
    const size_t x0 = s.nx * size_t(rank), slab_floats = (s.nx + 2) * plane, bytes = slab_floats * sizeof(float);

    // One GPU per rank where there are enough (one host: the rank is the local rank), else shared.
    int count = 0;
    CUDA(cudaGetDeviceCount(&count));
    const int device = rank % count;
    CUDA(cudaSetDevice(device));
    CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    const int gpus = gpus_in_use(s.c, size, device);
    // The device side (NCCL, peer memory or staged) only for the device path: the host path is a
    // program that knows nothing of it.
    if (cfg.p == path::device) SUCL(sucl_comm_attach_device(s.c, device));
    else {
        CUDA(cudaMallocHost(&s.send_lo, plane * sizeof(float)));
        CUDA(cudaMallocHost(&s.send_hi, plane * sizeof(float)));
        CUDA(cudaMallocHost(&s.recv_lo, plane * sizeof(float)));
        CUDA(cudaMallocHost(&s.recv_hi, plane * sizeof(float)));
    }

    float *a = nullptr, *b = nullptr;
    CUDA(cudaMalloc(&a, bytes));
    CUDA(cudaMalloc(&b, bytes));
    {
        std::vector<float> init(slab_floats, 0.0f);
        for (size_t x = 0; x < s.nx; x++)
            for (size_t y = 0; y < n; y++)
                for (size_t z = 0; z < n; z++) init[apps::at(x + 1, y, z, n)] = apps::initial(x0 + x, y, z);
        CUDA(cudaMemcpyAsync(a, init.data(), bytes, cudaMemcpyHostToDevice, s.stream));
        CUDA(cudaMemsetAsync(b, 0, bytes, s.stream));
        CUDA(cudaStreamSynchronize(s.stream));
    }

    for (int k = 0; k < o.warmup; k++, std::swap(a, b)) step(s, cfg.p, a, b);
    wait(s, cfg.p);
    SUCL(sucl_barrier(s.c));
    double t0 = apps::seconds();
    for (int k = 0; k < o.steps; k++, std::swap(a, b)) {
        step(s, cfg.p, a, b);
        if (!o.ahead) wait(s, cfg.p);
    }
    wait(s, cfg.p);
    double per_step = (apps::seconds() - t0) / o.steps, slowest = 0;
    SUCL(sucl_all_reduce(s.c, &per_step, &slowest, 1, SUCL_FLOAT64, SUCL_MAX));

    int64_t wrong = 0;
    double max_diff = 0;
    if (o.check) {
        std::vector<float> mine(s.nx * plane), grid(rank == 0 ? n * plane : 0);
        CUDA(cudaMemcpy(mine.data(), a + plane, mine.size() * sizeof(float), cudaMemcpyDeviceToHost));
        SUCL(sucl_gather(s.c, mine.data(), rank == 0 ? grid.data() : nullptr, mine.size(), SUCL_FLOAT32, 0));
        if (rank == 0) wrong = wrong_cells(grid, apps::halo_reference(n, o.warmup + o.steps), max_diff);
        SUCL(sucl_broadcast(s.c, &wrong, 1, SUCL_INT64, 0));
    }
    if (rank == 0) {
        char diff[64] = "";
        if (o.check) std::snprintf(diff, sizeof diff, " (max |diff| %.3g)", max_diff);
        std::printf("halo cuda --path %s%s: %zu ranks on %d GPU%s, %zu^3 floats, %d steps: %.3f ms/step, check %s%s\n",
                    cfg.p == path::device ? "device" : "host", o.ahead ? " --ahead" : "", P, gpus, gpus == 1 ? "" : "s", n,
                    o.steps, slowest * 1e3, !o.check ? "skipped" : wrong ? "WRONG" : "ok", diff);
        std::fflush(stdout);
    }
    CUDA(cudaFree(a));
    CUDA(cudaFree(b));
    for (float *h : {s.send_lo, s.send_hi, s.recv_lo, s.recv_hi})
        if (h) CUDA(cudaFreeHost(h));
    CUDA(cudaStreamDestroy(s.stream));
    SUCL(sucl_comm_free(s.c));
    return wrong ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) { return run(parse(argc, argv)); }
