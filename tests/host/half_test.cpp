// snug::half and snug::bfloat16: conversions against independent references.
//
// References, none of which shares code with the library:
//  - a generic IEEE rounding model in double arithmetic (this file), for both types;
//  - GCC's _Float16 (libgcc's soft-float __truncsfhf2 / __extendhfsf2 on x86-64), for half;
//  - CUDA's own host emulation (__float2half_rn, __half2float, __float2bfloat16_rn,
//    __bfloat162float from <cuda_fp16.h> / <cuda_bf16.h>, compiled by g++) when the
//    CUDA toolkit is present (SNUG_TEST_HAVE_CUDA_HEADERS). Only that one is compared
//    on NaN bits too: it is the definition of what "bit-exact with CUDA" means.
//  - hand-picked known answers, written down from the formats' definitions.
//
// Why NaN is special: IEEE 754 does not define which NaN a conversion returns.
// CUDA canonicalises: float -> half/bfloat16 turns every NaN (any sign, any payload)
// into 0x7FFF, and half -> float turns every half NaN into 0x7FFFFFFF; bfloat16 ->
// float just widens the bits, so a bfloat16 NaN keeps its sign and payload. snug
// does the same, so a NaN pattern does not survive a 16 -> float -> 16 round trip
// bit for bit: it comes back as 0x7FFF, still a NaN. _Float16 (GCC) keeps payloads
// instead, so it is only compared on non-NaN values.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "snug/core/half.hpp"

#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace {

// Qualified names throughout: <cuda_fp16.h> declares a global ::half.
using Half = snug::half;
using BFloat16 = snug::bfloat16;

// ---- an independent reference: IEEE binary formats modelled in double --------

// A binary floating-point format with `precision` significand bits (implicit bit
// included), minimum normal exponent `emin` and maximum exponent `emax`.
struct Format {
    int precision;
    int emin;
    int emax;
    int exponent_bits() const { return precision == 11 ? 5 : 8; }
    int bias() const { return emax; }
    double max_finite() const { return std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), emax); }
};
constexpr Format binary16{11, -14, 15};
constexpr Format bf16_format{8, -126, 127};

// Round a finite float to the nearest value of `fmt`, ties to the even
// significand, with IEEE overflow (anything that rounds past max_finite is inf).
// Works on magnitudes in double, where every step here is exact.
double reference_round(float f, const Format& fmt) {
    const double x = std::fabs(static_cast<double>(f));
    if (x == 0.0) return 0.0;
    int e2 = 0;
    std::frexp(x, &e2);  // x = m * 2^e2, m in [0.5, 1): the leading bit has weight 2^(e2-1)
    const int exponent = std::max(e2 - 1, fmt.emin);
    const double quantum = std::ldexp(1.0, exponent - (fmt.precision - 1));
    const double units = x / quantum;  // exact: scaling by a power of two
    const double below = std::floor(units);
    const double fraction = units - below;
    double rounded = below;
    if (fraction > 0.5 || (fraction == 0.5 && std::fmod(below, 2.0) != 0.0)) rounded = below + 1.0;
    const double result = rounded * quantum;
    if (result > fmt.max_finite()) return std::numeric_limits<double>::infinity();
    return result;
}

// Encode a double that is exactly a value of `fmt` (or inf) into its bits.
std::uint16_t reference_encode(double magnitude, bool negative, const Format& fmt) {
    const int mant_bits = fmt.precision - 1;
    const std::uint32_t exp_all_ones = (1U << fmt.exponent_bits()) - 1U;
    std::uint32_t bits = 0;
    if (std::isinf(magnitude)) {
        bits = exp_all_ones << mant_bits;
    } else if (magnitude < std::ldexp(1.0, fmt.emin)) {
        bits = static_cast<std::uint32_t>(magnitude / std::ldexp(1.0, fmt.emin - mant_bits));
    } else {
        int e2 = 0;
        const double m = std::frexp(magnitude, &e2);  // magnitude = (2m) * 2^(e2-1)
        const auto field = static_cast<std::uint32_t>(e2 - 1 + fmt.bias());
        const auto frac = static_cast<std::uint32_t>((2.0 * m - 1.0) * std::ldexp(1.0, mant_bits));
        bits = (field << mant_bits) | frac;
    }
    const std::uint32_t sign_bit = 1U << (fmt.precision - 1 + fmt.exponent_bits());
    return static_cast<std::uint16_t>(bits | (negative ? sign_bit : 0U));
}

