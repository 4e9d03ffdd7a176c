/* OpenCL programs run through the ICD loader against sucld daemons; each scenario checks
 * its results against references computed here on the host and exits non-zero on the first
 * difference. Usage: cltest SCENARIO. Built with `cc cltest.c -lOpenCL`. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(x)                                                                   \
    do {                                                                           \
        cl_int e_ = (x);                                                           \
        if (e_ != CL_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, e_);       \
            exit(1);                                                               \
        }                                                                          \
    } while (0)
#define EXPECT(cond)                                                               \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                               \
        }                                                                          \
    } while (0)
#define EXPECT_CODE(x, code)                                                       \
    do {                                                                           \
        cl_int e_ = (x);                                                           \
        if (e_ != (code)) {                                                        \
            fprintf(stderr, "%s:%d: %s = %d, expected %s (%d)\n", __FILE__, __LINE__, \
                    #x, e_, #code, code);                                          \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static cl_platform_id platform;
static cl_device_id devices[8];
static cl_uint ndev;

static void find_sucl(void) {
    cl_platform_id ps[16];
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(16, ps, &n));
    for (cl_uint i = 0; i < n; i++) {
        char name[128] = {0};
        CHECK(clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof name, name, NULL));
        if (strcmp(name, "sucl") == 0) {
            platform = ps[i];
            CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 8, devices, &ndev));
            return;
        }
    }
    fprintf(stderr, "no sucl platform among %u\n", n);
    exit(1);
}

static cl_program build(cl_context ctx, const char *src) {
    cl_int err;
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    err = clBuildProgram(p, 0, NULL, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[8192] = {0};
        clGetProgramBuildInfo(p, devices[0], CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "build failed (%d): %s\n", err, log);
        exit(1);
    }
    return p;
}

static const char *KERNELS =
    "__kernel void vadd(__global const float *a, __global const float *b, __global float *c) {\n"
    "  size_t i = get_global_id(0); c[i] = a[i] + b[i]; }\n"
    "__kernel void ids2(__global int *out, int width) {\n"
    "  out[get_global_id(1) * width + get_global_id(0)] = (int)(get_global_id(0) * 1000 + get_global_id(1)); }\n"
    "__kernel void ids3(__global int *out, int w, int h) {\n"
    "  size_t x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "  out[(z * h + y) * w + x] = (int)(x + 10 * y + 100 * z); }\n"
    "__kernel void group_sum(__global const int *in, __global int *out, __local int *scratch) {\n"
    "  size_t l = get_local_id(0), n = get_local_size(0);\n"
    "  scratch[l] = in[get_global_id(0)]; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  if (l == 0) { int s = 0; for (size_t i = 0; i < n; i++) s += scratch[i]; out[get_group_id(0)] = s; } }\n"
    "__kernel void scale(__global float *x, float k) { x[get_global_id(0)] *= k; }\n"
    "__kernel void add1(__global int *x) { x[get_global_id(0)] += 1; }\n"
    "__kernel void twice(__global int *x) { x[get_global_id(0)] *= 2; }\n"
    "__kernel void spin(__global int *x, int n) { int v = 0; for (int i = 0; i < n; i++) v = v * 3 + i; x[get_global_id(0)] = v; }\n"
    "__kernel void slow_set(__global int *x, int n, int base) {\n"
    "  uint v = 0; for (int i = 0; i < n; i++) v = v * 3u + (uint)i;\n"
    "  x[get_global_id(0)] = base + (int)get_global_id(0) + (int)(v % 2u); }\n"
    "__kernel void slow_copy(__global const int *src, __global int *dst, int n) {\n"
    "  uint v = 0; for (int i = 0; i < n; i++) v = v * 3u + (uint)i;\n"
    "  dst[get_global_id(0)] = src[get_global_id(0)] + (int)(v % 2u); }\n";

static cl_context ctx;
static cl_command_queue q;
static cl_program prog;

static void setup(cl_command_queue_properties props) {
    cl_int err;
    find_sucl();
    ctx = clCreateContext(NULL, 1, devices, NULL, NULL, &err);
    CHECK(err);
    q = clCreateCommandQueue(ctx, devices[0], props, &err);
    CHECK(err);
    prog = build(ctx, KERNELS);
}

static cl_kernel kernel(const char *name) {
    cl_int err;
    cl_kernel k = clCreateKernel(prog, name, &err);
    CHECK(err);
    return k;
}

static int info(void) {
    find_sucl();
    char s[1024];
    CHECK(clGetPlatformInfo(platform, CL_PLATFORM_EXTENSIONS, sizeof s, s, NULL));
    EXPECT(strstr(s, "cl_khr_icd") != NULL);
    CHECK(clGetPlatformInfo(platform, CL_PLATFORM_ICD_SUFFIX_KHR, sizeof s, s, NULL));
    EXPECT(strcmp(s, "sucl") == 0);
    EXPECT(ndev >= 1);
    for (cl_uint i = 0; i < ndev; i++) {
        cl_device_type t;
        size_t wg, sizes[3];
        cl_ulong mem;
        cl_bool img;
        cl_platform_id p;
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_NAME, sizeof s, s, NULL));
        EXPECT(strlen(s) > 0);
        printf("device %u: %s\n", i, s);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_TYPE, sizeof t, &t, NULL));
        EXPECT(t & CL_DEVICE_TYPE_CPU);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
        EXPECT(wg >= 1);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes, sizes, NULL));
        EXPECT(sizes[0] >= 1);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL));
        EXPECT(mem > 0);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_IMAGE_SUPPORT, sizeof img, &img, NULL));
        EXPECT(img == CL_FALSE);
        /* Native kernels are not offered (clEnqueueNativeKernel is refused): kernels only. */
        cl_device_exec_capabilities exec = 0;
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_EXECUTION_CAPABILITIES, sizeof exec, &exec, NULL));
        EXPECT(exec == CL_EXEC_KERNEL);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_PLATFORM, sizeof p, &p, NULL));
        EXPECT(p == platform);
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_VERSION, sizeof s, s, NULL));
        EXPECT(strncmp(s, "OpenCL 1.2", 10) == 0);
        size_t need = 0;
        CHECK(clGetDeviceInfo(devices[i], CL_DEVICE_NAME, 0, NULL, &need));
        EXPECT(need == strlen(s) + 1 || need > 1);
        EXPECT_CODE(clGetDeviceInfo(devices[i], CL_DEVICE_NAME, 1, s, NULL), CL_INVALID_VALUE);
    }
    cl_uint n;
    EXPECT_CODE(clGetDeviceIDs(platform, CL_DEVICE_TYPE_GPU, 0, NULL, &n), CL_DEVICE_NOT_FOUND);
    EXPECT_CODE(clGetDeviceIDs(platform, (cl_device_type)1 << 40, 0, NULL, &n), CL_INVALID_DEVICE_TYPE);
    return 0;
}

