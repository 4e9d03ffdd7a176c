// sucl's C API from C++: a small RAII owner for the communicator, typed calls through a
// dtype trait, and every result checked against a serial reference computed here.
//
//     sucl run -n 3 -- ./collectives_cpp
//
// Exits 0 when every result is right, 1 when some are wrong (listed on stderr), 2 when a
// call fails.
#include <sucl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// A failed call, with sucl's code and message.
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(sucl_result rc, const char *what) {
    if (rc != SUCL_OK) throw Failure(std::string(what) + ": " + sucl_result_name(rc) + ": " + sucl_last_error());
}

template <class T> constexpr sucl_dtype dtype_of();
template <> constexpr sucl_dtype dtype_of<int32_t>() { return SUCL_INT32; }
template <> constexpr sucl_dtype dtype_of<uint64_t>() { return SUCL_UINT64; }
template <> constexpr sucl_dtype dtype_of<float>() { return SUCL_FLOAT32; }
template <> constexpr sucl_dtype dtype_of<double>() { return SUCL_FLOAT64; }

// Owns a communicator handle; frees it when it goes out of scope.
class Comm {
  public:
    explicit Comm(sucl_comm h) : h_(h) {
        check(sucl_comm_rank(h_, &rank_), "sucl_comm_rank");
        check(sucl_comm_size(h_, &size_), "sucl_comm_size");
    }
    static Comm world() {
        sucl_comm h;
        check(sucl_init(&h), "sucl_init");
        return Comm(h);
    }
    Comm(const Comm &) = delete;
    Comm(Comm &&o) noexcept : h_(o.h_), rank_(o.rank_), size_(o.size_) { o.h_ = SUCL_COMM_NULL; }
    ~Comm() {
        if (h_ != SUCL_COMM_NULL && sucl_comm_free(h_) != SUCL_OK) std::fprintf(stderr, "sucl_comm_free: %s\n", sucl_last_error());
    }
    int rank() const { return rank_; }
    int size() const { return size_; }
    sucl_comm handle() const { return h_; }

    template <class T> void all_reduce(const std::vector<T> &s, std::vector<T> &r, sucl_op op) const {
        check(sucl_all_reduce(h_, s.data(), r.data(), s.size(), dtype_of<T>(), op), "sucl_all_reduce");
    }
    template <class T> void all_gather(const std::vector<T> &s, std::vector<T> &r) const {
        check(sucl_all_gather(h_, s.data(), r.data(), s.size(), dtype_of<T>()), "sucl_all_gather");
    }
    template <class T> void reduce_scatter(const std::vector<T> &s, std::vector<T> &r, sucl_op op) const {
        check(sucl_reduce_scatter(h_, s.data(), r.data(), r.size(), dtype_of<T>(), op), "sucl_reduce_scatter");
    }
    template <class T> void broadcast(std::vector<T> &b, int root) const {
        check(sucl_broadcast(h_, b.data(), b.size(), dtype_of<T>(), root), "sucl_broadcast");
    }
    template <class T>
    void all_to_allv(const std::vector<T> &s, const std::vector<size_t> &sd, std::vector<T> &r, const std::vector<size_t> &rd,
                     const std::vector<size_t> &counts) const {
        check(sucl_all_to_allv(h_, s.data(), sd.data(), r.data(), rd.data(), counts.data(), dtype_of<T>()), "sucl_all_to_allv");
    }
    Comm split(int color, int key) const {
        sucl_comm h;
        check(sucl_comm_split(h_, color, key, &h), "sucl_comm_split");
        return Comm(h);
    }

  private:
    sucl_comm h_;
    int rank_ = 0, size_ = 0;
};

long wrong = 0;

template <class T> void expect_eq(const std::vector<T> &got, const std::vector<T> &want, const char *what, int rank) {
    for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i]) {
            if (wrong < 20)
                std::fprintf(stderr, "rank %d: wrong: %s [%zu] = %g, want %g\n", rank, what, i, double(got[i]), double(want[i]));
            wrong++;
        }
}

constexpr size_t kCount = 6;

