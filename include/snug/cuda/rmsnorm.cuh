// The CUDA RMSNorm over the last dimension (Llama's: no mean subtraction, no
// bias; snug/ops/rmsnorm.hpp), forward and backward, with an fp32 rstd and a
// deterministic backward. Laid out as layernorm.cuh: one warp per row, and
// the parameter gradient summed column-wise with one owner per channel.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // CudaFloat
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/rmsnorm.hpp"

namespace snug::cuda {

namespace detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// Row kernels: one warp per row, this many rows per block.
inline constexpr int rmsnorm_rows_per_block = 8;
// Parameter-gradient kernel: a block of 32 channels x this many row lanes.
inline constexpr int rmsnorm_row_lanes = 16;

template <class T>
__global__ void __launch_bounds__(rmsnorm_rows_per_block * 32)
    rmsnorm_forward_kernel(T* out,           // (N, C)
                           float* rstd,      // (N)
                           const T* inp,     // (N, C)
                           const T* weight,  // (C)
                           std::int64_t N, int C, float eps) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const std::int64_t stride = std::int64_t{gridDim.x} * rmsnorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * rmsnorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        float sq = 0.0f;
        for (int c = lane; c < C; c += 32) {
            const float v = static_cast<float>(x[c]);
            sq += v * v;
        }
        const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
        T* o = out + row * C;
        for (int c = lane; c < C; c += 32) o[c] = T(static_cast<float>(x[c]) * rs * static_cast<float>(weight[c]));
        if (lane == 0) rstd[row] = rs;
    }
}

// dinp += (g - xhat * mean_c(g * xhat)) * rstd per row, with g = weight * dout
// and xhat = inp * rstd; one warp per row.
template <class T>
__global__ void __launch_bounds__(rmsnorm_rows_per_block * 32)
    rmsnorm_backward_input_kernel(T* dinp,            // (N, C) +=
                                  const T* dout,      // (N, C)
                                  const T* inp,       // (N, C)
                                  const T* weight,    // (C)
                                  const float* rstd,  // (N)
                                  std::int64_t N, int C) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const float inv_c = 1.0f / static_cast<float>(C);
    const std::int64_t stride = std::int64_t{gridDim.x} * rmsnorm_rows_per_block;
    for (std::int64_t row = std::int64_t{blockIdx.x} * rmsnorm_rows_per_block + threadIdx.x / 32; row < N;
         row += stride) {
        const T* x = inp + row * C;
        const T* dy = dout + row * C;
        const float rs = rstd[row];
        float gx_sum = 0.0f;
        for (int c = lane; c < C; c += 32) {
            gx_sum += static_cast<float>(weight[c]) * static_cast<float>(dy[c]) * (static_cast<float>(x[c]) * rs);
        }
        const float gx_mean = warp_sum(gx_sum) * inv_c;
        T* dx = dinp + row * C;
        for (int c = lane; c < C; c += 32) {
            const float xhat = static_cast<float>(x[c]) * rs;
            const float g = static_cast<float>(weight[c]) * static_cast<float>(dy[c]);
            dx[c] = T(static_cast<float>(dx[c]) + (g - xhat * gx_mean) * rs);
        }
    }
}

// dweight[c] += sum_n dout[n, c] inp[n, c] rstd[n]. As
// layernorm_backward_params_kernel: block b owns channels 32b .. 32b + 31 (one
// per lane) and all N rows; row lane k sums rows k, k + 16, ... in order, then
// lane 0 adds the 16 partial sums in order and adds the total once. One owner
// and a fixed order of additions per channel: deterministic on any GPU, no
// atomics, no scratch memory (at the cost of a column-wise second read of
// dout and inp, and only ceil(C / 32) blocks).
template <class T>
__global__ void __launch_bounds__(32 * rmsnorm_row_lanes)
    rmsnorm_backward_params_kernel(float* dweight,     // (C) +=
                                   const T* dout,      // (N, C)
                                   const T* inp,       // (N, C)
                                   const float* rstd,  // (N)
                                   std::int64_t N, int C) {
    struct Parts {
        float w[rmsnorm_row_lanes][32];
    };
    auto& part_w = block_shared<Parts>().w;
    const int lane = static_cast<int>(threadIdx.x);
    const int row_lane = static_cast<int>(threadIdx.y);
    const int c = static_cast<int>(blockIdx.x) * 32 + lane;
    float sw = 0.0f;
    if (c < C) {
        for (std::int64_t n = row_lane; n < N; n += rmsnorm_row_lanes) {
            sw += static_cast<float>(dout[n * C + c]) * (static_cast<float>(inp[n * C + c]) * rstd[n]);
        }
    }
    part_w[row_lane][lane] = sw;
    __syncthreads();
    if (row_lane == 0 && c < C) {
        float tw = 0.0f;
        for (int k = 0; k < rmsnorm_row_lanes; ++k) tw += part_w[k][lane];
        dweight[c] += tw;
    }
}

inline unsigned rmsnorm_row_blocks(std::int64_t N) {
    return grid_stride_blocks(N, rmsnorm_rows_per_block, std::int64_t{1} << 20);
}

}  // namespace detail

// out[n, :] = inp[n, :] * rstd[n] * weight, with the fp32 rstd = 1 / sqrt(mean(inp[n, :]^2) + eps)
// of row n saved for the backward (eps added as a float). One warp per row,
// one pass for the statistic. Throws for a negative size, C == 0 or a
// negative or non-finite eps.
template <CudaFloat T>
void rmsnorm_forward(const Device& dev, T* out,  // (N, C)
                     float* rstd,                // (N)
                     const T* inp,               // (N, C)
                     const T* weight,            // (C)
                     std::int64_t N, int C, double eps = ops::rmsnorm_eps) {
    ops::check_rmsnorm("rmsnorm_forward", N, C, eps);
    if (N == 0) return;
    launch<detail::rmsnorm_forward_kernel<T>>(detail::rmsnorm_row_blocks(N), detail::rmsnorm_rows_per_block * 32, 0,
                                              dev.stream, out, rstd, inp, weight, N, C, static_cast<float>(eps));
}

// With xhat = inp * rstd and g = weight * dout, per row:
//   dinp    += (g - xhat * mean_c(g * xhat)) * rstd   (T, accumulates)
//   dweight += sum_n dout * xhat                      (fp32, accumulates)
// Deterministic: fixed reduction trees, one owner per output element (see
// rmsnorm_backward_params_kernel for the cost). Throws ShapeError for a
// negative size or C == 0.
template <CudaFloat T>
void rmsnorm_backward(const Device& dev, T* dinp,  // (N, C) +=
                      float* dweight,              // (C) +=
                      const T* dout,               // (N, C)
                      const T* inp,                // (N, C)
                      const T* weight,             // (C)
                      const float* rstd,           // (N)
                      std::int64_t N, int C) {
    ops::check_rmsnorm("rmsnorm_backward", N, C);
    if (N == 0) return;
    launch<detail::rmsnorm_backward_input_kernel<T>>(detail::rmsnorm_row_blocks(N),
                                                     detail::rmsnorm_rows_per_block * 32, 0, dev.stream, dinp, dout,
                                                     inp, weight, rstd, N, C);
    const dim3 block(32, detail::rmsnorm_row_lanes);
    launch<detail::rmsnorm_backward_params_kernel<T>>(static_cast<unsigned>((C + 31) / 32), block, 0, dev.stream,
                                                      dweight, dout, inp, rstd, N, C);
}

}  // namespace snug::cuda
