/*
 * Several threads on one communicator: every call returns SUCL_OK or SUCL_ERR_BUSY (the
 * communicator is in use on another thread), never a wrong result, a write into a refused
 * call's buffers, or a hang. Each of THREADS threads completes ROUNDS rounds, retrying what is
 * refused as busy: an all_reduce (every rank gives rank + 1; the sum is checked) and a ring
 * exchange posted with sucl_isend/sucl_irecv and polled with sucl_test (tags name the thread
 * and round, so each message has one receiver). The collectives are all alike: ranks pair
 * collectives in the order they run, and which thread's call runs first on a rank is not
 * determined, so threads that called different collectives would disagree (a Mismatch). Every result is checked against a reference;
 * a refused call's output must still hold its sentinel. Run on 2 or more ranks:
 *
 *     sucl run -n 3 -- ./threads
 *
 * Exits 0 when every check holds, 1 otherwise; a retry loop running past 120 s is a hang and
 * fails too.
 */
#define _POSIX_C_SOURCE 200809L
#include "../../examples/c/check.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define THREADS 4
#define ROUNDS 40
#define N 16
#define SENTINEL (-77)

static sucl_comm comm;
static int32_t rank, size;
static atomic_long busy_seen, ok_calls, failures;
static pthread_mutex_t report = PTHREAD_MUTEX_INITIALIZER;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fail(int thread, const char *what, sucl_result rc) {
    pthread_mutex_lock(&report);
    fprintf(stderr, "rank %d thread %d: %s: %s: %s\n", rank, thread, what, sucl_result_name(rc), sucl_last_error());
    pthread_mutex_unlock(&report);
    atomic_fetch_add(&failures, 1);
}

/* Whether every element of `v` is `want`. */
static int all_equal(const int64_t *v, int64_t want) {
    for (int i = 0; i < N; i++)
        if (v[i] != want) return 0;
    return 1;
}

/* Retries `call` while it is refused as busy (checking that the refusal wrote nothing into
 * `out`, when given); returns its final result. A retry loop past the deadline is a hang. */
#define RETRY(thread, what, call, out)                                                         \
    ({                                                                                         \
        sucl_result rc_;                                                                       \
        double until_ = now() + 120;                                                           \
        while ((rc_ = (call)) == SUCL_ERR_BUSY) {                                              \
            atomic_fetch_add(&busy_seen, 1);                                                   \
            sched_yield();                                                                     \
            if ((out) != NULL && !all_equal((out), SENTINEL)) fail(thread, what " wrote while busy", rc_); \
            if (now() > until_) {                                                              \
                fail(thread, what " still busy after 120 s (a hang)", rc_);                   \
                break;                                                                         \
            }                                                                                  \
        }                                                                                      \
        if (rc_ == SUCL_OK) atomic_fetch_add(&ok_calls, 1);                                    \
        rc_;                                                                                   \
    })

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    int32_t next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (int round = 0; round < ROUNDS && atomic_load(&failures) == 0; round++) {
        int64_t send[N], recv[N];
        for (int i = 0; i < N; i++) send[i] = rank + 1;
        for (int i = 0; i < N; i++) recv[i] = SENTINEL;
        sucl_result rc = RETRY(t, "all_reduce", sucl_all_reduce(comm, send, recv, N, SUCL_INT64, SUCL_SUM), recv);
        if (rc != SUCL_OK) { fail(t, "all_reduce", rc); break; }
        if (!all_equal(recv, (int64_t)size * (size + 1) / 2)) fail(t, "all_reduce result", rc);

        int32_t tag = t * 1000 + round;
        int64_t out[N], in[N];
        for (int i = 0; i < N; i++) out[i] = ((int64_t)rank << 40) | ((int64_t)t << 20) | round;
        for (int i = 0; i < N; i++) in[i] = SENTINEL;
        sucl_request rq = SUCL_REQUEST_NULL, sq = SUCL_REQUEST_NULL;
        rc = RETRY(t, "irecv", sucl_irecv(comm, in, N, SUCL_INT64, prev, tag, &rq), (int64_t *)NULL);
        if (rc != SUCL_OK) { fail(t, "irecv", rc); break; }
        rc = RETRY(t, "isend", sucl_isend(comm, out, N, SUCL_INT64, next, tag, &sq), (int64_t *)NULL);
        if (rc != SUCL_OK) { fail(t, "isend", rc); break; }
        int32_t rdone = 0, sdone = 0;
        size_t got = 0;
        double until = now() + 120;
        while ((!rdone || !sdone) && atomic_load(&failures) == 0) {
            if (!sdone) {
                rc = sucl_test(sq, &sdone, NULL);
                if (rc == SUCL_ERR_BUSY) atomic_fetch_add(&busy_seen, 1);
                else if (rc != SUCL_OK) { fail(t, "sucl_test(send)", rc); break; }
            }
            if (!rdone) {
                rc = sucl_test(rq, &rdone, &got);
                if (rc == SUCL_ERR_BUSY) atomic_fetch_add(&busy_seen, 1);
                else if (rc != SUCL_OK) { fail(t, "sucl_test(recv)", rc); break; }
            }
            sched_yield();
            if (now() > until) { fail(t, "ring exchange not done after 120 s (a hang)", SUCL_OK); break; }
        }
        if (rdone && (got != N || !all_equal(in, ((int64_t)prev << 40) | ((int64_t)t << 20) | round)))
            fail(t, "ring exchange result", SUCL_OK);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: threads        (under a launcher, 2 or more ranks)\n"
               "%d threads share one communicator: collectives and non-blocking point-to-point, each\n"
               "call SUCL_OK or SUCL_ERR_BUSY, every result checked.\n"
               "example: sucl run -n 3 -- ./threads\n", THREADS);
        return 0;
    }
    CHECK(sucl_init(&comm));
    CHECK(sucl_comm_rank(comm, &rank));
    CHECK(sucl_comm_size(comm, &size));
    me = rank;
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    long failed = atomic_load(&failures) + wrong;
    if (failed == 0) CHECK(sucl_barrier(comm));
    sucl_result freed = sucl_comm_free(comm);
    printf("rank %d: threads: %d threads x %d rounds: %ld calls succeeded, %ld refused as busy, %ld failures\n", rank,
           THREADS, ROUNDS, atomic_load(&ok_calls), atomic_load(&busy_seen), failed);
    if (failed || freed != SUCL_OK) return 1;
    return 0;
}
