/*
 * Bad input through sucl's C API: each call must return the right error code with a message
 * that says what was wrong, and nothing may crash. One process (a world of one) is enough:
 *
 *     ./bad_input
 *
 * Exits 0 when every case is handled, 1 otherwise (each miss listed on stderr).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, nanosleep */
#include "check.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* `call` must return `code` and leave a message containing `word`. */
#define REJECTS(call, code, word)                                                                    \
    do {                                                                                             \
        sucl_result rc_ = (call);                                                                    \
        const char *msg_ = sucl_last_error();                                                        \
        EXPECT(rc_ == (code), "%s returned %s, want %s (%s)", #call, sucl_result_name(rc_), #code, msg_); \
        EXPECT(strstr(msg_, (word)) != NULL, "%s: message \"%s\" does not mention \"%s\"", #call, msg_, (word)); \
    } while (0)

/* A receive nobody answers, on its own thread: it holds the communicator until it times out. */
static sucl_comm blocked_comm;
static sucl_result blocked_rc = -1;
static char blocked_msg[512];

static void *blocked_recv(void *arg) {
    (void)arg;
    double x;
    blocked_rc = sucl_recv(blocked_comm, &x, 1, SUCL_FLOAT64, 0, 77, NULL);
    snprintf(blocked_msg, sizeof blocked_msg, "%s", sucl_last_error());
    return NULL;
}

/* While one thread is inside a call on a communicator, another thread's call on it is refused
 * with SUCL_ERR_BUSY (not a data race); the blocked call ends with SUCL_ERR_TIMEOUT. */
static void busy_and_timeout(sucl_comm comm) {
    CHECK(sucl_comm_split(comm, 0, 0, &blocked_comm));
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv, NULL);
    int rank, busy = 0;
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 4000 && !busy && blocked_rc == -1; i++) {
        sucl_result rc = sucl_comm_rank(blocked_comm, &rank);
        busy = rc == SUCL_ERR_BUSY && strstr(sucl_last_error(), "in use") != NULL;
        nanosleep(&nap, NULL);
    }
    EXPECT(busy, "a second thread was never refused with SUCL_ERR_BUSY");
    pthread_join(t, NULL);
    EXPECT(blocked_rc == SUCL_ERR_TIMEOUT, "the unanswered receive returned %s (%s)", sucl_result_name(blocked_rc), blocked_msg);
    EXPECT(strstr(blocked_msg, "timed out") != NULL, "timeout message \"%s\"", blocked_msg);
    CHECK(sucl_comm_free(blocked_comm));
}

/* Calls on device memory given host memory. Where no CUDA driver loads, every one is refused with
 * SUCL_ERR_BACKEND_UNAVAILABLE naming the missing driver; where a driver and GPU exist, each
 * buffer-taking call refuses the host pointer with SUCL_ERR_INVALID_ARGUMENT before anything
 * moves. (A driver without GPUs may answer either way; the message must then say which.) */