static int vadd(void) {
    setup(0);
    /* 12 MiB a buffer: more 1 MiB pieces than the reads sent ahead, written and read from
       an offset that is not a piece boundary. */
    enum { N = 3 << 20 };
    float *a = malloc(N * 4), *b = malloc(N * 4), *c = malloc(N * 4);
    for (int i = 0; i < N; i++) { a[i] = (float)i; b[i] = (float)(2 * i) + 0.5f; }
    cl_int err;
    cl_mem A = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * 4, a, &err); CHECK(err);
    cl_mem B = clCreateBuffer(ctx, CL_MEM_READ_ONLY, N * 4, NULL, &err); CHECK(err);
    cl_mem C = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, N * 4, NULL, &err); CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, B, CL_FALSE, 0, 4, b, 0, NULL, NULL));
    CHECK(clEnqueueWriteBuffer(q, B, CL_FALSE, 4, N * 4 - 4, b + 1, 0, NULL, NULL));
    cl_kernel k = kernel("vadd");
    CHECK(clSetKernelArg(k, 0, sizeof A, &A));
    CHECK(clSetKernelArg(k, 1, sizeof B, &B));
    CHECK(clSetKernelArg(k, 2, sizeof C, &C));
    size_t g = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, C, CL_TRUE, 0, N * 4, c, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(c[i] == a[i] + b[i]);
    memset(c, 0, N * 4);
    CHECK(clEnqueueReadBuffer(q, C, CL_TRUE, 4, N * 4 - 4, c + 1, 0, NULL, NULL));
    EXPECT(c[0] == 0.0f);
    for (int i = 1; i < N; i++) EXPECT(c[i] == a[i] + b[i]);
    CHECK(clFinish(q));
    CHECK(clReleaseKernel(k));
    CHECK(clReleaseMemObject(A)); CHECK(clReleaseMemObject(B)); CHECK(clReleaseMemObject(C));
    CHECK(clReleaseProgram(prog)); CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
    printf("vadd ok\n");
    return 0;
}

