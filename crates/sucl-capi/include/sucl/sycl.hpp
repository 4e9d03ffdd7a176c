// sucl/sycl.hpp: sucl for SYCL programs, header-only over the C API (sucl.h).
//
// A `sucl::sycl::communicator` is bound to a `sycl::queue`. Its calls take `sycl::buffer`s
// (submitted as command groups whose accessors order them after the kernels that write those
// buffers and before the kernels that read them) or USM pointers (with the events they depend
// on); each returns a `sycl::event`. Every call of a communicator is also ordered after its
// previous call, so ranks that submit the same calls in the same order run them in that order.
//
// The queue's device decides the path: a CPU device (AdaptiveCpp's OpenMP backend, DPC++'s or
// OpenCL's CPU devices) calls sucl's host functions; a device of a SYCL backend over CUDA
// (AdaptiveCpp's `cuda`, DPC++'s `ext_oneapi_cuda`) passes the native stream and device pointers
// to sucl's `_device` functions (NCCL, peer memory or staged serve them). Any other device is
// refused.
//
// Errors are `sucl::sycl::error` exceptions (a std::runtime_error with sucl's code and message).
// Bad input (a buffer too small for the count, a USM pointer of another context, host memory on
// the device path, a queue of another device) throws from the call itself, before anything is
// submitted. A failure while a call runs (a lost peer, a timeout, ranks that disagree) is kept
// by the communicator and thrown by its next call or by `wait()`; the communicator then runs no
// further operations. The guide: docs/guide/sycl.md.
#ifndef SUCL_SYCL_HPP
#define SUCL_SYCL_HPP

#include <sucl.h>

#include <sycl/sycl.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// The CUDA interop path, compiled only where the SYCL implementation has a CUDA backend.
#if defined(__ACPP__) && defined(SYCL_EXT_HIPSYCL_BACKEND_CUDA)
#define SUCL_SYCL_CUDA 1
#define SUCL_SYCL_CUDA_BACKEND ::sycl::backend::cuda
#elif !defined(__ACPP__) && defined(SYCL_EXT_ONEAPI_BACKEND_CUDA) && defined(SYCL_EXT_CODEPLAY_ENQUEUE_NATIVE_COMMAND)
#define SUCL_SYCL_CUDA 1
#define SUCL_SYCL_CUDA_BACKEND ::sycl::backend::ext_oneapi_cuda
#else
#define SUCL_SYCL_CUDA 0
#endif

namespace sucl::sycl {

namespace s = ::sycl;

/// A failed sucl call: sucl's result code and a message naming the call and what went wrong.
class error : public std::runtime_error {
  public:
    error(sucl_result code, const std::string &message) : std::runtime_error(message), code_(code) {}
    /// SUCL_ERR_INVALID_ARGUMENT, SUCL_ERR_TIMEOUT, ... (sucl.h).
    sucl_result code() const noexcept { return code_; }

  private:
    sucl_result code_;
};

/// A reduction operator.
enum class op : sucl_op { sum = SUCL_SUM, prod = SUCL_PROD, min = SUCL_MIN, max = SUCL_MAX, avg = SUCL_AVG };

/// sucl's element type for `T`: the 8/32/64-bit integers, `sycl::half`, float, double.
template <class T> constexpr sucl_dtype dtype_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return SUCL_FLOAT32;
    else if constexpr (std::is_same_v<U, double>) return SUCL_FLOAT64;
    else if constexpr (std::is_same_v<U, s::half>) return SUCL_FLOAT16;
    else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool>) {
        static_assert(sizeof(U) != 2, "sucl has no 16-bit integer type");
        if constexpr (sizeof(U) == 1) return std::is_signed_v<U> ? SUCL_INT8 : SUCL_UINT8;
        else if constexpr (sizeof(U) == 4) return std::is_signed_v<U> ? SUCL_INT32 : SUCL_UINT32;
        else return std::is_signed_v<U> ? SUCL_INT64 : SUCL_UINT64;
    } else {
        static_assert(sizeof(U) == 0, "sucl has no element type for this T");
        return -1;
    }
}

/// Which of sucl's functions serve a device: the host ones or the `_device` ones (CUDA).
enum class path { host, cuda };

