/* Reference benchmark for sucl: the same operations, timed the same way (DESIGN.md "Measuring":
 * mean over timed iterations after warm-up, max over ranks), through the system MPI.
 * usage: mpi_ref OP MIN_BYTES MAX_BYTES ITERS WARMUP   (float32, sum) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double busfactor(const char *op, int n) {
    if (!strcmp(op, "all_reduce")) return 2.0 * (n - 1) / n;
    if (!strcmp(op, "all_gather") || !strcmp(op, "reduce_scatter") || !strcmp(op, "all_to_all") ||
        !strcmp(op, "gather") || !strcmp(op, "scatter")) return (double)(n - 1) / n;
    return 1.0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 6) {
        if (!rank) fprintf(stderr, "usage: %s OP MIN MAX ITERS WARMUP\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *op = argv[1];
    size_t min = strtoull(argv[2], 0, 10), max = strtoull(argv[3], 0, 10);
    int iters = atoi(argv[4]), warmup = atoi(argv[5]);
    float *s = malloc(max + 64), *r = malloc(max + 64);
    memset(s, 0, max + 64);
    memset(r, 0, max + 64);
    if (!rank) printf("# mpi_ref %s: %d ranks\n%12s %12s %12s %10s %10s\n", op, n, "bytes", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
    for (size_t bytes = min; bytes <= max; bytes *= 2) {
        size_t count = bytes / 4 ? bytes / 4 : 1;
        size_t blk = count / n ? count / n : 1;
        double t0 = 0;
        for (int it = -warmup; it < iters; it++) {
            if (it == 0) { MPI_Barrier(MPI_COMM_WORLD); t0 = MPI_Wtime(); }
            if (!strcmp(op, "all_reduce")) MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (!strcmp(op, "broadcast")) MPI_Bcast(s, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "reduce")) MPI_Reduce(s, r, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "all_gather")) MPI_Allgather(s, blk, MPI_FLOAT, r, blk, MPI_FLOAT, MPI_COMM_WORLD);
            else if (!strcmp(op, "gather")) MPI_Gather(s, blk, MPI_FLOAT, r, blk, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "scatter")) MPI_Scatter(s, blk, MPI_FLOAT, r, blk, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "all_to_all")) MPI_Alltoall(s, blk, MPI_FLOAT, r, blk, MPI_FLOAT, MPI_COMM_WORLD);
            else if (!strcmp(op, "reduce_scatter")) MPI_Reduce_scatter_block(s, r, blk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (!strcmp(op, "sendrecv")) MPI_Sendrecv(s, count, MPI_FLOAT, (rank + 1) % n, 1, r, count, MPI_FLOAT, (rank + n - 1) % n, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else if (!strcmp(op, "barrier")) MPI_Barrier(MPI_COMM_WORLD);
            else { if (!rank) fprintf(stderr, "unknown op %s\n", op); MPI_Abort(MPI_COMM_WORLD, 2); }
        }
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        size_t shown = (!strcmp(op, "all_gather") || !strcmp(op, "gather") || !strcmp(op, "scatter") ||
                        !strcmp(op, "all_to_all") || !strcmp(op, "reduce_scatter")) ? blk * n * 4 : count * 4;
        if (!rank) printf("%12zu %12zu %12.2f %10.3f %10.3f\n", shown, shown / 4, tmax * 1e6, shown / tmax / 1e9, shown / tmax / 1e9 * busfactor(op, n));
        if (!strcmp(op, "barrier")) break;
    }
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
