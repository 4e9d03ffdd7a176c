/* sucl's thin layer over MPI: handles, datatypes and operations stay on the C side, so the
 * Rust side is portable across MPI implementations (Open MPI, MPICH) without bindings. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

/* MPI_THREAD_MULTIPLE: each sucl communicator has its own MPI communicator, and two of them may
 * be driven from two threads at once (two stream queues, each with its progress thread).
 * *multiple tells whether the library granted it (or, when the program initialized MPI itself,
 * whether it asked for it). */
int sucl_mpi_init(int *multiple) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&provided);
        *multiple = provided >= MPI_THREAD_MULTIPLE;
        return 0;
    }
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return rc;
    *multiple = provided >= MPI_THREAD_MULTIPLE;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return 0;
}

int sucl_mpi_finalize(void) {
    int inited = 0, done = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&done);
    if (inited && !done) return MPI_Finalize();
    return 0;
}

void sucl_mpi_world(int *rank, int *size) {
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
}

int sucl_mpi_tag_ub(void) {
    int *v = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    return flag && v ? *v : 32767;
}

void sucl_mpi_error_string(int code, char *buf, int len) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) n = 0;
    s[n < MPI_MAX_ERROR_STRING ? n : MPI_MAX_ERROR_STRING - 1] = 0;
    strncpy(buf, s, (size_t)len - 1);
    buf[len - 1] = 0;
}

void sucl_mpi_version(char *buf, int len) {
    char s[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(s, &n);
    s[n < MPI_MAX_LIBRARY_VERSION_STRING ? n : MPI_MAX_LIBRARY_VERSION_STRING - 1] = 0;
    char *nl = strchr(s, '\n');
    if (nl) *nl = 0;
    strncpy(buf, s, (size_t)len - 1);
    buf[len - 1] = 0;
}

void *sucl_mpi_comm_create(const int *ranks, int n, int *err) {
    MPI_Group world, group;
    MPI_Comm *c = malloc(sizeof(MPI_Comm));
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, n, ranks, &group);
    *err = MPI_Comm_create_group(MPI_COMM_WORLD, group, 0x5c1, c);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    if (*err != MPI_SUCCESS) { free(c); return NULL; }
    MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
    return c;
}

void sucl_mpi_comm_free(void *c) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Comm_free((MPI_Comm *)c);
    free(c);
}

/* Element type codes follow sucl's DType (u8 i8 i32 u32 i64 u64 f16 bf16 f32 f64). MPI has no
 * standard 16-bit floats: they move as 16-bit integers and are never reduced here. */
static MPI_Datatype dtype_of(int code) {
    switch (code) {
    case 0: return MPI_UINT8_T;
    case 1: return MPI_INT8_T;
    case 2: return MPI_INT32_T;
    case 3: return MPI_UINT32_T;
    case 4: return MPI_INT64_T;
    case 5: return MPI_UINT64_T;
    case 6: case 7: return MPI_UINT16_T;
    case 8: return MPI_FLOAT;
    default: return MPI_DOUBLE;
    }
}

static MPI_Op op_of(int code) {
    switch (code) {
    case 1: return MPI_PROD;
    case 2: return MPI_MIN;
    case 3: return MPI_MAX;
    default: return MPI_SUM; /* sum, and avg (divided afterwards) */
    }
}

void *sucl_mpi_isend(void *c, const void *buf, int len, int peer, int tag, int *err) {
    MPI_Request *r = malloc(sizeof(MPI_Request));
    *err = MPI_Isend(buf, len, MPI_BYTE, peer, tag, *(MPI_Comm *)c, r);
    if (*err != MPI_SUCCESS) { free(r); return NULL; }
    return r;
}

void *sucl_mpi_irecv(void *c, void *buf, int cap, int peer, int tag, int *err) {
    MPI_Request *r = malloc(sizeof(MPI_Request));
    *err = MPI_Irecv(buf, cap, MPI_BYTE, peer, tag, *(MPI_Comm *)c, r);
    if (*err != MPI_SUCCESS) { free(r); return NULL; }
    return r;
}

/* Tests a request; on completion frees it and reports the bytes received (or -1 if unknown). */
int sucl_mpi_test(void *req, int *done, long long *bytes) {
    MPI_Status st;
    memset(&st, 0, sizeof st);
    int rc = MPI_Test((MPI_Request *)req, done, &st);
    if (rc != MPI_SUCCESS) return rc;
    if (*done) {
        int n = -1;
        if (MPI_Get_count(&st, MPI_BYTE, &n) != MPI_SUCCESS) n = -1;
        *bytes = n;
        free(req);
    }
    return rc;
}

/* Whether an error code says a message was longer than the buffer that received it (ranks that
 * disagree on a count). */
int sucl_mpi_is_truncation(int code) {
    int cls = 0;
    if (MPI_Error_class(code, &cls) != MPI_SUCCESS) return 0;
    return cls == MPI_ERR_TRUNCATE;
}

/* Asks MPI to cancel a point-to-point request. The request stays live: it still has to complete
 * (sucl_mpi_test) before its buffer may be reused, since a cancel that comes too late lets the
 * transfer finish. Returns 1 if MPI is already finalized (no request can be live then; the
 * handle is freed), else 0. */
