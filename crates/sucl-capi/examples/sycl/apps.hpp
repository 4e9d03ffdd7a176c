// Shared by the Halo and Transpose applications (sucl and MPI variants): options, the grids'
// initial values, the stencil and the serial references the results are checked against.
#ifndef SUCL_SYCL_APPS_HPP
#define SUCL_SYCL_APPS_HPP

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace apps {

struct options {
    size_t n = 120;  // grid edge: n × n × n cells
    int steps = 50;  // timed steps (halo exchanges, or transposes)
    int warmup = 5;  // untimed steps before
    bool check = true;
    bool ahead = false; // submit every step at once instead of waiting for each (sucl variants)
};

// Parses --size, --steps, --warmup, --no-check (and --ahead where `can_ahead`); prints `usage`
// for --help and exits.
inline options parse(int argc, char **argv, const char *usage, bool can_ahead = false) {
    options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&](const char *what) {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value (see --help)\n", what);
                std::exit(2);
            }
            return std::strtol(argv[++i], nullptr, 10);
        };
        if (a == "--help" || a == "-h") {
            std::printf("%s", usage);
            std::exit(0);
        } else if (a == "--size") o.n = size_t(value("--size"));
        else if (a == "--steps") o.steps = int(value("--steps"));
        else if (a == "--warmup") o.warmup = int(value("--warmup"));
        else if (a == "--no-check") o.check = false;
        else if (a == "--ahead" && can_ahead) o.ahead = true;
        else {
            std::fprintf(stderr, "unknown argument %s (see --help)\n", a.c_str());
            std::exit(2);
        }
    }
    if (o.n < 2 || o.steps < 1 || o.warmup < 0) {
        std::fprintf(stderr, "--size must be at least 2, --steps at least 1, --warmup at least 0\n");
        std::exit(2);
    }
    return o;
}

#define SUCL_APP_OPTIONS                                                                                    \
    "options:\n"                                                                                            \
    "  --size N     grid of N x N x N floats, N a multiple of the number of ranks (default 120)\n"         \
    "  --steps S    timed steps (default 50)\n"                                                            \
    "  --warmup W   untimed steps before them (default 5)\n"                                                \
    "  --no-check   skip the comparison with the serial reference\n"

#define SUCL_APP_AHEAD_OPTION                                                                               \
    "  --ahead      submit every step at once (the SYCL runtime orders them) instead of waiting for each\n"

inline double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Cell (x, y, z) of an n × n grid of planes, x-major.
inline size_t at(size_t x, size_t y, size_t z, size_t n) { return (x * n + y) * n + z; }

inline float initial(size_t x, size_t y, size_t z) { return float((x * 7 + y * 3 + z * 5) % 17); }

// The 7-point average at (x, y, z) of a slab with ghost planes at x = 0 and x = nx + 1,
// periodic in y and z. The kernels and the serial reference both call it.
inline float stencil(const float *in, size_t x, size_t y, size_t z, size_t n) {
    size_t ym = (y + n - 1) % n, yp = (y + 1) % n, zm = (z + n - 1) % n, zp = (z + 1) % n;
    return (in[at(x, y, z, n)] + in[at(x - 1, y, z, n)] + in[at(x + 1, y, z, n)] + in[at(x, ym, z, n)] +
            in[at(x, yp, z, n)] + in[at(x, y, zm, n)] + in[at(x, y, zp, n)]) *
           (1.0f / 7.0f);
}

// The whole n³ grid (periodic in x too) after `steps` stencil steps, plane by plane.
inline std::vector<float> halo_reference(size_t n, int steps) {
    const size_t plane = n * n;
    std::vector<float> a((n + 2) * plane), b((n + 2) * plane);
    for (size_t x = 0; x < n; x++)
        for (size_t y = 0; y < n; y++)
            for (size_t z = 0; z < n; z++) a[at(x + 1, y, z, n)] = initial(x, y, z);
    for (int s = 0; s < steps; s++) {
        std::copy(a.begin() + n * plane, a.begin() + (n + 1) * plane, a.begin());   // ghost 0 = plane n - 1
        std::copy(a.begin() + plane, a.begin() + 2 * plane, a.begin() + (n + 1) * plane); // ghost n + 1 = plane 0
        for (size_t x = 1; x <= n; x++)
            for (size_t y = 0; y < n; y++)
                for (size_t z = 0; z < n; z++) b[at(x, y, z, n)] = stencil(a.data(), x, y, z, n);
        std::swap(a, b);
    }
    return std::vector<float>(a.begin() + plane, a.begin() + (n + 1) * plane);
}

// Counts the cells of `got` (planes x0 … of the grid) that differ from the reference by more
// than a rounding error.
inline long halo_wrong(const std::vector<float> &got, const std::vector<float> &want) {
    long wrong = 0;
    for (size_t i = 0; i < want.size(); i++)
        if (!(std::fabs(got[i] - want[i]) <= 1e-4f * (1.0f + std::fabs(want[i])))) {
            if (wrong < 5) std::fprintf(stderr, "wrong: cell %zu = %g, want %g\n", i, double(got[i]), double(want[i]));
            wrong++;
        }
    return wrong;
}

// Transpose: A (n × n × n, x-major) holds value(x, y, z); the result B holds B[y][x][z] = A[x][y][z].
inline float value(size_t x, size_t y, size_t z, size_t n) { return float(at(x, y, z, n) % 1000003); }

// Counts the cells of this rank's slab of B (planes y0 … y0 + ny - 1) that differ from a serial
// transpose of A.
inline long transpose_wrong(const std::vector<float> &b, size_t y0, size_t ny, size_t n) {
    std::vector<float> a(n * n * n);
    for (size_t x = 0; x < n; x++)
        for (size_t y = 0; y < n; y++)
            for (size_t z = 0; z < n; z++) a[at(x, y, z, n)] = value(x, y, z, n);
    long wrong = 0;
    for (size_t y = 0; y < ny; y++)
        for (size_t x = 0; x < n; x++)
            for (size_t z = 0; z < n; z++) {
                float want = a[at(x, y0 + y, z, n)], got = b[at(y, x, z, n)];
                if (got != want) {
                    if (wrong < 5) std::fprintf(stderr, "wrong: B[%zu][%zu][%zu] = %g, want %g\n", y0 + y, x, z, double(got), double(want));
                    wrong++;
                }
            }
    return wrong;
}

} // namespace apps

#endif