namespace detail {

[[noreturn]] inline void invalid(const std::string &message) {
    throw error(SUCL_ERR_INVALID_ARGUMENT, "sucl::sycl: " + message);
}

// sucl_last_error() is per thread: read it on the thread that made the failed call.
inline error failure(sucl_result rc, const char *what) {
    return error(rc, std::string(what) + ": " + sucl_result_name(rc) + ": " + sucl_last_error());
}

inline void check(sucl_result rc, const char *what) {
    if (rc != SUCL_OK) throw failure(rc, what);
}

inline std::string device_name(const s::device &d) { return d.get_info<s::info::device::name>(); }

inline path path_of(const s::device &d) {
#if SUCL_SYCL_CUDA
    if (d.get_backend() == SUCL_SYCL_CUDA_BACKEND) return path::cuda;
#endif
    if (d.is_cpu()) return path::host;
    invalid("device '" + device_name(d) +
            "' is neither a CPU device nor a device of a SYCL backend over CUDA (sucl serves those two; see "
            "docs/guide/sycl.md)");
}

inline size_t times(size_t a, size_t b, const char *what) {
    if (b != 0 && a > std::numeric_limits<size_t>::max() / b) invalid(std::string(what) + ": element count overflows");
    return a * b;
}

// A buffer of `have` elements must hold `need`.
inline void need(size_t have, size_t need, const char *what) {
    if (have < need)
        invalid(std::string(what) + " holds " + std::to_string(have) + " elements, the call needs " + std::to_string(need));
}

// The end of the furthest block of a v-collective's table (0 when all are empty).
inline size_t blocks_end(const std::vector<size_t> &counts, const std::vector<size_t> &displs, const char *what) {
    size_t end = 0;
    for (size_t i = 0; i < counts.size(); i++) {
        if (counts[i] == 0) continue;
        if (displs[i] > std::numeric_limits<size_t>::max() - counts[i]) invalid(std::string(what) + ": a block's end overflows");
        end = std::max(end, displs[i] + counts[i]);
    }
    return end;
}

inline void table(const std::vector<size_t> &t, size_t entries, const char *what) {
    if (t.size() != entries)
        invalid(std::string(what) + " has " + std::to_string(t.size()) + " entries, the communicator needs " +
                std::to_string(entries));
}

/// Whether USM memory of kind `kind` (as sycl::get_pointer_type says, in the queue's context)
/// may go to a call on path `p`: the message why not, or nothing. Kept apart from the query so
/// that each verdict can be tested on any SYCL implementation.
inline std::optional<std::string> usm_verdict(s::usm::alloc kind, path p, const char *what) {
    if (kind == s::usm::alloc::unknown)
        return std::string(what) +
               " is not a USM allocation of the queue's context (memory of another context, or not from sycl::malloc_*)";
    if (p == path::cuda && kind == s::usm::alloc::host)
        return std::string(what) + " is host memory, but the communicator's device takes the device path: pass device "
                                   "or shared USM";
    return std::nullopt;
}

/// Whether a queue of device `q` may serve a communicator of device `comm`.
inline std::optional<std::string> device_verdict(const s::device &comm, const s::device &q) {
    if (comm == q) return std::nullopt;
    return "the queue's device '" + device_name(q) + "' is not the communicator's device '" + device_name(comm) + "'";
}

// Where an operation runs: the host path, or a native CUDA stream.
struct where {
    path p = path::host;
    void *stream = nullptr;
};

// The first failure of a communicator's operations. The commands hold it (not the state
// below, which holds their last event: that would be a cycle that never frees the handle).
struct failures {
    std::mutex lock;
    std::optional<error> first;

    void rethrow() {
        std::lock_guard<std::mutex> g(lock);
        if (first) throw *first;
    }
    bool any() {
        std::lock_guard<std::mutex> g(lock);
        return first.has_value();
    }
    // Runs one C call on the thread that executes the command, unless an earlier one failed
    // (its peers are then failing too: starting more would only wait out more timeouts).
    template <class Call> void run(const char *what, Call &&call) noexcept {
        {
            std::lock_guard<std::mutex> g(lock);
            if (first) return;
        }
        sucl_result rc;
        try {
            rc = call();
        } catch (const std::exception &e) {
            record(error(SUCL_ERR_INTERNAL, std::string(what) + ": " + e.what()));
            return;
        }
        if (rc != SUCL_OK) record(failure(rc, what));
    }
    void record(error e) noexcept {
        std::lock_guard<std::mutex> g(lock);
        if (!first) first.emplace(std::move(e));
    }
};

// What a communicator's copies share: the handle (freed by the last copy, once the last
// submitted operation ran: every operation goes after the one before), and the failures.
struct state {
    sucl_comm handle = SUCL_COMM_NULL;
    int rank = 0, size = 0;
    s::device device;
    path p = path::host;
    std::mutex chain_lock;
    std::optional<s::event> last;
    std::shared_ptr<failures> failed = std::make_shared<failures>();

    state(sucl_comm h, s::device d, path route) : handle(h), device(std::move(d)), p(route) {}
    state(const state &) = delete;
    state &operator=(const state &) = delete;
    ~state() {
        try {
            if (last) last->wait();
        } catch (...) {
            // Freeing goes on: sucl withdraws what is still posted on the communicator.
        }
        // A command that still ran after this would get SUCL_ERR_INVALID_HANDLE, never touch
        // freed memory: handles are checked integers.
        if (sucl_comm_free(handle) != SUCL_OK) std::fprintf(stderr, "sucl::sycl: sucl_comm_free: %s\n", sucl_last_error());
    }
};

// Puts host code `f(where, interop_handle)` in the command group: on AdaptiveCpp a custom
// operation (it has no host_task), on CUDA a native command on the queue's stream, elsewhere a
// host_task.
template <class F> void enqueue(s::handler &h, path p, F f) {
#if SUCL_SYCL_CUDA
    if (p == path::cuda) {
        auto on_stream = [f](s::interop_handle &ih) {
            where w{path::cuda, reinterpret_cast<void *>(ih.template get_native_queue<SUCL_SYCL_CUDA_BACKEND>())};
            f(w, ih);
        };
#ifdef __ACPP__
        h.AdaptiveCpp_enqueue_custom_operation(on_stream);
#else
        h.ext_codeplay_enqueue_native_command([on_stream](s::interop_handle ih) { on_stream(ih); });
#endif
        return;
    }
#endif
    (void)p;
#ifdef __ACPP__
    h.AdaptiveCpp_enqueue_custom_operation([f](s::interop_handle &ih) { f(where{}, ih); });
#else
    h.host_task([f](s::interop_handle ih) { f(where{}, ih); });
#endif
}

// The memory an accessor names, as the path sees it.
// (`value_type` is const for read accessors.)
template <class Acc> typename Acc::value_type *pointer(const where &w, s::interop_handle &ih, const Acc &acc) {
    using P = typename Acc::value_type *;
#if SUCL_SYCL_CUDA
    if (w.p == path::cuda) return reinterpret_cast<P>(ih.template get_native_mem<SUCL_SYCL_CUDA_BACKEND>(acc));
#endif
    (void)w;
#ifdef __ACPP__
    return P(ih.template get_native_mem<s::backend::omp>(acc));
#else
    (void)ih;
    return acc.template get_multi_ptr<s::access::decorated::no>().get_raw();
#endif
}

// A buffer argument: read, written or both (an accessor in the command group), or unused on
// this rank (no accessor, so no ordering; the pointer is NULL).
template <class T, int D, s::access_mode M> struct use {
    s::buffer<T, D> *buf;
    bool used;
    auto access(s::handler &h) const -> std::optional<s::accessor<T, D, M>> {
        if (!used) return std::nullopt;
        return s::accessor<T, D, M>(*buf, h);
    }
};
template <class T, int D> use<T, D, s::access_mode::read> in(s::buffer<T, D> &b, bool used = true) { return {&b, used}; }
template <class T, int D> use<T, D, s::access_mode::write> out(s::buffer<T, D> &b, bool used = true) { return {&b, used}; }
template <class T, int D> use<T, D, s::access_mode::read_write> inout(s::buffer<T, D> &b, bool used = true) {
    return {&b, used};
}

template <class Acc>
typename Acc::value_type *pointer_or_null(const where &w, s::interop_handle &ih, const std::optional<Acc> &acc) {
    return acc ? pointer(w, ih, *acc) : nullptr;
}

} // namespace detail

