// 16-bit <-> float conversions for the host GEMM's inner loops: the same
// values as core/half.hpp's conversions (NaN aside: its payload is kept), but
// branch-free, so that a loop over many values vectorizes; and widen/narrow,
// a contiguous run each way.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>

#include "snug/core/half.hpp"

namespace snug::host::detail {


// The same value as half_bits_to_float for every input but NaN, which stays a
// NaN (with its sign and payload, not the canonical one). Every case is
// computed and the answer picked with masks, so a loop over it vectorizes; no
// float subnormal is touched, so flush-to-zero modes do not change the result.
constexpr float half_to_float_fast(std::uint16_t h) {
    const std::uint32_t sign = (std::uint32_t{h} & 0x8000U) << 16;
    const std::uint32_t mag = h & 0x7FFFU;
    const std::uint32_t normal = (mag << 13) + ((127U - 15U) << 23);  // exponent 1..30: rebias
    const std::uint32_t special = (mag << 13) | 0x7F80'0000U;         // exponent 31: inf, NaN
    // exponent 0: mag units of 2^-24, exact (mag < 2^10)
    const std::uint32_t subnormal =
        std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mag)) * 0x1p-24f);
    const std::uint32_t is_subnormal = 0U - static_cast<std::uint32_t>(mag < 0x0400U);
    const std::uint32_t is_special = 0U - static_cast<std::uint32_t>(mag >= 0x7C00U);
    const std::uint32_t bits =
        (subnormal & is_subnormal) | (special & is_special) | (normal & ~(is_subnormal | is_special));
    return std::bit_cast<float>(sign | bits);
}

// float -> half bits, round to nearest even: the same bits as
// float_to_half_bits for every input (NaN -> the canonical 0x7FFF), written
// like half_to_float_fast so that loops vectorize. The subnormal range uses a
// float addition that rounds to nearest even in the default rounding mode; a
// float subnormal input (|x| < 2^-126) gives a signed zero, which is right
// whether or not denormals are flushed.
constexpr std::uint16_t float_to_half_fast(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000U;
    const std::uint32_t mag = x & 0x7FFF'FFFFU;
    // Normal half (2^-14 <= |f| < 65520): rebias the exponent and round 13
    // mantissa bits away, ties to even; a carry correctly bumps the exponent,
    // up to infinity (0x7C00) from 65520 on.
    const std::uint32_t odd = (mag >> 13) & 1U;
    const std::uint32_t normal = (mag - ((127U - 15U) << 23) + 0x0FFFU + odd) >> 13;
    // Subnormal half (|f| < 2^-14): adding 0.5 puts |f| in units of 2^-24 into
    // the low mantissa bits of the sum, rounded by the float adder.
    const float shifted = std::bit_cast<float>(mag) + 0.5f;
    const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(shifted) - 0x3F00'0000U;
    const std::uint32_t is_nan = 0U - static_cast<std::uint32_t>(mag > 0x7F80'0000U);
    const std::uint32_t is_inf = (0U - static_cast<std::uint32_t>(mag >= 0x4780'0000U)) & ~is_nan;  // >= 65536
    const std::uint32_t is_subnormal = 0U - static_cast<std::uint32_t>(mag < 0x3880'0000U);
    const std::uint32_t is_normal = ~(is_nan | is_inf | is_subnormal);
    const std::uint32_t value = (normal & is_normal) | (subnormal & is_subnormal) | (0x7C00U & is_inf);
    return static_cast<std::uint16_t>(((sign | value) & ~is_nan) | (0x7FFFU & is_nan));
}

// float -> bfloat16 bits, round to nearest even: the same bits as
// float_to_bfloat16_bits for every input (NaN -> 0x7FFF), branch-free.
constexpr std::uint16_t float_to_bfloat16_fast(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t is_nan = 0U - static_cast<std::uint32_t>((x & 0x7FFF'FFFFU) > 0x7F80'0000U);
    const std::uint32_t rounded = (x + 0x7FFFU + ((x >> 16) & 1U)) >> 16;
    return static_cast<std::uint16_t>((rounded & ~is_nan) | (0x7FFFU & is_nan));
}

inline float to_float(float x) { return x; }
inline float to_float(half x) { return half_to_float_fast(x.bits); }
inline float to_float(bfloat16 x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }

template <class T>
T from_float(float x) {
    if constexpr (std::same_as<T, half>) {
        return half::from_bits(float_to_half_fast(x));
    } else if constexpr (std::same_as<T, bfloat16>) {
        return bfloat16::from_bits(float_to_bfloat16_fast(x));
    } else {
        return x;
    }
}

// dst[i] = float(src[i]) for a contiguous run.
template <class T>
void widen(const T* src, std::int64_t n, float* dst) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

// dst[i] = T(src[i]), rounded to nearest even, for a contiguous run.
template <class T>
void narrow(const float* src, std::int64_t n, T* dst) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

}  // namespace snug::host::detail
