// Every call of sucl/sycl.hpp on sycl::buffer and on USM, each result checked against a serial
// reference computed here. The inputs are written by kernels and the results read by kernels
// (each adds 1), so a call out of order with them shows as a wrong value.
//
//     sucl run -n 3 -- ./calls
//
// Exits 0 when every result is right, 1 when some are wrong (listed on stderr), 2 when a call
// throws.
#include <sucl/sycl.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace s = ::sycl;
namespace ss = sucl::sycl;

namespace {

long wrong = 0;
int me = -1;

template <class T> void expect_eq(const std::vector<T> &got, const std::vector<T> &want, const std::string &what) {
    if (got.size() < want.size()) {
        std::fprintf(stderr, "rank %d: wrong: %s: %zu elements, want %zu\n", me, what.c_str(), got.size(), want.size());
        wrong++;
        return;
    }
    for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i]) {
            if (wrong < 30)
                std::fprintf(stderr, "rank %d: wrong: %s [%zu] = %g, want %g\n", me, what.c_str(), i, double(got[i]),
                             double(want[i]));
            wrong++;
        }
}

void expect(bool ok, const std::string &what) {
    if (!ok) {
        std::fprintf(stderr, "rank %d: wrong: %s\n", me, what.c_str());
        wrong++;
    }
}

// The value rank p contributes at element k.
template <class T> T v(int p, size_t k) { return T((p + 1) * 10 + int(k % 7)); }

template <class T> std::vector<T> plus_one(std::vector<T> x) {
    for (T &e : x) e = T(e + T(1));
    return x;
}

constexpr int kSentinel = 99;

// Runs one call on buffers and on USM: `in` is written into the send memory by a kernel, the
// receive memory (`out_len` elements) starts at a sentinel, `call_buf` / `call_usm` make the
// call, a kernel adds 1 to the received elements, and the first `want.size()` of them must be
// `want` + 1 (`want` empty: nothing checked on this rank).
template <class T, class BufCall, class UsmCall>
void both(s::queue &q, const std::string &what, const std::vector<T> &in, size_t out_len, const std::vector<T> &want,
          BufCall call_buf, UsmCall call_usm) {
    const size_t n_in = std::max<size_t>(in.size(), 1), n_out = std::max<size_t>(out_len, 1);
    std::vector<T> padded(in);
    padded.resize(n_in);
    {
        s::buffer<T> src(padded.data(), s::range<1>(n_in));
        s::buffer<T> send{s::range<1>(n_in)}, recv{s::range<1>(n_out)};
        q.submit([&](s::handler &h) {
            s::accessor a(src, h, s::read_only);
            s::accessor b(send, h, s::write_only, s::no_init);
            h.parallel_for(s::range<1>(n_in), [=](s::id<1> i) { b[i] = a[i]; });
        });
        q.submit([&](s::handler &h) {
            s::accessor b(recv, h, s::write_only, s::no_init);
            h.parallel_for(s::range<1>(n_out), [=](s::id<1> i) { b[i] = T(kSentinel); });
        });
        call_buf(send, recv);
        q.submit([&](s::handler &h) {
            s::accessor b(recv, h, s::read_write);
            h.parallel_for(s::range<1>(n_out), [=](s::id<1> i) { b[i] = T(b[i] + T(1)); });
        });
        s::host_accessor r(recv, s::read_only);
        expect_eq(std::vector<T>(r.begin(), r.end()), plus_one(want), what + " (buffer)");
    }
    {
        T *send = s::malloc_shared<T>(n_in, q), *recv = s::malloc_shared<T>(n_out, q);
        s::event filled = q.memcpy(send, padded.data(), n_in * sizeof(T));
        s::event cleared = q.fill(recv, T(kSentinel), n_out);
        s::event done = call_usm(send, recv, std::vector<s::event>{filled, cleared});
        q.submit([&](s::handler &h) {
             h.depends_on(done);
             h.parallel_for(s::range<1>(n_out), [=](s::id<1> i) { recv[i] = T(recv[i] + T(1)); });
         }).wait();
        expect_eq(std::vector<T>(recv, recv + n_out), plus_one(want), what + " (USM)");
        s::free(send, q);
        s::free(recv, q);
    }
}

constexpr size_t kCount = 5;

template <class T> void all_reduce(s::queue &q, ss::communicator &c) {
    const int n = c.size();
    std::vector<T> in(kCount), want(kCount, T(0)), wmax(kCount, T(0));
    for (size_t i = 0; i < kCount; i++) in[i] = v<T>(me, i);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < kCount; i++) {
            want[i] = T(want[i] + v<T>(p, i));
            wmax[i] = std::max(wmax[i], v<T>(p, i));
        }
    both<T>(q, "all_reduce sum", in, kCount, want, [&](auto &sb, auto &rb) { return c.all_reduce(sb, rb, kCount, ss::op::sum); },
            [&](T *sp, T *rp, auto deps) { return c.all_reduce(sp, rp, kCount, ss::op::sum, deps); });
    both<T>(q, "all_reduce max", in, kCount, wmax, [&](auto &sb, auto &rb) { return c.all_reduce(sb, rb, kCount, ss::op::max); },
            [&](T *sp, T *rp, auto deps) { return c.all_reduce(sp, rp, kCount, ss::op::max, deps); });
}