static int ndrange(void) {
    setup(0);
    cl_int err;
    /* 2-D with an offset: only the offset window is written. */
    enum { W = 40, H = 30 };
    int *out = calloc(W * H, 4);
    cl_mem O = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, W * H * 4, out, &err); CHECK(err);
    cl_kernel k2 = kernel("ids2");
    int width = W;
    CHECK(clSetKernelArg(k2, 0, sizeof O, &O));
    /* A by-value argument of the wrong size is refused at the call, as PoCL does. */
    char narrow = 1;
    long wide = 1;
    EXPECT_CODE(clSetKernelArg(k2, 1, sizeof narrow, &narrow), CL_INVALID_ARG_SIZE);
    EXPECT_CODE(clSetKernelArg(k2, 1, sizeof wide, &wide), CL_INVALID_ARG_SIZE);
    CHECK(clSetKernelArg(k2, 1, sizeof width, &width));
    size_t off[2] = {8, 6}, g[2] = {24, 20}, l[2] = {8, 4};
    CHECK(clEnqueueNDRangeKernel(q, k2, 2, off, g, l, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, O, CL_TRUE, 0, W * H * 4, out, 0, NULL, NULL));
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int in = x >= 8 && x < 32 && y >= 6 && y < 26;
            EXPECT(out[y * W + x] == (in ? x * 1000 + y : 0));
        }
    /* 3-D with offsets and local sizes. */
    enum { X = 8, Y = 6, Z = 4 };
    int *o3 = calloc(X * Y * Z, 4);
    cl_mem O3 = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, X * Y * Z * 4, o3, &err); CHECK(err);
    cl_kernel k3 = kernel("ids3");
    int w = X, h = Y;
    CHECK(clSetKernelArg(k3, 0, sizeof O3, &O3));
    CHECK(clSetKernelArg(k3, 1, sizeof w, &w));
    CHECK(clSetKernelArg(k3, 2, sizeof h, &h));
    size_t off3[3] = {2, 0, 1}, g3[3] = {6, 6, 3}, l3[3] = {2, 3, 1};
    CHECK(clEnqueueNDRangeKernel(q, k3, 3, off3, g3, l3, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, O3, CL_TRUE, 0, X * Y * Z * 4, o3, 0, NULL, NULL));
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < X; x++) {
                int in = x >= 2 && z >= 1;
                EXPECT(o3[(z * Y + y) * X + x] == (in ? x + 10 * y + 100 * z : 0));
            }
    /* __local memory: per-group sums. */
    enum { N = 4096, L = 64 };
    int *in = malloc(N * 4), sums[N / L];
    for (int i = 0; i < N; i++) in[i] = (i * 7) % 13 - 6;
    cl_mem I = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * 4, in, &err); CHECK(err);
    cl_mem S = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof sums, NULL, &err); CHECK(err);
    cl_kernel ks = kernel("group_sum");
    CHECK(clSetKernelArg(ks, 0, sizeof I, &I));
    CHECK(clSetKernelArg(ks, 1, sizeof S, &S));
    CHECK(clSetKernelArg(ks, 2, L * sizeof(int), NULL));
    size_t gs = N, ls = L;
    CHECK(clEnqueueNDRangeKernel(q, ks, 1, NULL, &gs, &ls, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, S, CL_TRUE, 0, sizeof sums, sums, 0, NULL, NULL));
    for (int gi = 0; gi < N / L; gi++) {
        int s = 0;
        for (int i = 0; i < L; i++) s += in[gi * L + i];
        EXPECT(sums[gi] == s);
    }
    size_t kwg;
    CHECK(clGetKernelWorkGroupInfo(ks, devices[0], CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL));
    EXPECT(kwg >= 1);
    cl_uint nargs;
    CHECK(clGetKernelInfo(ks, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
    EXPECT(nargs == 3);
    /* 200 by-value arguments (more than 64), as CL_DEVICE_MAX_PARAMETER_SIZE allows. */
    enum { MANY = 200 };
    static char src[MANY * 16 + 256];
    int at = sprintf(src, "__kernel void many(__global int *out");
    for (int i = 0; i < MANY; i++) at += sprintf(src + at, ", char a%d", i);
    at += sprintf(src + at, ") { out[0] = a0 + a%d; }\n", MANY - 1);
    cl_program pm = build(ctx, src);
    cl_kernel km = clCreateKernel(pm, "many", &err); CHECK(err);
    CHECK(clGetKernelInfo(km, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
    EXPECT(nargs == MANY + 1);
    cl_mem M = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, 4, NULL, &err); CHECK(err);
    CHECK(clSetKernelArg(km, 0, sizeof M, &M));
    for (int i = 0; i < MANY; i++) {
        char c = (char)(i % 100);
        CHECK(clSetKernelArg(km, i + 1, 1, &c));
    }
    cl_kernel_arg_address_qualifier aq;
    CHECK(clGetKernelArgInfo(km, MANY, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof aq, &aq, NULL));
    EXPECT(aq == CL_KERNEL_ARG_ADDRESS_PRIVATE);
    size_t one = 1;
    int got = -1;
    CHECK(clEnqueueNDRangeKernel(q, km, 1, NULL, &one, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, M, CL_TRUE, 0, 4, &got, 0, NULL, NULL));
    EXPECT(got == 0 + (MANY - 1) % 100);
    CHECK(clReleaseKernel(km)); CHECK(clReleaseProgram(pm)); CHECK(clReleaseMemObject(M));
    printf("ndrange ok\n");
    return 0;
}

static int buffers(void) {
    setup(0);
    cl_int err;
    enum { N = 1024 };
    int host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = i * 3 + 1;
    /* USE_HOST_PTR: map returns the host memory with the buffer's contents. */
    int use[N];
    memcpy(use, host, sizeof use);
    cl_mem U = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, sizeof use, use, &err); CHECK(err);
    cl_kernel add1 = kernel("add1");
    CHECK(clSetKernelArg(add1, 0, sizeof U, &U));
    size_t g = N;
    CHECK(clEnqueueNDRangeKernel(q, add1, 1, NULL, &g, NULL, 0, NULL, NULL));
    int *m = clEnqueueMapBuffer(q, U, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, sizeof use, 0, NULL, NULL, &err); CHECK(err);
    EXPECT(m == use);
    for (int i = 0; i < N; i++) EXPECT(m[i] == host[i] + 1);
    for (int i = 0; i < N; i++) m[i] = -i;
    cl_uint maps;
    CHECK(clGetMemObjectInfo(U, CL_MEM_MAP_COUNT, sizeof maps, &maps, NULL));
    EXPECT(maps == 1);
    CHECK(clEnqueueUnmapMemObject(q, U, m, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, U, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == -i);
    /* Map of an ordinary buffer, write-only. */
    cl_mem A = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, sizeof host, NULL, &err); CHECK(err);
    int *w = clEnqueueMapBuffer(q, A, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 16, 64, 0, NULL, NULL, &err); CHECK(err);
    for (int i = 0; i < 16; i++) w[i] = 100 + i;
    CHECK(clEnqueueUnmapMemObject(q, A, w, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, A, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == ((i >= 4 && i < 20) ? 100 + i - 4 : 0));
    /* Fill with a 2-int pattern, then copy a range. */
    int pat[2] = {7, -7};
    CHECK(clEnqueueFillBuffer(q, A, pat, sizeof pat, 0, sizeof host, 0, NULL, NULL));
    cl_mem B = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err); CHECK(err);
    CHECK(clEnqueueCopyBuffer(q, A, B, 0, 100 * 4, 10 * 4, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, B, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == ((i >= 100 && i < 110) ? ((i - 100) % 2 ? -7 : 7) : host[i]));
    EXPECT_CODE(clEnqueueCopyBuffer(q, B, B, 0, 8, 64, 0, NULL, NULL), CL_MEM_COPY_OVERLAP);
    /* Rect forms: a 4x3x2 box of bytes. */
    enum { BW = 16, BH = 8, BD = 4 };
    unsigned char box[BW * BH * BD], hostbox[BW * BH * BD], got[BW * BH * BD];
    for (int i = 0; i < BW * BH * BD; i++) box[i] = (unsigned char)i, hostbox[i] = (unsigned char)(255 - i);
    cl_mem R = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof box, box, &err); CHECK(err);
    size_t bo[3] = {2, 1, 1}, ho[3] = {5, 2, 0}, region[3] = {4, 3, 2};
    CHECK(clEnqueueWriteBufferRect(q, R, CL_TRUE, bo, ho, region, BW, BW * BH, BW, BW * BH, hostbox, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, R, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
    for (int z = 0; z < BD; z++)
        for (int y = 0; y < BH; y++)
            for (int x = 0; x < BW; x++) {
                int i = (z * BH + y) * BW + x;
                int in = x >= 2 && x < 6 && y >= 1 && y < 4 && z >= 1 && z < 3;
                int hi = ((z - 1) * BH + (y - 1 + 2)) * BW + (x - 2 + 5);
                EXPECT(got[i] == (in ? hostbox[hi] : box[i]));
            }
    unsigned char out[BW * BH * BD];
    memset(out, 0, sizeof out);
    CHECK(clEnqueueReadBufferRect(q, R, CL_TRUE, bo, ho, region, BW, BW * BH, BW, BW * BH, out, 0, NULL, NULL));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 3; y++)
            for (int x = 0; x < 4; x++) {
                int hi = ((z + 0) * BH + (y + 2)) * BW + (x + 5);
                int bi = ((z + 1) * BH + (y + 1)) * BW + (x + 2);
                EXPECT(out[hi] == got[bi]);
            }
    size_t so[3] = {0, 0, 0}, dso[3] = {8, 4, 2};
    CHECK(clEnqueueCopyBufferRect(q, R, R, so, dso, region, BW, BW * BH, BW, BW * BH, 0, NULL, NULL));
    unsigned char after[BW * BH * BD];
    CHECK(clEnqueueReadBuffer(q, R, CL_TRUE, 0, sizeof after, after, 0, NULL, NULL));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 3; y++)
            for (int x = 0; x < 4; x++)
                EXPECT(after[((z + 2) * BH + y + 4) * BW + x + 8] == got[(z * BH + y) * BW + x]);
    /* Sub-buffer: a kernel on a window of the parent. */
    cl_uint align_bits;
    CHECK(clGetDeviceInfo(devices[0], CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    size_t align = align_bits / 8;
    cl_mem P = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err); CHECK(err);
    cl_buffer_region reg = {align, 64 * 4};
    cl_mem Sub = clCreateSubBuffer(P, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err); CHECK(err);
    cl_buffer_region bad = {align + 4, 16};
    EXPECT(clCreateSubBuffer(P, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &bad, &err) == NULL);
    EXPECT(err == CL_MISALIGNED_SUB_BUFFER_OFFSET);
    CHECK(clSetKernelArg(add1, 0, sizeof Sub, &Sub));
    g = 64;
    CHECK(clEnqueueNDRangeKernel(q, add1, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, P, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    size_t first = align / 4;
    for (size_t i = 0; i < N; i++) EXPECT(back[i] == host[i] + ((i >= first && i < first + 64) ? 1 : 0));
    int part[4];
    CHECK(clEnqueueReadBuffer(q, Sub, CL_TRUE, 8, sizeof part, part, 0, NULL, NULL));
    for (int i = 0; i < 4; i++) EXPECT(part[i] == host[first + 2 + i] + 1);
    cl_mem assoc;
    CHECK(clGetMemObjectInfo(Sub, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL));
    EXPECT(assoc == P);
    CHECK(clFinish(q));
    printf("buffers ok\n");
    return 0;
}

static volatile int callback_status = 99;
static void CL_CALLBACK on_done(cl_event e, cl_int status, void *data) {
    (void)e;
    *(int *)data += 1;
    callback_status = status;
}

static int events(void) {
    setup(CL_QUEUE_PROFILING_ENABLE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    cl_int err;
    enum { N = 4096 };
    float x[N], back[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof x, NULL, &err); CHECK(err);
    /* A user event holds a write and the kernel after it. */
    cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
    cl_event wrote, scaled;
    CHECK(clEnqueueWriteBuffer(q, X, CL_FALSE, 0, sizeof x, x, 1, &gate, &wrote));
    cl_kernel k = kernel("scale");
    float factor = 3.0f;
    CHECK(clSetKernelArg(k, 0, sizeof X, &X));
    CHECK(clSetKernelArg(k, 1, sizeof factor, &factor));
    size_t g = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 1, &wrote, &scaled));
    int calls = 0;
    CHECK(clSetEventCallback(scaled, CL_COMPLETE, on_done, &calls));
    cl_int st;
    CHECK(clGetEventInfo(scaled, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_QUEUED);
    EXPECT(calls == 0);
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    EXPECT_CODE(clSetUserEventStatus(gate, CL_COMPLETE), CL_INVALID_OPERATION);
    CHECK(clWaitForEvents(1, &scaled));
    CHECK(clEnqueueReadBuffer(q, X, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 3.0f * x[i]);
    for (int i = 0; i < 200 && calls == 0; i++) usleep(10000);
    EXPECT(calls == 1 && callback_status == CL_COMPLETE);
    cl_ulong t[4];
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_QUEUED, 8, &t[0], NULL));
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_SUBMIT, 8, &t[1], NULL));
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_START, 8, &t[2], NULL));
    CHECK(clGetEventProfilingInfo(scaled, CL_PROFILING_COMMAND_END, 8, &t[3], NULL));
    EXPECT(t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3] && t[3] > 0);
    cl_command_type ct;
    CHECK(clGetEventInfo(scaled, CL_EVENT_COMMAND_TYPE, sizeof ct, &ct, NULL));
    EXPECT(ct == CL_COMMAND_NDRANGE_KERNEL);
    /* Markers and barriers. */
    cl_event marker;
    CHECK(clEnqueueMarkerWithWaitList(q, 1, &scaled, &marker));
    CHECK(clEnqueueBarrierWithWaitList(q, 0, NULL, NULL));
    CHECK(clWaitForEvents(1, &marker));
    CHECK(clGetEventInfo(marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_COMPLETE);
    /* A failed user event fails what waits for it. */
    cl_event gate2 = clCreateUserEvent(ctx, &err); CHECK(err);
    cl_event doomed;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 1, &gate2, &doomed));
    int calls2 = 0;
    CHECK(clSetEventCallback(doomed, CL_COMPLETE, on_done, &calls2));
    CHECK(clSetUserEventStatus(gate2, -5));
    EXPECT_CODE(clWaitForEvents(1, &doomed), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    CHECK(clGetEventInfo(doomed, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st < 0);
    EXPECT(calls2 == 1);
    /* Retain/release counts. */
    cl_uint rc;
    CHECK(clRetainEvent(marker));
    CHECK(clGetEventInfo(marker, CL_EVENT_REFERENCE_COUNT, sizeof rc, &rc, NULL));
    EXPECT(rc == 2);
    CHECK(clReleaseEvent(marker));
    CHECK(clReleaseEvent(marker));
    EXPECT_CODE(clReleaseEvent(marker), CL_INVALID_EVENT);
    CHECK(clFinish(q));
    printf("events ok\n");
    return 0;
}

static int build_fail(void) {
    find_sucl();
    cl_int err;
    ctx = clCreateContext(NULL, 1, devices, NULL, NULL, &err); CHECK(err);
    const char *src = "/* the error is on line 2 */\n__kernel void broken(__global int *x) { x[0] = undeclared_thing; }\n";
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
    EXPECT_CODE(clBuildProgram(p, 1, devices, "", NULL, NULL), CL_BUILD_PROGRAM_FAILURE);
    cl_build_status bs;
    CHECK(clGetProgramBuildInfo(p, devices[0], CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    EXPECT(bs == CL_BUILD_ERROR);
    char log[8192] = {0};
    CHECK(clGetProgramBuildInfo(p, devices[0], CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
    printf("log: %s\n", log);
    EXPECT(strstr(log, "undeclared_thing") != NULL);
    EXPECT(strstr(log, ":2:") != NULL); /* the application's line numbers */
    clCreateKernel(p, "broken", &err);
    EXPECT(err == CL_INVALID_PROGRAM_EXECUTABLE);
    printf("build_fail ok\n");
    return 0;
}

static cl_program_binary_type binary_type(cl_program p) {
    cl_program_binary_type t = 99;
    CHECK(clGetProgramBuildInfo(p, devices[0], CL_PROGRAM_BINARY_TYPE, sizeof t, &t, NULL));
    return t;
}

/* Separate compilation and linking (clCompileProgram with an embedded header, a library,
   clLinkProgram), their failures, and a kernel with a 2048-character name. */
static int compile_link(void) {
    find_sucl();
    cl_int err;
    ctx = clCreateContext(NULL, 1, devices, NULL, NULL, &err); CHECK(err);
    q = clCreateCommandQueue(ctx, devices[0], 0, &err); CHECK(err);
    const char *header_src = "#define OFFSET 7\nint helper(int x);\n";
    const char *helper_src = "int helper(int x) { return 3 * x; }\n";
    const char *main_src =
        "#include \"inc/helper.h\"\n"
        "__kernel void apply(__global int *x) { size_t i = get_global_id(0); x[i] = helper(x[i]) + OFFSET; }\n";
    cl_program header = clCreateProgramWithSource(ctx, 1, &header_src, NULL, &err); CHECK(err);
    cl_program helper = clCreateProgramWithSource(ctx, 1, &helper_src, NULL, &err); CHECK(err);
    cl_program mainp = clCreateProgramWithSource(ctx, 1, &main_src, NULL, &err); CHECK(err);
    const char *name = "inc/helper.h";
    CHECK(clCompileProgram(mainp, 1, devices, "", 1, &header, &name, NULL, NULL));
    CHECK(clCompileProgram(helper, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL));
    EXPECT(binary_type(mainp) == CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT);
    /* A compiled object is no executable. */
    EXPECT(clCreateKernel(mainp, "apply", &err) == NULL && err == CL_INVALID_PROGRAM_EXECUTABLE);
    cl_program lib = clLinkProgram(ctx, 1, devices, "-create-library", 1, &helper, NULL, NULL, &err); CHECK(err);
    EXPECT(binary_type(lib) == CL_PROGRAM_BINARY_TYPE_LIBRARY);
    cl_program both[2] = {mainp, lib};
    cl_program exe = clLinkProgram(ctx, 1, devices, NULL, 2, both, NULL, NULL, &err); CHECK(err);
    EXPECT(binary_type(exe) == CL_PROGRAM_BINARY_TYPE_EXECUTABLE);
    size_t nk = 0;
    CHECK(clGetProgramInfo(exe, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL));
    EXPECT(nk == 1);
    cl_kernel k = clCreateKernel(exe, "apply", &err); CHECK(err);
    enum { N = 64 };
    int x[N];
    for (int i = 0; i < N; i++) x[i] = i;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &err); CHECK(err);
    CHECK(clSetKernelArg(k, 0, sizeof X, &X));
    size_t g = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, X, CL_TRUE, 0, sizeof x, x, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(x[i] == 3 * i + 7);
    /* Kernels of linked programs come without argument info: an 8-byte zero must reach a
     * ulong argument as 0 (not as a null buffer the platform refuses), and a null buffer handle
     * a pointer argument as a null buffer. */
    const char *off_src =
        "__kernel void shift(__global ulong *x, ulong off, __global int *maybe) {\n"
        " size_t i = get_global_id(0); x[i] = off + i + (maybe ? 1000 : 0); }\n";
    cl_program offp = clCreateProgramWithSource(ctx, 1, &off_src, NULL, &err); CHECK(err);
    CHECK(clCompileProgram(offp, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL));
    cl_program offx = clLinkProgram(ctx, 1, devices, NULL, 1, &offp, NULL, NULL, &err); CHECK(err);
    cl_kernel sk = clCreateKernel(offx, "shift", &err); CHECK(err);
    cl_ulong y[N], zero = 0, five = 5;
    cl_mem Y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof y, NULL, &err); CHECK(err);
    cl_mem none = NULL;
    CHECK(clSetKernelArg(sk, 0, sizeof Y, &Y));
    CHECK(clSetKernelArg(sk, 2, sizeof none, &none));
    for (int round = 0; round < 2; round++) {
        CHECK(clSetKernelArg(sk, 1, sizeof zero, round ? (const void *)&five : (const void *)&zero));
        CHECK(clEnqueueNDRangeKernel(q, sk, 1, NULL, &g, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, Y, CL_TRUE, 0, sizeof y, y, 0, NULL, NULL));
        for (int i = 0; i < N; i++) EXPECT(y[i] == (cl_ulong)(round ? 5 : 0) + (cl_ulong)i);
    }
    CHECK(clReleaseMemObject(Y)); CHECK(clReleaseKernel(sk));
    CHECK(clReleaseProgram(offx)); CHECK(clReleaseProgram(offp));
    /* The devices report OpenCL 1.2 and no images: so does the compiler. */
    const char *img_src =
        "__kernel void img(__global int *x) {\n"
        "#ifdef __IMAGE_SUPPORT__\n x[0] = 1;\n#else\n x[0] = 0;\n#endif\n x[1] = __OPENCL_VERSION__;\n"
        " x[2] = __OPENCL_C_VERSION__;\n}\n";
    cl_program ip = clCreateProgramWithSource(ctx, 1, &img_src, NULL, &err); CHECK(err);
    CHECK(clBuildProgram(ip, 0, NULL, NULL, NULL, NULL));
    cl_kernel ik = clCreateKernel(ip, "img", &err); CHECK(err);
    CHECK(clSetKernelArg(ik, 0, sizeof X, &X));
    x[0] = 99;
    CHECK(clEnqueueTask(q, ik, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, X, CL_TRUE, 0, 3 * sizeof x[0], x, 0, NULL, NULL));
    EXPECT(x[0] == 0);
    EXPECT(x[1] == 120);
    EXPECT(x[2] == 120); /* no -cl-std: OpenCL C 1.2 */
    size_t optlen = 0;
    CHECK(clGetProgramBuildInfo(ip, devices[0], CL_PROGRAM_BUILD_OPTIONS, 0, NULL, &optlen));
    EXPECT(optlen == 1); /* the application's options (none), not what the daemon got */
    CHECK(clReleaseKernel(ik)); CHECK(clReleaseProgram(ip));
    /* A compilation that fails: its code, status and log. */
    const char *bad_src = "__kernel void broken(__global int *x) { x[0] = undeclared_thing; }\n";
    cl_program bad = clCreateProgramWithSource(ctx, 1, &bad_src, NULL, &err); CHECK(err);
    EXPECT_CODE(clCompileProgram(bad, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL), CL_COMPILE_PROGRAM_FAILURE);
    cl_build_status bs;
    CHECK(clGetProgramBuildInfo(bad, devices[0], CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    EXPECT(bs == CL_BUILD_ERROR);
    /* A link that fails (the kernel calls a function nobody defines) returns its program. */
    cl_program lone = clCreateProgramWithSource(ctx, 1, &main_src, NULL, &err); CHECK(err);
    CHECK(clCompileProgram(lone, 0, NULL, NULL, 1, &header, &name, NULL, NULL));
    cl_program unlinked = clLinkProgram(ctx, 0, NULL, NULL, 1, &lone, NULL, NULL, &err);
    EXPECT(err == CL_LINK_PROGRAM_FAILURE && unlinked != NULL);
    CHECK(clGetProgramBuildInfo(unlinked, devices[0], CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    EXPECT(bs == CL_BUILD_ERROR);
    CHECK(clReleaseProgram(unlinked));
    /* Only compiled objects and libraries link. */
    EXPECT(clLinkProgram(ctx, 0, NULL, NULL, 1, &bad, NULL, NULL, &err) == NULL && err == CL_INVALID_OPERATION);
    EXPECT(clLinkProgram(ctx, 0, NULL, NULL, 0, NULL, NULL, NULL, &err) == NULL && err == CL_INVALID_VALUE);
    /* A kernel name of 2048 characters (OpenCL sets no limit; the conformance tests use it). */
    char long_src[2400], long_name[2049];
    memset(long_name, 'k', 2048);
    long_name[2048] = 0;
    snprintf(long_src, sizeof long_src, "__kernel void %s(__global int *x) { x[get_global_id(0)] = 5; }\n", long_name);
    const char *ls = long_src;
    cl_program lp = clCreateProgramWithSource(ctx, 1, &ls, NULL, &err); CHECK(err);
    CHECK(clBuildProgram(lp, 0, NULL, NULL, NULL, NULL));
    cl_kernel lk = clCreateKernel(lp, long_name, &err); CHECK(err);
    cl_uint nargs = 0;
    CHECK(clGetKernelInfo(lk, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
    EXPECT(nargs == 1);
    CHECK(clFinish(q));
    CHECK(clReleaseKernel(lk)); CHECK(clReleaseProgram(lp));
    CHECK(clReleaseKernel(k)); CHECK(clReleaseMemObject(X));
    CHECK(clReleaseProgram(exe)); CHECK(clReleaseProgram(lib)); CHECK(clReleaseProgram(mainp));
    CHECK(clReleaseProgram(helper)); CHECK(clReleaseProgram(header)); CHECK(clReleaseProgram(bad));
    CHECK(clReleaseProgram(lone));
    CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
    printf("compile_link ok\n");
    return 0;
}

/* The device's memory sizes are those the daemon's session limit (argv[2] bytes) allows, and
   a buffer of CL_DEVICE_MAX_MEM_ALLOC_SIZE bytes can be made and used. */
static int mem_limit(const char *limit_arg) {
    cl_ulong limit = strtoull(limit_arg, NULL, 10), global = 0, max_alloc = 0;
    find_sucl();
    CHECK(clGetDeviceInfo(devices[0], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL));
    CHECK(clGetDeviceInfo(devices[0], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL));
    printf("limit %llu, global %llu, max alloc %llu\n", (unsigned long long)limit, (unsigned long long)global,
           (unsigned long long)max_alloc);
    EXPECT(global == limit); /* PoCL's device has more than the limit */
    EXPECT(max_alloc > 0 && max_alloc <= limit);
    cl_int err;
    ctx = clCreateContext(NULL, 1, devices, NULL, NULL, &err); CHECK(err);
    q = clCreateCommandQueue(ctx, devices[0], 0, &err); CHECK(err);
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, max_alloc, NULL, &err); CHECK(err);
    int v = 42, back = 0;
    CHECK(clEnqueueWriteBuffer(q, big, CL_TRUE, max_alloc - sizeof v, sizeof v, &v, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, big, CL_TRUE, max_alloc - sizeof v, sizeof v, &back, 0, NULL, NULL));
    EXPECT(back == 42);
    CHECK(clReleaseMemObject(big)); CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
    printf("mem_limit ok\n");
    return 0;
}

/* CL_MEM_COPY_OVERLAP for a rectangular copy within one buffer follows the specification's
   overlap test (boxes that meet, or one running past its row or slice into the other's span),
   not the bytes the rows happen to touch. */
static int copy_rect_overlap(void) {
    find_sucl();
    cl_int err;
    ctx = clCreateContext(NULL, 1, devices, NULL, NULL, &err); CHECK(err);
    q = clCreateCommandQueue(ctx, devices[0], 0, &err); CHECK(err);
    size_t w = 438, h = 353, d = 408;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, w * h * d, NULL, &err); CHECK(err);
    size_t so[3] = {14, 69, 100}, dof[3] = {176, 181, 171}, reg[3] = {224, 5, 226};
    /* Rows of 438 bytes in slices of 353 rows: the boxes are apart. */
    CHECK(clEnqueueCopyBufferRect(q, b, b, so, dof, reg, w, w * h, w, w * h, 0, NULL, NULL));
    /* Slices of 5 rows: the source runs past its slice into the destination's span. */
    EXPECT_CODE(clEnqueueCopyBufferRect(q, b, b, so, dof, reg, w, 0, w, 0, 0, NULL, NULL), CL_MEM_COPY_OVERLAP);
    /* Rows as wide as the region (224): the destination runs past its row. No two rows of
       this copy touch the same bytes, but the specification's test says they overlap. */
    EXPECT_CODE(clEnqueueCopyBufferRect(q, b, b, so, dof, reg, 0, 224 * h, 0, 224 * h, 0, NULL, NULL), CL_MEM_COPY_OVERLAP);
    EXPECT_CODE(clEnqueueCopyBufferRect(q, b, b, so, dof, reg, 0, 0, 0, 0, 0, NULL, NULL), CL_MEM_COPY_OVERLAP);
    /* One buffer, two geometries. */
    EXPECT_CODE(clEnqueueCopyBufferRect(q, b, b, so, dof, reg, w, w * h, w + 1, (w + 1) * h, 0, NULL, NULL), CL_INVALID_VALUE);
    CHECK(clFinish(q));
    CHECK(clReleaseMemObject(b)); CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
    printf("copy_rect_overlap ok\n");
    return 0;
}

static int bad_input(void) {
    setup(0);
    cl_int err;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1024, NULL, &err); CHECK(err);
    cl_kernel k = kernel("scale");
    EXPECT_CODE(clSetKernelArg(k, 2, sizeof X, &X), CL_INVALID_ARG_INDEX);
    EXPECT_CODE(clSetKernelArg(k, 0, 4, &X), CL_INVALID_ARG_SIZE);
    cl_kernel loc = kernel("group_sum");
    EXPECT_CODE(clSetKernelArg(loc, 2, 64, &X), CL_INVALID_ARG_VALUE);
    EXPECT(clCreateKernel(prog, "no_such_kernel", &err) == NULL && err == CL_INVALID_KERNEL_NAME);
    size_t g = 256, l = 3;
    EXPECT_CODE(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL), CL_INVALID_KERNEL_ARGS);
    CHECK(clSetKernelArg(k, 0, sizeof X, &X));
    float f = 2;
    CHECK(clSetKernelArg(k, 1, sizeof f, &f));
    EXPECT_CODE(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL), CL_INVALID_WORK_GROUP_SIZE);
    EXPECT_CODE(clEnqueueNDRangeKernel(q, k, 4, NULL, &g, NULL, 0, NULL, NULL), CL_INVALID_WORK_DIMENSION);
    char buf[2048];
    EXPECT_CODE(clEnqueueReadBuffer(q, X, CL_TRUE, 1000, 100, buf, 0, NULL, NULL), CL_INVALID_VALUE);
    EXPECT_CODE(clEnqueueReadBuffer(q, X, CL_TRUE, 0, 16, buf, 1, NULL, NULL), CL_INVALID_EVENT_WAIT_LIST);
    /* An event of another context. */
    cl_context other = clCreateContext(NULL, 1, devices, NULL, NULL, &err); CHECK(err);
    cl_event foreign = clCreateUserEvent(other, &err); CHECK(err);
    EXPECT_CODE(clEnqueueReadBuffer(q, X, CL_TRUE, 0, 16, buf, 1, &foreign, NULL), CL_INVALID_CONTEXT);
    /* A released object and a pointer that is no object. */
    cl_mem Y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
    CHECK(clReleaseMemObject(Y));
    EXPECT_CODE(clSetKernelArg(k, 0, sizeof Y, &Y), CL_INVALID_MEM_OBJECT);
    EXPECT_CODE(clEnqueueWriteBuffer(q, Y, CL_TRUE, 0, 16, buf, 0, NULL, NULL), CL_INVALID_MEM_OBJECT);
    EXPECT_CODE(clRetainMemObject(Y), CL_INVALID_MEM_OBJECT);
    EXPECT(clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY, 64, NULL, &err) == NULL && err == CL_INVALID_VALUE);
    EXPECT(clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err) == NULL && err == CL_INVALID_BUFFER_SIZE);
    EXPECT(clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, 64, NULL, &err) == NULL && err == CL_INVALID_HOST_PTR);
    /* Images are refused. */
    cl_image_format fmt = {CL_RGBA, CL_UNORM_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE2D; desc.image_width = 4; desc.image_height = 4;
    EXPECT(clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err) == NULL && err == CL_INVALID_OPERATION);
    /* The queue still works. */
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clFinish(q));
    printf("bad_input ok\n");
    return 0;
}