class communicator;

/// A non-blocking send or receive of the host path (`isend`, `irecv`), completed by
/// `communicator::wait`. After the wait's event completed, `count()` is the elements it moved.
class request {
  public:
    /// The elements the operation moved (received, for a receive); 0 before its wait ran.
    size_t count() const { return state_->count; }

  private:
    friend class communicator;
    struct state {
        sucl_request handle = SUCL_REQUEST_NULL;
        size_t count = 0;
    };
    std::shared_ptr<state> state_ = std::make_shared<state>();
    using body = std::function<void(const detail::where &)>;
    // Puts the command that completes the request in a command group: for a buffer request with
    // the buffer's accessor (captured, so that AdaptiveCpp finds it), so that the kernels
    // submitted after the wait touch the buffer only once the transfer completed.
    std::function<void(s::handler &, sucl::sycl::path, body)> enqueue_ = [](s::handler &h, sucl::sycl::path p, body b) {
        detail::enqueue(h, p, [b](const detail::where &w, s::interop_handle &) { b(w); });
    };
};

/// A communicator bound to a queue. Copies share the communicator (the last one frees it,
/// after its operations ran); `on(q)` gives a copy that submits to another queue of the device.
class communicator {
  public:
    /// Joins the job this process was started in (sucl_init: `sucl run`, torchrun, mpirun,
    /// Slurm, ...) with the world communicator, bound to `q`.
    explicit communicator(s::queue q) : queue_(std::move(q)) {
        detail::path_of(queue_.get_device()); // refuses a device sucl cannot serve, before joining
        sucl_comm h = SUCL_COMM_NULL;
        detail::check(sucl_init(&h), "sucl_init");
        adopt(h);
    }
    /// Takes over the C handle `h` (freed by the last copy), bound to `q`; when this throws
    /// because sucl cannot serve `q`'s device, `h` stays the caller's.
    communicator(s::queue q, sucl_comm h) : queue_(std::move(q)) { adopt(h); }

    int rank() const { return st_->rank; }
    int size() const { return st_->size; }
    /// The C handle, for sucl.h's calls (wait() first: the communicator's operations run on the
    /// SYCL runtime's threads, and a C handle serves one thread at a time).
    sucl_comm handle() const { return st_->handle; }
    const s::queue &queue() const { return queue_; }
    const s::device &device() const { return st_->device; }
    sucl::sycl::path device_path() const { return st_->p; }

    /// A copy of this communicator that submits to `q`, a queue of the same device.
    communicator on(s::queue q) const {
        if (auto why = detail::device_verdict(st_->device, q.get_device())) detail::invalid(*why);
        communicator c = *this;
        c.queue_ = std::move(q);
        return c;
    }

    /// Waits until every operation submitted so far ran; throws the first one's failure (on
    /// the device path including NCCL's asynchronous errors: sucl_synchronize_device).
    void wait() {
        if (st_->p == path::cuda && !st_->failed->any())
            on_pointers("sucl_synchronize_device", {}, [](s::handler &) {}, [c = st_->handle](const detail::where &w) {
                return sucl_synchronize_device(c, w.stream);
            });
        std::optional<s::event> last;
        {
            std::lock_guard<std::mutex> g(st_->chain_lock);
            last = st_->last;
        }
        if (last) last->wait();
        st_->failed->rethrow();
    }

    /// Splits like sucl_comm_split (after this communicator's operations ran); ranks passing
    /// SUCL_UNDEFINED get nothing.
    std::optional<communicator> split(int color, int key) {
        wait();
        sucl_comm h = SUCL_COMM_NULL;
        detail::check(sucl_comm_split(st_->handle, color, key, &h), "sucl_comm_split");
        if (h == SUCL_COMM_NULL) return std::nullopt;
        return communicator(queue_, h);
    }

    // ---- collectives on buffers: `count` elements from the start of each buffer ----

    s::event barrier(const std::vector<s::event> &deps = {}) {
        return on_pointers("sucl_barrier", deps, [](s::handler &) {}, [c = st_->handle](const detail::where &w) {
            return w.p == path::host ? sucl_barrier(c) : sucl_barrier_device(c, w.stream);
        });
    }

    template <class T, int D> s::event broadcast(s::buffer<T, D> &buf, size_t count, int root) {
        detail::need(buf.size(), count, "broadcast: buf");
        return on_buffers("sucl_broadcast", call_broadcast(count, root), detail::inout(buf));
    }

