// The host LayerNorm over the last dimension (PyTorch semantics: biased
// variance, eps = 1e-5, affine weight and bias), forward and backward.
//
// Statistics: mean and rstd are saved as float (the spec), or as acc_t<T> when
// the caller passes such buffers: double for T = double, so finite-difference
// tests in double see exact statistics. Inside, everything is computed in
// acc_t<T>; the forward output uses the unrounded statistics.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/host/elementwise.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/layernorm.hpp"

namespace snug::host {

// The element type of LayerNorm's saved statistics for activations of type T:
// float, or acc_t<T> (the same thing except for T = double).
template <class S, class T>
concept LayerNormStat = std::same_as<S, float> || std::same_as<S, acc_t<T>>;

namespace detail {

// Rows per parallel task so that a task is some tens of microseconds of work.
inline std::int64_t layernorm_row_grain(int C) {
    return std::max<std::int64_t>(1, (std::int64_t{1} << 16) / C);
}

}  // namespace detail

// out[n, :] = (inp[n, :] - mean[n]) * rstd[n] * weight + bias, with mean and
// rstd = 1 / sqrt(biased variance + 1e-5) of row n saved for the backward.
template <HostFloat T, LayerNormStat<T> S>
void layernorm_forward(const Device&, T* out,  // (N, C)
                       S* mean,                // (N)
                       S* rstd,                // (N)
                       const T* inp,           // (N, C)
                       const T* weight,        // (C)
                       const T* bias,          // (C)
                       std::int64_t N, int C) {
    using A = acc_t<T>;
    ops::check_layernorm("layernorm_forward", N, C);
    parallel_ranges(N, detail::layernorm_row_grain(C), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* x = inp + n * C;
            const A m = detail::lane_sum<A>(C, [&](int c) { return to_acc(x[c]); }) / static_cast<A>(C);
            const A var = detail::lane_sum<A>(C, [&](int c) {
                              const A d = to_acc(x[c]) - m;
                              return d * d;
                          }) /
                          static_cast<A>(C);
            const A rs = A(1) / std::sqrt(var + static_cast<A>(ops::layernorm_eps));
            T* o = out + n * C;
            for (int c = 0; c < C; ++c) {
                o[c] = from_acc<T>((to_acc(x[c]) - m) * rs * to_acc(weight[c]) + to_acc(bias[c]));
            }
            mean[n] = static_cast<S>(m);
            rstd[n] = static_cast<S>(rs);
        }
    });
}

// res += x (rounded to T), then out = LayerNorm(res) as layernorm_forward:
// a block's second residual add and its ln2. The host twin of the fused CUDA
// kernel, composed of the two host kernels.
template <HostFloat T, LayerNormStat<T> S>
void residual_layernorm_forward(const Device& dev, T* out,  // (N, C)
                                S* mean,                    // (N)
                                S* rstd,                    // (N)
                                T* res,                     // (N, C) += x
                                const T* x,                 // (N, C)
                                const T* weight,            // (C)
                                const T* bias,              // (C)
                                std::int64_t N, int C) {
    ops::check_layernorm("residual_layernorm_forward", N, C);
    add_inplace(dev, res, x, N * C);
    layernorm_forward(dev, out, mean, rstd, res, weight, bias, N, C);
}

// With xhat = (inp - mean) * rstd and g = weight * dout, per row:
//   dinp    += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat,  dbias += sum_n dout               (fp32)
// Each dweight/dbias element sums its rows in order 0..N-1 and then adds the
// sum once, so the result is the same for every thread count.
template <HostFloat T, LayerNormStat<T> S>
void layernorm_backward(const Device&, T* dinp,  // (N, C) +=
                        float* dweight,          // (C) +=
                        float* dbias,            // (C) +=
                        const T* dout,           // (N, C)
                        const T* inp,            // (N, C)
                        const T* weight,         // (C)
                        const S* mean,           // (N)
                        const S* rstd,           // (N)
                        std::int64_t N, int C) {
    using A = acc_t<T>;
    ops::check_layernorm("layernorm_backward", N, C);
    const A inv_c = A(1) / static_cast<A>(C);

    // dinp: rows are independent.
    parallel_ranges(N, detail::layernorm_row_grain(C), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* x = inp + n * C;
            const T* dy = dout + n * C;
            const A m = static_cast<A>(mean[n]);
            const A rs = static_cast<A>(rstd[n]);
            const A g_mean = detail::lane_sum<A>(C, [&](int c) { return to_acc(weight[c]) * to_acc(dy[c]); }) * inv_c;
            const A gx_mean = detail::lane_sum<A>(C, [&](int c) {
                                  return to_acc(weight[c]) * to_acc(dy[c]) * ((to_acc(x[c]) - m) * rs);
                              }) *
                              inv_c;
            T* dx = dinp + n * C;
            for (int c = 0; c < C; ++c) {
                const A xhat = (to_acc(x[c]) - m) * rs;
                const A g = to_acc(weight[c]) * to_acc(dy[c]);
                dx[c] = from_acc<T>(to_acc(dx[c]) + (g - g_mean - xhat * gx_mean) * rs);
            }
        }
    });

    // dweight, dbias: a slice of channels per task, its rows summed in order.
    const std::int64_t channel_grain = std::max<std::int64_t>(8, (std::int64_t{1} << 16) / std::max<std::int64_t>(N, 1));
    parallel_ranges(C, channel_grain, [&](std::int64_t c_begin, std::int64_t c_end) {
        constexpr std::int64_t block = 64;
        for (std::int64_t c0 = c_begin; c0 < c_end; c0 += block) {
            const std::int64_t width = std::min(block, c_end - c0);
            A sw[block] = {};
            A sb[block] = {};
            for (std::int64_t n = 0; n < N; ++n) {
                const T* x = inp + n * C + c0;
                const T* dy = dout + n * C + c0;
                const A m = static_cast<A>(mean[n]);
                const A rs = static_cast<A>(rstd[n]);
                for (std::int64_t j = 0; j < width; ++j) {
                    const A d = to_acc(dy[j]);
                    sw[j] += d * ((to_acc(x[j]) - m) * rs);
                    sb[j] += d;
                }
            }
            for (std::int64_t j = 0; j < width; ++j) {
                dweight[c0 + j] = static_cast<float>(dweight[c0 + j] + sw[j]);
                dbias[c0 + j] = static_cast<float>(dbias[c0 + j] + sb[j]);
            }
        }
    });
}

}  // namespace snug::host
