// What LayerNorm and RMSNorm on CUDA share (layernorm.cuh, rmsnorm.cuh): the
// 16-byte vectors their row kernels move, and the parameter gradients summed
// over row chunks, deterministically, with the partial sums in the Blas
// workspace:
//   dweight[c] += sum_n dout[n, c] xhat[n, c]     xhat = (inp - mean) rstd, or inp rstd without a mean
//   dbias[c]   += sum_n dout[n, c]                 (LayerNorm only)
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "snug/cuda/blas.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // Vec, vec_aligned
#include "snug/cuda/launch.hpp"
#include "snug/cuda/linear.cuh"  // bias_grad_finish_kernel
#include "snug/cuda/norms.cuh"
#include "snug/cuda/shared_memory.hpp"

namespace snug::cuda::detail {

// T (every kernel template below): float, snug::bfloat16 or snug::half; math in fp32.

// Row kernels: one warp per row, this many rows per block.
inline constexpr int norm_rows_per_block = 8;

inline unsigned norm_row_blocks(std::int64_t N) {
    return grid_stride_blocks(N, norm_rows_per_block, std::int64_t{1} << 20);
}

// The kernels move W consecutive channels per load or store: 16 bytes (W = 4
// floats or 8 16-bit values) when C is a multiple of that and every pointer is
// 16-byte aligned, else W = 1. Lane l of a row's warp takes channels
// [W (l + 32 k), W (l + 32 k) + W).
template <class T>
inline constexpr int norm_vec = static_cast<int>(16 / sizeof(T));

template <class T, int W>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p, int v) {  // elements [W v, W v + W) of p
    return reinterpret_cast<const Vec<T, W>*>(p)[v];
}

// True when C channels of T and every pointer allow 16-byte vectors.
template <class T>
bool norm_vectorised(int C, std::initializer_list<const T*> pointers) {
    constexpr int W = norm_vec<T>;
    if (C % W != 0) return false;
    for (const T* p : pointers)
        if (!vec_aligned<T, W>(p)) return false;
    return true;
}

// The parameter gradients in two deterministic steps (a fixed order of
// additions for given N, C and chunk count; no atomics):
// 1. norm_backward_params_kernel: block (x, y) owns channels 32Wx ..
//    32W(x + 1) - 1 (W per lane, so a warp reads 32W consecutive channels of
//    a row) over row chunk y: row lane k sums rows begin + k, begin + k + 16,
//    ... in order, then row lane 0 adds the 16 lane sums in order. With one
//    chunk it adds the totals into the gradients; with several it writes them
//    to partial[y, c] (dweight's) and partial[chunks + y, c] (dbias's).
// 2. bias_grad_finish_kernel (linear.cuh), once for each: the chunks' partial
//    sums in chunk order, added to the gradient.
// Chunks of about 64 rows, at most 256 and what the Blas workspace holds:
// (C / 32W) x chunks blocks fill a large GPU where C / 32 blocks walking
// every row (24 at C = 768) would leave it mostly idle.
inline constexpr int norm_row_lanes = 16;
inline constexpr std::int64_t norm_params_rows_per_chunk = 64;
inline constexpr std::int64_t norm_params_max_chunks = 256;

