// GELU (tanh approximation, GPT-2's) as both backends compute it: the
// constants, the clamps and the scalar formulas, host and device alike
// (snug/host/gelu.hpp vectorises around them, snug/cuda/gelu.cuh maps them).
//
//   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + e),  u = sqrt(2/pi) (x + 0.044715 x^3),  e = exp(-2u)
//
// through the identity 1 + tanh(u) = 2 sigmoid(2u): no cancellation for
// negative x, one exponential per element. A is float or double.
#pragma once

#include "snug/core/config.hpp"

namespace snug::ops {

inline constexpr double gelu_k0 = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_k1 = 0.044715;

// The exponent -2u of e. For float it is clamped to [-100, 89], where e is
// exp's to compute (exp(89) is +inf, so gelu = x / inf = -0 for very negative
// x, and exp(-100) underflows gradually); a NaN becomes 89 (the
// comparisons are false), and the formulas below restore it through x.
template <class A>
SNUG_HD A gelu_exponent(A x) {
    const A u = A(gelu_k0) * (x + A(gelu_k1) * x * x * x);
    const A arg = A(-2) * u;
    if constexpr (sizeof(A) == 4) {
        const A upper = arg < A(89) ? arg : A(89);    // std::min(89, arg)
        return A(-100) < upper ? upper : A(-100);     // std::max(-100, upper)
    } else {
        return arg;
    }
}

// x clamped to [-40, 40] for the derivative's polynomial factors (beyond, the
// derivative is 0 or 1 to double precision, and x^2 would overflow).
template <class A>
SNUG_HD A gelu_clamped(A x) {
    const A upper = x < A(40) ? x : A(40);
    return A(-40) < upper ? upper : A(-40);
}

// gelu(x) = x / (1 + e), e = exp(gelu_exponent(x)).
template <class A>
SNUG_HD A gelu_value(A x, A e) {
    return x / (A(1) + e);
}

// d gelu / dx = s + 2 x s (1 - s) du/dx from s = sigmoid(2u) = 1 / (1 + e)
// and s1m = 1 - s, each computed without cancellation (how is the caller's:
// gelu_derivative below, or the CUDA kernel's fast reciprocal). xc =
// gelu_clamped(x); adding x - x (0, or NaN for a NaN or an infinite x) keeps
// non-finite inputs non-finite.
template <class A>
SNUG_HD A gelu_derivative_from_sigmoid(A x, A xc, A s, A s1m) {
    const A du = A(gelu_k0) * (A(1) + A(3 * gelu_k1) * xc * xc);
    return (s + A(2) * xc * s * s1m * du) + (x - x);
}

// d gelu / dx from e = exp(gelu_exponent(x)): s = 1 / (1 + e) and
// 1 - s = 1 / (1 + 1/e), so no inf * 0 for e = 0 or inf.
template <class A>
SNUG_HD A gelu_derivative(A x, A xc, A e) {
    return gelu_derivative_from_sigmoid(x, xc, A(1) / (A(1) + e), A(1) / (A(1) + A(1) / e));
}

}  // namespace snug::ops