int sucl_mpi_cancel(void *req) {
    int done = 0;
    MPI_Finalized(&done);
    if (done) {
        free(req);
        return 1;
    }
    MPI_Cancel((MPI_Request *)req);
    return 0;
}

/* Ends every process of the job: the way out when a request still owns a caller's buffer and
 * cannot be completed or cancelled. */
void sucl_mpi_abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* Starts a non-blocking collective. op codes follow sucl's CollOp; send == NULL means in place. */
void *sucl_mpi_icoll(void *cp, int op, const void *send, void *recv, int count, int dt, int redop, int root, int *err) {
    MPI_Comm c = *(MPI_Comm *)cp;
    MPI_Datatype t = dtype_of(dt);
    MPI_Op o = op_of(redop);
    const void *s = send ? send : MPI_IN_PLACE;
    MPI_Request *r = malloc(sizeof(MPI_Request));
    switch (op) {
    case 0: *err = MPI_Ibarrier(c, r); break;
    case 1: *err = MPI_Ibcast(recv, count, t, root, c, r); break;
    case 2: *err = MPI_Ireduce(s, recv, count, t, o, root, c, r); break;
    case 3: *err = MPI_Iallreduce(s, recv, count, t, o, c, r); break;
    case 4: *err = MPI_Igather(s, count, t, recv, count, t, root, c, r); break;
    case 5: *err = MPI_Iallgather(s, count, t, recv, count, t, c, r); break;
    case 6: *err = MPI_Iscatter(send, count, t, recv, count, t, root, c, r); break;
    case 7: *err = MPI_Ialltoall(send, count, t, recv, count, t, c, r); break;
    default: *err = MPI_Ireduce_scatter_block(send, recv, count, t, o, c, r); break;
    }
    if (*err != MPI_SUCCESS) { free(r); return NULL; }
    return r;
}

/* Runs a collective to completion on the caller's thread: MPI's blocking collectives are the
 * ones its implementers tune (Open MPI's `tuned` component), its non-blocking ones are not.
 * Same codes and in-place convention as sucl_mpi_icoll; returns MPI's error code. */
static int coll(MPI_Comm c, int op, const void *send, void *recv, int count, int dt, int redop, int root) {
    MPI_Datatype t = dtype_of(dt);
    MPI_Op o = op_of(redop);
    const void *s = send ? send : MPI_IN_PLACE;
    switch (op) {
    case 0: return MPI_Barrier(c);
    case 1: return MPI_Bcast(recv, count, t, root, c);
    case 2: return MPI_Reduce(s, recv, count, t, o, root, c);
    case 3: return MPI_Allreduce(s, recv, count, t, o, c);
    case 4: return MPI_Gather(s, count, t, recv, count, t, root, c);
    case 5: return MPI_Allgather(s, count, t, recv, count, t, c);
    case 6: return MPI_Scatter(send, count, t, recv, count, t, root, c);
    case 7: return MPI_Alltoall(send, count, t, recv, count, t, c);
    default: return MPI_Reduce_scatter_block(send, recv, count, t, o, c);
    }
}

/* A blocking collective on one of sucl's communicators. */
int sucl_mpi_coll(void *cp, int op, const void *send, void *recv, int count, int dt, int redop, int root) {
    return coll(*(MPI_Comm *)cp, op, send, recv, count, dt, redop, root);
}

/* A blocking collective on MPI_COMM_WORLD, nothing else: what a program calling MPI directly
 * does (the baseline of `sucl bench --compare raw-mpi`). */
int sucl_mpi_coll_world(int op, const void *send, void *recv, int count, int dt, int redop, int root) {
    return coll(MPI_COMM_WORLD, op, send, recv, count, dt, redop, root);
}

/* v-collectives in bytes. op: 0 gatherv, 1 allgatherv, 2 scatterv, 3 alltoallv. A one-entry
 * count array gives this rank's own block (gatherv/allgatherv send, scatterv receive). */
void *sucl_mpi_ivcoll(void *cp, int op, const void *send, const int *scounts, const int *sdispls,
                      void *recv, const int *rcounts, const int *rdispls, int root, int *err) {
    MPI_Comm c = *(MPI_Comm *)cp;
    MPI_Request *r = malloc(sizeof(MPI_Request));
    switch (op) {
    case 0: *err = MPI_Igatherv(send, scounts[0], MPI_BYTE, recv, rcounts, rdispls, MPI_BYTE, root, c, r); break;
    case 1: *err = MPI_Iallgatherv(send, scounts[0], MPI_BYTE, recv, rcounts, rdispls, MPI_BYTE, c, r); break;
    case 2: *err = MPI_Iscatterv(send, scounts, sdispls, MPI_BYTE, recv, rcounts[0], MPI_BYTE, root, c, r); break;
    default: *err = MPI_Ialltoallv(send, scounts, sdispls, MPI_BYTE, recv, rcounts, rdispls, MPI_BYTE, c, r); break;
    }
    if (*err != MPI_SUCCESS) { free(r); return NULL; }
    return r;
}
