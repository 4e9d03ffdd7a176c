// Bad input through sucl/sycl.hpp: each case must throw sucl::sycl::error with the right code and
// a message that says what was wrong, before anything is submitted (the receive memory keeps its
// contents, the communicator keeps working). Then a failure while a call runs (a receive that
// nobody answers times out) must be thrown by wait() and by the next call. One process (a world
// of one) is enough:
//
//     ./bad_input
//
// Exits 0 when every case is handled, 1 otherwise (each miss listed on stderr).
#include <sucl/sycl.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace s = ::sycl;
namespace ss = sucl::sycl;

static_assert(std::is_base_of_v<std::runtime_error, ss::error>, "sucl::sycl::error is a std::runtime_error");

namespace {

long wrong = 0;

void miss(const std::string &what) {
    std::fprintf(stderr, "wrong: %s\n", what.c_str());
    wrong++;
}

// `f()` must throw sucl::sycl::error with `code` and a message containing `word`.
template <class F> void rejects(const char *what, sucl_result code, const char *word, F f) {
    try {
        f();
        miss(std::string(what) + ": no exception");
    } catch (const ss::error &e) {
        if (e.code() != code)
            miss(std::string(what) + ": code " + sucl_result_name(e.code()) + ", want " + sucl_result_name(code));
        if (!std::strstr(e.what(), word)) miss(std::string(what) + ": message \"" + e.what() + "\" lacks \"" + word + "\"");
    }
}

void expect(bool ok, const std::string &what) {
    if (!ok) miss(what);
}

constexpr double kUntouched = -7.0;

void too_small(ss::communicator &c) {
    s::buffer<double> four{s::range<1>(4)}, five{s::range<1>(5)}, recv{s::range<1>(4)};
    {
        s::host_accessor a(recv);
        for (auto &x : a) x = kUntouched;
    }
    rejects("all_reduce, recv too small", SUCL_ERR_INVALID_ARGUMENT, "recv holds 4 elements, the call needs 5",
            [&] { c.all_reduce(five, recv, 5, ss::op::sum); });
    rejects("all_reduce, send too small", SUCL_ERR_INVALID_ARGUMENT, "send holds 4 elements",
            [&] { c.all_reduce(four, recv, 5, ss::op::sum); });
    rejects("broadcast", SUCL_ERR_INVALID_ARGUMENT, "broadcast: buf holds 4", [&] { c.broadcast(four, 9, 0); });
    rejects("gather on the root", SUCL_ERR_INVALID_ARGUMENT, "gather: recv", [&] { c.gather(five, recv, 5, 0); });
    rejects("all_to_all", SUCL_ERR_INVALID_ARGUMENT, "all_to_all: send", [&] { c.all_to_all(four, recv, 5); });
    rejects("recv", SUCL_ERR_INVALID_ARGUMENT, "recv: buf holds 4", [&] { c.recv(recv, 5, 0, 1); });
    rejects("a block's end overflows", SUCL_ERR_INVALID_ARGUMENT, "overflows",
            [&] { c.all_gatherv(four, recv, {2}, {std::numeric_limits<size_t>::max() - 1}); });
    rejects("gatherv, counts of the wrong length", SUCL_ERR_INVALID_ARGUMENT, "gatherv: counts has 2 entries",
            [&] { c.gatherv(four, recv, {1, 1}, {0, 1}, 0); });
    rejects("all_gatherv, a block past the end", SUCL_ERR_INVALID_ARGUMENT, "all_gatherv: recv holds 4 elements, the call needs 6",
            [&] { c.all_gatherv(four, recv, {2}, {4}); });
    rejects("all_to_allv, a block past the end", SUCL_ERR_INVALID_ARGUMENT, "all_to_allv: send holds 4",
            [&] { c.all_to_allv(four, {3}, recv, {0}, {2}); });
    s::host_accessor a(recv);
    for (double x : a) expect(x == kUntouched, "a refused call wrote the receive buffer");
}

void usm(s::queue &q, ss::communicator &c) {
    double *p = s::malloc_shared<double>(4, q);
    rejects("USM NULL", SUCL_ERR_INVALID_ARGUMENT, "all_reduce: recv is NULL",
            [&] { c.all_reduce(p, static_cast<double *>(nullptr), 4, ss::op::sum); });
    // Memory of another context: refused wherever the SYCL implementation can tell. (AdaptiveCpp's
    // OpenMP backend reports every pointer as host USM of every context, so there it cannot.)
    s::queue elsewhere;
    double *other = s::malloc_device<double>(4, elsewhere);
    if (s::get_pointer_type(other, q.get_context()) == s::usm::alloc::unknown)
        rejects("USM of another context", SUCL_ERR_INVALID_ARGUMENT, "not a USM allocation of the queue's context",
                [&] { c.all_reduce(other, p, 4, ss::op::sum); });
    else
        std::printf("note: this SYCL implementation reports another context's USM as usable here; the verdicts below "
                    "are checked without the query\n");
    s::free(other, elsewhere);
    s::free(p, q);

    // The verdicts the query feeds, for every kind on both paths.
    using ss::detail::usm_verdict;
    auto says = [](std::optional<std::string> v, const char *word) { return v && v->find(word) != std::string::npos; };
    expect(says(usm_verdict(s::usm::alloc::unknown, ss::path::host, "x"), "not a USM allocation of the queue's context"),
           "unknown memory on the host path is refused");
    expect(says(usm_verdict(s::usm::alloc::unknown, ss::path::cuda, "x"), "another context"),
           "unknown memory on the device path is refused");
    expect(says(usm_verdict(s::usm::alloc::host, ss::path::cuda, "x"), "is host memory, but the communicator's device takes the "
                                                                         "device path"),
           "host USM on the device path is refused");
    for (auto kind : {s::usm::alloc::host, s::usm::alloc::device, s::usm::alloc::shared})
        expect(!usm_verdict(kind, ss::path::host, "x"), "USM of this context on the host path is accepted");
    for (auto kind : {s::usm::alloc::device, s::usm::alloc::shared})
        expect(!usm_verdict(kind, ss::path::cuda, "x"), "device and shared USM on the device path are accepted");
}

void queues(s::queue &q, ss::communicator &c) {
    // Another queue of the same device is fine.
    s::queue same(q.get_device());
    c.on(same).barrier().wait();
    bool tested = false;
    for (const s::device &d : s::device::get_devices()) {
        if (d == q.get_device()) continue;
        tested = true;
        rejects("a queue of another device", SUCL_ERR_INVALID_ARGUMENT, "is not the communicator's device",
                [&] { c.on(s::queue(d)); });
    }
    if (!tested) std::printf("note: this SYCL implementation has one device; a queue of another device cannot be made here\n");
    expect(!ss::detail::device_verdict(q.get_device(), same.get_device()), "the same device is accepted");
}

// A receive that nobody answers runs out of SUCL_TIMEOUT on the SYCL runtime's thread; wait()
// throws it, and so does the next call, which submits nothing.
void failure_while_running(ss::communicator &c) {
    s::buffer<double> b{s::range<1>(2)};
    s::event e = c.recv(b, 2, 0, 77);
    e.wait();
    rejects("wait() after a receive timed out", SUCL_ERR_TIMEOUT, "sucl_recv", [&] { c.wait(); });
    rejects("the next call after the failure", SUCL_ERR_TIMEOUT, "sucl_recv", [&] { c.barrier(); });
}

} // namespace

int main(int argc, char **argv) {
    if (argc > 1 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
        std::printf("bad_input: bad input to sucl/sycl.hpp must throw sucl::sycl::error before anything moves,\n"
                    "and a failure while a call runs must be thrown by wait(). One process, no arguments.\n\n"
                    "example: ./bad_input\n");
        return 0;
    }
    setenv("SUCL_TIMEOUT", "3", 1); // the unanswered receive gives up after 3 s
    try {
        s::queue q;
        ss::communicator c(q);
        too_small(c);
        usm(q, c);
        queues(q, c);
        // Refused calls left the communicator working.
        double x = 2.0;
        {
            s::buffer<double> b(&x, s::range<1>(1));
            c.all_reduce(b, b, 1, ss::op::sum);
        }
        expect(x == 2.0, "all_reduce after refused calls gave " + std::to_string(x));
        failure_while_running(c);
    } catch (const ss::error &e) {
        std::fprintf(stderr, "unexpected: %s\n", e.what());
        return 1;
    }
    if (wrong) {
        std::fprintf(stderr, "%ld cases wrong\n", wrong);
        return 1;
    }
    std::printf("every bad input refused\n");
    return 0;
}
