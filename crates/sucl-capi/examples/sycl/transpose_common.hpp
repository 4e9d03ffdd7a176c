// The kernels both Transpose variants share: pack the local slab of A into one block per
// destination rank, and unpack the received blocks into the local slab of B (B[y][x][z] = A[x][y][z]).
#ifndef SUCL_SYCL_TRANSPOSE_COMMON_HPP
#define SUCL_SYCL_TRANSPOSE_COMMON_HPP

#include "apps.hpp"

#include <sycl/sycl.hpp>

namespace transpose {

namespace s = ::sycl;

// Rank q's block of the send buffer holds A[x][q·nx + y'][z] for the local x, at
// ((q·nx + x)·nx + y')·n + z (the slabs are nx = n / P planes thick, in x for A and in y for B).
inline void pack(s::queue &q, s::buffer<float> &a, s::buffer<float> &send, size_t P, size_t nx, size_t n) {
    q.submit([&](s::handler &h) {
        s::accessor in(a, h, s::read_only);
        s::accessor out(send, h, s::write_only, s::no_init);
        h.parallel_for(s::range<3>(P * nx, nx, n), [=](s::id<3> i) {
            size_t dest = i[0] / nx, x = i[0] % nx, y = i[1], z = i[2];
            out[i[0] * nx * n + y * n + z] = in[apps::at(x, dest * nx + y, z, n)];
        });
    });
}

// Block p of the receive buffer holds rank p's A[x][my y][z]; it goes to B[y][p·nx + x][z].
inline void unpack(s::queue &q, s::buffer<float> &recv, s::buffer<float> &b, size_t P, size_t nx, size_t n) {
    q.submit([&](s::handler &h) {
        s::accessor in(recv, h, s::read_only);
        s::accessor out(b, h, s::write_only, s::no_init);
        h.parallel_for(s::range<3>(P * nx, nx, n), [=](s::id<3> i) {
            size_t x = i[0], y = i[1], z = i[2]; // x = p·nx + the sender's local x
            out[apps::at(y, x, z, n)] = in[x * nx * n + y * n + z];
        });
    });
}

inline void fill(s::queue &q, s::buffer<float> &a, size_t x0, size_t nx, size_t n) {
    q.submit([&](s::handler &h) {
        s::accessor out(a, h, s::write_only, s::no_init);
        h.parallel_for(s::range<3>(nx, n, n), [=](s::id<3> i) {
            out[apps::at(i[0], i[1], i[2], n)] = apps::value(x0 + i[0], i[1], i[2], n);
        });
    });
}

} // namespace transpose

#endif
