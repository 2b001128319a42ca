// RMSNorm's contract, for every backend (Llama's normalisation): the default
// epsilon and the argument check.
//
//   out[n, c] = inp[n, c] * rstd[n] * weight[c],  rstd[n] = 1 / sqrt(mean_c(inp[n, :]^2) + eps)
//
// No mean subtraction, no bias. The forward saves rstd per row (fp32, as
// LayerNorm saves its statistics) for the backward, which needs no eps.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// The default epsilon: Llama 2's and Llama 3's (Hugging Face's rms_norm_eps);
// Llama 1 used 1e-6, which callers pass explicitly. Each backend adds it in
// its compute type (float on CUDA and for fp32/16-bit on the host).
inline constexpr double rmsnorm_eps = 1e-5;

// N rows of C: non-negative, a row to normalise has at least one element, and
// eps is finite and non-negative (ShapeError for a size, ConfigError for eps).
inline void check_rmsnorm(const char* op, std::int64_t N, int C, double eps = rmsnorm_eps) {
    check_non_negative(op, {{"N", N}, {"C", C}});
    if (C == 0) throw ShapeError(std::string(op) + ": C = 0 (a row to normalise needs at least one element)");
    if (!(eps >= 0.0) || !std::isfinite(eps)) {
        throw ConfigError(std::string(op) + ": eps = " + std::to_string(eps) + " (must be finite and non-negative)");
    }
}

}  // namespace snug::ops