void collectives(s::queue &q, ss::communicator &c) {
    const int n = c.size();
    all_reduce<int32_t>(q, c);
    all_reduce<uint64_t>(q, c);
    all_reduce<float>(q, c);
    all_reduce<double>(q, c);
    all_reduce<int8_t>(q, c);

    using T = double;
    std::vector<T> mine(kCount), all(kCount * n), sum(kCount, 0);
    for (size_t i = 0; i < kCount; i++) mine[i] = v<T>(me, i);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < kCount; i++) {
            all[p * kCount + i] = v<T>(p, i);
            sum[i] += v<T>(p, i);
        }

    // In place: one buffer / one pointer as send and recv.
    {
        std::vector<T> copy = mine; // the buffer writes its result back into it
        s::buffer<T> b(copy.data(), s::range<1>(kCount));
        c.all_reduce(b, b, kCount, ss::op::sum);
        s::host_accessor r(b);
        expect_eq(std::vector<T>(r.begin(), r.end()), sum, "all_reduce in place (buffer)");
        T *p = s::malloc_shared<T>(kCount, q);
        std::copy(mine.begin(), mine.end(), p);
        c.all_reduce(p, p, kCount, ss::op::sum).wait();
        expect_eq(std::vector<T>(p, p + kCount), sum, "all_reduce in place (USM)");
        s::free(p, q);
    }
    // A 2-D buffer is its elements in row-major order.
    {
        std::vector<int32_t> grid(6);
        for (size_t i = 0; i < 6; i++) grid[i] = v<int32_t>(me, i);
        s::buffer<int32_t, 2> b(grid.data(), s::range<2>(2, 3));
        c.all_reduce(b, b, 6, ss::op::sum);
        s::host_accessor r(b);
        std::vector<int32_t> want(6, 0);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < 6; i++) want[i] += v<int32_t>(p, i);
        expect_eq(std::vector<int32_t>(r.begin(), r.end()), want, "all_reduce on a 2-D buffer");
    }

    const int root = n - 1;
    std::vector<T> bcast_in = me == root ? mine : std::vector<T>(kCount, T(kSentinel)), bcast_want(kCount);
    for (size_t i = 0; i < kCount; i++) bcast_want[i] = v<T>(root, i);
    // broadcast is in place: the "send" memory is the buffer; the callbacks copy it to recv.
    both<T>(q, "broadcast", bcast_in, kCount, bcast_want,
            [&](auto &sb, auto &rb) {
                c.broadcast(sb, kCount, root);
                return q.submit([&](s::handler &h) {
                    s::accessor a(sb, h, s::read_only);
                    s::accessor b(rb, h, s::write_only);
                    h.parallel_for(s::range<1>(kCount), [=](s::id<1> i) { b[i] = a[i]; });
                });
            },
            [&](T *sp, T *rp, auto deps) {
                s::event e = c.broadcast(sp, kCount, root, deps);
                return q.memcpy(rp, sp, kCount * sizeof(T), e);
            });

    std::vector<T> reduce_want = me == root ? sum : std::vector<T>(kCount, T(kSentinel));
    both<T>(q, "reduce", mine, kCount, reduce_want,
            [&](auto &sb, auto &rb) { return c.reduce(sb, rb, kCount, ss::op::sum, root); },
            [&](T *sp, T *rp, auto deps) { return c.reduce(sp, rp, kCount, ss::op::sum, root, deps); });

    std::vector<T> gather_want = me == root ? all : std::vector<T>(kCount * n, T(kSentinel));
    both<T>(q, "gather", mine, kCount * n, gather_want, [&](auto &sb, auto &rb) { return c.gather(sb, rb, kCount, root); },
            [&](T *sp, T *rp, auto deps) { return c.gather(sp, rp, kCount, root, deps); });

    both<T>(q, "all_gather", mine, kCount * n, all, [&](auto &sb, auto &rb) { return c.all_gather(sb, rb, kCount); },
            [&](T *sp, T *rp, auto deps) { return c.all_gather(sp, rp, kCount, deps); });

    // scatter: root's block j holds v(j, ...).
    std::vector<T> scatter_in = me == root ? all : std::vector<T>{};
    both<T>(q, "scatter", scatter_in, kCount, mine, [&](auto &sb, auto &rb) { return c.scatter(sb, rb, kCount, root); },
            [&](T *sp, T *rp, auto deps) { return c.scatter(sp, rp, kCount, root, deps); });

    // all_to_all: block j of rank i holds 1000 i + 10 j + k; rank j's block i gets it.
    std::vector<int64_t> a2a_in(kCount * n), a2a_want(kCount * n);
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < kCount; k++) {
            a2a_in[j * kCount + k] = 1000 * me + 10 * j + int64_t(k);
            a2a_want[j * kCount + k] = 1000 * j + 10 * me + int64_t(k);
        }
    both<int64_t>(q, "all_to_all", a2a_in, kCount * n, a2a_want,
                  [&](auto &sb, auto &rb) { return c.all_to_all(sb, rb, kCount); },
                  [&](int64_t *sp, int64_t *rp, auto deps) { return c.all_to_all(sp, rp, kCount, deps); });

    // reduce_scatter: every rank's size × count elements summed; rank r keeps block r.
    std::vector<int32_t> rs_in(kCount * n), rs_want(kCount, 0);
    for (size_t k = 0; k < rs_in.size(); k++) rs_in[k] = v<int32_t>(me, k) + int32_t(k);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < kCount; i++) rs_want[i] += v<int32_t>(p, me * kCount + i) + int32_t(me * kCount + i);
    both<int32_t>(q, "reduce_scatter", rs_in, kCount, rs_want,
                  [&](auto &sb, auto &rb) { return c.reduce_scatter(sb, rb, kCount, ss::op::sum); },
                  [&](int32_t *sp, int32_t *rp, auto deps) { return c.reduce_scatter(sp, rp, kCount, ss::op::sum, deps); });

    c.barrier().wait();
}

