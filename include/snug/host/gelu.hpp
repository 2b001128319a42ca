// The host GELU, tanh approximation (GPT-2's): forward and backward.
//
// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
// through the identity 1 + tanh(u) = 2 sigmoid(2u) as x / (1 + exp(-2u)):
// no cancellation for negative x, one exponential per element. fp32 uses a
// vectorisable exponential (relative error about 2 ulp); double uses std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"

namespace snug::host {

namespace detail {

inline constexpr double gelu_k0 = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_k1 = 0.044715;

// e^x in fp32 for x in [-100, 89] (the caller clamps: see gelu_prepare):
// exp_parts' 2^n e^r, scaled by 2^n in two exact halves, so that results
// past FLT_MAX (x > 88.72) are +inf and tiny ones (x < -87.3) underflow
// gradually. (A clamp inside the same loop would not vectorise: GCC threads
// the clamped constant through the rest and gives up on the loop.)
inline float exp_f32(float x) {
    const auto [n, p] = exp_parts(x);
    // 2^n = 2^n1 * 2^n2, each a normal float for n in [-145, 129].
    const auto ni = static_cast<std::int32_t>(n);
    const std::int32_t n1 = ni / 2;
    const std::int32_t n2 = ni - n1;
    const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(n1 + 127) << 23);
    const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(n2 + 127) << 23);
    return (p * s1) * s2;
}

// e^x for the compute type: the fp32 kernel above (x clamped by the caller),
// or std::exp for double.
template <class A>
A gelu_exp(A x) {
    if constexpr (std::same_as<A, float>) {
        return exp_f32(x);
    } else {
        return std::exp(x);
    }
}

// Per element of x: arg = -2 u(x), the exponent of sigmoid(2u) = 1 / (1 +
// e^arg), and xc = x clamped to [-40, 40] for the derivative's polynomial
// factors (beyond, the derivative is 0 or 1 to double precision, and x^2
// would overflow for huge x). For fp32, arg is clamped to [-100, 89], inside
// exp_f32's range (a NaN becomes 89: std::min(89, NaN) is 89, so the integer
// conversion stays defined; the kernels restore the NaN through x).
template <class A>
void gelu_prepare(A* arg, A* xc, const A* x, std::int64_t m) {
    for (std::int64_t j = 0; j < m; ++j) {
        const A u = A(gelu_k0) * (x[j] + A(gelu_k1) * x[j] * x[j] * x[j]);
        if constexpr (std::same_as<A, float>) {
            arg[j] = std::max(-100.0F, std::min(89.0F, -2.0F * u));
        } else {
            arg[j] = A(-2) * u;
        }
    }
    if (xc != nullptr) {
        for (std::int64_t j = 0; j < m; ++j) xc[j] = std::max(A(-40), std::min(A(40), x[j]));
    }
}

// gelu(x) = x sigmoid(2u) = x / (1 + e), e = exp(-2u) (e = inf gives -0 for
// very negative x).
template <class A>
A gelu_value(A x, A e) {
    return x / (A(1) + e);
}

// d gelu / dx = s + 2 x s (1 - s) du/dx with s = sigmoid(2u) = 1 / (1 + e) and
// 1 - s = 1 / (1 + 1/e): no cancellation, and no inf * 0 for e = 0 or inf.
// xc is x clamped (gelu_prepare); adding x - x (0, or NaN for a NaN or an
// infinite x) keeps non-finite inputs non-finite.
template <class A>
A gelu_derivative(A x, A xc, A e) {
    const A du = A(gelu_k0) * (A(1) + A(3 * gelu_k1) * xc * xc);
    const A s = A(1) / (A(1) + e);
    const A s1m = A(1) / (A(1) + A(1) / e);
    return (s + A(2) * xc * s * s1m * du) + (x - x);
}

// Elements per parallel task (one exponential each).
inline constexpr std::int64_t gelu_grain = std::int64_t{1} << 15;
// Elements per step through the stack buffers.
inline constexpr std::int64_t gelu_chunk = 256;

}  // namespace detail

// out = gelu(inp), elementwise; out may equal inp.
template <HostFloat T>
void gelu_forward(const Device&, T* out,  // (n)
                  const T* inp,           // (n)
                  std::int64_t n) {
    using A = acc_t<T>;
    detail::check_non_negative("gelu_forward", {{"n", n}});
    parallel_ranges(n, detail::gelu_grain, [&](std::int64_t begin, std::int64_t end) {
        A x[detail::gelu_chunk];
        A arg[detail::gelu_chunk];
        for (std::int64_t i0 = begin; i0 < end; i0 += detail::gelu_chunk) {
            const std::int64_t m = std::min(detail::gelu_chunk, end - i0);
            for (std::int64_t j = 0; j < m; ++j) x[j] = to_acc(inp[i0 + j]);
            detail::gelu_prepare<A>(arg, nullptr, x, m);
            for (std::int64_t j = 0; j < m; ++j) arg[j] = detail::gelu_value(x[j], detail::gelu_exp(arg[j]));
            for (std::int64_t j = 0; j < m; ++j) out[i0 + j] = from_acc<T>(arg[j]);
        }
    });
}

// dinp = gelu'(inp) * dout, elementwise, overwriting; dinp may equal dout.
template <HostFloat T>
void gelu_backward(const Device&, T* dinp,  // (n)
                   const T* inp,            // (n)
                   const T* dout,           // (n)
                   std::int64_t n) {
    using A = acc_t<T>;
    detail::check_non_negative("gelu_backward", {{"n", n}});
    parallel_ranges(n, detail::gelu_grain, [&](std::int64_t begin, std::int64_t end) {
        A x[detail::gelu_chunk];
        A xc[detail::gelu_chunk];
        A arg[detail::gelu_chunk];
        for (std::int64_t i0 = begin; i0 < end; i0 += detail::gelu_chunk) {
            const std::int64_t m = std::min(detail::gelu_chunk, end - i0);
            for (std::int64_t j = 0; j < m; ++j) x[j] = to_acc(inp[i0 + j]);
            detail::gelu_prepare<A>(arg, xc, x, m);
            for (std::int64_t j = 0; j < m; ++j) {
                arg[j] = detail::gelu_derivative(x[j], xc[j], detail::gelu_exp(arg[j]));
            }
            for (std::int64_t j = 0; j < m; ++j) dinp[i0 + j] = from_acc<T>(arg[j] * to_acc(dout[i0 + j]));
        }
    });
}

}  // namespace snug::host
