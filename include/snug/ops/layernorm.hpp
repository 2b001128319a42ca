// LayerNorm's contract, for every backend: the epsilon and the argument check.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// PyTorch's default LayerNorm epsilon (the CUDA kernels use it as a float).
inline constexpr double layernorm_eps = 1e-5;

// N rows of C: non-negative, and a row to normalise has at least one element.
inline void check_layernorm(const char* op, std::int64_t N, int C) {
    check_non_negative(op, {{"N", N}, {"C", C}});
    if (C == 0) throw ShapeError(std::string(op) + ": C = 0 (a row to normalise needs at least one element)");
}

}  // namespace snug::ops