// Centered: LayerNorm (xhat uses mean; dbias too); else RMSNorm (no mean, no bias).
template <class T, int W, bool Centered>
__global__ void __launch_bounds__(32 * norm_row_lanes)
    norm_backward_params_kernel(float* dweight,     // (C) += when gridDim.y == 1
                                float* dbias,       // (C) += when gridDim.y == 1 and Centered
                                float* partial,     // (2 gridDim.y, C) otherwise
                                const T* dout,      // (N, C)
                                const T* inp,       // (N, C)
                                const float* mean,  // (N) when Centered
                                const float* rstd,  // (N)
                                std::int64_t N, int C) {
    struct Parts {
        float w[norm_row_lanes][32 * W];
        float b[norm_row_lanes][32 * W];
    };
    Parts& parts = block_shared<Parts>();
    auto& part_w = parts.w;
    auto& part_b = parts.b;
    const int lane = static_cast<int>(threadIdx.x);
    const int row_lane = static_cast<int>(threadIdx.y);
    const int c0 = (static_cast<int>(blockIdx.x) * 32 + lane) * W;  // this lane's W channels
    const std::int64_t chunks = gridDim.y;
    const std::int64_t begin = N * blockIdx.y / chunks;
    const std::int64_t end = N * (blockIdx.y + 1) / chunks;
    float sw[W] = {}, sb[W] = {};
    if (c0 < C) {
        for (std::int64_t n = begin + row_lane; n < end; n += norm_row_lanes) {
            const Vec<T, W> dv = load_vec<T, W>(dout + n * C, c0 / W), xv = load_vec<T, W>(inp + n * C, c0 / W);
            const float m = Centered ? mean[n] : 0.0f, rs = rstd[n];
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const float d = static_cast<float>(dv.v[j]);
                sw[j] += d * ((static_cast<float>(xv.v[j]) - m) * rs);
                if constexpr (Centered) sb[j] += d;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
        part_w[row_lane][lane * W + j] = sw[j];
        part_b[row_lane][lane * W + j] = sb[j];
    }
    __syncthreads();
    if (row_lane != 0 || c0 >= C) return;
#pragma unroll
    for (int j = 0; j < W; ++j) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < norm_row_lanes; ++k) {
            tw += part_w[k][lane * W + j];
            tb += part_b[k][lane * W + j];
        }
        const int c = c0 + j;
        if (chunks == 1) {
            dweight[c] += tw;
            if constexpr (Centered) dbias[c] += tb;
        } else {
            partial[blockIdx.y * std::int64_t{C} + c] = tw;
            if constexpr (Centered) partial[(chunks + blockIdx.y) * std::int64_t{C} + c] = tb;
        }
    }
}

// Row chunks for the parameter gradients of N rows of C channels: about 64
// rows each, at most 256, at most what `scratch_floats` holds (2 x C floats
// a chunk); 1 without scratch.
inline int norm_params_chunks(std::int64_t N, int C, std::size_t scratch_floats) {
    const std::int64_t fits = static_cast<std::int64_t>(scratch_floats) / (2 * std::int64_t{C});
    const std::int64_t wanted = (N + norm_params_rows_per_chunk - 1) / norm_params_rows_per_chunk;
    return static_cast<int>(std::max<std::int64_t>(1, std::min({wanted, norm_params_max_chunks, fits})));
}

// Launches both steps on dev.stream, W channels per lane (W: norm_vec<T>, or 1
// when C or the pointers do not allow it); dbias and mean only when Centered.
// Partial sums in dev.blas's workspace; without a Blas, one chunk.
template <bool Centered, class T>
void norm_backward_params(const Device& dev, float* dweight, float* dbias, const T* dout, const T* inp,
                          const float* mean, const float* rstd, std::int64_t N, int C) {
    const int chunks = norm_params_chunks(N, C, dev.blas != nullptr ? dev.blas->scratch_capacity<float>() : 0);
    float* partial = dev.blas != nullptr ? dev.blas->scratch<float>(2 * static_cast<std::size_t>(chunks) * C) : nullptr;
    const auto run = [&]<int W>() {
        const dim3 grid(static_cast<unsigned>((C + 32 * W - 1) / (32 * W)), static_cast<unsigned>(chunks));
        launch<norm_backward_params_kernel<T, W, Centered>>(grid, dim3(32, norm_row_lanes), 0, dev.stream, dweight,
                                                            dbias, partial, dout, inp, mean, rstd, N, C);
    };
    if (norm_vectorised<T>(C, {dout, inp}))
        run.template operator()<norm_vec<T>>();
    else
        run.template operator()<1>();
    if (chunks > 1) {
        const auto finish_blocks = static_cast<unsigned>((C + 255) / 256);
        launch<bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dweight, partial, chunks, C);
        if constexpr (Centered)
            launch<bias_grad_finish_kernel<float>>(finish_blocks, 256, 0, dev.stream, dbias,
                                                   partial + std::int64_t{chunks} * C, chunks, C);
    }
}

}  // namespace snug::cuda::detail