/* A context over the first two devices (two daemons), a queue on each, KERNELS built. */
static void setup_two(cl_command_queue *qa, cl_command_queue *qb, cl_command_queue_properties props) {
    find_sucl();
    EXPECT(ndev >= 2);
    cl_int err;
    ctx = clCreateContext(NULL, 2, devices, NULL, NULL, &err); CHECK(err);
    *qa = clCreateCommandQueue(ctx, devices[0], props, &err); CHECK(err);
    *qb = clCreateCommandQueue(ctx, devices[1], props, &err); CHECK(err);
    prog = build(ctx, KERNELS);
}

/* Daemon `server`'s counters through the sucl extension clGetSuclServerStats. */
static void server_stats(cl_uint server, cl_ulong out[4]) {
    typedef cl_int (*stats_fn)(cl_platform_id, cl_uint, cl_ulong *);
    stats_fn stats = (stats_fn)clGetExtensionFunctionAddressForPlatform(platform, "clGetSuclServerStats");
    EXPECT(stats != NULL);
    CHECK(stats(platform, server, out));
}

static int multi(void) {
    cl_command_queue qa, qb;
    setup_two(&qa, &qb, 0);
    cl_int err;
    enum { N = 100000 };
    int *x = malloc(N * 4), *back = malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = i - 500;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * 4, x, &err); CHECK(err);
    cl_kernel a = kernel("add1"), b = kernel("twice");
    CHECK(clSetKernelArg(a, 0, sizeof X, &X));
    CHECK(clSetKernelArg(b, 0, sizeof X, &X));
    size_t g = N;
    cl_event ea, eb;
    for (int round = 0; round < 3; round++) {
        CHECK(clEnqueueNDRangeKernel(qa, a, 1, NULL, &g, NULL, 0, NULL, &ea));
        CHECK(clEnqueueNDRangeKernel(qb, b, 1, NULL, &g, NULL, 1, &ea, &eb));
        CHECK(clEnqueueMarkerWithWaitList(qa, 1, &eb, NULL));
        for (int i = 0; i < N; i++) x[i] = (x[i] + 1) * 2;
        CHECK(clReleaseEvent(ea));
        CHECK(clReleaseEvent(eb));
    }
    CHECK(clEnqueueReadBuffer(qa, X, CL_TRUE, 0, N * 4, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == x[i]);
    /* The buffer moved daemon to daemon: each daemon received it over the peer link (A once
     * per round after the first, B once per round), never through this process. */
    cl_ulong sa[4], sb[4];
    server_stats(0, sa);
    server_stats(1, sb);
    printf("daemon A: %llu migrations in, %llu bytes; daemon B: %llu migrations in, %llu bytes\n",
           (unsigned long long)sa[2], (unsigned long long)sa[3], (unsigned long long)sb[2], (unsigned long long)sb[3]);
    EXPECT(sb[2] == 3 && sb[3] == 3ull * N * 4);
    EXPECT(sa[2] == 3 && sa[3] == 3ull * N * 4);
    CHECK(clFinish(qa));
    CHECK(clFinish(qb));
    printf("multi ok\n");
    return 0;
}

