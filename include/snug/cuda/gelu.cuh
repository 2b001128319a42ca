// The CUDA GELU, tanh approximation (GPT-2's): forward and backward, fp32
// math, 128-bit loads and stores where the pointers allow (elementwise.cuh's
// map). The constants, clamps and formulas are the host's (snug/ops/gelu.hpp);
// the device evaluates them its own way, for fewer instructions:
// - the exponential e is expf (the host has its own vectorised one);
// - s = 1 / (1 + e) is one fast reciprocal (__fdividef: within 2 ulp, and 0
//   for a divisor past 2^126) of (1 + e) / 4, times 1/4, so that s stays
//   right (subnormal) where 1 + e passes 2^126, at x near -10;
// - gelu = x s; the derivative's 1 - s = 1 / (1 + 1/e) is e s, at most 1
//   (fminf: e = inf makes e s = inf * 0 = NaN, and 1 - s = 1 there).
// One reciprocal where the IEEE divisions were three (backward) or one
// (forward): SASS instructions per element of the bf16 kernels' loops on
// sm_90, backward 78.5 -> 41, forward 33.6 -> 26 (kernel_report's nvdisasm
// output). Each step is within a few fp32 ulp, so the results stay within
// the CUDA-vs-host tolerances (tests/cuda/elementwise_test.cu): fp32 within
// 1e-5 relative to |host| (forward) or |host| + 0.1 |dout| (backward),
// 16-bit within 1e-2 on the same scales.
#pragma once

#include <cstdint>

#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/elementwise.cuh"
#include "snug/ops/gelu.hpp"

namespace snug::cuda {

namespace detail {

// 1 / (1 + e) for e in [0, inf]: (1 + e) / 4 lies in [1/4, 2^126) below inf,
// where __fdividef's reciprocal is within 2 ulp; inf gives 0.
__device__ __forceinline__ float gelu_sigmoid(float e) { return 0.25f * __fdividef(1.0f, fmaf(0.25f, e, 0.25f)); }

struct GeluForward {
    __device__ float operator()(float x) const { return x * gelu_sigmoid(expf(ops::gelu_exponent(x))); }
};

struct GeluBackward {
    __device__ float operator()(float x, float dout) const {
        const float e = expf(ops::gelu_exponent(x));
        const float s = gelu_sigmoid(e);
        return ops::gelu_derivative_from_sigmoid(x, ops::gelu_clamped(x), s, fminf(e * s, 1.0f)) * dout;
    }
};

}  // namespace detail

// out = gelu(inp), elementwise; out may equal inp.
template <FloatStorage T>
void gelu_forward(const Device& dev, T* out,  // (n)
                  const T* inp,               // (n)
                  std::int64_t n) {
    ops::check_non_negative("gelu_forward", {{"n", n}});
    if (n > 0) detail::map1(dev, out, inp, n, detail::GeluForward{});
}

// dinp = gelu'(inp) * dout, elementwise, overwriting; dinp may equal inp or dout.
template <FloatStorage T>
void gelu_backward(const Device& dev, T* dinp,  // (n)
                   const T* inp,                // (n)
                   const T* dout,               // (n)
                   std::int64_t n) {
    ops::check_non_negative("gelu_backward", {{"n", n}});
    if (n > 0) detail::map2(dev, dinp, inp, dout, n, detail::GeluBackward{});
}

}  // namespace snug::cuda
