// The CUDA SwiGLU (Llama's MLP activation; layout and formulas in
// snug/ops/swiglu.hpp), forward and backward: out = silu(gate) * up over rows
// laid out [gate | up], one output element per thread of a grid-stride loop,
// fp32 math. Only the exponential differs from the host (expf against
// std::exp), so results agree to a few fp32 ulp.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage, elementwise_block
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norms.cuh"  // grid_stride_blocks
#include "snug/ops/swiglu.hpp"

namespace snug::cuda {

namespace detail {

// T (both kernels): float, snug::bfloat16 or snug::half; math in fp32.

// out[n, h] = silu(inp[n, h]) * inp[n, H + h]; item i is (n, h) = (i / H, i % H).
template <class T>
__global__ void swiglu_forward_kernel(T* out,        // (N, H)
                                      const T* inp,  // (N, 2H): [gate | up] per row
                                      std::int64_t N, int H) {
    const std::int64_t n_items = N * H;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n_items; i += stride) {
        const std::int64_t n = i / H, h = i % H;
        const float g = static_cast<float>(inp[n * 2 * H + h]);
        const float u = static_cast<float>(inp[n * 2 * H + H + h]);
        out[i] = T(ops::silu_value(g, expf(-g)) * u);
    }
}

// dinp[n, h] = dout * up * silu'(gate), dinp[n, H + h] = dout * silu(gate).
template <class T>
__global__ void swiglu_backward_kernel(T* dinp,        // (N, 2H): [dgate | dup] per row
                                       const T* inp,   // (N, 2H): [gate | up] per row
                                       const T* dout,  // (N, H)
                                       std::int64_t N, int H) {
    const std::int64_t n_items = N * H;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n_items; i += stride) {
        const std::int64_t n = i / H, h = i % H;
        const std::int64_t gate_at = n * 2 * H + h, up_at = gate_at + H;
        const float g = static_cast<float>(inp[gate_at]);
        const float u = static_cast<float>(inp[up_at]);
        const float d = static_cast<float>(dout[i]);
        const float e = expf(-g);
        dinp[gate_at] = T(d * u * ops::silu_derivative(g, e));
        dinp[up_at] = T(d * ops::silu_value(g, e));
    }
}

}  // namespace detail

// out[n, h] = silu(inp[n, h]) * inp[n, H + h]. out must not overlap inp.
// Throws ShapeError for a negative size.
template <FloatStorage T>
void swiglu_forward(const Device& dev, T* out,  // (N, H)
                    const T* inp,               // (N, 2H): [gate | up] per row
                    std::int64_t N, int H) {
    ops::check_swiglu("swiglu_forward", N, H);
    const std::int64_t n = N * H;
    if (n == 0) return;
    launch<detail::swiglu_forward_kernel<T>>(detail::grid_stride_blocks(n, detail::elementwise_block),
                                             detail::elementwise_block, 0, dev.stream, out, inp, N, H);
}

// dinp = [dout * up * silu'(gate) | dout * silu(gate)] per row, overwriting.
// dinp must not overlap inp or dout. Throws ShapeError for a negative size.
template <FloatStorage T>
void swiglu_backward(const Device& dev, T* dinp,  // (N, 2H): [dgate | dup] per row
                     const T* inp,                // (N, 2H): [gate | up] per row
                     const T* dout,               // (N, H)
                     std::int64_t N, int H) {
    ops::check_swiglu("swiglu_backward", N, H);
    const std::int64_t n = N * H;
    if (n == 0) return;
    launch<detail::swiglu_backward_kernel<T>>(detail::grid_stride_blocks(n, detail::elementwise_block),
                                              detail::elementwise_block, 0, dev.stream, dinp, inp, dout, N, H);
}

}  // namespace snug::cuda
