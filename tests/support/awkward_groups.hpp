// Test support for the optimizer tests: parameter groups of awkward sizes,
// with and without decay (8-bit moments quantise the decayed ones), and the
// bytes of a buffer for bit-for-bit comparisons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "snug/optim/parameter_group.hpp"

namespace snug::test {

inline const std::vector<ParameterGroup> awkward_groups{
    {0, 1000, true}, {1000, 37, false}, {1037, 2305, true}, {3342, 5, false}};
inline constexpr std::int64_t awkward_parameters = 3347;

inline std::vector<unsigned char> bytes_of(const void* p, std::size_t count) {
    const auto* b = static_cast<const unsigned char*>(p);
    return {b, b + count};
}

}  // namespace snug::test