    template <class T, int D> s::event all_reduce(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count, op o) {
        detail::need(send.size(), count, "all_reduce: send");
        detail::need(recv.size(), count, "all_reduce: recv");
        return on_buffers("sucl_all_reduce", call_all_reduce(count, o), detail::in(send), detail::out(recv));
    }

    /// `recv` is used on the root only (any buffer elsewhere).
    template <class T, int D> s::event reduce(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count, op o, int root) {
        bool at_root = rank() == root;
        detail::need(send.size(), count, "reduce: send");
        if (at_root) detail::need(recv.size(), count, "reduce: recv");
        return on_buffers("sucl_reduce", call_reduce(count, o, root), detail::in(send), detail::out(recv, at_root));
    }

    /// `recv` (size × count) is used on the root only (any buffer elsewhere).
    template <class T, int D> s::event gather(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count, int root) {
        bool at_root = rank() == root;
        detail::need(send.size(), count, "gather: send");
        if (at_root) detail::need(recv.size(), detail::times(size(), count, "gather"), "gather: recv");
        return on_buffers("sucl_gather", call_gather(count, root), detail::in(send), detail::out(recv, at_root));
    }

    template <class T, int D> s::event all_gather(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count) {
        detail::need(send.size(), count, "all_gather: send");
        detail::need(recv.size(), detail::times(size(), count, "all_gather"), "all_gather: recv");
        return on_buffers("sucl_all_gather", call_all_gather(count), detail::in(send), detail::out(recv));
    }

    /// `send` (size × count) is used on the root only (any buffer elsewhere).
    template <class T, int D> s::event scatter(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count, int root) {
        bool at_root = rank() == root;
        if (at_root) detail::need(send.size(), detail::times(size(), count, "scatter"), "scatter: send");
        detail::need(recv.size(), count, "scatter: recv");
        return on_buffers("sucl_scatter", call_scatter(count, root), detail::in(send, at_root), detail::out(recv));
    }

    template <class T, int D> s::event all_to_all(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t count) {
        size_t total = detail::times(size(), count, "all_to_all");
        detail::need(send.size(), total, "all_to_all: send");
        detail::need(recv.size(), total, "all_to_all: recv");
        return on_buffers("sucl_all_to_all", call_all_to_all(count), detail::in(send), detail::out(recv));
    }

    template <class T, int D>
    s::event reduce_scatter(s::buffer<T, D> &send, s::buffer<T, D> &recv, size_t recvcount, op o) {
        detail::need(send.size(), detail::times(size(), recvcount, "reduce_scatter"), "reduce_scatter: send");
        detail::need(recv.size(), recvcount, "reduce_scatter: recv");
        return on_buffers("sucl_reduce_scatter", call_reduce_scatter(recvcount, o), detail::in(send), detail::out(recv));
    }

    // ---- v-collectives on buffers (tables as in sucl.h; `displs` and the root's buffer are
    // used on the root only) ----

    template <class T, int D>
    s::event gatherv(s::buffer<T, D> &send, s::buffer<T, D> &recv, std::vector<size_t> counts, std::vector<size_t> displs,
                     int root) {
        bool at_root = rank() == root;
        check_v(counts, at_root ? &displs : nullptr, "gatherv");
        detail::need(send.size(), counts[rank()], "gatherv: send");
        if (at_root) detail::need(recv.size(), detail::blocks_end(counts, displs, "gatherv"), "gatherv: recv");
        return on_buffers("sucl_gatherv", call_gatherv(std::move(counts), std::move(displs), root), detail::in(send),
                          detail::out(recv, at_root));
    }

    template <class T, int D>
    s::event scatterv(s::buffer<T, D> &send, std::vector<size_t> counts, std::vector<size_t> displs, s::buffer<T, D> &recv,
                      int root) {
        bool at_root = rank() == root;
        check_v(counts, at_root ? &displs : nullptr, "scatterv");
        if (at_root) detail::need(send.size(), detail::blocks_end(counts, displs, "scatterv"), "scatterv: send");
        detail::need(recv.size(), counts[rank()], "scatterv: recv");
        return on_buffers("sucl_scatterv", call_scatterv(std::move(counts), std::move(displs), root), detail::in(send, at_root),
                          detail::out(recv));
    }

    template <class T, int D>
    s::event all_gatherv(s::buffer<T, D> &send, s::buffer<T, D> &recv, std::vector<size_t> counts, std::vector<size_t> displs) {
        check_v(counts, &displs, "all_gatherv");
        detail::need(send.size(), counts[rank()], "all_gatherv: send");
        detail::need(recv.size(), detail::blocks_end(counts, displs, "all_gatherv"), "all_gatherv: recv");
        return on_buffers("sucl_all_gatherv", call_all_gatherv(std::move(counts), std::move(displs)), detail::in(send),
                          detail::out(recv));
    }

    /// `counts` is the size × size table, row-major (counts[i * size + j]: from rank i to j).
    template <class T, int D>
    s::event all_to_allv(s::buffer<T, D> &send, std::vector<size_t> sdispls, s::buffer<T, D> &recv,
                         std::vector<size_t> rdispls, std::vector<size_t> counts) {
        auto [send_end, recv_end] = check_all_to_allv(counts, sdispls, rdispls);
        detail::need(send.size(), send_end, "all_to_allv: send");
        detail::need(recv.size(), recv_end, "all_to_allv: recv");
        return on_buffers("sucl_all_to_allv", call_all_to_allv(std::move(sdispls), std::move(rdispls), std::move(counts)),
                          detail::in(send), detail::out(recv));
    }

