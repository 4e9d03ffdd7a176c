/*
 * Every collective, v-collective and point-to-point call of sucl's C API on host memory, each
 * result checked against a serial reference computed here from the same formula every rank
 * uses to fill its input. Run it on several ranks:
 *
 *     sucl run -n 3 -- ./collectives
 *
 * or without a launcher, each process told its place (rank 0 listens at the address):
 *
 *     ./collectives --explicit RANK SIZE HOST:PORT
 *
 * Exits 0 when every result is right, 1 when some are wrong (listed on stderr), 2 when a call
 * fails.
 */
#include "check.h"
#include <stdint.h>
#include <string.h>
#include <time.h>

#define COUNT 5

/* The value rank `p` contributes at element `k`. */
static int64_t v(int p, int64_t k) { return (p + 1) * 100 + k; }

static void all_reduce(sucl_comm comm, int rank, int size) {
    double send[COUNT], recv[COUNT];
    for (int i = 0; i < COUNT; i++) send[i] = (double)v(rank, i);
    CHECK(sucl_all_reduce(comm, send, recv, COUNT, SUCL_FLOAT64, SUCL_SUM));
    for (int i = 0; i < COUNT; i++) {
        double want = 0;
        for (int p = 0; p < size; p++) want += (double)v(p, i);
        EXPECT(recv[i] == want, "all_reduce sum [%d] = %g, want %g", i, recv[i], want);
    }
    /* In place (same pointer), max over int32. */
    int32_t buf[COUNT];
    for (int i = 0; i < COUNT; i++) buf[i] = (int32_t)v(rank, i) * (rank % 2 ? -1 : 1);
    CHECK(sucl_all_reduce(comm, buf, buf, COUNT, SUCL_INT32, SUCL_MAX));
    for (int i = 0; i < COUNT; i++) {
        int32_t want = INT32_MIN;
        for (int p = 0; p < size; p++) {
            int32_t x = (int32_t)v(p, i) * (p % 2 ? -1 : 1);
            if (x > want) want = x;
        }
        EXPECT(buf[i] == want, "all_reduce in place max [%d] = %d, want %d", i, buf[i], want);
    }
}

/* The other two operators: prod over int64, avg over double. */
static void operators(sucl_comm comm, int rank, int size) {
    int64_t ps[COUNT], pr[COUNT];
    double as[COUNT], ar[COUNT];
    for (int i = 0; i < COUNT; i++) {
        ps[i] = rank + i + 2;
        as[i] = (double)v(rank, i);
    }
    CHECK(sucl_all_reduce(comm, ps, pr, COUNT, SUCL_INT64, SUCL_PROD));
    CHECK(sucl_all_reduce(comm, as, ar, COUNT, SUCL_FLOAT64, SUCL_AVG));
    for (int i = 0; i < COUNT; i++) {
        int64_t prod = 1;
        double sum = 0;
        for (int p = 0; p < size; p++) {
            prod *= p + i + 2;
            sum += (double)v(p, i);
        }
        EXPECT(pr[i] == prod, "all_reduce prod [%d] = %ld, want %ld", i, (long)pr[i], (long)prod);
        EXPECT(ar[i] == sum / size, "all_reduce avg [%d] = %g, want %g", i, ar[i], sum / size);
    }
}

/* all_reduce sum over every integer and 32/64-bit float dtype, with values that fit each. */
static void dtypes(sucl_comm comm, int rank, int size) {
#define SUM_OF(T, DT)                                                                    \
    do {                                                                                 \
        T s[COUNT], r[COUNT];                                                            \
        for (int i = 0; i < COUNT; i++) s[i] = (T)(rank + i + 1);                        \
        CHECK(sucl_all_reduce(comm, s, r, COUNT, DT, SUCL_SUM));                         \
        for (int i = 0; i < COUNT; i++) {                                                \
            T want = 0;                                                                  \
            for (int p = 0; p < size; p++) want = (T)(want + (T)(p + i + 1));            \
            EXPECT(r[i] == want, "all_reduce %s [%d] = %g, want %g", #DT, i, (double)r[i], \
                   (double)want);                                                        \
        }                                                                                \
    } while (0)
    SUM_OF(uint8_t, SUCL_UINT8);
    SUM_OF(int8_t, SUCL_INT8);
    SUM_OF(int32_t, SUCL_INT32);
    SUM_OF(uint32_t, SUCL_UINT32);
    SUM_OF(int64_t, SUCL_INT64);
    SUM_OF(uint64_t, SUCL_UINT64);
    SUM_OF(float, SUCL_FLOAT32);
    SUM_OF(double, SUCL_FLOAT64);
#undef SUM_OF
    /* 16-bit floats move as their bit patterns. */
    uint16_t half[COUNT], bf[COUNT];
    int root = size - 1;
    for (int i = 0; i < COUNT; i++) half[i] = bf[i] = (uint16_t)(rank == root ? 0x3c00 + i : 0);
    CHECK(sucl_broadcast(comm, half, COUNT, SUCL_FLOAT16, root));
    CHECK(sucl_broadcast(comm, bf, COUNT, SUCL_BFLOAT16, root));
    for (int i = 0; i < COUNT; i++) {
        EXPECT(half[i] == 0x3c00 + i, "broadcast f16 [%d] = %#x", i, half[i]);
        EXPECT(bf[i] == 0x3c00 + i, "broadcast bf16 [%d] = %#x", i, bf[i]);
    }
}

