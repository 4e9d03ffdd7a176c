// The cost of the SYCL layer: an all_reduce of one double (8 B) through sucl/sycl.hpp (on USM
// and on a sycl::buffer, each submitted and waited for) beside the C call it wraps
// (sucl_all_reduce on the same communicator), alternating in rounds; and, as the floor of any
// command the SYCL runtime orders, an empty host command submitted and waited for.
//
//     sucl run -n 2 -- ./cost --iters 2000 --rounds 5
//
// Prints, per round, the mean µs per call of each (max over ranks), and the medians over rounds.
#include <sucl/sycl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace s = ::sycl;
namespace ss = sucl::sycl;

namespace {

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Mean seconds per call of `call` over `iters`, max over ranks (the C handle is free: the
// SYCL calls were waited for).
template <class F> double timed(ss::communicator &c, int iters, F call) {
    c.wait();
    ss::detail::check(sucl_barrier(c.handle()), "sucl_barrier");
    double t0 = seconds();
    for (int i = 0; i < iters; i++) call();
    double mine = (seconds() - t0) / iters, slowest = 0;
    c.wait();
    ss::detail::check(sucl_all_reduce(c.handle(), &mine, &slowest, 1, SUCL_FLOAT64, SUCL_MAX), "sucl_all_reduce");
    return slowest;
}

} // namespace

int main(int argc, char **argv) {
    int iters = 2000, rounds = 5;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::printf("cost: an 8-byte all_reduce through sucl/sycl.hpp (USM and buffer, submit + wait) beside the\n"
                        "C call sucl_all_reduce it wraps, and an empty SYCL host command (the runtime's floor), alternating\n"
                        "in rounds; mean µs per call, max over ranks.\n\n"
                        "options:\n  --iters N   calls per round and variant (default 2000)\n"
                        "  --rounds R  rounds (default 5)\n\nexample: sucl run -n 2 -- ./cost --iters 2000 --rounds 5\n");
            return 0;
        } else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
        else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "cost: unknown argument %s (see --help)\n", a.c_str());
            return 2;
        }
    }
    if (iters < 1 || rounds < 1) {
        std::fprintf(stderr, "cost: --iters and --rounds must be positive\n");
        return 2;
    }
    try {
        s::queue q;
        ss::communicator c(q);
        double host_in = c.rank() + 1.0, host_out = 0;
        double *in = s::malloc_shared<double>(1, q), *out = s::malloc_shared<double>(1, q);
        *in = host_in;
        s::buffer<double> bin(&host_in, s::range<1>(1)), bout(&host_out, s::range<1>(1));
        std::vector<double> c_us, usm_us, buf_us, empty_us;
        for (int r = 0; r < rounds; r++) {
            c_us.push_back(1e6 * timed(c, iters, [&] {
                ss::detail::check(sucl_all_reduce(c.handle(), in, out, 1, SUCL_FLOAT64, SUCL_SUM), "sucl_all_reduce");
            }));
            usm_us.push_back(1e6 * timed(c, iters, [&] { c.all_reduce(in, out, 1, ss::op::sum).wait(); }));
            buf_us.push_back(1e6 * timed(c, iters, [&] { c.all_reduce(bin, bout, 1, ss::op::sum).wait(); }));
            empty_us.push_back(1e6 * timed(c, iters, [&] {
                q.submit([&](s::handler &h) {
                     ss::detail::enqueue(h, ss::path::host, [](const ss::detail::where &, s::interop_handle &) {});
                 }).wait();
            }));
            if (c.rank() == 0)
                std::printf("round %d: C %.2f us, SYCL USM %.2f us, SYCL buffer %.2f us, empty SYCL command %.2f us\n", r,
                            c_us.back(), usm_us.back(), buf_us.back(), empty_us.back());
        }
        const double want = c.size() * (c.size() + 1) / 2.0;
        s::host_accessor got(bout);
        bool right = *out == want && got[0] == want;
        if (c.rank() == 0) {
            std::printf("| ranks | C sucl_all_reduce µs | SYCL USM µs | SYCL buffer µs | USM − C µs | buffer − C µs | empty SYCL "
                        "command µs |\n");
            std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
            double cm = median(c_us), um = median(usm_us), bm = median(buf_us), em = median(empty_us);
            std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", c.size(), cm, um, bm, um - cm, bm - cm, em);
            std::printf("results %s\n", right ? "right" : "WRONG");
        }
        s::free(in, q);
        s::free(out, q);
        return right ? 0 : 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "cost: %s\n", e.what());
        return 2;
    }
}
