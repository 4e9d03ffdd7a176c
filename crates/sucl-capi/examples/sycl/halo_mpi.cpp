// Halo with MPI, as SYCL programs exchange halos today: the boundary planes are copied from USM
// device memory into host buffers, exchanged with MPI_Sendrecv, and copied back before the
// stencil kernel. Same grid, stencil, check and output as halo.cpp (the sucl variant).
//
//     mpirun -np 4 ./halo_mpi --size 120 --steps 50
#include "apps.hpp"

#include <mpi.h>
#include <sycl/sycl.hpp>

#include <cstdint>
#include <stdexcept>

namespace s = ::sycl;

namespace {

const char *kUsage = "halo_mpi: the Halo stencil with halos exchanged by MPI_Sendrecv through host buffers,\n"
                     "checked against a serial run.\n\n" SUCL_APP_OPTIONS "\nexample: mpirun -np 4 ./halo_mpi --size 120 --steps 50\n";

void mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

struct halo_buffers {
    std::vector<float> lo_out, hi_out, lo_in, hi_in;
    explicit halo_buffers(size_t plane) : lo_out(plane), hi_out(plane), lo_in(plane), hi_in(plane) {}
};

s::event step(s::queue &q, int rank, int size, float *in, float *out, size_t nx, size_t n, halo_buffers &h, s::event after) {
    const size_t plane = n * n, bytes = plane * sizeof(float);
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    s::event lo = q.memcpy(h.lo_out.data(), in + plane, bytes, after);
    s::event hi = q.memcpy(h.hi_out.data(), in + nx * plane, bytes, after);
    lo.wait();
    hi.wait();
    mpi(MPI_Sendrecv(h.lo_out.data(), int(plane), MPI_FLOAT, left, 1, h.hi_in.data(), int(plane), MPI_FLOAT, right, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
    mpi(MPI_Sendrecv(h.hi_out.data(), int(plane), MPI_FLOAT, right, 2, h.lo_in.data(), int(plane), MPI_FLOAT, left, 2,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
    s::event up = q.memcpy(in + (nx + 1) * plane, h.hi_in.data(), bytes);
    s::event down = q.memcpy(in, h.lo_in.data(), bytes);
    return q.submit([&](s::handler &cg) {
        cg.depends_on({up, down});
        cg.parallel_for(s::range<3>(nx, n, n), [=](s::id<3> i) {
            out[apps::at(i[0] + 1, i[1], i[2], n)] = apps::stencil(in, i[0] + 1, i[1], i[2], n);
        });
    });
}

int run(const apps::options &o) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    s::queue q;
    const size_t n = o.n, P = size_t(size), plane = n * n;
    if (n % P != 0) throw std::runtime_error("--size must be a multiple of the number of ranks");
    const size_t nx = n / P, x0 = nx * size_t(rank);
    float *a = s::malloc_device<float>((nx + 2) * plane, q), *b = s::malloc_device<float>((nx + 2) * plane, q);
    halo_buffers h(plane);
    s::event e = q.parallel_for(s::range<3>(nx, n, n), [=](s::id<3> i) {
        a[apps::at(i[0] + 1, i[1], i[2], n)] = apps::initial(x0 + i[0], i[1], i[2]);
    });
    for (int k = 0; k < o.warmup; k++, std::swap(a, b)) e = step(q, rank, size, a, b, nx, n, h, e);
    e.wait();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = apps::seconds();
    for (int k = 0; k < o.steps; k++, std::swap(a, b)) e = step(q, rank, size, a, b, nx, n, h, e);
    e.wait();
    double per_step = (apps::seconds() - t0) / o.steps, slowest = 0;
    mpi(MPI_Allreduce(&per_step, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");

    int64_t wrong = 0;
    if (o.check) {
        std::vector<float> mine(nx * plane), grid(rank == 0 ? n * plane : 0);
        q.memcpy(mine.data(), a + plane, nx * plane * sizeof(float)).wait();
        mpi(MPI_Gather(mine.data(), int(nx * plane), MPI_FLOAT, grid.data(), int(nx * plane), MPI_FLOAT, 0, MPI_COMM_WORLD),
            "MPI_Gather");
        if (rank == 0) wrong = apps::halo_wrong(grid, apps::halo_reference(n, o.warmup + o.steps));
        mpi(MPI_Bcast(&wrong, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    }
    if (rank == 0)
        std::printf("halo mpi: %zu ranks, %zu^3 floats, %d steps: %.3f ms/step, check %s\n", P, n, o.steps, slowest * 1e3,
                    !o.check ? "skipped" : wrong ? "WRONG" : "ok");
    s::free(a, q);
    s::free(b, q);
    return wrong ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
    apps::options o = apps::parse(argc, argv, kUsage);
    MPI_Init(&argc, &argv);
    int rc = 2;
    try {
        rc = run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "halo_mpi: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Finalize();
    return rc;
}
