// Reductions on the device: the warp and block reductions the other kernels
// build on (fixed trees, so every result is the same bits every run), the
// grid size of their grid-stride loops, sum_squares, the gradient norm's
// deterministic two-pass sum of squares into a device scalar, and
// accumulate_sum, a running total in device memory (an update's loss).
// (scale_inplace, the other half of clipping, is in elementwise.cuh.)
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "snug/cuda/blas.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/shared_memory.hpp"

namespace snug::cuda {

namespace detail {

// ---- host side: launch sizes ----------------------------------------------------

inline constexpr int warp_size = 32;

// Blocks of `threads` for a grid-stride loop over n items, capped so that the
// grid stays a legal size (the loop covers the rest). n > 0.
inline unsigned grid_stride_blocks(std::int64_t n, int threads, std::int64_t cap = std::int64_t{1} << 16) {
    return static_cast<unsigned>(std::clamp<std::int64_t>((n + threads - 1) / threads, 1, cap));
}

// ---- device side: reductions -----------------------------------------------------

// Sum (max) of v over the 32 lanes of a full warp, by an xor butterfly: every
// lane ends with the same bits, since each step adds the same two values in
// either order.
template <class A>
__device__ A warp_sum(A v) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFF'FFFFU, v, offset);
    return v;
}

// fmaxf: a NaN lane is ignored unless every lane is NaN (as std::max on the
// host ignores a NaN that comes second).
__device__ inline float warp_max(float v) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFF'FFFFU, v, offset));
    return v;
}

// The block-wide sum or max of v (A: float, or double for sums), returned to
// every thread. blockDim.x must be a multiple of 32 (at most 1024) and every
// thread of the block must call it. `scratch` is 32 A of shared memory, free
// on entry and again on return (the function ends with a barrier after its
// last read). Every warp reduces the per-warp results itself, in the same
// fixed tree: the same bits in every thread, every run.
template <bool Max, class A>
__device__ A block_reduce(A v, A* scratch) {
    const unsigned lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const unsigned warps = blockDim.x / warp_size;
    static_assert(!Max || std::is_same_v<A, float>, "block max: float only");
    const auto reduce = [](A x) {
        if constexpr (Max) {
            return warp_max(x);
        } else {
            return warp_sum(x);
        }
    };
    v = reduce(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A w = lane < warps ? scratch[lane] : (Max ? A(-INFINITY) : A(0));
    w = reduce(w);
    __syncthreads();
    return w;
}

template <class A>
__device__ A block_sum(A v, A* scratch) {
    return block_reduce<false>(v, scratch);
}
__device__ inline float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// ---- sum_squares ---------------------------------------------------------------

inline constexpr int norm_threads = 512;
// Blocks of the first pass: a fixed number for a given n (never the device's
// SM count), so the partial sums, their order and the result do not depend on
// the GPU.
inline constexpr int norm_max_blocks = 1024;

// Pass 1: block b sums x[i]^2 in double over i = b * norm_threads + tid +
// k * stride in order of k (a float's square is exact in double), reduces
// over the block by the fixed tree, writes partial[b]. (Kernels in a header
// are templates, so that every translation unit may hold one; F is float.)
template <class F>
__global__ void __launch_bounds__(norm_threads)
    sum_squares_partial_kernel(double* partial,  // (gridDim.x)
                               const F* x,       // (n)
                               std::int64_t n) {
    auto& scratch = block_shared<double[warp_size]>();
    double acc = 0.0;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double g = static_cast<double>(x[i]);
        acc += g * g;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Pass 2: one block adds the partials by a fixed tree and overwrites *out,
// rounded to float once (+inf past float's range).
template <class F>
__global__ void __launch_bounds__(norm_threads)
    sum_squares_final_kernel(F* out,                 // (1)
                             const double* partial,  // (count)
                             int count) {
    auto& scratch = block_shared<double[warp_size]>();
    double acc = 0.0;
    for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) *out = acc >= 0x1p128 ? F(INFINITY) : static_cast<F>(acc);
}

// ---- accumulate_sum ------------------------------------------------------------

// One block: thread t adds values t, t + blockDim.x, ... in double, the block
// adds the threads' sums by the fixed tree, thread 0 adds that to *total.
template <class F>
__global__ void __launch_bounds__(norm_threads)
    accumulate_sum_kernel(double* total,   // (1) +=
                          const F* values, // (n)
                          std::int64_t n) {
    auto& scratch = block_shared<double[warp_size]>();
    double acc = 0.0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(values[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) *total += acc;
}

}  // namespace detail

// *total += sum of values[i] over i < n, in double, on dev.stream (nothing is
// read back): a running total that stays in device memory between passes, as
// TrainStep keeps an update's loss and reads it once. One block, a fixed
// order of additions: the same bits every run (the host kernel adds in index
// order, so the two agree to double rounding). Meant for a pass's per-token
// losses (thousands of values), not for gradients. Throws ShapeError for n < 0.
inline void accumulate_sum(const Device& dev, double* total,  // scalar, device memory, accumulated
                           const float* values,               // (n)
                           std::int64_t n) {
    ops::check_non_negative("accumulate_sum", {{"n", n}});
    if (n == 0) return;
    launch<detail::accumulate_sum_kernel<float>>(1, detail::norm_threads, 0, dev.stream, total, values, n);
}

// *out = sum of grad[i]^2 over i < n, accumulated in double and rounded to
// float once (+inf past float's range; an inf or NaN element makes it inf or
// NaN), written to device memory (overwritten; 0 for n == 0), as the host
// kernel. Deterministic: a fixed grid of at most 1024 blocks (chosen from n
// alone) sums fixed strided subsets, then one block adds the partial sums by a
// fixed tree, so the result is the same bits every run and on every GPU. The
// partial sums (8 KiB at most) go in the Blas workspace when the device tag
// carries a Blas (tracked memory, free between GEMMs on this stream; what a
// training step has), otherwise in stream-ordered memory from the runtime's
// pool (cudaMallocAsync), freed on the same stream.
// Throws ShapeError for n < 0.
inline void sum_squares(const Device& dev, float* out,  // scalar, device memory
                        const float* grad,              // (n)
                        std::int64_t n) {
    ops::check_non_negative("sum_squares", {{"n", n}});
    const int blocks = static_cast<int>(detail::grid_stride_blocks(n, detail::norm_threads, detail::norm_max_blocks));
    auto run = [&](double* partial) {
        launch<detail::sum_squares_partial_kernel<float>>(blocks, detail::norm_threads, 0, dev.stream, partial, grad, n);
        launch<detail::sum_squares_final_kernel<float>>(1, detail::norm_threads, 0, dev.stream, out, partial, blocks);
    };
    if (double* scratch = dev.blas != nullptr ? dev.blas->scratch<double>(static_cast<std::size_t>(blocks)) : nullptr) {
        run(scratch);
        return;
    }
    double* partial = nullptr;
    check(cudaMallocAsync(reinterpret_cast<void**>(&partial), sizeof(double) * static_cast<std::size_t>(blocks),
                          dev.stream));
    try {
        run(partial);
    } catch (...) {
        (void)cudaFreeAsync(partial, dev.stream);
        throw;
    }
    check(cudaFreeAsync(partial, dev.stream));
}

}  // namespace snug::cuda