static void rooted(sucl_comm comm, int rank, int size) {
    int root = 1 % size;
    int64_t b[COUNT];
    for (int i = 0; i < COUNT; i++) b[i] = rank == root ? v(root, i) : -1;
    CHECK(sucl_broadcast(comm, b, COUNT, SUCL_INT64, root));
    for (int i = 0; i < COUNT; i++) EXPECT(b[i] == v(root, i), "broadcast [%d] = %ld", i, (long)b[i]);

    /* reduce min to root 0; non-roots pass NULL for recvbuf. */
    int64_t s[COUNT], r[COUNT];
    for (int i = 0; i < COUNT; i++) s[i] = v(rank, i) * ((rank + i) % 2 ? -1 : 1);
    CHECK(sucl_reduce(comm, s, rank == 0 ? r : NULL, COUNT, SUCL_INT64, SUCL_MIN, 0));
    if (rank == 0)
        for (int i = 0; i < COUNT; i++) {
            int64_t want = INT64_MAX;
            for (int p = 0; p < size; p++) {
                int64_t x = v(p, i) * ((p + i) % 2 ? -1 : 1);
                if (x < want) want = x;
            }
            EXPECT(r[i] == want, "reduce min [%d] = %ld, want %ld", i, (long)r[i], (long)want);
        }

    /* gather to the last rank. */
    int g_root = size - 1;
    int32_t gs[COUNT];
    int32_t *gr = malloc(sizeof(int32_t) * COUNT * size);
    for (int i = 0; i < COUNT; i++) gs[i] = (int32_t)v(rank, i);
    CHECK(sucl_gather(comm, gs, rank == g_root ? gr : NULL, COUNT, SUCL_INT32, g_root));
    if (rank == g_root)
        for (int p = 0; p < size; p++)
            for (int i = 0; i < COUNT; i++)
                EXPECT(gr[p * COUNT + i] == v(p, i), "gather [%d][%d] = %d", p, i, gr[p * COUNT + i]);

    /* scatter from rank 0. */
    int32_t ss[COUNT * 16], sr[COUNT];
    for (int j = 0; j < size; j++)
        for (int i = 0; i < COUNT; i++) ss[j * COUNT + i] = 1000 * j + i;
    CHECK(sucl_scatter(comm, rank == 0 ? ss : NULL, sr, COUNT, SUCL_INT32, 0));
    for (int i = 0; i < COUNT; i++) EXPECT(sr[i] == 1000 * rank + i, "scatter [%d] = %d", i, sr[i]);
    free(gr);
}

