// Test support for the optimizer tests: parameter groups of awkward sizes,
// with and without decay (8-bit moments quantise the decayed ones), random
// gradients, and the bytes of a buffer for bit-for-bit comparisons.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "snug/optim/parameter_group.hpp"

namespace snug::test {

inline const std::vector<ParameterGroup> awkward_groups{
    {0, 1000, true}, {1000, 37, false}, {1037, 2305, true}, {3342, 5, false}};
inline constexpr std::int64_t awkward_parameters = 3347;

// An optimizer test's gradient: n values with magnitudes spread over four
// decades (10^-3 to 10) and both signs, drawn in float from mt19937(seed).
inline std::vector<float> random_grad(std::size_t n, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> mag(-3.0f, 1.0f);
    std::bernoulli_distribution sign;
    std::vector<float> g(n);
    for (float& x : g) x = (sign(gen) ? 1.0f : -1.0f) * std::pow(10.0f, mag(gen));
    return g;
}

inline std::vector<unsigned char> bytes_of(const void* p, std::size_t count) {
    const auto* b = static_cast<const unsigned char*>(p);
    return {b, b + count};
}

}  // namespace snug::test
