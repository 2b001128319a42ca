// The CUDA RoPE, rotary position embedding (Llama's, Hugging Face's
// rotate_half pairing; convention in snug/ops/rope.hpp), forward and backward,
// out of place or in place. A grid-stride loop over (position, pair): each
// item computes its angle, cos and sin in double once (as the host does, so
// both round the same values to fp32) and rotates that pair in every head,
// in fp32.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"  // FloatStorage, elementwise_block
#include "snug/cuda/launch.hpp"
#include "snug/cuda/norms.cuh"  // grid_stride_blocks
#include "snug/ops/rope.hpp"

namespace snug::cuda {

namespace detail {

// out = x with pair (i, i + hs/2) of every head at position pos_offset + t
// rotated by sign * (pos_offset + t) * theta^(-2i / hs); sign = 1 forward,
// -1 backward. Item k is (row, i) = (k / (hs/2), k % (hs/2)), row = b * T + t;
// consecutive threads take consecutive pairs, so a warp's accesses to one
// head are contiguous. out may equal x. T: float, snug::bfloat16 or snug::half.
template <class T>
__global__ void rope_kernel(T* out,      // (B, T, NH, hs), rows row_stride apart
                            const T* x,  // (B, T, NH, hs), rows row_stride apart
                            std::int64_t rows, int T_, int NH, int hs, double theta, std::int64_t pos_offset,
                            std::int64_t row_stride, float sign) {
    const int pairs = hs / 2;
    const std::int64_t n_items = rows * pairs;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < n_items; k += stride) {
        const std::int64_t row = k / pairs;
        const int i = static_cast<int>(k % pairs);
        const std::int64_t pos = pos_offset + row % T_;
        const double angle =
            static_cast<double>(pos) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
        const float c = static_cast<float>(cos(angle));
        const float s = sign * static_cast<float>(sin(angle));
        for (int h = 0; h < NH; ++h) {
            const std::int64_t at = row * row_stride + std::int64_t{h} * hs + i;
            const float x1 = static_cast<float>(x[at]), x2 = static_cast<float>(x[at + pairs]);
            out[at] = T(x1 * c - x2 * s);
            out[at + pairs] = T(x2 * c + x1 * s);
        }
    }
}

template <class T>
void rope_launch(const char* op, const Device& dev, T* out, const T* x, int B, int T_, int NH, int hs, double theta,
                 std::int64_t pos_offset, std::int64_t row_stride, float sign) {
    ops::check_rope(op, B, T_, NH, hs, theta, pos_offset, row_stride);
    const std::int64_t rows = std::int64_t{B} * T_;
    const std::int64_t n_items = rows * (hs / 2);
    if (n_items == 0 || NH == 0) return;
    launch<rope_kernel<T>>(grid_stride_blocks(n_items, elementwise_block), elementwise_block, 0, dev.stream, out, x,
                           rows, T_, NH, hs, theta, pos_offset, ops::rope_row_stride(NH, hs, row_stride), sign);
}

}  // namespace detail

// out = inp with each pair (i, i + hs/2) of each head at position
// pos_offset + t rotated by (pos_offset + t) * theta^(-2i / hs). out may
// equal inp. Rows are row_stride elements apart (0: NH * hs). Throws for a
// negative size, an odd hs, theta <= 0, a negative offset or a stride below
// NH * hs.
template <FloatStorage T>
void rope_forward(const Device& dev, T* out,  // (B, T, NH, hs)
                  const T* inp,               // (B, T, NH, hs)
                  int B, int T_, int NH, int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0,
                  std::int64_t row_stride = 0) {
    detail::rope_launch("rope_forward", dev, out, inp, B, T_, NH, hs, theta, pos_offset, row_stride, 1.0f);
}

// dinp = dout rotated back (the transpose of the forward rotation),
// overwriting; dinp may equal dout.
template <FloatStorage T>
void rope_backward(const Device& dev, T* dinp,  // (B, T, NH, hs)
                   const T* dout,               // (B, T, NH, hs)
                   int B, int T_, int NH, int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0,
                   std::int64_t row_stride = 0) {
    detail::rope_launch("rope_backward", dev, dinp, dout, B, T_, NH, hs, theta, pos_offset, row_stride, -1.0f);
}

}  // namespace snug::cuda
