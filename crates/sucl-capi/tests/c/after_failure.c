/*
 * After a failed collective, sucl's C API must say that the communicator is unusable (and why)
 * on every later call, never report a later call as if it had failed for the first one's reason.
 * Rank r passes 4 + r % 2 elements to an all_reduce (SUCL_ERR_MISMATCH); then a broadcast that
 * every rank calls alike, an all_reduce whose dtypes differ and a send must each return
 * SUCL_ERR_UNUSABLE, naming the refused call and quoting the first error. Run on 2 or more ranks:
 *
 *     sucl run -n 2 -- ./after_failure
 *
 * Exits 0 when every check holds, 1 otherwise (each miss listed on stderr).
 */
#include "../../examples/c/check.h"
#include <string.h>

/* Checks that `rc` and the message refuse `op` as unusable since the all_reduce failed with `first`. */
static void expect_unusable(sucl_result rc, const char *op, const char *first) {
    const char *msg = sucl_last_error();
    char refused[128], quoted[1200];
    snprintf(refused, sizeof refused, "%s refused: this communicator is unusable", op);
    snprintf(quoted, sizeof quoted, "since its all_reduce failed with \"%s\"", first);
    EXPECT(rc == SUCL_ERR_UNUSABLE, "%s returned %s, want SUCL_ERR_UNUSABLE (%s)", op, sucl_result_name(rc), msg);
    EXPECT(strstr(msg, refused) != NULL, "%s: \"%s\" does not say \"%s\"", op, msg, refused);
    EXPECT(strstr(msg, quoted) != NULL, "%s: \"%s\" does not quote the first error: %s", op, msg, quoted);
    EXPECT(strstr(msg, "free it and create a new communicator") != NULL, "%s: \"%s\" does not say what to do", op, msg);
    EXPECT(strstr(msg, "dtype") == NULL, "%s: \"%s\" reports a disagreement of its own", op, msg);
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: after_failure        (under a launcher, 2 or more ranks)\n"
               "A count-mismatched all_reduce, then calls that must each return SUCL_ERR_UNUSABLE quoting it.\n"
               "example: sucl run -n 2 -- ./after_failure\n");
        return 0;
    }
    sucl_comm comm;
    CHECK(sucl_init(&comm));
    int32_t rank, size;
    CHECK(sucl_comm_rank(comm, &rank));
    CHECK(sucl_comm_size(comm, &size));
    me = rank;
    if (size < 2) {
        fprintf(stderr, "after_failure: needs 2 or more ranks\n");
        return 1;
    }
    float f[5] = {1, 1, 1, 1, 1};
    double d[4] = {1, 1, 1, 1};
    sucl_result rc = sucl_all_reduce(comm, f, f, 4 + (size_t)(rank % 2), SUCL_FLOAT32, SUCL_SUM);
    char first[1024];
    snprintf(first, sizeof first, "%s", sucl_last_error());
    EXPECT(rc == SUCL_ERR_MISMATCH, "the count-mismatched all_reduce returned %s (%s)", sucl_result_name(rc), first);
    EXPECT(strstr(first, "ranks disagree on") != NULL, "first error \"%s\"", first);

    expect_unusable(sucl_broadcast(comm, f, 4, SUCL_FLOAT32, 0), "broadcast", first);
    if (rank % 2 == 0) {
        expect_unusable(sucl_all_reduce(comm, f, f, 4, SUCL_FLOAT32, SUCL_SUM), "all_reduce", first);
    } else {
        expect_unusable(sucl_all_reduce(comm, d, d, 4, SUCL_FLOAT64, SUCL_SUM), "all_reduce", first);
    }
    expect_unusable(sucl_send(comm, f, 1, SUCL_FLOAT32, (rank + 1) % size, 3), "send", first);
    CHECK(sucl_comm_free(comm));
    if (wrong) {
        fprintf(stderr, "rank %d: after_failure: %ld checks failed\n", rank, wrong);
        return 1;
    }
    printf("rank %d: after_failure: every later call refused as unusable, quoting the first error\n", rank);
    return 0;
}
