// The CUDA GELU, tanh approximation (GPT-2's): forward and backward, fp32
// math, 128-bit loads and stores where the pointers allow (elementwise.cuh's
// map). The formula is the host's (snug/host/gelu.hpp):
//   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + e),  u = sqrt(2/pi) (x + 0.044715 x^3),  e = exp(-2u)
// with -2u clamped to [-87, 88] the same way, so results agree to a few fp32 ulp.
#pragma once

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"

namespace snug::cuda {

namespace detail {

// e = exp(-2u) with -2u clamped to where e is a finite normal float; a NaN x
// gives the upper end (fminf returns the non-NaN operand) and stays NaN
// through the factor x.
__device__ __forceinline__ float gelu_e(float x) {
    constexpr float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float k1 = 0.044715f;
    const float u = k0 * (x + k1 * x * x * x);
    return expf(fmaxf(-87.0f, fminf(88.0f, -2.0f * u)));
}

struct GeluForward {
    __device__ float operator()(float x) const { return x / (1.0f + gelu_e(x)); }
};

// d gelu / dx * dout, with s = sigmoid(2u) = 1 / (1 + e) and 1 - s = e s:
// s + 2 x s (1 - s) du/dx, neither cancelling nor overflowing.
struct GeluBackward {
    __device__ float operator()(float x, float dout) const {
        constexpr float k0 = 0.7978845608028654f;
        constexpr auto k1x3 = static_cast<float>(3.0 * 0.044715);  // as the host rounds it
        const float e = gelu_e(x);
        const float du = k0 * (1.0f + k1x3 * x * x);
        const float s = 1.0f / (1.0f + e);
        return (s + 2.0f * x * s * (e * s) * du) * dout;
    }
};

}  // namespace detail

// out = gelu(inp), elementwise; out may equal inp.
template <CudaFloat T>
void gelu_forward(const Device& dev, T* out,  // (n)
                  const T* inp,               // (n)
                  std::int64_t n) {
    detail::check_sizes("gelu_forward", {{"n", n}});
    if (n > 0) detail::map1(dev, out, inp, n, detail::GeluForward{});
}

// dinp = gelu'(inp) * dout, elementwise, overwriting; dinp may equal dout.
template <CudaFloat T>
void gelu_backward(const Device& dev, T* dinp,  // (n)
                   const T* inp,                // (n)
                   const T* dout,               // (n)
                   std::int64_t n) {
    detail::check_sizes("gelu_backward", {{"n", n}});
    if (n > 0) detail::map2(dev, dinp, inp, dout, n, detail::GeluBackward{});
}

}  // namespace snug::cuda
