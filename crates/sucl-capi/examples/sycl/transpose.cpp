// Transpose: a distributed 3-D transpose (B[y][x][z] = A[x][y][z]) of an n × n × n grid held in
// slabs of x-planes, one per rank, into slabs of y-planes: a pack kernel, sucl's all_to_all on
// sycl::buffers (ordered with the kernels by their accessors), an unpack kernel. The result is
// checked against a serial transpose. The MPI variant is transpose_mpi.cpp.
//
//     sucl run -n 4 -- ./transpose --size 120 --steps 50
//
// Waits for each transpose before submitting the next (as the MPI variant must); --ahead submits
// them all at once. Prints the time per transpose (mean over the timed ones, max over ranks); exits 1 when B
// differs from the serial transpose, 2 on an error.
#include "transpose_common.hpp"

#include <sucl/sycl.hpp>

namespace s = ::sycl;
namespace ss = sucl::sycl;

namespace {

const char *kUsage = "transpose: a distributed 3-D transpose by all-to-all through sucl/sycl.hpp on sycl::buffers,\n"
                     "checked against a serial transpose.\n\n" SUCL_APP_OPTIONS SUCL_APP_AHEAD_OPTION
                     "\nexample: sucl run -n 4 -- ./transpose --size 120 --steps 50\n";

int run(const apps::options &o) {
    s::queue q;
    ss::communicator c(q);
    const size_t n = o.n, P = size_t(c.size());
    if (n % P != 0) throw ss::error(SUCL_ERR_INVALID_ARGUMENT, "--size must be a multiple of the number of ranks");
    const size_t nx = n / P, slab = nx * n * n, block = nx * nx * n;
    s::buffer<float> a{s::range<1>(slab)}, send{s::range<1>(slab)}, recv{s::range<1>(slab)}, b{s::range<1>(slab)};
    transpose::fill(q, a, nx * size_t(c.rank()), nx, n);
    auto once = [&] {
        transpose::pack(q, a, send, P, nx, n);
        c.all_to_all(send, recv, block);
        transpose::unpack(q, recv, b, P, nx, n);
        if (!o.ahead) q.wait();
    };
    for (int k = 0; k < o.warmup; k++) once();
    q.wait();
    c.barrier().wait();
    double t0 = apps::seconds();
    for (int k = 0; k < o.steps; k++) once();
    q.wait();
    c.wait();
    double per_step = (apps::seconds() - t0) / o.steps, slowest = 0;
    ss::detail::check(sucl_all_reduce(c.handle(), &per_step, &slowest, 1, SUCL_FLOAT64, SUCL_MAX), "sucl_all_reduce");

    int64_t wrong = 0, total = 0;
    if (o.check) {
        s::host_accessor got(b, s::read_only);
        wrong = apps::transpose_wrong(std::vector<float>(got.begin(), got.end()), nx * size_t(c.rank()), nx, n);
        ss::detail::check(sucl_all_reduce(c.handle(), &wrong, &total, 1, SUCL_INT64, SUCL_SUM), "sucl_all_reduce");
    }
    if (c.rank() == 0)
        std::printf("transpose sucl%s: %zu ranks, %zu^3 floats, %d transposes: %.3f ms/transpose, check %s\n", o.ahead ? " --ahead" : "", P, n, o.steps,
                    slowest * 1e3, !o.check ? "skipped" : total ? "WRONG" : "ok");
    return total ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
    apps::options o = apps::parse(argc, argv, kUsage, true);
    try {
        return run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "transpose: %s\n", e.what());
        return 2;
    }
}
