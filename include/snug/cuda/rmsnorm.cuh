// The CUDA RMSNorm over the last dimension (Llama's: no mean subtraction, no
// bias; snug/ops/rmsnorm.hpp), forward and backward, with an fp32 rstd and a
// deterministic backward in one launch. Laid out as layernorm.cuh: one warp
// per row, 16-byte loads and stores where C and the pointers allow; the
// backward kernel is norm_rows.cuh's, shared with LayerNorm.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norm_rows.cuh"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/rmsnorm.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

template <class T, int W>
__global__ void __launch_bounds__(norm_rows_per_block * 32)
    rmsnorm_forward_kernel(T* out,           // (N, C)
                           float* rstd,      // (N)
                           const T* inp,     // (N, C)
                           const T* weight,  // (C)
                           std::int64_t N, int C, float eps) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int vecs = C / W;
    const std::int64_t stride = std::int64_t{gridDim.x} * norm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * norm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        float sq = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float f = static_cast<float>(xv.v[j]);
                sq += f * f;
            }
        }
        const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
        T* o = out + row * C;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v), wv = load_vec<T, W>(weight, v);
            Vec<T, W> ov;
#pragma unroll
            for (int j = 0; j < W; ++j)
                ov.v[j] = T(static_cast<float>(xv.v[j]) * rs * static_cast<float>(wv.v[j]));
            reinterpret_cast<Vec<T, W>*>(o)[v] = ov;
        }
        if (lane == 0) rstd[row] = rs;
    }
}

}  // namespace detail

// out[n, :] = inp[n, :] * rstd[n] * weight, with the fp32 rstd = 1 / sqrt(mean(inp[n, :]^2) + eps)
// of row n saved for the backward (eps added as a float). One warp per row,
// one pass for the statistic. Throws for a negative size, C == 0 or a
// negative or non-finite eps.
template <FloatStorage T>
void rmsnorm_forward(const Device& dev, T* out,  // (N, C)
                     float* rstd,                // (N)
                     const T* inp,               // (N, C)
                     const T* weight,            // (C)
                     std::int64_t N, int C, double eps = ops::rmsnorm_eps) {
    ops::check_rmsnorm("rmsnorm_forward", N, C, eps);
    if (N == 0) return;
    const auto run = [&]<int W>() {
        launch<detail::rmsnorm_forward_kernel<T, W>>(detail::norm_row_blocks(N), detail::norm_rows_per_block * 32, 0,
                                                     dev.stream, out, rstd, inp, weight, N, C, static_cast<float>(eps));
    };
    if (detail::norm_vectorised<T>(C, {out, inp, weight}))
        run.template operator()<detail::norm_vec<T>>();
    else
        run.template operator()<1>();
}

// With xhat = inp * rstd and g = weight * dout, per row:
//   dinp    += (g - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat                      (fp32, accumulates)
// One launch (norm_rows.cuh's norm_backward, as layernorm_backward's without
// the mean and the bias): deterministic, the same bits every run on a given
// GPU; the partial sums in the Blas workspace when the tag has a Blas, else
// in memory from the stream's pool. Throws ShapeError for a negative size or
// C == 0.
template <FloatStorage T>
void rmsnorm_backward(const Device& dev, T* dinp,  // (N, C) +=
                      float* dweight,              // (C) +=
                      const T* dout,               // (N, C)
                      const T* inp,                // (N, C)
                      const T* weight,             // (C)
                      const float* rstd,           // (N)
                      std::int64_t N, int C) {
    ops::check_rmsnorm("rmsnorm_backward", N, C);
    if (N == 0) return;
    detail::norm_backward<false>(dev, dinp, dweight, static_cast<float*>(nullptr), dout, inp, weight,
                                 static_cast<const float*>(nullptr), rstd, N, C);
}

}  // namespace snug::cuda
