// The fully connected layer on CUDA, y = x W^T + b with PyTorch nn.Linear's
// layout (W is (OC, C)): forward and backward through the cuBLASLt GEMM of the
// Blas attached to the device tag (dev.blas), plus the bias kernels: the bias
// broadcast (when it is not fused into the GEMM's epilogue) and the
// deterministic column sums for the bias gradient. Same semantics as
// snug/host/linear.hpp.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/blas.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/shared_memory.hpp"
#include "snug/ops/linear.hpp"

namespace snug::cuda {

namespace detail {

// out[r, o] = bias[o] for every row r.
template <class T>
__global__ void broadcast_rows_kernel(T* out,          // (N, OC)
                                      const T* bias,   // (OC)
                                      std::int64_t N, int OC) {
    const std::int64_t total = N * OC;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
         i += std::int64_t{gridDim.x} * blockDim.x)
        out[i] = bias[i % OC];
}

// The bias gradient in two deterministic steps (a fixed summation order for
// given N, OC and chunk count, so the same bits every run):
// 1. bias_grad_partial_kernel: block (x, y) sums columns 32x .. 32x + 31 over
//    row chunk y, 8 row lanes each striding by 8, then the lanes in order.
//    With one chunk it adds straight into dbias; with several it writes
//    partial[y, col] (scratch in the Blas workspace).
// 2. bias_grad_finish_kernel: dbias[col] += the chunks' partials, in chunk order.
inline constexpr int bias_grad_cols = 32;
inline constexpr int bias_grad_lanes = 8;
inline constexpr std::int64_t bias_grad_rows_per_chunk = 64;
inline constexpr std::int64_t bias_grad_max_chunks = 256;

template <class T>
__global__ void __launch_bounds__(bias_grad_cols * bias_grad_lanes)
    bias_grad_partial_kernel(float* dbias,     // (OC) += when gridDim.y == 1
                             float* partial,   // (gridDim.y, OC) otherwise
                             const T* dout,    // (N, OC)
                             std::int64_t N, int OC) {
    auto& lane_sums = block_shared<float[bias_grad_lanes][bias_grad_cols]>();
    const int col = static_cast<int>(blockIdx.x) * bias_grad_cols + static_cast<int>(threadIdx.x);
    const std::int64_t chunks = gridDim.y;
    const std::int64_t begin = N * blockIdx.y / chunks;
    const std::int64_t end = N * (blockIdx.y + 1) / chunks;
    float sum = 0.0f;
    if (col < OC)
        for (std::int64_t r = begin + threadIdx.y; r < end; r += bias_grad_lanes) sum += widen(dout[r * OC + col]);
    lane_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || col >= OC) return;
    float total = 0.0f;
#pragma unroll
    for (int lane = 0; lane < bias_grad_lanes; ++lane) total += lane_sums[lane][threadIdx.x];
    if (chunks == 1)
        dbias[col] += total;
    else
        partial[blockIdx.y * std::int64_t{OC} + col] = total;
}

// (A template only so that the header may define it: a non-template kernel
// cannot be inline.)
template <class Acc>
__global__ void bias_grad_finish_kernel(Acc* dbias,          // (OC)
                                        const Acc* partial,  // (chunks, OC)
                                        int chunks, int OC) {
    const int col = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (col >= OC) return;
    Acc total = 0;
    for (int c = 0; c < chunks; ++c) total += partial[std::int64_t{c} * OC + col];
    dbias[col] += total;
}

// dbias (OC) += column sums of dout (N, OC), on dev.stream; N, OC > 0.
template <class T>
void bias_grad_accumulate(const Device& dev, Blas& blas, float* dbias, const T* dout, std::int64_t N, int OC) {
    const auto scratch_rows = static_cast<std::int64_t>(blas.scratch_capacity<float>()) / OC;
    const std::int64_t wanted = (N + bias_grad_rows_per_chunk - 1) / bias_grad_rows_per_chunk;
    const auto chunks = static_cast<int>(std::max<std::int64_t>(
        1, std::min({wanted, bias_grad_max_chunks, scratch_rows})));
    float* partial = blas.scratch<float>(static_cast<std::size_t>(chunks) * static_cast<std::size_t>(OC));
    const dim3 grid(static_cast<unsigned>((OC + bias_grad_cols - 1) / bias_grad_cols), static_cast<unsigned>(chunks));
    const dim3 block(bias_grad_cols, bias_grad_lanes);
    launch<bias_grad_partial_kernel<T>>(grid, block, 0, dev.stream, dbias, partial, dout, N, OC);
    if (chunks > 1) {
        launch<bias_grad_finish_kernel<float>>(static_cast<unsigned>((OC + 255) / 256), 256, 0, dev.stream, dbias,
                                               partial, chunks, OC);
    }
}