    // ---- point to point on buffers ----

    template <class T, int D> s::event send(s::buffer<T, D> &buf, size_t count, int dest, int tag) {
        detail::need(buf.size(), count, "send: buf");
        return on_buffers("sucl_send", call_send(count, dest, tag), detail::in(buf));
    }

    /// `*received` (if given) gets the elements received once the event completed.
    template <class T, int D> s::event recv(s::buffer<T, D> &buf, size_t count, int src, int tag, size_t *received = nullptr) {
        detail::need(buf.size(), count, "recv: buf");
        return on_buffers("sucl_recv", call_recv(count, src, tag, received), detail::out(buf));
    }

    template <class T, int D>
    s::event sendrecv(s::buffer<T, D> &sendbuf, size_t sendcount, int dest, s::buffer<T, D> &recvbuf, size_t recvcount, int src,
                      int tag, size_t *received = nullptr) {
        detail::need(sendbuf.size(), sendcount, "sendrecv: sendbuf");
        detail::need(recvbuf.size(), recvcount, "sendrecv: recvbuf");
        return on_buffers("sucl_sendrecv", call_sendrecv(sendcount, dest, recvcount, src, tag, received), detail::in(sendbuf),
                          detail::out(recvbuf));
    }

    /// Starts a send (host path); `wait(r)` completes it. Leave `buf` alone until then.
    template <class T, int D> s::event isend(s::buffer<T, D> &buf, size_t count, int dest, int tag, request &r) {
        detail::need(buf.size(), count, "isend: buf");
        host_only("isend");
        hold(r, detail::in(buf));
        return on_buffers("sucl_isend", call_isend(count, dest, tag, r), detail::in(buf));
    }

    /// Starts a receive (host path); `wait(r)` completes it. Leave `buf` alone until then.
    template <class T, int D> s::event irecv(s::buffer<T, D> &buf, size_t count, int src, int tag, request &r) {
        detail::need(buf.size(), count, "irecv: buf");
        host_only("irecv");
        hold(r, detail::out(buf));
        return on_buffers("sucl_irecv", call_irecv(count, src, tag, r), detail::out(buf));
    }

    /// Completes `rs` (sucl_wait each, in order, one command each); their buffers are released
    /// to later kernels as each completes. The event is the last one's.
    s::event wait(const std::vector<request> &rs, const std::vector<s::event> &deps = {}) {
        s::event last = barrier_free_event(deps);
        for (const request &r : rs) {
            sucl::sycl::path p = st_->p;
            auto rs_state = r.state_;
            auto enqueue = r.enqueue_;
            last = submit({last}, [p, rs_state, enqueue](s::handler &h, auto guard) {
                enqueue(h, p, [rs_state, guard](const detail::where &) {
                    guard([&] {
                        sucl_result rc = sucl_wait(rs_state->handle, &rs_state->count);
                        rs_state->handle = SUCL_REQUEST_NULL;
                        return rc;
                    });
                });
            }, "sucl_wait");
        }
        return last;
    }

    // ---- the same on USM pointers: `deps` are the events the call waits for ----

    template <class T> s::event broadcast(T *buf, size_t count, int root, const std::vector<s::event> &deps = {}) {
        usm(buf, count, "broadcast: buf");
        return on_usm("sucl_broadcast", deps, call_broadcast(count, root), buf);
    }

    template <class T>
    s::event all_reduce(const T *send, T *recv, size_t count, op o, const std::vector<s::event> &deps = {}) {
        usm(send, count, "all_reduce: send");
        usm(recv, count, "all_reduce: recv");
        return on_usm("sucl_all_reduce", deps, call_all_reduce(count, o), send, recv);
    }

    template <class T>
    s::event reduce(const T *send, T *recv, size_t count, op o, int root, const std::vector<s::event> &deps = {}) {
        usm(send, count, "reduce: send");
        if (rank() == root) usm(recv, count, "reduce: recv");
        return on_usm("sucl_reduce", deps, call_reduce(count, o, root), send, recv);
    }

    template <class T> s::event gather(const T *send, T *recv, size_t count, int root, const std::vector<s::event> &deps = {}) {
        usm(send, count, "gather: send");
        if (rank() == root) usm(recv, detail::times(size(), count, "gather"), "gather: recv");
        return on_usm("sucl_gather", deps, call_gather(count, root), send, recv);
    }

    template <class T> s::event all_gather(const T *send, T *recv, size_t count, const std::vector<s::event> &deps = {}) {
        usm(send, count, "all_gather: send");
        usm(recv, detail::times(size(), count, "all_gather"), "all_gather: recv");
        return on_usm("sucl_all_gather", deps, call_all_gather(count), send, recv);
    }

    template <class T> s::event scatter(const T *send, T *recv, size_t count, int root, const std::vector<s::event> &deps = {}) {
        if (rank() == root) usm(send, detail::times(size(), count, "scatter"), "scatter: send");
        usm(recv, count, "scatter: recv");
        return on_usm("sucl_scatter", deps, call_scatter(count, root), send, recv);
    }

    template <class T> s::event all_to_all(const T *send, T *recv, size_t count, const std::vector<s::event> &deps = {}) {
        size_t total = detail::times(size(), count, "all_to_all");
        usm(send, total, "all_to_all: send");
        usm(recv, total, "all_to_all: recv");
        return on_usm("sucl_all_to_all", deps, call_all_to_all(count), send, recv);
    }

