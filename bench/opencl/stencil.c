/* A 2-D Jacobi stencil split in strips across N OpenCL devices of one context, with the halo
 * rows exchanged each step by buffer migration: each device's kernel writes its first and last
 * rows into small edge buffers, and the neighbouring devices' kernels of the next step read
 * them. Nothing is copied by the host between steps: the OpenCL implementation moves the edge
 * buffers between devices (through sucl's ICD, server to server between daemons). The result
 * is checked against a serial reference on the host.
 *
 * The grid has N*rows rows of nx floats; its outer rows and columns are fixed (Dirichlet),
 * every inner cell becomes the mean of its four neighbours each step. Edge buffers are double
 * buffered (step t writes set t%2 and reads set (t+1)%2), and a step's kernel on device d waits
 * for the previous step's kernels on d-1 and d+1, which wrote the edges it reads and read the
 * edges it overwrites.
 *
 * Build: cc -O2 -o stencil stencil.c -lOpenCL
 * Usage: stencil [--platform NAME] [--devices N] [--nx COLS] [--rows ROWS_PER_DEVICE]
 *                [--steps S] [--warmup W] [--no-check]
 * Prints one line "stencil devices=N nx=.. rows=.. steps=.. seconds=.. ms_per_step=..
 * mcells_per_s=.. max_abs_diff=.." and exits 0 when the result matches the reference. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 64

static const char *kernel_source =
    "__kernel void jacobi(__global const float *in, __global float *out,\n"
    "                     __global const float *above, __global const float *below,\n"
    "                     __global float *top_edge, __global float *bottom_edge,\n"
    "                     int nx, int rows, int first_row, int total_rows) {\n"
    "  int j = get_global_id(0), i = get_global_id(1);\n"
    "  int g = first_row + i;\n"
    "  float v = in[i * nx + j];\n"
    "  if (g != 0 && g != total_rows - 1 && j != 0 && j != nx - 1) {\n"
    "    float up = i == 0 ? above[j] : in[(i - 1) * nx + j];\n"
    "    float down = i == rows - 1 ? below[j] : in[(i + 1) * nx + j];\n"
    "    v = 0.25f * (((up + down) + in[i * nx + j - 1]) + in[i * nx + j + 1]);\n"
    "  }\n"
    "  out[i * nx + j] = v;\n"
    "  if (i == 0) top_edge[j] = v;\n"
    "  if (i == rows - 1) bottom_edge[j] = v;\n"
    "}\n";

struct options {
    const char *platform;
    int devices, nx, rows, steps, warmup, check;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: stencil [--platform NAME] [--devices N] [--nx COLS] [--rows ROWS_PER_DEVICE]\n"
            "               [--steps S] [--warmup W] [--no-check]\n"
            "A 2-D Jacobi stencil in strips across N devices of the first OpenCL platform whose\n"
            "name contains NAME (default: sucl), halos moved between devices by buffer migration,\n"
            "checked against a serial reference on the host.\n"
            "  --devices N   devices (strips) to use, the platform's first N (default 2)\n"
            "  --nx COLS     columns of the grid (default 1024)\n"
            "  --rows R      rows per device: weak scaling keeps it fixed (default 256)\n"
            "  --steps S     timed steps (default 50)\n"
            "  --warmup W    untimed steps first (program build, first migrations; default 2)\n"
            "  --no-check    skip the serial reference\n");
}

static int parse_int(const char *flag, const char *value, int min) {
    char *end = NULL;
    long v = value ? strtol(value, &end, 10) : 0;
    if (!value || *end != '\0' || v < min || v > 1 << 24) {
        fprintf(stderr, "stencil: %s needs an integer >= %d (got %s)\n", flag, min, value ? value : "nothing");
        exit(2);
    }
    return (int)v;
}

static struct options parse_options(int argc, char **argv) {
    struct options o = {"sucl", 2, 1024, 256, 50, 2, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--platform") && v) {
            o.platform = v, i++;
        } else if (!strcmp(a, "--devices")) {
            o.devices = parse_int(a, v, 1), i++;
        } else if (!strcmp(a, "--nx")) {
            o.nx = parse_int(a, v, 3), i++;
        } else if (!strcmp(a, "--rows")) {
            o.rows = parse_int(a, v, 2), i++;
        } else if (!strcmp(a, "--steps")) {
            o.steps = parse_int(a, v, 1), i++;
        } else if (!strcmp(a, "--warmup")) {
            o.warmup = parse_int(a, v, 0), i++;
        } else if (!strcmp(a, "--no-check")) {
            o.check = 0;
        } else {
            fprintf(stderr, "stencil: unknown or incomplete argument %s\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (o.devices > MAX_DEVICES) {
        fprintf(stderr, "stencil: at most %d devices\n", MAX_DEVICES);
        exit(2);
    }
    return o;
}

static void check(cl_int err, const char *what) {
    if (err != CL_SUCCESS) {
        fprintf(stderr, "stencil: %s failed: OpenCL error %d\n", what, err);
        exit(1);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The starting grid: fixed outer frame (hot top row, a ramp on the left), a deterministic
 * pattern inside. */