void v_collectives(s::queue &q, ss::communicator &c) {
    const int n = c.size();
    const int root = 0;
    using T = float;
    // Rank r contributes r + 1 elements; blocks laid out with a gap of one element.
    std::vector<size_t> counts(n), displs(n);
    size_t end = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = size_t(r + 1);
        displs[r] = end + 1;
        end = displs[r] + counts[r];
    }
    std::vector<T> mine(counts[me]);
    for (size_t k = 0; k < mine.size(); k++) mine[k] = v<T>(me, k);
    std::vector<T> laid(end, T(kSentinel));
    for (int r = 0; r < n; r++)
        for (size_t k = 0; k < counts[r]; k++) laid[displs[r] + k] = v<T>(r, k);

    std::vector<T> gv_want = me == root ? laid : std::vector<T>(end, T(kSentinel));
    both<T>(q, "gatherv", mine, end, gv_want, [&](auto &sb, auto &rb) { return c.gatherv(sb, rb, counts, displs, root); },
            [&](T *sp, T *rp, auto deps) { return c.gatherv(sp, rp, counts, displs, root, deps); });

    both<T>(q, "all_gatherv", mine, end, laid, [&](auto &sb, auto &rb) { return c.all_gatherv(sb, rb, counts, displs); },
            [&](T *sp, T *rp, auto deps) { return c.all_gatherv(sp, rp, counts, displs, deps); });

    std::vector<T> sv_in = me == root ? laid : std::vector<T>{};
    both<T>(q, "scatterv", sv_in, counts[me], mine, [&](auto &sb, auto &rb) { return c.scatterv(sb, counts, displs, rb, root); },
            [&](T *sp, T *rp, auto deps) { return c.scatterv(sp, counts, displs, rp, root, deps); });

    // all_to_allv: rank i sends i + j + 1 elements to rank j.
    std::vector<size_t> table(n * n), sd(n), rd(n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) table[i * n + j] = size_t(i + j + 1);
    size_t se = 0, re = 0;
    for (int j = 0; j < n; j++) {
        sd[j] = se;
        se += table[me * n + j];
        rd[j] = re;
        re += table[j * n + me];
    }
    std::vector<uint32_t> as(se), awant(re);
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < table[me * n + j]; k++) as[sd[j] + k] = 10000u * me + 100u * j + k;
    for (int j = 0; j < n; j++)
        for (size_t k = 0; k < table[j * n + me]; k++) awant[rd[j] + k] = 10000u * j + 100u * me + k;
    both<uint32_t>(q, "all_to_allv", as, re, awant, [&](auto &sb, auto &rb) { return c.all_to_allv(sb, sd, rb, rd, table); },
                   [&](uint32_t *sp, uint32_t *rp, auto deps) { return c.all_to_allv(sp, sd, rp, rd, table, deps); });
}