    template <class T>
    s::event reduce_scatter(const T *send, T *recv, size_t recvcount, op o, const std::vector<s::event> &deps = {}) {
        usm(send, detail::times(size(), recvcount, "reduce_scatter"), "reduce_scatter: send");
        usm(recv, recvcount, "reduce_scatter: recv");
        return on_usm("sucl_reduce_scatter", deps, call_reduce_scatter(recvcount, o), send, recv);
    }

    template <class T>
    s::event gatherv(const T *send, T *recv, std::vector<size_t> counts, std::vector<size_t> displs, int root,
                     const std::vector<s::event> &deps = {}) {
        bool at_root = rank() == root;
        check_v(counts, at_root ? &displs : nullptr, "gatherv");
        usm(send, counts[rank()], "gatherv: send");
        if (at_root) usm(recv, detail::blocks_end(counts, displs, "gatherv"), "gatherv: recv");
        return on_usm("sucl_gatherv", deps, call_gatherv(std::move(counts), std::move(displs), root), send, recv);
    }

    template <class T>
    s::event scatterv(const T *send, std::vector<size_t> counts, std::vector<size_t> displs, T *recv, int root,
                      const std::vector<s::event> &deps = {}) {
        bool at_root = rank() == root;
        check_v(counts, at_root ? &displs : nullptr, "scatterv");
        if (at_root) usm(send, detail::blocks_end(counts, displs, "scatterv"), "scatterv: send");
        usm(recv, counts[rank()], "scatterv: recv");
        return on_usm("sucl_scatterv", deps, call_scatterv(std::move(counts), std::move(displs), root), send, recv);
    }

    template <class T>
    s::event all_gatherv(const T *send, T *recv, std::vector<size_t> counts, std::vector<size_t> displs,
                         const std::vector<s::event> &deps = {}) {
        check_v(counts, &displs, "all_gatherv");
        usm(send, counts[rank()], "all_gatherv: send");
        usm(recv, detail::blocks_end(counts, displs, "all_gatherv"), "all_gatherv: recv");
        return on_usm("sucl_all_gatherv", deps, call_all_gatherv(std::move(counts), std::move(displs)), send, recv);
    }

    template <class T>
    s::event all_to_allv(const T *send, std::vector<size_t> sdispls, T *recv, std::vector<size_t> rdispls,
                         std::vector<size_t> counts, const std::vector<s::event> &deps = {}) {
        auto [send_end, recv_end] = check_all_to_allv(counts, sdispls, rdispls);
        usm(send, send_end, "all_to_allv: send");
        usm(recv, recv_end, "all_to_allv: recv");
        return on_usm("sucl_all_to_allv", deps,
                      call_all_to_allv(std::move(sdispls), std::move(rdispls), std::move(counts)), send, recv);
    }

    template <class T> s::event send(const T *buf, size_t count, int dest, int tag, const std::vector<s::event> &deps = {}) {
        usm(buf, count, "send: buf");
        return on_usm("sucl_send", deps, call_send(count, dest, tag), buf);
    }

    template <class T>
    s::event recv(T *buf, size_t count, int src, int tag, size_t *received = nullptr, const std::vector<s::event> &deps = {}) {
        usm(buf, count, "recv: buf");
        return on_usm("sucl_recv", deps, call_recv(count, src, tag, received), buf);
    }

    template <class T>
    s::event sendrecv(const T *sendbuf, size_t sendcount, int dest, T *recvbuf, size_t recvcount, int src, int tag,
                      size_t *received = nullptr, const std::vector<s::event> &deps = {}) {
        usm(sendbuf, sendcount, "sendrecv: sendbuf");
        usm(recvbuf, recvcount, "sendrecv: recvbuf");
        return on_usm("sucl_sendrecv", deps, call_sendrecv(sendcount, dest, recvcount, src, tag, received), sendbuf, recvbuf);
    }

    template <class T>
    s::event isend(const T *buf, size_t count, int dest, int tag, request &r, const std::vector<s::event> &deps = {}) {
        usm(buf, count, "isend: buf");
        host_only("isend");
        return on_usm("sucl_isend", deps, call_isend(count, dest, tag, r), buf);
    }

    template <class T>
    s::event irecv(T *buf, size_t count, int src, int tag, request &r, const std::vector<s::event> &deps = {}) {
        usm(buf, count, "irecv: buf");
        host_only("irecv");
        return on_usm("sucl_irecv", deps, call_irecv(count, src, tag, r), buf);
    }

  private:
    std::shared_ptr<detail::state> st_;
    s::queue queue_;

    void adopt(sucl_comm h) {
        // The state frees `h` from here on, also when the checks below throw.
        sucl::sycl::path route = detail::path_of(queue_.get_device());
        st_ = std::make_shared<detail::state>(h, queue_.get_device(), route);
        detail::check(sucl_comm_rank(h, &st_->rank), "sucl_comm_rank");
        detail::check(sucl_comm_size(h, &st_->size), "sucl_comm_size");
#if SUCL_SYCL_CUDA
        if (st_->p == path::cuda) {
            int dev = int(s::get_native<SUCL_SYCL_CUDA_BACKEND>(st_->device));
            detail::check(sucl_comm_attach_device(h, dev), "sucl_comm_attach_device");
        }
#endif
    }

    void host_only(const char *what) const {
        if (st_->p != path::host)
            detail::invalid(std::string(what) + ": sucl has non-blocking calls on host memory only; on the device path use "
                                                "send, recv or sendrecv (enqueued on the stream)");
    }

    template <class T> void usm(const T *p, size_t count, const char *what) const {
        if (count == 0) return;
        if (p == nullptr) detail::invalid(std::string(what) + " is NULL");
        const s::context ctx = queue_.get_context();
        s::usm::alloc kind = s::get_pointer_type(p, ctx);
        if (auto why = detail::usm_verdict(kind, st_->p, what)) detail::invalid(*why);
        if (kind != s::usm::alloc::host) {
            if (auto why = detail::device_verdict(st_->device, s::get_pointer_device(p, ctx)))
                detail::invalid(std::string(what) + ": memory of another device (" + *why + ")");
        }
    }

