/* OpenCL latency and bandwidth on one platform's first device, for sucl (through the ICD and
 * sucld) beside the same device used directly.
 *   clbench PLATFORM latency ITERS      empty kernel + clFinish: median and p99 in µs
 *   clbench PLATFORM bandwidth MIB REPS blocking write and read of MIB MiB: median GB/s
 * PLATFORM is a substring of the platform's name ("sucl", "Portable"). */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { fprintf(stderr, "%s = %d\n", #x, e_); exit(1); } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: clbench PLATFORM latency ITERS | bandwidth MIB REPS\n"); return 2; }
    cl_platform_id ps[16], p = NULL;
    cl_uint n;
    CHECK(clGetPlatformIDs(16, ps, &n));
    for (cl_uint i = 0; i < n; i++) {
        char name[256];
        CHECK(clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof name, name, NULL));
        if (strstr(name, argv[1])) { p = ps[i]; break; }
    }
    if (!p) { fprintf(stderr, "no platform matching %s\n", argv[1]); return 1; }
    cl_device_id d;
    CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CHECK(err);
    cl_command_queue q = clCreateCommandQueue(ctx, d, 0, &err); CHECK(err);
    if (!strcmp(argv[2], "latency")) {
        const char *src = "__kernel void empty(__global int *x) { }";
        cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
        CHECK(clBuildProgram(prog, 1, &d, "", NULL, NULL));
        cl_kernel k = clCreateKernel(prog, "empty", &err); CHECK(err);
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
        CHECK(clSetKernelArg(k, 0, sizeof m, &m));
        int iters = atoi(argv[3]);
        double *t = malloc(sizeof(double) * iters);
        size_t g = 1;
        for (int i = 0; i < iters / 10 + 10; i++) { CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL)); CHECK(clFinish(q)); }
        for (int i = 0; i < iters; i++) {
            double t0 = now();
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
            CHECK(clFinish(q));
            t[i] = (now() - t0) * 1e6;
        }
        qsort(t, iters, sizeof(double), cmp);
        printf("latency %s: median %.1f us, p99 %.1f us (%d runs)\n", argv[1], t[iters / 2], t[iters * 99 / 100], iters);
    } else {
        size_t bytes = (size_t)atoi(argv[3]) << 20;
        int reps = argc > 4 ? atoi(argv[4]) : 5;
        char *h = malloc(bytes), *back = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) h[i] = (char)(i * 7);
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err); CHECK(err);
        double *w = malloc(sizeof(double) * reps), *r = malloc(sizeof(double) * reps);
        CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, bytes, h, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, back, 0, NULL, NULL));
        for (int i = 0; i < reps; i++) {
            double t0 = now();
            CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, bytes, h, 0, NULL, NULL));
            CHECK(clFinish(q));
            w[i] = bytes / (now() - t0) / 1e9;
            t0 = now();
            CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, back, 0, NULL, NULL));
            r[i] = bytes / (now() - t0) / 1e9;
        }
        if (memcmp(h, back, bytes)) { fprintf(stderr, "read back differs\n"); return 1; }
        qsort(w, reps, sizeof(double), cmp);
        qsort(r, reps, sizeof(double), cmp);
        printf("bandwidth %s: %zu MiB write %.2f GB/s, read %.2f GB/s (median of %d)\n", argv[1], bytes >> 20, w[reps / 2], r[reps / 2], reps);
    }
    return 0;
}
