// The CUDA GELU, tanh approximation (GPT-2's): forward and backward, fp32
// math, 128-bit loads and stores where the pointers allow (elementwise.cuh's
// map). The constants, clamps and formulas are the host's, from
// snug/ops/gelu.hpp; only the exponential differs (expf here, the host's
// vectorised one there), so results agree to a few fp32 ulp.
#pragma once

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"
#include "snug/ops/gelu.hpp"

namespace snug::cuda {

namespace detail {

struct GeluForward {
    __device__ float operator()(float x) const { return ops::gelu_value(x, expf(ops::gelu_exponent(x))); }
};

struct GeluBackward {
    __device__ float operator()(float x, float dout) const {
        const float e = expf(ops::gelu_exponent(x));
        return ops::gelu_derivative(x, ops::gelu_clamped(x), e) * dout;
    }
};

}  // namespace detail

// out = gelu(inp), elementwise; out may equal inp.
template <CudaFloat T>
void gelu_forward(const Device& dev, T* out,  // (n)
                  const T* inp,               // (n)
                  std::int64_t n) {
    ops::check_non_negative("gelu_forward", {{"n", n}});
    if (n > 0) detail::map1(dev, out, inp, n, detail::GeluForward{});
}

// dinp = gelu'(inp) * dout, elementwise, overwriting; dinp may equal inp or dout.
template <CudaFloat T>
void gelu_backward(const Device& dev, T* dinp,  // (n)
                   const T* inp,                // (n)
                   const T* dout,               // (n)
                   std::int64_t n) {
    ops::check_non_negative("gelu_backward", {{"n", n}});
    if (n > 0) detail::map2(dev, dinp, inp, dout, n, detail::GeluBackward{});
}

}  // namespace snug::cuda