// The value a bit pattern of `fmt` encodes (NaN for NaN patterns), in double.
double reference_decode(std::uint16_t bits, const Format& fmt) {
    const int mant_bits = fmt.precision - 1;
    const std::uint32_t mant = bits & ((1U << mant_bits) - 1U);
    const std::uint32_t field = (bits >> mant_bits) & ((1U << fmt.exponent_bits()) - 1U);
    const bool negative = (bits & 0x8000U) != 0U;
    double v = 0.0;
    if (field == (1U << fmt.exponent_bits()) - 1U) {
        v = mant == 0U ? std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::quiet_NaN();
    } else if (field == 0U) {
        v = std::ldexp(static_cast<double>(mant), fmt.emin - mant_bits);
    } else {
        v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -mant_bits),
                       static_cast<int>(field) - fmt.bias());
    }
    return negative ? -v : v;
}

// Reference float -> 16-bit for non-NaN floats.
std::uint16_t reference_to_bits(float f, const Format& fmt) {
    return reference_encode(reference_round(f, fmt), std::signbit(f), fmt);
}

// ---- GCC's _Float16 ----------------------------------------------------------

std::uint16_t gcc_float_to_half_bits(float f) {
    const volatile float v = f;  // keep the conversion at run time (libgcc)
    const auto h = static_cast<_Float16>(v);
    return std::bit_cast<std::uint16_t>(h);
}

float gcc_half_bits_to_float(std::uint16_t bits) {
    const volatile std::uint16_t v = bits;
    return static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(v)));
}

#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
std::uint16_t cuda_float_to_half_bits(float f) {
    return static_cast<__half_raw>(__float2half_rn(f)).x;
}
float cuda_half_bits_to_float(std::uint16_t bits) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
}
std::uint16_t cuda_float_to_bfloat16_bits(float f) {
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
}
float cuda_bfloat16_bits_to_float(std::uint16_t bits) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
}
#endif

std::uint32_t fbits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_fbits(std::uint32_t u) { return std::bit_cast<float>(u); }

// Counts disagreements and keeps the first few for the failure message.
struct Mismatches {
    std::size_t count = 0;
    std::string first;
    void add(const std::string& what) {
        if (count++ < 8) first += what + "\n";
    }
};

// Random floats that exercise every path: uniform bit patterns (so NaN, inf,
// float subnormals and zeros appear), exponents concentrated on the window
// where `fmt` goes from zero through subnormals to overflow, near-ties (the
// bits below the kept precision forced to exactly half, or half +- 1, also
// where the result is subnormal), and values around the overflow threshold.
std::vector<float> random_floats(std::size_t n, const Format& fmt, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::uint32_t> any;
    const int lo_exp = fmt.emin + 127 - fmt.precision - 2;
    const int hi_exp = std::min(fmt.emax + 127 + 2, 255);
    std::uniform_int_distribution<int> window(std::max(lo_exp, 0), hi_exp);
    const auto with_exponent = [](std::uint32_t u, int e) {
        return (u & 0x807F'FFFFU) | (static_cast<std::uint32_t>(e) << 23);
    };
    std::vector<float> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u = any(rng);
        switch (i % 5) {
            case 0: break;  // uniform bit pattern
            case 1:         // exponent in the interesting window
            case 2: u = with_exponent(u, window(rng)); break;
            case 3: {  // near a tie
                const int e = window(rng);
                u = with_exponent(u, e);
                // Float mantissa bits that `fmt` rounds away at this exponent.
                const int dropped =
                    24 - fmt.precision + std::max(0, fmt.emin + 127 - std::max(e, 1));
                if (dropped <= 23) {
                    const std::uint32_t mask = (1U << dropped) - 1U;
                    const std::uint32_t tie = 1U << (dropped - 1);
                    const std::uint32_t delta = (u >> 8) % 3U;  // tie - 1, tie, tie + 1
                    u = (u & ~mask) | (tie - 1U + delta);
                }
                break;
            }
            case 4: {  // in [max_finite, 2^(emax+1)): below, at and past the inf threshold
                const int dropped = 24 - fmt.precision;
                const std::uint32_t top_ones = 0x007F'FFFFU & ~((1U << dropped) - 1U);
                u = with_exponent(u, fmt.emax + 127) | top_ones;
                break;
            }
        }
        out.push_back(from_fbits(u));
    }
    return out;
}