// The value rank p contributes at element k.
template <class T> T v(int p, size_t k) { return T((p + 1) * 100 + int(k)); }

template <class T> void sums(const Comm &c) {
    std::vector<T> s(kCount), r(kCount), want(kCount, T(0));
    for (size_t i = 0; i < kCount; i++) s[i] = v<T>(c.rank(), i);
    for (int p = 0; p < c.size(); p++)
        for (size_t i = 0; i < kCount; i++) want[i] = T(want[i] + v<T>(p, i));
    c.all_reduce(s, r, SUCL_SUM);
    expect_eq(r, want, "all_reduce sum", c.rank());
}

void run(const Comm &c) {
    const int n = c.size(), me = c.rank();
    sums<int32_t>(c);
    sums<uint64_t>(c);
    sums<float>(c);
    sums<double>(c);

    std::vector<double> s(kCount), g(kCount * n), want(kCount * n);
    for (size_t i = 0; i < kCount; i++) s[i] = v<double>(me, i);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < kCount; i++) want[p * kCount + i] = v<double>(p, i);
    c.all_gather(s, g);
    expect_eq(g, want, "all_gather", me);

    std::vector<int32_t> rs(kCount * n), rr(kCount), rwant(kCount, 0);
    for (size_t k = 0; k < rs.size(); k++) rs[k] = v<int32_t>(me, k);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < kCount; i++) rwant[i] += v<int32_t>(p, me * kCount + i);
    c.reduce_scatter(rs, rr, SUCL_SUM);
    expect_eq(rr, rwant, "reduce_scatter", me);

    std::vector<float> b(kCount, me == n - 1 ? 2.5f : 0.f), bwant(kCount, 2.5f);
    c.broadcast(b, n - 1);
    expect_eq(b, bwant, "broadcast", me);

    // all_to_allv: rank i sends i + j + 1 elements to rank j.
    std::vector<size_t> counts(n * n), sd(n), rd(n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) counts[i * n + j] = size_t(i + j + 1);
    size_t se = 0, re = 0;
    for (int j = 0; j < n; j++) {
        sd[j] = se;
        se += counts[me * n + j];
        rd[j] = re;
        re += counts[j * n + me];
    }
    std::vector<uint64_t> as(se), ar(re), awant(re);
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < counts[me * n + j]; k++) as[sd[j] + k] = 10000u * me + 100u * j + k;
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < counts[j * n + me]; k++) awant[rd[j] + k] = 10000u * j + 100u * me + k;
    c.all_to_allv(as, sd, ar, rd, counts);
    expect_eq(ar, awant, "all_to_allv", me);

    // Halves: [0, n/2) and [n/2, n), each summing its world ranks.
    int color = me < n / 2 ? 0 : 1;
    Comm half = c.split(color, me);
    int lo = color == 0 ? 0 : n / 2, hi = color == 0 ? n / 2 : n;
    std::vector<int32_t> x{me}, sum(1), swant{0};
    for (int p = lo; p < hi; p++) swant[0] += p;
    half.all_reduce(x, sum, SUCL_SUM);
    expect_eq(sum, swant, "split all_reduce", me);
    if (half.size() != hi - lo || half.rank() != me - lo) {
        std::fprintf(stderr, "rank %d: wrong: split rank %d of %d\n", me, half.rank(), half.size());
        wrong++;
    }
    check(sucl_barrier(c.handle()), "sucl_barrier");
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
        std::printf("collectives_cpp: sucl's C API from C++ (RAII communicator, typed calls), every\n"
                    "result checked against a serial reference. No arguments.\n\n"
                    "example: sucl run -n 3 -- ./collectives_cpp\n");
        return 0;
    }
    int rank = -1;
    try {
        Comm world = Comm::world();
        rank = world.rank();
        run(world);
    } catch (const Failure &f) {
        std::fprintf(stderr, "rank %d: %s\n", rank, f.what());
        return 2;
    }
    if (wrong) {
        std::fprintf(stderr, "rank %d: %ld wrong results\n", rank, wrong);
        return 1;
    }
    std::printf("rank %d: every result right\n", rank);
    return 0;
}