// Point to point around a ring: rank r sends to r + 1 and receives from r - 1.
void point_to_point(s::queue &q, ss::communicator &c) {
    const int n = c.size(), right = (me + 1) % n, left = (me + n - 1) % n;
    using T = int32_t;
    std::vector<T> mine(kCount), from_left(kCount), room(kCount + 2);
    for (size_t k = 0; k < kCount; k++) {
        mine[k] = v<T>(me, k);
        from_left[k] = v<T>(left, k);
    }
    // Room for two more elements than arrive: the received count says kCount.
    size_t got_buf = 0, got_usm = 0;
    both<T>(q, "sendrecv", mine, kCount + 2, from_left,
            [&](auto &sb, auto &rb) { return c.sendrecv(sb, kCount, right, rb, kCount + 2, left, 5, &got_buf); },
            [&](T *sp, T *rp, auto deps) { return c.sendrecv(sp, kCount, right, rp, kCount + 2, left, 5, &got_usm, deps); });
    expect(got_buf == kCount && got_usm == kCount,
           "sendrecv received " + std::to_string(got_buf) + " / " + std::to_string(got_usm) + " elements");

    // isend + irecv, completed by one wait.
    both<T>(q, "isend/irecv", mine, kCount, from_left,
            [&](auto &sb, auto &rb) {
                ss::request rr, sr;
                c.irecv(rb, kCount, left, 6, rr);
                c.isend(sb, kCount, right, 6, sr);
                return c.wait({rr, sr});
            },
            [&](T *sp, T *rp, auto deps) {
                ss::request rr, sr;
                c.irecv(rp, kCount, left, 6, rr, deps);
                c.isend(sp, kCount, right, 6, sr, deps);
                return c.wait({rr, sr});
            });

    if (n < 2) return; // blocking send and recv need a partner
    // Blocking send and recv: even ranks send first, odd ranks receive first (no cycle).
    got_buf = got_usm = 0;
    both<T>(q, "send/recv", mine, kCount + 2, from_left,
            [&](auto &sb, auto &rb) {
                if (me % 2 == 0) {
                    c.send(sb, kCount, right, 7);
                    return c.recv(rb, kCount + 2, left, 7, &got_buf);
                }
                c.recv(rb, kCount + 2, left, 7, &got_buf);
                return c.send(sb, kCount, right, 7);
            },
            [&](T *sp, T *rp, auto deps) {
                if (me % 2 == 0) {
                    c.send(sp, kCount, right, 7, deps);
                    return c.recv(rp, kCount + 2, left, 7, &got_usm, deps);
                }
                c.recv(rp, kCount + 2, left, 7, &got_usm, deps);
                return c.send(sp, kCount, right, 7, deps);
            });
    c.wait();
    expect(got_buf == kCount && got_usm == kCount,
           "recv received " + std::to_string(got_buf) + " / " + std::to_string(got_usm) + " elements");
}

// split into halves, and a second queue of the same device through on().
void communicators(s::queue &q, ss::communicator &c) {
    const int n = c.size();
    int color = me < n / 2 ? 0 : 1, lo = color == 0 ? 0 : n / 2, hi = color == 0 ? n / 2 : n;
    std::optional<ss::communicator> half = c.split(color, me);
    expect(half.has_value(), "split gave no communicator");
    if (!half) return;
    expect(half->size() == hi - lo && half->rank() == me - lo,
           "split: rank " + std::to_string(half->rank()) + " of " + std::to_string(half->size()));
    s::queue other(q.get_device());
    ss::communicator on_other = half->on(other);
    int32_t x = me, want = 0;
    for (int p = lo; p < hi; p++) want += p;
    {
        s::buffer<int32_t> b(&x, s::range<1>(1));
        on_other.all_reduce(b, b, 1, ss::op::sum);
    }
    expect(x == want, "all_reduce on a split communicator through another queue: " + std::to_string(x) + ", want " +
                          std::to_string(want));
    std::optional<ss::communicator> none = c.split(SUCL_UNDEFINED, 0);
    expect(!none.has_value(), "split with SUCL_UNDEFINED gave a communicator");
}

} // namespace

int main(int argc, char **argv) {
    if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
        std::printf("calls: every call of sucl/sycl.hpp on sycl::buffer and USM, each result checked\n"
                    "against a serial reference; inputs written and results read by kernels. No arguments.\n\n"
                    "example: sucl run -n 3 -- ./calls\n");
        return 0;
    }
    try {
        s::queue q;
        ss::communicator world(q);
        me = world.rank();
        collectives(q, world);
        v_collectives(q, world);
        point_to_point(q, world);
        communicators(q, world);
        world.wait();
    } catch (const ss::error &e) {
        std::fprintf(stderr, "rank %d: %s (%s)\n", me, e.what(), sucl_result_name(e.code()));
        return 2;
    }
    if (wrong) {
        std::fprintf(stderr, "rank %d: %ld wrong results\n", me, wrong);
        return 1;
    }
    std::printf("rank %d: every result right\n", me);
    return 0;
}
