// The CUDA LayerNorm over the last dimension (PyTorch semantics: biased
// variance, eps = 1e-5, affine weight and bias), forward and backward, with
// fp32 statistics and a deterministic backward.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/launch.hpp"
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

// dweight[c] += sum_n dout[n, c] xhat[n, c], dbias[c] += sum_n dout[n, c].
// Block b owns channels 32b .. 32b + 31 (one per lane, so a warp reads 32
// consecutive channels of a row) and all N rows: row lane k sums rows
// k, k + 16, ... in order, then lane 0 adds the 16 partial sums in order and
// adds the total to the gradient once. Every channel has one owner and a fixed
// order of additions: deterministic on any GPU, no atomics, no scratch memory.
// Cost: dout and inp are read a second time (column-wise), and only
// ceil(C / 32) blocks run, which leaves a large GPU partly idle for small C.
template <class T>
__global__ void __launch_bounds__(32 * layernorm_row_lanes)
    layernorm_backward_params_kernel(float* dweight,     // (C) +=
                                     float* dbias,       // (C) +=
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
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (std::int64_t n = row_lane; n < N; n += layernorm_row_lanes) {
            const float d = static_cast<float>(dout[n * C + c]);
            const float xhat = (static_cast<float>(inp[n * C + c]) - mean[n]) * rstd[n];
            sw += d * xhat;
            sb += d;
        }
    }
    part_w[row_lane][lane] = sw;
    part_b[row_lane][lane] = sb;
    __syncthreads();
    if (row_lane == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < layernorm_row_lanes; ++k) {
            tw += part_w[k][lane];
            tb += part_b[k][lane];
        }
        dweight[c] += tw;
        dbias[c] += tb;
    }
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
// Deterministic: fixed reduction trees, one owner per output element (see
// layernorm_backward_params_kernel for the cost). Throws ShapeError for a
// negative size or C == 0.
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
    const dim3 block(32, detail::layernorm_row_lanes);
    launch<detail::layernorm_backward_params_kernel<T>>(static_cast<unsigned>((C + 31) / 32), block, 0, dev.stream,
                                                        dweight, dbias, dout, inp, mean, rstd, N, C);
}

}  // namespace snug::cuda