static float initial_value(int g, int j, int total_rows, int nx) {
    if (g == 0) return 1.0f;
    if (j == 0) return (float)g / (float)total_rows;
    if (g == total_rows - 1 || j == nx - 1) return 0.0f;
    return (float)((g * 131 + j * 71) % 97) / 97.0f;
}

/* One serial Jacobi step over the whole grid, in the kernel's order of additions. */
static void reference_step(const float *in, float *out, int total_rows, int nx) {
    for (int g = 0; g < total_rows; g++) {
        for (int j = 0; j < nx; j++) {
            float v = in[(size_t)g * nx + j];
            if (g != 0 && g != total_rows - 1 && j != 0 && j != nx - 1) {
                float up = in[(size_t)(g - 1) * nx + j], down = in[(size_t)(g + 1) * nx + j];
                v = 0.25f * (((up + down) + in[(size_t)g * nx + j - 1]) + in[(size_t)g * nx + j + 1]);
            }
            out[(size_t)g * nx + j] = v;
        }
    }
}

static cl_platform_id find_platform(const char *name) {
    cl_uint n = 0;
    cl_platform_id ps[16];
    check(clGetPlatformIDs(16, ps, &n), "clGetPlatformIDs");
    for (cl_uint i = 0; i < n && i < 16; i++) {
        char pname[256] = {0};
        check(clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL), "clGetPlatformInfo");
        if (strstr(pname, name)) return ps[i];
    }
    fprintf(stderr, "stencil: no OpenCL platform named like \"%s\" (%u platforms)\n", name, n);
    exit(1);
}

/* Everything one strip (one device) holds. */
struct strip {
    cl_command_queue queue;
    cl_kernel kernel;
    cl_mem grid[2];       /* the strip, current and next */
    cl_mem edge[2][2];    /* [set][0 = top row, 1 = bottom row] */
    cl_mem fixed_row;     /* stands in for a missing neighbour (never read: boundary rows) */
};

/* Posts strip d's kernel of step t; prev[] are the strips' kernels of step t-1 (NULL before
 * the first step). Returns its event. */