// 2.5M floats per type: about 0.4 s (both types) in a release build, about 1.3 s
// in a debug build with AddressSanitizer + UBSan.
constexpr std::size_t random_count = 2'500'000;

}  // namespace

// ---- the references themselves -----------------------------------------------

TEST_CASE("references: _Float16 and the double model round to nearest even", "[half]") {
    // Ties at 1 + ulp/2 (even: down) and 1 + 3 ulp/2 (even: up); just over a tie.
    CHECK(gcc_float_to_half_bits(1.0f + 0x1p-11f) == 0x3C00);
    CHECK(gcc_float_to_half_bits(1.0f + 0x3p-11f) == 0x3C02);
    CHECK(gcc_float_to_half_bits(1.0f + 0x1p-11f + 0x1p-23f) == 0x3C01);
    CHECK(gcc_float_to_half_bits(-(1.0f + 0x1p-11f)) == 0xBC00);
    CHECK(gcc_float_to_half_bits(65520.0f) == 0x7C00);
    CHECK(reference_to_bits(1.0f + 0x1p-11f, binary16) == 0x3C00);
    CHECK(reference_to_bits(1.0f + 0x3p-11f, binary16) == 0x3C02);
    CHECK(reference_to_bits(1.0f + 0x1p-8f, bf16_format) == 0x3F80);
    CHECK(reference_to_bits(1.0f + 0x3p-8f, bf16_format) == 0x3F82);
    CHECK(reference_to_bits(65520.0f, binary16) == 0x7C00);
    CHECK(reference_decode(0x7BFF, binary16) == 65504.0);
    CHECK(reference_decode(0x0001, binary16) == std::ldexp(1.0, -24));
    CHECK(reference_decode(0x7F7F, bf16_format) == std::ldexp(255.0, 120));
}

// ---- exhaustive: every 16-bit pattern -----------------------------------------