static void everyone(sucl_comm comm, int rank, int size) {
    int n = COUNT * size;
    float *ag = malloc(sizeof(float) * n), s[COUNT];
    for (int i = 0; i < COUNT; i++) s[i] = (float)v(rank, i);
    CHECK(sucl_all_gather(comm, s, ag, COUNT, SUCL_FLOAT32));
    for (int p = 0; p < size; p++)
        for (int i = 0; i < COUNT; i++)
            EXPECT(ag[p * COUNT + i] == (float)v(p, i), "all_gather [%d][%d] = %g", p, i, ag[p * COUNT + i]);
    /* In place: this rank's block already at its position. */
    for (int k = 0; k < n; k++) ag[k] = -1;
    for (int i = 0; i < COUNT; i++) ag[rank * COUNT + i] = (float)v(rank, i) + 0.5f;
    CHECK(sucl_all_gather(comm, ag + rank * COUNT, ag, COUNT, SUCL_FLOAT32));
    for (int p = 0; p < size; p++)
        for (int i = 0; i < COUNT; i++)
            EXPECT(ag[p * COUNT + i] == (float)v(p, i) + 0.5f, "all_gather in place [%d][%d] = %g", p, i,
                   ag[p * COUNT + i]);

    int64_t *as = malloc(sizeof(int64_t) * n), *ar = malloc(sizeof(int64_t) * n);
    for (int j = 0; j < size; j++)
        for (int i = 0; i < COUNT; i++) as[j * COUNT + i] = 10000 * rank + 100 * j + i;
    CHECK(sucl_all_to_all(comm, as, ar, COUNT, SUCL_INT64));
    for (int p = 0; p < size; p++)
        for (int i = 0; i < COUNT; i++)
            EXPECT(ar[p * COUNT + i] == 10000 * p + 100 * rank + i, "all_to_all [%d][%d] = %ld", p, i,
                   (long)ar[p * COUNT + i]);
    /* In place (same pointer). */
    CHECK(sucl_all_to_all(comm, as, as, COUNT, SUCL_INT64));
    for (int p = 0; p < size; p++)
        for (int i = 0; i < COUNT; i++)
            EXPECT(as[p * COUNT + i] == 10000 * p + 100 * rank + i, "all_to_all in place [%d][%d] = %ld", p, i,
                   (long)as[p * COUNT + i]);

    double *rs = malloc(sizeof(double) * n), rr[COUNT];
    for (int k = 0; k < n; k++) rs[k] = (double)v(rank, k);
    CHECK(sucl_reduce_scatter(comm, rs, rr, COUNT, SUCL_FLOAT64, SUCL_SUM));
    for (int i = 0; i < COUNT; i++) {
        double want = 0;
        for (int p = 0; p < size; p++) want += (double)v(p, rank * COUNT + i);
        EXPECT(rr[i] == want, "reduce_scatter [%d] = %g, want %g", i, rr[i], want);
    }
    CHECK(sucl_barrier(comm));
    free(ag);
    free(as);
    free(ar);
    free(rs);
}

/* counts[p] = p + 1, blocks one element apart (the gaps must stay untouched). */
static void vcoll(sucl_comm comm, int rank, int size) {
    size_t counts[16], displs[16], end = 0;
    for (int p = 0; p < size; p++) {
        counts[p] = (size_t)p + 1;
        displs[p] = end;
        end += counts[p] + 1;
    }
    int32_t send[16], *recv = malloc(sizeof(int32_t) * end);
    for (size_t i = 0; i < counts[rank]; i++) send[i] = 1000 * rank + (int32_t)i;

    for (size_t k = 0; k < end; k++) recv[k] = -7;
    CHECK(sucl_gatherv(comm, send, rank == 0 ? recv : NULL, counts, rank == 0 ? displs : NULL, SUCL_INT32, 0));
    if (rank == 0)
        for (int p = 0; p < size; p++) {
            for (size_t i = 0; i < counts[p]; i++)
                EXPECT(recv[displs[p] + i] == 1000 * p + (int32_t)i, "gatherv [%d][%zu] = %d", p, i, recv[displs[p] + i]);
            EXPECT(recv[displs[p] + counts[p]] == -7, "gatherv wrote the gap after block %d", p);
        }

    for (size_t k = 0; k < end; k++) recv[k] = -7;
    CHECK(sucl_all_gatherv(comm, send, recv, counts, displs, SUCL_INT32));
    for (int p = 0; p < size; p++) {
        for (size_t i = 0; i < counts[p]; i++)
            EXPECT(recv[displs[p] + i] == 1000 * p + (int32_t)i, "all_gatherv [%d][%zu] = %d", p, i, recv[displs[p] + i]);
        EXPECT(recv[displs[p] + counts[p]] == -7, "all_gatherv wrote the gap after block %d", p);
    }

    int root = 1 % size;
    int32_t mine[16];
    for (int p = 0; p < size; p++)
        for (size_t i = 0; i < counts[p]; i++) recv[displs[p] + i] = 1000 * p + (int32_t)i + 7;
    CHECK(sucl_scatterv(comm, rank == root ? recv : NULL, counts, rank == root ? displs : NULL, mine, SUCL_INT32, root));
    for (size_t i = 0; i < counts[rank]; i++) EXPECT(mine[i] == 1000 * rank + (int32_t)i + 7, "scatterv [%zu] = %d", i, mine[i]);

    /* all_to_allv: c[i][j] = (i + j) % 3 + 1 elements from i to j. */
    size_t *c = malloc(sizeof(size_t) * size * size), sd[16], rd[16], se = 0, re = 0;
    for (int i = 0; i < size; i++)
        for (int j = 0; j < size; j++) c[i * size + j] = (size_t)((i + j) % 3 + 1);
    for (int j = 0; j < size; j++) {
        sd[j] = se;
        se += c[rank * size + j];
        rd[j] = re;
        re += c[j * size + rank];
    }
    int64_t *as = malloc(sizeof(int64_t) * se), *ar = malloc(sizeof(int64_t) * re);
    for (int j = 0; j < size; j++)
        for (size_t k = 0; k < c[rank * size + j]; k++) as[sd[j] + k] = 10000 * rank + 100 * j + (int64_t)k;
    CHECK(sucl_all_to_allv(comm, as, sd, ar, rd, c, SUCL_INT64));
    for (int j = 0; j < size; j++)
        for (size_t k = 0; k < c[j * size + rank]; k++)
            EXPECT(ar[rd[j] + k] == 10000 * j + 100 * rank + (int64_t)k, "all_to_allv from %d [%zu] = %ld", j, k,
                   (long)ar[rd[j] + k]);
    free(recv);
    free(c);
    free(as);
    free(ar);
}

