// The CUDA LayerNorm over the last dimension (PyTorch semantics: biased
// variance, eps = 1e-5, affine weight and bias), forward and backward, with
// fp32 statistics and a deterministic backward.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/launch.hpp"
#include "snug/cuda/linear.cuh"  // Blas workspace, bias_grad_finish_kernel
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/layernorm.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// The shared epsilon (ops/layernorm.hpp), as the float the kernels add.
inline constexpr float layernorm_eps = static_cast<float>(ops::layernorm_eps);
// Row kernels: one warp per row, this many rows per block.
inline constexpr int layernorm_rows_per_block = 8;
// Parameter-gradient kernel: a block of 32 channels x this many row lanes.
inline constexpr int layernorm_row_lanes = 16;

template <class T>
__global__ void __launch_bounds__(layernorm_rows_per_block * 32)
    layernorm_forward_kernel(T* out,           // (N, C)
                             float* mean,      // (N)
                             float* rstd,      // (N)
                             const T* inp,     // (N, C)
                             const T* weight,  // (C)
                             const T* bias,    // (C)
                             std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const std::int64_t stride = std::int64_t{gridDim.x} * layernorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * layernorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        float sum = 0.0f;
        for (int c = lane; c < C; c += 32) sum += static_cast<float>(x[c]);
        const float m = warp_sum(sum) / static_cast<float>(C);
        float sq = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float d = static_cast<float>(x[c]) - m;
            sq += d * d;
        }
        const float var = warp_sum(sq) / static_cast<float>(C);
        const float rs = 1.0f / sqrtf(var + layernorm_eps);
        T* o = out + row * C;
        for (int c = lane; c < C; c += 32) {
            o[c] = T((static_cast<float>(x[c]) - m) * rs * static_cast<float>(weight[c]) +
                     static_cast<float>(bias[c]));
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

// dinp += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd per row, with
// g = weight * dout and xhat = (inp - mean) * rstd; one warp per row.
template <class T>
__global__ void __launch_bounds__(layernorm_rows_per_block * 32)
    layernorm_backward_input_kernel(T* dinp,            // (N, C) +=
                                    const T* dout,      // (N, C)
                                    const T* inp,       // (N, C)
                                    const T* weight,    // (C)
                                    const float* mean,  // (N)
                                    const float* rstd,  // (N)
                                    std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const float inv_c = 1.0f / static_cast<float>(C);
    const std::int64_t stride = std::int64_t{gridDim.x} * layernorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * layernorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        const T* dy = dout + row * C;
        const float m = mean[row], rs = rstd[row];
        float g_sum = 0.0f, gx_sum = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float g = static_cast<float>(weight[c]) * static_cast<float>(dy[c]);
            g_sum += g;
            gx_sum += g * ((static_cast<float>(x[c]) - m) * rs);
        }
        const float g_mean = warp_sum(g_sum) * inv_c;
        const float gx_mean = warp_sum(gx_sum) * inv_c;
        T* dx = dinp + row * C;
        for (int c = lane; c < C; c += 32) {
            const float xhat = (static_cast<float>(x[c]) - m) * rs;
            const float g = static_cast<float>(weight[c]) * static_cast<float>(dy[c]);
            dx[c] = T(static_cast<float>(dx[c]) + (g - g_mean - xhat * gx_mean) * rs);
        }
    }
}

// dweight[c] += sum_n dout[n, c] xhat[n, c], dbias[c] += sum_n dout[n, c],
// in two deterministic steps (a fixed order of additions for given N, C and
// chunk count; no atomics):
// 1. layernorm_backward_params_kernel: block (x, y) owns channels 32x ..
//    32x + 31 (one per lane, so a warp reads 32 consecutive channels of a row)
//    over row chunk y: row lane k sums rows begin + k, begin + k + 16, ... in
//    order, then lane 0 adds the 16 lane sums in order. With one chunk it adds
//    the totals into the gradients; with several it writes them to
//    partial[y, c] (dweight's) and partial[chunks + y, c] (dbias's).
// 2. bias_grad_finish_kernel (linear.cuh), once for each: the chunks' partial
//    sums in chunk order, added to the gradient.
// Chunks of about 64 rows, at most 256 and what the Blas workspace holds:
// (C / 32) x chunks blocks fill a large GPU where C / 32 alone (24 at C = 768)
// would leave it mostly idle.
inline constexpr std::int64_t layernorm_params_rows_per_chunk = 64;
inline constexpr std::int64_t layernorm_params_max_chunks = 256;

