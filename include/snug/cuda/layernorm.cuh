// The CUDA LayerNorm over the last dimension (PyTorch semantics: biased
// variance, eps = 1e-5, affine weight and bias), forward and backward, with
// fp32 statistics and a deterministic backward in one launch; 128-bit loads
// and stores where C and the pointers allow (one element at a time otherwise).
// The backward kernel is norm_rows.cuh's, shared with RMSNorm.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norm_rows.cuh"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/layernorm.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// The shared epsilon (ops/layernorm.hpp), as the float the kernels add.
inline constexpr float layernorm_eps = static_cast<float>(ops::layernorm_eps);

// Add (residual_layernorm_forward): sum = inp + residual (rounded to T) is
// written first and the row normalised from it (sum may equal inp): the bits
// of add_inplace followed by layernorm_forward, in one pass over the inputs.
template <class T, int W, bool Add>
__global__ void __launch_bounds__(norm_rows_per_block * 32)
    layernorm_forward_kernel(T* out,              // (N, C)
                             float* mean,         // (N)
                             float* rstd,         // (N)
                             const T* inp,        // (N, C)
                             const T* residual,   // (N, C) when Add, else unused
                             T* sum,              // (N, C) when Add: inp + residual; else unused
                             const T* weight,     // (C)
                             const T* bias,       // (C)
                             std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int vecs = C / W;
    const std::int64_t stride = std::int64_t{gridDim.x} * norm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * norm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        // The row normalised: inp's, or the sum this lane writes (and alone reads back).
        const T* x = (Add ? sum : inp) + row * C;
        float total = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            Vec<T, W> xv = load_vec<T, W>(inp + row * C, v);
            if constexpr (Add) {
                const Vec<T, W> rv = load_vec<T, W>(residual + row * C, v);
#pragma unroll
                for (int j = 0; j < W; ++j) xv.v[j] = T(static_cast<float>(xv.v[j]) + static_cast<float>(rv.v[j]));
                reinterpret_cast<Vec<T, W>*>(sum + row * C)[v] = xv;
            }
#pragma unroll
            for (int j = 0; j < W; ++j) total += static_cast<float>(xv.v[j]);
        }
        const float m = warp_sum(total) / static_cast<float>(C);
        float sq = 0.0f;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float d = static_cast<float>(xv.v[j]) - m;
                sq += d * d;
            }
        }
        const float var = warp_sum(sq) / static_cast<float>(C);
        const float rs = 1.0f / sqrtf(var + layernorm_eps);
        T* o = out + row * C;
        for (int v = lane; v < vecs; v += 32) {
            const Vec<T, W> xv = load_vec<T, W>(x, v), wv = load_vec<T, W>(weight, v), bv = load_vec<T, W>(bias, v);
            Vec<T, W> ov;
#pragma unroll
            for (int j = 0; j < W; ++j)
                ov.v[j] = T((static_cast<float>(xv.v[j]) - m) * rs * static_cast<float>(wv.v[j]) +
                            static_cast<float>(bv.v[j]));
            reinterpret_cast<Vec<T, W>*>(o)[v] = ov;
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

template <bool Add, class T>
void launch_layernorm_forward(const Device& dev, T* out, float* mean, float* rstd, const T* inp, const T* residual,
                              T* sum, const T* weight, const T* bias, std::int64_t N, int C) {
    const auto run = [&]<int W>() {
        launch<layernorm_forward_kernel<T, W, Add>>(norm_row_blocks(N), norm_rows_per_block * 32, 0,
                                                    dev.stream, out, mean, rstd, inp, residual, sum, weight, bias, N,
                                                    C);
    };
    const bool aligned = norm_vectorised<T>(C, {out, inp, weight, bias}) &&
                         (!Add || norm_vectorised<T>(C, {residual, sum}));
    if (aligned)
        run.template operator()<norm_vec<T>>();
    else
        run.template operator()<1>();
}

}  // namespace detail

// out[n, :] = (inp[n, :] - mean[n]) * rstd[n] * weight + bias, with the fp32
// statistics mean and rstd = 1 / sqrt(biased variance + 1e-5) of row n saved
// for the backward. One warp per row, two passes over the row (mean, then the
// variance about it). Throws ShapeError for a negative size or C == 0.
template <FloatStorage T>
void layernorm_forward(const Device& dev, T* out,  // (N, C)
                       float* mean,                // (N)
                       float* rstd,                // (N)
                       const T* inp,               // (N, C)
                       const T* weight,            // (C)
                       const T* bias,              // (C)
                       std::int64_t N, int C) {
    ops::check_layernorm("layernorm_forward", N, C);
    if (N == 0) return;
    detail::launch_layernorm_forward<false>(dev, out, mean, rstd, inp, static_cast<const T*>(nullptr),
                                            static_cast<T*>(nullptr), weight, bias, N, C);
}

// res += x (each sum rounded once to T), then out = LayerNorm(res) with its
// statistics saved, as layernorm_forward: the same bits as add_inplace
// followed by layernorm_forward, reading res and x once instead of res twice
// (a block's second residual add and its ln2). Throws ShapeError for a
// negative size or C == 0.
template <FloatStorage T>
void residual_layernorm_forward(const Device& dev, T* out,  // (N, C)
                                float* mean,                // (N)
                                float* rstd,                // (N)
                                T* res,                     // (N, C) += x
                                const T* x,                 // (N, C)
                                const T* weight,            // (C)
                                const T* bias,              // (C)
                                std::int64_t N, int C) {
    ops::check_layernorm("residual_layernorm_forward", N, C);
    if (N == 0) return;
    detail::launch_layernorm_forward<true>(dev, out, mean, rstd, res, x, res, weight, bias, N, C);
}

// With xhat = (inp - mean) * rstd and g = weight * dout, per row:
//   dinp    += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat,  dbias += sum_n dout               (fp32, accumulate)
// One launch (norm_rows.cuh's norm_backward): a warp per row, each block's
// partial sums of dweight and dbias added by the last block to finish, in
// block order. Deterministic: the same bits every run on a given GPU (the
// grid follows its SM count). The partial sums go in the Blas workspace when
// the tag has a Blas, else in memory from the stream's pool. Throws
// ShapeError for a negative size or C == 0.
template <FloatStorage T>
void layernorm_backward(const Device& dev, T* dinp,  // (N, C) +=
                        float* dweight,              // (C) +=
                        float* dbias,                // (C) +=
                        const T* dout,               // (N, C)
                        const T* inp,                // (N, C)
                        const T* weight,             // (C)
                        const float* mean,           // (N)
                        const float* rstd,           // (N)
                        std::int64_t N, int C) {
    ops::check_layernorm("layernorm_backward", N, C);
    if (N == 0) return;
    detail::norm_backward<true>(dev, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

}  // namespace snug::cuda