static void p2p(sucl_comm comm, int rank, int size) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int64_t out[COUNT], in[COUNT + 3];
    size_t got = 0;
    for (int i = 0; i < COUNT; i++) out[i] = v(rank, i);
    /* A ring of blocking calls: rank 0 sends first, everyone else receives first. */
    if (rank == 0) {
        CHECK(sucl_send(comm, out, COUNT, SUCL_INT64, right, 3));
        CHECK(sucl_recv(comm, in, COUNT + 3, SUCL_INT64, left, 3, &got));
    } else {
        CHECK(sucl_recv(comm, in, COUNT + 3, SUCL_INT64, left, 3, &got));
        CHECK(sucl_send(comm, out, COUNT, SUCL_INT64, right, 3));
    }
    EXPECT(got == COUNT, "recv count %zu", got);
    for (int i = 0; i < COUNT; i++) EXPECT(in[i] == v(left, i), "recv [%d] = %ld", i, (long)in[i]);

    memset(in, 0, sizeof in);
    CHECK(sucl_sendrecv(comm, out, COUNT, right, in, COUNT, left, SUCL_INT64, 4, &got));
    EXPECT(got == COUNT, "sendrecv count %zu", got);
    for (int i = 0; i < COUNT; i++) EXPECT(in[i] == v(left, i), "sendrecv [%d] = %ld", i, (long)in[i]);

    /* Non-blocking, the other way round; one completed by sucl_wait, one by polling sucl_test. */
    sucl_request rq, sq;
    memset(in, 0, sizeof in);
    CHECK(sucl_irecv(comm, in, COUNT, SUCL_INT64, right, 5, &rq));
    CHECK(sucl_isend(comm, out, COUNT, SUCL_INT64, left, 5, &sq));
    int done = 0;
    time_t t0 = time(NULL);
    while (!done && time(NULL) - t0 < 60) CHECK(sucl_test(rq, &done, &got));
    EXPECT(done, "irecv did not complete within 60 s");
    CHECK(sucl_wait(sq, NULL));
    EXPECT(got == COUNT, "irecv count %zu", got);
    for (int i = 0; i < COUNT; i++) EXPECT(in[i] == v(right, i), "irecv [%d] = %ld", i, (long)in[i]);
}

static void split(sucl_comm comm, int rank, int size) {
    /* Colour by parity, ordered by descending world rank; rank 0 joins none. */
    sucl_comm sub;
    CHECK(sucl_comm_split(comm, rank == 0 ? SUCL_UNDEFINED : rank % 2, -rank, &sub));
    if (rank == 0) {
        EXPECT(sub == SUCL_COMM_NULL, "rank 0 got a communicator");
        return;
    }
    int members = 0, above = 0, total = 0;
    for (int p = 1; p < size; p++)
        if (p % 2 == rank % 2) {
            members++;
            total += p;
            if (p > rank) above++;
        }
    int sr, ss;
    CHECK(sucl_comm_rank(sub, &sr));
    CHECK(sucl_comm_size(sub, &ss));
    EXPECT(ss == members && sr == above, "split: rank %d of %d, want %d of %d", sr, ss, above, members);
    int32_t x = rank, sum;
    CHECK(sucl_all_reduce(sub, &x, &sum, 1, SUCL_INT32, SUCL_SUM));
    EXPECT(sum == total, "split all_reduce = %d, want %d", sum, total);
    CHECK(sucl_comm_free(sub));
}

