// Eight-bit block-wise AdamW moments, for every backend: the two code
// tables, the block size, how a value becomes a code (stochastically, between
// its two neighbouring codes) and a code a value again, and the pointers one
// update reads and writes. The AdamW kernels (host/adamw.hpp, cuda/adamw.cuh)
// call these functions, so both store the same bytes.
//
// The scheme (block-wise dynamic quantisation, as in Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", 2022; tables and rounding designed
// here): the moments of a parameter group are cut into blocks of
// moment_block values from the group's start; each block keeps one fp32
// absmax per moment (the largest |m|, the largest v) and one byte per value,
// the index of the code nearest below or above value / absmax. The codes
// spread over decades, denser near the block's maximum, where the values
// that drive the update sit:
//   first moment (signed): a sign bit and 7 bits of magnitude — 0, then 127
//     codes in 7 decades: 64 linearly spaced in (0.1, 1], 32 in (0.01, 0.1],
//     ..., 1 in (1e-7, 1e-6] (that is, 1e-6);
//   second moment (v >= 0): 8 bits, no zero — 255 codes in 8 decades (128 in
//     (0.1, 1] down to 1 in (1e-8, 1e-7]) and 1e-8 below them. v has no zero
//     code so that a value too small for the block never becomes 0 while its
//     m is not (the update divides m by sqrt(v)): it rounds up to 1e-8 of the
//     block's largest v, which only shortens that element's step.
// A value rounds to the code above it with probability equal to its position
// between the two (the Philox word of AdamW's stream, ops/adamw.hpp), so the
// stored moments are unbiased: E[dequantised] = the fp32 value (for |m| below
// 1e-6 of its block's absmax too: 0 and 1e-6 are neighbours).
// Non-finite values: the absmax of a block that holds a NaN or an infinity is
// NaN, so the whole block's moments read back NaN (the weights it updated are
// already NaN or infinite; nothing hides it).
#pragma once

#include <bit>
#include <cstdint>
#include <string>

#include "snug/core/config.hpp"
#include "snug/core/error.hpp"
#include "snug/core/rng.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Values per quantisation block (one fp32 absmax per block and moment).
inline constexpr int moment_block = 256;

// Blocks for a group of n values (the last one may be partial).
constexpr std::int64_t moment_blocks(std::int64_t n) { return (n + moment_block - 1) / moment_block; }

// The two code tables, ascending: first[k] is the magnitude of the first
// moment's code k (sign in bit 7), second[q] the second moment's code q; both
// are value / absmax, and end at 1.
struct MomentCodes {
    float first[128];
    float second[256];
};

namespace detail {

// `count` codes of `bits` bits of magnitude after `out[0]`: decade e (0 =
// the top one, (0.1, 1]) holds 2^(bits - 1 - e) codes spaced linearly up to
// 10^-e, for e = 0 .. bits - 1, written ascending from out[1].
constexpr void decade_codes(float* out, int bits) {
    int at = (1 << bits) - 1;  // the top code, 1.0, goes last
    double top = 1.0;
    for (int e = 0; e < bits; ++e) {
        const int n = 1 << (bits - 1 - e);
        const double bottom = top / 10.0;
        for (int j = n; j >= 1; --j) out[at--] = static_cast<float>(bottom + (top - bottom) * j / n);
        top = bottom;
    }
}

constexpr MomentCodes make_moment_codes() {
    MomentCodes c{};
    c.first[0] = 0.0f;
    decade_codes(c.first, 7);
    c.second[0] = 1e-8f;
    decade_codes(c.second, 8);
    return c;
}

}  // namespace detail

// The tables, built once at compile time (the same floats for every backend;
// a CUDA kernel takes them by value and copies them to shared memory).
inline constexpr MomentCodes moment_codes = detail::make_moment_codes();

// One update's 8-bit moments: codes (n) and absmax (moment_blocks(n)) for m and
// v, block 0 starting at element 0.
struct BlockwiseMoments {
    std::uint8_t* m;  // (n) sign bit | 7-bit index into MomentCodes::first
    float* m_absmax;  // (blocks)
    std::uint8_t* v;  // (n) index into MomentCodes::second
    float* v_absmax;  // (blocks)
};