// out (N, OC) <- bias broadcast over the rows, on dev.stream; N, OC > 0.
template <class T>
void broadcast_rows(const Device& dev, T* out, const T* bias, std::int64_t N, int OC) {
    launch<broadcast_rows_kernel<T>>(map_blocks(N * OC, 1), elementwise_block, 0, dev.stream, out, bias, N, OC);
}

inline Blas& require_blas(const Device& dev, const char* op) {
    if (dev.blas == nullptr)
        throw Error(std::string(op) +
                    ": no Blas is attached to the device tag (snug::cuda::Device::blas is null); create a "
                    "snug::cuda::Blas and set the tag's blas to it before running linear layers");
    return *dev.blas;
}

}  // namespace detail

// out = inp weight^T + bias, on dev.stream through dev.blas. fp32
// accumulation (TF32 for float when the Blas allows it); a 16-bit out is
// rounded once, after the bias is added. The bias is added in the GEMM's
// epilogue when the Blas fuses biases and cuBLASLt has an algorithm for it,
// otherwise written into out first and the GEMM run with beta = 1.
// Throws ShapeError for a negative size, snug::Error for a null pointer that
// would be read, a missing Blas or a pointer not aligned to 16 bytes (see
// Blas::matmul), CudaError when cuBLASLt fails.
template <FloatStorage T>
void linear_forward(const Device& dev, T* out,  // (N, OC)
                    const T* inp,               // (N, C)
                    const T* weight,            // (OC, C)
                    const T* bias,              // (OC) or nullptr
                    std::int64_t N, int C, int OC) {
    constexpr const char* op = "linear_forward";
    ops::check_linear_forward(op, out, inp, weight, N, C, OC);
    if (N == 0 || OC == 0) return;
    Blas& blas = detail::require_blas(dev, op);
    if (C == 0) {  // no product: out is the bias, or zero
        if (bias != nullptr)
            detail::broadcast_rows(dev, out, bias, N, OC);
        else
            check(cudaMemsetAsync(out, 0, static_cast<std::size_t>(N * OC) * sizeof(T), dev.stream));
        return;
    }
    if (bias != nullptr && blas.fuse_bias() && blas.supports<T, T>(Op::N, Op::T, N, OC, C, C, C, OC, true)) {
        blas.matmul(dev.stream, Op::N, Op::T, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, bias);
        return;
    }
    float beta = 0.0f;
    if (bias != nullptr) {
        detail::broadcast_rows(dev, out, bias, N, OC);
        beta = 1.0f;
    }
    blas.matmul(dev.stream, Op::N, Op::T, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

// The gradients of linear_forward given dout = dL/dout, on dev.stream:
//   dinp = dout weight           (N, C), overwritten; skipped when dinp is null
//   dweight += dout^T inp        (OC, C), fp32, accumulated (GEMM with beta = 1)
//   dbias += column sums of dout (OC), fp32, accumulated; skipped when null.
//            Deterministic; uses the Blas workspace as scratch in stream order.
// Throws like linear_forward.
template <FloatStorage T>
void linear_backward(const Device& dev, T* dinp,  // (N, C) or nullptr
                     float* dweight,              // (OC, C)
                     float* dbias,                // (OC) or nullptr
                     const T* dout,               // (N, OC)
                     const T* inp,                // (N, C)
                     const T* weight,             // (OC, C)
                     std::int64_t N, int C, int OC) {
    constexpr const char* op = "linear_backward";
    ops::check_linear_backward(op, dinp, dweight, dout, inp, weight, N, C, OC);
    if (N == 0) return;  // nothing to accumulate, and dinp is empty
    Blas& blas = detail::require_blas(dev, op);
    if (dinp != nullptr && C > 0) {
        if (OC == 0)
            check(cudaMemsetAsync(dinp, 0, static_cast<std::size_t>(N * C) * sizeof(T), dev.stream));
        else
            blas.matmul(dev.stream, Op::N, Op::N, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    }
    if (OC == 0) return;
    if (C > 0) blas.matmul(dev.stream, Op::T, Op::N, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != nullptr) detail::bias_grad_accumulate(dev, blas, dbias, dout, N, OC);
}

}  // namespace snug::cuda
