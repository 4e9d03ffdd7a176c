// Transpose with MPI, as SYCL programs do it today: the same pack and unpack kernels, and
// MPI_Alltoall on the buffers' host copies (sycl::host_accessor) between them. Same grid, check
// and output as transpose.cpp (the sucl variant).
//
//     mpirun -np 4 ./transpose_mpi --size 120 --steps 50
#include "transpose_common.hpp"

#include <mpi.h>

#include <cstdint>
#include <stdexcept>

namespace s = ::sycl;

namespace {

const char *kUsage = "transpose_mpi: the distributed 3-D transpose with MPI_Alltoall on host accessors,\n"
                     "checked against a serial transpose.\n\n" SUCL_APP_OPTIONS
                     "\nexample: mpirun -np 4 ./transpose_mpi --size 120 --steps 50\n";

void mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

int run(const apps::options &o) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    s::queue q;
    const size_t n = o.n, P = size_t(size);
    if (n % P != 0) throw std::runtime_error("--size must be a multiple of the number of ranks");
    const size_t nx = n / P, slab = nx * n * n, block = nx * nx * n;
    s::buffer<float> a{s::range<1>(slab)}, send{s::range<1>(slab)}, recv{s::range<1>(slab)}, b{s::range<1>(slab)};
    transpose::fill(q, a, nx * size_t(rank), nx, n);
    auto once = [&] {
        transpose::pack(q, a, send, P, nx, n);
        {
            s::host_accessor out(send, s::read_only);
            s::host_accessor in(recv, s::write_only);
            mpi(MPI_Alltoall(out.get_pointer(), int(block), MPI_FLOAT, in.get_pointer(), int(block), MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Alltoall");
        }
        transpose::unpack(q, recv, b, P, nx, n);
    };
    for (int k = 0; k < o.warmup; k++) once();
    q.wait();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = apps::seconds();
    for (int k = 0; k < o.steps; k++) once();
    q.wait();
    double per_step = (apps::seconds() - t0) / o.steps, slowest = 0;
    mpi(MPI_Allreduce(&per_step, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");

    int64_t wrong = 0, total = 0;
    if (o.check) {
        s::host_accessor got(b, s::read_only);
        wrong = apps::transpose_wrong(std::vector<float>(got.begin(), got.end()), nx * size_t(rank), nx, n);
        mpi(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
    if (rank == 0)
        std::printf("transpose mpi: %zu ranks, %zu^3 floats, %d transposes: %.3f ms/transpose, check %s\n", P, n, o.steps,
                    slowest * 1e3, !o.check ? "skipped" : total ? "WRONG" : "ok");
    return total ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
    apps::options o = apps::parse(argc, argv, kUsage);
    MPI_Init(&argc, &argv);
    int rc = 2;
    try {
        rc = run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "transpose_mpi: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Finalize();
    return rc;
}
