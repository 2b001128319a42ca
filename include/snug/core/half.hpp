// The two 16-bit floating-point storage types, snug::half (IEEE binary16) and
// snug::bfloat16, with conversions to and from float that are bit-exact with
// CUDA's __float2half_rn / __half2float / __float2bfloat16_rn / __bfloat162float
// on the host and on the device.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "snug/core/config.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

// Conventions shared by both types, all as CUDA does them:
// - float -> 16-bit rounds to nearest, ties to even, including into and out of
//   the subnormal range; a finite float beyond the largest finite 16-bit value
//   plus half an ulp becomes infinity of the same sign (half: 65520 -> +inf,
//   the float just below 65520 -> 65504).
// - Every NaN becomes the canonical NaN 0x7FFF (positive, all payload bits set),
//   whatever its sign and payload; that is what CUDA's host emulation returns,
//   and the canonical NaN PTX's cvt produces on the device.
// - 16-bit -> float is exact. For half, a NaN becomes the float NaN 0x7FFFFFFF
//   (CUDA's host emulation drops its sign and payload); for bfloat16 the bits
//   are widened unchanged, so a NaN keeps its sign and payload.
// On the host the conversions are portable integer code (no floating-point
// environment, no compiler extension); in the device pass they are CUDA's
// intrinsics.

namespace snug {

// ---- bit-level conversions ---------------------------------------------------

namespace detail {

// Host implementations (constexpr, portable integer code). The device pass
// uses CUDA's intrinsics instead, in the public functions below.

// Rounds away the low `shift` bits of `value` to nearest, ties to even.
// 1 <= shift <= 31; the result may carry into the next bit above.
constexpr std::uint32_t round_shift_right_rne(std::uint32_t value, unsigned shift) {
    const std::uint32_t kept = value >> shift;
    const std::uint32_t dropped = value & ((std::uint32_t{1} << shift) - 1U);
    const std::uint32_t halfway = std::uint32_t{1} << (shift - 1U);
    const bool round_up = dropped > halfway || (dropped == halfway && (kept & 1U) != 0U);
    return kept + (round_up ? 1U : 0U);
}

constexpr std::uint16_t float_to_half_bits_host(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
    const std::uint32_t magnitude = x & 0x7FFF'FFFFU;

    if (magnitude > 0x7F80'0000U) return 0x7FFF;           // NaN: canonical
    if (magnitude >= 0x477F'F000U) return sign | 0x7C00U;  // >= 65520 (and inf): inf
    if (magnitude >= 0x3880'0000U) {                       // >= 2^-14: a normal half
        // Rebias the exponent from 127 to 15, then drop 13 mantissa bits; a
        // carry out of the mantissa correctly bumps the exponent.
        const std::uint32_t rebiased = magnitude - ((127U - 15U) << 23);
        return static_cast<std::uint16_t>(sign | round_shift_right_rne(rebiased, 13));
    }
    if (magnitude <= 0x3300'0000U) return sign;  // <= 2^-25: ties to the even zero
    // A half subnormal counts units of 2^-24. The float is m * 2^(e - 150) with
    // m the 24-bit significand, so it is m >> (126 - e) such units, e in [102, 112].
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t significand = (magnitude & 0x007F'FFFFU) | 0x0080'0000U;
    return static_cast<std::uint16_t>(sign | round_shift_right_rne(significand, 126U - exponent));
}

constexpr float half_bits_to_float_host(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1FU;
    const std::uint32_t mantissa = h & 0x03FFU;

    std::uint32_t x = 0;
    if (exponent == 0x1FU) {
        x = mantissa != 0U ? 0x7FFF'FFFFU : (sign | 0x7F80'0000U);  // NaN canonical, or inf
    } else if (exponent != 0U) {
        x = sign | ((exponent + 127U - 15U) << 23) | (mantissa << 13);
    } else if (mantissa == 0U) {
        x = sign;
    } else {
        // mantissa * 2^-24 with its top set bit at position p is 1.f * 2^(p - 24).
        const auto p = static_cast<std::uint32_t>(std::bit_width(mantissa)) - 1U;
        x = sign | ((p - 24U + 127U) << 23) | ((mantissa << (23U - p)) & 0x007F'FFFFU);
    }
    return std::bit_cast<float>(x);
}

constexpr std::uint16_t float_to_bfloat16_bits_host(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7FFF'FFFFU) > 0x7F80'0000U) return 0x7FFF;  // NaN: canonical
    // bfloat16 is the top half of a float: round the low 16 bits away. A carry
    // bumps the exponent, up to infinity past the largest finite value.
    return static_cast<std::uint16_t>(round_shift_right_rne(x, 16));
}

constexpr float bfloat16_bits_to_float_host(std::uint16_t b) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}
}  // namespace detail

// float -> IEEE binary16 bits, round to nearest even (CUDA's __float2half_rn).
SNUG_HD std::uint16_t float_to_half_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    return detail::float_to_half_bits_host(f);
#endif
}

// IEEE binary16 bits -> float, exact (CUDA's __half2float).
SNUG_HD float half_bits_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return detail::half_bits_to_float_host(h);
#endif
}

// float -> bfloat16 bits, round to nearest even (CUDA's __float2bfloat16_rn).
SNUG_HD std::uint16_t float_to_bfloat16_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    return detail::float_to_bfloat16_bits_host(f);
#endif
}