template <class T>
__global__ void __launch_bounds__(32 * layernorm_row_lanes)
    layernorm_backward_params_kernel(float* dweight,     // (C) += when gridDim.y == 1
                                     float* dbias,       // (C) += when gridDim.y == 1
                                     float* partial,     // (2 gridDim.y, C) otherwise
                                     const T* dout,      // (N, C)
                                     const T* inp,       // (N, C)
                                     const float* mean,  // (N)
                                     const float* rstd,  // (N)
                                     std::int64_t N, int C) {
    struct Parts {
        float w[layernorm_row_lanes][32];
        float b[layernorm_row_lanes][32];
    };
    Parts& parts = block_shared<Parts>();
    auto& part_w = parts.w;
    auto& part_b = parts.b;
    const int lane = static_cast<int>(threadIdx.x);
    const int row_lane = static_cast<int>(threadIdx.y);
    const int c = static_cast<int>(blockIdx.x) * 32 + lane;
    const std::int64_t chunks = gridDim.y;
    const std::int64_t begin = N * blockIdx.y / chunks;
    const std::int64_t end = N * (blockIdx.y + 1) / chunks;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (std::int64_t n = begin + row_lane; n < end; n += layernorm_row_lanes) {
            const float d = static_cast<float>(dout[n * C + c]);
            const float xhat = (static_cast<float>(inp[n * C + c]) - mean[n]) * rstd[n];
            sw += d * xhat;
            sb += d;
        }
    }
    part_w[row_lane][lane] = sw;
    part_b[row_lane][lane] = sb;
    __syncthreads();
    if (row_lane != 0 || c >= C) return;
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < layernorm_row_lanes; ++k) {
        tw += part_w[k][lane];
        tb += part_b[k][lane];
    }
    if (chunks == 1) {
        dweight[c] += tw;
        dbias[c] += tb;
    } else {
        partial[blockIdx.y * std::int64_t{C} + c] = tw;
        partial[(chunks + blockIdx.y) * std::int64_t{C} + c] = tb;
    }
}

// Row chunks for the parameter gradients of N rows of C channels: about 64
// rows each, at most 256, at most what `scratch_bytes` holds (2 chunks x C
// floats each); 1 without scratch.
inline int layernorm_params_chunks(std::int64_t N, int C, std::size_t scratch_bytes) {
    const std::int64_t fits = static_cast<std::int64_t>(scratch_bytes / sizeof(float)) / (2 * std::int64_t{C});
    const std::int64_t wanted = (N + layernorm_params_rows_per_chunk - 1) / layernorm_params_rows_per_chunk;
    return static_cast<int>(std::max<std::int64_t>(1, std::min({wanted, layernorm_params_max_chunks, fits})));
}

inline unsigned layernorm_row_blocks(std::int64_t N) {
    return grid_stride_blocks(N, layernorm_rows_per_block, std::int64_t{1} << 20);
}

}  // namespace detail

// out[n, :] = (inp[n, :] - mean[n]) * rstd[n] * weight + bias, with the fp32
// statistics mean and rstd = 1 / sqrt(biased variance + 1e-5) of row n saved
// for the backward. One warp per row, two passes over the row (mean, then the
// variance about it). Throws ShapeError for a negative size or C == 0.
template <CudaFloat T>
void layernorm_forward(const Device& dev, T* out,  // (N, C)
                       float* mean,                // (N)
                       float* rstd,                // (N)
                       const T* inp,               // (N, C)
                       const T* weight,            // (C)
                       const T* bias,              // (C)
                       std::int64_t N, int C) {
    ops::check_layernorm("layernorm_forward", N, C);
    if (N == 0) return;
    launch<detail::layernorm_forward_kernel<T>>(detail::layernorm_row_blocks(N), detail::layernorm_rows_per_block * 32,
                                                0, dev.stream, out, mean, rstd, inp, weight, bias, N, C);
}

// With xhat = (inp - mean) * rstd and g = weight * dout, per row:
//   dinp    += (g - mean_c(g) - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat,  dbias += sum_n dout               (fp32)
// Deterministic: fixed reduction trees, one owner per output element, the
// parameter gradients' row chunks (layernorm_backward_params_kernel) added in
// order. Throws ShapeError for a negative size or C == 0.
template <CudaFloat T>
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
    launch<detail::layernorm_backward_input_kernel<T>>(detail::layernorm_row_blocks(N),
                                                       detail::layernorm_rows_per_block * 32, 0, dev.stream, dinp,
                                                       dout, inp, weight, mean, rstd, N, C);
    // Partial sums live in the Blas workspace (free between GEMMs on this
    // stream); without a Blas on the device tag, one chunk.
    float* partial = dev.blas != nullptr ? static_cast<float*>(dev.blas->workspace()) : nullptr;
    const int chunks = detail::layernorm_params_chunks(N, C, dev.blas != nullptr ? dev.blas->workspace_bytes() : 0);
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    const dim3 block(32, detail::layernorm_row_lanes);
    launch<detail::layernorm_backward_params_kernel<T>>(grid, block, 0, dev.stream, dweight, dbias, partial, dout, inp,
                                                        mean, rstd, N, C);
    if (chunks > 1) {
        const auto finish_blocks = static_cast<unsigned>((C + 255) / 256);
        launch<detail::bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dweight, partial, chunks, C);
        launch<detail::bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dbias,
                                                       partial + std::int64_t{chunks} * C, chunks, C);
    }
}

}  // namespace snug::cuda