TEST_CASE("half: every bit pattern decodes exactly and round-trips", "[half]") {
    Mismatches bad;
    for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        const Half h = Half::from_bits(bits);
        const float f = static_cast<float>(h);
        const double ref = reference_decode(bits, binary16);
        const bool nan_pattern = std::isnan(ref);

        CHECK(snug::is_nan(h) == nan_pattern);
        CHECK(snug::is_inf(h) == std::isinf(ref));
        CHECK(snug::is_finite(h) == std::isfinite(ref));

        if (nan_pattern) {
            // CUDA's half -> float returns the canonical float NaN; back to half
            // every NaN becomes the canonical 0x7FFF.
            if (fbits(f) != 0x7FFF'FFFFU)
                bad.add(fmt::format("{:#06x}: NaN -> {:#010x}", b, fbits(f)));
            if (snug::float_to_half_bits(f) != 0x7FFF)
                bad.add(fmt::format("{:#06x}: NaN round trip", b));
        } else {
            // Exact value, and the sign of zero, against the double model and GCC.
            const float expected = static_cast<float>(ref);
            if (fbits(f) != fbits(expected))
                bad.add(fmt::format("{:#06x}: {} vs ref {}", b, f, expected));
            if (fbits(f) != fbits(gcc_half_bits_to_float(bits)))
                bad.add(fmt::format("{:#06x}: differs from _Float16", b));
            if (snug::float_to_half_bits(f) != bits) bad.add(fmt::format("{:#06x}: round trip", b));
            if (Half(f).bits != bits) bad.add(fmt::format("{:#06x}: half(float) round trip", b));
        }
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        // Bit-exact with CUDA, NaN included.
        if (fbits(f) != fbits(cuda_half_bits_to_float(bits)))
            bad.add(fmt::format("{:#06x}: differs from __half2float", b));
#endif
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
}

TEST_CASE("bfloat16: every bit pattern decodes exactly and round-trips", "[half]") {
    Mismatches bad;
    for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        const BFloat16 v = BFloat16::from_bits(bits);
        const float f = static_cast<float>(v);
        const double ref = reference_decode(bits, bf16_format);
        const bool nan_pattern = std::isnan(ref);

        CHECK(snug::is_nan(v) == nan_pattern);
        CHECK(snug::is_inf(v) == std::isinf(ref));
        CHECK(snug::is_finite(v) == std::isfinite(ref));

        if (nan_pattern) {
            // Widening keeps the NaN's bits (as CUDA's __bfloat162float does);
            // narrowing again canonicalises to 0x7FFF.
            if (!std::isnan(f) || fbits(f) != b << 16)
                bad.add(fmt::format("{:#06x}: NaN widening", b));
            if (snug::float_to_bfloat16_bits(f) != 0x7FFF)
                bad.add(fmt::format("{:#06x}: NaN round trip", b));
        } else {
            const float expected = static_cast<float>(ref);
            if (fbits(f) != fbits(expected))
                bad.add(fmt::format("{:#06x}: {} vs ref {}", b, f, expected));
            if (snug::float_to_bfloat16_bits(f) != bits)
                bad.add(fmt::format("{:#06x}: round trip", b));
            if (BFloat16(f).bits != bits)
                bad.add(fmt::format("{:#06x}: bfloat16(float) round trip", b));
        }
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        if (fbits(f) != fbits(cuda_bfloat16_bits_to_float(bits)))
            bad.add(fmt::format("{:#06x}: differs from __bfloat162float", b));
#endif
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
}

// ---- hand-picked values, answers from the format definitions ------------------

TEST_CASE("half: known answers at the edges", "[half]") {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
        float in;
        std::uint16_t out;
    };
    const Case cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0x1p-24f, 0x0001},  // smallest subnormal
        {-0x1p-24f, 0x8001},
        {0x1p-25f, 0x0000},  // half of it: tie, to the even zero
        {-0x1p-25f, 0x8000},
        {std::nextafter(0x1p-25f, 1.0f), 0x0001},  // just over the tie
        {0x3p-25f, 0x0002},                        // tie between 1 and 2 units: even 2
        {0x5p-25f, 0x0002},                        // tie between 2 and 3 units: even 2
        {0x1p-14f, 0x0400},                        // smallest normal
        {0x1p-14f - 0x1p-25f, 0x0400},             // tie between 0x03FF and 0x0400: even
        {0x3FFp-24f, 0x03FF},                      // largest subnormal
        {1.0f + 0x1p-11f, 0x3C00},                 // tie: even (down)
        {1.0f + 0x3p-11f, 0x3C02},                 // tie: even (up)
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3C01},
        {2048.0f + 1.0f, 0x6800},  // ulp 2 at 2048: tie, even
        {2048.0f + 3.0f, 0x6802},
        {65504.0f, 0x7BFF},  // largest finite
        {-65504.0f, 0xFBFF},
        {65512.0f, 0x7BFF},                        // 65504 + ulp/4
        {std::nextafter(65520.0f, 0.0f), 0x7BFF},  // 65519.996: still finite
        {65520.0f, 0x7C00},                        // 65504 + ulp/2: tie, even is 2^16 -> inf
        {-65520.0f, 0xFC00},
        {65536.0f, 0x7C00},
        {FLT_MAX, 0x7C00},
        {-FLT_MAX, 0xFC00},
        {inf, 0x7C00},
        {-inf, 0xFC00},
        {nan, 0x7FFF},  // NaN: canonical
        {-nan, 0x7FFF},
        {from_fbits(0x7F80'0001U), 0x7FFF},  // signalling NaN, smallest payload
        {from_fbits(0xFFC1'2345U), 0x7FFF},
        {std::numeric_limits<float>::denorm_min(), 0x0000},  // float subnormals vanish
        {-std::numeric_limits<float>::denorm_min(), 0x8000},
        {from_fbits(0x007F'FFFFU), 0x0000},
        {FLT_MIN, 0x0000},
    };
    for (const Case& c : cases) {
        INFO(fmt::format("{:a} ({:#010x}) -> expected {:#06x}", c.in, fbits(c.in), c.out));
        CHECK(snug::float_to_half_bits(c.in) == c.out);
        CHECK(Half(c.in).bits == c.out);
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        CHECK(cuda_float_to_half_bits(c.in) == c.out);
#endif
    }
}

TEST_CASE("bfloat16: known answers at the edges", "[half]") {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
        std::uint32_t in;  // float bits
        std::uint16_t out;
    };
    const Case cases[] = {
        {0x0000'0000U, 0x0000},                          // +0
        {0x8000'0000U, 0x8000},                          // -0
        {0x3F80'0000U, 0x3F80},                          // 1
        {0x3F80'8000U, 0x3F80},                          // 1 + 2^-8: tie, even (down)
        {0x3F81'8000U, 0x3F82},                          // 1 + 3*2^-8: tie, even (up)
        {0x3F80'8001U, 0x3F81},                          // just over a tie
        {0x3F80'7FFFU, 0x3F80},                          // just under a tie
        {0xBF81'8000U, 0xBF82}, {0x0000'0001U, 0x0000},  // float's smallest subnormal
        {0x0000'8000U, 0x0000},  // tie between 0 and bf16's smallest subnormal: even 0
        {0x0000'8001U, 0x0001}, {0x0001'0000U, 0x0001},  // bf16's smallest subnormal, 2^-133
        {0x0001'8000U, 0x0002},                          // tie between 1 and 2 units: even 2
        {0x8000'8001U, 0x8001}, {0x007F'FFFFU, 0x0080},  // largest float subnormal rounds up to
                                                         // FLT_MIN
        {0x0080'0000U, 0x0080},                          // FLT_MIN
        {0x7F7F'0000U, 0x7F7F},                          // largest finite bf16
        {0x7F7F'7FFFU, 0x7F7F}, {0x7F7F'8000U, 0x7F80},  // max + ulp/2: tie, even is 2^128 -> inf
        {0x7F7F'FFFFU, 0x7F80},                          // FLT_MAX
        {0xFF7F'FFFFU, 0xFF80},                          // -FLT_MAX
        {fbits(inf), 0x7F80},   {fbits(-inf), 0xFF80},  {fbits(nan), 0x7FFF},  // NaN: canonical
        {fbits(-nan), 0x7FFF},  {0x7F80'0001U, 0x7FFF},  // a NaN whose naive rounding would give
                                                         // inf
        {0xFFFF'FFFFU, 0x7FFF},  // a NaN whose naive rounding would carry out
    };
    for (const Case& c : cases) {
        INFO(fmt::format("{:#010x} -> expected {:#06x}", c.in, c.out));
        CHECK(snug::float_to_bfloat16_bits(from_fbits(c.in)) == c.out);
        CHECK(BFloat16(from_fbits(c.in)).bits == c.out);
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        CHECK(cuda_float_to_bfloat16_bits(from_fbits(c.in)) == c.out);
#endif
    }
    CHECK(static_cast<float>(BFloat16::from_bits(0x7F7F)) == 3.38953139e38f);
}

// ---- random floats against the references --------------------------------------

TEST_CASE("half: float -> half agrees with the references on random floats", "[half]") {
    const std::vector<float> inputs = random_floats(random_count, binary16, 20240611U);
    Mismatches bad;
    std::size_t nans = 0, subnormal_results = 0, infs = 0;
    for (const float f : inputs) {
        const std::uint16_t got = snug::float_to_half_bits(f);
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        if (got != cuda_float_to_half_bits(f))
            bad.add(fmt::format("{:#010x}: {:#06x} vs __float2half_rn {:#06x}", fbits(f), got,
                                cuda_float_to_half_bits(f)));
#endif
        if (std::isnan(f)) {
            ++nans;
            if (got != 0x7FFF) bad.add(fmt::format("{:#010x}: NaN -> {:#06x}", fbits(f), got));
            continue;
        }
        const std::uint16_t ref = reference_to_bits(f, binary16);
        const std::uint16_t gcc = gcc_float_to_half_bits(f);
        if (got != ref)
            bad.add(fmt::format("{:#010x}: {:#06x} vs model {:#06x}", fbits(f), got, ref));
        if (got != gcc)
            bad.add(fmt::format("{:#010x}: {:#06x} vs _Float16 {:#06x}", fbits(f), got, gcc));
        if ((got & 0x7C00U) == 0U && (got & 0x03FFU) != 0U) ++subnormal_results;
        if ((got & 0x7FFFU) == 0x7C00U) ++infs;
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
    // The sample did reach the special paths.
    CHECK(nans > 1000);
    CHECK(subnormal_results > 1000);
    CHECK(infs > 1000);
}

TEST_CASE("bfloat16: float -> bfloat16 agrees with the references on random floats", "[half]") {
    const std::vector<float> inputs = random_floats(random_count, bf16_format, 977U);
    Mismatches bad;
    std::size_t nans = 0, subnormal_results = 0, infs = 0;
    for (const float f : inputs) {
        const std::uint16_t got = snug::float_to_bfloat16_bits(f);
#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)
        if (got != cuda_float_to_bfloat16_bits(f))
            bad.add(fmt::format("{:#010x}: {:#06x} vs __float2bfloat16_rn {:#06x}", fbits(f), got,
                                cuda_float_to_bfloat16_bits(f)));
#endif
        if (std::isnan(f)) {
            ++nans;
            if (got != 0x7FFF) bad.add(fmt::format("{:#010x}: NaN -> {:#06x}", fbits(f), got));
            continue;
        }
        const std::uint16_t ref = reference_to_bits(f, bf16_format);
        if (got != ref)
            bad.add(fmt::format("{:#010x}: {:#06x} vs model {:#06x}", fbits(f), got, ref));
        if ((got & 0x7F80U) == 0U && (got & 0x007FU) != 0U) ++subnormal_results;
        if ((got & 0x7FFFU) == 0x7F80U) ++infs;
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
    CHECK(nans > 1000);
    CHECK(subnormal_results > 1000);
    CHECK(infs > 1000);
}

// ---- the type itself ------------------------------------------------------------

TEST_CASE("half and bfloat16: construction and layout", "[half]") {
    STATIC_REQUIRE(sizeof(Half) == 2);
    STATIC_REQUIRE(sizeof(BFloat16) == 2);
    STATIC_REQUIRE(std::is_trivially_copyable_v<Half>);
    STATIC_REQUIRE(std::is_trivially_copyable_v<BFloat16>);
    STATIC_REQUIRE(!std::is_convertible_v<float, Half>);  // explicit only
    STATIC_REQUIRE(!std::is_convertible_v<Half, float>);
    STATIC_REQUIRE(!std::is_constructible_v<Half, double>);  // double would round twice
    STATIC_REQUIRE(!std::is_constructible_v<BFloat16, double>);
    STATIC_REQUIRE(Half::from_bits(0x3C00).bits == 0x3C00);
    STATIC_REQUIRE(snug::is_inf(Half::from_bits(0xFC00)));
    STATIC_REQUIRE(snug::is_nan(BFloat16::from_bits(0xFFC1)));

    CHECK(Half{}.bits == 0);
    CHECK(BFloat16{}.bits == 0);
    CHECK(Half(3).bits == 0x4200);  // 3 = 1.5 * 2^1
    CHECK(BFloat16(-3).bits == 0xC040);
    CHECK(Half(100000).bits == 0x7C00);  // integers convert through float: overflow to inf
    CHECK(static_cast<float>(Half(0.1f)) == 0x1.998p-4f);  // 0.1 to 11 bits: 0x2E66
    CHECK(Half(0.1f).bits == 0x2E66);

    // Copying moves bits unchanged, NaN payloads included.
    const Half nan_payload = Half::from_bits(0xFD01);
    const Half copy = nan_payload;
    CHECK(copy.bits == 0xFD01);
    unsigned char raw[2];
    std::memcpy(raw, &nan_payload, 2);
    std::uint16_t back = 0;
    std::memcpy(&back, raw, 2);
    CHECK(back == 0xFD01);
}
