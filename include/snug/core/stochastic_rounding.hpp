// Stochastic rounding to bfloat16: the value rounds to one of its two
// bfloat16 neighbours with probabilities that make the rounding unbiased on
// average — what lets an optimizer keep bf16 moments or bf16 weights without
// an fp32 copy (small updates survive in expectation instead of vanishing
// under round-to-nearest). The random bits come from the caller (snug's
// Philox stream), so host and device give the same bits.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "snug/core/config.hpp"
#include "snug/core/half.hpp"

namespace snug {

// The bits of a float (host and device).
SNUG_HD std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    return std::bit_cast<std::uint32_t>(x);
#endif
}

// x rounded to bfloat16 with the low 16 bits of `random` as the dice: the 16
// bits bfloat16 drops are added to them and the carry decides. With the
// dropped bits d (0..65535) the magnitude rounds up (away from zero) with
// probability d / 65536 and down otherwise, so E[result] = x for every finite
// x whose neighbours are finite (sign-magnitude: the same rule both sides of
// zero). A value above the largest finite bfloat16 may round up to infinity
// (its upper neighbour). Infinities stay; a NaN becomes the canonical NaN, as
// round-to-nearest does.
SNUG_HD bfloat16 stochastic_round_bf16(float x, std::uint32_t random) {
    const std::uint32_t bits = float_bits(x);
    if ((bits & 0x7FFF'FFFFU) > 0x7F80'0000U) return bfloat16::from_bits(0x7FFF);  // NaN
    if ((bits & 0x7FFF'FFFFU) == 0x7F80'0000U) return bfloat16::from_bits(static_cast<std::uint16_t>(bits >> 16));
    return bfloat16::from_bits(static_cast<std::uint16_t>((bits + (random & 0xFFFFU)) >> 16));
}

// The types an optimizer keeps its state (moments, master weights) in.
template <class T>
concept OptimizerStateType = std::same_as<T, float> || std::same_as<T, bfloat16>;

// x stored as T: unchanged for float, stochastically rounded for bfloat16.
template <OptimizerStateType T>
SNUG_HD T store_rounded(float x, [[maybe_unused]] std::uint32_t random) {
    if constexpr (std::is_same_v<T, float>)
        return x;
    else
        return stochastic_round_bf16(x, random);
}

}  // namespace snug
