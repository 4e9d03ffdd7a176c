// Halo: a 3-D 7-point stencil on an n × n × n grid split into slabs of planes, one per rank,
// periodic in every dimension; every step exchanges the boundary planes with both neighbours
// through sucl (sendrecv on USM device memory, ordered with the stencil kernels by events),
// then runs the stencil. The result is checked against a serial run on rank 0. The MPI variant
// is halo_mpi.cpp.
//
//     sucl run -n 4 -- ./halo --size 120 --steps 50
//
// Waits for each step before submitting the next (as the MPI variant must); --ahead submits them
// all at once. Prints the time per step (mean over the timed steps, max over ranks); exits 1 when the grid
// differs from the serial reference, 2 on an error.
#include "apps.hpp"

#include <sucl/sycl.hpp>

namespace s = ::sycl;
namespace ss = sucl::sycl;

namespace {

const char *kUsage = "halo: a 3-D 7-point stencil over slabs of planes, halos exchanged through sucl/sycl.hpp\n"
                     "(sendrecv on USM) every step, checked against a serial run.\n\n" SUCL_APP_OPTIONS SUCL_APP_AHEAD_OPTION
                     "\nexample: sucl run -n 4 -- ./halo --size 120 --steps 50\n";

// One step: both halo exchanges, then the stencil from `in` into `out`; returns the kernel's event.
s::event step(s::queue &q, ss::communicator &c, float *in, float *out, size_t nx, size_t n, s::event after) {
    const size_t plane = n * n;
    const int left = (c.rank() + c.size() - 1) % c.size(), right = (c.rank() + 1) % c.size();
    // First plane to the left, the right neighbour's first plane into the upper ghost; then the
    // last plane to the right, the left neighbour's last plane into the lower ghost.
    c.sendrecv(in + plane, plane, left, in + (nx + 1) * plane, plane, right, 1, nullptr, {after});
    s::event halos = c.sendrecv(in + nx * plane, plane, right, in, plane, left, 2);
    return q.submit([&](s::handler &h) {
        h.depends_on(halos);
        h.parallel_for(s::range<3>(nx, n, n), [=](s::id<3> i) {
            out[apps::at(i[0] + 1, i[1], i[2], n)] = apps::stencil(in, i[0] + 1, i[1], i[2], n);
        });
    });
}

int run(const apps::options &o) {
    s::queue q;
    ss::communicator c(q);
    const size_t n = o.n, P = size_t(c.size()), plane = n * n;
    if (n % P != 0) throw ss::error(SUCL_ERR_INVALID_ARGUMENT, "--size must be a multiple of the number of ranks");
    const size_t nx = n / P, x0 = nx * size_t(c.rank());
    float *a = s::malloc_device<float>((nx + 2) * plane, q), *b = s::malloc_device<float>((nx + 2) * plane, q);
    s::event e = q.parallel_for(s::range<3>(nx, n, n), [=](s::id<3> i) {
        a[apps::at(i[0] + 1, i[1], i[2], n)] = apps::initial(x0 + i[0], i[1], i[2]);
    });
    for (int k = 0; k < o.warmup; k++, std::swap(a, b)) e = step(q, c, a, b, nx, n, e);
    e.wait();
    c.barrier().wait();
    double t0 = apps::seconds();
    for (int k = 0; k < o.steps; k++, std::swap(a, b)) {
        e = step(q, c, a, b, nx, n, e);
        if (!o.ahead) e.wait();
    }
    e.wait();
    c.wait();
    double per_step = (apps::seconds() - t0) / o.steps, slowest = 0;
    ss::detail::check(sucl_all_reduce(c.handle(), &per_step, &slowest, 1, SUCL_FLOAT64, SUCL_MAX), "sucl_all_reduce");

    int64_t wrong = 0;
    if (o.check) {
        float *grid = c.rank() == 0 ? s::malloc_shared<float>(n * plane, q) : nullptr;
        c.gather(a + plane, grid, nx * plane, 0, {e});
        c.wait();
        if (c.rank() == 0) {
            wrong = apps::halo_wrong(std::vector<float>(grid, grid + n * plane), apps::halo_reference(n, o.warmup + o.steps));
            s::free(grid, q);
        }
        ss::detail::check(sucl_broadcast(c.handle(), &wrong, 1, SUCL_INT64, 0), "sucl_broadcast");
    }
    if (c.rank() == 0)
        std::printf("halo sucl%s: %zu ranks, %zu^3 floats, %d steps: %.3f ms/step, check %s\n", o.ahead ? " --ahead" : "", P, n, o.steps, slowest * 1e3,
                    !o.check ? "skipped" : wrong ? "WRONG" : "ok");
    s::free(a, q);
    s::free(b, q);
    return wrong ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
    apps::options o = apps::parse(argc, argv, kUsage, true);
    try {
        return run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "halo: %s\n", e.what());
        return 2;
    }
}