static cl_event enqueue_step(struct strip *s, const cl_event *prev, int d, int n, int t, const struct options *o) {
    int cur = t % 2, set = t % 2, prev_set = (t + 1) % 2;
    int first_row = d * o->rows, total_rows = n * o->rows;
    cl_mem above = d > 0 ? s[d - 1].edge[prev_set][1] : s[d].fixed_row;
    cl_mem below = d < n - 1 ? s[d + 1].edge[prev_set][0] : s[d].fixed_row;
    cl_kernel k = s[d].kernel;
    check(clSetKernelArg(k, 0, sizeof(cl_mem), &s[d].grid[cur]), "clSetKernelArg in");
    check(clSetKernelArg(k, 1, sizeof(cl_mem), &s[d].grid[1 - cur]), "clSetKernelArg out");
    check(clSetKernelArg(k, 2, sizeof(cl_mem), &above), "clSetKernelArg above");
    check(clSetKernelArg(k, 3, sizeof(cl_mem), &below), "clSetKernelArg below");
    check(clSetKernelArg(k, 4, sizeof(cl_mem), &s[d].edge[set][0]), "clSetKernelArg top_edge");
    check(clSetKernelArg(k, 5, sizeof(cl_mem), &s[d].edge[set][1]), "clSetKernelArg bottom_edge");
    check(clSetKernelArg(k, 6, sizeof(int), &o->nx), "clSetKernelArg nx");
    check(clSetKernelArg(k, 7, sizeof(int), &o->rows), "clSetKernelArg rows");
    check(clSetKernelArg(k, 8, sizeof(int), &first_row), "clSetKernelArg first_row");
    check(clSetKernelArg(k, 9, sizeof(int), &total_rows), "clSetKernelArg total_rows");
    /* Wait for the neighbours' previous step: they wrote the edges read here and read the
     * edges overwritten here. The strip's own previous step is ordered by its queue. */
    cl_event waits[2];
    cl_uint nwaits = 0;
    if (d > 0 && prev[d - 1]) waits[nwaits++] = prev[d - 1];
    if (d < n - 1 && prev[d + 1]) waits[nwaits++] = prev[d + 1];
    size_t global[2] = {(size_t)o->nx, (size_t)o->rows};
    cl_event done;
    check(clEnqueueNDRangeKernel(s[d].queue, k, 2, NULL, global, NULL, nwaits, nwaits ? waits : NULL, &done),
          "clEnqueueNDRangeKernel");
    return done;
}

/* Posts steps first_step .. first_step+count-1 on every strip without waiting; last[] holds
 * each strip's latest kernel event (in and out). */
static void run_steps(struct strip *s, cl_event *last, int n, int first_step, int count, const struct options *o) {
    for (int t = first_step; t < first_step + count; t++) {
        cl_event posted[MAX_DEVICES];
        for (int d = 0; d < n; d++) posted[d] = enqueue_step(s, last, d, n, t, o);
        for (int d = 0; d < n; d++) {
            if (last[d]) clReleaseEvent(last[d]);
            last[d] = posted[d];
        }
    }
}

