// The host GELU, tanh approximation (GPT-2's): forward and backward, the
// formulas of snug/ops/gelu.hpp in vectorisable loops. fp32 uses a
// vectorisable exponential (relative error about 2 ulp); double uses std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/gelu.hpp"

namespace snug::host {

namespace detail {

// e^x in fp32 for x in [-100, 89] (the caller clamps: see ops::gelu_exponent):
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

// Per element of x: arg = the clamped exponent -2 u(x) (snug/ops/gelu.hpp),
// and, when xc is not null, x clamped for the derivative. Loops of their own,
// so that they vectorise.
template <class A>
void gelu_prepare(A* arg, A* xc, const A* x, std::int64_t m) {
    for (std::int64_t j = 0; j < m; ++j) arg[j] = ops::gelu_exponent(x[j]);
    if (xc != nullptr) {
        for (std::int64_t j = 0; j < m; ++j) xc[j] = ops::gelu_clamped(x[j]);
    }
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
    ops::check_non_negative("gelu_forward", {{"n", n}});
    parallel_ranges(n, detail::gelu_grain, [&](std::int64_t begin, std::int64_t end) {
        A x[detail::gelu_chunk];
        A arg[detail::gelu_chunk];
        for (std::int64_t i0 = begin; i0 < end; i0 += detail::gelu_chunk) {
            const std::int64_t m = std::min(detail::gelu_chunk, end - i0);
            for (std::int64_t j = 0; j < m; ++j) x[j] = to_acc(inp[i0 + j]);
            detail::gelu_prepare<A>(arg, nullptr, x, m);
            for (std::int64_t j = 0; j < m; ++j) arg[j] = ops::gelu_value(x[j], detail::gelu_exp(arg[j]));
            for (std::int64_t j = 0; j < m; ++j) out[i0 + j] = from_acc<T>(arg[j]);
        }
    });
}

// dinp = gelu'(inp) * dout, elementwise, overwriting; dinp may equal inp or dout.
template <HostFloat T>
void gelu_backward(const Device&, T* dinp,  // (n)
                   const T* inp,            // (n)
                   const T* dout,           // (n)
                   std::int64_t n) {
    using A = acc_t<T>;
    ops::check_non_negative("gelu_backward", {{"n", n}});
    parallel_ranges(n, detail::gelu_grain, [&](std::int64_t begin, std::int64_t end) {
        A x[detail::gelu_chunk];
        A xc[detail::gelu_chunk];
        A arg[detail::gelu_chunk];
        for (std::int64_t i0 = begin; i0 < end; i0 += detail::gelu_chunk) {
            const std::int64_t m = std::min(detail::gelu_chunk, end - i0);
            for (std::int64_t j = 0; j < m; ++j) x[j] = to_acc(inp[i0 + j]);
            detail::gelu_prepare<A>(arg, xc, x, m);
            for (std::int64_t j = 0; j < m; ++j) {
                arg[j] = ops::gelu_derivative(x[j], xc[j], detail::gelu_exp(arg[j]));
            }
            for (std::int64_t j = 0; j < m; ++j) dinp[i0 + j] = from_acc<T>(arg[j] * to_acc(dout[i0 + j]));
        }
    });
}

}  // namespace snug::host