    void check_v(const std::vector<size_t> &counts, const std::vector<size_t> *displs, const char *what) const {
        detail::table(counts, size_t(size()), (std::string(what) + ": counts").c_str());
        if (displs) detail::table(*displs, size_t(size()), (std::string(what) + ": displs").c_str());
    }

    // The furthest ends of this rank's send and receive blocks.
    std::pair<size_t, size_t> check_all_to_allv(const std::vector<size_t> &counts, const std::vector<size_t> &sdispls,
                                                const std::vector<size_t> &rdispls) const {
        size_t n = size_t(size()), me = size_t(rank());
        detail::table(counts, detail::times(n, n, "all_to_allv"), "all_to_allv: counts");
        detail::table(sdispls, n, "all_to_allv: sdispls");
        detail::table(rdispls, n, "all_to_allv: rdispls");
        std::vector<size_t> sent(n), got(n);
        for (size_t j = 0; j < n; j++) {
            sent[j] = counts[me * n + j];
            got[j] = counts[j * n + me];
        }
        return {detail::blocks_end(sent, sdispls, "all_to_allv: send"), detail::blocks_end(got, rdispls, "all_to_allv: recv")};
    }

    // ---- the C calls: each factory gives a callable of the path and the buffers' pointers
    // (send first, then recv) that calls the host function or the `_device` one ----

    template <class P> static constexpr sucl_dtype dt() { return dtype_of<std::remove_pointer_t<P>>(); }

    auto call_broadcast(size_t count, int root) const {
        return [c = st_->handle, count, root](const detail::where &w, auto *buf) {
            return w.p == path::host ? sucl_broadcast(c, buf, count, dt<decltype(buf)>(), root)
                                     : sucl_broadcast_device(c, buf, count, dt<decltype(buf)>(), root, w.stream);
        };
    }
    auto call_all_reduce(size_t count, op o) const {
        return [c = st_->handle, count, o](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_all_reduce(c, a, b, count, dt<decltype(b)>(), sucl_op(o))
                                     : sucl_all_reduce_device(c, a, b, count, dt<decltype(b)>(), sucl_op(o), w.stream);
        };
    }
    auto call_reduce(size_t count, op o, int root) const {
        return [c = st_->handle, count, o, root](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_reduce(c, a, b, count, dt<decltype(b)>(), sucl_op(o), root)
                                     : sucl_reduce_device(c, a, b, count, dt<decltype(b)>(), sucl_op(o), root, w.stream);
        };
    }
    auto call_gather(size_t count, int root) const {
        return [c = st_->handle, count, root](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_gather(c, a, b, count, dt<decltype(b)>(), root)
                                     : sucl_gather_device(c, a, b, count, dt<decltype(b)>(), root, w.stream);
        };
    }
    auto call_all_gather(size_t count) const {
        return [c = st_->handle, count](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_all_gather(c, a, b, count, dt<decltype(b)>())
                                     : sucl_all_gather_device(c, a, b, count, dt<decltype(b)>(), w.stream);
        };
    }
    auto call_scatter(size_t count, int root) const {
        return [c = st_->handle, count, root](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_scatter(c, a, b, count, dt<decltype(b)>(), root)
                                     : sucl_scatter_device(c, a, b, count, dt<decltype(b)>(), root, w.stream);
        };
    }
    auto call_all_to_all(size_t count) const {
        return [c = st_->handle, count](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_all_to_all(c, a, b, count, dt<decltype(b)>())
                                     : sucl_all_to_all_device(c, a, b, count, dt<decltype(b)>(), w.stream);
        };
    }
    auto call_reduce_scatter(size_t recvcount, op o) const {
        return [c = st_->handle, recvcount, o](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_reduce_scatter(c, a, b, recvcount, dt<decltype(b)>(), sucl_op(o))
                                     : sucl_reduce_scatter_device(c, a, b, recvcount, dt<decltype(b)>(), sucl_op(o), w.stream);
        };
    }
    // The tables travel with the command (the caller's may be gone when it runs).
    auto call_gatherv(std::vector<size_t> counts, std::vector<size_t> displs, int root) const {
        return [c = st_->handle, counts, displs, root](const detail::where &w, auto *a, auto *b) {
            const size_t *d = displs.empty() ? nullptr : displs.data();
            return w.p == path::host ? sucl_gatherv(c, a, b, counts.data(), d, dt<decltype(b)>(), root)
                                     : sucl_gatherv_device(c, a, b, counts.data(), d, dt<decltype(b)>(), root, w.stream);
        };
    }
    auto call_scatterv(std::vector<size_t> counts, std::vector<size_t> displs, int root) const {
        return [c = st_->handle, counts, displs, root](const detail::where &w, auto *a, auto *b) {
            const size_t *d = displs.empty() ? nullptr : displs.data();
            return w.p == path::host ? sucl_scatterv(c, a, counts.data(), d, b, dt<decltype(b)>(), root)
                                     : sucl_scatterv_device(c, a, counts.data(), d, b, dt<decltype(b)>(), root, w.stream);
        };
    }
    auto call_all_gatherv(std::vector<size_t> counts, std::vector<size_t> displs) const {
        return [c = st_->handle, counts, displs](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host ? sucl_all_gatherv(c, a, b, counts.data(), displs.data(), dt<decltype(b)>())
                                     : sucl_all_gatherv_device(c, a, b, counts.data(), displs.data(), dt<decltype(b)>(), w.stream);
        };
    }
    auto call_all_to_allv(std::vector<size_t> sdispls, std::vector<size_t> rdispls, std::vector<size_t> counts) const {
        return [c = st_->handle, sdispls, rdispls, counts](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host
                       ? sucl_all_to_allv(c, a, sdispls.data(), b, rdispls.data(), counts.data(), dt<decltype(b)>())
                       : sucl_all_to_allv_device(c, a, sdispls.data(), b, rdispls.data(), counts.data(), dt<decltype(b)>(),
                                                 w.stream);
        };
    }
    auto call_send(size_t count, int dest, int tag) const {
        return [c = st_->handle, count, dest, tag](const detail::where &w, auto *buf) {
            return w.p == path::host ? sucl_send(c, buf, count, dt<decltype(buf)>(), dest, tag)
                                     : sucl_send_device(c, buf, count, dt<decltype(buf)>(), dest, tag, w.stream);
        };
    }
    auto call_recv(size_t count, int src, int tag, size_t *received) const {
        return [c = st_->handle, count, src, tag, received](const detail::where &w, auto *buf) {
            return w.p == path::host ? sucl_recv(c, buf, count, dt<decltype(buf)>(), src, tag, received)
                                     : sucl_recv_device(c, buf, count, dt<decltype(buf)>(), src, tag, received, w.stream);
        };
    }
    auto call_sendrecv(size_t sendcount, int dest, size_t recvcount, int src, int tag, size_t *received) const {
        return [c = st_->handle, sendcount, dest, recvcount, src, tag, received](const detail::where &w, auto *a, auto *b) {
            return w.p == path::host
                       ? sucl_sendrecv(c, a, sendcount, dest, b, recvcount, src, dt<decltype(b)>(), tag, received)
                       : sucl_sendrecv_device(c, a, sendcount, dest, b, recvcount, src, dt<decltype(b)>(), tag, received,
                                              w.stream);
        };
    }
    // isend and irecv are host-path only (host_only() refused the rest before).
    auto call_isend(size_t count, int dest, int tag, request &r) const {
        return [c = st_->handle, count, dest, tag, rs = r.state_](const detail::where &, auto *buf) {
            return sucl_isend(c, buf, count, dt<decltype(buf)>(), dest, tag, &rs->handle);
        };
    }
    auto call_irecv(size_t count, int src, int tag, request &r) const {
        return [c = st_->handle, count, src, tag, rs = r.state_](const detail::where &, auto *buf) {
            return sucl_irecv(c, buf, count, dt<decltype(buf)>(), src, tag, &rs->handle);
        };
    }