/* The host's value of the slow kernels' spin (a check of their results, not of time). */
static int spin_parity(int n) {
    unsigned v = 0;
    for (int i = 0; i < n; i++) v = v * 3u + (unsigned)i;
    return (int)(v % 2u);
}

/* Kernels that run long, and what must wait for them: the daemon answers a launch before it
 * ends, so a read, and a migration to the other daemon, must each wait for the last kernel
 * that writes the buffer; a kernel that only reads a buffer (`const`) leaves the other
 * daemon's copy current, so writing it there again moves nothing. */
static int overlap(void) {
    cl_command_queue qa, qb;
    setup_two(&qa, &qb, 0);
    cl_int err;
    enum { N = 64 };
    int spins = 2000000, p = spin_parity(spins), back[N];
    size_t g = N;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof back, NULL, &err); CHECK(err);
    cl_mem Y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof back, NULL, &err); CHECK(err);
    cl_mem W = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof back, NULL, &err); CHECK(err);
    cl_kernel set = kernel("slow_set"), copy = kernel("slow_copy"), two = kernel("twice"), one = kernel("add1");
    CHECK(clSetKernelArg(set, 1, sizeof spins, &spins));
    CHECK(clSetKernelArg(copy, 2, sizeof spins, &spins));

    /* 1. A blocking read right behind a long kernel sees what the kernel wrote. */
    int base = 100;
    CHECK(clSetKernelArg(set, 0, sizeof X, &X));
    CHECK(clSetKernelArg(set, 2, sizeof base, &base));
    CHECK(clEnqueueNDRangeKernel(qa, set, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(qa, X, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 100 + i + p);

    /* 2. The buffer moves to the other daemon only once the long kernel wrote it. */
    base = 200;
    CHECK(clSetKernelArg(set, 2, sizeof base, &base));
    cl_event set_done, doubled;
    CHECK(clEnqueueNDRangeKernel(qa, set, 1, NULL, &g, NULL, 0, NULL, &set_done));
    CHECK(clSetKernelArg(two, 0, sizeof X, &X));
    CHECK(clEnqueueNDRangeKernel(qb, two, 1, NULL, &g, NULL, 1, &set_done, &doubled));
    CHECK(clEnqueueReadBuffer(qb, X, CL_TRUE, 0, sizeof back, back, 1, &doubled, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 2 * (200 + i + p));

    /* 3. Y, written on A, read (const) on B: A's copy stays current, so A writes it again
     * without anything coming back from B. */
    base = 300;
    CHECK(clSetKernelArg(set, 0, sizeof Y, &Y));
    CHECK(clSetKernelArg(set, 2, sizeof base, &base));
    cl_event y_set, copied;
    CHECK(clEnqueueNDRangeKernel(qa, set, 1, NULL, &g, NULL, 0, NULL, &y_set));
    CHECK(clSetKernelArg(copy, 0, sizeof Y, &Y));
    CHECK(clSetKernelArg(copy, 1, sizeof W, &W));
    CHECK(clEnqueueNDRangeKernel(qb, copy, 1, NULL, &g, NULL, 1, &y_set, &copied));
    CHECK(clSetKernelArg(one, 0, sizeof Y, &Y));
    CHECK(clEnqueueNDRangeKernel(qa, one, 1, NULL, &g, NULL, 1, &copied, NULL));
    CHECK(clEnqueueReadBuffer(qb, W, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 300 + i + 2 * p);
    CHECK(clEnqueueReadBuffer(qa, Y, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 300 + i + p + 1);

    cl_ulong sa[4], sb[4];
    server_stats(0, sa);
    server_stats(1, sb);
    printf("daemon A: %llu migrations in; daemon B: %llu migrations in\n", (unsigned long long)sa[2], (unsigned long long)sb[2]);
    EXPECT(sa[2] == 0 && sb[2] == 2);
    CHECK(clFinish(qa));
    CHECK(clFinish(qb));
    printf("overlap ok\n");
    return 0;
}

/* A kernel on device 1 that waits for a long kernel on device 0 (no buffer shared to order
 * them) starts after that one ended, in each of `rounds` rounds; each round's events are
 * released before the next. The devices' PoCL time commands with this host's monotonic clock,
 * also in two daemons. */
static void waits_in_order(int rounds) {
    cl_command_queue qa, qb;
    setup_two(&qa, &qb, CL_QUEUE_PROFILING_ENABLE);
    cl_int err;
    enum { N = 64 };
    int spins = 4000000, p = spin_parity(spins), base = 1, back[N];
    size_t g = N;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof back, NULL, &err); CHECK(err);
    cl_mem Z = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof back, NULL, &err); CHECK(err);
    CHECK(clEnqueueFillBuffer(qb, Z, &base, sizeof base, 0, sizeof back, 0, NULL, NULL));
    CHECK(clFinish(qb));
    cl_kernel set = kernel("slow_set"), two = kernel("twice");
    CHECK(clSetKernelArg(set, 0, sizeof X, &X));
    CHECK(clSetKernelArg(set, 1, sizeof spins, &spins));
    CHECK(clSetKernelArg(set, 2, sizeof base, &base));
    CHECK(clSetKernelArg(two, 0, sizeof Z, &Z));
    for (int round = 0; round < rounds; round++) {
        cl_event set_done, doubled;
        CHECK(clEnqueueNDRangeKernel(qa, set, 1, NULL, &g, NULL, 0, NULL, &set_done));
        CHECK(clEnqueueNDRangeKernel(qb, two, 1, NULL, &g, NULL, 1, &set_done, &doubled));
        CHECK(clWaitForEvents(1, &doubled));
        cl_ulong set_end, doubled_start;
        CHECK(clGetEventProfilingInfo(set_done, CL_PROFILING_COMMAND_END, sizeof set_end, &set_end, NULL));
        CHECK(clGetEventProfilingInfo(doubled, CL_PROFILING_COMMAND_START, sizeof doubled_start, &doubled_start, NULL));
        printf("round %d: the waiting kernel started %lld ns after the awaited one ended\n", round,
               (long long)(doubled_start - set_end));
        EXPECT(doubled_start >= set_end);
        CHECK(clFinish(qa));
        CHECK(clReleaseEvent(set_done));
        CHECK(clReleaseEvent(doubled));
    }
    CHECK(clEnqueueReadBuffer(qb, Z, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 1 << rounds);
    CHECK(clEnqueueReadBuffer(qa, X, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 1 + i + p);
}

/* Two daemons, events released and made again: a daemon event id recorded again would let B
 * take an earlier round's completion notice for this round's. */
static int events_again(void) {
    waits_in_order(4);
    printf("events_again ok\n");
    return 0;
}

/* Two devices of one daemon (its PoCL serves two CPU devices): the daemon's two device queues
 * run beside each other, so the wait must be posted to it. */
static int same_daemon(void) {
    waits_in_order(1);
    printf("same_daemon ok\n");
    return 0;
}

/* A kernel released by the application while a command that uses it is held behind a user
 * event: the command still runs (the specification keeps the kernel for the commands that
 * use it), as pyopencl does with the kernel objects it makes for each call. */
static int held_release(void) {
    setup(0);
    cl_int err;
    enum { N = 4096 };
    float x[N], back[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &err); CHECK(err);
    cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
    cl_kernel k = kernel("scale");
    float factor = 2.0f;
    CHECK(clSetKernelArg(k, 0, sizeof X, &X));
    CHECK(clSetKernelArg(k, 1, sizeof factor, &factor));
    size_t g = N;
    cl_event scaled;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 1, &gate, &scaled));
    CHECK(clReleaseKernel(k));
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clFinish(q));
    cl_int st;
    CHECK(clGetEventInfo(scaled, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    EXPECT(st == CL_COMPLETE);
    CHECK(clEnqueueReadBuffer(q, X, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(back[i] == 2.0f * x[i]);
    CHECK(clReleaseEvent(scaled));
    CHECK(clReleaseEvent(gate));
    CHECK(clReleaseMemObject(X));
    printf("held release ok\n");
    return 0;
}

static int kill_wait(void) {
    setup(0);
    cl_int err;
    cl_mem X = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096 * 4, NULL, &err); CHECK(err);
    cl_kernel k = kernel("spin");
    int n = 2000000000;
    CHECK(clSetKernelArg(k, 0, sizeof X, &X));
    CHECK(clSetKernelArg(k, 1, sizeof n, &n));
    size_t g = 4096;
    cl_event e;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, &e));
    int calls = 0;
    CHECK(clSetEventCallback(e, CL_COMPLETE, on_done, &calls));
    printf("READY\n");
    fflush(stdout);
    /* The harness kills the daemon now; clFinish must fail within the timeout. */
    cl_int f = clFinish(q);
    printf("clFinish = %d\n", f);
    EXPECT(f != CL_SUCCESS);
    cl_int st;
    CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    printf("status = %d\n", st);
    EXPECT(st < 0);
    for (int i = 0; i < 500 && calls == 0; i++) usleep(10000);
    EXPECT(calls == 1 && callback_status < 0);
    printf("kill ok\n");
    return 0;
}

static int no_platform(void) {
    cl_platform_id ps[16];
    cl_uint n = 0;
    cl_int e = clGetPlatformIDs(16, ps, &n);
    for (cl_uint i = 0; e == CL_SUCCESS && i < n; i++) {
        char name[128] = {0};
        CHECK(clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof name, name, NULL));
        EXPECT(strcmp(name, "sucl") != 0);
    }
    printf("no sucl platform ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: cltest SCENARIO\n"); return 2; }
    const char *s = argv[1];
    if (!strcmp(s, "info")) return info();
    if (!strcmp(s, "vadd")) return vadd();
    if (!strcmp(s, "ndrange")) return ndrange();
    if (!strcmp(s, "buffers")) return buffers();
    if (!strcmp(s, "events")) return events();
    if (!strcmp(s, "held_release")) return held_release();
    if (!strcmp(s, "build_fail")) return build_fail();
    if (!strcmp(s, "bad_input")) return bad_input();
    if (!strcmp(s, "compile_link")) return compile_link();
    if (!strcmp(s, "copy_rect_overlap")) return copy_rect_overlap();
    if (!strcmp(s, "mem_limit") && argc > 2) return mem_limit(argv[2]);
    if (!strcmp(s, "multi")) return multi();
    if (!strcmp(s, "overlap")) return overlap();
    if (!strcmp(s, "same_daemon")) return same_daemon();
    if (!strcmp(s, "events_again")) return events_again();
    if (!strcmp(s, "kill")) return kill_wait();
    if (!strcmp(s, "no_platform")) return no_platform();
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
}
