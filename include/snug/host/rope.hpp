// The host RoPE, rotary position embedding (Llama's, Hugging Face's
// rotate_half pairing; convention in snug/ops/rope.hpp), forward and backward,
// out of place or in place. cos and sin in double, once per position and pair;
// the rotation in acc_t<T>.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/rope.hpp"

namespace snug::host {

namespace detail {

// out = x rotated by +angle (sign = 1, the forward) or -angle (sign = -1, the
// backward) pairwise, per snug/ops/rope.hpp. out may equal x.
template <HostFloat T>
void rope_apply(const char* op, T* out,  // (B, T, NH, hs), rows row_stride apart
                const T* x,              // (B, T, NH, hs), rows row_stride apart
                int B, int T_, int NH, int hs, double theta, std::int64_t pos_offset, std::int64_t row_stride,
                int sign) {
    using A = acc_t<T>;
    ops::check_rope(op, B, T_, NH, hs, theta, pos_offset, row_stride);
    const int pairs = hs / 2;
    const std::int64_t rows = std::int64_t{B} * T_;  // one (b, t) position each
    const std::int64_t row_elems = std::int64_t{NH} * hs;
    const std::int64_t stride = ops::rope_row_stride(NH, hs, row_stride);
    const std::int64_t grain =
        std::max<std::int64_t>(1, (std::int64_t{1} << 15) / std::max<std::int64_t>(row_elems, 1));
    parallel_ranges(rows, grain, [&](std::int64_t begin, std::int64_t end) {
        std::vector<A> cos_t(static_cast<std::size_t>(pairs)), sin_t(static_cast<std::size_t>(pairs));
        for (std::int64_t r = begin; r < end; ++r) {
            const std::int64_t pos = pos_offset + r % T_;
            for (int i = 0; i < pairs; ++i) {
                const double angle =
                    static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
                cos_t[static_cast<std::size_t>(i)] = static_cast<A>(std::cos(angle));
                sin_t[static_cast<std::size_t>(i)] = static_cast<A>(sign * std::sin(angle));
            }
            for (int h = 0; h < NH; ++h) {
                const T* xh = x + r * stride + std::int64_t{h} * hs;
                T* oh = out + r * stride + std::int64_t{h} * hs;
                for (int i = 0; i < pairs; ++i) {
                    const A c = cos_t[static_cast<std::size_t>(i)], s = sin_t[static_cast<std::size_t>(i)];
                    const A x1 = to_acc(xh[i]), x2 = to_acc(xh[i + pairs]);
                    oh[i] = from_acc<T>(x1 * c - x2 * s);
                    oh[i + pairs] = from_acc<T>(x2 * c + x1 * s);
                }
            }
        }
    });
}

}  // namespace detail

// out = inp with each pair (i, i + hs/2) of each head at position
// pos_offset + t rotated by (pos_offset + t) * theta^(-2i / hs). out may
// equal inp. Rows are row_stride elements apart (0: NH * hs). Throws for a
// negative size, an odd hs, theta <= 0, a negative offset or a stride below
// NH * hs.
template <HostFloat T>
void rope_forward(const Device&, T* out,  // (B, T, NH, hs)
                  const T* inp,           // (B, T, NH, hs)
                  int B, int T_, int NH, int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0,
                  std::int64_t row_stride = 0) {
    detail::rope_apply("rope_forward", out, inp, B, T_, NH, hs, theta, pos_offset, row_stride, 1);
}

// dinp = dout rotated back (the transpose of the forward rotation),
// overwriting; dinp may equal dout.
template <HostFloat T>
void rope_backward(const Device&, T* dinp,  // (B, T, NH, hs)
                   const T* dout,           // (B, T, NH, hs)
                   int B, int T_, int NH, int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0,
                   std::int64_t row_stride = 0) {
    detail::rope_apply("rope_backward", dinp, dout, B, T_, NH, hs, theta, pos_offset, row_stride, -1);
}

}  // namespace snug::host