/* What a host-queue task saw, checked after the queue ran. */
static double seen_by_task = -1;
static sucl_buffer task_buf;

static void read_in_task(void *arg) {
    (void)arg;
    double x;
    if (sucl_buffer_read(task_buf, 0, &x, 1) == SUCL_OK) seen_by_task = x;
}

/* The other collectives a stream-triggered queue takes, and a PROC_NULL peer, in one batch. */
static void stream_collectives(sucl_stream st, int rank, int size) {
    int n = COUNT * size;
    sucl_buffer bc, ag_s, ag_r, rs_s, rs_r, aa_s, aa_r;
    CHECK(sucl_buffer_create(SUCL_INT64, COUNT, &bc));
    CHECK(sucl_buffer_create(SUCL_INT64, COUNT, &ag_s));
    CHECK(sucl_buffer_create(SUCL_INT64, n, &ag_r));
    CHECK(sucl_buffer_create(SUCL_INT64, n, &rs_s));
    CHECK(sucl_buffer_create(SUCL_INT64, COUNT, &rs_r));
    CHECK(sucl_buffer_create(SUCL_INT64, n, &aa_s));
    CHECK(sucl_buffer_create(SUCL_INT64, n, &aa_r));
    int64_t *tmp = malloc(sizeof(int64_t) * n);
    int root = size - 1;
    for (int i = 0; i < COUNT; i++) tmp[i] = rank == root ? v(root, i) : -1;
    CHECK(sucl_buffer_write(bc, 0, tmp, COUNT));
    for (int i = 0; i < COUNT; i++) tmp[i] = v(rank, i);
    CHECK(sucl_buffer_write(ag_s, 0, tmp, COUNT));
    for (int k = 0; k < n; k++) tmp[k] = v(rank, k);
    CHECK(sucl_buffer_write(rs_s, 0, tmp, n));
    for (int k = 0; k < n; k++) tmp[k] = 10000 * rank + 100 * (k / COUNT) + k % COUNT;
    CHECK(sucl_buffer_write(aa_s, 0, tmp, n));
    sucl_request r[5];
    CHECK(sucl_stream_broadcast(st, bc, root, &r[0]));
    CHECK(sucl_stream_all_gather(st, ag_s, ag_r, &r[1]));
    CHECK(sucl_stream_reduce_scatter(st, rs_s, rs_r, SUCL_SUM, &r[2]));
    CHECK(sucl_stream_all_to_all(st, aa_s, aa_r, &r[3]));
    CHECK(sucl_stream_send(st, bc, SUCL_PROC_NULL, 1, &r[4]));
    CHECK(sucl_stream_start(st));
    CHECK(sucl_stream_wait(st));
    CHECK(sucl_stream_synchronize(st));
    for (int k = 0; k < 5; k++) CHECK(sucl_wait(r[k], NULL));
    CHECK(sucl_buffer_read(bc, 0, tmp, COUNT));
    for (int i = 0; i < COUNT; i++) EXPECT(tmp[i] == v(root, i), "stream broadcast [%d] = %ld", i, (long)tmp[i]);
    CHECK(sucl_buffer_read(ag_r, 0, tmp, n));
    for (int k = 0; k < n; k++) EXPECT(tmp[k] == v(k / COUNT, k % COUNT), "stream all_gather [%d] = %ld", k, (long)tmp[k]);
    CHECK(sucl_buffer_read(rs_r, 0, tmp, COUNT));
    for (int i = 0; i < COUNT; i++) {
        int64_t want = 0;
        for (int p = 0; p < size; p++) want += v(p, rank * COUNT + i);
        EXPECT(tmp[i] == want, "stream reduce_scatter [%d] = %ld, want %ld", i, (long)tmp[i], (long)want);
    }
    CHECK(sucl_buffer_read(aa_r, 0, tmp, n));
    for (int k = 0; k < n; k++)
        EXPECT(tmp[k] == 10000 * (k / COUNT) + 100 * rank + k % COUNT, "stream all_to_all [%d] = %ld", k, (long)tmp[k]);
    sucl_buffer all[7] = {bc, ag_s, ag_r, rs_s, rs_r, aa_s, aa_r};
    for (int k = 0; k < 7; k++) CHECK(sucl_buffer_free(all[k]));
    free(tmp);
}