int main(int argc, char **argv) {
    struct options o = parse_options(argc, argv);
    int n = o.devices, nx = o.nx, total_rows = n * o.rows;
    size_t strip_bytes = (size_t)o.rows * nx * sizeof(float), row_bytes = (size_t)nx * sizeof(float);

    cl_platform_id platform = find_platform(o.platform);
    cl_device_id devs[MAX_DEVICES];
    cl_uint ndev = 0;
    check(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, MAX_DEVICES, devs, &ndev), "clGetDeviceIDs");
    if ((int)ndev < n) {
        fprintf(stderr, "stencil: %d devices asked for, the platform has %u\n", n, ndev);
        return 1;
    }
    cl_int err;
    cl_context ctx = clCreateContext(NULL, (cl_uint)n, devs, NULL, NULL, &err);
    check(err, "clCreateContext");
    cl_program prog = clCreateProgramWithSource(ctx, 1, &kernel_source, NULL, &err);
    check(err, "clCreateProgramWithSource");
    err = clBuildProgram(prog, (cl_uint)n, devs, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[8192] = {0};
        clGetProgramBuildInfo(prog, devs[0], CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        fprintf(stderr, "stencil: build failed (%d):\n%s\n", err, log);
        return 1;
    }

    float *grid = malloc(strip_bytes * n), *next = malloc(strip_bytes * n);
    if (!grid || !next) {
        fprintf(stderr, "stencil: out of host memory\n");
        return 1;
    }
    for (int g = 0; g < total_rows; g++)
        for (int j = 0; j < nx; j++) grid[(size_t)g * nx + j] = initial_value(g, j, total_rows, nx);

    struct strip s[MAX_DEVICES];
    cl_event last[MAX_DEVICES] = {0};
    memset(s, 0, sizeof s);
    for (int d = 0; d < n; d++) {
        const float *mine = grid + (size_t)d * o.rows * nx;
        s[d].queue = clCreateCommandQueue(ctx, devs[d], 0, &err);
        check(err, "clCreateCommandQueue");
        s[d].kernel = clCreateKernel(prog, "jacobi", &err);
        check(err, "clCreateKernel");
        s[d].grid[0] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, strip_bytes, NULL, &err);
        check(err, "clCreateBuffer grid");
        s[d].grid[1] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, strip_bytes, NULL, &err);
        check(err, "clCreateBuffer grid");
        s[d].fixed_row = clCreateBuffer(ctx, CL_MEM_READ_WRITE, row_bytes, NULL, &err);
        check(err, "clCreateBuffer fixed row");
        for (int set = 0; set < 2; set++)
            for (int e = 0; e < 2; e++) {
                s[d].edge[set][e] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, row_bytes, NULL, &err);
                check(err, "clCreateBuffer edge");
            }
        /* Step 0 reads edge set 1: it holds the initial first and last rows. */
        check(clEnqueueWriteBuffer(s[d].queue, s[d].grid[0], CL_FALSE, 0, strip_bytes, mine, 0, NULL, NULL), "write grid");
        check(clEnqueueWriteBuffer(s[d].queue, s[d].edge[1][0], CL_FALSE, 0, row_bytes, mine, 0, NULL, NULL), "write edge");
        check(clEnqueueWriteBuffer(s[d].queue, s[d].edge[1][1], CL_FALSE, 0, row_bytes,
                                   mine + (size_t)(o.rows - 1) * nx, 0, NULL, NULL),
              "write edge");
        check(clEnqueueWriteBuffer(s[d].queue, s[d].fixed_row, CL_FALSE, 0, row_bytes, mine, 0, NULL, NULL), "write row");
    }
    for (int d = 0; d < n; d++) check(clFinish(s[d].queue), "clFinish (setup)");

    run_steps(s, last, n, 0, o.warmup, &o);
    for (int d = 0; d < n; d++) check(clFinish(s[d].queue), "clFinish (warm-up)");
    double t0 = now();
    run_steps(s, last, n, o.warmup, o.steps, &o);
    for (int d = 0; d < n; d++) check(clFinish(s[d].queue), "clFinish");
    double seconds = now() - t0;

    int total_steps = o.warmup + o.steps, final = total_steps % 2;
    float *result = malloc(strip_bytes * n);
    if (!result) return 1;
    for (int d = 0; d < n; d++)
        check(clEnqueueReadBuffer(s[d].queue, s[d].grid[final], CL_TRUE, 0, strip_bytes,
                                  result + (size_t)d * o.rows * nx, 0, NULL, NULL),
              "clEnqueueReadBuffer");

    double max_diff = -1.0;
    if (o.check) {
        for (int t = 0; t < total_steps; t++) {
            reference_step(grid, next, total_rows, nx);
            float *tmp = grid;
            grid = next, next = tmp;
        }
        max_diff = 0.0;
        for (size_t i = 0; i < (size_t)total_rows * nx; i++) {
            double diff = fabs((double)result[i] - (double)grid[i]);
            if (!(diff <= max_diff)) max_diff = diff; /* also catches NaN */
        }
    }
    printf("stencil devices=%d nx=%d rows=%d steps=%d seconds=%.4f ms_per_step=%.3f mcells_per_s=%.1f max_abs_diff=%g\n",
           n, nx, o.rows, o.steps, seconds, seconds * 1e3 / o.steps,
           (double)total_rows * nx * o.steps / seconds / 1e6, max_diff);

    for (int d = 0; d < n; d++) {
        if (last[d]) clReleaseEvent(last[d]);
        for (int set = 0; set < 2; set++)
            for (int e = 0; e < 2; e++) clReleaseMemObject(s[d].edge[set][e]);
        clReleaseMemObject(s[d].grid[0]);
        clReleaseMemObject(s[d].grid[1]);
        clReleaseMemObject(s[d].fixed_row);
        clReleaseKernel(s[d].kernel);
        clReleaseCommandQueue(s[d].queue);
    }
    clReleaseProgram(prog);
    clReleaseContext(ctx);
    free(grid), free(next), free(result);
    if (o.check && !(max_diff <= 1e-5)) {
        fprintf(stderr, "stencil: result differs from the serial reference (max abs diff %g)\n", max_diff);
        return 1;
    }
    return 0;
}
