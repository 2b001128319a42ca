// SwiGLU's contract, for every backend (Llama's MLP activation): the layout,
// the argument check and the scalar formulas, host and device alike
// (snug/host/swiglu.hpp loops over them, snug/cuda/swiglu.cuh maps them).
//
// Layout: inp is (N, 2H), each row the gate half then the up half,
//   inp[n, 0 .. H-1] = gate[n, :],  inp[n, H .. 2H-1] = up[n, :]
// (one fused (2H, C) projection, gate rows first); out is (N, H):
//   out[n, h] = silu(gate[n, h]) * up[n, h],  silu(g) = g sigmoid(g) = g / (1 + e^-g).
// Backward, from dout (N, H) and the saved inp, overwriting dinp (N, 2H):
//   dgate = dout * up * silu'(gate),  dup = dout * silu(gate),
//   silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g).
// A is float or double; e = exp(-g) comes from the backend's exponential.
#pragma once

#include <cstdint>

#include "snug/core/config.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// N rows of H outputs (2H inputs): non-negative.
inline void check_swiglu(const char* op, std::int64_t N, int H) {
    check_non_negative(op, {{"N", N}, {"H", H}});
}

// silu(g) = g * sigmoid(g), e = exp(-g). e = inf (g < -88 in fp32) gives
// sigmoid 0 and silu -0, no NaN.
template <class A>
SNUG_HD A silu_value(A g, A e) {
    return g / (A(1) + e);
}

// silu'(g) = s + g s (1 - s), with s = 1 / (1 + e) and 1 - s = 1 / (1 + 1/e):
// no cancellation, and no inf * 0 for e = 0 or inf at finite g.
template <class A>
SNUG_HD A silu_derivative(A g, A e) {
    const A s = A(1) / (A(1) + e);
    const A s1m = A(1) / (A(1) + A(1) / e);
    return s * (A(1) + g * s1m);
}

}  // namespace snug::ops