static void stream(sucl_comm comm, int rank, int size) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    sucl_host_queue q;
    sucl_stream st;
    sucl_buffer out, in, acc;
    CHECK(sucl_host_queue_create(&q));
    CHECK(sucl_buffer_create(SUCL_FLOAT64, COUNT, &out));
    CHECK(sucl_buffer_create(SUCL_FLOAT64, COUNT, &in));
    CHECK(sucl_buffer_create(SUCL_FLOAT64, COUNT, &acc));
    double vals[COUNT];
    for (int i = 0; i < COUNT; i++) vals[i] = (double)v(rank, i);
    CHECK(sucl_buffer_write(out, 0, vals, COUNT));
    CHECK(sucl_buffer_write(acc, 0, vals, COUNT));
    CHECK(sucl_stream_create(comm, q, &st));
    /* The communicator belongs to the queue now. */
    EXPECT(sucl_barrier(comm) == SUCL_ERR_BUSY, "a communicator bound to a queue answered a call");
    sucl_request r1, r2, r3;
    CHECK(sucl_stream_recv(st, in, left, 7, &r1));
    CHECK(sucl_stream_send(st, out, right, 7, &r2));
    CHECK(sucl_stream_all_reduce(st, acc, acc, SUCL_SUM, &r3));
    CHECK(sucl_stream_start(st));
    CHECK(sucl_stream_wait(st));
    task_buf = in;
    CHECK(sucl_host_queue_submit(q, read_in_task, NULL));
    CHECK(sucl_stream_synchronize(st));
    size_t got;
    CHECK(sucl_wait(r1, &got));
    CHECK(sucl_wait(r2, NULL));
    CHECK(sucl_wait(r3, NULL));
    EXPECT(got == COUNT, "stream recv count %zu", got);
    EXPECT(seen_by_task == (double)v(left, 0), "the task after the wait saw %g, want %g", seen_by_task, (double)v(left, 0));
    double res[COUNT];
    CHECK(sucl_buffer_read(in, 0, res, COUNT));
    for (int i = 0; i < COUNT; i++) EXPECT(res[i] == (double)v(left, i), "stream recv [%d] = %g", i, res[i]);
    CHECK(sucl_buffer_read(acc, 0, res, COUNT));
    for (int i = 0; i < COUNT; i++) {
        double want = 0;
        for (int p = 0; p < size; p++) want += (double)v(p, i);
        EXPECT(res[i] == want, "stream all_reduce [%d] = %g, want %g", i, res[i], want);
    }
    stream_collectives(st, rank, size);
    CHECK(sucl_stream_close(st));
    CHECK(sucl_barrier(comm)); /* the communicator is back */
    CHECK(sucl_buffer_free(out));
    CHECK(sucl_buffer_free(in));
    CHECK(sucl_buffer_free(acc));
    CHECK(sucl_host_queue_free(q));
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("collectives: runs every sucl collective, v-collective, point-to-point call and a\n"
               "stream-triggered queue through the C API on host memory and checks each result\n"
               "against a serial reference.\n\n"
               "usage: collectives                               (under a launcher: sucl run, torchrun, mpirun, srun)\n"
               "       collectives --explicit RANK SIZE HOST:PORT  (no launcher; rank 0 listens there)\n\n"
               "example: sucl run -n 3 -- ./collectives\n");
        return 0;
    }
    sucl_comm comm;
    if (argc == 5 && !strcmp(argv[1], "--explicit")) {
        int r = atoi(argv[2]);
        CHECK(sucl_init_explicit(r, atoi(argv[3]), r, argv[4], NULL, &comm));
    } else if (argc == 1) {
        CHECK(sucl_init(&comm));
    } else {
        fprintf(stderr, "collectives: unknown arguments (see --help)\n");
        return 2;
    }
    int rank, size;
    CHECK(sucl_comm_rank(comm, &rank));
    CHECK(sucl_comm_size(comm, &size));
    me = rank;
    if (size > 16) {
        fprintf(stderr, "at most 16 ranks\n");
        return 2;
    }
    all_reduce(comm, rank, size);
    dtypes(comm, rank, size);
    operators(comm, rank, size);
    rooted(comm, rank, size);
    everyone(comm, rank, size);
    vcoll(comm, rank, size);
    p2p(comm, rank, size);
    split(comm, rank, size);
    stream(comm, rank, size);
    CHECK(sucl_comm_free(comm));
    if (wrong) {
        fprintf(stderr, "rank %d: %ld wrong results\n", rank, wrong);
        return 1;
    }
    printf("rank %d of %d: every result right\n", rank, size);
    return 0;
}
