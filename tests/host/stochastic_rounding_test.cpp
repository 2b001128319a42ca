// stochastic_round_bf16 against what stochastic rounding means, computed here
// independently in double: the result is one of the value's two bfloat16
// neighbours, the upper one for exactly the share of the 2^16 dice values
// that equals the value's position between them — so the average over every
// die is the value itself, exactly. Also its edges: bfloat16 values, signs,
// infinities, NaN, the top of the range.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "snug/core/half.hpp"
#include "snug/core/stochastic_rounding.hpp"

namespace {

using snug::bfloat16;
using snug::stochastic_round_bf16;

double widen(bfloat16 b) { return static_cast<double>(static_cast<float>(b)); }

// The bfloat16 neighbours of a finite, normal x > 0 in double: the largest
// bfloat16 <= x and the next one up (8 significant bits).
std::pair<double, double> neighbours(double x) {
    int e = 0;
    const double f = std::frexp(x, &e);  // x = f 2^e, f in [0.5, 1)
    const double lo = std::ldexp(std::floor(std::ldexp(f, 8)), e - 8);
    return {lo, lo + std::ldexp(1.0, e - 8)};
}

// A random normal float, both signs, exponents over a wide range.
float random_float(std::mt19937& gen) {
    std::uniform_real_distribution<double> mantissa(1.0, 2.0);
    std::uniform_int_distribution<int> exponent(-100, 100);
    std::bernoulli_distribution sign;
    return static_cast<float>((sign(gen) ? -1.0 : 1.0) * std::ldexp(mantissa(gen), exponent(gen)));
}

}  // namespace

TEST_CASE("stochastic rounding rounds up for exactly the share of dice that the value's position says",
          "[stochastic_rounding]") {
    std::mt19937 gen(20261204);
    for (int trial = 0; trial < 40; ++trial) {
        const float x = std::abs(random_float(gen));
        INFO("x = " << x);
        const auto [lo, hi] = neighbours(x);
        const double share_up = (double(x) - lo) / (hi - lo);  // in [0, 1)
        std::int64_t up = 0, elsewhere = 0;
        double sum = 0.0;
        for (std::uint32_t die = 0; die < 65536; ++die) {
            const double r = widen(stochastic_round_bf16(x, die));
            elsewhere += r != lo && r != hi ? 1 : 0;
            up += r == hi ? 1 : 0;
            sum += r;
        }
        CHECK(elsewhere == 0);  // always one of the two neighbours
        CHECK(double(up) == share_up * 65536.0);  // exact: x has 16 bits below bfloat16's
        CHECK(sum / 65536.0 == double(x));        // unbiased over every die, exactly
    }
}

TEST_CASE("stochastic rounding leaves bfloat16 values alone and mirrors negative values", "[stochastic_rounding]") {
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::uint32_t> die;
    for (int trial = 0; trial < 10000; ++trial) {
        const float x = random_float(gen);
        const std::uint32_t d = die(gen);
        const float exact = static_cast<float>(bfloat16(x));  // a bfloat16 value
        CHECK(stochastic_round_bf16(exact, d).bits == bfloat16(x).bits);
        CHECK(stochastic_round_bf16(-x, d).bits == (stochastic_round_bf16(x, d).bits ^ 0x8000U));
        // Only the low 16 bits of the die count.
        CHECK(stochastic_round_bf16(x, d).bits == stochastic_round_bf16(x, d & 0xFFFFU).bits);
    }
}

TEST_CASE("stochastic rounding keeps infinities, canonicalises NaN and may reach infinity from the top",
          "[stochastic_rounding]") {
    const float inf = std::numeric_limits<float>::infinity();
    for (std::uint32_t die : {0U, 1U, 0x8000U, 0xFFFFU}) {
        CHECK(stochastic_round_bf16(inf, die).bits == 0x7F80U);
        CHECK(stochastic_round_bf16(-inf, die).bits == 0xFF80U);
        CHECK(stochastic_round_bf16(std::numeric_limits<float>::quiet_NaN(), die).bits == 0x7FFFU);
        CHECK(stochastic_round_bf16(-std::numeric_limits<float>::quiet_NaN(), die).bits == 0x7FFFU);
        CHECK(stochastic_round_bf16(0.0f, die).bits == 0x0000U);
        CHECK(stochastic_round_bf16(-0.0f, die).bits == 0x8000U);
    }
    // Halfway between the largest finite bfloat16 (0x7F7F) and the next
    // step up: half the dice round to infinity, its upper neighbour.
    const float top = std::bit_cast<float>(0x7F7F8000U);
    CHECK(stochastic_round_bf16(top, 0x7FFFU).bits == 0x7F7FU);
    CHECK(stochastic_round_bf16(top, 0x8000U).bits == 0x7F80U);
    // A subnormal float rounds between bfloat16 subnormals the same way.
    const float tiny = std::bit_cast<float>(0x00004000U);  // a quarter of the smallest bfloat16 subnormal
    CHECK(stochastic_round_bf16(tiny, 0xBFFFU).bits == 0x0000U);
    CHECK(stochastic_round_bf16(tiny, 0xC000U).bits == 0x0001U);
}