    template <class Use> static void hold(request &r, Use u) {
        r.enqueue_ = [u](s::handler &h, sucl::sycl::path p, request::body b) {
            auto acc = *u.access(h);
            detail::enqueue(h, p, [acc, b](const detail::where &w, s::interop_handle &) {
                (void)acc;
                b(w);
            });
        };
    }

    // An event that completes once `deps` did (a command of the chain that does nothing).
    s::event barrier_free_event(const std::vector<s::event> &deps) {
        return on_pointers("sucl::sycl::wait", deps, [](s::handler &) {}, [](const detail::where &) { return sucl_result(SUCL_OK); });
    }

    // Submits one command group to the communicator's queue, after its previous operation and
    // `deps`. `fill(h, guard)` adds the accessors and the command; the command passes its C call
    // to `guard`, which runs it unless an earlier operation failed and keeps its failure.
    template <class Fill> s::event submit(const std::vector<s::event> &deps, Fill fill, const char *what) {
        st_->failed->rethrow();
        std::shared_ptr<detail::state> st = st_;
        auto guard = [failed = st->failed, what](auto &&c_call) { failed->run(what, c_call); };
        std::lock_guard<std::mutex> g(st->chain_lock);
        s::event e = queue_.submit([&](s::handler &h) {
            if (st->last) h.depends_on(*st->last);
            h.depends_on(deps);
            fill(h, guard);
        });
        st->last = e;
        return e;
    }

    // A call whose memory the accessors of `extra` order (none for a barrier, the requests'
    // buffers for a wait) or that takes USM pointers (ordered by `deps`).
    template <class Extra, class Call>
    s::event on_pointers(const char *what, const std::vector<s::event> &deps, Extra extra, Call call) {
        sucl::sycl::path p = st_->p;
        return submit(deps, [p, extra, call](s::handler &h, auto guard) {
            extra(h);
            detail::enqueue(h, p, [call, guard](const detail::where &w, s::interop_handle &) { guard([&] { return call(w); }); });
        }, what);
    }

    template <class Call, class... Ptrs>
    s::event on_usm(const char *what, const std::vector<s::event> &deps, Call call, Ptrs... ptrs) {
        return on_pointers(what, deps, [](s::handler &) {}, [call, ptrs...](const detail::where &w) { return call(w, ptrs...); });
    }

    // A call on buffers: an accessor per buffer in use, the C call on their pointers.
    template <class Call, class... Uses> s::event on_buffers(const char *what, Call call, Uses... uses) {
        sucl::sycl::path p = st_->p;
        return submit({}, [p, call, uses...](s::handler &h, auto guard) {
            auto accs = std::make_tuple(uses.access(h)...);
            detail::enqueue(h, p, [call, guard, accs](const detail::where &w, s::interop_handle &ih) {
                guard([&] {
                    return std::apply([&](const auto &...a) { return call(w, detail::pointer_or_null(w, ih, a)...); }, accs);
                });
            });
        }, what);
    }
};

} // namespace sucl::sycl

#endif // SUCL_SYCL_HPP