static void device_calls(sucl_comm comm, double *a, double *b) {
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    sucl_result first = sucl_all_reduce_device(comm, a, b, 4, SUCL_FLOAT64, SUCL_SUM, NULL);
    int no_gpu = first == SUCL_ERR_BACKEND_UNAVAILABLE;
    EXPECT(driver != NULL || no_gpu, "no libcuda.so.1 here, yet a call on device memory returned %s (%s)", sucl_result_name(first),
           sucl_last_error());
    if (driver) dlclose(driver);
    sucl_result code = no_gpu ? SUCL_ERR_BACKEND_UNAVAILABLE : SUCL_ERR_INVALID_ARGUMENT;
    const char *word = no_gpu ? (driver ? "CUDA" : "CUDA driver") : "host memory";
    size_t counts[1] = {4}, displs[1] = {0}, got;
    REJECTS(sucl_all_reduce_device(comm, a, b, 4, SUCL_FLOAT64, SUCL_SUM, NULL), code, word);
    REJECTS(sucl_broadcast_device(comm, a, 4, SUCL_FLOAT64, 0, NULL), code, word);
    REJECTS(sucl_reduce_device(comm, a, b, 4, SUCL_FLOAT64, SUCL_SUM, 0, NULL), code, word);
    REJECTS(sucl_gather_device(comm, a, b, 4, SUCL_FLOAT64, 0, NULL), code, word);
    REJECTS(sucl_all_gather_device(comm, a, b, 4, SUCL_FLOAT64, NULL), code, word);
    REJECTS(sucl_scatter_device(comm, a, b, 4, SUCL_FLOAT64, 0, NULL), code, word);
    REJECTS(sucl_all_to_all_device(comm, a, b, 4, SUCL_FLOAT64, NULL), code, word);
    REJECTS(sucl_reduce_scatter_device(comm, a, b, 4, SUCL_FLOAT64, SUCL_SUM, NULL), code, word);
    REJECTS(sucl_gatherv_device(comm, a, b, counts, displs, SUCL_FLOAT64, 0, NULL), code, word);
    REJECTS(sucl_scatterv_device(comm, a, counts, displs, b, SUCL_FLOAT64, 0, NULL), code, word);
    REJECTS(sucl_all_gatherv_device(comm, a, b, counts, displs, SUCL_FLOAT64, NULL), code, word);
    REJECTS(sucl_all_to_allv_device(comm, a, displs, b, displs, counts, SUCL_FLOAT64, NULL), code, word);
    REJECTS(sucl_send_device(comm, a, 4, SUCL_FLOAT64, 0, 0, NULL), code, word);
    REJECTS(sucl_recv_device(comm, b, 4, SUCL_FLOAT64, 0, 0, &got, NULL), code, word);
    REJECTS(sucl_sendrecv_device(comm, a, 4, 0, b, 4, 0, SUCL_FLOAT64, 0, &got, NULL), code, word);
    /* Arguments are checked before the device is looked at. */
    REJECTS(sucl_all_reduce_device(comm, a, b, 4, 42, SUCL_SUM, NULL), SUCL_ERR_INVALID_ARGUMENT, "dtype");
    REJECTS(sucl_all_reduce_device(SUCL_COMM_NULL, a, b, 4, SUCL_FLOAT64, SUCL_SUM, NULL), SUCL_ERR_INVALID_HANDLE, "null");
    if (no_gpu) {
        REJECTS(sucl_comm_attach_device(comm, -1), code, "CUDA");
        REJECTS(sucl_barrier_device(comm, NULL), code, "CUDA");
        REJECTS(sucl_synchronize_device(comm, NULL), code, "CUDA");
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("bad_input: calls sucl's C API with null pointers, unknown dtypes and ops, counts\n"
               "that overflow, misaligned buffers, freed and made-up handles, and checks the error\n"
               "code and message of each. No arguments.\n\nexample: ./bad_input\n");
        return 0;
    }
    me = 0;
    setenv("SUCL_TIMEOUT", "5", 1); /* the unanswered receive below gives up after 5 s */
    sucl_comm comm;
    CHECK(sucl_init(&comm));
    EXPECT(strcmp(sucl_last_error(), "") == 0, "a successful call left the message \"%s\"", sucl_last_error());
    double a[4] = {1, 2, 3, 4}, b[4];

    REJECTS(sucl_init(NULL), SUCL_ERR_INVALID_ARGUMENT, "NULL");
    REJECTS(sucl_all_reduce(comm, NULL, b, 4, SUCL_FLOAT64, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "sendbuf");
    REJECTS(sucl_all_reduce(comm, a, NULL, 4, SUCL_FLOAT64, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "recvbuf");
    REJECTS(sucl_all_reduce(comm, a, b, 4, 42, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "dtype");
    REJECTS(sucl_all_reduce(comm, a, b, 4, -1, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "dtype");
    REJECTS(sucl_all_reduce(comm, a, b, 4, SUCL_FLOAT64, 9), SUCL_ERR_INVALID_ARGUMENT, "op");
    REJECTS(sucl_all_reduce(comm, a, b, SIZE_MAX / 4, SUCL_FLOAT64, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "do not fit");
    REJECTS(sucl_all_gather(comm, a, b, SIZE_MAX, SUCL_UINT8), SUCL_ERR_INVALID_ARGUMENT, "fit");
    REJECTS(sucl_all_reduce(comm, (char *)a + 1, b, 2, SUCL_FLOAT64, SUCL_SUM), SUCL_ERR_INVALID_ARGUMENT, "aligned");
    REJECTS(sucl_broadcast(comm, a, 4, SUCL_FLOAT64, 3), SUCL_ERR_INVALID_ARGUMENT, "root");
    REJECTS(sucl_broadcast(comm, a, 4, SUCL_FLOAT64, -1), SUCL_ERR_INVALID_ARGUMENT, "root");
    REJECTS(sucl_send(comm, a, 4, SUCL_FLOAT64, 5, 0), SUCL_ERR_INVALID_ARGUMENT, "peer");
    REJECTS(sucl_send(comm, a, 4, SUCL_FLOAT64, 0, -3), SUCL_ERR_INVALID_ARGUMENT, "tag");
    REJECTS(sucl_gatherv(comm, a, b, NULL, NULL, SUCL_FLOAT64, 0), SUCL_ERR_INVALID_ARGUMENT, "counts");
    size_t huge[2] = {SIZE_MAX, 0}, zero[1] = {0};
    REJECTS(sucl_all_gatherv(comm, a, b, huge, zero, SUCL_FLOAT64), SUCL_ERR_INVALID_ARGUMENT, "");
    device_calls(comm, a, b);
    int rank;
    REJECTS(sucl_comm_rank(comm, NULL), SUCL_ERR_INVALID_ARGUMENT, "rank");
    REJECTS(sucl_comm_split(comm, -5, 0, &comm), SUCL_ERR_INVALID_ARGUMENT, "color");
    REJECTS(sucl_host_queue_submit(0, NULL, NULL), SUCL_ERR_INVALID_ARGUMENT, "fn");
    REJECTS(sucl_buffer_create(SUCL_FLOAT64, SIZE_MAX, &(sucl_buffer){0}), SUCL_ERR_INVALID_ARGUMENT, "count");

    /* Handles: null, made up, of another kind, freed (also after the slot is reused). */
    REJECTS(sucl_barrier(SUCL_COMM_NULL), SUCL_ERR_INVALID_HANDLE, "null");
    REJECTS(sucl_barrier((sucl_comm)0x0100000500000007ull), SUCL_ERR_INVALID_HANDLE, "not live");
    sucl_buffer buf;
    CHECK(sucl_buffer_create(SUCL_FLOAT64, 4, &buf));
    REJECTS(sucl_barrier((sucl_comm)buf), SUCL_ERR_INVALID_HANDLE, "not a communicator");
    REJECTS(sucl_buffer_write(buf, 2, a, 4), SUCL_ERR_INVALID_ARGUMENT, "past the buffer");
    sucl_buffer ibuf;
    CHECK(sucl_buffer_create(SUCL_INT32, 4, &ibuf));
    sucl_host_queue q;
    sucl_stream st;
    sucl_request rq;
    CHECK(sucl_host_queue_create(&q));
    CHECK(sucl_stream_create(comm, q, &st));
    REJECTS(sucl_barrier(comm), SUCL_ERR_BUSY, "stream-triggered queue");
    REJECTS(sucl_comm_free(comm), SUCL_ERR_BUSY, "stream-triggered queue");
    REJECTS(sucl_stream_all_reduce(st, buf, ibuf, SUCL_SUM, &rq), SUCL_ERR_INVALID_ARGUMENT, "holds");
    REJECTS(sucl_stream_send(st, buf, 7, 0, &rq), SUCL_ERR_INVALID_ARGUMENT, "peer");
    CHECK(sucl_stream_close(st));
    REJECTS(sucl_stream_start(st), SUCL_ERR_INVALID_HANDLE, "not live");
    CHECK(sucl_comm_rank(comm, &rank));
    CHECK(sucl_buffer_free(buf));
    CHECK(sucl_buffer_free(ibuf));
    REJECTS(sucl_buffer_read(buf, 0, b, 1), SUCL_ERR_INVALID_HANDLE, "not live");
    CHECK(sucl_host_queue_free(q));

    sucl_comm sub;
    CHECK(sucl_comm_split(comm, 0, 0, &sub));
    CHECK(sucl_comm_free(sub));
    REJECTS(sucl_all_reduce(sub, a, b, 4, SUCL_FLOAT64, SUCL_SUM), SUCL_ERR_INVALID_HANDLE, "not live");
    REJECTS(sucl_comm_free(sub), SUCL_ERR_INVALID_HANDLE, "not live");
    sucl_comm again;
    CHECK(sucl_comm_split(comm, 0, 0, &again)); /* may reuse the freed slot */
    REJECTS(sucl_barrier(sub), SUCL_ERR_INVALID_HANDLE, "not live");
    CHECK(sucl_barrier(again));
    CHECK(sucl_comm_free(again));

    /* A pending receive is withdrawn when its communicator is freed; its handle dies. */
    sucl_comm pending;
    CHECK(sucl_comm_split(comm, 0, 0, &pending));
    CHECK(sucl_irecv(pending, b, 4, SUCL_FLOAT64, 0, 9, &rq));
    CHECK(sucl_comm_free(pending));
    REJECTS(sucl_wait(rq, NULL), SUCL_ERR_INVALID_HANDLE, "not live");

    /* Last: the timeout aborts the job's communicators. */
    busy_and_timeout(comm);
    CHECK(sucl_comm_free(comm));
    REJECTS(sucl_barrier(comm), SUCL_ERR_INVALID_HANDLE, "not live");
    REJECTS(sucl_comm_free(comm), SUCL_ERR_INVALID_HANDLE, "not live");
    EXPECT(strcmp(sucl_result_name(SUCL_ERR_TIMEOUT), "SUCL_ERR_TIMEOUT") == 0, "result name");

    if (wrong) {
        fprintf(stderr, "%ld cases mishandled\n", wrong);
        return 1;
    }
    printf("every bad input rejected with its code and message\n");
    return 0;
}