// bfloat16 bits -> float, exact (CUDA's __bfloat162float).
SNUG_HD float bfloat16_bits_to_float(std::uint16_t b) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(b));
#else
    return detail::bfloat16_bits_to_float_host(b);
#endif
}

// ---- the storage types ---------------------------------------------------------

// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits; largest finite 65504.
// Trivial (a default-constructed half holds indeterminate bits, like a float;
// half{} is +0). No arithmetic: compute in float, store as half.
struct half {
    std::uint16_t bits;

    half() = default;
    SNUG_HD explicit half(float f) : bits(float_to_half_bits(f)) {}
    // Integers convert through float (exact up to 2^24).
    template <std::integral I>
    SNUG_HD explicit half(I i) : half(static_cast<float>(i)) {}
    // Deleted: double -> float -> half can round twice. Narrow to float first,
    // where that is what is meant.
    explicit half(double) = delete;
    explicit half(long double) = delete;

    SNUG_HD explicit operator float() const { return half_bits_to_float(bits); }

    static SNUG_HD constexpr half from_bits(std::uint16_t b) {
        half h{};
        h.bits = b;
        return h;
    }
};

// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (float's range, 8 bits of
// precision); largest finite 0x7F7F = 3.3895314e38. Same conventions as half.
struct bfloat16 {
    std::uint16_t bits;

    bfloat16() = default;
    SNUG_HD explicit bfloat16(float f) : bits(float_to_bfloat16_bits(f)) {}
    template <std::integral I>
    SNUG_HD explicit bfloat16(I i) : bfloat16(static_cast<float>(i)) {}
    explicit bfloat16(double) = delete;
    explicit bfloat16(long double) = delete;

    SNUG_HD explicit operator float() const { return bfloat16_bits_to_float(bits); }

    static SNUG_HD constexpr bfloat16 from_bits(std::uint16_t b) {
        bfloat16 v{};
        v.bits = b;
        return v;
    }
};

static_assert(sizeof(half) == 2 && alignof(half) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_standard_layout_v<half>);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>);
static_assert(std::is_trivially_default_constructible_v<half>);
static_assert(std::is_trivially_default_constructible_v<bfloat16>);

// ---- classification (on the bits; exact, no conversion) -----------------------

SNUG_HD constexpr bool is_nan(half h) { return (h.bits & 0x7FFFU) > 0x7C00U; }
SNUG_HD constexpr bool is_inf(half h) { return (h.bits & 0x7FFFU) == 0x7C00U; }
SNUG_HD constexpr bool is_finite(half h) { return (h.bits & 0x7C00U) != 0x7C00U; }

SNUG_HD constexpr bool is_nan(bfloat16 b) { return (b.bits & 0x7FFFU) > 0x7F80U; }
SNUG_HD constexpr bool is_inf(bfloat16 b) { return (b.bits & 0x7FFFU) == 0x7F80U; }
SNUG_HD constexpr bool is_finite(bfloat16 b) { return (b.bits & 0x7F80U) != 0x7F80U; }

// ---- CUDA's native types (nvcc translation units only) -------------------------

#if defined(__CUDACC__)
static_assert(sizeof(__half) == sizeof(half) && alignof(__half) == alignof(half));
static_assert(sizeof(__nv_bfloat16) == sizeof(bfloat16) &&
              alignof(__nv_bfloat16) == alignof(bfloat16));

// Bit-preserving moves between snug's types and CUDA's (no rounding).
SNUG_HD __half to_native(half h) {
    __half_raw raw;
    raw.x = h.bits;
    return __half(raw);
}
SNUG_HD half from_native(__half h) { return half::from_bits(static_cast<__half_raw>(h).x); }

SNUG_HD __nv_bfloat16 to_native(bfloat16 b) {
    __nv_bfloat16_raw raw;
    raw.x = b.bits;
    return __nv_bfloat16(raw);
}
SNUG_HD bfloat16 from_native(__nv_bfloat16 b) {
    return bfloat16::from_bits(static_cast<__nv_bfloat16_raw>(b).x);
}
#endif

}  // namespace snug
