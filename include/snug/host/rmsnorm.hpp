// The host RMSNorm over the last dimension (Llama's: no mean subtraction, no
// bias; snug/ops/rmsnorm.hpp), forward and backward.
//
// rstd is saved as float (the spec), or as acc_t<T> when the caller passes
// such a buffer: double for T = double, so finite-difference tests in double
// see the exact statistic. Inside, everything is computed in acc_t<T>; the
// forward output uses the unrounded rstd.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/rmsnorm.hpp"

namespace snug::host {

// The element type of RMSNorm's saved rstd for activations of type T: float,
// or acc_t<T> (the same thing except for T = double).
template <class S, class T>
concept RmsNormStat = std::same_as<S, float> || std::same_as<S, acc_t<T>>;

namespace detail {

// Rows per parallel task so that a task is some tens of microseconds of work.
inline std::int64_t rmsnorm_row_grain(int C) {
    return std::max<std::int64_t>(1, (std::int64_t{1} << 16) / C);
}

}  // namespace detail

// out[n, :] = inp[n, :] * rstd[n] * weight, with rstd = 1 / sqrt(mean(inp[n, :]^2) + eps)
// of row n saved for the backward. Throws for a negative size, C == 0 or a
// negative or non-finite eps.
template <HostFloat T, RmsNormStat<T> S>
void rmsnorm_forward(const Device&, T* out,  // (N, C)
                     S* rstd,                // (N)
                     const T* inp,           // (N, C)
                     const T* weight,        // (C)
                     std::int64_t N, int C, double eps = ops::rmsnorm_eps) {
    using A = acc_t<T>;
    ops::check_rmsnorm("rmsnorm_forward", N, C, eps);
    parallel_ranges(N, detail::rmsnorm_row_grain(C), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* x = inp + n * C;
            const A ms = detail::lane_sum<A>(C, [&](int c) {
                             const A v = to_acc(x[c]);
                             return v * v;
                         }) /
                         static_cast<A>(C);
            const A rs = A(1) / std::sqrt(ms + static_cast<A>(eps));
            T* o = out + n * C;
            for (int c = 0; c < C; ++c) o[c] = from_acc<T>(to_acc(x[c]) * rs * to_acc(weight[c]));
            rstd[n] = static_cast<S>(rs);
        }
    });
}

// With xhat = inp * rstd and g = weight * dout, per row:
//   dinp    += (g - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat                      (fp32, accumulates)
// as layernorm_backward. Each dweight element sums its rows in order 0..N-1
// and then adds the sum once, so the result is the same for every thread count.
template <HostFloat T, RmsNormStat<T> S>
void rmsnorm_backward(const Device&, T* dinp,  // (N, C) +=
                      float* dweight,          // (C) +=
                      const T* dout,           // (N, C)
                      const T* inp,            // (N, C)
                      const T* weight,         // (C)
                      const S* rstd,           // (N)
                      std::int64_t N, int C) {
    using A = acc_t<T>;
    ops::check_rmsnorm("rmsnorm_backward", N, C);
    const A inv_c = A(1) / static_cast<A>(C);

    // dinp: rows are independent.
    parallel_ranges(N, detail::rmsnorm_row_grain(C), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* x = inp + n * C;
            const T* dy = dout + n * C;
            const A rs = static_cast<A>(rstd[n]);
            const A gx_mean = detail::lane_sum<A>(C, [&](int c) {
                                  return to_acc(weight[c]) * to_acc(dy[c]) * (to_acc(x[c]) * rs);
                              }) *
                              inv_c;
            T* dx = dinp + n * C;
            for (int c = 0; c < C; ++c) {
                const A xhat = to_acc(x[c]) * rs;
                const A g = to_acc(weight[c]) * to_acc(dy[c]);
                dx[c] = from_acc<T>(to_acc(dx[c]) + (g - xhat * gx_mean) * rs);
            }
        }
    });

    // dweight: a slice of channels per task, its rows summed in order.
    const std::int64_t channel_grain =
        std::max<std::int64_t>(8, (std::int64_t{1} << 16) / std::max<std::int64_t>(N, 1));
    parallel_ranges(C, channel_grain, [&](std::int64_t c_begin, std::int64_t c_end) {
        constexpr std::int64_t block = 64;
        for (std::int64_t c0 = c_begin; c0 < c_end; c0 += block) {
            const std::int64_t width = std::min(block, c_end - c0);
            A sw[block] = {};
            for (std::int64_t n = 0; n < N; ++n) {
                const T* x = inp + n * C + c0;
                const T* dy = dout + n * C + c0;
                const A rs = static_cast<A>(rstd[n]);
                for (std::int64_t j = 0; j < width; ++j) sw[j] += to_acc(dy[j]) * (to_acc(x[j]) * rs);
            }
            for (std::int64_t j = 0; j < width; ++j) dweight[c0 + j] = static_cast<float>(dweight[c0 + j] + sw[j]);
        }
    });
}

}  // namespace snug::host
