/* Shared by the C examples: stop on a failed call, count wrong results. */
#ifndef SUCL_EXAMPLE_CHECK_H
#define SUCL_EXAMPLE_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <sucl.h>

static long wrong = 0;
static int me = -1;

/* A call that must succeed: print sucl's message and exit otherwise. */
#define CHECK(call)                                                                           \
    do {                                                                                      \
        sucl_result rc_ = (call);                                                             \
        if (rc_ != SUCL_OK) {                                                                 \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", me, #call, sucl_result_name(rc_), \
                    sucl_last_error());                                                       \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

/* A result that must hold: count and report it otherwise. */
#define EXPECT(cond, ...)                                              \
    do {                                                               \
        if (!(cond)) {                                                 \
            if (wrong < 20) {                                          \
                fprintf(stderr, "rank %d: wrong: %s: ", me, #cond);   \
                fprintf(stderr, __VA_ARGS__);                          \
                fprintf(stderr, "\n");                                 \
            }                                                          \
            wrong++;                                                   \
        }                                                              \
    } while (0)

#endif