// ---- the arithmetic, host and device alike --------------------------------------

// The largest of a and b, NaN when either is: the block's absmax then marks
// the block as non-finite, whatever the order of the reduction.
SNUG_HD float max_or_nan(float a, float b) { return (a != a || a > b) ? a : b; }

// The quiet NaN every backend stores as a non-finite block's absmax.
SNUG_HD float canonical_nan() {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(0x7FC0'0000U);
#else
    return std::bit_cast<float>(0x7FC0'0000U);
#endif
}

// A block's absmax as stored, from the reduction's result (>= 0 or NaN):
// itself when finite, else the canonical NaN (an infinity, too, marks the
// block as non-finite).
SNUG_HD float stored_absmax(float max) { return max <= 3.40282347e38f ? max : canonical_nan(); }

// The largest k with table[k] <= x, for table[0] <= x < table[n - 1]. The
// search uses the tables' shape (n a power of two; the decade of n / 2^d
// codes at indices [n / 2^d, n / 2^(d-1)), linearly spaced from the entry
// below it): step down the decades to x's, guess the index from x's place in
// it, and correct the guess against the table, so the result is exact in a
// few comparisons.
SNUG_HD int code_at_or_below(const float* table, int n, float x) {
    int half = n / 2;  // x's decade: indices [half, 2 half), above table[half - 1]
    while (half > 1 && x <= table[half - 1]) half /= 2;
    const float bottom = table[half - 1], top = table[2 * half - 1];
    int k = half - 1 + static_cast<int>((x - bottom) / (top - bottom) * static_cast<float>(half));
    k = k < half - 1 ? half - 1 : (k > 2 * half - 1 ? 2 * half - 1 : k);
    while (k + 1 < n && table[k + 1] <= x) ++k;
    while (k > 0 && table[k] > x) --k;
    return k;
}

// Index of the code of `table` (n ascending entries) that x rounds to: the
// largest entry <= x, or the next one above with probability (x - lo) / (hi
// - lo), decided by 24 bits of `die` against the distance in fp32 (the same
// operations on every backend: no fused multiply-add can form here). Below
// the first entry (or NaN): 0; at or above the last: n - 1.
SNUG_HD int round_to_code(const float* table, int n, float x, std::uint32_t die) {
    if (!(x >= table[0])) return 0;
    if (x >= table[n - 1]) return n - 1;
    const int lo = code_at_or_below(table, n, x);
    const float below = x - table[lo];
    const float gap = table[lo + 1] - table[lo];
    return below > bits_to_uniform(die) * gap ? lo + 1 : lo;
}

// m as a code of a block whose largest |m| is absmax (>= |m|, or NaN).
SNUG_HD std::uint8_t quantize_first(const MomentCodes& c, float m, float absmax, std::uint32_t die) {
    if (absmax == 0.0f) return 0;
    const float a = (m < 0.0f ? -m : m) / absmax;
    const int k = round_to_code(c.first, 128, a, die);
    return static_cast<std::uint8_t>(k == 0 ? 0 : (m < 0.0f ? 0x80 : 0) | k);
}

SNUG_HD float dequantize_first(const MomentCodes& c, std::uint8_t q, float absmax) {
    const float a = c.first[q & 0x7F] * absmax;
    return (q & 0x80) != 0 ? -a : a;
}

// v (>= 0) as a code of a block whose largest v is absmax (>= v, or NaN).
SNUG_HD std::uint8_t quantize_second(const MomentCodes& c, float v, float absmax, std::uint32_t die) {
    if (absmax == 0.0f) return 0;
    return static_cast<std::uint8_t>(round_to_code(c.second, 256, v / absmax, die));
}

SNUG_HD float dequantize_second(const MomentCodes& c, std::uint8_t q, float absmax) { return c.second[q] * absmax; }

// Throws ShapeError for n < 0 and ConfigError for step < 1, as check_adamw.
inline void check_adamw_8bit(std::int64_t n, int step) {
    check_non_negative("adamw_update_8bit", {{"n", n}});
    if (step < 1)
        throw ConfigError("adamw_update_8bit: step = " + std::to_string(step) + ", but steps count from 1");
}

}  // namespace snug::ops
